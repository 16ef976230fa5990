//! Lock throughput of `RedisProvider`: acquire+release pairs per second through the
//! `LockProvider` trait, beside a hand-written baseline that does the same work, measured in
//! the same run against one private redis-server on loopback.
//!
//! Run: `cargo bench -p coord-redis --bench redis_throughput --features fred`
//! (without `fred`, only the redis-rs rows are measured; about 4 minutes).
//!
//! 1. Unfenced acquire+release pairs per second through the `LockProvider` trait, against a
//!    raw client on ONE redis-rs multiplexed connection: `SET key token NX PX ms`, then
//!    `EVALSHA` of a compare-and-delete script.
//! 2. The same with `fenced: true`; the baseline does the same work by hand: one `EVALSHA` of
//!    a script that takes the lock and mints a fencing token from an expiring counter that
//!    only grows (`max(last + 1, server time in µs)`), then the same compare-and-delete.
//!
//! At 1 task (sequential pairs on one key), 16 tasks on 16 keys and 256 tasks on 256 keys.
//! The fred rows also have the same raw client over fred as a second baseline: it separates
//! what the client library costs from what the provider adds, and the target is judged
//! against it; and that raw fred client once more with fred's write coalescing (its automatic
//! pipelining: many commands fed to the socket per flush) turned off, to show what it gives.
//!
//! The server's limit for the same work: a third baseline sends each pair's two commands
//! (the same ones as the raw client's) as one pipeline over the same redis-rs connection,
//! so a pair costs one round trip instead of two; with as many tasks, that is as close to
//! what redis-server itself sustains as this client gets. The table gives the provider's
//! rate as a share of it.
//!
//! redis-server runs on CPU 1 and this process (one tokio worker) on CPU 0 (see `support`).
//! Provider and baseline slices alternate (A B, B A, A B ...) so that a change in the
//! machine's load during a row hits both sides alike. Besides the rates, each row reports what
//! the server counted per pair (`INFO commandstats`: commands, including those run inside
//! scripts, and time per `EVALSHA`) and the CPU time per pair of this process and of
//! redis-server.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_redis::RedisProvider;
use coord_redis_testing::RedisServer;
use redis::aio::MultiplexedConnection;

use support::{Align, RawRs, Session, Table, verdict};

const LEASE: Duration = Duration::from_secs(30);
const LEASE_MS: u64 = 30_000;

const WARM_UP: Duration = Duration::from_millis(300);
/// One throughput slice; every subject gets `ROUNDS` of them per cell.
const SLICE: Duration = Duration::from_millis(400);
const ROUNDS: usize = 10;
/// Concurrent tasks (each on its own key) of the rows.
const TASKS: [usize; 3] = [1, 16, 256];

const RATIO_TARGET: f64 = 0.95;

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

/// When a subject's loop of pairs stops: at a deadline (the throughput slices) or after a
/// fixed number of pairs (the instruction-count profile, where time means nothing).
#[derive(Clone, Copy)]
enum Until {
    Deadline(Instant),
    Pairs(u64),
}

