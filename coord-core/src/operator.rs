//! The operator's handle on a coordinator's state: inspect a lock or a record, list the locks
//! and records of one operation, force a lock free, purge a record.
//!
//! [`Operator`] (from [`Coordinator::operator`]) works in the coordinator's namespace and logs
//! every destructive call; it reaches the provider only through the contract's
//! [`Operations`](crate::provider::Operations) and [`IdempotencyStore::purge`](crate::provider::IdempotencyStore::purge).
//! Everything here takes and returns [`CallKey`]s, shown as `operation:parts`: the form
//! errors, call reports and log lines print, and the form a listing yields, so an operator can
//! paste any of them back into [`Operator::lock`], [`Operator::release_lock`] or
//! [`Operator::purge_record`] (through [`Operator::key`] or [`CallKey::from_op_key`]).

use crate::provider::{
    BackendError, CallKey, Cursor, ForcedRelease, InvalidCallKey, ListRequest, LockInfo, Page,
    RecordInfo,
};
use crate::runtime::state::Coordinator;

/// An operator's handle on a coordinator's state, from [`Coordinator::operator`]: everything
/// in the coordinator's namespace.
///
/// The destructive calls ([`release_lock`](Operator::release_lock),
/// [`purge_record`](Operator::purge_record)) take who asked for them and log at `warn` (target
/// `coord::operations`) with the key, who asked and what happened, failures included.
#[derive(Debug, Clone, Copy)]
pub struct Operator<'c> {
    coordinator: &'c Coordinator,
}

impl<'c> Operator<'c> {
    pub(crate) fn new(coordinator: &'c Coordinator) -> Operator<'c> {
        Operator { coordinator }
    }

    /// The key an operator pasted (`operation:parts`, as errors, reports, logs and listings
    /// show it), in this coordinator's namespace. See [`CallKey::from_op_key`] for what is
    /// refused.
    pub fn key(&self, shown: &str) -> Result<CallKey, InvalidCallKey> {
        CallKey::from_op_key(self.coordinator.namespace(), shown)
    }

    /// The lock at `key`: held or free, by whom, for how long yet, who waits, fencing token.
    pub async fn lock(&self, key: &CallKey) -> Result<LockInfo, BackendError> {
        self.coordinator.operations().inspect_lock(key).await
    }

    /// The idempotency record at `key`, or `None` when there is none.
    pub async fn record(&self, key: &CallKey) -> Result<Option<RecordInfo>, BackendError> {
        self.coordinator.operations().inspect_record(key).await
    }

    /// A page (at most `limit` keys, see [`ListRequest::limit`]) of the held locks of
    /// `operation` (its name as given to the attribute or the handle API), starting at
    /// `cursor` (`None` for the first page). See [`Page`] for what a listing promises.
    pub async fn locks(
        &self,
        operation: &str,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page<CallKey>, BackendError> {
        let op = self.coordinator.key(operation).finish();
        let req = ListRequest {
            operation: &op,
            cursor,
            limit,
        };
        self.coordinator.operations().list_locks(req).await
    }

    /// A page of the keys of `operation` that have an idempotency record, like
    /// [`Operator::locks`].
    pub async fn records(
        &self,
        operation: &str,
        cursor: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page<CallKey>, BackendError> {
        let op = self.coordinator.key(operation).finish();
        let req = ListRequest {
            operation: &op,
            cursor,
            limit,
        };
        self.coordinator.operations().list_records(req).await
    }

    /// Frees the lock at `key` whoever holds it (see [`ForcedRelease`] for what the former
    /// holder sees), and logs it at `warn` with `requested_by`: who asked (a user name, a
    /// ticket, a tool).
    pub async fn release_lock(
        &self,
        key: &CallKey,
        requested_by: &str,
    ) -> Result<ForcedRelease, BackendError> {
        let result = self.coordinator.operations().force_release(key).await;
        let requested_by = who(requested_by);
        match &result {
            Ok(ForcedRelease::Released { owner }) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                former_owner = %owner,
                "coord: lock force-released by an operator"
            ),
            Ok(ForcedRelease::NotHeld) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                "coord: force-release asked by an operator; the lock was not held"
            ),
            Ok(ForcedRelease::RemovedCorrupt) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                "coord: force-release asked by an operator removed a lock value coord did not write"
            ),
            // A provider's answer of a kind added to the contract after this was written.
            Ok(other) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                outcome = ?other,
                "coord: lock force-released by an operator"
            ),
            Err(err) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                error = %err,
                "coord: force-release asked by an operator failed"
            ),
        }
        result
    }

    /// Removes the idempotency record at `key`, whatever its state (the way to resolve an
    /// abandoned record after reconciling by hand, or to clear a corrupt one), and logs it at
    /// `warn` with `requested_by`. Returns whether a record was there. Duplicates of the call
    /// then run the body again.
    pub async fn purge_record(
        &self,
        key: &CallKey,
        requested_by: &str,
    ) -> Result<bool, BackendError> {
        let result = self.coordinator.idempotency_store().purge(key).await;
        let requested_by = who(requested_by);
        match &result {
            Ok(found) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                found,
                "coord: idempotency record purged by an operator"
            ),
            Err(err) => tracing::warn!(
                target: "coord::operations",
                key = %key,
                namespace = key.namespace(),
                requested_by,
                error = %err,
                "coord: purge asked by an operator failed"
            ),
        }
        result
    }
}

/// Who asked, for the log line: never blank.
fn who(requested_by: &str) -> &str {
    let trimmed = requested_by.trim();
    if trimmed.is_empty() {
        "(not given)"
    } else {
        trimmed
    }
}

impl Coordinator {
    /// An operator's handle on this coordinator's state: inspect and list locks and records of
    /// this namespace, force a lock free, purge a record (each destructive call logged with who
    /// asked). See [`Operator`].
    pub fn operator(&self) -> Operator<'_> {
        Operator::new(self)
    }
}
