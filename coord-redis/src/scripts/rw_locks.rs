//! The read-write lock scripts: one per operation (acquire, release, renew), each atomic on
//! the server, owner- and mode-checked, timed by the server's clock (`TIME`).
//!
//! Layout (one read-write lock, one hash tag, so one Cluster slot):
//! * the hash `ns:rw:{..}`: `w` the writer's owner token, `wt` its fencing token and `wx` the
//!   end of its lease (server ms); `c` the waiting writer's claim (its owner) and `cx` when
//!   the claim ends; `r<owner>` each reader's fencing token; `f` the last token minted for the
//!   key by either mode (the one fencing counter); `q` = `1` while someone waits (only then
//!   does a release publish, on the channel named like the hash). It is kept for
//!   `max(10 × lease, 1 h)` after each mint, as the lock's counter is, and at least as long as
//!   the holds and claim it records;
//! * the sorted set `ns:rw-r:{..}`: each reader's owner token scored by the end of its lease
//!   (server ms); it expires at the latest lease end it holds.
//!
//! Every script first forgets the holds and the claim that ended by the server's clock, so an
//! ended hold never counts and a late release or renewal of one changes nothing; when the
//! readers' set is gone (expired with its last lease), it also drops every reader's token left
//! in the hash, so readers whose leases all lapsed unseen leave nothing behind.

use std::sync::LazyLock;

use super::Script;

/// Lua helpers: the server's clock in ms, the check of a number coord wrote, dropping ended
/// holds and claims, minting a token, keeping a key alive long enough.
macro_rules! rw_helpers {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function num(v)
  if not v then
    return nil
  end
  if #v > 16 or not string.find(v, '^[0-9]+$') then
    error({err = 'ERR coord: the read-write lock holds a value coord did not write'})
  end
  return tonumber(v)
end
local function ms(v)
  return string.format('%.0f', v)
end
local function drop_expired()
  local wx = num(redis.call('HGET', KEYS[1], 'wx'))
  local cx = num(redis.call('HGET', KEYS[1], 'cx'))
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, owner in ipairs(gone) do
    redis.call('ZREM', KEYS[2], owner)
    redis.call('HDEL', KEYS[1], 'r' .. owner)
  end
  -- The readers' set expires as a whole once its last lease ends, and no script then sees
  -- those readers lapse one by one: their tokens (the only fields starting with `r`) go here.
  if redis.call('EXISTS', KEYS[2]) == 0 then
    for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
      if string.byte(field, 1) == 114 then
        redis.call('HDEL', KEYS[1], field)
      end
    end
  end
  if wx and wx <= now then
    redis.call('HDEL', KEYS[1], 'w', 'wt', 'wx')
  end
  if cx and cx <= now then
    redis.call('HDEL', KEYS[1], 'c', 'cx')
  end
end
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
"#
    };
}

/// Takes a read or write hold. KEYS: the hash, the readers' sorted set. ARGV: owner, mode
/// (`r` or `w`), lease ms, claim ms, `1` if the caller waits when refused (a writer then
/// leaves or re-asserts its claim, and the waiter is noted so releases publish) else `0`.
///
/// A reader gets in while no writer holds the key and no claim is live; a writer while no
/// hold is live and no other writer's claim is. The owner's own live hold of the same mode (a
/// resent acquire) answers its token with the lease renewed. A grant answers the token (a
/// positive integer), minted as the fenced lock's is (`max(last + 1, server time in µs)`) from
/// the key's one counter; a writer's grant removes its claim. A refusal answers `{0, ms}`:
/// how long until the first hold or claim in the way ends (for the claim's own writer, at most
/// half its claim, so it re-asserts the claim in time).
pub(crate) static RW_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "rw_lock_acquire",
        concat!(
            rw_helpers!(),
            r#"
local owner = ARGV[1]
local lease = tonumber(ARGV[3])
local claim = tonumber(ARGV[4])
local last = num(redis.call('HGET', KEYS[1], 'f')) or 0
if last >= 9007199254740000 then
  return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
end
drop_expired()
local function mint()
  local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if last >= token then
    token = last + 1
  end
  redis.call('HSET', KEYS[1], 'f', string.format('%.0f', token))
  keep(KEYS[1], math.min(math.max(lease * 10, 3600000), 70368744177664))
  return token
end
local writer = redis.call('HGET', KEYS[1], 'w')
local claimant = redis.call('HGET', KEYS[1], 'c')
if ARGV[2] == 'r' then
  if redis.call('ZSCORE', KEYS[2], owner) then
    local tok = num(redis.call('HGET', KEYS[1], 'r' .. owner))
    if not tok then
      return redis.error_reply('ERR coord: the read-write lock holds a value coord did not write')
    end
    redis.call('ZADD', KEYS[2], now + lease, owner)
    keep(KEYS[2], lease)
    keep(KEYS[1], lease)
    return tok
  end
  if not writer and not claimant then
    local tok = mint()
    redis.call('ZADD', KEYS[2], now + lease, owner)
    redis.call('HSET', KEYS[1], 'r' .. owner, string.format('%.0f', tok))
    keep(KEYS[2], lease)
    return tok
  end
else
  if writer == owner then
    local tok = num(redis.call('HGET', KEYS[1], 'wt'))
    if not tok then
      return redis.error_reply('ERR coord: the read-write lock holds a value coord did not write')
    end
    redis.call('HSET', KEYS[1], 'wx', ms(now + lease))
    keep(KEYS[1], lease)
    return tok
  end
  if not writer and redis.call('ZCARD', KEYS[2]) == 0 and (not claimant or claimant == owner) then
    local tok = mint()
    redis.call('HSET', KEYS[1], 'w', owner, 'wt', string.format('%.0f', tok), 'wx', ms(now + lease))
    redis.call('HDEL', KEYS[1], 'c', 'cx')
    keep(KEYS[1], lease)
    return tok
  end
  if ARGV[5] == '1' and (not claimant or claimant == owner) then
    redis.call('HSET', KEYS[1], 'c', owner, 'cx', ms(now + claim))
    keep(KEYS[1], claim)
    claimant = owner
  end
end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'q', '1')
end
local next = nil
local function sooner(at)
  if at and (not next or at < next) then
    next = at
  end
