//! Outcome integrity of `#[idempotent]` and clean-up of ambiguous writes, against a provider
//! that fails the way a real backend does: a command that never ran, and a command that ran
//! but whose reply was lost.
//!
//! Each test states the caller's result, what a duplicate gets afterwards and how many times
//! the body ran. The same promises are checked against a real `redis-server` in
//! `coord-redis/tests/redis/outcome_faults.rs`.

use coord_core::CallKey;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::memory::MemoryProvider;
use coord_core::provider::{
    BackendErrorKind, BoxFuture, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest,
    IdempotencyStore, LockGrant, LockProvider, LockRequest, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use coord_core::report::IdempotencyOutcome;
use coord_core::{
    BackendError, CoordError, Coordinator, NotStoredCause, distributed_lock, idempotent, observe,
};
use coord_tests::support::eventually;
use serde::{Deserialize, Serialize};

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The command never reached the backend.
    NotSent,
    /// The command ran; its reply was lost.
    ReplyLost,
}

/// A countdown of injected faults for one kind of call.
#[derive(Debug, Default)]
struct Faults {
    not_sent: AtomicUsize,
    reply_lost: AtomicUsize,
    calls: AtomicUsize,
}

impl Faults {
    fn inject(&self, fault: Fault, times: usize) {
        match fault {
            Fault::NotSent => self.not_sent.store(times, Ordering::SeqCst),
            Fault::ReplyLost => self.reply_lost.store(times, Ordering::SeqCst),
        }
    }

    /// Counts a call and takes one pending fault, if any.
    fn next(&self) -> Option<Fault> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let take = |n: &AtomicUsize| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                .is_ok()
        };
        if take(&self.not_sent) {
            Some(Fault::NotSent)
        } else if take(&self.reply_lost) {
            Some(Fault::ReplyLost)
        } else {
            None
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn timeout() -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        "injected: no reply within the timeout",
    )
}

/// Runs `op` on the inner provider unless a fault says otherwise. `op` is only called when
/// the command is "sent": the in-process provider does its work when called, not when polled.
async fn faulty<T, Fut>(faults: &Faults, op: impl FnOnce() -> Fut) -> Result<T, BackendError>
where
    Fut: Future<Output = Result<T, BackendError>>,
{
    match faults.next() {
        None => op().await,
        Some(Fault::NotSent) => Err(timeout()),
        Some(Fault::ReplyLost) => {
            let _ = op().await;
            Err(timeout())
        }
    }
}

/// The in-process provider with injected faults per operation.
#[derive(Debug, Default)]
struct FaultyProvider {
    inner: MemoryProvider,
    claims: Faults,
    completes: Faults,
    abandons: Faults,
    acquires: Faults,
    releases: Faults,
}

/// No operator support: these tests never inspect or list.
impl coord_core::provider::Operations for FaultyProvider {}

impl LockProvider for FaultyProvider {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        Box::pin(faulty(&self.acquires, || self.inner.acquire(req)))
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(faulty(&self.releases, move || {
            self.inner.release(key, owner)
        }))
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        self.inner.renew(key, owner, lease)
    }
}

/// No shared cache: the defaults.
impl coord_core::provider::CacheStore for FaultyProvider {}
/// No cluster-scope single-flight: these tests do not use it.
impl coord_core::provider::FlightStore for FaultyProvider {}
/// No semaphores: these tests do not use them.
impl coord_core::provider::SemaphoreStore for FaultyProvider {}
impl coord_core::provider::RwLockStore for FaultyProvider {}
impl coord_core::provider::MultiLockStore for FaultyProvider {}

impl IdempotencyStore for FaultyProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        Box::pin(faulty(&self.claims, || self.inner.claim(req)))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        Box::pin(faulty(&self.completes, || self.inner.complete(req)))
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(faulty(&self.abandons, move || {
            self.inner.abandon(key, owner)
        }))
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.wait_settled(key, timeout)
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        self.inner.renew_marker(key, owner, lease)
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.inner.purge(key)
    }
}

