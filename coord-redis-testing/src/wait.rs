//! Waiting, with a deadline: for a just-started process to answer, and for any condition
//! (a replica in sync, a cluster up, a failover done) to hold.

use std::io::Read;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::client::{Resp, command_at};

/// How long a redis-server (or Sentinel) process gets to answer after it is started.
pub(crate) const STARTUP: Duration = Duration::from_secs(15);

/// Waits until the server on `port` answers `PING` (and, when it needs no password, says it is
/// `child`), or reports why it did not start: its exit status, standard error and log when it
/// exited, its log when it did not answer within [`STARTUP`] (it is then killed).
pub(crate) fn wait_ready(child: &mut Child, port: u16, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + STARTUP;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = err.read_to_string(&mut stderr);
            }
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("redis-server exited ({status}):\n{stderr}\n{log}"));
        }
        match command_at(port, &["PING"]) {
            // Answered, and by this process: another test process may have bound the port
            // between the search for a free one and this server's start (which then fails
            // to bind and exits), and a server or proxy of its own answers `PING` too.
            Ok(Resp::Simple(pong)) if pong == "PONG" && answered_by(port, child.id()) => {
                return Ok(());
            }
            // Up, but wants a password first.
            Ok(Resp::Error(e)) if e.starts_with("NOAUTH") => return Ok(()),
            _ => {}
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!(
                "redis-server on port {port} did not answer within {STARTUP:?}:\n{log}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the server answering on `port` is the process `pid` (its `INFO server` says so).
fn answered_by(port: u16, pid: u32) -> bool {
    let Ok(Resp::Bulk(info)) = command_at(port, &["INFO", "server"]) else {
        return false;
    };
    String::from_utf8_lossy(&info)
        .lines()
        .any(|line| line.trim_end() == format!("process_id:{pid}"))
}

/// Calls `done` every 20 ms until it returns `true`; panics with "timed out waiting for
/// `what`" once `timeout` has passed.
pub(crate) fn poll_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
