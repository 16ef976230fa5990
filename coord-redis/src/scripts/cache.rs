//! The shared cache's one script: a write that keeps only what is left of its ttl.

use std::sync::LazyLock;

use super::Script;

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
