//! Profiles and configured defaults at run time: each field of a profile, and of the
//! configuration's `defaults`, changes what a call does; an unknown profile is refused before
//! the body runs. Each test fails if the option it names is ignored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::{
    CallKey, CoordError, Coordinator, OnBackendError, Profile, distributed_lock, idempotent,
};
use coord_tests::support::InstrumentedProvider;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn coordinator(ns: &str, defaults: Profile, profiles: &[(&str, Profile)]) -> Coordinator {
    let mut builder = Coordinator::builder()
        .namespace(ns)
        .memory()
        .defaults(defaults);
    for (name, profile) in profiles {
        builder = builder.profile(*name, *profile);
    }
    builder.build().expect("a valid test coordinator")
}

fn lock_key(c: &Coordinator, op: &str, id: u64) -> CallKey {
    c.key(op).part(&id).finish()
}

/// Holds `key` from another owner until the guard is dropped.
async fn hold(c: &Coordinator, key: CallKey, lease: Duration) -> coord_core::LockGuard {
    c.lock(key)
        .lease(lease)
        .acquire()
        .await
        .expect("free at first")
}

// ---- lock: wait, lease, renew, on_backend_error ----------------------------------------

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.wait", wait = "20s", profile = "quick")]
async fn waits_long_unless_profiled(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    Ok(())
}

#[tokio::test]
async fn a_profiles_wait_beats_the_literal() {
    let quick = Profile {
        wait: Some(MS(200)),
        ..Profile::default()
    };
    let c = coordinator("cfg-wait", Profile::default(), &[("quick", quick)]);
    let _held = hold(&c, lock_key(&c, "cfg.wait", 1), Duration::from_secs(60)).await;
    let started = Instant::now();
    let err = waits_long_unless_profiled(&c, 1).await.unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(err, CoordError::LockNotAcquired { .. }), "{err:?}");
    assert!(
        waited >= MS(150),
        "gave up before the profile's wait: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "waited out the literal 20 s: {waited:?}"
    );
}

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.lease", lease = "1h", profile = "short")]
async fn reports_its_lease(c: &Coordinator, id: u64) -> Result<Duration, CoordError> {
    let key = lock_key(c, "cfg.lease", id);
    let info = c.operator().lock(&key).await.expect("inspectable");
    Ok(info.holder.expect("held by this call").lease_left)
}

#[tokio::test]
async fn a_profiles_lease_beats_the_literal() {
    let short = Profile {
        lease: Some(Duration::from_secs(5)),
        ..Profile::default()
    };
    let c = coordinator("cfg-lease", Profile::default(), &[("short", short)]);
    let left = reports_its_lease(&c, 1).await.unwrap();
    assert!(
        left <= Duration::from_secs(5) && left > Duration::from_secs(1),
        "the lease in force is not the profile's 5 s: {left:?} left"
    );
}

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.renew", profile = "renewing")]
async fn counts_renewals(c: &Coordinator, id: u64) -> Result<usize, CoordError> {
    Ok(c.active_renewals())
}

#[tokio::test]
async fn a_profiles_renew_turns_renewal_on() {
    let renewing = Profile {
        renew: Some(Duration::from_secs(1)),
        ..Profile::default()
    };
    let c = coordinator("cfg-renew", Profile::default(), &[("renewing", renewing)]);
    assert_eq!(
        counts_renewals(&c, 1).await.unwrap(),
        1,
        "the body ran unrenewed"
    );
    assert_eq!(c.active_renewals(), 0);
}

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.fault", on_backend_error = "fail_closed", profile = "lenient")]
async fn runs_on_fault(c: &Coordinator, id: u64, runs: &AtomicUsize) -> Result<(), CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn a_profiles_backend_error_policy_beats_the_literal() {
    let provider = Arc::new(InstrumentedProvider::default());
    provider.fail_locks.store(true, Ordering::SeqCst);
    let lenient = Profile {
        on_backend_error: Some(OnBackendError::FailOpen),
        ..Profile::default()
    };
    let c = Coordinator::builder()
        .namespace("cfg-fault")
        .provider(provider.clone())
        .profile("lenient", lenient)
        .build()
        .unwrap();
    let runs = AtomicUsize::new(0);
    runs_on_fault(&c, 1, &runs)
        .await
        .expect("fail_open from the profile");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(c.metrics().fail_open_runs(), 1);
}

// ---- idempotency: retention, in_flight_lease ------------------------------------------

