//! Model-based property test: the SQLite activity store against an in-memory model of the
//! reference semantics.
//!
//! The conformance fixtures pin the reference's behaviour down on scripted and recorded
//! scenarios; this test explores the space between them. Proptest generates random operation
//! sequences over a handful of run and span ids (so duplicates, unknown parents, writes to
//! terminal spans, prunes of runs that are then reused and sweeps across two writer identities
//! happen often), replays each sequence against a fresh SQLite file and against the model below,
//! and compares every result as JSON. The model is written from `shared/seeds/activity-store.ts`
//! and FORMAT.md sections 3 and 5, not from the store's code, so it catches a store that drifts
//! from the reference, including through the writer thread's caches and group commits
//! ([`Op::Group`] queues several writes at once so they share one transaction).
//!
//! The store's deliberate choices are modelled as such: change ids are never reused (the
//! AUTOINCREMENT high mark survives a prune of the newest rows), a run's `seq` is one more than
//! its highest remaining seq, and `latestChangeCursor` is the highest remaining change id.
//!
//! Where the reference leaves an order to SQLite (FORMAT.md 3.5) the generator keeps the values
//! tie-free: every `startedAt` and event `ts` is unique (each start and append moves the clock
//! forward by 10 ms and explicit times stay inside that step), run ids are first used in
//! ascending order, and a prune `batch` that would cut between two runs ending at the same
//! moment is widened to the end of the tie.
//!
//! A second property runs the same sequences after a warm-up that makes the store train its
//! event payload compression dictionary, so the compressed storage path is exercised too.
//! `PROPTEST_CASES` overrides the number of cases (64 and 12 by default) for a longer soak.

mod reference_json;
use reference_json::js_normalized;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, JsonObject, PruneOptions, SpanKind, SpanOrigin, SpanOutcome,
    SpanPatch, SpanUsage, StartSpanInput, StoreError,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::{json, Map, Value};

const RUN_IDS: [&str; 4] = ["r0", "r1", "r2", "r3"];
const SPAN_IDS: [&str; 8] = ["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"];
const WRITERS: [&str; 2] = ["w1", "w2"];
const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
const SESSION_IDS: [&str; 2] = ["sess-a", "sess-b"];
const JOB_NAMES: [&str; 2] = ["job-a", "job-b"];
const REASONS: [&str; 2] = ["boom", "too slow"];
const EVENT_TYPES: [&str; 3] = ["tool_call", "text", "error"];
const START_CLOCK: i64 = 1_000_000;
/// Every start and append moves the clock by this much; explicit times stay inside the step.
const TICK: i64 = 10;

/// The reference's `MAX_EVENT_PAYLOAD_BYTES` and `TRUNCATION_MARKER`, restated on purpose.
const PAYLOAD_CAP: usize = 16_384;
const MARKER: &str = "…[truncated]";

fn kind(index: usize) -> SpanKind {
    match index % 4 {
        0 => SpanKind::Turn,
        1 => SpanKind::Tool,
        2 => SpanKind::Subagent,
        _ => SpanKind::Cron,
    }
}

fn outcome(index: usize) -> SpanOutcome {
    match index % 6 {
        0 => SpanOutcome::Success,
        1 => SpanOutcome::Error,
        2 => SpanOutcome::Timeout,
        3 => SpanOutcome::Cancelled,
        4 => SpanOutcome::Denied,
        _ => SpanOutcome::Interrupted,
    }
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Default)]
struct ModelUsage {
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    cache_read_tokens: Option<i64>,
    cache_creation_tokens: Option<i64>,
    cost_usd: Option<f64>,
    model: Option<String>,
}

impl ModelUsage {
    /// `COALESCE(new, old)` column by column.
    fn coalesce(&mut self, update: Option<&SpanUsage>) {
        let Some(update) = update else {
            return;
        };
        self.input_tokens = update.input_tokens.or(self.input_tokens);
        self.output_tokens = update.output_tokens.or(self.output_tokens);
        self.cache_read_tokens = update.cache_read_tokens.or(self.cache_read_tokens);
        self.cache_creation_tokens = update.cache_creation_tokens.or(self.cache_creation_tokens);
        self.cost_usd = update.cost_usd.or(self.cost_usd);
        self.model = update.model.clone().or(self.model.take());
    }

    /// Only the non-null keys, as `rowToSpan` builds it.
    fn to_json(&self) -> Value {
        let mut usage = Map::new();
        let ints = [
            ("inputTokens", self.input_tokens),
            ("outputTokens", self.output_tokens),
            ("cacheReadTokens", self.cache_read_tokens),
            ("cacheCreationTokens", self.cache_creation_tokens),
        ];
        for (key, value) in ints {
            if let Some(value) = value {
                usage.insert(key.to_owned(), json!(value));
            }
        }
        if let Some(cost) = self.cost_usd {
            // Written as JavaScript writes it (`3`, not `3.0`), as the store writes it.
            usage.insert("costUsd".to_owned(), js_normalized(&json!(cost)));
        }
        if let Some(model) = &self.model {
            usage.insert("model".to_owned(), json!(model));
        }
        Value::Object(usage)
    }
}

#[derive(Debug, Clone)]
struct ModelSpan {
    span_id: String,
    run_id: String,
    parent_span_id: Option<String>,
    name: String,
    kind: String,
    origin: String,
    session_id: Option<String>,
    job_name: Option<String>,
    attrs: JsonObject,
    started_at: i64,
    wait_until: Option<i64>,
    ended_at: Option<i64>,
    outcome: Option<String>,
    outcome_reason: Option<String>,
    usage: ModelUsage,
    writer: String,
    last_heartbeat_at: Option<i64>,
}

impl ModelSpan {
    fn is_open(&self) -> bool {
        self.outcome.is_none()
    }

    /// `parent_span_id IS NULL`: an empty-string parent is not a root.
    fn is_root(&self) -> bool {
        self.parent_span_id.is_none()
    }

    fn to_json(&self) -> Value {
        json!({
            "spanId": self.span_id,
            "runId": self.run_id,
            "parentSpanId": self.parent_span_id,
            "name": self.name,
            "kind": self.kind,
            "origin": self.origin,
            "sessionId": self.session_id,
            "jobName": self.job_name,
            "attrs": self.attrs,
            "startedAt": self.started_at,
            "waitUntil": self.wait_until,
            "endedAt": self.ended_at,
            "outcome": self.outcome,
            "outcomeReason": self.outcome_reason,
            "usage": self.usage.to_json(),
            "writer": self.writer,
            "lastHeartbeatAt": self.last_heartbeat_at,
        })
    }
}

#[derive(Debug, Clone)]
struct ModelEvent {
    span_id: String,
    event_index: i64,
    ts: i64,
    event_type: String,
    payload: Value,
    truncated: bool,
}

impl ModelEvent {
    fn to_json(&self) -> Value {
        json!({
            "spanId": self.span_id,
            "eventIndex": self.event_index,
            "ts": self.ts,
            "eventType": self.event_type,
            "payload": self.payload,
            "truncated": self.truncated,
        })
    }
}

#[derive(Debug, Clone)]
struct ModelChange {
    change_id: i64,
    run_id: String,
    seq: i64,
    span_id: String,
    event_index: Option<i64>,
}

#[derive(Debug, Clone)]
struct ModelRollup {
    origin: String,
    name: String,
    session_id: Option<String>,
    job_name: Option<String>,
    started_at: i64,
    ended_at: Option<i64>,
    outcome: Option<String>,
    duration_ms: Option<i64>,
    span_count: i64,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    cache_read_tokens: Option<i64>,
    cache_creation_tokens: Option<i64>,
    cost_usd: Option<f64>,
    failure_reason: Option<String>,
    detail_pruned: bool,
}

