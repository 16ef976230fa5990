//! The read-write lock capability: one row per read-write lock key (locked by every acquire,
//! release and renewal of the key, and holding a waiting writer's claim), and one row per hold
//! with its mode, lease and fencing token (the tables and functions of migration 3; the
//! counted-lease shape, `counted_leases`). Waiters sleep on `LISTEN` and are woken by a
//! release or a withdrawn claim.

use std::time::Duration;

use coord_core::provider::{
    BoxFuture, OwnerToken, ReleaseOutcome, RenewOutcome, RwGrant, RwLockRequest, RwLockStore,
    RwMode,
};
use coord_core::{BackendError, CallKey, FencingToken};
use tokio_postgres::Row;

use super::counted_leases::{Acquired, CountedKind, CountedStatements};
use super::locks::renew_outcome;
use super::{Inner, PostgresProvider, millis, uuid_of};
use crate::waiters::Wake;

/// Read-write locks as counted leases. Every waiter of the key is woken by a notification
/// (one release can let several readers in).
#[derive(Debug)]
pub(crate) struct RwLocks;

/// The read-write lock statements of one provider, with its schema's (quoted) name in them.
pub(crate) type RwStatements = CountedStatements<RwLocks>;

impl CountedKind for RwLocks {
    const PAYLOAD: &'static str = "rw-lock";
    const WAKE: Wake = Wake::All;
    const TABLES: [&'static str; 2] = ["rw_holds", "rw_locks"];
    const ACQUIRING: &'static str = "read-write lock acquire";
    const RELEASING: &'static str = "read-write lock release";
    const RENEWING: &'static str = "read-write lock renew";

    fn statements(schema: &str) -> [String; 3] {
        [
            format!(
                "SELECT token, left_ms FROM {schema}.rw_acquire($1::text, $2::uuid, \
                 $3::boolean, $4::bigint, $5::bigint, $6::boolean)"
            ),
            format!(
                "SELECT {schema}.rw_release($1::text, $2::uuid, $3::boolean, $4::text, $5::text)"
            ),
            format!("SELECT {schema}.rw_renew($1::text, $2::uuid, $3::boolean, $4::bigint)"),
        ]
    }

    fn renewed(inner: &Inner, rows: &[Row], key: &CallKey) -> Result<RenewOutcome, BackendError> {
        renew_outcome(inner, rows, Self::RENEWING, key)
    }
}

fn writing(mode: RwMode) -> bool {
    mode == RwMode::Write
}

impl Inner {
    async fn acquire_rw(&self, req: RwLockRequest<'_>) -> Result<Option<RwGrant>, BackendError> {
        // Blocked: listen, then look again leaving a writer's claim and asking the next
        // release to notify. Without a notification, a waiter looks again when the first hold
        // or claim in its way ends (a claiming writer: at half its claim), capped, jittered.
        // At least 2 ms, so that half a claim (when its writer looks again) is not zero.
        let claim = millis(req.claim).max(2);
        let acquired = self
            .counted_acquire(
                &self.rw,
                req.key,
                &[
                    &req.key.qualified(),
                    &uuid_of(req.owner),
                    &writing(req.mode),
                    &millis(req.lease),
                    &claim,
                ],
                req.wait,
            )
            .await?;
        Ok(match acquired {
            Acquired::Granted { token, contended } => Some(grant(token, contended)),
            Acquired::Refused => None,
            Acquired::WaitEnded => {
                if req.mode == RwMode::Write {
                    // Gave up: withdraw the claim now rather than hold readers back until it
                    // ends. Best effort: the claim ends on its own anyway.
                    let _ = self.release_rw(req.key, req.owner, RwMode::Write).await;
                }
                None
            }
        })
    }

    async fn release_rw(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        mode: RwMode,
    ) -> Result<ReleaseOutcome, BackendError> {
        self.counted_release(
            &self.rw,
            key,
            &[&key.qualified(), &uuid_of(owner), &writing(mode)],
        )
        .await
    }

    async fn renew_rw(
        &self,
        key: &CallKey,
        owner: OwnerToken,
        mode: RwMode,
        lease: Duration,
    ) -> Result<RenewOutcome, BackendError> {
        self.counted_renew(
            &self.rw,
            key,
            &[
                &key.qualified(),
                &uuid_of(owner),
                &writing(mode),
                &millis(lease),
            ],
        )
        .await
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
