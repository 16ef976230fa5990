// Guards: `replica_acks = n` of 1 or more needs `replica_acks_timeout`; the timeout goes only
// with a count of 1 or more (not alone, not with `0`) and is longer than zero; the count is a
// whole number that fits a `u32`. Checked alike on `#[idempotent]`, `#[distributed_lock]` and
// `#[single_flight(scope = "cluster")]`. On a process flight (the default scope) either option
// is refused: it writes nothing a replica could hold; stacked with a lock or an idempotency
// layer, the error says where the option goes.
use coord_core::{CoordError, cached, distributed_lock, idempotent, single_flight};

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

#[single_flight(key_from = "id", scope = "process", replica_acks_timeout = "1s")]
async fn timeout_on_process_flight(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[single_flight(key_from = "id", replica_acks = 1, replica_acks_timeout = "1s")]
#[distributed_lock(key_from = "id")]
async fn meant_for_the_lock(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[single_flight(key_from = "id", scope = "cluster", replica_acks = 1)]
async fn cluster_flight_no_timeout(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[single_flight(key_from = "id", scope = "cluster", replica_acks = 0, replica_acks_timeout = "1s")]
async fn cluster_flight_timeout_with_zero(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[cached(key_from = "id", ttl = "1s", replica_acks = 1)]
async fn not_on_cached(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

fn main() {}
