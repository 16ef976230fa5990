//! A TCP proxy on 127.0.0.1 whose behaviour the test switches while clients use it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with the bytes and connections passing through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards everything.
    Pass,
    /// Forwards every chunk after this delay (each connection's chunks stay in order).
    Delay(Duration),
    /// Drops every byte both ways, silently; connections stay open. A partition, as the
    /// clients see it. A connection that lost bytes this way is closed when the mode changes:
    /// TCP never delivers what follows a lost segment without it (it retransmits until it
    /// gives up), so a stream that skipped bytes and went on would be a fault no network
    /// makes, one that misaligns replies with requests. A connection that lost nothing goes
    /// on.
    Blackhole,
    /// Keeps every byte back, and delivers it when the mode changes.
    Hold,
    /// Closes the server's side of every connection and leaves the client's side open and
    /// silent: the client writes into a connection nobody reads. New connections are accepted
    /// and left the same way. Healing does not revive such a connection.
    HalfOpen,
    /// Closes every connection and every new one at once (the client sees a reset or EOF).
    Reset,
}

/// The proxy: listens on a free loopback port and forwards to `upstream`. Stops (closing
/// everything) when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream` in [`Mode::Pass`], on the current tokio runtime.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = dropped.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let rx = rx.clone();
                tokio::spawn(connection(client, upstream, rx, counter.clone()));
            }
        });
        Ok(Proxy {
            addr,
            mode,
            dropped,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://<addr>`, for Redis clients.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches the mode for every connection, open or new.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// How many bytes a [`Mode::Blackhole`] has dropped since the proxy started, both ways,
    /// counted as each chunk is dropped: a test waits on this rather than on time to know that
    /// what it sent was lost, and a run counts whether its partitions dropped anything.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.mode.send_replace(Mode::Reset);
        self.task.abort();
    }
}

/// One proxied connection: the two sockets, the mode it follows, and what a blackhole did to it.
struct Link {
    client: TcpStream,
    /// `None` once half-open dropped the server side (or it was never connected).
    server: Option<TcpStream>,
    mode: watch::Receiver<Mode>,
    /// Whether a blackhole dropped bytes of this connection (see `Mode::Blackhole`).
    lost: bool,
    /// The proxy's count of dropped bytes, shared by all its connections.
    dropped: Arc<AtomicU64>,
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    dropped: Arc<AtomicU64>,
) {
    let _ = client.set_nodelay(true);
    let now = *mode.borrow_and_update();
    if now == Mode::Reset {
        return;
    }
    let server = if now == Mode::HalfOpen {
        None
    } else {
        match TcpStream::connect(upstream).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                Some(s)
            }
            Err(_) => return,
        }
    };
    let mut link = Link {
        client,
        server,
        mode,
        lost: false,
        dropped,
    };
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut sbuf = vec![0u8; 16 * 1024];
    loop {
        let from_server = async {
            match link.server.as_mut() {
                Some(s) => s.read(&mut sbuf).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            read = link.client.read(&mut cbuf) => {
                let n = match read { Ok(0) | Err(_) => return, Ok(n) => n };
                if !link.forward(&cbuf[..n], true).await {
                    return;
                }
            }
            read = from_server => {
                let n = match read { Ok(0) | Err(_) => return, Ok(n) => n };
                let chunk = sbuf[..n].to_vec();
                if !link.forward(&chunk, false).await {
                    return;
                }
            }
            changed = link.mode.changed() => {
                if changed.is_err() { return; }
                match *link.mode.borrow_and_update() {
                    Mode::Reset => return,
                    Mode::Blackhole => {}
                    _ if link.lost => return,
                    Mode::HalfOpen => link.server = None,
                    _ => {}
                }
            }
        }
    }
}

impl Link {
    /// Forwards one chunk as the mode says; `false` when the connection is to be closed. Sets
    /// `lost` when a blackhole drops the chunk, and counts the chunk's bytes in `dropped`.
    async fn forward(&mut self, chunk: &[u8], to_server: bool) -> bool {
        loop {
            let now = *self.mode.borrow_and_update();
            match now {
                Mode::Reset => return false,
                Mode::Blackhole => {
                    self.lost = true;
                    self.dropped.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                    return true;
                }
                // Bytes were skipped: nothing after them may be delivered.
                _ if self.lost => return false,
                Mode::HalfOpen => {
                    self.server = None;
                    return true;
                }
                Mode::Hold => {
                    if self.mode.changed().await.is_err() {
                        return false;
                    }
                    continue;
                }
                Mode::Delay(d) => tokio::time::sleep(d).await,
                Mode::Pass => {}
            }
            let written = if to_server {
                match self.server.as_mut() {
                    Some(s) => s.write_all(chunk).await,
                    None => return true,
                }
            } else {
                self.client.write_all(chunk).await
            };
            return written.is_ok();
        }
    }
}
