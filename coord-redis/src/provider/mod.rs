//! [`RedisProvider`]: the lock and idempotency contract over Redis.
//!
//! This file holds the provider, its builder and the connection and client selection;
//! `commands` sends commands and scripts and reads faults, `locks` and `records` implement
//! the two halves of the contract, and the crate's `waiters` module serves the waits.

mod cache;
mod commands;
mod locks;
mod records;

use std::sync::Arc;
use std::time::Duration;

use coord_core::{BackendError, BackendErrorKind};

use crate::config::{Client, Endpoint, Options, Topology, scrub};
use crate::server_checks::{self, CheckOptions, ServerWatch};
use crate::transport::{Command, Fault, Reply, Transport};
use crate::waiters::Hub;

/// The environment variable [`RedisProvider::from_env`] reads.
pub const URL_ENV: &str = "COORD_REDIS_URL";

/// The longest a waiter sleeps before checking the lock again when no release message comes
/// (a lost message, or a holder that crashed and lets its lease run out).
const BACKSTOP_CAP: Duration = Duration::from_secs(1);

/// The fencing counter outlives each mint by at least this long.
const FENCE_RETENTION_FLOOR: Duration = Duration::from_secs(3600);

/// The longest lease, retention or keep period sent to Redis: 2^46 ms, about 2230 years.
///
/// Redis refuses a `PX`/`PEXPIRE` whose absolute expiry (`now` in ms plus the value) would
/// pass `i64::MAX`, and any value that is zero or negative. Capping here keeps every sum the
/// scripts form (lease plus keep, `now` plus lease, both as Lua doubles) exact below 2^53 and
/// orders of magnitude inside that limit; a lease that long never ends in practice.
const MAX_MILLIS: u64 = 1 << 46;

/// Coordination through Redis: lease locks with optional fencing tokens and pub/sub
/// hand-off, and idempotency records. Implements [`LockProvider`](coord_core::LockProvider) and [`IdempotencyStore`](coord_core::IdempotencyStore);
/// give it to `Coordinator::builder().provider(..)`.
///
/// # What it promises
/// * **Locks are leases.** A lock is a Redis key holding the owner's token with a `PX` expiry.
///   A holder that crashes blocks others for at most its lease. A lease is not consensus: a
///   holder that stalls past its lease (a pause, a slow network), or an asynchronous Sentinel
///   failover that loses the latest write, can leave two callers believing they hold the same
///   lock. Fenced locks (`fenced = true`) hand out a fencing token that only grows; a resource
///   that refuses writes carrying an older token than the newest it has seen is what makes the
///   section safe.
/// * **Owner-scoped changes.** Release, renewal, completion and abandonment compare the stored
///   owner token first (in one script), so a lapsed holder never frees or overwrites its
///   successor's state.
/// * **Waiting without polling.** A waiter subscribes (one shared subscriber connection per
///   provider), then marks the holder's value as waited for; the release of a marked lock
///   publishes on the channel named like the lock, and one release wakes one waiter (the one
///   in this process that started waiting first). A lock nobody waits for publishes nothing.
///   A backstop at the holder's remaining lease (at most one second, with jitter) covers a
///   lost message or a holder that died.
/// * **Bounded calls.** Every round trip to Redis, including making a connection for it, is
///   bounded by the command timeout (one second unless configured; a script the server has
///   forgotten costs one more round trip to send it again); an unreachable server yields a
///   [`BackendError`] of kind `Timeout` or `Unavailable`, never a hang. A server out of memory
///   under `noeviction` yields kind `OutOfMemory` (retryable once memory is freed).
/// * **Corrupt state is refused.** A value at a coord key that coord did not write (another
///   Redis type, a lock value that is not a token, a fencing counter that is not plain decimal
///   digits, a record with a missing or unknown field) yields kind `Corrupt` naming the call
///   key, and is never turned into a grant, a fencing token or a replay. Purge such a record
///   with [`IdempotencyStore::purge`](coord_core::IdempotencyStore::purge), or delete the key.
/// * **Resends are safe.** A command sent again after its reply was lost answers what the
///   first send answered: a claim finding its own live marker is `Claimed`, a completion
///   finding its own completed record is `Stored`, an acquire finding its own token is granted.
/// * **Idempotency records.** A claim creates the in-flight marker or reads the record in one
///   script; completion keeps the claim's fingerprint and stores the outcome for its
///   retention. When the marker is gone and nobody claimed since, completion creates the
///   completed record in the same script (`StoredWithoutMarker`, with the request's
///   fingerprint); when another owner's marker or record is there, it writes nothing and
///   names that owner (`Superseded`). Completion, abandonment and
///   [`IdempotencyStore::purge`](coord_core::IdempotencyStore::purge) wake `wait_settled` callers at once. A marker claimed with
///   `keep_abandoned_for` stays after its lease as an abandoned record until that period ends
///   or it is purged.
/// * **Loss causes.** Renewing a lock or a marker that another owner now holds answers
///   `Lost(TakenByOther)`; one that is free, lapsed or already completed by its owner answers
///   `Lost(Expired)`.
/// * **Server time.** Leases and retentions are Redis expiries, measured by the server clock.
/// * **Any duration.** Leases, keep periods and retentions are rounded up to whole
///   milliseconds (zero becomes one: Redis refuses a zero expiry) and capped at 2^46 ms
///   (about 2230 years), far inside what Redis accepts. A wait too long to represent as a
///   deadline (`Duration::MAX`) lasts until the lock is granted (or the marker settles) or
///   the future is dropped.
///
/// # Example
/// ```no_run
/// # async fn start() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use coord_redis::RedisProvider;
///
/// let redis = RedisProvider::sentinel("mymaster", ["redis://sentinel-a:26379", "sentinel-b:26379"])
///     .data_node_credentials(None, "s3cret")
///     .command_timeout(Duration::from_millis(300))
///     .connect()
///     .await?;
/// let coordinator = coord_core::Coordinator::builder()
///     .namespace("orders")
///     .provider(redis.clone())
///     .build()?;
/// # let _ = coordinator;
/// # Ok(())
/// # }
/// ```
///
/// # What it does not promise
/// Exclusion across a Sentinel failover or a Cluster resharding that loses writes; ordering
/// between waiters in different processes (they race for the lock, the first retry wins);
/// TLS (not compiled in).
///
/// Cheap to clone: clones share connections, scripts and the subscriber connection. The
/// connections live on the tokio runtime that connected the provider.
#[derive(Clone)]
pub struct RedisProvider {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Arc<dyn Transport>,
    hub: Hub,
    timeout: Duration,
    address: String,
    secrets: Vec<String>,
    client: Client,
    /// Run ids of the nodes, and the restarts seen.
    watch: Arc<ServerWatch>,
    /// An estimate of the server's clock, to give claims a not-after time in it.
    clock: ServerClock,
}

