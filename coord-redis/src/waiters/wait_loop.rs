//! The one loop every wait runs (a lock acquisition, a follower of a single flight, a
//! caller waiting for an idempotency record to settle): look at the state in Redis, sleep
//! until woken or until the state lapses on its own, look again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_core::BackendError;
use tokio::time::Instant;

use super::{Hub, Wake, Woken};
use crate::transport::Transport;

/// What one look at the watched state found.
#[derive(Debug)]
pub(crate) enum Look<T> {
    /// The wait is over, with this answer.
    Done(T),
    /// The wait is over, with this answer, and the wake-up of this process's other waiters on
    /// the channel is already arranged (a lock taken marked as waited for, with this process
    /// queued in Redis): the next waiter takes over the watch without a look of its own.
    DoneWatched(T),
    /// Not yet. `Some(lapse)`: the state ends by itself within `lapse` at the latest (a
    /// lease's remaining time, measured by the server), so look again then even if no
    /// message comes. `None`: only a wake-up or the deadline ends the sleep.
    Pending(Option<Duration>),
}

/// Why the state is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cue {
    /// The first look, once the subscription is confirmed.
    Subscribed,
    /// A message on the channel (or, on a hand-off channel, this waiter became the head of
    /// its queue).
    Message,
    /// The subscriber connection was re-established: a message may have been missed, or
    /// nothing happened.
    Resync,
    /// The lapse the last look named, or the deadline, has come.
    Timer,
    /// This waiter became the head of a hand-off queue after the previous head answered
    /// [`Look::DoneWatched`]: the release will send a message. The look should only name
    /// the re-check interval (the backstop against a lost message), without a round trip.
    Promoted,
}

impl Hub {
    /// Waits on `channel` until `look` answers, or until `deadline` (`None`: no end)
    /// passes, which answers `timed_out`.
    ///
    /// What it promises:
    /// * **No lost wake-up.** `channel` is subscribed, and the subscription confirmed by the
    ///   server, before the first look. A change announced after that look reaches this
    ///   waiter as a message; one announced before it is seen by the look itself. On a
    ///   hand-off channel ([`Wake::Head`]) a waiter that joins behind a head makes no look
    ///   until it becomes head (or its deadline comes): the head's watch covers it.
    /// * **A look after every wake-up.** Every message, reconnection of the subscriber
    ///   (which may have lost messages) and timer leads to another call of `look`, told why
    ///   ([`Cue`]); a look may answer from the cue alone, without a round trip, where the cue
    ///   says enough (a settled record announces itself).
    /// * **No wait past a lapse.** After a look that names how long the state lasts by
    ///   itself, the waiter looks again at that time at the latest, so a message that never
    ///   comes (a holder that died, a lost message) costs at most that long. On a hand-off
    ///   channel ([`Wake::Head`]) only the head of the queue keeps that timer; the others are
    ///   woken when they become head.
    /// * **Bounded.** It never sleeps past `deadline`. A deadline that passes while the
    ///   subscription is being made answers `timed_out` at once; one that passes during a
    ///   sleep is followed by one last look, and a look at or after the deadline that does
    ///   not answer ends the wait with `timed_out`. Making the subscription is also bounded
    ///   by the command timeout (an error then).
    ///
    /// What it does not promise: a bound on `look`'s own round trips (each is bounded by the
    /// command timeout, so the deadline can be overrun by one look); an order between
    /// waiters of different processes.
    pub(crate) async fn wait<T, F, Fut>(
        &self,
        transport: &Arc<dyn Transport>,
        channel: String,
        wake: Wake,
        deadline: Option<Instant>,
        timed_out: T,
        mut look: F,
    ) -> Result<T, BackendError>
    where
        F: FnMut(Cue) -> Fut,
        Fut: Future<Output = Result<Look<T>, BackendError>>,
    {
        // Listen before looking, so a change between the caller's last look and the
        // subscription is seen by the first look here, and one after it by the message.
        let joining = self.join(transport, channel, wake, self.timeout);
        let ticket = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, joining).await {
                Ok(ticket) => ticket?,
                Err(_) => return Ok(timed_out),
            },
            None => joining.await?,
        };
        let mut ticket = ticket;
        let mut cue = Cue::Subscribed;
        // Behind a head on a hand-off channel: the head's watch covers this waiter until it
        // becomes head itself (woken then) or its deadline comes.
        let mut skip = wake == Wake::Head && !ticket.is_head();
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
                    Look::Pending(lapse) => lapse,
                }
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(timed_out);
            }
            let keeps_timer = wake == Wake::All || ticket.is_head();
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
            // Woken, the timer fired, or the deadline came: look again either way. A timer
            // that fires early (tokio caps very distant ones) only costs a look.
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
}
