//! Throwaway Redis deployments for tests: a server, a cluster, a Sentinel setup.
//!
//! Every process started here listens on 127.0.0.1 on a free port (never 6379), keeps no
//! data on disk (`--save "" --appendonly no`), logs into a private temporary directory, and is
//! killed when its handle is dropped (also when a test panics).
//!
//! The `redis-server` binary is taken from `REDIS_SERVER_BIN` or the `PATH`. When it cannot
//! be found or started, these functions panic with the fix in the message
//! (`apt-get install redis-server`): a test that needs Redis fails loudly rather than
//! skipping.
//!
//! [`RedisServer::command`] is a minimal blocking client, enough for tests to inspect or
//! tamper with the data (`PTTL`, `TYPE`, `INFO commandstats`, planting a wrong-typed value).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const HOST: &str = "127.0.0.1";
const STARTUP: Duration = Duration::from_secs(15);

/// A reply of the blocking test client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    /// Nil bulk or nil array.
    Nil,
    /// An integer.
    Int(i64),
    /// A simple string (`+OK`).
    Simple(String),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// An array.
    Array(Vec<Resp>),
    /// An error reply.
    Error(String),
}

impl Resp {
    /// The reply as text: simple and bulk strings (lossily), integers, errors; `None` for
    /// nil and arrays.
    pub fn text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) | Resp::Error(s) => Some(s.clone()),
            Resp::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Int(i) => Some(i.to_string()),
            Resp::Nil | Resp::Array(_) => None,
        }
    }

    /// The integer, if this is one.
    pub fn int(&self) -> Option<i64> {
        match self {
            Resp::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// Sends one command to `127.0.0.1:port` over a fresh connection and reads the reply.
pub fn command_at(port: u16, args: &[&str]) -> std::io::Result<Resp> {
    let addr: SocketAddr = format!("{HOST}:{port}").parse().expect("loopback address");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.set_nodelay(true)?;
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    stream.write_all(&out)?;
    read_resp(&mut BufReader::new(stream))
}

fn read_resp(reader: &mut impl BufRead) -> std::io::Result<Resp> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1.min(line.len()));
    Ok(match kind {
        "+" => Resp::Simple(rest.to_owned()),
        "-" => Resp::Error(rest.to_owned()),
        ":" => Resp::Int(rest.parse().map_err(|_| bad("bad integer"))?),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad("bad length"))?;
            if len < 0 {
                Resp::Nil
            } else {
                let mut buf = vec![0u8; len as usize + 2];
                reader.read_exact(&mut buf)?;
                buf.truncate(len as usize);
                Resp::Bulk(buf)
            }
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad("bad length"))?;
            if len < 0 {
                Resp::Nil
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_resp(reader)?);
                }
                Resp::Array(items)
            }
        }
        _ => return Err(bad("unknown reply type")),
    })
}

/// The `redis-server` binary, or a panic that says how to get one.
pub fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("REDIS_SERVER_BIN") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "REDIS_SERVER_BIN points at {}, which is not a file",
            path.display()
        );
        return path;
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/bin", "/usr/local/bin", "/usr/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("redis-server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "redis-server was not found on the PATH. These tests start their own Redis: \
                 install it (Debian/Ubuntu: `apt-get install redis-server`; it needs Redis 7.0 \
                 or newer) or set REDIS_SERVER_BIN to the binary"
            )
        })
}

fn unique_dir(kind: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "coord-redis-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a temporary directory for redis-server");
    dir
}

/// A port on 127.0.0.1 that is free now (and, with `bus`, whose +10000 Cluster bus port is
/// free too). Never 6379.
fn free_port(bus: bool) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = 20_000 + (std::process::id() % 400) * 50;
    for _ in 0..20_000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (base + offset % 30_000) as u16;
        if port == 6379 || port >= 55_000 {
            continue;
        }
        let free = |p: u16| TcpListener::bind((HOST, p)).is_ok();
        if free(port) && (!bus || free(port + 10_000)) {
            return port;
        }
    }
    panic!("no free port found on 127.0.0.1 for redis-server");
}

