// Guards: #[idempotent] needs a `Result` return type; the error points at the return type.
use coord_core::idempotent;

#[idempotent(key_from = "key")]
async fn charge(key: String) -> u64 {
    key.len() as u64
}

fn main() {}
