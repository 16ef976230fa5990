//! The fault proxy keeps a stream whole: a blackhole that dropped bytes closes the connection
//! at the heal instead of delivering what followed them; one that dropped nothing goes on.

use std::time::Duration;

use coord_history::nemesis::proxy::{Mode, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that echoes every byte back.
async fn echo() -> std::net::SocketAddr {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(conn: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
    conn.write_all(bytes).await.unwrap();
    let mut buf = vec![0u8; bytes.len()];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut buf))
        .await
        .expect("the echo comes back within 10 s")
        .expect("the connection is open");
    buf
}

#[tokio::test]
async fn a_blackhole_that_dropped_bytes_closes_the_connection_at_the_heal() {
    let proxy = Proxy::start(echo().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut conn, b"one").await, b"one");

    proxy.set(Mode::Blackhole);
    conn.write_all(b"lost").await.unwrap();
    // The heal comes only once the proxy has read (and dropped) those bytes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while proxy.dropped_bytes() < b"lost".len() as u64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy never dropped the bytes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.set(Mode::Pass);

    // Whatever is written now, the connection must end without echoing anything that
    // followed the lost bytes.
    let _ = conn.write_all(b"after").await;
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
        .await
        .expect("the proxy answers within 10 s");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "a stream that lost bytes delivered more: {read:?} {:?}",
        &buf[..read.as_ref().copied().unwrap_or(0)]
    );

    // A new connection works.
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut fresh, b"two").await, b"two");
}

#[tokio::test]
async fn a_blackhole_that_dropped_nothing_leaves_the_connection_open() {
    let proxy = Proxy::start(echo().await).await.unwrap();
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut conn, b"one").await, b"one");
    proxy.set(Mode::Blackhole);
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set(Mode::Pass);
    assert_eq!(proxy.dropped_bytes(), 0);
    assert_eq!(round_trip(&mut conn, b"two").await, b"two");
}
