//! A live Server-Sent-Event stream of a real server, read over a plain TCP connection, for the
//! process-level tests that follow one (`disk_full.rs`, `restart_streams.rs`).
//!
//! Why it exists: those tests judge exactly what reached a client (every event, in order, and
//! how the stream ended: the server's terminating chunk, a cut, silence), so they read the wire
//! themselves rather than through a client crate that might retry or buffer. The reader polls
//! its socket in short steps so a caller can stop it between events (a follower that has seen
//! everything it waits for) without waiting for the server's next keep-alive comment.
//!
//! Included with `#[path]` by the tests that use it (as `http.rs` is).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long one read of the socket waits before the reader looks at its stop condition.
const POLL: Duration = Duration::from_millis(100);

/// One event of the stream.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its `event:` field (`message` when it has none).
    pub kind: String,
    /// Its `id:` field, when it has one.
    pub id: Option<String>,
    /// Its `data:` lines, joined by `\n`.
    pub data: String,
}

/// How a stream that did not fail ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The server ended it: the terminating chunk of a chunked body, or the end of a body that
    /// was not chunked.
    ByServer,
    /// The caller's stop condition held.
    ByCaller,
}

/// `GET path` on a new connection to `addr`, with `Last-Event-ID` when given; hands each event
/// to `on_event` until the server ends the stream or `stop` holds (looked at between reads, at
/// least every 100 ms). An answer other than 200, a connection cut (a chunked body without its
/// terminating chunk) or `idle_limit` without a byte is an error.
pub fn follow(
    addr: SocketAddr,
    path: &str,
    last_event_id: Option<&str>,
    idle_limit: Duration,
    mut on_event: impl FnMut(Event),
    stop: &dyn Fn() -> bool,
) -> io::Result<Ended> {
    let mut socket = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    socket.set_read_timeout(Some(POLL))?;
    let mut head = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nConnection: close\r\n"
    );
    if let Some(id) = last_event_id {
        head.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    head.push_str("\r\n");
    socket.write_all(head.as_bytes())?;

    let mut received: Vec<u8> = Vec::new();
    let mut body = Body::Head;
    let mut events = EventParser::default();
    let mut last_byte = Instant::now();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if stop() {
            return Ok(Ended::ByCaller);
        }
        match socket.read(&mut chunk) {
            Ok(0) => {
                return match body {
                    Body::Plain => Ok(Ended::ByServer),
                    Body::Head => Err(io::Error::other(format!(
                        "the connection ended in the answer's head: {:?}",
                        String::from_utf8_lossy(&received)
                    ))),
                    Body::Chunked => Err(io::Error::other(
                        "the stream was cut off without its terminating chunk",
                    )),
                };
            }
            Ok(read) => {
                last_byte = Instant::now();
                received.extend_from_slice(&chunk[..read]);
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if last_byte.elapsed() > idle_limit {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("nothing came for {idle_limit:?}"),
                    ));
                }
                continue;
            }
            Err(error) => return Err(error),
        }
        if body == Body::Head {
            let Some(end) = find(&received, b"\r\n\r\n") else {
                continue;
            };
            let head_text = String::from_utf8_lossy(&received[..end]).into_owned();
            let status = head_text.split_whitespace().nth(1).unwrap_or_default();
            if status != "200" {
                return Err(io::Error::other(format!(
                    "the stream was answered {head_text:?} {:?}",
                    String::from_utf8_lossy(&received[end + 4..])
                )));
            }
            let chunked = head_text.lines().any(|line| {
                let line = line.to_ascii_lowercase();
                line.starts_with("transfer-encoding:") && line.contains("chunked")
            });
            body = if chunked { Body::Chunked } else { Body::Plain };
            received.drain(..end + 4);
        }
        match body {
            Body::Head => {}
            Body::Plain => {
                events.feed(&received, &mut on_event);
                received.clear();
            }
            // `size\r\n`, `size` bytes, `\r\n`; a size of 0 ends the body.
            Body::Chunked => {
                while let Some(line_end) = find(&received, b"\r\n") {
                    let size_text = String::from_utf8_lossy(&received[..line_end]).into_owned();
                    let size_text = size_text.split(';').next().unwrap_or_default().trim();
                    let size = usize::from_str_radix(size_text, 16).map_err(|error| {
                        io::Error::other(format!("chunk size {size_text:?}: {error}"))
                    })?;
                    if size == 0 {
                        return Ok(Ended::ByServer);
                    }
                    if received.len() < line_end + 2 + size + 2 {
                        break;
                    }
                    events.feed(&received[line_end + 2..line_end + 2 + size], &mut on_event);
                    received.drain(..line_end + 2 + size + 2);
                }
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Body {
    Head,
    Plain,
    Chunked,
}

/// Server-sent events from the body's bytes: `field: value` lines, an empty line ends an
/// event, a line starting with `:` is a comment.
#[derive(Default)]
struct EventParser {
    line: Vec<u8>,
    kind: Option<String>,
    id: Option<String>,
    data: Option<String>,
}

impl EventParser {
    fn feed(&mut self, bytes: &[u8], on_event: &mut impl FnMut(Event)) {
        for &byte in bytes {
            if byte != b'\n' {
                self.line.push(byte);
                continue;
            }
            let line = String::from_utf8_lossy(&self.line)
                .trim_end_matches('\r')
                .to_owned();
            self.line.clear();
            if line.is_empty() {
                if let Some(data) = self.data.take() {
                    on_event(Event {
                        kind: self.kind.take().unwrap_or_else(|| "message".to_owned()),
                        id: self.id.take(),
                        data,
                    });
                }
                self.kind = None;
                self.id = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((&line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
            match field {
                "event" => self.kind = Some(value),
                "id" => self.id = Some(value),
                "data" => match &mut self.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(&value);
                    }
                    None => self.data = Some(value),
                },
                _ => {}
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
