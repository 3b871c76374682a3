//! A bounded, deterministic robustness ("fuzz") test of OpenTelemetry trace ingest, checking the
//! repository rule "bad input gets a clear error, never a panic, and never loses what was already
//! stored" on the two OTLP doors of one real server: `POST /v1/traces` (protobuf and OTLP/JSON,
//! each also gzip-compressed) and the gRPC `TraceService/Export` listener.
//!
//! It stores a finished, agent-shaped trace first (an `invoke_agent` root, model spans with
//! `gen_ai.usage.*` and OpenInference token counts, tools, a failed tool, a subagent, span events
//! and a link) and records what the reads return for it. Then a seeded xorshift generator derives
//! a few thousand requests from valid ones: byte-level protobuf mutations (bit flips, truncation,
//! inserted and deleted bytes, lying length prefixes, repeated, dropped and renumbered fields,
//! invalid UTF-8 in strings), semantic mutations of the decoded messages (ids of every wrong
//! length, all-zero ids, self-parents and parent cycles, extreme and inverted times, thousands of
//! attributes, events, links and spans, every `AnyValue` type, huge strings, deep nesting, odd
//! token counts, unknown enums, Logfire pending spans with bad parents, duplicate span ids within
//! and across requests), OTLP/JSON text mutations (wrong types, non-hex and odd-length ids,
//! out-of-range 64-bit strings, enums as strings, trailing garbage, non-UTF-8) and header
//! mutations (content types, content encodings, gzip of garbage, truncated and double gzip, gzip
//! bombs and bodies over the inflate limit, bad writer headers, other methods and paths). Some
//! requests target the stored trace itself: redeliveries of its spans, identical or altered, and
//! its span ids under other traces. The server runs with a 3 MiB body limit and a 2 MiB inflate
//! limit, so that the limits are reached cheaply.
//!
//! Every answer must be 2xx or 4xx within 10 s on a connection that stays up (gRPC: `OK`, or
//! the status tonic itself gives a message it cannot decode or that is too large), in the
//! request's encoding (a protobuf request gets protobuf, an `ExportTraceServiceResponse` or a
//! `google.rpc.Status`; anything else the contract's JSON), and a `partialSuccess` must count
//! its rejected spans and say why. Input that cannot be valid must not be a full success.
//!
//! Afterwards the stored trace must read back exactly as before. Every one of its spans is
//! terminal and the fuzzing never sends a *new* span id under its trace id (that would be a
//! legitimate straggler, changing the rollup), so no request can legitimately change it: a
//! redelivered terminal span is left alone, whatever the delivery says. The change log must be
//! gap-free and every page readable, every run the fuzzing created must read back, and the
//! server must still answer `/healthz` and stop cleanly. Request counts per encoding and per
//! mutation family, with their status histograms, are printed (`--nocapture` shows them).
//!
//! The defects it found are fixed, and their minimal reproductions stay at the end of this file
//! as regression tests: a protobuf request's 413 answered in JSON (past the inflate limit, and
//! past the body limit), a body over the body limit answered by a reset connection instead of
//! its 413, and a run with several root spans cutting the run list short.
//! The fuzzing keeps clear of those exact inputs (protobuf bodies stay within the inflate limit,
//! HTTP bodies within the body limit, mass-produced spans are not roots, the run list is read in
//! one page), so it stays green until they are fixed.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::time::{Duration, Instant};

use flightlog_otlp::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use flightlog_server::ServerConfig;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use prost::bytes::{Buf, BufMut};
use prost::Message;
use reqwest::header::{HeaderValue, CONTENT_ENCODING, CONTENT_TYPE};
use reqwest::Method;
use serde_json::{json, Value};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;

use crate::support::{
    assert_no_fuzz_failures, contract_error_problem, fuzz_seed, segment, Options, Rng, RpcStatus,
    TestServer,
};

/// The fixed seed: the same requests on every run (`FLIGHTLOG_FUZZ_SEED` explores others).
const SEED: u64 = 0x07e1_f022_a5ee_d001;
/// Rounds of [`PLAN`]: `ROUNDS * PLAN.len()` requests.
const ROUNDS: usize = 140;
/// Longer than any answer of this server takes; past it the request counts as hung.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The server's body limit here (the default is 8 MiB): small enough that the fuzzing reaches it.
const BODY_LIMIT: usize = 3 * 1024 * 1024;
/// The most a gzip body may inflate to (the default is 64 MiB), for the same reason.
const MAX_DECOMPRESSED: usize = 2 * 1024 * 1024;
pub(crate) const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The stored trace ("KEEP" and a fixed tail) and its spans' ids (`KEEP`, 0, 0, 0, n).
const KEEP_TRACE: [u8; 16] = [
    0x4b, 0x45, 0x45, 0x50, 0x7a, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb,
];
const KEEP_SPANS: u8 = 7;
const KEEP_START_MS: u64 = 1_700_000_000_000;

/// `len` random bytes that are not all zero (a wrong-length id that is also zero would be
/// refused for two reasons at once).
fn id_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut bytes = rng.bytes(len);
    if let Some(first) = bytes.first_mut() {
        *first |= 0x01;
    }
    bytes
}

// ---------------------------------------------------------------------------------------------
// OTLP building blocks

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn ms(millis: u64) -> u64 {
    millis * 1_000_000
}

fn kv(key: &str, value: Option<any_value::Value>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value }),
        ..KeyValue::default()
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    kv(key, Some(any_value::Value::StringValue(value.into())))
}

fn int(key: &str, value: i64) -> KeyValue {
    kv(key, Some(any_value::Value::IntValue(value)))
}

fn double(key: &str, value: f64) -> KeyValue {
    kv(key, Some(any_value::Value::DoubleValue(value)))
}

fn array(values: Vec<Option<any_value::Value>>) -> any_value::Value {
    any_value::Value::ArrayValue(ArrayValue {
        values: values.into_iter().map(|value| AnyValue { value }).collect(),
    })
}

fn kvlist(values: Vec<KeyValue>) -> any_value::Value {
    any_value::Value::KvlistValue(KeyValueList { values })
}

fn event(time_ms: u64, name: &str, attributes: Vec<KeyValue>) -> span::Event {
    span::Event {
        time_unix_nano: ms(time_ms),
        name: name.into(),
        attributes,
        ..span::Event::default()
    }
}

fn ok_status() -> Option<Status> {
    Some(Status {
        code: status::StatusCode::Ok as i32,
        message: String::new(),
    })
}

fn error_status(message: &str) -> Option<Status> {
    Some(Status {
        code: status::StatusCode::Error as i32,
        message: message.into(),
    })
}

fn request_of(spans: Vec<Span>, service: &str) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service),
                    text("telemetry.sdk.language", "rust"),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "flightlog.otlp_fuzz".into(),
                    version: "1.0.0".into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

fn span_count(request: &ExportTraceServiceRequest) -> usize {
    request
        .resource_spans
        .iter()
        .flat_map(|resource| &resource.scope_spans)
        .map(|scope| scope.spans.len())
        .sum()
}

fn spans_mut(request: &mut ExportTraceServiceRequest) -> impl Iterator<Item = &mut Span> {
    request
        .resource_spans
        .iter_mut()
        .flat_map(|resource| resource.scope_spans.iter_mut())
        .flat_map(|scope| scope.spans.iter_mut())
}

fn span_at(request: &mut ExportTraceServiceRequest, index: usize) -> Option<&mut Span> {
    spans_mut(request).nth(index)
}

/// Where new spans go: the first scope of the request (created when there is none).
fn first_scope(request: &mut ExportTraceServiceRequest) -> &mut Vec<Span> {
    if request.resource_spans.is_empty() {
        request.resource_spans.push(ResourceSpans::default());
    }
    let resource = &mut request.resource_spans[0];
    if resource.scope_spans.is_empty() {
        resource.scope_spans.push(ScopeSpans::default());
    }
    &mut resource.scope_spans[0].spans
}

// ---------------------------------------------------------------------------------------------
// The stored trace

fn keep_span_id(n: u8) -> Vec<u8> {
    vec![0x4b, 0x45, 0x45, 0x50, 0, 0, 0, n]
}

/// The stored trace: finished, agent-shaped, every span terminal.
fn keep_spans() -> Vec<Span> {
    let make = |n: u8,
                parent: Option<u8>,
                name: &str,
                (start, end): (u64, u64),
                kind: span::SpanKind,
                attributes: Vec<KeyValue>| Span {
        trace_id: KEEP_TRACE.to_vec(),
        span_id: keep_span_id(n),
        parent_span_id: parent.map(keep_span_id).unwrap_or_default(),
        name: name.into(),
        kind: kind as i32,
        start_time_unix_nano: ms(KEEP_START_MS + start),
        end_time_unix_nano: ms(KEEP_START_MS + end),
        attributes,
        status: ok_status(),
        ..Span::default()
    };
    let mut root = make(
        1,
        None,
        "invoke_agent support-agent",
        (0, 9_000),
        span::SpanKind::Server,
        vec![
            text("gen_ai.operation.name", "invoke_agent"),
            text("gen_ai.agent.name", "support-agent"),
            text("session.id", "keep-session"),
        ],
    );
    root.events = vec![event(
        KEEP_START_MS + 1,
        "agent.start",
        vec![text("input", "my order never arrived")],
    )];
    let mut chat = make(
        2,
        Some(1),
        "chat gpt-4o",
        (100, 2_100),
        span::SpanKind::Client,
        vec![
            text("gen_ai.operation.name", "chat"),
            text("gen_ai.system", "openai"),
            text("gen_ai.request.model", "gpt-4o"),
            text("gen_ai.response.model", "gpt-4o-2024-08-06"),
            int("gen_ai.usage.input_tokens", 1_200),
            int("gen_ai.usage.output_tokens", 300),
            int("gen_ai.usage.cache_read.input_tokens", 200),
        ],
    );
    chat.events = vec![
        event(
            KEEP_START_MS + 150,
            "gen_ai.content.prompt",
            vec![text("gen_ai.prompt", "where is order 42?")],
        ),
        event(
            KEEP_START_MS + 2_000,
            "gen_ai.content.completion",
            vec![text("gen_ai.completion", "let me look it up")],
        ),
    ];
    let mut tool = make(
        3,
        Some(1),
        "execute_tool search_orders",
        (2_200, 2_900),
        span::SpanKind::Internal,
        vec![
            text("gen_ai.operation.name", "execute_tool"),
            text("gen_ai.tool.name", "search_orders"),
            text("gen_ai.tool.call.id", "call-1"),
        ],
    );
    tool.links = vec![span::Link {
        trace_id: KEEP_TRACE.to_vec(),
        span_id: keep_span_id(2),
        attributes: vec![text("link.kind", "caused_by")],
        ..span::Link::default()
    }];
    let mut failed = make(
        4,
        Some(3),
        "execute_tool fetch_tracking",
        (2_300, 2_800),
        span::SpanKind::Client,
        vec![
            text("gen_ai.operation.name", "execute_tool"),
            text("gen_ai.tool.name", "fetch_tracking"),
        ],
    );
    failed.status = error_status("connection refused");
    failed.events = vec![event(
        KEEP_START_MS + 2_790,
        "exception",
        vec![
            text("exception.type", "ConnectionError"),
            text("exception.message", "connection refused"),
        ],
    )];
    let llm = make(
        5,
        Some(1),
        "claude",
        (3_000, 5_000),
        span::SpanKind::Client,
        vec![
            text("openinference.span.kind", "LLM"),
            text("llm.model_name", "claude-sonnet-4-20250514"),
            text("llm.token_count.prompt", "800"),
            double("llm.token_count.completion", 150.0),
        ],
    );
    let subagent = make(
        6,
        Some(1),
        "invoke_agent researcher",
        (5_100, 8_500),
        span::SpanKind::Internal,
        vec![
            text("gen_ai.operation.name", "invoke_agent"),
            text("gen_ai.agent.name", "researcher"),
        ],
    );
    let sub_chat = make(
        7,
        Some(6),
        "chat gpt-4o-mini",
        (5_200, 8_000),
        span::SpanKind::Client,
        vec![
            text("gen_ai.operation.name", "chat"),
            text("gen_ai.request.model", "gpt-4o-mini"),
            int("gen_ai.usage.input_tokens", 500),
            int("gen_ai.usage.output_tokens", 120),
            double("gen_ai.usage.cost", 0.0042),
        ],
    );
    let spans = vec![root, chat, tool, failed, llm, subagent, sub_chat];
    assert_eq!(spans.len(), usize::from(KEEP_SPANS));
    spans
}

// ---------------------------------------------------------------------------------------------
// Valid requests the mutations start from

fn fuzz_trace(n: u64) -> Vec<u8> {
    let mut id = vec![0xf0, 0x22, 0, 0, 0, 0, 0, 0];
    id.extend(n.to_be_bytes());
    id
}

fn fuzz_span_id(n: u64, i: u64) -> Vec<u8> {
    ((0xa0 << 56) | ((n & 0xffff_ffff_ffff) << 8) | (i & 0xff))
        .to_be_bytes()
        .to_vec()
}

