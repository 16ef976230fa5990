//! Lock throughput and hand-off latency of `RedisProvider`, each beside a hand-written
//! baseline that does the same work, measured in the same run against one private
//! redis-server on loopback.
//!
//! Run: `cargo bench -p coord-redis --bench redis_locks --features fred,testing`
//! (without `fred`, only the redis-rs rows are measured).
//!
//! 1. Unfenced acquire+release pairs per second through the `LockProvider` trait, against a
//!    raw client on ONE redis-rs multiplexed connection: `SET key token NX PX ms`, then
//!    `EVALSHA` of a compare-and-delete script.
//! 2. The same with `fenced: true`; the baseline does the same work by hand: one `EVALSHA` of
//!    a script that takes the lock and mints a fencing token from an expiring counter that
//!    only grows (`max(last + 1, server time in µs)`), then the same compare-and-delete.
//!    Both at 1 task (sequential pairs on one key) and at 16 tasks on 16 keys.
//! 3. Hand-off: 8 tasks take turns on one key, holding it about 1 ms. A hand-off is the time
//!    from a release returning to the next acquire returning. The provider waits with
//!    `wait > 0` (pub/sub wake-up); the baseline retries `SET NX PX` every 50 ms (and, as a
//!    second baseline, after a random 25..=75 ms). In "waiter" mode a task that released
//!    does not try again until another task has taken the lock, so every hand-off goes to a
//!    task that was already waiting; in "free-for-all" mode the releasing task may take the
//!    lock straight back (the table says how often it did).
//!
//! redis-server runs on CPU 1 and this process (one tokio worker) on CPU 0, as if on two
//! machines: on two shared cores each side steals the other's CPU and single rounds swing by
//! several times. Everything is counted in this process, over fixed durations; nothing
//! asserts on time.
//! Provider and baseline slices alternate (A B, B A, A B ...) so that a change in the
//! machine's load during a row hits both sides alike. Besides the rates, each throughput row
//! reports what the server counted per pair (`INFO commandstats`: commands, including those
//! run inside scripts, and time per `EVALSHA`) and the CPU time per pair of this process and
//! of redis-server.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coord_core::{CallKey, LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

/// The provider's default command timeout; the raw clients get the same response timeout.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(30);
const LEASE_MS: u64 = 30_000;

const WARM_UP: Duration = Duration::from_millis(300);
/// One throughput slice; every subject gets `ROUNDS` of them per cell.
const SLICE: Duration = Duration::from_millis(400);
const ROUNDS: usize = 16;

const HANDOFF_TASKS: usize = 8;
const HANDOFF_RUN: Duration = Duration::from_secs(3);
const HANDOFF_WARM_UP: Duration = Duration::from_millis(500);
const HOLD: Duration = Duration::from_millis(1);
const POLL_EVERY: Duration = Duration::from_millis(50);
/// The jittered poller sleeps a uniform 25..=75 ms (50 ms on average).
const POLL_JITTER_MS: std::ops::RangeInclusive<u64> = 25..=75;
const HANDOFF_LEASE_MS: u64 = 10_000;
const HANDOFF_WAIT: Duration = Duration::from_secs(10);

const RATIO_TARGET: f64 = 0.95;
const HANDOFF_P50_TARGET_MS: f64 = 0.15;

/// Release: delete the lock only while it still holds our token.
const COMPARE_AND_DELETE: &str = "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// Fenced acquire: take the lock and mint the next fencing token, atomically, with the same
/// guarantees as the provider's: the counter expires (so it does not stay in Redis forever)
/// and tokens still only grow, because a token is at least the server time in microseconds.
/// KEYS: lock, counter. ARGV: token, lease ms, counter retention ms. Returns the token, or 0
/// when the lock is held.
const SET_AND_MINT: &str = "\
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
local last = tonumber(redis.call('GET', KEYS[2]) or 0)
if last >= token then
  token = last + 1
end
redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[3])
return token";

