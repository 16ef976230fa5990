//! Cluster single-flight ([`FlightStore`](coord_core::provider::FlightStore)): one leader per key,
//! resendable by it; renew, finish and abandon only by the leader; waiters woken by finish and
//! abandon without polling; a lapsed claim vacant at its lease's end and its late finish
//! refused; the hand-over kept for its time only; and the same through
//! `#[single_flight(scope = "cluster")]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{FlightClaim, FlightWait, OwnerToken, SentNotice};
use coord_core::{CoordError, Coordinator, single_flight};

use super::durations::LONG;
use super::requests::key;

/// A flight claim (cluster-scope single-flight): one leader at a time, resendable by it, and
/// renewed and given up only by it.
pub async fn flight_claim_is_exclusive_and_owner_scoped(c: Coordinator) {
    let store = c.flight_store();
    let k = key(&c, "flight-claim");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "a free key is claimed"
    );
    match store.flight_claim(&k, b, LONG).await.unwrap() {
        FlightClaim::Joined { leader, lease_left } => {
            assert_eq!(leader, a, "a second claimant learns who leads");
            assert!(
                lease_left > Duration::from_secs(20) && lease_left <= LONG,
                "the leader's lease left: {lease_left:?}"
            );
        }
        other => panic!("a held flight was claimed twice: {other:?}"),
    }
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "a claim resent by the leader answers Claimed again"
    );
    assert!(
        !store.flight_renew(&k, b, LONG).await.unwrap(),
        "renew is owner-scoped"
    );
    assert!(
        store.flight_renew(&k, a, LONG).await.unwrap(),
        "the leader renews"
    );
    assert!(
        !store.flight_abandon(&k, b).await.unwrap(),
        "abandon is owner-scoped"
    );
    assert!(
        store.flight_abandon(&k, a).await.unwrap(),
        "the leader gives it up"
    );
    assert!(
        !store.flight_renew(&k, a, LONG).await.unwrap(),
        "given up: nothing to renew"
    );
    assert_eq!(
        store.flight_claim(&k, b, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "an abandoned flight is free"
    );
}

/// The finish through `flight_finish_noting_sent` (the runtime's way): it hands over and is
/// fenced as `flight_finish` is, and its notice is told (or given up) no later than its answer,
/// so a leader waiting for it is never held past the reply.
pub async fn flight_finish_noting_sent_tells_no_later_than_the_answer(c: Coordinator) {
    let store = c.flight_store().clone();
    let k = key(&c, "flight-finish-sent");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    let (sent, mut told) = SentNotice::new();
    assert!(
        !store
            .flight_finish_noting_sent(&k, b, b"theirs", LONG, sent)
            .await
            .unwrap(),
        "only the leader hands over"
    );
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut told)
            .await
            .is_ok(),
        "a refused finish still ends the wait for its send"
    );
    let (sent, mut told) = SentNotice::new();
    assert!(
        store
            .flight_finish_noting_sent(&k, a, b"outcome", LONG, sent)
            .await
            .unwrap()
    );
    assert!(
        tokio::time::timeout(Duration::ZERO, &mut told)
            .await
            .is_ok(),
        "told no later than the answer"
    );
    assert_eq!(
        store.flight_wait(&k, a, LONG).await.unwrap(),
        FlightWait::Finished(b"outcome".to_vec()),
        "the hand-over is there for the followers"
    );
}

