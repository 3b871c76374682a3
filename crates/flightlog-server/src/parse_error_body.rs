//! The contract's error body on the answers hyper writes by itself, for requests it cannot parse.
//!
//! Why it exists: a request whose head hyper cannot parse (a malformed request line or header, a
//! `Content-Length` that is not a number, a target over 65,534 bytes, too many or too large
//! header fields) never reaches the router: hyper answers it itself, `400`, `414` or `431` with
//! an empty body, and closes the connection. The contract promises every error its status plus
//! `{"error": {"code", "message"}}`, and a client that sent, say, a 70 KB query string learned
//! nothing from an empty 414. hyper offers no hook for these answers, so this wrapper of the
//! connection's socket recognises them on their way out and writes them with the contract's body.
//!
//! How an answer is recognised, exactly: hyper writes it as one head with nothing after it —
//! `HTTP/1.1 <400|414|431> <reason>`, then `connection: close`, `content-length: 0` and `date`
//! (hyper's own code, `Server::on_error` and `Conn::on_parse_error`). Every answer of flightlog's
//! own routes with one of these statuses carries a JSON body, so its `content-length` is never 0,
//! and none of them closes the connection; so a head with all of these marks, alone in its write,
//! is hyper's. hyper answers a parse error of any request on a keep-alive connection, not only
//! the first, so every write is checked: a comparison of its first bytes.
//!
//! The rewritten answer keeps hyper's status line and its `connection: close` and `date`
//! headers, and adds `content-type: application/json` and the body. Its bytes are written by
//! this wrapper (hyper is told its own head was written whole), and `poll_flush` and
//! `poll_shutdown` write them out before they flush or close the socket, so hyper's close
//! still follows the whole answer.
//!
//! An HTTP/2 client on this HTTP/1.1 port (an OTLP/gRPC exporter given the HTTP port, the usual
//! slip between 4317 and 4318) sent its connection preface and heard nothing: hyper recognises
//! the preface, writes no answer (there is none in HTTP/1.1) and drops the connection, and the
//! exporter reported only "connection closed before server preface received". This wrapper
//! looks at a connection's first 24 bytes; when they are the HTTP/2 preface it answers in
//! HTTP/2 itself: the server's preface (an empty SETTINGS frame), then `GOAWAY` with
//! `HTTP_1_1_REQUIRED` and a sentence that names the gRPC listener (gRPC clients print a
//! GOAWAY's debug data). hyper is shown the end of the stream once the client has gone (it
//! closes on a GOAWAY); what the client sends until then is read and dropped, so the close is
//! not a reset that could overtake the answer.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::ApiError;
use crate::metrics::UnparsedRequests;

/// The most header fields a request may have (hyper's default, set explicitly so the message
/// that names it stays true).
pub(crate) const MAX_HEADER_FIELDS: usize = 100;
/// The most bytes of request line and headers a request may have: hyper's read buffer of a
/// connection grows up to it while a head arrives, before any token is checked. hyper's default
/// is 408 KiB, and 2,000 connections that each sent 390 KiB of a head held 801 MiB; 32 KiB is
/// what nginx allows by default (four 8 KiB buffers), twice Node's 16 KiB, and far above what
/// an API client sends (a long bearer token and W3C `baggage`, at most 8 KiB, included). It
/// also bounds the request target, so hyper's own limit of 65,534 bytes is never reached.
pub(crate) const MAX_HEAD_BYTES: usize = 32 * 1024;
/// The longest request target hyper takes (its `MAX_URI_LEN`, not configurable).
const MAX_TARGET_BYTES: usize = u16::MAX as usize - 1;

/// The connection preface every HTTP/2 client sends first (RFC 9113, section 3.4).
const HTTP2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// HTTP/2's `GOAWAY` error code `HTTP_1_1_REQUIRED` (RFC 9113, section 7).
const HTTP_1_1_REQUIRED: u32 = 0xd;

