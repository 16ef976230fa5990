//! The transactional form of the `#[idempotent]` layer (`transaction = "tx"`, and
//! `Idempotent::claim_in_transaction`): the completed record is written inside the caller's
//! own database transaction, so it commits if and only if the body's effects commit.
//!
//! Staged, because the body borrows the transaction the completion is written in: the claim
//! ([`claim_in_transaction`]: same policies, fingerprints, waits and replays as the plain
//! layer), then the body (with the inner layers, under the marker's renewal and loss watch:
//! [`MarkedRun::body`]), then the completion through the transaction
//! ([`MarkedRun::complete_in`]) instead of `IdempotencyStore::complete`. A replay never
//! touches the transaction; a body error abandons the marker on the store's own connection,
//! as the plain layer does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{CoordError, RollbackCause};
use crate::policy::OnLost;
use crate::provider::{
    BackendError, BackendErrorKind, CompleteRequest, Fingerprint, IdempotencyStore,
    OutcomeTransaction, TransactionalCompletion,
};
use crate::report::IdempotencyOutcome;
use crate::runtime::call::Call;
use crate::runtime::idempotency::{Admission, abandon_marker, admit, run_marked};
use crate::runtime::lifecycle::Registered;
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, HoldKind, HoldTerms, Registration};

/// What a transactional call does after its claim.
pub enum TransactionalStep<R> {
    /// Answered without the body: a replay of the stored outcome, or a refusal (in flight, key
    /// reused, outcome unknown, a backend fault under `fail_closed`, ...). The transaction is
    /// not touched.
    Answer(R),
    /// Run the body, then [`MarkedRun::complete_in`].
    Run(MarkedRun),
}

/// A transactional call between its claim and its completion: the owner of an in-flight
/// marker, or (under `fail_open` or `on_missing_key = "run_unprotected"`) a call running
/// without the layer.
///
/// Dropped before it settled the marker (the caller dropped the call, the body panicked), it
/// abandons the marker in the background, owner-checked: a transactional marker's run cannot
/// commit without its completion, so a duplicate may run at once.
#[must_use = "a claimed marker is settled by `complete_in`; dropped, it is abandoned"]
pub struct MarkedRun {
    marker: Option<Marker>,
    /// The body was stopped because the marker was lost (`on_lost = "cancel"`): whatever it
    /// wrote in the transaction is half a run, and must not commit.
    stopped: bool,
}

/// The in-flight marker a transactional call owns.
struct Marker {
    store: Arc<dyn IdempotencyStore>,
    hold: Arc<Hold>,
    retention: Duration,
    on_lost: Option<OnLost>,
    fingerprint: Option<Fingerprint>,
    /// Renews the marker while the body runs (`renew`); dropped before the completion is
    /// written, since from then on the marker's row belongs to the caller's transaction.
    renewal: Option<Registration>,
    /// Listed for shutdown's report until settled.
    _registered: Registered,
    /// Abandon on drop: the call has not settled the marker.
    armed: bool,
}

impl Drop for Marker {
    fn drop(&mut self) {
        if self.armed {
            let (key, owner) = (self.hold.key.clone(), self.hold.owner());
            let left = self.hold.lease_left();
            self.store.clone().abandon_detached(key, owner, left);
        }
    }
}

