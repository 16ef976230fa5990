//! # coord-conformance
//!
//! The provider conformance suite of coord, as a crate: the behaviour every provider (its
//! [`LockProvider`](coord_core::provider::LockProvider), [`IdempotencyStore`](coord_core::provider::IdempotencyStore),
//! [`CacheStore`](coord_core::provider::CacheStore), [`Operations`](coord_core::provider::Operations) and
//! [`FlightStore`](coord_core::provider::FlightStore)) must share, written once. coord's in-process provider and its Redis provider (over both
//! clients) run exactly this suite; a third-party provider runs it with one macro call from its
//! own tests.
//!
//! ## Running it against your provider
//!
//! Add `coord-conformance` as a dev-dependency (your provider already depends on `coord-core`)
//! and write `tests/conformance.rs`:
//!
//! ```no_run
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! use coord_core::Coordinator;
//!
//! /// A coordinator over the provider under test, in a namespace no other case uses.
//! async fn fresh_coordinator() -> Coordinator {
//!     static NEXT: AtomicUsize = AtomicUsize::new(0);
//!     let namespace = format!("conformance{}", NEXT.fetch_add(1, Ordering::Relaxed));
//!     Coordinator::builder()
//!         .namespace(namespace)
//!         // Your provider here; the in-process one stands in for it in this example.
//!         .provider(coord_core::memory::MemoryProvider::new())
//!         .build()
//!         .expect("a valid coordinator")
//! }
//!
//! coord_conformance::conformance_suite!(fresh_coordinator);
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then runs one test per case, named after it
//! (`lock_waiter_is_woken_by_release`, ...), in parallel, each on its own 4-worker tokio
//! runtime. The expansion needs nothing else from your crate: no tokio dev-dependency unless
//! your own `fresh_coordinator` uses tokio (to connect, say). Call the macro once per module;
//! to run the suite against several configurations, call it in one module per configuration.
//!
//! A harness that is not libtest (a custom `harness = false` test, a CI probe, a binary) calls
//! [`run_all`] instead and reads the [`Report`]; [`run_cases`] runs a chosen subset.
//!
//! ## What "fresh coordinator" must mean
//!
//! Every call of the function you pass returns a [`Coordinator`] whose
//! [namespace](coord_core::CoordinatorBuilder::namespace) no other call returned, over the
//! provider under test. Cases use fixed key names under that namespace and run concurrently,
//! so two cases sharing a namespace see each other's locks and records and fail for reasons
//! that are not your provider's. A per-process counter is enough when the backend is private to
//! the test binary; when several test processes share one backend at once, add something
//! unique to the process (its id, random bytes). The coordinators may share one provider
//! value, connection or server: nothing in the suite assumes isolation below the namespace.
//!
//! ## What it checks
//!
//! One module of [`cases`](mod@cases) per promise of the contract:
//!
//! | Module | Cases | Promise |
//! |---|---|---|
//! | [`lock_exclusion`](cases::lock_exclusion) | `lock_single_attempt_refused_when_held`, `lock_expired_holder_is_replaced`, `lock_waiter_is_woken_by_release`, `lock_release_wakes_one_waiter` | one holder at a time; a lapsed lease frees the key; a release wakes a waiter without polling, and one release wakes one waiter |
//! | [`lock_ownership`](cases::lock_ownership) | `lock_release_is_owner_scoped_and_idempotent`, `lock_renew_is_owner_scoped`, `lock_renew_reports_why_the_lock_was_lost` | only the owner frees or renews, idempotently, and its old owner cannot free a new holder; a lost lock says whether it lapsed or was taken |
//! | [`fencing`](cases::fencing) | `lock_fencing_tokens_increase_only_when_fenced` | fenced grants carry strictly increasing tokens, unfenced ones none |
//! | [`idempotency_records`](cases::idempotency_records) | `idempotency_claim_complete_replay`, `idempotency_abandon_and_lapse`, `idempotency_abandoned_marker_is_kept_on_request`, `idempotency_end_marker_lease_keeps_it_as_abandoned`, `idempotency_wait_settled_wakes_on_completion`, `idempotency_claim_resent_by_its_owner_is_claimed`, `idempotency_renew_marker_reports_why_the_marker_was_lost`, `idempotency_transactional_marker_lapses_to_absent` | claim / in-flight / completed / abandoned states, owner-scoped completion, abandonment, renewal and end of a marker's lease (kept as abandoned at once), fingerprints kept, waiters woken by completion, resent claims, a lost marker says why, a lapsed transactional marker is absent even when kept (for stores that take transactional claims) |
//! | [`completion_outcomes`](cases::completion_outcomes) | `idempotency_completion_by_the_owner_is_stored_and_resendable`, `idempotency_completion_after_the_marker_lapsed_is_stored_without_it`, `idempotency_late_completion_after_another_claim_is_superseded`, `idempotency_completion_after_purge_is_stored_without_marker` | `Stored`, `StoredWithoutMarker` and `Superseded` exactly when the contract says, and resends change nothing |
//! | [`record_age`](cases::record_age) | `idempotency_replay_reports_the_record_age` | a replayed record says how long ago it was stored, to the provider and through the attribute |
//! | [`hostile_durations`](cases::hostile_durations) | `lock_extreme_leases_are_accepted`, `lock_extreme_waits_wait_until_granted`, `lock_cancelled_forever_waiter_leaves_the_key_working`, `idempotency_extreme_durations_are_accepted`, `idempotency_forever_wait_settled_waits_until_settled` | zero, 1 µs, `u64::MAX` ms and `Duration::MAX` leases, waits and retentions neither panic, hang nor wrap around; cancelled waits leave the key working |
//! | [`attributes`](cases::attributes) | `attribute_lock_excludes_and_fences`, `attribute_idempotent_duplicates_run_once`, `attribute_idempotent_errors_are_not_remembered`, `attribute_lock_refusal_and_cancellation` | the same promises through `#[distributed_lock]` and `#[idempotent]`: 64 contending tasks never overlap, duplicates run once, errors are not remembered, refused callers never run their body, cancelled holders release |
//! | [`operations_api`](cases::operations_api) | `operations_inspect_lock_shows_holder_lease_waiters_and_token`, `operations_force_release_frees_any_holder_and_wakes_a_waiter`, `operations_inspect_record_in_each_state`, `inspection_of_semaphores_and_rw_locks_shows_live_holds`, `operations_list_pages_through_the_keys_of_one_operation`, `operations_operator_acts_on_pasted_keys` | [`Operations`](coord_core::provider::Operations): inspection shows what coord would see (holder, lease, waiters, fencing token; record state, age, time left, size; each live permit and read or write hold with its token, and a waiting writer's claim, for providers that opted in); listings page through exactly one operation's live keys within the page bound, and every listed key pastes back; a forced release frees any holder, wakes a waiter and leaves the fencing counter alone |
//! | [`cluster_flights`](cases::cluster_flights) | `flight_claim_is_exclusive_and_owner_scoped`, `flight_finish_hands_over_and_is_fenced`, `flight_finish_noting_sent_tells_no_later_than_the_answer`, `flight_abandon_and_lapse_make_the_flight_vacant`, `attribute_cluster_single_flight_runs_once_and_takes_over` | [`FlightStore`](coord_core::provider::FlightStore): one leader per key, resendable by it; renew, finish and abandon only by the leader; waiters woken by finish and abandon without polling (also one arriving after the finish); the finish's notice that its request left the process told no later than its answer; a lapsed claim is vacant at its lease's end and its late finish refused; the hand-over kept for its time only; through `#[single_flight(scope = "cluster")]`, one run for concurrent calls, a new run afterwards, and takeover of a silent leader |
//! | [`cache_store`](cases::cache_store) | `cache_set_then_get_returns_the_bytes_and_the_ttl_left`, `cache_entry_is_absent_after_its_ttl`, `cache_delete_removes_the_entry`, `cache_keys_of_other_operations_and_parts_do_not_collide`, `cache_set_replaces_the_value_and_the_ttl`, `cache_is_separate_from_locks_and_records`, `cache_extreme_ttls_are_accepted` | [`CacheStore`](coord_core::provider::CacheStore): entries read back byte for byte with no more time left than their ttl, and never after it; a delete removes and says whether there was an entry; a set replaces value and ttl; keys of other operations, parts and namespaces, and locks and records at the same key, never collide; zero, 1 µs, `u64::MAX` ms and `Duration::MAX` ttls are accepted, tiny ones expire and huge ones neither expire early nor wrap around |
//! | [`semaphores`](cases::semaphores) | `semaphore_limit_is_exact_under_races`, `semaphore_crashed_holder_permit_returns_after_its_lease`, `semaphore_fencing_tokens_increase`, `semaphore_release_and_renew_are_owner_scoped`, `semaphore_try_acquire_when_full`, `semaphore_each_release_wakes_a_waiter`, `permit_released_after_it_expired_does_not_free_another`, `missed_release_notification_is_recovered_by_recheck`, `renewal_does_not_outlive_release` | [`SemaphoreStore`](coord_core::provider::SemaphoreStore), an optional capability: never more holders than permits under races (attribute and handle), a crashed holder's permit back at its lease's end and not later, strictly increasing per-permit fencing tokens, owner-scoped release and renewal, a late release frees nobody else, renewal stops at release, `try_acquire` refused when full, each release wakes a waiter, a missing wake-up costs a bounded re-check; on a provider without it, a typed `Unsupported` refusal with nothing run |
//! | [`rw_locks`](cases::rw_locks) | `rw_readers_share_and_a_writer_is_alone`, `rw_waiting_writer_keeps_new_readers_out`, `rw_crashed_holders_and_waiting_writer_expire`, `rw_fencing_tokens_increase_across_modes`, `read_release_does_not_delete_a_write_hold`, `rw_renewal_stops_at_release`, `rw_upgrade_is_refused_at_once` | [`RwLockStore`](coord_core::provider::RwLockStore), an optional capability: readers share a key and a writer holds it alone (step by step and under races, attribute and handle); a waiting writer keeps new readers out and is woken by the last reader's release; crashed readers, writers and waiting writers free the key at the end of their lease or claim; one fencing counter across both modes; release and renewal scoped to owner and mode (a read release never deletes a write hold); renewal stops at release; a read holder asking to write is refused at once with `LockUpgrade`; on a provider without it, a typed `Unsupported` refusal with nothing run |
//! | [`multi_locks`](cases::multi_locks) | `multi_lock_keys_are_taken_in_canonical_order`, `multi_lock_partial_acquire_is_rolled_back`, `multi_lock_and_single_lock_on_an_overlapping_key_exclude_each_other`, `multi_lock_tokens_are_readable_per_key`, `multi_lock_renewal_stops_at_release`, `multi_lock_deadlock_by_order`, `partial_state_after_an_interrupted_multi_acquire` | multi-key locks, on every provider (atomic with [`MultiLockStore`](coord_core::provider::MultiLockStore), key by key otherwise): keys de-duplicated in canonical order, a refused acquisition leaves nothing held, exclusion with single locks on an overlapping key and one fencing counter per key, every key's token readable on the guard and in the body, renewal of every key that stops at release, no deadlock between opposite orders, an acquisition dropped half way leaves no key held |
//! | [`cancellation`](cases::cancellation) | `cancellation_idempotent_leaves_no_marker`, `cancellation_lock_leaves_no_holder`, `cancellation_flights_leave_nothing_registered`, `cancellation_cached_shared_leaves_nothing` | a call dropped after N polls, for every N until it completes, leaves its key free, no renewal registered and nothing in the provider but what the docs allow, for every layer (the harness: [`cancellation`](mod@cancellation)) |
//! | [`stalls`](cases::stalls) | `stall_renewing_lock_ends_in_lock_lost`, `stall_signalled_lock_shows_and_reports_the_loss`, `stall_unrenewed_lock_reports_the_lapse`, `stall_cache_local_serves_nothing_older_than_its_ttl`, `stall_cache_shared_serves_nothing_older_than_its_ttl`, `stall_cache_two_tier_serves_nothing_older_than_its_ttl` | time when the caller's process stalls (its runtime's thread blocked 2 s): a renewing lock stalled past its lease ends in `LockLost { cause: Expired }`, `on_lost = "signal"` and unrenewed locks report the lapse, and no cache scope serves an answer older than its ttl |
//!
//! [`cases()`] lists them all; each is also a plain `pub async fn` in its module, and in
//! [`cases`](mod@cases) itself, callable on its own while bisecting a failure.
//!
//! [`CacheStore`](coord_core::provider::CacheStore), [`Operations`](coord_core::provider::Operations) and
//! [`FlightStore`](coord_core::provider::FlightStore) have default methods that report themselves as not
//! supported, and coord runs without them. A provider that keeps those defaults fails the
//! `cache_`, `operations_` and `flight_` cases, each with the provider's "not supported" error in
//! its message; it runs the rest with [`run_cases`], filtering the cases by name.
//!
//! What it does not check: behaviour under backend faults (lost replies, restarts, failover),
//! which needs a way to inject them that only the provider has; throughput; and anything about
//! the data layout in the backend.
//!
//! ## Time
//!
//! The cases wait on real clocks: leases are let lapse, waiters are left waiting. Against the
//! in-process provider the whole suite takes about 45 s run one case after another (the
//! stall and cancellation cases add about 20 s; [`run_all`]; the slowest case,
//! `lock_release_wakes_one_waiter`, about 2 s) and a few
//! seconds under `cargo test`, which runs cases in parallel; a provider over a network adds its
//! round trips. A single case is given [`CASE_TIMEOUT`] before it counts as failed (hung).
//!
//! Deadlines in the cases are behavioural and generous: "woken by the release, not by a
//! backstop" is checked as "within 700 ms of the release", "a lapsed 200 ms lease frees the
//! key" as "within 2 s", "a cache entry set for 200 ms expires" as "gone 1 s later". They tell
//! a provider that wakes waiters from one that polls every second; they are not latency
//! targets, and a loaded machine does not make them flaky.

