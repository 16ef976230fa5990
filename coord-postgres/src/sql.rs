//! Every statement the provider sends, written once per provider for its schema.
//!
//! Each operation of the contract is **one statement** (one round trip, one implicit
//! transaction): the reads it needs and its writes are CTEs of that statement. Parameters are
//! cast in the text (`$1::text`), so a statement prepares the same way everywhere. Two
//! operations first send a plain read, which answers the common case alone: a claim
//! ([`RECORD_READ`], then [`RECORD_CLAIM`] only when the read cannot answer) and a waiter's
//! look ([`RECORD_PEEK`], then [`RECORD_PROBE`] only to mark a marker not yet marked).
//!
//! # What writes
//! A statement that writes, or locks a row, is a write transaction even when it ends up
//! changing nothing: an `INSERT .. ON CONFLICT DO UPDATE .. WHERE <false>` still locks the
//! conflicting row, is given a transaction id and writes WAL, and with
//! `synchronous_commit = on` its commit waits for a flush. So what only reads is sent as a
//! plain `SELECT` (no `FOR UPDATE`/`FOR SHARE`, no data-modifying CTE): a replay of a live
//! record ([`RECORD_READ`]), a waiter's look at a marker it already marked ([`RECORD_PEEK`]),
//! a cache read ([`CACHE_GET`]), a follower's look at its leader ([`FLIGHT_PEEK`]) and every
//! operator's read ([`LOCK_INSPECT`], [`RECORD_INSPECT`], [`LOCK_LIST`], [`RECORD_LIST`]).
//! None of them takes a row lock, waits for one, is given a transaction id or writes WAL.
//!
//! # Time
//! `now` is `clock_timestamp()` read once per statement (a `MATERIALIZED` CTE), so every
//! comparison in a statement uses the same instant of the server's clock. Durations come in
//! as whole milliseconds (`bigint`); remaining times go out as milliseconds computed on the
//! server, so no client timestamp is ever compared with a server one.
//!
//! # What a statement reads
//! A statement's plain reads see the snapshot taken when it started; an `ON CONFLICT ... DO
//! UPDATE` and a `FOR UPDATE` see the newest committed row (they wait for a concurrent writer
//! first). Statements that decide from a read use one of the latter. Where a statement reads
//! the snapshot only to *report* what blocked it (a claim finding another's marker, an
//! acquire finding a holder), a row that changed since the snapshot is noticed (the write did
//! not apply, and the snapshot shows nothing that could have stopped it) and the provider sends
//! the statement again; each statement is replay-safe.
//!
//! # Waking waiters
//! A lock holder or an in-flight marker that someone waits for has `waited = true`; releasing
//! or settling it then calls `pg_notify(channel, payload)` in the same statement, delivered
//! when it commits. The channel is the provider's (one per schema) and the payload a short
//! hash of the key, never the key itself.

/// The SQL text of `x` milliseconds as an interval.
macro_rules! ms {
    ($x:expr) => {
        concat!("(", $x, " * interval '1 millisecond')")
    };
}

/// Whole milliseconds from `$b` to `$a` (both timestamps), rounded.
macro_rules! ms_between {
    ($a:expr, $b:expr) => {
        concat!(
            "(extract(epoch FROM (",
            $a,
            ") - (",
            $b,
            ")) * 1000)::bigint"
        )
    };
}

/// The statements of one provider, with its schema's (quoted) name in them.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) lock_acquire: String,
    pub(crate) lock_mint: String,
    pub(crate) lock_release: String,
    pub(crate) lock_renew: String,
    pub(crate) lock_inspect: String,
    pub(crate) lock_force_release: String,
    pub(crate) lock_list: String,
    pub(crate) record_read: String,
    pub(crate) record_claim: String,
    pub(crate) record_complete: String,
    pub(crate) record_complete_in_transaction: String,
    pub(crate) record_abandon: String,
    pub(crate) record_end_lease: String,
    pub(crate) record_renew: String,
    pub(crate) record_probe: String,
    pub(crate) record_peek: String,
    pub(crate) record_purge: String,
    pub(crate) record_inspect: String,
    pub(crate) record_list: String,
    pub(crate) cache_get: String,
    pub(crate) cache_set: String,
    pub(crate) cache_delete: String,
    pub(crate) flight_claim: String,
    pub(crate) flight_renew: String,
    pub(crate) flight_finish: String,
    pub(crate) flight_abandon: String,
    pub(crate) flight_peek: String,
    pub(crate) sweep: [String; 5],
    pub(crate) server_time: &'static str,
}

