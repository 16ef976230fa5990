//! [`PostgresProvider`]: coord's provider contract over PostgreSQL.
//!
//! This file holds the provider, its builder and connecting, and the one way a statement is
//! sent ([`Inner::query`]); `locks`, `records`, `cache`, `flights`, `operations` and the
//! optional capabilities (`semaphores`, `rw_locks`) implement the contract's traits, the
//! crate's `waiters` module serves the waits.

mod cache;
mod counted_leases;
mod flights;
mod locks;
mod multi_locks;
mod operations;
mod records;
mod rw_locks;
mod semaphores;

pub(crate) use rw_locks::RwStatements;
pub(crate) use semaphores::SemaphoreStatements;

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::BackendErrorKind;
use coord_core::{BackendError, CallKey};
use deadpool_postgres::Pool;
use tokio_postgres::Row;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::{FromSql, ToSql};

use crate::connection::{
    Connections, Drivers, Link, MAX_MILLIS, Settings, Tls, describe, parse_url, pool_error,
};
use crate::errors::backend_error;
use crate::schema::{self, DEFAULT_SCHEMA, MigrationReport, SchemaError};
use crate::sql::{Slots, Sql, Statements};
use crate::sweeper;
#[cfg(feature = "tls")]
use crate::tls::TlsSettings;
use crate::waiters::{Hub, ListenerSettings};

/// The environment variable [`PostgresProvider::from_env`] reads.
pub const URL_ENV: &str = "COORD_POSTGRES_URL";

/// The longest command timeout a provider uses.
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most pooled connections a provider opens.
const MAX_POOL_SIZE: usize = 1024;

/// How many pooled connections a provider opens at most unless
/// [`PostgresProviderBuilder::pool_size`] says otherwise.
pub const DEFAULT_POOL_SIZE: usize = 8;

/// How often a provider's sweeper runs unless [`PostgresProviderBuilder::sweep_interval`]
/// says otherwise.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// The longest call key coord stores: PostgreSQL's btree index refuses entries of about 2.7 kB
/// and more, so longer keys are refused (kind `Config`) before they reach the server.
pub const MAX_KEY_BYTES: usize = 2048;

/// Coordination through PostgreSQL: lease-row locks with fencing tokens and LISTEN/NOTIFY
/// hand-off, idempotency records, a shared cache and cluster flights, and the optional
/// capabilities: semaphores, read-write locks, and multi-key locks taken in one statement.
/// Implements every trait of coord's provider contract; give it to
/// `Coordinator::builder().provider(..)`.
///
/// See the crate documentation for what it promises under each fault. Cheap to clone: clones
/// share the pool, the listening connection and the sweeper. The connections it makes (and
/// the listener and the sweeper) run on a thread of the provider's own, for as long as the
/// provider lives, so it serves calls on any tokio runtime, and a runtime that is blocked or
/// dropped stalls or breaks none of the calls made on others. (The connections of an
/// application's pool, [`PostgresProvider::from_pool`], run where that pool puts them.)
#[derive(Clone)]
pub struct PostgresProvider {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) link: Arc<Link>,
    pub(crate) sql: Statements,
    /// The notification channel (one per schema).
    pub(crate) channel: String,
    pub(crate) schema: String,
    pub(crate) timeout: Duration,
    /// `host:port/database`, never a password.
    pub(crate) address: String,
    pub(crate) hub: Hub,
    /// An estimate of the server's clock, to give claims a not-after time in it.
    pub(crate) clock: ServerClock,
    pub(crate) semaphores: SemaphoreStatements,
    pub(crate) rw: RwStatements,
    /// `lock_acquire_all` (migration 3): a multi-key lock in one statement.
    pub(crate) lock_acquire_all: Sql,
}

