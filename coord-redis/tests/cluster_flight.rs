//! `#[single_flight(scope = "cluster")]` across real processes against one real redis-server:
//! 4 processes × 100 concurrent callers on one key run the body once (4 times with
//! `scope = "process"`), a leader killed with SIGKILL mid-flight is replaced by exactly one
//! follower, and followers on other processes see the leader's error.
//!
//! This test binary has its own `main` (`harness = false`): run without `COORD_TEST_ROLE` it
//! starts a redis-server and runs the scenarios, each of which re-runs this same binary as
//! child processes with `COORD_TEST_ROLE` set to the part they play. It ends with the line
//! `cluster_flight: N passed, M failed` and a non-zero exit status when anything failed.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, single_flight};
use coord_history::child_process::{ChildProcess, field, run_scenarios};
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisServer, command_at};
use serde::{Deserialize, Serialize};

const ROLE: &str = "COORD_TEST_ROLE";
const CALLERS: usize = 100;
const PROCESSES: usize = 4;

// ---------------------------------------------------------------- child processes

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum RefreshError {
    Upstream(String),
    Coord(String),
}

impl From<CoordError> for RefreshError {
    fn from(err: CoordError) -> Self {
        RefreshError::Coord(err.to_string())
    }
}

fn witness(port: u16, args: &[&str]) -> i64 {
    command_at(port, args)
        .expect("witness command")
        .int()
        .unwrap_or(0)
}

/// The body every scenario runs: counts its runs on the server, says it started (the parent
/// kills the first process that does, in the crash scenario), and answers after `ms`.
async fn body(port: u16, ns: &str, ms: u64, fail: bool) -> Result<String, RefreshError> {
    witness(port, &["INCR", &format!("{ns}:w:runs")]);
    println!("BODY {}", std::process::id());
    let _ = std::io::stdout().flush();
    tokio::time::sleep(Duration::from_millis(ms)).await;
    if fail {
        return Err(RefreshError::Upstream(format!(
            "failed in pid {}",
            std::process::id()
        )));
    }
    Ok(format!("value-from-pid-{}", std::process::id()))
}

#[single_flight(key_from = "key", coordinator = c, name = "xflight.refresh", scope = "cluster", lease = "2s")]
async fn cluster_refresh(
    c: &Coordinator,
    key: &str,
    port: u16,
    ns: &str,
    ms: u64,
    fail: bool,
) -> Result<String, RefreshError> {
    body(port, ns, ms, fail).await
}

#[single_flight(key_from = "key", coordinator = c, name = "xflight.refresh")]
async fn process_refresh(
    c: &Coordinator,
    key: &str,
    port: u16,
    ns: &str,
    ms: u64,
    fail: bool,
) -> Result<String, RefreshError> {
    body(port, ns, ms, fail).await
}

async fn child(role: &str) {
    let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
    let ns = std::env::var("COORD_TEST_NS").expect("COORD_TEST_NS");
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let provider = RedisProvider::connect(&url).await.expect("connect");
    let c = Coordinator::builder()
        .namespace(ns.clone())
        .provider(provider)
        .build()
        .expect("coordinator");
    let (cluster, ms, fail) = match role {
        "cluster" => (true, 300, false),
        "process" => (false, 300, false),
        "cluster-slow" => (true, 1000, false),
        "cluster-failing" => (true, 300, true),
        other => panic!("unknown role {other}"),
    };
    // Start together: every process is connected before the parent says go.
    println!("READY");
    let _ = std::io::stdout().flush();
    let go = format!("{ns}:w:go");
    while command_at(port, &["EXISTS", &go])
        .ok()
        .and_then(|r| r.int())
        != Some(1)
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (c, ns) = (c.clone(), ns.clone());
            tokio::spawn(async move {
                if cluster {
                    cluster_refresh(&c, "k", port, &ns, ms, fail).await
                } else {
                    process_refresh(&c, "k", port, &ns, ms, fail).await
                }
            })
        })
        .collect();
    let mut answers = BTreeSet::new();
    let mut answered = 0;
    for call in calls {
        let answer = call.await.expect("caller task");
        answered += 1;
        answers.insert(format!("{answer:?}"));
    }
    let answers: Vec<String> = answers.into_iter().collect();
    println!(
        "RESULT answered={answered} ms={} answers={}",
        started.elapsed().as_millis(),
        answers.join("|")
    );
    let _ = std::io::stdout().flush();
    // A leader answers its callers before its hand-over is written (in the background): an
    // application lets that finish by shutting the coordinator down before it exits, or its
    // followers elsewhere wait out the claim's lease and run the body themselves.
    let _ = c.shutdown(Duration::from_secs(10)).await;
}

// ---------------------------------------------------------------- the parent side

/// A child process of this binary in `role`, reaching `server` under namespace `ns`.
fn start_player(role: &str, server: &RedisServer, ns: &str) -> ChildProcess {
    let mut command = ChildProcess::of_this_binary(ROLE, role);
    command
        .env("COORD_TEST_URL", server.url())
        .env("COORD_TEST_NS", ns)
        .env("RUST_LOG", "error");
    ChildProcess::spawn(command)
}

/// What one child reported.
struct Outcome {
    answered: usize,
    answers: Vec<String>,
}

fn parse_result(line: &str) -> Outcome {
    let answers_at = line.find("answers=").expect("answers") + "answers=".len();
    Outcome {
        answered: field(line, "answered=").parse().expect("count"),
        answers: line[answers_at..].split('|').map(str::to_owned).collect(),
    }
}