impl Statements {
    /// The statements for the schema whose quoted name is `schema` (`"coord"`).
    pub(crate) fn new(schema: &str) -> Statements {
        let s = |text: &str| text.replace("{s}", schema);
        Statements {
            lock_acquire: s(LOCK_ACQUIRE),
            lock_mint: s(LOCK_MINT),
            lock_release: s(LOCK_RELEASE),
            lock_renew: s(LOCK_RENEW),
            lock_inspect: s(LOCK_INSPECT),
            lock_force_release: s(LOCK_FORCE_RELEASE),
            lock_list: s(LOCK_LIST),
            record_read: s(RECORD_READ),
            record_claim: s(RECORD_CLAIM),
            record_complete: completion_statement(schema),
            record_complete_in_transaction: s(RECORD_COMPLETE_IN_TRANSACTION),
            record_abandon: s(RECORD_ABANDON),
            record_end_lease: s(RECORD_END_LEASE),
            record_renew: s(RECORD_RENEW),
            record_probe: s(RECORD_PROBE),
            record_peek: s(RECORD_PEEK),
            record_purge: s(RECORD_PURGE),
            record_inspect: s(RECORD_INSPECT),
            record_list: s(RECORD_LIST),
            cache_get: s(CACHE_GET),
            cache_set: s(CACHE_SET),
            cache_delete: s(CACHE_DELETE),
            flight_claim: s(FLIGHT_CLAIM),
            flight_renew: s(FLIGHT_RENEW),
            flight_finish: s(FLIGHT_FINISH),
            flight_abandon: s(FLIGHT_ABANDON),
            flight_peek: s(FLIGHT_PEEK),
            sweep: ["locks", "records", "cache", "flights", "flight_outcomes"]
                .map(|table| s(&SWEEP.replace("{table}", table))),
            server_time: SERVER_TIME,
        }
    }

    /// Every statement, for checking that each prepares against the schema.
    #[cfg(test)]
    pub(crate) fn all(&self) -> Vec<&str> {
        let mut all = vec![
            self.lock_acquire.as_str(),
            &self.lock_mint,
            &self.lock_release,
            &self.lock_renew,
            &self.lock_inspect,
            &self.lock_force_release,
            &self.lock_list,
            &self.record_read,
            &self.record_claim,
            &self.record_complete,
            &self.record_complete_in_transaction,
            &self.record_abandon,
            &self.record_end_lease,
            &self.record_renew,
            &self.record_probe,
            &self.record_peek,
            &self.record_purge,
            &self.record_inspect,
            &self.record_list,
            &self.cache_get,
            &self.cache_set,
            &self.cache_delete,
            &self.flight_claim,
            &self.flight_renew,
            &self.flight_finish,
            &self.flight_abandon,
            &self.flight_peek,
            self.server_time,
        ];
        all.extend(self.sweep.iter().map(String::as_str));
        all
    }
}

/// The server's clock in milliseconds since the Unix epoch.
const SERVER_TIME: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Take a lock, or report who holds it. `$1` key, `$2` owner, `$3` lease ms, `$4` mark a
/// holder found as waited for.
///
/// The row is ours when it is absent, lapsed, or already ours (a resend: the lease restarts).
/// Otherwise, with `$4`, the holder's row is marked `waited` (one write per holder). Returns
/// one row: `(won, fence, left_ms)` (`fence` is always NULL here), the holder's remaining lease
/// when not won; no row when the key was held by a row this
/// statement's snapshot does not show yet (held; the remaining lease unknown).
///
/// The row is written without a fencing token: a fenced grant draws its token afterwards with
/// [`LOCK_MINT`], once the row is ours. A token drawn here would be drawn before the row's lock
/// is: a statement could draw 100, be overtaken by another that draws 101, takes the key,
/// holds and releases it, and then insert its row with 100, a token older than one the
/// resource has already seen (the multi-process witness caught exactly that).
const LOCK_ACQUIRE: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
taken AS (
  INSERT INTO {s}.locks AS l (key, owner, fence, expires_at, waited)
  SELECT $1::text, $2::uuid, NULL::bigint,
         now.t + ",
    ms!("$3::bigint"),
    ", false
  FROM now
  ON CONFLICT (key) DO UPDATE SET
    owner = CASE WHEN l.expires_at <= (SELECT t FROM now) OR l.owner = excluded.owner
                 THEN excluded.owner ELSE l.owner END,
    fence = CASE WHEN l.expires_at <= (SELECT t FROM now) OR l.owner = excluded.owner
                 THEN NULL ELSE l.fence END,
    expires_at = CASE WHEN l.expires_at <= (SELECT t FROM now) OR l.owner = excluded.owner
                 THEN excluded.expires_at ELSE l.expires_at END,
    waited = NOT (l.expires_at <= (SELECT t FROM now) OR l.owner = excluded.owner)
  WHERE l.expires_at <= (SELECT t FROM now) OR l.owner = excluded.owner
     OR ($4::boolean AND NOT l.waited)
  RETURNING l.owner = $2::uuid AS won, l.fence, l.expires_at
)
SELECT won, fence, ",
    ms_between!("expires_at", "(SELECT t FROM now)"),
    " AS left_ms FROM taken
