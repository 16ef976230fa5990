//! What a coordinator's calls hold in this process (locks, in-flight markers, completion
//! writes), and whether it is shutting down: the registry `Coordinator::shutdown` (in the
//! front door's `shutdown.rs`) gives back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
