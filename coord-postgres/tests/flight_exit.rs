//! PostgreSQL: a cluster single-flight leader whose process exits right after its callers are answered
//! (a batch job, a command line tool: a `main` that returns without `Coordinator::shutdown`)
//! still hands its outcome over: 4 processes × 25 concurrent callers on one cold key with
//! `#[single_flight(scope = "cluster", lease = "10s")]`, each process returning from `main` as
//! soon as its own callers are answered, run the body once, and no caller waits anywhere near
//! the lease.
//!
//! The PostgreSQL provider cannot see when a statement has left the process, so its leader
//! answers once the hand-over statement is answered (the default of
//! `FlightStore::flight_finish_noting_sent`). Against the earlier code, where the leader
//! answered before its hand-over was even sent, this test failed: run once against it, the
//! body ran 4 times and the slowest process answered 30.4 s after the start. Runs are counted
//! in a file (one line per run), so the witness adds no connection of its own.
//!
//! This test binary has its own `main` (`harness = false`): run without `COORD_TEST_ROLE` it
//! starts a PostgreSQL server and runs the scenario, which re-runs this same binary as child
//! processes with `COORD_TEST_ROLE` set. It ends with the line `flight_exit: N passed, M failed`
//! and a non-zero exit status when anything failed.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, single_flight};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;

const ROLE: &str = "COORD_TEST_ROLE";
const CALLERS: usize = 25;
const PROCESSES: usize = 4;
/// The claim's lease, as in the attribute below.
const LEASE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- child processes

/// Counts its runs in the witness file, then answers after a slow upstream's 300 ms.
#[single_flight(key_from = "key", coordinator = c, name = "xflight.exit", scope = "cluster", lease = "10s")]
async fn refresh(c: &Coordinator, key: &str, dir: &Path) -> Result<String, CoordError> {
    let mut runs = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("runs"))
        .expect("the witness file");
    // One short write to a file opened for appending: whole, whatever the other processes do.
    runs.write_all(format!("{}\n", std::process::id()).as_bytes())
        .expect("count the run");
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("value-from-pid-{}", std::process::id()))
}

/// One process of the stampede: its callers, then straight out of `main`.
async fn child() {
    let url = std::env::var("COORD_TEST_URL").expect("COORD_TEST_URL");
    let ns = std::env::var("COORD_TEST_NS").expect("COORD_TEST_NS");
    let dir = PathBuf::from(std::env::var("COORD_TEST_DIR").expect("COORD_TEST_DIR"));
    let provider = PostgresProvider::builder(&url)
        .pool_size(4)
        .connect()
        .await
        .expect("connect");
    let c = Coordinator::builder()
        .namespace(ns.clone())
        .provider(provider)
        .build()
        .expect("coordinator");
    println!("READY");
    let _ = std::io::stdout().flush();
    let go = dir.join("go");
    while !go.exists() {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (c, dir) = (c.clone(), dir.clone());
            tokio::spawn(async move {
                let answer = refresh(&c, "k", &dir).await;
                (answer, started.elapsed())
            })
        })
        .collect();
    let mut answers = BTreeSet::new();
    let (mut answered, mut slowest) = (0, Duration::ZERO);
    for call in calls {
        let (answer, took) = call.await.expect("caller task");
        answered += 1;
        slowest = slowest.max(took);
        answers.insert(format!("{answer:?}"));
    }
    let answers: Vec<String> = answers.into_iter().collect();
    println!(
        "RESULT answered={answered} slowest_ms={} answers={}",
        slowest.as_millis(),
        answers.join("|")
    );
    let _ = std::io::stdout().flush();
    // No `shutdown`: the process ends as `main` returns, its runtime and tasks dropped.
}

// ---------------------------------------------------------------- the parent side

