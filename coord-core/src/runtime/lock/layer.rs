//! The `#[distributed_lock]` layer: take the lock ([`acquire`](super::acquire)), run the body
//! as its holder, then give it back ([`guard`](super::guard)), recording each step on the call.
//! A body whose hold is lost is cancelled ([`lock_lost`]) or, when it returns after its lease
//! ran out, reported ([`report_lapse`]); a backend fault under `fail_open` runs the body
//! without the lock ([`run_unguarded`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::CoordError;
use crate::policy::OnLost;
use crate::provider::{LossCause, ReleaseOutcome};
use crate::report::LockOutcome;
use crate::runtime::call::Call;
use crate::runtime::held;
use crate::runtime::lifecycle::ListedWhileWaiting;
use crate::runtime::outcome::GuardedResult;
use crate::runtime::renewal::{Hold, Registration, lease_checked};
use crate::runtime::spec::LockSpec;

use super::acquire::{Acquired, Begun, Grant, begin};
use super::guard::{CallHold, Releasing};

/// Runs `body` while holding the call's lock, in three steps read top to bottom: take the lock
/// (one synchronous step, and an await only when the provider's answer must be waited for),
/// run the body as its holder, give it back.
///
/// The lock is the innermost layer, so this layer times the body (see [`Call::body`]) with the
/// clock reads it makes anyway: the body starts when the grant is in and ends at the read that
/// also serves the hold time and the lapse check.
pub async fn distributed_lock<R, F>(call: &Call<'_>, body: F) -> R
where
    R: GuardedResult,
    F: Future<Output = R>,
{
    if let Some(err) = call.profile_error() {
        return R::from_coord_error(err);
    }
    let spec = call
        .lock
        .as_ref()
        .expect("the macro emits a lock spec with #[distributed_lock]");

    // 1. Take the lock. The in-process provider's free lock is granted without awaiting; every
    // other acquisition is boxed, so that the call's future keeps no room for it. The first
    // step's answer is taken apart before the await (only the box is kept across it), and the
    // grant in the one statement that awaits it: matched over instead, or bound by `let`,
    // either would keep its room in the future across an await (the lock call's future grows
    // from 912 bytes).
    #[allow(clippy::blocks_in_conditions)]
    let (mut held, granted_at) = match {
        let acquired = 'taken: {
            let finishing = match begin(call.coordinator, &call.key, spec) {
                Begun::Done(acquired) => break 'taken acquired,
                Begun::Waiting(pending) => Box::pin(pending.finish()),
            };
            finishing.await
        };
        match acquired {
            Acquired::Granted(Grant {
                hold,
                renewal,
                outcome,
                waited,
                granted_at,
            }) => {
                // Held (and so released on drop) before anything else runs: a metrics
                // recorder that panics here leaves no lock behind.
                let held = CallHold::new(call.coordinator, hold, renewal);
                call.record_lock_granted(outcome, held.hold().fencing_token, waited);
                Some((held, granted_at))
            }
            Acquired::Refused(err, outcome) => {
                call.record_lock_refused(&err, outcome);
                return R::from_coord_error(err);
            }
            Acquired::Unguarded => None,
        }
    } {
        Some(parts) => parts,
        // Rare (the backend failed under `fail_open`): boxed, like the general acquisition.
        None => return Box::pin(run_unguarded(call, body)).await,
    };

    // 2. Run the body as the lock's holder.
    let body = ListedWhileWaiting::new(call.coordinator.lifecycle(), body);
    let cancel_on_loss = spec.on_lost == Some(OnLost::Cancel);
    let output = if held.renewal.is_none() && !cancel_on_loss {
        // The common case: nothing to watch beside the body, which borrows the hold for each
        // of its polls (no second handle to it).
        Some(held::scope_lent(&mut held.hold, body).await)
    } else {
        // Watching the hold beside the body takes a timer, a notification and the renewal
        // task's watchdog: a few hundred bytes of state, boxed so that every other call's
        // future does not carry them.
        let hold = held.hold().clone();
        Box::pin(run_watched(
            hold,
            cancel_on_loss,
            held.renewal.as_ref(),
            body,
        ))
        .await
    };
    if output.is_none() {
        // The hold is lost: the lock is probably someone else's by now and the backend may be
        // unreachable. Answer at once; the owner-checked release (a no-op if the lock moved
        // on) finishes in the background: the hold, still armed, hands it off on drop.
        let hold = held.hold().clone();
        drop(held);
        return R::from_coord_error(lock_lost(call, &hold));
    }

    // 3. Give the lock back. Whatever the release finds, the body's outcome stands: a lapsed
    // lease is counted and logged, a failed release is retried in the background. One clock
    // read serves the body's end, the hold time and the lapse check.
    let returned_at = Instant::now();
    let hold = held.hold();
    call.record_locked_body(hold.acquired_at(), granted_at, returned_at);
    let lapsed = hold.lapsed_at(returned_at);
    if lapsed {
        report_lapse(call, hold, spec, hold.held_for_at(returned_at));
    }
    let released = match held.release(lapsed, returned_at) {
        Releasing::Done(released) => released,
        Releasing::Awaited(releasing) => releasing.await,
    };
    if released.is_err() {
        // One release attempt (bounded by the provider's command timeout) is all the caller
        // waits for; the rest is the background's, and the report says so.
        call.record_settling_in_background();
    }
    if matches!(
        released,
        Ok(ReleaseOutcome::NotHeld | ReleaseOutcome::ForceReleased)
    ) {
        // Found gone at release: the report says why, as the release worked it out.
        call.record_lock_lost(held.hold().loss_cause());
    }
    // Kept in its `Option` until here (checked above), so the future holds one copy of it.
    let Some(output) = output else {
        unreachable!("a lost hold answered above")
    };
    output
}

