//! `coord.idempotent(key)`: `#[idempotent]` configured at run time.

use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CoordError;
use crate::policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
use crate::provider::CallKey;
use crate::provider::{Fingerprint, OutcomeTransaction};
use crate::report::CallReport;
use crate::runtime::call::Call;
use crate::runtime::spec::KeyPrefixCache;
use crate::runtime::spec::Written;
use crate::runtime::spec::{IdempotencySpec, OpSpec};
use crate::runtime::state::Coordinator;
use crate::runtime::transactional::{MarkedRun, TransactionalStep, claim_in_transaction};
use crate::telemetry::OpTelemetry;

/// An idempotent call configured at run time: from [`Coordinator::idempotent`].
///
/// Runs its body at most once per key within `retention` and replays the stored `Ok` to
/// every later call with the same key, exactly as `#[idempotent]` does (same record protocol,
/// same failure handling: see the README's outcome-integrity table). The defaults are the
/// attribute's: retention 24 h, in-flight lease 30 s, no wait, `on_abandoned = rerun`,
/// `on_store_error = error`, the coordinator's backend-fault policy.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = coord.key("payments.charge").part("order-7").finish();
/// let receipt: Result<u64, coord_core::CoordError> = coord
///     .idempotent(key)
///     .retention(Duration::from_secs(3600))
///     .run(|| async { Ok(42) })
///     .await;
/// assert_eq!(receipt?, 42);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "an idempotent call does nothing until `run` is awaited"]
pub struct Idempotent<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    spec: IdempotencySpec,
    fingerprint: Option<Fingerprint>,
    profile: Option<String>,
}

impl Coordinator {
    /// An idempotent call of `key`, configured at run time (see [`Idempotent`]). Build the key
    /// with [`Coordinator::key`], which renders parts like the attributes do.
    pub fn idempotent(&self, key: CallKey) -> Idempotent<'_> {
        Idempotent {
            coordinator: self,
            key,
            spec: IdempotencySpec {
                retention: Duration::from_secs(24 * 60 * 60),
                in_flight_lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                on_backend_error: None,
                renew: None,
                on_lost: None,
                on_abandoned: OnAbandoned::Rerun,
                on_store_error: OnStoreError::Error,
                on_missing_key: OnMissingKey::Fail,
                replica_acks: None,
                written: Written::NONE,
            },
            fingerprint: None,
            profile: None,
        }
    }
}

