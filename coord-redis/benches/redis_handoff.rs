//! Hand-off latency of `RedisProvider`: how soon a waiting acquire returns after the holder
//! releases, beside polling baselines, measured in the same run against one private
//! redis-server on loopback.
//!
//! Run: `cargo bench -p coord-redis --bench redis_handoff --features fred`
//! (without `fred`, only the redis-rs provider rows are measured; about half a minute).
//!
//! 8 tasks take turns on one key, holding it about 1 ms. A hand-off is the time from a release
//! returning to the next acquire returning. The provider waits with `wait > 0` (pub/sub
//! wake-up); the baseline, a raw redis-rs client, retries `SET NX PX` every 50 ms (and, as a
//! second baseline, after a random 25..=75 ms). In "waiter" mode a task that released does not
//! try again until another task has taken the lock, so every hand-off goes to a task that was
//! already waiting; in "free-for-all" mode the releasing task may take the lock straight back
//! (the table says how often it did).
//!
//! redis-server runs on CPU 1 and this process (one tokio worker) on CPU 0 (see `support`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_redis::RedisProvider;
use tokio::sync::watch;

use support::{Align, RawRs, Session, Table, percentile, verdict};

const HANDOFF_TASKS: usize = 8;
const HANDOFF_RUN: Duration = Duration::from_secs(3);
const HANDOFF_WARM_UP: Duration = Duration::from_millis(500);
const HOLD: Duration = Duration::from_millis(1);
const POLL_EVERY: Duration = Duration::from_millis(50);
/// The jittered poller sleeps a uniform 25..=75 ms (50 ms on average).
const POLL_JITTER_MS: std::ops::RangeInclusive<u64> = 25..=75;
const HANDOFF_LEASE_MS: u64 = 10_000;
const HANDOFF_WAIT: Duration = Duration::from_secs(10);

const HANDOFF_P50_TARGET_MS: f64 = 0.15;

#[derive(Clone)]
enum Contender {
    Provider(RedisProvider),
    /// `SET NX PX` every 50 ms; with `jitter`, every 25..=75 ms at random.
    Polling {
        raw: RawRs,
        jitter: bool,
    },
}

/// One turn of one task at the lock.
#[derive(Debug, Clone, Copy)]
struct Turn {
    task: usize,
    /// Order of acquisition (the lock is exclusive, so this is the order of holders).
    seq: u64,
    called: Instant,
    acquired: Instant,
    released: Instant,
}

struct HandoffStats {
    per_sec: f64,
    /// Signed hand-off times in milliseconds, sorted.
    handoffs: Vec<f64>,
    /// Hand-offs where the task that released took the lock again.
    to_same_task: usize,
    /// Hand-offs to a task whose acquire started before the release returned.
    to_waiter: usize,
    mean_hold_ms: f64,
}

impl HandoffStats {
    fn pct(&self, p: f64) -> f64 {
        percentile(&self.handoffs, p)
    }
}

fn signed_ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1e3
    } else {
        -(from - to).as_secs_f64() * 1e3
    }
}

