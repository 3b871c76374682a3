//! A listener's answer to a client that speaks the other listener's protocol.
//!
//! Why it exists: flightlog listens twice, HTTP/1.1 for the API and OTLP/HTTP (4318 by default)
//! and HTTP/2 for OTLP/gRPC (4317), and the usual slip is an exporter given the other port.
//! Neither protocol stack answers the other: hyper's HTTP/1 server recognises the HTTP/2
//! preface and drops the connection without a word, and its HTTP/2 server drops an HTTP/1.1
//! request after writing its own SETTINGS frame. The gRPC exporter reported only "Socket
//! closed", the HTTP exporter "connection reset" (an audit's finding), and both retried for
//! their whole retry time and dropped the batch, with nothing in the server's output either.
//!
//! So each listener's sockets are wrapped in [`WrongPort`], which looks at a connection's first
//! bytes (up to the HTTP/2 preface's 24) before the protocol stack sees them:
//! - on the HTTP/1 listener, the HTTP/2 preface is answered in HTTP/2: the server's preface (an
//!   empty SETTINGS frame), then `GOAWAY` with `HTTP_1_1_REQUIRED` whose debug data names the
//!   gRPC listener (gRPC clients log a GOAWAY's debug data);
//! - on the HTTP/2 listener, anything but the preface is answered in HTTP/1.1: `400` with the
//!   contract's error body, which names the HTTP listener (OTLP/HTTP exporters log the body).
//!
//! Anything else reaches the stack unchanged, the bytes looked at first. A refused client's
//! bytes are read and dropped until it closes (it does, on the GOAWAY or the `connection:
//! close`) or for at most [`REFUSED_LINGER`], and only then does the stack see the end of the
//! stream: closing with its bytes unread would reset the connection, and a reset can overtake
//! the answer. Until the first
//! bytes are told apart the stack's writes wait (hyper's HTTP/2 server writes its SETTINGS
//! first, which must not reach an HTTP/1.1 client ahead of its answer), and a refused
//! connection's writes are dropped. Looking costs one read of at most 24 bytes a connection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::ApiError;

/// The connection preface every HTTP/2 client sends first (RFC 9113, section 3.4).
const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/2's `GOAWAY` error code `HTTP_1_1_REQUIRED` (RFC 9113, section 7).
const HTTP_1_1_REQUIRED: u32 = 0xd;

/// How many reads of a refused client's bytes one poll makes before it yields.
const DROPPED_READS_A_POLL: usize = 16;

/// How long a refused client's bytes are dropped while it has not closed, counted from the last
/// of them: long enough for a client to read the refusal and close (gRPC clients close on the
/// GOAWAY at once), and for one still uploading a body (an OTLP/HTTP exporter sends its whole
/// batch before it reads an answer) to finish it, so the close is no reset; short enough that
/// one that sends nothing holds its connection no longer than this.
const REFUSED_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest a refused client's bytes are dropped in all, however steadily they come.
const REFUSED_LINGER_AT_MOST: std::time::Duration = std::time::Duration::from_secs(10);

/// The protocol a listener speaks, and so what its clients must open with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Speaks {
    /// HTTP/1.1: the HTTP/2 preface is refused.
    Http1,
    /// HTTP/2 (gRPC): anything but the HTTP/2 preface is refused.
    Http2,
}

/// A listener's address as a client names it: a listener on every address (`0.0.0.0:4317`, in a
/// container) is reached at its port of whatever address the client used, so only the port is
/// named (the review: "at 0.0.0.0:4317" is no address a remote client can use).
fn named(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        format!("port {} of this host", addr.port())
    } else {
        addr.to_string()
    }
}