impl std::fmt::Debug for PostgresProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresProvider")
            .field("address", &self.inner.address)
            .field("schema", &self.inner.schema)
            .field("command_timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// The server's clock as seen from here: its reading at one local monotonic instant, moved on
/// by this host's monotonic clock. Half a round trip of error is covered by the grace added to
/// every not-after time; a larger one (the server's clock was stepped) is corrected by
/// measuring again when a claim comes back refused as late although it was answered in time.
pub(crate) struct ServerClock {
    at: std::sync::Mutex<(Instant, i64)>,
}

impl ServerClock {
    fn new(at: Instant, server_ms: i64) -> ServerClock {
        ServerClock {
            at: std::sync::Mutex::new((at, server_ms)),
        }
    }

    /// The server's clock now, in ms since the Unix epoch, as estimated here.
    pub(crate) fn now_ms(&self) -> i64 {
        let (at, server_ms) = *self.at.lock().unwrap_or_else(|e| e.into_inner());
        server_ms.saturating_add(at.elapsed().as_millis().min(i64::MAX as u128) as i64)
    }

    pub(crate) fn set(&self, at: Instant, server_ms: i64) {
        *self.at.lock().unwrap_or_else(|e| e.into_inner()) = (at, server_ms);
    }
}

/// Why a provider could not be connected or the schema migrated.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ConnectError {
    /// coord's tables are missing, older or newer than this crate: the message says what to
    /// run.
    Schema(SchemaError),
    /// The server could not be reached, refused the credentials, or the settings are wrong.
    Backend(BackendError),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Schema(err) => err.fmt(f),
            ConnectError::Backend(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConnectError::Schema(err) => Some(err),
            ConnectError::Backend(err) => Some(err),
        }
    }
}

impl From<BackendError> for ConnectError {
    fn from(err: BackendError) -> Self {
        ConnectError::Backend(err)
    }
}

/// A schema mismatch is a configuration error (kind `Config`) with the same message.
impl From<ConnectError> for BackendError {
    fn from(err: ConnectError) -> Self {
        match err {
            ConnectError::Schema(err) => {
                BackendError::new(BackendErrorKind::Config, err.to_string())
            }
            ConnectError::Backend(err) => err,
        }
    }
}

fn config_error(message: impl Into<String>) -> BackendError {
    BackendError::new(BackendErrorKind::Config, message)
}

/// Where the provider's connections come from.
#[derive(Clone)]
enum Source {
    /// A URL (or key=value connection string): coord makes its own pool.
    Url(String),
    /// The application's pool, and the URL the listening connection uses.
    Pool { pool: Pool, listener_url: String },
}

/// Builds a [`PostgresProvider`] (or migrates the schema) with explicit options.
///
/// Start from [`PostgresProvider::builder`] (a URL) or [`PostgresProvider::from_pool`] (an
/// application's own `deadpool_postgres::Pool`).
#[must_use]
#[derive(Clone)]
pub struct PostgresProviderBuilder {
    source: Source,
    schema: String,
    command_timeout: Duration,
    pool_size: usize,
    application_name: Option<String>,
    sweep_interval: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: TlsSettings,
}

impl std::fmt::Debug for PostgresProviderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresProviderBuilder")
            .field("schema", &self.schema)
            .field("command_timeout", &self.command_timeout)
            .field("pool_size", &self.pool_size)
            .field("application_name", &self.application_name)
            .field("sweep_interval", &self.sweep_interval)
            .finish_non_exhaustive()
    }
}

impl PostgresProviderBuilder {
    fn new(source: Source) -> PostgresProviderBuilder {
        PostgresProviderBuilder {
            source,
            schema: DEFAULT_SCHEMA.to_owned(),
            command_timeout: Duration::from_secs(1),
            pool_size: DEFAULT_POOL_SIZE,
            application_name: None,
            sweep_interval: Some(DEFAULT_SWEEP_INTERVAL),
            #[cfg(feature = "tls")]
            tls: TlsSettings::default(),
        }
    }

