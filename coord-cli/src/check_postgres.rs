//! `coord check --postgres-url ..`: is this PostgreSQL server fit for coord?
//!
//! Judged on the server the URL names, as the URL's role sees it (a role's own settings
//! apply: check with the application's URL):
//!
//! | check | ok | warn | fail |
//! |---|---|---|---|
//! | connect | connected | | cannot connect |
//! | version | 12 or newer | | older than 12 |
//! | replication | a primary without standbys; or with the synchronous standbys it asks for in sync | standbys but none synchronous (`synchronous_standby_names` empty, or `synchronous_commit` `local`/`off`) | a standby (`pg_is_in_recovery()`: writes refused); fewer synchronous standbys in sync than asked for (every commit waits) |
//! | fsync | `on` | | `off` |
//! | full_page_writes | `on` | `off` | |
//! | synchronous_commit | `on`, `remote_write`, `remote_apply`, `local` | `off` | |
//! | schema | at the tool's version | | missing, older, newer |
//! | expired rows | none expired for longer than twice the sweep interval | some (count and oldest age per table), or not readable | |
//! | connections | room for the pool and the listener | less room than that | no slot left |
//! | clock | within 1 s of this host | more than 1 s apart | |
//!
//! Why `fsync = off` fails while `synchronous_commit = off` warns: with `synchronous_commit =
//! off` a crash loses a bounded window of the last commits (about three `wal_writer_delay`,
//! 600 ms by default) and the database stays consistent, a trade some deployments make with
//! their eyes open; with `fsync = off` an operating-system crash or a power cut can lose any
//! acknowledged commit, of any age, and leave the database corrupt, so no grant or record
//! coord acknowledged can be relied on after one. PostgreSQL's own documentation keeps it to
//! throwaway data. `full_page_writes = off` is safe only on storage that never tears a page
//! (ZFS and the like): a warning, since the check cannot tell the storage.

use std::time::{Duration, Instant};

use coord_postgres::{
    DEFAULT_POOL_SIZE, DEFAULT_SWEEP_INTERVAL, EXPIRED_COUNT_CAP, SCHEMA_VERSION, SchemaError,
    ServerReport,
};
use serde_json::json;

use crate::args::Connection;
use crate::check::{CLOCK_WARN, Finding, Status, finding, print};
use crate::render::duration;
use crate::{Exit, Failure, postgres_builder};

/// How the check is asked for: the application's pool size and sweep interval.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The application's `pool_size` (default: the provider's).
    pub pool_size: Option<usize>,
    /// The application's `sweep_interval` (default: the provider's).
    pub sweep_interval: Option<Duration>,
}

pub async fn run(
    connection: &Connection,
    url: &str,
    json: bool,
    options: Options,
) -> Result<Exit, Failure> {
    let pool_size = options.pool_size.unwrap_or(DEFAULT_POOL_SIZE);
    let sweep_interval = options.sweep_interval.unwrap_or(DEFAULT_SWEEP_INTERVAL);
    // A sweeper's round comes at most 1.25 intervals after the last (jitter), and one round
    // deletes up to 10 000 rows per table: twice the interval leaves a round in hand.
    let expired_for = sweep_interval.saturating_mul(2);
    let started = Instant::now();
    let mut findings = Vec::new();
    let mut nodes = Vec::new();
    let target = match postgres_builder(connection, url)
        .server_report(expired_for)
        .await
    {
        Ok(report) => {
            let at = Some(report.address.as_str());
            findings.push(finding(
                at,
                "connect",
                Status::Ok,
                format!(
                    "connected to {} in {}",
                    report.address,
                    duration(started.elapsed())
                ),
            ));
            findings.extend(judge(&report, pool_size, sweep_interval));
            nodes.push(report_json(&report, pool_size));
            report.address.clone()
        }
        // As for Redis, whatever keeps the tool from reading the server (an unreadable URL
        // included) is the connect check's failure, with its reason.
        Err(err) => {
            findings.push(finding(None, "connect", Status::Fail, err.to_string()));
            url.to_owned()
        }
    };
    Ok(print(&target, &findings, nodes, json))
}

