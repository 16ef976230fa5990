// Guards: the attributes only go on `async fn`; the function itself is still emitted, so its
// callers see no further errors.
use coord_core::{CoordError, single_flight};

#[single_flight(key_from = "id")]
fn lookup(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

fn main() {
    let _ = lookup(1);
}
