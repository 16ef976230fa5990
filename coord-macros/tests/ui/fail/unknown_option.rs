// Guards: an unknown option is reported at its name, with a suggestion and the list of options
// the attribute takes; an option of another attribute says which one takes it.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", leese = "5m", retention = "1h")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
