//! The shared subscriber: a fred subscriber client built from the transport's settings,
//! connected in the background (retrying until it works); fred redials on its own after that.

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::BoxFuture;
use fred::clients::SubscriberClient;
use fred::prelude::{ClientLike, EventInterface, PubsubInterface, Value};
use fred::types::{ClusterHash, CustomCommand};
use tokio::sync::{broadcast, watch};

use super::command::fault;
use crate::transport::{Backoff, Fault, Subscriber, SubscriberEvents};

/// Starts the subscriber on `client`: it connects in a background task.
pub(super) fn spawn(
    client: SubscriberClient,
    events: Arc<dyn SubscriberEvents>,
    timeout: Duration,
) -> Box<dyn Subscriber> {
    let (ready_tx, ready_rx) = watch::channel(false);
    let task = tokio::spawn(run_subscriber(client.clone(), ready_tx, events, timeout));
    Box::new(FredSubscriber {
        client,
        ready: ready_rx,
        task,
    })
}

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
    let mut backoff = Backoff::reconnect();
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
        backoff.sleep().await;
    }
    // The first connection is announced as a reconnection too: it is not one.
    while reconnects.try_recv().is_ok() {}
    ready.send_replace(true);
    loop {
        tokio::select! {
            msg = messages.recv() => match msg {
                Ok(msg) => {
                    let payload = msg.value.as_bytes().unwrap_or_default();
                    events.message(msg.channel.as_bytes(), payload)
                }
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
