//! Lock pairs (acquire, a `yield_now` as the critical section, release) per second of
//! `RedisProvider` beside rslock (a Redlock client over redis-rs, one server) in the same
//! process against one private redis-server on loopback, rounds of the two interleaved.
//!
//! Run: `cargo bench -p coord-redis --bench lock_vs_rslock --features fred`
//! (without `fred`, only the redis-rs rows; about three minutes with both).
//!
//! Rows: 1, 16 and 64 tasks each on a key of its own, and 16 tasks on one key. Each task loops
//! acquire / yield / release for the round; coord waits for the lock (`wait` 10 s, lease 10 s,
//! unfenced, like rslock's locks), rslock retries as it does by default (`acquire_no_guard`:
//! `SET NX PX`, then a random 0–200 ms sleep after a refusal). Per row: pairs per second of
//! each (the sum of `ROUNDS` interleaved rounds), coord / rslock, the least-served task's pairs
//! over the mean (one key: how fair the hand-over is), and the commands the clients sent per
//! acquisition (from `MONITOR`, in a shorter round of its own after the timed ones, so the
//! monitor does not slow the timed rounds).
//!
//! redis-server runs on CPU 1 and this process (one tokio worker) on CPU 0 (see `support`).

#[allow(dead_code)] // the raw client of `support` is not used here
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_redis::RedisProvider;
use coord_redis_testing::Monitor;
use rslock::LockManager;

use support::{Align, Session, Table, clients, verdict};

const ROUND: Duration = Duration::from_millis(1500);
const ROUNDS: usize = 3;
const COUNTED_ROUND: Duration = Duration::from_millis(700);
const LEASE: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(10);
/// Commands of the bench's own connections, left out of the counts.
const OWN: [&str; 4] = ["config", "info", "echo", "monitor"];

#[derive(Clone)]
enum Contender {
    Coord(RedisProvider),
    Rslock(Arc<LockManager>),
}

/// What one round measured.
struct Round {
    /// Pairs per task.
    pairs: Vec<u64>,
    elapsed: Duration,
}

fn main() {
    let session = Session::start(
        "lock_vs_rslock",
        &format!(
            "rounds of {ROUND:?}, {ROUNDS} per contender interleaved; a counted round of \
             {COUNTED_ROUND:?} each under MONITOR; lease {LEASE:?}, hold = one yield_now"
        ),
    );
    let table = Table::start(
        "Lock pairs per second: coord beside rslock",
        &[
            ("client", Align::Left),
            ("tasks", Align::Right),
            ("keys", Align::Left),
            ("coord pairs/s", Align::Right),
            ("rslock pairs/s", Align::Right),
            ("coord / rslock", Align::Right),
            ("least-served / mean: coord", Align::Right),
            ("rslock", Align::Right),
            ("sent per acquisition: coord", Align::Right),
            ("rslock", Align::Right),
            ("target (one key: ≥ 1.00x, least ≥ 0.50)", Align::Left),
        ],
    );
    let rslock = Arc::new(LockManager::new(vec![session.server.url()]));
    let rows: [(usize, bool); 4] = [(1, false), (16, false), (64, false), (16, true)];
    for (client, name) in clients() {
        let provider = session.provider(client);
        let coord = Contender::Coord(provider.clone());
        let theirs = Contender::Rslock(rslock.clone());
        // Connections and scripts warm.
        session.rt.block_on(async {
            run(&coord, 4, false, Duration::from_millis(200), "warm").await;
            run(&theirs, 4, false, Duration::from_millis(200), "warm").await;
        });
        for (row, (tasks, one_key)) in rows.into_iter().enumerate() {
            let (mut ours, mut other) = (Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let tag = format!("{name}-{row}-{round}");
                session.rt.block_on(async {
                    ours.push(run(&coord, tasks, one_key, ROUND, &format!("c-{tag}")).await);
                    other.push(run(&theirs, tasks, one_key, ROUND, &format!("r-{tag}")).await);
                });
            }
            let sent = |c: &Contender, who: &str| {
                let monitor = Monitor::start(&session.server);
                monitor.drain();
                let round = session.rt.block_on(run(
                    c,
                    tasks,
                    one_key,
                    COUNTED_ROUND,
                    &format!("{who}-{name}-{row}-counted"),
                ));
                let commands = monitor
                    .client_commands()
                    .into_iter()
                    .filter(|c| !OWN.contains(&c.as_str()))
                    .count();
                commands as f64 / round.pairs.iter().sum::<u64>().max(1) as f64
            };
            let (ours_sent, other_sent) = (sent(&coord, "c"), sent(&theirs, "r"));
            let (ours_rate, other_rate) = (rate(&ours), rate(&other));
            let ratio = ours_rate / other_rate;
            let (ours_fair, other_fair) = (least_over_mean(&ours), least_over_mean(&other));
            let target = if one_key {
                verdict(ratio >= 1.0 && ours_fair >= 0.5).to_owned()
            } else {
                "reported".to_owned()
            };
            table.row(&[
                name.to_owned(),
                tasks.to_string(),
                if one_key { "one" } else { "own" }.to_owned(),
                format!("{ours_rate:.0}"),
                format!("{other_rate:.0}"),
                format!("{ratio:.2}x"),
                format!("{ours_fair:.2}"),
                format!("{other_fair:.2}"),
                format!("{ours_sent:.2}"),
                format!("{other_sent:.2}"),
                target,
            ]);
        }
        session.close(provider);
    }
    session.finish();
}

