//! The transport over the `fred` crate.
//!
//! A pool of fred clients (one per slot, round-robin) carries commands; fred handles
//! reconnection, Sentinel master discovery (and re-discovery after a failover: the demoted
//! master's clients are disconnected by Sentinel, and `READONLY` replies also trigger a
//! reconnect) and Cluster routing. Commands are sent as custom commands with an explicit key
//! position, so Cluster routing never depends on fred knowing the command.
//!
//! Each command is written once (`max_command_attempts = 1`): a command whose connection
//! closes while it is in flight fails instead of being sent again after the reconnect. A single
//! command that fred fails because it had no connection to route it to (the server closed the
//! connection and fred is making a new one: "Failed to route command.") was never written, and
//! is sent again within the same command timeout once fred has reconnected. A
//! command that times out leaves its client's connection behind: the slot is given a new
//! client (new connections), and the old one is closed in the background, so the next call
//! never queues behind the stuck reply.
//!
//! Every (re)connection fred reports is checked with `INFO server` on that node: a changed
//! run id means the server restarted, which the [`ServerWatch`] logs and counts.
//!
//! The subscriber is a fred subscriber client built from the same settings.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::provider::BoxFuture;
use fred::bytes::BytesMut;
use fred::clients::{Client as FredClient, Pipeline, SubscriberClient, WithOptions};
use fred::error::{Error, ErrorKind};
use fred::prelude::{
    Builder, ClientLike, Config, EventInterface, PubsubInterface, ReconnectPolicy, Server,
    ServerConfig, Value,
};
use fred::types::config::Options as FredOptions;
use fred::types::{ClusterHash, ConnectHandle, CustomCommand};
use tokio::sync::{broadcast, watch};

use super::{
    Command, Fault, NodeReplies, Reply, ServerError, Subscriber, SubscriberEvents, Transport,
    boxed_in_place,
};
use crate::config::{Address, Options, Place, Target, TlsMaterial, display_parts, display_socket};
use crate::server_checks::{ServerWatch, info_server};

/// Connects as `options` say, to `target`, reporting every node's run id to `watch`.
pub(crate) async fn connect(
    options: &Options,
    target: Target,
    tls: &TlsMaterial,
    watch: Arc<ServerWatch>,
) -> Result<Arc<dyn Transport>, Fault> {
    let timeout = options.command_timeout;
    if let Target::FredClients(clients) = target {
        return shared(clients, timeout, watch).await;
    }
    let config = config(&target, tls)?;
    let clustered = matches!(config.server, ServerConfig::Clustered { .. });
    let builder = make_builder(config.clone(), timeout);
    // A client that replaces one whose command timed out keeps trying to connect in the
    // background (no `fail_fast`): the server may well be away for a while.
    let replacements = make_builder(
        Config {
            fail_fast: false,
            ..config
        },
        timeout,
    );
    let mut slots = Vec::with_capacity(options.pool_size);
    for _ in 0..options.pool_size {
        let client = builder.build().map_err(fault)?;
        let watcher = watch_reconnections(&client, &watch, clustered);
        // With `fail_fast`, a failed first connection also stops fred's connection task.
        let driver = match client.init().await {
            Ok(driver) => driver,
            Err(err) => {
                watcher.abort();
                return Err(fault(err));
            }
        };
        slots.push(FredSlot {
            current: Mutex::new(Current {
                sender: Sender::Own(client.clone()),
                client,
                generation: 0,
                watcher,
                driver: Some(driver),
                owned: true,
            }),
            generations: AtomicU64::new(0),
        });
    }
    let subscriber = builder.build_subscriber_client().map_err(fault)?;
    Ok(Arc::new(Fred {
        slots,
        next: AtomicUsize::new(0),
        replacements: Some(replacements),
        subscriber: Some(subscriber),
        timeout,
        watch,
        clustered,
    }))
}

