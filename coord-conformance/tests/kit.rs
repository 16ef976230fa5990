//! The kit itself: it passes a correct provider, catches a broken one by name, and lists every
//! case it ships.

use coord_core::CallKey;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_conformance::{Report, cases, run_all, run_cases};
use coord_core::memory::MemoryProvider;
use coord_core::provider::{
    BoxFuture, CacheEntry, CacheStore, ClaimOutcome, ClaimRequest, CompleteOutcome,
    CompleteRequest, IdempotencyStore, LockGrant, LockProvider, LockRequest, OwnerToken,
    ReleaseOutcome, RenewOutcome,
};
use coord_core::{BackendError, Coordinator};

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn namespace() -> String {
    format!("kit{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn fresh_memory() -> Coordinator {
    Coordinator::builder()
        .namespace(namespace())
        .memory()
        .build()
        .expect("memory coordinator builds")
}

/// The in-process provider, except that `release` answers `Released` and frees nothing: the
/// lock stays taken until its lease lapses. A plausible bug (a release script that matches the
/// wrong key, say) that no single happy-path call would reveal.
#[derive(Debug, Default)]
struct ReleaseNeverFrees(MemoryProvider);

/// No operator support: these tests never inspect or list.
impl coord_core::provider::Operations for ReleaseNeverFrees {}

impl LockProvider for ReleaseNeverFrees {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        self.0.acquire(req)
    }

    fn release<'a>(
        &'a self,
        _key: &'a CallKey,
        _owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(async { Ok(ReleaseOutcome::Released) })
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        self.0.renew(key, owner, lease)
    }
}

/// No shared cache: the defaults.
impl CacheStore for ReleaseNeverFrees {}
/// No cluster-scope single-flight: the kit does not use it.
impl coord_core::provider::FlightStore for ReleaseNeverFrees {}
/// No semaphores: the kit's semaphore cases check that they are refused as unsupported.
impl coord_core::provider::SemaphoreStore for ReleaseNeverFrees {}
impl coord_core::provider::RwLockStore for ReleaseNeverFrees {}
impl coord_core::provider::MultiLockStore for ReleaseNeverFrees {}

/// Implements `IdempotencyStore` for a wrapper of the in-process provider by handing every call
/// to it: the test doubles here break something else.
macro_rules! records_of_the_wrapped_provider {
    ($wrapper:ty) => {
        impl IdempotencyStore for $wrapper {
            fn claim<'a>(
                &'a self,
                req: ClaimRequest<'a>,
            ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
                self.0.claim(req)
            }

            fn complete<'a>(
                &'a self,
                req: CompleteRequest<'a>,
            ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
                self.0.complete(req)
            }

            fn abandon<'a>(
                &'a self,
                key: &'a CallKey,
                owner: OwnerToken,
            ) -> BoxFuture<'a, Result<bool, BackendError>> {
                self.0.abandon(key, owner)
            }

            fn end_marker_lease<'a>(
                &'a self,

                key: &'a CallKey,

                owner: OwnerToken,
            ) -> BoxFuture<'a, Result<bool, BackendError>> {
                self.0.end_marker_lease(key, owner)
            }

            fn wait_settled<'a>(
                &'a self,
                key: &'a CallKey,
                timeout: Duration,
            ) -> BoxFuture<'a, Result<(), BackendError>> {
                self.0.wait_settled(key, timeout)
            }

            fn renew_marker<'a>(
                &'a self,
                key: &'a CallKey,
                owner: OwnerToken,
                lease: Duration,
            ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
                self.0.renew_marker(key, owner, lease)
            }

            fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
                self.0.purge(key)
            }
        }
    };
}

records_of_the_wrapped_provider!(ReleaseNeverFrees);

async fn fresh_broken() -> Coordinator {
    Coordinator::builder()
        .namespace(namespace())
        .provider(ReleaseNeverFrees::default())
        .build()
        .expect("coordinator over the broken provider builds")
}

/// The in-process provider, except that its cache keeps every entry for good, whatever ttl it
/// was set for (a store that drops the `PX` of its write, say). With `reports_time_left`, it
/// says so in the time left it reports; without, it reports none, which the contract allows.
#[derive(Debug)]
struct CacheIgnoresTtl(MemoryProvider, bool);

/// No operator support: these tests never inspect or list.
impl coord_core::provider::Operations for CacheIgnoresTtl {}
/// No cluster-scope single-flight: these tests do not use it.
impl coord_core::provider::FlightStore for CacheIgnoresTtl {}
impl coord_core::provider::SemaphoreStore for CacheIgnoresTtl {}
impl coord_core::provider::RwLockStore for CacheIgnoresTtl {}
impl coord_core::provider::MultiLockStore for CacheIgnoresTtl {}

