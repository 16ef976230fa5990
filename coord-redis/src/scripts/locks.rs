//! The plain lock's scripts: the fenced acquire, a waiter's look, release with hand-over and
//! renewal (owner-checked), and the operations API's reading and forced release.
//!
//! Layout (one call key, one hash tag): the lock key holds its owner token (32 lowercase hex
//! characters) with a `PX` lease. A task that waits for the lock appends `*` to the holder's
//! token ("someone is waiting"), keeping the lease, and stands in the lock's queue, a list, with
//! an entry `<process id>:<owner>:<lease ms>:<fenced 0/1>` (the process id: its provider's, 16
//! hex digits). A lock nobody waits for costs exactly a `SET` and a compare-and-delete. The
//! release of a marked lock hands it to the first entry in the same script (owner, lease and
//! fencing token set there) and tells that waiter: in memory when it is of the releasing
//! process, else in a message on `<lock>#<process id>` naming it, after which the waiter has a
//! claim window to confirm. A multi-key waiter stands in the queue as its bare process id and
//! is only woken. A fencing counter holds a decimal integer (digits only, below 2^53).
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

/// Reads and checks the fencing counter (KEYS[2]) before anything is written, defining
/// `floor` (0 when there is none), and `mint()`, which writes and returns the next token:
/// `max(floor + 1, server time in µs)`, kept for `retention` ms.
///
/// While the counter exists (it is kept for `max(10 × lease, 1 h)` after each mint) tokens
/// grow by at least one; once it has expired, the server clock has moved on by at least that
/// long, so the next token (the current time) still exceeds every earlier one, unless the
/// server clock went back by more than that. A counter that is not plain decimal digits below
/// 2^53 (`tonumber` would accept `nan`, `inf`, `1e400`, ` 5` or `0x10`) fails the call with
/// nothing changed.
///
/// With a Lua condition, the counter is read (and checked) only when it holds: a look that
/// will mint no token does not read it.
macro_rules! fence_floor {
    () => {
        fence_floor!("true")
    };
    ($when:literal) => {
        concat!(
            "\nlocal floor = 0\nif ",
            $when,
            r#" then
  local last = redis.call('GET', KEYS[2])
  if last then
    if #last > 16 or not string.find(last, '^[0-9]+$') then
      return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
    end
    floor = tonumber(last)
    if floor >= 9007199254740000 then
      return redis.error_reply('ERR coord: the fencing counter holds a value coord did not write')
    end
  end
end
local function mint(retention)
  local now = redis.call('TIME')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if floor >= token then
    token = floor + 1
  end
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', retention)
  floor = token
  return token
end
"#
        )
    };
}

/// Fenced acquire, for a caller that does not wait. KEYS: lock, fence. ARGV: owner, lease ms,
/// (unused), fence retention ms.
///
/// Takes the lock with `SET NX PX` and returns the token (a positive integer, see
/// `fence_floor!`); when someone else holds it, returns `{holder, pttl}`. Our own token (an
/// earlier send of this very call landed: a client retry) counts as taken, with the lease
/// renewed and a new token. Everything is checked before the first write (a script is not
/// rolled back when it fails half-way): a counter coord did not write, a lock value that is
/// not a string (`WRONGTYPE` on the `GET`) or not a lock value fails the call and changes
/// nothing.
pub(crate) static FENCED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "fenced_acquire",
        concat!(
            lock_value_check!(),
            fence_floor!(),
            r#"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.call('GET', KEYS[1])
  if holder ~= ARGV[1] and holder ~= ARGV[1] .. '*' then
    if not is_lock_value(holder) then
      return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
    end
    return {holder, redis.call('PTTL', KEYS[1])}
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return mint(ARGV[4])
"#
        ),
    )
});

