//! `coord check --postgres-url ..`, end to end: the binary against real PostgreSQL servers
//! started here, each set the way one check judges. The standby is a real one, made with
//! `pg_basebackup` from a primary and streaming from it (about 6 s more than a plain server,
//! measured on a loaded 2-core host).

use std::process::{Command, Stdio};

use coord_postgres::SCHEMA_VERSION;
use coord_postgres_testing::{PostgresServer, ServerOptions};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_coord");

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

    /// The text line of check `name`, which must exist.
    fn line(&self, name: &str) -> &str {
        self.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no `{name}` line: {self:?}"))
    }

    /// The JSON entry of check `name`, which must exist.
    fn check(&self, name: &str) -> Value {
        self.json()["checks"]
            .as_array()
            .expect("a list of checks")
            .iter()
            .find(|c| c["check"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no `{name}` check: {self:?}"))
    }
}

/// Runs `coord args` with none of coord's variables but `env`.
fn coord(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("COORD_REDIS_URL")
        .env_remove("COORD_POSTGRES_URL")
        .env_remove("COORD_POSTGRES_SCHEMA")
        .env_remove("COORD_NAMESPACE")
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

/// `coord check` on `url`, text or JSON.
fn check(url: &str, json: bool, more: &[&str]) -> Run {
    let mut args = vec!["check", "--postgres-url", url];
    if json {
        args.push("--json");
    }
    args.extend_from_slice(more);
    coord(&args, &[])
}

/// A server with `fsync` and `full_page_writes` on (the testing crate turns both off unless
/// asked), plus `settings`.
fn durable(settings: &[(&str, &str)]) -> ServerOptions {
    settings
        .iter()
        .fold(ServerOptions::new().durable(), |options, (name, value)| {
            options.setting(name, value)
        })
}

fn migrate(url: &str) {
    let run = coord(&["migrate", "--postgres-url", url], &[]);
    assert_eq!(run.code, 0, "{run:?}");
}

const EVERY_CHECK: [&str; 10] = [
    "connect",
    "version",
    "replication",
    "fsync",
    "full_page_writes",
    "synchronous_commit",
    "schema",
    "expired rows",
    "connections",
    "clock",
];

#[test]
fn a_healthy_server_passes_every_check_in_text_and_json() {
    let server = PostgresServer::start_configured(durable(&[]));
    let url = server.url();
    migrate(&url);

    let run = check(&url, false, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    for name in EVERY_CHECK {
        assert!(run.line(name).contains(" OK "), "{name}: {run:?}");
    }
    assert!(
        run.stdout.contains("verdict: OK (0 failures, 0 warnings)"),
        "{run:?}"
    );
    assert!(
        run.line("schema")
            .contains(&format!("version {SCHEMA_VERSION} in schema `coord`")),
        "{run:?}"
    );

    // The variable instead of the option, as JSON: the Redis check's shape.
    let run = coord(&["--json", "check"], &[("COORD_POSTGRES_URL", &url)]);
    assert_eq!(run.code, 0, "{run:?}");
    let doc = run.json();
    assert_eq!(doc["verdict"], "ok", "{run:?}");
    assert_eq!(doc["failures"], 0);
    assert_eq!(doc["warnings"], 0);
    assert!(doc["target"].as_str().unwrap().contains("127.0.0.1"));
    let checks = doc["checks"].as_array().unwrap();
    let names: Vec<&str> = checks
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(names, EVERY_CHECK, "{run:?}");
    for c in checks {
        assert_eq!(c["status"], "ok", "{c}");
        assert!(c["node"].as_str().unwrap().contains("127.0.0.1"), "{c}");
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{c}");
    }
    let node = &doc["nodes"][0];
    assert_eq!(node["backend"], "postgres");
    assert_eq!(node["fsync"], "on");
    assert_eq!(node["synchronous_commit"], "on");
    assert_eq!(node["in_recovery"], false);
    assert_eq!(node["schema_version"], SCHEMA_VERSION);
    assert_eq!(node["pool_size"], 8, "the provider's default pool");
    assert!(node["version_num"].as_u64().unwrap() >= 120_000, "{node}");
    // The clock is reported with its offset; on this host the server's clock is this clock.
    let offset = node["clock_offset_ms"].as_i64().expect("an offset");
    assert!(offset.abs() < 1_000, "{node}");
    assert!(node["clock_uncertainty_ms"].as_u64().is_some(), "{node}");
    assert!(
        run.check("clock")["detail"]
            .as_str()
            .unwrap()
            .contains("ms) against this host")
    );

    // Options of the other backend are refused before anything is read.
    let both = check(&url, false, &["--replica-acks", "1"]);
    assert_eq!(both.code, 2, "{both:?}");
    assert!(
        both.stderr.contains("--replica-acks is for Redis"),
        "{both:?}"
    );
    let redis_only = coord(
        &["check", "--pool-size", "4"],
        &[("COORD_REDIS_URL", "redis://127.0.0.1:1")],
    );
    assert_eq!(redis_only.code, 2, "{redis_only:?}");
    let both_urls = coord(
        &[
            "check",
            "--postgres-url",
            &url,
            "--url",
            "redis://127.0.0.1:1",
        ],
        &[],
    );
    assert_eq!(both_urls.code, 2, "{both_urls:?}");
}

#[test]
fn an_unreachable_server_fails_the_connect_check() {
    let mut gone = PostgresServer::start();
    let url = gone.url();
    gone.kill();
    let run = check(&url, false, &["--timeout", "1s"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.line("connect").contains(" FAIL "), "{run:?}");
    assert!(run.stdout.contains("verdict: FAIL"), "{run:?}");
}

#[test]
fn fsync_off_fails_and_full_page_writes_off_warns() {
    // The testing crate's default: both off.
    let server = PostgresServer::start();
    let url = server.url();
    migrate(&url);
    let run = check(&url, false, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    let fsync = run.line("fsync");
    assert!(fsync.contains(" FAIL ") && fsync.contains("off"), "{run:?}");
    assert!(fsync.contains("`fsync = on`"), "it names the fix: {run:?}");
    assert!(run.line("full_page_writes").contains(" WARN "), "{run:?}");
    assert!(
        run.stdout.contains("verdict: FAIL (1 failure, 1 warning)"),
        "{run:?}"
    );
    let run = check(&url, true, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.check("fsync")["status"], "fail");
    assert_eq!(run.json()["nodes"][0]["fsync"], "off");
}

#[test]
fn synchronous_commit_off_warns() {
    let server = PostgresServer::start_configured(durable(&[("synchronous_commit", "off")]));
    let url = server.url();
    migrate(&url);
    let run = check(&url, false, &[]);
    assert_eq!(run.code, 0, "a warning is not a failure: {run:?}");
    let line = run.line("synchronous_commit");
    assert!(line.contains(" WARN ") && line.contains("off"), "{run:?}");
    assert!(line.contains("ALTER ROLE"), "it names the fix: {run:?}");
    assert!(
        run.stdout.contains("verdict: WARN (0 failures, 1 warning)"),
        "{run:?}"
    );
}

#[test]
fn synchronous_standbys_asked_for_but_absent_fail() {
    let server = PostgresServer::start_configured(durable(&[]));
    let url = server.url();
    // Migrated first: with the standby asked for, every commit waits for it.
    migrate(&url);
    server.sql("ALTER SYSTEM SET synchronous_standby_names = 'standby_a'");
    server.sql("SELECT pg_reload_conf()");
    // The reload is asynchronous: wait until a new session sees it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.sql("SHOW synchronous_standby_names").trim() != "standby_a" {
        assert!(std::time::Instant::now() < deadline, "not reloaded");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let run = check(&url, false, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    let line = run.line("replication");
    assert!(
        line.contains(" FAIL ") && line.contains("standby_a") && line.contains("0 in sync"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("verdict: FAIL (1 failure, 0 warnings)"),
        "{run:?}"
    );
}

#[test]
fn the_schema_version_is_judged_against_the_tools() {
    let server = PostgresServer::start_configured(durable(&[]));
    let url = server.url();

    let run = check(&url, false, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    let line = run.line("schema");
    assert!(
        line.contains(" FAIL ") && line.contains("run coord migrate"),
        "{run:?}"
    );
    assert!(
        !run.stdout.contains("expired rows"),
        "no tables, nothing to sweep: {run:?}"
    );
    assert!(
        run.stdout.contains("verdict: FAIL (1 failure, 0 warnings)"),
        "only the schema fails: {run:?}"
    );

    // Another schema is looked in when named.
    migrate(&url);
    let run = check(&url, false, &["--postgres-schema", "elsewhere"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.line("schema").contains("`elsewhere`"), "{run:?}");

    // An older version: the last migration's row removed.
    server.sql(&format!(
        "DELETE FROM coord.schema_version WHERE version = {SCHEMA_VERSION}"
    ));
    let run = check(&url, false, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    let line = run.line("schema");
    assert!(
        line.contains(" FAIL ")
            && line.contains(&format!("version {}", SCHEMA_VERSION - 1))
            && line.contains("older")
            && line.contains("run coord migrate"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("verdict: FAIL (1 failure, 0 warnings)"),
        "{run:?}"
    );

    // Newer than the tool: upgrade the tool.
    server.sql("INSERT INTO coord.schema_version (version, name) VALUES (99, 'future')");
    let run = check(&url, true, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    let schema = run.check("schema");
    assert_eq!(schema["status"], "fail");
    assert!(
        schema["detail"].as_str().unwrap().contains("upgrade coord"),
        "{run:?}"
    );
    assert_eq!(run.json()["nodes"][0]["schema_version"], 99);
    assert_eq!(run.json()["verdict"], "fail");
}

#[test]
fn rows_expired_longer_than_the_sweep_interval_warn_with_count_and_age() {
    let server = PostgresServer::start_configured(durable(&[]));
    let url = server.url();
    migrate(&url);
    // As a deployment whose providers all run without a sweeper leaves them.
    server.sql(
        "INSERT INTO coord.locks (key, owner, expires_at) VALUES
           ('ns:op:a', gen_random_uuid(), clock_timestamp() - interval '1 hour'),
           ('ns:op:b', gen_random_uuid(), clock_timestamp() - interval '2 hours'),
           ('ns:op:recent', gen_random_uuid(), clock_timestamp() - interval '10 seconds'),
           ('ns:op:live', gen_random_uuid(), clock_timestamp() + interval '1 hour');
         INSERT INTO coord.cache (key, value, expires_at) VALUES
           ('ns:op:c', '\\x00', clock_timestamp() - interval '3 hours');",
    );

    let run = check(&url, false, &[]);
    assert_eq!(run.code, 0, "a warning is not a failure: {run:?}");
    let line = run.line("expired rows");
    assert!(line.contains(" WARN "), "{run:?}");
    // The row expired 10 s ago is within the default sweep interval's margin.
    assert!(line.contains("2 in locks (oldest expired 2h"), "{run:?}");
    assert!(line.contains("1 in cache (oldest expired 3h"), "{run:?}");
    assert!(line.contains("sweeper"), "it says why: {run:?}");
    assert!(
        run.stdout.contains("verdict: WARN (0 failures, 1 warning)"),
        "{run:?}"
    );

    // With a one-second sweep interval, the row expired 10 s ago is late too.
    let run = check(&url, true, &["--sweep-interval", "1s"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.check("expired rows")["status"], "warn");
    let expired = run.json()["nodes"][0]["expired"].clone();
    let locks = expired
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["table"] == "locks")
        .cloned()
        .unwrap_or_else(|| panic!("locks counted: {run:?}"));
    assert_eq!(locks["rows"], 3, "{run:?}");
    assert!(locks["oldest_ms"].as_u64().unwrap() >= 7_200_000, "{run:?}");
    assert_eq!(run.json()["nodes"][0]["expired_for_ms"], 2_000);

    // Swept, the check passes.
    server.sql(
        "DELETE FROM coord.locks WHERE expires_at < clock_timestamp(); DELETE FROM coord.cache",
    );
    let run = check(&url, false, &[]);
    assert!(run.line("expired rows").contains(" OK "), "{run:?}");
}

#[test]
fn a_pool_larger_than_the_connections_left_warns_and_no_slot_left_fails() {
    // 6 slots, 3 of them for superusers only: 3 left for an application.
    let server = PostgresServer::start_configured(durable(&[]).max_connections(6));
    let url = server.url();
    migrate(&url);

    let run = check(&url, false, &[]);
    assert_eq!(run.code, 0, "a warning is not a failure: {run:?}");
    let line = run.line("connections");
    assert!(
        line.contains(" WARN ") && line.contains("3 left of max_connections 6"),
        "{run:?}"
    );
    assert!(line.contains("pool of 8 needs 9"), "{run:?}");
    assert!(
        run.stdout.contains("verdict: WARN (0 failures, 1 warning)"),
        "{run:?}"
    );

    let run = check(&url, false, &["--pool-size", "2"]);
    assert!(run.line("connections").contains(" OK "), "{run:?}");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let session = || {
        runtime.block_on(async {
            let (client, connection) = coord_postgres::tokio_postgres::connect(
                &url,
                coord_postgres::tokio_postgres::NoTls,
            )
            .await
            .expect("a session");
            tokio::spawn(connection);
            client
        })
    };
    let mut held = vec![session()];

    // An application's role, which is not shown other sessions' types: the session held
    // counts, the server's own processes do not.
    server.sql(
        "CREATE ROLE app LOGIN; GRANT USAGE ON SCHEMA coord TO app;
         GRANT SELECT ON ALL TABLES IN SCHEMA coord TO app;",
    );
    let app_url = url.replace("postgres@", "app@");
    let run = check(&app_url, true, &["--pool-size", "1"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["nodes"][0]["connections_in_use"], 1, "{run:?}");
    assert_eq!(run.check("connections")["status"], "ok", "{run:?}");
    let run = check(&app_url, true, &["--pool-size", "2"]);
    assert_eq!(run.check("connections")["status"], "warn", "{run:?}");

    // Three sessions take every slot an application may use.
    held.extend([session(), session()]);
    // The check connects as a superuser, into a reserved slot.
    let run = check(&url, true, &["--pool-size", "2"]);
    assert_eq!(run.code, 1, "{run:?}");
    let connections = run.check("connections");
    assert_eq!(connections["status"], "fail", "{run:?}");
    assert_eq!(run.json()["verdict"], "fail", "{run:?}");
    assert_eq!(run.json()["failures"], 1, "{run:?}");
    assert_eq!(run.json()["nodes"][0]["connections_left"], 0);
    assert_eq!(run.json()["nodes"][0]["connections_in_use"], 3);
    drop(held);
}

#[test]
fn a_standby_fails_and_its_primary_is_judged_by_its_synchronous_standbys() {
    let primary = PostgresServer::start_configured(durable(&[]));
    let url = primary.url();
    migrate(&url);
    // Durable like its primary: the check judges the standby's settings too.
    let standby = primary.start_standby("standby_a", ServerOptions::new().durable());

    // coord cannot write to a standby.
    let run = check(&standby.url(), false, &[]);
    assert_eq!(run.code, 1, "{run:?}");
    let line = run.line("replication");
    assert!(
        line.contains(" FAIL ") && line.contains("standby"),
        "{run:?}"
    );
    assert!(
        run.stdout.contains("verdict: FAIL (1 failure, 0 warnings)"),
        "{run:?}"
    );

    // The primary streams to an asynchronous standby: a failover can lose what it acknowledged.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while primary.sql("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'") != "1" {
        assert!(std::time::Instant::now() < deadline, "no streaming standby");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let run = check(&url, true, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let replication = run.check("replication");
    assert_eq!(replication["status"], "warn", "{run:?}");
    assert!(
        replication["detail"]
            .as_str()
            .unwrap()
            .contains("asynchronous"),
        "{run:?}"
    );
    assert_eq!(run.json()["nodes"][0]["standbys"][0]["name"], "standby_a");

    // Commits wait for it once it is named synchronous.
    primary.sql("ALTER SYSTEM SET synchronous_standby_names = 'standby_a'");
    primary.sql("SELECT pg_reload_conf()");
    while primary.sql("SELECT sync_state FROM pg_stat_replication") != "sync" {
        assert!(
            std::time::Instant::now() < deadline,
            "the standby is not sync"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let run = check(&url, false, &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let line = run.line("replication");
    assert!(
        line.contains(" OK ") && line.contains("1 in sync") && line.contains("standby_a"),
        "{run:?}"
    );
    assert!(run.stdout.contains("verdict: OK"), "{run:?}");
    drop(standby);
}
