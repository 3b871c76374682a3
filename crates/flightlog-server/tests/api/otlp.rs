//! `POST /v1/traces` on a real server with hand-built OTLP bodies: the edge cases an exporter in
//! the wild produces (retries, spans out of order, stragglers after the rollup) and the inputs a
//! hostile or broken one sends (malformed protobuf, a wrong content type, a gzip bomb, huge
//! attributes), each with its answer, and the server still serving afterwards. The real SDK
//! clients are exercised in `otlp_clients`.

use std::io::Write;

use flightlog_otlp::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use serde_json::{json, Value};

use crate::support::{RpcStatus, TestServer};

const TRACE: [u8; 16] = [0xab; 16];
pub(crate) const TRACE_HEX: &str = "abababababababababababababababab";

pub(crate) fn span_id(n: u8) -> Vec<u8> {
    vec![0, 0, 0, 0, 0, 0, 0, n]
}

pub(crate) fn hex(n: u8) -> String {
    format!("00000000000000{n:02x}")
}

fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

pub(crate) fn text(key: &str, value: &str) -> KeyValue {
    attr(key, any_value::Value::StringValue(value.into()))
}

fn int(key: &str, value: i64) -> KeyValue {
    attr(key, any_value::Value::IntValue(value))
}

/// A finished span `n` under `parent` (0: root), started at `start_ms`.
pub(crate) fn otlp_span(n: u8, parent: u8, start_ms: u64, attributes: Vec<KeyValue>) -> Span {
    Span {
        trace_id: TRACE.to_vec(),
        span_id: span_id(n),
        parent_span_id: if parent == 0 {
            Vec::new()
        } else {
            span_id(parent)
        },
        name: format!("span-{n}"),
        start_time_unix_nano: start_ms * 1_000_000,
        end_time_unix_nano: (start_ms + 50) * 1_000_000,
        attributes,
        status: Some(Status {
            code: 1,
            message: String::new(),
        }),
        ..Span::default()
    }
}

pub(crate) fn model_span(n: u8, parent: u8, start_ms: u64, input: i64) -> Span {
    otlp_span(
        n,
        parent,
        start_ms,
        vec![
            text("gen_ai.operation.name", "chat"),
            text("gen_ai.request.model", "gpt-4o-mini"),
            int("gen_ai.usage.input_tokens", input),
            int("gen_ai.usage.output_tokens", 10),
        ],
    )
}

pub(crate) fn root_span() -> Span {
    otlp_span(
        1,
        0,
        1_000,
        vec![text("gen_ai.operation.name", "invoke_agent")],
    )
}

pub(crate) fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![text("service.name", "test-agent")],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

async fn post_raw(
    server: &TestServer,
    content_type: &str,
    encoding: Option<&str>,
    body: Vec<u8>,
) -> reqwest::Response {
    let mut builder = server
        .client
        .post(format!("{}/v1/traces", server.base))
        .header("content-type", content_type)
        .body(body);
    if let Some(encoding) = encoding {
        builder = builder.header("content-encoding", encoding);
    }
    builder.send().await.expect("the server answers")
}

/// Post OTLP/JSON, which must be answered 200; the JSON response.
async fn export_json(server: &TestServer, body: &Value) -> Value {
    let response = post_raw(
        server,
        "application/json",
        None,
        body.to_string().into_bytes(),
    )
    .await;
    assert_eq!(response.status(), 200);
    response.json().await.expect("JSON")
}

/// Post protobuf; the decoded response.
pub(crate) async fn export(server: &TestServer, spans: Vec<Span>) -> ExportTraceServiceResponse {
    let response = post_raw(
        server,
        "application/x-protobuf",
        None,
        request(spans).encode_to_vec(),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("application/x-protobuf")
    );
    let bytes = response.bytes().await.expect("body");
    ExportTraceServiceResponse::decode(bytes).expect("an ExportTraceServiceResponse")
}

async fn get_json(server: &TestServer, path: &str) -> (u16, Value) {
    let response = server
        .client
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_trace_becomes_a_run_and_retries_out_of_order_and_stragglers_are_right() {
    let server = TestServer::start().await;
    // The child batch arrives before its parent.
    let first = export(&server, vec![model_span(2, 1, 1_010, 100)]).await;
    assert_eq!(first.partial_success, None);
    let (status, _) = get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 404, "no root yet, so no rollup");

    export(&server, vec![root_span()]).await;
    let (status, rollup) =
        get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 200);
    assert_eq!(rollup["inputTokens"], 100);
    assert_eq!(rollup["spanCount"], 2);
    assert!(rollup["costUsd"].as_f64().is_some_and(|cost| cost > 0.0));

    // An exporter retry of both batches changes nothing.
    let cursor = get_json(&server, "/v1/activity/cursor").await.1;
    export(&server, vec![root_span(), model_span(2, 1, 1_010, 100)]).await;
    assert_eq!(get_json(&server, "/v1/activity/cursor").await.1, cursor);

    // A straggler after the rollup updates it.
    export(&server, vec![model_span(3, 1, 1_020, 40)]).await;
    let (_, rollup) = get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(rollup["inputTokens"], 140);
    assert_eq!(rollup["spanCount"], 3);

    let (_, root) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(root["kind"], "turn");
    assert_eq!(root["origin"], "otlp");
    assert_eq!(root["writer"], "otlp");
    assert_eq!(root["runId"], TRACE_HEX);
    assert_eq!(root["attrs"]["resource"]["service.name"], "test-agent");
    let (_, model) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    assert_eq!(model["kind"], "model");
    assert_eq!(model["parentSpanId"], hex(1));
    assert_eq!(model["startedAt"], 1_010);
    assert_eq!(model["endedAt"], 1_060);
    assert_eq!(model["outcome"], "success");
    assert_eq!(model["usage"]["model"], "gpt-4o-mini");
}

/// An agent behind an HTTP server continues the caller's `traceparent`: its entry span's parent
/// is remote (the SDK says so in `flags`) and never arrives here. The run must still have a
/// root, a rollup and a place in the run list; and the model call inside a framework's model
/// span that reports nothing must be counted once.
/// An SDK exports a span when it ends, so an agent's model and tool calls arrive while its root
/// runs: the run is listed open, waiting for its root, with the usage so far (it was not listed
/// at all until the root ended); the root's arrival makes it an ordinary ended run.
#[tokio::test]
async fn a_trace_whose_root_is_still_running_is_listed_open_with_its_usage_so_far() {
    let server = TestServer::start().await;
    let mut tool = otlp_span(
        4,
        1,
        1_030,
        vec![text("gen_ai.operation.name", "execute_tool")],
    );
    tool.name = "search".into();
    export(
        &server,
        vec![
            model_span(2, 1, 1_010, 300),
            tool,
            model_span(3, 1, 1_020, 50),
        ],
    )
    .await;
    let (status, open) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(status, 200);
    let run = &open["runs"][0];
    assert_eq!(run["runId"], TRACE_HEX, "{open}");
    assert_eq!(run["awaitingRoot"], true, "{run}");
    assert_eq!(run["state"], "open", "{run}");
    assert_eq!(run["name"], "span-2", "named by its earliest span: {run}");
    assert_eq!(run["startedAt"], 1_010, "{run}");
    assert_eq!(run["spanCount"], 3, "{run}");
    assert_eq!(run["inputTokens"], 350, "{run}");
    assert_eq!(run["outcome"], Value::Null, "{run}");
    let (_, ended) = get_json(&server, "/v1/activity/runs?state=ended").await;
    assert_eq!(ended["runs"], json!([]), "{ended}");

    export(&server, vec![root_span()]).await;
    let (_, all) = get_json(&server, "/v1/activity/runs").await;
    assert_eq!(all["runs"].as_array().map(Vec::len), Some(1), "{all}");
    let run = &all["runs"][0];
    assert_eq!(run["awaitingRoot"], false, "{run}");
    assert_eq!(run["state"], "ended", "{run}");
    assert_eq!(run["name"], "span-1", "{run}");
    assert_eq!(run["startedAt"], 1_000, "{run}");
    assert_eq!(run["inputTokens"], 350, "{run}");
    assert_eq!(run["rolledUp"], true, "{run}");
}

/// Logfire's shape: the agent announced as a pending span, then a streamed call's usage record
/// whose parent, the agent, Logfire flags as remote (it re-attached the context). It was a
/// second root of the run, outside its agent; the agent is stored in the run, so it is the
/// record's parent, and the run's usage counts the call once.
#[tokio::test]
async fn a_remote_flagged_parent_already_in_the_run_stays_the_parent() {
    let server = TestServer::start().await;
    let agent_attrs = vec![text("gen_ai.operation.name", "invoke_agent")];
    export(
        &server,
        vec![pending_span(9, 1, 1_000, "", agent_attrs.clone())],
    )
    .await;
    let mut record = model_span(2, 1, 1_010, 700);
    record.flags = 0x301;
    let answer = export(&server, vec![record]).await;
    assert_eq!(answer.partial_success, None);
    let (_, call) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    assert_eq!(call["parentSpanId"], hex(1), "{call}");
    assert_eq!(call["kind"], "model", "{call}");
    assert_eq!(call["attrs"]["flightlog.remote_parent_span_id"], hex(1));
    export(&server, vec![otlp_span(1, 0, 1_000, agent_attrs)]).await;
    let (status, rollup) =
        get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 200, "{rollup}");
    assert_eq!(rollup["inputTokens"], 700, "{rollup}");
    assert_eq!(rollup["spanCount"], 2, "{rollup}");
}

