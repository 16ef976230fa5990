//! The hand-written redis-rs client the baselines are built on: what a careful client does
//! without coord.

use std::time::Instant;

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

use super::COMMAND_TIMEOUT;

/// Release: delete the lock only while it still holds our token.
pub const COMPARE_AND_DELETE: &str = "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// The hand-written redis-rs client: one multiplexed connection, scripts loaded up front.
#[derive(Clone)]
pub struct RawRs {
    /// The one connection; clones share it.
    pub conn: MultiplexedConnection,
    /// The SHA of [`COMPARE_AND_DELETE`].
    pub release_sha: String,
}

impl RawRs {
    /// Opens the connection with [`COMMAND_TIMEOUT`] as connection and response timeout and
    /// loads the release script.
    pub async fn connect(url: &str) -> RawRs {
        let client = redis::Client::open(url).expect("redis url");
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .expect("raw redis-rs connection");
        let release_sha = script_load(&mut conn, COMPARE_AND_DELETE).await;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .expect("PING");
        RawRs { conn, release_sha }
    }

    /// One `SET NX PX`: true when `lock` is now ours, false when someone else holds it.
    pub async fn try_acquire(
        &self,
        conn: &mut MultiplexedConnection,
        lock: &str,
        token: &str,
        lease_ms: u64,
    ) -> bool {
        let set: Option<String> = redis::cmd("SET")
            .arg(lock)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms)
            .query_async(conn)
            .await
            .expect("raw SET NX PX");
        set.is_some()
    }

    /// `EVALSHA` of the compare-and-delete: true when `lock` held `token` and is now gone.
    pub async fn release(&self, conn: &mut MultiplexedConnection, lock: &str, token: &str) -> bool {
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(lock)
            .arg(token)
            .query_async(conn)
            .await
            .expect("raw release");
        deleted == 1
    }

    /// `count` sequential `PING`s; their round trips in milliseconds, sorted.
    pub async fn ping_round_trips(&self, count: usize) -> Vec<f64> {
        let mut conn = self.conn.clone();
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .expect("PING");
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        samples.sort_by(f64::total_cmp);
        samples
    }
}

/// `SCRIPT LOAD` of `src`; returns the script's SHA.
pub async fn script_load(conn: &mut MultiplexedConnection, src: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(src)
        .query_async::<String>(conn)
        .await
        .expect("SCRIPT LOAD")
}
