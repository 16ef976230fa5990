//! `#[idempotent(transaction = "tx")]` and `Idempotent::claim_in_transaction`: the outcome is
//! written in the caller's transaction, so the record exists if and only if the body's effects
//! committed. Run over the in-process provider with a transaction double that buffers writes
//! until its commit (`coord_tests::buffered_transaction`); the PostgreSQL provider's own tests
//! cover a real database.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::handle::TransactionStep;
use coord_core::provider::{BackendErrorKind, OutcomeTransaction, RecordStatus};
use coord_core::report::IdempotencyOutcome;
use coord_core::{
    CoordError, Coordinator, RollbackCause, distributed_lock, idempotent, is_held, observe,
};
use coord_tests::buffered_transaction::{BufferedTransaction, CommitError, Database};
use coord_tests::support::{InstrumentedProvider, eventually};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: String,
    cents: u64,
}

fn coordinator(ns: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(ns)
        .memory()
        .build()
        .unwrap()
}

/// A charge whose row and whose idempotency record are written in `tx`.
#[idempotent(
    key_from = "key",
    fingerprint = "cents",
    coordinator = c,
    name = "tx.charge",
    transaction = "tx",
    in_flight_lease = "300ms"
)]
async fn charge(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    cents: u64,
    runs: &AtomicUsize,
) -> Result<Receipt, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tx.write(format!("charge {key} {cents}"));
    Ok(Receipt {
        id: format!("r-{key}"),
        cents,
    })
}

/// Like `charge`, but waits for `gate` in the body, and lets duplicates wait.
#[idempotent(
    key_from = "key",
    coordinator = c,
    name = "tx.gated",
    transaction = "tx",
    in_flight_lease = "300ms",
    wait = "10s"
)]
async fn gated(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    gate: Arc<Notify>,
    runs: Arc<AtomicUsize>,
) -> Result<Receipt, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tx.write(format!("gated {key}"));
    gate.notified().await;
    Ok(Receipt {
        id: format!("g-{key}"),
        cents: 1,
    })
}

#[tokio::test]
async fn a_committed_outcome_is_replayed_without_touching_the_next_transaction() {
    let c = coordinator("tx-commit");
    let db = Database::default();
    let runs = AtomicUsize::new(0);

    let mut tx = BufferedTransaction::begin(&c, &db);
    let (first, report) = observe(charge(&c, &mut tx, "k1", 10, &runs)).await;
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    assert_eq!(
        tx.completions(),
        1,
        "the completion is written in the transaction"
    );
    assert_eq!(
        db.rows(),
        Vec::<String>::new(),
        "nothing is visible before the commit"
    );
    tx.commit().await.unwrap();
    assert_eq!(db.rows(), vec!["charge k1 10".to_owned()]);

    let mut tx = BufferedTransaction::begin(&c, &db);
    let (again, report) = observe(charge(&c, &mut tx, "k1", 10, &runs)).await;
    assert_eq!(again.unwrap(), first.unwrap());
    assert!(report.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        tx.calls().is_empty(),
        "a replay never touches the transaction"
    );
    tx.commit().await.unwrap();
    assert_eq!(db.rows().len(), 1, "the replay wrote nothing");
}

