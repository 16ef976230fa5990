//! Read-write locks on PostgreSQL, beyond the conformance kit: the upgrade that brings them
//! (schema version 2 to 3) keeps what was there, exclusion and wake-ups hold across providers
//! with pools and listeners of their own, tokens come from the sequence locks draw from, a
//! writer that gives up withdraws its claim at once, and ended holds leave no rows behind.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::CallKey;
use coord_core::provider::{
    LockProvider, LockRequest, OwnerToken, PermitRequest, ReleaseOutcome, RwLockRequest,
    RwLockStore, RwMode, SemaphoreStore,
};
use coord_postgres::{ConnectError, PostgresProvider, SCHEMA_VERSION, SchemaError};

const LONG: Duration = Duration::from_secs(30);

fn rw(key: &CallKey, owner: OwnerToken, mode: RwMode, wait: Duration) -> RwLockRequest<'_> {
    RwLockRequest {
        key,
        owner,
        mode,
        lease: LONG,
        wait,
        claim: LONG,
    }
}

fn fenced_lock(key: &CallKey, owner: OwnerToken) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease: LONG,
        wait: Duration::ZERO,
        fenced: true,
    }
}

/// Rows of `table` (in the default schema) for `key`.
fn rows(table: &str, key: &CallKey) -> String {
    support::server().sql(&format!(
        "SELECT count(*) FROM coord.{table} WHERE key = '{}'",
        key.qualified()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_2_schema_is_upgraded_keeping_its_rows() {
    let server = support::server();
    // Version 2 as an older coord left it: its tables, its version rows, a held lock and a
    // held permit.
    let schema = "\"m_v2\"";
    let v1 = include_str!("../migrations/0001_initial.sql").replace("{schema}", schema);
    let v2 = include_str!("../migrations/0002_semaphores.sql").replace("{schema}", schema);
    server.sql(&format!(
        "CREATE SCHEMA m_v2; CREATE TABLE m_v2.schema_version (version integer PRIMARY KEY, \
         name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp()); \
         {v1} {v2} INSERT INTO m_v2.schema_version (version, name) \
         VALUES (1, 'initial'), (2, 'semaphores');"
    ));
    let builder = PostgresProvider::builder(server.url()).schema("m_v2");
    let err = builder.clone().connect().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ConnectError::Schema(SchemaError::Outdated { found: 2, expected, .. })
                if *expected == SCHEMA_VERSION
        ),
        "{err:?}"
    );
    let held = CallKey::builder("ns", "held").finish();
    let permit = CallKey::builder("ns", "permit").finish();
    server.sql(&format!(
        "INSERT INTO m_v2.locks (key, owner, fence, expires_at) \
         VALUES ('{held}', gen_random_uuid(), 7, clock_timestamp() + interval '1 hour'); \
         INSERT INTO m_v2.semaphores (key, expires_at) \
         VALUES ('{permit}', clock_timestamp() + interval '1 hour'); \
         INSERT INTO m_v2.semaphore_permits (key, owner, fence, expires_at) \
         VALUES ('{permit}', gen_random_uuid(), 8, clock_timestamp() + interval '1 hour');",
        held = held.qualified(),
        permit = permit.qualified(),
    ));
    let report = builder.clone().migrate().await.expect("migrate");
    assert_eq!((report.from, report.to), (2, SCHEMA_VERSION));
    let provider = builder
        .command_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect after the upgrade");
    assert!(provider.supports_rw_locks());
    let lock = provider
        .acquire(fenced_lock(&held, OwnerToken::new()))
        .await
        .expect("acquire");
    assert!(lock.is_none(), "the lock held before the upgrade is held");
    let full = provider
        .acquire_permit(PermitRequest {
            key: &permit,
            owner: OwnerToken::new(),
            limit: 1,
            lease: LONG,
            wait: Duration::ZERO,
        })
        .await
        .expect("acquire a permit");
    assert!(full.is_none(), "the permit held before the upgrade is held");
    let key = CallKey::builder("ns", "upgraded").finish();
    let owner = OwnerToken::new();
    provider
        .acquire_rw(rw(&key, owner, RwMode::Write, Duration::ZERO))
        .await
        .expect("a read-write lock after the upgrade")
        .expect("a free key grants a writer");
    assert_eq!(
        provider
            .release_rw(&key, owner, RwMode::Write)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
}

/// Two providers (two pools, two listeners) race 24 tasks, readers and writers, on one key
/// with a witness of who is inside: never a writer beside anyone, readers do share the key,
/// and no hold row is left at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_holds_across_providers() {
    let providers = [support::provider().await, support::provider().await];
    let key = CallKey::builder(&support::namespace("rw"), "across").finish();
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..24usize {
        let provider = providers[task % 2].clone();
        let key = key.clone();
        let (readers, writers, most_readers, broken) = (
            readers.clone(),
            writers.clone(),
            most_readers.clone(),
            broken.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..3usize {
                let mode = if (task + round) % 3 == 0 {
                    RwMode::Write
                } else {
                    RwMode::Read
                };
                let owner = OwnerToken::new();
                let grant = provider
                    .acquire_rw(rw(&key, owner, mode, Duration::from_secs(60)))
                    .await
                    .expect("acquire");
                assert!(grant.is_some(), "a hold within the wait");
                match mode {
                    RwMode::Read => {
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        most_readers.fetch_max(now, Ordering::SeqCst);
                        if writers.load(Ordering::SeqCst) > 0 {
                            broken.store(true, Ordering::SeqCst);
                        }
                    }
                    RwMode::Write => {
                        let now = writers.fetch_add(1, Ordering::SeqCst) + 1;
                        if now > 1 || readers.load(Ordering::SeqCst) > 0 {
                            broken.store(true, Ordering::SeqCst);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                match mode {
                    RwMode::Read => readers.fetch_sub(1, Ordering::SeqCst),
                    RwMode::Write => writers.fetch_sub(1, Ordering::SeqCst),
                };
                assert_eq!(
                    provider
                        .release_rw(&key, owner, mode)
                        .await
                        .expect("release"),
                    ReleaseOutcome::Released
                );
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert!(
        !broken.load(Ordering::SeqCst),
        "a writer was inside beside a reader or another writer"
    );
    assert!(
        most_readers.load(Ordering::SeqCst) > 1,
        "readers never shared the key"
    );
    assert_eq!(rows("rw_holds", &key), "0", "every hold was released");
}

/// A writer waiting through one provider is woken by a reader's release through another (the
/// notification crosses the providers' listeners). A waiter also looks again about every
/// second without one, so three rounds must each be granted well within a third of that: a
/// missing notification fails this nearly always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_another_provider() {
    let (a, b) = (support::provider().await, support::provider().await);
    let key = CallKey::builder(&support::namespace("rw"), "wake").finish();
    for round in 0..3 {
        let reader = OwnerToken::new();
        a.acquire_rw(rw(&key, reader, RwMode::Read, Duration::ZERO))
            .await
            .unwrap()
            .expect("a free key grants a reader");
        let writer = OwnerToken::new();
        let waiting = tokio::spawn({
            let (b, key) = (b.clone(), key.clone());
            async move {
                let grant = b.acquire_rw(rw(&key, writer, RwMode::Write, LONG)).await;
                (grant, Instant::now())
            }
        });
        // The writer is waiting (its claim is in place) once a new reader is refused.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let probe = OwnerToken::new();
            match a
                .acquire_rw(rw(&key, probe, RwMode::Read, Duration::ZERO))
                .await
                .unwrap()
            {
                None => break,
                Some(_) => {
                    a.release_rw(&key, probe, RwMode::Read).await.unwrap();
                }
            }
            assert!(Instant::now() < until, "the waiting writer left no claim");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let released = Instant::now();
        assert_eq!(
            a.release_rw(&key, reader, RwMode::Read).await.unwrap(),
            ReleaseOutcome::Released
        );
        let (grant, at) = waiting.await.unwrap();
        grant.unwrap().expect("the writer got in");
        assert!(
            at.duration_since(released) < Duration::from_millis(300),
            "round {round}: the release did not wake the writer (it took {:?})",
            at.duration_since(released)
        );
        b.release_rw(&key, writer, RwMode::Write).await.unwrap();
    }
}

/// Read and write holds draw their tokens from the sequence locks and permits draw from: a
/// lock's token, then a reader's, a writer's and another lock's, strictly increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_share_the_lock_sequence() {
    let provider = support::provider().await;
    let ns = support::namespace("rw");
    let (lock_key, rw_key) = (
        CallKey::builder(&ns, "lock").finish(),
        CallKey::builder(&ns, "rw").finish(),
    );
    let mut last = 0u64;
    for step in 0..4 {
        let owner = OwnerToken::new();
        let token = match step {
            1 | 2 => {
                let mode = if step == 1 {
                    RwMode::Read
                } else {
                    RwMode::Write
                };
                let grant = provider
                    .acquire_rw(rw(&rw_key, owner, mode, Duration::ZERO))
                    .await
                    .unwrap()
                    .expect("a free key");
                provider.release_rw(&rw_key, owner, mode).await.unwrap();
                grant.fencing_token.get()
            }
            _ => {
                let grant = provider
                    .acquire(fenced_lock(&lock_key, owner))
                    .await
                    .unwrap()
                    .expect("a free key");
                provider.release(&lock_key, owner).await.unwrap();
                grant.fencing_token.expect("a fenced grant").get()
            }
        };
        assert!(token > last, "step {step}: {token} after {last}");
        last = token;
    }
}

/// A writer that stops waiting withdraws its claim at once: a new reader gets in right after,
/// not only when the claim (30 s here) would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_withdraws_its_claim() {
    let provider = support::provider().await;
    let key = CallKey::builder(&support::namespace("rw"), "give-up").finish();
    let reader = OwnerToken::new();
    provider
        .acquire_rw(rw(&key, reader, RwMode::Read, Duration::ZERO))
        .await
        .unwrap()
        .expect("a free key grants a reader");
    let writer = OwnerToken::new();
    let started = Instant::now();
    let gave_up = provider
        .acquire_rw(rw(&key, writer, RwMode::Write, Duration::from_millis(600)))
        .await
        .unwrap();
    assert!(gave_up.is_none(), "the writer got in beside a reader");
    assert!(started.elapsed() < Duration::from_secs(5));
    let claims = support::server().sql(&format!(
        "SELECT count(*) FROM coord.rw_locks WHERE key = '{}' AND claimant IS NOT NULL",
        key.qualified()
    ));
    assert_eq!(claims, "0", "the claim outlived its writer's wait");
    let late = OwnerToken::new();
    assert!(
        provider
            .acquire_rw(rw(&key, late, RwMode::Read, Duration::ZERO))
            .await
            .unwrap()
            .is_some(),
        "a new reader was kept out by a claim whose writer gave up"
    );
    for owner in [reader, late] {
        provider
            .release_rw(&key, owner, RwMode::Read)
            .await
            .unwrap();
    }
}

/// Ended holds are deleted by the next acquire of the key, and what is left by the sweeper,
/// the key's row included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_holds_are_removed_by_the_next_acquire_and_by_the_sweeper() {
    let provider = support::provider().await;
    let key = CallKey::builder(&support::namespace("rw"), "expiring").finish();
    let short = |owner| RwLockRequest {
        key: &key,
        owner,
        mode: RwMode::Read,
        lease: Duration::from_millis(100),
        wait: Duration::ZERO,
        claim: Duration::from_millis(100),
    };
    for _ in 0..3 {
        assert!(
            provider
                .acquire_rw(short(OwnerToken::new()))
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(rows("rw_holds", &key), "3");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writer = OwnerToken::new();
    let grant = provider
        .acquire_rw(RwLockRequest {
            mode: RwMode::Write,
            ..short(writer)
        })
        .await
        .unwrap();
    assert!(grant.is_some(), "ended read holds do not count");
    assert_eq!(
        rows("rw_holds", &key),
        "1",
        "the acquire removed the ended holds"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let swept = provider.sweep(10_000).await.expect("sweep");
    assert!(
        swept >= 2,
        "the hold and the key's row were swept ({swept})"
    );
    assert_eq!(rows("rw_holds", &key), "0");
    assert_eq!(rows("rw_locks", &key), "0");
}
