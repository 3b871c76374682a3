//! `GET /metrics` on a real server: the exposition parses as the Prometheus text format, the
//! request counters move with the right labels, refused writes and live streams are counted, and
//! the values read at scrape time (change cursor, process memory and start) are there.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use flightlog_server::ServerConfig;
use reqwest::Method;
use serde_json::json;

use crate::support::{Options, TestServer};

/// One parsed exposition: each sample line keyed by `name{labels}` exactly as written, and the
/// declared type of each family.
#[derive(Debug, Default)]
pub(crate) struct Exposition {
    samples: BTreeMap<String, f64>,
    types: BTreeMap<String, String>,
}

impl Exposition {
    /// The sample `series` (`name{labels}` as written), if present.
    pub(crate) fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }
}

/// Parse the text format, failing on any line that is not a `# HELP`/`# TYPE` comment or a
/// `name{labels} value` sample, and on a sample whose family had no `# TYPE` before it.
pub(crate) fn parse(text: &str) -> Exposition {
    let mut exposition = Exposition::default();
    let mut helped = BTreeSet::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("# HELP name text");
            assert!(is_metric_name(name), "{line}");
            assert!(!help.is_empty(), "{line}");
            assert!(helped.insert(name.to_owned()), "HELP twice: {line}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name type");
            assert!(is_metric_name(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            let previous = exposition.types.insert(name.to_owned(), kind.to_owned());
            assert!(previous.is_none(), "TYPE twice: {line}");
            continue;
        }
        assert!(!line.starts_with('#'), "an unexpected comment: {line}");
        let (series, value) = line.rsplit_once(' ').expect("name{labels} value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            other => other.parse().unwrap_or_else(|_| panic!("a number: {line}")),
        };
        let name = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').expect("labels end with }");
                for pair in split_labels(labels) {
                    let (key, quoted) = pair.split_once('=').expect("label=\"value\"");
                    assert!(is_label_name(key), "{line}");
                    assert!(
                        quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'),
                        "{line}"
                    );
                }
                name
            }
            None => series,
        };
        assert!(is_metric_name(name), "{line}");
        let family = family_of(name, &exposition.types);
        assert!(family.is_some(), "no # TYPE before {line}");
        let previous = exposition.samples.insert(series.to_owned(), value);
        assert!(previous.is_none(), "the same series twice: {line}");
    }
    exposition
}

/// The declared family a sample belongs to: its own name, or a histogram's name for its
/// `_bucket`/`_sum`/`_count` lines.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        (types.get(base).map(String::as_str) == Some("histogram")).then_some(base)
    })
}

