//! The handle API (`Coordinator::idempotent`) runs the same idempotency layer as the attribute,
//! with a key built at run time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::{
    CallKey, CoordError, Coordinator, Fingerprint, IdempotencyOutcome, idempotent, observe,
};

fn coordinator(ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .unwrap()
}

#[idempotent(name = "handle.charge", key_from = "order", coordinator = c)]
async fn charge_by_attribute(
    c: &Coordinator,
    order: &str,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) as u64 + 100)
}

#[tokio::test]
async fn runs_once_and_replays_with_a_report() {
    let c = coordinator("handle-once");
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |runs: Arc<AtomicUsize>| {
        let key = c.key("handle.charge").part("order-1").finish();
        c.idempotent(key)
            .retention(Duration::from_secs(60))
            .run_reported(move || async move {
                Ok::<_, CoordError>(runs.fetch_add(1, Ordering::SeqCst) as u64)
            })
    };
    let (first, report) = call(runs.clone()).await;
    assert_eq!(first.unwrap(), 0);
    assert_eq!(report.idempotency, Some(IdempotencyOutcome::Executed));
    assert_eq!(report.key.unwrap().to_string(), "handle.charge:order-1");
    let (second, report) = call(runs.clone()).await;
    assert_eq!(second.unwrap(), 0, "replayed, not run again");
    assert!(report.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn shares_records_with_the_attribute() {
    let c = coordinator("handle-shared");
    let runs = Arc::new(AtomicUsize::new(0));
    let by_attribute = charge_by_attribute(&c, "o-9", runs.clone()).await.unwrap();
    let key = c.key("handle.charge").part("o-9").finish();
    let by_handle: Result<u64, CoordError> = c
        .idempotent(key)
        .run(|| async { panic!("the attribute's record must be replayed") })
        .await;
    assert_eq!(by_handle.unwrap(), by_attribute);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_error_is_not_stored_and_the_key_is_free_again() {
    let c = coordinator("handle-err");
    let key = || c.key("handle.flaky").part(&7u32).finish();
    let failed: Result<u64, CoordError> = c
        .idempotent(key())
        .run(|| async {
            Err(CoordError::InFlight {
                key: CallKey::builder("x", "y").finish(),
            })
        })
        .await;
    assert!(failed.is_err());
    let retried: Result<u64, CoordError> = c.idempotent(key()).run(|| async { Ok(5) }).await;
    assert_eq!(retried.unwrap(), 5);
}

#[tokio::test]
async fn a_different_fingerprint_is_refused_as_key_reuse() {
    let c = coordinator("handle-fp");
    let key = || c.key("handle.fp").part("k").finish();
    let first: Result<u64, CoordError> = c
        .idempotent(key())
        .fingerprint(Fingerprint([1; 16]))
        .run(|| async { Ok(1) })
        .await;
    assert_eq!(first.unwrap(), 1);
    let other: Result<u64, CoordError> = c
        .idempotent(key())
        .fingerprint(Fingerprint([2; 16]))
        .run(|| async { Ok(2) })
        .await;
    assert!(
        matches!(other, Err(CoordError::KeyReused { .. })),
        "{other:?}"
    );
}

#[tokio::test]
async fn a_duplicate_in_flight_is_told_or_waits() {
    let c = coordinator("handle-inflight");
    let key = || c.key("handle.slow").part("k").finish();
    let (release, gate) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let c = c.clone();
        let key = key();
        tokio::spawn(async move {
            c.idempotent(key)
                .run(|| async {
                    gate.await.ok();
                    Ok::<u64, CoordError>(9)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (at_once, report) = c
        .idempotent(key())
        .run_reported(|| async { Ok::<u64, CoordError>(0) })
        .await;
    assert!(
        matches!(at_once, Err(CoordError::InFlight { .. })),
        "{at_once:?}"
    );
    assert_eq!(report.idempotency, Some(IdempotencyOutcome::InFlight));
    let waiting = {
        let c = c.clone();
        let key = key();
        tokio::spawn(async move {
            observe(
                c.idempotent(key)
                    .wait(Duration::from_secs(10))
                    .run(|| async { Ok::<u64, CoordError>(0) }),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 9);
    let (waited, report) = waiting.await.unwrap();
    assert_eq!(
        waited.unwrap(),
        9,
        "the waiting duplicate replays the first outcome"
    );
    assert!(report.replayed());
}
