// Guards: `transaction = "tx"` on the shapes a transaction parameter comes in (a concrete
// wrapper, a generic, `impl Trait`, a trait object, a `mut` binding, a method), used in the
// body as written and stacked with the other layers.
use coord_core::provider::{
    BackendError, BoxFuture, CompleteRequest, OutcomeTransaction, TransactionalCompletion,
};
use coord_core::{CoordError, Coordinator, cached, distributed_lock, idempotent, single_flight};

pub struct Tx<'c> {
    pub rows: Vec<&'c str>,
}

impl OutcomeTransaction for Tx<'_> {
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

#[idempotent(key_from = "id", transaction = "tx")]
pub async fn concrete(tx: &mut Tx<'_>, id: u64) -> Result<u64, CoordError> {
    tx.rows.push("concrete");
    Ok(id)
}

#[idempotent(key_from = "id", transaction = tx, fingerprint = "id")]
pub async fn generic<T: OutcomeTransaction>(tx: &mut T, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = "tx")]
pub async fn apit(tx: &mut impl OutcomeTransaction, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = "tx")]
pub async fn object(tx: &mut dyn OutcomeTransaction, id: u64) -> Result<u64, CoordError> {
    let _ = tx;
    Ok(id)
}

#[idempotent(key_from = "id", transaction = "tx")]
pub async fn rebound<'c>(mut tx: &mut Tx<'c>, other: &'c mut Tx<'c>, id: u64) -> Result<u64, CoordError> {
    tx.rows.push("first");
    tx = other;
    tx.rows.push("second");
    Ok(id)
}

/// The body does not use the transaction at all: no warning either.
#[idempotent(key_from = "id", transaction = "tx")]
pub async fn unused(tx: &mut Tx<'_>, id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[idempotent(key_from = "id", transaction = "tx", renew = "5s", wait = "1s")]
#[cached(ttl = "1m")]
#[single_flight]
#[distributed_lock(lease = "10s")]
pub async fn stacked(tx: &mut Tx<'_>, id: u64) -> Result<u64, CoordError> {
    tx.rows.push("stacked");
    Ok(id)
}

pub struct Service {
    pub coordinator: Coordinator,
}

impl Service {
    #[idempotent(key_from = "id", coordinator = self.coordinator, transaction = "tx")]
    pub async fn method(&self, id: u64, tx: &mut Tx<'_>) -> Result<u64, CoordError> {
        tx.rows.push("method");
        Ok(id)
    }
}

fn is_send<T: Send>(_: T) {}

fn main() {
    let mut tx = Tx { rows: Vec::new() };
    is_send(concrete(&mut tx, 1));
    is_send(generic(&mut tx, 1));
    is_send(object(&mut tx, 1));
}
