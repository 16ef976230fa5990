//! The command line, as clap reads it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Inspect and operate coord's locks and idempotency records in Redis or PostgreSQL, check a
/// Redis deployment or a PostgreSQL server for coord, and create or upgrade coord's tables in
/// PostgreSQL.
///
/// Keys are given and printed in coord's shown form, `operation:parts` (for example
/// `payments.charge:order-7`, or `my_app::jobs::nightly:t-7` for an operation named by
/// default after its module path and function): the form coord's errors, call reports and
/// log lines print. The operation ends at the first single `:`. Quote a key that holds a
/// space.
///
/// The application's namespace: --namespace, else --app (the application's binary name: the
/// namespace its coordinator takes when given none), else COORD_NAMESPACE.
#[derive(Debug, Parser)]
#[command(name = "coord", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub connection: Connection,

    /// Print JSON on stdout (one document per command) instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// The exit codes, shown under `--help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done (check: no failure; warnings allowed)
  1  check: at least one check failed
  2  bad usage or input: arguments, URL, credentials, namespace, a key coord never prints, a cursor
  3  Redis or PostgreSQL unreachable, too slow, or answering with an error
  4  corrupt state under coord's keys (a value coord did not write)
  5  a destructive command was not confirmed (declined, or no --yes without a terminal)";

/// Where Redis (or PostgreSQL) is and how to talk to it.
#[derive(Debug, Args)]
pub struct Connection {
    /// PostgreSQL URL (`postgres://user[:password]@host[:port]/database[?sslmode=..]`, or
    /// `?host=/path/to/socket/dir` for a Unix socket): work on coord's tables there instead of
    /// Redis. Needed by `migrate`.
    #[arg(
        long,
        env = "COORD_POSTGRES_URL",
        hide_env_values = true,
        global = true
    )]
    pub postgres_url: Option<String>,

    /// The schema holding coord's tables in PostgreSQL (default: `coord`).
    #[arg(
        long,
        env = "COORD_POSTGRES_SCHEMA",
        value_name = "SCHEMA",
        global = true
    )]
    pub postgres_schema: Option<String>,

    /// For PostgreSQL over TLS: trust the CA certificates in this PEM file instead of the
    /// system's.
    #[arg(
        long,
        env = "COORD_POSTGRES_TLS_CA_FILE",
        value_name = "FILE",
        global = true
    )]
    pub postgres_ca: Option<std::path::PathBuf>,

    /// Redis URL (`redis://[user[:password]@]host[:port][/db]`). With --cluster or --sentinel,
    /// a comma-separated list of seed or Sentinel nodes.
    #[arg(long, env = "COORD_REDIS_URL", hide_env_values = true, global = true)]
    pub url: Option<String>,

    /// The application's coord namespace (what its coordinator was built with; default:
    /// --app, else the COORD_NAMESPACE variable). Needed by `locks` and `records`.
    #[arg(long, global = true)]
    pub namespace: Option<String>,

    /// The application's binary name (`payflow`, or its path): its namespace is the one its
    /// coordinator takes when given none, COORD_NAMESPACE unset (the file stem, with `:`,
    /// braces and whitespace made `_`). For applications that do not set a namespace.
    #[arg(
        long,
        value_name = "BINARY",
        global = true,
        conflicts_with = "namespace"
    )]
    pub app: Option<String>,

    /// The URL lists the seed nodes of a Redis Cluster.
    #[arg(long, global = true, conflicts_with = "sentinel")]
    pub cluster: bool,

    /// The URL lists Sentinel nodes; MASTER is the monitored master's name.
    #[arg(long, value_name = "MASTER", global = true)]
    pub sentinel: Option<String>,

    /// Which Redis client library to use.
    #[arg(long, value_enum, default_value_t = ClientArg::RedisRs, global = true)]
    pub client: ClientArg,

    /// For `rediss://`: trust the CA certificates in this PEM file instead of the system's.
    #[arg(long, value_name = "FILE", global = true)]
    pub tls_ca: Option<std::path::PathBuf>,

    /// For `rediss://` servers that authenticate clients: this client certificate (PEM)...
    #[arg(long, value_name = "FILE", global = true, requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,

    /// ...and its private key (PEM).
    #[arg(long, value_name = "FILE", global = true, requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,

    /// The bound on every Redis call or PostgreSQL statement (`500ms`, `2s`, `1m`).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration, global = true)]
    pub timeout: Duration,
}

/// A client library compiled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientArg {
    /// The `redis` crate.
    RedisRs,
    /// The `fred` crate (built with the `fred` feature).
    #[cfg(feature = "fred")]
    Fred,
}

