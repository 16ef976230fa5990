//! What a server tells about its fitness for coord: the settings that decide whether an
//! acknowledged grant or record survives a crash, replication, the version of coord's tables,
//! whether expired rows are being swept, connection headroom and the server's clock, read
//! as a [`ServerReport`] for someone else to judge (`coord check`).
//!
//! Reading the report changes nothing on the server: it is read-only statements over one
//! connection of its own, and it works whatever version coord's tables are at, or without
//! them (which [`PostgresProviderBuilder::connect`](crate::PostgresProviderBuilder::connect)
//! refuses).

use std::time::{Duration, SystemTime};

use tokio_postgres::Client;

use crate::schema::{self, SchemaError};

/// The oldest PostgreSQL coord-postgres runs on, as `server_version_num` (12.0).
pub const MIN_POSTGRES_VERSION_NUM: u32 = 120_000;

/// The most expired rows counted per table (counting stops there: the check needs to know
/// that rows wait, not exactly how many millions).
pub const EXPIRED_COUNT_CAP: u64 = 100_000;

/// Every table of coord's with an `expires_at` column the sweeper deletes by, in the order of
/// the migrations that made them.
const EXPIRING_TABLES: [&str; 9] = [
    "locks",
    "records",
    "cache",
    "flights",
    "flight_outcomes",
    "semaphores",
    "semaphore_permits",
    "rw_locks",
    "rw_holds",
];

/// What coord found on one PostgreSQL server: see
/// [`PostgresProviderBuilder::server_report`](crate::PostgresProviderBuilder::server_report).
///
/// Settings are as the reporting session sees them (`current_setting`): a role's or a
/// database's own `ALTER ROLE .. SET` / `ALTER DATABASE .. SET` apply, so read it with the
/// application's URL to see what the application's sessions get.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerReport {
    /// Where the report was read (`host:port/database`, never a password).
    pub address: String,
    /// The schema looked in for coord's tables.
    pub schema: String,
    /// `server_version` (for example `15.6 (Debian 15.6-0+deb12u1)`).
    pub version: String,
    /// `server_version_num` (for example `150006`).
    pub version_num: u32,
    /// `pg_is_in_recovery()`: the server is a standby (or recovering), so it refuses writes.
    pub in_recovery: bool,
    /// `fsync` (`on` / `off`).
    pub fsync: String,
    /// `full_page_writes` (`on` / `off`).
    pub full_page_writes: String,
    /// `synchronous_commit` (`on`, `remote_apply`, `remote_write`, `local`, `off`).
    pub synchronous_commit: String,
    /// `synchronous_standby_names` (empty: no synchronous standby is waited for).
    pub synchronous_standby_names: String,
    /// The standbys streaming from this server (`pg_stat_replication`), in its order.
    pub standbys: Vec<StandbyReport>,
    /// The version of coord's tables in [`schema`](Self::schema): `None` when they are not
    /// there (no `schema_version` table), 0 when it holds no version.
    pub schema_version: Option<u32>,
    /// The age past its expiry from which a row counts in [`expired`](Self::expired).
    pub expired_for: Duration,
    /// Per table of coord's that exists, the rows expired for longer than
    /// [`expired_for`](Self::expired_for) (empty when the tables are not there).
    pub expired: Vec<ExpiredRows>,
    /// Why the expired rows could not be counted (a role without `SELECT` on the tables),
    /// when they could not.
    pub expired_error: Option<String>,
    /// `max_connections`.
    pub max_connections: u32,
    /// The connection slots only superusers (and, from PostgreSQL 16, roles with
    /// `pg_use_reserved_connections`) may take: `superuser_reserved_connections` plus
    /// `reserved_connections`.
    pub reserved_connections: u32,
    /// Client sessions connected besides the reporting one (`pg_stat_activity`, client
    /// backends only: background workers and WAL senders have slots of their own). A role
    /// without `pg_read_all_stats` (or `pg_monitor`) is not shown other sessions' types:
    /// then every session in a database, as a user, counts, which may count a background
    /// worker that runs as one.
    pub connections_in_use: u32,
    /// The server's clock minus this host's, in milliseconds (positive: the server is ahead),
    /// from `clock_timestamp()` taken at the midpoint of the round trip.
    pub clock_offset_ms: i64,
    /// How far off `clock_offset_ms` may be from measuring alone: half the round trip, in
    /// milliseconds.
    pub clock_uncertainty_ms: u64,
}

