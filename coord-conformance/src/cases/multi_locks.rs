//! Multi-key locks ([`Coordinator::multi_lock`], `#[distributed_lock(key_from_each = ..)]`):
//! keys de-duplicated and taken in canonical order, a refused acquisition leaves nothing held,
//! a multi-key lock and a single lock on an overlapping key exclude each other and share each
//! key's fencing counter, every key's token is readable (on the guard and inside the body),
//! renewal keeps every key and stops at release; and the peers' bugs: two callers taking the
//! same keys in opposite orders never deadlock, and an acquisition dropped half way leaves no
//! key held.
//!
//! Every provider runs these: one with the atomic path
//! ([`MultiLockStore`](coord_core::provider::MultiLockStore)) takes a set it keeps together in
//! one step, the others take the keys one by one through the plain lock provider, and the
//! promises checked here are the same for both.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::{CallKey, CoordError, Coordinator, distributed_lock, fencing_token_of};

use super::deadlines::bounded;
use super::durations::{LONG, PAST_RENEWED_LEASE, RENEWAL_EVERY, RENEWED_LEASE, SHORT};
use super::requests::key;

/// True when `key` is free now: a single attempt takes it (and gives it back).
async fn is_free(c: &Coordinator, key: &CallKey) -> bool {
    match c.lock(key.clone()).lease(LONG).try_acquire().await.unwrap() {
        Some(guard) => {
            assert!(guard.release().await.unwrap());
            true
        }
        None => false,
    }
}

/// Keys listed out of order and with duplicates are locked once each, in canonical order
/// (sorted by their bytes), and each has its own token, readable by key.
pub async fn multi_lock_keys_are_taken_in_canonical_order(c: Coordinator) {
    let (a, b, z) = (key(&c, "mk-a"), key(&c, "mk-b"), key(&c, "mk-z"));
    let guard = c
        .multi_lock([z.clone(), a.clone(), b.clone(), a.clone(), z.clone()])
        .lease(LONG)
        .acquire()
        .await
        .unwrap();
    let keys: Vec<&CallKey> = guard.keys().collect();
    assert_eq!(
        keys,
        [&a, &b, &z],
        "a multi-key lock holds each key once, in canonical order"
    );
    for k in [&a, &b, &z] {
        assert!(
            !is_free(&c, k).await,
            "{k} must be held by the multi-key lock"
        );
        assert!(guard.fencing_token(k).is_some(), "{k} has its token");
    }
    assert!(guard.is_held());
    assert!(guard.release().await.unwrap(), "every key was still ours");
    for k in [&a, &b, &z] {
        assert!(is_free(&c, k).await, "{k} must be free after the release");
    }
}

/// A multi-key lock that cannot have one of its keys takes none of them (or gives back what it
/// took before it answers): the other keys are free the moment the refusal comes back.
pub async fn multi_lock_partial_acquire_is_rolled_back(c: Coordinator) {
    let (a, m, z) = (key(&c, "mr-a"), key(&c, "mr-m"), key(&c, "mr-z"));
    let holder = c.lock(m.clone()).lease(LONG).acquire().await.unwrap();
    for wait in [Duration::ZERO, SHORT] {
        let refused = c
            .multi_lock([a.clone(), m.clone(), z.clone()])
            .lease(LONG)
            .wait(wait)
            .acquire()
            .await;
        assert!(
            matches!(refused, Err(CoordError::LockNotAcquired { .. })),
            "a multi-key lock with a held key must be refused, got {refused:?}"
        );
        assert!(
            is_free(&c, &a).await,
            "a key before the held one was left held by a refused multi-key lock (wait {wait:?})"
        );
        assert!(
            is_free(&c, &z).await,
            "a key after the held one was left held by a refused multi-key lock (wait {wait:?})"
        );
    }
    assert!(holder.release().await.unwrap());
    let guard = c
        .multi_lock([a.clone(), m.clone(), z.clone()])
        .lease(LONG)
        .try_acquire()
        .await
        .unwrap()
        .expect("every key is free now");
    assert!(guard.release().await.unwrap());
}

