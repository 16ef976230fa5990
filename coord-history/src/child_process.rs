//! Test binaries with their own `main` that re-run themselves as child processes: the parent
//! side of that pattern, written once for every multi-process test and bench.
//!
//! A child is this same executable started again with a role variable set (`COORD_TEST_ROLE`,
//! say); its `main` sees the variable and plays the role instead of running the scenarios. The
//! child speaks to the parent by printing lines (`READY`, `ACQUIRED`, `RESULT k=v ...`), which
//! [`ChildProcess`] collects on a thread of its own so the parent can wait for one with a
//! deadline, signal the child (pause, resume, kill) and wait for it to exit. A child still running
//! when its [`ChildProcess`] is dropped is killed and reaped, so a failed scenario leaves no
//! process behind.
//!
//! [`run_scenarios`] is the other half of such a `main`: the named scenarios, filtered by the
//! command line as libtest filters, each run with its panic caught, one `test NAME ... ok` line
//! each, a summary line and a failing exit status when any failed.

use std::io::{BufRead, BufReader};
use std::panic::AssertUnwindSafe;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A child process of this test binary, its stdout read line by line.
pub struct ChildProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl ChildProcess {
    /// A command that re-runs this executable with `role_var` set to `role`, its stdout piped
    /// to the parent and its stderr inherited. Add the child's variables to it (and
    /// `.stderr(Stdio::piped())` to keep the child's stderr for [`finish`](Self::finish)), then
    /// [`spawn`](Self::spawn) it.
    pub fn of_this_binary(role_var: &str, role: &str) -> Command {
        let mut command = Command::new(std::env::current_exe().expect("own path"));
        command
            .env(role_var, role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command
    }

    /// Starts `command` (stdout piped); a piped stderr is collected for
    /// [`finish`](Self::finish).
    pub fn spawn(mut command: Command) -> ChildProcess {
        let mut child = command.spawn().expect("re-run this test binary as a child");
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = child.stderr.take().map(|stderr| {
            std::thread::spawn(move || {
                let mut all = String::new();
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    all.push_str(&line);
                    all.push('\n');
                }
                all
            })
        });
        ChildProcess {
            child,
            lines,
            stderr,
        }
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line starting with `prefix` (earlier lines are passed over), or `None`
    /// when none came within `within` or the child closed its stdout.
    pub fn line(&self, prefix: &str, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }

    /// [`line`](Self::line), panicking (naming the child and the line) when none came.
    pub fn expect_line(&self, prefix: &str, within: Duration) -> String {
        self.line(prefix, within).unwrap_or_else(|| {
            panic!(
                "child {}: no line starting with {prefix:?} within {within:?}",
                self.child.id()
            )
        })
    }

    /// Sends `signal` to the child (`SIGSTOP`, `SIGCONT`, `SIGKILL`, ...).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: `kill` reads no memory of ours. The pid is our own child's, which is reaped
        // only by `exited`, `finish` or drop, all of which take `&mut self` or `self`: while we
        // hold `&self` it has not been reaped, so the pid cannot name another process.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "signal {signal} to child {}", self.child.id());
    }

    /// Kills the child (`SIGKILL`) and reaps it.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the child");
        let _ = self.child.wait();
    }

    /// Waits for the child to exit on its own within `within`, and says whether it succeeded.
    /// Panics when it is still running by then.
    pub fn exited(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            match self.child.try_wait().expect("the child's status") {
                Some(status) => return status.success(),
                None if Instant::now() >= deadline => {
                    panic!("child {} did not exit within {within:?}", self.child.id())
                }
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Waits for the child to exit within `within` (killing it and panicking when it does not),
    /// and returns what it wrote to a piped stderr (empty when stderr was not piped).
    pub fn finish(mut self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        while self.child.try_wait().expect("the child's status").is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("child {} did not exit within {within:?}", self.child.id());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stderr
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the space-separated field `name` (given with its `=`) in a child's line:
/// `field("RESULT runs=3 ms=12", "runs=")` is `"3"`. Panics, quoting the line, when it is
/// missing.
pub fn field<'l>(line: &'l str, name: &str) -> &'l str {
    line.split(' ')
        .find_map(|f| f.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// One scenario of a test binary with its own `main`: its name and the function that runs it
/// against the binary's shared subject (a server, say); a scenario fails by panicking.
pub type Scenario<S> = (&'static str, fn(&S));

/// Runs the `scenarios` whose names contain one of the command line's non-flag arguments (all
/// of them when there is none), each with its panic caught, printing `test NAME ... ok (took)`
/// or `test NAME ... FAILED`, then `BINARY: N passed, M failed`; exits with status 1 when any
/// failed.
pub fn run_scenarios<S>(binary: &str, subject: &S, scenarios: &[Scenario<S>]) {
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
        // A failed scenario's state is the subject's (a server), which the next scenario
        // uses through its own keys: nothing half-updated in this process is read again.
        match std::panic::catch_unwind(AssertUnwindSafe(|| scenario(subject))) {
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
    println!("{binary}: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