/// A tool server traced as part of the agent's trace (it continues the agent's `traceparent`)
/// exports its spans as they end, before the agent's call to it ends: its entry span is a root
/// while the call is away, then moves under the call when the agent's spans come, as a
/// subagent. The run is the one tree, with the one rollup, it is when the agent's spans come
/// first.
#[tokio::test]
async fn a_remote_callee_exported_before_its_caller_moves_under_the_call() {
    let server = TestServer::start().await;
    let mut entry = otlp_span(
        5,
        4,
        1_010,
        vec![text("gen_ai.operation.name", "invoke_agent")],
    );
    entry.flags = 0x301;
    export(&server, vec![entry, model_span(6, 5, 1_020, 400)]).await;
    let (_, waiting) = get_json(&server, &format!("/v1/activity/spans/{}", hex(5))).await;
    assert_eq!(waiting["parentSpanId"], Value::Null, "{waiting}");
    assert_eq!(waiting["kind"], "turn", "{waiting}");

    let call = otlp_span(
        4,
        1,
        1_005,
        vec![text("gen_ai.operation.name", "execute_tool")],
    );
    let answer = export(
        &server,
        vec![call, model_span(2, 1, 1_001, 100), root_span()],
    )
    .await;
    assert_eq!(answer.partial_success, None);
    let (_, moved) = get_json(&server, &format!("/v1/activity/spans/{}", hex(5))).await;
    assert_eq!(moved["parentSpanId"], hex(4), "{moved}");
    assert_eq!(moved["kind"], "subagent", "{moved}");
    assert_eq!(moved["attrs"]["flightlog.remote_parent_span_id"], hex(4));
    let (_, snapshot) = get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/snapshot")).await;
    let roots: Vec<&Value> = snapshot["spans"]
        .as_array()
        .map(|spans| {
            spans
                .iter()
                .filter(|span| span["parentSpanId"].is_null())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(roots.len(), 1, "{snapshot}");
    assert_eq!(roots[0]["spanId"], hex(1), "{snapshot}");
    let (status, rollup) =
        get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 200, "{rollup}");
    assert_eq!(rollup["name"], "span-1", "{rollup}");
    assert_eq!(rollup["inputTokens"], 500, "{rollup}");
    assert_eq!(rollup["spanCount"], 5, "{rollup}");
    let (_, runs) = get_json(&server, "/v1/activity/runs").await;
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs["runs"][0]["name"], "span-1", "{runs}");
}

#[tokio::test]
async fn a_trace_continued_from_a_remote_caller_is_a_run_with_its_usage() {
    let server = TestServer::start().await;
    let mut entry = otlp_span(
        1,
        0x0f,
        1_000,
        vec![text("gen_ai.operation.name", "invoke_agent")],
    );
    entry.flags = 0x301;
    let framework = otlp_span(
        2,
        1,
        1_010,
        vec![
            text("openinference.span.kind", "LLM"),
            text("llm.model_name", "gpt-4o"),
        ],
    );
    let provider = model_span(3, 2, 1_020, 500);
    let answer = export(&server, vec![entry, framework, provider]).await;
    assert_eq!(answer.partial_success, None);

    let (_, root) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(root["parentSpanId"], Value::Null);
    assert_eq!(root["kind"], "turn");
    assert_eq!(root["attrs"]["flightlog.remote_parent_span_id"], hex(0x0f));
    let (status, rollup) =
        get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 200, "{rollup}");
    assert_eq!(rollup["inputTokens"], 500, "{rollup}");
    assert_eq!(rollup["outputTokens"], 10, "{rollup}");
    assert!(rollup["costUsd"].as_f64().is_some_and(|cost| cost > 0.0));
    let (_, runs) = get_json(&server, "/v1/activity/runs?limit=10").await;
    let listed = runs["runs"]
        .as_array()
        .is_some_and(|runs| runs.iter().any(|run| run["runId"] == TRACE_HEX));
    assert!(listed, "{runs}");
}

#[tokio::test]
async fn otlp_json_is_answered_in_json_and_bad_spans_are_reported_not_fatal() {
    let server = TestServer::start().await;
    let body = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": TRACE_HEX, "spanId": hex(1), "name": "ok",
         "startTimeUnixNano": "1000000000", "endTimeUnixNano": 1100000000u64,
         "status": {"code": 2, "message": "tool exploded"}},
        {"traceId": TRACE_HEX, "spanId": "00", "name": "bad id",
         "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1100000000"}
    ]}]}]});
    let answer = export_json(&server, &body).await;
    assert_eq!(answer["partialSuccess"]["rejectedSpans"], 1);
    assert!(answer["partialSuccess"]["errorMessage"]
        .as_str()
        .is_some_and(|message| !message.is_empty()));
    let (_, span) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(span["outcome"], "error");
    assert_eq!(span["outcomeReason"], "tool exploded");
}

/// An attribute map holding a key named like serde_json's private raw-value token is kept as
/// sent. The stored attrs were read back through serde_json's `Value`, which read that object
/// as the JSON in its string: this span's attrs came back `{}`, every attribute lost.
#[tokio::test]
async fn attributes_named_like_serde_jsons_raw_value_token_are_kept() {
    let server = TestServer::start().await;
    let token = "$serde_json::private::RawValue";
    let body = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": TRACE_HEX, "spanId": hex(1), "name": "s",
         "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1100000000",
         "attributes": [
            {"key": "keep", "value": {"stringValue": "me"}},
            {"key": "map", "value": {"kvlistValue": {"values": [
                {"key": token, "value": {"stringValue": "not JSON"}}]}}}
         ]}
    ]}]}]});
    let answer = export_json(&server, &body).await;
    assert_eq!(answer, json!({}));
    // Read as written (the test client's own parse would resolve the token too).
    let reply = server.get(&format!("/v1/activity/spans/{}", hex(1))).await;
    let attrs = &reply.assert_status(200)["attrs"];
    assert_eq!(attrs["keep"], "me", "{attrs}");
    assert_eq!(attrs["map"], json!({token: "not JSON"}), "{attrs}");
    server.stop().await;
}

/// What the OpenTelemetry Collector accepts, flightlog accepts: OTLP/JSON with the protobuf
/// field names (snake_case) and enum value names instead of numbers.
#[tokio::test]
async fn otlp_json_in_the_collectors_other_spellings_is_read_the_same() {
    let server = TestServer::start().await;
    let body = json!({"resource_spans": [{"scope_spans": [{"spans": [
        {"trace_id": TRACE_HEX, "span_id": hex(1), "name": "handler",
         "kind": "SPAN_KIND_SERVER",
         "start_time_unix_nano": "1000000000", "end_time_unix_nano": 1_100_000_000u64,
         "attributes": [{"key": "gen_ai.operation.name",
                         "value": {"string_value": "invoke_agent"}}],
         "status": {"code": "STATUS_CODE_ERROR", "message": "boom"}}
    ]}]}]});
    let answer = export_json(&server, &body).await;
    assert_eq!(answer.get("partialSuccess"), None, "{answer}");
    let (_, span) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(span["runId"], TRACE_HEX, "{span}");
    assert_eq!(span["kind"], "turn", "{span}");
    assert_eq!(span["outcome"], "error", "{span}");
    assert_eq!(span["outcomeReason"], "boom", "{span}");
    assert_eq!(span["startedAt"], 1_000, "{span}");
    assert_eq!(span["attrs"]["otel.span_kind"], "server", "{span}");
}

#[tokio::test]
async fn hostile_bodies_get_their_status_and_the_server_keeps_serving() {
    let server = TestServer::start().await;
    // Malformed protobuf: the OTLP error body (google.rpc.Status) for a protobuf request.
    let response = post_raw(
        &server,
        "application/x-protobuf",
        None,
        vec![0xff, 0xff, 0xff, 0x01],
    )
    .await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("application/x-protobuf")
    );
    // Malformed JSON: the contract's error body.
    let response = post_raw(&server, "application/json", None, b"{not json".to_vec()).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "invalid_request");
    // A content type OTLP does not use.
    let response = post_raw(&server, "text/plain", None, b"hello".to_vec()).await;
    assert_eq!(response.status(), 415);
    let body: Value = response.json().await.expect("JSON");
    assert_eq!(body["error"]["code"], "unsupported_media_type");
    // An unknown content encoding.
    let response = post_raw(&server, "application/json", Some("br"), b"{}".to_vec()).await;
    assert_eq!(response.status(), 415);

    // A gzip bomb: 80 MiB of zeros (over the 64 MiB inflate limit) compressed to under 100 KiB;
    // refused without inflating it all.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1024 * 1024];
    for _ in 0..80 {
        encoder.write_all(&zeros).expect("compress");
    }
    let bomb = encoder.finish().expect("compress");
    assert!(bomb.len() < 1024 * 1024);
    let response = post_raw(&server, "application/x-protobuf", Some("gzip"), bomb).await;
    assert_eq!(response.status(), 413);

    // A bomb of entries: 60 MiB of empty `ResourceSpans` (two bytes each, within the inflate
    // limit) gzip to 61 KB and decoded to 31 million structs, 5 GB (an audit's finding); an
    // 8 MiB plain body of them, and OTLP/JSON of empty objects, to about 1 GB. Refused before
    // anything is decoded, saying why.
    let empties = b"\n\x00".repeat(30 * 1024 * 1024);
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&empties).expect("compress");
    let entries_bomb = encoder.finish().expect("compress");
    assert!(entries_bomb.len() < 128 * 1024);
    let mut json = b"{\"resourceSpans\":[".to_vec();
    json.extend(b"{},".repeat(2_500_000));
    json.extend(b"{}]}");
    for (content_type, encoding, body) in [
        ("application/x-protobuf", Some("gzip"), entries_bomb),
        (
            "application/x-protobuf",
            None,
            empties[..8 * 1024 * 1024 - 2].to_vec(),
        ),
        ("application/json", None, json),
    ] {
        let response = post_raw(&server, content_type, encoding, body).await;
        assert_eq!(response.status(), 413, "{content_type} {encoding:?}");
        let message = format!("{:?}", response.bytes().await.expect("a body"));
        assert!(
            message.contains("too many entries for its size"),
            "{message}"
        );
    }

    // A gzip body within bounds is accepted.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder
        .write_all(&request(vec![root_span()]).encode_to_vec())
        .expect("compress");
    let response = post_raw(
        &server,
        "application/x-protobuf",
        Some("gzip"),
        encoder.finish().expect("compress"),
    )
    .await;
    assert_eq!(response.status(), 200);

    // A 2 MiB attribute value is stored capped, not whole.
    let huge = "x".repeat(2 * 1024 * 1024);
    let mut span = otlp_span(9, 1, 1_000, vec![text("prompt", &huge)]);
    span.events = vec![span::Event {
        time_unix_nano: 1_010_000_000,
        name: "log".into(),
        attributes: vec![text("line", &huge)],
        ..span::Event::default()
    }];
    export(&server, vec![span]).await;
    let (status, stored) = get_json(&server, &format!("/v1/activity/spans/{}", hex(9))).await;
    assert_eq!(status, 200);
    let prompt = stored["attrs"]["prompt"].as_str().unwrap_or_default();
    assert!(
        prompt.len() <= 16_384 + 64,
        "capped, got {} bytes",
        prompt.len()
    );
    let (_, snapshot) = get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/snapshot")).await;
    let event = &snapshot["events"][0];
    assert_eq!(event["truncated"], true);

    // An attribute value nested as deep as OTLP/protobuf can carry (prost decodes 100 message
    // levels, three per kvlist level) is stored as it is, and every read that includes it stays
    // parseable; deeper values are refused by the decoder (and past 60 levels the mapping would
    // store them as their JSON text: `flightlog-otlp`'s attributes tests).
    let mut deep = any_value::Value::StringValue("leaf".into());
    for _ in 0..30 {
        deep =
            any_value::Value::KvlistValue(opentelemetry_proto::tonic::common::v1::KeyValueList {
                values: vec![attr("k", deep)],
            });
    }
    let mut span = otlp_span(10, 1, 1_000, vec![attr("deep", deep.clone())]);
    span.events = vec![span::Event {
        time_unix_nano: 1_020_000_000,
        name: "deep".into(),
        attributes: vec![attr("deep", deep)],
        ..span::Event::default()
    }];
    export(&server, vec![span]).await;
    let (status, stored) = get_json(&server, &format!("/v1/activity/spans/{}", hex(10))).await;
    assert_eq!(status, 200, "{stored}");
    let mut value = &stored["attrs"]["deep"];
    for _ in 0..30 {
        value = &value["k"];
    }
    assert_eq!(value, "leaf", "{stored}");
    for path in [
        format!("/v1/activity/runs/{TRACE_HEX}/snapshot"),
        "/v1/activity/changes?after=0".to_owned(),
    ] {
        let (status, read) = get_json(&server, &path).await;
        assert_eq!(status, 200, "{path}");
        assert_ne!(read, Value::Null, "{path}: not parseable");
    }

    // Still serving.
    let (status, _) = get_json(&server, "/healthz").await;
    assert_eq!(status, 200);
}

