// Guards: a body that does not parse yet (what an editor sends while someone types) gets the
// real parse error at its place, not "goes on an async fn with a body"; the attributes'
// own mistakes are reported with it, and the function is emitted as written.
use coord_core::{CoordError, distributed_lock, idempotent, single_flight};

#[distributed_lock(key_from = "id")]
#[single_flight]
async fn rebuild(id: u64) -> Result<u64, CoordError> {
    let doubled = id * 2
    Ok(doubled)
}

#[idempotent(key_from = "id", retention = "1 day")]
async fn charge(id: u64) -> Result<u64, CoordError> {
    let total = id +;
    Ok(total)
}

fn main() {}
