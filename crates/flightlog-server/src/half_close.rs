//! Answers for HTTP/1 clients that half-close: a client that sends its whole request and then
//! shuts down its sending side (`shutdown(SHUT_WR)`, as `nc -N`, `socat` and some scripts do)
//! still gets its answer.
//!
//! Why it exists: hyper, reading the connection while an answer is pending, takes the end of
//! the client's stream (EOF) for the client's going away and closes the connection at once,
//! dropping the answer. A write then ran to its end without its client ever learning whether it
//! was stored (an audit: 20 journal appends sent that way, 0 answered, 7 stored), and a retry
//! appended the events twice. hyper's own `half_close(true)` answers such clients but stops
//! reading while an answer is written, so a live stream whose client left would be noticed only
//! when a write to it failed, seconds later, holding its stream slot meanwhile.
//!
//! How: [`HalfCloseReader`] wraps the connection's socket and holds an EOF back from hyper (the
//! read stays pending) while a request is in flight whose body has arrived whole, until its
//! answer has been handed over (then hyper writes it and reads the EOF, and closes). An EOF is
//! passed on at once when:
//! - no request is in flight (between requests: the client closed, hyper closes);
//! - the answer in flight is a live stream (`text/event-stream`): a stream's client that closes
//!   is gone, and its stream ends at once, as before;
//! - the request's body is still awaited after the EOF ([`WatchedBody`] saw its reader wait
//!   for more once the EOF was read, woken for it): the client closed in the middle of its
//!   body, an aborted upload, which hyper reports to the handler as an incomplete body. (hyper
//!   reads a body's last bytes and the EOF behind them in one pass, before the handler takes
//!   those bytes: a reader that waited before the EOF says nothing yet.)
//!
//! A client that closed its connection whole is told apart from one that half-closed only by
//! writing to it; its answer is written and lost, as a client that leaves is.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::connection_limit::ConnectionActivity;

/// The client's end of sending on one connection, as the [`HalfCloseReader`] and the
/// connection's requests see it.
#[derive(Debug, Default)]
pub(crate) struct EofWatch {
    state: Mutex<EofState>,
}

#[derive(Debug, Default)]
struct EofState {
    /// The client's stream ended (EOF read).
    seen: bool,
    /// The answer in flight is a live stream.
    streaming: bool,
    /// The request in flight waited for more of its body after the EOF was read.
    body_cut: bool,
    /// The reader holding the EOF back, to wake when it may pass it on.
    reader: Option<Waker>,
    /// The task reading the request's body, waiting for more of it: woken when the EOF is
    /// read, to say whether the body is whole.
    body_reader: Option<Waker>,
}

impl EofWatch {
    fn state(&self) -> MutexGuard<'_, EofState> {
        // The state holds no invariant a panic could break halfway: take it as it is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request begins on the connection: its answer is not a stream, its body not awaited.
    pub(crate) fn request_began(&self) {
        let mut state = self.state();
        state.streaming = false;
        state.body_cut = false;
        state.body_reader = None;
    }

    /// The connection's last request in flight ended: a held EOF may pass.
    pub(crate) fn requests_ended(&self) {
        self.wake_reader(self.state());
    }

    /// The answer in flight is a live stream: a held EOF passes (its client is gone).
    pub(crate) fn answer_is_stream(&self) {
        let mut state = self.state();
        state.streaming = true;
        self.wake_reader(state);
    }

    /// The request's body reader waits for more of it (`waker`'s task): after the EOF, the body
    /// will never come whole, and the held EOF passes; before it, the reader is woken when the
    /// EOF comes, to look again.
    fn body_awaited(&self, waker: &Waker) {
        let mut state = self.state();
        if state.seen {
            state.body_cut = true;
            self.wake_reader(state);
        } else {
            state.body_reader = Some(waker.clone());
        }
    }

    /// Whether the client's stream ended before now (it closed, or half-closed).
    pub(crate) fn seen(&self) -> bool {
        self.state().seen
    }

    fn wake_reader(&self, mut state: MutexGuard<'_, EofState>) {
        let reader = state.reader.take();
        drop(state);
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    /// An EOF was read: whether to hold it back now (`busy`: whether a request is in flight,
    /// asked under the lock, so a request that ends meanwhile wakes the waker stored), with
    /// `waker` to wake when that may change.
    fn hold(&self, busy: impl Fn() -> bool, waker: &Waker) -> bool {
        let mut state = self.state();
        state.seen = true;
        let hold = !state.streaming && !state.body_cut && busy();
        state.reader = hold.then(|| waker.clone());
        let body_reader = state.body_reader.take();
        drop(state);
        if let Some(body_reader) = body_reader {
            body_reader.wake();
        }
        hold
    }
}

/// An HTTP/1 connection's socket that holds the client's EOF back while its request's answer
/// is pending (see the module's doc).
pub(crate) struct HalfCloseReader<T> {
    inner: T,
    activity: Arc<ConnectionActivity>,
}

impl<T> HalfCloseReader<T> {
    pub(crate) fn new(inner: T, activity: Arc<ConnectionActivity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for HalfCloseReader<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        let at_eof = matches!(read, Poll::Ready(Ok(())))
            && buf.filled().len() == before
            && buf.remaining() > 0;
        let activity = &this.activity;
        if at_eof && activity.eof().hold(|| activity.is_busy(), cx.waker()) {
            // Read again when woken: an EOF is read again as often as asked.
            return Poll::Pending;
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HalfCloseReader<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, bytes)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A request's body that tells its connection's [`EofWatch`] when its reader waits for more of
/// it (an EOF then is an aborted upload, passed on at once).
pub(crate) struct WatchedBody<B> {
    body: B,
    activity: Arc<ConnectionActivity>,
}

impl<B> WatchedBody<B> {
    pub(crate) fn new(body: B, activity: Arc<ConnectionActivity>) -> Self {
        Self { body, activity }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let frame = Pin::new(&mut this.body).poll_frame(cx);
        if frame.is_pending() {
            this.activity.eof().body_awaited(cx.waker());
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