/// A waiter's look: take the lock if it is free or already ours (handed over by a release),
/// else stand in its queue. KEYS: lock, fence, queue. ARGV: owner, lease ms, the waiter's queue
/// entry (`<process id>:<owner>:<lease ms>:<fenced 0/1>`), fenced (`1`/`0`), fence retention
/// ms, mode: `n` (a new waiter: append the entry), `q` (append it unless it is there), `w`
/// (the waiter gives up: take its entry out).
///
/// When the lock is free it is taken (marked as waited for if others queue), the entry taken
/// out; when it is the owner's already, handed over by a release (the claim, or a grant whose
/// message was lost), the hold is confirmed: the lease made whole. Either way it returns the
/// new fencing token (fenced) or 0. When someone else holds it, returns `{holder, pttl}`,
/// having marked the holder as waited for (modes `n`, `q`: so its release hands the lock over)
/// and appended or removed the entry as the mode says. The queue is kept for a minute past the
/// lease of the last waiter that stood in it.
pub(crate) static LOCK_LOOK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "lock_look",
        concat!(
            lock_value_check!(),
            fence_floor!("ARGV[4] == '1'"),
            r#"
local owner, marked, queue, entry = ARGV[1], ARGV[1] .. '*', KEYS[3], ARGV[3]
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= owner and holder ~= marked then
  if not is_lock_value(holder) then
    return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
  end
  if ARGV[6] == 'w' then
    redis.call('LREM', queue, 0, entry)
  else
    if #holder == 32 then
      redis.call('SET', KEYS[1], holder .. '*', 'KEEPTTL')
    end
    if ARGV[6] == 'n' or not redis.call('LPOS', queue, entry) then
      redis.call('RPUSH', queue, entry)
    end
    redis.call('PEXPIRE', queue, tonumber(ARGV[2]) + 60000)
  end
  return {holder, redis.call('PTTL', KEYS[1])}
end
if holder then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('LREM', queue, 0, entry)
  local value = owner
  if redis.call('EXISTS', queue) == 1 then
    value = marked
  end
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
end
if ARGV[4] == '1' then
  return mint(ARGV[5])
end
return 0
"#
        ),
    )
});

/// Owner-scoped release, handing the lock over. KEYS: lock, fence, the lock's queue,
/// forced-release marker. ARGV: owner, the releasing process's id, the claim window ms, and (a waiter
/// that gives up) its queue entry to take out.
///
/// When the owner holds the lock unmarked (nobody waits), deletes it: returns 1. When it is
/// marked as waited for, takes the first entry off the queue:
/// * a waiter's entry (`<process id>:<owner>:<lease ms>:<fenced>`): the lock becomes that
///   waiter's, marked if more wait, in this same step. A waiter of the releasing process gets
///   its whole lease and, fenced, a token minted here: returns `{1, owner, token or 0}`, for
///   the releasing process to tell it in memory. A waiter of another process gets the claim
///   window (at most its lease) and a message on `<lock>#<its process id>` naming it: it
///   confirms with `LOCK_LOOK`, which makes the lease whole and mints its token; one that does
///   not (it crashed) loses the lock when the window ends. Returns 1.
/// * a bare process id (a multi-key waiter): deletes the lock and wakes that process on
///   `<lock>#<id>`. Returns 1.
/// * none (the queue is gone): deletes the lock and wakes every process on the channel named
///   like the lock. Returns 1.
///
/// When it is not the owner's: takes the given entry out of the queue, and returns 2 when the
/// marker names the owner (an operator forced its hold free, see `FORCE_RELEASE`), else 0 (the
/// lock is free or another token's). Refuses a lock value or fencing counter coord did not
/// write (the counter is read, and checked, only when the lock is marked: before the first
/// write, since a script is not rolled back when it fails half-way); entries that are neither
/// shape are dropped. The marker is only read on the path where the lock is not the owner's,
/// so an ordinary release costs what it did.
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
  local queue = KEYS[3]
"#,
            fence_floor!(),
            r#"
  while true do
    local entry = redis.call('LPOP', queue)
    if not entry then
      redis.call('DEL', KEYS[1])
      redis.call('PUBLISH', KEYS[1], '')
      return 1
    end
    if #entry == 16 then
      redis.call('DEL', KEYS[1])
      redis.call('PUBLISH', KEYS[1] .. '#' .. entry, '')
      return 1
    end
    local pid, next, lease, fenced = string.match(entry, '^(%x+):(%x+):(%d+):([01])$')
    if pid and #pid == 16 and #next == 32 and #lease <= 15 and tonumber(lease) > 0 then
      local value = next
      if redis.call('LLEN', queue) > 0 then
        value = next .. '*'
      end
      if pid == ARGV[2] then
        redis.call('SET', KEYS[1], value, 'PX', lease)
        local token = 0
        if fenced == '1' then
          local keep = math.min(math.max(3600000, tonumber(lease) * 10), 70368744177664)
          token = mint(string.format('%.0f', keep))
        end
        return {1, next, token}
      end
      redis.call('SET', KEYS[1], value, 'PX', string.format('%.0f', math.min(tonumber(ARGV[3]), tonumber(lease))))
      redis.call('PUBLISH', KEYS[1] .. '#' .. pid, next)
      return 1
    end
  end
end
if ARGV[4] then
  redis.call('LREM', KEYS[3], 0, ARGV[4])
end
if holder and not is_lock_value(holder) then
  return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
end
if redis.call('GET', KEYS[4]) == ARGV[1] then
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