/// How long the baseline keeps its fencing counter after a mint (the provider's floor).
const FENCE_RETENTION_MS: u64 = 3_600_000;

// ---------------------------------------------------------------------------------------------
// The raw clients

/// The hand-written redis-rs client: one multiplexed connection, scripts loaded up front.
#[derive(Clone)]
struct RawRs {
    conn: MultiplexedConnection,
    release_sha: String,
    acquire_fenced_sha: String,
}

impl RawRs {
    async fn connect(url: &str) -> RawRs {
        let client = redis::Client::open(url).expect("redis url");
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("raw redis-rs connection");
        let load = |src: &'static str| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(src)
                    .query_async::<String>(&mut conn)
                    .await
                    .expect("SCRIPT LOAD")
            }
        };
        let release_sha = load(COMPARE_AND_DELETE).await;
        let acquire_fenced_sha = load(SET_AND_MINT).await;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        RawRs {
            conn,
            release_sha,
            acquire_fenced_sha,
        }
    }

    /// One `SET NX PX`: true when `lock` is now ours, false when someone else holds it.
    async fn try_acquire(
        &self,
        conn: &mut MultiplexedConnection,
        lock: &str,
        token: &str,
        lease_ms: u64,
    ) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(lock)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .query_async(conn)
            .await
            .expect("raw SET NX PX");
        set.is_some()
    }

    async fn acquire_fenced(
        &self,
        conn: &mut MultiplexedConnection,
        lock: &str,
        fence: &str,
        token: &str,
    ) -> i64 {
        redis::cmd("EVALSHA")
            .arg(&self.acquire_fenced_sha)
            .arg(2)
            .arg(lock)
            .arg(fence)
            .arg(token)
            .arg(LEASE_MS)
            .arg(FENCE_RETENTION_MS)
            .query_async(conn)
            .await
            .expect("raw fenced acquire")
    }

    async fn release(&self, conn: &mut MultiplexedConnection, lock: &str, token: &str) -> bool {
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(lock)
            .arg(token)
            .query_async(conn)
            .await
            .expect("raw release");
        deleted == 1
    }

    /// Acquire+release pairs on `lock` until `deadline`; returns how many completed.
    async fn pairs_until(
        &self,
        lock: String,
        fence: String,
        fenced: bool,
        deadline: Instant,
    ) -> u64 {
        let mut conn = self.conn.clone();
        let mut done = 0;
        while Instant::now() < deadline {
            let token = OwnerToken::new().to_string();
            if fenced {
                let minted = self.acquire_fenced(&mut conn, &lock, &fence, &token).await;
                assert!(minted > 0, "the baseline's key was held");
                std::hint::black_box(minted);
            } else {
                let won = self.try_acquire(&mut conn, &lock, &token, LEASE_MS).await;
                assert!(won, "the baseline's key was held");
            }
            assert!(self.release(&mut conn, &lock, &token).await);
            done += 1;
        }
        done
    }
}

/// The same hand-written client over fred (a reference for the fred rows: it separates what
/// the client library costs from what the provider adds).
#[cfg(feature = "fred")]
mod raw_fred {
    use super::*;
    use fred::clients::Client as FredClient;
    use fred::prelude::{Builder, ClientLike, Config, Value};
    use fred::types::{ClusterHash, CustomCommand};

    #[derive(Clone)]
    pub struct RawFred {
        client: FredClient,
        release_sha: String,
        acquire_fenced_sha: String,
    }

    fn cmd(name: &'static str) -> CustomCommand {
        CustomCommand::new_static(name, ClusterHash::FirstKey, false)
    }