/// `HANDOFF_TASKS` tasks take turns on one key for `length`. With `gated`, a task that has
/// released does not try again until another task has taken the lock, so every hand-off goes
/// to a task that was already waiting; without it, the releasing task may take the lock
/// straight back.
async fn run_handoff(
    contender: &Contender,
    name: &str,
    gated: bool,
    length: Duration,
) -> HandoffStats {
    let stop = Arc::new(AtomicBool::new(false));
    let (turns, _) = watch::channel(0u64);
    let turns = Arc::new(turns);
    let start = Instant::now();
    let handles: Vec<_> = (0..HANDOFF_TASKS)
        .map(|task| {
            let contender = contender.clone();
            let stop = stop.clone();
            let turns = turns.clone();
            let name = name.to_owned();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut gate = turns.subscribe();
                let mut last: Option<u64> = None;
                let (key, lock) = (
                    CallKey::builder("bench", &name).finish(),
                    format!("raw:lock:{{{name}}}"),
                );
                let mut conn = match &contender {
                    Contender::Polling { raw, .. } => Some(raw.conn.clone()),
                    Contender::Provider(_) => None,
                };
                loop {
                    if let (true, Some(seq)) = (gated, last) {
                        let stop = &stop;
                        let _ = gate
                            .wait_for(|taken| *taken > seq + 1 || stop.load(Ordering::Relaxed))
                            .await;
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let called = Instant::now();
                    let owner = OwnerToken::new();
                    let token = owner.to_string();
                    match &contender {
                        Contender::Provider(p) => {
                            p.acquire(LockRequest {
                                key: &key,
                                owner,
                                lease: Duration::from_millis(HANDOFF_LEASE_MS),
                                wait: HANDOFF_WAIT,
                                fenced: false,
                            })
                            .await
                            .expect("provider acquire")
                            .expect("the lock stayed held for the whole wait");
                        }
                        Contender::Polling { raw, jitter } => {
                            let conn = conn.as_mut().expect("raw connection");
                            while !raw.try_acquire(conn, &lock, &token, HANDOFF_LEASE_MS).await {
                                let pause = if *jitter {
                                    Duration::from_millis(rand::random_range(POLL_JITTER_MS))
                                } else {
                                    POLL_EVERY
                                };
                                tokio::time::sleep(pause).await;
                            }
                        }
                    }
                    let acquired = Instant::now();
                    let mut seq = 0;
                    turns.send_modify(|taken| {
                        seq = *taken;
                        *taken += 1;
                    });
                    tokio::time::sleep(HOLD).await;
                    match &contender {
                        Contender::Provider(p) => {
                            let out = p.release(&key, owner).await.expect("provider release");
                            assert_eq!(out, ReleaseOutcome::Released);
                        }
                        Contender::Polling { raw, .. } => {
                            let conn = conn.as_mut().expect("raw connection");
                            assert!(raw.release(conn, &lock, &token).await);
                        }
                    }
                    let released = Instant::now();
                    mine.push(Turn {
                        task,
                        seq,
                        called,
                        acquired,
                        released,
                    });
                    last = Some(seq);
                }
                mine
            })
        })
        .collect();
    tokio::time::sleep(length).await;
    let stopped = Instant::now();
    stop.store(true, Ordering::Relaxed);
    turns.send_modify(|_| {});
    let mut all: Vec<Turn> = Vec::new();
    for handle in handles {
        all.extend(handle.await.expect("a hand-off task panicked"));
    }
    all.sort_by_key(|t| t.seq);
    for (i, t) in all.iter().enumerate() {
        assert_eq!(t.seq, i as u64, "a turn is missing");
    }
    // Only turns taken before the stop count; the drain after it does not.
    all.retain(|t| t.acquired <= stopped);
    let mut handoffs = Vec::new();
    let (mut to_same_task, mut to_waiter) = (0, 0);
    for pair in all.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        handoffs.push(signed_ms(a.released, b.acquired));
        if a.task == b.task {
            to_same_task += 1;
        } else if b.called < a.released {
            to_waiter += 1;
        }
    }
    handoffs.sort_by(f64::total_cmp);
    let mean_hold_ms = all
        .iter()
        .map(|t| (t.released - t.acquired).as_secs_f64() * 1e3)
        .sum::<f64>()
        / all.len().max(1) as f64;
    HandoffStats {
        per_sec: all.len() as f64 / (stopped - start).as_secs_f64(),
        handoffs,
        to_same_task,
        to_waiter,
        mean_hold_ms,
    }
}

// ---------------------------------------------------------------------------------------------
// Report

struct HandoffRow {
    client: &'static str,
    mode: &'static str,
    contender: &'static str,
    stats: HandoffStats,
    /// Whether the hand-off target applies to this row.
    target: bool,
}

