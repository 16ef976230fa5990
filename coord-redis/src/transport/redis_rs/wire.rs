//! A socket that knows whether anything went out on it, for telling a command that never left
//! the process from one that may have reached the server.
//!
//! A client library reports a connection the server closed (`CLIENT KILL`, a restart, an idle
//! timeout) with the same error whether the command it was given was written before the close
//! was noticed or not. Only in the second case is it safe to send the command again. [`Watched`]
//! wraps the socket under one connection and counts the bytes the kernel accepted; before each
//! write it also looks (without reading) whether the server has closed its end already, and
//! refuses the write if so, since a server that has closed the connection cannot read what is
//! written after. A caller that reads [`Wire::written`] before handing a command over and finds
//! it unchanged after the command failed knows none of the command's bytes reached the socket.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one connection's socket has seen.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    written: AtomicU64,
}

impl Wire {
    /// Bytes the kernel accepted on this socket so far.
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }
}

/// A socket whose writes are counted in its [`Wire`], and refused once the peer closed.
pub(crate) struct Watched<S> {
    inner: S,
    wire: Arc<Wire>,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S) -> (Watched<S>, Arc<Wire>) {
        let wire = Arc::new(Wire::default());
        (
            Watched {
                inner,
                wire: wire.clone(),
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
        if self.peer_closed() {
            return Poll::Ready(Err(closed_before_write()));
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.wire.written.fetch_add(*n as u64, Ordering::AcqRel);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.peer_closed() {
            return Poll::Ready(Err(closed_before_write()));
        }
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            self.wire.written.fetch_add(*n as u64, Ordering::AcqRel);
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
