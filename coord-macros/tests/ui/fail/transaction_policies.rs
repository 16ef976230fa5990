// Guards: with `transaction`, the options that decide what becomes of an unstored outcome
// cannot contradict it (a transactional run never leaves an unknown outcome, and an outcome
// that could not be written leaves the transaction unable to commit), every mistake of the
// attribute is reported at once, and `transaction` belongs to #[idempotent] only.
use coord_core::{CoordError, distributed_lock, idempotent};

pub struct Tx;

#[idempotent(
    key_from = "id",
    transaction = "txn",
    on_abandoned = "fail",
    on_store_error = "return_ok"
)]
async fn charge(tx: &mut Tx, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[distributed_lock(key_from = "id", transaction = "tx")]
async fn rebuild(tx: &mut Tx, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