/// Split `a="x",b="y,z"` at the commas outside quotes.
fn split_labels(labels: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (index, byte) in labels.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                parts.push(&labels[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    assert!(!quoted, "unterminated label value: {labels}");
    if start < labels.len() {
        parts.push(&labels[start..]);
    }
    parts
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Scrape `/metrics`, checking the status and content type.
pub(crate) async fn scrape(server: &TestServer) -> Exposition {
    let response = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    parse(&response.text().await.expect("text"))
}

fn requests(route: &str, method: &str, status: u16) -> String {
    format!(
        "flightlog_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}}"
    )
}

#[tokio::test]
async fn requests_are_counted_by_route_template_method_and_status() {
    let server = TestServer::start().await;
    let start = json!({"spanId": "s1", "runId": "r1", "name": "n", "kind": "turn",
                       "origin": "session", "startedAt": 1});
    server
        .post("/v1/activity/spans", &start)
        .await
        .assert_status(201);
    server
        .post("/v1/activity/spans", &start)
        .await
        .assert_error(409, "conflict");
    server.get("/v1/activity/spans/s1").await.assert_status(200);
    server
        .get("/v1/activity/spans/unknown")
        .await
        .assert_error(404, "not_found");
    server
        .get("/v1/no/such/route")
        .await
        .assert_error(404, "not_found");
    let cursor = server.get("/v1/activity/cursor").await.assert_status(200)["changeCursor"]
        .as_f64()
        .expect("a cursor");

    let before = scrape(&server).await;
    let expected = [
        (requests("/v1/activity/spans", "POST", 201), 1.0),
        (requests("/v1/activity/spans", "POST", 409), 1.0),
        // Both span reads count under the template, never under the raw path.
        (requests("/v1/activity/spans/{spanId}", "GET", 200), 1.0),
        (requests("/v1/activity/spans/{spanId}", "GET", 404), 1.0),
        (requests("unmatched", "GET", 404), 1.0),
        (requests("/v1/activity/cursor", "GET", 200), 1.0),
    ];
    for (series, value) in &expected {
        assert_eq!(before.get(series), Some(*value), "{series}");
    }
    assert_eq!(
        before
            .types
            .get("flightlog_http_requests_total")
            .map(String::as_str),
        Some("counter")
    );
    assert!(!before
        .samples
        .keys()
        .any(|series| series.contains("unknown")));
    let duration = "flightlog_http_request_duration_seconds_count{route=\"/v1/activity/spans/{spanId}\",method=\"GET\"}";
    assert_eq!(before.get(duration), Some(2.0));
    assert_eq!(
        before
            .types
            .get("flightlog_http_request_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert_eq!(before.get("flightlog_activity_change_cursor"), Some(cursor));
    assert!(cursor >= 1.0);
    assert!(before
        .get("process_start_time_seconds")
        .is_some_and(|t| t > 1.6e9));
    assert_eq!(
        before.get(&format!(
            r#"flightlog_build_info{{version="{}"}}"#,
            env!("CARGO_PKG_VERSION")
        )),
        Some(1.0)
    );
    if cfg!(target_os = "linux") {
        assert!(before
            .get("process_resident_memory_bytes")
            .is_some_and(|b| b > 0.0));
    }
    assert_eq!(before.get("flightlog_http_writes_in_flight"), Some(0.0));
    assert_eq!(
        before.get("flightlog_http_write_limit"),
        Some(ServerConfig::DEFAULT_MAX_INFLIGHT_WRITES as f64)
    );
    assert_eq!(before.get("flightlog_http_writes_refused_total"), Some(0.0));

    // The counters move: one more read, and the first scrape itself.
    server.get("/v1/activity/cursor").await.assert_status(200);
    let after = scrape(&server).await;
    assert_eq!(
        after.get(&requests("/v1/activity/cursor", "GET", 200)),
        Some(2.0)
    );
    assert_eq!(after.get(&requests("/metrics", "GET", 200)), Some(1.0));
    assert_eq!(
        after.get(&requests("/v1/activity/spans", "POST", 201)),
        Some(1.0)
    );
    server.stop().await;
}

#[tokio::test]
async fn refused_writes_are_counted() {
    let server = TestServer::start_refusing_writes().await;
    for _ in 0..2 {
        server
            .send(
                Method::POST,
                "/v1/activity/maintenance/sweep-orphans",
                None,
                None,
            )
            .await
            .assert_error(503, "unavailable");
    }
    let exposition = scrape(&server).await;
    assert_eq!(
        exposition.get("flightlog_http_writes_refused_total"),
        Some(2.0)
    );
    assert_eq!(exposition.get("flightlog_http_write_limit"), Some(0.0));
    assert_eq!(
        exposition.get(&requests(
            "/v1/activity/maintenance/sweep-orphans",
            "POST",
            503
        )),
        Some(2.0)
    );
    server.stop().await;
}

#[tokio::test]
async fn live_stream_clients_are_counted_while_connected() {
    let server = TestServer::start().await;
    let changes = "flightlog_stream_clients{stream=\"changes\"}";
    let journal = "flightlog_stream_clients{stream=\"journal\"}";
    let idle = scrape(&server).await;
    assert_eq!(idle.get(changes), Some(0.0));
    assert_eq!(idle.get(journal), Some(0.0));
    assert_eq!(
        idle.types
            .get("flightlog_stream_clients")
            .map(String::as_str),
        Some("gauge")
    );

    let stream = server
        .client
        .get(format!(
            "{}/v1/activity/changes/stream?after=0",
            server.base
        ))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status().as_u16(), 200);
    let open = scrape(&server).await;
    assert_eq!(open.get(changes), Some(1.0));
    assert_eq!(open.get(journal), Some(0.0));

    // A client that goes away is no longer counted.
    drop(stream);
    let mut now = scrape(&server).await.get(changes);
    for _ in 0..50 {
        if now == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = scrape(&server).await.get(changes);
    }
    assert_eq!(now, Some(0.0), "the stream's client went away");
    server.stop().await;
}

#[tokio::test]
async fn the_sqlite_writer_its_queue_and_its_files_are_exported() {
    let server = TestServer::start().await;
    for n in 0..3 {
        let start = json!({"spanId": format!("w{n}"), "runId": "r1", "name": "n",
                           "kind": "turn", "origin": "session"});
        server
            .post("/v1/activity/spans", &start)
            .await
            .assert_status(201);
    }
    let batch = json!({"ops": [
        {"op": "heartbeat", "spanId": "w0"},
        {"op": "endSpan", "spanId": "w1", "outcome": "success"},
    ]});
    server
        .post("/v1/activity/batch", &batch)
        .await
        .assert_status(200);

    let before = scrape(&server).await;
    let value = |exposition: &Exposition, series: &str| {
        exposition
            .get(series)
            .unwrap_or_else(|| panic!("{series} is not exported"))
    };
    let writes = value(&before, "flightlog_sqlite_writer_writes_total");
    let transactions = value(&before, "flightlog_sqlite_writer_transactions_total");
    // Three single writes and one batch job at least (the boot sweep may add its own).
    assert!(writes >= 4.0, "{writes}");
    assert!(
        transactions >= 1.0 && transactions <= writes,
        "{transactions} transactions for {writes} writes"
    );
    assert!(value(&before, "flightlog_sqlite_writer_apply_seconds_total") > 0.0);
    assert!(value(&before, "flightlog_sqlite_writer_commit_seconds_total") > 0.0);
    assert!(value(&before, "flightlog_sqlite_wal_frames_total") >= 1.0);
    assert!(value(&before, "flightlog_sqlite_wal_rewinds_total") >= 0.0);
    assert!(value(&before, "flightlog_sqlite_checkpoint_seconds_total") >= 0.0);
    assert_eq!(value(&before, "flightlog_sqlite_write_queue_depth"), 0.0);
    assert!(value(&before, "flightlog_sqlite_write_queue_capacity") >= 1.0);
    assert!(value(&before, "flightlog_sqlite_database_bytes") > 0.0);
    assert!(value(&before, "flightlog_sqlite_wal_bytes") > 0.0);
    for (family, kind) in [
        ("flightlog_sqlite_writer_writes_total", "counter"),
        ("flightlog_sqlite_writer_commit_seconds_total", "counter"),
        ("flightlog_sqlite_write_queue_depth", "gauge"),
        ("flightlog_sqlite_database_bytes", "gauge"),
    ] {
        assert_eq!(
            before.types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }

    // One more write moves the writer's counters.
    let start = json!({"spanId": "w9", "runId": "r1", "name": "n", "kind": "turn",
                       "origin": "session"});
    server
        .post("/v1/activity/spans", &start)
        .await
        .assert_status(201);
    let after = scrape(&server).await;
    assert!(value(&after, "flightlog_sqlite_writer_writes_total") >= writes + 1.0);
    assert!(value(&after, "flightlog_sqlite_writer_transactions_total") >= transactions + 1.0);
    // Counts are written as integers, as the server's own are (they were `3.0`, an audit
    // found); durations stay floats.
    let text = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("the exposition");
    let sample_text = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} is not exported"))
            .to_owned()
    };
    for count in [
        "flightlog_sqlite_writer_transactions_total",
        "flightlog_sqlite_writer_writes_total",
        "flightlog_sqlite_database_bytes",
    ] {
        let written = sample_text(count);
        assert!(
            written.bytes().all(|byte| byte.is_ascii_digit()),
            "{count} {written}"
        );
    }
    assert!(sample_text("flightlog_sqlite_writer_commit_seconds_total").contains('.'));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_spans_are_counted_by_what_became_of_them_over_http_and_grpc() {
    use crate::otlp::{export, hex, model_span, request, root_span, TRACE_HEX};
    use crate::otlp_fuzz::{grpc_channel, grpc_export};
    use opentelemetry_proto::tonic::trace::v1::span;
    use prost::Message;

    let server = TestServer::start_with(Options {
        grpc: true,
        ..Options::default()
    })
    .await;
    let spans_series = |result: &str| format!("flightlog_otlp_spans_total{{result=\"{result}\"}}");
    let idle = scrape(&server).await;
    for result in ["created", "completed", "refreshed", "unchanged", "rejected"] {
        assert_eq!(idle.get(&spans_series(result)), Some(0.0), "{result}");
    }
    assert_eq!(idle.get("flightlog_otlp_span_events_total"), Some(0.0));

    // A root and a model call with one event, then the same delivery again (an exporter retry).
    let mut model = model_span(2, 1, 1_010, 100);
    model.events = vec![span::Event {
        time_unix_nano: 1_020_000_000,
        name: "gen_ai.content.prompt".into(),
        ..span::Event::default()
    }];
    export(&server, vec![root_span(), model.clone()]).await;
    export(&server, vec![root_span(), model]).await;
    // OTLP/JSON with one good span and one whose id is malformed.
    let body = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": TRACE_HEX, "spanId": hex(3), "name": "ok",
         "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1100000000"},
        {"traceId": TRACE_HEX, "spanId": "00", "name": "bad id",
         "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1100000000"}
    ]}]}]});
    let answer = server
        .client
        .post(format!("{}/v1/traces", server.base))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the server answers");
    assert_eq!(answer.status().as_u16(), 200);
    // And one span over gRPC.
    let channel = grpc_channel(&server).await;
    let grpc_body = request(vec![model_span(4, 1, 1_030, 5)]).encode_to_vec();
    let exported = grpc_export(&channel, grpc_body, false)
        .await
        .expect("in time");
    assert!(exported.is_ok(), "{exported:?}");

    let counted = scrape(&server).await;
    assert_eq!(counted.get(&spans_series("created")), Some(4.0));
    assert_eq!(counted.get(&spans_series("unchanged")), Some(2.0));
    assert_eq!(counted.get(&spans_series("rejected")), Some(1.0));
    assert_eq!(counted.get(&spans_series("completed")), Some(0.0));
    assert_eq!(counted.get(&spans_series("refreshed")), Some(0.0));
    assert_eq!(counted.get("flightlog_otlp_span_events_total"), Some(1.0));

    // An open span (no end), delivered twice, then ended: created, refreshed, completed.
    let mut open = model_span(5, 1, 1_040, 7);
    open.end_time_unix_nano = 0;
    export(&server, vec![open.clone()]).await;
    export(&server, vec![open]).await;
    export(&server, vec![model_span(5, 1, 1_040, 7)]).await;
    let counted = scrape(&server).await;
    assert_eq!(counted.get(&spans_series("created")), Some(5.0));
    assert_eq!(counted.get(&spans_series("refreshed")), Some(1.0));
    assert_eq!(counted.get(&spans_series("completed")), Some(1.0));
    server.stop().await;
}

