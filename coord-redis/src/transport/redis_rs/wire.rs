//! A socket that knows whether anything went out on it, for telling a command that never left
//! the process from one that may have reached the server.
//!
//! A client library reports a connection the server closed (`CLIENT KILL`, a restart, an idle
//! timeout) with the same error whether the command it was given was written before the close
//! was noticed or not. Only in the second case is it safe to send the command again. [`Watched`]
//! wraps the socket under one connection and counts the bytes the kernel accepted. A caller
//! that reads [`Wire::written`] before handing a command over and finds it unchanged after the
//! command failed knows none of the command's bytes reached the socket.
//!
//! The server may have closed the connection while it sat idle (`CLIENT KILL`, an idle
//! timeout): the kernel would still accept the next write, and the command would count as
//! possibly sent. So the first write after the connection went idle looks (without reading)
//! whether the server has closed its end, and is refused if so: a server that has closed the
//! connection cannot read what is written after, and the command is proven unsent. Callers
//! report each command they hand over ([`Wire::hand_over`]); a command handed over while
//! none is unanswered starts a new busy spell, and only the first write after that looks.
//! A write behind an unanswered command does not look (one system call per command saved
//! under load): were the connection closed under it, the unanswered command is in doubt
//! anyway, and so is this one, which is then reported as possibly sent, never sent twice.
//!
//! It also tells when one given request has been accepted whole ([`Wire::watch`]), for a
//! leader that answers its callers once its hand-over has left the process but before its
//! reply: the request is found by bytes that occur in it only (a needle), and is out once the
//! kernel accepted the needle and the known number of bytes after it. The connection writes
//! requests whole and in order, so nothing else can sit between them. Only while a watch is
//! registered are written bytes looked at; otherwise a write costs one atomic load more.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use coord_core::provider::SentNotice;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one connection's socket has seen.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    written: AtomicU64,
    /// Commands handed over ([`Wire::hand_over`]) and not yet answered or given up.
    unanswered: AtomicUsize,
    /// How many busy spells began: a command was handed over while none was unanswered. The
    /// socket looks for the server's close before its first write of each spell.
    spells: AtomicU64,
    /// Set once the socket was dropped: the connection's driver ended (it read the server's
    /// close, a write failed, or it was stopped), so nothing more is written or read on it.
    gone: AtomicBool,
    /// The command that began the current busy spell, while it waits: woken when the socket
    /// is dropped (see [`HandedOver::gone`]).
    gone_waker: Mutex<Option<Waker>>,
    /// How many watches are registered: read on every write, the lock taken only when above 0.
    watched: AtomicUsize,
    watches: Mutex<Watches>,
}

#[derive(Debug, Default)]
struct Watches {
    next_id: u64,
    list: Vec<Watch>,
    /// The last bytes written (fewer than the longest needle still looked for), so a needle
    /// split between two writes is found.
    carry: Vec<u8>,
}

#[derive(Debug)]
struct Watch {
    id: u64,
    needle: Vec<u8>,
    /// Bytes of the request after its needle.
    tail: u64,
    /// Where in the stream the request's last byte is, once its needle was seen.
    end: Option<u64>,
    notice: SentNotice,
}

