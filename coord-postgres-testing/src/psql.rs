//! The test's own SQL: `psql` as a superuser over the loopback port, bounded in time.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::HOST;

/// How long one `psql` run may take: a paused server would otherwise hang the test.
pub(crate) const PSQL_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `sql` (one or more statements) in database `db` on the server at `port` as the
/// superuser `postgres`, and returns what it printed: one line per row, columns separated
/// by `|`, no headers. An error (including a statement error: psql stops at the first) is
/// `Err` with psql's message.
pub(crate) fn run(bin: &Path, port: u16, db: &str, sql: &str) -> Result<String, String> {
    let mut child = Command::new(bin.join("psql"))
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .args(["-h", HOST, "-U", "postgres"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-d")
        .arg(db)
        .arg("-c")
        .arg(sql)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGAPPNAME", "coord-postgres-testing")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not run psql: {e}"))?;
    let deadline = Instant::now() + PSQL_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "psql did not finish within {PSQL_TIMEOUT:?} (is the server paused?)"
                ));
            }
            Err(e) => return Err(format!("waiting for psql: {e}")),
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    if status.success() {
        Ok(out.trim_end().to_owned())
    } else {
        Err(format!("psql failed ({status}): {}", err.trim()))
    }
}

/// `text` as an SQL string literal.
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
