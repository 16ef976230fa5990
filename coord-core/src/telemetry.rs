//! Metrics through the [`metrics`] facade: whatever recorder the application installs
//! (Prometheus, StatsD, OpenTelemetry) receives them unchanged.
//!
//! Series are labelled by layer, operation name and outcome, never by key (keys are unbounded
//! and can carry personal data). Operation names come from the attributes (`name = ".."` or
//! the module path) or from [`Coordinator::key`](crate::Coordinator::key) in the handle API:
//! keep the latter a fixed set too.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `coord_calls_total` | counter | `layer`, `op`, `outcome` | calls per layer and outcome: idempotency `executed`, `replayed`, `in_flight`, `key_reused`, `failed_open`, `backend_error`, `lost`, `outcome_unknown`, `not_stored`, `missing_key`, `unprotected`, `shut_down`; cache `hit`, `miss`, `stale` (an entry that did not decode), `error` (the shared tier failed; a miss); single_flight `led`, `joined`, `took_over`, and for `scope = "cluster"` (counted again for the instance's local leader) `cluster_led`, `cluster_joined`, `cluster_took_over`, `failed_open`; lock `acquired`, `contended`, `not_acquired`, `reentrant`, `failed_open`, `backend_error`, `lost`, `shut_down` |
//! | `coord_backend_errors_total` | counter | `layer`, `op`, `kind` | backend faults by [`BackendErrorKind`](crate::provider::BackendErrorKind) (`unavailable`, `timeout`, ...) |
//! | `coord_holds_lost_total` | counter | `hold`, `op`, `cause` | leases this process held and lost, once per hold: `hold` is `lock` or `in_flight` (an `#[idempotent]` marker), `cause` is [`LossCause::as_str`](crate::LossCause::as_str): `taken_by_other`, `expired`, `backend_unreachable`, `shut_down`, `force_released` (an operator's `coord locks release`), `force_released_or_expired` (gone before its lease ran out here, and the provider could not say why) |
//! | `coord_lock_wait_seconds` | histogram | `op` | from asking for a lock to getting it or giving up |
//! | `coord_lock_hold_seconds` | histogram | `op` | from getting a lock to releasing it |
//! | `coord_body_duration_seconds` | histogram | `op` | how long the annotated body ran (not counting replays or joins) |
//! | `coord_record_size_bytes` | histogram | `op` | size of each stored idempotency outcome |
//! | `coord_locks_held` | gauge | | locks held by calls in this process |
//! | `coord_renewals_active` | gauge | | leases (locks and in-flight markers) being renewed by this process |
//!
//! Histograms need buckets in the Prometheus exporter (it renders summaries otherwise, which
//! cannot be aggregated across instances); [`describe_metrics`] gives every series its unit and
//! description once a recorder is installed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{IntoF64, Key, Label, Level, Metadata, SharedString, Unit};
use tokio::time::Instant;

use crate::provider::{BackendError, LossCause};
use crate::report::{CacheOutcome, FlightOutcome, IdempotencyOutcome, LockOutcome};

/// `coord_calls_total`.
pub const CALLS: &str = "coord_calls_total";
/// `coord_backend_errors_total`.
pub const BACKEND_ERRORS: &str = "coord_backend_errors_total";
/// `coord_holds_lost_total`.
pub const HOLDS_LOST: &str = "coord_holds_lost_total";
/// `coord_lock_wait_seconds`.
pub const LOCK_WAIT: &str = "coord_lock_wait_seconds";
/// `coord_lock_hold_seconds`.
pub const LOCK_HOLD: &str = "coord_lock_hold_seconds";
/// `coord_body_duration_seconds`.
pub const BODY_DURATION: &str = "coord_body_duration_seconds";
/// `coord_record_size_bytes`.
pub const RECORD_SIZE: &str = "coord_record_size_bytes";
/// `coord_locks_held`.
pub const LOCKS_HELD: &str = "coord_locks_held";
/// `coord_renewals_active`.
pub const RENEWALS_ACTIVE: &str = "coord_renewals_active";

const METADATA: Metadata<'static> = Metadata::new("coord", Level::INFO, Some(module_path!()));

static LOCKS_HELD_KEY: Key = Key::from_static_name(LOCKS_HELD);
static RENEWALS_ACTIVE_KEY: Key = Key::from_static_name(RENEWALS_ACTIVE);