/// A transport over the application's own fred clients: commands go out on them (one write
/// attempt each, whatever the client's own settings), and one subscriber client is built
/// from the first one's settings.
async fn shared(
    clients: Vec<FredClient>,
    timeout: Duration,
    watch: Arc<ServerWatch>,
) -> Result<Arc<dyn Transport>, Fault> {
    let Some(first) = clients.first() else {
        return Err(Fault::Config("the fred pool has no client".to_owned()));
    };
    let clustered = first.is_clustered();
    let config = first.client_config();
    let mut slots = Vec::with_capacity(clients.len());
    for client in clients {
        let watcher = watch_reconnections(&client, &watch, clustered);
        match tokio::time::timeout(timeout, client.wait_for_connect()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                watcher.abort();
                return Err(fault(err));
            }
            Err(_) => {
                watcher.abort();
                return Err(Fault::Timeout(
                    "the fred client given to coord is not connected: connect it (`init()`) \
                     before building the provider"
                        .to_owned(),
                ));
            }
        }
        // Connected before the watcher listened: look at its nodes now.
        for server in client.active_connections() {
            observe(&client, server, &watch, clustered).await;
        }
        slots.push(FredSlot {
            current: Mutex::new(Current {
                sender: Sender::Shared(client.with_options(&command_options(timeout))),
                client,
                generation: 0,
                watcher,
                driver: None,
                owned: false,
            }),
            generations: AtomicU64::new(0),
        });
    }
    let subscriber = make_builder(
        Config {
            fail_fast: false,
            ..config
        },
        timeout,
    )
    .build_subscriber_client()
    .map_err(fault)?;
    Ok(Arc::new(Fred {
        slots,
        next: AtomicUsize::new(0),
        replacements: None,
        subscriber: Some(subscriber),
        timeout,
        watch,
        clustered,
    }))
}

/// What every command is sent with, whatever the client's own configuration says (a shared
/// client is the application's): one write attempt, no redirection followed (see
/// [`make_builder`]), and the command timeout.
fn command_options(timeout: Duration) -> FredOptions {
    FredOptions {
        max_attempts: Some(1),
        max_redirections: Some(0),
        timeout: Some(timeout),
        ..FredOptions::default()
    }
}

/// The builder every client of the transport comes from. Its clients' own configuration is
/// [`command_options`]: their commands go out as [`Sender::Own`], without per-command options.
fn make_builder(config: Config, timeout: Duration) -> Builder {
    let mut builder = Builder::from_config(config);
    builder
        .with_performance_config(|perf| {
            perf.default_command_timeout = timeout;
            // Messages are tiny; a deep buffer keeps a burst of releases from being dropped.
            perf.broadcast_channel_capacity = 4096;
        })
        .with_connection_config(|conn| {
            conn.connection_timeout = timeout;
            conn.internal_command_timeout = timeout;
            // One write per command. fred would otherwise write a command again after a
            // reconnect when its connection closed with the command in flight, though the
            // first write may have been executed: the caller could not tell, and the retry
            // could outlive the command timeout.
            conn.max_command_attempts = 1;
            // fred counts following a redirect as another write attempt, so it cannot follow
            // one here. It still refreshes its slot map on `MOVED`, then fails the command
            // with "too many redirections": the command was not executed, and `Fred::run`
            // sends it again, within the command timeout.
            conn.max_redirections = 0;
            conn.reconnect_errors = vec![
                fred::types::config::ReconnectError::ClusterDown,
                fred::types::config::ReconnectError::Loading,
                fred::types::config::ReconnectError::ReadOnly,
            ];
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 250, 2));
    builder
}

