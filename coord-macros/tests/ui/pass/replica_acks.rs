// `replica_acks`: per operation on `#[idempotent]` and every form of `#[distributed_lock]`
// (a lock, `permits`, `mode`, `key_from_each`) and on `#[single_flight(scope = "cluster")]`,
// `0` alone to turn waiting off, stacked, and the handle setters.
use std::time::Duration;

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, single_flight};

#[idempotent(key_from = "order", replica_acks = 1, replica_acks_timeout = "500ms")]
#[distributed_lock(key_from = "order", replica_acks = 0)]
async fn charge(order: u64) -> Result<u64, CoordError> {
    Ok(order)
}

#[distributed_lock(key_from = "id", permits = 5, replica_acks = "2", replica_acks_timeout = "1s")]
async fn export(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[distributed_lock(key_from = "id", mode = "write", renew = true, replica_acks = 1, replica_acks_timeout = "250ms")]
async fn reprice(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[distributed_lock(key_from_each = "ids", replica_acks = 0)]
async fn transfer(ids: Vec<u64>) -> Result<usize, CoordError> {
    Ok(ids.len())
}

#[single_flight(key_from = "id", scope = "cluster", lease = "5s", replica_acks = 1, replica_acks_timeout = "500ms")]
async fn refresh(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

// The flight's option is the flight's, the lock's the lock's.
#[single_flight(key_from = "id", scope = "cluster", replica_acks = 0)]
#[distributed_lock(key_from = "id", replica_acks = 2, replica_acks_timeout = "1s")]
async fn rebuild(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

async fn handles(coord: &Coordinator) -> Result<(), CoordError> {
    let key = |id: u64| coord.key("jobs").part(&id).finish();
    let wait = Duration::from_millis(500);
    let guard = coord.lock(key(1)).replica_acks(1, wait).acquire().await?;
    guard.release().await?;
    let permit = coord.semaphore(key(2), 3).without_replica_acks().acquire().await?;
    permit.release().await?;
    coord
        .rw_lock(key(3))
        .replica_acks(1, wait)
        .run_read(|| async { Ok::<_, CoordError>(()) })
        .await?;
    let _all = coord
        .multi_lock([key(4), key(5)])
        .without_replica_acks()
        .acquire()
        .await?;
    coord
        .idempotent(key(6))
        .replica_acks(2, wait)
        .run(|| async { Ok::<_, CoordError>(1u8) })
        .await?;
    coord
        .single_flight(key(7))
        .cluster()
        .replica_acks(1, wait)
        .run(|| async { Ok::<_, CoordError>(1u8) })
        .await?;
    coord
        .single_flight(key(8))
        .cluster()
        .without_replica_acks()
        .run(|| async { Ok::<_, CoordError>(1u8) })
        .await?;
    Ok(())
}

fn main() {
    let coord = Coordinator::builder().memory().build().unwrap();
    let _ = (charge(1), export(2), reprice(3), transfer(vec![4]), handles(&coord));
    let _ = (refresh(5), rebuild(6));
}
