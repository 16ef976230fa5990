//! The `#[distributed_lock]` layer, and the lock of the handle API: one acquisition path
//! ([`acquire_lock`]) and one guard ([`LockGuard`]) serve both. A semaphore permit
//! (`permits = n`, `Coordinator::semaphore`) is held the same way: the same acquisition path,
//! hold, renewal, loss handling and guard, with the semaphore store in place of the lock
//! provider (see [`HoldKind::Permit`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::time::Instant;

use crate::error::CoordError;
use crate::policy::OnLost;
use crate::provider::CallKey;
use crate::provider::replicas;
use crate::provider::{
    BackendError, BoxFuture, Capability, FencingToken, LockGrant, LockRequest, LossCause,
    OwnerToken, PermitRequest, ReleaseOutcome, RwMode,
};
use crate::report::LockOutcome;
use crate::runtime::call::{Call, backend_fault, replica_acks_refused};
use crate::runtime::held;
use crate::runtime::lease_guard::{LeaseGuard, LeaseStore};
use crate::runtime::lifecycle::{ListedWhileWaiting, Registered};
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind, Registration, lease_checked};
use crate::runtime::spec::LockSpec;
use crate::runtime::state::Coordinator;
use crate::telemetry::Elapsed;
use coord_memory::Attempt;

/// A lock just granted, before anyone holds it as a guard: the attribute keeps it in a
/// [`CallHold`], the handle API in a [`LockGuard`].
pub(crate) struct Grant {
    hold: Arc<Hold>,
    renewal: Option<Registration>,
    /// `Acquired` or `Contended`.
    outcome: LockOutcome,
    /// How long taking the lock took.
    waited: Elapsed,
    /// When the grant was in (this process's clock): what the attribute times its body from.
    granted_at: Instant,
}

impl Grant {
    /// The grant of one key of a multi-key lock (see `runtime::multi_lock`), whose hold the
    /// multi-key acquisition built: from here on it is held, renewed, lost and given back like
    /// any lock.
    pub(crate) fn of_hold(
        coordinator: &Coordinator,
        hold: Arc<Hold>,
        renew: Option<Duration>,
        contended: bool,
        started: Instant,
        granted_at: Instant,
    ) -> Grant {
        let renewal = renew.map(|every| coordinator.renewer().register(hold.clone(), every));
        Grant {
            hold,
            renewal,
            outcome: if contended {
                LockOutcome::Contended
            } else {
                LockOutcome::Acquired
            },
            waited: Elapsed::Between(started, granted_at),
            granted_at,
        }
    }
}

/// What one acquisition came to.
pub(crate) enum Acquired {
    /// The lock is held.
    Granted(Grant),
    /// The call is refused: not acquired within `wait`, reentrant, or a backend fault under
    /// `fail_closed`.
    Refused(CoordError, LockOutcome),
    /// The backend failed and the policy is `fail_open`: run without the lock (counted and
    /// logged already).
    Unguarded,
}

/// The checks before any acquisition: reentrancy (against the task's chain of held locks),
/// shutdown, and what the provider must support. `Ok` with the task's innermost hold (the
/// node the new hold links to), or the refusal.
fn admit(
    coordinator: &Coordinator,
    key: &CallKey,
    spec: &LockSpec,
) -> Result<Option<Arc<Hold>>, Acquired> {
    // One look at the task's chain of held locks: the reentrancy check, and the node the new
    // hold links to.
    let outer = held::innermost();
    let permit = spec.permits > 0;
    if let Some(mode) = spec.rw {
        if let Some(err) = crate::runtime::rw_lock::reentry(outer.as_deref(), key, mode) {
            return Err(Acquired::Refused(err, LockOutcome::Reentrant));
        }
    } else if held::chain_holds(outer.as_deref(), key, permit) {
        let err = CoordError::Reentrant { key: key.clone() };
        return Err(Acquired::Refused(err, LockOutcome::Reentrant));
    }
    if coordinator.lifecycle().is_shut_down() {
        let err = CoordError::ShutDown { key: key.clone() };
        return Err(Acquired::Refused(err, LockOutcome::ShutDown));
    }
    if permit && !coordinator.supports(Capability::Semaphores) {
        // Refused before the provider is asked, whatever the backend-fault policy: running
        // the body without the limit would be a silent no-op of the semaphore.
        let err = CoordError::Unsupported {
            capability: Capability::Semaphores,
            key: key.clone(),
        };
        return Err(Acquired::Refused(err, LockOutcome::BackendError));
    }
    if spec.rw.is_some() && !coordinator.supports(Capability::ReadWriteLocks) {
        // As for semaphores: never a read-write lock that silently excludes nobody.
        let err = CoordError::Unsupported {
            capability: Capability::ReadWriteLocks,
            key: key.clone(),
        };
        return Err(Acquired::Refused(err, LockOutcome::BackendError));
    }
    if let Some(err) = replica_acks_refused(coordinator, spec.replica_acks, key) {
        return Err(Acquired::Refused(err, LockOutcome::BackendError));
    }
    Ok(outer)
}

