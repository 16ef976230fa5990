//! The harness itself: a server starts, answers, survives a kill and restart with its
//! commits, pauses and resumes, ends sessions by name, and takes a connection limit and
//! read-only mode.

use std::time::{Duration, Instant};

use coord_postgres_testing::{PostgresServer, ServerOptions};

#[test]
fn a_server_keeps_commits_across_a_kill_and_restart() {
    let mut server = PostgresServer::start();
    server.sql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)");
    let port = server.port();
    server.restart();
    assert_eq!(server.port(), port, "the same port after a restart");
    assert_eq!(server.sql("SELECT v FROM t"), "7", "commits survive a kill");
    assert!(server.unix_url().contains("host="), "{}", server.unix_url());
    assert!(
        server
            .socket_dir()
            .join(format!(".s.PGSQL.{port}"))
            .exists()
    );
}

#[test]
fn a_paused_server_answers_nothing_until_resumed() {
    let server = std::sync::Arc::new(PostgresServer::start());
    // A session opened before the pause (its backend is paused too).
    server.sql("SELECT 1");
    server.pause();
    let asking = std::thread::spawn({
        let server = server.clone();
        move || server.try_sql("SELECT 41 + 1")
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!asking.is_finished(), "a paused server answered");
    let resumed = Instant::now();
    server.resume();
    assert_eq!(asking.join().unwrap().as_deref(), Ok("42"));
    assert!(resumed.elapsed() < Duration::from_secs(15));
}

#[test]
fn read_only_mode_refuses_writes_and_can_be_undone() {
    let server = PostgresServer::start();
    server.sql("CREATE TABLE t (v int)");
    server.set_read_only(true);
    let err = server.try_sql("INSERT INTO t VALUES (1)").unwrap_err();
    assert!(err.contains("read-only"), "{err}");
    server.set_read_only(false);
    server.sql("INSERT INTO t VALUES (1)");
}

#[test]
fn connection_limits_and_terminations() {
    let mut server = PostgresServer::start_configured(ServerOptions::new().max_connections(7));
    assert_eq!(server.sql("SHOW max_connections"), "7");
    server.set_max_connections(9);
    assert_eq!(server.sql("SHOW max_connections"), "9");
    assert_eq!(server.terminate_connections("nobody-uses-this-name"), 0);
    assert_eq!(server.connections("nobody-uses-this-name"), 0);
}
