//! The store side of OTLP ingest, measured without HTTP or protobuf: `import_spans` calls of 500
//! agent-shaped spans (traces of 10: an agent root, 5 model calls with usage, 4 tool calls, a
//! few events; attrs the size the OTLP mapping produces, resource attributes included), as the
//! server makes them, from C concurrent callers. BENCHMARKS.md records results.
//!
//! Reports spans/s, the writer thread's split (apply / begin+commit), and bytes per span.
//!
//! Run: `cargo bench -p flightlog-sqlite --bench import_workload -- [--spans N] [--concurrency C]
//! [--sequential-ids]`

/// The allocator the `flightlog` binary ships with, so the figures are the product's.
#[global_allocator]
static GLOBAL: flightlog_alloc::Mimalloc = flightlog_alloc::Mimalloc;

use std::sync::Arc;
use std::time::Instant;

use flightlog_core::activity::{
    ActivityStore, ImportedEnd, ImportedEvent, ImportedSpan, JsonObject, SpanKind, SpanOrigin,
    SpanOutcome, SpanUsage,
};
use flightlog_core::SystemClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};
use serde_json::json;

const SPANS_PER_TRACE: u64 = 10;
const SPANS_PER_CALL: u64 = 500;

fn option(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1))
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// `--sequential-ids`: trace and span ids that increase with time instead of the random-looking
/// ids real SDKs send. An experiment, not the workload: it shows what the random inserts into
/// the span-id index cost (see BENCHMARKS.md).
fn sequential_ids() -> bool {
    std::env::args().any(|arg| arg == "--sequential-ids")
}

fn hex(n: u64, width: usize) -> String {
    format!(
        "{:0width$x}",
        if sequential_ids() {
            n
        } else {
            n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        },
        width = width
    )
}

fn object(value: serde_json::Value) -> JsonObject {
    match value {
        serde_json::Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}

/// Span `position` (0..10) of trace `trace`.
fn span(trace: u64, position: u64) -> ImportedSpan {
    let run_id = hex(trace, 32);
    let span_id = hex(trace * SPANS_PER_TRACE + position + 1, 16);
    let root_id = hex(trace * SPANS_PER_TRACE + 1, 16);
    let start = 1_700_000_000_000 + (trace * 100 + position * 5) as i64;
    let (kind, name, mut attrs, usage) = match position {
        0 => (
            SpanKind::Turn,
            "invoke_agent travel-planner".to_owned(),
            object(
                json!({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "travel-planner",
                          "gen_ai.conversation.id": format!("conv-{}", trace % 977)}),
            ),
            SpanUsage::default(),
        ),
        1..=5 => (
            SpanKind::Model,
            "chat gpt-4o-mini".to_owned(),
            object(
                json!({"gen_ai.operation.name": "chat", "gen_ai.system": "openai",
                          "gen_ai.request.model": "gpt-4o-mini", "gen_ai.response.model": "gpt-4o-mini",
                          "gen_ai.usage.input_tokens": 1200 + position, "gen_ai.usage.output_tokens": 80,
                          "gen_ai.response.finish_reasons": ["stop"],
                          "flightlog.cost_source": "price_table", "flightlog.price_table": "2026-12-03"}),
            ),
            SpanUsage {
                input_tokens: Some(1200 + position as i64),
                output_tokens: Some(80),
                cost_usd: Some(0.000228),
                model: Some("gpt-4o-mini".into()),
                ..SpanUsage::default()
            },
        ),
        _ => (
            SpanKind::Tool,
            "execute_tool search_flights".to_owned(),
            object(
                json!({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_flights",
                          "gen_ai.tool.call.id": format!("call_{trace}_{position}")}),
            ),
            SpanUsage::default(),
        ),
    };
    attrs.insert(
        "resource".into(),
        json!({"service.name": "travel-agent", "service.version": "1.4.2",
               "telemetry.sdk.name": "opentelemetry", "telemetry.sdk.language": "python",
               "telemetry.sdk.version": "1.39.1", "host.name": "agent-host-7"}),
    );
    attrs.insert(
        "scope".into(),
        json!({"name": "opentelemetry.instrumentation.openai", "version": "0.40.0"}),
    );
    attrs.insert("otel.span_kind".into(), json!("INTERNAL"));
    let events = if position == 1 || position == 6 {
        vec![ImportedEvent {
            ts: start + 2,
            event_type: if position == 6 {
                "exception"
            } else {
                "gen_ai.choice"
            }
            .into(),
            payload: json!({"message": "tool returned 3 results", "index": 0,
                            "finish_reason": "stop", "detail": "x".repeat(120)}),
        }]
    } else {
        Vec::new()
    };
    ImportedSpan {
        priced_at: None,
        span_id,
        run_id,
        parent_span_id: (position > 0).then_some(root_id),
        name,
        kind,
        origin: SpanOrigin::Otlp,
        session_id: Some(format!("conv-{}", trace % 977)),
        job_name: None,
        attrs: attrs.into(),
        started_at: start,
        end: Some(ImportedEnd {
            ended_at: start + 40,
            outcome: SpanOutcome::Success,
            reason: None,
        }),
        usage,
        call_id: None,
        remote_parent: None,
        events,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let spans = option("--spans", 200_000).max(SPANS_PER_CALL);
    let concurrency = option("--concurrency", 4).max(1);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("import.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("open");
    let store = Arc::new(SqliteActivityStore::with_identity(
        Arc::clone(&db),
        Arc::new(SystemClock),
        "otlp",
    ));
    let calls = spans / SPANS_PER_CALL;
    let traces_per_call = SPANS_PER_CALL / SPANS_PER_TRACE;
    // Every call's spans are built before the clock starts, as the server has them decoded.
    let batches: Vec<Vec<ImportedSpan>> = (0..calls)
        .map(|call| {
            (0..traces_per_call)
                .flat_map(|t| {
                    let trace = call * traces_per_call + t;
                    (0..SPANS_PER_TRACE).map(move |position| span(trace, position))
                })
                .collect()
        })
        .collect();
    let queue = Arc::new(std::sync::Mutex::new(batches));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let queue = Arc::clone(&queue);
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().expect("queue").pop();
                let Some(batch) = next else { break };
                let report = store.import_spans(batch).await.expect("import");
                assert_eq!(report.created, SPANS_PER_CALL);
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = db.writer_stats();
    println!(
        "import: {} spans in {:.3} s = {:.0} spans/s ({} calls of {SPANS_PER_CALL}, concurrency {concurrency})",
        calls * SPANS_PER_CALL,
        elapsed,
        (calls * SPANS_PER_CALL) as f64 / elapsed,
        calls
    );
    println!("writer: {stats:?}");
    let wal = std::fs::metadata(path.with_extension("db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!("wal at the end of the load: {:.1} MB", wal as f64 / 1e6);
    drop(store);
    drop(db);
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "disk (before final checkpoint): {} bytes = {} bytes/span",
        bytes,
        bytes / (calls * SPANS_PER_CALL)
    );
}
