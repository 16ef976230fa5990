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
//!
//! Beyond plain TCP: [`ServerOptions`] starts a server that also listens with TLS (on a
//! second port, with certificates from [`TestCerts`], optionally requiring client
//! certificates), on a Unix socket, or with a password; [`RedisCluster::start_tls`] and
//! [`SentinelSetup::start_configured`] do the same for a cluster and a Sentinel setup. Every
//! such server keeps its plain loopback port for the test's own client ([`RedisServer::command`]
//! authenticates when the server has a password); give the code under test the TLS or socket
//! address ([`RedisServer::tls_url`], [`RedisServer::unix_url`]).

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
    command_at_auth(port, None, args)
}

/// Like [`command_at`], authenticating first (`AUTH password`, the default user) when
/// `password` is given. An `AUTH` refused is returned as its error reply.
pub fn command_at_auth(port: u16, password: Option<&str>, args: &[&str]) -> std::io::Result<Resp> {
    let addr: SocketAddr = format!("{HOST}:{port}").parse().expect("loopback address");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.set_nodelay(true)?;
    let encode = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out
    };
    let mut out = Vec::new();
    if let Some(password) = password {
        out.extend(encode(&["AUTH", password]));
    }
    out.extend(encode(args));
    stream.write_all(&out)?;
    let mut reader = BufReader::new(stream);
    if password.is_some() {
        let auth = read_resp(&mut reader)?;
        if matches!(auth, Resp::Error(_)) {
            return Ok(auth);
        }
    }
    read_resp(&mut reader)
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

/// A throwaway certificate authority, with a server certificate (for `127.0.0.1`, `::1` and
/// `localhost`) and a client certificate signed by it, as PEM files in a private temporary
/// directory that is removed on drop. Generated with `rcgen` (ECDSA P-256); valid from 1975
/// to 4096, so never expired in a test.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

impl TestCerts {
    /// Generates a CA and its two certificates, and writes them to files.
    pub fn generate() -> TestCerts {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "coord test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca_params, ca_key);

        let leaf = |names: Vec<String>, cn: &str, usage: &[ExtendedKeyUsagePurpose]| {
            let mut params = CertificateParams::new(names).expect("certificate params");
            params.distinguished_name.push(DnType::CommonName, cn);
            params.use_authority_key_identifier_extension = true;
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = usage.to_vec();
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &issuer).expect("sign a leaf");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "::1".into(), "localhost".into()],
            "localhost",
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                // Servers present it on their own outgoing connections too.
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) = leaf(
            vec!["coord-test-client".into()],
            "coord-test-client",
            &[ExtendedKeyUsagePurpose::ClientAuth],
        );
        let dir = unique_dir("certs");
        let certs = TestCerts {
            dir,
            ca_pem: ca_cert.pem(),
            client_cert_pem: client_cert,
            client_key_pem: client_key,
        };
        for (name, text) in [
            ("ca.crt", certs.ca_pem.as_str()),
            ("server.crt", server_cert.as_str()),
            ("server.key", server_key.as_str()),
            ("client.crt", certs.client_cert_pem.as_str()),
            ("client.key", certs.client_key_pem.as_str()),
        ] {
            std::fs::write(certs.dir.join(name), text).expect("write a test certificate");
        }
        certs
    }

    /// The CA certificate's file.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server certificate's file.
    pub fn server_cert_file(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server key's file.
    pub fn server_key_file(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The client certificate's file.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// The client key's file.
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// The client certificate, PEM.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert_pem
    }

    /// The client key, PEM (PKCS#8).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key_pem
    }

    /// `redis-server` options serving TLS with these certificates (the port aside),
    /// requiring a client certificate signed by the CA when `client_auth`. The server
    /// certificate also serves as the client certificate of the server's own outgoing
    /// connections (replication, cluster bus, Sentinel).
    fn server_args(&self, client_auth: bool) -> Vec<String> {
        vec![
            "--tls-cert-file".into(),
            self.server_cert_file().display().to_string(),
            "--tls-key-file".into(),
            self.server_key_file().display().to_string(),
            "--tls-ca-cert-file".into(),
            self.ca_file().display().to_string(),
            "--tls-auth-clients".into(),
            if client_auth { "yes" } else { "no" }.into(),
        ]
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How to start a [`RedisServer`] beyond plain TCP: TLS, a Unix socket, a password, extra
/// options. Every server also listens on a plain loopback port, for the test's own client.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    tls: Option<TlsServing>,
    unix_socket: bool,
    password: Option<String>,
    extra: Vec<String>,
}