impl LockProvider for CacheIgnoresTtl {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        self.0.acquire(req)
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        self.0.release(key, owner)
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        self.0.renew(key, owner, lease)
    }
}

records_of_the_wrapped_provider!(CacheIgnoresTtl);

impl CacheStore for CacheIgnoresTtl {
    fn cache_get<'a>(
        &'a self,
        key: &'a CallKey,
    ) -> BoxFuture<'a, Result<Option<CacheEntry>, BackendError>> {
        let reports_time_left = self.1;
        Box::pin(async move {
            let entry = self.0.cache_get(key).await?;
            Ok(entry.map(|entry| CacheEntry {
                ttl_left: entry.ttl_left.filter(|_| reports_time_left),
                ..entry
            }))
        })
    }

    fn cache_set<'a>(
        &'a self,
        key: &'a CallKey,
        value: &'a [u8],
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.0.cache_set(key, value, Duration::MAX)
    }

    fn cache_delete<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        self.0.cache_delete(key)
    }
}

fn cache_ignoring_ttl(reports_time_left: bool) -> Coordinator {
    Coordinator::builder()
        .namespace(namespace())
        .provider(CacheIgnoresTtl(MemoryProvider::new(), reports_time_left))
        .build()
        .expect("coordinator over the broken cache builds")
}

/// The whole suite, run the way a non-libtest harness runs it, passes the in-process provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_passes_the_in_process_provider() {
    let started = Instant::now();
    let report = run_all(fresh_memory).await;
    eprintln!("{report} in {:.1?}", started.elapsed());
    let mut slowest: Vec<_> = report.outcomes().iter().collect();
    slowest.sort_by_key(|o| std::cmp::Reverse(o.elapsed));
    for o in slowest.iter().take(5) {
        eprintln!("  {:>7.1?} {}", o.elapsed, o.name);
    }
    report.assert_all_passed();
    let ran: Vec<&str> = report.outcomes().iter().map(|o| o.name).collect();
    let listed: Vec<&str> = cases().iter().map(|c| c.name()).collect();
    assert_eq!(ran, listed, "run_all runs every case once, in order");
}

/// A provider whose release frees nothing fails the cases that check release, each with a
/// message naming the broken promise, while a case that never releases a lock still passes:
/// the failures are the provider's, not the harness's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_whose_release_never_frees_fails_by_name() {
    // Cases that notice quickly: each retries the released key with a zero wait, where the
    // other release cases would wait out 20 s waits or 30 s leases first.
    let chosen = [
        "lock_single_attempt_refused_when_held",
        "lock_release_is_owner_scoped_and_idempotent",
        "idempotency_claim_complete_replay",
    ];
    let selected = cases().iter().filter(|c| chosen.contains(&c.name()));
    let report = run_cases(selected, fresh_broken).await;
    eprintln!("{report}");
    assert_eq!(report.outcomes().len(), chosen.len(), "{report}");
    assert!(!report.all_passed());

    let refused = report
        .outcome("lock_single_attempt_refused_when_held")
        .expect("ran");
    let why = refused
        .failure
        .as_deref()
        .expect("the broken release is caught");
    assert!(why.contains("released lock is free"), "message: {why}");

    let idempotent = report
        .outcome("lock_release_is_owner_scoped_and_idempotent")
        .expect("ran");
    let why = idempotent
        .failure
        .as_deref()
        .expect("the broken release is caught");
    assert!(why.contains("NotHeld"), "message: {why}");

    assert!(
        report
            .outcome("idempotency_claim_complete_replay")
            .expect("ran")
            .passed(),
        "records do not go through release: {report}"
    );
    let shown = report.to_string();
    assert!(
        shown.contains("1 of 3 cases passed")
            && shown.contains("FAILED lock_single_attempt_refused_when_held"),
        "the report names the failures: {shown}"
    );
}

/// A provider that opts out of the operations API (an empty `impl Operations`) fails every
/// operations case, each with the provider's own "not implemented" error in its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_without_operations_fails_the_operations_cases() {
    let selected = cases()
        .iter()
        .filter(|c| c.name().starts_with("operations_"));
    let report = run_cases(selected, fresh_broken).await;
    assert_eq!(report.outcomes().len(), 5, "{report}");
    for outcome in report.outcomes() {
        let why = outcome
            .failure
            .as_deref()
            .unwrap_or_else(|| panic!("{} passed without an operations API", outcome.name));
        assert!(
            why.contains("does not implement coord's operations API"),
            "{}: {why}",
            outcome.name
        );
    }
}

