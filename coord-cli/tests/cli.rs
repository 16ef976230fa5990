//! The `coord` binary end to end, against real redis-server processes started here: what it
//! prints (text and `--json`), its exit codes, and what it changes on the server and for the
//! application holding the lock or the record.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{ClaimRequest, OwnerToken};
use coord_core::{CallKey, CoordError, Coordinator, LossCause};
use coord_redis::RedisProvider;
use coord_redis_testing::{RedisServer, Resp};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_coord");

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {self:?}"))
    }
}

/// Runs `coord args` against `url` in `namespace`, stdin closed (not a terminal).
fn coord(url: &str, namespace: &str, args: &[&str]) -> Run {
    coord_with(url, namespace, args, &[])
}

fn coord_with(url: &str, namespace: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("COORD_REDIS_URL", url)
        .env("COORD_NAMESPACE", namespace)
        .env("USER", "tester")
        .env_remove("COORD_LOG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run the coord binary");
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

async fn coordinator(server: &RedisServer, namespace: &str) -> Coordinator {
    let provider = RedisProvider::connect(&server.url())
        .await
        .expect("connect to the test server");
    Coordinator::builder()
        .namespace(namespace)
        .provider(provider)
        .build()
        .expect("coordinator")
}

fn exists(server: &RedisServer, name: &str) -> bool {
    server.command(&["EXISTS", name]).int() == Some(1)
}

/// Polls `check` for up to 10 s.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A lock held through coord (the handle API, renewing) is listed, shown, refused release
/// without confirmation, then force-released by the CLI: the key is gone from Redis, the log
/// names who asked, and the holder's renewal finds the lock lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_through_coord_is_listed_shown_and_released() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "shop").await;
    let key = c.key("tenants.rebuild").part(&42).finish();
    assert_eq!(key.to_string(), "tenants.rebuild:42");
    let holder = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move {
            c.lock(key)
                .lease(Duration::from_secs(60))
                .fenced()
                .renew(Duration::from_millis(200))
                .run(|| async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok::<_, CoordError>(())
                })
                .await
        }
    });
    let operator = c.operator();
    eventually("the lock is held", || async {
        operator.lock(&key).await.unwrap().holder.is_some()
    })
    .await;
    let info = operator.lock(&key).await.unwrap();
    let owner = info.holder.unwrap().owner.to_string();
    let token = info.fencing_token.expect("a fenced lock").get();

    let list = coord(&url, "shop", &["locks", "list", "tenants.rebuild"]);
    assert_eq!(list.code, 0, "{list:?}");
    assert!(list.stdout.contains("tenants.rebuild:42"), "{list:?}");
    assert!(list.stdout.contains(&owner), "{list:?}");
    assert!(list.stdout.contains("1 lock held"), "{list:?}");

    let list = coord(
        &url,
        "shop",
        &["--json", "locks", "list", "tenants.rebuild"],
    );
    assert_eq!(list.code, 0, "{list:?}");
    let doc = list.json();
    assert_eq!(doc["namespace"], "shop");
    assert_eq!(doc["next_cursor"], Value::Null);
    let locks = doc["locks"].as_array().expect("an array of locks");
    assert_eq!(locks.len(), 1, "{doc:#}");
    assert_eq!(locks[0]["key"], "tenants.rebuild:42");
    assert_eq!(locks[0]["held"], true);
    assert_eq!(locks[0]["owner"], owner.as_str());
    assert_eq!(locks[0]["fencing_token"], token);
    let lease_left = locks[0]["lease_left_ms"].as_u64().expect("lease left");
    assert!(lease_left > 0 && lease_left <= 60_000, "{lease_left}");

    // The key exactly as listed goes back into `show`.
    let listed = locks[0]["key"].as_str().unwrap();
    let show = coord(&url, "shop", &["locks", "show", listed]);
    assert_eq!(show.code, 0, "{show:?}");
    assert!(show.stdout.contains("lock tenants.rebuild:42"), "{show:?}");
    assert!(show.stdout.contains("state:          held"), "{show:?}");
    assert!(
        show.stdout.contains(&format!("owner:          {owner}")),
        "{show:?}"
    );
    assert!(
        show.stdout.contains(&format!("fencing token:  {token}")),
        "{show:?}"
    );

    let refused = coord(&url, "shop", &["locks", "release", listed]);
    assert_eq!(refused.code, 5, "no terminal and no --yes: {refused:?}");
    assert!(refused.stderr.contains("--yes"), "{refused:?}");
    assert!(
        exists(&server, "shop:lock:{tenants.rebuild:42}"),
        "a refused release changes nothing"
    );

    let release = coord(
        &url,
        "shop",
        &[
            "locks",
            "release",
            listed,
            "--yes",
            "--by",
            "alice (ticket 7)",
        ],
    );
    assert_eq!(release.code, 0, "{release:?}");
    assert_eq!(
        release.stdout.trim(),
        format!("released lock tenants.rebuild:42 (it was held by {owner})")
    );
    assert!(
        release.stderr.contains("force-released by an operator")
            && release.stderr.contains("alice (ticket 7)")
            && release.stderr.contains("tenants.rebuild:42"),
        "the log line names the key and who asked: {release:?}"
    );
    assert!(
        !exists(&server, "shop:lock:{tenants.rebuild:42}"),
        "the lock key is gone from Redis"
    );
    assert!(
        exists(&server, "shop:fence:{tenants.rebuild:42}"),
        "the fencing counter is left alone"
    );
    let lost = tokio::time::timeout(Duration::from_secs(10), holder)
        .await
        .expect("the holder notices within its renewals")
        .unwrap();
    match lost {
        Err(CoordError::LockLost {
            cause, key: lost, ..
        }) => {
            assert_eq!(lost, key);
            assert_eq!(
                cause,
                LossCause::ForceReleased,
                "the holder is told an operator freed it, not that it lapsed"
            );
        }
        other => panic!("the holder should have lost the lock: {other:?}"),
    }

    let show = coord(&url, "shop", &["--json", "locks", "show", listed]);
    assert_eq!(show.code, 0, "{show:?}");
    let doc = show.json();
    assert_eq!(doc["held"], false, "{doc:#}");
    assert_eq!(doc["fencing_token"], token, "the counter outlives the lock");
    let again = coord(
        &url,
        "shop",
        &["--json", "locks", "release", listed, "--yes"],
    );
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.json()["outcome"], "not_held");
}

