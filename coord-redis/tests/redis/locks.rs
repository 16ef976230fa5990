//! Lock semantics against a real redis-server, for every client.

use crate::support;

use std::time::{Duration, Instant};

use coord_core::provider::{
    BackendErrorKind, ClaimOutcome, CompleteOutcome, CompleteRequest, IdempotencyStore,
    LockProvider, LockRequest, OwnerToken, ReleaseOutcome, RenewOutcome,
};
use coord_core::{CallKey, LossCause};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    single_attempt_is_refused_while_held,
    release_is_owner_scoped_and_idempotent,
    lapsed_release_reports_not_held,
    release_hands_off_to_a_waiter,
    renew_extends_only_the_owners_lease,
    fencing_tokens_strictly_increase,
    fence_counter_exists_only_for_fenced_locks_and_expires,
    release_wakes_exactly_one_waiter,
    waiters_in_one_process_are_served_in_order,
    a_cancelled_head_passes_the_wake_up_on,
    waiting_leaves_no_subscription_behind,
    only_a_lock_someone_waits_for_publishes_its_release,
    a_resent_acquire_is_granted_again,
    out_of_memory_is_typed_and_passes,
);

async fn single_attempt_is_refused_while_held(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("single");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    let grant = p.acquire(lock(&k, a, LONG, Duration::ZERO)).await.unwrap();
    let grant = grant.expect("a free lock is granted");
    assert!(!grant.contended);
    assert_eq!(grant.fencing_token, None);
    // The owner token is what the lock key holds, as 32 hex characters.
    assert_eq!(
        server.command(&["GET", &redis_key(&k, "lock")]),
        Resp::Bulk(a.to_string().into_bytes())
    );
    assert_eq!(
        p.acquire(lock(&k, b, LONG, Duration::ZERO)).await.unwrap(),
        None
    );
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    assert!(
        p.acquire(lock(&k, b, LONG, Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
}

async fn release_is_owner_scoped_and_idempotent(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("owner");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(
        p.acquire(lock(&k, b, LONG, Duration::ZERO)).await.unwrap(),
        None
    );
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::NotHeld);
    assert_eq!(
        server.command(&["EXISTS", &redis_key(&k, "lock")]),
        Resp::Int(0)
    );
}

async fn lapsed_release_reports_not_held(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("lapsed");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, Duration::from_millis(50), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let lock_key = redis_key(&k, "lock");
    until("the lease to run out", Duration::from_secs(5), || {
        server.command(&["EXISTS", &lock_key]) == Resp::Int(0)
    })
    .await;
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::NotHeld);
    assert!(matches!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(_)
    ));
}

async fn release_hands_off_to_a_waiter(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("handoff");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = spawn_acquire(
        &p,
        lock(&k, OwnerToken::new(), LONG, Duration::from_secs(20)),
    );
    let channel = redis_key(&k, "lock");
    until("the waiter to subscribe", Duration::from_secs(5), || {
        subscribers(&server, &channel) == 1
    })
    .await;
    let released_at = Instant::now();
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    let Acquired {
        grant,
        owner: b,
        at: granted_at,
    } = waiter.await.unwrap();
    let grant = grant.expect("the waiter gets the lock");
    assert!(grant.contended);
    let handoff = granted_at.saturating_duration_since(released_at);
    // The holder's lease is 30 s, so the backstop would fire after one second: anything
    // well under that was the release message.
    assert!(
        handoff < Duration::from_millis(700),
        "hand-off took {handoff:?}"
    );
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
}

