//! The semantics of the layer, one case per row of the crate docs' table, each a function of
//! the coordinator it runs on (in-process or Redis).

use std::time::{Duration, Instant};

use coord_core::{Coordinator, OnAbandoned};
use coord_http::{IdempotencyLayer, OversizedResponse, Remember};
use http::header::AUTHORIZATION;
use http::{HeaderName, StatusCode};

use super::*;

/// A remembered response is replayed with its status, stored headers and exact body, plus
/// `Idempotent-Replayed: true`; the handler runs once.
pub async fn replays_exactly(coord: Coordinator) {
    let layer = layer(coord).build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let first = Req::post(&server, "/charge", "k-1").send(&client).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.json()["run"], 1);
    for _ in 0..3 {
        let again = Req::post(&server, "/charge", "k-1").send(&client).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(again.headers["content-type"], "application/json");
        assert_eq!(
            again.headers["content-length"],
            first.body.len().to_string()
        );
        // `x-run` is not among the stored headers.
        assert_eq!(again.run(), None);
    }
    assert_eq!(app.runs(), 1);
    assert_eq!(layer.metrics().executed(), 1);
    assert_eq!(layer.metrics().replayed(), 3);
    // Another key runs.
    let other = Req::post(&server, "/charge", "k-2").send(&client).await;
    assert!(!other.replayed());
    assert_eq!(app.runs(), 2);
}

/// The structured-field string form and the bare form name the same key.
pub async fn quoted_and_bare_forms_share_a_key(coord: Coordinator) {
    let (server, app) = start(layer(coord).build()).await;
    let client = client();
    let first = Req::post(&server, "/charge", "\"order-7\"")
        .send(&client)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let bare = Req::post(&server, "/charge", "order-7").send(&client).await;
    assert!(bare.replayed());
    assert_eq!(bare.body, first.body);
    let escaped = Req::post(&server, "/charge", r#""a\"b""#)
        .send(&client)
        .await;
    assert!(!escaped.replayed());
    let escaped_bare = Req::post(&server, "/charge", r#"a"b"#).send(&client).await;
    assert!(escaped_bare.replayed());
    assert_eq!(app.runs(), 2);
}

/// Without a key, a guarded request is refused by default, and runs unprotected (counted) when
/// the key is optional.
pub async fn missing_key(coord: Coordinator) {
    let required = layer(coord.clone()).build();
    let (server, app) = start(required.clone()).await;
    let client = client();
    let reply = Req::post(&server, "/charge", "")
        .no_key()
        .send(&client)
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem(), "missing-key");
    assert_eq!(app.runs(), 0);
    assert_eq!(required.metrics().invalid_key(), 1);

    let optional = layer(coord).require_key(false).build();
    let (server, app) = start(optional.clone()).await;
    for run in 1..=2 {
        let reply = Req::post(&server, "/charge", "")
            .no_key()
            .send(&client)
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed());
        assert_eq!(reply.json()["run"], run);
    }
    assert_eq!(app.runs(), 2);
    assert_eq!(optional.metrics().unprotected(), 2);
}

/// Empty, too long, not visible ASCII, repeated and malformed keys are 400 with a reason;
/// the handler never runs.
pub async fn invalid_keys(coord: Coordinator) {
    let (server, app) = start(layer(coord).build()).await;
    let client = client();
    let too_long = "k".repeat(256);
    let longest = "k".repeat(255);
    let cases: Vec<(&[u8], &str)> = vec![
        (b"", "empty"),
        (b"\"\"", "empty"),
        (too_long.as_bytes(), "too-long"),
        (b"a b", "not-visible-ascii"),
        (b"\"a b\"", "not-visible-ascii"),
        (b"caf\xe9", "not-visible-ascii"),
        (b"\"abc", "malformed-string"),
        (b"\"abc\"x", "malformed-string"),
        (b"\"a\\b\"", "malformed-string"),
    ];
    for (key, reason) in cases {
        let reply = Req::post(&server, "/charge", "")
            .raw_key(key)
            .send(&client)
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{key:?}");
        assert_eq!(reply.problem(), "invalid-key", "{key:?}");
        assert_eq!(reply.json()["reason"], reason, "{key:?}");
    }
    let repeated = Req::post(&server, "/charge", "a")
        .header("idempotency-key", b"b")
        .send(&client)
        .await;
    assert_eq!(repeated.status, StatusCode::BAD_REQUEST);
    assert_eq!(repeated.json()["reason"], "repeated");
    assert_eq!(app.runs(), 0);
    // 255 characters are fine.
    let ok = Req::post(&server, "/charge", &longest).send(&client).await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(app.runs(), 1);
}