pub mod cancellation;
pub mod cases;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use coord_core::Coordinator;
use coord_core::provider::BoxFuture;

/// How long one case may run before it counts as failed: it hung (a deadlocked key, a lost
/// wake-up that nothing backs up). The slowest case takes a few seconds against a healthy
/// provider.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// One case of the suite: a name and a check of one promise of the provider contract.
#[derive(Clone, Copy)]
pub struct Case {
    name: &'static str,
    run: fn(Coordinator) -> BoxFuture<'static, ()>,
}

impl Case {
    /// The case's name, which is also the name of its function in [`cases`](mod@cases) and of
    /// the test [`conformance_suite!`] declares for it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the case against `coordinator`. The future completes if the provider behaves, and
    /// panics with a message naming the broken promise if it does not; [`run_cases`] turns
    /// that panic into a failed [`CaseOutcome`].
    ///
    /// Needs a tokio runtime with the time driver (the cases spawn tasks and sleep); a
    /// multi-thread one, so that the case's own deadlines still fire when a provider blocks the
    /// thread it runs on.
    pub fn run(&self, coordinator: Coordinator) -> BoxFuture<'static, ()> {
        (self.run)(coordinator)
    }
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

static CASES: &[Case] = &crate::__with_case_names!(__case_table!());

/// Every case of the suite, in a fixed order (lock cases, then idempotency cases, then the
/// attribute cases, then the operations API, cluster single-flight and cache store cases). The
/// list grows when the contract does: a release of this crate may add cases, and a provider
/// that passed before may fail a new one.
pub fn cases() -> &'static [Case] {
    CASES
}