fn signal(child: &Child, sig: libc::c_int) {
    // The pid is our own child's, still unreaped: it cannot have been reused.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signalling redis-server {} failed", child.id());
}

/// One `redis-server` process on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra command-line options (`["--requirepass", "x"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port(extra.iter().any(|a| a == "--cluster-enabled"));
            let mut server = RedisServer {
                port,
                dir: unique_dir("server"),
                extra: extra.clone(),
                child: None,
            };
            match server.launch() {
                Ok(()) => return server,
                Err(log) => last_log = log,
            }
        }
        panic!("redis-server did not start (tried five ports); last log:\n{last_log}");
    }

    fn launch(&mut self) -> Result<(), String> {
        let binary = redis_server_binary();
        let log = self.dir.join("redis.log");
        let mut cmd = Command::new(&binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", HOST, "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "could not run {}: {e}. Install Redis (`apt-get install redis-server`) or set \
                 REDIS_SERVER_BIN",
                binary.display()
            )
        });
        self.child = Some(child);
        wait_ready(self.child.as_mut().expect("just spawned"), self.port, &log)
    }

    /// One server for the whole test process, started on first use and killed when the
    /// process exits. For suites that separate their cases by namespace rather than by
    /// server; do not pause, kill or restart it (the other cases use it too).
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(server) = SHARED.get() {
                if let Some(pid) = server.pid() {
                    // Our own child, never reaped while the process runs: the pid is its.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                let _ = std::fs::remove_dir_all(&server.dir);
            }
        }
        SHARED.get_or_init(|| {
            let server = RedisServer::start();
            // Statics are never dropped: stop the server when the process exits instead.
            let registered = unsafe { libc::atexit(stop_shared) };
            assert_eq!(
                registered, 0,
                "could not register the shared server's cleanup"
            );
            server
        })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{HOST}:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL) and waits for it to exit. Its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered.
    pub fn pause(&self) {
        signal(
            self.child.as_ref().expect("server is running"),
            libc::SIGSTOP,
        );
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) {
        signal(
            self.child.as_ref().expect("server is running"),
            libc::SIGCONT,
        );
    }

    /// Kills the server if it runs, then starts a fresh one on the same port with the same
    /// options, and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + STARTUP;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(log) if Instant::now() > deadline => {
                    panic!("redis-server did not restart on port {}:\n{log}", self.port)
                }
                // The old socket may linger a moment.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Runs one command and returns its reply; panics if the server cannot be reached.
    pub fn command(&self, args: &[&str]) -> Resp {
        command_at(self.port, args)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port))
    }

    /// How often each command ran since start (or `CONFIG RESETSTAT`), from
    /// `INFO commandstats`: lower-case name (`set`, `evalsha`, ...) to calls.
    pub fn command_calls(&self) -> BTreeMap<String, u64> {
        let info = self
            .command(&["INFO", "commandstats"])
            .text()
            .unwrap_or_default();
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

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
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
    seen: std::sync::Arc<(std::sync::Mutex<Vec<String>>, std::sync::Condvar)>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    /// Starts monitoring `server`.
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
        let seen =
            std::sync::Arc::new((std::sync::Mutex::new(Vec::new()), std::sync::Condvar::new()));
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
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
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

/// Waits until the server on `port` answers `PING`, or reports why it did not start.
fn wait_ready(child: &mut Child, port: u16, log: &Path) -> Result<(), String> {
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
            Ok(Resp::Simple(pong)) if pong == "PONG" => return Ok(()),
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

fn poll_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let text = command_at(port, &["INFO", section]).ok()?.text()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_owned())
    })
}

