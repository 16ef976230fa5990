//! Telling in code what coord did with a call: a replay, a joined flight, a contended lock.

use std::future::Future;
use std::sync::{Arc, Mutex};

use crate::provider::CallKey;
use crate::provider::FencingToken;
use crate::provider::LossCause;

/// What the idempotency layer did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdempotencyOutcome {
    /// The key was free: the body ran (its `Ok` outcome, if any, is now stored).
    Executed,
    /// A stored outcome was returned; the body did not run.
    Replayed,
    /// A duplicate was still in flight after `wait`: `CoordError::InFlight`.
    InFlight,
    /// The key had been used with different parameters: `CoordError::KeyReused`.
    KeyReused,
    /// The backend failed and the call ran unguarded under `fail_open`.
    FailedOpen,
    /// The backend failed and the call was refused under `fail_closed`.
    BackendError,
    /// The in-flight marker's lease was lost while the body ran and the body was cancelled:
    /// `CoordError::LockLost`.
    Lost,
    /// An earlier call was abandoned mid-flight and the operation is `on_abandoned = "fail"`:
    /// `CoordError::OutcomeUnknown`.
    OutcomeUnknown,
    /// The body ran and returned `Ok`, but its outcome could not be stored: the caller got
    /// `CoordError::OutcomeNotStored`, or (with `on_store_error = "return_ok"`) the `Ok`; or,
    /// for an outcome written in the caller's transaction (`transaction = ".."`),
    /// `CoordError::TransactionRollbackOnly`, and nothing of the call commits (this one is not
    /// counted in `Metrics::outcomes_not_stored`, which counts runs whose effects stand
    /// without a record).
    NotStored,
    /// A key part was absent (`None`) and the call was refused: `CoordError::MissingKey`.
    MissingKey,
    /// A key part was absent (`None`) and the call ran without the idempotency layer
    /// (`on_missing_key = "run_unprotected"`).
    Unprotected,
    /// The coordinator is shutting down: `CoordError::ShutDown`, nothing ran.
    ShutDown,
}

/// What the single-flight layer did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlightOutcome {
    /// This call ran the body; any concurrent duplicates shared its outcome.
    Led,
    /// This call shared the outcome of a concurrent call with the same key.
    Joined,
    /// This call joined, the leader was dropped, and this call ran the body instead.
    TookOver,
    /// `scope = "cluster"`: this instance's leader claimed the cluster flight and ran the body.
    ClusterLed,
    /// `scope = "cluster"`: this instance's leader received the outcome of a leader elsewhere.
    ClusterJoined,
    /// `scope = "cluster"`: the leader elsewhere was cancelled or its lease ran out, and this
    /// instance's leader ran the body instead.
    ClusterTookOver,
    /// `scope = "cluster"`: the backend failed under `fail_open`; the call coalesced within its
    /// process only.
    FailedOpen,
}

/// What the cache layer (`#[cached]`) did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheOutcome {
    /// A live entry answered the call; the body and the layers inside the cache (single-flight,
    /// the lock) were not reached.
    Hit,
    /// No live entry: the call went on to the inner layers and the body.
    Miss,
    /// An entry was found in the shared tier but did not decode (written by another build, or
    /// not by coord): treated as a miss, with a warning.
    Stale,
    /// The shared tier failed to answer (a backend error): treated as a miss, and counted.
    Error,
}

impl CacheOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Miss => "miss",
            CacheOutcome::Stale => "stale",
            CacheOutcome::Error => "error",
        }
    }
}

/// What the lock layer did with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockOutcome {
    /// Acquired on the first attempt.
    Acquired,
    /// Acquired after waiting for another holder.
    Contended,
    /// Not acquired within `wait`: `CoordError::LockNotAcquired`.
    NotAcquired,
    /// Already held by this task: `CoordError::Reentrant`.
    Reentrant,
    /// The backend failed and the body ran unguarded under `fail_open`.
    FailedOpen,
    /// The backend failed and the call was refused under `fail_closed`.
    BackendError,
    /// The lease was lost while the body ran and the body was cancelled: `CoordError::LockLost`.
    Lost,
    /// The coordinator is shutting down: `CoordError::ShutDown`, nothing ran.
    ShutDown,
}

