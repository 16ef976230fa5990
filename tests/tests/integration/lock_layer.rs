//! `#[distributed_lock]` beyond the conformance suite: reentrancy, panics, cancellation,
//! lapsed leases and backend faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use coord_core::CallReport;
use coord_core::provider::{LockRequest, OwnerToken};
use coord_core::report::LockOutcome;
use coord_core::{
    CoordError, Coordinator, OnBackendError, distributed_lock, fencing_token, observe,
};
use coord_tests::support::{InstrumentedProvider, SpanRecorder, eventually, lock_is_free};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

fn lock_key(c: &Coordinator, op: &str, part: u64) -> coord_core::CallKey {
    c.key(op).part(&part).finish()
}

async fn is_free(c: &Coordinator, key: &coord_core::CallKey) -> bool {
    lock_is_free(c, key).await
}

/// Waits until the lock of operation `op`, part `part`, is free, for 2 s: far less than any
/// lease here, so only the release described by `what` can have freed it.
async fn freed_promptly(c: &Coordinator, op: &str, part: u64, what: &str) {
    let key = lock_key(c, op, part);
    eventually(what, Duration::from_secs(2), || is_free(c, &key)).await;
}

/// The body of the holds that never end by themselves: signals `entered`, then waits for ever.
async fn enter_and_park(entered: Arc<Notify>) -> Result<(), CoordError> {
    entered.notify_one();
    std::future::pending::<()>().await;
    Ok(())
}

/// A recorder of this thread's log lines, installed until the guard is dropped.
fn recording_warnings() -> (SpanRecorder, tracing::subscriber::DefaultGuard) {
    use tracing_subscriber::layer::SubscriberExt;
    let recorder = SpanRecorder::default();
    let guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    (recorder, guard)
}

/// Spawns `call` with a fresh `entered` signal and returns its task once the body signalled it.
async fn spawned_and_entered<F, Fut>(call: F) -> JoinHandle<Fut::Output>
where
    F: FnOnce(Arc<Notify>) -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let entered = Arc::new(Notify::new());
    let task = tokio::spawn(call(entered.clone()));
    entered.notified().await;
    task
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
    let what = "the lock is freed after the panic, long before its 30 s lease";
    freed_promptly(&c, "tests.panics", 3, what).await;
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.cancel", lease = "60s")]
async fn parks(c: &Coordinator, id: u64, entered: Arc<Notify>) -> Result<(), CoordError> {
    enter_and_park(entered).await
}

