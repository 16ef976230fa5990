//! The record store's tests: claims, completions, replays, abandonment, expiry, sweeping and
//! waiting.

use super::*;
use coord_contract::RecordStatus;

const LEASE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

/// The owner numbered `n`: tests name owners by small numbers.
fn owner(n: u128) -> OwnerToken {
    OwnerToken::from_u128(n)
}

fn done(payload: &'static [u8]) -> Arc<[u8]> {
    Arc::from(payload)
}

#[tokio::test]
async fn claim_complete_replay() {
    let store = RecordStore::new();
    assert_eq!(
        store.claim("k", owner(1), LEASE, Some(Fingerprint([7; 16])), None),
        ClaimOutcome::Claimed
    );
    match store.claim("k", owner(2), LEASE, None, None) {
        ClaimOutcome::InFlight { fingerprint, .. } => {
            assert_eq!(fingerprint, Some(Fingerprint([7; 16])))
        }
        other => panic!("expected the marker in flight, got {other:?}"),
    }
    assert_eq!(
        store.complete("k", owner(2), done(b"x"), DAY, None),
        CompleteOutcome::Superseded {
            other: Some(owner(1)),
            completed: false
        },
        "only the owner completes"
    );
    assert_eq!(
        store.complete("k", owner(1), done(b"ok"), DAY, Some(Fingerprint([1; 16]))),
        CompleteOutcome::Stored
    );
    assert_eq!(
        store.complete("k", owner(1), done(b"resent"), DAY, None),
        CompleteOutcome::Stored,
        "a resent completion is stored, once"
    );
    match store.claim("k", owner(3), LEASE, None, None) {
        ClaimOutcome::Completed {
            payload,
            fingerprint,
            ..
        } => {
            assert_eq!(&*payload, b"ok", "the first completion stays");
            assert_eq!(
                fingerprint,
                Some(Fingerprint([7; 16])),
                "the claim's fingerprint survives completion"
            );
        }
        other => panic!("expected a completed record, got {other:?}"),
    }
    assert_eq!(
        store.complete("k", owner(2), done(b"x"), DAY, None),
        CompleteOutcome::Superseded {
            other: Some(owner(1)),
            completed: true
        }
    );
}

#[tokio::test]
async fn abandon_frees_the_key_for_the_owner_only() {
    let store = RecordStore::new();
    store.claim("k", owner(1), LEASE, None, None);
    assert!(!store.abandon("k", owner(2)));
    assert!(store.abandon("k", owner(1)));
    assert!(!store.abandon("k", owner(1)));
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Claimed
    );
}

#[tokio::test(start_paused = true)]
async fn a_resent_claim_is_claimed_and_refreshes_the_lease() {
    let store = RecordStore::new();
    store.claim(
        "k",
        owner(1),
        Duration::from_secs(10),
        Some(Fingerprint([5; 16])),
        None,
    );
    tokio::time::advance(Duration::from_secs(8)).await;
    assert_eq!(
        store.claim("k", owner(1), Duration::from_secs(10), None, None),
        ClaimOutcome::Claimed
    );
    tokio::time::advance(Duration::from_secs(8)).await;
    match store.claim("k", owner(2), LEASE, None, None) {
        ClaimOutcome::InFlight {
            fingerprint,
            remaining,
        } => {
            assert_eq!(
                fingerprint,
                Some(Fingerprint([5; 16])),
                "the first fingerprint stays"
            );
            assert_eq!(
                remaining,
                Duration::from_secs(2),
                "lease runs from the resend"
            );
        }
        other => panic!("expected the refreshed marker, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_marker_is_claimed_over_and_its_late_owner_is_superseded() {
    let store = RecordStore::new();
    store.claim("k", owner(1), Duration::from_secs(1), None, None);
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert_eq!(
        store.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::Expired)
    );
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(
        store.complete("k", owner(1), done(b"late"), DAY, None),
        CompleteOutcome::Superseded {
            other: Some(owner(2)),
            completed: false
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_lapsed_marker_nobody_claimed_is_completed_with_the_given_fingerprint() {
    let store = RecordStore::new();
    store.claim(
        "k",
        owner(1),
        Duration::from_secs(1),
        Some(Fingerprint([1; 16])),
        None,
    );
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert_eq!(
        store.complete(
            "k",
            owner(1),
            done(b"late"),
            DAY,
            Some(Fingerprint([2; 16]))
        ),
        CompleteOutcome::StoredWithoutMarker
    );
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Completed {
            payload: done(b"late"),
            fingerprint: Some(Fingerprint([2; 16])),
            age: Some(Duration::ZERO),
        }
    );
    tokio::time::advance(Duration::from_millis(250)).await;
    assert!(
        matches!(
            store.claim("k", owner(2), LEASE, None, None),
            ClaimOutcome::Completed { age, .. } if age == Some(Duration::from_millis(250))
        ),
        "the age counts from the completion"
    );
    assert_eq!(
        store.complete(
            "k",
            owner(1),
            done(b"late"),
            DAY,
            Some(Fingerprint([2; 16]))
        ),
        CompleteOutcome::Stored,
        "the owner's resend after creating the record"
    );
    assert_eq!(
        store.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::Expired)
    );
}

#[tokio::test(start_paused = true)]
async fn a_kept_abandoned_marker_blocks_claims_until_purged() {
    let store = RecordStore::new();
    let keep = Some(DAY);
    store.claim(
        "k",
        owner(1),
        Duration::from_secs(1),
        Some(Fingerprint([3; 16])),
        keep,
    );
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, keep),
        ClaimOutcome::Abandoned {
            fingerprint: Some(Fingerprint([3; 16]))
        }
    );
    assert_eq!(
        store.claim("k", owner(1), LEASE, None, keep),
        ClaimOutcome::Abandoned {
            fingerprint: Some(Fingerprint([3; 16]))
        },
        "a lapsed marker is not revived by its owner's claim"
    );
    assert_eq!(
        store.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::Expired)
    );
    assert_eq!(
        store.renew("k", owner(2), LEASE),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(
        store.complete("k", owner(1), done(b"late"), DAY, None),
        CompleteOutcome::Stored,
        "a late owner still records"
    );
    assert!(matches!(
        store.claim("k", owner(2), LEASE, None, keep),
        ClaimOutcome::Completed { .. }
    ));
    assert!(store.purge("k"));
    assert!(!store.purge("k"));
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, keep),
        ClaimOutcome::Claimed
    );
}

