//! [`IdempotencyStore`] over the record store.
use std::sync::Arc;
use std::time::Duration;

use coord_contract::{
    BackendError, BoxFuture, CallKey, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest,
    IdempotencyStore, OwnerToken, RenewOutcome,
};

use super::MemoryProvider;

impl IdempotencyStore for MemoryProvider {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        // A transactional marker that lapses is absent, kept or not: nothing of its run can
        // have committed without the completed record (see `ClaimRequest::transactional`).
        let keep_abandoned_for = if req.transactional {
            None
        } else {
            req.keep_abandoned_for
        };
        let outcome = self.records.claim_shared(
            req.key.shared(),
            req.owner,
            req.in_flight_lease,
            req.fingerprint,
            keep_abandoned_for,
        );
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        let outcome = self.records.complete_shared(
            req.key.shared(),
            req.owner,
            req.payload,
            req.retention,
            req.fingerprint,
        );
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let done = self.records.abandon(key.qualified(), owner);
        Box::pin(std::future::ready(Ok(done)))
    }

    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        let done = self.records.end_lease(key.qualified(), owner);
        Box::pin(std::future::ready(Ok(done)))
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.records.wait_settled(key.qualified(), timeout).await;
            Ok(())
        })
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        let outcome = self.records.renew(key.qualified(), owner, lease);
        Box::pin(std::future::ready(Ok(outcome)))
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(std::future::ready(Ok(self.records.purge(key.qualified()))))
    }

    /// Transactional claims are taken (with their lapse rule), so that the runtime's
    /// transactional path can be exercised in-process; this provider has no database, so the
    /// only transactions that complete here are test doubles built over it. A real database
    /// transaction paired with this provider finds no marker at completion and cannot commit.
    fn transactional_claims(&self) -> bool {
        true
    }

    fn abandon_detached(self: Arc<Self>, key: CallKey, owner: OwnerToken, _lease_left: Duration) {
        self.records.abandon(key.qualified(), owner);
    }
}
