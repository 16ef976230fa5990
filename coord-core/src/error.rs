//! The errors coord returns to callers. (The error a provider reports for a backend fault,
//! [`BackendError`], is part of the contract.)

use std::fmt;
use std::time::Duration;

use crate::provider::{BackendError, BackendErrorKind, CallKey, Capability, LossCause, OwnerToken};

/// Why an intercepted call did not run its body, or why its outcome cannot be trusted.
///
/// Functions under `#[idempotent]` or `#[distributed_lock]` return `Result<T, E>` with
/// `E: From<CoordError>`; coord hands these errors to the caller through that conversion.
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a fallback arm.
///
/// Every variant that concerns one call carries the call's [`CallKey`] (shown as
/// `operation:parts`), so a log line names the work that was refused.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum CoordError {
    /// The lock was held by someone else for the whole `wait`; the body did not run.
    LockNotAcquired {
        /// The call's key.
        key: CallKey,
        /// How long the call waited before giving up (zero for a single attempt).
        waited: Duration,
    },
    /// This task already holds the lock it asked for. Locks are not reentrant: waiting would
    /// only wait for ourselves, so the call fails at once instead. The body did not run.
    Reentrant {
        /// The call's key.
        key: CallKey,
    },
    /// This task holds the read-write lock `key` for reading and asked for it for writing.
    /// Read-write locks cannot be upgraded: waiting would wait for this task's own read hold
    /// (and two tasks upgrading would wait for each other), so the call fails at once. Take
    /// the write lock from the start instead. The body did not run; the read hold is kept.
    LockUpgrade {
        /// The call's key.
        key: CallKey,
    },
    /// Another call with the same idempotency key is still running and did not finish within
    /// `wait`. Nothing ran; retrying later is safe.
    InFlight {
        /// The call's key.
        key: CallKey,
    },
    /// The idempotency key was used before with different fingerprinted parameters. The stored
    /// outcome belongs to that other request, so it is neither replayed nor overwritten.
    KeyReused {
        /// The call's key.
        key: CallKey,
    },
    /// The lease of a held lock (or of an in-flight marker) was lost while the body ran, and
    /// the body was stopped.
    LockLost {
        /// The call's key.
        key: CallKey,
        /// How long the lock had been held when the loss was noticed.
        held_for: Duration,
        /// Why the hold was lost.
        cause: LossCause,
    },
    /// The body of an `#[idempotent]` call **ran**, and its `Ok` outcome could not be stored
    /// (after retrying for as long as the in-flight marker was ours). The side effects happened,
    /// and a duplicate may not be able to replay them. What a duplicate gets is decided by
    /// `on_abandoned`: `"fail"` answers `OutcomeUnknown` until an operator purges the record,
    /// `"rerun"` runs the body again once the marker's lease ends. One exception, always in the
    /// duplicate's favour: a completion whose reply was lost may still land afterwards (it sat
    /// in a frozen server), and then the duplicate replays this very outcome. Not retryable:
    /// retrying blindly may repeat the side effects.
    OutcomeNotStored {
        /// The call's key.
        key: CallKey,
        /// Why the outcome is not stored.
        cause: NotStoredCause,
    },
    /// A key part of an `#[idempotent]` call was absent (`None`): without a key there is no
    /// record to share, so the call is refused before the body runs rather than sharing one
    /// record with every other keyless call. (`on_missing_key = "run_unprotected"` runs such
    /// calls without the idempotency layer instead.)
    MissingKey {
        /// The operation.
        op: String,
        /// The parameter path (`key_from`) that was `None`, when known.
        part: Option<String>,
    },
    /// An earlier call with this idempotency key started and never finished (its in-flight
    /// lease expired), and the operation is configured `on_abandoned = "fail"`: whether its side
    /// effects happened is unknown, so nothing runs until an operator resolves the record.
    OutcomeUnknown {
        /// The call's key.
        key: CallKey,
    },
    /// A stored outcome could not be encoded or decoded with the coordinator's codec.
    Codec {
        /// The call's key.
        key: CallKey,
        /// What the codec reported.
        message: String,
    },
    /// The coordinator is shutting down ([`Coordinator::shutdown`](crate::Coordinator::shutdown)):
    /// no new lock or idempotency claim is taken, and the body did not run. Retryable on
    /// another instance.
    ShutDown {
        /// The call's key.
        key: CallKey,
    },
    /// The coordination backend failed (unreachable, timed out, or answered with something coord
    /// cannot read) and the operation is configured `fail_closed`: the body did not run.
    Backend(BackendError),
    /// The call names a profile (`profile = ".."` on an attribute, `.profile(..)` on a handle)
    /// that the coordinator's configuration does not have. Reported at the call, before any
    /// claim, lock or body; never replaced by a default. Not retryable: fix the configuration
    /// (a `[profiles.<name>]` table, or `COORD_PROFILE_<NAME>_*` variables) or the name.
    UnknownProfile {
        /// The profile name the call asked for.
        profile: String,
        /// The call's key.
        key: CallKey,
    },
    /// `#[single_flight(scope = "cluster")]`: the leader of the flight, on another instance (or
    /// another coordinator), returned an `Err` whose type cannot be handed over (it is not
    /// serialisable). This caller's body did not run; the leader's error is in the leader's
    /// logs, not here. Whether a retry helps depends on that error, which coord does not know,
    /// so it is not marked retryable.
    LeaderFailed {
        /// The call's key.
        key: CallKey,
    },
    /// `#[idempotent(transaction = ..)]` (or `Idempotent::claim_in_transaction`): the body
    /// returned `Ok`, and its outcome could **not** be written in the caller's transaction,
    /// which is now unable to commit. Roll it back: nothing of it commits, the body's effects
    /// included (the provider's transaction makes a `COMMIT` fail or turn into a rollback).
    /// Retrying the whole transaction is safe when [`is_retryable`](CoordError::is_retryable)
    /// says so: it replays the other caller's outcome, waits for it, or runs again.
    TransactionRollbackOnly {
        /// The call's key.
        key: CallKey,
        /// Why the outcome could not be written.
        cause: RollbackCause,
    },
    /// The call needs a capability this coordinator's provider does not have (a semaphore,
    /// `permits = n`, on a provider without [`Capability::Semaphores`]; `replica_acks` asking
    /// for replicas on a provider without [`Capability::ReplicaAcks`], such as the in-process
    /// one or PostgreSQL). Refused before the provider is asked anything and whatever the
    /// backend-fault policy: the body did not run. Check at start-up with
    /// `CoordinatorBuilder::require`.
    Unsupported {
        /// What the provider lacks.
        capability: Capability,
        /// The call's key.
        key: CallKey,
    },
}