/// A valid export of trace `n`: an agent root and a few children of every kind, in any order.
fn valid_request(n: u64, rng: &mut Rng) -> ExportTraceServiceRequest {
    let trace = fuzz_trace(n);
    let start = KEEP_START_MS + 100_000 + n * 10_000;
    let span =
        |i: u64, parent: Option<u64>, name: &str, offset: u64, attributes: Vec<KeyValue>| Span {
            trace_id: trace.clone(),
            span_id: fuzz_span_id(n, i),
            parent_span_id: parent.map(|p| fuzz_span_id(n, p)).unwrap_or_default(),
            name: name.into(),
            kind: (i % 6) as i32,
            start_time_unix_nano: ms(start + offset),
            end_time_unix_nano: ms(start + offset + 500),
            attributes,
            status: ok_status(),
            ..Span::default()
        };
    let root_attributes = match rng.below(3) {
        0 => vec![text("gen_ai.operation.name", "invoke_agent")],
        1 => vec![text("openinference.span.kind", "AGENT")],
        _ => vec![text("traceloop.span.kind", "workflow")],
    };
    let mut root = span(1, None, "agent run", 0, root_attributes);
    root.end_time_unix_nano = ms(start + 5_000);
    root.events = vec![event(start + 1, "agent.start", vec![int("step", 0)])];
    let mut spans = vec![root];
    for i in 2..=rng.range(2, 6) as u64 {
        let parent = 1 + rng.below(i as usize - 1) as u64;
        let offset = 100 * i;
        let child = match rng.below(5) {
            0 => {
                let mut chat = span(
                    i,
                    Some(parent),
                    "chat",
                    offset,
                    vec![
                        text("gen_ai.operation.name", "chat"),
                        text("gen_ai.request.model", "gpt-4o-mini"),
                        int("gen_ai.usage.input_tokens", 100 + i as i64),
                        int("gen_ai.usage.output_tokens", 10),
                    ],
                );
                chat.events = vec![event(start + offset + 1, "token", vec![int("i", 1)])];
                chat
            }
            1 => span(
                i,
                Some(parent),
                "llm",
                offset,
                vec![
                    text("openinference.span.kind", "LLM"),
                    text("llm.model_name", "claude-3-5-haiku"),
                    text("llm.token_count.prompt", "40"),
                    double("llm.token_count.completion", 7.0),
                ],
            ),
            2 => {
                let mut tool = span(
                    i,
                    Some(parent),
                    "execute_tool lookup",
                    offset,
                    vec![
                        text("gen_ai.operation.name", "execute_tool"),
                        text("gen_ai.tool.name", "lookup"),
                    ],
                );
                tool.links = vec![span::Link {
                    trace_id: trace.clone(),
                    span_id: fuzz_span_id(n, 1),
                    ..span::Link::default()
                }];
                tool
            }
            3 => {
                let mut failed = span(
                    i,
                    Some(parent),
                    "execute_tool fail",
                    offset,
                    vec![text("gen_ai.operation.name", "execute_tool")],
                );
                failed.status = error_status("tool exploded");
                failed.events = vec![event(
                    start + offset + 400,
                    "exception",
                    vec![text("exception.message", "boom")],
                )];
                failed
            }
            _ => span(
                i,
                Some(parent),
                "retrieve",
                offset,
                vec![
                    text("openinference.span.kind", "RETRIEVER"),
                    kv(
                        "documents",
                        Some(array(vec![
                            Some(any_value::Value::StringValue("doc-1".into())),
                            Some(any_value::Value::IntValue(2)),
                        ])),
                    ),
                ],
            ),
        };
        spans.push(child);
    }
    if rng.percent(30) {
        spans.reverse();
    }
    let mut request = request_of(spans, "fuzz-agent");
    if rng.percent(20) {
        // The same trace split over two resources (or two scopes of one).
        let moved = request.resource_spans[0].scope_spans[0].spans.split_off(1);
        if rng.percent(50) {
            request.resource_spans[0].scope_spans.push(ScopeSpans {
                spans: moved,
                ..ScopeSpans::default()
            });
        } else {
            request.resource_spans.push(ResourceSpans {
                scope_spans: vec![ScopeSpans {
                    spans: moved,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            });
        }
    }
    request
}

// ---------------------------------------------------------------------------------------------
// Protobuf as a tree of fields, for the byte-level mutations that keep the framing around them

#[derive(Clone)]
enum Payload {
    Varint(Vec<u8>),
    Fixed(Vec<u8>),
    Bytes(Vec<u8>),
    Message(Vec<Field>),
}

#[derive(Clone)]
struct Field {
    key: u64,
    payload: Payload,
    /// A length prefix written instead of the true one.
    length_lie: Option<u64>,
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The fields of a message; a length-delimited field that parses as a message is kept as one
/// (strings that happen to parse too are harmless: they serialize back to the same bytes).
fn parse_fields(bytes: &[u8], depth: usize) -> Option<Vec<Field>> {
    let mut at = 0;
    let mut fields = Vec::new();
    while at < bytes.len() {
        let key = read_varint(bytes, &mut at)?;
        if key >> 3 == 0 {
            return None;
        }
        let payload = match key & 7 {
            0 => {
                let start = at;
                read_varint(bytes, &mut at)?;
                Payload::Varint(bytes[start..at].to_vec())
            }
            wire @ (1 | 5) => {
                let end = at + if wire == 1 { 8 } else { 4 };
                let raw = bytes.get(at..end)?.to_vec();
                at = end;
                Payload::Fixed(raw)
            }
            2 => {
                let len = usize::try_from(read_varint(bytes, &mut at)?).ok()?;
                let end = at.checked_add(len)?;
                let inner = bytes.get(at..end)?;
                at = end;
                match (depth < 40 && !inner.is_empty())
                    .then(|| parse_fields(inner, depth + 1))
                    .flatten()
                {
                    Some(children) => Payload::Message(children),
                    None => Payload::Bytes(inner.to_vec()),
                }
            }
            _ => return None,
        };
        fields.push(Field {
            key,
            payload,
            length_lie: None,
        });
    }
    Some(fields)
}

fn write_fields(fields: &[Field], out: &mut Vec<u8>) {
    for field in fields {
        put_varint(out, field.key);
        match &field.payload {
            Payload::Varint(raw) | Payload::Fixed(raw) => out.extend_from_slice(raw),
            Payload::Bytes(raw) => {
                put_varint(out, field.length_lie.unwrap_or(raw.len() as u64));
                out.extend_from_slice(raw);
            }
            Payload::Message(children) => {
                let mut inner = Vec::new();
                write_fields(children, &mut inner);
                put_varint(out, field.length_lie.unwrap_or(inner.len() as u64));
                out.extend_from_slice(&inner);
            }
        }
    }
}

fn field_paths(fields: &[Field], prefix: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    for (index, field) in fields.iter().enumerate() {
        prefix.push(index);
        out.push(prefix.clone());
        if let Payload::Message(children) = &field.payload {
            field_paths(children, prefix, out);
        }
        prefix.pop();
    }
}

/// The list holding the field at `path` (its last index is the field's position in it).
fn siblings<'a>(fields: &'a mut Vec<Field>, path: &[usize]) -> Option<&'a mut Vec<Field>> {
    let mut current = fields;
    for &index in &path[..path.len() - 1] {
        current = match &mut current.get_mut(index)?.payload {
            Payload::Message(children) => children,
            _ => return None,
        };
    }
    Some(current)
}

/// A placeholder written into a string field, then overwritten in the encoded bytes by invalid
/// UTF-8 of the same length (so every length prefix stays right).
const UTF8_MARK: &str = "\u{1}utf8-mark\u{1}";

fn replace_marker(bytes: &mut [u8], mark: &[u8], with: &[u8]) -> bool {
    let Some(at) = bytes.windows(mark.len()).position(|window| window == mark) else {
        return false;
    };
    bytes[at..at + mark.len()].copy_from_slice(&with[..mark.len()]);
    true
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("compress");
    encoder.finish().expect("compress")
}

// ---------------------------------------------------------------------------------------------
// gRPC with raw message bytes

/// A tonic codec that sends the message bytes as given and hands back the answer's bytes, so
/// the fuzzing can put any bytes in a gRPC frame.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut bytes = vec![0; src.remaining()];
        src.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}

/// What tonic itself answers (before the service runs) to a message it cannot read: a
/// protobuf parse or decompression failure is `INTERNAL` by gRPC's own status-code table.
const TONIC_DECODE_FAILURES: &[&str] = &[
    "failed to decode Protobuf message",
    "Error decompressing",
    "protocol error",
    "Unexpected EOF",
];

pub(crate) async fn grpc_export(
    channel: &Channel,
    body: Vec<u8>,
    gzip: bool,
) -> Result<Result<Vec<u8>, tonic::Status>, tokio::time::error::Elapsed> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if gzip {
        grpc = grpc.send_compressed(CompressionEncoding::Gzip);
    }
    tokio::time::timeout(
        REQUEST_TIMEOUT,
        grpc_unary(grpc, EXPORT_PATH, tonic::Request::new(body)),
    )
    .await
}

/// One unary call of `path` with an already encoded message; the answer's bytes.
pub(crate) async fn grpc_unary(
    mut grpc: tonic::client::Grpc<Channel>,
    path: &'static str,
    request: tonic::Request<Vec<u8>>,
) -> Result<Vec<u8>, tonic::Status> {
    grpc.ready()
        .await
        .map_err(|error| tonic::Status::unknown(format!("channel not ready: {error}")))?;
    grpc.unary(request, PathAndQuery::from_static(path), RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Answers

/// What an answer must be beyond the general rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Anything 2xx or 4xx.
    Any,
    /// A valid export: a full success.
    Accepted,
    /// At least one span cannot be valid: a 4xx, or a 200 whose `partialSuccess` rejects spans.
    Rejected,
    /// The request cannot be valid: a 4xx (gRPC: not `OK`).
    Refused,
    /// Exactly this HTTP status.
    Status(u16),
}

/// The OTLP encoding a `Content-Type` names, as the server reads it (essence, any case).
fn is_protobuf_type(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|essence| {
            essence == "application/x-protobuf" || essence == "application/protobuf"
        })
}

/// The rules for an export's `partialSuccess` (`None`: unset, full success).
fn partial_problem(partial: Option<(i64, &str)>, expect: Expect) -> Option<String> {
    match partial {
        None if expect == Expect::Rejected => {
            Some("a span that cannot be valid was imported: no partialSuccess".into())
        }
        None => None,
        Some((rejected, message))
            if rejected < 1 || message.trim().is_empty() || !message.contains("span") =>
        {
            Some(format!(
                "partialSuccess must count rejected spans and name them with why: rejectedSpans \
                 {rejected}, errorMessage {message:?}"
            ))
        }
        Some((_, message)) if expect == Expect::Accepted => {
            Some(format!("a valid export had spans rejected: {message}"))
        }
        Some(_) => None,
    }
}

fn excerpt(bytes: &[u8], max: usize) -> String {
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned();
    if bytes.len() > max {
        format!("{shown:?}… ({} bytes)", bytes.len())
    } else {
        format!("{shown:?}")
    }
}

/// Why an HTTP answer breaks the rules, if it does.
fn http_problem(
    probe: &Probe,
    protobuf_request: bool,
    status: u16,
    content_type: &str,
    bytes: &[u8],
) -> Option<String> {
    if !(200..300).contains(&status) && !(400..500).contains(&status) {
        return Some(format!("status {status} is neither 2xx nor 4xx"));
    }
    match probe.expect {
        Expect::Accepted if status != 200 => return Some("a valid export was not accepted".into()),
        Expect::Refused if status < 300 => {
            return Some("a request that cannot be valid was accepted".into())
        }
        Expect::Status(expected) if status != expected => {
            return Some(format!("expected status {expected}"))
        }
        _ => {}
    }
    // 404 and 405 come from the router, before the OTLP handler: the contract's JSON.
    let handled = status != 404 && status != 405;
    if protobuf_request && handled {
        if !content_type.starts_with("application/x-protobuf") {
            return Some(format!(
                "a protobuf request was answered in {content_type:?}, not application/x-protobuf"
            ));
        }
        if status == 200 {
            let Ok(response) = ExportTraceServiceResponse::decode(bytes) else {
                return Some("the 200 body is not an ExportTraceServiceResponse".into());
            };
            let partial = response
                .partial_success
                .as_ref()
                .map(|p| (p.rejected_spans, p.error_message.as_str()));
            return partial_problem(partial, probe.expect);
        }
        let Ok(rpc) = RpcStatus::decode(bytes) else {
            return Some("the error body is not a google.rpc.Status".into());
        };
        let code = if status == 413 { 8 } else { 3 };
        if rpc.code != code || rpc.message.is_empty() {
            return Some(format!(
                "google.rpc.Status code {} (want {code}) message {:?}",
                rpc.code, rpc.message
            ));
        }
        return None;
    }
    if !content_type.starts_with("application/json") {
        return Some(format!(
            "a non-protobuf request was answered in {content_type:?}, not application/json"
        ));
    }
    let Ok(body) = serde_json::from_slice::<Value>(bytes) else {
        return Some("the answer is not JSON".into());
    };
    if status != 200 {
        return contract_error_problem(status, &body);
    }
    let Some(object) = body.as_object() else {
        return Some("the 200 body is not a JSON object".into());
    };
    if object.keys().any(|key| key != "partialSuccess") {
        return Some("the 200 body has members other than partialSuccess".into());
    }
    let partial = object.get("partialSuccess").map(|partial| {
        (
            partial["rejectedSpans"].as_i64().unwrap_or(-1),
            partial["errorMessage"].as_str().unwrap_or_default(),
        )
    });
    partial_problem(partial, probe.expect)
}

// ---------------------------------------------------------------------------------------------
// Probes

/// How a request travels.
enum Wire {
    Http {
        method: Method,
        path: String,
        content_type: Option<HeaderValue>,
        content_encoding: Option<HeaderValue>,
        headers: Vec<(&'static str, HeaderValue)>,
    },
    Grpc {
        gzip: bool,
    },
}

/// One request to send.
struct Probe {
    /// The mutation family, for the counts.
    family: &'static str,
    /// The body's encoding (and transport), for the counts.
    encoding: String,
    wire: Wire,
    body: Vec<u8>,
    /// How the request was derived, for the failure report.
    what: String,
    expect: Expect,
}

/// The three ways a decoded request can be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
    Grpc,
}

