// Guards: `replica_acks = n` of 1 or more needs `replica_acks_timeout`; the timeout goes only
// with a count of 1 or more (not alone, not with `0`) and is longer than zero; the count is a
// whole number that fits a `u32`. Checked alike on `#[idempotent]` and `#[distributed_lock]`.
use coord_core::{CoordError, distributed_lock, idempotent, single_flight};

#[distributed_lock(key_from = "id", replica_acks = 1)]
async fn no_timeout(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[idempotent(key_from = "id", replica_acks = 2)]
async fn no_timeout_idempotent(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", replica_acks_timeout = "500ms")]
async fn timeout_alone(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[idempotent(key_from = "id", replica_acks = 0, replica_acks_timeout = "500ms")]
async fn timeout_with_zero(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", permits = 3, replica_acks = 1, replica_acks_timeout = "0s")]
async fn zero_timeout(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", mode = "read", replica_acks = 4294967296, replica_acks_timeout = "1s")]
async fn too_many(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from_each = "ids", replica_acks = "one", replica_acks_timeout = "1s")]
async fn not_a_number(ids: Vec<u64>) -> Result<(), CoordError> {
    let _ = ids;
    Ok(())
}

#[single_flight(key_from = "id", replica_acks = 1)]
async fn not_on_single_flight(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
