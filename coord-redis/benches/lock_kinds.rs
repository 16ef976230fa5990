//! The new lock kinds against the fenced single-key lock, through the same coordinator on
//! one private redis-server on loopback (issue 26, point 8):
//!
//! 1. **Permit pair against lock pair**: `semaphore(key, 3)` acquire + release against
//!    `lock(key).fenced()` acquire + release, every task on a key of its own (so nothing
//!    waits), at 1 and 16 tasks. Target: a permit pair costs at most 1.3x a lock pair.
//! 2. **Read-lock throughput with 16 readers**: 16 tasks taking and releasing read holds of
//!    ONE key, against the two single-lock bounds: 16 tasks on 16 keys of their own (nothing
//!    shared, the most the client and server can do with one hold per pair) and 16 tasks on one
//!    key (an exclusive lock, so one holder at a time: what readers would get without a
//!    read-write lock).
//!
//! Run: `cargo bench -p coord-redis --bench lock_kinds --features fred`
//! (without `fred`, only the redis-rs rows).
//!
//! Subjects of a row alternate in slices (A B, B A, A B ...) so that a change in the
//! machine's load during a row hits both sides alike; each row reports pairs per second
//! summed over its slices and the median of the per-slice ratios. Nothing asserts on time.

#[allow(dead_code)] // the raw client of `support` is not used here
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CallKey, Coordinator};
use support::{Align, Session, Table, clients, verdict};

const LEASE: Duration = Duration::from_secs(30);
/// Long enough that a single-key lock's waiters never give up during a slice.
const WAIT: Duration = Duration::from_secs(30);
const PERMITS: u32 = 3;
const WARM_UP: Duration = Duration::from_millis(300);
const SLICE: Duration = Duration::from_millis(500);
const ROUNDS: usize = 8;
const PERMIT_TARGET: f64 = 1.3;

/// What one task repeats: one acquire + release pair of a kind.
#[derive(Clone, Copy, PartialEq)]
enum Pair {
    /// A fenced single-key lock.
    Lock,
    /// A permit of a `PERMITS`-permit semaphore.
    Permit,
    /// A read hold of a read-write lock.
    Read,
}

/// One subject of a row: a kind of pair, how many tasks, and whether they share one key.
#[derive(Clone, Copy)]
struct Subject {
    pair: Pair,
    tasks: usize,
    one_key: bool,
}

fn main() {
    let session = Session::start(
        "lock_kinds",
        &format!(
            "lease {LEASE:?}, {ROUNDS} alternating slices of {SLICE:?} per subject and row, warm-up {WARM_UP:?}"
        ),
    );
    let permits = Table::start(
        "Permit pair against fenced lock pair (each task on its own key)",
        &[
            ("client", Align::Left),
            ("tasks", Align::Right),
            ("lock pairs/s", Align::Right),
            ("permit pairs/s", Align::Right),
            ("permit time / lock time (median of slices)", Align::Right),
            ("per slice (min–max)", Align::Right),
            ("target ≤ 1.3x", Align::Left),
        ],
    );
    let mut read_rows = Vec::new();
    for (client, name) in clients() {
        let provider = session.provider(client);
        let coord = Coordinator::builder()
            .namespace(format!("bench-kinds-{name}"))
            .provider(provider)
            .build()
            .expect("a coordinator");
        for tasks in [1, 16] {
            let lock = Subject {
                pair: Pair::Lock,
                tasks,
                one_key: false,
            };
            let permit = Subject {
                pair: Pair::Permit,
                tasks,
                one_key: false,
            };
            let row = session.rt.block_on(compare(&coord, lock, permit));
            // Time per pair is the inverse of the rate: permit time / lock time.
            let ratios: Vec<f64> = row.slices.iter().map(|(l, p)| l / p).collect();
            let median = median(&ratios);
            permits.row(&[
                name.to_owned(),
                tasks.to_string(),
                format!("{:.0}", row.total_a),
                format!("{:.0}", row.total_b),
                format!("{median:.2}x"),
                format!("{:.2}–{:.2}", min(&ratios), max(&ratios)),
                verdict(median <= PERMIT_TARGET).to_owned(),
            ]);
        }
        let readers = Subject {
            pair: Pair::Read,
            tasks: 16,
            one_key: true,
        };
        let spread = Subject {
            pair: Pair::Lock,
            tasks: 16,
            one_key: false,
        };
        let exclusive = Subject {
            pair: Pair::Lock,
            tasks: 16,
            one_key: true,
        };
        let against_spread = session.rt.block_on(compare(&coord, spread, readers));
        let against_exclusive = session.rt.block_on(compare(&coord, exclusive, readers));
        read_rows.push((name, against_spread, against_exclusive));
        session.rt.block_on(async move { drop(coord) });
    }
    let reads = Table::start(
        "Read-lock throughput: 16 readers of one key",
        &[
            ("client", Align::Left),
            ("read pairs/s, one key", Align::Right),
            ("lock pairs/s, 16 keys", Align::Right),
            ("reads / locks on 16 keys (median)", Align::Right),
            ("lock pairs/s, one key", Align::Right),
            ("reads / locks on one key (median)", Align::Right),
        ],
    );
    for (name, spread, exclusive) in read_rows {
        let over_spread: Vec<f64> = spread.slices.iter().map(|(l, r)| r / l).collect();
        let over_exclusive: Vec<f64> = exclusive.slices.iter().map(|(l, r)| r / l).collect();
        reads.row(&[
            name.to_owned(),
            format!("{:.0}", (spread.total_b + exclusive.total_b) / 2.0),
            format!("{:.0}", spread.total_a),
            format!("{:.2}x", median(&over_spread)),
            format!("{:.0}", exclusive.total_a),
            format!("{:.2}x", median(&over_exclusive)),
        ]);
    }
    session.finish();
}

