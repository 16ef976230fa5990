//! What the README examples take for granted: the application's own types and functions
//! (`Order`, `Receipt`, `PaymentError`, `fetch`, ...), and the coord names a reader expects in
//! scope without a `use` line (the attributes, `Coordinator`, `Duration`, ...).
//!
//! Every generated example file declares this module and glob-imports it, so an item an
//! example declares itself takes precedence over one of the same name here. The examples are
//! compiled, never run: these bodies only have to type-check and say what they stand for.
//! See `tests/tests/readme_examples.rs` for how the examples are wrapped.

pub use std::sync::Arc;
pub use std::time::Duration;

pub use coord_core::provider::Fingerprint;
pub use coord_core::{
    CoordConfig, CoordError, Coordinator, FencingToken, cached, distributed_lock, idempotent,
    single_flight,
};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// An order to charge.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    pub id: String,
    pub cents: u64,
}

/// What a charge returns; stored and replayed by `#[idempotent]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Receipt {
    pub order_id: String,
    pub cents: u64,
}

/// Why a charge failed.
#[derive(Debug)]
pub enum PaymentError {
    /// The request was not an order.
    BadRequest,
    /// coord refused or could not guard the call.
    Coord(CoordError),
    /// The application's own database statement failed.
    Database(coord_postgres::tokio_postgres::Error),
}

impl From<CoordError> for PaymentError {
    fn from(err: CoordError) -> Self {
        PaymentError::Coord(err)
    }
}

impl From<coord_postgres::tokio_postgres::Error> for PaymentError {
    fn from(err: coord_postgres::tokio_postgres::Error) -> Self {
        PaymentError::Database(err)
    }
}

/// A price, shared between concurrent callers and cached.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Quote {
    pub symbol: String,
    pub cents: u64,
}

/// Why a quote failed: cloneable, so that callers sharing a flight can each get it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum QuoteError {
    /// The upstream price feed failed.
    Upstream(String),
    /// coord refused or could not guard the call.
    Coord(String),
}

impl From<CoordError> for QuoteError {
    fn from(err: CoordError) -> Self {
        QuoteError::Coord(err.to_string())
    }
}

/// A tenant, as a key part.
pub type TenantId = u64;

/// Why a background job failed.
#[derive(Debug)]
pub enum JobError {
    /// coord refused or could not guard the call (the lock is held elsewhere, ...).
    Coord(CoordError),
}

impl From<CoordError> for JobError {
    fn from(err: CoordError) -> Self {
        JobError::Coord(err)
    }
}

/// The payment provider.
pub struct PaymentGateway;

impl PaymentGateway {
    pub async fn charge(&self, order: Order) -> Result<Receipt, PaymentError> {
        charge(order).await
    }
}

/// The search index rebuilt per tenant.
pub struct SearchIndex;

impl SearchIndex {
    pub async fn rebuild(&self, _tenant: TenantId) -> Result<(), JobError> {
        Ok(())
    }
}

/// The upstream price feed.
pub struct PriceFeed;

impl PriceFeed {
    pub async fn fetch(&self, symbol: &str) -> Result<Quote, QuoteError> {
        fetch(symbol).await
    }
}

/// The service whose methods the examples call (`service.charge(key, order)`). A block
/// marked `rust,methods` declares methods of a `Service` of its own, with these fields.
pub struct Service {
    pub payments: PaymentGateway,
    pub index: SearchIndex,
    pub prices: PriceFeed,
}

impl Service {
    #[idempotent(key_from = "idempotency_key", retention = "24h")]
    pub async fn charge(
        &self,
        idempotency_key: String,
        order: Order,
    ) -> Result<Receipt, PaymentError> {
        self.payments.charge(order).await
    }
}

/// Charges an order: a plain function, and an axum handler (the order from a JSON body).
pub async fn charge(order: Order) -> Result<Receipt, PaymentError> {
    Ok(Receipt {
        order_id: order.id,
        cents: order.cents,
    })
}

/// Asks the upstream price feed.
pub async fn fetch(symbol: &str) -> Result<Quote, QuoteError> {
    Ok(Quote {
        symbol: symbol.to_owned(),
        cents: 100,
    })
}

/// Writes to the protected resource, with the fencing token it checks.
pub fn write_with(token: Option<FencingToken>) {
    let _ = token;
}

/// The tenant a request is for, as the authentication layer verified it.
pub fn tenant_of(request: &Parts) -> String {
    request
        .headers
        .get("x-tenant")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned()
}

/// The in-process coordinator a provider's conformance run starts each case with.
pub async fn fresh_coordinator() -> Coordinator {
    Coordinator::builder()
        .memory()
        .build()
        .expect("an in-process coordinator builds")
}

impl<S: Send + Sync> FromRequest<S> for Order {
    type Rejection = PaymentError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let body = Bytes::from_request(request, state)
            .await
            .map_err(|_| PaymentError::BadRequest)?;
        serde_json::from_slice(&body).map_err(|_| PaymentError::BadRequest)
    }
}

impl IntoResponse for Receipt {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&self).unwrap_or_default();
        (StatusCode::CREATED, body).into_response()
    }
}

impl IntoResponse for PaymentError {
    fn into_response(self) -> Response {
        match self {
            PaymentError::BadRequest => StatusCode::BAD_REQUEST.into_response(),
            PaymentError::Coord(err) => coord_http::HttpError::from(err).into_response(),
            PaymentError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    }
}

/// The PostgreSQL provider's wrapper of the application's open transaction, in which
/// `#[idempotent(transaction = ..)]` writes the completed record; and the provider itself.
pub use coord_postgres::{PostgresProvider, Transaction};
