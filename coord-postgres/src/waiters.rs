//! Waiting without polling: one listening connection per provider, fanned out to local
//! waiter queues, and the one loop every wait runs ([`Hub::wait`]).
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

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_postgres::AsyncMessage;

use crate::connection::{Drivers, Settings, Tls};

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

/// How a queue's waiters are woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The head of the queue only (lock hand-off).
    Head,
    /// Everyone (a settled record, a finished flight).
    All,
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

struct Waiter {
    id: u64,
    notify: Notify,
    /// Set when the wake-up came from a reconnection rather than a notification.
    resynced: AtomicBool,
}

/// Why a waiter woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    Message,
    Resync,
}

struct Queue {
    waiters: VecDeque<Arc<Waiter>>,
    wake: Wake,
}

#[derive(Default)]
struct Shared {
    queues: Mutex<HashMap<String, Queue>>,
    next_id: AtomicU64,
    connections: AtomicU64,
}

impl Shared {
    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<String, Queue>> {
        // Every critical section is a single insert, remove or scan: a panic cannot leave
        // the map inconsistent, so a poisoned lock is still usable.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, payload: &str) {
        let queues = self.queues();
        if let Some(queue) = queues.get(payload) {
            match queue.wake {
                Wake::Head => {
                    if let Some(head) = queue.waiters.front() {
                        head.notify.notify_one();
                    }
                }
                Wake::All => queue.waiters.iter().for_each(|w| w.notify.notify_one()),
            }
        }
    }

    /// Wakes every queue's head (and every waiter of a wake-all queue) to look again.
    fn resync(&self) {
        let wake = |w: &Arc<Waiter>| {
            w.resynced.store(true, Ordering::Relaxed);
            w.notify.notify_one();
        };
        let queues = self.queues();
        for queue in queues.values() {
            match queue.wake {
                Wake::Head => queue.waiters.front().into_iter().for_each(wake),
                Wake::All => queue.waiters.iter().for_each(wake),
            }
        }
    }
}

/// The waiter queues of one provider and its listening connection.
pub(crate) struct Hub {
    shared: Arc<Shared>,
    settings: Mutex<Option<ListenerSettings>>,
    state: OnceLock<watch::Receiver<Listening>>,
    timeout: Duration,
}

impl Hub {
    /// Queues served by a listener made from `settings` when first needed; `timeout` (the
    /// command timeout) bounds each of its round trips.
    pub(crate) fn new(settings: ListenerSettings, timeout: Duration) -> Hub {
        Hub {
            shared: Arc::new(Shared::default()),
            settings: Mutex::new(Some(settings)),
            state: OnceLock::new(),
            timeout,
        }
    }

    /// How many times the listening connection was made.
    pub(crate) fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
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
                        Arc::downgrade(&self.shared),
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
    async fn join(&self, payload: String, wake: Wake) -> Result<Ticket, BackendError> {
        let mut state = self.state();
        let waiter = Arc::new(Waiter {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            notify: Notify::new(),
            resynced: AtomicBool::new(false),
        });
        {
            let mut queues = self.shared.queues();
            match queues.entry(payload.clone()) {
                Entry::Occupied(mut slot) => slot.get_mut().waiters.push_back(waiter.clone()),
                Entry::Vacant(slot) => {
                    slot.insert(Queue {
                        waiters: VecDeque::from([waiter.clone()]),
                        wake,
                    });
                }
            }
        }
        // From here on, dropping the ticket takes the waiter out of its queue again.
        let ticket = Ticket {
            shared: self.shared.clone(),
            payload,
            waiter,
        };
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
}

/// A place in a queue. Dropping it leaves the queue.
struct Ticket {
    shared: Arc<Shared>,
    payload: String,
    waiter: Arc<Waiter>,
}

impl Ticket {
    fn is_head(&self) -> bool {
        let queues = self.shared.queues();
        queues
            .get(&self.payload)
            .and_then(|q| q.waiters.front())
            .is_some_and(|head| head.id == self.waiter.id)
    }

    async fn woken(&self) -> Woken {
        self.waiter.notify.notified().await;
        if self.waiter.resynced.swap(false, Ordering::Relaxed) {
            Woken::Resync
        } else {
            Woken::Message
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = self.shared.queues();
        let Some(queue) = queues.get_mut(&self.payload) else {
            return;
        };
        let Some(pos) = queue.waiters.iter().position(|w| w.id == self.waiter.id) else {
            return;
        };
        queue.waiters.remove(pos);
        if queue.waiters.is_empty() {
            queues.remove(&self.payload);
        } else if pos == 0 && queue.wake == Wake::Head {
            // The watch passes to the next waiter: it looks once and keeps the timer.
            queue.waiters[0].notify.notify_one();
        }
    }
}

/// Keeps one listening connection up for as long as the hub exists.
async fn listen(
    settings: ListenerSettings,
    shared: Weak<Shared>,
    state: watch::Sender<Listening>,
    timeout: Duration,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let connecting = tokio::time::timeout(timeout, connect(&settings, shared.clone()));
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
        let Some(live) = shared.upgrade() else { return };
        live.connections.fetch_add(1, Ordering::Relaxed);
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
        if let Some(live) = shared.upgrade() {
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
    shared: Weak<Shared>,
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
            (client, tokio::spawn(drive(connection, shared)))
        }
        #[cfg(feature = "tls")]
        Tls::Rustls(tls) => {
            let (client, connection) = settings
                .settings
                .config
                .connect(tls.clone())
                .await
                .map_err(failed)?;
            (client, tokio::spawn(drive(connection, shared)))
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
async fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>, shared: Weak<Shared>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(note))) => match shared.upgrade() {
                Some(shared) => shared.deliver(note.payload()),
                None => return,
            },
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return,
        }
    }
}

