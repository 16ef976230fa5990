//! Multi-key locks on PostgreSQL, beyond the conformance kit: the whole set is taken in one
//! statement, so no other session ever sees it half taken (not even while the statement waits
//! for a row half way through the set), a refused set leaves nothing, a cancelled acquisition
//! leaves nothing held, and a waiting set is woken by the release of the key that blocked it.

mod support;

use std::time::{Duration, Instant};

use coord_core::provider::{
    Capability, LockProvider, LockRequest, MultiLockRequest, MultiLockStore, OwnerToken,
};
use coord_core::{CallKey, Coordinator};
use coord_postgres::tokio_postgres;

const LONG: Duration = Duration::from_secs(30);

/// Four keys of a fresh namespace, in canonical order (as the runtime sends them).
fn keys(op: &str) -> Vec<CallKey> {
    let ns = support::namespace("multi");
    let mut keys: Vec<CallKey> = ["a", "b", "c", "d"]
        .iter()
        .map(|part| CallKey::builder(&ns, op).part(part).finish())
        .collect();
    keys.sort_by(|x, y| x.qualified().cmp(y.qualified()));
    keys
}

fn set(keys: &[CallKey], owner: OwnerToken, wait: Duration) -> MultiLockRequest<'_> {
    MultiLockRequest {
        keys,
        owner,
        lease: LONG,
        wait,
    }
}

/// A session of its own on the test server, outside any provider.
async fn session() -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&support::server().url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
    tokio::spawn(connection);
    client
}

/// How many of `keys` another session sees held (live) by `owner`.
async fn visible(observer: &tokio_postgres::Client, keys: &[CallKey], owner: OwnerToken) -> i64 {
    let names: Vec<&str> = keys.iter().map(|k| k.qualified()).collect();
    observer
        .query_one(
            "SELECT count(*) FROM coord.locks WHERE key = ANY($1::text[]) AND owner = $2::uuid \
             AND expires_at > clock_timestamp()",
            &[&names, &uuid::Uuid::from_u128(owner.as_u128())],
        )
        .await
        .expect("observe")
        .get(0)
}

/// How many of `keys` are held (live) by anyone.
async fn held(observer: &tokio_postgres::Client, keys: &[CallKey]) -> i64 {
    let names: Vec<&str> = keys.iter().map(|k| k.qualified()).collect();
    observer
        .query_one(
            "SELECT count(*) FROM coord.locks WHERE key = ANY($1::text[]) \
             AND expires_at > clock_timestamp()",
            &[&names],
        )
        .await
        .expect("observe")
        .get(0)
}

/// Waits (generously bounded) until a session of coord's waits for a row lock inside
/// `lock_acquire_all`: the set is then taken up to the row another session holds.
async fn until_the_set_waits_for_a_row(observer: &tokio_postgres::Client) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%lock_acquire_all%' AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < until,
            "the set never waited for the held row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (generously bounded) until the holder of `key` is marked as waited for: a waiter
/// listens and its holder's release notifies.
async fn until_marked(observer: &tokio_postgres::Client, key: &CallKey) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let marked: bool = observer
            .query_one(
                "SELECT coalesce(bool_or(waited), false) FROM coord.locks WHERE key = $1::text",
                &[&key.qualified()],
            )
            .await
            .expect("observe")
            .get(0);
        if marked {
            return;
        }
        assert!(Instant::now() < until, "no waiter marked the holder");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Holds the row of `key` (a lapsed lock row, so free to coord) in an open transaction of
/// `blocker`: a statement taking `key` waits for that transaction to end.
async fn hold_row<'a>(
    blocker: &'a mut tokio_postgres::Client,
    key: &CallKey,
) -> tokio_postgres::Transaction<'a> {
    blocker
        .execute(
            "INSERT INTO coord.locks (key, owner, fence, expires_at) \
             VALUES ($1::text, gen_random_uuid(), NULL, clock_timestamp() - interval '1 second')",
            &[&key.qualified()],
        )
        .await
        .expect("a lapsed row");
    let tx = blocker.transaction().await.expect("begin");
    tx.execute(
        "SELECT 1 FROM coord.locks WHERE key = $1::text FOR UPDATE",
        &[&key.qualified()],
    )
    .await
    .expect("lock the row");
    tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_takes_every_set_together() {
    let provider = support::provider().await;
    assert!(provider.supports_multi_locks());
    assert!(provider.takes_together(&keys("any")));
    let c = Coordinator::builder()
        .namespace(support::namespace("multi"))
        .provider(provider)
        .require(Capability::MultiKeyLocks)
        .build()
        .expect("a coordinator that requires the atomic path");
    let ks = keys("handle");
    let guard = c.multi_lock(ks.clone()).acquire().await.expect("acquire");
    assert!(guard.taken_together(), "the set went key by key");
    let tokens: Vec<u64> = ks
        .iter()
        .map(|k| guard.fencing_token(k).expect("a token per key").get())
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "one token per key, drawn in the set's order: {tokens:?}"
    );
    assert!(guard.release().await.unwrap());
    assert_eq!(held(&session().await, &ks).await, 0);
}

