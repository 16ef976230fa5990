//! The keys and requests the cases send to the provider.

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{ClaimRequest, CompleteRequest, Fingerprint, LockRequest, OwnerToken};
use coord_core::{CallKey, Coordinator};

use super::durations::LONG;

/// The key `rest` in the case's namespace, under the one operation the provider-level cases
/// share (each case names its own keys).
pub(super) fn key(c: &Coordinator, rest: &str) -> CallKey {
    c.key("conformance").part(rest).finish()
}

/// An unfenced lock request.
pub(super) fn lock_req(
    key: &CallKey,
    owner: OwnerToken,
    lease: Duration,
    wait: Duration,
) -> LockRequest<'_> {
    LockRequest {
        key,
        owner,
        lease,
        wait,
        fenced: false,
    }
}

/// A claim request.
pub(super) fn claim_req(
    key: &CallKey,
    owner: OwnerToken,
    in_flight_lease: Duration,
    fingerprint: Option<Fingerprint>,
    keep_abandoned_for: Option<Duration>,
) -> ClaimRequest<'_> {
    ClaimRequest {
        key,
        owner,
        in_flight_lease,
        fingerprint,
        keep_abandoned_for,
        transactional: false,
    }
}

/// A completion of `payload`, kept for [`LONG`].
pub(super) fn complete_req<'a>(
    key: &'a CallKey,
    owner: OwnerToken,
    payload: &Arc<[u8]>,
    fingerprint: Option<Fingerprint>,
) -> CompleteRequest<'a> {
    CompleteRequest {
        key,
        owner,
        payload: payload.clone(),
        retention: LONG,
        fingerprint,
    }
}
