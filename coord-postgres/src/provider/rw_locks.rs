//! The read-write lock capability: one row per read-write lock key (locked by every acquire,
//! release and renewal of the key, and holding a waiting writer's claim), and one row per hold
//! with its mode, lease and fencing token (the tables and functions of migration 3). Waiters
//! sleep on `LISTEN` and are woken by a release or a withdrawn claim.

use std::time::Duration;

use coord_core::provider::{
    BoxFuture, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwLockRequest, RwLockStore,
    RwMode,
};
use coord_core::{BackendError, CallKey, FencingToken};
use tokio::time::Instant;

use super::locks::renew_outcome;
use super::{Inner, PostgresProvider, from_ms, millis, uuid_of, wake_payload};
use crate::waiters::{Cue, Look, Wake};

/// The kind in a read-write lock's notification payload.
const KIND: &str = "rw-lock";

/// The read-write lock statements of one provider, with its schema's (quoted) name in them.
#[derive(Debug)]
pub(crate) struct RwStatements {
    acquire: String,
    release: String,
    renew: String,
    /// Housekeeping: ended holds, and key rows whose every hold and claim has ended.
    pub(crate) sweep: [String; 2],
}

impl RwStatements {
    /// The statements for the schema whose quoted name is `schema`.
    pub(crate) fn new(schema: &str) -> RwStatements {
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
        RwStatements {
            acquire: format!(
                "SELECT token, left_ms FROM {schema}.rw_acquire($1::text, $2::uuid, \
                 $3::boolean, $4::bigint, $5::bigint, $6::boolean)"
            ),
            release: format!(
                "SELECT {schema}.rw_release($1::text, $2::uuid, $3::boolean, $4::text, $5::text)"
            ),
            renew: format!("SELECT {schema}.rw_renew($1::text, $2::uuid, $3::boolean, $4::bigint)"),
            sweep: [sweep("rw_holds"), sweep("rw_locks")],
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

/// What one attempt found.
enum Attempt {
    /// The hold is ours, with its token.
    Won(u64),
    /// Not now; the first hold or claim in the way ends within this (server clock; `None`:
    /// unknown).
    Blocked(Option<Duration>),
}

fn writing(mode: RwMode) -> bool {
    mode == RwMode::Write
}

impl Inner {
    /// One attempt; `watch` (the caller waits) leaves or re-asserts a writer's claim and asks
    /// the next release to notify.
    async fn try_rw(&self, req: &RwLockRequest<'_>, watch: bool) -> Result<Attempt, BackendError> {
        let what = "read-write lock acquire";
        let key = req.key;
        // At least 2 ms, so that half a claim (when its writer looks again) is not zero.
        let claim = millis(req.claim).max(2);
        let rows = self
            .query(
                &self.rw.acquire,
                &[
                    &key.qualified(),
                    &uuid_of(req.owner),
                    &writing(req.mode),
                    &millis(req.lease),
                    &claim,
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
            None => Attempt::Blocked(left.map(from_ms)),
        })
    }

    async fn acquire_rw(&self, req: RwLockRequest<'_>) -> Result<Option<RwGrant>, BackendError> {
        match self.try_rw(&req, false).await? {
            Attempt::Won(token) => return Ok(Some(grant(token, false))),
            Attempt::Blocked(_) if req.wait.is_zero() => return Ok(None),
            Attempt::Blocked(_) => {}
        }
        // `None`: a wait too long to represent: until granted or dropped.
        let deadline = Instant::now().checked_add(req.wait);
        // Blocked: listen, then look again leaving a writer's claim and asking the next
        // release to notify. Every waiter of the key is woken by a notification (one release
        // can let several readers in); without one, a waiter looks again when the first hold
        // or claim in its way ends (a claiming writer: at half its claim), capped, jittered.
        let rq = &req;
        let look = move |_: Cue| async move {
            Ok(match self.try_rw(rq, true).await? {
                Attempt::Won(token) => Look::Done(Some(grant(token, true))),
                Attempt::Blocked(left) => Look::Pending(left),
            })
        };
        let granted = self
            .hub
            .wait(wake_payload(KIND, req.key), Wake::All, deadline, None, look)
            .await?;
        if granted.is_none() && req.mode == RwMode::Write {
            // Gave up: withdraw the claim now rather than hold readers back until it ends.
            // Best effort: the claim ends on its own anyway.
            let _ = self.release_rw(req.key, req.owner, RwMode::Write).await;
        }
        Ok(granted)
    }

    async fn release_rw(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> Result<ReleaseOutcome, BackendError> {
        let what = "read-write lock release";
        let payload = wake_payload(KIND, key);
        let rows = self
            .query(
                &self.rw.release,
                &[
                    &key.qualified(),
                    &uuid_of(owner),
                    &writing(mode),
                    &self.channel,
                    &payload,
                ],
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

    async fn renew_rw(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> Result<RenewOutcome, BackendError> {
        let what = "read-write lock renew";
        let rows = self
            .query(
                &self.rw.renew,
                &[
                    &key.qualified(),
                    &uuid_of(owner),
                    &writing(mode),
                    &millis(lease),
                ],
                what,
                key,
            )
            .await?;
        renew_outcome(self, &rows, what, key)
    }
}

fn grant(token: u64, contended: bool) -> RwGrant {
    RwGrant {
        fencing_token: FencingToken::new(token),
        contended,
        lease_began: None,
    }
}

/// Read-write locks on one PostgreSQL database: exclusion holds there (every acquire of a key
/// checks and grants under the key's row lock, in the server's clock). A read-write lock is
/// never spread over several databases.
///
/// Tokens come from the one sequence every lock and permit of the schema draws from, drawn
/// under the key's row lock, so each hold's token is greater than every earlier hold's of the
/// key, whichever its mode.
impl RwLockStore for PostgresProvider {
    fn supports_rw_locks(&self) -> bool {
        true
    }

    fn acquire_rw<'a>(
        &'a self,
        req: RwLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<RwGrant>, BackendError>> {
        Box::pin(self.inner.acquire_rw(req))
    }

    fn release_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(self.inner.release_rw(key, owner, mode))
    }

    fn renew_rw<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        Box::pin(self.inner.renew_rw(key, owner, mode, lease))
    }
}
