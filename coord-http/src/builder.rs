//! The builder of an [`IdempotencyLayer`]: every option, and the scope decision without
//! which there is no `build()`.

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Coordinator, OnAbandoned, OnBackendError};
use http::header::{
    CONNECTION, CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_LENGTH, CONTENT_LOCATION, CONTENT_TYPE,
    LOCATION, TRANSFER_ENCODING,
};
use http::request::Parts;
use http::{HeaderName, Method};

use crate::config::{
    Config, DEFAULT_HEADER, DEFAULT_OPERATION, Options, OversizedResponse, Remember,
};
use crate::layer::IdempotencyLayer;
use crate::problem::DEFAULT_RETRY_AFTER;
use crate::scope::{Scope, ScopeDecision, ScopeSet, ScopeUnset, Sealed};

/// Builds an [`IdempotencyLayer`]. Start with [`IdempotencyLayer::builder`].
///
/// Every option but one has a default; see each method. The one without is whose keys are
/// whose: [`build`](Self::build) exists only once one of [`scope`](Self::scope),
/// [`scope_header`](Self::scope_header) or [`single_principal`](Self::single_principal) was
/// called, so a layer that lets one caller's key replay another caller's response is never
/// built by omission. The type parameter records that choice ([`ScopeUnset`], then
/// [`ScopeSet`]); code naming the builder's type writes `IdempotencyLayerBuilder<ScopeSet>`
/// for a builder ready to build.
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the layer"]
pub struct IdempotencyLayerBuilder<S = ScopeUnset> {
    config: Options,
    scope: S,
}

impl IdempotencyLayerBuilder<ScopeUnset> {
    pub(crate) fn new(coordinator: Coordinator) -> Self {
        let on_backend_error = coordinator.on_backend_error();
        IdempotencyLayerBuilder {
            scope: ScopeUnset,
            config: Options {
                coordinator,
                operation: DEFAULT_OPERATION.to_owned(),
                header: HeaderName::from_static(DEFAULT_HEADER),
                methods: vec![Method::POST, Method::PATCH],
                require_key: true,
                retention: Duration::from_secs(24 * 60 * 60),
                in_flight_lease: Duration::from_secs(30),
                wait: Duration::ZERO,
                on_abandoned: OnAbandoned::Rerun,
                on_backend_error,
                remember: Remember::successes(),
                stored_headers: vec![
                    CONTENT_TYPE,
                    CONTENT_ENCODING,
                    CONTENT_LANGUAGE,
                    CONTENT_LOCATION,
                    LOCATION,
                ],
                max_stored_body: 1024 * 1024,
                oversized: OversizedResponse::Unreplayable,
                max_request_body: 2 * 1024 * 1024,
                fingerprint_headers: Vec::new(),
                retry_after: DEFAULT_RETRY_AFTER,
                metrics: Arc::default(),
            },
        }
    }
}

