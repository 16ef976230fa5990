//! The release hands a contended lock to the first waiter in the same script: what the waiter
//! sends (nothing in the releasing process, one confirming look in another), what a cancelled
//! waiter leaves, and the fencing tokens across hand-overs. Counts and orders, not clocks.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_core::provider::{LockProvider, OwnerToken, ReleaseOutcome};
use coord_redis::Client;
use coord_redis_testing::{Monitor, RedisServer, Resp};
use support::*;

per_client!(
    a_waiter_of_the_releasing_process_holds_without_a_command,
    a_waiter_of_another_process_confirms_with_one_look,
    a_cancelled_waiter_never_ends_up_holding,
    fencing_tokens_grow_across_hand_overs,
);

/// Waits until the lock's queue in Redis holds `n` entries.
async fn queued(server: &RedisServer, queue: &str, n: i64) {
    until(
        "the waiters to stand in the queue",
        Duration::from_secs(10),
        || server.command(&["LLEN", queue]).int() == Some(n),
    )
    .await;
}

/// Loads the scripts a hand-over runs (a first run on a fresh server also sends the source).
async fn warm(p: &coord_redis::RedisProvider) {
    let k = key("warm");
    let (a, b) = (OwnerToken::new(), OwnerToken::new());
    p.acquire(fenced(&k, a, LONG, Duration::ZERO))
        .await
        .unwrap();
    let waiter = spawn_acquire(p, fenced(&k, b, LONG, LONG));
    let got = waiter;
    p.release(&k, a).await.unwrap();
    let got = got.await.unwrap();
    p.release(&k, got.owner).await.unwrap();
}

/// The commands clients sent since the last drain, leaving out the waiters' unsubscriptions
/// (sent once they left, after the hand-over: not part of taking the lock).
fn sent_by_clients(monitor: &Monitor) -> Vec<String> {
    monitor
        .client_commands()
        .into_iter()
        .filter(|c| c != "unsubscribe")
        .collect()
}

fn holder_of(server: &RedisServer, lock: &str) -> Option<String> {
    match server.command(&["GET", lock]) {
        Resp::Bulk(v) => Some(String::from_utf8(v).unwrap()),
        _ => None,
    }
}

