//! Lease renewal and loss detection.
//!
//! One renewal task per coordinator serves every renewing hold (lock, semaphore permit or
//! in-flight marker) of
//! that coordinator: holds are kept in a schedule ordered by their next renewal time, and each
//! renewal is an owner-checked extend (compare the token, then extend). The task runs only
//! while some hold is registered; a hold is deregistered the moment its guard is released or
//! dropped, so no renewal outlives the unlock and no state stays behind.
//!
//! A hold is lost when a renewal finds the token gone, or when the local monotonic clock shows
//! that a whole lease passed since the last renewal the backend confirmed (the backend is
//! unreachable or slow, so the lease may have ended there). Both are reported through the
//! hold's [`Hold::lost`] future.
//!
//! A lease is counted from the moment it refers to, never from when this process got round to
//! looking: a renewal confirms a lease from the moment it was sent, and a renewal sent after
//! the lease had already run out on the local clock (the process stalled: a blocking call on
//! the runtime, a pause, SIGSTOP) does not revive it, whatever the backend answers: the hold
//! is lost, `Expired`, because `is_held()` may already have said so.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::provider::BackendError;
use crate::provider::CallKey;
use crate::provider::time::deadline_after;
use crate::provider::{
    FencingToken, IdempotencyStore, LockProvider, LossCause, OwnerToken, RenewOutcome, ReplicaAcks,
    RwLockStore, RwMode, SemaphoreStore, replicas,
};

/// What a hold protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldKind {
    Lock,
    /// One permit of a semaphore: held, renewed, lost and given back like a lock, through the
    /// semaphore store.
    Permit,
    /// A read or write hold of a read-write lock: held, renewed, lost and given back like a
    /// lock, through the read-write lock store.
    Rw(RwMode),
    Marker,
}

/// One lease this process holds, as the renewal task and the call both see it. For locks it is
/// also the node of the task's chain of held locks (see `held`).
#[derive(Debug)]
pub(crate) struct Hold {
    kind: HoldKind,
    pub(crate) key: CallKey,
    pub(crate) fencing_token: Option<FencingToken>,
    pub(crate) outer: Option<Arc<Hold>>,
    owner: OwnerToken,
    lease: Duration,
    acquired_at: Instant,
    /// When the lease ends at the latest, by the local clock, in nanoseconds after
    /// `acquired_at`: the send time of the last confirmed acquisition or renewal plus the
    /// lease (`u64::MAX`: beyond any instant this process will see). An atomic, so that the
    /// check after every body reads it without a lock.
    valid_for: AtomicU64,
    /// A renewal was sent while the lease still ran and has not been confirmed yet: if the
    /// lease runs out now, the backend did not answer in time (`BackendUnreachable`), rather
    /// than this process not asking in time (`Expired`).
    renewal_unconfirmed: AtomicBool,
    lost: AtomicBool,
    /// Set by whoever gives the lease back (the call settling it, or shutdown): the other one
    /// then leaves it alone.
    handed_back: AtomicBool,
    /// Set once the hold is listed for shutdown (see `Lifecycle`): until then nobody but its
    /// holder can give it back.
    listed: AtomicBool,
    /// Why the hold was lost, once it is.
    cause: Mutex<Option<LossCause>>,
    lost_notify: Notify,
    /// The operation's replica acknowledgement, in scope around each renewal of this hold.
    replica_acks: Option<ReplicaAcks>,
}

/// What a hold is made with, each part named at the call sites: every field of a hold but its
/// state is fixed when it is made.
pub(crate) struct HoldTerms {
    pub(crate) kind: HoldKind,
    pub(crate) key: CallKey,
    pub(crate) owner: OwnerToken,
    pub(crate) lease: Duration,
    /// When the lease began, by the local clock.
    pub(crate) acquired_at: Instant,
    pub(crate) fencing_token: Option<FencingToken>,
    /// The task's innermost hold when this one was taken (locks only).
    pub(crate) outer: Option<Arc<Hold>>,
    pub(crate) replica_acks: Option<ReplicaAcks>,
}