impl Until {
    fn more(self, done: u64) -> bool {
        match self {
            Until::Deadline(deadline) => Instant::now() < deadline,
            Until::Pairs(pairs) => done < pairs,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The raw clients

/// The raw redis-rs client with the fenced acquire script loaded as well.
#[derive(Clone)]
struct RawPairs {
    raw: RawRs,
    acquire_fenced_sha: String,
}

impl RawPairs {
    async fn new(raw: RawRs) -> RawPairs {
        let acquire_fenced_sha =
            support::raw::script_load(&mut raw.conn.clone(), SET_AND_MINT).await;
        RawPairs {
            raw,
            acquire_fenced_sha,
        }
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

    /// Acquire+release pairs on `lock` until `until` says stop, each pair's two commands sent as
    /// one pipeline (one round trip); returns how many completed.
    async fn pipelined_until(
        &self,
        lock: String,
        fence: String,
        fenced: bool,
        until: Until,
    ) -> u64 {
        let mut conn = self.raw.conn.clone();
        let mut done = 0;
        while until.more(done) {
            let token = OwnerToken::new().to_string();
            let mut pipe = redis::pipe();
            if fenced {
                pipe.cmd("EVALSHA")
                    .arg(&self.acquire_fenced_sha)
                    .arg(2)
                    .arg(&lock)
                    .arg(&fence)
                    .arg(&token)
                    .arg(LEASE_MS)
                    .arg(FENCE_RETENTION_MS);
            } else {
                pipe.cmd("SET")
                    .arg(&lock)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(LEASE_MS);
            }
            pipe.cmd("EVALSHA")
                .arg(&self.raw.release_sha)
                .arg(1)
                .arg(&lock)
                .arg(&token);
            let (taken, deleted): (redis::Value, i64) = pipe
                .query_async(&mut conn)
                .await
                .expect("raw pipelined pair");
            assert!(
                !matches!(taken, redis::Value::Nil | redis::Value::Int(0)),
                "the baseline's key was held"
            );
            assert_eq!(deleted, 1);
            done += 1;
        }
        done
    }

    /// Acquire+release pairs on `lock` until `until` says stop; returns how many completed.
    async fn pairs_until(&self, lock: String, fence: String, fenced: bool, until: Until) -> u64 {
        let mut conn = self.raw.conn.clone();
        let mut done = 0;
        while until.more(done) {
            let token = OwnerToken::new().to_string();
            if fenced {
                let minted = self.acquire_fenced(&mut conn, &lock, &fence, &token).await;
                assert!(minted > 0, "the baseline's key was held");
                std::hint::black_box(minted);
            } else {
                let won = self
                    .raw
                    .try_acquire(&mut conn, &lock, &token, LEASE_MS)
                    .await;
                assert!(won, "the baseline's key was held");
            }
            assert!(self.raw.release(&mut conn, &lock, &token).await);
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
    use crate::support::COMMAND_TIMEOUT;
    use crate::support::raw::COMPARE_AND_DELETE;
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
        /// A client with fred's automatic pipelining on (fred's default, and the provider's)
        /// or off. fred 10 always pipelines (it sends a command without waiting for the
        /// replies before it) and coalesces writes: up to `max_feed_count` commands (200 by
        /// default) are fed to the socket before one flush. "Off" here is a flush after every
        /// command (`max_feed_count = 0`).
        pub async fn connect(url: &str, auto_pipeline: bool) -> RawFred {
            let config = Config::from_url(url).expect("fred url");
            let client = Builder::from_config(config)
                .with_performance_config(|perf| {
                    perf.default_command_timeout = COMMAND_TIMEOUT;
                    if !auto_pipeline {
                        perf.max_feed_count = 0;
                    }
                })
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
            until: Until,
        ) -> u64 {
            let evalsha = || CustomCommand::new_static("EVALSHA", ClusterHash::Offset(2), false);
            let mut done = 0;
            while until.more(done) {
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
    RawRs(RawPairs),
    /// The raw redis-rs client, each pair one pipeline.
    Pipelined(RawPairs),
    #[cfg(feature = "fred")]
    RawFred(raw_fred::RawFred),
}

impl Subject {
    async fn pairs_until(&self, cell: &str, i: usize, fenced: bool, until: Until) -> u64 {
        match self {
            Subject::Provider(p) => {
                let key = CallKey::builder("bench", cell).part(&i).finish();
                let mut done = 0;
                while until.more(done) {
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
                raw.pairs_until(lock, fence, fenced, until).await
            }
            Subject::Pipelined(raw) => {
                let (lock, fence) = raw_names(cell, i);
                raw.pipelined_until(lock, fence, fenced, until).await
            }
            #[cfg(feature = "fred")]
            Subject::RawFred(raw) => {
                let (lock, fence) = raw_names(cell, i);
                raw.pairs_until(lock, fence, fenced, until).await
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
    let until = Until::Deadline(start + length);
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let subject = subject.clone();
            let cell = cell.to_owned();
            tokio::spawn(async move { subject.pairs_until(&cell, i, fenced, until).await })
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
// Instruction-count profile

/// `COORD_BENCH_PROFILE=<subject>:<pairs>` runs only `pairs` sequential fenced pairs of one
/// subject (`provider-redis-rs`, `raw-redis-rs`, `provider-fred`, `raw-fred`) on one key, for
/// running the bench under `valgrind --tool=callgrind`: instructions are counted, not
/// seconds, so the figures do not depend on what else the host is doing. Two runs with N and
/// 2N pairs give the instructions of N pairs without the start-up (see BENCHMARKS.md).
/// `<subject>:<pairs>:<tasks>` spreads the pairs over that many concurrent tasks, each on its
/// own key (as the throughput rows do); `<subject>:<pairs>:<tasks>:unfenced` runs unfenced
/// pairs instead. Under `strace -c -f` the same mode counts system calls per pair.
const PROFILE_VAR: &str = "COORD_BENCH_PROFILE";

/// With `COORD_BENCH_PROFILE_PAUSE` set, the profile mode prints `pid <pid>` and waits for a
/// line on its standard input before its pairs, so that a counter can be attached to this
/// process alone (`perf stat -p <pid>`: the system calls of the pairs at full speed, without
/// redis-server's, which a counter started with the bench would count too).
const PAUSE_VAR: &str = "COORD_BENCH_PROFILE_PAUSE";

/// `COORD_BENCH_TASKS=16,256` measures only those task counts of [`TASKS`] (all by default),
/// for repeating the rows a question is about without the rest.
const TASKS_VAR: &str = "COORD_BENCH_TASKS";

/// The task counts this run measures.
fn task_counts() -> Vec<usize> {
    let Ok(list) = std::env::var(TASKS_VAR) else {
        return TASKS.to_vec();
    };
    let chosen: Vec<usize> = list
        .split(',')
        .map(|t| {
            t.trim()
                .parse()
                .ok()
                .filter(|t| TASKS.contains(t))
                .unwrap_or_else(|| panic!("{TASKS_VAR}: {t:?} is not one of {TASKS:?}"))
        })
        .collect();
    assert!(!chosen.is_empty(), "{TASKS_VAR} names no task count");
    chosen
}

fn profile(session: &Session, raw: RawPairs, spec: &str) {
    let mut parts = spec.split(':');
    let (name, pairs, tasks, fenced) = (|| {
        let name = parts.next()?;
        let pairs = parts.next()?.parse::<u64>().ok()?;
        let tasks = match parts.next() {
            Some(tasks) => tasks.parse::<u64>().ok().filter(|t| *t > 0)?,
            None => 1,
        };
        let fenced = match parts.next() {
            None | Some("fenced") => true,
            Some("unfenced") => false,
            Some(_) => return None,
        };
        parts
            .next()
            .is_none()
            .then_some((name, pairs, tasks, fenced))
    })()
    .unwrap_or_else(|| {
        panic!("{PROFILE_VAR} is <subject>:<pairs>[:<tasks>[:unfenced]], not {spec:?}")
    });
    let rt = &session.rt;
    let subject = match name {
        "provider-redis-rs" | "provider-fred" => {
            let client = support::clients()
                .into_iter()
                .find(|(_, client)| name.ends_with(client))
                .unwrap_or_else(|| panic!("this build has no {name} client (see its features)"))
                .0;
            Subject::Provider(session.provider(client))
        }
        "raw-redis-rs" => Subject::RawRs(raw),
        #[cfg(feature = "fred")]
        "raw-fred" => {
            Subject::RawFred(rt.block_on(raw_fred::RawFred::connect(&session.server.url(), true)))
        }
        other => panic!("unknown profile subject {other:?}"),
    };
    let each = pairs / tasks;
    if std::env::var_os(PAUSE_VAR).is_some() {
        eprintln!("pid {}", std::process::id());
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .expect("read the go-ahead line");
    }
    let done = rt.block_on(async {
        let handles: Vec<_> = (0..tasks as usize)
            .map(|i| {
                let subject = subject.clone();
                tokio::spawn(async move {
                    subject
                        .pairs_until("profile", i, fenced, Until::Pairs(each))
                        .await
                })
            })
            .collect();
        let mut done = 0;
        for handle in handles {
            done += handle.await.expect("a profile task panicked");
        }
        done
    });
    assert_eq!(done, each * tasks);
    let lock = if fenced { "fenced" } else { "unfenced" };
    println!("profile: {done} {lock} pairs of {name} over {tasks} task(s)");
    if let Subject::Provider(provider) = subject {
        session.close(provider);
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
    pipelined: Tally,
    raw_fred: Option<Tally>,
    /// Raw fred without automatic pipelining.
    raw_fred_serial: Option<Tally>,
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

fn main() {
    let session = Session::start(
        "redis_throughput",
        &format!(
            "throughput rows: {ROUNDS} interleaved slices of {SLICE:?} per side after {WARM_UP:?} of warm-up"
        ),
    );
    let rt = &session.rt;
    let server = &session.server;
    let raw = rt.block_on(RawPairs::new(session.raw.clone()));
    if let Ok(spec) = std::env::var(PROFILE_VAR) {
        profile(&session, raw, &spec);
        session.finish();
        return;
    }
    #[cfg(feature = "fred")]
    let raw_fred = rt.block_on(raw_fred::RawFred::connect(&server.url(), true));
    #[cfg(feature = "fred")]
    let raw_fred_serial = rt.block_on(raw_fred::RawFred::connect(&server.url(), false));

    let task_counts = task_counts();
    let pipelined_subject = Subject::Pipelined(raw.clone());
    let raw_subject = Subject::RawRs(raw);
    let mut throughput = Vec::new();
    for (client, name) in support::clients() {
        let provider = session.provider(client);
        let provider_subject = Subject::Provider(provider.clone());
        #[allow(unused_mut)]
        let mut subjects = vec![&provider_subject, &raw_subject, &pipelined_subject];
        #[cfg(feature = "fred")]
        let fred_subject = Subject::RawFred(raw_fred.clone());
        #[cfg(feature = "fred")]
        let fred_serial_subject = Subject::RawFred(raw_fred_serial.clone());
        #[cfg(feature = "fred")]
        if client == coord_redis::Client::Fred {
            subjects.push(&fred_subject);
            subjects.push(&fred_serial_subject);
        }
        for (lock, fenced) in [("unfenced", false), ("fenced", true)] {
            for &tasks in &task_counts {
                let cell = format!("{}{}{tasks}", &name[..1], &lock[..1]);
                eprintln!("measuring {lock} pairs, {name}, {tasks} task(s)...");
                let mut tallies =
                    measure_cell(rt, server, &subjects, &cell, tasks, fenced).into_iter();
                let mut next = || tallies.next();
                let (provider, raw, pipelined) = (
                    next().expect("provider"),
                    next().expect("raw"),
                    next().expect("pipelined"),
                );
                throughput.push(ThroughputRow {
                    lock,
                    client: name,
                    tasks,
                    provider,
                    raw,
                    pipelined,
                    raw_fred: next(),
                    raw_fred_serial: next(),
                });
            }
        }
        drop(provider_subject);
        session.close(provider);
    }
    #[cfg(feature = "fred")]
    rt.block_on(raw_fred.quit());
    #[cfg(feature = "fred")]
    rt.block_on(raw_fred_serial.quit());

    use Align::{Left, Right};
    let rates = Table::start(
        &format!(
            "Acquire+release pairs per second (ratio = provider / raw redis-rs; target: provider / raw client over the same library >= {RATIO_TARGET:.2}x)"
        ),
        &[
            ("lock", Left),
            ("provider client", Left),
            ("tasks", Right),
            ("provider pairs/s", Right),
            ("raw redis-rs pairs/s", Right),
            ("ratio", Right),
            ("per-round ratio median (min-max)", Right),
            ("raw fred pairs/s", Right),
            ("provider / raw fred", Right),
            ("target", Left),
        ],
    );
    for row in &throughput {
        let (median, lo, hi) = round_ratios(&row.provider, &row.raw);
        let (fred_rate, fred_ratio) = match &row.raw_fred {
            Some(t) => (
                format!("{:.0}", t.rate()),
                format!("{:.3}x", row.provider.rate() / t.rate()),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        rates.row(&[
            row.lock.to_owned(),
            row.client.to_owned(),
            row.tasks.to_string(),
            format!("{:.0}", row.provider.rate()),
            format!("{:.0}", row.raw.rate()),
            format!("{:.3}x", row.ratio()),
            format!("{median:.3} ({lo:.2}-{hi:.2})"),
            fred_rate,
            fred_ratio,
            verdict(row.same_client_ratio() >= RATIO_TARGET).to_owned(),
        ]);
    }
    let limit = Table::start(
        "Against the server's limit: the same commands by hand, each pair one pipeline (one round trip), same tasks; and fred's automatic pipelining",
        &[
            ("lock", Left),
            ("provider client", Left),
            ("tasks", Right),
            ("provider pairs/s", Right),
            ("hand pipeline pairs/s", Right),
            ("provider / pipeline", Right),
            ("raw fred pairs/s, auto-pipelining on / off", Right),
        ],
    );
    for row in &throughput {
        let fred = match (&row.raw_fred, &row.raw_fred_serial) {
            (Some(on), Some(off)) => format!(
                "{:.0} / {:.0} ({:.2}x)",
                on.rate(),
                off.rate(),
                on.rate() / off.rate()
            ),
            _ => "-".to_owned(),
        };
        limit.row(&[
            row.lock.to_owned(),
            row.client.to_owned(),
            row.tasks.to_string(),
            format!("{:.0}", row.provider.rate()),
            format!("{:.0}", row.pipelined.rate()),
            format!(
                "{:.0} %",
                100.0 * row.provider.rate() / row.pipelined.rate()
            ),
            fred,
        ]);
    }
    let commands = Table::start(
        "Commands per pair, as the server counted them (calls made inside scripts included)",
        &[
            ("lock", Left),
            ("provider client", Left),
            ("tasks", Right),
            ("provider", Left),
            ("raw redis-rs", Left),
            ("server us per EVALSHA, provider / raw", Right),
        ],
    );
    for row in &throughput {
        commands.row(&[
            row.lock.to_owned(),
            row.client.to_owned(),
            row.tasks.to_string(),
            row.provider.mix(),
            row.raw.mix(),
            format!(
                "{:.2} / {:.2}",
                row.provider.script_usec(),
                row.raw.script_usec()
            ),
        ]);
    }
    let cpu = Table::start(
        "CPU per pair in microseconds (client: this whole process; server: redis-server)",
        &[
            ("lock", Left),
            ("provider client", Left),
            ("tasks", Right),
            ("client CPU provider", Right),
            ("client CPU raw redis-rs", Right),
            ("client CPU raw fred", Right),
            ("server CPU provider", Right),
            ("server CPU raw redis-rs", Right),
        ],
    );
    for row in &throughput {
        let (pc, ps) = row.provider.cpu_per_pair();
        let (rc, rs) = row.raw.cpu_per_pair();
        let fc = row
            .raw_fred
            .as_ref()
            .map_or("-".to_owned(), |t| format!("{:.1}", t.cpu_per_pair().0));
        cpu.row(&[
            row.lock.to_owned(),
            row.client.to_owned(),
            row.tasks.to_string(),
            format!("{pc:.1}"),
            format!("{rc:.1}"),
            fc,
            format!("{ps:.1}"),
            format!("{rs:.1}"),
        ]);
    }
    session.finish();
}
