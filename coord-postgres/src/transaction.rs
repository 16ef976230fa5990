//! The application's own transaction, wrapped so that `#[idempotent(transaction = "tx")]` and
//! `Idempotent::claim_in_transaction` can write the completed record inside it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use coord_core::provider::{
    BackendErrorKind, BoxFuture, CompleteRequest, IdempotencyStore, OutcomeTransaction, OwnerToken,
    TransactionalCompletion,
};
use coord_core::{BackendError, CallKey};

use crate::errors::backend_error;
use crate::provider::{MAX_KEY_BYTES, PostgresProvider, from_ms, millis, owner_of, uuid_of};
use crate::sql::rollback_only_statement;

/// The longest the wrapper keeps trying, in the background, to abandon a marker whose
/// completion it wrote in a transaction that did not commit, when the marker's own lease is
/// shorter (the lease has then cleaned up anyway).
const ABANDON_AT_LEAST: Duration = Duration::from_secs(2);

/// An open transaction of the application, on the database where a [`PostgresProvider`] keeps
/// its idempotency records, in which `#[idempotent(transaction = "tx")]` (and
/// `Idempotent::claim_in_transaction`) write the completed record, so that the record commits
/// if and only if the body's own writes commit.
///
/// Open it with [`PostgresProvider::begin`] (on a `tokio_postgres::Client`, or a
/// `deadpool_postgres` pooled client, which derefs to one), or wrap a transaction opened
/// yourself with [`Transaction::new`] (for instance with an isolation level chosen through
/// `build_transaction`). Do the body's writes through it: it derefs to the
/// `tokio_postgres::Transaction`. End it with [`commit`](Transaction::commit) or
/// [`rollback`](Transaction::rollback) of this wrapper; dropping it rolls back.
///
/// ```no_run
/// use coord_core::{CoordError, idempotent};
/// use coord_postgres::{PostgresProvider, Transaction};
///
/// #[derive(Debug)]
/// enum ChargeError {
///     Db(tokio_postgres::Error),
///     Coord(CoordError),
/// }
/// impl From<tokio_postgres::Error> for ChargeError {
///     fn from(err: tokio_postgres::Error) -> Self { ChargeError::Db(err) }
/// }
/// impl From<CoordError> for ChargeError {
///     fn from(err: CoordError) -> Self { ChargeError::Coord(err) }
/// }
///
/// #[idempotent(key_from = "order", transaction = "tx")]
/// async fn charge(tx: &mut Transaction<'_>, order: &str, cents: i64) -> Result<i64, ChargeError> {
///     let row = tx
///         .query_one(
///             "INSERT INTO charges (order_id, cents) VALUES ($1, $2) RETURNING id",
///             &[&order, &cents],
///         )
///         .await?;
///     Ok(row.get(0))
/// }
///
/// # async fn run(provider: PostgresProvider, client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = provider.begin(client).await?;
/// match charge(&mut tx, "o-1", 1_999).await {
///     // The charge and its idempotency record commit together (or neither does).
///     Ok(id) => { tx.commit().await?; println!("charged: {id}"); }
///     Err(err) => { tx.rollback().await?; println!("not charged: {err:?}"); }
/// }
/// # Ok(())
/// # }
/// ```
///
/// # What it promises
/// * The completion is one statement in this transaction: an owner-checked `UPDATE` of the
///   key's marker row (`FOR UPDATE`), made only while the claim's owner is at the key, its
///   marker live or lapsed but not taken over. The row stays locked until the transaction
///   ends, so nobody can take the key over between the check and the commit. It never inserts
///   a record: with no marker at the key (purged, or this transaction belongs to another
///   database) nothing is written. Waiters are notified when the transaction commits.
/// * When that check fails, or the statement fails, or coord asks for it
///   ([`OutcomeTransaction::set_rollback_only`]), an error is raised inside the transaction:
///   the server will only roll it back, and [`commit`](Transaction::commit) rolls back and
///   answers [`TransactionError::RollbackOnly`]. The body's writes therefore never commit
///   without their record, or beside another caller's run.
/// * [`commit`](Transaction::commit) answers `Ok` only when PostgreSQL committed.
/// * When the transaction does not commit ([`rollback`](Transaction::rollback), a failed
///   commit, drop), the markers it completed are abandoned on the provider's own connection,
///   owner-checked (a marker already completed by a commit is left alone), so a retry runs at
///   once rather than after the marker's lease: awaited by `rollback`, in the background
///   (retried until the marker's lease would have ended) on drop or a failed commit.
/// * While this transaction holds a marker's row, a duplicate's claim does not wait for it:
///   it is answered in flight (and a duplicate with `wait` looks again every few tens of
///   milliseconds, and is woken by the commit's notification).
///
/// # What it does not promise
/// * That the application commits: until `COMMIT` succeeds there is no record. A commit whose
///   reply is lost leaves the caller unsure, but the database consistent (the writes and the
///   record, or neither), and a duplicate sees whichever it is.
/// * Anything about writes made outside this transaction (on other connections).
/// * Under `REPEATABLE READ` or `SERIALIZABLE`, a transaction whose snapshot was taken before
///   the claim (a statement ran in it before the call) does not see the marker: the completion
///   finds it missing, and the transaction can only roll back. Make the call before the
///   transaction's first statement, or use `READ COMMITTED`, PostgreSQL's default.
pub struct Transaction<'c> {
    inner: Option<tokio_postgres::Transaction<'c>>,
    provider: PostgresProvider,
    /// Markers whose completion this transaction wrote, with how long their lease had left.
    completed: Vec<(CallKey, OwnerToken, Duration)>,
    /// Why this transaction can no longer commit.
    poisoned: Option<String>,
}

