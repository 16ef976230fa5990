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
//! Values: a lock holds its owner token (32 lowercase hex characters) with a `PX` lease. A
//! task that waits for the lock appends `*` to the holder's token ("someone is waiting"),
//! keeping the lease; only then does the release publish, so a lock nobody waits for costs
//! exactly a `SET` and a compare-and-delete. A waiting process also puts its provider's id
//! (16 hex digits) in the lock's queue, a list; the release of a marked lock pops the first id
//! and publishes on `<lock>#<id>` only, so one release wakes one process. A fencing counter holds a decimal integer
//! (digits only, below 2^53).
//!
//! An idempotency record is a hash with fields `st` (`i` in flight, `c` completed), `own`
//! (the owner token: the marker's owner, and on a completed record the owner that completed
//! it; records completed by older versions have none), `fp` (the 16-byte fingerprint, empty
//! when none), `pl` (the payload, completed only), and `w` = `1` while someone waits for a
//! marker (only then does settling it publish); its expiry is the in-flight lease, then the
//! retention.
//!
//! A marker claimed with "keep when abandoned" also has `lx` (when its lease ends, in server
//! milliseconds from `TIME`) and `kp` (how long to keep it after that, ms), and expires at
//! `lx + kp`. Past `lx` it is an abandoned record. Both instants come from the clock of the
//! server that holds the key, never from a client.
//!
//! Every record also has `at`: when it was written in its current form (the claim that made
//! the marker; the completion that stored the outcome), in server milliseconds. It is only
//! read by the operations API (a record's age); records written by older versions have none.
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

use std::sync::LazyLock;

mod rw_locks;
pub(crate) use rw_locks::{INSPECT_RW, RW_ACQUIRE, RW_RELEASE, RW_RENEW};

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

/// Lua helpers for lock values: `is_lock_value(v)` is true for an owner token, with or without
/// the waiter's `*` (the only strings coord writes at a lock key).
macro_rules! lock_value_check {
    () => {
        r#"
local function is_lock_value(v)
  local n = #v
  if n == 33 and string.byte(v, 33) == 42 then
    v = string.sub(v, 1, 32)
    n = 32
  end
  return n == 32 and string.find(v, '^[0-9a-f]+$') ~= nil
end
"#
    };
}

/// The lock step both acquire scripts share. KEYS[1]: lock. ARGV: owner, lease ms, then the
/// watch mode: `0` nothing more; `1` (a waiter) mark a holder found as waited for (so its
/// release publishes) and put this process in the lock's queue; `2` (a waiter with more
/// waiters of its process behind it) the same, and when the lock is taken, take it already
/// marked and put this process back at the end of the queue, so its release wakes this
/// process again. A waiter that takes the lock while other processes are queued (`1`) also
/// takes it marked, so its release wakes the next of them. The script defines `queue` (the queue's key, needed for `1` and `2`) and
/// `pid` (this process's id in the queue) before this step.
///
/// Takes the lock with `SET NX PX`; when it is held by someone else, returns `{holder, pttl}`
/// from the script. Our own token (an earlier send of this very call landed: a client retry)
/// counts as taken, with the lease renewed. A value that is not a string fails on the `GET`
/// with `WRONGTYPE` before anything is written; a string that is not a lock value is refused
/// (`ERR coord:`), never marked.
///
/// The queue is a list of process ids, each at most once, kept for a minute past the lease
/// of the last waiter that joined it. Losing it (or a process in it that stopped waiting)
/// costs a wake-up, never a grant: waiters re-check on their own timer.
macro_rules! take_or_watch_lock {
    () => {
        r#"
local value = ARGV[1]
if ARGV[3] == '2' or (ARGV[3] == '1' and redis.call('EXISTS', queue) == 1) then
  value = ARGV[1] .. '*'
end
if not redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2]) then
  local holder = redis.call('GET', KEYS[1])
  if holder ~= ARGV[1] and holder ~= ARGV[1] .. '*' then
    if not is_lock_value(holder) then
      return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
    end
    if ARGV[3] ~= '0' then
      if #holder == 32 then
        redis.call('SET', KEYS[1], holder .. '*', 'KEEPTTL')
      end
      redis.call('LREM', queue, 0, pid)
      redis.call('RPUSH', queue, pid)
      redis.call('PEXPIRE', queue, tonumber(ARGV[2]) + 60000)
    end
    return {holder, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if value ~= ARGV[1] and holder == ARGV[1] then
    redis.call('SET', KEYS[1], value, 'KEEPTTL')
  end
end
if ARGV[3] == '2' then
  redis.call('LREM', queue, 0, pid)
  redis.call('RPUSH', queue, pid)
  redis.call('PEXPIRE', queue, tonumber(ARGV[2]) + 60000)
end
"#
    };
}

