//! The transport over the `fred` crate.
//!
//! A fred client pool carries commands; fred handles reconnection, Sentinel master discovery
//! (and re-discovery after a failover: the demoted master's clients are disconnected by
//! Sentinel, and `READONLY` replies also trigger a reconnect) and Cluster routing. Commands
//! are sent as custom commands with an explicit key position, so Cluster routing never
//! depends on fred knowing the command.
//!
//! The subscriber is a fred subscriber client built from the same settings.

use std::sync::Arc;
use std::time::Duration;

use coord_core::BoxFuture;
use fred::bytes::BytesMut;
use fred::clients::{Pool, SubscriberClient};
use fred::error::{Error, ErrorKind};
use fred::prelude::{
    Builder, ClientLike, Config, EventInterface, PubsubInterface, ReconnectPolicy, Server,
    ServerConfig, Value,
};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{broadcast, watch};

use super::{Command, Fault, Reply, Subscriber, SubscriberEvents, Transport};
use crate::config::{Endpoint, Options, Topology};

/// Connects as `options` say.
pub(crate) async fn connect(options: &Options) -> Result<Arc<dyn Transport>, Fault> {
    let timeout = options.command_timeout;
    let config = config(options)?;
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
            // fred may send a command again after a reconnect (and must, to follow Cluster
            // topology changes). Every coord write is owner-checked, so a repeated one
            // changes nothing; at worst it reports `NotHeld`/`false` for a write that landed.
            conn.max_command_attempts = 3;
            conn.reconnect_errors = vec![
                fred::types::config::ReconnectError::ClusterDown,
                fred::types::config::ReconnectError::Loading,
                fred::types::config::ReconnectError::ReadOnly,
            ];
        })
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 250, 2));
    let pool = builder.build_pool(options.pool_size).map_err(fault)?;
    // With `fail_fast`, a failed first connection also stops fred's connection task.
    pool.init().await.map_err(fault)?;
    let subscriber = builder.build_subscriber_client().map_err(fault)?;
    Ok(Arc::new(Fred {
        pool,
        subscriber: Some(subscriber),
        timeout,
    }))
}

fn config(options: &Options) -> Result<Config, Fault> {
    let bad = |e: coord_core::BackendError| Fault::Config(e.message().to_owned());
    let server = |e: &Endpoint| Server::new(e.host.as_str(), e.port);
    let mut config = Config {
        fail_fast: true,
        ..Config::default()
    };
    match &options.topology {
        Topology::Standalone(url) => {
            let e = Endpoint::parse(url, 6379).map_err(bad)?;
            config.server = ServerConfig::Centralized { server: server(&e) };
            config.username = e.username.clone();
            config.password = e.password.clone();
            config.database = e.database;
        }
        Topology::Cluster(seeds) => {
            let seeds = seeds
                .iter()
                .map(|s| Endpoint::parse(s, 6379))
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?;
            config.username = seeds[0].username.clone();
            config.password = seeds[0].password.clone();
            config.server = ServerConfig::Clustered {
                hosts: seeds.iter().map(server).collect(),
                policy: Default::default(),
            };
        }
        Topology::Sentinel { master, sentinels } => {
            let nodes = sentinels
                .iter()
                .map(|s| Endpoint::parse(s, 26379))
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?;
            config.server = ServerConfig::Sentinel {
                hosts: nodes.iter().map(server).collect(),
                service_name: master.clone(),
                username: nodes[0].username.clone(),
                password: nodes[0].password.clone(),
            };
            config.username = options.username.clone();
            config.password = options.password.clone();
            config.database = options.database;
        }
    }
    Ok(config)
}

struct Fred {
    pool: Pool,
    subscriber: Option<SubscriberClient>,
    timeout: Duration,
}

impl Drop for Fred {
    fn drop(&mut self) {
        // fred's connection tasks reconnect forever: stop them with the provider.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = self.pool.clone();
            runtime.spawn(async move {
                let _ = pool.quit().await;
            });
        }
    }
}

fn custom(cmd: &Command<'_>) -> (CustomCommand, Vec<Value>) {
    // The key's offset among the arguments decides the slot.
    let hash = match cmd.key_index {
        Some(i) => ClusterHash::Offset(i),
        None => ClusterHash::Random,
    };
    // One buffer for all arguments, handed out as shared slices: one allocation per command
    // instead of one per argument.
    let mut buffer = BytesMut::with_capacity(cmd.arg_bytes());
    for arg in cmd.args() {
        buffer.extend_from_slice(arg);
    }
    let mut buffer = buffer.freeze();
    let args = cmd
        .args()
        .iter()
        .map(|a| Value::Bytes(buffer.split_to(a.len())))
        .collect();
    (CustomCommand::new_static(cmd.name, hash, false), args)
}

impl Transport for Fred {
    fn run<'a>(&'a self, cmds: &'a [Command<'a>]) -> BoxFuture<'a, Result<Vec<Reply>, Fault>> {
        Box::pin(async move {
            let client = self.pool.next();
            // fred's own command timeout bounds each command, reconnection waits included.
            if let [one] = cmds {
                let (cmd, args) = custom(one);
                let value: Value = client.custom(cmd, args).await.map_err(fault)?;
                return Ok(vec![reply(value)?]);
            }
            let pipeline = client.pipeline();
            for c in cmds {
                let (cmd, args) = custom(c);
                let _: () = pipeline.custom(cmd, args).await.map_err(fault)?;
            }
            let values: Vec<Value> = pipeline.all().await.map_err(fault)?;
            values.into_iter().map(reply).collect()
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
        Value::String(s) => Reply::Data(s.as_bytes().to_vec()),
        Value::Bytes(b) => Reply::Data(b.to_vec()),
        Value::Array(items) => {
            Reply::Array(items.into_iter().map(reply).collect::<Result<_, _>>()?)
        }
        other => return Err(Fault::Protocol(format!("unexpected reply {other:?}"))),
    })
}

fn fault(err: Error) -> Fault {
    let text = err.details().to_owned();
    match err.kind() {
        ErrorKind::Timeout => Fault::Timeout(text),
        ErrorKind::Config | ErrorKind::Url | ErrorKind::Auth => Fault::Config(text),
        ErrorKind::Protocol | ErrorKind::Parse => Fault::Protocol(text),
        // Error replies from the server keep their text, code first.
        ErrorKind::InvalidArgument
        | ErrorKind::InvalidCommand
        | ErrorKind::Unknown
        | ErrorKind::NotFound
            if looks_like_reply(&text) =>
        {
            Fault::Server(text)
        }
        ErrorKind::Cluster if looks_like_reply(&text) => Fault::Server(text),
        _ => Fault::Unavailable(format!("{:?}: {text}", err.kind())),
    }
}

/// An error reply starts with an upper-case code (`WRONGTYPE`, `NOSCRIPT`, `ERR`).
fn looks_like_reply(text: &str) -> bool {
    let code = text.split_whitespace().next().unwrap_or("");
    !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
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
