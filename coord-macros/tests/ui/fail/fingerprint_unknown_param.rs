// Guards: `fingerprint` entries are checked against the parameters like `key_from`.
use coord_core::{CoordError, idempotent};

#[idempotent(key_from = "request_id", fingerprint = ["request_id", "amout"])]
async fn pay(request_id: String, amount: u64) -> Result<u64, CoordError> {
    let _ = request_id;
    Ok(amount)
}

fn main() {}
