//! `#[single_flight(scope = "cluster")]` over the in-process provider: two coordinators sharing
//! one provider meet through it as two instances sharing Redis would (their process flights are
//! separate), so one run is shared between them, errors cross when they can, a cancelled or
//! silent leader is replaced by exactly one follower, and nothing is remembered afterwards.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::memory::MemoryProvider;
use coord_core::provider::{FlightStore, OwnerToken};
use coord_core::report::FlightOutcome;
use coord_core::{CallKey, CoordError, Coordinator, OnBackendError, observe, single_flight};
use coord_tests::support::InstrumentedProvider;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Two coordinators (two "instances") over one in-process provider.
fn two_instances(ns: &str) -> (Arc<MemoryProvider>, Coordinator, Coordinator) {
    let provider = Arc::new(MemoryProvider::new());
    let make = || {
        Coordinator::builder()
            .namespace(ns)
            .provider(provider.clone())
            .build()
            .expect("valid test coordinator")
    };
    let (a, b) = (make(), make());
    (provider, a, b)
}

#[single_flight(key_from = "symbol", scope = "cluster", coordinator = coord)]
async fn refresh(
    coord: &Coordinator,
    symbol: &str,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(symbol.len() as u64 * 100)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_on_two_instances_share_one_run() {
    let (provider, a, b) = two_instances("cf1");
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        let coord = if i % 2 == 0 { a.clone() } else { b.clone() };
        let runs = runs.clone();
        tasks.push(tokio::spawn(async move {
            observe(refresh(&coord, "ACME", runs)).await
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        let (out, report) = task.await.expect("caller task");
        assert_eq!(out.expect("every caller gets the leader's value"), 400);
        outcomes.push(report.flight());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for both instances");
    let count = |o: FlightOutcome| outcomes.iter().filter(|x| **x == Some(o)).count();
    assert_eq!(count(FlightOutcome::ClusterLed), 1, "{outcomes:?}");
    assert_eq!(
        count(FlightOutcome::ClusterJoined),
        1,
        "the other instance sent one waiter: {outcomes:?}"
    );
    assert_eq!(count(FlightOutcome::Joined), 98, "{outcomes:?}");

    // Nothing is remembered: a call after the flight ended runs again.
    assert_eq!(refresh(&b, "ACME", runs.clone()).await.unwrap(), 400);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a later call runs again");
    // The claims are gone; only hand-overs (kept a few seconds) may remain.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        provider.flight_entries() <= 2,
        "{}",
        provider.flight_entries()
    );
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum QuoteError {
    Upstream(String),
    Coord(String),
}

impl From<CoordError> for QuoteError {
    fn from(err: CoordError) -> Self {
        QuoteError::Coord(err.kind_str().to_owned())
    }
}

#[single_flight(key_from = "symbol", scope = "cluster", coordinator = coord)]
async fn failing_quote(
    coord: &Coordinator,
    symbol: &str,
    started: Arc<Notify>,
) -> Result<u64, QuoteError> {
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Err(QuoteError::Upstream(format!("{symbol} is down")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serialisable_error_reaches_the_other_instance_as_itself() {
    let (_provider, a, b) = two_instances("cf2");
    let started = Arc::new(Notify::new());
    let leader = {
        let (a, started) = (a.clone(), started.clone());
        tokio::spawn(async move { failing_quote(&a, "ACME", started).await })
    };
    started.notified().await;
    let (follower, report) = observe(failing_quote(&b, "ACME", Arc::new(Notify::new()))).await;
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterJoined));
    let expected = Err(QuoteError::Upstream("ACME is down".to_owned()));
    assert_eq!(follower, expected);
    assert_eq!(leader.await.unwrap(), expected);
}

#[single_flight(key_from = "symbol", scope = "cluster", coordinator = coord)]
async fn opaque_failure(
    coord: &Coordinator,
    symbol: &str,
    started: Arc<Notify>,
) -> Result<u64, CoordError> {
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    Err(CoordError::Codec {
        key: coord.key("upstream").part(symbol).finish(),
        message: "the leader's own failure".to_owned(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_error_that_cannot_be_serialised_reaches_followers_as_leader_failed() {
    let (_provider, a, b) = two_instances("cf3");
    let started = Arc::new(Notify::new());
    let leader = {
        let (a, started) = (a.clone(), started.clone());
        tokio::spawn(async move { opaque_failure(&a, "ACME", started).await })
    };
    started.notified().await;
    let follower = opaque_failure(&b, "ACME", Arc::new(Notify::new())).await;
    match follower {
        Err(CoordError::LeaderFailed { key }) => {
            assert!(key.to_string().ends_with("opaque_failure:ACME"), "{key}");
        }
        other => panic!("expected LeaderFailed, got {other:?}"),
    }
    // The leader's own caller gets its error as it is.
    assert!(matches!(
        leader.await.unwrap(),
        Err(CoordError::Codec { message, .. }) if message == "the leader's own failure"
    ));
}

#[single_flight(key_from = "symbol", scope = "cluster", lease = "30s", coordinator = coord)]
async fn slow_refresh(
    coord: &Coordinator,
    symbol: &str,
    runs: Arc<AtomicUsize>,
    hang_first: bool,
) -> Result<u64, CoordError> {
    let run = runs.fetch_add(1, Ordering::SeqCst);
    if hang_first && run == 0 {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(symbol.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_leader_is_replaced_by_exactly_one_follower_at_once() {
    let ns = "cf4";
    let provider = Arc::new(InstrumentedProvider::default());
    let instances: Vec<Coordinator> = (0..4)
        .map(|_| {
            Coordinator::builder()
                .namespace(ns)
                .provider(provider.clone())
                .build()
                .unwrap()
        })
        .collect();
    let runs = Arc::new(AtomicUsize::new(0));
    let leader = {
        let (coord, runs) = (instances[0].clone(), runs.clone());
        tokio::spawn(async move { slow_refresh(&coord, "ACME", runs, true).await })
    };
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut followers = Vec::new();
    for coord in &instances[1..] {
        for _ in 0..10 {
            let (coord, runs) = (coord.clone(), runs.clone());
            followers.push(tokio::spawn(async move {
                observe(slow_refresh(&coord, "ACME", runs, true)).await
            }));
        }
    }
    // Every other instance's local leader is waiting on the cluster flight before the leader
    // goes: only then is "exactly one took over" the thing being tested.
    let deadline = Instant::now() + Duration::from_secs(30);
    while provider.flight_waits.load(Ordering::SeqCst) < instances.len() - 1 {
        assert!(Instant::now() < deadline, "the followers never waited");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let cancelled_at = Instant::now();
    leader.abort();
    let mut took_over = 0;
    for follower in followers {
        let (out, report) = follower.await.unwrap();
        assert_eq!(out.unwrap(), 4);
        if report.flight() == Some(FlightOutcome::ClusterTookOver) {
            took_over += 1;
        }
    }
    assert_eq!(took_over, 1, "exactly one instance took over");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the hung run and one more");
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(10),
        "the takeover did not wait for the 30 s lease: {:?}",
        cancelled_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_leader_is_replaced_after_its_lease() {
    let (provider, a, _b) = two_instances("cf5");
    // A leader elsewhere that claimed and then went silent (a crashed process).
    let key: CallKey = a
        .key(concat!(module_path!(), "::refresh"))
        .part("ACME")
        .finish();
    let claim = provider
        .flight_claim(&key, OwnerToken::new(), Duration::from_millis(600))
        .await
        .unwrap();
    assert_eq!(claim, coord_core::provider::FlightClaim::Claimed);
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let (out, report) = observe(refresh(&a, "ACME", runs.clone())).await;
    assert_eq!(out.unwrap(), 400);
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterTookOver));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "took over before the silent leader's lease ended: {waited:?}"
    );
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}

#[single_flight(key_from = "symbol", scope = "cluster", coordinator = coord)]
async fn counted(
    coord: &Coordinator,
    symbol: &str,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(symbol.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backend_down_fail_open_keeps_the_process_flight_and_fail_closed_refuses() {
    let provider = Arc::new(InstrumentedProvider::default());
    provider.fail_flights.store(true, Ordering::SeqCst);
    let build = |policy| {
        Coordinator::builder()
            .namespace("cf6")
            .provider(provider.clone())
            .on_backend_error(policy)
            .build()
            .unwrap()
    };
    let open = build(OnBackendError::FailOpen);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (coord, runs) = (open.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            observe(counted(&coord, "ACME", runs)).await
        }));
    }
    let mut failed_open = 0;
    for task in tasks {
        let (out, report) = task.await.unwrap();
        assert_eq!(out.unwrap(), 4);
        if report.flight() == Some(FlightOutcome::FailedOpen) {
            failed_open += 1;
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "fail_open still coalesces within the process"
    );
    assert_eq!(failed_open, 1, "only the local leader reached the backend");
    assert_eq!(open.metrics().fail_open_runs(), 1);

    let closed = build(OnBackendError::FailClosed);
    let out = counted(&closed, "ACME", runs.clone()).await;
    assert!(
        matches!(out, Err(CoordError::Backend(_))),
        "fail_closed refuses: {out:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the refused call did not run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_handle_api_shares_one_run_and_can_share_errors() {
    let (_provider, a, b) = two_instances("cf7");
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |coord: Coordinator, runs: Arc<AtomicUsize>| async move {
        let key = coord.key("handle.refresh").part("ACME").finish();
        coord
            .single_flight(key)
            .cluster()
            .lease(Duration::from_secs(5))
            .run(|| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<u64, CoordError>(7)
            })
            .await
    };
    let first = tokio::spawn(call(a.clone(), runs.clone()));
    let second = tokio::spawn(call(b.clone(), runs.clone()));
    assert_eq!(first.await.unwrap().unwrap(), 7);
    assert_eq!(second.await.unwrap().unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let failing = |coord: Coordinator| async move {
        let key = coord.key("handle.failing").part("ACME").finish();
        coord
            .single_flight(key)
            .cluster()
            .run_sharing_errors(|| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Err::<u64, QuoteError>(QuoteError::Upstream("down".to_owned()))
            })
            .await
    };
    let first = tokio::spawn(failing(a.clone()));
    let second = tokio::spawn(failing(b.clone()));
    let expected = Err(QuoteError::Upstream("down".to_owned()));
    assert_eq!(first.await.unwrap(), expected);
    assert_eq!(second.await.unwrap(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_reply_was_lost_is_given_up_so_others_do_not_wait_a_lease() {
    let provider = Arc::new(InstrumentedProvider::default());
    provider
        .lose_flight_claim_replies
        .store(true, Ordering::SeqCst);
    let open = Coordinator::builder()
        .namespace("cf8")
        .provider(provider.clone())
        .on_backend_error(OnBackendError::FailOpen)
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (out, report) = observe(counted(&open, "ACME", runs.clone())).await;
    assert_eq!(out.unwrap(), 4);
    assert_eq!(report.flight(), Some(FlightOutcome::FailedOpen));
    // The claim landed (its 10 s lease would hold the other instances up); it is given up in
    // the background, owner-checked.
    let key: CallKey = open
        .key(concat!(module_path!(), "::counted"))
        .part("ACME")
        .finish();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let claim = provider
            .inner
            .flight_claim(&key, OwnerToken::new(), Duration::from_secs(1))
            .await
            .unwrap();
        if claim == coord_core::provider::FlightClaim::Claimed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the landed claim was not given up: {claim:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_whose_lease_lapsed_keeps_its_outcome_and_its_late_hand_over_is_refused() {
    let provider = Arc::new(InstrumentedProvider::default());
    provider.fail_flight_renewals.store(true, Ordering::SeqCst);
    let make = || {
        Coordinator::builder()
            .namespace("cf9")
            .provider(provider.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (make(), make());
    let runs = Arc::new(AtomicUsize::new(0));
    let call = |coord: Coordinator, runs: Arc<AtomicUsize>, who: &'static str, ms: u64| async move {
        let key = coord.key("lapse.refresh").part("ACME").finish();
        observe(
            coord
                .single_flight(key)
                .cluster()
                .lease(Duration::from_millis(300))
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Ok::<String, CoordError>(who.to_owned())
                }),
        )
        .await
    };
    // The leader's body outlives its lease, and its renewals fail.
    let leader = tokio::spawn(call(a.clone(), runs.clone(), "first", 1500));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (follower, report) = call(b.clone(), runs.clone(), "second", 100).await;
    assert_eq!(
        report.flight(),
        Some(FlightOutcome::ClusterTookOver),
        "the follower took over once the lease lapsed"
    );
    assert_eq!(follower.unwrap(), "second");
    let (late, report) = leader.await.unwrap();
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterLed));
    assert_eq!(
        late.unwrap(),
        "first",
        "the late leader's callers get its own outcome"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the flight is an optimisation, not a promise"
    );
    // Its hand-over was refused: nothing of the late leader is kept for anyone.
    assert_eq!(
        provider.inner.flight_entries(),
        1,
        "only the follower's hand-over"
    );
}

#[single_flight(key_from = "symbol", scope = "cluster", profile = "missing", coordinator = coord)]
#[coord_core::distributed_lock]
async fn with_unknown_profile(
    coord: &Coordinator,
    symbol: &str,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(symbol.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_profile_is_refused_before_the_flight_is_claimed() {
    let (provider, a, _b) = two_instances("cf10");
    let runs = Arc::new(AtomicUsize::new(0));
    let out = with_unknown_profile(&a, "ACME", runs.clone()).await;
    assert!(
        matches!(&out, Err(CoordError::UnknownProfile { profile, .. }) if profile == "missing"),
        "{out:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    assert_eq!(provider.flight_entries(), 0, "nothing was claimed");
}

/// Two coordinators over one instrumented provider (hand-over writes can be held back or
/// failed).
fn two_instrumented(ns: &str) -> (Arc<InstrumentedProvider>, Coordinator, Coordinator) {
    let provider = Arc::new(InstrumentedProvider::default());
    let make = || {
        Coordinator::builder()
            .namespace(ns)
            .provider(provider.clone())
            .build()
            .expect("valid test coordinator")
    };
    let (a, b) = (make(), make());
    (provider, a, b)
}

#[single_flight(key_from = "symbol", scope = "cluster", coordinator = coord)]
async fn announced(
    coord: &Coordinator,
    symbol: &str,
    started: Arc<Notify>,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    started.notify_one();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(symbol.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_leader_answers_before_the_hand_over_is_written() {
    let (provider, a, b) = two_instrumented("cf10");
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *provider.flight_finish_gate.lock().unwrap() = Some(gate.clone());
    let (started, runs) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    let leader = {
        let (a, started, runs) = (a.clone(), started.clone(), runs.clone());
        tokio::spawn(async move { observe(announced(&a, "ACME", started, runs)).await })
    };
    started.notified().await;
    let follower = {
        let (b, runs) = (b.clone(), runs.clone());
        tokio::spawn(
            async move { observe(announced(&b, "ACME", Arc::new(Notify::new()), runs)).await },
        )
    };
    // The hand-over write is held back: the leader's caller is answered all the same.
    let (out, report) = tokio::time::timeout(Duration::from_secs(10), leader)
        .await
        .expect("the leader answered while its hand-over write was still held back")
        .unwrap();
    assert_eq!(out.unwrap(), 4);
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterLed));
    // The hand-over write runs in the background, so it may not have been sent yet when the
    // leader's caller is answered: wait for it to be sent (and held at the gate).
    until_async(|| provider.flight_finishes.load(Ordering::SeqCst) == 1).await;
    // The follower on the other instance waits for the hand-over, not for a takeover.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !follower.is_finished(),
        "the follower answered before the hand-over"
    );
    gate.add_permits(1);
    let (out, report) = tokio::time::timeout(Duration::from_secs(10), follower)
        .await
        .expect("the follower got the hand-over once written")
        .unwrap();
    assert_eq!(out.unwrap(), 4);
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterJoined));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one run for both instances");
    assert_eq!(a.metrics().hand_overs_not_written(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_after_the_leader_answered_waits_for_its_write_and_runs_again() {
    let (provider, a, _b) = two_instrumented("cf11");
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *provider.flight_finish_gate.lock().unwrap() = Some(gate.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let first = announced(&a, "ACME", Arc::new(Notify::new()), runs.clone());
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .unwrap()
            .unwrap(),
        4
    );
    // The next call of this process must not join the flight that just answered.
    let second = {
        let (a, runs) = (a.clone(), runs.clone());
        tokio::spawn(
            async move { observe(announced(&a, "ACME", Arc::new(Notify::new()), runs)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        provider.flight_claims.load(Ordering::SeqCst),
        1,
        "claimed before the write"
    );
    gate.add_permits(2);
    let (out, report) = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.unwrap(), 4);
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterLed));
    assert_eq!(runs.load(Ordering::SeqCst), 2, "a later call runs again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_hand_over_is_counted_and_the_follower_takes_over() {
    let (provider, a, b) = two_instrumented("cf12");
    provider.fail_flight_finishes.store(true, Ordering::SeqCst);
    let (started, runs) = (Arc::new(Notify::new()), Arc::new(AtomicUsize::new(0)));
    let leader = {
        let (a, started, runs) = (a.clone(), started.clone(), runs.clone());
        tokio::spawn(async move { announced(&a, "ACME", started, runs).await })
    };
    started.notified().await;
    let (out, report) = tokio::time::timeout(
        Duration::from_secs(10),
        observe(announced(&b, "ACME", Arc::new(Notify::new()), runs.clone())),
    )
    .await
    .expect("the follower fell back well within the claim's lease");
    assert_eq!(
        leader.await.unwrap().unwrap(),
        4,
        "the leader's caller has its value"
    );
    assert_eq!(out.unwrap(), 4);
    assert_eq!(report.flight(), Some(FlightOutcome::ClusterTookOver));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the follower ran the body itself"
    );
    until_async(|| a.metrics().hand_overs_not_written() == 1).await;
}

async fn until_async(mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "condition not reached in 10 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
