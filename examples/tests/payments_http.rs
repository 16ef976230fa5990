//! The `payments_http` example's service, as the README's curl commands use it: one instance
//! in-process, and two instances on two ports sharing one Redis (a private `redis-server`).

use std::time::Duration;

use coord_core::Coordinator;
use coord_examples::payments::{NAMESPACE, OPERATION, app};
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisServer, Resp};
use serde_json::{Value, json};

struct Instance {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn instance(coordinator: Coordinator) -> Instance {
    let (router, _) = app(coordinator);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Instance { url, task }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `POST /payments`: status, whether it was a replay, and the JSON body.
async fn pay(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    tenant: &str,
    body: Value,
) -> (u16, bool, Value) {
    let response = client
        .post(format!("{url}/payments"))
        .header("idempotency-key", key)
        .header("x-tenant", tenant)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    (status, replayed, body)
}

async fn charges(client: &reqwest::Client, url: &str) -> u64 {
    let body: Value = serde_json::from_slice(
        &client
            .get(format!("{url}/payments/charges"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap(),
    )
    .unwrap();
    body["charges"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_charges_once_per_key() {
    let coordinator = Coordinator::builder()
        .namespace(NAMESPACE)
        .memory()
        .build()
        .unwrap();
    let server = instance(coordinator.clone()).await;
    let client = client();
    let order = json!({"amount": 1250, "currency": "eur"});
    let (status, replayed, first) =
        pay(&client, &server.url, "order-1", "acme", order.clone()).await;
    assert_eq!((status, replayed), (201, false));
    assert!(first["id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(first["currency"], "EUR");
    let (status, replayed, again) =
        pay(&client, &server.url, "order-1", "acme", order.clone()).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, first);
    assert_eq!(charges(&client, &server.url).await, 1);
    // Another tenant with the same key is another charge.
    let (status, replayed, other) =
        pay(&client, &server.url, "order-1", "globex", order.clone()).await;
    assert_eq!((status, replayed), (201, false));
    assert_ne!(other["id"], first["id"]);
    let (status, replayed, other_again) =
        pay(&client, &server.url, "order-1", "globex", order.clone()).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(other_again, other);
    // Each tenant's record is under its digest, where `coord records list --scope` looks.
    let operator = coordinator.operator();
    for tenant in ["acme", "globex"] {
        let digest = coord_http::scope_digest(NAMESPACE, tenant.as_bytes());
        let key = operator
            .key(&format!("{OPERATION}:{digest}:order-1"))
            .unwrap();
        assert!(operator.record(&key).await.unwrap().is_some(), "{tenant}");
    }
    // The same key with another amount is refused.
    let (status, _, problem) = pay(
        &client,
        &server.url,
        "order-1",
        "acme",
        json!({"amount": 1, "currency": "EUR"}),
    )
    .await;
    assert_eq!(status, 422);
    assert!(problem["type"].as_str().unwrap().ends_with("#key-reused"));
    // Amount 0 is the handler's own 400, not remembered: the retry runs the handler again.
    for _ in 0..2 {
        let (status, replayed, _) = pay(
            &client,
            &server.url,
            "order-2",
            "acme",
            json!({"amount": 0, "currency": "EUR"}),
        )
        .await;
        assert_eq!((status, replayed), (400, false));
    }
    assert_eq!(charges(&client, &server.url).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_sharing_redis_charge_once() {
    let redis = RedisServer::start();
    let mut instances = Vec::new();
    for _ in 0..2 {
        let provider = RedisProvider::connect(&redis.url()).await.unwrap();
        let coordinator = Coordinator::builder()
            .namespace(NAMESPACE)
            .provider(provider)
            .build()
            .unwrap();
        instances.push(instance(coordinator).await);
    }
    let client = client();
    // 20 concurrent duplicates of a slow charge, alternating between the instances.
    let order = json!({"amount": 990, "currency": "USD", "delay_ms": 300});
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (client, url, order) = (client.clone(), instances[i % 2].url.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            pay(&client, &url, "order-9", "acme", order).await
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        let (status, _, body) = task.await.unwrap();
        match status {
            201 => ids.push(body["id"].clone()),
            409 => assert!(body["type"].as_str().unwrap().ends_with("#in-flight")),
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert!(!ids.is_empty());
    assert!(ids.iter().all(|id| *id == ids[0]), "one charge id: {ids:?}");
    let total =
        charges(&client, &instances[0].url).await + charges(&client, &instances[1].url).await;
    assert_eq!(
        total, 1,
        "the charge handler ran once across both instances"
    );
    // The tenant is in Redis only as its digest.
    let names = match redis.command(&["KEYS", "*"]) {
        Resp::Array(names) => names
            .iter()
            .filter_map(Resp::text)
            .collect::<Vec<_>>()
            .join("\n"),
        other => panic!("KEYS: {other:?}"),
    };
    let digest = coord_http::scope_digest(NAMESPACE, b"acme");
    assert!(names.contains(&digest), "{names}");
    assert!(!names.contains("acme"), "{names}");
    // Later retries through either instance replay the one charge.
    for instance in &instances {
        let (status, replayed, body) =
            pay(&client, &instance.url, "order-9", "acme", order.clone()).await;
        assert_eq!((status, replayed), (201, true));
        assert_eq!(body["id"], ids[0]);
    }
}
