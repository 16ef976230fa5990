//! Shared pieces of the coord-http tests: a test application behind the layer, served on a
//! free loopback port, a real HTTP client, and a provider whose backend can be switched off.
#![allow(dead_code)] // each test binary uses its own subset

pub mod cases;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use coord_core::memory::MemoryProvider;
use coord_core::provider::{
    BackendErrorKind, BoxFuture, ClaimOutcome, ClaimRequest, CompleteOutcome, CompleteRequest,
    IdempotencyStore, LockGrant, LockProvider, LockRequest, OwnerToken, ReleaseOutcome,
    RenewOutcome,
};
use coord_core::{BackendError, CallKey, Coordinator};
use coord_http::{IdempotencyLayer, IdempotencyLayerBuilder, ScopeSet};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Value, json};

/// Generous bound on anything a test waits for.
pub const LONG: Duration = Duration::from_secs(20);

/// The bytes of the binary response: every byte value, then some.
pub fn binary_body() -> Vec<u8> {
    (0..=255u8)
        .chain((0..=255u8).rev())
        .chain([0, 0, 0xff, b'\r', b'\n'])
        .collect()
}

/// What the test application counts.
#[derive(Clone, Default)]
pub struct App {
    /// Handler bodies started.
    pub runs: Arc<AtomicUsize>,
    /// Handler bodies that got to their response.
    pub finished: Arc<AtomicUsize>,
}

impl App {
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }
}

fn query(request: &Request) -> Vec<(String, String)> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (p.to_owned(), String::new()),
        })
        .collect()
}

/// The handler. Query parameters steer it: `status=NNN` (default 201), `delay_ms=N` (or the
/// header `x-delay-ms`), `panic` (or the header `x-panic`), `binary` (a binary body with custom headers), `len=N` (an N-byte body, announced),
/// `stream_len=N` (an N-byte body in chunks, length not announced).
async fn handle(State(app): State<App>, request: Request) -> Response {
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let params = query(&request);
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let (parts, body) = request.into_parts();
    // Headers that are not fingerprinted steer it too, so a retry can be the same request.
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let body = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    if let Some(ms) = param("delay_ms").or_else(|| header("x-delay-ms")) {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap())).await;
    }
    if param("panic").is_some() || header("x-panic").is_some() {
        panic!("the test handler panics on purpose");
    }
    let status = param("status").map_or(StatusCode::CREATED, |s| {
        StatusCode::from_u16(s.parse().unwrap()).unwrap()
    });
    let mut response = if param("binary").is_some() {
        let mut response = Response::new(Body::from(binary_body()));
        let headers = response.headers_mut();
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.append("x-custom", HeaderValue::from_static("first"));
        headers.append(
            "x-custom",
            HeaderValue::from_bytes(b"second \xff value").unwrap(),
        );
        headers.insert(
            "x-not-stored",
            HeaderValue::from_static("only-the-first-time"),
        );
        response
    } else if let Some(len) = param("len") {
        Response::new(Body::from(vec![b'x'; len.parse().unwrap()]))
    } else if let Some(len) = param("stream_len") {
        let len: usize = len.parse().unwrap();
        let chunk = 1000;
        let chunks: Vec<Result<Bytes, std::io::Error>> = (0..len)
            .step_by(chunk)
            .map(|start| Ok(Bytes::from(vec![b'y'; chunk.min(len - start)])))
            .collect();
        Response::new(Body::from_stream(futures_util::stream::iter(chunks)))
    } else {
        let doc = json!({
            "run": run,
            "method": parts.method.as_str(),
            "path": parts.uri.path(),
            "body": String::from_utf8_lossy(&body),
        });
        let mut response = Response::new(Body::from(serde_json::to_vec(&doc).unwrap()));
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        response
    };
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("x-run", HeaderValue::from(run));
    app.finished.fetch_add(1, Ordering::SeqCst);
    response
}

