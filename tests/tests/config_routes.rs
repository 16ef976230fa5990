//! The two ways to build a coordinator, as a new user meets them, and every message on the
//! way: what each says it saw and the one thing to do next.
//!
//! * From the environment (`coord_redis::coordinator_from_env()`, the documented route):
//!   `COORD_REDIS_URL`, `COORD_WAIT`, `COORD_PROFILE_<NAME>_<FIELD>` all apply.
//! * In code (`Coordinator::builder()`): reads none of them, and says so once, naming them,
//!   when they are set; a call naming a profile it was not given fails with a message that
//!   names the fix.
//!
//! Alone in its test binary, as one test: it changes the process environment, and the
//! warnings it reads are once per process.

use std::sync::Arc;
use std::time::Duration;

use coord_core::config::ProviderConfig;
use coord_core::report::LockOutcome;
use coord_core::{ConfigError, CoordConfig, CoordError, Coordinator, distributed_lock, observe};
use coord_redis::RedisProvider;
use coord_redis_testing::RedisServer;
use coord_tests::support::SpanRecorder;
use tracing_subscriber::layer::SubscriberExt;

#[distributed_lock(key_from = "job", coordinator = c, name = "jobs.nightly", profile = "nightly")]
async fn nightly(c: &Coordinator, job: &str) -> Result<(), CoordError> {
    let _ = job;
    Ok(())
}