    /// The schema holding coord's tables. Default: `coord`. 1 to 63 lowercase ASCII letters,
    /// digits and `_`, starting with a letter or `_`, not `pg_`-prefixed; another name is
    /// refused by `connect` (kind `Config`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The bound on every statement: getting a pooled connection, preparing, running and
    /// reading the answer, measured here; and the connections coord opens set
    /// `statement_timeout` to it, so the server cancels what runs longer. Default: one
    /// second. Zero is refused by `connect`; anything above one hour is taken as one hour.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout.min(MAX_COMMAND_TIMEOUT);
        self
    }

    /// How many pooled connections coord opens at most (the listening connection comes on
    /// top). Default: 8. Zero and more than 1024 are refused by `connect`. Does not apply to
    /// [`PostgresProvider::from_pool`] (the pool is the application's).
    pub fn pool_size(mut self, connections: usize) -> Self {
        self.pool_size = connections;
        self
    }

    /// The `application_name` of coord's connections (what `pg_stat_activity` shows), unless
    /// the URL sets one. Default: `coord`; the listening connection adds `-listener`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = Some(name.into());
        self
    }

    /// How often the sweeper deletes rows past their expiry (in batches of 500, skipping
    /// rows other sessions hold), jittered by up to a quarter; `None` turns it off (then an
    /// expired row stays until the same key is written again or someone else sweeps). Default:
    /// every 60 s. An expired row is absent to every call whether or not it was swept.
    pub fn sweep_interval(mut self, interval: Option<Duration>) -> Self {
        self.sweep_interval = interval.filter(|d| !d.is_zero());
        self
    }

    /// Trust only the CA certificates in this PEM file for TLS, instead of the system's store.
    /// Read by `connect`; a missing file, or one without a certificate, fails it with kind
    /// `Config`. TLS is used as the URL's `sslmode` says (`prefer`, the default, uses it when
    /// the server offers it; `require` insists); certificates and host names are always
    /// verified.
    #[cfg(feature = "tls")]
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca_file = Some(path.into());
        self
    }

    /// Present this client certificate (PEM, with any intermediates) and private key (PEM) on
    /// TLS connections, for servers that authenticate clients by certificate.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.client_cert = Some((cert.into(), key.into()));
        self
    }

    fn validate(&self) -> Result<(), BackendError> {
        if self.command_timeout.is_zero() {
            return Err(config_error(
                "the command timeout must be greater than zero",
            ));
        }
        if self.pool_size == 0 || self.pool_size > MAX_POOL_SIZE {
            return Err(config_error(format!(
                "the pool size must be between 1 and {MAX_POOL_SIZE} (got {})",
                self.pool_size
            )));
        }
        if !schema::valid_schema_name(&self.schema) {
            return Err(config_error(format!(
                "{:?} is not a schema name coord uses: 1 to 63 lowercase ASCII letters, digits \
                 and `_`, starting with a letter or `_`, not starting with `pg_`",
                self.schema
            )));
        }
        Ok(())
    }

    /// The connection settings for `url` as tokio-postgres reads them, with coord's defaults
    /// (application name, connect timeout, keepalives) where the URL sets none.
    fn settings(&self, url: &str, purpose: Purpose) -> Result<Settings, BackendError> {
        let mut config = parse_url(url)?;
        let name = self.application_name.as_deref().unwrap_or("coord");
        match (config.get_application_name(), purpose) {
            (None, Purpose::Pool) => {
                config.application_name(name);
            }
            (None, Purpose::Listener) => {
                config.application_name(format!("{name}-listener"));
            }
            (Some(own), Purpose::Listener) => {
                let own = format!("{own}-listener");
                config.application_name(own);
            }
            (Some(_), Purpose::Pool) => {}
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.command_timeout);
        }
        config.keepalives(true);
        if purpose == Purpose::Pool {
            // The server cancels a statement that runs past the command timeout (the client
            // stops waiting then too); an idle transaction never holds rows.
            let ms = self.command_timeout.as_millis().max(1);
            let ours = format!(
                "-c statement_timeout={ms} -c idle_in_transaction_session_timeout={}",
                ms.saturating_mul(10)
            );
            let options = match config.get_options() {
                Some(theirs) if !theirs.trim().is_empty() => format!("{theirs} {ours}"),
                _ => ours,
            };
            config.options(options);
        }
        let tls = self.tls_for(config.get_ssl_mode())?;
        Ok(Settings {
            address: describe(&config),
            config,
            tls,
        })
    }

    #[cfg(feature = "tls")]
    fn tls_for(&self, mode: SslMode) -> Result<Tls, BackendError> {
        match mode {
            SslMode::Disable => Ok(Tls::None),
            _ => Ok(Tls::Rustls(crate::tls::connector(&self.tls)?)),
        }
    }

    #[cfg(not(feature = "tls"))]
    fn tls_for(&self, mode: SslMode) -> Result<Tls, BackendError> {
        match mode {
            SslMode::Require => Err(config_error(
                "sslmode=require, but coord-postgres was built without its `tls` feature",
            )),
            _ => Ok(Tls::None),
        }
    }

    /// Applies every migration the schema lacks (creating the schema and its tables on first
    /// use), over one connection made from the builder's settings, and says what it did. Two
    /// migrators at once run one after the other. Refuses a schema newer than this crate knows.
    ///
    /// Needs a role that may create the schema (or tables in it); the provider itself then
    /// needs only `SELECT`, `INSERT`, `UPDATE`, `DELETE` on the tables, `USAGE` on the
    /// sequence and `EXECUTE` on the functions (PostgreSQL grants that to everyone unless
    /// revoked). What each version changes is listed in the crate's CHANGELOG.
    pub async fn migrate(self) -> Result<MigrationReport, ConnectError> {
        self.validate()?;
        let url = match &self.source {
            Source::Url(url) => url.clone(),
            Source::Pool { listener_url, .. } => listener_url.clone(),
        };
        let settings = self.settings(&url, Purpose::Listener)?;
        let what = "migrating coord's schema";
        let work = async {
            let mut client = settings
                .connect_one()
                .await
                .map_err(|e| backend_error(&e, what, &settings.address))?;
            schema::migrate(&mut client, &self.schema)
                .await
                .map_err(|e| backend_error(&e, what, &settings.address))
        };
        // DDL may wait for locks held by running statements: allow it a minute.
        let limit = self.command_timeout.max(Duration::from_secs(60));
        match tokio::time::timeout(limit, work).await {
            Ok(Ok(Ok(report))) => Ok(report),
            Ok(Ok(Err(schema))) => Err(ConnectError::Schema(schema)),
            Ok(Err(err)) => Err(ConnectError::Backend(err)),
            Err(_) => Err(ConnectError::Backend(BackendError::new(
                BackendErrorKind::Timeout,
                format!("{what} at {}: not done within {limit:?}", settings.address),
            ))),
        }
    }

    /// Reads what an operator's check judges (`coord check`): the server's version, whether
    /// it is a standby, `fsync`, `full_page_writes`, `synchronous_commit`, synchronous
    /// standbys, the version of coord's tables, rows expired for longer than `expired_for`
    /// (the sweeper should have deleted them), connection headroom and the server's clock
    /// against this host's. Over one connection of its own made from the builder's settings;
    /// changes nothing, and works whatever version coord's tables are at (or without them).
    /// Bounded by three command timeouts; an unreachable server or refused credentials are
    /// an error, as for `connect`.
    pub async fn server_report(
        self,
        expired_for: Duration,
    ) -> Result<crate::ServerReport, BackendError> {
        self.validate()?;
        let url = match &self.source {
            Source::Url(url) => url.clone(),
            Source::Pool { listener_url, .. } => listener_url.clone(),
        };
        // The pool's settings: the server cancels a statement that runs past the timeout.
        let settings = self.settings(&url, Purpose::Pool)?;
        let what = "reading the server's report";
        let limit = self.command_timeout.saturating_mul(3);
        let work = async {
            let client = settings
                .connect_one()
                .await
                .map_err(|e| backend_error(&e, what, &settings.address))?;
            crate::server_checks::read(&client, &settings.address, &self.schema, expired_for)
                .await
                .map_err(|e| backend_error(&e, what, &settings.address))
        };
        match tokio::time::timeout(limit, work).await {
            Ok(report) => report,
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!("{what} at {}: no answer within {limit:?}", settings.address),
            )),
        }
    }

    /// Connects: makes the pool (or takes the application's), checks the server (PostgreSQL
    /// 12 or newer) and that coord's tables are at [`SCHEMA_VERSION`](crate::SCHEMA_VERSION),
    /// reads the server's clock, and starts the sweeper. The listening connection is made the
    /// first time a call waits. Bounded by three command timeouts.
    pub async fn connect(self) -> Result<PostgresProvider, ConnectError> {
        self.validate()?;
        let drivers = Drivers::start()?;
        let (pool, listener) = match &self.source {
            Source::Url(url) => {
                let pool_settings = self.settings(url, Purpose::Pool)?;
                let pool = pool_settings.pool(self.pool_size, self.command_timeout, &drivers)?;
                (
                    Connections::Own(pool),
                    self.settings(url, Purpose::Listener)?,
                )
            }
            Source::Pool { pool, listener_url } => (
                Connections::Application(pool.clone()),
                self.settings(listener_url, Purpose::Listener)?,
            ),
        };
        let address = listener.address.clone();
        let timeout = self.command_timeout;
        let q = schema::quoted(&self.schema);
        let mut slots = Slots::default();
        let sql = Statements::new(&q, &mut slots);
        let checking = async {
            let client = pool
                .get()
                .await
                .map_err(|e| pool_error(&e, "connecting", &address, timeout))?;
            let what = "checking the server";
            let version: i32 = client
                .query_one("SELECT current_setting('server_version_num')::int", &[])
                .await
                .map_err(|e| backend_error(&e, what, &address))?
                .get(0);
            if version < crate::server_checks::MIN_POSTGRES_VERSION_NUM as i32 {
                return Err(ConnectError::Backend(config_error(format!(
                    "{what} at {address}: PostgreSQL {version} is too old; coord-postgres needs \
                     12 or newer"
                ))));
            }
            let found = schema::read_version(&*client, &self.schema)
                .await
                .map_err(|e| backend_error(&e, what, &address))?;
            schema::check_version(&self.schema, found).map_err(ConnectError::Schema)?;
            let sent = Instant::now();
            let server_ms: i64 = client
                .query_one(sql.server_time.text(), &[])
                .await
                .map_err(|e| backend_error(&e, what, &address))?
                .get(0);
            Ok::<_, ConnectError>(ServerClock::new(sent + sent.elapsed() / 2, server_ms))
        };
        let clock = match tokio::time::timeout(timeout.saturating_mul(3), checking).await {
            Ok(clock) => clock?,
            Err(_) => {
                return Err(ConnectError::Backend(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!(
                        "connecting to PostgreSQL at {address}: no answer within {:?}",
                        timeout.saturating_mul(3)
                    ),
                )));
            }
        };
        let channel = channel_name(&self.schema);
        let semaphores = SemaphoreStatements::new(&q, &mut slots);
        let rw = RwStatements::new(&q, &mut slots);
        let lock_acquire_all = slots.sql(multi_locks::statement(&q));
        let mut sweeps = sql.sweep.to_vec();
        sweeps.extend(semaphores.sweep.iter().cloned());
        sweeps.extend(rw.sweep.iter().cloned());
        let link = Arc::new(Link {
            connections: pool,
            timeout,
            address: address.clone(),
            drivers: drivers.clone(),
            drains: Arc::default(),
        });
        let inner = Arc::new(Inner {
            link: link.clone(),
            sql,
            hub: Hub::new(
                ListenerSettings {
                    settings: listener,
                    channel: channel.clone(),
                    drivers: drivers.clone(),
                },
                timeout,
            ),
            channel,
            schema: self.schema.clone(),
            timeout,
            address,
            clock,
            semaphores,
            rw,
            lock_acquire_all,
        });
        if let Some(every) = self.sweep_interval {
            sweeper::start(&drivers, Arc::downgrade(&link), sweeps, every);
        }
        Ok(PostgresProvider { inner })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Pool,
    Listener,
}

