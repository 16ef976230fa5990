//! A semaphore permit pair beside a lock pair on the same `PostgresProvider`, measured in the
//! same process against one private PostgreSQL server on loopback, interleaved round by round.
//!
//! Run: `cargo bench -p coord-postgres --bench pg_semaphores` (about 15 s).
//!
//! | row | measured | baseline |
//! |---|---|---|
//! | permit pair | `SemaphoreStore::acquire_permit` (no wait, 3 permits) + `release_permit` | `LockProvider::acquire` (no wait, fenced) + `release` |
//!
//! Each task works on a key of its own, with 1 task and with 8; the pool has 8 connections.
//! The ratio is permit time / lock time (lower is better; the target is at most 1.3).

use std::sync::Arc;
use std::time::Duration;

use coord_core::CallKey;
use coord_core::provider::{LockProvider, OwnerToken, PermitRequest, SemaphoreStore};
use coord_postgres::PostgresProvider;

#[path = "support/mod.rs"]
mod support;

use support::{LEASE, compare, take_fenced, with_provider};

const ROUNDS: usize = 5;

fn main() {
    with_provider(run);
}

/// One pair on task `task`'s key: a permit pair, or the baseline's fenced lock pair.
async fn pair(p: PostgresProvider, keys: Arc<Vec<CallKey>>, task: usize, base: bool) {
    let owner = OwnerToken::new();
    let key = &keys[task];
    if base {
        take_fenced(&p, key, owner).await;
        p.release(key, owner).await.expect("release");
        return;
    }
    let grant = p
        .acquire_permit(PermitRequest {
            key,
            owner,
            limit: 3,
            lease: LEASE,
            wait: Duration::ZERO,
        })
        .await
        .expect("acquire_permit");
    assert!(grant.is_some());
    p.release_permit(key, owner).await.expect("release_permit");
}

async fn run(provider: PostgresProvider) {
    let keys: Arc<Vec<CallKey>> = Arc::new(
        (0..8)
            .map(|i| CallKey::builder("bench", "pair").part(&i).finish())
            .collect(),
    );
    println!("| row | permit pairs/s | lock pairs/s | permit time / lock time | per round |");
    println!("|---|---|---|---|---|");
    compare(
        |tasks| format!("{tasks} task(s)"),
        ROUNDS,
        move |task, base| pair(provider.clone(), keys.clone(), task, base),
    )
    .await;
}
