//! What coord checks about the servers it talks to: settings that would silently break its
//! promises (eviction, persistence), and server restarts (a changed `run_id`).
//!
//! * **At connect**, on every data node the transport sends commands to (the one server,
//!   Sentinel's current master, every Cluster master): `CONFIG GET maxmemory-policy appendonly
//!   save`. A policy other than `noeviction` refuses the connection unless the builder allows
//!   it; persistence switched off entirely logs a warning; a server that refuses `CONFIG`
//!   (managed Redis, an ACL without `+config`) logs one warning per provider and connects.
//! * **Whenever a transport (re)connects** to a node, it reads `run_id` from `INFO server`
//!   and reports it to a [`ServerWatch`](crate::transport::ServerWatch) (in the transport). A node whose run id changed was restarted (or
//!   replaced): that is logged at error level once per change and counted.
//! * **On request** ([`RedisProvider::server_report`](crate::RedisProvider::server_report),
//!   what `coord check` prints): the same settings, the server version, each node's clock
//!   against this host's and its replication (role, connected replicas and their lag,
//!   `min-replicas-to-write`), as a [`ServerReport`] to judge.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;

use crate::transport::{Command, Fault, Reply, Transport, info_field, info_server};

/// The one `maxmemory-policy` under which Redis never deletes a key coord relies on.
pub const SAFE_POLICY: &str = "noeviction";

/// The oldest Redis version coord runs on (`SET` with both `NX` and `GET`).
pub const MIN_REDIS_VERSION: (u32, u32) = (7, 0);

/// What coord found on each data node of a deployment: see
/// [`RedisProvider::server_report`](crate::RedisProvider::server_report).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerReport {
    /// One entry per data node the provider sends commands to (the one server, Sentinel's
    /// current master, every Cluster master), sorted by address.
    pub nodes: Vec<NodeReport>,
}

/// The settings, version and clock of one data node, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeReport {
    /// The node's address (`host:port`).
    pub node: String,
    /// `redis_version` from `INFO server`, when the node reports it.
    pub version: Option<String>,
    /// `maxmemory-policy`, when `CONFIG GET` is permitted.
    pub maxmemory_policy: Option<String>,
    /// `appendonly` (`yes`/`no`), when `CONFIG GET` is permitted.
    pub appendonly: Option<String>,
    /// `save` (the snapshot points, empty when none), when `CONFIG GET` is permitted.
    pub save: Option<String>,
    /// Why the settings could not be read (`CONFIG` renamed away or refused by the ACL, as
    /// on managed services), when they could not.
    pub config_error: Option<String>,
    /// The node's clock minus this host's, in milliseconds (positive: the server is ahead),
    /// from its `TIME` taken at the midpoint of the round trip.
    pub clock_offset_ms: i64,
    /// How far off `clock_offset_ms` may be from measuring alone: half the round trip, in
    /// milliseconds.
    pub clock_uncertainty_ms: u64,
    /// `role` from `INFO replication` (`master` or `slave`), when the node reports it.
    pub role: Option<String>,
    /// The replicas connected to this node, from `INFO replication` (empty for a node without
    /// replicas, and when `INFO replication` could not be read).
    pub replicas: Vec<ReplicaReport>,
    /// `min-replicas-to-write` (the node refuses writes while fewer replicas are connected
    /// with at most `min-replicas-max-lag` seconds of lag), when `CONFIG GET` is permitted.
    pub min_replicas_to_write: Option<u32>,
    /// `min-replicas-max-lag`, in seconds, when `CONFIG GET` is permitted.
    pub min_replicas_max_lag: Option<u32>,
}

/// One replica connected to a data node, as that node sees it (`INFO replication`,
/// `slaveN:` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaReport {
    /// `ip:port` the replica announced.
    pub address: String,
    /// The link state (`online` once the initial sync is done; `wait_bgsave`, `send_bulk`
    /// before).
    pub state: String,
    /// Seconds since the replica last acknowledged the replication stream, as the primary
    /// counts them (`lag`); `None` when not reported.
    pub lag_seconds: Option<u64>,
    /// How many bytes of the replication stream the replica has acknowledged (`offset`).
    pub offset: Option<u64>,
}

impl ReplicaReport {
    /// Whether the replica counts for `min-replicas-to-write`: online, and acknowledged
    /// within `max_lag` seconds.
    pub fn counts_for_writes(&self, max_lag: u32) -> bool {
        self.state == "online"
            && self
                .lag_seconds
                .is_some_and(|lag| lag <= u64::from(max_lag))
    }
}