    impl RawFred {
        pub async fn connect(url: &str) -> RawFred {
            let config = Config::from_url(url).expect("fred url");
            let client = Builder::from_config(config)
                .with_performance_config(|perf| perf.default_command_timeout = COMMAND_TIMEOUT)
                .with_connection_config(|conn| conn.connection_timeout = COMMAND_TIMEOUT)
                .build()
                .expect("fred client");
            client.init().await.expect("raw fred connection");
            let load = |src: &'static str| {
                let client = client.clone();
                async move {
                    let sha: String = client
                        .custom(cmd("SCRIPT"), vec!["LOAD", src])
                        .await
                        .expect("SCRIPT LOAD");
                    sha
                }
            };
            let release_sha = load(COMPARE_AND_DELETE).await;
            let acquire_fenced_sha = load(SET_AND_MINT).await;
            RawFred {
                client,
                release_sha,
                acquire_fenced_sha,
            }
        }

        pub async fn quit(&self) {
            let _ = self.client.quit().await;
        }

        pub async fn pairs_until(
            &self,
            lock: String,
            fence: String,
            fenced: bool,
            deadline: Instant,
        ) -> u64 {
            let evalsha = || CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false);
            let mut done = 0;
            while Instant::now() < deadline {
                let token = OwnerToken::new().to_string();
                if fenced {
                    let minted: i64 = self
                        .client
                        .custom(
                            evalsha(),
                            vec![
                                Value::from(self.acquire_fenced_sha.as_str()),
                                Value::from(2),
                                Value::from(lock.as_str()),
                                Value::from(fence.as_str()),
                                Value::from(token.as_str()),
                                Value::from(LEASE_MS as i64),
                                Value::from(FENCE_RETENTION_MS as i64),
                            ],
                        )
                        .await
                        .expect("raw fred fenced acquire");
                    assert!(minted > 0, "the baseline's key was held");
                    std::hint::black_box(minted);
                } else {
                    let set: Option<String> = self
                        .client
                        .custom(
                            cmd("SET"),
                            vec![
                                Value::from(lock.as_str()),
                                Value::from(token.as_str()),
                                Value::from("NX"),
                                Value::from("PX"),
                                Value::from(LEASE_MS as i64),
                            ],
                        )
                        .await
                        .expect("raw fred SET NX PX");
                    assert!(set.is_some(), "the baseline's key was held");
                }
                let deleted: i64 = self
                    .client
                    .custom(
                        evalsha(),
                        vec![
                            Value::from(self.release_sha.as_str()),
                            Value::from(1),
                            Value::from(lock.as_str()),
                            Value::from(token.as_str()),
                        ],
                    )
                    .await
                    .expect("raw fred release");
                assert_eq!(deleted, 1);
                done += 1;
            }
            done
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Throughput

/// Something that does acquire+release pairs.
#[derive(Clone)]
enum Subject {
    Provider(RedisProvider),
    RawRs(RawRs),
    #[cfg(feature = "fred")]
    RawFred(raw_fred::RawFred),
}

impl Subject {
    async fn pairs_until(&self, cell: &str, i: usize, fenced: bool, deadline: Instant) -> u64 {
        match self {
            Subject::Provider(p) => {
                let key = CallKey::builder("bench", cell).part(&i).finish();
                let mut done = 0;
                while Instant::now() < deadline {
                    let owner = OwnerToken::new();
                    let grant = p
                        .acquire(LockRequest {
                            key: &key,
                            owner,
                            lease: LEASE,
                            wait: Duration::ZERO,
                            fenced,
                        })
                        .await
                        .expect("provider acquire")
                        .expect("the provider's key was held");
                    assert_eq!(grant.fencing_token.is_some(), fenced);
                    std::hint::black_box(grant);
                    let released = p.release(&key, owner).await.expect("provider release");
                    assert_eq!(released, ReleaseOutcome::Released);
                    done += 1;
                }
                done
            }
            Subject::RawRs(raw) => {
                let (lock, fence) = raw_names(cell, i);
                raw.pairs_until(lock, fence, fenced, deadline).await
            }
            #[cfg(feature = "fred")]
            Subject::RawFred(raw) => {
                let (lock, fence) = raw_names(cell, i);
                raw.pairs_until(lock, fence, fenced, deadline).await
            }
        }
    }
}

/// The raw clients' keys, laid out like the provider's (`ns:kind:{tag}`), in their own
/// namespace.
fn raw_names(cell: &str, i: usize) -> (String, String) {
    (
        format!("raw:lock:{{{cell}:{i}}}"),
        format!("raw:fence:{{{cell}:{i}}}"),
    )
}

struct Slice {
    pairs: u64,
    elapsed: Duration,
}

async fn run_pairs(
    subject: &Subject,
    cell: &str,
    tasks: usize,
    fenced: bool,
    length: Duration,
) -> Slice {
    let start = Instant::now();
    let deadline = start + length;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let subject = subject.clone();
            let cell = cell.to_owned();
            tokio::spawn(async move { subject.pairs_until(&cell, i, fenced, deadline).await })
        })
        .collect();
    let mut pairs = 0;
    for handle in handles {
        pairs += handle.await.expect("a bench task panicked");
    }
    Slice {
        pairs,
        elapsed: start.elapsed(),
    }
}