/// Checks the run id of every node `client` (re)connects to, for as long as the returned
/// task runs.
fn watch_reconnections(
    client: &FredClient,
    watch: &Arc<ServerWatch>,
    clustered: bool,
) -> tokio::task::JoinHandle<()> {
    // Subscribed before the client connects, so its first connection is seen too.
    let mut reconnects = client.reconnect_rx();
    let (client, watch) = (client.clone(), watch.clone());
    tokio::spawn(async move {
        loop {
            match reconnects.recv().await {
                Ok(server) => observe(&client, server, &watch, clustered).await,
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    })
}

/// Reads `server`'s run id and reports it to `watch`.
async fn observe(client: &FredClient, server: Server, watch: &ServerWatch, clustered: bool) {
    let node = server_name(&server);
    let (cmd, args) = custom(&info_server(), clustered);
    let info: Result<Value, Error> = if clustered {
        client.with_cluster_node(server).custom(cmd, args).await
    } else {
        client.custom(cmd, args).await
    };
    match info.map_err(fault).and_then(reply) {
        Ok(info) => {
            watch.observe_info(&node, &info);
        }
        Err(err) => {
            tracing::debug!(node, error = ?err, "coord-redis: INFO server failed");
        }
    }
}

fn config(target: &Target, #[allow(unused)] tls: &TlsMaterial) -> Result<Config, Fault> {
    let server = |a: &Address| match &a.place {
        Place::Tcp { host, port, .. } => Ok(Server::new(host.as_str(), *port)),
        Place::Unix(_) => Err(Fault::Config(
            "a Unix socket serves one server, not a Cluster or Sentinel".to_owned(),
        )),
    };
    let mut config = Config {
        fail_fast: true,
        ..Config::default()
    };
    let uses_tls = match target {
        Target::Standalone(a) => {
            config.server = match &a.place {
                Place::Tcp { .. } => ServerConfig::Centralized { server: server(a)? },
                Place::Unix(path) => ServerConfig::Unix { path: path.clone() },
            };
            config.username = a.username.clone();
            config.password = a.password.clone();
            config.database = a.database;
            a.tls()
        }
        Target::Cluster(seeds) => {
            config.username = seeds[0].username.clone();
            config.password = seeds[0].password.clone();
            config.server = ServerConfig::Clustered {
                hosts: seeds.iter().map(server).collect::<Result<_, _>>()?,
                policy: Default::default(),
            };
            seeds[0].tls()
        }
        Target::Sentinel {
            master,
            sentinels,
            data,
        } => {
            if sentinels[0].tls() != data.tls {
                return Err(Fault::Config(
                    "with the fred client, the Sentinels and the data nodes must both use TLS \
                     or both not: fred has one TLS setting for both"
                        .to_owned(),
                ));
            }
            config.server = ServerConfig::Sentinel {
                hosts: sentinels.iter().map(server).collect::<Result<_, _>>()?,
                service_name: master.clone(),
                username: sentinels[0].username.clone(),
                password: sentinels[0].password.clone(),
            };
            config.username = data.username.clone();
            config.password = data.password.clone();
            config.database = data.database;
            data.tls
        }
        #[cfg(feature = "redis-client")]
        Target::RedisClient(_) => {
            return Err(Fault::Config(
                "a redis-rs client cannot be used with the fred transport".to_owned(),
            ));
        }
        Target::FredClients(_) => unreachable!("shared clients are handled before"),
    };
    #[cfg(feature = "tls")]
    if uses_tls {
        let rustls = tls
            .rustls_config()
            .map_err(|e| Fault::Config(e.message().to_owned()))?;
        config.tls = Some(fred::types::config::TlsConfig {
            connector: fred::types::config::TlsConnector::from(rustls),
            hostnames: fred::types::config::TlsHostMapping::None,
        });
    }
    #[cfg(not(feature = "tls"))]
    let _ = uses_tls;
    Ok(config)
}

/// `host:port` of a node, or `unix:/path` for a socket (which fred names by its path).
fn server_name(server: &Server) -> String {
    if server.host.starts_with('/') {
        display_socket(std::path::Path::new(&*server.host))
    } else {
        display_parts(&server.host, server.port)
    }
}

struct Fred {
    slots: Vec<FredSlot>,
    next: AtomicUsize,
    /// Makes the clients that replace timed-out ones; `None` for the application's own
    /// clients, which are never replaced.
    replacements: Option<Builder>,
    subscriber: Option<SubscriberClient>,
    timeout: Duration,
    watch: Arc<ServerWatch>,
    clustered: bool,
}

/// One client of the pool, replaced after a command on it timed out.
struct FredSlot {
    current: Mutex<Current>,
    generations: AtomicU64,
}

struct Current {
    client: FredClient,
    /// What commands go out on: `client`, sent with [`command_options`].
    sender: Sender,
    generation: u64,
    watcher: tokio::task::JoinHandle<()>,
    /// fred's connection task for `client`.
    driver: Option<ConnectHandle>,
    /// Made by coord (closed when replaced or dropped), or the application's (left alone).
    owned: bool,
}

impl Drop for Current {
    fn drop(&mut self) {
        self.watcher.abort();
        if !self.owned {
            return;
        }
        // fred's connection task reconnects forever, and ignores a `QUIT` that timed out
        // (as it does on a stuck connection): ask politely, which gives commands still in
        // flight one command timeout, then stop the task.
        let driver = self.driver.take();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let client = self.client.clone();
                runtime.spawn(async move {
                    let _ = client.quit().await;
                    if let Some(driver) = driver {
                        driver.abort();
                    }
                });
            }
            Err(_) => {
                if let Some(driver) = driver {
                    driver.abort();
                }
            }
        }
    }
}

