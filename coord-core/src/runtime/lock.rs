//! The `#[distributed_lock]` layer.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::error::CoordError;
use crate::policy::{OnBackendError, OnLost};
use crate::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use crate::report::LockOutcome;
use crate::runtime::call::Call;
use crate::runtime::held;
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind, Registration};

/// Frees a lock if the call stops before releasing it normally: when an acquire is cancelled
/// (its `SET` may already have landed), when the caller drops the future mid-body, or when
/// the body panics.
struct ReleaseOnDrop<'a> {
    provider: &'a Arc<dyn LockProvider>,
    key: &'a str,
    owner: OwnerToken,
    /// How long a clean-up can matter: a lock taken by this call frees itself at the latest a
    /// lease after its last attempt, and attempts end within `wait`. (An upper bound, so no
    /// clock is read on the path that never drops armed.)
    lease_bound: std::time::Duration,
    armed: bool,
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.provider.clone().release_detached(
                self.key.to_owned(),
                self.owner,
                self.lease_bound,
            );
        }
    }
}

/// Runs `body` while holding the call's lock.
pub async fn distributed_lock<R, F>(call: &Call<'_>, body: F) -> R
where
    R: GuardedResult,
    F: Future<Output = R>,
{
    let spec = call
        .spec
        .lock
        .as_ref()
        .expect("the macro emits a lock spec with #[distributed_lock]");
    let key = &*call.key;
    if held::holds(key) {
        call.record_lock(LockOutcome::Reentrant, None);
        return R::from_coord_error(CoordError::Reentrant {
            key: call.key.to_string(),
        });
    }
    let provider = call.coordinator.lock_provider();
    let owner = OwnerToken::new();
    let memory = call.coordinator.memory();
    // The in-process provider reports when the lease began; others are timed from here.
    let started = (memory.is_none() || !spec.wait.is_zero()).then(Instant::now);
    let mut guard = ReleaseOnDrop {
        provider,
        key,
        owner,
        lease_bound: spec.lease.saturating_add(spec.wait),
        armed: true,
    };
    let request = LockRequest {
        key,
        owner,
        lease: spec.lease,
        wait: spec.wait,
        fenced: spec.fenced,
    };
    let acquired = match memory {
        Some(memory) => Ok(memory
            .acquire_inline(request, Some(&call.key))
            .await
            .map(|(grant, at)| (grant, Some(at)))),
        None => provider
            .acquire(request)
            .await
            .map(|grant| grant.map(|grant| (grant, None))),
    };
    let (grant, granted_at) = match acquired {
        Ok(Some(granted)) => granted,
        Ok(None) => {
            guard.armed = false;
            call.record_lock(LockOutcome::NotAcquired, None);
            return R::from_coord_error(CoordError::LockNotAcquired {
                key: call.key.to_string(),
                waited: started.map_or(std::time::Duration::ZERO, |s| s.elapsed()),
            });
        }
        // The acquire may have landed before the fault: the guard stays armed and releases.
        Err(err) => {
            drop(guard);
            return match call.policy(spec.on_backend_error) {
                OnBackendError::FailClosed => {
                    call.record_lock(LockOutcome::BackendError, None);
                    R::from_coord_error(CoordError::Backend(err.with_key(call.key.to_string())))
                }
                OnBackendError::FailOpen => {
                    call.record_lock(LockOutcome::FailedOpen, None);
                    call.coordinator.metrics().count_fail_open();
                    tracing::warn!(key = %call.key, error = %err, "coord: lock backend failed; running unguarded (fail_open)");
                    body.await
                }
            };
        }
    };
    let outcome = if grant.contended {
        LockOutcome::Contended
    } else {
        LockOutcome::Acquired
    };
    call.record_lock(outcome, grant.fencing_token);
    // The lease began no earlier than the successful attempt was sent: for a first-attempt
    // grant that is `started`; after waiting, the last attempt was just now.
    let lease_from = match (granted_at, started) {
        (Some(at), _) => at,
        (None, Some(started)) if !grant.contended => tokio::time::Instant::from_std(started),
        (None, _) => tokio::time::Instant::now(),
    };
    let hold = Hold::new(
        HoldKind::Lock,
        call.key.clone(),
        owner,
        spec.lease,
        lease_from,
        grant.fencing_token,
        held::innermost(),
    );
    let renewal = spec
        .renew
        .map(|every| call.coordinator.renewer().register(hold.clone(), every));
    let output = run_guarded(hold.clone(), spec.on_lost, renewal.as_ref(), body).await;
    // Stop renewing before releasing, so no renewal can outlive the unlock.
    drop(renewal);
    let Some(output) = output else {
        // The hold is lost: the lock is probably someone else's by now and the backend may be
        // unreachable. Answer at once; the owner-checked release (a no-op if the lock moved
        // on) finishes in the background. The guard, still armed, hands it off on drop.
        drop(guard);
        call.record_lock(LockOutcome::Lost, grant.fencing_token);
        return R::from_coord_error(CoordError::LockLost {
            key: call.key.to_string(),
            held_for: hold.held_for(),
            cause: hold.loss_cause(),
        });
    };
    let released = match memory {
        Some(memory) => Ok(memory.release_inline(key, owner)),
        None => provider.release(key, owner).await,
    };
    guard.armed = false;
    match released {
        Ok(ReleaseOutcome::Released) => {}
        Ok(ReleaseOutcome::NotHeld) => {
            call.coordinator.metrics().count_lapsed_release();
            tracing::warn!(
                key = %call.key,
                held_for = ?hold.held_for(),
                lease = ?spec.lease,
                "coord: the lock's lease lapsed before release; the section was not exclusive throughout"
            );
        }
        Err(err) => {
            // The release may or may not have landed: retry it, owner-checked, in the
            // background until it gets an answer or the lease has freed the lock anyway.
            tracing::warn!(key = %call.key, error = %err, "coord: releasing the lock failed; retrying in the background until the lease ends");
            provider
                .clone()
                .release_detached(call.key.to_string(), owner, spec.lease);
        }
    }
    output
}

/// Runs `body` as the holder of `hold`. With `OnLost::Cancel`, the body is dropped at its next
/// await once the hold is lost, and `None` is returned.
///
/// While a renewal is registered, the renewal task is watched beside the body and restarted on
/// this runtime if it is gone.
pub(crate) async fn run_guarded<F: Future>(
    hold: Arc<Hold>,
    on_lost: Option<OnLost>,
    renewal: Option<&Registration>,
    body: F,
) -> Option<F::Output> {
    let cancel_on_loss = on_lost == Some(OnLost::Cancel);
    if renewal.is_none() && !cancel_on_loss {
        // The common case: nothing to watch beside the body.
        return Some(held::scope(hold, body).await);
    }
    let watched = hold.clone();
    let body = held::scope(hold, body);
    tokio::pin!(body);
    let driver = async {
        match renewal {
            Some(registration) => registration.keep_driver_alive().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(driver);
    tokio::select! {
        biased;
        output = &mut body => Some(output),
        _ = watched.lost(), if cancel_on_loss => None,
        _ = &mut driver => None,
    }
}
