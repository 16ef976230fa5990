//! Local waiter queues over the one shared subscriber connection, and the loop every wait
//! runs over them ([`Hub::wait`], in `wait_loop`).
//!
//! A provider has one subscriber connection, opened the first time something waits. Each
//! channel someone waits on is subscribed once, however many tasks wait on it, and
//! unsubscribed when the last one leaves. A lock channel wakes only the head of its queue (the
//! task that started waiting first): one release, one retry. Only the head talks to Redis: a
//! task that joins a queue with a head already watching waits without a look of its own. When
//! the head leaves the queue (it gave up or was cancelled, or got the lock without arranging a
//! wake-up for the rest) the next one is woken to look and take over the watch; when it got
//! the lock and left it marked for this process ([`Look::DoneWatched`]), the next one is
//! promoted quietly ([`Cue::Promoted`]): it keeps the re-check timer and waits for the release.
//! A record channel wakes every waiter, since a settled record answers them all.
//!
//! Wake-one across processes: each provider has an id ([`Hub::id`]), and a lock channel is
//! subscribed under two names, the channel itself and `<channel>#<id>`. A waiting process puts
//! its id in the lock's queue in Redis; a release that finds waiters publishes to the first
//! process in that queue only (see `scripts`), so one release wakes one process's head
//! instead of every process's. A message on the plain channel (a forced release, a release
//! that found the queue gone) still wakes the head of every process.
//!
//! Subscription changes go through one task, in the order they were decided, so a quick
//! "unsubscribe, then subscribe again" cannot be reordered into a lost subscription. After
//! the subscriber reconnects, that task renews every subscription and wakes every head:
//! a release published while the connection was down was not seen.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use tokio::sync::{Notify, mpsc, watch};

use crate::transport::{Subscriber, SubscriberEvents, Transport};

mod wait_loop;

pub(crate) use wait_loop::{Cue, Look};

/// How a channel's waiters are woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The head of the queue only (lock hand-off).
    Head,
    /// Everyone (a settled idempotency record).
    All,
}

#[derive(Debug, Clone)]
enum SubState {
    Pending,
    Ready,
    Failed(BackendError),
}

struct Waiter {
    id: u64,
    notify: Notify,
    /// Set when the wake-up came from a reconnection rather than a message: nothing may have
    /// happened, the waiter should look again.
    resynced: AtomicBool,
    /// Set when the waiter became head because the previous head got the lock and left it
    /// marked for this process: nothing to look at until the release.
    promoted: AtomicBool,
}

/// Why a waiter woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    /// A message arrived on the channel (or the waiter became head of its queue).
    Message,
    /// The subscriber reconnected: a message may have been missed, or nothing happened.
    Resync,
    /// Became head of a hand-off queue whose wake-up is already arranged.
    Promoted,
}

struct Channel {
    waiters: VecDeque<Arc<Waiter>>,
    wake: Wake,
    ready: watch::Receiver<SubState>,
}

enum Op {
    /// Subscribe these names (one channel's), then report on the sender.
    Subscribe(Vec<String>, watch::Sender<SubState>),
    Unsubscribe(Vec<String>),
    Resync,
}

#[derive(Default)]
struct Shared {
    channels: Mutex<HashMap<String, Channel>>,
    next_id: AtomicU64,
    /// `#<provider id>`: the suffix of this provider's own name for a lock channel.
    suffix: String,
}

impl Shared {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        // A panic while holding this lock cannot leave the map inconsistent (every critical
        // section is a single insert/remove), so a poisoned lock is still usable.
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn deliver(&self, channel: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        // A message for this process alone names the channel it is about.
        let channel = channel
            .strip_suffix(self.suffix.as_str())
            .unwrap_or(channel);
        let map = self.channels();
        if let Some(ch) = map.get(channel) {
            match ch.wake {
                Wake::Head => {
                    if let Some(head) = ch.waiters.front() {
                        head.notify.notify_one();
                    }
                }
                Wake::All => ch.waiters.iter().for_each(|w| w.notify.notify_one()),
            }
        }
    }

    /// Every name this process is subscribed under for `channel` (of kind `wake`).
    fn names(&self, channel: &str, wake: Wake) -> impl Iterator<Item = String> + use<> {
        let own = (wake == Wake::Head).then(|| format!("{channel}{}", self.suffix));
        std::iter::once(channel.to_owned()).chain(own)
    }