/// The server's clock as seen from here: its `TIME` at one local monotonic instant, moved on by
/// this host's monotonic clock (which never steps). An error of a few ms (half a round trip,
/// drift) is covered by the grace added to every not-after time; a larger one (the server's
/// clock was stepped) is corrected by measuring again when a claim comes back refused as late
/// although this call was still waiting for it.
struct ServerClock {
    at: std::sync::Mutex<(std::time::Instant, i64)>,
}

impl ServerClock {
    fn new(at: std::time::Instant, server_ms: i64) -> ServerClock {
        ServerClock {
            at: std::sync::Mutex::new((at, server_ms)),
        }
    }

    /// The server's clock now, in ms since the Unix epoch, as estimated here.
    fn now_ms(&self) -> i64 {
        let (at, server_ms) = *self.at.lock().unwrap_or_else(|e| e.into_inner());
        server_ms.saturating_add(at.elapsed().as_millis().min(i64::MAX as u128) as i64)
    }

    fn set(&self, at: std::time::Instant, server_ms: i64) {
        *self.at.lock().unwrap_or_else(|e| e.into_inner()) = (at, server_ms);
    }
}

impl std::fmt::Debug for RedisProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisProvider")
            .field("address", &self.inner.address)
            .field("client", &self.inner.client)
            .field("command_timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RedisProvider`] with explicit options.
///
/// Start from [`RedisProvider::builder`] (one server), [`RedisProvider::sentinel`] (a
/// master found through Sentinel) or [`RedisProvider::cluster`] (Redis Cluster).
#[must_use]
#[derive(Clone)]
pub struct RedisProviderBuilder {
    options: Options,
}

impl std::fmt::Debug for RedisProviderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisProviderBuilder")
            .field("address", &self.options.describe())
            .field("client", &self.options.client)
            .field("command_timeout", &self.options.command_timeout)
            .field("pool_size", &self.options.pool_size)
            .finish_non_exhaustive()
    }
}