impl IdempotencyOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            IdempotencyOutcome::Executed => "executed",
            IdempotencyOutcome::Replayed => "replayed",
            IdempotencyOutcome::InFlight => "in_flight",
            IdempotencyOutcome::KeyReused => "key_reused",
            IdempotencyOutcome::FailedOpen => "failed_open",
            IdempotencyOutcome::BackendError => "backend_error",
            IdempotencyOutcome::Lost => "lost",
            IdempotencyOutcome::OutcomeUnknown => "outcome_unknown",
            IdempotencyOutcome::NotStored => "not_stored",
            IdempotencyOutcome::MissingKey => "missing_key",
            IdempotencyOutcome::ShutDown => "shut_down",
            IdempotencyOutcome::Unprotected => "unprotected",
        }
    }
}

impl FlightOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FlightOutcome::Led => "led",
            FlightOutcome::Joined => "joined",
            FlightOutcome::TookOver => "took_over",
            FlightOutcome::ClusterLed => "cluster_led",
            FlightOutcome::ClusterJoined => "cluster_joined",
            FlightOutcome::ClusterTookOver => "cluster_took_over",
            FlightOutcome::FailedOpen => "failed_open",
        }
    }
}

impl LockOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LockOutcome::Acquired => "acquired",
            LockOutcome::Contended => "contended",
            LockOutcome::NotAcquired => "not_acquired",
            LockOutcome::Reentrant => "reentrant",
            LockOutcome::FailedOpen => "failed_open",
            LockOutcome::BackendError => "backend_error",
            LockOutcome::Lost => "lost",
            LockOutcome::ShutDown => "shut_down",
        }
    }
}

/// What coord did with one intercepted call, as returned by [`observe`].
///
/// Read it through its methods: [`key`](CallReport::key), one per layer
/// ([`idempotency`](CallReport::idempotency), [`cache`](CallReport::cache),
/// [`flight`](CallReport::flight), [`lock`](CallReport::lock)), and the facts about the call
/// ([`replayed`](CallReport::replayed), [`fencing_token`](CallReport::fencing_token),
/// [`replay_age`](CallReport::replay_age), [`lock_lost`](CallReport::lock_lost)).
///
/// A layer the function does not have, or that the call never reached (a replay never reaches
/// the lock), answers `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallReport {
    pub(crate) key: Option<CallKey>,
    pub(crate) idempotency: Option<IdempotencyOutcome>,
    pub(crate) cache: Option<CacheOutcome>,
    pub(crate) flight: Option<FlightOutcome>,
    pub(crate) lock: Option<LockOutcome>,
    pub(crate) fencing_token: Option<FencingToken>,
    pub(crate) replay_age: Option<std::time::Duration>,
    pub(crate) lock_lost: Option<LossCause>,
    pub(crate) settling_in_background: bool,
}

impl CallReport {
    /// The call's key, shown as `operation:parts` like
    /// [`CoordError::key`](crate::CoordError::key): the text `coord locks show` and
    /// `coord records show` take. Its [`CallKey::operation`] is the operation name in force
    /// (the attribute's `name`, or by default the module path and the function name,
    /// `my_app::jobs::nightly`). `None` for a future that made no intercepted call.
    pub fn key(&self) -> Option<&CallKey> {
        self.key.as_ref()
    }

    /// The idempotency layer's outcome.
    pub fn idempotency(&self) -> Option<IdempotencyOutcome> {
        self.idempotency
    }

    /// The cache layer's outcome.
    pub fn cache(&self) -> Option<CacheOutcome> {
        self.cache
    }

    /// The single-flight layer's outcome.
    pub fn flight(&self) -> Option<FlightOutcome> {
        self.flight
    }

    /// The lock layer's outcome.
    pub fn lock(&self) -> Option<LockOutcome> {
        self.lock
    }

