//! The cluster stampede: 4 processes × 100 concurrent callers on one cold key against one
//! redis-server, with `#[single_flight]` in `scope = "process"` and `scope = "cluster"`,
//! measured as body runs, total time (from "go" to the last caller answered) and Redis
//! commands per caller, from the `INFO commandstats` difference over the stampede divided by
//! the callers: those coord sends (`EVALSHA`, `SUBSCRIBE`, ...), and those Redis executes
//! (the same plus the commands run inside coord's scripts; the harness's own `INCR` per run,
//! its "go" `SET` and its `EXISTS` polls are left out).
//!
//! Also the leader's answer: from its body's return to the first of its process's callers
//! answered, for the process that ran the body (the mean over the four for `process`, where
//! each runs it): what the cluster leader adds there is waiting for its hand-over request to
//! leave the process.
//!
//! `cargo bench -p coord-redis --bench cluster_stampede` (`-- --rounds N` to repeat; default
//! 3). Like the process tests, it re-runs itself as child processes, with `COORD_BENCH_ROLE`
//! set.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, single_flight};
use coord_history::child_process::ChildProcess;
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisServer, command_at};

const ROLE: &str = "COORD_BENCH_ROLE";
const CALLERS: usize = 100;
const PROCESSES: usize = 4;
/// How long the parent waits for each line a child prints.
const CHILD_LINE_WITHIN: Duration = Duration::from_secs(120);
/// How long the body takes: a slow upstream, the case single-flight is for.
const BODY: Duration = Duration::from_millis(300);

/// Commands only the harness sends during a stampede (the "go" polls, the run counter, the
/// stats).
const HARNESS: &[&str] = &["exists", "incr", "info"];
/// Commands coord runs only inside its scripts, never sends itself.
const IN_SCRIPTS: &[&str] = &["get", "set", "del", "pexpire", "pttl", "publish"];

fn count_run(port: u16, ns: &str) {
    command_at(port, &["INCR", &format!("{ns}:w:runs")]).expect("count the run");
}

/// When this process's body last returned.
static BODY_RETURNED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

fn body_returns() {
    *BODY_RETURNED.lock().unwrap() = Some(Instant::now());
}

#[single_flight(key_from = "key", coordinator = c, name = "bench.stampede", scope = "cluster")]
async fn cluster_fetch(c: &Coordinator, key: &str, port: u16, ns: &str) -> Result<u64, CoordError> {
    count_run(port, ns);
    tokio::time::sleep(BODY).await;
    body_returns();
    Ok(42)
}

#[single_flight(key_from = "key", coordinator = c, name = "bench.stampede")]
async fn process_fetch(c: &Coordinator, key: &str, port: u16, ns: &str) -> Result<u64, CoordError> {
    count_run(port, ns);
    tokio::time::sleep(BODY).await;
    body_returns();
    Ok(42)
}

async fn child(role: &str) {
    let url = std::env::var("COORD_BENCH_URL").expect("COORD_BENCH_URL");
    let ns = std::env::var("COORD_BENCH_NS").expect("COORD_BENCH_NS");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let provider = RedisProvider::connect(&url).await.expect("connect");
    let c = Coordinator::builder()
        .namespace(ns.clone())
        .provider(provider)
        .build()
        .expect("coordinator");
    let cluster = role == "cluster";
    // Warm the connection and the scripts on another key, so the stampede measures itself.
    if cluster {
        cluster_fetch(&c, "warm-up", port, &ns)
            .await
            .expect("warm-up");
    } else {
        process_fetch(&c, "warm-up", port, &ns)
            .await
            .expect("warm-up");
    }
    *BODY_RETURNED.lock().unwrap() = None;
    println!("READY");
    let _ = std::io::stdout().flush();
    let go = format!("{ns}:w:go");
    while command_at(port, &["EXISTS", &go])
        .ok()
        .and_then(|r| r.int())
        != Some(1)
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let calls: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (c, ns) = (c.clone(), ns.clone());
            tokio::spawn(async move {
                let answer = if cluster {
                    cluster_fetch(&c, "cold", port, &ns).await
                } else {
                    process_fetch(&c, "cold", port, &ns).await
                };
                (answer, Instant::now())
            })
        })
        .collect();
    let mut first = None::<Instant>;
    for call in calls {
        let (answer, at) = call.await.expect("caller");
        assert_eq!(answer.expect("answer"), 42);
        first = Some(first.map_or(at, |f| f.min(at)));
    }
    match (*BODY_RETURNED.lock().unwrap(), first) {
        (Some(returned), Some(first)) => println!(
            "DONE leader_us={}",
            first.saturating_duration_since(returned).as_micros()
        ),
        _ => println!("DONE"),
    }
    let _ = std::io::stdout().flush();
}

