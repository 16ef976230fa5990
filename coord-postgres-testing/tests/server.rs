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

/// Field `n` after the command name in `/proc/<pid>/stat` (0: the state, 1: the parent).
fn proc_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n).map(str::to_owned)
}

/// The postmaster's children still running (neither stopped nor exited).
fn running_children(postmaster: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| proc_field(*pid, 1).and_then(|p| p.parse().ok()) == Some(postmaster))
        .filter(|pid| {
            proc_field(*pid, 0).is_some_and(|s| !matches!(s.as_str(), "T" | "t" | "Z" | "X"))
        })
        .collect()
}

/// A pause that lands while the postmaster forks backends for new connections stops those
/// too: none runs on through the pause.
#[test]
fn a_pause_during_connection_storms_stops_every_backend() {
    let server = PostgresServer::start();
    let postmaster = server.pid().expect("running");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let storms: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            let port = server.port();
            std::thread::spawn(move || {
                // Each connection makes the postmaster fork a backend, which exits when the
                // connection is closed before saying anything.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                    let _ = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(50));
                }
            })
        })
        .collect();
    let mut missed = Vec::new();
    for _ in 0..60 {
        server.pause();
        // Stopping is asynchronous: give every signalled process a moment to stop.
        let deadline = Instant::now() + Duration::from_millis(500);
        let mut running = running_children(postmaster);
        while !running.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            running = running_children(postmaster);
        }
        missed.extend(running);
        server.resume();
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for storm in storms {
        storm.join().unwrap();
    }
    assert!(
        missed.is_empty(),
        "backends ran on through a pause: {missed:?}"
    );
    assert_eq!(
        server.sql("SELECT 1"),
        "1",
        "the server answers after the pauses"
    );
}

/// A process working in the server's data directory that is not the postmaster's child (as
/// a server process orphaned by a missed signal is) dies with the server's handle.
#[test]
fn a_dropped_server_leaves_no_process_in_its_directory() {
    let server = PostgresServer::start();
    let mut stray = std::process::Command::new("sleep")
        .arg("60")
        .current_dir(server.socket_dir().join("data"))
        .spawn()
        .expect("run sleep");
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = stray.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = stray.kill();
            let _ = stray.wait();
            panic!("a process in the data directory outlived the server");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
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
