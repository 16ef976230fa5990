//! The transport over the `redis` crate (redis-rs).
//!
//! * One server, or the master Sentinel names: a pool of multiplexed connections, each in a
//!   [`Slot`] that dials on demand. A connection that the client reports disconnected, or
//!   that fails, times out or finds itself on a replica (`READONLY`, after a failover), is
//!   dropped, and the next call dials again (asking Sentinel again, where there is one). The
//!   call that dials is bounded by the command timeout as a whole; a call on a live
//!   connection is bounded by the client's response timeout, with no timer of our own.
//!   Plain TCP and Unix-socket connections are dialled here, on a socket that counts what it
//!   wrote and refuses to write once the server has closed its end ([`wire`](super::wire)): a
//!   command that failed because its connection was closed, and of which provably no byte was
//!   written, is sent once more on a fresh connection (the first command after `CLIENT KILL`
//!   or a restart). A command that may have reached the server is never sent again.
//! * Cluster: a pool of cluster connections (slot routing and node connections are
//!   redis-rs's), each call under one command timeout. redis-rs's own retries are off (it
//!   would resend a command whose connection dropped after sending it); replies that prove a
//!   command was not executed (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`) are resent here, within the
//!   same timeout. A cluster connection whose call failed or timed out is dropped and the
//!   next call dials a new one.
//!
//! Every new connection is checked with `INFO server` before use: a changed run id means
//! the server restarted, which the [`ServerWatch`] logs and counts.
//!
//! The subscriber is a dedicated RESP3 connection (to the server, to the current master, or
//! to the first reachable seed of a cluster, which sees every node's publications), redialled
//! in the background whenever it drops.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use coord_core::provider::BoxFuture;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    ProtocolVersion, PushInfo, PushKind, RedisConnectionInfo, RedisError, Value,
};
#[cfg(feature = "tls")]
use redis::{ClientTlsConfig, TlsCertificates, TlsMode};
use tokio::sync::watch;

use super::wire::{Watched, Wire};
use super::{
    Command, ErrorCode, Fault, NodeReplies, Reply, SendWatch, ServerError, Subscriber,
    SubscriberEvents, Transport, boxed_in_place,
};
use crate::config::{Address, Options, Place, Target, TlsMaterial};
use crate::server_checks::{ServerWatch, info_server};

