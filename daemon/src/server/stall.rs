//! A stream wrapper that gives up on a peer that stops reading: a write (or flush) that
//! makes no progress for the stall limit fails with `TimedOut`, instead of waiting
//! forever on a full socket buffer.
//!
//! The limit is on *progress*, not on the length of a write: a slow client that keeps
//! taking bytes is not cut off. Progress is what the kernel reports, though: Linux wakes
//! a writer blocked on a full Unix socket only once the reader has drained about 3/4 of
//! the buffer, so a client must read that much (~150 KiB with default buffers) within
//! each limit. Reads pass through untouched.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The error inside the `TimedOut` `io::Error` of a stalled write.
#[derive(Debug, thiserror::Error)]
#[error("the peer took no bytes for {0:?}")]
pub(crate) struct Stalled(pub Duration);

/// True when `err` came from a [`StallGuard`] running out of patience.
pub(crate) fn is_stall(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::TimedOut
        && err.get_ref().is_some_and(|inner| inner.is::<Stalled>())
}

pub(crate) struct StallGuard<S> {
    inner: S,
    limit: Duration,
    /// Started when a write first finds the peer not reading; dropped on any progress.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<S> StallGuard<S> {
    pub(crate) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
        }
    }

    /// Turns one poll of the inner stream's write side into the guarded result.
    fn guard<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.timer = None;
            return polled;
        }
        let limit = self.limit;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.timer = None;
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, Stalled(limit))))
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.guard(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.guard(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.guard(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.guard(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_peer_that_never_reads_fails_the_write_after_the_limit() {
        let (near, _far) = tokio::io::duplex(64);
        let limit = Duration::from_millis(50);
        let mut guarded = StallGuard::new(near, limit);
        let started = Instant::now();
        let err = guarded
            .write_all(&[7u8; 1024])
            .await
            .expect_err("nobody reads");
        assert!(is_stall(&err), "{err:?}");
        assert!(started.elapsed() >= limit);
        // Other errors are not stalls.
        assert!(!is_stall(&io::Error::new(io::ErrorKind::TimedOut, "x")));
        assert!(!is_stall(&io::Error::from(io::ErrorKind::BrokenPipe)));
    }

    #[tokio::test]
    async fn a_slow_reader_that_keeps_reading_is_not_cut_off() {
        let (near, mut far) = tokio::io::duplex(256);
        // The whole write takes far longer than the limit, but bytes move every 10 ms.
        let limit = Duration::from_millis(100);
        let mut guarded = StallGuard::new(near, limit);
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 256];
            while got < 8192 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                got += far.read(&mut buf).await.expect("read");
            }
            got
        });
        let started = Instant::now();
        guarded
            .write_all(&[1u8; 8192])
            .await
            .expect("progressing write");
        guarded.flush().await.expect("flush");
        assert!(started.elapsed() > limit, "the test must outlast the limit");
        assert_eq!(reader.await.unwrap(), 8192);
    }

    #[tokio::test]
    async fn reads_pass_through() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut guarded = StallGuard::new(near, Duration::from_millis(10));
        far.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        guarded.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
    }
}