/// What happened to one case in a [`run_cases`] or [`run_all`] run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CaseOutcome {
    /// The case's name (see [`Case::name`]).
    pub name: &'static str,
    /// How long the case ran, including the call that made its coordinator.
    pub elapsed: Duration,
    /// `None` if the case passed; otherwise why it failed: its panic message (which names the
    /// broken promise), or that it did not finish within [`CASE_TIMEOUT`].
    pub failure: Option<String>,
}

impl CaseOutcome {
    /// Whether the case passed.
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// The outcomes of a [`run_cases`] or [`run_all`] run, one per case, in the order they ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    outcomes: Vec<CaseOutcome>,
}

impl Report {
    /// Every case's outcome, in the order the cases ran.
    pub fn outcomes(&self) -> &[CaseOutcome] {
        &self.outcomes
    }

    /// The outcome of the case named `name`, if it ran.
    pub fn outcome(&self, name: &str) -> Option<&CaseOutcome> {
        self.outcomes.iter().find(|o| o.name == name)
    }

    /// The cases that passed.
    pub fn passed(&self) -> impl Iterator<Item = &CaseOutcome> {
        self.outcomes.iter().filter(|o| o.passed())
    }

    /// The cases that failed.
    pub fn failed(&self) -> impl Iterator<Item = &CaseOutcome> {
        self.outcomes.iter().filter(|o| !o.passed())
    }

