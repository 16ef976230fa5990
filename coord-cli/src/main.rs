//! `coord`: the operator's command-line tool for coord over Redis or PostgreSQL.
//!
//! See `coord --help` (and the README's "Operating coord") for the commands, their output and
//! the exit codes.

mod args;
mod check;
mod check_postgres;
mod migrate;
mod ops;
mod render;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use coord_core::provider::BackendErrorKind;
use coord_core::{BackendError, Coordinator};
use coord_postgres::PostgresProvider;
use coord_redis::RedisProvider;

use args::{Cli, Command, Connection};

/// Why a command stopped, and the exit code it maps to.
#[derive(Debug)]
pub struct Failure {
    pub code: Exit,
    pub kind: &'static str,
    pub message: String,
}

/// The exit codes (listed in `--help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Done = 0,
    CheckFailed = 1,
    Usage = 2,
    Backend = 3,
    Corrupt = 4,
    NotConfirmed = 5,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: Exit::Usage,
            kind: "usage",
            message: message.into(),
        }
    }

    pub fn not_confirmed(message: impl Into<String>) -> Failure {
        Failure {
            code: Exit::NotConfirmed,
            kind: "not_confirmed",
            message: message.into(),
        }
    }
}

impl From<BackendError> for Failure {
    fn from(err: BackendError) -> Failure {
        let (code, kind) = match err.kind() {
            BackendErrorKind::Corrupt => (Exit::Corrupt, "corrupt"),
            BackendErrorKind::Config => (Exit::Usage, "config"),
            BackendErrorKind::Timeout => (Exit::Backend, "timeout"),
            BackendErrorKind::Unavailable => (Exit::Backend, "unavailable"),
            BackendErrorKind::OutOfMemory => (Exit::Backend, "out_of_memory"),
            _ => (Exit::Backend, "protocol"),
        };
        Failure {
            code,
            kind,
            message: err.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(Exit::Backend as u8);
        }
    };
    let json = cli.json;
    let outcome = runtime.block_on(run(cli));
    match outcome {
        Ok(code) => ExitCode::from(code as u8),
        Err(failure) => {
            if json {
                let doc = serde_json::json!({
                    "error": {
                        "code": failure.code as u8,
                        "kind": failure.kind,
                        "message": failure.message,
                    }
                });
                println!("{doc:#}");
            }
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code as u8)
        }
    }
}

