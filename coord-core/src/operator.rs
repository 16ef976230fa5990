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

use std::collections::{BTreeMap, BTreeSet};

use crate::provider::{
    BackendError, CallKey, Cursor, ForcedRelease, InvalidCallKey, ListRequest, LockInfo, MAX_PAGE,
    NamespaceListRequest, Page, RecordInfo, RwLockInfo, SemaphoreInfo,
};
use crate::runtime::state::Coordinator;

/// An operation that has state in a namespace, and how much: one row of
/// [`Operator::lock_operations`] or [`Operator::record_operations`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationState {
    /// The operation's name as written into its keys, read back from the shown form
    /// ([`CallKey::shown_operation`]): the attribute's `name`, or by default the module path
    /// and the function name (`my_app::jobs::nightly`). What `coord locks list <operation>` and
    /// [`Operator::locks`] take.
    pub operation: String,
    /// How many keys of the operation have that state (held locks, or records).
    pub keys: usize,
}

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

    /// The semaphore at `key` (`permits = N`): each permit held now, with its owner, lease left
    /// and fencing token, and who waits. Free is an empty answer, not an error. A provider
    /// that does not implement it answers a `Config` error saying so.
    pub async fn semaphore(&self, key: &CallKey) -> Result<SemaphoreInfo, BackendError> {
        self.coordinator.operations().inspect_semaphore(key).await
    }

    /// The read-write lock at `key` (`mode = "read" | "write"`): its readers, its writer, the
    /// waiting writer whose claim keeps new readers out, and who waits. Free is an empty
    /// answer, not an error. A provider that does not implement it answers a `Config` error
    /// saying so.
    pub async fn rw_lock(&self, key: &CallKey) -> Result<RwLockInfo, BackendError> {
        self.coordinator.operations().inspect_rw_lock(key).await
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

    /// The operations of this namespace that hold at least one lock now, with how many, by
    /// name: for an operator who does not know the operations' names yet (default names are
    /// module paths). Follows every page of the namespace's listing, so it reads every lock key
    /// of the namespace (Redis: `SCAN` with `MATCH`, never `KEYS`); a key listed twice by the
    /// backend is counted once.
    pub async fn lock_operations(&self) -> Result<Vec<OperationState>, BackendError> {
        self.operations_with(true).await
    }

    /// The operations of this namespace that have idempotency records, with how many, like
    /// [`Operator::lock_operations`].
    pub async fn record_operations(&self) -> Result<Vec<OperationState>, BackendError> {
        self.operations_with(false).await
    }

    async fn operations_with(&self, locks: bool) -> Result<Vec<OperationState>, BackendError> {
        // Any operation name will do: only the namespace of this key is read.
        let namespace = self.coordinator.key("operations").finish();
        let operations = self.coordinator.operations();
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut cursor: Option<Cursor> = None;
        loop {
            let req = NamespaceListRequest {
                namespace: &namespace,
                cursor: cursor.as_ref(),
                limit: MAX_PAGE,
            };
            let page = if locks {
                operations.list_namespace_locks(req).await?
            } else {
                operations.list_namespace_records(req).await?
            };
            for key in page.items {
                seen.entry(key.shown_operation().to_owned())
                    .or_default()
                    .insert(key.op_key().to_owned());
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(seen
            .into_iter()
            .map(|(operation, keys)| OperationState {
                operation,
                keys: keys.len(),
            })
            .collect())
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
