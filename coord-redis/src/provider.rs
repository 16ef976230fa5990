//! [`RedisProvider`]: the lock and idempotency contract over Redis.

use std::sync::Arc;
use std::time::Duration;

use coord_core::{
    BackendError, BackendErrorKind, BoxFuture, CallKey, ClaimOutcome, ClaimRequest,
    CompleteOutcome, CompleteRequest, FencingToken, Fingerprint, IdempotencyStore, LockGrant,
    LockProvider, LockRequest, LossCause, OwnerToken, ReleaseOutcome, RenewOutcome,
};
use tokio::time::Instant;

use crate::config::{Client, Endpoint, Options, Topology, scrub};
use crate::encode::{Decimal, TokenText};
use crate::keys::Names;
use crate::scripts::{self, Script};
use crate::server_checks::{self, CheckOptions, ServerWatch};
use crate::transport::{Command, Fault, Reply, Transport};
use crate::waiters::{Hub, Wake, Woken};

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
/// hand-off, and idempotency records. Implements [`LockProvider`] and [`IdempotencyStore`];
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
///   with [`IdempotencyStore::purge`], or delete the key.
/// * **Resends are safe.** A command sent again after its reply was lost answers what the
///   first send answered: a claim finding its own live marker is `Claimed`, a completion
///   finding its own completed record is `Stored`, an acquire finding its own token is granted.
/// * **Idempotency records.** A claim creates the in-flight marker or reads the record in one
///   script; completion keeps the claim's fingerprint and stores the outcome for its
///   retention. When the marker is gone and nobody claimed since, completion creates the
///   completed record in the same script (`StoredWithoutMarker`, with the request's
///   fingerprint); when another owner's marker or record is there, it writes nothing and
///   names that owner (`Superseded`). Completion, abandonment and
///   [`IdempotencyStore::purge`] wake `wait_settled` callers at once. A marker claimed with
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

// ---------------------------------------------------------------------------------------------
// Commands and scripts

impl Inner {
    fn error(&self, fault: Fault, what: &str, key: &CallKey) -> BackendError {
        if let Fault::Timeout(_) = fault {
            return BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "{what} at {}: no answer within {:?}",
                    self.address, self.timeout
                ),
            )
            .with_key(key);
        }
        let err = fault.into_backend(&format!("{what} at {}", self.address));
        BackendError::new(err.kind(), scrub(err.message(), &self.secrets)).with_key(key)
    }

    /// Sends `cmds` in one round trip (the transport bounds it by the command timeout).
    async fn run(&self, cmds: &[Command<'_>], key: &CallKey) -> Result<Vec<Reply>, BackendError> {
        let what = cmds[0].name;
        match self.transport.run(cmds).await {
            Ok(replies) if replies.len() == cmds.len() => Ok(replies),
            Ok(_) => Err(self.protocol(what, key, "wrong number of replies")),
            Err(fault) => Err(self.error(fault, what, key)),
        }
    }

    /// Runs `script` by SHA, sending its source once if the server does not have it.
    async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
        key: &CallKey,
    ) -> Result<Reply, BackendError> {
        const NUMKEYS: [&str; 3] = ["0", "1", "2"];
        let sha: &str = &script.sha;
        // `body` is left to inference so both calls share one lifetime (the script's).
        let build = |name: &'static str, body| {
            let mut cmd = Command::new(name).arg(body).arg(NUMKEYS[keys.len()]);
            for (i, k) in keys.iter().enumerate() {
                cmd = if i == 0 { cmd.key(k) } else { cmd.arg(*k) };
            }
            for a in args {
                cmd = cmd.arg(*a);
            }
            cmd
        };
        // (A statement of its own, so the command is gone before the fallback builds another.)
        let first = self.transport.run(&[build("EVALSHA", sha)]).await;
        let outcome = match first {
            // Rare (a fresh or flushed server): boxed, so the common path's future stays small.
            Err(fault) if fault.is_noscript() => {
                let source = [build("EVAL", script.source)];
                Box::pin(self.transport.run(&source)).await
            }
            other => other,
        };
        let what = || format!("script `{}`", script.name);
        match outcome {
            Ok(mut replies) if replies.len() == 1 => Ok(replies.pop().expect("one reply")),
            Ok(_) => Err(self.protocol(&what(), key, "wrong number of replies")),
            Err(fault) => Err(self.error(fault, &what(), key)),
        }
    }

    /// State under one of coord's keys that coord did not write.
    fn corrupt(&self, what: &str, key: &CallKey, detail: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Corrupt,
            format!("{what} at {}: {detail}", self.address),
        )
        .with_key(key)
    }

    fn protocol(&self, what: &str, key: &CallKey, detail: &str) -> BackendError {
        BackendError::new(
            BackendErrorKind::Protocol,
            format!("{what} at {}: {detail}", self.address),
        )
        .with_key(key)
    }
}

