//! What an OTLP/HTTP body would cost in memory once decoded, told before it is decoded.
//!
//! The body limits count bytes, but decoding makes one value per protobuf entry or JSON value:
//! an entry of two bytes (`\n\x00`, an empty `ResourceSpans`) becomes a struct of about a
//! hundred. A 61 KB gzip body of such entries (60 MiB inflated, under the inflation limit) made
//! the server take 5 GB (an audit's finding), and a plain 8 MiB one 880 MB. Real telemetry
//! decodes to about four times its wire size (ids, names and attributes are mostly bytes that
//! are copied once), so a body is refused when its decoded estimate passes
//! [`MAX_EXPANSION`] times its size (and at least [`MIN_BUDGET_BYTES`]).
//!
//! Protobuf: a walk of the wire format along the export's schema (traces, metrics or logs),
//! counting each message at the size of the struct prost makes of it, each string or bytes
//! field at its length plus a `String`'s own size, and each packed list of varints at sixteen
//! bytes a byte (an element a byte, eight bytes each, in a `Vec` that doubled its way there). (Metrics and logs were counted at their top-level entries only, and one
//! resource of 3.6 million empty log records, 7 MiB, or 8 KB gzipped, took 1.4 GiB: an audit's
//! finding.) JSON: a scan that charges every value a `serde_json::Value` and every object a
//! map. The walk never refuses malformed input itself: it stops, and the decoder gives its own
//! message.

use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::metrics::v1::exponential_histogram_data_point::Buckets;
use opentelemetry_proto::tonic::metrics::v1::summary_data_point::ValueAtQuantile;
use opentelemetry_proto::tonic::metrics::v1::{
    Exemplar, ExponentialHistogram, ExponentialHistogramDataPoint, Gauge, Histogram,
    HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, Summary,
    SummaryDataPoint,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

use crate::decode::OtlpEncoding;
use crate::error::OtlpError;

/// How many times its own size a body may take once decoded.
pub(crate) const MAX_EXPANSION: usize = 8;
/// The decoded estimate any body may reach, however small.
pub(crate) const MIN_BUDGET_BYTES: usize = 64 << 20;
/// Nesting deeper than this is left to the decoder, which refuses it (prost stops at 100).
const MAX_DEPTH: usize = 100;

/// Which export a body is: what its protobuf is walked along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportSchema {
    /// `ExportTraceServiceRequest`.
    Traces,
    /// `ExportMetricsServiceRequest`.
    Metrics,
    /// `ExportLogsServiceRequest`.
    Logs,
}

/// Refuse `body` when decoding it would take more memory than its size allows (see the module
/// documentation).
pub(crate) fn check_decoded_size(
    body: &[u8],
    encoding: OtlpEncoding,
    schema: ExportSchema,
) -> Result<(), OtlpError> {
    let budget = body
        .len()
        .saturating_mul(MAX_EXPANSION)
        .max(MIN_BUDGET_BYTES);
    let mut estimate = Estimate { bytes: 0, budget };
    let within = match encoding {
        OtlpEncoding::Protobuf => {
            let root = match schema {
                ExportSchema::Traces => Message::Request,
                ExportSchema::Metrics => Message::MetricsRequest,
                ExportSchema::Logs => Message::LogsRequest,
            };
            walk_protobuf(body, root, 0, &mut estimate)
        }
        OtlpEncoding::Json => scan_json(body, &mut estimate),
    };
    match within {
        Ok(()) => Ok(()),
        Err(Over) => Err(OtlpError::TooManyItems { budget }),
    }
}