/// What one look at the watched state found.
#[derive(Debug)]
pub(crate) enum Look<T> {
    /// The wait is over, with this answer.
    Done(T),
    /// Not yet. `Some(lapse)`: the state ends by itself within `lapse` at the latest (a
    /// lease's remaining time, measured by the server).
    Pending(Option<Duration>),
}

/// Why the state is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cue {
    /// The first look, once `LISTEN` is confirmed.
    Listening,
    /// A notification (or, in a hand-off queue, this waiter became its head).
    Message,
    /// The listening connection was made again: a notification may have been missed.
    Resync,
    /// The lapse the last look named, the re-check interval, or the deadline has come.
    Timer,
}

impl Hub {
    /// Waits on `payload` until `look` answers, or until `deadline` (`None`: no end) passes,
    /// which answers `timed_out`.
    ///
    /// Promised:
    /// * **No lost wake-up.** The listener has confirmed `LISTEN` before the first look; a
    ///   change committed after that look's snapshot notifies this waiter, one before it is
    ///   seen by the look.
    /// * **A look after every wake-up**: a notification, a reconnection of the listener, or a
    ///   timer.
    /// * **Bounded sleeps.** The waiter looks again at the lapse the last look named, and at
    ///   most [`RECHECK_CAP`] (jittered) after the last look, whichever is first; in a
    ///   hand-off queue only its head keeps a timer (the others are woken when they become
    ///   head).
    /// * **Bounded.** Never sleeps past `deadline`; a deadline passing while joining answers
    ///   `timed_out` at once, one passing during a sleep is followed by one last look.
    pub(crate) async fn wait<T, F, Fut>(
        &self,
        payload: String,
        wake: Wake,
        deadline: Option<Instant>,
        timed_out: T,
        mut look: F,
    ) -> Result<T, BackendError>
    where
        F: FnMut(Cue) -> Fut,
        Fut: Future<Output = Result<Look<T>, BackendError>>,
    {
        let joining = self.join(payload, wake);
        let ticket = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
                Ok(ticket) => ticket?,
                Err(_) => return Ok(timed_out),
            },
            None => joining.await?,
        };
        let mut cue = Cue::Listening;
        loop {
            let lapse = match look(cue).await? {
                Look::Done(answer) => return Ok(answer),
                Look::Pending(lapse) => lapse,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(timed_out);
            }
            let keeps_timer = wake == Wake::All || ticket.is_head();
            let recheck = recheck_after(lapse);
            let timer = keeps_timer.then(|| now.checked_add(recheck)).flatten();
            let until = match (timer, deadline) {
                (Some(t), Some(d)) => Some(t.min(d)),
                (t, d) => t.or(d),
            };
            let sleep = async {
                match until {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => std::future::pending().await,
                }
            };
            cue = tokio::select! {
                woken = ticket.woken() => match woken {
                    Woken::Message => Cue::Message,
                    Woken::Resync => Cue::Resync,
                },
                () = sleep => Cue::Timer,
            };
        }
    }
}

/// When to look again without a notification: at the lapse (plus a millisecond, so the state
/// has surely ended on the server), at most [`RECHECK_CAP`], with jitter so waiters of several
/// processes do not look in lock-step.
pub(crate) fn recheck_after(lapse: Option<Duration>) -> Duration {
    let base = lapse.map_or(RECHECK_CAP, |l| l.min(RECHECK_CAP));
    let spread = (base.as_micros() as u64 / 16).max(2000);
    base + Duration::from_micros(1000 + rand::random_range(0..=spread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rechecks_are_capped_and_after_the_lapse() {
        let d = recheck_after(Some(Duration::from_millis(200)));
        assert!(
            d > Duration::from_millis(200) && d < Duration::from_millis(220),
            "{d:?}"
        );
        let d = recheck_after(Some(Duration::from_secs(60)));
        assert!(
            d > RECHECK_CAP && d < RECHECK_CAP + Duration::from_millis(70),
            "{d:?}"
        );
        assert!(recheck_after(None) > RECHECK_CAP);
        assert!(recheck_after(Some(Duration::ZERO)) >= Duration::from_millis(1));
    }
}
