//! `#[distributed_lock]` beyond the conformance suite: reentrancy, panics, cancellation,
//! lapsed leases and backend faults.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use coord_core::provider::{LockRequest, OwnerToken};
use coord_core::report::LockOutcome;
use coord_core::{
    CoordError, Coordinator, OnBackendError, distributed_lock, fencing_token, observe,
};
use coord_tests::support::{InstrumentedProvider, SpanRecorder, eventually, lock_is_free};

fn lock_key(c: &Coordinator, op: &str, part: u64) -> coord_core::CallKey {
    c.key(op).part(&part).finish()
}

async fn is_free(c: &Coordinator, key: &coord_core::CallKey) -> bool {
    lock_is_free(c, key).await
}

#[distributed_lock(key_from = "id", wait = "10s", coordinator = c, name = "tests.nested")]
async fn outer(c: &Coordinator, id: u64) -> Result<Result<(), CoordError>, CoordError> {
    Ok(inner(c, id).await)
}

#[distributed_lock(key_from = "id", wait = "10s", coordinator = c, name = "tests.nested")]
async fn inner(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    Ok(())
}

#[tokio::test]
async fn asking_again_for_a_held_key_fails_at_once() {
    let (_, c) = InstrumentedProvider::coordinator("reentrant");
    let started = std::time::Instant::now();
    let nested = outer(&c, 1).await.unwrap();
    assert!(
        matches!(nested, Err(CoordError::Reentrant { .. })),
        "got {nested:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "reentrancy must fail at once, not wait out the 10 s wait"
    );
    // A different key is not reentrancy.
    assert!(outer(&c, 1).await.is_ok());
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.panics")]
async fn panics_inside(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    panic!("body bug");
}

#[tokio::test]
async fn a_panicking_body_releases_the_lock_at_once() {
    let (_, c) = InstrumentedProvider::coordinator("panics");
    let task = tokio::spawn({
        let c = c.clone();
        async move { panics_inside(&c, 3).await }
    });
    assert!(task.await.unwrap_err().is_panic());
    let key = lock_key(&c, "tests.panics", 3);
    eventually(
        "the lock is freed after the panic, long before its 30 s lease",
        Duration::from_secs(2),
        || is_free(&c, &key),
    )
    .await;
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.cancel", lease = "60s")]
async fn parks(
    c: &Coordinator,
    id: u64,
    entered: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.notify_one();
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn a_dropped_caller_releases_the_lock_at_once() {
    let (_, c) = InstrumentedProvider::coordinator("cancel");
    let entered = Arc::new(tokio::sync::Notify::new());
    let call = parks(&c, 4, entered.clone());
    tokio::select! {
        _ = call => unreachable!("the body never finishes"),
        _ = entered.notified() => {}
    }
    // `call` was dropped by select!: the lock must be freed promptly, not after its lease.
    let key = lock_key(&c, "tests.cancel", 4);
    eventually(
        "the dropped caller's lock is freed",
        Duration::from_secs(2),
        || is_free(&c, &key),
    )
    .await;
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.lapse", lease = "100ms")]
async fn outlives_lease(
    c: &Coordinator,
    id: u64,
    entered: Arc<tokio::sync::Notify>,
) -> Result<(), CoordError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

#[tokio::test]
async fn releasing_after_the_lease_lapsed_warns_and_frees_nobody() {
    use tracing_subscriber::layer::SubscriberExt;
    let recorder = SpanRecorder::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let (_, c) = InstrumentedProvider::coordinator("lapse");
    let key = lock_key(&c, "tests.lapse", 5);
    let entered = Arc::new(tokio::sync::Notify::new());
    let task = tokio::spawn({
        let (c, entered) = (c.clone(), entered.clone());
        async move { outlives_lease(&c, 5, entered).await }
    });
    entered.notified().await;
    // Take the lock as soon as the first holder's lease lapses.
    let successor = OwnerToken::new();
    let grant = c
        .lock_provider()
        .acquire(LockRequest {
            key: &key,
            owner: successor,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            fenced: false,
        })
        .await
        .unwrap();
    assert!(grant.is_some(), "the lapsed lease frees the lock");
    task.await.unwrap().unwrap();
    assert!(
        !is_free(&c, &key).await,
        "the lapsed holder's release must not free the successor"
    );
    assert_eq!(c.metrics().lapsed_releases(), 1);
    let warned = recorder
        .warnings()
        .iter()
        .filter(|w| w.contains("not exclusive throughout"))
        .count();
    assert_eq!(warned, 1, "exactly one warning: {:?}", recorder.warnings());
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.faults")]
async fn closed(
    c: &Coordinator,
    id: u64,
    ran: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(), CoordError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.faults", on_backend_error = "fail_open")]
async fn open(
    c: &Coordinator,
    id: u64,
    ran: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(), CoordError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn backend_faults_follow_the_policy() {
    let (provider, c) = InstrumentedProvider::coordinator("faults");
    provider.fail_locks.store(true, Ordering::SeqCst);

    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (out, report) = observe(closed(&c, 1, ran.clone())).await;
    assert!(
        matches!(out, Err(CoordError::Backend(_))),
        "fail_closed refuses: {out:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "fail_closed must not run the body"
    );
    assert_eq!(report.lock(), Some(LockOutcome::BackendError));

    let (out, report) = observe(open(&c, 1, ran.clone())).await;
    assert!(out.is_ok());
    assert!(
        ran.load(Ordering::SeqCst),
        "fail_open runs the body unguarded"
    );
    assert_eq!(report.lock(), Some(LockOutcome::FailedOpen));
    assert_eq!(c.metrics().fail_open_runs(), 1);

    // The builder default applies where the attribute says nothing.
    let provider = Arc::new(InstrumentedProvider::default());
    provider.fail_locks.store(true, Ordering::SeqCst);
    let lenient = Coordinator::builder()
        .namespace("lenient")
        .provider(provider)
        .on_backend_error(OnBackendError::FailOpen)
        .build()
        .unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    assert!(closed(&lenient, 2, ran.clone()).await.is_ok());
    assert!(ran.load(Ordering::SeqCst));
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.unfenced")]
async fn unfenced(
    c: &Coordinator,
    id: u64,
) -> Result<Option<coord_core::FencingToken>, CoordError> {
    Ok(fencing_token())
}

#[tokio::test]
async fn unfenced_locks_expose_no_token() {
    let (_, c) = InstrumentedProvider::coordinator("unfenced");
    assert_eq!(unfenced(&c, 1).await.unwrap(), None);
    assert_eq!(fencing_token(), None, "outside a lock there is no token");
}