/// One entry of the schedule: which family the next request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// Byte-level mutations of protobuf, over HTTP.
    ProtoBytes,
    /// Byte-level mutations of protobuf, over gRPC.
    GrpcBytes,
    /// Semantic mutations of a decoded request, sent in the given encoding.
    Semantic(Encoding),
    /// OTLP/JSON text mutations.
    JsonText,
    /// Header mutations.
    Headers,
    /// Redeliveries of the stored trace's spans, in any encoding.
    Collision,
    /// A valid export, in any encoding: must be a full success.
    Control,
}

/// The schedule of one round.
const PLAN: [Family; 20] = [
    Family::ProtoBytes,
    Family::Semantic(Encoding::Protobuf),
    Family::Semantic(Encoding::Json),
    Family::JsonText,
    Family::ProtoBytes,
    Family::Semantic(Encoding::Grpc),
    Family::Headers,
    Family::Semantic(Encoding::Protobuf),
    Family::JsonText,
    Family::GrpcBytes,
    Family::Collision,
    Family::ProtoBytes,
    Family::Semantic(Encoding::Json),
    Family::Semantic(Encoding::Protobuf),
    Family::Control,
    Family::JsonText,
    Family::Semantic(Encoding::Grpc),
    Family::ProtoBytes,
    Family::Headers,
    Family::Collision,
];

const ID_LENGTHS: [usize; 7] = [0, 1, 7, 9, 15, 17, 32];
const PARENT_LENGTHS: [usize; 6] = [1, 7, 9, 15, 17, 32];
const USAGE_KEYS: &[&str] = &[
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "llm.token_count.prompt",
    "llm.token_count.completion",
    "llm.usage.prompt_tokens",
];
const COST_KEYS: &[&str] = &["gen_ai.usage.cost", "llm.cost.total", "operation.cost"];
const WRONG_CONTENT_TYPES: &[&str] = &[
    "text/plain",
    "application/xml",
    "application/grpc",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/jsonx",
    "application/x-protobuf-x",
    "application/octet-stream",
    "json",
    "*/*",
    "",
];
const GOOD_PROTOBUF_TYPES: &[&str] = &[
    "application/x-protobuf",
    "application/protobuf",
    "Application/X-Protobuf",
    "application/x-protobuf; proto=opentelemetry.proto.collector.trace.v1",
];
const GOOD_JSON_TYPES: &[&str] = &[
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
];
const WRONG_ENCODINGS: &[&str] = &[
    "br",
    "zstd",
    "compress",
    "gzip, identity",
    "gzip;q=1",
    "snappy",
];

/// A token count in every shape an exporter might send, valid or not.
fn token_values() -> Vec<Option<any_value::Value>> {
    use any_value::Value as V;
    vec![
        Some(V::IntValue(-1)),
        Some(V::IntValue(i64::MIN)),
        Some(V::IntValue(i64::MAX)),
        Some(V::IntValue(0)),
        Some(V::DoubleValue(-1.5)),
        Some(V::DoubleValue(12.5)),
        Some(V::DoubleValue(1e300)),
        Some(V::DoubleValue(f64::NAN)),
        Some(V::DoubleValue(f64::INFINITY)),
        Some(V::DoubleValue(9.007_199_254_740_992e15)),
        Some(V::StringValue("12".into())),
        Some(V::StringValue(" 12 ".into())),
        Some(V::StringValue("-5".into())),
        Some(V::StringValue("9223372036854775807".into())),
        Some(V::StringValue("99999999999999999999999".into())),
        Some(V::StringValue("1e400".into())),
        Some(V::StringValue("NaN".into())),
        Some(V::StringValue("abc".into())),
        Some(V::StringValue(String::new())),
        Some(V::BoolValue(true)),
        Some(V::BytesValue(vec![0xff, 0x00])),
        Some(array(vec![Some(V::IntValue(1))])),
        Some(kvlist(vec![int("n", 1)])),
        None,
    ]
}

/// An attribute value of every `AnyValue` type, empty ones included.
fn every_value(rng: &mut Rng) -> Vec<KeyValue> {
    use any_value::Value as V;
    vec![
        KeyValue {
            key: "any.absent".into(),
            value: None,
            ..KeyValue::default()
        },
        kv("any.empty", None),
        text("any.string.empty", ""),
        text(
            "any.string.odd",
            "ü ✓ \u{0} \u{202e} \u{feff} \\ \" </script>",
        ),
        kv("any.bool", Some(V::BoolValue(false))),
        int("any.int.min", i64::MIN),
        int("any.int.max", i64::MAX),
        double("any.double.nan", f64::NAN),
        double("any.double.inf", f64::INFINITY),
        double("any.double.neg_inf", f64::NEG_INFINITY),
        double("any.double.neg_zero", -0.0),
        double("any.double.tiny", 5e-324),
        double("any.double.max", f64::MAX),
        kv("any.array.empty", Some(array(Vec::new()))),
        kv(
            "any.array.mixed",
            Some(array(vec![
                None,
                Some(V::StringValue(String::new())),
                Some(array(Vec::new())),
                Some(kvlist(Vec::new())),
                Some(V::BytesValue(Vec::new())),
            ])),
        ),
        kv("any.kvlist.empty", Some(kvlist(Vec::new()))),
        kv(
            "any.kvlist.odd",
            Some(kvlist(vec![
                kv("", None),
                text("dup", "first"),
                text("dup", "second"),
                KeyValue::default(),
            ])),
        ),
        kv("any.bytes.empty", Some(V::BytesValue(Vec::new()))),
        kv(
            "any.bytes.not_utf8",
            Some(V::BytesValue(vec![
                0xff, 0xfe, 0xc0, 0x80, 0xed, 0xa0, 0x80,
            ])),
        ),
        kv("any.bytes.random", Some(V::BytesValue(rng.bytes(64)))),
        kv(
            "any.strindex",
            Some(V::StringValueStrindex(rng.next() as i32)),
        ),
        text("", "empty key"),
        text("resource", "collides with an added key"),
        text("otel.span_kind", "collides too"),
        text("dup.key", "first"),
        text("dup.key", "second"),
    ]
}

/// A value nested `depth` levels deep: kvlists, arrays, or both in turn.
fn nested(depth: usize, shape: usize) -> any_value::Value {
    let mut value = any_value::Value::StringValue("leaf".into());
    for level in 0..depth {
        let as_list = match shape {
            0 => true,
            1 => false,
            _ => level % 2 == 0,
        };
        value = if as_list {
            kvlist(vec![kv("k", Some(value))])
        } else {
            array(vec![Some(value)])
        };
    }
    value
}

fn attribute_values<'s>(span: &'s Span, key: &str) -> Vec<Option<&'s any_value::Value>> {
    span.attributes
        .iter()
        .filter(|attribute| attribute.key == key)
        .map(|attribute| {
            attribute
                .value
                .as_ref()
                .and_then(|value| value.value.as_ref())
        })
        .collect()
}

/// Whether the mapping must reject `span` (`docs/otlp.md`, "Identity and tree" and "In-progress
/// spans"): a trace id not 16 bytes or all zero, a span id not 8 bytes or all zero, a parent of
/// another length than 8 (empty and all zero are roots), no start time, or a Logfire pending
/// span (said unambiguously) with no parent or a `logfire.pending_parent_id` that is not 16 hex
/// digits.
fn certainly_rejected(span: &Span) -> bool {
    let zero = |bytes: &[u8]| bytes.iter().all(|byte| *byte == 0);
    let has_parent = !zero(&span.parent_span_id);
    if span.trace_id.len() != 16
        || zero(&span.trace_id)
        || span.span_id.len() != 8
        || zero(&span.span_id)
        || (has_parent && span.parent_span_id.len() != 8)
        || span.start_time_unix_nano == 0
    {
        return true;
    }
    let span_type = attribute_values(span, "logfire.span_type");
    let pending_parent = attribute_values(span, "logfire.pending_parent_id");
    let pending = matches!(
        span_type.as_slice(),
        [Some(any_value::Value::StringValue(text))] if text == "pending_span"
    );
    if !pending || pending_parent.len() > 1 {
        return false;
    }
    let bad_pending_parent = match pending_parent.first() {
        None | Some(None) => false,
        Some(Some(any_value::Value::StringValue(text))) => {
            let text = text.trim();
            !text.is_empty()
                && (text.len() != 16 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()))
        }
        Some(Some(_)) => true,
    };
    !has_parent || bad_pending_parent
}

/// The fuzzer: the server, the generator, and what was seen.
struct Fuzz<'a> {
    server: &'a TestServer,
    grpc: Channel,
    rng: Rng,
    next_trace: u64,
    /// Spans of earlier valid requests, for redeliveries across requests.
    history: Vec<Span>,
    by_encoding: BTreeMap<String, BTreeMap<String, usize>>,
    by_family: BTreeMap<&'static str, BTreeMap<String, usize>>,
    statuses: BTreeMap<String, usize>,
    failures: Vec<String>,
    sent: usize,
    /// A gzip body inflating to one byte over the inflate limit.
    bomb: Vec<u8>,
}

impl<'a> Fuzz<'a> {
    fn new(server: &'a TestServer, grpc: Channel) -> Self {
        Self {
            server,
            grpc,
            rng: Rng(fuzz_seed(SEED)),
            next_trace: 0,
            history: Vec::new(),
            by_encoding: BTreeMap::new(),
            by_family: BTreeMap::new(),
            statuses: BTreeMap::new(),
            failures: Vec::new(),
            sent: 0,
            bomb: gzip(&vec![0u8; MAX_DECOMPRESSED + 1]),
        }
    }

    fn fresh_request(&mut self) -> ExportTraceServiceRequest {
        self.next_trace += 1;
        let request = valid_request(self.next_trace, &mut self.rng);
        // Its first spans (often the root) are kept for redeliveries in later requests.
        let firsts = request
            .resource_spans
            .iter()
            .flat_map(|resource| &resource.scope_spans)
            .flat_map(|scope| &scope.spans)
            .take(2);
        for span in firsts {
            if self.history.len() >= 64 {
                let at = self.rng.below(self.history.len());
                self.history[at] = span.clone();
            } else {
                self.history.push(span.clone());
            }
        }
        request
    }

    /// An HTTP probe of `body` as `content_type`, gzip-compressed now and then.
    fn http_probe(
        &mut self,
        family: &'static str,
        kind: &str,
        content_type: &str,
        body: Vec<u8>,
        what: String,
        expect: Expect,
    ) -> Probe {
        let (body, content_encoding, encoding) = if self.rng.percent(30) {
            let name = *self.rng.pick(&["gzip", "gzip", "x-gzip", "GZIP"]);
            (
                gzip(&body),
                Some(HeaderValue::from_static(name)),
                format!("{kind}+gzip"),
            )
        } else {
            (body, None, kind.to_owned())
        };
        Probe {
            family,
            encoding,
            wire: Wire::Http {
                method: Method::POST,
                path: "/v1/traces".into(),
                content_type: Some(HeaderValue::from_str(content_type).expect("a header value")),
                content_encoding,
                headers: Vec::new(),
            },
            body,
            what,
            expect,
        }
    }

    fn grpc_probe(
        &mut self,
        family: &'static str,
        body: Vec<u8>,
        what: String,
        expect: Expect,
    ) -> Probe {
        let gzip = self.rng.percent(30);
        Probe {
            family,
            encoding: if gzip { "grpc+gzip" } else { "grpc" }.into(),
            wire: Wire::Grpc { gzip },
            body,
            what,
            expect,
        }
    }

    /// `request` sent in `encoding`.
    fn encoded_probe(
        &mut self,
        family: &'static str,
        request: &ExportTraceServiceRequest,
        encoding: Encoding,
        what: String,
        expect: Expect,
    ) -> Probe {
        match encoding {
            Encoding::Protobuf => {
                let content_type = *self.rng.pick(GOOD_PROTOBUF_TYPES);
                let body = request.encode_to_vec();
                self.http_probe(family, "protobuf", content_type, body, what, expect)
            }
            Encoding::Json => {
                let content_type = *self.rng.pick(GOOD_JSON_TYPES);
                let body = serde_json::to_vec(request).expect("OTLP/JSON");
                self.http_probe(family, "json", content_type, body, what, expect)
            }
            Encoding::Grpc => self.grpc_probe(family, request.encode_to_vec(), what, expect),
        }
    }

    fn any_encoding(&mut self) -> Encoding {
        *self
            .rng
            .pick(&[Encoding::Protobuf, Encoding::Json, Encoding::Grpc])
    }

