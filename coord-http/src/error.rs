//! [`CoordError`] as an HTTP response.

use std::fmt;

use bytes::Bytes;
use coord_core::CoordError;
use http::Response;

use crate::problem::Problem;

/// A [`CoordError`] that answers as an HTTP problem document.
///
/// Return it from handlers that call (or are) functions under `#[idempotent]`,
/// `#[distributed_lock]` or `#[single_flight]`: it converts from `CoordError`, so `?` works
/// and it can be the error type of an annotated function itself. With the `axum` feature it
/// implements `IntoResponse`:
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use coord_core::distributed_lock;
/// use coord_http::HttpError;
///
/// // An axum handler: a busy lock answers 409 with Retry-After, an unreachable backend 503.
/// #[distributed_lock(key_from = "tenant", lease = "30s")]
/// async fn rebuild(tenant: String) -> Result<&'static str, HttpError> {
///     Ok("rebuilt")
/// }
/// # }
/// ```
///
/// The status and problem type of each error are in [`Problem::from_coord_error`]. The
/// response never carries the error's message (which names keys and backend addresses); the
/// conversion logs it instead, at `warn` level for errors a retry may clear and `error` for the
/// others.
///
/// (`IntoResponse` cannot be implemented for `CoordError` itself outside `coord-core`; this
/// wrapper keeps `coord-core` free of any HTTP dependency.)
#[derive(Debug, Clone)]
pub struct HttpError(pub CoordError);

impl HttpError {
    /// The problem document this error answers with.
    pub fn problem(&self) -> Problem {
        Problem::from_coord_error(&self.0)
    }

    /// The error inside.
    pub fn into_inner(self) -> CoordError {
        self.0
    }

    /// The response, for any `http`-based stack: status, `application/problem+json`,
    /// `Retry-After` for retryable errors. Logs the error.
    pub fn to_response(&self) -> Response<Bytes> {
        if self.0.is_retryable() {
            tracing::warn!(error = %self.0, "coord-http: answering with a coordination error");
        } else {
            tracing::error!(error = %self.0, "coord-http: answering with a coordination error");
        }
        self.problem().to_response()
    }
}

impl From<CoordError> for HttpError {
    fn from(err: CoordError) -> Self {
        HttpError(err)
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for HttpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[cfg(feature = "axum")]
mod axum_impls {
    use axum_core::body::Body;
    use axum_core::response::{IntoResponse, Response};

    use super::HttpError;
    use crate::problem::Problem;

    impl IntoResponse for HttpError {
        fn into_response(self) -> Response {
            self.to_response().map(Body::from)
        }
    }

    impl IntoResponse for Problem {
        fn into_response(self) -> Response {
            self.to_response().map(Body::from)
        }
    }
}
