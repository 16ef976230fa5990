//! Commands per acquisition and hand-off latency of `RedisProvider` under heavy contention:
//! thousands of waiters on one key, spread over a few providers (as over a few processes),
//! against one private redis-server on loopback.
//!
//! Run: `cargo bench -p coord-redis --bench redis_contention --features fred`
//! (without `fred`, only the redis-rs rows; under a minute).
//!
//! A holder takes the lock, then `WAITERS` tasks (spread round-robin over `PROVIDERS`
//! providers) each call `acquire` with a long wait, hold the lock for a `yield_now` and
//! release it. The server's counters are reset (`CONFIG RESETSTAT`) before the waiters start
//! and read once the last one has released, so every command of every acquisition is counted,
//! first attempts, subscriptions and the holder's release included. Two counts per row:
//! commands the clients sent (a script call is one; from `MONITOR`) and commands Redis
//! executed (the same plus those inside the scripts; from `INFO commandstats`). A hand-off
//! is the time from a holder starting its release to the next holder's acquire returning.
//!
//! redis-server runs on CPU 1 and this process (one tokio worker) on CPU 0 (see `support`).

#[allow(dead_code)] // the raw client of `support` is not used here
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_redis::RedisProvider;
use coord_redis_testing::Monitor;

use support::{Align, Session, Table, clients, percentile, verdict};

const PROVIDERS: usize = 4;
const LEASE: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(600);
const TARGET_PER_ACQUISITION: f64 = 5.0;

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
    let session = Session::start(
        "redis_contention",
        &format!(
            "{PROVIDERS} providers, waiters {sizes:?} on one key, hold = one yield_now, lease {LEASE:?}"
        ),
    );
    let table = Table::start(
        "Contention: N waiters on one key",
        &[
            ("client", Align::Left),
            ("waiters", Align::Right),
            ("total s", Align::Right),
            ("sent per acquisition", Align::Right),
            ("executed per acquisition", Align::Right),
            ("hand-off p50 ms", Align::Right),
            ("p99 ms", Align::Right),
            ("max ms", Align::Right),
            ("sent, by command (per acquisition)", Align::Left),
            ("target (sent ≤ 5)", Align::Left),
        ],
    );
    for (client, name) in clients() {
        for &n in &sizes {
            let providers: Vec<RedisProvider> =
                (0..PROVIDERS).map(|_| session.provider(client)).collect();
            let run = session.rt.block_on(contend(&session, &providers, n, name));
            for p in providers {
                session.close(p);
            }
            let per = |c: &BTreeMap<String, u64>| c.values().sum::<u64>() as f64 / n as f64;
            let (sent, executed) = (per(&run.sent), per(&run.executed));
            let mix: Vec<String> = run
                .sent
                .iter()
                .map(|(c, k)| format!("{c} {:.2}", *k as f64 / n as f64))
                .collect();
            table.row(&[
                name.to_owned(),
                n.to_string(),
                format!("{:.2}", run.total.as_secs_f64()),
                format!("{sent:.2}"),
                format!("{executed:.2}"),
                format!("{:.3}", percentile(&run.handoffs, 0.5)),
                format!("{:.3}", percentile(&run.handoffs, 0.99)),
                format!("{:.3}", percentile(&run.handoffs, 1.0)),
                mix.join(", "),
                verdict(sent <= TARGET_PER_ACQUISITION).to_owned(),
            ]);
        }
    }
    session.finish();
}

struct Run {
    total: Duration,
    sent: BTreeMap<String, u64>,
    executed: BTreeMap<String, u64>,
    /// Sorted, in ms.
    handoffs: Vec<f64>,
}

async fn contend(session: &Session, providers: &[RedisProvider], n: usize, name: &str) -> Run {
    static ROUND: AtomicUsize = AtomicUsize::new(0);
    let key = CallKey::builder("bench", "contention")
        .part(&format!(
            "{name}-{n}-{}",
            ROUND.fetch_add(1, Ordering::Relaxed)
        ))
        .finish();
    // Connections and scripts warm, on another key.
    for p in providers {
        let warm = CallKey::builder("bench", "warm").finish();
        let me = OwnerToken::new();
        p.acquire(request(&warm, me, Duration::ZERO)).await.unwrap();
        p.release(&warm, me).await.unwrap();
    }
    let holder = OwnerToken::new();
    let first = &providers[0];
    assert!(
        first
            .acquire(request(&key, holder, Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    let monitor = Monitor::start(&session.server);
    session.server.command(&["CONFIG", "RESETSTAT"]);
    monitor.drain();
    let last_release = Arc::new(Mutex::new(None::<Instant>));
    let handoffs = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let started = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let p = providers[i % providers.len()].clone();
            let (key, last_release, handoffs, started) = (
                key.clone(),
                last_release.clone(),
                handoffs.clone(),
                started.clone(),
            );
            tokio::spawn(async move {
                let me = OwnerToken::new();
                started.fetch_add(1, Ordering::Relaxed);
                let grant = p.acquire(request(&key, me, WAIT)).await.unwrap();
                let at = Instant::now();
                assert!(grant.is_some(), "a waiter gave up");
                if let Some(from) = *last_release.lock().unwrap() {
                    handoffs
                        .lock()
                        .unwrap()
                        .push(at.saturating_duration_since(from).as_secs_f64() * 1e3);
                }
                tokio::task::yield_now().await;
                *last_release.lock().unwrap() = Some(Instant::now());
                assert_eq!(p.release(&key, me).await.unwrap(), ReleaseOutcome::Released);
            })
        })
        .collect();
    while started.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Every waiter has made its first attempt and is queued.
    tokio::time::sleep(Duration::from_millis(300)).await;
    *last_release.lock().unwrap() = Some(Instant::now());
    first.release(&key, holder).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let total = began.elapsed();
    // The subscriptions are given up in the background; wait for that to be counted too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let executed = session.server.command_calls();
    let mut sent = BTreeMap::new();
    for c in monitor.client_commands() {
        *sent.entry(c).or_insert(0) += 1;
    }
    // The harness's own commands.
    for own in ["config", "info", "echo", "monitor"] {
        sent.remove(own);
    }
    let mut executed = executed;
    for own in ["config", "info", "echo", "monitor"] {
        executed.remove(own);
    }
    let mut handoffs = Arc::try_unwrap(handoffs).unwrap().into_inner().unwrap();
    handoffs.sort_by(f64::total_cmp);
    Run {
        total,
        sent,
        executed,
        handoffs,
    }
}

fn request(key: &CallKey, owner: OwnerToken, wait: Duration) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease: LEASE,
        wait,
        fenced: false,
    }
}
