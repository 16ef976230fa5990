//! [`RedisProvider`]: the lock and idempotency contract over Redis.
//!
//! This file holds the provider, its builder and the connection and client selection;
//! `commands` sends commands and scripts and reads faults, `locks` and `records` implement
//! the two halves of the contract, `operations` the operations API, and the crate's `waiters`
//! module serves the waits.

mod cache;
mod commands;
mod counted_leases;
mod flights;
mod locks;
mod multi_locks;
mod operations;
mod records;
mod rw_locks;
mod semaphores;

use std::sync::Arc;
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;

#[cfg(feature = "tls")]
use crate::config::Pem;
use crate::config::{Client, Options, Target, TlsMaterial, Topology, scrub};
use crate::server_checks::{self, CheckOptions};
use crate::transport::{Command, Fault, Reply, ServerWatch, Transport};
use crate::waiters::{BACKSTOP_CAP, Hub};

/// The environment variable [`RedisProvider::from_env`] reads.
pub const URL_ENV: &str = "COORD_REDIS_URL";

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
/// hand-off, and idempotency records. Implements [`LockProvider`](coord_core::provider::LockProvider) and [`IdempotencyStore`](coord_core::provider::IdempotencyStore);
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
/// * **Waiting without polling, handed over in one step.** A waiter subscribes (one shared
///   subscriber connection per provider), then marks the holder's value as waited for and
///   stands in the lock's queue in Redis; the release of a marked lock makes the first waiter
///   the holder in the same script (owner, lease, fencing token) and tells it: in memory in
///   the releasing process (the waiter sends nothing), by a message elsewhere (the waiter
///   confirms with one script within a claim window of one second). Processes take turns in
///   the order their first waiters queued, and a process's waiters are served in arrival
///   order. A lock nobody waits for publishes nothing. A waiter that gives up
///   takes its place out and releases onward a lock handed to it meanwhile; one that crashed
///   holds the lock for the claim window only. A backstop at the holder's remaining lease
///   (at most one second, with jitter) covers a lost message, a lapsed claim or a holder that
///   died. Not promised: an order between a waiter and a caller that does not wait (a free
///   lock goes to whoever asks first), or between a multi-key waiter and plain waiters of
///   one process.
/// * **Bounded calls.** Every round trip to Redis, including making a connection for it, is
///   bounded by the command timeout (one second unless configured; a script the server has
///   forgotten costs one more round trip to send it again); an unreachable server yields a
///   [`BackendError`] of kind `Timeout` or `Unavailable`, never a hang. A server out of memory
///   under `noeviction` yields kind `OutOfMemory` (retryable once memory is freed).
/// * **Corrupt state is refused.** A value at a coord key that coord did not write (another
///   Redis type, a lock value that is not a token, a fencing counter that is not plain decimal
///   digits, a record with a missing or unknown field) yields kind `Corrupt` naming the call
///   key, and is never turned into a grant, a fencing token or a replay. Purge such a record
///   with [`IdempotencyStore::purge`](coord_core::provider::IdempotencyStore::purge), or delete the key.
/// * **Resends are safe.** A command sent again after its reply was lost answers what the
///   first send answered: a claim finding its own live marker is `Claimed`, a completion
///   finding its own completed record is `Stored`, an acquire finding its own token is granted.
/// * **Idempotency records.** A claim creates the in-flight marker or reads the record in one
///   script; completion keeps the claim's fingerprint and stores the outcome for its
///   retention. When the marker is gone and nobody claimed since, completion creates the
///   completed record in the same script (`StoredWithoutMarker`, with the request's
///   fingerprint); when another owner's marker or record is there, it writes nothing and
///   names that owner (`Superseded`). Completion, abandonment and
///   [`IdempotencyStore::purge`](coord_core::provider::IdempotencyStore::purge) wake `wait_settled` callers at once. A marker claimed with
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
/// between waiters in different processes (they race for the lock, the first retry wins).
/// With a shared fred client ([`RedisProvider::from_fred_client`]), a fresh connection
/// after a timed-out call (the client is the application's).
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
    /// `WAIT` after each granting write: the replica count and the timeout in ms, as sent.
    replica_acks: Option<AckWait>,
    /// Every key lives on one server (a standalone server, or the master behind Sentinel):
    /// multi-key locks of any keys can be taken by one script. Off for Redis Cluster and for
    /// clients the application built (which may be cluster clients).
    one_server: bool,
}

/// The `WAIT` sent after each granting write (see [`RedisProviderBuilder::replica_acks`]),
/// or after those of one operation that asks for it ([`coord_core::provider::ReplicaAcks`]).
#[derive(Clone)]
struct AckWait {
    replicas: u32,
    replicas_arg: String,
    timeout_ms: String,
    timeout: Duration,
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
            .field("tls", &self.options.tls)
            .finish_non_exhaustive()
    }
}

