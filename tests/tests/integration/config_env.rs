//! `CoordConfig` from `COORD_*` variables (over a fake environment: the process's is never
//! changed), from TOML, and the default namespace.

use std::time::Duration;

use coord_core::config::ProviderConfig;
use coord_core::config::{ConfigError, ENV_VARIABLES, TlsFiles, default_namespace};
use coord_core::{CoordConfig, Coordinator, OnBackendError, Profile};

fn read(vars: &[(&str, &str)]) -> Result<CoordConfig, ConfigError> {
    CoordConfig::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

fn variable_of(err: ConfigError) -> String {
    match err {
        ConfigError::Variable { variable, .. } => variable,
        other => panic!("expected an error naming a variable, got {other:?}"),
    }
}

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn every_variable_is_read() {
    let config = read(&[
        ("COORD_NAMESPACE", "payflow"),
        ("COORD_REDIS_URL", "rediss://redis.internal:6380"),
        ("COORD_REDIS_TLS_CA_FILE", "ca.pem"),
        ("COORD_REDIS_TLS_CLIENT_CERT_FILE", "client.pem"),
        ("COORD_REDIS_TLS_CLIENT_KEY_FILE", "client.key"),
        ("COORD_COMMAND_TIMEOUT", "750ms"),
        ("COORD_LEASE", "40s"),
        ("COORD_WAIT", "2s"),
        ("COORD_RETENTION", "2d"),
        ("COORD_IN_FLIGHT_LEASE", "45s"),
        ("COORD_RENEW", "10s"),
        ("COORD_ON_BACKEND_ERROR", "fail_open"),
        ("COORD_PROFILE_PAYMENTS_LEASE", "1m"),
        ("COORD_PROFILE_PAYMENTS_WAIT", "5s"),
        ("COORD_PROFILE_PAYMENTS_RETENTION", "7d"),
        ("COORD_PROFILE_PAYMENTS_IN_FLIGHT_LEASE", "2m"),
        ("COORD_PROFILE_PAYMENTS_RENEW", "20s"),
        ("COORD_PROFILE_PAYMENTS_ON_BACKEND_ERROR", "fail_closed"),
        ("COORD_PROFILE_BULK_JOBS_WAIT", "0s"),
        ("PATH", "not ours"),
        (
            "COORD_HTTP_ADDR",
            "an application's own setting, not close to one of coord's",
        ),
    ])
    .unwrap();
    let expected = CoordConfig {
        provider: Some(ProviderConfig::Redis {
            url: "rediss://redis.internal:6380".into(),
            tls: Some(TlsFiles {
                ca_file: Some("ca.pem".into()),
                client_cert_file: Some("client.pem".into()),
                client_key_file: Some("client.key".into()),
            }),
        }),
        namespace: Some("payflow".into()),
        command_timeout: Some(Duration::from_millis(750)),
        defaults: Profile {
            lease: Some(S(40)),
            wait: Some(S(2)),
            retention: Some(S(2 * 86_400)),
            in_flight_lease: Some(S(45)),
            renew: Some(S(10)),
            on_backend_error: Some(OnBackendError::FailOpen),
        },
        profiles: [
            (
                "payments".to_owned(),
                Profile {
                    lease: Some(S(60)),
                    wait: Some(S(5)),
                    retention: Some(S(7 * 86_400)),
                    in_flight_lease: Some(S(120)),
                    renew: Some(S(20)),
                    on_backend_error: Some(OnBackendError::FailClosed),
                },
            ),
            (
                "bulk_jobs".to_owned(),
                Profile {
                    wait: Some(Duration::ZERO),
                    ..Profile::default()
                },
            ),
        ]
        .into_iter()
        .collect(),
    };
    assert_eq!(config, expected);
}

/// The variables the tests of this file set; every documented one must be among them, so a
/// variable added to the table without a test fails here.
const TESTED: &[&str] = &[
    "COORD_NAMESPACE",
    "COORD_REDIS_URL",
    "COORD_REDIS_TLS_CA_FILE",
    "COORD_REDIS_TLS_CLIENT_CERT_FILE",
    "COORD_REDIS_TLS_CLIENT_KEY_FILE",
    "COORD_COMMAND_TIMEOUT",
    "COORD_LEASE",
    "COORD_WAIT",
    "COORD_RETENTION",
    "COORD_IN_FLIGHT_LEASE",
    "COORD_RENEW",
    "COORD_ON_BACKEND_ERROR",
    "COORD_REDIS_SENTINEL_URLS",
    "COORD_REDIS_SENTINEL_SERVICE_NAME",
    "COORD_REDIS_SENTINEL_USERNAME",
    "COORD_REDIS_SENTINEL_PASSWORD",
    "COORD_REDIS_CLUSTER_URLS",
    "COORD_POSTGRES_URL",
    "COORD_POSTGRES_SCHEMA",
    "COORD_POSTGRES_TLS_CA_FILE",
];

#[test]
fn every_documented_variable_is_tested() {
    for (name, _) in ENV_VARIABLES {
        assert!(
            TESTED.contains(name),
            "{name} is documented but not tested here"
        );
    }
    assert_eq!(ENV_VARIABLES.len(), TESTED.len());
}

#[test]
fn sentinel_and_cluster_variables_pick_their_topology() {
    let sentinel = read(&[
        (
            "COORD_REDIS_SENTINEL_URLS",
            "redis://10.0.0.5:26379, redis://10.0.0.6:26379",
        ),
        ("COORD_REDIS_SENTINEL_SERVICE_NAME", "mymaster"),
        ("COORD_REDIS_SENTINEL_USERNAME", "coord"),
        ("COORD_REDIS_SENTINEL_PASSWORD", "secret"),
    ])
    .unwrap();
    assert_eq!(
        sentinel.provider,
        Some(ProviderConfig::Sentinel {
            urls: vec![
                "redis://10.0.0.5:26379".into(),
                "redis://10.0.0.6:26379".into()
            ],
            service_name: "mymaster".into(),
            username: Some("coord".into()),
            password: Some("secret".into()),
            tls: None,
        })
    );
    let cluster = read(&[("COORD_REDIS_CLUSTER_URLS", "redis://a:7000,redis://b:7001")]).unwrap();
    assert_eq!(
        cluster.provider,
        Some(ProviderConfig::Cluster {
            urls: vec!["redis://a:7000".into(), "redis://b:7001".into()],
            tls: None,
        })
    );
    assert_eq!(read(&[]).unwrap(), CoordConfig::default());
}

#[test]
fn postgres_variables_pick_postgres() {
    let postgres = read(&[
        ("COORD_POSTGRES_URL", "postgres://coord@db:5432/app"),
        ("COORD_POSTGRES_SCHEMA", "coord_jobs"),
        ("COORD_POSTGRES_TLS_CA_FILE", "pg-ca.pem"),
    ])
    .unwrap();
    assert_eq!(
        postgres.provider,
        Some(ProviderConfig::Postgres {
            url: "postgres://coord@db:5432/app".into(),
            schema: Some("coord_jobs".into()),
            tls: Some(TlsFiles {
                ca_file: Some("pg-ca.pem".into()),
                ..TlsFiles::default()
            }),
        })
    );
    let both = read(&[
        ("COORD_POSTGRES_URL", "postgres://db/app"),
        ("COORD_REDIS_CLUSTER_URLS", "redis://a:7000"),
    ])
    .unwrap_err();
    assert!(both.to_string().contains("set one of them"), "{both}");
    assert_eq!(
        variable_of(read(&[("COORD_POSTGRES_SCHEMA", "coord")]).unwrap_err()),
        "COORD_POSTGRES_SCHEMA"
    );
}

#[test]
fn a_malformed_variable_is_named_in_the_error() {
    for (name, value) in [
        ("COORD_LEASE", "30 seconds"),
        ("COORD_WAIT", "1.5s"),
        ("COORD_RETENTION", "forever"),
        ("COORD_IN_FLIGHT_LEASE", "-1s"),
        ("COORD_RENEW", "10"),
        ("COORD_COMMAND_TIMEOUT", "soon"),
        ("COORD_ON_BACKEND_ERROR", "maybe"),
        ("COORD_PROFILE_PAYMENTS_WAIT", "2 s"),
        ("COORD_PROFILE_PAYMENTS_ON_BACKEND_ERROR", "open"),
        ("COORD_PROFILE_PAYMENTS_TIMEOUT", "2s"),
        ("COORD_PROFILE__WAIT", "2s"),
    ] {
        let err = read(&[(name, value)]).unwrap_err();
        assert!(err.to_string().contains(name), "{name}: {err}");
        assert_eq!(variable_of(err), name);
    }
}

#[test]
fn a_value_coord_cannot_honour_is_named_by_its_field() {
    let err = read(&[("COORD_LEASE", "0s")]).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, .. } if field == "defaults.lease"),
        "{err:?}"
    );
    let err = read(&[
        ("COORD_PROFILE_PAYMENTS_LEASE", "10s"),
        ("COORD_PROFILE_PAYMENTS_RENEW", "10s"),
    ])
    .unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, .. } if field == "profiles.payments.renew"),
        "{err:?}"
    );
    let err = read(&[("COORD_NAMESPACE", "pay flow")]).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, .. } if field == "namespace"),
        "{err:?}"
    );
}

