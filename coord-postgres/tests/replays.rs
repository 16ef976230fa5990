//! A replay is a read: answering a duplicate from a completed record writes nothing and waits
//! for nobody, on a real PostgreSQL server, through the public API (the `#[idempotent]`
//! attribute and the `Idempotent` handle).
//!
//! | Test | What it does | What it asserts | What the earlier claim-statement path did |
//! |---|---|---|---|
//! | `replays_write_no_wal` | 100 replays through the attribute, then 100 through the handle, of one completed record each | `pg_current_wal_insert_lsn()` read on a connection of its own is the same before and after each 100; the body ran once per key | 9 624 bytes of WAL for the attribute's 100 replays (about 96 bytes each: the row lock and the commit record of a transaction that changed nothing); the handle sends the same claim |
//! | `in_flight_duplicates_write_no_wal` | 100 duplicates (no `wait`) of a call whose body is still running | `InFlight` each time, and the same WAL position before and after | 9 624 bytes |
//! | `a_waiter_marks_a_marker_once` | a caller waits (`wait_settled`, one look each, 100 ms) on another's marker 21 times | the first wait moves the WAL (it marks the marker as waited for, so that its settling notifies); the next 20 move it by 0 bytes | every look locked the marker's row (`FOR UPDATE`): 3 840 bytes for the 20 (192 each) |
//! | `replay_does_not_wait_for_a_locked_row` | a session holds the record's row lock (`SELECT .. FOR UPDATE` in an open transaction), then a replay | the stored value within 10 s (measured: a few milliseconds), while the lock is still held | blocked on the row lock: still waiting at the 10 s deadline (its command timeout is 30 s here) |
//!
//! The WAL tests run each on a server of their own, with `wal_level = minimal` (no
//! running-transactions record a background process could log in the window) and autovacuum
//! off (no analyze writing statistics in the window), so the only WAL between the two readings
//! is what the replays themselves write: the assertion is deterministic, not a timing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{ClaimOutcome, ClaimRequest, IdempotencyStore, OwnerToken};
use coord_core::{CallKey, CoordError, Coordinator, idempotent};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::{PostgresServer, ServerOptions};

/// A server of this test's own, migrated, on which nothing but the test writes.
fn quiet_server() -> PostgresServer {
    let server = PostgresServer::start_configured(
        ServerOptions::new()
            .setting("wal_level", "minimal")
            .setting("max_wal_senders", "0")
            .setting("autovacuum", "off"),
    );
    let url = server.url();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(PostgresProvider::migrate(&url))
    })
    .join()
    .expect("migrating")
    .expect("migrate the test server");
    server
}

async fn provider(url: &str, command_timeout: Duration) -> PostgresProvider {
    PostgresProvider::builder(url)
        .command_timeout(command_timeout)
        .pool_size(4)
        .sweep_interval(None)
        .connect()
        .await
        .expect("connect to the test server")
}

async fn coordinator(url: &str, command_timeout: Duration) -> Coordinator {
    let provider = provider(url, command_timeout).await;
    Coordinator::builder()
        .namespace("replays")
        .provider(provider)
        .build()
        .expect("coordinator")
}

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("a connection of the test's own");
    tokio::spawn(connection);
    client
}

/// Where the server's WAL insertion is, in bytes.
async fn wal_position(observer: &tokio_postgres::Client) -> i64 {
    observer
        .query_one(
            "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint",
            &[],
        )
        .await
        .expect("reading the WAL position")
        .get(0)
}

