//! The semaphore capability: one row per semaphore key, locked by every acquire, release and
//! renewal of the key, and one row per permit with its own lease and fencing token (the
//! tables and functions of migration 2). Waiters sleep on `LISTEN` and are woken by a release.

use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, LossCause, OwnerToken, PermitGrant, PermitRequest, ReleaseOutcome,
    RenewOutcome, SemaphoreStore,
};
use coord_core::{BackendError, CallKey, FencingToken};
use tokio::time::Instant;

use super::{Inner, PostgresProvider, from_ms, millis, uuid_of, wake_payload};
use crate::waiters::{Cue, Look, Wake};

/// The semaphore statements of one provider, with its schema's (quoted) name in them.
#[derive(Debug)]
pub(crate) struct SemaphoreStatements {
    acquire: String,
    release: String,
    renew: String,
    /// Housekeeping: expired permits, and key rows whose every permit has ended.
    pub(crate) sweep: [String; 2],
}

impl SemaphoreStatements {
    /// The statements for the schema whose quoted name is `schema`.
    pub(crate) fn new(schema: &str) -> SemaphoreStatements {
        let sweep = |table: &str| {
            format!(
                "WITH doomed AS (
  SELECT ctid FROM {schema}.{table} WHERE expires_at <= clock_timestamp()
  LIMIT $1::bigint FOR UPDATE SKIP LOCKED
),
gone AS (DELETE FROM {schema}.{table} t USING doomed WHERE t.ctid = doomed.ctid RETURNING 1)
SELECT count(*) AS swept FROM gone"
            )
        };
        SemaphoreStatements {
            acquire: format!(
                "SELECT token, left_ms FROM {schema}.semaphore_acquire($1::text, $2::uuid, \
                 $3::bigint, $4::bigint, $5::boolean)"
            ),
            release: format!(
                "SELECT {schema}.semaphore_release($1::text, $2::uuid, $3::text, $4::text)"
            ),
            renew: format!("SELECT {schema}.semaphore_renew($1::text, $2::uuid, $3::bigint)"),
            sweep: [sweep("semaphore_permits"), sweep("semaphores")],
        }
    }

    /// Every statement, for checking that each prepares against the schema.
    #[cfg(test)]
    pub(crate) fn all(&self) -> Vec<&str> {
        let mut all = vec![self.acquire.as_str(), &self.release, &self.renew];
        all.extend(self.sweep.iter().map(String::as_str));
        all
    }
}

/// What one attempt at a permit found.
enum Attempt {
    /// A permit is ours, with its token.
    Won(u64),
    /// Every permit is held; the soonest ends within this (server clock; `None`: unknown).
    Full(Option<Duration>),
}

impl Inner {
    /// One attempt; `watch` asks the next release to notify.
    async fn try_permit(
        &self,
        req: &PermitRequest<'_>,
        watch: bool,
    ) -> Result<Attempt, BackendError> {
        let what = "semaphore acquire";
        let key = req.key;
        let limit = i64::from(req.limit);
        let rows = self
            .query(
                &self.semaphores.acquire,
                &[
                    &key.qualified(),
                    &uuid_of(req.owner),
                    &limit,
                    &millis(req.lease),
                    &watch,
                ],
                what,
                key,
            )
            .await?;
        let row = self.one(&rows, what, key)?;
        let token: Option<i64> = self.get(row, 0, what, key)?;
        let left: Option<i64> = self.get(row, 1, what, key)?;
        Ok(match token {
            Some(token) => Attempt::Won(token.max(0) as u64),
            None => Attempt::Full(left.map(from_ms)),
        })
    }

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
        // `None`: a wait too long to represent: until granted or dropped.
        let deadline = Instant::now().checked_add(req.wait);
        match self.try_permit(&req, false).await? {
            Attempt::Won(token) => return Ok(Some(grant(token, false))),
            Attempt::Full(_) if req.wait.is_zero() => return Ok(None),
            Attempt::Full(_) => {}
        }
        // Full: listen, then look again asking the next release to notify; without a
        // notification, look again when the soonest permit's lease ends (capped, jittered).
        let req = &req;
        let look = move |_: Cue| async move {
            Ok(match self.try_permit(req, true).await? {
                Attempt::Won(token) => Look::Done(Some(grant(token, true))),
                Attempt::Full(left) => Look::Pending(left),
            })
        };
        self.hub
            .wait(
                wake_payload("semaphore", req.key),
                Wake::Head,
                deadline,
                None,
                look,
            )
            .await
    }

    async fn release_permit(
        &self,
        key: &CallKey,
        owner: OwnerToken,
    ) -> Result<ReleaseOutcome, BackendError> {
        let what = "semaphore release";
        let payload = wake_payload("semaphore", key);
        let rows = self
            .query(
                &self.semaphores.release,
                &[&key.qualified(), &uuid_of(owner), &self.channel, &payload],
                what,
                key,
            )
            .await?;
        let row = self.one(&rows, what, key)?;
        Ok(if self.get::<bool>(row, 0, what, key)? {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        })
    }

    async fn renew_permit(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<RenewOutcome, BackendError> {
        let what = "semaphore renew";
        let rows = self
            .query(
                &self.semaphores.renew,
                &[&key.qualified(), &uuid_of(owner), &millis(lease)],
                what,
                key,
            )
            .await?;
        let row = self.one(&rows, what, key)?;
        Ok(if self.get::<bool>(row, 0, what, key)? {
            RenewOutcome::Renewed
        } else {
            // No forced release of permits: a permit that is gone has lapsed.
            RenewOutcome::Lost(LossCause::Expired)
        })
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
