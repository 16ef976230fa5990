// Guards: the return type is checked by trait, so aliases of `Result` work.
use coord_core::{CoordError, distributed_lock, idempotent};

pub type CoordResult<T> = Result<T, CoordError>;
pub type Outcome = std::result::Result<u64, CoordError>;

#[distributed_lock(key_from = "id")]
pub async fn lock_alias(id: u64) -> CoordResult<u64> {
    Ok(id)
}

#[idempotent(key_from = "id")]
pub async fn idempotent_alias(id: u64) -> Outcome {
    Ok(id)
}

fn main() {}
