//! What a server executes: every command in order, through a `MONITOR` connection
//! ([`Monitor`]), and how often each command ran, from `INFO commandstats`
//! ([`RedisServer::command_calls`]).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::command_at;
use crate::ports::HOST;
use crate::server::RedisServer;

impl RedisServer {
    /// How often each command ran since start (or `CONFIG RESETSTAT`), from
    /// `INFO commandstats`: lower-case name (`set`, `evalsha`, ...) to calls.
    pub fn command_calls(&self) -> BTreeMap<String, u64> {
        let info = self
            .command(&["INFO", "commandstats"])
            .text()
            .unwrap_or_default();
        parse_commandstats(&info)
    }
}

/// One command as `MONITOR` reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monitored {
    /// Sent by a Lua script (`[db lua]`) rather than by a client connection.
    pub from_script: bool,
    /// The command name, lower-case (`set`, `evalsha`).
    pub name: String,
    /// The whole line as the server printed it.
    pub line: String,
}

/// A `MONITOR` connection: sees every command the server executes, in order, and whether a
/// client or a script sent it. Closed on drop.
#[derive(Debug)]
pub struct Monitor {
    port: u16,
    stream: TcpStream,
    /// The lines read so far and not yet drained, and a signal for each new one.
    seen: Arc<(Mutex<Vec<String>>, Condvar)>,
    reader: Option<JoinHandle<()>>,
}

impl Monitor {
    /// Starts monitoring `server` (over its plain port, unauthenticated: not for a server
    /// started with a password).
    pub fn start(server: &RedisServer) -> Monitor {
        let port = server.port();
        let mut stream = TcpStream::connect((HOST, port)).expect("connect for MONITOR");
        stream
            .write_all(b"*1\r\n$7\r\nMONITOR\r\n")
            .expect("send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone the socket"));
        let mut first = String::new();
        reader.read_line(&mut first).expect("MONITOR answers");
        assert_eq!(first.trim_end(), "+OK", "MONITOR refused: {first}");
        let seen = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let sink = seen.clone();
        let handle = std::thread::spawn(move || {
            let mut line = String::new();
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                let (lines, changed) = &*sink;
                lines.lock().unwrap().push(line.trim_end().to_owned());
                changed.notify_all();
                line.clear();
            }
        });
        Monitor {
            port,
            stream,
            seen,
            reader: Some(handle),
        }
    }

    /// Every command executed since the last call (or since the start), up to now. A marker
    /// command is sent and awaited, so everything the server finished before this call is
    /// included; the marker itself is not.
    pub fn drain(&self) -> Vec<Monitored> {
        static MARKS: AtomicU32 = AtomicU32::new(0);
        let mark = format!(
            "coord-monitor-mark-{}",
            MARKS.fetch_add(1, Ordering::Relaxed)
        );
        command_at(self.port, &["ECHO", &mark]).expect("send the MONITOR marker");
        let (lines, changed) = &*self.seen;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut guard = lines.lock().unwrap();
        loop {
            if let Some(pos) = guard.iter().position(|l| l.contains(&mark)) {
                let taken: Vec<String> = guard.drain(..=pos).collect();
                return taken[..taken.len() - 1]
                    .iter()
                    .filter_map(|l| parse_monitor_line(l))
                    .collect();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "MONITOR did not report the marker");
            guard = changed.wait_timeout(guard, left).unwrap().0;
        }
    }

    /// The commands since the last drain that clients sent (not scripts), lower-case names,
    /// leaving out the monitor's own markers.
    pub fn client_commands(&self) -> Vec<String> {
        self.drain()
            .into_iter()
            .filter(|m| !m.from_script)
            .map(|m| m.name)
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(handle) = self.reader.take() {
            let _ = handle.join();
        }
    }
}

/// `+1700000000.000000 [0 127.0.0.1:5000] "SET" "k" "v"` -> a [`Monitored`].
fn parse_monitor_line(line: &str) -> Option<Monitored> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = &line[open + 1..close];
    let rest = line[close + 1..].trim_start();
    let name = rest
        .strip_prefix('"')?
        .split('"')
        .next()?
        .to_ascii_lowercase();
    Some(Monitored {
        from_script: source.ends_with(" lua") || source == "lua",
        name,
        line: line.to_owned(),
    })
}

/// The `cmdstat_<name>:calls=<n>,...` lines of `INFO commandstats` as name -> calls; other
/// lines, and lines without a readable `calls`, are left out.
fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{parse_commandstats, parse_monitor_line};

    #[test]
    fn monitor_lines_name_the_command_and_who_sent_it() {
        let client = r#"1700000000.000001 [0 127.0.0.1:5000] "SET" "k" "v""#;
        let parsed = parse_monitor_line(client).expect("a command line");
        assert_eq!(parsed.name, "set");
        assert!(!parsed.from_script);
        assert_eq!(parsed.line, client);

        let script = r#"1700000000.000002 [0 lua] "Get" "k""#;
        let parsed = parse_monitor_line(script).expect("a script's command line");
        assert_eq!(parsed.name, "get");
        assert!(parsed.from_script);

        assert_eq!(parse_monitor_line("OK"), None);
        assert_eq!(parse_monitor_line("1700000000.000003 [0 lua]"), None);
    }

    #[test]
    fn commandstats_give_calls_per_command() {
        let info = "# Commandstats\r\n\
                    cmdstat_set:calls=3,usec=12,usec_per_call=4.00,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_evalsha:calls=11,usec=90,usec_per_call=8.18\r\n\
                    cmdstat_broken:usec=1\r\n";
        let expected = BTreeMap::from([("evalsha".to_owned(), 11), ("set".to_owned(), 3)]);
        assert_eq!(parse_commandstats(info), expected);
        assert!(parse_commandstats("").is_empty());
    }
}