/// Connects as `options` say, to `target`, reporting every node's run id to `watch`.
pub(crate) async fn connect(
    options: &Options,
    target: Target,
    tls: &TlsMaterial,
    watch: Arc<ServerWatch>,
) -> Result<Arc<dyn Transport>, Fault> {
    let timeout = options.command_timeout;
    let size = options.pool_size;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let direct = |client: redis::Client| async {
        let dialer = Arc::new(Dialer::Direct(Box::new(client.clone())));
        let slots = Slot::pool(&dialer, &config, timeout, size, &watch);
        // Connect once now, so a wrong address or password fails at connect time.
        for slot in &slots {
            slot.connection().await?;
        }
        Ok::<_, Fault>(RedisRs {
            conns: Conns::Slots(slots),
            next: AtomicUsize::new(0),
            pubsub: PubSubSource::Direct(vec![client]),
            timeout,
        })
    };
    let transport = match target {
        Target::Standalone(address) => direct(client_for(&address, tls)?).await?,
        Target::RedisClient(client) => direct(client).await?,
        Target::Cluster(seeds) => {
            let infos = seeds
                .iter()
                .map(connection_info)
                .collect::<Result<Vec<_>, _>>()?;
            #[allow(unused_mut)]
            let mut builder = ClusterClient::builder(infos)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                // No resends inside redis-rs: after an I/O error it would send the command
                // again, though the first send may have been executed. Redirects come back
                // to `ClusterSlot::exec`, which follows the ones that prove non-execution.
                .retries(0);
            #[cfg(feature = "tls")]
            if seeds[0].tls() {
                crate::config::ensure_crypto_provider();
                builder = builder.certs(certificates(tls));
            }
            let client = Arc::new(builder.build().map_err(fault)?);
            let pool: Vec<ClusterSlot> = (0..size)
                .map(|_| ClusterSlot::new(&client, timeout, &watch))
                .collect();
            // Connect once now, so a wrong setup fails at connect time.
            for slot in &pool {
                slot.connection().await?;
            }
            let direct = seeds
                .iter()
                .map(|seed| client_for(seed, tls))
                .collect::<Result<Vec<_>, _>>()?;
            RedisRs {
                conns: Conns::Cluster(pool),
                next: AtomicUsize::new(0),
                pubsub: PubSubSource::Direct(direct),
                timeout,
            }
        }
        Target::Sentinel {
            master,
            sentinels,
            data,
        } => {
            let addrs = sentinels
                .iter()
                .map(|s| connection_addr(&s.place))
                .collect::<Vec<_>>();
            let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
                .map_err(fault)?;
            let first = &sentinels[0];
            if let Some(user) = &first.username {
                builder = builder.set_client_to_sentinel_username(user);
            }
            if let Some(password) = &first.password {
                builder = builder.set_client_to_sentinel_password(password);
            }
            if let Some(user) = &data.username {
                builder = builder.set_client_to_redis_username(user);
            }
            if let Some(password) = &data.password {
                builder = builder.set_client_to_redis_password(password);
            }
            if let Some(db) = data.database {
                builder = builder.set_client_to_redis_db(db.into());
            }
            #[cfg(feature = "tls")]
            {
                if first.tls() || data.tls {
                    crate::config::ensure_crypto_provider();
                }
                if first.tls() {
                    builder = builder
                        .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                        .set_client_to_sentinel_certificates(certificates(tls));
                }
                if data.tls {
                    builder = builder
                        .set_client_to_redis_tls_mode(TlsMode::Secure)
                        .set_client_to_redis_certificates(certificates(tls));
                }
            }
            let sentinel = builder.build().map_err(fault)?;
            let shared = Arc::new(SentinelShared {
                sentinel: tokio::sync::Mutex::new(sentinel),
            });
            let dialer = Arc::new(Dialer::Sentinel(shared.clone()));
            let slots = Slot::pool(&dialer, &config, timeout, size, &watch);
            // Resolve and connect once now, so a wrong setup fails at connect time.
            slots[0].connection().await?;
            RedisRs {
                conns: Conns::Slots(slots),
                next: AtomicUsize::new(0),
                pubsub: PubSubSource::Sentinel(shared),
                timeout,
            }
        }
        #[cfg(feature = "fred")]
        Target::FredClients(_) => {
            return Err(Fault::Config(
                "a fred client cannot be used with the redis-rs transport".to_owned(),
            ));
        }
    };
    Ok(Arc::new(transport))
}

/// redis-rs's address for `place` (TLS settings are added by [`client_for`]).
fn connection_addr(place: &Place) -> ConnectionAddr {
    match place {
        Place::Tcp {
            host,
            port,
            tls: false,
        } => ConnectionAddr::Tcp(host.clone(), *port),
        Place::Tcp {
            host,
            port,
            tls: true,
        } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: false,
            tls_params: None,
        },
        Place::Unix(path) => ConnectionAddr::Unix(path.clone()),
    }
}

/// Address, credentials and database of `address`, as redis-rs takes them.
fn connection_info(address: &Address) -> Result<ConnectionInfo, Fault> {
    let mut redis = RedisConnectionInfo::default();
    if let Some(user) = &address.username {
        redis = redis.set_username(user);
    }
    if let Some(password) = &address.password {
        redis = redis.set_password(password);
    }
    if let Some(db) = address.database {
        redis = redis.set_db(db.into());
    }
    Ok(connection_addr(&address.place)
        .into_connection_info()
        .map_err(fault)?
        .set_redis_settings(redis))
}

/// A redis-rs client for `address`, with the TLS certificates when it uses TLS.
fn client_for(
    address: &Address,
    #[allow(unused)] tls: &TlsMaterial,
) -> Result<redis::Client, Fault> {
    let info = connection_info(address)?;
    #[cfg(feature = "tls")]
    if address.tls() {
        crate::config::ensure_crypto_provider();
        return redis::Client::build_with_tls(info, certificates(tls)).map_err(fault);
    }
    redis::Client::open(info).map_err(fault)
}

