//! Multi-key locks in one script: the atomic path of
//! [`MultiLockStore`](coord_core::provider::MultiLockStore).
//!
//! One `EVALSHA` checks every key of the set and, only when all are free (or already the
//! caller's), takes them all and mints each key's token from that key's own fencing counter
//! (the one a single fenced lock of the key uses, with the same rule: `max(last + 1, server
//! time in µs)`). Redis runs a script alone, so no other client sees the set half taken. A
//! script may only touch keys of one hash slot on Redis Cluster: the set goes this way when the
//! provider talks to one server (standalone, Sentinel) or when every key's hash tag lands in
//! the same slot; otherwise the runtime takes the keys one by one in canonical order.
//!
//! Waiting reuses the single lock's wake-ups: a set blocked by a key marks that key's holder
//! as waited for and queues this process on it, exactly as a single waiter does, so that
//! key's release wakes this process; the waiter then runs the whole script again. A waiter
//! blocked by a different key on a later look moves its watch to that key.

use coord_core::provider::{BoxFuture, MultiLockGrant, MultiLockRequest, MultiLockStore};
use coord_core::{BackendError, CallKey, FencingToken};
use std::sync::LazyLock;
use tokio::time::Instant;

use super::commands::{is_token, millis};
use super::locks::backstop_after;
use super::{FENCE_RETENTION_FLOOR, Inner, MAX_MILLIS, RedisProvider};
use crate::encode::{Decimal, TokenText};
use crate::keys::Names;
use crate::scripts::Script;
use crate::transport::Reply;
use crate::waiters::{Cue, Look, Wake};

/// KEYS: the first lock of the set (it routes the script). ARGV: owner, lease ms, watch (`1`:
/// a waiter, mark a blocking holder and queue this process on it; `0`: nothing), fence
/// retention ms, this process's id, then the names of the whole set: for each lock, in
/// canonical order, the lock, its fencing counter and its queue, joined by newlines (call keys
/// and namespaces never hold control bytes). The names go in one argument because coord's
/// commands have a fixed, small shape; the script only touches keys of the declared key's
/// slot, since the provider sends a set this way only when one server holds every key or all
/// share one Cluster hash slot.
///
/// Returns `{1, token, token, ...}` when the set is now the owner's, `{0, i, holder, pttl}`
/// when the `i`-th lock (from 1) is held by another owner. Everything is checked before the
/// first write (lock values and counters coord did not write fail the call, `ERR coord:`), so
/// a refused or failed call changes nothing but the waiter's mark and queue entry.
pub(crate) static MULTI_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "multi_acquire",
        r#"
local function is_lock_value(v)
  local n = #v
  if n == 33 and string.byte(v, 33) == 42 then
    v = string.sub(v, 1, 32)
    n = 32
  end
  return n == 32 and string.find(v, '^[0-9a-f]+$') ~= nil
end
local owner, marked = ARGV[1], ARGV[1] .. '*'
local names = {}
for name in string.gmatch(ARGV[6], '[^\n]+') do
  names[#names + 1] = name
end
local n = #names / 3
if #names < 3 or #names % 3 ~= 0 or names[1] ~= KEYS[1] then
  return redis.error_reply('ERR coord: a multi-key lock needs three names per key, the first declared')
end
local floors = {}
for i = 1, n do
  local lock = names[3 * i - 2]
  local holder = redis.call('GET', lock)
  if holder and holder ~= owner and holder ~= marked then
    if not is_lock_value(holder) then
      return redis.error_reply('ERR coord: the lock key holds a value coord did not write')
    end
    if ARGV[3] == '1' then
      local queue = names[3 * i]
      if #holder == 32 then
        redis.call('SET', lock, holder .. '*', 'KEEPTTL')
      end
      redis.call('LREM', queue, 0, ARGV[5])
      redis.call('RPUSH', queue, ARGV[5])
      redis.call('PEXPIRE', queue, tonumber(ARGV[2]) + 60000)
    end
    return {0, i, holder, redis.call('PTTL', lock)}
  end
  local last = redis.call('GET', names[3 * i - 1])
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
  floors[i] = floor
end
local now = redis.call('TIME')
local base = tonumber(now[1]) * 1000000 + tonumber(now[2])
local out = {1}
for i = 1, n do
  local lock, queue = names[3 * i - 2], names[3 * i]
  local value = owner
  -- Other processes wait for this key: take it marked, so its release wakes the next.
  if redis.call('EXISTS', queue) == 1 then
    value = marked
    redis.call('LREM', queue, 0, ARGV[5])
  end
  redis.call('SET', lock, value, 'PX', ARGV[2])
  local token = base
  if floors[i] >= token then
    token = floors[i] + 1
  end
  redis.call('SET', names[3 * i - 1], string.format('%.0f', token), 'PX', ARGV[4])
  out[i + 1] = token
end
return out
"#,
    )
});