/// Fenced acquire. KEYS: lock, fence, and the lock's queue when waiting. ARGV: owner, lease
/// ms, watch mode (`0`/`1`/`2`, see `take_or_watch_lock!`), fence retention ms, and this
/// process's id when waiting.
///
/// Returns the token (a positive integer) when the lock is now the owner's, `{holder, pttl}`
/// when held.
///
/// The token is `max(last + 1, server time in µs)`. While the counter exists (it is kept for
/// `max(10 × lease, 1 h)` after each mint) tokens grow by at least one; once it has expired,
/// the server clock has moved on by at least that long, so the next token (the current time)
/// still exceeds every earlier one, unless the server clock went back by more than that.
/// Everything is checked before the first write (a script is not rolled back when it fails
/// half-way): a counter that is not plain decimal digits below 2^53 (`tonumber` would accept
/// `nan`, `inf`, `1e400`, ` 5` or `0x10`), or a lock value coord did not write, fails the call
/// and changes nothing.
pub(crate) static FENCED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "fenced_acquire",
        concat!(
            lock_value_check!(),
            r#"
local last = redis.call('GET', KEYS[2])
local floor = 0
if last then
  if #last > 16 or not string.find(last, '^[0-9]+$') then
    return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
  end
  floor = tonumber(last)
  if floor >= 9007199254740000 then
    return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
  end
end
local queue, pid = KEYS[3], ARGV[5]
"#,
            take_or_watch_lock!(),
            r#"
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if floor >= token then
  token = floor + 1
end
redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[4])
return token
"#
        ),
    )
});

/// Unfenced acquire while waiting. KEYS: lock, the lock's queue. ARGV: owner, lease ms, watch
/// mode (`1`/`2`, see `take_or_watch_lock!`), this process's id.
///
/// The lock step of the fenced acquire without the mint: returns 0 when the lock is now the
/// owner's, `{holder, pttl}` when held (the holder now marked as waited for).
pub(crate) static WAITING_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "waiting_acquire",
        concat!(
            lock_value_check!(),
            "local queue, pid = KEYS[2], ARGV[4]\n",
            take_or_watch_lock!(),
            "return 0\n"
        ),
    )
});

/// Owner-scoped release. KEYS: lock, forced-release marker, the lock's queue. ARGV: owner.
///
/// Deletes the lock when the owner holds it: returns 1. When someone marked it as waited for,
/// it also wakes one waiting process: the first in the lock's queue (taken off it), on its own
/// channel `<lock>#<id>`; when the queue is empty or gone, every process, on the channel named
/// like the lock. When it is not the owner's: returns 2 when the
/// marker names the owner (an operator forced its hold free, see `FORCE_RELEASE`), else 0
/// (the lock is free or another token's). Refuses a lock value coord did not write; the
/// marker is only read, and only on the path where the lock is not the owner's, so an
/// ordinary release costs what it did.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "release",
        concat!(
            lock_value_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if holder == ARGV[1] .. '*' then
  redis.call('DEL', KEYS[1])
  local first = KEYS[3] and redis.call('LPOP', KEYS[3])
  if first then
    redis.call('PUBLISH', KEYS[1] .. '#' .. first, '')
  else
    redis.call('PUBLISH', KEYS[1], '')
  end
  return 1
end
if holder and not is_lock_value(holder) then
  return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return 2
end
return 0
"#
        ),
    )
});