#[tokio::test]
async fn before_the_commit_duplicates_see_the_claim_and_waiters_replay_after_it() {
    let c = coordinator("tx-inflight");
    let db = Database::default();
    let gate = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (commit_tx, commit_rx) = tokio::sync::oneshot::channel::<()>();
    let first = tokio::spawn({
        let (c, db, gate, runs) = (c.clone(), db.clone(), gate.clone(), runs.clone());
        async move {
            let mut tx = BufferedTransaction::begin(&c, &db);
            let out = gated(&c, &mut tx, "k", gate, runs).await;
            done_tx.send(()).unwrap();
            commit_rx.await.unwrap();
            tx.commit().await.unwrap();
            out
        }
    });
    eventually("the first body to start", Duration::from_secs(10), || {
        let runs = runs.clone();
        async move { runs.load(Ordering::SeqCst) == 1 }
    })
    .await;
    let mut tx = BufferedTransaction::begin(&c, &db);
    let (refused, report) = observe(charge_no_wait(&c, &mut tx, "k")).await;
    assert!(
        matches!(refused, Err(CoordError::InFlight { .. })),
        "the claim is visible at once, outside the transaction: {refused:?}"
    );
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::InFlight));

    gate.notify_one();
    done_rx.await.unwrap();
    // Completed in the first transaction, not committed yet: a waiting duplicate is still
    // waiting, and replays once the commit lands.
    let waiter = tokio::spawn({
        let (c, db, runs) = (c.clone(), db.clone(), runs.clone());
        async move {
            let mut tx = BufferedTransaction::begin(&c, &db);
            let out = observe(gated(&c, &mut tx, "k", Arc::new(Notify::new()), runs)).await;
            (out, tx.calls())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !waiter.is_finished(),
        "nothing is replayable before the commit"
    );
    commit_tx.send(()).unwrap();
    let first = first.await.unwrap().unwrap();
    let ((waited, report), calls) = waiter.await.unwrap();
    assert_eq!(waited.unwrap(), first);
    assert!(report.replayed());
    assert!(calls.is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.rows(), vec!["gated k".to_owned()]);
}

#[idempotent(key_from = "key", coordinator = c, name = "tx.gated", transaction = "tx")]
async fn charge_no_wait(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
) -> Result<Receipt, CoordError> {
    tx.write("never");
    unreachable!("refused while the first call is in flight")
}

#[tokio::test]
async fn a_rollback_leaves_no_record_and_the_next_call_runs_again() {
    let c = coordinator("tx-rollback");
    let db = Database::default();
    let runs = AtomicUsize::new(0);
    let mut tx = BufferedTransaction::begin(&c, &db);
    charge(&c, &mut tx, "k", 10, &runs).await.unwrap();
    tx.rollback().await;
    assert_eq!(db.rows(), Vec::<String>::new());
    let key = c.key("tx.charge").part("k").finish();
    assert_eq!(c.operations().inspect_record(&key).await.unwrap(), None);

    let mut tx = BufferedTransaction::begin(&c, &db);
    let (out, report) = observe(charge(&c, &mut tx, "k", 10, &runs)).await;
    out.unwrap();
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Executed));
    tx.commit().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(db.rows(), vec!["charge k 10".to_owned()]);
}

#[tokio::test(start_paused = true)]
async fn a_process_killed_before_its_commit_leaves_a_marker_that_lapses_into_nothing() {
    let c = coordinator("tx-killed");
    let db = Database::default();
    let runs = AtomicUsize::new(0);
    let mut tx = BufferedTransaction::begin(&c, &db);
    charge(&c, &mut tx, "k", 10, &runs).await.unwrap();
    drop(tx); // the database rolls back a transaction whose connection died

    let mut tx = BufferedTransaction::begin(&c, &db);
    let refused = charge(&c, &mut tx, "k", 10, &runs).await;
    assert!(
        matches!(refused, Err(CoordError::InFlight { .. })),
        "until its lease ends the marker stands: {refused:?}"
    );
    tokio::time::advance(Duration::from_millis(301)).await;
    let (out, report) = observe(charge(&c, &mut tx, "k", 10, &runs)).await;
    out.unwrap();
    assert_eq!(
        report.idempotency(),
        Some(IdempotencyOutcome::Executed),
        "a lapsed transactional marker is absent, not an unknown outcome"
    );
    tx.commit().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(db.rows(), vec!["charge k 10".to_owned()]);
}

/// Held in its body until `gate`, with a short lease, so another caller can take the key over.
#[idempotent(
    key_from = "key",
    coordinator = c,
    name = "tx.slow",
    transaction = "tx",
    in_flight_lease = "300ms"
)]
async fn slow(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    gate: Arc<Notify>,
) -> Result<Receipt, CoordError> {
    tx.write(format!("slow {key}"));
    gate.notified().await;
    Ok(Receipt {
        id: format!("s-{key}"),
        cents: 2,
    })
}