/// The application holds a lock without renewal, and an operator frees it with the tool: the
/// application's call still returns its outcome, and reports (and counts) a forced release,
/// not a lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_forced_free_by_the_tool_is_reported_as_force_released() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "shop").await;
    let key = c.key("cli.forced").part(&7).finish();
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    let call = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move {
            let guard = c
                .lock(key)
                .lease(Duration::from_secs(60))
                .acquire()
                .await
                .unwrap();
            entered_tx.send(()).unwrap();
            let _ = go_rx.await;
            guard.release().await
        }
    });
    entered.await.unwrap();
    let release = coord(&url, "shop", &["locks", "release", "cli.forced:7", "--yes"]);
    assert_eq!(release.code, 0, "{release:?}");
    go.send(()).unwrap();
    let still_ours = call.await.unwrap().expect("the release answered");
    assert!(!still_ours, "the lock was not the holder's any more");
    assert_eq!(c.metrics().force_released_holds(), 1);
    assert_eq!(c.metrics().lapsed_releases(), 0, "not counted as a lapse");
    assert!(
        exists(&server, "shop:lock-forced:{cli.forced:7}"),
        "the marker that told the holder outlives the release for a while"
    );

    // The tool names the application by its binary's name, as the application names its own
    // namespace when its code gives none.
    let stem = coord_core::config::namespace_for_binary("/opt/payflow/bin/payflow").unwrap();
    assert_eq!(stem, "payflow");
    let via_app = coord_with(
        &url,
        "",
        &["--app", "/opt/payflow/bin/payflow", "locks", "list"],
        &[],
    );
    assert_eq!(via_app.code, 0, "{via_app:?}");
    assert!(
        via_app
            .stdout
            .contains("no operation holds locks in namespace `payflow`"),
        "{via_app:?}"
    );
    let both = coord(
        &url,
        "shop",
        &["--app", "payflow", "--namespace", "x", "locks", "list"],
    );
    assert_eq!(
        both.code, 2,
        "--app and --namespace name it twice: {both:?}"
    );
}

