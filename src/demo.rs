//! `flightlog demo`: a simulated multi-agent workload, so a new user sees flightlog record
//! something real in seconds.
//!
//! Each simulated run is an agent turn with model calls (with token usage), tool calls with
//! input/output events, sometimes a subagent, sometimes a failing tool; one run is left open so
//! the "running now" and stuck views have something to show. Everything goes through the public
//! store trait, exactly as an embedding agent framework would use it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use flightlog_core::activity::{
    ActivityStore, ActivityWrite, ActivityWriteResult, EndSpanInput, SpanKind, SpanOrigin,
    SpanOutcome, SpanPatch, SpanRow, SpanUsage, StartSpanInput,
};
use flightlog_core::{default_writer_id, Clock, SystemClock};
use serde_json::json;

use crate::backend::Backend;

/// The ids of one demo's runs and spans: `demo<ms>p<pid>-<kind>-<n>`, numbered per kind (the
/// runs are `run-1` to `run-N`, the live one `run-N+1`). The process id keeps two demos that
/// start in the same millisecond (`flightlog demo & flightlog demo`) apart: with the time alone
/// they wrote the same ids and one failed halfway with "a span with id … already exists".
struct Ids {
    prefix: String,
    counts: std::collections::HashMap<&'static str, usize>,
}

impl Ids {
    fn new(now_ms: i64, process_id: u32) -> Self {
        Self {
            prefix: format!("demo{now_ms}p{process_id}"),
            counts: std::collections::HashMap::new(),
        }
    }

    fn next(&mut self, what: &'static str) -> String {
        let count = self.counts.entry(what).or_insert(0);
        *count += 1;
        format!("{}-{what}-{count}", self.prefix)
    }
}

fn start(
    span_id: &str,
    run_id: &str,
    parent: Option<&str>,
    name: &str,
    kind: SpanKind,
    at: i64,
) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.to_owned(),
        run_id: run_id.to_owned(),
        parent_span_id: parent.map(str::to_owned),
        name: name.to_owned(),
        kind,
        origin: SpanOrigin::Session,
        session_id: Some("demo-session".to_owned()),
        job_name: None,
        attrs: None,
        started_at: Some(at),
    }
}

fn end(
    outcome: SpanOutcome,
    reason: Option<&str>,
    at: i64,
    usage: Option<SpanUsage>,
) -> EndSpanInput {
    EndSpanInput {
        outcome,
        reason: reason.map(str::to_owned),
        ended_at: Some(at),
        usage,
        attrs: None,
    }
}

fn usage(input: i64, output: i64, cost: f64) -> SpanUsage {
    SpanUsage {
        input_tokens: Some(input),
        output_tokens: Some(output),
        cost_usd: Some(cost),
        model: Some("demo-model-large".to_owned()),
        ..SpanUsage::default()
    }
}