/// Milliseconds for `PX`/`PEXPIRE`: rounded up (a sub-millisecond or zero lease is one
/// millisecond, since Redis refuses zero), capped at [`MAX_MILLIS`].
fn millis(d: Duration) -> u64 {
    let ms = d.as_micros().div_ceil(1000);
    ms.clamp(1, MAX_MILLIS as u128) as u64
}

/// A lock value coord wrote: an owner token, with `*` appended once someone waits for it.
fn is_token(value: &[u8]) -> bool {
    let token = value.strip_suffix(b"*").unwrap_or(value);
    token.len() == 32 && token.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The owner token written as `holder` (32 lowercase hex digits), if it is one.
fn parse_token(holder: &[u8]) -> Option<OwnerToken> {
    if holder.len() != 32 || !is_token(holder) {
        return None;
    }
    let text = std::str::from_utf8(holder).ok()?;
    u128::from_str_radix(text, 16)
        .ok()
        .map(OwnerToken::from_u128)
}

/// Whether the lock value `holder` is `token`'s (marked as waited for or not).
fn is_own(holder: &[u8], token: &TokenText) -> bool {
    holder.strip_suffix(b"*").unwrap_or(holder) == token.as_ref()
}

// ---------------------------------------------------------------------------------------------
// Locks

/// Which attempt at a lock this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TryMode {
    /// The caller will not wait: the bare command.
    Once,
    /// The caller will wait if the lock is held: the remaining lease comes back in the same
    /// round trip.
    FirstOfWait,
    /// The caller is subscribed to releases: a holder found is marked as waited for, so its
    /// release publishes.
    Watching,
}

enum Attempt {
    /// The lock is ours (with a fencing token when fenced).
    Won(Option<u64>),
    /// Someone else holds it; the remaining lease in ms as `PTTL` reports it (-1: no expiry,
    /// -2: gone by now, `None`: not asked).
    Held(Option<i64>),
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    async fn try_lock(
        &self,
        names: &Names<'_>,
        lock: &str,
        token: &TokenText,
        lease_ms: u64,
        fenced: bool,
        mode: TryMode,
        key: &CallKey,
    ) -> Result<Attempt, BackendError> {
        let lease = Decimal::new(lease_ms);
        let watch: &[u8] = if mode == TryMode::Watching {
            b"1"
        } else {
            b"0"
        };
        if fenced {
            let fence = names.fence();
            let fence_ms = millis(FENCE_RETENTION_FLOOR).max(lease_ms.saturating_mul(10));
            let reply = self
                .eval(
                    &scripts::FENCED_ACQUIRE,
                    &[lock, &fence],
                    &[
                        token.as_ref(),
                        lease.as_ref(),
                        watch,
                        Decimal::new(fence_ms.min(MAX_MILLIS)).as_ref(),
                    ],
                    key,
                )
                .await?;
            return self.scripted_attempt(reply, true, key);
        }
        if mode == TryMode::Watching {
            let reply = self
                .eval(
                    &scripts::WAITING_ACQUIRE,
                    &[lock],
                    &[token.as_ref(), lease.as_ref(), watch],
                    key,
                )
                .await?;
            return self.scripted_attempt(reply, false, key);
        }
        // SET .. NX .. GET answers with the current holder when the key is taken (and fails
        // with WRONGTYPE on a foreign value) in the same single command.
        let set = Command::new("SET")
            .key(lock)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(&lease)
            .arg("GET");
        let replies = if mode == TryMode::FirstOfWait {
            self.run(&[set, Command::new("PTTL").key(lock)], key)
                .await?
        } else {
            self.run(&[set], key).await?
        };
        match &replies[0] {
            Reply::Nil => Ok(Attempt::Won(None)),
            // Our own token: an earlier send of this very SET landed (a client retry).
            Reply::Data(holder) if is_own(holder, token) => Ok(Attempt::Won(None)),
            Reply::Data(holder) if is_token(holder) => {
                let pttl = match replies.get(1) {
                    Some(Reply::Int(ms)) => Some(*ms),
                    Some(_) => return Err(self.protocol("PTTL", key, "unexpected reply")),
                    None => None,
                };
                Ok(Attempt::Held(pttl))
            }
            Reply::Data(_) => Err(self.foreign_lock(key)),
            _ => Err(self.protocol("SET", key, "unexpected reply")),
        }
    }

