//! A real server for the tests: a fresh SQLite file, [`flightlog_server::serve`] spawned on
//! `127.0.0.1:0` in the test's runtime, and a plain-HTTP reqwest client pointed at it; with
//! [`Options::grpc`], also the OTLP/gRPC listener ([`flightlog_server::grpc::serve_grpc`]) on a
//! second `127.0.0.1:0` port over the same state.

use std::sync::Arc;
use std::time::Duration;

use flightlog_core::activity::ActivityStore;
use flightlog_core::journal::{EngagementJournal, RetentionConfig};
use flightlog_core::{Clock, ManualClock, SystemClock};
use flightlog_server::grpc::serve_grpc;
use flightlog_server::{serve, AppState, ServeError, ServerConfig};
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The writer identity of every test server's own store.
pub const SERVER_WRITER: &str = "server-under-test";

/// How to build a test server.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Run with a testing clock at 0 (as `serve --manual-clock`).
    pub manual_clock: bool,
    pub config: ServerConfig,
    pub retention: RetentionConfig,
    /// Overrides how far behind the newest change `prune` trims the change log.
    pub change_log_retention: Option<i64>,
    /// Also serve the OTLP/gRPC listener (its address is [`TestServer::grpc_base`]).
    pub grpc: bool,
    /// The kernel send buffer (`SO_SNDBUF`, which the kernel doubles) of the HTTP listener's
    /// connections, set on the listening socket, whose connections inherit it; unset, the
    /// kernel's own, which grows to `net.ipv4.tcp_wmem`'s maximum (4 MiB by default). A small
    /// one keeps what a slow client has not read in the server rather than in the kernel.
    pub send_buffer: Option<u32>,
}

/// One answer: status, headers and the body as JSON (`Null` when empty).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    /// The `error.code` of an error body.
    pub fn code(&self) -> Option<&str> {
        self.body.pointer("/error/code").and_then(Value::as_str)
    }

    /// Assert an error answer: the status, the code, and a non-empty message.
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status.as_u16(), status, "{:?}", self.body);
        assert_eq!(self.code(), Some(code), "{:?}", self.body);
        let message = self.body.pointer("/error/message").and_then(Value::as_str);
        assert!(message.is_some_and(|m| !m.is_empty()), "{:?}", self.body);
        let object = self.body.as_object().map(|o| o.len());
        assert_eq!(object, Some(1), "the error body has only `error`");
    }

    /// Assert a status.
    #[track_caller]
    pub fn assert_status(&self, status: u16) -> &Value {
        assert_eq!(self.status.as_u16(), status, "{:?}", self.body);
        &self.body
    }
}

/// A running server and a client for it.
pub struct TestServer {
    pub base: String,
    /// `http://127.0.0.1:PORT` of the OTLP/gRPC listener, when [`Options::grpc`] asked for one.
    pub grpc_base: Option<String>,
    pub client: reqwest::Client,
    pub clock: Option<Arc<ManualClock>>,
    /// The server's state (for what runs beside the routes, such as the scheduled maintenance).
    pub state: AppState,
    /// The server's database file.
    pub db_path: std::path::PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
    grpc_shutdown: Option<oneshot::Sender<()>>,
    grpc_task: Option<JoinHandle<Result<(), ServeError>>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// A server with default options.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// A server whose write limit is 0: every write gets `503 unavailable` (after a 1 ms wait).
    pub async fn start_refusing_writes() -> Self {
        Self::start_with(Options {
            config: ServerConfig {
                max_inflight_writes: 0,
                write_wait: std::time::Duration::from_millis(1),
                ..ServerConfig::default()
            },
            ..Options::default()
        })
        .await
    }