/// [`acquire_lock`] without awaiting, for a lock of the in-process provider that is free (or
/// held, with no `wait`): the table answers at once, at this call's own clock reading (the
/// lease runs from it; the table reads no clock of its own), and nothing can drop the call
/// between the attempt and the grant. `None` when the call has to take the general path
/// instead: another provider, another kind of hold, or a held lock to wait for (the general
/// path then makes the attempt again and queues).
fn acquire_at_once(coordinator: &Coordinator, key: &CallKey, spec: &LockSpec) -> Option<Acquired> {
    if spec.rw.is_some() || spec.permits > 0 {
        return None;
    }
    let memory = coordinator.in_process_locks()?;
    let outer = match admit(coordinator, key, spec) {
        Ok(outer) => outer,
        Err(refused) => return Some(refused),
    };
    let owner = OwnerToken::new();
    let started = Instant::now();
    // One attempt: a caller that would queue goes the general path.
    match memory.attempt_lock_at(key, owner, spec.lease, Duration::ZERO, spec.fenced, started) {
        Attempt::Granted(grant) => Some(Acquired::Granted(grant_of(
            coordinator,
            key,
            spec,
            owner,
            outer,
            started,
            started,
            grant,
        ))),
        Attempt::Held if spec.wait.is_zero() => Some(not_acquired(key, started)),
        // Held, and the call may wait: dropping the attempt leaves nothing behind (it did not
        // queue).
        Attempt::Held | Attempt::Queued(_) => None,
    }
}

/// Takes the lock of `key` on the terms of `spec`. The one acquisition path of the attribute
/// and the handle API. If this future is dropped while the acquire is in flight, the acquire
/// (which may have landed) is released in the background.
///
/// Reads the clock before the attempt (the lease is timed from there, or from when the provider
/// says it began), and once the grant is in when the call had to wait for it (the wait's end).
pub(crate) async fn acquire_lock(
    coordinator: &Coordinator,
    key: &CallKey,
    spec: &LockSpec,
) -> Acquired {
    let outer = match admit(coordinator, key, spec) {
        Ok(outer) => outer,
        Err(refused) => return refused,
    };
    let permit = spec.permits > 0;
    let owner = OwnerToken::new();
    let started = Instant::now();
    let in_process = match spec.rw {
        None if !permit => coordinator.in_process_locks(),
        _ => None,
    };
    let answer = if let Some(memory) = in_process {
        // The in-process table answers at once, at this call's own clock reading: the lease
        // runs from `started`, which the table takes as the attempt's time (it reads no
        // clock of its own), and nothing can drop this call between the attempt and the
        // grant. Only a caller that queues waits, on the general path below.
        match memory.attempt_lock_at(key, owner, spec.lease, spec.wait, spec.fenced, started) {
            Attempt::Granted(grant) => {
                return Acquired::Granted(grant_of(
                    coordinator,
                    key,
                    spec,
                    owner,
                    outer,
                    started,
                    started,
                    grant,
                ));
            }
            Attempt::Held => return not_acquired(key, started),
            Attempt::Queued(waiter) => {
                let waited: BoxFuture<'_, Result<Option<LockGrant>, BackendError>> =
                    Box::pin(async move { Ok(waiter.wait().await) });
                waited
            }
        }
    } else if let Some(mode) = spec.rw {
        crate::runtime::rw_lock::acquire(coordinator, key, owner, mode, spec)
    } else if permit {
        acquire_permit(coordinator, key, owner, spec)
    } else {
        coordinator.lock_provider().acquire(LockRequest {
            key,
            owner,
            lease: spec.lease,
            wait: spec.wait,
            fenced: spec.fenced,
        })
    };
    // A lock taken by this call frees itself at the latest a lease after its last attempt,
    // and attempts end within `wait`.
    let lease_bound = spec.lease.saturating_add(spec.wait);
    let mut pending = LeaseGuard::new(
        lease_store(coordinator, permit, spec.rw),
        key,
        owner,
        lease_bound,
    );
    let mut answer = replicas::scoped(spec.replica_acks, answer);
    // Whether the provider answered in the first poll: then this call never waited for it.
    let mut at_once = true;
    let acquired = std::future::poll_fn(|cx| {
        let polled = answer.as_mut().poll(cx);
        at_once &= polled.is_ready();
        polled
    })
    .await;
    drop(answer);
    let grant = match acquired {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            pending.disarm();
            return not_acquired(key, started);
        }
        // The acquire may have landed before the fault: the pending guard stays armed and
        // releases it.
        Err(err) => {
            drop(pending);
            return match backend_fault(coordinator, key, spec.on_backend_error, err, "lock") {
                Ok(()) => Acquired::Unguarded,
                Err(err) => Acquired::Refused(err, LockOutcome::BackendError),
            };
        }
    };
    pending.disarm();
    // A first-attempt grant answered in the first poll (the in-process provider's, always)
    // took only the provider's own work in this poll: it is timed as granted at `started`,
    // which saves a clock read (as long as that whole attempt on a virtual machine). Any other
    // grant kept this call waiting, and the wait's end is read.
    let granted_at = if at_once && !grant.contended {
        started
    } else {
        Instant::now()
    };
    Acquired::Granted(grant_of(
        coordinator,
        key,
        spec,
        owner,
        outer,
        started,
        granted_at,
        grant,
    ))
}