/// One standby streaming from the reported server, as that server sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StandbyReport {
    /// Its `application_name` (what `synchronous_standby_names` lists).
    pub name: String,
    /// Its address (`client_addr`), when connected over TCP and visible to the role.
    pub address: Option<String>,
    /// The WAL sender's state (`streaming` once caught up; `startup`, `catchup`, `backup`).
    pub state: String,
    /// `sync_state`: `sync` or `quorum` (commits wait for it), `potential` (would take over
    /// as synchronous), `async`.
    pub sync_state: String,
    /// How far its replay trails, as the server measured it (`replay_lag`), in milliseconds;
    /// `None` when not reported (idle, or a role without `pg_monitor`).
    pub replay_lag_ms: Option<u64>,
}

impl StandbyReport {
    /// Whether commits wait for this standby: `sync_state` is `sync` or `quorum`.
    pub fn is_synchronous(&self) -> bool {
        matches!(self.sync_state.as_str(), "sync" | "quorum")
    }
}

/// The expired rows of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExpiredRows {
    /// The table (in the report's schema).
    pub table: String,
    /// How many rows expired longer ago than the report's `expired_for`, counted up to
    /// [`EXPIRED_COUNT_CAP`].
    pub rows: u64,
    /// How long ago the oldest of them expired, in milliseconds (`None` when there is none).
    pub oldest_ms: Option<u64>,
}

impl ServerReport {
    /// Whether the version is one coord-postgres runs on ([`MIN_POSTGRES_VERSION_NUM`] or
    /// newer).
    pub fn version_supported(&self) -> bool {
        self.version_num >= MIN_POSTGRES_VERSION_NUM
    }

    /// What the version of coord's tables means for this crate: `Ok` at exactly
    /// [`SCHEMA_VERSION`](crate::SCHEMA_VERSION), otherwise the [`SchemaError`] connecting
    /// would fail with (missing, older, newer).
    pub fn schema_check(&self) -> Result<(), SchemaError> {
        schema::check_version(&self.schema, self.schema_version)
    }

    /// How many synchronous standbys a commit waits for, read from
    /// `synchronous_standby_names` (`FIRST n (..)`, `ANY n (..)`, `n (..)`, or a plain list,
    /// which is one); `None` when it is empty (no commit waits for a standby).
    pub fn synchronous_standbys_required(&self) -> Option<u32> {
        required_standbys(&self.synchronous_standby_names)
    }

    /// The standbys commits wait for now (`sync` or `quorum`).
    pub fn synchronous_standbys(&self) -> impl Iterator<Item = &StandbyReport> {
        self.standbys.iter().filter(|s| s.is_synchronous())
    }

    /// Whether commits wait for a standby's acknowledgement at all: a synchronous standby is
    /// asked for and `synchronous_commit` is `on`, `remote_write` or `remote_apply`
    /// (`local` and `off` do not wait).
    pub fn commits_wait_for_standbys(&self) -> bool {
        self.synchronous_standbys_required().is_some()
            && matches!(
                self.synchronous_commit.as_str(),
                "on" | "remote_write" | "remote_apply"
            )
    }

    /// Connection slots a non-superuser may still take: `max_connections` minus the reserved
    /// slots minus the sessions in use (the reporting one not counted), at least 0.
    pub fn connections_left(&self) -> u32 {
        self.max_connections
            .saturating_sub(self.reserved_connections)
            .saturating_sub(self.connections_in_use)
    }

    /// The tables holding rows expired longer ago than `expired_for`.
    pub fn unswept(&self) -> impl Iterator<Item = &ExpiredRows> {
        self.expired.iter().filter(|e| e.rows > 0)
    }
}

/// The count of synchronous standbys `names` (a `synchronous_standby_names` value) asks for.
fn required_standbys(names: &str) -> Option<u32> {
    let names = names.trim();
    if names.is_empty() {
        return None;
    }
    let rest = ["first", "any"]
        .iter()
        .find_map(|word| {
            let head = names.get(..word.len())?;
            let tail = &names[word.len()..];
            (head.eq_ignore_ascii_case(word) && tail.starts_with(char::is_whitespace))
                .then(|| tail.trim_start())
        })
        .unwrap_or(names);
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let counted = digits > 0 && rest[digits..].trim_start().starts_with('(');
    if counted {
        rest[..digits].parse().ok()
    } else {
        // A plain list (`a, b`, or `*`): the first one connected is the synchronous one.
        Some(1)
    }
}

