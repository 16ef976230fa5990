//! The plain lock's scripts: the fenced acquire, the acquire while waiting, release and
//! renewal (owner-checked), and the operations API's reading and forced release.
//!
//! Layout (one call key, one hash tag): the lock key holds its owner token (32 lowercase hex
//! characters) with a `PX` lease. A task that waits for the lock appends `*` to the holder's
//! token ("someone is waiting"), keeping the lease; only then does the release publish, so a
//! lock nobody waits for costs exactly a `SET` and a compare-and-delete. A waiting process
//! also puts its provider's id (16 hex digits) in the lock's queue, a list; the release of a
//! marked lock pops the first id and publishes on `<lock>#<id>` only, so one release wakes one
//! process. A fencing counter holds a decimal integer (digits only, below 2^53).
//!
//! After an operator forced a hold free (`FORCE_RELEASE`), the forced-release marker holds the
//! former holder's token for a while, so its release or renewal can tell why it lost the lock.

use std::sync::LazyLock;

use super::Script;

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