/// Why [`Transaction::commit`] did not commit.
#[derive(Debug)]
#[non_exhaustive]
pub enum TransactionError {
    /// The transaction was made unable to commit (an idempotency record could not be written
    /// in it, or coord asked for it): it was rolled back.
    RollbackOnly {
        /// Why.
        reason: String,
    },
    /// PostgreSQL refused the statement (a failed statement earlier in the transaction, a
    /// deferred constraint, a serialization failure), or the connection broke. When the
    /// connection broke during `COMMIT`, the transaction may have committed: the writes and
    /// their records, or neither.
    Database(tokio_postgres::Error),
}

impl fmt::Display for TransactionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransactionError::RollbackOnly { reason } => write!(
                f,
                "the transaction could not commit and was rolled back: {reason}"
            ),
            TransactionError::Database(err) => write!(f, "the transaction did not commit: {err}"),
        }
    }
}

impl std::error::Error for TransactionError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransactionError::RollbackOnly { .. } => None,
            TransactionError::Database(err) => Some(err),
        }
    }
}

impl From<tokio_postgres::Error> for TransactionError {
    fn from(err: tokio_postgres::Error) -> Self {
        TransactionError::Database(err)
    }
}

impl From<TransactionError> for coord_core::CoordError {
    fn from(err: TransactionError) -> Self {
        let kind = match &err {
            TransactionError::RollbackOnly { .. } => BackendErrorKind::Protocol,
            TransactionError::Database(db) => crate::errors::kind_of(db),
        };
        coord_core::CoordError::Backend(BackendError::new(kind, err.to_string()))
    }
}

impl PostgresProvider {
    /// Begins a transaction on `client` (the application's connection to the database where
    /// this provider keeps its records; a `deadpool_postgres` pooled client derefs to one),
    /// wrapped so that idempotent calls can write their records in it. See [`Transaction`].
    pub async fn begin<'c>(
        &self,
        client: &'c mut tokio_postgres::Client,
    ) -> Result<Transaction<'c>, tokio_postgres::Error> {
        Ok(Transaction::new(self, client.transaction().await?))
    }
}

impl<'c> Transaction<'c> {
    /// Wraps a transaction the application opened on the database where `provider` keeps its
    /// records. Nothing is sent.
    pub fn new(provider: &PostgresProvider, transaction: tokio_postgres::Transaction<'c>) -> Self {
        Transaction {
            inner: Some(transaction),
            provider: provider.clone(),
            completed: Vec::new(),
            poisoned: None,
        }
    }

    /// Why this transaction can no longer commit, once it cannot.
    pub fn rollback_only_reason(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// How many idempotency records were written in this transaction.
    pub fn records_written(&self) -> usize {
        self.completed.len()
    }

    fn tx(&self) -> &tokio_postgres::Transaction<'c> {
        self.inner
            .as_ref()
            .expect("a Transaction is usable until commit or rollback consumes it")
    }