UNION ALL
SELECT false, NULL, ",
    ms_between!("l.expires_at", "(SELECT t FROM now)"),
    "
FROM {s}.locks l WHERE l.key = $1::text AND NOT EXISTS (SELECT 1 FROM taken)"
);

/// Draw the fencing token of a lock just won. `$1` key, `$2` owner. Drawn while the row
/// names this owner (the update locks it): every earlier holder drew its token before this
/// one could take the row over, and every later holder can take it over, and draw, only after
/// this statement, so tokens strictly increase in the order the key was held. The check is on
/// the owner alone, not on the lease: a lease that ran out between the acquire and this
/// statement (a very short lease, a slow round trip) still gets its token, which is no
/// different from a lease that runs out just after its grant, and the next holder's token is
/// greater. Returns the token, or no row when another owner took the key over in between
/// (the grant is then not made).
const LOCK_MINT: &str = "UPDATE {s}.locks SET fence = nextval('{s}.fence_seq')
WHERE key = $1::text AND owner = $2::uuid
RETURNING fence";

/// Release a lock. `$1` key, `$2` owner, `$3` channel, `$4` payload. Deletes the owner's row
/// (a lapsed one too, as tidying); returns `(released, woke)`: whether the owner still held
/// it, and whether a waiter was notified.
const LOCK_RELEASE: &str = "WITH gone AS (
  DELETE FROM {s}.locks WHERE key = $1::text AND owner = $2::uuid
  RETURNING expires_at > clock_timestamp() AS live, waited
)
SELECT coalesce(bool_or(live), false) AS released,
       (SELECT count(pg_notify($3::text, $4::text)) FROM gone WHERE live AND waited) AS woke
FROM gone";

/// Renew a lock. `$1` key, `$2` owner, `$3` lease ms. Only a live row the owner holds is
/// extended (never created, never taken). Returns 1 renewed, 2 another owner holds it, 0 free.
const LOCK_RENEW: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
renewed AS (
  UPDATE {s}.locks l SET expires_at = now.t + ",
    ms!("$3::bigint"),
    "
  FROM now WHERE l.key = $1::text AND l.owner = $2::uuid AND l.expires_at > now.t
  RETURNING 1
)
SELECT CASE
  WHEN EXISTS (SELECT 1 FROM renewed) THEN 1
  WHEN EXISTS (SELECT 1 FROM {s}.locks l, now
               WHERE l.key = $1::text AND l.expires_at > now.t AND l.owner <> $2::uuid) THEN 2
  ELSE 0 END AS outcome"
);

/// What an operator sees of a lock. `$1` key. Returns `(owner, fence, waited, left_ms)` for
/// the row at the key (live or lapsed), or no row.
const LOCK_INSPECT: &str = concat!(
    "SELECT owner, fence, waited, ",
    ms_between!("expires_at", "clock_timestamp()"),
    " AS left_ms FROM {s}.locks WHERE key = $1::text"
);

/// An operator's release of whoever holds a lock. `$1` key, `$2` channel, `$3` payload.
/// Returns `(owner, live)` of the row removed (a live holder's removal always notifies), or no
/// row.
const LOCK_FORCE_RELEASE: &str = "WITH gone AS (
  DELETE FROM {s}.locks WHERE key = $1::text
  RETURNING owner, expires_at > clock_timestamp() AS live
)
SELECT owner, live, (SELECT count(pg_notify($2::text, $3::text)) FROM gone WHERE live) AS woke
FROM gone";

/// A page of live lock keys of one operation, in key order. `$1` the operation's key
/// (`namespace:operation`), `$2` the key after which to start (or the operation's key
/// itself), `$3` how many.
const LOCK_LIST: &str = "SELECT key FROM {s}.locks
WHERE key >= $1::text AND key < $1::text || ';' AND key > $2::text
  AND (key = $1::text OR key > $1::text || ':') AND expires_at > clock_timestamp()
ORDER BY key LIMIT $3::bigint";

/// Read the live record at a key: a claim's first step, and all of a replay. `$1` key.
/// Returns `(state, owner, fingerprint, payload, lease_left_ms, expires_in_ms, age_ms,
/// transactional)` for a record past none of its expiry, no row otherwise.
///
/// A plain `SELECT` in its own implicit transaction: it takes no row lock, is given no
/// transaction id and writes no WAL, and it never waits for a writer (it reads the newest
/// version committed when it started). What it finds is the answer whenever [`RECORD_CLAIM`]
/// could not have applied to that row: a live record that is not a transactional marker (a
/// completed one, or a marker in its lease or kept after it) belongs to nobody else's claim
/// until it expires, so the claim statement would have written nothing and reported the same
/// row. Anything else (no live row, a transactional marker, the caller's own marker) goes on
/// to [`RECORD_CLAIM`], which decides again on the newest row.
const RECORD_READ: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
SELECT r.state, r.owner, r.fingerprint, r.payload, ",
    ms_between!("r.lease_ends_at", "now.t"),
    " AS lease_left_ms, ",
    ms_between!("r.expires_at", "now.t"),
    " AS expires_in_ms, ",
    ms_between!("now.t", "r.written_at"),
    " AS age_ms, r.transactional