    /// Whether at least one case ran and none failed. A run of no cases (a filter that matched
    /// nothing) is not a success: it checked nothing.
    pub fn all_passed(&self) -> bool {
        !self.outcomes.is_empty() && self.failed().next().is_none()
    }

    /// Panics, with the report (every failed case and its message) as the panic message,
    /// unless [`all_passed`](Report::all_passed). For harnesses where a panic is how a check
    /// fails.
    ///
    /// # Panics
    ///
    /// If a case failed or no case ran.
    pub fn assert_all_passed(&self) {
        assert!(self.all_passed(), "{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed = self.failed().count();
        write!(
            f,
            "provider conformance: {} of {} cases passed",
            self.outcomes.len() - failed,
            self.outcomes.len()
        )?;
        for outcome in self.failed() {
            let why = outcome.failure.as_deref().unwrap_or_default();
            write!(
                f,
                "\n  FAILED {} (after {:.1?}): {why}",
                outcome.name, outcome.elapsed
            )?;
        }
        Ok(())
    }
}

/// Runs every case of the suite, one after another, each against a coordinator from one call
/// of `make`, and reports which passed. Equivalent to [`run_cases`] over [`cases()`].
///
/// Never panics because of the provider: a case that panics, fails or hangs (past
/// [`CASE_TIMEOUT`]) is recorded as failed and the run goes on. See [`run_cases`] for what the
/// caller must provide.
pub async fn run_all<F, Fut>(make: F) -> Report
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Coordinator> + Send + 'static,
{
    run_cases(cases(), make).await
}

/// Runs `cases`, one after another, each against a fresh coordinator from one call of `make`
/// (see the crate docs for what fresh must mean), and reports which passed.
///
/// Each case runs on its own tokio task, so its panics (a broken promise, or a panic in `make`,
/// say a failed connection) are caught and recorded with their message, as is a case that has
/// not finished after [`CASE_TIMEOUT`] (its task is aborted). Cases run sequentially, so their
/// timing checks do not compete with each other for the machine.
///
/// Must be awaited inside a tokio runtime with the time driver enabled, preferably a
/// multi-thread one: on a current-thread runtime, a provider that blocks the thread hangs the
/// run instead of failing a case. Without a runtime, or without its time driver, nothing runs
/// and every case is reported failed with the reason.
///
/// ```
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() {
/// use coord_core::Coordinator;
///
/// let fresh = || {
///     static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
///     let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///     async move {
///         Coordinator::builder()
///             .namespace(format!("doc{n}"))
///             .memory()
///             .build()
///             .expect("a valid coordinator")
///     }
/// };
/// let fencing = coord_conformance::cases()
///     .iter()
///     .filter(|case| case.name().contains("fencing"));
/// let report = coord_conformance::run_cases(fencing, fresh).await;
/// assert!(report.all_passed(), "{report}");
/// # }
/// ```
pub async fn run_cases<'a, I, F, Fut>(cases: I, mut make: F) -> Report
where
    I: IntoIterator<Item = &'a Case>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Coordinator> + Send + 'static,
{
    let cases: Vec<&Case> = cases.into_iter().collect();
    if let Err(why) = runtime_usable().await {
        return Report {
            outcomes: cases
                .iter()
                .map(|case| CaseOutcome {
                    name: case.name,
                    elapsed: Duration::ZERO,
                    failure: Some(format!("not run: {why}")),
                })
                .collect(),
        };
    }
    let mut outcomes = Vec::with_capacity(cases.len());
    for case in cases {
        let started = Instant::now();
        // `make` may panic before it returns its future (a closure that connects eagerly):
        // that fails this case, like a panic inside the future would.
        let coordinator = match std::panic::catch_unwind(AssertUnwindSafe(&mut make)) {
            Ok(coordinator) => coordinator,
            Err(payload) => {
                outcomes.push(CaseOutcome {
                    name: case.name,
                    elapsed: started.elapsed(),
                    failure: Some(panic_message(payload)),
                });
                continue;
            }
        };
        let run = case.run;
        let mut task = tokio::spawn(async move { run(coordinator.await).await });
        // The timer runs in this task, not the case's: a provider that blocks the case's
        // thread must still be reported (on a multi-thread runtime).
        let failure = match tokio::time::timeout(CASE_TIMEOUT, &mut task).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) if e.is_panic() => Some(panic_message(e.into_panic())),
            Ok(Err(e)) => Some(format!("the case's task was cancelled: {e}")),
            Err(_) => {
                task.abort();
                Some(format!(
                    "did not finish within {CASE_TIMEOUT:?} (a hung call?)"
                ))
            }
        };
        outcomes.push(CaseOutcome {
            name: case.name,
            elapsed: started.elapsed(),
            failure,
        });
    }
    Report { outcomes }
}

