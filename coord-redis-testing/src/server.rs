//! One `redis-server` process: how to start it ([`ServerOptions`]), and the handle that
//! talks to it, pauses, resumes, kills and restarts it ([`RedisServer`]).
//!
//! Counting the commands a server ran is in the `monitor` module.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::certs::{TestCerts, TlsServing};
use crate::client::{Resp, command_at_auth};
use crate::ports::{HOST, free_port};
use crate::process::{redis_server_binary, signal, unique_dir};
use crate::wait::{STARTUP, wait_ready};

/// How to start a [`RedisServer`] beyond plain TCP: TLS, a Unix socket, a password, extra
/// options. Every server also listens on a plain loopback port, for the test's own client.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    tls: Option<TlsServing>,
    unix_socket: bool,
    password: Option<String>,
    extra: Vec<String>,
}

impl ServerOptions {
    /// Plain TCP only, no password.
    pub fn new() -> ServerOptions {
        ServerOptions::default()
    }

    /// Also serve TLS on a second port with `certs` (server certificate for 127.0.0.1 and
    /// localhost), requiring a client certificate signed by its CA when `client_auth`.
    ///
    /// Panics when the server does not start because this `redis-server` build has no TLS
    /// support, saying so.
    pub fn tls(self, certs: &TestCerts, client_auth: bool) -> ServerOptions {
        self.tls_serving(certs.serving(client_auth))
    }

    /// Also serve TLS as `tls` says (the port is filled in at launch).
    pub(crate) fn tls_serving(mut self, tls: TlsServing) -> ServerOptions {
        self.tls = Some(tls);
        self
    }

    /// Also listen on a Unix socket in the server's temporary directory.
    pub fn unix_socket(mut self) -> ServerOptions {
        self.unix_socket = true;
        self
    }

    /// Require this password of the default user (`requirepass`); the test's own client
    /// ([`RedisServer::command`]) sends it.
    pub fn password(mut self, password: &str) -> ServerOptions {
        self.password = Some(password.to_owned());
        self
    }

    /// Extra command-line options (`["--maxmemory-policy", "allkeys-lru"]`).
    pub fn args(mut self, extra: &[&str]) -> ServerOptions {
        self.extra.extend(extra.iter().map(|s| s.to_string()));
        self
    }
}