impl RedisProviderBuilder {
    fn new(topology: Topology) -> RedisProviderBuilder {
        RedisProviderBuilder {
            options: Options::new(topology),
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

    /// Which client library to use. Default: redis-rs when its feature is enabled. A
    /// builder made from an application's own client uses that client's library; naming
    /// another one makes `connect` fail with kind `Config`.
    pub fn client(mut self, client: Client) -> Self {
        self.options.client = client;
        self.options.client_chosen = true;
        self
    }

    /// Credentials (an ACL user, or `None` for the default user, and its password) for the
    /// data nodes behind Sentinel. A Sentinel's own credentials go in its URL
    /// (`redis://user:password@sentinel:26379`). For one server or a cluster, put them in the
    /// URL instead: elsewhere than behind Sentinel, `connect` refuses this setting (kind
    /// `Config`) rather than ignore it.
    pub fn data_node_credentials(
        mut self,
        username: Option<&str>,
        password: impl Into<String>,
    ) -> Self {
        self.options.username = username.map(str::to_owned);
        self.options.password = Some(password.into());
        self
    }

    /// The logical database (`SELECT`) of one server or of the master behind Sentinel. For
    /// one server it overrides a database in the URL (`redis://host:port/2`, or `?db=2` for
    /// a Unix socket). Redis Cluster has only database 0: another is refused at `connect`.
    pub fn database(mut self, database: u8) -> Self {
        self.options.database = Some(database);
        self
    }

    /// Whether the data nodes behind Sentinel speak TLS. Default: as the Sentinels do (all
    /// `rediss://` URLs, or all `redis://`). Only meaningful behind Sentinel (refused
    /// elsewhere). With the fred client, Sentinels and data nodes must agree (fred has one TLS
    /// setting for both): a mismatch is refused at `connect`.
    pub fn data_node_tls(mut self, tls: bool) -> Self {
        self.options.data_node_tls = Some(tls);
        self
    }

    /// Trust only the CA certificates in this PEM file for TLS connections (`rediss://`),
    /// instead of the system's store. The file is read by `connect`; a missing file, or one
    /// without a PEM certificate, fails it with kind `Config`. Applies to every TLS
    /// connection of the provider (servers, Sentinels, Cluster nodes). Server names are
    /// always verified against the certificate (`rediss://10.0.0.5` needs an IP address in
    /// its subject alternative names).
    #[cfg(feature = "tls")]
    pub fn tls_ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.options.tls.ca = Some(Pem::File(path.into()));
        self
    }

    /// Like [`tls_ca_file`](Self::tls_ca_file), with the PEM text itself.
    #[cfg(feature = "tls")]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.options.tls.ca = Some(Pem::Text(pem.into()));
        self
    }

    /// Present this client certificate (PEM, the certificate first, then any intermediates)
    /// and its private key (PEM: PKCS#8, PKCS#1 or SEC1) on TLS connections, for servers
    /// that authenticate clients (`tls-auth-clients yes`). Read by `connect`. Neither file's
    /// content ever appears in an error or in debug output.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.options.tls.client = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// Like [`tls_client_cert_files`](Self::tls_client_cert_files), with the PEM text itself.
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.options.tls.client = Some((Pem::Text(cert.into()), Pem::Text(key.into())));
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

