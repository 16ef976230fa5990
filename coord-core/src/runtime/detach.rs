//! Work that must finish even when the caller stops waiting for it.
//!
//! Releasing a lock, clearing an in-flight marker and recording a completed outcome must not
//! be lost because the caller's future was dropped. `DetachOnDrop` runs such work inline (no
//! spawn on the common path) and, if it is dropped before the work finished, hands the rest of
//! the work to the tokio runtime.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use tokio::sync::Notify;

/// Spawns `fut` on the current tokio runtime. Without a runtime (the process is shutting down,
/// or the future was dropped from a plain thread) the work is dropped with a warning: the
/// backend's lease or expiry then cleans up.
pub(crate) fn spawn_detached<F>(fut: F)
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
pub(crate) fn pending() -> usize {
    PENDING.load(Ordering::Acquire)
}

/// Resolves once no background work is running.
pub(crate) async fn all_settled() {
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
pub(crate) fn spawn_retried<A, Fut>(
    what: &'static str,
    key: crate::call_key::CallKey,
    for_at_most: std::time::Duration,
    mut attempt: A,
) where
    A: FnMut(crate::call_key::CallKey) -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, crate::error::BackendError>> + Send + 'static,
{
    use std::time::Duration;
    let deadline = crate::runtime::time::later(tokio::time::Instant::now(), for_at_most);
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

/// A future that keeps running on the runtime if it is dropped before completing.
pub(crate) struct DetachOnDrop<T: Send + 'static> {
    inner: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> DetachOnDrop<T> {
    pub(crate) fn new(fut: impl Future<Output = T> + Send + 'static) -> Self {
        DetachOnDrop {
            inner: Some(Box::pin(fut)),
        }
    }
}

impl<T: Send + 'static> Future for DetachOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let fut = self
            .inner
            .as_mut()
            .expect("DetachOnDrop polled after completion");
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => {
                self.inner = None;
                Poll::Ready(out)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for DetachOnDrop<T> {
    fn drop(&mut self) {
        if let Some(fut) = self.inner.take() {
            spawn_detached(async move {
                fut.await;
            });
        }
    }
}