/// Checks, without panicking here, that the caller's context can run cases: a tokio runtime
/// (for `tokio::spawn`) whose time driver is on (for the cases' sleeps and our timeout).
async fn runtime_usable() -> Result<(), String> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|e| format!("run_cases must be awaited inside a tokio runtime ({e})"))?;
    // Without a time driver, creating a sleep panics; do it on a task so the panic is caught.
    match handle
        .spawn(async { tokio::time::sleep(Duration::ZERO).await })
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if e.is_panic() => Err(format!(
            "the tokio runtime has no time driver (enable it with `enable_time` or \
             `enable_all`): {}",
            panic_message(e.into_panic())
        )),
        Err(e) => Err(format!("the tokio runtime is shutting down: {e}")),
    }
}

/// The message of a caught panic: `panic!` and failed assertions carry a `&str` or a `String`.
fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "panicked with a payload that is not a message".to_owned(),
        },
    }
}

/// Declares one `#[test]` per conformance case, each running the case on its own 4-worker
/// tokio runtime against a coordinator from `$make`, a path to an `async fn() -> Coordinator`
/// in scope (or any function returning a `Send + 'static` future of one). See the crate docs for an example and
/// for what the coordinator must be.
///
/// The tests are named after the cases, so a failure names the broken promise, and libtest
/// runs them in parallel. A case that has not finished after [`CASE_TIMEOUT`] fails instead of
/// hanging the test run. The expansion refers to this crate only, so the calling crate needs
/// no tokio dependency of its own; call the macro once per module (the test names would
/// clash).
#[macro_export]
macro_rules! conformance_suite {
    ($make:path $(,)?) => {
        $crate::__with_case_names!(conformance_suite!(@tests $make;));
    };
    (@tests $make:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__private::run_test($make, $crate::cases::$case);
            }
        )*
    };
}