/// Log lines go to stderr: warnings of coord itself (a forced release or a purge is logged
/// with who asked), errors of the Redis provider. `COORD_LOG` (or `RUST_LOG`) overrides it.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("COORD_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|spec| EnvFilter::try_new(spec).ok())
        .unwrap_or_else(|| EnvFilter::new("warn,coord_redis=error,coord_postgres=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

async fn run(cli: Cli) -> Result<Exit, Failure> {
    let Cli {
        connection,
        json,
        command,
    } = cli;
    match command {
        Command::Migrate => migrate::run(&connection, json).await,
        Command::Check {
            replica_acks,
            pool_size,
            sweep_interval,
        } => match postgres_url(&connection) {
            Some(url) => {
                if redis_url_given(&connection) {
                    return Err(both_urls());
                }
                if replica_acks.is_some() {
                    return Err(Failure::usage(
                        "--replica-acks is for Redis; a PostgreSQL check judges \
                         `synchronous_standby_names` instead",
                    ));
                }
                let options = check_postgres::Options {
                    pool_size: pool_size.map(|n| n as usize),
                    sweep_interval,
                };
                check_postgres::run(&connection, url, json, options).await
            }
            None => {
                if pool_size.is_some() || sweep_interval.is_some() {
                    return Err(Failure::usage(
                        "--pool-size and --sweep-interval are for PostgreSQL (--postgres-url)",
                    ));
                }
                check::run(&connection, json, replica_acks).await
            }
        },
        Command::Locks(cmd) => {
            let coordinator = coordinator(&connection).await?;
            ops::locks(&coordinator, cmd, json).await
        }
        Command::Records(cmd) => {
            let coordinator = coordinator(&connection).await?;
            ops::records(&coordinator, cmd, json).await
        }
    }
}

/// The provider the connection options describe. Connects even to a server whose eviction
/// policy coord would refuse: an operator's tool must work there too (`coord check` says what
/// is wrong with it).
pub async fn connect(connection: &Connection) -> Result<RedisProvider, Failure> {
    let url = connection
        .url
        .as_deref()
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .ok_or_else(|| {
            Failure::usage(
                "no Redis to connect to: COORD_REDIS_URL is not set and --url was not given; \
                 set COORD_REDIS_URL as the application has it, or pass --url redis://host:port",
            )
        })?;
    let urls: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let builder = if connection.cluster {
        RedisProvider::cluster(urls)
    } else if let Some(master) = &connection.sentinel {
        RedisProvider::sentinel(master.as_str(), urls)
    } else {
        let [one] = urls.as_slice() else {
            return Err(Failure::usage(
                "several URLs given: pass --cluster (seed nodes) or --sentinel MASTER (Sentinels)",
            ));
        };
        RedisProvider::builder(*one)
    };
    let mut builder = builder;
    if let Some(ca) = &connection.tls_ca {
        builder = builder.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&connection.tls_cert, &connection.tls_key) {
        builder = builder.tls_client_cert_files(cert, key);
    }
    let provider = builder
        .client(connection.client.into())
        .command_timeout(connection.timeout)
        .allow_eviction(true)
        .connect()
        .await?;
    Ok(provider)
}

/// The PostgreSQL URL given, if any.
pub fn postgres_url(connection: &Connection) -> Option<&str> {
    connection
        .postgres_url
        .as_deref()
        .map(str::trim)
        .filter(|url| !url.is_empty())
}

/// A PostgreSQL provider builder from the connection options.
pub fn postgres_builder(
    connection: &Connection,
    url: &str,
) -> coord_postgres::PostgresProviderBuilder {
    let mut builder = PostgresProvider::builder(url)
        .command_timeout(connection.timeout)
        .application_name("coord-cli")
        .sweep_interval(None);
    if let Some(schema) = &connection.postgres_schema {
        builder = builder.schema(schema.trim());
    }
    if let Some(ca) = &connection.postgres_ca {
        builder = builder.tls_ca_file(ca);
    }
    builder
}

impl From<coord_postgres::ConnectError> for Failure {
    fn from(err: coord_postgres::ConnectError) -> Failure {
        match err {
            coord_postgres::ConnectError::Schema(err) => Failure {
                code: Exit::Usage,
                kind: "schema",
                message: err.to_string(),
            },
            coord_postgres::ConnectError::Backend(err) => Failure::from(err),
            other => Failure::from(BackendError::from(other)),
        }
    }
}

/// The application's namespace, as the application finds its own when its code names none:
/// `--namespace`, else `--app` (the binary's name, made a namespace as coord-core does it),
/// else `COORD_NAMESPACE`. Explicit options win over the environment, as everywhere in this
/// tool.
fn namespace(connection: &Connection) -> Result<String, Failure> {
    if let Some(ns) = connection.namespace.as_deref().filter(|ns| !ns.is_empty()) {
        return Ok(ns.to_owned());
    }
    if let Some(app) = &connection.app {
        return coord_core::config::namespace_for_binary(app).ok_or_else(|| {
            Failure::usage(format!(
                "--app {app:?} names no binary to take a namespace from: pass the \
                 application's binary name, as in `--app payflow`"
            ))
        });
    }
    match std::env::var("COORD_NAMESPACE") {
        Ok(ns) if !ns.trim().is_empty() => Ok(ns),
        _ => Err(Failure::usage(
            "`coord locks` and `coord records` need the application's namespace, and none was \
             given: pass --app <the application's binary name> (the namespace a coordinator \
             takes when its code names none), or --namespace NS (or COORD_NAMESPACE) if the \
             application sets one",
        )),
    }
}

/// Whether a Redis URL is given (`--url` or `COORD_REDIS_URL`).
fn redis_url_given(connection: &Connection) -> bool {
    connection
        .url
        .as_deref()
        .is_some_and(|u| !u.trim().is_empty())
}

/// Both backends named at once: refused rather than guessed.
fn both_urls() -> Failure {
    Failure::usage(
        "both a Redis URL (--url, COORD_REDIS_URL) and a PostgreSQL URL (--postgres-url, \
         COORD_POSTGRES_URL) are set: give the one the application uses",
    )
}

async fn coordinator(connection: &Connection) -> Result<Coordinator, Failure> {
    let namespace = namespace(connection)?;
    let builder = Coordinator::builder().namespace(namespace);
    let builder = match postgres_url(connection) {
        Some(url) => {
            if redis_url_given(connection) {
                return Err(both_urls());
            }
            builder.provider(postgres_builder(connection, url).connect().await?)
        }
        None => builder.provider(connect(connection).await?),
    };
    builder.build().map_err(|e| Failure::usage(e.to_string()))
}

/// Asks on the terminal before a destructive step, unless `yes`. Without a terminal on stdin
/// there is no one to ask: refused.
pub fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::not_confirmed(format!(
            "{question} Not done: stdin is not a terminal, so nobody can confirm; pass --yes"
        )));
    }
    let mut stderr = std::io::stderr();
    let _ = write!(stderr, "{question} [y/N] ");
    let _ = stderr.flush();
    let mut answer = String::new();
    if stdin.lock().read_line(&mut answer).is_err() {
        return Err(Failure::not_confirmed("no answer; nothing changed"));
    }
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::not_confirmed("not confirmed; nothing changed")),
    }
}

/// Who asks, for coord's log line: `--by`, else the user's name.
pub fn requested_by(by: Option<&str>) -> String {
    if let Some(by) = by.map(str::trim).filter(|b| !b.is_empty()) {
        return by.to_owned();
    }
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.trim().is_empty());
    match user {
        Some(user) => format!("{user} (coord CLI)"),
        None => "coord CLI".to_owned(),
    }
}