    /// Makes every write that grants something wait until `replicas` replicas have it, for at
    /// most `timeout`: an idempotency claim and completion, a lock grant (also a hand-over to
    /// a waiter, which is a grant) and renewal, a semaphore permit and its renewal, a cluster
    /// single-flight claim and renewal.
    /// Default: off.
    ///
    /// Redis replicates asynchronously, so a failover can promote a replica that misses what
    /// the old primary acknowledged: a granted lock becomes free, a stored record vanishes and
    /// the operation runs twice. With this option the provider sends `WAIT replicas timeout`
    /// after each such write, on the same connection, in the same round trip, and fewer
    /// acknowledgements count as a failed write, a [`BackendError`] of kind
    /// [`NotReplicated`](coord_core::provider::BackendErrorKind::NotReplicated) naming the
    /// count seen and asked for ([`BackendError::replica_shortfall`]):
    ///
    /// | write | fewer replicas acknowledged | caller gets |
    /// |---|---|---|
    /// | claim | the marker is removed by its owner (the runtime's clean-up of a write that may have landed) | `NotReplicated` error (or the body unguarded under `on_backend_error = "fail_open"`) |
    /// | lock grant | the lock is released by its owner | `NotReplicated` error |
    /// | renewal | counts as failed: retried within the lease, then the hold is lost (`LockLost`) | the body is cancelled with the loss |
    /// | completion | retried while the marker is ours, then given up | `OutcomeNotStored` |
    ///
    /// What it does not promise: `WAIT` proves the replicas received the write, not that it
    /// survives every failover (a replica can itself fail before it is promoted, and without
    /// `appendfsync always` on the replicas a crashed replica may have lost it). A primary cut
    /// off from its replicas still accepts writes from other clients unless the server has
    /// `min-replicas-to-write` set (`coord check` reports it). The price: one `WAIT` in each
    /// granting round trip (the replication round trip is added to its latency; see
    /// BENCHMARKS.md), and while fewer than `replicas` replicas are connected every grant
    /// fails after `timeout`, so with one replica an outage of that replica is an outage of
    /// coord's writes.
    ///
    /// `connect` refuses `replicas` of zero, a zero `timeout`, and a `timeout` not below the
    /// command timeout (the `WAIT` shares the command's round trip and its bound).
    ///
    /// This is the default of every operation; one operation can override it either way
    /// (`replica_acks = n` with `replica_acks_timeout`, or `replica_acks = 0`, on
    /// `#[idempotent]`, `#[distributed_lock]` and `#[single_flight(scope = "cluster")]`;
    /// `.replica_acks(n, timeout)` or `.without_replica_acks()` on the lock, semaphore,
    /// read-write lock, multi-lock, idempotent and cluster-flight handles), with the same
    /// failures. An override's timeout must also be below the command timeout: a longer one
    /// fails the call with a `Config` error. A cluster flight's hand-over is not followed by a
    /// `WAIT`, with this setting or an override.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.options.replica_acks = Some((replicas, timeout));
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
        let scrubbed =
            |err: BackendError| BackendError::new(err.kind(), scrub(err.message(), &secrets));
        validate(&options).map_err(scrubbed)?;
        let target = options.target().map_err(scrubbed)?;
        let one_server = matches!(target, Target::Standalone(_) | Target::Sentinel { .. });
        let client = client_for(&options, &target).map_err(scrubbed)?;
        let tls = options.tls.load().map_err(scrubbed)?;
        let timeout = options.command_timeout;
        let context = format!("connecting to Redis at {address}");
        let watch = Arc::new(ServerWatch::new(address.clone()));
        let checks = CheckOptions {
            allow_eviction: options.allow_eviction,
        };
        // Boxed (it runs once per provider): unboxed, the nested connect futures of both
        // client libraries overflow the compiler's query depth limit under clippy.
        let connecting = Box::pin(async {
            let transport = connect_transport(client, &options, target, &tls, watch.clone())
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
                client,
                watch,
                clock,
                replica_acks: options
                    .replica_acks
                    .map(|(replicas, timeout)| AckWait::new(replicas, timeout)),
                one_server,
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
    if let Some((replicas, timeout)) = options.replica_acks {
        if replicas == 0 {
            return config(
                "`replica_acks` needs at least one replica (leave it unset to not wait)".to_owned(),
            );
        }
        if timeout.is_zero() || timeout >= options.command_timeout {
            return config(format!(
                "the `replica_acks` timeout must be above zero and below the command timeout                  ({:?}, got {timeout:?}): the `WAIT` shares the write's round trip, which the                  command timeout bounds",
                options.command_timeout
            ));
        }
    }
    if options.pool_size > MAX_POOL_SIZE {
        return config(format!(
            "the pool size must be at most {MAX_POOL_SIZE} connections (got {}): each is a \
             multiplexed connection, so a few serve thousands of concurrent calls",
            options.pool_size
        ));
    }
    Ok(())
}

/// The client library for `target`: the shared client's, or the chosen one.
fn client_for(options: &Options, target: &Target) -> Result<Client, BackendError> {
    let fixed = match target {
        #[cfg(feature = "redis-client")]
        Target::RedisClient(_) => Some(Client::RedisRs),
        #[cfg(feature = "fred")]
        Target::FredClients(_) => Some(Client::Fred),
        _ => None,
    };
    match fixed {
        Some(fixed) if options.client_chosen && options.client != fixed => Err(BackendError::new(
            BackendErrorKind::Config,
            format!(
                "the provider was built from a {fixed:?} client, but `client({:?})` was asked for",
                options.client
            ),
        )),
        #[cfg(feature = "fred")]
        Some(Client::Fred) if options.pool_size != 1 => Err(BackendError::new(
            BackendErrorKind::Config,
            "`pool_size` does not apply to shared fred clients: coord sends its commands on the \
             clients it was given (build it from a fred `Pool` to spread them)"
                .to_owned(),
        )),
        Some(fixed) => Ok(fixed),
        None => Ok(options.client),
    }
}

async fn connect_transport(
    client: Client,
    options: &Options,
    target: Target,
    tls: &TlsMaterial,
    watch: Arc<ServerWatch>,
) -> Result<Arc<dyn Transport>, Fault> {
    match client {
        #[cfg(feature = "redis-client")]
        Client::RedisRs => crate::transport::redis_rs::connect(options, target, tls, watch).await,
        #[cfg(feature = "fred")]
        Client::Fred => crate::transport::fred_client::connect(options, target, tls, watch).await,
    }
}

impl RedisProvider {
    /// Connects to one Redis server at `url` with the default options: TCP
    /// (`redis://[user[:password]@]host[:port][/db]`), TLS (`rediss://...`, trusting the
    /// system's CA store) or a Unix socket (`unix:///path/to/redis.sock[?db=N]`). See the
    /// crate documentation's "Connecting" section for every form, and
    /// [`RedisProvider::builder`] for the options.
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

    /// A builder for one server at `url` (any form [`RedisProvider::connect`] takes).
    pub fn builder(url: impl Into<String>) -> RedisProviderBuilder {
        RedisProviderBuilder::new(Topology::Standalone(url.into()))
    }

    /// A builder for the master named `master_name`, found through the Sentinel nodes at
    /// `sentinels` (URLs or `host:port`, default port 26379; `rediss://` for Sentinels that
    /// speak TLS; a password in the URL is the Sentinels' own). Every Sentinel URL must use the
    /// same scheme and credentials. The data nodes' credentials, database and TLS come from
    /// [`data_node_credentials`](RedisProviderBuilder::data_node_credentials),
    /// [`database`](RedisProviderBuilder::database) and
    /// [`data_node_tls`](RedisProviderBuilder::data_node_tls) (TLS by default as the
    /// Sentinels). The provider follows a failover
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

    /// A builder for Redis Cluster, discovered from `seeds` (any reachable node is enough;
    /// `rediss://` for a cluster that speaks TLS, whose nodes must then announce their TLS
    /// ports, as `tls-cluster yes` does). Every seed URL must use the same scheme and
    /// credentials, which apply to every node. All keys of one call key share a hash slot,
    /// so no command crosses slots.
    pub fn cluster<I, S>(seeds: I) -> RedisProviderBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisProviderBuilder::new(Topology::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ))
    }