/// Gives every coord series its unit and description, and creates the process gauges at
/// zero. Call it once after installing a recorder (descriptions sent before that go nowhere).
pub fn describe_metrics() {
    metrics::with_recorder(|r| {
        let counters: [(&'static str, &'static str); 3] = [
            (CALLS, "Calls per coord layer and outcome."),
            (BACKEND_ERRORS, "Coordination backend faults by kind."),
            (
                HOLDS_LOST,
                "Leases (locks, in-flight markers) lost while held, by cause.",
            ),
        ];
        for (name, text) in counters {
            r.describe_counter(name.into(), Some(Unit::Count), text.into());
        }
        let histograms: [(&'static str, Unit, &'static str); 4] = [
            (
                LOCK_WAIT,
                Unit::Seconds,
                "Time from asking for a lock to getting it or giving up.",
            ),
            (LOCK_HOLD, Unit::Seconds, "Time a lock was held."),
            (BODY_DURATION, Unit::Seconds, "Time an annotated body ran."),
            (
                RECORD_SIZE,
                Unit::Bytes,
                "Size of each stored idempotency outcome.",
            ),
        ];
        for (name, unit, text) in histograms {
            r.describe_histogram(name.into(), Some(unit), text.into());
        }
        r.describe_gauge(
            LOCKS_HELD.into(),
            Some(Unit::Count),
            "Locks held by calls in this process.".into(),
        );
        r.describe_gauge(
            RENEWALS_ACTIVE.into(),
            Some(Unit::Count),
            "Leases being renewed by this process.".into(),
        );
        // The gauges exist from the start (at zero), so dashboards show 0, not "no data".
        r.register_gauge(&LOCKS_HELD_KEY, &METADATA).increment(0.0);
        r.register_gauge(&RENEWALS_ACTIVE_KEY, &METADATA)
            .increment(0.0);
    });
}

const IDEMPOTENCY_OUTCOMES: usize = 12;
const FLIGHT_OUTCOMES: usize = 7;
const CACHE_OUTCOMES: usize = 4;
const LOCK_OUTCOMES: usize = 8;

/// The metric keys of one operation, built once on first use and kept with the operation (the
/// attributes keep it in their static spec), so recording a call allocates nothing.
#[doc(hidden)]
pub struct OpTelemetry {
    idempotency: [OnceLock<Key>; IDEMPOTENCY_OUTCOMES],
    flight: [OnceLock<Key>; FLIGHT_OUTCOMES],
    cache: [OnceLock<Key>; CACHE_OUTCOMES],
    lock: [OnceLock<Key>; LOCK_OUTCOMES],
    lock_wait: OnceLock<Key>,
    lock_hold: OnceLock<Key>,
    body: OnceLock<Key>,
    record_size: OnceLock<Key>,
}

impl std::fmt::Debug for OpTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpTelemetry")
    }
}

impl Default for OpTelemetry {
    fn default() -> Self {
        OpTelemetry::new()
    }
}

impl OpTelemetry {
    /// Empty: keys are built on first use.
    pub const fn new() -> OpTelemetry {
        OpTelemetry {
            idempotency: [const { OnceLock::new() }; IDEMPOTENCY_OUTCOMES],
            flight: [const { OnceLock::new() }; FLIGHT_OUTCOMES],
            cache: [const { OnceLock::new() }; CACHE_OUTCOMES],
            lock: [const { OnceLock::new() }; LOCK_OUTCOMES],
            lock_wait: OnceLock::new(),
            lock_hold: OnceLock::new(),
            body: OnceLock::new(),
            record_size: OnceLock::new(),
        }
    }
}

/// Where one call records: its operation's keys and name.
pub(crate) struct CallTelemetry<'c> {
    pub(crate) keys: &'c OpTelemetry,
    pub(crate) op: &'c str,
}

/// A length of time a histogram or a span field reports: two instants of tokio's clock (the
/// system's, unless a test paused it), subtracted only when something records the value. With
/// no recorder installed nothing asks, and the call does no duration arithmetic for metrics.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Elapsed {
    /// From the first instant to the second (zero if the second is earlier).
    Between(Instant, Instant),
    /// Known already.
    Known(Duration),
}

impl Elapsed {
    /// The length.
    pub(crate) fn get(self) -> Duration {
        match self {
            Elapsed::Between(from, to) => to.saturating_duration_since(from),
            Elapsed::Known(length) => length,
        }
    }
}

impl IntoF64 for Elapsed {
    fn into_f64(self) -> f64 {
        self.get().as_secs_f64()
    }
}

fn op_key(name: &'static str, op: &str) -> Key {
    Key::from_parts(
        name,
        vec![Label::new("op", SharedString::from(op.to_owned()))],
    )
}

fn call_key(layer: &'static str, op: &str, outcome: &'static str) -> Key {
    Key::from_parts(
        CALLS,
        vec![
            Label::from_static_parts("layer", layer),
            Label::new("op", SharedString::from(op.to_owned())),
            Label::from_static_parts("outcome", outcome),
        ],
    )
}

fn count(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
}

/// Records `value` into the histogram `key`; a value that must be computed (see [`Elapsed`]) is
/// computed only if the recorder keeps the histogram.
fn observe(key: &Key, value: impl IntoF64) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(value));
}