/// Two subjects measured in alternating slices.
struct Row {
    /// Pairs per second of `a` and of `b` over all their slices.
    total_a: f64,
    total_b: f64,
    /// Per round: (rate of `a`, rate of `b`).
    slices: Vec<(f64, f64)>,
}

async fn compare(coord: &Coordinator, a: Subject, b: Subject) -> Row {
    run(coord, a, WARM_UP).await;
    run(coord, b, WARM_UP).await;
    let mut slices = Vec::with_capacity(ROUNDS);
    let (mut pairs_a, mut pairs_b, mut secs_a, mut secs_b) = (0u64, 0u64, 0f64, 0f64);
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 { [a, b] } else { [b, a] };
        let mut rates = [0.0; 2];
        for (i, subject) in order.into_iter().enumerate() {
            let (pairs, took) = run(coord, subject, SLICE).await;
            let secs = took.as_secs_f64();
            rates[i] = pairs as f64 / secs;
            if (round % 2 == 0) == (i == 0) {
                pairs_a += pairs;
                secs_a += secs;
            } else {
                pairs_b += pairs;
                secs_b += secs;
            }
        }
        slices.push(if round % 2 == 0 {
            (rates[0], rates[1])
        } else {
            (rates[1], rates[0])
        });
    }
    Row {
        total_a: pairs_a as f64 / secs_a,
        total_b: pairs_b as f64 / secs_b,
        slices,
    }
}

/// Runs `subject` for about `length`: returns the pairs completed and the time from start
/// until every task stopped (a pair under way when the time is up is finished and counted).
async fn run(coord: &Coordinator, subject: Subject, length: Duration) -> (u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let keys: Vec<CallKey> = (0..subject.tasks)
        .map(|i| {
            let part = if subject.one_key { 0 } else { i };
            coord
                .key(match subject.pair {
                    Pair::Lock => "lock",
                    Pair::Permit => "permit",
                    Pair::Read => "read",
                })
                .part(&part)
                .finish()
        })
        .collect();
    let started = Instant::now();
    let workers: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let (stop, done, coord) = (stop.clone(), done.clone(), coord.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    one_pair(&coord, subject.pair, key.clone()).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("a bench task panicked");
    }
    (done.load(Ordering::Relaxed), started.elapsed())
}

async fn one_pair(coord: &Coordinator, pair: Pair, key: CallKey) {
    match pair {
        Pair::Lock => {
            let guard = coord
                .lock(key)
                .lease(LEASE)
                .wait(WAIT)
                .fenced()
                .acquire()
                .await
                .expect("a lock within the wait");
            guard.release().await.expect("released");
        }
        Pair::Permit => {
            let guard = coord
                .semaphore(key, PERMITS)
                .lease(LEASE)
                .wait(WAIT)
                .acquire()
                .await
                .expect("a permit within the wait");
            guard.release().await.expect("released");
        }
        Pair::Read => {
            let guard = coord
                .rw_lock(key)
                .lease(LEASE)
                .wait(WAIT)
                .read()
                .await
                .expect("a read hold within the wait");
            guard.release().await.expect("released");
        }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}