#[test]
fn a_misspelt_coord_variable_is_reported() {
    for (typo, meant) in [
        ("COORD_REDIS_ULR", "COORD_REDIS_URL"),
        ("COORD_NAMESPCE", "COORD_NAMESPACE"),
        ("COORD_LEASES", "COORD_LEASE"),
        ("COORD_RETENSION", "COORD_RETENTION"),
    ] {
        let err = read(&[(typo, "x")]).unwrap_err();
        assert!(err.to_string().contains(meant), "{typo}: {err}");
        assert_eq!(variable_of(err), typo);
    }
    // Under COORD_REDIS_ nothing unknown is let through, close to a known name or not.
    assert_eq!(
        variable_of(read(&[("COORD_REDIS_POOL", "4")]).unwrap_err()),
        "COORD_REDIS_POOL"
    );
}

#[test]
fn two_providers_or_a_stray_provider_setting_are_refused() {
    let err = read(&[
        ("COORD_REDIS_URL", "redis://a"),
        ("COORD_REDIS_CLUSTER_URLS", "redis://b"),
    ])
    .unwrap_err();
    assert!(err.to_string().contains("COORD_REDIS_URL"), "{err}");
    let err = read(&[("COORD_REDIS_SENTINEL_URLS", "redis://s:26379")]).unwrap_err();
    assert_eq!(variable_of(err), "COORD_REDIS_SENTINEL_SERVICE_NAME");
    let err = read(&[("COORD_REDIS_TLS_CA_FILE", "ca.pem")]).unwrap_err();
    assert_eq!(variable_of(err), "COORD_REDIS_TLS_CA_FILE");
}

