//! The Lua scripts, each one atomic on the server.
//!
//! Scripts are sent by SHA1 (`EVALSHA`); a server that does not know one yet (fresh start,
//! failover, `SCRIPT FLUSH`) answers `NOSCRIPT` and the provider sends the source once with
//! `EVAL`, which also caches it there.
//!
//! Every script touches keys of one call key only (one hash tag), so it runs unchanged on
//! Redis Cluster. Channels are passed as arguments: `PUBLISH` is not a key access.
//!
//! Values: a lock holds its owner token (32 lowercase hex characters) with a `PX` lease. An
//! idempotency record is a hash with fields `st` (`i` in flight, `c` completed), `own` (the
//! owner token, in flight only), `fp` (the 16-byte fingerprint, empty when none) and `pl` (the
//! payload, completed only); its expiry is the in-flight lease, then the retention.

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

/// Fenced acquire. KEYS: lock, fence. ARGV: owner, lease ms, fence retention ms.
///
/// Returns `{1, token}` when the lock is now the owner's, `{0, holder, pttl}` when held.
///
/// The token is `max(last + 1, server time in µs)`. While the counter exists (it is kept for
/// `max(10 × lease, 1 h)` after each mint) tokens grow by at least one; once it has expired,
/// the server clock has moved on by at least that long, so the next token (the current time)
/// still exceeds every earlier one, unless the server clock went back by more than that.
/// Everything is checked before the first write (a script is not rolled back when it fails
/// half-way): a foreign counter or a non-string lock (`WRONGTYPE` from `SET .. GET`) fails
/// the call and changes nothing.
pub(crate) static FENCED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "fenced_acquire",
        r#"
local last = redis.call('GET', KEYS[2])
local floor = 0
if last then
  floor = tonumber(last)
  if floor == nil or floor < 0 or floor >= 9007199254740000 then
    return redis.error_reply('ERR coord: the fencing counter holds a foreign value')
  end
end
local holder = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if holder then
  if holder ~= ARGV[1] then
    return {0, holder, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
local now = redis.call('TIME')
local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
if floor >= token then
  token = floor + 1
end
redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[3])
return {1, token}
"#,
    )
});

/// Owner-scoped release. KEYS: lock. ARGV: owner, channel.
///
/// Deletes the lock and publishes on its channel when the owner holds it: returns 1, else 0.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "release",
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '')
  return 1
end
return 0
"#,
    )
});

/// Owner-scoped renewal. KEYS: lock. ARGV: owner, lease ms. Returns 1 when renewed, else 0.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "renew",
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#,
    )
});

/// Claim or read. KEYS: record. ARGV: owner, in-flight lease ms, fingerprint (may be empty).
///
/// Returns `{1}` when claimed, or `{0, st, fp, payload, pttl}` for the record found (absent
/// fields come back as nil and are reported by the client as a corrupt record).
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "claim",
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'st', 'i', 'own', ARGV[1], 'fp', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'pl')
return {0, r[1], r[2], r[3], redis.call('PTTL', KEYS[1])}
"#,
    )
});

/// Owner-scoped completion. KEYS: record. ARGV: owner, payload, retention ms, channel.
///
/// Turns the owner's in-flight marker into the completed record (keeping its fingerprint),
/// sets the retention and publishes. Returns 1, or 0 when the marker is not the owner's.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "complete",
        r#"
local r = redis.call('HMGET', KEYS[1], 'st', 'own')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'st', 'c', 'pl', ARGV[2])
redis.call('HDEL', KEYS[1], 'own')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', ARGV[4], 'c')
return 1
"#,
    )
});

/// Owner-scoped abandonment. KEYS: record. ARGV: owner, channel.
///
/// Deletes the owner's in-flight marker and publishes. Returns 1, or 0 when not the owner's.
pub(crate) static ABANDON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "abandon",
        r#"
local r = redis.call('HMGET', KEYS[1], 'st', 'own')
if r[1] ~= 'i' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], 'a')
return 1
"#,
    )
});