/// Refuse a decoded trace export whose spans' copies of their resource's and scope's
/// attributes would pass the budget of the request's own size (see [`OtlpError::TooManyCopies`]):
/// each span's share is its resource's and its scope's encoded size (their JSON in the span's
/// attrs is about as large). Real exports pass with room: a 1 KB resource in each of 512 spans
/// is half a megabyte of copies, under the 64 MiB any request may reach.
pub(crate) fn check_copied_attributes(
    request: &opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
) -> Result<(), OtlpError> {
    use prost::Message as _;
    let mut copies = 0usize;
    let mut spans = 0usize;
    for resource_spans in &request.resource_spans {
        let resource = resource_spans
            .resource
            .as_ref()
            .map_or(0, |resource| resource.encoded_len());
        for scope_spans in &resource_spans.scope_spans {
            let scope = scope_spans
                .scope
                .as_ref()
                .map_or(0, |scope| scope.encoded_len());
            spans = spans.saturating_add(scope_spans.spans.len());
            copies =
                copies.saturating_add((resource + scope).saturating_mul(scope_spans.spans.len()));
        }
    }
    let budget = request
        .encoded_len()
        .saturating_mul(MAX_EXPANSION)
        .max(MIN_BUDGET_BYTES);
    if copies > budget {
        return Err(OtlpError::TooManyCopies {
            spans,
            copies,
            budget,
        });
    }
    Ok(())
}

/// The running estimate, in bytes, and where it stops.
struct Estimate {
    bytes: usize,
    budget: usize,
}

/// The estimate passed its budget.
struct Over;

impl Estimate {
    fn charge(&mut self, bytes: usize) -> Result<(), Over> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.budget {
            Err(Over)
        } else {
            Ok(())
        }
    }
}

/// The messages of the export schemas (opentelemetry-proto's `trace/v1`, `metrics/v1`,
/// `logs/v1`, `common/v1`, `resource/v1`), `Opaque` for one whose fields are not walked, and
/// `PackedVarints` for a packed list of varints (up to an eight-byte element a byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    Request,
    ResourceSpans,
    Resource,
    ScopeSpans,
    Scope,
    Span,
    Event,
    Link,
    Status,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
    LogsRequest,
    ResourceLogs,
    ScopeLogs,
    LogRecord,
    MetricsRequest,
    ResourceMetrics,
    ScopeMetrics,
    Metric,
    Gauge,
    Sum,
    Histogram,
    ExponentialHistogram,
    Summary,
    NumberDataPoint,
    HistogramDataPoint,
    ExponentialHistogramDataPoint,
    Buckets,
    SummaryDataPoint,
    ValueAtQuantile,
    Exemplar,
    Opaque,
    PackedVarints,
}

impl Message {
    /// The message a length-delimited field holds, `None` for a string or bytes field.
    fn field(self, number: u64) -> Option<Message> {
        use Message::*;
        Some(match (self, number) {
            (Request, 1) => ResourceSpans,
            (ResourceSpans, 1) => Resource,
            (ResourceSpans, 2) => ScopeSpans,
            (Resource, 1) => KeyValue,
            // `entity_refs` (3): strings only, counted as one opaque message.
            (Resource, 3) => Opaque,
            (ScopeSpans, 1) => Scope,
            (ScopeSpans, 2) => Span,
            (Scope, 3) => KeyValue,
            (Span, 9) => KeyValue,
            (Span, 11) => Event,
            (Span, 13) => Link,
            (Span, 15) => Status,
            (Event, 3) | (Link, 4) => KeyValue,
            (KeyValue, 2) => AnyValue,
            (AnyValue, 5) => ArrayValue,
            (AnyValue, 6) => KeyValueList,
            (ArrayValue, 1) => AnyValue,
            (KeyValueList, 1) => KeyValue,
            (LogsRequest, 1) => ResourceLogs,
            (ResourceLogs, 1) => Resource,
            (ResourceLogs, 2) => ScopeLogs,
            (ScopeLogs, 1) => Scope,
            (ScopeLogs, 2) => LogRecord,
            (LogRecord, 5) => AnyValue,
            (LogRecord, 6) => KeyValue,
            (MetricsRequest, 1) => ResourceMetrics,
            (ResourceMetrics, 1) => Resource,
            (ResourceMetrics, 2) => ScopeMetrics,
            (ScopeMetrics, 1) => Scope,
            (ScopeMetrics, 2) => Metric,
            (Metric, 5) => Gauge,
            (Metric, 7) => Sum,
            (Metric, 9) => Histogram,
            (Metric, 10) => ExponentialHistogram,
            (Metric, 11) => Summary,
            (Metric, 12) => KeyValue,
            (Gauge | Sum, 1) => NumberDataPoint,
            (Histogram, 1) => HistogramDataPoint,
            (ExponentialHistogram, 1) => ExponentialHistogramDataPoint,
            (Summary, 1) => SummaryDataPoint,
            (NumberDataPoint, 7) | (HistogramDataPoint, 9) => KeyValue,
            (ExponentialHistogramDataPoint, 1) => KeyValue,
            (SummaryDataPoint, 7) | (Exemplar, 7) => KeyValue,
            (NumberDataPoint, 5) | (HistogramDataPoint, 8) => Exemplar,
            (ExponentialHistogramDataPoint, 11) => Exemplar,
            (ExponentialHistogramDataPoint, 8 | 9) => Buckets,
            (Buckets, 2) => PackedVarints,
            (SummaryDataPoint, 6) => ValueAtQuantile,
            _ => return None,
        })
    }