async fn renew_extends_only_the_owners_lease(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("renew");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(lock(&k, a, Duration::from_secs(2), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.renew(&k, b, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther),
        "another owner holds it"
    );
    assert_eq!(p.renew(&k, a, LONG).await.unwrap(), RenewOutcome::Renewed);
    let pttl = server
        .command(&["PTTL", &redis_key(&k, "lock")])
        .int()
        .unwrap();
    assert!(
        pttl > 20_000 && pttl <= 30_000,
        "renewed lease, PTTL {pttl}"
    );
    p.release(&k, a).await.unwrap();
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired),
        "free"
    );

    // A lease that ran out: expired; once someone else took the lock: taken.
    let k = key("renew-lapsed");
    p.acquire(lock(&k, a, Duration::from_millis(50), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let name = redis_key(&k, "lock");
    until("the lease to end", Duration::from_secs(5), || {
        server.command(&["EXISTS", &name]) == Resp::Int(0)
    })
    .await;
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::Expired)
    );
    p.acquire(lock(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    // A waiter's mark on the holder's value does not make it anyone else's.
    let c = OwnerToken::new();
    let waiter = spawn_acquire(&p, lock(&k, c, LONG, Duration::from_secs(20)));
    until(
        "the waiter to mark the holder",
        Duration::from_secs(5),
        || server.command(&["GET", &name]) == Resp::Bulk(format!("{b}*").into_bytes()),
    )
    .await;
    assert_eq!(p.renew(&k, b, LONG).await.unwrap(), RenewOutcome::Renewed);
    assert_eq!(
        p.renew(&k, a, LONG).await.unwrap(),
        RenewOutcome::Lost(LossCause::TakenByOther)
    );
    p.release(&k, b).await.unwrap();
    assert!(waiter.await.unwrap().grant.is_some());
}

async fn a_resent_acquire_is_granted_again(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let a = OwnerToken::new();
    for fenced_lock in [false, true] {
        let k = key("resend-acquire");
        let req = || LockRequest {
            fenced: fenced_lock,
            ..lock(&k, a, Duration::from_secs(5), Duration::ZERO)
        };
        let first = p.acquire(req()).await.unwrap().expect("free");
        // The first send landed and its reply was lost: the resend is granted too.
        let again = p
            .acquire(req())
            .await
            .unwrap()
            .expect("our own token counts as taken");
        assert_eq!(again.fencing_token.is_some(), fenced_lock);
        if fenced_lock {
            assert!(again.fencing_token > first.fencing_token);
        }
        let pttl = server
            .command(&["PTTL", &redis_key(&k, "lock")])
            .int()
            .unwrap();
        assert!(pttl > 3_000 && pttl <= 5_000, "still held: PTTL {pttl}");
        assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::NotHeld);
    }
}

