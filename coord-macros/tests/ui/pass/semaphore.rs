// `permits = n`: a semaphore on the key, alone or with the other lock options, stacked under
// other attributes, and the handle form.
use std::time::Duration;

use coord_core::{CoordError, Coordinator, distributed_lock, fencing_token, idempotent};

#[distributed_lock(key_from = "tenant", permits = 5)]
async fn export(tenant: u64) -> Result<u64, CoordError> {
    // Every permit has its own token.
    Ok(tenant + fencing_token().map_or(0, |t| t.get()))
}

#[distributed_lock(key_from = "tenant", permits = 1u32, lease = "1m", wait = "5s", renew = true, fenced = true)]
async fn one_at_a_time(tenant: u64) -> Result<(), CoordError> {
    let _ = tenant;
    Ok(())
}

#[idempotent(key_from = "id")]
#[distributed_lock(key_from = "id", permits = 3, on_lost = "signal", renew = "10s", lease = "30s")]
async fn stacked(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

async fn handle(coord: &Coordinator) -> Result<(), CoordError> {
    let key = coord.key("exports").part(&7u64).finish();
    let permit = coord
        .semaphore(key, 5)
        .lease(Duration::from_secs(30))
        .renew(Duration::from_secs(10))
        .acquire()
        .await?;
    let _token = permit.fencing_token();
    permit.release().await?;
    Ok(())
}

fn main() {
    let coord = Coordinator::builder().memory().build().unwrap();
    let _ = (export(1), one_at_a_time(2), stacked(3), handle(&coord));
}
