//! Waiting without polling, for a provider whose backend announces changes (Redis pub/sub,
//! PostgreSQL `LISTEN`/`NOTIFY`): the local queues of waiters per channel, and the one loop
//! every wait runs over them ([`wait`]): look at the state, sleep until woken or until the
//! state lapses on its own, look again.
//!
//! A provider keeps what is its own: how a channel is subscribed and how a subscription is
//! renewed after its connection dropped. It hands this module the messages it receives
//! ([`Queues::deliver`]), says when messages may have been lost ([`Queues::resync`]), and
//! gives [`wait`] its way of joining a queue (subscribing when needed, resolving once the
//! subscription is confirmed) and its "look again" (one round trip that either answers the
//! wait or says how long the state lasts by itself).
//!
//! A hand-off queue ([`Wake::Head`]) wakes only its head, the waiter that joined first: one
//! release, one retry. When the head leaves (it got what it waited for, gave up or was
//! cancelled) the next waiter is woken to look and take over the watch, or, when the head
//! answered [`Look::DoneWatched`], promoted quietly ([`Cue::Promoted`]). A wake-all queue
//! ([`Wake::All`]) wakes every waiter, since one change answers them all.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{BackendError, BackendErrorKind};

/// How a channel's waiters are woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The head of the queue only (a lock or permit hand-off: one release, one retry).
    Head,
    /// Everyone (a settled record, a finished flight, a release that may let several in).
    All,
}

/// What one look at the watched state found.
#[derive(Debug)]
pub enum Look<T> {
    /// The wait is over, with this answer.
    Done(T),
    /// The wait is over, with this answer, and the wake-up of this process's other waiters on
    /// the channel is already arranged (for example a lock taken marked as waited for by this
    /// process): the next waiter takes over the watch without a look of its own
    /// ([`Cue::Promoted`]).
    DoneWatched(T),
    /// Not yet. `Some(lapse)`: the state ends by itself within `lapse` at the latest (a
    /// lease's remaining time, measured by the server), so look again then even if no
    /// message comes. `None`: no known end (see [`Recheck`] for what the loop does then).
    Pending(Option<Duration>),
}

/// Why the state is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cue {
    /// The first look, once the subscription is confirmed.
    Subscribed,
    /// A message on the channel (or, on a hand-off channel, this waiter became the head of
    /// its queue).
    Message,
    /// The connection that receives messages was made again: a message may have been
    /// missed, or nothing happened.
    Resync,
    /// The lapse the last look named, the re-check interval, or the deadline has come.
    Timer,
    /// This waiter became the head of a hand-off queue after the previous head answered
    /// [`Look::DoneWatched`]: the release will send a message. The look should only name
    /// the re-check interval (the backstop against a lost message), without a round trip.
    Promoted,
}

/// How long a waiter sleeps after a look that did not answer, when no message comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// Exactly the lapse the look named (the look caps and jitters it itself); a look that
    /// names none is followed only by a wake-up or the deadline.
    AsLooked,
    /// The lapse the look named, at most the given cap (also when it names none), with a
    /// little jitter: see [`recheck_after`].
    Capped(Duration),
}

/// The rules of one provider's waits, beside the channel's [`Wake`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitRules {
    /// How the channel's waiters are woken.
    pub wake: Wake,
    /// How long to sleep after a look that did not answer.
    pub recheck: Recheck,
    /// On a hand-off channel, whether a waiter that joins behind a head skips its first look
    /// (the head's watch covers it until it becomes head itself or its deadline comes).
    /// `false`: every waiter looks once when it joins.
    pub followers_wait_for_head: bool,
}

/// When to look again without a message: at `lapse` (plus a millisecond, so the state has
/// surely ended on the server), at most `cap` (also when `lapse` is `None`), with jitter so
/// waiters of several processes do not look in lock-step.
///
/// The jitter adds between 1 ms and 1 ms plus a sixteenth of the base (at least 2 ms) to it.
pub fn recheck_after(lapse: Option<Duration>, cap: Duration) -> Duration {
    let base = lapse.map_or(cap, |l| l.min(cap));
    let spread = (base.as_micros() as u64 / 16).max(2000);
    // Without a random source the jitter is the middle of its range: rechecks stay bounded,
    // only less spread out.
    let draw = getrandom::u64().unwrap_or(spread / 2) % (spread + 1);
    base + Duration::from_micros(1000 + draw)
}

