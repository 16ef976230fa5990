// Guards: a `Result` whose error type cannot be built from a `CoordError` is rejected at the
// return type.
use coord_core::distributed_lock;

#[derive(Debug)]
pub struct MyError;

#[distributed_lock(key_from = "id")]
async fn rebuild(id: u64) -> Result<(), MyError> {
    let _ = id;
    Ok(())
}

fn main() {}
