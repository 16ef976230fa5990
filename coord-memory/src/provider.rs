//! The in-process provider: the contract's traits over the lock table, the record store, the
//! cache map and the flight table. The engine answers in the contract's own types, so each
//! method calls it and returns its answer.
//!
//! This file holds the provider itself (its tables and its own inherent methods); each
//! contract trait's impl is a file of its own under `provider/`: `locks.rs` (`LockProvider`,
//! `MultiLockStore`), `semaphores.rs`, `rw_locks.rs`, `records.rs` (`IdempotencyStore`),
//! `cache.rs`, `flights.rs` and `operations.rs` (with the listing cursors).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use coord_contract::{CallKey, OwnerToken, ReleaseOutcome};

use crate::{Attempt, LockTable, RecordStore};

/// Coordination within this process: leases, fencing, FIFO hand-off and idempotency records
/// held in memory.
///
/// Exclusion and at-most-once hold among the tasks of this process only. Chosen with
/// `Coordinator::builder().memory()`, and used as the fallback when no coordinator is
/// installed. Never reports a backend fault: the one error it returns is a
/// [`BackendErrorKind::Config`](coord_contract::BackendErrorKind::Config) error for a listing cursor it did not make.
///
/// Every duration in a request is accepted, from zero to [`Duration::MAX`]: deadlines
/// saturate at about thirty years, so a lease, keep or retention of `Duration::MAX` lasts as
/// long as the process, and a wait of `Duration::MAX` waits until the lock is granted or the
/// `acquire` future is dropped. A zero lease or retention makes state that has already
/// expired.
///
/// A resent claim by the owner of the live marker answers [`ClaimOutcome::Claimed`](coord_contract::ClaimOutcome::Claimed) and
/// restarts the marker's lease from that claim.
#[derive(Debug, Default)]
pub struct MemoryProvider {
    locks: LockTable,
    records: RecordStore,
    /// The shared tier of `#[cached]`: bytes and their expiry (tokio's clock, like the rest).
    cache: DashMap<CallKey, (Arc<[u8]>, Instant)>,
    /// Sets since the last sweep of expired cache entries.
    cache_sets: AtomicU64,
    /// Cluster-scope single-flight claims and hand-overs.
    pub(crate) flights: crate::flights::FlightTable,
    /// Semaphores (`permits`).
    semaphores: crate::SemaphoreTable,
    /// Read-write locks (`mode`).
    rw_locks: crate::RwLockTable,
}

mod cache;
mod flights;
mod locks;
mod operations;
mod records;
mod rw_locks;
mod semaphores;
#[cfg(test)]
mod tests;

impl MemoryProvider {
    /// An empty provider.
    pub fn new() -> MemoryProvider {
        MemoryProvider::default()
    }

    /// One attempt to take the lock of `key` for `owner`, made at `now` (see
    /// [`LockTable::attempt_shared_at`]): what [`LockProvider::acquire`](coord_contract::LockProvider::acquire) does, without its
    /// boxed future and its own clock read, for a caller that holds this provider as itself
    /// and read tokio's clock just before. A [`Attempt::Queued`] caller waits with
    /// [`Waiter::wait`](crate::Waiter::wait); a grant is timed from `now` (`lease_began`).
    pub fn attempt_lock_at<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
        wait: Duration,
        fenced: bool,
        now: Instant,
    ) -> Attempt<'a> {
        self.locks
            .attempt_shared_at(key.shared(), owner, lease, wait, fenced, now)
    }

    /// Frees the lock of `key` if `owner` holds it, at `now` (see [`LockTable::release_at`]):
    /// what [`LockProvider::release`](coord_contract::LockProvider::release) answers, without its boxed future and its own clock read.
    pub fn release_lock_at(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        now: Instant,
    ) -> ReleaseOutcome {
        self.locks.release_at(key.qualified(), owner, now)
    }

    /// How many lock keys are held or waited for (zero once all locks are released).
    pub fn lock_keys(&self) -> usize {
        self.locks.len()
    }

    /// How many semaphore keys have permits or waiters (zero once every permit is released
    /// or expired and nobody waits).
    pub fn semaphore_keys(&self) -> usize {
        self.semaphores.len()
    }

    /// How many live permits of `key` are held now.
    pub fn permits_held(&self, key: &CallKey) -> usize {
        self.semaphores.held(key.qualified())
    }

    /// How many read-write lock keys have holds, a waiting writer's claim, or waiters (zero
    /// once every hold is released or expired and nobody waits).
    pub fn rw_lock_keys(&self) -> usize {
        self.rw_locks.len()
    }

    /// The live read holds of the read-write lock `key`, and whether a live write hold exists.
    pub fn rw_holds(&self, key: &CallKey) -> (usize, bool) {
        self.rw_locks.held(key.qualified())
    }

    /// How many shared cache entries are kept, expired ones not yet swept included.
    pub fn cache_entries(&self) -> usize {
        self.cache.len()
    }

    /// How many idempotency records are stored.
    pub fn records(&self) -> u64 {
        self.records.len()
    }

    /// How many single-flight claims and hand-overs are kept (`scope = "cluster"`), expired
    /// ones not yet swept included.
    pub fn flight_entries(&self) -> usize {
        self.flights.len()
    }
}
