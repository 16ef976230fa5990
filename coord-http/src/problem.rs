//! Error responses as RFC 9457 problem details (`application/problem+json`).
//!
//! Every refusal of the layer, and every [`CoordError`] turned into a response through
//! [`HttpError`](crate::HttpError), is a problem document with a stable `type` URI. Clients
//! branch on `type` (and `status`), never on `title` or `detail`, which are prose and may
//! change. The `type` URIs below are identifiers: each names one section of this page.
//!
//! | `type` (after the base) | status | `Retry-After` | when |
//! |---|---|---|---|
//! | [`missing-key`](#missing-key) | 400 | | the key is required and absent |
//! | [`invalid-key`](#invalid-key) | 400 | | the key is empty, too long, not visible ASCII, repeated, or a malformed string |
//! | [`key-reused`](#key-reused) | 422 | | the key was used for a different request |
//! | [`in-flight`](#in-flight) | 409 | yes | the first request with this key is still running |
//! | [`outcome-unknown`](#outcome-unknown) | 409 | | an earlier request with this key stopped mid-way; an operator must resolve it |
//! | [`response-not-replayable`](#response-not-replayable) | 409 | | the request ran, its response was too large to store |
//! | [`request-too-large`](#request-too-large) | 413 | | the request body is over the layer's limit |
//! | [`request-body-unreadable`](#request-body-unreadable) | 400 | | the request body failed while being read |
//! | [`backend-unavailable`](#backend-unavailable) | 503 | yes | the coordination backend is unreachable or timed out |
//! | [`backend-error`](#backend-error) | 500 | | the backend holds state it cannot read, or is misconfigured |
//! | [`lock-not-acquired`](#lock-not-acquired) | 409 | yes | a `#[distributed_lock]` stayed held |
//! | [`lock-lost`](#lock-lost) | 503 | yes | a lease was lost while the work ran; the work was stopped |
//! | [`outcome-not-stored`](#outcome-not-stored) | 500 | | the work ran, its outcome could not be stored |
//! | [`internal`](#internal) | 500 | | anything else coord reports (a reentrant lock, an unreadable record) |
//!
//! The base of every `type` is [`TYPE_BASE`].
//!
//! # missing-key
//! The route requires an idempotency key and the request has none. Send one (a UUID is a good
//! choice) and retry.
//!
//! # invalid-key
//! The key is empty, longer than 255 characters, has a character outside visible ASCII, is
//! sent in more than one header field, or starts with `"` without being a valid
//! structured-field string. The extension member `reason` says which (`empty`, `too-long`,
//! `not-visible-ascii`, `repeated`, `malformed-string`).
//!
//! # key-reused
//! A request with the same key and principal was made before with a different method, path,
//! query, fingerprinted header or body. The earlier response belongs to that request and is
//! neither replayed nor overwritten. Use a new key for a new request.
//!
//! # in-flight
//! The first request with this key is still being processed. Nothing was done for this one;
//! retry after `Retry-After` seconds to get the replay.
//!
//! # outcome-unknown
//! An earlier request with this key started and never finished (its process crashed or was
//! stopped past the in-flight lease), and the service runs at most once per key: whether its
//! effects happened is unknown, so nothing runs until an operator reconciles and clears the
//! record. Retrying does not help until then.
//!
//! # response-not-replayable
//! The request with this key was processed, but its response body was larger than the layer
//! stores, so it cannot be sent again. The extension member `original_status` is the status
//! the first request was answered with. The work is not repeated.
//!
//! # request-too-large
//! The request body is larger than the layer reads to fingerprint a request. Nothing ran.
//!
//! # request-body-unreadable
//! The request body failed while it was being read (the connection broke, or a body layer
//! refused it). Nothing ran.
//!
//! # backend-unavailable
//! The coordination backend could not be reached, or did not answer in time, so the request
//! could not be guarded and was not run. Retry after `Retry-After` seconds.
//!
//! # backend-error
//! The coordination backend answered with state coord cannot read, or is configured in a way
//! that breaks its promises. Not retryable: an operator must look.
//!
//! # lock-not-acquired
//! The work needs a lock another request holds. Nothing ran; retry after `Retry-After`.
//!
//! # lock-lost
//! The lease of a lock (or an in-flight marker) was lost while the work ran, and the work was
//! stopped. Retry after `Retry-After`.
//!
//! # outcome-not-stored
//! The work ran but its outcome could not be recorded. Do not retry blindly: the effects
//! happened.
//!
//! # internal
//! A fault inside the service's coordination (a stored record that does not decode, a lock
//! asked for twice by one task). The details are in the service's logs.

