//! PostgreSQL's side of waiting: one listening connection per provider, and its way into the
//! shared waiter queues and wait loop (`coord_core::provider::waiting`: the queues, the head
//! that watches, the loop of looks and re-checks), which [`Hub::wait`] runs.
//!
//! The listening connection is made the first time something waits, from the provider's
//! settings but outside its pool (a pooled connection cannot stay in `LISTEN`; through
//! PgBouncer it must bypass transaction pooling), and it `LISTEN`s on the provider's one
//! channel. A notification's payload is a hash of the key (and kind) it is about; waiters are
//! queued by that payload. A lock's queue wakes only its head (one release, one retry); a
//! record's or a flight's queue wakes everyone (one outcome answers them all).
//!
//! When the listening connection drops (the server restarted, a session was terminated, a
//! health check got no answer), it is made again, and every waiter is woken to look again:
//! notifications sent meanwhile were lost. A waiter also looks again at least every
//! [`RECHECK_CAP`] (jittered), so a lost notification costs at most that.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use coord_core::provider::waiting::{self, Queues, Recheck, Ticket, WaitRules, WeakQueues};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;

use crate::connection::{Drivers, Settings, Tls};

pub(crate) use coord_core::provider::waiting::{Cue, Look, Wake};

/// The longest a waiter sleeps before looking again when no notification comes (a lost one,
/// a holder that crashed and lets its lease run out, a listening connection that dropped).
pub(crate) const RECHECK_CAP: Duration = Duration::from_secs(1);

/// How often the listening connection is checked with a round trip: a connection to a
/// frozen or vanished server may stay open without delivering anything.
const HEALTH_EVERY: Duration = Duration::from_secs(5);

/// What the listener needs: connection settings, the channel, and the provider's runtime it
/// runs on (never the runtime of the call that first waits, which may stop before the
/// provider does).
pub(crate) struct ListenerSettings {
    pub(crate) settings: Settings,
    pub(crate) channel: String,
    pub(crate) drivers: Drivers,
}

/// The listening connection's state, as waiters see it.
#[derive(Debug, Clone)]
enum Listening {
    /// Being (re)made.
    Connecting,
    /// `LISTEN` confirmed: a notification sent from now on reaches this process.
    Ready,
    /// The last attempt failed; another follows after a pause.
    Failed(BackendError),
}

/// The waiter queues of one provider (one per notification payload; the one listening
/// connection serves them all, so a queue keeps nothing of its own) and its listening
/// connection.
pub(crate) struct Hub {
    queues: Queues<()>,
    /// How many times the listening connection was made.
    connections: Arc<AtomicU64>,
    settings: Mutex<Option<ListenerSettings>>,
    state: OnceLock<watch::Receiver<Listening>>,
    timeout: Duration,
}

impl Hub {
    /// Queues served by a listener made from `settings` when first needed; `timeout` (the
    /// command timeout) bounds each of its round trips.
    pub(crate) fn new(settings: ListenerSettings, timeout: Duration) -> Hub {
        Hub {
            queues: Queues::new(),
            connections: Arc::new(AtomicU64::new(0)),
            settings: Mutex::new(Some(settings)),
            state: OnceLock::new(),
            timeout,
        }
    }

    /// How many times the listening connection was made.
    pub(crate) fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// The listener's state, starting the listener on first use.
    fn state(&self) -> watch::Receiver<Listening> {
        self.state
            .get_or_init(|| {
                let (tx, rx) = watch::channel(Listening::Connecting);
                let settings = self
                    .settings
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                if let Some(settings) = settings {
                    let drivers = settings.drivers.clone();
                    drivers.spawn(listen(
                        settings,
                        self.queues.downgrade(),
                        self.connections.clone(),
                        tx,
                        self.timeout,
                    ));
                }
                rx
            })
            .clone()
    }

