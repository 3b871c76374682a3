//! The HTTP client side shared by every phase: [`Connection`], one keep-alive HTTP/1.1
//! connection per client task for the measured requests (a minimal client of its own), and a reqwest client (no proxy: the
//! target is always 127.0.0.1) for the small reads the phases use to check what the server
//! stored.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{Method, Uri};
use reqwest::{Client, Url};

use crate::workload::PreparedRequest;

/// The longest a single request may take before it counts as an error: far above any latency
/// the phases measure, so it only stops a hung server from hanging the generator.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The reqwest client for the reads around the measurements.
pub fn http_client() -> anyhow::Result<Client> {
    Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(90))
        .build()
        .context("cannot build the HTTP client")
}

/// One keep-alive HTTP/1.1 connection to the server, opened on first use and reopened after a
/// failure. Requests on it go one at a time, as a client task sends them.
///
/// It speaks the protocol itself (the request written in one call from a reused buffer, the
/// answer's head parsed with `httparse`, its body read by `Content-Length` or chunks) rather
/// than through hyper's client: generator and server share the machine's two cores, so every
/// microsecond the generator spends per request is taken from the server being measured. hyper's
/// client (a connection task beside each client task, a request and response object per call)
/// cost 10.9 us of generator CPU per single-op request; this costs a third of that, as `wrk`'s
/// client does.
pub struct Connection {
    addr: SocketAddr,
    host: String,
    stream: Option<tokio::net::TcpStream>,
    /// The request being written (reused between requests).
    out: Vec<u8>,
    /// Bytes read from the socket and not yet consumed.
    read: bytes::BytesMut,
}

/// The most a response head may take before the answer counts as malformed.
const MAX_HEAD_BYTES: usize = 64 * 1024;

impl Connection {
    pub fn new(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self {
            addr,
            host: addr.to_string(),
            stream: None,
            out: Vec::with_capacity(4096),
            read: bytes::BytesMut::with_capacity(16 * 1024),
        })
    }

    async fn connect(&mut self) -> Result<(), String> {
        if self.stream.is_none() {
            let stream = tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(|err| format!("cannot connect to {}: {err}", self.addr))?;
            stream
                .set_nodelay(true)
                .map_err(|err| format!("cannot set TCP_NODELAY: {err}"))?;
            self.read.clear();
            self.stream = Some(stream);
        }
        Ok(())
    }

    /// One request; the status and the whole answer body. A failure drops the connection, so
    /// the next request opens a new one.
    pub async fn request(
        &mut self,
        method: &Method,
        uri: &Uri,
        content_type: &'static str,
        body: &Bytes,
    ) -> Result<(u16, Bytes), String> {
        self.request_encoded(method, uri, content_type, None, body)
            .await
    }

    /// [`Connection::request`] with a body in `content_encoding` (`gzip`), when given.
    pub async fn request_encoded(
        &mut self,
        method: &Method,
        uri: &Uri,
        content_type: &'static str,
        content_encoding: Option<&'static str>,
        body: &Bytes,
    ) -> Result<(u16, Bytes), String> {
        let outcome = tokio::time::timeout(
            REQUEST_TIMEOUT,
            self.exchange(method, uri, content_type, content_encoding, body),
        )
        .await;
        let result = match outcome {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        };
        if result.is_err() {
            self.stream = None;
        }
        result.map_err(|err| format!("{method} {}: {err}", uri.path()))
    }

    async fn exchange(
        &mut self,
        method: &Method,
        uri: &Uri,
        content_type: &'static str,
        content_encoding: Option<&'static str>,
        body: &Bytes,
    ) -> Result<(u16, Bytes), String> {
        use std::io::Write as _;
        use tokio::io::AsyncWriteExt as _;

        self.connect().await?;
        self.out.clear();
        let target = uri.path_and_query().map_or("/", |target| target.as_str());
        let _ = write!(
            self.out,
            "{method} {target} HTTP/1.1\r\nhost: {}\r\n",
            self.host
        );
        if !body.is_empty() {
            let _ = write!(
                self.out,
                "content-type: {content_type}\r\ncontent-length: {}\r\n",
                body.len()
            );
            if let Some(encoding) = content_encoding {
                let _ = write!(self.out, "content-encoding: {encoding}\r\n");
            }
        }
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(body);
        let stream = self.stream.as_mut().ok_or("not connected")?;
        stream
            .write_all(&self.out)
            .await
            .map_err(|err| format!("sending: {err}"))?;
        let (status, framing) = self.read_head().await?;
        let body = self.read_body(framing).await?;
        Ok((status, body))
    }

    /// Read more from the socket into `read`; an error when the server closed it.
    async fn fill(&mut self) -> Result<(), String> {
        use tokio::io::AsyncReadExt as _;
        let stream = self.stream.as_mut().ok_or("not connected")?;
        if self.read.capacity() - self.read.len() < 4096 {
            self.read.reserve(16 * 1024);
        }
        let read = stream
            .read_buf(&mut self.read)
            .await
            .map_err(|err| format!("reading the answer: {err}"))?;
        if read == 0 {
            return Err("the server closed the connection".into());
        }
        Ok(())
    }

    /// The answer's status and how its body is framed; the head is consumed from `read`.
    async fn read_head(&mut self) -> Result<(u16, Framing), String> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.read) {
                Ok(httparse::Status::Complete(head_len)) => {
                    let status = response.code.ok_or("an answer without a status")?;
                    let mut framing = Framing::Length(0);
                    for header in response.headers.iter() {
                        if header.name.eq_ignore_ascii_case("content-length") {
                            let length = std::str::from_utf8(header.value)
                                .ok()
                                .and_then(|text| text.trim().parse::<usize>().ok())
                                .ok_or("an unreadable Content-Length")?;
                            framing = Framing::Length(length);
                        } else if header.name.eq_ignore_ascii_case("transfer-encoding")
                            && header.value.eq_ignore_ascii_case(b"chunked")
                        {
                            framing = Framing::Chunked;
                        }
                    }
                    let _ = self.read.split_to(head_len);
                    return Ok((status, framing));
                }
                Ok(httparse::Status::Partial) if self.read.len() < MAX_HEAD_BYTES => {
                    self.fill().await?;
                }
                Ok(httparse::Status::Partial) => return Err("an answer head too long".into()),
                Err(err) => return Err(format!("a malformed answer: {err}")),
            }
        }
    }

    async fn read_body(&mut self, framing: Framing) -> Result<Bytes, String> {
        match framing {
            Framing::Length(length) => {
                while self.read.len() < length {
                    self.fill().await?;
                }
                Ok(self.read.split_to(length).freeze())
            }
            Framing::Chunked => {
                let mut body = bytes::BytesMut::new();
                loop {
                    let line_end = loop {
                        if let Some(at) = find(&self.read, b"\r\n") {
                            break at;
                        }
                        self.fill().await?;
                    };
                    let size_text = std::str::from_utf8(&self.read[..line_end])
                        .map_err(|_| "an unreadable chunk size")?;
                    let size_text = size_text.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(size_text, 16)
                        .map_err(|_| format!("an unreadable chunk size {size_text:?}"))?;
                    let _ = self.read.split_to(line_end + 2);
                    // The chunk and its CRLF (after the last chunk: the empty trailer's CRLF).
                    while self.read.len() < size + 2 {
                        self.fill().await?;
                    }
                    body.extend_from_slice(&self.read[..size]);
                    let _ = self.read.split_to(size + 2);
                    if size == 0 {
                        return Ok(body.freeze());
                    }
                }
            }
        }
    }
}

