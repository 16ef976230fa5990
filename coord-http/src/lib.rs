//! # coord-http
//!
//! An `Idempotency-Key` layer for `tower`, and so for axum, hyper and any `tower` stack: a
//! request carrying a key runs its handler at most once per key and principal, and every
//! duplicate gets the first response back, byte for byte, with `Idempotent-Replayed: true`.
//! It runs on coord's idempotency records (the same [`Coordinator`], providers and record
//! protocol as `#[idempotent]`), so the claim holds across every instance sharing the
//! provider: two replicas behind a load balancer run a key once between them.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use coord_core::Coordinator;
//! use coord_http::IdempotencyLayer;
//! use http::header::AUTHORIZATION;
//!
//! # async fn charge() -> &'static str { "charged" }
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let coordinator = Coordinator::builder().namespace("payments").memory().build()?;
//! let idempotency = IdempotencyLayer::builder(coordinator)
//!     // The principal: one caller's key can never replay another caller's response.
//!     .scope_header(AUTHORIZATION)
//!     .build();
//! let app: Router = Router::new()
//!     .route("/payments", post(charge))
//!     .layer(idempotency);
//! # Ok(()) }
//! ```
//!
//! The builder has no `build()` until it is told whose keys are whose, so a layer that lets
//! one caller's key replay another caller's response is never built by omission:
//!
//! * [`scope(|request| ..)`](IdempotencyLayerBuilder::scope): the application's function
//!   names the principal, best from what an authentication layer verified (the request's
//!   extensions);
//! * [`scope_header(name)`](IdempotencyLayerBuilder::scope_header): a header's value names it
//!   (`Authorization`, an API-key header); requests without the header are one principal;
//! * [`single_principal()`](IdempotencyLayerBuilder::single_principal): every caller is one
//!   principal, for internal services with a single client.
//!
//! Leaving all three out is a compile error that names them.
//!
//! ## What each request gets
//!
//! "Guarded" requests are those whose method the layer applies to (`POST` and `PATCH` unless
//! configured). A "duplicate" is a later request with the same key and the same principal (the
//! scope). Refusals are `application/problem+json`
//! ([RFC 9457](https://www.rfc-editor.org/rfc/rfc9457)) with a stable `type`, listed in
//! [`problem`].
//!
//! | what happened | the request gets | a duplicate gets |
//! |---|---|---|
//! | the method is not guarded | the handler's response, untouched | the same (nothing is recorded) |
//! | no key, and the key is required (the default) | `400`, `missing-key` | the same |
//! | no key, and [`require_key(false)`](IdempotencyLayerBuilder::require_key) | the handler's response; counted in [`Metrics::unprotected`] | runs again |
//! | the key is empty, over 255 characters, not visible ASCII, sent twice, or a malformed `"…"` string | `400`, `invalid-key` (with a `reason`) | the same |
//! | the request body is over [`max_request_body`](IdempotencyLayerBuilder::max_request_body) | `413`, `request-too-large`; nothing runs | the same |
//! | the handler answered a remembered status (`2xx` unless [`remember`](IdempotencyLayerBuilder::remember) says otherwise) | its response | the stored status, [stored headers](IdempotencyLayerBuilder::stored_headers) and exact body bytes, plus `Idempotent-Replayed: true`, for [`retention`](IdempotencyLayerBuilder::retention) (24 h); the handler does not run |
//! | the handler answered a status that is not remembered (a failure, by default) | its response | runs again: a failure leaves no trace |
//! | the key was used before with a different request: method, path and query, [listed headers](IdempotencyLayerBuilder::fingerprint_headers) or body | | `422`, `key-reused`; the stored response is neither replayed nor overwritten |
//! | the first request with the key is still running | | `409`, `in-flight`, with `Retry-After`; with a [`wait`](IdempotencyLayerBuilder::wait), it waits for the first to finish and gets its replay (or runs, if that response is not remembered) |
//! | the response body is over [`max_stored_body`](IdempotencyLayerBuilder::max_stored_body) | the whole response | by default `409`, `response-not-replayable`, with `original_status`; the handler does not run again. With [`OversizedResponse::Forget`], runs again. Never a part of the body |
//! | the backend is unreachable or times out | fail closed (the default): `503`, `backend-unavailable`, with `Retry-After`; nothing runs. Fail open: the handler's response, unguarded, counted in [`Metrics::failed_open`] | the same, while it lasts |
//! | the handler ran, and storing its response kept failing (for longer than the in-flight lease) | the handler's response; counted in [`Metrics::not_stored`] | [`on_abandoned`](IdempotencyLayerBuilder::on_abandoned) `Rerun` (the default): `409 in-flight` until the lease ends, then runs again; `Fail`: `409`, `outcome-unknown` |
//! | the handler panicked, or the client disconnected and the server dropped the request | nothing (the panic goes on up the stack) | `Rerun`: runs again at once (the key is freed as the request unwinds); `Fail`: `409 in-flight` until the lease ends, then `409 outcome-unknown` |
//! | the process died mid-request | nothing | `Rerun`: `409 in-flight` until [`in_flight_lease`](IdempotencyLayerBuilder::in_flight_lease) (30 s) has passed, then runs again; `Fail`: then `409 outcome-unknown` |
//! | the inner service returned an error, or the response body failed mid-way | the error | runs again |
//!
//! A duplicate that arrives after `retention` runs again, as a new request.
//!
//! ## What is stored, and under which key
//!
//! A record's key is the coordinator's namespace, the layer's
//! [`operation`](IdempotencyLayerBuilder::operation) name (`http.idempotency`), the
//! principal's [`scope_digest`] (empty under `single_principal`) and the idempotency key, each
//! a separate, escaped part: no scope or key value can reach another's record. It is shown as
//! `http.idempotency:<digest>:<key>` in errors, logs and the `coord` tool. The record holds the response's status, the stored headers (every value, in order), the
//! body's bytes and a fingerprint of the request (SHA-256 over method, path and query, the
//! listed headers and the body), for `retention` after the response, encoded with the
//! coordinator's codec. While the handler runs, the record is an in-flight marker with a
//! lease of `in_flight_lease`.
//!
//! The inner service receives the request with its body already read (the layer reads it to
//! fingerprint it): [`RequestBody`]. A remembered response is read whole (up to
//! `max_stored_body`) before it is sent; a response that is not remembered streams through.
//!
//! ## Security
//!
//! **What the scope isolates.** Every record belongs to one principal: a request is only ever
//! compared with earlier requests of the same principal and key. Another principal's key
//! gives no replay, no `422 key-reused` and no `409 in-flight`, so a key that leaked (keys
//! travel in logs and proxies, and some are predictable, like `order-1`) tells nothing about,
//! and reaches nothing of, its owner's requests. This holds only as far as the scope tells
//! callers apart: scope by the principal the application verified, not by a header a client
//! may set freely; with [`scope_header`](IdempotencyLayerBuilder::scope_header), requests
//! without the header share one principal (reject them in an earlier layer if they must not),
//! and a rotated token is a new principal. `single_principal()` isolates nothing: use it only
//! when every client is the same party.
//!
//! **What the fingerprint isolates.** Within one principal, a key reused for a different
//! request (method, path and query, the listed headers, the body) is refused with `422`, never
//! answered with the other request's response. The fingerprint does not tell callers apart:
//! two principals sending identical requests differ by scope alone.
//!
//! **What is stored, and for how long.** While a request runs: an in-flight marker with the
//! request's fingerprint (128 bits of SHA-256; request bodies are never stored), for at most
//! `in_flight_lease` (30 s). After a remembered response: its status, the
//! [`stored_headers`](IdempotencyLayerBuilder::stored_headers) and every body byte, with the
//! fingerprint, for `retention` (24 h) from the response; then it is gone. A stored response
//! is as sensitive as the response itself (a receipt, an account number): the backend holding
//! the records needs the access control and encryption in transit that such data needs, and
//! `stored_headers` should not list headers carrying secrets (`Set-Cookie` is not in the
//! default list). The record's key holds the namespace, the operation name, the scope's
//! digest and the idempotency key as the client sent it (escaped).
//!
//! **What is never stored or shown raw: the scope value.** It may be a bearer token, an API
//! key or an e-mail address, so it enters the record key only as a fixed-length digest
//! ([`scope_digest`]: SHA-256 over a domain label, the namespace and the value, 128 bits
//! kept). Redis key names, coord's log lines and spans, [`CallReport::key`], metrics and the
//! `coord` tool show the digest; `coord records list <operation> --scope VALUE` finds a
//! principal's records from the raw value. The digest keeps the value out of sight, not out
//! of reach of guessing: whoever reads the keys and knows the namespace can test a guessed
//! e-mail address against it.
//!
//! **What is logged.** The layer logs a refusal at `debug` with the coordination error, which
//! names the record key (operation, scope digest, idempotency key); a response too large to
//! store at `warn` with its status and the limit; a stored status HTTP cannot send at
//! `error`. coord's call spans and error logs carry the same key form. No log line holds a
//! request or response body, a request header or a raw scope value. The idempotency key is
//! logged as sent: clients should not put secrets in it.
//!
//! ## Errors from handlers
//!
//! [`HttpError`] wraps a [`CoordError`] and answers with its problem document
//! (`IntoResponse` with the `axum` feature), so handlers that call `#[idempotent]` or
//! `#[distributed_lock]` functions can return coord's errors as they are. The mapping is in
//! [`Problem::from_coord_error`].
//!
//! ## Compared with the IETF draft and Stripe
//!
//! See [`comparison`], which also shows how the layer composes with a `#[distributed_lock]`
//! inside the handler.
//!
//! [`CallReport::key`]: coord_core::CallReport::key
//! [`CoordError`]: coord_core::CoordError
//! [`Coordinator`]: coord_core::Coordinator

mod body;
mod builder;
mod config;
mod error;
mod fingerprint;
mod key;
mod layer;
mod metrics;
pub mod problem;
mod scope;
mod stored;

pub use body::{RequestBody, ResponseBody};
pub use builder::IdempotencyLayerBuilder;
pub use config::{DEFAULT_HEADER, DEFAULT_OPERATION, OversizedResponse, Remember};
pub use error::HttpError;
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN, parse_key};
pub use layer::{Idempotency, IdempotencyLayer, REPLAYED_HEADER, ResponseFuture};
pub use metrics::Metrics;
pub use problem::{Problem, ProblemKind};
pub use scope::{SCOPE_DIGEST_LEN, ScopeDecision, ScopeSet, ScopeUnset, scope_digest};

#[doc = include_str!("../docs/comparison.md")]
pub mod comparison {}