fn setup(ns: &str) -> (Arc<FaultyProvider>, Coordinator) {
    let provider = Arc::new(FaultyProvider::default());
    let coordinator = Coordinator::builder()
        .namespace(ns)
        .provider(provider.clone())
        .build()
        .expect("valid test coordinator");
    (provider, coordinator)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u64,
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.pay", in_flight_lease = "400ms", on_abandoned = "fail")]
async fn pay(c: &Coordinator, key: &str, runs: Arc<AtomicUsize>) -> Result<Receipt, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) as u64;
    Ok(Receipt { id: n + 1 })
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.pay_rerun", in_flight_lease = "400ms")]
async fn pay_rerun(
    c: &Coordinator,
    key: &str,
    runs: Arc<AtomicUsize>,
) -> Result<Receipt, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) as u64;
    Ok(Receipt { id: n + 1 })
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.pay_ok", in_flight_lease = "400ms", on_store_error = "return_ok")]
async fn pay_return_ok(
    c: &Coordinator,
    key: &str,
    runs: Arc<AtomicUsize>,
) -> Result<Receipt, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) as u64;
    Ok(Receipt { id: n + 1 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_fails_a_few_times_is_retried_and_replays() {
    let (p, c) = setup("oi-retry");
    let runs = Arc::new(AtomicUsize::new(0));
    p.completes.inject(Fault::NotSent, 2);
    let first = pay(&c, "k", runs.clone()).await;
    assert_eq!(first.unwrap(), Receipt { id: 1 });
    assert_eq!(
        p.completes.calls(),
        3,
        "two failed attempts, then the stored one"
    );
    let (again, report) = observe(pay(&c, "k", runs.clone())).await;
    assert_eq!(again.unwrap(), Receipt { id: 1 }, "the duplicate replays");
    assert!(report.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_reply_was_lost_is_resent_and_counts_as_stored() {
    let (p, c) = setup("oi-resend");
    let runs = Arc::new(AtomicUsize::new(0));
    p.completes.inject(Fault::ReplyLost, 1);
    assert_eq!(pay(&c, "k", runs.clone()).await.unwrap(), Receipt { id: 1 });
    assert_eq!(pay(&c, "k", runs.clone()).await.unwrap(), Receipt { id: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_that_cannot_be_stored_is_an_error_and_the_duplicate_is_told_unknown() {
    let (p, c) = setup("oi-unstored");
    let runs = Arc::new(AtomicUsize::new(0));
    p.completes.inject(Fault::NotSent, usize::MAX);
    let (first, report) = observe(pay(&c, "k", runs.clone())).await;
    match first {
        Err(CoordError::OutcomeNotStored {
            cause: NotStoredCause::Backend(err),
            ..
        }) => assert_eq!(err.kind(), BackendErrorKind::Timeout),
        other => panic!("expected OutcomeNotStored, got {other:?}"),
    }
    assert!(report.outcome_not_stored());
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::NotStored));
    assert!(
        p.completes.calls() >= 3,
        "retried while the marker could be ours"
    );
    assert_eq!(c.metrics().outcomes_not_stored(), 1);
    assert!(
        !CoordError::OutcomeNotStored {
            key: CallKey::builder("oi", "any").finish(),
            cause: NotStoredCause::DoubleRun { other: None }
        }
        .is_retryable()
    );
    p.completes.inject(Fault::NotSent, 0);
    // The marker was left: once its lease lapses, on_abandoned = "fail" says unknown.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dup = pay(&c, "k", runs.clone()).await;
    assert!(
        matches!(dup, Err(CoordError::OutcomeUnknown { .. })),
        "got {dup:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_rerun_an_unstored_outcome_lets_the_duplicate_run_after_the_lease() {
    let (p, c) = setup("oi-unstored-rerun");
    let runs = Arc::new(AtomicUsize::new(0));
    p.completes.inject(Fault::NotSent, usize::MAX);
    assert!(matches!(
        pay_rerun(&c, "k", runs.clone()).await,
        Err(CoordError::OutcomeNotStored { .. })
    ));
    p.completes.inject(Fault::NotSent, 0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pay_rerun(&c, "k", runs.clone()).await.unwrap(),
        Receipt { id: 2 }
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "at-least-once: ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_ok_keeps_the_old_answer_and_flags_the_report() {
    let (p, c) = setup("oi-return-ok");
    let runs = Arc::new(AtomicUsize::new(0));
    p.completes.inject(Fault::NotSent, usize::MAX);
    let (first, report) = observe(pay_return_ok(&c, "k", runs.clone())).await;
    assert_eq!(first.unwrap(), Receipt { id: 1 });
    assert!(report.outcome_not_stored(), "the report says what happened");
    assert_eq!(c.metrics().outcomes_not_stored(), 1);
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.slow", in_flight_lease = "200ms")]
async fn slow_pay(
    c: &Coordinator,
    key: &str,
    runs: Arc<AtomicUsize>,
    hold: Duration,
) -> Result<Receipt, CoordError> {
    let n = runs.fetch_add(1, Ordering::SeqCst) as u64;
    tokio::time::sleep(hold).await;
    Ok(Receipt { id: n + 1 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_finds_another_owner_reports_the_double_run() {
    let (_p, c) = setup("oi-double");
    let runs = Arc::new(AtomicUsize::new(0));
    // The first caller outlives its marker's lease; a duplicate claims and runs meanwhile.
    let first = tokio::spawn({
        let (c, runs) = (c.clone(), runs.clone());
        async move { slow_pay(&c, "k", runs, Duration::from_millis(700)).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = slow_pay(&c, "k", runs.clone(), Duration::from_millis(50)).await;
    assert_eq!(second.unwrap(), Receipt { id: 2 });
    match first.await.unwrap() {
        Err(CoordError::OutcomeNotStored {
            cause: NotStoredCause::DoubleRun { other },
            ..
        }) => assert!(other.is_some(), "names the other owner"),
        other => panic!("expected a double run, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[derive(Debug, Clone, PartialEq)]
struct Unencodable;

impl Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("this value has no stored form"))
    }
}

impl<'de> Deserialize<'de> for Unencodable {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom("never stored"))
    }
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.unencodable", in_flight_lease = "300ms")]
async fn unencodable(
    c: &Coordinator,
    key: &str,
    runs: Arc<AtomicUsize>,
) -> Result<Unencodable, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(Unencodable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_codec_cannot_carry_is_told_at_completion_and_never_stored() {
    let (p, c) = setup("oi-codec");
    let runs = Arc::new(AtomicUsize::new(0));
    let first = unencodable(&c, "k", runs.clone()).await;
    assert!(
        matches!(
            first,
            Err(CoordError::OutcomeNotStored {
                cause: NotStoredCause::Codec(_),
                ..
            })
        ),
        "got {first:?}"
    );
    assert_eq!(p.completes.calls(), 0, "nothing undecodable is written");
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.optional")]
async fn optional_key(
    c: &Coordinator,
    key: Option<String>,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) as u64)
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.optional_open", on_missing_key = "run_unprotected")]
async fn optional_key_open(
    c: &Coordinator,
    key: Option<String>,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_key_is_refused_before_the_body_and_never_shared() {
    let (p, c) = setup("oi-missing");
    let runs = Arc::new(AtomicUsize::new(0));
    let (out, report) = observe(optional_key(&c, None, runs.clone())).await;
    match out {
        Err(CoordError::MissingKey { op, part }) => {
            assert_eq!(op, "oi.optional");
            assert_eq!(part.as_deref(), Some("key"));
        }
        other => panic!("expected MissingKey, got {other:?}"),
    }
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::MissingKey));
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    assert_eq!(p.claims.calls(), 0, "no record was touched");
    // A present key still works, and is not confused with the absent one.
    assert_eq!(
        optional_key(&c, Some("a".into()), runs.clone())
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        optional_key(&c, Some("a".into()), runs.clone())
            .await
            .unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_unprotected_runs_every_keyless_call_and_counts_it() {
    let (p, c) = setup("oi-missing-open");
    let runs = Arc::new(AtomicUsize::new(0));
    let (first, report) = observe(optional_key_open(&c, None, runs.clone())).await;
    assert_eq!(first.unwrap(), 0);
    assert_eq!(report.idempotency(), Some(IdempotencyOutcome::Unprotected));
    assert_eq!(
        optional_key_open(&c, None, runs.clone()).await.unwrap(),
        1,
        "no shared record: the second keyless call runs too"
    );
    assert_eq!(c.metrics().unprotected_runs(), 2);
    assert_eq!(p.claims.calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_was_lost_does_not_block_the_key() {
    let (p, c) = setup("oi-claim-lost");
    let runs = Arc::new(AtomicUsize::new(0));
    p.claims.inject(Fault::ReplyLost, 1);
    // The claim's 400 ms in-flight lease runs from no earlier than this.
    let lease_end = Instant::now() + Duration::from_millis(400);
    let first = pay(&c, "k", runs.clone()).await;
    assert!(
        matches!(&first, Err(CoordError::Backend(e)) if e.kind() == BackendErrorKind::Timeout),
        "got {first:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The claim landed; the owner-checked clean-up frees it well before its 400 ms lease, so
    // the retry runs instead of being told `InFlight` (or, later, `OutcomeUnknown`).
    eventually(
        "the landed claim is abandoned",
        Duration::from_millis(300),
        || async { p.abandons.calls() >= 1 },
    )
    .await;
    // The clean-up was called; its delete may still be on its way. Retries before the lease
    // could have ended: only the clean-up can free the key that early.
    let retry = loop {
        match pay(&c, "k", runs.clone()).await {
            Err(CoordError::InFlight { .. })
                if Instant::now() + Duration::from_millis(50) < lease_end =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => break other,
        }
    };
    assert_eq!(retry.unwrap(), Receipt { id: 1 });
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_abandon_is_retried_until_the_key_is_free() {
    let (p, c) = setup("oi-abandon-retry");
    #[idempotent(key_from = "key", coordinator = c, name = "oi.fails", in_flight_lease = "5s")]
    async fn fails(c: &Coordinator, key: &str) -> Result<u64, CoordError> {
        Err(CoordError::InFlight {
            key: CallKey::builder("oi", "the-bodys-own-error").finish(),
        })
    }
    p.abandons.inject(Fault::NotSent, 2);
    assert!(fails(&c, "k").await.is_err());
    // Without the retries the marker would block the key for its 5 s lease.
    eventually("the abandon is retried", Duration::from_secs(2), || async {
        p.abandons.calls() >= 3
    })
    .await;
    let runs = Arc::new(AtomicUsize::new(0));
    #[idempotent(key_from = "key", coordinator = c, name = "oi.fails", in_flight_lease = "5s")]
    async fn succeeds(
        c: &Coordinator,
        key: &str,
        runs: Arc<AtomicUsize>,
    ) -> Result<u64, CoordError> {
        Ok(runs.fetch_add(1, Ordering::SeqCst) as u64)
    }
    assert_eq!(succeeds(&c, "k", runs.clone()).await.unwrap(), 0);
}

#[distributed_lock(key_from = "id", coordinator = c, name = "oi.lock", lease = "10s")]
async fn locked(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_was_lost_is_released_at_once() {
    let (p, c) = setup("oi-acquire-lost");
    p.acquires.inject(Fault::ReplyLost, 1);
    let first = locked(&c, 1).await;
    assert!(
        matches!(first, Err(CoordError::Backend(_))),
        "got {first:?}"
    );
    // The acquire landed with a 10 s lease; the clean-up frees it now.
    eventually(
        "the landed acquire is released",
        Duration::from_secs(2),
        || async { locked(&c, 1).await.is_ok() },
    )
    .await;
    assert!(p.releases.calls() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_is_retried_in_the_background() {
    let (p, c) = setup("oi-release-retry");
    p.releases.inject(Fault::NotSent, 2);
    locked(&c, 2).await.unwrap();
    // Held with a 10 s lease after the failed release; the retries free it.
    eventually(
        "the failed release is retried",
        Duration::from_secs(2),
        || async { locked(&c, 2).await.is_ok() },
    )
    .await;
    assert!(p.releases.calls() >= 3);
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.versions")]
async fn versioned(c: &Coordinator, key: &str, runs: Arc<AtomicUsize>) -> Result<u64, CoordError> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) as u64 + 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_decode_is_a_codec_error_naming_the_key_until_purged() {
    // An older deployment stored JSON; this one reads the tagged format from the same store.
    let store = Arc::new(MemoryProvider::new());
    let old = Coordinator::builder()
        .namespace("oi-codec-upgrade")
        .provider(store.clone())
        .codec(coord_core::Codec::Json)
        .build()
        .unwrap();
    let new = Coordinator::builder()
        .namespace("oi-codec-upgrade")
        .provider(store.clone())
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    assert_eq!(versioned(&old, "k", runs.clone()).await.unwrap(), 10);
    match versioned(&new, "k", runs.clone()).await {
        Err(err @ CoordError::Codec { .. }) => {
            let key = err.key().expect("a codec error names its key");
            assert_eq!(key.to_string(), "oi.versions:k");
            assert_eq!(key.namespace(), "oi-codec-upgrade");
        }
        other => panic!("expected a codec error, got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "never run again over a record"
    );
    let pasted = CallKey::from_op_key(new.namespace(), "oi.versions:k").unwrap();
    assert!(new.purge_record(&pasted).await.unwrap());
    assert_eq!(versioned(&new, "k", runs.clone()).await.unwrap(), 11);
    assert_eq!(versioned(&new, "k", runs.clone()).await.unwrap(), 11);
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.cancel_fail", in_flight_lease = "30s", on_abandoned = "fail")]
async fn cancellable_fail(
    c: &Coordinator,
    key: &str,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(1)
}

#[idempotent(key_from = "key", coordinator = c, name = "oi.cancel_rerun", in_flight_lease = "10s")]
async fn cancellable_rerun(
    c: &Coordinator,
    key: &str,
    runs: Arc<AtomicUsize>,
    hold: Duration,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(hold).await;
    Ok(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_body_is_unknown_under_fail_and_cleared_under_rerun() {
    let (_p, c) = setup("oi-cancel");
    let runs = Arc::new(AtomicUsize::new(0));
    // at-most-once: the body started and may have had effects, so it is never run again; and
    // duplicates learn that at once, not after the 30 s in-flight lease: the cancelled call's
    // marker is ended as the abandoned record in the background, right away.
    let started = tokio::spawn({
        let (c, runs) = (c.clone(), runs.clone());
        async move { cancellable_fail(&c, "k", runs).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    started.abort();
    let _ = started.await;
    eventually(
        "a duplicate gets OutcomeUnknown, not InFlight until the lease ends",
        Duration::from_secs(5),
        || async {
            let dup = cancellable_fail(&c, "k", runs.clone()).await;
            assert!(
                matches!(
                    dup,
                    Err(CoordError::OutcomeUnknown { .. } | CoordError::InFlight { .. })
                ),
                "got {dup:?}"
            );
            matches!(dup, Err(CoordError::OutcomeUnknown { .. }))
        },
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // at-least-once: the marker is cleared (in the background, right away), so a retry runs
    // long before the 10 s lease would have freed the key.
    let runs = Arc::new(AtomicUsize::new(0));
    let started = tokio::spawn({
        let (c, runs) = (c.clone(), runs.clone());
        async move { cancellable_rerun(&c, "k", runs, Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    started.abort();
    let _ = started.await;
    eventually(
        "a retry runs instead of waiting out the cancelled call's marker",
        Duration::from_secs(2),
        || async {
            cancellable_rerun(&c, "k", runs.clone(), Duration::ZERO)
                .await
                .is_ok()
        },
    )
    .await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