use std::time::Duration;

use bytes::Bytes;
use coord_core::CoordError;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};

/// The prefix of every problem `type` URI: the page documenting them, with one section per
/// type (`<base>#in-flight`).
pub const TYPE_BASE: &str = "https://docs.rs/coord-http/latest/coord_http/problem/index.html";

/// The media type of problem documents (RFC 9457).
pub const CONTENT_TYPE_PROBLEM: &str = "application/problem+json";

/// One kind of problem: its `type` fragment, status and title.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemKind {
    /// `400`: the key is required and absent.
    MissingKey,
    /// `400`: the key is not acceptable.
    InvalidKey,
    /// `422`: the key was used with a different request.
    KeyReused,
    /// `409` + `Retry-After`: the first request with this key is still running.
    InFlight,
    /// `409`: an earlier request with this key was abandoned mid-way (at-most-once).
    OutcomeUnknown,
    /// `409`: the request ran; its response was too large to store.
    ResponseNotReplayable,
    /// `413`: the request body is over the layer's limit.
    RequestTooLarge,
    /// `400`: the request body failed while being read.
    RequestBodyUnreadable,
    /// `503` + `Retry-After`: the backend is unreachable or timed out.
    BackendUnavailable,
    /// `500`: the backend's state or configuration needs an operator.
    BackendError,
    /// `409` + `Retry-After`: a distributed lock stayed held.
    LockNotAcquired,
    /// `503` + `Retry-After`: a lease was lost while the work ran.
    LockLost,
    /// `500`: the work ran, its outcome could not be stored.
    OutcomeNotStored,
    /// `500`: anything else.
    Internal,
}