impl ModelRollup {
    fn to_json(&self, run_id: &str) -> Value {
        let mut row = Map::new();
        let mut put = |key: &str, value: Value| {
            row.insert(key.to_owned(), value);
        };
        put("runId", json!(run_id));
        put("origin", json!(self.origin));
        put("name", json!(self.name));
        put("sessionId", json!(self.session_id));
        put("jobName", json!(self.job_name));
        put("startedAt", json!(self.started_at));
        put("endedAt", json!(self.ended_at));
        put("outcome", json!(self.outcome));
        put("durationMs", json!(self.duration_ms));
        put("spanCount", json!(self.span_count));
        put("inputTokens", json!(self.input_tokens));
        put("outputTokens", json!(self.output_tokens));
        put("cacheReadTokens", json!(self.cache_read_tokens));
        put("cacheCreationTokens", json!(self.cache_creation_tokens));
        put("costUsd", js_normalized(&json!(self.cost_usd)));
        put("failureReason", json!(self.failure_reason));
        put("detailPruned", json!(self.detail_pruned));
        Value::Object(row)
    }
}

/// `{...old, ...new}`: existing keys keep their place, new ones are appended.
fn merge_attrs(stored: &mut JsonObject, update: Option<&JsonObject>) {
    for (key, value) in update.into_iter().flatten() {
        stored.insert(key.clone(), value.clone());
    }
}

/// The reference's `capPayload` (lengths in characters = bytes: the generated big payloads are
/// ASCII).
fn cap(payload: Option<&Value>) -> (Value, bool) {
    let value = js_normalized(&payload.cloned().unwrap_or(Value::Null));
    let text = serde_json::to_string(&value).unwrap_or_default();
    if text.len() <= PAYLOAD_CAP {
        return (value, false);
    }
    let kept = match &value {
        Value::String(string) => string.chars().take(PAYLOAD_CAP).collect::<String>(),
        _ => text.chars().take(PAYLOAD_CAP).collect::<String>(),
    };
    (Value::String(format!("{kept}{MARKER}")), true)
}

/// The activity store's state and rules, as plain data.
#[derive(Debug, Default)]
struct Model {
    spans: Vec<ModelSpan>,
    events: Vec<ModelEvent>,
    /// Ascending `change_id`.
    changes: Vec<ModelChange>,
    /// The AUTOINCREMENT high mark: ids are never reused, even after a prune.
    last_change_id: i64,
    rollups: BTreeMap<String, ModelRollup>,
    /// Run ids that ever had a span started (they are `r0..rN` by construction).
    runs_started: BTreeSet<String>,
}

impl Model {
    fn span(&self, span_id: &str) -> Option<&ModelSpan> {
        self.spans.iter().find(|span| span.span_id == span_id)
    }

    fn span_mut(&mut self, span_id: &str) -> Option<&mut ModelSpan> {
        self.spans.iter_mut().find(|span| span.span_id == span_id)
    }

    /// The run's spans by `started_at` (unique by construction).
    fn run_spans(&self, run_id: &str) -> Vec<&ModelSpan> {
        let mut spans: Vec<&ModelSpan> = self
            .spans
            .iter()
            .filter(|span| span.run_id == run_id)
            .collect();
        spans.sort_by_key(|span| span.started_at);
        spans
    }

    fn high_water_seq(&self, run_id: &str) -> i64 {
        self.changes
            .iter()
            .filter(|change| change.run_id == run_id)
            .map(|change| change.seq)
            .max()
            .unwrap_or(0)
    }

    fn latest_change_cursor(&self) -> i64 {
        self.changes
            .iter()
            .map(|change| change.change_id)
            .max()
            .unwrap_or(0)
    }

    fn log_change(&mut self, run_id: &str, span_id: &str, event_index: Option<i64>) {
        let seq = self.high_water_seq(run_id) + 1;
        self.last_change_id += 1;
        self.changes.push(ModelChange {
            change_id: self.last_change_id,
            run_id: run_id.to_owned(),
            seq,
            span_id: span_id.to_owned(),
            event_index,
        });
    }

    fn start_span(
        &mut self,
        input: &StartSpanInput,
        writer: &str,
        clock: i64,
    ) -> Result<Value, String> {
        if self.span(&input.span_id).is_some() {
            // PRIMARY KEY violation: the transaction rolls back, nothing is written.
            return Err(input.span_id.clone());
        }
        let started_at = input.started_at.unwrap_or(clock);
        // `input.parentSpanId ? null : startedAt`: the empty string is falsy.
        let last_heartbeat_at = match input.parent_span_id.as_deref() {
            None | Some("") => Some(started_at),
            Some(_) => None,
        };
        let span = ModelSpan {
            span_id: input.span_id.clone(),
            run_id: input.run_id.clone(),
            parent_span_id: input.parent_span_id.clone(),
            name: input.name.clone(),
            kind: input.kind.as_str().to_owned(),
            origin: input.origin.as_str().to_owned(),
            session_id: input.session_id.clone(),
            job_name: input.job_name.clone(),
            attrs: input.attrs.clone().unwrap_or_default(),
            started_at,
            wait_until: None,
            ended_at: None,
            outcome: None,
            outcome_reason: None,
            usage: ModelUsage::default(),
            writer: writer.to_owned(),
            last_heartbeat_at,
        };
        let row = span.to_json();
        self.spans.push(span);
        self.runs_started.insert(input.run_id.clone());
        self.log_change(&input.run_id, &input.span_id, None);
        Ok(row)
    }

    fn end_span(&mut self, span_id: &str, input: &EndSpanInput, clock: i64) -> bool {
        let Some(span) = self.span_mut(span_id).filter(|span| span.is_open()) else {
            return false;
        };
        span.outcome = Some(input.outcome.as_str().to_owned());
        span.outcome_reason = input.reason.clone();
        span.ended_at = Some(input.ended_at.unwrap_or(clock));
        merge_attrs(&mut span.attrs, input.attrs.as_ref());
        span.usage.coalesce(input.usage.as_ref());
        let run_id = span.run_id.clone();
        self.log_change(&run_id, span_id, None);
        true
    }

    fn patch_span(&mut self, span_id: &str, patch: &SpanPatch) -> bool {
        let Some(span) = self.span_mut(span_id).filter(|span| span.is_open()) else {
            return false;
        };
        merge_attrs(&mut span.attrs, patch.attrs.as_ref());
        span.wait_until = patch.wait_until.or(span.wait_until);
        span.usage.coalesce(patch.usage.as_ref());
        let run_id = span.run_id.clone();
        // Even an empty patch logs a change.
        self.log_change(&run_id, span_id, None);
        true
    }

    fn append_event(
        &mut self,
        span_id: &str,
        event_type: &str,
        payload: Option<&Value>,
        ts: i64,
    ) -> Value {
        // Terminal spans accept events; only an unknown span is refused.
        let Some(run_id) = self.span(span_id).map(|span| span.run_id.clone()) else {
            return Value::Null;
        };
        let event_index = self
            .events
            .iter()
            .filter(|event| event.span_id == span_id)
            .map(|event| event.event_index + 1)
            .max()
            .unwrap_or(0);
        let (payload, truncated) = cap(payload);
        let event = ModelEvent {
            span_id: span_id.to_owned(),
            event_index,
            ts,
            event_type: event_type.to_owned(),
            payload,
            truncated,
        };
        let row = event.to_json();
        self.events.push(event);
        self.log_change(&run_id, span_id, Some(event_index));
        row
    }

    fn heartbeat(&mut self, span_id: &str, at: i64) {
        // Not change-logged; may move backwards; any open span, not only roots.
        if let Some(span) = self.span_mut(span_id).filter(|span| span.is_open()) {
            span.last_heartbeat_at = Some(at);
        }
    }

    /// `closeRunInTx`: open spans newest start first, all stamped with the clock, then a rollup
    /// if anything was closed.
    fn close_run(&mut self, run_id: &str, outcome: &SpanOutcome, reason: &str, clock: i64) -> i64 {
        let mut open: Vec<(i64, String)> = self
            .spans
            .iter()
            .filter(|span| span.run_id == run_id && span.is_open())
            .map(|span| (span.started_at, span.span_id.clone()))
            .collect();
        open.sort_by_key(|(started_at, _)| std::cmp::Reverse(*started_at));
        let input = EndSpanInput {
            outcome: outcome.clone(),
            reason: Some(reason.to_owned()),
            ended_at: None,
            usage: None,
            attrs: None,
        };
        let mut closed = 0;
        for (_, span_id) in open {
            if self.end_span(&span_id, &input, clock) {
                closed += 1;
            }
        }
        if closed > 0 {
            self.rollup_run(run_id);
        }
        closed
    }