/// The refusal of a lock that stayed held by others for all of `wait`, asked for at `started`.
fn not_acquired(key: &CallKey, started: Instant) -> Acquired {
    let err = CoordError::LockNotAcquired {
        key: key.clone(),
        waited: started.elapsed(),
    };
    Acquired::Refused(err, LockOutcome::NotAcquired)
}

/// The grant of `key` to `owner`, asked for at `started` and in at `granted_at`: its hold
/// (linked to `outer`, the task's innermost hold) and its renewal.
// What an acquisition found, each part named at both call sites.
#[allow(clippy::too_many_arguments)]
fn grant_of(
    coordinator: &Coordinator,
    key: &CallKey,
    spec: &LockSpec,
    owner: OwnerToken,
    outer: Option<Arc<Hold>>,
    started: Instant,
    granted_at: Instant,
    grant: LockGrant,
) -> Grant {
    // The lease began no earlier than the successful attempt was sent: for a first-attempt
    // grant that is `started`; after waiting, the last attempt was just now.
    let lease_from = match grant.lease_began {
        Some(at) => at,
        None if grant.contended => granted_at,
        None => started,
    };
    let waited = Elapsed::Between(started, grant.lease_began.unwrap_or(granted_at));
    let hold = Hold::new(
        match spec.rw {
            Some(mode) => HoldKind::Rw(mode),
            None if spec.permits > 0 => HoldKind::Permit,
            None => HoldKind::Lock,
        },
        key.clone(),
        owner,
        spec.lease,
        lease_from,
        grant.fencing_token,
        outer,
        spec.replica_acks,
    );
    let renewal = spec
        .renew
        .map(|every| coordinator.renewer().register(hold.clone(), every));
    let outcome = if grant.contended {
        LockOutcome::Contended
    } else {
        LockOutcome::Acquired
    };
    Grant {
        hold,
        renewal,
        outcome,
        waited,
        granted_at,
    }
}

/// The acquisition of one permit of the semaphore `key` (`spec.permits` of them), answered as
/// a lock grant: a permit is always fenced.
fn acquire_permit<'a>(
    coordinator: &'a Coordinator,
    key: &'a CallKey,
    owner: OwnerToken,
    spec: &LockSpec,
) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
    let answer = coordinator.semaphore_store().acquire_permit(PermitRequest {
        key,
        owner,
        limit: spec.permits,
        lease: spec.lease,
        wait: spec.wait,
    });
    Box::pin(answer.map(|granted| {
        granted.map(|grant| {
            grant.map(|grant| LockGrant {
                fencing_token: Some(grant.fencing_token),
                contended: grant.contended,
                lease_began: grant.lease_began,
            })
        })
    }))
}