    /// Reads the reply of an acquire script: the fencing token (fenced) or 0 when taken,
    /// `{holder, pttl}` when held.
    fn scripted_attempt(
        &self,
        reply: Reply,
        fenced: bool,
        key: &CallKey,
    ) -> Result<Attempt, BackendError> {
        match reply {
            Reply::Int(tok) if fenced && tok > 0 => Ok(Attempt::Won(Some(tok as u64))),
            Reply::Int(0) if !fenced => Ok(Attempt::Won(None)),
            Reply::Array(items) => match items.as_slice() {
                [Reply::Data(holder), Reply::Int(pttl)] if is_token(holder) => {
                    Ok(Attempt::Held(Some(*pttl)))
                }
                [Reply::Data(_), _] => Err(self.foreign_lock(key)),
                _ => Err(self.protocol("acquire", key, "unexpected script reply")),
            },
            _ => Err(self.protocol("acquire", key, "unexpected script reply")),
        }
    }

    fn foreign_lock(&self, key: &CallKey) -> BackendError {
        self.corrupt(
            "acquire",
            key,
            "the lock key holds a value coord did not write",
        )
    }

    async fn acquire(&self, req: LockRequest<'_>) -> Result<Option<LockGrant>, BackendError> {
        let names = Names::of(req.key);
        let lock = names.lock();
        let token = TokenText::new(req.owner);
        let lease_ms = millis(req.lease);
        if !req.wait.is_zero() {
            // The waiting machinery lives in its own allocation, so the single attempt (the
            // common case) stays a small future.
            return Box::pin(self.acquire_waiting(&names, &lock, &token, lease_ms, &req)).await;
        }
        match self
            .try_lock(
                &names,
                &lock,
                &token,
                lease_ms,
                req.fenced,
                TryMode::Once,
                req.key,
            )
            .await?
        {
            Attempt::Won(fence) => Ok(Some(grant(fence, false))),
            Attempt::Held(_) => Ok(None),
        }
    }

    /// An acquisition that may wait until `req.wait` has passed.
    async fn acquire_waiting(
        &self,
        names: &Names<'_>,
        lock: &str,
        token: &TokenText,
        lease_ms: u64,
        req: &LockRequest<'_>,
    ) -> Result<Option<LockGrant>, BackendError> {
        // `None`: no end (a wait too long to represent, such as `Duration::MAX`), the wait
        // lasts until the lock is ours or the future is dropped.
        let deadline = Instant::now().checked_add(req.wait);
        match self
            .try_lock(
                names,
                lock,
                token,
                lease_ms,
                req.fenced,
                TryMode::FirstOfWait,
                req.key,
            )
            .await?
        {
            Attempt::Won(fence) => return Ok(Some(grant(fence, false))),
            Attempt::Held(_) => {}
        }

        // Listen before retrying, so a release between our attempt and the subscription
        // is seen by the retry, and one after it by the message. A wait that ends while the
        // subscription is still being made ends as a refusal.
        let joining = self
            .hub
            .join(&self.transport, lock.to_owned(), Wake::Head, self.timeout);
        let ticket = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
                Ok(ticket) => ticket?,
                Err(_) => return Ok(None),
            },
            None => joining.await?,
        };
        loop {
            let pttl = match self
                .try_lock(
                    names,
                    lock,
                    token,
                    lease_ms,
                    req.fenced,
                    TryMode::Watching,
                    req.key,
                )
                .await?
            {
                Attempt::Won(fence) => return Ok(Some(grant(fence, true))),
                Attempt::Held(pttl) => pttl,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            // Only the head keeps a backstop timer; the others wait their turn (they are
            // woken when they become head).
            let backstop = ticket.is_head().then(|| now + backstop_after(pttl));
            let until = match (backstop, deadline) {
                (Some(b), Some(d)) => Some(b.min(d)),
                (b, d) => b.or(d),
            };
            let sleep = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            // Woken, the backstop fired, or the deadline came: look again either way. The
            // attempt at the deadline is the last one (the check above ends the loop), and a
            // timer that fires early (tokio caps very distant ones) only costs an attempt.
            tokio::select! {
                _ = ticket.woken() => {}
                _ = sleep => {}
            }
        }
    }
}