impl NodeReport {
    /// `Some(true)` when the policy is `noeviction` (the only one under which Redis never
    /// deletes a held lock or a record), `Some(false)` for any other, `None` when unknown.
    pub fn eviction_safe(&self) -> Option<bool> {
        self.maxmemory_policy.as_deref().map(|p| p == SAFE_POLICY)
    }

    /// `Some(false)` when nothing is written to disk (`appendonly no` and no `save` points,
    /// so a restart forgets every lock and record), `Some(true)` when something is, `None`
    /// when unknown.
    pub fn persistence_on(&self) -> Option<bool> {
        let settings = Settings {
            appendonly: self.appendonly.clone(),
            save: self.save.clone(),
            ..Settings::default()
        };
        match (&self.appendonly, &self.save) {
            (Some(_), Some(_)) => Some(!settings.persistence_off()),
            _ => None,
        }
    }

    /// Whether the version is one coord runs on ([`MIN_REDIS_VERSION`] or newer); `None`
    /// when unknown or unreadable.
    pub fn version_supported(&self) -> Option<bool> {
        let mut parts = self.version.as_deref()?.split('.');
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next().unwrap_or("0").parse().ok()?;
        Some((major, minor) >= MIN_REDIS_VERSION)
    }

    /// Whether this node is a primary (`role:master`); `None` when not reported.
    pub fn is_primary(&self) -> Option<bool> {
        self.role.as_deref().map(|r| r == "master")
    }
}

/// The replicas of an `INFO replication` text: its `slaveN:ip=..,port=..,state=..,offset=..,
/// lag=..` lines, in the order the server lists them. Lines it cannot read are skipped.
pub(crate) fn replicas_in_info(text: &str) -> Vec<ReplicaReport> {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            let index = name.strip_prefix("slave")?;
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let field = |key: &str| {
                value.trim().split(',').find_map(|pair| {
                    let (k, v) = pair.split_once('=')?;
                    (k == key).then_some(v)
                })
            };
            Some(ReplicaReport {
                address: format!("{}:{}", field("ip")?, field("port")?),
                state: field("state").unwrap_or("unknown").to_owned(),
                lag_seconds: field("lag").and_then(|v| v.parse().ok()),
                offset: field("offset").and_then(|v| v.parse().ok()),
            })
        })
        .collect()
}

/// Reads what a [`ServerReport`] holds from every node of `transport`: `INFO server`,
/// `CONFIG GET maxmemory-policy appendonly save` and `TIME`, one command to all nodes at a
/// time. A node that refuses `CONFIG` is reported with its error; one that cannot be reached
/// fails the whole report.
pub(crate) async fn report(transport: &dyn Transport) -> Result<ServerReport, Fault> {
    let mut nodes: std::collections::BTreeMap<String, NodeReport> = Default::default();
    fn entry<'m>(
        nodes: &'m mut std::collections::BTreeMap<String, NodeReport>,
        node: &str,
    ) -> &'m mut NodeReport {
        nodes.entry(node.to_owned()).or_insert_with(|| NodeReport {
            node: node.to_owned(),
            version: None,
            maxmemory_policy: None,
            appendonly: None,
            save: None,
            config_error: None,
            clock_offset_ms: 0,
            clock_uncertainty_ms: 0,
            role: None,
            replicas: Vec::new(),
            min_replicas_to_write: None,
            min_replicas_max_lag: None,
        })
    }
    for (node, reply) in transport.each_node(info_server()).await? {
        if let Ok(Reply::Data(text)) = reply {
            let text = String::from_utf8_lossy(&text);
            entry(&mut nodes, &node).version =
                info_field(&text, "redis_version").map(str::to_owned);
        }
    }
    for (node, reply) in transport
        .each_node(Command::new("INFO").arg("replication"))
        .await?
    {
        if let Ok(Reply::Data(text)) = reply {
            let text = String::from_utf8_lossy(&text);
            let report = entry(&mut nodes, &node);
            report.role = info_field(&text, "role").map(str::to_owned);
            report.replicas = replicas_in_info(&text);
        }
    }
    let get = Command::new("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .arg("appendonly")
        .arg("save")
        .arg("min-replicas-to-write")
        .arg("min-replicas-max-lag");
    for (node, reply) in transport.each_node(get).await? {
        let report = entry(&mut nodes, &node);
        match reply {
            Ok(reply) => match Settings::parse(&reply) {
                Some(settings) => {
                    report.maxmemory_policy = settings.maxmemory_policy;
                    report.appendonly = settings.appendonly;
                    report.save = settings.save;
                    report.min_replicas_to_write = settings.min_replicas_to_write;
                    report.min_replicas_max_lag = settings.min_replicas_max_lag;
                }
                None => report.config_error = Some("unreadable CONFIG GET reply".to_owned()),
            },
            Err(Fault::Server(err)) => report.config_error = Some(err.to_string()),
            Err(other) => return Err(other),
        }
    }
    let before = std::time::SystemTime::now();
    let times = transport.each_node(Command::new("TIME")).await?;
    let after = std::time::SystemTime::now();
    let half_trip = after.duration_since(before).unwrap_or_default() / 2;
    let local_mid = unix_ms(before + half_trip);
    for (node, reply) in times {
        let server = match reply {
            Ok(reply) => server_ms(&reply),
            Err(fault) => return Err(fault),
        };
        let Some(server) = server else {
            return Err(Fault::Protocol(format!(
                "TIME on {node} answered something else than a time"
            )));
        };
        let report = entry(&mut nodes, &node);
        report.clock_offset_ms = server.saturating_sub(local_mid);
        report.clock_uncertainty_ms = half_trip.as_millis().min(u64::MAX as u128) as u64;
    }
    Ok(ServerReport {
        nodes: nodes.into_values().collect(),
    })
}

