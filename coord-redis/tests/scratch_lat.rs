mod support;
use std::time::{Duration, Instant};
use coord_core::{LockProvider, OwnerToken};
use coord_redis::testing::{RedisServer, command_at};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lat() {
    let server = RedisServer::start();
    // blocking baseline
    let mut v = vec![];
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    s.set_nodelay(true).unwrap();
    use std::io::{Read, Write};
    for _ in 0..2000 { let t = Instant::now(); s.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap(); let mut b=[0u8;7]; s.read_exact(&mut b).unwrap(); v.push(t.elapsed()); }
    v.sort(); eprintln!("raw ping p50 {:?}", v[1000]);
    let _ = command_at;
    for client in clients() {
        let p = provider(&server, client).await;
        let k = key("lat");
        let a = OwnerToken::new();
        p.acquire(lock(&k, a, LONG, Duration::ZERO)).await.unwrap().unwrap();
        let mut v = vec![];
        for _ in 0..2000 { let t = Instant::now(); p.acquire(lock(&k, OwnerToken::new(), LONG, Duration::ZERO)).await.unwrap(); v.push(t.elapsed()); }
        v.sort(); eprintln!("{client:?} refused SET p50 {:?}", v[1000]);
        let mut v = vec![];
        for _ in 0..2000 { let t = Instant::now(); p.release(&k, OwnerToken::new()).await.unwrap(); v.push(t.elapsed()); }
        v.sort(); eprintln!("{client:?} release(notheld) p50 {:?}", v[1000]);
    }
}