/// A Logfire pending span `own` announcing span `real` (running) whose own parent is
/// `real_parent` (16 hex digits; all zero: a root), with `attributes` besides Logfire's two.
fn pending_span(
    own: u8,
    real: u8,
    start_ms: u64,
    real_parent: &str,
    mut attributes: Vec<KeyValue>,
) -> Span {
    attributes.push(text("logfire.span_type", "pending_span"));
    attributes.push(text("logfire.pending_parent_id", real_parent));
    let mut pending = otlp_span(own, real, start_ms, attributes);
    pending.end_time_unix_nano = pending.start_time_unix_nano;
    pending
}

#[tokio::test]
async fn a_pending_span_is_live_until_the_real_one_arrives() {
    let server = TestServer::start().await;
    // Logfire's convention: a zero-length span announcing its parent (the real span) as running.
    let mut pending = pending_span(7, 1, 1_000, "0000000000000000", Vec::new());
    pending.name = "agent run".into();
    export(&server, vec![pending]).await;
    let (_, open) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(open["runs"][0]["runId"], TRACE_HEX);
    let (_, root) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(root["outcome"], Value::Null);

    export(&server, vec![root_span()]).await;
    let (_, open) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(open["runs"], json!([]));
    let (_, root) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(root["outcome"], "success");
    let (_, snapshot) = get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/snapshot")).await;
    assert_eq!(
        snapshot["spans"].as_array().map(Vec::len),
        Some(1),
        "the announcement is not a span of its own"
    );
}

/// Logfire announces a span continued from a remote caller with the caller's span id as the
/// real parent (a pending span cannot say the parent is remote). That parent is not stored, so
/// the announced span is a root while it runs (the run is listed and live); the completed copy,
/// flagged remote, keeps it one, so the run gets its rollup. An announcement whose parent is
/// stored stays below it.
#[tokio::test]
async fn an_announced_span_of_a_remote_caller_becomes_a_root_when_it_completes() {
    let server = TestServer::start().await;
    let mut pending = pending_span(
        7,
        1,
        1_000,
        &hex(0x0f),
        vec![text("gen_ai.operation.name", "invoke_agent")],
    );
    pending.name = "agent run (pending)".into();
    let child = otlp_span(
        2,
        1,
        1_010,
        vec![
            text("gen_ai.operation.name", "chat"),
            text("gen_ai.request.model", "gpt-4o-mini"),
            int("gen_ai.usage.input_tokens", 300),
            int("gen_ai.usage.output_tokens", 10),
        ],
    );
    export(&server, vec![pending, child]).await;
    let (_, announced) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(announced["parentSpanId"], Value::Null, "{announced}");
    assert_eq!(
        announced["kind"], "turn",
        "an agent span at the root: {announced}"
    );
    assert_eq!(announced["outcome"], Value::Null);
    assert!(announced["lastHeartbeatAt"].is_i64(), "{announced}");
    let (_, open) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(open["runs"][0]["runId"], TRACE_HEX, "{open}");

    // A span announced below it stays there: its parent is stored.
    export(
        &server,
        vec![pending_span(8, 3, 1_030, &hex(1), Vec::new())],
    )
    .await;
    let (_, tool) = get_json(&server, &format!("/v1/activity/spans/{}", hex(3))).await;
    assert_eq!(tool["parentSpanId"], hex(1), "{tool}");
    assert_eq!(tool["outcome"], Value::Null, "{tool}");

    let mut completed = otlp_span(
        1,
        0x0f,
        1_000,
        vec![text("gen_ai.operation.name", "invoke_agent")],
    );
    completed.flags = 0x301;
    let answer = export(&server, vec![completed]).await;
    assert_eq!(answer.partial_success, None);
    let (_, root) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(root["parentSpanId"], Value::Null, "{root}");
    assert_eq!(root["kind"], "turn", "{root}");
    assert_eq!(root["outcome"], "success");
    assert_eq!(root["attrs"]["flightlog.remote_parent_span_id"], hex(0x0f));
    let (status, rollup) =
        get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 200, "{rollup}");
    assert_eq!(rollup["inputTokens"], 300, "{rollup}");
    let (_, runs) = get_json(&server, "/v1/activity/runs?state=ended&limit=10").await;
    assert_eq!(runs["runs"][0]["runId"], TRACE_HEX, "{runs}");

    // A span started natively keeps the parent its writer gave it, whatever the copy says.
    server
        .post(
            "/v1/activity/spans",
            &json!({"spanId": hex(0x20), "runId": TRACE_HEX, "parentSpanId": hex(1),
                    "name": "native", "kind": "tool", "origin": "session",
                    "startedAt": 1_020}),
        )
        .await
        .assert_status(201);
    let mut copy = otlp_span(0x20, 0x0e, 1_020, Vec::new());
    copy.flags = 0x301;
    export(&server, vec![copy]).await;
    let (_, native) = get_json(&server, &format!("/v1/activity/spans/{}", hex(0x20))).await;
    assert_eq!(native["parentSpanId"], hex(1), "{native}");
    assert_eq!(native["outcome"], "success", "{native}");
}

