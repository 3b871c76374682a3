//! Real OpenTelemetry clients against a real server: the OpenTelemetry Python SDK with its
//! OTLP/HTTP protobuf exporter and with its gRPC exporter, and the OpenTelemetry JavaScript SDK
//! with its OTLP/HTTP JSON exporter, each run as a subprocess (`tests/otlp-clients/`) that sends
//! one agent-shaped trace (agent → model calls with usage → tool calls, an error span, span
//! events). The test then reads the run back through the API and checks kinds, tree, outcomes,
//! usage, cost (from the bundled price table) and events; and, with auth on, that an exporter
//! without a valid token is refused and stores nothing, while Bearer and Basic tokens work.
//! The Python SDK's metric and log exporters too (`send_signals.py`): their exports succeed
//! without a warning, though flightlog keeps traces only.
//!
//! The clients are installed by `tests/otlp-clients/install.sh` (a Python venv and
//! `node_modules`, pinned), which `.ci/run` runs before `cargo test`. This file runs it too, once
//! per test process, so a plain `cargo test` installs them on a fresh machine that reaches the
//! registries; when that fails the tests FAIL with the installer's output and how to install by
//! hand (they never skip). The venv lives in `$FLIGHTLOG_OTLP_CLIENTS_DIR` if set, else in
//! `<cargo target dir>/otlp-clients` (derived from `CARGO_TARGET_TMPDIR`, so a custom
//! `CARGO_TARGET_DIR` works), the same place the installer picks from `CARGO_TARGET_DIR`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use flightlog_server::{AuthConfig, Scope, Scopes, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::{segment, Options, TestServer};

/// The model every client's `chat` spans name (priced in the bundled table).
const MODEL: &str = "gpt-4o-mini";
/// The status message of the failing tool span (see the clients).
const ERROR_MESSAGE: &str = "search_flights failed: upstream fare index unavailable";
/// The exception message of the exception event on the failing tool span.
const EXCEPTION_MESSAGE: &str = "upstream fare index unavailable";
/// Token counts of the two `chat` spans, as the clients send them.
const CHAT1_TOKENS: (i64, i64) = (1200, 80);
const CHAT2_TOKENS: (i64, i64) = (1500, 120);
/// The bundled price table the server computes costs from.
const PRICES: &str = include_str!("../../../flightlog-otlp/src/prices.json");

/// One client run may take this long (interpreter start, SDK import, export, shutdown).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// A fresh install (venv + pip + npm ci) may take this long.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the exported run may take to show up complete through the API.
const READ_BACK_WITHIN: Duration = Duration::from_secs(10);

const HOW_TO_INSTALL: &str = "the real-client OTLP tests need the OpenTelemetry clients: run \
     `bash tests/otlp-clients/install.sh` from the workspace root (it needs python3 >= 3.9 with \
     venv, node >= 20.6 and npm, and access to PyPI and the npm registry); set \
     FLIGHTLOG_OTLP_CLIENTS_DIR to use a venv elsewhere than <target dir>/otlp-clients";

// ---------------------------------------------------------------------------------------------
// Installing and running the clients
// ---------------------------------------------------------------------------------------------

fn clients_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/otlp-clients")
}

/// Where the installer keeps the venv: the env override, else `<target dir>/otlp-clients`.
fn clients_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLIGHTLOG_OTLP_CLIENTS_DIR") {
        return PathBuf::from(dir);
    }
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(tmp).join("otlp-clients")
}

/// The installed clients.
#[derive(Debug)]
struct Clients {
    python: PathBuf,
    python_script: PathBuf,
    js_dir: PathBuf,
}

/// The installed clients, installing them (once per process) when needed. Panics, saying how
/// to install, when that fails.
fn clients() -> &'static Clients {
    static CLIENTS: OnceLock<Result<Clients, String>> = OnceLock::new();
    match CLIENTS.get_or_init(install) {
        Ok(clients) => clients,
        Err(message) => panic!("{message}\n\n{HOW_TO_INSTALL}"),
    }
}

/// Run `install.sh` (a no-op, about half a second, when its stamps are current).
fn install() -> Result<Clients, String> {
    let source = clients_source();
    let dir = clients_dir();
    let mut command = Command::new("bash");
    command
        .arg(source.join("install.sh"))
        .env("FLIGHTLOG_OTLP_CLIENTS_DIR", &dir);
    let started = Instant::now();
    let ran = run_with_timeout(command, INSTALL_TIMEOUT, "tests/otlp-clients/install.sh")
        .map_err(|error| format!("could not run tests/otlp-clients/install.sh: {error}"))?;
    if !ran.succeeded() {
        return Err(format!(
            "tests/otlp-clients/install.sh failed ({}) after {:.1?}\n--- stdout\n{}\n--- stderr\n{}",
            ran.describe_status(),
            started.elapsed(),
            ran.stdout,
            ran.stderr
        ));
    }
    let clients = Clients {
        python: dir.join("venv/bin/python"),
        python_script: source.join("python/send_trace.py"),
        js_dir: source.join("js"),
    };
    if !clients.python.exists() || !clients.js_dir.join("node_modules").exists() {
        return Err(format!(
            "install.sh succeeded but {} or {} is missing\n--- stderr\n{}",
            clients.python.display(),
            clients.js_dir.join("node_modules").display(),
            ran.stderr
        ));
    }
    Ok(clients)
}

