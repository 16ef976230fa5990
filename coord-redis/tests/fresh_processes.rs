//! The cancellation repro of issue "a dropped call never leaves a key blocked", in fresh
//! processes: each run is a new process that connects to one real redis-server and calls
//! `#[idempotent]` (with `on_abandoned` "rerun" and "fail") and `#[distributed_lock]` on 20
//! distinct keys, each call cut off by a `tokio::time::timeout` of 0 to 140 µs (the way a
//! gateway timeout or a disconnecting HTTP client drops a handler). 1.5 s later it calls the
//! same keys again: none may answer `InFlight`, `OutcomeUnknown` or "lock not acquired".
//!
//! The first calls of a process are the ones that matter (connections being dialled, scripts
//! not yet loaded): that is why every run is a new process. This test binary has its own
//! `main` (`harness = false`): run without `COORD_TEST_ROLE` it starts a redis-server and runs
//! `COORD_FRESH_RUNS` runs (default 10) per client, each a child process of this same binary.
//! It ends with `fresh_processes: N runs, K keys left blocked` and fails if K is not 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, distributed_lock, idempotent};
use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;

const ROLE: &str = "COORD_TEST_ROLE";
const KEYS: u32 = 20;

#[idempotent(key_from = "k", coordinator = c, name = "fresh.idem", in_flight_lease = "30s")]
async fn idem_rerun(c: &Coordinator, k: u32) -> Result<u32, CoordError> {
    Ok(k)
}

#[idempotent(key_from = "k", coordinator = c, name = "fresh.idem_fail", in_flight_lease = "30s", on_abandoned = "fail")]
async fn idem_fail(c: &Coordinator, k: u32) -> Result<u32, CoordError> {
    Ok(k)
}

#[distributed_lock(key_from = "k", coordinator = c, name = "fresh.lock", lease = "30s", wait = "0s")]
async fn locked(c: &Coordinator, k: u32) -> Result<u32, CoordError> {
    Ok(k)
}

/// A small generator for the cut-offs (a test's randomness needs no crate).
struct Cutoffs(u64);

impl Cutoffs {
    fn next(&mut self) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_micros(self.0 % 141)
    }
}

/// One run: the cut-off calls, a pause, then the same keys again. Prints one `RESULT` line.
async fn child() {
    let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
    let ns = std::env::var("COORD_TEST_NS").expect("COORD_TEST_NS");
    let client = match std::env::var("COORD_TEST_CLIENT").as_deref() {
        #[cfg(feature = "fred")]
        Ok("fred") => Client::Fred,
        #[cfg(feature = "redis-client")]
        Ok("redis_rs") => Client::RedisRs,
        other => panic!("COORD_TEST_CLIENT {other:?} is not a client of this build"),
    };
    let provider = RedisProvider::builder(url)
        .client(client)
        .connect()
        .await
        .expect("connect");
    let c = Coordinator::builder()
        .namespace(ns)
        .provider(provider)
        .build()
        .expect("coordinator");
    let seed = u64::from(std::process::id()) ^ (Instant::now().elapsed().as_nanos() as u64);
    let mut cutoffs = Cutoffs(seed | 1);
    let mut dropped = 0;
    for k in 0..KEYS {
        dropped += tokio::time::timeout(cutoffs.next(), idem_rerun(&c, k))
            .await
            .is_err() as u32;
        dropped += tokio::time::timeout(cutoffs.next(), idem_fail(&c, k))
            .await
            .is_err() as u32;
        dropped += tokio::time::timeout(cutoffs.next(), locked(&c, k))
            .await
            .is_err() as u32;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut blocked = Vec::new();
    for k in 0..KEYS {
        if let Err(err) = idem_rerun(&c, k).await {
            blocked.push(format!("idem {k}: {err}"));
        }
        if let Err(err) = idem_fail(&c, k).await {
            blocked.push(format!("idem_fail {k}: {err}"));
        }
        if let Err(err) = locked(&c, k).await {
            blocked.push(format!("lock {k}: {err}"));
        }
    }
    println!("RESULT dropped={dropped} blocked={}", blocked.len());
    for b in blocked {
        println!("BLOCKED {b}");
    }
}

/// Runs one fresh process; returns (calls dropped, keys left blocked, what was blocked).
fn run_once(server: &RedisServer, client: &str, run: usize) -> (u32, u32, Vec<String>) {
    let output = Command::new(std::env::current_exe().expect("own path"))
        .env(ROLE, "repro")
        .env("COORD_TEST_URL", server.url())
        .env("COORD_TEST_NS", format!("fresh-{client}-{run}"))
        .env("COORD_TEST_CLIENT", client)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .expect("start a child process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{client} run {run}: the child failed ({}): {stdout}",
        output.status
    );
    let result = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("{client} run {run}: no RESULT line in {stdout}"));
    let field = |name: &str| -> u32 {
        result
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{client} run {run}: no {name} in {result}"))
    };
    let blocked_lines = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("BLOCKED "))
        .map(|l| format!("{client} run {run}: {l}"))
        .collect();
    (field("dropped="), field("blocked="), blocked_lines)
}

fn main() {
    if std::env::var(ROLE).is_ok() {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(child());
        return;
    }
    let runs: usize = std::env::var("COORD_FRESH_RUNS")
        .ok()
        .map(|v| v.parse().expect("COORD_FRESH_RUNS is a number"))
        .unwrap_or(10);
    let server = RedisServer::start();
    let clients: Vec<&str> = [
        #[cfg(feature = "redis-client")]
        "redis_rs",
        #[cfg(feature = "fred")]
        "fred",
    ]
    .into_iter()
    .collect();
    let started = Instant::now();
    let (mut dropped, mut blocked, mut what) = (0, 0, Vec::new());
    for run in 0..runs {
        for client in &clients {
            let (d, b, w) = run_once(&server, client, run);
            dropped += d;
            blocked += b;
            what.extend(w);
        }
    }
    let total = runs * clients.len();
    println!(
        "fresh_processes: {total} runs ({runs} per client), {dropped} calls cut off, {blocked} keys left blocked, in {:.1?}",
        started.elapsed()
    );
    for w in &what {
        println!("  {w}");
    }
    if blocked != 0 {
        std::process::exit(1);
    }
}