/// What a provider keeps per channel beside its waiters (for example the subscription's
/// state), and what it does when the last waiter leaves.
pub trait QueueState: Send + 'static {
    /// Called once, when the last waiter of `channel` leaves, with the queues' lock held: a
    /// provider that unsubscribes here (by sending to the one task that subscribes and
    /// unsubscribes) keeps "unsubscribe, then subscribe again" in the order it was decided.
    /// Must not block or take the queues' lock.
    fn emptied(self, channel: &str, wake: Wake);
}

/// No state per channel: one connection listens for every channel.
impl QueueState for () {
    fn emptied(self, _channel: &str, _wake: Wake) {}
}

struct Waiter {
    id: u64,
    notify: Notify,
    /// Set when the wake-up came from [`Queues::resync`] rather than a message: nothing may
    /// have happened, the waiter should look again.
    resynced: AtomicBool,
    /// Set when the waiter became head because the previous head answered
    /// [`Look::DoneWatched`]: nothing to look at until the release.
    promoted: AtomicBool,
}

impl Waiter {
    fn wake_resynced(&self) {
        self.resynced.store(true, Ordering::Relaxed);
        self.notify.notify_one();
    }
}

/// Why a waiter woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woken {
    Message,
    Resync,
    Promoted,
}

struct Queue<S> {
    waiters: VecDeque<Arc<Waiter>>,
    wake: Wake,
    state: S,
}

struct Shared<S> {
    queues: Mutex<HashMap<String, Queue<S>>>,
    next_id: AtomicU64,
}