impl<'c> Idempotent<'c> {
    /// How long a successful outcome is kept and replayed. Default 24 h.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.spec.retention = retention;
        self.spec.written = self.spec.written.with(Written::RETENTION);
        self
    }

    /// The lease of the in-flight marker: how long a crashed call blocks its key. Default 30 s.
    pub fn in_flight_lease(mut self, lease: Duration) -> Self {
        self.spec.in_flight_lease = lease;
        self.spec.written = self.spec.written.with(Written::IN_FLIGHT_LEASE);
        self
    }

    /// How long a duplicate waits for an in-flight call to settle before it gets
    /// [`CoordError::InFlight`]. Default zero (at once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.spec.wait = wait;
        self.spec.written = self.spec.written.with(Written::WAIT);
        self
    }

    /// Renews the in-flight marker this often while the body runs; with it, a lost marker
    /// cancels the body (`on_lost = cancel`) and the caller gets [`CoordError::LockLost`].
    pub fn renew(mut self, every: Duration) -> Self {
        self.spec.renew = Some(every);
        self.spec.on_lost.get_or_insert(OnLost::Cancel);
        self.spec.written = self.spec.written.with(Written::RENEW);
        self
    }

    /// What a duplicate gets when an earlier call was abandoned mid-flight. Default
    /// [`OnAbandoned::Rerun`].
    pub fn on_abandoned(mut self, policy: OnAbandoned) -> Self {
        self.spec.on_abandoned = policy;
        self
    }

    /// What to do when the backend fails. Default: the coordinator's policy.
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.spec.on_backend_error = Some(policy);
        self
    }

    /// What the caller gets when the body's `Ok` could not be stored. Default
    /// [`OnStoreError::Error`] ([`CoordError::OutcomeNotStored`]).
    pub fn on_store_error(mut self, policy: OnStoreError) -> Self {
        self.spec.on_store_error = policy;
        self
    }

    replica_acks_setters!("each claim, completion and marker renewal of this call");

    /// Takes durations and the backend-fault policy from the coordinator's profile `name`:
    /// a field the profile sets beats this handle's setters, which beat the configured
    /// defaults (see [`config`](crate::config)). A profile the coordinator does not have is
    /// [`CoordError::UnknownProfile`] from `run`, before the body runs.
    pub fn profile(mut self, name: impl Into<String>) -> Self {
        self.profile = Some(name.into());
        self
    }

    /// The fingerprint of the request this key is used with: a later call with the same key
    /// and a different fingerprint gets [`CoordError::KeyReused`] instead of a replay.
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Some(fingerprint);
        self
    }

    /// Runs `body` at most once for the key and returns its outcome, or replays the stored
    /// one. An `Err` from the body is returned and not stored (the key is freed for a retry).
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<CoordError>,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = op_spec(&op, Some(self.spec), self.profile.as_deref());
        let call = Call::with_key(&spec, self.coordinator, self.key);
        let fingerprint = self.fingerprint.map(Ok);
        call.run(crate::runtime::idempotency::idempotent(
            &call,
            fingerprint,
            call.body(async move { body().await }),
        ))
        .await
    }

    /// [`Idempotent::run`], plus what coord did with the call (replayed, executed, in flight…).
    pub async fn run_reported<T, E, F, Fut>(self, body: F) -> (Result<T, E>, CallReport)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<CoordError>,
    {
        crate::report::observe(self.run(body)).await
    }

    /// Claims the key for a body whose effects, and whose completed record, are written in the
    /// caller's own database transaction: the record commits if and only if the body's effects
    /// do. The staged form of `#[idempotent(transaction = "tx")]`, for a body that borrows the
    /// transaction (a closure could not lend it back for the completion).
    ///
    /// The claim is the same as [`run`](Idempotent::run)'s (fingerprint, `wait`, replays,
    /// refusals) and is made on the provider's own connection, so duplicates see it at once.
    /// A replay never touches the transaction. On [`TransactionStep::Run`], run the body with
    /// the transaction, then [`TransactionRun::complete_in`] the same transaction with the value,
    /// then commit; if the body fails, [`TransactionRun::abandon`] (or drop the run token) and
    /// roll back.
    ///
    /// ```
    /// # use coord_core::provider::{BackendError, CompleteRequest, OutcomeTransaction, TransactionalCompletion, BoxFuture};
    /// # struct Transaction;
    /// # impl OutcomeTransaction for Transaction {
    /// #     fn complete_in_transaction<'a>(&'a mut self, _: CompleteRequest<'a>) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>> { Box::pin(async { Ok(TransactionalCompletion::Written) }) }
    /// #     fn set_rollback_only<'a>(&'a mut self, _: &'a str) -> BoxFuture<'a, Result<(), BackendError>> { Box::pin(async { Ok(()) }) }
    /// # }
    /// # impl Transaction { async fn insert_charge(&mut self, _: u64) -> Result<u64, CoordError> { Ok(7) } async fn commit(self) -> Result<(), CoordError> { Ok(()) } }
    /// use coord_core::CoordError;
    /// use coord_core::handle::TransactionStep;
    ///
    /// async fn charge(coord: &coord_core::Coordinator, mut tx: Transaction, order: &str)
    ///     -> Result<u64, CoordError>
    /// {
    ///     let key = coord.key("payments.charge").part(order).finish();
    ///     match coord.idempotent(key).claim_in_transaction::<u64>().await? {
    ///         TransactionStep::Replay(receipt) => Ok(receipt),
    ///         TransactionStep::Run(run) => {
    ///             let receipt = match tx.insert_charge(1_999).await {
    ///                 Ok(receipt) => receipt,
    ///                 Err(err) => {
    ///                     run.abandon().await;
    ///                     return Err(err); // dropping `tx` rolls it back
    ///                 }
    ///             };
    ///             run.complete_in(&mut tx, &receipt).await?;
    ///             tx.commit().await?;
    ///             Ok(receipt)
    ///         }
    ///     }
    /// }
    /// # let coord = coord_core::Coordinator::builder().memory().build().unwrap();
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    /// # assert_eq!(rt.block_on(charge(&coord, Transaction, "o-1")).unwrap(), 7);
    /// ```
    ///
    /// What each failure leaves is the table in [`TransactionRun`]'s documentation. Options of
    /// this handle that decide what happens to an unstored outcome do not apply here:
    /// `on_store_error` (the caller decides what to do with [`TransactionRun::complete_in`]'s
    /// error) and `on_abandoned` (a transactional marker that lapses is absent, never an
    /// unknown outcome). `renew` keeps the marker alive while the body runs; a marker lost
    /// anyway is reported by `complete_in`, since coord cannot stop a body it does not run.
    ///
    /// A provider that cannot write records in a transaction (Redis) refuses the claim with
    /// a [`CoordError::Backend`] of kind `Config`, whatever the backend-fault policy.
    pub async fn claim_in_transaction<T>(self) -> Result<TransactionStep<'c, T>, CoordError>
    where
        T: Serialize + DeserializeOwned,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = op_spec(&op, Some(self.spec), self.profile.as_deref());
        let call = Call::with_key(&spec, self.coordinator, self.key);
        let fingerprint = self.fingerprint.map(Ok);
        let step = call
            .run(claim_in_transaction::<Result<T, CoordError>>(
                &call,
                fingerprint,
            ))
            .await;
        match step {
            TransactionalStep::Answer(Ok(value)) => Ok(TransactionStep::Replay(value)),
            TransactionalStep::Answer(Err(err)) => Err(err),
            TransactionalStep::Run(run) => Ok(TransactionStep::Run(TransactionRun {
                coordinator: self.coordinator,
                key: call.key().clone(),
                run,
                _value: PhantomData,
            })),
        }
    }
}