/// What an HTTP/2 client hears on the HTTP/1.1 listener: the server's connection preface (an
/// empty SETTINGS frame), then `GOAWAY` (no stream processed, `HTTP_1_1_REQUIRED`) whose debug
/// data says where to send OTLP/gRPC: `grpc`, the gRPC listener's address, or that it is off.
pub(crate) fn refusal_of_http2(grpc: Option<SocketAddr>) -> Arc<[u8]> {
    let where_to = match grpc {
        Some(grpc) => format!(
            "send OTLP/gRPC to flightlog's gRPC listener at {}",
            named(grpc)
        ),
        None => "flightlog's OTLP/gRPC listener is off (--grpc-addr); send OTLP/HTTP to \
                 /v1/traces on this port"
            .to_owned(),
    };
    let message = format!(
        "flightlog: this port speaks HTTP/1.1 only (the HTTP API and OTLP/HTTP at /v1/traces); \
         {where_to}"
    );
    let mut frames = Vec::with_capacity(9 + 9 + 8 + message.len());
    // SETTINGS: length 0, type 0x4, no flags, stream 0.
    frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    // GOAWAY: type 0x7, no flags, stream 0; last stream id 0, the error code, the debug data.
    let length = u32::try_from(8 + message.len()).unwrap_or(u32::MAX);
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0u32.to_be_bytes());
    frames.extend_from_slice(&HTTP_1_1_REQUIRED.to_be_bytes());
    frames.extend_from_slice(message.as_bytes());
    frames.into()
}