async fn a_waiter_of_the_releasing_process_holds_without_a_command(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    warm(&p).await;
    for fenced_lock in [false, true] {
        let k = key("local");
        let (lock_key, queue) = (redis_key(&k, "lock"), redis_key(&k, "lock-queue"));
        let request = |me, wait| {
            if fenced_lock {
                fenced(&k, me, LONG, wait)
            } else {
                lock(&k, me, LONG, wait)
            }
        };
        let holder = OwnerToken::new();
        let first = p.acquire(request(holder, Duration::ZERO)).await.unwrap();
        let first = first.expect("a free lock is granted");
        let waiter = spawn_acquire(&p, request(OwnerToken::new(), LONG));
        queued(&server, &queue, 1).await;
        let monitor = Monitor::start(&server);
        monitor.drain();
        assert_eq!(
            p.release(&k, holder).await.unwrap(),
            ReleaseOutcome::Released
        );
        let got = waiter.await.unwrap();
        let grant = got.grant.expect("handed the lock");
        assert!(grant.contended);
        let sent = sent_by_clients(&monitor);
        assert_eq!(
            sent,
            ["evalsha"],
            "fenced {fenced_lock}: the release alone, the waiter sent nothing"
        );
        assert_eq!(
            holder_of(&server, &lock_key).as_deref(),
            Some(got.owner.to_string().as_str()),
            "the waiter holds the lock in Redis"
        );
        let pttl = server.command(&["PTTL", &lock_key]).int().unwrap();
        assert!(
            pttl > (LONG - Duration::from_secs(5)).as_millis() as i64,
            "with its whole lease: {pttl} ms"
        );
        if fenced_lock {
            let (before, after) = (first.fencing_token.unwrap(), grant.fencing_token.unwrap());
            assert!(after > before, "{after:?} after {before:?}");
        } else {
            assert_eq!(grant.fencing_token, None);
        }
        assert_eq!(
            p.release(&k, got.owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        drop(monitor);
    }
}

async fn a_waiter_of_another_process_confirms_with_one_look(client: Client) {
    let server = RedisServer::start();
    let releaser = provider(&server, client).await;
    let other = provider(&server, client).await;
    warm(&releaser).await;
    warm(&other).await;
    let k = key("remote");
    let (lock_key, queue) = (redis_key(&k, "lock"), redis_key(&k, "lock-queue"));
    let holder = OwnerToken::new();
    releaser
        .acquire(fenced(&k, holder, LONG, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = spawn_acquire(&other, fenced(&k, OwnerToken::new(), LONG, LONG));
    queued(&server, &queue, 1).await;
    let monitor = Monitor::start(&server);
    monitor.drain();
    assert_eq!(
        releaser.release(&k, holder).await.unwrap(),
        ReleaseOutcome::Released
    );
    let got = waiter.await.unwrap();
    assert!(got.grant.expect("handed the lock").fencing_token.is_some());
    // The release, then the waiter's confirming look: no acquire of its own.
    assert_eq!(sent_by_clients(&monitor), ["evalsha", "evalsha"]);
    assert_eq!(
        holder_of(&server, &lock_key).as_deref(),
        Some(got.owner.to_string().as_str())
    );
    let pttl = server.command(&["PTTL", &lock_key]).int().unwrap();
    assert!(
        pttl > (LONG - Duration::from_secs(5)).as_millis() as i64,
        "the confirmation made the lease whole: {pttl} ms"
    );
    other.release(&k, got.owner).await.unwrap();
}

async fn a_cancelled_waiter_never_ends_up_holding(client: Client) {
    let server = RedisServer::start();
    let releaser = provider(&server, client).await;
    let other = provider(&server, client).await;
    // The next waiter in a process of its own: a waiter behind another of its process stands
    // in the queue in Redis only once it is its process's head.
    let third = provider(&server, client).await;
    // The cancelled waiter in the releasing process (handed over in memory) and in another
    // (handed over by message); cancelled before the release, and right after it (racing the
    // hand-over).
    for (i, (cancelled_in, abort_first)) in [(0, true), (0, false), (1, true), (1, false)]
        .into_iter()
        .enumerate()
    {
        let p = [&releaser, &other][cancelled_in];
        let k = key(&format!("cancelled-{i}"));
        let (lock_key, queue) = (redis_key(&k, "lock"), redis_key(&k, "lock-queue"));
        let holder = OwnerToken::new();
        releaser
            .acquire(lock(&k, holder, LONG, Duration::ZERO))
            .await
            .unwrap()
            .unwrap();
        let cancelled_owner = OwnerToken::new();
        // Polled only until it stands in the queue, then dropped: it never sees a hand-over.
        let mut cancelled = Box::pin(p.acquire(lock(&k, cancelled_owner, LONG, LONG)));
        tokio::select! {
            _ = &mut cancelled => panic!("the waiter returned while the lock was held"),
            () = queued(&server, &queue, 1) => {}
        }
        let next = spawn_acquire(&third, lock(&k, OwnerToken::new(), LONG, LONG));
        queued(&server, &queue, 2).await;
        if abort_first {
            drop(cancelled);
            assert_eq!(
                releaser.release(&k, holder).await.unwrap(),
                ReleaseOutcome::Released
            );
        } else {
            assert_eq!(
                releaser.release(&k, holder).await.unwrap(),
                ReleaseOutcome::Released
            );
            // The hand-over reached the waiter before its cancellation.
            assert_eq!(
                holder_of(&server, &lock_key).map(|h| h.trim_end_matches('*').to_owned()),
                Some(cancelled_owner.to_string())
            );
            drop(cancelled);
        }
        // The next waiter gets the lock well within the lease the cancelled one would have
        // had: the cancelled one gave it onward (or was never handed it).
        let got = tokio::time::timeout(Duration::from_secs(20), next)
            .await
            .expect("the next waiter was handed the lock")
            .unwrap();
        assert!(got.grant.is_some());
        let now_holder = holder_of(&server, &lock_key);
        assert_eq!(now_holder.as_deref(), Some(got.owner.to_string().as_str()));
        assert_ne!(now_holder, Some(cancelled_owner.to_string()));
        assert_eq!(
            third.release(&k, got.owner).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert_eq!(holder_of(&server, &lock_key), None);
        assert_eq!(
            server.command(&["LLEN", &queue]).int(),
            Some(0),
            "no entry left behind"
        );
    }
}

async fn fencing_tokens_grow_across_hand_overs(client: Client) {
    let server = RedisServer::start();
    let providers = [
        provider(&server, client).await,
        provider(&server, client).await,
    ];
    let k = key("fenced-hand-overs");
    let order = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (p, k, order) = (providers[i % 2].clone(), k.clone(), order.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let me = OwnerToken::new();
                    let grant = p
                        .acquire(fenced(&k, me, LONG, LONG))
                        .await
                        .unwrap()
                        .expect("the lock within the wait");
                    // Recorded while held: the order of this list is the order of holders.
                    order
                        .lock()
                        .unwrap()
                        .push(grant.fencing_token.expect("fenced").get());
                    tokio::task::yield_now().await;
                    assert_eq!(p.release(&k, me).await.unwrap(), ReleaseOutcome::Released);
                }
            })
        })
        .collect();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t)
            .await
            .expect("every task done")
            .unwrap();
    }
    let tokens = order.lock().unwrap().clone();
    assert_eq!(tokens.len(), 80);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens in the order of holders: {tokens:?}"
    );
}
