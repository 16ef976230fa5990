// Guards: a renewal interval must be shorter than the lease it renews, or the lease lapses between
// renewals; the error points at the interval the user wrote.
use coord_core::{CoordError, distributed_lock};

#[distributed_lock(key_from = "id", lease = "10s", renew = "10s")]
async fn rebuild(id: u64) -> Result<(), CoordError> {
    let _ = id;
    Ok(())
}

fn main() {}