impl Hold {
    // Inlined so that the terms are written straight into the new hold, not moved twice.
    #[inline]
    pub(crate) fn new(terms: HoldTerms) -> Arc<Hold> {
        let HoldTerms {
            kind,
            key,
            owner,
            lease,
            acquired_at,
            fencing_token,
            outer,
            replica_acks,
        } = terms;
        Arc::new(Hold {
            kind,
            key,
            fencing_token,
            outer,
            owner,
            lease,
            acquired_at,
            valid_for: AtomicU64::new(nanos(lease)),
            renewal_unconfirmed: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            handed_back: AtomicBool::new(false),
            listed: AtomicBool::new(false),
            cause: Mutex::new(None),
            lost_notify: Notify::new(),
            replica_acks,
        })
    }

    /// True for a lock or a semaphore permit (not an in-flight marker).
    pub(crate) fn is_lock(&self) -> bool {
        matches!(
            self.kind,
            HoldKind::Lock | HoldKind::Permit | HoldKind::Rw(_)
        )
    }

    /// The mode of a read-write lock's hold; `None` for every other kind.
    pub(crate) fn rw_mode(&self) -> Option<RwMode> {
        match self.kind {
            HoldKind::Rw(mode) => Some(mode),
            _ => None,
        }
    }

    /// True for a semaphore permit.
    pub(crate) fn is_permit(&self) -> bool {
        self.kind == HoldKind::Permit
    }

    /// The operation's replica acknowledgement, for the writes that settle this hold.
    pub(crate) fn replica_acks(&self) -> Option<ReplicaAcks> {
        self.replica_acks
    }

    /// The token that owns the lease.
    pub(crate) fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The lease length.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// How long until the lease ends by the local clock, as last confirmed.
    pub(crate) fn lease_left(&self) -> Duration {
        let valid_for = self.valid_for.load(Ordering::Acquire);
        let since = nanos(self.acquired_at.elapsed());
        Duration::from_nanos(valid_for.saturating_sub(since))
    }

    /// When the lease began, by the local clock.
    pub(crate) fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// How long the hold has lasted.
    pub(crate) fn held_for(&self) -> Duration {
        self.acquired_at.elapsed()
    }

