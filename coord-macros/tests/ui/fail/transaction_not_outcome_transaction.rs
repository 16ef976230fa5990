// Guards: the transaction parameter's type must be one coord can write the outcome in (a
// provider's transaction wrapper); any other type is reported at the parameter's type.
use coord_core::{CoordError, idempotent};

pub struct DriverTransaction;

#[idempotent(key_from = "id", transaction = "tx")]
async fn charge(tx: &mut DriverTransaction, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

fn main() {}
