//! Idempotency records written and read in one call, for cases that check something else.

use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{
    ClaimOutcome, CompleteOutcome, CompleteRequest, Fingerprint, IdempotencyStore, OwnerToken,
};
use coord_core::{BackendError, CallKey, Coordinator};

use super::durations::LONG;
use super::requests::claim_req;

/// Completes `key` for `owner` without a fingerprint and says whether the outcome was stored
/// (`Stored` or `StoredWithoutMarker`), for cases that only care whether the completion landed.
pub(super) async fn complete_stored(
    store: &dyn IdempotencyStore,
    key: &CallKey,
    owner: OwnerToken,
    payload: Arc<[u8]>,
    retention: Duration,
) -> Result<bool, BackendError> {
    store
        .complete(CompleteRequest {
            key,
            owner,
            payload,
            retention,
            fingerprint: None,
        })
        .await
        .map(CompleteOutcome::is_stored)
}

/// Reads the record at `key` as a stranger would, expecting a completed one.
pub(super) async fn completed_record(
    c: &Coordinator,
    key: &CallKey,
    why: &str,
) -> (Arc<[u8]>, Option<Fingerprint>) {
    let stranger = OwnerToken::new();
    match c
        .idempotency_store()
        .claim(claim_req(key, stranger, LONG, None, None))
        .await
        .unwrap()
    {
        ClaimOutcome::Completed {
            payload,
            fingerprint,
            ..
        } => (payload, fingerprint),
        other => panic!("{why}: expected a completed record, got {other:?}"),
    }
}