/// Claims the key of a transactional call, exactly as the plain layer does (profile, missing
/// key, fingerprint, waits, replays, backend-fault policy), on the store's own connection, so
/// duplicates see the marker at once. A store that does not take transactional claims is
/// refused here, before the body, whatever the backend-fault policy.
pub async fn claim_in_transaction<R>(
    call: &Call<'_>,
    fingerprint: Option<Result<Fingerprint, String>>,
) -> TransactionalStep<R>
where
    R: GuardedResult,
    R::Ok: Serialize + DeserializeOwned,
{
    let (owner, claimed_at, fingerprint) = match admit(call, fingerprint, true).await {
        Admission::Answer(answer) => return TransactionalStep::Answer(answer),
        Admission::Unguarded => {
            return TransactionalStep::Run(MarkedRun {
                marker: None,
                stopped: false,
            });
        }
        Admission::Owned {
            owner,
            claimed_at,
            fingerprint,
        } => (owner, claimed_at, fingerprint),
    };
    let spec = call.idempotency.as_ref().expect("admitted with a spec");
    let hold = Hold::new(HoldTerms {
        kind: HoldKind::Marker,
        key: call.key.clone(),
        owner,
        lease: spec.in_flight_lease,
        acquired_at: claimed_at,
        fencing_token: None,
        outer: None,
        replica_acks: spec.replica_acks,
    });
    let registered = call.coordinator.lifecycle().register_marker(hold.clone());
    let renewal = spec
        .renew
        .map(|every| call.coordinator.renewer().register(hold.clone(), every));
    TransactionalStep::Run(MarkedRun {
        marker: Some(Marker {
            store: Arc::clone(call.coordinator.idempotency_store()),
            hold,
            retention: spec.retention,
            on_lost: spec.on_lost,
            fingerprint,
            renewal,
            _registered: registered,
            armed: true,
        }),
        stopped: false,
    })
}

impl MarkedRun {
    /// False when the call runs without the layer (the backend failed under `fail_open`, or a
    /// key part was absent under `on_missing_key = "run_unprotected"`): nothing is claimed, and
    /// the completion writes nothing.
    pub fn is_guarded(&self) -> bool {
        self.marker.is_some()
    }

    /// Runs `body` (the inner layers and the user's body) as the holder of the marker, watching
    /// for its loss as `on_lost` says: a lost marker under `on_lost = "cancel"` stops the body
    /// and answers [`CoordError::LockLost`].
    pub async fn body<R, F>(&mut self, call: &Call<'_>, body: F) -> R
    where
        R: GuardedResult,
        F: Future<Output = R>,
    {
        let Some(marker) = &self.marker else {
            return body.await;
        };
        if marker.renewal.is_none() && marker.on_lost.is_none() {
            return body.await;
        }
        let output = run_marked(&marker.hold, marker.on_lost, marker.renewal.as_ref(), body).await;
        match output {
            Some(output) => output,
            None => {
                let hold = &marker.hold;
                call.record_idempotency(IdempotencyOutcome::Lost);
                call.record_loss(hold.loss_cause());
                let err = CoordError::LockLost {
                    key: call.key.clone(),
                    held_for: hold.held_for(),
                    cause: hold.loss_cause(),
                };
                self.stopped = true;
                R::from_coord_error(err)
            }
        }
    }

    /// Settles the marker with the body's `output`: an `Err` abandons it (on the store's own
    /// connection; the key is free for a retry) and is returned as is; an `Ok` is written as
    /// the completed record **in `tx`** and returned, or, when it cannot be written there,
    /// [`CoordError::TransactionRollbackOnly`] is returned and `tx` can no longer commit. A body
    /// stopped because its marker was lost also leaves `tx` unable to commit: its writes are
    /// half a run.
    pub async fn complete_in<R>(
        self,
        call: &Call<'_>,
        tx: &mut dyn OutcomeTransaction,
        output: R,
    ) -> R
    where
        R: GuardedResult,
        R::Ok: Serialize + DeserializeOwned,
    {
        let Some(marker) = self.marker else {
            return output;
        };
        if self.stopped {
            if let Err(err) = tx
                .set_rollback_only("coord: the in-flight marker was lost and the body was stopped")
                .await
            {
                tracing::warn!(key = %call.key, error = %err, "coord: marking the transaction rollback-only failed (a transaction that cannot be reached cannot commit either)");
            }
        }
        let Some(ok) = output.ok_ref() else {
            marker.abandon().await;
            return output;
        };
        match marker.write(call, tx, ok).await {
            Ok(()) => output,
            Err(err) => R::from_coord_error(err),
        }
    }

    /// Writes `value` as the completed record in `tx` (the handle form, which holds the value
    /// rather than the body's `Result`). Nothing is written for an unguarded call.
    pub(crate) async fn complete_value<T>(
        self,
        call: &Call<'_>,
        tx: &mut dyn OutcomeTransaction,
        value: &T,
    ) -> Result<(), CoordError>
    where
        T: Serialize + DeserializeOwned,
    {
        match self.marker {
            Some(marker) => marker.write(call, tx, value).await,
            None => Ok(()),
        }
    }

    /// Abandons the marker now, owner-checked, on the store's own connection: the body failed
    /// (or will not run), and the key is free for a retry at once.
    pub(crate) async fn abandon(self) {
        if let Some(marker) = self.marker {
            marker.abandon().await;
        }
    }
}

impl Marker {
    async fn abandon(mut self) {
        self.armed = false;
        self.renewal = None;
        abandon_marker(self.store.clone(), self.hold.clone()).await;
    }

