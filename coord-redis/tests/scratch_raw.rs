use std::time::{Duration, Instant};
use coord_redis::testing::RedisServer;

async fn bench<F: std::future::Future<Output = ()>>(name: &str, mut f: impl FnMut() -> F) {
    let mut v = vec![];
    for _ in 0..3000 { let t = Instant::now(); f().await; v.push(t.elapsed()); }
    v.sort(); eprintln!("{name} p50 {:?}", v[1500]);
}

#[tokio::test(flavor = "current_thread")]
async fn raw() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let c = client.get_multiplexed_async_connection().await.unwrap();
    let mut cc = c.clone();
    let mut v = vec![];
    for _ in 0..3000 { let t = Instant::now(); let _: String = redis::cmd("PING").query_async(&mut cc).await.unwrap(); v.push(t.elapsed()); }
    v.sort(); eprintln!("mux ping no clone p50 {:?}", v[1500]);
    bench("mux ping", || { let mut c = c.clone(); async move { let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap(); } }).await;
    bench("mux set", || { let mut c = c.clone(); async move { let _: redis::Value = redis::cmd("SET").arg("k").arg("v").arg("NX").arg("PX").arg(30000).arg("GET").query_async(&mut c).await.unwrap(); } }).await;
    bench("mux set+timeout", || { let mut c = c.clone(); async move { let _: redis::Value = tokio::time::timeout(Duration::from_secs(1), redis::cmd("SET").arg("k").arg("v").arg("NX").arg("PX").arg(30000).arg("GET").query_async(&mut c)).await.unwrap().unwrap(); } }).await;
    let cfg = redis::aio::ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_secs(1))).set_connection_timeout(Some(Duration::from_secs(1)));
    let m = redis::aio::ConnectionManager::new_with_config(client.clone(), cfg).await.unwrap();
    bench("cm ping", || { let mut c = m.clone(); async move { let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap(); } }).await;
    let m2 = redis::aio::ConnectionManager::new(client.clone()).await.unwrap();
    bench("cm default ping", || { let mut c = m2.clone(); async move { let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap(); } }).await;
    let c3 = client.get_multiplexed_async_connection_with_config(&redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(1)))).await.unwrap();
    bench("mux+resp timeout ping", || { let mut c = c3.clone(); async move { let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap(); } }).await;
}
