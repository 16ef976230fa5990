//! Extreme durations through the provider API: zero, one microsecond, `Duration::MAX` and
//! `u64::MAX` milliseconds as leases, keep periods, retentions, renewals and waits. None may
//! panic or draw an error from Redis; every expiry Redis ends up with is sane (at least one
//! millisecond, at most the provider's cap of 2^46 ms); an unbounded wait lasts until it is
//! granted or dropped, and dropping it leaves the provider working.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, IdempotencyStore, LockProvider,
    OwnerToken, ReleaseOutcome, RenewOutcome,
};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    lock_leases_of_any_length,
    record_durations_of_any_length,
    unbounded_lock_waits_end_by_grant_or_drop,
    unbounded_settle_waits_end_by_settling_or_drop,
);

/// The longest expiry the provider sends: 2^46 ms (about 2230 years).
const CAP_MS: i64 = 1 << 46;

const EXTREMES: [(&str, Duration); 4] = [
    ("zero", Duration::ZERO),
    ("1 µs", Duration::from_micros(1)),
    ("Duration::MAX", Duration::MAX),
    ("u64::MAX ms", Duration::from_millis(u64::MAX)),
];

fn is_long(d: Duration) -> bool {
    d > Duration::from_secs(1)
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.command(&["PTTL", name]).int().expect("PTTL answers")
}

/// Checks the expiry `name` got from a duration of `d`: a short one is gone (or about to be)
/// within a millisecond, a huge one is capped, never unbounded (`-1`).
fn assert_expiry(server: &RedisServer, name: &str, d: Duration, what: &str) {
    let ms = pttl(server, name);
    if is_long(d) {
        assert!(
            ms > CAP_MS - 60_000 && ms <= CAP_MS + 1,
            "{what}: capped expiry, PTTL {ms}"
        );
    } else {
        assert!(
            ms == -2 || (0..=1).contains(&ms),
            "{what}: one millisecond at most, PTTL {ms}"
        );
    }
}

async fn lock_leases_of_any_length(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    for (what, lease) in EXTREMES {
        for fenced_lock in [false, true] {
            let k = key("lease");
            let name = redis_key(&k, "lock");
            let a = OwnerToken::new();
            let req = if fenced_lock {
                fenced(&k, a, lease, Duration::ZERO)
            } else {
                lock(&k, a, lease, Duration::ZERO)
            };
            let grant = p.acquire(req).await.unwrap();
            assert!(grant.is_some(), "{what}: granted");
            assert_expiry(&server, &name, lease, &format!("{what} lease"));
            if fenced_lock {
                let fence = pttl(&server, &redis_key(&k, "fence"));
                assert!(
                    fence > 3_500_000 && fence <= CAP_MS,
                    "{what}: fence counter PTTL {fence}"
                );
            }
            // The first wait of a waiting acquire asks for the lease in the same round trip.
            let b = OwnerToken::new();
            let waited = p
                .acquire(lock(&k, b, LONG, Duration::from_millis(50)))
                .await
                .unwrap();
            assert_eq!(waited.is_some(), !is_long(lease), "{what}: waited");
            if !is_long(lease) {
                p.release(&k, b).await.unwrap();
                // Take it back with a real lease, to renew it with the extreme one.
                p.acquire(lock(&k, a, LONG, Duration::ZERO))
                    .await
                    .unwrap()
                    .unwrap();
            }
            assert_eq!(
                p.renew(&k, a, lease).await.unwrap(),
                RenewOutcome::Renewed,
                "{what}: renewed"
            );
            assert_expiry(&server, &name, lease, &format!("{what} renewal"));
            let released = p.release(&k, a).await.unwrap();
            if is_long(lease) {
                assert_eq!(released, ReleaseOutcome::Released, "{what}");
            }
        }
    }
}