#[tokio::test(start_paused = true)]
async fn a_kept_marker_is_gone_after_its_keep_period() {
    let store = RecordStore::new();
    store.claim(
        "k",
        owner(1),
        Duration::from_secs(1),
        None,
        Some(Duration::from_secs(5)),
    );
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(matches!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Abandoned { .. }
    ));
    tokio::time::advance(Duration::from_secs(3)).await;
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Claimed
    );
}

#[tokio::test(start_paused = true)]
async fn completed_records_expire_after_their_retention() {
    let store = RecordStore::new();
    store.claim("k", owner(1), LEASE, None, None);
    store.complete("k", owner(1), done(b"v"), Duration::from_secs(5), None);
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(matches!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Completed { .. }
    ));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Claimed
    );
}

#[tokio::test]
async fn zero_durations_make_state_that_has_already_expired() {
    let store = RecordStore::new();
    let zero = Some(Duration::ZERO);
    assert_eq!(
        store.claim("k", owner(1), Duration::ZERO, None, zero),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.claim("k", owner(2), Duration::ZERO, None, zero),
        ClaimOutcome::Claimed,
        "a zero lease (kept for zero) lapses at once"
    );
    assert_eq!(
        store.renew("k", owner(2), Duration::ZERO),
        RenewOutcome::Lost(LossCause::Expired)
    );
    assert_eq!(
        store.complete("k", owner(1), done(b"v"), Duration::ZERO, None),
        CompleteOutcome::StoredWithoutMarker
    );
    assert_eq!(
        store.claim("k", owner(3), LEASE, None, None),
        ClaimOutcome::Claimed,
        "a zero retention keeps nothing"
    );
    let started = std::time::Instant::now();
    store.wait_settled("k", Duration::ZERO).await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn sub_millisecond_durations_do_not_panic() {
    let store = RecordStore::new();
    let us = Duration::from_micros(1);
    store.claim("k", owner(1), us, None, Some(us));
    store.claim("k", owner(1), us, None, Some(us));
    store.renew("k", owner(1), us);
    store.complete("k", owner(1), done(b"v"), us, None);
    store.wait_settled("k", us).await;
    store.abandon("k", owner(1));
    store.purge("k");
    assert_eq!(
        store.claim("k", owner(2), LEASE, None, None),
        ClaimOutcome::Claimed
    );
}

#[tokio::test]
async fn lapsed_records_are_swept_as_new_keys_are_written() {
    let store = RecordStore::new();
    store.complete("live", owner(1), done(b"kept"), DAY, None);
    for i in 0..3000 {
        store.complete(
            &format!("done{i}"),
            owner(1),
            done(b"v"),
            Duration::ZERO,
            None,
        );
        store.claim(&format!("marker{i}"), owner(2), Duration::ZERO, None, None);
    }
    assert!(
        store.records.len() < 2 * SWEEP_AFTER_AT_LEAST as usize,
        "6000 lapsed records written, {} still in memory",
        store.records.len()
    );
    assert_eq!(store.len(), 1, "only the live record counts");
    match store.claim("live", owner(3), LEASE, None, None) {
        ClaimOutcome::Completed { payload, .. } => assert_eq!(&*payload, b"kept"),
        other => panic!("a live record survives every sweep, got {other:?}"),
    }
}

#[tokio::test]
async fn huge_durations_saturate_instead_of_panicking() {
    for (i, huge) in [Duration::from_millis(u64::MAX), Duration::MAX]
        .into_iter()
        .enumerate()
    {
        let store = RecordStore::new();
        let key = format!("k{i}");
        assert_eq!(
            store.claim(&key, owner(1), huge, None, Some(huge)),
            ClaimOutcome::Claimed
        );
        assert_eq!(
            store.claim(&key, owner(1), huge, None, Some(huge)),
            ClaimOutcome::Claimed,
            "a resend with a huge lease"
        );
        assert_eq!(store.renew(&key, owner(1), huge), RenewOutcome::Renewed);
        match store.claim(&key, owner(2), LEASE, None, None) {
            ClaimOutcome::InFlight { remaining, .. } => assert!(remaining > 365 * DAY),
            other => panic!("expected the marker in flight, got {other:?}"),
        }
        // Times out immediately (zero), then for a long wait, settles on completion.
        store.wait_settled(&key, Duration::ZERO).await;
        assert_eq!(
            store.complete(&key, owner(1), done(b"v"), huge, None),
            CompleteOutcome::Stored
        );
        store.wait_settled(&key, huge).await;
        assert_eq!(store.len(), 1, "the record survives a sweep");
        assert!(matches!(
            store.claim(&key, owner(2), LEASE, None, None),
            ClaimOutcome::Completed { .. }
        ));
        assert!(store.purge(&key));
        assert_eq!(
            store.complete(&key, owner(1), done(b"again"), huge, None),
            CompleteOutcome::StoredWithoutMarker,
            "after a purge the record is created again"
        );
    }
}

#[tokio::test]
async fn waiters_wake_on_completion() {
    let store = Arc::new(RecordStore::new());
    store.claim("k", owner(1), LEASE, None, None);
    let waiter = tokio::spawn({
        let s = store.clone();
        async move {
            let started = std::time::Instant::now();
            s.wait_settled("k", Duration::MAX).await;
            started.elapsed()
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.complete("k", owner(1), done(b"v"), DAY, None);
    let waited = waiter.await.unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "woken by completion, not by timeout: {waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn inspect_reports_state_age_and_time_left() {
    let store = RecordStore::new();
    assert_eq!(store.inspect("k"), None);
    store.claim("k", owner(1), LEASE, Some(Fingerprint([1; 16])), Some(DAY));
    tokio::time::advance(Duration::from_secs(10)).await;
    let seen = store.inspect("k").expect("in flight");
    assert_eq!(seen.status, RecordStatus::InFlight);
    assert_eq!(seen.owner, owner(1));
    assert_eq!(seen.age, Duration::from_secs(10));
    assert_eq!(seen.lease_left, Some(Duration::from_secs(20)));
    assert_eq!(seen.expires_in, Duration::from_secs(20) + DAY);
    assert!(seen.has_fingerprint);
    assert_eq!(seen.payload_len, None);
    assert_eq!(
        store.claim("k", owner(1), LEASE, None, Some(DAY)),
        ClaimOutcome::Claimed,
        "a resent claim"
    );
    assert_eq!(
        store.inspect("k").unwrap().age,
        Duration::from_secs(10),
        "a resent claim keeps the marker's age"
    );
    tokio::time::advance(LEASE).await;
    let seen = store.inspect("k").expect("kept");
    assert_eq!(seen.status, RecordStatus::Abandoned);
    assert_eq!(seen.lease_left, None);
    assert_eq!(
        seen.expires_in, DAY,
        "kept for a day past the lease, which the resent claim restarted"
    );
    store.complete("k", owner(1), done(b"abc"), DAY, None);
    tokio::time::advance(Duration::from_secs(5)).await;
    let seen = store.inspect("k").expect("completed");
    assert_eq!(seen.status, RecordStatus::Completed);
    assert_eq!(
        seen.age,
        Duration::from_secs(5),
        "age counts from completion"
    );
    assert_eq!(seen.payload_len, Some(3));
    assert_eq!(seen.expires_in, DAY - Duration::from_secs(5));
    assert!(seen.has_fingerprint, "the claim's fingerprint is kept");
    assert_eq!(store.keys(), vec![Arc::<str>::from("k")]);
    store.claim("lapses", owner(2), Duration::from_secs(1), None, None);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        store.inspect("lapses"),
        None,
        "a lapsed marker is no record"
    );
    assert_eq!(store.keys(), vec![Arc::<str>::from("k")]);
}
