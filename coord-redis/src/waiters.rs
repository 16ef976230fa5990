//! Redis's side of waiting: the one shared subscriber connection, with each channel someone
//! waits on subscribed once, and Redis's way into the shared waiter queues and wait loop
//! (`coord_core::provider::waiting`: the queues, the head that watches, the loop of looks
//! and re-checks), which [`Hub::wait`] runs.
//!
//! A provider has one subscriber connection, opened the first time something waits. Each
//! channel someone waits on is subscribed once, however many tasks wait on it, and
//! unsubscribed when the last one leaves. A lock channel wakes only the head of its queue;
//! a task that joins behind a head makes no look of its own until it becomes head. When the
//! head got the lock and left it marked for this process ([`Look::DoneWatched`]), the next
//! one is promoted quietly ([`Cue::Promoted`]): it keeps the re-check timer and waits for the
//! release. Re-check timers are the looks' own (capped and jittered where a lease is
//! watched), so the loop sleeps exactly as long as the look said.
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

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use coord_core::provider::waiting::{
    self, QueueState, Queues, Recheck, Ticket, WaitRules, WeakQueues,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::transport::{Subscriber, SubscriberEvents, Transport};

pub(crate) use coord_core::provider::waiting::{Cue, Look, Wake};

/// The longest a waiter sleeps before looking again when no message comes: a lost message,
/// a holder that crashed and lets its lease run out, or a subscription that could not be
/// made.
pub(crate) const BACKSTOP_CAP: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
enum SubState {
    Pending,
    Ready,
    Failed(BackendError),
}

/// What a channel's queue keeps beside its waiters: its subscription.
pub(crate) struct Channel {
    /// Every name this process is subscribed under for the channel.
    names: Vec<String>,
    ready: watch::Receiver<SubState>,
    ops: mpsc::UnboundedSender<Op>,
}

impl QueueState for Channel {
    fn emptied(self, _channel: &str, _wake: Wake) {
        let _ = self.ops.send(Op::Unsubscribe(self.names));
    }
}

enum Op {
    /// Subscribe these names (one channel's), then report on the sender.
    Subscribe(Vec<String>, watch::Sender<SubState>),
    Unsubscribe(Vec<String>),
    Resync,
}

/// How a lock reached a waiter without an acquire of its own: a release handed it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handed {
    /// By a release of this provider: the lock is the waiter's with its full lease, and
    /// this fencing token (0: not fenced).
    Local(u64),
    /// By another process's release, told in a message: the lock is the waiter's for the
    /// claim window only, until it confirms.
    Remote,
}

/// The lock waiters of this provider that can be handed a lock, by lock and owner token.
type Mailboxes = Arc<Mutex<HashMap<(String, String), mpsc::UnboundedSender<Handed>>>>;

/// A waiter's place in [`Mailboxes`]; dropping it takes the place away.
pub(crate) struct Mailbox {
    boxes: Mailboxes,
    at: (String, String),
    rx: mpsc::UnboundedReceiver<Handed>,
}

impl Mailbox {
    /// The next hand-over (cancel-safe).
    pub(crate) async fn handed(&mut self) -> Handed {
        match self.rx.recv().await {
            Some(handed) => handed,
            // The sender lives in the map until this mailbox is dropped.
            None => std::future::pending().await,
        }
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        lock_boxes(&self.boxes).remove(&self.at);
    }
}

fn lock_boxes(
    boxes: &Mailboxes,
) -> std::sync::MutexGuard<'_, HashMap<(String, String), mpsc::UnboundedSender<Handed>>> {
    // Every critical section is one insert, remove or lookup: a poisoned lock still guards a
    // consistent map.
    boxes.lock().unwrap_or_else(|e| e.into_inner())
}

struct Events {
    queues: WeakQueues<Channel>,
    mailboxes: Mailboxes,
    /// `#<provider id>`: the suffix of this provider's own name for a lock channel.
    suffix: String,
    ops: mpsc::WeakUnboundedSender<Op>,
}

