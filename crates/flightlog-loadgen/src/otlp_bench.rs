//! `flightlog-loadgen otlp`: OTLP/HTTP ingest (protobuf, or OTLP/JSON with `--json`), end to end.
//!
//! Bodies of agent-shaped traces are encoded before the clock starts: each trace is a root
//! `invoke_agent` span, 5 model `chat` spans (`gen_ai.request.model`, `gen_ai.usage.*`) and 4
//! `execute_tool` spans, with 5 span events (one per tool span, one on the last chat); every
//! trace and span id is unique across all bodies. K connections POST them to `/v1/traces`.
//!
//! - accepted: every POST answered 200 with an empty `partialSuccess`; the rate is spans over the
//!   time until the last answer.
//! - end to end: as each body is accepted, a checker reads its last span back
//!   (`GET /v1/activity/spans/{id}`, retried until found, bounded); the rate is spans over the
//!   time until the last body's span was found.
//!
//! After the clock: a sample of spans is read back and its mapped `kind`/`origin` compared with
//! what the trace shape says, and the change-log growth is reported.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use flightlog_otlp::{ExportTraceServiceRequest, OtlpEncoding};
use http::Method;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use reqwest::{Client, Url};
use serde_json::{json, Map, Value};

use crate::client::{change_cursor, http_client, snippet, Connection};
use crate::server::ServerProcess;
use crate::stats::{Distribution, Errors, PhaseMeter, PhaseReport};
use crate::workload::mix;
use crate::writer_use;

/// Spans per trace: root, then chat, tool, chat, tool, … chat.
pub const SPANS_PER_TRACE: usize = 10;
const TOOLS: [&str; 4] = ["bash", "read_file", "edit_file", "grep"];

/// How the phase is shaped.
pub struct OtlpShape {
    /// Spans wanted; rounded up to whole bodies.
    pub spans: usize,
    pub spans_per_body: usize,
    pub connections: usize,
    /// Spans read back after the clock to check the mapping.
    pub verify_sample: usize,
    /// How long to wait, after the last POST was answered, for every body to be queryable.
    pub wait: Duration,
    /// Bodies sent gzip-compressed.
    pub gzip: bool,
    /// Bodies sent as OTLP/JSON instead of protobuf.
    pub json: bool,
}

impl OtlpShape {
    fn encoding(&self) -> OtlpEncoding {
        if self.json {
            OtlpEncoding::Json
        } else {
            OtlpEncoding::Protobuf
        }
    }
}

/// One encoded body and what is needed to check it.
pub struct Body {
    pub bytes: Bytes,
    pub spans: usize,
    /// Hex id of the last span of the body (read back to call the body queryable).
    pub last_span: String,
}

/// The kind flightlog's mapping gives the span at `position` of a trace (docs/otlp.md).
pub fn expected_kind(position: usize) -> &'static str {
    match position {
        0 => "turn",
        p if p % 2 == 1 => "model",
        _ => "tool",
    }
}

/// Hex id of global span number `n`: `mix` is a bijection and the tag keeps it away from 0.
pub fn span_id(n: u64) -> [u8; 8] {
    mix(0x5350_0000_0000_0000 | n).to_be_bytes()
}

/// Trace id of global trace number `n`: unique by its low half, never zero.
pub fn trace_id(n: u64) -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&mix(0x5452_0000_0000_0000 | n).to_be_bytes());
    id[8..].copy_from_slice(&(n + 1).to_be_bytes());
    id
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

fn text(key: &str, value: impl Into<String>) -> KeyValue {
    attr(key, any_value::Value::StringValue(value.into()))
}

fn int(key: &str, value: i64) -> KeyValue {
    attr(key, any_value::Value::IntValue(value))
}