impl ProblemKind {
    /// The fragment after [`TYPE_BASE`]`#`.
    pub fn slug(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "missing-key",
            ProblemKind::InvalidKey => "invalid-key",
            ProblemKind::KeyReused => "key-reused",
            ProblemKind::InFlight => "in-flight",
            ProblemKind::OutcomeUnknown => "outcome-unknown",
            ProblemKind::ResponseNotReplayable => "response-not-replayable",
            ProblemKind::RequestTooLarge => "request-too-large",
            ProblemKind::RequestBodyUnreadable => "request-body-unreadable",
            ProblemKind::BackendUnavailable => "backend-unavailable",
            ProblemKind::BackendError => "backend-error",
            ProblemKind::LockNotAcquired => "lock-not-acquired",
            ProblemKind::LockLost => "lock-lost",
            ProblemKind::OutcomeNotStored => "outcome-not-stored",
            ProblemKind::Internal => "internal",
        }
    }

    /// The full `type` URI.
    pub fn type_uri(self) -> String {
        format!("{TYPE_BASE}#{}", self.slug())
    }

    /// The status a problem of this kind is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            ProblemKind::MissingKey
            | ProblemKind::InvalidKey
            | ProblemKind::RequestBodyUnreadable => StatusCode::BAD_REQUEST,
            ProblemKind::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ProblemKind::InFlight
            | ProblemKind::OutcomeUnknown
            | ProblemKind::ResponseNotReplayable
            | ProblemKind::LockNotAcquired => StatusCode::CONFLICT,
            ProblemKind::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProblemKind::BackendUnavailable | ProblemKind::LockLost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ProblemKind::BackendError | ProblemKind::OutcomeNotStored | ProblemKind::Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// Whether a response of this kind carries `Retry-After` (the same request may succeed
    /// later, unchanged).
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ProblemKind::InFlight
                | ProblemKind::BackendUnavailable
                | ProblemKind::LockNotAcquired
                | ProblemKind::LockLost
        )
    }

    /// A short summary that does not change from one occurrence to the next.
    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::MissingKey => "Idempotency key required",
            ProblemKind::InvalidKey => "Invalid idempotency key",
            ProblemKind::KeyReused => "Idempotency key reused for a different request",
            ProblemKind::InFlight => "A request with this idempotency key is in progress",
            ProblemKind::OutcomeUnknown => {
                "An earlier request with this idempotency key has an unknown outcome"
            }
            ProblemKind::ResponseNotReplayable => {
                "The response to this idempotency key cannot be replayed"
            }
            ProblemKind::RequestTooLarge => "Request body too large",
            ProblemKind::RequestBodyUnreadable => "Request body could not be read",
            ProblemKind::BackendUnavailable => "Coordination backend unavailable",
            ProblemKind::BackendError => "Coordination backend error",
            ProblemKind::LockNotAcquired => "Resource busy",
            ProblemKind::LockLost => "Work stopped: lease lost",
            ProblemKind::OutcomeNotStored => "Outcome not stored",
            ProblemKind::Internal => "Coordination error",
        }
    }
}

/// An RFC 9457 problem document, ready to be sent.
///
/// Built from a [`ProblemKind`] (which fixes `type`, `title` and `status`), with an optional
/// `detail` and extension members. `Retry-After` is sent for the retryable kinds.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    kind: ProblemKind,
    detail: Option<String>,
    extensions: Map<String, Value>,
    retry_after: Duration,
}