    /// Joins the queue of `payload`, then waits (at most the command timeout) until the
    /// listener has confirmed `LISTEN`, so a notification sent after this returns is seen.
    async fn join(&self, payload: String, wake: Wake) -> Result<Ticket<()>, BackendError> {
        let mut state = self.state();
        // From here on, dropping the ticket takes the waiter out of its queue again.
        let (ticket, ()) = self.queues.join(payload, wake, |_| (), |_| ());
        let settled = tokio::time::timeout(
            self.timeout,
            state.wait_for(|s| !matches!(s, Listening::Connecting)),
        )
        .await;
        match settled {
            Ok(Ok(state)) => match &*state {
                Listening::Ready => Ok(ticket),
                Listening::Failed(err) => Err(err.clone()),
                Listening::Connecting => unreachable!("waited for another state"),
            },
            Ok(Err(_)) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                "the listening connection's task stopped",
            )),
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "the listening connection was not ready within {:?}",
                    self.timeout
                ),
            )),
        }
    }

    /// Waits on `payload` until `look` answers, or until `deadline` (`None`: no end) passes,
    /// which answers `timed_out`: the shared loop (`waiting::wait`, whose promises hold here)
    /// over the listening connection.
    ///
    /// PostgreSQL's rules: every waiter looks once when it joins (a hand-off queue's
    /// followers too, each marking the row it waits on); after a look that did not answer,
    /// the waiter looks again at the lapse the look named, and at most [`RECHECK_CAP`]
    /// (jittered) after it, whichever is first (`waiting::recheck_after`); in a hand-off
    /// queue only its head keeps that timer.
    pub(crate) async fn wait<T, F, Fut>(
        &self,
        payload: String,
        wake: Wake,
        deadline: Option<Instant>,
        timed_out: T,
        look: F,
    ) -> Result<T, BackendError>
    where
        F: FnMut(Cue) -> Fut,
        Fut: Future<Output = Result<Look<T>, BackendError>>,
    {
        let rules = WaitRules {
            wake,
            recheck: Recheck::Capped(RECHECK_CAP),
            followers_wait_for_head: false,
        };
        waiting::wait(self.join(payload, wake), rules, deadline, timed_out, look).await
    }
}

/// Keeps one listening connection up for as long as the hub exists.
async fn listen(
    settings: ListenerSettings,
    queues: WeakQueues<()>,
    connections: Arc<AtomicU64>,
    state: watch::Sender<Listening>,
    timeout: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let connecting = tokio::time::timeout(timeout, connect(&settings, queues.clone()));
        let outcome = tokio::select! {
            outcome = connecting => outcome,
            () = state.closed() => return,
        };
        let (client, mut driver) = match outcome {
            Ok(Ok(connected)) => connected,
            failed => {
                let err = match failed {
                    Ok(Err(err)) => err,
                    _ => BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "making the listening connection to {}: no answer within {timeout:?}",
                            settings.settings.address
                        ),
                    ),
                };
                tracing::debug!(error = %err, "coord-postgres: the listening connection could not be made; retrying");
                state.send_replace(Listening::Failed(err));
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = state.closed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        let Some(live) = queues.upgrade() else { return };
        connections.fetch_add(1, Ordering::Relaxed);
        state.send_replace(Listening::Ready);
        // Whatever was notified before `LISTEN` took effect was not seen: look again.
        live.resync();
        drop(live);
        loop {
            tokio::select! {
                _ = &mut driver => break,
                () = tokio::time::sleep(HEALTH_EVERY) => {
                    let healthy = tokio::time::timeout(timeout, client.simple_query("SELECT 1")).await;
                    if !matches!(healthy, Ok(Ok(_))) {
                        tracing::debug!("coord-postgres: the listening connection did not answer its health check; making it again");
                        break;
                    }
                }
                () = state.closed() => {
                    driver.abort();
                    return;
                }
            }
        }
        driver.abort();
        drop(client);
        state.send_replace(Listening::Connecting);
        if let Some(live) = queues.upgrade() {
            // Notifications may be lost until the new connection listens: every waiter looks
            // again now, and keeps its timer.
            live.resync();
        }
    }
}

/// Makes the listening connection, spawns the task that reads it (delivering notifications),
/// and sends `LISTEN`.
async fn connect(
    settings: &ListenerSettings,
    queues: WeakQueues<()>,
) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), BackendError> {
    let address = &settings.settings.address;
    let what = "making the listening connection";
    let failed = |e: tokio_postgres::Error| crate::errors::backend_error(&e, what, address);
    let (client, driver) = match &settings.settings.tls {
        Tls::None => {
            let (client, connection) = settings
                .settings
                .config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(failed)?;
            (client, tokio::spawn(drive(connection, queues)))
        }
        #[cfg(feature = "tls")]
        Tls::Rustls(tls) => {
            let (client, connection) = settings
                .settings
                .config
                .connect(tls.clone())
                .await
                .map_err(failed)?;
            (client, tokio::spawn(drive(connection, queues)))
        }
    };
    match client
        .batch_execute(&format!("LISTEN {}", settings.channel))
        .await
    {
        Ok(()) => Ok((client, driver)),
        Err(e) => {
            driver.abort();
            Err(failed(e))
        }
    }
}

/// Reads the listening connection until it ends, delivering each notification.
async fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>, queues: WeakQueues<()>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(note))) => match queues.upgrade() {
                Some(queues) => queues.deliver(note.payload()),
                None => return,
            },
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
    }
}