    /// The size of the struct prost decodes this message into (an opaque message: a generous
    /// guess).
    fn decoded_size(self) -> usize {
        use std::mem::size_of;
        match self {
            Message::Request
            | Message::LogsRequest
            | Message::MetricsRequest
            | Message::PackedVarints => 0,
            Message::ResourceSpans => size_of::<ResourceSpans>(),
            Message::Resource => size_of::<Resource>(),
            Message::ScopeSpans => size_of::<ScopeSpans>(),
            Message::Scope => size_of::<InstrumentationScope>(),
            Message::Span => size_of::<Span>(),
            Message::Event => size_of::<Event>(),
            Message::Link => size_of::<Link>(),
            Message::Status => size_of::<Status>(),
            Message::KeyValue => size_of::<KeyValue>(),
            Message::AnyValue => size_of::<AnyValue>(),
            Message::ArrayValue => size_of::<ArrayValue>(),
            Message::KeyValueList => size_of::<KeyValueList>(),
            Message::ResourceLogs => size_of::<ResourceLogs>(),
            Message::ScopeLogs => size_of::<ScopeLogs>(),
            Message::LogRecord => size_of::<LogRecord>(),
            Message::ResourceMetrics => size_of::<ResourceMetrics>(),
            Message::ScopeMetrics => size_of::<ScopeMetrics>(),
            Message::Metric => size_of::<Metric>(),
            Message::Gauge => size_of::<Gauge>(),
            Message::Sum => size_of::<Sum>(),
            Message::Histogram => size_of::<Histogram>(),
            Message::ExponentialHistogram => size_of::<ExponentialHistogram>(),
            Message::Summary => size_of::<Summary>(),
            Message::NumberDataPoint => size_of::<NumberDataPoint>(),
            Message::HistogramDataPoint => size_of::<HistogramDataPoint>(),
            Message::ExponentialHistogramDataPoint => size_of::<ExponentialHistogramDataPoint>(),
            Message::Buckets => size_of::<Buckets>(),
            Message::SummaryDataPoint => size_of::<SummaryDataPoint>(),
            Message::ValueAtQuantile => size_of::<ValueAtQuantile>(),
            Message::Exemplar => size_of::<Exemplar>(),
            Message::Opaque => 256,
        }
    }
}

/// A varint at the start of `bytes`: its value and length.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (at, byte) in bytes.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * at);
        if byte & 0x80 == 0 {
            return Some((value, at + 1));
        }
    }
    None
}