/// Reads the report over `client`, a connection of its own to the server at `address`.
pub(crate) async fn read(
    client: &Client,
    address: &str,
    schema_name: &str,
    expired_for: Duration,
) -> Result<ServerReport, tokio_postgres::Error> {
    let settings = client
        .query_one(
            "SELECT current_setting('server_version'),
                    current_setting('server_version_num')::int,
                    pg_is_in_recovery(),
                    current_setting('fsync'),
                    current_setting('full_page_writes'),
                    current_setting('synchronous_commit'),
                    current_setting('synchronous_standby_names'),
                    current_setting('max_connections')::int,
                    current_setting('superuser_reserved_connections')::int
                      + coalesce(current_setting('reserved_connections', true)::int, 0),
                    (SELECT count(*)::int FROM pg_stat_activity
                     WHERE pid <> pg_backend_pid()
                       AND CASE WHEN backend_type IS NOT NULL
                                THEN backend_type = 'client backend'
                                -- A role without `pg_read_all_stats` sees no other session's
                                -- type: a session in a database, as a user, is a client's.
                                ELSE datid IS NOT NULL AND usesysid IS NOT NULL END)",
            &[],
        )
        .await?;
    let count = |i: usize| u32::try_from(settings.get::<_, i32>(i)).unwrap_or(0);
    let standbys = client
        .query(
            "SELECT coalesce(application_name, ''), host(client_addr),
                    coalesce(state, 'unknown'), coalesce(sync_state, 'unknown'),
                    (extract(epoch FROM replay_lag) * 1000)::bigint
             FROM pg_stat_replication ORDER BY pid",
            &[],
        )
        .await?
        .iter()
        .map(|row| StandbyReport {
            name: row.get(0),
            address: row.get(1),
            state: row.get(2),
            sync_state: row.get(3),
            replay_lag_ms: row.get::<_, Option<i64>>(4).map(|ms| ms.max(0) as u64),
        })
        .collect();
    let schema_version = schema::read_version(client, schema_name).await?;
    let (expired, expired_error) = match schema_version {
        None => (Vec::new(), None),
        Some(_) => match expired_rows(client, schema_name, expired_for).await {
            Ok(expired) => (expired, None),
            Err(err) => (Vec::new(), Some(describe_error(&err))),
        },
    };
    let (clock_offset_ms, clock_uncertainty_ms) = clock_offset(client).await?;
    Ok(ServerReport {
        address: address.to_owned(),
        schema: schema_name.to_owned(),
        version: settings.get(0),
        version_num: count(1),
        in_recovery: settings.get(2),
        fsync: settings.get(3),
        full_page_writes: settings.get(4),
        synchronous_commit: settings.get(5),
        synchronous_standby_names: settings.get(6),
        standbys,
        schema_version,
        expired_for,
        expired,
        expired_error,
        max_connections: count(7),
        reserved_connections: count(8),
        connections_in_use: count(9),
        clock_offset_ms,
        clock_uncertainty_ms,
    })
}

/// A server's error as one line (its code and message), for the report.
fn describe_error(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => err.to_string(),
    }
}

/// The rows of every expiring table of `schema_name` that exists, expired for longer than
/// `expired_for`.
async fn expired_rows(
    client: &Client,
    schema_name: &str,
    expired_for: Duration,
) -> Result<Vec<ExpiredRows>, tokio_postgres::Error> {
    let q = schema::quoted(schema_name);
    let age_ms = expired_for.as_millis().min(i64::MAX as u128) as i64;
    let cap = EXPIRED_COUNT_CAP as i64;
    let mut out = Vec::new();
    for table in EXPIRING_TABLES {
        let name = format!("{q}.{table}");
        let exists: bool = client
            .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&name])
            .await?
            .get(0);
        if !exists {
            continue;
        }
        // The cut-off is taken once, in the server's clock, for both the count and the age.
        let row = client
            .query_one(
                &format!(
                    "WITH cut AS MATERIALIZED (
                       SELECT clock_timestamp() AS now,
                              clock_timestamp() - $1::bigint * interval '1 millisecond' AS before
                     )
                     SELECT (SELECT count(*) FROM (SELECT 1 FROM {name}, cut
                                                   WHERE expires_at < cut.before
                                                   LIMIT $2::bigint) capped),
                            (SELECT (extract(epoch FROM (cut.now - min(expires_at))) * 1000)::bigint
                             FROM {name}, cut WHERE expires_at < cut.before
                             GROUP BY cut.now)
                     FROM cut"
                ),
                &[&age_ms, &cap],
            )
            .await?;
        out.push(ExpiredRows {
            table: table.to_owned(),
            rows: row.get::<_, i64>(0).max(0) as u64,
            oldest_ms: row.get::<_, Option<i64>>(1).map(|ms| ms.max(0) as u64),
        });
    }
    Ok(out)
}

