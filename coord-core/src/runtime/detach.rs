//! Work that must finish even when the caller stops waiting for it.
//!
//! Releasing a lock, clearing an in-flight marker and recording a completed outcome must not
//! be lost because the caller's future was dropped. `DetachOnDrop` runs such work inline (no
//! spawn on the common path) and, if it is dropped before the work finished, hands the rest of
//! the work to the tokio runtime through the contract's background runner (which shutdown
//! counts).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::provider::background::spawn_detached;

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