#[derive(Default, Clone)]
struct Tally {
    pairs: u64,
    elapsed: Duration,
    /// Pairs per second of each slice, in round order.
    rates: Vec<f64>,
    /// Server-side command calls and microseconds during this subject's slices.
    calls: BTreeMap<String, CommandStat>,
    /// CPU time of this process (all its threads) during the slices.
    client_cpu: Duration,
    /// CPU time of redis-server (user + system) during the slices, in seconds.
    server_cpu: f64,
}

#[derive(Default, Clone, Copy)]
struct CommandStat {
    calls: u64,
    usec: u64,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    /// Commands per pair, as the server counted them (including those run inside scripts).
    fn mix(&self) -> String {
        self.calls
            .iter()
            .filter(|(_, stat)| stat.calls > 0)
            .map(|(name, stat)| format!("{name} {:.2}", stat.calls as f64 / self.pairs as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Client and server CPU per pair, in microseconds.
    fn cpu_per_pair(&self) -> (f64, f64) {
        let pairs = self.pairs.max(1) as f64;
        (
            self.client_cpu.as_secs_f64() * 1e6 / pairs,
            self.server_cpu * 1e6 / pairs,
        )
    }

    /// Server time per `EVALSHA`, in microseconds (the script's own commands included).
    fn script_usec(&self) -> f64 {
        let stat = self.calls.get("evalsha").copied().unwrap_or_default();
        stat.usec as f64 / stat.calls.max(1) as f64
    }
}

/// CPU time used so far by every thread of this process.
fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU seconds used so far by the redis-server process, from `INFO cpu`.
fn server_cpu(server: &RedisServer) -> f64 {
    let info = server.command(&["INFO", "cpu"]).text().unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// `INFO commandstats`: calls and microseconds per command (lower-case name).
fn command_stats(server: &RedisServer) -> BTreeMap<String, CommandStat> {
    let info = server
        .command(&["INFO", "commandstats"])
        .text()
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
                    .parse::<u64>()
                    .ok()
            };
            Some((
                name.to_owned(),
                CommandStat {
                    calls: field("calls")?,
                    usec: field("usec")?,
                },
            ))
        })
        .collect()
}

fn stats_between(
    before: &BTreeMap<String, CommandStat>,
    after: &BTreeMap<String, CommandStat>,
) -> BTreeMap<String, CommandStat> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .map(|(name, a)| {
            let b = before.get(name).copied().unwrap_or_default();
            let diff = CommandStat {
                calls: a.calls - b.calls,
                usec: a.usec - b.usec,
            };
            (name.clone(), diff)
        })
        .collect()
}