/// The server's clock against this host's: (offset, uncertainty), in milliseconds.
async fn clock_offset(client: &Client) -> Result<(i64, u64), tokio_postgres::Error> {
    let before = SystemTime::now();
    let server_ms: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await?
        .get(0);
    let after = SystemTime::now();
    let half_trip = after.duration_since(before).unwrap_or_default() / 2;
    let local_mid = unix_ms(before + half_trip);
    Ok((
        server_ms.saturating_sub(local_mid),
        half_trip.as_millis().min(u64::MAX as u128) as u64,
    ))
}

/// Milliseconds since the Unix epoch (negative before it).
fn unix_ms(at: SystemTime) -> i64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_millis().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_millis().min(i64::MAX as u128) as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> ServerReport {
        ServerReport {
            address: "h:5432/db".to_owned(),
            schema: "coord".to_owned(),
            version: "15.6".to_owned(),
            version_num: 150_006,
            in_recovery: false,
            fsync: "on".to_owned(),
            full_page_writes: "on".to_owned(),
            synchronous_commit: "on".to_owned(),
            synchronous_standby_names: String::new(),
            standbys: Vec::new(),
            schema_version: Some(crate::SCHEMA_VERSION),
            expired_for: Duration::from_secs(120),
            expired: Vec::new(),
            expired_error: None,
            max_connections: 100,
            reserved_connections: 3,
            connections_in_use: 10,
            clock_offset_ms: 0,
            clock_uncertainty_ms: 0,
        }
    }

    #[test]
    fn synchronous_standby_names_are_counted() {
        assert_eq!(required_standbys(""), None);
        assert_eq!(required_standbys("  "), None);
        assert_eq!(required_standbys("s1"), Some(1));
        assert_eq!(required_standbys("s1, s2"), Some(1));
        assert_eq!(required_standbys("*"), Some(1));
        assert_eq!(required_standbys("2 (s1, s2, s3)"), Some(2));
        assert_eq!(required_standbys("FIRST 2 (s1, s2, s3)"), Some(2));
        assert_eq!(required_standbys("any 3(s1, s2, s3)"), Some(3));
        // A standby may be called `first` or `2x`.
        assert_eq!(required_standbys("first"), Some(1));
        assert_eq!(required_standbys("2x, s1"), Some(1));
    }

    #[test]
    fn commits_wait_only_when_asked_and_not_local() {
        let mut r = report();
        assert!(!r.commits_wait_for_standbys());
        r.synchronous_standby_names = "s1".to_owned();
        assert!(r.commits_wait_for_standbys());
        for no_wait in ["local", "off"] {
            r.synchronous_commit = no_wait.to_owned();
            assert!(!r.commits_wait_for_standbys(), "{no_wait}");
        }
        r.standbys.push(StandbyReport {
            name: "s1".to_owned(),
            address: None,
            state: "streaming".to_owned(),
            sync_state: "async".to_owned(),
            replay_lag_ms: None,
        });
        assert_eq!(r.synchronous_standbys().count(), 0);
        r.standbys[0].sync_state = "quorum".to_owned();
        assert_eq!(r.synchronous_standbys().count(), 1);
    }

    #[test]
    fn headroom_and_versions() {
        let mut r = report();
        assert_eq!(r.connections_left(), 87);
        r.connections_in_use = 200;
        assert_eq!(r.connections_left(), 0, "never negative");
        assert!(r.version_supported());
        r.version_num = 110_022;
        assert!(!r.version_supported());
        assert!(r.schema_check().is_ok());
        r.schema_version = None;
        assert!(matches!(r.schema_check(), Err(SchemaError::Missing { .. })));
        r.schema_version = Some(1);
        assert!(matches!(
            r.schema_check(),
            Err(SchemaError::Outdated { .. })
        ));
    }
}
