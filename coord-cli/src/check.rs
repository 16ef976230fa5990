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

use std::time::{Duration, Instant};

use coord_redis::{MIN_REDIS_VERSION, NodeReport, SAFE_POLICY};
use serde_json::json;

use crate::args::Connection;
use crate::{Exit, Failure, connect};

/// Clock offsets beyond this (after the measuring uncertainty) are worth a warning.
const CLOCK_WARN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
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

struct Finding {
    node: Option<String>,
    check: &'static str,
    status: Status,
    detail: String,
}

fn finding(node: Option<&str>, check: &'static str, status: Status, detail: String) -> Finding {
    Finding {
        node: node.map(str::to_owned),
        check,
        status,
        detail,
    }
}

/// What coord thinks of one node's report.
fn judge(node: &NodeReport) -> Vec<Finding> {
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

pub async fn run(connection: &Connection, json: bool) -> Result<Exit, Failure> {
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
                        findings.extend(judge(node));
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
    let verdict = findings
        .iter()
        .map(|f| f.status)
        .max()
        .unwrap_or(Status::Fail);
    let failures = findings.iter().filter(|f| f.status == Status::Fail).count();
    let warnings = findings.iter().filter(|f| f.status == Status::Warn).count();
    if json {
        let doc = json!({
            "target": scrub_url(&target),
            "verdict": verdict.word(),
            "failures": failures,
            "warnings": warnings,
            "checks": findings.iter().map(|f| json!({
                "node": f.node,
                "check": f.check,
                "status": f.status.word(),
                "detail": f.detail,
            })).collect::<Vec<_>>(),
            "nodes": nodes.iter().map(|n| json!({
                "node": n.node,
                "version": n.version,
                "maxmemory_policy": n.maxmemory_policy,
                "appendonly": n.appendonly,
                "save": n.save,
                "config_error": n.config_error,
                "clock_offset_ms": n.clock_offset_ms,
                "clock_uncertainty_ms": n.clock_uncertainty_ms,
            })).collect::<Vec<_>>(),
        });
        println!("{doc:#}");
    } else {
        println!("coord check: {}", scrub_url(&target));
        let mut last_node: Option<&str> = None;
        for f in &findings {
            if f.node.as_deref() != last_node {
                if let Some(node) = &f.node {
                    println!("node {node}");
                }
                last_node = f.node.as_deref();
            }
            println!(
                "  {:<17} {:<5} {}",
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
    Ok(if verdict == Status::Fail {
        Exit::CheckFailed
    } else {
        Exit::Done
    })
}

/// A URL without its password (`redis://user:secret@host` → `redis://user:***@host`), for a
/// target given by the user that could not be connected to.
fn scrub_url(text: &str) -> String {
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