/// A record stored through coord is listed, shown and purged by the CLI: the Redis hash goes,
/// and the next call with the key runs its body again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_shown_and_purged() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "pay").await;
    let key = c.key("payments.charge").part("order 7").finish();
    let runs = Arc::new(AtomicU32::new(0));
    let charge = |c: Coordinator, key: CallKey, runs: Arc<AtomicU32>| async move {
        c.idempotent(key)
            .retention(Duration::from_secs(3600))
            .run(|| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, CoordError>(4200u64)
            })
            .await
    };
    assert_eq!(
        charge(c.clone(), key.clone(), runs.clone()).await.unwrap(),
        4200
    );
    assert_eq!(
        charge(c.clone(), key.clone(), runs.clone()).await.unwrap(),
        4200
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the duplicate was replayed");
    let name = "pay:idem:{payments.charge:order 7}";
    assert!(exists(&server, name));

    let list = coord(
        &url,
        "pay",
        &["--json", "records", "list", "payments.charge"],
    );
    assert_eq!(list.code, 0, "{list:?}");
    let doc = list.json();
    let records = doc["records"].as_array().expect("records");
    assert_eq!(records.len(), 1, "{doc:#}");
    assert_eq!(records[0]["key"], "payments.charge:order 7");
    assert_eq!(records[0]["status"], "completed");

    let listed = records[0]["key"].as_str().unwrap();
    let show = coord(&url, "pay", &["--json", "records", "show", listed]);
    assert_eq!(show.code, 0, "{show:?}");
    let doc = show.json();
    assert_eq!(doc["exists"], true);
    assert_eq!(doc["status"], "completed");
    assert_eq!(doc["namespace"], "pay");
    assert!(
        doc["owner"].as_str().is_some_and(|o| o.len() == 32),
        "{doc:#}"
    );
    assert!(
        doc["payload_bytes"].as_u64().is_some_and(|n| n > 0),
        "{doc:#}"
    );
    assert!(
        doc["age_ms"].as_u64().is_some_and(|ms| ms < 60_000),
        "{doc:#}"
    );
    let expires = doc["expires_in_ms"].as_u64().expect("expiry");
    assert!(expires > 3_500_000 && expires <= 3_600_000, "{expires}");
    assert_eq!(doc["lease_left_ms"], Value::Null);
    assert_eq!(doc["has_fingerprint"], false);

    let text = coord(&url, "pay", &["records", "show", listed]);
    assert!(
        text.stdout.contains("state:          completed"),
        "{text:?}"
    );
    assert!(text.stdout.contains("payload:"), "{text:?}");

    let refused = coord(&url, "pay", &["records", "purge", listed]);
    assert_eq!(refused.code, 5, "{refused:?}");
    assert!(exists(&server, name), "a refused purge changes nothing");

    let purge = coord(&url, "pay", &["records", "purge", listed, "-y"]);
    assert_eq!(purge.code, 0, "{purge:?}");
    assert_eq!(purge.stdout.trim(), "purged record payments.charge:order 7");
    assert!(
        purge.stderr.contains("purged by an operator") && purge.stderr.contains("tester"),
        "the log line names who asked (the user by default): {purge:?}"
    );
    assert!(!exists(&server, name), "the record is gone from Redis");
    assert_eq!(
        charge(c.clone(), key.clone(), runs.clone()).await.unwrap(),
        4200
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "after a purge the body runs again"
    );

    let purge = coord(
        &url,
        "pay",
        &[
            "--json",
            "records",
            "purge",
            "payments.charge:nothing",
            "-y",
        ],
    );
    assert_eq!(purge.code, 0, "{purge:?}");
    assert_eq!(purge.json()["purged"], false);
    let none = coord(
        &url,
        "pay",
        &["--json", "records", "show", "payments.charge:nothing"],
    );
    assert_eq!(none.json()["exists"], false);
}

/// In-flight and abandoned records show their state; listings page with a limit and a cursor,
/// or follow every page with `--all`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_and_show_every_record_state() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "jobs").await;
    let store = c.idempotency_store();
    let owner = OwnerToken::new();
    for i in 0..5 {
        let key = c.key("nightly").part(&i).finish();
        store
            .claim(ClaimRequest {
                key: &key,
                owner,
                in_flight_lease: if i == 0 {
                    Duration::from_millis(100)
                } else {
                    Duration::from_secs(60)
                },
                fingerprint: None,
                keep_abandoned_for: Some(Duration::from_secs(600)),
                transactional: false,
            })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let first = coord(
        &url,
        "jobs",
        &["--json", "records", "list", "nightly", "--limit", "2"],
    );
    assert_eq!(first.code, 0, "{first:?}");
    let doc = first.json();
    assert_eq!(doc["records"].as_array().unwrap().len(), 2, "{doc:#}");
    let cursor = doc["next_cursor"]
        .as_str()
        .expect("more to come")
        .to_owned();
    let next = coord(
        &url,
        "jobs",
        &[
            "--json", "records", "list", "nightly", "--limit", "2", "--cursor", &cursor,
        ],
    );
    assert_eq!(next.code, 0, "{next:?}");
    assert!(!next.json()["records"].as_array().unwrap().is_empty());

    let all = coord(
        &url,
        "jobs",
        &[
            "--json", "records", "list", "nightly", "--limit", "2", "--all",
        ],
    );
    assert_eq!(all.code, 0, "{all:?}");
    let doc = all.json();
    assert_eq!(doc["next_cursor"], Value::Null);
    let mut states: Vec<(String, String)> = doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"].as_str().unwrap().to_owned(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    states.sort();
    assert_eq!(
        states,
        [
            ("nightly:0".into(), "abandoned".into()),
            ("nightly:1".into(), "in_flight".into()),
            ("nightly:2".into(), "in_flight".into()),
            ("nightly:3".into(), "in_flight".into()),
            ("nightly:4".into(), "in_flight".into()),
        ]
    );
    let text = coord(
        &url,
        "jobs",
        &["records", "list", "nightly", "--limit", "2"],
    );
    assert!(
        text.stdout.contains("--cursor"),
        "the text says how to go on: {text:?}"
    );
    let bad = coord(
        &url,
        "jobs",
        &["records", "list", "nightly", "--cursor", "nonsense"],
    );
    assert_eq!(bad.code, 2, "{bad:?}");
}

