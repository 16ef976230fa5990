//! The durations the cases use: leases that outlast a case, leases the cases let lapse, and
//! the extremes no provider may choke on.

use std::time::Duration;

/// A lease, wait or retention that outlasts any case: state made with it is still there when
/// the case checks it.
pub(super) const LONG: Duration = Duration::from_secs(30);

/// A lease the cases let lapse.
pub(super) const SHORT: Duration = Duration::from_millis(200);
/// A sleep that is surely past [`SHORT`] on the backend's clock (generous: a loaded machine
/// must not make a case flaky).
pub(super) const PAST_SHORT: Duration = Duration::from_millis(700);

/// The lease of a hold the case renews: long against the renewal interval, so that a
/// renewal delayed by a loaded machine (a slow statement, a starved thread) for most of a
/// second still lands before the lease runs out.
pub(super) const RENEWED_LEASE: Duration = Duration::from_secs(1);
/// How often the case renews a hold with [`RENEWED_LEASE`].
pub(super) const RENEWAL_EVERY: Duration = Duration::from_millis(100);
/// A sleep surely past [`RENEWED_LEASE`]: a hold still there after it was renewed.
pub(super) const PAST_RENEWED_LEASE: Duration = Duration::from_millis(1800);

/// Durations no provider may choke on: zero, below any backend's resolution, past Redis's
/// `PX` limit, and the largest a `Duration` holds.
pub(super) const EXTREMES: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_micros(1),
    Duration::from_millis(u64::MAX),
    Duration::MAX,
];

/// A duration long enough that state made with it is still there when checked.
pub(super) fn is_huge(d: Duration) -> bool {
    d >= LONG
}