/// The gRPC listener (HTTP/2) drops a connection that sends no request within the header-read
/// timeout: HTTP/2 has no such timeout in hyper, and a client that never sent its preface held
/// the connection (and a file descriptor) forever. A connection that made a request (here one
/// refused) and then sat idle, answering the keep-alive pings, is closed after as long: only
/// the first request used to count, and a few hundred such peers used up every file
/// descriptor (an audit's finding).
#[tokio::test]
async fn a_grpc_connection_that_sends_nothing_is_closed() {
    use tokio::io::AsyncReadExt;
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let grpc = server.grpc_base.clone().expect("a gRPC listener");
    let addr = grpc.trim_start_matches("http://").to_owned();
    let mut silent = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let started = std::time::Instant::now();
    let limit = flightlog_server::HEADER_READ_TIMEOUT + std::time::Duration::from_secs(5);
    let mut buffer = [0u8; 64];
    let silent_closed = tokio::time::timeout(limit, async {
        loop {
            match silent.read(&mut buffer).await {
                // The server's HTTP/2 SETTINGS frame may come first; the end of the stream is
                // what counts.
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    let served_then_idle = async {
        let tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
        // The connection's driver answers pings, and ends when the server closes.
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        let request = axum::http::Request::post(format!("{grpc}/no.such.Service/Method"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .expect("a request");
        let (answer, _) = client.send_request(request, true).expect("sent");
        let answer = answer.await.expect("answered");
        drop(answer);
        let asked = std::time::Instant::now();
        let closed = tokio::time::timeout(limit, driver).await;
        (closed.is_ok(), asked.elapsed())
    };
    let (silent_closed, (idle_closed, idle_for)) = tokio::join!(silent_closed, served_then_idle);
    assert!(silent_closed.is_ok(), "still open after {limit:?}");
    assert!(started.elapsed() >= flightlog_server::HEADER_READ_TIMEOUT);
    assert!(
        idle_closed,
        "the idle connection still open after {limit:?}"
    );
    // Timed by the server from its end of the request, a moment before the answer arrived.
    assert!(
        idle_for + std::time::Duration::from_secs(1) >= flightlog_server::HEADER_READ_TIMEOUT,
        "closed early: {idle_for:?}"
    );
    // The server still serves.
    let response = export(&server, vec![root_span()]).await;
    assert_eq!(response.partial_success, None);
    server.stop().await;
}

/// A span announced under a parent that has already ended (a caller exporting here too that
/// did not wait for the callee, or a fire-and-forget task) is a root while it runs, so the run
/// shows as running; its completed copy puts it where it belongs: under its parent, which is
/// stored in the run, whether or not the copy flags it as a remote caller's.
#[tokio::test]
async fn a_span_announced_under_an_ended_parent_keeps_its_run_running() {
    let server = TestServer::start().await;
    // The caller's span, already ended (1,000 – 1,050).
    export(&server, vec![root_span()]).await;
    let (_, runs) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(runs["runs"], json!([]), "{runs}");

    // Two announcements under it: a remote callee and a local task, both still running.
    export(
        &server,
        vec![
            pending_span(0x20, 2, 1_040, &hex(1), Vec::new()),
            pending_span(0x21, 3, 1_045, &hex(1), Vec::new()),
        ],
    )
    .await;
    for n in [2, 3] {
        let (_, span) = get_json(&server, &format!("/v1/activity/spans/{}", hex(n))).await;
        assert_eq!(span["parentSpanId"], Value::Null, "{span}");
        assert_eq!(span["outcome"], Value::Null, "{span}");
    }
    let (_, runs) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(
        runs["runs"][0]["runId"], TRACE_HEX,
        "the run is running: {runs}"
    );

    // The completed copies: the remote callee and the local task go under their parent, the
    // caller's span stored in the run; then nothing runs.
    let mut callee = otlp_span(2, 1, 1_040, Vec::new());
    callee.flags = 0x301;
    export(&server, vec![callee, otlp_span(3, 1, 1_045, Vec::new())]).await;
    let (_, callee) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    assert_eq!(callee["parentSpanId"], hex(1), "{callee}");
    let (_, task) = get_json(&server, &format!("/v1/activity/spans/{}", hex(3))).await;
    assert_eq!(task["parentSpanId"], hex(1), "{task}");
    let (_, runs) = get_json(&server, "/v1/activity/runs?state=open").await;
    assert_eq!(runs["runs"], json!([]), "{runs}");
    let (_, runs) = get_json(&server, "/v1/activity/runs").await;
    assert_eq!(
        runs["runs"][0]["name"], "span-1",
        "the first root names the run: {runs}"
    );
}

/// A run whose exporter keeps delivering its spans is alive: each delivery renews the heartbeat
/// of the run's open root (announced once, as Logfire does), so `sweep-stale` spares it while
/// its children arrive, and closes it once they stop.
#[tokio::test]
async fn deliveries_of_a_runs_spans_keep_its_announced_root_alive() {
    use axum::http::Method;
    let server = TestServer::start_with(crate::support::Options {
        manual_clock: true,
        ..crate::support::Options::default()
    })
    .await;
    let set_clock = |now: i64| {
        let server = &server;
        async move {
            server
                .send(
                    Method::PUT,
                    "/v1/testing/clock",
                    Some(&json!({"now": now})),
                    None,
                )
                .await
                .assert_status(204);
        }
    };
    set_clock(10_000).await;
    let pending = pending_span(
        7,
        1,
        1_000,
        "0000000000000000",
        vec![text("gen_ai.operation.name", "invoke_agent")],
    );
    export(&server, vec![pending]).await;
    // A child delivered 90 s later: the exporter is alive.
    set_clock(100_000).await;
    export(&server, vec![model_span(2, 1, 1_010, 100)]).await;
    let sweep = json!({"staleAfterMs": 50_000, "now": 100_000});
    let swept = server
        .post("/v1/activity/maintenance/sweep-stale", &sweep)
        .await;
    assert_eq!(swept.assert_status(200), &json!({"closed": 0}));
    let (_, root) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(root["lastHeartbeatAt"], 100_000, "{root}");
    // Nothing more arrives: stale 50 s after the last delivery.
    let sweep = json!({"staleAfterMs": 50_000, "now": 150_001});
    let swept = server
        .post("/v1/activity/maintenance/sweep-stale", &sweep)
        .await;
    assert_eq!(swept.assert_status(200), &json!({"closed": 1}));
    server.stop().await;
}

/// An SDK pointed at the server with `OTEL_EXPORTER_OTLP_ENDPOINT` (or OpenLLMetry, by
/// default) also exports its metrics and logs: they are read and answered 200 (a 404 made the
/// exporter log an error at every export), `partialSuccess` counts what was not kept and says
/// how to stop sending it, nothing is stored, and `/metrics` counts them. A body that is not an
/// export of that signal is still a 400, in protobuf for a protobuf request.
#[tokio::test]
async fn metrics_and_logs_are_read_and_answered_not_stored() {
    use opentelemetry_proto::tonic::collector::logs::v1::{
        ExportLogsServiceRequest, ExportLogsServiceResponse,
    };
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};

    let server = TestServer::start().await;
    let post = |path: &'static str, content_type: &'static str, body: Vec<u8>| {
        server
            .client
            .post(format!("{}{path}", server.base))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let cursor_before = get_json(&server, "/v1/activity/cursor").await.1;

    // Logs over protobuf, with a trace context (as a GenAI instrumentation's events carry).
    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![
                    LogRecord {
                        trace_id: vec![7; 16],
                        span_id: vec![8; 8],
                        event_name: "gen_ai.choice".into(),
                        ..LogRecord::default()
                    };
                    3
                ],
                ..ScopeLogs::default()
            }],
            ..ResourceLogs::default()
        }],
    };
    let response = post("/v1/logs", "application/x-protobuf", logs.encode_to_vec())
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("application/x-protobuf")
    );
    let answer = ExportLogsServiceResponse::decode(response.bytes().await.expect("body"))
        .expect("an ExportLogsServiceResponse");
    let partial = answer.partial_success.expect("partialSuccess");
    assert_eq!(partial.rejected_log_records, 3);
    assert!(
        partial.error_message.contains("OTEL_LOGS_EXPORTER=none"),
        "{}",
        partial.error_message
    );

    // Metrics over OTLP/JSON, gzip-compressed as exporters send them.
    let metrics = json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "gen_ai.client.token.usage", "histogram": {"dataPoints": [{}, {}]}},
        {"name": "llm.openai.chat_completions.exceptions", "sum": {"dataPoints": [{"asInt": "1"}]}}
    ]}]}]});
    let mut gzipped = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gzipped, metrics.to_string().as_bytes()).expect("gzip");
    let response = server
        .client
        .post(format!("{}/v1/metrics", server.base))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gzipped.finish().expect("gzip"))
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("JSON");
    assert_eq!(
        answer["partialSuccess"]["rejectedDataPoints"], 3,
        "{answer}"
    );
    assert!(answer["partialSuccess"]["errorMessage"]
        .as_str()
        .is_some_and(|m| m.contains("stores traces, not metrics")));
    // An empty export is a plain success.
    let response = post("/v1/metrics", "application/x-protobuf", Vec::new())
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    let answer = ExportMetricsServiceResponse::decode(response.bytes().await.expect("body"))
        .expect("an ExportMetricsServiceResponse");
    assert_eq!(answer.partial_success, None);

    // Not an export: 400, in the request's error encoding.
    let response = post("/v1/metrics", "application/x-protobuf", vec![0xff; 5])
        .await
        .expect("the server answers");
    assert_protobuf_status(response, 400, 3).await;
    let response = post(
        "/v1/logs",
        "application/json",
        b"{\"resourceLogs\": 5}".to_vec(),
    )
    .await
    .expect("the server answers");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("the error body");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let response = post("/v1/logs", "text/plain", b"{}".to_vec())
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 415);

    // Nothing stored; counted.
    assert_eq!(
        get_json(&server, "/v1/activity/cursor").await.1,
        cursor_before
    );
    let exposition = crate::metrics::scrape(&server).await;
    assert_eq!(
        exposition.get(r#"flightlog_otlp_not_stored_total{signal="logs"}"#),
        Some(3.0)
    );
    assert_eq!(
        exposition.get(r#"flightlog_otlp_not_stored_total{signal="metrics"}"#),
        Some(3.0)
    );
    server.stop().await;
}

/// The gRPC listener serves the metrics and logs services too, with the same answers, behind
/// the same tokens; a method no service has is UNIMPLEMENTED.
#[tokio::test]
async fn grpc_metrics_and_logs_are_answered_not_stored() {
    use opentelemetry_proto::tonic::collector::logs::v1::{
        ExportLogsServiceRequest, ExportLogsServiceResponse,
    };
    use opentelemetry_proto::tonic::collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
    };
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        metric::Data, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    };

    const TOKEN: &str = "ingest-token-0123456789";
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        config: flightlog_server::ServerConfig {
            auth: {
                let mut auth = flightlog_server::AuthConfig::open();
                auth.add_token(TOKEN, flightlog_server::Scopes::ALL)
                    .expect("a token");
                auth
            },
            ..flightlog_server::ServerConfig::default()
        },
        ..crate::support::Options::default()
    })
    .await;
    let channel = crate::otlp_fuzz::grpc_channel(&server).await;
    use crate::otlp_fuzz::grpc_unary;
    let grpc = || tonic::client::Grpc::new(channel.clone());
    let with_token = |message: Vec<u8>| {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {TOKEN}").parse().expect("metadata"),
        );
        request
    };
    const METRICS: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
    const LOGS: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
    let metrics = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics {
                metrics: vec![Metric {
                    name: "gen_ai.client.token.usage".into(),
                    data: Some(Data::Gauge(Gauge {
                        data_points: vec![NumberDataPoint::default(); 4],
                    })),
                    ..Metric::default()
                }],
                ..ScopeMetrics::default()
            }],
            ..ResourceMetrics::default()
        }],
    };
    let refused = grpc_unary(
        grpc(),
        METRICS,
        tonic::Request::new(metrics.encode_to_vec()),
    )
    .await
    .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let answer = grpc_unary(grpc(), METRICS, with_token(metrics.encode_to_vec()))
        .await
        .expect("exported");
    let answer = ExportMetricsServiceResponse::decode(answer.as_slice()).expect("a response");
    let partial = answer.partial_success.expect("partialSuccess");
    assert_eq!(partial.rejected_data_points, 4);

    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord::default(); 2],
                ..ScopeLogs::default()
            }],
            ..ResourceLogs::default()
        }],
    };
    let answer = grpc_unary(grpc(), LOGS, with_token(logs.encode_to_vec()))
        .await
        .expect("exported");
    let answer = ExportLogsServiceResponse::decode(answer.as_slice()).expect("a response");
    assert_eq!(
        answer.partial_success.map(|p| p.rejected_log_records),
        Some(2)
    );
    // A method no service has.
    let unknown = grpc_unary(
        grpc(),
        "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export",
        with_token(Vec::new()),
    )
    .await
    .expect_err("no such service");
    assert_eq!(unknown.code(), tonic::Code::Unimplemented);
    let text = server
        .client
        .get(format!("{}/metrics", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    let exposition = crate::metrics::parse(&text);
    assert_eq!(
        exposition.get(r#"flightlog_otlp_not_stored_total{signal="metrics"}"#),
        Some(4.0)
    );
    assert_eq!(
        exposition.get(r#"flightlog_otlp_not_stored_total{signal="logs"}"#),
        Some(2.0)
    );
    server.stop().await;
}

/// A gRPC message of empty entries (4 MiB of two-byte `ResourceSpans`, which tonic would decode
/// to 200 MB) is `RESOURCE_EXHAUSTED` before it is decoded, plain or gzip-compressed, as the HTTP
/// listener answers such a body 413; a real message still goes through.
#[tokio::test]
async fn a_grpc_message_of_empty_entries_is_refused_before_it_is_decoded() {
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let channel = grpc_channel(&server).await;
    let empties = b"\n\x00".repeat(2 * 1024 * 1024);
    for gzip in [false, true] {
        let answer = grpc_export(&channel, empties.clone(), gzip)
            .await
            .expect("in time");
        let status = answer.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("too many entries for its size"),
            "{status:?}"
        );
    }
    let answer = grpc_export(&channel, request(vec![root_span()]).encode_to_vec(), true)
        .await
        .expect("in time");
    assert!(answer.is_ok(), "{answer:?}");
    server.stop().await;
}

/// A unary export carrying two messages (a client streaming into the export method): tonic
/// read the first, dropped the second unread and answered OK, so the second batch's spans were
/// lost without a word (an audit's finding). Now refused whole, with nothing stored.
#[tokio::test]
async fn a_grpc_export_of_two_messages_is_refused_and_stores_nothing() {
    use crate::otlp_fuzz::{grpc_channel, RawCodec, EXPORT_PATH};
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let channel = grpc_channel(&server).await;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("the channel is ready");
    let messages = futures_util::stream::iter([
        request(vec![root_span()]).encode_to_vec(),
        request(vec![otlp_span(2, 1, 1_010, Vec::new())]).encode_to_vec(),
    ]);
    let answer = grpc
        .client_streaming(
            tonic::Request::new(messages),
            axum::http::uri::PathAndQuery::from_static(EXPORT_PATH),
            RawCodec,
        )
        .await;
    let status = answer.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert!(status.message().contains("one message"), "{status:?}");
    for span in [1, 2] {
        let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(span))).await;
        assert_eq!(status, 404, "span {span}: nothing stored");
    }
    server.stop().await;
}

