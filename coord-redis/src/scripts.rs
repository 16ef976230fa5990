//! The Lua scripts, each one atomic on the server.
//!
//! Scripts are sent by SHA1 (`EVALSHA`); a server that does not know one yet (fresh start,
//! failover, `SCRIPT FLUSH`) answers `NOSCRIPT` and the provider sends the source once with
//! `EVAL`, which also caches it there.
//!
//! Every script touches keys of one call key only (one hash tag), so it runs unchanged on
//! Redis Cluster. A key's changes are announced on the channel of the same name
//! (`PUBLISH KEYS[1]`): channels and keys are separate namespaces, and the name needs no
//! extra argument.
//!
//! Layout and scripts per kind of state, one file each: [`locks`] (the plain lock, its
//! fencing counter, waiter mark and queue, the forced-release marker), [`records`] (the
//! idempotency record), [`flights`] (the cluster single-flight claim and its outcome),
//! [`cache`] (a shared cache entry), [`semaphores`] and [`rw_locks`]. The multi-key lock's
//! script sits with its provider (`provider/multi_locks.rs`).
//!
//! # Replays
//! A client library (or coord's own cleanup) may send a command again when the reply to the
//! first send was lost, so every script answers a resend the way it answered the first send:
//! a claim finding the caller's own live marker answers "claimed", a completion finding the
//! caller's own completed record answers "stored", a lock step finding the caller's own token
//! answers "taken", and release and abandonment are owner-checked deletes.
//!
//! # Values coord did not write
//! Every script checks what it reads before its first write (a script is not rolled back when
//! it fails half-way) and refuses anything that is not exactly what coord writes, with an
//! error reply starting `ERR coord:`; a value of the wrong Redis type fails the first read
//! with `WRONGTYPE`. The provider reports both as `BackendErrorKind::Corrupt`, so garbage is
//! never turned into a grant, a fencing token or a replay. Only `PURGE` and `FORCE_RELEASE`
//! take any value: they are how an operator clears a corrupt record or lock.

mod cache;
mod flights;
mod locks;
mod records;
mod rw_locks;
mod semaphores;

pub(crate) use cache::CACHE_SET;
pub(crate) use flights::{FLIGHT_ABANDON, FLIGHT_CLAIM, FLIGHT_FINISH, FLIGHT_PEEK, FLIGHT_RENEW};
pub(crate) use locks::{
    FENCED_ACQUIRE, FORCE_RELEASE, INSPECT_LOCK, RELEASE, RENEW, WAITING_ACQUIRE,
};
pub(crate) use records::{
    ABANDON, CLAIM, COMPLETE, END_MARKER_LEASE, INSPECT_RECORD, PROBE, PURGE, RENEW_MARKER,
};
pub(crate) use rw_locks::{INSPECT_RW, RW_ACQUIRE, RW_RELEASE, RW_RENEW};
pub(crate) use semaphores::{INSPECT_SEMAPHORE, SEM_ACQUIRE, SEM_RELEASE, SEM_RENEW};

/// A script and its SHA1.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl Script {
    pub(crate) fn new(name: &'static str, source: &'static str) -> Script {
        let sha = sha1_smol::Sha1::from(source).digest().to_string();
        Script { name, source, sha }
    }
}