/// The notification channel of `schema`: short, a valid identifier, distinct per schema.
pub(crate) fn channel_name(schema: &str) -> String {
    format!("coord_{:016x}", fnv1a(&[b"channel", schema.as_bytes()]))
}

/// FNV-1a over `parts` (each followed by a 0 byte): a stable hash for notification payloads,
/// the same in every process and version. A collision only wakes a waiter for nothing.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(std::iter::once(&0)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// What a notification about `key`'s `kind` (lock, record, flight) carries: a hash of the
/// key, never the key.
pub(crate) fn wake_payload(kind: &str, key: &CallKey) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let hash = fnv1a(&[kind.as_bytes(), key.qualified().as_bytes()]);
    // Written digit by digit rather than through `format!`: a release sends one per call.
    let mut payload = String::with_capacity(17);
    payload.push_str(&kind[..1]);
    for shift in (0..16).rev() {
        payload.push(char::from(HEX[((hash >> (shift * 4)) & 0xf) as usize]));
    }
    payload
}

impl Inner {
    /// Runs one statement (prepared once per connection) and returns its rows. Everything,
    /// from taking a pooled connection to reading the last row, is bounded by the command
    /// timeout; after a timeout, a cancellation or a broken connection, that connection is
    /// closed rather than reused.
    pub(crate) async fn query(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
        what: &str,
        key: &CallKey,
    ) -> Result<Vec<Row>, BackendError> {
        check_key(key, what)?;
        self.query_any(sql, params, what)
            .await
            .map_err(|e| e.with_key(key))
    }