/// A child process of this binary, with its stdout lines arriving on a channel.
struct Player {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Player {
    fn start(server: &PostgresServer, ns: &str, dir: &Path) -> Player {
        let mut child = Command::new(std::env::current_exe().expect("own path"))
            .env(ROLE, "exit-after-calls")
            .env("COORD_TEST_URL", server.url())
            .env("COORD_TEST_NS", ns)
            .env("COORD_TEST_DIR", dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("re-run this test binary as a child");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Player { child, lines }
    }

    /// Waits for a stdout line starting with `prefix`, returning it.
    fn expect_line(&self, prefix: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "child {}: no line starting with {prefix:?} within {within:?}",
                    self.child.id()
                ),
            }
        }
    }

    /// Waits for the process to exit on its own, and says whether it succeeded.
    fn exited(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait().expect("child status") {
                Some(status) => return status.success(),
                None if Instant::now() >= deadline => {
                    panic!("child {} did not exit within {within:?}", self.child.id())
                }
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

impl Drop for Player {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field<'l>(line: &'l str, name: &str) -> &'l str {
    line.split(' ')
        .find_map(|f| f.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// 4 processes × 25 callers on one cold key, each process exiting as soon as its callers are
/// answered: one body run, one value for all 100 callers, and every process answered well
/// within half the lease (a follower that had to wait out a vanished leader's claim would take
/// the whole 10 s lease first).
fn exiting_leader_still_hands_over(server: &PostgresServer) {
    let ns = "xflight-exit";
    let dir = std::env::temp_dir().join(format!("coord-flight-exit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the witness directory");
    let mut players: Vec<Player> = (0..PROCESSES)
        .map(|_| Player::start(server, ns, &dir))
        .collect();
    for p in &players {
        p.expect_line("READY", Duration::from_secs(60));
    }
    std::fs::write(dir.join("go"), b"go").expect("go");
    let mut answers = BTreeSet::new();
    let mut slowest = Duration::ZERO;
    for p in &players {
        // Generous: the old behaviour needed up to 4 leases (40 s) to answer every process.
        let line = p.expect_line("RESULT", Duration::from_secs(60));
        let answered: usize = field(&line, "answered=").parse().expect("a count");
        assert_eq!(answered, CALLERS, "{line}");
        let ms: u64 = field(&line, "slowest_ms=").parse().expect("milliseconds");
        slowest = slowest.max(Duration::from_millis(ms));
        let at = line.find("answers=").expect("answers") + "answers=".len();
        answers.extend(line[at..].split('|').map(str::to_owned));
    }
    for p in &mut players {
        assert!(p.exited(Duration::from_secs(30)), "the child failed");
    }
    let runs = std::fs::read_to_string(dir.join("runs"))
        .expect("the witness file")
        .lines()
        .count();
    let _ = std::fs::remove_dir_all(&dir);
    println!("  body runs {runs}, slowest process answered {slowest:?} after the start");
    assert_eq!(
        runs, 1,
        "one body run for 100 callers in 4 exiting processes"
    );
    assert_eq!(
        answers.len(),
        1,
        "every caller got the leader's value: {answers:?}"
    );
    assert!(
        answers
            .iter()
            .all(|a| a.starts_with("Ok(\"value-from-pid-")),
        "{answers:?}"
    );
    assert!(
        slowest < LEASE / 2,
        "a follower waited {slowest:?}, near the {LEASE:?} lease: the hand-over was lost"
    );
}

type Scenario = fn(&PostgresServer);

fn main() {
    if std::env::var(ROLE).is_ok() {
        // As `#[tokio::main]` does: the runtime is dropped when `main` returns.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(child());
        return;
    }
    let server = PostgresServer::start();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(PostgresProvider::migrate(&server.url()))
        .expect("migrate");
    let scenarios: [(&str, Scenario); 1] = [(
        "exiting_leader_still_hands_over",
        exiting_leader_still_hands_over,
    )];
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in scenarios {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        match std::panic::catch_unwind(|| scenario(&server)) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:?})", started.elapsed());
            }
            Err(_) => {
                failed += 1;
                println!("test {name} ... FAILED");
            }
        }
    }
    println!("flight_exit: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
