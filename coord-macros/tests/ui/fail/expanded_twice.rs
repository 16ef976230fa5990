// Guards: a coord attribute under another name is not taken in by the first one; when it
// expands on the already expanded function, it says so instead of nesting a second stack.
use coord_core::idempotent as once;
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id")]
#[once(key_from = "id")]
async fn rebuild(id: String) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
