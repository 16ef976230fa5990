//! The cluster single-flight's scripts: a claim is the leader's owner token with a `PX`
//! lease; the leader's outcome is handed over under a key of its own generation.

use std::sync::LazyLock;

use super::Script;

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