/// Pairs per second over all of `rounds`.
fn rate(rounds: &[Round]) -> f64 {
    let pairs: u64 = rounds.iter().flat_map(|r| &r.pairs).sum();
    let secs: f64 = rounds.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    pairs as f64 / secs
}

/// The least-served task's pairs over the mean, over all of `rounds` (per task: its pairs
/// summed over the rounds).
fn least_over_mean(rounds: &[Round]) -> f64 {
    let tasks = rounds[0].pairs.len();
    let per_task: Vec<u64> = (0..tasks)
        .map(|t| rounds.iter().map(|r| r.pairs[t]).sum())
        .collect();
    let mean = per_task.iter().sum::<u64>() as f64 / tasks as f64;
    *per_task.iter().min().unwrap() as f64 / mean
}

/// `tasks` tasks take and give back a lock for `length` (each its own key, or all one key).
async fn run(
    contender: &Contender,
    tasks: usize,
    one_key: bool,
    length: Duration,
    tag: &str,
) -> Round {
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..tasks).map(|_| AtomicU64::new(0)).collect());
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (contender, stop, counts) = (contender.clone(), stop.clone(), counts.clone());
            let name = if one_key {
                tag.to_owned()
            } else {
                format!("{tag}-{task}")
            };
            tokio::spawn(async move {
                let key = CallKey::builder("bench", "pairs").part(&name).finish();
                let resource = format!("rslock:{name}");
                while !stop.load(Ordering::Relaxed) {
                    match &contender {
                        Contender::Coord(p) => {
                            let me = OwnerToken::new();
                            let request = LockRequest {
                                key: &key,
                                owner: me,
                                lease: LEASE,
                                wait: WAIT,
                                fenced: false,
                            };
                            let grant = p.acquire(request).await.expect("acquire");
                            assert!(grant.is_some(), "coord: the lock within the wait");
                            tokio::task::yield_now().await;
                            let released = p.release(&key, me).await.expect("release");
                            assert_eq!(released, ReleaseOutcome::Released);
                        }
                        Contender::Rslock(m) => {
                            let lock = m
                                .acquire_no_guard(resource.as_bytes(), LEASE)
                                .await
                                .expect("rslock acquire");
                            tokio::task::yield_now().await;
                            m.unlock(&lock).await;
                        }
                    }
                    counts[task].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.expect("task");
    }
    // Pairs finished after the stop are few and counted: time to the last one.
    let elapsed = started.elapsed();
    Round {
        pairs: counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        elapsed,
    }
}
