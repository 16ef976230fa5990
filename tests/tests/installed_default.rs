//! An installed coordinator is the one attributes without `coordinator = ..` use.
//! (Its own test binary: the default coordinator is process-wide.)

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{LockRequest, OwnerToken};
use coord_core::{CoordError, Coordinator, distributed_lock};
use coord_tests::support::InstrumentedProvider;

#[distributed_lock(key_from = "tenant", name = "jobs.rebuild")]
async fn rebuild(tenant: &str, gate: Arc<tokio::sync::Notify>) -> Result<(), CoordError> {
    gate.notified().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_use_the_installed_coordinator() {
    let provider = Arc::new(InstrumentedProvider::default());
    Coordinator::builder()
        .namespace("payflow")
        .provider(provider.clone())
        .install()
        .unwrap();
    assert_eq!(Coordinator::current().namespace(), "payflow");
    assert!(!Coordinator::current().is_in_process_only());

    let gate = Arc::new(tokio::sync::Notify::new());
    let running = tokio::spawn(rebuild("acme", gate.clone()));
    while provider.acquires.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = provider.inner.lock_keys();
    assert_eq!(held, 1, "the call's lock lives in the installed provider");
    // The key is namespaced and named as configured.
    let key = &coord_core::CallKey::builder("payflow", "jobs.rebuild")
        .part("acme")
        .finish();
    let stranger = OwnerToken::new();
    use coord_core::provider::LockProvider;
    let refused = provider
        .acquire(LockRequest {
            key,
            owner: stranger,
            lease: Duration::from_secs(1),
            wait: Duration::ZERO,
            fenced: false,
        })
        .await
        .unwrap();
    assert_eq!(refused, None, "the held key is `payflow:jobs.rebuild:acme`");
    gate.notify_one();
    running.await.unwrap().unwrap();
    assert_eq!(provider.inner.lock_keys(), 0);
}
