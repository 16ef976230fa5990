//! One job that must not run twice at once, in as many processes as you start: the README's
//! first walk from nothing to two processes sharing a lock.
//!
//! ```sh
//! export COORD_REDIS_URL=redis://127.0.0.1:6379
//! cargo build -p coord-examples --features redis --example shared_lock
//! target/debug/examples/shared_lock & target/debug/examples/shared_lock &
//! coord --app shared_lock locks list        # the operation holding a lock: shared_lock::nightly
//! ```
//!
//! Each process builds its coordinator from the environment (`COORD_REDIS_URL`, nothing else),
//! takes the lock of job `t-7`, holds it for `SHARED_LOCK_HOLD_SECONDS` (default 10), and
//! exits. The second process waits for the first (`wait = "60s"`). No namespace is set, so
//! both use the binary's name, `shared_lock`, which `coord --app shared_lock` finds; the
//! function sets no `name`, so the operation is `shared_lock::nightly` (module path and
//! function), and the key is `shared_lock::nightly:t-7`.

use std::time::Duration;

use coord_core::{CoordError, distributed_lock, observe};

#[distributed_lock(key_from = "job", lease = "30s", renew = true, wait = "60s")]
async fn nightly(job: &str, hold: Duration) -> Result<(), CoordError> {
    println!("process {}: holding {job} for {hold:?}", std::process::id());
    tokio::time::sleep(hold).await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_target(false).init();
    coord_redis::coordinator_from_env().await?.install()?;
    let hold = std::env::var("SHARED_LOCK_HOLD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_secs);
    println!("process {}: asking for the lock", std::process::id());
    let (outcome, report) = observe(nightly("t-7", hold)).await;
    outcome?;
    println!(
        "process {}: done with {} ({:?})",
        std::process::id(),
        report.key().expect("the call's key"),
        report.lock().expect("the lock layer ran"),
    );
    Ok(())
}