/// Calls `$crate::$callback!` with the given arguments followed by the name of every case
/// (brace-delimited, so that it expands to items in item position and to an expression in
/// expression position):
/// the one list both [`conformance_suite!`] and [`cases()`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __with_case_names {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! {
            $($args)*
            lock_single_attempt_refused_when_held,
            lock_release_is_owner_scoped_and_idempotent,
            lock_expired_holder_is_replaced,
            lock_waiter_is_woken_by_release,
            lock_release_wakes_one_waiter,
            lock_fencing_tokens_increase_only_when_fenced,
            lock_renew_is_owner_scoped,
            lock_renew_reports_why_the_lock_was_lost,
            lock_extreme_leases_are_accepted,
            lock_extreme_waits_wait_until_granted,
            lock_cancelled_forever_waiter_leaves_the_key_working,
            idempotency_claim_complete_replay,
            idempotency_abandon_and_lapse,
            idempotency_abandoned_marker_is_kept_on_request,
            idempotency_end_marker_lease_keeps_it_as_abandoned,
            idempotency_wait_settled_wakes_on_completion,
            idempotency_completion_by_the_owner_is_stored_and_resendable,
            idempotency_completion_after_the_marker_lapsed_is_stored_without_it,
            idempotency_late_completion_after_another_claim_is_superseded,
            idempotency_completion_after_purge_is_stored_without_marker,
            idempotency_claim_resent_by_its_owner_is_claimed,
            idempotency_replay_reports_the_record_age,
            idempotency_renew_marker_reports_why_the_marker_was_lost,
            idempotency_transactional_marker_lapses_to_absent,
            idempotency_extreme_durations_are_accepted,
            idempotency_forever_wait_settled_waits_until_settled,
            attribute_lock_excludes_and_fences,
            attribute_idempotent_duplicates_run_once,
            attribute_idempotent_errors_are_not_remembered,
            attribute_lock_refusal_and_cancellation,
            operations_inspect_lock_shows_holder_lease_waiters_and_token,
            operations_force_release_frees_any_holder_and_wakes_a_waiter,
            operations_inspect_record_in_each_state,
            inspection_of_semaphores_and_rw_locks_shows_live_holds,
            operations_list_pages_through_the_keys_of_one_operation,
            operations_operator_acts_on_pasted_keys,
            flight_claim_is_exclusive_and_owner_scoped,
            flight_finish_hands_over_and_is_fenced,
            flight_finish_noting_sent_tells_no_later_than_the_answer,
            flight_abandon_and_lapse_make_the_flight_vacant,
            attribute_cluster_single_flight_runs_once_and_takes_over,
            cache_set_then_get_returns_the_bytes_and_the_ttl_left,
            cache_entry_is_absent_after_its_ttl,
            cache_delete_removes_the_entry,
            cache_keys_of_other_operations_and_parts_do_not_collide,
            cache_set_replaces_the_value_and_the_ttl,
            cache_is_separate_from_locks_and_records,
            cache_extreme_ttls_are_accepted,
            cancellation_idempotent_leaves_no_marker,
            cancellation_lock_leaves_no_holder,
            cancellation_flights_leave_nothing_registered,
            cancellation_cached_shared_leaves_nothing,
            stall_renewing_lock_ends_in_lock_lost,
            stall_signalled_lock_shows_and_reports_the_loss,
            stall_unrenewed_lock_reports_the_lapse,
            stall_cache_local_serves_nothing_older_than_its_ttl,
            stall_cache_shared_serves_nothing_older_than_its_ttl,
            stall_cache_two_tier_serves_nothing_older_than_its_ttl,
            semaphore_limit_is_exact_under_races,
            semaphore_crashed_holder_permit_returns_after_its_lease,
            semaphore_fencing_tokens_increase,
            semaphore_release_and_renew_are_owner_scoped,
            semaphore_try_acquire_when_full,
            semaphore_each_release_wakes_a_waiter,
            permit_released_after_it_expired_does_not_free_another,
            missed_release_notification_is_recovered_by_recheck,
            renewal_does_not_outlive_release,
            rw_readers_share_and_a_writer_is_alone,
            rw_waiting_writer_keeps_new_readers_out,
            rw_crashed_holders_and_waiting_writer_expire,
            rw_fencing_tokens_increase_across_modes,
            read_release_does_not_delete_a_write_hold,
            rw_renewal_stops_at_release,
            rw_upgrade_is_refused_at_once,
            multi_lock_keys_are_taken_in_canonical_order,
            multi_lock_partial_acquire_is_rolled_back,
            multi_lock_and_single_lock_on_an_overlapping_key_exclude_each_other,
            multi_lock_tokens_are_readable_per_key,
            multi_lock_renewal_stops_at_release,
            multi_lock_deadlock_by_order,
            partial_state_after_an_interrupted_multi_acquire
        }
    };
}