#[idempotent(key_from = "id", coordinator = c, name = "cfg.retention", retention = "24h", profile = "brief")]
async fn charge(c: &Coordinator, id: u64, runs: &AtomicUsize) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn a_profiles_retention_makes_a_replay_vanish_after_it() {
    let brief = Profile {
        retention: Some(MS(300)),
        ..Profile::default()
    };
    let c = coordinator("cfg-retention", Profile::default(), &[("brief", brief)]);
    let runs = AtomicUsize::new(0);
    charge(&c, 7, &runs).await.unwrap();
    charge(&c, 7, &runs).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second call is a replay"
    );
    tokio::time::sleep(MS(700)).await;
    charge(&c, 7, &runs).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the record outlived the profile's 300 ms retention"
    );
}

#[idempotent(key_from = "id", coordinator = c, name = "cfg.marker", in_flight_lease = "1h", on_abandoned = "fail", profile = "brief")]
async fn stalls(c: &Coordinator, id: u64, stall: bool) -> Result<u64, CoordError> {
    if stall {
        std::future::pending::<()>().await;
    }
    Ok(id)
}

#[tokio::test]
async fn a_profiles_in_flight_lease_beats_the_literal() {
    let brief = Profile {
        in_flight_lease: Some(MS(300)),
        ..Profile::default()
    };
    let c = coordinator("cfg-marker", Profile::default(), &[("brief", brief)]);
    // While the first call's body runs, its marker's lease is the profile's 300 ms, not the
    // literal hour. (A call dropped mid-body no longer shows it: under `on_abandoned = "fail"`
    // its marker is ended at once, whatever the lease.)
    let first = tokio::spawn({
        let c = c.clone();
        async move { stalls(&c, 1, true).await }
    });
    let key = lock_key(&c, "cfg.marker", 1);
    let until = Instant::now() + Duration::from_secs(10);
    let lease_left = loop {
        let info = c.operations().inspect_record(&key).await.unwrap();
        if let Some(left) = info.and_then(|i| i.lease_left) {
            break left;
        }
        assert!(Instant::now() < until, "the first call never claimed");
        tokio::time::sleep(MS(5)).await;
    };
    assert!(
        lease_left <= MS(300),
        "the marker's lease should be the profile's 300 ms, is {lease_left:?}"
    );
    first.abort();
    let _ = first.await;
}

// ---- unknown profiles ------------------------------------------------------------------