/// How an answer's body is delimited.
#[derive(Clone, Copy)]
enum Framing {
    Length(usize),
    Chunked,
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Send a prepared request and read the whole answer (so the connection is reusable); `Err`
/// describes an unexpected status, a body that lacks what it must contain, or a transport error.
pub async fn send(connection: &mut Connection, request: &PreparedRequest) -> Result<Bytes, String> {
    let (status, body) = connection
        .request(
            &request.method,
            &request.uri,
            "application/json",
            &request.body,
        )
        .await?;
    if status != request.expected_status {
        return Err(format!(
            "{} {}: status {status} (expected {}): {}",
            request.method,
            request.uri.path(),
            request.expected_status,
            snippet(&body)
        ));
    }
    if let Some(needle) = request.must_contain {
        if !contains(&body, needle.as_bytes()) {
            return Err(format!(
                "{} {}: the answer lacks {needle:?}: {}",
                request.method,
                request.uri.path(),
                snippet(&body)
            ));
        }
    }
    Ok(body)
}

/// The first 300 characters of a body, for error messages.
pub fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.chars().take(300).collect()
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    count(haystack, needle) > 0
}

/// Non-overlapping occurrences of `needle` in `haystack`.
pub fn count(haystack: &[u8], needle: &[u8]) -> usize {
    if needle.is_empty() || haystack.len() < needle.len() {
        return 0;
    }
    let mut found = 0;
    let mut index = 0;
    while index + needle.len() <= haystack.len() {
        if &haystack[index..index + needle.len()] == needle {
            found += 1;
            index += needle.len();
        } else {
            index += 1;
        }
    }
    found
}

/// `GET /v1/activity/cursor`: the newest change id.
pub async fn change_cursor(client: &Client, base: &Url) -> anyhow::Result<i64> {
    let response = client
        .get(base.join("/v1/activity/cursor")?)
        .send()
        .await
        .context("GET /v1/activity/cursor")?;
    let status = response.status();
    let body = response.bytes().await?;
    if !status.is_success() {
        bail!(
            "GET /v1/activity/cursor: status {status}: {}",
            snippet(&body)
        );
    }
    let value: serde_json::Value =
        serde_json::from_slice(&body).context("GET /v1/activity/cursor: not JSON")?;
    value["changeCursor"]
        .as_i64()
        .with_context(|| format!("GET /v1/activity/cursor: no changeCursor in {value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurrences_are_counted_without_overlap() {
        assert_eq!(count(b"{\"error\":{},{\"error\":{}", b"{\"error\":"), 2);
        assert_eq!(count(b"aaaa", b"aa"), 2);
        assert_eq!(count(b"", b"x"), 0);
        assert!(contains(b"{\"ended\":true}", b"true"));
    }
}