/// Owner-scoped renewal (a waiter's mark stays). KEYS: lock, forced-release marker. ARGV:
/// owner, lease ms. Returns 1 when renewed; when the lock is not the owner's, 3 when the marker
/// names the owner (an operator forced its hold free), else 0 when the lock is free, 2 when
/// another token holds it. Refuses a lock value coord did not write.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "renew",
        concat!(
            lock_value_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '*' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder and not is_lock_value(holder) then
  return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return 3
end
if not holder then
  return 0
end
return 2
"#
        ),
    )
});

/// Lua helpers for records: `read_record()` reads the record at `KEYS[1]` and returns `nil`
/// when there is none, the checked fields when it is one coord wrote, or `false, reason` when
/// it is not (a wrong type fails the read itself with `WRONGTYPE`). `now_ms()` is the server
/// clock in milliseconds.
macro_rules! record_check {
    () => {
        r#"
local function is_token(v)
  return v and #v == 32 and string.find(v, '^[0-9a-f]+$') ~= nil
end
local function is_ms(v)
  return v and #v >= 1 and #v <= 16 and string.find(v, '^[0-9]+$') ~= nil
    and tonumber(v) < 9007199254740000
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function read_record()
  local f = redis.call('HMGET', KEYS[1], 'st', 'own', 'fp', 'pl', 'lx', 'kp', 'w', 'at')
  local r = {st = f[1], own = f[2], fp = f[3], pl = f[4], lx = f[5], kp = f[6], w = f[7],
    at = f[8]}
  if not r.st then
    if redis.call('EXISTS', KEYS[1]) == 0 then
      return nil
    end
    return false, 'ERR coord: the record has no state'
  end
  if r.st == 'i' then
    if not is_token(r.own) then
      return false, 'ERR coord: the marker has no valid owner'
    end
    if r.pl then
      return false, 'ERR coord: the marker has a payload'
    end
    if r.lx or r.kp then
      if not (is_ms(r.lx) and is_ms(r.kp)) then
        return false, 'ERR coord: the marker holds a foreign lease end or keep period'
      end
      r.lx = tonumber(r.lx)
      r.kp = tonumber(r.kp)
    end
  elseif r.st == 'c' then
    if not r.pl then
      return false, 'ERR coord: the completed record has no payload'
    end
    if r.own and not is_token(r.own) then
      return false, 'ERR coord: the completed record has no valid owner'
    end
    if r.lx or r.kp then
      return false, 'ERR coord: the completed record holds a lease end'
    end
  else
    return false, 'ERR coord: the record has an unknown state'
  end
  if not r.fp or (#r.fp ~= 0 and #r.fp ~= 16) then
    return false, 'ERR coord: the record has no valid fingerprint'
  end
  if r.w and r.w ~= '1' then
    return false, 'ERR coord: the record has a foreign waiter flag'
  end
  if r.at then
    if not is_ms(r.at) then
      return false, 'ERR coord: the record holds a foreign write time'
    end
    r.at = tonumber(r.at)
  end
  return r
end
"#
    };
}

/// Claim or read. KEYS: record. ARGV: owner, in-flight lease ms, fingerprint (may be empty),
/// keep-when-abandoned ms (empty: do not keep), not-after (server ms; empty: no limit).
///
/// A claim that executes after its not-after time changes nothing and returns `{3}`: its
/// caller has given up on it (the command sat in a frozen server or a slow network past the
/// command timeout), so a marker it created would block the key, and under
/// `on_abandoned = "fail"` report an unknown outcome, for a body that never ran.
///
/// Returns `{1}` when claimed (also when the record is the caller's own live marker: a resend
/// whose first send landed), `{2, fp}` for a kept abandoned marker, or
/// `{0, st, fp, payload, remaining ms, age ms}` for the record found (age: since its last
/// write, -1 when the record has no write time). A marker without an expiry (it
/// would never lapse) is refused like any record coord did not write.
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "claim",
        concat!(
            record_check!(),
            r#"
local now = now_ms()
if ARGV[5] ~= '' and now > tonumber(ARGV[5]) then
  return {3}
end
local r, why = read_record()
if r == false then
  return redis.error_reply(why)
end
if r == nil then
  local lease = tonumber(ARGV[2])
  local at = string.format('%.0f', now)
  if ARGV[4] == '' then
    redis.call('HSET', KEYS[1], 'st', 'i', 'own', ARGV[1], 'fp', ARGV[3], 'at', at)
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    local keep = tonumber(ARGV[4])
    redis.call('HSET', KEYS[1], 'st', 'i', 'own', ARGV[1], 'fp', ARGV[3], 'at', at,
      'lx', string.format('%.0f', now + lease), 'kp', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], lease + keep)
  end
  return {1}
end
local remaining = redis.call('PTTL', KEYS[1])
if r.st == 'i' then
  if r.lx then
    if now >= r.lx then
      return {2, r.fp}
    end
    remaining = r.lx - now
  elseif remaining < 0 then
    return redis.error_reply('ERR coord: the marker has no expiry')
  end
  if r.own == ARGV[1] then
    return {1}
  end
end
local age = -1
if r.at then
  age = math.max(now - r.at, 0)
end
return {0, r.st, r.fp, r.pl, remaining, age}
"#
        ),
    )
});

