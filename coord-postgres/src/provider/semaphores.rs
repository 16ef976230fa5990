//! The semaphore capability: one row per semaphore key, locked by every acquire, release and
//! renewal of the key, and one row per permit with its own lease and fencing token (the
//! tables and functions of migration 2; the counted-lease shape, `counted_leases`). Waiters
//! sleep on `LISTEN` and are woken by a release.

use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, LossCause, OwnerToken, PermitGrant, PermitRequest, ReleaseOutcome,
    RenewOutcome, SemaphoreStore,
};
use coord_core::{BackendError, CallKey, FencingToken};
use tokio_postgres::Row;

use super::counted_leases::{Acquired, CountedKind, CountedStatements};
use super::{Inner, PostgresProvider, millis, uuid_of};
use crate::waiters::Wake;

/// Semaphores as counted leases: a permit is handed off to one waiter at a time.
#[derive(Debug)]
pub(crate) struct Semaphores;

/// The semaphore statements of one provider, with its schema's (quoted) name in them.
pub(crate) type SemaphoreStatements = CountedStatements<Semaphores>;

impl CountedKind for Semaphores {
    const PAYLOAD: &'static str = "semaphore";
    const WAKE: Wake = Wake::Head;
    const TABLES: [&'static str; 2] = ["semaphore_permits", "semaphores"];
    const ACQUIRING: &'static str = "semaphore acquire";
    const RELEASING: &'static str = "semaphore release";
    const RENEWING: &'static str = "semaphore renew";

    fn statements(schema: &str) -> [String; 3] {
        [
            format!(
                "SELECT token, left_ms FROM {schema}.semaphore_acquire($1::text, $2::uuid, \
                 $3::bigint, $4::bigint, $5::boolean)"
            ),
            format!("SELECT {schema}.semaphore_release($1::text, $2::uuid, $3::text, $4::text)"),
            format!("SELECT {schema}.semaphore_renew($1::text, $2::uuid, $3::bigint)"),
        ]
    }

    fn renewed(inner: &Inner, rows: &[Row], key: &CallKey) -> Result<RenewOutcome, BackendError> {
        let what = Self::RENEWING;
        let row = inner.one(rows, what, key)?;
        Ok(if inner.get::<bool>(row, 0, what, key)? {
            RenewOutcome::Renewed
        } else {
            // No forced release of permits: a permit that is gone has lapsed.
            RenewOutcome::Lost(LossCause::Expired)
        })
    }
}

impl Inner {
    async fn acquire_permit(
        &self,
        req: PermitRequest<'_>,
    ) -> Result<Option<PermitGrant>, BackendError> {
        if req.limit == 0 {
            return Err(BackendError::new(
                BackendErrorKind::Config,
                "a semaphore needs at least one permit (the limit was 0)",
            )
            .with_key(req.key));
        }
        // Full: listen, then look again asking the next release to notify; without a
        // notification, look again when the soonest permit's lease ends (capped, jittered).
        let limit = i64::from(req.limit);
        let acquired = self
            .counted_acquire(
                &self.semaphores,
                req.key,
                &[
                    &req.key.qualified(),
                    &uuid_of(req.owner),
                    &limit,
                    &millis(req.lease),
                ],
                req.wait,
            )
            .await?;
        Ok(match acquired {
            Acquired::Granted { token, contended } => Some(grant(token, contended)),
            Acquired::Refused | Acquired::WaitEnded => None,
        })
    }

    async fn release_permit(
        &self,
        key: &CallKey,
        owner: OwnerToken,
    ) -> Result<ReleaseOutcome, BackendError> {
        self.counted_release(&self.semaphores, key, &[&key.qualified(), &uuid_of(owner)])
            .await
    }

    async fn renew_permit(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<RenewOutcome, BackendError> {
        self.counted_renew(
            &self.semaphores,
            key,
            &[&key.qualified(), &uuid_of(owner), &millis(lease)],
        )
        .await
    }
}

fn grant(token: u64, contended: bool) -> PermitGrant {
    PermitGrant {
        fencing_token: FencingToken::new(token),
        contended,
        lease_began: None,
    }
}

/// Semaphores on one PostgreSQL database: the limit is exact there (every acquire of a key
/// counts and takes under the key's row lock, in the server's clock). A semaphore is never
/// spread over several databases.
impl SemaphoreStore for PostgresProvider {
    fn supports_semaphores(&self) -> bool {
        true
    }

    fn acquire_permit<'a>(
        &'a self,
        req: PermitRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<PermitGrant>, BackendError>> {
        Box::pin(self.inner.acquire_permit(req))
    }

    fn release_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(self.inner.release_permit(key, owner))
    }

    fn renew_permit<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(self.inner.renew_permit(key, owner, lease))
    }
}