    fn sweep_own_orphans(&mut self, clock: i64) -> i64 {
        let runs: BTreeSet<String> = self
            .spans
            .iter()
            .filter(|span| span.is_open() && span.origin == "session")
            .map(|span| span.run_id.clone())
            .collect();
        runs.iter()
            .map(|run_id| {
                self.close_run(run_id, &SpanOutcome::Interrupted, "server restarted", clock)
            })
            .sum()
    }

    fn sweep_stale(&mut self, writer: &str, stale_after_ms: i64, now: i64, clock: i64) -> i64 {
        let cutoff = now - stale_after_ms;
        let mut roots: Vec<(i64, String)> = self
            .spans
            .iter()
            .filter(|span| {
                span.is_open()
                    && span.is_root()
                    && span.writer != writer
                    && span.last_heartbeat_at.unwrap_or(span.started_at) < cutoff
            })
            .map(|span| (span.started_at, span.run_id.clone()))
            .collect();
        roots.sort();
        // A run with two stale roots is visited twice; the second visit closes nothing.
        roots
            .iter()
            .map(|(_, run_id)| {
                self.close_run(
                    run_id,
                    &SpanOutcome::Interrupted,
                    "writer went silent",
                    clock,
                )
            })
            .sum()
    }

    fn open_roots(&self) -> Vec<&ModelSpan> {
        let mut roots: Vec<&ModelSpan> = self
            .spans
            .iter()
            .filter(|span| span.is_open() && span.is_root())
            .collect();
        roots.sort_by_key(|span| span.started_at);
        roots
    }

    fn find_stuck(&self, threshold_ms: i64, now: i64) -> Value {
        let cutoff = now - threshold_ms;
        Value::Array(
            self.open_roots()
                .into_iter()
                .filter(|span| span.started_at < cutoff)
                .map(ModelSpan::to_json)
                .collect(),
        )
    }

    fn open_root_spans(&self) -> Value {
        Value::Array(
            self.open_roots()
                .into_iter()
                .rev()
                .map(ModelSpan::to_json)
                .collect(),
        )
    }

    /// The change joined with its span or event row as it is now; `None` when that row is gone.
    fn change_json(&self, change: &ModelChange) -> Option<Value> {
        let (kind, body) = match change.event_index {
            None => ("span", self.span(&change.span_id)?.to_json()),
            Some(index) => (
                "event",
                self.events
                    .iter()
                    .find(|event| event.span_id == change.span_id && event.event_index == index)?
                    .to_json(),
            ),
        };
        Some(json!({
            "changeId": change.change_id,
            "runId": change.run_id,
            "seq": change.seq,
            "kind": kind,
            kind: body,
        }))
    }

    fn changes_since(&self, cursor: i64, limit: i64) -> Value {
        let mut changes: Vec<Value> = self
            .changes
            .iter()
            .filter(|change| change.change_id > cursor)
            .filter_map(|change| self.change_json(change))
            .collect();
        match usize::try_from(limit) {
            Ok(limit) => changes.truncate(limit),
            // SQL LIMIT -n is unlimited, then `slice(0, -n)` drops the last n.
            Err(_) => {
                let keep = changes.len().saturating_sub(limit.unsigned_abs() as usize);
                changes.truncate(keep);
            }
        }
        Value::Array(changes)
    }

    fn terminal_root_changes_since(&self, cursor: i64, limit: i64) -> Value {
        let mut latest: BTreeMap<&str, i64> = BTreeMap::new();
        for change in &self.changes {
            if change.change_id <= cursor || change.event_index.is_some() {
                continue;
            }
            let Some(span) = self.span(&change.span_id) else {
                continue;
            };
            if span.is_root() && !span.is_open() {
                let entry = latest
                    .entry(span.span_id.as_str())
                    .or_insert(change.change_id);
                *entry = (*entry).max(change.change_id);
            }
        }
        let mut rows: Vec<(i64, &str)> = latest.into_iter().map(|(id, c)| (c, id)).collect();
        rows.sort();
        if let Ok(limit) = usize::try_from(limit) {
            rows.truncate(limit);
        }
        Value::Array(
            rows.into_iter()
                .filter_map(|(change_id, span_id)| {
                    let span = self.span(span_id)?;
                    Some(json!({ "changeId": change_id, "span": span.to_json() }))
                })
                .collect(),
        )
    }

    fn snapshot_run(&self, run_id: &str) -> Value {
        let spans = self.run_spans(run_id);
        if spans.is_empty() {
            return Value::Null;
        }
        // Ties on (ts, eventIndex) follow the spans' order (start time, then insertion).
        let mut events: Vec<(usize, &ModelEvent)> = self
            .events
            .iter()
            .filter_map(|event| {
                let span_position = spans
                    .iter()
                    .position(|span| span.span_id == event.span_id)?;
                Some((span_position, event))
            })
            .collect();
        events.sort_by_key(|(span_position, event)| (event.ts, event.event_index, *span_position));
        let events: Vec<&ModelEvent> = events.into_iter().map(|(_, event)| event).collect();
        json!({
            "runId": run_id,
            "spans": spans.iter().map(|span| span.to_json()).collect::<Vec<_>>(),
            "events": events.iter().map(|event| event.to_json()).collect::<Vec<_>>(),
            "highWaterSeq": self.high_water_seq(run_id),
            "changeCursor": self.latest_change_cursor(),
        })
    }

    fn rollup_run(&mut self, run_id: &str) {
        let spans = self.run_spans(run_id);
        let Some(root) = spans
            .iter()
            .find(|span| span.is_root())
            .or_else(|| spans.first())
        else {
            return;
        };
        let failure_reason = spans
            .iter()
            .find(|span| {
                matches!(span.outcome.as_deref(), Some("error" | "timeout"))
                    && span.outcome_reason.is_some()
            })
            .and_then(|span| span.outcome_reason.clone())
            .or_else(|| {
                (root.outcome.as_deref() == Some("interrupted")).then(|| "interrupted".to_owned())
            });
        let fresh = ModelRollup {
            origin: root.origin.clone(),
            name: root.name.clone(),
            session_id: root.session_id.clone(),
            job_name: root.job_name.clone(),
            started_at: root.started_at,
            ended_at: root.ended_at,
            outcome: root.outcome.clone(),
            duration_ms: root.ended_at.map(|ended| ended - root.started_at),
            span_count: spans.len() as i64,
            input_tokens: root.usage.input_tokens,
            output_tokens: root.usage.output_tokens,
            cache_read_tokens: root.usage.cache_read_tokens,
            cache_creation_tokens: root.usage.cache_creation_tokens,
            cost_usd: root.usage.cost_usd,
            failure_reason,
            detail_pruned: false,
        };
        match self.rollups.get_mut(run_id) {
            // ON CONFLICT: identity columns and detail_pruned keep their first values.
            Some(row) => {
                row.ended_at = fresh.ended_at;
                row.outcome = fresh.outcome;
                row.duration_ms = fresh.duration_ms;
                row.span_count = fresh.span_count;
                row.input_tokens = fresh.input_tokens;
                row.output_tokens = fresh.output_tokens;
                row.cache_read_tokens = fresh.cache_read_tokens;
                row.cache_creation_tokens = fresh.cache_creation_tokens;
                row.cost_usd = fresh.cost_usd;
                row.failure_reason = fresh.failure_reason;
            }
            None => {
                self.rollups.insert(run_id.to_owned(), fresh);
            }
        }
    }

