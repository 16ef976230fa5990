//! The [`Coordinator`]: which provider a call uses, under which namespace, with which defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::call_key::{CallKey, CallKeyBuilder};
use crate::codec::Codec;
use crate::config::{ConfigError, CoordConfig, Profile, ProviderConfig};
use crate::flight_store::FlightStore;
use crate::memory_provider::MemoryProvider;
use crate::operations::{Operations, Operator};
use crate::policy::OnBackendError;
use crate::provider::{CacheStore, IdempotencyStore, LockProvider};
use crate::runtime::renewal::Renewer;
use crate::shutdown::Lifecycle;

/// A provider that serves every layer that needs shared state, and the operations API.
/// Implemented automatically for any type that implements the four traits. [`CacheStore`] and
/// [`Operations`] have defaults for every method (reporting them unsupported), so a provider
/// without a shared cache or operator support opts out with `impl CacheStore for MyProvider {}`
/// and `impl Operations for MyProvider {}`.
///
/// [`FlightStore`] (cluster-scope single-flight) has defaults too: opt out with
/// `impl FlightStore for MyProvider {}`.
pub trait Provider:
    LockProvider + IdempotencyStore + CacheStore + Operations + FlightStore
{
}
impl<P: LockProvider + IdempotencyStore + CacheStore + Operations + FlightStore> Provider for P {}

/// Where intercepted calls coordinate: a provider, a namespace and the defaults every
/// attribute can override.
///
/// Cheap to clone (one `Arc`). Build one with [`Coordinator::builder`], then either
/// [`install`](Coordinator::install) it as the process-wide default the attributes use, or pass
/// it per call site with `coordinator = <expr>` on an attribute.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

struct Inner {
    namespace: String,
    locks: Arc<dyn LockProvider>,
    records: Arc<dyn IdempotencyStore>,
    operations: Arc<dyn Operations>,
    cache: Arc<dyn CacheStore>,
    flights: Arc<dyn FlightStore>,
    codec: Codec,
    on_backend_error: OnBackendError,
    in_process: bool,
    metrics: Metrics,
    renewer: Renewer,
    lifecycle: Arc<Lifecycle>,
    /// The configured defaults; `None` when none is set, so calls skip resolving.
    defaults: Option<Profile>,
    profiles: BTreeMap<String, Profile>,
}

/// Counters a coordinator keeps for operators.
#[derive(Debug, Default)]
pub struct Metrics {
    fail_open: AtomicU64,
    lapsed_releases: AtomicU64,
    unprotected: AtomicU64,
    not_stored: AtomicU64,
}

impl Metrics {
    /// How many calls ran unguarded because the backend failed under `fail_open`.
    pub fn fail_open_runs(&self) -> u64 {
        self.fail_open.load(Ordering::Relaxed)
    }

    /// How many locks were found already lapsed at release: sections that were not exclusive
    /// for their whole duration.
    pub fn lapsed_releases(&self) -> u64 {
        self.lapsed_releases.load(Ordering::Relaxed)
    }

    /// How many `#[idempotent]` calls ran without the idempotency layer because a key part was
    /// absent (`on_missing_key = "run_unprotected"`).
    pub fn unprotected_runs(&self) -> u64 {
        self.unprotected.load(Ordering::Relaxed)
    }

    /// How many `#[idempotent]` bodies returned `Ok` whose outcome could not be stored.
    pub fn outcomes_not_stored(&self) -> u64 {
        self.not_stored.load(Ordering::Relaxed)
    }