/// Where a hold of this kind lives, for its drop guard.
fn lease_store(coordinator: &Coordinator, permit: bool, rw: Option<RwMode>) -> LeaseStore<'_> {
    if let Some(mode) = rw {
        LeaseStore::Rw(coordinator.rw_lock_store(), mode)
    } else if permit {
        LeaseStore::Permit(coordinator.semaphore_store())
    } else {
        LeaseStore::Lock(coordinator.lock_provider())
    }
}

/// Releases `hold` (a lock or a permit) owner-checked, once.
pub(crate) fn release_once<'a>(
    coordinator: &'a Coordinator,
    hold: &'a Hold,
) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
    if let Some(mode) = hold.rw_mode() {
        coordinator
            .rw_lock_store()
            .release_rw(&hold.key, hold.owner(), mode)
    } else if hold.is_permit() {
        coordinator
            .semaphore_store()
            .release_permit(&hold.key, hold.owner())
    } else {
        coordinator.lock_provider().release(&hold.key, hold.owner())
    }
}

/// Hands the release of `hold` to the provider's background path, tried for `lease_left`.
fn release_in_background(coordinator: &Coordinator, hold: &Hold, lease_left: Duration) {
    let (key, owner) = (hold.key.clone(), hold.owner());
    if let Some(mode) = hold.rw_mode() {
        coordinator
            .rw_lock_store()
            .clone()
            .release_rw_detached(key, owner, mode, lease_left);
    } else if hold.is_permit() {
        coordinator
            .semaphore_store()
            .clone()
            .release_permit_detached(key, owner, lease_left);
    } else {
        coordinator
            .lock_provider()
            .clone()
            .release_detached(key, owner, lease_left);
    }
}

/// Gives `hold` back after its holder stopped renewing it: owner-checked, and handed to the
/// background if the release fails (or if this future is dropped while it is in flight).
/// `lapse_reported`: the caller logged the lapse already, so a release finding the lock gone
/// is only counted.
async fn release_hold(
    coordinator: &Coordinator,
    hold: &Hold,
    lapse_reported: bool,
) -> Result<ReleaseOutcome, BackendError> {
    if !hold.hand_back() {
        // Shutdown released it already (the hold reads as lost, cause `ShutDown`).
        return Ok(ReleaseOutcome::Released);
    }
    // Dropped while the release is in flight (its command may not have left the process
    // yet): the release is finished in the background, owner-checked.
    let mut in_flight = LeaseGuard::new(
        lease_store(coordinator, hold.is_permit(), hold.rw_mode()),
        &hold.key,
        hold.owner(),
        hold.lease(),
    )
    .held_as(hold);
    let released = release_once(coordinator, hold).await;
    in_flight.disarm();
    match &released {
        Ok(ReleaseOutcome::Released) => {}
        Ok(gone @ (ReleaseOutcome::NotHeld | ReleaseOutcome::ForceReleased)) => {
            gone_at_release(coordinator, hold, *gone, lapse_reported);
        }
        Err(err) => {
            // The release may or may not have landed: retry it, owner-checked, in the
            // background until it gets an answer or the lease has freed the lock anyway.
            tracing::warn!(key = %hold.key, error = %err, "coord: releasing the lock failed; retrying in the background until the lease ends");
            release_in_background(coordinator, hold, hold.lease());
        }
    }
    released
}

/// Hands the release of `hold` to the background, unless its holder or shutdown gave it back
/// already: for a hold dropped without being released.
fn release_dropped(coordinator: &Coordinator, hold: &Hold) {
    if !hold.hand_back() {
        return;
    }
    release_in_background(coordinator, hold, hold.lease_left());
}

