// Guards: `permits` is a whole number of at least 1 written as a number; zero, strings,
// fractions, negatives and numbers past `u32::MAX` are refused at the value, and a permit is
// always fenced, so `fenced = false` beside it is refused too.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", permits = 0)]
async fn zero(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", permits = "5")]
async fn quoted(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", permits = 2.5)]
async fn fraction(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", permits = -1)]
async fn negative(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", permits = 4294967296)]
async fn too_many(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", permits = 3, fenced = false)]
async fn unfenced(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