    pub(crate) fn count_unprotected(&self) {
        self.unprotected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_not_stored(&self) {
        self.not_stored.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_fail_open(&self) {
        self.fail_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_lapsed_release(&self) {
        self.lapsed_releases.fetch_add(1, Ordering::Relaxed);
    }
}

impl fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Coordinator")
            .field("namespace", &self.inner.namespace)
            .field("codec", &self.inner.codec)
            .field("on_backend_error", &self.inner.on_backend_error)
            .field("in_process_only", &self.is_in_process_only())
            .finish_non_exhaustive()
    }
}

/// Why a coordinator could not be built or installed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// `build` was called without `.memory()` or `.provider(..)`.
    NoProvider,
    /// The namespace is empty or holds a character that would break key layout
    /// (`{`, `}`, `:`, whitespace or control characters).
    InvalidNamespace(String),
    /// A process-wide default coordinator was already installed (or the in-process fallback was
    /// already taken by a call). Install once, at start-up, before the first intercepted call.
    AlreadyInstalled,
    /// A default or a profile holds a value coord cannot honour (a zero lease, a `renew` not
    /// shorter than its lease, a profile name that is not lowercase letters, digits and `_`).
    InvalidSetting {
        /// The setting's path, as in configuration (`profiles.payments.lease`).
        field: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoProvider => f.write_str(
                "no provider chosen: call `.memory()` or `.provider(..)` on the coordinator builder",
            ),
            BuildError::InvalidNamespace(ns) => write!(
                f,
                "invalid namespace {ns:?}: use a non-empty name without `{{`, `}}`, `:`, whitespace or control characters"
            ),
            BuildError::AlreadyInstalled => f.write_str(
                "a default coordinator is already in place: install once at start-up, before the first intercepted call",
            ),
            BuildError::InvalidSetting { field, reason } => {
                write!(f, "invalid coordinator setting `{field}`: {reason}")
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// The provider a builder was given, seen through both traits.
struct ChosenProvider {
    locks: Arc<dyn LockProvider>,
    records: Arc<dyn IdempotencyStore>,
    operations: Arc<dyn Operations>,
    cache: Arc<dyn CacheStore>,
    flights: Arc<dyn FlightStore>,
    /// Set for the in-process provider: exclusion holds within this process only.
    in_process: bool,
}

/// Builds a [`Coordinator`].
#[must_use]
pub struct CoordinatorBuilder {
    namespace: Option<String>,
    provider: Option<ChosenProvider>,
    codec: Codec,
    on_backend_error: OnBackendError,
    defaults: Profile,
    profiles: BTreeMap<String, Profile>,
}

impl fmt::Debug for CoordinatorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoordinatorBuilder")
            .field("namespace", &self.namespace)
            .field("codec", &self.codec)
            .field("on_backend_error", &self.on_backend_error)
            .finish_non_exhaustive()
    }
}

impl CoordinatorBuilder {
    /// The prefix that keeps this service's keys apart from others sharing the backend.
    /// Defaults to `COORD_NAMESPACE`, else the binary's name
    /// ([`default_namespace`](crate::config::default_namespace)).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Coordinates inside this process only (the in-process provider).
    pub fn memory(mut self) -> Self {
        let provider = Arc::new(MemoryProvider::new());
        self.provider = Some(ChosenProvider {
            locks: provider.clone(),
            records: provider.clone(),
            operations: provider.clone(),
            cache: provider.clone(),
            flights: provider.clone(),
            in_process: true,
        });
        self
    }

    /// Coordinates through `provider` (for instance a Redis provider).
    pub fn provider<P: Provider>(mut self, provider: P) -> Self {
        let provider = Arc::new(provider);
        self.provider = Some(ChosenProvider {
            locks: provider.clone(),
            records: provider.clone(),
            operations: provider.clone(),
            cache: provider.clone(),
            flights: provider,
            in_process: false,
        });
        self
    }

    /// How stored outcomes of `#[idempotent]` calls are encoded: [`Codec::Tagged`] (exact
    /// replays) by default, [`Codec::Json`] for records readable in the backend.
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// The backend-fault policy of attributes that do not set `on_backend_error` themselves.
    /// `FailClosed` by default.
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.on_backend_error = policy;
        self
    }