/// A held lock: from [`Lock::acquire`](crate::handle::Lock::acquire), or inside a `#[distributed_lock]`
/// call.
///
/// Dropping the guard releases the lock in the background (owner-checked, retried until the
/// lease is over) without blocking, also when it is dropped outside a tokio runtime: the
/// release then runs on the runtime that acquired the lock, if that is still running, and the
/// lease frees the lock otherwise. [`LockGuard::release`] releases it and says whether the
/// lock was still ours. The guard is `Send` and can move to another task; renewal (if asked
/// for) continues until the guard is released or dropped.
///
/// A lock is a lease: the guard bounds how long a crashed holder blocks others, it does not
/// make a section exclusive by itself. Pass [`LockGuard::fencing_token`] to the resource you
/// write (with `.fenced()`), and watch [`LockGuard::lost`] when the work is long.
#[must_use = "dropping the guard releases the lock"]
pub struct LockGuard {
    coordinator: Coordinator,
    /// In the coordinator's list of held locks (for shutdown) while the guard lives.
    _registered: Registered,
    hold: Arc<Hold>,
    renewal: Option<Registration>,
    /// The runtime to release on when the guard is dropped outside one (handle API only: the
    /// attribute's guard never leaves its call).
    runtime: Option<tokio::runtime::Handle>,
    armed: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.key)
            .field("fencing_token", &self.hold.fencing_token)
            .field("renewing", &self.renewal.is_some())
            .field("held", &self.hold.is_held())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The guard of a lock the handle API took, listed for shutdown at once (the caller may
    /// hold it across awaits); it releases on `runtime` when dropped outside one.
    pub(crate) fn new(
        coordinator: &Coordinator,
        grant: Grant,
        runtime: Option<tokio::runtime::Handle>,
    ) -> LockGuard {
        LockGuard {
            coordinator: coordinator.clone(),
            _registered: coordinator.lifecycle().register_lock(grant.hold.clone()),
            hold: grant.hold,
            renewal: grant.renewal,
            runtime,
            armed: true,
        }
    }

    /// The locked key.
    pub fn key(&self) -> &CallKey {
        &self.hold.key
    }

    /// The hold behind this guard (a multi-key lock runs its body with its keys' holds as the
    /// task's chain of held locks).
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The fencing token of this hold, when acquired with `.fenced()`, while the hold is not
    /// known lost and its lease has not run out on the local clock; `None` otherwise (coord
    /// never hands out a token that can no longer be the newest).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.hold.fencing_token.filter(|_| self.hold.is_held())
    }

    /// True while the hold is not known lost and its lease (as last confirmed) has not run out
    /// on the local monotonic clock. A best effort: the lease can end right after the check.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Resolves, with its cause, once the hold is lost: renewal found the lock taken or
    /// expired, or a whole lease passed without a confirmed renewal. Without renewal, it
    /// resolves when the lease runs out on the local clock.
    pub async fn lost(&self) -> LossCause {
        self.hold.lost().await;
        self.hold.loss_cause()
    }

    /// How long the lock has been held.
    pub fn held_for(&self) -> Duration {
        self.hold.held_for()
    }

    /// Releases the lock. `Ok(true)`: it was ours and is free now; `Ok(false)`: it was not
    /// ours any more (its lease had lapsed, or an operator forced it free: someone else may
    /// have held it meanwhile, so the section was not exclusive throughout; counted and logged
    /// with the cause, which [`LockGuard::lost`] then resolves with). A backend error means the
    /// release may or may not have landed: it is retried in the background until the lease is
    /// over.
    pub async fn release(mut self) -> Result<bool, CoordError> {
        match self.settle().await {
            Ok(outcome) => Ok(outcome == ReleaseOutcome::Released),
            Err(err) => {
                self.coordinator.metrics().count_settling_in_background();
                Err(CoordError::Backend(err.with_key(&self.hold.key)))
            }
        }
    }

    /// Stops renewing, then releases; a release that failed is handed to the background.
    async fn settle(&mut self) -> Result<ReleaseOutcome, BackendError> {
        // Stop renewing before releasing, so no renewal can outlive the unlock.
        drop(self.renewal.take());
        self.armed = false;
        release_hold(&self.coordinator, &self.hold, false).await
    }
}