#[idempotent(key_from = "order", coordinator = coord, name = "pay.charge")]
async fn charge(
    coord: &Coordinator,
    order: &str,
    runs: &AtomicUsize,
) -> Result<String, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(format!("receipt for {order}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_write_no_wal() {
    let server = tokio::task::spawn_blocking(quiet_server).await.unwrap();
    let coord = coordinator(&server.url(), Duration::from_secs(5)).await;
    let observer = client(&server.url()).await;
    let runs = AtomicUsize::new(0);

    // The attribute: the first call runs and stores, one replay more settles whatever a
    // first read of a fresh row does, then 100 replays are measured.
    let first = charge(&coord, "o-1", &runs).await.unwrap();
    assert_eq!(charge(&coord, "o-1", &runs).await.unwrap(), first);
    let before = wal_position(&observer).await;
    for _ in 0..100 {
        assert_eq!(charge(&coord, "o-1", &runs).await.unwrap(), first);
    }
    let after = wal_position(&observer).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(
        after - before,
        0,
        "100 replays through the attribute wrote {} bytes of WAL",
        after - before
    );

    // The handle, on a key of its own.
    let handle_runs = Arc::new(AtomicUsize::new(0));
    let replay = || {
        let runs = handle_runs.clone();
        coord
            .idempotent(coord.key("pay.refund").part("r-1").finish())
            .run(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoordError>(42_u64)
            })
    };
    assert_eq!(replay().await.unwrap(), 42);
    assert_eq!(replay().await.unwrap(), 42);
    let before = wal_position(&observer).await;
    for _ in 0..100 {
        assert_eq!(replay().await.unwrap(), 42);
    }
    let after = wal_position(&observer).await;
    assert_eq!(handle_runs.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(
        after - before,
        0,
        "100 replays through the handle wrote {} bytes of WAL",
        after - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_duplicates_write_no_wal() {
    let server = tokio::task::spawn_blocking(quiet_server).await.unwrap();
    let coord = Arc::new(coordinator(&server.url(), Duration::from_secs(5)).await);
    let observer = client(&server.url()).await;
    let key = || coord.key("pay.slow").part("s-1").finish();

    // The first call holds its marker (a lease far longer than the test, so no renewal
    // writes in the window) until it is told to finish.
    let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let coord = coord.clone();
        let key = key();
        tokio::spawn(async move {
            coord
                .idempotent(key)
                .in_flight_lease(Duration::from_secs(600))
                .run(move || async move {
                    started_tx.send(()).unwrap();
                    finish_rx.await.unwrap();
                    Ok::<_, CoordError>(7_u32)
                })
                .await
        })
    };
    started.await.unwrap();

    let duplicate = || {
        coord
            .idempotent(key())
            .run(|| async { Ok::<_, CoordError>(0_u32) })
    };
    assert!(matches!(
        duplicate().await,
        Err(CoordError::InFlight { .. })
    ));
    let before = wal_position(&observer).await;
    for _ in 0..100 {
        assert!(matches!(
            duplicate().await,
            Err(CoordError::InFlight { .. })
        ));
    }
    let after = wal_position(&observer).await;
    assert_eq!(
        after - before,
        0,
        "100 in-flight duplicates wrote {} bytes of WAL",
        after - before
    );

    finish.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 7);
    assert_eq!(duplicate().await.unwrap(), 7, "the duplicate now replays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_marks_a_marker_once() {
    let server = tokio::task::spawn_blocking(quiet_server).await.unwrap();
    let provider = provider(&server.url(), Duration::from_secs(5)).await;
    let observer = client(&server.url()).await;
    let key = CallKey::builder("replays", "pay.wait").part("w-1").finish();
    // Another caller's marker, in a lease far longer than the test.
    let claimed = provider
        .claim(ClaimRequest {
            key: &key,
            owner: OwnerToken::new(),
            in_flight_lease: Duration::from_secs(600),
            fingerprint: None,
            keep_abandoned_for: None,
            transactional: false,
        })
        .await
        .unwrap();
    assert_eq!(claimed, ClaimOutcome::Claimed);

    // Each wait looks once, finds the marker in its lease, and ends at its own timeout. The
    // first gets 2 s, so that its look (the first statement on a new session: a prepare, on a
    // loaded host slower than 100 ms) is answered before the wait ends rather than cut short.
    let wait = Duration::from_millis(100);
    let before = wal_position(&observer).await;
    provider
        .wait_settled(&key, Duration::from_secs(2))
        .await
        .unwrap();
    let marked = wal_position(&observer).await;
    assert!(
        marked > before,
        "the first look marks the marker as waited for, a write"
    );
    for _ in 0..20 {
        provider.wait_settled(&key, wait).await.unwrap();
    }
    let after = wal_position(&observer).await;
    assert_eq!(
        after - marked,
        0,
        "20 later looks at a marked marker wrote {} bytes of WAL",
        after - marked
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_does_not_wait_for_a_locked_row() {
    let server = tokio::task::spawn_blocking(quiet_server).await.unwrap();
    // A command timeout longer than the deadline below: a replay blocked on the row lock would
    // still be waiting when the deadline passes.
    let coord = coordinator(&server.url(), Duration::from_secs(30)).await;
    let runs = AtomicUsize::new(0);
    let stored = charge(&coord, "o-locked", &runs).await.unwrap();

    // Another session locks the record's row and keeps its transaction open, as a concurrent
    // claim statement does while it decides.
    let mut holder = client(&server.url()).await;
    let tx = holder.transaction().await.unwrap();
    let locked = tx
        .query(
            "SELECT key FROM coord.records WHERE key LIKE 'replays:%' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        locked.len(),
        1,
        "the record's row is locked by the other session"
    );

    let started = Instant::now();
    let replayed = tokio::time::timeout(Duration::from_secs(10), charge(&coord, "o-locked", &runs))
        .await
        .expect("the replay waited for the row another session holds");
    assert_eq!(replayed.unwrap(), stored);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    // The lock was held all along: the replay was answered around it, not after it.
    let still: i64 = tx
        .query_one(
            "SELECT count(*) FROM coord.records WHERE key LIKE 'replays:%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(still, 1);
    tx.rollback().await.unwrap();
    eprintln!(
        "replay answered in {:?} with the row locked",
        started.elapsed()
    );
}
