//! The schema as versioned migrations: connecting to a missing, older or newer schema is a
//! typed error naming what to run; migrating creates the tables once (two migrators at once
//! included); the provider then works as a role that may not change the schema (no DDL on
//! any call's path).

mod support;

use std::time::Duration;

use coord_core::Coordinator;
use coord_postgres::{ConnectError, PostgresProvider, SCHEMA_VERSION, SchemaError};

fn builder(schema: &str) -> coord_postgres::PostgresProviderBuilder {
    PostgresProvider::builder(support::server().url())
        .schema(schema)
        .command_timeout(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_refused_until_migrated() {
    let err = builder("m_missing").connect().await.unwrap_err();
    let ConnectError::Schema(SchemaError::Missing { schema }) = &err else {
        panic!("expected a missing schema, got {err:?}");
    };
    assert_eq!(schema, "m_missing");
    let message = err.to_string();
    assert!(message.contains("coord migrate"), "{message}");
    assert!(message.contains("PostgresProvider::migrate"), "{message}");

    let report = builder("m_missing").migrate().await.expect("migrate");
    assert_eq!((report.from, report.to), (0, SCHEMA_VERSION));
    assert!(report.applied_any());
    let again = builder("m_missing").migrate().await.expect("migrate again");
    assert_eq!((again.from, again.to), (SCHEMA_VERSION, SCHEMA_VERSION));
    assert!(!again.applied_any(), "a second migration applies nothing");
    let provider = builder("m_missing")
        .connect()
        .await
        .expect("connect once migrated");
    assert_eq!(provider.schema(), "m_missing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_refused_and_migrating_brings_it_up() {
    support::server().sql(
        "CREATE SCHEMA m_old; CREATE TABLE m_old.schema_version (version integer PRIMARY KEY, \
         name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
    );
    let err = builder("m_old").connect().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ConnectError::Schema(SchemaError::Outdated { found: 0, expected, .. })
                if *expected == SCHEMA_VERSION
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("coord migrate"), "{err}");
    let report = builder("m_old").migrate().await.expect("migrate");
    assert_eq!((report.from, report.to), (0, SCHEMA_VERSION));
    builder("m_old")
        .connect()
        .await
        .expect("connect once migrated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused_and_not_migrated_down() {
    builder("m_newer").migrate().await.expect("migrate");
    support::server()
        .sql("INSERT INTO m_newer.schema_version (version, name) VALUES (99, 'future')");
    let err = builder("m_newer").connect().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ConnectError::Schema(SchemaError::Newer { found: 99, .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade coord-postgres"), "{err}");
    let err = builder("m_newer").migrate().await.unwrap_err();
    assert!(
        matches!(
            &err,
            ConnectError::Schema(SchemaError::Newer { found: 99, .. })
        ),
        "{err:?}"
    );
    // As a backend error (what `coordinator_from_config` reports), it is a configuration
    // problem with the same message.
    let backend = coord_core::BackendError::from(err);
    assert_eq!(
        backend.kind(),
        coord_core::provider::BackendErrorKind::Config
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_migrators_at_once_apply_the_migrations_once() {
    let (a, b) = tokio::join!(builder("m_twice").migrate(), builder("m_twice").migrate());
    let (a, b) = (a.expect("first migrator"), b.expect("second migrator"));
    assert_eq!(
        u32::from(a.applied_any()) + u32::from(b.applied_any()),
        1,
        "exactly one applied: {a:?} {b:?}"
    );
    let versions = support::server().sql("SELECT count(*) FROM m_twice.schema_version");
    assert_eq!(versions, SCHEMA_VERSION.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_needs_no_ddl_rights() {
    let server = support::server();
    builder("m_dml").migrate().await.expect("migrate");
    server.sql(
        "CREATE ROLE m_app LOGIN; \
         GRANT USAGE ON SCHEMA m_dml TO m_app; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA m_dml TO m_app; \
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA m_dml TO m_app",
    );
    let url = format!("postgres://m_app@127.0.0.1:{}/postgres", server.port());
    let provider = PostgresProvider::builder(url)
        .schema("m_dml")
        .connect()
        .await
        .expect("connect as a role that may only read and write rows");
    let coordinator = Coordinator::builder()
        .namespace("dml")
        .provider(provider.clone())
        .build()
        .unwrap();
    let key = coordinator.key("jobs").part("1").finish();
    let guard = coordinator
        .lock(key.clone())
        .fenced()
        .try_acquire()
        .await
        .expect("a lock as m_app")
        .expect("free");
    assert!(guard.fencing_token().is_some());
    drop(guard);
    let ran = coordinator
        .idempotent(coordinator.key("charge").part("7").finish())
        .run(|| async { Ok::<_, coord_core::CoordError>(42u32) })
        .await
        .expect("an idempotent call as m_app");
    assert_eq!(ran, 42);
    assert!(
        provider.sweep(100).await.is_ok(),
        "the sweeper needs no more rights"
    );
    // The schema's owner is not m_app: it could not have created anything.
    let owner = server.sql("SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'm_dml'");
    assert_eq!(owner, "postgres");
}
