//! Deadlines that cannot overflow.
//!
//! Durations reach coord from attributes (checked at compile time) and from public provider,
//! handle and builder APIs, where anything is accepted, `Duration::MAX` included. `Instant +
//! Duration` panics on overflow, so every deadline in coord (runtime and providers alike) is
//! computed with [`deadline_after`].

use std::time::Duration;

use tokio::time::Instant;

/// About thirty years: far enough to mean "never" for a lease, a wait or a retention, near
/// enough that adding it to any instant of a running process fits the platform's clock.
///
/// Longer durations are treated as this one, which no process outlives, so "until
/// `Duration::MAX` has passed" and "never" behave the same.
pub const FAR_FUTURE: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// The instant `duration` after `now`, saturating instead of overflowing.
///
/// `duration` is first capped at [`FAR_FUTURE`]; if even that does not fit the platform's
/// clock, the longest span that does fit (halving until it fits) is used. Never panics, and
/// never returns an instant earlier than `now`.
pub fn deadline_after(now: Instant, duration: Duration) -> Instant {
    let mut span = duration.min(FAR_FUTURE);
    loop {
        if let Some(at) = now.checked_add(span) {
            return at;
        }
        // Terminates: the span halves each round, and `now + 0` always fits.
        span /= 2;
    }
}

/// A monotonic deadline for providers implementing a bounded wait.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(std::time::Instant);

impl Deadline {
    /// The deadline `wait` from now. Saturates: a `wait` too large to add to the clock (e.g.
    /// `Duration::MAX`) is a deadline decades away, which means "until cancelled".
    pub fn after(wait: Duration) -> Deadline {
        Deadline(deadline_after(Instant::now(), wait).into_std())
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(std::time::Instant::now())
    }

    /// The instant itself.
    pub fn instant(&self) -> std::time::Instant {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert!(deadline_after(now, Duration::MAX) >= now + FAR_FUTURE / 2);
        assert_eq!(deadline_after(now, Duration::ZERO), now);
        assert_eq!(
            deadline_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        let d = Deadline::after(Duration::MAX);
        assert!(d.remaining() > Duration::from_secs(365 * 24 * 3600));
    }
}
