//! # coord-redis
//!
//! The Redis provider for coord: `#[distributed_lock]`, `#[idempotent]` and
//! `#[single_flight]` coordinating across every process that shares one Redis deployment
//! (a single server, a Sentinel-managed master, or Redis Cluster).
//!
//! ```no_run
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! // COORD_REDIS_URL=redis://127.0.0.1:6379, and any COORD_NAMESPACE, COORD_WAIT,
//! // COORD_PROFILE_<NAME>_<FIELD>, ...: every COORD_* variable applies.
//! coord_redis::coordinator_from_env().await?.install()?;
//! # Ok(())
//! # }
//! ```
//!
//! That is the route to take ([`coordinator_from_env`], or [`coordinator_from_config`] for a
//! configuration file). Building the provider in code ([`RedisProvider::builder`]) and giving
//! it to `Coordinator::builder().provider(..)` sets everything in code instead: that builder
//! reads no `COORD_*` variable but `COORD_NAMESPACE`, and warns once when it finds durations or
//! profiles set there that it does not apply.
//!
//! ## Connecting
//! One server is named by a URL; the same forms are accepted whichever client library is in
//! use (they are parsed once, by coord, with the `url` crate):
//!
//! | form | what |
//! |---|---|
//! | `redis://[user[:password]@]host[:port][/db]` | TCP; `valkey://` too; a bare `host:port` means this |
//! | `rediss://[user[:password]@]host[:port][/db]` | TLS (the `tls` feature, on by default); `valkeys://` too |
//! | `unix:///path/to/redis.sock[?db=N&user=U&pass=P]` | a Unix socket; `redis+unix://` too |
//!
//! The user and password are an ACL user's (`AUTH user password`), or the default user's
//! when only a password is given (`redis://:password@host`); percent-encode reserved
//! characters in them. A scheme, query parameter or fragment coord does not know is refused
//! at `connect` (kind `Config`) rather than ignored. Passwords never appear in errors, log
//! lines or `Debug` output (the provider's [`address`](RedisProvider::address) is
//! `host:port` or `unix:/path`); a client library's error text is scrubbed of them.
//!
//! **TLS.** Server certificates are verified against the system's CA store, or only against
//! the CAs of [`tls_ca_file`](RedisProviderBuilder::tls_ca_file) /
//! [`tls_ca_pem`](RedisProviderBuilder::tls_ca_pem); the host name (or IP address) of the URL
//! must be among the certificate's names. A client certificate for servers that require one
//! (`tls-auth-clients yes`) comes from
//! [`tls_client_cert_files`](RedisProviderBuilder::tls_client_cert_files) /
//! [`tls_client_cert_pem`](RedisProviderBuilder::tls_client_cert_pem). There is no switch to
//! skip verification. TLS is rustls with ring; when the process has not installed a rustls
//! crypto provider by the time a TLS connection is made with redis-rs, coord installs ring's
//! as the process default (fred's connections use ring without touching the default).
//!
//! **Sentinel** ([`RedisProvider::sentinel`]): the Sentinels' own password and TLS go in
//! their URLs; the data nodes' credentials, database and TLS are builder settings
//! ([`data_node_credentials`](RedisProviderBuilder::data_node_credentials),
//! [`database`](RedisProviderBuilder::database),
//! [`data_node_tls`](RedisProviderBuilder::data_node_tls), which defaults to the Sentinels'
//! scheme). **Cluster** ([`RedisProvider::cluster`]): `rediss://` seeds, one set of
//! credentials for every node, database 0 only.
//!
//! **An application's own client.** [`RedisProvider::from_redis_client`] takes a
//! `redis::Client` (address, credentials, database, TLS settings and all) and opens coord's
//! connections from it. [`RedisProvider::from_fred_client`] and
//! [`RedisProvider::from_fred_pool`] send coord's commands on the application's fred
//! clients, adding only one subscriber connection for waits. What coord needs from any
//! connection: pub/sub for waits (a dedicated subscriber connection, RESP3 with redis-rs),
//! `EVAL`/`EVALSHA` and the script cache, and one write attempt per command (coord sets it
//! per command on a shared fred client, so an application client that retries does not make
//! coord's commands run twice).
//!
//! ## A lock is a lease
//! A lock bounds how long a crashed holder blocks the others; it is not consensus. A holder
//! that stalls past its lease, or a Sentinel failover that loses the latest write (replication
//! is asynchronous), can let two callers into the same section. Fenced locks mint a fencing
//! token that only grows; the protected resource must refuse writes with an older token than
//! the newest it has seen. That, not the lock alone, makes the section safe.
//!
//! ## What goes to Redis
//! A call key of namespace `ns`, shown as `op:parts`, is stored under `ns:lock:{op:parts}` (the lock: the owner's
//! 128-bit token as 32 hex characters, with a `PX` lease), `ns:fence:{op:parts}` (the fencing
//! counter, only for fenced locks) and `ns:idem:{op:parts}` (the idempotency record, a hash).
//! Releases and settled records are announced on the pub/sub channel of the same name as the
//! lock or record key (channels are not keys, the names cannot clash). The braces
//! are a Cluster hash tag: all of one key's data shares one slot. Call keys cannot contain
//! braces, so user values cannot pick the slot.
//!
//! Round trips: an uncontended unfenced acquire is one `SET .. NX PX .. GET`; a waiting one
//! sends `PTTL` in the same pipeline, then, once subscribed, one script (a look) that also
//! marks the holder's token as waited for and puts the waiter in the lock's queue (only a
//! marked lock's release hands over and publishes); a fenced
//! acquire, a release, a renewal and every idempotency step is one script (`EVALSHA`). Scripts
//! are loaded on demand (`NOSCRIPT` → `EVAL` once). Requires Redis 7.0 or newer (`SET` with
//! both `NX` and `GET`).
//!
//! The stored layout (key names, the lock value and its waiter mark, record fields, channel
//! names) is part of what instances sharing a Redis must agree on. Until 1.0 it may change
//! between versions: during an upgrade, do not let instances of two versions coordinate the
//! same keys (for example, give the new version its own namespace).
//!
//! ## Waiting and the hand-over
//! A caller that may wait (`wait > 0`) and finds the lock held joins a local queue for that
//! lock, subscribed (once per lock, over one subscriber connection per provider) to the lock's
//! channel and to this process's own name for it (`<lock key>#<id>`, the id its provider's,
//! random), then looks once more, with a script that marks the holder's token as waited for
//! and puts the waiter in the lock's queue in Redis (`ns:lock-queue:{op:parts}`, a list of
//! entries `<process id>:<owner>:<lease ms>:<fenced>`). A caller that finds tasks of its own
//! process already waiting for the lock queues behind them without a command: only the first
//! waiter of each process stands in the queue in Redis, and the next one joins it (one look)
//! when it becomes first, so processes take turns and, within a process, waiters are served
//! in arrival order.
//!
//! **The release hands the lock over.** The release of a marked lock takes the first entry
//! off the queue and makes that waiter the holder in the same script: its owner token, its
//! lease, and (fenced) a fencing token minted there from the same counter as every acquire.
//! The lock stays marked while more wait, so the next release hands over too. A waiter of the
//! releasing process is told in memory and holds the lock with its whole lease without a
//! command of its own. A waiter of another process is told by a message on its process's
//! channel naming it, and holds the lock only for the **claim window** (one second, or its
//! lease if shorter) until it confirms: one look, which makes the lease whole and mints its
//! token. The least-served of 16 tasks on one key gets about as many turns as the mean (see
//! the crate's benchmarks).
//! Under contention an acquisition costs about two commands (the waiter's look and the
//! release; three when the waiter is in another process).
//!
//! **A waiter that has gone.** A waiter that gives up (its wait ends, or its future is
//! dropped) takes its entry out, and a lock handed to it meanwhile it releases onward,
//! through the same release (in the background, retried until its lease would have ended,
//! when its future was dropped). A waiter that crashed cannot: the release hands it the lock
//! all the same, the claim window passes unconfirmed and the lock lapses; the next waiter
//! then takes it at its backstop. A crashed waiter costs the waiters behind it the claim
//! window plus at most one backstop interval (one second): about one to two seconds, never the
//! lease it asked for.
//!
//! Each process's first waiter keeps a backstop timer at the holder's remaining lease (at
//! most one second, with jitter), which covers a lost message, a holder that died without
//! releasing, a lapsed claim, and a lock taken unmarked by a caller that did not wait: its
//! look takes a free lock, and confirms one handed to it whose message was lost. After the
//! subscriber connection is re-established, every queue's first waiter looks at once. With
//! Redis Cluster, `PUBLISH` reaches every node, so the subscriber may listen on any one of
//! them; every key a script touches shares the call key's hash tag.
//!
//! ## Fencing tokens
//! A token is `max(previous + 1, server time in microseconds)`, minted in the same script
//! that takes the lock. The counter key is kept for `max(10 × lease, 1 hour)` after each
//! mint, then expires: no state is left behind for keys that are no longer used, and because
//! the server clock has moved on by at least that long, the next token still exceeds every
//! earlier one. (A server clock set back by more than that window would break this.)
//!
//! ## Connections and faults
//! **One send per command.** Every command coord sends goes out once per call: neither client
//! library resends it on its own after it may have reached the server. fred is configured
//! with one write attempt per command (by default it writes a command again after a
//! reconnect when its connection closed with the command in flight); redis-rs's Cluster
//! client runs with its retries off (by default it resends after I/O errors). A reply lost
//! that way (a timeout, a connection closed mid-command) reaches the caller as an error of
//! kind `Timeout` or `Unavailable`, and the outcome is then unknown: the command may or may
//! not have run, once. The only resends are after Cluster replies that prove the command was
//! not executed (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`), within the same command timeout.
//!
//! **Resharding.** An `ASK` (the command's slot is migrating and its keys are not on the old
//! owner) also proves the command was not executed: the node decides it before running
//! anything, a script included (its keys are those it declares, and coord's scripts touch no
//! other). It is followed, so a live resharding fails no call: the command goes to the node
//! the `ASK` names, right after `ASKING` on the same connection (one pipeline: no other
//! command of a shared connection comes between). At most 4 are followed in a row, within the
//! command timeout; more is a redirect loop, reported as `Unavailable` (nothing executed). A
//! multi-key script whose keys are split between the two nodes mid-migration gets `TRYAGAIN`
//! and is resent after a pause, within the command timeout, until the keys are together.
//! redis-rs reads the target from the `ASK`; fred reports `ASK` and `MOVED` alike without
//! saying where, so coord asks the slot's owner (`CLUSTER NODES`) whether the slot is
//! migrating and where to (an ACL that refuses `CLUSTER NODES` leaves fred resending an `ASK`
//! to the old owner until the slot has moved or the command timeout ends, as a `MOVED` is
//! resent). Every coord call's keys share one slot (one hash tag per call key),
//! so a call's command never spans two nodes.
//!
//! **A fresh connection after an ambiguous fault.** After a call times out or its connection
//! breaks, that connection is not used for the next call, which goes out on a newly made
//! one, so a retry or a cleanup never queues behind a reply that may never come. (redis-rs:
//! the connection slot is emptied and redialled on the next call; fred: the timed-out client
//! is replaced and closed in the background, and fred itself redials a broken connection
//! before writing anything else to it.)
//!
//! **Checks at connect.** On every data node the provider sends commands to (the one
//! server, the master Sentinel names, every Cluster master), `connect` reads
//! `maxmemory-policy`, `appendonly` and `save`:
//! * a policy other than `noeviction` refuses the connection (kind `Config`, naming the node,
//!   the policy and the fix), unless the builder says
//!   [`allow_eviction(true)`](RedisProviderBuilder::allow_eviction): any other policy lets
//!   Redis delete a held lock or an idempotency record under memory pressure;
//! * persistence off (`appendonly no` and no `save` points) logs a warning, once per process
//!   for each server (a process connecting again is not told again): a restart forgets every
//!   lock and record;
//! * where `CONFIG` is disabled or not permitted (managed services, an ACL without
//!   `+config`), one warning per provider says what could not be checked, and the provider
//!   connects.
//!
//! Replicas behind Sentinel, and nodes that join a Cluster later, are not checked.
//!
//! **Server restarts.** Each time a connection to a data node is made (at connect and every
//! redial), the provider reads the node's `run_id` from `INFO server`. A different run id
//! than before on the same address means the server restarted: it is logged at error level,
//! once per restart, with what it means for held locks and in-flight records, and counted by
//! [`RedisProvider::server_restarts`]. A restart closes every connection, so it is noticed at
//! the latest by the first call after it. With redis-rs on a Cluster, the run ids of all
//! masters are read whenever the cluster connection is made again (after a call on it failed
//! or timed out); with fred, on every (re)connection fred makes to a node. A Sentinel
//! failover to another node is not a restart (the address differs).
//!
//! ## Operations
//! [`RedisProvider`] implements coord's operations API (`coord_core::provider::Operations`, used through
//! `Coordinator::operator()` and the `coord` tool): a lock or a record is inspected with one
//! read-only script, a listing uses `SCAN` with `MATCH` on every data node (never `KEYS`), and
//! a forced release is one script that wakes a waiter and leaves the fencing counter alone.
//! [`RedisProvider::server_report`] reads what `coord check` judges.
//!
//! ## Features
//! * `redis-client` (default): the `redis` crate as the client.
//! * `fred`: the `fred` crate as the client, chosen with
//!   [`RedisProviderBuilder::client`]`(`[`Client::Fred`]`)`.
//! * `tls` (default): `rediss://` for whichever clients are enabled, with rustls on ring
//!   (no OpenSSL; roots from the system store via `rustls-native-certs`). Without it a
//!   `rediss://` address is refused at `connect` (kind `Config`) and the TLS builder methods
//!   do not exist.
//!
//! Throwaway `redis-server` processes, clusters and Sentinel setups for tests (pause, restart,
//! kill, tamper) are in the `coord-redis-testing` crate: add it as a dev-dependency.

#![warn(missing_docs)]

#[cfg(not(any(feature = "redis-client", feature = "fred")))]
compile_error!("coord-redis needs a client: enable the `redis-client` or the `fred` feature");

mod config;
mod encode;
mod from_config;
mod keys;
mod provider;
mod scripts;
mod server_checks;
mod transport;
mod waiters;

#[cfg(feature = "redis-client")]
pub mod fence;

pub use config::Client;
pub use from_config::{coordinator_from_config, coordinator_from_env};
pub use provider::{RedisProvider, RedisProviderBuilder, URL_ENV};
pub use server_checks::{MIN_REDIS_VERSION, NodeReport, ReplicaReport, SAFE_POLICY, ServerReport};