/// Runs `body` without the lock: the backend failed and the policy is `fail_open` (counted
/// and logged already).
async fn run_unguarded<R, F>(call: &Call<'_>, body: F) -> R
where
    F: Future<Output = R>,
{
    call.record_lock(LockOutcome::FailedOpen, None);
    let started = Instant::now();
    let output = body.await;
    call.record_body(started, Instant::now());
    output
}

/// The answer of a call whose hold was lost while its body ran (the body was cancelled),
/// recorded.
fn lock_lost(call: &Call<'_>, hold: &Hold) -> CoordError {
    let cause = hold.loss_cause();
    call.record_lock(LockOutcome::Lost, hold.fencing_token);
    call.record_lock_lost(cause);
    CoordError::LockLost {
        key: call.key.clone(),
        held_for: hold.held_for(),
        cause,
    }
}

/// The body returned after its hold was lost or its lease ran out on the local clock
/// (`on_lost = "signal"`, or no renewal): its outcome stands, as documented, but the section
/// may not have been exclusive throughout. Reported in the `CallReport`, counted, and logged
/// once (a lease that ran out unnoticed; a loss was logged when it was noticed).
fn report_lapse(call: &Call<'_>, hold: &Hold, spec: &LockSpec, held_for: Duration) {
    let noticed = hold.is_lost();
    if !noticed {
        hold.mark_lost_quietly(LossCause::Expired);
        tracing::warn!(
            key = %hold.key,
            lease = ?spec.lease,
            body_ran_for = ?held_for,
            renewing = spec.renew.is_some(),
            "coord: the lock's lease ran out before the body returned; the body ran to its end and its outcome stands, but the section was not exclusive throughout"
        );
    }
    let cause = hold.loss_cause();
    call.coordinator.metrics().count_lapsed_hold();
    call.record_lock_lost(cause);
}

/// Runs `body` as the holder of `hold`, for a renewing or cancelling hold (every other lock
/// call's body just borrows its hold, see [`held::scope_lent`]). With `OnLost::Cancel`, the
/// body is not polled again once the hold is lost, and `None` is returned.
///
/// A renewing or cancelling hold checks its lease on the local clock before every poll of the
/// body (one clock read): after a stall of this process (a blocking call on the runtime, a
/// pause, SIGSTOP) the body's pending await and the loss become ready in the same wake-up, and
/// the loss must win. With `Cancel` the body is then not polled again, and a body that
/// completes in a poll during which the lease ran out (blocking code inside it) is answered
/// `None` too; with `Signal` the hold is marked lost first (`is_held()` false, `lock_lost()`
/// resolved) and the body is polled as it chose.
///
/// While a renewal is registered, the renewal task is watched beside the body and restarted on
/// this runtime if it is gone.
async fn run_watched<F: Future>(
    hold: Arc<Hold>,
    cancel_on_loss: bool,
    renewal: Option<&Registration>,
    body: F,
) -> Option<F::Output> {
    let watched = hold.clone();
    let body = held::scope(hold, body);
    tokio::pin!(body);
    let checked = lease_checked(&watched, cancel_on_loss, body);
    let driver = async {
        match renewal {
            Some(registration) => registration.keep_driver_alive().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(driver);
    tokio::select! {
        biased;
        output = checked => output,
        _ = watched.lost(), if cancel_on_loss => None,
        _ = &mut driver => None,
    }
}
