//! The README's first hour, run for real: two processes of one application share a lock
//! through Redis, configured only by the environment (`COORD_REDIS_URL`, nothing else), and
//! the `coord` tool finds the application's keys from its binary's name (`--app`) and its
//! operations without being told their names.
//!
//! The application is this test binary, run again as child processes (its own binary: the
//! children run the one test below in their mode). It does what the README's walkthrough
//! does: `coord_redis::coordinator_from_env()`, install, a `#[distributed_lock]` with no
//! `name` (so the operation is named after the module path: `first_hour::nightly`) and no
//! namespace (so the namespace is the binary's name).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use coord_core::{CoordError, distributed_lock, observe};
use coord_redis_testing::RedisServer;

const BIN: &str = env!("CARGO_BIN_EXE_coord");
const TEST_NAME: &str = "two_processes_share_a_lock_and_the_cli_shows_it";
/// Set in a child's environment: run as the application, with this name in its output.
const ROLE: &str = "COORD_TEST_FIRST_HOUR_ROLE";

/// The README's job: one holder at a time per job, a second caller waits its turn. The
/// holder keeps the lock until a line arrives on stdin, so the test decides when.
#[distributed_lock(key_from = "job", lease = "30s", wait = "30s")]
async fn nightly(job: &str) -> Result<(), CoordError> {
    println!("app: holding {job}");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    });
    let _ = line.await;
    Ok(())
}

/// The application's `main`, as the README writes it.
async fn application() -> Result<(), Box<dyn std::error::Error>> {
    coord_redis::coordinator_from_env().await?.install()?;
    println!("app: started");
    let (outcome, report) = observe(nightly("t-7")).await;
    outcome?;
    let key = report.key().expect("the report names the key");
    println!(
        "app: done key={key} operation={} lock={:?}",
        key.shown_operation(),
        report.lock().expect("the lock layer ran")
    );
    Ok(())
}

struct App {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl App {
    fn start(url: &str, role: &str) -> App {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("COORD_REDIS_URL", url)
            .env_remove("COORD_NAMESPACE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run this test binary as the application");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        App {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (up to 30 s) for a line holding `prefix`, and returns it from there (the test
    /// harness may have started the line with the test's name).
    fn expect(&mut self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if let Some(at) = line.find(prefix) {
                        return line[at..].to_owned();
                    }
                }
                Err(_) => panic!("no `{prefix}` line from the application: {:?}", self.seen),
            }
        }
    }

    /// Tells the holder to finish its job.
    fn finish(&mut self) {
        writeln!(self.stdin).unwrap();
        self.stdin.flush().unwrap();
    }

    fn wait(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the application failed: {:?}", self.seen);
    }
}

/// Runs `coord args` with the environment the application had (COORD_REDIS_URL only).
fn coord(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("COORD_REDIS_URL", url)
        .env_remove("COORD_NAMESPACE")
        .env_remove("COORD_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run the coord binary");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn two_processes_share_a_lock_and_the_cli_shows_it() {
    if let Some(role) = std::env::var_os(ROLE) {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        if let Err(err) = runtime.block_on(application()) {
            panic!("{role:?}: {err}");
        }
        return;
    }
    let server = RedisServer::start();
    let url = server.url();
    let exe = std::env::current_exe().unwrap();
    let app = exe.to_str().unwrap();

    let mut first = App::start(&url, "first");
    first.expect("app: holding t-7");
    let mut second = App::start(&url, "second");
    second.expect("app: started");

    // The tool finds the application from its binary's name, and lists what has state
    // without being told the operation's name.
    let (code, out, err) = coord(&url, &["--app", app, "locks", "list"]);
    assert_eq!(code, 0, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["OPERATION", "LOCKS"]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["first_hour::nightly", "1"],
        "the default name: the module path and the function: {out}"
    );
    let namespace = coord_core::config::namespace_for_binary(app).unwrap();
    assert!(namespace.starts_with("first_hour-"), "{namespace}");
    assert_eq!(
        lines[2],
        format!(
            "1 operation holds locks in namespace `{namespace}`; list one: coord locks list \
             first_hour::nightly"
        )
    );

    let (code, out, err) = coord(
        &url,
        &["--app", app, "locks", "list", "first_hour::nightly"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("first_hour::nightly:t-7"), "{out}");
    assert!(out.contains("1 lock held"), "{out}");

    // The holder finishes; the second process, which waited, takes the lock and reports
    // the same key the tool listed.
    first.finish();
    let done = first.expect("app: done");
    assert_eq!(
        done,
        "app: done key=first_hour::nightly:t-7 operation=first_hour::nightly lock=Acquired"
    );
    second.expect("app: holding t-7");
    second.finish();
    let done = second.expect("app: done");
    assert_eq!(
        done, "app: done key=first_hour::nightly:t-7 operation=first_hour::nightly lock=Contended",
        "the second process waited for the first"
    );
    first.wait();
    second.wait();

    let (code, out, _) = coord(&url, &["--app", app, "locks", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!(
            "no operation holds locks in namespace `{namespace}`"
        )),
        "{out}"
    );
}