impl RedisProviderBuilder {
    fn new(topology: Topology) -> RedisProviderBuilder {
        RedisProviderBuilder {
            options: Options {
                topology,
                command_timeout: Duration::from_secs(1),
                pool_size: 1,
                client: Client::default(),
                username: None,
                password: None,
                database: None,
                allow_eviction: false,
            },
        }
    }

    /// The bound on every Redis call (and on each step of connecting). Default: one second.
    /// Zero is refused by `connect`; anything above one hour is taken as one hour (a call that
    /// may hang longer than that is not bounded in any useful sense, and deadline arithmetic
    /// stays far from overflow).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.options.command_timeout = timeout.min(MAX_COMMAND_TIMEOUT);
        self
    }

    /// How many multiplexed connections carry commands (round-robin). Default: one, which
    /// already pipelines concurrent calls; more help only under heavy load. The subscriber
    /// connection comes on top, opened the first time something waits. `connect` refuses zero
    /// and more than 1024.
    pub fn pool_size(mut self, connections: usize) -> Self {
        self.options.pool_size = connections;
        self
    }

    /// Which client library to use. Default: redis-rs when its feature is enabled.
    pub fn client(mut self, client: Client) -> Self {
        self.options.client = client;
        self
    }

    /// Credentials for the data nodes behind Sentinel (a Sentinel's own credentials go in its
    /// URL). For one server or a cluster, put them in the URLs instead.
    pub fn data_node_credentials(
        mut self,
        username: Option<&str>,
        password: impl Into<String>,
    ) -> Self {
        self.options.username = username.map(str::to_owned);
        self.options.password = Some(password.into());
        self
    }

    /// The logical database of the data nodes behind Sentinel. For one server, put it in the
    /// URL (`redis://host:port/2`); Cluster has only database 0.
    pub fn database(mut self, database: u8) -> Self {
        self.options.database = Some(database);
        self
    }

    /// Connect even when a server's `maxmemory-policy` lets Redis evict coord's keys.
    /// Default: `false`, and connecting to such a server fails with kind `Config`.
    ///
    /// Under memory pressure, any policy other than `noeviction` may delete a held lock (a
    /// second caller then enters the section) or an idempotency record (the operation may
    /// run again). Allow it only where memory never runs out, or where that is acceptable; a
    /// warning is logged at connect either way.
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.options.allow_eviction = allow;
        self
    }

    /// Connects, then checks the servers' settings. Gives up after three command timeouts.
    ///
    /// Fails with a [`BackendError`] of kind `Config` for bad settings, or
    /// `Unavailable`/`Timeout` when the server cannot be reached; the message names the
    /// address, never a password. Also fails with kind `Config` when a data node's
    /// `maxmemory-policy` is not `noeviction`, unless [`allow_eviction`](Self::allow_eviction)
    /// says otherwise. Logs a warning (and connects) when persistence is off (`appendonly
    /// no` and no `save` points), or when the settings cannot be read (`CONFIG` disabled or
    /// not permitted, as on managed services).
    pub async fn connect(self) -> Result<RedisProvider, BackendError> {
        let options = self.options;
        let address = options.describe();
        let secrets = options.secrets();
        validate(&options)?;
        let timeout = options.command_timeout;
        let context = format!("connecting to Redis at {address}");
        let watch = Arc::new(ServerWatch::new(address.clone()));
        let checks = CheckOptions {
            allow_eviction: options.allow_eviction,
        };
        // Boxed (it runs once per provider): unboxed, the nested connect futures of both
        // client libraries overflow the compiler's query depth limit under clippy.
        let connecting = Box::pin(async {
            let transport = connect_transport(&options, watch.clone())
                .await
                .map_err(|fault| fault.into_backend(&context))?;
            server_checks::check_at_connect(&*transport, checks, &address).await?;
            let (at, server_ms) = server_time(&*transport)
                .await
                .map_err(|fault| fault.into_backend(&context))?;
            Ok::<_, BackendError>((transport, ServerClock::new(at, server_ms)))
        });
        let (transport, clock) =
            match tokio::time::timeout(timeout.saturating_mul(3), connecting).await {
                Ok(Ok(connected)) => connected,
                Ok(Err(err)) => {
                    return Err(BackendError::new(
                        err.kind(),
                        scrub(err.message(), &secrets),
                    ));
                }
                Err(_) => {
                    return Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "{context}: no connection within {:?}",
                            timeout.saturating_mul(3)
                        ),
                    ));
                }
            };
        Ok(RedisProvider {
            inner: Arc::new(Inner {
                transport,
                hub: Hub::new(timeout),
                timeout,
                address,
                secrets,
                client: options.client,
                watch,
                clock,
            }),
        })
    }
}