/// A finished (or killed) subprocess.
#[derive(Debug)]
struct Ran {
    /// `None` when it was killed on timeout.
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn succeeded(&self) -> bool {
        self.status.is_some_and(|status| status.success())
    }

    fn describe_status(&self) -> String {
        match self.status {
            Some(status) => status.to_string(),
            None => "killed: timed out".to_owned(),
        }
    }
}

/// Run `command` with stdout and stderr captured (in temp files: no pipe can fill up), killing
/// it when it runs longer than `timeout`. It runs in a process group of its own, and a timeout
/// kills that whole group, so no grandchild (pip, npm, an exporter's helper) outlives it.
fn run_with_timeout(mut command: Command, timeout: Duration, what: &str) -> std::io::Result<Ran> {
    let mut stdout = tempfile::tempfile()?;
    let mut stderr = tempfile::tempfile()?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout.try_clone()?))
        .stderr(Stdio::from(stderr.try_clone()?))
        .process_group(0);
    let mut child = command.spawn()?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            eprintln!("{what}: still running after {timeout:?}, killing its process group");
            let group = format!("-{}", child.id());
            let killed = Command::new("kill")
                .args(["-KILL", "--", &group])
                .status()
                .is_ok_and(|status| status.success());
            if !killed {
                child.kill()?;
            }
            child.wait()?;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Ran {
        status,
        stdout: read_all(&mut stdout)?,
        stderr: read_all(&mut stderr)?,
    })
}

fn read_all(file: &mut File) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Which real client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// Python SDK, `opentelemetry-exporter-otlp-proto-http` (http/protobuf), gzip.
    PythonHttp,
    /// The same exporter with its other compression, `deflate`.
    PythonHttpDeflate,
    /// The HTTP exporter, gzip, with the root span never ended (so never exported): an agent
    /// still running, as flightlog sees it.
    PythonHttpRootRunning,
    /// The HTTP exporter, gzip, with `get_weather` a call to a tool server: a second service
    /// (provider and exporter of its own) continuing the trace from the call's `traceparent`,
    /// whose spans are exported before the agent's.
    PythonHttpTwoServices,
    /// Python SDK, `opentelemetry-exporter-otlp-proto-grpc`, gzip.
    PythonGrpc,
    /// JavaScript SDK, `@opentelemetry/exporter-trace-otlp-http` (OTLP/JSON).
    JsHttpJson,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::PythonHttp => "python-http",
            Client::PythonHttpDeflate => "python-http-deflate",
            Client::PythonHttpRootRunning => "python-http-root-running",
            Client::PythonHttpTwoServices => "python-http-two-services",
            Client::PythonGrpc => "python-grpc",
            Client::JsHttpJson => "js-http-json",
        }
    }

    /// The `gen_ai.conversation.id` the client puts on its root span.
    fn conversation(self) -> &'static str {
        match self {
            Client::PythonHttp
            | Client::PythonHttpDeflate
            | Client::PythonHttpRootRunning
            | Client::PythonHttpTwoServices
            | Client::PythonGrpc => "conv-python-1",
            Client::JsHttpJson => "conv-js-1",
        }
    }

    /// Where this client exports to on `server`.
    fn endpoint(self, server: &TestServer) -> String {
        match self {
            Client::PythonHttp
            | Client::PythonHttpDeflate
            | Client::PythonHttpRootRunning
            | Client::PythonHttpTwoServices
            | Client::JsHttpJson => format!("{}/v1/traces", server.base),
            Client::PythonGrpc => server
                .grpc_base
                .clone()
                .expect("the server was started with `grpc: true`"),
        }
    }
}

/// The credentials a client presents.
#[derive(Debug, Clone)]
enum Credentials {
    None,
    Bearer(String),
    /// The token as the password of `Authorization: Basic`.
    Basic(String),
}