#[tokio::test(start_paused = true)]
async fn a_marker_taken_over_during_the_body_fails_the_owner_check_and_dooms_the_transaction() {
    let c = coordinator("tx-superseded");
    let db = Database::default();
    let gate = Arc::new(Notify::new());
    let first = tokio::spawn({
        let (c, db, gate) = (c.clone(), db.clone(), gate.clone());
        async move {
            let mut tx = BufferedTransaction::begin(&c, &db);
            let out = slow(&c, &mut tx, "k", gate).await;
            let calls = tx.calls();
            let doomed = tx.rollback_only().map(str::to_owned);
            (out, calls, doomed, tx.commit().await)
        }
    });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(301)).await;
    // The first body's marker lapsed: a duplicate claims the key, runs and commits.
    let mut tx = BufferedTransaction::begin(&c, &db);
    let released = Arc::new(Notify::new());
    released.notify_one();
    let second = slow(&c, &mut tx, "k", released).await.unwrap();
    tx.commit().await.unwrap();

    gate.notify_one();
    let (out, calls, doomed, commit) = first.await.unwrap();
    match out {
        Err(err @ CoordError::TransactionRollbackOnly { .. }) => {
            assert!(err.is_retryable(), "{err}");
            let CoordError::TransactionRollbackOnly { cause, .. } = err else {
                unreachable!()
            };
            assert!(
                matches!(
                    cause,
                    RollbackCause::Superseded {
                        other: Some(_),
                        completed: true
                    }
                ),
                "{cause:?}"
            );
        }
        other => panic!("expected TransactionRollbackOnly, got {other:?}"),
    }
    assert_eq!(calls, vec!["complete"]);
    assert!(
        doomed.is_some(),
        "the failed owner check made it rollback-only"
    );
    assert!(matches!(commit, Err(CommitError::RollbackOnly(_))));
    assert_eq!(
        db.rows(),
        vec!["slow k".to_owned()],
        "only the second run's effects committed"
    );
    let mut tx = BufferedTransaction::begin(&c, &db);
    let never = Arc::new(Notify::new());
    assert_eq!(
        slow(&c, &mut tx, "k", never).await.unwrap(),
        second,
        "the record is the second run's"
    );
}

#[tokio::test]
async fn a_marker_purged_during_the_body_is_missing_and_the_transaction_cannot_commit() {
    let c = coordinator("tx-missing");
    let db = Database::default();
    let gate = Arc::new(Notify::new());
    let first = tokio::spawn({
        let (c, db, gate) = (c.clone(), db.clone(), gate.clone());
        async move {
            let mut tx = BufferedTransaction::begin(&c, &db);
            let out = slow(&c, &mut tx, "k", gate).await;
            (out, tx.commit().await)
        }
    });
    let key = c.key("tx.slow").part("k").finish();
    eventually("the marker", Duration::from_secs(10), || {
        let (c, key) = (c.clone(), key.clone());
        async move { c.operations().inspect_record(&key).await.unwrap().is_some() }
    })
    .await;
    assert!(c.idempotency_store().purge(&key).await.unwrap());
    gate.notify_one();
    let (out, commit) = first.await.unwrap();
    assert!(
        matches!(
            out,
            Err(CoordError::TransactionRollbackOnly {
                cause: RollbackCause::MarkerMissing,
                ..
            })
        ),
        "{out:?}"
    );
    assert!(matches!(commit, Err(CommitError::RollbackOnly(_))));
    assert!(db.rows().is_empty());
}