/// Measures one cell: every subject warms up, then gets `ROUNDS` slices, the order of the
/// subjects reversed every other round.
fn measure_cell(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    subjects: &[&Subject],
    cell: &str,
    tasks: usize,
    fenced: bool,
) -> Vec<Tally> {
    for s in subjects {
        rt.block_on(run_pairs(s, cell, tasks, fenced, WARM_UP));
    }
    let mut tallies = vec![Tally::default(); subjects.len()];
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..subjects.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let before = command_stats(server);
            let server_before = server_cpu(server);
            let client_before = process_cpu();
            let slice = rt.block_on(run_pairs(subjects[i], cell, tasks, fenced, SLICE));
            let client_after = process_cpu();
            let server_after = server_cpu(server);
            let after = command_stats(server);
            let t = &mut tallies[i];
            t.client_cpu += client_after - client_before;
            t.server_cpu += server_after - server_before;
            t.pairs += slice.pairs;
            t.elapsed += slice.elapsed;
            t.rates
                .push(slice.pairs as f64 / slice.elapsed.as_secs_f64());
            for (name, diff) in stats_between(&before, &after) {
                let stat = t.calls.entry(name).or_default();
                stat.calls += diff.calls;
                stat.usec += diff.usec;
            }
        }
    }
    tallies
}

// ---------------------------------------------------------------------------------------------
// Hand-off

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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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

struct ThroughputRow {
    lock: &'static str,
    client: &'static str,
    tasks: usize,
    provider: Tally,
    raw: Tally,
    raw_fred: Option<Tally>,
}

/// Median, lowest and highest of the per-round ratios `a / b` (slices of one round ran back
/// to back, so each ratio compares like with like).
fn round_ratios(a: &Tally, b: &Tally) -> (f64, f64, f64) {
    let mut ratios: Vec<f64> = a.rates.iter().zip(&b.rates).map(|(x, y)| x / y).collect();
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    let median = if n % 2 == 1 {
        ratios[n / 2]
    } else {
        (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
    };
    (median, ratios[0], ratios[n - 1])
}

impl ThroughputRow {
    fn ratio(&self) -> f64 {
        self.provider.rate() / self.raw.rate()
    }

    /// Against the raw client over the same client library (what coord itself adds): raw
    /// fred for the fred rows, raw redis-rs otherwise.
    fn same_client_ratio(&self) -> f64 {
        match &self.raw_fred {
            Some(fred) => self.provider.rate() / fred.rate(),
            None => self.ratio(),
        }
    }
}

struct HandoffRow {
    client: &'static str,
    mode: &'static str,
    contender: &'static str,
    stats: HandoffStats,
    /// Whether the hand-off target applies to this row.
    target: bool,
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn machine_facts(server: &RedisServer) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let version = server
        .command(&["INFO", "server"])
        .text()
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("redis_version:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!(
        "machine: nproc {cores}, cpu {cpu}, load average at start {}",
        load_average()
    );
    println!("redis-server {version} on 127.0.0.1 (private instance, no persistence)");
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

/// Puts redis-server on CPU 1 and this process on CPU 0, so that neither side's CPU time is
/// taken by the other (as when they run on separate machines) and a slower client shows as
/// fewer pairs per second instead of being hidden by, or hiding, the server's work. Threads
/// created afterwards (the runtime's) inherit the placement. Returns false when the machine
/// has fewer than two CPUs or the kernel refuses.
fn pin_client_and_server(server: &RedisServer) -> bool {
    let Some(pid) = server.pid() else {
        return false;
    };
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return false;
    }
    let pin = |pid: libc::pid_t, cpu: usize| {
        // SAFETY: `set` is a plain bit mask owned by this frame; CPU_ZERO/CPU_SET only write
        // inside it, and sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &set) == 0
        }
    };
    // redis-server's background threads were created before this; pin every one of them.
    let threads: Vec<libc::pid_t> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    !threads.is_empty() && threads.iter().all(|&t| pin(t, 1)) && pin(0, 0)
}

