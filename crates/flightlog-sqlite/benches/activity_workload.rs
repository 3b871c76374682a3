//! The reference activity workload, measured on the SQLite store (BENCHMARKS.md records results).
//!
//! R runs (default 2,000), each: a root `turn` span; 5 child `tool` spans, each with two events
//! of about 300 bytes, a usage patch and an end; then the root's end with usage and a rollup.
//! Durability `normal`. Runs are driven by C concurrent agents (default 64; `--concurrency 1`
//! gives strictly sequential calls), as a server with many agents would see them.
//!
//! Reports: writes/s (one write = one store call) and per-call latency, snapshot latency of a
//! 6-span run and of a 10,000-span run, change-log read throughput, bytes per span on disk after
//! a checkpoint, and prune throughput.
//!
//! Run: `cargo bench -p flightlog-sqlite --bench activity_workload -- [--runs R] [--concurrency C]`

/// The allocator the `flightlog` binary ships with, so the figures are the product's.
#[global_allocator]
static GLOBAL: flightlog_alloc::Mimalloc = flightlog_alloc::Mimalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, PruneOptions, SpanKind, SpanOrigin, SpanOutcome, SpanPatch,
    SpanUsage, StartSpanInput,
};
use flightlog_core::SystemClock;
use flightlog_sqlite::{Durability, SqliteActivityStore, SqliteConfig, SqliteDatabase};
use serde_json::json;

struct Options {
    runs: usize,
    concurrency: usize,
}

fn parse_options() -> Options {
    let mut options = Options {
        runs: 2_000,
        concurrency: 64,
    };
    let args: Vec<String> = std::env::args().collect();
    let mut index = 1;
    while index < args.len() {
        let value = args.get(index + 1).and_then(|v| v.parse::<usize>().ok());
        match (args[index].as_str(), value) {
            ("--runs", Some(v)) => options.runs = v.max(1),
            ("--concurrency", Some(v)) => options.concurrency = v.max(1),
            // cargo bench passes `--bench`; anything unknown is ignored.
            _ => {}
        }
        index += 1;
    }
    options
}

fn hex_id(prefix: u64, n: u64, width: usize) -> String {
    format!(
        "{:0width$x}",
        (prefix << 40) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        width = width
    )
}

const TOOLS: [&str; 5] = ["bash", "read_file", "edit_file", "grep", "web_fetch"];

/// About 300 bytes of JSON, shaped like a tool call's input or output.
fn event_payload(run: usize, tool: usize, output: bool) -> serde_json::Value {
    if output {
        json!({
            "ok": true,
            "exitCode": 0,
            "output": format!(
                "running {} tests\ntest planner::tests::case_{run} ... ok\n\
                 test result: ok. {} passed; 0 failed; finished in {}.{:02}s\n\
                 warning: unused variable `ctx` in src/agents/tool_{tool}.rs:{}:9 \
                 (run {run}); consider prefixing it with an underscore",
                40 + tool, 40 + tool, tool, run % 100, 100 + run % 900
            ),
            "bytes": 1800 + run % 500,
        })
    } else {
        let tool_name = TOOLS[tool % TOOLS.len()];
        json!({
            "tool": tool_name,
            "input": {
                "command": format!("cargo test -p agent-core --lib planner::tests::case_{run}"),
                "cwd": "/home/agent/work/repository",
                "timeoutMs": 120000,
                "env": {"RUST_BACKTRACE": "1", "CARGO_TERM_COLOR": "never"},
            },
            "reason": format!(
                "Run the planner tests again after editing step {tool} to confirm the fix for run {run}"
            ),
        })
    }
}

