//! The provider conformance suite (`coord-conformance`) against the in-process provider.

use std::sync::atomic::{AtomicUsize, Ordering};

use coord_core::Coordinator;

async fn fresh_coordinator() -> Coordinator {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let ns = format!("conf{}", NEXT.fetch_add(1, Ordering::Relaxed));
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .expect("memory coordinator builds")
}

coord_conformance::conformance_suite!(fresh_coordinator);