/// A prune that deletes the newest changes with their runs took the cursor gauge down to 0 (an
/// audit's soak: a gauge that drops sets off alerts), though every id up to the horizon was
/// given out. The gauge says the highest id given out; `GET /v1/activity/cursor` keeps the
/// reference's highest id still in the log.
#[tokio::test]
async fn the_cursor_gauge_does_not_go_back_when_a_prune_takes_the_newest_changes() {
    let server = TestServer::start().await;
    let start = json!({"spanId": "s", "runId": "r", "name": "turn", "kind": "turn",
        "origin": "session", "startedAt": 1_000});
    server
        .post("/v1/activity/spans", &start)
        .await
        .assert_status(201);
    server
        .post(
            "/v1/activity/spans/s/end",
            &json!({"outcome": "success", "endedAt": 1_001}),
        )
        .await
        .assert_status(200);
    server
        .post_empty("/v1/activity/runs/r/rollup")
        .await
        .assert_status(204);
    let cursor = server.get("/v1/activity/cursor").await;
    let given_out = cursor.assert_status(200)["changeCursor"]
        .as_f64()
        .expect("a cursor");
    assert!(given_out >= 2.0);
    let prune =
        json!({"digestFloorAt": 1_i64 << 50, "hardCeilingMs": 1_i64 << 50, "now": 1_i64 << 50});
    let pruned = server.post("/v1/activity/maintenance/prune", &prune).await;
    assert_eq!(pruned.assert_status(200)["runsPruned"], 1);
    let cursor = server.get("/v1/activity/cursor").await;
    assert_eq!(cursor.assert_status(200)["changeCursor"], 0);
    // … and says where the log starts: every id below the horizon was given out.
    let horizon = cursor
        .headers
        .get("flightlog-change-log-horizon")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<f64>().ok());
    assert_eq!(horizon, Some(given_out + 1.0));
    let exposition = scrape(&server).await;
    assert_eq!(
        exposition.get("flightlog_activity_change_cursor"),
        Some(given_out)
    );
    server.stop().await;
}

