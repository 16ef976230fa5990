//! A transaction double for `#[idempotent(transaction = ..)]` and
//! `Idempotent::claim_in_transaction`, over the coordinator's own provider (the in-process one
//! in these tests): the body's writes and the completed record are buffered until an explicit
//! [`BufferedTransaction::commit`], and dropped on rollback, as a database transaction would.
//!
//! It keeps the promises of `OutcomeTransaction` the way a database does: the owner check is
//! made when the completion is written (and again at commit, standing in for the row lock a
//! database holds until then), a failed check makes the transaction rollback-only, and a
//! rollback-only transaction refuses to commit. Its [`rollback`](BufferedTransaction::rollback)
//! abandons the markers it wrote completions for, as a provider's transaction should; dropping
//! it without either stands for a process killed before its commit: the marker is left to
//! lapse.

use std::sync::{Arc, Mutex};

use coord_core::provider::{
    BackendError, BackendErrorKind, BoxFuture, CompleteOutcome, CompleteRequest,
    OutcomeTransaction, OwnerToken, RecordStatus, TransactionalCompletion,
};
use coord_core::{CallKey, Coordinator};

/// The "database" the body writes to: rows become visible here only when a transaction
/// commits.
#[derive(Debug, Clone, Default)]
pub struct Database {
    rows: Arc<Mutex<Vec<String>>>,
}

impl Database {
    /// The committed rows, in commit order.
    pub fn rows(&self) -> Vec<String> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One completion written in the transaction, applied at commit.
#[derive(Debug)]
struct Pending {
    key: CallKey,
    owner: OwnerToken,
    payload: Arc<[u8]>,
    retention: std::time::Duration,
}

/// What a failed `commit` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitError {
    /// The transaction was made rollback-only, for this reason: nothing was committed.
    RollbackOnly(String),
    /// A completion's marker was no longer its owner's at commit: nothing was committed.
    OwnerLost(CallKey),
}

/// An open transaction over `coordinator`'s provider; see the module documentation.
pub struct BufferedTransaction {
    coordinator: Coordinator,
    database: Database,
    writes: Vec<String>,
    pending: Vec<Pending>,
    rollback_only: Option<String>,
    /// Every call coord made on this transaction (`complete_in_transaction`,
    /// `set_rollback_only`), in order.
    calls: Arc<Mutex<Vec<&'static str>>>,
    /// Answer `complete_in_transaction` with this backend fault instead of writing.
    fail_writes: Option<BackendErrorKind>,
}

impl std::fmt::Debug for BufferedTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferedTransaction")
            .field("writes", &self.writes)
            .field("pending", &self.pending)
            .field("rollback_only", &self.rollback_only)
            .finish()
    }
}

impl BufferedTransaction {
    /// Begins a transaction writing to `database`, whose completions go to `coordinator`'s
    /// idempotency store at commit.
    pub fn begin(coordinator: &Coordinator, database: &Database) -> BufferedTransaction {
        BufferedTransaction {
            coordinator: coordinator.clone(),
            database: database.clone(),
            writes: Vec::new(),
            pending: Vec::new(),
            rollback_only: None,
            calls: Arc::default(),
            fail_writes: None,
        }
    }

    /// A transaction whose completion writes fail with a backend fault of `kind` (the
    /// transaction then becomes rollback-only, as the contract asks).
    pub fn failing_writes(mut self, kind: BackendErrorKind) -> BufferedTransaction {
        self.fail_writes = Some(kind);
        self
    }

    /// The body's own write: visible in the database only after a commit.
    pub fn write(&mut self, row: impl Into<String>) {
        self.writes.push(row.into());
    }

    /// Why the transaction cannot commit, once it cannot.
    pub fn rollback_only(&self) -> Option<&str> {
        self.rollback_only.as_deref()
    }

    /// How many completions were written in this transaction.
    pub fn completions(&self) -> usize {
        self.pending.len()
    }

    /// Every call coord made on this transaction, in order: `"complete"`, `"rollback_only"`.
    pub fn calls(&self) -> Vec<&'static str> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Commits: the completions become records (each owner-checked once more) and the writes
    /// become rows, all or nothing. A rollback-only transaction commits nothing.
    pub async fn commit(self) -> Result<(), CommitError> {
        if let Some(reason) = &self.rollback_only {
            return Err(CommitError::RollbackOnly(reason.clone()));
        }
        let operations = self.coordinator.operations();
        for pending in &self.pending {
            let info = operations
                .inspect_record(&pending.key)
                .await
                .expect("the in-process provider answers");
            let ours = info.is_some_and(|info| {
                info.status == RecordStatus::InFlight && info.owner == Some(pending.owner)
            });
            if !ours {
                return Err(CommitError::OwnerLost(pending.key.clone()));
            }
        }
        let store = self.coordinator.idempotency_store();
        for pending in &self.pending {
            let outcome = store
                .complete(CompleteRequest {
                    key: &pending.key,
                    owner: pending.owner,
                    payload: pending.payload.clone(),
                    retention: pending.retention,
                    fingerprint: None,
                })
                .await
                .expect("the in-process provider answers");
            assert_eq!(
                outcome,
                CompleteOutcome::Stored,
                "checked just before, in the same task"
            );
        }
        self.database
            .rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(self.writes);
        Ok(())
    }

    /// Rolls back: nothing is written, and the markers whose completions were written here
    /// are abandoned (owner-checked), so a retry runs at once.
    pub async fn rollback(self) {
        let store = self.coordinator.idempotency_store();
        for pending in &self.pending {
            let _ = store.abandon(&pending.key, pending.owner).await;
        }
    }

    fn note(&self, call: &'static str) {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
    }
}

impl OutcomeTransaction for BufferedTransaction {
    fn complete_in_transaction<'a>(
        &'a mut self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>> {
        Box::pin(async move {
            self.note("complete");
            if let Some(kind) = self.fail_writes {
                self.rollback_only = Some("the completion write failed".to_owned());
                return Err(BackendError::new(
                    kind,
                    "the test transaction's write failed",
                ));
            }
            let info = self
                .coordinator
                .operations()
                .inspect_record(req.key)
                .await?;
            let answer = match info {
                Some(info)
                    if info.status == RecordStatus::InFlight && info.owner == Some(req.owner) =>
                {
                    self.pending.push(Pending {
                        key: req.key.clone(),
                        owner: req.owner,
                        payload: req.payload,
                        retention: req.retention,
                    });
                    return Ok(TransactionalCompletion::Written);
                }
                Some(info) => TransactionalCompletion::Superseded {
                    other: info.owner,
                    completed: info.status == RecordStatus::Completed,
                },
                None => TransactionalCompletion::MarkerMissing,
            };
            self.rollback_only = Some(format!("the owner check failed: {answer:?}"));
            Ok(answer)
        })
    }

    fn set_rollback_only<'a>(
        &'a mut self,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.note("rollback_only");
            self.rollback_only = Some(reason.to_owned());
            Ok(())
        })
    }
}
