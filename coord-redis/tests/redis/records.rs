//! Idempotency records against a real redis-server, for every client.

use crate::support;

use coord_core::CallKey;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_core::provider::{
    ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest, Fingerprint, IdempotencyStore,
    OwnerToken, RenewOutcome,
};
use coord_core::{BackendError, LossCause};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    claim_complete_and_replay,
    abandon_is_owner_scoped,
    lapsed_marker_is_claimed_again,
    completed_record_lives_for_its_retention,
    binary_payloads_round_trip,
    wait_settled_returns_at_once_without_a_marker,
    wait_settled_wakes_on_completion_and_abandonment,
    wait_settled_ends_when_the_marker_expires,
    abandoned_marker_is_kept_on_request,
    renew_marker_is_owner_scoped,
    purge_removes_any_record_and_wakes_waiters,
    settling_a_record_nobody_waits_for_publishes_nothing,
    a_resent_claim_of_the_live_marker_is_claimed_again,
    a_completion_without_marker_creates_the_record,
    a_late_completion_after_another_claim_is_superseded,
    renew_marker_reports_why_the_marker_is_lost,
    old_completed_records_without_owner_still_replay,
);

async fn complete(
    s: &dyn IdempotencyStore,
    key: &CallKey,
    owner: OwnerToken,
    payload: &Arc<[u8]>,
    fingerprint: Option<Fingerprint>,
) -> Result<CompleteOutcome, BackendError> {
    s.complete(CompleteRequest {
        key,
        owner,
        payload: payload.clone(),
        retention: LONG,
        fingerprint,
    })
    .await
}