#[tokio::test]
async fn a_reused_key_with_other_parameters_is_refused_before_the_body() {
    let c = coordinator("tx-reused");
    let db = Database::default();
    let runs = AtomicUsize::new(0);
    let mut tx = BufferedTransaction::begin(&c, &db);
    charge(&c, &mut tx, "k", 10, &runs).await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = BufferedTransaction::begin(&c, &db);
    let (out, report) = observe(charge(&c, &mut tx, "k", 11, &runs)).await;
    assert!(matches!(out, Err(CoordError::KeyReused { .. })), "{out:?}");
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::KeyReused));
    assert!(tx.calls().is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[derive(Debug)]
enum ChargeError {
    Declined,
    // Read through `Debug` only, in the failure messages.
    #[allow(dead_code)]
    Coord(CoordError),
}

impl From<CoordError> for ChargeError {
    fn from(err: CoordError) -> Self {
        ChargeError::Coord(err)
    }
}

#[idempotent(key_from = "key", coordinator = c, name = "tx.declining", transaction = "tx")]
async fn declining(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    decline: bool,
    runs: &AtomicUsize,
) -> Result<u64, ChargeError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tx.write(format!("attempt {key}"));
    if decline {
        return Err(ChargeError::Declined);
    }
    Ok(7)
}

#[tokio::test]
async fn a_body_error_abandons_the_marker_and_writes_nothing_in_the_transaction() {
    let c = coordinator("tx-error");
    let db = Database::default();
    let runs = AtomicUsize::new(0);
    let mut tx = BufferedTransaction::begin(&c, &db);
    let out = declining(&c, &mut tx, "k", true, &runs).await;
    assert!(matches!(out, Err(ChargeError::Declined)), "{out:?}");
    assert!(
        tx.calls().is_empty(),
        "no completion, no rollback-only mark"
    );
    let key = c.key("tx.declining").part("k").finish();
    assert_eq!(
        c.operations().inspect_record(&key).await.unwrap(),
        None,
        "the marker was abandoned before the error was returned"
    );
    tx.rollback().await;

    let mut tx = BufferedTransaction::begin(&c, &db);
    assert_eq!(declining(&c, &mut tx, "k", false, &runs).await.unwrap(), 7);
    tx.commit().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Serializes, but never back: a record of it could not be replayed.
#[derive(Debug, Clone)]
struct OneWay;

impl Serialize for OneWay {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("one-way")
    }
}

impl<'de> Deserialize<'de> for OneWay {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom("a one-way value does not decode"))
    }
}

#[idempotent(key_from = "key", coordinator = c, name = "tx.one_way", transaction = "tx")]
async fn one_way(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
) -> Result<OneWay, CoordError> {
    tx.write(format!("one-way {key}"));
    Ok(OneWay)
}

