//! Requests through the idempotency layer next to the same router without it, in one run:
//! in-process and Redis, fresh keys and replays, with a handler that does nothing and one that
//! waits 1 ms (standing in for a database call).
//!
//! `cargo bench -p coord-http --bench http_layer` starts a private `redis-server` on a free
//! loopback port (the binary must be installed) and prints Markdown tables.
//!
//! Each row is measured in five interleaved rounds: the latency of one client sending one
//! request at a time (median), and the throughput of 16 clients sending concurrently. Client,
//! servers and Redis share the machine, so the ratios, not the absolute numbers, are the
//! result.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::post;
use coord_core::Coordinator;
use coord_http::IdempotencyLayer;
use coord_redis::RedisProvider;
use coord_redis_testing::RedisServer;

const ROUNDS: usize = 5;
const SLICE: Duration = Duration::from_millis(700);
const CONCURRENCY: usize = 16;

async fn noop() -> Response {
    let mut response = Response::new(Body::from(r#"{"id":"ch_0123456789abcdef","amount":100}"#));
    *response.status_mut() = http::StatusCode::CREATED;
    response
}

async fn work() -> Response {
    tokio::time::sleep(Duration::from_millis(1)).await;
    noop().await
}

struct Target {
    name: String,
    url: String,
    /// `None`: a fresh key per request; `Some(k)`: always `k` (after one request stored it).
    replay_key: Option<String>,
    guarded: bool,
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

fn router(layer: Option<IdempotencyLayer>) -> Router {
    let router = Router::new()
        .route("/noop", post(noop))
        .route("/work", post(work));
    match layer {
        Some(layer) => router.layer(layer),
        None => router,
    }
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// The caller's credentials, the guarded layers' scope.
const BEARER: &str = "Bearer bench-caller-token";

async fn send(client: &reqwest::Client, target: &Target, path: &str) {
    let mut request = client
        .post(format!("{}{path}", target.url))
        .header("authorization", BEARER)
        .body("{\"amount\":100}");
    if target.guarded {
        let key = match &target.replay_key {
            Some(key) => format!("{key}{path}"),
            None => format!("k{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed)),
        };
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.expect("request");
    assert_eq!(response.status(), 201);
    if target.replay_key.is_some() {
        assert_eq!(response.headers()["idempotent-replayed"], "true");
    }
    response.bytes().await.expect("body");
}

/// Median latency of one client, one request at a time, for one slice.
async fn latency(client: &reqwest::Client, target: &Target, path: &str) -> Duration {
    let mut samples = Vec::new();
    let end = Instant::now() + SLICE;
    while Instant::now() < end {
        let start = Instant::now();
        send(client, target, path).await;
        samples.push(start.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

/// Requests per second of `CONCURRENCY` clients for one slice.
async fn throughput(client: &reqwest::Client, target: &Arc<Target>, path: &'static str) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + SLICE;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, target, done) = (client.clone(), Arc::clone(target), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < end {
                send(&client, &target, path).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `median [lowest–highest]` of the rounds, with `digits` decimals.
fn spread(values: &[f64], digits: usize) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.digits$} [{lo:.digits$}–{hi:.digits$}]",
        median(values.to_vec())
    )
}

fn redis_ping_p50(server: &RedisServer) -> Duration {
    let mut samples: Vec<Duration> = (0..300)
        .map(|_| {
            let start = Instant::now();
            server.command(&["PING"]);
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let redis = RedisServer::start();
    let memory = Coordinator::builder()
        .namespace("bench")
        .memory()
        .build()
        .unwrap();
    let provider = RedisProvider::connect(&redis.url()).await.unwrap();
    let remote = Coordinator::builder()
        .namespace("bench")
        .provider(provider)
        .build()
        .unwrap();
    let plain = serve(router(None)).await;
    // Scoped by a header, as a service with callers would be: the digest is part of the cost.
    let guarded = |coordinator| {
        IdempotencyLayer::builder(coordinator)
            .scope_header(http::header::AUTHORIZATION)
            .build()
    };
    let in_process = serve(router(Some(guarded(memory)))).await;
    let over_redis = serve(router(Some(guarded(remote)))).await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();

    let target = |name: &str, url: &str, guarded: bool, replay: bool| {
        Arc::new(Target {
            name: name.to_owned(),
            url: url.to_owned(),
            replay_key: replay.then(|| name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")),
            guarded,
        })
    };
    let targets = [
        target("no layer", &plain, false, false),
        target("in-process, fresh keys", &in_process, true, false),
        target("in-process, replays", &in_process, true, true),
        target("Redis, fresh keys", &over_redis, true, false),
        target("Redis, replays", &over_redis, true, true),
    ];
    println!("# http_layer");
    println!();
    println!(
        "redis PING p50 (blocking client, same machine): {:.3} ms",
        redis_ping_p50(&redis).as_secs_f64() * 1e3
    );
    for path in ["/noop", "/work"] {
        // Store the replayed responses, and warm every path.
        for target in &targets {
            send_first(&client, target, path).await;
            for _ in 0..50 {
                send(&client, target, path).await;
            }
        }
        let mut lat: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        let mut rps: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        for _ in 0..ROUNDS {
            for (i, target) in targets.iter().enumerate() {
                lat[i].push(latency(&client, target, path).await.as_secs_f64() * 1e3);
                rps[i].push(throughput(&client, target, path).await);
            }
        }
        let base_lat = median(lat[0].clone());
        let base_rps = median(rps[0].clone());
        println!();
        println!(
            "## handler `{path}` ({})",
            if path == "/work" {
                "waits 1 ms"
            } else {
                "does nothing"
            }
        );
        println!();
        println!(
            "| route | latency p50 in ms, 1 client: median [range] of {ROUNDS} rounds | vs no layer | req/s, {CONCURRENCY} clients: median [range] | vs no layer |"
        );
        println!("|---|---|---|---|---|");
        for (i, target) in targets.iter().enumerate() {
            let l = median(lat[i].clone());
            let r = median(rps[i].clone());
            println!(
                "| {} | {} | {:+.3} ms | {} | {:.2}x |",
                target.name,
                spread(&lat[i], 3),
                l - base_lat,
                spread(&rps[i], 0),
                r / base_rps
            );
        }
    }
}

/// Sends one request; for a replay target the first one (fresh) stores the response that
/// the rest replay.
async fn send_first(client: &reqwest::Client, target: &Target, path: &str) {
    if let Some(key) = &target.replay_key {
        let key = format!("{key}{path}");
        let response = client
            .post(format!("{}{path}", target.url))
            .body("{\"amount\":100}")
            .header("authorization", BEARER)
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.bytes().await.unwrap();
    } else {
        send(client, target, path).await;
    }
}
