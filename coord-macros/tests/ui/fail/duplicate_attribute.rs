// Guards: the same coord attribute twice on one function is reported at the second one.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id")]
#[distributed_lock(key_from = "id", lease = "1m")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
