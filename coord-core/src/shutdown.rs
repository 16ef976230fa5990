//! Graceful shutdown: what this process holds, and how [`Coordinator::shutdown`] gives it back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::call_key::CallKey;
use crate::coordinator::Coordinator;
use crate::error::BackendError;
#[cfg(doc)]
use crate::provider::LossCause;
use crate::provider::ReleaseOutcome;
use crate::runtime::renewal::Hold;

/// The leases a coordinator's calls hold in this process, and whether it is shutting down.
#[derive(Default)]
pub(crate) struct Lifecycle {
    shut_down: AtomicBool,
    locks: Slots,
    markers: Slots,
    /// Completion writes in progress (a body returned `Ok` and its outcome is being stored).
    completing: AtomicUsize,
    completed: Notify,
}

/// A set of holds with O(1) insert and remove by slot number.
#[derive(Default)]
struct Slots {
    inner: Mutex<SlotsInner>,
}

#[derive(Default)]
struct SlotsInner {
    entries: Vec<Option<Arc<Hold>>>,
    free: Vec<usize>,
}

impl Slots {
    fn insert(&self, hold: Arc<Hold>) -> usize {
        if hold.is_lock() {
            crate::telemetry::locks_held(1.0);
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match inner.free.pop() {
            Some(slot) => {
                inner.entries[slot] = Some(hold);
                slot
            }
            None => {
                inner.entries.push(Some(hold));
                inner.entries.len() - 1
            }
        }
    }

    fn remove(&self, slot: usize) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = inner.entries.get_mut(slot) {
            if let Some(hold) = entry.take() {
                inner.free.push(slot);
                if hold.is_lock() {
                    crate::telemetry::locks_held(-1.0);
                }
            }
        }
    }

    fn all(&self) -> Vec<Arc<Hold>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.entries.iter().flatten().cloned().collect()
    }

    fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.entries.len() - inner.free.len()
    }
}

/// Keeps a hold in its coordinator's registry until dropped.
pub(crate) struct Registered {
    lifecycle: Arc<Lifecycle>,
    slot: usize,
    marker: bool,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.marker {
            self.lifecycle.markers.remove(self.slot);
        } else {
            self.lifecycle.locks.remove(self.slot);
        }
    }
}

/// Counts one completion write in progress until dropped.
pub(crate) struct Completing(Arc<Lifecycle>);

impl Drop for Completing {
    fn drop(&mut self) {
        if self.0.completing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.completed.notify_waiters();
        }
    }
}

impl Lifecycle {
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub(crate) fn register_lock(self: &Arc<Self>, hold: Arc<Hold>) -> Registered {
        Registered {
            slot: self.locks.insert(hold),
            lifecycle: self.clone(),
            marker: false,
        }
    }

    pub(crate) fn register_marker(self: &Arc<Self>, hold: Arc<Hold>) -> Registered {
        Registered {
            slot: self.markers.insert(hold),
            lifecycle: self.clone(),
            marker: true,
        }
    }

    pub(crate) fn completing(self: &Arc<Self>) -> Completing {
        self.completing.fetch_add(1, Ordering::AcqRel);
        Completing(self.clone())
    }

    /// How many locks this coordinator's calls hold in this process.
    pub(crate) fn locks_held(&self) -> usize {
        self.locks.len()
    }

    async fn completions_settled(&self) {
        loop {
            let settled = self.completed.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.completing.load(Ordering::Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }
}

/// What [`Coordinator::shutdown`] did, and what it could not finish.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Locks this process held that shutdown released (their bodies see the hold lost with
    /// [`LossCause::ShutDown`]).
    pub released: Vec<CallKey>,
    /// Locks whose lease had already lapsed when shutdown released them.
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
        let end = crate::runtime::time::later(tokio::time::Instant::now(), deadline);
        let mut report = ShutdownReport::default();

        let _ = tokio::time::timeout_at(end, lifecycle.completions_settled()).await;

        // Stop renewing before releasing, so no renewal can outlive the unlock.
        self.renewer().stop_all();
        let provider = self.lock_provider();
        for hold in lifecycle.locks.all() {
            if !hold.take_for_shutdown() {
                continue; // its call is releasing it right now
            }
            let released =
                tokio::time::timeout_at(end, provider.release(&hold.key, hold.owner())).await;
            match released {
                Ok(Ok(ReleaseOutcome::Released)) => report.released.push(hold.key.clone()),
                Ok(Ok(ReleaseOutcome::NotHeld)) => report.lapsed.push(hold.key.clone()),
                Ok(Err(err)) => report.not_released.push((hold.key.clone(), err)),
                Err(_) => report.not_released.push((
                    hold.key.clone(),
                    BackendError::new(
                        crate::BackendErrorKind::Timeout,
                        "release at shutdown: no answer before the deadline",
                    )
                    .with_key(&hold.key),
                )),
            }
        }

        let _ = tokio::time::timeout_at(end, crate::runtime::detach::all_settled()).await;
        report.markers_left = lifecycle
            .markers
            .all()
            .iter()
            .map(|h| h.key.clone())
            .collect();
        report.completions_unfinished = lifecycle.completing.load(Ordering::Acquire);
        report.cleanups_unfinished = crate::runtime::detach::pending();
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

    /// How many locks calls on this coordinator hold in this process right now.
    pub fn locks_held(&self) -> usize {
        self.lifecycle().locks_held()
    }
}
