//! One intercepted call: its spec, key, coordinator, span and report.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;
use tracing::field::Empty;

use crate::error::CoordError;
use crate::policy::OnBackendError;
use crate::provider::BackendError;
use crate::provider::CallKey;
use crate::provider::CallKeyBuilder;
use crate::provider::FencingToken;
use crate::report::{
    CacheOutcome, CallReport, FlightOutcome, IdempotencyOutcome, LockOutcome, ReportSink,
    take_requested_sink,
};
use crate::runtime::settings;
use crate::runtime::spec::{IdempotencySpec, LockSpec, OpSpec};
use crate::runtime::state::Coordinator;
use crate::telemetry::{CallTelemetry, Elapsed};

/// One call in progress. The layers share it, so the key is derived once.
pub struct Call<'c> {
    pub(crate) spec: &'c OpSpec<'c>,
    pub(crate) coordinator: &'c Coordinator,
    pub(crate) key: CallKey,
    /// `Some` when a key part rendered an absent value (`None`): the `key_from` path of the
    /// first such part, when the macros named it.
    pub(crate) absent_part: Option<Option<&'static str>>,
    span: tracing::Span,
    sink: Option<ReportSink>,
    /// The idempotency options in force: the spec's, with the profile and the configured
    /// defaults applied.
    pub(crate) idempotency: Option<IdempotencySpec>,
    /// The lock options in force, likewise.
    pub(crate) lock: Option<LockSpec>,
    /// The spec names a profile the coordinator does not have.
    unknown_profile: bool,
    /// The annotated body was polled: from here on it may have had effects.
    body_started: AtomicBool,
    /// When the annotated body returned, once it has: what the cache layer counts an entry's
    /// life from, whatever happened between the body and the cache (a stall of this process,
    /// a release awaited by the lock layer).
    body_returned: OnceLock<Instant>,
}