    /// How long the hold had lasted at `now`.
    pub(crate) fn held_for_at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.acquired_at)
    }

    /// True while the hold is not known to be lost.
    pub(crate) fn is_held(&self) -> bool {
        !self.lost.load(Ordering::Acquire) && !self.lease_over_at(Instant::now())
    }

    /// True if the lease (as last confirmed) is over at `now` by the local clock.
    fn lease_over_at(&self, now: Instant) -> bool {
        nanos(now.saturating_duration_since(self.acquired_at))
            >= self.valid_for.load(Ordering::Acquire)
    }

    /// The end of the lease as last confirmed, by the local clock.
    fn valid_until(&self) -> Instant {
        let valid_for = Duration::from_nanos(self.valid_for.load(Ordering::Acquire));
        deadline_after(self.acquired_at, valid_for)
    }

    /// True if the hold is known lost, or its lease was over at `now` on the local clock:
    /// a body that returns at `now` may not have been alone for all of its run.
    pub(crate) fn lapsed_at(&self, now: Instant) -> bool {
        self.lost.load(Ordering::Acquire) || self.lease_over_at(now)
    }

    /// The check before each poll of a renewing hold's body (one clock read): true if the hold
    /// is lost, marking it lost now if a whole lease passed since the last confirmed renewal
    /// (or since the acquisition was sent). After a stall of this process the renewal task and
    /// the body wake together; this is what keeps the body from running on a lapsed lease.
    pub(crate) fn check_lease(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if !self.lease_over_at(Instant::now()) {
            return false;
        }
        self.mark_lost(self.lapse_cause());
        true
    }

    /// Why a lease that ran out on the local clock was lost: a renewal sent in time and never
    /// confirmed means the backend did not answer (`BackendUnreachable`); otherwise nobody asked
    /// in time, this process stalled or does not renew (`Expired`).
    fn lapse_cause(&self) -> LossCause {
        if self.renewal_unconfirmed.load(Ordering::Acquire) {
            LossCause::BackendUnreachable
        } else {
            LossCause::Expired
        }
    }

    /// Notes that a renewal is being sent at `sent_at`.
    pub(crate) fn renewal_sent(&self, sent_at: Instant) {
        if !self.lease_over_at(sent_at) {
            self.renewal_unconfirmed.store(true, Ordering::Release);
        }
    }

    /// The backend confirmed the renewal sent at `sent_at`: the lease now runs a whole lease
    /// from then. A renewal sent after the lease had run out on the local clock revives
    /// nothing: the hold is lost (`Expired`), since `is_held()` may have said so meanwhile.
    pub(crate) fn confirm(&self, sent_at: Instant) {
        if self.lease_over_at(sent_at) {
            self.mark_lost(LossCause::Expired);
            return;
        }
        let renewed = nanos(sent_at.saturating_duration_since(self.acquired_at))
            .saturating_add(nanos(self.lease));
        self.valid_for.fetch_max(renewed, Ordering::AcqRel);
        self.renewal_unconfirmed.store(false, Ordering::Release);
    }

    /// Why the hold was lost. A hold whose lease simply ran out on the local clock, without a
    /// renewal confirming it, is `BackendUnreachable`: the backend never said.
    pub(crate) fn loss_cause(&self) -> LossCause {
        self.cause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(LossCause::BackendUnreachable)
    }

    /// Claims the giving back of this lease for the caller; false if it was claimed before.
    pub(crate) fn hand_back(&self) -> bool {
        if !self.listed.load(Ordering::Acquire) {
            // Never listed, so shutdown never saw it: only its holder's task touches the flag,
            // and a plain read and write do (an atomic swap costs as much as a clock read on
            // the path of every uncontended lock).
            let first = !self.handed_back.load(Ordering::Relaxed);
            self.handed_back.store(true, Ordering::Relaxed);
            return first;
        }
        !self.handed_back.swap(true, Ordering::AcqRel)
    }

    /// Notes that the hold is about to be listed for shutdown, which may then claim it.
    pub(crate) fn mark_listed(&self) {
        self.listed.store(true, Ordering::Release);
    }

    /// Claims the giving back for shutdown and marks the hold lost with
    /// [`LossCause::ShutDown`]; false if its call is giving it back already.
    pub(crate) fn take_for_shutdown(&self) -> bool {
        if !self.hand_back() {
            return false;
        }
        self.mark_lost(LossCause::ShutDown);
        true
    }

    /// True once the hold is known lost (not merely past its lease on the clock).
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the hold lost with `cause` (the first cause stays) and logs it once.
    pub(crate) fn mark_lost(&self, cause: LossCause) {
        self.set_lost(cause, true);
    }

    /// Marks the hold lost without logging: the caller logs it with more to say.
    pub(crate) fn mark_lost_quietly(&self, cause: LossCause) {
        self.set_lost(cause, false);
    }

    /// Marks the hold lost with `cause` even if it was marked lost with another cause before:
    /// for a cause that is found out later but happened first (a forced release the provider
    /// reports at release, after the call saw the lease run out on its clock). Not logged.
    pub(crate) fn correct_cause(&self, cause: LossCause) {
        *self.cause.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause);
        self.set_lost(cause, false);
    }

    fn set_lost(&self, cause: LossCause, log: bool) {
        {
            let mut slot = self.cause.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(cause);
            }
        }
        let first = !self.lost.swap(true, Ordering::AcqRel);
        if first {
            let kind = match self.kind {
                HoldKind::Lock => "lock",
                HoldKind::Permit => "permit",
                HoldKind::Rw(RwMode::Read) => "read_lock",
                HoldKind::Rw(RwMode::Write) => "write_lock",
                HoldKind::Marker => "in_flight",
            };
            crate::telemetry::hold_lost(kind, &self.key, cause);
        }
        if first && log {
            tracing::warn!(
                key = %self.key,
                held_for = ?self.held_for(),
                lease = ?self.lease,
                cause = cause.as_str(),
                "coord: lease lost ({cause})"
            );
        }
        self.lost_notify.notify_waiters();
    }

    /// Resolves once the hold is lost: a renewal found the token gone, or the local clock
    /// passed the end of the last confirmed lease.
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.lost_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lost.load(Ordering::Acquire) {
                return;
            }
            let until = self.valid_until();
            if Instant::now() >= until {
                self.mark_lost(LossCause::BackendUnreachable);
                return;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

/// `d` in nanoseconds, saturating at `u64::MAX` (about 584 years: never, for a lease).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `body`, polled only while `hold` stands: the check of [`Hold::check_lease`] before every
/// poll (one clock read). With `cancel`, a lost hold answers `None` without polling the body
/// again, and so does a body that completes in a poll during which the lease ran out
/// (blocking code inside it); without, the hold is marked lost (`is_held()` false,
/// `lock_lost()` resolved) before the poll, and the body's output is returned.
///
/// After a stall of the process the body's pending await and the loss become ready in the
/// same wake-up: this is what makes the loss win.
pub(crate) fn lease_checked<'a, F: Future + 'a>(
    hold: &'a Hold,
    cancel: bool,
    body: Pin<&'a mut F>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    let mut body = body;
    std::future::poll_fn(move |cx| {
        if hold.check_lease() && cancel {
            return Poll::Ready(None);
        }
        match body.as_mut().poll(cx) {
            Poll::Ready(_) if cancel && hold.check_lease() => Poll::Ready(None),
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => Poll::Pending,
        }
    })
}

struct Entry {
    hold: Arc<Hold>,
    interval: Duration,
}

#[derive(Default)]
struct Registry {
    entries: HashMap<u64, Entry>,
    schedule: BTreeSet<(Instant, u64)>,
    next_id: u64,
    task_running: bool,
    /// Set by shutdown: nothing is renewed from then on.
    stopped: bool,
}

struct Shared {
    locks: Arc<dyn LockProvider>,
    records: Arc<dyn IdempotencyStore>,
    semaphores: Arc<dyn SemaphoreStore>,
    rw_locks: Arc<dyn RwLockStore>,
    registry: Mutex<Registry>,
    wake: Notify,
}

/// The renewal service of one coordinator.
#[derive(Clone)]
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

/// Keeps a hold renewed until dropped.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
    interval: Duration,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if reg.entries.remove(&self.id).is_some() {
            crate::telemetry::renewals_active(-1.0);
            reg.schedule.retain(|(_, id)| *id != self.id);
        }
        if reg.entries.is_empty() {
            // Let the task see it has nothing left and exit now rather than at its next due time.
            self.shared.wake.notify_one();
        }
    }
}