#[tokio::test]
async fn an_outcome_that_cannot_be_encoded_marks_the_transaction_rollback_only() {
    let c = coordinator("tx-codec");
    let db = Database::default();
    let mut tx = BufferedTransaction::begin(&c, &db);
    let (out, report) = observe(one_way(&c, &mut tx, "k")).await;
    assert!(
        matches!(
            out,
            Err(CoordError::TransactionRollbackOnly {
                cause: RollbackCause::Codec(_),
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::NotStored));
    assert_eq!(tx.calls(), vec!["rollback_only"]);
    assert!(matches!(
        tx.commit().await,
        Err(CommitError::RollbackOnly(_))
    ));
    assert!(db.rows().is_empty());
    let key = c.key("tx.one_way").part("k").finish();
    assert_eq!(
        c.operations().inspect_record(&key).await.unwrap(),
        None,
        "the marker of a run that cannot commit is abandoned"
    );
}

#[tokio::test]
async fn a_failed_write_in_the_transaction_is_a_typed_error_and_frees_the_key() {
    let c = coordinator("tx-write-fails");
    let db = Database::default();
    let runs = AtomicUsize::new(0);
    let mut tx = BufferedTransaction::begin(&c, &db).failing_writes(BackendErrorKind::Unavailable);
    let out = charge(&c, &mut tx, "k", 10, &runs).await;
    match &out {
        Err(err @ CoordError::TransactionRollbackOnly { cause, .. }) => {
            assert!(
                matches!(cause, RollbackCause::Backend(e) if e.kind() == BackendErrorKind::Unavailable)
            );
            assert!(err.is_retryable());
            assert!(
                std::error::Error::source(err).is_some(),
                "the backend fault is the source"
            );
        }
        other => panic!("expected TransactionRollbackOnly, got {other:?}"),
    }
    assert!(tx.rollback_only().is_some());
    let key = c.key("tx.charge").part("k").finish();
    eventually(
        "the marker to be abandoned",
        Duration::from_secs(10),
        || {
            let (c, key) = (c.clone(), key.clone());
            async move { c.operations().inspect_record(&key).await.unwrap().is_none() }
        },
    )
    .await;
    let mut tx = BufferedTransaction::begin(&c, &db);
    charge(&c, &mut tx, "k", 10, &runs).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_call_dropped_mid_body_abandons_its_marker_at_once() {
    let c = coordinator("tx-dropped");
    let db = Database::default();
    let mut tx = BufferedTransaction::begin(&c, &db);
    let never = Arc::new(Notify::new());
    let out = tokio::time::timeout(
        Duration::from_millis(50),
        slow(&c, &mut tx, "k", never.clone()),
    )
    .await;
    assert!(out.is_err(), "the body never returns");
    assert!(tx.calls().is_empty());
    drop(tx);
    let key = c.key("tx.slow").part("k").finish();
    assert_eq!(
        c.operations().inspect_record(&key).await.unwrap(),
        None,
        "the in-process provider abandons synchronously"
    );
}

#[idempotent(key_from = "key", coordinator = c, name = "tx.panics", transaction = "tx")]
async fn panics(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
) -> Result<u64, CoordError> {
    tx.write(key);
    panic!("the body panicked");
}

#[tokio::test]
async fn a_body_that_panics_leaves_the_key_free_and_nothing_committed() {
    let c = coordinator("tx-panic");
    let db = Database::default();
    let task = tokio::spawn({
        let (c, db) = (c.clone(), db.clone());
        async move {
            let mut tx = BufferedTransaction::begin(&c, &db);
            let _ = panics(&c, &mut tx, "k").await;
        }
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(
        db.rows().is_empty(),
        "the transaction was dropped with the task"
    );
    let key = c.key("tx.panics").part("k").finish();
    assert_eq!(
        c.operations().inspect_record(&key).await.unwrap(),
        None,
        "the marker was abandoned while unwinding"
    );
}

#[tokio::test]
async fn a_provider_without_transactional_claims_is_refused_before_the_body_even_fail_open() {
    // The instrumented provider keeps the contract's default: no transactional claims.
    let (provider, c) = InstrumentedProvider::coordinator("tx-unsupported");
    assert!(!c.idempotency_store().transactional_claims());
    let db = Database::default();
    let runs = AtomicUsize::new(0);
    let mut tx = BufferedTransaction::begin(&c, &db);
    let (out, report) = observe(fail_open_charge(&c, &mut tx, "k", &runs)).await;
    match out {
        Err(CoordError::Backend(err)) => {
            assert_eq!(err.kind(), BackendErrorKind::Config);
            assert!(err.to_string().contains("transaction"), "{err}");
        }
        other => panic!("expected a Config backend error, got {other:?}"),
    }
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::BackendError));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(
        provider.claims.load(Ordering::SeqCst),
        0,
        "nothing was claimed"
    );
    assert!(tx.calls().is_empty());
}

#[idempotent(
    key_from = "key",
    coordinator = c,
    name = "tx.fail_open",
    transaction = "tx",
    on_backend_error = "fail_open"
)]
async fn fail_open_charge(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    runs: &AtomicUsize,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tx.write(key);
    Ok(1)
}

#[idempotent(
    key_from = "key",
    coordinator = c,
    name = "tx.storm",
    transaction = "tx",
    wait = "30s"
)]
async fn storm_charge(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    runs: Arc<AtomicUsize>,
) -> Result<Receipt, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tx.write(format!("storm {key}"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(Receipt {
        id: format!("st-{key}"),
        cents: 5,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_duplicates_runs_the_body_once_and_commits_one_row() {
    let c = coordinator("tx-storm");
    let db = Database::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let (c, db, runs) = (c.clone(), db.clone(), runs.clone());
            tokio::spawn(async move {
                let mut tx = BufferedTransaction::begin(&c, &db);
                let out = storm_charge(&c, &mut tx, "k", runs).await;
                tx.commit().await.unwrap();
                out
            })
        })
        .collect();
    let mut receipts = Vec::new();
    for caller in callers {
        receipts.push(caller.await.unwrap().unwrap());
    }
    assert!(receipts.iter().all(|r| *r == receipts[0]), "{receipts:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(db.rows(), vec!["storm k".to_owned()]);
}

/// The transactional layer stacks with the lock like the plain one: the lock is held while the
/// body runs with the transaction.
#[idempotent(key_from = "key", coordinator = c, name = "tx.locked", transaction = "tx")]
#[distributed_lock(lease = "10s")]
async fn locked(
    c: &Coordinator,
    mut tx: &mut BufferedTransaction,
    key: String,
) -> Result<bool, CoordError> {
    tx.write(key);
    let held = is_held();
    // The parameter keeps its `mut` binding in the body.
    tx = &mut *tx;
    tx.write("again");
    Ok(held)
}

#[tokio::test]
async fn the_lock_nests_inside_and_is_held_while_the_body_writes() {
    let c = coordinator("tx-locked");
    let db = Database::default();
    let mut tx = BufferedTransaction::begin(&c, &db);
    assert!(locked(&c, &mut tx, "k".to_owned()).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(db.rows(), vec!["k".to_owned(), "again".to_owned()]);
    let mut tx = BufferedTransaction::begin(&c, &db);
    assert!(locked(&c, &mut tx, "k".to_owned()).await.unwrap());
    assert!(tx.calls().is_empty(), "replayed");
}

/// A transaction taken as a trait object works the same.
#[idempotent(key_from = "key", coordinator = c, name = "tx.dyn", transaction = "tx", renew = true)]
async fn through_dyn(
    c: &Coordinator,
    tx: &mut dyn OutcomeTransaction,
    key: &str,
) -> Result<u64, CoordError> {
    let _ = (tx, key);
    tokio::time::sleep(Duration::from_secs(90)).await;
    Ok(3)
}

#[tokio::test(start_paused = true)]
async fn a_renewed_marker_outlives_a_long_body_and_a_trait_object_transaction_works() {
    let c = coordinator("tx-dyn");
    let db = Database::default();
    let mut tx = BufferedTransaction::begin(&c, &db);
    // The default in-flight lease is 30 s; the body takes 90 s, renewed every 10 s.
    assert_eq!(through_dyn(&c, &mut tx, "k").await.unwrap(), 3);
    assert_eq!(
        tx.completions(),
        1,
        "the marker was still ours at the completion"
    );
    tx.commit().await.unwrap();
}

#[idempotent(
    key_from = "key",
    coordinator = c,
    name = "tx.renewed",
    transaction = "tx",
    in_flight_lease = "300ms",
    renew = true
)]
async fn renewed_until_lost(
    c: &Coordinator,
    tx: &mut BufferedTransaction,
    key: &str,
    written: Arc<Notify>,
) -> Result<u64, CoordError> {
    tx.write(format!("half of {key}"));
    written.notify_one();
    std::future::pending::<()>().await;
    Ok(1)
}

#[tokio::test]
async fn a_body_stopped_because_its_marker_was_lost_leaves_the_transaction_unable_to_commit() {
    let c = coordinator("tx-lost");
    let db = Database::default();
    let written = Arc::new(Notify::new());
    let call = tokio::spawn({
        let (c, db, written) = (c.clone(), db.clone(), written.clone());
        async move {
            let mut tx = BufferedTransaction::begin(&c, &db);
            let out = renewed_until_lost(&c, &mut tx, "k", written).await;
            (out, tx.calls(), tx.commit().await)
        }
    });
    written.notified().await;
    // The marker disappears under the running body (an operator's purge): its renewal finds
    // it gone, and the body is stopped.
    let key = c.key("tx.renewed").part("k").finish();
    assert!(c.idempotency_store().purge(&key).await.unwrap());
    let (out, calls, commit) = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the loss stops the body")
        .unwrap();
    assert!(matches!(out, Err(CoordError::LockLost { .. })), "{out:?}");
    assert_eq!(calls, vec!["rollback_only"], "half a run must not commit");
    assert!(matches!(commit, Err(CommitError::RollbackOnly(_))));
    assert!(db.rows().is_empty());
}

#[tokio::test]
async fn the_handle_form_claims_runs_completes_and_replays() {
    let c = coordinator("tx-handle");
    let db = Database::default();
    let key = || c.key("tx.handle").part("k").finish();

    let mut tx = BufferedTransaction::begin(&c, &db);
    let TransactionStep::Run(run) = c
        .idempotent(key())
        .claim_in_transaction::<Receipt>()
        .await
        .unwrap()
    else {
        panic!("the key is free")
    };
    assert!(run.is_guarded());
    assert_eq!(run.key(), &key());
    tx.write("handle row");
    let receipt = Receipt {
        id: "h".to_owned(),
        cents: 3,
    };
    run.complete_in(&mut tx, &receipt).await.unwrap();
    tx.commit().await.unwrap();

    let tx = BufferedTransaction::begin(&c, &db);
    match c
        .idempotent(key())
        .claim_in_transaction::<Receipt>()
        .await
        .unwrap()
    {
        TransactionStep::Replay(replayed) => assert_eq!(replayed, receipt),
        TransactionStep::Run(_) => panic!("the committed outcome is replayed"),
    }
    assert!(tx.calls().is_empty());
    assert_eq!(db.rows(), vec!["handle row".to_owned()]);
}

#[tokio::test]
async fn a_dropped_or_abandoned_run_token_frees_the_key_at_once() {
    let c = coordinator("tx-token");
    let key = || c.key("tx.token").part("k").finish();
    for settle in ["drop", "abandon"] {
        let step = c
            .idempotent(key())
            .claim_in_transaction::<u64>()
            .await
            .unwrap();
        let TransactionStep::Run(run) = step else {
            panic!("{settle}: the key is free")
        };
        let refused = c.idempotent(key()).claim_in_transaction::<u64>().await;
        assert!(
            matches!(refused, Err(CoordError::InFlight { .. })),
            "{settle}: {refused:?}"
        );
        match settle {
            "drop" => drop(run),
            _ => run.abandon().await,
        }
        let again = c
            .idempotent(key())
            .claim_in_transaction::<u64>()
            .await
            .unwrap();
        assert!(
            matches!(again, TransactionStep::Run(_)),
            "{settle}: the key is free again"
        );
    }
}

#[tokio::test]
async fn the_handle_reports_a_failed_owner_check_and_the_transaction_cannot_commit() {
    let c = coordinator("tx-handle-lost");
    let db = Database::default();
    let key = c.key("tx.handle").part("k").finish();
    let TransactionStep::Run(run) = c
        .idempotent(key.clone())
        .in_flight_lease(Duration::from_millis(300))
        .claim_in_transaction::<u64>()
        .await
        .unwrap()
    else {
        panic!("the key is free")
    };
    // Another caller takes the key over: here, by purging and claiming it, as an operator
    // and a duplicate would after the lease.
    assert!(c.idempotency_store().purge(&key).await.unwrap());
    let TransactionStep::Run(other) = c
        .idempotent(key.clone())
        .claim_in_transaction::<u64>()
        .await
        .unwrap()
    else {
        panic!("the key was purged")
    };
    let mut tx = BufferedTransaction::begin(&c, &db);
    tx.write("lost");
    let err = run.complete_in(&mut tx, &1).await.unwrap_err();
    assert!(
        matches!(
            err,
            CoordError::TransactionRollbackOnly {
                cause: RollbackCause::Superseded {
                    completed: false,
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(matches!(
        tx.commit().await,
        Err(CommitError::RollbackOnly(_))
    ));
    assert!(db.rows().is_empty());
    let info = c.operations().inspect_record(&key).await.unwrap().unwrap();
    assert_eq!(
        info.status,
        RecordStatus::InFlight,
        "the other claim stands"
    );
    drop(other);
}