/// The [`Case`] table, from the case names.
#[doc(hidden)]
#[macro_export]
macro_rules! __case_table {
    ($($case:ident),* $(,)?) => {
        [$(
            $crate::Case::__new(::core::stringify!($case), |c| {
                ::std::boxed::Box::pin($crate::cases::$case(c))
            }),
        )*]
    };
}

impl Case {
    #[doc(hidden)]
    pub const fn __new(name: &'static str, run: fn(Coordinator) -> BoxFuture<'static, ()>) -> Case {
        Case { name, run }
    }
}

/// What the expansion of [`conformance_suite!`] calls; not part of the API.
#[doc(hidden)]
pub mod __private {
    use std::future::Future;

    use coord_core::Coordinator;

    use crate::CASE_TIMEOUT;

    /// Runs one case on a fresh 4-worker tokio runtime (as
    /// `#[tokio::test(flavor = "multi_thread", worker_threads = 4)]` would), bounded by
    /// [`CASE_TIMEOUT`], and panics (fails the test) if the case does.
    pub fn run_test<M, MF, C, CF>(make: M, case: C)
    where
        M: FnOnce() -> MF,
        MF: Future<Output = Coordinator> + Send + 'static,
        C: FnOnce(Coordinator) -> CF + Send + 'static,
        CF: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start a tokio runtime for the case: {e}"));
        // Inside the runtime's context, for a `make` that spawns or connects before its
        // future is first polled.
        let coordinator = {
            let _context = runtime.enter();
            make()
        };
        // The case runs on a worker and the timer here, so that a provider blocking the
        // case's thread still fails the test instead of hanging it.
        let task = runtime.spawn(async move { case(coordinator.await).await });
        // The timer must be made inside the runtime: it registers with its time driver.
        let finished = runtime.block_on(async { tokio::time::timeout(CASE_TIMEOUT, task).await });
        match finished {
            Ok(Ok(())) => {}
            // Fail with the case's own message (the panic hook already printed where).
            Ok(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Ok(Err(e)) => panic!("the case's task was cancelled: {e}"),
            Err(_) => {
                // A hung case may have blocked worker threads for good: do not wait for them.
                runtime.shutdown_background();
                panic!("the case did not finish within {CASE_TIMEOUT:?} (a hung call?)");
            }
        }
    }
}
