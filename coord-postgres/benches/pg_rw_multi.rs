//! Read-write lock pairs and one-statement multi-key sets beside fenced lock pairs on the same
//! `PostgresProvider`, measured in the same process against one private PostgreSQL server on
//! loopback, interleaved round by round.
//!
//! Run: `cargo bench -p coord-postgres --bench pg_rw_multi` (about 35 s).
//!
//! | row | measured | baseline |
//! |---|---|---|
//! | read pair | `RwLockStore::acquire_rw` (read, no wait) + `release_rw` | `LockProvider::acquire` (no wait, fenced) + `release` |
//! | write pair | the same in write mode | the same lock pair |
//! | 4-key set | `MultiLockStore::acquire_all` (4 keys, no wait, one statement) + 4 `release` | 4 fenced `acquire` one after another (the runtime's key-by-key path) + 4 `release` |
//!
//! Each task works on keys of its own, with 1 task and with 8; the pool has 8 connections.
//! The ratio is measured time / baseline time (lower is better).

use std::sync::Arc;
use std::time::Duration;

use coord_core::CallKey;
use coord_core::provider::{
    LockProvider, MultiLockRequest, MultiLockStore, OwnerToken, RwLockRequest, RwLockStore, RwMode,
};
use coord_postgres::PostgresProvider;

#[path = "support/mod.rs"]
mod support;

use support::{LEASE, compare, take_fenced, with_provider};

const ROUNDS: usize = 3;

fn main() {
    with_provider(run);
}

#[derive(Clone, Copy)]
enum Row {
    Read,
    Write,
    Set,
}

/// One operation of `row` on task `task`'s keys: the measured form, or the baseline.
async fn once(
    p: PostgresProvider,
    keys: Arc<Vec<Vec<CallKey>>>,
    task: usize,
    row: Row,
    base: bool,
) {
    let owner = OwnerToken::new();
    let mine = &keys[task];
    match (row, base) {
        (Row::Read | Row::Write, true) => {
            take_fenced(&p, &mine[0], owner).await;
            p.release(&mine[0], owner).await.expect("release");
        }
        (Row::Read | Row::Write, false) => {
            let mode = if matches!(row, Row::Read) {
                RwMode::Read
            } else {
                RwMode::Write
            };
            let grant = p
                .acquire_rw(RwLockRequest {
                    key: &mine[0],
                    owner,
                    mode,
                    lease: LEASE,
                    wait: Duration::ZERO,
                    claim: LEASE / 3,
                })
                .await
                .expect("acquire_rw");
            assert!(grant.is_some());
            p.release_rw(&mine[0], owner, mode)
                .await
                .expect("release_rw");
        }
        (Row::Set, true) => {
            for key in mine {
                take_fenced(&p, key, owner).await;
            }
            for key in mine {
                p.release(key, owner).await.expect("release");
            }
        }
        (Row::Set, false) => {
            let grant = p
                .acquire_all(MultiLockRequest {
                    keys: mine,
                    owner,
                    lease: LEASE,
                    wait: Duration::ZERO,
                })
                .await
                .expect("acquire_all");
            assert!(grant.is_some());
            for key in mine {
                p.release(key, owner).await.expect("release");
            }
        }
    }
}

async fn run(provider: PostgresProvider) {
    // Per task: four keys in canonical order (the first also serves the pair rows; a
    // read-write lock's key names another thing than a lock's).
    let keys: Arc<Vec<Vec<CallKey>>> = Arc::new(
        (0..8u32)
            .map(|task| {
                let mut set: Vec<CallKey> = (0..4u32)
                    .map(|i| {
                        CallKey::builder("bench", "set")
                            .part(&task)
                            .part(&i)
                            .finish()
                    })
                    .collect();
                set.sort_by(|a, b| a.qualified().cmp(b.qualified()));
                set
            })
            .collect(),
    );
    println!(
        "| row | measured ops/s | baseline ops/s | measured time / baseline time | per round |"
    );
    println!("|---|---|---|---|---|");
    for (name, row) in [
        ("read pair", Row::Read),
        ("write pair", Row::Write),
        ("4-key set", Row::Set),
    ] {
        let (p, keys) = (provider.clone(), keys.clone());
        compare(
            |tasks| format!("{name}, {tasks} task(s)"),
            ROUNDS,
            move |task, base| once(p.clone(), keys.clone(), task, row, base),
        )
        .await;
    }
}
