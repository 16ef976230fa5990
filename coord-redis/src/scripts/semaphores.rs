//! The semaphore's scripts: acquire, release, renewal of a permit, and the operations API's
//! reading. The layout is documented with their shared helpers (`semaphore_helpers!`).

use std::sync::LazyLock;

use super::Script;

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
