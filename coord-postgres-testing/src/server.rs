//! One PostgreSQL server: how to start it ([`ServerOptions`]), and the handle that talks to
//! it, pauses, resumes, kills and restarts it ([`PostgresServer`]).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::binaries::postgres_bin_dir;
use crate::dirs::{fresh_data_dir, unique_dir};
use crate::process::{HOST, as_user, free_port, kill_strays, signal_server};
use crate::psql::{self, literal};
use crate::user::{RunAs, run_as};

/// How long a server gets to accept connections after it is started (crash recovery
/// included).
const STARTUP: Duration = Duration::from_secs(30);

/// How to start a [`PostgresServer`].
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    durable: bool,
    max_connections: Option<u32>,
    settings: Vec<(String, String)>,
}

impl ServerOptions {
    /// The defaults: `fsync = off` (commits still survive a killed server, since the
    /// operating system keeps what was written; they would not survive a power cut),
    /// `synchronous_commit` left on, 100 connections.
    pub fn new() -> ServerOptions {
        ServerOptions::default()
    }

    /// Keep `fsync = on`, for a test about durability beyond the server process.
    pub fn durable(mut self) -> ServerOptions {
        self.durable = true;
        self
    }

    /// At most `n` connections (`max_connections`; 3 of them are reserved for superusers, so
    /// `n` must be at least 4).
    pub fn max_connections(mut self, n: u32) -> ServerOptions {
        self.max_connections = Some(n);
        self
    }

    /// Any other setting, passed as `-c name=value` (it then overrides `ALTER SYSTEM`).
    pub fn setting(mut self, name: &str, value: &str) -> ServerOptions {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// One PostgreSQL server on 127.0.0.1, listening on a free port and on a Unix socket in its
/// private temporary directory; killed, and its directory removed, on drop.
///
/// The superuser is `postgres`, authentication is `trust` (no password), and the database
/// `postgres` exists. When the test runs as root, the server runs as the `postgres` account
/// (or `nobody`): PostgreSQL refuses to run as root.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    owner: Option<RunAs>,
    options: ServerOptions,
    child: Option<Child>,
}

impl PostgresServer {
    /// Starts a server with the default options and waits until it accepts connections.
    pub fn start() -> PostgresServer {
        PostgresServer::start_configured(ServerOptions::new())
    }

    /// Starts a server as `options` say, on a free port, and waits until it accepts
    /// connections.
    ///
    /// # Panics
    /// When the binaries are missing (naming the package to install) or the server does not
    /// start (with its log).
    pub fn start_configured(options: ServerOptions) -> PostgresServer {
        let bin = postgres_bin_dir();
        let owner = run_as();
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = unique_dir("server", owner.as_ref());
            fresh_data_dir(&bin, &dir.join("data"), owner.as_ref());
            let mut server = PostgresServer {
                port: free_port(),
                dir,
                bin: bin.clone(),
                owner: owner.clone(),
                options: options.clone(),
                child: None,
            };
            match server.launch() {
                Ok(()) => return server,
                Err(log) => last_log = log,
            }
        }
        panic!("PostgreSQL did not start (tried five ports); last log:\n{last_log}");
    }

    /// Starts a streaming standby of this server, as `options` say, and waits until it
    /// accepts (read-only) connections: a base backup of this server (`pg_basebackup -R -X
    /// stream`, so it streams from this server's port), started with `cluster_name = name`,
    /// which is the name the primary sees it by (`pg_stat_replication.application_name`, the
    /// name `synchronous_standby_names` lists). The standby is a [`PostgresServer`] of its
    /// own: killed and removed on drop, and [`promote`](Self::promote) makes it a primary.
    ///
    /// Whether commits wait for it is the primary's `synchronous_standby_names`, which this
    /// does not set.
    ///
    /// # Panics
    /// When the base backup fails or the standby does not start (with its log).
    pub fn start_standby(&self, name: &str, options: ServerOptions) -> PostgresServer {
        let dir = unique_dir("standby", self.owner.as_ref());
        let mut backup = Command::new(self.bin.join("pg_basebackup"));
        backup
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-h", HOST, "-p", &self.port.to_string(), "-U", "postgres"])
            .args(["-R", "-X", "stream", "--no-sync", "--checkpoint=fast"])
            .stdin(Stdio::null());
        as_user(&mut backup, self.owner.as_ref());
        let out = backup.output().unwrap_or_else(|e| {
            panic!(
                "could not run {}: {e}",
                self.bin.join("pg_basebackup").display()
            )
        });
        assert!(
            out.status.success(),
            "pg_basebackup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut standby = PostgresServer {
            port: free_port(),
            dir,
            bin: self.bin.clone(),
            owner: self.owner.clone(),
            options: options.setting("cluster_name", name),
            child: None,
        };
        // A port taken in between is the only failure worth another try.
        let mut last_log = String::new();
        for _ in 0..5 {
            match standby.launch() {
                Ok(()) => return standby,
                Err(log) => {
                    last_log = log;
                    standby.port = free_port();
                }
            }
        }
        panic!("the standby did not start; last log:\n{last_log}");
    }

