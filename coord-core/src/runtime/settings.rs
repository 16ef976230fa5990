//! The durations and policies of one call, resolved from the attribute (or handle), the
//! profile it names and the coordinator's configured defaults. The precedence table is in the
//! `config` module's docs; this file is its only implementation.

use std::time::Duration;

use crate::config::Profile;
use crate::policy::OnLost;
use crate::runtime::spec::{IdempotencySpec, LockSpec, Written};
use crate::runtime::state::Coordinator;

/// The first of: the profile's value, the written literal, the configured default, the
/// built-in default (which is what an unwritten literal holds).
fn pick(
    literal: Duration,
    written: bool,
    profile: Option<Duration>,
    defaults: Option<Duration>,
) -> Duration {
    profile
        .or(written.then_some(literal))
        .or(defaults)
        .unwrap_or(literal)
}

/// The renewal interval in force, and the loss policy that goes with it.
fn renewal(
    literal: Option<Duration>,
    written: Written,
    profile: Option<Duration>,
    defaults: Option<Duration>,
    lease: Duration,
    on_lost: Option<OnLost>,
) -> (Option<Duration>, Option<OnLost>) {
    let third = (lease / 3).max(Duration::from_millis(1));
    let renew = match profile {
        Some(every) => Some(every),
        None if written.has(Written::RENEW_AUTO) => Some(third),
        None if written.has(Written::RENEW) => literal,
        None => defaults,
    };
    let renew = renew.map(|every| {
        if every >= lease {
            tracing::warn!(
                renew = ?every,
                lease = ?lease,
                "coord: the renew interval in force is not shorter than the lease in force; renewing every third of the lease instead"
            );
            third
        } else {
            every
        }
    });
    let on_lost = on_lost.or(renew.map(|_| OnLost::Cancel));
    (renew, on_lost)
}

/// `spec` with the profile's and the defaults' values applied.
pub(crate) fn idempotency(
    spec: &IdempotencySpec,
    profile: Option<&Profile>,
    defaults: Option<&Profile>,
) -> IdempotencySpec {
    let empty = Profile::default();
    let (p, d) = (profile.unwrap_or(&empty), defaults.unwrap_or(&empty));
    let w = spec.written;
    let in_flight_lease = pick(
        spec.in_flight_lease,
        w.has(Written::IN_FLIGHT_LEASE),
        p.in_flight_lease,
        d.in_flight_lease,
    );
    let (renew, on_lost) = renewal(
        spec.renew,
        w,
        p.renew,
        d.renew,
        in_flight_lease,
        spec.on_lost,
    );
    IdempotencySpec {
        retention: pick(
            spec.retention,
            w.has(Written::RETENTION),
            p.retention,
            d.retention,
        ),
        in_flight_lease,
        wait: pick(spec.wait, w.has(Written::WAIT), p.wait, d.wait),
        on_backend_error: p.on_backend_error.or(spec.on_backend_error),
        renew,
        on_lost,
        ..*spec
    }
}

/// `spec` with the profile's and the defaults' values applied.
pub(crate) fn lock(
    spec: &LockSpec,
    profile: Option<&Profile>,
    defaults: Option<&Profile>,
) -> LockSpec {
    let empty = Profile::default();
    let (p, d) = (profile.unwrap_or(&empty), defaults.unwrap_or(&empty));
    let w = spec.written;
    let lease = pick(spec.lease, w.has(Written::LEASE), p.lease, d.lease);
    let (renew, on_lost) = renewal(spec.renew, w, p.renew, d.renew, lease, spec.on_lost);
    LockSpec {
        lease,
        wait: pick(spec.wait, w.has(Written::WAIT), p.wait, d.wait),
        on_backend_error: p.on_backend_error.or(spec.on_backend_error),
        renew,
        on_lost,
        ..*spec
    }
}

/// The profile named `name` on `coordinator`: `Ok(None)` for no name, `Err(())` for a name the
/// coordinator does not have.
pub(crate) fn find_profile<'c>(
    coordinator: &'c Coordinator,
    name: Option<&str>,
) -> Result<Option<&'c Profile>, ()> {
    match name {
        None => Ok(None),
        Some(name) => coordinator.profile(name).map(Some).ok_or(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_precedence_table() {
        // literal, written?, profile, defaults -> expected
        assert_eq!(pick(S(1), true, Some(S(2)), Some(S(3))), S(2));
        assert_eq!(pick(S(1), true, None, Some(S(3))), S(1));
        assert_eq!(pick(S(1), false, None, Some(S(3))), S(3));
        assert_eq!(pick(S(1), false, None, None), S(1));
        assert_eq!(pick(S(1), false, Some(S(2)), None), S(2));
    }

    #[test]
    fn renew_true_follows_the_lease_in_force_and_an_interval_too_long_is_cut() {
        let auto = Written::RENEW.with(Written::RENEW_AUTO);
        assert_eq!(
            renewal(Some(S(10)), auto, None, None, S(90), None).0,
            Some(S(30))
        );
        assert_eq!(
            renewal(Some(S(10)), Written::RENEW, None, None, S(6), None).0,
            Some(S(2))
        );
        // `renew = false` written beats the defaults' renew.
        assert_eq!(
            renewal(None, Written::RENEW, None, Some(S(1)), S(6), None),
            (None, None)
        );
        assert_eq!(
            renewal(None, Written::NONE, None, Some(S(1)), S(6), None),
            (Some(S(1)), Some(OnLost::Cancel))
        );
    }
}
