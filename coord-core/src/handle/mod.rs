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

/// The two replica-acknowledgement setters of a handle whose settings are `self.spec`, or the
/// spec at the field path given after `$writes` (a spec with a `replica_acks` field): one text
/// and one body for the lock, semaphore, read-write lock, multi-key lock and idempotent
/// handles. `$writes` names the writes that wait, for the docs.
macro_rules! replica_acks_setters {
    ($writes:literal) => {
        replica_acks_setters!($writes, spec);
    };
    ($writes:literal, $($spec:ident).+) => {
        #[doc = concat!(
            "Waits for `replicas` replicas to acknowledge ", $writes, ", for at most `timeout`, \
             whatever the provider's own setting (for Redis, \
             `RedisProviderBuilder::replica_acks`); fewer acknowledgements make the write count \
             as failed (a \
             [`BackendErrorKind::NotReplicated`](crate::provider::BackendErrorKind::NotReplicated) \
             error, as with the provider's setting). `replicas` of zero is \
             [`without_replica_acks`](Self::without_replica_acks). Default: the provider's \
             setting."
        )]
        ///
        /// A provider that does not replicate (the in-process one, PostgreSQL) cannot honour it:
        /// the call is refused with [`CoordError::Unsupported`](crate::CoordError::Unsupported)
        /// naming [`Capability::ReplicaAcks`](crate::provider::Capability::ReplicaAcks) before
        /// anything is written. The timeout must be above zero and below the provider's command
        /// timeout (Redis answers a `Config` error otherwise).
        pub fn replica_acks(mut self, replicas: u32, timeout: std::time::Duration) -> Self {
            self.$($spec).+.replica_acks =
                Some(crate::provider::ReplicaAcks::wait(replicas, timeout));
            self
        }

        /// Does not wait for replicas for this call, even when the provider does by default: for
        /// an operation whose loss in a failover costs little (a lock that only saves duplicate
        /// work), to keep it fast and available while replicas lag. Accepted by every provider.
        pub fn without_replica_acks(mut self) -> Self {
            self.$($spec).+.replica_acks = Some(crate::provider::ReplicaAcks::Off);
            self
        }
    };
}

/// The public setters of a lock-kind handle whose settings are `self.options` (a
/// [`LockOptions`](lock_options::LockOptions)): the bodies written once, here and in
/// `LockOptions`; the docs given per kind at each handle, so that what a user reads on
/// `Semaphore::lease` speaks of a permit. In this order: `lease`, `wait`, `renew` (each after
/// its docs), the replica-acknowledgement setters (`replica_acks: "the writes that wait";`),
/// `profile`, `on_backend_error`.
macro_rules! lock_kind_setters {
    (
        $(#[$lease:meta])* lease;
        $(#[$wait:meta])* wait;
        $(#[$renew:meta])* renew;
        replica_acks: $writes:literal;
        $(#[$profile:meta])* profile;
        $(#[$on_backend_error:meta])* on_backend_error;
    ) => {
        $(#[$lease])*
        pub fn lease(mut self, lease: std::time::Duration) -> Self {
            self.options.lease(lease);
            self
        }

        $(#[$wait])*
        pub fn wait(mut self, wait: std::time::Duration) -> Self {
            self.options.wait(wait);
            self
        }

        $(#[$renew])*
        pub fn renew(mut self, every: std::time::Duration) -> Self {
            self.options.renew(every);
            self
        }

        replica_acks_setters!($writes, options.spec);

        $(#[$profile])*
        pub fn profile(mut self, name: impl Into<String>) -> Self {
            self.options.profile(name.into());
            self
        }

        $(#[$on_backend_error])*
        pub fn on_backend_error(mut self, policy: crate::policy::OnBackendError) -> Self {
            self.options.on_backend_error(policy);
            self
        }
    };
}

mod cached;
mod cluster_flight;
mod idempotent;
mod lock;
mod lock_options;
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