/// The operation spec of one handle call: the idempotency layer alone.
fn op_spec<'a>(
    op: &'a str,
    idempotency: Option<IdempotencySpec>,
    profile: Option<&'a str>,
) -> OpSpec<'a> {
    OpSpec {
        name: op,
        idempotency,
        cache: None,
        lock: None,
        telemetry: OpTelemetry::new(),
        key_prefix: KeyPrefixCache::new(),
        record_key: false,
        profile,
    }
}

/// What [`Idempotent::claim_in_transaction`] found: a stored outcome, or the go-ahead to run
/// the body in the caller's transaction.
#[derive(Debug)]
pub enum TransactionStep<'c, T> {
    /// The outcome stored by an earlier call with this key (and, when fingerprinted, the same
    /// request): return it, do not run the body. The transaction was not touched.
    Replay(T),
    /// The key is claimed for this call: run the body in the transaction, then
    /// [`TransactionRun::complete_in`] that transaction.
    Run(TransactionRun<'c, T>),
}

/// A claimed transactional call, between its claim and its completion: from
/// [`Idempotent::claim_in_transaction`].
///
/// Settle it once: [`complete_in`](TransactionRun::complete_in) the transaction that holds the
/// body's effects (then commit), or [`abandon`](TransactionRun::abandon) it when the body
/// failed (then roll back). Dropped without either, it abandons the claim in the background,
/// owner-checked, so a duplicate runs at once; roll the transaction back then, since nothing
/// will record its effects.
///
/// # What each failure leaves
///
/// The same for `#[idempotent(transaction = "tx")]` (where "the caller gets" is what the
/// function returns) and for this handle (what [`complete_in`](TransactionRun::complete_in)
/// returns, or the body's own error after [`abandon`](TransactionRun::abandon)), with a
/// provider that writes records in the caller's transaction (PostgreSQL). A duplicate is a
/// later call with the same key, in a transaction of its own.
///
/// | what failed | what the caller gets | what a duplicate gets | what the database holds |
/// |---|---|---|---|
/// | nothing: the caller commits | `Ok(v)` | `Ok(v)`, replayed; its own transaction is not touched | the body's writes and the record, committed together |
/// | the body returned an error | the body's error; the marker is abandoned on the provider's own connection | a fresh run, at once | no record; the body's writes in the transaction are the caller's (roll back, as for any error) |
/// | the caller rolled back after `Ok` | what the rollback returns | `InFlight` (or a wait) until the marker's lease ends, then a fresh run; at once when the provider's transaction abandons its markers on rollback | nothing of the call |
/// | the body panicked, or the call was dropped | the panic, or nothing | a fresh run, at once: the marker is abandoned in the background | nothing, once the transaction is rolled back (dropping it does) |
/// | the process was killed before the commit | nothing | `InFlight` until the marker's lease ends, then a fresh run: a lapsed transactional marker is absent, never `OutcomeUnknown` | nothing: the database rolled the transaction back |
/// | the commit failed | the commit's error (the outcome is unknown to the caller only) | the replay if the commit landed, else a fresh run once the lease ends | the writes and the record, or neither: never one without the other |
/// | the marker lapsed during the body and another caller took the key | `CoordError::TransactionRollbackOnly` (`Superseded`); the transaction can no longer commit | the other caller's outcome, once it commits | only the other caller's writes and record |
/// | the marker was lost while the body ran, with `renew` (the attribute, `on_lost = "cancel"`) | `CoordError::LockLost`: the body is stopped, and the transaction can no longer commit | the other caller's outcome, or a fresh run | nothing of the call |
/// | the marker was gone at the completion (purged, reaped, or the transaction is of another database) | `TransactionRollbackOnly` (`MarkerMissing`); the transaction can no longer commit | a fresh run | nothing of the call |
/// | writing the record failed | `TransactionRollbackOnly` (`Backend`); the transaction can no longer commit | a fresh run once the marker is abandoned (after the rollback) | nothing of the call |
/// | the outcome cannot be encoded | `TransactionRollbackOnly` (`Codec`); coord marks the transaction rollback-only | a fresh run, at once | nothing of the call |
/// | a replay | the stored outcome | the same | unchanged: a replay never touches the transaction |
#[must_use = "complete the run in the transaction with `complete_in`, or `abandon` it; dropped, the claim is abandoned and the transaction must be rolled back"]
pub struct TransactionRun<'c, T> {
    coordinator: &'c Coordinator,
    key: CallKey,
    run: MarkedRun,
    _value: PhantomData<fn(&T)>,
}

