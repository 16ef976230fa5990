//! A provider serves calls on every tokio runtime alike: a runtime that connected it, or made
//! its connections, and then blocks or is dropped must not stall or break calls made on
//! others (a pooled connection and the listening connection are shared by all of them).

mod support;

use std::sync::mpsc;
use std::time::Duration;

use coord_core::CallKey;
use coord_core::provider::{LockProvider, LockRequest, OwnerToken, ReleaseOutcome};
use coord_postgres::PostgresProvider;

/// How long the first runtime's thread is blocked: longer than the command timeout, so a
/// statement whose connection that runtime drives would time out.
const BLOCKED: Duration = Duration::from_secs(4);
const TIMEOUT: Duration = Duration::from_secs(2);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn request(key: &CallKey, owner: OwnerToken, wait: Duration) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease: Duration::from_secs(30),
        wait,
        fenced: true,
    }
}

/// Takes and releases `key` once, waiting for it while `holder` holds it for a moment, so the
/// call uses a pooled connection and the listening connection.
async fn hand_off(provider: &PostgresProvider, key: &CallKey) {
    let holder = OwnerToken::new();
    let grant = provider
        .acquire(request(key, holder, Duration::ZERO))
        .await
        .expect("acquire");
    assert!(grant.is_some(), "the key is free");
    let releaser = {
        let provider = provider.clone();
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            provider.release(&key, holder).await
        })
    };
    let waiter = OwnerToken::new();
    let grant = provider
        .acquire(request(key, waiter, Duration::from_secs(10)))
        .await
        .expect("a waiting acquire");
    assert!(grant.is_some(), "the waiter is handed the key on release");
    assert_eq!(
        releaser.await.unwrap().expect("release"),
        ReleaseOutcome::Released
    );
    assert_eq!(
        provider.release(key, waiter).await.expect("release"),
        ReleaseOutcome::Released
    );
}

#[test]
fn a_provider_outlives_the_runtime_that_made_its_connections() {
    let url = support::server().url();
    let key = CallKey::builder(&support::namespace("rt"), "handoff").finish();
    let (made, provider_rx) = mpsc::channel();
    let (go_block, block) = mpsc::channel::<()>();
    let (blocking, blocked) = mpsc::channel::<()>();
    // The first runtime connects the provider and makes its only pooled connection and its
    // listening connection; then its thread blocks, and then the runtime is dropped.
    let first = std::thread::spawn({
        let key = key.clone();
        move || {
            let rt = runtime();
            rt.block_on(async {
                let provider = PostgresProvider::builder(url)
                    .command_timeout(TIMEOUT)
                    .pool_size(1)
                    .connect()
                    .await
                    .expect("connect");
                hand_off(&provider, &key).await;
                made.send(provider).unwrap();
                block.recv().unwrap();
                blocking.send(()).unwrap();
                std::thread::sleep(BLOCKED);
            });
            drop(rt);
        }
    });
    let provider = provider_rx.recv().expect("the first runtime connected");
    go_block.send(()).unwrap();
    blocked.recv().unwrap();

    // While the first runtime's thread is blocked: a call on another runtime is answered
    // within the command timeout, over the one pooled connection.
    runtime().block_on(async {
        let owner = OwnerToken::new();
        let took = std::time::Instant::now();
        let grant = provider
            .acquire(request(&key, owner, Duration::ZERO))
            .await
            .unwrap_or_else(|e| {
                panic!("a call on another runtime failed while the first one was blocked: {e}")
            });
        assert!(grant.is_some());
        assert!(
            took.elapsed() < BLOCKED,
            "the call waited for the blocked runtime"
        );
        provider.release(&key, owner).await.expect("release");
    });

    // Once the first runtime is gone: waiting (the listening connection) and plain calls
    // still work from a third runtime.
    first.join().expect("the first runtime's thread");
    runtime().block_on(async {
        hand_off(&provider, &key).await;
        assert_eq!(
            provider.listener_connections(),
            1,
            "the listening connection made on the first runtime is still the one in use"
        );
    });
}