#[idempotent(key_from = "id", coordinator = c, name = "cfg.unknown", profile = "missing")]
async fn idempotent_unknown(
    c: &Coordinator,
    id: u64,
    runs: &AtomicUsize,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.unknown_lock", profile = "missing")]
async fn lock_unknown(c: &Coordinator, id: u64, runs: &AtomicUsize) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn an_unknown_profile_is_refused_before_the_body_runs() {
    let c = coordinator(
        "cfg-unknown",
        Profile::default(),
        &[("other", Profile::default())],
    );
    let runs = AtomicUsize::new(0);
    let err = idempotent_unknown(&c, 1, &runs).await.unwrap_err();
    match &err {
        CoordError::UnknownProfile { profile, key } => {
            assert_eq!(profile, "missing");
            assert_eq!(key.to_string(), "cfg.unknown:1");
        }
        other => panic!("expected UnknownProfile, got {other:?}"),
    }
    assert!(!err.is_retryable());
    assert_eq!(err.kind_str(), "unknown_profile");
    let err = lock_unknown(&c, 1, &runs).await.unwrap_err();
    assert!(matches!(err, CoordError::UnknownProfile { .. }), "{err:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a body ran under an unknown profile"
    );
    // Nothing was claimed or locked: the key is free for a call that names no profile.
    assert!(
        c.lock(lock_key(&c, "cfg.unknown_lock", 1))
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
}

// ---- configured defaults ---------------------------------------------------------------

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.defaults")]
async fn no_literals(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    Ok(())
}

#[distributed_lock(key_from = "id", coordinator = c, name = "cfg.defaults", wait = "0s")]
async fn literal_no_wait(c: &Coordinator, id: u64) -> Result<(), CoordError> {
    Ok(())
}

#[tokio::test]
async fn configured_defaults_apply_where_the_attribute_writes_nothing() {
    let defaults = Profile {
        wait: Some(Duration::from_secs(20)),
        ..Profile::default()
    };
    let c = coordinator("cfg-defaults", defaults, &[]);
    let key = lock_key(&c, "cfg.defaults", 1);

    // The literal `wait = "0s"` beats the defaults: refused at once.
    let held = hold(&c, key.clone(), Duration::from_secs(60)).await;
    let started = Instant::now();
    let err = literal_no_wait(&c, 1).await.unwrap_err();
    assert!(matches!(err, CoordError::LockNotAcquired { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the literal 0 s wait was ignored"
    );

    // Without a literal the defaults' 20 s wait applies: the call outwaits a 300 ms holder
    // (the built-in default, no wait, would refuse at once).
    let release = tokio::spawn(async move {
        tokio::time::sleep(MS(300)).await;
        held.release().await.unwrap();
    });
    no_literals(&c, 1)
        .await
        .expect("waited for the holder under the defaults' wait");
    release.await.unwrap();
}

#[idempotent(key_from = "id", coordinator = c, name = "cfg.defaults_retention")]
async fn default_retention(
    c: &Coordinator,
    id: u64,
    runs: &AtomicUsize,
) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test]
async fn configured_default_retention_applies_without_a_literal() {
    let defaults = Profile {
        retention: Some(MS(300)),
        ..Profile::default()
    };
    let c = coordinator("cfg-defaults-retention", defaults, &[]);
    let runs = AtomicUsize::new(0);
    default_retention(&c, 1, &runs).await.unwrap();
    default_retention(&c, 1, &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    tokio::time::sleep(MS(700)).await;
    default_retention(&c, 1, &runs).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the built-in 24 h retention was used"
    );
}

#[tokio::test]
async fn the_defaults_backend_policy_is_the_coordinators() {
    let c = coordinator(
        "cfg-defaults-policy",
        Profile {
            on_backend_error: Some(OnBackendError::FailOpen),
            ..Profile::default()
        },
        &[],
    );
    assert_eq!(c.on_backend_error(), OnBackendError::FailOpen);
}

// ---- the handle API --------------------------------------------------------------------

#[tokio::test]
async fn a_lock_handles_profile_beats_its_setters() {
    let quick = Profile {
        wait: Some(MS(200)),
        lease: Some(Duration::from_secs(5)),
        ..Profile::default()
    };
    let c = coordinator("cfg-handle-lock", Profile::default(), &[("quick", quick)]);
    let key = lock_key(&c, "cfg.handle", 1);
    let guard = c
        .lock(key.clone())
        .lease(Duration::from_secs(3600))
        .profile("quick")
        .acquire()
        .await
        .unwrap();
    let left = c
        .operator()
        .lock(&key)
        .await
        .unwrap()
        .holder
        .unwrap()
        .lease_left;
    assert!(
        left <= Duration::from_secs(5),
        "the profile's lease was ignored: {left:?}"
    );

    let started = Instant::now();
    let err = c
        .lock(key.clone())
        .wait(Duration::from_secs(20))
        .profile("quick")
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::LockNotAcquired { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the profile's wait was ignored"
    );
    guard.release().await.unwrap();

    let err = c
        .lock(key.clone())
        .profile("nope")
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(err, CoordError::UnknownProfile { ref profile, .. } if profile == "nope"),
        "{err:?}"
    );
    let runs = AtomicUsize::new(0);
    let err = c
        .lock(key)
        .profile("nope")
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, CoordError>(())
        })
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::UnknownProfile { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_idempotent_handles_profile_beats_its_setters() {
    let brief = Profile {
        retention: Some(MS(300)),
        ..Profile::default()
    };
    let c = coordinator("cfg-handle-idem", Profile::default(), &[("brief", brief)]);
    let runs = AtomicUsize::new(0);
    let call = || {
        c.idempotent(c.key("cfg.handle_idem").part("a").finish())
            .retention(Duration::from_secs(3600))
            .profile("brief")
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoordError>(1u8)
            })
    };
    call().await.unwrap();
    call().await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    tokio::time::sleep(MS(700)).await;
    call().await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the profile's retention was ignored"
    );

    let err = c
        .idempotent(c.key("cfg.handle_idem").part("b").finish())
        .profile("nope")
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, CoordError>(1u8)
        })
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::UnknownProfile { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

// ---- the builder refuses what it cannot honour -----------------------------------------

#[test]
fn the_builder_refuses_bad_profiles_naming_the_field() {
    let zero = Profile {
        lease: Some(Duration::ZERO),
        ..Profile::default()
    };
    let err = Coordinator::builder()
        .memory()
        .profile("payments", zero)
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        coord_core::BuildError::InvalidSetting {
            field: "profiles.payments.lease".into(),
            reason: "must be longer than zero".into()
        }
    );
    let slow_renew = Profile {
        lease: Some(Duration::from_secs(10)),
        renew: Some(Duration::from_secs(10)),
        ..Profile::default()
    };
    let err = Coordinator::builder()
        .memory()
        .defaults(slow_renew)
        .build()
        .unwrap_err();
    assert!(
        matches!(err, coord_core::BuildError::InvalidSetting { ref field, .. } if field == "defaults.renew"),
        "{err:?}"
    );
    let err = Coordinator::builder()
        .memory()
        .profile("Bad-Name", Profile::default())
        .build()
        .unwrap_err();
    assert!(
        matches!(err, coord_core::BuildError::InvalidSetting { ref field, .. } if field == "profiles.Bad-Name"),
        "{err:?}"
    );
}