impl SubscriberEvents for Events {
    fn message(&self, channel: &[u8], payload: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        // A message for this process alone names the channel it is about.
        let own = channel.strip_suffix(self.suffix.as_str());
        let channel = own.unwrap_or(channel);
        // A hand-over names its new owner: only that waiter is told. One nobody here waits
        // for any more (it gave up) is dropped: its withdrawal gives the lock back.
        if own.is_some() && !payload.is_empty() {
            if let Ok(owner) = std::str::from_utf8(payload) {
                let at = (channel.to_owned(), owner.to_owned());
                if let Some(tx) = lock_boxes(&self.mailboxes).get(&at) {
                    let _ = tx.send(Handed::Remote);
                }
            }
            return;
        }
        if let Some(queues) = self.queues.upgrade() {
            queues.deliver(channel);
        }
    }

    fn resync(&self) {
        if let Some(ops) = self.ops.upgrade() {
            let _ = ops.send(Op::Resync);
        }
    }
}

/// A lock waiter's place in this process's queue for the lock (see [`Hub::join_lock`]).
pub(crate) type LockTicket = Ticket<Channel>;

/// The waiter queues of one provider and its subscriber connection.
pub(crate) struct Hub {
    queues: Queues<Channel>,
    mailboxes: Mailboxes,
    /// `#<provider id>`: the suffix of this provider's own name for a lock channel.
    suffix: String,
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
            queues: Queues::new(),
            mailboxes: Arc::default(),
            suffix: format!("#{id}"),
            ops: OnceLock::new(),
            timeout,
        }
    }

    /// This provider's id in lock queues: 16 hex digits, random per provider. A release that
    /// picks this process publishes on `<channel>#<id>`.
    pub(crate) fn id(&self) -> &str {
        &self.suffix[1..]
    }

    /// Whether a task of this process already waits on `channel`.
    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        self.queues.has_waiters(channel)
    }

    /// A place for `owner` to be handed the lock `channel` by a release (in a message, or by
    /// [`Hub::hand_locally`]). Made before the waiter's entry goes into the lock's queue in
    /// Redis, so no hand-over finds it missing.
    pub(crate) fn mailbox(&self, channel: &str, owner: &str) -> Mailbox {
        let (tx, rx) = mpsc::unbounded_channel();
        let at = (channel.to_owned(), owner.to_owned());
        lock_boxes(&self.mailboxes).insert(at.clone(), tx);
        Mailbox {
            boxes: self.mailboxes.clone(),
            at,
            rx,
        }
    }

    /// A release of this provider handed `channel` to `owner`, a waiter of this provider:
    /// tells it. False when that waiter is gone (it gave up; its withdrawal, sent when it
    /// gave up, releases the lock onward).
    pub(crate) fn hand_locally(&self, channel: &str, owner: &str, fencing_token: u64) -> bool {
        let at = (channel.to_owned(), owner.to_owned());
        lock_boxes(&self.mailboxes)
            .get(&at)
            .is_some_and(|tx| tx.send(Handed::Local(fencing_token)).is_ok())
    }

    /// Joins the lock waiters of `channel` in this process, subscribing first if nobody here
    /// listens to it yet; resolves once the subscription is settled (bounded by the command
    /// timeout), with the ticket either way and whether the subscription was confirmed. The
    /// ticket's head keeps the re-check timer for the others.
    pub(crate) async fn join_lock(
        &self,
        transport: &Arc<dyn Transport>,
        channel: String,
    ) -> (LockTicket, Result<(), BackendError>) {
        self.join_settled(transport, channel, Wake::Head, self.timeout)
            .await
    }

    /// Every name this process is subscribed under for `channel` (of kind `wake`).
    fn names(&self, channel: &str, wake: Wake) -> Vec<String> {
        let own = (wake == Wake::Head).then(|| format!("{channel}{}", self.suffix));
        std::iter::once(channel.to_owned()).chain(own).collect()
    }

    /// The subscription task's queue, starting the task (and the subscriber connection) on
    /// first use.
    fn ops(&self, transport: &Arc<dyn Transport>) -> mpsc::UnboundedSender<Op> {
        self.ops
            .get_or_init(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                let events = Arc::new(Events {
                    queues: self.queues.downgrade(),
                    mailboxes: self.mailboxes.clone(),
                    suffix: self.suffix.clone(),
                    ops: tx.downgrade(),
                });
                let subscriber = transport.subscriber(events);
                tokio::spawn(manage(
                    subscriber,
                    rx,
                    self.queues.downgrade(),
                    self.timeout,
                ));
                tx
            })
            .clone()
    }

    /// Joins the queue of `channel`, subscribing first if nobody here listens to it yet, and
    /// resolves once the subscription is settled (so a message published after a confirmed
    /// subscription is seen): the ticket, kept in the queue either way, and whether the
    /// subscription was confirmed within `limit`.
    async fn join_settled(
        &self,
        transport: &Arc<dyn Transport>,
        channel: String,
        wake: Wake,
        limit: Duration,
    ) -> (Ticket<Channel>, Result<(), BackendError>) {
        let ops = self.ops(transport);
        let subscribe = |channel: &str| {
            let (tx, rx) = watch::channel(SubState::Pending);
            let names = self.names(channel, wake);
            let _ = ops.send(Op::Subscribe(names.clone(), tx));
            Channel {
                names,
                ready: rx,
                ops: ops.clone(),
            }
        };
        // From here on, dropping the ticket takes the waiter out of the queue again.
        let (ticket, mut ready) = self
            .queues
            .join(channel, wake, subscribe, |ch| ch.ready.clone());
        let state =
            tokio::time::timeout(limit, ready.wait_for(|s| !matches!(s, SubState::Pending))).await;
        let subscribed = match state {
            Ok(Ok(state)) => match &*state {
                SubState::Ready => Ok(()),
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
                    ticket.channel()
                ),
            )),
        };
        (ticket, subscribed)
    }

    /// Waits on `channel` until `look` answers, or until `deadline` (`None`: no end)
    /// passes, which answers `timed_out`: the shared loop (`waiting::wait`, whose promises
    /// hold here) over this provider's subscriptions.
    ///
    /// Redis's rules: on a hand-off channel ([`Wake::Head`]) a waiter that joins behind a
    /// head makes no look until it becomes head (or its deadline comes); after a look that
    /// did not answer the waiter sleeps exactly the lapse the look named (the looks cap and
    /// jitter it where a lease is watched; none named: only a message or the deadline wakes
    /// it). Making the subscription is bounded by the command timeout; a subscription that
    /// failed (the subscriber connection dropped while it was being made, was slow, or was
    /// refused) does not end the wait: the waiter keeps its place and looks again at most
    /// every [`BACKSTOP_CAP`] without messages, and the renewal after the subscriber reconnects
    /// wakes it as it wakes every waiter.
    pub(crate) async fn wait<T, F, Fut>(
        &self,
        transport: &Arc<dyn Transport>,
        channel: String,
        wake: Wake,
        deadline: Option<Instant>,
        timed_out: T,
        look: F,
    ) -> Result<T, BackendError>
    where
        F: FnMut(Cue) -> Fut,
        Fut: Future<Output = Result<Look<T>, BackendError>>,
    {
        let joining = self.join_settled(transport, channel, wake, self.timeout);
        let (ticket, subscribed) = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
                Ok(joined) => joined,
                Err(_) => return Ok(timed_out),
            },
            None => joining.await,
        };
        let recheck = match subscribed {
            Ok(()) => Recheck::AsLooked,
            Err(err) => {
                // Without messages, a look that names no lapse would otherwise be followed
                // only by the deadline (or never, without one).
                tracing::debug!(
                    channel = %ticket.channel(),
                    error = %err,
                    "coord-redis: waiting without wake-up messages, looking again at most every {BACKSTOP_CAP:?}"
                );
                Recheck::Capped(BACKSTOP_CAP)
            }
        };
        let rules = WaitRules {
            wake,
            recheck,
            followers_wait_for_head: true,
        };
        waiting::wait(
            std::future::ready(Ok(ticket)),
            rules,
            deadline,
            timed_out,
            look,
        )
        .await
    }
}

/// Applies subscription changes in order, over the one subscriber connection.
async fn manage(
    subscriber: Box<dyn Subscriber>,
    mut rx: mpsc::UnboundedReceiver<Op>,
    queues: WeakQueues<Channel>,
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
                    let Some(queues) = queues.upgrade() else {
                        return;
                    };
                    let mut channels = Vec::new();
                    queues.for_each(|_, _, ch| channels.extend(ch.names.iter().cloned()));
                    if !channels.is_empty() {
                        let renewed =
                            tokio::time::timeout(timeout, subscriber.subscribe(&channels)).await;
                        if !matches!(renewed, Ok(Ok(()))) {
                            tracing::debug!(
                                "coord-redis: renewing subscriptions after a reconnect failed; waiters fall back to their lease backstop"
                            );
                        }
                    }
                    queues.resync();
                }
            }
        }
    }
}