impl CoordError {
    /// The key of the call this error concerns, when it concerns one call. It displays as
    /// `operation:parts`, the form [`Coordinator::purge_record`](crate::Coordinator::purge_record)
    /// and [`CallKey::from_op_key`] accept.
    pub fn key(&self) -> Option<&CallKey> {
        match self {
            CoordError::LockNotAcquired { key, .. }
            | CoordError::Reentrant { key }
            | CoordError::LockUpgrade { key }
            | CoordError::InFlight { key }
            | CoordError::KeyReused { key }
            | CoordError::LockLost { key, .. }
            | CoordError::OutcomeUnknown { key }
            | CoordError::ShutDown { key }
            | CoordError::OutcomeNotStored { key, .. }
            | CoordError::Codec { key, .. }
            | CoordError::UnknownProfile { key, .. }
            | CoordError::LeaderFailed { key }
            | CoordError::Unsupported { key, .. }
            | CoordError::TransactionRollbackOnly { key, .. } => Some(key),
            CoordError::MissingKey { .. } => None,
            CoordError::Backend(err) => err.key(),
        }
    }

    /// A short, stable name of the variant (`lock_not_acquired`, `in_flight`, ...; a backend
    /// error is `backend.<kind>`), for spans (`error.type`) and logs.
    pub fn kind_str(&self) -> &'static str {
        match self {
            CoordError::LockNotAcquired { .. } => "lock_not_acquired",
            CoordError::Reentrant { .. } => "reentrant",
            CoordError::LockUpgrade { .. } => "lock_upgrade",
            CoordError::InFlight { .. } => "in_flight",
            CoordError::KeyReused { .. } => "key_reused",
            CoordError::LockLost { .. } => "lock_lost",
            CoordError::OutcomeNotStored { .. } => "outcome_not_stored",
            CoordError::MissingKey { .. } => "missing_key",
            CoordError::OutcomeUnknown { .. } => "outcome_unknown",
            CoordError::Codec { .. } => "codec",
            CoordError::ShutDown { .. } => "shut_down",
            CoordError::LeaderFailed { .. } => "leader_failed",
            CoordError::Unsupported { .. } => "unsupported",
            CoordError::TransactionRollbackOnly { .. } => "transaction_rollback_only",
            CoordError::Backend(err) => match err.kind() {
                BackendErrorKind::Unavailable => "backend.unavailable",
                BackendErrorKind::Timeout => "backend.timeout",
                BackendErrorKind::Protocol => "backend.protocol",
                BackendErrorKind::Config => "backend.config",
                BackendErrorKind::Corrupt => "backend.corrupt",
                BackendErrorKind::OutOfMemory => "backend.out_of_memory",
                // A kind added to the contract after this table: still a backend fault.
                _ => "backend",
            },
            CoordError::UnknownProfile { .. } => "unknown_profile",
        }
    }

    /// True when retrying the same call later may succeed without any change: the lock may be
    /// free, the in-flight duplicate may have finished, the backend may be back.
    ///
    /// `OutcomeNotStored` is not retryable (the body ran: a blind retry may repeat its effects),
    /// nor is a backend error of kind [`BackendErrorKind::Corrupt`] or
    /// [`BackendErrorKind::Config`], which need an operator. `TransactionRollbackOnly` is
    /// retryable (in a new transaction, once this one is rolled back) when another caller took
    /// the key over or the backend fault was transient: nothing of the failed run committed.
    pub fn is_retryable(&self) -> bool {
        match self {
            CoordError::LockNotAcquired { .. }
            | CoordError::InFlight { .. }
            | CoordError::LockLost { .. }
            | CoordError::ShutDown { .. } => true,
            CoordError::Backend(err) => err.kind().is_transient(),
            CoordError::TransactionRollbackOnly { cause, .. } => match cause {
                RollbackCause::Superseded { .. } => true,
                RollbackCause::Backend(err) => err.kind().is_transient(),
                RollbackCause::MarkerMissing | RollbackCause::Codec(_) => false,
            },
            _ => false,
        }
    }
}