/// The lock was not this hold's any more when it was given back. Says why as far as can be
/// told, marks the hold lost with that cause (a forced release found here replaces a lapse the
/// call noticed first: it came first), counts it and logs it once:
///
/// * the provider remembered an operator's forced release: `ForceReleased`;
/// * the loss was noticed already (renewal found it, or the call reported the lapse): that
///   cause, logged already;
/// * the lease had run out on the local clock: `Expired`;
/// * otherwise the lock vanished while the lease still ran here, which a forced release the
///   provider no longer remembers and an expiry or loss on the backend both explain:
///   `ForceReleasedOrExpired`, naming both.
fn gone_at_release(
    coordinator: &Coordinator,
    hold: &Hold,
    outcome: ReleaseOutcome,
    lapse_reported: bool,
) {
    let noticed = hold.is_lost();
    let forced_noticed = noticed && hold.loss_cause() == LossCause::ForceReleased;
    let cause = match outcome {
        ReleaseOutcome::ForceReleased => LossCause::ForceReleased,
        _ if noticed => hold.loss_cause(),
        _ if hold.lapsed_at(Instant::now()) => LossCause::Expired,
        _ => LossCause::ForceReleasedOrExpired,
    };
    if cause == LossCause::ForceReleased {
        coordinator.metrics().count_force_released();
        hold.correct_cause(LossCause::ForceReleased);
    } else {
        coordinator.metrics().count_lapsed_release();
        hold.mark_lost_quietly(cause);
    }
    if forced_noticed || (noticed && cause != LossCause::ForceReleased) {
        // Renewal or the call's lapse check logged it with its cause already.
        return;
    }
    match cause {
        LossCause::ForceReleased => tracing::warn!(
            key = %hold.key,
            held_for = ?hold.held_for(),
            lease = ?hold.lease(),
            cause = cause.as_str(),
            lease_also_ran_out = lapse_reported,
            "coord: an operator force-released this lock while the call held it \
             (`coord locks release` or `Operator::release_lock`), so the section was not \
             exclusive from then on; make the protected resource refuse stale writers with \
             `fenced = true` and `fencing_token()`"
        ),
        LossCause::Expired => tracing::warn!(
            key = %hold.key,
            held_for = ?hold.held_for(),
            lease = ?hold.lease(),
            cause = cause.as_str(),
            "coord: the lock's lease ran out before it was released, so the section was not \
             exclusive throughout; give it a `lease` longer than the work, or `renew` it"
        ),
        _ => tracing::warn!(
            key = %hold.key,
            held_for = ?hold.held_for(),
            lease = ?hold.lease(),
            cause = cause.as_str(),
            "coord: the lock was gone when it was released although its lease had not run out \
             here: an operator force-released it, or it expired or was lost on the backend (a \
             clock running fast, a restart without persistence, an eviction, a failover); the \
             two cannot be told apart, and either way the section was not exclusive \
             throughout; look for the operator's `force-released` log line to tell which"
        ),
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        drop(self.renewal.take());
        if !self.armed {
            return;
        }
        // Outside a runtime, hand the release to the runtime that acquired the lock.
        let _entered = match (&self.runtime, tokio::runtime::Handle::try_current()) {
            (Some(runtime), Err(_)) => Some(runtime.enter()),
            _ => None,
        };
        release_dropped(&self.coordinator, &self.hold);
    }
}

/// The lock of one `#[distributed_lock]` call while its body runs: it never leaves the call,
/// so it borrows the coordinator, and it is listed for shutdown only once the body waits (see
/// [`ListedWhileWaiting`]). Dropped unreleased (the call was cancelled, or the body
/// panicked), it releases the lock in the background.
struct CallHold<'c> {
    coordinator: &'c Coordinator,
    /// The hold, lent to the body's scope for each poll of the body (see
    /// [`held::scope_lent`]): back here between polls, and so whenever this is dropped or
    /// settled.
    hold: Option<Arc<Hold>>,
    renewal: Option<Registration>,
    armed: bool,
}

impl CallHold<'_> {
    /// The hold (not lent out: nothing but the body's poll borrows it).
    fn hold(&self) -> &Arc<Hold> {
        self.hold
            .as_ref()
            .expect("the hold is back between polls of the body")
    }

    /// Stops renewing, then releases; see [`release_hold`].
    async fn settle(&mut self, lapse_reported: bool) -> Result<ReleaseOutcome, BackendError> {
        drop(self.renewal.take());
        self.armed = false;
        release_hold(self.coordinator, self.hold(), lapse_reported).await
    }

    /// [`CallHold::settle`] at once, for a lock of the in-process provider (`None` for any
    /// other hold): the table frees it synchronously at `now`, this call's reading of tokio's
    /// clock after the body (see [`LockTable::release_at`](coord_memory::LockTable::release_at)).
    fn settle_in_process(&mut self, lapse_reported: bool, now: Instant) -> Option<ReleaseOutcome> {
        let hold = self.hold.as_ref()?;
        if hold.is_permit() || hold.rw_mode().is_some() {
            return None;
        }
        let memory = self.coordinator.in_process_locks()?;
        drop(self.renewal.take());
        self.armed = false;
        if !hold.hand_back() {
            // Shutdown released it already (the hold reads as lost, cause `ShutDown`).
            return Some(ReleaseOutcome::Released);
        }
        let released = memory.release_lock_at(&hold.key, hold.owner(), now);
        if released != ReleaseOutcome::Released {
            gone_at_release(self.coordinator, hold, released, lapse_reported);
        }
        Some(released)
    }
}

