//! What a coordinator's calls hold in this process (locks, in-flight markers, completion
//! writes), and whether it is shutting down: the registry `Coordinator::shutdown` (in the
//! front door's `shutdown.rs`) gives back.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::Notify;

use crate::runtime::renewal::Hold;

/// The leases a coordinator's calls hold in this process, and whether it is shutting down.
#[derive(Default)]
pub(crate) struct Lifecycle {
    pub(crate) shut_down: AtomicBool,
    pub(crate) locks: Slots,
    pub(crate) markers: Slots,
    /// Completion writes in progress (a body returned `Ok` and its outcome is being stored).
    pub(crate) completing: AtomicUsize,
    completed: Notify,
}

/// A set of holds with O(1) insert and remove by slot number.
#[derive(Default)]
pub(crate) struct Slots {
    inner: Mutex<SlotsInner>,
}

#[derive(Default)]
struct SlotsInner {
    entries: Vec<Option<Arc<Hold>>>,
    free: Vec<usize>,
}

impl Slots {
    fn insert(&self, hold: Arc<Hold>) -> usize {
        if hold.is_lock() {
            crate::telemetry::locks_held(1.0);
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        match inner.free.pop() {
            Some(slot) => {
                inner.entries[slot] = Some(hold);
                slot
            }
            None => {
                inner.entries.push(Some(hold));
                inner.entries.len() - 1
            }
        }
    }

    fn remove(&self, slot: usize) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = inner.entries.get_mut(slot) {
            if let Some(hold) = entry.take() {
                inner.free.push(slot);
                if hold.is_lock() {
                    crate::telemetry::locks_held(-1.0);
                }
            }
        }
    }

    pub(crate) fn all(&self) -> Vec<Arc<Hold>> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.entries.iter().flatten().cloned().collect()
    }

    fn len(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.entries.len() - inner.free.len()
    }
}

/// Keeps a hold in its coordinator's registry until dropped.
pub(crate) struct Registered {
    lifecycle: Arc<Lifecycle>,
    slot: usize,
    marker: bool,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.marker {
            self.lifecycle.markers.remove(self.slot);
        } else {
            self.lifecycle.locks.remove(self.slot);
        }
    }
}

/// Counts one completion write in progress until dropped.
pub(crate) struct Completing(Arc<Lifecycle>);

impl Drop for Completing {
    fn drop(&mut self) {
        if self.0.completing.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.completed.notify_waiters();
        }
    }
}

impl Lifecycle {
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    pub(crate) fn register_lock(self: &Arc<Self>, hold: Arc<Hold>) -> Registered {
        hold.mark_listed();
        Registered {
            slot: self.locks.insert(hold),
            lifecycle: self.clone(),
            marker: false,
        }
    }

    pub(crate) fn register_marker(self: &Arc<Self>, hold: Arc<Hold>) -> Registered {
        Registered {
            slot: self.markers.insert(hold),
            lifecycle: self.clone(),
            marker: true,
        }
    }

    pub(crate) fn completing(self: &Arc<Self>) -> Completing {
        self.completing.fetch_add(1, Ordering::AcqRel);
        Completing(self.clone())
    }

    /// How many locks this coordinator's calls hold in this process.
    pub(crate) fn locks_held(&self) -> usize {
        self.locks.len()
    }

    pub(crate) async fn completions_settled(&self) {
        loop {
            let settled = self.completed.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            if self.completing.load(Ordering::Acquire) == 0 {
                return;
            }
            settled.await;
        }
    }
}

pin_project_lite::pin_project! {
    /// `body`, with the lock it runs under (the innermost lock of the task: this runs inside
    /// the lock's scope, see `held::scope_lent`) listed in `lifecycle` (for shutdown,
    /// `Coordinator::locks_held` and the `coord_locks_held` gauge) from the first time the body
    /// waits until it returns or is dropped: how a `#[distributed_lock]` call lists its lock.
    ///
    /// A body that runs to its end without waiting is never listed. Listing it would change
    /// nothing: the call gives the lock back straight after, and shutdown never interrupts a
    /// body (it releases the lock and tells the body, which can only notice at an await).
    /// Listing takes the registry's mutex twice and updates the gauge twice, so a call that
    /// never waits (an in-process section without I/O) does none of it.
    pub(crate) struct ListedWhileWaiting<'a, F> {
        #[pin]
        body: F,
        lifecycle: &'a Arc<Lifecycle>,
        listed: Option<Registered>,
    }
}

impl<'a, F> ListedWhileWaiting<'a, F> {
    pub(crate) fn new(lifecycle: &'a Arc<Lifecycle>, body: F) -> ListedWhileWaiting<'a, F> {
        ListedWhileWaiting {
            body,
            lifecycle,
            listed: None,
        }
    }
}

impl<F: Future> Future for ListedWhileWaiting<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let polled = this.body.poll(cx);
        if polled.is_pending() && this.listed.is_none() {
            // Polled inside the lock's scope, so the task's innermost lock is this body's.
            if let Some(hold) = crate::runtime::held::innermost() {
                *this.listed = Some(this.lifecycle.register_lock(hold));
            }
        }
        polled
    }
}
