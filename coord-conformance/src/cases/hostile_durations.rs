//! Hostile durations: leases, waits, retentions and timeouts of zero, 1 µs, `u64::MAX` ms and
//! `Duration::MAX` neither panic, hang nor wrap around, and a cancelled wait leaves the key
//! working.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, CompleteOutcome, CompleteRequest, Fingerprint, LockRequest, OwnerToken,
    ReleaseOutcome, RenewOutcome,
};
use coord_core::{Coordinator, LossCause};

use super::deadlines::{bounded, within_3s};
use super::durations::{EXTREMES, LONG, is_huge};
use super::records::completed_record;
use super::requests::{claim_req, complete_req, key, lock_req};

/// Leases and renewals of zero, 1 µs, `u64::MAX` ms and `Duration::MAX` are accepted: a tiny
/// lease frees the lock (at once, or within the backend's resolution), a huge one holds it.
pub async fn lock_extreme_leases_are_accepted(c: Coordinator) {
    let p = c.lock_provider().clone();
    for (i, d) in EXTREMES.into_iter().enumerate() {
        let k = key(&c, &format!("extreme-lease-{i}"));
        let a = OwnerToken::new();
        let grant = {
            let (p, k) = (p.clone(), k.clone());
            bounded("acquire with an extreme lease", async move {
                p.acquire(LockRequest {
                    fenced: true,
                    ..lock_req(&k, a, d, Duration::ZERO)
                })
                .await
            })
            .await
        };
        let grant = grant
            .unwrap_or_else(|e| panic!("lease {d:?}: {e}"))
            .unwrap_or_else(|| panic!("lease {d:?}: a free lock is granted"));
        assert!(grant.fencing_token.is_some());
        if is_huge(d) {
            let b = OwnerToken::new();
            assert_eq!(
                p.acquire(lock_req(&k, b, LONG, Duration::ZERO))
                    .await
                    .unwrap(),
                None,
                "lease {d:?} holds the lock"
            );
            assert_eq!(p.renew(&k, a, d).await.unwrap(), RenewOutcome::Renewed);
            assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
        } else {
            let b = OwnerToken::new();
            within_3s(&format!("a lease of {d:?} frees the lock"), || {
                let (p, k) = (p.clone(), k.clone());
                async move {
                    p.acquire(lock_req(&k, b, LONG, Duration::ZERO))
                        .await
                        .unwrap()
                        .is_some()
                }
            })
            .await;
            // Renewing with a tiny lease is accepted too, and the lock frees again.
            assert_eq!(p.renew(&k, b, d).await.unwrap(), RenewOutcome::Renewed);
            let e = OwnerToken::new();
            within_3s(&format!("a renewal of {d:?} frees the lock"), || {
                let (p, k) = (p.clone(), k.clone());
                async move {
                    p.acquire(lock_req(&k, e, LONG, Duration::ZERO))
                        .await
                        .unwrap()
                        .is_some()
                }
            })
            .await;
            assert_eq!(p.release(&k, e).await.unwrap(), ReleaseOutcome::Released);
        }
    }
}