    fn wake_every_head(&self) {
        let wake = |w: &Arc<Waiter>| {
            w.resynced.store(true, Ordering::Relaxed);
            w.notify.notify_one();
        };
        let map = self.channels();
        for ch in map.values() {
            match ch.wake {
                Wake::Head => ch.waiters.front().into_iter().for_each(wake),
                Wake::All => ch.waiters.iter().for_each(wake),
            }
        }
    }
}

struct Events {
    shared: Weak<Shared>,
    ops: mpsc::WeakUnboundedSender<Op>,
}

impl SubscriberEvents for Events {
    fn message(&self, channel: &[u8]) {
        if let Some(shared) = self.shared.upgrade() {
            shared.deliver(channel);
        }
    }

    fn resync(&self) {
        if let Some(ops) = self.ops.upgrade() {
            let _ = ops.send(Op::Resync);
        }
    }
}

/// The waiter queues of one provider.
pub(crate) struct Hub {
    shared: Arc<Shared>,
    ops: OnceLock<mpsc::UnboundedSender<Op>>,
    /// The command timeout: bounds each subscription change.
    timeout: Duration,
}

impl Hub {
    /// Queues whose subscription changes are each bounded by `timeout` (the provider's
    /// command timeout).
    pub(crate) fn new(timeout: Duration) -> Hub {
        let id = format!("{:016x}", rand::random::<u64>());
        Hub {
            shared: Arc::new(Shared {
                suffix: format!("#{id}"),
                ..Shared::default()
            }),
            ops: OnceLock::new(),
            timeout,
        }
    }

    /// This provider's id in lock queues: 16 hex digits, random per provider. A release that
    /// picks this process publishes on `<channel>#<id>`.
    pub(crate) fn id(&self) -> &str {
        &self.shared.suffix[1..]
    }

    /// Whether a task of this process already waits on `channel`.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.shared.channels().contains_key(channel)
    }

    /// Whether more than one task of this process waits on `channel`.
    pub(crate) fn has_others(&self, channel: &str) -> bool {
        self.shared
            .channels()
            .get(channel)
            .is_some_and(|ch| ch.waiters.len() > 1)
    }

    /// The subscription task's queue, starting the task (and the subscriber connection) on
    /// first use.
    fn ops(&self, transport: &Arc<dyn Transport>) -> mpsc::UnboundedSender<Op> {
        self.ops
            .get_or_init(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                let events = Arc::new(Events {
                    shared: Arc::downgrade(&self.shared),
                    ops: tx.downgrade(),
                });
                let subscriber = transport.subscriber(events);
                tokio::spawn(manage(
                    subscriber,
                    rx,
                    Arc::downgrade(&self.shared),
                    self.timeout,
                ));
                tx
            })
            .clone()
    }

    /// Joins the queue of `channel`, subscribing first if nobody here listens to it yet.
    /// Resolves once the subscription is confirmed, so a message published after this returns
    /// is seen. Fails if the subscription cannot be made within `limit`.
    async fn join(
        &self,
        transport: &Arc<dyn Transport>,
        channel: String,
        wake: Wake,
        limit: Duration,
    ) -> Result<Ticket, BackendError> {
        let ops = self.ops(transport);
        let waiter = Arc::new(Waiter {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            notify: Notify::new(),
            resynced: AtomicBool::new(false),
            promoted: AtomicBool::new(false),
        });
        let mut ready = {
            let mut map = self.shared.channels();
            match map.entry(channel.clone()) {
                Entry::Occupied(mut slot) => {
                    slot.get_mut().waiters.push_back(waiter.clone());
                    slot.get().ready.clone()
                }
                Entry::Vacant(slot) => {
                    let (tx, rx) = watch::channel(SubState::Pending);
                    slot.insert(Channel {
                        waiters: VecDeque::from([waiter.clone()]),
                        wake,
                        ready: rx.clone(),
                    });
                    let names = self.shared.names(&channel, wake).collect();
                    let _ = ops.send(Op::Subscribe(names, tx));
                    rx
                }
            }
        };
        // From here on, dropping the ticket takes the waiter out of the queue again.
        let ticket = Ticket {
            shared: self.shared.clone(),
            ops,
            channel,
            waiter,
            quiet: false,
        };
        let state =
            tokio::time::timeout(limit, ready.wait_for(|s| !matches!(s, SubState::Pending))).await;
        match state {
            Ok(Ok(state)) => match &*state {
                SubState::Ready => Ok(ticket),
                SubState::Failed(err) => Err(err.clone()),
                SubState::Pending => unreachable!("waited for a settled state"),
            },
            Ok(Err(_)) => Err(BackendError::new(
                BackendErrorKind::Unavailable,
                "the subscriber connection stopped",
            )),
            Err(_) => Err(BackendError::new(
                BackendErrorKind::Timeout,
                format!(
                    "subscribing to `{}` took longer than {limit:?}",
                    ticket.channel
                ),
            )),
        }
    }
}