/// Record one finished run; returns its id. The run's writes go in one batch, one transaction:
/// a run written call by call was open, with start times up to a week back and no heartbeat,
/// while the demo wrote it, and a server serving the same file closed such runs in its stale
/// sweep as "writer went silent" (an audit's finding: 43 of 400 runs).
async fn simulate_run(
    store: &dyn ActivityStore,
    ids: &mut Ids,
    index: usize,
    mut at: i64,
) -> anyhow::Result<String> {
    let run_id = ids.next("run");
    let root = ids.next("turn");
    let mut writes = vec![ActivityWrite::StartSpan(start(
        &root,
        &run_id,
        None,
        &format!("turn {}: fix failing test", index + 1),
        SpanKind::Turn,
        at,
    ))];
    let end_write = |span_id: &str, input: EndSpanInput| ActivityWrite::EndSpan {
        span_id: span_id.to_owned(),
        input,
    };
    let event = |span_id: &str, event_type: &str, payload: serde_json::Value, ts: i64| {
        ActivityWrite::AppendEvent {
            span_id: span_id.to_owned(),
            event_type: event_type.to_owned(),
            payload: Some(payload),
            ts: Some(ts),
        }
    };
    let (mut total_in, mut total_out, mut total_cost) = (0i64, 0i64, 0.0f64);
    let mut failure = None;
    for step in 0..3 {
        at += 40;
        let model = ids.next("model");
        writes.push(ActivityWrite::StartSpan(start(
            &model,
            &run_id,
            Some(&root),
            "model call",
            SpanKind::Model,
            at,
        )));
        at += 900;
        let (input, output, cost) = (1_500 + 200 * step, 300 + 20 * step, 0.0125);
        total_in += input;
        total_out += output;
        total_cost += cost;
        writes.push(end_write(
            &model,
            end(
                SpanOutcome::Success,
                None,
                at,
                Some(usage(input, output, cost)),
            ),
        ));
        let tool = ids.next("tool");
        let tool_name = ["read_file", "bash", "edit_file"][step as usize % 3];
        writes.push(ActivityWrite::StartSpan(start(
            &tool,
            &run_id,
            Some(&root),
            &format!("tool:{tool_name}"),
            SpanKind::Tool,
            at + 5,
        )));
        writes.push(event(
            &tool,
            "tool_input",
            json!({"tool": tool_name, "step": step}),
            at + 6,
        ));
        at += 300;
        let fails = index % 5 == 4 && step == 1;
        writes.push(event(
            &tool,
            "tool_output",
            json!({"ok": !fails, "output": if fails { "exit status 101" } else { "ok" }}),
            at,
        ));
        if fails {
            writes.push(end_write(
                &tool,
                end(SpanOutcome::Error, Some("tests failed"), at, None),
            ));
            failure = Some("tests failed");
        } else {
            writes.push(end_write(&tool, end(SpanOutcome::Success, None, at, None)));
        }
    }
    if index.is_multiple_of(3) {
        let sub = ids.next("subagent");
        writes.push(ActivityWrite::StartSpan(start(
            &sub,
            &run_id,
            Some(&root),
            "subagent: reviewer",
            SpanKind::Subagent,
            at + 10,
        )));
        writes.push(ActivityWrite::PatchSpan {
            span_id: sub.clone(),
            patch: SpanPatch {
                attrs: serde_json::from_value(json!({"agent": "reviewer"})).ok(),
                ..SpanPatch::default()
            },
        });
        at += 2_000;
        writes.push(end_write(&sub, end(SpanOutcome::Success, None, at, None)));
    }
    let outcome = if failure.is_some() {
        SpanOutcome::Error
    } else {
        SpanOutcome::Success
    };
    writes.push(end_write(
        &root,
        end(
            outcome,
            failure,
            at + 20,
            Some(usage(total_in, total_out, total_cost)),
        ),
    ));
    for result in store.write_batch(writes).await {
        match result? {
            // Every write of the run applies: a span not started, ended or patched, or an
            // event on a span not stored, is a failure of the demo, said as such.
            ActivityWriteResult::Ended(false)
            | ActivityWriteResult::Patched(false)
            | ActivityWriteResult::Appended(None) => {
                anyhow::bail!("a write of demo run {run_id} was not applied")
            }
            _ => {}
        }
    }
    store.rollup_run(&run_id).await?;
    Ok(run_id)
}

/// `writeln!` into the report, which is a `String`: writing to it cannot fail.
macro_rules! report_line {
    ($report:expr, $($arg:tt)*) => {{
        let _ = writeln!($report, $($arg)*);
    }};
}

fn print_tree(report: &mut String, spans: &[SpanRow], parent: Option<&str>, depth: usize) {
    for span in spans
        .iter()
        .filter(|s| s.parent_span_id.as_deref() == parent)
    {
        let state = match (&span.outcome, span.ended_at) {
            (Some(outcome), Some(ended)) => format!("{outcome} in {} ms", ended - span.started_at),
            (Some(outcome), None) => outcome.to_string(),
            (None, _) => "running".to_owned(),
        };
        let tokens = match (span.usage.input_tokens, span.usage.output_tokens) {
            (Some(i), Some(o)) => format!("  [{i} in / {o} out tokens]"),
            _ => String::new(),
        };
        report_line!(
            report,
            "{}{} ({}) {state}{tokens}",
            "  ".repeat(depth + 1),
            span.name,
            span.kind
        );
        print_tree(report, spans, Some(&span.span_id), depth + 1);
    }
}

