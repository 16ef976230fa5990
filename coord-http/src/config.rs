//! The layer's options, as the builder collects them and the layer reads them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use coord_core::{Coordinator, OnAbandoned, OnBackendError};
use http::{HeaderName, Method, StatusCode};

use crate::metrics::Metrics;
use crate::scope::Scope;

/// The header the key is read from unless configured otherwise.
pub const DEFAULT_HEADER: &str = "idempotency-key";

/// The operation name the layer's keys are stored under unless configured otherwise.
pub const DEFAULT_OPERATION: &str = "http.idempotency";

/// Which of the inner service's responses are stored and replayed.
///
/// A response that is not remembered leaves no trace: the key is freed as soon as the response
/// is known, and a retry with the same key runs the handler again. Whatever the rule, a
/// response that is not a success and carries `Retry-After` (a busy lock, `503`, `429`) is
/// never remembered, since it tells the client to try again; and the layer's own refusals
/// (problem documents) are never remembered.
#[derive(Clone)]
pub struct Remember(Rule);

#[derive(Clone)]
enum Rule {
    Success,
    SuccessAndClientErrors,
    When(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>),
}

impl Remember {
    /// Successes only (`2xx`): a failure may be retried. The default.
    pub fn successes() -> Remember {
        Remember(Rule::Success)
    }

    /// Successes and the client errors the handler returned (`2xx` and `4xx`), except the
    /// `4xx` that mean "try again" (`408 Request Timeout`, `425 Too Early`, `429 Too Many
    /// Requests`). For handlers whose validation failures are final, as Stripe treats them.
    pub fn successes_and_client_errors() -> Remember {
        Remember(Rule::SuccessAndClientErrors)
    }

    /// The statuses for which `rule` returns `true`.
    pub fn when(rule: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Remember {
        Remember(Rule::When(Arc::new(rule)))
    }

    /// Whether a response with `status` is remembered.
    pub fn remembers(&self, status: StatusCode) -> bool {
        match &self.0 {
            Rule::Success => status.is_success(),
            Rule::SuccessAndClientErrors => {
                status.is_success()
                    || (status.is_client_error() && !matches!(status.as_u16(), 408 | 425 | 429))
            }
            Rule::When(rule) => rule(status),
        }
    }
}

impl Default for Remember {
    fn default() -> Self {
        Remember::successes()
    }
}

impl fmt::Debug for Remember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Rule::Success => f.write_str("Remember::successes()"),
            Rule::SuccessAndClientErrors => f.write_str("Remember::successes_and_client_errors()"),
            Rule::When(_) => f.write_str("Remember::when(..)"),
        }
    }
}

/// What happens when a response that would be remembered has a body longer than
/// [`max_stored_body`](crate::IdempotencyLayerBuilder::max_stored_body).
///
/// Either way the client of the request that ran gets the whole response, and nothing is
/// stored half: a record holds a body's every byte or none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OversizedResponse {
    /// Store the status and a note that the body was too large. A duplicate gets
    /// `409 Conflict`, problem type `response-not-replayable`, with the original status as
    /// `original_status`; the handler does not run again. The default: the key keeps its
    /// at-most-once promise.
    #[default]
    Unreplayable,
    /// Store nothing and free the key, as for a response that is not remembered: a duplicate
    /// runs the handler again. For handlers that are safe to repeat.
    Forget,
}

/// Every option but the scope: what the builder holds while the scope may still be undecided.
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) coordinator: Coordinator,
    pub(crate) operation: String,
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) retention: Duration,
    pub(crate) in_flight_lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) on_abandoned: OnAbandoned,
    pub(crate) on_backend_error: OnBackendError,
    pub(crate) remember: Remember,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) max_stored_body: usize,
    pub(crate) oversized: OversizedResponse,
    pub(crate) max_request_body: usize,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) retry_after: Duration,
    pub(crate) metrics: Arc<Metrics>,
}

/// A built layer's options.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) options: Options,
    pub(crate) scope: Scope,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("namespace", &self.coordinator.namespace())
            .field("operation", &self.operation)
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("retention", &self.retention)
            .field("in_flight_lease", &self.in_flight_lease)
            .field("wait", &self.wait)
            .field("on_abandoned", &self.on_abandoned)
            .field("on_backend_error", &self.on_backend_error)
            .field("remember", &self.remember)
            .field("stored_headers", &self.stored_headers)
            .field("max_stored_body", &self.max_stored_body)
            .field("oversized", &self.oversized)
            .field("max_request_body", &self.max_request_body)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}