    /// Commits. `Ok` only when PostgreSQL committed: a transaction made unable to commit is
    /// rolled back and answers [`TransactionError::RollbackOnly`]; one in which a statement
    /// failed answers that error ([`TransactionError::Database`]), as does a failed `COMMIT`.
    /// Whenever it did not commit, the markers completed in it are abandoned (in the
    /// background), so a retry runs at once.
    pub async fn commit(mut self) -> Result<(), TransactionError> {
        let tx = self.inner.take().expect("not yet consumed");
        if let Some(reason) = self.poisoned.clone() {
            let rolled_back = tx.rollback().await;
            self.abandon_completed_detached();
            if let Err(err) = rolled_back {
                tracing::debug!(error = %err, "coord-postgres: rolling back a rollback-only transaction failed (the server rolls it back when the connection ends)");
            }
            return Err(TransactionError::RollbackOnly { reason });
        }
        // A transaction in which a statement failed answers `COMMIT` with a rollback, not an
        // error: ask it first whether it still can commit.
        if let Err(err) = tx.batch_execute("SELECT 1").await {
            let _ = tx.rollback().await;
            self.abandon_completed_detached();
            return Err(TransactionError::Database(err));
        }
        match tx.commit().await {
            Ok(()) => {
                self.completed.clear();
                Ok(())
            }
            Err(err) => {
                // Committed or not, an owner-checked abandon of an in-flight marker is right:
                // a committed record is not in flight.
                self.abandon_completed_detached();
                Err(TransactionError::Database(err))
            }
        }
    }

    /// Rolls back, then abandons (owner-checked, on the provider's own connection) the markers
    /// whose completion was written in this transaction, so a retry runs at once. An error is
    /// the rollback's (the server rolls the transaction back anyway when the connection ends);
    /// an abandon that fails is retried in the background.
    pub async fn rollback(mut self) -> Result<(), tokio_postgres::Error> {
        let tx = self.inner.take().expect("not yet consumed");
        let rolled_back = tx.rollback().await;
        for (key, owner, left) in std::mem::take(&mut self.completed) {
            if let Err(err) = self.provider.abandon(&key, owner).await {
                tracing::debug!(key = %key, error = %err, "coord-postgres: abandoning a marker after a rollback failed; retrying in the background");
                Arc::new(self.provider.clone()).abandon_detached(
                    key,
                    owner,
                    left.max(ABANDON_AT_LEAST),
                );
            }
        }
        rolled_back
    }

    /// Abandons every marker completed in this transaction, in the background: each attempt
    /// fails without waiting while the transaction's rollback has not reached the server yet,
    /// and is tried again.
    fn abandon_completed_detached(&mut self) {
        for (key, owner, left) in std::mem::take(&mut self.completed) {
            Arc::new(self.provider.clone()).abandon_detached(
                key,
                owner,
                left.max(ABANDON_AT_LEAST),
            );
        }
    }

