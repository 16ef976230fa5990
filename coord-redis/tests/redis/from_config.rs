//! `coordinator_from_config`: a configuration naming Redis gives a Redis-backed coordinator
//! (a lock taken through one is seen by another built from the same configuration); none
//! gives the in-process one; its namespace and profiles are applied.

use std::time::Duration;

use coord_core::config::ConfigError;
use coord_core::config::ProviderConfig;
use coord_core::{CoordConfig, CoordError, Profile};
use coord_redis::coordinator_from_config;
use coord_redis_testing::RedisServer;

fn redis_config(url: String) -> CoordConfig {
    let mut config = CoordConfig {
        provider: Some(ProviderConfig::Redis { url, tls: None }),
        namespace: Some("from-config".into()),
        command_timeout: Some(Duration::from_secs(2)),
        ..CoordConfig::default()
    };
    config.profiles.insert(
        "quick".into(),
        Profile {
            wait: Some(Duration::from_millis(200)),
            ..Profile::default()
        },
    );
    config
}

#[tokio::test]
async fn a_redis_url_gives_a_coordinator_shared_across_instances() {
    let server = RedisServer::start();
    let config = redis_config(server.url());
    let one = coordinator_from_config(&config).await.unwrap();
    let two = coordinator_from_config(&config).await.unwrap();
    assert!(!one.is_in_process_only());
    assert_eq!(one.namespace(), "from-config");

    let key = one.key("jobs.rebuild").part(&42u64).finish();
    let guard = one
        .lock(key.clone())
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    // The second coordinator sees the first one's lock: they share the server.
    let started = std::time::Instant::now();
    let err = two
        .lock(two.key("jobs.rebuild").part(&42u64).finish())
        .wait(Duration::from_secs(30))
        .profile("quick")
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::LockNotAcquired { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the profile's 200 ms wait was ignored"
    );
    assert!(guard.release().await.unwrap());
    let again = two
        .lock(two.key("jobs.rebuild").part(&42u64).finish())
        .try_acquire()
        .await
        .unwrap();
    assert!(
        again.is_some(),
        "free once the first coordinator released it"
    );
}

#[tokio::test]
async fn no_provider_gives_the_in_process_coordinator() {
    let config = CoordConfig {
        namespace: Some("local-only".into()),
        ..CoordConfig::default()
    };
    let c = coordinator_from_config(&config).await.unwrap();
    assert!(c.is_in_process_only());
    assert_eq!(c.namespace(), "local-only");
    let explicit = CoordConfig {
        provider: Some(ProviderConfig::Memory),
        ..CoordConfig::default()
    };
    assert!(
        coordinator_from_config(&explicit)
            .await
            .unwrap()
            .is_in_process_only()
    );
}

#[tokio::test]
async fn an_unreachable_server_and_an_invalid_configuration_are_errors() {
    // A port nothing listens on (the server is stopped when dropped).
    let url = {
        let server = RedisServer::start();
        server.url()
    };
    let err = coordinator_from_config(&redis_config(url))
        .await
        .unwrap_err();
    assert!(matches!(err, ConfigError::Backend(_)), "{err:?}");

    let mut config = redis_config("redis://127.0.0.1:1".into());
    config.defaults.lease = Some(Duration::ZERO);
    let err = coordinator_from_config(&config).await.unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, .. } if field == "defaults.lease"),
        "{err:?}"
    );
}

#[tokio::test]
async fn tls_files_from_the_configuration_are_used() {
    use coord_core::config::TlsFiles;
    use coord_redis_testing::TestCerts;

    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs, true);
    let config = |tls: Option<TlsFiles>| CoordConfig {
        provider: Some(ProviderConfig::Redis {
            url: server.tls_url(),
            tls,
        }),
        namespace: Some("from-config-tls".into()),
        ..CoordConfig::default()
    };
    // The test CA is in no system store, and the server asks for a client certificate:
    // connecting works only if both files of the configuration are used.
    let without = coordinator_from_config(&config(None)).await.unwrap_err();
    assert!(matches!(without, ConfigError::Backend(_)), "{without:?}");
    let ca_only = coordinator_from_config(&config(Some(TlsFiles {
        ca_file: Some(certs.ca_file()),
        ..TlsFiles::default()
    })))
    .await
    .unwrap_err();
    assert!(matches!(ca_only, ConfigError::Backend(_)), "{ca_only:?}");
    let half = coordinator_from_config(&config(Some(TlsFiles {
        ca_file: Some(certs.ca_file()),
        client_cert_file: Some(certs.client_cert_file()),
        client_key_file: None,
    })))
    .await
    .unwrap_err();
    assert!(
        matches!(&half, ConfigError::Invalid { field, .. } if field == "provider.tls"),
        "{half:?}"
    );

    let c = coordinator_from_config(&config(Some(TlsFiles {
        ca_file: Some(certs.ca_file()),
        client_cert_file: Some(certs.client_cert_file()),
        client_key_file: Some(certs.client_key_file()),
    })))
    .await
    .unwrap();
    let guard = c
        .lock(c.key("tls.job").part(&1u64).finish())
        .acquire()
        .await
        .unwrap();
    assert!(guard.release().await.unwrap());
}

/// Two coordinators from one configuration share state: a lock taken through one is held for
/// the other.
async fn shared_through(config: &CoordConfig) {
    let one = coordinator_from_config(config).await.unwrap();
    let two = coordinator_from_config(config).await.unwrap();
    assert!(!one.is_in_process_only());
    let key = |c: &coord_core::Coordinator| c.key("topology.job").part(&7u64).finish();
    let guard = one.lock(key(&one)).acquire().await.unwrap();
    assert!(two.lock(key(&two)).try_acquire().await.unwrap().is_none());
    assert!(guard.release().await.unwrap());
    assert!(two.lock(key(&two)).try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_sentinel_configurations_connect_their_topology() {
    use coord_redis_testing::{RedisCluster, SentinelSetup};

    let cluster = RedisCluster::start(3);
    shared_through(&CoordConfig {
        provider: Some(ProviderConfig::Cluster {
            urls: cluster.urls(),
            tls: None,
        }),
        namespace: Some("from-config-cluster".into()),
        ..CoordConfig::default()
    })
    .await;

    let setup = SentinelSetup::start();
    shared_through(&CoordConfig {
        provider: Some(ProviderConfig::Sentinel {
            urls: setup.sentinel_urls(),
            service_name: SentinelSetup::MASTER_NAME.into(),
            username: None,
            password: None,
            tls: None,
        }),
        namespace: Some("from-config-sentinel".into()),
        ..CoordConfig::default()
    })
    .await;
}

/// A PostgreSQL configuration is not built here: the error names the function that builds it.
#[tokio::test]
async fn a_postgres_configuration_is_refused_naming_coord_postgres() {
    let config = CoordConfig {
        provider: Some(ProviderConfig::Postgres {
            url: "postgres://127.0.0.1:5432/app".into(),
            schema: None,
            tls: None,
        }),
        ..CoordConfig::default()
    };
    let err = coordinator_from_config(&config).await.unwrap_err();
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
