//! # coord
//!
//! "This must not happen twice" as one attribute on an async fn.
//!
//! ```
//! use coord_core::{CoordError, distributed_lock, idempotent, single_flight};
//!
//! #[derive(Debug)]
//! enum PaymentError { Coord(CoordError) }
//! impl From<CoordError> for PaymentError {
//!     fn from(e: CoordError) -> Self { PaymentError::Coord(e) }
//! }
//!
//! #[idempotent(key_from = "idempotency_key", retention = "24h")]
//! async fn charge(idempotency_key: String, cents: u64) -> Result<u64, PaymentError> {
//!     Ok(cents)
//! }
//!
//! #[distributed_lock(key_from = "tenant_id", lease = "5m", wait = "0s")]
//! async fn rebuild(tenant_id: u64) -> Result<(), CoordError> {
//!     Ok(())
//! }
//!
//! #[single_flight(key_from = "symbol")]
//! async fn quote(symbol: &str) -> Result<u64, std::sync::Arc<std::io::Error>> {
//!     Ok(42)
//! }
//! ```
//!
//! * [`idempotent`]: a successful outcome is stored for `retention` and replayed to later calls
//!   with the same key; errors leave no trace.
//! * [`single_flight`]: concurrent calls with one key in this process share one run
//!   (with `scope = "cluster"`, on every instance sharing the provider, as a best effort with
//!   a lease).
//! * [`distributed_lock`]: one holder at a time per key, across every process sharing the
//!   provider, for at most `lease` if the holder dies.
//!
//! Whatever order the attributes are written in, they nest the same way: idempotency outermost
//! (a replay touches nothing else), single-flight next (coalescing locally is free, a remote
//! lock is not), the lock innermost (one holder owns the whole unit of work). The key is derived
//! once per call and shared by every layer.
//!
//! ## A lock is a lease
//! A distributed lock bounds how long a crashed holder blocks others; it is not consensus. A
//! holder that stalls (a GC-like pause, a swapped-out VM, a slow network) past its lease can
//! wake up and keep writing while a successor holds the lock. Use `fenced = true` and pass
//! [`fencing_token()`] to the resource, which must refuse writes with an older token than the
//! newest it has seen. That, not the lock alone, makes the section safe.
//!
//! ## Providers
//! Calls coordinate through the [`Coordinator`] installed at start-up, or the one passed with
//! `coordinator = <expr>`. The route is the environment: `coord_redis::coordinator_from_env()`
//! (Redis from `COORD_REDIS_URL`, every other `COORD_*` variable applied), or
//! [`Coordinator::from_env`] in process; [`Coordinator::builder`] sets everything in code, for
//! tests, and warns about `COORD_*` variables it does not apply. With none installed, the
//! in-process provider is used and one warning is logged: exclusion then holds within this
//! process only.
//!
//! ## Names
//! An attribute without `name = ".."` names its operation after the module path and the
//! function (`my_app::jobs::nightly`); keys show as `operation:parts`
//! (`my_app::jobs::nightly:t-7`), the operation ending at the first single `:`. The call's
//! [`CallReport::key`], the `op` field of its span and metrics, and `coord locks list` without
//! an operation show it.
//!
//! ## Configuration
//! [`CoordConfig`] (any serde source, or the `COORD_*` variables) gives a coordinator its
//! namespace, default durations and named profiles; `profile = "name"` on an attribute takes
//! durations from the profile at run time. See [`config`] for the precedence table.

// Layers, bottom up; a module imports only from its own layer or the ones below (checked by
// `scripts/check-layers`):
//   1. `provider`: the contract (the `coord-contract` crate).
//   2. foundations: `codec`, `fingerprint`, `policy`, `error`, `report`, `telemetry`, `fence`,
//      `config` (configuration as data).
//   3. `runtime`: what generated code and handles call, the coordinator's state.
//   4. the front door: `coordinator` (builder, process default), `handle`, `operator`,
//      `shutdown`, and this file.
pub mod provider;

mod codec;
pub mod config;
mod error;
pub mod fence;
mod fingerprint;
mod policy;
pub mod report;
pub mod telemetry;

mod runtime;

mod coordinator;
pub mod handle;
pub mod operator;
mod shutdown;

/// The in-process provider (`Coordinator::builder().memory()`, and the fallback when no
/// coordinator is installed), for code that wants to hold it directly (tests, inspection).
pub mod memory {
    pub use coord_memory::MemoryProvider;
}

pub use coord_macros::{cached, distributed_lock, idempotent, single_flight};

pub use codec::Codec;
pub use config::{ConfigError, CoordConfig, Profile};
pub use coordinator::CoordinatorBuilder;
pub use error::{BuildError, CoordError, NotStoredCause, RollbackCause};
pub use policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
pub use provider::{BackendError, CallKey, FencingToken, KeyPart, LossCause, RwMode};
pub use report::{CallReport, observe};
pub use runtime::held::{fencing_token, is_held, lock_lost};
pub use runtime::lock::LockGuard;
pub use runtime::multi_lock::{MultiLockGuard, fencing_token_of};
pub use runtime::state::Coordinator;
pub use shutdown::ShutdownReport;

/// What the generated code calls. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::coordinator::{InProcessRoute, warn_in_process_once};
    pub use crate::fingerprint::FingerprintHasher;
    pub use crate::policy::{OnAbandoned, OnBackendError, OnLost, OnMissingKey, OnStoreError};
    pub use crate::provider::CallKeyBuilder;
    pub use crate::provider::ReplicaAcks;
    pub use crate::provider::RwMode;
    pub use crate::runtime::cache::cached;
    pub use crate::runtime::cache_tiers::{
        CacheForm, CacheOutput, CacheScope, CacheSpec, LocalSlot, SharedOutput, SharedResultOutput,
        local_form, shared_form, shared_result_form,
    };
    pub use crate::runtime::call::Call;
    pub use crate::runtime::cluster_flight::{
        ClusterFlightSpec, ClusterOutput, ErrorForm, FlightProbe, OpaqueErrorProbe,
        SharedErrorProbe, cluster_single_flight, opaque_errors, shared_errors,
    };
    pub use crate::runtime::flight::single_flight;
    pub use crate::runtime::idempotency::idempotent;
    pub use crate::runtime::lock::distributed_lock;
    pub use crate::runtime::multi_lock::{EachKeyPart, distributed_multi_lock, each_key};
    pub use crate::runtime::outcome::{
        GuardedResult, assert_guarded_result, assert_shareable_output,
    };
    pub use crate::runtime::spec::Written;
    pub use crate::runtime::spec::{IdempotencySpec, KeyPrefixCache, LockSpec, OpSpec};
    pub use crate::runtime::transactional::{MarkedRun, TransactionalStep, claim_in_transaction};
    pub use crate::telemetry::OpTelemetry;
    pub use core::time::Duration;

    use crate::Coordinator;

    /// The installed coordinator, or the in-process fallback.
    #[inline]
    pub fn default_coordinator() -> &'static Coordinator {
        Coordinator::current()
    }

    /// An owned handle to the coordinator named by `coordinator = <expr>`.
    #[inline]
    pub fn own_coordinator<C: AsRef<Coordinator> + ?Sized>(c: &C) -> Coordinator {
        c.as_ref().clone()
    }

    /// The coordinator named by `coordinator = self.field` on a `&self` method, borrowed.
    #[inline]
    pub fn borrow_coordinator<C: AsRef<Coordinator> + ?Sized>(c: &C) -> &Coordinator {
        c.as_ref()
    }
}
