//! A held lock and its release: [`LockGuard`] (the handle API's guard, which may leave its
//! call), `CallHold` (the attribute's, which never does), and the one release path both take
//! (`release_hold`, owner-checked, handed to the background when it fails or is dropped), with
//! what a release that finds the lock gone says about it (`gone_at_release`).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::CoordError;
use crate::provider::CallKey;
use crate::provider::{BackendError, BoxFuture, FencingToken, LossCause, ReleaseOutcome};
use crate::runtime::lease_guard::LeaseGuard;
use crate::runtime::lifecycle::Registered;
use crate::runtime::renewal::{Hold, Registration};
use crate::runtime::state::Coordinator;

use super::acquire::{Grant, lease_store};

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
/// [`ListedWhileWaiting`](crate::runtime::lifecycle::ListedWhileWaiting)). Dropped unreleased
/// (the call was cancelled, or the body panicked), it releases the lock in the background.
pub(super) struct CallHold<'c> {
    coordinator: &'c Coordinator,
    /// The hold, lent to the body's scope for each poll of the body (see
    /// [`held::scope_lent`](crate::runtime::held::scope_lent)): back here between polls, and so
    /// whenever this is dropped or settled.
    pub(super) hold: Option<Arc<Hold>>,
    pub(super) renewal: Option<Registration>,
    armed: bool,
}

impl<'c> CallHold<'c> {
    /// The call's hold of `hold`, renewed by `renewal` if it is.
    pub(super) fn new(
        coordinator: &'c Coordinator,
        hold: Arc<Hold>,
        renewal: Option<Registration>,
    ) -> CallHold<'c> {
        CallHold {
            coordinator,
            hold: Some(hold),
            renewal,
            armed: true,
        }
    }

    /// The hold (not lent out: nothing but the body's poll borrows it).
    pub(super) fn hold(&self) -> &Arc<Hold> {
        self.hold
            .as_ref()
            .expect("the hold is back between polls of the body")
    }

    /// Stops renewing, then releases, after the body returned at `now` (this call's reading of
    /// tokio's clock). A lock of the in-process provider is freed at once, synchronously at
    /// `now` (see [`LockTable::release_at`](coord_memory::LockTable::release_at)); any other
    /// hold through [`release_hold`], boxed so that the call's future keeps no room for it
    /// beyond the box. `lapse_reported`: the caller logged the lapse already.
    pub(super) fn release(&mut self, lapse_reported: bool, now: Instant) -> Releasing<'_> {
        drop(self.renewal.take());
        self.armed = false;
        let (coordinator, hold) = (self.coordinator, self.hold());
        let in_process = match hold.is_permit() || hold.rw_mode().is_some() {
            true => None,
            false => coordinator.in_process_locks(),
        };
        let Some(table) = in_process else {
            return Releasing::Awaited(Box::pin(release_hold(coordinator, hold, lapse_reported)));
        };
        if !hold.hand_back() {
            // Shutdown released it already (the hold reads as lost, cause `ShutDown`).
            return Releasing::Done(Ok(ReleaseOutcome::Released));
        }
        let released = table.release_lock_at(&hold.key, hold.owner(), now);
        if released != ReleaseOutcome::Released {
            gone_at_release(coordinator, hold, released, lapse_reported);
        }
        Releasing::Done(Ok(released))
    }
}

/// A call's release: answered at once, or to be awaited.
pub(super) enum Releasing<'a> {
    Done(Result<ReleaseOutcome, BackendError>),
    Awaited(BoxFuture<'a, Result<ReleaseOutcome, BackendError>>),
}

impl Drop for CallHold<'_> {
    fn drop(&mut self) {
        drop(self.renewal.take());
        if let (true, Some(hold)) = (self.armed, &self.hold) {
            release_dropped(self.coordinator, hold);
        }
    }
}
