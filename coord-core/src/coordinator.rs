//! The [`Coordinator`]: which provider a call uses, under which namespace, with which defaults.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::call_key::{CallKey, CallKeyBuilder};
use crate::codec::Codec;
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
    namespace: String,
    provider: Option<ChosenProvider>,
    codec: Codec,
    on_backend_error: OnBackendError,
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
    /// Defaults to `coord`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
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

    /// Finishes the coordinator.
    pub fn build(self) -> Result<Coordinator, BuildError> {
        validate_namespace(&self.namespace)?;
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
                namespace: self.namespace,
                renewer: Renewer::new(locks.clone(), records.clone()),
                locks,
                records,
                operations,
                cache,
                flights,
                codec: self.codec,
                on_backend_error: self.on_backend_error,
                in_process,
                metrics: Metrics::default(),
                lifecycle: Arc::default(),
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
    /// Starts a builder with namespace `coord`, the tagged codec and `fail_closed`.
    pub fn builder() -> CoordinatorBuilder {
        CoordinatorBuilder {
            namespace: "coord".to_owned(),
            provider: None,
            codec: Codec::Tagged,
            on_backend_error: OnBackendError::FailClosed,
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