/// What coord thinks of the server's report (see the module's table).
fn judge(report: &ServerReport, pool_size: usize, sweep_interval: Duration) -> Vec<Finding> {
    let at = Some(report.address.as_str());
    let mut out = Vec::new();
    out.push(if report.version_supported() {
        finding(at, "version", Status::Ok, report.version.clone())
    } else {
        finding(
            at,
            "version",
            Status::Fail,
            format!(
                "{}: coord-postgres needs PostgreSQL 12 or newer",
                report.version
            ),
        )
    });
    out.push(judge_replication(report));
    out.push(if report.fsync == "off" {
        finding(
            at,
            "fsync",
            Status::Fail,
            "off: an operating-system crash or power cut can lose any commit the server \
             acknowledged, of any age, and corrupt the database: a granted lock is free again \
             (two holders), a stored outcome is gone (the operation runs twice); set `fsync = \
             on` (keep `off` for throwaway test servers)"
                .to_owned(),
        )
    } else {
        finding(at, "fsync", Status::Ok, report.fsync.clone())
    });
    out.push(if report.full_page_writes == "off" {
        finding(
            at,
            "full_page_writes",
            Status::Warn,
            "off: unless the storage never tears a page (ZFS and the like), an \
             operating-system crash can leave pages of coord's tables half written and \
             unrecoverable; set `full_page_writes = on`"
                .to_owned(),
        )
    } else {
        finding(
            at,
            "full_page_writes",
            Status::Ok,
            report.full_page_writes.clone(),
        )
    });
    out.push(if report.synchronous_commit == "off" {
        finding(
            at,
            "synchronous_commit",
            Status::Warn,
            "off: a crash of the server loses the last commits it acknowledged (about 3 × \
             `wal_writer_delay`, 600 ms by default): a lock granted then is free after the \
             restart (two holders), an outcome stored then is gone (the operation runs \
             again); set it on for coord's role: `ALTER ROLE <role> SET synchronous_commit = \
             on`"
            .to_owned(),
        )
    } else {
        finding(
            at,
            "synchronous_commit",
            Status::Ok,
            report.synchronous_commit.clone(),
        )
    });
    out.push(judge_schema(report));
    if report.schema_version.is_some() {
        out.push(judge_expired(report, sweep_interval));
    }
    out.push(judge_connections(report, pool_size));
    let apart = report
        .clock_offset_ms
        .unsigned_abs()
        .saturating_sub(report.clock_uncertainty_ms);
    let offset = format!(
        "{:+} ms (±{} ms) against this host",
        report.clock_offset_ms, report.clock_uncertainty_ms
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

fn judge_replication(report: &ServerReport) -> Finding {
    let at = Some(report.address.as_str());
    let check = "replication";
    if report.in_recovery {
        return finding(
            at,
            check,
            Status::Fail,
            "this server is a standby (`pg_is_in_recovery()`): it refuses coord's writes; \
             point coord at the primary (with several hosts, `target_session_attrs = \
             read-write`)"
                .to_owned(),
        );
    }
    let listed = report
        .standbys
        .iter()
        .map(|s| {
            format!(
                "{} {} {}{}",
                if s.name.is_empty() { "?" } else { &s.name },
                s.state,
                s.sync_state,
                s.replay_lag_ms
                    .map_or_else(String::new, |ms| format!(" replay lag {ms} ms"))
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let in_sync = report.synchronous_standbys().count();
    let names = &report.synchronous_standby_names;
    match report.synchronous_standbys_required() {
        Some(required) if report.commits_wait_for_standbys() => {
            if (in_sync as u64) < u64::from(required) {
                finding(
                    at,
                    check,
                    Status::Fail,
                    format!(
                        "`synchronous_standby_names = '{names}'` asks for {required} \
                         synchronous standby(s), {in_sync} in sync{}: every commit waits for \
                         them, so every grant and record times out; bring the standbys back, \
                         or empty `synchronous_standby_names`",
                        if listed.is_empty() {
                            " (none connected)".to_owned()
                        } else {
                            format!(" ({listed})")
                        }
                    ),
                )
            } else {
                finding(
                    at,
                    check,
                    Status::Ok,
                    format!(
                        "primary; commits wait for {required} of `{names}`: {in_sync} in sync \
                         ({listed})"
                    ),
                )
            }
        }
        Some(_) => finding(
            at,
            check,
            Status::Warn,
            format!(
                "`synchronous_standby_names = '{names}'`, but `synchronous_commit = {}` does \
                 not wait for standbys: a failover can lose commits this primary acknowledged \
                 (a granted lock, a stored record); set `synchronous_commit = on`",
                report.synchronous_commit
            ),
        ),
        None if report.standbys.is_empty() => finding(
            at,
            check,
            Status::Ok,
            "primary, no standbys (nothing to fail over to: a restart keeps what was \
             committed)"
                .to_owned(),
        ),
        None => finding(
            at,
            check,
            Status::Warn,
            format!(
                "primary with {} asynchronous standby(s) ({listed}): a failover can lose \
                 commits this primary acknowledged (a granted lock is free on the new primary, \
                 a stored record is gone); set `synchronous_standby_names` (with \
                 `synchronous_commit = on`), and advance `fence_seq` after any failover",
                report.standbys.len()
            ),
        ),
    }
}

fn judge_schema(report: &ServerReport) -> Finding {
    let at = Some(report.address.as_str());
    let schema = &report.schema;
    match report.schema_check() {
        Ok(()) => finding(
            at,
            "schema",
            Status::Ok,
            format!("version {SCHEMA_VERSION} in schema `{schema}`"),
        ),
        Err(SchemaError::Missing { .. }) => finding(
            at,
            "schema",
            Status::Fail,
            format!(
                "coord's tables are not in schema `{schema}`: run coord migrate \
                 (`coord migrate --postgres-url <url> --postgres-schema {schema}`, as a role \
                 that may create tables there)"
            ),
        ),
        Err(SchemaError::Outdated { found, .. }) => finding(
            at,
            "schema",
            Status::Fail,
            format!(
                "version {found} in schema `{schema}`, older than the {SCHEMA_VERSION} this \
                 coord speaks: providers of this version refuse to connect; run coord migrate \
                 (`coord migrate --postgres-url <url> --postgres-schema {schema}`)"
            ),
        ),
        Err(SchemaError::Newer { found, .. }) => finding(
            at,
            "schema",
            Status::Fail,
            format!(
                "version {found} in schema `{schema}`, newer than the {SCHEMA_VERSION} this \
                 coord knows (a newer coord migrated it): upgrade coord"
            ),
        ),
        Err(other) => finding(at, "schema", Status::Fail, other.to_string()),
    }
}

fn judge_expired(report: &ServerReport, sweep_interval: Duration) -> Finding {
    let at = Some(report.address.as_str());
    let check = "expired rows";
    let window = duration(report.expired_for);
    if let Some(err) = &report.expired_error {
        return finding(
            at,
            check,
            Status::Warn,
            format!("not readable ({err}): cannot tell whether expired rows are swept"),
        );
    }
    let unswept: Vec<String> = report
        .unswept()
        .map(|e| {
            format!(
                "{}{} in {} (oldest expired {} ago)",
                if e.rows >= EXPIRED_COUNT_CAP {
                    "at least "
                } else {
                    ""
                },
                e.rows,
                e.table,
                e.oldest_ms
                    .map_or_else(|| "?".to_owned(), |ms| duration(Duration::from_millis(ms)))
            )
        })
        .collect();
    if unswept.is_empty() {
        finding(
            at,
            check,
            Status::Ok,
            format!("none expired more than {window} ago (twice the sweep interval)"),
        )
    } else {
        finding(
            at,
            check,
            Status::Warn,
            format!(
                "rows expired more than {window} ago (twice the sweep interval of {}): {}; no \
                 provider's sweeper is running (every provider built with \
                 `sweep_interval(None)`), or it cannot keep up: such rows count as absent, but \
                 the tables and their indexes grow; run a provider with its sweeper on (or \
                 call `PostgresProvider::sweep`)",
                duration(sweep_interval),
                unswept.join(", ")
            ),
        )
    }
}

fn judge_connections(report: &ServerReport, pool_size: usize) -> Finding {
    let at = Some(report.address.as_str());
    let check = "connections";
    let left = report.connections_left();
    let needed = pool_size.saturating_add(1);
    let counts = format!(
        "{left} left of max_connections {} ({} reserved for superusers, {} in use)",
        report.max_connections, report.reserved_connections, report.connections_in_use
    );
    if left == 0 {
        finding(
            at,
            check,
            Status::Fail,
            format!(
                "{counts}: a new connection of coord's is refused, so a provider cannot start \
                 and a pool cannot grow (statements needing one fail `Unavailable`); raise \
                 `max_connections` or close sessions"
            ),
        )
    } else if needed > left as usize {
        finding(
            at,
            check,
            Status::Warn,
            format!(
                "{counts}: one more provider with a pool of {pool_size} needs {needed} (the \
                 pool and its listening connection); when slots run out, statements that need \
                 a new connection fail `Unavailable`; raise `max_connections`, or lower \
                 `pool_size` (--pool-size says which pool to check for)"
            ),
        )
    } else {
        finding(
            at,
            check,
            Status::Ok,
            format!("{counts}: room for a pool of {pool_size} and its listener"),
        )
    }
}

/// What was read, for `--json`.
fn report_json(report: &ServerReport, pool_size: usize) -> serde_json::Value {
    json!({
        "node": report.address,
        "backend": "postgres",
        "version": report.version,
        "version_num": report.version_num,
        "in_recovery": report.in_recovery,
        "fsync": report.fsync,
        "full_page_writes": report.full_page_writes,
        "synchronous_commit": report.synchronous_commit,
        "synchronous_standby_names": report.synchronous_standby_names,
        "standbys": report.standbys.iter().map(|s| json!({
            "name": s.name,
            "address": s.address,
            "state": s.state,
            "sync_state": s.sync_state,
            "replay_lag_ms": s.replay_lag_ms,
        })).collect::<Vec<_>>(),
        "schema": report.schema,
        "schema_version": report.schema_version,
        "schema_version_expected": SCHEMA_VERSION,
        "expired_for_ms": report.expired_for.as_millis().min(u64::MAX as u128) as u64,
        "expired": report.expired.iter().map(|e| json!({
            "table": e.table,
            "rows": e.rows,
            "oldest_ms": e.oldest_ms,
        })).collect::<Vec<_>>(),
        "expired_error": report.expired_error,
        "max_connections": report.max_connections,
        "reserved_connections": report.reserved_connections,
        "connections_in_use": report.connections_in_use,
        "connections_left": report.connections_left(),
        "pool_size": pool_size,
        "clock_offset_ms": report.clock_offset_ms,
        "clock_uncertainty_ms": report.clock_uncertainty_ms,
    })
}
