//! Counters of what the layer did with requests.

use std::sync::atomic::{AtomicU64, Ordering};

/// What one [`IdempotencyLayer`](crate::IdempotencyLayer) (and every service it made) did,
/// counted since it was built. Read with [`IdempotencyLayer::metrics`](crate::IdempotencyLayer::metrics).
///
/// Each guarded request is counted once, under what decided its answer.
#[derive(Debug, Default)]
pub struct Metrics {
    executed: AtomicU64,
    replayed: AtomicU64,
    not_remembered: AtomicU64,
    in_flight: AtomicU64,
    key_reused: AtomicU64,
    invalid_key: AtomicU64,
    unprotected: AtomicU64,
    failed_open: AtomicU64,
    backend_errors: AtomicU64,
    outcome_unknown: AtomicU64,
    oversized: AtomicU64,
    not_stored: AtomicU64,
    request_refused: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Executed,
    Replayed,
    NotRemembered,
    InFlight,
    KeyReused,
    InvalidKey,
    Unprotected,
    FailedOpen,
    BackendError,
    OutcomeUnknown,
    Oversized,
    NotStored,
    RequestRefused,
}

impl Metrics {
    pub(crate) fn count(&self, event: Event) {
        let counter = match event {
            Event::Executed => &self.executed,
            Event::Replayed => &self.replayed,
            Event::NotRemembered => &self.not_remembered,
            Event::InFlight => &self.in_flight,
            Event::KeyReused => &self.key_reused,
            Event::InvalidKey => &self.invalid_key,
            Event::Unprotected => &self.unprotected,
            Event::FailedOpen => &self.failed_open,
            Event::BackendError => &self.backend_errors,
            Event::OutcomeUnknown => &self.outcome_unknown,
            Event::Oversized => &self.oversized,
            Event::NotStored => &self.not_stored,
            Event::RequestRefused => &self.request_refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests whose handler ran under the key's claim and whose response was stored.
    pub fn executed(&self) -> u64 {
        self.executed.load(Ordering::Relaxed)
    }

    /// Requests answered with a stored response (`Idempotent-Replayed: true`); the handler did
    /// not run.
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    /// Requests whose handler ran and whose response was not remembered (its status, a body
    /// that failed, or an oversized body under [`OversizedResponse::Forget`](crate::OversizedResponse::Forget)):
    /// the key was freed.
    pub fn not_remembered(&self) -> u64 {
        self.not_remembered.load(Ordering::Relaxed)
    }

    /// Duplicates answered `409 in-flight`.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests answered `422 key-reused`.
    pub fn key_reused(&self) -> u64 {
        self.key_reused.load(Ordering::Relaxed)
    }

    /// Requests answered `400` for a missing or invalid key.
    pub fn invalid_key(&self) -> u64 {
        self.invalid_key.load(Ordering::Relaxed)
    }

    /// Guarded requests without a key that ran without idempotency (`require_key(false)`).
    pub fn unprotected(&self) -> u64 {
        self.unprotected.load(Ordering::Relaxed)
    }

    /// Requests that ran without idempotency because the backend failed under
    /// [`OnBackendError::FailOpen`](coord_core::OnBackendError::FailOpen).
    pub fn failed_open(&self) -> u64 {
        self.failed_open.load(Ordering::Relaxed)
    }

    /// Requests refused because the backend failed (`503`, or `500` for a backend fault that
    /// needs an operator), or because a stored record could not be read.
    pub fn backend_errors(&self) -> u64 {
        self.backend_errors.load(Ordering::Relaxed)
    }

    /// Requests answered `409 outcome-unknown` (an abandoned request under
    /// [`OnAbandoned::Fail`](coord_core::OnAbandoned::Fail)).
    pub fn outcome_unknown(&self) -> u64 {
        self.outcome_unknown.load(Ordering::Relaxed)
    }

    /// Responses that would have been remembered but were longer than the stored-body limit
    /// (the request that ran is counted here, not under `executed`).
    pub fn oversized(&self) -> u64 {
        self.oversized.load(Ordering::Relaxed)
    }

    /// Requests whose handler ran but whose response could not be stored (the backend failed
    /// for longer than the in-flight lease): the client got the handler's response, and a
    /// duplicate gets what `on_abandoned` says.
    pub fn not_stored(&self) -> u64 {
        self.not_stored.load(Ordering::Relaxed)
    }

    /// Requests refused before any claim because their body was too large (`413`) or could not
    /// be read (`400`).
    pub fn request_refused(&self) -> u64 {
        self.request_refused.load(Ordering::Relaxed)
    }
}
