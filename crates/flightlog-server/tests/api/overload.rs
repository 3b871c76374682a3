//! The write limit on a real server: with every write slot held, each write endpoint answers
//! `503 unavailable` with `Retry-After: 1` after its short wait while reads go on; the held writes
//! then complete and are stored, and writes are accepted again.
//!
//! A slot is held the way a real overload holds it: by writes the store has not finished. A
//! connection of the test's own holds the database's write lock (`BEGIN IMMEDIATE`, as a second
//! process writing the same file would), so the server's writer waits for it and the writes
//! handed to it keep their slots until the test lets the lock go. (A write whose body has not
//! arrived holds no slot: see `tests/connections.rs` at the root.)

use std::time::Duration;

use flightlog_server::ServerConfig;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::{Options, TestServer};

/// The database's write lock, held by a connection of the test's own until dropped.
struct ForeignWriteLock {
    conn: rusqlite::Connection,
}

impl ForeignWriteLock {
    fn take(server: &TestServer) -> Self {
        let conn = rusqlite::Connection::open(&server.db_path).expect("open the server's file");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("take the write lock");
        Self { conn }
    }

    fn release(self) {
        self.conn
            .execute_batch("ROLLBACK")
            .expect("let the lock go");
    }
}

/// A span start sent in the background: its status once answered.
fn held_write(server: &TestServer, span_id: &str) -> JoinHandle<u16> {
    let client = server.client.clone();
    let url = format!("{}/v1/activity/spans", server.base);
    let body = json!({"spanId": span_id, "runId": "held", "name": "held", "kind": "turn",
                      "origin": "session", "startedAt": 1});
    tokio::spawn(async move {
        let reply = client.post(url).json(&body).send().await.expect("answered");
        reply.status().as_u16()
    })
}

#[tokio::test]
async fn writes_get_503_with_retry_after_while_every_write_slot_is_held() {
    tokio::time::timeout(Duration::from_secs(30), scenario())
        .await
        .expect("the overload scenario finishes within 30 s");
}

async fn scenario() {
    let server = TestServer::start_with(Options {
        config: ServerConfig {
            max_inflight_writes: 2,
            write_wait: Duration::from_millis(50),
            ..ServerConfig::default()
        },
        ..Options::default()
    })
    .await;
    let lock = ForeignWriteLock::take(&server);
    let held = [held_write(&server, "held-1"), held_write(&server, "held-2")];

    // The held writes take their slots as soon as their bodies are here, and keep them while
    // the writer waits for the lock.
    let mut probes = 0;
    loop {
        let metrics = crate::metrics::scrape(&server).await;
        if metrics.get("flightlog_http_writes_in_flight") == Some(2.0) {
            break;
        }
        probes += 1;
        assert!(probes < 200, "the held writes never took their slots");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let writes: [(Method, &str, Option<Value>); 6] = [
        (
            Method::POST,
            "/v1/activity/spans",
            Some(
                json!({"spanId": "late", "runId": "late", "name": "late", "kind": "turn",
                        "origin": "session"}),
            ),
        ),
        (
            Method::POST,
            "/v1/activity/batch",
            Some(json!({"ops": [{"op": "heartbeat", "spanId": "nobody"}]})),
        ),
        (
            Method::PATCH,
            "/v1/activity/spans/held-1",
            Some(json!({"attrs": {}})),
        ),
        (
            Method::POST,
            "/v1/engagements/e1/events",
            Some(json!({"type": "note", "at": 1, "data": {}})),
        ),
        (Method::POST, "/v1/activity/maintenance/sweep-orphans", None),
        (
            Method::POST,
            "/v1/engagements/prune",
            Some(json!({"now": 0})),
        ),
    ];
    for (method, path, body) in &writes {
        let reply = server.send(method.clone(), path, body.as_ref(), None).await;
        reply.assert_error(503, "unavailable");
        let retry_after = reply
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok());
        assert_eq!(retry_after, Some("1"), "{method} {path}");
    }
    // Reads take no slot.
    server.get("/v1/activity/cursor").await.assert_status(200);
    server.get("/healthz").await.assert_status(200);

    // The held writes complete and are stored: nothing acknowledged is lost.
    lock.release();
    for write in held {
        assert_eq!(write.await.expect("the write's task"), 201);
    }
    for span in ["held-1", "held-2"] {
        let reply = server.get(&format!("/v1/activity/spans/{span}")).await;
        assert_eq!(reply.assert_status(200)["spanId"], span);
    }
    // The late span was refused before anything was written.
    server
        .get("/v1/activity/spans/late")
        .await
        .assert_error(404, "not_found");

    // With the slots free again, writes are accepted.
    let (method, path, body) = &writes[0];
    server
        .send(method.clone(), path, body.as_ref(), None)
        .await
        .assert_status(201);
    server.stop().await;
}