fn handoff_rows(
    rt: &tokio::runtime::Runtime,
    client: &'static str,
    contender_name: &'static str,
    contender: &Contender,
    modes: &[(&'static str, bool)],
    target: bool,
) -> Vec<HandoffRow> {
    let mut rows = Vec::new();
    for &(mode, gated) in modes {
        eprintln!("measuring hand-off ({mode}), {contender_name}, {client}...");
        let tag = format!("handoff-{client}-{contender_name}-{mode}").replace([' ', ','], "");
        // The provider's first wait opens its subscriber connection and loads its scripts.
        rt.block_on(run_handoff(
            contender,
            &format!("{tag}-w"),
            gated,
            HANDOFF_WARM_UP,
        ));
        let stats = rt.block_on(run_handoff(contender, &tag, gated, HANDOFF_RUN));
        rows.push(HandoffRow {
            client,
            mode,
            contender: contender_name,
            stats,
            target: target && gated,
        });
    }
    rows
}

fn main() {
    let session = Session::start(
        "redis_handoff",
        &format!("hand-off rows: {HANDOFF_RUN:?} each after {HANDOFF_WARM_UP:?} of warm-up"),
    );
    let rt = &session.rt;
    let mut handoff = Vec::new();
    let both_modes = [("waiter", true), ("free-for-all", false)];
    for (client, name) in support::clients() {
        let provider = session.provider(client);
        let contender = Contender::Provider(provider.clone());
        handoff.extend(handoff_rows(
            rt,
            name,
            "provider (pub/sub)",
            &contender,
            &both_modes,
            true,
        ));
        drop(contender);
        session.close(provider);
    }
    // The polling baselines do not depend on the provider's client: measured once.
    let plain = Contender::Polling {
        raw: session.raw.clone(),
        jitter: false,
    };
    let jittered = Contender::Polling {
        raw: session.raw.clone(),
        jitter: true,
    };
    handoff.extend(handoff_rows(
        rt,
        "redis-rs",
        "raw, poll every 50 ms",
        &plain,
        &both_modes,
        false,
    ));
    handoff.extend(handoff_rows(
        rt,
        "redis-rs",
        "raw, poll every 25-75 ms",
        &jittered,
        &both_modes[..1],
        false,
    ));

    use Align::{Left, Right};
    let table = Table::start(
        &format!(
            "Hand-off: {HANDOFF_TASKS} tasks on one key, each holding it {HOLD:?} (ms from a release \
             returning to the next acquire returning; target: provider p50 <= {HANDOFF_P50_TARGET_MS} ms \
             in waiter mode)"
        ),
        &[
            ("contender", Left),
            ("client", Left),
            ("mode", Left),
            ("acquisitions/s", Right),
            ("hand-offs", Right),
            ("p50 ms", Right),
            ("p90 ms", Right),
            ("p99 ms", Right),
            ("min ms", Right),
            ("to same task", Right),
            ("to a waiter", Right),
            ("mean hold ms", Right),
            ("target", Left),
        ],
    );
    for row in &handoff {
        let s = &row.stats;
        table.row(&[
            row.contender.to_owned(),
            row.client.to_owned(),
            row.mode.to_owned(),
            format!("{:.0}", s.per_sec),
            s.handoffs.len().to_string(),
            format!("{:.3}", s.pct(0.50)),
            format!("{:.3}", s.pct(0.90)),
            format!("{:.3}", s.pct(0.99)),
            format!("{:.3}", s.handoffs.first().copied().unwrap_or(f64::NAN)),
            s.to_same_task.to_string(),
            s.to_waiter.to_string(),
            format!("{:.2}", s.mean_hold_ms),
            if row.target {
                verdict(s.pct(0.50) <= HANDOFF_P50_TARGET_MS)
            } else {
                "-"
            }
            .to_owned(),
        ]);
    }
    session.finish();
}