impl fmt::Display for CoordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoordError::LockNotAcquired { key, waited } => {
                write!(f, "lock `{key}` is held elsewhere (waited {waited:?})")
            }
            CoordError::Reentrant { key } => {
                write!(
                    f,
                    "lock `{key}` is already held by this task; coord locks are not reentrant"
                )
            }
            CoordError::LockUpgrade { key } => write!(
                f,
                "read-write lock `{key}` is held for reading by this task, which asked to write; \
                 read-write locks cannot be upgraded: take the write lock from the start"
            ),
            CoordError::InFlight { key } => write!(
                f,
                "a call with idempotency key `{key}` is still in flight, and this duplicate did \
                 not wait for it (the operation's `wait`, `0s` unless set); nothing ran. Retry \
                 later, or give the operation a `wait` (`wait = \"10s\"`) so a duplicate waits \
                 and replays the outcome"
            ),
            CoordError::KeyReused { key } => write!(
                f,
                "idempotency key `{key}` was already used with different parameters"
            ),
            CoordError::LockLost {
                key,
                held_for,
                cause,
            } => {
                write!(
                    f,
                    "lock `{key}` was lost after {held_for:?} ({cause}); the body was stopped"
                )
            }
            CoordError::OutcomeNotStored { key, cause } => write!(
                f,
                "the call with idempotency key `{key}` ran, but its outcome was not stored: {cause}"
            ),
            CoordError::MissingKey {
                op,
                part: Some(part),
            } => write!(
                f,
                "`{op}` was called without an idempotency key (`{part}` is None); refused before running"
            ),
            CoordError::MissingKey { op, part: None } => write!(
                f,
                "`{op}` was called without an idempotency key (a key part is None); refused before running"
            ),
            CoordError::OutcomeUnknown { key } => write!(
                f,
                "an earlier call with idempotency key `{key}` was abandoned mid-flight; its outcome is unknown"
            ),
            CoordError::Codec { key, message } => {
                write!(
                    f,
                    "stored outcome of `{key}` could not be (de)serialized: {message}"
                )
            }
            CoordError::ShutDown { key } => write!(
                f,
                "`{key}` was refused: the coordinator is shutting down; nothing ran"
            ),
            CoordError::Backend(err) => write!(f, "{err}"),
            CoordError::UnknownProfile { profile, key } => write!(
                f,
                "`{key}` names the profile {profile:?}, which this coordinator was not given, so \
                 nothing ran: give it the profile, as `[profiles.{profile}]` in its \
                 configuration or as `COORD_PROFILE_{}_<FIELD>` variables read by \
                 `coord_redis::coordinator_from_env()` (a coordinator from \
                 `Coordinator::builder()` reads no variables)",
                profile.to_ascii_uppercase()
            ),
            CoordError::LeaderFailed { key } => write!(
                f,
                "the single-flight leader of `{key}` on another instance failed with an error that cannot be handed over; this call did not run"
            ),
            CoordError::TransactionRollbackOnly { key, cause } => write!(
                f,
                "the outcome of `{key}` could not be written in the caller's transaction ({cause}); the transaction cannot commit: roll it back"
            ),
            CoordError::Unsupported {
                capability: Capability::ReplicaAcks,
                key,
            } => write!(
                f,
                "`{key}` asks for replica acknowledgement (`replica_acks`), which this coordinator's provider cannot give (it does not replicate its writes); nothing ran. Remove the setting, or turn it off for this operation (`replica_acks = 0`, `without_replica_acks()`)"
            ),
            CoordError::Unsupported { capability, key } => write!(
                f,
                "`{key}` needs {capability}, which this coordinator's provider does not support; nothing ran"
            ),
        }
    }
}