/// The spans of global trace number `t`, its first span being global span number
/// `t * SPANS_PER_TRACE`, starting at `start_ns`.
fn trace_spans(t: u64, start_ns: u64) -> Vec<Span> {
    let trace = trace_id(t).to_vec();
    let first = t * SPANS_PER_TRACE as u64;
    let root = span_id(first).to_vec();
    let step_ns = 200_000_000u64; // each step 200 ms, lasting 180 ms
    let mut spans = Vec::with_capacity(SPANS_PER_TRACE);
    spans.push(Span {
        trace_id: trace.clone(),
        span_id: root.clone(),
        name: "invoke_agent coder".into(),
        kind: span::SpanKind::Internal as i32,
        start_time_unix_nano: start_ns,
        end_time_unix_nano: start_ns + step_ns * SPANS_PER_TRACE as u64,
        attributes: vec![
            text("gen_ai.operation.name", "invoke_agent"),
            text("gen_ai.agent.name", "coder"),
            text("gen_ai.agent.id", format!("agent-{}", t % 16)),
            text(
                "gen_ai.conversation.id",
                format!("conversation-{}", t % 500),
            ),
        ],
        status: Some(Status {
            code: 1,
            message: String::new(),
        }),
        ..Span::default()
    });
    for position in 1..SPANS_PER_TRACE {
        let n = first + position as u64;
        let begin = start_ns + step_ns * position as u64;
        let mut span = Span {
            trace_id: trace.clone(),
            span_id: span_id(n).to_vec(),
            parent_span_id: root.clone(),
            start_time_unix_nano: begin,
            end_time_unix_nano: begin + 180_000_000,
            ..Span::default()
        };
        if position % 2 == 1 {
            span.name = "chat claude-sonnet-4".into();
            span.kind = span::SpanKind::Client as i32;
            span.attributes = vec![
                text("gen_ai.operation.name", "chat"),
                text("gen_ai.provider.name", "anthropic"),
                text("gen_ai.request.model", "claude-sonnet-4-20250514"),
                text("gen_ai.response.model", "claude-sonnet-4-20250514"),
                text("gen_ai.response.id", format!("msg_{:016x}", mix(n))),
                int("gen_ai.request.max_tokens", 8192),
                int("gen_ai.usage.input_tokens", 1_200 + (n % 900) as i64),
                int("gen_ai.usage.output_tokens", 150 + (n % 300) as i64),
                int("gen_ai.usage.cache_read.input_tokens", 900),
                attr(
                    "gen_ai.response.finish_reasons",
                    any_value::Value::ArrayValue(ArrayValue {
                        values: vec![AnyValue {
                            value: Some(any_value::Value::StringValue(
                                if position == SPANS_PER_TRACE - 1 {
                                    "end_turn"
                                } else {
                                    "tool_use"
                                }
                                .into(),
                            )),
                        }],
                    }),
                ),
            ];
            if position == SPANS_PER_TRACE - 1 {
                span.events.push(span::Event {
                    time_unix_nano: begin + 170_000_000,
                    name: "gen_ai.choice".into(),
                    attributes: vec![
                        int("index", 0),
                        text("finish_reason", "end_turn"),
                        text(
                            "message",
                            format!(
                                "The planner tests pass again for trace {t}: the off-by-one in \
                                 step ordering is fixed and the new case covers it."
                            ),
                        ),
                    ],
                    ..span::Event::default()
                });
            }
        } else {
            let tool = TOOLS[(position / 2 - 1) % TOOLS.len()];
            span.name = format!("execute_tool {tool}");
            span.kind = span::SpanKind::Internal as i32;
            span.attributes = vec![
                text("gen_ai.operation.name", "execute_tool"),
                text("gen_ai.tool.name", tool),
                text("gen_ai.tool.type", "function"),
                text(
                    "gen_ai.tool.call.id",
                    format!("toolu_{:016x}", mix(n ^ 0xABCD)),
                ),
            ];
            let failed = (t + position as u64).is_multiple_of(23);
            span.status = Some(Status {
                code: if failed { 2 } else { 1 },
                message: if failed {
                    "exit status 101".into()
                } else {
                    String::new()
                },
            });
            span.events.push(span::Event {
                time_unix_nano: begin + 150_000_000,
                name: "tool.output".into(),
                attributes: vec![
                    int("exit_code", if failed { 101 } else { 0 }),
                    text(
                        "output",
                        format!(
                            "test planner::tests::case_{t} ... {}\ntest result: {}. 41 passed; \
                             {} failed; finished in 0.{:02}s",
                            if failed { "FAILED" } else { "ok" },
                            if failed { "FAILED" } else { "ok" },
                            u8::from(failed),
                            t % 100
                        ),
                    ),
                ],
                ..span::Event::default()
            });
        }
        spans.push(span);
    }
    spans
}