/// What anything but HTTP/2 hears on the gRPC listener: an HTTP/1.1 `400` with the contract's
/// error body, naming `http`, the HTTP listener's address (when known).
pub(crate) fn refusal_of_http1(http: Option<SocketAddr>) -> Arc<[u8]> {
    let where_to = match http {
        Some(http) if http.ip().is_unspecified() => format!(
            "send OTLP/HTTP (POST /v1/traces) and API requests to port {} of this host",
            http.port()
        ),
        Some(http) => format!("send OTLP/HTTP (POST /v1/traces) and API requests to http://{http}"),
        None => "send OTLP/HTTP (POST /v1/traces) and API requests to flightlog's HTTP listener \
                 (--addr)"
            .to_owned(),
    };
    let body = ApiError::invalid(format!(
        "this port is flightlog's OTLP/gRPC listener and speaks HTTP/2 (gRPC) only; {where_to}"
    ))
    .body()
    .to_string();
    format!(
        "HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .into()
}

/// Where a connection is in telling its protocol.
enum Opening {
    /// Its first bytes, fewer than 24 and all of them the HTTP/2 preface's so far, kept from
    /// the stack.
    Looking(Vec<u8>),
    /// Its protocol is the listener's: these bytes go to the stack before the socket's next.
    Passing(Vec<u8>, usize),
    /// The bytes looked at have all gone to the stack: reads and writes go straight through.
    Through,
    /// Not the listener's protocol: the refusal (how much of it is written) goes out, the
    /// client's bytes and the stack's writes are dropped, until the client closes or the
    /// linger ends.
    Refused(
        usize,
        std::pin::Pin<Box<tokio::time::Sleep>>,
        tokio::time::Instant,
    ),
}

/// A listener's socket that answers a client of the other protocol (see the module doc).
pub(crate) struct WrongPort<T> {
    inner: T,
    speaks: Speaks,
    refusal: Arc<[u8]>,
    opening: Opening,
}

impl<T> WrongPort<T> {
    /// `inner` of a listener that `speaks`, answering a client of the other protocol `refusal`.
    pub(crate) fn new(inner: T, speaks: Speaks, refusal: Arc<[u8]>) -> Self {
        Self {
            inner,
            speaks,
            refusal,
            opening: Opening::Looking(Vec::new()),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> WrongPort<T> {
    /// Read the connection's first bytes until they are told apart: ready once they are
    /// (`Passing` or `Refused`), pending while the socket has nothing more.
    fn poll_look(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let Opening::Looking(seen) = &mut self.opening else {
                return Poll::Ready(Ok(()));
            };
            let mut chunk = [0u8; HTTP2_PREFACE.len()];
            let wanted = HTTP2_PREFACE.len() - seen.len();
            let mut small = ReadBuf::new(&mut chunk[..wanted]);
            match Pin::new(&mut self.inner).poll_read(cx, &mut small) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
            let got = small.filled();
            let ended = got.is_empty();
            seen.extend_from_slice(got);
            let preface_so_far = HTTP2_PREFACE.starts_with(seen);
            let preface = preface_so_far && seen.len() == HTTP2_PREFACE.len();
            let refused = match self.speaks {
                Speaks::Http1 => preface,
                Speaks::Http2 => !preface_so_far,
            };
            if refused {
                let now = tokio::time::Instant::now();
                self.opening = Opening::Refused(
                    0,
                    Box::pin(tokio::time::sleep(REFUSED_LINGER)),
                    now + REFUSED_LINGER_AT_MOST,
                );
            } else if ended || preface || !preface_so_far {
                self.opening = Opening::Passing(std::mem::take(seen), 0);
            }
        }
    }

    /// Write the refusal on; ready once all of it is written (or when not refused).
    fn poll_write_refusal(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.opening {
            Opening::Refused(written, ..) => crate::parse_error_body::poll_write_rest(
                &mut self.inner,
                cx,
                &self.refusal,
                written,
            ),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// A read of a refused client: the refusal written on, the client's bytes dropped; ready
    /// (the end of the stream, for the stack) once the client has closed.
    fn poll_refused(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Poll::Ready(Err(err)) = self.poll_write_refusal(cx) {
            return Poll::Ready(Err(err));
        }
        let mut dropped = [0u8; 4096];
        for _ in 0..DROPPED_READS_A_POLL {
            let mut sink = ReadBuf::new(&mut dropped);
            match Pin::new(&mut self.inner).poll_read(cx, &mut sink) {
                Poll::Ready(Ok(())) if sink.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    // Bytes came: the linger counts again from now, within its bound.
                    if let Opening::Refused(_, linger, at_most) = &mut self.opening {
                        let until = (tokio::time::Instant::now() + REFUSED_LINGER).min(*at_most);
                        linger.as_mut().reset(until);
                    }
                }
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return self.poll_linger(cx),
            }
        }
        cx.waker().wake_by_ref();
        self.poll_linger(cx)
    }

    /// Ready (the end of the stream for the stack) once a refused client's linger is over,
    /// else pending with the timer's waker registered.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.opening {
            Opening::Refused(_, linger, _) => linger.as_mut().poll(cx).map(Ok),
            _ => Poll::Ready(Ok(())),
        }
    }

    /// Before any write of the stack: the first bytes told apart (the stack waits until then),
    /// and a refused connection's refusal written. `Some(true)`: the stack's write is dropped.
    fn poll_before_write(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<bool>> {
        match self.poll_look(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
            Poll::Pending => return Poll::Pending,
        }
        match self.opening {
            Opening::Refused(..) => self.poll_write_refusal(cx).map_ok(|()| true),
            _ => Poll::Ready(Ok(false)),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for WrongPort<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_look(cx) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        match &mut this.opening {
            Opening::Through | Opening::Looking(_) => Pin::new(&mut this.inner).poll_read(cx, buf),
            Opening::Passing(held, given) => {
                let rest = held.get(*given..).unwrap_or_default();
                let count = rest.len().min(buf.remaining());
                buf.put_slice(&rest[..count]);
                *given += count;
                if *given >= held.len() {
                    this.opening = Opening::Through;
                }
                Poll::Ready(Ok(()))
            }
            Opening::Refused(..) => this.poll_refused(cx),
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WrongPort<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if !matches!(this.opening, Opening::Through) {
            match this.poll_before_write(cx) {
                Poll::Ready(Ok(true)) => return Poll::Ready(Ok(buf.len())),
                Poll::Ready(Ok(false)) => {}
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if !matches!(this.opening, Opening::Through) {
            match this.poll_before_write(cx) {
                Poll::Ready(Ok(true)) => {
                    return Poll::Ready(Ok(bufs.iter().map(|buf| buf.len()).sum()))
                }
                Poll::Ready(Ok(false)) => {}
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_write_refusal(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_write_refusal(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The HTTP/2 preface on the HTTP/1 listener, even in pieces, is answered with the refusal
    /// and kept from hyper, which sees the end of the stream once the client has closed;
    /// anything else, even bytes that start as the preface does, reaches hyper whole and in
    /// order.
    #[tokio::test]
    async fn the_http1_listener_refuses_the_http2_preface_only() {
        let refusal = refusal_of_http2(Some(SocketAddr::from(([127, 0, 0, 1], 4317))));
        assert_eq!(&refusal[..9], &[0, 0, 0, 0x4, 0, 0, 0, 0, 0], "SETTINGS");
        assert_eq!(refusal[12], 0x7, "GOAWAY");
        assert_eq!(&refusal[22..26], &[0, 0, 0, 0xd], "HTTP_1_1_REQUIRED");
        let text = String::from_utf8_lossy(&refusal[26..]).into_owned();
        assert!(text.contains("gRPC listener at 127.0.0.1:4317"), "{text}");
        let off = refusal_of_http2(None);
        assert!(String::from_utf8_lossy(&off).contains("listener is off"));

        let (mut client, server) = tokio::io::duplex(64);
        let mut wrapped = WrongPort::new(server, Speaks::Http1, Arc::clone(&refusal));
        let hyper = tokio::spawn(async move {
            let mut seen = Vec::new();
            wrapped.read_to_end(&mut seen).await.expect("read");
            wrapped.shutdown().await.expect("close");
            seen
        });
        client.write_all(b"PRI * HTT").await.expect("write");
        client
            .write_all(b"P/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("write");
        // The client's SETTINGS and more, dropped.
        client.write_all(&[0u8; 300]).await.expect("write");
        let mut answer = vec![0u8; refusal.len()];
        client.read_exact(&mut answer).await.expect("the refusal");
        assert_eq!(answer, *refusal);
        client.shutdown().await.expect("the client closes");
        let seen = hyper.await.expect("hyper's side");
        assert!(seen.is_empty(), "hyper saw {seen:?}");

        for sent in [
            &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
            b"PRI /x HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSX",
            b"P",
            b"",
        ] {
            let (mut client, server) = tokio::io::duplex(8);
            let mut wrapped = WrongPort::new(server, Speaks::Http1, Arc::clone(&refusal));
            let hyper = tokio::spawn(async move {
                let mut seen = Vec::new();
                wrapped.read_to_end(&mut seen).await.expect("read");
                seen
            });
            for byte in sent {
                client.write_all(&[*byte]).await.expect("write");
            }
            client.shutdown().await.expect("close");
            let seen = hyper.await.expect("hyper's side");
            assert_eq!(seen, sent, "{}", String::from_utf8_lossy(sent));
        }
    }

    /// A refused client that never closes is let go after [`REFUSED_LINGER`]: the stack sees
    /// the end of the stream and closes the connection.
    #[tokio::test(start_paused = true)]
    async fn a_refused_client_that_stays_is_let_go_after_the_linger() {
        let refusal = refusal_of_http2(None);
        let (mut client, server) = tokio::io::duplex(4096);
        let mut wrapped = WrongPort::new(server, Speaks::Http1, Arc::clone(&refusal));
        client.write_all(HTTP2_PREFACE).await.expect("write");
        let started = tokio::time::Instant::now();
        let mut seen = Vec::new();
        wrapped.read_to_end(&mut seen).await.expect("read");
        assert!(seen.is_empty());
        assert_eq!(started.elapsed(), REFUSED_LINGER);
        let mut answer = vec![0u8; refusal.len()];
        client.read_exact(&mut answer).await.expect("the refusal");
        assert_eq!(answer, *refusal);
    }

    /// A refused client still sending (an exporter uploading its batch) is read on while its
    /// bytes keep coming, up to [`REFUSED_LINGER_AT_MOST`], so the close after it is no reset.
    #[tokio::test(start_paused = true)]
    async fn a_refused_client_still_sending_is_read_on_within_a_bound() {
        for (sends_for, let_go_after) in [
            (Duration::from_secs(3), Duration::from_secs(4)),
            (Duration::from_secs(30), REFUSED_LINGER_AT_MOST),
        ] {
            let refusal = refusal_of_http1(None);
            let (mut client, server) = tokio::io::duplex(1 << 20);
            let mut wrapped = WrongPort::new(server, Speaks::Http2, Arc::clone(&refusal));
            client
                .write_all(b"POST /v1/traces HTTP/1.1\r\n")
                .await
                .expect("write");
            let sender = tokio::spawn(async move {
                let started = tokio::time::Instant::now();
                while started.elapsed() < sends_for {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    if client.write_all(&[b'x'; 100]).await.is_err() {
                        break;
                    }
                }
                client
            });
            let started = tokio::time::Instant::now();
            let mut seen = Vec::new();
            wrapped.read_to_end(&mut seen).await.expect("read");
            assert!(seen.is_empty());
            assert_eq!(started.elapsed(), let_go_after, "sending for {sends_for:?}");
            drop(wrapped);
            drop(sender.await.expect("the sender"));
        }
    }

    /// On the HTTP/2 listener an HTTP/1.1 request is answered `400` with the contract's body
    /// naming the HTTP listener, and hyper's own first write (its SETTINGS) never reaches that
    /// client; the preface, even in pieces, passes whole, hyper's writes after it.
    #[tokio::test]
    async fn the_http2_listener_answers_anything_but_the_preface_in_http1() {
        let refusal = refusal_of_http1(Some(SocketAddr::from(([127, 0, 0, 1], 4318))));
        let text = String::from_utf8_lossy(&refusal).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let body: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(body["error"]["code"], "invalid_request");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains("http://127.0.0.1:4318"), "{message}");

        let (mut client, server) = tokio::io::duplex(64);
        let mut wrapped = WrongPort::new(server, Speaks::Http2, Arc::clone(&refusal));
        let hyper = tokio::spawn(async move {
            // hyper's HTTP/2 server writes its SETTINGS before it reads anything.
            wrapped
                .write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0])
                .await
                .expect("write");
            wrapped.flush().await.expect("flush");
            let mut seen = Vec::new();
            wrapped.read_to_end(&mut seen).await.expect("read");
            wrapped.shutdown().await.expect("close");
            seen
        });
        client
            .write_all(b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
            .await
            .expect("write");
        let mut answer = vec![0u8; refusal.len()];
        client.read_exact(&mut answer).await.expect("the refusal");
        assert_eq!(answer, *refusal, "the refusal alone, no SETTINGS before it");
        client.shutdown().await.expect("the client closes");
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.expect("read");
        assert!(rest.is_empty(), "nothing after the refusal: {rest:?}");
        let seen = hyper.await.expect("hyper's side");
        assert!(seen.is_empty(), "hyper saw {seen:?}");

        let (mut client, server) = tokio::io::duplex(64);
        let mut wrapped = WrongPort::new(server, Speaks::Http2, Arc::clone(&refusal));
        let hyper = tokio::spawn(async move {
            wrapped.write_all(b"SETTINGS").await.expect("write");
            wrapped.flush().await.expect("flush");
            let mut seen = Vec::new();
            wrapped.read_to_end(&mut seen).await.expect("read");
            seen
        });
        let sent = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04";
        for piece in sent.chunks(5) {
            client.write_all(piece).await.expect("write");
        }
        let mut first = [0u8; 8];
        client.read_exact(&mut first).await.expect("hyper's write");
        assert_eq!(&first, b"SETTINGS");
        client.shutdown().await.expect("close");
        let seen = hyper.await.expect("hyper's side");
        assert_eq!(seen, sent);
    }
}
