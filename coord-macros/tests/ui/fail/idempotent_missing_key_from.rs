// Guards: #[idempotent] without `key_from` is rejected at the attribute, since nothing would
// tell one request from another.
use coord_core::{CoordError, idempotent};

#[idempotent(retention = "1h")]
async fn charge(idempotency_key: String) -> Result<u64, CoordError> {
    let _ = idempotency_key;
    Ok(1)
}

fn main() {}