impl From<ClientArg> for coord_redis::Client {
    fn from(client: ClientArg) -> coord_redis::Client {
        match client {
            ClientArg::RedisRs => coord_redis::Client::RedisRs,
            #[cfg(feature = "fred")]
            ClientArg::Fred => coord_redis::Client::Fred,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Distributed locks: list the held locks of an operation, show one, force one free.
    #[command(subcommand)]
    Locks(LockCommand),

    /// Idempotency records: list the records of an operation, show one, purge one.
    #[command(subcommand)]
    Records(RecordCommand),

    /// Check a Redis deployment for coord: connectivity, server version, `maxmemory-policy`,
    /// persistence, clock skew and replication, on every data node, with a verdict. With
    /// --postgres-url, check a PostgreSQL server instead: version, standby or primary and its
    /// synchronous standbys, `fsync`, `full_page_writes`, `synchronous_commit`, the version
    /// of coord's tables, expired rows left unswept, connection headroom and clock skew.
    /// Exits 1 when a check fails.
    Check {
        /// Redis: the `replica_acks` replica count the application asks for
        /// (`RedisProviderBuilder::replica_acks`): warns when a primary has fewer replicas
        /// in step, since every grant would then fail.
        #[arg(long, value_name = "N")]
        replica_acks: Option<u32>,

        /// PostgreSQL: the application's `pool_size` (default: the provider's, 8): warns when
        /// the connections left cannot take one more such pool and its listening connection.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
        pool_size: Option<u32>,

        /// PostgreSQL: the application's `sweep_interval` (default: the provider's, 60s): rows
        /// expired for longer than twice this are reported as unswept.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        sweep_interval: Option<Duration>,
    },

    /// Create coord's tables in PostgreSQL, or bring them up to this version (--postgres-url,
    /// --postgres-schema): applies the migrations the schema lacks, in one transaction, and
    /// says from which version to which. Run it as a role that may create the schema's
    /// tables; safe to run again, and from two places at once. Exits 2 when the tables are
    /// newer than this `coord` knows.
    Migrate,
}

#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// The held locks of OPERATION, with holder, lease left, waiters and fencing token; without
    /// OPERATION, the operations that hold locks.
    List(ListArgs),

    /// One lock: held or free, by whom, for how long yet, waiters, fencing token.
    Show {
        /// The key, as coord prints it (`operation:parts`).
        key: String,
    },

    /// Force a lock free, whoever holds it. The holder is not told: it finds out at its next
    /// renewal. Asks for confirmation unless --yes.
    Release(Destructive),

    /// One semaphore (`permits = N`): every permit held now, with its owner, lease left and
    /// fencing token, and whether anyone waits. The limit is the callers' own and is not
    /// stored, so it is not shown.
    Permits {
        /// The key, as coord prints it (`operation:parts`).
        key: String,
    },

    /// One read-write lock (`mode = "read" | "write"`): its readers or its writer, each with
    /// owner, lease left and fencing token, the waiting writer whose claim keeps new readers
    /// out, and whether anyone waits.
    Rw {
        /// The key, as coord prints it (`operation:parts`).
        key: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum RecordCommand {
    /// The idempotency records of OPERATION, with state, age and time left; without OPERATION,
    /// the operations that have records.
    List(RecordListArgs),

    /// One record: in flight, completed or abandoned, its owner, age, lease or retention
    /// left, payload size, fingerprint.
    Show {
        /// The key, as coord prints it (`operation:parts`).
        key: String,
    },

    /// Remove a record, whatever its state (to resolve an abandoned call after reconciling
    /// by hand, or to clear a corrupt record): the next call with the key runs the body again.
    /// Asks for confirmation unless --yes.
    Purge(Destructive),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// The operation's name: the attribute's `name`, or by default its module path and
    /// function name (`my_app::jobs::nightly`). Without it: every operation that has state in
    /// the namespace, with how many keys.
    pub operation: Option<String>,

    /// The most keys per page (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: u16,

    /// Continue a listing where the previous page ended (its `next` cursor).
    #[arg(long, conflicts_with = "all", requires = "operation")]
    pub cursor: Option<String>,

    /// Follow every page to the end instead of printing one.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct RecordListArgs {
    #[command(flatten)]
    pub list: ListArgs,

    /// Only the records of one principal of a coord-http layer scoped with `.scope(..)` or
    /// `.scope_header(..)`: the principal's raw value (what the scope function returned, or
    /// the header's value), digested as the layer digests it. The value is never printed;
    /// the listing shows its digest. A page may then hold fewer records than --limit (use
    /// --all to see them all).
    #[arg(long, value_name = "VALUE", requires = "operation")]
    pub scope: Option<String>,
}

#[derive(Debug, Args)]
pub struct Destructive {
    /// The key, as coord prints it (`operation:parts`).
    pub key: String,

    /// Do it without asking (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,

    /// Who asks, for coord's log line (default: the user name, from USER or LOGNAME).
    #[arg(long, value_name = "WHO")]
    pub by: Option<String>,
}

/// `250ms`, `2s`, `1m`, `1h`: a whole number and a unit.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("`{text}` has no unit: write e.g. `500ms` or `2s`"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a whole number"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`: use ms, s, m or h"
            ));
        }
    };
    if d.is_zero() {
        return Err("the timeout must be greater than zero".to_owned());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "2", "s", "0s", "2 days", "1.5s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
