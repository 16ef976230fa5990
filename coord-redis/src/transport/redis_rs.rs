//! The transport over the `redis` crate (redis-rs).
//!
//! * One server, or the master Sentinel names: a pool of multiplexed connections, each in a
//!   [`Slot`] that dials on demand. A connection that the client reports disconnected, or
//!   that fails, times out or finds itself on a replica (`READONLY`, after a failover), is
//!   dropped, and the next call dials again (asking Sentinel again, where there is one). The
//!   call that dials is bounded by the command timeout as a whole; a call on a live
//!   connection is bounded by the client's response timeout, with no timer of our own.
//! * Cluster: a pool of cluster connections (slot routing, redirects and reconnects are
//!   redis-rs's), each call under one command timeout.
//!
//! The subscriber is a dedicated RESP3 connection (to the server, to the current master, or
//! to the first reachable seed of a cluster, which sees every node's publications), redialled
//! in the background whenever it drops.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use coord_core::BoxFuture;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ErrorKind, ProtocolVersion, PushInfo, PushKind, RedisConnectionInfo,
    RedisError, Value,
};
use tokio::sync::watch;

use super::{Command, Fault, Reply, Subscriber, SubscriberEvents, Transport};
use crate::config::{Options, Topology};

/// Connects as `options` say.
pub(crate) async fn connect(options: &Options) -> Result<Arc<dyn Transport>, Fault> {
    let timeout = options.command_timeout;
    let size = options.pool_size;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let transport = match &options.topology {
        Topology::Standalone(url) => {
            let client = redis::Client::open(with_scheme(url)).map_err(fault)?;
            let dialer = Arc::new(Dialer::Direct(client.clone()));
            let slots = Slot::pool(&dialer, &config, timeout, size);
            // Connect once now, so a wrong address or password fails at connect time.
            for slot in &slots {
                slot.connection().await?;
            }
            RedisRs {
                conns: Conns::Slots(slots),
                next: AtomicUsize::new(0),
                pubsub: PubSubSource::Direct(vec![client]),
                timeout,
            }
        }
        Topology::Cluster(seeds) => {
            let seeds: Vec<String> = seeds.iter().map(|s| with_scheme(s)).collect();
            let client = redis::cluster::ClusterClient::builder(seeds.clone())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(3)
                .min_retry_wait(10)
                .max_retry_wait(250)
                .build()
                .map_err(fault)?;
            let mut pool = Vec::with_capacity(size);
            for _ in 0..size {
                pool.push(client.get_async_connection().await.map_err(fault)?);
            }
            let direct = seeds
                .iter()
                .map(|s| redis::Client::open(s.as_str()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(fault)?;
            RedisRs {
                conns: Conns::Cluster(pool),
                next: AtomicUsize::new(0),
                pubsub: PubSubSource::Direct(direct),
                timeout,
            }
        }
        Topology::Sentinel { master, sentinels } => {
            let mut info = RedisConnectionInfo::default();
            if let Some(user) = &options.username {
                info = info.set_username(user);
            }
            if let Some(password) = &options.password {
                info = info.set_password(password);
            }
            if let Some(db) = options.database {
                info = info.set_db(db.into());
            }
            let node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
            let sentinel = SentinelClient::build(
                sentinels.iter().map(|s| with_scheme(s)).collect(),
                master.clone(),
                Some(node_info),
                SentinelServerType::Master,
            )
            .map_err(fault)?;
            let shared = Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(sentinel),
            });
            let dialer = Arc::new(Dialer::Sentinel(shared.clone()));
            let slots = Slot::pool(&dialer, &config, timeout, size);
            // Resolve and connect once now, so a wrong setup fails at connect time.
            slots[0].connection().await?;
            RedisRs {
                conns: Conns::Slots(slots),
                next: AtomicUsize::new(0),
                pubsub: PubSubSource::Sentinel(shared),
                timeout,
            }
        }
    };
    Ok(Arc::new(transport))
}

/// redis-rs wants a scheme; a bare `host:port` means plain `redis://`.
fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("redis://{url}")
    }
}

