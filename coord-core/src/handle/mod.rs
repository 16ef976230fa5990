//! The handle API: the layers of the attributes, configured at run time, for call sites where
//! an attribute does not fit (closures, trait objects, keys and durations known only at run
//! time). Every handle runs the same runtime functions the attribute expansions call.
//!
//! | handle | from | the attribute it mirrors |
//! |---|---|---|
//! | [`Idempotent`] (in a transaction: [`TransactionStep`], [`TransactionRun`]) | [`Coordinator::idempotent`](crate::Coordinator::idempotent) | `#[idempotent]` (`transaction = "tx"`) |
//! | [`Lock`] (held: [`LockGuard`](crate::LockGuard)) | [`Coordinator::lock`](crate::Coordinator::lock) | `#[distributed_lock]` |
//! | [`MultiLock`] (held: [`MultiLockGuard`](crate::MultiLockGuard)) | [`Coordinator::multi_lock`](crate::Coordinator::multi_lock) | `#[distributed_lock(key_from_each = "..")]` |
//! | [`Semaphore`] (held: [`PermitGuard`]) | [`Coordinator::semaphore`](crate::Coordinator::semaphore) | `#[distributed_lock(permits = n)]` |
//! | [`RwLock`] (held: [`RwLockGuard`]) | [`Coordinator::rw_lock`](crate::Coordinator::rw_lock) | `#[distributed_lock(mode = "read" \| "write")]` |
//! | [`SingleFlight`] | [`Coordinator::single_flight`](crate::Coordinator::single_flight) | `#[single_flight]` |
//! | [`ClusterFlight`] | [`SingleFlight::cluster`] | `#[single_flight(scope = "cluster")]` |
//! | [`Cached`] (scopes: [`CacheScope`]) | [`Coordinator::cached`](crate::Coordinator::cached) | `#[cached]` |

mod cached;
mod cluster_flight;
mod idempotent;
mod lock;
mod multi_lock;
mod rw_lock;
mod semaphore;
mod single_flight;

pub use crate::runtime::cache_tiers::CacheScope;
pub use crate::runtime::cluster_flight::{
    ClusterFlightSpec, DEFAULT_LEASE as CLUSTER_FLIGHT_DEFAULT_LEASE,
    HAND_OVER as CLUSTER_FLIGHT_HAND_OVER,
};
pub use crate::runtime::flight::open_flights;
pub use cached::Cached;
pub use cluster_flight::ClusterFlight;
pub use idempotent::{Idempotent, TransactionRun, TransactionStep};
pub use lock::Lock;
pub use multi_lock::MultiLock;
pub use rw_lock::{RwLock, RwLockGuard};
pub use semaphore::{PermitGuard, Semaphore};
pub use single_flight::SingleFlight;