/// Owner-scoped renewal of an in-flight marker. KEYS: record. ARGV: owner, lease ms.
/// Returns 1 when renewed; 2 when another owner's marker or record is there; 0 when the key
/// is free, or holds the owner's own lapsed marker or completed record (or a completed record
/// without an owner).
pub(crate) static RENEW_MARKER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "renew_marker",
        concat!(
            record_check!(),
            r#"
local r, why = read_record()
if r == false then
  return redis.error_reply(why)
end
if r == nil then
  return 0
end
if r.own and r.own ~= ARGV[1] then
  return 2
end
if r.st ~= 'i' then
  return 0
end
local lease = tonumber(ARGV[2])
if r.lx then
  local now = now_ms()
  if now >= r.lx then
    return 0
  end
  redis.call('HSET', KEYS[1], 'lx', string.format('%.0f', now + lease))
  redis.call('PEXPIRE', KEYS[1], lease + r.kp)
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
"#
        ),
    )
});

/// What a waiter needs to know, run once it is subscribed. KEYS: record.
///
/// Returns `{0}` without a record, `{1, st}` for a completed record, `{2, pttl}` for a
/// marker, `{3, remaining ms}` for a kept marker (zero or less once its lease has ended: it is
/// abandoned, not in flight). A marker in flight gets the field `w` ("someone waits"): only
/// then do completion and abandonment publish.
pub(crate) static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "probe",
        concat!(
            record_check!(),
            r#"
local r, why = read_record()
if r == false then
  return redis.error_reply(why)
end
if r == nil then
  return {0}
end
if r.st ~= 'i' then
  return {1, r.st}
end
if r.lx then
  local remaining = r.lx - now_ms()
  if remaining > 0 and not r.w then
    redis.call('HSET', KEYS[1], 'w', '1')
  end
  return {3, remaining}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return redis.error_reply('ERR coord: the marker has no expiry')
end
if not r.w then
  redis.call('HSET', KEYS[1], 'w', '1')
end
return {2, pttl}
"#
        ),
    )
});

/// Removes any record, whatever it holds (the way to clear a record coord refuses as
/// corrupt). KEYS: record. Publishes when something was removed, so waiters on a marker
/// return. Returns 1 when a record was there, else 0.
pub(crate) static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "purge",
        r#"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', KEYS[1], 'p')
  return 1
end
return 0
"#,
    )
});

