// Guards: a duration that is not `<number><unit>` is rejected at the literal, with the
// accepted forms.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", lease = "5 minutes")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
