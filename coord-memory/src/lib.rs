//! In-process lease locks and idempotency records.
//!
//! This crate is the engine behind coord's in-process provider (`coord_core::MemoryProvider`,
//! chosen with `Coordinator::builder().memory()`). It holds state for one process only; it
//! knows nothing of coord's keys or errors, and never fails: every operation is a short
//! critical section on one key.
//!
//! * [`LockTable`]: leases keyed on the exact key (no striping: two keys never share a lock),
//!   fencing tokens, waiters woken one at a time by direct hand-off on release.
//! * [`RecordStore`]: in-flight markers and completed outcomes in a moka cache with per-entry
//!   expiry.
//!
//! # Durations
//!
//! Every `Duration` this crate accepts (leases, waits, keep and retention periods, timeouts)
//! may be anything from zero to [`Duration::MAX`]; none makes an operation panic or hang.
//! Deadlines are computed with [`deadline_after`], which saturates: a duration longer than
//! [`FAR_FUTURE`] (about a century) means "for as long as this process can run". A lease or
//! retention of zero produces state that has already expired; a wait of zero is one attempt.
//! No arithmetic that could overflow runs while a map shard or a cache entry is locked.

mod flights;
mod locks;
mod provider;
mod records;

pub(crate) use coord_contract::time::{FAR_FUTURE, deadline_after};

pub use locks::{Attempt, Grant, LockTable, LockView, Waiter};
pub use provider::MemoryProvider;
pub use records::{Claim, Completion, RecordStatus, RecordStore, RecordView};

/// What renewing a lease (of a lock, or of an in-flight marker) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Renewal {
    /// The caller's lease now ends `lease` from the moment of renewal.
    Renewed,
    /// The caller no longer holds the key: another owner's live state is there now (a live
    /// lock or marker, a marker kept as abandoned, or a completed record).
    TakenByOther,
    /// The caller no longer holds the key and nobody else does either: it is free, its state
    /// was removed, the caller's own lease lapsed, or (for records) the caller's marker was
    /// already completed.
    Expired,
}
