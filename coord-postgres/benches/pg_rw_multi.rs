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
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{
    LockProvider, LockRequest, MultiLockRequest, MultiLockStore, OwnerToken, RwLockRequest,
    RwLockStore, RwMode,
};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

const ROUNDS: usize = 3;
const ROUND: Duration = Duration::from_millis(700);
const LEASE: Duration = Duration::from_secs(30);

/// Runs `op` on `tasks` tasks for [`ROUND`] and returns operations per second.
async fn throughput<F, Fut>(tasks: usize, op: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < ROUND {
                    op(task).await;
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await.expect("task");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let server = PostgresServer::start();
    let url = server.url();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run(&url));
}

#[derive(Clone, Copy)]
enum Row {
    Read,
    Write,
    Set,
}

/// One fenced lock of `key`, taken (it must be free) and left held.
async fn lock(p: &PostgresProvider, key: &CallKey, owner: OwnerToken) {
    let grant = p
        .acquire(LockRequest {
            key,
            owner,
            lease: LEASE,
            wait: Duration::ZERO,
            fenced: true,
        })
        .await
        .expect("acquire");
    assert!(grant.is_some());
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
            lock(&p, &mine[0], owner).await;
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
                lock(&p, key, owner).await;
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

async fn run(url: &str) {
    PostgresProvider::migrate(url).await.expect("migrate");
    let provider = PostgresProvider::builder(url)
        .pool_size(8)
        .sweep_interval(None)
        .connect()
        .await
        .expect("connect");
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
        for tasks in [1usize, 8] {
            let (mut measured, mut baseline) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                for base in [true, false] {
                    let (p, keys) = (provider.clone(), keys.clone());
                    let rate = throughput(tasks, move |task| {
                        once(p.clone(), keys.clone(), task, row, base)
                    })
                    .await;
                    if base {
                        baseline.push(rate);
                    } else {
                        measured.push(rate);
                    }
                }
            }
            let (m, b) = (median(measured.clone()), median(baseline.clone()));
            println!(
                "| {name}, {tasks} task(s) | {m:.0} | {b:.0} | {:.2}x | {} |",
                b / m,
                measured
                    .iter()
                    .zip(&baseline)
                    .map(|(m, b)| format!("{:.2}", b / m))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}