    /// Raises an error inside the transaction, so it can no longer commit; remembers why.
    /// `Ok` when the server reported the error (or the transaction had already failed).
    async fn poison(&mut self, reason: String) -> Result<(), BackendError> {
        let statement = rollback_only_statement(&reason);
        if self.poisoned.is_none() {
            self.poisoned = Some(reason);
        }
        let address = self.provider.address().to_owned();
        match self.tx().batch_execute(&statement).await {
            Ok(()) => Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "marking the transaction rollback-only at {address}: the server did not raise the error"
                ),
            )),
            // The raised error, or "current transaction is aborted": either way it cannot commit.
            Err(err) if err.as_db_error().is_some() => Ok(()),
            Err(err) => Err(backend_error(
                &err,
                "marking the transaction rollback-only",
                &address,
            )),
        }
    }

    async fn complete(
        &mut self,
        req: CompleteRequest<'_>,
    ) -> Result<TransactionalCompletion, BackendError> {
        let key = req.key;
        if let Some(reason) = &self.poisoned {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                format!(
                    "complete in transaction: the transaction is already rollback-only ({reason})"
                ),
            )
            .with_key(key));
        }
        if key.qualified().len() > MAX_KEY_BYTES {
            let _ = self.poison("the key is too long to store".into()).await;
            return Err(BackendError::new(
                BackendErrorKind::Config,
                format!(
                    "complete in transaction: the key is {} bytes long; coord-postgres stores keys of at most {MAX_KEY_BYTES} bytes",
                    key.qualified().len()
                ),
            )
            .with_key(key));
        }
        let owner = uuid_of(req.owner);
        let payload: &[u8] = &req.payload;
        let retention = millis(req.retention);
        let (sql, channel, wake) = self.provider.transactional_completion(key);
        let address = self.provider.address().to_owned();
        let timeout = self.provider.command_timeout();
        let sent = tokio::time::timeout(
            timeout,
            self.tx().query(
                sql,
                &[
                    &key.qualified(),
                    &owner,
                    &payload,
                    &retention,
                    &channel,
                    &wake,
                ],
            ),
        )
        .await;
        let rows = match sent {
            Ok(Ok(rows)) => rows,
            Ok(Err(err)) => {
                let failed = backend_error(&err, "complete in transaction", &address).with_key(key);
                let _ = self
                    .poison(format!("writing the idempotency record failed: {failed}"))
                    .await;
                return Err(failed);
            }
            Err(_) => {
                let failed = BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("complete in transaction at {address}: no answer within {timeout:?}"),
                )
                .with_key(key);
                let _ = self
                    .poison(format!("writing the idempotency record failed: {failed}"))
                    .await;
                return Err(failed);
            }
        };
        let protocol = |detail: String| {
            BackendError::new(
                BackendErrorKind::Protocol,
                format!("complete in transaction at {address}: {detail}"),
            )
            .with_key(key)
        };
        let parsed = match rows.as_slice() {
            [row] => (|| {
                let stored: i64 = row.try_get(0)?;
                let state: Option<String> = row.try_get(1)?;
                let found: Option<uuid::Uuid> = row.try_get(2)?;
                let left: Option<i64> = row.try_get(3)?;
                Ok::<_, tokio_postgres::Error>((stored, state, found, left))
            })()
            .map_err(|e| protocol(format!("unexpected answer ({e})"))),
            rows => Err(protocol(format!("{} rows instead of one", rows.len()))),
        };
        let (stored, state, found, left) = match parsed {
            Ok(parsed) => parsed,
            Err(err) => {
                let _ = self.poison(format!("{err}")).await;
                return Err(err);
            }
        };
        if stored == 1 {
            self.completed
                .push((key.clone(), req.owner, from_ms(left.unwrap_or(0))));
            return Ok(TransactionalCompletion::Written);
        }
        let answer = match (state.as_deref(), found) {
            (None, _) => TransactionalCompletion::MarkerMissing,
            // This owner's completion, already written in this transaction.
            (Some("completed"), Some(found)) if found == owner => {
                return Ok(TransactionalCompletion::Written);
            }
            (Some(state), found) => TransactionalCompletion::Superseded {
                other: found.map(owner_of),
                completed: state == "completed",
            },
        };
        let reason = match answer {
            TransactionalCompletion::MarkerMissing => format!(
                "the in-flight marker of {key} is not in the database as this transaction sees it"
            ),
            _ => {
                format!("the in-flight marker of {key} lapsed and another caller took the key over")
            }
        };
        self.poison(reason).await.map_err(|e| e.with_key(key))?;
        Ok(answer)
    }
}

impl<'c> Deref for Transaction<'c> {
    type Target = tokio_postgres::Transaction<'c>;

    fn deref(&self) -> &Self::Target {
        self.tx()
    }
}

impl DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.inner
            .as_mut()
            .expect("a Transaction is usable until commit or rollback consumes it")
    }
}

impl Drop for Transaction<'_> {
    /// Dropped without `commit` or `rollback`: the driver rolls the transaction back, and the
    /// markers completed in it are abandoned in the background (each attempt fails at once
    /// while the rollback has not reached the server, and is tried again).
    fn drop(&mut self) {
        if self.inner.is_some() && !self.completed.is_empty() {
            if tokio::runtime::Handle::try_current().is_ok() {
                self.abandon_completed_detached();
            } else {
                tracing::warn!(
                    "coord-postgres: a Transaction was dropped outside a tokio runtime; the markers completed in it lapse at the end of their lease"
                );
            }
        }
    }
}

impl fmt::Debug for Transaction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transaction")
            .field("address", &self.provider.address())
            .field("records_written", &self.completed.len())
            .field("rollback_only", &self.poisoned)
            .finish()
    }
}

impl OutcomeTransaction for Transaction<'_> {
    fn complete_in_transaction<'a>(
        &'a mut self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<TransactionalCompletion, BackendError>> {
        Box::pin(self.complete(req))
    }

    fn set_rollback_only<'a>(
        &'a mut self,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.poison(reason.to_owned()))
    }
}