/// The same key with a different method, path, query, body or fingerprinted header is 422,
/// and the stored response stays the first request's.
pub async fn reused_key_for_another_request(coord: Coordinator) {
    let layer = layer(coord)
        .methods([http::Method::POST, http::Method::PATCH, http::Method::PUT])
        .fingerprint_headers([HeaderName::from_static("x-api-version")])
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let first = Req::post(&server, "/charge", "reused")
        .header("x-api-version", b"1")
        .send(&client)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let variants = vec![
        Req::post(&server, "/charge", "reused")
            .header("x-api-version", b"1")
            .body("{\"amount\":101}"),
        Req::post(&server, "/charge/other", "reused").header("x-api-version", b"1"),
        Req::post(&server, "/charge?x=1", "reused").header("x-api-version", b"1"),
        Req::post(&server, "/charge", "reused")
            .header("x-api-version", b"1")
            .method("PATCH"),
        Req::post(&server, "/charge", "reused").header("x-api-version", b"2"),
        Req::post(&server, "/charge", "reused"),
        Req::post(&server, "/refund", "reused").header("x-api-version", b"1"),
    ];
    for variant in variants {
        let reply = variant.send(&client).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(reply.problem(), "key-reused");
        assert!(reply.retry_after().is_none());
    }
    assert_eq!(layer.metrics().key_reused(), 7);
    // Headers that are not fingerprinted do not count; the stored response is untouched.
    let same = Req::post(&server, "/charge", "reused")
        .header("x-api-version", b"1")
        .header("x-trace", b"other")
        .send(&client)
        .await;
    assert!(same.replayed());
    assert_eq!(same.body, first.body);
    assert_eq!(app.runs(), 1);
}

/// A duplicate of a request still running is 409 with Retry-After; once the first finishes,
/// the duplicate gets the replay.
pub async fn in_flight_duplicate_is_409(coord: Coordinator) {
    let layer = layer(coord)
        .retry_after(Duration::from_millis(2500))
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let slow = Req::post(&server, "/charge?delay_ms=700", "slow").spawn(&client);
    eventually("the first request started", || app.runs() == 1).await;
    let duplicate = Req::post(&server, "/charge?delay_ms=700", "slow")
        .send(&client)
        .await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(duplicate.problem(), "in-flight");
    assert_eq!(duplicate.retry_after(), Some(3));
    let first = slow.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    let after = Req::post(&server, "/charge?delay_ms=700", "slow")
        .send(&client)
        .await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(app.runs(), 1);
    assert_eq!(layer.metrics().in_flight(), 1);
}

/// With a wait, a duplicate waits for the first request and gets its replay.
pub async fn duplicate_waits_and_replays(coord: Coordinator) {
    let (server, app) = start(layer(coord).wait(Duration::from_secs(10)).build()).await;
    let client = client();
    let slow = Req::post(&server, "/charge?delay_ms=500", "waited").spawn(&client);
    eventually("the first request started", || app.runs() == 1).await;
    let duplicate = Req::post(&server, "/charge?delay_ms=500", "waited")
        .send(&client)
        .await;
    let first = slow.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(duplicate.status, StatusCode::CREATED);
    assert!(duplicate.replayed());
    assert_eq!(duplicate.body, first.body);
    assert_eq!(app.runs(), 1);
}

