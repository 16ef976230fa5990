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
//! is sent again within the same command timeout once fred has reconnected. A redirect fred
//! reports without following it (`MOVED` or `ASK`: fred does not say which) is sent again
//! once fred has refreshed its slot map, or, when the slot's owner says the slot is migrating
//! (`CLUSTER NODES`), to the node it migrates to, right after `ASKING` (an `ASK` proves the
//! command was not executed; see [`AskFollow`](super::AskFollow)). A
//! command that times out leaves its client's connection behind: the slot is given a new
//! client (new connections), and the old one is closed in the background, so the next call
//! never queues behind the stuck reply.
//!
//! Every (re)connection fred reports is checked with `INFO server` on that node: a changed
//! run id means the server restarted, which the [`ServerWatch`] logs and counts.
//!
//! The subscriber is a fred subscriber client built from the same settings.
//!
//! Here: connecting (coord's clients, or the application's), and the transport's calls with
//! their resends under one deadline. Beside it: [`settings`] (what fred is told), [`command`]
//! (one command or pipeline, its reply, its fault), [`slot`] (one client of the pool, its
//! replacement, its reconnections watched) and [`subscriber`].

mod command;
mod settings;
mod slot;
mod subscriber;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::BoxFuture;
use fred::clients::{Client as FredClient, SubscriberClient};
use fred::error::Error;
use fred::prelude::{Builder, ClientLike, Config, Server, ServerConfig, Value};
use fred::types::config::Options as FredOptions;

use self::command::{
    Sender, custom, fault, is_redirect, migrating_to, reply, resendable, run_asking, run_on,
    run_one,
};
use self::settings::{command_options, config, make_builder, server_name};
use self::slot::{FredSlot, observe, watch_reconnections};
use super::{
    AskFollow, Backoff, Command, Fault, NodeReplies, Reply, ServerWatch, Subscriber,
    SubscriberEvents, Transport, boxed_in_place, node_answer,
};
use crate::config::{Options, Target, TlsMaterial};

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
        slots.push(FredSlot::own(client, driver, watcher));
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
        slots.push(FredSlot::shared(client, watcher, timeout));
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

impl Fred {
    /// Gives `slot` a new client unless it was already replaced since `generation`.
    fn replace(&self, slot: &FredSlot, generation: u64) {
        let Some(replacements) = &self.replacements else {
            // The application's client: its connection is not coord's to close.
            tracing::debug!("coord-redis: a command timed out on a shared fred client");
            return;
        };
        slot.replace(generation, replacements, &self.watch, self.clustered);
    }
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
            // fred's own text says which of its waits ran out.
            Err(Fault::Timeout(why)) => Err(Fault::Timeout(format!("no answer in time: {why}"))),
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
            Err(_) => Err(Fault::Timeout(
                "no answer in time to the pipeline (resends included)".to_owned(),
            )),
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
        let first = format!("{fault:?}");
        let attempts = async {
            let mut backoff = Backoff::resend();
            let mut asks = AskFollow::default();
            let mut last = fault;
            loop {
                // A redirect fred did not follow: an `ASK` when the slot is migrating, which
                // is followed at once (see `AskFollow`); a `MOVED` otherwise, resent below.
                if self.clustered
                    && is_redirect(&last)
                    && let Some(node) = migrating_to(client, cmds, &self.options()).await
                {
                    if let Fault::Server(redirect) = &last {
                        asks.follow(redirect)?;
                    }
                    match run_asking(client, cmds, node, &self.options()).await {
                        Err(f) => {
                            last = f;
                            continue;
                        }
                        ok => return ok,
                    }
                }
                if !resendable(&last) || !backoff.ends_before(deadline) {
                    return Err(last);
                }
                asks.pausing_after(&last);
                if let Fault::NotSent(why) = &last {
                    tracing::debug!(error = %why, "coord-redis: fred had no connection for the command; sending it again");
                }
                backoff.sleep().await;
                match run_on(client, cmds, self.clustered).await {
                    Err(f) => last = f,
                    ok => return ok,
                }
            }
        };
        match tokio::time::timeout_at(deadline, attempts).await {
            Ok(result) => result,
            Err(_) => Err(Fault::Timeout(format!(
                "no answer in time while sending again after {first}"
            ))),
        }
    }

    /// What every command is sent with (see [`command_options`]).
    fn options(&self) -> FredOptions {
        command_options(self.timeout)
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
                out.push(node_answer(node, value.map_err(fault).and_then(reply))?);
            }
            Ok(out)
        })
    }

    fn subscriber(&self, events: Arc<dyn SubscriberEvents>) -> Box<dyn Subscriber> {
        let client = self
            .subscriber
            .clone()
            .expect("the subscriber client is built with the transport");
        subscriber::spawn(client, events, self.timeout)
    }
}
