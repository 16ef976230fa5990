//! The locks the current task holds: for reentrancy detection and for reading the fencing token
//! inside a body.

use std::future::Future;
use std::sync::Arc;

use crate::provider::FencingToken;

/// One lock held by the current task, linked to the ones held around it.
#[derive(Debug)]
pub(crate) struct HeldLock {
    key: Box<str>,
    fencing_token: Option<FencingToken>,
    outer: Option<Arc<HeldLock>>,
}

tokio::task_local! {
    static HELD: Option<Arc<HeldLock>>;
}

fn innermost() -> Option<Arc<HeldLock>> {
    HELD.try_with(|held| held.clone()).ok().flatten()
}

/// True when the current task holds the lock `key`.
pub(crate) fn holds(key: &str) -> bool {
    HELD.try_with(|held| {
        let mut at = held.as_deref();
        while let Some(lock) = at {
            if &*lock.key == key {
                return true;
            }
            at = lock.outer.as_deref();
        }
        false
    })
    .unwrap_or(false)
}

/// Runs `body` with `key` recorded as held by the current task.
pub(crate) fn scope<F: Future>(
    key: &str,
    fencing_token: Option<FencingToken>,
    body: F,
) -> impl Future<Output = F::Output> {
    let node = Arc::new(HeldLock {
        key: key.into(),
        fencing_token,
        outer: innermost(),
    });
    HELD.scope(Some(node), body)
}

/// The fencing token of the innermost lock the current task holds, if that lock is fenced.
///
/// Returns `None` outside a `#[distributed_lock]` body, and inside the body of a lock that is
/// not `fenced = true`: coord never makes a token up. Only the task running the body sees it;
/// pass it along explicitly to tasks you spawn.
pub fn fencing_token() -> Option<FencingToken> {
    innermost().and_then(|lock| lock.fencing_token)
}