    fn probe(&mut self, family: Family) -> Probe {
        match family {
            Family::ProtoBytes => {
                let (body, what, expect) = self.byte_mutation();
                let content_type = *self.rng.pick(GOOD_PROTOBUF_TYPES);
                self.http_probe(
                    "protobuf bytes",
                    "protobuf",
                    content_type,
                    body,
                    what,
                    expect,
                )
            }
            Family::GrpcBytes => {
                let (body, what, expect) = self.byte_mutation();
                self.grpc_probe("protobuf bytes", body, what, expect)
            }
            Family::Semantic(encoding) => {
                // Within the limits (the limits themselves are probed by the header family and
                // the regression tests at the end of the file): too large a result is drawn
                // again.
                let limit = match encoding {
                    Encoding::Protobuf => MAX_DECOMPRESSED,
                    Encoding::Json => BODY_LIMIT - 64 * 1024,
                    Encoding::Grpc => usize::MAX,
                };
                let (mut request, whats) = loop {
                    let mut request = self.fresh_request();
                    let mut whats = Vec::new();
                    for _ in 0..self.rng.range(1, 3) {
                        whats.push(self.semantic_mutation(&mut request));
                    }
                    let size = match encoding {
                        Encoding::Json => serde_json::to_vec(&request).map_or(0, |body| body.len()),
                        Encoding::Protobuf | Encoding::Grpc => request.encoded_len(),
                    };
                    if size <= limit {
                        break (request, whats);
                    }
                };
                let expect = if spans_mut(&mut request).any(|span| certainly_rejected(span)) {
                    Expect::Rejected
                } else {
                    Expect::Any
                };
                self.encoded_probe("semantic", &request, encoding, whats.join("; "), expect)
            }
            Family::JsonText => self.json_text_probe(),
            Family::Headers => self.headers_probe(),
            Family::Collision => {
                let (request, what, expect) = self.collision();
                let encoding = self.any_encoding();
                self.encoded_probe("stored trace", &request, encoding, what, expect)
            }
            Family::Control => {
                let request = self.fresh_request();
                let encoding = self.any_encoding();
                self.encoded_probe(
                    "control",
                    &request,
                    encoding,
                    "valid".into(),
                    Expect::Accepted,
                )
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Byte-level protobuf mutations

    fn byte_mutation(&mut self) -> (Vec<u8>, String, Expect) {
        let request = self.fresh_request();
        let valid = request.encode_to_vec();
        let mut fields = parse_fields(&valid, 0).expect("a valid request parses");
        let mut paths = Vec::new();
        field_paths(&fields, &mut Vec::new(), &mut paths);
        let path = self.rng.pick(&paths).clone();
        let depth = path.len();
        let tree_edit = |fields: &mut Vec<Field>, rng: &mut Rng| -> String {
            let list = siblings(fields, &path).expect("a path of the tree");
            let at = path[path.len() - 1];
            match rng.below(7) {
                0 => {
                    let copy = list[at].clone();
                    let times = rng.range(1, 3);
                    for _ in 0..times {
                        list.insert(at + 1, copy.clone());
                    }
                    format!(
                        "field {} at depth {depth} repeated {times}x",
                        list[at].key >> 3
                    )
                }
                1 => {
                    let removed = list.remove(at);
                    format!("field {} at depth {depth} dropped", removed.key >> 3)
                }
                2 => {
                    list.reverse();
                    format!("fields at depth {depth} reversed")
                }
                3 => {
                    let field = &mut list[at];
                    let real = match &field.payload {
                        Payload::Bytes(raw) => raw.len() as u64,
                        Payload::Message(children) => {
                            let mut inner = Vec::new();
                            write_fields(children, &mut inner);
                            inner.len() as u64
                        }
                        Payload::Varint(_) | Payload::Fixed(_) => {
                            field.key = (field.key & !7) | 2;
                            field.payload = Payload::Bytes(Vec::new());
                            0
                        }
                    };
                    let lie = *rng.pick(&[
                        0,
                        real.saturating_sub(1),
                        real + 1,
                        real + 7,
                        real * 2 + 1,
                        u64::from(u32::MAX),
                        u64::MAX,
                    ]);
                    field.length_lie = Some(lie);
                    format!(
                        "length prefix of field {} at depth {depth}: {real} -> {lie}",
                        field.key >> 3
                    )
                }
                4 => {
                    let field = &mut list[at];
                    let wire = rng.below(8) as u64;
                    field.key = (field.key & !7) | wire;
                    format!(
                        "field {} at depth {depth}: wire type {wire}",
                        field.key >> 3
                    )
                }
                5 => {
                    let field = &mut list[at];
                    let number = *rng.pick(&[
                        1u64,
                        2,
                        3,
                        4,
                        5,
                        6,
                        7,
                        8,
                        9,
                        10,
                        11,
                        12,
                        13,
                        15,
                        16,
                        99,
                        19_000,
                        536_870_911,
                    ]);
                    let old = field.key >> 3;
                    field.key = (number << 3) | (field.key & 7);
                    format!("field {old} at depth {depth} renumbered {number}")
                }
                _ => {
                    let field = &mut list[at];
                    let what = match &mut field.payload {
                        Payload::Varint(raw) => {
                            *raw = rng
                                .pick(&[
                                    vec![0xff; 10],
                                    vec![
                                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                                    ],
                                    vec![
                                        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                        0x00,
                                    ],
                                    vec![0x80, 0x00],
                                ])
                                .clone();
                            "varint overflowed"
                        }
                        Payload::Fixed(raw) => {
                            raw.truncate(rng.below(raw.len()));
                            "fixed value cut"
                        }
                        payload => {
                            let len = rng.range(0, 40);
                            *payload = Payload::Bytes(rng.bytes(len));
                            "content replaced by random bytes"
                        }
                    };
                    format!("field {} at depth {depth}: {what}", field.key >> 3)
                }
            }
        };
        let mut body = valid.clone();
        let what = match self.rng.below(13) {
            0..=3 => {
                let what = tree_edit(&mut fields, &mut self.rng);
                body.clear();
                write_fields(&fields, &mut body);
                what
            }
            4 => {
                let flips = self.rng.range(1, 8);
                for _ in 0..flips {
                    let at = self.rng.below(body.len());
                    body[at] ^= 1 << self.rng.below(8);
                }
                format!("{flips} bit flips")
            }
            5 => {
                let at = self.rng.below(body.len());
                body.truncate(at);
                format!("truncated at {at} of {}", valid.len())
            }
            6 => {
                let at = self.rng.below(body.len() + 1);
                let len = self.rng.range(1, 16);
                let inserted = self.rng.bytes(len);
                let count = inserted.len();
                body.splice(at..at, inserted);
                format!("{count} random bytes inserted at {at}")
            }
            7 => {
                let at = self.rng.below(body.len());
                let end = (at + self.rng.range(1, 32)).min(body.len());
                body.drain(at..end);
                format!("bytes {at}..{end} deleted")
            }
            8 => {
                for _ in 0..self.rng.range(1, 4) {
                    let at = self.rng.below(body.len());
                    body[at] = *self.rng.pick(&[0x00, 0xff, 0x80, 0x7f, 0x0a, 0x12]);
                }
                "bytes overwritten".into()
            }
            9 => {
                // Two messages concatenated merge into one: valid protobuf.
                let second = self.fresh_request().encode_to_vec();
                body.extend(second);
                "two requests concatenated (a protobuf merge)".into()
            }
            10 => {
                let len = self.rng.range(1, 512);
                body = self.rng.bytes(len);
                "random bytes".into()
            }
            11 => {
                // Invalid UTF-8 in a string field: a decode error, never a lossy import.
                let mut request = self.fresh_request();
                let span = span_at(&mut request, 0).expect("a span");
                let target = self.rng.below(4);
                match target {
                    0 => span.name = UTF8_MARK.into(),
                    1 => span.attributes.push(text("utf8", UTF8_MARK)),
                    2 => span.attributes.push(text(UTF8_MARK, "key")),
                    _ => span.status = error_status(UTF8_MARK),
                }
                body = request.encode_to_vec();
                let bad: &[u8] = self.rng.pick::<&[u8]>(&[
                    &b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8\xf7\xf6\xf5\xf4"[..],
                    &b"ok\xc0\xafok\xed\xa0\x80okok"[..],
                    &b"\xe2\x82ok\xf0\x9f\x98okok\x80"[..],
                ]);
                assert!(replace_marker(&mut body, UTF8_MARK.as_bytes(), bad));
                return (
                    body,
                    format!("invalid UTF-8 in a string field ({target})"),
                    Expect::Refused,
                );
            }
            _ => {
                // An unknown field: ignored by protobuf rules, the export stays valid.
                put_varint(&mut body, (99 << 3) | 2);
                put_varint(&mut body, 3);
                body.extend_from_slice(b"abc");
                return (body, "unknown top-level field appended".into(), Expect::Any);
            }
        };
        (body, what, Expect::Any)
    }

    // -----------------------------------------------------------------------------------------
    // Semantic mutations of a decoded request

    /// Mutate one thing of `request`; returns what was done. (Whether a span became invalid is
    /// judged afterwards on the whole request, by [`certainly_rejected`]: a later mutation may
    /// undo an earlier one.)
    fn semantic_mutation(&mut self, request: &mut ExportTraceServiceRequest) -> String {
        let count = span_count(request);
        if count == 0 {
            return "(no span left to mutate)".into();
        }
        let index = self.rng.below(count);
        let rng = &mut self.rng;
        let choice = rng.below(29);
        let span = span_at(request, index).expect("a span");
        match choice {
            0 => {
                let len = *rng.pick(&ID_LENGTHS);
                span.trace_id = id_bytes(rng, len);
                format!("trace id of {len} bytes")
            }
            1 => {
                let len = *rng.pick(&ID_LENGTHS);
                span.span_id = id_bytes(rng, len);
                format!("span id of {len} bytes")
            }
            2 => {
                span.trace_id = vec![0; 16];
                "all-zero trace id".into()
            }
            3 => {
                span.span_id = vec![0; 8];
                "all-zero span id".into()
            }
            4 => {
                let len = *rng.pick(&PARENT_LENGTHS);
                span.parent_span_id = id_bytes(rng, len);
                format!("parent id of {len} bytes")
            }
            5 => {
                span.parent_span_id = vec![0; 8];
                "all-zero parent id (a root)".into()
            }
            6 => {
                span.parent_span_id = span.span_id.clone();
                "parent id equal to the span id".into()
            }
            7 => {
                // A cycle of parents through every span of the request.
                let ids: Vec<Vec<u8>> = spans_mut(request).map(|s| s.span_id.clone()).collect();
                for (position, span) in spans_mut(request).enumerate() {
                    span.parent_span_id = ids[(position + 1) % ids.len()].clone();
                }
                format!("a cycle of parents through {} spans", ids.len())
            }
            8 => {
                span.start_time_unix_nano = 0;
                "start time 0".into()
            }
            9 => {
                let what = match rng.below(8) {
                    0 => {
                        span.start_time_unix_nano = u64::MAX;
                        "start u64::MAX"
                    }
                    1 => {
                        span.end_time_unix_nano = u64::MAX;
                        "end u64::MAX"
                    }
                    2 => {
                        span.end_time_unix_nano =
                            span.start_time_unix_nano.saturating_sub(1_000_000);
                        "end before start"
                    }
                    3 => {
                        span.end_time_unix_nano = 1;
                        "end 1 ns"
                    }
                    4 => {
                        span.start_time_unix_nano = 1;
                        "start 1 ns (0 ms)"
                    }
                    5 => {
                        span.end_time_unix_nano = 0;
                        "no end (open)"
                    }
                    6 => {
                        span.start_time_unix_nano = u64::MAX;
                        span.end_time_unix_nano = u64::MAX;
                        "start and end u64::MAX"
                    }
                    _ => {
                        span.events.push(event(0, "at zero", Vec::new()));
                        span.events.push(span::Event {
                            time_unix_nano: u64::MAX,
                            name: "at max".into(),
                            ..span::Event::default()
                        });
                        "event times 0 and u64::MAX"
                    }
                };
                what.into()
            }
            10 => {
                let n = rng.range(500, 6_000);
                span.attributes
                    .extend((0..n).map(|i| int(&format!("attr.{i}"), i as i64)));
                format!("{n} attributes")
            }
            11 => {
                let n = rng.range(100, 1_000);
                let start = span.start_time_unix_nano;
                span.events.extend((0..n).map(|i| span::Event {
                    time_unix_nano: start.saturating_add(i as u64),
                    name: format!("event-{}", i % 7),
                    attributes: vec![int("i", i as i64)],
                    ..span::Event::default()
                }));
                format!("{n} events")
            }
            12 => {
                let n = rng.range(100, 3_000);
                let trace = span.trace_id.clone();
                span.links.extend((0..n).map(|i| span::Link {
                    trace_id: trace.clone(),
                    span_id: (i as u64 + 1).to_be_bytes().to_vec(),
                    attributes: vec![int("i", i as i64)],
                    ..span::Link::default()
                }));
                format!("{n} links")
            }
            13 => {
                let values = every_value(rng);
                span.attributes.extend(values.clone());
                span.events.push(event(0, "every value", values.clone()));
                span.links.push(span::Link {
                    trace_id: span.trace_id.clone(),
                    span_id: vec![1; 8],
                    attributes: values.clone(),
                    ..span::Link::default()
                });
                if let Some(resource) = request.resource_spans[0].resource.as_mut() {
                    resource.attributes.extend(values.clone());
                }
                if let Some(scope) = request.resource_spans[0]
                    .scope_spans
                    .first_mut()
                    .and_then(|scope| scope.scope.as_mut())
                {
                    scope.attributes.extend(values);
                }
                "attribute values of every AnyValue type".into()
            }
            14 => {
                let size = *rng.pick(&[20_000, 100_000, 700_000, 1_500_000]);
                let huge = "x".repeat(size);
                let what = match rng.below(8) {
                    0 => {
                        span.attributes.push(text("huge", &huge));
                        "attribute value"
                    }
                    1 => {
                        span.attributes.push(text(&huge, "v"));
                        "attribute key"
                    }
                    2 => {
                        span.name = huge;
                        "span name"
                    }
                    3 => {
                        span.status = error_status(&huge);
                        "status message"
                    }
                    4 => {
                        span.events.push(event(0, &huge, vec![text("k", "v")]));
                        "event name"
                    }
                    5 => {
                        span.trace_state = huge;
                        "trace state"
                    }
                    6 => {
                        span.attributes.push(text("session.id", &huge));
                        "session id"
                    }
                    _ => {
                        if let Some(scope) = request.resource_spans[0]
                            .scope_spans
                            .first_mut()
                            .and_then(|scope| scope.scope.as_mut())
                        {
                            scope.name = huge;
                        }
                        "scope name"
                    }
                };
                format!("huge {what} ({size} bytes)")
            }
            15 => {
                let bytes = vec![
                    0xff, 0xfe, 0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1, 0xf0, 0x28,
                ];
                let key = *rng.pick(&[
                    "payload",
                    "session.id",
                    "gen_ai.usage.input_tokens",
                    "logfire.pending_parent_id",
                    "gen_ai.request.model",
                ]);
                span.attributes
                    .push(kv(key, Some(any_value::Value::BytesValue(bytes.clone()))));
                span.events.push(event(
                    0,
                    "bytes",
                    vec![kv("raw", Some(any_value::Value::BytesValue(bytes)))],
                ));
                format!("invalid UTF-8 as bytesValue of {key}")
            }
            16 => {
                let depth = rng.range(1, 60);
                let shape = rng.below(3);
                let value = Some(nested(depth, shape));
                let shape = ["kvlists", "arrays", "kvlists and arrays"][shape];
                let what = match rng.below(4) {
                    0 => {
                        span.attributes.push(kv("deep", value));
                        "attribute"
                    }
                    1 => {
                        span.events.push(event(0, "deep", vec![kv("deep", value)]));
                        "event attribute"
                    }
                    2 => {
                        span.links.push(span::Link {
                            trace_id: span.trace_id.clone(),
                            span_id: vec![2; 8],
                            attributes: vec![kv("deep", value)],
                            ..span::Link::default()
                        });
                        "link attribute"
                    }
                    _ => {
                        if let Some(resource) = request.resource_spans[0].resource.as_mut() {
                            resource.attributes.push(kv("deep", value));
                        }
                        "resource attribute"
                    }
                };
                format!("{what} nested {depth} levels of {shape}")
            }
            17 => {
                let values = token_values();
                let mut whats = Vec::new();
                for _ in 0..rng.range(1, 4) {
                    let key = *rng.pick(USAGE_KEYS);
                    let value = rng.pick(&values).clone();
                    whats.push(format!("{key}={value:?}"));
                    span.attributes.push(kv(key, value));
                }
                span.attributes.push(text(
                    "gen_ai.request.model",
                    rng.pick::<&str>(&["gpt-4o", "o3", "unknown-model"]),
                ));
                format!("token counts {}", whats.join(", "))
            }
            18 => {
                let code = *rng.pick(&[3, 99, -1, i32::MAX, i32::MIN]);
                let message = rng.pick(&["", "   ", "boom", "\u{0}"]).to_string();
                span.status = if rng.percent(20) {
                    None
                } else {
                    Some(Status { code, message })
                };
                format!("status {:?}", span.status)
            }
            19 => {
                span.kind = *rng.pick(&[6, 99, -1, i32::MAX, i32::MIN]);
                format!("span kind {}", span.kind)
            }
            20 => self.pending_mutation(request, index),
            21 => {
                let mut copy = span.clone();
                let what = match rng.below(4) {
                    0 => "identical",
                    1 => {
                        copy.name = "changed".into();
                        copy.status = error_status("changed");
                        copy.end_time_unix_nano = copy.end_time_unix_nano.saturating_add(1_000_000);
                        "changed"
                    }
                    2 => {
                        copy.trace_id = fuzz_trace(u64::MAX - rng.below(1_000) as u64);
                        "under another trace"
                    }
                    _ => {
                        copy.end_time_unix_nano = 0;
                        copy.events = vec![event(0, "other", Vec::new())];
                        "open, other events"
                    }
                };
                first_scope(request).push(copy);
                format!("span id repeated in the request ({what})")
            }
            22 => {
                if self.history.is_empty() {
                    return "(no history yet)".into();
                }
                let mut old = self.rng.pick(&self.history).clone();
                let what = match self.rng.below(4) {
                    0 => "identical",
                    1 => {
                        old.attributes.push(int("gen_ai.usage.input_tokens", 999));
                        old.status = error_status("second delivery");
                        "changed"
                    }
                    2 => {
                        old.trace_id = span.trace_id.clone();
                        "under this request's trace"
                    }
                    _ => {
                        old.end_time_unix_nano = 0;
                        "open"
                    }
                };
                first_scope(request).push(old);
                format!("span of an earlier request ({what})")
            }
            23 => {
                let n = rng.range(300, 1_500);
                let mut template = span.clone();
                template.attributes.truncate(8);
                template.links.clear();
                template.name.truncate(64);
                let spans = first_scope(request);
                spans.extend((0..n).map(|i| {
                    let mut copy = template.clone();
                    copy.span_id =
                        (0xb000_0000_0000_0000u64 | (rng.next() & 0xffff_ffff_0000) | i as u64)
                            .to_be_bytes()
                            .to_vec();
                    copy.events.clear();
                    // Children of one (unknown) parent, not roots (a trace with several roots is
                    // covered by a regression test at the end of the file).
                    copy.parent_span_id = vec![0xcc; 8];
                    copy
                }));
                format!("{n} more spans")
            }
            24 => {
                let what = match rng.below(6) {
                    0 => {
                        request.resource_spans.push(ResourceSpans::default());
                        "an empty ResourceSpans"
                    }
                    1 => {
                        request.resource_spans[0]
                            .scope_spans
                            .push(ScopeSpans::default());
                        "an empty ScopeSpans"
                    }
                    2 => {
                        for resource in &mut request.resource_spans {
                            resource.resource = None;
                            for scope in &mut resource.scope_spans {
                                scope.scope = None;
                            }
                        }
                        "no resource, no scope"
                    }
                    3 => {
                        span.name.clear();
                        span.events.push(event(0, "", Vec::new()));
                        "empty span and event names"
                    }
                    4 => {
                        request.resource_spans[0].schema_url = "\u{0}not a url".into();
                        "odd schema url"
                    }
                    _ => {
                        for scope in request
                            .resource_spans
                            .iter_mut()
                            .flat_map(|r| &mut r.scope_spans)
                        {
                            scope.spans.clear();
                        }
                        return "every span removed".into();
                    }
                };
                what.into()
            }
            25 => {
                span.dropped_attributes_count = u32::MAX;
                span.dropped_events_count = u32::MAX;
                span.dropped_links_count = u32::MAX;
                span.flags = u32::MAX;
                span.trace_state = "k=v,\u{0}=\u{1}".into();
                "dropped counts, flags and trace state at their maximum".into()
            }
            26 => {
                use any_value::Value as V;
                let value = rng
                    .pick(&[
                        Some(V::IntValue(-7)),
                        Some(V::StringValue("   ".into())),
                        Some(V::BytesValue(vec![1, 2])),
                        Some(kvlist(vec![text("a", "b")])),
                        Some(V::DoubleValue(f64::NAN)),
                        None,
                    ])
                    .clone();
                let key = *rng.pick(&["session.id", "gen_ai.conversation.id"]);
                span.attributes.push(kv(key, value.clone()));
                format!("{key} = {value:?}")
            }
            27 => {
                let key = *rng.pick(COST_KEYS);
                let value = *rng.pick(&[-1.0, f64::MAX, 1.7e308, f64::NAN, f64::INFINITY, 1e-300]);
                span.attributes.push(double(key, value));
                span.attributes.push(text("gen_ai.operation.name", "chat"));
                format!("{key} = {value}")
            }
            _ => {
                let (key, value) = *rng.pick(&[
                    ("gen_ai.operation.name", "INVOKE_AGENT"),
                    ("gen_ai.operation.name", ""),
                    ("gen_ai.operation.name", "execute_tool\u{0}"),
                    ("openinference.span.kind", "agent"),
                    ("openinference.span.kind", ""),
                    ("traceloop.span.kind", "WORKFLOW"),
                    ("traceloop.span.kind", "task"),
                    ("llm.request.type", ""),
                ]);
                span.attributes.insert(0, text(key, value));
                format!("{key} = {value:?}")
            }
        }
    }

    /// Turn span `index` into a Logfire pending announcement, valid or not.
    fn pending_mutation(
        &mut self,
        request: &mut ExportTraceServiceRequest,
        index: usize,
    ) -> String {
        use any_value::Value as V;
        let ids: Vec<Vec<u8>> = spans_mut(request).map(|s| s.span_id.clone()).collect();
        let rng = &mut self.rng;
        let span_type = rng
            .pick(&[
                "pending_span",
                "pending_span",
                "pending_span",
                "PENDING_SPAN",
                "span",
            ])
            .to_string();
        let other = hex(rng.pick::<Vec<u8>>(&ids));
        let pending_parent: Option<Option<V>> = match rng.below(12) {
            0 => None,
            1 => Some(Some(V::StringValue(String::new()))),
            2 => Some(Some(V::StringValue("0000000000000000".into()))),
            3 => Some(Some(V::StringValue(other.to_uppercase()))),
            4 => Some(Some(V::StringValue(format!("  {other}  ")))),
            5 => Some(None),
            6 => Some(Some(V::StringValue("zz".into()))),
            7 => Some(Some(V::StringValue("0123456789abcde".into()))),
            8 => Some(Some(V::StringValue("0123456789abcdef0".into()))),
            9 => Some(Some(V::StringValue("g123456789abcdef".into()))),
            10 => Some(Some(V::IntValue(5))),
            _ => Some(Some(V::BytesValue(vec![1; 8]))),
        };
        let (parent, parent_what) = match rng.below(6) {
            0 => (Vec::new(), "no parent"),
            1 => {
                let len = *rng.pick(&PARENT_LENGTHS);
                (id_bytes(rng, len), "parent of a wrong length")
            }
            2 => (Vec::new(), "own parent kept"),
            3 => (
                rng.pick(&ids).clone(),
                "announcing another span of the request",
            ),
            4 => (id_bytes(rng, 8), "announcing an unknown span"),
            _ => (Vec::new(), "announcing itself"),
        };
        let span = span_at(request, index).expect("a span");
        match parent_what {
            "own parent kept" => {}
            "announcing itself" => span.parent_span_id = span.span_id.clone(),
            _ => span.parent_span_id = parent,
        }
        span.attributes.push(text("logfire.span_type", &span_type));
        if let Some(value) = pending_parent.clone() {
            span.attributes.push(kv("logfire.pending_parent_id", value));
        }
        span.name.push_str(" (pending)");
        span.end_time_unix_nano = span.start_time_unix_nano;
        format!("{span_type:?} span, {parent_what}, logfire.pending_parent_id {pending_parent:?}")
    }

    // -----------------------------------------------------------------------------------------
    // The stored trace's spans, redelivered

    /// A request of stored span ids only (never a new span id under the stored trace): each
    /// identical or altered, or under another trace. Nothing in it may change the stored trace.
    fn collision(&mut self) -> (ExportTraceServiceRequest, String, Expect) {
        let keep = keep_spans();
        let mut spans = Vec::new();
        let mut whats = Vec::new();
        let mut expect = Expect::Accepted;
        for _ in 0..self.rng.range(1, 4) {
            let rng = &mut self.rng;
            let mut span = rng.pick(&keep).clone();
            let n = span.span_id[7];
            let what = match rng.below(14) {
                0 => "identical".to_owned(),
                1 => {
                    span.name = "renamed".into();
                    "renamed".into()
                }
                2 => {
                    span.attributes = vec![
                        text("gen_ai.operation.name", "chat"),
                        text("gen_ai.request.model", "o3"),
                        int("gen_ai.usage.input_tokens", i64::MAX),
                        int("gen_ai.usage.output_tokens", 1),
                        double("gen_ai.usage.cost", 1e9),
                        text("session.id", "another-session"),
                    ];
                    "other kind, usage and session".into()
                }
                3 => {
                    span.status = if span.status == ok_status() {
                        error_status("late failure")
                    } else {
                        ok_status()
                    };
                    "status flipped".into()
                }
                4 => {
                    span.end_time_unix_nano = 0;
                    "announced open again".into()
                }
                5 => {
                    span.start_time_unix_nano -= 1_000_000_000;
                    span.end_time_unix_nano += 1_000_000_000;
                    "other times".into()
                }
                6 => {
                    // Not the span itself: a span that names itself as its parent is rejected
                    // (the semantic cases send that one).
                    let parent = *rng.pick(&[0u8, 1, 2, 3]);
                    let parent = if parent == n { 0 } else { parent };
                    span.parent_span_id = if parent == 0 {
                        Vec::new()
                    } else {
                        keep_span_id(parent)
                    };
                    format!("parent {parent}")
                }
                7 => {
                    span.events
                        .push(event(KEEP_START_MS + 7, "late event", vec![int("n", 1)]));
                    if let Some(first) = span.events.first_mut() {
                        first.attributes.push(text("changed", "yes"));
                    }
                    "events added and changed".into()
                }
                8 => {
                    span.links.push(span::Link {
                        trace_id: KEEP_TRACE.to_vec(),
                        span_id: keep_span_id(1),
                        ..span::Link::default()
                    });
                    "a link added".into()
                }
                9 => {
                    span.kind = 99;
                    span.attributes
                        .insert(0, text("openinference.span.kind", "TOOL"));
                    "other span kinds".into()
                }
                10 => {
                    // A Logfire announcement of the stored span: imported as the stored span,
                    // open (its own id is never a span).
                    // Not the span itself (a span that is its own parent is rejected).
                    let other = hex(&keep_span_id(if n == 1 { 2 } else { 1 }));
                    let pending_parent = rng
                        .pick(&["0000000000000000", other.as_str(), "zz"])
                        .to_owned();
                    if pending_parent == "zz" {
                        expect = Expect::Rejected;
                    }
                    let announcement = Span {
                        trace_id: KEEP_TRACE.to_vec(),
                        span_id: vec![0x4b, 0x45, 0x45, 0x50, 0xee, 0xee, 0xee, n],
                        parent_span_id: span.span_id.clone(),
                        name: format!("{} (pending)", span.name),
                        start_time_unix_nano: span.start_time_unix_nano,
                        end_time_unix_nano: span.start_time_unix_nano,
                        attributes: vec![
                            text("logfire.span_type", "pending_span"),
                            text("logfire.pending_parent_id", pending_parent),
                        ],
                        ..Span::default()
                    };
                    spans.push(announcement);
                    whats.push(format!(
                        "span {n} announced pending (parent {pending_parent})"
                    ));
                    continue;
                }
                11 => {
                    span.trace_id = fuzz_trace(u64::MAX - rng.below(1_000) as u64);
                    expect = Expect::Rejected;
                    "under another trace".into()
                }
                12 => {
                    span.attributes.push(text("huge", &"y".repeat(100_000)));
                    span.attributes.push(kv("deep", Some(nested(25, 2))));
                    "a huge and a deep attribute".into()
                }
                _ => {
                    span.events.clear();
                    span.status = None;
                    span.end_time_unix_nano = span.start_time_unix_nano;
                    "no events, no status, zero length".into()
                }
            };
            whats.push(format!("span {n} {what}"));
            spans.push(span);
        }
        if self.rng.percent(20) {
            let copy = spans[0].clone();
            spans.push(copy);
            whats.push("first one repeated".into());
        }
        let request = request_of(spans, "fuzz-redelivery");
        (
            request,
            format!("stored trace: {}", whats.join("; ")),
            expect,
        )
    }

    // -----------------------------------------------------------------------------------------
    // OTLP/JSON text mutations

    fn json_text_probe(&mut self) -> Probe {
        let request = self.fresh_request();
        let mut value = serde_json::to_value(&request).expect("OTLP/JSON");
        let span_path = "/resourceSpans/0/scopeSpans/0/spans/0";
        let id_fields = ["traceId", "spanId", "parentSpanId"];
        let rng = &mut self.rng;
        let mut raw: Option<Vec<u8>> = None;
        let (what, expect) = match rng.below(17) {
            0 => {
                let (field, wrong) = rng
                    .pick(&[
                        ("name", json!(5)),
                        ("name", json!(["a"])),
                        ("traceId", json!(12)),
                        ("spanId", json!({"a": 1})),
                        ("attributes", json!({"key": "a"})),
                        ("attributes", json!("a")),
                        ("events", json!(7)),
                        ("startTimeUnixNano", json!(true)),
                        ("startTimeUnixNano", json!([1])),
                        ("kind", json!("1")),
                        ("status", json!("ok")),
                        ("status", json!(2)),
                    ])
                    .clone();
                if let Some(span) = value.pointer_mut(span_path) {
                    span[field] = wrong.clone();
                }
                (format!("span {field} = {wrong}"), Expect::Refused)
            }
            1 => {
                let field = *rng.pick(&id_fields);
                let bad = rng
                    .pick(&[
                        "zzzzzzzzzzzzzzzz",
                        "0x00000000000001",
                        "000000000000000g",
                        "00000000 0000001",
                        "ÿÿÿÿÿÿÿÿ",
                    ])
                    .to_string();
                if let Some(span) = value.pointer_mut(span_path) {
                    span[field] = json!(bad);
                }
                (format!("{field} {bad:?} is not hex"), Expect::Refused)
            }
            2 => {
                let field = *rng.pick(&id_fields);
                let odd = "a".repeat(*rng.pick(&[1, 15, 17, 31, 33]));
                if let Some(span) = value.pointer_mut(span_path) {
                    span[field] = json!(odd);
                }
                (
                    format!("{field} of odd length {}", odd.len()),
                    Expect::Refused,
                )
            }
            3 => {
                let field = *rng.pick(&["traceId", "spanId"]);
                let base64 = if field == "traceId" {
                    "8CIAAAAAAAAAAAAAAAAAAQ=="
                } else {
                    "oAAAAAAAAQE="
                };
                if let Some(span) = value.pointer_mut(span_path) {
                    span[field] = json!(base64);
                }
                (format!("{field} in base64"), Expect::Refused)
            }
            4 => {
                let (field, bad) = rng
                    .pick(&[
                        ("startTimeUnixNano", json!("18446744073709551616")),
                        ("startTimeUnixNano", json!("-1")),
                        ("startTimeUnixNano", json!("1.5")),
                        ("startTimeUnixNano", json!("0x10")),
                        ("startTimeUnixNano", json!("1e9")),
                        ("startTimeUnixNano", json!("")),
                        ("endTimeUnixNano", json!(-1)),
                        ("endTimeUnixNano", json!(1.5)),
                        ("endTimeUnixNano", json!(18_446_744_073_709_551_616.0)),
                    ])
                    .clone();
                if let Some(span) = value.pointer_mut(span_path) {
                    span[field] = bad.clone();
                }
                (format!("{field} = {bad}"), Expect::Refused)
            }
            5 => {
                let bad = rng.pick(&[
                    "\"9223372036854775808\"",
                    "\"-9223372036854775809\"",
                    "\"12abc\"",
                    "1.5",
                    "true",
                    "9223372036854775808",
                ]);
                raw = Some(format!(
                    "{{\"resourceSpans\":[{{\"scopeSpans\":[{{\"spans\":[{{\"traceId\":\"{}\",\"spanId\":\"{}\",\"name\":\"n\",\"startTimeUnixNano\":\"1700000000000000000\",\"attributes\":[{{\"key\":\"i\",\"value\":{{\"intValue\":{bad}}}}}]}}]}}]}}]}}",
                    hex(&fuzz_trace(self.next_trace)),
                    hex(&fuzz_span_id(self.next_trace, 1)),
                ).into_bytes());
                (format!("intValue {bad}"), Expect::Refused)
            }
            6 => {
                let (field, bad, expect) = rng
                    .pick(&[
                        ("kind", json!(99), Expect::Any),
                        ("kind", json!(-1), Expect::Any),
                        ("kind", json!(2_147_483_648u64), Expect::Refused),
                        ("kind", json!("SPAN_KIND_SERVER"), Expect::Accepted),
                        ("kind", json!("SERVER"), Expect::Refused),
                        ("kind", json!("3"), Expect::Refused),
                        ("status", json!({"code": 99}), Expect::Any),
                        (
                            "status",
                            json!({"code": "STATUS_CODE_ERROR"}),
                            Expect::Accepted,
                        ),
                        ("status", json!({"code": "ERROR"}), Expect::Refused),
                        ("status", json!({"code": 1.5}), Expect::Refused),
                    ])
                    .clone();
                if let Some(span) = value.pointer_mut(span_path) {
                    span[field] = bad.clone();
                }
                (format!("enum {field} = {bad}"), expect)
            }
            7 => {
                let garbage = *rng.pick(&[
                    "x",
                    "}",
                    "{}",
                    "\u{0}",
                    ",",
                    "]",
                    "\"",
                    "/* */",
                    "{\"resourceSpans\":[]}",
                ]);
                let mut text = serde_json::to_vec(&value).expect("JSON");
                text.extend_from_slice(garbage.as_bytes());
                raw = Some(text);
                (format!("trailing {garbage:?}"), Expect::Refused)
            }
            8 => {
                let bad: &[u8] = rng.pick::<&[u8]>(&[
                    &b"\xff"[..],
                    &b"\xc3\x28"[..],
                    &b"\xc0\xaf"[..],
                    &b"\xed\xa0\x80"[..],
                    &b"\xf8\x88\x80\x80\x80"[..],
                ]);
                let mut text = serde_json::to_vec(&value).expect("JSON");
                let at = text
                    .windows(7)
                    .position(|w| w == b"\"name\":")
                    .expect("a name")
                    + 8;
                text.splice(at..at, bad.iter().copied());
                raw = Some(text);
                (format!("non-UTF-8 {bad:02x?} in a string"), Expect::Refused)
            }
            9 => {
                let mut text = serde_json::to_vec(&value).expect("JSON");
                let at = rng.below(text.len());
                text.truncate(at);
                raw = Some(text);
                (format!("truncated at {at}"), Expect::Refused)
            }
            10 => {
                let (from, to) = *rng.pick(&[
                    ("\"resourceSpans\"", "\"resource_spans\""),
                    ("\"traceId\"", "\"trace_id\""),
                    ("\"startTimeUnixNano\"", "\"start_time_unix_nano\""),
                    ("\"stringValue\"", "\"string_value\""),
                ]);
                let text = serde_json::to_string(&value)
                    .expect("JSON")
                    .replacen(from, to, 1);
                raw = Some(text.into_bytes());
                // Read as the Collector reads it: the key in its lowerCamelCase spelling.
                (format!("snake_case key {to}"), Expect::Accepted)
            }
            11 => {
                // Empty requests are valid (the OTLP specification: answer them with success);
                // anything that is not a JSON object is not a request.
                let (body, expect) = *rng.pick(&[
                    ("{}", Expect::Accepted),
                    ("{\"resourceSpans\":[{}]}", Expect::Accepted),
                    ("{\"resourceSpans\":[]}", Expect::Accepted),
                    ("{\"resourceLogs\":[]}", Expect::Refused),
                    ("[]", Expect::Refused),
                    ("null", Expect::Refused),
                    ("\"x\"", Expect::Refused),
                    ("1", Expect::Refused),
                    ("[[]]", Expect::Refused),
                    ("{\"resourceSpans\":null}", Expect::Any),
                    (" ", Expect::Refused),
                ]);
                raw = Some(body.as_bytes().to_vec());
                (format!("body {body:?}"), expect)
            }
            12 => {
                let text = serde_json::to_string(&value).expect("JSON").replacen(
                    "\"name\":",
                    "\"name\":\"first\",\"name\":",
                    1,
                );
                raw = Some(text.into_bytes());
                ("a repeated key".into(), Expect::Any)
            }
            13 => {
                let depth = *rng.pick(&[100, 127, 129, 500, 5_000]);
                let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
                let text = serde_json::to_string(&value).expect("JSON").replacen(
                    "\"attributes\":[",
                    &format!("\"attributes\":[{{\"key\":\"deep\",\"value\":{{\"arrayValue\":{{\"values\":{deep}}}}}}},"),
                    1,
                );
                raw = Some(text.into_bytes());
                (format!("arrays nested {depth} deep"), Expect::Refused)
            }
            14 => {
                // A lone UTF-16 surrogate (JavaScript's JSON for half an emoji) is read as
                // U+FFFD, as the protobuf form is; a broken escape is refused.
                let (escape, expect) = *rng.pick(&[
                    ("\\ud800", Expect::Accepted),
                    ("\\udfff", Expect::Accepted),
                    ("\\ud800\\u0041", Expect::Accepted),
                    ("\\u00", Expect::Refused),
                    ("\\x41", Expect::Refused),
                ]);
                let text = serde_json::to_string(&value).expect("JSON").replacen(
                    "\"name\":\"",
                    &format!("\"name\":\"{escape}"),
                    1,
                );
                raw = Some(text.into_bytes());
                (format!("escape {escape} in a string"), expect)
            }
            15 => {
                let (number, expect) = *rng.pick(&[
                    ("1e999", Expect::Any),
                    ("-0", Expect::Any),
                    ("1e-400", Expect::Any),
                    ("\"Infinity\"", Expect::Any),
                    ("\"NaN\"", Expect::Any),
                    ("\"1.5x\"", Expect::Refused),
                    ("[]", Expect::Refused),
                ]);
                let text = serde_json::to_string(&value).expect("JSON").replacen(
                    "\"attributes\":[",
                    &format!(
                        "\"attributes\":[{{\"key\":\"d\",\"value\":{{\"doubleValue\":{number}}}}},"
                    ),
                    1,
                );
                raw = Some(text.into_bytes());
                (format!("doubleValue {number}"), expect)
            }
            _ => {
                let extra = rng
                    .pick(&[
                        json!({"unknownField": 1}),
                        json!({"droppedAttributesCount": 4_294_967_296u64}),
                        json!({"flags": -1}),
                        json!({"traceState": null}),
                        json!({"events": null}),
                        json!({"links": [{"traceId": "", "spanId": ""}]}),
                    ])
                    .clone();
                if let (Some(span), Some(extra)) = (value.pointer_mut(span_path), extra.as_object())
                {
                    for (key, item) in extra {
                        span[key] = item.clone();
                    }
                }
                (format!("span members {extra}"), Expect::Any)
            }
        };
        let body = raw.unwrap_or_else(|| serde_json::to_vec(&value).expect("JSON"));
        let content_type = *self.rng.pick(GOOD_JSON_TYPES);
        self.http_probe("json text", "json", content_type, body, what, expect)
    }

    // -----------------------------------------------------------------------------------------
    // Header mutations

    fn headers_probe(&mut self) -> Probe {
        let request = self.fresh_request();
        let protobuf = request.encode_to_vec();
        let json_body = serde_json::to_vec(&request).expect("OTLP/JSON");
        let rng = &mut self.rng;
        let use_json = rng.percent(40);
        let (good_type, body) = if use_json {
            (*rng.pick(GOOD_JSON_TYPES), json_body.clone())
        } else {
            (*rng.pick(GOOD_PROTOBUF_TYPES), protobuf.clone())
        };
        let mut content_type = Some(HeaderValue::from_static(good_type));
        let mut content_encoding = None;
        let mut headers = Vec::new();
        let mut method = Method::POST;
        let mut path = "/v1/traces".to_owned();
        let mut body = body;
        let (what, expect) = match rng.below(13) {
            0 => {
                content_type = None;
                ("no content type".to_owned(), Expect::Status(415))
            }
            1 => {
                let wrong = *rng.pick(WRONG_CONTENT_TYPES);
                content_type = Some(HeaderValue::from_static(wrong));
                (format!("content type {wrong:?}"), Expect::Status(415))
            }
            2 => {
                content_type = Some(HeaderValue::from_static("application/json"));
                body = protobuf;
                ("protobuf body sent as JSON".into(), Expect::Refused)
            }
            3 => {
                content_type = Some(HeaderValue::from_static("application/x-protobuf"));
                body = json_body;
                ("JSON body sent as protobuf".into(), Expect::Any)
            }
            4 => {
                let wrong = *rng.pick(WRONG_ENCODINGS);
                content_encoding = Some(HeaderValue::from_static(wrong));
                (format!("content encoding {wrong:?}"), Expect::Status(415))
            }
            5 => {
                let declared = *rng.pick(&["gzip", "deflate"]);
                content_encoding = Some(HeaderValue::from_static(declared));
                (
                    format!("{declared} declared, body not compressed"),
                    Expect::Refused,
                )
            }
            6 => {
                content_encoding = Some(HeaderValue::from_static("gzip"));
                let mut garbage = vec![0x07, 0xff];
                let len = rng.range(0, 300);
                garbage.extend(rng.bytes(len));
                body = gzip(&garbage);
                ("gzip of garbage".into(), Expect::Refused)
            }
            7 => {
                content_encoding = Some(HeaderValue::from_static("gzip"));
                let compressed = gzip(&body);
                match rng.below(3) {
                    0 => {
                        body = gzip(&compressed);
                        ("gzip twice, declared once".into(), Expect::Refused)
                    }
                    1 => {
                        let cut = rng.range(1, compressed.len() - 1);
                        body = compressed[..cut].to_vec();
                        (
                            format!("gzip cut at {cut} of {}", compressed.len()),
                            Expect::Refused,
                        )
                    }
                    _ => {
                        body = compressed;
                        let at = body.len() - 8;
                        body[at] ^= 0xff;
                        ("gzip with a wrong CRC".into(), Expect::Refused)
                    }
                }
            }
            8 => {
                content_type = Some(HeaderValue::from_static(if self.rng.percent(50) {
                    "application/json"
                } else {
                    "application/x-protobuf"
                }));
                content_encoding = Some(HeaderValue::from_static("gzip"));
                body = self.bomb.clone();
                (
                    format!(
                        "gzip inflating to {} bytes (limit {MAX_DECOMPRESSED})",
                        MAX_DECOMPRESSED + 1
                    ),
                    Expect::Status(413),
                )
            }
            9 => {
                // Over the inflate limit but within the body limit: the OTLP handler's 413.
                content_type = Some(HeaderValue::from_static("application/json"));
                body = json_body;
                body.resize(MAX_DECOMPRESSED + 1, b' ');
                (
                    format!(
                        "a JSON body of {} bytes (inflate limit {MAX_DECOMPRESSED})",
                        MAX_DECOMPRESSED + 1
                    ),
                    Expect::Status(413),
                )
            }
            10 => {
                let (writer, expect): (HeaderValue, Expect) = match rng.below(4) {
                    0 => (HeaderValue::from_static(""), Expect::Status(400)),
                    1 => (
                        HeaderValue::from_str(&"w".repeat(300)).expect("header"),
                        Expect::Status(400),
                    ),
                    2 => (
                        HeaderValue::from_bytes(b"caf\xe9").expect("header"),
                        Expect::Status(400),
                    ),
                    _ => (HeaderValue::from_static("fuzz-writer"), Expect::Accepted),
                };
                let what = format!("Flightlog-Writer {writer:?}");
                headers.push(("flightlog-writer", writer));
                (what, expect)
            }
            11 => {
                let (m, p) = rng
                    .pick(&[
                        (Method::GET, "/v1/traces"),
                        (Method::PUT, "/v1/traces"),
                        (Method::DELETE, "/v1/traces"),
                        (Method::PATCH, "/v1/traces"),
                        (Method::POST, "/v1/traces/"),
                        (Method::POST, "/v1/trace"),
                        (Method::POST, "/v1/traces?x=1"),
                    ])
                    .clone();
                method = m.clone();
                path = p.to_owned();
                let expect = if p == "/v1/traces?x=1" {
                    Expect::Accepted
                } else {
                    Expect::Any
                };
                (format!("{m} {p}"), expect)
            }
            _ => {
                let encoding = *rng.pick(&[
                    "gzip", "x-gzip", "GZIP", " gzip ", "identity", "", "deflate", "Deflate",
                ]);
                content_encoding = Some(HeaderValue::from_static(encoding));
                if encoding.trim().eq_ignore_ascii_case("gzip") || encoding == "x-gzip" {
                    body = gzip(&body);
                } else if encoding.eq_ignore_ascii_case("deflate") {
                    let mut encoder =
                        flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                    std::io::Write::write_all(&mut encoder, &body).expect("compress");
                    body = encoder.finish().expect("compress");
                }
                (format!("content encoding {encoding:?}"), Expect::Accepted)
            }
        };
        // Counted by the content type as sent (no or another type: "other").
        let json_type = content_type
            .as_ref()
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.to_ascii_lowercase().starts_with("application/json"));
        let encoding = if is_protobuf_type(content_type.as_ref()) {
            "protobuf"
        } else if json_type {
            "json"
        } else {
            "other"
        };
        Probe {
            family: "headers",
            encoding: format!("{encoding} (headers)"),
            wire: Wire::Http {
                method,
                path,
                content_type,
                content_encoding,
                headers,
            },
            body,
            what,
            expect,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Sending and checking

    fn fail(&mut self, probe: &Probe, problem: &str, answer: &str) {
        let request = match &probe.wire {
            Wire::Http {
                method,
                path,
                content_type,
                content_encoding,
                headers,
            } => format!(
                "{method} {path} content-type={content_type:?} content-encoding={content_encoding:?} headers={headers:?}"
            ),
            Wire::Grpc { gzip } => format!("gRPC Export (gzip {gzip})"),
        };
        self.failures.push(format!(
            "{} / {} [{}]\n    request: {request} body={}\n    problem: {problem}\n    answer: {answer}",
            probe.family,
            probe.encoding,
            probe.what,
            excerpt(&probe.body, 160),
        ));
    }

    fn count(&mut self, probe: &Probe, status: String) {
        *self
            .by_encoding
            .entry(probe.encoding.clone())
            .or_default()
            .entry(status.clone())
            .or_default() += 1;
        *self
            .by_family
            .entry(probe.family)
            .or_default()
            .entry(status.clone())
            .or_default() += 1;
        *self.statuses.entry(status).or_default() += 1;
    }

    async fn fire(&mut self, probe: Probe) {
        self.sent += 1;
        match &probe.wire {
            Wire::Http { .. } => self.fire_http(probe).await,
            Wire::Grpc { .. } => self.fire_grpc(probe).await,
        }
    }

    async fn fire_http(&mut self, probe: Probe) {
        let Wire::Http {
            method,
            path,
            content_type,
            content_encoding,
            headers,
        } = &probe.wire
        else {
            return;
        };
        let mut request = self
            .server
            .client
            .request(method.clone(), format!("{}{path}", self.server.base))
            .body(probe.body.clone());
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type.clone());
        }
        if let Some(content_encoding) = content_encoding {
            request = request.header(CONTENT_ENCODING, content_encoding.clone());
        }
        for (name, value) in headers {
            request = request.header(*name, value.clone());
        }
        let protobuf_request = is_protobuf_type(content_type.as_ref());
        let response = match tokio::time::timeout(REQUEST_TIMEOUT, request.send()).await {
            Err(_) => {
                self.count(&probe, "hung".into());
                return self.fail(&probe, "no answer within 10 s (a hung request)", "none");
            }
            Ok(Err(error)) => {
                self.count(&probe, "dropped".into());
                let problem = format!("no HTTP answer (dropped connection?): {error:?}");
                return self.fail(&probe, &problem, "none");
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        let answer_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = match tokio::time::timeout(REQUEST_TIMEOUT, response.bytes()).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(error)) => {
                self.count(&probe, format!("{status} broken"));
                let problem = format!("the answer's body broke off: {error:?}");
                return self.fail(&probe, &problem, &status.to_string());
            }
            Err(_) => {
                self.count(&probe, format!("{status} hung"));
                return self.fail(&probe, "the answer's body hung", &status.to_string());
            }
        };
        // A 200 with `partialSuccess` is counted apart, to show that rejections were exercised.
        let partial = status == 200
            && if protobuf_request {
                ExportTraceServiceResponse::decode(bytes.as_ref())
                    .is_ok_and(|response| response.partial_success.is_some())
            } else {
                serde_json::from_slice::<Value>(&bytes)
                    .is_ok_and(|body| body.get("partialSuccess").is_some())
            };
        let label = if partial {
            "200 partial".to_owned()
        } else {
            status.to_string()
        };
        self.count(&probe, label);
        if let Some(problem) = http_problem(&probe, protobuf_request, status, &answer_type, &bytes)
        {
            let answer = format!("{status} {answer_type} {}", excerpt(&bytes, 300));
            self.fail(&probe, &problem, &answer);
        }
    }

    async fn fire_grpc(&mut self, probe: Probe) {
        let Wire::Grpc { gzip } = probe.wire else {
            return;
        };
        let outcome = grpc_export(&self.grpc, probe.body.clone(), gzip).await;
        let result = match outcome {
            Err(_) => {
                self.count(&probe, "grpc hung".into());
                return self.fail(&probe, "no gRPC answer within 10 s (a hung call)", "none");
            }
            Ok(result) => result,
        };
        match result {
            Ok(bytes) => {
                let partial = ExportTraceServiceResponse::decode(bytes.as_slice())
                    .is_ok_and(|response| response.partial_success.is_some());
                let label = if partial {
                    "grpc OK partial"
                } else {
                    "grpc OK"
                };
                self.count(&probe, label.into());
                let problem = match ExportTraceServiceResponse::decode(bytes.as_slice()) {
                    Err(_) => Some("the answer is not an ExportTraceServiceResponse".into()),
                    Ok(_) if probe.expect == Expect::Refused => {
                        Some("a request that cannot be valid was accepted".into())
                    }
                    Ok(response) => partial_problem(
                        response
                            .partial_success
                            .as_ref()
                            .map(|p| (p.rejected_spans, p.error_message.as_str())),
                        probe.expect,
                    ),
                };
                if let Some(problem) = problem {
                    self.fail(&probe, &problem, &format!("OK {}", excerpt(&bytes, 300)));
                }
            }
            Err(status) => {
                self.count(&probe, format!("grpc {:?}", status.code()));
                let library_refusal = match status.code() {
                    Code::InvalidArgument | Code::ResourceExhausted | Code::OutOfRange => true,
                    Code::Internal => TONIC_DECODE_FAILURES
                        .iter()
                        .any(|prefix| status.message().starts_with(prefix)),
                    _ => false,
                };
                let problem = if !library_refusal {
                    Some("a gRPC status other than a refusal of the message (a server or transport failure)")
                } else if probe.expect == Expect::Accepted {
                    Some("a valid export was not accepted")
                } else {
                    None
                };
                if let Some(problem) = problem {
                    let answer = format!("{:?}: {}", status.code(), status.message());
                    self.fail(&probe, problem, &answer);
                }
            }
        }
    }

    /// A read of what the fuzzing left behind: 200 (or 404 where allowed) and readable JSON.
    async fn read_back(&mut self, path: &str, allow_missing: bool) -> Option<Value> {
        self.sent += 1;
        let url = format!("{}{path}", self.server.base);
        let probe = Probe {
            family: "read back",
            encoding: "read back".into(),
            wire: Wire::Http {
                method: Method::GET,
                path: path.to_owned(),
                content_type: None,
                content_encoding: None,
                headers: Vec::new(),
            },
            body: Vec::new(),
            what: format!("GET {path}"),
            expect: Expect::Any,
        };
        let response =
            match tokio::time::timeout(REQUEST_TIMEOUT, self.server.client.get(url).send()).await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) => {
                    self.fail(&probe, &format!("no answer: {error:?}"), "none");
                    return None;
                }
                Err(_) => {
                    self.fail(&probe, "no answer within 10 s", "none");
                    return None;
                }
            };
        let status = response.status().as_u16();
        self.count(&probe, status.to_string());
        let bytes = response.bytes().await.unwrap_or_default();
        let parsed = serde_json::from_slice::<Value>(&bytes);
        match (status, parsed) {
            (200, Ok(value)) => Some(value),
            (404, Ok(_)) if allow_missing => None,
            (status, parsed) => {
                let problem = match parsed {
                    Err(error) => format!("an unreadable read: {error}"),
                    Ok(_) => format!("status {status}"),
                };
                self.fail(
                    &probe,
                    &problem,
                    &format!("{status} {}", excerpt(&bytes, 300)),
                );
                None
            }
        }
    }

