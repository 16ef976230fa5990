//! Instant arithmetic that cannot panic.
//!
//! Durations reach the runtime from attributes (checked at compile time) and from public
//! provider and builder APIs (anything, `Duration::MAX` included). `Instant + Duration` panics
//! on overflow, so every deadline is computed here instead.

use std::time::Duration;

use tokio::time::Instant;

/// About thirty years: far enough to mean "never" for a lease or a wait, near enough that
/// adding it to any instant of a running process cannot overflow.
pub(crate) const NEVER: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// `at + d`, saturating at [`NEVER`] from `at`.
pub(crate) fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d.min(NEVER))
        .or_else(|| at.checked_add(Duration::from_secs(24 * 60 * 60)))
        .unwrap_or(at)
}