FROM {s}.records r, now WHERE r.key = $1::text AND r.expires_at > now.t"
);

/// Claim an idempotency key, or read what is there. `$1` key, `$2` owner, `$3` lease ms,
/// `$4` fingerprint, `$5` keep-when-abandoned ms (NULL: do not keep), `$6` not-after (server
/// ms since the epoch; NULL: no limit), `$7` transactional (the marker is part of a caller's
/// transaction: once its lease lapses it counts as absent, whatever the keep).
///
/// A claim executing after its not-after time writes nothing (`in_time` false): its caller
/// has given up on it. Otherwise the marker is written when no live record is there (absent,
/// or past its expiry). Returns one row: `(claimed, in_time, state, owner, fingerprint,
/// payload, lease_left_ms, expires_in_ms, age_ms, busy)`, the record columns as the
/// statement's snapshot showed the key (NULL when no row).
///
/// It never waits for a transaction of the application's: a transactional marker whose row is
/// locked (its owner's transaction has written the completion in it, and has not ended yet) is
/// `busy`, and the claim writes nothing (`FOR UPDATE SKIP LOCKED` on such rows first; an `ON
/// CONFLICT .. DO UPDATE` would wait for that transaction to end). The caller reports it in
/// flight: it becomes the record when that transaction commits, and is in flight again when it
/// rolls back.
const RECORD_CLAIM: &str = concat!(
    "WITH now AS MATERIALIZED (
  SELECT clock_timestamp() AS t,
         ($6::bigint IS NULL OR (extract(epoch FROM clock_timestamp()) * 1000) <= $6::bigint)
           AS in_time
),
held AS MATERIALIZED (
  SELECT r.key FROM {s}.records r
  WHERE r.key = $1::text AND r.transactional AND r.state = 'in_flight'
  FOR UPDATE SKIP LOCKED
),
busy AS MATERIALIZED (
  SELECT EXISTS (SELECT 1 FROM {s}.records r
                 WHERE r.key = $1::text AND r.transactional AND r.state = 'in_flight')
         AND NOT EXISTS (SELECT 1 FROM held) AS b
),
claimed AS (
  INSERT INTO {s}.records AS r
    (key, state, owner, fingerprint, payload, written_at, lease_ends_at, expires_at, waited,
     transactional)
  SELECT $1::text, 'in_flight', $2::uuid, $4::bytea, NULL, now.t, now.t + ",
    ms!("$3::bigint"),
    ",
         now.t + ",
    ms!("($3::bigint + coalesce($5::bigint, 0))"),
    ", false, $7::boolean
  FROM now, busy WHERE now.in_time AND NOT busy.b
  ON CONFLICT (key) DO UPDATE SET
    state = excluded.state, owner = excluded.owner, fingerprint = excluded.fingerprint,
    payload = NULL, written_at = excluded.written_at, lease_ends_at = excluded.lease_ends_at,
    expires_at = excluded.expires_at, waited = false, transactional = excluded.transactional
  WHERE r.expires_at <= excluded.written_at
     OR (r.transactional AND r.state = 'in_flight' AND r.lease_ends_at <= excluded.written_at)
  RETURNING 1
)
SELECT (SELECT count(*) FROM claimed) AS claimed, now.in_time, r.state, r.owner, r.fingerprint,
       r.payload, ",
    ms_between!("r.lease_ends_at", "now.t"),
    " AS lease_left_ms, ",
    ms_between!("r.expires_at", "now.t"),
    " AS expires_in_ms, ",
    ms_between!("now.t", "r.written_at"),
    " AS age_ms, busy.b AS busy
FROM now CROSS JOIN busy LEFT JOIN {s}.records r ON r.key = $1::text"
);