    /// The fencing token of the lock, for fenced locks.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.fencing_token
    }

    /// For a replay: how long ago the outcome it answers with was stored, by the backend's
    /// clock. `None` for a call that did not replay, or when the backend does not know (a
    /// record written by a version of coord that did not store write times).
    pub fn replay_age(&self) -> Option<std::time::Duration> {
        self.replay_age
    }

    /// Set when the call's lock was lost, or its lease ran out on the local clock, before the
    /// body returned, or was found gone when the call released it, with why: the body was
    /// cancelled ([`lock`](CallReport::lock) is [`LockOutcome::Lost`] and the call answered
    /// `CoordError::LockLost`), or it ran on to its end (`on_lost = "signal"`, or a lock
    /// without renewal, whose outcome the call returned): the section may not have been
    /// exclusive throughout. A stalled process (a blocking call on the runtime, a pause,
    /// SIGSTOP) is the usual reason, with cause `Expired`; an operator's
    /// `coord locks release` is `ForceReleased`.
    pub fn lock_lost(&self) -> Option<LossCause> {
        self.lock_lost
    }

    /// True when the result was replayed from a stored outcome and the body did not run.
    pub fn replayed(&self) -> bool {
        self.idempotency == Some(IdempotencyOutcome::Replayed)
    }

    /// True when the call's lock was lost or its lease ran out before the body returned (see
    /// [`CallReport::lock_lost`]).
    pub fn lock_lapsed(&self) -> bool {
        self.lock_lost.is_some()
    }

    /// True when the body ran but its outcome could not be stored: a retry may not replay it.
    pub fn outcome_not_stored(&self) -> bool {
        self.idempotency == Some(IdempotencyOutcome::NotStored)
    }

    /// True when the call answered before its clean-up was settled, and the clean-up goes on
    /// in the background: storing the outcome (an idempotent body's `Ok` whose completion did
    /// not land within the caller's three attempts and 750 ms), clearing the in-flight marker
    /// of a failed body, or releasing the lock. The caller's wait is bounded by its own deadlines (a few
    /// command timeouts), not by the backend: a stalled server does not hold the caller for a
    /// whole lease.
    ///
    /// What goes on is owner-checked and retried, on fresh commands, until it lands or the
    /// lease it concerns has ended (then the lease has freed the key by itself). Promised: the
    /// call's answer never claims more than was settled when it answered; an idempotent call
    /// answers `CoordError::OutcomeNotStored` (or, under `on_store_error = "return_ok"`, its
    /// `Ok` with [`CallReport::outcome_not_stored`] set), never a plain `Ok`. Not promised:
    /// that the background work succeeds. A completion that lands later is replayed to
    /// duplicates; one that does not leaves the marker to lapse, as `on_abandoned` says.
    pub fn settling_in_background(&self) -> bool {
        self.settling_in_background
    }
}

pub(crate) type ReportSink = Arc<Mutex<CallReport>>;

tokio::task_local! {
    static REQUESTED: std::cell::Cell<Option<ReportSink>>;
}

/// Takes the report sink of an enclosing [`observe`], if this is the first intercepted call
/// inside it. Nested intercepted calls find nothing and report nowhere.
pub(crate) fn take_requested_sink() -> Option<ReportSink> {
    REQUESTED.try_with(|cell| cell.take()).ok().flatten()
}

/// Runs `call` (a future of one intercepted function call) and reports what coord did with it.
///
/// ```
/// # async fn charge() -> Result<u32, coord_core::CoordError> { Ok(1) }
/// # async fn demo() {
/// let (result, report) = coord_core::observe(charge()).await;
/// if report.replayed() {
///     // answer with `Idempotent-Replayed: true`
/// }
/// # let _ = result;
/// # }
/// ```
///
/// The report describes the first intercepted call made inside `call` (the outermost one);
/// calls it makes in turn are not reported. A future that makes no intercepted call yields
/// the default, empty report.
pub async fn observe<F: Future>(call: F) -> (F::Output, CallReport) {
    let sink: ReportSink = Arc::default();
    let output = REQUESTED
        .scope(std::cell::Cell::new(Some(sink.clone())), call)
        .await;
    let report = std::mem::take(&mut *sink.lock().unwrap_or_else(|e| e.into_inner()));
    (output, report)
}
