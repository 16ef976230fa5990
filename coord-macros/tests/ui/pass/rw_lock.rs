// `mode = "read" | "write"`: a read-write lock on the key, alone or with the other lock
// options, stacked under other attributes, and the handle form.
use std::time::Duration;

use coord_core::{CoordError, Coordinator, RwMode, distributed_lock, fencing_token, idempotent};

#[distributed_lock(key_from = "book", name = "prices.book", mode = "read")]
async fn read_prices(book: u64) -> Result<u64, CoordError> {
    // Every hold, read or write, has its own token.
    Ok(book + fencing_token().map_or(0, |t| t.get()))
}

#[distributed_lock(key_from = "book", name = "prices.book", mode = write, lease = "1m", wait = "5s", renew = true, fenced = true)]
async fn write_prices(book: u64) -> Result<(), CoordError> {
    let _ = book;
    Ok(())
}

#[idempotent(key_from = "id")]
#[distributed_lock(key_from = "id", mode = "write", on_lost = "signal", renew = "10s", lease = "30s")]
async fn stacked(id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

async fn handle(coord: &Coordinator) -> Result<(), CoordError> {
    let key = coord.key("prices.book").part(&7u64).finish();
    let rw = coord.rw_lock(key).lease(Duration::from_secs(30));
    let read = rw.clone().read().await?;
    assert_eq!(read.mode(), RwMode::Read);
    let _token = read.fencing_token();
    read.release().await?;
    if let Some(write) = rw.clone().wait(Duration::from_secs(1)).try_write().await? {
        write.release().await?;
    }
    rw.run_read(|| async { Ok::<_, CoordError>(()) }).await?;
    Ok(())
}

fn main() {
    let coord = Coordinator::builder().memory().build().unwrap();
    let _ = (read_prices(1), write_prices(2), stacked(3), handle(&coord));
}