struct RedisRs {
    conns: Conns,
    next: AtomicUsize,
    pubsub: PubSubSource,
    timeout: Duration,
}

enum Conns {
    /// One server, or Sentinel's master.
    Slots(Vec<Slot>),
    Cluster(Vec<ClusterConnection>),
}

enum PubSubSource {
    /// Try these in order.
    Direct(Vec<redis::Client>),
    /// Whatever master Sentinel names.
    Sentinel(Arc<SentinelShared>),
}

impl Transport for RedisRs {
    fn run<'a>(&'a self, cmds: &'a [Command<'a>]) -> BoxFuture<'a, Result<Vec<Reply>, Fault>> {
        Box::pin(async move {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            match &self.conns {
                Conns::Slots(pool) => pool[i % pool.len()].exec(cmds).await,
                Conns::Cluster(pool) => {
                    let mut conn = pool[i % pool.len()].clone();
                    // Redirects and retries happen inside: bound the whole call.
                    match tokio::time::timeout(self.timeout, exec(&mut conn, cmds)).await {
                        Ok(result) => result,
                        Err(_) => Err(Fault::Timeout("no answer from the cluster".to_owned())),
                    }
                }
            }
        })
    }

    fn subscriber(&self, events: Arc<dyn SubscriberEvents>) -> Box<dyn Subscriber> {
        let (conn_tx, conn_rx) = watch::channel(None);
        let source = match &self.pubsub {
            PubSubSource::Direct(clients) => PubSubSource::Direct(clients.clone()),
            PubSubSource::Sentinel(shared) => PubSubSource::Sentinel(shared.clone()),
        };
        let task = tokio::spawn(run_subscriber(source, conn_tx, events, self.timeout));
        Box::new(RrSubscriber {
            conn: conn_rx,
            task,
        })
    }
}

fn to_cmd(cmd: &Command<'_>) -> redis::Cmd {
    let mut out = redis::Cmd::with_capacity(cmd.args().len() + 1, cmd.name.len() + cmd.arg_bytes());
    out.arg(cmd.name);
    for arg in cmd.args() {
        out.arg(*arg);
    }
    out
}

async fn exec<C: ConnectionLike>(conn: &mut C, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
    if let [one] = cmds {
        let value = to_cmd(one).query_async(conn).await.map_err(fault)?;
        return Ok(vec![reply(value)?]);
    }
    let mut pipe = redis::pipe();
    for cmd in cmds {
        pipe.add_command(to_cmd(cmd));
    }
    let values: Vec<Value> = pipe.query_async(conn).await.map_err(fault)?;
    values.into_iter().map(reply).collect()
}

fn reply(value: Value) -> Result<Reply, Fault> {
    Ok(match value {
        Value::Nil => Reply::Nil,
        Value::Int(i) => Reply::Int(i),
        Value::BulkString(data) => Reply::Data(data),
        Value::SimpleString(s) => Reply::Data(s.into_bytes()),
        Value::Okay => Reply::Data(b"OK".to_vec()),
        // Under RESP3 a script's `false` arrives as a boolean (RESP2 sent nil) and `true`
        // as a boolean (RESP2 sent 1).
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(reply).collect::<Result<_, _>>()?)
        }
        Value::ServerError(err) => {
            return Err(Fault::Server(format!(
                "{} {}",
                err.code(),
                err.details().unwrap_or("")
            )));
        }
        other => return Err(Fault::Protocol(format!("unexpected reply {other:?}"))),
    })
}