/// A multi-key lock and a single lock on an overlapping key exclude each other, either way
/// round, and share that key's fencing counter.
pub async fn multi_lock_and_single_lock_on_an_overlapping_key_exclude_each_other(c: Coordinator) {
    let (a, b, d) = (key(&c, "mx-a"), key(&c, "mx-b"), key(&c, "mx-d"));
    let single = c
        .lock(b.clone())
        .lease(LONG)
        .fenced()
        .acquire()
        .await
        .unwrap();
    let single_token = single.fencing_token().unwrap();
    let refused = c
        .multi_lock([a.clone(), b.clone()])
        .lease(LONG)
        .try_acquire()
        .await
        .unwrap();
    assert!(
        refused.is_none(),
        "a multi-key lock was granted a key a single lock holds"
    );
    assert!(single.release().await.unwrap());
    let multi = c
        .multi_lock([a.clone(), b.clone()])
        .lease(LONG)
        .acquire()
        .await
        .unwrap();
    let multi_token = multi.fencing_token(&b).unwrap();
    assert!(
        multi_token > single_token,
        "a multi-key lock's token for a key must exceed the single lock's before it (same counter)"
    );
    assert!(
        c.lock(b.clone())
            .lease(LONG)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a single lock was granted a key a multi-key lock holds"
    );
    assert!(is_free(&c, &d).await, "a key outside the set is free");
    // A waiting single lock is granted when the multi-key lock is released.
    let waiter = {
        let (c, b) = (c.clone(), b.clone());
        tokio::spawn(async move {
            c.lock(b)
                .lease(LONG)
                .wait(LONG)
                .fenced()
                .acquire()
                .await
                .unwrap()
        })
    };
    assert!(multi.release().await.unwrap());
    let after = bounded(
        "a single lock waiting for a multi-key lock's key",
        async move { waiter.await.unwrap() },
    )
    .await;
    assert!(after.fencing_token().unwrap() > multi_token);
    assert!(after.release().await.unwrap());
}

/// Each key's token is readable by key, on the guard and inside the body; tokens of a later
/// multi-key lock on the same keys are greater, key by key.
pub async fn multi_lock_tokens_are_readable_per_key(c: Coordinator) {
    let (a, b) = (key(&c, "mt-a"), key(&c, "mt-b"));
    let first = c
        .multi_lock([b.clone(), a.clone()])
        .lease(LONG)
        .acquire()
        .await
        .unwrap();
    let tokens: Vec<_> = first
        .fencing_tokens()
        .map(|(k, token)| (k.clone(), token.expect("a held key has its token")))
        .collect();
    assert_eq!(tokens.len(), 2);
    assert_eq!(first.fencing_token(&key(&c, "mt-other")), None);
    assert!(first.release().await.unwrap());
    let seen = c
        .multi_lock([a.clone(), b.clone()])
        .lease(LONG)
        .run(|| async { Ok::<_, CoordError>((fencing_token_of(&a), fencing_token_of(&b))) })
        .await
        .unwrap();
    let (Some(seen_a), Some(seen_b)) = seen else {
        panic!("inside the body every key's token must be readable, got {seen:?}");
    };
    for (k, before) in tokens {
        let now = if k == a { seen_a } else { seen_b };
        assert!(now > before, "{k}: a later grant's token must be greater");
    }
    assert_eq!(
        fencing_token_of(&a),
        None,
        "outside the body no token is readable"
    );
}

/// Renewal keeps every key past its lease, and stops when the multi-key lock is released.
pub async fn multi_lock_renewal_stops_at_release(c: Coordinator) {
    let (a, b) = (key(&c, "mn-a"), key(&c, "mn-b"));
    let before = c.active_renewals();
    let guard = c
        .multi_lock([a.clone(), b.clone()])
        .lease(RENEWED_LEASE)
        .renew(RENEWAL_EVERY)
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        c.active_renewals(),
        before + 2,
        "every key of the multi-key lock is being renewed"
    );
    tokio::time::sleep(PAST_RENEWED_LEASE).await;
    assert!(guard.is_held(), "renewal kept every key past its lease");
    for k in [&a, &b] {
        assert!(
            !is_free(&c, k).await,
            "{k} was renewed, so it is still held"
        );
    }
    assert!(guard.release().await.unwrap(), "the renewed keys were ours");
    assert_eq!(
        c.active_renewals(),
        before,
        "a renewal outlived the multi-key lock's release"
    );
    for k in [&a, &b] {
        assert!(is_free(&c, k).await, "{k} is free after the release");
    }
}