impl std::error::Error for CoordError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CoordError::Backend(err) => Some(err),
            CoordError::OutcomeNotStored {
                cause: NotStoredCause::Backend(err),
                ..
            } => Some(err),
            CoordError::TransactionRollbackOnly {
                cause: RollbackCause::Backend(err),
                ..
            } => Some(err),
            _ => None,
        }
    }
}

impl From<BackendError> for CoordError {
    fn from(err: BackendError) -> Self {
        CoordError::Backend(err)
    }
}

/// Why the outcome of a call that ran was not stored, in [`CoordError::OutcomeNotStored`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum NotStoredCause {
    /// The backend kept failing until the in-flight marker could no longer be ours.
    Backend(BackendError),
    /// Another caller claimed the key after this call's marker was lost: the body ran twice.
    DoubleRun {
        /// The other owner, when the backend records it.
        other: Option<OwnerToken>,
    },
    /// The outcome cannot be represented by the coordinator's codec (or would not decode back
    /// into its type), so no record of it could be stored.
    Codec(String),
}

impl fmt::Display for NotStoredCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotStoredCause::Backend(err) => write!(f, "{err}"),
            NotStoredCause::DoubleRun { other: Some(other) } => write!(
                f,
                "another caller (owner {other}) claimed the key after this call's marker was lost: the body ran twice"
            ),
            NotStoredCause::DoubleRun { other: None } => f.write_str(
                "another caller claimed the key after this call's marker was lost: the body ran twice",
            ),
            NotStoredCause::Codec(message) => {
                write!(f, "the outcome cannot be encoded for storage: {message}")
            }
        }
    }
}