async fn claim_complete_and_replay(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("claim");
    let fp = Some(Fingerprint([7; 16]));
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
            assert_eq!(fingerprint, fp);
            assert!(
                remaining > Duration::from_secs(25) && remaining <= LONG,
                "{remaining:?}"
            );
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    let payload: Arc<[u8]> = Arc::from(&b"{\"receipt\":42}"[..]);
    assert_eq!(
        complete(&s, &k, b, &payload, None).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(a),
            completed: false
        },
        "only the owner completes; the other owner is named"
    );
    assert_eq!(
        complete(&s, &k, a, &payload, fp).await.unwrap(),
        CompleteOutcome::Stored
    );
    // A resend of the same completion (its first reply lost) answers the same.
    let other: Arc<[u8]> = Arc::from(&b"resent"[..]);
    assert_eq!(
        complete(&s, &k, a, &other, fp).await.unwrap(),
        CompleteOutcome::Stored,
        "completing is idempotent for its owner"
    );
    assert_eq!(
        complete(&s, &k, b, &other, fp).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(a),
            completed: true
        }
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

    // Without a fingerprint, none comes back.
    let k2 = key("no-fp");
    assert_eq!(
        s.claim(claim(&k2, a, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    match s.claim(claim(&k2, b, LONG)).await.unwrap() {
        ClaimOutcome::InFlight { fingerprint, .. } => assert_eq!(fingerprint, None),
        other => panic!("expected in flight, got {other:?}"),
    }
}

async fn abandon_is_owner_scoped(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("abandon");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    assert_eq!(
        s.claim(claim(&k, a, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(!s.abandon(&k, b).await.unwrap());
    assert!(s.abandon(&k, a).await.unwrap());
    assert!(!s.abandon(&k, a).await.unwrap(), "idempotent");
    assert_eq!(
        server.command(&["EXISTS", &redis_key(&k, "idem")]),
        Resp::Int(0)
    );
    assert_eq!(
        s.claim(claim(&k, b, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

async fn lapsed_marker_is_claimed_again(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("lapse");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    s.claim(claim(&k, a, Duration::from_millis(50)))
        .await
        .unwrap();
    let record = redis_key(&k, "idem");
    until("the marker to expire", Duration::from_secs(5), || {
        server.command(&["EXISTS", &record]) == Resp::Int(0)
    })
    .await;
    assert_eq!(
        s.claim(claim(&k, b, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let late: Arc<[u8]> = Arc::from(&b"late"[..]);
    assert!(
        !complete_stored(&s, &k, a, late, LONG).await.unwrap(),
        "a lapsed owner cannot complete over the new marker"
    );
    assert!(
        !s.abandon(&k, a).await.unwrap(),
        "nor abandon the new marker"
    );
    assert!(s.abandon(&k, b).await.unwrap());
}

async fn completed_record_lives_for_its_retention(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("retention");
    let a = OwnerToken::new();
    s.claim(claim(&k, a, Duration::from_secs(5))).await.unwrap();
    let record = redis_key(&k, "idem");
    let lease = server.command(&["PTTL", &record]).int().unwrap();
    assert!(
        lease > 4_000 && lease <= 5_000,
        "in-flight lease, PTTL {lease}"
    );
    let day = Duration::from_secs(86_400);
    assert!(
        complete_stored(&s, &k, a, Arc::from(&b"v"[..]), day)
            .await
            .unwrap()
    );
    let kept = server.command(&["PTTL", &record]).int().unwrap();
    assert!(
        kept > 86_000_000 && kept <= 86_400_000,
        "retention, PTTL {kept}"
    );
    assert_eq!(
        server.command(&["HGET", &record, "own"]),
        Resp::Bulk(a.to_string().into_bytes()),
        "the completed record names the owner that completed it"
    );
    assert_eq!(
        server.command(&["HGET", &record, "pl"]),
        Resp::Bulk(b"v".to_vec())
    );
}

async fn binary_payloads_round_trip(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("binary");
    let a = OwnerToken::new();
    let fp = Some(Fingerprint([
        0, 255, 0, 13, 10, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0,
    ]));
    let req = ClaimRequest {
        key: &k,
        owner: a,
        in_flight_lease: LONG,
        fingerprint: fp,
        keep_abandoned_for: None,
        transactional: false,
    };
    s.claim(req.clone()).await.unwrap();
    let payload: Vec<u8> = (0..=255u8).chain([0, 0, b'\r', b'\n']).collect();
    assert!(
        complete_stored(&s, &k, a, Arc::from(payload.as_slice()), LONG)
            .await
            .unwrap()
    );
    match s
        .claim(ClaimRequest {
            owner: OwnerToken::new(),
            ..req
        })
        .await
        .unwrap()
    {
        ClaimOutcome::Completed {
            payload: stored,
            fingerprint,
            ..
        } => {
            assert_eq!(&*stored, payload.as_slice());
            assert_eq!(fingerprint, fp);
        }
        other => panic!("expected completed, got {other:?}"),
    }
    // An empty payload is a payload too.
    let k2 = key("empty");
    s.claim(claim(&k2, a, LONG)).await.unwrap();
    assert!(
        complete_stored(&s, &k2, a, Arc::from(&b""[..]), LONG)
            .await
            .unwrap()
    );
    match s.claim(claim(&k2, OwnerToken::new(), LONG)).await.unwrap() {
        ClaimOutcome::Completed { payload, .. } => assert!(payload.is_empty()),
        other => panic!("expected completed, got {other:?}"),
    }
}

async fn wait_settled_returns_at_once_without_a_marker(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("no-marker");
    let started = Instant::now();
    s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
    let a = OwnerToken::new();
    s.claim(claim(&k, a, LONG)).await.unwrap();
    complete_stored(&s, &k, a, Arc::from(&b"1"[..]), LONG)
        .await
        .unwrap();
    s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

async fn wait_settled_wakes_on_completion_and_abandonment(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    for complete in [true, false] {
        let k = key("settle");
        let a = OwnerToken::new();
        s.claim(claim(&k, a, LONG)).await.unwrap();
        // A waiter subscribes, then reads the marker once (a script that asks PTTL).
        let reads = calls(&server, "pttl");
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (s, k) = (s.clone(), k.clone());
                tokio::spawn(async move {
                    s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
                    Instant::now()
                })
            })
            .collect();
        // After that read, a settle cannot be missed.
        until(
            "the waiters to read the marker",
            Duration::from_secs(5),
            || calls(&server, "pttl") >= reads + 3,
        )
        .await;
        assert_eq!(subscribers(&server, &redis_key(&k, "idem")), 1);
        let published = calls(&server, "publish");
        let settled_at = Instant::now();
        if complete {
            assert!(
                complete_stored(&s, &k, a, Arc::from(&b"1"[..]), LONG)
                    .await
                    .unwrap()
            );
        } else {
            assert!(s.abandon(&k, a).await.unwrap());
        }
        assert_eq!(
            calls(&server, "publish"),
            published + 1,
            "one message wakes every waiter"
        );
        for w in waiters {
            let woke = w.await.unwrap();
            let delay = woke.saturating_duration_since(settled_at);
            assert!(
                delay < Duration::from_secs(2),
                "every waiter is woken: {delay:?}"
            );
        }
    }
}

async fn wait_settled_ends_when_the_marker_expires(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("expiring");
    s.claim(claim(&k, OwnerToken::new(), Duration::from_millis(400)))
        .await
        .unwrap();
    let started = Instant::now();
    s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "bounded by the marker's lease: {waited:?}"
    );
    assert_eq!(
        s.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap(),
        ClaimOutcome::Claimed,
        "the marker is gone when the wait ends"
    );
}

async fn abandoned_marker_is_kept_on_request(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("kept");
    let record = redis_key(&k, "idem");
    let fp = Some(Fingerprint([4; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let req = |owner, lease| ClaimRequest {
        key: &k,
        owner,
        in_flight_lease: lease,
        fingerprint: fp,
        keep_abandoned_for: Some(Duration::from_secs(60)),
        transactional: false,
    };
    assert_eq!(
        s.claim(req(a, Duration::from_millis(300))).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let pttl = server.command(&["PTTL", &record]).int().unwrap();
    assert!(
        pttl > 60_000 && pttl <= 60_300,
        "kept past the lease: PTTL {pttl}"
    );
    match s.claim(req(b, LONG)).await.unwrap() {
        ClaimOutcome::InFlight { remaining, .. } => {
            assert!(
                remaining <= Duration::from_millis(300),
                "the lease, not the keep: {remaining:?}"
            )
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    // A waiter returns when the lease ends: the marker is no longer in flight.
    let started = Instant::now();
    s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The server's own clock decides the lease is over (the waiter's timer is local).
    until(
        "the lease to end on the server",
        Duration::from_secs(5),
        || {
            let now = server.command(&["TIME"]);
            let lx = server.command(&["HGET", &record, "lx"]).text().unwrap();
            match now {
                Resp::Array(t) => {
                    let secs: i64 = t[0].text().unwrap().parse().unwrap();
                    let micros: i64 = t[1].text().unwrap().parse().unwrap();
                    secs * 1000 + micros / 1000 >= lx.parse::<i64>().unwrap()
                }
                other => panic!("TIME answered {other:?}"),
            }
        },
    )
    .await;
    assert_eq!(
        s.claim(req(b, LONG)).await.unwrap(),
        ClaimOutcome::Abandoned { fingerprint: fp },
        "the lapsed marker is reported, not claimed over"
    );
    assert!(matches!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(_)
    ));
    assert!(
        !complete_stored(&s, &k, b, Arc::from(&b"x"[..]), LONG)
            .await
            .unwrap()
    );
    assert!(
        complete_stored(&s, &k, a, Arc::from(&b"late"[..]), LONG)
            .await
            .unwrap(),
        "late owner resolves"
    );
    match s.claim(req(b, LONG)).await.unwrap() {
        ClaimOutcome::Completed {
            payload,
            fingerprint,
            ..
        } => {
            assert_eq!(&*payload, b"late");
            assert_eq!(fingerprint, fp);
        }
        other => panic!("expected completed, got {other:?}"),
    }
    assert!(s.purge(&k).await.unwrap());
    assert!(!s.purge(&k).await.unwrap(), "nothing left to purge");
    assert_eq!(s.claim(req(b, LONG)).await.unwrap(), ClaimOutcome::Claimed);
    // Its owner may also abandon a kept marker.
    assert!(s.abandon(&k, b).await.unwrap());
}

async fn renew_marker_is_owner_scoped(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    use coord_core::provider::RenewOutcome::{Lost, Renewed};
    let (a, b) = (OwnerToken::new(), OwnerToken::new());

    let k = key("renew-marker");
    let record = redis_key(&k, "idem");
    s.claim(claim(&k, a, Duration::from_secs(2))).await.unwrap();
    assert!(matches!(
        s.renew_marker(&k, b, LONG).await.unwrap(),
        Lost(_)
    ));
    assert_eq!(s.renew_marker(&k, a, LONG).await.unwrap(), Renewed);
    let pttl = server.command(&["PTTL", &record]).int().unwrap();
    assert!(pttl > 25_000 && pttl <= 30_000, "renewed: PTTL {pttl}");
    complete_stored(&s, &k, a, Arc::from(&b"1"[..]), LONG)
        .await
        .unwrap();
    assert!(
        matches!(s.renew_marker(&k, a, LONG).await.unwrap(), Lost(_)),
        "completed"
    );

    // A kept marker: renewal moves its lease end and keeps the keep period after it.
    let k = key("renew-kept");
    let record = redis_key(&k, "idem");
    s.claim(ClaimRequest {
        keep_abandoned_for: Some(Duration::from_secs(100)),
        ..claim(&k, a, Duration::from_secs(2))
    })
    .await
    .unwrap();
    assert_eq!(s.renew_marker(&k, a, LONG).await.unwrap(), Renewed);
    let pttl = server.command(&["PTTL", &record]).int().unwrap();
    assert!(
        pttl > 125_000 && pttl <= 130_000,
        "lease + keep: PTTL {pttl}"
    );
    match s.claim(claim(&k, b, LONG)).await.unwrap() {
        ClaimOutcome::InFlight { remaining, .. } => {
            assert!(
                remaining > Duration::from_secs(25),
                "renewed lease: {remaining:?}"
            )
        }
        other => panic!("expected in flight, got {other:?}"),
    }

    let gone = key("renew-gone");
    assert!(matches!(
        s.renew_marker(&gone, a, LONG).await.unwrap(),
        Lost(_)
    ));
}

async fn purge_removes_any_record_and_wakes_waiters(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let k = key("purge");
    assert!(!s.purge(&k).await.unwrap());
    let a = OwnerToken::new();
    s.claim(claim(&k, a, LONG)).await.unwrap();
    let reads = calls(&server, "pttl");
    let waiter = tokio::spawn({
        let (s, k) = (s.clone(), k.clone());
        async move {
            s.wait_settled(&k, Duration::from_secs(20)).await.unwrap();
            Instant::now()
        }
    });
    until(
        "the waiter to look at the marker",
        Duration::from_secs(5),
        || calls(&server, "pttl") > reads,
    )
    .await;
    let purged_at = Instant::now();
    assert!(s.purge(&k).await.unwrap());
    let woke = waiter.await.unwrap();
    assert!(woke.saturating_duration_since(purged_at) < Duration::from_secs(2));
    assert_eq!(
        s.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
}

async fn settling_a_record_nobody_waits_for_publishes_nothing(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let published = calls(&server, "publish");
    for i in 0..10 {
        let k = key(&format!("quiet-{i}"));
        let a = OwnerToken::new();
        assert_eq!(
            s.claim(claim(&k, a, LONG)).await.unwrap(),
            ClaimOutcome::Claimed
        );
        if i % 2 == 0 {
            assert!(
                complete_stored(&s, &k, a, Arc::from(&b"1"[..]), LONG)
                    .await
                    .unwrap()
            );
        } else {
            assert!(s.abandon(&k, a).await.unwrap());
        }
    }
    assert_eq!(calls(&server, "publish"), published);
}

async fn a_resent_claim_of_the_live_marker_is_claimed_again(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    for keep in [None, Some(Duration::from_secs(60))] {
        let k = key("resend-claim");
        let record = redis_key(&k, "idem");
        let req = |owner| ClaimRequest {
            key: &k,
            owner,
            in_flight_lease: LONG,
            fingerprint: Some(Fingerprint([3; 16])),
            keep_abandoned_for: keep,
            transactional: false,
        };
        assert_eq!(s.claim(req(a)).await.unwrap(), ClaimOutcome::Claimed);
        let before = server.command(&["HGETALL", &record]);
        // The first send landed, its reply was lost: the resend is told it holds the marker.
        assert_eq!(
            s.claim(req(a)).await.unwrap(),
            ClaimOutcome::Claimed,
            "{keep:?}"
        );
        assert_eq!(
            server.command(&["HGETALL", &record]),
            before,
            "a resend changes nothing"
        );
        assert!(
            matches!(
                s.claim(req(b)).await.unwrap(),
                ClaimOutcome::InFlight { .. }
            ),
            "still exclusive for everyone else"
        );
        let payload: Arc<[u8]> = Arc::from(&b"done"[..]);
        assert_eq!(
            complete(&s, &k, a, &payload, None).await.unwrap(),
            CompleteOutcome::Stored
        );
        // Once completed, the owner's claim replays like anyone's.
        match s.claim(req(a)).await.unwrap() {
            ClaimOutcome::Completed { payload: p, .. } => assert_eq!(&*p, b"done"),
            other => panic!("expected completed, got {other:?}"),
        }
    }
}

async fn a_completion_without_marker_creates_the_record(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let fp = Some(Fingerprint([0xab; 16]));
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let k = key("no-marker");
    let record = redis_key(&k, "idem");
    s.claim(ClaimRequest {
        fingerprint: fp,
        ..claim(&k, a, Duration::from_millis(50))
    })
    .await
    .unwrap();
    until("the marker to lapse", Duration::from_secs(5), || {
        server.command(&["EXISTS", &record]) == Resp::Int(0)
    })
    .await;
    // Nobody claimed meanwhile: the late outcome is stored, with the claim's fingerprint.
    let payload: Arc<[u8]> = Arc::from(&b"late but stored"[..]);
    assert_eq!(
        complete(&s, &k, a, &payload, fp).await.unwrap(),
        CompleteOutcome::StoredWithoutMarker
    );
    let pttl = server.command(&["PTTL", &record]).int().unwrap();
    assert!(pttl > 25_000 && pttl <= 30_000, "retention: PTTL {pttl}");
    assert_eq!(
        server.command(&["HGET", &record, "own"]),
        Resp::Bulk(a.to_string().into_bytes())
    );
    // The resend of that completion finds its own record.
    assert_eq!(
        complete(&s, &k, a, &payload, fp).await.unwrap(),
        CompleteOutcome::Stored
    );
    // A duplicate with the same parameters replays it, fingerprint included.
    match s
        .claim(ClaimRequest {
            fingerprint: fp,
            ..claim(&k, b, LONG)
        })
        .await
        .unwrap()
    {
        ClaimOutcome::Completed {
            payload: stored,
            fingerprint,
            ..
        } => {
            assert_eq!(&*stored, &*payload);
            assert_eq!(fingerprint, fp);
        }
        other => panic!("expected completed, got {other:?}"),
    }
    // Another owner completing now finds a completed record that is not its own.
    assert_eq!(
        complete(&s, &k, b, &payload, fp).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(a),
            completed: true
        }
    );

    // Without a fingerprint, none is stored.
    let k = key("no-marker-no-fp");
    assert_eq!(
        complete(&s, &k, a, &payload, None).await.unwrap(),
        CompleteOutcome::StoredWithoutMarker
    );
    match s.claim(claim(&k, b, LONG)).await.unwrap() {
        ClaimOutcome::Completed { fingerprint, .. } => assert_eq!(fingerprint, None),
        other => panic!("expected completed, got {other:?}"),
    }
}

async fn a_late_completion_after_another_claim_is_superseded(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let k = key("superseded");
    let record = redis_key(&k, "idem");
    s.claim(claim(&k, a, Duration::from_millis(50)))
        .await
        .unwrap();
    until("the marker to lapse", Duration::from_secs(5), || {
        server.command(&["EXISTS", &record]) == Resp::Int(0)
    })
    .await;
    assert_eq!(
        s.claim(claim(&k, b, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    let before = server.command(&["HGETALL", &record]);
    let late: Arc<[u8]> = Arc::from(&b"late"[..]);
    assert_eq!(
        complete(&s, &k, a, &late, None).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(b),
            completed: false
        }
    );
    assert_eq!(
        server.command(&["HGETALL", &record]),
        before,
        "nothing written over the other marker"
    );
    assert!(matches!(
        s.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap(),
        ClaimOutcome::InFlight { .. }
    ));

    // The other owner's kept, lapsed marker is not ours to resolve either.
    let k = key("superseded-kept");
    let record = redis_key(&k, "idem");
    s.claim(ClaimRequest {
        keep_abandoned_for: Some(LONG),
        ..claim(&k, b, Duration::from_millis(50))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        complete(&s, &k, a, &late, None).await.unwrap(),
        CompleteOutcome::Superseded {
            other: Some(b),
            completed: false
        }
    );
    assert_eq!(
        server.command(&["HGET", &record, "st"]),
        Resp::Bulk(b"i".to_vec())
    );
}

async fn renew_marker_reports_why_the_marker_is_lost(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let payload: Arc<[u8]> = Arc::from(&b"1"[..]);
    let expired = RenewOutcome::Lost(LossCause::Expired);
    let taken = RenewOutcome::Lost(LossCause::TakenByOther);

    let k = key("renew-cause");
    assert_eq!(s.renew_marker(&k, a, LONG).await.unwrap(), expired, "free");
    s.claim(claim(&k, b, LONG)).await.unwrap();
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        taken,
        "another owner's marker"
    );
    complete(&s, &k, b, &payload, None).await.unwrap();
    assert_eq!(
        s.renew_marker(&k, a, LONG).await.unwrap(),
        taken,
        "another owner's completed record"
    );
    assert_eq!(
        s.renew_marker(&k, b, LONG).await.unwrap(),
        expired,
        "our own completed record: nothing in flight"
    );

    // A kept marker past its lease is lapsed for its owner, taken for anyone else.
    let k = key("renew-cause-kept");
    s.claim(ClaimRequest {
        keep_abandoned_for: Some(LONG),
        ..claim(&k, a, Duration::from_millis(50))
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(s.renew_marker(&k, a, LONG).await.unwrap(), expired);
    assert_eq!(s.renew_marker(&k, b, LONG).await.unwrap(), taken);

    // A marker whose lease ran out is gone: expired.
    let k = key("renew-cause-lapsed");
    s.claim(claim(&k, a, Duration::from_millis(50)))
        .await
        .unwrap();
    let record = redis_key(&k, "idem");
    until("the marker to lapse", Duration::from_secs(5), || {
        server.command(&["EXISTS", &record]) == Resp::Int(0)
    })
    .await;
    assert_eq!(s.renew_marker(&k, a, LONG).await.unwrap(), expired);
}

async fn old_completed_records_without_owner_still_replay(client: Client) {
    let server = RedisServer::start();
    let s = provider(&server, client).await;
    // A record completed before completed records kept their owner.
    let k = key("old-record");
    let record = redis_key(&k, "idem");
    server.command(&["HSET", &record, "st", "c", "fp", "", "pl", "old"]);
    server.command(&["PEXPIRE", &record, "30000"]);
    match s.claim(claim(&k, OwnerToken::new(), LONG)).await.unwrap() {
        ClaimOutcome::Completed { payload, age, .. } => {
            assert_eq!(&*payload, b"old");
            assert_eq!(age, None, "a record without a write time has no known age");
        }
        other => panic!("expected completed, got {other:?}"),
    }
    let payload: Arc<[u8]> = Arc::from(&b"new"[..]);
    assert_eq!(
        complete(&s, &k, OwnerToken::new(), &payload, None)
            .await
            .unwrap(),
        CompleteOutcome::Superseded {
            other: None,
            completed: true
        }
    );
}