impl<T> std::fmt::Debug for TransactionRun<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionRun")
            .field("key", &self.key)
            .field("guarded", &self.run.is_guarded())
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> TransactionRun<'_, T> {
    /// The call's key.
    pub fn key(&self) -> &CallKey {
        &self.key
    }

    /// False when the call runs without the idempotency layer (the backend failed under
    /// `on_backend_error = fail_open`): nothing is claimed, and
    /// [`complete_in`](TransactionRun::complete_in) writes nothing.
    pub fn is_guarded(&self) -> bool {
        self.run.is_guarded()
    }

    /// Writes `value` as the completed record of the key **in `tx`**, owner-checked inside
    /// the transaction: commit `tx` afterwards, and the record and the body's effects become
    /// visible together.
    ///
    /// On [`CoordError::TransactionRollbackOnly`] nothing was written and `tx` can no longer
    /// commit (another caller took the key over after this call's marker lapsed, the marker is
    /// missing, the write failed, or `value` cannot be encoded): roll it back. The marker is
    /// then abandoned in the background when it is still this call's.
    pub async fn complete_in<X>(self, tx: &mut X, value: &T) -> Result<(), CoordError>
    where
        X: OutcomeTransaction + ?Sized,
    {
        // A call of its own, for the completion's span and report (the claim's ended with
        // `claim_in_transaction`).
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = op_spec(&op, None, None);
        let call = Call::with_key(&spec, self.coordinator, self.key);
        let mut tx = tx;
        call.run(self.run.complete_value(&call, &mut tx, value))
            .await
    }

    /// Abandons the claim now, owner-checked, on the provider's own connection: the body failed,
    /// and the key is free for a retry at once. Roll the transaction back (or commit it, if
    /// what the body wrote there should stay: it is not recorded as this key's outcome).
    pub async fn abandon(self) {
        self.run.abandon().await;
    }
}
