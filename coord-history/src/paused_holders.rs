//! Holders paused past their lease, on any provider: the run that the in-process and the Redis
//! tests both make, written once.
//!
//! Three "processes" (threads, each with a current-thread runtime and a coordinator of its own)
//! take turns on one renewing fenced lock (lease 1 s, wait 60 s), four calls each. Each body
//! writes its fencing token to a shared resource, awaits 200 ms and writes it again. Every third
//! call blocks its runtime's thread for [`STALL`] 50 ms into the body, past the lease, as a
//! paused process does: its renewals stop with it, and another process may take the lock.
//!
//! [`run_and_check`] then judges what the resource saw, in its order: no call that returned
//! `Ok(token)` had a newer token's write between its own first and last write (it held the lock
//! throughout), and at least one paused call ended in `LockLost` (the run did pause a holder past
//! its lease). This is the held-throughout promise of [`Promise::HeldThroughout`] in a focused
//! form: the whole-history checker ([`mod@crate::check`]) does not judge holders paused past their
//! lease, this run judges only them and the calls around them.
//!
//! [`Promise::HeldThroughout`]: crate::Promise::HeldThroughout

use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::{CoordError, Coordinator, distributed_lock, fencing_token};
use tokio::sync::Notify;

/// How long a paused call's thread is blocked: twice the lock's 1 s lease.
pub const STALL: Duration = Duration::from_secs(2);

/// How many processes take turns on the lock.
const PROCESSES: usize = 3;
/// How many calls each process makes, one after another.
const CALLS: usize = 4;

/// A fenced resource that records every write it is sent, in order.
#[derive(Default)]
struct Writes {
    tokens: Mutex<Vec<u64>>,
}

impl Writes {
    fn write(&self, token: u64) {
        self.tokens.lock().unwrap().push(token);
    }
}

#[distributed_lock(key_from = "resource", coordinator = coord, name = "stalls.history", lease = "1s", wait = "60s", renew = true, fenced = true)]
async fn hold_and_write(
    coord: &Coordinator,
    resource: u32,
    writes: Arc<Writes>,
    pause: Option<Arc<Notify>>,
) -> Result<u64, CoordError> {
    let token = fencing_token().expect("a fenced hold has a token").get();
    writes.write(token);
    if let Some(pause) = pause {
        pause.notify_one();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    writes.write(token);
    Ok(token)
}

/// One process: a current-thread runtime on its own thread, a coordinator from `connect` made
/// on that runtime (a connection made there pauses with it), and its four calls in turn; call
/// `k` of process `p` is paused when `k + p` is a multiple of 3.
fn process<C, F>(p: usize, connect: C, writes: Arc<Writes>) -> Vec<Result<u64, CoordError>>
where
    C: FnOnce() -> F,
    F: Future<Output = Coordinator>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the process");
    runtime.block_on(async move {
        let c = connect().await;
        let pause = Arc::new(Notify::new());
        let pauser = {
            let pause = pause.clone();
            tokio::spawn(async move {
                loop {
                    pause.notified().await;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    // Blocks the runtime's only thread: the whole process stands still.
                    std::thread::sleep(STALL);
                }
            })
        };
        let mut outcomes = Vec::new();
        for k in 0..CALLS {
            let paused = (k + p).is_multiple_of(3).then(|| pause.clone());
            outcomes.push(hold_and_write(&c, 1, writes.clone(), paused).await);
        }
        pauser.abort();
        outcomes
    })
}

/// Runs the three processes, each with a coordinator from `connect` (called once per process,
/// on that process's runtime; the coordinators may share a provider), and panics unless every
/// call that returned `Ok` held the lock throughout and at least one paused call was lost.
///
/// Blocks the calling thread until all twelve calls ended: call it from a plain test, or from
/// `spawn_blocking` in an async one.
pub fn run_and_check<C, F>(connect: C)
where
    C: Fn() -> F + Clone + Send + 'static,
    F: Future<Output = Coordinator>,
{
    let writes = Arc::new(Writes::default());
    let processes: Vec<_> = (0..PROCESSES)
        .map(|p| {
            let (connect, writes) = (connect.clone(), writes.clone());
            std::thread::spawn(move || process(p, connect, writes))
        })
        .collect();
    let outcomes: Vec<Result<u64, CoordError>> = processes
        .into_iter()
        .flat_map(|p| p.join().expect("a process panicked"))
        .collect();
    let tokens = writes.tokens.lock().unwrap();
    check(&tokens, &outcomes);
}

/// No call that returned `Ok(token)` has a newer token's write between its own first and last
/// write; some paused call did lose its hold (the run exercised a pause past the lease).
fn check(writes: &[u64], outcomes: &[Result<u64, CoordError>]) {
    let mut lost = 0;
    for outcome in outcomes {
        match outcome {
            Ok(token) => {
                let first = writes.iter().position(|t| t == token).unwrap();
                let last = writes.iter().rposition(|t| t == token).unwrap();
                let newer: Vec<u64> = writes[first..=last]
                    .iter()
                    .copied()
                    .filter(|t| t > token)
                    .collect();
                assert!(
                    newer.is_empty(),
                    "the hold with token {token} returned Ok, but tokens {newer:?} wrote to the \
                     resource during its body (writes in order: {writes:?})"
                );
            }
            Err(CoordError::LockLost { .. }) => lost += 1,
            Err(err) => panic!("unexpected error: {err:?}"),
        }
    }
    assert!(
        lost > 0,
        "no stalled hold was lost, so the run did not exercise a stall past the lease: \
         {outcomes:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check fails when it should: a hold that returned `Ok` while a newer token wrote in
    /// its body, and a run in which no hold was lost.
    #[test]
    fn the_check_refuses_an_overtaken_hold_and_a_run_without_a_loss() {
        let lost = || {
            Err(CoordError::LockLost {
                key: coord_core::CallKey::builder("history", "stalls.history")
                    .part(&1u32)
                    .finish(),
                held_for: Duration::from_secs(1),
                cause: coord_core::LossCause::Expired,
            })
        };
        let overtaken = std::panic::catch_unwind(|| check(&[1, 2, 1, 2], &[Ok(1), Ok(2), lost()]));
        assert!(overtaken.is_err(), "token 2 wrote inside hold 1's body");
        let unexercised = std::panic::catch_unwind(|| check(&[1, 1, 2, 2], &[Ok(1), Ok(2)]));
        assert!(unexercised.is_err(), "no hold was lost");
        check(&[1, 2, 2, 1, 3, 3], &[lost(), Ok(2), Ok(3)]);
    }
}