/// OTLP/gRPC exports bypassed the write limit: a flood of them each held its decoded batch in
/// memory while it waited for the store. They now take a slot of the same limit, and with none
/// free the call is refused `UNAVAILABLE` (an OTLP exporter backs off and retries).
#[tokio::test]
async fn grpc_exports_share_the_write_limit() {
    use crate::otlp::{request, root_span};
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    use prost::Message;

    let server = TestServer::start_with(Options {
        config: ServerConfig {
            // Every write is refused at once: the limit is all that is tested here.
            max_inflight_writes: 0,
            write_wait: Duration::from_millis(20),
            ..ServerConfig::default()
        },
        grpc: true,
        ..Options::default()
    })
    .await;
    let channel = grpc_channel(&server).await;
    let body = request(vec![root_span()]).encode_to_vec();
    let exported = grpc_export(&channel, body, false).await.expect("in time");
    let Err(status) = exported else {
        panic!("the export was taken past the write limit");
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let metrics = crate::metrics::scrape(&server).await;
    assert_eq!(
        metrics.get("flightlog_http_writes_refused_total"),
        Some(1.0)
    );
    server.stop().await;
}

/// The token comes before the write limit on gRPC too (as the HTTP gate checks it first): a
/// call without a valid token is `UNAUTHENTICATED` without taking (or waiting for) a write
/// slot, which it could otherwise hold, shared with the HTTP listener, while its body arrived.
#[tokio::test]
async fn a_grpc_call_without_a_valid_token_takes_no_write_slot() {
    use crate::otlp::{request, root_span};
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    use flightlog_server::auth::{AuthConfig, Scope, Scopes};
    use prost::Message;

    let auth = AuthConfig::open()
        .with_token(
            "an-ingest-token-long-enough",
            Scopes::NONE.with(Scope::Ingest),
        )
        .expect("a valid token");
    let server = TestServer::start_with(Options {
        config: ServerConfig {
            auth,
            // Any call that reached the limit would be refused at once.
            max_inflight_writes: 0,
            write_wait: Duration::from_millis(20),
            ..ServerConfig::default()
        },
        grpc: true,
        ..Options::default()
    })
    .await;
    let channel = grpc_channel(&server).await;
    let body = request(vec![root_span()]).encode_to_vec();
    let exported = grpc_export(&channel, body, false).await.expect("in time");
    let Err(status) = exported else {
        panic!("an export without a token was taken");
    };
    // Not UNAVAILABLE: the limit (every call refused) was never consulted.
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
    server.stop().await;
}

/// With gRPC exports under the write limit, a call whose message stalls held its slot for as
/// long as the peer answered pings. It is read under the HTTP gate's rules (nothing new for
/// 10 s ends it: `DEADLINE_EXCEEDED`, grpc-status 4), and it takes a slot only once its message
/// is here, so while it stalls it holds none: another export takes the only slot.
#[tokio::test]
async fn a_stalled_grpc_export_holds_no_write_slot_and_is_ended() {
    use crate::otlp::{request, root_span};
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    use prost::Message;

    let server = TestServer::start_with(Options {
        config: ServerConfig {
            max_inflight_writes: 1,
            write_wait: Duration::from_millis(20),
            ..ServerConfig::default()
        },
        grpc: true,
        ..Options::default()
    })
    .await;
    let mut stalled = stalled_grpc_call(&server, &[]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let channel = grpc_channel(&server).await;
    let body = request(vec![root_span()]).encode_to_vec();
    let exported = grpc_export(&channel, body, false).await.expect("in time");
    assert!(
        exported.is_ok(),
        "the stalled call holds no slot: {exported:?}"
    );
    let ended = grpc_call_answer(&mut stalled, Duration::from_secs(15)).await;
    assert_eq!(ended, Ok("answered"), "the stalled call was never ended");
    server.stop().await;
}

/// One HTTP/2 frame.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    bytes.extend([kind, flags]);
    bytes.extend(stream.to_be_bytes());
    bytes.extend(payload);
    bytes
}

/// A gRPC export call by hand on `server`'s gRPC listener, stalled after its message's prefix:
/// the preface, empty SETTINGS, the call's HEADERS (literal fields, no Huffman, plus `extra`),
/// and a DATA frame with only the 5-byte gRPC prefix of a 16-byte message.
async fn stalled_grpc_call(server: &TestServer, extra: &[(&[u8], &[u8])]) -> TcpStream {
    let grpc = server.grpc_base.clone().expect("a gRPC listener");
    let addr = grpc.trim_start_matches("http://").to_owned();
    let literal = |name: &[u8], value: &[u8]| -> Vec<u8> {
        let mut bytes = vec![0, name.len() as u8];
        bytes.extend(name);
        bytes.push(value.len() as u8);
        bytes.extend(value);
        bytes
    };
    let mut headers = vec![0x83, 0x86]; // :method POST, :scheme http
    headers.extend(literal(
        b":path",
        b"/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    ));
    headers.extend(literal(b":authority", b"x"));
    headers.extend(literal(b"content-type", b"application/grpc"));
    headers.extend(literal(b"te", b"trailers"));
    for (name, value) in extra {
        headers.extend(literal(name, value));
    }
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(h2_frame(4, 0, 0, &[]));
    hello.extend(h2_frame(1, 4, 1, &headers));
    hello.extend(h2_frame(0, 0, 1, &[0, 0, 0, 0, 16]));
    let mut stalled = TcpStream::connect(&addr).await.expect("connect");
    stalled.write_all(&hello).await.expect("send");
    stalled
}

/// Wait up to `limit` for the answer to [`stalled_grpc_call`]'s call: a HEADERS (the
/// trailers-only status) or RST_STREAM frame on stream 1, while this peer acknowledges SETTINGS
/// and PINGs as a live one does. `Ok("answered")`, `Ok("closed")`, or `Err` past the limit.
async fn grpc_call_answer(
    stalled: &mut TcpStream,
    limit: Duration,
) -> Result<&'static str, tokio::time::error::Elapsed> {
    let mut answer: Vec<u8> = Vec::new();
    let mut buffer = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stalled.read(&mut buffer).await {
                Ok(0) | Err(_) => return "closed",
                Ok(read) => answer.extend_from_slice(&buffer[..read]),
            }
            while answer.len() >= 9 {
                let length = usize::from(answer[0]) << 16
                    | usize::from(answer[1]) << 8
                    | usize::from(answer[2]);
                if answer.len() < 9 + length {
                    break;
                }
                let (kind, flags) = (answer[3], answer[4]);
                let stream = u32::from_be_bytes([answer[5], answer[6], answer[7], answer[8]]);
                let payload = answer[9..9 + length].to_vec();
                answer.drain(..9 + length);
                match (kind, stream) {
                    (1 | 3, 1) => return "answered",
                    (4, 0) if flags & 1 == 0 => {
                        let _ = stalled.write_all(&h2_frame(4, 1, 0, &[])).await;
                    }
                    (6, 0) if flags & 1 == 0 => {
                        let _ = stalled.write_all(&h2_frame(6, 1, 0, &payload)).await;
                    }
                    _ => {}
                }
            }
        }
    })
    .await
}

