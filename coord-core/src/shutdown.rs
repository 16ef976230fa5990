//! Graceful shutdown: how [`Coordinator::shutdown`] gives back what this process holds.

use std::sync::atomic::Ordering;
use std::time::Duration;

#[cfg(doc)]
use crate::provider::LossCause;
use crate::provider::{BackendError, BackendErrorKind, CallKey, ReleaseOutcome};
use crate::runtime::lock::release_once;
use crate::runtime::state::Coordinator;

/// What [`Coordinator::shutdown`] did, and what it could not finish.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Locks this process held that shutdown released (their bodies see the hold lost with
    /// [`LossCause::ShutDown`]).
    pub released: Vec<CallKey>,
    /// Locks that were no longer held when shutdown released them: their lease had lapsed, or
    /// an operator had forced them free.
    pub lapsed: Vec<CallKey>,
    /// Locks whose release failed or timed out: the lease frees them.
    pub not_released: Vec<(CallKey, BackendError)>,
    /// In-flight idempotency markers of bodies still running at the deadline: each lapses at
    /// the end of its lease, and `on_abandoned` decides what a duplicate gets.
    pub markers_left: Vec<CallKey>,
    /// Completion writes still in progress at the deadline (their callers are still waiting
    /// for them; the outcome may or may not be stored).
    pub completions_unfinished: usize,
    /// Background clean-ups (releases and abandons retried after a fault) still running at
    /// the deadline, process-wide; each is bounded by its lease.
    pub cleanups_unfinished: usize,
}

impl ShutdownReport {
    /// True when everything was given back: every lock released, no marker, completion or
    /// clean-up left.
    pub fn is_clean(&self) -> bool {
        self.not_released.is_empty()
            && self.markers_left.is_empty()
            && self.completions_unfinished == 0
            && self.cleanups_unfinished == 0
    }
}

impl Coordinator {
    /// Gives back what this process holds, within `deadline`, before the process exits.
    ///
    /// In order: new lock acquisitions and idempotency claims are refused from now on
    /// ([`CoordError::ShutDown`](crate::CoordError::ShutDown)); completion writes in progress
    /// are given time to finish (their outcomes matter most); renewals stop; every lock still
    /// held is released (owner-checked; its body, if still running, sees the hold lost with
    /// [`LossCause::ShutDown`]); background clean-ups are waited for. Whatever is left at the
    /// deadline is in the report.
    ///
    /// A process that exits without calling this loses nothing a lease would not cover: locks
    /// and markers lapse at the end of their leases. Shutdown only makes that sooner.
    /// In-flight markers are not cleared (their bodies may still have effects): they lapse,
    /// and `on_abandoned` decides what a duplicate gets.
    pub async fn shutdown(&self, deadline: Duration) -> ShutdownReport {
        let lifecycle = self.lifecycle();
        lifecycle.shut_down.store(true, Ordering::Release);
        let end = crate::provider::time::deadline_after(tokio::time::Instant::now(), deadline);
        let mut report = ShutdownReport::default();

        let _ = tokio::time::timeout_at(end, lifecycle.completions_settled()).await;

        // Stop renewing before releasing, so no renewal can outlive the unlock.
        self.renewer().stop_all();
        for hold in lifecycle.locks.all() {
            if !hold.take_for_shutdown() {
                continue; // its call is releasing it right now
            }
            let released = tokio::time::timeout_at(end, release_once(self, &hold)).await;
            match released {
                Ok(Ok(ReleaseOutcome::Released)) => report.released.push(hold.key.clone()),
                // Not held any more: lapsed, or forced free by an operator. Either way it was
                // no longer this process's to give back.
                Ok(Ok(ReleaseOutcome::NotHeld | ReleaseOutcome::ForceReleased)) => {
                    report.lapsed.push(hold.key.clone())
                }
                Ok(Err(err)) => report.not_released.push((hold.key.clone(), err)),
                Err(_) => report.not_released.push((
                    hold.key.clone(),
                    BackendError::new(
                        BackendErrorKind::Timeout,
                        "release at shutdown: no answer before the deadline",
                    )
                    .with_key(&hold.key),
                )),
            }
        }

        let _ = tokio::time::timeout_at(end, crate::provider::background::all_settled()).await;
        report.markers_left = lifecycle
            .markers
            .all()
            .iter()
            .map(|h| h.key.clone())
            .collect();
        report.completions_unfinished = lifecycle.completing.load(Ordering::Acquire);
        report.cleanups_unfinished = crate::provider::background::pending();
        if report.is_clean() {
            tracing::info!(
                released = report.released.len(),
                "coord: shut down; everything given back"
            );
        } else {
            tracing::warn!(
                ?report,
                "coord: shut down with work left; leases will cover it"
            );
        }
        report
    }

    /// True once [`Coordinator::shutdown`] has begun.
    pub fn is_shut_down(&self) -> bool {
        self.lifecycle().is_shut_down()
    }

    /// How many locks calls on this coordinator hold in this process right now: locks taken
    /// with the handle API, and `#[distributed_lock]` calls whose body has waited at least once.
    /// A body that runs to its end without waiting is not counted: its call gives the lock back
    /// in the same poll.
    pub fn locks_held(&self) -> usize {
        self.lifecycle().locks_held()
    }
}