    fn report(&self, elapsed: Duration) {
        println!(
            "otlp fuzz: {} requests in {:.1} s (seed {:#x})",
            self.sent,
            elapsed.as_secs_f64(),
            fuzz_seed(SEED)
        );
        let table = |title: &str, rows: Vec<(String, &BTreeMap<String, usize>)>| {
            println!("  by {title}:");
            for (name, statuses) in rows {
                let total: usize = statuses.values().sum();
                let histogram: Vec<String> =
                    statuses.iter().map(|(s, n)| format!("{s}:{n}")).collect();
                println!("    {name:<24} {total:>5}  {}", histogram.join("  "));
            }
        };
        table(
            "encoding",
            self.by_encoding
                .iter()
                .map(|(k, v)| (k.clone(), v))
                .collect(),
        );
        table(
            "mutation family",
            self.by_family
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v))
                .collect(),
        );
        let histogram: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}:{n}"))
            .collect();
        println!("  statuses: {}", histogram.join("  "));
    }
}

// ---------------------------------------------------------------------------------------------
// The stored trace, read back

/// Everything read back about the stored trace: (what, status, body), the global
/// `changeCursor` (it moves with any write) left out of the snapshot.
async fn kept_state(server: &TestServer) -> Vec<(String, u16, Value)> {
    let run = hex(&KEEP_TRACE);
    let mut paths = vec![
        format!("/v1/activity/runs/{run}/snapshot"),
        format!("/v1/activity/runs/{run}/rollup"),
        format!("/v1/activity/runs/{run}/seq"),
    ];
    paths.extend((1..=KEEP_SPANS).map(|n| format!("/v1/activity/spans/{}", hex(&keep_span_id(n)))));
    let mut state = Vec::new();
    for path in paths {
        let reply = server.get(&path).await;
        let mut body = reply.body;
        if let Some(snapshot) = body.as_object_mut() {
            snapshot.remove("changeCursor");
        }
        state.push((path, reply.status.as_u16(), body));
    }
    // The run's entry in the list of ended runs, paged through.
    let mut entry = Vec::new();
    let mut path = "/v1/activity/runs?state=ended&limit=10000".to_owned();
    loop {
        let page = server.get(&path).await;
        page.assert_status(200);
        let runs = page.body["runs"].as_array().cloned().unwrap_or_default();
        entry.extend(runs.into_iter().filter(|r| r["runId"] == run));
        match page.body["next"].as_str() {
            Some(next) => {
                path = format!(
                    "/v1/activity/runs?state=ended&limit=10000&before={}",
                    segment(next)
                );
            }
            None => break,
        }
    }
    state.push(("run list entry".into(), 200, Value::Array(entry)));
    state
}