impl Wire {
    /// Bytes the kernel accepted on this socket so far.
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Notes a command about to be handed to the connection, until the returned guard is
    /// dropped (once it is answered, failed or given up). A command handed over while none
    /// is unanswered begins a busy spell: the socket's next write looks for the server's
    /// close first, so that command, were the connection closed while it was idle, is
    /// refused before any byte of it goes out.
    pub(crate) fn hand_over(&self) -> HandedOver<'_> {
        let began = self.unanswered.fetch_add(1, Ordering::AcqRel) == 0;
        if began {
            self.spells.fetch_add(1, Ordering::AcqRel);
        }
        HandedOver { wire: self, began }
    }

    /// The socket was dropped: wakes the command waiting in [`HandedOver::gone`].
    fn drop_socket(&self) {
        self.gone.store(true, Ordering::Release);
        let waker = self
            .gone_waker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Tells `notice` once the kernel accepted the bytes `needle`, and `tail` bytes after them.
    /// Register it before the request is handed to the connection, and [`Wire::unwatch`] it
    /// once the request is answered or failed. `needle` must occur in no other request sent
    /// on this connection from now on.
    pub(crate) fn watch(&self, needle: Vec<u8>, tail: u64, notice: SentNotice) -> u64 {
        let mut watches = self.lock();
        watches.next_id += 1;
        let id = watches.next_id;
        watches.list.push(Watch {
            id,
            needle,
            tail,
            end: None,
            notice,
        });
        self.watched.fetch_add(1, Ordering::AcqRel);
        id
    }

    /// Removes watch `id`, giving back its notice if it was not told yet.
    pub(crate) fn unwatch(&self, id: u64) -> Option<SentNotice> {
        let mut watches = self.lock();
        let at = watches.list.iter().position(|w| w.id == id)?;
        let watch = watches.list.swap_remove(at);
        self.watched.fetch_sub(1, Ordering::AcqRel);
        if watches.list.is_empty() {
            watches.carry.clear();
        }
        Some(watch.notice)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watches> {
        // Every critical section leaves the list whole: a poisoned one is still usable.
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kernel accepted `chunks` (in order), the first byte at stream offset `start`.
    fn accepted(&self, start: u64, chunks: &[&[u8]]) {
        let mut watches = self.lock();
        if watches.list.is_empty() {
            return;
        }
        let Watches { list, carry, .. } = &mut *watches;
        let carried = carry.len() as u64;
        let mut hay = std::mem::take(carry);
        for chunk in chunks {
            hay.extend_from_slice(chunk);
        }
        let hay_start = start - carried;
        let done = hay_start + hay.len() as u64;
        for watch in list.iter_mut().filter(|w| w.end.is_none()) {
            if let Some(at) = find(&hay, &watch.needle) {
                watch.end = Some(hay_start + (at + watch.needle.len()) as u64 + watch.tail);
            }
        }
        let mut i = 0;
        while i < list.len() {
            if list[i].end.is_some_and(|end| end <= done) {
                list.swap_remove(i).notice.notify();
                self.watched.fetch_sub(1, Ordering::AcqRel);
            } else {
                i += 1;
            }
        }
        let keep = list
            .iter()
            .filter(|w| w.end.is_none())
            .map(|w| w.needle.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        hay.drain(..hay.len().saturating_sub(keep));
        *carry = hay;
    }
}

/// A command handed to a connection and not yet answered; see [`Wire::hand_over`].
pub(crate) struct HandedOver<'a> {
    wire: &'a Wire,
    /// It began a busy spell: none was unanswered when it was handed over.
    began: bool,
}

impl<'a> HandedOver<'a> {
    /// When this command began a busy spell: a future ready once the connection's socket is
    /// dropped (its driver ended), raced against the command's round trip.
    ///
    /// Why: a command handed to the client library's connection while its driver is ending
    /// (it read the server's close a moment before) can be queued after the driver's queue
    /// was emptied; it is then neither written nor failed, and would wait for the response
    /// timeout, to be reported as a timeout though it never left the process. That is the
    /// first command after an idle connection was closed, the one case the transport proves
    /// unsent: it is woken when the socket is dropped, and the caller's byte count then
    /// finds it unsent. A command handed over behind an unanswered one is not watched (it is
    /// in doubt anyway once the connection closes under it), so one waits at a time.
    pub(crate) fn gone(&self) -> Option<Gone<'a>> {
        self.began.then_some(Gone {
            wire: self.wire,
            registered: false,
        })
    }
}

impl Drop for HandedOver<'_> {
    fn drop(&mut self) {
        self.wire.unanswered.fetch_sub(1, Ordering::AcqRel);
    }
}

/// See [`HandedOver::gone`].
pub(crate) struct Gone<'a> {
    wire: &'a Wire,
    registered: bool,
}