end
sooner(num(redis.call('HGET', KEYS[1], 'wx')))
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first[2] then
  sooner(tonumber(first[2]))
end
if claimant == owner then
  sooner(now + math.floor(claim / 2))
else
  sooner(num(redis.call('HGET', KEYS[1], 'cx')))
end
local left = 0
if next then
  left = next - now
end
return {0, left}
"#
        ),
    )
});

/// Owner- and mode-scoped release. KEYS: the hash, the readers' sorted set. ARGV: owner,
/// mode (`r` or `w`).
///
/// A read release removes only the owner's read hold, a write release only the owner's write
/// hold (and its claim, if it left one while waiting): a read release can never free a write
/// hold. Returns 1 when the owner's live hold was removed, 0 otherwise (an ended hold is
/// removed without freeing anything: it no longer counted). When a hold was freed or a claim
/// withdrawn and someone waits, publishes on the channel named like the hash and clears the
/// note.
pub(crate) static RW_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "rw_lock_release",
        concat!(
            rw_helpers!(),
            r#"
local owner = ARGV[1]
local freed = 0
local wake = false
if ARGV[2] == 'r' then
  local mine = redis.call('ZSCORE', KEYS[2], owner)
  if mine then
    redis.call('ZREM', KEYS[2], owner)
    redis.call('HDEL', KEYS[1], 'r' .. owner)
    if tonumber(mine) > now then
      freed = 1
    end
  end
else
  if redis.call('HGET', KEYS[1], 'w') == owner then
    local wx = num(redis.call('HGET', KEYS[1], 'wx')) or 0
    redis.call('HDEL', KEYS[1], 'w', 'wt', 'wx')
    if wx > now then
      freed = 1
    end
  end
  if redis.call('HGET', KEYS[1], 'c') == owner then
    redis.call('HDEL', KEYS[1], 'c', 'cx')
    wake = true
  end
end
drop_expired()
if (freed == 1 or wake) and redis.call('HGET', KEYS[1], 'q') then
  redis.call('HDEL', KEYS[1], 'q')
  redis.call('PUBLISH', KEYS[1], '')
end
return freed
"#
        ),
    )
});

/// Owner- and mode-scoped renewal. KEYS: the hash, the readers' sorted set. ARGV: owner, mode
/// (`r` or `w`), lease ms.
///
/// Returns 1 when the owner's live hold of that mode now ends `lease` from now; 2 when a
/// write renewal finds another writer holding the key (the owner's lease ended and it was
/// taken); 0 when the owner holds no live hold of that mode (renewal never revives a hold that
/// stopped counting).
pub(crate) static RW_RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "rw_lock_renew",
        concat!(
            rw_helpers!(),
            r#"
local owner = ARGV[1]
local lease = tonumber(ARGV[3])
drop_expired()
if ARGV[2] == 'r' then
  if not redis.call('ZSCORE', KEYS[2], owner) then
    return 0
  end
  redis.call('ZADD', KEYS[2], 'XX', now + lease, owner)
  keep(KEYS[2], lease)
  keep(KEYS[1], lease)
  return 1
end
local writer = redis.call('HGET', KEYS[1], 'w')
if not writer then
  return 0
end
if writer ~= owner then
  return 2
end
redis.call('HSET', KEYS[1], 'wx', ms(now + lease))
keep(KEYS[1], lease)
return 1
"#
        ),
    )
});

/// What the operations API shows of a read-write lock. KEYS: the hash, the readers' sorted set.
/// Reads only: what ended is left out of the answer, not removed.
///
/// Returns `{writer or nil, its ms left, its token, claimant or nil, claim ms left, waiter
/// flag (1 or 0), reader, ms left, token, reader, ms left, token, ...}` (ms left and tokens 0
/// where there is nothing): the live writer, the live claim of a waiting writer, and every
/// reader whose lease has not ended by the server's clock, soonest-ending first. Refuses
/// numbers coord did not write and a live reader without its token.
pub(crate) static INSPECT_RW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "inspect_rw_lock",
        concat!(
            rw_helpers!(),
            r#"
local out = {false, 0, 0, false, 0, 0}
local wx = num(redis.call('HGET', KEYS[1], 'wx'))
local writer = redis.call('HGET', KEYS[1], 'w')
if writer and wx and wx > now then
  local wt = num(redis.call('HGET', KEYS[1], 'wt'))
  if not wt then
    return redis.error_reply('ERR coord: the read-write lock holds a value coord did not write')
  end
  out[1], out[2], out[3] = writer, wx - now, wt
end
local cx = num(redis.call('HGET', KEYS[1], 'cx'))
local claimant = redis.call('HGET', KEYS[1], 'c')
if claimant and cx and cx > now then
  out[4], out[5] = claimant, cx - now
end
if redis.call('HGET', KEYS[1], 'q') then
  out[6] = 1
end
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local tok = num(redis.call('HGET', KEYS[1], 'r' .. live[i]))
  if not tok then
    return redis.error_reply('ERR coord: the read-write lock holds a value coord did not write')
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
