//! The payments service of the `payments_http` example: a charge endpoint behind coord-http's
//! `Idempotency-Key` layer. In the library so that tests can start instances of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::{get, post};
use coord_core::Coordinator;
use coord_http::IdempotencyLayer;
use serde::Deserialize;
use serde_json::json;

/// The namespace the tests' instances of the service use (the example binary takes its own
/// name, `payments_http`, as any application that names none).
pub const NAMESPACE: &str = "payments-example";

/// What one instance counts.
#[derive(Debug, Default)]
pub struct Payments {
    runs: AtomicU64,
}

impl Payments {
    /// How many times the charge handler's body has run in this instance.
    pub fn charges(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

#[derive(Deserialize)]
struct ChargeRequest {
    amount: u64,
    currency: String,
    #[serde(default)]
    delay_ms: Option<u64>,
}

fn json_response(status: StatusCode, value: serde_json::Value) -> Response {
    let mut response = Response::new(Body::from(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// `POST /payments`: charges once per key; `amount` 0 is refused by the handler (400, not
/// remembered: a corrected retry with the same key would be a different request, a plain
/// retry runs the handler again).
async fn charge(State(payments): State<Arc<Payments>>, body: Bytes) -> Response {
    payments.runs.fetch_add(1, Ordering::SeqCst);
    let request: ChargeRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(err) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({"error": format!("invalid charge request: {err}")}),
            );
        }
    };
    if request.amount == 0 {
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "amount must be greater than zero"}),
        );
    }
    if request.currency.len() != 3 || !request.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return json_response(
            StatusCode::BAD_REQUEST,
            json!({"error": "currency must be three letters"}),
        );
    }
    if let Some(ms) = request.delay_ms {
        // Stands in for a slow call to the payment provider.
        tokio::time::sleep(Duration::from_millis(ms.min(60_000))).await;
    }
    let id = format!("ch_{:016x}", rand::random::<u64>());
    json_response(
        StatusCode::CREATED,
        json!({
            "id": id,
            "amount": request.amount,
            "currency": request.currency.to_ascii_uppercase(),
        }),
    )
}

/// `GET /payments/charges`: `{"charges": N}`.
async fn charges(State(payments): State<Arc<Payments>>) -> Response {
    json_response(StatusCode::OK, json!({"charges": payments.charges()}))
}

/// The operation name the example's records are stored under.
pub const OPERATION: &str = "payments.http";

/// The header whose value is the caller, for the idempotency layer.
pub const TENANT_HEADER: HeaderName = HeaderName::from_static("x-tenant");

/// The service: its router (with the idempotency layer) and its counter.
///
/// Keys are scoped by the `X-Tenant` header: one tenant's `Idempotency-Key` never replays
/// another tenant's charge, and requests without the header are one more tenant. A real
/// service would scope by the principal its authentication layer verified, with
/// `.scope(|request| ..)` reading it from the request's extensions, instead of trusting a
/// header.
pub fn app(coordinator: Coordinator) -> (Router, Arc<Payments>) {
    let payments = Arc::new(Payments::default());
    let idempotency = IdempotencyLayer::builder(coordinator)
        .operation(OPERATION)
        .scope_header(TENANT_HEADER)
        .build();
    let router = Router::new()
        .route("/payments", post(charge))
        .route("/payments/charges", get(charges))
        .layer(idempotency)
        .with_state(Arc::clone(&payments));
    (router, payments)
}
