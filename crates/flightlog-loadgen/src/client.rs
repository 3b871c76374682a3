//! The HTTP client side shared by every phase: [`Connection`], one keep-alive HTTP/1.1
//! connection per client task for the measured requests, and a reqwest client (no proxy: the
//! target is always 127.0.0.1) for the small reads the phases use to check what the server
//! stored.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
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
pub struct Connection {
    addr: SocketAddr,
    host: http::HeaderValue,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    pub fn new(addr: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self {
            addr,
            host: http::HeaderValue::from_str(&addr.to_string())?,
            sender: None,
        })
    }

    async fn connect(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            self.sender = Some(self.handshake().await?);
        }
        self.sender
            .as_mut()
            .ok_or_else(|| "not connected".to_owned())
    }

    async fn handshake(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|err| format!("cannot connect to {}: {err}", self.addr))?;
        stream
            .set_nodelay(true)
            .map_err(|err| format!("cannot set TCP_NODELAY: {err}"))?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|err| format!("HTTP/1.1 handshake with {}: {err}", self.addr))?;
        // The connection's driver: it ends when the sender is dropped or the server closes.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
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
        let host = self.host.clone();
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let sender = self.connect().await?;
            sender
                .ready()
                .await
                .map_err(|err| format!("the connection closed: {err}"))?;
            let mut builder = Request::builder()
                .method(method.clone())
                .uri(uri.clone())
                .header(HOST, host);
            if !body.is_empty() {
                builder = builder.header(CONTENT_TYPE, content_type);
            }
            let request = builder
                .body(Full::new(body.clone()))
                .map_err(|err| format!("cannot build the request: {err}"))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|err| format!("{err}"))?;
            let status = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|err| format!("reading the body: {err}"))?
                .to_bytes();
            Ok::<_, String>((status, body))
        })
        .await;
        let result = match outcome {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        };
        if result.is_err() {
            self.sender = None;
        }
        result.map_err(|err| format!("{method} {}: {err}", uri.path()))
    }
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