/// A Redis Cluster of masters without replicas, each a [`RedisServer`].
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least three for a real cluster), splits the 16384 slots
    /// evenly between them, joins them and waits until every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs at least one node");
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ])
            })
            .collect();
        for (i, node) in nodes.iter().enumerate() {
            let first = i * 16384 / masters;
            let last = (i + 1) * 16384 / masters - 1;
            let reply = node.command(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ]);
            assert_eq!(reply, Resp::Simple("OK".into()), "assigning slots");
            // Distinct epochs, as `redis-cli --cluster create` sets them.
            let _ = node.command(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
        }
        for node in &nodes[1..] {
            let reply = nodes[0].command(&["CLUSTER", "MEET", HOST, &node.port().to_string()]);
            assert_eq!(reply, Resp::Simple("OK".into()), "joining the cluster");
        }
        poll_until("the cluster to come up", Duration::from_secs(30), || {
            nodes.iter().all(|n| {
                let info = n.command(&["CLUSTER", "INFO"]).text().unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{masters}"))
                    && info.contains("cluster_slots_ok:16384")
            })
        });
        RedisCluster { nodes }
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node at `index`, to pause, resume or restart it. A restarted node keeps its
    /// cluster identity and slots (its `nodes.conf` survives), not its data.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Every node's URL, to use as seeds.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node that owns `key`'s slot.
    pub fn node_for(&self, key: &str) -> &RedisServer {
        let slot = self.nodes[0]
            .command(&["CLUSTER", "KEYSLOT", key])
            .int()
            .expect("CLUSTER KEYSLOT answers an integer");
        // The even split made by `start`: node i owns [i*16384/n, (i+1)*16384/n).
        let n = self.nodes.len() as i64;
        let owner = (0..n)
            .find(|&i| (i * 16384 / n..(i + 1) * 16384 / n).contains(&slot))
            .expect("every slot has an owner") as usize;
        &self.nodes[owner]
    }
}

/// A Sentinel-managed master with one replica and three Sentinels.
#[derive(Debug)]
pub struct SentinelSetup {
    servers: Vec<RedisServer>,
    master: usize,
    sentinels: Vec<SentinelProcess>,
}