    /// Finishes the coordinator. Fails on an invalid namespace, on a default or profile coord
    /// cannot honour ([`BuildError::InvalidSetting`]), or without a provider.
    pub fn build(self) -> Result<Coordinator, BuildError> {
        let namespace = self
            .namespace
            .unwrap_or_else(crate::config::default_namespace);
        validate_namespace(&namespace)?;
        let invalid = |(field, reason)| BuildError::InvalidSetting { field, reason };
        crate::config::check_profile("defaults", &self.defaults).map_err(invalid)?;
        for (name, profile) in &self.profiles {
            crate::config::check_profile_name(name).map_err(|reason| {
                BuildError::InvalidSetting {
                    field: format!("profiles.{name}"),
                    reason,
                }
            })?;
            crate::config::check_profile(&format!("profiles.{name}"), profile).map_err(invalid)?;
        }
        // The backend-fault policy of the defaults is the coordinator's own policy.
        let on_backend_error = self
            .defaults
            .on_backend_error
            .unwrap_or(self.on_backend_error);
        let defaults = Profile {
            on_backend_error: None,
            ..self.defaults
        };
        let ChosenProvider {
            locks,
            records,
            operations,
            cache,
            flights,
            in_process,
        } = self.provider.ok_or(BuildError::NoProvider)?;
        Ok(Coordinator {
            inner: Arc::new(Inner {
                namespace,
                renewer: Renewer::new(locks.clone(), records.clone()),
                locks,
                records,
                operations,
                cache,
                flights,
                codec: self.codec,
                on_backend_error,
                in_process,
                metrics: Metrics::default(),
                lifecycle: Arc::default(),
                defaults: (!defaults.is_empty()).then_some(defaults),
                profiles: self.profiles,
            }),
        })
    }

    /// Builds the coordinator and installs it as the process-wide default.
    pub fn install(self) -> Result<Coordinator, BuildError> {
        let coordinator = self.build()?;
        coordinator.clone().install()?;
        Ok(coordinator)
    }
}

fn validate_namespace(ns: &str) -> Result<(), BuildError> {
    let bad = ns.is_empty()
        || ns
            .chars()
            .any(|c| matches!(c, '{' | '}' | ':') || c.is_whitespace() || c.is_control());
    if bad {
        Err(BuildError::InvalidNamespace(ns.to_owned()))
    } else {
        Ok(())
    }
}

static DEFAULT: OnceLock<Coordinator> = OnceLock::new();
static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

impl Coordinator {
    /// Starts a builder with the default namespace (`COORD_NAMESPACE`, else the binary's
    /// name: [`default_namespace`](crate::config::default_namespace)), the tagged codec,
    /// `fail_closed`, no configured defaults and no profiles.
    pub fn builder() -> CoordinatorBuilder {
        CoordinatorBuilder {
            namespace: None,
            provider: None,
            codec: Codec::Tagged,
            on_backend_error: OnBackendError::FailClosed,
            defaults: Profile::default(),
            profiles: BTreeMap::new(),
        }
    }

    /// Makes this the coordinator every attribute without `coordinator = ..` uses.
    ///
    /// Succeeds once per process. It fails with [`BuildError::AlreadyInstalled`] when a
    /// coordinator was installed before, or when an intercepted call already ran on the
    /// in-process fallback (switching providers under running code would split its locks).
    pub fn install(self) -> Result<(), BuildError> {
        DEFAULT.set(self).map_err(|_| BuildError::AlreadyInstalled)
    }