/// A provider that opts out of the shared cache (an empty `impl CacheStore`) fails every cache
/// case, each with the provider's own "not supported" error in its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_without_a_cache_fails_the_cache_cases() {
    let selected = cases().iter().filter(|c| c.name().starts_with("cache_"));
    let report = run_cases(selected, fresh_broken).await;
    assert_eq!(report.outcomes().len(), 7, "{report}");
    for outcome in report.outcomes() {
        let why = outcome
            .failure
            .as_deref()
            .unwrap_or_else(|| panic!("{} passed without a cache", outcome.name));
        assert!(
            why.contains("does not implement CacheStore"),
            "{}: {why}",
            outcome.name
        );
    }
}

/// A cache that ignores the ttl fails the cases that check it, each naming the broken promise:
/// reporting more time left than was set, returning an entry past its ttl, or keeping the
/// longer ttl of the entry a set replaced. One that reports no time left (as the contract
/// allows) passes the read-back case and fails the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cache_that_ignores_the_ttl_fails_by_name() {
    let read_back = "cache_set_then_get_returns_the_bytes_and_the_ttl_left";
    let expiry = "cache_entry_is_absent_after_its_ttl";
    let replace = "cache_set_replaces_the_value_and_the_ttl";
    let chosen = [read_back, expiry, replace];
    let selected = || cases().iter().filter(|c| chosen.contains(&c.name()));
    let why = |report: &Report, case: &str| -> String {
        let outcome = report.outcome(case).expect("ran");
        outcome
            .failure
            .clone()
            .unwrap_or_else(|| panic!("{case} passed a cache that ignores the ttl: {report}"))
    };

    let report = run_cases(selected(), || async { cache_ignoring_ttl(true) }).await;
    eprintln!("{report}");
    assert_eq!(report.outcomes().len(), chosen.len(), "{report}");
    for case in chosen {
        let why = why(&report, case);
        assert!(why.contains("left of an entry set for"), "{case}: {why}");
    }

    let report = run_cases(selected(), || async { cache_ignoring_ttl(false) }).await;
    eprintln!("{report}");
    assert!(
        report.outcome(read_back).expect("ran").passed(),
        "no time left reported is allowed: {report}"
    );
    let why_expiry = why(&report, expiry);
    assert!(why_expiry.contains("is still returned"), "{why_expiry}");
    let why_replace = why(&report, replace);
    assert!(why_replace.contains("must not outlive"), "{why_replace}");
}

/// A `make` that panics (a provider that cannot connect, say) fails every case it was called
/// for, with its message, instead of unwinding out of the harness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_make_fails_cases_instead_of_the_harness() {
    async fn unreachable_backend() -> Coordinator {
        panic!("cannot reach the backend")
    }
    let report = run_cases(cases().iter().take(2), unreachable_backend).await;
    assert_eq!(report.outcomes().len(), 2);
    for outcome in report.outcomes() {
        assert_eq!(
            outcome.failure.as_deref(),
            Some("cannot reach the backend"),
            "{report}"
        );
    }
    // The same from a `make` that panics before it even returns its future.
    let eager = || -> std::future::Ready<Coordinator> { panic!("cannot reach the backend") };
    let report = run_cases(cases().iter().take(2), eager).await;
    assert_eq!(report.outcomes().len(), 2);
    for outcome in report.outcomes() {
        assert_eq!(
            outcome.failure.as_deref(),
            Some("cannot reach the backend"),
            "{report}"
        );
    }
}

/// Outside a tokio runtime nothing runs and nothing panics: every case is reported not run.
#[test]
fn run_outside_a_runtime_reports_instead_of_panicking() {
    let report = block_on_outside_tokio(run_cases(cases().iter().take(3), fresh_memory));
    assert_eq!(report.outcomes().len(), 3);
    assert!(!report.all_passed());
    for outcome in report.outcomes() {
        let why = outcome.failure.as_deref().unwrap_or_default();
        assert!(why.contains("inside a tokio runtime"), "{why}");
    }
}

/// A runtime without its time driver is reported, not panicked on.
#[test]
fn run_without_a_time_driver_reports_instead_of_panicking() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .build()
        .expect("runtime");
    let report = runtime.block_on(run_cases(cases().iter().take(1), fresh_memory));
    let why = report.outcomes()[0].failure.as_deref().unwrap_or_default();
    assert!(why.contains("no time driver"), "{why}");
}

/// An empty run checked nothing and is not a success.
#[tokio::test]
async fn an_empty_run_is_not_a_success() {
    let report: Report = run_cases(std::iter::empty(), fresh_memory).await;
    assert!(report.outcomes().is_empty());
    assert!(!report.all_passed());
}

