//! Checking fencing tokens at a Redis resource: write only when the token is not older than
//! the newest one that wrote before.
//!
//! The guarded value lives in a hash at the resource key, next to the newest token that
//! wrote it (`value` and `fence` fields). [`write_fenced`] runs one script that compares and
//! writes atomically, so a holder that stalled past its lease and wakes up after a newer
//! holder has written gets [`FencedWrite::Rejected`] instead of overwriting the newer value.
//!
//! ```no_run
//! # async fn demo(token: coord_core::FencingToken) -> redis::RedisResult<()> {
//! let client = redis::Client::open("redis://127.0.0.1/")?;
//! let mut conn = client.get_multiplexed_async_connection().await?;
//! match coord_redis::fence::write_fenced(&mut conn, "projection:{tenant-7}", b"v2", token).await? {
//!     coord_redis::fence::FencedWrite::Accepted => {}
//!     coord_redis::fence::FencedWrite::Rejected { newest } => {
//!         // A newer holder wrote with `newest`: this holder lost its lock; stop.
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Tokens are compared as Lua numbers, exact below 2^53; coord's tokens (server microseconds
//! plus a counter) stay far below that for centuries.

use coord_core::FencingToken;

/// What [`write_fenced`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedWrite {
    /// The token was not older than the stored one: the value and the token were written.
    Accepted,
    /// A newer token has written since: nothing was written.
    Rejected {
        /// The newest token stored at the resource.
        newest: FencingToken,
    },
}

/// Compares as numbers only what is plain decimal digits below 2^53: Lua's `tonumber` also
/// reads `nan` (which compares false both ways, so it would let every write through), `inf`
/// (which would refuse every write), `0x10`, `1e3` and ` 5`. A stored fence that is not such
/// a number refuses the write with an error instead of guessing.
const WRITE_FENCED: &str = r"
local function is_fence(v)
  return #v >= 1 and #v <= 16 and string.find(v, '^[0-9]+$') ~= nil
    and tonumber(v) < 9007199254740992
end
local last = redis.call('HGET', KEYS[1], 'fence')
if last then
  if not is_fence(last) then
    return redis.error_reply('ERR coord: the stored fence is not a fencing token')
  end
  if tonumber(last) > tonumber(ARGV[2]) then
    return {0, last}
  end
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2])
return {1, ARGV[2]}
";

/// Writes `value` at `key` (field `value` of a hash) if `token` is not older than the token
/// stored there (field `fence`), and stores `token` with it; one atomic script.
///
/// # Errors
/// The Redis error, when the call fails; also when `key` is not a hash (`WRONGTYPE`) or its
/// `fence` field is not a fencing token coord could have minted (decimal digits below 2^53):
/// such a resource is refused, never overwritten, until an operator repairs it.
pub async fn write_fenced<C>(
    conn: &mut C,
    key: &str,
    value: &[u8],
    token: FencingToken,
) -> redis::RedisResult<FencedWrite>
where
    C: redis::aio::ConnectionLike + Send,
{
    let (written, newest): (i64, String) = redis::Script::new(WRITE_FENCED)
        .key(key)
        .arg(value)
        .arg(token.get())
        .invoke_async(conn)
        .await?;
    if written == 1 {
        return Ok(FencedWrite::Accepted);
    }
    let newest = newest.parse::<u64>().map_err(|_| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the stored fence is not a number",
            newest,
        ))
    })?;
    Ok(FencedWrite::Rejected {
        newest: FencingToken::new(newest),
    })
}