/// Milliseconds since the Unix epoch (negative before it).
fn unix_ms(at: std::time::SystemTime) -> i64 {
    match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_millis().min(i64::MAX as u128) as i64),
    }
}

/// A `TIME` reply (`[seconds, microseconds]`) in milliseconds.
fn server_ms(reply: &Reply) -> Option<i64> {
    let number = |reply: &Reply| match reply {
        Reply::Data(text) => std::str::from_utf8(text).ok()?.parse::<i64>().ok(),
        Reply::Int(n) => Some(*n),
        _ => None,
    };
    match reply {
        Reply::Array(parts) if parts.len() == 2 => {
            Some(number(&parts[0])?.checked_mul(1000)? + number(&parts[1])? / 1000)
        }
        _ => None,
    }
}

/// What the connect-time checks may accept.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CheckOptions {
    /// Connect even when the eviction policy may evict coord's keys.
    pub(crate) allow_eviction: bool,
}

/// The settings of one node, as far as coord cares.
#[derive(Debug, Default, PartialEq, Eq)]
struct Settings {
    maxmemory_policy: Option<String>,
    appendonly: Option<String>,
    save: Option<String>,
    min_replicas_to_write: Option<u32>,
    min_replicas_max_lag: Option<u32>,
}

impl Settings {
    /// From a `CONFIG GET` reply: a flat array of names and values (RESP2), or the same
    /// flattened from a map (RESP3).
    fn parse(reply: &Reply) -> Option<Settings> {
        let Reply::Array(items) = reply else {
            return None;
        };
        let mut out = Settings::default();
        for pair in items.chunks(2) {
            let [Reply::Data(name), Reply::Data(value)] = pair else {
                return None;
            };
            let value = String::from_utf8_lossy(value).into_owned();
            match name.as_slice() {
                b"maxmemory-policy" => out.maxmemory_policy = Some(value),
                b"appendonly" => out.appendonly = Some(value),
                b"save" => out.save = Some(value),
                b"min-replicas-to-write" => out.min_replicas_to_write = value.parse().ok(),
                b"min-replicas-max-lag" => out.min_replicas_max_lag = value.parse().ok(),
                _ => {}
            }
        }
        Some(out)
    }

    /// Whether nothing is ever written to disk: no append-only file and no snapshot points.
    fn persistence_off(&self) -> bool {
        self.appendonly.as_deref() == Some("no")
            && self.save.as_deref().is_some_and(|s| s.trim().is_empty())
    }
}

