//! `#[idempotent]` beyond the conformance suite: waiting duplicates, crashed callers,
//! cancellation, panics, replay reporting and backend faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::{ClaimOutcome, ClaimRequest, OwnerToken};
use coord_core::report::IdempotencyOutcome;
use coord_core::{CoordError, Coordinator, idempotent, observe};
use coord_tests::support::{InstrumentedProvider, eventually};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: String,
    cents: u64,
}

fn record_key(c: &Coordinator, op: &str, part: &str) -> coord_core::CallKey {
    c.key(op).part(part).finish()
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.charge", in_flight_lease = "300ms")]
async fn charge(
    c: &Coordinator,
    key: &str,
    cents: u64,
    runs: Arc<AtomicUsize>,
    hold: Duration,
) -> Result<Receipt, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    Ok(Receipt {
        id: format!("r-{key}"),
        cents,
    })
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.charge", wait = "10s")]
async fn charge_waiting(
    c: &Coordinator,
    key: &str,
    cents: u64,
    runs: Arc<AtomicUsize>,
    hold: Duration,
) -> Result<Receipt, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    Ok(Receipt {
        id: format!("r-{key}"),
        cents,
    })
}

/// The README's first example, as two processes run it: each has its own coordinator over one
/// shared provider (Redis in production), and the second gets a client's retry of a charge
/// while the first still runs it. With the example's `wait = "10s"`, the retry waits and gets
/// the first receipt; the charge runs once.
struct Service {
    coord: Coordinator,
    charges: Arc<AtomicUsize>,
}