#[derive(Debug, Clone)]
struct TlsServing {
    args: Vec<String>,
    client_auth: bool,
    ca: PathBuf,
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
    pub fn tls(mut self, certs: &TestCerts, client_auth: bool) -> ServerOptions {
        self.tls = Some(TlsServing {
            // The port is filled in at launch.
            args: certs.server_args(client_auth),
            client_auth,
            ca: certs.ca_file(),
        });
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
        command_at_auth(self.port, self.options.password.as_deref(), args)
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

/// The replication role (`master`, `slave`) `server` reports.
/// The server's replication role, or `None` while it cannot say: during a failover the
/// Sentinels kill every client connection of both servers (`CLIENT KILL TYPE normal`), so a
/// connection reset here means "ask again", not a broken server.
fn role(server: &RedisServer) -> Option<String> {
    info_field_auth(
        server.port(),
        server.options.password.as_deref(),
        "replication",
        "role",
    )
}

fn info_field_auth(
    port: u16,
    password: Option<&str>,
    section: &str,
    field: &str,
) -> Option<String> {
    let text = command_at_auth(port, password, &["INFO", section])
        .ok()?
        .text()?;
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
        RedisCluster::start_configured(masters, None)
    }

    /// Like [`RedisCluster::start`], with every node serving TLS with `certs` (not
    /// requiring client certificates) and the cluster bus over TLS (`tls-cluster yes`):
    /// `CLUSTER SLOTS` tells TLS clients the TLS ports. Give clients
    /// [`RedisCluster::tls_urls`].
    pub fn start_tls(masters: usize, certs: &TestCerts) -> RedisCluster {
        RedisCluster::start_configured(masters, Some(certs))
    }

    fn start_configured(masters: usize, tls: Option<&TestCerts>) -> RedisCluster {
        assert!(masters >= 1, "a cluster needs at least one node");
        let mut options = ServerOptions::new().args(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
        ]);
        if let Some(certs) = tls {
            options = options.tls(certs, false).args(&[
                "--tls-cluster",
                "yes",
                "--tls-replication",
                "yes",
            ]);
        }
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_configured(options.clone()))
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
            // Over a TLS bus, a node is met at its TLS port (its bus port is that +10000).
            let port = if tls.is_some() {
                node.tls_port().expect("a TLS node")
            } else {
                node.port()
            };
            let reply = nodes[0].command(&["CLUSTER", "MEET", HOST, &port.to_string()]);
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

    /// Every node's TLS URL (`rediss://`), for a cluster started with
    /// [`RedisCluster::start_tls`].
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
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

/// How to start a [`SentinelSetup`] beyond plain TCP without passwords.
#[derive(Debug, Clone, Default)]
pub struct SentinelOptions {
    tls: Option<TlsServing>,
    sentinel_password: Option<String>,
    data_password: Option<String>,
}

impl SentinelOptions {
    /// Plain TCP, no passwords.
    pub fn new() -> SentinelOptions {
        SentinelOptions::default()
    }

    /// Data nodes and Sentinels also serve TLS with `certs` (requiring client certificates
    /// when `client_auth`); replication and the Sentinels' own connections use TLS, and the
    /// Sentinels name the master by its TLS port.
    pub fn tls(mut self, certs: &TestCerts, client_auth: bool) -> SentinelOptions {
        self.tls = Some(TlsServing {
            args: certs.server_args(client_auth),
            client_auth,
            ca: certs.ca_file(),
        });
        self
    }

    /// The Sentinels require this password (`requirepass`, and `sentinel sentinel-pass` among
    /// themselves).
    pub fn sentinel_password(mut self, password: &str) -> SentinelOptions {
        self.sentinel_password = Some(password.to_owned());
        self
    }