    /// The installed coordinator, or the in-process fallback when none is installed. The first
    /// use of the fallback logs one warning for the whole process.
    pub fn current() -> &'static Coordinator {
        DEFAULT.get_or_init(|| {
            if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "coord: no coordinator installed; using the in-process provider, so locks, \
                     single-flight and idempotency hold within this process only. Install one at \
                     start-up, e.g. `Coordinator::builder().namespace(\"svc\").provider(redis).install()`"
                );
            }
            Coordinator::builder()
                .memory()
                .build()
                .expect("the in-process fallback always builds")
        })
    }

    /// The namespace keys are kept under.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The codec for stored outcomes.
    pub fn codec(&self) -> Codec {
        self.inner.codec
    }

    /// The default backend-fault policy.
    pub fn on_backend_error(&self) -> OnBackendError {
        self.inner.on_backend_error
    }

    /// True for the in-process provider: exclusion holds within this process only.
    pub fn is_in_process_only(&self) -> bool {
        self.inner.in_process
    }

    /// The counters this coordinator keeps.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// How many leases (locks and in-flight markers) are being renewed right now. Zero once
    /// every renewing call has finished: renewal state never outlives the hold.
    pub fn active_renewals(&self) -> usize {
        self.inner.renewer.active()
    }

    pub(crate) fn renewer(&self) -> &Renewer {
        &self.inner.renewer
    }

    pub(crate) fn lifecycle(&self) -> &Arc<Lifecycle> {
        &self.inner.lifecycle
    }

    /// Removes the idempotency record of one call, whatever its state: an operator's tool for
    /// resolving an abandoned record (`CoordError::OutcomeUnknown`) after reconciling by hand.
    /// `key` is the call's key as [`CoordError::key`](crate::CoordError::key) and
    /// [`CallReport::key`](crate::CallReport::key) carry it, or as [`Coordinator::key`] builds
    /// it; an operator's pasted text (`payments.charge:order-7`) becomes one with
    /// [`CallKey::from_op_key`].
    pub async fn purge_record(&self, key: &CallKey) -> Result<bool, crate::BackendError> {
        self.inner.records.purge(key).await
    }

    /// Starts the key of `operation` in this coordinator's namespace, for the handle API and
    /// operator tools. Parts render exactly as the attributes render `key_from` parameters, so
    /// `coord.key("payments.charge").part(&order_id).finish()` is the key of
    /// `#[idempotent(name = "payments.charge", key_from = "order_id")]`.
    pub fn key(&self, operation: &str) -> CallKeyBuilder {
        CallKey::builder(self.namespace(), operation)
    }

    /// The lock provider.
    pub fn lock_provider(&self) -> &Arc<dyn LockProvider> {
        &self.inner.locks
    }

    /// The idempotency store.
    pub fn idempotency_store(&self) -> &Arc<dyn IdempotencyStore> {
        &self.inner.records
    }

    /// The provider's operations API, as the provider implements it (no namespace applied, no
    /// logging). Operators use [`Coordinator::operator`].
    pub fn operations(&self) -> &Arc<dyn Operations> {
        &self.inner.operations
    }

    /// An operator's handle on this coordinator's state: inspect and list locks and records of
    /// this namespace, force a lock free, purge a record (each destructive call logged with who
    /// asked). See [`Operator`].
    pub fn operator(&self) -> Operator<'_> {
        Operator::new(self)
    }

    /// Removes the cached answer of one call: the entries of this process's local tiers (every
    /// `#[cached]` operation or [`Coordinator::cached`] handle with `key`'s operation name),
    /// and the shared entry in the provider. Returns whether an entry was found anywhere.
    ///
    /// `key` is the key the attribute uses: `coord.key(op).part(..).finish()` with the
    /// attribute's `name` and its `key_from` parameters in order. Local tiers of other
    /// processes are not reached: with `scope = "two_tier"` they keep serving their copy for
    /// at most `local_ttl`.
    ///
    /// Fails only when deleting the shared entry fails (the local entries are gone by then).
    pub async fn invalidate(&self, key: &CallKey) -> Result<bool, crate::BackendError> {
        let local = crate::runtime::cache::invalidate_local(key);
        let shared = self.inner.cache.cache_delete(key).await?;
        Ok(local || shared)
    }

    /// The shared cache (the shared tier of `#[cached]`).
    pub fn cache_store(&self) -> &Arc<dyn CacheStore> {
        &self.inner.cache
    }

    /// The flight store (`#[single_flight(scope = "cluster")]`).
    pub fn flight_store(&self) -> &Arc<dyn FlightStore> {
        &self.inner.flights
    }

    /// A number naming this coordinator (and its clones, which share it) while it lives: the
    /// process flight of a cluster-scope call is per coordinator, so that two coordinators in
    /// one process meet through their provider as two instances would.
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}