/// The whole change log, page by page: every page must be a readable JSON array, change ids
/// consecutive from 1, each run's `seq` consecutive from 1, the last id the cursor. Returns the
/// stored trace's changes.
async fn check_change_log(fuzz: &mut Fuzz<'_>) -> Vec<Value> {
    let run = hex(&KEEP_TRACE);
    let mut kept = Vec::new();
    let mut after = 0i64;
    let mut seqs: HashMap<String, i64> = HashMap::new();
    let mut problems = Vec::new();
    loop {
        let Some(page) = fuzz
            .read_back(
                &format!("/v1/activity/changes?after={after}&limit=1000"),
                false,
            )
            .await
        else {
            problems.push(format!("the change log page after {after} is unreadable"));
            break;
        };
        let Some(page) = page.as_array() else {
            problems.push(format!("the change log page after {after} is not an array"));
            break;
        };
        if page.is_empty() {
            break;
        }
        for change in page {
            let id = change["changeId"].as_i64().unwrap_or(-1);
            if id != after + 1 {
                problems.push(format!("change id {id} follows {after}: a gap"));
            }
            after = id;
            let run_id = change["runId"].as_str().unwrap_or_default().to_owned();
            let seq = change["seq"].as_i64().unwrap_or(-1);
            let last = seqs.entry(run_id.clone()).or_insert(0);
            if seq != *last + 1 {
                problems.push(format!("run {run_id}: seq {seq} follows {last}"));
            }
            *last = seq;
            if run_id == run {
                kept.push(change.clone());
            }
        }
    }
    let cursor = fuzz.read_back("/v1/activity/cursor", false).await;
    let cursor = cursor.and_then(|c| c["changeCursor"].as_i64());
    if cursor != Some(after) {
        problems.push(format!("the cursor is {cursor:?}, the last change {after}"));
    }
    for problem in problems.into_iter().take(20) {
        fuzz.failures.push(format!("change log: {problem}"));
    }
    kept
}

