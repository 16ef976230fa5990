// Guards: `transaction` names one parameter of the function, checked like `key_from` (a
// misnamed one is reported with the parameters there are), and that parameter must be a
// `&mut` reference bound by name: the body uses it, then coord writes the outcome in it.
use coord_core::provider::{BackendError, BoxFuture, CompleteRequest, OutcomeTransaction, TransactionalCompletion};
use coord_core::{CoordError, idempotent};

pub struct Tx;

impl OutcomeTransaction for Tx {
    fn complete_in_transaction<'a>(
        &'a mut self,
        _: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>> {
        Box::pin(async { Ok(TransactionalCompletion::Written) })
    }

    fn set_rollback_only<'a>(&'a mut self, _: &'a str) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }
}

#[idempotent(key_from = "id", transaction = "txn")]
async fn misnamed(tx: &mut Tx, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = "tx")]
async fn shared(tx: &Tx, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = tx)]
async fn by_value(tx: Tx, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = "ctx.tx")]
async fn a_field(ctx: (u8, u8), id: u64) -> Result<u64, CoordError> {
    let _ = ctx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = ["tx", "id"])]
async fn a_list(tx: &mut Tx, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

pub struct Ledger;

impl Ledger {
    #[idempotent(key_from = "id", transaction = "self")]
    pub async fn the_receiver(&mut self, id: u64) -> Result<u64, CoordError> {
        Ok(id)
    }
}

fn main() {}
