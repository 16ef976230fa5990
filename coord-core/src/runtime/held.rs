//! The locks the current task holds: for reentrancy detection, and for reading the fencing
//! token and the state of the lease inside a body.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::provider::CallKey;
use crate::provider::{FencingToken, LossCause};
use crate::runtime::renewal::Hold;

thread_local! {
    /// The innermost lock of the task being polled on this thread: a [`Scope`] moves its hold
    /// in for each poll of its body and takes it back after (a task-local value, kept by hand
    /// so that the lock layer can lend the hold it keeps instead of sharing a second handle).
    static HELD: Cell<Option<Arc<Hold>>> = const { Cell::new(None) };
}

/// The innermost lock the current task holds.
pub(crate) fn innermost() -> Option<Arc<Hold>> {
    HELD.try_with(|held| {
        let hold = held.take();
        let copy = hold.clone();
        held.set(hold);
        copy
    })
    .ok()
    .flatten()
}

/// True when the chain of held locks starting at `innermost` (see [`innermost`]) holds the
/// lock `key` (`permit`: a permit of the semaphore `key`, which is another thing than the
/// lock of the same key).
pub(crate) fn chain_holds(innermost: Option<&Hold>, key: &CallKey, permit: bool) -> bool {
    let mut at = innermost;
    while let Some(lock) = at {
        if lock.key == *key && lock.is_permit() == permit && lock.rw_mode().is_none() {
            return true;
        }
        at = lock.outer.as_deref();
    }
    false
}

/// The mode in which the chain of held locks starting at `innermost` holds the read-write
/// lock `key`, if it does (the innermost such hold; a lock or permit of the same key is
/// another thing).
pub(crate) fn chain_holds_rw(
    innermost: Option<&Hold>,
    key: &CallKey,
) -> Option<crate::provider::RwMode> {
    let mut at = innermost;
    while let Some(lock) = at {
        match lock.rw_mode() {
            Some(mode) if lock.key == *key => return Some(mode),
            _ => {}
        }
        at = lock.outer.as_deref();
    }
    None
}

/// Runs `body` with `hold` recorded as the innermost lock of the current task.
pub(crate) fn scope<F: Future>(hold: Arc<Hold>, body: F) -> Scope<'static, F> {
    Scope {
        slot: Slot::Owned(Some(hold)),
        body,
    }
}

/// Runs `body` with the hold in `slot` recorded as the innermost lock of the current task:
/// the hold is lent to the thread's slot for each poll of the body and is back in `slot`
/// between polls (so whoever owns `slot` still has it when the body is dropped, or has
/// returned or panicked).
pub(crate) fn scope_lent<F: Future>(slot: &mut Option<Arc<Hold>>, body: F) -> Scope<'_, F> {
    Scope {
        slot: Slot::Lent(slot),
        body,
    }
}

/// Where a [`Scope`]'s hold is between polls.
enum Slot<'a> {
    Owned(Option<Arc<Hold>>),
    Lent(&'a mut Option<Arc<Hold>>),
}

pin_project_lite::pin_project! {
    /// `body`, polled with a hold as the innermost lock of the current task: see [`scope`]
    /// and [`scope_lent`].
    pub(crate) struct Scope<'a, F> {
        slot: Slot<'a>,
        #[pin]
        body: F,
    }
}

impl<F: Future> Future for Scope<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let slot = match this.slot {
            Slot::Owned(slot) => slot,
            Slot::Lent(slot) => &mut **slot,
        };
        let _entered = Entered::new(slot);
        this.body.poll(cx)
    }
}

/// The hold of a [`Scope`] moved into the thread's slot for one poll; moved back, and the
/// outer scope's hold restored, when dropped (also when the body panics).
struct Entered<'s> {
    slot: &'s mut Option<Arc<Hold>>,
    /// The outer scope's hold, to restore; `None` when the thread's slot was not reachable
    /// (the thread is being torn down), and so not entered.
    outer: Option<Option<Arc<Hold>>>,
}

impl<'s> Entered<'s> {
    fn new(slot: &'s mut Option<Arc<Hold>>) -> Entered<'s> {
        // The closure borrows `slot`: if the thread's slot is gone, the hold stays where it is.
        let outer = HELD.try_with(|held| held.replace(slot.take())).ok();
        Entered { slot, outer }
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let Some(outer) = self.outer.take() else {
            return;
        };
        let mut outer = Some(outer);
        // The thread's slot was reachable when this poll began and is torn down only once the
        // thread ends, so it still is: the hold comes back.
        if let Ok(hold) = HELD.try_with(|held| held.replace(outer.take().flatten())) {
            *self.slot = hold;
        }
    }
}

/// The fencing token of the innermost lock the current task holds, if that lock is fenced.
///
/// Returns `None` outside a `#[distributed_lock]` body, inside the body of a lock that is
/// not `fenced = true` (coord never makes a token up), and once the hold is known lost or its
/// lease has run out on the local clock (see [`is_held`]): a token is only handed out while it
/// can still be the newest. Only the task running the body sees it; pass it along explicitly
/// to tasks you spawn.
pub fn fencing_token() -> Option<FencingToken> {
    innermost()
        .filter(|lock| lock.is_held())
        .and_then(|lock| lock.fencing_token)
}

/// True while the innermost lock of the current task is held: not reported lost by renewal,
/// and its lease (as last confirmed) has not run out on the local monotonic clock.
///
/// `false` outside a `#[distributed_lock]` body. A `true` is a best effort, not a guarantee:
/// the lease can end right after the check. Only fencing makes a write safe.
pub fn is_held() -> bool {
    innermost().is_some_and(|lock| lock.is_held())
}

/// Resolves when the innermost lock of the current task is lost, with why: renewal found
/// another owner (`TakenByOther`) or none (`Expired`), or a whole lease passed without a
/// confirmed renewal (`BackendUnreachable`). Resolves at once with `None` outside a
/// `#[distributed_lock]` body (nothing is held).
///
/// With `on_lost = "signal"`, select on it to stop the work yourself:
///
/// ```
/// use coord_core::{CoordError, distributed_lock, lock_lost};
///
/// # async fn do_the_work() -> Result<(), CoordError> { Ok(()) }
/// #[distributed_lock(key_from = "tenant", lease = "30s", renew = true, on_lost = "signal")]
/// async fn migrate(tenant: u64) -> Result<(), CoordError> {
///     tokio::select! {
///         done = do_the_work() => done,
///         // Stop cleanly, at a point of the body's choosing.
///         cause = lock_lost() => {
///             tracing::warn!(?cause, "lost the migration lock; stopping");
///             Ok(())
///         }
///     }
/// }
/// ```
pub async fn lock_lost() -> Option<LossCause> {
    let lock = innermost()?;
    lock.lost().await;
    Some(lock.loss_cause())
}