impl FredSlot {
    fn client(&self) -> (u64, FredClient) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.generation, current.client.clone())
    }

    /// The client with the options every command is sent with.
    fn sender(&self) -> (u64, Sender) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.generation, current.sender.clone())
    }
}

impl Fred {
    /// Gives `slot` a new client unless it was already replaced since `generation`.
    fn replace(&self, slot: &FredSlot, generation: u64) {
        let Some(replacements) = &self.replacements else {
            // The application's client: its connection is not coord's to close.
            tracing::debug!("coord-redis: a command timed out on a shared fred client");
            return;
        };
        let client = match replacements.build() {
            Ok(client) => client,
            Err(err) => {
                tracing::warn!(error = %err, "coord-redis: could not build a new fred client");
                return;
            }
        };
        let old = {
            let mut current = slot.current.lock().unwrap_or_else(|e| e.into_inner());
            if current.generation != generation {
                return;
            }
            let watcher = watch_reconnections(&client, &self.watch, self.clustered);
            // Connects in the background; commands sent meanwhile wait for the connection,
            // within their own timeout.
            let driver = client.connect();
            let generation = slot.generations.fetch_add(1, Ordering::Relaxed) + 1;
            std::mem::replace(
                &mut *current,
                Current {
                    sender: Sender::Own(client.clone()),
                    client,
                    generation,
                    watcher,
                    driver: Some(driver),
                    owned: true,
                },
            )
        };
        tracing::debug!("coord-redis: a command timed out; its connection is replaced");
        drop(old);
    }
}

/// A client of the pool, as commands are sent on it: every command with [`command_options`].
#[derive(Clone)]
enum Sender {
    /// A client coord built: [`make_builder`] gives it [`command_options`] as its own
    /// configuration (one write attempt, no redirection followed, the command timeout), so its
    /// commands need no per-command options.
    Own(FredClient),
    /// The application's client, whose configuration is its own: the options go with each
    /// command.
    Shared(WithOptions<FredClient>),
}

/// Sends one command; fred's own command timeout bounds it, reconnection waits included.
async fn run_one(sender: &Sender, cmd: &Command<'_>, clustered: bool) -> Result<Vec<Reply>, Fault> {
    let (name, args) = custom(cmd, clustered);
    let value: Value = match sender {
        Sender::Own(client) => client.custom(name, args).await,
        Sender::Shared(client) => client.custom(name, args).await,
    }
    .map_err(fault)?;
    Ok(vec![reply(value)?])
}