    /// [`Inner::query`] for statements about no key (listings, the clock).
    pub(crate) async fn query_any(
        &self,
        sql: &Sql,
        params: &[&(dyn ToSql + Sync)],
        what: &str,
    ) -> Result<Vec<Row>, BackendError> {
        self.link.query(sql, params, what).await
    }

    /// A column of a row, or a `Protocol` error naming the statement.
    pub(crate) fn get<'r, T: FromSql<'r>>(
        &self,
        row: &'r Row,
        index: usize,
        what: &str,
        key: &CallKey,
    ) -> Result<T, BackendError> {
        row.try_get(index).map_err(|e| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("{what} at {}: unexpected answer ({e})", self.address),
            )
            .with_key(key)
        })
    }

    /// The one row a statement returns, or a `Protocol` error.
    pub(crate) fn one<'r>(
        &self,
        rows: &'r [Row],
        what: &str,
        key: &CallKey,
    ) -> Result<&'r Row, BackendError> {
        match rows {
            [row] => Ok(row),
            _ => Err(self.protocol(what, key, &format!("{} rows instead of one", rows.len()))),
        }
    }

    pub(crate) fn protocol(&self, what: &str, key: &CallKey, detail: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!("{what} at {}: {detail}", self.address),
        )
        .with_key(key)
    }

    /// A statement that kept finding a row change under it (it is sent again each time).
    pub(crate) fn contended(&self, what: &str, key: &CallKey) -> BackendError {
        BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "{what} at {}: the key's row changed under every attempt; try again",
                self.address
            ),
        )
        .with_key(key)
    }

    /// Reads the server's clock again (after a claim or cache write came back refused as late
    /// although it was answered in time: the server's clock was stepped).
    pub(crate) async fn remeasure_clock(&self) -> Result<(), BackendError> {
        let sent = Instant::now();
        let rows = self
            .query_any(&self.sql.server_time, &[], "reading the server's clock")
            .await?;
        let server_ms: i64 = rows
            .first()
            .and_then(|row| row.try_get(0).ok())
            .ok_or_else(|| {
                BackendError::new(
                    BackendErrorKind::Protocol,
                    "reading the server's clock: unexpected answer",
                )
            })?;
        self.clock.set(sent + sent.elapsed() / 2, server_ms);
        Ok(())
    }
}