/// The completion statement, for the schema whose quoted name is `schema`: the one place
/// where an outcome is written.
///
/// `$1` key, `$2` owner, `$3` payload, `$4` retention ms, `$5` fingerprint (stored only when
/// the record has to be created), `$6` transactional (whether the write is part of the
/// application's own transaction; false for every completion this version sends), `$7`
/// channel, `$8` payload of the notification.
///
/// It locks the key's row (`FOR UPDATE`: the newest committed version) and then, in one
/// statement:
/// * the owner's marker (in its lease, or lapsed and kept) becomes the completed record,
///   keeping the claim's fingerprint; a waiter is notified (`stored` = 1);
/// * no live record: the completed record is created with `$5` (`created` = 1);
/// * anything else changes nothing, and the row found is returned (`state`, `owner`, `live`):
///   the owner's own completed record (a resend: stored already), or another owner's marker
///   or record (superseded).
///
/// Returns `(stored, created, state, owner, live)`. With neither written nor a live row
/// found, a concurrent writer got there between the lock and the insert: send it again.
///
/// It touches only the key's row and commits nothing by itself, so the same text can run
/// inside a transaction of the application's (what the `transactional` column is for).
pub(crate) fn completion_statement(schema: &str) -> String {
    concat!(
        "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
cur AS MATERIALIZED (
  SELECT r.state, r.owner, r.expires_at > now.t AS live, r.waited
  FROM {s}.records r, now WHERE r.key = $1::text FOR UPDATE OF r
),
own AS (
  UPDATE {s}.records r SET state = 'completed', payload = $3::bytea, written_at = now.t,
    lease_ends_at = NULL, expires_at = now.t + ",
        ms!("$4::bigint"),
        ", waited = false,
    transactional = $6::boolean
  FROM now, cur
  WHERE r.key = $1::text AND cur.live AND cur.owner = $2::uuid AND cur.state = 'in_flight'
  RETURNING cur.waited
),
fresh AS (
  INSERT INTO {s}.records AS r
    (key, state, owner, fingerprint, payload, written_at, lease_ends_at, expires_at, waited,
     transactional)
  SELECT $1::text, 'completed', $2::uuid, $5::bytea, $3::bytea, now.t, NULL, now.t + ",
        ms!("$4::bigint"),
        ",
         false, $6::boolean
  FROM now WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.live)
  ON CONFLICT (key) DO UPDATE SET
    state = excluded.state, owner = excluded.owner, fingerprint = excluded.fingerprint,
    payload = excluded.payload, written_at = excluded.written_at, lease_ends_at = NULL,
    expires_at = excluded.expires_at, waited = false, transactional = excluded.transactional
  WHERE r.expires_at <= excluded.written_at
  RETURNING 1
)
SELECT (SELECT count(*) FROM own) AS stored, (SELECT count(*) FROM fresh) AS created,
       (SELECT count(pg_notify($7::text, $8::text)) FROM own WHERE own.waited) AS woke,
       cur.state, cur.owner, cur.live
FROM (SELECT 1) AS one LEFT JOIN cur ON true"
    )
    .replace("{s}", schema)
}

/// The completion written inside an application's own transaction (by
/// `coord_postgres::Transaction`). `$1` key, `$2` owner, `$3` payload, `$4` retention ms, `$5`
/// channel, `$6` payload of the notification.
///
/// Locks the key's row (`FOR UPDATE`: the newest committed version; the lock is the
/// transaction's, held until it ends, so nobody can take the key over between this owner check
/// and the commit) and turns the owner's in-flight marker into the completed record, whether
/// the marker is live or lapsed: a lapsed marker that is still the owner's has not been taken
/// over. It never inserts: no row means the claim is not there as this transaction sees it.
/// The notification is sent whenever the record is written (delivered only if the transaction
/// commits): a waiter that arrived while the row was locked could not mark it.
///
/// Returns `(stored, state, owner, lease_left_ms)`: `stored` = 1 written; otherwise the row
/// found (NULL columns: none).
const RECORD_COMPLETE_IN_TRANSACTION: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
cur AS MATERIALIZED (
  SELECT r.state, r.owner, ",
    ms_between!("r.lease_ends_at", "now.t"),
    " AS lease_left_ms
  FROM {s}.records r, now WHERE r.key = $1::text FOR UPDATE OF r
),
own AS (
  UPDATE {s}.records r SET state = 'completed', payload = $3::bytea, written_at = now.t,
    lease_ends_at = NULL, expires_at = now.t + ",
    ms!("$4::bigint"),
    ", waited = false,
    transactional = true
  FROM now, cur
  WHERE r.key = $1::text AND cur.owner = $2::uuid AND cur.state = 'in_flight'
  RETURNING 1
)
SELECT (SELECT count(*) FROM own) AS stored, cur.state, cur.owner, cur.lease_left_ms,
       (SELECT count(pg_notify($5::text, $6::text)) FROM own) AS woke
FROM (SELECT 1) AS one LEFT JOIN cur ON true"
);

/// The statement that makes the session's open transaction unable to commit: it raises an
/// error inside it (SQLSTATE P0001, the message saying why), so its `COMMIT` becomes a
/// `ROLLBACK`. `reason` is quoted as a string literal (no parameters reach a `DO` block).
pub(crate) fn rollback_only_statement(reason: &str) -> String {
    let literal = reason.replace('\'', "''").replace('$', "");
    format!(
        "DO $coord$ BEGIN RAISE EXCEPTION USING MESSAGE = \
         'coord: this transaction is rollback-only: {literal}'; END $coord$"
    )
}

