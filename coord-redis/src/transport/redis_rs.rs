//! The transport over the `redis` crate (redis-rs).
//!
//! * One server, or the master Sentinel names: a pool of multiplexed connections, each in a
//!   [`Slot`] that dials on demand. A connection that the client reports disconnected, or
//!   that fails, times out or finds itself on a replica (`READONLY`, after a failover), is
//!   dropped, and the next call dials again (asking Sentinel again, where there is one). The
//!   call that dials is bounded by the command timeout as a whole; a call on a live
//!   connection is bounded by the client's response timeout, with no timer of our own.
//!   Plain TCP and Unix-socket connections are dialled here, on a socket that counts what it
//!   wrote and, at the first write after the connection was idle, refuses to write if the
//!   server has closed its end ([`wire`]): a command that failed because its connection was
//!   closed, and of which provably no byte was written, is sent once more on a fresh
//!   connection (the first command after `CLIENT KILL` or a restart). A command that may have
//!   reached the server is never sent again.
//! * Cluster: a pool of cluster connections (slot routing and node connections are
//!   redis-rs's), each call under one command timeout. redis-rs's own retries are off (it
//!   would resend a command whose connection dropped after sending it); replies that prove a
//!   command was not executed (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`) are resent here, within the
//!   same timeout, and an `ASK` is followed here: the command goes to the node it names, in
//!   one pipeline after `ASKING`. A cluster connection whose call failed or timed out is dropped and the
//!   next call dials a new one.
//!
//! Every new connection is checked with `INFO server` before use: a changed run id means
//! the server restarted, which the [`ServerWatch`] logs and counts.
//!
//! The subscriber is a dedicated RESP3 connection (to the server, to the current master, or
//! to the first reachable seed of a cluster, which sees every node's publications), redialled
//! in the background whenever it drops.
//!
//! Here: connecting (the pool for the target) and the transport's calls. Beside it:
//! [`clients`] (coord's addresses in redis-rs's form, Sentinel's master), [`command`] (one
//! command or pipeline, its reply, its fault), [`slot`] (one server's connections and their
//! replacement), [`cluster`], [`subscriber`] and [`wire`].

mod clients;
mod cluster;
mod command;
mod slot;
mod subscriber;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::BoxFuture;
use redis::AsyncConnectionConfig;
#[cfg(feature = "tls")]
use redis::TlsMode;
use redis::cluster::ClusterClient;
use redis::sentinel::{SentinelClientBuilder, SentinelServerType};

#[cfg(feature = "tls")]
use self::clients::certificates;
use self::clients::{Dialer, SentinelShared, client_for, connection_addr, connection_info};
use self::cluster::{ClusterSlot, all_masters};
use self::command::fault;
use self::slot::Slot;
use self::subscriber::PubSubSource;
use super::{
    Command, Fault, NodeReplies, Reply, SendWatch, ServerWatch, Subscriber, SubscriberEvents,
    Transport, boxed_in_place, node_answer,
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
                    let answer = slot.exec(&[cmd]).await.and_then(|mut replies| {
                        replies.pop().ok_or_else(|| {
                            Fault::Protocol("no reply to a single command".to_owned())
                        })
                    });
                    Ok(vec![node_answer(slot.node(), answer)?])
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
        subscriber::spawn(self.pubsub.clone(), events, self.timeout)
    }
}