/// Completion. KEYS: record. ARGV: owner, payload, retention ms, fingerprint (may be empty).
///
/// * The owner's marker (live, or lapsed and kept) becomes the completed record, keeping its
///   fingerprint and owner, for the retention; publishes when someone waits (`w`). `{1}`.
/// * The owner's own completed record (this completion, sent again): nothing changes. `{1}`.
/// * No record: the completed record is created with the given fingerprint. `{2}`.
/// * Another owner's marker or record: nothing changes. `{0, other owner or nil, 1 when that
///   record is completed else 0}`.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "complete",
        concat!(
            record_check!(),
            r#"
local r, why = read_record()
if r == false then
  return redis.error_reply(why)
end
if r == nil then
  local at = string.format('%.0f', now_ms())
  redis.call('HSET', KEYS[1], 'st', 'c', 'own', ARGV[1], 'fp', ARGV[4], 'pl', ARGV[2], 'at', at)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {2}
end
if r.own ~= ARGV[1] then
  local completed = 0
  if r.st == 'c' then
    completed = 1
  end
  return {0, r.own, completed}
end
if r.st == 'c' then
  return {1}
end
redis.call('HSET', KEYS[1], 'st', 'c', 'pl', ARGV[2], 'at', string.format('%.0f', now_ms()))
redis.call('HDEL', KEYS[1], 'lx', 'kp', 'w')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if r.w then
  redis.call('PUBLISH', KEYS[1], 'c')
end
return {1}
"#
        ),
    )
});

/// Owner-scoped abandonment. KEYS: record. ARGV: owner.
///
/// Deletes the owner's in-flight marker (live, or lapsed and kept); publishes when someone
/// waits (`w`). Returns 1, or 0 when there is no record or it is not the owner's marker.
pub(crate) static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "abandon",
        concat!(
            record_check!(),
            r#"
local r, why = read_record()
if r == false then
  return redis.error_reply(why)
end
if r == nil or r.st ~= 'i' or r.own ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if r.w then
  redis.call('PUBLISH', KEYS[1], 'a')
end
return 1
"#
        ),
    )
});

/// What the operations API shows of a lock. KEYS: lock, fence. Reads only.
///
/// Returns `{holder or nil, pttl (-2 when free), fencing counter or nil}`. Refuses a lock
/// value coord did not write, a lock without an expiry (coord always sets one) and a fencing
/// counter that is not plain decimal digits below 2^53; a value of another Redis type fails
/// the read with `WRONGTYPE`.
pub(crate) static INSPECT_LOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "inspect_lock",
        concat!(
            lock_value_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
local pttl = -2
if holder then
  if not is_lock_value(holder) then
    return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
  end
  pttl = redis.call('PTTL', KEYS[1])
  if pttl == -1 then
    return redis.error_reply('ERR coord: the lock has no expiry')
  end
  if pttl == -2 then
    holder = false
  end
end
local fence = redis.call('GET', KEYS[2])
if fence then
  if #fence > 16 or not string.find(fence, '^[0-9]+$') or tonumber(fence) >= 9007199254740000 then
    return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
  end
end
return {holder or false, pttl, fence or false}
"#
        ),
    )
});

/// An operator's release: frees the lock whoever holds it. KEYS: lock, forced-release marker.
/// ARGV: how long to remember the released owner past the end of its lease, ms.
///
/// Returns `{0}` when the key is free, `{1, holder token}` when a holder's lock was deleted
/// (and publishes on the lock's channel, whether or not a waiter marked it: a waiter that has
/// not marked it yet retries at once instead of at its backstop), `{2}` when the key held
/// something coord did not write (another type, or a string that is not a lock value), which
/// is deleted too: forcing the lock free is also how an operator clears a corrupt one. The
/// fencing counter is left alone.
///
/// After freeing a holder's lock it writes the marker: the holder's token, expiring when the
/// lease it cut short would have ended plus ARGV[1], so the former holder's `RELEASE` and
/// `RENEW` can tell it that its hold was forced free rather than lapsed. A resend finds the
/// key free and answers `{0}`, leaving the marker as it is.
pub(crate) static FORCE_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "force_release",
        concat!(
            lock_value_check!(),
            r#"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return {0}
end
if kind ~= 'string' then
  redis.call('DEL', KEYS[1])
  return {2}
end
local holder = redis.call('GET', KEYS[1])
local left = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
if not is_lock_value(holder) then
  return {2}
end
redis.call('PUBLISH', KEYS[1], '')
local owner = string.sub(holder, 1, 32)
local keep = tonumber(ARGV[1])
if left > 0 then
  keep = keep + left
end
redis.call('SET', KEYS[2], owner, 'PX', keep)
return {1, owner}
"#
        ),
    )
});