/// Abandon the owner's marker. `$1` key, `$2` owner, `$3` channel, `$4` payload. Deletes the
/// owner's in-flight marker (live, kept, or lapsed as tidying); returns `(removed, woke)`:
/// whether a live one was removed.
///
/// Never waits for a lock on the row: a row locked elsewhere (by the owner's own transaction,
/// which wrote the completion in it and has not ended yet) fails the statement with 55P03
/// (`lock_not_available`), and the caller tries again later or leaves the marker to lapse.
const RECORD_ABANDON: &str = "WITH mine AS MATERIALIZED (
  SELECT key FROM {s}.records
  WHERE key = $1::text AND owner = $2::uuid AND state = 'in_flight'
  FOR UPDATE NOWAIT
),
gone AS (
  DELETE FROM {s}.records r USING mine
  WHERE r.key = mine.key AND r.owner = $2::uuid AND r.state = 'in_flight'
  RETURNING r.expires_at > clock_timestamp() AS live, r.waited
)
SELECT coalesce(bool_or(live), false) AS removed,
       (SELECT count(pg_notify($3::text, $4::text)) FROM gone WHERE live AND waited) AS woke
FROM gone";

/// End the owner's marker's lease now, as if it lapsed this instant. `$1` key, `$2` owner, `$3`
/// channel, `$4` payload. The owner's marker within its lease gets `lease_ends_at` = now and
/// keeps its keep period (`expires_at - lease_ends_at`) from now: kept, it is the abandoned
/// record; not kept (or transactional, whose lapse is absence), it has lapsed. A waiter is
/// notified. Returns `(ended, woke)`: `ended` true when the owner's marker, within its lease
/// or kept past it, was there (a kept one past its lease is left as it is).
///
/// Like [`RECORD_ABANDON`], fails with 55P03 rather than wait for a row locked elsewhere.
const RECORD_END_LEASE: &str = "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
mine AS MATERIALIZED (
  SELECT r.key, r.lease_ends_at > now.t AS in_lease, r.waited FROM {s}.records r, now
  WHERE r.key = $1::text AND r.owner = $2::uuid AND r.state = 'in_flight'
    AND r.expires_at > now.t
    AND (r.lease_ends_at > now.t OR NOT r.transactional)
  FOR UPDATE OF r NOWAIT
),
ended AS (
  UPDATE {s}.records r SET lease_ends_at = now.t,
    expires_at = now.t + (r.expires_at - r.lease_ends_at)
  FROM now, mine
  WHERE r.key = mine.key AND mine.in_lease AND r.owner = $2::uuid AND r.state = 'in_flight'
  RETURNING mine.waited
)
SELECT EXISTS (SELECT 1 FROM mine) AS ended,
       (SELECT count(pg_notify($3::text, $4::text)) FROM ended WHERE waited) AS woke";

/// Renew the owner's in-flight marker. `$1` key, `$2` owner, `$3` lease ms. Extends a marker
/// within its lease (and its keep period, which moves with it). Returns 1 renewed; 2 another
/// owner's live marker or record is there; 0 otherwise (free, lapsed, or completed by the
/// owner). Like [`RECORD_ABANDON`], fails with 55P03 rather than wait for a row locked
/// elsewhere.
const RECORD_RENEW: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
mine AS MATERIALIZED (
  SELECT r.key FROM {s}.records r, now
  WHERE r.key = $1::text AND r.owner = $2::uuid AND r.state = 'in_flight'
    AND r.lease_ends_at > now.t
  FOR UPDATE OF r NOWAIT
),
renewed AS (
  UPDATE {s}.records r SET lease_ends_at = now.t + ",
    ms!("$3::bigint"),
    ",
    expires_at = now.t + ",
    ms!("$3::bigint"),
    " + (r.expires_at - r.lease_ends_at)
  FROM now, mine
  WHERE r.key = mine.key AND r.owner = $2::uuid AND r.state = 'in_flight'
    AND r.lease_ends_at > now.t
  RETURNING 1
)
SELECT CASE
  WHEN EXISTS (SELECT 1 FROM renewed) THEN 1
  WHEN EXISTS (SELECT 1 FROM {s}.records r, now
               WHERE r.key = $1::text AND r.expires_at > now.t AND r.owner <> $2::uuid) THEN 2
  ELSE 0 END AS outcome"
);