/// Body number `b` of `spans_per_body` spans (a multiple of [`SPANS_PER_TRACE`]), in
/// `encoding`: protobuf, or OTLP/JSON as opentelemetry-proto's serde writes it (hex ids, 64-bit
/// integers as strings, enums as numbers: the JavaScript SDK's JSON exporter's form).
pub fn encode_body(
    b: usize,
    spans_per_body: usize,
    base_ns: u64,
    encoding: OtlpEncoding,
) -> anyhow::Result<Body> {
    let traces = spans_per_body / SPANS_PER_TRACE;
    let mut spans = Vec::with_capacity(spans_per_body);
    for i in 0..traces {
        let t = (b * traces + i) as u64;
        spans.extend(trace_spans(t, base_ns + t * 1_000_000));
    }
    let last_span = spans.last().map(|s| hex(&s.span_id)).unwrap_or_default();
    let count = spans.len();
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", "coder-agent"),
                    text("service.version", "1.4.2"),
                    text("deployment.environment.name", "loadgen"),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "flightlog-loadgen.agents".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    let bytes = match encoding {
        OtlpEncoding::Protobuf => request.encode_to_vec(),
        OtlpEncoding::Json => {
            serde_json::to_vec(&request).context("cannot write an OTLP/JSON body")?
        }
    };
    Ok(Body {
        bytes: Bytes::from(bytes),
        spans: count,
        last_span,
    })
}

/// `body` gzip-compressed at the default level (what the OpenTelemetry Collector's exporters
/// send by default).
fn gzip_body(body: Body) -> anyhow::Result<Body> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.bytes.len() / 4),
        flate2::Compression::default(),
    );
    encoder.write_all(&body.bytes)?;
    Ok(Body {
        bytes: Bytes::from(encoder.finish()?),
        ..body
    })
}

/// A body's answer: 200 and an `ExportTraceServiceResponse` (in the request's `encoding`)
/// without `partialSuccess` (or with zero rejected spans and no message).
fn check_export_answer(status: u16, body: &[u8], encoding: OtlpEncoding) -> Result<(), String> {
    if status != 200 {
        return Err(format!(
            "POST /v1/traces: status {status}: {}",
            snippet(body)
        ));
    }
    let response: flightlog_otlp::ExportTraceServiceResponse = match encoding {
        OtlpEncoding::Protobuf => flightlog_otlp::ExportTraceServiceResponse::decode(body)
            .map_err(|err| format!("POST /v1/traces: the answer is not protobuf: {err}"))?,
        OtlpEncoding::Json => serde_json::from_slice(body)
            .map_err(|err| format!("POST /v1/traces: the answer is not OTLP/JSON: {err}"))?,
    };
    match response.partial_success {
        Some(partial) if partial.rejected_spans != 0 || !partial.error_message.is_empty() => {
            Err(format!(
                "POST /v1/traces: {} span(s) rejected: {}",
                partial.rejected_spans, partial.error_message
            ))
        }
        _ => Ok(()),
    }
}

/// `GET /v1/activity/spans/{id}`: the span's JSON, or `None` on 404.
async fn read_span(client: &Client, base: &Url, id: &str) -> Result<Option<Value>, String> {
    let url = base
        .join(&format!("/v1/activity/spans/{id}"))
        .map_err(|err| err.to_string())?;
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|err| format!("GET span {id}: {err}"))?;
    let status = response.status().as_u16();
    let body = response
        .bytes()
        .await
        .map_err(|err| format!("GET span {id}: {err}"))?;
    match status {
        200 => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|err| format!("GET span {id}: not JSON: {err}")),
        404 => Ok(None),
        other => Err(format!("GET span {id}: status {other}: {}", snippet(&body))),
    }
}

