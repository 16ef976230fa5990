//! `coord check`: is this Redis deployment fit for coord?
//!
//! Judged on every data node (the one server, Sentinel's master, every Cluster master):
//!
//! | check | ok | warn | fail |
//! |---|---|---|---|
//! | connect | connected | | cannot connect |
//! | version | 7.0 or newer | not reported | older than 7.0 |
//! | maxmemory-policy | `noeviction` | not readable (`CONFIG` refused) | any other policy |
//! | persistence | AOF or snapshots on | off, or not readable | |
//! | clock | within 1 s of this host | more than 1 s apart | |
//! | replication (with `--replica-acks N`: warn when fewer than N replicas are in step) | a primary without replicas, or with `min-replicas-to-write` ≥ 1 and enough replicas in step | replicas but `min-replicas-to-write 0`; a replica lagging or not online; not readable | a replica (writes refused), or fewer replicas in step than `min-replicas-to-write` (writes refused now) |
//!
//! Why replication is judged: Redis replicates asynchronously. When the primary fails and a
//! replica is promoted (Sentinel, Cluster), writes the old primary acknowledged but had not
//! yet sent are gone: a lock granted there is free on the new primary, an idempotency record
//! stored there is absent, and the operation can run twice. `min-replicas-to-write` makes a
//! primary cut off from its replicas refuse writes (so a minority side cannot acknowledge
//! what the majority will never see); its price is availability: with one replica, every
//! write fails while that replica is away.

use std::time::{Duration, Instant};

use coord_redis::{MIN_REDIS_VERSION, NodeReport, SAFE_POLICY};
use serde_json::json;

use crate::args::Connection;
use crate::{Exit, Failure, connect};

/// Clock offsets beyond this (after the measuring uncertainty) are worth a warning.
pub(crate) const CLOCK_WARN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

pub(crate) struct Finding {
    node: Option<String>,
    check: &'static str,
    pub(crate) status: Status,
    detail: String,
}

pub(crate) fn finding(
    node: Option<&str>,
    check: &'static str,
    status: Status,
    detail: String,
) -> Finding {
    Finding {
        node: node.map(str::to_owned),
        check,
        status,
        detail,
    }
}

/// What coord thinks of one node's report.
fn judge(node: &NodeReport, replica_acks: Option<u32>) -> Vec<Finding> {
    let at = Some(node.node.as_str());
    let mut out = Vec::new();
    let (major, minor) = MIN_REDIS_VERSION;
    out.push(match (node.version_supported(), node.version.as_deref()) {
        (Some(true), Some(v)) => finding(at, "version", Status::Ok, v.to_owned()),
        (Some(false), Some(v)) => finding(
            at,
            "version",
            Status::Fail,
            format!("{v}: coord needs Redis {major}.{minor} or newer"),
        ),
        (_, v) => finding(
            at,
            "version",
            Status::Warn,
            format!(
                "not readable ({}): coord needs Redis {major}.{minor} or newer",
                v.unwrap_or("not reported")
            ),
        ),
    });
    let config_note = || {
        node.config_error.as_deref().map_or_else(
            || "not reported".to_owned(),
            |e| format!("CONFIG GET refused: {e}"),
        )
    };
    out.push(match (node.eviction_safe(), node.maxmemory_policy.as_deref()) {
        (Some(true), Some(p)) => finding(at, "maxmemory-policy", Status::Ok, p.to_owned()),
        (Some(false), Some(p)) => finding(
            at,
            "maxmemory-policy",
            Status::Fail,
            format!(
                "{p}: under memory pressure Redis may evict held locks (a second caller enters) \
                 and idempotency records (an operation runs again); set `maxmemory-policy \
                 {SAFE_POLICY}`"
            ),
        ),
        _ => finding(
            at,
            "maxmemory-policy",
            Status::Warn,
            format!(
                "{}: check in your provider's console that it is `{SAFE_POLICY}`",
                config_note()
            ),
        ),
    });
    out.push(match node.persistence_on() {
        Some(true) => finding(
            at,
            "persistence",
            Status::Ok,
            format!(
                "appendonly {}, save \"{}\"",
                node.appendonly.as_deref().unwrap_or("?"),
                node.save.as_deref().unwrap_or("")
            ),
        ),
        Some(false) => finding(
            at,
            "persistence",
            Status::Warn,
            "off (appendonly no, no save points): a restart forgets every lock and record"
                .to_owned(),
        ),
        None => finding(
            at,
            "persistence",
            Status::Warn,
            format!(
                "{}: a restart without persistence forgets every lock and record",
                config_note()
            ),
        ),
    });
    let apart = node
        .clock_offset_ms
        .unsigned_abs()
        .saturating_sub(node.clock_uncertainty_ms);
    let offset = format!(
        "{:+} ms (±{} ms) against this host",
        node.clock_offset_ms, node.clock_uncertainty_ms
    );
    out.push(judge_replication(node, replica_acks));
    out.push(if apart > CLOCK_WARN.as_millis() as u64 {
        finding(
            at,
            "clock",
            Status::Warn,
            format!(
                "{offset}: coord measures leases by the server's clock and never compares \
                 clocks, but ages and times in logs from different machines will disagree; \
                 check NTP"
            ),
        )
    } else {
        finding(at, "clock", Status::Ok, offset)
    });
    out
}