/// What a caller waiting for a marker to settle needs. `$1` key. Locks the newest version of
/// a marker within its lease, marks it `waited` (so its settling notifies) and returns its
/// lease left in ms; no row when nothing is in flight (no record, completed, abandoned or
/// lapsed).
///
/// Never waits for a lock on the row: an in-flight marker whose row is locked elsewhere (its
/// owner's transaction wrote the completion in it and has not ended; a lapsed transactional
/// marker counts too) answers 25 ms as its lease left, unmarked, so the waiter
/// looks again soon (the transactional completion notifies when it commits).
const RECORD_PROBE: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
seen AS MATERIALIZED (
  SELECT r.key FROM {s}.records r, now
  WHERE r.key = $1::text AND r.state = 'in_flight'
    AND (r.lease_ends_at > now.t OR r.transactional)
),
cur AS MATERIALIZED (
  SELECT r.key, r.waited, r.lease_ends_at > now.t AS in_lease, ",
    ms_between!("r.lease_ends_at", "now.t"),
    " AS left_ms
  FROM {s}.records r, now
  WHERE r.key = $1::text AND r.state = 'in_flight'
    AND (r.lease_ends_at > now.t OR r.transactional)
  FOR UPDATE OF r SKIP LOCKED
),
marked AS (
  UPDATE {s}.records r SET waited = true FROM cur
  WHERE r.key = cur.key AND cur.in_lease AND NOT cur.waited
  RETURNING 1
)
SELECT left_ms, (SELECT count(*) FROM marked) AS marked FROM cur WHERE cur.in_lease
UNION ALL
SELECT 25::bigint, 0::bigint FROM seen WHERE NOT EXISTS (SELECT 1 FROM cur)"
);

/// What a waiter reads before it marks anything: the in-flight marker at a key. `$1` key.
/// Returns `(transactional, waited, in_lease, left_ms)` for a marker within its lease (or a
/// transactional one, lapsed or not), no row when nothing is in flight.
///
/// A plain `SELECT`: no row lock, no transaction id, no WAL. A marker already marked
/// `waited` (by this waiter's earlier look, or by another waiter) will notify when it settles,
/// so the waiter needs nothing more than its lease left; only a marker not yet marked, or a
/// transactional one (whose row its owner's transaction may hold, which only a locking read
/// can tell), is sent [`RECORD_PROBE`].
const RECORD_PEEK: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
SELECT r.transactional, r.waited, r.lease_ends_at > now.t AS in_lease, ",
    ms_between!("r.lease_ends_at", "now.t"),
    " AS left_ms
FROM {s}.records r, now
WHERE r.key = $1::text AND r.state = 'in_flight' AND (r.lease_ends_at > now.t OR r.transactional)"
);

/// Remove whatever record is at a key. `$1` key, `$2` channel, `$3` payload. Returns
/// `(removed)`: whether a live record was there (waiters are notified).
const RECORD_PURGE: &str = "WITH gone AS (
  DELETE FROM {s}.records WHERE key = $1::text
  RETURNING expires_at > clock_timestamp() AS live
)
SELECT coalesce(bool_or(live), false) AS removed,
       (SELECT count(pg_notify($2::text, $3::text)) FROM gone WHERE live) AS woke
FROM gone";

/// What an operator sees of a record. `$1` key. Returns `(state, owner, has_fingerprint,
/// payload_bytes, lease_left_ms, expires_in_ms, age_ms)` for a live record, no row otherwise.
const RECORD_INSPECT: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
SELECT r.state, r.owner, r.fingerprint IS NOT NULL AS has_fingerprint,
       octet_length(r.payload)::bigint AS payload_bytes, ",
    ms_between!("r.lease_ends_at", "now.t"),
    " AS lease_left_ms, ",
    ms_between!("r.expires_at", "now.t"),
    " AS expires_in_ms, ",
    ms_between!("now.t", "r.written_at"),
    " AS age_ms
FROM {s}.records r, now WHERE r.key = $1::text AND r.expires_at > now.t"
);

/// A page of live record keys of one operation; parameters as [`LOCK_LIST`].
const RECORD_LIST: &str = "SELECT key FROM {s}.records
WHERE key >= $1::text AND key < $1::text || ';' AND key > $2::text
  AND (key = $1::text OR key > $1::text || ':') AND expires_at > clock_timestamp()
ORDER BY key LIMIT $3::bigint";

/// Read a cache entry. `$1` key. Returns `(value, left_ms)` for a live entry.
const CACHE_GET: &str = concat!(
    "SELECT value, ",
    ms_between!("expires_at", "clock_timestamp()"),
    " AS left_ms FROM {s}.cache WHERE key = $1::text AND expires_at > clock_timestamp()"
);

/// Write a cache entry. `$1` key, `$2` value, `$3` ttl ms, `$4` when the write was sent
/// (server ms since the epoch, as the client estimates the server's clock). The entry expires
/// `$3` after the earlier of the send time and now, so a write that executes late keeps only
/// what is left of its ttl, and none at all once it is spent. Returns how many rows were
/// written (0: too late).
const CACHE_SET: &str = concat!(
    "WITH now AS MATERIALIZED (
  SELECT clock_timestamp() AS t,
         least(to_timestamp($4::bigint / 1000.0), clock_timestamp()) + ",
    ms!("$3::bigint"),
    " AS until
),
written AS (
  INSERT INTO {s}.cache AS c (key, value, expires_at)
  SELECT $1::text, $2::bytea, now.until FROM now WHERE now.until > now.t
  ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at
  RETURNING 1
)
SELECT count(*) AS written FROM written"
);

