//! What the Redis benches share: one private redis-server and the runtime around it, the
//! hand-written redis-rs client the baselines are built on, and the report helpers.
//!
//! Placement: redis-server runs on CPU 1 and the bench process (one tokio worker) on CPU 0, as
//! if on two machines: on two shared cores each side steals the other's CPU and single rounds
//! swing by several times. Everything is counted in the bench process, over fixed durations;
//! nothing asserts on time.

pub mod raw;

pub use raw::RawRs;

use std::time::Duration;

use coord_redis::{Client, RedisProvider};
use coord_redis_testing::RedisServer;

/// The provider's default command timeout; the raw clients get the same response timeout.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// The provider clients this build can measure, each with the name its rows carry.
pub fn clients() -> Vec<(Client, &'static str)> {
    vec![
        #[cfg(feature = "redis-client")]
        (Client::RedisRs, "redis-rs"),
        #[cfg(feature = "fred")]
        (Client::Fred, "fred"),
    ]
}

/// One bench run: a private redis-server, the tokio runtime that drives the bench, and the
/// raw redis-rs client every baseline uses.
pub struct Session {
    /// The private redis-server, stopped when the session is finished.
    pub server: RedisServer,
    /// One worker when client and server are pinned apart, two otherwise.
    pub rt: tokio::runtime::Runtime,
    /// Connected with scripts loaded; clones share its connection.
    pub raw: RawRs,
}

impl Session {
    /// Prints the command that runs `bench`, starts redis-server, prints the machine facts,
    /// pins client and server apart, builds the runtime and prints the placement and `plan`
    /// (the bench's own durations), then connects the raw client and prints the loopback
    /// round trip it measures.
    pub fn start(bench: &str, plan: &str) -> Session {
        println!(
            "command: cargo bench -p coord-redis --bench {bench}{}",
            feature_flags()
        );
        let server = RedisServer::start();
        machine_facts(&server);
        let pinned = pin_client_and_server(&server);
        let workers = if pinned { 1 } else { 2 };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .expect("tokio runtime");
        println!(
            "placement: {}",
            if pinned {
                "redis-server on CPU 1, this process (one tokio worker) on CPU 0, as on two machines"
            } else {
                "not pinned (fewer than two CPUs, or pinning refused): client and server share the CPUs"
            }
        );
        println!("runtime: tokio multi-thread, {workers} worker(s); {plan}");
        let raw = rt.block_on(RawRs::connect(&server.url()));
        let rtt = rt.block_on(raw.ping_round_trips(2000));
        println!(
            "loopback PING round trip (raw redis-rs, sequential): p50 {:.3} ms, p99 {:.3} ms",
            percentile(&rtt, 0.5),
            percentile(&rtt, 0.99)
        );
        Session { server, rt, raw }
    }

    /// A provider over `client` with default options except the command timeout
    /// ([`COMMAND_TIMEOUT`], stated so that it stays equal to the raw clients').
    pub fn provider(&self, client: Client) -> RedisProvider {
        self.rt
            .block_on(
                RedisProvider::builder(self.server.url())
                    .client(client)
                    .command_timeout(COMMAND_TIMEOUT)
                    .connect(),
            )
            .expect("connect the provider")
    }

    /// Drops `provider` inside the runtime (its background tasks need one to stop).
    pub fn close(&self, provider: RedisProvider) {
        self.rt.block_on(async move { drop(provider) });
    }

    /// Prints the load average at the end, then stops the runtime and the server.
    pub fn finish(self) {
        println!();
        println!("load average at end: {}", load_average());
        let Session { server, rt, raw } = self;
        drop(raw);
        drop(rt);
        drop(server);
    }
}

/// The cargo flags that select this build's clients.
fn feature_flags() -> &'static str {
    match (cfg!(feature = "redis-client"), cfg!(feature = "fred")) {
        (true, true) => " --features fred",
        (false, true) => " --no-default-features --features fred",
        _ => "",
    }
}

/// The `p` quantile (0..=1) of `sorted` by the nearest-rank method; NaN when it is empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The word a target column shows.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn machine_facts(server: &RedisServer) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let version = server
        .command(&["INFO", "server"])
        .text()
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("redis_version:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!(
        "machine: nproc {cores}, cpu {cpu}, load average at start {}",
        load_average()
    );
    println!("redis-server {version} on 127.0.0.1 (private instance, no persistence)");
}

/// Puts redis-server on CPU 1 and this process on CPU 0, so that neither side's CPU time is
/// taken by the other (as when they run on separate machines) and a slower client shows as
/// fewer pairs per second instead of being hidden by, or hiding, the server's work. Threads
/// created afterwards (the runtime's) inherit the placement. Returns false when the machine
/// has fewer than two CPUs or the kernel refuses.
fn pin_client_and_server(server: &RedisServer) -> bool {
    let Some(pid) = server.pid() else {
        return false;
    };
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return false;
    }
    let pin = |pid: libc::pid_t, cpu: usize| {
        // SAFETY: `set` is a plain bit mask owned by this frame; CPU_ZERO/CPU_SET only write
        // inside it, and sched_setaffinity reads `size_of::<cpu_set_t>()` bytes of it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &set) == 0
        }
    };
    // redis-server's background threads were created before this; pin every one of them.
    let threads: Vec<libc::pid_t> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    !threads.is_empty() && threads.iter().all(|&t| pin(t, 1)) && pin(0, 0)
}

/// How a column's cells line up.
#[derive(Clone, Copy)]
pub enum Align {
    Left,
    Right,
}

/// A Markdown table printed as it is filled: a blank line, `## title`, a blank line, the
/// header, then one line per row.
pub struct Table {
    columns: usize,
}

impl Table {
    /// Prints the heading and the header of a table with these columns.
    pub fn start(title: &str, columns: &[(&str, Align)]) -> Table {
        println!();
        println!("## {title}");
        println!();
        let names: Vec<&str> = columns.iter().map(|(name, _)| *name).collect();
        println!("| {} |", names.join(" | "));
        let rule: String = columns
            .iter()
            .map(|(_, align)| match align {
                Align::Left => "---|",
                Align::Right => "---:|",
            })
            .collect();
        println!("|{rule}");
        Table {
            columns: columns.len(),
        }
    }

    /// Prints one row; there must be one cell per column.
    pub fn row(&self, cells: &[String]) {
        assert_eq!(cells.len(), self.columns, "a row must fill every column");
        println!("| {} |", cells.join(" | "));
    }
}
