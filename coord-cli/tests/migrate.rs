//! `coord migrate` and the PostgreSQL connection options, end to end: the binary against a
//! real PostgreSQL server started here.

use std::process::{Command, Stdio};

use coord_core::Coordinator;
use coord_postgres::{PostgresProvider, SCHEMA_VERSION};
use coord_postgres_testing::PostgresServer;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_coord");

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `coord args` with only the given variables of coord's set.
fn coord(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("COORD_REDIS_URL")
        .env_remove("COORD_POSTGRES_URL")
        .env_remove("COORD_POSTGRES_SCHEMA")
        .env_remove("COORD_NAMESPACE")
        .env_remove("COORD_LOG")
        .env_remove("RUST_LOG")
        .env("USER", "tester")
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

#[test]
fn migrate_creates_the_tables_once_and_says_so() {
    let server = PostgresServer::start();
    let url = server.url();
    let first = coord(&["migrate", "--postgres-url", &url], &[]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(
        first
            .stdout
            .contains(&format!("migrated from version 0 to {SCHEMA_VERSION}")),
        "{}",
        first.stdout
    );
    let versions = server.sql("SELECT max(version) FROM coord.schema_version");
    assert_eq!(versions, SCHEMA_VERSION.to_string());

    // Again, through the variable and as JSON: nothing to do.
    let again = coord(&["migrate", "--json"], &[("COORD_POSTGRES_URL", &url)]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let doc: Value = serde_json::from_str(&again.stdout).expect("one JSON document");
    assert_eq!(doc["schema"], "coord");
    assert_eq!(doc["from"], SCHEMA_VERSION);
    assert_eq!(doc["applied"], false);

    // Another schema, by option.
    let other = coord(
        &[
            "migrate",
            "--postgres-url",
            &url,
            "--postgres-schema",
            "jobs_coord",
        ],
        &[],
    );
    assert_eq!(other.code, 0, "{}", other.stderr);
    assert!(other.stdout.contains("`jobs_coord`"), "{}", other.stdout);
    assert_eq!(server.sql("SELECT count(*) FROM jobs_coord.records"), "0");
}

#[test]
fn migrate_refuses_what_it_cannot_do_with_the_documented_exit_codes() {
    let missing = coord(&["migrate"], &[]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("COORD_POSTGRES_URL"),
        "{}",
        missing.stderr
    );

    let server = PostgresServer::start();
    let url = server.url();
    assert_eq!(coord(&["migrate", "--postgres-url", &url], &[]).code, 0);
    server.sql("INSERT INTO coord.schema_version (version, name) VALUES (99, 'future')");
    let newer = coord(&["migrate", "--postgres-url", &url], &[]);
    assert_eq!(newer.code, 2, "{}", newer.stderr);
    assert!(
        newer.stderr.contains("upgrade coord-postgres"),
        "{}",
        newer.stderr
    );

    let nobody = coord(
        &[
            "migrate",
            "--postgres-url",
            "postgres://u@127.0.0.1:1/db",
            "--timeout",
            "2s",
        ],
        &[],
    );
    assert_eq!(nobody.code, 3, "{}", nobody.stderr);

    let bad_schema = coord(
        &[
            "migrate",
            "--postgres-url",
            &url,
            "--postgres-schema",
            "Not-A-Name",
        ],
        &[],
    );
    assert_eq!(bad_schema.code, 2, "{}", bad_schema.stderr);
}

#[test]
fn the_operations_commands_work_over_postgres() {
    let server = PostgresServer::start();
    let url = server.url();
    assert_eq!(coord(&["migrate", "--postgres-url", &url], &[]).code, 0);
    // Before migrating another schema, the tools say what to run.
    let unmigrated = coord(
        &["locks", "show", "jobs:1", "--postgres-schema", "elsewhere"],
        &[("COORD_POSTGRES_URL", &url), ("COORD_NAMESPACE", "app")],
    );
    assert_eq!(unmigrated.code, 2, "{}", unmigrated.stderr);
    assert!(
        unmigrated.stderr.contains("coord migrate"),
        "{}",
        unmigrated.stderr
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let coordinator = runtime.block_on(async {
        let provider = PostgresProvider::connect(&url).await.expect("connect");
        Coordinator::builder()
            .namespace("app")
            .provider(provider)
            .build()
            .unwrap()
    });
    let key = coordinator.key("jobs").part("1").finish();
    let guard = runtime
        .block_on(coordinator.lock(key.clone()).fenced().try_acquire())
        .unwrap()
        .expect("free");
    let env = [
        ("COORD_POSTGRES_URL", url.as_str()),
        ("COORD_NAMESPACE", "app"),
    ];
    let listed = coord(&["locks", "list", "jobs", "--json"], &env);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    assert!(listed.stdout.contains("jobs:1"), "{}", listed.stdout);
    let shown = coord(&["locks", "show", "jobs:1"], &env);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let released = coord(&["locks", "release", "jobs:1", "--yes"], &env);
    assert_eq!(released.code, 0, "{}", released.stderr);
    let holder = runtime
        .block_on(coordinator.operator().lock(&key))
        .unwrap()
        .holder;
    assert_eq!(holder, None, "the CLI freed the lock");
    drop(guard);

    // Both backends named at once: refused rather than guessed.
    let both = coord(
        &["locks", "list", "jobs"],
        &[
            ("COORD_POSTGRES_URL", url.as_str()),
            ("COORD_REDIS_URL", "redis://127.0.0.1:1"),
            ("COORD_NAMESPACE", "app"),
        ],
    );
    assert_eq!(both.code, 2, "{}", both.stderr);
}
