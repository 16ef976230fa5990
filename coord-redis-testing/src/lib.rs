//! Throwaway Redis deployments for tests: a server, a cluster, a Sentinel setup.
//!
//! Every process started here listens on 127.0.0.1 on a free port (never 6379), keeps no
//! data on disk (`--save "" --appendonly no`), logs into a private temporary directory, and is
//! killed when its handle is dropped (also when a test panics).
//!
//! The `redis-server` binary is taken from `REDIS_SERVER_BIN` or the `PATH`. When it cannot
//! be found or started, these functions panic with the fix in the message
//! (`apt-get install redis-server`): a test that needs Redis fails loudly rather than
//! skipping.
//!
//! [`RedisServer::command`] is a minimal blocking client, enough for tests to inspect or
//! tamper with the data (`PTTL`, `TYPE`, `INFO commandstats`, planting a wrong-typed value).
//!
//! Beyond plain TCP: [`ServerOptions`] starts a server that also listens with TLS (on a
//! second port, with certificates from [`TestCerts`], optionally requiring client
//! certificates), on a Unix socket, or with a password; [`RedisCluster::start_tls`] and
//! [`SentinelSetup::start_configured`] do the same for a cluster and a Sentinel setup. Every
//! such server keeps its plain loopback port for the test's own client ([`RedisServer::command`]
//! authenticates when the server has a password); give the code under test the TLS or socket
//! address ([`RedisServer::tls_url`], [`RedisServer::unix_url`]).
//!
//! ```
//! use coord_redis_testing::{RedisServer, Resp};
//!
//! let mut server = RedisServer::start();
//! // Hand `server.url()` to the code under test; inspect what it did with `command`.
//! assert_eq!(server.command(&["SET", "k", "v"]), Resp::Simple("OK".into()));
//! assert_eq!(server.command(&["GET", "k"]).text().as_deref(), Some("v"));
//! // A restarted server answers on the same port, without the data.
//! server.restart();
//! assert_eq!(server.command(&["GET", "k"]), Resp::Nil);
//! ```
//!
//! # Where things live
//!
//! Everything is re-exported here; the source is split by concept, one module each:
//!
//! - `server`: one process, [`RedisServer`] (start, pause, resume, kill, restart, the
//!   test's own commands, a process-wide [`RedisServer::shared`] one) and the
//!   [`ServerOptions`] it starts with.
//! - `cluster`: [`RedisCluster`], masters with the slots split evenly between them, and
//!   slots moved between them under load ([`RedisCluster::move_slots`]).
//! - `sentinel`: [`SentinelSetup`] (a master, its replica, three Sentinels; failovers and
//!   crashes), the [`SentinelOptions`] it starts with, and each [`SentinelProcess`].
//! - `certs`: [`TestCerts`], a throwaway CA with server and client certificates, for TLS.
//! - `monitor`: what a server executes, through `MONITOR` ([`Monitor`], [`Monitored`]) and
//!   `INFO commandstats` ([`RedisServer::command_calls`]).
//! - `client`: the blocking test client, [`command_at`], [`command_at_auth`] and their
//!   [`Resp`] replies.
//! - `process`: what a process needs around it: the binary ([`redis_server_binary`]), a
//!   private scratch directory, signals.
//! - `ports`: the loopback address and free ports on it.
//! - `lan`: [`TestLan`], network namespaces joined by a bridge, for partitions (needs root),
//!   and [`LanServer`], a data node or Sentinel living in one of them.
//! - `wait`: waiting with a deadline, for a process to answer and for a condition to hold.

mod certs;
mod client;
mod cluster;
mod lan;
mod monitor;
mod ports;
mod process;
mod sentinel;
mod server;
mod wait;

pub use certs::TestCerts;
pub use client::{Resp, command_at, command_at_auth, command_to};
pub use cluster::RedisCluster;
pub use lan::{LanServer, TestLan};
pub use monitor::{Monitor, Monitored};
pub use process::redis_server_binary;
pub use sentinel::{SentinelOptions, SentinelProcess, SentinelSetup};
pub use server::{RedisServer, ServerOptions};

// Runs the README's example with the doctests, so that it cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;
