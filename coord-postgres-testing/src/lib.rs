//! Throwaway PostgreSQL servers for tests.
//!
//! Every server started here is a real `postgres` process (not an imitation) with its own
//! data directory, made by copying one `initdb` run per test process. It listens on
//! 127.0.0.1 on a free port (never 5432) and on a Unix socket in its private temporary
//! directory, accepts the superuser `postgres` without a password, and is killed, its
//! directory removed, when its handle is dropped (also when a test panics).
//!
//! The binaries (`initdb`, `postgres`, `psql`) are found through `POSTGRES_BIN_DIR`,
//! `pg_config --bindir`, `/usr/lib/postgresql/<version>/bin` (Debian and Ubuntu) or the
//! `PATH`; when they are missing, starting a server panics naming the package to install
//! (`postgresql`): a test that needs PostgreSQL fails rather than being skipped.
//!
//! PostgreSQL refuses to run as root. A test process running as root (a container, CI)
//! starts the server as the `postgres` account (which the `postgresql` package creates), or
//! as `nobody`, with the server's directory given to that account.
//!
//! ```
//! use coord_postgres_testing::PostgresServer;
//!
//! let mut server = PostgresServer::start();
//! // Hand `server.url()` to the code under test; look at what it did with `sql`.
//! server.sql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)");
//! assert_eq!(server.sql("SELECT v FROM t"), "7");
//! // A killed and restarted server answers on the same port, with what was committed.
//! server.restart();
//! assert_eq!(server.sql("SELECT v FROM t"), "7");
//! ```
//!
//! What a test can do to a server, to check how the code under test copes:
//!
//! | helper | what happens |
//! |---|---|
//! | [`PostgresServer::pause`] / [`resume`](PostgresServer::resume) | SIGSTOP / SIGCONT to the postmaster and every backend: open connections hang, new ones get no answer |
//! | [`PostgresServer::kill`], [`restart`](PostgresServer::restart) | SIGKILL to all of it (a crash), then a start on the same data directory and port (crash recovery) |
//! | [`PostgresServer::terminate_connections`] | `pg_terminate_backend` of every session with a given `application_name` |
//! | [`ServerOptions::max_connections`], [`PostgresServer::set_max_connections`] | a connection limit (the latter restarts the server cleanly) |
//! | [`PostgresServer::set_read_only`] | `default_transaction_read_only`, reloaded: writes fail from each session's next statement |
//! | [`PostgresServer::start_standby`], [`promote`](PostgresServer::promote) | a streaming standby of a server (`pg_basebackup`), promoted to a primary (`pg_promote`): a failover |
//! | [`PostgresServer::sql`] | any SQL, as the superuser, through `psql` (bounded: fails after 20 s) |
//!
//! By default the server runs with `fsync = off` (a killed server keeps its commits: the
//! operating system has them; a power cut would not) and `synchronous_commit` on;
//! [`ServerOptions::durable`] keeps `fsync` on.

mod binaries;
mod dirs;
mod process;
mod psql;
mod server;
mod user;

pub use binaries::{BIN_DIR_ENV, postgres_bin_dir};
pub use server::{PostgresServer, ServerOptions};
