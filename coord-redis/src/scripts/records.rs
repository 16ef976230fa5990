//! The idempotency record's scripts: claim, renewal of the in-flight marker, the waiter's
//! probe, completion, abandonment, the end of a marker's lease, the operator's purge and the
//! operations API's reading.
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

use std::sync::LazyLock;

use super::Script;

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

/// Owner-scoped end of a marker's lease, as if it lapsed now. KEYS: record. ARGV: owner.
///
/// The owner's live marker kept when abandoned (`lx`) gets `lx` = now and expires `kp` from
/// now: claims find it abandoned from here on. One not kept is deleted (its lapse would leave
/// nothing). Either publishes when someone waits (`w`). Returns 1 then, and also for the
/// owner's kept marker already past its lease (changed by nothing); 0 when there is no
/// record, or it is not the owner's marker.
pub(crate) static END_MARKER_LEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "end_marker_lease",
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
if not r.lx then
  redis.call('DEL', KEYS[1])
  if r.w then
    redis.call('PUBLISH', KEYS[1], 'a')
  end
  return 1
end
local now = now_ms()
if now >= r.lx then
  return 1
end
redis.call('HSET', KEYS[1], 'lx', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.max(r.kp, 1))
if r.w then
  redis.call('PUBLISH', KEYS[1], 'e')
end
return 1
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