/// Why the outcome of a transactional call was not written in the caller's transaction, in
/// [`CoordError::TransactionRollbackOnly`]. In every case the transaction can no longer commit.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RollbackCause {
    /// The in-flight marker lapsed while the body ran and another caller claimed the key: its
    /// run is the one that counts, and this one must not commit beside it.
    Superseded {
        /// The other owner, when the backend records it.
        other: Option<OwnerToken>,
        /// Whether that other caller had already completed.
        completed: bool,
    },
    /// The transaction saw no record at the key: the marker was purged or reaped while the
    /// body ran, the transaction belongs to another database than the coordinator's provider,
    /// or (under `REPEATABLE READ` or `SERIALIZABLE`) its snapshot was taken before the claim.
    MarkerMissing,
    /// Writing in the transaction failed (which leaves it unable to commit).
    Backend(BackendError),
    /// The outcome cannot be represented by the coordinator's codec (or would not decode back
    /// into its type); the transaction was marked rollback-only by coord.
    Codec(String),
}

impl fmt::Display for RollbackCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RollbackCause::Superseded {
                other: Some(other), ..
            } => write!(
                f,
                "the in-flight marker lapsed during the body and another caller (owner {other}) claimed the key"
            ),
            RollbackCause::Superseded { other: None, .. } => f.write_str(
                "the in-flight marker lapsed during the body and another caller claimed the key",
            ),
            RollbackCause::MarkerMissing => f.write_str(
                "the transaction sees no in-flight marker at the key (purged or reaped during the body, a transaction of another database than the coordinator's, or a snapshot older than the claim)",
            ),
            RollbackCause::Backend(err) => write!(f, "{err}"),
            RollbackCause::Codec(message) => {
                write!(f, "the outcome cannot be encoded for storage: {message}")
            }
        }
    }
}

/// Why a coordinator could not be built or installed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// `build` was called without `.memory()` or `.provider(..)`.
    NoProvider,
    /// The namespace is empty or holds a character that would break key layout
    /// (`{`, `}`, `:`, whitespace or control characters).
    InvalidNamespace(String),
    /// A process-wide default coordinator was already installed. Install once, at start-up.
    AlreadyInstalled,
    /// An intercepted call already ran on the in-process fallback (nothing was installed
    /// then), so installing now would switch providers under running code and split its
    /// locks. Install at start-up, before the first intercepted call.
    FallbackInUse,
    /// A default or a profile holds a value coord cannot honour (a zero lease, a `renew` not
    /// shorter than its lease, a profile name that is not lowercase letters, digits and `_`).
    InvalidSetting {
        /// The setting's path, as in configuration (`profiles.payments.lease`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// [`CoordinatorBuilder::require`](crate::CoordinatorBuilder::require) asked for a
    /// capability the provider does not have.
    Unsupported {
        /// What the provider lacks.
        capability: Capability,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoProvider => f.write_str(
                "`Coordinator::builder()` was finished without a provider: add `.provider(redis)` \
                 (or `.memory()` for one process), or build with \
                 `coord_redis::coordinator_from_env()`, which chooses it from COORD_REDIS_URL",
            ),
            BuildError::InvalidNamespace(ns) => write!(
                f,
                "invalid namespace {ns:?}: use a non-empty name without `{{`, `}}`, `:`, whitespace or control characters"
            ),
            BuildError::AlreadyInstalled => f.write_str(
                "a coordinator was installed already in this process, and only one can be: \
                 install once, at start-up (give other call sites their own coordinator with \
                 `coordinator = ..` or the handle API)",
            ),
            BuildError::FallbackInUse => f.write_str(
                "an intercepted call already ran on the in-process fallback before this install, \
                 and switching providers under running code would split its locks: install the \
                 coordinator at start-up, before the first intercepted call",
            ),
            BuildError::InvalidSetting { field, reason } => {
                write!(f, "invalid coordinator setting `{field}`: {reason}")
            }
            BuildError::Unsupported { capability } => write!(
                f,
                "the coordinator was required to support {capability}, and its provider does not: \
                 choose a provider that does (the in-process, Redis and PostgreSQL providers keep \
                 semaphores and read-write locks and take multi-key locks in one step; Redis \
                 Cluster only within one hash slot)"
            ),
        }
    }
}

impl std::error::Error for BuildError {}