    /// Prune candidates `(run_id, ended_at)` by `ended_at`.
    fn prune_candidates(&self, floor: i64, ceiling: i64) -> Vec<(String, i64)> {
        let mut candidates: Vec<(String, i64)> = self
            .rollups
            .iter()
            .filter(|(run_id, row)| {
                !row.detail_pruned
                    && !self
                        .spans
                        .iter()
                        .any(|span| &span.run_id == *run_id && span.is_open())
            })
            .filter_map(|(run_id, row)| {
                let ended = row.ended_at?;
                (ended < floor || ended < ceiling).then(|| (run_id.clone(), ended))
            })
            .collect();
        candidates.sort_by_key(|(_, ended)| *ended);
        candidates
    }

    fn prune_bounds(options: &PruneOptions, clock: i64) -> (i64, i64) {
        let now = options.now.unwrap_or(clock);
        (
            options.digest_floor_at.max(0),
            now - options.hard_ceiling_ms,
        )
    }

    /// Widen a batch that would cut between two candidates with the same `ended_at` (which
    /// of them the reference prunes is up to SQLite) to the end of that tie.
    fn tie_free_batch(&self, options: &PruneOptions, clock: i64) -> Option<i64> {
        let batch = options.batch?;
        let Ok(mut cut) = usize::try_from(batch) else {
            return Some(batch);
        };
        let (floor, ceiling) = Self::prune_bounds(options, clock);
        let ended: Vec<i64> = self
            .prune_candidates(floor, ceiling)
            .into_iter()
            .map(|(_, ended)| ended)
            .collect();
        while cut > 0 && cut < ended.len() && ended[cut - 1] == ended[cut] {
            cut += 1;
        }
        Some(cut as i64)
    }

    fn prune(&mut self, options: &PruneOptions, clock: i64) -> Value {
        let (floor, ceiling) = Self::prune_bounds(options, clock);
        let mut candidates = self.prune_candidates(floor, ceiling);
        if let Ok(batch) = usize::try_from(options.batch.unwrap_or(50)) {
            candidates.truncate(batch);
        }
        let mut spans_deleted = 0;
        for (run_id, ended) in &candidates {
            if let Some(row) = self.rollups.get_mut(run_id) {
                row.detail_pruned = true;
                if *ended >= floor {
                    // Pruned by the hard ceiling alone: the coverage gap shows on the rollup.
                    row.failure_reason
                        .get_or_insert_with(|| "digest coverage gap".to_owned());
                }
            }
            let doomed: BTreeSet<String> = self
                .spans
                .iter()
                .filter(|span| &span.run_id == run_id)
                .map(|span| span.span_id.clone())
                .collect();
            self.events.retain(|event| !doomed.contains(&event.span_id));
            self.spans.retain(|span| &span.run_id != run_id);
            self.changes.retain(|change| &change.run_id != run_id);
            spans_deleted += doomed.len() as i64;
        }
        json!({ "runsPruned": candidates.len(), "spansDeleted": spans_deleted })
    }