    /// Writes `ok` as the completed record in `tx`. On failure the transaction is unable to
    /// commit: the provider's transaction promises it when its owner check or its write fails,
    /// and coord marks it so itself when the outcome cannot be encoded.
    async fn write<T>(
        mut self,
        call: &Call<'_>,
        tx: &mut dyn OutcomeTransaction,
        ok: &T,
    ) -> Result<(), CoordError>
    where
        T: Serialize + DeserializeOwned,
    {
        // From here on the marker's row may be held by the caller's transaction: a renewal on
        // the store's own connection would only wait for it.
        self.renewal = None;
        let payload = match call.coordinator.codec().encode_checked(ok) {
            Ok(bytes) => Arc::<[u8]>::from(bytes),
            Err(message) => {
                // Nothing was written: the body's effects must not commit without their record.
                // The marker stays armed, so dropping it frees the key.
                if let Err(err) = tx
                    .set_rollback_only("coord: the idempotent outcome cannot be encoded")
                    .await
                {
                    tracing::warn!(key = %call.key, error = %err, "coord: marking the transaction rollback-only failed (a transaction that cannot be reached cannot commit either)");
                }
                return Err(self.refuse(call, RollbackCause::Codec(message)));
            }
        };
        call.telemetry().record_size(payload.len());
        let completing = call.coordinator.lifecycle().completing();
        let written = tx
            .complete_in_transaction(CompleteRequest {
                key: &self.hold.key,
                owner: self.hold.owner(),
                payload,
                retention: self.retention,
                fingerprint: self.fingerprint,
            })
            .await;
        drop(completing);
        let cause = match written {
            Ok(TransactionalCompletion::Written) => {
                // Settled: the record commits with the transaction; if the transaction rolls
                // back, the marker is in flight again and lapses into absence.
                self.armed = false;
                return Ok(());
            }
            Ok(TransactionalCompletion::Superseded { other, completed }) => {
                // Not ours any more: nothing to abandon.
                self.armed = false;
                RollbackCause::Superseded { other, completed }
            }
            Ok(TransactionalCompletion::MarkerMissing) => {
                self.armed = false;
                RollbackCause::MarkerMissing
            }
            Ok(unknown) => {
                // An answer this version does not know: be safe, the caller must not commit.
                let _ = tx
                    .set_rollback_only("coord: unexpected completion answer")
                    .await;
                RollbackCause::Backend(BackendError::new(
                    BackendErrorKind::Protocol,
                    format!(
                        "the transaction answered the completion with {unknown:?}, which this version of coord does not know"
                    ),
                ))
            }
            // The write may have landed before the fault, but the transaction cannot commit:
            // the marker stays armed and is abandoned in the background, which succeeds once
            // the transaction has rolled back.
            Err(err) => RollbackCause::Backend(err.with_key(&self.hold.key)),
        };
        Err(self.refuse(call, cause))
    }

    /// Records and logs a completion that could not be written in the transaction, and builds
    /// the caller's error. Dropping `self` afterwards abandons the marker if it is still armed.
    fn refuse(&self, call: &Call<'_>, cause: RollbackCause) -> CoordError {
        call.record_idempotency(IdempotencyOutcome::NotStored);
        tracing::error!(key = %self.hold.key, owner = %self.hold.owner(), cause = %cause, "coord: the outcome could not be written in the caller's transaction; the transaction cannot commit and must be rolled back");
        let err = CoordError::TransactionRollbackOnly {
            key: self.hold.key.clone(),
            cause,
        };
        call.record_error(&err);
        err
    }
}
