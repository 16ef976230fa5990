//! Deadlines that fail a case instead of hanging it, and polls that tolerate a backend's clock
//! resolution.

use std::future::Future;
use std::time::{Duration, Instant};

/// Runs `fut` on its own task and fails the case if it has not finished within 10 s: a
/// provider that deadlocks a key must fail the suite, not hang it (and a deadlock may block
/// the thread it happens on, so the timer must run elsewhere).
pub(super) async fn bounded<T: Send + 'static>(
    what: &str,
    fut: impl Future<Output = T> + Send + 'static,
) -> T {
    match tokio::time::timeout(Duration::from_secs(10), tokio::spawn(fut)).await {
        Ok(joined) => joined.unwrap_or_else(|e| panic!("{what}: the call panicked: {e}")),
        Err(_) => panic!("{what}: no answer within 10 s (a deadlocked key?)"),
    }
}

/// Polls `check` until it holds, for at most 3 s: for state made with a zero or 1 µs
/// duration, which a backend may round up to its resolution.
pub(super) async fn within_3s<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(3);
    while !check().await {
        assert!(Instant::now() < deadline, "not within 3 s: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