/// A non-finite double attribute maps the same in OTLP/JSON (`"doubleValue": "Infinity"`, the
/// protobuf JSON mapping's spelling) as in protobuf: read as the string `"Infinity"`, a
/// non-finite `logfire.msg` named the JSON span, and an `openinference.span.kind` of NaN made it
/// `other` where the protobuf span is a `model` (an audit's finding, sending the same exports
/// both ways). Both are stored as the strings.
#[tokio::test]
async fn a_non_finite_double_maps_the_same_in_json_as_in_protobuf() {
    let server = TestServer::start().await;
    let attributes = |n: u8| {
        vec![
            attr("logfire.msg", any_value::Value::DoubleValue(f64::INFINITY)),
            attr(
                "openinference.span.kind",
                any_value::Value::DoubleValue(f64::NAN),
            ),
            text("gen_ai.operation.name", "chat"),
            text("gen_ai.request.model", &format!("m{n}")),
        ]
    };
    export(&server, vec![otlp_span(1, 0, 1_000, attributes(1))]).await;
    let json_span = json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
    "traceId": "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd", "spanId": hex(2), "name": "span-2",
    "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1050000000",
    "status": {"code": 1},
    "attributes": [
        {"key": "logfire.msg", "value": {"doubleValue": "Infinity"}},
        {"key": "openinference.span.kind", "value": {"doubleValue": "NaN"}},
        {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
        {"key": "gen_ai.request.model", "value": {"stringValue": "m2"}}
    ]}]}]}]});
    export_json(&server, &json_span).await;
    let (_, protobuf) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    let (_, json) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    assert_eq!(json["name"], "span-2", "{json}");
    assert_eq!(protobuf["name"], "span-1", "{protobuf}");
    assert_eq!(json["kind"], protobuf["kind"], "{json} / {protobuf}");
    assert_eq!(json["attrs"]["logfire.msg"], "Infinity", "{json}");
    assert_eq!(protobuf["attrs"]["logfire.msg"], "Infinity", "{protobuf}");
    assert_eq!(json["attrs"]["openinference.span.kind"], "NaN", "{json}");
    server.stop().await;
}

/// The `grpc-status` and `grpc-message` of one unary call of the trace export carrying `frame`
/// (a message's 5-byte prefix and bytes, as given) with `grpc-encoding: {encoding}`, sent over
/// a raw HTTP/2 connection (tonic's client compresses what it sends itself).
async fn grpc_status_of_frame(
    server: &TestServer,
    encoding: &str,
    frame: Vec<u8>,
) -> (String, String) {
    let grpc = server.grpc_base.clone().expect("a gRPC listener");
    let tcp = tokio::net::TcpStream::connect(grpc.trim_start_matches("http://"))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    let driver = tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = axum::http::Request::post(format!("{grpc}{}", crate::otlp_fuzz::EXPORT_PATH))
        .header("content-type", "application/grpc")
        .header("grpc-encoding", encoding)
        .header("te", "trailers")
        .body(())
        .expect("a request");
    let (answer, mut send) = client.send_request(request, false).expect("sent");
    send.send_data(frame.into(), true).expect("the frame sent");
    let answer = answer.await.expect("answered");
    let (head, mut body) = answer.into_parts();
    while let Some(data) = body.data().await {
        let data = data.expect("the answer's body");
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await.expect("the trailers");
    let field = |name: &str| {
        trailers
            .as_ref()
            .and_then(|trailers| trailers.get(name))
            .or_else(|| head.headers.get(name))
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let message = percent_encoding::percent_decode_str(&field("grpc-message"))
        .decode_utf8_lossy()
        .into_owned();
    let status = (field("grpc-status"), message);
    driver.abort();
    status
}

/// A gzip-compressed gRPC message is one gzip member: tonic inflates the first and drops what
/// follows, so a message of two members (a valid gzip stream, which an OTLP/HTTP body may be)
/// was answered OK with the second member's span lost, and a member followed by garbage was
/// taken where an OTLP/HTTP body is refused (an audit's finding). Both are now
/// `INVALID_ARGUMENT` with nothing stored; one member still goes through.
#[tokio::test]
async fn a_grpc_message_of_two_gzip_members_is_refused_and_stores_nothing() {
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    use crate::otlp_fuzz::gzip;
    let first = gzip(&request(vec![root_span()]).encode_to_vec());
    let second = gzip(&request(vec![otlp_span(2, 1, 1_010, Vec::new())]).encode_to_vec());
    let frame = compressed_frame;
    for message in [
        [first.clone(), second].concat(),
        [first.clone(), b"garbage".to_vec()].concat(),
    ] {
        let (status, text) = grpc_status_of_frame(&server, "gzip", frame(&message)).await;
        assert_eq!(status, "3", "INVALID_ARGUMENT: {text}");
        assert!(text.contains("after its first gzip member"), "{text}");
        for span in [1, 2] {
            let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(span))).await;
            assert_eq!(status, 404, "span {span}: nothing stored");
        }
    }
    let (status, text) = grpc_status_of_frame(&server, "gzip", frame(&first)).await;
    assert_eq!(status, "0", "{text}");
    let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(status, 200);
    server.stop().await;
}

/// A frame flagged compressed: its 5-byte prefix, then `message`.
fn compressed_frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![1u8];
    frame.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// gRPC's `deflate` (zlib), which the OpenTelemetry Python gRPC exporter offers beside gzip,
/// is read: it was refused `UNIMPLEMENTED`, which that exporter does not retry, and every span
/// was lost (an audit's finding). As with gzip, bytes after the zlib stream (which tonic would
/// drop unread) refuse the message, and one inflating past the inflated limit (64 MiB, as for
/// an OTLP/HTTP body) is `RESOURCE_EXHAUSTED`, nothing stored either way.
#[tokio::test]
async fn a_deflate_compressed_grpc_export_is_stored() {
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let zlib = |bytes: &[u8]| {
        let mut encoder =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(bytes).expect("zlib");
        encoder.finish().expect("zlib")
    };
    let root = zlib(&request(vec![root_span()]).encode_to_vec());
    let followed = [root.clone(), b"garbage".to_vec()].concat();
    let (status, text) =
        grpc_status_of_frame(&server, "deflate", compressed_frame(&followed)).await;
    assert_eq!(status, "3", "INVALID_ARGUMENT: {text}");
    assert!(text.contains("after its first zlib stream"), "{text}");
    let mut bomb_span = otlp_span(2, 0, 1_010, Vec::new());
    // Past the 64 MiB inflated limit once inflated.
    bomb_span.name = "x".repeat(65 << 20);
    let bomb = zlib(&request(vec![bomb_span]).encode_to_vec());
    let (status, text) = grpc_status_of_frame(&server, "deflate", compressed_frame(&bomb)).await;
    assert_eq!(status, "8", "RESOURCE_EXHAUSTED: {text}");
    assert!(text.contains("decompressed"), "{text}");
    for span in [1, 2] {
        let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(span))).await;
        assert_eq!(status, 404, "span {span}: nothing stored");
    }
    let (status, text) = grpc_status_of_frame(&server, "deflate", compressed_frame(&root)).await;
    assert_eq!(status, "0", "{text}");
    let (status, span) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(status, 200, "{span}");
    assert_eq!(span["name"], "span-1");
    server.stop().await;
}