/// The test application: the same handler on `/charge`, `/refund` and `/charge/other`, for
/// every method, behind `layer`.
pub fn router(app: App, layer: IdempotencyLayer) -> Router {
    let handler = axum::routing::any(handle);
    Router::new()
        .route("/charge", handler.clone())
        .route("/refund", post(handle))
        .route("/charge/other", handler)
        .layer(layer)
        .with_state(app)
}

/// The layer the cases use unless they say otherwise: keys scoped by `X-Tenant`.
pub fn layer(coordinator: Coordinator) -> IdempotencyLayerBuilder<ScopeSet> {
    IdempotencyLayer::builder(coordinator).scope(|request| {
        request
            .headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("anonymous")
            .to_owned()
    })
}

/// An axum server on a free loopback port, stopped on drop.
pub struct Server {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn serve(router: Router) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("bound address");
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serve");
    });
    Server {
        url: format!("http://{addr}"),
        task,
    }
}

/// The application behind a layer, served.
pub async fn start(layer: IdempotencyLayer) -> (Server, App) {
    let app = App::default();
    let server = serve(router(app.clone(), layer)).await;
    (server, app)
}

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    /// The run number the handler put in `x-run`.
    pub fn run(&self) -> Option<u64> {
        self.headers
            .get("x-run")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }

    /// The problem type's fragment (`in-flight`), asserting the problem document's shape.
    pub fn problem(&self) -> String {
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "not a problem document: {self:?}"
        );
        let doc = self.json();
        assert_eq!(doc["status"], self.status.as_u16(), "{doc}");
        assert!(doc["title"].is_string(), "{doc}");
        let ty = doc["type"].as_str().expect("type").to_owned();
        let (base, slug) = ty.split_once('#').expect("type has a fragment");
        assert_eq!(base, coord_http::problem::TYPE_BASE);
        slug.to_owned()
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }
}

/// A real HTTP client (no proxy: every server here is on loopback).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

/// A request to send (its builder).
pub struct Req<'a> {
    pub method: &'a str,
    pub url: String,
    pub key: Option<&'a [u8]>,
    pub tenant: Option<&'a str>,
    pub body: Vec<u8>,
    pub headers: Vec<(&'a str, &'a [u8])>,
    pub timeout: Option<Duration>,
}

