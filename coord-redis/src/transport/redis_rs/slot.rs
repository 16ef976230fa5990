//! One server's (or Sentinel's master's) multiplexed connections: each slot dials on demand,
//! on a socket watched for what it wrote, checks a new connection's run id, and drops a
//! connection that went bad so the next call dials again; a command that provably never left
//! the process is sent once more on a fresh connection.

use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, PushInfo, PushKind};

use super::clients::{Dialer, resp3};
use super::command::{exec, fault, stale};
use super::wire::{HandedOver, Watched, Wire};
use crate::transport::{Command, Fault, Reply, SendWatch, ServerWatch, info_server};

/// The connection a slot holds, tagged with the dial that made it.
type Current = Mutex<Option<Live>>;

/// One live connection of a slot: the dial that made it, the connection, and (for a socket
/// dialled here) what its socket wrote.
#[derive(Clone)]
pub(super) struct Live {
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
        Err(_) => Err(Fault::Timeout(format!(
            "dialling {}: no connection within {timeout:?}",
            info.addr()
        ))),
    }
}

/// Where a call that dials has got to, for the text of its timeout: which wait ran out.
#[derive(Default)]
struct Stage(AtomicU8);

impl Stage {
    const DIAL_LOCK: u8 = 0;
    const ADDRESS: u8 = 1;
    const DIAL: u8 = 2;
    const INFO: u8 = 3;
    const REPLY: u8 = 4;

    fn set(&self, stage: u8) {
        self.0.store(stage, Ordering::Relaxed);
    }

    fn describe(&self) -> &'static str {
        match self.0.load(Ordering::Relaxed) {
            Stage::DIAL_LOCK => "waiting for another call's dial of this pooled connection",
            Stage::ADDRESS => "asking for the server's address",
            Stage::DIAL => "dialling (connect and handshake)",
            Stage::INFO => "waiting for the new connection's INFO server reply",
            _ => "waiting for the reply on the new connection",
        }
    }
}

/// One multiplexed connection, dialled on demand and dropped when it goes bad.
pub(super) struct Slot {
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
    pub(super) fn pool(
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

    pub(super) fn node(&self) -> String {
        self.node.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn cached(&self) -> Option<Live> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) async fn connection(&self) -> Result<Live, Fault> {
        self.connect(&Stage::default()).await
    }

    /// [`Slot::connection`], noting in `stage` which wait it is in.
    async fn connect(&self, stage: &Stage) -> Result<Live, Fault> {
        if let Some(found) = self.cached() {
            return Ok(found);
        }
        stage.set(Stage::DIAL_LOCK);
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
        stage.set(Stage::ADDRESS);
        let client = resp3(&self.dialer.client().await?)?;
        let node = client.get_connection_info().addr().to_string();
        stage.set(Stage::DIAL);
        let mut live = dial(&client, &config, self.timeout).await?;
        live.generation = generation;
        // A new connection: is it still the same server process as before?
        stage.set(Stage::INFO);
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

    pub(super) async fn exec(&self, cmds: &[Command<'_>]) -> Result<Vec<Reply>, Fault> {
        let Some(mut live) = self.cached() else {
            // Rare (the first call, or the first after a fault): boxed, so the common path's
            // future stays small.
            return Box::pin(self.dial_and_exec(cmds)).await;
        };
        let written = live.wire.as_ref().map(|wire| wire.written());
        let handed = live.wire.as_deref().map(Wire::hand_over);
        let result = until_gone(exec(&mut live.conn, cmds), handed.as_ref()).await;
        drop(handed);
        let result = result.map_err(|f| unanswered(f, live.wire.as_deref(), written));
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
    pub(super) async fn exec_noting_sent(
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
        let handed = wire.hand_over();
        let result = until_gone(exec(&mut live.conn, cmds), Some(&handed)).await;
        drop(handed);
        let result = result.map_err(|f| unanswered(f, Some(&wire), Some(before)));
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
        let stage = Stage::default();
        let dialled = async {
            let mut live = self.connect(&stage).await?;
            stage.set(Stage::REPLY);
            let handed = live.wire.as_deref().map(Wire::hand_over);
            // A connection closed at once after the dial: failed now, not at the timeout.
            let result = until_gone(exec(&mut live.conn, cmds), handed.as_ref()).await;
            drop(handed);
            Ok::<_, Fault>((live.generation, result))
        };
        let (generation, result) = match tokio::time::timeout(self.timeout, dialled).await {
            Ok(outcome) => outcome?,
            Err(_) => {
                return Err(Fault::Timeout(format!(
                    "on a connection dialled for this command: nothing within {:?}, {}",
                    self.timeout,
                    stage.describe()
                )));
            }
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

/// `exec`, ended with a fault if the connection's driver ends first while `handed` is the
/// command that began a busy spell (see [`HandedOver::gone`]).
async fn until_gone(
    exec: impl Future<Output = Result<Vec<Reply>, Fault>>,
    handed: Option<&HandedOver<'_>>,
) -> Result<Vec<Reply>, Fault> {
    let Some(gone) = handed.and_then(HandedOver::gone) else {
        return exec.await;
    };
    tokio::select! {
        biased;
        result = exec => result,
        () = gone => Err(Fault::Unavailable(
            "the connection's driver ended before this command was answered".to_owned(),
        )),
    }
}

/// A live connection's fault, its timeout told apart: redis-rs's response timeout ran out,
/// and whether any byte went out on the connection since the command was handed over.
fn unanswered(fault: Fault, wire: Option<&Wire>, before: Option<u64>) -> Fault {
    let Fault::Timeout(why) = fault else {
        return fault;
    };
    let written = match (wire, before) {
        (Some(wire), Some(before)) if wire.written() == before => {
            "not one byte written since it was handed over"
        }
        (Some(_), Some(_)) => "bytes written since it was handed over",
        _ => "its writes not counted",
    };
    Fault::Timeout(format!(
        "no reply on the pooled connection ({written}): {why}"
    ))
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