/// A waiting duplicate whose first request fails (not remembered) runs itself.
pub async fn waiter_runs_when_the_first_fails(coord: Coordinator) {
    let (server, app) = start(layer(coord).wait(Duration::from_secs(10)).build()).await;
    let client = client();
    let failing =
        Req::post(&server, "/charge?delay_ms=500&status=503", "fails-first").spawn(&client);
    eventually("the first request started", || app.runs() == 1).await;
    // Same key, same request: the query is part of the fingerprint.
    let duplicate = Req::post(&server, "/charge?delay_ms=500&status=503", "fails-first")
        .send(&client)
        .await;
    assert_eq!(
        failing.await.unwrap().status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(duplicate.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!duplicate.replayed());
    assert_eq!(duplicate.run(), Some(2));
    assert_eq!(app.runs(), 2);
}

/// By default only 2xx is remembered: a failure leaves no trace and a retry runs again.
pub async fn failures_are_not_remembered(coord: Coordinator) {
    let layer = layer(coord).build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    for (n, status) in [400u16, 422, 500, 503].into_iter().enumerate() {
        let key = format!("failure-{status}");
        let path = format!("/charge?status={status}");
        let first = Req::post(&server, &path, &key).send(&client).await;
        let second = Req::post(&server, &path, &key).send(&client).await;
        assert_eq!(first.status.as_u16(), status);
        assert_eq!(second.status.as_u16(), status);
        assert!(!second.replayed());
        assert_eq!(second.run(), Some(2 * n as u64 + 2));
    }
    assert_eq!(app.runs(), 8);
    assert_eq!(layer.metrics().not_remembered(), 8);
    // A success after a failure with the same key is remembered.
    let fixed = Req::post(&server, "/charge?status=400", "failure-400")
        .send(&client)
        .await;
    assert_eq!(fixed.status, StatusCode::BAD_REQUEST);
    let ok = Req::post(&server, "/charge", "fresh").send(&client).await;
    let again = Req::post(&server, "/charge", "fresh").send(&client).await;
    assert!(!ok.replayed());
    assert!(again.replayed());
}

/// Configured to, the layer remembers the client errors a handler returns (but not 429).
pub async fn client_errors_remembered_when_configured(coord: Coordinator) {
    let layer = layer(coord)
        .remember(Remember::successes_and_client_errors())
        .build();
    let (server, app) = start(layer).await;
    let client = client();
    let first = Req::post(&server, "/charge?status=402", "declined")
        .send(&client)
        .await;
    let again = Req::post(&server, "/charge?status=402", "declined")
        .send(&client)
        .await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let limited = Req::post(&server, "/charge?status=429", "limited")
        .send(&client)
        .await;
    let retried = Req::post(&server, "/charge?status=429", "limited")
        .send(&client)
        .await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(!retried.replayed());
    let failed = Req::post(&server, "/charge?status=500", "server")
        .send(&client)
        .await;
    let retried = Req::post(&server, "/charge?status=500", "server")
        .send(&client)
        .await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!retried.replayed());
    assert_eq!(app.runs(), 5);
}

/// A binary body and custom headers (two values, one with a non-ASCII byte) are replayed byte
/// for byte; headers not listed are not.
pub async fn binary_body_and_custom_headers(coord: Coordinator) {
    let layer = layer(coord)
        .stored_headers([
            HeaderName::from_static("content-type"),
            HeaderName::from_static("x-custom"),
        ])
        .build();
    let (server, app) = start(layer).await;
    let client = client();
    let first = Req::post(&server, "/charge?binary", "bin")
        .send(&client)
        .await;
    assert_eq!(&first.body[..], &binary_body()[..]);
    let again = Req::post(&server, "/charge?binary", "bin")
        .send(&client)
        .await;
    assert!(again.replayed());
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(&again.body[..], &binary_body()[..]);
    let custom: Vec<&[u8]> = again
        .headers
        .get_all("x-custom")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    assert_eq!(custom, [&b"first"[..], &b"second \xff value"[..]]);
    assert_eq!(again.headers["content-type"], "application/octet-stream");
    assert!(first.headers.contains_key("x-not-stored"));
    assert!(!again.headers.contains_key("x-not-stored"));
    assert_eq!(app.runs(), 1);
}

/// A response over the stored-body limit reaches its client whole; by default a duplicate is
/// told it cannot be replayed, and the handler does not run again.
pub async fn oversized_response_is_unreplayable(coord: Coordinator) {
    let layer = layer(coord).max_stored_body(4096).build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    for (path, key) in [
        ("/charge?len=10000", "announced"),
        ("/charge?stream_len=10000", "streamed"),
    ] {
        let first = Req::post(&server, path, key).send(&client).await;
        assert_eq!(first.status, StatusCode::CREATED, "{path}");
        assert_eq!(first.body.len(), 10_000, "{path}");
        let duplicate = Req::post(&server, path, key).send(&client).await;
        assert_eq!(duplicate.status, StatusCode::CONFLICT, "{path}");
        assert_eq!(duplicate.problem(), "response-not-replayable", "{path}");
        assert_eq!(duplicate.json()["original_status"], 201, "{path}");
        assert!(duplicate.replayed(), "{path}");
        assert!(duplicate.retry_after().is_none(), "{path}");
    }
    assert_eq!(app.runs(), 2);
    assert_eq!(layer.metrics().oversized(), 2);
    // Within the limit, the same route is replayed.
    let small = Req::post(&server, "/charge?stream_len=4096", "fits")
        .send(&client)
        .await;
    let again = Req::post(&server, "/charge?stream_len=4096", "fits")
        .send(&client)
        .await;
    assert!(again.replayed());
    assert_eq!(again.body, small.body);
}