fn main() {
    let fred = cfg!(feature = "fred");
    println!(
        "command: cargo bench -p coord-redis --bench redis_locks --features {}",
        if fred { "fred,testing" } else { "testing" }
    );
    let server = RedisServer::start();
    machine_facts(&server);
    let pinned = pin_client_and_server(&server);
    let workers = if pinned { 1 } else { 2 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!(
        "placement: {}",
        if pinned {
            "redis-server on CPU 1, this process (one tokio worker) on CPU 0, as on two machines"
        } else {
            "not pinned (fewer than two CPUs, or pinning refused): client and server share the CPUs"
        }
    );
    println!(
        "runtime: tokio multi-thread, {workers} worker(s); throughput rows: {ROUNDS} interleaved slices of \
         {SLICE:?} per side after {WARM_UP:?} of warm-up; hand-off rows: {HANDOFF_RUN:?} each \
         after {HANDOFF_WARM_UP:?} of warm-up"
    );

    let raw = rt.block_on(RawRs::connect(&server.url()));
    let rtt = rt.block_on(async {
        let mut conn = raw.conn.clone();
        let mut samples = Vec::with_capacity(2000);
        for _ in 0..2000 {
            let t = Instant::now();
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .expect("PING");
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        samples.sort_by(f64::total_cmp);
        samples
    });
    println!(
        "loopback PING round trip (raw redis-rs, sequential): p50 {:.3} ms, p99 {:.3} ms",
        percentile(&rtt, 0.5),
        percentile(&rtt, 0.99)
    );
    #[cfg(feature = "fred")]
    let raw_fred = rt.block_on(raw_fred::RawFred::connect(&server.url()));

    let clients: Vec<(Client, &'static str)> = vec![
        #[cfg(feature = "redis-client")]
        (Client::RedisRs, "redis-rs"),
        #[cfg(feature = "fred")]
        (Client::Fred, "fred"),
    ];

    let raw_subject = Subject::RawRs(raw.clone());
    let mut throughput = Vec::new();
    let mut handoff = Vec::new();
    let both_modes = [("waiter", true), ("free-for-all", false)];
    for (client, name) in clients {
        let provider = rt
            .block_on(
                RedisProvider::builder(server.url())
                    .client(client)
                    .command_timeout(COMMAND_TIMEOUT)
                    .connect(),
            )
            .expect("connect the provider");
        let provider_subject = Subject::Provider(provider.clone());
        #[allow(unused_mut)]
        let mut subjects = vec![&provider_subject, &raw_subject];
        #[cfg(feature = "fred")]
        let fred_subject = Subject::RawFred(raw_fred.clone());
        #[cfg(feature = "fred")]
        if client == Client::Fred {
            subjects.push(&fred_subject);
        }
        for (lock, fenced) in [("unfenced", false), ("fenced", true)] {
            for tasks in [1, 16] {
                let cell = format!("{}{}{tasks}", &name[..1], &lock[..1]);
                eprintln!("measuring {lock} pairs, {name}, {tasks} task(s)...");
                let mut tallies = measure_cell(&rt, &server, &subjects, &cell, tasks, fenced);
                let raw_fred = (tallies.len() > 2).then(|| tallies.remove(2));
                let raw_tally = tallies.remove(1);
                let provider_tally = tallies.remove(0);
                throughput.push(ThroughputRow {
                    lock,
                    client: name,
                    tasks,
                    provider: provider_tally,
                    raw: raw_tally,
                    raw_fred,
                });
            }
        }
        let contender = Contender::Provider(provider.clone());
        handoff.extend(handoff_rows(
            &rt,
            name,
            "provider (pub/sub)",
            &contender,
            &both_modes,
            true,
        ));
        rt.block_on(async move { drop(provider) });
    }
    // The polling baselines do not depend on the provider's client: measured once.
    let plain = Contender::Polling {
        raw: raw.clone(),
        jitter: false,
    };
    let jittered = Contender::Polling {
        raw: raw.clone(),
        jitter: true,
    };
    handoff.extend(handoff_rows(
        &rt,
        "redis-rs",
        "raw, poll every 50 ms",
        &plain,
        &both_modes,
        false,
    ));
    handoff.extend(handoff_rows(
        &rt,
        "redis-rs",
        "raw, poll every 25-75 ms",
        &jittered,
        &both_modes[..1],
        false,
    ));
    #[cfg(feature = "fred")]
    rt.block_on(raw_fred.quit());

    println!();
    println!(
        "## Acquire+release pairs per second (ratio = provider / raw redis-rs; target: provider / raw client over the same library >= {RATIO_TARGET:.2}x)"
    );
    println!();
    println!(
        "| lock | provider client | tasks | provider pairs/s | raw redis-rs pairs/s | ratio | per-round ratio median (min-max) | raw fred pairs/s | provider / raw fred | target |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for row in &throughput {
        let (median, lo, hi) = round_ratios(&row.provider, &row.raw);
        let (fred_rate, fred_ratio) = match &row.raw_fred {
            Some(t) => (
                format!("{:.0}", t.rate()),
                format!("{:.3}x", row.provider.rate() / t.rate()),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.3}x | {:.3} ({:.2}-{:.2}) | {} | {} | {} |",
            row.lock,
            row.client,
            row.tasks,
            row.provider.rate(),
            row.raw.rate(),
            row.ratio(),
            median,
            lo,
            hi,
            fred_rate,
            fred_ratio,
            verdict(row.same_client_ratio() >= RATIO_TARGET),
        );
    }
    println!();
    println!(
        "## Commands per pair, as the server counted them (calls made inside scripts included)"
    );
    println!();
    println!(
        "| lock | provider client | tasks | provider | raw redis-rs | server us per EVALSHA, provider / raw |"
    );
    println!("|---|---|---:|---|---|---:|");
    for row in &throughput {
        println!(
            "| {} | {} | {} | {} | {} | {:.2} / {:.2} |",
            row.lock,
            row.client,
            row.tasks,
            row.provider.mix(),
            row.raw.mix(),
            row.provider.script_usec(),
            row.raw.script_usec(),
        );
    }
    println!();
    println!("## CPU per pair in microseconds (client: this whole process; server: redis-server)");
    println!();
    println!(
        "| lock | provider client | tasks | client CPU provider | client CPU raw redis-rs | client CPU raw fred | server CPU provider | server CPU raw redis-rs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for row in &throughput {
        let (pc, ps) = row.provider.cpu_per_pair();
        let (rc, rs) = row.raw.cpu_per_pair();
        let fc = row
            .raw_fred
            .as_ref()
            .map_or("-".to_owned(), |t| format!("{:.1}", t.cpu_per_pair().0));
        println!(
            "| {} | {} | {} | {pc:.1} | {rc:.1} | {fc} | {ps:.1} | {rs:.1} |",
            row.lock, row.client, row.tasks,
        );
    }
    println!();
    println!(
        "## Hand-off: {HANDOFF_TASKS} tasks on one key, each holding it {HOLD:?} (ms from a release \
         returning to the next acquire returning; target: provider p50 <= {HANDOFF_P50_TARGET_MS} ms \
         in waiter mode)"
    );
    println!();
    println!(
        "| contender | client | mode | acquisitions/s | hand-offs | p50 ms | p90 ms | p99 ms | min ms | to same task | to a waiter | mean hold ms | target |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for row in &handoff {
        let s = &row.stats;
        println!(
            "| {} | {} | {} | {:.0} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {:.2} | {} |",
            row.contender,
            row.client,
            row.mode,
            s.per_sec,
            s.handoffs.len(),
            s.pct(0.50),
            s.pct(0.90),
            s.pct(0.99),
            s.handoffs.first().copied().unwrap_or(f64::NAN),
            s.to_same_task,
            s.to_waiter,
            s.mean_hold_ms,
            if row.target {
                verdict(s.pct(0.50) <= HANDOFF_P50_TARGET_MS)
            } else {
                "-"
            },
        );
    }
    println!();
    println!("load average at end: {}", load_average());
    drop(rt);
    drop(server);
}
