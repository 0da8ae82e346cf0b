//! A connection whose writes must make progress: a write (or flush) that stays pending for the
//! stall timeout fails, and hyper closes the connection.
//!
//! hyper has no write timeout of its own. Without one, a client that keeps its TCP window shut
//! holds its connection, and what hyper has buffered for it, for as long as it likes (its run
//! ended long ago: the sink gave up on it after the same timeout), and a graceful shutdown waits
//! for that connection until its deadline.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub struct WriteDeadline<IO> {
    io: IO,
    stall: Duration,
    /// Armed when a write first finds the peer not reading; any progress disarms it.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<IO> WriteDeadline<IO> {
    pub fn new(io: IO, stall: Duration) -> Self {
        WriteDeadline {
            io,
            stall,
            timer: None,
        }
    }

    fn progress<T>(&mut self, r: io::Result<T>) -> Poll<io::Result<T>> {
        self.timer = None;
        Poll::Ready(r)
    }

    /// A write that could not progress: pending until the stall timeout, then an error.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let stall = self.stall;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the stall timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write(cx, buf) {
            Poll::Ready(r) => this.progress(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => this.progress(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(r) => this.progress(r),
            Poll::Pending => this.stalled(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    const STALL: Duration = Duration::from_secs(5);

    /// A peer that reads nothing fails the write after the stall timeout; one that reads within
    /// it, however slowly, never does. (Paused time.)
    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_does_not_take_fails_after_the_stall_timeout() {
        let (io, mut peer) = tokio::io::duplex(8);
        let mut w = WriteDeadline::new(io, STALL);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            for _ in 0..3 {
                tokio::time::sleep(STALL - Duration::from_secs(1)).await;
                peer.read_exact(&mut buf).await.unwrap();
            }
            peer
        });
        for _ in 0..4 {
            w.write_all(b"12345678").await.unwrap();
        }
        let _peer = reader.await.unwrap();
        let start = Instant::now();
        let err = w.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(start.elapsed(), STALL);
    }
}