/// Error answers are counted by the contract's code: the two 409s of a journal append, a full
/// journal (retention needs a look) and an `expectedSeq` conflict (concurrency as designed),
/// share a status but not a cause (the metrics audit could not tell them apart).
#[tokio::test]
async fn error_answers_are_counted_by_their_code() {
    let server = TestServer::start_with(Options {
        retention: flightlog_core::journal::RetentionConfig {
            max_events_per_engagement: 1,
            ..flightlog_core::journal::RetentionConfig::default()
        },
        ..Options::default()
    })
    .await;
    let note = json!({"type": "note", "at": 1, "data": {}});
    server
        .post("/v1/engagements/full/events", &note)
        .await
        .assert_status(201);
    server
        .post("/v1/engagements/full/events", &note)
        .await
        .assert_error(409, "journal_full");
    let guarded = json!({"type": "note", "at": 1, "data": {}, "expectedSeq": 5});
    server
        .post("/v1/engagements/other/events", &guarded)
        .await
        .assert_error(409, "conflict");
    server
        .get("/v1/activity/spans/nobody")
        .await
        .assert_error(404, "not_found");
    let counted = scrape(&server).await;
    for (code, answers) in [("journal_full", 1.0), ("conflict", 1.0), ("not_found", 1.0)] {
        assert_eq!(
            counted.get(&format!("flightlog_http_errors_total{{code=\"{code}\"}}")),
            Some(answers),
            "{code}"
        );
    }
    assert_eq!(
        counted.get("flightlog_http_errors_total{code=\"unavailable\"}"),
        None
    );
    server.stop().await;
}
