//! Redis Cluster: a pool of cluster connections (slot routing and node connections are
//! redis-rs's), each dialled on demand, checked for restarted masters, and dropped after a
//! call on it failed or timed out; the replies that prove a command was not executed are
//! followed by a resend within the same command timeout, and an `ASK` by the command sent to
//! the node it names, right after `ASKING` (redis-rs would follow it only with its retries
//! on, which would also resend after I/O errors).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};

use super::command::{exec, fault, reply, stale, to_cmd};
use crate::transport::{
    AskFollow, Backoff, Command, Fault, NodeReplies, Reply, ServerWatch, asked_pipeline,
    asked_replies, info_server,
};

/// One cluster connection, dialled on demand and dropped after a call on it failed or timed
/// out (redis-rs keeps reusing a node connection whose reply is stuck; a new cluster
/// connection starts with new node connections).
pub(super) struct ClusterSlot {
    client: Arc<ClusterClient>,
    timeout: Duration,
    current: Mutex<Option<(u64, ClusterConnection)>>,
    generation: AtomicU64,
    dialing: tokio::sync::Mutex<()>,
    watch: Arc<ServerWatch>,
}

impl ClusterSlot {
    pub(super) fn new(
        client: &Arc<ClusterClient>,
        timeout: Duration,
        watch: &Arc<ServerWatch>,
    ) -> Self {
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

    pub(super) async fn connection(&self) -> Result<(u64, ClusterConnection), Fault> {
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
                    self.watch.observe_reply(&node, info);
                }
            }
            Err(err) => tracing::debug!(error = ?err, "coord-redis: INFO server failed"),
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    pub(super) async fn exec(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut used = None;
        let attempt = async {
            let (generation, mut conn) = self.connection().await?;
            used = Some(generation);
            let mut backoff = Backoff::resend();
            let mut asks = AskFollow::default();
            let mut asked = None;
            loop {
                let sent = match asked.take() {
                    Some((host, port)) => exec_asking(&mut conn, cmds, host, port).await,
                    None => exec(&mut conn, cmds).await,
                };
                match sent {
                    // Not executed, the slot migrating: sent to the node it is migrating to,
                    // at once (see `AskFollow`).
                    Err(Fault::Server(err)) if err.ask_target().is_some() => {
                        asks.follow(&err)?;
                        asked = err.ask_target().map(|(host, port)| (host.to_owned(), port));
                    }
                    // Refused without being executed, and redis-rs is refreshing its slot
                    // map: sending it again cannot run it twice.
                    Err(f) if f.not_executed() && backoff.ends_before(deadline) => {
                        asks.pausing_after(&f);
                        backoff.sleep().await;
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

/// Sends `cmds` to the node at `host:port`, each right after `ASKING`, in one pipeline on
/// that node's connection ([`asked_pipeline`]).
async fn exec_asking(
    conn: &mut ClusterConnection,
    cmds: &[Command<'_>],
    host: String,
    port: u16,
) -> Result<Vec<Reply>, Fault> {
    let asked = asked_pipeline(cmds);
    let mut pipe = redis::pipe();
    for cmd in &asked {
        pipe.add_command(to_cmd(cmd));
    }
    let route = SingleNodeRoutingInfo::ByAddress { host, port };
    let values = conn
        .route_pipeline(pipe, 0, asked.len(), route)
        .await
        .map_err(fault)?;
    let replies = values.into_iter().map(reply).collect::<Result<_, _>>()?;
    asked_replies(replies, cmds.len())
}

fn forget_cluster(current: &Mutex<Option<(u64, ClusterConnection)>>, generation: u64) {
    let mut current = current.lock().unwrap_or_else(|e| e.into_inner());
    if current.as_ref().is_some_and(|(g, _)| *g == generation) {
        *current = None;
    }
}

/// Sends `cmd` to every master, answering per node.
pub(super) async fn all_masters(
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
