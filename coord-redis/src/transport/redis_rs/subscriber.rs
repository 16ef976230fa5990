//! The shared subscriber: a RESP3 multiplexed connection (to the server, to the current
//! master, or to the first reachable seed of a cluster, which sees every node's publications)
//! whose push messages are handed to the waiter queues right in the connection's reader (no
//! extra task in between, which keeps hand-offs short), redialled in the background whenever
//! it drops.

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::watch;

use super::clients::{SentinelShared, resp3};
use super::command::fault;
use crate::transport::{Backoff, Fault, Subscriber, SubscriberEvents};

/// Where the subscriber connects.
#[derive(Clone)]
pub(super) enum PubSubSource {
    /// Try these in order.
    Direct(Vec<redis::Client>),
    /// Whatever master Sentinel names.
    Sentinel(Arc<SentinelShared>),
}

/// Starts the subscriber: its connection is opened (and reopened) by a background task.
pub(super) fn spawn(
    source: PubSubSource,
    events: Arc<dyn SubscriberEvents>,
    timeout: Duration,
) -> Box<dyn Subscriber> {
    let (conn_tx, conn_rx) = watch::channel(None);
    let task = tokio::spawn(run_subscriber(source, conn_tx, events, timeout));
    Box::new(RrSubscriber {
        conn: conn_rx,
        task,
    })
}

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
                    PushKind::Message => {
                        let payload = match push.data.get(1) {
                            Some(Value::BulkString(payload)) => payload.as_slice(),
                            Some(Value::SimpleString(payload)) => payload.as_bytes(),
                            _ => &[],
                        };
                        match push.data.first() {
                            Some(Value::BulkString(channel)) => events.message(channel, payload),
                            Some(Value::SimpleString(channel)) => {
                                events.message(channel.as_bytes(), payload)
                            }
                            _ => {}
                        }
                    }
                    PushKind::Disconnection => lost.notify_one(),
                    _ => {}
                }
                Ok::<(), std::convert::Infallible>(())
            })
    };
    let mut connected_before = false;
    let mut backoff = Backoff::reconnect();
    loop {
        let opened = tokio::time::timeout(timeout, open_subscriber(&source, &config)).await;
        match opened {
            Ok(Ok(new_conn)) => {
                backoff = Backoff::reconnect();
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
        backoff.sleep().await;
    }
}