    /// A server over a fresh database file.
    pub async fn start_with(options: Options) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let db_path = dir.path().join("flightlog.db");
        let mut sqlite = SqliteConfig::new(&db_path);
        if let Some(retention) = options.change_log_retention {
            sqlite.change_log_retention = retention;
        }
        let db = SqliteDatabase::open(sqlite).expect("open database");
        let manual = options.manual_clock.then(|| Arc::new(ManualClock::new(0)));
        let clock: Arc<dyn Clock> = match &manual {
            Some(clock) => clock.clone(),
            None => Arc::new(SystemClock),
        };
        let activity: Arc<dyn ActivityStore> = Arc::new(SqliteActivityStore::with_identity(
            Arc::clone(&db),
            Arc::clone(&clock),
            SERVER_WRITER,
        ));
        let journal: Arc<dyn EngagementJournal> =
            Arc::new(SqliteEngagementJournal::new(db, options.retention).with_clock(clock));
        let grpc_listener = match options.grpc {
            true => Some(
                tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind 127.0.0.1:0 for gRPC"),
            ),
            false => None,
        };
        let config = ServerConfig {
            grpc_listening_on: grpc_listener
                .as_ref()
                .map(|grpc_listener| grpc_listener.local_addr().expect("gRPC local addr")),
            ..options.config
        };
        let listener = listen_on_loopback(options.send_buffer);
        let addr = listener.local_addr().expect("local addr");
        let config = ServerConfig {
            http_listening_on: Some(addr),
            ..config
        };
        let mut state = AppState::new(activity, journal).with_config(config);
        if let Some(clock) = &manual {
            state = state.with_manual_clock(Arc::clone(clock));
        }
        let (grpc_base, grpc_shutdown, grpc_task) = if let Some(grpc_listener) = grpc_listener {
            let grpc_addr = grpc_listener.local_addr().expect("gRPC local addr");
            let (grpc_shutdown, grpc_signal) = oneshot::channel::<()>();
            let grpc_task = tokio::spawn(serve_grpc(grpc_listener, state.clone(), async move {
                let _ = grpc_signal.await;
            }));
            (
                Some(format!("http://{grpc_addr}")),
                Some(grpc_shutdown),
                Some(grpc_task),
            )
        } else {
            (None, None, None)
        };
        let (shutdown, signal) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, state.clone(), async move {
            let _ = signal.await;
        }));
        Self {
            base: format!("http://{addr}"),
            grpc_base,
            // No proxy from the environment (a CI reaching the registries through one would
            // otherwise send these loopback requests to it).
            client: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
            clock: manual,
            state,
            db_path,
            shutdown: Some(shutdown),
            task: Some(task),
            grpc_shutdown,
            grpc_task,
            _dir: dir,
        }
    }

    /// Send a request; `body` is sent as JSON when given, `writer` as `Flightlog-Writer`.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        writer: Option<&str>,
    ) -> Reply {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(writer) = writer {
            request = request.header("Flightlog-Writer", writer);
        }
        let response = request.send().await.expect("request");
        read_reply(response).await
    }

    /// Send a request with `headers` added as given (a name may repeat: each is a header line
    /// of its own); `body` is sent as JSON when given.
    pub async fn send_with_headers(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        read_reply(request.send().await.expect("request")).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::POST, path, Some(body), None).await
    }

    /// A POST without any body.
    pub async fn post_empty(&self, path: &str) -> Reply {
        self.send(Method::POST, path, None, None).await
    }

    /// Send raw bytes with an optional content type.
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Reply {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .body(body);
        if let Some(content_type) = content_type {
            request = request.header("Content-Type", content_type);
        }
        read_reply(request.send().await.expect("request")).await
    }

    /// Stop the server gracefully and check it stopped cleanly.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(shutdown) = self.grpc_shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.grpc_task.take() {
            let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), task)
                .await
                .expect("the gRPC listener stops within 10 s of its shutdown signal");
            outcome
                .expect("gRPC server task")
                .expect("serve_grpc returns Ok");
        }
        if let Some(task) = self.task.take() {
            let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), task)
                .await
                .expect("the server stops within 10 s of its shutdown signal");
            outcome.expect("server task").expect("serve returns Ok");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(shutdown) = self.grpc_shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// A listener on `127.0.0.1:0`, with `send_buffer` as its `SO_SNDBUF` when given.
fn listen_on_loopback(send_buffer: Option<u32>) -> tokio::net::TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_reuseaddr(true).expect("SO_REUSEADDR");
    if let Some(bytes) = send_buffer {
        socket.set_send_buffer_size(bytes).expect("SO_SNDBUF");
    }
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind 127.0.0.1:0");
    socket.listen(1024).expect("listen on 127.0.0.1:0")
}

