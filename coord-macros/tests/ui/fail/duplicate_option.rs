// Guards: an option given twice in one attribute is reported at the second one.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", lease = "5m", lease = "10m")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
