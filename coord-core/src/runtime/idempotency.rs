//! The `#[idempotent]` layer.

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{BackendError, CoordError};
use crate::policy::{OnAbandoned, OnBackendError, OnLost};
use crate::provider::{
    ClaimOutcome, ClaimRequest, Deadline, Fingerprint, IdempotencyStore, OwnerToken,
};
use crate::report::IdempotencyOutcome;
use crate::runtime::call::Call;
use crate::runtime::detach::DetachOnDrop;
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind};

/// Clears the in-flight marker if the call stops before settling it normally (cancelled or
/// panicked), so duplicates are not blocked until the marker's lease ends.
struct AbandonOnDrop<'a> {
    store: &'a Arc<dyn IdempotencyStore>,
    key: &'a str,
    owner: OwnerToken,
    armed: bool,
}

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store
                .clone()
                .abandon_detached(self.key.to_owned(), self.owner);
        }
    }
}

/// The one place fingerprints are compared. A record stored without a fingerprint (the
/// operation had none when it was written), or a call without one, is not compared.
fn check_fingerprint(
    call: &Call<'_>,
    ours: Option<Fingerprint>,
    stored: Option<Fingerprint>,
) -> Result<(), CoordError> {
    match (ours, stored) {
        (Some(ours), Some(stored)) if ours != stored => Err(CoordError::KeyReused {
            key: call.key.to_string(),
        }),
        _ => Ok(()),
    }
}

enum Claim<R> {
    /// Claimed; the claim was sent at this instant (the marker's lease began no earlier).
    Owned(tokio::time::Instant),
    Answer(R),
    Unguarded,
}

/// Runs `body` at most once per key within the retention period, replaying a stored success.
pub async fn idempotent<R, F>(
    call: &Call<'_>,
    fingerprint: Option<Result<Fingerprint, String>>,
    body: F,
) -> R
where
    R: GuardedResult,
    R::Ok: Serialize + DeserializeOwned,
    F: Future<Output = R>,
{
    let spec = call
        .spec
        .idempotency
        .as_ref()
        .expect("the macro emits an idempotency spec with #[idempotent]");
    let fingerprint = match fingerprint.transpose() {
        Ok(fp) => fp,
        Err(message) => {
            return R::from_coord_error(CoordError::Codec {
                key: call.key.to_string(),
                message: format!("fingerprint parameters did not serialize: {message}"),
            });
        }
    };
    let store = call.coordinator.idempotency_store();
    let key = &*call.key;
    let owner = OwnerToken::new();

    let claimed_at = match claim(call, store, owner, fingerprint).await {
        Claim::Answer(answer) => return answer,
        Claim::Unguarded => return body.await,
        Claim::Owned(sent_at) => sent_at,
    };
    call.record_idempotency(IdempotencyOutcome::Executed);

    let mut marker = AbandonOnDrop {
        store,
        key,
        owner,
        armed: true,
    };
    let output = if spec.renew.is_some() || spec.on_lost.is_some() {
        let hold = Hold::new(
            HoldKind::Marker,
            call.key.clone(),
            owner,
            spec.in_flight_lease,
            claimed_at,
            None,
            None,
        );
        let renewal = spec
            .renew
            .map(|every| call.coordinator.renewer().register(hold.clone(), every));
        let output = match spec.on_lost {
            Some(OnLost::Cancel) => {
                tokio::pin!(body);
                tokio::select! {
                    biased;
                    output = &mut body => Some(output),
                    _ = hold.lost() => None,
                }
            }
            Some(OnLost::Signal) | None => Some(body.await),
        };
        drop(renewal);
        match output {
            Some(output) => output,
            None => {
                // The marker is gone or about to be: the abandon below is an owner-checked
                // no-op at worst, and the caller learns its work was stopped.
                call.record_idempotency(IdempotencyOutcome::Lost);
                return R::from_coord_error(CoordError::LockLost {
                    key: call.key.to_string(),
                    held_for: hold.held_for(),
                    cause: crate::provider::LossCause::Expired,
                });
            }
        }
    } else {
        body.await
    };
    // From here on the work is done: settling the record must survive the caller dropping us.
    marker.armed = false;
    let store = Arc::clone(store);
    let owned_key = call.key.to_string();
    match output
        .ok_ref()
        .map(|ok| call.coordinator.codec().encode(ok))
    {
        Some(Ok(payload)) => {
            let retention = spec.retention;
            let payload: Arc<[u8]> = payload.into();
            let settled = DetachOnDrop::new(async move {
                let stored = store
                    .complete(crate::provider::CompleteRequest {
                        key: &owned_key,
                        owner,
                        payload,
                        retention,
                        fingerprint: None,
                    })
                    .await
                    .map(|o| o.is_stored());
                settle_log(&owned_key, "storing the outcome", stored);
            });
            settled.await;
        }
        Some(Err(message)) => {
            tracing::error!(key = %call.key, error = %message, "coord: the outcome could not be encoded and was not stored; a retry will run the body again");
            DetachOnDrop::new(async move {
                let cleared = store.abandon(&owned_key, owner).await;
                settle_log(&owned_key, "clearing the in-flight marker", cleared);
            })
            .await;
        }
        None => {
            DetachOnDrop::new(async move {
                let cleared = store.abandon(&owned_key, owner).await;
                settle_log(&owned_key, "clearing the in-flight marker", cleared);
            })
            .await;
        }
    }
    output
}

