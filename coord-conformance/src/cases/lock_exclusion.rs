//! Lock exclusion and hand-off: one holder at a time, a lapsed lease frees the key, and a
//! release hands it to one waiter without polling.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::Coordinator;
use coord_core::provider::{OwnerToken, ReleaseOutcome};

use super::durations::LONG;
use super::requests::{key, lock_req};

/// A held lock refuses a single attempt by someone else, and is free again after release.
pub async fn lock_single_attempt_refused_when_held(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "single");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let grant = p
        .acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert!(grant.is_some(), "a free lock is granted");
    let refused = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(refused, None, "a held lock refuses a single attempt");
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    let again = p
        .acquire(lock_req(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert!(again.is_some(), "released lock is free");
    p.release(&k, b).await.unwrap();
}

/// A holder that outlives its lease loses the lock: the next caller gets it, and the old
/// holder's release reports `NotHeld` without freeing the new holder.
pub async fn lock_expired_holder_is_replaced(c: Coordinator) {
    let p = c.lock_provider();
    let k = key(&c, "expiry");
    let (a, b, d) = (OwnerToken::new(), OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, Duration::from_millis(200), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let grant = p
        .acquire(lock_req(&k, b, LONG, Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(
        grant.is_some(),
        "the lapsed lease frees the lock for a waiter"
    );
    assert!(
        started.elapsed() < Duration::from_millis(200) + Duration::from_secs(2),
        "replaced within lease + margin, took {:?}",
        started.elapsed()
    );
    assert_eq!(
        p.release(&k, a).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "the lapsed holder's release reports it"
    );
    let refused = p
        .acquire(lock_req(&k, d, LONG, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(
        refused, None,
        "the lapsed holder's release freed the new holder"
    );
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
}

/// A waiter is woken by the release, long before any backstop would fire.
pub async fn lock_waiter_is_woken_by_release(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "wake");
    let a = OwnerToken::new();
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let b = OwnerToken::new();
            let grant = p
                .acquire(lock_req(&k, b, LONG, Duration::from_secs(20)))
                .await
                .unwrap();
            (grant, Instant::now(), b)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    p.release(&k, a).await.unwrap();
    let (grant, granted_at, b) = waiter.await.unwrap();
    let grant = grant.expect("the waiter gets the lock");
    assert!(
        grant.contended,
        "a grant after waiting is reported as contended"
    );
    let handoff = granted_at.saturating_duration_since(released_at);
    assert!(
        handoff < Duration::from_millis(700),
        "woken by the release, not a backstop: hand-off took {handoff:?}"
    );
    p.release(&k, b).await.unwrap();
}

/// One release wakes one waiter: of two waiters, the second stays waiting.
pub async fn lock_release_wakes_one_waiter(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "wake-one");
    let a = OwnerToken::new();
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let granted = Arc::new(AtomicUsize::new(0));
    let spawn_waiter = |wait: Duration| {
        let (p, k, granted) = (p.clone(), k.clone(), granted.clone());
        tokio::spawn(async move {
            let me = OwnerToken::new();
            let grant = p.acquire(lock_req(&k, me, LONG, wait)).await.unwrap();
            if grant.is_some() {
                granted.fetch_add(1, Ordering::SeqCst);
            }
            grant.map(|_| me)
        })
    };
    let first = spawn_waiter(Duration::from_secs(20));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = spawn_waiter(Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    p.release(&k, a).await.unwrap();
    let winner = first.await.unwrap().expect("the first waiter is woken");
    let loser = second.await.unwrap();
    assert!(
        loser.is_none(),
        "the second waiter must still be waiting: one release, one wake"
    );
    assert_eq!(granted.load(Ordering::SeqCst), 1);
    p.release(&k, winner).await.unwrap();
}