/// A set whose third key is held by a single lock is refused, and nothing of it is written:
/// the keys before the held one are not held by anyone afterwards, and a single lock of each
/// is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_leaves_no_row() {
    let provider = support::provider().await;
    let observer = session().await;
    let ks = keys("refused");
    let holder = OwnerToken::new();
    provider
        .acquire(LockRequest {
            key: &ks[2],
            owner: holder,
            lease: LONG,
            wait: Duration::ZERO,
            fenced: true,
        })
        .await
        .unwrap()
        .expect("a free key");
    let owner = OwnerToken::new();
    let refused = provider
        .acquire_all(set(&ks, owner, Duration::ZERO))
        .await
        .unwrap();
    assert!(
        refused.is_none(),
        "a set was granted with a key held by another"
    );
    assert_eq!(
        visible(&observer, &ks, owner).await,
        0,
        "a refused set left rows"
    );
    assert_eq!(
        held(&observer, &ks).await,
        1,
        "only the single lock is held"
    );
    for key in [&ks[0], &ks[1], &ks[3]] {
        let other = OwnerToken::new();
        let single = provider
            .acquire(LockRequest {
                key,
                owner: other,
                lease: LONG,
                wait: Duration::ZERO,
                fenced: true,
            })
            .await
            .unwrap();
        assert!(single.is_some(), "a key of the refused set stayed taken");
        provider.release(key, other).await.unwrap();
    }
    provider.release(&ks[2], holder).await.unwrap();
}

/// While the statement waits for the last key's row (another session holds it), the keys it
/// has already taken are invisible to every other session; once the row is free, all four
/// appear together, each with a token greater than the blocked key's earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_session_sees_the_set_half_taken() {
    let provider = support::provider().await;
    let observer = session().await;
    let mut blocker = session().await;
    let ks = keys("half");
    let tx = hold_row(&mut blocker, &ks[3]).await;
    let owner = OwnerToken::new();
    let acquiring = tokio::spawn({
        let (provider, ks) = (provider.clone(), ks.clone());
        async move { provider.acquire_all(set(&ks, owner, Duration::ZERO)).await }
    });
    until_the_set_waits_for_a_row(&observer).await;
    // Three keys are written by now, uncommitted: nobody else sees any of them.
    for _ in 0..20 {
        assert_eq!(
            visible(&observer, &ks, owner).await,
            0,
            "another session saw the set half taken"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tx.commit().await.expect("free the row");
    let grant = acquiring
        .await
        .unwrap()
        .expect("acquire")
        .expect("the lapsed row was free, so the set is granted");
    assert_eq!(grant.fencing_tokens.len(), 4);
    assert_eq!(
        visible(&observer, &ks, owner).await,
        4,
        "the set appeared whole"
    );
    for key in &ks {
        provider.release(key, owner).await.unwrap();
    }
}

/// An acquisition dropped while it waits leaves nothing held: dropped while its statement
/// waits for a row half way through the set (the statement finishes on the server after the
/// drop, and the runtime gives back what it took), and dropped while it waits for a held key's
/// release (nothing was taken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquire_leaves_nothing_held() {
    let provider = support::provider().await;
    let observer = session().await;
    let mut blocker = session().await;
    let c = Coordinator::builder()
        .namespace(support::namespace("multi"))
        .provider(provider.clone())
        .build()
        .expect("coordinator");

    // Dropped inside the statement.
    let ks = keys("cancel-in-statement");
    let tx = hold_row(&mut blocker, &ks[3]).await;
    let acquiring = tokio::spawn({
        let (c, ks) = (c.clone(), ks.clone());
        async move { c.multi_lock(ks).wait(LONG).acquire().await.map(|_| ()) }
    });
    until_the_set_waits_for_a_row(&observer).await;
    acquiring.abort();
    let _ = acquiring.await;
    tx.commit().await.expect("free the row");
    let until = Instant::now() + Duration::from_secs(10);
    while held(&observer, &ks).await > 0 {
        assert!(
            Instant::now() < until,
            "a cancelled acquisition left keys held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Dropped while waiting for a release.
    let ks = keys("cancel-waiting");
    let holder = OwnerToken::new();
    provider
        .acquire(LockRequest {
            key: &ks[1],
            owner: holder,
            lease: LONG,
            wait: Duration::ZERO,
            fenced: true,
        })
        .await
        .unwrap()
        .expect("a free key");
    let waiting = tokio::spawn({
        let (c, ks) = (c.clone(), ks.clone());
        async move { c.multi_lock(ks).wait(LONG).acquire().await.map(|_| ()) }
    });
    until_marked(&observer, &ks[1]).await;
    assert!(
        !waiting.is_finished(),
        "the set did not wait for the held key"
    );
    assert_eq!(held(&observer, &ks).await, 1, "a waiting set holds keys");
    waiting.abort();
    let _ = waiting.await;
    provider.release(&ks[1], holder).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        held(&observer, &ks).await,
        0,
        "a cancelled waiter took keys"
    );
}

/// A set blocked by a key held through another provider is woken by that key's release (the
/// single lock's notification), in well under the once-a-second re-check, three times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_set_is_woken_by_the_blocking_release() {
    let (a, b) = (support::provider().await, support::provider().await);
    let observer = session().await;
    let ks = keys("wake");
    for round in 0..3 {
        let holder = OwnerToken::new();
        a.acquire(LockRequest {
            key: &ks[round + 1],
            owner: holder,
            lease: LONG,
            wait: Duration::ZERO,
            fenced: true,
        })
        .await
        .unwrap()
        .expect("a free key");
        let owner = OwnerToken::new();
        let waiting = tokio::spawn({
            let (b, ks) = (b.clone(), ks.clone());
            async move {
                let grant = b.acquire_all(set(&ks, owner, LONG)).await;
                (grant, Instant::now())
            }
        });
        until_marked(&observer, &ks[round + 1]).await;
        let released = Instant::now();
        a.release(&ks[round + 1], holder).await.unwrap();
        let (grant, at) = waiting.await.unwrap();
        let grant = grant.unwrap().expect("the set once the key was free");
        assert!(grant.contended);
        assert!(
            at.duration_since(released) < Duration::from_millis(300),
            "round {round}: the release did not wake the set (it took {:?})",
            at.duration_since(released)
        );
        for key in &ks {
            b.release(key, owner).await.unwrap();
        }
    }
}
