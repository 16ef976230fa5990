//! The layer's semantics against the in-process provider, through a real HTTP server and
//! client. Each case is a row of the crate docs' table (see `support/cases.rs`).

use crate::support;

use std::time::Duration;

use coord_core::OnBackendError;
use http::StatusCode;
use support::*;

macro_rules! memory_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                cases::$case(memory_coordinator()).await;
            }
        )*
    };
}

memory_cases!(
    replays_exactly,
    quoted_and_bare_forms_share_a_key,
    missing_key,
    invalid_keys,
    reused_key_for_another_request,
    in_flight_duplicate_is_409,
    duplicate_waits_and_replays,
    waiter_runs_when_the_first_fails,
    failures_are_not_remembered,
    client_errors_remembered_when_configured,
    binary_body_and_custom_headers,
    oversized_response_is_unreplayable,
    oversized_response_forgotten,
    request_body_over_the_limit,
    panic_frees_the_key,
    panic_under_fail_is_outcome_unknown,
    client_disconnect_frees_the_key,
    tenants_do_not_share_keys,
    unguarded_methods_pass_through,
    principals_one_after_the_other,
    principals_at_the_same_time,
    single_principal_shares_keys,
);

/// Two layers over one in-process coordinator stand in for two instances sharing a backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_duplicates_across_two_servers() {
    let coordinator = memory_coordinator();
    cases::concurrent_duplicates_across_two_servers(coordinator.clone(), coordinator).await;
}

/// The backend unreachable, fail closed (the default): 503 with Retry-After, nothing runs;
/// once it is back, the request runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_down_fails_closed() {
    let (provider, coordinator) = switchable_coordinator();
    let layer = layer(coordinator)
        .retry_after(Duration::from_secs(7))
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    provider.set_down(true);
    let reply = Req::post(&server, "/charge", "down").send(&client).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.problem(), "backend-unavailable");
    assert_eq!(reply.retry_after(), Some(7));
    let detail = reply.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        !detail.contains("switched off"),
        "no backend message leaks: {detail}"
    );
    assert_eq!(app.runs(), 0);
    assert_eq!(layer.metrics().backend_errors(), 1);
    provider.set_down(false);
    let reply = Req::post(&server, "/charge", "down").send(&client).await;
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(app.runs(), 1);
}

/// The backend unreachable, fail open: the handler runs unguarded, counted by the layer and
/// the coordinator; nothing is stored, so a retry runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_down_fails_open() {
    let (provider, coordinator) = switchable_coordinator();
    let layer = layer(coordinator.clone())
        .on_backend_error(OnBackendError::FailOpen)
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    provider.set_down(true);
    for run in 1..=2 {
        let reply = Req::post(&server, "/charge", "open").send(&client).await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert!(!reply.replayed());
        assert_eq!(reply.run(), Some(run));
    }
    assert_eq!(layer.metrics().failed_open(), 2);
    assert_eq!(coordinator.metrics().fail_open_runs(), 2);
    provider.set_down(false);
    let stored = Req::post(&server, "/charge", "open").send(&client).await;
    let replay = Req::post(&server, "/charge", "open").send(&client).await;
    assert!(!stored.replayed());
    assert!(replay.replayed());
    assert_eq!(app.runs(), 3);
}

/// The backend fails after the handler ran, for longer than the in-flight lease: the client
/// still gets the handler's response (the truth about what happened), counted as not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_lost_while_the_handler_runs() {
    let (provider, coordinator) = switchable_coordinator();
    let layer = layer(coordinator)
        .in_flight_lease(Duration::from_millis(500))
        .build();
    let (server, app) = start(layer.clone()).await;
    let client = client();
    let pending = Req::post(&server, "/charge", "lost")
        .header("x-delay-ms", b"300")
        .spawn(&client);
    eventually("the handler started", || app.runs() == 1).await;
    provider.set_down(true);
    let reply = pending.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    assert_eq!(reply.run(), Some(1));
    assert_eq!(layer.metrics().not_stored(), 1);
    provider.set_down(false);
    // Under the default `Rerun`, once the lease is over the key runs again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = Req::post(&server, "/charge", "lost").send(&client).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.run(), Some(2));
}
