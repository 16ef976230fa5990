// Guards: every mistake in one attribute is reported in one go, not only the first.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "nope", lease = "5 minutes", fenced = "yes", colour = "red")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
