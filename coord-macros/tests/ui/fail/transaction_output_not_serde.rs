// Guards: with `transaction`, the return type is checked at the return type, once, as without
// it: the stored `T` must be serde-serializable, the error must convert from `CoordError`.
use coord_core::provider::OutcomeTransaction;
use coord_core::{CoordError, idempotent};

pub struct Receipt;

#[idempotent(key_from = "id", transaction = "tx")]
async fn charge(tx: &mut dyn OutcomeTransaction, id: u64) -> Result<Receipt, CoordError> {
    let _ = (tx, id);
    Ok(Receipt)
}

#[idempotent(key_from = "id", transaction = "tx")]
async fn refund(tx: &mut dyn OutcomeTransaction, id: u64) -> Result<u64, String> {
    let _ = tx;
    Ok(id)
}

fn main() {}
