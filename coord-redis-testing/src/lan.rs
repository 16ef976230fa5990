//! A private network of Linux network namespaces for partition tests ([`TestLan`]), and
//! redis-server and Sentinel processes living in it ([`LanServer`]).
//!
//! Layout: one *hub* namespace holds a bridge with the address `198.18.0.1`; each *host*
//! namespace `i` is joined to the bridge by a veth pair and has the address `198.18.0.(10+i)`
//! (198.18.0.0/15 is reserved for network tests, so it clashes with no real network; and it
//! exists only inside the namespaces created here, never on the machine's own interfaces).
//! A process started in the hub reaches every host and is never cut off: that is where a
//! test's controller runs. [`TestLan::cut`] partitions hosts with blackhole routes on both
//! sides (packets vanish, connections hang as they do behind a failed switch);
//! [`TestLan::heal`] removes them.
//!
//! Needs root (or `CAP_SYS_ADMIN` and `CAP_NET_ADMIN`) and the `ip` tool of iproute2;
//! without them [`TestLan::create`] panics saying so, as the rest of this crate does for a
//! missing `redis-server`. The namespaces are deleted when the creating handle is dropped.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::{Resp, command_to};
use crate::process::{redis_server_binary, unique_dir};

/// Runs `ip args`, panicking with its error output when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("could not run `ip` (install iproute2; network namespaces need it): {e}")
        });
    assert!(
        out.status.success(),
        "`ip {}` failed ({}): {}. Network namespace tests need root (CAP_SYS_ADMIN and \
         CAP_NET_ADMIN) and the `ip` tool of iproute2",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Network namespaces joined by a bridge, with partitions made of blackhole routes.
///
/// The handle that [`TestLan::create`]d the namespaces deletes them on drop; a handle from
/// [`TestLan::attach`] (in another process of the same test) does not.
#[derive(Debug)]
pub struct TestLan {
    prefix: String,
    hosts: usize,
    owner: bool,
    cuts: Mutex<Vec<(usize, usize)>>,
}

impl TestLan {
    /// The hub's own address, on the bridge.
    pub const HUB_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

    /// Creates the hub and `hosts` host namespaces (at most 200), named after this process
    /// so that concurrent tests do not meet.
    ///
    /// # Panics
    /// When a namespace or link cannot be created (not root, no `ip`): the message says so.
    pub fn create(hosts: usize) -> TestLan {
        assert!(hosts <= 200, "a TestLan has at most 200 hosts");
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let prefix = format!(
            "coordlan{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        // Owned from the first namespace on, so that a failure half-way still cleans up.
        let lan = TestLan {
            prefix,
            hosts,
            owner: true,
            cuts: Mutex::new(Vec::new()),
        };
        let hub = lan.hub();
        ip(&["netns", "add", &hub]);
        ip(&["-n", &hub, "link", "set", "lo", "up"]);
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &hub,
            "addr",
            "add",
            &format!("{}/24", Self::HUB_IP),
            "dev",
            "br0",
        ]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        for i in 0..hosts {
            let ns = lan.host(i);
            let port = format!("h{i}");
            ip(&["netns", "add", &ns]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            ip(&["-n", &hub, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &hub, "link", "set", &port, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", lan.ip(i)),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        lan
    }

    /// A handle on namespaces another process created with [`TestLan::create`]
    /// ([`TestLan::prefix`] and the host count tell which). Dropping it deletes nothing.
    pub fn attach(prefix: &str, hosts: usize) -> TestLan {
        TestLan {
            prefix: prefix.to_owned(),
            hosts,
            owner: false,
            cuts: Mutex::new(Vec::new()),
        }
    }

    /// What names this network's namespaces (for [`TestLan::attach`]).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many hosts it has.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// The hub namespace's name.
    pub fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// Host `i`'s namespace name.
    pub fn host(&self, i: usize) -> String {
        assert!(i < self.hosts, "host {i} of a {}-host TestLan", self.hosts);
        format!("{}-{i}", self.prefix)
    }

    /// Host `i`'s address.
    pub fn ip(&self, i: usize) -> Ipv4Addr {
        assert!(i < self.hosts, "host {i} of a {}-host TestLan", self.hosts);
        Ipv4Addr::new(198, 18, 0, 10 + i as u8)
    }

    /// A command that runs `program` inside namespace `ns` (`ip netns exec`, which execs
    /// it: the child's pid is the program's).
    pub fn command_in(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program);
        cmd
    }

    /// Cuts every host of `a` off from every host of `b`, both ways (blackhole routes on
    /// each side). Hosts on the same side, and the hub, still reach each other.
    pub fn cut(&self, a: &[usize], b: &[usize]) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        for &x in a {
            for &y in b {
                for (from, to) in [(x, y), (y, x)] {
                    if cuts.contains(&(from, to)) {
                        continue;
                    }
                    ip(&[
                        "-n",
                        &self.host(from),
                        "route",
                        "add",
                        "blackhole",
                        &format!("{}/32", self.ip(to)),
                    ]);
                    cuts.push((from, to));
                }
            }
        }
    }

    /// Removes every cut this handle made.
    pub fn heal(&self) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        for (from, to) in cuts.drain(..) {
            ip(&[
                "-n",
                &self.host(from),
                "route",
                "del",
                "blackhole",
                &format!("{}/32", self.ip(to)),
            ]);
        }
    }
}

impl Drop for TestLan {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        // Deleting a namespace removes its links; processes still inside keep it alive until
        // they exit (their owners kill them).
        for i in 0..self.hosts {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.host(i)])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.hub()])
            .stderr(Stdio::null())
            .status();
    }
}

