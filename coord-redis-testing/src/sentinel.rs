//! A Sentinel deployment: a master, its replica and three Sentinels watching them
//! ([`SentinelSetup`]), how to start it ([`SentinelOptions`]), and one Sentinel process
//! ([`SentinelProcess`]); forced failovers and crashes with their promotions awaited.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{TestCerts, TlsServing};
use crate::client::{Resp, command_at_auth, info_field_auth};
use crate::ports::{HOST, free_port};
use crate::process::{redis_server_binary, unique_dir};
use crate::server::{RedisServer, ServerOptions};
use crate::wait::{poll_until, wait_ready};

/// A Sentinel-managed master with one replica and three Sentinels.
#[derive(Debug)]
pub struct SentinelSetup {
    servers: Vec<RedisServer>,
    master: usize,
    sentinels: Vec<SentinelProcess>,
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
            server = server
                .tls_serving(tls.clone())
                .args(&["--tls-replication", "yes"]);
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

    /// Forces a failover (`SENTINEL FAILOVER`) once the replica has everything the master
    /// has, and waits until every Sentinel names the former replica as master, it acts as
    /// master, and the former master follows it. Returns the new master's port.
    ///
    /// A forced failover does not wait for the replica: a write still in the master's
    /// replication stream (a replica just synced is streamed to only after its first
    /// acknowledgement, up to a second later) would be lost with it, so this waits until the
    /// replica's offset reaches the master's.
    pub fn failover(&mut self) -> u16 {
        let (master, replica) = (self.master(), self.replica());
        let offset = |server: &RedisServer, field: &str| -> Option<u64> {
            info_field_auth(server.port(), server.password(), "replication", field)?
                .parse()
                .ok()
        };
        poll_until(
            "the replica to have every write of the master",
            Duration::from_secs(30),
            || {
                let written = offset(master, "master_repl_offset");
                written.is_some() && offset(replica, "slave_repl_offset") >= written
            },
        );
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
        self.tls = Some(certs.serving(client_auth));
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

/// The server's replication role (`master`, `slave`), or `None` while it cannot say: during
/// a failover the Sentinels kill every client connection of both servers (`CLIENT KILL TYPE
/// normal`), so a connection reset here means "ask again", not a broken server.
fn role(server: &RedisServer) -> Option<String> {
    info_field_auth(server.port(), server.password(), "replication", "role")
}
