//! # coord-postgres
//!
//! The PostgreSQL provider for coord: `#[distributed_lock]`, `#[idempotent]`, `#[cached]`
//! (shared tier) and `#[single_flight(scope = "cluster")]` coordinating across every process
//! that shares one PostgreSQL database, through any pooler, with leases measured by the
//! server's clock.
//!
//! ```no_run
//! use coord_core::Coordinator;
//! use coord_postgres::PostgresProvider;
//!
//! # async fn start() -> Result<(), Box<dyn std::error::Error>> {
//! // Once per database and version (or `coord migrate --postgres-url ...`):
//! PostgresProvider::migrate("postgres://coord@db.internal/app").await?;
//! let postgres = PostgresProvider::builder("postgres://coord@db.internal/app")
//!     .command_timeout(std::time::Duration::from_millis(500))
//!     .connect()
//!     .await?;
//! Coordinator::builder().namespace("billing").provider(postgres).install()?;
//! # Ok(())
//! # }
//! ```
//!
//! ## What it promises, fault by fault
//!
//! | what failed | what the caller gets | what a duplicate (or the next caller) gets |
//! |---|---|---|
//! | nothing | locks exclude; `#[idempotent]` runs the body once and replays its stored outcome (with its age) | the stored outcome |
//! | a connection dropped or terminated mid-statement (`pg_terminate_backend`, a restarting pooler) | a `BackendError` of kind `Unavailable` for that statement; the runtime retries completion and renewal on a new connection, so an idempotent call still answers `Ok` when the outcome is stored | the stored outcome; a lock freed at once (the background release retries) |
//! | no answer within the command timeout (a frozen server, a lock wait) | kind `Timeout`; the server cancels the statement too (`statement_timeout`, on the connections coord opens), and that connection is closed, never reused | a claim that executes after its caller gave up writes nothing (its not-after time, in the server's clock, has passed); an acquire whose reply was lost is released in the background |
//! | the outcome could not be stored within the marker's lease | `CoordError::OutcomeNotStored` (or `Ok` with `on_store_error = "return_ok"`) | the outcome if the completion landed after all, else `OutcomeUnknown` (`on_abandoned = "fail"`) or a new run (`"rerun"`) |
//! | the marker was gone at completion and nobody claimed since | `Ok` (stored without the marker, with the claim's fingerprint) | the stored outcome |
//! | another caller claimed after the marker was lost | `CoordError::OutcomeNotStored { cause: DoubleRun }` | the other caller's outcome |
//! | the server crashed and restarted (committed rows survive) | kind `Unavailable` until it is back; markers and locks committed before the crash are still there | the stored outcome; a lock held until its lease ends or its holder releases it |
//! | every connection slot taken (`max_connections`) | kind `Unavailable` for a statement that needs a new connection; open pooled connections keep serving | as above |
//! | a read-only server (a replica, `default_transaction_read_only`) | kind `Unavailable` before the body; completion retried within the lease | the stored outcome once writable |
//! | the listening connection dropped | nothing: it is made again, and every waiter looks again; a notification lost meanwhile costs at most one re-check (about a second) | — |
//! | a row of coord's tables that coord did not write | refused by the tables' checks when written; read as `Corrupt` or `Protocol`, never a grant or a replay | — |
//!
//! Not promised: exclusion across a failover to an asynchronous replica, or with
//! `synchronous_commit = off` (an acknowledged write can be lost); fencing tokens after such a
//! failover can repeat unless the sequence is advanced (see DEPLOYMENT.md). A lock is a lease:
//! a holder that stalls past it can overlap its successor, which is what fencing tokens are
//! for.
//!
//! ## Connecting
//! [`PostgresProvider::builder`] takes whatever tokio-postgres reads: `postgres://` and
//! `postgresql://` URLs (a Unix socket with `?host=/path/to/dir`), or the `key=value` form;
//! `sslmode=disable|prefer|require` (libpq's `verify-ca` and `verify-full` are read as
//! `require`: certificates and host names are always verified). With the `tls` feature (on by
//! default) TLS is rustls with ring, trusting the system's CA store or
//! [`tls_ca_file`](PostgresProviderBuilder::tls_ca_file). An application's own
//! `deadpool_postgres::Pool` works too ([`PostgresProvider::from_pool`]).
//! [`coordinator_from_config`] builds a coordinator from coord's configuration
//! (`provider = { kind = "postgres", url = "..", schema = "..", tls = { ca_file = ".." } }`,
//! or `COORD_POSTGRES_URL`).
//!
//! Passwords never appear in errors or `Debug` output (the provider's
//! [`address`](PostgresProvider::address) is `host:port/database`).
//!
//! ## The schema
//! coord's tables live in one schema (default `coord`), created and upgraded only by
//! [`PostgresProviderBuilder::migrate`] (or [`PostgresProvider::migrate`], or `coord
//! migrate`): versioned SQL migrations embedded in the crate, applied in one transaction and
//! recorded in `schema_version`. Connecting checks the version and refuses a missing, older
//! or newer schema with a [`SchemaError`] that says what to run; no statement a call sends
//! changes the schema, so the provider's role needs only `SELECT`, `INSERT`, `UPDATE`,
//! `DELETE` on the tables, `USAGE` on the sequence and `EXECUTE` on the functions (granted to
//! everyone unless revoked).
//!
//! | table | one row per | written by |
//! |---|---|---|
//! | `locks` | held lock: owner, fencing token, expiry, whether someone waits | acquire (`INSERT .. ON CONFLICT .. DO UPDATE .. WHERE` lapsed or own), renew and release (owner-checked) |
//! | `records` | idempotency record: state, owner, fingerprint, payload, written at, lease end, expiry | claim (one statement that also reads what is there), completion, abandon, renew, purge |
//! | `cache` | shared cache entry with its expiry | `cache_set` |
//! | `flights`, `flight_outcomes` | cluster flight claim; a leader's outcome kept for the hand-over | flight claim, finish, abandon |
//! | `semaphores`, `semaphore_permits` (version 2) | semaphore key (whether someone waits); held permit: owner, fencing token, expiry | the functions `semaphore_acquire`, `semaphore_release`, `semaphore_renew` |
//! | `rw_locks`, `rw_holds` (version 3) | read-write lock key (a waiting writer's claim, whether someone waits); held read or write hold: owner, mode, fencing token, expiry | the functions `rw_acquire`, `rw_release`, `rw_renew` |
//!
//! Version 3 also adds the function `lock_acquire_all`, which writes the `locks` rows of a
//! multi-key lock in one statement.
//!
//! Every expiry is computed by the statement that writes it from the server's clock
//! (`clock_timestamp()`), and a row past it is absent to every statement; a sweeper task
//! deletes such rows in small batches ([`PostgresProviderBuilder::sweep_interval`]). Keys are
//! coord's call keys as text, at most [`MAX_KEY_BYTES`].
//!
//! ## Locks
//! Acquire, release, renew and force-release are one statement each, owner-checked. Renewal
//! only extends a live row the caller owns: it never creates or takes one. A fenced acquire
//! takes its token from one sequence (`nextval`), so tokens strictly increase for every key.
//!
//! ## Semaphores
//! `permits = n` (and `Coordinator::semaphore`) are served: each permit is a row with its own
//! owner, lease in the server's clock and fencing token. Acquire, release and renew are one
//! call each of a function (migration 2) that first locks the semaphore key's row, so counting
//! the live permits and taking one is one serialized step and the limit is exact on one
//! database; expired permits are deleted in that step and never count. Tokens come from the
//! shared sequence, drawn under the key's row lock, so each permit's token is greater than
//! every earlier permit's of the key. A full semaphore's waiter asks for a notification on the
//! next release (wake-one per process) and also looks again when the soonest permit's lease
//! ends, at most every second (jittered). A semaphore is never spread over several databases.
//!
//! ## Read-write locks
//! `mode = "read" | "write"` (and `Coordinator::rw_lock`) are served: each hold is a row with
//! its owner, mode, lease in the server's clock and fencing token. Acquire, release and renew
//! are one call each of a function (migration 3) that first locks the key's row, so the check
//! (no live writer for a reader; nobody for a writer) and the grant are one serialized step;
//! ended holds are deleted in that step and never count. A writer that has to wait leaves a
//! claim on the key's row (its owner and an end, re-asserted at every look, at least twice per
//! claim) that keeps new readers out until it gets in, gives up (the claim is withdrawn at
//! once) or vanishes (the claim ends on its own). Every hold's token comes from the shared
//! sequence, drawn under the key's row lock, so it is greater than every earlier hold's of the
//! key, in either mode (and than every lock's or permit's drawn before it). Release and
//! renewal touch only the owner's hold of the mode named: a read release never frees a write
//! hold. A release or a withdrawn claim wakes every waiter of the key (several readers may get
//! in at once); a waiter also looks again when the first hold or claim in its way ends, at
//! most every second (jittered). A read-write lock is never spread over several databases.
//!
//! ## Multi-key locks
//! `key_from_each` (and `Coordinator::multi_lock`) take every key in one statement, the
//! function `lock_acquire_all`: each key's `locks` row is written as a fenced single acquire
//! writes it, in the runtime's canonical order, inside one transaction; a key held by another
//! owner rolls back the keys taken before it, so the set is committed whole or not at all and
//! no other session ever sees part of it. Each key gets its own token from the shared
//! sequence. A refused set marks the blocking key's holder and waits on that key's release,
//! as a single waiter does, then tries the whole set again. The statement itself waits only
//! for a row another statement is writing at that moment (never for a holder's lease), and
//! while it does, a single acquire of a key it has already written waits for it in turn; both
//! are bounded by the command timeout.
//!
//! ## Waiting
//! A waiter marks the holder's row as waited for; the release of a marked row calls
//! `pg_notify` in the same statement (delivered on commit). One dedicated connection per
//! provider (not from the pool) `LISTEN`s on the provider's channel and wakes, for a lock, the
//! first waiter of this process (wake-one), for a record or a flight, every waiter. Payloads
//! are a 64-bit hash of the key, never the key. The listening connection is health-checked
//! and made again when it drops, and every waiter then looks again; each waiter also looks
//! again at least every second (jittered), so a lost notification costs at most that.
//!
//! ## Idempotency records
//! A claim is one statement: `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE <expired>` plus a
//! read of the row that was there, with a not-after time in the server's clock (a claim
//! executed after its caller gave up writes nothing). Completion (one statement, `FOR
//! UPDATE` on the key's row) turns the owner's marker into the record, creates the record when
//! the marker is gone and nobody claimed since (`StoredWithoutMarker`), and otherwise reports
//! the other owner (`Superseded`). `keep_abandoned_for` keeps a lapsed marker as an abandoned
//! record; replays report the record's age. Claims may be transactional
//! (`transactional_claims()` is true): such a marker is stored with the records table's
//! `transactional` column set, and once its lease lapses it counts as absent whatever the keep.
//!
//! ## In the application's own transaction
//! [`Transaction`] wraps the application's `tokio_postgres::Transaction` (open one with
//! [`PostgresProvider::begin`], on a `tokio_postgres::Client` or a `deadpool_postgres` pooled
//! client). With `#[idempotent(transaction = "tx")]` or `Idempotent::claim_in_transaction`, the
//! key is claimed on the provider's own connection (duplicates see it at once) and the
//! completed record is written by an owner-checked `UPDATE` of the marker's row **inside that
//! transaction**, so the record commits if and only if the body's writes commit. A failed
//! owner check raises an error inside the transaction (it can then only roll back) and
//! [`Transaction::commit`] says so; a rollback or a dropped transaction abandons its markers, so
//! a retry runs at once. While the transaction holds a marker's row, claims, waits, abandons and
//! renewals on the provider's connections never wait for it (a duplicate is answered in
//! flight). What each failure leaves is tabled in RELIABILITY.md ("Idempotency in the caller's
//! transaction").
//!
//! ## Checking a server
//! [`PostgresProviderBuilder::server_report`] reads, over one connection and without changing
//! anything, what decides whether the server keeps what coord acknowledges: its version,
//! whether it is a standby, `fsync`, `full_page_writes`, `synchronous_commit`, the synchronous
//! standbys, the version of coord's tables, rows left unswept, connection headroom and its
//! clock, as a [`ServerReport`]. `coord check --postgres-url ..` judges it.
//!
//! ## Features
//! * `tls` (default): TLS with rustls on ring (no OpenSSL). Without it, `sslmode=require` is
//!   refused at `connect` (kind `Config`) and the TLS builder methods do not exist.
//!
//! Throwaway PostgreSQL servers for tests (pause, kill and restart, terminate sessions,
//! connection limits, read-only) are in the `coord-postgres-testing` crate.