/// With `OversizedResponse::Forget`, an oversized response frees its key: a duplicate runs.
pub async fn oversized_response_forgotten(coord: Coordinator) {
    let layer = layer(coord)
        .max_stored_body(4096)
        .on_oversized_response(OversizedResponse::Forget)
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    for run in 1..=2 {
        let reply = Req::post(&server, "/charge?stream_len=9000", "big")
            .send(&client)
            .await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(reply.body.len(), 9000);
        assert!(!reply.replayed());
        assert_eq!(reply.run(), Some(run));
    }
    assert_eq!(app.runs(), 2);
}

/// A request body over the limit is 413 and nothing runs.
pub async fn request_body_over_the_limit(coord: Coordinator) {
    let layer = layer(coord).max_request_body(1000).build();
    let (server, app) = start(layer).await;
    let client = client();
    let reply = Req::post(&server, "/charge", "big-request")
        .body(vec![b'z'; 1001])
        .send(&client)
        .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.problem(), "request-too-large");
    let fits = Req::post(&server, "/charge", "big-request")
        .body(vec![b'z'; 1000])
        .send(&client)
        .await;
    assert_eq!(fits.status, StatusCode::CREATED);
    assert_eq!(app.runs(), 1);
}

/// Retries `send` while it is answered 409, for at most five seconds (far less than the
/// 30-second lease the callers use, so a key left blocked fails the test).
async fn retry_while_in_flight(
    mut send: impl FnMut() -> Req<'static>,
    client: &reqwest::Client,
) -> Reply {
    let started = Instant::now();
    loop {
        let reply = send().send(client).await;
        if reply.status != StatusCode::CONFLICT {
            return reply;
        }
        assert_eq!(reply.problem(), "in-flight");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the key stayed blocked"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A handler that panics leaves no stuck key: the retry (the same request: `x-panic` is not
/// fingerprinted) runs at once rather than after the 30-second lease.
pub async fn panic_frees_the_key(coord: Coordinator) {
    let layer = layer(coord)
        .in_flight_lease(Duration::from_secs(30))
        .build();
    let (server, app) = start(layer).await;
    let client = client();
    let crashed = Req::post(&server, "/charge", "panics")
        .header("x-panic", b"1")
        .try_send(&client)
        .await;
    assert!(
        crashed.is_err(),
        "a panicking handler gives no response: {crashed:?}"
    );
    let url = server.url.clone();
    let retry =
        retry_while_in_flight(|| Req::post_url(format!("{url}/charge"), "panics"), &client).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(app.runs(), 2);
}

/// Under `on_abandoned(Fail)`, a panic makes the key `outcome-unknown` at once: the marker's
/// lease is ended in the background as the panic unwinds, so a retry may find it `in-flight`
/// for a moment, never for anything near the 30-second lease, and never runs the handler again.
pub async fn panic_under_fail_is_outcome_unknown(coord: Coordinator) {
    let layer = layer(coord)
        .in_flight_lease(Duration::from_secs(30))
        .on_abandoned(OnAbandoned::Fail)
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let crashed = Req::post(&server, "/charge?panic", "at-most-once")
        .try_send(&client)
        .await;
    assert!(crashed.is_err());
    let started = Instant::now();
    let after = loop {
        let reply = Req::post(&server, "/charge?panic", "at-most-once")
            .send(&client)
            .await;
        assert_eq!(reply.status, StatusCode::CONFLICT);
        if reply.problem() != "in-flight" {
            break reply;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the key stayed in flight for the work that panicked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(after.problem(), "outcome-unknown");
    assert!(after.retry_after().is_none());
    assert_eq!(app.runs(), 1);
    assert_eq!(layer.metrics().outcome_unknown(), 1);
}

/// A client that disconnects mid-request leaves no stuck key: the server drops the request,
/// the key is freed, and a retry runs long before the handler (10 s) or the lease (30 s) would
/// have ended.
pub async fn client_disconnect_frees_the_key(coord: Coordinator) {
    let layer = layer(coord)
        .in_flight_lease(Duration::from_secs(30))
        .build();
    let (server, app) = start(layer).await;
    let client = client();
    let gone = Req::post(&server, "/charge", "hung-up")
        .header("x-delay-ms", b"10000")
        .timeout(Duration::from_millis(300))
        .try_send(&client)
        .await;
    assert!(gone.is_err(), "the client gave up: {gone:?}");
    let url = server.url.clone();
    let retry = retry_while_in_flight(
        || Req::post_url(format!("{url}/charge"), "hung-up"),
        &client,
    )
    .await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(retry.run(), Some(2));
    assert_eq!(
        app.finished(),
        1,
        "the first handler was dropped, never finished"
    );
}

/// Two principals with the same key get two runs and two different responses.
pub async fn tenants_do_not_share_keys(coord: Coordinator) {
    let (server, app) = start(layer(coord).build()).await;
    let client = client();
    let a = Req::post(&server, "/charge", "shared")
        .tenant("acme")
        .send(&client)
        .await;
    let b = Req::post(&server, "/charge", "shared")
        .tenant("globex")
        .send(&client)
        .await;
    assert!(!a.replayed());
    assert!(!b.replayed());
    assert_ne!(a.body, b.body);
    let a2 = Req::post(&server, "/charge", "shared")
        .tenant("acme")
        .send(&client)
        .await;
    let b2 = Req::post(&server, "/charge", "shared")
        .tenant("globex")
        .send(&client)
        .await;
    assert_eq!(a2.body, a.body);
    assert_eq!(b2.body, b.body);
    // A scope cannot reach into a key by containing the separator.
    let forged = Req::post(&server, "/charge", "x")
        .tenant("acme:shared")
        .send(&client)
        .await;
    assert!(!forged.replayed());
    assert_eq!(app.runs(), 3);
}

/// Methods the layer does not guard pass through, key or not.
pub async fn unguarded_methods_pass_through(coord: Coordinator) {
    let (server, app) = start(layer(coord).build()).await;
    let client = client();
    for method in ["GET", "PUT", "DELETE"] {
        for _ in 0..2 {
            let reply = Req::post(&server, "/charge", "same-key")
                .method(method)
                .send(&client)
                .await;
            assert_eq!(reply.status, StatusCode::CREATED, "{method}");
            assert!(!reply.replayed(), "{method}");
        }
        let keyless = Req::post(&server, "/charge", "")
            .no_key()
            .method(method)
            .send(&client)
            .await;
        assert_eq!(keyless.status, StatusCode::CREATED, "{method}");
    }
    assert_eq!(app.runs(), 9);
    // PATCH is guarded by default.
    let patch = Req::post(&server, "/charge", "")
        .no_key()
        .method("PATCH")
        .send(&client)
        .await;
    assert_eq!(patch.status, StatusCode::BAD_REQUEST);
}

/// 50 concurrent identical requests through two servers sharing one coordinator backend: one
/// handler run; every response is that run's, replayed, or 409.
pub async fn concurrent_duplicates_across_two_servers(first: Coordinator, second: Coordinator) {
    let (one, app_one) = start(layer(first).build()).await;
    let (two, app_two) = start(layer(second).build()).await;
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let url = if i % 2 == 0 { &one.url } else { &two.url };
        let send = Req::post_url(format!("{url}/charge?delay_ms=300"), "stampede");
        let client = client.clone();
        tasks.push(tokio::spawn(async move { send.send(&client).await }));
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.unwrap());
    }
    assert_eq!(
        app_one.runs() + app_two.runs(),
        1,
        "exactly one handler run"
    );
    let ran: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(ran.len(), 1, "one response from the run itself");
    let body = ran[0].body.clone();
    for reply in &replies {
        match reply.status {
            StatusCode::CREATED => assert_eq!(reply.body, body),
            StatusCode::CONFLICT => assert_eq!(reply.problem(), "in-flight"),
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    for server in [&one, &two] {
        let after = Req::post(server, "/charge?delay_ms=300", "stampede")
            .send(&client)
            .await;
        assert!(after.replayed());
        assert_eq!(after.body, body);
    }
}

/// Two callers telling themselves apart by `Authorization` send the same key and body one
/// after the other: each runs the handler, and each retry replays the caller's own response.
/// A request without the header is a principal of its own.
pub async fn principals_one_after_the_other(coord: Coordinator) {
    let namespace = coord.namespace().to_owned();
    let layer = IdempotencyLayer::builder(coord.clone())
        .scope_header(AUTHORIZATION)
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let send = |auth: Option<&'static [u8]>| {
        let request = Req::post(&server, "/charge", "order-1");
        match auth {
            Some(auth) => request.header("authorization", auth),
            None => request,
        }
    };
    let alice = send(Some(b"Bearer alice")).send(&client).await;
    let bob = send(Some(b"Bearer bob")).send(&client).await;
    let nobody = send(None).send(&client).await;
    for (reply, run) in [(&alice, 1), (&bob, 2), (&nobody, 3)] {
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed(), "{reply:?}");
        assert_eq!(reply.run(), Some(run));
    }
    for (auth, first) in [
        (Some(&b"Bearer alice"[..]), &alice),
        (Some(b"Bearer bob"), &bob),
        (None, &nobody),
    ] {
        let again = send(auth).send(&client).await;
        assert!(again.replayed(), "{again:?}");
        assert_eq!(again.body, first.body, "each caller gets its own response");
    }
    assert_eq!(app.runs(), 3);
    assert_eq!(layer.metrics().executed(), 3);
    assert_eq!(layer.metrics().replayed(), 3);
    // The record is where operator tools look for it: under the value's digest.
    let operator = coord.operator();
    let at = |scope: &str| {
        operator
            .key(&format!("http.idempotency:{scope}:order-1"))
            .unwrap()
    };
    let digest = coord_http::scope_digest(&namespace, b"Bearer alice");
    assert!(operator.record(&at(&digest)).await.unwrap().is_some());
    assert!(
        operator
            .record(&at("Bearer alice"))
            .await
            .unwrap()
            .is_none()
    );
}

/// Two principals at the same time, each sending the same key and body several times at once
/// (the layer waits for a running duplicate): one handler run per principal, and every reply a
/// principal gets is its own run's response.
pub async fn principals_at_the_same_time(coord: Coordinator) {
    let layer = layer(coord).wait(Duration::from_secs(10)).build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let mut tasks = Vec::new();
    for i in 0..10 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        let request = Req::post(&server, "/charge?delay_ms=300", "same-key").tenant(tenant);
        tasks.push((tenant, request.spawn(&client)));
    }
    let mut replies: Vec<(&str, Reply)> = Vec::new();
    for (tenant, task) in tasks {
        replies.push((tenant, task.await.unwrap()));
    }
    assert_eq!(app.runs(), 2, "one run per principal");
    let mut bodies = Vec::new();
    for tenant in ["acme", "globex"] {
        let own: Vec<&Reply> = replies
            .iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, r)| r)
            .collect();
        assert!(
            own.iter().all(|r| r.status == StatusCode::CREATED),
            "{own:?}"
        );
        let ran: Vec<&&Reply> = own.iter().filter(|r| !r.replayed()).collect();
        assert_eq!(ran.len(), 1, "{tenant}: one reply from the run itself");
        assert!(
            own.iter().all(|r| r.body == ran[0].body),
            "{tenant}: every reply is its own run's"
        );
        bodies.push(ran[0].body.clone());
    }
    assert_ne!(bodies[0], bodies[1]);
    assert_eq!(layer.metrics().executed(), 2);
    assert_eq!(layer.metrics().replayed(), 8);
}

/// `single_principal()` keeps the behaviour of the earlier default: every caller shares the
/// key, and the record sits where that default put it (an empty scope part, `%_`).
pub async fn single_principal_shares_keys(coord: Coordinator) {
    let layer = IdempotencyLayer::builder(coord.clone())
        .single_principal()
        .build();
    let (server, app) = start(layer).await;
    let client = client();
    let first = Req::post(&server, "/charge", "shared")
        .tenant("acme")
        .header("authorization", b"Bearer alice")
        .send(&client)
        .await;
    assert!(!first.replayed());
    let other = Req::post(&server, "/charge", "shared")
        .tenant("globex")
        .header("authorization", b"Bearer bob")
        .send(&client)
        .await;
    assert!(other.replayed());
    assert_eq!(other.body, first.body);
    assert_eq!(app.runs(), 1);
    let operator = coord.operator();
    let key = operator.key("http.idempotency:%_:shared").unwrap();
    assert!(operator.record(&key).await.unwrap().is_some());
}
