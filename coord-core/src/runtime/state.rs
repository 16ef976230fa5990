//! The coordinator's shared state: the providers, namespace, codec, policies, configured
//! defaults and profiles, counters, renewal task and lifecycle every call of the runtime reads.
//!
//! [`Coordinator`] is defined here, below the runtime, so that the runtime reads it without
//! looking up at the front door; the front door (`coordinator.rs`, `handle.rs`,
//! `operator.rs`, `shutdown.rs`) adds the builder, the process default and the handles in
//! `impl Coordinator` blocks of its own.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::codec::Codec;
use crate::config::Profile;
use crate::policy::OnBackendError;
use crate::provider::{
    BackendError, CacheStore, CallKey, Capability, FlightStore, IdempotencyStore, LockProvider,
    MultiLockStore, Operations, RwLockStore, SemaphoreStore,
};
use coord_memory::MemoryProvider;

use crate::runtime::lifecycle::Lifecycle;
use crate::runtime::renewal::Renewer;
use crate::telemetry::Metrics;

/// Where intercepted calls coordinate: a provider, a namespace and the defaults every
/// attribute can override.
///
/// Cheap to clone (one `Arc`). Build one with [`Coordinator::builder`], then either
/// [`install`](Coordinator::install) it as the process-wide default the attributes use, or pass
/// it per call site with `coordinator = <expr>` on an attribute.
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    namespace: String,
    locks: Arc<dyn LockProvider>,
    records: Arc<dyn IdempotencyStore>,
    operations: Arc<dyn Operations>,
    cache: Arc<dyn CacheStore>,
    flights: Arc<dyn FlightStore>,
    semaphores: Arc<dyn SemaphoreStore>,
    rw_locks: Arc<dyn RwLockStore>,
    multi_locks: Arc<dyn MultiLockStore>,
    codec: Codec,
    on_backend_error: OnBackendError,
    in_process: bool,
    /// The in-process provider as itself, when it serves the locks (see
    /// [`Coordinator::in_process_locks`]).
    memory: Option<Arc<MemoryProvider>>,
    metrics: Metrics,
    renewer: Renewer,
    lifecycle: Arc<Lifecycle>,
    /// The configured defaults; `None` when none is set, so calls skip resolving.
    defaults: Option<Profile>,
    profiles: BTreeMap<String, Profile>,
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

/// Everything a coordinator is made of, as the builder assembled it.
pub(crate) struct Parts {
    pub(crate) namespace: String,
    pub(crate) locks: Arc<dyn LockProvider>,
    pub(crate) records: Arc<dyn IdempotencyStore>,
    pub(crate) operations: Arc<dyn Operations>,
    pub(crate) cache: Arc<dyn CacheStore>,
    pub(crate) flights: Arc<dyn FlightStore>,
    pub(crate) semaphores: Arc<dyn SemaphoreStore>,
    pub(crate) rw_locks: Arc<dyn RwLockStore>,
    pub(crate) multi_locks: Arc<dyn MultiLockStore>,
    pub(crate) codec: Codec,
    pub(crate) on_backend_error: OnBackendError,
    pub(crate) in_process: bool,
    pub(crate) memory: Option<Arc<MemoryProvider>>,
    pub(crate) defaults: Option<Profile>,
    pub(crate) profiles: BTreeMap<String, Profile>,
}

impl Coordinator {
    /// A coordinator from its parts, with fresh counters, renewal task and lifecycle.
    pub(crate) fn from_parts(parts: Parts) -> Coordinator {
        Coordinator {
            inner: Arc::new(Inner {
                renewer: Renewer::new(
                    parts.locks.clone(),
                    parts.records.clone(),
                    parts.semaphores.clone(),
                    parts.rw_locks.clone(),
                ),
                namespace: parts.namespace,
                locks: parts.locks,
                records: parts.records,
                operations: parts.operations,
                cache: parts.cache,
                flights: parts.flights,
                semaphores: parts.semaphores,
                rw_locks: parts.rw_locks,
                multi_locks: parts.multi_locks,
                codec: parts.codec,
                on_backend_error: parts.on_backend_error,
                in_process: parts.in_process,
                memory: parts.memory,
                metrics: Metrics::default(),
                lifecycle: Arc::default(),
                defaults: parts.defaults,
                profiles: parts.profiles,
            }),
        }
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

    /// The in-process provider, when it is this coordinator's lock provider: its locks are
    /// taken at the runtime's own clock reading and given back synchronously, without the
    /// contract's boxed futures (the same table and the same answers as through
    /// [`Coordinator::lock_provider`]).
    pub(crate) fn in_process_locks(&self) -> Option<&MemoryProvider> {
        self.inner.memory.as_deref()
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
    /// [`CallReport::key`](crate::CallReport::key) carry it, or as `Coordinator::key` builds
    /// it; an operator's pasted text (`payments.charge:order-7`) becomes one with
    /// [`CallKey::from_op_key`].
    pub async fn purge_record(&self, key: &CallKey) -> Result<bool, BackendError> {
        self.inner.records.purge(key).await
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

    /// The shared cache (the shared tier of `#[cached]`).
    pub fn cache_store(&self) -> &Arc<dyn CacheStore> {
        &self.inner.cache
    }

    /// The flight store (`#[single_flight(scope = "cluster")]`).
    pub fn flight_store(&self) -> &Arc<dyn FlightStore> {
        &self.inner.flights
    }

    /// The semaphore store (`permits = n`, [`Coordinator::semaphore`]). Ask
    /// [`Coordinator::supports`] first: a provider without semaphores answers every method
    /// with a `Config` error.
    pub fn semaphore_store(&self) -> &Arc<dyn SemaphoreStore> {
        &self.inner.semaphores
    }

    /// The read-write lock store (`mode = "read" | "write"`, [`Coordinator::rw_lock`]). Ask
    /// [`Coordinator::supports`] first: a provider without read-write locks answers every
    /// method with a `Config` error.
    pub fn rw_lock_store(&self) -> &Arc<dyn RwLockStore> {
        &self.inner.rw_locks
    }

    /// The provider's atomic path for multi-key locks ([`Coordinator::multi_lock`]). Ask
    /// [`Coordinator::supports`] first: a provider without it answers every method with a
    /// `Config` error, and multi-key locks then take their keys one by one.
    pub fn multi_lock_store(&self) -> &Arc<dyn MultiLockStore> {
        &self.inner.multi_locks
    }

    /// Whether this coordinator's provider has `capability`. A call that needs one the
    /// provider lacks fails with [`CoordError::Unsupported`](crate::CoordError::Unsupported)
    /// before anything runs; [`CoordinatorBuilder::require`](crate::CoordinatorBuilder::require)
    /// makes the mismatch a build error instead.
    pub fn supports(&self, capability: Capability) -> bool {
        match capability {
            Capability::Semaphores => self.inner.semaphores.supports_semaphores(),
            Capability::ReadWriteLocks => self.inner.rw_locks.supports_rw_locks(),
            Capability::MultiKeyLocks => self.inner.multi_locks.supports_multi_locks(),
            Capability::ReplicaAcks => self.inner.locks.supports_replica_acks(),
            // A capability this version of coord does not know: none of its providers has it.
            _ => false,
        }
    }

    /// A number naming this coordinator (and its clones, which share it) while it lives: the
    /// process flight of a cluster-scope call is per coordinator, so that two coordinators in
    /// one process meet through their provider as two instances would.
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
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

impl AsRef<Coordinator> for Coordinator {
    fn as_ref(&self) -> &Coordinator {
        self
    }
}