fn server_options() -> Options {
    Options {
        grpc: true,
        config: ServerConfig {
            body_limit: BODY_LIMIT,
            otlp_max_decompressed: MAX_DECOMPRESSED,
            ..ServerConfig::default()
        },
        ..Options::default()
    }
}

async fn post_protobuf(
    server: &TestServer,
    request: &ExportTraceServiceRequest,
) -> ExportTraceServiceResponse {
    let response = server
        .client
        .post(format!("{}/v1/traces", server.base))
        .header(CONTENT_TYPE, "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    let bytes = response.bytes().await.expect("body");
    ExportTraceServiceResponse::decode(bytes).expect("an ExportTraceServiceResponse")
}

pub(crate) async fn grpc_channel(server: &TestServer) -> Channel {
    let base = server.grpc_base.clone().expect("the gRPC listener");
    Endpoint::from_shared(base)
        .expect("an endpoint")
        .timeout(REQUEST_TIMEOUT)
        .connect()
        .await
        .expect("connect to the gRPC listener")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_fuzzed_exports_get_clear_answers_and_lose_nothing() {
    let started = Instant::now();
    let server = TestServer::start_with(server_options()).await;

    // 1. The stored trace, and what the reads say about it.
    let stored = post_protobuf(&server, &request_of(keep_spans(), "keep-agent")).await;
    assert_eq!(stored.partial_success, None, "the stored trace is valid");
    let before = kept_state(&server).await;
    for (path, status, body) in &before {
        assert_eq!(*status, 200, "{path}: {body}");
    }
    assert_eq!(
        before[0].2["spans"].as_array().map(Vec::len),
        Some(usize::from(KEEP_SPANS))
    );
    assert_eq!(before[1].2["spanCount"], KEEP_SPANS);

    // 2. The mutated exports, and the server still serving after each round.
    let channel = grpc_channel(&server).await;
    let mut fuzz = Fuzz::new(&server, channel);
    let kept_changes_before = check_change_log(&mut fuzz).await;
    for _ in 0..ROUNDS {
        for family in PLAN {
            let probe = fuzz.probe(family);
            fuzz.fire(probe).await;
        }
        fuzz.read_back("/healthz", false).await;
    }

    // 3. Nothing stored was lost or changed, and everything reads back.
    let after = kept_state(&server).await;
    for ((path, status, body), (_, status_after, body_after)) in before.iter().zip(&after) {
        if (status, body) != (status_after, body_after) {
            fuzz.failures.push(format!(
                "stored trace changed: {path}\n    before: {status} {body}\n    after: {status_after} {body_after}"
            ));
        }
    }
    let kept_changes_after = check_change_log(&mut fuzz).await;
    if kept_changes_before != kept_changes_after {
        fuzz.failures.push(format!(
            "the stored trace's changes changed: {} before, {} after",
            kept_changes_before.len(),
            kept_changes_after.len()
        ));
    }
    for path in [
        "/v1/activity/runs?state=open&limit=10000",
        "/v1/activity/open-roots",
        "/v1/activity/changes/terminal-roots?after=0&limit=10000",
        "/v1/activity/stuck?thresholdMs=0",
    ] {
        fuzz.read_back(path, false).await;
    }
    let runs = fuzz
        .read_back("/v1/activity/runs?limit=10000", false)
        .await
        .and_then(|page| page["runs"].as_array().cloned())
        .unwrap_or_default();
    // (Each run the fuzzing created, up to a bound that keeps the test short.)
    for run in runs
        .iter()
        .filter_map(|run| run["runId"].as_str())
        .take(400)
    {
        fuzz.read_back(&format!("/v1/activity/runs/{run}/snapshot"), false)
            .await;
        fuzz.read_back(&format!("/v1/activity/runs/{run}/rollup"), true)
            .await;
    }
    let health = server.get("/healthz").await;
    assert_eq!(health.assert_status(200), &json!({"status": "ok"}));

    fuzz.report(started.elapsed());
    assert_no_fuzz_failures(&fuzz.failures, fuzz.sent);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The defects the fuzzing found, fixed; each minimal reproduction stays as a regression test.

async fn post_body(
    server: &TestServer,
    content_type: &str,
    content_encoding: Option<&str>,
    body: Vec<u8>,
) -> Result<reqwest::Response, reqwest::Error> {
    let mut request = server
        .client
        .post(format!("{}/v1/traces", server.base))
        .header(CONTENT_TYPE, content_type)
        .body(body);
    if let Some(encoding) = content_encoding {
        request = request.header(CONTENT_ENCODING, encoding);
    }
    request.send().await
}

/// The answer must be the OTLP error body of a protobuf request: a `google.rpc.Status` with
/// `RESOURCE_EXHAUSTED` (8), naming `limit`.
async fn assert_protobuf_413(response: reqwest::Response, limit: usize) {
    assert_eq!(response.status(), 413);
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = response.bytes().await.expect("body");
    assert_eq!(
        content_type,
        "application/x-protobuf",
        "a protobuf request's 413 must be a protobuf google.rpc.Status; got {}",
        String::from_utf8_lossy(&bytes)
    );
    let status = RpcStatus::decode(bytes).expect("a google.rpc.Status");
    assert_eq!(status.code, 8, "RESOURCE_EXHAUSTED: {status:?}");
    assert!(
        status.message.contains(&limit.to_string()),
        "the message names the limit that was exceeded ({limit}): {status:?}"
    );
    assert!(
        status.message.contains("--body-limit"),
        "the message says how to fit: {status:?}"
    );
}

/// Regression (found by the fuzzing, fixed): `POST /v1/traces` with `Content-Type: application/x-protobuf`,
/// `Content-Encoding: gzip` and a body inflating to one byte over `otlp_max_decompressed`
/// (2 MiB here) is answered `413 application/json {"error": {"code": "payload_too_large",
/// "message": "the request body is larger than the limit of 3145728 bytes"}}`: the OTLP handler
/// answers a protobuf `google.rpc.Status` (RESOURCE_EXHAUSTED, "the decompressed request exceeds
/// 2097152 bytes"), and the gate's `with_contract_body_limit_answer` replaces every 413 that is
/// not JSON with the body-limit error. So the answer is in the wrong encoding and names the wrong
/// limit (the 9 KiB body was far under the 3 MiB body limit). An uncompressed protobuf body
/// between the two limits gets the same.
#[tokio::test]
async fn protobuf_gzip_past_the_inflate_limit_is_refused_in_protobuf() {
    let server = TestServer::start_with(server_options()).await;
    let bomb = gzip(&vec![0u8; MAX_DECOMPRESSED + 1]);
    let response = post_body(&server, "application/x-protobuf", Some("gzip"), bomb)
        .await
        .expect("an answer");
    assert_protobuf_413(response, MAX_DECOMPRESSED).await;
    server.stop().await;
}

/// Regression (found by the fuzzing, fixed): `POST /v1/traces` with `Content-Type: application/x-protobuf` and a
/// body one byte over the body limit is answered `413 application/json {"error": …}`, the
/// contract's JSON error, where `docs/otlp.md` says a protobuf request's errors are a
/// `google.rpc.Status` in protobuf (413 → RESOURCE_EXHAUSTED) that a protobuf exporter can read.
/// (The declared length is refused by tower-http's limit before the OTLP handler runs.) The
/// body is sent with `Expect: 100-continue`, so that the answer arrives whole (see the next
/// defect).
#[tokio::test]
async fn protobuf_body_over_the_body_limit_is_refused_in_protobuf() {
    let server = TestServer::start_with(server_options()).await;
    let response = server
        .client
        .post(format!("{}/v1/traces", server.base))
        .header(CONTENT_TYPE, "application/x-protobuf")
        .header("expect", "100-continue")
        .body(vec![0u8; BODY_LIMIT + 1])
        .send()
        .await
        .expect("an answer");
    assert_protobuf_413(response, BODY_LIMIT).await;
    server.stop().await;
}

/// Regression (found by the fuzzing, fixed): `POST /v1/traces` (any content type) with a body over the body limit
/// and a `Content-Length` (what every OTLP exporter sends) is refused with `413` as soon as the
/// headers arrive, and the server closes the connection without reading the body. A client
/// still writing the body then gets `EPIPE`/`ECONNRESET` and often never sees the 413 (the
/// fuzzing lost 2 of about 10 such answers): an exporter takes it for a network error and
/// retries the same batch, where a 413 would have told it to drop it. Expected: the 413, every
/// time (e.g. by reading and discarding a bounded amount of the body, or a lingering close,
/// before closing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_always_gets_its_413() {
    let server = TestServer::start_with(server_options()).await;
    let mut lost = Vec::new();
    for attempt in 0..20 {
        let body = vec![b' '; BODY_LIMIT + 1 + attempt * 65_536];
        match post_body(&server, "application/json", None, body).await {
            Ok(response) => assert_eq!(response.status(), 413),
            Err(error) => lost.push(format!("attempt {attempt}: {error:?}")),
        }
    }
    assert!(
        lost.is_empty(),
        "{} of 20 requests over the limit got no answer:\n{}",
        lost.len(),
        lost.join("\n")
    );
    server.stop().await;
}

/// A finished root span of trace `trace`, id `id`, started at `start_ms`.
fn root_of(trace: u8, id: u8, start_ms: u64) -> Span {
    Span {
        trace_id: vec![trace; 16],
        span_id: vec![id; 8],
        name: format!("root {id}"),
        start_time_unix_nano: ms(start_ms),
        end_time_unix_nano: ms(start_ms + 10),
        status: ok_status(),
        ..Span::default()
    }
}

/// Regression (found by the fuzzing, fixed): an OTLP trace may carry several spans without a parent (here, hundreds
/// of copies of a span whose parent was zeroed). `GET /v1/activity/runs?limit=L` reads `L + 1`
/// root rows, drops the repeated roots of one run, and then decides whether a next page exists
/// from the rows left: when a run's extra roots fill the window, the page comes back short with
/// `"next": null`, and every older run can no longer be reached by paging. Here: run A (one
/// root, older), run B (two roots, newer); `limit=1` answers `{"runs": [B], "next": null}`, so A
/// is never listed. In the fuzzing, 1,000-run pages stopped after 106 runs and the stored trace
/// disappeared from the list. Expected: paging reaches every run (a `next` cursor while runs
/// remain).
#[tokio::test]
async fn a_run_with_several_roots_does_not_hide_older_runs() {
    let server = TestServer::start().await;
    let older = post_protobuf(&server, &request_of(vec![root_of(0xa1, 0x11, 1_000)], "a")).await;
    assert_eq!(older.partial_success, None);
    let newer = post_protobuf(
        &server,
        &request_of(
            vec![root_of(0xb2, 0x21, 2_000), root_of(0xb2, 0x22, 2_001)],
            "b",
        ),
    )
    .await;
    assert_eq!(newer.partial_success, None);
    let mut listed = Vec::new();
    let mut path = "/v1/activity/runs?limit=1".to_owned();
    for _ in 0..10 {
        let page = server.get(&path).await;
        let body = page.assert_status(200);
        for run in body["runs"].as_array().into_iter().flatten() {
            listed.push(run["runId"].as_str().unwrap_or_default().to_owned());
        }
        match body["next"].as_str() {
            Some(next) => path = format!("/v1/activity/runs?limit=1&before={}", segment(next)),
            None => break,
        }
    }
    assert_eq!(
        listed,
        vec![hex(&[0xb2; 16]), hex(&[0xa1; 16])],
        "every run is listed once, newest first"
    );
    server.stop().await;
}