/// What the operations API shows of a record. KEYS: record. Reads only.
///
/// Returns `{0}` without a record, else `{1, state, owner or nil, age ms (-1 when unknown),
/// lease left ms (-1 unless in flight), expiry ms (PTTL), payload bytes (-1 unless completed),
/// fingerprint bytes}`, where state is `i` (in flight), `a` (a kept marker past its lease:
/// abandoned) or `c` (completed). Refuses what the other record scripts refuse, and a record
/// without an expiry.
pub(crate) static INSPECT_RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "inspect_record",
        concat!(
            record_check!(),
            r#"
local r, why = read_record()
if r == false then
  return redis.error_reply(why)
end
if r == nil then
  return {0}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return redis.error_reply('ERR coord: the record has no expiry')
end
local now = now_ms()
local state = r.st
local lease_left = -1
if r.st == 'i' then
  if r.lx then
    if now >= r.lx then
      state = 'a'
    else
      lease_left = r.lx - now
    end
  else
    lease_left = pttl
  end
end
local age = -1
if r.at then
  age = math.max(now - r.at, 0)
end
local payload = -1
if r.pl then
  payload = #r.pl
end
return {1, state, r.own or false, age, lease_left, pttl, payload, #r.fp}
"#
        ),
    )
});

/// Lua helper for flight claims: `is_flight_token(v)` is true for an owner token, the only
/// string coord writes at a flight claim key.
macro_rules! flight_check {
    () => {
        r#"
local function is_flight_token(v)
  return #v == 32 and string.find(v, '^[0-9a-f]+$') ~= nil
end
"#
    };
}

/// Cluster single-flight: claims the flight, or reports its leader. KEYS: claim. ARGV: owner,
/// lease ms. A claim is the leader's owner token with a `PX` lease (`SET NX PX`-like: one
/// holder at a time). Returns `{1}` when the caller leads (also on a resend by the leader, which
/// restarts the lease), `{0, leader, lease left ms}` otherwise; refuses a value coord did not
/// write.
pub(crate) static FLIGHT_CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "flight_claim",
        concat!(
            flight_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1}
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
if not is_flight_token(holder) then
  return redis.error_reply('ERR coord: the flight claim holds a value coord did not write')
end
return {0, holder, redis.call('PTTL', KEYS[1])}
"#
        ),
    )
});

/// Owner-scoped renewal of a flight claim. KEYS: claim. ARGV: owner, lease ms. Returns 1 when
/// renewed, 0 otherwise; refuses a value coord did not write.
pub(crate) static FLIGHT_RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "flight_renew",
        concat!(
            flight_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if holder and not is_flight_token(holder) then
  return redis.error_reply('ERR coord: the flight claim holds a value coord did not write')
end
return 0
"#
        ),
    )
});

/// Hands a leader's outcome over, fenced by its claim. KEYS: claim, the outcome key of this
/// owner's generation. ARGV: owner, outcome bytes, hand-over ms. While the owner holds the
/// claim: stores the outcome for the hand-over time, deletes the claim, then publishes on the
/// claim's channel, and returns 1. A resend after that returns 1 while the outcome is kept.
/// Otherwise changes nothing and returns 0; refuses a value coord did not write.
pub(crate) static FLIGHT_FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "flight_finish",
        concat!(
            flight_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1], ARGV[1])
  return 1