#![warn(missing_docs)]

mod connection;
mod errors;
mod from_config;
mod provider;
mod schema;
mod server_checks;
mod sql;
mod sweeper;
#[cfg(feature = "tls")]
mod tls;
mod transaction;
mod waiters;

pub use from_config::{coordinator_from_config, coordinator_from_env};
pub use provider::{
    ConnectError, DEFAULT_POOL_SIZE, DEFAULT_SWEEP_INTERVAL, MAX_KEY_BYTES, PostgresProvider,
    PostgresProviderBuilder, URL_ENV,
};
pub use schema::{DEFAULT_SCHEMA, MigrationReport, SCHEMA_VERSION, SchemaError};
pub use server_checks::{
    EXPIRED_COUNT_CAP, ExpiredRows, MIN_POSTGRES_VERSION_NUM, ServerReport, StandbyReport,
};
pub use transaction::{Transaction, TransactionError};

/// The driver the application's transactions come from, re-exported so that its version is the
/// one [`Transaction`] wraps.
pub use tokio_postgres;

/// What the benchmarks need to run coord's own statements by hand beside the provider. Not
/// part of the API: may change in any release.
#[doc(hidden)]
pub mod __bench {
    /// The lock acquire and release statements as the provider sends them for `schema`.
    pub fn lock_statements(schema: &str) -> (String, String) {
        let statements = crate::sql::Statements::new(
            &crate::schema::quoted(schema),
            &mut crate::sql::Slots::default(),
        );
        (
            statements.lock_acquire.text().to_owned(),
            statements.lock_release.text().to_owned(),
        )
    }

    /// The statement a claim reads the record with first (all of a replay), for `schema`.
    pub fn record_read_statement(schema: &str) -> String {
        crate::sql::Statements::new(
            &crate::schema::quoted(schema),
            &mut crate::sql::Slots::default(),
        )
        .record_read
        .text()
        .to_owned()
    }
}