/// Reads the reply of a renewal script: 1 renewed, 0 free or no longer ours, 2 another
/// owner's.
fn renew_outcome(
    inner: &Inner,
    reply: Reply,
    what: &str,
    key: &CallKey,
) -> Result<RenewOutcome, BackendError> {
    match reply {
        Reply::Int(1) => Ok(RenewOutcome::Renewed),
        Reply::Int(0) => Ok(RenewOutcome::Lost(LossCause::Expired)),
        Reply::Int(2) => Ok(RenewOutcome::Lost(LossCause::TakenByOther)),
        _ => Err(inner.protocol(what, key, "unexpected script reply")),
    }
}

fn grant(fencing_token: Option<u64>, contended: bool) -> LockGrant {
    LockGrant {
        fencing_token: fencing_token.map(FencingToken::new),
        contended,
        lease_began: None,
    }
}

/// When to look again without a message: at the end of the holder's lease (plus jitter so
/// waiters of several processes do not retry in lock-step), at most [`BACKSTOP_CAP`].
fn backstop_after(pttl: Option<i64>) -> Duration {
    let base = match pttl {
        Some(-2) => return Duration::ZERO,
        Some(ms) if ms >= 0 => Duration::from_millis(ms as u64).min(BACKSTOP_CAP),
        _ => BACKSTOP_CAP,
    };
    let spread = (base.as_micros() as u64 / 16).max(2000);
    base + Duration::from_micros(1000 + rand::random_range(0..=spread))
}