async fn record_durations_of_any_length(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let payload: Arc<[u8]> = Arc::from(&b"outcome"[..]);
    for (what, d) in EXTREMES {
        // The in-flight lease.
        let k = key("marker");
        let record = redis_key(&k, "idem");
        let a = OwnerToken::new();
        assert_eq!(
            s.claim(claim(&k, a, d)).await.unwrap(),
            ClaimOutcome::Claimed,
            "{what}"
        );
        assert_expiry(&server, &record, d, &format!("{what} in-flight lease"));

        // Renewing a marker, and completing it with a retention of `d`.
        let k = key("renewed");
        let record = redis_key(&k, "idem");
        s.claim(claim(&k, a, LONG)).await.unwrap();
        assert_eq!(
            s.renew_marker(&k, a, d).await.unwrap(),
            RenewOutcome::Renewed,
            "{what}"
        );
        assert_expiry(&server, &record, d, &format!("{what} marker renewal"));
        if is_long(d) {
            let outcome = s
                .complete(CompleteRequest {
                    key: &k,
                    owner: a,
                    payload: payload.clone(),
                    retention: d,
                    fingerprint: None,
                })
                .await
                .unwrap();
            assert_eq!(outcome, CompleteOutcome::Stored, "{what}");
            assert_expiry(&server, &record, d, &format!("{what} retention"));
        }

        // A retention of `d` on a live marker.
        let k = key("retained");
        let record = redis_key(&k, "idem");
        s.claim(claim(&k, a, LONG)).await.unwrap();
        let outcome = s
            .complete(CompleteRequest {
                key: &k,
                owner: a,
                payload: payload.clone(),
                retention: d,
                fingerprint: None,
            })
            .await
            .unwrap();
        assert_eq!(outcome, CompleteOutcome::Stored, "{what}");
        assert_expiry(&server, &record, d, &format!("{what} retention"));

        // Keeping an abandoned marker for `d`, with a lease of `d` too: the expiry is the
        // lease plus the keep, each capped.
        let k = key("kept");
        let record = redis_key(&k, "idem");
        let req = ClaimRequest {
            keep_abandoned_for: Some(d),
            ..claim(&k, a, d)
        };
        assert_eq!(s.claim(req).await.unwrap(), ClaimOutcome::Claimed, "{what}");
        let ms = pttl(&server, &record);
        if is_long(d) {
            assert!(
                ms > CAP_MS - 60_000 && ms <= CAP_MS + 1,
                "{what}: lease and keep, PTTL {ms}"
            );
            match s.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap() {
                ClaimOutcome::InFlight { remaining, .. } => assert!(
                    remaining > Duration::from_millis(CAP_MS as u64 / 2),
                    "{what}: {remaining:?}"
                ),
                other => panic!("{what}: expected in flight, got {other:?}"),
            }
        } else {
            assert!(
                ms == -2 || (0..=2).contains(&ms),
                "{what}: lease and keep of a millisecond each, PTTL {ms}"
            );
        }
        // A long marker with a short keep: the lease decides.
        let k = key("kept-short");
        let record = redis_key(&k, "idem");
        s.claim(ClaimRequest {
            keep_abandoned_for: Some(d),
            ..claim(&k, a, LONG)
        })
        .await
        .unwrap();
        let ms = pttl(&server, &record);
        if is_long(d) {
            assert!(ms > CAP_MS - 60_000 && ms <= CAP_MS + 1, "{what}: {ms}");
        } else {
            assert!(ms > 25_000 && ms <= 30_001, "{what}: {ms}");
        }
        // And renewing a kept marker with `d`.
        assert_eq!(
            s.renew_marker(&k, a, d).await.unwrap(),
            RenewOutcome::Renewed,
            "{what}"
        );
    }
}

async fn unbounded_lock_waits_end_by_grant_or_drop(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    for (what, wait) in EXTREMES {
        let k = key("wait");
        let channel = redis_key(&k, "lock");
        let (a, b) = (OwnerToken::new(), OwnerToken::new());
        p.acquire(lock(&k, a, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        if !is_long(wait) {
            // Zero is one attempt, a microsecond barely more.
            let started = Instant::now();
            assert_eq!(
                p.acquire(lock(&k, b, LONG, wait)).await.unwrap(),
                None,
                "{what}"
            );
            assert!(started.elapsed() < Duration::from_secs(2), "{what}");
            p.release(&k, a).await.unwrap();
            continue;
        }
        // Dropped while waiting: the provider keeps working and leaves nothing behind.
        let dropped = tokio::time::timeout(
            Duration::from_millis(300),
            p.acquire(fenced(&k, b, LONG, wait)),
        )
        .await;
        assert!(dropped.is_err(), "{what}: still waiting when dropped");
        p.release(&k, b).await.unwrap();
        until("the dropped waiter to unsubscribe", LONG, || {
            subscribers(&server, &channel) == 0
        })
        .await;
        assert_eq!(
            p.acquire(lock(&k, b, LONG, Duration::ZERO)).await.unwrap(),
            None,
            "{what}: still held by the first owner"
        );
        // Waiting without end is granted when the holder releases.
        let waiter = spawn_acquire(&p, fenced(&k, b, LONG, wait));
        until("the waiter to subscribe", LONG, || {
            subscribers(&server, &channel) == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "{what}: waits while held");
        let released_at = Instant::now();
        assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
        let got = waiter.await.unwrap();
        assert!(got.grant.is_some(), "{what}: granted");
        assert!(
            got.at.saturating_duration_since(released_at) < Duration::from_secs(2),
            "{what}: woken by the release"
        );
        assert_eq!(
            server.command(&["GET", &channel]),
            Resp::Bulk(b.to_string().into_bytes())
        );
        p.release(&k, b).await.unwrap();
    }
}

async fn unbounded_settle_waits_end_by_settling_or_drop(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    for (what, timeout) in EXTREMES {
        let k = key("settle");
        let a = OwnerToken::new();
        s.claim(claim(&k, a, LONG)).await.unwrap();
        if !is_long(timeout) {
            let started = Instant::now();
            s.wait_settled(&k, timeout).await.unwrap();
            assert!(started.elapsed() < Duration::from_secs(2), "{what}");
            assert!(s.abandon(&k, a).await.unwrap());
            continue;
        }
        let dropped =
            tokio::time::timeout(Duration::from_millis(300), s.wait_settled(&k, timeout)).await;
        assert!(dropped.is_err(), "{what}: still waiting when dropped");
        let waiter = tokio::spawn({
            let (s, k) = (s.clone(), k.clone());
            async move {
                s.wait_settled(&k, timeout).await.unwrap();
                Instant::now()
            }
        });
        until("the waiter to mark the marker", LONG, || {
            server.command(&["HGET", &redis_key(&k, "idem"), "w"]) == Resp::Bulk(b"1".to_vec())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "{what}: waits while in flight");
        let settled_at = Instant::now();
        let outcome = s
            .complete(CompleteRequest {
                key: &k,
                owner: a,
                payload: Arc::from(&b"done"[..]),
                retention: LONG,
                fingerprint: None,
            })
            .await
            .unwrap();
        assert_eq!(outcome, CompleteOutcome::Stored);
        let woke = waiter.await.unwrap();
        assert!(
            woke.saturating_duration_since(settled_at) < Duration::from_secs(2),
            "{what}: woken by the completion"
        );
    }
}