impl Service {
    #[idempotent(key_from = "idempotency_key", retention = "24h", wait = "10s", coordinator = self.coord)]
    async fn charge(&self, idempotency_key: String, cents: u64) -> Result<Receipt, CoordError> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(Receipt {
            id: idempotency_key,
            cents,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_first_example_serves_a_retry_on_a_second_process() {
    let shared = Arc::new(coord_core::memory::MemoryProvider::new());
    let charges = Arc::new(AtomicUsize::new(0));
    let process = |shared: &Arc<coord_core::memory::MemoryProvider>| Service {
        coord: Coordinator::builder()
            .namespace("shop")
            .provider(shared.clone())
            .build()
            .unwrap(),
        charges: charges.clone(),
    };
    let (one, two) = (Arc::new(process(&shared)), process(&shared));
    let first = tokio::spawn({
        let one = one.clone();
        async move { one.charge("order-7".into(), 1999).await }
    });
    let key = two
        .coord
        .key(concat!(module_path!(), "::charge"))
        .part("order-7")
        .finish();
    eventually(
        "the first process runs the charge",
        Duration::from_secs(10),
        || {
            let ops = two.coord.operator();
            let key = key.clone();
            async move { ops.record(&key).await.unwrap().is_some() }
        },
    )
    .await;
    let (retry, report) = observe(two.charge("order-7".into(), 1999)).await;
    assert_eq!(retry.unwrap(), first.await.unwrap().unwrap());
    assert!(report.replayed(), "the retry waited and replayed");
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_is_refused_or_waits_and_replays() {
    let (_, c) = InstrumentedProvider::coordinator("inflight");
    let runs = Arc::new(AtomicUsize::new(0));
    let first = tokio::spawn({
        let (c, runs) = (c.clone(), runs.clone());
        async move { charge(&c, "k1", 10, runs, Duration::from_millis(250)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (refused, report) = observe(charge(&c, "k1", 10, runs.clone(), Duration::ZERO)).await;
    let refused = refused.unwrap_err();
    assert!(
        matches!(refused, CoordError::InFlight { .. }),
        "wait = 0s refuses: {refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "a call with idempotency key `tests.charge:k1` is still in flight, and this duplicate \
         did not wait for it (the operation's `wait`, `0s` unless set); nothing ran. Retry \
         later, or give the operation a `wait` (`wait = \"10s\"`) so a duplicate waits and \
         replays the outcome",
        "says why and how to wait"
    );
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::InFlight));

    let (waited, report) =
        observe(charge_waiting(&c, "k1", 10, runs.clone(), Duration::ZERO)).await;
    assert_eq!(
        waited.unwrap(),
        first.await.unwrap().unwrap(),
        "the waiting duplicate replays"
    );
    assert!(report.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_crashed_callers_marker_expires_with_its_lease() {
    let (_, c) = InstrumentedProvider::coordinator("crashed");
    // A caller in another process claimed the key and died: only its marker remains.
    let key = record_key(&c, "tests.charge", "k2");
    let claimed = c
        .idempotency_store()
        .claim(ClaimRequest {
            key: &key,
            owner: OwnerToken::new(),
            in_flight_lease: Duration::from_millis(300),
            fingerprint: None,
            keep_abandoned_for: None,
            transactional: false,
        })
        .await
        .unwrap();
    assert_eq!(claimed, ClaimOutcome::Claimed);
    let runs = Arc::new(AtomicUsize::new(0));
    assert!(
        charge(&c, "k2", 1, runs.clone(), Duration::ZERO)
            .await
            .is_err()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let receipt = charge(&c, "k2", 1, runs.clone(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        receipt.cents, 1,
        "after the marker's lease the key is free again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.parked", in_flight_lease = "60s")]
async fn parked(
    c: &Coordinator,
    key: &str,
    entered: Arc<tokio::sync::Notify>,
) -> Result<u32, CoordError> {
    entered.notify_one();
    std::future::pending::<()>().await;
    Ok(1)
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.parked", in_flight_lease = "60s")]
async fn panicking(c: &Coordinator, key: &str) -> Result<u32, CoordError> {
    panic!("body bug");
}

#[tokio::test]
async fn cancellation_and_panics_clear_the_marker_at_once() {
    let (_, c) = InstrumentedProvider::coordinator("cancelled");
    let entered = Arc::new(tokio::sync::Notify::new());
    tokio::select! {
        _ = parked(&c, "k3", entered.clone()) => unreachable!(),
        _ = entered.notified() => {}
    }
    eventually(
        "the dropped caller's marker is cleared",
        Duration::from_secs(2),
        || claimable(&c, "tests.parked", "k3"),
    )
    .await;

    let task = tokio::spawn({
        let c = c.clone();
        async move { panicking(&c, "k4").await }
    });
    assert!(task.await.unwrap_err().is_panic());
    eventually(
        "the panicked caller's marker is cleared",
        Duration::from_secs(2),
        || claimable(&c, "tests.parked", "k4"),
    )
    .await;
}

/// True when a fresh claim of the key succeeds (and then abandons it again).
async fn claimable(c: &Coordinator, op: &str, part: &str) -> bool {
    let key = record_key(c, op, part);
    let owner = OwnerToken::new();
    let store = c.idempotency_store();
    let found = store
        .claim(ClaimRequest {
            key: &key,
            owner,
            in_flight_lease: Duration::from_secs(1),
            fingerprint: None,
            keep_abandoned_for: None,
            transactional: false,
        })
        .await
        .unwrap();
    if found == ClaimOutcome::Claimed {
        store.abandon(&key, owner).await.unwrap();
    }
    found == ClaimOutcome::Claimed
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.records")]
async fn record_after_body(
    c: &Coordinator,
    key: &str,
    done: Arc<AtomicBool>,
) -> Result<u32, CoordError> {
    done.store(true, Ordering::SeqCst);
    Ok(7)
}

#[tokio::test]
async fn replays_are_reported_in_code() {
    let (_, c) = InstrumentedProvider::coordinator("report");
    let done = Arc::new(AtomicBool::new(false));
    let (first, report) = observe(record_after_body(&c, "k5", done.clone())).await;
    assert_eq!(first.unwrap(), 7);
    assert!(!report.replayed());
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    done.store(false, Ordering::SeqCst);
    let (second, report) = observe(record_after_body(&c, "k5", done.clone())).await;
    assert_eq!(second.unwrap(), 7);
    assert!(report.replayed());
    assert!(
        !done.load(Ordering::SeqCst),
        "a replay must not run the body"
    );
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.faults")]
async fn guarded(c: &Coordinator, key: &str, ran: Arc<AtomicBool>) -> Result<u32, CoordError> {
    ran.store(true, Ordering::SeqCst);
    Ok(1)
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.faults", on_backend_error = "fail_open")]
async fn lenient(c: &Coordinator, key: &str, ran: Arc<AtomicBool>) -> Result<u32, CoordError> {
    ran.store(true, Ordering::SeqCst);
    Ok(1)
}

#[tokio::test]
async fn backend_faults_follow_the_policy() {
    let (provider, c) = InstrumentedProvider::coordinator("idemfaults");
    provider.fail_records.store(true, Ordering::SeqCst);
    let ran = Arc::new(AtomicBool::new(false));
    let refused = guarded(&c, "k", ran.clone()).await;
    assert!(
        matches!(refused, Err(CoordError::Backend(_))),
        "got {refused:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    let (out, report) = observe(lenient(&c, "k", ran.clone())).await;
    assert_eq!(out.unwrap(), 1);
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::FailedOpen));
    assert_eq!(c.metrics().fail_open_runs(), 1);
}

type ApiResult<T> = Result<T, CoordError>;

#[idempotent(key_from = "key", coordinator = c, name = "tests.alias")]
async fn aliased(c: &Coordinator, key: u64, runs: Arc<AtomicUsize>) -> ApiResult<u64> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(key)
}

#[tokio::test]
async fn result_aliases_work() {
    let (_, c) = InstrumentedProvider::coordinator("alias");
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(aliased(&c, 3, runs.clone()).await.unwrap(), 3);
    assert_eq!(aliased(&c, 3, runs.clone()).await.unwrap(), 3);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the alias is recognised as a Result"
    );
}

#[idempotent(key_from = "key", coordinator = c, name = "tests.payout", in_flight_lease = "200ms", on_abandoned = "fail")]
async fn payout(c: &Coordinator, key: &str, runs: Arc<AtomicUsize>) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

#[tokio::test]
async fn an_abandoned_call_is_not_rerun_under_on_abandoned_fail() {
    let (_, c) = InstrumentedProvider::coordinator("abandoned");
    // A caller claimed the key and died mid-flight (another process): only its marker is left.
    let key = record_key(&c, "tests.payout", "p1");
    c.idempotency_store()
        .claim(ClaimRequest {
            key: &key,
            owner: OwnerToken::new(),
            in_flight_lease: Duration::from_millis(200),
            fingerprint: None,
            keep_abandoned_for: Some(Duration::from_secs(60)),
            transactional: false,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (out, report) = observe(payout(&c, "p1", runs.clone())).await;
    assert!(
        matches!(out, Err(CoordError::OutcomeUnknown { .. })),
        "got {out:?}"
    );
    assert_eq!(
        report.idempotency(),
        Some(IdempotencyOutcome::OutcomeUnknown)
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "at-most-once: the body must not run again"
    );

    assert!(
        c.purge_record(&record_key(&c, "tests.payout", "p1"))
            .await
            .unwrap(),
        "an operator resolves it"
    );
    assert_eq!(payout(&c, "p1", runs.clone()).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_abandoned_call_is_rerun_by_default() {
    let (_, c) = InstrumentedProvider::coordinator("rerun");
    let key = record_key(&c, "tests.charge", "p2");
    c.idempotency_store()
        .claim(ClaimRequest {
            key: &key,
            owner: OwnerToken::new(),
            in_flight_lease: Duration::from_millis(200),
            fingerprint: None,
            keep_abandoned_for: None,
            transactional: false,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    charge(&c, "p2", 5, runs.clone(), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "at-least-once: the body runs again"
    );
}