#[distributed_lock(key_from_each = "accounts", lease = "30s", wait = "30s", coordinator = coord)]
async fn transfer(
    coord: &Coordinator,
    accounts: Vec<&'static str>,
    inside: &AtomicBool,
    overlaps: &AtomicUsize,
) -> Result<(), CoordError> {
    if inside.swap(true, Ordering::SeqCst) {
        overlaps.fetch_add(1, Ordering::SeqCst);
    }
    tokio::task::yield_now().await;
    inside.store(false, Ordering::SeqCst);
    let _ = accounts;
    Ok(())
}

/// The peers' bug "multi-lock deadlock by order": two callers that keep taking the same two
/// keys, listed in opposite orders, all finish, and never hold the keys at the same time
/// (through the attribute and through the handle).
pub async fn multi_lock_deadlock_by_order(c: Coordinator) {
    const ROUNDS: usize = 40;
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let caller = |order: [&'static str; 2]| {
        let (c, inside, overlaps) = (c.clone(), inside.clone(), overlaps.clone());
        async move {
            for _ in 0..ROUNDS {
                transfer(&c, order.to_vec(), &inside, &overlaps)
                    .await
                    .unwrap();
                let keys = order.map(|part| key(&c, part));
                let guard = c
                    .multi_lock(keys)
                    .lease(LONG)
                    .wait(LONG)
                    .acquire()
                    .await
                    .unwrap();
                assert!(guard.release().await.unwrap());
            }
        }
    };
    let ab = tokio::spawn(caller(["acc-a", "acc-b"]));
    let ba = tokio::spawn(caller(["acc-b", "acc-a"]));
    let finished = tokio::time::timeout(Duration::from_secs(60), async {
        ab.await.unwrap();
        ba.await.unwrap();
    })
    .await;
    assert!(
        finished.is_ok(),
        "two callers taking {{a, b}} and {{b, a}} did not finish: deadlock by order"
    );
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two multi-key locks of the same keys held at once"
    );
}

/// The peers' bug "partial state after an interrupted multi-acquire": a multi-key acquisition
/// dropped while it waits (at several points) leaves none of its keys held, and no waiter
/// that would take the blocking key once it frees.
pub async fn partial_state_after_an_interrupted_multi_acquire(c: Coordinator) {
    let (a, m, z) = (key(&c, "mp-a"), key(&c, "mp-m"), key(&c, "mp-z"));
    for interrupt_after in [Duration::ZERO, Duration::from_millis(1), SHORT] {
        let holder = c.lock(m.clone()).lease(LONG).acquire().await.unwrap();
        let acquire = c
            .multi_lock([a.clone(), m.clone(), z.clone()])
            .lease(LONG)
            .wait(LONG)
            .acquire();
        let interrupted = tokio::time::timeout(interrupt_after, acquire).await;
        assert!(
            interrupted.is_err(),
            "the multi-key lock cannot be granted while a key is held"
        );
        // What the dropped acquisition had taken is released (in the background, owner-checked):
        // a waiter for each key is granted it.
        for k in [&a, &z] {
            let (c2, k2) = (c.clone(), k.clone());
            let guard = bounded("a key of an interrupted multi-key lock", async move {
                c2.lock(k2).lease(LONG).wait(LONG).acquire().await.unwrap()
            })
            .await;
            assert!(guard.release().await.unwrap());
        }
        assert!(holder.release().await.unwrap());
        // Nobody took the blocking key on the dropped acquisition's behalf.
        let (c2, m2) = (c.clone(), m.clone());
        let guard = bounded(
            "the blocking key after the interrupted acquisition",
            async move { c2.lock(m2).lease(LONG).wait(LONG).acquire().await.unwrap() },
        )
        .await;
        assert!(guard.release().await.unwrap());
    }
    for k in [&a, &m, &z] {
        assert!(is_free(&c, k).await, "{k} is free at the end");
    }
}
