//! Semaphores on PostgreSQL, beyond the conformance kit: the upgrade that brings them (schema
//! version 1 to 2) keeps what was there, the limit holds across providers with pools of their
//! own, and expired permits leave no rows behind.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::CallKey;
use coord_core::provider::{
    LockProvider, LockRequest, OwnerToken, PermitRequest, ReleaseOutcome, SemaphoreStore,
};
use coord_postgres::{ConnectError, PostgresProvider, SCHEMA_VERSION, SchemaError};

fn permit(key: &CallKey, owner: OwnerToken, limit: u32, lease: Duration) -> PermitRequest<'_> {
    PermitRequest {
        key,
        owner,
        limit,
        lease,
        wait: Duration::ZERO,
    }
}

async fn provider_in(schema: &str) -> PostgresProvider {
    PostgresProvider::builder(support::server().url())
        .schema(schema)
        .command_timeout(Duration::from_secs(2))
        .pool_size(4)
        .connect()
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_1_schema_is_upgraded_keeping_its_rows() {
    let server = support::server();
    // Version 1 as an older coord left it: its tables, its version row, one held lock.
    let v1 = include_str!("../migrations/0001_initial.sql").replace("{schema}", "\"m_v1\"");
    server.sql(&format!(
        "CREATE SCHEMA m_v1; CREATE TABLE m_v1.schema_version (version integer PRIMARY KEY, \
         name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp()); \
         {v1} INSERT INTO m_v1.schema_version (version, name) VALUES (1, 'initial');"
    ));
    let builder = PostgresProvider::builder(server.url()).schema("m_v1");
    let err = builder.clone().connect().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ConnectError::Schema(SchemaError::Outdated { found: 1, expected, .. })
                if *expected == SCHEMA_VERSION
        ),
        "{err:?}"
    );
    let held = CallKey::builder("ns", "held").finish();
    server.sql(&format!(
        "INSERT INTO m_v1.locks (key, owner, fence, expires_at) \
         VALUES ('{}', gen_random_uuid(), 7, clock_timestamp() + interval '1 hour')",
        held.qualified()
    ));
    let report = builder.clone().migrate().await.expect("migrate");
    assert_eq!((report.from, report.to), (1, SCHEMA_VERSION));
    let provider = provider_in("m_v1").await;
    let lock = provider
        .acquire(LockRequest {
            key: &held,
            owner: OwnerToken::new(),
            lease: Duration::from_secs(5),
            wait: Duration::ZERO,
            fenced: true,
        })
        .await
        .expect("acquire");
    assert!(
        lock.is_none(),
        "the lock held before the upgrade is still held"
    );
    let key = CallKey::builder("ns", "upgraded").finish();
    let owner = OwnerToken::new();
    let grant = provider
        .acquire_permit(permit(&key, owner, 1, Duration::from_secs(5)))
        .await
        .expect("a semaphore after the upgrade");
    assert!(grant.is_some());
    assert_eq!(
        provider.release_permit(&key, owner).await.unwrap(),
        ReleaseOutcome::Released
    );
}

/// Two providers (two pools, two listeners) race 16 tasks each for a 3-permit semaphore: a
/// witness counter of the holders never exceeds 3, and every permit is released at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_limit_holds_across_providers() {
    let providers = [support::provider().await, support::provider().await];
    let key = CallKey::builder(&support::namespace("sem"), "across").finish();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..32 {
        let provider = providers[task % 2].clone();
        let (key, inside, most) = (key.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let owner = OwnerToken::new();
                let grant = provider
                    .acquire_permit(PermitRequest {
                        key: &key,
                        owner,
                        limit: 3,
                        lease: Duration::from_secs(30),
                        wait: Duration::from_secs(60),
                    })
                    .await
                    .expect("acquire");
                assert!(grant.is_some(), "a permit within the wait");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(
                    provider.release_permit(&key, owner).await.expect("release"),
                    ReleaseOutcome::Released
                );
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(most.load(Ordering::SeqCst), 3, "never more than 3 holders");
    let left = support::server().sql(&format!(
        "SELECT count(*) FROM coord.semaphore_permits WHERE key = '{}'",
        key.qualified()
    ));
    assert_eq!(left, "0", "every permit was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_permits_are_removed_by_the_next_acquire_and_by_the_sweeper() {
    let provider = support::provider().await;
    let ns = support::namespace("sem");
    let key = CallKey::builder(&ns, "expiring").finish();
    let rows = || {
        support::server().sql(&format!(
            "SELECT count(*) FROM coord.semaphore_permits WHERE key = '{}'",
            key.qualified()
        ))
    };
    for _ in 0..3 {
        let grant = provider
            .acquire_permit(permit(
                &key,
                OwnerToken::new(),
                3,
                Duration::from_millis(100),
            ))
            .await
            .unwrap();
        assert!(grant.is_some());
    }
    assert_eq!(rows(), "3");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let owner = OwnerToken::new();
    let grant = provider
        .acquire_permit(permit(&key, owner, 1, Duration::from_millis(100)))
        .await
        .unwrap();
    assert!(grant.is_some(), "expired permits do not count");
    assert_eq!(rows(), "1", "the acquire removed the expired permits");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let swept = provider.sweep(10_000).await.expect("sweep");
    assert!(
        swept >= 2,
        "the permit and the key's row were swept ({swept})"
    );
    assert_eq!(rows(), "0");
    let key_rows = support::server().sql(&format!(
        "SELECT count(*) FROM coord.semaphores WHERE key = '{}'",
        key.qualified()
    ));
    assert_eq!(key_rows, "0");
}
