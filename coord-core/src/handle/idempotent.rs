//! `coord.idempotent(key)`: `#[idempotent]` configured at run time.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CoordError;
use crate::policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
use crate::provider::CallKey;
use crate::provider::Fingerprint;
use crate::report::CallReport;
use crate::runtime::call::Call;
use crate::runtime::spec::Written;
use crate::runtime::spec::{IdempotencySpec, OpSpec};
use crate::runtime::state::Coordinator;
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
        let spec = OpSpec {
            name: &op,
            idempotency: Some(self.spec),
            cache: None,
            lock: None,
            telemetry: OpTelemetry::new(),
            record_key: false,
            profile: self.profile.as_deref(),
        };
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
}
