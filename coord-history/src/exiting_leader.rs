//! A cluster single-flight leader whose process exits right after its callers are answered (a
//! batch job, a command line tool: a `main` that returns without `Coordinator::shutdown`) still
//! hands its outcome over, on any provider: the run that the Redis and the PostgreSQL
//! `flight_exit` tests both make, written once.
//!
//! [`PROCESSES`] processes × [`CALLERS`] concurrent callers on one cold key with
//! `#[single_flight(scope = "cluster", lease = "10s")]`, each process returning from `main` as
//! soon as its own callers are answered, must run the body once, give every caller the leader's
//! value, and answer every process well within half the lease: a follower that had to wait out
//! a vanished leader's claim would take the whole lease first.
//!
//! Against the code where the leader answered before its hand-over had left the process (the
//! write was a task of the runtime that `main`'s return drops) this run failed on both
//! providers: the body ran 4 times and the slowest process answered after about 30 s, each
//! follower process having waited out the lease of the leader before it.
//!
//! The parent ([`exiting_leader_still_hands_over`]) and the children ([`run_child`]) meet in a
//! directory: the parent writes `go` there once every child is connected, and each body run
//! appends a line to `runs`, so the witness needs no connection of its own to the server.

use std::collections::BTreeSet;
use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use coord_core::{CoordError, Coordinator, single_flight};

use crate::child_process::{ChildProcess, field};

/// The variable that makes this binary play a child.
pub const ROLE_VAR: &str = "COORD_TEST_ROLE";
/// The variable naming the directory the parent and its children meet in.
const DIR_VAR: &str = "COORD_TEST_DIR";
/// Callers in each process.
pub const CALLERS: usize = 25;
/// Processes in the stampede.
pub const PROCESSES: usize = 4;
/// The claim's lease, as in the attribute below.
pub const LEASE: Duration = Duration::from_secs(10);

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
    // The slow upstream: long enough that every caller of every process joins the flight.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(format!("value-from-pid-{}", std::process::id()))
}

/// One process of the stampede, run from `main` when [`ROLE_VAR`] is set: builds its coordinator
/// with `connect`, says `READY`, waits for the parent's go, runs its callers, prints what they got
/// and returns with no `shutdown`, its runtime dropped as `#[tokio::main]` drops it.
pub fn run_child<F, Fut>(connect: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Coordinator>,
{
    let dir = PathBuf::from(std::env::var(DIR_VAR).expect("the parent sets the witness directory"));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async move {
            let c = connect().await;
            println!("READY");
            let _ = std::io::stdout().flush();
            let go = dir.join("go");
            // The parent's signal is a file: polled, as nothing can be awaited across processes.
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
        });
}

/// The parent's side: starts [`PROCESSES`] children (`child` adds what each needs to reach the
/// server to a command that re-runs this binary), lets them go together, and asserts one body
/// run, one value for every caller, and no process answered near the lease. Panics on a broken
/// promise.
pub fn exiting_leader_still_hands_over(child: impl Fn(&mut Command)) {
    let dir = std::env::temp_dir().join(format!("coord-flight-exit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the witness directory");
    let mut players: Vec<ChildProcess> = (0..PROCESSES)
        .map(|_| {
            let mut command = ChildProcess::of_this_binary(ROLE_VAR, "exit-after-calls");
            command.env(DIR_VAR, &dir);
            child(&mut command);
            ChildProcess::spawn(command)
        })
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
