//! A connection whose client has stopped reading is closed once nothing could be written to it
//! for [`ServerConfig::write_stall_limit`](crate::state::ServerConfig) (30 s by default).
//!
//! Why it exists: hyper has no timeout on writing a response. A client that asked for a large
//! answer and then read nothing kept the connection, and with it the answer's share of the
//! budget of large answers (see [`crate::response_budget`]), for as long as it liked: three
//! such clients of a 104 MiB snapshot held 213 MB of the budget and every other large answer
//! was refused with 503 for as long as they stayed. A live stream whose client stopped reading
//! likewise kept its place forever.
//!
//! The guard wraps the socket under hyper: while a write (or flush) cannot go on because the
//! client's window is full, a timer runs; any write that goes through stops it; if it expires
//! the write fails with `TimedOut`, hyper drops the connection, and the response body with its
//! share of the budget goes with it. A client that reads slowly but steadily is never cut off,
//! and reads are not affected (the header-read timeout and the request-body gate see to those).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A socket whose writes fail once they have made no progress for a while.
pub(crate) struct StallGuard<T> {
    inner: T,
    limit: Duration,
    /// Running while the last write attempt could not go on.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Counts the connections cut off (for `/metrics`), once each.
    cut_off: Arc<AtomicU64>,
    counted: bool,
}

impl<T> StallGuard<T> {
    /// `inner`, cut off once a write has made no progress for `limit`, counted in `cut_off`.
    pub(crate) fn new(inner: T, limit: Duration, cut_off: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
            cut_off,
            counted: false,
        }
    }

    /// What a write attempt that could not go on answers: pending while the limit has not
    /// passed since the first such attempt in a row, then an error.
    fn pending<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                if !std::mem::replace(&mut self.counted, true) {
                    self.cut_off.fetch_add(1, Ordering::Relaxed);
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client read nothing for {} s", limit.as_secs_f64()),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The outcome of a write attempt: progress (or a failure) stops the timer.
    fn guard<R>(
        &mut self,
        attempt: Poll<io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<R>> {
        match attempt {
            Poll::Pending => self.pending(cx),
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let attempt = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.guard(attempt, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let attempt = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.guard(attempt, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let attempt = Pin::new(&mut self.inner).poll_flush(cx);
        self.guard(attempt, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let attempt = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.guard(attempt, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A writer into a full pipe fails after the limit; one whose reader keeps reading does not.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_cannot_go_on_fails_after_the_limit() {
        let (client, server) = tokio::io::duplex(1024);
        let cut_off = Arc::new(AtomicU64::new(0));
        let mut guarded = StallGuard::new(server, Duration::from_secs(30), Arc::clone(&cut_off));
        guarded.write_all(&[0; 1024]).await.expect("fits the pipe");
        let started = tokio::time::Instant::now();
        let failed = guarded.write_all(&[1; 10]).await;
        assert_eq!(
            failed.map_err(|err| err.kind()),
            Err(io::ErrorKind::TimedOut)
        );
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        // Counted once, however often hyper tries again before it drops the connection.
        assert!(guarded.write_all(&[1; 10]).await.is_err());
        assert_eq!(cut_off.load(Ordering::Relaxed), 1);
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_reader_is_never_cut_off() {
        use tokio::io::AsyncReadExt;
        let (mut client, server) = tokio::io::duplex(1024);
        let reader = tokio::spawn(async move {
            let mut chunk = [0; 512];
            let mut total = 0;
            while total < 64 * 1024 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                total += client.read(&mut chunk).await.expect("read");
            }
            total
        });
        let cut_off = Arc::new(AtomicU64::new(0));
        let mut guarded = StallGuard::new(server, Duration::from_secs(30), Arc::clone(&cut_off));
        guarded
            .write_all(&vec![7; 64 * 1024])
            .await
            .expect("each write goes on within the limit");
        assert_eq!(reader.await.expect("the reader"), 64 * 1024);
        assert_eq!(cut_off.load(Ordering::Relaxed), 0);
    }
}