/// The server's `TIME` in ms, and the local monotonic instant it corresponds to (the midpoint
/// of the round trip).
async fn server_time(transport: &dyn Transport) -> Result<(std::time::Instant, i64), Fault> {
    let sent = std::time::Instant::now();
    let replies = transport.run(&[Command::new("TIME")]).await?;
    let at = sent + sent.elapsed() / 2;
    let number = |reply: &Reply| match reply {
        Reply::Data(text) => std::str::from_utf8(text).ok()?.parse::<i64>().ok(),
        Reply::Int(n) => Some(*n),
        _ => None,
    };
    match replies.as_slice() {
        [Reply::Array(parts)] if parts.len() == 2 => match (number(&parts[0]), number(&parts[1])) {
            (Some(secs), Some(micros)) => Ok((at, secs * 1000 + micros / 1000)),
            _ => Err(Fault::Protocol(
                "TIME answered something else than a time".into(),
            )),
        },
        _ => Err(Fault::Protocol(
            "TIME answered something else than a time".into(),
        )),
    }
}

/// The most connections a provider opens to one node: far above what multiplexed connections
/// need, far below what would exhaust the server's or this process's file descriptors.
const MAX_POOL_SIZE: usize = 1024;

/// The longest command timeout a provider uses.
const MAX_COMMAND_TIMEOUT: Duration = Duration::from_secs(3600);

fn validate(options: &Options) -> Result<(), BackendError> {
    let config = |msg: String| Err(BackendError::new(BackendErrorKind::Config, msg));
    if options.command_timeout.is_zero() {
        return config("the command timeout must be greater than zero".to_owned());
    }
    if options.pool_size == 0 {
        return config("the pool size must be at least one".to_owned());
    }
    if options.pool_size > MAX_POOL_SIZE {
        return config(format!(
            "the pool size must be at most {MAX_POOL_SIZE} connections (got {}): each is a \
             multiplexed connection, so a few serve thousands of concurrent calls",
            options.pool_size
        ));
    }
    match &options.topology {
        Topology::Standalone(url) => {
            Endpoint::parse(url, 6379)?;
        }
        Topology::Sentinel { master, sentinels } => {
            if master.is_empty() {
                return config("the Sentinel master name is empty".to_owned());
            }
            if sentinels.is_empty() {
                return config("no Sentinel nodes given".to_owned());
            }
            for url in sentinels {
                Endpoint::parse(url, 26379)?;
            }
        }
        Topology::Cluster(seeds) => {
            if seeds.is_empty() {
                return config("no Cluster seed nodes given".to_owned());
            }
            for url in seeds {
                Endpoint::parse(url, 6379)?;
            }
        }
    }
    Ok(())
}

async fn connect_transport(
    options: &Options,
    watch: Arc<ServerWatch>,
) -> Result<Arc<dyn Transport>, Fault> {
    match options.client {
        #[cfg(feature = "redis-client")]
        Client::RedisRs => crate::transport::redis_rs::connect(options, watch).await,
        #[cfg(feature = "fred")]
        Client::Fred => crate::transport::fred_client::connect(options, watch).await,
    }
}

impl RedisProvider {
    /// Connects to one Redis server at `url` (`redis://[user[:password]@]host[:port][/db]`)
    /// with the default options. See [`RedisProvider::builder`] for the options.
    pub async fn connect(url: &str) -> Result<RedisProvider, BackendError> {
        RedisProvider::builder(url).connect().await
    }

