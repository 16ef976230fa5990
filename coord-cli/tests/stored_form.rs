//! What coord stores for one call, as an operator finds it: an `#[idempotent]` call in
//! namespace `billing`, operation `payments.charge`, key part `order-7`, against a real Redis and
//! a real PostgreSQL started here. The call's `CallReport` shows the key as
//! `payments.charge:order-7`; the store holds it under the names README's "What coord stores"
//! quotes (Redis `billing:idem:{payments.charge:order-7}`, PostgreSQL's `records.key`
//! `billing:payments.charge:order-7`), and `coord records show` finds it from the shown form.
//! Those README lines are taken from this test: change both together.

use std::process::{Command, Stdio};

use coord_core::{CoordError, Coordinator, idempotent, observe};
use coord_postgres::PostgresProvider;
use coord_postgres_testing::PostgresServer;
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisServer, Resp};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_coord");

/// The name the README quotes for the record in Redis.
const REDIS_RECORD: &str = "billing:idem:{payments.charge:order-7}";
/// The `records.key` the README quotes for the record in PostgreSQL.
const POSTGRES_RECORD: &str = "billing:payments.charge:order-7";

#[idempotent(key_from = "order", coordinator = c, name = "payments.charge")]
async fn charge(c: &Coordinator, order: &str) -> Result<u64, CoordError> {
    Ok(4200 + order.len() as u64)
}

/// Runs the call once and returns the key its report shows.
async fn charge_once(c: &Coordinator) -> String {
    let (result, report) = observe(charge(c, "order-7")).await;
    assert_eq!(result.expect("the call succeeds"), 4207);
    let key = report.key().expect("the report names the call's key");
    assert_eq!(key.namespace(), "billing");
    key.to_string()
}

/// `coord --json records show KEY` with only the given variables of coord's set.
fn show(key: &str, env: &[(&str, &str)]) -> Value {
    let mut cmd = Command::new(BIN);
    cmd.args(["--json", "records", "show", key])
        .env_remove("COORD_REDIS_URL")
        .env_remove("COORD_POSTGRES_URL")
        .env_remove("COORD_POSTGRES_SCHEMA")
        .env_remove("COORD_LOG")
        .env_remove("RUST_LOG")
        .env("COORD_NAMESPACE", "billing")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the coord binary");
    assert_eq!(
        out.status.code(),
        Some(0),
        "coord records show {key}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document on stdout")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stores_the_record_under_the_documented_name() {
    let server = RedisServer::start();
    let provider = RedisProvider::connect(&server.url())
        .await
        .expect("connect to the test server");
    let c = Coordinator::builder()
        .namespace("billing")
        .provider(provider)
        .build()
        .expect("coordinator");

    let shown = charge_once(&c).await;
    assert_eq!(shown, "payments.charge:order-7");

    // The name is the namespace, the kind, and the shown key as a Cluster hash tag.
    assert_eq!(
        server.command(&["EXISTS", REDIS_RECORD]).int(),
        Some(1),
        "the record is stored as {REDIS_RECORD}"
    );
    // A completed call leaves no lock, flight or cache entry behind: only its record.
    let names: Vec<String> = match server.command(&["KEYS", "billing:*"]) {
        Resp::Array(items) => items
            .iter()
            .map(|item| match item {
                Resp::Bulk(name) => String::from_utf8_lossy(name).into_owned(),
                other => panic!("KEYS answered {other:?}"),
            })
            .collect(),
        other => panic!("KEYS answered {other:?}"),
    };
    assert_eq!(names, [REDIS_RECORD], "only the record is stored");

    let doc = show(&shown, &[("COORD_REDIS_URL", &server.url())]);
    assert_eq!(doc["exists"], true, "{doc:#}");
    assert_eq!(doc["status"], "completed", "{doc:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stores_the_record_under_the_documented_key() {
    let server = PostgresServer::start();
    let url = server.url();
    PostgresProvider::migrate(&url).await.expect("migrate");
    let provider = PostgresProvider::connect(&url).await.expect("connect");
    let c = Coordinator::builder()
        .namespace("billing")
        .provider(provider)
        .build()
        .expect("coordinator");

    let shown = charge_once(&c).await;
    assert_eq!(shown, "payments.charge:order-7");

    // `records.key` is the namespace, then the shown key: `namespace:operation:parts`.
    let rows = server.sql("SELECT key || ' ' || state FROM coord.records ORDER BY key");
    assert_eq!(rows.trim(), format!("{POSTGRES_RECORD} completed"));
    let locks = server.sql("SELECT count(*) FROM coord.locks");
    assert_eq!(locks.trim(), "0", "a completed call holds no lock row");

    let doc = show(&shown, &[("COORD_POSTGRES_URL", &url)]);
    assert_eq!(doc["exists"], true, "{doc:#}");
    assert_eq!(doc["status"], "completed", "{doc:#}");
}