impl<'a> Req<'a> {
    pub fn post(server: &Server, path_and_query: &str, key: &'a str) -> Req<'a> {
        Req::post_url(format!("{}{path_and_query}", server.url), key)
    }

    pub fn post_url(url: String, key: &'a str) -> Req<'a> {
        Req {
            method: "POST",
            url,
            key: Some(key.as_bytes()),
            tenant: None,
            body: b"{\"amount\":100}".to_vec(),
            headers: Vec::new(),
            timeout: None,
        }
    }

    pub fn method(mut self, method: &'a str) -> Self {
        self.method = method;
        self
    }

    pub fn no_key(mut self) -> Self {
        self.key = None;
        self
    }

    pub fn raw_key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    pub fn tenant(mut self, tenant: &'a str) -> Self {
        self.tenant = Some(tenant);
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    pub fn header(mut self, name: &'a str, value: &'a [u8]) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub async fn try_send(self, client: &reqwest::Client) -> Result<Reply, reqwest::Error> {
        let method = reqwest::Method::from_bytes(self.method.as_bytes()).unwrap();
        let mut request = client.request(method, &self.url).body(self.body);
        if let Some(key) = self.key {
            request = request.header("idempotency-key", HeaderValue::from_bytes(key).unwrap());
        }
        if let Some(tenant) = self.tenant {
            request = request.header("x-tenant", tenant);
        }
        for (name, value) in self.headers {
            request = request.header(name, HeaderValue::from_bytes(value).unwrap());
        }
        request = request.timeout(self.timeout.unwrap_or(LONG));
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// Sends on a task of its own.
    pub fn spawn(self, client: &reqwest::Client) -> tokio::task::JoinHandle<Reply>
    where
        'a: 'static,
    {
        let client = client.clone();
        tokio::spawn(async move { self.send(&client).await })
    }

    pub async fn send(self, client: &reqwest::Client) -> Reply {
        let url = self.url.clone();
        self.try_send(client)
            .await
            .unwrap_or_else(|e| panic!("request to {url} failed: {e}"))
    }
}

/// The in-process provider, with a switch that makes every record and lock operation fail
/// as an unreachable backend would.
#[derive(Debug, Default)]
pub struct Switchable {
    inner: MemoryProvider,
    down: AtomicBool,
}

impl Switchable {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), BackendError> {
        if self.down.load(Ordering::SeqCst) {
            Err(BackendError::new(
                BackendErrorKind::Unavailable,
                "switched off by the test",
            ))
        } else {
            Ok(())
        }
    }
}

/// Runs `op` on the inner provider unless the backend is switched off.
fn gated<'a, T: Send + 'a>(
    provider: &'a Switchable,
    op: impl FnOnce() -> BoxFuture<'a, Result<T, BackendError>> + Send + 'a,
) -> BoxFuture<'a, Result<T, BackendError>> {
    Box::pin(async move {
        provider.check()?;
        op().await
    })
}

/// Operator tools are not what these tests are about: the contract's defaults report them
/// unsupported.
impl coord_core::provider::Operations for Switchable {}

/// No shared cache here either.
impl coord_core::provider::CacheStore for Switchable {}
/// No cluster-scope single-flight: the layer does not use it.
impl coord_core::provider::FlightStore for Switchable {}
/// No semaphores: the layer does not use them.
impl coord_core::provider::SemaphoreStore for Switchable {}
impl coord_core::provider::RwLockStore for Switchable {}
impl coord_core::provider::MultiLockStore for Switchable {}

impl LockProvider for Switchable {
    fn acquire<'a>(
        &'a self,
        req: LockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<LockGrant>, BackendError>> {
        gated(self, move || self.inner.acquire(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        gated(self, move || self.inner.release(key, owner))
    }

    fn renew<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        gated(self, move || self.inner.renew(key, owner, lease))
    }
}

impl IdempotencyStore for Switchable {
    fn claim<'a>(
        &'a self,
        req: ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, BackendError>> {
        gated(self, move || self.inner.claim(req))
    }

    fn complete<'a>(
        &'a self,
        req: CompleteRequest<'a>,
    ) -> BoxFuture<'a, Result<CompleteOutcome, BackendError>> {
        gated(self, move || self.inner.complete(req))
    }

    fn abandon<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        gated(self, move || self.inner.abandon(key, owner))
    }

    fn end_marker_lease<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        gated(self, move || self.inner.end_marker_lease(key, owner))
    }

    fn wait_settled<'a>(
        &'a self,
        key: &'a CallKey,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        gated(self, move || self.inner.wait_settled(key, timeout))
    }

    fn renew_marker<'a>(
        &'a self,
        key: &'a CallKey,
        owner: OwnerToken,
        lease: Duration,
    ) -> BoxFuture<'a, Result<RenewOutcome, BackendError>> {
        gated(self, move || self.inner.renew_marker(key, owner, lease))
    }

    fn purge<'a>(&'a self, key: &'a CallKey) -> BoxFuture<'a, Result<bool, BackendError>> {
        gated(self, move || self.inner.purge(key))
    }
}

/// A coordinator over the in-process provider with a namespace of its own.
pub fn memory_coordinator() -> Coordinator {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    Coordinator::builder()
        .namespace(format!("http{}", NEXT.fetch_add(1, Ordering::Relaxed)))
        .memory()
        .build()
        .expect("coordinator")
}

/// A coordinator over a switchable in-process provider.
pub fn switchable_coordinator() -> (Arc<Switchable>, Coordinator) {
    let provider = Arc::new(Switchable::default());
    let coordinator = Coordinator::builder()
        .namespace("switchable")
        .provider(provider.clone())
        .build()
        .expect("coordinator");
    (provider, coordinator)
}

/// Polls `condition` every 10 ms until it holds, or panics after `LONG`.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + LONG;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