impl Future for Gone<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let wire = self.wire;
        // Registered before the flag is read: a socket dropped after the read wakes it.
        {
            let mut slot = wire.gone_waker.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *slot {
                Some(waker) => waker.clone_from(cx.waker()),
                None => *slot = Some(cx.waker().clone()),
            }
        }
        self.registered = true;
        if wire.gone.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        if self.registered {
            self.wire
                .gone_waker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A socket whose writes are counted in its [`Wire`], and refused once the peer closed (as
/// seen at the first write of each busy spell).
pub(crate) struct Watched<S> {
    inner: S,
    wire: Arc<Wire>,
    /// The busy spell whose first write was made (compared with [`Wire::spells`]).
    looked: u64,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S) -> (Watched<S>, Arc<Wire>) {
        let wire = Arc::new(Wire::default());
        (
            Watched {
                inner,
                wire: wire.clone(),
                looked: 0,
            },
            wire,
        )
    }
}

/// A socket whose descriptor can be peeked at (on Unix; elsewhere no peek is made, and a
/// write to a connection the server closed counts as possibly sent).
#[cfg(unix)]
pub(crate) trait Socket: std::os::fd::AsRawFd {}
#[cfg(unix)]
impl<T: std::os::fd::AsRawFd> Socket for T {}
#[cfg(not(unix))]
pub(crate) trait Socket {}
#[cfg(not(unix))]
impl<T> Socket for T {}

impl<S: Socket> Watched<S> {
    /// True when the server has closed its end: an orderly close is waiting to be read and
    /// nothing before it, or the connection was reset. One non-blocking peek, which consumes
    /// nothing; data waiting to be read (a reply) counts as open.
    #[cfg(not(unix))]
    fn peer_closed(&self) -> bool {
        false
    }

    #[cfg(unix)]
    fn peer_closed(&self) -> bool {
        let mut byte = [0u8; 1];
        // SAFETY: the descriptor is the socket `inner` owns and keeps open for this call; the
        // buffer is valid for one byte. `MSG_PEEK | MSG_DONTWAIT` neither consumes nor blocks.
        let n = unsafe {
            libc::recv(
                self.inner.as_raw_fd(),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => true,
            n if n > 0 => false,
            _ => matches!(
                io::Error::last_os_error().kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
            ),
        }
    }
}

impl<S: Socket> Watched<S> {
    /// Before a write: the busy spell it belongs to when a new one began since the last write
    /// (`Err` when the server has closed its end meanwhile), else `None`. A spell is marked
    /// looked at only once a write of it completed ([`Watched::looked_at`]), so a write that
    /// had to wait looks again when it is retried.
    fn look(&self) -> io::Result<Option<u64>> {
        let spell = self.wire.spells.load(Ordering::Acquire);
        if spell == self.looked {
            return Ok(None);
        }
        if self.peer_closed() {
            return Err(closed_before_write());
        }
        Ok(Some(spell))
    }

    fn looked_at(&mut self, spell: Option<u64>) {
        if let Some(spell) = spell {
            self.looked = spell;
        }
    }
}

impl<S> Drop for Watched<S> {
    fn drop(&mut self) {
        self.wire.drop_socket();
    }
}

fn closed_before_write() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the server had closed the connection before this write; nothing was sent",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Socket + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let spell = match self.look() {
            Ok(spell) => spell,
            Err(closed) => return Poll::Ready(Err(closed)),
        };
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.looked_at(spell);
            let start = self.wire.written.fetch_add(*n as u64, Ordering::AcqRel);
            if self.wire.watched.load(Ordering::Acquire) > 0 {
                self.wire.accepted(start, &[&buf[..*n]]);
            }
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let spell = match self.look() {
            Ok(spell) => spell,
            Err(closed) => return Poll::Ready(Err(closed)),
        };
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            self.looked_at(spell);
            let start = self.wire.written.fetch_add(*n as u64, Ordering::AcqRel);
            if self.wire.watched.load(Ordering::Acquire) > 0 {
                // The accepted bytes: the first `n` of the buffers, in order.
                let mut left = *n;
                let mut chunks = Vec::with_capacity(bufs.len());
                for buf in bufs {
                    if left == 0 {
                        break;
                    }
                    let take = left.min(buf.len());
                    chunks.push(&buf[..take]);
                    left -= take;
                }
                self.wire.accepted(start, &chunks);
            }
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use coord_core::provider::{SentNotice, SentWait};

    use super::Wire;

    fn told(wait: &mut SentWait) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        matches!(std::pin::Pin::new(wait).poll(&mut cx), Poll::Ready(()))
    }

    /// Feeds `bytes` to the wire as the kernel accepting them, as `poll_write` does.
    fn write(wire: &Wire, bytes: &[u8]) {
        let start = wire
            .written
            .fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::AcqRel);
        wire.accepted(start, &[bytes]);
    }

    #[test]
    fn told_once_the_needle_and_its_tail_are_accepted_even_when_split() {
        let wire = Wire::default();
        let (notice, mut wait) = SentNotice::new();
        // Another request is being written when the watch starts; it holds a prefix of the
        // needle, which must not count.
        write(&wire, b"*2\r\n$3\r\nGET\r\n$4\r\nke");
        let id = wire.watch(b"NEEDLE".to_vec(), 5, notice);
        write(&wire, b"y1\r\nNEED");
        write(&wire, b"NEE");
        assert!(!told(&mut wait), "a partial needle is not the request");
        write(&wire, b"DLE12");
        assert!(
            !told(&mut wait),
            "two of the five bytes after the needle are out"
        );
        write(&wire, b"345");
        assert!(told(&mut wait), "the last byte of the request was accepted");
        assert!(wire.unwatch(id).is_none(), "already told");
    }

    #[test]
    fn a_watch_given_up_before_its_request_went_out_gives_the_notice_back() {
        let wire = Wire::default();
        let (notice, mut wait) = SentNotice::new();
        let id = wire.watch(b"NEEDLE".to_vec(), 0, notice);
        write(&wire, b"something else entirely");
        let notice = wire.unwatch(id).expect("not told");
        assert!(!told(&mut wait));
        // Dropped once the request is answered: the waiting side stops waiting then.
        drop(notice);
        assert!(told(&mut wait));
        write(&wire, b"NEEDLE");
    }

    #[test]
    fn watches_on_one_connection_are_told_each_at_its_own_request() {
        let wire = Wire::default();
        let (first, mut first_wait) = SentNotice::new();
        let (second, mut second_wait) = SentNotice::new();
        wire.watch(b"AAAA".to_vec(), 2, first);
        wire.watch(b"BBBB".to_vec(), 2, second);
        write(&wire, b"xxAAAA..BB");
        assert!(told(&mut first_wait));
        assert!(!told(&mut second_wait));
        write(&wire, b"BB.");
        assert!(!told(&mut second_wait));
        write(&wire, b".");
        assert!(told(&mut second_wait));
    }
}

