//! Errors a provider reports for a backend fault.

use std::fmt;
use std::sync::Arc;

use crate::call_key::CallKey;

/// What kind of backend fault happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// The backend could not be reached or the connection broke.
    Unavailable,
    /// The backend did not answer within the command timeout.
    Timeout,
    /// The backend answered with data coord cannot interpret (a wrong-typed value at a coord key,
    /// a record that does not decode, an unexpected script reply).
    Protocol,
    /// The provider was configured wrongly (bad URL, unknown option), or the server is set up
    /// in a way that breaks coord's promises (e.g. an eviction policy that can drop held locks).
    Config,
    /// State under one of coord's keys is not coord's (a wrong type, garbage fields, a counter
    /// that is not a number): refused, never turned into a grant, a token or a replay. Needs an
    /// operator (purge the key); not retryable.
    Corrupt,
    /// The backend is out of memory and refuses writes (Redis `OOM` under `noeviction`).
    /// Retryable once memory is freed.
    OutOfMemory,
    /// The write was applied on the primary, but fewer replicas acknowledged it than the
    /// provider was asked to wait for (Redis `WAIT`, see `RedisProviderBuilder::replica_acks`),
    /// so a failover could lose it. The provider reports this only for writes that granted
    /// something (a claim, a lock, a renewal, a completion): the caller treats the write as
    /// failed and the runtime undoes a claim or a grant by its owner.
    /// [`BackendError::replica_shortfall`] says how many replicas acknowledged and how many
    /// were asked for. Retryable once the replicas are back.
    NotReplicated,
}

impl BackendErrorKind {
    /// A short, stable name: `unavailable`, `timeout`, `protocol`, `config`, `corrupt`,
    /// `out_of_memory`, `not_replicated` (the `kind` label of `coord_backend_errors_total`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::Protocol => "protocol",
            BackendErrorKind::Config => "config",
            BackendErrorKind::Corrupt => "corrupt",
            BackendErrorKind::OutOfMemory => "out_of_memory",
            BackendErrorKind::NotReplicated => "not_replicated",
        }
    }

    /// True for faults that can go away by themselves (`Unavailable`, `Timeout`,
    /// `OutOfMemory`, `NotReplicated`); false for those that need a change (`Protocol`,
    /// `Config`, `Corrupt`). A transient fault of a write may hide a write that landed, so the
    /// runtime cleans up after it by owner.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            BackendErrorKind::Unavailable
                | BackendErrorKind::Timeout
                | BackendErrorKind::OutOfMemory
                | BackendErrorKind::NotReplicated
        )
    }
}

/// How many replicas acknowledged a write, against how many were asked for: the detail of a
/// [`BackendErrorKind::NotReplicated`] error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaShortfall {
    /// Replicas that acknowledged the write within the wait.
    pub acknowledged: u32,
    /// Replicas the provider was asked to wait for.
    pub asked: u32,
}

/// A fault of the coordination backend, as a provider reports it.
///
/// Cheap to clone. The message never contains credentials: providers strip passwords from
/// addresses before they build one.
#[derive(Clone)]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
    key: Option<CallKey>,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    shortfall: Option<ReplicaShortfall>,
}

impl BackendError {
    /// A backend error of `kind` described by `message`.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            message: message.into(),
            key: None,
            source: None,
            shortfall: None,
        }
    }

    /// A [`BackendErrorKind::NotReplicated`] error: `shortfall` says how many replicas
    /// acknowledged and how many were asked for.
    pub fn not_replicated(shortfall: ReplicaShortfall, message: impl Into<String>) -> Self {
        let mut err = BackendError::new(BackendErrorKind::NotReplicated, message);
        err.shortfall = Some(shortfall);
        err
    }

    /// For a [`BackendErrorKind::NotReplicated`] error: the replicas that acknowledged and
    /// those asked for. `None` for every other kind.
    pub fn replica_shortfall(&self) -> Option<ReplicaShortfall> {
        self.shortfall
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// Attaches the key of the call that hit the fault.
    pub fn with_key(mut self, key: &CallKey) -> Self {
        self.key = Some(key.clone());
        self
    }

    /// What kind of fault this is.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// The key of the call that hit the fault, when known.
    pub fn key(&self) -> Option<&CallKey> {
        self.key.as_ref()
    }

    /// The human-readable description.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendError")
            .field("kind", &self.kind)
            .field("message", &self.message)
            .field("key", &self.key)
            .field("source", &self.source.as_ref().map(|s| s.to_string()))
            .field("shortfall", &self.shortfall)
            .finish()
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination backend {:?}: {}", self.kind, self.message)?;
        if let Some(key) = &self.key {
            write!(f, " (key `{key}`)")?;
        }
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}
