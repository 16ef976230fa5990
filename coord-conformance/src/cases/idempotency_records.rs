//! The life of an idempotency record: claimed, in flight, completed, abandoned or lapsed;
//! completion, abandonment and renewal by the owner only; fingerprints kept; waiters woken by
//! the completion; a claim resent by its owner.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, Fingerprint, OwnerToken, RenewOutcome,
};
use coord_core::{Coordinator, LossCause};

use super::durations::{LONG, PAST_SHORT, SHORT};
use super::records::complete_stored;
use super::requests::{claim_req, complete_req, key};

/// Claim creates an in-flight marker or returns the record; the fingerprint is kept in every
/// state; only the owner completes.
pub async fn idempotency_claim_complete_replay(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "claim");
    let fp = Some(Fingerprint([9; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let req = |owner| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: LONG,
        fingerprint: fp,
        keep_abandoned_for: None,
        transactional: false,
    };
    assert_eq!(s.claim(req(a)).await.unwrap(), ClaimOutcome::Claimed);
    match s.claim(req(b)).await.unwrap() {
        ClaimOutcome::InFlight {
            fingerprint,
            remaining,
        } => {
            assert_eq!(fingerprint, fp, "the marker keeps the fingerprint");
            assert!(remaining > Duration::ZERO && remaining <= LONG);
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    let payload: Arc<[u8]> = Arc::from(&b"{\"ok\":1}"[..]);
    assert!(
        !complete_stored(&**s, &k, b, payload.clone(), LONG)
            .await
            .unwrap()
    );
    assert!(
        complete_stored(&**s, &k, a, payload.clone(), LONG)
            .await
            .unwrap()
    );
    match s.claim(req(b)).await.unwrap() {
        ClaimOutcome::Completed {
            payload: stored,
            fingerprint,
            ..
        } => {
            assert_eq!(&*stored, &*payload);
            assert_eq!(fingerprint, fp, "completion keeps the fingerprint");
        }
        other => panic!("expected completed, got {other:?}"),
    }
    assert!(
        !s.abandon(&k, a).await.unwrap(),
        "a completed record is not abandoned"
    );
}

/// Abandon removes only the owner's marker; a lapsed marker can be claimed again and its old
/// owner can no longer complete.
pub async fn idempotency_abandon_and_lapse(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "abandon");
    let (a, b, d) = (OwnerToken::new(), OwnerToken::new(), OwnerToken::new());
    let req = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: None,
        keep_abandoned_for: None,
        transactional: false,
    };
    assert_eq!(s.claim(req(a, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    assert!(!s.abandon(&k, b).await.unwrap());
    assert!(s.abandon(&k, a).await.unwrap());
    assert_eq!(
        s.claim(req(b, Duration::from_millis(200))).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(s.claim(req(d, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    let late: Arc<[u8]> = Arc::from(&b"1"[..]);
    assert!(
        !complete_stored(&**s, &k, b, late, LONG).await.unwrap(),
        "a lapsed owner cannot complete"
    );
    assert!(s.abandon(&k, d).await.unwrap());
}

/// With `keep_abandoned_for`, a marker that lapses without completion stays as an abandoned
/// record: claims report it (with its fingerprint), its late owner can still complete, and
/// `purge` clears it.
pub async fn idempotency_abandoned_marker_is_kept_on_request(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "kept");
    let fp = Some(Fingerprint([4; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let req = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: fp,
        keep_abandoned_for: Some(LONG),
        transactional: false,
    };
    assert_eq!(
        s.claim(req(a, Duration::from_millis(200))).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(
        s.claim(req(b, LONG)).await.unwrap(),
        ClaimOutcome::Abandoned { fingerprint: fp },
        "the lapsed marker is reported, not claimed over"
    );
    assert!(
        !complete_stored(&**s, &k, b, Arc::from(&b"x"[..]), LONG)
            .await
            .unwrap()
    );
    assert!(
        complete_stored(&**s, &k, a, Arc::from(&b"late"[..]), LONG)
            .await
            .unwrap(),
        "the late owner resolves the unknown by completing"
    );
    assert!(matches!(
        s.claim(req(b, LONG)).await.unwrap(),
        ClaimOutcome::Completed { .. }
    ));
    assert!(s.purge(&k).await.unwrap());
    assert!(!s.purge(&k).await.unwrap(), "nothing left to purge");
    assert_eq!(s.claim(req(b, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    assert!(s.abandon(&k, b).await.unwrap());
}

/// `wait_settled` returns at once without a marker, and is woken by completion.
pub async fn idempotency_wait_settled_wakes_on_completion(c: Coordinator) {
    let s = c.idempotency_store().clone();
    let k = key(&c, "settle");
    let started = Instant::now();
    s.wait_settled(&k, Duration::from_secs(10)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no marker: no wait"
    );

    let a = OwnerToken::new();
    s.claim(ClaimRequest {
        key: &k,
        owner: a,
        in_flight_lease: LONG,
        fingerprint: None,
        keep_abandoned_for: None,
        transactional: false,
    })
    .await
    .unwrap();
    let waiter = tokio::spawn({
        let (s, k) = (s.clone(), k.clone());
        async move {
            s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
            Instant::now()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let completed_at = Instant::now();
    complete_stored(&*s, &k, a, Arc::from(&b"1"[..]), LONG)
        .await
        .unwrap();
    let woke = waiter.await.unwrap();
    let delay = woke.saturating_duration_since(completed_at);
    assert!(
        delay < Duration::from_secs(2),
        "woken by completion, took {delay:?}"
    );
}

/// A claim resent by the owner of the live marker answers `Claimed`; everyone else still sees
/// the one marker in flight, which the owner can still abandon.
pub async fn idempotency_claim_resent_by_its_owner_is_claimed(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "claim-resend");
    let fp = Some(Fingerprint([6; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed,
        "the owner's resent claim"
    );
    match s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap() {
        ClaimOutcome::InFlight {
            fingerprint,
            remaining,
        } => {
            assert_eq!(fingerprint, fp);
            assert!(remaining > Duration::ZERO && remaining <= LONG);
        }
        other => panic!("another owner must still see the marker in flight, got {other:?}"),
    }
    assert!(s.abandon(&k, a).await.unwrap(), "still a's marker");
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(s.abandon(&k, b).await.unwrap());
}

/// A lost in-flight marker says why: `TakenByOther` when another owner's marker is there,
/// `Expired` when ours lapsed, was completed, or there is nothing.
pub async fn idempotency_renew_marker_reports_why_the_marker_was_lost(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "renew-marker-cause");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "nothing claimed"
    );
    s.claim(claim_req(&k, a, SHORT, None, None)).await.unwrap();
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Renewed
    );
    assert_eq!(
        s.renew_marker(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        matches!(
            s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "the renewed marker outlives its first lease"
    );
    assert_eq!(
        s.renew_marker(&k, a, SHORT).await.unwrap(),
        RenewOutcome::Renewed
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "the marker lapsed and nobody claimed"
    );
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    let payload: Arc<[u8]> = Arc::from(&b"done"[..]);
    assert_eq!(
        s.complete(complete_req(&k, b, &payload, None))
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        s.renew_marker(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "a completed marker is no longer in flight"
    );
}

/// A transactional marker (`ClaimRequest::transactional`) that lapses is absent even under
/// `keep_abandoned_for`: the next claim is `Claimed`, never `Abandoned`, and the lapsed owner's
/// late completion on the store's own connection is `Superseded`. A store that does not take
/// transactional claims (`transactional_claims` is false: the runtime never sends it one)
/// passes without being asked.
pub async fn idempotency_transactional_marker_lapses_to_absent(c: Coordinator) {
    let s = c.idempotency_store();
    if !s.transactional_claims() {
        return;
    }
    let k = key(&c, "transactional");
    let fp = Some(Fingerprint([6; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let req = |owner, lease| ClaimRequest {
        transactional: true,
        ..claim_req(&k, owner, lease, fp, Some(LONG))
    };
    assert_eq!(s.claim(req(a, SHORT)).await.unwrap(), ClaimOutcome::Claimed);
    assert!(
        matches!(
            s.claim(req(b, LONG)).await.unwrap(),
            ClaimOutcome::InFlight { fingerprint, .. } if fingerprint == fp
        ),
        "a live transactional marker is in flight like any other"
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        s.claim(req(b, LONG)).await.unwrap(),
        ClaimOutcome::Claimed,
        "a lapsed transactional marker is absent, not abandoned, even when kept"
    );
    assert!(
        !complete_stored(&**s, &k, a, Arc::from(&b"late"[..]), LONG)
            .await
            .unwrap(),
        "the lapsed owner's late completion does not replace the new claim"
    );
    assert!(s.abandon(&k, b).await.unwrap());
}

/// `end_marker_lease` ends only its owner's marker, as if it lapsed now: a kept marker is the
/// abandoned record at once (claims report it with its fingerprint, a waiter is woken, its
/// owner can still complete it, and ending it again changes nothing); a marker claimed
/// without a keep period is gone, and the key free. A stranger cannot end someone else's
/// marker, and a completed record is never touched.
pub async fn idempotency_end_marker_lease_keeps_it_as_abandoned(c: Coordinator) {
    let s = c.idempotency_store().clone();
    let k = key(&c, "end-lease");
    let fp = Some(Fingerprint([8; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert!(
        !s.end_marker_lease(&k, a).await.unwrap(),
        "nothing claimed: nothing to end"
    );
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, Some(LONG)))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(
        !s.end_marker_lease(&k, b).await.unwrap(),
        "a stranger cannot end another owner's marker"
    );
    assert!(
        matches!(
            s.claim(claim_req(&k, b, LONG, fp, Some(LONG)))
                .await
                .unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "the stranger's attempt left the marker in flight"
    );
    let waiter = tokio::spawn({
        let (s, k) = (s.clone(), k.clone());
        async move {
            s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
            Instant::now()
        }
    });
    // Give the waiter time to start waiting; if it has not yet, it returns at once anyway.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ended_at = Instant::now();
    assert!(
        s.end_marker_lease(&k, a).await.unwrap(),
        "the owner ends it"
    );
    let woke = waiter.await.unwrap();
    let delay = woke.saturating_duration_since(ended_at);
    assert!(
        delay < Duration::from_secs(2),
        "a waiter is woken when the lease is ended, took {delay:?}"
    );
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, Some(LONG)))
            .await
            .unwrap(),
        ClaimOutcome::Abandoned { fingerprint: fp },
        "the ended marker is the abandoned record at once"
    );
    assert!(
        s.end_marker_lease(&k, a).await.unwrap(),
        "ending it again (a resend) answers as the first time"
    );
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, Some(LONG)))
            .await
            .unwrap(),
        ClaimOutcome::Abandoned { fingerprint: fp },
        "and changes nothing"
    );
    assert!(
        complete_stored(&*s, &k, a, Arc::from(&b"late"[..]), LONG)
            .await
            .unwrap(),
        "the owner of the abandoned record can still resolve it by completing"
    );
    assert!(
        !s.end_marker_lease(&k, a).await.unwrap(),
        "a completed record is not a marker to end, not even for its owner"
    );
    assert!(
        !s.end_marker_lease(&k, b).await.unwrap(),
        "nor for a stranger"
    );
    match s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap() {
        ClaimOutcome::Completed { payload, .. } => assert_eq!(&*payload, b"late"),
        other => panic!("the completed record must be untouched, got {other:?}"),
    }

    // Without a keep period the ended marker lapses into nothing.
    let k = key(&c, "end-lease-unkept");
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(s.end_marker_lease(&k, a).await.unwrap());
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed,
        "a marker claimed without a keep period is gone once its lease is ended"
    );
    assert!(
        !s.end_marker_lease(&k, a).await.unwrap(),
        "the old owner cannot end the new owner's marker"
    );
    assert!(
        s.abandon(&k, b).await.unwrap(),
        "still b's marker, in flight"
    );
}