/// Charge the entries of one message of kind `message`; stops (without refusing) at the first
/// thing that is not valid wire format.
fn walk_protobuf(
    mut bytes: &[u8],
    message: Message,
    depth: usize,
    estimate: &mut Estimate,
) -> Result<(), Over> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    while !bytes.is_empty() {
        let Some((key, used)) = varint(bytes) else {
            return Ok(());
        };
        bytes = &bytes[used..];
        let skip = match key & 7 {
            0 => match varint(bytes) {
                Some((_, used)) => used,
                None => return Ok(()),
            },
            1 => 8,
            5 => 4,
            2 => {
                let Some((length, used)) = varint(bytes) else {
                    return Ok(());
                };
                let Some(payload) = usize::try_from(length)
                    .ok()
                    .and_then(|length| bytes.get(used..used.checked_add(length)?))
                else {
                    return Ok(());
                };
                match message.field(key >> 3) {
                    // Up to one element a byte, eight bytes each, in a `Vec` that doubled
                    // its way there (up to twice that).
                    Some(Message::PackedVarints) => estimate.charge(
                        payload
                            .len()
                            .saturating_mul(16)
                            .saturating_add(std::mem::size_of::<Vec<u64>>()),
                    )?,
                    Some(inner) => {
                        estimate.charge(inner.decoded_size())?;
                        if inner != Message::Opaque {
                            walk_protobuf(payload, inner, depth + 1, estimate)?;
                        }
                    }
                    // A string or bytes value (or an entry of a message not walked): its bytes
                    // and a `String`/`Vec` of its own.
                    None => estimate.charge(payload.len() + std::mem::size_of::<String>())?,
                }
                used + payload.len()
            }
            // Groups (3, 4) are not proto3; anything else is not wire format.
            _ => return Ok(()),
        };
        let Some(rest) = bytes.get(skip..) else {
            return Ok(());
        };
        bytes = rest;
    }
    Ok(())
}

/// What one JSON value costs decoded: a `serde_json::Value`, then the struct it becomes.
const JSON_VALUE_BYTES: usize = 32;
/// What a JSON object costs on top: its map.
const JSON_OBJECT_BYTES: usize = 64;