/// `check` against a server that may evict coord's keys says so and exits 1; a well-set server
/// passes; an unreachable one fails the connect check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_judges_the_server() {
    let risky = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let run = coord(&risky.url(), "", &["check"]);
    assert_eq!(run.code, 1, "{run:?}");
    let line = run
        .stdout
        .lines()
        .find(|l| l.contains("maxmemory-policy"))
        .unwrap_or_else(|| panic!("no policy line: {run:?}"));
    assert!(
        line.contains("FAIL") && line.contains("allkeys-lru"),
        "{line}"
    );
    assert!(
        run.stdout.contains("noeviction"),
        "it names the fix: {run:?}"
    );
    assert!(run.stdout.contains("verdict: FAIL"), "{run:?}");
    assert!(
        run.stdout.contains("version") && run.stdout.contains("7."),
        "{run:?}"
    );

    let run = coord(&risky.url(), "", &["--json", "check"]);
    assert_eq!(run.code, 1, "{run:?}");
    let doc = run.json();
    assert_eq!(doc["verdict"], "fail");
    let policy = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "maxmemory-policy")
        .expect("a policy check");
    assert_eq!(policy["status"], "fail");
    assert_eq!(doc["nodes"][0]["maxmemory_policy"], "allkeys-lru");
    assert!(doc["nodes"][0]["clock_offset_ms"].as_i64().unwrap().abs() < 5_000);

    // Persistence off (the test servers' default) is a warning, not a failure.
    let plain = RedisServer::start();
    let run = coord(&plain.url(), "", &["check"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("verdict: WARN"), "{run:?}");
    let durable = RedisServer::start_with(&["--appendonly", "yes"]);
    let run = coord(&durable.url(), "", &["--json", "check"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["verdict"], "ok", "{run:?}");

    // Nothing listens on a port of a server that was stopped.
    let mut gone = RedisServer::start();
    let url = gone.url();
    gone.kill();
    let run = coord(&url, "", &["--timeout", "500ms", "check"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stdout
            .lines()
            .any(|l| l.contains("connect") && l.contains("FAIL")),
        "{run:?}"
    );
}

/// `check` reports each primary's replicas and judges `min-replicas-to-write`: replicas with
/// the setting at 0 is a warning naming the fix; the setting with enough replicas in step is
/// ok; the setting without them (writes refused now) fails; a URL naming a replica fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_replication_and_min_replicas_to_write() {
    let primary = RedisServer::start_with(&["--appendonly", "yes"]);
    let port = primary.port().to_string();
    let mut replica =
        RedisServer::start_with(&["--appendonly", "yes", "--replicaof", "127.0.0.1", &port]);
    // The replica is listed once its initial sync is done.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = primary
            .command(&["INFO", "replication"])
            .text()
            .unwrap_or_default();
        if info.contains("state=online") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never came online: {info}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let replication = |run: &Run| -> Value {
        run.json()["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["check"] == "replication")
            .cloned()
            .unwrap_or_else(|| panic!("no replication check: {run:?}"))
    };

    let run = coord(&primary.url(), "", &["--json", "check"]);
    assert_eq!(run.code, 0, "{run:?}");
    let doc = run.json();
    assert_eq!(doc["verdict"], "warn", "{run:?}");
    let node = &doc["nodes"][0];
    assert_eq!(node["role"], "master");
    assert_eq!(node["min_replicas_to_write"], 0);
    assert_eq!(node["replicas"].as_array().unwrap().len(), 1, "{run:?}");
    assert_eq!(
        node["replicas"][0]["address"],
        format!("127.0.0.1:{}", replica.port())
    );
    assert_eq!(node["replicas"][0]["state"], "online");
    let finding = replication(&run);
    assert_eq!(finding["status"], "warn", "{finding}");
    let detail = finding["detail"].as_str().unwrap();
    assert!(
        detail.contains("min-replicas-to-write 1") && detail.contains("failover"),
        "the warning says what can be lost and the fix: {detail}"
    );
    let text = coord(&primary.url(), "", &["check"]);
    assert!(
        text.stdout
            .lines()
            .any(|l| l.contains("replication") && l.contains("WARN")),
        "{text:?}"
    );

    set(&primary, &["CONFIG", "SET", "min-replicas-to-write", "1"]);
    let run = coord(&primary.url(), "", &["--json", "check"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(replication(&run)["status"], "ok", "{run:?}");
    assert_eq!(run.json()["verdict"], "ok", "{run:?}");

    // The application's `replica_acks`: one replica is enough for 1, not for 2.
    let run = coord(
        &primary.url(),
        "",
        &["--json", "check", "--replica-acks", "1"],
    );
    assert_eq!(replication(&run)["status"], "ok", "{run:?}");
    let run = coord(
        &primary.url(),
        "",
        &["--json", "check", "--replica-acks", "2"],
    );
    assert_eq!(run.code, 0, "a warning: {run:?}");
    let finding = replication(&run);
    assert_eq!(finding["status"], "warn", "{finding}");
    assert!(
        finding["detail"]
            .as_str()
            .unwrap()
            .contains("replica_acks(2)"),
        "{finding}"
    );

    // A URL naming the replica: coord's writes would all be refused.
    let run = coord(&replica.url(), "", &["--json", "check"]);
    assert_eq!(run.code, 1, "{run:?}");
    let finding = replication(&run);
    assert_eq!(finding["status"], "fail", "{finding}");
    assert!(
        finding["detail"].as_str().unwrap().contains("replica"),
        "{finding}"
    );

    // The replica gone: the primary refuses writes now, and says so.
    replica.kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    let run = loop {
        let run = coord(&primary.url(), "", &["--json", "check"]);
        if run.code == 1 || Instant::now() > deadline {
            break run;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(run.code, 1, "{run:?}");
    let finding = replication(&run);
    assert_eq!(finding["status"], "fail", "{finding}");
    assert!(
        finding["detail"].as_str().unwrap().contains("NOREPLICAS"),
        "{finding}"
    );
}

/// Bad input and corrupt state get their own exit codes, and no password is ever printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_corrupt_state_have_their_exit_codes() {
    let server = RedisServer::start();
    let url = server.url();
    let braces = coord(&url, "ns", &["locks", "show", "op:{x}"]);
    assert_eq!(braces.code, 2, "a key coord never prints: {braces:?}");
    let no_ns = coord(&url, "", &["locks", "show", "op:1"]);
    assert_eq!(no_ns.code, 2, "{no_ns:?}");
    assert_eq!(
        no_ns.stderr.trim(),
        "error: `coord locks` and `coord records` need the application's namespace, and none \
         was given: pass --app <the application's binary name> (the namespace a coordinator \
         takes when its code names none), or --namespace NS (or COORD_NAMESPACE) if the \
         application sets one",
        "says what is missing and what to pass"
    );
    let bad_ns = coord(&url, "a:b", &["locks", "show", "op:1"]);
    assert_eq!(bad_ns.code, 2, "{bad_ns:?}");
    let no_url = coord("", "ns", &["locks", "show", "op:1"]);
    assert_eq!(no_url.code, 2, "{no_url:?}");
    assert_eq!(
        no_url.stderr.trim(),
        "error: no Redis to connect to: COORD_REDIS_URL is not set and --url was not given; \
         set COORD_REDIS_URL as the application has it, or pass --url redis://host:port"
    );
    let usage = coord(&url, "ns", &["locks", "frobnicate"]);
    assert_eq!(usage.code, 2, "{usage:?}");

    set(
        &server,
        &["SET", "ns:lock:{op:1}", "garbage", "PX", "60000"],
    );
    let corrupt = coord(&url, "ns", &["--json", "locks", "show", "op:1"]);
    assert_eq!(corrupt.code, 4, "{corrupt:?}");
    assert_eq!(corrupt.json()["error"]["kind"], "corrupt");
    let listed = coord(&url, "ns", &["locks", "list", "op"]);
    assert_eq!(
        listed.code, 4,
        "a listing that met corrupt state says so: {listed:?}"
    );
    assert!(
        listed.stdout.contains("op:1") && listed.stdout.contains("corrupt"),
        "{listed:?}"
    );
    let cleared = coord(&url, "ns", &["locks", "release", "op:1", "--yes"]);
    assert_eq!(cleared.code, 0, "{cleared:?}");
    assert!(
        cleared.stdout.contains("removed the corrupt value"),
        "{cleared:?}"
    );
    assert!(!exists(&server, "ns:lock:{op:1}"));

    set(&server, &["HSET", "ns:idem:{op:2}", "st", "zzz"]);
    let corrupt = coord(&url, "ns", &["records", "show", "op:2"]);
    assert_eq!(corrupt.code, 4, "{corrupt:?}");
    let purged = coord(&url, "ns", &["records", "purge", "op:2", "--yes"]);
    assert_eq!(purged.code, 0, "{purged:?}");
    assert!(!exists(&server, "ns:idem:{op:2}"));

    let secret = RedisServer::start_with(&["--requirepass", "s3cret-pw"]);
    let wrong = format!("redis://:wrong-pw@127.0.0.1:{}", secret.port());
    let run = coord(&wrong, "ns", &["locks", "show", "op:1"]);
    assert_ne!(run.code, 0, "{run:?}");
    let run_check = coord(&wrong, "ns", &["check"]);
    assert_eq!(run_check.code, 1, "{run_check:?}");
    for r in [&run, &run_check] {
        assert!(
            !r.stdout.contains("wrong-pw") && !r.stderr.contains("wrong-pw"),
            "the password leaked: {r:?}"
        );
    }
    let help = Command::new(BIN)
        .arg("--help")
        .env("COORD_REDIS_URL", &wrong)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("wrong-pw"));
    assert!(String::from_utf8_lossy(&help.stdout).contains("Exit codes"));
}

fn set(server: &RedisServer, args: &[&str]) {
    let reply = server.command(args);
    assert!(!matches!(reply, Resp::Error(_)), "{args:?}: {reply:?}");
}

/// On a terminal, a destructive command asks: "n" changes nothing, "y" goes ahead. (The
/// terminal is a pseudo-terminal from util-linux `script`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_asked_before_a_destructive_command() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "tty").await;
    let key = c.key("op").part(&1).finish();
    let guard = c
        .lock(key.clone())
        .lease(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let on_terminal = |answer: &str| -> i32 {
        let line = format!("{BIN} locks release op:1");
        let mut child = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("COORD_REDIS_URL", &url)
            .env("COORD_NAMESPACE", "tty")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("util-linux `script` runs the CLI on a pseudo-terminal");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            shown.contains("Force-release lock `op:1`"),
            "the question: {shown}"
        );
        out.status.code().unwrap()
    };
    assert_eq!(on_terminal("n\n"), 5, "declined");
    assert!(
        exists(&server, "tty:lock:{op:1}"),
        "declining changes nothing"
    );
    assert_eq!(on_terminal("y\n"), 0, "confirmed");
    assert!(!exists(&server, "tty:lock:{op:1}"), "confirmed: released");
    drop(guard);
}

/// `rediss://` with the TLS flags: without `--tls-ca` the test CA is not trusted and the
/// connection fails; with it (and the client certificate the server requires) the tool works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_flags_reach_the_connection() {
    let certs = coord_redis_testing::TestCerts::generate();
    let server = RedisServer::start_tls(&certs, true);
    let url = server.tls_url();
    let ca = certs.ca_file();
    let (cert, key) = (certs.client_cert_file(), certs.client_key_file());
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let untrusted = coord(&url, "ns", &["--timeout", "500ms", "check"]);
    assert_eq!(
        untrusted.code, 1,
        "the test CA is not trusted by default: {untrusted:?}"
    );
    let no_client_cert = coord(&url, "ns", &["--timeout", "500ms", "--tls-ca", ca, "check"]);
    assert_eq!(
        no_client_cert.code, 1,
        "the server requires a client certificate: {no_client_cert:?}"
    );
    let full = ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key];
    let mut args = full.to_vec();
    args.extend(["--json", "check"]);
    let run = coord(&url, "ns", &args);
    assert_ne!(run.json()["verdict"], "fail", "{run:?}");
    let mut args = full.to_vec();
    args.extend(["locks", "show", "op:1"]);
    let run = coord(&url, "ns", &args);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("state:          free"), "{run:?}");
    let half = coord(&url, "ns", &["--tls-cert", cert, "check"]);
    assert_eq!(
        half.code, 2,
        "a certificate without its key is bad usage: {half:?}"
    );
}