/// Holds the lock of `job` for `hold`; the lock's wait is the coordinator's default.
#[distributed_lock(key_from = "job", coordinator = c, name = "jobs.report")]
async fn report(c: &Coordinator, job: &str, hold: Duration) -> Result<(), CoordError> {
    let _ = job;
    tokio::time::sleep(hold).await;
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Sets or removes `COORD_*` variables.
///
/// # Safety
/// No other thread may read or write the environment meanwhile: call it only while no
/// runtime (and no other test) is running in this process.
unsafe fn set_env(vars: &[(&str, Option<&str>)]) {
    for (name, value) in vars {
        // SAFETY: the caller guarantees no other thread touches the environment.
        unsafe {
            match value {
                Some(value) => std::env::set_var(name, value),
                None => std::env::remove_var(name),
            }
        }
    }
}

/// coord's own warnings (not coord-redis's about the server) logged since `*seen`, advancing
/// it.
fn new_warnings(recorder: &SpanRecorder, seen: &mut usize) -> Vec<String> {
    let all = recorder.warnings();
    let fresh = all[*seen..]
        .iter()
        .filter(|w| w.starts_with("coord: "))
        .cloned()
        .collect();
    *seen = all.len();
    fresh
}

#[test]
fn every_route_says_what_it_did_and_what_to_do_next() {
    let recorder = SpanRecorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .expect("the only subscriber of this binary");
    let mut seen = 0;
    let clean: Vec<(String, Option<&str>)> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("COORD_"))
        .map(|k| (k, None))
        .collect();
    let clean: Vec<(&str, Option<&str>)> = clean.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    // SAFETY: nothing else runs in this binary yet.
    unsafe { set_env(&clean) };

    // coord-core alone, from the environment, nothing set: in process, and says how to go on.
    let c = Coordinator::from_env().unwrap();
    assert!(c.is_in_process_only());
    assert_eq!(
        new_warnings(&recorder, &mut seen),
        [
            "coord: `Coordinator::from_env` built the in-process coordinator (no COORD_REDIS_URL \
          is set, and coord-core alone connects no provider), so locks, single-flight and \
          idempotency hold within this process only. To coordinate across processes, build \
          with `coord_redis::coordinator_from_env()` and set COORD_REDIS_URL"
        ]
    );

    // coord-core alone with COORD_REDIS_URL set: refused, naming the variable and the call.
    // SAFETY: no runtime is running.
    unsafe { set_env(&[("COORD_REDIS_URL", Some("redis://127.0.0.1:1"))]) };
    let err = Coordinator::from_env().unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::ProviderNeedsBackendCrate {
                kind: "redis",
                from_env: true
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "COORD_REDIS_URL is set, so the environment names a `redis` provider, and \
         `Coordinator::from_env` (coord-core alone) builds only the in-process coordinator: \
         call `coord_redis::coordinator_from_env()` instead"
    );
    // SAFETY: no runtime is running.
    unsafe { set_env(&[("COORD_REDIS_URL", None)]) };

    // coord-redis from the environment, nothing set: in process, and names the variable.
    let c = runtime()
        .block_on(coord_redis::coordinator_from_env())
        .unwrap();
    assert!(c.is_in_process_only());
    assert_eq!(
        new_warnings(&recorder, &mut seen),
        [
            "coord: `coordinator_from_env()` found none of COORD_REDIS_URL, \
          COORD_REDIS_SENTINEL_URLS and COORD_REDIS_CLUSTER_URLS set, so it built the \
          in-process coordinator: locks, single-flight and idempotency hold within this \
          process only. Set COORD_REDIS_URL (redis://host:6379) in this process's environment"
        ]
    );

    // coord-redis from a configuration without a provider: names what to add to it.
    let c = runtime()
        .block_on(coord_redis::coordinator_from_config(&CoordConfig::default()))
        .unwrap();
    assert!(c.is_in_process_only());
    assert_eq!(
        new_warnings(&recorder, &mut seen),
        [
            "coord: the configuration given to `coordinator_from_config` names no provider, so \
          it built the in-process coordinator: locks, single-flight and idempotency hold \
          within this process only. Add `[provider]` with `kind = \"redis\"` and its `url` to \
          the configuration (or `kind = \"memory\"` to choose the in-process provider without \
          this warning)"
        ]
    );
    let memory = CoordConfig {
        provider: Some(ProviderConfig::Memory),
        ..CoordConfig::default()
    };
    runtime()
        .block_on(coord_redis::coordinator_from_config(&memory))
        .unwrap();
    assert!(
        new_warnings(&recorder, &mut seen).is_empty(),
        "`kind = \"memory\"` is a choice, not a mistake"
    );

    // Several processes on one Redis, configured only through the environment.
    let server = RedisServer::start();
    // SAFETY: no runtime is running.
    unsafe {
        set_env(&[
            ("COORD_REDIS_URL", Some(&server.url())),
            ("COORD_NAMESPACE", Some("first-hour")),
            ("COORD_WAIT", Some("5s")),
            ("COORD_PROFILE_NIGHTLY_LEASE", Some("5m")),
        ])
    };

    // The route the README used to show: the provider from the environment, the coordinator
    // from the builder. The durations and the profile do not apply, and it says so, once.
    runtime().block_on(async {
        let redis = RedisProvider::from_env().await.unwrap();
        let c = Coordinator::builder().provider(redis).build().unwrap();
        assert_eq!(
            new_warnings(&recorder, &mut seen),
            [
                "coord: COORD_PROFILE_NIGHTLY_LEASE, COORD_WAIT are set, but this coordinator \
              was built with `Coordinator::builder()`, which does not read COORD_* variables, \
              so they have no effect (a call naming profile `nightly` fails with \
              `UnknownProfile`). Build it with `coord_redis::coordinator_from_env().await?` \
              instead, which applies them"
            ]
        );
        let err = nightly(&c, "t-7").await.unwrap_err();
        assert!(matches!(err, CoordError::UnknownProfile { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "`jobs.nightly:t-7` names the profile \"nightly\", which this coordinator was not \
             given, so nothing ran: give it the profile, as `[profiles.nightly]` in its \
             configuration or as `COORD_PROFILE_NIGHTLY_<FIELD>` variables read by \
             `coord_redis::coordinator_from_env()` (a coordinator from `Coordinator::builder()` \
             reads no variables)"
        );
        let again = Coordinator::builder()
            .provider(RedisProvider::from_env().await.unwrap())
            .build()
            .unwrap();
        drop(again);
        assert!(
            new_warnings(&recorder, &mut seen).is_empty(),
            "once per process"
        );
    });

    // The documented route: everything in the environment applies.
    runtime().block_on(async {
        let c = coord_redis::coordinator_from_env().await.unwrap();
        assert!(!c.is_in_process_only());
        assert_eq!(c.namespace(), "first-hour");
        assert_eq!(
            c.profile("nightly").and_then(|p| p.lease),
            Some(Duration::from_secs(300))
        );
        nightly(&c, "t-7").await.expect("the profile is there");
        // COORD_WAIT applies to a lock that does not set its own: the second caller waits for
        // the first (held 1 s) instead of being refused at once.
        let c = Arc::new(c);
        let first = tokio::spawn({
            let c = c.clone();
            async move { report(&c, "r", Duration::from_secs(1)).await }
        });
        let key = c.key("jobs.report").part("r").finish();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while c.operator().lock(&key).await.unwrap().holder.is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the first caller holds it"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (second, seen_by_second) = observe(report(&c, "r", Duration::ZERO)).await;
        second.expect("waited for the first holder under COORD_WAIT=5s");
        assert_eq!(seen_by_second.lock(), Some(LockOutcome::Contended));
        first.await.unwrap().unwrap();
    });
    assert!(
        new_warnings(&recorder, &mut seen).is_empty(),
        "the documented route warns about nothing"
    );
    // The builder finished without a provider, and a second install: each says what to do.
    let err = Coordinator::builder().build().unwrap_err();
    assert_eq!(
        err.to_string(),
        "`Coordinator::builder()` was finished without a provider: add `.provider(redis)` (or \
         `.memory()` for one process), or build with `coord_redis::coordinator_from_env()`, \
         which chooses it from COORD_REDIS_URL"
    );
    let memory_only = Coordinator::builder().memory().build().unwrap();
    memory_only.clone().install().expect("the first install");
    let err = memory_only.install().unwrap_err();
    assert_eq!(err, coord_core::BuildError::AlreadyInstalled);
    assert_eq!(
        err.to_string(),
        "a coordinator was installed already in this process, and only one can be: install \
         once, at start-up (give other call sites their own coordinator with `coordinator = ..` \
         or the handle API)"
    );

    // The test server keeps nothing on disk: said once, although this process connected to
    // it four times.
    let persistence: Vec<String> = recorder
        .warnings()
        .into_iter()
        .filter(|w| w.contains("persistence is off"))
        .collect();
    assert_eq!(persistence.len(), 1, "{persistence:?}");
}