/// Sends `cmds`, as one pipeline when there are several.
async fn run_on(
    sender: &Sender,
    cmds: &[Command<'_>],
    clustered: bool,
) -> Result<Vec<Reply>, Fault> {
    match (cmds, sender) {
        ([one], _) => run_one(sender, one, clustered).await,
        (_, Sender::Own(client)) => {
            pipelined(Pipeline::from(client.clone()), cmds, clustered).await
        }
        // The pipeline's commands take the options too.
        (_, Sender::Shared(client)) => {
            pipelined(Pipeline::from(client.clone()), cmds, clustered).await
        }
    }
}

/// Sends `cmds` as one pipeline.
async fn pipelined<C: ClientLike>(
    pipeline: Pipeline<C>,
    cmds: &[Command<'_>],
    clustered: bool,
) -> Result<Vec<Reply>, Fault> {
    for c in cmds {
        let (cmd, args) = custom(c, clustered);
        let _: () = pipeline.custom(cmd, args).await.map_err(fault)?;
    }
    // A pipeline's commands are routed one by one: one of them finding no connection does not
    // prove the others were not written.
    let values: Vec<Value> = pipeline.all().await.map_err(|e| match fault(e) {
        Fault::NotSent(why) => Fault::Unavailable(why),
        other => other,
    })?;
    values.into_iter().map(reply).collect()
}

/// fred's form of `cmd`: the command, and its arguments as shared slices of one buffer.
fn custom(cmd: &Command<'_>, clustered: bool) -> (CustomCommand, Vec<Value>) {
    // The slot is computed here, and only for a Cluster (fred looks at it nowhere else): fred
    // 10 honours only `ClusterHash::Custom` on a custom command and otherwise hashes the first
    // string argument, which for `EVALSHA` is the script's SHA (a wrong node, a `MOVED` and a
    // second round trip on every script call).
    let hash = match cmd.route_key() {
        Some(key) if clustered => ClusterHash::Custom(fred::util::redis_keyslot(key)),
        _ => ClusterHash::Random,
    };
    // One buffer for all arguments, handed out as shared slices: one allocation per command
    // instead of one per argument.
    let mut buffer = BytesMut::with_capacity(cmd.arg_bytes());
    for arg in cmd.args() {
        buffer.extend_from_slice(arg);
    }
    let mut buffer = buffer.freeze();
    let mut args = Vec::with_capacity(cmd.args().len());
    for arg in cmd.args() {
        args.push(Value::Bytes(buffer.split_to(arg.len())));
    }
    (CustomCommand::new_static(cmd.name, hash, false), args)
}

/// Whether a failed attempt may be sent again (within the command timeout): refused and not
/// executed (a Cluster redirect or reconfiguration: fred refreshes its slot map), or never
/// written (fred had no connection for it: the server closed it, and fred is making a new
/// one).
fn resendable(fault: &Fault) -> bool {
    fault.not_executed() || matches!(fault, Fault::NotSent(_))
}

impl Fred {
    /// A single command: the common case, kept to a small future. Its first attempt is
    /// bounded by fred's own command timeout alone (the same duration, started when the
    /// command is handed to fred), so no timer of coord's is set; the rare resend is bounded
    /// with the first attempt by one deadline, as [`Fred::run_many`] bounds every attempt.
    async fn run_single(&self, cmd: &Command<'_>) -> Result<Vec<Reply>, Fault> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[i % self.slots.len()];
        let start = tokio::time::Instant::now();
        let (generation, client) = slot.sender();
        let result = match run_one(&client, cmd, self.clustered).await {
            Err(f) if resendable(&f) => {
                let deadline = start + self.timeout;
                Box::pin(self.resend(&client, std::slice::from_ref(cmd), deadline, f)).await
            }
            // Worded as the deadline of the other paths words it.
            Err(Fault::Timeout(_)) => Err(Fault::Timeout("no answer in time".to_owned())),
            other => other,
        };
        self.after(slot, generation, result)
    }

    /// Several commands in one pipeline (a write followed by `WAIT`), under one deadline.
    async fn run_many(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[i % self.slots.len()];
        let deadline = tokio::time::Instant::now() + self.timeout;
        let (generation, client) = slot.sender();
        let attempts = async {
            match run_on(&client, cmds, self.clustered).await {
                Err(f) if resendable(&f) => self.resend(&client, cmds, deadline, f).await,
                other => other,
            }
        };
        // fred's command timeout bounds each attempt; this bounds them together.
        let result = match tokio::time::timeout_at(deadline, attempts).await {
            Ok(result) => result,
            Err(_) => Err(Fault::Timeout("no answer in time".to_owned())),
        };
        self.after(slot, generation, result)
    }

    /// Sends `cmds` again after `fault`, for as long as it may be resent and `deadline`
    /// leaves time for a pause, all of it bounded by `deadline`.
    async fn resend(
        &self,
        client: &Sender,
        cmds: &[Command<'_>],
        deadline: tokio::time::Instant,
        fault: Fault,
    ) -> Result<Vec<Reply>, Fault> {
        let attempts = async {
            let mut pause = Duration::from_millis(5);
            let mut last = fault;
            loop {
                if !resendable(&last) || tokio::time::Instant::now() + pause >= deadline {
                    return Err(last);
                }
                if let Fault::NotSent(why) = &last {
                    tracing::debug!(error = %why, "coord-redis: fred had no connection for the command; sending it again");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
                match run_on(client, cmds, self.clustered).await {
                    Err(f) => last = f,
                    ok => return ok,
                }
            }
        };
        match tokio::time::timeout_at(deadline, attempts).await {
            Ok(result) => result,
            Err(_) => Err(Fault::Timeout("no answer in time".to_owned())),
        }
    }

    /// A broken connection is redialled by fred before anything else is written to it; a
    /// stuck one is not noticed by fred at all, nor one whose reply could not be read (its
    /// later replies may no longer line up with its requests): the slot gets a new client.
    fn after(
        &self,
        slot: &FredSlot,
        generation: u64,
        result: Result<Vec<Reply>, Fault>,
    ) -> Result<Vec<Reply>, Fault> {
        if let Err(Fault::Timeout(_) | Fault::Protocol(_)) = &result {
            self.replace(slot, generation);
        }
        result
    }
}

impl Transport for Fred {
    fn run<'a>(&'a self, cmds: &'a [Command<'a>]) -> BoxFuture<'a, Result<Vec<Reply>, Fault>> {
        match cmds {
            [one] => boxed_in_place(|| self.run_single(one)),
            _ => Box::pin(self.run_many(cmds)),
        }
    }
    fn each_node<'a>(&'a self, cmd: Command<'a>) -> BoxFuture<'a, Result<NodeReplies, Fault>> {
        Box::pin(async move {
            let (_, client) = self.slots[0].client();
            // Clustered, fred keeps a connection to every primary (and, without replica
            // support compiled in, to nothing else).
            let nodes: Vec<Server> = client.active_connections();
            if nodes.is_empty() {
                return Err(Fault::Unavailable("not connected to any node".to_owned()));
            }
            let mut out = Vec::with_capacity(nodes.len());
            for server in nodes {
                let node = server_name(&server);
                let (name, args) = custom(&cmd, self.clustered);
                let options = FredOptions {
                    cluster_node: self.clustered.then_some(server),
                    ..command_options(self.timeout)
                };
                let value: Result<Value, Error> =
                    client.with_options(&options).custom(name, args).await;
                match value.map_err(fault).and_then(reply) {
                    Ok(reply) => out.push((node, Ok(reply))),
                    Err(Fault::Server(err)) => out.push((node, Err(Fault::Server(err)))),
                    Err(other) => return Err(other),
                }
            }
            Ok(out)
        })
    }

    fn subscriber(&self, events: Arc<dyn SubscriberEvents>) -> Box<dyn Subscriber> {
        let client = self
            .subscriber
            .clone()
            .expect("the subscriber client is built with the transport");
        let (ready_tx, ready_rx) = watch::channel(false);
        let task = tokio::spawn(run_subscriber(
            client.clone(),
            ready_tx,
            events,
            self.timeout,
        ));
        Box::new(FredSubscriber {
            client,
            ready: ready_rx,
            task,
        })
    }
}

fn reply(value: Value) -> Result<Reply, Fault> {
    Ok(match value {
        Value::Null => Reply::Nil,
        Value::Integer(i) => Reply::Int(i),
        // Under RESP3 (a shared client may speak it) a script's `false` arrives as a boolean
        // (RESP2 sends nil) and `true` as a boolean (RESP2 sends 1).
        Value::Boolean(false) => Reply::Nil,
        Value::Boolean(true) => Reply::Int(1),
        Value::String(s) => Reply::Data(s.as_bytes().to_vec()),
        Value::Bytes(b) => Reply::Data(b.to_vec()),
        Value::Array(items) => {
            Reply::Array(items.into_iter().map(reply).collect::<Result<_, _>>()?)
        }
        // `CONFIG GET` under RESP3: flattened as RESP2 sends it.
        Value::Map(map) => Reply::Array(
            map.inner()
                .into_iter()
                .flat_map(|(k, v)| [reply(Value::from(k)), reply(v)])
                .collect::<Result<_, _>>()?,
        ),
        other => return Err(Fault::Protocol(format!("unexpected reply {other:?}"))),
    })
}

/// What fred answers a command it found no connection to write to: its connection was closed
/// and not replaced yet. fred fails the command before writing any of it (each command is
/// given one write attempt, and routing comes before the write).
const NO_ROUTE: &str = "Failed to route command.";

fn fault(err: Error) -> Fault {
    let text = err.details();
    let unavailable = || Fault::Unavailable(format!("{:?}: {text}", err.kind()));
    match err.kind() {
        ErrorKind::Unknown if text == NO_ROUTE => {
            Fault::NotSent(format!("{:?}: {text} (not sent)", err.kind()))
        }
        ErrorKind::Timeout => Fault::Timeout(text.to_owned()),
        ErrorKind::Config | ErrorKind::Url | ErrorKind::Auth => Fault::Config(text.to_owned()),
        ErrorKind::Protocol | ErrorKind::Parse => Fault::Protocol(text.to_owned()),
        // fred hands an error reply over as its text, code first: it is read here, once.
        ErrorKind::InvalidArgument
        | ErrorKind::InvalidCommand
        | ErrorKind::Unknown
        | ErrorKind::NotFound
        | ErrorKind::Cluster => match ServerError::from_reply_text(text) {
            Some(reply) => Fault::Server(reply),
            None => unavailable(),
        },
        // A `MOVED`/`ASK` reply fred did not follow (`max_redirections = 0`).
        ErrorKind::Routing if text.starts_with("Too many redirections") => Fault::Server(
            ServerError::new("MOVED", &format!("or ASK, not followed: {text}")),
        ),
        _ => unavailable(),
    }
}

// ---------------------------------------------------------------------------------------------
// Subscriber

struct FredSubscriber {
    client: SubscriberClient,
    ready: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FredSubscriber {
    fn drop(&mut self) {
        self.task.abort();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            runtime.spawn(async move {
                let _ = client.quit().await;
            });
        }
    }
}

impl FredSubscriber {
    async fn connected(&self) -> Result<(), Fault> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|r| *r)
            .await
            .map(|_| ())
            .map_err(|_| Fault::Unavailable("the subscriber connection stopped".to_owned()))
    }
}