end
if holder and not is_flight_token(holder) then
  return redis.error_reply('ERR coord: the flight claim holds a value coord did not write')
end
return redis.call('EXISTS', KEYS[2])
"#
        ),
    )
});

/// Gives a flight claim up without an outcome. KEYS: claim. ARGV: owner. While the owner holds
/// it: deletes it and publishes on its channel (a follower takes over at once), returns 1.
/// Otherwise returns 0; refuses a value coord did not write.
pub(crate) static FLIGHT_ABANDON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "flight_abandon",
        concat!(
            flight_check!(),
            r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1], '')
  return 1
end
if holder and not is_flight_token(holder) then
  return redis.error_reply('ERR coord: the flight claim holds a value coord did not write')
end
return 0
"#
        ),
    )
});

/// What a follower of generation `leader` sees. KEYS: claim, the outcome key of `leader`.
/// ARGV: leader. Returns `{1, outcome}` once handed over, `{2, lease left ms}` while `leader`
/// still holds the claim, `{0}` otherwise (abandoned, lapsed, or another leader now); refuses
/// a claim coord did not write.
pub(crate) static FLIGHT_PEEK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "flight_peek",
        concat!(
            flight_check!(),
            r#"
local outcome = redis.call('GET', KEYS[2])
if outcome then
  return {1, outcome}
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  return {2, redis.call('PTTL', KEYS[1])}
end
if holder and not is_flight_token(holder) then
  return redis.error_reply('ERR coord: the flight claim holds a value coord did not write')
end
return {0}
"#
        ),
    )
});

/// Writes a shared cache entry for what is left of its ttl when the write executes. KEYS: the
/// entry. ARGV: value, ttl ms, the moment the write was sent (server ms, as the client
/// estimates the server's clock). The ttl is shortened by however late the write executes (a
/// client or server that stalled between the two), and nothing is written when none is left:
/// returns `1` when written, `0` when it came too late.
pub(crate) static CACHE_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "cache_set",
        r#"
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local late = now - tonumber(ARGV[3])
if late > 0 then
  ttl = ttl - late
end
if ttl < 1 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', string.format('%.0f', ttl))
return 1
"#,
    )
});

/// Lua helpers of the semaphore scripts: the server's clock in ms, dropping the permits whose
/// lease ended (from the sorted set and the token hash, in the same script, so the limit is
/// exact), reading a permit's token, and keeping both keys at least as long as their newest
/// permit.
///
/// Layout (one semaphore, one hash tag): the sorted set `ns:sem:{..}` scores each holder's
/// owner token (32 lowercase hex digits) with the end of its lease, in server milliseconds;
/// the hash `ns:sem-tok:{..}` maps each holder to its fencing token (decimal digits), plus the
/// field `w` = `1` while someone waits (only then does a release publish on the channel named
/// like the sorted set) and the field `f`, the last token minted (the semaphore's fencing
/// counter). The sorted set expires at the latest lease end it holds; the hash, kept for
/// `max(10 × lease, 1 h)` after each mint as the lock's counter is, at least as late.
macro_rules! semaphore_helpers {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function drop_expired()
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  for _, owner in ipairs(gone) do
    redis.call('ZREM', KEYS[1], owner)
    redis.call('HDEL', KEYS[2], owner)
  end
end
local function token_of(owner)
  local tok = redis.call('HGET', KEYS[2], owner)
  if not tok or #tok > 16 or not string.find(tok, '^[0-9]+$') then
    return nil
  end
  return tonumber(tok)
end
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
"#
    };
}

/// What the operations API shows of a semaphore. KEYS: permits, tokens. Reads only.
///
/// Returns `{waiter flag (1 or 0), owner, ms left, token, owner, ms left, token, ...}`: every
/// permit whose lease has not ended by the server's clock, soonest-ending first. Refuses a
/// permit whose token is missing or not plain decimal digits (coord writes both together); a
/// value of another Redis type fails the read with `WRONGTYPE`.
pub(crate) static INSPECT_SEMAPHORE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "inspect_semaphore",
        concat!(
            semaphore_helpers!(),
            r#"
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = {0}
if redis.call('HGET', KEYS[2], 'w') then
  out[1] = 1
end
for i = 1, #live, 2 do
  local tok = token_of(live[i])
  if not tok then
    return redis.error_reply('ERR coord: the semaphore token holds a value coord did not write')
  end
  out[#out + 1] = live[i]
  out[#out + 1] = math.floor(tonumber(live[i + 1]) - now)
  out[#out + 1] = tok
end
return out
"#
        ),
    )
});