/// Refuses (kind `Config`) a key longer than [`MAX_KEY_BYTES`] before it reaches the server.
pub(crate) fn check_key(key: &CallKey, what: &str) -> Result<(), BackendError> {
    if key.qualified().len() > MAX_KEY_BYTES {
        return Err(config_error(format!(
            "{what}: the key is {} bytes long; coord-postgres stores keys of at most \
             {MAX_KEY_BYTES} bytes (PostgreSQL's index limit)",
            key.qualified().len()
        ))
        .with_key(key));
    }
    Ok(())
}

/// Whole milliseconds, rounded up (zero and sub-millisecond durations become one), capped at
/// [`MAX_MILLIS`].
pub(crate) fn millis(d: Duration) -> i64 {
    let ms = d.as_micros().div_ceil(1000);
    ms.clamp(1, u128::from(MAX_MILLIS)) as i64
}

/// An owner token as the `uuid` column stores it.
pub(crate) fn uuid_of(owner: coord_core::provider::OwnerToken) -> uuid::Uuid {
    uuid::Uuid::from_u128(owner.as_u128())
}

/// The owner token a `uuid` column holds.
pub(crate) fn owner_of(uuid: uuid::Uuid) -> coord_core::provider::OwnerToken {
    coord_core::provider::OwnerToken::from_u128(uuid.as_u128())
}

