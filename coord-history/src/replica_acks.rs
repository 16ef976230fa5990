//! Operations of every kind that override the provider's `replica_acks` for their own granting
//! writes, each counting the runs of its body: what the replica-acknowledgement tests declare
//! on every provider, written once. On Redis a test cuts a replica off to see the override
//! bite; in process, where there is no replica, the ones that ask for one are refused.
//!
//! Every operation is keyed by its `u32` argument (each id of `key_from_each` for the multi-key
//! ones), adds one to `runs` when its body runs and answers from its key. The operation names
//! (`op.lock`, `op.charge`, `op.fl_on`, ...) are part of what tests may match stored keys by.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};

/// How many times the bodies sharing it ran.
pub type Runs = Arc<AtomicUsize>;

/// A body's run: counted, answering `answer`.
pub fn ran(runs: &AtomicUsize, answer: u32) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(answer)
}

/// A lock that waits for one replica (1 s); answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.lock", replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn lock_on(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A 2-permit semaphore that waits for one replica (1 s); answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.permit", permits = 2, replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn permit_on(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A read hold that waits for one replica (1 s); answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.read", mode = "read", replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn read_on(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A write hold that waits for one replica (1 s); answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.write", mode = "write", replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn write_on(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A multi-key lock that waits for one replica (1 s); answers how many keys it holds.
#[distributed_lock(key_from_each = "ids", coordinator = c, name = "op.many", replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn many_on(c: &Coordinator, ids: Vec<u32>, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, ids.len() as u32)
}

/// An idempotent call whose claim and completion wait for one replica (1 s); answers
/// `order * 10`.
#[idempotent(key_from = "order", coordinator = c, name = "op.charge", replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn charge_on(c: &Coordinator, order: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, order * 10)
}

/// A cluster flight whose claim, renewals and hand-over wait for one replica (1 s); answers its
/// id.
#[single_flight(key_from = "id", coordinator = c, name = "op.fl_on", scope = "cluster", replica_acks = 1, replica_acks_timeout = "1s")]
pub async fn flight_on(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A lock that never waits for replicas, whatever the provider's setting; answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.off", replica_acks = 0)]
pub async fn lock_off(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A 2-permit semaphore that never waits for replicas; answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.permit_off", permits = 2, replica_acks = 0)]
pub async fn permit_off(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A write hold that never waits for replicas; answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.write_off", mode = "write", replica_acks = 0)]
pub async fn write_off(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// A multi-key lock that never waits for replicas; answers how many keys it holds.
#[distributed_lock(key_from_each = "ids", coordinator = c, name = "op.many_off", replica_acks = 0)]
pub async fn many_off(c: &Coordinator, ids: Vec<u32>, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, ids.len() as u32)
}

/// An idempotent call that never waits for replicas; answers `order * 10`.
#[idempotent(key_from = "order", coordinator = c, name = "op.charge_off", replica_acks = 0)]
pub async fn charge_off(c: &Coordinator, order: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, order * 10)
}

/// A cluster flight that never waits for replicas; answers its id.
#[single_flight(key_from = "id", coordinator = c, name = "op.fl_off", scope = "cluster", replica_acks = 0)]
pub async fn flight_off(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// The control of the overrides: a lock with the provider's setting; answers its id.
#[distributed_lock(key_from = "id", coordinator = c, name = "op.plain")]
pub async fn lock_default(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}

/// The control of the overrides: an idempotent call with the provider's setting; answers
/// `order * 10`.
#[idempotent(key_from = "order", coordinator = c, name = "op.plain_charge")]
pub async fn charge_default(c: &Coordinator, order: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, order * 10)
}

/// The control of the overrides: a cluster flight with the provider's setting; answers its id.
#[single_flight(key_from = "id", coordinator = c, name = "op.fl_plain", scope = "cluster")]
pub async fn flight_default(c: &Coordinator, id: u32, runs: Runs) -> Result<u32, CoordError> {
    ran(&runs, id)
}