impl<S> Shared<S> {
    fn queues(&self) -> MutexGuard<'_, HashMap<String, Queue<S>>> {
        // Every critical section is a single insert, remove or scan, and nothing that can
        // panic runs inside one: a poisoned lock still guards a consistent map.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The waiter queues of one provider, one per channel that someone of this process waits
/// on. Cloning gives another handle to the same queues.
pub struct Queues<S: QueueState> {
    shared: Arc<Shared<S>>,
}

impl<S: QueueState> Clone for Queues<S> {
    fn clone(&self) -> Self {
        Queues {
            shared: self.shared.clone(),
        }
    }
}

impl<S: QueueState> Default for Queues<S> {
    fn default() -> Self {
        Queues::new()
    }
}

/// A handle to [`Queues`] that does not keep them alive (for a provider's background task,
/// which should stop when the provider is gone).
pub struct WeakQueues<S: QueueState> {
    shared: Weak<Shared<S>>,
}

impl<S: QueueState> Clone for WeakQueues<S> {
    fn clone(&self) -> Self {
        WeakQueues {
            shared: self.shared.clone(),
        }
    }
}

impl<S: QueueState> WeakQueues<S> {
    /// The queues, if they still exist.
    pub fn upgrade(&self) -> Option<Queues<S>> {
        self.shared.upgrade().map(|shared| Queues { shared })
    }
}

impl<S: QueueState> Queues<S> {
    /// No queue yet.
    pub fn new() -> Queues<S> {
        Queues {
            shared: Arc::new(Shared {
                queues: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// A handle that does not keep the queues alive.
    pub fn downgrade(&self) -> WeakQueues<S> {
        WeakQueues {
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Joins the queue of `channel` (last in line). When nobody of this process waited on
    /// it, the queue is made with the state `first(channel)` returns, called with the queues' lock
    /// held (so a subscription it asks for is ordered before the unsubscription of a queue
    /// that empties later). Answers the ticket and what `read` finds in the queue's state.
    ///
    /// `wake` is used when the queue is made; a provider uses one [`Wake`] per channel.
    pub fn join<R>(
        &self,
        channel: String,
        wake: Wake,
        first: impl FnOnce(&str) -> S,
        read: impl FnOnce(&S) -> R,
    ) -> (Ticket<S>, R) {
        let waiter = Arc::new(Waiter {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            notify: Notify::new(),
            resynced: AtomicBool::new(false),
            promoted: AtomicBool::new(false),
        });
        let read = {
            let mut queues = self.shared.queues();
            match queues.entry(channel.clone()) {
                Entry::Occupied(mut slot) => {
                    slot.get_mut().waiters.push_back(waiter.clone());
                    read(&slot.get().state)
                }
                Entry::Vacant(slot) => {
                    let state = first(slot.key());
                    let queue = slot.insert(Queue {
                        waiters: VecDeque::from([waiter.clone()]),
                        wake,
                        state,
                    });
                    read(&queue.state)
                }
            }
        };
        let ticket = Ticket {
            shared: self.shared.clone(),
            channel,
            waiter,
            quiet: false,
        };
        (ticket, read)
    }

    /// A message arrived on `channel`: wakes its head (hand-off) or every waiter.
    pub fn deliver(&self, channel: &str) {
        let queues = self.shared.queues();
        if let Some(queue) = queues.get(channel) {
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

    /// Messages may have been lost (the connection that receives them was made again):
    /// wakes every hand-off queue's head and every waiter of a wake-all queue, with
    /// [`Cue::Resync`].
    pub fn resync(&self) {
        let queues = self.shared.queues();
        for queue in queues.values() {
            match queue.wake {
                Wake::Head => queue
                    .waiters
                    .front()
                    .into_iter()
                    .for_each(|w| w.wake_resynced()),
                Wake::All => queue.waiters.iter().for_each(|w| w.wake_resynced()),
            }
        }
    }

    /// Whether a task of this process waits on `channel`.
    pub fn has_waiters(&self, channel: &str) -> bool {
        self.shared.queues().contains_key(channel)
    }

    /// Whether more than one task of this process waits on `channel`.
    pub fn has_others(&self, channel: &str) -> bool {
        self.shared
            .queues()
            .get(channel)
            .is_some_and(|q| q.waiters.len() > 1)
    }

    /// Calls `f` with every channel someone waits on, its [`Wake`] and its state, with the
    /// queues' lock held (so `f` must not block or join).
    pub fn for_each(&self, mut f: impl FnMut(&str, Wake, &S)) {
        let queues = self.shared.queues();
        for (channel, queue) in queues.iter() {
            f(channel, queue.wake, &queue.state);
        }
    }
}

/// A place in a channel's queue. Dropping it leaves the queue (and, when it was the last,
/// calls [`QueueState::emptied`]).
pub struct Ticket<S: QueueState> {
    shared: Arc<Shared<S>>,
    channel: String,
    waiter: Arc<Waiter>,
    /// Leaving with [`Look::DoneWatched`]: the next head is promoted without a look.
    quiet: bool,
}

impl<S: QueueState> Ticket<S> {
    /// The channel this ticket waits on.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// True while this waiter is the first in its queue.
    fn is_head(&self) -> bool {
        let queues = self.shared.queues();
        queues
            .get(&self.channel)
            .and_then(|q| q.waiters.front())
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

impl<S: QueueState> Drop for Ticket<S> {
    fn drop(&mut self) {
        let mut queues = self.shared.queues();
        let Some(queue) = queues.get_mut(&self.channel) else {
            return;
        };
        let Some(pos) = queue.waiters.iter().position(|w| w.id == self.waiter.id) else {
            return;
        };
        queue.waiters.remove(pos);
        if queue.waiters.is_empty() {
            if let Some(queue) = queues.remove(&self.channel) {
                queue.state.emptied(&self.channel, queue.wake);
            }
        } else if pos == 0 && queue.wake == Wake::Head {
            // The watch passes to the next waiter: it looks once and keeps the timer, or,
            // when the wake-up is arranged already, only keeps the timer.
            let next = &queue.waiters[0];
            if self.quiet {
                next.promoted.store(true, Ordering::Relaxed);
            }
            next.notify.notify_one();
        }
    }
}

/// How long a waiter waits before it looks again after a look that timed out: a moment, so
/// that a server that recovers is seen at once, but not a tight loop against one that stays
/// slow (each look already took a command timeout).
pub const TIMED_OUT_LOOK_BACKOFF: Duration = Duration::from_millis(20);

/// Looks that outlast a slow server: a look (or a first attempt before the wait) that fails
/// with [`BackendErrorKind::Timeout`] (a statement waiting on a lock, a paused server) does
/// not end a wait that has time left; it is looked at again after
/// [`TIMED_OUT_LOOK_BACKOFF`] ([`TimedOutLooks::look`] answers [`Look::Pending`] for it).
///
/// Such a look may have taken effect with its reply lost (an acquire that granted), so the
/// looks it wraps must be replay-safe for their owner: the same owner's next look finds its
/// own grant and answers with it. A wait that ends refused (`timed_out`) while the latest
/// look or first attempt had timed out is not a refusal but an unknown:
/// [`TimedOutLooks::settle`] turns it into a `Timeout` error saying so
/// ([`unanswered_looks`]), on which the caller releases by owner.
///
/// Any other error still ends the wait at once.
#[derive(Debug, Default)]
pub struct TimedOutLooks {
    /// The looks that timed out since the last one that answered, and the latest's error.
    unanswered: Mutex<Option<(u32, BackendError)>>,
}

impl TimedOutLooks {
    /// No look timed out yet.
    pub fn new() -> TimedOutLooks {
        TimedOutLooks::default()
    }

    fn unanswered(&self) -> MutexGuard<'_, Option<(u32, BackendError)>> {
        // Only a swap or a take runs under the lock: a poisoned one still holds a value.
        self.unanswered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes what one attempt or look answered: a timeout is remembered (and answers
    /// `Ok(None)`: look again), any answer clears what was remembered (`Ok(Some(answer))`),
    /// any other error is returned.
    pub fn note<A>(&self, answered: Result<A, BackendError>) -> Result<Option<A>, BackendError> {
        match answered {
            Ok(answer) => {
                *self.unanswered() = None;
                Ok(Some(answer))
            }
            Err(err) if err.kind() == BackendErrorKind::Timeout => {
                let mut unanswered = self.unanswered();
                let count = unanswered.as_ref().map_or(0, |(n, _)| *n) + 1;
                *unanswered = Some((count, err));
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// One look of a wait: `looked`, with a timeout turned into "look again soon".
    pub fn look<T>(&self, looked: Result<Look<T>, BackendError>) -> Result<Look<T>, BackendError> {
        Ok(self
            .note(looked)?
            .unwrap_or(Look::Pending(Some(TIMED_OUT_LOOK_BACKOFF))))
    }

    /// The wait's answer, once it ended: `refused` (the wait's `timed_out`) while the latest
    /// look had timed out is the error [`unanswered_looks`] makes of it; anything else is
    /// returned as it is.
    pub fn settle<T>(
        &self,
        answer: Result<T, BackendError>,
        refused: impl FnOnce(&T) -> bool,
    ) -> Result<T, BackendError> {
        match answer {
            Ok(answer) if refused(&answer) => match self.unanswered().take() {
                Some((count, err)) => Err(unanswered_looks(err, count)),
                None => Ok(answer),
            },
            other => other,
        }
    }
}

/// The error of a wait that ended with looks unanswered: `last` (the latest look's timeout),
/// saying that `count` looks in a row timed out, so that what they did (a grant whose reply
/// was lost) is unknown. Kind [`BackendErrorKind::Timeout`], and the key of `last`.
pub fn unanswered_looks(last: BackendError, count: u32) -> BackendError {
    let message = format!(
        "the wait ended after {count} look(s) in a row got no answer in time (the last: {}); \
         what they did is unknown, so a grant they made must be released by its owner",
        last.message()
    );
    let mut err = BackendError::new(BackendErrorKind::Timeout, message);
    if let Some(key) = last.key() {
        err = err.with_key(key);
    }
    err.with_source(last)
}

/// Waits until `look` answers, or until `deadline` (`None`: no end) passes, which answers
/// `timed_out`. `joining` is the provider's way into the channel's queue: it joins
/// ([`Queues::join`]) and resolves once the subscription is confirmed.
///
/// What it promises:
/// * **No lost wake-up**, given a `joining` that resolves only once a message sent from then
///   on reaches this process: a change announced after the first look reaches this waiter as
///   a message, one announced before it is seen by the look itself. On a hand-off channel
///   with [`WaitRules::followers_wait_for_head`], a waiter that joins behind a head makes no
///   look until it becomes head (or its deadline comes): the head's watch covers it.
/// * **A look after every wake-up.** Every message, resync and timer leads to another call
///   of `look`, told why ([`Cue`]); a look may answer from the cue alone where the cue says
///   enough.
/// * **No wait past a lapse.** After a look that did not answer, the waiter looks again at
///   the time [`WaitRules::recheck`] gives at the latest, so a message that never comes (a
///   holder that died, a lost message) costs at most that long. On a hand-off channel only
///   the head of the queue keeps that timer; the others are woken when they become head.
/// * **Bounded.** It never sleeps past `deadline`. A deadline that passes while joining
///   answers `timed_out` at once; one that passes during a sleep is followed by one last
///   look, and a look at or after the deadline that does not answer ends the wait with
///   `timed_out`.
///
/// What it does not promise: a bound on `joining` or on `look`'s own round trips (the
/// provider bounds each, so the deadline can be overrun by one look); an order between
/// waiters of different processes. An error from `joining` or `look` ends the wait with it;
/// a wait whose looks should outlast a slow server wraps them with [`TimedOutLooks`].
pub async fn wait<S, T, J, F, Fut>(
    joining: J,
    rules: WaitRules,
    deadline: Option<Instant>,
    timed_out: T,
    mut look: F,
) -> Result<T, BackendError>
where
    S: QueueState,
    J: Future<Output = Result<Ticket<S>, BackendError>>,
    F: FnMut(Cue) -> Fut,
    Fut: Future<Output = Result<Look<T>, BackendError>>,
{
    // Listen before looking, so a change between the caller's last look and the
    // subscription is seen by the first look here, and one after it by the message.
    let mut ticket = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
            Ok(ticket) => ticket?,
            Err(_) => return Ok(timed_out),
        },
        None => joining.await?,
    };
    let mut cue = Cue::Subscribed;
    let mut skip = rules.followers_wait_for_head && rules.wake == Wake::Head && !ticket.is_head();
    loop {
        let lapse = if std::mem::take(&mut skip) {
            None
        } else {
            match look(cue).await? {
                Look::Done(answer) => return Ok(answer),
                Look::DoneWatched(answer) => {
                    ticket.quiet = true;
                    return Ok(answer);
                }
                Look::Pending(lapse) => match rules.recheck {
                    Recheck::AsLooked => lapse,
                    Recheck::Capped(cap) => Some(recheck_after(lapse, cap)),
                },
            }
        };
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(timed_out);
        }
        let keeps_timer = rules.wake == Wake::All || ticket.is_head();
        let timer = lapse
            .filter(|_| keeps_timer)
            .and_then(|lapse| now.checked_add(lapse));
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
        // Woken, the timer fired, or the deadline came: look again either way. A timer that
        // fires early (tokio caps very distant ones) only costs a look.
        cue = tokio::select! {
            woken = ticket.woken() => match woken {
                Woken::Message => Cue::Message,
                Woken::Resync => Cue::Resync,
                Woken::Promoted => Cue::Promoted,
            },
            () = sleep => Cue::Timer,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;

    const CHANNEL: &str = "ch";
    /// Far beyond every wait of these tests: on the paused clock it only ends a test whose
    /// waiter never returns.
    const STUCK: Duration = Duration::from_secs(3600);

    fn rules(wake: Wake, recheck: Recheck) -> WaitRules {
        WaitRules {
            wake,
            recheck,
            followers_wait_for_head: true,
        }
    }

    type Waiting = std::pin::Pin<
        Box<dyn Future<Output = Result<&'static str, BackendError>> + Send + 'static>,
    >;

    /// A wait on `channel`, joined before this returns (so queue order is call order), not
    /// yet started, whose looks answer `answer(cue)` and report their cue on the receiver.
    fn waiting(
        queues: &Queues<()>,
        channel: &str,
        rules: WaitRules,
        deadline: Option<Instant>,
        mut answer: impl FnMut(Cue) -> Look<&'static str> + Send + 'static,
    ) -> (Waiting, mpsc::UnboundedReceiver<Cue>) {
        let (ticket, ()) = queues.join(channel.to_owned(), rules.wake, |_| (), |_| ());
        let (cues, seen) = mpsc::unbounded_channel();
        let look = move |cue: Cue| {
            let _ = cues.send(cue);
            let look = answer(cue);
            async move { Ok(look) }
        };
        let wait = wait(
            std::future::ready(Ok(ticket)),
            rules,
            deadline,
            "timed out",
            look,
        );
        (Box::pin(wait), seen)
    }

    /// [`waiting`], started.
    fn waiter(
        queues: &Queues<()>,
        channel: &str,
        rules: WaitRules,
        deadline: Option<Instant>,
        answer: impl FnMut(Cue) -> Look<&'static str> + Send + 'static,
    ) -> (
        JoinHandle<Result<&'static str, BackendError>>,
        mpsc::UnboundedReceiver<Cue>,
    ) {
        let (wait, seen) = waiting(queues, channel, rules, deadline, answer);
        (tokio::spawn(wait), seen)
    }

    async fn answer_of(task: JoinHandle<Result<&'static str, BackendError>>) -> &'static str {
        tokio::time::timeout(STUCK, task)
            .await
            .expect("the waiter returned")
            .expect("the waiter did not panic")
            .expect("the waiter did not fail")
    }

    async fn next_cue(seen: &mut mpsc::UnboundedReceiver<Cue>) -> Cue {
        tokio::time::timeout(STUCK, seen.recv())
            .await
            .expect("the waiter looked")
            .expect("the waiter is still running")
    }

    /// Pending with no lapse until a cue other than the first comes, then done.
    fn done_when_woken(cue: Cue) -> Look<&'static str> {
        match cue {
            Cue::Subscribed => Look::Pending(None),
            _ => Look::Done("granted"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_woken_waiter_looks_again() {
        let queues = Queues::new();
        let (task, mut seen) = waiter(
            &queues,
            CHANNEL,
            rules(Wake::Head, Recheck::AsLooked),
            None,
            done_when_woken,
        );
        assert_eq!(next_cue(&mut seen).await, Cue::Subscribed);
        queues.deliver("another channel");
        queues.deliver(CHANNEL);
        assert_eq!(next_cue(&mut seen).await, Cue::Message);
        assert_eq!(answer_of(task).await, "granted");
        assert!(!queues.has_waiters(CHANNEL), "the ticket left the queue");
    }

    #[tokio::test(start_paused = true)]
    async fn a_missed_message_is_recovered_by_the_lapse_recheck() {
        let queues = Queues::new();
        let start = Instant::now();
        let lapse = Duration::from_millis(200);
        let (task, mut seen) = waiter(
            &queues,
            CHANNEL,
            rules(Wake::Head, Recheck::AsLooked),
            None,
            move |cue| match cue {
                Cue::Subscribed => Look::Pending(Some(lapse)),
                _ => Look::Done("granted"),
            },
        );
        assert_eq!(next_cue(&mut seen).await, Cue::Subscribed);
        assert_eq!(next_cue(&mut seen).await, Cue::Timer);
        assert_eq!(answer_of(task).await, "granted");
        assert!(start.elapsed() >= lapse, "{:?}", start.elapsed());

        // Capped: a look with no lapse still looks again at the cap.
        let cap = Duration::from_secs(1);
        let start = Instant::now();
        let (task, mut seen) = waiter(
            &queues,
            CHANNEL,
            rules(Wake::Head, Recheck::Capped(cap)),
            None,
            done_when_woken,
        );
        assert_eq!(next_cue(&mut seen).await, Cue::Subscribed);
        assert_eq!(next_cue(&mut seen).await, Cue::Timer);
        assert_eq!(answer_of(task).await, "granted");
        let waited = start.elapsed();
        assert!(
            waited > cap && waited < cap + Duration::from_millis(70),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_ends_the_wait() {
        let queues = Queues::new();
        let start = Instant::now();
        let deadline = start + Duration::from_millis(500);
        let (task, mut seen) = waiter(
            &queues,
            CHANNEL,
            rules(Wake::All, Recheck::AsLooked),
            Some(deadline),
            |_| Look::Pending(None),
        );
        assert_eq!(answer_of(task).await, "timed out");
        assert!(Instant::now() >= deadline);
        // One last look once the deadline came, then no more.
        assert_eq!(next_cue(&mut seen).await, Cue::Subscribed);
        assert_eq!(next_cue(&mut seen).await, Cue::Timer);
        assert_eq!(seen.recv().await, None);

        // A deadline that passes while joining answers at once, with no look.
        let looked = Arc::new(AtomicBool::new(false));
        let answer = wait::<(), _, _, _, _>(
            std::future::pending(),
            rules(Wake::Head, Recheck::AsLooked),
            Some(Instant::now() + Duration::from_millis(100)),
            "timed out",
            |_| {
                looked.store(true, Ordering::Relaxed);
                async { Ok(Look::Done("granted")) }
            },
        );
        assert_eq!(answer.await.unwrap(), "timed out");
        assert!(!looked.load(Ordering::Relaxed));
    }

    #[tokio::test(start_paused = true)]
    async fn a_resync_makes_every_watching_waiter_look_again() {
        let queues = Queues::new();
        let all_rules = rules(Wake::All, Recheck::AsLooked);
        let head_rules = rules(Wake::Head, Recheck::AsLooked);
        let (all_a, mut all_a_seen) = waiter(&queues, "all", all_rules, None, done_when_woken);
        let (all_b, mut all_b_seen) = waiter(&queues, "all", all_rules, None, done_when_woken);
        let (head, mut head_seen) = waiter(&queues, "head", head_rules, None, done_when_woken);
        let (follower, mut follower_seen) =
            waiter(&queues, "head", head_rules, None, done_when_woken);
        for seen in [&mut all_a_seen, &mut all_b_seen, &mut head_seen] {
            assert_eq!(next_cue(seen).await, Cue::Subscribed);
        }
        queues.resync();
        for seen in [&mut all_a_seen, &mut all_b_seen, &mut head_seen] {
            assert_eq!(next_cue(seen).await, Cue::Resync);
        }
        for task in [all_a, all_b, head] {
            assert_eq!(answer_of(task).await, "granted");
        }
        // The follower made no look behind the head; it looks once it becomes head.
        assert_eq!(next_cue(&mut follower_seen).await, Cue::Message);
        assert_eq!(answer_of(follower).await, "granted");
        assert!(!queues.has_waiters("all") && !queues.has_waiters("head"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_leaves_watched_promotes_the_next_without_a_look() {
        let queues = Queues::new();
        let head_rules = rules(Wake::Head, Recheck::AsLooked);
        let (head, mut head_seen) = waiting(&queues, CHANNEL, head_rules, None, |_| {
            Look::DoneWatched("first")
        });
        let (follower, mut follower_seen) =
            waiting(&queues, CHANNEL, head_rules, None, |cue| match cue {
                Cue::Promoted => Look::Pending(None),
                _ => Look::Done("second"),
            });
        // The follower starts first (the test runtime runs tasks in the order they were
        // spawned), so it is behind the head when it starts and makes no look of its own.
        let follower = tokio::spawn(follower);
        let head = tokio::spawn(head);
        assert_eq!(answer_of(head).await, "first");
        assert_eq!(next_cue(&mut head_seen).await, Cue::Subscribed);
        assert_eq!(next_cue(&mut follower_seen).await, Cue::Promoted);
        // The release's message then reaches the new head.
        queues.deliver(CHANNEL);
        assert_eq!(next_cue(&mut follower_seen).await, Cue::Message);
        assert_eq!(answer_of(follower).await, "second");
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_waiter_leaving_empties_the_queue_once() {
        struct Counted(Arc<AtomicU64>);
        impl QueueState for Counted {
            fn emptied(self, _channel: &str, _wake: Wake) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let emptied = Arc::new(AtomicU64::new(0));
        let queues = Queues::<Counted>::new();
        let made = AtomicU64::new(0);
        let first = |_: &str| {
            made.fetch_add(1, Ordering::Relaxed);
            Counted(emptied.clone())
        };
        let (a, ()) = queues.join(CHANNEL.to_owned(), Wake::Head, first, |_| ());
        let (b, ()) = queues.join(CHANNEL.to_owned(), Wake::Head, first, |_| ());
        assert!(queues.has_others(CHANNEL));
        drop(a);
        assert_eq!(emptied.load(Ordering::Relaxed), 0);
        assert!(queues.has_waiters(CHANNEL) && !queues.has_others(CHANNEL));
        drop(b);
        assert_eq!(emptied.load(Ordering::Relaxed), 1);
        assert_eq!(made.load(Ordering::Relaxed), 1);
        assert!(!queues.has_waiters(CHANNEL));
    }

    /// A wait over `looks`: each call of the look answers the next item (the last repeats);
    /// wrapped in [`TimedOutLooks`] when `outlasting`.
    async fn wait_over(
        wake: Wake,
        deadline: Option<Instant>,
        outlasting: bool,
        looks: Vec<Result<Look<&'static str>, BackendErrorKind>>,
    ) -> (Result<&'static str, BackendError>, usize) {
        let queues = Queues::<()>::new();
        let (ticket, ()) = queues.join(CHANNEL.to_owned(), wake, |_| (), |_| ());
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let timed_out_looks = Arc::new(TimedOutLooks::new());
        let tracker = timed_out_looks.clone();
        let look = move |_: Cue| {
            let n = counted.fetch_add(1, Ordering::Relaxed) as usize;
            let answer = match &looks[n.min(looks.len() - 1)] {
                Ok(Look::Done(a)) => Ok(Look::Done(*a)),
                Ok(Look::DoneWatched(a)) => Ok(Look::DoneWatched(*a)),
                Ok(Look::Pending(l)) => Ok(Look::Pending(*l)),
                Err(kind) => Err(BackendError::new(*kind, "no answer within 300ms")),
            };
            let answer = if outlasting {
                tracker.look(answer)
            } else {
                answer
            };
            async move { answer }
        };
        let answer = wait(
            std::future::ready(Ok(ticket)),
            rules(wake, Recheck::AsLooked),
            deadline,
            "timed out",
            look,
        )
        .await;
        let answer = timed_out_looks.settle(answer, |a| *a == "timed out");
        (answer, calls.load(Ordering::Relaxed) as usize)
    }

    /// The control: a bare look that times out ends the wait with its error, however much of
    /// the wait is left (what a waiting acquire on a slow server did before it wrapped its
    /// looks).
    #[tokio::test(start_paused = true)]
    async fn a_bare_look_that_timed_out_ends_the_wait() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (answer, looks) = wait_over(
            Wake::Head,
            Some(deadline),
            false,
            vec![Err(BackendErrorKind::Timeout), Ok(Look::Done("granted"))],
        )
        .await;
        assert_eq!(answer.unwrap_err().kind(), BackendErrorKind::Timeout);
        assert_eq!(looks, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_look_that_timed_out_is_looked_again_within_the_wait() {
        for wake in [Wake::Head, Wake::All] {
            let deadline = Instant::now() + Duration::from_secs(10);
            let (answer, looks) = wait_over(
                wake,
                Some(deadline),
                true,
                vec![
                    Err(BackendErrorKind::Timeout),
                    Err(BackendErrorKind::Timeout),
                    Ok(Look::Done("granted")),
                ],
            )
            .await;
            assert_eq!(answer.unwrap(), "granted", "{wake:?}");
            assert_eq!(looks, 3, "{wake:?}");
            assert!(
                Instant::now() < deadline,
                "looked again at once, not at the deadline"
            );
            // Without a deadline too.
            let (answer, _) = wait_over(
                wake,
                None,
                true,
                vec![Err(BackendErrorKind::Timeout), Ok(Look::Done("granted"))],
            )
            .await;
            assert_eq!(answer.unwrap(), "granted", "{wake:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ending_after_unanswered_looks_is_a_timeout_not_a_refusal() {
        let deadline = Instant::now() + Duration::from_millis(500);
        let (answer, looks) = wait_over(
            Wake::Head,
            Some(deadline),
            true,
            vec![Err(BackendErrorKind::Timeout)],
        )
        .await;
        let err = answer.expect_err("what the unanswered looks did is unknown");
        assert_eq!(err.kind(), BackendErrorKind::Timeout);
        assert!(err.message().contains("got no answer in time"), "{err}");
        assert!(looks > 2, "looked again until the deadline: {looks}");
        assert!(Instant::now() >= deadline);

        // A look that answered after the timed-out one settles it: the deadline then refuses.
        let deadline = Instant::now() + Duration::from_millis(500);
        let (answer, _) = wait_over(
            Wake::All,
            Some(deadline),
            true,
            vec![Err(BackendErrorKind::Timeout), Ok(Look::Pending(None))],
        )
        .await;
        assert_eq!(answer.unwrap(), "timed out");
    }

    #[tokio::test(start_paused = true)]
    async fn any_other_look_error_ends_the_wait_at_once() {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (answer, looks) = wait_over(
            Wake::Head,
            Some(deadline),
            true,
            vec![
                Err(BackendErrorKind::Unavailable),
                Ok(Look::Done("granted")),
            ],
        )
        .await;
        assert_eq!(answer.unwrap_err().kind(), BackendErrorKind::Unavailable);
        assert_eq!(looks, 1);
    }

    #[test]
    fn rechecks_are_capped_and_after_the_lapse() {
        let cap = Duration::from_secs(1);
        let d = recheck_after(Some(Duration::from_millis(200)), cap);
        assert!(
            d > Duration::from_millis(200) && d < Duration::from_millis(220),
            "{d:?}"
        );
        let d = recheck_after(Some(Duration::from_secs(60)), cap);
        assert!(d > cap && d < cap + Duration::from_millis(70), "{d:?}");
        assert!(recheck_after(None, cap) > cap);
        assert!(recheck_after(Some(Duration::ZERO), cap) >= Duration::from_millis(1));
    }
}