/// What coord thinks of one node's replication (see the module's table).
fn judge_replication(node: &NodeReport, replica_acks: Option<u32>) -> Finding {
    let at = Some(node.node.as_str());
    let check = "replication";
    match node.is_primary() {
        None => {
            return finding(
                at,
                check,
                Status::Warn,
                "not readable (INFO replication refused): check that replicas acknowledge \
                 writes before a failover can promote them"
                    .to_owned(),
            );
        }
        Some(false) => {
            return finding(
                at,
                check,
                Status::Fail,
                format!(
                    "this node is a replica (role {}): it refuses coord's writes; point coord \
                     at the primary, or use Sentinel or Cluster so it follows failovers",
                    node.role.as_deref().unwrap_or("?")
                ),
            );
        }
        Some(true) => {}
    }
    let max_lag = node.min_replicas_max_lag.unwrap_or(10);
    let in_step = node
        .replicas
        .iter()
        .filter(|r| r.counts_for_writes(max_lag))
        .count();
    let listed = node
        .replicas
        .iter()
        .map(|r| {
            format!(
                "{} {} lag {}",
                r.address,
                r.state,
                r.lag_seconds
                    .map_or_else(|| "?".to_owned(), |lag| format!("{lag} s"))
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let required = node.min_replicas_to_write;
    if let Some(asked) = replica_acks.filter(|&n| n as usize > in_step) {
        return finding(
            at,
            check,
            Status::Warn,
            format!(
                "`replica_acks({asked})` asks for more replicas than are in step here \
                 ({in_step} of {}{}): every claim, grant and renewal waits out its timeout and \
                 fails with `NotReplicated`",
                node.replicas.len(),
                if listed.is_empty() {
                    String::new()
                } else {
                    format!(": {listed}")
                }
            ),
        );
    }
    if node.replicas.is_empty() {
        return match required {
            Some(n) if n > 0 => finding(
                at,
                check,
                Status::Fail,
                format!(
                    "primary without replicas, but `min-replicas-to-write {n}`: every write is \
                     refused (NOREPLICAS) until {n} replica(s) connect"
                ),
            ),
            _ => finding(
                at,
                check,
                Status::Ok,
                "primary, no replicas (nothing to fail over to: a restart keeps what \
                 persistence wrote)"
                    .to_owned(),
            ),
        };
    }
    match required {
        Some(n) if n as usize > in_step => finding(
            at,
            check,
            Status::Fail,
            format!(
                "primary with {} replica(s) ({listed}), {in_step} in step within {max_lag} s, \
                 but `min-replicas-to-write {n}`: writes are refused now (NOREPLICAS)",
                node.replicas.len()
            ),
        ),
        Some(0) | None => finding(
            at,
            check,
            Status::Warn,
            format!(
                "primary with {} replica(s) ({listed}) and `min-replicas-to-write {}`: a \
                 failover can lose writes this primary acknowledged (a granted lock, a stored \
                 idempotency record), and a primary cut off from its replicas keeps \
                 acknowledging them; set `min-replicas-to-write 1` and `min-replicas-max-lag \
                 10` (with one replica, writes then fail while it is away; with two, one may \
                 be lost without refusing writes)",
                node.replicas.len(),
                required.map_or_else(|| "unknown".to_owned(), |n| n.to_string())
            ),
        ),
        Some(n) if in_step < node.replicas.len() => finding(
            at,
            check,
            Status::Warn,
            format!(
                "primary with {} replica(s) ({listed}), `min-replicas-to-write {n}`: only \
                 {in_step} in step within {max_lag} s",
                node.replicas.len()
            ),
        ),
        Some(n) => finding(
            at,
            check,
            Status::Ok,
            format!(
                "primary with {} replica(s) ({listed}), `min-replicas-to-write {n}`, \
                 `min-replicas-max-lag {max_lag}`",
                node.replicas.len()
            ),
        ),
    }
}

pub async fn run(
    connection: &Connection,
    json: bool,
    replica_acks: Option<u32>,
) -> Result<Exit, Failure> {
    let started = Instant::now();
    let mut findings = Vec::new();
    let mut nodes = Vec::new();
    let target = match connect(connection).await {
        Ok(provider) => {
            findings.push(finding(
                None,
                "connect",
                Status::Ok,
                format!(
                    "connected to {} in {}",
                    provider.address(),
                    crate::render::duration(started.elapsed())
                ),
            ));
            let target = provider.address().to_owned();
            match provider.server_report().await {
                Ok(report) => {
                    for node in &report.nodes {
                        findings.extend(judge(node, replica_acks));
                    }
                    nodes = report.nodes;
                }
                Err(err) => findings.push(finding(
                    None,
                    "report",
                    Status::Fail,
                    format!("cannot read the servers: {err}"),
                )),
            }
            target
        }
        // Bad usage (no URL, several URLs without --cluster) is not a verdict on Redis.
        Err(failure) if failure.kind == "usage" => return Err(failure),
        Err(failure) => {
            findings.push(finding(None, "connect", Status::Fail, failure.message));
            connection.url.clone().unwrap_or_default()
        }
    };
    let nodes = nodes
        .iter()
        .map(|n| {
            json!({
                "node": n.node,
                "version": n.version,
                "maxmemory_policy": n.maxmemory_policy,
                "appendonly": n.appendonly,
                "save": n.save,
                "config_error": n.config_error,
                "clock_offset_ms": n.clock_offset_ms,
                "clock_uncertainty_ms": n.clock_uncertainty_ms,
                "role": n.role,
                "min_replicas_to_write": n.min_replicas_to_write,
                "min_replicas_max_lag": n.min_replicas_max_lag,
                "replicas": n.replicas.iter().map(|r| json!({
                    "address": r.address,
                    "state": r.state,
                    "lag_seconds": r.lag_seconds,
                    "offset": r.offset,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(print(&target, &findings, nodes, json))
}

/// Prints the findings (text, or one JSON document with `nodes`, what was read from each
/// server) and returns the exit code: [`Exit::CheckFailed`] when any check failed.
pub(crate) fn print(
    target: &str,
    findings: &[Finding],
    nodes: Vec<serde_json::Value>,
    json: bool,
) -> Exit {
    let verdict = findings
        .iter()
        .map(|f| f.status)
        .max()
        .unwrap_or(Status::Fail);
    let failures = findings.iter().filter(|f| f.status == Status::Fail).count();
    let warnings = findings.iter().filter(|f| f.status == Status::Warn).count();
    if json {
        let doc = json!({
            "target": scrub_url(target),
            "verdict": verdict.word(),
            "failures": failures,
            "warnings": warnings,
            "checks": findings.iter().map(|f| json!({
                "node": f.node,
                "check": f.check,
                "status": f.status.word(),
                "detail": f.detail,
            })).collect::<Vec<_>>(),
            "nodes": nodes,
        });
        println!("{doc:#}");
    } else {
        println!("coord check: {}", scrub_url(target));
        // Redis's names fit in 17 columns; a longer name (PostgreSQL's settings) widens them.
        let width = findings
            .iter()
            .map(|f| f.check.len() + 1)
            .max()
            .unwrap_or(0)
            .max(17);
        let mut last_node: Option<&str> = None;
        for f in findings {
            if f.node.as_deref() != last_node {
                if let Some(node) = &f.node {
                    println!("node {node}");
                }
                last_node = f.node.as_deref();
            }
            println!(
                "  {:<width$} {:<5} {}",
                f.check,
                f.status.word().to_uppercase(),
                f.detail
            );
        }
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        println!(
            "verdict: {} ({}, {})",
            verdict.word().to_uppercase(),
            plural(failures, "failure", "failures"),
            plural(warnings, "warning", "warnings")
        );
    }
    if verdict == Status::Fail {
        Exit::CheckFailed
    } else {
        Exit::Done
    }
}

/// A URL without its password (`redis://user:secret@host` → `redis://user:***@host`), for a
/// target given by the user that could not be connected to.
pub(crate) fn scrub_url(text: &str) -> String {
    text.split(',')
        .map(|url| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &url[scheme + 3..at];
                let user = userinfo.split(':').next().unwrap_or("");
                let hidden = if userinfo.contains(':') {
                    format!("{user}:***")
                } else {
                    "***".to_owned()
                };
                format!("{}{hidden}{}", &url[..scheme + 3], &url[at..])
            }
            _ => url.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        assert_eq!(scrub_url("redis://u:secret@h:1/2"), "redis://u:***@h:1/2");
        assert_eq!(scrub_url("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(scrub_url("redis://secret@h:1"), "redis://***@h:1");
        assert_eq!(
            scrub_url("redis://h:1,redis://:p@g:2"),
            "redis://h:1,redis://:***@g:2"
        );
        assert_eq!(scrub_url("h:1"), "h:1");
    }
}
