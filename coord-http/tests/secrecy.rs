//! No raw scope value leaves the layer: after requests that run, replay, are refused as a
//! reused key and as in flight, neither the backend's key names nor anything the process logged
//! (every level, span fields included) holds a bearer token or an e-mail address used as a
//! scope; their digests are where the values would otherwise be.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use coord_core::Coordinator;
use coord_http::{IdempotencyLayer, scope_digest};
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisServer, Resp};
use http::StatusCode;
use http::header::AUTHORIZATION;
use support::*;

const TOKEN: &str = "sk_live_alice_4242";
const BEARER: &str = "Bearer sk_live_alice_4242";
const EMAIL: &str = "alice@example.com";

/// Everything every test of this binary logged: one subscriber for the process, so events
/// from any thread of any runtime are captured.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&buffer);
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
            .with_writer(move || Captured(Arc::clone(&sink)))
            .init();
        buffer
    })
}

struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logged() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

/// Runs, replays, a reused key and an in-flight duplicate, on a layer scoped by
/// `Authorization` and one scoped by an e-mail address the application extracts.
async fn traffic(coord: &Coordinator) {
    let by_header = IdempotencyLayer::builder(coord.clone())
        .operation("pay.by_header")
        .scope_header(AUTHORIZATION)
        .build();
    let by_email = IdempotencyLayer::builder(coord.clone())
        .operation("pay.by_email")
        .scope(|request| {
            request
                .headers
                .get("x-user-email")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("anonymous")
                .to_owned()
        })
        .build();
    let client = client();
    for (layer, header, value) in [
        (by_header, "authorization", BEARER),
        (by_email, "x-user-email", EMAIL),
    ] {
        let (server, app) = start(layer).await;
        let request =
            |key: &'static str| Req::post(&server, "/charge", key).header(header, value.as_bytes());
        let first = request("order-1").send(&client).await;
        assert_eq!(first.status, StatusCode::CREATED);
        let again = request("order-1").send(&client).await;
        assert!(again.replayed());
        let reused = request("order-1").body("other").send(&client).await;
        assert_eq!(reused.status, StatusCode::UNPROCESSABLE_ENTITY);
        let slow = request("order-2")
            .header("x-delay-ms", b"400")
            .spawn(&client);
        eventually("the slow request started", || app.runs() == 2).await;
        let busy = request("order-2")
            .header("x-delay-ms", b"400")
            .send(&client)
            .await;
        assert_eq!(busy.status, StatusCode::CONFLICT);
        assert_eq!(slow.await.unwrap().status, StatusCode::CREATED);
        for reply in [&first, &again, &reused, &busy] {
            let body = String::from_utf8_lossy(&reply.body);
            assert!(!body.contains(TOKEN) && !body.contains(EMAIL), "{body}");
        }
    }
}

fn assert_no_raw_scope(what: &str, text: &str) {
    for raw in [TOKEN, EMAIL] {
        assert!(!text.contains(raw), "`{raw}` found in {what}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_logs_hold_digests_only() {
    logs();
    let coord = memory_coordinator();
    traffic(&coord).await;
    let text = logged();
    assert_no_raw_scope("the logs", &text);
    // The refusals were logged with their keys, so the check above looked at the right lines.
    let ns = coord.namespace();
    for digest in [
        scope_digest(ns, BEARER.as_bytes()),
        scope_digest(ns, EMAIL.as_bytes()),
    ] {
        assert!(
            text.contains(&format!("{digest}:order-1")),
            "no log line names the key of {digest}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keys_and_logs_hold_digests_only() {
    logs();
    let redis = RedisServer::start();
    let provider = RedisProvider::connect(&redis.url()).await.unwrap();
    let coord = Coordinator::builder()
        .namespace("secrecy")
        .provider(provider)
        .build()
        .unwrap();
    traffic(&coord).await;
    let names: Vec<String> = match redis.command(&["KEYS", "*"]) {
        Resp::Array(names) => names.iter().filter_map(Resp::text).collect(),
        other => panic!("KEYS: {other:?}"),
    };
    let all = names.join("\n");
    assert_no_raw_scope("the server's key names", &all);
    for digest in [
        scope_digest("secrecy", BEARER.as_bytes()),
        scope_digest("secrecy", EMAIL.as_bytes()),
    ] {
        assert!(
            names
                .iter()
                .any(|n| n.contains(&format!("{digest}:order-1"))),
            "no record under {digest}:\n{all}"
        );
    }
    assert_no_raw_scope("the logs", &logged());
}
