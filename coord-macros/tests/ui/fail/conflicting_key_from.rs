// Guards: stacked layers share one key, so a second, different `key_from` is an error at the
// second one.
use coord_core::{CoordError, distributed_lock, idempotent};

#[idempotent(key_from = "request_id")]
#[distributed_lock(key_from = "account_id")]
async fn transfer(request_id: String, account_id: u64) -> Result<(), CoordError> {
    let _ = (request_id, account_id);
    Ok(())
}

fn main() {}
