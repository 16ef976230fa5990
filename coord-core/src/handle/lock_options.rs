//! The settings the four lock kinds' handles share ([`Lock`](super::Lock),
//! [`Semaphore`](super::Semaphore), [`RwLock`](super::RwLock),
//! [`MultiLock`](super::MultiLock)), written once: [`LockOptions`] holds and sets them, turns
//! them into the spec a guard is taken on or the operation a `run` calls, and
//! `lock_kind_setters!` (in the module root) gives each handle its public setters, each with the
//! docs of its own kind.

use std::future::Future;
use std::time::Duration;

use crate::error::CoordError;
use crate::policy::{OnBackendError, OnLost};
use crate::provider::CallKey;
use crate::runtime::call::Call;
use crate::runtime::lock::{Acquired, LockGuard, acquire_lock};
use crate::runtime::settings;
use crate::runtime::spec::{KeyPrefixCache, LockSpec, OpSpec, Written};
use crate::runtime::state::Coordinator;
use crate::telemetry::OpTelemetry;

/// A lock-kind handle's settings: the lock spec its setters write, and the profile it names.
#[derive(Debug, Clone)]
pub(super) struct LockOptions {
    pub(super) spec: LockSpec,
    pub(super) profile: Option<String>,
}

impl LockOptions {
    /// The attribute's defaults: lease 30 s, no wait, no renewal, the coordinator's
    /// backend-fault policy; fenced or not, and a semaphore's `permits` (0 for every other
    /// kind).
    pub(super) fn new(fenced: bool, permits: u32) -> LockOptions {
        LockOptions {
            spec: LockSpec {
                lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                fenced,
                permits,
                rw: None,
                on_backend_error: None,
                renew: None,
                on_lost: None,
                replica_acks: None,
                written: Written::NONE,
            },
            profile: None,
        }
    }

    pub(super) fn lease(&mut self, lease: Duration) {
        self.spec.lease = lease;
        self.spec.written = self.spec.written.with(Written::LEASE);
    }

    pub(super) fn wait(&mut self, wait: Duration) {
        self.spec.wait = wait;
        self.spec.written = self.spec.written.with(Written::WAIT);
    }

    /// Renewal, and cancellation on loss unless the caller chose otherwise.
    pub(super) fn renew(&mut self, every: Duration) {
        self.spec.renew = Some(every);
        self.spec.on_lost.get_or_insert(OnLost::Cancel);
        self.spec.written = self.spec.written.with(Written::RENEW);
    }

    pub(super) fn profile(&mut self, name: String) {
        self.profile = Some(name);
    }

    pub(super) fn on_backend_error(&mut self, policy: OnBackendError) {
        self.spec.on_backend_error = Some(policy);
    }

    /// The spec a guard is taken on: the profile's and the configured defaults' settings
    /// applied (profile > these setters > defaults), and a backend fault always reported (a
    /// guard stands for a held lock). A profile the coordinator does not have is
    /// [`CoordError::UnknownProfile`], naming the key `key` gives.
    pub(super) fn guard_spec(
        &self,
        coordinator: &Coordinator,
        key: impl FnOnce() -> CallKey,
    ) -> Result<LockSpec, CoordError> {
        let defaults = coordinator.configured_defaults();
        let Ok(profile) = settings::find_profile(coordinator, self.profile.as_deref()) else {
            return Err(CoordError::UnknownProfile {
                profile: self.profile.clone().unwrap_or_default(),
                key: key(),
            });
        };
        let mut spec = if profile.is_some() || defaults.is_some() {
            settings::lock(&self.spec, profile, defaults)
        } else {
            self.spec
        };
        spec.on_backend_error = Some(OnBackendError::FailClosed);
        Ok(spec)
    }

    /// The operation a handle's `run` calls, named `name`: the lock layer alone, on these
    /// settings (the layer resolves the profile, as for the attribute).
    pub(super) fn op_spec<'a>(&'a self, name: &'a str) -> OpSpec<'a> {
        OpSpec {
            name,
            idempotency: None,
            cache: None,
            lock: Some(self.spec),
            telemetry: OpTelemetry::new(),
            key_prefix: KeyPrefixCache::new(),
            record_key: false,
            profile: self.profile.as_deref(),
        }
    }

    /// Takes the single-key hold these settings describe (a lock, a permit, a read or write
    /// hold) as a guard: the answer of every handle's `acquire`.
    pub(super) async fn acquire_guard(
        &self,
        coordinator: &Coordinator,
        key: &CallKey,
    ) -> Result<LockGuard, CoordError> {
        let spec = self.guard_spec(coordinator, || key.clone())?;
        match acquire_lock(coordinator, key, &spec).await {
            Acquired::Granted(grant) => Ok(LockGuard::new(
                coordinator,
                grant,
                tokio::runtime::Handle::try_current().ok(),
            )),
            Acquired::Refused(err, _) => Err(err),
            // Only `fail_open` runs unguarded, and `guard_spec` overrides it.
            Acquired::Unguarded => unreachable!("fail_closed never runs unguarded"),
        }
    }

    /// Runs `body` under the single-key hold these settings describe, exactly as
    /// `#[distributed_lock]` does: every handle's `run`.
    pub(super) async fn run_locked<T, E, F, Fut>(
        &self,
        coordinator: &Coordinator,
        key: CallKey,
        body: F,
    ) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<CoordError>,
    {
        let op = key.operation().unwrap_or("").to_owned();
        let spec = self.op_spec(&op);
        let call = Call::with_key(&spec, coordinator, key);
        call.run(crate::runtime::lock::distributed_lock(
            &call,
            call.body(async move { body().await }),
        ))
        .await
    }
}

/// A `try_*` handle method's answer: a hold that could not be granted in time is `Ok(None)`.
pub(super) fn none_when_not_acquired<G>(
    acquired: Result<G, CoordError>,
) -> Result<Option<G>, CoordError> {
    match acquired {
        Ok(guard) => Ok(Some(guard)),
        Err(CoordError::LockNotAcquired { .. }) => Ok(None),
        Err(err) => Err(err),
    }
}