/// A redis-server (data node or Sentinel) running in a [`TestLan`] host, killed on drop.
///
/// It binds the host's address only; reach it from the hub (or a host not cut off from it)
/// with [`LanServer::command`].
#[derive(Debug)]
pub struct LanServer {
    addr: SocketAddrV4,
    dir: PathBuf,
    child: Child,
}

impl LanServer {
    /// Starts a data node in host `host` on `port`, with `extra` arguments (`--appendonly
    /// yes`, `--replicaof ip port`, `--min-replicas-to-write 1`, ...), and waits until it
    /// answers.
    pub fn start(lan: &TestLan, host: usize, port: u16, extra: &[&str]) -> LanServer {
        let dir = unique_dir("lan-server");
        let ip = lan.ip(host);
        let mut cmd = TestLan::command_in(&lan.host(host), redis_server_binary());
        cmd.arg("--port")
            .arg(port.to_string())
            .args(["--bind", &ip.to_string(), "--save", ""])
            .args(["--protected-mode", "no", "--daemonize", "no"])
            // No 5 s wait for more replicas before a full sync (at set-up, and when a demoted
            // primary rejoins): nothing here depends on replicas arriving together.
            .args(["--repl-diskless-sync-delay", "0"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(extra);
        LanServer::launch(cmd, SocketAddrV4::new(ip, port), dir)
    }

    /// Starts a Sentinel in host `host` on `port` that monitors `master` as `master_name`
    /// with `quorum`, declaring it down after `down_after` without answers.
    pub fn start_sentinel(
        lan: &TestLan,
        host: usize,
        port: u16,
        master_name: &str,
        master: SocketAddrV4,
        quorum: u32,
        down_after: Duration,
    ) -> LanServer {
        let dir = unique_dir("lan-sentinel");
        let ip = lan.ip(host);
        let conf = dir.join("sentinel.conf");
        let text = format!(
            "port {port}\nbind {ip}\nprotected-mode no\ndaemonize no\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {master_name} {mip} {mport} {quorum}\n\
             sentinel down-after-milliseconds {master_name} {down}\n\
             sentinel failover-timeout {master_name} 10000\n\
             sentinel parallel-syncs {master_name} 1\n",
            dir = dir.display(),
            log = dir.join("redis.log").display(),
            mip = master.ip(),
            mport = master.port(),
            down = down_after.as_millis(),
        );
        std::fs::write(&conf, text).expect("write the Sentinel configuration");
        let mut cmd = TestLan::command_in(&lan.host(host), redis_server_binary());
        cmd.arg(&conf).arg("--sentinel");
        LanServer::launch(cmd, SocketAddrV4::new(ip, port), dir)
    }

    fn launch(mut cmd: Command, addr: SocketAddrV4, dir: PathBuf) -> LanServer {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not run `ip netns exec ... redis-server`: {e}"));
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server at {addr} exited ({status}):\n{log}");
            }
            if matches!(command_to(SocketAddr::V4(addr), &["PING"]), Ok(Resp::Simple(p)) if p == "PONG")
            {
                return LanServer { addr, dir, child };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server at {addr} did not answer within 15 s:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddrV4 {
        self.addr
    }

    /// Runs one command on it over a fresh connection.
    pub fn command(&self, args: &[&str]) -> std::io::Result<Resp> {
        command_to(SocketAddr::V4(self.addr), args)
    }

    /// The value of `field` in its `INFO section`, or `None` when it cannot say.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let text = self.command(&["INFO", section]).ok()?.text()?;
        text.lines().find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for LanServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
