//! Handlers that return coord's errors through `HttpError` (feature `axum`): each error
//! answers with its documented status and problem type, over a real HTTP server and client.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::{Request, State};
use axum::routing::post;
use coord_core::{Coordinator, distributed_lock, idempotent};
use coord_http::HttpError;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use support::*;
use tokio::sync::watch;

/// Where a body marked `x-hold` stops until the test opens it: the test waits for the body to
/// be inside (its lock or claim taken) instead of sleeping and hoping it got there.
struct Gate {
    entered: AtomicUsize,
    open: watch::Sender<bool>,
}

impl Gate {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            entered: AtomicUsize::new(0),
            open: watch::Sender::new(false),
        })
    }

    /// Counts the body in, then waits until the gate is open.
    async fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.subscribe();
        open.wait_for(|open| *open)
            .await
            .expect("the gate outlives its bodies");
    }

    /// Waits until `count` bodies have come in.
    async fn wait_entered(&self, count: usize) {
        eventually("the held body is running", || {
            self.entered.load(Ordering::SeqCst) >= count
        })
        .await;
    }

    fn open(&self) {
        self.open.send_replace(true);
    }
}

#[derive(Clone)]
struct App {
    coord: Coordinator,
    gate: Arc<Gate>,
}

impl App {
    fn new(coord: Coordinator) -> Self {
        Self {
            coord,
            gate: Gate::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Receipt {
    id: u64,
}

#[distributed_lock(key_from = "tenant", lease = "30s", name = "test.rebuild", coordinator = coord)]
async fn rebuild(
    coord: &Coordinator,
    tenant: String,
    gate: Option<Arc<Gate>>,
) -> Result<String, HttpError> {
    if let Some(gate) = gate {
        gate.pass().await;
    }
    Ok(format!("rebuilt {tenant}"))
}

#[idempotent(
    key_from = "key",
    name = "test.charge",
    fingerprint = ["amount"],
    coordinator = coord
)]
async fn charge(
    coord: &Coordinator,
    key: Option<String>,
    amount: u64,
    gate: Option<Arc<Gate>>,
) -> Result<Receipt, HttpError> {
    if let Some(gate) = gate {
        gate.pass().await;
    }
    Ok(Receipt { id: amount })
}

fn header(request: &Request, name: &str) -> Option<String> {
    request
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

/// The gate, when the request asks its body to stop there (`x-hold`).
fn hold(app: &App, request: &Request) -> Option<Arc<Gate>> {
    header(request, "x-hold").map(|_| app.gate.clone())
}

/// The handler returns the annotated function's `Result` as it is.
async fn rebuild_handler(State(app): State<App>, request: Request) -> Result<String, HttpError> {
    rebuild(&app.coord, "acme".into(), hold(&app, &request)).await
}

async fn charge_handler(State(app): State<App>, request: Request) -> Result<String, HttpError> {
    let amount = header(&request, "x-amount").map_or(1, |v| v.parse().unwrap());
    let key = header(&request, "idempotency-key");
    let receipt = charge(&app.coord, key, amount, hold(&app, &request)).await?;
    Ok(format!("receipt {}", receipt.id))
}

async fn serve_app(app: App) -> Server {
    let router = Router::new()
        .route("/rebuild", post(rebuild_handler))
        .route("/charge", post(charge_handler))
        .with_state(app);
    serve(router).await
}

/// The lock inside a handler, behind the idempotency layer (the composition the docs show):
/// even with client errors remembered, a busy lock's 409 carries `Retry-After` and is not
/// remembered, so the retry runs once the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_behind_the_layer_is_not_remembered() {
    let coord = memory_coordinator();
    let idempotency = coord_http::IdempotencyLayer::builder(coord.clone())
        .single_principal()
        .remember(coord_http::Remember::successes_and_client_errors())
        .build();
    let app = App::new(coord);
    let router = Router::new()
        .route("/rebuild", post(rebuild_handler))
        .layer(idempotency.clone())
        .with_state(app.clone());
    let server = serve(router).await;
    let client = client();
    let holder = Req::post(&server, "/rebuild", "first")
        .header("x-hold", b"1")
        .spawn(&client);
    app.gate.wait_entered(1).await;
    let busy = Req::post(&server, "/rebuild", "second").send(&client).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(busy.problem(), "lock-not-acquired");
    app.gate.open();
    assert_eq!(holder.await.unwrap().status, StatusCode::OK);
    let retried = Req::post(&server, "/rebuild", "second").send(&client).await;
    assert_eq!(retried.status, StatusCode::OK);
    assert!(!retried.replayed());
    let replayed = Req::post(&server, "/rebuild", "second").send(&client).await;
    assert!(replayed.replayed());
    assert_eq!(idempotency.metrics().not_remembered(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_is_409_with_retry_after() {
    let app = App::new(memory_coordinator());
    let server = serve_app(app.clone()).await;
    let client = client();
    let holder = Req::post(&server, "/rebuild", "unused")
        .header("x-hold", b"1")
        .spawn(&client);
    app.gate.wait_entered(1).await;
    let busy = Req::post(&server, "/rebuild", "unused").send(&client).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(busy.problem(), "lock-not-acquired");
    assert_eq!(busy.retry_after(), Some(1));
    app.gate.open();
    let held = holder.await.unwrap();
    assert_eq!(held.status, StatusCode::OK);
    assert_eq!(&held.body[..], b"rebuilt acme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_errors_answer_as_documented() {
    let app = App::new(memory_coordinator());
    let server = serve_app(app.clone()).await;
    let client = client();
    // No key: `MissingKey` is 400.
    let keyless = Req::post(&server, "/charge", "")
        .no_key()
        .send(&client)
        .await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST);
    assert_eq!(keyless.problem(), "missing-key");
    // A duplicate while the first runs: `InFlight` is 409 with Retry-After.
    let first = Req::post(&server, "/charge", "k1")
        .header("x-hold", b"1")
        .spawn(&client);
    app.gate.wait_entered(1).await;
    let duplicate = Req::post(&server, "/charge", "k1").send(&client).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem(), "in-flight");
    assert_eq!(duplicate.retry_after(), Some(1));
    app.gate.open();
    assert_eq!(&first.await.unwrap().body[..], b"receipt 1");
    // The same key with another amount: `KeyReused` is 422.
    let reused = Req::post(&server, "/charge", "k1")
        .header("x-amount", b"2")
        .send(&client)
        .await;
    assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reused.problem(), "key-reused");
    assert!(reused.retry_after().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_is_503() {
    let (provider, coord) = switchable_coordinator();
    let server = serve_app(App::new(coord)).await;
    let client = client();
    provider.set_down(true);
    for path in ["/charge", "/rebuild"] {
        let reply = Req::post(&server, path, "k").send(&client).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert_eq!(reply.problem(), "backend-unavailable", "{path}");
        assert_eq!(reply.retry_after(), Some(1), "{path}");
    }
    provider.set_down(false);
    let reply = Req::post(&server, "/charge", "k").send(&client).await;
    assert_eq!(reply.status, StatusCode::OK);
}
