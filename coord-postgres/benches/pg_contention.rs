//! `PostgresProvider` under heavy contention: thousands of waiters on one key, spread over a
//! few providers (as over a few processes), against one private PostgreSQL server on loopback.
//!
//! Run: `cargo bench -p coord-postgres --bench pg_contention` (waiter counts as arguments
//! after `--`; default 1 000 and 10 000; under two minutes).
//!
//! A holder takes the lock, then `N` tasks (round-robin over `PROVIDERS` providers) each call
//! `acquire` with a long wait, hold the lock for a `yield_now` and release it. Reported: the
//! total time, the statements per acquisition (committed transactions of the database, from
//! `pg_stat_database.xact_commit`, read before the waiters start and after the last release;
//! every statement coord sends outside a transaction is one, `LISTEN` included), and the
//! hand-off: from a holder starting its release to the next holder's acquire returning. The
//! providers' command timeout is 30 s: with the default 1 s, a burst of 10 000 first attempts
//! on 32 pooled connections times out before its turn.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

const PROVIDERS: usize = 4;
const LEASE: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(900);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn commits(server: &PostgresServer) -> u64 {
    server
        .sql(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database(); \
             SELECT pg_stat_clear_snapshot()",
        )
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .expect("xact_commit")
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1_000, 10_000]
    } else {
        sizes
    };
    let server = PostgresServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "pg_contention: {PROVIDERS} providers (pool 8 each), waiters {sizes:?} on one key, hold = one yield_now"
    );
    println!(
        "| waiters | total | statements per acquisition | hand-off p50 | hand-off p99 | max |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        runtime.block_on(run(&server, n));
    }
}

async fn run(server: &PostgresServer, waiters: usize) {
    let url = server.url();
    PostgresProvider::migrate(&url).await.expect("migrate");
    let mut providers = Vec::new();
    for _ in 0..PROVIDERS {
        providers.push(
            PostgresProvider::builder(&url)
                .pool_size(8)
                // A burst of N first attempts queues for 4 x 8 pooled connections: with the
                // default 1 s bound, 10 000 at once time out (typed `Timeout`) before their
                // turn at a connection. The bench measures waiting, not that burst.
                .command_timeout(Duration::from_secs(30))
                .sweep_interval(None)
                .connect()
                .await
                .expect("connect"),
        );
    }
    let key = CallKey::builder("bench", "contention")
        .part(&(waiters as u64))
        .finish();
    let holder = OwnerToken::new();
    let first = providers[0]
        .acquire(LockRequest {
            key: &key,
            owner: holder,
            lease: LEASE,
            wait: Duration::ZERO,
            fenced: false,
        })
        .await
        .expect("acquire")
        .expect("free");
    assert!(first.fencing_token.is_none());
    // Let the listener connections settle, and their counters reach the statistics, before
    // counting.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = commits(server);
    // (release started, acquire returned) per holder, in the order they held.
    let turns: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let last_release = Arc::new(Mutex::new(Instant::now()));
    let started = Instant::now();
    let tasks: Vec<_> = (0..waiters)
        .map(|i| {
            let p = providers[i % PROVIDERS].clone();
            let (key, turns, last_release) = (key.clone(), turns.clone(), last_release.clone());
            tokio::spawn(async move {
                let owner = OwnerToken::new();
                p.acquire(LockRequest {
                    key: &key,
                    owner,
                    lease: LEASE,
                    wait: WAIT,
                    fenced: false,
                })
                .await
                .expect("acquire")
                .expect("granted within the wait");
                let got = Instant::now();
                let released_at = *last_release.lock().unwrap();
                turns.lock().unwrap().push((released_at, got));
                tokio::task::yield_now().await;
                *last_release.lock().unwrap() = Instant::now();
                let out = p.release(&key, owner).await.expect("release");
                assert_eq!(out, ReleaseOutcome::Released);
            })
        })
        .collect();
    // Every waiter is queued before the holder lets go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    *last_release.lock().unwrap() = Instant::now();
    providers[0].release(&key, holder).await.expect("release");
    for t in tasks {
        t.await.expect("waiter");
    }
    let total = started.elapsed();
    // Backends publish their counters within about a second of going idle.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = commits(server);
    let mut handoffs: Vec<Duration> = turns
        .lock()
        .unwrap()
        .iter()
        .map(|(released, got)| got.saturating_duration_since(*released))
        .collect();
    handoffs.sort();
    let per = (after - before) as f64 / waiters as f64;
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    println!(
        "| {waiters} | {:.1} s | {per:.2} | {} | {} | {} |",
        total.as_secs_f64(),
        ms(percentile(&handoffs, 0.5)),
        ms(percentile(&handoffs, 0.99)),
        ms(*handoffs.last().unwrap()),
    );
}
