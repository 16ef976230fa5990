//! Completing an idempotency record inside the application's own database transaction, so
//! that the record commits if and only if the body's own writes commit.
//!
//! The runtime claims the key on the store's own connection as usual (the in-flight marker is
//! committed at once, so duplicates see it), runs the body, and then writes the completed
//! record through an [`OutcomeTransaction`]: the application's open transaction, wrapped by the
//! provider whose records live in that database. When the application commits, the record and
//! the body's effects become visible together; when it rolls back (or its process dies before
//! the commit) neither exists, and the marker lapses or is abandoned, so running the body again
//! is exactly right.
//!
//! A store takes part only if it says so ([`IdempotencyStore::transactional_claims`]); the
//! runtime refuses a transactional call on any other store before the body runs.
//!
//! [`IdempotencyStore::transactional_claims`]: crate::IdempotencyStore::transactional_claims

use crate::BoxFuture;
use crate::error::BackendError;
use crate::records::CompleteRequest;
use crate::tokens::OwnerToken;

/// What writing an outcome inside a transaction found, as the transaction sees the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransactionalCompletion {
    /// The owner's marker (live, or lapsed but not taken over) is now the completed record
    /// *in this transaction*: it becomes visible, with the body's effects, when the transaction
    /// commits, and is gone if it rolls back (the marker is then in flight again, and lapses).
    /// Also the answer when this owner's completion was already written in this transaction.
    Written,
    /// Another owner's marker or completed record is at the key: this call's marker lapsed
    /// during the body and another caller claimed the key. Nothing was written, and the
    /// transaction can no longer commit.
    Superseded {
        /// The owner found at the key, when the backend records it.
        other: Option<OwnerToken>,
        /// Whether that other caller has already completed.
        completed: bool,
    },
    /// No record at all is at the key as this transaction sees it: the marker was purged or
    /// reaped during the body, or the transaction belongs to another database than the store
    /// that took the claim, or (under `REPEATABLE READ` or `SERIALIZABLE`) its snapshot was taken
    /// before the claim. Nothing was written, and the transaction can no longer commit.
    MarkerMissing,
}

impl TransactionalCompletion {
    /// True when the completed record was written in the transaction.
    pub fn is_written(self) -> bool {
        matches!(self, TransactionalCompletion::Written)
    }
}

/// An open transaction of the application, in the database where a provider keeps its
/// idempotency records, able to write a completed record as part of that transaction.
///
/// Implemented by a provider for its own wrapper around the application's transaction (the
/// PostgreSQL provider wraps `tokio_postgres::Transaction`). The orphan rule keeps a provider
/// crate from implementing this trait for a driver's transaction type directly (both the trait
/// and the type are foreign to it), which is why a wrapper exists: the application opens its
/// transaction with its driver as usual, wraps it, does its own writes through the wrapper (or
/// through the driver's transaction it derefs to), and commits through the wrapper.
///
/// # Contract
/// * [`complete_in_transaction`](Self::complete_in_transaction) writes `req.payload` as the
///   completed record of `req.key` **inside this transaction**, and only while `req.owner` is
///   the owner of the marker there, live or lapsed: the owner check is made inside the
///   transaction, and holds until it ends (in SQL: the update that completes the marker locks
///   its row, so nobody can take the key over between the check and the commit). It never
///   creates a record where none is ([`TransactionalCompletion::MarkerMissing`]): a completion
///   without its claim would hide a pairing mistake (a transaction of another database) and
///   buys nothing, since a rolled-back body costs only a rerun.
/// * When the owner check fails ([`Superseded`](TransactionalCompletion::Superseded),
///   [`MarkerMissing`](TransactionalCompletion::MarkerMissing)) or the method returns `Err`,
///   the implementation has already made the transaction **unable to commit** (in SQL: raise
///   an error inside it, so that `COMMIT` becomes `ROLLBACK`; and the wrapper's own `commit`
///   then reports an error instead of success). The body's effects can therefore never commit
///   beside another owner's run, or without their record.
/// * [`set_rollback_only`](Self::set_rollback_only) makes the transaction unable to commit,
///   for reasons the runtime found itself (the outcome cannot be encoded).
/// * A transaction that rolls back after a completion was written leaves the marker in flight
///   until its lease lapses (a transactional marker that lapses counts as absent, see
///   [`ClaimRequest::transactional`]). An implementation should abandon, owner-checked and on
///   the store's own connection, the markers it wrote completions for when its transaction
///   rolls back or is dropped, so a retry runs at once rather than after the lease.
///
/// What each failure leaves (for the caller, a duplicate and the database) is tabled in the
/// documentation of `coord_core::handle::TransactionRun` and in RELIABILITY.md.
///
/// What is not promised: that the application commits. A completion written here is a
/// record only once the application's `COMMIT` succeeds; a commit whose reply is lost leaves
/// the application unsure, but the database consistent (the record and the effects, or
/// neither), and a duplicate sees whichever it is.
///
/// [`ClaimRequest::transactional`]: crate::ClaimRequest::transactional
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transaction coord can write an idempotency record in",
    label = "`transaction = ..` must name a `&mut` reference to an `OutcomeTransaction`",
    note = "wrap the driver's transaction in the provider's transaction type (for PostgreSQL, `coord_postgres::Transaction`), which implements `coord_core::provider::OutcomeTransaction`; a driver's own transaction type cannot implement it"
)]
pub trait OutcomeTransaction: Send {
    /// Writes the completed record of `req.key` in this transaction, owner-checked (see the
    /// contract above). `req.fingerprint` is the claim's, for an implementation that stores it
    /// again; `req.retention` counts from the write (the commit follows within the body's
    /// transaction).
    fn complete_in_transaction<'a>(
        &'a mut self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>>;

    /// Makes this transaction unable to commit, saying why (the reason may be shown in the
    /// database's error and the wrapper's commit error). An `Err` means the transaction could
    /// not be reached (its connection broke), which leaves it unable to commit too.
    fn set_rollback_only<'a>(
        &'a mut self,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>>;
}

impl<T: OutcomeTransaction + ?Sized> OutcomeTransaction for &mut T {
    fn complete_in_transaction<'a>(
        &'a mut self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>> {
        (**self).complete_in_transaction(req)
    }

    fn set_rollback_only<'a>(
        &'a mut self,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        (**self).set_rollback_only(reason)
    }
}