async fn one_run(store: &dyn ActivityStore, run: usize, latencies: &mut Vec<Duration>) {
    let run_id = hex_id(1, run as u64, 32);
    let root_id = hex_id(2, (run * 8) as u64, 16);
    macro_rules! timed {
        ($call:expr) => {{
            let started = Instant::now();
            let result = $call.await;
            latencies.push(started.elapsed());
            if let Err(err) = result {
                panic!("benchmark write failed: {err}");
            }
        }};
    }
    timed!(store.start_span(StartSpanInput {
        span_id: root_id.clone(),
        run_id: run_id.clone(),
        parent_span_id: None,
        name: "agent turn".into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: Some(format!("session-{}", run % 50)),
        job_name: None,
        attrs: None,
        started_at: None,
    }));
    for tool in 0..5 {
        let span_id = hex_id(2, (run * 8 + tool + 1) as u64, 16);
        timed!(store.start_span(StartSpanInput {
            span_id: span_id.clone(),
            run_id: run_id.clone(),
            parent_span_id: Some(root_id.clone()),
            name: format!("tool:{}", TOOLS[tool % TOOLS.len()]),
            kind: SpanKind::Tool,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: None,
        }));
        let input = event_payload(run, tool, false);
        timed!(store.append_event(&span_id, "tool_input", Some(&input), None));
        let output = event_payload(run, tool, true);
        timed!(store.append_event(&span_id, "tool_output", Some(&output), None));
        timed!(store.patch_span(
            &span_id,
            SpanPatch {
                usage: Some(SpanUsage {
                    input_tokens: Some(1200 + tool as i64),
                    output_tokens: Some(300),
                    ..SpanUsage::default()
                }),
                ..SpanPatch::default()
            }
        ));
        timed!(store.end_span(
            &span_id,
            EndSpanInput {
                outcome: SpanOutcome::Success,
                reason: None,
                ended_at: None,
                usage: None,
                attrs: None,
            }
        ));
    }
    timed!(store.end_span(
        &root_id,
        EndSpanInput {
            outcome: SpanOutcome::Success,
            reason: None,
            ended_at: None,
            usage: Some(SpanUsage {
                input_tokens: Some(6_000),
                output_tokens: Some(1_500),
                cache_read_tokens: Some(20_000),
                cache_creation_tokens: Some(800),
                cost_usd: Some(0.0425),
                model: Some("claude-sonnet-4".into()),
            }),
            attrs: None,
        }
    ));
    timed!(store.rollup_run(&run_id));
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn file_bytes(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = parse_options();
    let dir = tempfile::tempdir().expect("temp dir");
    // FLIGHTLOG_BENCH_DB keeps the database for inspection (it must not exist yet).
    let path = std::env::var_os("FLIGHTLOG_BENCH_DB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("bench.db"));
    let mut config = SqliteConfig::new(&path);
    config.durability = Durability::Normal;
    let db = SqliteDatabase::open(config).expect("open database");
    let store: Arc<dyn ActivityStore> =
        Arc::new(SqliteActivityStore::new(db.clone(), Arc::new(SystemClock)));

    // 1. Writes.
    let started = Instant::now();
    let mut agents = Vec::new();
    for agent in 0..options.concurrency {
        let store = store.clone();
        let (runs, concurrency) = (options.runs, options.concurrency);
        agents.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut run = agent;
            while run < runs {
                one_run(store.as_ref(), run, &mut latencies).await;
                run += concurrency;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for agent in agents {
        latencies.extend(agent.await.expect("agent task"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let writes = latencies.len();
    println!(
        "workload: {} runs x 28 writes, concurrency {}, durability normal",
        options.runs, options.concurrency
    );
    println!(
        "writes: {writes} in {:.3} s = {:.0} writes/s ({:.0} spans/s); per call p50 {:.1} us, p99 {:.1} us",
        elapsed.as_secs_f64(),
        writes as f64 / elapsed.as_secs_f64(),
        (options.runs * 6) as f64 / elapsed.as_secs_f64(),
        micros(percentile(&latencies, 0.5)),
        micros(percentile(&latencies, 0.99)),
    );

    {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = db.writer_stats();
        let groups = stats.groups.load(Relaxed).max(1);
        let writes_done = stats.writes.load(Relaxed);
        println!(
            "writer thread: {groups} transactions, {:.1} writes each; apply {:.2} s, begin+commit {:.2} s, checkpoint {:.2} s",
            writes_done as f64 / groups as f64,
            stats.apply_nanos.load(Relaxed) as f64 / 1e9,
            stats.commit_nanos.load(Relaxed) as f64 / 1e9,
            stats.checkpoint_nanos.load(Relaxed) as f64 / 1e9,
        );
    }

    // Reads are measured in steady state: let the WAL be copied into the database file first
    // (otherwise the read phase overlaps the housekeeper's checkpoint of the write burst).
    {
        let conn = rusqlite::Connection::open(&path).expect("open for checkpoint");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
    }

    // 2. Snapshot of a 6-span run (a warm-up pass first, as a long-running server would be).
    for i in 0..200usize {
        let run_id = hex_id(1, ((i * 7919) % options.runs) as u64, 32);
        store.snapshot_run(&run_id).await.expect("snapshot");
    }
    let mut snapshot_times = Vec::new();
    for i in 0..2_000usize {
        let run_id = hex_id(1, ((i * 7919) % options.runs) as u64, 32);
        let started = Instant::now();
        let snapshot = store.snapshot_run(&run_id).await.expect("snapshot");
        snapshot_times.push(started.elapsed());
        assert_eq!(snapshot.map(|s| s.spans.len()), Some(6));
    }
    snapshot_times.sort();
    println!(
        "snapshot (6 spans, 10 events): p50 {:.1} us, p99 {:.1} us",
        micros(percentile(&snapshot_times, 0.5)),
        micros(percentile(&snapshot_times, 0.99))
    );

    // 3. Change log read throughput.
    for page in [500i64, 10_000] {
        let started = Instant::now();
        let mut cursor = 0;
        let mut read = 0usize;
        loop {
            let changes = store.changes_since(cursor, page).await.expect("changes");
            let Some(last) = changes.last() else { break };
            cursor = last.change_id;
            read += changes.len();
        }
        let elapsed = started.elapsed();
        println!(
            "changes_since (page {page}): {read} changes in {:.3} s = {:.0} changes/s",
            elapsed.as_secs_f64(),
            read as f64 / elapsed.as_secs_f64()
        );
    }

    // 4. Bytes per span after a checkpoint.
    {
        println!(
            "wal before the final checkpoint: {:.1} MB (the housekeeper keeps it bounded)",
            file_bytes(&path.with_extension("db-wal")) as f64 / 1e6
        );
        let conn = rusqlite::Connection::open(&path).expect("open for checkpoint");
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .expect("checkpoint");
        let bytes = file_bytes(&path) + file_bytes(&path.with_extension("db-wal"));
        let spans = options.runs * 6;
        println!(
            "disk: {bytes} bytes for {spans} spans = {:.0} bytes/span (events and change rows included)",
            bytes as f64 / spans as f64
        );
    }

    if std::env::var_os("FLIGHTLOG_BENCH_DB").is_some() {
        return;
    }

    // 5. Snapshot of a 10,000-span run.
    {
        let big_run = "big-run-0000000000000000000000000";
        let root = "big-root";
        let start = |span_id: String, parent: Option<&str>| StartSpanInput {
            span_id,
            run_id: big_run.into(),
            parent_span_id: parent.map(str::to_owned),
            name: "step".into(),
            kind: SpanKind::Tool,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: None,
        };
        store
            .start_span(start(root.into(), None))
            .await
            .expect("root");
        let mut pending = Vec::new();
        for i in 1..10_000 {
            let store = store.clone();
            let input = start(format!("big-span-{i:05}"), Some(root));
            pending.push(tokio::spawn(async move { store.start_span(input).await }));
            if pending.len() >= 256 {
                for task in pending.drain(..) {
                    task.await.expect("task").expect("span");
                }
            }
        }
        for task in pending.drain(..) {
            task.await.expect("task").expect("span");
        }
        let mut times = Vec::new();
        for _ in 0..30 {
            let started = Instant::now();
            let snapshot = store.snapshot_run(big_run).await.expect("snapshot");
            times.push(started.elapsed());
            assert_eq!(snapshot.map(|s| s.spans.len()), Some(10_000));
        }
        times.sort();
        println!(
            "snapshot (10,000 spans): p50 {:.2} ms, p99 {:.2} ms",
            micros(percentile(&times, 0.5)) / 1000.0,
            micros(percentile(&times, 0.99)) / 1000.0
        );
        store
            .cascade_close(big_run, SpanOutcome::Cancelled, "benchmark done")
            .await
            .expect("close big run");
    }

    // 6. Prune everything that finished.
    {
        let started = Instant::now();
        let mut runs = 0;
        let mut spans = 0;
        loop {
            let pruned = store
                .prune(PruneOptions {
                    max_spans: None,
                    digest_floor_at: i64::MAX,
                    hard_ceiling_ms: 0,
                    now: None,
                    batch: Some(50),
                    scheduled: false,
                })
                .await
                .expect("prune");
            if pruned.runs_pruned == 0 {
                break;
            }
            runs += pruned.runs_pruned;
            spans += pruned.spans_deleted;
        }
        let elapsed = started.elapsed();
        println!(
            "prune (batch 50): {runs} runs / {spans} spans in {:.3} s = {:.0} runs/s, {:.0} spans/s",
            elapsed.as_secs_f64(),
            runs as f64 / elapsed.as_secs_f64(),
            spans as f64 / elapsed.as_secs_f64()
        );
    }
}
