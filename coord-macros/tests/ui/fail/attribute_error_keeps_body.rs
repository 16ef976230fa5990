// Guards: an attribute error is reported alone. The function is still emitted as written, so
// the locals and items its body uses, and the callers of the function, resolve: no "cannot find
// value" or "cannot find function" follows the attribute's error.
use coord_core::{CoordError, distributed_lock, single_flight};

fn double(value: u64) -> u64 {
    value * 2
}

#[distributed_lock(key_from = "id", lease = "soon")]
#[single_flight(key_form = "id")]
async fn rebuild(id: u64) -> Result<u64, CoordError> {
    let doubled = double(id);
    let total = doubled + id;
    Ok(total)
}

fn main() {
    let _ = rebuild(1);
}