fn fault(err: RedisError) -> Fault {
    if let Some(code) = err.code() {
        return Fault::Server(format!("{code} {}", err.detail().unwrap_or("")));
    }
    if err.is_timeout() {
        return Fault::Timeout(err.to_string());
    }
    match err.kind() {
        ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed => {
            Fault::Config(err.to_string())
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => Fault::Protocol(err.to_string()),
        ErrorKind::Extension => {
            // An error reply with a code redis-rs does not know (`WRONGTYPE`, a script
            // error). Pipelines report their first failing command here.
            if let Some(errors) = err.clone().into_server_errors()
                && let Some((_, first)) = errors.first()
            {
                return Fault::Server(format!(
                    "{} {}",
                    first.code(),
                    first.details().unwrap_or("")
                ));
            }
            Fault::Server(err.to_string())
        }
        ErrorKind::Server(_) => Fault::Server(err.to_string()),
        _ => Fault::Unavailable(err.to_string()),
    }
}

/// Whether a connection that produced `fault` should be replaced (Sentinel): it broke, hangs,
/// or is no longer on the master.
fn stale(fault: &Fault) -> bool {
    match fault {
        Fault::Unavailable(_) | Fault::Timeout(_) => true,
        Fault::Server(text) => {
            let code = text.split_whitespace().next().unwrap_or("");
            matches!(code, "READONLY" | "MASTERDOWN" | "LOADING")
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Connection slots

/// Where a slot's connections come from.
enum Dialer {
    Direct(redis::Client),
    Sentinel(Arc<SentinelShared>),
}

impl Dialer {
    async fn client(&self) -> Result<redis::Client, Fault> {
        match self {
            Dialer::Direct(client) => Ok(client.clone()),
            Dialer::Sentinel(shared) => shared.master().await,
        }
    }
}

struct SentinelShared {
    sentinel: tokio::sync::Mutex<SentinelClient>,
}

impl SentinelShared {
    /// The master Sentinel names now (its role is checked by redis-rs before it is returned).
    async fn master(&self) -> Result<redis::Client, Fault> {
        self.sentinel
            .lock()
            .await
            .async_get_client()
            .await
            .map_err(fault)
    }
}

/// The connection a slot holds, tagged with the dial that made it.
type Current = Mutex<Option<(u64, MultiplexedConnection)>>;

/// One multiplexed connection, dialled on demand and dropped when it goes bad.
struct Slot {
    dialer: Arc<Dialer>,
    config: AsyncConnectionConfig,
    timeout: Duration,
    /// Shared with the connection's disconnect callback, which empties it.
    current: Arc<Current>,
    generation: AtomicU64,
    dialing: tokio::sync::Mutex<()>,
}

impl Slot {
    fn pool(
        dialer: &Arc<Dialer>,
        config: &AsyncConnectionConfig,
        timeout: Duration,
        size: usize,
    ) -> Vec<Slot> {
        (0..size)
            .map(|_| Slot {
                dialer: dialer.clone(),
                config: config.clone(),
                timeout,
                current: Arc::default(),
                generation: AtomicU64::new(0),
                dialing: tokio::sync::Mutex::new(()),
            })
            .collect()
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn connection(&self) -> Result<(u64, MultiplexedConnection), Fault> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let _dialing = self.dialing.lock().await;
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        // When the client sees the connection close (the server went away), the slot is
        // emptied at once: the next call dials instead of failing on a dead connection, so
        // the first call after a server restart works.
        let current: Weak<Current> = Arc::downgrade(&self.current);
        let config = self.config.clone().set_push_sender(move |push: PushInfo| {
            if push.kind == PushKind::Disconnection
                && let Some(current) = current.upgrade()
            {
                forget(&current, generation);
            }
            Ok::<(), std::convert::Infallible>(())
        });
        // RESP3: redis-rs reports a closed connection to the push sender only under RESP3.
        let client = resp3(&self.dialer.client().await?)?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(fault)?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    async fn exec(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let (generation, mut conn) = match self.cached() {
            Some(found) => found,
            // Dialling and the call share one command timeout.
            None => {
                let dialled = async {
                    let (generation, mut conn) = self.connection().await?;
                    let result = exec(&mut conn, cmds).await;
                    Ok::<_, Fault>((generation, result))
                };
                let (generation, result) = match tokio::time::timeout(self.timeout, dialled).await {
                    Ok(outcome) => outcome?,
                    Err(_) => return Err(Fault::Timeout("no connection in time".to_owned())),
                };
                return self.check(generation, result);
            }
        };
        let result = exec(&mut conn, cmds).await;
        self.check(generation, result)
    }

    /// Drops the connection when `result` says it is unusable.
    fn check(
        &self,
        generation: u64,
        result: Result<Vec<Reply>, Fault>,
    ) -> Result<Vec<Reply>, Fault> {
        if let Err(f) = &result
            && stale(f)
        {
            forget(&self.current, generation);
        }
        result
    }
}

fn forget(current: &Current, generation: u64) {
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    if current.as_ref().is_some_and(|(g, _)| *g == generation) {
        *current = None;
    }
}

// ---------------------------------------------------------------------------------------------
// Subscriber
//
// A RESP3 multiplexed connection whose push messages are handed to the waiter queues right
// in the connection's reader (no extra task in between, which keeps hand-offs short).

struct RrSubscriber {
    conn: watch::Receiver<Option<MultiplexedConnection>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RrSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RrSubscriber {
    async fn connection(&self) -> Result<MultiplexedConnection, Fault> {
        let mut rx = self.conn.clone();
        let found = rx
            .wait_for(|c| c.is_some())
            .await
            .map_err(|_| Fault::Unavailable("the subscriber connection stopped".to_owned()))?;
        Ok(found.clone().expect("waited for a connection"))
    }
}

impl Subscriber for RrSubscriber {
    fn subscribe<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, Result<(), Fault>> {
        Box::pin(async move {
            if channels.is_empty() {
                return Ok(());
            }
            let mut conn = self.connection().await?;
            conn.subscribe(channels).await.map_err(fault)
        })
    }

    fn unsubscribe<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, Result<(), Fault>> {
        Box::pin(async move {
            if channels.is_empty() {
                // (An empty UNSUBSCRIBE would mean "from everything".)
                return Ok(());
            }
            let mut conn = self.connection().await?;
            conn.unsubscribe(channels).await.map_err(fault)
        })
    }
}

/// The same server, spoken to in RESP3 (pub/sub messages arrive as pushes).
fn resp3(client: &redis::Client) -> Result<redis::Client, Fault> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings)).map_err(fault)
}

async fn open_subscriber(
    source: &PubSubSource,
    config: &AsyncConnectionConfig,
) -> Result<MultiplexedConnection, Fault> {
    let candidates = match source {
        PubSubSource::Direct(clients) => clients.clone(),
        PubSubSource::Sentinel(shared) => vec![shared.master().await?],
    };
    let mut last = Fault::Unavailable("no address to subscribe at".to_owned());
    for client in candidates {
        match resp3(&client)?
            .get_multiplexed_async_connection_with_config(config)
            .await
        {
            Ok(conn) => return Ok(conn),
            Err(err) => last = fault(err),
        }
    }
    Err(last)
}

/// Keeps one subscriber connection open, announcing reconnections.
async fn run_subscriber(
    source: PubSubSource,
    conn: watch::Sender<Option<MultiplexedConnection>>,
    events: Arc<dyn SubscriberEvents>,
    timeout: Duration,
) {
    let lost = Arc::new(tokio::sync::Notify::new());
    let config = {
        let (events, lost) = (events.clone(), lost.clone());
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_push_sender(move |push: PushInfo| {
                match push.kind {
                    PushKind::Message => match push.data.first() {
                        Some(Value::BulkString(channel)) => events.message(channel),
                        Some(Value::SimpleString(channel)) => events.message(channel.as_bytes()),
                        _ => {}
                    },
                    PushKind::Disconnection => lost.notify_one(),
                    _ => {}
                }
                Ok::<(), std::convert::Infallible>(())
            })
    };
    let mut connected_before = false;
    let mut pause = Duration::from_millis(10);
    loop {
        let opened = tokio::time::timeout(timeout, open_subscriber(&source, &config)).await;
        match opened {
            Ok(Ok(new_conn)) => {
                pause = Duration::from_millis(10);
                conn.send_replace(Some(new_conn));
                if connected_before {
                    events.resync();
                }
                connected_before = true;
                lost.notified().await;
                conn.send_replace(None);
                tracing::debug!("coord-redis: the subscriber connection closed; reconnecting");
            }
            Ok(Err(err)) => {
                tracing::debug!(error = ?err, "coord-redis: opening the subscriber connection failed");
            }
            Err(_) => tracing::debug!("coord-redis: opening the subscriber connection timed out"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