/// One `redis-server` process on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    tls_port: Option<u16>,
    dir: PathBuf,
    options: ServerOptions,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone server on a free port and waits until it answers.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra command-line options (`["--requirepass", "x"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_configured(ServerOptions::new().args(extra))
    }

    /// Starts a server that also serves TLS (see [`ServerOptions::tls`]).
    pub fn start_tls(certs: &TestCerts, client_auth: bool) -> RedisServer {
        RedisServer::start_configured(ServerOptions::new().tls(certs, client_auth))
    }

    /// Starts a server that also listens on a Unix socket (see [`RedisServer::unix_url`]).
    pub fn start_unix() -> RedisServer {
        RedisServer::start_configured(ServerOptions::new().unix_socket())
    }

    /// Starts a server as `options` say, on free ports, and waits until it answers.
    pub fn start_configured(options: ServerOptions) -> RedisServer {
        let cluster = options.extra.iter().any(|a| a == "--cluster-enabled");
        // With a TLS cluster bus, the bus port is the TLS port's +10000.
        let tls_bus = cluster && options.extra.iter().any(|a| a == "--tls-cluster");
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port(cluster && !tls_bus);
            let tls_port = options.tls.as_ref().map(|_| free_port(tls_bus));
            let mut server = RedisServer {
                port,
                tls_port,
                dir: unique_dir("server"),
                options: options.clone(),
                child: None,
            };
            match server.launch() {
                Ok(()) => return server,
                Err(log) => {
                    if options.tls.is_some() && log.contains("tls-") {
                        panic!(
                            "this redis-server build has no TLS support (it refused the TLS \
                             options; Redis must be built with BUILD_TLS=yes, as Debian's \
                             redis-server is). Its log:\n{log}"
                        );
                    }
                    last_log = log;
                }
            }
        }
        panic!("redis-server did not start (tried five ports); last log:\n{last_log}");
    }

    /// Spawns the process on this handle's ports and directory and waits until it answers.
    /// The handle keeps the process only then; on `Err` (the log) it has been reaped.
    fn launch(&mut self) -> Result<(), String> {
        let binary = redis_server_binary();
        let log = self.dir.join("redis.log");
        let mut cmd = Command::new(&binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", HOST, "--save", "", "--appendonly", "no"])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            // A primary would wait 5 s for more replicas before each full sync it streams;
            // tests start their replicas one by one, so that wait is only lost time.
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log);
        if let (Some(tls), Some(tls_port)) = (&self.options.tls, self.tls_port) {
            cmd.arg("--tls-port")
                .arg(tls_port.to_string())
                .args(&tls.args);
        }
        if self.options.unix_socket {
            cmd.arg("--unixsocket")
                .arg(self.dir.join("redis.sock"))
                .args(["--unixsocketperm", "700"]);
        }
        if let Some(password) = &self.options.password {
            cmd.args(["--requirepass", password, "--masterauth", password]);
        }
        cmd.args(&self.options.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "could not run {}: {e}. Install Redis (`apt-get install redis-server`) or set \
                 REDIS_SERVER_BIN",
                binary.display()
            )
        });
        wait_ready(&mut child, self.port, &log)?;
        self.child = Some(child);
        Ok(())
    }

    /// One server for the whole test process, started on first use and killed when the
    /// process exits. For suites that separate their cases by namespace rather than by
    /// server; do not pause, kill or restart it (the other cases use it too).
    pub fn shared() -> &'static RedisServer {
        static SHARED: OnceLock<RedisServer> = OnceLock::new();
        extern "C" fn stop_shared() {
            if let Some(server) = SHARED.get() {
                if let Some(pid) = server.pid() {
                    // SAFETY: `kill` takes no pointers. The shared server is never killed
                    // (hence never reaped) while the process runs, so the pid is still its.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
                let _ = std::fs::remove_dir_all(&server.dir);
            }
        }
        SHARED.get_or_init(|| {
            let server = RedisServer::start();
            // Statics are never dropped: stop the server when the process exits instead.
            // SAFETY: `stop_shared` is an `extern "C" fn()`, as `atexit` requires; it only
            // reads the `OnceLock` (thread-safe, set or not) and cannot unwind into C (a
            // panic in an `extern "C"` function aborts).
            let registered = unsafe { libc::atexit(stop_shared) };
            assert_eq!(
                registered, 0,
                "could not register the shared server's cleanup"
            );
            server
        })
    }

    /// `redis://127.0.0.1:<port>` (no password in it, even when the server has one).
    pub fn url(&self) -> String {
        format!("redis://{HOST}:{}", self.port)
    }

    /// The plain TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port, when the server serves TLS.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// `rediss://127.0.0.1:<tls port>`.
    ///
    /// # Panics
    /// When the server does not serve TLS.
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("this server was started without TLS");
        format!("rediss://{HOST}:{port}")
    }

    /// Whether the TLS port requires a client certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.options.tls.as_ref().is_some_and(|t| t.client_auth)
    }

    /// The CA file the TLS port trusts for client certificates (the [`TestCerts`] CA).
    pub fn tls_ca_file(&self) -> Option<&Path> {
        self.options.tls.as_ref().map(|t| t.ca.as_path())
    }

    /// The Unix socket's path, when the server listens on one.
    pub fn unix_socket(&self) -> Option<PathBuf> {
        self.options
            .unix_socket
            .then(|| self.dir.join("redis.sock"))
    }

    /// `unix://<socket path>`.
    ///
    /// # Panics
    /// When the server listens on no Unix socket.
    pub fn unix_url(&self) -> String {
        let path = self
            .unix_socket()
            .expect("this server was started without a Unix socket");
        format!("unix://{}", path.display())
    }

    /// The default user's password, when the server was started with one.
    pub(crate) fn password(&self) -> Option<&str> {
        self.options.password.as_deref()
    }

    /// Adds (or resets) the ACL user `name` with `password` and `rules` (`["~app:*", "&*",
    /// "+@all"]`; all keys, channels and commands when empty), and checks that the server
    /// took it.
    pub fn add_acl_user(&self, name: &str, password: &str, rules: &[&str]) {
        let pass = format!(">{password}");
        let mut args = vec!["ACL", "SETUSER", name, "reset", "on", &pass];
        if rules.is_empty() {
            args.extend(["~*", "&*", "+@all"]);
        } else {
            args.extend(rules);
        }
        let reply = self.command(&args);
        assert_eq!(reply, Resp::Simple("OK".into()), "ACL SETUSER {name}");
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

    /// Runs one command over the plain port (authenticated when the server has a password)
    /// and returns its reply; panics if the server cannot be reached.
    pub fn command(&self, args: &[&str]) -> Resp {
        command_at_auth(self.port, self.password(), args)
            .unwrap_or_else(|e| panic!("redis-server on port {}: {e}", self.port))
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