/// Delete a cache entry. `$1` key. Returns `(removed)`: whether a live entry was there.
const CACHE_DELETE: &str = "WITH gone AS (
  DELETE FROM {s}.cache WHERE key = $1::text RETURNING expires_at > clock_timestamp() AS live
)
SELECT coalesce(bool_or(live), false) AS removed FROM gone";

/// Claim a flight, or report its leader. `$1` key, `$2` owner, `$3` lease ms. Returns
/// `(claimed, owner, left_ms)`: the leader as the snapshot shows it when not claimed.
const FLIGHT_CLAIM: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
taken AS (
  INSERT INTO {s}.flights AS f (key, owner, expires_at)
  SELECT $1::text, $2::uuid, now.t + ",
    ms!("$3::bigint"),
    " FROM now
  ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
  WHERE f.expires_at <= (SELECT t FROM now) OR f.owner = excluded.owner
  RETURNING 1
)
SELECT (SELECT count(*) FROM taken) AS claimed, f.owner, ",
    ms_between!("f.expires_at", "now.t"),
    " AS left_ms
FROM now LEFT JOIN {s}.flights f ON f.key = $1::text AND f.expires_at > now.t"
);

/// Renew a flight claim. `$1` key, `$2` owner, `$3` lease ms. Returns `(renewed)` rows.
const FLIGHT_RENEW: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
renewed AS (
  UPDATE {s}.flights f SET expires_at = now.t + ",
    ms!("$3::bigint"),
    "
  FROM now WHERE f.key = $1::text AND f.owner = $2::uuid AND f.expires_at > now.t
  RETURNING 1
)
SELECT count(*) AS renewed FROM renewed"
);

/// Finish a flight: while the owner holds the claim, store the outcome for the hand-over
/// time, remove the claim and notify, in one statement. `$1` key, `$2` owner, `$3` outcome,
/// `$4` hand-over ms, `$5` channel, `$6` payload. Returns `(finished, kept)`: whether this
/// statement handed over, and whether the owner's outcome is kept (a resend after success).
const FLIGHT_FINISH: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t),
gone AS (
  DELETE FROM {s}.flights f USING now
  WHERE f.key = $1::text AND f.owner = $2::uuid AND f.expires_at > now.t
  RETURNING f.key
),
kept AS (
  INSERT INTO {s}.flight_outcomes AS o (key, leader, outcome, expires_at)
  SELECT $1::text, $2::uuid, $3::bytea, now.t + ",
    ms!("$4::bigint"),
    " FROM now
  WHERE EXISTS (SELECT 1 FROM gone)
  ON CONFLICT (key, leader) DO UPDATE SET outcome = excluded.outcome,
    expires_at = excluded.expires_at
  RETURNING 1
)
SELECT (SELECT count(pg_notify($5::text, $6::text)) FROM kept) AS finished,
       EXISTS (SELECT 1 FROM {s}.flight_outcomes o, now
               WHERE o.key = $1::text AND o.leader = $2::uuid AND o.expires_at > now.t) AS kept"
);

/// Abandon a flight claim. `$1` key, `$2` owner, `$3` channel, `$4` payload. Returns
/// `(removed)` (followers are notified).
const FLIGHT_ABANDON: &str = "WITH gone AS (
  DELETE FROM {s}.flights
  WHERE key = $1::text AND owner = $2::uuid AND expires_at > clock_timestamp()
  RETURNING 1
)
SELECT (SELECT count(pg_notify($3::text, $4::text)) FROM gone) AS removed";

/// What a follower of leader `$2` on key `$1` sees. Returns `(outcome, leads, left_ms)`: the
/// leader's kept outcome if any, whether the leader still holds the claim, and its lease left.
const FLIGHT_PEEK: &str = concat!(
    "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)
SELECT (SELECT o.outcome FROM {s}.flight_outcomes o
        WHERE o.key = $1::text AND o.leader = $2::uuid AND o.expires_at > now.t) AS outcome,
       f.owner = $2::uuid AS leads, ",
    ms_between!("f.expires_at", "now.t"),
    " AS left_ms
FROM now LEFT JOIN {s}.flights f ON f.key = $1::text AND f.expires_at > now.t"
);

/// Delete up to `$1` rows of `{table}` past their expiry, skipping rows another session has
/// locked (a sweeper never waits for, nor blocks, a caller). Returns how many.
const SWEEP: &str = "WITH doomed AS (
  SELECT ctid FROM {s}.{table} WHERE expires_at <= clock_timestamp()
  LIMIT $1::bigint FOR UPDATE SKIP LOCKED
),
gone AS (DELETE FROM {s}.{table} t USING doomed WHERE t.ctid = doomed.ctid RETURNING 1)
SELECT count(*) AS swept FROM gone";
