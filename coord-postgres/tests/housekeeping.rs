//! Housekeeping and what goes over the wire: the sweeper deletes expired rows in batches (and
//! runs by itself); notifications carry a short hash of the key on the provider's channel, and
//! only when someone waits; keys longer than the index allows are refused before they are
//! sent.

mod support;

use std::time::Duration;

use coord_core::provider::{BackendErrorKind, LockProvider, LockRequest, OwnerToken};
use coord_core::{CallKey, Coordinator};
use coord_postgres::{MAX_KEY_BYTES, PostgresProvider};
use tokio_postgres::AsyncMessage;

fn lock_req(key: &CallKey, owner: OwnerToken, wait: Duration) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease: Duration::from_secs(30),
        wait,
        fenced: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_deletes_expired_rows_in_batches() {
    let server = support::server();
    let provider = PostgresProvider::builder(server.url())
        .schema("sweep_batches")
        .sweep_interval(None);
    provider.clone().migrate().await.unwrap();
    let provider = provider.connect().await.unwrap();
    server.sql(
        "INSERT INTO sweep_batches.records (key, state, owner, payload, written_at, expires_at) \
         SELECT 'ns:old:' || i, 'completed', gen_random_uuid(), '\\x00', now() - interval '2 h', \
                now() - interval '1 h' FROM generate_series(1, 1200) i; \
         INSERT INTO sweep_batches.records (key, state, owner, payload, written_at, expires_at) \
         VALUES ('ns:live:1', 'completed', gen_random_uuid(), '\\x00', now(), now() + interval '1 h'); \
         INSERT INTO sweep_batches.cache (key, value, expires_at) \
         SELECT 'ns:c:' || i, '\\x00', now() - interval '1 s' FROM generate_series(1, 30) i",
    );
    // One batch per table per call: 500 records and the 30 cache entries, then the rest.
    assert_eq!(provider.sweep(500).await.unwrap(), 530);
    assert_eq!(provider.sweep(500).await.unwrap(), 500);
    assert_eq!(provider.sweep(500).await.unwrap(), 200);
    assert_eq!(provider.sweep(500).await.unwrap(), 0);
    assert_eq!(
        server.sql("SELECT count(*) FROM sweep_batches.records"),
        "1",
        "the live record stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_runs_by_itself() {
    let server = support::server();
    let builder = PostgresProvider::builder(server.url())
        .schema("sweep_alone")
        .sweep_interval(Some(Duration::from_millis(100)));
    builder.clone().migrate().await.unwrap();
    let _provider = builder.connect().await.unwrap();
    server.sql(
        "INSERT INTO sweep_alone.locks (key, owner, expires_at) \
         SELECT 'ns:l:' || i, gen_random_uuid(), now() - interval '1 s' FROM generate_series(1, 50) i",
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.sql("SELECT count(*) FROM sweep_alone.locks") != "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper did not run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_carry_a_short_hash_and_only_when_someone_waits() {
    let provider = support::provider().await;
    let channel = provider.channel().to_owned();
    let (client, mut connection) =
        tokio_postgres::connect(&support::server().url(), tokio_postgres::NoTls)
            .await
            .unwrap();
    let (tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(note) = message {
                let _ = tx.send((note.channel().to_owned(), note.payload().to_owned()));
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();

    let c = Coordinator::builder()
        .namespace(support::namespace("notes"))
        .provider(provider.clone())
        .build()
        .unwrap();
    let key = c.key("secret-operation").part("customer-4711").finish();
    // Nobody waits: acquire and release send nothing.
    let a = OwnerToken::new();
    provider
        .acquire(lock_req(&key, a, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    provider.release(&key, a).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), notes.recv())
            .await
            .is_err(),
        "a release nobody waits for notifies nobody"
    );
    // Someone waits: the release notifies once, with a short hash of the key.
    provider
        .acquire(lock_req(&key, a, Duration::ZERO))
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn({
        let (provider, key) = (provider.clone(), key.clone());
        async move {
            provider
                .acquire(lock_req(&key, OwnerToken::new(), Duration::from_secs(10)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    provider.release(&key, a).await.unwrap();
    let (on, payload) = tokio::time::timeout(Duration::from_secs(5), notes.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(on, channel);
    assert_eq!(payload.len(), 17, "{payload}");
    assert!(
        !payload.contains("customer") && !payload.contains("secret"),
        "{payload}"
    );
    assert!(
        waiter.await.unwrap().unwrap().is_some(),
        "the waiter got the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_too_long_for_the_index_are_refused_before_they_are_sent() {
    let provider = support::provider().await;
    let long = "x".repeat(MAX_KEY_BYTES);
    let key = CallKey::builder("ns", "op").part(long.as_str()).finish();
    let err = provider
        .acquire(lock_req(&key, OwnerToken::new(), Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err:?}");
    assert!(err.message().contains(&MAX_KEY_BYTES.to_string()), "{err}");
    let fits = CallKey::builder("ns", "op")
        .part(&"y".repeat(MAX_KEY_BYTES - 20))
        .finish();
    let owner = OwnerToken::new();
    assert!(
        provider
            .acquire(lock_req(&fits, owner, Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    provider.release(&fits, owner).await.unwrap();
}
