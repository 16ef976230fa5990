//! The lock table's tests: grants, hand-off, waiters, forced releases, renewal and bounds.

use super::*;
use coord_contract::{FORCED_RELEASE_MEMORY, ForcedRelease};

/// The owner numbered `n`: tests name owners by small numbers.
fn owner(n: u128) -> OwnerToken {
    OwnerToken::from_u128(n)
}

const LEASE: Duration = Duration::from_secs(30);

#[tokio::test]
async fn held_lock_refuses_a_single_attempt() {
    let table = LockTable::new();
    assert!(
        table
            .acquire("k", owner(1), LEASE, Duration::ZERO, false)
            .await
            .is_some()
    );
    assert!(
        table
            .acquire("k", owner(2), LEASE, Duration::ZERO, false)
            .await
            .is_none()
    );
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
    assert!(
        table
            .acquire("k", owner(2), LEASE, Duration::ZERO, false)
            .await
            .is_some()
    );
}

#[tokio::test]
async fn release_is_owner_scoped_and_idempotent() {
    let table = LockTable::new();
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    assert_eq!(table.release("k", owner(2)), ReleaseOutcome::NotHeld);
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::NotHeld);
    assert!(table.is_empty());
}

#[tokio::test(start_paused = true)]
async fn expired_holder_loses_the_lock() {
    let table = LockTable::new();
    table
        .acquire("k", owner(1), Duration::from_secs(1), Duration::ZERO, false)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(
        table
            .acquire("k", owner(2), LEASE, Duration::ZERO, false)
            .await
            .is_some()
    );
    assert_eq!(
        table.release("k", owner(1)),
        ReleaseOutcome::NotHeld,
        "the lapsed holder must not free the new one"
    );
    assert_eq!(
        table.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
    assert_eq!(
        table.renew("k", owner(2), LEASE),
        RenewOutcome::Lost(LossCause::Expired)
    );
}

#[tokio::test(start_paused = true)]
async fn waiter_takes_over_when_holder_lease_ends() {
    let table = LockTable::new();
    table
        .acquire("k", owner(1), Duration::from_secs(2), Duration::ZERO, false)
        .await
        .unwrap();
    let started = Instant::now();
    let grant = table
        .acquire("k", owner(2), LEASE, Duration::from_secs(10), false)
        .await
        .unwrap();
    assert!(grant.contended);
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(
        grant.lease_began,
        Some(started + Duration::from_secs(2)),
        "the engine reports when the lease began: when the holder's ended"
    );
}

#[tokio::test]
async fn release_hands_off_to_the_first_waiter_only() {
    let table = Arc::new(LockTable::new());
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    let first = tokio::spawn({
        let t = table.clone();
        async move {
            t.acquire("k", owner(2), LEASE, Duration::from_secs(30), false)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = tokio::spawn({
        let t = table.clone();
        async move {
            t.acquire("k", owner(3), LEASE, Duration::from_millis(300), false)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    table.release("k", owner(1));
    assert!(first.await.unwrap().is_some());
    assert!(
        second.await.unwrap().is_none(),
        "one release wakes one waiter"
    );
    assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
    assert!(table.is_empty());
}

#[tokio::test]
async fn cancelled_waiter_passes_a_handed_lock_on() {
    let table = Arc::new(LockTable::new());
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    let cancelled = tokio::spawn({
        let t = table.clone();
        async move {
            t.acquire("k", owner(2), LEASE, Duration::from_secs(30), false)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let patient = tokio::spawn({
        let t = table.clone();
        async move {
            t.acquire("k", owner(3), LEASE, Duration::from_secs(30), false)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    cancelled.abort();
    let _ = cancelled.await;
    table.release("k", owner(1));
    assert!(patient.await.unwrap().is_some());
    assert_eq!(table.release("k", owner(3)), ReleaseOutcome::Released);
    assert!(table.is_empty());
}

#[tokio::test]
async fn fencing_tokens_increase_and_exist_only_when_fenced() {
    let table = LockTable::new();
    let a = table
        .acquire("k", owner(1), LEASE, Duration::ZERO, true)
        .await
        .unwrap();
    table.release("k", owner(1));
    let b = table
        .acquire("k", owner(2), LEASE, Duration::ZERO, true)
        .await
        .unwrap();
    table.release("k", owner(2));
    let c = table
        .acquire("k", owner(3), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    assert!(a.fencing_token.unwrap() < b.fencing_token.unwrap());
    assert_eq!(c.fencing_token, None);
}
#[tokio::test]
async fn renew_tells_a_taken_lock_from_a_free_one() {
    let table = LockTable::new();
    assert_eq!(
        table.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::Expired),
        "never held"
    );
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    assert_eq!(
        table.renew("k", owner(2), LEASE),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(
        table.renew("k", owner(1), Duration::MAX),
        RenewOutcome::Renewed
    );
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
    assert_eq!(
        table.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::Expired),
        "released"
    );
}

#[tokio::test]
async fn zero_and_huge_leases_neither_panic_nor_misbehave() {
    let table = LockTable::new();
    let zero = table
        .acquire("k", owner(1), Duration::ZERO, Duration::ZERO, true)
        .await;
    assert!(zero.is_some());
    assert!(
        table
            .acquire("k", owner(2), Duration::MAX, Duration::ZERO, true)
            .await
            .is_some(),
        "a zero lease leaves the lock free at once"
    );
    assert_eq!(
        table.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert!(
        table
            .acquire("k", owner(3), LEASE, Duration::from_micros(1), false)
            .await
            .is_none(),
        "a Duration::MAX lease holds"
    );
    assert_eq!(
        table.renew("k", owner(2), Duration::from_millis(u64::MAX)),
        RenewOutcome::Renewed
    );
    assert_eq!(table.release("k", owner(2)), ReleaseOutcome::Released);
    assert!(table.is_empty());
}

#[tokio::test]
async fn a_forever_wait_waits_is_granted_and_leaves_no_deadlock_when_cancelled() {
    let table = Arc::new(LockTable::new());
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    // Cancelled: the queued waiter's clean-up must not lock up the key's shard.
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        table.acquire("k", owner(2), LEASE, Duration::MAX, false),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "a Duration::MAX wait does not return early"
    );
    let patient = tokio::spawn({
        let t = table.clone();
        async move { t.acquire("k", owner(3), LEASE, Duration::MAX, true).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!patient.is_finished());
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
    let grant = tokio::time::timeout(Duration::from_secs(10), patient)
        .await
        .expect("the release hands the lock to the forever waiter")
        .unwrap()
        .expect("granted, not refused");
    assert!(grant.contended && grant.fencing_token.is_some());
    assert_eq!(table.release("k", owner(3)), ReleaseOutcome::Released);
    assert!(table.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_forever_waiter_takes_over_when_the_holder_lease_ends() {
    let table = LockTable::new();
    table
        .acquire("k", owner(1), Duration::from_secs(2), Duration::ZERO, false)
        .await
        .unwrap();
    let started = Instant::now();
    let grant = table
        .acquire("k", owner(2), Duration::MAX, Duration::MAX, false)
        .await;
    assert!(grant.is_some());
    assert_eq!(started.elapsed(), Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn inspect_reports_the_holder_its_lease_waiters_and_fencing_token() {
    let table = Arc::new(LockTable::new());
    assert_eq!(table.inspect("k"), None, "never held");
    let grant = table
        .acquire("k", owner(1), Duration::from_secs(10), Duration::ZERO, true)
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    let waiter = tokio::spawn({
        let t = table.clone();
        async move { t.acquire("k", owner(2), LEASE, LEASE, false).await }
    });
    tokio::task::yield_now().await;
    let seen = table.inspect("k").expect("held");
    assert_eq!(seen.owner, owner(1));
    assert_eq!(seen.lease_left, Duration::from_secs(6));
    assert_eq!(seen.waiters, 1);
    assert_eq!(seen.fencing_token, grant.fencing_token);
    assert_eq!(table.held_keys(), vec![Arc::<str>::from("k")]);
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::Released);
    waiter.await.unwrap().expect("handed over");
    let seen = table.inspect("k").expect("held by the waiter");
    assert_eq!((seen.owner, seen.waiters), (owner(2), 0));
    assert_eq!(
        seen.fencing_token, grant.fencing_token,
        "an unfenced grant keeps the newest token minted for the key"
    );
    tokio::time::advance(LEASE).await;
    assert_eq!(table.inspect("k"), None, "a lapsed lease is free");
    assert!(table.held_keys().is_empty());
}

#[tokio::test]
async fn force_release_frees_any_holder_and_hands_over_to_a_waiter() {
    let table = Arc::new(LockTable::new());
    assert_eq!(
        table.force_release("k"),
        ForcedRelease::NotHeld,
        "nothing held"
    );
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let t = table.clone();
        async move { t.acquire("k", owner(2), LEASE, LEASE, false).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        table.force_release("k"),
        ForcedRelease::Released { owner: owner(1) }
    );
    assert!(waiter.await.unwrap().is_some(), "the waiter got the lock");
    assert_eq!(
        table.renew("k", owner(1), LEASE),
        RenewOutcome::Lost(LossCause::ForceReleased),
        "the old holder's renewal is told why, though the waiter holds the key now"
    );
    assert_eq!(
        table.release("k", owner(1)),
        ReleaseOutcome::ForceReleased,
        "the old holder no longer holds it, and is told why"
    );
    assert_eq!(
        table.renew("k", owner(3), LEASE),
        RenewOutcome::Lost(LossCause::TakenByOther),
        "an owner that was never forced out is not told so"
    );
    assert_eq!(
        table.force_release("k"),
        ForcedRelease::Released { owner: owner(2) }
    );
    assert!(table.is_empty(), "no waiter: the entry goes");
    assert_eq!(
        table.renew("k", owner(2), LEASE),
        RenewOutcome::Lost(LossCause::ForceReleased)
    );
}

#[tokio::test(start_paused = true)]
async fn a_forced_release_is_remembered_for_the_lease_plus_a_minute_then_forgotten() {
    let table = LockTable::new();
    table
        .acquire("k", owner(1), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    assert_eq!(
        table.force_release("k"),
        ForcedRelease::Released { owner: owner(1) }
    );
    tokio::time::advance(LEASE + FORCED_RELEASE_MEMORY - Duration::from_millis(1)).await;
    assert_eq!(table.release("k", owner(1)), ReleaseOutcome::ForceReleased);
    assert_eq!(
        table.release("k", owner(1)),
        ReleaseOutcome::ForceReleased,
        "a resent release gets the same answer"
    );
    tokio::time::advance(Duration::from_millis(2)).await;
    assert_eq!(
        table.release("k", owner(1)),
        ReleaseOutcome::NotHeld,
        "past its time the marker is forgotten: the release cannot tell why"
    );
    assert!(table.forced.is_empty(), "and removed");
    // A lapsed lease forced "free" leaves no marker: nobody held it.
    table
        .acquire("j", owner(2), LEASE, Duration::ZERO, false)
        .await
        .unwrap();
    tokio::time::advance(LEASE).await;
    assert_eq!(table.force_release("j"), ForcedRelease::NotHeld);
    assert_eq!(table.release("j", owner(2)), ReleaseOutcome::NotHeld);
    assert!(table.forced.is_empty());
}
