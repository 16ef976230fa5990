// Guards: `on_store_error` and `on_missing_key` take one of their words (a near miss gets a
// suggestion), and both belong to `#[idempotent]` only.
use coord_core::{CoordError, distributed_lock, idempotent};

#[idempotent(key_from = "id", on_store_error = "return-ok", on_missing_key = "skip")]
async fn charge(id: Option<u64>) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

#[distributed_lock(key_from = "id", on_missing_key = "fail")]
async fn rebuild(id: Option<u64>) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