impl Subscriber for FredSubscriber {
    fn subscribe<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, Result<(), Fault>> {
        Box::pin(async move {
            if channels.is_empty() {
                return Ok(());
            }
            self.connected().await?;
            self.client
                .subscribe(channels.to_vec())
                .await
                .map_err(fault)?;
            // fred resolves SUBSCRIBE once it is written. A PING on the same connection comes
            // back only after the server has processed everything sent before it, so from
            // here on the subscription is in place and a retry cannot miss a release. (fred
            // sends a client's subscriptions to one node, hashed from its id; so goes the
            // PING.)
            let slot = fred::util::redis_keyslot(self.client.id().as_bytes());
            let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
            let _: Value = self
                .client
                .custom(ping, Vec::<Value>::new())
                .await
                .map_err(fault)?;
            Ok(())
        })
    }

    fn unsubscribe<'a>(&'a self, channels: &'a [String]) -> BoxFuture<'a, Result<(), Fault>> {
        Box::pin(async move {
            if channels.is_empty() {
                // (An empty UNSUBSCRIBE would mean "from everything".)
                return Ok(());
            }
            self.connected().await?;
            self.client
                .unsubscribe(channels.to_vec())
                .await
                .map_err(fault)
        })
    }
}

/// Connects the subscriber client (retrying until it works), then forwards messages and
/// announces reconnections; fred redials on its own after that.
async fn run_subscriber(
    client: SubscriberClient,
    ready: watch::Sender<bool>,
    events: Arc<dyn SubscriberEvents>,
    timeout: Duration,
) {
    let mut messages = client.message_rx();
    let mut reconnects = client.reconnect_rx();
    let mut pause = Duration::from_millis(10);
    loop {
        match tokio::time::timeout(timeout, client.init()).await {
            Ok(Ok(_driver)) => break,
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "coord-redis: connecting the subscriber failed");
            }
            Err(_) => {
                tracing::debug!("coord-redis: connecting the subscriber timed out");
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
    // The first connection is announced as a reconnection too: it is not one.
    while reconnects.try_recv().is_ok() {}
    ready.send_replace(true);
    loop {
        tokio::select! {
            msg = messages.recv() => match msg {
                Ok(msg) => events.message(msg.channel.as_bytes()),
                Err(broadcast::error::RecvError::Lagged(_)) => events.resync(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
            reconnected = reconnects.recv() => match reconnected {
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => events.resync(),
                Err(broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client coord builds sends its commands without per-command options: its own
    /// configuration must say what the options would.
    #[test]
    fn own_clients_are_configured_as_the_command_options_say() {
        let timeout = Duration::from_millis(1234);
        let options = command_options(timeout);
        let builder = make_builder(Config::default(), timeout);
        let connection = builder.get_connection_config();
        assert_eq!(Some(connection.max_command_attempts), options.max_attempts);
        assert_eq!(Some(connection.max_redirections), options.max_redirections);
        assert_eq!(
            Some(builder.get_performance_config().default_command_timeout),
            options.timeout
        );
        assert!(options.cluster_node.is_none() && options.cluster_hash.is_none());
        assert!(!options.fail_fast);
    }
}
