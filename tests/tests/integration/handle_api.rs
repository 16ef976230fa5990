//! The handle API (`Coordinator::idempotent`) runs the same idempotency layer as the attribute,
//! with a key built at run time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::Fingerprint;
use coord_core::report::IdempotencyOutcome;
use coord_core::{CallKey, CoordError, Coordinator, idempotent, observe};

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
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(report.key().unwrap().to_string(), "handle.charge:order-1");
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
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::InFlight));
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

// ---- locks and single-flight in code ----

use coord_core::{LossCause, distributed_lock, fencing_token};
use coord_tests::support::{InstrumentedProvider, eventually, lock_is_free};

#[tokio::test]
async fn a_lock_guard_excludes_releases_and_says_whether_it_was_ours() {
    let c = coordinator("handle-lock");
    let key = || c.key("jobs.rebuild").part(&42u64).finish();
    let guard = c.lock(key()).acquire().await.unwrap();
    assert!(guard.is_held());
    assert_eq!(guard.key().to_string(), "jobs.rebuild:42");
    assert!(c.lock(key()).try_acquire().await.unwrap().is_none());
    let refused = c.lock(key()).acquire().await;
    assert!(
        matches!(refused, Err(CoordError::LockNotAcquired { .. })),
        "{refused:?}"
    );
    assert!(guard.release().await.unwrap(), "still ours at release");
    let again = c.lock(key()).try_acquire().await.unwrap();
    assert!(again.is_some(), "free after release");
}

#[tokio::test]
async fn a_dropped_guard_frees_the_lock_and_a_lapsed_one_says_so() {
    let c = coordinator("handle-drop");
    let key = || c.key("jobs.drop").finish();
    drop(c.lock(key()).acquire().await.unwrap());
    assert!(lock_is_free(&c, &key()).await, "dropping releases");

    let short = c
        .lock(key())
        .lease(Duration::from_millis(100))
        .fenced()
        .acquire()
        .await
        .unwrap();
    assert!(short.fencing_token().is_some());
    let cause = tokio::time::timeout(Duration::from_secs(5), short.lost())
        .await
        .expect("lost() resolves once the lease ran out");
    assert_eq!(cause, LossCause::BackendUnreachable);
    assert!(!short.is_held());
    assert_eq!(
        short.fencing_token(),
        None,
        "no token once the lease is over"
    );
    let next = c.lock(key()).acquire().await.unwrap();
    assert!(
        !short.release().await.unwrap(),
        "the lapsed holder's release finds it taken"
    );
    assert!(next.release().await.unwrap());
    assert_eq!(c.metrics().lapsed_releases(), 1);
}

#[tokio::test]
async fn fencing_tokens_grow_and_guards_move_between_tasks() {
    let c = coordinator("handle-fence");
    let key = || c.key("jobs.fenced").finish();
    let first = c.lock(key()).fenced().acquire().await.unwrap();
    let a = first.fencing_token().unwrap();
    // The guard moves to another task, which releases it.
    assert!(
        tokio::spawn(async move { first.release().await })
            .await
            .unwrap()
            .unwrap()
    );
    let second = c.lock(key()).fenced().acquire().await.unwrap();
    assert!(second.fencing_token().unwrap() > a);
    let unfenced = c
        .lock(c.key("jobs.plain").finish())
        .acquire()
        .await
        .unwrap();
    assert_eq!(unfenced.fencing_token(), None, "no token unless fenced");
}

#[tokio::test]
async fn a_waiting_acquire_gets_the_lock_when_it_is_released() {
    let c = coordinator("handle-wait");
    let key = || c.key("jobs.wait").finish();
    let holder = c.lock(key()).acquire().await.unwrap();
    let waiter = {
        let (c, key) = (c.clone(), key());
        tokio::spawn(async move { c.lock(key).wait(Duration::from_secs(10)).acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(holder.release().await.unwrap());
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is granted once the lock is released")
        .unwrap();
    assert!(got.is_ok(), "{got:?}");
}

#[test]
fn a_guard_dropped_outside_any_runtime_is_released_on_the_runtime_that_took_it() {
    let (provider, c) = InstrumentedProvider::coordinator("handle-off-runtime");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let key = c.key("jobs.off").finish();
    let guard = rt.block_on(c.lock(key.clone()).acquire()).unwrap();
    // Dropped on a plain thread: no runtime there.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    rt.block_on(eventually(
        "the lock is released",
        Duration::from_secs(5),
        || {
            let c = c.clone();
            let key = key.clone();
            async move { lock_is_free(&c, &key).await }
        },
    ));
    assert!(provider.releases.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn lock_run_is_the_attribute() {
    let c = coordinator("handle-run");
    let key = || c.key("jobs.run").part(&1u8).finish();
    let out: Result<Option<u64>, CoordError> = c
        .lock(key())
        .fenced()
        .run(|| async {
            // Inside, the task sees the lock like an attribute body does, and taking it again
            // is refused as reentrant.
            let again = c.lock(key()).acquire().await;
            assert!(
                matches!(again, Err(CoordError::Reentrant { .. })),
                "{again:?}"
            );
            Ok(fencing_token().map(|t| t.get()))
        })
        .await;
    assert!(out.unwrap().is_some());
    assert!(lock_is_free(&c, &key()).await);
    // The attribute and the handle lock the same key.
    let held = c.lock(key()).acquire().await.unwrap();
    assert!(matches!(
        by_attribute(&c, 1).await,
        Err(CoordError::LockNotAcquired { .. })
    ));
    drop(held);
}

#[distributed_lock(name = "jobs.run", key_from = "part", coordinator = c)]
async fn by_attribute(c: &Coordinator, part: u8) -> Result<(), CoordError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_flight_in_code_shares_one_run() {
    let c = coordinator("handle-flight");
    let runs = Arc::new(AtomicUsize::new(0));
    let (release, gate) = tokio::sync::watch::channel(false);
    let mut calls = Vec::new();
    for _ in 0..10 {
        let (c, runs, mut gate) = (c.clone(), runs.clone(), gate.clone());
        calls.push(tokio::spawn(async move {
            c.single_flight(c.key("quotes.get").part("ACME").finish())
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = gate.wait_for(|open| *open).await;
                    7u32
                })
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    release.send(true).unwrap();
    for call in calls {
        assert_eq!(call.await.unwrap(), 7);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
