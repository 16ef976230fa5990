//! One client of the pool: replaced after a command on it timed out (the old one is closed in
//! the background), and watched for reconnections, each checked with `INFO server` for a
//! restarted node.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::Client as FredClient;
use fred::error::Error;
use fred::prelude::{Builder, ClientLike, EventInterface, Server, Value};
use fred::types::ConnectHandle;
use tokio::sync::broadcast;

use super::command::{Sender, custom, fault, reply};
use super::settings::{command_options, server_name};
use crate::transport::{ServerWatch, info_server};

/// One client of the pool, replaced after a command on it timed out.
pub(super) struct FredSlot {
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
    /// A slot over a client coord built and connected (`driver` is fred's connection task for
    /// it), which it closes when replaced or dropped.
    pub(super) fn own(
        client: FredClient,
        driver: ConnectHandle,
        watcher: tokio::task::JoinHandle<()>,
    ) -> FredSlot {
        FredSlot {
            current: Mutex::new(Current {
                sender: Sender::Own(client.clone()),
                client,
                generation: 0,
                watcher,
                driver: Some(driver),
                owned: true,
            }),
            generations: AtomicU64::new(0),
        }
    }

    /// A slot over the application's client: its commands carry [`command_options`], and the
    /// client is never replaced nor closed by coord.
    pub(super) fn shared(
        client: FredClient,
        watcher: tokio::task::JoinHandle<()>,
        timeout: Duration,
    ) -> FredSlot {
        FredSlot {
            current: Mutex::new(Current {
                sender: Sender::Shared(client.with_options(&command_options(timeout))),
                client,
                generation: 0,
                watcher,
                driver: None,
                owned: false,
            }),
            generations: AtomicU64::new(0),
        }
    }

    pub(super) fn client(&self) -> (u64, FredClient) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.generation, current.client.clone())
    }

    /// The client with the options every command is sent with.
    pub(super) fn sender(&self) -> (u64, Sender) {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        (current.generation, current.sender.clone())
    }

    /// Gives this slot a new client from `replacements` (its reconnections reported to
    /// `watch`) unless it was already replaced since `generation`.
    pub(super) fn replace(
        &self,
        generation: u64,
        replacements: &Builder,
        watch: &Arc<ServerWatch>,
        clustered: bool,
    ) {
        let client = match replacements.build() {
            Ok(client) => client,
            Err(err) => {
                tracing::warn!(error = %err, "coord-redis: could not build a new fred client");
                return;
            }
        };
        let old = {
            let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            if current.generation != generation {
                return;
            }
            let watcher = watch_reconnections(&client, watch, clustered);
            // Connects in the background; commands sent meanwhile wait for the connection,
            // within their own timeout.
            let driver = client.connect();
            let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
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
/// Checks the run id of every node `client` (re)connects to, for as long as the returned
/// task runs.
pub(super) fn watch_reconnections(
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
pub(super) async fn observe(
    client: &FredClient,
    server: Server,
    watch: &ServerWatch,
    clustered: bool,
) {
    let node = server_name(&server);
    let (cmd, args) = custom(&info_server(), clustered);
    let info: Result<Value, Error> = if clustered {
        client.with_cluster_node(server).custom(cmd, args).await
    } else {
        client.custom(cmd, args).await
    };
    watch.observe_reply(&node, info.map_err(fault).and_then(reply));
}