/// Every span keeps its resource's attributes, so one large resource over many spans made a
/// small export take hundreds of MiB and write as much (the audit's 249 KB export took 600 MiB
/// and wrote 290 MB): such an export is refused whole, 413 over HTTP and `RESOURCE_EXHAUSTED`
/// over gRPC, nothing stored; the same spans under a real resource are kept.
#[tokio::test]
async fn a_large_resource_over_many_spans_is_refused_whole() {
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let spans = || -> Vec<Span> {
        (1..=250u8)
            .map(|n| otlp_span(n, if n == 1 { 0 } else { 1 }, 1_000, Vec::new()))
            .collect()
    };
    let mut bomb = request(spans());
    bomb.resource_spans[0].resource = Some(Resource {
        attributes: (0..20)
            .map(|index| text(&format!("big.{index}"), &"r".repeat(16_000)))
            .collect(),
        ..Resource::default()
    });
    let body = bomb.encode_to_vec();
    assert!(body.len() < 400_000, "{}", body.len());
    let response = post_raw(&server, "application/x-protobuf", None, body.clone()).await;
    assert_eq!(response.status(), 413);
    let answer = grpc_export(&grpc_channel(&server).await, body, true)
        .await
        .expect("in time");
    let status = answer.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("copied into each"), "{status:?}");
    let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(status, 404, "nothing stored");
    let kept = export(&server, spans()).await;
    assert_eq!(kept.partial_success, None);
    server.stop().await;
}

/// A logs export of empty records nested under one resource decoded to 200 times its size (7
/// MiB, or 8 KB gzipped, took 1.4 GiB: an audit's finding), since only the top-level entries
/// were counted: refused before it is decoded, over gRPC and HTTP alike.
#[tokio::test]
async fn a_logs_export_of_empty_records_is_refused_before_it_is_decoded() {
    use crate::otlp_fuzz::{grpc_channel, grpc_unary};
    const LOGS: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let nest = |tag: u8, inner: &[u8]| {
        let mut out = vec![tag];
        prost::encoding::encode_varint(inner.len() as u64, &mut out);
        out.extend(inner);
        out
    };
    // One resource, one scope, then 3.6 million empty log records.
    let body = nest(0x0a, &nest(0x12, &b"\x12\x00".repeat(3_600_000)));
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gzip.write_all(&body).expect("gzip");
    let gzipped = gzip.finish().expect("gzip");
    let channel = grpc_channel(&server).await;
    let grpc =
        tonic::client::Grpc::new(channel).send_compressed(tonic::codec::CompressionEncoding::Gzip);
    let status = grpc_unary(grpc, LOGS, tonic::Request::new(body))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let response = server
        .client
        .post(format!("{}/v1/logs", server.base))
        .header("content-type", "application/x-protobuf")
        .header("content-encoding", "gzip")
        .body(gzipped)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 413);
    server.stop().await;
}

/// A gRPC message over the limit is `RESOURCE_EXHAUSTED` however it comes (just over the
/// limit, far over it, or compressed and inflating past the inflated limit), as the HTTP
/// listener answers 413: OTLP exporters do not retry it, since the same batch can never fit
/// (tonic's own code for the first case, `OUT_OF_RANGE`, is one they retry). A compressed
/// message is bounded as an OTLP/HTTP body is: as sent by the body limit, inflated by the
/// inflated limit; it was refused past the body limit, so a batch the HTTP listener took was
/// dropped over gRPC (an audit's finding).
#[tokio::test]
async fn an_oversized_grpc_message_is_resource_exhausted_however_it_comes() {
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    const LIMIT: usize = 64 * 1024;
    const INFLATED_LIMIT: usize = 256 * 1024;
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        config: flightlog_server::ServerConfig {
            body_limit: LIMIT,
            otlp_max_decompressed: INFLATED_LIMIT,
            ..flightlog_server::ServerConfig::default()
        },
        ..crate::support::Options::default()
    })
    .await;
    let channel = grpc_channel(&server).await;
    let message = |id: u8, size: usize| {
        request(vec![otlp_span(
            id,
            0,
            1_000,
            vec![text("big", &"a".repeat(size))],
        )])
        .encode_to_vec()
    };
    for (size, gzip, words) in [
        (LIMIT + 1_000, false, "--body-limit"),
        (4 * LIMIT, false, "--body-limit"),
        (2 * INFLATED_LIMIT, true, "decompressed"),
    ] {
        let answer = grpc_export(&channel, message(1, size), gzip)
            .await
            .expect("in time");
        let status = answer.expect_err("over the limit");
        assert_eq!(
            status.code(),
            tonic::Code::ResourceExhausted,
            "{size} bytes, gzip {gzip}: {status:?}"
        );
        assert!(status.message().contains(words), "{status:?}");
    }
    let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(1))).await;
    assert_eq!(status, 404, "nothing stored");
    // A message within the limit still goes through, and so does a compressed one that
    // inflates past the body limit but within the inflated limit (as over HTTP).
    for (id, size) in [(2, 1_000), (3, 3 * LIMIT)] {
        let answer = grpc_export(&channel, message(id, size), true)
            .await
            .expect("in time");
        assert!(answer.is_ok(), "{size} bytes: {answer:?}");
        let (status, _) = get_json(&server, &format!("/v1/activity/spans/{}", hex(id))).await;
        assert_eq!(status, 200, "{size} bytes stored");
    }
    server.stop().await;
}

/// A call that is not gRPC (another content-type) on the gRPC listener is answered 415 with
/// the contract's body, as gRPC asks of servers; a method this server does not have is
/// `UNIMPLEMENTED` with a message naming the ones it has.
#[tokio::test]
async fn the_grpc_listener_refuses_non_grpc_calls_and_names_its_methods() {
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let grpc = server.grpc_base.clone().expect("a gRPC listener");
    let addr = grpc.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    let driver = tokio::spawn(connection);
    let call = |path: &str, content_type: Option<&str>| {
        let mut request =
            axum::http::Request::post(format!("{grpc}{path}")).header("te", "trailers");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request.body(()).expect("a request")
    };
    const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
    for content_type in [Some("application/json"), None, Some("application/grpc-web")] {
        let mut client = client.clone().ready().await.expect("ready");
        let (answer, _) = client
            .send_request(call(EXPORT, content_type), true)
            .expect("sent");
        let answer = answer.await.expect("answered");
        assert_eq!(answer.status(), 415, "{content_type:?}");
        assert_eq!(answer.headers()["grpc-status"], "3");
        let mut body = answer.into_body();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            bytes.extend_from_slice(&chunk.expect("a chunk"));
        }
        let body: Value = serde_json::from_slice(&bytes).expect("the contract's body");
        assert_eq!(body["error"]["code"], "unsupported_media_type", "{body}");
    }
    for content_type in [
        "application/grpc",
        "application/grpc+proto",
        "Application/GRPC",
    ] {
        let mut client = client.clone().ready().await.expect("ready");
        let (answer, mut body) = client
            .send_request(call(EXPORT, Some(content_type)), false)
            .expect("sent");
        // An empty export message: OK.
        body.send_data(axum::body::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .expect("the message");
        let answer = answer.await.expect("answered");
        assert_eq!(answer.status(), 200, "{content_type}");
        let mut body = answer.into_body();
        while body.data().await.is_some() {}
        let trailers = body.trailers().await.expect("trailers").expect("some");
        assert_eq!(trailers["grpc-status"], "0", "{content_type}");
    }
    let channel = crate::otlp_fuzz::grpc_channel(&server).await;
    let mut grpc_client = tonic::client::Grpc::new(channel);
    grpc_client.ready().await.expect("ready");
    let status = grpc_client
        .unary::<Vec<u8>, Vec<u8>, _>(
            tonic::Request::new(Vec::new()),
            axum::http::uri::PathAndQuery::from_static(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Exportx",
            ),
            crate::otlp_fuzz::RawCodec,
        )
        .await
        .expect_err("no such method");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
    assert!(
        status.message().contains("Exportx") && status.message().contains(EXPORT),
        "{status:?}"
    );
    driver.abort();
    server.stop().await;
}

/// An answer to a protobuf export must be protobuf: the `Status` of an error, with `code`.
async fn assert_protobuf_status(response: reqwest::Response, http: u16, code: i32) {
    assert_eq!(response.status(), http);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("application/x-protobuf"),
        "a protobuf exporter reads a protobuf Status"
    );
    let bytes = response.bytes().await.expect("body");
    let status = RpcStatus::decode(bytes).expect("a google.rpc.Status");
    assert_eq!(status.code, code, "{status:?}");
    assert!(!status.message.is_empty());
}