/// What one run of the script found.
enum SetAttempt {
    /// The set is ours: one token per key.
    Won(Vec<FencingToken>),
    /// The key at this index (from 0) is held by someone else, with its `PTTL`.
    Held { at: usize, pttl: i64 },
}

/// The names one acquisition sends, worked out once.
struct SetTry<'a> {
    /// Three names per key (lock, fencing counter, queue), one a line.
    names: String,
    /// The lock names alone (the channels a waiter listens on).
    locks: Vec<String>,
    token: TokenText,
    lease: Decimal,
    fence_ms: Decimal,
    first: &'a CallKey,
}

impl Inner {
    async fn try_set(&self, set: &SetTry<'_>, watching: bool) -> Result<SetAttempt, BackendError> {
        let watch: &[u8] = if watching { b"1" } else { b"0" };
        let args = [
            set.token.as_ref(),
            set.lease.as_ref(),
            watch,
            set.fence_ms.as_ref(),
            self.hub.id().as_bytes(),
            set.names.as_bytes(),
        ];
        let (reply, acks) = self
            .eval_granting(&MULTI_ACQUIRE, &[set.locks[0].as_str()], &args, set.first)
            .await?;
        let unexpected = || self.protocol("multi_acquire", set.first, "unexpected script reply");
        let Reply::Array(items) = reply else {
            return Err(unexpected());
        };
        match items.as_slice() {
            [Reply::Int(1), tokens @ ..] if tokens.len() == set.locks.len() => {
                let tokens = tokens
                    .iter()
                    .map(|token| match token {
                        Reply::Int(token) if *token > 0 => Ok(FencingToken::new(*token as u64)),
                        _ => Err(unexpected()),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                // The set counts only once enough replicas have it; the runtime releases a
                // grant that fails here, key by key.
                self.replicated(acks, "multi_acquire", set.first)?;
                Ok(SetAttempt::Won(tokens))
            }
            [
                Reply::Int(0),
                Reply::Int(at),
                Reply::Data(holder),
                Reply::Int(pttl),
            ] if *at >= 1 && (*at as usize) <= set.locks.len() && is_token(holder) => {
                Ok(SetAttempt::Held {
                    at: *at as usize - 1,
                    pttl: *pttl,
                })
            }
            _ => Err(unexpected()),
        }
    }

    async fn acquire_all(
        &self,
        req: MultiLockRequest<'_>,
    ) -> Result<Option<MultiLockGrant>, BackendError> {
        let Some(first) = req.keys.first() else {
            return Ok(Some(MultiLockGrant {
                fencing_tokens: Vec::new(),
                contended: false,
                lease_began: None,
            }));
        };
        let lease_ms = millis(req.lease);
        let fence_ms = millis(FENCE_RETENTION_FLOOR).max(lease_ms.saturating_mul(10));
        let mut names = String::new();
        let mut locks = Vec::with_capacity(req.keys.len());
        for key in req.keys {
            let of = Names::of(key);
            for name in [of.lock(), of.fence(), of.lock_queue()] {
                if !names.is_empty() {
                    names.push('\n');
                }
                names.push_str(&name);
            }
            locks.push(of.lock());
        }
        let set = SetTry {
            names,
            locks,
            token: TokenText::new(req.owner),
            lease: Decimal::new(lease_ms),
            fence_ms: Decimal::new(fence_ms.min(MAX_MILLIS)),
            first,
        };
        let mut blocked = match self.try_set(&set, false).await? {
            SetAttempt::Won(tokens) => return Ok(Some(grant(tokens, false))),
            SetAttempt::Held { .. } if req.wait.is_zero() => return Ok(None),
            SetAttempt::Held { at, .. } => at,
        };
        // `None`: a wait too long to represent; it lasts until the set is ours or the future
        // is dropped.
        let deadline = Instant::now().checked_add(req.wait);
        loop {
            // Watch the key that blocked the set: its release wakes this process. A look that
            // finds another key blocking ends this watch and starts one on that key.
            let set = &set;
            let look = move |cue: Cue| async move {
                if cue == Cue::Promoted {
                    return Ok(Look::Pending(Some(backstop_after(None))));
                }
                Ok(match self.try_set(set, true).await? {
                    SetAttempt::Won(tokens) => Look::Done(Watch::Won(tokens)),
                    SetAttempt::Held { at, .. } if at != blocked => Look::Done(Watch::Moved(at)),
                    SetAttempt::Held { pttl, .. } => {
                        Look::Pending(Some(backstop_after(Some(pttl))))
                    }
                })
            };
            let watched = self
                .hub
                .wait(
                    &self.transport,
                    set.locks[blocked].clone(),
                    Wake::Head,
                    deadline,
                    Watch::TimedOut,
                    look,
                )
                .await?;
            match watched {
                Watch::Won(tokens) => return Ok(Some(grant(tokens, true))),
                Watch::Moved(at) => blocked = at,
                Watch::TimedOut => return Ok(None),
            }
        }
    }
}

/// How one watch of a blocking key ended.
enum Watch {
    Won(Vec<FencingToken>),
    /// Another key blocks the set now.
    Moved(usize),
    TimedOut,
}

fn grant(fencing_tokens: Vec<FencingToken>, contended: bool) -> MultiLockGrant {
    MultiLockGrant {
        fencing_tokens,
        contended,
        lease_began: None,
    }
}

/// The Redis Cluster hash slot of a call key's names: CRC16 (XMODEM) of the hash tag (the
/// call key's shown form, between the braces) modulo 16384.
fn slot(key: &CallKey) -> u16 {
    let mut crc: u16 = 0;
    for &byte in key.op_key().as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl MultiLockStore for RedisProvider {
    fn supports_multi_locks(&self) -> bool {
        true
    }

    /// Any set on one server (standalone, Sentinel); on Redis Cluster or a client the
    /// application built, only a set whose keys share one hash slot.
    fn takes_together(&self, keys: &[CallKey]) -> bool {
        if self.inner.one_server {
            return true;
        }
        let mut slots = keys.iter().map(slot);
        let first = slots.next();
        slots.all(|other| Some(other) == first)
    }

    fn acquire_all<'a>(
        &'a self,
        req: MultiLockRequest<'a>,
    ) -> BoxFuture<'a, Result<Option<MultiLockGrant>, BackendError>> {
        Box::pin(self.inner.acquire_all(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_hash_of_the_tag() {
        // Reference values of `CLUSTER KEYSLOT` for these tags.
        let key = |op_key: &str| CallKey::from_op_key("svc", op_key).unwrap();
        assert_eq!(slot(&key("foo")), 12182);
        assert_eq!(slot(&key("bar")), 5061);
        assert_eq!(slot(&key("123456789")), 12739);
    }
}