/// The `Retry-After` sent when nothing better is known.
pub(crate) const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Problem {
    /// A problem of `kind`, with no detail.
    pub fn new(kind: ProblemKind) -> Problem {
        Problem {
            kind,
            detail: None,
            extensions: Map::new(),
            retry_after: DEFAULT_RETRY_AFTER,
        }
    }

    /// Sets the human-readable explanation of this occurrence.
    pub fn detail(mut self, detail: impl Into<String>) -> Problem {
        self.detail = Some(detail.into());
        self
    }

    /// Adds an extension member. The standard members (`type`, `title`, `status`, `detail`)
    /// cannot be replaced this way.
    pub fn extension(mut self, name: impl Into<String>, value: impl Into<Value>) -> Problem {
        let name = name.into();
        if !matches!(name.as_str(), "type" | "title" | "status" | "detail") {
            self.extensions.insert(name, value.into());
        }
        self
    }

    /// Sets the `Retry-After` of a retryable problem (rounded up to whole seconds, at least 1).
    pub fn retry_after(mut self, after: Duration) -> Problem {
        self.retry_after = after;
        self
    }

    /// The kind.
    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    /// The status the problem is sent with.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The document as JSON.
    pub fn to_json(&self) -> Value {
        let mut doc = Map::new();
        doc.insert("type".into(), Value::String(self.kind.type_uri()));
        doc.insert("title".into(), Value::String(self.kind.title().into()));
        doc.insert("status".into(), Value::from(self.status().as_u16()));
        if let Some(detail) = &self.detail {
            doc.insert("detail".into(), Value::String(detail.clone()));
        }
        for (name, value) in &self.extensions {
            doc.insert(name.clone(), value.clone());
        }
        Value::Object(doc)
    }

    /// The response: the status, `Content-Type: application/problem+json`, `Retry-After`
    /// for retryable kinds, and the document (members in the order `type`, `title`,
    /// `status`, `detail`, then the extensions).
    pub fn to_response(&self) -> Response<Bytes> {
        #[derive(Serialize)]
        struct Doc<'a> {
            #[serde(rename = "type")]
            type_uri: String,
            title: &'static str,
            status: u16,
            #[serde(skip_serializing_if = "Option::is_none")]
            detail: Option<&'a str>,
            #[serde(flatten)]
            extensions: &'a Map<String, Value>,
        }
        let doc = Doc {
            type_uri: self.kind.type_uri(),
            title: self.kind.title(),
            status: self.status().as_u16(),
            detail: self.detail.as_deref(),
            extensions: &self.extensions,
        };
        let body = serde_json::to_vec(&doc).expect("a problem document serializes");
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_PROBLEM));
        if self.kind.retryable() {
            headers.insert(RETRY_AFTER, retry_after_value(self.retry_after));
        }
        response
    }

    /// The problem a [`CoordError`] is answered with.
    ///
    /// | error | status | kind |
    /// |---|---|---|
    /// | `InFlight` | 409 + `Retry-After` | `in-flight` |
    /// | `LockNotAcquired` | 409 + `Retry-After` | `lock-not-acquired` |
    /// | `KeyReused` | 422 | `key-reused` |
    /// | `MissingKey` | 400 | `missing-key` |
    /// | `OutcomeUnknown` | 409 | `outcome-unknown` |
    /// | `Backend`, kind `Unavailable`, `Timeout` or `OutOfMemory` | 503 + `Retry-After` | `backend-unavailable` |
    /// | `Backend`, any other kind (`Corrupt`, `Config`, `Protocol`) | 500 | `backend-error` |
    /// | `LockLost` | 503 + `Retry-After` | `lock-lost` |
    /// | `OutcomeNotStored` | 500 | `outcome-not-stored` |
    /// | anything else (`Reentrant`, `Codec`, later variants) | 500 | `internal` |
    ///
    /// The `detail` never carries the error's message: keys, backend addresses and server
    /// replies stay in the service's logs, not in responses to clients.
    pub fn from_coord_error(err: &CoordError) -> Problem {
        let kind = match err {
            CoordError::InFlight { .. } => ProblemKind::InFlight,
            CoordError::LockNotAcquired { .. } => ProblemKind::LockNotAcquired,
            CoordError::KeyReused { .. } => ProblemKind::KeyReused,
            CoordError::MissingKey { .. } => ProblemKind::MissingKey,
            CoordError::OutcomeUnknown { .. } => ProblemKind::OutcomeUnknown,
            CoordError::Backend(backend) if backend.kind().is_transient() => {
                ProblemKind::BackendUnavailable
            }
            CoordError::Backend(_) => ProblemKind::BackendError,
            CoordError::LockLost { .. } => ProblemKind::LockLost,
            CoordError::OutcomeNotStored { .. } => ProblemKind::OutcomeNotStored,
            _ => ProblemKind::Internal,
        };
        Problem::new(kind).detail(default_detail(kind))
    }
}

/// The detail sent when the occurrence adds nothing to the kind.
pub(crate) fn default_detail(kind: ProblemKind) -> &'static str {
    match kind {
        ProblemKind::MissingKey => "This request needs an idempotency key.",
        ProblemKind::InvalidKey => "The idempotency key is not acceptable.",
        ProblemKind::KeyReused => {
            "This idempotency key was already used with a different request; use a new key for a new request."
        }
        ProblemKind::InFlight => {
            "The first request with this idempotency key is still being processed; retry later to get its response."
        }
        ProblemKind::OutcomeUnknown => {
            "An earlier request with this idempotency key stopped before finishing; whether it took effect is being reconciled."
        }
        ProblemKind::ResponseNotReplayable => {
            "The request with this idempotency key was processed, but its response is too large to be sent again."
        }
        ProblemKind::RequestTooLarge => "The request body is too large.",
        ProblemKind::RequestBodyUnreadable => "The request body could not be read.",
        ProblemKind::BackendUnavailable => {
            "The service could not reach its coordination backend; nothing was done. Retry later."
        }
        ProblemKind::BackendError => "The service's coordination backend reported an error.",
        ProblemKind::LockNotAcquired => {
            "The resource is busy with another request; nothing was done. Retry later."
        }
        ProblemKind::LockLost => "The work was stopped because its lease was lost. Retry later.",
        ProblemKind::OutcomeNotStored => {
            "The work ran, but its outcome could not be recorded. Do not retry blindly."
        }
        ProblemKind::Internal => "The service's coordination failed.",
    }
}