/// Takes one permit of a semaphore. KEYS: permits (sorted set), tokens (hash, which also holds
/// the fencing counter). ARGV: owner, limit, lease ms, `1` to note a waiter (so releases
/// publish) else `0`.
///
/// Drops expired permits first. The owner's own live permit (a resent acquire) answers its
/// token with the lease renewed. Otherwise, with fewer than `limit` live permits, adds the
/// owner's permit with a token minted as the fenced lock's is (`max(last + 1, server time in
/// µs)`) and answers the token (a positive integer). A full semaphore answers `{0, ms}`, the
/// time left on the soonest-ending permit. Refuses a counter or a token coord did not write
/// (before the first write), and a wrong Redis type fails its first read with `WRONGTYPE`.
pub(crate) static SEM_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "semaphore_acquire",
        concat!(
            semaphore_helpers!(),
            r#"
local lease = tonumber(ARGV[3])
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
if mine and tonumber(mine) > now then
  local tok = token_of(ARGV[1])
  if not tok then
    return redis.error_reply('ERR coord: the semaphore token holds a value coord did not write')
  end
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  keep(KEYS[1], lease)
  keep(KEYS[2], lease)
  return tok
end
local last = redis.call('HGET', KEYS[2], 'f')
local floor = 0
if last then
  if #last > 16 or not string.find(last, '^[0-9]+$') then
    return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
  end
  floor = tonumber(last)
  if floor >= 9007199254740000 then
    return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
  end
end
drop_expired()
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  if ARGV[4] == '1' then
    redis.call('HSET', KEYS[2], 'w', '1')
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local left = 0
  if first[2] then
    left = tonumber(first[2]) - now
  end
  return {0, left}
end
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
if floor >= token then
  token = floor + 1
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], string.format('%.0f', token), 'f', string.format('%.0f', token))
keep(KEYS[1], lease)
keep(KEYS[2], math.min(math.max(lease * 10, 3600000), 70368744177664))
return token
"#
        ),
    )
});

/// Owner-scoped release of a permit. KEYS: permits, tokens. ARGV: owner. (The hash stays: it
/// holds the fencing counter, and expires on its own.)
///
/// Returns 1 when the owner's live permit was removed (publishing on the channel named like
/// the sorted set when a waiter is noted, and clearing the note); 0 when the owner holds no
/// live permit: a permit that expired is removed without freeing anything, since it no longer
/// counted (a late release never frees another holder's place). Expired permits of others are
/// dropped too.
pub(crate) static SEM_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "semaphore_release",
        concat!(
            semaphore_helpers!(),
            r#"
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
drop_expired()
if not mine or tonumber(mine) <= now then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[2], 'w') then
  redis.call('HDEL', KEYS[2], 'w')
  redis.call('PUBLISH', KEYS[1], '')
end
return 1
"#
        ),
    )
});

/// Owner-scoped renewal of a permit. KEYS: permits, tokens. ARGV: owner, lease ms.
///
/// Returns 1 when the owner's live permit now ends `lease` from now, 0 when the owner holds no
/// live permit (an expired one is removed: renewal never revives a permit that stopped
/// counting).
pub(crate) static SEM_RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "semaphore_renew",
        concat!(
            semaphore_helpers!(),
            r#"
local lease = tonumber(ARGV[2])
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not mine or tonumber(mine) <= now then
  drop_expired()
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
keep(KEYS[1], lease)
keep(KEYS[2], lease)
return 1
"#
        ),
    )
});
