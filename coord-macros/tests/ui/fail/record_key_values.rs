// Guards: `record_key` takes `true` or `false`, and the layers of one function agree on it
// (the span is one per call).
use coord_core::{CoordError, distributed_lock, single_flight};

#[distributed_lock(key_from = "id", record_key = "yes")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[single_flight(key_from = "id", record_key = true)]
#[distributed_lock(record_key = false)]
async fn refresh(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
