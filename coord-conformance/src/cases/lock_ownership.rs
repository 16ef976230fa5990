//! Lock ownership: only the owner releases or renews, both idempotently, and a lost lock says
//! why it was lost.

use std::time::Duration;

use coord_core::provider::{OwnerToken, ReleaseOutcome, RenewOutcome};
use coord_core::{Coordinator, LossCause};

use super::durations::{LONG, PAST_SHORT, SHORT};
use super::requests::{key, lock_req};

/// Release frees only the owner's lock and is idempotent.
pub async fn lock_release_is_owner_scoped_and_idempotent(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "owner-scoped");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::NotHeld);
    let still = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(still, None, "a stranger's release must not free the lock");
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::NotHeld);
}

/// Renewal extends the owner's lease and reports `Lost` for anyone else.
pub async fn lock_renew_is_owner_scoped(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "renew");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, Duration::from_millis(400), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.renew(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(p.renew(&k, a, LONG).await.unwrap(), RenewOutcome::Renewed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let refused = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(refused, None, "the renewed lease outlives the original one");
    p.release(&k, a).await.unwrap();
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "after its release the key is free: nobody took it"
    );
}

/// A lost lock says why: `Expired` when the key is free (lapsed, released, never held),
/// `TakenByOther` when another owner holds it now.
pub async fn lock_renew_reports_why_the_lock_was_lost(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "renew-cause");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "a key never held"
    );
    p.acquire(lock_req(&k, a, SHORT, Duration::ZERO))
        .await
        .unwrap()
        .expect("free lock");
    tokio::time::sleep(PAST_SHORT).await;
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "the lease lapsed and nobody took the key"
    );
    p.acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("the lapsed lock is free");
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    assert_eq!(p.renew(&k, b, LONG).await.unwrap(), RenewOutcome::Renewed);
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        p.renew(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "released"
    );
}