/// Waits of zero and 1 µs on a held lock are refused promptly; waits of `u64::MAX` ms and
/// `Duration::MAX` wait (they do not return early) and are granted when the holder releases.
pub async fn lock_extreme_waits_wait_until_granted(c: Coordinator) {
    let p = c.lock_provider().clone();
    for (i, d) in EXTREMES.into_iter().enumerate() {
        let k = key(&c, &format!("extreme-wait-{i}"));
        let a = OwnerToken::new();
        p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
            .await
            .unwrap()
            .expect("free lock");
        if !is_huge(d) {
            let b = OwnerToken::new();
            let refused = {
                let (p, k) = (p.clone(), k.clone());
                bounded("a tiny wait", async move {
                    p.acquire(lock_req(&k, b, LONG, d)).await
                })
                .await
            };
            assert_eq!(refused.unwrap(), None, "wait {d:?} on a held lock");
            p.release(&k, b).await.unwrap();
            p.release(&k, a).await.unwrap();
            continue;
        }
        let waiter = tokio::spawn({
            let (p, k) = (p.clone(), k.clone());
            async move {
                let b = OwnerToken::new();
                let grant = p.acquire(lock_req(&k, b, LONG, d)).await;
                (grant, b, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        if waiter.is_finished() {
            let early = waiter.await;
            panic!("a wait of {d:?} returned before the lock was released: {early:?}");
        }
        let released_at = Instant::now();
        assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
        let (grant, b, granted_at) = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("a wait of {d:?} was not granted after the release"))
            .unwrap();
        let grant = grant.unwrap().expect("granted, not refused");
        assert!(grant.contended);
        assert!(
            granted_at.saturating_duration_since(released_at) < Duration::from_secs(5),
            "woken by the release"
        );
        assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
    }
}

/// A `Duration::MAX` waiter cancelled mid-wait (and released by token, as the runtime does)
/// leaves the key working: the holder's release frees it for the next caller, exclusion still
/// holds, and no call on the key hangs.
pub async fn lock_cancelled_forever_waiter_leaves_the_key_working(c: Coordinator) {
    let p = c.lock_provider().clone();
    let k = key(&c, "cancelled-forever");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock_req(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("free lock");
    let cancelled = {
        let (p, k) = (p.clone(), k.clone());
        bounded("a cancelled Duration::MAX wait", async move {
            let started = Instant::now();
            let waited = tokio::time::timeout(
                Duration::from_millis(400),
                p.acquire(lock_req(&k, b, LONG, Duration::MAX)),
            )
            .await;
            (waited, started.elapsed())
        })
        .await
    };
    assert!(
        cancelled.0.is_err(),
        "a Duration::MAX wait on a held lock returned: {:?}",
        cancelled.0
    );
    assert!(cancelled.1 >= Duration::from_millis(400));
    // The runtime's follow-up for a cancelled acquire.
    let released = {
        let (p, k) = (p.clone(), k.clone());
        bounded("release of the cancelled waiter", async move {
            p.release(&k, b).await
        })
        .await
    };
    assert_eq!(released.unwrap(), ReleaseOutcome::NotHeld);
    let released = {
        let (p, k) = (p.clone(), k.clone());
        bounded(
            "the holder's release",
            async move { p.release(&k, a).await },
        )
        .await
    };
    assert_eq!(released.unwrap(), ReleaseOutcome::Released);
    let d = OwnerToken::new();
    let next = {
        let (p, k) = (p.clone(), k.clone());
        bounded("the next caller", async move {
            p.acquire(lock_req(&k, d, LONG, Duration::from_secs(5)))
                .await
        })
        .await
    };
    assert!(
        next.unwrap().is_some(),
        "the key is free for the next caller"
    );
    let e = OwnerToken::new();
    let refused = {
        let (p, k) = (p.clone(), k.clone());
        bounded("a caller while the key is held", async move {
            p.acquire(lock_req(&k, e, LONG, Duration::from_millis(300)))
                .await
        })
        .await
    };
    assert_eq!(refused.unwrap(), None, "exclusion still holds");
    assert_eq!(p.release(&k, d).await.unwrap(), ReleaseOutcome::Released);
}

/// In-flight leases, keep periods and retentions of zero, 1 µs, `u64::MAX` ms and
/// `Duration::MAX` are accepted by every idempotency call: tiny ones expire (at once, or
/// within the backend's resolution), huge ones last.
pub async fn idempotency_extreme_durations_are_accepted(c: Coordinator) {
    let s = c.idempotency_store().clone();
    for (i, d) in EXTREMES.into_iter().enumerate() {
        let k = key(&c, &format!("extreme-record-{i}"));
        let (a, b) = (OwnerToken::new(), OwnerToken::new());
        let fp = Some(Fingerprint([i as u8; 16]));
        let claimed = {
            let (s, k) = (s.clone(), k.clone());
            bounded("claim with extreme durations", async move {
                s.claim(claim_req(&k, a, d, fp, Some(d))).await
            })
            .await
        };
        assert_eq!(
            claimed.unwrap_or_else(|e| panic!("lease {d:?}: {e}")),
            ClaimOutcome::Claimed
        );
        let renewed = s.renew_marker(&k, a, d).await.unwrap();
        if is_huge(d) {
            assert_eq!(renewed, RenewOutcome::Renewed, "lease {d:?}");
            match s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap() {
                ClaimOutcome::InFlight { remaining, .. } => assert!(remaining > LONG),
                other => panic!("lease {d:?}: expected in flight, got {other:?}"),
            }
        } else {
            assert!(
                matches!(
                    renewed,
                    RenewOutcome::Renewed | RenewOutcome::Lost(LossCause::Expired)
                ),
                "lease {d:?}: renewed, or already lapsed; got {renewed:?}"
            );
        }
        let payload: Arc<[u8]> = Arc::from(&b"outcome"[..]);
        let stored = s
            .complete(CompleteRequest {
                retention: d,
                ..complete_req(&k, a, &payload, fp)
            })
            .await
            .unwrap();
        assert!(stored.is_stored(), "retention {d:?}: got {stored:?}");
        let settled = {
            let (s, k) = (s.clone(), k.clone());
            bounded("wait_settled with nothing in flight", async move {
                s.wait_settled(&k, d).await
            })
            .await
        };
        settled.unwrap();
        if is_huge(d) {
            let (replayed, _) = completed_record(&c, &k, "a huge retention").await;
            assert_eq!(&*replayed, &*payload);
            assert!(s.purge(&k).await.unwrap());
        } else {
            within_3s(&format!("a retention of {d:?} expires"), || {
                let (s, k) = (s.clone(), k.clone());
                async move {
                    s.claim(claim_req(&k, b, LONG, None, None)).await.unwrap()
                        == ClaimOutcome::Claimed
                }
            })
            .await;
            assert!(s.abandon(&k, b).await.unwrap());
        }
    }
}

/// `wait_settled` with a timeout of `u64::MAX` ms or `Duration::MAX` waits until the marker
/// settles (it does not return early), a cancelled one leaves the key working, and a
/// completion wakes the next one.
pub async fn idempotency_forever_wait_settled_waits_until_settled(c: Coordinator) {
    let s = c.idempotency_store().clone();
    for (i, d) in EXTREMES.into_iter().filter(|d| is_huge(*d)).enumerate() {
        let k = key(&c, &format!("forever-settle-{i}"));
        let a = OwnerToken::new();
        s.claim(claim_req(&k, a, LONG, None, None)).await.unwrap();
        let cancelled =
            tokio::time::timeout(Duration::from_millis(400), s.wait_settled(&k, d)).await;
        assert!(
            cancelled.is_err(),
            "wait_settled({d:?}) returned with the marker in flight"
        );
        let waiter = tokio::spawn({
            let (s, k) = (s.clone(), k.clone());
            async move {
                s.wait_settled(&k, d).await.unwrap();
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        if waiter.is_finished() {
            let early = waiter.await;
            panic!("wait_settled({d:?}) returned with the marker in flight: {early:?}");
        }
        let completed_at = Instant::now();
        let payload: Arc<[u8]> = Arc::from(&b"settled"[..]);
        assert_eq!(
            s.complete(complete_req(&k, a, &payload, None))
                .await
                .unwrap(),
            CompleteOutcome::Stored
        );
        let woke = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap_or_else(|_| panic!("wait_settled({d:?}) not woken by the completion"))
            .unwrap();
        assert!(woke.saturating_duration_since(completed_at) < Duration::from_secs(5));
    }
}
