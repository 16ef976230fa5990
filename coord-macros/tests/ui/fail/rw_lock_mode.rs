// Guards: `mode` is `"read"` or `"write"`; it takes a read-write lock, so it cannot go with
// `permits` (a semaphore) nor with `fenced = false` (every hold is fenced).
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", mode = "upgrade")]
async fn unknown_word(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", mode = true)]
async fn not_a_word(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", mode = "read", permits = 3)]
async fn with_permits(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", mode = "write", fenced = false)]
async fn unfenced(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