impl CallTelemetry<'_> {
    pub(crate) fn idempotency(&self, outcome: IdempotencyOutcome) {
        let slot = &self.keys.idempotency[idempotency_index(outcome)];
        count(slot.get_or_init(|| call_key("idempotency", self.op, outcome.as_str())));
    }

    pub(crate) fn flight(&self, outcome: FlightOutcome) {
        let slot = &self.keys.flight[outcome as usize];
        count(slot.get_or_init(|| call_key("single_flight", self.op, outcome.as_str())));
    }

    pub(crate) fn cache(&self, outcome: CacheOutcome) {
        let slot = &self.keys.cache[outcome as usize];
        count(slot.get_or_init(|| call_key("cache", self.op, outcome.as_str())));
    }

    pub(crate) fn lock(&self, outcome: LockOutcome) {
        let slot = &self.keys.lock[lock_index(outcome)];
        count(slot.get_or_init(|| call_key("lock", self.op, outcome.as_str())));
    }

    /// A lock granted after `waited`: the outcome counted and the wait observed, with one
    /// look-up of the recorder.
    pub(crate) fn lock_granted(&self, outcome: LockOutcome, waited: Elapsed) {
        let counted = self.keys.lock[lock_index(outcome)]
            .get_or_init(|| call_key("lock", self.op, outcome.as_str()));
        let observed = self
            .keys
            .lock_wait
            .get_or_init(|| op_key(LOCK_WAIT, self.op));
        metrics::with_recorder(|r| {
            r.register_counter(counted, &METADATA).increment(1);
            r.register_histogram(observed, &METADATA).record(waited);
        });
    }

    /// A locked body that ran for `ran`, its lock held for `held`: both observed with one
    /// look-up of the recorder.
    pub(crate) fn locked_body(&self, ran: Elapsed, held: Elapsed) {
        let body = self
            .keys
            .body
            .get_or_init(|| op_key(BODY_DURATION, self.op));
        let hold = self
            .keys
            .lock_hold
            .get_or_init(|| op_key(LOCK_HOLD, self.op));
        metrics::with_recorder(|r| {
            r.register_histogram(body, &METADATA).record(ran);
            r.register_histogram(hold, &METADATA).record(held);
        });
    }

    pub(crate) fn lock_wait(&self, waited: Elapsed) {
        let key = self
            .keys
            .lock_wait
            .get_or_init(|| op_key(LOCK_WAIT, self.op));
        observe(key, waited);
    }

    pub(crate) fn body(&self, ran: Elapsed) {
        let key = self
            .keys
            .body
            .get_or_init(|| op_key(BODY_DURATION, self.op));
        observe(key, ran);
    }

    pub(crate) fn record_size(&self, bytes: usize) {
        let key = self
            .keys
            .record_size
            .get_or_init(|| op_key(RECORD_SIZE, self.op));
        observe(key, bytes as f64);
    }
}

/// Counts a backend fault (the error path: the key is built here).
pub(crate) fn backend_error(layer: &'static str, op: &str, err: &BackendError) {
    let key = Key::from_parts(
        BACKEND_ERRORS,
        vec![
            Label::from_static_parts("layer", layer),
            Label::new("op", SharedString::from(op.to_owned())),
            Label::from_static_parts("kind", err.kind().as_str()),
        ],
    );
    count(&key);
}

/// Counts a lease lost while held (the loss path, once per hold: the key is built here). The
/// operation is the key's; a key read from text (no operation known) counts under its shown
/// form's operation part up to the first separator.
pub(crate) fn hold_lost(hold: &'static str, key: &crate::provider::CallKey, cause: LossCause) {
    let op = key.operation().unwrap_or_else(|| key.op_key());
    let key = Key::from_parts(
        HOLDS_LOST,
        vec![
            Label::from_static_parts("hold", hold),
            Label::new("op", SharedString::from(op.to_owned())),
            Label::from_static_parts("cause", cause.as_str()),
        ],
    );
    count(&key);
}

/// One more (or one fewer) lock held in this process.
pub(crate) fn locks_held(delta: f64) {
    metrics::with_recorder(|r| {
        r.register_gauge(&LOCKS_HELD_KEY, &METADATA)
            .increment(delta)
    });
}

/// One more (or one fewer) lease renewed by this process.
pub(crate) fn renewals_active(delta: f64) {
    metrics::with_recorder(|r| {
        r.register_gauge(&RENEWALS_ACTIVE_KEY, &METADATA)
            .increment(delta)
    });
}

fn idempotency_index(outcome: IdempotencyOutcome) -> usize {
    use IdempotencyOutcome as O;
    match outcome {
        O::Executed => 0,
        O::Replayed => 1,
        O::InFlight => 2,
        O::KeyReused => 3,
        O::FailedOpen => 4,
        O::BackendError => 5,
        O::Lost => 6,
        O::OutcomeUnknown => 7,
        O::NotStored => 8,
        O::MissingKey => 9,
        O::Unprotected => 10,
        O::ShutDown => 11,
    }
}