/// One Sentinel process, killed on drop.
#[derive(Debug)]
pub struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl SentinelProcess {
    fn start(master_name: &str, master_port: u16) -> SentinelProcess {
        let binary = redis_server_binary();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port(false);
            let dir = unique_dir("sentinel");
            let conf = dir.join("sentinel.conf");
            let log = dir.join("sentinel.log");
            let text = format!(
                "port {port}\nbind {HOST}\nprotected-mode no\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {master_name} {HOST} {master_port} 2\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 10000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                dir = dir.display(),
                log = log.display(),
            );
            std::fs::write(&conf, text).expect("write the Sentinel configuration");
            let mut child = Command::new(&binary)
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "could not run {} --sentinel: {e}. Install Redis (`apt-get install \
                         redis-server`) or set REDIS_SERVER_BIN",
                        binary.display()
                    )
                });
            match wait_ready(&mut child, port, &log) {
                Ok(()) => return SentinelProcess { port, dir, child },
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = std::fs::remove_dir_all(&dir);
                    last = why;
                }
            }
        }
        panic!("redis-server --sentinel did not start:\n{last}");
    }

    /// The Sentinel's port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl SentinelSetup {
    /// The master name the Sentinels monitor.
    pub const MASTER_NAME: &'static str = "coordmaster";

    /// Starts a master, a replica of it and three Sentinels (quorum two), and waits until the
    /// replica is in sync and every Sentinel knows the replica.
    pub fn start() -> SentinelSetup {
        let master = RedisServer::start();
        let replica = RedisServer::start_with(&["--replicaof", HOST, &master.port().to_string()]);
        poll_until("the replica to sync", Duration::from_secs(20), || {
            info_field(replica.port(), "replication", "master_link_status").as_deref() == Some("up")
        });
        let sentinels: Vec<SentinelProcess> = (0..3)
            .map(|_| SentinelProcess::start(Self::MASTER_NAME, master.port()))
            .collect();
        let setup = SentinelSetup {
            servers: vec![master, replica],
            master: 0,
            sentinels,
        };
        poll_until(
            "the Sentinels to discover the replica",
            Duration::from_secs(30),
            || {
                setup.sentinels.iter().all(|s| {
                    match command_at(s.port, &["SENTINEL", "REPLICAS", Self::MASTER_NAME]) {
                        Ok(Resp::Array(replicas)) => !replicas.is_empty(),
                        _ => false,
                    }
                })
            },
        );
        setup
    }

    /// The current master.
    pub fn master(&self) -> &RedisServer {
        &self.servers[self.master]
    }

    /// The current replica.
    pub fn replica(&self) -> &RedisServer {
        &self.servers[1 - self.master]
    }

    /// The Sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://{HOST}:{}", s.port))
            .collect()
    }

    /// The Sentinel processes.
    pub fn sentinels(&self) -> &[SentinelProcess] {
        &self.sentinels
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and waits until every Sentinel names the
    /// former replica as master, it acts as master, and the former master follows it.
    /// Returns the new master's port.
    pub fn failover(&mut self) -> u16 {
        let new_master = 1 - self.master;
        let new_port = self.servers[new_master].port();
        let old_port = self.servers[self.master].port();
        let deadline = Instant::now() + Duration::from_secs(30);
        // The request can be refused while a Sentinel still refreshes what it knows
        // (`NOGOODSLAVE`, `INPROG`): ask again until one takes it.
        loop {
            let reply = command_at(
                self.sentinels[0].port,
                &["SENTINEL", "FAILOVER", Self::MASTER_NAME],
            );
            if matches!(reply, Ok(Resp::Simple(ref ok)) if ok == "OK") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Sentinel refused the failover: {reply:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        poll_until(
            "the Sentinels to agree on the new master",
            Duration::from_secs(30),
            || {
                self.sentinels.iter().all(|s| {
                    match command_at(
                        s.port,
                        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME],
                    ) {
                        Ok(Resp::Array(addr)) => {
                            addr.get(1).and_then(Resp::text) == Some(new_port.to_string())
                        }
                        _ => false,
                    }
                })
            },
        );
        poll_until(
            "the new master to take writes",
            Duration::from_secs(30),
            || {
                info_field(new_port, "replication", "role").as_deref() == Some("master")
                    && info_field(old_port, "replication", "role").as_deref() == Some("slave")
            },
        );
        self.master = new_master;
        new_port
    }

    /// Crashes the current master (SIGKILL): nothing it has not already sent to the replica
    /// reaches it any more. The Sentinels then fail over on their own (after
    /// `down-after-milliseconds`, one second here); wait for it with
    /// [`SentinelSetup::await_promotion`]. The crashed server is not restarted.
    pub fn crash_master(&mut self) {
        self.servers[self.master].kill();
    }

    /// After [`SentinelSetup::crash_master`], waits (up to 60 s) until every Sentinel names
    /// the replica as master and it acts as one, then makes it [`SentinelSetup::master`] (and
    /// the crashed server [`SentinelSetup::replica`]). Returns the new master's port.
    ///
    /// Panics if the Sentinels do not promote the replica in time, for instance because its
    /// replication link was down for too long for them to consider it.
    pub fn await_promotion(&mut self) -> u16 {
        let new_master = 1 - self.master;
        let new_port = self.servers[new_master].port();
        poll_until(
            "the Sentinels to promote the replica",
            Duration::from_secs(60),
            || {
                self.sentinels.iter().all(|s| {
                    match command_at(
                        s.port,
                        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME],
                    ) {
                        Ok(Resp::Array(addr)) => {
                            addr.get(1).and_then(Resp::text) == Some(new_port.to_string())
                        }
                        _ => false,
                    }
                }) && info_field(new_port, "replication", "role").as_deref() == Some("master")
            },
        );
        self.master = new_master;
        new_port
    }
}
