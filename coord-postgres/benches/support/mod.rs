//! What the PostgreSQL benches that set a provider operation against a baseline on the same
//! provider share: one private server on loopback, one pool of 8 connections, rounds of a fixed
//! length interleaved baseline first, and the table row with the median time ratio.
//!
//! Included by each bench as a module (`#[path]`): a bench is its own crate, and this file is no
//! bench of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

/// How long one round of one side runs.
pub const ROUND: Duration = Duration::from_millis(700);
/// The lease of every hold the benches take: far longer than a round, so none lapses.
pub const LEASE: Duration = Duration::from_secs(30);

/// Starts a private server, migrates it, connects a provider with 8 pooled connections (no
/// sweeper, which would add statements of its own to the measured ones) and runs `bench` with
/// it on a 2-worker runtime.
pub fn with_provider<F, Fut>(bench: F)
where
    F: FnOnce(PostgresProvider) -> Fut,
    Fut: Future<Output = ()>,
{
    let server = PostgresServer::start();
    let url = server.url();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            PostgresProvider::migrate(&url).await.expect("migrate");
            let provider = PostgresProvider::builder(&url)
                .pool_size(8)
                .sweep_interval(None)
                .connect()
                .await
                .expect("connect");
            bench(provider).await
        });
}

/// One fenced lock of `key`, taken without waiting (it must be free) and left held: the
/// baseline pairs' first half.
pub async fn take_fenced(p: &PostgresProvider, key: &CallKey, owner: OwnerToken) {
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
    assert!(grant.is_some(), "the bench's own key is free");
}

/// Runs `op` on `tasks` tasks (task `i` passes `i`) for [`ROUND`] and returns operations per
/// second.
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

/// Measures `op(task, false)` against its baseline `op(task, true)` with 1 task and with 8,
/// `rounds` rounds of each side, interleaved baseline first, and prints one table row per task
/// count, labelled `label(tasks)`: measured ops/s, baseline ops/s (medians), the median measured
/// time / baseline time, and that ratio per round.
pub async fn compare<F, Fut>(label: impl Fn(usize) -> String, rounds: usize, op: F)
where
    F: Fn(usize, bool) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    for tasks in [1usize, 8] {
        let (mut measured, mut baseline) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for base in [true, false] {
                let op = op.clone();
                let rate = throughput(tasks, move |task| op(task, base)).await;
                if base {
                    baseline.push(rate);
                } else {
                    measured.push(rate);
                }
            }
        }
        let (m, b) = (median(measured.clone()), median(baseline.clone()));
        let per_round: Vec<String> = measured
            .iter()
            .zip(&baseline)
            .map(|(m, b)| format!("{:.2}", b / m))
            .collect();
        println!(
            "| {} | {m:.0} | {b:.0} | {:.2}x | {} |",
            label(tasks),
            b / m,
            per_round.join(", ")
        );
    }
}