/// Whole seconds, rounded up, at least 1.
pub(crate) fn retry_after_value(after: Duration) -> HeaderValue {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_core::BackendError;
    use coord_core::provider::BackendErrorKind;

    #[test]
    fn document_has_the_standard_members() {
        let problem = Problem::new(ProblemKind::InFlight)
            .detail("wait")
            .extension("key", "abc")
            .extension("status", 200);
        let doc = problem.to_json();
        assert_eq!(doc["type"], format!("{TYPE_BASE}#in-flight"));
        assert_eq!(doc["status"], 409);
        assert_eq!(doc["detail"], "wait");
        assert_eq!(doc["key"], "abc");
        let response = problem.to_response();
        let sent: Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(sent, doc);
        assert!(response.body().starts_with(b"{\"type\":"));
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[CONTENT_TYPE], CONTENT_TYPE_PROBLEM);
        assert_eq!(response.headers()[RETRY_AFTER], "1");
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_value(Duration::from_millis(1500)), "2");
        assert_eq!(retry_after_value(Duration::ZERO), "1");
        assert_eq!(retry_after_value(Duration::from_secs(30)), "30");
    }

    #[test]
    fn non_retryable_kinds_have_no_retry_after() {
        let response = Problem::new(ProblemKind::KeyReused).to_response();
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }

    #[test]
    fn coord_errors_map_as_documented() {
        let key = || coord_core::CallKey::builder("ns", "op").part("k").finish();
        let cases: Vec<(CoordError, u16, &str)> = vec![
            (CoordError::InFlight { key: key() }, 409, "in-flight"),
            (
                CoordError::LockNotAcquired {
                    key: key(),
                    waited: Duration::ZERO,
                },
                409,
                "lock-not-acquired",
            ),
            (CoordError::KeyReused { key: key() }, 422, "key-reused"),
            (
                CoordError::MissingKey {
                    op: "op".into(),
                    part: None,
                },
                400,
                "missing-key",
            ),
            (
                CoordError::OutcomeUnknown { key: key() },
                409,
                "outcome-unknown",
            ),
            (
                CoordError::Backend(BackendError::new(BackendErrorKind::Unavailable, "down")),
                503,
                "backend-unavailable",
            ),
            (
                CoordError::Backend(BackendError::new(BackendErrorKind::Timeout, "slow")),
                503,
                "backend-unavailable",
            ),
            (
                CoordError::Backend(BackendError::new(BackendErrorKind::Corrupt, "junk")),
                500,
                "backend-error",
            ),
            (CoordError::Reentrant { key: key() }, 500, "internal"),
        ];
        for (err, status, slug) in cases {
            let problem = Problem::from_coord_error(&err);
            assert_eq!(problem.status().as_u16(), status, "{err}");
            assert_eq!(problem.kind().slug(), slug, "{err}");
            assert_eq!(
                problem.to_response().headers().contains_key(RETRY_AFTER),
                err.is_retryable(),
                "Retry-After exactly for retryable errors: {err}"
            );
            let detail = problem.to_json()["detail"].as_str().unwrap().to_owned();
            assert!(!detail.contains("op:k"), "no key in the detail: {detail}");
        }
    }
}
