//! The handle API: the layers of the attributes, configured at run time, for call sites where
//! an attribute does not fit (closures, trait objects, keys and durations known only at run
//! time). Every handle runs the same runtime functions the attribute expansions call.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::call_key::CallKey;
use crate::coordinator::Coordinator;
use crate::error::CoordError;
use crate::policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
use crate::provider::Fingerprint;
use crate::report::CallReport;
use crate::runtime::cache::{CacheScope, CacheSpec, LocalSlot};
use crate::runtime::call::{Call, IdempotencySpec, LockSpec, OpSpec};
use crate::runtime::lock::{Acquired, LockGuard, acquire_lock};
use crate::runtime::settings::{self, Written};
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

/// A lock configured at run time: from [`Coordinator::lock`].
///
/// The same lock as `#[distributed_lock]` (one acquisition path, one guard): a lease on the
/// key, owner-checked release and renewal, optional fencing. The defaults are the attribute's:
/// lease 30 s, no wait, unfenced, no renewal, the coordinator's backend-fault policy.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = coord.key("jobs.rebuild").part(&42u64).finish();
/// let guard = coord
///     .lock(key)
///     .lease(Duration::from_secs(60))
///     .fenced()
///     .acquire()
///     .await?;
/// let token = guard.fencing_token(); // pass it to the resource you write
/// # let _ = token;
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a lock does nothing until `acquire`, `try_acquire` or `run` is awaited"]
pub struct Lock<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    spec: LockSpec,
    profile: Option<String>,
}

impl Coordinator {
    /// A lock of `key`, configured at run time (see [`Lock`]).
    pub fn lock(&self, key: CallKey) -> Lock<'_> {
        Lock {
            coordinator: self,
            key,
            spec: LockSpec {
                lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                fenced: false,
                on_backend_error: None,
                renew: None,
                on_lost: None,
                written: Written::NONE,
            },
            profile: None,
        }
    }
}

impl Lock<'_> {
    /// How long the lock is held if its holder dies (never released, never renewed).
    /// Default 30 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.spec.lease = lease;
        self.spec.written = self.spec.written.with(Written::LEASE);
        self
    }

    /// How long to wait for a held lock. Default zero (one attempt).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.spec.wait = wait;
        self.spec.written = self.spec.written.with(Written::WAIT);
        self
    }

    /// Mints a fencing token with the acquisition ([`LockGuard::fencing_token`]).
    pub fn fenced(mut self) -> Self {
        self.spec.fenced = true;
        self
    }

    /// Renews the lease this often while the lock is held; a renewal that finds the lock gone,
    /// or a whole lease without a confirmed renewal, marks the hold lost
    /// ([`LockGuard::lost`]; with [`Lock::run`], the body is cancelled).
    pub fn renew(mut self, every: Duration) -> Self {
        self.spec.renew = Some(every);
        self.spec.on_lost.get_or_insert(OnLost::Cancel);
        self.spec.written = self.spec.written.with(Written::RENEW);
        self
    }

    /// Takes durations and the backend-fault policy from the coordinator's profile `name`:
    /// a field the profile sets beats this handle's setters, which beat the configured
    /// defaults (see [`config`](crate::config)). A profile the coordinator does not have is
    /// [`CoordError::UnknownProfile`] from `acquire`, `try_acquire` and `run`, before the lock
    /// is asked for.
    pub fn profile(mut self, name: impl Into<String>) -> Self {
        self.profile = Some(name.into());
        self
    }

    /// What to do when the backend fails. Default: the coordinator's policy. Under
    /// `FailOpen`, [`Lock::acquire`] and [`Lock::try_acquire`] still report the fault (they
    /// cannot hand out a guard for a lock nobody holds); [`Lock::run`] runs the body unguarded.
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.spec.on_backend_error = Some(policy);
        self
    }

    /// Takes the lock, waiting up to `wait`: [`CoordError::LockNotAcquired`] if it stayed held,
    /// [`CoordError::Reentrant`] if this task already holds it inside a `#[distributed_lock]`
    /// body or [`Lock::run`], [`CoordError::Backend`] on a backend fault.
    pub async fn acquire(self) -> Result<LockGuard, CoordError> {
        let defaults = self.coordinator.configured_defaults();
        let Ok(profile) = settings::find_profile(self.coordinator, self.profile.as_deref()) else {
            return Err(CoordError::UnknownProfile {
                profile: self.profile.unwrap_or_default(),
                key: self.key,
            });
        };
        let mut spec = if profile.is_some() || defaults.is_some() {
            settings::lock(&self.spec, profile, defaults)
        } else {
            self.spec
        };
        // A guard stands for a held lock: a fault is always reported here.
        spec.on_backend_error = Some(OnBackendError::FailClosed);
        match acquire_lock(self.coordinator, &self.key, &spec).await {
            Acquired::Granted(guard, _, _) => {
                Ok(guard.released_on(tokio::runtime::Handle::try_current().ok()))
            }
            Acquired::Refused(err, _) => Err(err),
            // Only `fail_open` runs unguarded, and it was overridden above.
            Acquired::Unguarded => unreachable!("fail_closed never runs unguarded"),
        }
    }

    /// Like [`Lock::acquire`], but a lock that stayed held is `Ok(None)` rather than an error.
    pub async fn try_acquire(self) -> Result<Option<LockGuard>, CoordError> {
        match self.acquire().await {
            Ok(guard) => Ok(Some(guard)),
            Err(CoordError::LockNotAcquired { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Runs `body` while holding the lock, exactly as `#[distributed_lock]` does: the lock is
    /// released when the body ends (or is cancelled, or panics); with renewal, a lost hold
    /// cancels the body and answers [`CoordError::LockLost`]; under `FailOpen`, a backend
    /// fault runs the body unguarded. Inside the body, [`fencing_token`](crate::fencing_token),
    /// [`is_held`](crate::is_held) and [`lock_lost`](crate::lock_lost) see this lock.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = OpSpec {
            name: &op,
            idempotency: None,
            cache: None,
            lock: Some(self.spec),
            telemetry: OpTelemetry::new(),
            record_key: false,
            profile: self.profile.as_deref(),
        };
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(crate::runtime::lock::distributed_lock(
            &call,
            call.body(async move { body().await }),
        ))
        .await
    }
}

/// Single-flight configured at run time: from [`Coordinator::single_flight`].
///
/// Concurrent calls with the same key **in this process** share one run of the body, exactly
/// as `#[single_flight]` does; nothing is remembered after it. If the body panics, every
/// caller sharing it panics too.
#[derive(Debug)]
#[must_use = "single-flight does nothing until `run` is awaited"]
pub struct SingleFlight<'c> {
    pub(crate) coordinator: &'c Coordinator,
    pub(crate) key: CallKey,
}