impl LockProvider for RedisProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        Box::pin(self.inner.acquire(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let names = Names::of(key);
            let token = TokenText::new(owner);
            let reply = inner
                .eval(&scripts::RELEASE, &[&names.lock()], &[token.as_ref()], key)
                .await?;
            match reply {
                Reply::Int(1) => Ok(ReleaseOutcome::Released),
                Reply::Int(0) => Ok(ReleaseOutcome::NotHeld),
                _ => Err(inner.protocol("release", key, "unexpected script reply")),
            }
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let names = Names::of(key);
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let reply = inner
                .eval(
                    &scripts::RENEW,
                    &[&names.lock()],
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            renew_outcome(inner, reply, "renew", key)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Idempotency records

fn fingerprint(value: &[u8]) -> Option<Option<Fingerprint>> {
    match value.len() {
        0 => Some(None),
        16 => {
            let mut fp = [0u8; 16];
            fp.copy_from_slice(value);
            Some(Some(Fingerprint(fp)))
        }
        _ => None,
    }
}

impl Inner {
    async fn claim(&self, req: ClaimRequest<'_>) -> Result<ClaimOutcome, BackendError> {
        let key = req.key;
        let names = Names::of(key);
        let token = TokenText::new(req.owner);
        let fp: &[u8] = match &req.fingerprint {
            Some(fp) => &fp.0,
            None => &[],
        };
        let lease = millis(req.in_flight_lease);
        // Lease plus keep must stay within what Redis accepts.
        let keep = req
            .keep_abandoned_for
            .map(|d| Decimal::new(millis(d).min(MAX_MILLIS - lease).max(1)));
        // Past this instant (server clock) the claim must not take effect: by then this call
        // has given up waiting for the reply (a call is bounded by the command timeout, the
        // NOSCRIPT fallback by another), and a marker created now would belong to nobody.
        let grace = self.timeout.max(Duration::from_millis(250));
        let window = millis(self.timeout.saturating_mul(2).saturating_add(grace)) as i64;
        let mut remeasured = false;
        let reply = loop {
            let not_after = self.clock.now_ms().saturating_add(window).max(0) as u64;
            let not_after = Decimal::new(not_after);
            let reply = self
                .eval(
                    &scripts::CLAIM,
                    &[&names.record()],
                    &[
                        token.as_ref(),
                        Decimal::new(lease).as_ref(),
                        fp,
                        keep.as_ref().map_or(&[][..], |k| k.as_ref()),
                        not_after.as_ref(),
                    ],
                    key,
                )
                .await?;
            let late = matches!(&reply, Reply::Array(items) if matches!(items.as_slice(), [Reply::Int(3)]));
            if late && !remeasured {
                // Refused as late while this call was still waiting for it: the estimate of
                // the server's clock is off (its clock was stepped). Measure again, send once
                // more.
                remeasured = true;
                let (at, server_ms) = server_time(&*self.transport)
                    .await
                    .map_err(|fault| fault.into_backend("claim: reading the server's clock"))?;
                tracing::warn!(
                    key = %key,
                    "coord-redis: a claim came back refused as late although it was answered in time: the server's clock moved; measured it again"
                );
                self.clock.set(at, server_ms);
                continue;
            }
            break reply;
        };
        let corrupt = |detail: &str| self.corrupt("claim", key, detail);
        let Reply::Array(items) = reply else {
            return Err(corrupt("unexpected script reply"));
        };
        match items.as_slice() {
            [Reply::Int(1)] => Ok(ClaimOutcome::Claimed),
            [Reply::Int(3)] => Err(BackendError::new(
                BackendErrorKind::Timeout,
                "claim: the command reached Redis after this call had given up on it; it was not applied",
            )
            .with_key(key)),
            [Reply::Int(2), Reply::Data(fp)] => Ok(ClaimOutcome::Abandoned {
                fingerprint: fingerprint(fp)
                    .ok_or_else(|| corrupt("the record's fingerprint is not one coord wrote"))?,
            }),
            [Reply::Int(0), state, fp, payload, Reply::Int(pttl)] => {
                let fingerprint = match fp {
                    Reply::Data(fp) => fingerprint(fp),
                    _ => None,
                }
                .ok_or_else(|| corrupt("the record's fingerprint is not one coord wrote"))?;
                match (state, payload) {
                    (Reply::Data(st), _) if st == b"i" => Ok(ClaimOutcome::InFlight {
                        fingerprint,
                        remaining: Duration::from_millis((*pttl).max(0) as u64),
                    }),
                    (Reply::Data(st), Reply::Data(payload)) if st == b"c" => {
                        Ok(ClaimOutcome::Completed {
                            payload: Arc::from(payload.as_slice()),
                            fingerprint,
                        })
                    }
                    _ => Err(corrupt("the record at the key is not one coord wrote")),
                }
            }
            _ => Err(corrupt("the record at the key is not one coord wrote")),
        }
    }

    async fn settle(
        &self,
        script: &Script,
        key: &CallKey,
        args: &[&[u8]],
        what: &str,
    ) -> Result<bool, BackendError> {
        let names = Names::of(key);
        let reply = self.eval(script, &[&names.record()], args, key).await?;
        match reply {
            Reply::Int(1) => Ok(true),
            Reply::Int(0) => Ok(false),
            _ => Err(self.protocol(what, key, "unexpected script reply")),
        }
    }

    async fn wait_settled(&self, key: &CallKey, timeout: Duration) -> Result<(), BackendError> {
        if timeout.is_zero() {
            return Ok(());
        }
        // `None`: no end (a timeout too long to represent): wait until the marker settles.
        let deadline = Instant::now().checked_add(timeout);
        let names = Names::of(key);
        let record = names.record();
        let joining = self
            .hub
            .join(&self.transport, record.clone(), Wake::All, self.timeout);
        let ticket = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
                Ok(ticket) => ticket?,
                Err(_) => return Ok(()),
            },
            None => joining.await?,
        };
        loop {
            let reply = self.eval(&scripts::PROBE, &[&record], &[], key).await?;
            let remaining = match reply {
                Reply::Array(items) => match items.as_slice() {
                    [Reply::Int(0)] => return Ok(()),
                    [Reply::Int(1), Reply::Data(st)] if st == b"c" => return Ok(()),
                    // A kept marker whose lease has ended is abandoned: nothing is in flight.
                    [Reply::Int(3), Reply::Int(ms)] if *ms <= 0 => return Ok(()),
                    [Reply::Int(2 | 3), Reply::Int(ms)] if *ms > 0 => *ms,
                    // A marker that lapses this very millisecond.
                    [Reply::Int(2), Reply::Int(_)] => 0,
                    _ => {
                        return Err(self.corrupt(
                            "wait",
                            key,
                            "the record at the key is not one coord wrote",
                        ));
                    }
                },
                _ => return Err(self.protocol("wait", key, "unexpected script reply")),
            };
            // The marker settles by message, or lapses at its expiry (server time, read as a
            // remaining duration, so no clocks are compared).
            let lapse = Instant::now().checked_add(Duration::from_millis(remaining as u64 + 1));
            let until = match (lapse, deadline) {
                (Some(l), Some(d)) => Some(l.min(d)),
                (l, d) => l.or(d),
            };
            let sleep = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                woken = ticket.woken() => match woken {
                    Woken::Message => return Ok(()),
                    // A reconnection, not a settle: look again.
                    Woken::Resync if deadline.is_none_or(|d| Instant::now() < d) => continue,
                    Woken::Resync => return Ok(()),
                },
                _ = sleep => return Ok(()),
            }
        }
    }
}