#[cfg(all(test, unix))]
mod spell_tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Wake, Waker};
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::Watched;

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn only_the_first_write_of_a_busy_spell_looks_for_the_servers_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (mut socket, wire) = Watched::new(client);

        // A command begins a spell; its write looks, finds the connection open, goes out.
        let first = wire.hand_over();
        socket.write_all(b"PING\r\n").await.unwrap();
        let mut got = [0u8; 6];
        server.read_exact(&mut got).await.unwrap();
        // The server closes the connection while that command is unanswered.
        drop(server);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.peer_closed() {
            assert!(Instant::now() < deadline, "the close never arrived");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // Behind an unanswered command no look is made: the kernel takes the bytes, and the
        // command counts as possibly sent (what the caller reports, never sending it again).
        let behind = wire.hand_over();
        socket.write_all(b"PING\r\n").await.unwrap();
        assert_eq!(wire.written(), 12);

        // Both done: the next command begins a new spell, and its write is refused unsent.
        drop((first, behind));
        let _next = wire.hand_over();
        let refused = socket.write_all(b"PING\r\n").await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::BrokenPipe);
        assert!(
            refused.to_string().contains("nothing was sent"),
            "{refused}"
        );
        assert_eq!(wire.written(), 12, "not one byte of it went out");
    }

    #[test]
    fn the_command_that_began_a_spell_is_woken_when_the_socket_is_dropped() {
        let (socket, wire) = Watched::new(());
        let first = wire.hand_over();
        let behind = wire.hand_over();
        assert!(
            behind.gone().is_none(),
            "only the spell's first command waits"
        );
        let mut gone = pin!(first.gone().expect("it began the spell"));
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(gone.as_mut().poll(&mut cx).is_pending());
        // The driver ends: the socket is dropped with it.
        drop(socket);
        assert!(flag.0.load(Ordering::SeqCst), "woken");
        assert!(gone.as_mut().poll(&mut cx).is_ready());
    }
}