/// The certificates in redis-rs's form; none given means the system's roots, no client
/// certificate.
#[cfg(feature = "tls")]
fn certificates(tls: &TlsMaterial) -> TlsCertificates {
    TlsCertificates {
        client_tls: tls.client.as_ref().map(|(cert, key)| ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        root_cert: tls.ca.clone(),
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
    Cluster(Vec<ClusterSlot>),
}

enum PubSubSource {
    /// Try these in order.
    Direct(Vec<redis::Client>),
    /// Whatever master Sentinel names.
    Sentinel(Arc<SentinelShared>),
}

impl Transport for RedisRs {
    fn run<'a>(&'a self, cmds: &'a [Command<'a>]) -> BoxFuture<'a, Result<Vec<Reply>, Fault>> {
        // Each kind of connection boxes only its own future: the one-server path's is the
        // smaller, and it is moved into the box on every command.
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.conns {
            Conns::Slots(pool) => boxed_in_place(|| pool[i % pool.len()].exec(cmds)),
            Conns::Cluster(pool) => boxed_in_place(|| pool[i % pool.len()].exec(cmds)),
        }
    }

    fn run_noting_sent<'a>(
        &'a self,
        cmds: &'a [Command<'a>],
        watch: SendWatch,
    ) -> BoxFuture<'a, Result<Vec<Reply>, Fault>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.conns {
            Conns::Slots(pool) => Box::pin(pool[i % pool.len()].exec_noting_sent(cmds, watch)),
            // A cluster connection's sockets are redis-rs's own: told when answered.
            Conns::Cluster(pool) => Box::pin(async move {
                let replies = pool[i % pool.len()].exec(cmds).await;
                drop(watch);
                replies
            }),
        }
    }

    fn each_node<'a>(&'a self, cmd: Command<'a>) -> BoxFuture<'a, Result<NodeReplies, Fault>> {
        Box::pin(async move {
            match &self.conns {
                Conns::Slots(pool) => {
                    let slot = &pool[0];
                    let result = slot.exec(&[cmd]).await;
                    let node = slot.node();
                    match result {
                        Ok(mut replies) => {
                            let reply = replies.pop().ok_or_else(|| {
                                Fault::Protocol("no reply to a single command".to_owned())
                            })?;
                            Ok(vec![(node, Ok(reply))])
                        }
                        Err(Fault::Server(err)) => Ok(vec![(node, Err(Fault::Server(err)))]),
                        Err(other) => Err(other),
                    }
                }
                Conns::Cluster(pool) => {
                    let slot = &pool[0];
                    let asked = async {
                        let (_, mut conn) = slot.connection().await?;
                        all_masters(&mut conn, &cmd).await
                    };
                    match tokio::time::timeout(self.timeout, asked).await {
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
        // RESP3 sends `INFO` as a verbatim string.
        Value::VerbatimString { text, .. } => Reply::Data(text.into_bytes()),
        // RESP3 sends `CONFIG GET` as a map: flattened as RESP2 sends it.
        Value::Map(pairs) => Reply::Array(
            pairs
                .into_iter()
                .flat_map(|(k, v)| [reply(k), reply(v)])
                .collect::<Result<_, _>>()?,
        ),
        Value::Okay => Reply::Data(b"OK".to_vec()),
        // Under RESP3 a script's `false` arrives as a boolean (RESP2 sent nil) and `true`
        // as a boolean (RESP2 sent 1).
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(reply).collect::<Result<_, _>>()?)
        }
        Value::ServerError(err) => return Err(server_error(&err)),
        other => return Err(Fault::Protocol(format!("unexpected reply {other:?}"))),
    })
}

/// An error reply, as redis-rs hands it over (code and details apart).
fn server_error(err: &redis::ServerError) -> Fault {
    Fault::Server(ServerError::new(err.code(), err.details().unwrap_or("")))
}

fn fault(err: RedisError) -> Fault {
    // An error reply, whether redis-rs knows its code or not. A pipeline reports its first
    // failing command.
    if err.code().is_some() || err.kind() == ErrorKind::Extension {
        if let Some(errors) = err.clone().into_server_errors()
            && let Some((_, first)) = errors.first()
        {
            return server_error(first);
        }
        if let Some(code) = err.code() {
            return Fault::Server(ServerError::new(code, err.detail().unwrap_or("")));
        }
    }
    if err.is_timeout() {
        return Fault::Timeout(err.to_string());
    }
    match err.kind() {
        ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed => {
            Fault::Config(err.to_string())
        }
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => Fault::Protocol(err.to_string()),
        // An error kind for replies, without a reply in it.
        ErrorKind::Extension | ErrorKind::Server(_) => Fault::Protocol(err.to_string()),
        _ => Fault::Unavailable(err.to_string()),
    }
}

/// Whether a connection that produced `fault` should be replaced: it broke, hangs, is no
/// longer on the master (Sentinel), or gave a reply the client could not read. After an
/// unreadable reply the connection's replies may no longer line up with its requests, and a
/// later reply of the right type could answer the wrong command: a new connection costs a
/// dial, a misaligned one could hand one key's answer to another.
fn stale(fault: &Fault) -> bool {
    match fault {
        Fault::Unavailable(_) | Fault::NotSent(_) | Fault::Timeout(_) | Fault::Protocol(_) => true,
        Fault::Server(err) => matches!(
            err.code(),
            ErrorCode::ReadOnly | ErrorCode::MasterDown | ErrorCode::Loading
        ),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Connection slots

/// Where a slot's connections come from.
enum Dialer {
    Direct(Box<redis::Client>),
    Sentinel(Arc<SentinelShared>),
}

impl Dialer {
    async fn client(&self) -> Result<redis::Client, Fault> {
        match self {
            Dialer::Direct(client) => Ok((**client).clone()),
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
type Current = Mutex<Option<Live>>;

/// One live connection of a slot: the dial that made it, the connection, and (for a socket
/// dialled here) what its socket wrote.
#[derive(Clone)]
struct Live {
    generation: u64,
    conn: MultiplexedConnection,
    wire: Option<Arc<Wire>>,
    /// Stops the connection's driver once the last clone is gone (connections dialled here;
    /// redis-rs's own dial manages its driver itself).
    _driver: Option<Arc<DriverGuard>>,
}

/// Aborts a connection's driver task when dropped.
struct DriverGuard(tokio::task::AbortHandle);

impl Drop for DriverGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Dials `client`'s address here when it is plain TCP or a Unix socket (so its writes can be
/// watched), else through redis-rs. Bounded by the connection timeout in `config`, as
/// redis-rs's own dial is.
async fn dial(
    client: &redis::Client,
    config: &AsyncConnectionConfig,
    timeout: Duration,
) -> Result<Live, Fault> {
    let info = client.get_connection_info();
    let watched = async {
        let (conn, wire, driver) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let socket = tokio::net::TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| Fault::Unavailable(format!("connecting to {host}:{port}: {e}")))?;
                // As redis-rs dials (Nagle's algorithm on unless the client's settings turn
                // it off): with many tasks on one connection, the commands written while
                // earlier ones are unacknowledged leave in one segment. With it off, every
                // command was a segment of its own, and the client and the server each spent
                // about twice the CPU per lock pair of the same commands by hand at 16 tasks.
                socket
                    .set_nodelay(info.tcp_settings().nodelay())
                    .map_err(|e| Fault::Unavailable(e.to_string()))?;
                let (stream, wire) = Watched::new(socket);
                let (conn, driver) = MultiplexedConnection::new_with_config(
                    info.redis_settings(),
                    stream,
                    config.clone(),
                )
                .await
                .map_err(fault)?;
                (conn, wire, tokio::spawn(driver))
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let socket = tokio::net::UnixStream::connect(path).await.map_err(|e| {
                    Fault::Unavailable(format!("connecting to {}: {e}", path.display()))
                })?;
                let (stream, wire) = Watched::new(socket);
                let (conn, driver) = MultiplexedConnection::new_with_config(
                    info.redis_settings(),
                    stream,
                    config.clone(),
                )
                .await
                .map_err(fault)?;
                (conn, wire, tokio::spawn(driver))
            }
            _ => {
                let conn = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map_err(fault)?;
                return Ok(Live {
                    generation: 0,
                    conn,
                    wire: None,
                    _driver: None,
                });
            }
        };
        Ok::<_, Fault>(Live {
            generation: 0,
            conn,
            wire: Some(wire),
            _driver: Some(Arc::new(DriverGuard(driver.abort_handle()))),
        })
    };
    match tokio::time::timeout(timeout, watched).await {
        Ok(dialled) => dialled,
        Err(_) => Err(Fault::Timeout("no connection in time".to_owned())),
    }
}

/// One multiplexed connection, dialled on demand and dropped when it goes bad.
struct Slot {
    dialer: Arc<Dialer>,
    config: AsyncConnectionConfig,
    timeout: Duration,
    /// Shared with the connection's disconnect callback, which empties it.
    current: Arc<Current>,
    generation: AtomicU64,
    dialing: tokio::sync::Mutex<()>,
    /// `host:port` of the node the latest connection went to.
    node: Mutex<String>,
    watch: Arc<ServerWatch>,
}

impl Slot {
    fn pool(
        dialer: &Arc<Dialer>,
        config: &AsyncConnectionConfig,
        timeout: Duration,
        size: usize,
        watch: &Arc<ServerWatch>,
    ) -> Vec<Slot> {
        (0..size)
            .map(|_| Slot {
                dialer: dialer.clone(),
                config: config.clone(),
                timeout,
                current: Arc::default(),
                generation: AtomicU64::new(0),
                dialing: tokio::sync::Mutex::new(()),
                node: Mutex::new(String::new()),
                watch: watch.clone(),
            })
            .collect()
    }

    fn node(&self) -> String {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn cached(&self) -> Option<Live> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn connection(&self) -> Result<Live, Fault> {
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
        let node = client.get_connection_info().addr().to_string();
        let mut live = dial(&client, &config, self.timeout).await?;
        live.generation = generation;
        // A new connection: is it still the same server process as before?
        match exec(&mut live.conn, &[info_server()]).await {
            Ok(replies) => {
                if let Some(info) = replies.first() {
                    self.watch.observe_info(&node, info);
                }
            }
            // `INFO` refused (an ACL): this node's restarts go unnoticed, commands still work.
            Err(Fault::Server(err)) => {
                tracing::debug!(node, error = %err, "coord-redis: INFO server refused");
            }
            Err(other) => return Err(other),
        }
        *self.node.lock().unwrap_or_else(|e| e.into_inner()) = node;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
        Ok(live)
    }

    async fn exec(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let Some(mut live) = self.cached() else {
            // Rare (the first call, or the first after a fault): boxed, so the common path's
            // future stays small.
            return Box::pin(self.dial_and_exec(cmds)).await;
        };
        let written = live.wire.as_ref().map(|wire| wire.written());
        let result = exec(&mut live.conn, cmds).await;
        if let Err(Fault::Unavailable(why)) = &result
            && let (Some(wire), Some(before)) = (&live.wire, written)
            && wire.written() == before
        {
            // The connection broke, and not one byte went out on it since this command was
            // handed over: the server never saw the command. Sent once more, on a fresh
            // connection (a failure there is final).
            tracing::debug!(error = %why, "coord-redis: the connection was closed before the command was written; sending it on a new connection");
            forget(&self.current, live.generation);
            return Box::pin(self.dial_and_exec(cmds)).await;
        }
        self.check(live.generation, result)
    }

    /// [`Slot::exec`], telling `watch.notice` once the kernel accepted the whole request, on
    /// a socket dialled here (whose writes are seen); otherwise, or when the request goes out
    /// on a connection dialled for it, once it is answered.
    async fn exec_noting_sent(
        &self,
        cmds: &[Command<'_>],
        watch: SendWatch,
    ) -> Result<Vec<Reply>, Fault> {
        let (mut live, wire) = match self.cached() {
            Some(live) => match live.wire.clone() {
                Some(wire) => (live, wire),
                None => {
                    let replies = self.exec(cmds).await;
                    drop(watch);
                    return replies;
                }
            },
            None => {
                let replies = Box::pin(self.dial_and_exec(cmds)).await;
                drop(watch);
                return replies;
            }
        };
        let before = wire.written();
        let id = wire.watch(watch.needle, watch.tail, watch.notice);
        let result = exec(&mut live.conn, cmds).await;
        // `None`: told already. Otherwise dropped once this request is answered below.
        let untold = wire.unwatch(id);
        if let Err(Fault::Unavailable(why)) = &result
            && wire.written() == before
        {
            // As in `exec`: not one byte went out, so it is sent once more on a new connection.
            tracing::debug!(error = %why, "coord-redis: the connection was closed before the command was written; sending it on a new connection");
            forget(&self.current, live.generation);
            let replies = Box::pin(self.dial_and_exec(cmds)).await;
            drop(untold);
            return replies;
        }
        drop(untold);
        self.check(live.generation, result)
    }

    /// Dials (unless another call just did) and sends `cmds`; both under one command timeout.
    async fn dial_and_exec(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let dialled = async {
            let mut live = self.connection().await?;
            let result = exec(&mut live.conn, cmds).await;
            Ok::<_, Fault>((live.generation, result))
        };
        let (generation, result) = match tokio::time::timeout(self.timeout, dialled).await {
            Ok(outcome) => outcome?,
            Err(_) => return Err(Fault::Timeout("no connection in time".to_owned())),
        };
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
    if current
        .as_ref()
        .is_some_and(|live| live.generation == generation)
    {
        *current = None;
    }
}

fn forget_cluster(current: &Mutex<Option<(u64, ClusterConnection)>>, generation: u64) {
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    if current.as_ref().is_some_and(|(g, _)| *g == generation) {
        *current = None;
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster connections

/// One cluster connection, dialled on demand and dropped after a call on it failed or timed
/// out (redis-rs keeps reusing a node connection whose reply is stuck; a new cluster
/// connection starts with new node connections).
struct ClusterSlot {
    client: Arc<ClusterClient>,
    timeout: Duration,
    current: Mutex<Option<(u64, ClusterConnection)>>,
    generation: AtomicU64,
    dialing: tokio::sync::Mutex<()>,
    watch: Arc<ServerWatch>,
}

impl ClusterSlot {
    fn new(client: &Arc<ClusterClient>, timeout: Duration, watch: &Arc<ServerWatch>) -> Self {
        ClusterSlot {
            client: client.clone(),
            timeout,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
            dialing: tokio::sync::Mutex::new(()),
            watch: watch.clone(),
        }
    }

    fn cached(&self) -> Option<(u64, ClusterConnection)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn connection(&self) -> Result<(u64, ClusterConnection), Fault> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let _dialing = self.dialing.lock().await;
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let mut conn = self.client.get_async_connection().await.map_err(fault)?;
        // New node connections: did any master restart since we last looked?
        match all_masters(&mut conn, &info_server()).await {
            Ok(nodes) => {
                for (node, info) in nodes {
                    match info {
                        Ok(info) => {
                            self.watch.observe_info(&node, &info);
                        }
                        Err(err) => {
                            tracing::debug!(node, error = ?err, "coord-redis: INFO server failed");
                        }
                    }
                }
            }
            Err(err) => tracing::debug!(error = ?err, "coord-redis: INFO server failed"),
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    async fn exec(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut used = None;
        let attempt = async {
            let (generation, mut conn) = self.connection().await?;
            used = Some(generation);
            let mut pause = Duration::from_millis(5);
            loop {
                match exec(&mut conn, cmds).await {
                    // Refused without being executed, and redis-rs is refreshing its slot
                    // map: sending it again cannot run it twice.
                    Err(f)
                        if f.not_executed() && tokio::time::Instant::now() + pause < deadline =>
                    {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(100));
                    }
                    other => return other,
                }
            }
        };
        let result = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => Err(Fault::Timeout("no answer from the cluster".to_owned())),
        };
        if let (Err(f), Some(generation)) = (&result, used)
            && stale(f)
        {
            forget_cluster(&self.current, generation);
        }
        result
    }
}

/// Sends `cmd` to every master, answering per node.
async fn all_masters(
    conn: &mut ClusterConnection,
    cmd: &Command<'_>,
) -> Result<NodeReplies, Fault> {
    let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let value = conn
        .route_command(to_cmd(cmd), routing)
        .await
        .map_err(fault)?;
    let Value::Map(pairs) = value else {
        return Err(Fault::Protocol(format!(
            "unexpected reply {value:?} from all masters"
        )));
    };
    Ok(pairs
        .into_iter()
        .map(|(node, value)| {
            let node = match node {
                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                Value::SimpleString(s) => s,
                other => format!("{other:?}"),
            };
            (node, reply(value))
        })
        .collect())
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