    /// A builder for the server an application's own redis-rs [`redis::Client`] points at,
    /// with everything that client holds: address (TCP or Unix socket), ACL user and
    /// password, database, and TLS settings (certificates and all, as built with
    /// `redis::Client::build_with_tls`).
    ///
    /// A `redis::Client` holds settings, not connections: coord opens its own from it, the
    /// same as from a URL (`pool_size` multiplexed connections, plus one subscriber
    /// connection the first time a call waits), spoken in RESP3 whatever the client's
    /// protocol setting (waits need RESP3 push messages). Everything the provider promises
    /// holds unchanged, one send per command included. The TLS builder methods do not apply
    /// (the client has its own): `connect` refuses them.
    #[cfg(feature = "redis-client")]
    pub fn from_redis_client(client: redis::Client) -> RedisProviderBuilder {
        RedisProviderBuilder::new(Topology::RedisClient(client))
    }

    /// A builder that sends coord's commands on an application's own fred client (one
    /// server, Sentinel or Cluster, as that client is configured), sharing its connections
    /// rather than opening more. Connect the client (`init()`) before calling `connect`,
    /// which waits at most one command timeout for it.
    ///
    /// What coord adds and needs:
    /// * **One subscriber connection**, built from the client's configuration (address,
    ///   credentials, TLS), the first time a call waits: a connection in subscribe mode
    ///   cannot carry other commands under RESP2.
    /// * **One write attempt per command.** Each command is sent with fred's per-command
    ///   options (one attempt, no redirection followed, the command timeout), whatever the
    ///   client's own `max_command_attempts` says, so coord's single-send promise holds on a
    ///   shared client too. The application's own commands keep the client's settings.
    /// * **Scripts** are loaded into the server's script cache on first use (`EVAL` once
    ///   after `NOSCRIPT`), as with any connection.
    /// * **RESP2 or RESP3**: either works.
    ///
    /// What differs from a provider that owns its clients: after a command times out, coord
    /// does not replace the client (it is the application's), so the next call may queue
    /// behind a reply that never comes until fred notices the connection is gone; dropping
    /// the provider leaves the client connected. `pool_size` does not apply (refused), and
    /// neither do the TLS builder methods (the client has its own settings).
    #[cfg(feature = "fred")]
    pub fn from_fred_client(client: fred::clients::Client) -> RedisProviderBuilder {
        RedisProviderBuilder::new(Topology::FredClients(vec![client]))
    }

    /// Like [`from_fred_client`](Self::from_fred_client), spreading coord's commands
    /// round-robin over every client of an application's fred pool. Connect the pool first.
    #[cfg(feature = "fred")]
    pub fn from_fred_pool(pool: &fred::clients::Pool) -> RedisProviderBuilder {
        RedisProviderBuilder::new(Topology::FredClients(pool.clients().to_vec()))
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
    use coord_core::provider::OwnerToken;

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