/// Every `pub async fn` in the cases' modules is in the list the macro and `run_all` use, once:
/// a case added to a module but not to the list would silently never run.
#[test]
fn every_case_function_is_listed_once() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cases");
    let sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .map(|path| std::fs::read_to_string(&path).expect("a readable module"))
        .collect();
    let defined: BTreeSet<&str> = sources
        .iter()
        .flat_map(|source| source.lines())
        .filter_map(|line| line.strip_prefix("pub async fn "))
        .filter_map(|rest| rest.split('(').next())
        .collect();
    let listed: Vec<&str> = cases().iter().map(|c| c.name()).collect();
    let unique: BTreeSet<&str> = listed.iter().copied().collect();
    assert_eq!(unique.len(), listed.len(), "a case is listed twice");
    assert_eq!(unique, defined);
    assert!(defined.len() >= 37, "the suite lost cases: {defined:?}");
}

/// A minimal executor for the one test that must poll outside any tokio runtime.
fn block_on_outside_tokio<F: Future>(fut: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// The runner behind `conformance_suite!` passes a case the provider satisfies...
#[test]
fn the_macro_runner_passes_a_satisfied_case() {
    coord_conformance::__private::run_test(
        fresh_memory,
        cases::lock_single_attempt_refused_when_held,
    );
}

/// ...and fails the test with the case's own message when the provider breaks the promise.
#[test]
#[should_panic(expected = "released lock is free")]
fn the_macro_runner_fails_with_the_case_message() {
    coord_conformance::__private::run_test(
        fresh_broken,
        cases::lock_single_attempt_refused_when_held,
    );
}

/// A provider without semaphores (an empty `impl SemaphoreStore`) passes every semaphore case
/// only by refusing semaphores with the typed `Unsupported` error before any body runs, and a
/// builder that requires semaphores refuses to build over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_without_semaphores_refuses_them_with_a_typed_error() {
    let semaphore_cases = [
        "semaphore_limit_is_exact_under_races",
        "semaphore_crashed_holder_permit_returns_after_its_lease",
        "semaphore_fencing_tokens_increase",
        "semaphore_release_and_renew_are_owner_scoped",
        "semaphore_try_acquire_when_full",
        "semaphore_each_release_wakes_a_waiter",
        "permit_released_after_it_expired_does_not_free_another",
        "missed_release_notification_is_recovered_by_recheck",
        "renewal_does_not_outlive_release",
    ];
    let selected = cases()
        .iter()
        .filter(|c| semaphore_cases.contains(&c.name()));
    let report = run_cases(selected, fresh_broken).await;
    assert_eq!(report.outcomes().len(), semaphore_cases.len(), "{report}");
    for outcome in report.outcomes() {
        assert!(
            outcome.failure.is_none(),
            "{}: {:?}",
            outcome.name,
            outcome.failure
        );
    }
    let built = Coordinator::builder()
        .namespace(namespace())
        .provider(ReleaseNeverFrees::default())
        .require(coord_core::provider::Capability::Semaphores)
        .build();
    assert!(
        matches!(
            built,
            Err(coord_core::BuildError::Unsupported {
                capability: coord_core::provider::Capability::Semaphores
            })
        ),
        "requiring semaphores of a provider without them must fail the build: {built:?}"
    );
    let memory = Coordinator::builder()
        .namespace(namespace())
        .memory()
        .require(coord_core::provider::Capability::Semaphores)
        .build();
    assert!(memory.is_ok(), "the in-process provider keeps semaphores");
}

/// A provider without read-write locks (an empty `impl RwLockStore`) passes every read-write
/// lock case only by refusing them with the typed `Unsupported` error before any body runs,
/// and a builder that requires them refuses to build over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_without_rw_locks_refuses_them_with_a_typed_error() {
    let rw_cases = [
        "rw_readers_share_and_a_writer_is_alone",
        "rw_waiting_writer_keeps_new_readers_out",
        "rw_crashed_holders_and_waiting_writer_expire",
        "rw_fencing_tokens_increase_across_modes",
        "read_release_does_not_delete_a_write_hold",
        "rw_renewal_stops_at_release",
        "rw_upgrade_is_refused_at_once",
    ];
    let selected = cases().iter().filter(|c| rw_cases.contains(&c.name()));
    let report = run_cases(selected, fresh_broken).await;
    assert_eq!(report.outcomes().len(), rw_cases.len(), "{report}");
    for outcome in report.outcomes() {
        assert!(
            outcome.failure.is_none(),
            "{}: {:?}",
            outcome.name,
            outcome.failure
        );
    }
    let capability = coord_core::provider::Capability::ReadWriteLocks;
    let built = Coordinator::builder()
        .namespace(namespace())
        .provider(ReleaseNeverFrees::default())
        .require(capability)
        .build();
    assert!(
        matches!(built, Err(coord_core::BuildError::Unsupported { capability: c }) if c == capability),
        "requiring read-write locks of a provider without them must fail the build: {built:?}"
    );
    let memory = Coordinator::builder()
        .namespace(namespace())
        .memory()
        .require(capability)
        .build();
    assert!(
        memory.is_ok(),
        "the in-process provider keeps read-write locks"
    );
}
