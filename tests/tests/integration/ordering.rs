//! The fixed nesting: idempotency outermost, then single-flight, then the lock, whatever order
//! the attributes are written in.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::{LockRequest, OwnerToken};
use coord_core::report::FlightOutcome;
use coord_core::{CoordError, Coordinator, distributed_lock, idempotent, observe, single_flight};
use coord_tests::support::InstrumentedProvider;

// Written innermost-first: the lock on top, idempotency at the bottom.
#[distributed_lock(key_from = "id", coordinator = c, name = "tests.order.a", wait = "0s")]
#[single_flight]
#[idempotent(key_from = "id")]
async fn written_backwards(
    c: &Coordinator,
    id: u64,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    Ok(id)
}

// Written in canonical order, with a foreign attribute between ours.
#[idempotent(key_from = "id", coordinator = c, name = "tests.order.b")]
#[allow(clippy::unused_async)]
#[single_flight(key_from = "id")]
#[distributed_lock(wait = "0s")]
async fn written_forwards(
    c: &Coordinator,
    id: u64,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(150)).await;
    Ok(id)
}

fn key(c: &Coordinator, op: &str, id: u64) -> coord_core::CallKey {
    c.key(op).part(&id).finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_touches_no_lock_in_either_order() {
    for (op, backwards) in [("tests.order.a", true), ("tests.order.b", false)] {
        let (provider, c) = InstrumentedProvider::coordinator("order");
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |c: Coordinator, runs| async move {
            if backwards {
                written_backwards(&c, 1, runs).await
            } else {
                written_forwards(&c, 1, runs).await
            }
        };
        assert_eq!(call(c.clone(), runs.clone()).await.unwrap(), 1);
        let acquires = provider.acquires.load(Ordering::SeqCst);
        assert_eq!(acquires, 1);

        // Someone else now holds the lock: a replay still answers, because idempotency is
        // outside the lock and never reaches it.
        let stranger = OwnerToken::new();
        let k = key(&c, op, 1);
        c.lock_provider()
            .acquire(LockRequest {
                key: &k,
                owner: stranger,
                lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                fenced: false,
            })
            .await
            .unwrap()
            .unwrap();
        let (replayed, report) = observe(call(c.clone(), runs.clone())).await;
        assert_eq!(replayed.unwrap(), 1, "{op}: the replay answered");
        assert!(report.replayed(), "{op}");
        assert_eq!(report.lock(), None, "{op}: a replay never reaches the lock");
        assert_eq!(
            report.flight(),
            None,
            "{op}: a replay never reaches single-flight"
        );
        assert_eq!(
            provider.acquires.load(Ordering::SeqCst),
            acquires + 1,
            "{op}: only the stranger acquired"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[single_flight(key_from = "id")]
#[distributed_lock(key_from = "id", coordinator = c, name = "tests.order.c", wait = "0s")]
async fn coalesced_lock(
    c: &Coordinator,
    id: u64,
    runs: Arc<AtomicUsize>,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_share_the_leaders_run_without_touching_the_lock() {
    let (provider, c) = InstrumentedProvider::coordinator("coalesce");
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn({
                let (c, runs) = (c.clone(), runs.clone());
                async move { observe(coalesced_lock(&c, 2, runs)).await }
            })
        })
        .collect();
    let mut joined = 0;
    for call in calls {
        let (out, report) = call.await.unwrap();
        assert_eq!(
            out.unwrap(),
            2,
            "with wait = 0s a second lock attempt would have failed"
        );
        if report.flight() == Some(FlightOutcome::Joined) {
            joined += 1;
            assert_eq!(report.lock(), None, "a follower never reaches the lock");
        }
    }
    assert_eq!(joined, 7);
    assert_eq!(
        provider.acquires.load(Ordering::SeqCst),
        1,
        "one lock acquisition for 8 callers"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
