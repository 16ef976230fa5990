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

mod locks;
mod records;

pub use locks::{Attempt, Grant, LockTable, Waiter};
pub use records::{Claim, RecordStore};