#[cfg(unix)]
#[test]
fn a_value_that_is_not_utf8_is_named() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let vars = vec![(
        OsString::from("COORD_WAIT"),
        OsString::from_vec(vec![0xff, 0xfe]),
    )];
    assert_eq!(
        variable_of(CoordConfig::from_vars(vars).unwrap_err()),
        "COORD_WAIT"
    );
}

#[test]
fn the_namespace_defaults_to_the_binarys_name() {
    // This test binary's file name (cargo names it after the test target, plus a hash).
    let exe = std::env::current_exe().unwrap();
    let stem = exe.file_stem().unwrap().to_string_lossy().into_owned();
    assert!(stem.starts_with("integration"), "{stem}");
    if std::env::var_os("COORD_NAMESPACE").is_none() {
        assert_eq!(default_namespace(), stem);
        let c = Coordinator::builder().memory().build().unwrap();
        assert_eq!(c.namespace(), stem, "the builder without .namespace()");
        let from_config = Coordinator::from_config(&CoordConfig::default()).unwrap();
        assert_eq!(
            from_config.namespace(),
            stem,
            "a configuration without a namespace"
        );
    }
    let named =
        Coordinator::from_config(&read(&[("COORD_NAMESPACE", "payflow")]).unwrap()).unwrap();
    assert_eq!(named.namespace(), "payflow");
    assert!(named.is_in_process_only());
}

#[test]
fn from_config_never_falls_back_to_memory_when_redis_is_named() {
    let config = read(&[("COORD_REDIS_URL", "redis://127.0.0.1:1")]).unwrap();
    let err = Coordinator::from_config(&config).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::ProviderNeedsBackendCrate {
                kind: "redis",
                from_env: false
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the configuration names a `redis` provider, and `Coordinator::from_config` \
         (coord-core alone) builds only the in-process coordinator: call \
         `coord_redis::coordinator_from_config(&config)` instead",
        "names what was called and what to call instead"
    );
}