async fn fencing_tokens_strictly_increase(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("fence");
    let mut last = 0u64;
    for round in 0..6 {
        let me = OwnerToken::new();
        let grant = p
            .acquire(fenced(&k, me, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        let token = grant
            .fencing_token
            .expect("fenced grants carry a token")
            .get();
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
        if round == 3 {
            // The counter expiring (simulated) must not make tokens go back.
            server.command(&["DEL", &redis_key(&k, "fence")]);
        }
        p.release(&k, me).await.unwrap();
    }
    // A contended, fenced hand-off mints a bigger token too.
    let a = OwnerToken::new();
    let first = p
        .acquire(fenced(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (p, k) = (p.clone(), k.clone());
        async move {
            let b = OwnerToken::new();
            p.acquire(fenced(&k, b, LONG, Duration::from_secs(20)))
                .await
                .unwrap()
        }
    });
    let channel = redis_key(&k, "lock");
    until("the waiter to subscribe", Duration::from_secs(5), || {
        subscribers(&server, &channel) == 1
    })
    .await;
    p.release(&k, a).await.unwrap();
    let second = waiter.await.unwrap().expect("handed over");
    assert!(second.contended);
    assert!(second.fencing_token.unwrap() > first.fencing_token.unwrap());
    assert!(first.fencing_token.unwrap().get() > last);
}

async fn fence_counter_exists_only_for_fenced_locks_and_expires(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("fence-ttl");
    let fence_key = redis_key(&k, "fence");
    let a = OwnerToken::new();
    let grant = p
        .acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(grant.fencing_token, None);
    p.release(&k, a).await.unwrap();
    assert_eq!(
        server.command(&["EXISTS", &fence_key]),
        Resp::Int(0),
        "unfenced: no counter"
    );

    let b = OwnerToken::new();
    p.acquire(fenced(&k, b, Duration::from_secs(5), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let pttl = server.command(&["PTTL", &fence_key]).int().unwrap();
    // Kept for max(10 × lease, 1 h) after the mint, then gone.
    assert!(pttl > 3_500_000 && pttl <= 3_600_000, "counter PTTL {pttl}");
    p.release(&k, b).await.unwrap();

    let c = OwnerToken::new();
    p.acquire(fenced(&k, c, Duration::from_secs(1000), Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let pttl = server.command(&["PTTL", &fence_key]).int().unwrap();
    assert!(
        pttl > 9_900_000 && pttl <= 10_000_000,
        "counter PTTL {pttl}"
    );
    p.release(&k, c).await.unwrap();
}

async fn release_wakes_exactly_one_waiter(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("wake-one");
    let lock_key = redis_key(&k, "lock");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let queue = redis_key(&k, "lock-queue");
    let spawn_waiter = |wait| spawn_acquire(&p, lock(&k, OwnerToken::new(), LONG, wait));
    // Each waiter stands in the lock's queue in Redis, in the order they came.
    let queued = |n: i64| {
        let (server, queue) = (&server, queue.clone());
        async move {
            until("the waiters to queue", Duration::from_secs(5), || {
                server.command(&["LLEN", &queue]).int() == Some(n)
            })
            .await
        }
    };
    let first = spawn_waiter(Duration::from_secs(20));
    queued(1).await;
    // The second joins behind the first in this process, without a command (only its
    // process's head stands in Redis); if it were slower than the release, it would find the
    // lock held by the first waiter and wait all the same, so the assertions below hold
    // either way.
    let second_wait = Duration::from_millis(2500);
    let second_started = Instant::now();
    let second = spawn_waiter(second_wait);
    tokio::task::yield_now().await;
    assert_eq!(p.release(&k, a).await.unwrap(), ReleaseOutcome::Released);
    let first = first.await.unwrap();
    assert!(first.grant.is_some(), "the first waiter is handed the lock");
    // The second, head of its process's waiters now, stands in the queue in Redis.
    queued(1).await;
    let winner = first.owner;
    // The second waiter, head of the queue now, may have marked the winner's lock already.
    let Resp::Bulk(stored) = server.command(&["GET", &lock_key]) else {
        panic!("the winner's lock is stored");
    };
    let token = winner.to_string().into_bytes();
    assert!(
        stored == token || stored == [token.as_slice(), b"*"].concat(),
        "the lock holds the winner's token: {:?}",
        String::from_utf8_lossy(&stored)
    );
    let second = second.await.unwrap();
    let waited = second.at.saturating_duration_since(second_started);
    assert!(
        second.grant.is_none(),
        "one release, one wake: the second waiter stays waiting"
    );
    assert!(
        waited >= second_wait,
        "the second waiter gave up only at its timeout: {waited:?}"
    );
    assert_eq!(
        p.release(&k, winner).await.unwrap(),
        ReleaseOutcome::Released
    );
}

async fn waiters_in_one_process_are_served_in_order(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("fifo");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let sets = calls(&server, "set");
        let (p, k, tx) = (p.clone(), k.clone(), tx.clone());
        let (polled_tx, polled) = tokio::sync::oneshot::channel();
        tasks.push(tokio::spawn(async move {
            let me = OwnerToken::new();
            let mut acquiring =
                std::pin::pin!(p.acquire(lock(&k, me, LONG, Duration::from_secs(20))));
            // A waiter behind another of its process joins the queue in its first poll,
            // without a command: tell the test once that poll is done.
            let first =
                std::future::poll_fn(|cx| std::task::Poll::Ready(acquiring.as_mut().poll(cx)))
                    .await;
            polled_tx.send(()).unwrap();
            let grant = match first {
                std::task::Poll::Ready(grant) => grant,
                std::task::Poll::Pending => acquiring.await,
            };
            grant.unwrap().expect("every waiter gets its turn");
            tx.send(i).unwrap();
            p.release(&k, me).await.unwrap();
        }));
        polled.await.unwrap();
        if i == 0 {
            // The first waiter looks in Redis: its first attempt and its retry.
            until("the waiter to queue", Duration::from_secs(5), || {
                calls(&server, "set") >= sets + 2
            })
            .await;
        }
    }
    p.release(&k, a).await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let mut order = Vec::new();
    while let Ok(i) = rx.try_recv() {
        order.push(i);
    }
    assert_eq!(
        order,
        vec![0, 1, 2, 3],
        "first come, first served within a process"
    );
}

async fn a_cancelled_head_passes_the_wake_up_on(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("cancelled-head");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let queue = redis_key(&k, "lock-queue");
    let queued = |n: i64| {
        let (server, queue) = (&server, queue.clone());
        async move {
            until("the waiters to queue", Duration::from_secs(5), || {
                server.command(&["LLEN", &queue]).int() == Some(n)
            })
            .await
        }
    };
    let head = spawn_acquire(&p, lock(&k, OwnerToken::new(), LONG, LONG));
    queued(1).await;
    // Behind the head in this process: it stands in Redis once the head leaves. Joined or
    // not yet when the head is cancelled, it gets the lock from the release below.
    let next = spawn_acquire(
        &p,
        lock(&k, OwnerToken::new(), LONG, Duration::from_secs(20)),
    );
    tokio::task::yield_now().await;
    head.abort();
    let _ = head.await;
    let released_at = Instant::now();
    p.release(&k, a).await.unwrap();
    let next = next.await.unwrap();
    assert!(next.grant.is_some(), "the remaining waiter gets the lock");
    let me = next.owner;
    let handoff = next.at.saturating_duration_since(released_at);
    assert!(
        handoff < Duration::from_millis(700),
        "handed the lock by the release: {handoff:?}"
    );
    p.release(&k, me).await.unwrap();
}

async fn waiting_leaves_no_subscription_behind(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("unsubscribe");
    let channel = redis_key(&k, "lock");
    let a = OwnerToken::new();
    p.acquire(lock(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let refused = p
        .acquire(lock(
            &k,
            OwnerToken::new(),
            LONG,
            Duration::from_millis(300),
        ))
        .await
        .unwrap();
    assert_eq!(refused, None);
    until(
        "the channel to be unsubscribed",
        Duration::from_secs(5),
        || subscribers(&server, &channel) == 0,
    )
    .await;
    // One subscriber connection serves every waiter of the provider.
    let waiters: Vec<_> = (0..8)
        .map(|i| {
            let (p, k) = (p.clone(), nth(&k, i));
            tokio::spawn(async move {
                let holder = OwnerToken::new();
                p.acquire(lock(&k, holder, LONG, Duration::ZERO))
                    .await
                    .unwrap()
                    .unwrap();
                p.acquire(lock(
                    &k,
                    OwnerToken::new(),
                    LONG,
                    Duration::from_millis(500),
                ))
                .await
                .unwrap()
            })
        })
        .collect();
    until("the waiters to subscribe", Duration::from_secs(5), || {
        (0..8).all(|i| subscribers(&server, &redis_key(&nth(&k, i), "lock")) == 1)
    })
    .await;
    let pubsub_clients = match server.command(&["CLIENT", "LIST", "TYPE", "PUBSUB"]) {
        Resp::Bulk(text) => String::from_utf8_lossy(&text).lines().count(),
        other => panic!("CLIENT LIST answered {other:?}"),
    };
    assert_eq!(pubsub_clients, 1, "one shared subscriber connection");
    for w in waiters {
        assert_eq!(w.await.unwrap(), None);
    }
}

async fn only_a_lock_someone_waits_for_publishes_its_release(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let q = provider(&server, client).await;
    let k = key("publish");
    let lock_key = redis_key(&k, "lock");
    let publishes = calls(&server, "publish");
    for fenced_lock in [false, true] {
        for _ in 0..20 {
            let me = OwnerToken::new();
            let request = if fenced_lock {
                fenced(&k, me, LONG, Duration::ZERO)
            } else {
                lock(&k, me, LONG, Duration::ZERO)
            };
            p.acquire(request).await.unwrap().unwrap();
            assert_eq!(p.release(&k, me).await.unwrap(), ReleaseOutcome::Released);
        }
    }
    assert_eq!(
        calls(&server, "publish"),
        publishes,
        "nobody waited: no release published"
    );

    for fenced_lock in [false, true] {
        let holder = OwnerToken::new();
        let request = |me, wait| {
            if fenced_lock {
                fenced(&k, me, LONG, wait)
            } else {
                lock(&k, me, LONG, wait)
            }
        };
        p.acquire(request(holder, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        // A waiter of another process: the release names it in one message (one of the
        // releasing process is told in memory, without one).
        let waiter = spawn_acquire(&q, request(OwnerToken::new(), Duration::from_secs(20)));
        let marked = Resp::Bulk(format!("{holder}*").into_bytes());
        until(
            "the waiter to mark the holder",
            Duration::from_secs(5),
            || server.command(&["GET", &lock_key]) == marked,
        )
        .await;
        // Renewal keeps the mark; the release hands the lock over and publishes once.
        assert_eq!(
            p.renew(&k, holder, LONG).await.unwrap(),
            RenewOutcome::Renewed
        );
        assert_eq!(server.command(&["GET", &lock_key]), marked);
        let before = calls(&server, "publish");
        assert_eq!(
            p.release(&k, holder).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(calls(&server, "publish"), before + 1);
        let Acquired { grant, owner, .. } = waiter.await.unwrap();
        let grant = grant.expect("the waiter takes the lock");
        assert!(grant.contended);
        assert_eq!(grant.fencing_token.is_some(), fenced_lock);
        // Nobody waits for the new holder: its release publishes nothing.
        assert_eq!(
            q.release(&k, owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(calls(&server, "publish"), before + 1);
    }
}

/// A server at its `maxmemory` under `noeviction` refuses writes with `OOM`: acquiring,
/// claiming and completing report `OutOfMemory` (retryable), releasing still works (a delete
/// frees memory), and once memory is available again everything works.
async fn out_of_memory_is_typed_and_passes(client: Client) {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let p = provider(&server, client).await;
    let held = key("oom-held");
    let a = OwnerToken::new();
    // Warm the script cache and hold one lock before memory runs out.
    p.acquire(fenced(&held, a, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    p.claim(claim(&key("oom-warm"), a, LONG)).await.unwrap();

    let info = server.command(&["INFO", "memory"]).text().unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO reports used_memory");
    let limit = (used + 2 * 1024 * 1024).to_string();
    server.command(&["CONFIG", "SET", "maxmemory", &limit]);
    let filler = "x".repeat(64 * 1024);
    let mut filled = 0;
    loop {
        match server.command(&["SET", &format!("filler:{filled}"), &filler]) {
            Resp::Error(e) => {
                assert!(e.starts_with("OOM"), "{e}");
                break;
            }
            _ => filled += 1,
        }
        assert!(filled < 10_000, "the server never ran out of memory");
    }
    // The refused command's own buffers (and the helper's fresh connection) counted while it
    // ran; once they are freed there may be room for a small write again. Put the limit just
    // under what the data now takes, so every write is refused.
    let info = server.command(&["INFO", "memory"]).text().unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO reports used_memory");
    let limit = (used - 256 * 1024).to_string();
    server.command(&["CONFIG", "SET", "maxmemory", &limit]);

    let k = key("oom");
    let b = OwnerToken::new();
    let expect_oom = |result: Result<String, coord_core::BackendError>, what: &str| match result {
        Err(err) => {
            assert_eq!(err.kind(), BackendErrorKind::OutOfMemory, "{what}: {err:?}");
            assert!(err.kind().is_transient(), "{what}: retryable");
            assert_eq!(err.key(), Some(&k), "{what}: names the key");
        }
        Ok(v) => panic!("{what}: expected OutOfMemory, got {v}"),
    };
    let show = |v: &dyn std::fmt::Debug| format!("{v:?}");
    expect_oom(
        p.acquire(lock(&k, b, LONG, Duration::ZERO))
            .await
            .map(|g| show(&g)),
        "acquire",
    );
    expect_oom(
        p.acquire(lock(&k, b, LONG, Duration::from_millis(200)))
            .await
            .map(|g| show(&g)),
        "waiting acquire",
    );
    expect_oom(
        p.acquire(fenced(&k, b, LONG, Duration::ZERO))
            .await
            .map(|g| show(&g)),
        "fenced acquire",
    );
    expect_oom(p.claim(claim(&k, b, LONG)).await.map(|c| show(&c)), "claim");
    let complete = || {
        p.complete(CompleteRequest {
            key: &k,
            owner: b,
            payload: std::sync::Arc::from(&b"outcome"[..]),
            retention: LONG,
            fingerprint: None,
        })
    };
    expect_oom(complete().await.map(|c| show(&c)), "complete");
    // Nothing was half-written by the refused calls.
    for kind in ["lock", "fence", "idem"] {
        assert_eq!(
            server.command(&["EXISTS", &redis_key(&k, kind)]),
            Resp::Int(0),
            "{kind}"
        );
    }
    // Releasing only deletes: a held lock can still be given back.
    assert_eq!(p.release(&held, a).await.unwrap(), ReleaseOutcome::Released);

    // Memory is available again: everything works.
    server.command(&["CONFIG", "SET", "maxmemory", "0"]);
    let grant = p
        .acquire(fenced(&k, b, LONG, Duration::ZERO))
        .await
        .unwrap()
        .expect("granted once memory is freed");
    assert!(grant.fencing_token.is_some());
    assert_eq!(p.release(&k, b).await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        p.claim(claim(&k, b, LONG)).await.unwrap(),
        ClaimOutcome::Claimed
    );
    assert_eq!(complete().await.unwrap(), CompleteOutcome::Stored);
}

/// The `i`th of a family of keys next to `k` (same namespace and operation, one more part).
fn nth(k: &CallKey, i: usize) -> CallKey {
    let op = k.operation().expect("a built key");
    CallKey::builder(k.namespace(), op).part(&i).finish()
}
