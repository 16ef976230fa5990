//! The `tower` layer and service.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use coord_core::report::IdempotencyOutcome;
use coord_core::{CoordError, OnStoreError};
use http::header::{CONTENT_LENGTH, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{
    ReadError, ReadResponse, RequestBody, ResponseBody, read_request, read_response,
};
use crate::config::{Config, Options, OversizedResponse};
use crate::fingerprint::request_fingerprint;
use crate::key::{KeyError, key_from_headers};
use crate::metrics::{Event, Metrics};
use crate::problem::{Problem, ProblemKind, default_detail};
use crate::stored::{Blob, StoredBody, StoredResponse};

/// The header a replay carries, with the value `true`.
pub const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A `tower` layer that makes requests with an `Idempotency-Key` run at most once per key and
/// principal, replaying the stored response to duplicates. See the [crate docs](crate) for
/// every case.
///
/// Cheap to clone; every service it makes shares its options and its [`Metrics`].
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.config)
            .finish()
    }
}

impl IdempotencyLayer {
    pub(crate) fn from_config(config: Config) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(config),
        }
    }

    /// What this layer's services did so far.
    pub fn metrics(&self) -> &Metrics {
        &self.config.options.metrics
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around an inner service.
///
/// The inner service receives [`RequestBody`]; the client receives [`ResponseBody`].
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S> Idempotency<S> {
    /// What this service's layer did so far.
    pub fn metrics(&self) -> &Metrics {
        &self.config.options.metrics
    }
}

/// The future of [`Idempotency`]'s responses.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

impl<S, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body<Data = Bytes> + Send + 'static,
    ReqB::Error: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The clone is the one to be readied next; the readied one serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(guard(config, inner, request))
    }
}

/// How the handler's run ended, when it is not a response to store.
enum Flow<R, E> {
    /// coord refused or failed the call (the handler did not run, or its outcome is unknown).
    Coord(CoordError),
    /// A response that is not remembered: the key is freed and this is sent as is.
    Pass(R),
    /// The inner service failed.
    Service(E),
}

impl<R, E> From<CoordError> for Flow<R, E> {
    fn from(err: CoordError) -> Self {
        Flow::Coord(err)
    }
}

