//! Replica acknowledgement chosen per operation: how many replicas must hold a granting write
//! before it counts, for the calls of one operation rather than for the whole provider.
//!
//! A provider that replicates asynchronously (Redis) may wait after each write that grants
//! something (a lock, a permit, a read-write hold, an idempotency claim, a completion, a
//! renewal, a cluster flight's claim) until some replicas have it. The provider's own setting
//! (for Redis, `RedisProviderBuilder::replica_acks`) applies to every call; an operation may
//! override it with a [`ReplicaAcks`] value, which the runtime puts in scope around every
//! granting request of that operation's call ([`scoped`]), its renewals included. A provider
//! reads it with [`in_scope`] while it serves the request.
//!
//! Why a scope rather than a field of each request: renewals and completions are sent by the
//! runtime's own tasks long after the request that took the hold, through methods whose
//! arguments are fixed by the contract; the scope reaches them all without changing any
//! method's signature, and a provider that does not replicate never reads it.
//!
//! A provider that honours the scope says so with
//! [`LockProvider::supports_replica_acks`](crate::LockProvider::supports_replica_acks)
//! ([`Capability::ReplicaAcks`](crate::Capability::ReplicaAcks)); the runtime refuses an
//! override that asks for replicas from any other provider, before anything is written, rather
//! than let it pass unhonoured. [`ReplicaAcks::Off`] is accepted everywhere: not waiting is
//! what a provider without replication does anyway.

use std::future::Future;
use std::time::Duration;

use crate::BoxFuture;

/// Replica acknowledgement for the granting writes of one operation, overriding the
/// provider's own setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaAcks {
    /// Do not wait for replicas, even when the provider waits by default: a write counts once
    /// the primary has it.
    Off,
    /// Wait until `replicas` replicas hold each granting write, for at most `timeout`; fewer
    /// acknowledgements make the write count as failed
    /// ([`BackendErrorKind::NotReplicated`](crate::BackendErrorKind::NotReplicated)).
    Wait {
        /// How many replicas must acknowledge; at least 1 (see [`ReplicaAcks::wait`]).
        replicas: u32,
        /// How long to wait for them; above zero, and below the provider's command timeout
        /// (a provider refuses a longer one with a `Config` error).
        timeout: Duration,
    },
}

impl ReplicaAcks {
    /// Wait for `replicas` replicas within `timeout`; zero replicas is [`ReplicaAcks::Off`].
    pub fn wait(replicas: u32, timeout: Duration) -> ReplicaAcks {
        if replicas == 0 {
            ReplicaAcks::Off
        } else {
            ReplicaAcks::Wait { replicas, timeout }
        }
    }

    /// True when this asks a provider to wait for at least one replica.
    pub fn waits(self) -> bool {
        matches!(self, ReplicaAcks::Wait { .. })
    }
}

tokio::task_local! {
    static OVERRIDE: ReplicaAcks;
}

/// `fut`, polled with `acks` in scope (see [`in_scope`]); `fut` itself when `acks` is `None`,
/// so an operation without an override pays nothing.
pub fn scoped<'a, T: 'a>(acks: Option<ReplicaAcks>, fut: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
    match acks {
        None => fut,
        Some(acks) => Box::pin(OVERRIDE.scope(acks, fut)),
    }
}

/// `fut`, polled with `acks` in scope, for a future that is not boxed: the same as
/// [`scoped`] with `Some(acks)`.
pub fn scope<F: Future>(acks: ReplicaAcks, fut: F) -> impl Future<Output = F::Output> {
    OVERRIDE.scope(acks, fut)
}

/// The override of the operation whose request is being served, if it set one: a provider
/// reads it while polling a granting request, and applies its own setting when it is `None`.
/// Only valid while the request's future is polled (not in tasks it spawns).
pub fn in_scope() -> Option<ReplicaAcks> {
    OVERRIDE.try_with(|acks| *acks).ok()
}