/// A duration from milliseconds the server computed (negative: zero).
pub(crate) fn from_ms(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

impl PostgresProvider {
    /// Connects to the server at `url` with the default options (schema `coord`, one second
    /// command timeout, 8 pooled connections). `url` is anything tokio-postgres reads:
    /// `postgres://` or `postgresql://` URLs (`?host=/path/to/socket/dir` for a Unix socket,
    /// `?sslmode=disable|prefer|require`) or the `key=value` form.
    pub async fn connect(url: &str) -> Result<PostgresProvider, ConnectError> {
        PostgresProvider::builder(url).connect().await
    }

    /// Connects to the server named by `COORD_POSTGRES_URL`, with the default options. A
    /// missing variable is a `Config` error.
    pub async fn from_env() -> Result<PostgresProvider, ConnectError> {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => PostgresProvider::connect(url.trim()).await,
            _ => Err(ConnectError::Backend(config_error(format!(
                "{URL_ENV} is not set: set it to the PostgreSQL URL, e.g. \
                 postgres://coord@127.0.0.1:5432/app"
            )))),
        }
    }

    /// A builder for the server at `url` (any form [`PostgresProvider::connect`] takes).
    pub fn builder(url: impl Into<String>) -> PostgresProviderBuilder {
        PostgresProviderBuilder::new(Source::Url(url.into()))
    }

    /// A builder that sends coord's statements on connections of an application's own
    /// `deadpool_postgres::Pool`, and listens for wake-ups on one connection of its own made
    /// from `listener_url` (a listening connection is held for the provider's life and must
    /// be a session of its own: through PgBouncer, give a URL that bypasses transaction
    /// pooling).
    ///
    /// What differs from a provider that owns its pool: the pool's connections keep the
    /// application's settings, so `statement_timeout` is not set on them (coord's own timeout
    /// still bounds every statement here, and a connection whose statement timed out is
    /// taken out of the pool and closed); `pool_size` and `application_name` apply to the
    /// listening connection only.
    pub fn from_pool(pool: Pool, listener_url: impl Into<String>) -> PostgresProviderBuilder {
        PostgresProviderBuilder::new(Source::Pool {
            pool,
            listener_url: listener_url.into(),
        })
    }

    /// Applies the migrations the default schema (`coord`) at `url` lacks; see
    /// [`PostgresProviderBuilder::migrate`] (to name another schema, start from
    /// [`PostgresProvider::builder`]).
    pub async fn migrate(url: &str) -> Result<MigrationReport, ConnectError> {
        PostgresProvider::builder(url).migrate().await
    }

    /// Where this provider connects (`host:port/database`), without credentials.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The schema holding coord's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The bound on every statement.
    pub fn command_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The completion statement for a transaction of the application's, with its channel and
    /// the notification payload for `key`.
    pub(crate) fn transactional_completion(&self, key: &CallKey) -> (&str, &str, String) {
        (
            self.inner.sql.record_complete_in_transaction.text(),
            &self.inner.channel,
            wake_payload("record", key),
        )
    }

    /// The notification channel waiters listen on (one per schema; payloads are hashes of
    /// keys).
    pub fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// How many times the listening connection has been (re)established: 0 until a call first
    /// waits, then 1, plus one per reconnection after it dropped.
    pub fn listener_connections(&self) -> u64 {
        self.inner.hub.connections()
    }

    /// Deletes rows past their expiry now, as the sweeper does (at most `batch` rows per
    /// table), and returns how many it deleted.
    pub async fn sweep(&self, batch: usize) -> Result<u64, BackendError> {
        let own = sweeper::sweep_once(&self.inner.link, &self.inner.sql.sweep, batch).await?;
        let semaphores =
            sweeper::sweep_once(&self.inner.link, &self.inner.semaphores.sweep, batch).await?;
        let rw = sweeper::sweep_once(&self.inner.link, &self.inner.rw.sweep, batch).await?;
        Ok(own + semaphores + rw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement parses, plans and type-checks against the tables the migrations make
    /// (and uses a parameter type per placeholder the provider binds).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_statement_prepares_against_the_migrated_schema() {
        let server = tokio::task::spawn_blocking(coord_postgres_testing::PostgresServer::start)
            .await
            .unwrap();
        let (mut client, connection) =
            tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        schema::migrate(&mut client, "prep").await.unwrap().unwrap();
        let slots = &mut Slots::default();
        let statements = Statements::new(&schema::quoted("prep"), slots);
        let semaphores = SemaphoreStatements::new(&schema::quoted("prep"), slots);
        let rw = RwStatements::new(&schema::quoted("prep"), slots);
        let multi = multi_locks::statement(&schema::quoted("prep"));
        for text in statements
            .all()
            .into_iter()
            .chain(semaphores.all())
            .chain(rw.all())
            .chain([multi.as_str()])
        {
            if let Err(err) = client.prepare(text).await {
                panic!("{err:?}\n{text}");
            }
        }
    }

    /// What only reads is sent as statements PostgreSQL runs in a `READ ONLY` transaction
    /// (which refuses any write, and a data-modifying CTE even when it would change no row):
    /// the replay's read, the waiter's look, a cache read, a follower's look and the
    /// operator's reads. The waiter's marking probe, which writes, is refused there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_run_in_a_read_only_transaction() {
        let server = tokio::task::spawn_blocking(coord_postgres_testing::PostgresServer::start)
            .await
            .unwrap();
        let (mut client, connection) =
            tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        schema::migrate(&mut client, "ro").await.unwrap().unwrap();
        let sql = Statements::new(&schema::quoted("ro"), &mut Slots::default());
        let key = "ns:op:1";
        let owner = uuid::Uuid::nil();
        let page: i64 = 10;
        let read_only = async |text: &str, params: &[&(dyn ToSql + Sync)]| {
            client.batch_execute("BEGIN READ ONLY").await.unwrap();
            let outcome = client.query(text, params).await;
            client.batch_execute("ROLLBACK").await.unwrap();
            outcome.map(|_| ())
        };
        let reads: [(&str, &[&(dyn ToSql + Sync)]); 9] = [
            (sql.record_read.text(), &[&key]),
            (sql.record_peek.text(), &[&key]),
            (sql.record_inspect.text(), &[&key]),
            (sql.lock_inspect.text(), &[&key]),
            (sql.cache_get.text(), &[&key]),
            (sql.flight_peek.text(), &[&key, &owner]),
            (sql.lock_list.text(), &[&"ns:op", &"", &page]),
            (sql.record_list.text(), &[&"ns:op", &"", &page]),
            (sql.server_time.text(), &[]),
        ];
        for (text, params) in reads {
            if let Err(err) = read_only(text, params).await {
                panic!("a read refused in a read-only transaction: {err:?}\n{text}");
            }
        }
        let refused = read_only(sql.record_probe.text(), &[&key]).await;
        assert!(
            refused.is_err(),
            "the marking probe writes, so it is refused"
        );
    }

    #[test]
    fn millis_round_up_and_clamp() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1001)), 2);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS as i64);
    }

    #[test]
    fn payloads_are_short_and_differ_by_key_and_kind() {
        let a = CallKey::builder("ns", "op").part("a").finish();
        let b = CallKey::builder("ns", "op").part("b").finish();
        assert_eq!(wake_payload("lock", &a).len(), 17);
        assert_ne!(wake_payload("lock", &a), wake_payload("lock", &b));
        assert_ne!(wake_payload("lock", &a), wake_payload("record", &a));
        assert_eq!(wake_payload("lock", &a), wake_payload("lock", &a.clone()));
        // The form every version sends (processes of two versions wake each other): the
        // kind's initial, then the hash in 16 lower-case hex digits.
        for (kind, key) in [("lock", &a), ("record", &b), ("flight", &a)] {
            let hash = fnv1a(&[kind.as_bytes(), key.qualified().as_bytes()]);
            assert_eq!(
                wake_payload(kind, key),
                format!("{}{hash:016x}", &kind[..1])
            );
        }
        let channel = channel_name("coord");
        assert!(channel.len() < 63 && channel.starts_with("coord_"));
        assert_ne!(channel, channel_name("other"));
    }

    #[test]
    fn urls_are_read_by_tokio_postgres_without_their_passwords_in_the_address() {
        let config =
            parse_url("postgres://u:secret@db.internal:6543/app?sslmode=verify-full").unwrap();
        assert_eq!(config.get_ssl_mode(), SslMode::Require);
        let address = describe(&config);
        assert_eq!(address, "db.internal:6543/app");
        let unix = parse_url("postgresql:///app?host=/run/postgresql&port=5433").unwrap();
        assert_eq!(describe(&unix), "unix:/run/postgresql:5433/app");
        let kv = parse_url("host=10.0.0.5 dbname=x user=y password=z sslmode=disable").unwrap();
        assert_eq!(describe(&kv), "10.0.0.5:5432/x");
        assert_eq!(kv.get_ssl_mode(), SslMode::Disable);
        let err = parse_url("postgres://h/db?sslmode=sometimes").unwrap_err();
        assert_eq!(err.kind(), BackendErrorKind::Config);
        assert!(parse_url("mysql://h/db").is_err());
    }
}