/// A place in a channel's queue. Dropping it leaves the queue.
struct Ticket {
    shared: Arc<Shared>,
    ops: mpsc::UnboundedSender<Op>,
    channel: String,
    waiter: Arc<Waiter>,
    /// Leaving with the lock, marked for this process: the next head is promoted without a
    /// look.
    quiet: bool,
}

impl Ticket {
    /// True while this waiter is the first in its queue.
    fn is_head(&self) -> bool {
        let map = self.shared.channels();
        map.get(&self.channel)
            .and_then(|ch| ch.waiters.front())
            .is_some_and(|head| head.id == self.waiter.id)
    }

    /// Resolves on the next wake-up (or at once if one arrived since the last call).
    async fn woken(&self) -> Woken {
        self.waiter.notify.notified().await;
        if self.waiter.resynced.swap(false, Ordering::Relaxed) {
            Woken::Resync
        } else if self.waiter.promoted.swap(false, Ordering::Relaxed) {
            Woken::Promoted
        } else {
            Woken::Message
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut map = self.shared.channels();
        let Some(ch) = map.get_mut(&self.channel) else {
            return;
        };
        let Some(pos) = ch.waiters.iter().position(|w| w.id == self.waiter.id) else {
            return;
        };
        ch.waiters.remove(pos);
        if ch.waiters.is_empty() {
            let wake = ch.wake;
            map.remove(&self.channel);
            let names = self.shared.names(&self.channel, wake).collect();
            let _ = self.ops.send(Op::Unsubscribe(names));
        } else if pos == 0 && ch.wake == Wake::Head {
            // The watch passes to the next waiter: it retries once and keeps the backstop, or,
            // when the release will wake this process anyway, only keeps the backstop.
            let next = &ch.waiters[0];
            if self.quiet {
                next.promoted.store(true, Ordering::Relaxed);
            }
            next.notify.notify_one();
        }
    }
}

/// Applies subscription changes in order, over the one subscriber connection.
async fn manage(
    subscriber: Box<dyn Subscriber>,
    mut rx: mpsc::UnboundedReceiver<Op>,
    shared: Weak<Shared>,
    timeout: Duration,
) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let mut ops = batch.drain(..).peekable();
        while let Some(op) = ops.next() {
            match op {
                Op::Subscribe(names, tx) => {
                    // Consecutive subscriptions go out as one command.
                    let mut channels = names;
                    let mut senders = vec![tx];
                    while let Some(Op::Subscribe(..)) = ops.peek() {
                        if let Some(Op::Subscribe(c, t)) = ops.next() {
                            channels.extend(c);
                            senders.push(t);
                        }
                    }
                    let state = match tokio::time::timeout(timeout, subscriber.subscribe(&channels))
                        .await
                    {
                        Ok(Ok(())) => SubState::Ready,
                        Ok(Err(fault)) => {
                            SubState::Failed(fault.into_backend("subscribing for wake-ups"))
                        }
                        Err(_) => SubState::Failed(BackendError::new(
                            BackendErrorKind::Timeout,
                            format!("subscribing for wake-ups took longer than {timeout:?}"),
                        )),
                    };
                    for tx in senders {
                        let _ = tx.send(state.clone());
                    }
                }
                Op::Unsubscribe(channels) => {
                    // A failure leaves a stray subscription at worst; its messages find no
                    // queue and are ignored, and a reconnect drops it.
                    let _ = tokio::time::timeout(timeout, subscriber.unsubscribe(&channels)).await;
                }
                Op::Resync => {
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    let channels: Vec<String> = shared
                        .channels()
                        .iter()
                        .flat_map(|(name, ch)| shared.names(name, ch.wake))
                        .collect();
                    if !channels.is_empty() {
                        let renewed =
                            tokio::time::timeout(timeout, subscriber.subscribe(&channels)).await;
                        if !matches!(renewed, Ok(Ok(()))) {
                            tracing::debug!(
                                "coord-redis: renewing subscriptions after a reconnect failed; waiters fall back to their lease backstop"
                            );
                        }
                    }
                    shared.wake_every_head();
                }
            }
        }
    }
}
