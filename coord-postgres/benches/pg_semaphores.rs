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
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, PermitRequest, SemaphoreStore};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

const ROUNDS: usize = 5;
const ROUND: Duration = Duration::from_millis(700);

/// Runs `op` on `tasks` tasks for [`ROUND`] and returns pairs per second.
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

async fn run(url: &str) {
    PostgresProvider::migrate(url).await.expect("migrate");
    let provider = PostgresProvider::builder(url)
        .pool_size(8)
        .sweep_interval(None)
        .connect()
        .await
        .expect("connect");
    let keys: Arc<Vec<CallKey>> = Arc::new(
        (0..8)
            .map(|i| CallKey::builder("bench", "pair").part(&i).finish())
            .collect(),
    );
    println!("| row | permit pairs/s | lock pairs/s | permit time / lock time | per round |");
    println!("|---|---|---|---|---|");
    for tasks in [1usize, 8] {
        let (mut permits, mut locks) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let lock_rate = {
                let (p, keys) = (provider.clone(), keys.clone());
                throughput(tasks, move |task| {
                    let (p, keys) = (p.clone(), keys.clone());
                    async move {
                        let owner = OwnerToken::new();
                        let key = &keys[task];
                        let grant = p
                            .acquire(LockRequest {
                                key,
                                owner,
                                lease: Duration::from_secs(30),
                                wait: Duration::ZERO,
                                fenced: true,
                            })
                            .await
                            .expect("acquire");
                        assert!(grant.is_some());
                        p.release(key, owner).await.expect("release");
                    }
                })
                .await
            };
            let permit_rate = {
                let (p, keys) = (provider.clone(), keys.clone());
                throughput(tasks, move |task| {
                    let (p, keys) = (p.clone(), keys.clone());
                    async move {
                        let owner = OwnerToken::new();
                        let key = &keys[task];
                        let grant = p
                            .acquire_permit(PermitRequest {
                                key,
                                owner,
                                limit: 3,
                                lease: Duration::from_secs(30),
                                wait: Duration::ZERO,
                            })
                            .await
                            .expect("acquire_permit");
                        assert!(grant.is_some());
                        p.release_permit(key, owner).await.expect("release_permit");
                    }
                })
                .await
            };
            locks.push(lock_rate);
            permits.push(permit_rate);
        }
        let (p, l) = (median(permits.clone()), median(locks.clone()));
        println!(
            "| {tasks} task(s) | {p:.0} | {l:.0} | {:.2}x | {} |",
            l / p,
            permits
                .iter()
                .zip(&locks)
                .map(|(p, l)| format!("{:.2}", l / p))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}
