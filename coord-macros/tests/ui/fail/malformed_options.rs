// Guards: options that are not `name = value` pairs are reported at the offending token, and a
// sibling attribute written as `#[attr = ..]` is told to use parentheses.
use coord_core::{CoordError, distributed_lock, single_flight};

#[distributed_lock(key_from = "id",, lease = "5s")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id")]
#[single_flight = "id"]
async fn refresh(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