impl Coordinator {
    /// Single-flight for `key`, configured at run time (see [`SingleFlight`]).
    pub fn single_flight(&self, key: CallKey) -> SingleFlight<'_> {
        SingleFlight {
            coordinator: self,
            key,
        }
    }
}

impl SingleFlight<'_> {
    /// Runs `body`, or joins the run of a concurrent call with the same key and output type.
    pub async fn run<R, F, Fut>(self, body: F) -> R
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = R>,
        R: Clone + Send + 'static,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = OpSpec {
            name: &op,
            idempotency: None,
            cache: None,
            lock: None,
            telemetry: OpTelemetry::new(),
            record_key: false,
            profile: None,
        };
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(crate::runtime::flight::single_flight(
            &call,
            call.body(async move { body().await }),
        ))
        .await
    }
}

/// A cached call configured at run time: from [`Coordinator::cached`].
///
/// The same cache layer as `#[cached]`: a live entry for the key answers without running the
/// body; otherwise the body runs and an `Ok` outcome is kept for `ttl`. `Err` is never cached
/// here. The defaults: `ttl` 60 s, [`CacheScope::Local`], 10 000 local entries, `local_ttl`
/// a tenth of `ttl` (for [`CacheScope::TwoTier`]).
///
/// The local tier is shared by every handle and every `#[cached]` function with the same
/// operation name and output type in this process; the first one to run sets its
/// `max_capacity`. Since the scope is picked at run time, `run` asks the `Ok` type for serde
/// in every scope.
///
/// ```
/// # async fn demo() -> Result<(), coord_core::CoordError> {
/// use std::time::Duration;
/// let coord = coord_core::Coordinator::builder().memory().build().unwrap();
/// let key = || coord.key("prices.quote").part("EURUSD").finish();
/// let price: Result<u64, coord_core::CoordError> = coord
///     .cached(key())
///     .ttl(Duration::from_secs(5))
///     .run(|| async { Ok(108) })
///     .await;
/// assert_eq!(price?, 108);
/// coord.invalidate(&key()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a cached call does nothing until `run` is awaited"]
pub struct Cached<'c> {
    coordinator: &'c Coordinator,
    key: CallKey,
    ttl: Duration,
    scope: CacheScope,
    local_ttl: Option<Duration>,
    max_capacity: u64,
}

impl Coordinator {
    /// A cached call of `key`, configured at run time (see [`Cached`]).
    pub fn cached(&self, key: CallKey) -> Cached<'_> {
        Cached {
            coordinator: self,
            key,
            ttl: Duration::from_secs(60),
            scope: CacheScope::Local,
            local_ttl: None,
            max_capacity: 10_000,
        }
    }
}

impl Cached<'_> {
    /// How long an entry is served. Default 60 s.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Where entries are kept. Default [`CacheScope::Local`].
    pub fn scope(mut self, scope: CacheScope) -> Self {
        self.scope = scope;
        self
    }

    /// How long [`CacheScope::TwoTier`] keeps an entry locally (capped at `ttl`). Default a
    /// tenth of `ttl`.
    pub fn local_ttl(mut self, local_ttl: Duration) -> Self {
        self.local_ttl = Some(local_ttl);
        self
    }

    /// How many entries the local tier holds, if this handle is the first to make it. Default
    /// 10 000.
    pub fn max_capacity(mut self, entries: u64) -> Self {
        self.max_capacity = entries;
        self
    }

    /// Answers from the cache, or runs `body` and caches its `Ok`.
    pub async fn run<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Clone + Send + Sync + 'static + Serialize + DeserializeOwned,
        E: Clone + Send + Sync + 'static,
    {
        let op = self.key.operation().unwrap_or("").to_owned();
        let spec = OpSpec {
            name: &op,
            idempotency: None,
            cache: Some(CacheSpec {
                ttl: self.ttl,
                scope: self.scope,
                local_ttl: self.local_ttl.unwrap_or(self.ttl / 10),
                max_capacity: self.max_capacity,
                cache_err: false,
                local: LocalSlot::new(),
            }),
            lock: None,
            telemetry: OpTelemetry::new(),
            record_key: false,
            profile: None,
        };
        let call = Call::with_key(&spec, self.coordinator, self.key);
        call.run(crate::runtime::cache::cached(
            &call,
            crate::runtime::cache::shared_form(),
            call.body(async move { body().await }),
        ))
        .await
    }
}
