//! Leases that hold: renewal while the body runs, loss detection, and what the body sees.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coord_core::report::LockOutcome;
use coord_core::{
    CoordError, Coordinator, distributed_lock, idempotent, is_held, lock_lost, observe,
};
use coord_tests::support::{InstrumentedProvider, lock_is_free};

async fn held_by_someone(c: &Coordinator, key: &coord_core::CallKey) -> bool {
    !lock_is_free(c, key).await
}

fn key(c: &Coordinator, op: &str, id: u64) -> coord_core::CallKey {
    c.key(op).part(&id).finish()
}

#[distributed_lock(key_from = "id", coordinator = c, name = "lease.long", lease = "300ms", renew = true)]
async fn long_job(
    c: &Coordinator,
    id: u64,
    reached_end: Arc<AtomicBool>,
) -> Result<(), CoordError> {
    tokio::time::sleep(Duration::from_millis(1200)).await;
    reached_end.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_the_lock_past_its_lease_and_stops_at_release() {
    let (provider, c) = InstrumentedProvider::coordinator("renew");
    let done = Arc::new(AtomicBool::new(false));
    let job = tokio::spawn({
        let (c, done) = (c.clone(), done.clone());
        async move { long_job(&c, 1, done).await }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        held_by_someone(&c, &key(&c, "lease.long", 1)).await,
        "three leases in, the renewed lock is still held"
    );
    job.await
        .unwrap()
        .expect("the renewed job finishes normally");
    assert!(done.load(Ordering::SeqCst));
    assert!(
        provider.renewals.load(Ordering::SeqCst) >= 3,
        "renewed every third of the lease"
    );
    assert_eq!(
        c.active_renewals(),
        0,
        "renewal stops the moment the lock is released"
    );
    let renewals = provider.renewals.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        provider.renewals.load(Ordering::SeqCst),
        renewals,
        "no renewal after release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_renewal_cancels_the_body_at_its_next_await() {
    let (provider, c) = InstrumentedProvider::coordinator("lost");
    provider.lose_renewals.store(true, Ordering::SeqCst);
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let (out, report) = observe(long_job(&c, 2, done.clone())).await;
    assert!(
        matches!(out, Err(CoordError::LockLost { .. })),
        "got {out:?}"
    );
    assert!(
        !done.load(Ordering::SeqCst),
        "the body was stopped before its end"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1100),
        "stopped at the first lost renewal"
    );
    assert_eq!(report.lock(), Some(LockOutcome::Lost));
    assert_eq!(c.active_renewals(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_is_a_loss_within_one_lease() {
    let (provider, c) = InstrumentedProvider::coordinator("unreachable");
    provider.fail_renewals.store(true, Ordering::SeqCst);
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let out = long_job(&c, 3, done.clone()).await;
    let after = started.elapsed();
    assert!(
        matches!(out, Err(CoordError::LockLost { .. })),
        "got {out:?}"
    );
    assert!(!done.load(Ordering::SeqCst));
    assert!(
        after >= Duration::from_millis(290)
            && after < Duration::from_millis(300) + Duration::from_millis(700),
        "declared lost by the local clock once a whole lease passed unconfirmed: {after:?}"
    );
}

#[distributed_lock(key_from = "id", coordinator = c, name = "lease.signal", lease = "300ms", renew = true, on_lost = "signal")]
async fn watching_job(c: &Coordinator, id: u64) -> Result<(bool, bool), CoordError> {
    let held_at_start = is_held();
    tokio::select! {
        _ = lock_lost() => {}
        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
    }
    Ok((held_at_start, is_held()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_lost_signal_the_body_sees_the_loss_and_decides() {
    let (provider, c) = InstrumentedProvider::coordinator("signal");
    provider.lose_renewals.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let (held_at_start, held_at_end) = watching_job(&c, 4).await.expect("the body returns itself");
    assert!(held_at_start, "held when the body starts");
    assert!(!held_at_end, "not held once lost");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "lock_lost() resolved on the loss"
    );
    assert!(!is_held(), "outside a lock nothing is held");
}

#[distributed_lock(key_from = "id", coordinator = c, name = "lease.many", lease = "30s", renew = "10s")]
async fn quick(c: &Coordinator, id: u64) -> Result<u64, CoordError> {
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_renewed_acquisitions_leave_no_renewal_state() {
    let (_, c) = InstrumentedProvider::coordinator("many");
    let tasks: Vec<_> = (0..4u64)
        .map(|shard| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..2_500u64 {
                    quick(&c, shard * 10_000 + i).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(c.active_renewals(), 0);
}

#[idempotent(key_from = "id", coordinator = c, name = "lease.marker", in_flight_lease = "300ms", renew = true)]
async fn slow_charge(c: &Coordinator, id: u64) -> Result<u64, CoordError> {
    tokio::time::sleep(Duration::from_millis(1000)).await;
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_in_flight_marker_outlives_its_lease() {
    let (_, c) = InstrumentedProvider::coordinator("marker");
    let first = tokio::spawn({
        let c = c.clone();
        async move { slow_charge(&c, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let duplicate = slow_charge(&c, 1).await;
    assert!(
        matches!(duplicate, Err(CoordError::InFlight { .. })),
        "past its 300 ms lease the renewed marker still blocks duplicates: {duplicate:?}"
    );
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(slow_charge(&c, 1).await.unwrap(), 1, "then replays");
    assert_eq!(c.active_renewals(), 0);
}