async fn guard<S, ReqB, ResB>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<ReqB>,
) -> Result<Response<ResponseBody<ResB>>, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>> + Send,
    S::Future: Send,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes> + Send,
    ResB::Error: Send,
{
    let options = &config.options;
    let passthrough = |response: Response<ResB>| response.map(ResponseBody::streaming);
    if !options.methods.contains(request.method()) {
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, RequestBody::streaming(body));
        return inner.call(request).await.map(passthrough);
    }
    let metrics = &options.metrics;
    let key = match key_from_headers(request.headers(), &options.header) {
        Ok(Some(key)) => key,
        Ok(None) if !options.require_key => {
            metrics.count(Event::Unprotected);
            let (parts, body) = request.into_parts();
            let request = Request::from_parts(parts, RequestBody::streaming(body));
            return inner.call(request).await.map(passthrough);
        }
        Ok(None) => {
            metrics.count(Event::InvalidKey);
            return Ok(problem_response(
                Problem::new(ProblemKind::MissingKey)
                    .detail(KeyError::Missing.describe(&options.header)),
            ));
        }
        Err(err) => {
            metrics.count(Event::InvalidKey);
            return Ok(problem_response(
                Problem::new(ProblemKind::InvalidKey)
                    .detail(err.describe(&options.header))
                    .extension("reason", key_error_reason(err)),
            ));
        }
    };

    let (parts, body) = request.into_parts();
    let read = match read_request(body, options.max_request_body).await {
        Ok(read) => read,
        Err(ReadError::TooLarge) => {
            metrics.count(Event::RequestRefused);
            return Ok(problem_response(
                Problem::new(ProblemKind::RequestTooLarge).detail(format!(
                    "The request body is larger than {} bytes.",
                    options.max_request_body
                )),
            ));
        }
        Err(ReadError::Failed(_)) => {
            metrics.count(Event::RequestRefused);
            return Ok(problem_response(
                Problem::new(ProblemKind::RequestBodyUnreadable)
                    .detail(default_detail(ProblemKind::RequestBodyUnreadable)),
            ));
        }
    };
    let fingerprint = request_fingerprint(&parts, &options.fingerprint_headers, &read.data);
    // The principal, as its digest (never the raw value): the record key, and so every log
    // line, report and backend name derived from it, carries only this.
    let scope = config
        .scope
        .key_part(options.coordinator.namespace(), &parts);
    let call_key = options
        .coordinator
        .key(&options.operation)
        .part(scope.as_str())
        .part(key.as_str())
        .finish();
    let request = Request::from_parts(parts, RequestBody::buffered(read.data, read.trailers));

    // The response of the run below, when this request's handler ran and its response is to
    // be sent: the stored copy is what the run returns.
    let mut ran: Option<Response<ResponseBody<ResB>>> = None;
    let handler = async {
        let response = inner.call(request).await.map_err(Flow::Service)?;
        let (head, body) = response.into_parts();
        if !remembered(options, head.status, &head.headers) {
            return Err(Flow::Pass(Response::from_parts(
                head,
                ResponseBody::streaming(body),
            )));
        }
        match read_response(body, options.max_stored_body).await {
            ReadResponse::Complete { data, trailers } => {
                let stored = StoredResponse::capture(
                    head.status,
                    &head.headers,
                    &options.stored_headers,
                    StoredBody::Complete(Blob(data.clone())),
                );
                ran = Some(Response::from_parts(
                    head,
                    ResponseBody::full_with_trailers(data, trailers),
                ));
                Ok(stored)
            }
            ReadResponse::TooLarge {
                prefix,
                rest,
                announced,
            } => {
                let stored = StoredResponse::capture(
                    head.status,
                    &head.headers,
                    &options.stored_headers,
                    StoredBody::TooLarge { len: announced },
                );
                let response = Response::from_parts(head, ResponseBody::resumed(prefix, rest));
                options.metrics.count(Event::Oversized);
                tracing::warn!(
                    status = stored.status,
                    limit = options.max_stored_body,
                    policy = ?options.oversized,
                    "coord-http: response body too large to store"
                );
                match options.oversized {
                    OversizedResponse::Forget => Err(Flow::Pass(response)),
                    OversizedResponse::Unreplayable => {
                        ran = Some(response);
                        Ok(stored)
                    }
                }
            }
            ReadResponse::Failed { prefix, error } => Err(Flow::Pass(Response::from_parts(
                head,
                ResponseBody::failed(prefix, error),
            ))),
        }
    };
    let (result, report) = options
        .coordinator
        .idempotent(call_key)
        .retention(options.retention)
        .in_flight_lease(options.in_flight_lease)
        .wait(options.wait)
        .on_abandoned(options.on_abandoned)
        .on_backend_error(options.on_backend_error)
        // The handler's response is the truth about what happened: it is sent even when it
        // could not be stored (counted, logged by coord).
        .on_store_error(OnStoreError::ReturnOk)
        .fingerprint(fingerprint)
        .run_reported(|| handler)
        .await;

    match result {
        Ok(stored) => match ran.take() {
            Some(response) => {
                match report.idempotency() {
                    Some(IdempotencyOutcome::FailedOpen) => metrics.count(Event::FailedOpen),
                    Some(IdempotencyOutcome::NotStored) => metrics.count(Event::NotStored),
                    _ if matches!(stored.body, StoredBody::TooLarge { .. }) => {}
                    _ => metrics.count(Event::Executed),
                }
                Ok(response)
            }
            None => {
                metrics.count(Event::Replayed);
                Ok(replay(&stored, options))
            }
        },
        Err(Flow::Pass(response)) => {
            if report.idempotency() == Some(IdempotencyOutcome::FailedOpen) {
                metrics.count(Event::FailedOpen);
            } else {
                metrics.count(Event::NotRemembered);
            }
            Ok(response)
        }
        Err(Flow::Service(err)) => Err(err),
        Err(Flow::Coord(err)) => {
            let problem = Problem::from_coord_error(&err).retry_after(options.retry_after);
            metrics.count(match problem.kind() {
                ProblemKind::InFlight => Event::InFlight,
                ProblemKind::KeyReused => Event::KeyReused,
                ProblemKind::OutcomeUnknown => Event::OutcomeUnknown,
                _ => Event::BackendError,
            });
            tracing::debug!(error = %err, "coord-http: request refused");
            Ok(problem_response(problem))
        }
    }
}

/// Whether a response is stored: the configured rule, except that a failure which tells the
/// client to come back later (`Retry-After` on a non-`2xx`) is never final.
fn remembered(options: &Options, status: StatusCode, headers: &HeaderMap) -> bool {
    options.remember.remembers(status)
        && (status.is_success() || !headers.contains_key(RETRY_AFTER))
}

/// The reply to a duplicate: the stored status, headers and body, marked as a replay.
fn replay<B: Body>(stored: &StoredResponse, options: &Options) -> Response<ResponseBody<B>> {
    let mut response = match (&stored.body, stored.status()) {
        (StoredBody::Complete(Blob(body)), Some(status)) => {
            let mut response = Response::new(ResponseBody::full(body.clone()));
            *response.status_mut() = status;
            *response.headers_mut() = stored.header_map();
            response
                .headers_mut()
                .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
            response
        }
        (StoredBody::TooLarge { len }, _) => {
            let mut problem = Problem::new(ProblemKind::ResponseNotReplayable)
                .detail(default_detail(ProblemKind::ResponseNotReplayable))
                .extension("original_status", stored.status);
            if let Some(len) = len {
                problem = problem.extension("original_length", *len);
            }
            problem_response(problem)
        }
        (StoredBody::Complete(_), None) => {
            tracing::error!(
                status = stored.status,
                "coord-http: a stored response has a status HTTP cannot send"
            );
            options.metrics.count(Event::BackendError);
            return problem_response(
                Problem::new(ProblemKind::Internal).detail(default_detail(ProblemKind::Internal)),
            );
        }
    };
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

fn problem_response<B: Body>(problem: Problem) -> Response<ResponseBody<B>> {
    problem.to_response().map(ResponseBody::full)
}

fn key_error_reason(err: KeyError) -> &'static str {
    match err {
        KeyError::Missing => "missing",
        KeyError::Repeated => "repeated",
        KeyError::Empty => "empty",
        KeyError::TooLong => "too-long",
        KeyError::NotVisibleAscii => "not-visible-ascii",
        KeyError::MalformedString => "malformed-string",
    }
}