/// `records list --scope VALUE` finds one principal's records of a coord-http layer from the
/// raw value, digested as the layer digests it, and prints neither the value nor the other
/// principals' records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_one_http_principal_are_found_by_its_raw_scope() {
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{Layer, ServiceExt};

    const ALICE: &str = "Bearer sk_test_alice_77";
    const BOB: &str = "Bearer sk_test_bob_88";
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "shop").await;
    let layer = coord_http::IdempotencyLayer::builder(c.clone())
        .scope_header(http::header::AUTHORIZATION)
        .build();
    let handler = tower::service_fn(|_request: http::Request<_>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("charged"))))
    });
    for (auth, key) in [(ALICE, "order-1"), (ALICE, "order-2"), (BOB, "order-1")] {
        let request = http::Request::post("/charge")
            .header("authorization", auth)
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from("{}")))
            .unwrap();
        let response = layer.layer(handler).oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    let alice = coord_http::scope_digest("shop", ALICE.as_bytes());

    let everyone = coord(
        &url,
        "shop",
        &["--json", "records", "list", "http.idempotency"],
    );
    assert_eq!(everyone.code, 0, "{everyone:?}");
    assert_eq!(everyone.json()["records"].as_array().unwrap().len(), 3);

    let json = coord(
        &url,
        "shop",
        &[
            "--json",
            "records",
            "list",
            "http.idempotency",
            "--scope",
            ALICE,
        ],
    );
    assert_eq!(json.code, 0, "{json:?}");
    let doc = json.json();
    assert_eq!(doc["scope_digest"], alice.as_str(), "{doc:#}");
    let mut keys: Vec<&str> = doc["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            format!("http.idempotency:{alice}:order-1"),
            format!("http.idempotency:{alice}:order-2"),
        ]
    );

    let text = coord(
        &url,
        "shop",
        &[
            "records",
            "list",
            "http.idempotency",
            "--scope",
            ALICE,
            "--limit",
            "1",
        ],
    );
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.contains(&format!("of scope {alice}")),
        "{text:?}"
    );
    let shown = coord(
        &url,
        "shop",
        &[
            "records",
            "show",
            &format!("http.idempotency:{alice}:order-1"),
        ],
    );
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(shown.stdout.contains("completed"), "{shown:?}");
    for run in [&everyone, &json, &text, &shown] {
        for raw in ["sk_test_alice_77", "sk_test_bob_88"] {
            assert!(
                !run.stdout.contains(raw) && !run.stderr.contains(raw),
                "`{raw}` printed: {run:?}"
            );
        }
    }

    let nobody = coord(
        &url,
        "shop",
        &[
            "--json",
            "records",
            "list",
            "http.idempotency",
            "--scope",
            "Bearer nobody",
            "--all",
        ],
    );
    assert_eq!(nobody.code, 0, "{nobody:?}");
    assert_eq!(nobody.json()["records"].as_array().unwrap().len(), 0);
}