impl Renewer {
    pub(crate) fn new(
        locks: Arc<dyn LockProvider>,
        records: Arc<dyn IdempotencyStore>,
        semaphores: Arc<dyn SemaphoreStore>,
        rw_locks: Arc<dyn RwLockStore>,
    ) -> Self {
        Renewer {
            shared: Arc::new(Shared {
                locks,
                records,
                semaphores,
                rw_locks,
                registry: Mutex::new(Registry::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// How many holds are being renewed right now.
    pub(crate) fn active(&self) -> usize {
        self.shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    /// Stops every renewal for good (shutdown): holds keep their leases as last confirmed.
    pub(crate) fn stop_all(&self) {
        let mut reg = self
            .shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        reg.stopped = true;
        crate::telemetry::renewals_active(-(reg.entries.len() as f64));
        reg.entries.clear();
        reg.schedule.clear();
        drop(reg);
        self.shared.wake.notify_one();
    }

    /// Starts renewing `hold` every `interval` until the registration is dropped.
    pub(crate) fn register(&self, hold: Arc<Hold>, interval: Duration) -> Registration {
        let due = deadline_after(Instant::now(), interval);
        let (id, start_task, earliest) = {
            let mut reg = self
                .shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let id = reg.next_id;
            reg.next_id += 1;
            if reg.stopped {
                // Shutting down: the registration exists, nothing is renewed.
                return Registration {
                    shared: self.shared.clone(),
                    id,
                    interval,
                };
            }
            reg.entries.insert(id, Entry { hold, interval });
            crate::telemetry::renewals_active(1.0);
            let earliest = reg.schedule.first().is_none_or(|(at, _)| due < *at);
            reg.schedule.insert((due, id));
            let start = !reg.task_running;
            reg.task_running = true;
            (id, start, earliest)
        };
        if start_task {
            spawn_driver(&self.shared);
        } else if earliest {
            self.shared.wake.notify_one();
        }
        Registration {
            shared: self.shared.clone(),
            id,
            interval,
        }
    }
}

/// Starts the renewal task on the current runtime. If there is none, the flag is put back so
/// that the next call from inside a runtime starts it.
fn spawn_driver(shared: &Arc<Shared>) {
    if tokio::runtime::Handle::try_current().is_ok() {
        crate::provider::background::spawn_detached(run(shared.clone()));
    } else {
        shared
            .registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .task_running = false;
    }
}

/// Clears `task_running` when the renewal task ends for any reason: it returned (nothing left
/// to renew), it panicked, or the runtime hosting it shut down and dropped it. Without this a
/// coordinator that outlives a runtime would believe its renewals still run.
struct DriverAlive {
    shared: Arc<Shared>,
    /// Cleared when the task returns normally, having reset the flag itself under the same
    /// lock that saw nothing left to renew (so no registration can slip in between).
    armed: bool,
}

impl Drop for DriverAlive {
    fn drop(&mut self) {
        if self.armed {
            self.shared
                .registry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .task_running = false;
        }
    }
}

impl Registration {
    /// Never resolves. Polled beside the body of a renewing call, it restarts the renewal task
    /// on the body's runtime if the task is gone (its runtime shut down, or it panicked) while
    /// this hold still needs renewing. It checks twice per renewal interval.
    pub(crate) async fn keep_driver_alive(&self) {
        let every = (self.interval / 2).max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(every).await;
            let restart = {
                let mut reg = self
                    .shared
                    .registry
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let restart = !reg.task_running && reg.entries.contains_key(&self.id);
                if restart {
                    reg.task_running = true;
                }
                restart
            };
            if restart {
                tracing::warn!(
                    "coord: the lease renewal task was gone (its runtime shut down or it panicked); restarted on this runtime"
                );
                spawn_driver(&self.shared);
            }
        }
    }
}

/// One renewal of `hold`, with its operation's replica acknowledgement in scope.
async fn renew_once(shared: &Shared, hold: &Hold) -> Result<RenewOutcome, BackendError> {
    let renewal = match hold.kind {
        HoldKind::Lock => shared.locks.renew(&hold.key, hold.owner, hold.lease),
        HoldKind::Permit => shared
            .semaphores
            .renew_permit(&hold.key, hold.owner, hold.lease),
        HoldKind::Rw(mode) => shared
            .rw_locks
            .renew_rw(&hold.key, hold.owner, mode, hold.lease),
        HoldKind::Marker => shared
            .records
            .renew_marker(&hold.key, hold.owner, hold.lease),
    };
    replicas::scoped(hold.replica_acks, renewal).await
}

/// The renewal task: renews what is due, then sleeps until the next due time or a new,
/// earlier registration. Exits when nothing is registered.
async fn run(shared: Arc<Shared>) {
    let mut alive = DriverAlive {
        shared: shared.clone(),
        armed: true,
    };
    let mut in_flight = FuturesUnordered::new();
    loop {
        let now = Instant::now();
        let next_due = {
            let mut reg = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(&(at, id)) = reg.schedule.first() {
                if at > now {
                    break;
                }
                reg.schedule.pop_first();
                let Some(entry) = reg.entries.get(&id) else {
                    continue;
                };
                let (hold, interval) = (entry.hold.clone(), entry.interval);
                // Next renewal is scheduled now; a failed one is retried sooner below.
                reg.schedule.insert((deadline_after(now, interval), id));
                let shared = shared.clone();
                in_flight.push(async move {
                    let sent_at = Instant::now();
                    hold.renewal_sent(sent_at);
                    let outcome = renew_once(&shared, &hold).await;
                    (id, hold, sent_at, outcome, interval)
                });
            }
            if reg.entries.is_empty() && in_flight.is_empty() {
                reg.task_running = false;
                alive.armed = false;
                return;
            }
            reg.schedule.first().map(|(at, _)| *at)
        };
        let sleep_until =
            next_due.unwrap_or_else(|| deadline_after(now, Duration::from_secs(3600)));
        tokio::select! {
            Some((id, hold, sent_at, outcome, interval)) = in_flight.next(), if !in_flight.is_empty() => {
                match outcome {
                    Ok(RenewOutcome::Renewed) => hold.confirm(sent_at),
                    Ok(RenewOutcome::Lost(cause)) => {
                        hold.mark_lost(cause);
                        let mut reg = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
                        if reg.entries.remove(&id).is_some() {
                            crate::telemetry::renewals_active(-1.0);
                            reg.schedule.retain(|(_, i)| *i != id);
                        }
                    }
                    Err(err) => {
                        tracing::warn!(key = %hold.key, error = %err, "coord: lease renewal failed; retrying");
                        // Retry sooner than the regular interval, while the lease lasts.
                        let mut reg = shared.registry.lock().unwrap_or_else(|e| e.into_inner());
                        if reg.entries.contains_key(&id) {
                            reg.schedule.retain(|(_, i)| *i != id);
                            reg.schedule.insert((deadline_after(Instant::now(), interval / 4), id));
                        }
                    }
                }
            }
            _ = tokio::time::sleep_until(sleep_until) => {}
            _ = shared.wake.notified() => {}
        }
    }
}