/// A call's own deadline (`grpc-timeout`) ends it, rather than the 10 s a stalled message is
/// otherwise allowed: the exporter gave up at its deadline, and what the call holds (its
/// stream, what arrived of its message) is wasted past it.
#[tokio::test]
async fn a_grpc_export_ends_at_its_own_deadline() {
    let server = TestServer::start_with(Options {
        grpc: true,
        ..Options::default()
    })
    .await;
    let mut stalled = stalled_grpc_call(&server, &[(b"grpc-timeout", b"500m")]).await;
    // Under the 10 s a body may go without a byte (the gate's limit), with room for a slow CI.
    let ended = grpc_call_answer(&mut stalled, Duration::from_secs(8)).await;
    assert_eq!(
        ended,
        Ok("answered"),
        "the call was not ended before the server's own stall limit"
    );
    server.stop().await;
}

/// An OTLP/gRPC export whose deadline passes while the store waits for another process's lock
/// ends for its client at the deadline (tonic's client gives up itself, `CANCELLED`, or hears
/// the server's `DEADLINE_EXCEEDED`, whichever comes first), but goes on to its end holding its
/// slot of the write limit (the writer commits what it was handed either way): before, the slot
/// went back at the deadline while the export stayed in the store's queue, so exporters
/// retrying timed-out exports filled that queue past the limit. Once the lock is free the
/// export is stored, the slot comes back, and it is counted as abandoned.
#[tokio::test]
async fn a_grpc_export_past_its_deadline_keeps_its_slot_until_the_store_answers() {
    use crate::otlp::{request, root_span};
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;

    tokio::time::timeout(Duration::from_secs(30), async {
        let server = TestServer::start_with(Options {
            config: ServerConfig {
                max_inflight_writes: 1,
                write_wait: Duration::from_millis(50),
                ..ServerConfig::default()
            },
            grpc: true,
            ..Options::default()
        })
        .await;
        let channel = crate::otlp_fuzz::grpc_channel(&server).await;
        let lock = ForeignWriteLock::take(&server);
        let mut call = tonic::Request::new(request(vec![root_span()]));
        call.set_timeout(Duration::from_millis(300));
        let answer = TraceServiceClient::new(channel).export(call).await;
        let code = answer.map_or_else(|status| status.code(), |_| tonic::Code::Ok);
        assert!(
            matches!(code, tonic::Code::Cancelled | tonic::Code::DeadlineExceeded),
            "{code:?}"
        );
        let metrics = crate::metrics::scrape(&server).await;
        assert_eq!(
            metrics.get("flightlog_http_writes_in_flight"),
            Some(1.0),
            "the export holds its slot past its deadline"
        );
        let late = json!({"spanId": "late", "runId": "late", "name": "late", "kind": "turn",
                          "origin": "session"});
        server
            .post("/v1/activity/spans", &late)
            .await
            .assert_error(503, "unavailable");
        lock.release();
        let mut probes = 0;
        loop {
            let metrics = crate::metrics::scrape(&server).await;
            if metrics.get("flightlog_http_writes_in_flight") == Some(0.0) {
                assert_eq!(
                    metrics.get("flightlog_http_writes_abandoned_total"),
                    Some(1.0)
                );
                break;
            }
            probes += 1;
            assert!(probes < 500, "the slot never came back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server
            .get(&format!("/v1/activity/spans/{}", crate::otlp::hex(1)))
            .await
            .assert_status(200);
        server.stop().await;
    })
    .await
    .expect("the scenario ends within 30 s");
}