/// `coord locks permits`: the permits of a full semaphore, each with its owner, lease left and
/// fencing token (the ones the holders' guards carry), the waiter's flag once a caller waits,
/// and an empty semaphore once every permit is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_permits_and_waiters_are_shown() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "shop").await;
    let key = c.key("exports.render").part(&"eu").finish();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            c.semaphore(key.clone(), 2)
                .lease(Duration::from_secs(60))
                .try_acquire()
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    let mut tokens: Vec<u64> = held
        .iter()
        .map(|p| p.fencing_token().expect("a permit's token").get())
        .collect();
    tokens.sort_unstable();
    let waiter = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move {
            c.semaphore(key, 2)
                .lease(Duration::from_secs(60))
                .wait(Duration::from_secs(30))
                .acquire()
                .await
        }
    });
    let operator = c.operator();
    eventually("the waiter is announced", || async {
        operator.semaphore(&key).await.unwrap().waiters
            == coord_core::provider::Waiters::Flagged(true)
    })
    .await;

    let show = coord(
        &url,
        "shop",
        &["--json", "locks", "permits", "exports.render:eu"],
    );
    assert_eq!(show.code, 0, "{show:?}");
    let doc = show.json();
    assert_eq!(doc["namespace"], "shop");
    assert_eq!(doc["key"], "exports.render:eu");
    assert_eq!(doc["held"], 2);
    assert_eq!(doc["waiters"]["flagged"], true);
    let permits = doc["permits"].as_array().expect("permits");
    let mut shown: Vec<u64> = permits
        .iter()
        .map(|p| p["fencing_token"].as_u64().expect("a token"))
        .collect();
    shown.sort_unstable();
    assert_eq!(shown, tokens, "the permits' own tokens");
    for permit in permits {
        let left = permit["lease_left_ms"].as_u64().unwrap();
        assert!((50_000..=60_000).contains(&left), "{permit}");
        assert_eq!(permit["owner"].as_str().unwrap().len(), 32, "{permit}");
    }

    let text = coord(&url, "shop", &["locks", "permits", "exports.render:eu"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout.starts_with("semaphore exports.render:eu\n"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("permits held:   2\n"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("waiters:        someone waits\n"));
    assert!(text.stdout.contains("PERMIT OWNER"));
    for (permit, token) in permits.iter().zip(&shown) {
        assert!(text.stdout.contains(permit["owner"].as_str().unwrap()));
        assert!(text.stdout.contains(&token.to_string()));
    }

    for permit in held {
        assert!(permit.release().await.unwrap());
    }
    let last = waiter.await.unwrap().expect("the waiter gets a permit");
    assert!(last.release().await.unwrap());
    let free = coord(
        &url,
        "shop",
        &["--json", "locks", "permits", "exports.render:eu"],
    );
    assert_eq!(free.code, 0, "{free:?}");
    assert_eq!(free.json()["held"], 0);
    assert_eq!(free.json()["permits"], serde_json::json!([]));
    let text = coord(&url, "shop", &["locks", "permits", "exports.render:eu"]);
    assert!(
        text.stdout.contains("permits held:   0\n"),
        "{}",
        text.stdout
    );
    assert!(!text.stdout.contains("PERMIT OWNER"));
}

/// `coord locks rw`: two readers with their tokens and the waiting writer whose claim keeps
/// new readers out; then, the readers gone, the writer alone with its token; then free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rw_locks_readers_writer_and_waiting_writer_are_shown() {
    let server = RedisServer::start();
    let url = server.url();
    let c = coordinator(&server, "shop").await;
    let key = c.key("catalog.prices").part(&"eu").finish();
    let rw = c.rw_lock(key.clone()).lease(Duration::from_secs(60));
    let readers = vec![
        rw.clone().read().await.unwrap(),
        rw.clone().read().await.unwrap(),
    ];
    let mut reader_tokens: Vec<u64> = readers
        .iter()
        .map(|r| r.fencing_token().unwrap().get())
        .collect();
    reader_tokens.sort_unstable();
    let writer = tokio::spawn({
        let (c, key) = (c.clone(), key.clone());
        async move {
            c.rw_lock(key)
                .lease(Duration::from_secs(60))
                .wait(Duration::from_secs(30))
                .write()
                .await
        }
    });
    let operator = c.operator();
    eventually("the writer's claim", || async {
        operator
            .rw_lock(&key)
            .await
            .unwrap()
            .waiting_writer
            .is_some()
    })
    .await;

    let show = coord(
        &url,
        "shop",
        &["--json", "locks", "rw", "catalog.prices:eu"],
    );
    assert_eq!(show.code, 0, "{show:?}");
    let doc = show.json();
    assert_eq!(doc["namespace"], "shop");
    assert_eq!(doc["key"], "catalog.prices:eu");
    assert_eq!(doc["state"], "read");
    assert_eq!(doc["writer"], Value::Null);
    let mut shown: Vec<u64> = doc["readers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["fencing_token"].as_u64().unwrap())
        .collect();
    shown.sort_unstable();
    assert_eq!(shown, reader_tokens, "the readers' own tokens");
    let claim = &doc["waiting_writer"];
    assert_eq!(claim["owner"].as_str().unwrap().len(), 32, "{claim}");
    let claim_left = claim["claim_left_ms"].as_u64().unwrap();
    assert!(
        claim_left > 0 && claim_left <= 5_000,
        "a claim is at most 5 s: {claim}"
    );
    assert_eq!(doc["waiters"]["flagged"], true);

    let text = coord(&url, "shop", &["locks", "rw", "catalog.prices:eu"]);
    assert_eq!(text.code, 0, "{text:?}");
    assert!(
        text.stdout
            .starts_with("read-write lock catalog.prices:eu\n  state:          read (2 readers)\n"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains(&format!(
        "waiting writer: {} (keeps new readers out for",
        claim["owner"].as_str().unwrap()
    )));
    assert!(text.stdout.contains("READER OWNER"));
    assert!(!text.stdout.contains("WRITER OWNER"));

    for reader in readers {
        assert!(reader.release().await.unwrap());
    }
    let writer = writer.await.unwrap().expect("the writer gets the key");
    let writer_token = writer.fencing_token().unwrap().get();
    let show = coord(
        &url,
        "shop",
        &["--json", "locks", "rw", "catalog.prices:eu"],
    );
    let doc = show.json();
    assert_eq!(doc["state"], "write");
    assert_eq!(doc["readers"], serde_json::json!([]));
    assert_eq!(doc["writer"]["fencing_token"], writer_token);
    assert_eq!(
        doc["writer"]["owner"], claim["owner"],
        "the claimant got in"
    );
    assert_eq!(doc["waiting_writer"], Value::Null);
    let text = coord(&url, "shop", &["locks", "rw", "catalog.prices:eu"]);
    assert!(
        text.stdout.contains("state:          write\n"),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("WRITER OWNER"));
    assert!(text.stdout.contains(&writer_token.to_string()));

    assert!(writer.release().await.unwrap());
    let free = coord(
        &url,
        "shop",
        &["--json", "locks", "rw", "catalog.prices:eu"],
    );
    assert_eq!(free.json()["state"], "free");
    assert_eq!(free.json()["writer"], Value::Null);
}

/// Corrupt state under a semaphore's or a read-write lock's keys exits 4 naming it, never a
/// made-up holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_semaphore_and_rw_lock_state_exits_4() {
    let server = RedisServer::start();
    let url = server.url();
    server.command(&["SET", "shop:sem:{jobs.sem:x}", "not a sorted set"]);
    let run = coord(&url, "shop", &["locks", "permits", "jobs.sem:x"]);
    assert_eq!(run.code, 4, "{run:?}");
    server.command(&["HSET", "shop:rw:{jobs.rw:x}", "wx", "soon", "w", "x"]);
    let run = coord(&url, "shop", &["locks", "rw", "jobs.rw:x"]);
    assert_eq!(run.code, 4, "{run:?}");
    // A live reader whose token coord would have written beside it is missing.
    let far = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000)
        .to_string();
    server.command(&["ZADD", "shop:rw-r:{jobs.rw:y}", &far, &"ab".repeat(16)]);
    let run = coord(&url, "shop", &["--json", "locks", "rw", "jobs.rw:y"]);
    assert_eq!(run.code, 4, "{run:?}");
}
