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

use std::io;
use std::pin::Pin;
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

/// A connection's socket whose hyper-written parse-error answers get the contract's body.
pub(crate) struct ParseErrorBody<T> {
    inner: T,
    /// The rewritten answer and how much of it is written.
    rewritten: Option<(Vec<u8>, usize)>,
    /// Where each such answer is counted (they never reach the gate, which counts the rest).
    counted_in: Option<UnparsedRequests>,
}

impl<T> ParseErrorBody<T> {
    pub(crate) fn new(inner: T, counted_in: Option<UnparsedRequests>) -> Self {
        Self {
            inner,
            rewritten: None,
            counted_in,
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

/// Write `bytes` from `written` on to `inner`, counting in `written`; ready once all of them
/// are written (what a socket wrapper that answers by itself writes before anything else).
pub(crate) fn poll_write_rest<W: AsyncWrite + Unpin>(
    inner: &mut W,
    cx: &mut Context<'_>,
    bytes: &[u8],
    written: &mut usize,
) -> Poll<io::Result<()>> {
    while let Some(rest) = bytes.get(*written..).filter(|rest| !rest.is_empty()) {
        match Pin::new(&mut *inner).poll_write(cx, rest) {
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Poll::Ready(Ok(count)) => *written += count,
            Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(Ok(()))
}

impl<T: AsyncWrite + Unpin> ParseErrorBody<T> {
    /// Write out the rewritten answer; ready once all of it is written (or there is none).
    fn poll_write_rewritten(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some((answer, written)) = &mut self.rewritten else {
            return Poll::Ready(Ok(()));
        };
        let outcome = poll_write_rest(&mut self.inner, cx, answer, written);
        if matches!(outcome, Poll::Ready(Ok(()))) {
            self.rewritten = None;
        }
        outcome
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

impl<T: AsyncRead + Unpin> AsyncRead for ParseErrorBody<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
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
        let mut wrapped = ParseErrorBody::new(server, None);
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

    #[tokio::test]
    async fn other_writes_pass_through_unchanged() {
        let (mut client, server) = tokio::io::duplex(1024);
        let mut wrapped = ParseErrorBody::new(server, None);
        let response = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}";
        wrapped.write_all(response).await.expect("write");
        wrapped.shutdown().await.expect("close");
        drop(wrapped);
        let mut seen = Vec::new();
        client.read_to_end(&mut seen).await.expect("read");
        assert_eq!(seen, response);
    }
}