/// A child process of this binary in `role`, reaching `server` under namespace `ns`.
fn start_player(role: &str, server: &RedisServer, ns: &str) -> ChildProcess {
    let mut command = ChildProcess::of_this_binary(ROLE, role);
    command
        .env("COORD_BENCH_URL", server.url())
        .env("COORD_BENCH_NS", ns);
    ChildProcess::spawn(command)
}

/// Calls per command, from `INFO commandstats`.
fn commandstats(port: u16) -> BTreeMap<String, u64> {
    let info = command_at(port, &["INFO", "commandstats"])
        .expect("INFO")
        .text()
        .unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

struct Round {
    runs: u64,
    total: Duration,
    /// Microseconds from the body's return to its process's first caller answered (mean over
    /// the processes that ran the body).
    leader_us: f64,
    sent_per_caller: f64,
    executed_per_caller: f64,
    by_command: BTreeMap<String, u64>,
}

fn stampede(server: &RedisServer, role: &str, round: usize) -> Round {
    let ns = format!("bench-{role}-{round}");
    let players: Vec<ChildProcess> = (0..PROCESSES)
        .map(|_| start_player(role, server, &ns))
        .collect();
    for p in &players {
        p.expect_line("READY", CHILD_LINE_WITHIN);
    }
    let runs_key = format!("{ns}:w:runs");
    command_at(server.port(), &["DEL", &runs_key]).expect("reset runs");
    let before = commandstats(server.port());
    let started = Instant::now();
    command_at(server.port(), &["SET", &format!("{ns}:w:go"), "1"]).expect("go");
    let mut leader_us = Vec::new();
    for p in &players {
        let line = p.expect_line("DONE", CHILD_LINE_WITHIN);
        if let Some(us) = line.strip_prefix("DONE leader_us=") {
            leader_us.push(us.parse::<f64>().expect("microseconds"));
        }
    }
    let total = started.elapsed();
    let after = commandstats(server.port());
    let runs = command_at(server.port(), &["GET", &runs_key])
        .expect("runs")
        .text()
        .map_or(0, |t| t.parse().expect("count"));
    let mut by_command: BTreeMap<String, u64> = after
        .iter()
        .filter(|(name, _)| !HARNESS.contains(&name.as_str()))
        .map(|(name, calls)| (name.clone(), calls - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, delta)| *delta > 0)
        .collect();
    // The harness's "go".
    if let Some(set) = by_command.get_mut("set") {
        *set -= 1;
    }
    by_command.retain(|_, calls| *calls > 0);
    let executed: u64 = by_command.values().sum();
    let sent: u64 = by_command
        .iter()
        .filter(|(name, _)| !IN_SCRIPTS.contains(&name.as_str()))
        .map(|(_, calls)| calls)
        .sum();
    let callers = (PROCESSES * CALLERS) as f64;
    Round {
        runs,
        total,
        leader_us: leader_us.iter().sum::<f64>() / leader_us.len().max(1) as f64,
        sent_per_caller: sent as f64 / callers,
        executed_per_caller: executed as f64 / callers,
        by_command,
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(child(&role));
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    let server = RedisServer::start();
    println!(
        "cluster stampede: {PROCESSES} processes x {CALLERS} callers, one cold key, body {BODY:?}"
    );
    println!(
        "| scope | round | body runs | total | leader's answer after its body | commands sent per caller | commands executed per caller | executed, by command |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for role in ["process", "cluster"] {
        for round in 0..rounds {
            let r = stampede(&server, role, round);
            let commands: Vec<String> = r
                .by_command
                .iter()
                .map(|(name, calls)| format!("{name} {calls}"))
                .collect();
            println!(
                "| {role} | {round} | {} | {:.0} ms | {:.0} µs | {:.4} | {:.4} | {} |",
                r.runs,
                r.total.as_secs_f64() * 1000.0,
                r.leader_us,
                r.sent_per_caller,
                r.executed_per_caller,
                commands.join(", ")
            );
        }
    }
}
