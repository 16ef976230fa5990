//! The `#[distributed_lock]` layer.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::error::CoordError;
use crate::policy::OnLost;
use crate::provider::{LockRequest, OwnerToken, ReleaseOutcome};
use crate::report::LockOutcome;
use crate::runtime::call::Call;
use crate::runtime::held;
use crate::runtime::lease_guard::{LeaseGuard, LeaseStore};
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind, Registration};

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
    let key = &call.key;
    if held::holds(key) {
        call.record_lock(LockOutcome::Reentrant, None);
        return R::from_coord_error(CoordError::Reentrant { key: key.clone() });
    }
    let provider = call.coordinator.lock_provider();
    let owner = OwnerToken::new();
    let started = Instant::now();
    // A lock taken by this call frees itself at the latest a lease after its last attempt,
    // and attempts end within `wait`.
    let lease_bound = spec.lease.saturating_add(spec.wait);
    let mut guard = LeaseGuard::new(LeaseStore::Lock(provider), key, owner, lease_bound);
    let acquired = provider
        .acquire(LockRequest {
            key,
            owner,
            lease: spec.lease,
            wait: spec.wait,
            fenced: spec.fenced,
        })
        .await;
    let grant = match acquired {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            guard.disarm();
            call.record_lock(LockOutcome::NotAcquired, None);
            return R::from_coord_error(CoordError::LockNotAcquired {
                key: key.clone(),
                waited: started.elapsed(),
            });
        }
        // The acquire may have landed before the fault: the guard stays armed and releases.
        Err(err) => {
            drop(guard);
            return match call.backend_fault(spec.on_backend_error, err, "lock") {
                Ok(()) => {
                    call.record_lock(LockOutcome::FailedOpen, None);
                    body.await
                }
                Err(err) => {
                    call.record_lock(LockOutcome::BackendError, None);
                    R::from_coord_error(err)
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
    let lease_from = match grant.lease_began {
        Some(at) => at,
        None if !grant.contended => tokio::time::Instant::from_std(started),
        None => tokio::time::Instant::now(),
    };
    let hold = Hold::new(
        HoldKind::Lock,
        key.clone(),
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
            key: call.key.clone(),
            held_for: hold.held_for(),
            cause: hold.loss_cause(),
        });
    };
    let released = provider.release(key, owner).await;
    guard.disarm();
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
                .release_detached(key.clone(), owner, spec.lease);
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