/// Runs the connect-time checks on every node of `transport`. Fails with kind `Config` when a
/// node's eviction policy may evict coord's keys and `options` does not allow that; logs
/// warnings for what is merely risky. `address` names the deployment in messages.
pub(crate) async fn check_at_connect(
    transport: &dyn Transport,
    options: CheckOptions,
    address: &str,
) -> Result<(), BackendError> {
    let get = Command::new("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .arg("appendonly")
        .arg("save");
    let replies = transport
        .each_node(get)
        .await
        .map_err(|f| f.into_backend(&format!("checking the settings of Redis at {address}")))?;
    let warned_config = AtomicBool::new(false);
    for (node, reply) in replies {
        let reply = match reply {
            Ok(reply) => reply,
            Err(Fault::Server(err)) => {
                // `CONFIG` renamed away (`ERR unknown command`) or refused by the ACL
                // (`NOPERM`): managed services do both. Say once what could not be checked.
                if !warned_config.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        address,
                        node = %node,
                        error = %err,
                        "coord-redis: cannot read the server's settings (CONFIG GET is not \
                         permitted), so coord could not check that `maxmemory-policy` is \
                         `noeviction`: under memory pressure any other policy lets Redis delete \
                         held locks and idempotency records. Check it in your provider's \
                         console"
                    );
                }
                continue;
            }
            Err(fault) => {
                return Err(
                    fault.into_backend(&format!("checking the settings of Redis node {node}"))
                );
            }
        };
        let Some(settings) = Settings::parse(&reply) else {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!("checking the settings of Redis node {node}: unreadable CONFIG GET reply"),
            ));
        };
        check_settings(&settings, options, &node, address)?;
    }
    Ok(())
}

/// True the first time this process warns that `node` keeps nothing on disk: a process that
/// connects to the same server again (a second provider, a tool, a test) has been told.
fn first_persistence_warning(node: &str) -> bool {
    static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.iter().any(|n| n == node) {
        return false;
    }
    warned.push(node.to_owned());
    true
}