/// What a client reported on its stdout line.
#[derive(Debug)]
struct Sent {
    client: Client,
    service: String,
    trace_id: String,
    agent: String,
    chat1: String,
    chat2: String,
    tool_ok: String,
    tool_error: String,
    /// The tool server's entry span and its model call ([`Client::PythonHttpTwoServices`]).
    callee: Option<String>,
    callee_chat: Option<String>,
    /// Every export call succeeded (as the exporter saw it).
    ok: bool,
    ran: Ran,
}

/// Run `client` against `server` (blocking; call through `spawn_blocking`).
fn run_client(client: Client, endpoint: &str, credentials: &Credentials, service: &str) -> Sent {
    let clients = clients();
    let mut command = match client {
        Client::PythonHttp
        | Client::PythonHttpDeflate
        | Client::PythonHttpRootRunning
        | Client::PythonHttpTwoServices
        | Client::PythonGrpc => {
            let mut command = Command::new(&clients.python);
            command
                .arg(&clients.python_script)
                .arg("--protocol")
                .arg(if client == Client::PythonGrpc {
                    "grpc"
                } else {
                    "http"
                })
                .arg("--compression")
                .arg(if client == Client::PythonHttpDeflate {
                    "deflate"
                } else {
                    "gzip"
                })
                .env("PYTHONDONTWRITEBYTECODE", "1");
            if client == Client::PythonHttpRootRunning {
                command.arg("--root-still-running");
            }
            if client == Client::PythonHttpTwoServices {
                command.arg("--callee-service").arg(TOOL_SERVER_SERVICE);
            }
            command
        }
        Client::JsHttpJson => {
            // The interpreter install.sh installed the packages with (`NODE`, as it reads it).
            let node = std::env::var_os("NODE").filter(|node| !node.is_empty());
            let mut command = Command::new(node.as_deref().unwrap_or("node".as_ref()));
            command
                .current_dir(&clients.js_dir)
                .arg(clients.js_dir.join("send_trace.mjs"));
            command
        }
    };
    command
        .arg("--endpoint")
        .arg(endpoint)
        .arg("--service-name")
        .arg(service);
    match credentials {
        Credentials::None => {}
        Credentials::Bearer(token) => {
            command.arg("--token").arg(token);
        }
        Credentials::Basic(token) => {
            assert_ne!(
                client,
                Client::JsHttpJson,
                "the JS client takes only --token"
            );
            command.arg("--basic-token").arg(token);
        }
    }
    // The clients must talk to this server only: no OTEL_* settings of the environment, and no
    // proxy between them and 127.0.0.1.
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("OTEL_") || key_text.to_ascii_lowercase().ends_with("_proxy") {
            command.env_remove(&key);
        }
    }
    command
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");

    let what = format!("the {} client", client.name());
    let ran = run_with_timeout(command, CLIENT_TIMEOUT, &what)
        .unwrap_or_else(|error| panic!("could not run {what}: {error}"));
    assert!(
        ran.status.is_some(),
        "{what} did not finish within {CLIENT_TIMEOUT:?} and was killed\n--- stdout\n{}\n--- \
         stderr\n{}",
        ran.stdout,
        ran.stderr
    );
    let line = ran
        .stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or_default();
    let report: Value = serde_json::from_str(line).unwrap_or_else(|error| {
        panic!(
            "{what} ({}) printed no JSON report line ({error})\n--- stdout\n{}\n--- stderr\n{}",
            ran.describe_status(),
            ran.stdout,
            ran.stderr
        )
    });
    let text = |pointer: &str| -> String {
        report
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{what}: no {pointer} in its report {report}"))
            .to_owned()
    };
    let ok = report.get("ok").and_then(Value::as_bool) == Some(true);
    Sent {
        client,
        service: service.to_owned(),
        trace_id: text("/traceId"),
        agent: text("/spans/agent"),
        chat1: text("/spans/chat1"),
        chat2: text("/spans/chat2"),
        tool_ok: text("/spans/toolOk"),
        tool_error: text("/spans/toolError"),
        callee: report
            .pointer("/spans/callee")
            .and_then(Value::as_str)
            .map(str::to_owned),
        callee_chat: report
            .pointer("/spans/calleeChat")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ok,
        ran,
    }
}

/// Run `client` against `server` without blocking the server's runtime.
async fn send(
    server: &TestServer,
    client: Client,
    credentials: Credentials,
    service: &str,
) -> Sent {
    let endpoint = client.endpoint(server);
    let service = service.to_owned();
    tokio::task::spawn_blocking(move || run_client(client, &endpoint, &credentials, &service))
        .await
        .expect("the client thread")
}

/// Assert the client's export succeeded.
#[track_caller]
fn assert_exported(sent: &Sent) {
    assert!(
        sent.ok && sent.ran.succeeded(),
        "the {} client's export failed ({})\n--- stdout\n{}\n--- stderr\n{}",
        sent.client.name(),
        sent.ran.describe_status(),
        sent.ran.stdout,
        sent.ran.stderr
    );
}