/// What an HTTP/2 client hears on this HTTP/1.1 port: the server's connection preface (an
/// empty SETTINGS frame), then `GOAWAY` (no stream processed, `HTTP_1_1_REQUIRED`) whose debug
/// data says where to send OTLP/gRPC: `grpc`, the gRPC listener's address, or that it is off.
pub(crate) fn http2_refusal(grpc: Option<SocketAddr>) -> Arc<[u8]> {
    let where_to = match grpc {
        Some(grpc) => format!("send OTLP/gRPC to flightlog's gRPC listener at {grpc}"),
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

/// What every connection of the HTTP/1 listener shares: where hyper's answers are counted, and
/// what an HTTP/2 client is answered.
#[derive(Clone)]
pub(crate) struct Http1Answers {
    pub(crate) counted_in: UnparsedRequests,
    pub(crate) http2_refusal: Arc<[u8]>,
}

/// Where a connection is in telling an HTTP/2 preface from an HTTP/1.1 request.
enum Opening {
    /// Its first bytes, fewer than 24 and all of them the preface's so far, kept from hyper.
    Looking(Vec<u8>),
    /// Not the preface: these bytes go to hyper before the socket's next ones.
    Passing(Vec<u8>, usize),
    /// Decided (or not looked at): reads go straight to the socket.
    Through,
    /// The preface: the refusal is being written; the client's bytes are dropped until it
    /// closes, and hyper then sees the end of the stream.
    Refused,
}

/// A connection's socket whose hyper-written parse-error answers get the contract's body, and
/// whose HTTP/2 clients hear in HTTP/2 that this port is not theirs.
pub(crate) struct ParseErrorBody<T> {
    inner: T,
    /// The rewritten answer (or the HTTP/2 refusal) and how much of it is written.
    rewritten: Option<(Vec<u8>, usize)>,
    /// Where each such answer is counted (they never reach the gate, which counts the rest).
    counted_in: Option<UnparsedRequests>,
    /// What an HTTP/2 client is answered (see [`http2_refusal`]); `None` looks at no preface.
    http2_refusal: Option<Arc<[u8]>>,
    opening: Opening,
}

impl<T> ParseErrorBody<T> {
    pub(crate) fn new(
        inner: T,
        counted_in: Option<UnparsedRequests>,
        http2_refusal: Option<Arc<[u8]>>,
    ) -> Self {
        let opening = match http2_refusal {
            Some(_) => Opening::Looking(Vec::new()),
            None => Opening::Through,
        };
        Self {
            inner,
            rewritten: None,
            counted_in,
            http2_refusal,
            opening,
        }
    }
}

/// The sentence each status of hyper's answers gets.
fn message_for(status: u16) -> String {
    match status {
        414 => format!(
            "the request target (path and query string) is longer than {MAX_TARGET_BYTES} \
             bytes; send long input in a request body"
        ),
        431 => format!(
            "the request head is too large: at most {MAX_HEADER_FIELDS} header fields and \
             {MAX_HEAD_BYTES} bytes of request line and headers"
        ),
        _ => "the request is not valid HTTP/1.1: its request line or a header field could not \
              be parsed (a malformed line, a header name with spaces, a Content-Length that is \
              not a number, …)"
            .to_owned(),
    }
}

/// hyper's parse-error answer in `bytes`, rewritten with the contract's body, and its status;
/// `None` for any other write.
fn rewrite(bytes: &[u8]) -> Option<(Vec<u8>, u16)> {
    let rest = bytes.strip_prefix(b"HTTP/1.1 ")?;
    let status = match rest.get(..4)? {
        b"400 " => 400,
        b"414 " => 414,
        b"431 " => 431,
        _ => return None,
    };
    // The head alone: it ends the write, and nothing follows it.
    let head = std::str::from_utf8(bytes.strip_suffix(b"\r\n\r\n")?).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let (mut closes, mut empty, mut date) = (false, false, None);
    for line in lines {
        match line {
            "connection: close" => closes = true,
            "content-length: 0" => empty = true,
            _ if line.starts_with("date: ") => date = Some(line),
            // Any other header: not hyper's answer.
            _ => return None,
        }
    }
    if !(closes && empty) {
        return None;
    }
    let error = ApiError::invalid(message_for(status));
    let body = error.body().to_string();
    let mut answer = Vec::with_capacity(bytes.len() + body.len() + 64);
    answer.extend_from_slice(status_line.as_bytes());
    answer.extend_from_slice(b"\r\nconnection: close\r\ncontent-type: application/json\r\n");
    answer.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    if let Some(date) = date {
        answer.extend_from_slice(date.as_bytes());
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"\r\n");
    answer.extend_from_slice(body.as_bytes());
    Some((answer, status))
}

impl<T: AsyncWrite + Unpin> ParseErrorBody<T> {
    /// Write out the rewritten answer; ready once all of it is written (or there is none).
    fn poll_write_rewritten(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((answer, written)) = &mut self.rewritten {
            let Some(rest) = answer.get(*written..).filter(|rest| !rest.is_empty()) else {
                self.rewritten = None;
                break;
            };
            match Pin::new(&mut self.inner).poll_write(cx, rest) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(count)) => *written += count,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// `None` once the rewritten answer (if any) is all written; else what a write must answer
    /// now (pending, or the error that stopped it).
    fn blocked_by_rewritten<R>(&mut self, cx: &mut Context<'_>) -> Option<Poll<io::Result<R>>> {
        match self.poll_write_rewritten(cx) {
            Poll::Ready(Ok(())) => None,
            Poll::Ready(Err(err)) => Some(Poll::Ready(Err(err))),
            Poll::Pending => Some(Poll::Pending),
        }
    }

    /// Take `bytes` as hyper's answer if they are one: ready with their length (they count as
    /// written; the rewritten answer goes out now and on the next flush).
    fn poll_take_answer(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Option<Poll<io::Result<usize>>> {
        let (answer, status) = rewrite(bytes)?;
        if let Some(counted_in) = &self.counted_in {
            counted_in.count(status);
        }
        self.rewritten = Some((answer, 0));
        Some(match self.poll_write_rewritten(cx) {
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            _ => Poll::Ready(Ok(bytes.len())),
        })
    }
}

/// How many reads of a refused client's bytes one poll makes before it yields.
const DROPPED_READS_A_POLL: usize = 16;

impl<T: AsyncRead + AsyncWrite + Unpin> ParseErrorBody<T> {
    /// A read while the connection's first bytes are looked at: ready once they are told apart
    /// (`Passing`, `Refused`) or the socket has nothing more now.
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
            if ended || !HTTP2_PREFACE.starts_with(seen) {
                self.opening = Opening::Passing(std::mem::take(seen), 0);
            } else if seen.len() == HTTP2_PREFACE.len() {
                self.opening = Opening::Refused;
                if let Some(refusal) = &self.http2_refusal {
                    self.rewritten = Some((refusal.to_vec(), 0));
                }
            }
        }
    }

    /// A read of a refused client: the refusal written on, the client's bytes dropped; ready
    /// (the end of the stream for hyper) once the client has closed.
    fn poll_refused(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Poll::Ready(Err(err)) = self.poll_write_rewritten(cx) {
            return Poll::Ready(Err(err));
        }
        let mut dropped = [0u8; 4096];
        for _ in 0..DROPPED_READS_A_POLL {
            let mut sink = ReadBuf::new(&mut dropped);
            match Pin::new(&mut self.inner).poll_read(cx, &mut sink) {
                Poll::Ready(Ok(())) if sink.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Pending => return Poll::Pending,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for ParseErrorBody<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if matches!(this.opening, Opening::Looking(_)) {
            match this.poll_look(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
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
            Opening::Refused => this.poll_refused(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ParseErrorBody<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(blocked) = this.blocked_by_rewritten(cx) {
            return blocked;
        }
        if let Some(taken) = this.poll_take_answer(cx, buf) {
            return taken;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(blocked) = this.blocked_by_rewritten(cx) {
            return blocked;
        }
        // hyper writes its answer as one buffer (a head and no body).
        let mut filled = bufs.iter().filter(|buf| !buf.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next()) {
            if let Some(taken) = this.poll_take_answer(cx, only) {
                return taken;
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_write_rewritten(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_flush(cx),
            other => other,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match this.poll_write_rewritten(cx) {
            Poll::Ready(Ok(())) => Pin::new(&mut this.inner).poll_shutdown(cx),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const HYPER_431: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: \
        close\r\ncontent-length: 0\r\ndate: Thu, 03 Dec 2026 06:20:47 GMT\r\n\r\n";

    fn split_answer(answer: &[u8]) -> (String, serde_json::Value) {
        let text = String::from_utf8(answer.to_vec()).expect("UTF-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head");
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .expect("a length")
            .parse()
            .expect("a number");
        assert_eq!(length, body.len(), "{text}");
        (
            head.to_owned(),
            serde_json::from_str(body).expect("a JSON body"),
        )
    }

    #[test]
    fn hyper_answers_get_the_contract_body_and_keep_status_close_and_date() {
        for (status, reason, words) in [
            (400, "Bad Request", "not valid HTTP/1.1"),
            (414, "URI Too Long", "longer than 65534 bytes"),
            (
                431,
                "Request Header Fields Too Large",
                "at most 100 header fields",
            ),
        ] {
            let hyper = format!(
                "HTTP/1.1 {status} {reason}\r\nconnection: close\r\ncontent-length: 0\r\n\
                 date: Thu, 03 Dec 2026 06:20:47 GMT\r\n\r\n"
            );
            let (answer, _) = rewrite(hyper.as_bytes()).expect("hyper's answer is recognised");
            let (head, body) = split_answer(&answer);
            assert!(
                head.starts_with(&format!("HTTP/1.1 {status} {reason}\r\n")),
                "{head}"
            );
            assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
            assert!(
                head.contains("\r\ncontent-type: application/json\r\n"),
                "{head}"
            );
            assert!(
                head.ends_with("\r\ndate: Thu, 03 Dec 2026 06:20:47 GMT"),
                "{head}"
            );
            assert_eq!(body["error"]["code"], "invalid_request");
            let message = body["error"]["message"].as_str().expect("a message");
            assert!(message.contains(words), "{message}");
        }
    }

    #[test]
    fn flightlogs_own_answers_and_bodies_are_left_alone() {
        let own = [
            // A route's 400: a JSON body, kept alive.
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: \
               20\r\ndate: x\r\n\r\n"[..],
            // Another status.
            b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            // A head followed by a body in the same write.
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\nx",
            // Kept alive.
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            // Body bytes of a response that look like a status line.
            b"HTTP/1.1 431",
            b"{\"error\":{}}",
        ];
        for bytes in own {
            assert!(
                rewrite(bytes).is_none(),
                "{}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[tokio::test]
    async fn the_rewritten_answer_is_written_whole_before_the_close_even_through_a_narrow_pipe() {
        let (mut client, server) = tokio::io::duplex(16);
        let reader = tokio::spawn(async move {
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.expect("read");
            answer
        });
        let mut wrapped = ParseErrorBody::new(server, None, None);
        let written = wrapped.write(HYPER_431).await.expect("write");
        assert_eq!(
            written,
            HYPER_431.len(),
            "hyper is told its head was written"
        );
        wrapped.flush().await.expect("flush");
        wrapped.shutdown().await.expect("close");
        drop(wrapped);
        let answer = reader.await.expect("the reader");
        let (head, body) = split_answer(&answer);
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert_eq!(body["error"]["code"], "invalid_request");
    }

    /// The HTTP/2 preface, even in pieces, is answered with the refusal and kept from hyper,
    /// which sees the end of the stream once the client has closed; anything else, even bytes
    /// that start as the preface does, reaches hyper whole and in order.
    #[tokio::test]
    async fn an_http2_preface_is_refused_and_anything_else_passes_whole() {
        let refusal = http2_refusal(Some(SocketAddr::from(([127, 0, 0, 1], 4317))));
        let (mut client, server) = tokio::io::duplex(64);
        let mut wrapped = ParseErrorBody::new(server, None, Some(Arc::clone(&refusal)));
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
        let text = String::from_utf8_lossy(&refusal[26..]).into_owned();
        assert!(text.contains("gRPC listener at 127.0.0.1:4317"), "{text}");
        assert_eq!(&refusal[..9], &[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
        assert_eq!(&refusal[12..13], &[0x7]);
        assert_eq!(&refusal[22..26], &[0, 0, 0, 0xd]);
        let off = http2_refusal(None);
        assert!(String::from_utf8_lossy(&off).contains("listener is off"));

        for sent in [
            &b"GET /healthz HTTP/1.1\r\n\r\n"[..],
            b"PRI /x HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSX",
            b"P",
            b"",
        ] {
            let (mut client, server) = tokio::io::duplex(8);
            let mut wrapped = ParseErrorBody::new(server, None, Some(Arc::clone(&refusal)));
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

    #[tokio::test]
    async fn other_writes_pass_through_unchanged() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut wrapped = ParseErrorBody::new(server, None, None);
        let response = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}";
        wrapped.write_all(response).await.expect("write");
        wrapped.shutdown().await.expect("close");
        drop(wrapped);
        let mut seen = Vec::new();
        client.read_to_end(&mut seen).await.expect("read");
        assert_eq!(seen, response);
    }
}
