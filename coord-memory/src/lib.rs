//! coord's in-process provider: lease locks, idempotency records, the shared cache tier and
//! cluster-scope single-flight, held in this process's memory.
//!
//! [`MemoryProvider`] implements every trait of coord's provider contract (the `coord-contract`
//! crate): [`LockProvider`], [`IdempotencyStore`], [`CacheStore`], [`FlightStore`] and
//! [`Operations`]. Applications reach it through `coord-core` (`Coordinator::builder().memory()`,
//! the fallback when no coordinator is installed, and `coord_core::memory::MemoryProvider`).
//!
//! The engine underneath speaks the contract's own types ([`OwnerToken`] owners,
//! [`Fingerprint`]s, [`FencingToken`]s, [`LockGrant`], [`RenewOutcome`], [`ClaimOutcome`],
//! [`CompleteOutcome`], ...), so the provider's trait methods call it and return its answers as
//! they are:
//!
//! * [`LockTable`]: leases keyed on the exact key (no striping: two keys never share a lock),
//!   fencing tokens, waiters woken one at a time by direct hand-off on release.
//! * [`SemaphoreTable`]: counting semaphores whose permits are leases with fencing tokens,
//!   waiters woken on release.
//! * [`RwLockTable`]: read-write locks whose read and write holds are leases with fencing
//!   tokens from one counter, writer preference by a waiting writer's short claim.
//! * [`RecordStore`]: in-flight markers and completed outcomes keyed on the exact key, each
//!   with its own expiry.
//!
//! # What it promises
//!
//! * **State for one process only.** Exclusion, at-most-once and single-flight hold among the
//!   tasks of this process that share one provider, never across processes: use a networked
//!   provider (coord-redis) for that.
//! * **Never a backend error.** Every operation is a short critical section on one key and
//!   cannot fail; the one error it reports is a [`BackendErrorKind::Config`] for a listing
//!   cursor it did not make. Clean-ups the contract lets run in the background (a detached
//!   release or abandon) are done at once, inline.
//! * **Exact expiry.** Leases, keep periods, retentions and cache TTLs are measured on tokio's
//!   clock at every read (so tests can pause and advance it): nothing expired is ever served,
//!   even before the memory is reclaimed.
//! * **Bounded memory.** A lock entry lives only while its key is held or waited for; records
//!   leave by expiry, completion, abandonment or purge (never by eviction, which would break
//!   at-most-once); lapsed records, expired cache entries and flights are swept as new ones
//!   are written.
//!
//! # Durations
//!
//! Every `Duration` this crate accepts (leases, waits, keep and retention periods, timeouts)
//! may be anything from zero to [`Duration::MAX`]; none makes an operation panic or hang.
//! Deadlines are computed with [`deadline_after`], which saturates: a duration longer than
//! [`FAR_FUTURE`] (about thirty years) means "for as long as this process can run". A lease or
//! retention of zero produces state that has already expired; a wait of zero is one attempt.
//! No arithmetic that could overflow runs while a map shard or a cache entry is locked.
//!
//! [`Duration::MAX`]: std::time::Duration::MAX
//! [`deadline_after`]: coord_contract::time::deadline_after
//! [`FAR_FUTURE`]: coord_contract::time::FAR_FUTURE
//! [`LockProvider`]: coord_contract::LockProvider
//! [`IdempotencyStore`]: coord_contract::IdempotencyStore
//! [`CacheStore`]: coord_contract::CacheStore
//! [`FlightStore`]: coord_contract::FlightStore
//! [`Operations`]: coord_contract::Operations
//! [`SemaphoreStore`]: coord_contract::SemaphoreStore
//! [`RwLockStore`]: coord_contract::RwLockStore
//! [`OwnerToken`]: coord_contract::OwnerToken
//! [`Fingerprint`]: coord_contract::Fingerprint
//! [`FencingToken`]: coord_contract::FencingToken
//! [`LockGrant`]: coord_contract::LockGrant
//! [`RenewOutcome`]: coord_contract::RenewOutcome
//! [`ClaimOutcome`]: coord_contract::ClaimOutcome
//! [`CompleteOutcome`]: coord_contract::CompleteOutcome
//! [`BackendErrorKind::Config`]: coord_contract::BackendErrorKind::Config

mod counted_leases;
mod fence;
mod flights;
mod locks;
mod multi_locks;
mod provider;
mod records;
mod rw_locks;
mod semaphores;

pub(crate) use coord_contract::time::deadline_after;

pub use locks::{Attempt, LockTable, LockView, Waiter};
pub use provider::MemoryProvider;
pub use records::{RecordStore, RecordView};
pub use rw_locks::{RwLockTable, RwView};
pub use semaphores::SemaphoreTable;