/// Regression (found by an audit): the gate's refusals (a missing or wrong token, a token
/// without `ingest`, an overload) answered a protobuf export with the contract's JSON body,
/// which an OTLP exporter cannot read; the OTLP/HTTP specification asks for a protobuf
/// `Status` in every error answer to a protobuf request. JSON exports keep the contract's body.
#[tokio::test]
async fn the_gate_refuses_a_protobuf_export_with_a_protobuf_status() {
    use flightlog_server::auth::{AuthConfig, Scope, Scopes};
    let auth = AuthConfig::open()
        .with_token("ingest-secret", Scopes::default().with(Scope::Ingest))
        .and_then(|auth| auth.with_token("read-secret", Scopes::default().with(Scope::Read)))
        .expect("valid tokens");
    let server = TestServer::start_with(crate::support::Options {
        config: flightlog_server::ServerConfig {
            auth,
            ..flightlog_server::ServerConfig::default()
        },
        ..Default::default()
    })
    .await;
    let body = request(vec![]).encode_to_vec();
    let post = |token: Option<&'static str>, content_type: &'static str, body: Vec<u8>| {
        let mut builder = server
            .client
            .post(format!("{}/v1/traces", server.base))
            .header("content-type", content_type)
            .body(body);
        if let Some(token) = token {
            builder = builder.bearer_auth(token);
        }
        builder.send()
    };
    let response = post(None, "application/x-protobuf", body.clone())
        .await
        .unwrap();
    assert_protobuf_status(response, 401, 16).await;
    let response = post(Some("wrong"), "application/x-protobuf", body.clone())
        .await
        .unwrap();
    assert_protobuf_status(response, 401, 16).await;
    let response = post(Some("read-secret"), "application/x-protobuf", body.clone())
        .await
        .unwrap();
    assert_protobuf_status(response, 403, 7).await;
    let response = post(Some("ingest-secret"), "application/x-protobuf", body)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // JSON: the contract's error body.
    let response = post(None, "application/json", b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let error: Value = response.json().await.expect("JSON");
    assert_eq!(error["error"]["code"], "unauthorized");
    server.stop().await;

    let busy = TestServer::start_refusing_writes().await;
    let response = busy
        .client
        .post(format!("{}/v1/traces", busy.base))
        .header("content-type", "application/x-protobuf")
        .body(request(vec![]).encode_to_vec())
        .send()
        .await
        .unwrap();
    assert!(response.headers().contains_key("retry-after"));
    assert_protobuf_status(response, 503, 14).await;
    busy.stop().await;
}

/// Regression (found by an audit): a request with resources or scopes but no spans got 400
/// over HTTP and OK over gRPC. The OTLP specification has an empty request answered with
/// success, in both transports; nothing is stored.
#[tokio::test]
async fn an_empty_export_is_a_success_that_stores_nothing() {
    let server = TestServer::start().await;
    let empty = export(&server, vec![]).await;
    assert_eq!(empty.partial_success, None);
    for body in [
        r#"{}"#,
        r#"{"resourceSpans":[]}"#,
        r#"{"resourceSpans":[{"resource":{},"scopeSpans":[{"scope":{},"spans":[]}]}]}"#,
    ] {
        let response = post_raw(&server, "application/json", None, body.as_bytes().to_vec()).await;
        assert_eq!(response.status(), 200, "{body}");
        let answer: Value = response.json().await.expect("JSON");
        assert_eq!(answer, json!({}), "{body}");
    }
    // Another signal's export sent here by mistake is not mistaken for an empty one.
    let response = post_raw(
        &server,
        "application/json",
        None,
        br#"{"resourceLogs":[]}"#.to_vec(),
    )
    .await;
    assert_eq!(response.status(), 400);
    let (status, runs) = get_json(&server, "/v1/activity/runs").await;
    assert_eq!(status, 200);
    assert_eq!(runs["runs"], json!([]));
    server.stop().await;
}

/// Issue 5's "a span started through the native API and later delivered by OTLP is completed,
/// not duplicated", over HTTP (the store's own test of it is in flightlog-sqlite's
/// `tests/import.rs`): a root started with `POST /v1/activity/spans` under the
/// trace's and span's lower-case hex ids, with an event, then delivered by `POST /v1/traces`
/// ended OK with that event again and one more. One span, ended `success` at the delivery's end;
/// what otlp.md says a natively started span keeps (name, kind, session, start) kept, its attrs
/// merged with the delivery's; the held event not added again, the new one added; the
/// completion a change of the run like a native end; and a retry of the export changes nothing.
#[tokio::test]
async fn a_natively_started_span_delivered_by_otlp_is_completed_not_duplicated() {
    let server = TestServer::start().await;
    let root = hex(1);
    server
        .post(
            "/v1/activity/spans",
            &json!({
                "spanId": root, "runId": TRACE_HEX, "name": "native name", "kind": "turn",
                "origin": "session", "sessionId": "s1", "attrs": {"native": true},
                "startedAt": 900,
            }),
        )
        .await
        .assert_status(201);
    server
        .post(
            &format!("/v1/activity/spans/{root}/events"),
            &json!({"eventType": "exception", "payload": {"a": 1}, "ts": 950}),
        )
        .await
        .assert_status(201);

    // The exporter's copy says otherwise about the name, kind, session and start.
    let mut delivered = otlp_span(
        1,
        0,
        1_000,
        vec![
            text("gen_ai.operation.name", "execute_tool"),
            text("session.id", "otlp-session"),
            text("tool.name", "search"),
        ],
    );
    delivered.events = vec![
        span::Event {
            time_unix_nano: 950_000_000,
            name: "exception".into(),
            attributes: vec![int("a", 1)],
            ..span::Event::default()
        },
        span::Event {
            time_unix_nano: 960_000_000,
            name: "second".into(),
            attributes: vec![int("b", 2)],
            ..span::Event::default()
        },
    ];
    let answer = export(&server, vec![delivered.clone()]).await;
    assert_eq!(answer.partial_success, None);

    let snapshot_path = format!("/v1/activity/runs/{TRACE_HEX}/snapshot");
    let (status, snapshot) = get_json(&server, &snapshot_path).await;
    assert_eq!(status, 200, "{snapshot}");
    let spans = snapshot["spans"].as_array().expect("spans");
    assert_eq!(spans.len(), 1, "one span, not a second copy: {snapshot}");
    let span = &spans[0];
    assert_eq!(span["spanId"], root);
    assert_eq!(span["outcome"], "success");
    assert_eq!(span["endedAt"], 1_050, "the delivery's end");
    assert_eq!(
        span["name"], "native name",
        "the native start's fields are kept"
    );
    assert_eq!(span["kind"], "turn");
    assert_eq!(span["sessionId"], "s1");
    assert_eq!(span["startedAt"], 900);
    assert_eq!(span["parentSpanId"], Value::Null);
    assert_eq!(span["attrs"]["native"], true, "attrs merged: {span}");
    assert_eq!(span["attrs"]["tool.name"], "search", "attrs merged: {span}");
    assert_eq!(span["attrs"]["resource"]["service.name"], "test-agent");
    let (_, by_id) = get_json(&server, &format!("/v1/activity/spans/{root}")).await;
    assert_eq!(&by_id, span, "the span read alone is the snapshot's");
    let events: Vec<(Value, Value, Value)> = snapshot["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| {
            (
                event["eventType"].clone(),
                event["ts"].clone(),
                event["payload"].clone(),
            )
        })
        .collect();
    assert_eq!(
        events,
        vec![
            (json!("exception"), json!(950), json!({"a": 1})),
            (json!("second"), json!(960), json!({"b": 2})),
        ],
        "the event it held is not added again"
    );

    // The completion and the new event are changes of the run, after the native two.
    let (_, changes) = get_json(&server, "/v1/activity/changes?after=0").await;
    let changes = changes.as_array().expect("changes");
    let seqs: Vec<&Value> = changes.iter().map(|change| &change["seq"]).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "{changes:?}");
    assert!(changes.iter().all(|change| change["runId"] == TRACE_HEX));
    assert_eq!(changes[2]["span"]["outcome"], "success", "{changes:?}");
    assert_eq!(changes[3]["event"]["eventType"], "second", "{changes:?}");
    let (status, rollup) =
        get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(status, 200, "the completed run is rolled up");
    assert_eq!(rollup["spanCount"], 1);
    assert_eq!(rollup["outcome"], "success");

    // An exporter retry: nothing written, nothing doubled.
    export(&server, vec![delivered]).await;
    let (_, again) = get_json(&server, "/v1/activity/changes?after=0").await;
    assert_eq!(again.as_array().map(Vec::len), Some(4), "{again}");
    let (_, after_retry) = get_json(&server, &snapshot_path).await;
    assert_eq!(after_retry["spans"], snapshot["spans"]);
    assert_eq!(after_retry["events"], snapshot["events"]);
    server.stop().await;
}

/// An open model span (announced with `endTimeUnixNano` 0) completed by a copy that lacks some
/// counts keeps the counts it held, and its price-table cost is of all of them (it was of the
/// copy's counts alone: 0.000006 USD for 0.015006 USD of tokens). A cost reported by either
/// delivery wins over one priced, and the attrs say where the kept cost came from. An
/// announcement sent again that changes nothing is no change in the run's log.
#[tokio::test]
async fn an_open_span_completed_by_a_copy_short_of_counts_is_priced_on_all_it_holds() {
    let server = TestServer::start().await;
    let announced = |n: u8, attributes: Vec<KeyValue>| {
        let mut span = otlp_span(n, 0, 1_000 + u64::from(n), attributes);
        span.end_time_unix_nano = 0;
        span.status = None;
        span
    };
    let model = || text("gen_ai.request.model", "gpt-4o-mini");
    let chat = || text("gen_ai.operation.name", "chat");
    let priced_announcement = announced(
        1,
        vec![chat(), model(), int("gen_ai.usage.input_tokens", 100_000)],
    );
    export(&server, vec![priced_announcement.clone()]).await;
    let seq_path = format!("/v1/activity/runs/{TRACE_HEX}/seq");
    let (_, seq) = get_json(&server, &seq_path).await;
    export(&server, vec![priced_announcement]).await;
    let (_, seq_again) = get_json(&server, &seq_path).await;
    assert_eq!(seq_again, seq, "a repeated announcement changes nothing");

    let mut output_only = otlp_span(
        1,
        0,
        1_001,
        vec![chat(), model(), int("gen_ai.usage.output_tokens", 10)],
    );
    output_only.end_time_unix_nano = 1_100 * 1_000_000;
    // Reported first, then a copy the price table prices.
    let reported_announcement = announced(
        2,
        vec![
            chat(),
            model(),
            attr("gen_ai.usage.cost", any_value::Value::DoubleValue(0.5)),
        ],
    );
    let priced_copy = otlp_span(
        2,
        0,
        1_002,
        vec![chat(), model(), int("gen_ai.usage.input_tokens", 1_000)],
    );
    // Priced first, then a copy that reports its cost.
    let priced_then_reported = announced(
        3,
        vec![chat(), model(), int("gen_ai.usage.input_tokens", 1_000)],
    );
    let reported_copy = otlp_span(
        3,
        0,
        1_003,
        vec![
            chat(),
            model(),
            attr("gen_ai.usage.cost", any_value::Value::DoubleValue(0.25)),
        ],
    );
    // Anthropic's raw input (cache excluded) announced, the cache read in the final copy: the
    // cache is counted into the input over the merged counts, as within one delivery.
    let claude = || text("gen_ai.request.model", "claude-sonnet-4-20250514");
    let raw_input = announced(
        4,
        vec![chat(), claude(), int("gen_ai.usage.input_tokens", 100)],
    );
    let cache_copy = otlp_span(
        4,
        0,
        1_004,
        vec![
            chat(),
            claude(),
            int("gen_ai.usage.cache_read_input_tokens", 5_000),
        ],
    );
    export(
        &server,
        vec![reported_announcement, priced_then_reported, raw_input],
    )
    .await;
    export(
        &server,
        vec![output_only, priced_copy, reported_copy, cache_copy],
    )
    .await;

    let span = |n: u8| {
        let server = &server;
        async move {
            get_json(server, &format!("/v1/activity/spans/{}", hex(n)))
                .await
                .1
        }
    };
    let first = span(1).await;
    assert_eq!(first["outcome"], "success", "{first}");
    assert_eq!(first["usage"]["inputTokens"], 100_000, "{first}");
    assert_eq!(first["usage"]["outputTokens"], 10, "{first}");
    // 100,000 × $0.15 + 10 × $0.60, per million.
    assert_eq!(first["usage"]["costUsd"], 0.015006, "{first}");
    assert_eq!(first["attrs"]["flightlog.cost_source"], "price_table");

    let second = span(2).await;
    assert_eq!(second["usage"]["inputTokens"], 1_000, "{second}");
    assert_eq!(
        second["usage"]["costUsd"], 0.5,
        "the reported cost stays: {second}"
    );
    assert_eq!(second["attrs"]["flightlog.cost_source"], "reported");
    assert_eq!(
        second["attrs"].get("flightlog.price_table"),
        None,
        "{second}"
    );

    let fourth = span(4).await;
    assert_eq!(fourth["usage"]["inputTokens"], 5_100, "{fourth}");
    assert_eq!(fourth["usage"]["cacheReadTokens"], 5_000, "{fourth}");
    // 100 uncached × $3 + 5,000 cached × $0.30, per million.
    assert_eq!(fourth["usage"]["costUsd"], 0.0018, "{fourth}");

    let third = span(3).await;
    assert_eq!(third["usage"]["costUsd"], 0.25, "{third}");
    assert_eq!(third["attrs"]["flightlog.cost_source"], "reported");
    assert_eq!(
        third["attrs"].get("flightlog.price_table"),
        None,
        "no price table priced the kept cost: {third}"
    );
}

