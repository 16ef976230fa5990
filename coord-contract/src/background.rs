//! Work that must finish even when the caller stops waiting for it.
//!
//! Releasing a lock, clearing an in-flight marker or a flight claim must not be lost because
//! the caller's future was dropped, or because the first try failed. [`spawn_retried`] runs an
//! owner-checked clean-up on the current tokio runtime until it is done or its lease is over;
//! [`pending`] and [`all_settled`] let a coordinator's shutdown wait for such work.
//!
//! Providers use it for their own clean-ups; the default `*_detached` methods of the contract
//! traits are built on it.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use crate::call_key::CallKey;
use crate::error::BackendError;
use crate::time::deadline_after;

/// Spawns `fut` on the current tokio runtime, counted by [`pending`] until it ends.
///
/// Without a runtime (the process is shutting down, or the future was dropped from a plain
/// thread) the work is dropped with a warning: the backend's lease or expiry then cleans up.
pub fn spawn_detached<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            let pending = Pending::start();
            handle.spawn(async move {
                fut.await;
                drop(pending);
            });
        }
        Err(_) => tracing::warn!(
            "coord: no tokio runtime to finish clean-up on; the backend's lease expiry will"
        ),
    }
}

/// Background work of this process still running (for shutdown's report).
static PENDING: AtomicUsize = AtomicUsize::new(0);
static SETTLED: Notify = Notify::const_new();

/// Counts one piece of background work until dropped (also when its task is dropped
/// unfinished, as a runtime shutting down does).
struct Pending;

impl Pending {
    fn start() -> Pending {
        PENDING.fetch_add(1, Ordering::AcqRel);
        Pending
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if PENDING.fetch_sub(1, Ordering::AcqRel) == 1 {
            SETTLED.notify_waiters();
        }
    }
}

/// How many pieces of background work (clean-ups, detached completions) are still running in
/// this process.
pub fn pending() -> usize {
    PENDING.load(Ordering::Acquire)
}

/// Resolves once no background work is running.
pub async fn all_settled() {
    loop {
        let settled = SETTLED.notified();
        tokio::pin!(settled);
        settled.as_mut().enable();
        if pending() == 0 {
            return;
        }
        settled.await;
    }
}

/// Runs `attempt(key)` in the background until it answers `Ok(true)` ("done"), retrying with
/// backoff (25 ms doubling to 1 s) for at most `for_at_most`. `Ok(false)` means "nothing done
/// yet, but nothing wrong either" (an abandon that found no marker while a late claim may still
/// land) and is retried silently; errors are retried and, if the last attempt failed, logged
/// when it gives up. For owner-checked clean-ups whose first try failed or whose need comes
/// from a lost reply: each attempt is a new command, which a provider sends on a healthy (if
/// need be, fresh) connection, and repeating it is harmless.
pub fn spawn_retried<A, Fut>(
    what: &'static str,
    key: CallKey,
    for_at_most: Duration,
    mut attempt: A,
) where
    A: FnMut(CallKey) -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, BackendError>> + Send + 'static,
{
    let deadline = deadline_after(tokio::time::Instant::now(), for_at_most);
    spawn_detached(async move {
        let mut backoff = Duration::from_millis(25);
        loop {
            let failed = match attempt(key.clone()).await {
                Ok(true) => return,
                Ok(false) => None,
                Err(err) => Some(err),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                if let Some(err) = failed {
                    tracing::warn!(key = %key, error = %err, "coord: {what} failed until its lease ended; the lease has cleaned up by now");
                }
                return;
            }
            if let Some(err) = failed {
                tracing::debug!(key = %key, error = %err, "coord: {what} failed; retrying");
            }
            tokio::time::sleep_until(deadline.min(now + backoff)).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    });
}