/// The OTLP phase.
pub async fn otlp_phase(
    server: &ServerProcess,
    base: &Url,
    shape: &OtlpShape,
    time_limit: Duration,
) -> anyhow::Result<PhaseReport> {
    if shape.spans_per_body == 0 || !shape.spans_per_body.is_multiple_of(SPANS_PER_TRACE) {
        bail!("--spans-per-body must be a positive multiple of {SPANS_PER_TRACE} (whole traces)");
    }
    let bodies_wanted = shape.spans.div_ceil(shape.spans_per_body).max(1);
    let base_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1_700_000_000_000_000_000)
        .saturating_sub(3_600_000_000_000);
    let encoded_at = Instant::now();
    let bodies: Vec<Body> = (0..bodies_wanted)
        .map(|b| {
            let body = encode_body(b, shape.spans_per_body, base_ns, shape.encoding())?;
            if shape.gzip {
                gzip_body(body)
            } else {
                Ok(body)
            }
        })
        .collect::<anyhow::Result<_>>()?;
    let encode_seconds = encoded_at.elapsed().as_secs_f64();
    let total_spans: usize = bodies.iter().map(|b| b.spans).sum();
    let total_bytes: usize = bodies.iter().map(|b| b.bytes.len()).sum();
    let bodies = Arc::new(bodies);
    let traces_uri = crate::workload::uri("/v1/traces")?;
    let probe = http_client()?;
    let cursor_before = change_cursor(&probe, base).await?;
    let writer_before = writer_use::sample(&probe, base).await;

    let meter = PhaseMeter::start(server);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + time_limit;
    // Accepted bodies go to the checkers as they are answered.
    let (accepted_tx, accepted_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    let accepted_rx = Arc::new(tokio::sync::Mutex::new(accepted_rx));
    let last_accepted = Arc::new(Mutex::new(started));

    let content_encoding = shape.gzip.then_some("gzip");
    let encoding = shape.encoding();
    let mut posters = Vec::with_capacity(shape.connections);
    for _ in 0..shape.connections {
        let mut connection = Connection::new(server.addr())?;
        let bodies = Arc::clone(&bodies);
        let next = Arc::clone(&next);
        let traces_uri = traces_uri.clone();
        let accepted_tx = accepted_tx.clone();
        let last_accepted = Arc::clone(&last_accepted);
        posters.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = Errors::default();
            let mut accepted_spans = 0usize;
            let mut abandoned = false;
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(index) else { break };
                if Instant::now() > deadline {
                    abandoned = true;
                    break;
                }
                let sent = Instant::now();
                let answer = connection
                    .request_encoded(
                        &Method::POST,
                        &traces_uri,
                        encoding.content_type(),
                        content_encoding,
                        &body.bytes,
                    )
                    .await;
                match answer
                    .and_then(|(status, bytes)| check_export_answer(status, &bytes, encoding))
                {
                    Ok(()) => {
                        let now = Instant::now();
                        latencies.push(now.duration_since(sent).as_secs_f64() * 1e3);
                        accepted_spans += body.spans;
                        if let Ok(mut last) = last_accepted.lock() {
                            *last = (*last).max(now);
                        }
                        let _ = accepted_tx.send(index);
                    }
                    Err(message) => errors.record(|| message),
                }
            }
            (latencies, errors, accepted_spans, abandoned)
        }));
    }
    drop(accepted_tx);

    // Two checkers, so one slow read does not hold up the others.
    let posters_done_at = Arc::new(Mutex::new(None::<Instant>));
    let mut checkers = Vec::new();
    for _ in 0..2 {
        let client = http_client()?;
        let base = base.clone();
        let bodies = Arc::clone(&bodies);
        let accepted_rx = Arc::clone(&accepted_rx);
        let posters_done_at = Arc::clone(&posters_done_at);
        let wait = shape.wait;
        checkers.push(tokio::spawn(async move {
            let mut last_found = None::<Instant>;
            let mut found = 0usize;
            let mut retries = 0u64;
            let mut errors = Errors::default();
            loop {
                let index = { accepted_rx.lock().await.recv().await };
                let Some(index) = index else { break };
                let id = &bodies[index].last_span;
                loop {
                    match read_span(&client, &base, id).await {
                        Ok(Some(_)) => {
                            found += 1;
                            last_found = Some(Instant::now());
                            break;
                        }
                        Ok(None) => {
                            let gave_up = posters_done_at
                                .lock()
                                .ok()
                                .and_then(|at| *at)
                                .is_some_and(|at| at.elapsed() > wait);
                            if gave_up {
                                errors.record(|| format!("span {id} never became queryable"));
                                break;
                            }
                            retries += 1;
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        Err(message) => {
                            errors.record(|| message);
                            break;
                        }
                    }
                }
            }
            (last_found, found, retries, errors)
        }));
    }

    let mut latencies = Vec::new();
    let mut errors = Errors::default();
    let mut accepted_spans = 0usize;
    let mut abandoned = false;
    for poster in posters {
        let (l, e, a, ab) = poster.await.context("an OTLP poster task failed")?;
        latencies.extend(l);
        errors.merge(e);
        accepted_spans += a;
        abandoned |= ab;
    }
    if let Ok(mut at) = posters_done_at.lock() {
        *at = Some(Instant::now());
    }
    let accepted_seconds = last_accepted
        .lock()
        .map(|at| at.duration_since(started).as_secs_f64())
        .map_err(|_| anyhow!("a poster panicked"))?;

    let mut found = 0usize;
    let mut retries = 0u64;
    let mut last_found = started;
    for checker in checkers {
        let (at, f, r, e) = checker.await.context("an OTLP checker task failed")?;
        found += f;
        retries += r;
        errors.merge(e);
        if let Some(at) = at {
            last_found = last_found.max(at);
        }
    }
    let end_to_end_seconds = last_found.duration_since(started).as_secs_f64();
    let (rss_peak, server_cpu, loadgen_cpu) = meter.finish(server);
    let cursor_after = change_cursor(&probe, base).await?;
    let writer = writer_use::between(
        writer_before,
        writer_use::sample(&probe, base).await,
        end_to_end_seconds,
    );

    // After the clock: a sample of spans read back, with their mapped kind and origin.
    let mut sample_mismatches = 0u64;
    let mut sample_missing = 0u64;
    let mut first_mismatch = None;
    let sample = shape.verify_sample.min(total_spans);
    for k in 0..sample {
        let n = (mix(k as u64 ^ 0x5A5A) % total_spans as u64) as usize;
        let id = hex(&span_id(n as u64));
        match read_span(&probe, base, &id).await {
            Ok(Some(span)) => {
                let want = expected_kind(n % SPANS_PER_TRACE);
                if span["kind"] != want || span["origin"] != "otlp" || span["spanId"] != id {
                    sample_mismatches += 1;
                    first_mismatch.get_or_insert_with(|| {
                        format!("span {id}: expected kind {want}, origin otlp; got {span}")
                    });
                }
            }
            Ok(None) => sample_missing += 1,
            Err(message) => errors.record(|| message),
        }
    }

    let bodies_count = bodies.len();
    let all_found = found == bodies_count;
    let accepted_rate = accepted_spans as f64 / accepted_seconds.max(1e-9);
    let end_to_end_rate = if all_found {
        total_spans as f64 / end_to_end_seconds.max(1e-9)
    } else {
        0.0
    };
    let mut violations = sample_mismatches + sample_missing;
    if !all_found {
        violations += 1;
    }
    if abandoned {
        violations += 1;
    }
    let mut notes = vec![
        format!(
            "{bodies_count} bodies x {} spans = {total_spans} spans ({} traces of \
             {SPANS_PER_TRACE}), {:.0} KiB per body on average{}, encoded in {encode_seconds:.2} s \
             before the clock; {} connections",
            shape.spans_per_body,
            total_spans / SPANS_PER_TRACE,
            total_bytes as f64 / bodies_count as f64 / 1024.0,
            match (shape.json, shape.gzip) {
                (true, true) => " OTLP/JSON gzipped",
                (true, false) => " OTLP/JSON",
                (false, true) => " gzipped",
                (false, false) => "",
            },
            shape.connections
        ),
        format!(
            "accepted: {accepted_spans} spans in {accepted_seconds:.3} s = {accepted_rate:.0} \
             spans/s (last POST answered)"
        ),
        format!(
            "end to end: {found} of {bodies_count} bodies' last spans queryable after \
             {end_to_end_seconds:.3} s = {end_to_end_rate:.0} spans/s ({retries} re-reads while \
             not yet found)"
        ),
        format!(
            "read-back sample: {sample} spans, {sample_missing} missing, {sample_mismatches} \
             with the wrong kind/origin; change log grew by {}",
            cursor_after - cursor_before
        ),
    ];
    if let Some(first) = first_mismatch {
        notes.push(format!("first mismatch: {first}"));
    }
    if abandoned {
        notes.push(format!(
            "TIME LIMIT ({time_limit:?}) reached: bodies were left unsent"
        ));
    }
    let mut extra = Map::new();
    if let Some(writer) = writer {
        writer.report(&mut notes, &mut extra);
    }
    extra.insert("spans".into(), json!(total_spans));
    extra.insert("bodies".into(), json!(bodies_count));
    extra.insert("spansPerBody".into(), json!(shape.spans_per_body));
    extra.insert("connections".into(), json!(shape.connections));
    extra.insert("bodyBytesAvg".into(), json!(total_bytes / bodies_count));
    extra.insert(
        "acceptedSpansPerSecond".into(),
        json!(accepted_rate.round()),
    );
    extra.insert("acceptedSeconds".into(), json!(accepted_seconds));
    extra.insert(
        "endToEndSpansPerSecond".into(),
        json!(end_to_end_rate.round()),
    );
    extra.insert("endToEndSeconds".into(), json!(end_to_end_seconds));
    extra.insert("bodiesQueryable".into(), json!(found));
    extra.insert("reReads".into(), json!(retries));
    extra.insert("sampleChecked".into(), json!(sample));
    extra.insert("sampleMissing".into(), json!(sample_missing));
    extra.insert("sampleMismatches".into(), json!(sample_mismatches));
    extra.insert(
        "changeLogGrowth".into(),
        json!(cursor_after - cursor_before),
    );
    Ok(PhaseReport {
        name: "otlp".into(),
        unit: "spans/s",
        throughput: end_to_end_rate,
        requests: bodies_count as u64,
        seconds: end_to_end_seconds,
        latency: Some(Distribution::of(latencies)),
        errors,
        violations,
        rss_peak,
        server_cpu,
        loadgen_cpu,
        notes,
        extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flightlog_otlp::{decode_request, map_request, MappingOptions};
    use std::collections::HashSet;

    #[test]
    fn a_body_maps_to_500_agent_shaped_spans_without_rejections() {
        for encoding in [OtlpEncoding::Protobuf, OtlpEncoding::Json] {
            let body = encode_body(3, 500, 1_700_000_000_000_000_000, encoding).expect("encodes");
            assert_eq!(body.spans, 500);
            let (request, decoded_as) = decode_request(
                Some(encoding.content_type()),
                None,
                &body.bytes,
                64 * 1024 * 1024,
            )
            .expect("decodes");
            assert_eq!(decoded_as, encoding);
            check_mapped_body(&body, request);
        }
    }

    fn check_mapped_body(body: &Body, request: ExportTraceServiceRequest) {
        let mapped = map_request(request, &MappingOptions::default());
        assert!(mapped.rejected.is_empty(), "{:?}", mapped.rejected);
        assert_eq!(mapped.spans.len(), 500);
        let spans = serde_json::to_value(&mapped.spans).expect("json");
        let spans = spans.as_array().expect("an array");
        let mut events = 0;
        for (i, span) in spans.iter().enumerate() {
            assert_eq!(span["kind"], expected_kind(i % SPANS_PER_TRACE), "span {i}");
            assert_eq!(span["origin"], "otlp");
            if expected_kind(i % SPANS_PER_TRACE) == "model" {
                assert!(span["usage"]["inputTokens"].as_i64().is_some(), "{span}");
                assert_eq!(span["usage"]["model"], "claude-sonnet-4-20250514");
            }
            events += span["events"].as_array().map_or(0, Vec::len);
        }
        assert_eq!(events, 50 * 5, "5 events per trace");
        assert_eq!(body.last_span, hex(&span_id(4 * 500 - 1)));
    }

    #[test]
    fn ids_are_unique_across_bodies() {
        let mut spans = HashSet::new();
        let mut traces = HashSet::new();
        for n in 0..200_000u64 {
            assert!(spans.insert(span_id(n)));
            assert_ne!(span_id(n), [0; 8]);
        }
        for t in 0..20_000u64 {
            assert!(traces.insert(trace_id(t)));
        }
    }

    #[test]
    fn kinds_follow_the_trace_shape() {
        let kinds: Vec<&str> = (0..SPANS_PER_TRACE).map(expected_kind).collect();
        assert_eq!(
            kinds,
            ["turn", "model", "tool", "model", "tool", "model", "tool", "model", "tool", "model"]
        );
    }

    #[test]
    fn a_partial_success_is_an_error() {
        let protobuf = OtlpEncoding::Protobuf;
        let ok = flightlog_otlp::ExportTraceServiceResponse::default().encode_to_vec();
        assert_eq!(check_export_answer(200, &ok, protobuf), Ok(()));
        let partial = flightlog_otlp::ExportTraceServiceResponse {
            partial_success: Some(flightlog_otlp::ExportTracePartialSuccess {
                rejected_spans: 2,
                error_message: "bad ids".into(),
            }),
        }
        .encode_to_vec();
        assert!(check_export_answer(200, &partial, protobuf).is_err());
        assert!(check_export_answer(503, b"", protobuf).is_err());
        assert!(
            check_export_answer(200, b"{}", protobuf).is_err(),
            "JSON is no protobuf"
        );

        let json = OtlpEncoding::Json;
        assert_eq!(check_export_answer(200, b"{}", json), Ok(()));
        let partial = br#"{"partialSuccess":{"rejectedSpans":"2","errorMessage":"bad ids"}}"#;
        assert!(check_export_answer(200, partial, json).is_err());
        assert!(check_export_answer(200, b"not json", json).is_err());
    }
}