#[test]
fn from_config_applies_namespace_defaults_and_profiles() {
    let config: CoordConfig = toml::from_str(
        r#"
        namespace = "payflow"
        [provider]
        kind = "memory"
        [defaults]
        lease = "45s"
        on_backend_error = "fail_open"
        [profiles.payments]
        wait = "2s"
        "#,
    )
    .unwrap();
    let c = Coordinator::from_config(&config).unwrap();
    assert_eq!(c.namespace(), "payflow");
    assert_eq!(c.on_backend_error(), OnBackendError::FailOpen);
    assert_eq!(c.profile("payments").unwrap().wait, Some(S(2)));
    assert!(c.profile("other").is_none());
}

#[test]
fn a_full_configuration_reads_from_toml_and_round_trips() {
    let text = r#"
        namespace = "payflow"
        command_timeout = "500ms"

        [provider]
        kind = "sentinel"
        urls = ["redis://10.0.0.5:26379", "redis://10.0.0.6:26379"]
        service_name = "mymaster"
        password = "secret"
        tls = { ca_file = "ca.pem" }

        [defaults]
        lease = "30s"
        wait = "1s"
        retention = "24h"
        in_flight_lease = "1m"
        renew = "10s"
        on_backend_error = "fail_closed"

        [profiles.payments]
        wait = "5s"
        retention = "7d"

        [profiles.reports]
        lease = "1h30m"
        renew = "10m"
    "#;
    let config: CoordConfig = toml::from_str(text).unwrap();
    config.validate().unwrap();
    assert_eq!(config.command_timeout, Some(Duration::from_millis(500)));
    assert_eq!(config.defaults.in_flight_lease, Some(S(60)));
    assert_eq!(config.profiles["reports"].lease, Some(S(5400)));
    assert!(matches!(
        &config.provider,
        Some(ProviderConfig::Sentinel { service_name, tls: Some(tls), .. })
            if service_name == "mymaster" && tls.ca_file.as_deref() == Some("ca.pem".as_ref())
    ));
    let written = toml::to_string(&config).unwrap();
    let again: CoordConfig = toml::from_str(&written).unwrap();
    assert_eq!(again, config, "{written}");
}

#[test]
fn unknown_fields_are_refused_not_ignored() {
    for (text, typo) in [
        ("namespce = \"x\"", "namespce"),
        ("[defaults]\nleese = \"30s\"", "leese"),
        ("[profiles.payments]\nwiat = \"1s\"", "wiat"),
        (
            "[provider]\nkind = \"redis\"\nurl = \"redis://a\"\nulr = \"x\"",
            "ulr",
        ),
        (
            "[provider]\nkind = \"redis\"\nurl = \"redis://a\"\ntls = { ca = \"x\" }",
            "ca",
        ),
    ] {
        let err = toml::from_str::<CoordConfig>(text).unwrap_err();
        assert!(err.to_string().contains(typo), "{typo}: {err}");
    }
    let err = toml::from_str::<CoordConfig>("[provider]\nkind = \"etcd\"").unwrap_err();
    assert!(err.to_string().contains("etcd"), "{err}");
    let err = toml::from_str::<CoordConfig>("[defaults]\nlease = \"30 s\"").unwrap_err();
    assert!(err.to_string().contains("invalid duration"), "{err}");
}

#[test]
fn validation_names_the_field() {
    let mut config = CoordConfig::default();
    config.profiles.insert(
        "payments".into(),
        Profile {
            retention: Some(Duration::ZERO),
            ..Profile::default()
        },
    );
    let err = config.validate().unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { field, .. } if field == "profiles.payments.retention"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("profiles.payments.retention"),
        "{err}"
    );
    let config = CoordConfig {
        command_timeout: Some(Duration::ZERO),
        ..CoordConfig::default()
    };
    assert!(
        matches!(config.validate().unwrap_err(), ConfigError::Invalid { field, .. } if field == "command_timeout")
    );
    let config = CoordConfig {
        provider: Some(ProviderConfig::Cluster {
            urls: vec![],
            tls: None,
        }),
        ..CoordConfig::default()
    };
    assert!(
        matches!(config.validate().unwrap_err(), ConfigError::Invalid { field, .. } if field == "provider.urls")
    );
}