/// A finished flight wakes its waiters with the outcome (also one that starts waiting after
/// the finish), only the leader's finish is taken, a resent finish answers true again, and the
/// outcome is kept for the hand-over time only: the claim is gone at once.
pub async fn flight_finish_hands_over_and_is_fenced(c: Coordinator) {
    let store = c.flight_store().clone();
    let k = key(&c, "flight-finish");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let got = store.flight_wait(&k, a, LONG).await.unwrap();
            (got, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !store.flight_finish(&k, b, b"theirs", LONG).await.unwrap(),
        "only the leader hands over"
    );
    assert!(store.flight_finish(&k, a, b"outcome", LONG).await.unwrap());
    let (got, waited) = waiter.await.unwrap();
    assert_eq!(got, FlightWait::Finished(b"outcome".to_vec()));
    assert!(
        waited < Duration::from_secs(5),
        "woken by the finish: {waited:?}"
    );
    assert_eq!(
        store.flight_wait(&k, a, LONG).await.unwrap(),
        FlightWait::Finished(b"outcome".to_vec()),
        "a follower arriving after the finish still reads the hand-over"
    );
    assert!(
        store.flight_finish(&k, a, b"outcome", LONG).await.unwrap(),
        "a resent finish answers true"
    );
    assert_eq!(
        store.flight_claim(&k, b, LONG).await.unwrap(),
        FlightClaim::Claimed,
        "the claim is gone with the finish: a new call leads a new flight"
    );
    assert_eq!(
        store
            .flight_wait(&k, b, Duration::from_millis(100))
            .await
            .unwrap(),
        FlightWait::Expired,
        "the new flight's waiters do not see the old outcome"
    );

    // The hand-over lasts its time only.
    let k2 = key(&c, "flight-hand-over");
    assert_eq!(
        store.flight_claim(&k2, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    assert!(
        store
            .flight_finish(&k2, a, b"brief", Duration::from_millis(200))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        store.flight_wait(&k2, a, LONG).await.unwrap(),
        FlightWait::Vacant,
        "nothing is remembered after the hand-over time"
    );
}

/// An abandoned flight wakes its waiters at once (as vacant); a lapsed one is vacant at its
/// lease's end, and its leader's late finish is refused; a waiter of a live leader times out.
pub async fn flight_abandon_and_lapse_make_the_flight_vacant(c: Coordinator) {
    let store = c.flight_store().clone();
    let k = key(&c, "flight-abandon");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        store.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    assert_eq!(
        store
            .flight_wait(&k, a, Duration::from_millis(200))
            .await
            .unwrap(),
        FlightWait::Expired,
        "a live leader's waiter times out"
    );
    assert_eq!(
        store.flight_wait(&k, b, LONG).await.unwrap(),
        FlightWait::Vacant,
        "waiting on a generation that does not lead is vacant at once"
    );
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            (
                store.flight_wait(&k, a, LONG).await.unwrap(),
                started.elapsed(),
            )
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(store.flight_abandon(&k, a).await.unwrap());
    let (got, waited) = waiter.await.unwrap();
    assert_eq!(got, FlightWait::Vacant);
    assert!(
        waited < Duration::from_secs(5),
        "woken by the abandon: {waited:?}"
    );

    let k2 = key(&c, "flight-lapse");
    let short = Duration::from_millis(400);
    assert_eq!(
        store.flight_claim(&k2, a, short).await.unwrap(),
        FlightClaim::Claimed
    );
    let started = Instant::now();
    assert_eq!(
        store.flight_wait(&k2, a, LONG).await.unwrap(),
        FlightWait::Vacant
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
        "a lapsed leader is noticed at its lease's end: {waited:?}"
    );
    assert!(
        !store.flight_finish(&k2, a, b"late", LONG).await.unwrap(),
        "a finish after the lease lapsed is refused"
    );
    assert_eq!(
        store.flight_claim(&k2, b, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
}

#[single_flight(key_from = "part", scope = "cluster", lease = "5s", coordinator = c)]
async fn cluster_refresh(
    c: &Coordinator,
    part: u32,
    runs: Arc<AtomicUsize>,
) -> Result<u32, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(part * 2)
}

/// `#[single_flight(scope = "cluster")]` over the provider: concurrent calls share one run,
/// a later call runs again, and a flight whose leader went silent is taken over after its
/// lease.
pub async fn attribute_cluster_single_flight_runs_once_and_takes_over(c: Coordinator) {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for _ in 0..16 {
        let (c, runs) = (c.clone(), runs.clone());
        calls.push(tokio::spawn(
            async move { cluster_refresh(&c, 21, runs).await },
        ));
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), 42);
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "concurrent calls share one run"
    );
    assert_eq!(cluster_refresh(&c, 21, runs.clone()).await.unwrap(), 42);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "nothing is remembered after the flight"
    );

    // A leader elsewhere that claimed and went silent.
    let k = c
        .key(concat!(module_path!(), "::cluster_refresh"))
        .part(&7u32)
        .finish();
    let silent = OwnerToken::new();
    c.flight_store()
        .flight_claim(&k, silent, Duration::from_millis(500))
        .await
        .unwrap();
    let started = Instant::now();
    assert_eq!(cluster_refresh(&c, 7, runs.clone()).await.unwrap(), 14);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(350) && waited < Duration::from_secs(10),
        "taken over after the silent leader's lease: {waited:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}