async fn read_reply(response: reqwest::Response) -> Reply {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("response body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        // As written: serde_json's own `Value` would read an object with its private raw-value
        // key as the JSON in that key's string (see `flightlog_core::json_as_written`).
        flightlog_core::json_as_written::from_slice(&bytes).unwrap_or_else(|err| {
            panic!(
                "{status}: body is not JSON ({err}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    Reply {
        status,
        headers,
        body,
    }
}

/// Percent-encode one path segment (everything but RFC 3986's unreserved characters).
pub fn segment(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The fuzz tests' seeded xorshift64* generator: the same requests on every run, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A number in `low..=high`.
    pub fn range(&mut self, low: usize, high: usize) -> usize {
        low + self.below(high - low + 1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// True `p` times in a hundred.
    pub fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// A fuzz test's seed: `fixed`, or the one in `FLIGHTLOG_FUZZ_SEED` (decimal, or hex with
/// `0x`; not 0) to explore other request sequences; the test prints the seed it used.
pub fn fuzz_seed(fixed: u64) -> u64 {
    let Ok(text) = std::env::var("FLIGHTLOG_FUZZ_SEED") else {
        return fixed;
    };
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    // A xorshift generator seeded with 0 only ever yields 0.
    match parsed {
        Ok(seed) if seed != 0 => seed,
        _ => panic!("FLIGHTLOG_FUZZ_SEED {text:?} is not a non-zero u64"),
    }
}

/// Fail with the first 40 of a fuzz run's `failures`, if it has any.
pub fn assert_no_fuzz_failures(failures: &[String], sent: usize) {
    assert!(
        failures.is_empty(),
        "{} problems in {sent} requests:\n{}",
        failures.len(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The contract's codes for an error status.
fn codes_for(status: u16) -> &'static [&'static str] {
    match status {
        400 => &["invalid_request"],
        404 => &["not_found"],
        405 => &["method_not_allowed"],
        409 => &["conflict", "journal_full"],
        413 => &["payload_too_large"],
        415 => &["unsupported_media_type"],
        _ => &[],
    }
}

/// Why `body` is not the contract's error body for `status` (`{"error": {"code", "message"}}`
/// with the status's code and a non-empty message), if it is not.
pub fn contract_error_problem(status: u16, body: &Value) -> Option<String> {
    let Some(error) = body
        .as_object()
        .filter(|object| object.len() == 1)
        .and_then(|object| object.get("error"))
        .and_then(Value::as_object)
    else {
        return Some("the error body is not an object with only `error`".into());
    };
    let code = error.get("code").and_then(Value::as_str);
    let message = error.get("message").and_then(Value::as_str);
    if error.len() != 2 || message.is_none_or(str::is_empty) {
        return Some("`error` is not exactly a code and a non-empty message".into());
    }
    let expected = codes_for(status);
    match code {
        Some(code) if expected.contains(&code) => None,
        _ => Some(format!(
            "status {status} with code {code:?}; the contract says {expected:?}"
        )),
    }
}

/// `google.rpc.Status`, the error body of a protobuf OTLP/HTTP request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// The status code of a raw HTTP/1.1 answer's status line (`HTTP/1.1 503 …`).
pub fn status_line_code(answer: &[u8]) -> u16 {
    let answer = String::from_utf8_lossy(answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"))
}

/// How long a raw-socket answer may take before it counts as none.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Read one answer (head and `Content-Length` body) from `stream`; its status.
pub async fn read_answer(stream: &mut TcpStream) -> Option<u16> {
    read_answer_head(stream).await.map(|(status, _)| status)
}

/// Read one answer from `stream`; its status and its head, lower-cased.
pub async fn read_answer_head(stream: &mut TcpStream) -> Option<(u16, String)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                let status = head.split_whitespace().nth(1)?.parse().ok()?;
                return Some((status, head));
            }
        }
        let read = tokio::time::timeout(ANSWER_TIMEOUT, stream.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}
