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
