//! Outcome integrity: a completion answers `Stored`, `StoredWithoutMarker` or `Superseded`
//! exactly when the contract says, stores the outcome only when it may, and a resend changes
//! nothing.

use std::sync::Arc;

use coord_core::Coordinator;
use coord_core::provider::{ClaimOutcome, CompleteOutcome, Fingerprint, OwnerToken};

use super::durations::{LONG, PAST_SHORT, SHORT};
use super::records::completed_record;
use super::requests::{claim_req, complete_req, key};

/// Asserts a `Superseded` answer naming `winner` (when the backend records the owner).
fn assert_superseded(outcome: CompleteOutcome, winner: OwnerToken, completed: bool, why: &str) {
    match outcome {
        CompleteOutcome::Superseded {
            other,
            completed: found,
        } => {
            assert!(
                other.is_none() || other == Some(winner),
                "{why}: superseded by {other:?}, but {winner} holds the key"
            );
            assert_eq!(found, completed, "{why}: whether the other owner completed");
        }
        other => panic!("{why}: expected Superseded, got {other:?}"),
    }
}

/// The owner's completion of its live marker is `Stored` and keeps the claim's fingerprint
/// (not the request's); resending it answers `Stored` again and changes nothing.
pub async fn idempotency_completion_by_the_owner_is_stored_and_resendable(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-own");
    let claimed_fp = Some(Fingerprint([1; 16]));
    let request_fp = Some(Fingerprint([2; 16]));
    let a = OwnerToken::new();
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, claimed_fp, None))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let payload: Arc<[u8]> = Arc::from(&b"receipt-1"[..]);
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, request_fp))
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, request_fp))
            .await
            .unwrap(),
        CompleteOutcome::Stored,
        "a resent completion by the same owner is Stored again"
    );
    let (stored, fingerprint) = completed_record(&c, &k, "after completion").await;
    assert_eq!(&*stored, &*payload);
    assert_eq!(
        fingerprint, claimed_fp,
        "completing a marker keeps the fingerprint given at claim time"
    );
}

/// A marker that lapsed (not kept) and that nobody claimed since: the late completion creates
/// the record with the request's fingerprint, so a duplicate replays it; a resend of that
/// completion answers `Stored`.
pub async fn idempotency_completion_after_the_marker_lapsed_is_stored_without_it(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-lapsed");
    let fp = Some(Fingerprint([3; 16]));
    let a = OwnerToken::new();
    assert_eq!(
        s.claim(claim_req(&k, a, SHORT, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(PAST_SHORT).await;
    let payload: Arc<[u8]> = Arc::from(&b"late but alone"[..]);
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, fp)).await.unwrap(),
        CompleteOutcome::StoredWithoutMarker,
        "no record is left and nobody claimed: the outcome is stored all the same"
    );
    let (stored, fingerprint) = completed_record(&c, &k, "after a late completion").await;
    assert_eq!(&*stored, &*payload, "a duplicate replays the late outcome");
    assert_eq!(
        fingerprint, fp,
        "the created record carries the request's fingerprint"
    );
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, fp)).await.unwrap(),
        CompleteOutcome::Stored,
        "resending the completion that created the record"
    );
}

/// Another caller claimed after our marker lapsed: our late completion changes nothing and
/// says so, before and after that caller completes.
pub async fn idempotency_late_completion_after_another_claim_is_superseded(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-superseded");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.claim(claim_req(&k, a, SHORT, None, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap(),
        ClaimOutcome::Claimed,
        "the lapsed marker frees the key"
    );
    let late: Arc<[u8]> = Arc::from(&b"from a"[..]);
    let outcome = s.complete(complete_req(&k, a, &late, None)).await.unwrap();
    assert_superseded(outcome, b, false, "late completion while b runs");
    assert!(
        matches!(
            s.claim(claim_req(&k, OwnerToken::new(), LONG, None, None))
                .await
                .unwrap(),
            ClaimOutcome::InFlight { .. }
        ),
        "the superseded completion must leave b's marker in place"
    );
    let winner: Arc<[u8]> = Arc::from(&b"from b"[..]);
    assert_eq!(
        s.complete(complete_req(&k, b, &winner, None))
            .await
            .unwrap(),
        CompleteOutcome::Stored
    );
    let outcome = s.complete(complete_req(&k, a, &late, None)).await.unwrap();
    assert_superseded(outcome, b, true, "late completion after b completed");
    let (stored, _) = completed_record(&c, &k, "after both completions").await;
    assert_eq!(&*stored, &*winner, "b's outcome stays");
}

/// A purged marker is a missing record: its owner's completion creates the record.
pub async fn idempotency_completion_after_purge_is_stored_without_marker(c: Coordinator) {
    let s = c.idempotency_store();
    let k = key(&c, "complete-purged");
    let fp = Some(Fingerprint([5; 16]));
    let a = OwnerToken::new();
    assert_eq!(
        s.claim(claim_req(&k, a, LONG, fp, None)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(s.purge(&k).await.unwrap(), "the marker was there");
    let payload: Arc<[u8]> = Arc::from(&b"after purge"[..]);
    assert_eq!(
        s.complete(complete_req(&k, a, &payload, fp)).await.unwrap(),
        CompleteOutcome::StoredWithoutMarker
    );
    let (stored, fingerprint) = completed_record(&c, &k, "after purge and completion").await;
    assert_eq!(&*stored, &*payload);
    assert_eq!(fingerprint, fp);
}