/// Charge every JSON value (an object or array start, and each `:` or `,` that brings one
/// more) outside strings.
fn scan_json(body: &[u8], estimate: &mut Estimate) -> Result<(), Over> {
    let mut at = 0;
    while let Some(&byte) = body.get(at) {
        at += 1;
        match byte {
            // A string: skipped to its closing quote (strings are most of a body's bytes, so
            // they are searched for their next quote or backslash, not walked byte by byte).
            b'"' => loop {
                // (`get`: a body may end in a backslash, the escaped byte past its end.)
                let rest = body.get(at..).unwrap_or_default();
                let Some(found) = memchr::memchr2(b'"', b'\\', rest) else {
                    return Ok(());
                };
                let closing = rest[found] == b'"';
                at += found + 1;
                if closing {
                    break;
                }
                at += 1; // the escaped byte
            },
            b'{' => estimate.charge(JSON_VALUE_BYTES + JSON_OBJECT_BYTES)?,
            b'[' | b':' | b',' => estimate.charge(JSON_VALUE_BYTES)?,
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message as _;

    use super::*;
    use crate::test_support::{int, kv, request, span, string};

    /// An agent-shaped trace: an agent span, model calls with usage and a prompt event, tool
    /// calls with their arguments.
    fn agent_trace_request() -> ExportTraceServiceRequest {
        let mut spans = vec![span(
            1,
            None,
            "invoke_agent planner",
            vec![
                kv("gen_ai.operation.name", string("invoke_agent")),
                kv("gen_ai.agent.name", string("planner")),
                kv("session.id", string("session-42")),
            ],
        )];
        for call in 0..5u8 {
            let mut chat = span(
                2 + call,
                Some(1),
                "chat claude-sonnet-4",
                vec![
                    kv("gen_ai.operation.name", string("chat")),
                    kv("gen_ai.request.model", string("claude-sonnet-4")),
                    kv("gen_ai.usage.input_tokens", int(1200)),
                    kv("gen_ai.usage.output_tokens", int(300)),
                    kv("gen_ai.response.id", string("msg_01XFDUDYJgAACzvnptvVoYEL")),
                ],
            );
            chat.events.push(Event {
                time_unix_nano: 1_100_000_000,
                name: "gen_ai.user.message".into(),
                attributes: vec![kv(
                    "content",
                    string("Run the planner tests again after editing step 3 to confirm the fix"),
                )],
                dropped_attributes_count: 0,
            });
            spans.push(chat);
        }
        for tool in 0..4u8 {
            spans.push(span(
                7 + tool,
                Some(1),
                "execute_tool run_tests",
                vec![
                    kv("gen_ai.operation.name", string("execute_tool")),
                    kv("gen_ai.tool.name", string("run_tests")),
                    kv(
                        "gen_ai.tool.call.arguments",
                        string("{\"command\":\"cargo test -p agent-core\",\"cwd\":\"/work\"}"),
                    ),
                ],
            ));
        }
        request(spans)
    }

    #[test]
    fn real_traces_pass_in_both_encodings() {
        let request = agent_trace_request();
        let protobuf = request.encode_to_vec();
        assert!(
            check_decoded_size(&protobuf, OtlpEncoding::Protobuf, ExportSchema::Traces).is_ok()
        );
        let json = serde_json::to_vec(&request).expect("serializable");
        assert!(check_decoded_size(&json, OtlpEncoding::Json, ExportSchema::Traces).is_ok());
    }

    /// A realistic body at the largest size: its estimate stays under the budget, with room.
    #[test]
    fn a_large_body_of_real_spans_stays_within_its_budget() {
        let one = agent_trace_request();
        // Past the size where the budget is the expansion's, not the floor.
        let copies = 2 * MIN_BUDGET_BYTES / MAX_EXPANSION / one.encoded_len();
        let request = ExportTraceServiceRequest {
            resource_spans: std::iter::repeat_n(&one.resource_spans, copies)
                .flatten()
                .cloned()
                .collect(),
        };
        let protobuf = request.encode_to_vec();
        let mut estimate = Estimate {
            bytes: 0,
            budget: usize::MAX,
        };
        assert!(walk_protobuf(&protobuf, Message::Request, 0, &mut estimate).is_ok());
        let expansion = estimate.bytes as f64 / protobuf.len() as f64;
        assert!(expansion < MAX_EXPANSION as f64 / 1.5, "{expansion}");
        assert!(
            check_decoded_size(&protobuf, OtlpEncoding::Protobuf, ExportSchema::Traces).is_ok()
        );
        let json = serde_json::to_vec(&request).expect("serializable");
        let mut estimate = Estimate {
            bytes: 0,
            budget: usize::MAX,
        };
        assert!(scan_json(&json, &mut estimate).is_ok());
        let expansion = estimate.bytes as f64 / json.len() as f64;
        assert!(expansion < MAX_EXPANSION as f64 / 1.5, "{expansion}");
    }

    /// Bodies of empty entries, the shape of the audit's 61 KB gzip body, are refused before
    /// anything is decoded, at any nesting.
    #[test]
    fn bodies_of_tiny_entries_are_refused() {
        let size = 8 << 20;
        let empty_resources = b"\n\x00".repeat(size / 2);
        // One resource holding empty scopes, each holding empty spans.
        let spans = b"\x12\x00".repeat(1 << 16);
        let mut scope = vec![0x12];
        scope.extend(prost_length(spans.len()));
        scope.extend(&spans);
        let scopes = scope.repeat(size / scope.len());
        let mut resource = vec![0x0a];
        resource.extend(prost_length(scopes.len()));
        resource.extend(&scopes);
        for body in [&empty_resources, &resource] {
            let refused = check_decoded_size(body, OtlpEncoding::Protobuf, ExportSchema::Traces);
            assert!(
                matches!(refused, Err(OtlpError::TooManyItems { .. })),
                "{refused:?}"
            );
        }
        let mut json = b"{\"resourceSpans\":[".to_vec();
        json.extend(b"{},".repeat(size / 3));
        json.extend(b"{}]}");
        let refused = check_decoded_size(&json, OtlpEncoding::Json, ExportSchema::Traces);
        assert!(matches!(refused, Err(OtlpError::TooManyItems { .. })));
        // Metrics and logs: their top-level entries are counted.
        for schema in [ExportSchema::Metrics, ExportSchema::Logs] {
            let refused = check_decoded_size(&empty_resources, OtlpEncoding::Protobuf, schema);
            assert!(matches!(refused, Err(OtlpError::TooManyItems { .. })));
        }
    }

    /// Metrics and logs exports are walked along their own schemas: empty log records or data
    /// points nested under one resource (the audit's 7 MiB export of 3.6 million empty log
    /// records, which took 1.4 GiB) are refused, and so is a packed list of bucket counts that
    /// decodes to eight times its size; real exports pass.
    #[test]
    fn metrics_and_logs_of_tiny_entries_are_refused_and_real_ones_pass() {
        use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        fn nest(tag: u8, inner: &[u8]) -> Vec<u8> {
            let mut out = vec![tag];
            out.extend(prost_length(inner.len()));
            out.extend(inner);
            out
        }
        let size = 7 << 20;
        // One resource, one scope, then empty records (field 2 of ScopeLogs).
        let records = b"\x12\x00".repeat(size / 2);
        let logs = nest(0x0a, &nest(0x12, &records));
        let refused = check_decoded_size(&logs, OtlpEncoding::Protobuf, ExportSchema::Logs);
        assert!(
            matches!(refused, Err(OtlpError::TooManyItems { .. })),
            "{refused:?}"
        );
        // One resource, one scope, one metric (field 2 of ScopeMetrics), one gauge (field 5 of
        // Metric), then empty points (field 1 of Gauge).
        let points = b"\x0a\x00".repeat(size / 2);
        let metrics = nest(0x0a, &nest(0x12, &nest(0x12, &nest(0x2a, &points))));
        let refused = check_decoded_size(&metrics, OtlpEncoding::Protobuf, ExportSchema::Metrics);
        assert!(
            matches!(refused, Err(OtlpError::TooManyItems { .. })),
            "{refused:?}"
        );
        // An exponential histogram's bucket counts: one byte a count on the wire, eight decoded
        // (sixteen in a `Vec` grown by doubling).
        let counts = vec![1u8; size];
        let buckets = nest(0x12, &counts);
        let point = nest(0x42, &buckets);
        let metrics = nest(
            0x0a,
            &nest(0x12, &nest(0x12, &nest(0x52, &nest(0x0a, &point)))),
        );
        let refused = check_decoded_size(&metrics, OtlpEncoding::Protobuf, ExportSchema::Metrics);
        assert!(
            matches!(refused, Err(OtlpError::TooManyItems { .. })),
            "{refused:?}"
        );

        // Real exports, about 9 MiB each (past the budget's floor): within it.
        let log = opentelemetry_proto::tonic::logs::v1::LogRecord {
            time_unix_nano: 1_000,
            severity_text: "INFO".into(),
            body: Some(string("tool run_tests finished: 42 passed, 0 failed")),
            attributes: vec![
                kv("gen_ai.tool.name", string("run_tests")),
                kv("duration_ms", int(1234)),
            ],
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            ..Default::default()
        };
        let one_scope = ScopeLogs {
            log_records: vec![log; 64],
            ..Default::default()
        };
        let mut logs = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![one_scope],
                ..Default::default()
            }],
        };
        let copies = (9 << 20) / logs.encoded_len();
        logs.resource_logs = std::iter::repeat_n(logs.resource_logs[0].clone(), copies).collect();
        let body = logs.encode_to_vec();
        assert!(
            body.len() > MIN_BUDGET_BYTES / MAX_EXPANSION,
            "{}",
            body.len()
        );
        assert!(check_decoded_size(&body, OtlpEncoding::Protobuf, ExportSchema::Logs).is_ok());
        assert_expansion_with_room(&body, Message::LogsRequest);
        let point = NumberDataPoint {
            attributes: vec![kv("gen_ai.request.model", string("claude-sonnet-4"))],
            time_unix_nano: 1_000,
            value: Some(
                opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsInt(1200),
            ),
            ..Default::default()
        };
        let metric = Metric {
            name: "gen_ai.client.token.usage".into(),
            unit: "{token}".into(),
            data: Some(Data::Sum(Sum {
                data_points: vec![point; 64],
                aggregation_temporality: 1,
                is_monotonic: true,
            })),
            ..Default::default()
        };
        let mut metrics = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![metric],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let copies = (9 << 20) / metrics.encoded_len();
        metrics.resource_metrics =
            std::iter::repeat_n(metrics.resource_metrics[0].clone(), copies).collect();
        let body = metrics.encode_to_vec();
        assert!(check_decoded_size(&body, OtlpEncoding::Protobuf, ExportSchema::Metrics).is_ok());
        assert_expansion_with_room(&body, Message::MetricsRequest);
    }

    /// The estimate of a real export stays well under the expansion allowed.
    fn assert_expansion_with_room(body: &[u8], root: Message) {
        let mut estimate = Estimate {
            bytes: 0,
            budget: usize::MAX,
        };
        assert!(walk_protobuf(body, root, 0, &mut estimate).is_ok());
        let expansion = estimate.bytes as f64 / body.len() as f64;
        assert!(
            expansion < MAX_EXPANSION as f64 / 1.5,
            "{root:?}: {expansion}"
        );
    }

    /// The spans' copies of their resource's and scope's attributes count against the request's
    /// budget: the audit's 249 KB export (one resource of six 16,000-byte attributes, 3,000
    /// spans; 600 MiB and 290 MB written) is refused; a real export passes.
    #[test]
    fn a_resource_copied_into_too_many_spans_is_refused() {
        let spans: Vec<Span> = (0..3_000u32)
            .map(|index| {
                let mut one = span(1, None, "s", Vec::new());
                one.span_id = (u64::from(index) + 1).to_be_bytes().to_vec();
                one
            })
            .collect();
        let mut bomb = request(spans);
        bomb.resource_spans[0].resource = Some(Resource {
            attributes: (0..6)
                .map(|index| kv(&format!("big.{index}"), string(&"r".repeat(16_000))))
                .collect(),
            ..Default::default()
        });
        assert!(bomb.encoded_len() < 300_000);
        let refused = check_copied_attributes(&bomb);
        assert!(
            matches!(refused, Err(OtlpError::TooManyCopies { spans: 3_000, .. })),
            "{refused:?}"
        );
        let real = agent_trace_request();
        assert!(check_copied_attributes(&real).is_ok());
    }

    /// Malformed input is not refused here: the decoder's message says what is wrong.
    /// The scan as it was written first, byte by byte: the reference for the faster one.
    fn scan_json_bytewise(body: &[u8]) -> usize {
        let (mut bytes, mut in_string, mut escaped) = (0, false, false);
        for &byte in body {
            if in_string {
                match byte {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_string = false,
                    _ => {}
                }
                continue;
            }
            match byte {
                b'"' => in_string = true,
                b'{' => bytes += JSON_VALUE_BYTES + JSON_OBJECT_BYTES,
                b'[' | b':' | b',' => bytes += JSON_VALUE_BYTES,
                _ => {}
            }
        }
        bytes
    }

    proptest::proptest! {
        #[test]
        fn the_json_scan_charges_what_a_byte_by_byte_walk_charges(
            body in proptest::collection::vec(
                proptest::sample::select(b"{}[]:,\"\\ab".to_vec()), 0..64)
        ) {
            let mut estimate = Estimate { bytes: 0, budget: usize::MAX };
            assert!(scan_json(&body, &mut estimate).is_ok());
            proptest::prop_assert_eq!(estimate.bytes, scan_json_bytewise(&body));
        }
    }

    #[test]
    fn malformed_input_is_left_to_the_decoder() {
        for body in [
            &b"\xff\xff\xff"[..],
            b"\n\x7f",
            b"\x0b\x0c",
            b"nul",
            b"{\"a\":\"\\\"",
        ] {
            for encoding in [OtlpEncoding::Protobuf, OtlpEncoding::Json] {
                assert!(check_decoded_size(body, encoding, ExportSchema::Traces).is_ok());
            }
        }
    }

    fn prost_length(length: usize) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::encode_varint(length as u64, &mut out);
        out
    }
}