    /// Apply one call; `Err(span_id)` is the duplicate-span failure.
    fn apply(&mut self, call: &Call, clock: i64) -> Result<Value, String> {
        Ok(match call {
            Call::StartSpan { writer, input } => {
                return self.start_span(input, WRITERS[*writer], clock)
            }
            Call::EndSpan { span_id, input, .. } => json!(self.end_span(span_id, input, clock)),
            Call::PatchSpan { span_id, patch, .. } => json!(self.patch_span(span_id, patch)),
            Call::AppendEvent {
                span_id,
                event_type,
                payload,
                ts,
                ..
            } => self.append_event(span_id, event_type, payload.as_ref(), ts.unwrap_or(clock)),
            Call::Heartbeat { span_id, at, .. } => {
                self.heartbeat(span_id, at.unwrap_or(clock));
                Value::Null
            }
            Call::CascadeClose {
                run_id,
                outcome,
                reason,
                ..
            } => json!(self.close_run(run_id, outcome, reason, clock)),
            Call::SweepOwnOrphans { .. } => json!(self.sweep_own_orphans(clock)),
            Call::SweepStale {
                writer,
                stale_after_ms,
                now,
            } => json!(self.sweep_stale(
                WRITERS[*writer],
                *stale_after_ms,
                now.unwrap_or(clock),
                clock
            )),
            Call::FindStuck { threshold_ms, now } => {
                self.find_stuck(*threshold_ms, now.unwrap_or(clock))
            }
            Call::ChangesSince { cursor, limit } => self.changes_since(*cursor, *limit),
            Call::TerminalRootChangesSince { cursor, limit } => {
                self.terminal_root_changes_since(*cursor, *limit)
            }
            Call::LatestChangeCursor => json!(self.latest_change_cursor()),
            Call::SnapshotRun { run_id } => self.snapshot_run(run_id),
            Call::RunHighWaterSeq { run_id } => json!(self.high_water_seq(run_id)),
            Call::GetSpan { span_id } => self.span(span_id).map_or(Value::Null, ModelSpan::to_json),
            Call::OpenRootSpans => self.open_root_spans(),
            Call::RollupRun { run_id } => {
                self.rollup_run(run_id);
                Value::Null
            }
            Call::ReadRollup { run_id } => self
                .rollups
                .get(run_id)
                .map_or(Value::Null, |row| row.to_json(run_id)),
            Call::Prune { options } => self.prune(options, clock),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Concrete calls, on the model and on the store
// ---------------------------------------------------------------------------------------------

/// One store call with every argument resolved. `writer` indexes [`WRITERS`].
#[derive(Debug, Clone)]
enum Call {
    StartSpan {
        writer: usize,
        input: Box<StartSpanInput>,
    },
    EndSpan {
        writer: usize,
        span_id: String,
        input: Box<EndSpanInput>,
    },
    PatchSpan {
        writer: usize,
        span_id: String,
        patch: Box<SpanPatch>,
    },
    AppendEvent {
        writer: usize,
        span_id: String,
        event_type: String,
        payload: Option<Value>,
        ts: Option<i64>,
    },
    Heartbeat {
        writer: usize,
        span_id: String,
        at: Option<i64>,
    },
    CascadeClose {
        writer: usize,
        run_id: String,
        outcome: SpanOutcome,
        reason: String,
    },
    SweepOwnOrphans {
        writer: usize,
    },
    SweepStale {
        writer: usize,
        stale_after_ms: i64,
        now: Option<i64>,
    },
    FindStuck {
        threshold_ms: i64,
        now: Option<i64>,
    },
    ChangesSince {
        cursor: i64,
        limit: i64,
    },
    TerminalRootChangesSince {
        cursor: i64,
        limit: i64,
    },
    LatestChangeCursor,
    SnapshotRun {
        run_id: String,
    },
    RunHighWaterSeq {
        run_id: String,
    },
    GetSpan {
        span_id: String,
    },
    OpenRootSpans,
    RollupRun {
        run_id: String,
    },
    ReadRollup {
        run_id: String,
    },
    Prune {
        options: PruneOptions,
    },
}

/// A store result as JSON (a macro, not a function: this crate does not depend on `serde`).
macro_rules! to_json {
    () => {
        |value| {
            serde_json::to_value(value)
                .unwrap_or_else(|err| json!({ "unserializable": err.to_string() }))
        }
    };
}

async fn run_call(stores: &[Arc<dyn ActivityStore>; 2], call: &Call) -> Result<Value, StoreError> {
    let reader = &stores[0];
    match call {
        Call::StartSpan { writer, input } => stores[*writer]
            .start_span(input.as_ref().clone())
            .await
            .map(to_json!()),
        Call::EndSpan {
            writer,
            span_id,
            input,
        } => stores[*writer]
            .end_span(span_id, input.as_ref().clone())
            .await
            .map(to_json!()),
        Call::PatchSpan {
            writer,
            span_id,
            patch,
        } => stores[*writer]
            .patch_span(span_id, patch.as_ref().clone())
            .await
            .map(to_json!()),
        Call::AppendEvent {
            writer,
            span_id,
            event_type,
            payload,
            ts,
        } => stores[*writer]
            .append_event(span_id, event_type, payload.as_ref(), *ts)
            .await
            .map(to_json!()),
        Call::Heartbeat {
            writer,
            span_id,
            at,
        } => stores[*writer]
            .heartbeat(span_id, *at)
            .await
            .map(to_json!()),
        Call::CascadeClose {
            writer,
            run_id,
            outcome,
            reason,
        } => stores[*writer]
            .cascade_close(run_id, outcome.clone(), reason)
            .await
            .map(to_json!()),
        Call::SweepOwnOrphans { writer } => {
            stores[*writer].sweep_own_orphans().await.map(to_json!())
        }
        Call::SweepStale {
            writer,
            stale_after_ms,
            now,
        } => stores[*writer]
            .sweep_stale(*stale_after_ms, *now)
            .await
            .map(to_json!()),
        Call::FindStuck { threshold_ms, now } => {
            reader.find_stuck(*threshold_ms, *now).await.map(to_json!())
        }
        Call::ChangesSince { cursor, limit } => {
            reader.changes_since(*cursor, *limit).await.map(to_json!())
        }
        Call::TerminalRootChangesSince { cursor, limit } => reader
            .terminal_root_changes_since(*cursor, *limit)
            .await
            .map(to_json!()),
        Call::LatestChangeCursor => reader.latest_change_cursor().await.map(to_json!()),
        Call::SnapshotRun { run_id } => reader.snapshot_run(run_id).await.map(to_json!()),
        Call::RunHighWaterSeq { run_id } => reader.run_high_water_seq(run_id).await.map(to_json!()),
        Call::GetSpan { span_id } => reader.get_span(span_id).await.map(to_json!()),
        Call::OpenRootSpans => reader.open_root_spans().await.map(to_json!()),
        Call::RollupRun { run_id } => reader.rollup_run(run_id).await.map(to_json!()),
        Call::ReadRollup { run_id } => reader.read_rollup(run_id).await.map(to_json!()),
        Call::Prune { options } => reader.prune(options.clone()).await.map(to_json!()),
    }
}

/// Poll every future in order until all are done: each is first polled (and so queues its
/// write) in list order, so the writer thread sees the writes in that order, often in one group.
async fn join_in_order<F: Future>(mut futures: Vec<Pin<Box<F>>>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Long strings (the big payloads) shortened so a failure report stays readable.
fn abbreviate(value: &Value) -> Value {
    match value {
        Value::String(text) if text.len() > 80 => Value::String(format!(
            "<{} bytes: {}…{}>",
            text.len(),
            text.chars().take(24).collect::<String>(),
            text.chars()
                .rev()
                .take(24)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<String>()
        )),
        Value::Array(items) => Value::Array(items.iter().map(abbreviate).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, value)| (key.clone(), abbreviate(value)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn describe<E: std::fmt::Debug>(result: &Result<Value, E>) -> String {
    match result {
        Ok(value) => serde_json::to_string_pretty(&abbreviate(value)).unwrap_or_default(),
        Err(err) => format!("error {err:?}"),
    }
}

fn compare(
    step: &str,
    call: &Call,
    expected: &Result<Value, String>,
    actual: &Result<Value, StoreError>,
) -> Result<(), TestCaseError> {
    let same = match (expected, actual) {
        (Ok(expected), Ok(actual)) => expected == actual,
        (Err(expected), Err(StoreError::DuplicateSpan { span_id })) => expected == span_id,
        _ => false,
    };
    if same {
        return Ok(());
    }
    let mut call_text = format!("{call:?}");
    if call_text.len() > 400 {
        call_text = format!("{}…", call_text.chars().take(400).collect::<String>());
    }
    Err(TestCaseError::fail(format!(
        "{step}\ncall: {call_text}\nmodel (reference) says: {}\nstore says: {}",
        describe(expected),
        describe(actual)
    )))
}

// ---------------------------------------------------------------------------------------------
// Generated operations
// ---------------------------------------------------------------------------------------------

/// Which span an op targets.
#[derive(Debug, Clone)]
enum Target {
    /// One of the span ids, whatever state it is in (or none).
    Id(usize),
    /// The n-th (modulo their number) open span by start time, when there is one; else `s0`.
    Open(usize),
    /// The n-th (modulo their number) span by start time, open or not; else `s0`.
    Existing(usize),
}

/// Which parent a started span names.
#[derive(Debug, Clone)]
enum Parent {
    /// A root (`parentSpanId` absent).
    None,
    /// `parentSpanId: ""`: heartbeated like a root, a root nowhere else.
    Empty,
    /// One of the span ids (it may or may not exist, may even be the span itself).
    Span(usize),
    /// An id that never exists.
    Unknown,
}

/// An event payload; the big ones are described by length so a shrunk case stays readable.
#[derive(Debug, Clone)]
enum Payload {
    Absent,
    Json(Value),
    /// `"x" * n`: JSON length n + 2.
    LongString(usize),
    /// `"q" * (n - 2) + "\"\n"`: n characters, JSON length n + 4 (escapes count).
    LongEscaped(usize),
    /// `{"z": 1, "data": "b" * n}`: JSON length n + 17.
    LongObject(usize),
    /// A tool-call-like object of about `len` bytes whose text varies with `seed`.
    Varied {
        seed: u64,
        len: usize,
    },
}

impl Payload {
    fn to_value(&self) -> Option<Value> {
        match self {
            Payload::Absent => None,
            Payload::Json(value) => Some(value.clone()),
            Payload::LongString(len) => Some(Value::String("x".repeat(*len))),
            Payload::LongEscaped(len) => Some(Value::String(format!(
                "{}\"\n",
                "q".repeat(len.saturating_sub(2))
            ))),
            Payload::LongObject(len) => Some(json!({ "z": 1, "data": "b".repeat(*len) })),
            Payload::Varied { seed, len } => {
                let mut state = *seed;
                let mut output = String::new();
                while output.len() < *len {
                    // A small LCG: varied but repetitive text, like real tool output.
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let word = ["src", "lib", "tests", "crates", "main", "mod"]
                        [(state >> 60) as usize % 6];
                    output.push_str(&format!(
                        "{word}/file_{}.rs: {} lines\n",
                        (state >> 40) % 97,
                        (state >> 20) % 1000
                    ));
                }
                Some(json!({ "tool": "bash", "seed": seed, "output": output }))
            }
        }
    }
}

#[derive(Debug, Clone)]
struct StartOp {
    span: usize,
    /// Remapped at run time so run ids are first used in ascending order.
    run: usize,
    parent: Parent,
    name: usize,
    kind: usize,
    session_origin: bool,
    session_id: Option<usize>,
    job_name: Option<usize>,
    attrs: Option<JsonObject>,
    /// An explicit `startedAt` this far before the (just advanced) clock.
    started_back: Option<i64>,
    writer: usize,
}

#[derive(Debug, Clone)]
struct EndOp {
    span: Target,
    outcome: usize,
    reason: Option<usize>,
    /// An explicit `endedAt` this far before the clock (negative: after it).
    ended_back: Option<i64>,
    usage: Option<SpanUsage>,
    attrs: Option<JsonObject>,
    writer: usize,
}

#[derive(Debug, Clone)]
struct PatchOp {
    span: Target,
    attrs: Option<JsonObject>,
    usage: Option<SpanUsage>,
    wait_ahead: Option<i64>,
    writer: usize,
}

#[derive(Debug, Clone)]
struct AppendOp {
    span: Target,
    event_type: usize,
    payload: Payload,
    ts_back: Option<i64>,
    writer: usize,
}

#[derive(Debug, Clone)]
enum Floor {
    Zero,
    Negative,
    /// This far before the clock (negative: after it).
    Back(i64),
}

#[derive(Debug, Clone)]
struct PruneOp {
    floor: Floor,
    hard_ceiling_ms: i64,
    now_back: Option<i64>,
    batch: Option<i64>,
}

#[derive(Debug, Clone)]
enum Op {
    /// Move the clock forward by `tens * 10` ms.
    Advance {
        tens: i64,
    },
    Start(StartOp),
    End(EndOp),
    Patch(PatchOp),
    Append(AppendOp),
    Heartbeat {
        span: Target,
        back: Option<i64>,
        writer: usize,
    },
    CascadeClose {
        run: usize,
        outcome: usize,
        reason: usize,
        writer: usize,
    },
    SweepOwnOrphans {
        writer: usize,
    },
    SweepStale {
        writer: usize,
        stale_after_ms: i64,
        now_back: Option<i64>,
    },
    FindStuck {
        threshold_ms: i64,
        now_back: Option<i64>,
    },
    ChangesSince {
        cursor: i64,
        limit: i64,
    },
    TerminalRootChangesSince {
        cursor: i64,
        limit: i64,
    },
    LatestChangeCursor,
    SnapshotRun {
        run: usize,
    },
    RunHighWaterSeq {
        run: usize,
    },
    GetSpan {
        span: usize,
    },
    OpenRootSpans,
    RollupRun {
        run: usize,
    },
    ReadRollup {
        run: usize,
    },
    Prune(PruneOp),
    /// `count` appends of large, varied payloads, one after the other. Used by the warm-up of
    /// [`with_a_trained_payload_dictionary`]: one burst is enough for the store to train its
    /// payload compression dictionary (it samples the first 256 KB of payloads).
    AppendBurst {
        span: Target,
        count: u64,
        len: usize,
    },
    /// Writes queued together (they usually share one group transaction); compared as if
    /// performed one after the other, which is what the store promises.
    Group(Vec<Op>),
    /// Compare every span, run, rollup and the whole change log.
    CheckAll,
}

impl Op {
    /// Starts and appends get a fresh clock step so every `startedAt` and `ts` is unique.
    fn takes_a_tick(&self) -> bool {
        matches!(self, Op::Start(_) | Op::Append(_))
    }
}

fn small_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..1000).prop_map(Value::from),
        (0u8..12).prop_map(|quarters| json!(f64::from(quarters) * 0.25)),
        prop::sample::select(vec![
            "",
            "x",
            "hello",
            "quote\"back\\slash",
            "line\nbreak",
            "ünï"
        ])
        .prop_map(Value::from),
        (0i64..5).prop_map(|n| json!({ "n": n, "list": [n, "two", null] })),
    ]
}

fn attrs() -> impl Strategy<Value = JsonObject> {
    prop::collection::vec(
        (
            prop::sample::select(vec!["a", "b", "c", "d"]),
            small_value(),
        ),
        0..4,
    )
    .prop_map(|pairs| {
        pairs
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect()
    })
}

fn usage() -> impl Strategy<Value = SpanUsage> {
    (
        prop::option::of(0i64..500),
        prop::option::of(0i64..500),
        prop::option::of(0i64..50),
        prop::option::of(0i64..50),
        prop::option::of((0u8..16).prop_map(|quarters| f64::from(quarters) * 0.25)),
        prop::option::of(prop::sample::select(vec!["m-small", "m-large"]).prop_map(String::from)),
    )
        .prop_map(
            |(
                input_tokens,
                output_tokens,
                cache_read_tokens,
                cache_creation_tokens,
                cost_usd,
                model,
            )| {
                SpanUsage {
                    input_tokens,
                    output_tokens,
                    cache_read_tokens,
                    cache_creation_tokens,
                    cost_usd,
                    model,
                }
            },
        )
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        3 => Just(Payload::Absent),
        8 => small_value().prop_map(Payload::Json),
        1 => prop_oneof![(16_380usize..16_387), Just(20_000usize)].prop_map(Payload::LongString),
        1 => (16_378usize..16_383).prop_map(Payload::LongEscaped),
        1 => prop_oneof![(16_365usize..16_370), Just(18_000usize)].prop_map(Payload::LongObject),
        4 => (any::<u64>(), 64usize..3_000).prop_map(|(seed, len)| Payload::Varied { seed, len }),
    ]
}

fn span_index() -> impl Strategy<Value = usize> {
    0..SPAN_IDS.len()
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        1 => span_index().prop_map(Target::Id),
        1 => (0usize..4).prop_map(Target::Open),
    ]
}

fn run_index() -> impl Strategy<Value = usize> {
    0..RUN_IDS.len()
}

fn writer_index() -> impl Strategy<Value = usize> {
    prop_oneof![2 => Just(0usize), 1 => Just(1usize)]
}

fn start_op() -> impl Strategy<Value = Op> {
    let parent = prop_oneof![
        4 => Just(Parent::None),
        1 => Just(Parent::Empty),
        4 => span_index().prop_map(Parent::Span),
        1 => Just(Parent::Unknown),
    ];
    (
        (span_index(), run_index(), parent, writer_index()),
        (0..NAMES.len(), 0usize..4, any::<bool>()),
        (
            prop::option::of(0..SESSION_IDS.len()),
            prop::option::of(0..JOB_NAMES.len()),
            prop::option::of(attrs()),
            prop::option::weighted(0.3, 1..TICK),
        ),
    )
        .prop_map(
            |(
                (span, run, parent, writer),
                (name, kind, session_origin),
                (session_id, job_name, attrs, started_back),
            )| {
                Op::Start(StartOp {
                    span,
                    run,
                    parent,
                    name,
                    kind,
                    session_origin,
                    session_id,
                    job_name,
                    attrs,
                    started_back,
                    writer,
                })
            },
        )
}

fn end_op() -> impl Strategy<Value = Op> {
    (
        target(),
        0usize..6,
        prop::option::of(0..REASONS.len()),
        prop::option::weighted(0.3, -500i64..3000),
        prop::option::of(usage()),
        prop::option::of(attrs()),
        writer_index(),
    )
        .prop_map(
            |(span, outcome, reason, ended_back, usage, attrs, writer)| {
                Op::End(EndOp {
                    span,
                    outcome,
                    reason,
                    ended_back,
                    usage,
                    attrs,
                    writer,
                })
            },
        )
}

fn patch_op() -> impl Strategy<Value = Op> {
    (
        target(),
        prop::option::of(attrs()),
        prop::option::of(usage()),
        prop::option::of(0i64..5000),
        writer_index(),
    )
        .prop_map(|(span, attrs, usage, wait_ahead, writer)| {
            Op::Patch(PatchOp {
                span,
                attrs,
                usage,
                wait_ahead,
                writer,
            })
        })
}

fn append_op() -> impl Strategy<Value = Op> {
    (
        target(),
        0..EVENT_TYPES.len(),
        payload(),
        prop::option::weighted(0.3, 1..TICK),
        writer_index(),
    )
        .prop_map(|(span, event_type, payload, ts_back, writer)| {
            Op::Append(AppendOp {
                span,
                event_type,
                payload,
                ts_back,
                writer,
            })
        })
}

fn heartbeat_op() -> impl Strategy<Value = Op> {
    (target(), prop::option::of(-200i64..3000), writer_index())
        .prop_map(|(span, back, writer)| Op::Heartbeat { span, back, writer })
}

fn cascade_op() -> impl Strategy<Value = Op> {
    (run_index(), 0usize..6, 0..REASONS.len(), writer_index()).prop_map(
        |(run, outcome, reason, writer)| Op::CascadeClose {
            run,
            outcome,
            reason,
            writer,
        },
    )
}

fn prune_op() -> impl Strategy<Value = Op> {
    let floor = prop_oneof![
        2 => Just(Floor::Zero),
        1 => Just(Floor::Negative),
        4 => (-3000i64..1000).prop_map(Floor::Back),
    ];
    let hard_ceiling_ms = prop_oneof![4 => 0i64..1000, 1 => Just(1_000_000_000i64)];
    let batch = prop_oneof![
        2 => Just(None),
        1 => Just(Some(0i64)),
        2 => Just(Some(1i64)),
        1 => Just(Some(2i64)),
        1 => Just(Some(-1i64)),
    ];
    (
        floor,
        hard_ceiling_ms,
        prop::option::of(-1000i64..1000),
        batch,
    )
        .prop_map(|(floor, hard_ceiling_ms, now_back, batch)| {
            Op::Prune(PruneOp {
                floor,
                hard_ceiling_ms,
                now_back,
                batch,
            })
        })
}

/// Writes that may share a group: no sweeps (their candidate read happens before the queued
/// writes ahead of them commit, so they are not sequentially comparable) and no reads.
fn group_member() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => start_op(),
        3 => end_op(),
        2 => patch_op(),
        3 => append_op(),
        1 => heartbeat_op(),
        1 => cascade_op(),
        1 => run_index().prop_map(|run| Op::RollupRun { run }),
        1 => prune_op(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let limit = prop_oneof![
        1 => Just(0i64),
        4 => 1i64..4,
        1 => Just(7i64),
        2 => Just(500i64),
        1 => -3i64..0,
    ];
    let terminal_limit = prop_oneof![
        1 => Just(0i64),
        3 => 1i64..3,
        2 => Just(500i64),
        1 => Just(-1i64),
    ];
    prop_oneof![
        6 => start_op(),
        4 => end_op(),
        2 => patch_op(),
        4 => append_op(),
        2 => heartbeat_op(),
        3 => (1i64..300).prop_map(|tens| Op::Advance { tens }),
        2 => cascade_op(),
        1 => writer_index().prop_map(|writer| Op::SweepOwnOrphans { writer }),
        3 => (prop_oneof![Just(0usize), Just(1usize)], 0i64..600, prop::option::of(-1000i64..1000)).prop_map(
            |(writer, stale_after_ms, now_back)| Op::SweepStale {
                writer,
                stale_after_ms,
                now_back,
            }
        ),
        1 => (0i64..600, prop::option::of(-1000i64..1000))
            .prop_map(|(threshold_ms, now_back)| Op::FindStuck { threshold_ms, now_back }),
        2 => (-1i64..40, limit).prop_map(|(cursor, limit)| Op::ChangesSince { cursor, limit }),
        1 => (-1i64..40, terminal_limit)
            .prop_map(|(cursor, limit)| Op::TerminalRootChangesSince { cursor, limit }),
        1 => Just(Op::LatestChangeCursor),
        1 => run_index().prop_map(|run| Op::SnapshotRun { run }),
        1 => run_index().prop_map(|run| Op::RunHighWaterSeq { run }),
        1 => span_index().prop_map(|span| Op::GetSpan { span }),
        1 => Just(Op::OpenRootSpans),
        2 => run_index().prop_map(|run| Op::RollupRun { run }),
        1 => run_index().prop_map(|run| Op::ReadRollup { run }),
        3 => prune_op(),
        2 => prop::collection::vec(group_member(), 2..6).prop_map(Op::Group),
        1 => Just(Op::CheckAll),
    ]
}

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

struct Harness {
    model: Model,
    /// The clock's value, mirrored: the model reads this, the store reads `clock`.
    now: i64,
    clock: Arc<ManualClock>,
    /// The default instance ("w1") and a second writer identity over the same database.
    stores: [Arc<dyn ActivityStore>; 2],
}

impl Harness {
    fn set_clock(&mut self, now: i64) {
        self.now = now;
        self.clock.set(now);
    }

    fn target(&self, target: &Target) -> String {
        let (n, open_only) = match target {
            Target::Id(index) => return SPAN_IDS[*index].to_owned(),
            Target::Open(n) => (n, true),
            Target::Existing(n) => (n, false),
        };
        let mut spans: Vec<&ModelSpan> = self
            .model
            .spans
            .iter()
            .filter(|span| span.is_open() || !open_only)
            .collect();
        spans.sort_by_key(|span| span.started_at);
        match spans.len() {
            0 => SPAN_IDS[0].to_owned(),
            len => spans[n % len].span_id.clone(),
        }
    }

    /// Turn a generated op into a concrete call, given the model's state at that point.
    /// `fresh_time` is the unique time a start or append inside a group must use.
    fn resolve(&self, op: &Op, fresh_time: Option<i64>) -> Call {
        let now = self.now;
        match op {
            Op::Start(start) => {
                // First uses of run ids come in ascending order (FORMAT.md 3.5).
                let run = start.run.min(self.model.runs_started.len());
                let parent_span_id = match start.parent {
                    Parent::None => None,
                    Parent::Empty => Some(String::new()),
                    Parent::Span(index) => Some(SPAN_IDS[index].to_owned()),
                    Parent::Unknown => Some("nobody".to_owned()),
                };
                let origin = if start.session_origin {
                    SpanOrigin::Session
                } else {
                    SpanOrigin::Cron
                };
                Call::StartSpan {
                    writer: start.writer,
                    input: Box::new(StartSpanInput {
                        span_id: SPAN_IDS[start.span].to_owned(),
                        run_id: RUN_IDS[run].to_owned(),
                        parent_span_id,
                        name: NAMES[start.name].to_owned(),
                        kind: kind(start.kind),
                        origin,
                        session_id: start.session_id.map(|i| SESSION_IDS[i].to_owned()),
                        job_name: start.job_name.map(|i| JOB_NAMES[i].to_owned()),
                        attrs: start.attrs.clone(),
                        started_at: fresh_time.or(start.started_back.map(|back| now - back)),
                    }),
                }
            }
            Op::End(end) => Call::EndSpan {
                writer: end.writer,
                span_id: self.target(&end.span),
                input: Box::new(EndSpanInput {
                    outcome: outcome(end.outcome),
                    reason: end.reason.map(|i| REASONS[i].to_owned()),
                    ended_at: end.ended_back.map(|back| now - back),
                    usage: end.usage.clone(),
                    attrs: end.attrs.clone(),
                }),
            },
            Op::Patch(patch) => Call::PatchSpan {
                writer: patch.writer,
                span_id: self.target(&patch.span),
                patch: Box::new(SpanPatch {
                    attrs: patch.attrs.clone(),
                    usage: patch.usage.clone(),
                    wait_until: patch.wait_ahead.map(|ahead| now + ahead),
                }),
            },
            Op::Append(append) => Call::AppendEvent {
                writer: append.writer,
                span_id: self.target(&append.span),
                event_type: EVENT_TYPES[append.event_type].to_owned(),
                payload: append.payload.to_value(),
                ts: fresh_time.or(append.ts_back.map(|back| now - back)),
            },
            Op::Heartbeat { span, back, writer } => Call::Heartbeat {
                writer: *writer,
                span_id: self.target(span),
                at: back.map(|back| now - back),
            },
            Op::CascadeClose {
                run,
                outcome: which,
                reason,
                writer,
            } => Call::CascadeClose {
                writer: *writer,
                run_id: RUN_IDS[*run].to_owned(),
                outcome: outcome(*which),
                reason: REASONS[*reason].to_owned(),
            },
            Op::SweepOwnOrphans { writer } => Call::SweepOwnOrphans { writer: *writer },
            Op::SweepStale {
                writer,
                stale_after_ms,
                now_back,
            } => Call::SweepStale {
                writer: *writer,
                stale_after_ms: *stale_after_ms,
                now: now_back.map(|back| now - back),
            },
            Op::FindStuck {
                threshold_ms,
                now_back,
            } => Call::FindStuck {
                threshold_ms: *threshold_ms,
                now: now_back.map(|back| now - back),
            },
            Op::ChangesSince { cursor, limit } => Call::ChangesSince {
                cursor: *cursor,
                limit: *limit,
            },
            Op::TerminalRootChangesSince { cursor, limit } => Call::TerminalRootChangesSince {
                cursor: *cursor,
                limit: *limit,
            },
            Op::LatestChangeCursor => Call::LatestChangeCursor,
            Op::SnapshotRun { run } => Call::SnapshotRun {
                run_id: RUN_IDS[*run].to_owned(),
            },
            Op::RunHighWaterSeq { run } => Call::RunHighWaterSeq {
                run_id: RUN_IDS[*run].to_owned(),
            },
            Op::GetSpan { span } => Call::GetSpan {
                span_id: SPAN_IDS[*span].to_owned(),
            },
            Op::OpenRootSpans => Call::OpenRootSpans,
            Op::RollupRun { run } => Call::RollupRun {
                run_id: RUN_IDS[*run].to_owned(),
            },
            Op::ReadRollup { run } => Call::ReadRollup {
                run_id: RUN_IDS[*run].to_owned(),
            },
            Op::Prune(prune) => {
                let mut options = PruneOptions {
                    max_spans: None,
                    digest_floor_at: match prune.floor {
                        Floor::Zero => 0,
                        Floor::Negative => -1_000,
                        Floor::Back(back) => now - back,
                    },
                    hard_ceiling_ms: prune.hard_ceiling_ms,
                    now: prune.now_back.map(|back| now - back),
                    batch: prune.batch,
                    scheduled: false,
                };
                options.batch = self.model.tie_free_batch(&options, now);
                Call::Prune { options }
            }
            // Handled by `step`; never resolved as one call.
            Op::Advance { .. } | Op::AppendBurst { .. } | Op::Group(_) | Op::CheckAll => {
                Call::LatestChangeCursor
            }
        }
    }

    async fn check(&mut self, step: &str, call: &Call) -> Result<(), TestCaseError> {
        let expected = self.model.apply(call, self.now);
        let actual = run_call(&self.stores, call).await;
        compare(step, call, &expected, &actual)
    }

    /// Perform one generated op on both sides; `step` names it in a failure report.
    async fn step(&mut self, step: &str, op: &Op) -> Result<(), TestCaseError> {
        match op {
            Op::Advance { tens } => {
                self.set_clock(self.now + TICK * tens);
                Ok(())
            }
            Op::CheckAll => self.check_all(step).await,
            Op::AppendBurst { span, count, len } => {
                for seed in 0..*count {
                    let append = Op::Append(AppendOp {
                        span: span.clone(),
                        event_type: 0,
                        payload: Payload::Varied {
                            seed: seed + self.model.last_change_id.unsigned_abs(),
                            len: *len,
                        },
                        ts_back: None,
                        writer: 0,
                    });
                    self.set_clock(self.now + TICK);
                    let call = self.resolve(&append, None);
                    self.check(step, &call).await?;
                }
                Ok(())
            }
            Op::Group(members) => {
                // All members read the clock when queued, so it moves once, up front; starts
                // and appends get distinct explicit times inside that move.
                let before = self.now;
                let ticks = members
                    .iter()
                    .filter(|member| member.takes_a_tick())
                    .count();
                self.set_clock(before + TICK * ticks as i64);
                let mut calls = Vec::with_capacity(members.len());
                let mut expected = Vec::with_capacity(members.len());
                let mut tick = 0;
                for member in members {
                    let fresh_time = member.takes_a_tick().then(|| {
                        tick += 1;
                        before + TICK * tick - TICK / 2
                    });
                    let call = self.resolve(member, fresh_time);
                    expected.push(self.model.apply(&call, self.now));
                    calls.push(call);
                }
                let stores = &self.stores;
                let actual = join_in_order(
                    calls
                        .iter()
                        .map(|call| Box::pin(run_call(stores, call)))
                        .collect(),
                )
                .await;
                for ((call, expected), actual) in calls.iter().zip(&expected).zip(&actual) {
                    compare(step, call, expected, actual)?;
                }
                Ok(())
            }
            _ => {
                if op.takes_a_tick() {
                    self.set_clock(self.now + TICK);
                }
                let call = self.resolve(op, None);
                self.check(step, &call).await
            }
        }
    }

    /// Every observable piece of state: each span, each run's snapshot, seq and rollup, the
    /// whole change log, the terminal roots, the open roots.
    async fn check_all(&mut self, step: &str) -> Result<(), TestCaseError> {
        let mut calls = vec![
            Call::LatestChangeCursor,
            Call::ChangesSince {
                cursor: -1,
                limit: 1_000_000,
            },
            Call::TerminalRootChangesSince {
                cursor: -1,
                limit: -1,
            },
            Call::OpenRootSpans,
            Call::FindStuck {
                threshold_ms: 0,
                now: Some(i64::MAX / 4),
            },
        ];
        calls.extend(SPAN_IDS.iter().map(|span_id| Call::GetSpan {
            span_id: (*span_id).to_owned(),
        }));
        for run_id in RUN_IDS {
            let run_id = run_id.to_owned();
            calls.push(Call::SnapshotRun {
                run_id: run_id.clone(),
            });
            calls.push(Call::RunHighWaterSeq {
                run_id: run_id.clone(),
            });
            calls.push(Call::ReadRollup { run_id });
        }
        for call in &calls {
            self.check(step, call).await?;
        }
        Ok(())
    }
}

/// Ops performed before the generated ones, and how long to let the store's background work
/// (dictionary training) run after them.
struct WarmUp {
    ops: Vec<Op>,
    pause: Duration,
    /// Ops performed after the pause, before the generated ones.
    then: Vec<Op>,
}

impl WarmUp {
    fn none() -> Self {
        Self {
            ops: Vec::new(),
            pause: Duration::ZERO,
            then: Vec::new(),
        }
    }

    /// A span and a burst of large payloads, then a pause: training takes about 0.2 s in a
    /// debug build, so a few more appends and the generated ops then (almost always) write and
    /// read compressed payloads. Nothing is asserted about compression itself: it must be
    /// invisible.
    fn trained_dictionary() -> Self {
        let start = Op::Start(StartOp {
            span: 0,
            run: 0,
            parent: Parent::None,
            name: 0,
            kind: 0,
            session_origin: false,
            session_id: None,
            job_name: None,
            attrs: None,
            started_back: None,
            writer: 0,
        });
        let burst = Op::AppendBurst {
            span: Target::Existing(0),
            count: 22,
            len: 14_000,
        };
        let compressed = Op::AppendBurst {
            span: Target::Existing(0),
            count: 4,
            len: 1_500,
        };
        Self {
            ops: vec![start, burst],
            pause: Duration::from_millis(500),
            then: vec![compressed],
        }
    }
}

async fn run_case(warm_up: &WarmUp, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|err| TestCaseError::fail(format!("temp dir: {err}")))?;
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("model.db")))
        .map_err(|err| TestCaseError::fail(format!("open: {err}")))?;
    let clock = Arc::new(ManualClock::new(START_CLOCK));
    let first: Arc<dyn ActivityStore> = Arc::new(SqliteActivityStore::with_identity(
        db,
        clock.clone(),
        WRITERS[0],
    ));
    let second = first.with_writer(WRITERS[1]);
    let mut harness = Harness {
        model: Model::default(),
        now: START_CLOCK,
        clock,
        stores: [first, second],
    };
    for (index, op) in warm_up.ops.iter().enumerate() {
        harness
            .step(&format!("warm-up #{index} {op:?}"), op)
            .await?;
    }
    if !warm_up.pause.is_zero() {
        // Nothing else runs on this runtime: blocking it only lets the store's threads work.
        std::thread::sleep(warm_up.pause);
    }
    for (index, op) in warm_up.then.iter().enumerate() {
        harness
            .step(&format!("warm-up, after the pause, #{index} {op:?}"), op)
            .await?;
    }
    for (index, op) in ops.iter().enumerate() {
        harness.step(&format!("op #{index} {op:?}"), op).await?;
    }
    harness.check_all("final state").await
}

/// Run `cases` random sequences (`PROPTEST_CASES` overrides it), each after `warm_up`.
fn check_against_the_model(cases: u32, warm_up: WarmUp) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(cases);
    let config = ProptestConfig {
        cases,
        // Keep the work tree clean: a failure prints its shrunk sequence instead.
        failure_persistence: None,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let outcome = runner.run(&prop::collection::vec(op(), 1..80), |ops| {
        runtime.block_on(run_case(&warm_up, ops))
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}

#[test]
fn sqlite_store_behaves_like_the_reference_model() {
    check_against_the_model(64, WarmUp::none());
}

/// The same property once the store compresses event payloads with a trained dictionary.
#[test]
fn with_a_trained_payload_dictionary() {
    check_against_the_model(12, WarmUp::trained_dictionary());
}