    /// Promotes this standby to a primary (`pg_promote`, waiting up to 60 s): it replays
    /// every WAL record it has received, leaves recovery and takes writes. What the old
    /// primary committed and never sent here is not on it.
    ///
    /// # Panics
    /// When this server is not a standby or the promotion does not finish in time.
    pub fn promote(&self) {
        assert_eq!(
            self.sql("SELECT pg_promote(true, 60)"),
            "t",
            "the standby was not promoted within 60 s"
        );
        assert_eq!(self.sql("SELECT pg_is_in_recovery()"), "f");
    }

    /// One server for the whole test process, started on first use and killed when the
    /// process exits. For suites that keep their cases apart by schema or namespace; do not
    /// pause, kill or restart it (the other cases use it too).
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<PostgresServer> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(server) = SHARED.get() {
                if let Some(pid) = server.pid() {
                    signal_server(pid, libc::SIGKILL);
                }
                let _ = std::fs::remove_dir_all(&server.dir);
            }
        }
        SHARED.get_or_init(|| {
            let server = PostgresServer::start();
            // Statics are never dropped: stop the server when the process exits instead.
            // SAFETY: `stop_shared` is an `extern "C" fn()`, as `atexit` requires; it only
            // reads the `OnceLock` (set by now) and cannot unwind into C (a panic in an
            // `extern "C"` function aborts).
            let registered = unsafe { libc::atexit(stop_shared) };
            assert_eq!(
                registered, 0,
                "could not register the shared server's cleanup"
            );
            server
        })
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// Spawns the postmaster on this handle's port and data directory and waits until it accepts connections. On `Err` (its log) it has been reaped.
    fn launch(&mut self) -> Result<(), String> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("open the server log: {e}"))?;
        let stderr = log
            .try_clone()
            .map_err(|e| format!("open the server log: {e}"))?;
        let mut cmd = Command::new(self.bin.join("postgres"));
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir)
            .args(["-c", &format!("listen_addresses={HOST}")])
            .args(["-c", "shared_buffers=16MB"])
            .args(["-c", "unix_socket_permissions=0777"])
            .args(["-c", "log_min_messages=warning"]);
        if !self.options.durable {
            cmd.args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
        }
        if let Some(n) = self.options.max_connections {
            cmd.args(["-c", &format!("max_connections={n}")]);
        }
        for (name, value) in &self.options.settings {
            cmd.args(["-c", &format!("{name}={value}")]);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        as_user(&mut cmd, self.owner.as_ref());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "could not run {}: {e}. Install PostgreSQL (`apt-get install postgresql`)",
                self.bin.join("postgres").display()
            )
        });
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("postgres exited ({status}):\n{}", self.log()));
            }
            if self.is_ready(child.id()) {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                signal_server(child.id(), libc::SIGKILL);
                let _ = child.wait();
                return Err(format!(
                    "postgres on port {} did not accept connections within {STARTUP:?}:\n{}",
                    self.port,
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the postmaster `pid` says it is ready (its lock file, rewritten at each start,
    /// names it and ends with `ready`) and its port accepts a connection.
    fn is_ready(&self, pid: u32) -> bool {
        let Ok(lock) = std::fs::read_to_string(self.data_dir().join("postmaster.pid")) else {
            return false;
        };
        let mut lines = lock.lines();
        let ours = lines.next().map(str::trim) == Some(pid.to_string().as_str());
        // A standby in hot standby says `standby` once it accepts connections.
        ours && matches!(lines.nth(6).map(str::trim), Some("ready" | "standby"))
            && std::net::TcpStream::connect((HOST, self.port)).is_ok()
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` (trust authentication: no password).
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// The URL of database `db` on this server, as the superuser.
    pub fn url_for(&self, db: &str) -> String {
        format!("postgres://postgres@{HOST}:{}/{db}", self.port)
    }

    /// A URL through the Unix socket: `postgresql:///postgres?host=<dir>&port=<port>&user=postgres`.
    pub fn unix_url(&self) -> String {
        let host: String = self
            .dir
            .to_string_lossy()
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' | b'_' | b'-' => {
                    (b as char).to_string()
                }
                other => format!("%{other:02X}"),
            })
            .collect();
        format!(
            "postgresql:///postgres?host={host}&port={}&user=postgres",
            self.port
        )
    }

    /// The directory holding the Unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The TCP port (also the socket's number).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the postmaster is running (started, not killed or stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Freezes the whole server (SIGSTOP to the postmaster and every backend): connections
    /// stay open, nothing is answered, new connections get no answer.
    pub fn pause(&self) {
        let pid = self.pid().expect("the server is running");
        assert!(
            signal_server(pid, libc::SIGSTOP),
            "SIGSTOP to postgres failed"
        );
    }

    /// Thaws a paused server (SIGCONT to all of it).
    pub fn resume(&self) {
        let pid = self.pid().expect("the server is running");
        assert!(
            signal_server(pid, libc::SIGCONT),
            "SIGCONT to postgres failed"
        );
    }

    /// Kills the whole server at once (SIGKILL to the postmaster and every backend), as a
    /// crash would, and waits for the postmaster to exit. The data directory stays: a
    /// [`restart`](Self::restart) recovers what was committed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_server(child.id(), libc::SIGKILL);
            // A stopped process still dies of SIGKILL.
            let _ = child.wait();
            // A crash leaves no server process behind, whatever signalling missed.
            kill_strays(&self.data_dir());
            // Wait until the port is free of the old listener.
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::net::TcpStream::connect((HOST, self.port)).is_ok()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Stops the server cleanly (fast shutdown: open transactions are rolled back,
    /// connections closed) and waits for it to exit; killed if it takes longer than 10 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A paused server must run to shut down.
            signal_server(child.id(), libc::SIGCONT);
            // SIGINT to the postmaster alone: it shuts its backends down itself.
            // SAFETY: `kill` takes no pointers; the child is unreaped, so its pid is its own.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    _ => {
                        signal_server(child.id(), libc::SIGKILL);
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Kills the server if it runs (as [`kill`](Self::kill) does), then starts it again on
    /// the same port and data directory, and waits until it accepts connections (after crash
    /// recovery: committed work is there, connections and sessions are gone).
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// Kills the server if it runs (as [`kill`](Self::kill) does), replaces its data
    /// directory with a freshly initialised one (as `initdb` leaves it: every database,
    /// table and commit of before is gone), and starts it again on the same port: a crash
    /// that lost the disk. Schemas (coord's migration) must be created again by the caller.
    ///
    /// # Panics
    /// When the old directory cannot be removed or the server does not come up within 30 s.
    pub fn restart_without_data(&mut self) {
        self.kill();
        let data = self.data_dir();
        std::fs::remove_dir_all(&data)
            .unwrap_or_else(|e| panic!("remove the data directory {}: {e}", data.display()));
        fresh_data_dir(&self.bin, &data, self.owner.as_ref());
        self.start_again();
    }

    /// Starts a stopped or killed server again on the same port and data directory.
    ///
    /// # Panics
    /// When it is running, or does not come up within 30 s.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is still running");
        let deadline = Instant::now() + STARTUP;
        loop {
            match self.launch() {
                Ok(()) => return,
                Err(log) if Instant::now() > deadline => {
                    panic!("postgres did not restart on port {}:\n{log}", self.port)
                }
                // The old socket may linger a moment.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Runs `sql` in database `postgres` as the superuser and returns the rows it printed
    /// (one line each, columns separated by `|`); `Err` with psql's message on any error.
    /// Bounded: fails after 20 s (a paused server).
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        psql::run(&self.bin, self.port, "postgres", sql)
    }

    /// [`try_sql`](Self::try_sql), panicking on an error.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|e| panic!("SQL on the test server failed: {e}\n{sql}"))
    }

    /// Ends every session whose `application_name` is `name` (`pg_terminate_backend`), as an
    /// administrator or a failing network would: their next statement fails. Returns how many
    /// were ended.
    pub fn terminate_connections(&self, name: &str) -> usize {
        let count = self.sql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = {} AND pid <> pg_backend_pid()",
            literal(name)
        ));
        count.trim().parse().unwrap_or(0)
    }

    /// How many sessions with `application_name` = `name` are connected.
    pub fn connections(&self, name: &str) -> usize {
        let count = self.sql(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = {}",
            literal(name)
        ));
        count.trim().parse().unwrap_or(0)
    }

    /// Sets `max_connections` to `n` (at least 4) and restarts the server cleanly so that it
    /// takes effect (every connection is closed).
    pub fn set_max_connections(&mut self, n: u32) {
        self.options.max_connections = Some(n);
        self.stop();
        self.start_again();
    }

    /// Makes every transaction read-only from the next statement of each session on
    /// (`default_transaction_read_only`, set with `ALTER SYSTEM` and reloaded), as a server
    /// put in read-only mode for maintenance is; `false` undoes it.
    pub fn set_read_only(&self, read_only: bool) {
        let value = if read_only { "on" } else { "off" };
        self.sql(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {value}"
        ));
        self.sql("SELECT pg_reload_conf()");
        // The reload is asynchronous: wait until a new session sees it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.sql("SHOW default_transaction_read_only").trim() != value {
            assert!(
                Instant::now() < deadline,
                "the server did not reload its configuration"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Creates database `name` (owned by the superuser).
    pub fn create_database(&self, name: &str) {
        self.sql(&format!(
            "CREATE DATABASE \"{}\"",
            name.replace('"', "\"\"")
        ));
    }

    /// The server's log so far (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_server(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
        // Whatever signalling the postmaster's children missed.
        kill_strays(&self.data_dir());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