/// Starts `PROCESSES` children in `role`, waits until each is connected, then lets them go.
fn start_all(role: &str, server: &RedisServer, ns: &str) -> Vec<ChildProcess> {
    let players: Vec<ChildProcess> = (0..PROCESSES)
        .map(|_| start_player(role, server, ns))
        .collect();
    for p in &players {
        p.expect_line("READY", Duration::from_secs(60));
    }
    command_at(server.port(), &["SET", &format!("{ns}:w:go"), "1"]).expect("go");
    players
}

fn runs(server: &RedisServer, ns: &str) -> i64 {
    command_at(server.port(), &["GET", &format!("{ns}:w:runs")])
        .expect("runs")
        .text()
        .map_or(0, |t| t.parse().expect("a count"))
}

/// 4 processes × 100 callers on one key, `scope = "cluster"`: one run, and every caller of
/// every process got the same value (the leader's).
fn cluster_scope_runs_once_for_four_processes(server: &RedisServer) {
    let ns = "xflight-cluster";
    let players = start_all("cluster", server, ns);
    let mut answers = BTreeSet::new();
    for p in &players {
        let outcome = parse_result(&p.expect_line("RESULT", Duration::from_secs(60)));
        assert_eq!(outcome.answered, CALLERS);
        answers.extend(outcome.answers);
    }
    assert_eq!(runs(server, ns), 1, "one body run for 400 callers");
    assert_eq!(
        answers.len(),
        1,
        "every caller got the leader's value: {answers:?}"
    );
    let only = answers.into_iter().next().unwrap();
    assert!(only.starts_with("Ok(\"value-from-pid-"), "{only}");
}

/// The same stampede with `scope = "process"`: one run per process.
fn process_scope_runs_once_per_process(server: &RedisServer) {
    let ns = "xflight-process";
    let players = start_all("process", server, ns);
    let mut answers = BTreeSet::new();
    for p in &players {
        let outcome = parse_result(&p.expect_line("RESULT", Duration::from_secs(60)));
        assert_eq!(outcome.answered, CALLERS);
        assert_eq!(outcome.answers.len(), 1, "one value within a process");
        answers.extend(outcome.answers);
    }
    assert_eq!(runs(server, ns), 4, "one body run per process");
    assert_eq!(answers.len(), 4, "each process its own value: {answers:?}");
}

/// The leader is killed with SIGKILL while its body runs: after its 2 s lease exactly one
/// other process takes over, and every caller of the surviving processes is answered with the
/// new leader's value, within the lease plus a generous margin.
fn killed_leader_is_replaced_by_exactly_one_follower(server: &RedisServer) {
    let ns = "xflight-kill";
    let mut players = start_all("cluster-slow", server, ns);
    // Find the process whose body started first: the cluster leader.
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = 'found: loop {
        assert!(Instant::now() < deadline, "no process started the body");
        for (index, p) in players.iter().enumerate() {
            if p.line("BODY", Duration::ZERO).is_some() {
                break 'found index;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut killed = players.remove(leader);
    killed.kill();
    let killed_at = Instant::now();
    let mut answers = BTreeSet::new();
    for p in &players {
        let outcome = parse_result(&p.expect_line("RESULT", Duration::from_secs(30)));
        assert_eq!(
            outcome.answered, CALLERS,
            "every surviving caller was answered"
        );
        answers.extend(outcome.answers);
    }
    let recovered = killed_at.elapsed();
    assert_eq!(
        runs(server, ns),
        2,
        "the killed run and exactly one takeover"
    );
    assert_eq!(
        answers.len(),
        1,
        "one value for every survivor: {answers:?}"
    );
    // The lease (2 s) plus the new leader's body (1 s) plus a generous margin.
    assert!(
        recovered < Duration::from_secs(15),
        "recovered in {recovered:?}"
    );
    println!("  recovered {recovered:?} after the kill");
}

/// The leader's body fails with a serialisable error: followers in other processes get that
/// very error, and the body ran once.
fn followers_see_the_leaders_error(server: &RedisServer) {
    let ns = "xflight-error";
    let players = start_all("cluster-failing", server, ns);
    let mut answers = BTreeSet::new();
    for p in &players {
        let outcome = parse_result(&p.expect_line("RESULT", Duration::from_secs(60)));
        assert_eq!(outcome.answered, CALLERS);
        answers.extend(outcome.answers);
    }
    assert_eq!(runs(server, ns), 1, "the failing body ran once");
    assert_eq!(
        answers.len(),
        1,
        "every caller got the leader's error: {answers:?}"
    );
    let only = answers.into_iter().next().unwrap();
    assert!(
        only.starts_with("Err(Upstream(\"failed in pid "),
        "the error itself, not a stand-in: {only}"
    );
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(child(&role));
        return;
    }
    let server = RedisServer::start();
    run_scenarios(
        "cluster_flight",
        &server,
        &[
            (
                "cluster_scope_runs_once_for_four_processes",
                cluster_scope_runs_once_for_four_processes,
            ),
            (
                "process_scope_runs_once_per_process",
                process_scope_runs_once_per_process,
            ),
            (
                "killed_leader_is_replaced_by_exactly_one_follower",
                killed_leader_is_replaced_by_exactly_one_follower,
            ),
            (
                "followers_see_the_leaders_error",
                followers_see_the_leaders_error,
            ),
        ],
    );
}
