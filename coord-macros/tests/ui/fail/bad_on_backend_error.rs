// Guards: `on_backend_error` only takes "fail_closed" or "fail_open", with a suggestion.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", on_backend_error = "fail-open")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