impl<S> IdempotencyLayerBuilder<S> {
    /// The request header the key is read from. Default `Idempotency-Key`.
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.config.header = name;
        self
    }

    /// The methods the layer guards. Default `POST` and `PATCH`. Requests with any other
    /// method pass through untouched (their key, if any, is ignored).
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded request without a key is refused (`400`, problem type
    /// `missing-key`). Default `true`. With `false`, such a request runs without
    /// idempotency and is counted in [`Metrics::unprotected`](crate::Metrics::unprotected).
    pub fn require_key(mut self, required: bool) -> Self {
        self.config.require_key = required;
        self
    }

    /// How long a remembered response is kept and replayed. Default 24 hours. After it, the
    /// key is free and a request with it runs again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// How long a request that stopped without finishing (its process crashed) can block its
    /// key. Default 30 seconds. A handler that runs longer than this may see a duplicate run
    /// beside it: set it above your slowest handler.
    pub fn in_flight_lease(mut self, lease: Duration) -> Self {
        self.config.in_flight_lease = lease;
        self
    }

    /// How long a duplicate waits for the first request with its key to finish before it is
    /// answered `409` (problem type `in-flight`). Default zero: `409` at once. When the first
    /// request finishes within the wait, the duplicate gets its replay (or, if that response is
    /// not remembered, runs itself).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config.wait = wait;
        self
    }

    /// What a duplicate gets when the first request with its key stopped without finishing
    /// (the process crashed, or the request was cancelled under `Fail`). Default
    /// [`OnAbandoned::Rerun`]: the handler runs again once the in-flight lease has passed (or
    /// at once, when the stop was seen). [`OnAbandoned::Fail`]: `409`, problem type
    /// `outcome-unknown`, until an operator clears the record
    /// ([`Coordinator::purge_record`](coord_core::Coordinator::purge_record)).
    pub fn on_abandoned(mut self, policy: OnAbandoned) -> Self {
        self.config.on_abandoned = policy;
        self
    }

    /// What a guarded request gets when the coordination backend fails. Default: the
    /// coordinator's default, itself [`OnBackendError::FailClosed`] unless set:
    /// `503 Service Unavailable` with `Retry-After`, problem type `backend-unavailable`, and the
    /// handler does not run. [`OnBackendError::FailOpen`] runs the handler without
    /// idempotency, counted in [`Metrics::failed_open`](crate::Metrics::failed_open) (and the coordinator's metrics).
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.config.on_backend_error = policy;
        self
    }

    /// Which responses are stored and replayed. Default [`Remember::successes`] (`2xx`).
    pub fn remember(mut self, remember: Remember) -> Self {
        self.config.remember = remember;
        self
    }

    /// The response headers stored with a remembered response and sent with its replays
    /// (every value, in the order the handler set them). Replaces the default list:
    /// `Content-Type`, `Content-Encoding`, `Content-Language`, `Content-Location`,
    /// `Location`. `Content-Length`, `Transfer-Encoding` and `Connection` are never stored (a
    /// replay's length is its stored body's).
    pub fn stored_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.stored_headers = headers
            .into_iter()
            .filter(|h| ![CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION].contains(h))
            .collect();
        self.config.stored_headers.dedup();
        self
    }

    /// The longest response body stored, in bytes. Default 1 MiB. What happens to a longer
    /// one is [`on_oversized_response`](Self::on_oversized_response)'s choice; it is never
    /// stored in part.
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.config.max_stored_body = bytes;
        self
    }

    /// What happens to a remembered response whose body is longer than
    /// [`max_stored_body`](Self::max_stored_body). Default [`OversizedResponse::Unreplayable`].
    pub fn on_oversized_response(mut self, policy: OversizedResponse) -> Self {
        self.config.oversized = policy;
        self
    }

    /// The operation name the keys are stored under (records are keyed by namespace,
    /// operation, scope and key). Default `http.idempotency`.
    ///
    /// Layers sharing an operation name share their keys: a key reused on another route is
    /// then refused (`422`, as the fingerprint includes method and path), which is what
    /// clients usually expect. Give a layer its own name when its keys must be independent.
    pub fn operation(mut self, name: impl Into<String>) -> Self {
        self.config.operation = name.into();
        self
    }

    /// Request headers that belong to the fingerprint besides the method, the path and query,
    /// and the body. Default none. A header that changes what the request means
    /// (`Content-Type`, an API version) belongs here; one that changes per attempt (a trace
    /// id, a timestamp) does not.
    pub fn fingerprint_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.fingerprint_headers = headers.into_iter().collect();
        self
    }

    /// The longest request body read, in bytes. Default 2 MiB. A guarded request's body is
    /// read whole before the handler runs, to fingerprint it; a longer one is answered `413`
    /// (problem type `request-too-large`) without running the handler.
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.config.max_request_body = bytes;
        self
    }

    /// The `Retry-After` sent with `409 in-flight` and `503 backend-unavailable` (rounded up
    /// to whole seconds, at least one). Default one second.
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.config.retry_after = after;
        self
    }

    /// The principal a key belongs to, computed from the request: a tenant, a user, an API
    /// key. Two requests share a record only when their principals and keys are both equal, so
    /// one caller's key can never replay another caller's response.
    ///
    /// The function sees the request head, including the extensions an authentication layer
    /// placed before this one (the best source: a principal the application has verified). It
    /// must not fail: return a fixed value (for example `"anonymous"`) for requests without a
    /// principal, or reject those in an earlier layer. Its result is never stored, logged or
    /// shown as it is: it enters the record key as its [`scope_digest`](crate::scope_digest).
    ///
    /// One of the three scope choices; the last one called counts.
    pub fn scope(
        self,
        scope: impl Fn(&Parts) -> String + Send + Sync + 'static,
    ) -> IdempotencyLayerBuilder<ScopeSet> {
        self.with_scope(Scope::Function(Arc::new(scope)))
    }

    /// The principal a key belongs to is the value of the request header `name` (for example
    /// `AUTHORIZATION`, or an API-key header): two requests share a record only when they
    /// carry the same value, byte for byte. Requests without the header are one principal
    /// between them (reject them in an earlier layer if they must not share keys); a header
    /// sent more than once counts as its values joined by `", "`, as HTTP reads it.
    ///
    /// The value is never stored, logged or shown as it is: it enters the record key as its
    /// [`scope_digest`](crate::scope_digest). Prefer [`scope`](Self::scope) over a verified
    /// principal when one is at hand: a bearer token that is rotated starts a new principal.
    ///
    /// One of the three scope choices; the last one called counts.
    pub fn scope_header(self, name: HeaderName) -> IdempotencyLayerBuilder<ScopeSet> {
        self.with_scope(Scope::Header(name))
    }

    /// Every caller is one principal: any request with a key may get the stored response of
    /// any other request with that key. Right for an internal service whose every client is
    /// the same party; wrong whenever keys come from more than one user, tenant or account.
    ///
    /// Records are keyed as by earlier versions' default scope, so a layer switched to this
    /// finds the records it wrote before.
    ///
    /// One of the three scope choices; the last one called counts.
    pub fn single_principal(self) -> IdempotencyLayerBuilder<ScopeSet> {
        self.with_scope(Scope::Single)
    }

    fn with_scope(self, scope: Scope) -> IdempotencyLayerBuilder<ScopeSet> {
        IdempotencyLayerBuilder {
            config: self.config,
            scope: ScopeSet(scope),
        }
    }

    /// The layer. Available once the scope is chosen (see the type's docs): before that, a
    /// call is a compile error naming the three choices.
    pub fn build(self) -> IdempotencyLayer
    where
        S: ScopeDecision,
    {
        IdempotencyLayer::from_config(Config {
            options: self.config,
            scope: Sealed::into_set(self.scope).0,
        })
    }
}

impl IdempotencyLayer {
    /// Starts a layer whose records live in `coordinator` (its provider and namespace). Use
    /// `Coordinator::current().clone()` for the installed one.
    ///
    /// The builder needs to be told whose keys are whose before it builds:
    /// [`scope`](IdempotencyLayerBuilder::scope),
    /// [`scope_header`](IdempotencyLayerBuilder::scope_header) or
    /// [`single_principal`](IdempotencyLayerBuilder::single_principal).
    pub fn builder(coordinator: Coordinator) -> IdempotencyLayerBuilder {
        IdempotencyLayerBuilder::new(coordinator)
    }
}
