// Guards: an option written without a value says how to write it and what it does; an
// unknown bare name is reported as unknown.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", lease, fenced, colour)]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
