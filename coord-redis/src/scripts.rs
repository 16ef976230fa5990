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
//! exactly a `SET` and a compare-and-delete. An
//! idempotency record is a hash with fields `st` (`i` in flight, `c` completed), `own` (the
//! owner token, in flight only), `fp` (the 16-byte fingerprint, empty when none) and `pl` (the
//! payload, completed only), and `w` while someone waits for a marker (only then does settling
//! it publish); its expiry is the in-flight lease, then the retention.
//!
//! A marker claimed with "keep when abandoned" also has `lx` (when its lease ends, in server
//! milliseconds from `TIME`) and `kp` (how long to keep it after that, ms), and expires at
//! `lx + kp`. Past `lx` it is an abandoned record. Both instants come from the clock of the
//! server that holds the key, never from a client.

use std::sync::LazyLock;

/// A script and its SHA1.
pub(crate) struct Script {
    pub(crate) name: &'static str,
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl Script {
    fn new(name: &'static str, source: &'static str) -> Script {
        let sha = sha1_smol::Sha1::from(source).digest().to_string();
        Script { name, source, sha }
    }
}

/// The lock step both acquire scripts share. KEYS[1]: lock. ARGV: owner, lease ms, `1` to mark
/// a holder found as waited for (so its release publishes) else `0`.
///
/// Takes the lock with `SET NX PX`; when it is held by someone else, returns `{holder, pttl}`
/// from the script. Our own token (an earlier send of this very call landed: a client retry)
/// counts as taken, with the lease renewed. A value that is not a string fails on the `GET`
/// with `WRONGTYPE` before anything is written; a foreign string is returned, never marked.
macro_rules! take_or_watch_lock {
    () => {
        r#"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.call('GET', KEYS[1])
  if holder ~= ARGV[1] and holder ~= ARGV[1] .. '*' then
    if ARGV[3] == '1' and #holder == 32 and string.find(holder, '^[0-9a-f]+$') then
      redis.call('SET', KEYS[1], holder .. '*', 'KEEPTTL')
    end
    return {holder, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
"#
    };
}

/// Fenced acquire. KEYS: lock, fence. ARGV: owner, lease ms, `1`/`0` (mark a holder as waited
/// for, see `take_or_watch_lock!`), fence retention ms.
///
/// Returns the token (a positive integer) when the lock is now the owner's, `{holder, pttl}`
/// when held.
///
/// The token is `max(last + 1, server time in µs)`. While the counter exists (it is kept for
/// `max(10 × lease, 1 h)` after each mint) tokens grow by at least one; once it has expired,
/// the server clock has moved on by at least that long, so the next token (the current time)
/// still exceeds every earlier one, unless the server clock went back by more than that.
/// Everything is checked before the first write (a script is not rolled back when it fails
/// half-way): a foreign counter or a non-string lock fails the call and changes nothing.
pub(crate) static FENCED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "fenced_acquire",
        concat!(
            r#"
local last = redis.call('GET', KEYS[2])
local floor = 0
if last then
  floor = tonumber(last)
  if floor == nil or floor < 0 or floor >= 9007199254740000 then
    return redis.error_reply('ERR coord: the fencing counter holds a foreign value')
  end
end
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

/// Unfenced acquire while waiting. KEYS: lock. ARGV: owner, lease ms, `1` (mark the holder).
///
/// The lock step of the fenced acquire without the mint: returns 0 when the lock is now the
/// owner's, `{holder, pttl}` when held (the holder now marked as waited for).
pub(crate) static WAITING_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "waiting_acquire",
        concat!(take_or_watch_lock!(), "return 0\n"),
    )
});

/// Owner-scoped release. KEYS: lock. ARGV: owner.
///
/// Deletes the lock when the owner holds it, and publishes on the channel named like it when
/// someone marked it as waited for: returns 1, else 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "release",
        r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if holder == ARGV[1] .. '*' then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[1], '')
  return 1
end
return 0
"#,
    )
});

/// Owner-scoped renewal (a waiter's mark stays). KEYS: lock. ARGV: owner, lease ms. Returns
/// 1 when renewed, else 0.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "renew",
        r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] or holder == ARGV[1] .. '*' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#,
    )
});