/// A span announced open under a parent not stored yet is a root while it runs; closed by the
/// server meanwhile (its run closed, a stale sweep), its completed copy, naming the parent now
/// stored, was a repeated delivery: the run kept two roots for good and the parent the copy
/// named was thrown away (an audit's finding). The copy now moves it under its parent, its
/// outcome kept (written once), the move change-logged, and the run rolled up from its one
/// root.
#[tokio::test]
async fn a_closed_provisional_root_moves_under_the_parent_its_completed_copy_names() {
    let server = TestServer::start().await;
    let mut announced = otlp_span(
        2,
        1,
        1_010,
        vec![text("gen_ai.operation.name", "execute_tool")],
    );
    announced.end_time_unix_nano = 0;
    announced.status = None;
    export(&server, vec![announced]).await;
    let (_, tool) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    assert_eq!(
        tool["parentSpanId"],
        Value::Null,
        "a root while its parent is not stored"
    );
    server
        .post(
            &format!("/v1/activity/runs/{TRACE_HEX}/close"),
            &json!({"outcome": "cancelled", "reason": "closed by hand"}),
        )
        .await
        .assert_status(200);
    let (_, closed) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    let outcome = closed["outcome"].clone();
    assert_ne!(outcome, Value::Null, "closed by the server: {closed}");

    export(&server, vec![root_span()]).await;
    let seq_path = format!("/v1/activity/runs/{TRACE_HEX}/seq");
    let (_, before) = get_json(&server, &seq_path).await;
    let answer = export(&server, vec![otlp_span(2, 1, 1_010, Vec::new())]).await;
    assert_eq!(answer.partial_success, None);
    let (_, moved) = get_json(&server, &format!("/v1/activity/spans/{}", hex(2))).await;
    assert_eq!(moved["parentSpanId"], hex(1), "under its parent: {moved}");
    assert_eq!(
        moved["outcome"], outcome,
        "the outcome is written once: {moved}"
    );
    let (_, after) = get_json(&server, &seq_path).await;
    assert_eq!(
        after["highWaterSeq"].as_i64(),
        before["highWaterSeq"].as_i64().map(|seq| seq + 1),
        "the move is one change"
    );
    let (_, rollup) = get_json(&server, &format!("/v1/activity/runs/{TRACE_HEX}/rollup")).await;
    assert_eq!(rollup["name"], "span-1", "named by its one root: {rollup}");
    assert_eq!(rollup["spanCount"], 2, "{rollup}");
    // Sent again: nothing more.
    export(&server, vec![otlp_span(2, 1, 1_010, Vec::new())]).await;
    let (_, again) = get_json(&server, &seq_path).await;
    assert_eq!(again, after);
    server.stop().await;
}

/// A gRPC (HTTP/2) client given the HTTP port by mistake (4318 for 4317) hears, in HTTP/2, why
/// and where to go: the server's SETTINGS, then `GOAWAY` with `HTTP_1_1_REQUIRED` whose debug
/// data (which gRPC clients print) names the gRPC listener. hyper answered nothing and dropped
/// the connection, and the exporter only said "connection closed". HTTP/1.1 requests, even one
/// that starts as the preface does or arrives a byte at a time, are served as before. The other
/// way round, an HTTP/1.1 request on the gRPC port is answered 400 naming the HTTP listener.
#[tokio::test]
async fn a_client_on_the_other_listeners_port_is_told_where_to_go() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start_with(crate::support::Options {
        grpc: true,
        ..crate::support::Options::default()
    })
    .await;
    let grpc = server.grpc_base.clone().expect("a gRPC listener");
    let grpc_addr = grpc.trim_start_matches("http://").to_owned();
    let http_addr = server.base.trim_start_matches("http://").to_owned();
    let within = std::time::Duration::from_secs(10);

    // A raw HTTP/2 client: its preface (in two pieces) and an empty SETTINGS frame.
    let mut raw = tokio::net::TcpStream::connect(&http_addr)
        .await
        .expect("connect");
    raw.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    raw.write_all(b"\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let goaway = tokio::time::timeout(within, async {
        loop {
            // Frames: a 9-byte header (24-bit length, type, flags, stream id), then the payload.
            let mut at = 0;
            while let Some(header) = answer.get(at..at + 9) {
                let length = usize::from(header[0]) << 16
                    | usize::from(header[1]) << 8
                    | usize::from(header[2]);
                let kind = header[3];
                let Some(payload) = answer.get(at + 9..at + 9 + length) else {
                    break;
                };
                if kind == 0x7 {
                    return Some((at, payload.to_vec()));
                }
                at += 9 + length;
            }
            let mut chunk = [0u8; 4096];
            match raw.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(count) => answer.extend_from_slice(&chunk[..count]),
            }
        }
    })
    .await
    .expect("an answer within 10 s");
    let (at, payload) = goaway.unwrap_or_else(|| panic!("no GOAWAY in {answer:?}"));
    assert_eq!(
        answer.get(..9),
        Some(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0][..]),
        "the server's preface, an empty SETTINGS frame, comes first"
    );
    assert_eq!(at, 9, "then the GOAWAY");
    assert_eq!(
        payload.get(..4),
        Some(&[0, 0, 0, 0][..]),
        "no stream processed"
    );
    assert_eq!(
        payload.get(4..8),
        Some(&[0, 0, 0, 0xd][..]),
        "HTTP_1_1_REQUIRED"
    );
    let debug = String::from_utf8_lossy(payload.get(8..).unwrap_or_default()).into_owned();
    assert!(
        debug.contains("HTTP/1.1 only") && debug.contains(&format!("gRPC listener at {grpc_addr}")),
        "{debug}"
    );
    // Once the client closes, so does the server.
    raw.shutdown().await.expect("close");
    let mut rest = [0u8; 64];
    let closed = tokio::time::timeout(within, raw.read(&mut rest)).await;
    assert!(
        matches!(closed, Ok(Ok(0) | Err(_))),
        "the server closes too: {closed:?}"
    );

    // The h2 crate's client sees the refusal as a GOAWAY with HTTP_1_1_REQUIRED.
    let tcp = tokio::net::TcpStream::connect(&http_addr)
        .await
        .expect("connect");
    let refused = tokio::time::timeout(within, async {
        let (client, connection) = h2::client::handshake(tcp).await?;
        let driver = tokio::spawn(connection);
        let mut client = client.ready().await?;
        let request = axum::http::Request::post(format!(
            "{}/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            server.base
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request");
        let (answer, _) = client.send_request(request, true)?;
        let answer = answer.await;
        driver.abort();
        answer.map(|_| ())
    })
    .await
    .expect("refused within 10 s");
    let error = refused.expect_err("no HTTP/2 request is served on the HTTP port");
    assert_eq!(
        error.reason(),
        Some(h2::Reason::HTTP_1_1_REQUIRED),
        "{error:?}"
    );

    // HTTP/1.1 goes on: a request that starts as the preface does, and one sent a byte at a time.
    for (request, pause) in [
        (
            &b"PRI /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"[..],
            false,
        ),
        (
            &b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"[..],
            true,
        ),
    ] {
        let mut http1 = tokio::net::TcpStream::connect(&http_addr)
            .await
            .expect("connect");
        for byte in request {
            http1.write_all(&[*byte]).await.expect("write");
            if pause {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
        let head = tokio::time::timeout(within, crate::support::read_answer_head(&mut http1))
            .await
            .expect("an answer within 10 s")
            .expect("an HTTP/1.1 answer");
        assert!(head.0 == 200 || head.0 == 404 || head.0 == 405, "{head:?}");
        if !pause {
            assert!(head.1.contains("application/json"), "{head:?}");
        } else {
            assert_eq!(head.0, 200, "{head:?}");
        }
    }

    // The other slip: an OTLP/HTTP exporter (HTTP/1.1) given the gRPC port gets a 400 with the
    // contract's body naming the HTTP listener, not a reset.
    let answer = server
        .client
        .post(format!("{grpc}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(vec![0u8; 100])
        .send()
        .await
        .expect("an HTTP/1.1 answer from the gRPC port");
    assert_eq!(answer.status(), 400);
    let body: Value = answer.json().await.expect("the contract's error body");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("OTLP/gRPC listener") && message.contains(&server.base),
        "{message}"
    );
    // And the gRPC listener still serves gRPC.
    let channel = crate::otlp_fuzz::grpc_channel(&server).await;
    let answer =
        crate::otlp_fuzz::grpc_export(&channel, request(vec![root_span()]).encode_to_vec(), false)
            .await
            .expect("in time");
    assert!(answer.is_ok(), "{answer:?}");
    server.stop().await;
}