    /// Connects to the server named by the `COORD_REDIS_URL` environment variable, with the
    /// default options. A missing variable is a `Config` error.
    pub async fn from_env() -> Result<RedisProvider, BackendError> {
        match std::env::var(URL_ENV) {
            Ok(url) if !url.trim().is_empty() => RedisProvider::connect(url.trim()).await,
            _ => Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "{URL_ENV} is not set: set it to the Redis URL, e.g. redis://127.0.0.1:6379"
                ),
            )),
        }
    }

    /// A builder for one server at `url`.
    pub fn builder(url: impl Into<String>) -> RedisProviderBuilder {
        RedisProviderBuilder::new(Topology::Standalone(url.into()))
    }

    /// A builder for the master named `master_name`, found through the Sentinel nodes at
    /// `sentinels` (URLs or `host:port`, default port 26379). The provider follows a failover
    /// to the new master: connections to a demoted master are dropped and the master is looked
    /// up again.
    pub fn sentinel<I, S>(master_name: impl Into<String>, sentinels: I) -> RedisProviderBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisProviderBuilder::new(Topology::Sentinel {
            master: master_name.into(),
            sentinels: sentinels.into_iter().map(Into::into).collect(),
        })
    }

    /// A builder for Redis Cluster, discovered from `seeds` (any reachable node is enough).
    /// All keys of one call key share a hash slot, so no command crosses slots.
    pub fn cluster<I, S>(seeds: I) -> RedisProviderBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisProviderBuilder::new(Topology::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ))
    }

    /// Where this provider connects, without credentials.
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The bound on every Redis call.
    pub fn command_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The client library in use.
    pub fn client(&self) -> Client {
        self.inner.client
    }

    /// How many server restarts this provider has noticed: each time a data node it
    /// (re)connected to answered with a different `run_id` than before. Each one is also
    /// logged at error level, with what it means for held locks and in-flight records.
    ///
    /// A restart closes every connection to the node; it is noticed when a connection is made
    /// again, so it may show up only shortly after the first call that follows it (with fred,
    /// which redials on its own, usually before). Not noticed: restarts of a node whose
    /// `INFO` the ACL refuses. A Sentinel failover to another node is not a restart.
    pub fn server_restarts(&self) -> u64 {
        self.inner.watch.restarts()
    }
}

#[cfg(test)]
mod tests {
    use super::commands::*;
    use super::locks::backstop_after;
    use super::*;
    use coord_core::OwnerToken;

    #[test]
    fn millis_round_up_and_clamp() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_micros(1001)), 2);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
        assert_eq!(millis(Duration::from_millis(u64::MAX)), MAX_MILLIS);
        assert_eq!(MAX_MILLIS, 70_368_744_177_664);
    }

    #[test]
    fn owner_tokens_parse_back_exactly() {
        let token = OwnerToken::new();
        let text = token.to_string();
        assert_eq!(parse_token(text.as_bytes()), Some(token));
        assert_eq!(parse_token(format!("{text}*").as_bytes()), None);
        assert_eq!(parse_token(&text.as_bytes()[..31]), None);
        assert_eq!(parse_token(text.to_uppercase().as_bytes()), None);
        assert_eq!(parse_token(b"+0123456789abcdef0123456789abcde"), None);
    }

    #[test]
    fn error_replies_map_to_kinds() {
        let kind = |reply: &str| Fault::Server(reply.to_owned()).into_backend("test").kind();
        assert_eq!(
            kind("OOM command not allowed when used memory > 'maxmemory'."),
            BackendErrorKind::OutOfMemory
        );
        assert_eq!(
            kind("WRONGTYPE Operation against a key holding the wrong kind of value"),
            BackendErrorKind::Corrupt
        );
        assert_eq!(
            kind("ERR coord: the record has no state"),
            BackendErrorKind::Corrupt
        );
        // Other `ERR` replies (a Lua runtime error, a refused argument) are not about the data.
        assert_eq!(
            kind("ERR user_script:3: attempt to compare nil with number"),
            BackendErrorKind::Protocol
        );
        assert_eq!(
            kind("ERR invalid expire time in 'set' command"),
            BackendErrorKind::Protocol
        );
        assert_eq!(
            kind("LOADING Redis is loading"),
            BackendErrorKind::Unavailable
        );
        assert_eq!(kind("NOPERM no permissions"), BackendErrorKind::Config);
    }

    #[test]
    fn tokens_are_32_lowercase_hex() {
        assert!(is_token(OwnerToken::new().to_string().as_bytes()));
        assert!(!is_token(b"not-a-token"));
        assert!(!is_token(&[b'A'; 32]));
    }

    #[test]
    fn backstop_is_capped_and_after_the_lease() {
        let d = backstop_after(Some(200));
        assert!(
            d > Duration::from_millis(200) && d < Duration::from_millis(220),
            "{d:?}"
        );
        let d = backstop_after(Some(60_000));
        assert!(
            d > BACKSTOP_CAP && d < BACKSTOP_CAP + Duration::from_millis(70),
            "{d:?}"
        );
        assert_eq!(backstop_after(Some(-2)), Duration::ZERO);
        assert!(backstop_after(None) > BACKSTOP_CAP);
    }
}