impl<'c> Call<'c> {
    /// Starts a call of `spec` on `coordinator`; `key` appends the key parts.
    pub fn new(
        spec: &'c OpSpec<'c>,
        coordinator: &'c Coordinator,
        key: impl FnOnce(CallKeyBuilder) -> CallKeyBuilder,
    ) -> Call<'c> {
        let builder = key(spec.key_prefix.builder(coordinator.namespace(), spec.name));
        let absent_part = builder.has_absent_part().then(|| builder.missing_part());
        Call::start(spec, coordinator, builder.finish(), absent_part)
    }

    /// Starts a call of `spec` with a key built beforehand (the handle API).
    pub(crate) fn with_key(
        spec: &'c OpSpec<'c>,
        coordinator: &'c Coordinator,
        key: CallKey,
    ) -> Call<'c> {
        Call::start(spec, coordinator, key, None)
    }

    fn start(
        spec: &'c OpSpec<'c>,
        coordinator: &'c Coordinator,
        key: CallKey,
        absent_part: Option<Option<&'static str>>,
    ) -> Call<'c> {
        let span = tracing::info_span!(
            "coord",
            op = spec.name,
            idempotency = Empty,
            cache = Empty,
            single_flight = Empty,
            lock = Empty,
            fencing_token = Empty,
            "coord.key" = Empty,
            "coord.lock.wait_ms" = Empty,
            "coord.loss_cause" = Empty,
            "coord.replay.age_ms" = Empty,
            "coord.settling_in_background" = Empty,
            "error.type" = Empty,
        );
        if spec.record_key {
            span.record("coord.key", tracing::field::display(&key));
        }
        let sink = take_requested_sink();
        if let Some(sink) = &sink {
            sink.lock().unwrap_or_else(|e| e.into_inner()).key = Some(key.clone());
        }
        let (idempotency, lock, unknown_profile) = resolve(spec, coordinator);
        Call {
            spec,
            coordinator,
            key,
            absent_part,
            span,
            sink,
            idempotency,
            lock,
            unknown_profile,
            body_started: AtomicBool::new(false),
            body_returned: OnceLock::new(),
        }
    }

    /// [`CoordError::UnknownProfile`] when the call names a profile the coordinator does not
    /// have (recorded on the span): the layers answer it before doing anything.
    pub(crate) fn profile_error(&self) -> Option<CoordError> {
        if !self.unknown_profile {
            return None;
        }
        let err = CoordError::UnknownProfile {
            profile: self.spec.profile.unwrap_or_default().to_owned(),
            key: self.key.clone(),
        };
        self.record_error(&err);
        Some(err)
    }

    /// This call's key.
    pub fn key(&self) -> &CallKey {
        &self.key
    }

    /// Runs the layered future inside this call's span.
    pub fn run<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        fut.instrument(self.span.clone())
    }

    /// Where this call's metrics go.
    pub(crate) fn telemetry(&self) -> CallTelemetry<'_> {
        CallTelemetry {
            keys: &self.spec.telemetry,
            op: self.spec.name,
        }
    }

    /// Runs the annotated body itself, timing it for `coord_body_duration_seconds`, and marks
    /// it started (see [`Call::body_started`]) when first polled.
    ///
    /// With `#[distributed_lock]` the lock layer, which wraps the body directly, times it
    /// instead, from the clock reads it makes for the lock anyway.
    pub async fn body<F: Future>(&self, body: F) -> F::Output {
        self.body_started.store(true, Ordering::Release);
        if self.spec.lock.is_some() {
            return body.await;
        }
        let started = Instant::now();
        let output = body.await;
        let returned = Instant::now();
        self.telemetry().body(Elapsed::Between(
            tokio::time::Instant::from_std(started),
            tokio::time::Instant::from_std(returned),
        ));
        // Only the cache layer reads it: other operations keep their hot path as it was.
        if self.spec.cache.is_some() {
            let _ = self.body_returned.set(returned);
        }
        output
    }

    /// Records that the body ran from `started` to `returned` (tokio's clock, which is the
    /// system's unless a test paused it).
    pub(crate) fn record_body(
        &self,
        started: tokio::time::Instant,
        returned: tokio::time::Instant,
    ) {
        self.telemetry().body(Elapsed::Between(started, returned));
        self.note_body_returned();
    }

    /// For the cache layer, which times an entry's life from it: the body returned now (on the
    /// system clock, which a test pausing tokio's does not stop, as `Call::body` reads it).
    fn note_body_returned(&self) {
        if self.spec.cache.is_some() {
            let _ = self.body_returned.set(Instant::now());
        }
    }

    /// Set once the annotated body was first polled; before that, whatever the layers around
    /// it did (a claim, a lock wait, a cache lookup), the body cannot have had effects.
    pub(crate) fn body_started(&self) -> &AtomicBool {
        &self.body_started
    }

    /// When this call's body returned, if it ran in this call (recorded for cached operations
    /// only).
    pub(crate) fn body_returned(&self) -> Option<Instant> {
        self.body_returned.get().copied()
    }

    /// Records `value` in the span's field `field`. A span nobody listens to (no subscriber, or
    /// one that does not want it) is skipped outright: recording into it would still look the
    /// field up by name among the span's eleven.
    fn span_record(&self, field: &str, value: impl tracing::Value) {
        if !self.span.is_disabled() {
            self.span.record(field, value);
        }
    }

    fn report(&self, f: impl FnOnce(&mut CallReport)) {
        if let Some(sink) = &self.sink {
            f(&mut sink.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    pub(crate) fn record_idempotency(&self, outcome: IdempotencyOutcome) {
        self.span_record("idempotency", outcome.as_str());
        self.telemetry().idempotency(outcome);
        self.report(|r| r.idempotency = Some(outcome));
    }

    pub(crate) fn record_cache(&self, outcome: CacheOutcome) {
        self.span_record("cache", outcome.as_str());
        self.telemetry().cache(outcome);
        self.report(|r| r.cache = Some(outcome));
    }

    pub(crate) fn record_flight(&self, outcome: FlightOutcome) {
        self.span_record("single_flight", outcome.as_str());
        self.telemetry().flight(outcome);
        self.report(|r| r.flight = Some(outcome));
    }

    /// Records a granted lock: its outcome, fencing token and how long taking it took.
    pub(crate) fn record_lock_granted(
        &self,
        outcome: LockOutcome,
        token: Option<FencingToken>,
        waited: Elapsed,
    ) {
        if !self.span.is_disabled() {
            self.span
                .record("coord.lock.wait_ms", waited.get().as_secs_f64() * 1000.0);
            self.span.record("lock", outcome.as_str());
            if let Some(token) = token {
                self.span.record("fencing_token", token.get());
            }
        }
        self.telemetry().lock_granted(outcome, waited);
        self.report(|r| {
            r.lock = Some(outcome);
            r.fencing_token = token;
        });
    }

    /// Records that a locked body ran from `started` to `returned`, its lock held since
    /// `held_from` (tokio's clock, which is the system's unless a test paused it).
    pub(crate) fn record_locked_body(
        &self,
        held_from: tokio::time::Instant,
        started: tokio::time::Instant,
        returned: tokio::time::Instant,
    ) {
        self.telemetry().locked_body(
            Elapsed::Between(started, returned),
            Elapsed::Between(held_from, returned),
        );
        self.note_body_returned();
    }

    /// Records how long the lock took (or was waited for before giving up).
    pub(crate) fn record_lock_wait(&self, waited: Elapsed) {
        if !self.span.is_disabled() {
            self.span
                .record("coord.lock.wait_ms", waited.get().as_secs_f64() * 1000.0);
        }
        self.telemetry().lock_wait(waited);
    }

    /// Records how old the stored outcome a replay answers with is, when the backend knows.
    pub(crate) fn record_replay_age(&self, age: Option<Duration>) {
        if let Some(age) = age {
            self.span_record("coord.replay.age_ms", age.as_secs_f64() * 1000.0);
        }
        self.report(|r| r.replay_age = age);
    }

    /// Records that the call answers before its clean-up settled: the rest goes on in the
    /// background. Shown in the report and counted.
    pub(crate) fn record_settling_in_background(&self) {
        self.span_record("coord.settling_in_background", true);
        self.coordinator.metrics().count_settling_in_background();
        self.report(|r| r.settling_in_background = true);
    }

    /// Records why a hold was lost.
    pub(crate) fn record_loss(&self, cause: crate::provider::LossCause) {
        self.span_record("coord.loss_cause", cause.as_str());
    }

    /// Records that the lock was lost (or its lease ran out) before the body returned: the
    /// cause on the span, as [`Call::record_loss`] does, and in the report.
    pub(crate) fn record_lock_lost(&self, cause: crate::provider::LossCause) {
        self.record_loss(cause);
        self.report(|r| r.lock_lost = Some(cause));
    }

    /// Records a lock refused with `err`: the outcome, the error's class, and, when the lock
    /// stayed held for all of `wait`, how long the call waited.
    pub(crate) fn record_lock_refused(&self, err: &CoordError, outcome: LockOutcome) {
        if let CoordError::LockNotAcquired { waited, .. } = err {
            self.record_lock_wait(Elapsed::Known(*waited));
        }
        self.record_lock(outcome, None);
        self.record_error(err);
    }

    /// Records the class of error a call answers with (OpenTelemetry's `error.type`).
    pub(crate) fn record_error(&self, err: &CoordError) {
        self.span_record("error.type", err.kind_str());
    }

    pub(crate) fn record_lock(&self, outcome: LockOutcome, token: Option<FencingToken>) {
        self.span_record("lock", outcome.as_str());
        self.telemetry().lock(outcome);
        if let Some(token) = token {
            self.span_record("fencing_token", token.get());
        }
        self.report(|r| {
            r.lock = Some(outcome);
            r.fencing_token = token;
        });
    }

    /// The one backend-fault decision of every layer (see [`backend_fault`]).
    pub(crate) fn backend_fault(
        &self,
        attribute: Option<OnBackendError>,
        err: BackendError,
        layer: &'static str,
    ) -> Result<(), CoordError> {
        backend_fault(self.coordinator, &self.key, attribute, err, layer)
    }
}

/// The options in force for a call of `spec`: copies of the spec's when it names no profile
/// and the coordinator has no configured defaults (no lookup), else resolved; and whether the
/// named profile is missing.
fn resolve(
    spec: &OpSpec<'_>,
    coordinator: &Coordinator,
) -> (Option<IdempotencySpec>, Option<LockSpec>, bool) {
    let defaults = coordinator.configured_defaults();
    if spec.profile.is_none() && defaults.is_none() {
        return (spec.idempotency, spec.lock, false);
    }
    let Ok(profile) = settings::find_profile(coordinator, spec.profile) else {
        return (spec.idempotency, spec.lock, true);
    };
    (
        spec.idempotency
            .as_ref()
            .map(|s| settings::idempotency(s, profile, defaults)),
        spec.lock
            .as_ref()
            .map(|s| settings::lock(s, profile, defaults)),
        false,
    )
}

/// The one backend-fault decision of every layer: `Ok(())` to run the body unguarded
/// (`fail_open`: counted and logged), or the error to answer (`fail_closed`). The layer
/// records its own outcome.
pub(crate) fn backend_fault(
    coordinator: &Coordinator,
    key: &CallKey,
    attribute: Option<OnBackendError>,
    err: BackendError,
    layer: &'static str,
) -> Result<(), CoordError> {
    crate::telemetry::backend_error(layer, key.operation().unwrap_or(""), &err);
    match attribute.unwrap_or_else(|| coordinator.on_backend_error()) {
        OnBackendError::FailClosed => Err(CoordError::Backend(err.with_key(key))),
        OnBackendError::FailOpen => {
            coordinator.metrics().count_fail_open();
            tracing::warn!(key = %key, error = %err, layer, "coord: the backend failed; running unguarded (fail_open)");
            Ok(())
        }
    }
}

/// The refusal of an operation whose `replica_acks` asks for replicas on a provider that
/// cannot wait for them ([`Capability::ReplicaAcks`](crate::provider::Capability::ReplicaAcks)):
/// `None` when there is nothing to refuse. Checked before anything is written, whatever the
/// backend-fault policy: running without the acknowledgement the operation asked for would be
/// a silent no-op of it. An override that turns waiting off is never refused.
pub(crate) fn replica_acks_refused(
    coordinator: &Coordinator,
    acks: Option<crate::provider::ReplicaAcks>,
    key: &CallKey,
) -> Option<CoordError> {
    let asks = acks.is_some_and(crate::provider::ReplicaAcks::waits);
    (asks && !coordinator.lock_provider().supports_replica_acks()).then(|| {
        CoordError::Unsupported {
            capability: crate::provider::Capability::ReplicaAcks,
            key: key.clone(),
        }
    })
}
