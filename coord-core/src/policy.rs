//! Policies an attribute (or the coordinator, as a default) can choose.

/// What an intercepted call does when the coordination backend fails. In configuration it
/// is written `"fail_closed"` or `"fail_open"`, as in the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBackendError {
    /// Return [`CoordError::Backend`](crate::CoordError::Backend); the body does not run.
    /// The default: exclusion and at-most-once are never silently given up.
    #[default]
    FailClosed,
    /// Run the body without the guard that failed, log a warning and count it in
    /// [`Metrics::fail_open_runs`](crate::telemetry::Metrics::fail_open_runs). For work where running
    /// twice is cheaper than not running.
    FailOpen,
}

/// What happens to a running body when its lease is lost (renewal found the token gone, or a
/// whole lease passed without a confirmed renewal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body at its next await and return `CoordError::LockLost`. The default when
    /// renewing.
    Cancel,
    /// Let the body run on; it can watch [`lock_lost`](crate::lock_lost) and
    /// [`is_held`](crate::is_held) and decide itself.
    Signal,
}

/// What a duplicate finds when an earlier call's in-flight marker lapsed without completing
/// (its caller crashed or stalled past `in_flight_lease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnAbandoned {
    /// Run the body again: at-least-once. The default.
    #[default]
    Rerun,
    /// Return `CoordError::OutcomeUnknown` and leave the record for an operator: at-most-once,
    /// for effects like payments where running twice is worse than not knowing.
    Fail,
}

/// What an `#[idempotent]` call answers when its body returned `Ok` but the outcome could not
/// be stored (after retrying for as long as its in-flight marker could still be its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    /// Return `CoordError::OutcomeNotStored`: the caller learns that the work ran and that a
    /// retry may not replay it. The default.
    #[default]
    Error,
    /// Return the body's `Ok` anyway, log at error level and flag the call's
    /// [`CallReport`](crate::CallReport) (`IdempotencyOutcome::NotStored`) and the coordinator's
    /// metrics. For callers that prefer a lost replay to an error.
    ReturnOk,
}

/// What an `#[idempotent]` call does when a key part is absent (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissingKey {
    /// Refuse with `CoordError::MissingKey` before the body runs. The default: calls without a
    /// key never share one record.
    #[default]
    Fail,
    /// Run the body without the idempotency layer (no claim, no record), count it in
    /// [`Metrics::unprotected_runs`](crate::telemetry::Metrics::unprotected_runs) and report
    /// `IdempotencyOutcome::Unprotected`.
    RunUnprotected,
}
