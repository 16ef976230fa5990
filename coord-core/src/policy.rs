//! Policies an attribute (or the coordinator, as a default) can choose.

/// What an intercepted call does when the coordination backend fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBackendError {
    /// Return [`CoordError::Backend`](crate::CoordError::Backend); the body does not run.
    /// The default: exclusion and at-most-once are never silently given up.
    #[default]
    FailClosed,
    /// Run the body without the guard that failed, log a warning and count it in
    /// [`Metrics::fail_open_runs`](crate::Metrics::fail_open_runs). For work where running
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