impl AsRef<Coordinator> for Coordinator {
    fn as_ref(&self) -> &Coordinator {
        self
    }
}

impl CoordinatorBuilder {
    /// Values for calls that neither name a profile setting a field nor write it themselves
    /// (see the precedence table in [`config`](crate::config)). Its `on_backend_error`, when
    /// set, is the coordinator's backend-fault policy, in place of whatever
    /// [`on_backend_error`](Self::on_backend_error) set.
    pub fn defaults(mut self, defaults: Profile) -> Self {
        self.defaults = defaults;
        self
    }

    /// Adds (or replaces) the profile `name`, which attributes pick with `profile = "name"` and
    /// handles with `.profile("name")`.
    pub fn profile(mut self, name: impl Into<String>, profile: Profile) -> Self {
        self.profiles.insert(name.into(), profile);
        self
    }

    /// Applies a configuration's namespace (when it sets one), defaults and profiles. The
    /// provider and command timeout are not applied here: they need a provider crate
    /// (`coord_redis::coordinator_from_config`), or [`Coordinator::from_config`] for the
    /// in-process one.
    pub fn configure(mut self, config: &CoordConfig) -> Self {
        if let Some(ns) = &config.namespace {
            self.namespace = Some(ns.clone());
        }
        self.defaults = config.defaults;
        self.profiles = config.profiles.clone();
        self
    }
}

impl Coordinator {
    /// The in-process coordinator a configuration describes: validated, with its namespace,
    /// defaults and profiles. A configuration with no provider logs the in-process warning
    /// once per process (naming the fix); one naming Redis, Sentinel or Cluster is
    /// [`ConfigError::ProviderNeedsBackendCrate`], never a silent fall back to memory.
    pub fn from_config(config: &CoordConfig) -> Result<Coordinator, ConfigError> {
        config.validate()?;
        match &config.provider {
            None => warn_in_process_once(
                "no provider configured; using the in-process provider, so locks, single-flight \
                 and idempotency hold within this process only. Set COORD_REDIS_URL (or \
                 `provider` in the configuration) and build with \
                 `coord_redis::coordinator_from_config`",
            ),
            Some(ProviderConfig::Memory) => {}
            Some(ProviderConfig::Redis { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "redis" });
            }
            Some(ProviderConfig::Sentinel { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "sentinel" });
            }
            Some(ProviderConfig::Cluster { .. }) => {
                return Err(ConfigError::ProviderNeedsBackendCrate { kind: "cluster" });
            }
        }
        Ok(Coordinator::builder().configure(config).memory().build()?)
    }

    /// [`Coordinator::from_config`] over [`CoordConfig::from_env`]: the `COORD_*` variables.
    /// With `COORD_REDIS_URL` (or a Sentinel or Cluster variable) set, this is
    /// [`ConfigError::ProviderNeedsBackendCrate`]: use `coord_redis::coordinator_from_env`.
    pub fn from_env() -> Result<Coordinator, ConfigError> {
        Coordinator::from_config(&CoordConfig::from_env()?)
    }

    /// The profile `name` of this coordinator's configuration.
    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.inner.profiles.get(name)
    }

    /// The configured defaults, `None` when none is set (the backend-fault policy is
    /// [`Coordinator::on_backend_error`]).
    pub(crate) fn configured_defaults(&self) -> Option<&Profile> {
        self.inner.defaults.as_ref()
    }
}

/// Logs `message` at warn, once per process, shared with the warning of the in-process
/// fallback: a process learns once that its coordination is local.
fn warn_in_process_once(message: &str) {
    if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!("coord: {message}");
    }
}
