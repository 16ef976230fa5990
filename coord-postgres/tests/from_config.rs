//! A coordinator from configuration: `kind = "postgres"` (and `COORD_POSTGRES_URL`) builds
//! one over PostgreSQL; no provider is the in-process fallback; the other kinds are refused
//! naming the crate that builds them; bad values are refused naming the field or variable.

mod support;

use std::path::PathBuf;

use coord_core::config::{ProviderConfig, TlsFiles};
use coord_core::provider::BackendErrorKind;
use coord_core::{ConfigError, CoordConfig, CoordError, Coordinator};
use coord_postgres::coordinator_from_config;

fn postgres(url: String, schema: Option<&str>) -> CoordConfig {
    CoordConfig {
        namespace: Some(support::namespace("cfg")),
        provider: Some(ProviderConfig::Postgres {
            url,
            schema: schema.map(str::to_owned),
            tls: None,
        }),
        ..CoordConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_configuration_builds_a_coordinator_over_postgres() {
    let config = postgres(support::server().url(), None);
    let a = coordinator_from_config(&config)
        .await
        .expect("a coordinator");
    let b = coordinator_from_config(&config).await.expect("another one");
    // Two coordinators of one configuration share the server: a lock held by one is
    // refused to the other, which an in-process provider would not do.
    let key = a.key("cfg").part("1").finish();
    let held = a
        .lock(key.clone())
        .try_acquire()
        .await
        .unwrap()
        .expect("free");
    assert!(b.lock(key.clone()).try_acquire().await.unwrap().is_none());
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_variables_are_read_and_checked() {
    let vars = |pairs: &[(&str, &str)]| {
        CoordConfig::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    };
    let config = vars(&[
        ("COORD_POSTGRES_URL", " postgres://u@db:5432/app "),
        ("COORD_POSTGRES_SCHEMA", "coord_jobs"),
        ("COORD_POSTGRES_TLS_CA_FILE", "/etc/ca.pem"),
    ])
    .expect("valid");
    assert_eq!(
        config.provider,
        Some(ProviderConfig::Postgres {
            url: "postgres://u@db:5432/app".into(),
            schema: Some("coord_jobs".into()),
            tls: Some(TlsFiles {
                ca_file: Some(PathBuf::from("/etc/ca.pem")),
                ..TlsFiles::default()
            }),
        })
    );
    let both = vars(&[
        ("COORD_POSTGRES_URL", "postgres://db/app"),
        ("COORD_REDIS_URL", "redis://r:6379"),
    ])
    .unwrap_err();
    assert!(matches!(&both, ConfigError::Variable { .. }), "{both}");
    let message = both.to_string();
    assert!(
        message.contains("COORD_REDIS_URL") && message.contains("COORD_POSTGRES_URL"),
        "{message}"
    );
    let stray = vars(&[("COORD_POSTGRES_SCHEMA", "x")]).unwrap_err();
    assert!(stray.to_string().contains("COORD_POSTGRES_URL"), "{stray}");
    let typo = vars(&[("COORD_POSTGRES_SCHEME", "x")]).unwrap_err();
    assert!(typo.to_string().contains("COORD_POSTGRES_SCHEMA"), "{typo}");
    let bad_schema = vars(&[
        ("COORD_POSTGRES_URL", "postgres://db/app"),
        ("COORD_POSTGRES_SCHEMA", "Bad-Name"),
    ])
    .unwrap_err();
    assert!(
        matches!(&bad_schema, ConfigError::Invalid { field, .. } if field == "provider.schema"),
        "{bad_schema}"
    );
    // And from serde, as an application's own configuration file would give it.
    let parsed: CoordConfig = serde_json::from_str(
        r#"{ "provider": { "kind": "postgres", "url": "postgres://db/app", "schema": "c",
             "tls": { "ca_file": "/ca.pem" } } }"#,
    )
    .unwrap();
    assert!(matches!(
        parsed.provider,
        Some(ProviderConfig::Postgres { .. })
    ));
    parsed.validate().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_over_variables_connects() {
    let url = support::server().url();
    let config = CoordConfig::from_vars([
        ("COORD_POSTGRES_URL".to_owned(), url),
        ("COORD_NAMESPACE".to_owned(), support::namespace("env")),
    ])
    .unwrap();
    let coordinator = coordinator_from_config(&config).await.expect("connects");
    let ran = coordinator
        .idempotent(coordinator.key("env").part("1").finish())
        .run(|| async { Ok::<_, CoordError>(7u8) })
        .await
        .unwrap();
    assert_eq!(ran, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_name_the_fix() {
    // No tables in that schema: a configuration problem saying what to run.
    let err = coordinator_from_config(&postgres(support::server().url(), Some("cfg_nothing")))
        .await
        .unwrap_err();
    let ConfigError::Backend(backend) = &err else {
        panic!("expected a backend error, got {err:?}");
    };
    assert_eq!(backend.kind(), BackendErrorKind::Config);
    assert!(backend.message().contains("coord migrate"), "{err}");
    // Nothing listens there.
    let err = coordinator_from_config(&postgres("postgres://u@127.0.0.1:1/db".into(), None))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Backend(e) if e.kind().is_transient()),
        "{err:?}"
    );
    // A URL tokio-postgres does not read.
    let err = coordinator_from_config(&postgres("postgres://h/db?sslmode=sometimes".into(), None))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Backend(e) if e.kind() == BackendErrorKind::Config),
        "{err:?}"
    );
    // An empty URL is refused before anything is tried.
    let err = coordinator_from_config(&postgres("  ".into(), None))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, .. } if field == "provider.url"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_kinds_are_refused_naming_the_crate_that_builds_them() {
    let redis = CoordConfig {
        provider: Some(ProviderConfig::Redis {
            url: "redis://127.0.0.1:6379".into(),
            tls: None,
        }),
        ..CoordConfig::default()
    };
    let err = coordinator_from_config(&redis).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("coord_redis::coordinator_from_config"),
        "{err}"
    );
    // And coord-core's own builder refuses PostgreSQL, naming this crate.
    let err = Coordinator::from_config(&postgres("postgres://db/app".into(), None)).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::ProviderNeedsBackendCrate {
                kind: "postgres",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("coord_postgres::coordinator_from_config"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_provider_is_the_in_process_fallback() {
    let config = CoordConfig {
        namespace: Some("fallback".into()),
        ..CoordConfig::default()
    };
    let coordinator = coordinator_from_config(&config).await.expect("in-process");
    // The in-process provider: a lock is not seen by another coordinator.
    let other = coordinator_from_config(&config).await.unwrap();
    let key = coordinator.key("x").finish();
    let _held = coordinator
        .lock(key.clone())
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(other.lock(key).try_acquire().await.unwrap().is_some());
}
