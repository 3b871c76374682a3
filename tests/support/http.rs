//! One JSON request to a real server over a plain TCP connection, for the process-level tests
//! that only need a status and a JSON body (`restart_sweep.rs`, `binary_settings.rs`,
//! `foreign_lock.rs`, `restart_streams.rs`): no HTTP
//! client crate, so what goes on the wire is exactly what is written here.
//!
//! Included with `#[path]` by the tests that use it rather than from `support/mod.rs`, so the
//! tests that do not use it have no unused function.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// `method path` on its own connection (`Connection: close`), as `writer` (`Flightlog-Writer`)
/// when given, with `body` as JSON when given: the status and the JSON body (`Null` when there
/// is none).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    writer: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let (status, _head, body) = request_with_head(addr, method, path, writer, body);
    (status, body)
}

/// [`request`], also returning the answer's status line and headers as text.
#[allow(dead_code)]
pub fn request_with_head(
    addr: SocketAddr,
    method: &str,
    path: &str,
    writer: Option<&str>,
    body: Option<Value>,
) -> (u16, String, Value) {
    try_request_with_head(addr, method, path, writer, body)
        .unwrap_or_else(|error| panic!("{method} {path} at {addr}: {error}"))
}

/// [`request_with_head`], with a failed connection (a server that is not there, or went away
/// before it answered) as an error, for tests that go on writing across a server's restart.
pub fn try_request_with_head(
    addr: SocketAddr,
    method: &str,
    path: &str,
    writer: Option<&str>,
    body: Option<Value>,
) -> io::Result<(u16, String, Value)> {
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(writer) = writer {
        head.push_str(&format!("Flightlog-Writer: {writer}\r\n"));
    }
    if !payload.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!(
        "Content-Length: {}\r\n\r\n{payload}",
        payload.len()
    ));
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(head.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no status line: {answer:?}")))?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    Ok((
        status,
        head.to_owned(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    ))
}

/// What `GET /metrics` at `addr` says of the sample `name` (the whole series name, labels
/// included when it has any, such as `x_total{route="/a"}`); `None` when absent.
#[allow(dead_code)]
pub fn metric_sample(addr: SocketAddr, name: &str) -> Option<f64> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    let head = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}