impl IdempotencyStore for RedisProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        Box::pin(self.inner.claim(req))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        Box::pin(async move {
            let inner = &*self.inner;
            let key = req.key;
            let names = Names::of(key);
            let token = TokenText::new(req.owner);
            let retention = Decimal::new(millis(req.retention));
            let fp: &[u8] = match &req.fingerprint {
                Some(fp) => &fp.0,
                None => &[],
            };
            let reply = inner
                .eval(
                    &scripts::COMPLETE,
                    &[&names.record()],
                    &[token.as_ref(), &req.payload, retention.as_ref(), fp],
                    key,
                )
                .await?;
            let unexpected = || inner.protocol("complete", key, "unexpected script reply");
            let Reply::Array(items) = reply else {
                return Err(unexpected());
            };
            match items.as_slice() {
                [Reply::Int(1)] => Ok(CompleteOutcome::Stored),
                [Reply::Int(2)] => Ok(CompleteOutcome::StoredWithoutMarker),
                [Reply::Int(0), other, Reply::Int(completed @ (0 | 1))] => {
                    let other = match other {
                        Reply::Data(token) => Some(parse_token(token).ok_or_else(|| {
                            inner.corrupt("complete", key, "the record's owner is not a token")
                        })?),
                        _ => None,
                    };
                    Ok(CompleteOutcome::Superseded {
                        other,
                        completed: *completed == 1,
                    })
                }
                _ => Err(unexpected()),
            }
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            self.inner
                .settle(&scripts::ABANDON, key, &[token.as_ref()], "abandon")
                .await
        })
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.inner.wait_settled(key, timeout))
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(async move {
            let token = TokenText::new(owner);
            let lease = Decimal::new(millis(lease));
            let inner = &*self.inner;
            let names = Names::of(key);
            let reply = inner
                .eval(
                    &scripts::RENEW_MARKER,
                    &[&names.record()],
                    &[token.as_ref(), lease.as_ref()],
                    key,
                )
                .await?;
            renew_outcome(inner, reply, "renew marker", key)
        })
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.inner.settle(&scripts::PURGE, key, &[], "purge"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
