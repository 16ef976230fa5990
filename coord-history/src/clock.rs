//! The one clock of a history: `CLOCK_MONOTONIC`, which every process of one machine shares.

/// Nanoseconds on the machine's monotonic clock. Comparable across the processes of one
/// machine (not across machines, and not across reboots); never goes backwards.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