/// Claim or read. KEYS: record. ARGV: owner, in-flight lease ms, fingerprint (may be empty),
/// keep-when-abandoned ms (empty: do not keep).
///
/// Returns `{1}` when claimed, `{2, fp}` for a kept abandoned marker, or
/// `{0, st, fp, payload, remaining ms}` for the record found (absent fields come back as nil
/// and are reported by the client as a corrupt record).
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "claim",
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then
  local lease = tonumber(ARGV[2])
  if ARGV[4] == '' then
    redis.call('HSET', KEYS[1], 'st', 'i', 'own', ARGV[1], 'fp', ARGV[3])
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    local keep = tonumber(ARGV[4])
    redis.call('HSET', KEYS[1], 'st', 'i', 'own', ARGV[1], 'fp', ARGV[3],
      'lx', string.format('%.0f', now + lease), 'kp', ARGV[4])
    redis.call('PEXPIRE', KEYS[1], lease + keep)
  end
  return {1}
end
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'pl', 'lx')
local remaining = redis.call('PTTL', KEYS[1])
if r[1] == 'i' and r[4] then
  local lx = tonumber(r[4])
  if lx == nil then
    return redis.error_reply('ERR coord: the record holds a foreign lease end')
  end
  if now >= lx then
    return {2, r[2]}
  end
  remaining = lx - now
end
return {0, r[1], r[2], r[3], remaining}
"#,
    )
});

/// Owner-scoped renewal of an in-flight marker. KEYS: record. ARGV: owner, lease ms.
/// Returns 1 when renewed, 0 when the marker is gone, lapsed, completed or not the owner's.
pub(crate) static RENEW_MARKER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "renew_marker",
        r#"
local r = redis.call('HMGET', KEYS[1], 'st', 'own', 'lx', 'kp')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then
  return 0
end
local lease = tonumber(ARGV[2])
if r[3] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local lx = tonumber(r[3])
  local keep = tonumber(r[4])
  if lx == nil or keep == nil then
    return redis.error_reply('ERR coord: the record holds a foreign lease end')
  end
  if now >= lx then
    return 0
  end
  redis.call('HSET', KEYS[1], 'lx', string.format('%.0f', now + lease))
  redis.call('PEXPIRE', KEYS[1], lease + keep)
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
return 1
"#,
    )
});

/// What a waiter needs to know, run once it is subscribed. KEYS: record.
///
/// Returns `{0}` without a record, `{1, st}` for a record that is not in flight (`st` is `c`
/// unless the record is foreign), `{2, pttl}` for a marker, `{3, remaining ms}` for a kept
/// marker (zero or less once its lease has ended: it is abandoned, not in flight). A marker
/// in flight gets the field `w` ("someone waits"): only then do completion and abandonment
/// publish.
pub(crate) static PROBE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "probe",
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0}
end
local r = redis.call('HMGET', KEYS[1], 'st', 'lx', 'w')
if r[1] ~= 'i' then
  return {1, r[1]}
end
if not r[3] then
  redis.call('HSET', KEYS[1], 'w', '1')
end
if r[2] then
  local lx = tonumber(r[2])
  if lx == nil then
    return redis.error_reply('ERR coord: the record holds a foreign lease end')
  end
  local t = redis.call('TIME')
  return {3, lx - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))}
end
return {2, redis.call('PTTL', KEYS[1])}
"#,
    )
});

/// Removes any record. KEYS: record. Publishes when something was removed, so
/// waiters on a marker return. Returns 1 when a record was there, else 0.
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

/// Owner-scoped completion. KEYS: record. ARGV: owner, payload, retention ms.
///
/// Turns the owner's in-flight marker (live, or lapsed and kept) into the completed record
/// (keeping its fingerprint) and sets the retention; publishes when someone waits (`w`).
/// Returns 1, or 0 when the marker is not the owner's.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "complete",
        r#"
local r = redis.call('HMGET', KEYS[1], 'st', 'own', 'w')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'st', 'c', 'pl', ARGV[2])
redis.call('HDEL', KEYS[1], 'own', 'lx', 'kp', 'w')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if r[3] then
  redis.call('PUBLISH', KEYS[1], 'c')
end
return 1
"#,
    )
});

/// Owner-scoped abandonment. KEYS: record. ARGV: owner.
///
/// Deletes the owner's in-flight marker (live, or lapsed and kept); publishes when someone
/// waits (`w`). Returns 1, or 0 when not the owner's.
pub(crate) static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "abandon",
        r#"
local r = redis.call('HMGET', KEYS[1], 'st', 'own', 'w')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if r[3] then
  redis.call('PUBLISH', KEYS[1], 'a')
end
return 1
"#,
    )
});