// ---------------------------------------------------------------------------------------------
// Reading back
// ---------------------------------------------------------------------------------------------

/// `GET path`, with a bearer token when given.
async fn get(server: &TestServer, token: Option<&str>, path: &str) -> (StatusCode, Value) {
    let mut request = server.client.get(format!("{}{path}", server.base));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("GET request");
    let status = response.status();
    let bytes = response.bytes().await.expect("response body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            panic!(
                "GET {path}: {status} body is not JSON ({error}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    (status, body)
}

/// The run's snapshot and rollup, once it shows all `spans` spans ended and its rollup (polled,
/// at most [`READ_BACK_WITHIN`]).
async fn read_run(
    server: &TestServer,
    token: Option<&str>,
    run_id: &str,
    spans: usize,
) -> (Value, Value) {
    let snapshot_path = format!("/v1/activity/runs/{}/snapshot", segment(run_id));
    let rollup_path = format!("/v1/activity/runs/{}/rollup", segment(run_id));
    let deadline = Instant::now() + READ_BACK_WITHIN;
    loop {
        let snapshot = get(server, token, &snapshot_path).await;
        let complete = snapshot.0 == StatusCode::OK
            && snapshot.1["spans"].as_array().is_some_and(|all| {
                all.len() == spans && all.iter().all(|span| !span["outcome"].is_null())
            });
        let rollup = get(server, token, &rollup_path).await;
        if complete && rollup.0 == StatusCode::OK {
            return (snapshot.1, rollup.1);
        }
        assert!(
            Instant::now() < deadline,
            "run {run_id} was not complete ({spans} ended spans and a rollup) within \
             {READ_BACK_WITHIN:?}\nsnapshot: {} {}\nrollup: {} {}",
            snapshot.0,
            snapshot.1,
            rollup.0,
            rollup.1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The price table's version and `(input, output)` USD per million tokens of [`MODEL`].
fn model_price() -> (String, f64, f64) {
    let table: Value = serde_json::from_str(PRICES).expect("prices.json is JSON");
    let version = table["version"]
        .as_str()
        .expect("prices.json has a version")
        .to_owned();
    let price = &table["models"][MODEL];
    let input = price["input"].as_f64().expect("an input price");
    let output = price["output"].as_f64().expect("an output price");
    (version, input, output)
}

/// The cost the price table gives a span with these counts (no cached tokens).
fn expected_cost((input_tokens, output_tokens): (i64, i64)) -> f64 {
    let (_, input, output) = model_price();
    (input_tokens as f64 * input + output_tokens as f64 * output) / 1_000_000.0
}

#[track_caller]
fn assert_cost(actual: &Value, expected: f64, what: &str) {
    let actual = actual
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: costUsd is not a number: {actual}"));
    assert!(actual > 0.0, "{what}: costUsd {actual} is not positive");
    // The server rounds to a nano-dollar.
    assert!(
        (actual - expected).abs() <= 2e-9,
        "{what}: costUsd {actual}, the price table gives {expected}"
    );
}

/// Everything the API shows of one client's trace: the five spans with their kinds, tree,
/// outcomes, usage, cost, attributes and events, and the run's rollup.
fn check_run(sent: &Sent, snapshot: &Value, rollup: &Value) {
    let who = sent.client.name();
    let (price_version, _, _) = model_price();
    let spans = snapshot["spans"].as_array().expect("snapshot spans");
    let events = snapshot["events"].as_array().expect("snapshot events");
    assert_eq!(snapshot["runId"], sent.trace_id.as_str(), "{who}");
    assert_eq!(spans.len(), 5, "{who}: span count: {snapshot}");
    let span = |id: &str| -> &Value {
        spans
            .iter()
            .find(|span| span["spanId"] == id)
            .unwrap_or_else(|| panic!("{who}: span {id} is not in the snapshot: {snapshot}"))
    };
    let agent = span(&sent.agent);
    let chats = [
        (span(&sent.chat1), CHAT1_TOKENS, "chat1"),
        (span(&sent.chat2), CHAT2_TOKENS, "chat2"),
    ];
    let tool_ok = span(&sent.tool_ok);
    let tool_error = span(&sent.tool_error);

    // Every span: the run, origin, writer, resource, scope, an end after its start.
    for span in spans {
        let id = span["spanId"].as_str().unwrap_or_default();
        assert_eq!(span["runId"], sent.trace_id.as_str(), "{who} {id}");
        assert_eq!(span["origin"], "otlp", "{who} {id}");
        assert_eq!(span["writer"], "otlp", "{who} {id}");
        assert_eq!(
            span["attrs"]["resource"]["service.name"],
            sent.service.as_str(),
            "{who} {id}: attrs.resource: {span}"
        );
        assert_eq!(
            span["attrs"]["scope"]["name"], "flightlog-otlp-client-test",
            "{who} {id}: attrs.scope: {span}"
        );
        assert_eq!(span["attrs"]["scope"]["version"], "0.1.0", "{who} {id}");
        let started = span["startedAt"].as_i64().expect("startedAt");
        let ended = span["endedAt"].as_i64().expect("an ended span");
        assert!(started > 0 && ended >= started, "{who} {id}: {span}");
    }

    // Kinds and tree: the invoke_agent root is the run's turn; everything else hangs off it.
    assert_eq!(agent["kind"], "turn", "{who}: {agent}");
    assert_eq!(agent["name"], "invoke_agent travel-agent", "{who}");
    assert!(
        agent["parentSpanId"].is_null(),
        "{who}: the agent is the root: {agent}"
    );
    assert_eq!(agent["attrs"]["gen_ai.agent.name"], "travel-agent", "{who}");
    assert_eq!(
        agent["sessionId"],
        sent.client.conversation(),
        "{who}: gen_ai.conversation.id is the session"
    );
    for (chat, _, label) in &chats {
        assert_eq!(chat["kind"], "model", "{who} {label}: {chat}");
        assert_eq!(chat["name"], format!("chat {MODEL}"), "{who} {label}");
        assert_eq!(chat["attrs"]["otel.span_kind"], "client", "{who} {label}");
    }
    for (tool, name) in [(tool_ok, "get_weather"), (tool_error, "search_flights")] {
        assert_eq!(tool["kind"], "tool", "{who}: {tool}");
        assert_eq!(tool["name"], format!("execute_tool {name}"), "{who}");
        assert_eq!(tool["attrs"]["gen_ai.tool.name"], name, "{who}");
        assert_eq!(tool["attrs"]["otel.span_kind"], "internal", "{who}");
    }
    for child in [chats[0].0, chats[1].0, tool_ok, tool_error] {
        assert_eq!(
            child["parentSpanId"],
            sent.agent.as_str(),
            "{who}: every other span is a child of the agent: {child}"
        );
    }

    // Outcomes: the failing tool is `error` with its status message; the rest succeeded.
    assert_eq!(tool_error["outcome"], "error", "{who}: {tool_error}");
    assert_eq!(tool_error["outcomeReason"], ERROR_MESSAGE, "{who}");
    for ok in [agent, chats[0].0, chats[1].0, tool_ok] {
        assert_eq!(ok["outcome"], "success", "{who}: {ok}");
        assert!(ok["outcomeReason"].is_null(), "{who}: {ok}");
    }

    // Usage and cost: on the model spans, priced from the bundled table; none elsewhere.
    for (chat, (input, output), label) in &chats {
        let usage = &chat["usage"];
        assert_eq!(usage["inputTokens"], *input, "{who} {label}: {usage}");
        assert_eq!(usage["outputTokens"], *output, "{who} {label}: {usage}");
        assert_eq!(usage["model"], MODEL, "{who} {label}: {usage}");
        assert_cost(
            &usage["costUsd"],
            expected_cost((*input, *output)),
            &format!("{who} {label}"),
        );
        assert_eq!(
            chat["attrs"]["flightlog.cost_source"], "price_table",
            "{who} {label}"
        );
        assert_eq!(
            chat["attrs"]["flightlog.price_table"],
            price_version.as_str(),
            "{who} {label}"
        );
        assert_eq!(
            chat["attrs"]["gen_ai.request.model"], MODEL,
            "{who} {label}"
        );
    }
    assert_eq!(
        chats[0].0["attrs"]["gen_ai.response.finish_reasons"],
        json!(["tool_calls"]),
        "{who}: an array attribute stays an array"
    );
    for plain in [agent, tool_ok, tool_error] {
        assert_eq!(plain["usage"], json!({}), "{who}: no usage: {plain}");
        assert!(
            plain["attrs"].get("flightlog.cost_source").is_none(),
            "{who}"
        );
    }

    // Events: the exception on the failing tool, the custom event on the first chat.
    let exception = events
        .iter()
        .find(|event| event["spanId"] == sent.tool_error.as_str())
        .unwrap_or_else(|| panic!("{who}: no event on the failing tool span: {events:?}"));
    assert_eq!(exception["eventType"], "exception", "{who}: {exception}");
    let payload = &exception["payload"];
    assert_eq!(
        payload["exception.type"], "ConnectionError",
        "{who}: {payload}"
    );
    assert_eq!(
        payload["exception.message"], EXCEPTION_MESSAGE,
        "{who}: {payload}"
    );
    assert!(
        payload["exception.stacktrace"]
            .as_str()
            .is_some_and(|trace| !trace.is_empty()),
        "{who}: the exception event carries the stack trace: {payload}"
    );
    let custom: Vec<&Value> = events
        .iter()
        .filter(|event| event["spanId"] == sent.chat1.as_str())
        .collect();
    assert_eq!(custom.len(), 1, "{who}: one event on chat1: {events:?}");
    assert_eq!(custom[0]["eventType"], "flightlog.test.checkpoint", "{who}");
    assert_eq!(
        custom[0]["payload"],
        json!({"step": 1, "note": "planning the trip", "cached": false}),
        "{who}: the custom event's attributes are its payload"
    );
    assert_eq!(custom[0]["truncated"], false, "{who}");
    for event in [exception, custom[0]] {
        let owner = span(event["spanId"].as_str().unwrap_or_default());
        let ts = event["ts"].as_i64().expect("event ts");
        assert!(
            ts >= owner["startedAt"].as_i64().unwrap_or(i64::MAX)
                && ts <= owner["endedAt"].as_i64().unwrap_or(i64::MIN),
            "{who}: the event's time is within its span: {event} {owner}"
        );
    }
    assert_eq!(events.len(), 2, "{who}: no other events: {events:?}");

    // The rollup: the root's name and outcome, the model spans' usage summed (the root has
    // none), the cost, the failure reason of the failing tool.
    assert_eq!(rollup["runId"], sent.trace_id.as_str(), "{who}: {rollup}");
    assert_eq!(rollup["origin"], "otlp", "{who}: {rollup}");
    assert_eq!(rollup["name"], "invoke_agent travel-agent", "{who}");
    assert_eq!(rollup["outcome"], "success", "{who}: {rollup}");
    assert_eq!(rollup["spanCount"], 5, "{who}: {rollup}");
    assert_eq!(
        rollup["inputTokens"],
        CHAT1_TOKENS.0 + CHAT2_TOKENS.0,
        "{who}: {rollup}"
    );
    assert_eq!(
        rollup["outputTokens"],
        CHAT1_TOKENS.1 + CHAT2_TOKENS.1,
        "{who}: {rollup}"
    );
    assert_cost(
        &rollup["costUsd"],
        expected_cost(CHAT1_TOKENS) + expected_cost(CHAT2_TOKENS),
        &format!("{who} rollup"),
    );
    assert_eq!(rollup["failureReason"], ERROR_MESSAGE, "{who}: {rollup}");
    assert_eq!(rollup["sessionId"], sent.client.conversation(), "{who}");
    assert_eq!(rollup["detailPruned"], false, "{who}");
}

/// Send with `client`, read the run back, check it all; also `GET /v1/activity/spans/{id}`.
async fn send_and_check(
    server: &TestServer,
    token: Option<&str>,
    client: Client,
    credentials: Credentials,
    service: &str,
) {
    let sent = send(server, client, credentials, service).await;
    assert_exported(&sent);
    let (snapshot, rollup) = read_run(server, token, &sent.trace_id, 5).await;
    check_run(&sent, &snapshot, &rollup);
    let (status, span) = get(
        server,
        token,
        &format!("/v1/activity/spans/{}", segment(&sent.tool_error)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{span}");
    assert_eq!(span["outcome"], "error", "{span}");
    assert_eq!(span["outcomeReason"], ERROR_MESSAGE, "{span}");
}

/// Assert the client's export was refused and nothing of its trace was stored.
async fn assert_refused(server: &TestServer, token: &str, sent: &Sent, sign: &str) {
    let who = sent.client.name();
    assert!(
        !sent.ok && !sent.ran.succeeded(),
        "{who}: the export without a valid token should have failed\n--- stdout\n{}\n--- \
         stderr\n{}",
        sent.ran.stdout,
        sent.ran.stderr
    );
    assert!(
        sent.ran.stderr.contains(sign),
        "{who}: the exporter's log should name the refusal ({sign})\n--- stderr\n{}",
        sent.ran.stderr
    );
    let (status, body) = get(
        server,
        Some(token),
        &format!("/v1/activity/runs/{}/snapshot", segment(&sent.trace_id)),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "{who}: nothing stored: {body}"
    );
    let (status, body) = get(
        server,
        Some(token),
        &format!("/v1/activity/spans/{}", segment(&sent.agent)),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "{who}: nothing stored: {body}"
    );
}

async fn start_open() -> TestServer {
    TestServer::start_with(Options {
        grpc: true,
        ..Options::default()
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn python_sdk_over_http_protobuf_is_read_back() {
    let server = start_open().await;
    send_and_check(
        &server,
        None,
        Client::PythonHttp,
        Credentials::None,
        "flightlog-test-python-http",
    )
    .await;
    server.stop().await;
}

/// The SDK exports a span when it ends: while an agent runs, its model and tool calls arrive and
/// its root does not. The run is listed open, waiting for its root, with the usage and cost of
/// its model calls so far (it was not listed at all before its root ended).
#[tokio::test]
async fn a_python_agent_still_running_is_listed_open_with_its_usage_so_far() {
    let server = start_open().await;
    let sent = send(
        &server,
        Client::PythonHttpRootRunning,
        Credentials::None,
        "flightlog-test-python-running",
    )
    .await;
    assert_exported(&sent);
    let deadline = Instant::now() + READ_BACK_WITHIN;
    let run = loop {
        let (status, page) = get(&server, None, "/v1/activity/runs?state=open").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let found = page["runs"]
            .as_array()
            .and_then(|runs| {
                runs.iter()
                    .find(|run| run["runId"] == sent.trace_id.as_str())
            })
            .cloned();
        match found {
            Some(run) if run["spanCount"] == 4 => break run,
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "the run is not listed open: {page}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(run["awaitingRoot"], true, "{run}");
    assert_eq!(run["state"], "open", "{run}");
    assert_eq!(
        run["name"],
        format!("chat {MODEL}"),
        "its earliest span: {run}"
    );
    assert_eq!(run["inputTokens"], 2_700, "{run}");
    assert_eq!(run["outputTokens"], 200, "{run}");
    assert_cost(
        &run["costUsd"],
        expected_cost((2_700, 200)),
        "the running run",
    );
    let (status, agent) = get(&server, None, &format!("/v1/activity/spans/{}", sent.agent)).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the root was never exported: {agent}"
    );
    server.stop().await;
}

/// The tool server's `service.name` in [`Client::PythonHttpTwoServices`].
const TOOL_SERVER_SERVICE: &str = "flightlog-test-weather-service";

/// An agent calls a tool server that continues its trace from the call's `traceparent` (the
/// SDK flags that parent as remote); the tool server's spans end, and are exported, first. The
/// run is one tree: the tool server's entry span under the agent's tool call, as a subagent,
/// with one root and one rollup counting every model call once.
#[tokio::test]
async fn a_tool_server_continuing_the_agents_trace_is_one_tree_with_the_agent() {
    let server = start_open().await;
    let sent = send(
        &server,
        Client::PythonHttpTwoServices,
        Credentials::None,
        "flightlog-test-python-two-services",
    )
    .await;
    assert_exported(&sent);
    let (callee, callee_chat) = (
        sent.callee.clone().expect("the tool server's entry span"),
        sent.callee_chat
            .clone()
            .expect("the tool server's model call"),
    );
    let (snapshot, rollup) = read_run(&server, None, &sent.trace_id, 7).await;
    let spans = snapshot["spans"].as_array().cloned().unwrap_or_default();
    let span = |id: &str| -> Value {
        spans
            .iter()
            .find(|span| span["spanId"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("span {id} in {snapshot}"))
    };
    let entry = span(&callee);
    assert_eq!(entry["parentSpanId"], sent.tool_ok.as_str(), "{entry}");
    assert_eq!(entry["kind"], "subagent", "{entry}");
    assert_eq!(
        entry["attrs"]["flightlog.remote_parent_span_id"],
        sent.tool_ok.as_str()
    );
    assert_eq!(
        entry["attrs"]["resource"]["service.name"], TOOL_SERVER_SERVICE,
        "{entry}"
    );
    assert_eq!(span(&callee_chat)["parentSpanId"], callee.as_str());
    let roots: Vec<&Value> = spans
        .iter()
        .filter(|span| span["parentSpanId"].is_null())
        .collect();
    assert_eq!(roots.len(), 1, "{snapshot}");
    assert_eq!(roots[0]["spanId"], sent.agent.as_str(), "{snapshot}");
    assert_eq!(rollup["name"], "invoke_agent travel-agent", "{rollup}");
    assert_eq!(rollup["spanCount"], 7, "{rollup}");
    assert_eq!(rollup["inputTokens"], 1_200 + 1_500 + 300, "{rollup}");
    assert_eq!(rollup["outputTokens"], 80 + 120 + 30, "{rollup}");
    assert_cost(
        &rollup["costUsd"],
        expected_cost((3_000, 230)),
        "the two services' model calls",
    );
    server.stop().await;
}

#[tokio::test]
async fn python_sdk_over_grpc_is_read_back() {
    let server = start_open().await;
    send_and_check(
        &server,
        None,
        Client::PythonGrpc,
        Credentials::None,
        "flightlog-test-python-grpc",
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn javascript_sdk_over_http_json_is_read_back() {
    let server = start_open().await;
    send_and_check(
        &server,
        None,
        Client::JsHttpJson,
        Credentials::None,
        "flightlog-test-js-http-json",
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn with_auth_on_exporters_need_a_valid_token_as_bearer_or_basic() {
    const TOKEN: &str = "otlp-clients-test-token";
    let scopes: Scopes = [Scope::Read, Scope::Ingest].into_iter().collect();
    let auth = AuthConfig::open()
        .with_token(TOKEN, scopes)
        .expect("a valid token");
    let server = TestServer::start_with(Options {
        grpc: true,
        config: ServerConfig {
            auth,
            ..ServerConfig::default()
        },
        ..Options::default()
    })
    .await;

    // Refused: no token over OTLP/HTTP (401), a wrong token over gRPC (UNAUTHENTICATED).
    let (no_token, wrong_token) = tokio::join!(
        send(
            &server,
            Client::PythonHttp,
            Credentials::None,
            "flightlog-test-no-token"
        ),
        send(
            &server,
            Client::PythonGrpc,
            Credentials::Bearer("not-the-token".to_owned()),
            "flightlog-test-wrong-token"
        ),
    );
    assert_refused(&server, TOKEN, &no_token, "401").await;
    assert_refused(&server, TOKEN, &wrong_token, "UNAUTHENTICATED").await;

    // Admitted: Bearer over OTLP/HTTP and gRPC, Basic (the token as password) over OTLP/HTTP with
    // deflate compression, and Bearer from the JavaScript exporter.
    let token = Some(TOKEN);
    tokio::join!(
        send_and_check(
            &server,
            token,
            Client::PythonHttp,
            Credentials::Bearer(TOKEN.to_owned()),
            "flightlog-test-bearer-http",
        ),
        send_and_check(
            &server,
            token,
            Client::PythonGrpc,
            Credentials::Bearer(TOKEN.to_owned()),
            "flightlog-test-bearer-grpc",
        ),
        send_and_check(
            &server,
            token,
            Client::PythonHttpDeflate,
            Credentials::Basic(TOKEN.to_owned()),
            "flightlog-test-basic-http-deflate",
        ),
        send_and_check(
            &server,
            token,
            Client::JsHttpJson,
            Credentials::Bearer(TOKEN.to_owned()),
            "flightlog-test-bearer-js",
        ),
    );
    server.stop().await;
}

/// The Python SDK's stock metric and log exporters (OTLP/HTTP with gzip, and gRPC), pointed at
/// the server as an agent left at the SDK's defaults would be: every export succeeds and the
/// SDK logs no warning (a 404 made it log a failed export each time), and the server counts
/// what it read without storing it.
#[tokio::test]
async fn python_sdk_metrics_and_logs_exports_succeed_without_a_warning() {
    let server = start_open().await;
    let clients = clients();
    for (protocol, endpoint) in [
        ("http", server.base.clone()),
        ("grpc", server.grpc_base.clone().expect("the gRPC listener")),
    ] {
        let mut command = Command::new(&clients.python);
        command
            .arg(clients_source().join("python/send_signals.py"))
            .arg("--protocol")
            .arg(protocol)
            .arg("--endpoint")
            .arg(&endpoint)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env("no_proxy", "127.0.0.1,localhost");
        for (key, _) in std::env::vars_os() {
            let key_text = key.to_string_lossy();
            if key_text.starts_with("OTEL_") || key_text.to_ascii_lowercase().ends_with("_proxy") {
                command.env_remove(&key);
            }
        }
        let ran = tokio::task::spawn_blocking(move || {
            run_with_timeout(command, CLIENT_TIMEOUT, "send_signals.py")
        })
        .await
        .expect("the client thread")
        .expect("run send_signals.py");
        let report: Value = ran
            .stdout
            .lines()
            .rev()
            .find(|line| !line.trim().is_empty())
            .and_then(|line| serde_json::from_str(line).ok())
            .unwrap_or(Value::Null);
        assert!(
            ran.succeeded() && report["ok"] == true,
            "{protocol}: {} {report}\n--- stderr\n{}",
            ran.describe_status(),
            ran.stderr
        );
    }
    let metrics = crate::metrics::scrape(&server).await;
    for signal in ["metrics", "logs"] {
        let counted = metrics
            .get(&format!(
                r#"flightlog_otlp_not_stored_total{{signal="{signal}"}}"#
            ))
            .unwrap_or(0.0);
        assert!(counted >= 2.0, "{signal}: {counted}");
    }
    let (status, body) = get(&server, None, "/v1/activity/cursor").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["changeCursor"], 0, "nothing stored");
    server.stop().await;
}