#[tokio::test]
async fn a_dropped_caller_releases_the_lock_at_once() {
    let (_, c) = InstrumentedProvider::coordinator("cancel");
    let entered = Arc::new(Notify::new());
    let call = parks(&c, 4, entered.clone());
    tokio::select! {
        _ = call => unreachable!("the body never finishes"),
        _ = entered.notified() => {}
    }
    // `call` was dropped by select!: the lock must be freed promptly, not after its lease.
    freed_promptly(&c, "tests.cancel", 4, "the dropped caller's lock is freed").await;
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.lapse", lease = "100ms")]
async fn outlives_lease(c: &Coordinator, id: u64, entered: Arc<Notify>) -> Result<(), CoordError> {
    entered.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

#[tokio::test]
async fn releasing_after_the_lease_lapsed_warns_and_frees_nobody() {
    let (recorder, _guard) = recording_warnings();
    let (_, c) = InstrumentedProvider::coordinator("lapse");
    let key = lock_key(&c, "tests.lapse", 5);
    let task = spawned_and_entered({
        let c = c.clone();
        move |entered| async move { outlives_lease(&c, 5, entered).await }
    })
    .await;
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

/// Holds its lock (30 s lease, no renewal) until `go`.
#[distributed_lock(key_from = "id", coordinator = c, name = "tests.forced", lease = "30s")]
async fn held_until(
    c: &Coordinator,
    id: u64,
    entered: Arc<Notify>,
    go: Arc<Notify>,
) -> Result<(), CoordError> {
    entered.notify_one();
    go.notified().await;
    Ok(())
}

/// A spawned, observed `held_until` call of part `id`, once its body runs, with its `go`.
async fn holding_until_go(
    c: &Coordinator,
    id: u64,
) -> (
    Arc<Notify>,
    JoinHandle<(Result<(), CoordError>, CallReport)>,
) {
    let go = Arc::new(Notify::new());
    let call = spawned_and_entered({
        let (c, go) = (c.clone(), go.clone());
        move |entered| async move { observe(held_until(&c, id, entered, go)).await }
    })
    .await;
    (go, call)
}

/// What an application sees when an operator force-releases its lock (what `coord locks
/// release` does, through `Operator::release_lock`) while the call holds it, without
/// renewal: the call's outcome stands, and the release reports a forced release, not a lapse,
/// in the report, the counters and one warning; and when the lock merely vanished (no marker
/// to tell), a warning that names both explanations.
#[tokio::test]
async fn a_forced_release_is_reported_as_one_and_a_vanished_lock_names_both_causes() {
    use coord_core::LossCause;
    let (recorder, _guard) = recording_warnings();
    let c = Coordinator::builder()
        .namespace("forced")
        .memory()
        .build()
        .unwrap();
    let key = lock_key(&c, "tests.forced", 1);
    let (go, call) = holding_until_go(&c, 1).await;
    let released = c.operator().release_lock(&key, "alice").await.unwrap();
    assert!(
        matches!(
            released,
            coord_core::provider::ForcedRelease::Released { .. }
        ),
        "{released:?}"
    );
    go.notify_one();
    let (outcome, report) = call.await.unwrap();
    outcome.expect("the body's outcome stands");
    assert_eq!(report.lock_lost(), Some(LossCause::ForceReleased));
    assert_eq!(c.metrics().force_released_holds(), 1);
    assert_eq!(c.metrics().lapsed_releases(), 0, "not counted as a lapse");
    let holder_side: Vec<String> = recorder
        .warnings()
        .into_iter()
        // The operator's own line (`Operator::release_lock` logs who asked) is the other one.
        .filter(|w| !w.starts_with("coord: lock force-released by an operator"))
        .collect();
    assert_eq!(
        holder_side,
        [
            "coord: an operator force-released this lock while the call held it (`coord locks \
          release` or `Operator::release_lock`), so the section was not exclusive from then \
          on; make the protected resource refuse stale writers with `fenced = true` and \
          `fencing_token()`"
        ],
        "one warning, saying what happened, never a lapse"
    );

    // The lock vanishes without a marker (a backend that lost it, or a provider that keeps
    // none): the holder cannot tell a forced release from an expiry, and says both.
    let key = lock_key(&c, "tests.forced", 2);
    let (go, call) = holding_until_go(&c, 2).await;
    let owner = c.operator().lock(&key).await.unwrap().holder.unwrap().owner;
    c.lock_provider().release(&key, owner).await.unwrap();
    let before = recorder.warnings().len();
    go.notify_one();
    let (outcome, report) = call.await.unwrap();
    outcome.expect("the body's outcome stands");
    assert_eq!(report.lock_lost(), Some(LossCause::ForceReleasedOrExpired));
    assert_eq!(c.metrics().lapsed_releases(), 1);
    assert_eq!(
        recorder.warnings()[before..],
        [
            "coord: the lock was gone when it was released although its lease had not run out \
          here: an operator force-released it, or it expired or was lost on the backend (a \
          clock running fast, a restart without persistence, an eviction, a failover); the two \
          cannot be told apart, and either way the section was not exclusive throughout; look \
          for the operator's `force-released` log line to tell which"
        ]
    );
}

/// The body of the fault policy's operations: says it ran.
fn ran_body(ran: &AtomicBool) -> Result<(), CoordError> {
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.faults")]
async fn closed(c: &Coordinator, id: u64, ran: Arc<AtomicBool>) -> Result<(), CoordError> {
    ran_body(&ran)
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.faults", on_backend_error = "fail_open")]
async fn open(c: &Coordinator, id: u64, ran: Arc<AtomicBool>) -> Result<(), CoordError> {
    ran_body(&ran)
}

#[tokio::test]
async fn backend_faults_follow_the_policy() {
    let (provider, c) = InstrumentedProvider::coordinator("faults");
    provider.fail_locks.store(true, Ordering::SeqCst);

    let ran = Arc::new(AtomicBool::new(false));
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
    let ran = Arc::new(AtomicBool::new(false));
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

// The in-process provider given to the coordinator as itself (`memory()`) is asked directly by
// the lock layer, without the contract's boxed futures: the same promises hold on that path.

fn in_process(namespace: &str) -> Coordinator {
    Coordinator::builder()
        .namespace(namespace)
        .memory()
        .build()
        .expect("an in-process coordinator")
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.direct", fenced = true)]
async fn direct(
    c: &Coordinator,
    id: u64,
    panics: bool,
) -> Result<(Option<u64>, bool, bool), CoordError> {
    if panics {
        panic!("body bug");
    }
    let nested = direct_again(c, id).await;
    Ok((
        fencing_token().map(|token| token.get()),
        coord_core::is_held(),
        matches!(nested, Err(CoordError::Reentrant { .. })),
    ))
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.direct")]
async fn direct_again(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    Ok(())
}

#[distributed_lock(key_from = "id", coordinator = c, name = "tests.direct", lease = "60s")]
async fn direct_parks(c: &Coordinator, id: u64, entered: Arc<Notify>) -> Result<(), CoordError> {
    enter_and_park(entered).await
}

#[tokio::test]
async fn the_direct_in_process_path_reads_its_hold_refuses_reentry_and_releases() {
    let c = in_process("direct-hold");
    let (token, held, reentry_refused) = direct(&c, 1, false).await.unwrap();
    assert!(token.is_some(), "a fenced lock's body reads its token");
    assert!(held, "is_held() inside the body");
    assert!(
        reentry_refused,
        "the same key inside its own body is reentrant"
    );
    assert!(fencing_token().is_none(), "nothing is held after the call");
    assert!(is_free(&c, &lock_key(&c, "tests.direct", 1)).await);
    let (next, _, _) = direct(&c, 1, false).await.unwrap();
    assert!(next > token, "a later grant's token is newer");
}

#[tokio::test]
async fn the_direct_in_process_path_releases_after_a_panic_and_a_cancellation() {
    let c = in_process("direct-drop");
    let task = tokio::spawn({
        let c = c.clone();
        async move { direct(&c, 2, true).await }
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(
        is_free(&c, &lock_key(&c, "tests.direct", 2)).await,
        "the panicking body's lock is free at once"
    );

    let task = spawned_and_entered({
        let c = c.clone();
        move |entered| async move { direct_parks(&c, 3, entered).await }
    })
    .await;
    assert!(!is_free(&c, &lock_key(&c, "tests.direct", 3)).await);
    assert_eq!(c.locks_held(), 1, "a waiting body's lock is listed");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(
        is_free(&c, &lock_key(&c, "tests.direct", 3)).await,
        "the cancelled call's lock is free at once"
    );
    assert_eq!(c.locks_held(), 0);
}

/// A metrics recorder that panics on the first metric a call records: foreign code, run while
/// the call holds its lock.
struct PanickingRecorder;

impl metrics::Recorder for PanickingRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        panic!("recorder bug")
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        panic!("recorder bug")
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        panic!("recorder bug")
    }
}

#[test]
fn a_panicking_recorder_leaves_no_direct_in_process_lock_held() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = in_process("direct-recorder");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        metrics::with_local_recorder(&PanickingRecorder, || rt.block_on(direct(&c, 4, false)))
    }));
    assert!(panicked.is_err(), "the recorder panicked inside the call");
    rt.block_on(async {
        assert!(
            is_free(&c, &lock_key(&c, "tests.direct", 4)).await,
            "the lock granted before the recorder panicked is free again"
        );
        assert!(direct(&c, 4, false).await.is_ok());
    });
}

/// An acquire whose answer was lost (`Timeout`) and whose grant lands after the first release
/// of its owner found nothing (as a commit waiting for a synchronous standby does): the
/// runtime's release keeps trying and removes it, long before its 60 s lease ends; so for
/// every key of a multi-key lock taken in order. The control: the clean-up that stops at the
/// first answer (`release_detached`) leaves the key held.
#[tokio::test]
async fn a_grant_landing_after_its_release_found_nothing_is_released() {
    let lease = Duration::from_secs(60);
    let (provider, c) = InstrumentedProvider::coordinator("late_grants");
    provider.late_grants.store(true, Ordering::SeqCst);
    let key = lock_key(&c, "tests.late", 1);
    let refused = c.lock(key.clone()).lease(lease).acquire().await;
    assert!(
        matches!(refused, Err(CoordError::Backend(ref e)) if e.kind() == coord_core::provider::BackendErrorKind::Timeout),
        "{refused:?}"
    );
    let (a, b) = (lock_key(&c, "tests.late", 2), lock_key(&c, "tests.late", 3));
    let refused = c
        .multi_lock([a.clone(), b.clone()])
        .lease(lease)
        .acquire()
        .await;
    assert!(refused.is_err(), "{refused:?}");
    provider.late_grants.store(false, Ordering::SeqCst);
    eventually(
        "the late grants to land",
        Duration::from_secs(10),
        || async { provider.grants_to_land.lock().unwrap().is_empty() },
    )
    .await;
    for key in [&key, &a] {
        eventually("a late grant is released", Duration::from_secs(10), || {
            is_free(&c, key)
        })
        .await;
    }
    assert!(
        is_free(&c, &b).await,
        "never asked for: the first key failed"
    );

    // The control: a release that stops at its first answer.
    provider.late_grants.store(true, Ordering::SeqCst);
    let control = lock_key(&c, "tests.late", 4);
    let owner = OwnerToken::new();
    let lost = c
        .lock_provider()
        .acquire(LockRequest {
            key: &control,
            owner,
            lease,
            wait: Duration::ZERO,
            fenced: false,
        })
        .await;
    assert!(lost.is_err(), "{lost:?}");
    provider.late_grants.store(false, Ordering::SeqCst);
    c.lock_provider()
        .clone()
        .release_detached(control.clone(), owner, lease);
    eventually(
        "the control's grant to land",
        Duration::from_secs(10),
        || async { provider.grants_to_land.lock().unwrap().is_empty() },
    )
    .await;
    assert!(
        !is_free(&c, &control).await,
        "the control's key is held by an owner nobody has"
    );
}
