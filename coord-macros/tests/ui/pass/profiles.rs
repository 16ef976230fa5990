// `profile` on every attribute of a stack that has a lock or idempotency layer; the name
// is checked against the coordinator's configuration at run time.
use coord_core::{CoordError, Coordinator, cached, distributed_lock, idempotent, single_flight};

#[idempotent(key_from = "id", profile = "payments", retention = "1h")]
#[distributed_lock(profile = "payments", lease = "10s")]
async fn charge(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[single_flight(key_from = "id", profile = "bulk_jobs_2")]
#[distributed_lock(key_from = "id")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[cached(ttl = "5s", key_from = "id", coordinator = c, profile = "reads")]
#[distributed_lock(key_from = "id", coordinator = c)]
async fn read(c: &Coordinator, id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

fn main() {
    let _ = (charge(1), rebuild(2));
    let c = Coordinator::builder().memory().build().unwrap();
    let _ = read(&c, 3);
}