fn lock_index(outcome: LockOutcome) -> usize {
    use LockOutcome as O;
    match outcome {
        O::Acquired => 0,
        O::Contended => 1,
        O::NotAcquired => 2,
        O::Reentrant => 3,
        O::FailedOpen => 4,
        O::BackendError => 5,
        O::Lost => 6,
        O::ShutDown => 7,
    }
}

/// Counters a coordinator keeps for operators.
#[derive(Debug, Default)]
pub struct Metrics {
    fail_open: AtomicU64,
    lapsed_releases: AtomicU64,
    force_released: AtomicU64,
    lapsed_holds: AtomicU64,
    unprotected: AtomicU64,
    not_stored: AtomicU64,
    settling_in_background: AtomicU64,
    hand_overs_not_written: AtomicU64,
}

impl Metrics {
    /// How many calls ran unguarded because the backend failed under `fail_open`.
    pub fn fail_open_runs(&self) -> u64 {
        self.fail_open.load(Ordering::Relaxed)
    }

    /// How many `#[distributed_lock]` bodies returned their outcome after their lock was lost
    /// or its lease had run out on the local clock (`on_lost = "signal"`, or no renewal; the
    /// process stalled, or the body outran its lease): sections that may not have been
    /// exclusive throughout. Each is also logged at warn and reported in the call's
    /// [`CallReport::lock_lost`](crate::CallReport::lock_lost).
    pub fn lapsed_holds(&self) -> u64 {
        self.lapsed_holds.load(Ordering::Relaxed)
    }

    /// How many locks were found no longer held at release, for any reason but a forced
    /// release the provider reported (those are [`Metrics::force_released_holds`]): a lease that
    /// lapsed, or a lock that vanished in a way the provider could not explain. Sections that
    /// were not exclusive for their whole duration.
    pub fn lapsed_releases(&self) -> u64 {
        self.lapsed_releases.load(Ordering::Relaxed)
    }

    /// How many locks held by this coordinator's calls and guards were found, when the call or
    /// guard released them, to have been forced free by an operator while held (`coord locks
    /// release`, `Operator::release_lock`). Each is logged at warn and reported as
    /// `LossCause::ForceReleased` in the call's
    /// [`CallReport::lock_lost`](crate::CallReport::lock_lost). (A renewing call cancelled
    /// because its renewal found the lock forced free never releases it itself: it is counted
    /// in `coord_holds_lost_total{cause="force_released"}`, like every loss.)
    pub fn force_released_holds(&self) -> u64 {
        self.force_released.load(Ordering::Relaxed)
    }

    /// How many `#[idempotent]` calls ran without the idempotency layer because a key part was
    /// absent (`on_missing_key = "run_unprotected"`).
    pub fn unprotected_runs(&self) -> u64 {
        self.unprotected.load(Ordering::Relaxed)
    }

    /// How many `#[idempotent]` bodies returned `Ok` whose outcome could not be stored.
    pub fn outcomes_not_stored(&self) -> u64 {
        self.not_stored.load(Ordering::Relaxed)
    }

    /// How many calls answered before their clean-up was settled and left it to the
    /// background (see [`CallReport::settling_in_background`](crate::CallReport::settling_in_background)):
    /// an outcome still being stored, a marker still being cleared, a lock still being
    /// released when the backend did not answer within the caller's own deadlines. Counted
    /// when the call hands the work over, whatever becomes of it; a steady rise means the
    /// backend is stalled or unreachable.
    pub fn settling_in_background(&self) -> u64 {
        self.settling_in_background.load(Ordering::Relaxed)
    }

    pub(crate) fn count_settling_in_background(&self) {
        self.settling_in_background.fetch_add(1, Ordering::Relaxed);
    }

    /// How many `#[single_flight(scope = "cluster")]` leaders of this coordinator answered
    /// their callers but could not hand the outcome over to the other instances (the write
    /// failed, or the claim had lapsed). Their followers fell back: one of them ran the body
    /// itself. Each is also logged at warn.
    pub fn hand_overs_not_written(&self) -> u64 {
        self.hand_overs_not_written.load(Ordering::Relaxed)
    }

    pub(crate) fn count_hand_over_not_written(&self) {
        self.hand_overs_not_written.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_unprotected(&self) {
        self.unprotected.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_not_stored(&self) {
        self.not_stored.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_fail_open(&self) {
        self.fail_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_lapsed_hold(&self) {
        self.lapsed_holds.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_lapsed_release(&self) {
        self.lapsed_releases.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_force_released(&self) {
        self.force_released.fetch_add(1, Ordering::Relaxed);
    }
}