/// The most runs the report's table lists (the newest).
const DEMO_TABLE_ROWS: usize = 50;

/// How far back the simulated runs reach at most (a week).
const DEMO_SPAN_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// Time between the starts of two simulated runs: a minute, or less so that `runs` of them fit
/// in [`DEMO_SPAN_MS`].
fn run_spacing_ms(runs: usize) -> i64 {
    (DEMO_SPAN_MS / i64::try_from(runs.max(1)).unwrap_or(i64::MAX)).clamp(1, 60_000)
}

pub async fn run(db_path: &Path, runs: usize) -> anyhow::Result<()> {
    let backend = Backend::open_unclaimed(db_path)?;
    backend.warn_of_risks();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = backend.activity(Arc::clone(&clock), &default_writer_id(clock.as_ref()));
    let now = clock.now_ms();
    let mut ids = Ids::new(now, std::process::id());
    let mut run_ids = Vec::new();
    // A minute apart, or closer for many runs: all of them within the last week, so a server's
    // 30-day retention does not prune the oldest the moment it serves the file.
    let spacing = run_spacing_ms(runs);
    for index in 0..runs {
        let started = now - spacing * (runs - index) as i64;
        run_ids.push(simulate_run(store.as_ref(), &mut ids, index, started).await?);
    }
    // One run still going: an agent waiting on a slow tool right now.
    let live_run = ids.next("run");
    let live_root = ids.next("turn");
    store
        .start_span(start(
            &live_root,
            &live_run,
            None,
            "turn: long refactor (still running)",
            SpanKind::Turn,
            now - 5_000,
        ))
        .await?;
    let slow_tool = ids.next("tool");
    store
        .start_span(start(
            &slow_tool,
            &live_run,
            Some(&live_root),
            "tool:bash (cargo build)",
            SpanKind::Tool,
            now - 4_000,
        ))
        .await?;

    let mut report = String::new();
    report_line!(
        report,
        "Recorded {runs} finished run{} and 1 running run into {}\n",
        if runs == 1 { "" } else { "s" },
        db_path.display()
    );
    if run_ids.is_empty() {
        report_line!(report, "(no finished runs: --runs 0)");
    } else {
        report_line!(
            report,
            "{:<34} {:<8} {:>6} {:>9} {:>9} {:>9}  failure",
            "run",
            "outcome",
            "spans",
            "in tok",
            "out tok",
            "cost $"
        );
    }
    // The newest runs only: a table of a hundred thousand lines shows nothing.
    let shown = run_ids.len().min(DEMO_TABLE_ROWS);
    if shown < run_ids.len() {
        report_line!(
            report,
            "({} earlier runs not shown; GET /v1/activity/runs on `flightlog serve` lists them)",
            run_ids.len() - shown
        );
    }
    for run_id in &run_ids[run_ids.len() - shown..] {
        if let Some(rollup) = store.read_rollup(run_id).await? {
            report_line!(
                report,
                "{:<34} {:<8} {:>6} {:>9} {:>9} {:>9.4}  {}",
                rollup.run_id,
                rollup
                    .outcome
                    .map(|o| o.to_string())
                    .unwrap_or_else(|| "open".into()),
                rollup.span_count,
                rollup.input_tokens.unwrap_or(0),
                rollup.output_tokens.unwrap_or(0),
                rollup.cost_usd.unwrap_or(0.0),
                rollup.failure_reason.unwrap_or_default(),
            );
        }
    }
    if let Some(last) = run_ids.last() {
        match store.snapshot_run(last).await? {
            Some(snapshot) => {
                report_line!(
                    report,
                    "\nSpan tree of {last} (seq high-water {}):",
                    snapshot.high_water_seq
                );
                print_tree(&mut report, &snapshot.spans, None, 0);
            }
            // A server serving the file may prune a finished run as soon as it is rolled up
            // (`--prune-after-ms` shorter than the demo takes).
            None => report_line!(
                report,
                "\nSpan tree of {last}: its detail is gone already (pruned by a server's \
                 retention, --prune-after-ms); its rollup above is kept"
            ),
        }
    }
    report_line!(report, "\nRunning now:");
    for span in store.open_root_spans().await? {
        report_line!(
            report,
            "  {} (run {}, {})",
            span.name,
            span.run_id,
            started_when(now, span.started_at)
        );
    }
    report_line!(
        report,
        "\nChange log cursor: {}",
        store.latest_change_cursor().await?
    );
    // The report goes out in one write at the end, and a failed write is an error: `demo
    // >/dev/full` reported success with its whole output lost. A reader that went away early
    // (`demo | head`) only wanted less of it.
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(report.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(err).with_context(|| {
                format!(
                    "the runs are recorded in {}, but the report could not be written to \
                     standard output",
                    db_path.display()
                )
            });
        }
        _ => {}
    }
    drop(stdout);
    // Leave everything in the database file itself (a server reading it keeps its own view).
    backend.close().await
}