impl Drop for CallHold<'_> {
    fn drop(&mut self) {
        drop(self.renewal.take());
        if let (true, Some(hold)) = (self.armed, &self.hold) {
            release_dropped(self.coordinator, hold);
        }
    }
}

/// Runs `body` while holding the call's lock.
///
/// The lock is the innermost layer, so this layer times the body (see [`Call::body`]) with the
/// clock reads it makes anyway: the body starts when the grant is in and ends at the read that
/// also serves the hold time and the lapse check.
pub async fn distributed_lock<R, F>(call: &Call<'_>, body: F) -> R
where
    R: GuardedResult,
    F: Future<Output = R>,
{
    if let Some(err) = call.profile_error() {
        return R::from_coord_error(err);
    }
    let spec = call
        .lock
        .as_ref()
        .expect("the macro emits a lock spec with #[distributed_lock]");
    // The in-process provider's free lock is granted without awaiting; every other
    // acquisition is boxed, so that the call's future keeps no room for it. The grant is
    // taken apart in the one statement that awaits it, so the future keeps no room for it as
    // a whole either: bound by `let` instead, the answer would keep its room in the future
    // across the body's await.
    #[allow(clippy::blocks_in_conditions)]
    let (hold, renewal, outcome, waited, granted_at) = match {
        let acquired = if let Some(acquired) = acquire_at_once(call.coordinator, &call.key, spec) {
            acquired
        } else {
            Box::pin(acquire_lock(call.coordinator, &call.key, spec)).await
        };
        match acquired {
            Acquired::Granted(Grant {
                hold,
                renewal,
                outcome,
                waited,
                granted_at,
            }) => Some((hold, renewal, outcome, waited, granted_at)),
            Acquired::Refused(err, outcome) => {
                if let CoordError::LockNotAcquired { waited, .. } = &err {
                    call.record_lock_wait(Elapsed::Known(*waited));
                }
                call.record_lock(outcome, None);
                call.record_error(&err);
                return R::from_coord_error(err);
            }
            Acquired::Unguarded => None,
        }
    } {
        Some(parts) => parts,
        // Rare (the backend failed under `fail_open`): boxed, like the general acquisition.
        None => return Box::pin(run_unguarded(call, body)).await,
    };
    let mut held = CallHold {
        coordinator: call.coordinator,
        hold: Some(hold),
        renewal,
        armed: true,
    };
    call.record_lock_granted(outcome, held.hold().fencing_token, waited);
    let body = ListedWhileWaiting::new(call.coordinator.lifecycle(), body);
    let cancel_on_loss = spec.on_lost == Some(OnLost::Cancel);
    let output = if held.renewal.is_none() && !cancel_on_loss {
        // The common case: nothing to watch beside the body, which borrows the hold for each
        // of its polls (no second handle to it).
        Some(held::scope_lent(&mut held.hold, body).await)
    } else {
        // Watching the hold beside the body takes a timer, a notification and the renewal
        // task's watchdog: a few hundred bytes of state, boxed so that every other call's
        // future does not carry them.
        let hold = held.hold().clone();
        Box::pin(run_watched(
            hold,
            cancel_on_loss,
            held.renewal.as_ref(),
            body,
        ))
        .await
    };
    let hold = held.hold();
    if output.is_none() {
        // The hold is lost: the lock is probably someone else's by now and the backend may be
        // unreachable. Answer at once; the owner-checked release (a no-op if the lock moved
        // on) finishes in the background: the hold, still armed, hands it off on drop.
        let hold = hold.clone();
        drop(held);
        return R::from_coord_error(lock_lost(call, &hold));
    }
    // Whatever the release found, the body's outcome stands: a lapsed lease is counted and
    // logged, a failed release is retried in the background. One clock read serves the body's
    // end, the hold time and the lapse check.
    let returned_at = Instant::now();
    call.record_locked_body(hold.acquired_at(), granted_at, returned_at);
    let lapsed = hold.lapsed_at(returned_at);
    if lapsed {
        report_lapse(call, hold, spec, hold.held_for_at(returned_at));
    }
    // Likewise the release: at once in process, boxed otherwise.
    let released = match held.settle_in_process(lapsed, returned_at) {
        Some(released) => Ok(released),
        None => Box::pin(held.settle(lapsed)).await,
    };
    if released.is_err() {
        // One release attempt (bounded by the provider's command timeout) is all the caller
        // waits for; the rest is the background's, and the report says so.
        call.record_settling_in_background();
    }
    if matches!(
        released,
        Ok(ReleaseOutcome::NotHeld | ReleaseOutcome::ForceReleased)
    ) {
        // Found gone at release: the report says why, as the release worked it out.
        let cause = held.hold().loss_cause();
        call.record_loss(cause);
        call.record_lock_lost(cause);
    }
    // Kept in its `Option` until here (checked above), so the future holds one copy of it.
    let Some(output) = output else {
        unreachable!("a lost hold answered above")
    };
    output
}

/// Runs `body` without the lock: the backend failed and the policy is `fail_open` (counted
/// and logged already).
async fn run_unguarded<R, F>(call: &Call<'_>, body: F) -> R
where
    F: Future<Output = R>,
{
    call.record_lock(LockOutcome::FailedOpen, None);
    let started = Instant::now();
    let output = body.await;
    call.record_body(started, Instant::now());
    output
}

/// The answer of a call whose hold was lost while its body ran (the body was cancelled),
/// recorded.
fn lock_lost(call: &Call<'_>, hold: &Hold) -> CoordError {
    let cause = hold.loss_cause();
    call.record_lock(LockOutcome::Lost, hold.fencing_token);
    call.record_loss(cause);
    call.record_lock_lost(cause);
    CoordError::LockLost {
        key: call.key.clone(),
        held_for: hold.held_for(),
        cause,
    }
}

/// The body returned after its hold was lost or its lease ran out on the local clock
/// (`on_lost = "signal"`, or no renewal): its outcome stands, as documented, but the section
/// may not have been exclusive throughout. Reported in the `CallReport`, counted, and logged
/// once (a lease that ran out unnoticed; a loss was logged when it was noticed).
fn report_lapse(call: &Call<'_>, hold: &Hold, spec: &LockSpec, held_for: Duration) {
    let noticed = hold.is_lost();
    if !noticed {
        hold.mark_lost_quietly(LossCause::Expired);
        tracing::warn!(
            key = %hold.key,
            lease = ?spec.lease,
            body_ran_for = ?held_for,
            renewing = spec.renew.is_some(),
            "coord: the lock's lease ran out before the body returned; the body ran to its end and its outcome stands, but the section was not exclusive throughout"
        );
    }
    let cause = hold.loss_cause();
    call.coordinator.metrics().count_lapsed_hold();
    call.record_loss(cause);
    call.record_lock_lost(cause);
}

/// Runs `body` as the holder of `hold`, for a renewing or cancelling hold (every other lock
/// call's body just borrows its hold, see [`held::scope_lent`]). With `OnLost::Cancel`, the
/// body is not polled again once the hold is lost, and `None` is returned.
///
/// A renewing or cancelling hold checks its lease on the local clock before every poll of the
/// body (one clock read): after a stall of this process (a blocking call on the runtime, a
/// pause, SIGSTOP) the body's pending await and the loss become ready in the same wake-up, and
/// the loss must win. With `Cancel` the body is then not polled again, and a body that
/// completes in a poll during which the lease ran out (blocking code inside it) is answered
/// `None` too; with `Signal` the hold is marked lost first (`is_held()` false, `lock_lost()`
/// resolved) and the body is polled as it chose.
///
/// While a renewal is registered, the renewal task is watched beside the body and restarted on
/// this runtime if it is gone.
async fn run_watched<F: Future>(
    hold: Arc<Hold>,
    cancel_on_loss: bool,
    renewal: Option<&Registration>,
    body: F,
) -> Option<F::Output> {
    let watched = hold.clone();
    let body = held::scope(hold, body);
    tokio::pin!(body);
    let checked = lease_checked(&watched, cancel_on_loss, body);
    let driver = async {
        match renewal {
            Some(registration) => registration.keep_driver_alive().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(driver);
    tokio::select! {
        biased;
        output = checked => output,
        _ = watched.lost(), if cancel_on_loss => None,
        _ = &mut driver => None,
    }
}
