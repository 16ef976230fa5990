// Guards: `crate = ".."` points the generated code at a renamed dependency.
extern crate coord_core as renamed;

use renamed::{CoordError, distributed_lock, single_flight};

#[distributed_lock(key_from = "id", crate = "renamed")]
pub async fn locked(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[single_flight(crate = "::renamed")]
pub async fn shared() -> u64 {
    1
}

fn main() {}