fn check_settings(
    settings: &Settings,
    options: CheckOptions,
    node: &str,
    address: &str,
) -> Result<(), BackendError> {
    match settings.maxmemory_policy.as_deref() {
        // A server too old or too restricted to report it: nothing to judge.
        None | Some(SAFE_POLICY) => {}
        Some(policy) if options.allow_eviction => {
            tracing::warn!(
                address,
                node,
                policy,
                "coord-redis: Redis may evict coord's keys (`maxmemory-policy {policy}`), \
                 allowed by `allow_eviction(true)`: under memory pressure a held lock or an \
                 idempotency record can vanish early"
            );
        }
        Some(policy) => {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "connecting to Redis at {address}: node {node} has `maxmemory-policy \
                     {policy}`, which lets Redis delete coord's keys under memory pressure (a \
                     lock evicted while held lets a second caller in; an evicted idempotency \
                     record lets an operation run again). Set `maxmemory-policy noeviction` \
                     on the server (writes then fail when memory is full, which coord reports \
                     as errors), or accept the risk with \
                     `RedisProviderBuilder::allow_eviction(true)`"
                ),
            ));
        }
    }
    if settings.persistence_off() && first_persistence_warning(node) {
        tracing::warn!(
            address,
            node,
            "coord-redis: Redis persistence is off on {node} (`appendonly no` and no `save` \
             points): a restart of the server forgets every lock and idempotency record, so \
             holders and in-flight operations lose their exclusion. Enable `appendonly yes` \
             (with `appendfsync everysec` or `always`) where that matters"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &str) -> Reply {
        Reply::Data(s.as_bytes().to_vec())
    }

    fn settings(policy: &str, aof: &str, save: &str) -> Settings {
        Settings::parse(&Reply::Array(vec![
            data("save"),
            data(save),
            data("appendonly"),
            data(aof),
            data("maxmemory-policy"),
            data(policy),
        ]))
        .unwrap()
    }

    #[test]
    fn parses_config_get() {
        let s = settings("allkeys-lru", "no", "");
        assert_eq!(s.maxmemory_policy.as_deref(), Some("allkeys-lru"));
        assert!(s.persistence_off());
        assert!(!settings("noeviction", "yes", "").persistence_off());
        assert!(!settings("noeviction", "no", "3600 1").persistence_off());
        assert_eq!(Settings::parse(&data("x")), None);
        assert_eq!(
            Settings::parse(&Reply::Array(vec![data("save")])),
            None,
            "an odd reply is unreadable"
        );
    }

    #[test]
    fn only_noeviction_passes_unless_allowed() {
        let strict = CheckOptions::default();
        let lenient = CheckOptions {
            allow_eviction: true,
        };
        for policy in [
            "allkeys-lru",
            "volatile-lru",
            "volatile-ttl",
            "allkeys-random",
        ] {
            let s = settings(policy, "yes", "");
            let err = check_settings(&s, strict, "n:1", "a:1").unwrap_err();
            assert_eq!(err.kind(), BackendErrorKind::Config);
            assert!(err.message().contains("noeviction"), "{err}");
            assert!(err.message().contains("allow_eviction(true)"), "{err}");
            assert!(err.message().contains(policy), "{err}");
            check_settings(&s, lenient, "n:1", "a:1").unwrap();
        }
        check_settings(&settings("noeviction", "no", ""), strict, "n:1", "a:1").unwrap();
    }

    fn node(policy: Option<&str>, aof: Option<&str>, save: Option<&str>) -> NodeReport {
        NodeReport {
            node: "n:1".to_owned(),
            version: Some("7.0.15".to_owned()),
            maxmemory_policy: policy.map(str::to_owned),
            appendonly: aof.map(str::to_owned),
            save: save.map(str::to_owned),
            config_error: None,
            clock_offset_ms: 0,
            clock_uncertainty_ms: 0,
            role: None,
            replicas: Vec::new(),
            min_replicas_to_write: None,
            min_replicas_max_lag: None,
        }
    }

    #[test]
    fn replicas_are_read_from_info_replication() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=4242,lag=0\r\n\
                    slave1:ip=10.0.0.2,port=7002,state=wait_bgsave,offset=0,lag=12\r\n\
                    slave_x:ip=1,port=2\r\nmaster_repl_offset:4242\r\n";
        let replicas = replicas_in_info(text);
        assert_eq!(replicas.len(), 2, "{replicas:?}");
        assert_eq!(replicas[0].address, "127.0.0.1:7001");
        assert_eq!(replicas[0].state, "online");
        assert_eq!(replicas[0].lag_seconds, Some(0));
        assert_eq!(replicas[0].offset, Some(4242));
        assert!(replicas[0].counts_for_writes(10));
        assert_eq!(replicas[1].lag_seconds, Some(12));
        assert!(!replicas[1].counts_for_writes(10), "not online");
        let lagging = ReplicaReport {
            state: "online".to_owned(),
            ..replicas[1].clone()
        };
        assert!(!lagging.counts_for_writes(10), "12 s behind a 10 s limit");
        assert!(lagging.counts_for_writes(12));
        assert_eq!(info_field(text, "role"), Some("master"));
        assert!(replicas_in_info("role:master\r\nconnected_slaves:0\r\n").is_empty());
    }

    #[test]
    fn replication_settings_are_parsed() {
        let s = Settings::parse(&Reply::Array(vec![
            data("min-replicas-to-write"),
            data("1"),
            data("min-replicas-max-lag"),
            data("10"),
        ]))
        .unwrap();
        assert_eq!(s.min_replicas_to_write, Some(1));
        assert_eq!(s.min_replicas_max_lag, Some(10));
    }

    #[test]
    fn node_reports_judge_what_they_know_only() {
        assert_eq!(
            node(Some("noeviction"), None, None).eviction_safe(),
            Some(true)
        );
        assert_eq!(
            node(Some("allkeys-lru"), None, None).eviction_safe(),
            Some(false)
        );
        assert_eq!(node(None, None, None).eviction_safe(), None);
        assert_eq!(
            node(None, Some("no"), Some("")).persistence_on(),
            Some(false)
        );
        assert_eq!(
            node(None, Some("yes"), Some("")).persistence_on(),
            Some(true)
        );
        assert_eq!(
            node(None, Some("no"), Some("3600 1")).persistence_on(),
            Some(true)
        );
        assert_eq!(node(None, Some("no"), None).persistence_on(), None);
        let versions = [
            ("7.0.15", Some(true)),
            ("7.2.4", Some(true)),
            ("10.0", Some(true)),
            ("6.2.14", Some(false)),
            ("x.y", None),
        ];
        for (version, supported) in versions {
            let mut n = node(None, None, None);
            n.version = Some(version.to_owned());
            assert_eq!(n.version_supported(), supported, "{version}");
        }
        let mut n = node(None, None, None);
        n.version = None;
        assert_eq!(n.version_supported(), None);
    }

    #[test]
    fn time_replies_read_as_milliseconds() {
        let time = Reply::Array(vec![data("1700000000"), data("123456")]);
        assert_eq!(server_ms(&time), Some(1_700_000_000_123));
        assert_eq!(server_ms(&data("1700000000")), None);
        assert!(unix_ms(std::time::SystemTime::now()) > 1_700_000_000_000);
    }
}