/// When a running root started, as people say it: `started 2 min 5 s ago`, or, for a start
/// stamped ahead of this machine's clock (another machine's clock, a client's bug), `stamped
/// to start in 3 h`, never a negative age (a run stamped in the year 3000 showed `started
/// -30707014789 s ago`).
fn started_when(now: i64, started_at: i64) -> String {
    let age = now.saturating_sub(started_at);
    if age >= 0 {
        format!(
            "started {} ago",
            flightlog_server::maintenance::human_duration(age)
        )
    } else {
        format!(
            "stamped to start in {}",
            flightlog_server::maintenance::human_duration(age.saturating_neg())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_ahead_of_the_clock_is_no_negative_age() {
        assert_eq!(started_when(125_000, 0), "started 2 min 5 s ago");
        assert_eq!(started_when(0, 3 * 3_600_000), "stamped to start in 3 h");
        assert_eq!(
            started_when(1_800_000_000_000, -9_007_199_254_740_991),
            "started 104270824 days 16 h ago"
        );
        assert_eq!(
            started_when(i64::MIN, i64::MAX),
            "stamped to start in 106751991167 days 7 h"
        );
    }

    #[test]
    fn ids_are_numbered_per_kind_and_differ_between_processes() {
        let mut first = Ids::new(1_796_392_049_844, 41);
        let mut second = Ids::new(1_796_392_049_844, 42);
        let firsts: Vec<String> = ["run", "turn", "run", "tool", "run"]
            .into_iter()
            .map(|what| first.next(what))
            .collect();
        assert_eq!(
            firsts,
            [
                "demo1796392049844p41-run-1",
                "demo1796392049844p41-turn-1",
                "demo1796392049844p41-run-2",
                "demo1796392049844p41-tool-1",
                "demo1796392049844p41-run-3",
            ]
        );
        // Same millisecond, another process: no id in common.
        let seconds: Vec<String> = ["run", "turn", "run", "tool", "run"]
            .into_iter()
            .map(|what| second.next(what))
            .collect();
        assert!(seconds.iter().all(|id| !firsts.contains(id)), "{seconds:?}");
    }

    #[test]
    fn runs_are_a_minute_apart_and_never_older_than_a_week() {
        assert_eq!(run_spacing_ms(0), 60_000);
        assert_eq!(run_spacing_ms(12), 60_000);
        for runs in [10_080, 10_081, 50_000, 100_000] {
            let reach = run_spacing_ms(runs) * runs as i64;
            assert!(reach <= DEMO_SPAN_MS, "{runs}: {reach}");
            assert!(run_spacing_ms(runs) < 60_000 || runs <= 10_080, "{runs}");
        }
        assert_eq!(run_spacing_ms(100_000), 6_048);
    }
}
