//! # coord-contract
//!
//! The contract between coord's runtime and a coordination backend: the small traits every
//! provider implements (the in-process one, Redis, PostgreSQL, yours), the request and
//! outcome types they speak, the call key, owner and fencing tokens, fingerprints and the
//! error a backend reports.
//!
//! It depends on nothing else of coord, so a provider crate, coord's runtime and coord's
//! in-process engine all stand on it; nothing here calls upward. Applications do not use this
//! crate directly: `coord-core` re-exports it as `coord_core::provider`.
//!
//! | trait | what a provider keeps | used by |
//! |---|---|---|
//! | [`LockProvider`] | leases with an owner, fencing counters, waiters | `#[distributed_lock]`, lock handles |
//! | [`IdempotencyStore`] | in-flight markers and completed outcomes | `#[idempotent]`, the HTTP layer |
//! | [`CacheStore`] | byte values with a time to live | `#[cached(scope = "shared" \| "two_tier")]` |
//! | [`FlightStore`] | leased flight claims and short hand-overs | `#[single_flight(scope = "cluster")]` |
//! | [`Operations`] | nothing new: reads and forced releases of the state above | `Coordinator::operator`, the `coord` CLI |
//! | [`SemaphoreStore`] (optional: [`Capability::Semaphores`]) | leased permits with fencing counters, waiters | `#[distributed_lock(permits = n)]`, semaphore handles |
//! | [`RwLockStore`] (optional: [`Capability::ReadWriteLocks`]) | leased read and write holds with one fencing counter per key, waiting writers' claims | `#[distributed_lock(mode = "read" \| "write")]`, read-write lock handles |
//! | [`MultiLockStore`] (optional: [`Capability::MultiKeyLocks`]) | nothing new: the plain locks, several taken in one atomic step | `#[distributed_lock(key_from_each = ..)]`, multi-lock handles |
//! | [`OutcomeTransaction`] | nothing: the application's open transaction, able to write a completed record in it | `#[idempotent(transaction = "tx")]`, `Idempotent::claim_in_transaction` |
//!
//! Every method has a default only where a provider may reasonably lack the capability
//! (cache, flights, semaphores, read-write locks, operations, marker renewal, purge); the
//! default then answers a [`BackendErrorKind::Config`] error saying so, never a silent
//! success.
//!
//! ## Keys
//! Keys reach a provider as [`CallKey`] values, already escaped so that they contain no `{`,
//! `}` or control bytes: a provider takes [`CallKey::namespace`] and [`CallKey::op_key`] (or the
//! whole [`CallKey::qualified`] text) as they are, and never needs to split text. Two keys are
//! the same call exactly when they are equal.
//!
//! ## Time
//! Every method is bounded in time: a provider that talks to a server applies its command
//! timeout and reports a [`BackendError`] instead of hanging. Expiry is measured by the
//! backend's clock (for Redis and PostgreSQL, the server's), never by comparing client
//! timestamps. Deadlines are computed with [`time::deadline_after`], which saturates.
//!
//! ## Conformance
//! The `coord-conformance` crate pins the behaviour every provider must share; run it against
//! a new provider (`coord_conformance::conformance_suite!(fresh_coordinator);` in its tests)
//! before trusting it.

use std::future::Future;
use std::pin::Pin;

pub mod background;
mod cache;
mod call_key;
mod error;
mod flights;
mod key_builder;
mod locks;
mod multi_locks;
mod operations;
mod records;
pub mod replicas;
mod rw_locks;
mod semaphores;
pub mod time;
mod tokens;
mod transactions;
pub mod waiting;

pub use cache::{CacheEntry, CacheStore};
pub use call_key::{CallKey, CallKeyBuilder, InvalidCallKey, KeyPrefix};
pub use error::{BackendError, BackendErrorKind, ReplicaShortfall};
pub use flights::{FlightClaim, FlightStore, FlightWait, SentNotice, SentWait};
pub use key_builder::{KeyPart, KeyWriter};
pub use locks::{
    FORCED_RELEASE_MEMORY, LockGrant, LockProvider, LockRequest, LossCause, ReleaseOutcome,
    RenewOutcome,
};
pub use multi_locks::{MultiLockGrant, MultiLockRequest, MultiLockStore};
pub use operations::{
    Cursor, ForcedRelease, HoldInfo, ListRequest, LockHolder, LockInfo, MAX_PAGE,
    NamespaceListRequest, Operations, Page, RecordInfo, RecordStatus, RwLockInfo, SemaphoreInfo,
    Waiters, WriterClaim,
};
pub use records::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, Fingerprint, IdempotencyStore,
};
pub use replicas::ReplicaAcks;
pub use rw_locks::{RwGrant, RwLockRequest, RwLockStore, RwMode, default_claim};
pub use semaphores::{Capability, PermitGrant, PermitRequest, SemaphoreStore};
pub use time::Deadline;
pub use tokens::{FencingToken, OwnerToken};
pub use transactions::{OutcomeTransaction, TransactionalCompletion};

/// A provider that serves every layer that needs shared state, and the operations API: what a
/// coordinator is built from. Implemented automatically for any type that implements the five
/// traits. [`CacheStore`], [`FlightStore`], [`SemaphoreStore`], [`RwLockStore`] and
/// [`Operations`] have defaults for every method (reporting the capability unsupported), so a
/// provider without a shared cache, cluster flights, semaphores, read-write locks or operator
/// support opts out with `impl CacheStore for MyProvider {}` (and likewise).
pub trait Provider:
    LockProvider
    + IdempotencyStore
    + CacheStore
    + Operations
    + FlightStore
    + SemaphoreStore
    + RwLockStore
    + MultiLockStore
{
}

impl<P> Provider for P where
    P: LockProvider
        + IdempotencyStore
        + CacheStore
        + Operations
        + FlightStore
        + SemaphoreStore
        + RwLockStore
        + MultiLockStore
{
}

/// A boxed, `Send` future, the return type of provider methods (they are called through `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