fn settle_log(key: &str, what: &str, result: Result<bool, BackendError>) {
    match result {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            key = %key,
            "coord: {what} found the in-flight marker gone (its lease lapsed); a duplicate may have run concurrently"
        ),
        Err(err) => tracing::warn!(key = %key, error = %err, "coord: {what} failed"),
    }
}

async fn claim<R>(
    call: &Call<'_>,
    store: &Arc<dyn IdempotencyStore>,
    owner: OwnerToken,
    fingerprint: Option<Fingerprint>,
) -> Claim<R>
where
    R: GuardedResult,
    R::Ok: DeserializeOwned,
{
    let spec = call.spec.idempotency.as_ref().expect("checked by caller");
    let key = &*call.key;
    let deadline = Deadline::after(spec.wait);
    let refuse = |outcome, err: CoordError| {
        call.record_idempotency(outcome);
        Claim::Answer(R::from_coord_error(err))
    };
    loop {
        let sent_at = tokio::time::Instant::now();
        let found = store
            .claim(ClaimRequest {
                key,
                owner,
                in_flight_lease: spec.in_flight_lease,
                fingerprint,
                keep_abandoned_for: match spec.on_abandoned {
                    OnAbandoned::Rerun => None,
                    OnAbandoned::Fail => Some(spec.retention),
                },
            })
            .await;
        let found = match found {
            Ok(found) => found,
            Err(err) => return backend_fault(call, spec.on_backend_error, err),
        };
        match found {
            ClaimOutcome::Claimed => return Claim::Owned(sent_at),
            ClaimOutcome::Completed {
                payload,
                fingerprint: stored,
            } => {
                if let Err(err) = check_fingerprint(call, fingerprint, stored) {
                    return refuse(IdempotencyOutcome::KeyReused, err);
                }
                return match call.coordinator.codec().decode::<R::Ok>(&payload) {
                    Ok(value) => {
                        call.record_idempotency(IdempotencyOutcome::Replayed);
                        Claim::Answer(R::from_ok(value))
                    }
                    Err(message) => refuse(
                        IdempotencyOutcome::BackendError,
                        CoordError::Codec {
                            key: call.key.to_string(),
                            message,
                        },
                    ),
                };
            }
            ClaimOutcome::Abandoned {
                fingerprint: stored,
            } => {
                if let Err(err) = check_fingerprint(call, fingerprint, stored) {
                    return refuse(IdempotencyOutcome::KeyReused, err);
                }
                tracing::error!(key = %call.key, "coord: an earlier call was abandoned mid-flight; its outcome is unknown (on_abandoned = fail): reconcile, then purge the record");
                return refuse(
                    IdempotencyOutcome::OutcomeUnknown,
                    CoordError::OutcomeUnknown {
                        key: call.key.to_string(),
                    },
                );
            }
            ClaimOutcome::InFlight {
                fingerprint: stored,
                ..
            } => {
                if let Err(err) = check_fingerprint(call, fingerprint, stored) {
                    return refuse(IdempotencyOutcome::KeyReused, err);
                }
                let left = deadline.remaining();
                if left.is_zero() {
                    return refuse(
                        IdempotencyOutcome::InFlight,
                        CoordError::InFlight {
                            key: call.key.to_string(),
                        },
                    );
                }
                if let Err(err) = store.wait_settled(key, left).await {
                    return backend_fault(call, spec.on_backend_error, err);
                }
            }
        }
    }
}

fn backend_fault<R: GuardedResult>(
    call: &Call<'_>,
    policy: Option<OnBackendError>,
    err: BackendError,
) -> Claim<R> {
    match call.policy(policy) {
        OnBackendError::FailClosed => {
            call.record_idempotency(IdempotencyOutcome::BackendError);
            Claim::Answer(R::from_coord_error(CoordError::Backend(
                err.with_key(call.key.to_string()),
            )))
        }
        OnBackendError::FailOpen => {
            call.record_idempotency(IdempotencyOutcome::FailedOpen);
            call.coordinator.metrics().count_fail_open();
            tracing::warn!(key = %call.key, error = %err, "coord: idempotency backend failed; running unguarded (fail_open)");
            Claim::Unguarded
        }
    }
}