    /// The data nodes require this password (`requirepass`, `masterauth`, and `sentinel
    /// auth-pass` for the Sentinels).
    pub fn data_password(mut self, password: &str) -> SentinelOptions {
        self.data_password = Some(password.to_owned());
        self
    }
}

/// One Sentinel process, killed on drop.
#[derive(Debug)]
pub struct SentinelProcess {
    port: u16,
    tls_port: Option<u16>,
    password: Option<String>,
    dir: PathBuf,
    child: Child,
}

impl SentinelProcess {
    fn start(master_name: &str, master_port: u16, options: &SentinelOptions) -> SentinelProcess {
        let binary = redis_server_binary();
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port(false);
            let tls_port = options.tls.as_ref().map(|_| free_port(false));
            let dir = unique_dir("sentinel");
            let conf = dir.join("sentinel.conf");
            let log = dir.join("sentinel.log");
            let mut text = format!(
                "port {port}\nbind {HOST}\nprotected-mode no\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {master_name} {HOST} {master_port} 2\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 10000\n\
                 sentinel parallel-syncs {master_name} 1\n",
                dir = dir.display(),
                log = log.display(),
            );
            if let (Some(tls), Some(tls_port)) = (&options.tls, tls_port) {
                text.push_str(&format!("tls-port {tls_port}\ntls-replication yes\n"));
                for pair in tls.args.chunks(2) {
                    text.push_str(&format!(
                        "{} {}\n",
                        pair[0].trim_start_matches("--"),
                        pair[1]
                    ));
                }
            }
            if let Some(password) = &options.data_password {
                text.push_str(&format!("sentinel auth-pass {master_name} {password}\n"));
            }
            if let Some(password) = &options.sentinel_password {
                text.push_str(&format!(
                    "requirepass {password}\nsentinel sentinel-pass {password}\n"
                ));
            }
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
                Ok(()) => {
                    return SentinelProcess {
                        port,
                        tls_port,
                        password: options.sentinel_password.clone(),
                        dir,
                        child,
                    };
                }
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

    /// The Sentinel's plain port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Sentinel's TLS port, when it serves TLS.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// Runs one command on this Sentinel (authenticated when it has a password).
    pub fn command(&self, args: &[&str]) -> std::io::Result<Resp> {
        command_at_auth(self.port, self.password.as_deref(), args)
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
        SentinelSetup::start_configured(SentinelOptions::new())
    }

    /// Like [`SentinelSetup::start`], with TLS and passwords as `options` say.
    pub fn start_configured(options: SentinelOptions) -> SentinelSetup {
        let mut server = ServerOptions::new();
        if let Some(tls) = &options.tls {
            server.tls = Some(tls.clone());
            server = server.args(&["--tls-replication", "yes"]);
        }
        if let Some(password) = &options.data_password {
            server = server.password(password);
        }
        let master = RedisServer::start_configured(server.clone());
        // Replication, and the Sentinels, use the TLS port when there is one.
        let master_port = master.tls_port().unwrap_or(master.port());
        let replica = RedisServer::start_configured(server.args(&[
            "--replicaof",
            HOST,
            &master_port.to_string(),
        ]));
        let data_password = options.data_password.clone();
        poll_until("the replica to sync", Duration::from_secs(20), || {
            info_field_auth(
                replica.port(),
                data_password.as_deref(),
                "replication",
                "master_link_status",
            )
            .as_deref()
                == Some("up")
        });
        let sentinels: Vec<SentinelProcess> = (0..3)
            .map(|_| SentinelProcess::start(Self::MASTER_NAME, master_port, &options))
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
                    match s.command(&["SENTINEL", "REPLICAS", Self::MASTER_NAME]) {
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

    /// The Sentinels' URLs (plain ports, no password in them).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://{HOST}:{}", s.port))
            .collect()
    }

    /// The Sentinels' TLS URLs (`rediss://`, no password in them).
    ///
    /// # Panics
    /// When the setup was started without TLS.
    pub fn sentinel_tls_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| {
                let port = s.tls_port.expect("this setup was started without TLS");
                format!("rediss://{HOST}:{port}")
            })
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
        // What the Sentinels name: the TLS port when the nodes serve TLS.
        let named = self.servers[new_master].tls_port().unwrap_or(new_port);
        let deadline = Instant::now() + Duration::from_secs(30);
        // The request can be refused while a Sentinel still refreshes what it knows
        // (`NOGOODSLAVE`, `INPROG`): ask again until one takes it.
        loop {
            let reply = self.sentinels[0].command(&["SENTINEL", "FAILOVER", Self::MASTER_NAME]);
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
                    match s.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME]) {
                        Ok(Resp::Array(addr)) => {
                            addr.get(1).and_then(Resp::text) == Some(named.to_string())
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
                role(&self.servers[new_master]).as_deref() == Some("master")
                    && role(&self.servers[self.master]).as_deref() == Some("slave")
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
        let named = self.servers[new_master].tls_port().unwrap_or(new_port);
        poll_until(
            "the Sentinels to promote the replica",
            Duration::from_secs(60),
            || {
                self.sentinels.iter().all(|s| {
                    match s.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::MASTER_NAME]) {
                        Ok(Resp::Array(addr)) => {
                            addr.get(1).and_then(Resp::text) == Some(named.to_string())
                        }
                        _ => false,
                    }
                }) && role(&self.servers[new_master]).as_deref() == Some("master")
            },
        );
        self.master = new_master;
        new_port
    }
}
