//! Extreme inputs through every method of both SQLite stores, checked against a small model.
//!
//! The HTTP layer validates what reaches the stores, but their Rust API is a public interface of
//! its own, used in-process. Its rule: bad input gets a clear typed error, never a panic (no
//! unwrap, no arithmetic overflow, no index out of bounds), and nothing already acknowledged is
//! ever lost, changed or made unreadable. `model.rs` and `journal_model.rs` check the semantics
//! with sane values; this file exists to check that rule where the values are not sane.
//!
//! `every_operation_survives_extreme_inputs` is a bounded property test (64 cases from a fixed
//! seed, each up to 80 random calls) driving every method of the activity store and of the
//! engagement journal through one SQLite file, acting as three writer identities (`w1`, one with
//! NUL bytes and an emoji, one 100 KB long). Its inputs come from small pools of extremes: ids
//! that are empty, 100 KB long, hold NUL bytes, RTL marks, emoji, odd code points, SQL, quotes and
//! the LIKE and GLOB wildcards (the same ids serve as span, run, parent and engagement ids);
//! times, cursors, limits, seqs and batch sizes at `i64::MIN`/`MAX`, ±1, ±2^53 and 0; token
//! counts at the `i64` bounds, costs NaN, infinite and `f64::MAX`; payloads around the
//! 16,384-byte cap with 2-, 3- and 4-byte characters at every offset of the boundary, and nested
//! 60 to 300 levels; attrs nested to the 64-level limit and past it; journal retention at 0, 1
//! and `u64::MAX` events and extreme ages. Every call's result is compared with what the model
//! says was acknowledged, so a wrong answer fails as surely as a panic (a panic on the writer
//! thread shows up as `Closed` and fails too). After each sequence everything is read back, the
//! file is reopened and read back again, every surviving span id must still be refused as a
//! duplicate, and new writes must work.
//!
//! The model is kept small: plain vectors of the rows the store should hold, and the rules of
//! the store's current semantics (a NaN cost is stored as absent, an infinite one as itself;
//! stored JSON nests at most 64 levels, deeper attrs and payloads are refused with
//! `InvalidInput` and write nothing; ties in time are broken by insertion order). The rollup
//! figures come from the core's pure `compute_rollup` over the model's spans, and the journal's
//! model is the in-memory journal, which the conformance fixtures pin to the reference.
//!
//! The hand-written tests below pin the cases a random walk reaches rarely: wildcard ids, parent
//! loops, calls out of order, every time extreme through one span's life, every cursor and limit
//! of the change feeds, prune option extremes, saturating rollup sums, the payload cap on the
//! compressed storage path, and journal extremes. The defect this file found (an imported run's
//! rollup with a NaN root cost) is fixed and pinned at its end by a minimal case.

mod reference_json;
use reference_json::js_normalized;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use flightlog_core::activity::{
    cap_payload, compute_rollup, rootless_usage, ActivityChange, ActivityStore, ActivityWrite,
    ActivityWriteResult, ChangeBody, ChangeDoorbell, EncodedAttrs, EndSpanInput, ImportRejection,
    ImportReport, ImportedAttrs, ImportedEnd, ImportedEvent, ImportedSpan, JsonObject, PayloadText,
    PruneOptions, PruneResult, RollupSpan, RunCursor, RunListEntry, RunListQuery, RunPage,
    RunRollupRow, RunSnapshot, RunState, SpanEventRow, SpanKind, SpanOrigin, SpanOutcome,
    SpanPatch, SpanRow, SpanUsage, StartSpanInput, StoreError, TerminalRootChange,
};
use flightlog_core::journal::{
    AppendInput, EngagementEvent, EngagementJournal, EngagementSummary, InMemoryEngagementJournal,
    JournalError, JournalSubscription, RetentionConfig,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::value::RawValue;
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Pools of extreme inputs
// ---------------------------------------------------------------------------------------------

/// The event payload cap and its marker, restated on purpose.
const CAP: usize = 16_384;
const MARKER: &str = "…[truncated]";
/// The deepest stored JSON may nest (the attrs object, or the payload value, is level 1).
const MAX_DEPTH: usize = 64;
/// `2^53 - 1`, the largest journal `at`.
const MAX_SAFE: i64 = (1 << 53) - 1;
/// Where the clock starts.
const START_CLOCK: i64 = 1_000;

/// Times, and anything else measured in milliseconds.
const TIMES: [i64; 10] = [
    0,
    1,
    -1,
    START_CLOCK,
    i64::MIN,
    i64::MAX,
    i64::MIN + 1,
    i64::MAX - 1,
    1 << 53,
    -(1 << 53),
];
/// Change cursors.
const CURSORS: [i64; 11] = [i64::MIN, -1, 0, 1, 2, 3, 5, 8, 13, 1 << 53, i64::MAX];
/// Page sizes.
const LIMITS: [i64; 10] = [i64::MIN, -(1 << 53), -2, -1, 0, 1, 2, 5, 1 << 53, i64::MAX];
/// Prune batch sizes.
const PRUNE_BATCHES: [Option<i64>; 8] = [
    None,
    Some(i64::MIN),
    Some(-1),
    Some(0),
    Some(1),
    Some(2),
    Some(1 << 53),
    Some(i64::MAX),
];
/// Journal seqs (`expected_seq`, `read_from`).
const SEQS: [i64; 8] = [i64::MIN, -1, 0, 1, 2, 20, 1 << 53, i64::MAX];
/// Journal event times: valid ones, then ones validation refuses.
const JOURNAL_ATS: [i64; 10] = [
    0,
    1,
    -1,
    START_CLOCK,
    MAX_SAFE,
    -MAX_SAFE,
    1 << 53,
    -(1 << 53),
    i64::MIN,
    i64::MAX,
];
/// `list_engagements` limits.
const JOURNAL_LIMITS: [Option<i64>; 7] = [
    None,
    Some(i64::MIN),
    Some(-1),
    Some(0),
    Some(1),
    Some(2),
    Some(i64::MAX),
];
const MAX_EVENTS: [u64; 4] = [0, 1, 3, u64::MAX];
const MAX_AGES: [i64; 6] = [i64::MIN, -1, 0, 1, 1_000, i64::MAX];
const JOURNAL_TYPES: [&str; 8] = [
    "engagement_opened",
    "engagement_closed",
    "budget_charged",
    "turn_started",
    "mail_sent",
    "escalated",
    "board_written",
    "x",
];
const KINDS: [SpanKind; 6] = [
    SpanKind::Turn,
    SpanKind::Tool,
    SpanKind::Subagent,
    SpanKind::Cron,
    SpanKind::Model,
    SpanKind::Other,
];
const ORIGINS: [SpanOrigin; 3] = [SpanOrigin::Session, SpanOrigin::Cron, SpanOrigin::Otlp];
const OUTCOMES: [SpanOutcome; 6] = [
    SpanOutcome::Success,
    SpanOutcome::Error,
    SpanOutcome::Timeout,
    SpanOutcome::Cancelled,
    SpanOutcome::Denied,
    SpanOutcome::Interrupted,
];
/// The first ids of the pool, chosen more often so calls meet each other's spans and runs.
const HOT_IDS: usize = 6;

/// An array nested `levels` deep around a number (depth `levels`).
fn nested_arrays(levels: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..levels {
        value = json!([value]);
    }
    value
}

/// An object nested `levels` deep (depth `levels`).
fn nested_objects(levels: usize) -> Value {
    let mut value = json!({});
    for _ in 1..levels {
        value = json!({ "k": value });
    }
    value
}

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// The 100 KB id: 1-, 3- and 4-byte characters.
fn big_id() -> String {
    format!("big:{}", "x€🦀".repeat(12_500))
}

struct Pools {
    ids: Vec<String>,
    writers: Vec<String>,
    payloads: Vec<Option<Value>>,
    attrs: Vec<Option<JsonObject>>,
    usages: Vec<Option<SpanUsage>>,
    journal_data: Vec<JsonObject>,
}

/// Payloads whose compact JSON is around the cap, with 1- to 4-byte characters at every offset
/// of the cut, as strings and inside objects, and exactly at the cap.
fn boundary_payloads() -> Vec<Value> {
    let mut payloads = Vec::new();
    for (width, ch) in [(1, "a"), (2, "é"), (3, "€"), (4, "🦀")] {
        for offset in 0..width {
            let text = format!("{}{}", "o".repeat(offset), ch.repeat(CAP / width + 2));
            payloads.push(Value::String(text.clone()));
            if width > 1 {
                payloads.push(json!({ "k": text }));
            }
        }
    }
    // Compact JSON of 16,383, 16,384 and 16,385 bytes.
    for len in [CAP - 3, CAP - 2, CAP - 1] {
        payloads.push(Value::String("q".repeat(len)));
    }
    for len in [CAP - 9, CAP - 8, CAP - 7] {
        payloads.push(json!({ "k": "o".repeat(len) }));
    }
    // Short strings whose JSON escapes push them over the cap.
    payloads.push(Value::String("\"".repeat(9_000)));
    payloads.push(Value::String("\0".repeat(3_000)));
    payloads
}

impl Pools {
    fn build() -> Self {
        let ids = [
            "a",
            "%",
            "",
            "a:b",
            "_",
            &big_id(),
            "A",
            "nul\0id\0",
            "\u{202E}rtl\u{200F}mark\u{200E}",
            "🦀🚀👩‍👩‍👧",
            "\u{FFFF}\u{10FFFF}\u{FEFF}e\u{301}\u{E000}",
            "'); DROP TABLE activity_spans; --",
            "SELECT * FROM activity_runs WHERE run_id = ''",
            "\"quoted\" 'single' `back` \\",
            "*",
            "?",
            "[a]",
            "a%",
            "a_b",
            "\0",
        ]
        .map(str::to_owned)
        .to_vec();
        let writers = vec![
            "w1".to_owned(),
            "w\0🦀\0two".to_owned(),
            "W".repeat(100_000),
        ];
        let mut payloads = vec![
            None,
            Some(Value::Null),
            Some(json!(true)),
            Some(json!(42)),
            Some(json!(-1.5e300)),
            Some(json!("text")),
            Some(json!([1, "a", null])),
            Some(json!({"k": "v", "%": "_"})),
            Some(nested_arrays(60)),
            Some(nested_arrays(MAX_DEPTH)),
            Some(nested_objects(MAX_DEPTH)),
            Some(nested_arrays(MAX_DEPTH + 1)),
            Some(nested_objects(MAX_DEPTH + 1)),
            Some(nested_arrays(300)),
        ];
        payloads.extend(boundary_payloads().into_iter().map(Some));
        let attrs = vec![
            None,
            Some(JsonObject::new()),
            Some(object(json!({"k": "v", "n": 1}))),
            Some(object(json!({"k": "w", "extra": [1, {"x": null}]}))),
            Some(object(
                json!({"%": "_", "": "", "\u{0}": "\u{0}", "a:b": "🦀", "*": "?["}),
            )),
            // 63 levels below the attrs object: 64 in all, at the limit.
            Some(object(json!({"deep": nested_arrays(MAX_DEPTH - 1)}))),
            // 64 below: one too many.
            Some(object(json!({"deep": nested_arrays(MAX_DEPTH)}))),
            Some(object(json!({"deep": nested_objects(200)}))),
            Some(object(json!({"big": "x".repeat(20_000)}))),
        ];
        let usage = |input, output, read, creation, cost, model: Option<&str>| {
            Some(SpanUsage {
                input_tokens: input,
                output_tokens: output,
                cache_read_tokens: read,
                cache_creation_tokens: creation,
                cost_usd: cost,
                model: model.map(str::to_owned),
            })
        };
        let usages = vec![
            None,
            Some(SpanUsage::default()),
            usage(
                Some(i64::MAX),
                Some(i64::MIN),
                Some(-1),
                Some(0),
                Some(f64::NAN),
                Some("m"),
            ),
            usage(Some(5), None, None, None, Some(f64::INFINITY), None),
            usage(
                None,
                Some(i64::MAX),
                None,
                None,
                Some(f64::NEG_INFINITY),
                None,
            ),
            usage(Some(i64::MAX), None, None, None, Some(f64::MAX), None),
            usage(
                Some(i64::MIN),
                None,
                None,
                None,
                Some(-f64::MAX),
                Some("\0🦀"),
            ),
            usage(None, None, Some(i64::MAX), Some(i64::MIN), Some(0.25), None),
            usage(None, None, None, None, Some(f64::NAN), None),
        ];
        let journal_data = vec![
            JsonObject::new(),
            object(json!({"status": "completed"})),
            object(json!({"status": null})),
            object(json!({"actor": "a", "mailId": "m1", "from": "a", "to": "b", "key": "k"})),
            object(json!({"deep": nested_arrays(MAX_DEPTH - 1)})),
            object(json!({"deep": nested_arrays(MAX_DEPTH)})),
            object(json!({"amount": 5, "key": "tokens", "consumed": {"tokens": 1e300}})),
            object(json!({"\u{0}": "\u{0}", "big": "🦀".repeat(5_000)})),
        ];
        Self {
            ids,
            writers,
            payloads,
            attrs,
            usages,
            journal_data,
        }
    }
}

fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
    POOLS.get_or_init(Pools::build)
}

fn id(index: usize) -> String {
    pools().ids[index].clone()
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// At most a few thousand bytes of `text` (failure messages carry 100 KB ids otherwise).
fn short(text: &str) -> String {
    const KEEP: usize = 3_000;
    if text.len() <= KEEP {
        return text.to_owned();
    }
    let mut end = KEEP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

fn fail(message: impl AsRef<str>) -> TestCaseError {
    TestCaseError::fail(short(message.as_ref()))
}

/// The text around byte `at` of `text`.
fn window(text: &str, at: usize) -> String {
    let mut start = at.saturating_sub(400).min(text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = at.saturating_add(400).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    text[start..end].to_owned()
}

/// Fail unless the store's answer equals the model's; the message shows where they differ.
fn same<T: PartialEq + Debug>(what: &str, store: &T, model: &T) -> Result<(), TestCaseError> {
    if store == model {
        return Ok(());
    }
    let (store, model) = (format!("{store:?}"), format!("{model:?}"));
    let at = store
        .bytes()
        .zip(model.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    Err(TestCaseError::fail(format!(
        "{}: the store and the model differ at byte {at}:\n  store: …{}…\n  model: …{}…",
        short(what),
        window(&store, at),
        window(&model, at)
    )))
}

/// How deep `value` nests: 0 for a scalar, 1 for a flat array or object.
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn object_too_deep(attrs: &JsonObject) -> bool {
    1 + attrs.values().map(depth).max().unwrap_or(0) > MAX_DEPTH
}

/// A refusal the rule allows: the typed error of a duplicate span or of a too-deep value.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    Duplicate(String),
    TooDeep,
}

type Outcome<T> = Result<T, Refusal>;

/// The store's answer as an [`Outcome`]; any other error fails the case.
fn outcome<T>(what: &str, result: Result<T, StoreError>) -> Result<Outcome<T>, TestCaseError> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(err) => refusal(what, err).map(Err),
    }
}

fn refusal(what: &str, err: StoreError) -> Result<Refusal, TestCaseError> {
    match err {
        StoreError::DuplicateSpan { span_id } => Ok(Refusal::Duplicate(span_id)),
        StoreError::InvalidInput(message)
            if message.contains(&format!("nests deeper than {MAX_DEPTH} levels")) =>
        {
            Ok(Refusal::TooDeep)
        }
        other => Err(fail(format!("{what}: unexpected error {other:?}"))),
    }
}

/// The store's answer to a call that must succeed.
fn ok<T>(what: &str, result: Result<T, StoreError>) -> Result<T, TestCaseError> {
    result.map_err(|err| fail(format!("{what}: unexpected error {err:?}")))
}

/// A journal answer: the value, or the error as text; a backend failure fails the case.
fn journal_outcome<T>(
    what: &str,
    result: Result<T, JournalError>,
) -> Result<Result<T, String>, TestCaseError> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(err @ (JournalError::Closed | JournalError::Corrupt(_) | JournalError::Backend(_))) => {
            Err(fail(format!("{what}: unexpected journal error {err:?}")))
        }
        Err(err) => Ok(Err(format!("{err:?}"))),
    }
}

fn raw(json: String) -> Box<RawValue> {
    RawValue::from_string(json).expect("valid JSON")
}

/// What the store keeps of a payload: its compact JSON, or, over the cap, a marked string made
/// of the longest prefix (of the string itself, or else of the JSON text) of at most the cap
/// that ends on a character boundary.
fn capped(payload: Option<&Value>) -> (String, bool) {
    let value = js_normalized(&payload.cloned().unwrap_or(Value::Null));
    let text = value.to_string();
    if text.len() <= CAP {
        return (text, false);
    }
    let source = match &value {
        Value::String(string) => string.as_str(),
        _ => text.as_str(),
    };
    let mut end = CAP.min(source.len());
    while !source.is_char_boundary(end) {
        end -= 1;
    }
    let marked = format!("{}{MARKER}", &source[..end]);
    (Value::String(marked).to_string(), true)
}

/// `{...old, ...new}`.
fn merge(stored: &mut JsonObject, update: Option<&JsonObject>) {
    for (key, value) in update.into_iter().flatten() {
        stored.insert(key.clone(), value.clone());
    }
}

/// `COALESCE(new, old)` field by field; a NaN cost binds as NULL, so it keeps the old one.
fn coalesce(stored: &mut SpanUsage, update: Option<&SpanUsage>) {
    let Some(update) = update else {
        return;
    };
    stored.input_tokens = update.input_tokens.or(stored.input_tokens);
    stored.output_tokens = update.output_tokens.or(stored.output_tokens);
    stored.cache_read_tokens = update.cache_read_tokens.or(stored.cache_read_tokens);
    stored.cache_creation_tokens = update
        .cache_creation_tokens
        .or(stored.cache_creation_tokens);
    stored.cost_usd = stored_cost(update.cost_usd).or(stored.cost_usd);
    stored.model = update.model.clone().or(stored.model.take());
}

/// SQLite stores a NaN as NULL.
fn stored_cost(cost: Option<f64>) -> Option<f64> {
    cost.filter(|cost| !cost.is_nan())
}

fn truncate_to(items: &mut Vec<impl Sized>, limit: i64) {
    items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Change {
    change_id: i64,
    run_id: String,
    seq: i64,
    span_id: String,
    event_index: Option<i64>,
}

/// What the activity store should hold. Spans are in insertion order, which is the order of
/// their keys, the store's tie-break after time.
#[derive(Debug, Default)]
struct Model {
    spans: Vec<SpanRow>,
    events: Vec<SpanEventRow>,
    /// By change id.
    changes: Vec<Change>,
    /// Change ids are never reused, even once the newest rows are pruned.
    last_change_id: i64,
    /// One past the newest change id a prune deleted (the log is never trimmed here).
    horizon: i64,
    rollups: BTreeMap<String, RunRollupRow>,
    /// Pruned runs rolled up again since their prune (the store's `detail_pruned = 2`): their
    /// rollup describes their new life.
    rerolled: BTreeSet<String>,
    /// Run ids in the order they were interned (the prune tie-break).
    run_keys: Vec<String>,
}

impl Model {
    fn pos(&self, span_id: &str) -> Option<usize> {
        self.spans.iter().position(|span| span.span_id == span_id)
    }

    fn open_pos(&self, span_id: &str) -> Option<usize> {
        self.pos(span_id)
            .filter(|&index| self.spans[index].outcome.is_none())
    }

    fn intern(&mut self, run_id: &str) {
        if !self.run_keys.iter().any(|run| run == run_id) {
            self.run_keys.push(run_id.to_owned());
        }
    }

    fn run_key(&self, run_id: &str) -> usize {
        self.run_keys
            .iter()
            .position(|run| run == run_id)
            .unwrap_or(usize::MAX)
    }

    /// The run's spans by start, then key.
    fn run_spans(&self, run_id: &str) -> Vec<usize> {
        let mut spans: Vec<usize> = (0..self.spans.len())
            .filter(|&index| self.spans[index].run_id == run_id)
            .collect();
        spans.sort_by_key(|&index| (self.spans[index].started_at, index));
        spans
    }

    fn run_ids(&self) -> BTreeSet<String> {
        let mut runs: BTreeSet<String> = self.run_keys.iter().cloned().collect();
        runs.extend(self.rollups.keys().cloned());
        runs
    }

    fn high_water(&self, run_id: &str) -> i64 {
        self.changes
            .iter()
            .filter(|change| change.run_id == run_id)
            .map(|change| change.seq)
            .max()
            .unwrap_or(0)
    }

    fn latest(&self) -> i64 {
        self.changes.last().map_or(0, |change| change.change_id)
    }

    /// The change id of the run's newest logged change.
    fn newest_change_of(&self, run_id: &str) -> Option<i64> {
        self.changes
            .iter()
            .filter(|change| change.run_id == run_id)
            .map(|change| change.change_id)
            .max()
    }

    fn log(&mut self, run_id: &str, span_id: &str, event_index: Option<i64>) {
        let seq = self.high_water(run_id) + 1;
        self.last_change_id += 1;
        self.changes.push(Change {
            change_id: self.last_change_id,
            run_id: run_id.to_owned(),
            seq,
            span_id: span_id.to_owned(),
            event_index,
        });
    }

    fn start_span(&mut self, input: &StartSpanInput, writer: &str, now: i64) -> Outcome<SpanRow> {
        if input.attrs.as_ref().is_some_and(object_too_deep) {
            return Err(Refusal::TooDeep);
        }
        // The run is interned before the id is checked.
        self.intern(&input.run_id);
        if self.pos(&input.span_id).is_some() {
            return Err(Refusal::Duplicate(input.span_id.clone()));
        }
        let started_at = input.started_at.unwrap_or(now);
        let row = SpanRow {
            span_id: input.span_id.clone(),
            run_id: input.run_id.clone(),
            parent_span_id: input.parent_span_id.clone(),
            name: input.name.clone(),
            kind: input.kind.clone(),
            origin: input.origin.clone(),
            session_id: input.session_id.clone(),
            job_name: input.job_name.clone(),
            attrs: input.attrs.clone().unwrap_or_default(),
            started_at,
            wait_until: None,
            ended_at: None,
            outcome: None,
            outcome_reason: None,
            usage: SpanUsage::default(),
            writer: writer.to_owned(),
            // The reference tests the parent for truthiness: "" gets a heartbeat.
            last_heartbeat_at: match input.parent_span_id.as_deref() {
                None | Some("") => Some(started_at),
                Some(_) => None,
            },
        };
        self.spans.push(row.clone());
        self.log(&input.run_id, &input.span_id, None);
        Ok(row)
    }

    fn end_span(&mut self, span_id: &str, input: &EndSpanInput, now: i64) -> Outcome<bool> {
        if input.attrs.as_ref().is_some_and(object_too_deep) {
            return Err(Refusal::TooDeep);
        }
        let Some(index) = self.open_pos(span_id) else {
            return Ok(false);
        };
        let span = &mut self.spans[index];
        span.outcome = Some(input.outcome.clone());
        span.outcome_reason = input.reason.clone();
        span.ended_at = Some(input.ended_at.unwrap_or(now));
        merge(&mut span.attrs, input.attrs.as_ref());
        coalesce(&mut span.usage, input.usage.as_ref());
        let run_id = span.run_id.clone();
        self.log(&run_id, span_id, None);
        Ok(true)
    }

    fn patch_span(&mut self, span_id: &str, patch: &SpanPatch) -> Outcome<bool> {
        if patch.attrs.as_ref().is_some_and(object_too_deep) {
            return Err(Refusal::TooDeep);
        }
        let Some(index) = self.open_pos(span_id) else {
            return Ok(false);
        };
        let span = &mut self.spans[index];
        merge(&mut span.attrs, patch.attrs.as_ref());
        span.wait_until = patch.wait_until.or(span.wait_until);
        coalesce(&mut span.usage, patch.usage.as_ref());
        let run_id = span.run_id.clone();
        self.log(&run_id, span_id, None);
        Ok(true)
    }

    fn append_event(
        &mut self,
        span_id: &str,
        event_type: &str,
        payload: Option<&Value>,
        ts: i64,
    ) -> Outcome<Option<SpanEventRow>> {
        if payload.is_some_and(|payload| depth(payload) > MAX_DEPTH) {
            return Err(Refusal::TooDeep);
        }
        let Some(index) = self.pos(span_id) else {
            return Ok(None);
        };
        let run_id = self.spans[index].run_id.clone();
        Ok(Some(
            self.add_event(&run_id, span_id, event_type, payload, ts),
        ))
    }

    fn add_event(
        &mut self,
        run_id: &str,
        span_id: &str,
        event_type: &str,
        payload: Option<&Value>,
        ts: i64,
    ) -> SpanEventRow {
        let event_index = self
            .events
            .iter()
            .filter(|event| event.span_id == span_id)
            .count() as i64;
        let (json, truncated) = capped(payload);
        let row = SpanEventRow {
            span_id: span_id.to_owned(),
            event_index,
            ts,
            event_type: event_type.to_owned(),
            payload: raw(json),
            truncated,
        };
        self.events.push(row.clone());
        self.log(run_id, span_id, Some(event_index));
        row
    }

    fn heartbeat(&mut self, span_id: &str, at: i64) {
        if let Some(index) = self.open_pos(span_id) {
            self.spans[index].last_heartbeat_at = Some(at);
        }
    }

    /// Close every open span of the run, newest start (then key) first, then roll it up.
    fn close_run(&mut self, run_id: &str, outcome: &SpanOutcome, reason: &str, now: i64) -> i64 {
        let mut open: Vec<usize> = (0..self.spans.len())
            .filter(|&index| {
                self.spans[index].run_id == run_id && self.spans[index].outcome.is_none()
            })
            .collect();
        open.sort_by_key(|&index| std::cmp::Reverse((self.spans[index].started_at, index)));
        for &index in &open {
            let span = &mut self.spans[index];
            span.outcome = Some(outcome.clone());
            span.outcome_reason = Some(reason.to_owned());
            span.ended_at = Some(now);
            let span_id = span.span_id.clone();
            self.log(run_id, &span_id, None);
        }
        if !open.is_empty() {
            self.rollup_run(run_id);
        }
        open.len() as i64
    }

    fn sweep_own_orphans(&mut self, now: i64) -> i64 {
        let runs: BTreeSet<String> = self
            .spans
            .iter()
            .filter(|span| span.outcome.is_none() && span.origin == SpanOrigin::Session)
            .map(|span| span.run_id.clone())
            .collect();
        runs.iter()
            .map(|run_id| {
                self.close_run(run_id, &SpanOutcome::Interrupted, "server restarted", now)
            })
            .sum()
    }

    fn sweep_stale(&mut self, writer: &str, cutoff: i64, now: i64) -> i64 {
        let mut roots: Vec<usize> = (0..self.spans.len())
            .filter(|&index| {
                let span = &self.spans[index];
                span.outcome.is_none()
                    && span.parent_span_id.is_none()
                    && span.writer != writer
                    && span.last_heartbeat_at.unwrap_or(span.started_at) < cutoff
            })
            .collect();
        roots.sort_by_key(|&index| (self.spans[index].started_at, index));
        let runs: Vec<String> = roots
            .iter()
            .map(|&index| self.spans[index].run_id.clone())
            .collect();
        runs.iter()
            .map(|run_id| {
                self.close_run(run_id, &SpanOutcome::Interrupted, "writer went silent", now)
            })
            .sum()
    }

    fn open_roots(&self) -> Vec<usize> {
        (0..self.spans.len())
            .filter(|&index| {
                self.spans[index].outcome.is_none() && self.spans[index].parent_span_id.is_none()
            })
            .collect()
    }

    fn find_stuck(&self, cutoff: i64) -> Vec<SpanRow> {
        let mut roots: Vec<usize> = self
            .open_roots()
            .into_iter()
            .filter(|&index| self.spans[index].started_at < cutoff)
            .collect();
        roots.sort_by_key(|&index| (self.spans[index].started_at, index));
        roots
            .into_iter()
            .map(|index| self.spans[index].clone())
            .collect()
    }

    fn open_root_spans(&self) -> Vec<SpanRow> {
        let mut roots = self.open_roots();
        roots.sort_by_key(|&index| std::cmp::Reverse((self.spans[index].started_at, index)));
        roots
            .into_iter()
            .map(|index| self.spans[index].clone())
            .collect()
    }

    fn change_row(&self, change: &Change) -> Option<ActivityChange> {
        let body = match change.event_index {
            None => ChangeBody::Span {
                span: Box::new(self.spans[self.pos(&change.span_id)?].clone()),
            },
            Some(index) => ChangeBody::Event {
                event: self
                    .events
                    .iter()
                    .find(|event| event.span_id == change.span_id && event.event_index == index)?
                    .clone(),
            },
        };
        Some(ActivityChange {
            change_id: change.change_id,
            run_id: change.run_id.clone(),
            seq: change.seq,
            body,
        })
    }

    fn changes_since(&self, cursor: i64, limit: i64) -> Vec<ActivityChange> {
        let mut changes: Vec<ActivityChange> = self
            .changes
            .iter()
            .filter(|change| change.change_id > cursor)
            .filter_map(|change| self.change_row(change))
            .collect();
        if limit >= 0 {
            truncate_to(&mut changes, limit);
        } else {
            // An unlimited read, then the last |limit| dropped (the reference's slice).
            let drop = usize::try_from(limit.unsigned_abs()).unwrap_or(usize::MAX);
            changes.truncate(changes.len().saturating_sub(drop));
        }
        changes
    }

    fn terminal_root_changes_since(&self, cursor: i64, limit: i64) -> Vec<TerminalRootChange> {
        let mut latest: Vec<(i64, usize)> = Vec::new();
        for change in &self.changes {
            if change.change_id <= cursor || change.event_index.is_some() {
                continue;
            }
            let Some(index) = self.pos(&change.span_id) else {
                continue;
            };
            let span = &self.spans[index];
            if span.parent_span_id.is_some() || span.outcome.is_none() {
                continue;
            }
            match latest.iter_mut().find(|(_, at)| *at == index) {
                Some(entry) => entry.0 = entry.0.max(change.change_id),
                None => latest.push((change.change_id, index)),
            }
        }
        latest.sort_unstable();
        if limit >= 0 {
            truncate_to(&mut latest, limit);
        }
        latest
            .into_iter()
            .map(|(change_id, index)| TerminalRootChange {
                change_id,
                span: self.spans[index].clone(),
            })
            .collect()
    }

    fn snapshot(&self, run_id: &str) -> Option<RunSnapshot> {
        let spans = self.run_spans(run_id);
        if spans.is_empty() {
            return None;
        }
        let mut events: Vec<((i64, i64, usize), SpanEventRow)> = self
            .events
            .iter()
            .filter_map(|event| {
                let index = self.pos(&event.span_id)?;
                (self.spans[index].run_id == run_id)
                    .then(|| ((event.ts, event.event_index, index), event.clone()))
            })
            .collect();
        events.sort_by_key(|(key, _)| *key);
        Some(RunSnapshot {
            run_id: run_id.to_owned(),
            spans: spans
                .into_iter()
                .map(|index| self.spans[index].clone())
                .collect(),
            events: events.into_iter().map(|(_, event)| event).collect(),
            high_water_seq: self.high_water(run_id),
            change_cursor: self.latest(),
        })
    }

    /// Add the delivered events that `span`'s stored copy does not hold yet: each held event
    /// accounts for one delivered event of its time and type, the one with the same payload
    /// first. The number added.
    fn add_events_not_held(&mut self, span: &ImportedSpan) -> u64 {
        let mut held: BTreeMap<(i64, String), Vec<String>> = BTreeMap::new();
        for event in self.events.iter().filter(|e| e.span_id == span.span_id) {
            held.entry((event.ts, event.event_type.clone()))
                .or_default()
                .push(event.payload.get().to_owned());
        }
        let mut add = vec![true; span.events.len()];
        for (at, event) in span.events.iter().enumerate() {
            let payload = capped(Some(&event.payload)).0;
            if let Some(list) = held.get_mut(&(event.ts, event.event_type.clone())) {
                if let Some(found) = list.iter().position(|held| *held == payload) {
                    list.remove(found);
                    add[at] = false;
                }
            }
        }
        for (at, event) in span.events.iter().enumerate() {
            if add[at] {
                if let Some(list) = held.get_mut(&(event.ts, event.event_type.clone())) {
                    if list.pop().is_some() {
                        add[at] = false;
                    }
                }
            }
        }
        let mut added = 0;
        for (at, event) in span.events.iter().enumerate() {
            if !add[at] {
                continue;
            }
            self.add_event(
                &span.run_id,
                &span.span_id,
                &event.event_type,
                Some(&event.payload),
                event.ts,
            );
            added += 1;
        }
        added
    }

    fn rollup_run(&mut self, run_id: &str) {
        self.rollup_run_as(run_id, false);
    }

    /// The rollup, its identity refreshed from the first root when `refresh_identity` (an
    /// import's rollup: spans arrive in any order) or kept from the first rollup (the
    /// reference's upsert, every native path).
    fn rollup_run_as(&mut self, run_id: &str, refresh_identity: bool) {
        let spans: Vec<RollupSpan> = self
            .run_spans(run_id)
            .into_iter()
            .map(|index| RollupSpan::from(&self.spans[index]))
            .collect();
        let Some(fields) = compute_rollup(&spans) else {
            return;
        };
        let cost_usd = stored_cost(fields.cost_usd);
        if self
            .rollups
            .get(run_id)
            .is_some_and(|row| row.detail_pruned)
        {
            self.rerolled.insert(run_id.to_owned());
        }
        match self.rollups.get_mut(run_id) {
            // ON CONFLICT: the identity columns and `detail_pruned` keep their first values.
            Some(row) => {
                if refresh_identity {
                    row.origin = fields.origin;
                    row.name = fields.name;
                    row.session_id = fields.session_id;
                    row.job_name = fields.job_name;
                    row.started_at = fields.started_at;
                }
                row.ended_at = fields.ended_at;
                row.outcome = fields.outcome;
                row.duration_ms = fields.duration_ms;
                row.span_count = fields.span_count;
                row.input_tokens = fields.input_tokens;
                row.output_tokens = fields.output_tokens;
                row.cache_read_tokens = fields.cache_read_tokens;
                row.cache_creation_tokens = fields.cache_creation_tokens;
                row.cost_usd = cost_usd;
                row.failure_reason = fields.failure_reason;
            }
            None => {
                self.rollups.insert(
                    run_id.to_owned(),
                    RunRollupRow {
                        run_id: run_id.to_owned(),
                        origin: fields.origin,
                        name: fields.name,
                        session_id: fields.session_id,
                        job_name: fields.job_name,
                        started_at: fields.started_at,
                        ended_at: fields.ended_at,
                        outcome: fields.outcome,
                        duration_ms: fields.duration_ms,
                        span_count: fields.span_count,
                        input_tokens: fields.input_tokens,
                        output_tokens: fields.output_tokens,
                        cache_read_tokens: fields.cache_read_tokens,
                        cache_creation_tokens: fields.cache_creation_tokens,
                        cost_usd,
                        failure_reason: fields.failure_reason,
                        detail_pruned: false,
                    },
                );
            }
        }
    }

    /// Delete a run's spans, events and change rows (moving the change-log horizon past its
    /// newest change); how many spans went.
    fn delete_run_detail(&mut self, run_id: &str) -> i64 {
        let doomed: BTreeSet<String> = self
            .spans
            .iter()
            .filter(|span| span.run_id == run_id)
            .map(|span| span.span_id.clone())
            .collect();
        if let Some(newest) = self
            .changes
            .iter()
            .filter(|change| change.run_id == run_id)
            .map(|change| change.change_id)
            .max()
        {
            self.horizon = self.horizon.max(newest + 1);
        }
        self.events.retain(|event| !doomed.contains(&event.span_id));
        self.spans.retain(|span| span.run_id != run_id);
        self.changes.retain(|change| change.run_id != run_id);
        doomed.len() as i64
    }

    fn prune(&mut self, options: &PruneOptions, clock: i64) -> PruneResult {
        let now = options.now.unwrap_or(clock);
        let floor = options.digest_floor_at.max(0);
        let ceiling = now.saturating_sub(options.hard_ceiling_ms);
        let mut candidates: Vec<(i64, usize, String)> = self
            .rollups
            .values()
            .filter(|row| {
                !row.detail_pruned
                    && !self
                        .spans
                        .iter()
                        .any(|span| span.run_id == row.run_id && span.outcome.is_none())
            })
            .filter_map(|row| {
                let ended = row.ended_at?;
                (ended < floor || ended < ceiling)
                    .then(|| (ended, self.run_key(&row.run_id), row.run_id.clone()))
            })
            .collect();
        candidates.sort();
        let batch = options.batch.unwrap_or(50);
        if batch >= 0 {
            truncate_to(&mut candidates, batch);
        }
        // Runs of OTLP spans with no root and no rollup not yet pruned: their detail deleted by
        // the hard ceiling once none is open and the newest is older than it, in the room the
        // batch leaves, with a digest rollup (kept if the run has a pruned one).
        let mut rootless: Vec<(i64, usize, String)> = Vec::new();
        let mut run_ids: BTreeSet<&str> = BTreeSet::new();
        for span in &self.spans {
            run_ids.insert(span.run_id.as_str());
        }
        for run_id in run_ids {
            let spans: Vec<&SpanRow> = self
                .spans
                .iter()
                .filter(|span| span.run_id == run_id)
                .collect();
            if spans.iter().any(|span| span.parent_span_id.is_none())
                || spans.iter().any(|span| span.outcome.is_none())
                || spans.iter().any(|span| span.origin != SpanOrigin::Otlp)
                || self
                    .rollups
                    .get(run_id)
                    .is_some_and(|row| !row.detail_pruned)
            {
                continue;
            }
            let earliest = spans.iter().map(|span| span.started_at).min();
            let newest = spans
                .iter()
                .map(|span| {
                    span.started_at
                        .max(span.ended_at.unwrap_or(span.started_at))
                })
                .max();
            if let (Some(earliest), Some(newest)) = (earliest, newest) {
                if newest < ceiling {
                    rootless.push((earliest, self.run_key(run_id), run_id.to_owned()));
                }
            }
        }
        rootless.sort();
        if batch >= 0 {
            truncate_to(&mut rootless, batch.saturating_sub(candidates.len() as i64));
        }
        let mut spans_deleted = 0;
        for (_, _, run_id) in &rootless {
            self.rerolled.remove(run_id);
            if !self.rollups.contains_key(run_id) {
                let mut spans: Vec<(usize, &SpanRow)> = self
                    .spans
                    .iter()
                    .enumerate()
                    .filter(|(_, span)| &span.run_id == run_id)
                    .collect();
                spans.sort_by_key(|(index, span)| (span.started_at, *index));
                let rollup_spans: Vec<RollupSpan> = spans
                    .iter()
                    .map(|(_, span)| RollupSpan::from(*span))
                    .collect();
                let earliest = spans[0].1;
                let ended_at = spans
                    .iter()
                    .map(|(_, span)| span.ended_at.unwrap_or(span.started_at))
                    .max();
                let usage = rootless_usage(&rollup_spans);
                let digest = RunRollupRow {
                    run_id: run_id.clone(),
                    origin: earliest.origin.clone(),
                    name: earliest.name.clone(),
                    session_id: earliest.session_id.clone(),
                    job_name: earliest.job_name.clone(),
                    started_at: earliest.started_at,
                    ended_at,
                    outcome: None,
                    duration_ms: ended_at.map(|ended| ended.saturating_sub(earliest.started_at)),
                    span_count: spans.len() as i64,
                    input_tokens: usage.input_tokens,
                    output_tokens: usage.output_tokens,
                    cache_read_tokens: usage.cache_read_tokens,
                    cache_creation_tokens: usage.cache_creation_tokens,
                    cost_usd: usage.cost_usd,
                    failure_reason: Some("root never arrived".to_owned()),
                    detail_pruned: true,
                };
                self.rollups.insert(run_id.clone(), digest);
            }
            spans_deleted += self.delete_run_detail(run_id);
        }
        for (ended, _, run_id) in &candidates {
            self.rerolled.remove(run_id);
            if let Some(row) = self.rollups.get_mut(run_id) {
                row.detail_pruned = true;
                if *ended >= floor {
                    row.failure_reason
                        .get_or_insert_with(|| "digest coverage gap".to_owned());
                }
            }
            spans_deleted += self.delete_run_detail(run_id);
        }
        // The model holds too few changes for the trim (100,000 behind the newest) to reach.
        PruneResult {
            runs_pruned: (candidates.len() + rootless.len()) as i64,
            spans_deleted,
            changes_trimmed: 0,
        }
    }

    fn batch(
        &mut self,
        writes: &[ActivityWrite],
        writer: &str,
        now: i64,
    ) -> Vec<Outcome<ActivityWriteResult>> {
        writes
            .iter()
            .map(|write| match write {
                ActivityWrite::StartSpan(input) => self
                    .start_span(input, writer, now)
                    .map(|span| ActivityWriteResult::Started(Box::new(span))),
                ActivityWrite::EndSpan { span_id, input } => self
                    .end_span(span_id, input, now)
                    .map(ActivityWriteResult::Ended),
                ActivityWrite::PatchSpan { span_id, patch } => self
                    .patch_span(span_id, patch)
                    .map(ActivityWriteResult::Patched),
                ActivityWrite::AppendEvent {
                    span_id,
                    event_type,
                    payload,
                    ts,
                } => self
                    .append_event(span_id, event_type, payload.as_ref(), ts.unwrap_or(now))
                    .map(ActivityWriteResult::Appended),
                ActivityWrite::AppendEventText {
                    span_id,
                    event_type,
                    payload,
                    ts,
                } => self
                    .append_event(
                        span_id,
                        event_type,
                        Some(&stored_payload_value(payload)),
                        ts.unwrap_or(now),
                    )
                    .map(ActivityWriteResult::Appended),
                ActivityWrite::Heartbeat { span_id, at } => {
                    self.heartbeat(span_id, at.unwrap_or(now));
                    Ok(ActivityWriteResult::Heartbeat)
                }
            })
            .collect()
    }

    fn import(&mut self, spans: &[ImportedSpan], writer: &str, now: i64) -> ImportReport {
        let mut report = ImportReport::default();
        // Each touched run with the origin of the first span delivered for it.
        let mut touched: Vec<(String, SpanOrigin)> = Vec::new();
        for span in spans {
            let (attrs, checked) = match &span.attrs {
                ImportedAttrs::Object(attrs) => (attrs.clone(), true),
                ImportedAttrs::Encoded(text) => (
                    serde_json::from_str(text.as_str()).expect("an object"),
                    false,
                ),
            };
            let too_deep = (checked && object_too_deep(&attrs))
                || span
                    .events
                    .iter()
                    .any(|event| depth(&event.payload) > MAX_DEPTH);
            if too_deep {
                report.rejected.push(ImportRejection {
                    span_id: span.span_id.clone(),
                    reason: "too deep".to_owned(),
                });
                continue;
            }
            // A run whose detail was pruned and that holds no span now: its rollup is kept.
            if self
                .rollups
                .get(&span.run_id)
                .is_some_and(|row| row.detail_pruned)
                && !self.spans.iter().any(|held| held.run_id == span.run_id)
            {
                report.rejected.push(ImportRejection {
                    span_id: span.span_id.clone(),
                    reason: "pruned".to_owned(),
                });
                continue;
            }
            self.intern(&span.run_id);
            if !touched.iter().any(|(run_id, _)| *run_id == span.run_id) {
                touched.push((span.run_id.clone(), span.origin.clone()));
            }
            let end = span.end.as_ref();
            // An open span whose parent is not stored, or has ended, is a root until its
            // completed copy comes.
            let parent = match (&span.parent_span_id, end) {
                (Some(parent), None)
                    if self
                        .pos(parent)
                        .is_none_or(|at| self.spans[at].outcome.is_some()) =>
                {
                    None
                }
                (parent, _) => parent.clone(),
            };
            // An agent span is a turn at the root, a subagent below one.
            let kind = match (&parent, &span.kind) {
                (None, SpanKind::Subagent) => SpanKind::Turn,
                (_, kind) => kind.clone(),
            };
            let Some(index) = self.pos(&span.span_id) else {
                self.spans.push(SpanRow {
                    span_id: span.span_id.clone(),
                    run_id: span.run_id.clone(),
                    parent_span_id: parent.clone(),
                    name: span.name.clone(),
                    kind,
                    origin: span.origin.clone(),
                    session_id: span.session_id.clone(),
                    job_name: span.job_name.clone(),
                    attrs,
                    started_at: span.started_at,
                    wait_until: None,
                    ended_at: end.map(|end| end.ended_at),
                    outcome: end.map(|end| end.outcome.clone()),
                    outcome_reason: end.and_then(|end| end.reason.clone()),
                    usage: SpanUsage {
                        cost_usd: stored_cost(span.usage.cost_usd),
                        ..span.usage.clone()
                    },
                    writer: writer.to_owned(),
                    // An open span counts as alive from the moment it is announced.
                    last_heartbeat_at: match (&parent, end) {
                        (Some(_), Some(_)) => None,
                        (None, Some(_)) => Some(span.started_at),
                        (_, None) => Some(now),
                    },
                });
                self.log(&span.run_id, &span.span_id, None);
                for event in &span.events {
                    self.add_event(
                        &span.run_id,
                        &span.span_id,
                        &event.event_type,
                        Some(&event.payload),
                        event.ts,
                    );
                }
                report.created += 1;
                report.events_added += span.events.len() as u64;
                continue;
            };
            if self.spans[index].run_id != span.run_id {
                report.rejected.push(ImportRejection {
                    span_id: span.span_id.clone(),
                    reason: "another run".to_owned(),
                });
                continue;
            }
            if self.spans[index].outcome.is_some() {
                report.unchanged += 1;
                // Ended natively: the events only the delivery carries are added.
                if self.spans[index].origin != span.origin {
                    report.events_added += self.add_events_not_held(span);
                }
                continue;
            }
            let stored = &mut self.spans[index];
            // A span the same importer announced takes the final copy's identity; a span of
            // another origin (started natively) keeps its own.
            if stored.origin == span.origin {
                if parent.is_some() && end.is_some() {
                    // Ended under a parent: a child has no heartbeat of its own.
                    stored.last_heartbeat_at = None;
                }
                stored.parent_span_id = parent;
                stored.name = span.name.clone();
                stored.kind = kind;
                if span.session_id.is_some() {
                    stored.session_id = span.session_id.clone();
                }
                if span.job_name.is_some() {
                    stored.job_name = span.job_name.clone();
                }
            }
            merge(&mut stored.attrs, Some(&attrs));
            if let Some(end) = end {
                // Never before the start the span keeps (which may be later than the
                // delivery's own start).
                stored.ended_at = Some(end.ended_at.max(stored.started_at));
                stored.outcome = Some(end.outcome.clone());
                stored.outcome_reason = end.reason.clone();
            }
            // A delivery leaving a span open renews its heartbeat; a root (maybe just made one
            // by the delivery's parent) ending has one, as a root delivered whole has.
            if end.is_none() {
                stored.last_heartbeat_at = Some(stored.last_heartbeat_at.unwrap_or(0).max(now));
            } else if stored.parent_span_id.is_none() {
                stored.last_heartbeat_at =
                    Some(stored.last_heartbeat_at.unwrap_or(stored.started_at));
            }
            coalesce(&mut stored.usage, Some(&span.usage));
            self.log(&span.run_id, &span.span_id, None);
            report.events_added += self.add_events_not_held(span);
            if end.is_some() {
                report.completed += 1;
            } else {
                report.refreshed += 1;
            }
        }
        for (run_id, origin) in touched {
            // A delivery is its exporter's heartbeat: the run's open roots of its origin are
            // alive as of now, or its open spans when no root is open.
            let root_open = self.spans.iter().any(|span| {
                span.run_id == run_id && span.parent_span_id.is_none() && span.outcome.is_none()
            });
            for span in &mut self.spans {
                if span.run_id == run_id
                    && span.outcome.is_none()
                    && span.origin == origin
                    && (span.parent_span_id.is_none() || !root_open)
                {
                    span.last_heartbeat_at = Some(span.last_heartbeat_at.unwrap_or(0).max(now));
                }
            }
            let root_terminal = self.spans.iter().any(|span| {
                span.run_id == run_id && span.parent_span_id.is_none() && span.outcome.is_some()
            });
            if root_terminal {
                self.rollup_run_as(&run_id, true);
                report.runs_rolled_up += 1;
            }
        }
        report
    }

    /// Every listed run matching the query's filters (not its cursor or limit), newest first.
    fn listed_runs(&self, query: &RunListQuery) -> Vec<RunListEntry> {
        // Each run by its first root (start, then key), the root its rollup is made from; open
        // while any root is.
        let mut first: BTreeMap<&str, usize> = BTreeMap::new();
        let mut open_runs: BTreeSet<&str> = BTreeSet::new();
        for (index, span) in self.spans.iter().enumerate() {
            if span.parent_span_id.is_some() {
                continue;
            }
            if span.outcome.is_none() {
                open_runs.insert(span.run_id.as_str());
            }
            let entry = first.entry(span.run_id.as_str()).or_insert(index);
            if (span.started_at, index) < (self.spans[*entry].started_at, *entry) {
                *entry = index;
            }
        }
        let mut entries = Vec::new();
        for (run_id, &index) in &first {
            let root = &self.spans[index];
            // A rollup made while the root was open holds no end: the live figures stand.
            let state = if open_runs.contains(run_id) {
                RunState::Open
            } else {
                RunState::Ended
            };
            // An open run is listed live, whatever rollup its first root's end made; so is one
            // whose rollup was made from another root (its end is not this root's).
            let rollup = self.rollups.get(*run_id).filter(|row| {
                root.outcome.is_some()
                    && row.ended_at.is_some()
                    && row.ended_at == root.ended_at
                    && state == RunState::Ended
            });
            // A first root that ended while a later one runs: the running roots' heartbeat.
            let heartbeat = if root.outcome.is_some() && state == RunState::Open {
                self.spans
                    .iter()
                    .filter(|span| {
                        span.run_id == *run_id
                            && span.parent_span_id.is_none()
                            && span.outcome.is_none()
                    })
                    .map(|span| span.last_heartbeat_at.unwrap_or(span.started_at))
                    .max()
            } else {
                root.last_heartbeat_at
            };
            // A live entry's failure reason is what a rollup would say now: the first span to
            // start that failed with a reason, else `interrupted` for an interrupted root.
            let live_failure = {
                let spans: Vec<RollupSpan> = self
                    .run_spans(run_id)
                    .into_iter()
                    .map(|index| RollupSpan::from(&self.spans[index]))
                    .collect();
                compute_rollup(&spans).and_then(|fields| fields.failure_reason)
            };
            let span_count = self
                .spans
                .iter()
                .filter(|span| span.run_id == *run_id)
                .count() as i64;
            // A live entry's usage is what a rollup would say now: the root's own fields, those
            // it lacks from the run's model spans (the store reads the spans only then).
            let usage = if root.usage.carries_every_figure() {
                root.usage.clone()
            } else {
                let spans: Vec<RollupSpan> = self
                    .run_spans(run_id)
                    .into_iter()
                    .map(|index| RollupSpan::from(&self.spans[index]))
                    .collect();
                compute_rollup(&spans).map_or_else(SpanUsage::default, |fields| SpanUsage {
                    input_tokens: fields.input_tokens,
                    output_tokens: fields.output_tokens,
                    cache_read_tokens: fields.cache_read_tokens,
                    cache_creation_tokens: fields.cache_creation_tokens,
                    cost_usd: stored_cost(fields.cost_usd),
                    model: None,
                })
            };
            let usage = &usage;
            // An open run has not ended, whatever its first root did: no end, outcome,
            // duration or failure, and the live span count.
            let open = state == RunState::Open;
            entries.push(RunListEntry {
                run_id: (*run_id).to_owned(),
                state,
                name: root.name.clone(),
                origin: root.origin.clone(),
                session_id: root.session_id.clone(),
                job_name: root.job_name.clone(),
                started_at: root.started_at,
                ended_at: root.ended_at.filter(|_| !open),
                outcome: root.outcome.clone().filter(|_| !open),
                duration_ms: match rollup {
                    _ if open => None,
                    Some(row) => row.duration_ms,
                    None => root
                        .ended_at
                        .map(|ended| ended.saturating_sub(root.started_at)),
                },
                span_count: rollup.map_or(span_count, |row| row.span_count),
                input_tokens: rollup.map_or(usage.input_tokens, |row| row.input_tokens),
                output_tokens: rollup.map_or(usage.output_tokens, |row| row.output_tokens),
                cache_read_tokens: rollup
                    .map_or(usage.cache_read_tokens, |row| row.cache_read_tokens),
                cache_creation_tokens: rollup
                    .map_or(usage.cache_creation_tokens, |row| row.cache_creation_tokens),
                cost_usd: rollup.map_or(usage.cost_usd, |row| row.cost_usd),
                failure_reason: if open {
                    None
                } else {
                    rollup.map_or(live_failure, |row| row.failure_reason.clone())
                },
                last_heartbeat_at: heartbeat,
                rolled_up: rollup.is_some(),
                // The rollup row's flag, live entry or not: detail pruned before the run was
                // written to again stays pruned.
                detail_pruned: self
                    .rollups
                    .get(*run_id)
                    .is_some_and(|row| row.detail_pruned),
                awaiting_root: false,
                live_usage_skipped: false,
            });
        }
        // Runs with spans but no root, from their earliest span (start, then key): ended with
        // their rollup's figures once rolled up with an end and no span is open, else open with
        // their model spans' usage.
        let mut rootless: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (index, span) in self.spans.iter().enumerate() {
            if !first.contains_key(span.run_id.as_str()) {
                rootless
                    .entry(span.run_id.as_str())
                    .or_default()
                    .push(index);
            }
        }
        for (run_id, mut indexes) in rootless {
            indexes.sort_by_key(|&index| (self.spans[index].started_at, index));
            let spans: Vec<RollupSpan> = indexes
                .iter()
                .map(|&index| RollupSpan::from(&self.spans[index]))
                .collect();
            let earliest = &self.spans[indexes[0]];
            // A pruned run's rollup not made again since says how its earlier life ended.
            let ended = self
                .rollups
                .get(run_id)
                .filter(|row| row.ended_at.is_some())
                .filter(|row| !row.detail_pruned || self.rerolled.contains(run_id))
                .filter(|_| spans.iter().all(|span| span.outcome.is_some()));
            let usage = rootless_usage(&spans);
            let mut entry = RunListEntry {
                run_id: run_id.to_owned(),
                state: RunState::Open,
                name: earliest.name.clone(),
                origin: earliest.origin.clone(),
                session_id: earliest.session_id.clone(),
                job_name: earliest.job_name.clone(),
                started_at: earliest.started_at,
                ended_at: None,
                outcome: None,
                duration_ms: None,
                span_count: spans.len() as i64,
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cache_read_tokens: usage.cache_read_tokens,
                cache_creation_tokens: usage.cache_creation_tokens,
                cost_usd: usage.cost_usd,
                failure_reason: None,
                last_heartbeat_at: None,
                rolled_up: false,
                detail_pruned: self
                    .rollups
                    .get(run_id)
                    .is_some_and(|row| row.detail_pruned),
                awaiting_root: true,
                live_usage_skipped: false,
            };
            if let Some(row) = ended {
                entry.state = RunState::Ended;
                entry.ended_at = row.ended_at;
                entry.outcome = row.outcome.clone();
                entry.duration_ms = row.duration_ms;
                entry.span_count = row.span_count;
                entry.input_tokens = row.input_tokens;
                entry.output_tokens = row.output_tokens;
                entry.cache_read_tokens = row.cache_read_tokens;
                entry.cache_creation_tokens = row.cache_creation_tokens;
                entry.cost_usd = row.cost_usd;
                entry.failure_reason = row.failure_reason.clone();
                entry.rolled_up = true;
            }
            entries.push(entry);
        }
        // Entries filtered on the root's columns; pruned runs (no root left) on the rollup's.
        let mut entries: Vec<RunListEntry> = entries
            .into_iter()
            .filter(|entry| query.state.is_none_or(|state| state == entry.state))
            .collect();
        if query.state != Some(RunState::Open) {
            for row in self.rollups.values() {
                if !row.detail_pruned || self.spans.iter().any(|span| span.run_id == row.run_id) {
                    continue;
                }
                entries.push(RunListEntry {
                    run_id: row.run_id.clone(),
                    state: RunState::Ended,
                    name: row.name.clone(),
                    origin: row.origin.clone(),
                    session_id: row.session_id.clone(),
                    job_name: row.job_name.clone(),
                    started_at: row.started_at,
                    ended_at: row.ended_at,
                    outcome: row.outcome.clone(),
                    duration_ms: row.duration_ms,
                    span_count: row.span_count,
                    input_tokens: row.input_tokens,
                    output_tokens: row.output_tokens,
                    cache_read_tokens: row.cache_read_tokens,
                    cache_creation_tokens: row.cache_creation_tokens,
                    cost_usd: row.cost_usd,
                    failure_reason: row.failure_reason.clone(),
                    last_heartbeat_at: None,
                    rolled_up: true,
                    detail_pruned: true,
                    awaiting_root: false,
                    live_usage_skipped: false,
                });
            }
        }
        entries.retain(|entry| {
            query
                .outcome
                .as_ref()
                .is_none_or(|outcome| entry.outcome.as_ref() == Some(outcome))
                && query
                    .origin
                    .as_ref()
                    .is_none_or(|origin| &entry.origin == origin)
        });
        entries.sort_by(|a, b| (b.started_at, &b.run_id).cmp(&(a.started_at, &a.run_id)));
        entries
    }

    fn list_runs(&self, query: &RunListQuery) -> RunPage {
        let limit = query.limit.max(0);
        if limit == 0 || (query.state == Some(RunState::Open) && query.outcome.is_some()) {
            return RunPage {
                runs: Vec::new(),
                next: None,
            };
        }
        let mut runs: Vec<RunListEntry> = self
            .listed_runs(query)
            .into_iter()
            .filter(|entry| {
                query.before.as_ref().is_none_or(|before| {
                    (entry.started_at, &entry.run_id) < (before.started_at, &before.run_id)
                })
            })
            .collect();
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let next = if runs.len() > limit {
            runs.truncate(limit);
            runs.last().map(|last| {
                RunCursor {
                    started_at: last.started_at,
                    run_id: last.run_id.clone(),
                }
                .encode()
            })
        } else {
            None
        };
        RunPage { runs, next }
    }
}

/// An import report with each rejection's reason reduced to its kind.
fn report_kinds(mut report: ImportReport) -> ImportReport {
    for rejection in &mut report.rejected {
        if rejection
            .reason
            .contains(&format!("nests deeper than {MAX_DEPTH} levels"))
        {
            rejection.reason = "too deep".to_owned();
        } else if rejection.reason.contains("already belongs to another run") {
            rejection.reason = "another run".to_owned();
        } else if rejection.reason.contains("was pruned (its spans deleted") {
            rejection.reason = "pruned".to_owned();
        }
    }
    report
}

// ---------------------------------------------------------------------------------------------
// The harness: every call on the store and on the model, compared
// ---------------------------------------------------------------------------------------------

/// The stores over one open database file.
struct Live {
    db: Arc<SqliteDatabase>,
    /// One handle per writer identity (the first built directly, the others by `with_writer`).
    stores: Vec<Arc<dyn ActivityStore>>,
    journal: SqliteEngagementJournal,
    doorbell: ChangeDoorbell,
    subscription: JournalSubscription,
}

impl Live {
    fn open(
        path: &Path,
        clock: Arc<ManualClock>,
        retention: RetentionConfig,
    ) -> Result<Self, TestCaseError> {
        let db = ok("open", SqliteDatabase::open(SqliteConfig::new(path)))?;
        let writers = &pools().writers;
        let first: Arc<dyn ActivityStore> = Arc::new(SqliteActivityStore::with_identity(
            db.clone(),
            clock,
            &writers[0],
        ));
        let mut stores = vec![first.clone()];
        stores.extend(writers[1..].iter().map(|writer| first.with_writer(writer)));
        for (store, writer) in stores.iter().zip(writers) {
            if store.writer() != writer {
                return Err(fail("a store does not act as its writer identity"));
            }
        }
        let journal = SqliteEngagementJournal::new(db.clone(), retention);
        if journal.retention() != retention {
            return Err(fail("the journal does not report its retention"));
        }
        let doorbell = first.change_doorbell();
        let subscription = journal.subscribe();
        Ok(Self {
            db,
            stores,
            journal,
            doorbell,
            subscription,
        })
    }
}

struct Harness {
    _dir: tempfile::TempDir,
    path: PathBuf,
    clock: Arc<ManualClock>,
    now: i64,
    retention: RetentionConfig,
    live: Live,
    model: Model,
    journal_model: InMemoryEngagementJournal,
    /// Events the journal acknowledged since the last look at its subscription.
    published: Vec<EngagementEvent>,
}

impl Harness {
    fn new(retention: RetentionConfig) -> Result<Self, TestCaseError> {
        let dir = tempfile::tempdir().map_err(|err| fail(format!("temp dir: {err}")))?;
        let path = dir.path().join("extremes.db");
        let clock = Arc::new(ManualClock::new(START_CLOCK));
        let live = Live::open(&path, clock.clone(), retention)?;
        Ok(Self {
            _dir: dir,
            path,
            clock,
            now: START_CLOCK,
            retention,
            live,
            model: Model::default(),
            journal_model: InMemoryEngagementJournal::new(retention),
            published: Vec::new(),
        })
    }

    fn store(&self, writer: usize) -> Arc<dyn ActivityStore> {
        self.live.stores[writer].clone()
    }

    fn writer(writer: usize) -> &'static str {
        &pools().writers[writer]
    }

    fn set_clock(&mut self, now: i64) {
        self.clock.set(now);
        self.now = now;
    }

    /// After a write that logged changes, the doorbell is at the newest change id; it never
    /// rings past an id that was handed out.
    fn check_doorbell(&self, what: &str, before: i64) -> Result<(), TestCaseError> {
        let rung = *self.live.doorbell.borrow();
        let newest = self.model.last_change_id;
        if rung > newest || (newest != before && rung != newest) {
            return Err(fail(format!(
                "{what}: the doorbell is at {rung}, the newest change id is {newest}"
            )));
        }
        Ok(())
    }

    async fn start(
        &mut self,
        writer: usize,
        input: StartSpanInput,
    ) -> Result<Outcome<SpanRow>, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self
            .model
            .start_span(&input, Self::writer(writer), self.now);
        let store = outcome("start_span", self.store(writer).start_span(input).await)?;
        same("start_span", &store, &model)?;
        self.check_doorbell("start_span", before)?;
        Ok(store)
    }

    async fn end(
        &mut self,
        writer: usize,
        span_id: &str,
        input: EndSpanInput,
    ) -> Result<Outcome<bool>, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self.model.end_span(span_id, &input, self.now);
        let store = outcome(
            "end_span",
            self.store(writer).end_span(span_id, input).await,
        )?;
        same("end_span", &store, &model)?;
        self.check_doorbell("end_span", before)?;
        Ok(store)
    }

    async fn patch(
        &mut self,
        writer: usize,
        span_id: &str,
        patch: SpanPatch,
    ) -> Result<Outcome<bool>, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self.model.patch_span(span_id, &patch);
        let store = outcome(
            "patch_span",
            self.store(writer).patch_span(span_id, patch).await,
        )?;
        same("patch_span", &store, &model)?;
        self.check_doorbell("patch_span", before)?;
        Ok(store)
    }

    async fn append(
        &mut self,
        writer: usize,
        span_id: &str,
        event_type: &str,
        payload: Option<&Value>,
        ts: Option<i64>,
    ) -> Result<Outcome<Option<SpanEventRow>>, TestCaseError> {
        let payload = HarnessPayload::Value(payload.cloned());
        self.append_as(writer, span_id, event_type, payload, ts)
            .await
    }

    /// `append` with the payload in its stored form (`append_event_text`): the model stores
    /// the value that text reads back as.
    async fn append_text(
        &mut self,
        writer: usize,
        span_id: &str,
        event_type: &str,
        payload: PayloadText,
        ts: Option<i64>,
    ) -> Result<Outcome<Option<SpanEventRow>>, TestCaseError> {
        self.append_as(
            writer,
            span_id,
            event_type,
            HarnessPayload::Stored(payload),
            ts,
        )
        .await
    }

    /// An event through `append_event_text` or `append_event`, checked against the model.
    async fn append_as(
        &mut self,
        writer: usize,
        span_id: &str,
        event_type: &str,
        payload: HarnessPayload,
        ts: Option<i64>,
    ) -> Result<Outcome<Option<SpanEventRow>>, TestCaseError> {
        let before = self.model.last_change_id;
        let value = match &payload {
            HarnessPayload::Stored(text) => Some(stored_payload_value(text)),
            HarnessPayload::Value(value) => value.clone(),
        };
        let model =
            self.model
                .append_event(span_id, event_type, value.as_ref(), ts.unwrap_or(self.now));
        let store = self.store(writer);
        let stored = match payload {
            HarnessPayload::Stored(text) => {
                store.append_event_text(span_id, event_type, text, ts).await
            }
            HarnessPayload::Value(value) => {
                store
                    .append_event(span_id, event_type, value.as_ref(), ts)
                    .await
            }
        };
        let store = outcome("append_event", stored)?;
        same("append_event", &store, &model)?;
        self.check_doorbell("append_event", before)?;
        Ok(store)
    }

    async fn heartbeat(
        &mut self,
        writer: usize,
        span_id: &str,
        at: Option<i64>,
    ) -> Result<(), TestCaseError> {
        self.model.heartbeat(span_id, at.unwrap_or(self.now));
        ok("heartbeat", self.store(writer).heartbeat(span_id, at).await)
    }

    async fn cascade(
        &mut self,
        writer: usize,
        run_id: &str,
        outcome: SpanOutcome,
        reason: &str,
    ) -> Result<i64, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self.model.close_run(run_id, &outcome, reason, self.now);
        let store = ok(
            "cascade_close",
            self.store(writer)
                .cascade_close(run_id, outcome, reason)
                .await,
        )?;
        same("cascade_close", &store, &model)?;
        self.check_doorbell("cascade_close", before)?;
        Ok(store)
    }

    async fn sweep_orphans(&mut self, writer: usize) -> Result<i64, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self.model.sweep_own_orphans(self.now);
        let store = ok(
            "sweep_own_orphans",
            self.store(writer).sweep_own_orphans().await,
        )?;
        same("sweep_own_orphans", &store, &model)?;
        self.check_doorbell("sweep_own_orphans", before)?;
        Ok(store)
    }

    async fn sweep_stale(
        &mut self,
        writer: usize,
        stale_after_ms: i64,
        now: Option<i64>,
    ) -> Result<i64, TestCaseError> {
        let before = self.model.last_change_id;
        let cutoff = now.unwrap_or(self.now).saturating_sub(stale_after_ms);
        let model = self
            .model
            .sweep_stale(Self::writer(writer), cutoff, self.now);
        let store = ok(
            "sweep_stale",
            self.store(writer).sweep_stale(stale_after_ms, now).await,
        )?;
        same("sweep_stale", &store, &model)?;
        self.check_doorbell("sweep_stale", before)?;
        Ok(store)
    }

    async fn find_stuck(
        &mut self,
        threshold_ms: i64,
        now: Option<i64>,
    ) -> Result<Vec<SpanRow>, TestCaseError> {
        let cutoff = now.unwrap_or(self.now).saturating_sub(threshold_ms);
        let model = self.model.find_stuck(cutoff);
        let store = ok(
            "find_stuck",
            self.store(0).find_stuck(threshold_ms, now).await,
        )?;
        same("find_stuck", &store, &model)?;
        Ok(store)
    }

    async fn changes(
        &mut self,
        cursor: i64,
        limit: i64,
    ) -> Result<Vec<ActivityChange>, TestCaseError> {
        let model = self.model.changes_since(cursor, limit);
        let store = ok(
            "changes_since",
            self.store(1).changes_since(cursor, limit).await,
        )?;
        same(&format!("changes_since({cursor}, {limit})"), &store, &model)?;
        Ok(store)
    }

    async fn terminal_roots(
        &mut self,
        cursor: i64,
        limit: i64,
    ) -> Result<Vec<TerminalRootChange>, TestCaseError> {
        let model = self.model.terminal_root_changes_since(cursor, limit);
        let store = ok(
            "terminal_root_changes_since",
            self.store(2)
                .terminal_root_changes_since(cursor, limit)
                .await,
        )?;
        same(
            &format!("terminal_root_changes_since({cursor}, {limit})"),
            &store,
            &model,
        )?;
        Ok(store)
    }

    async fn cursors(&mut self) -> Result<(), TestCaseError> {
        let store = ok(
            "change_log_horizon",
            self.store(0).change_log_horizon().await,
        )?;
        // Nothing is ever this far behind the newest change here, so the log is never trimmed:
        // only prunes move the horizon, past the newest change of the runs they deleted.
        same("change_log_horizon", &store, &self.model.horizon)?;
        let store = ok(
            "latest_change_cursor",
            self.store(0).latest_change_cursor().await,
        )?;
        same("latest_change_cursor", &store, &self.model.latest())
    }

    async fn snapshot(&mut self, run_id: &str) -> Result<Option<RunSnapshot>, TestCaseError> {
        let store = ok("snapshot_run", self.store(0).snapshot_run(run_id).await)?;
        same("snapshot_run", &store, &self.model.snapshot(run_id))?;
        let high = ok(
            "run_high_water_seq",
            self.store(1).run_high_water_seq(run_id).await,
        )?;
        same("run_high_water_seq", &high, &self.model.high_water(run_id))?;
        let newest = ok(
            "run_newest_change_id",
            self.store(2).run_newest_change_id(run_id).await,
        )?;
        same(
            "run_newest_change_id",
            &newest,
            &self.model.newest_change_of(run_id),
        )?;
        Ok(store)
    }

    async fn get_span(&mut self, span_id: &str) -> Result<Option<SpanRow>, TestCaseError> {
        let store = ok("get_span", self.store(2).get_span(span_id).await)?;
        let model = self
            .model
            .pos(span_id)
            .map(|index| self.model.spans[index].clone());
        same("get_span", &store, &model)?;
        Ok(store)
    }

    async fn open_roots(&mut self) -> Result<Vec<SpanRow>, TestCaseError> {
        let store = ok("open_root_spans", self.store(0).open_root_spans().await)?;
        same("open_root_spans", &store, &self.model.open_root_spans())?;
        Ok(store)
    }

    async fn rollup(&mut self, run_id: &str) -> Result<(), TestCaseError> {
        self.model.rollup_run(run_id);
        ok("rollup_run", self.store(1).rollup_run(run_id).await)?;
        self.read_rollup(run_id).await.map(|_| ())
    }

    async fn read_rollup(&mut self, run_id: &str) -> Result<Option<RunRollupRow>, TestCaseError> {
        let store = ok("read_rollup", self.store(2).read_rollup(run_id).await)?;
        same(
            "read_rollup",
            &store,
            &self.model.rollups.get(run_id).cloned(),
        )?;
        Ok(store)
    }

    async fn prune(&mut self, options: PruneOptions) -> Result<PruneResult, TestCaseError> {
        let model = self.model.prune(&options, self.now);
        let store = ok("prune", self.store(0).prune(options.clone()).await)?;
        same(&format!("prune({options:?})"), &store, &model)?;
        Ok(store)
    }

    async fn batch(
        &mut self,
        writer: usize,
        writes: Vec<ActivityWrite>,
    ) -> Result<Vec<Outcome<ActivityWriteResult>>, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self.model.batch(&writes, Self::writer(writer), self.now);
        let store = self
            .store(writer)
            .write_batch(writes)
            .await
            .into_iter()
            .map(|result| outcome("write_batch", result))
            .collect::<Result<Vec<_>, _>>()?;
        same("write_batch", &store, &model)?;
        self.check_doorbell("write_batch", before)?;
        Ok(store)
    }

    async fn import(
        &mut self,
        writer: usize,
        spans: Vec<ImportedSpan>,
    ) -> Result<ImportReport, TestCaseError> {
        let before = self.model.last_change_id;
        let model = self.model.import(&spans, Self::writer(writer), self.now);
        let store = ok("import_spans", self.store(writer).import_spans(spans).await)?;
        let store = report_kinds(store);
        same("import_spans", &store, &model)?;
        self.check_doorbell("import_spans", before)?;
        Ok(store)
    }

    async fn list_runs(&mut self, query: RunListQuery) -> Result<RunPage, TestCaseError> {
        let model = self.model.list_runs(&query);
        let store = ok("list_runs", self.store(1).list_runs(query.clone()).await)?;
        same(&format!("list_runs({query:?})"), &store, &model)?;
        Ok(store)
    }

    /// Every run the query lists, page by page of `limit`: each exactly once, in order.
    async fn page_through(&mut self, query: RunListQuery) -> Result<(), TestCaseError> {
        let everything = self.model.listed_runs(&query);
        let mut seen: Vec<RunListEntry> = Vec::new();
        let mut before = None;
        for _ in 0..=everything.len() + 1 {
            let page = self
                .list_runs(RunListQuery {
                    before: before.clone(),
                    ..query.clone()
                })
                .await?;
            seen.extend(page.runs);
            match page.next {
                None => {
                    let ids: BTreeSet<&str> = seen.iter().map(|run| run.run_id.as_str()).collect();
                    if ids.len() != seen.len() {
                        return Err(fail(format!("a run was listed twice: {seen:?}")));
                    }
                    return same(&format!("all pages of {query:?}"), &seen, &everything);
                }
                Some(next) => {
                    before = Some(
                        RunCursor::decode(&next)
                            .ok_or_else(|| fail(format!("undecodable cursor {next:?}")))?,
                    );
                }
            }
        }
        Err(fail("paging through the runs did not end"))
    }

    // ---- the journal ----

    async fn journal_append(
        &mut self,
        input: AppendInput,
    ) -> Result<Result<EngagementEvent, String>, TestCaseError> {
        let model = self.journal_model.append(input.clone()).await;
        let store = self.live.journal.append(input).await;
        self.compare_appends("append", store, model)
    }

    async fn journal_append_json(
        &mut self,
        raw: Value,
    ) -> Result<Result<EngagementEvent, String>, TestCaseError> {
        let model = self.journal_model.append_json(raw.clone()).await;
        let store = self.live.journal.append_json(raw).await;
        self.compare_appends("append_json", store, model)
    }

    /// The store's and the model's answers to one append must agree; an appended event is
    /// remembered as published (the subscription must deliver it).
    fn compare_appends(
        &mut self,
        call: &str,
        store: Result<EngagementEvent, JournalError>,
        model: Result<EngagementEvent, JournalError>,
    ) -> Result<Result<EngagementEvent, String>, TestCaseError> {
        let model = journal_outcome(&format!("model {call}"), model)?;
        let store = journal_outcome(call, store)?;
        same(&format!("journal {call}"), &store, &model)?;
        if let Ok(event) = &store {
            self.published.push(event.clone());
        }
        Ok(store)
    }

    async fn journal_read_from(
        &mut self,
        engagement_id: &str,
        from_seq: Option<i64>,
    ) -> Result<Vec<EngagementEvent>, TestCaseError> {
        let (model, store) = match from_seq {
            None => (
                self.journal_model.read(engagement_id).await,
                self.live.journal.read(engagement_id).await,
            ),
            Some(seq) => (
                self.journal_model.read_from(engagement_id, seq).await,
                self.live.journal.read_from(engagement_id, seq).await,
            ),
        };
        let model = journal_outcome("model read", model)?;
        let store = journal_outcome("read", store)?;
        same(&format!("journal read from {from_seq:?}"), &store, &model)?;
        store.map_err(fail)
    }

    async fn journal_summarize(
        &mut self,
        engagement_id: &str,
    ) -> Result<Option<EngagementSummary>, TestCaseError> {
        let model = journal_outcome(
            "model summarize",
            self.journal_model.summarize(engagement_id).await,
        )?;
        let store = journal_outcome(
            "summarize",
            self.live.journal.summarize(engagement_id).await,
        )?;
        same("journal summarize", &store, &model)?;
        store.map_err(fail)
    }

    async fn journal_compact(&mut self, engagement_id: &str) -> Result<bool, TestCaseError> {
        let model = journal_outcome(
            "model compact",
            self.journal_model.compact(engagement_id).await,
        )?;
        let store = journal_outcome("compact", self.live.journal.compact(engagement_id).await)?;
        same("journal compact", &store, &model)?;
        store.map_err(fail)
    }

    async fn journal_list(&mut self, limit: Option<i64>) -> Result<Vec<String>, TestCaseError> {
        let model = journal_outcome(
            "model list_engagements",
            self.journal_model.list_engagements(limit).await,
        )?;
        let store = journal_outcome(
            "list_engagements",
            self.live.journal.list_engagements(limit).await,
        )?;
        same(&format!("list_engagements({limit:?})"), &store, &model)?;
        store.map_err(fail)
    }

    async fn journal_prune(&mut self, now: i64) -> Result<u64, TestCaseError> {
        let model = journal_outcome("model prune", self.journal_model.prune(now).await)?;
        let store = journal_outcome("journal prune", self.live.journal.prune(now).await)?;
        same(&format!("journal prune({now})"), &store, &model)?;
        store.map_err(fail)
    }

    /// The subscription saw each acknowledged append once, in order, and nothing else.
    fn check_published(&mut self) -> Result<(), TestCaseError> {
        let mut seen = Vec::new();
        loop {
            match self.live.subscription.try_recv() {
                Ok(committed) => seen.push(committed.event),
                Err(tokio::sync::broadcast::error::TryRecvError::Empty) => break,
                Err(err) => return Err(fail(format!("journal subscription: {err}"))),
            }
        }
        same("published journal events", &seen, &self.published)?;
        self.published.clear();
        Ok(())
    }

    // ---- reading everything back ----

    /// Read everything back through every read method and compare it with the model.
    async fn check_all(&mut self, what: &str) -> Result<(), TestCaseError> {
        let all = self.changes(i64::MIN, i64::MAX).await?;
        let mut seqs: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for (index, change) in all.iter().enumerate() {
            if index > 0 && change.change_id <= all[index - 1].change_id {
                return Err(fail(format!("{what}: change ids are not increasing")));
            }
            seqs.entry(&change.run_id).or_default().push(change.seq);
        }
        for (run_id, seqs) in seqs {
            if !seqs.iter().copied().eq(1..=seqs.len() as i64) {
                return Err(fail(format!(
                    "{what}: the seqs of run {run_id:?} are {seqs:?}, not dense from 1"
                )));
            }
        }
        self.terminal_roots(i64::MIN, -1).await?;
        self.cursors().await?;
        let span_ids: BTreeSet<String> = self
            .model
            .spans
            .iter()
            .map(|span| span.span_id.clone())
            .chain(pools().ids.iter().cloned())
            .collect();
        for span_id in &span_ids {
            self.get_span(span_id).await?;
        }
        let run_ids: BTreeSet<String> = self
            .model
            .run_ids()
            .into_iter()
            .chain(pools().ids.iter().cloned())
            .collect();
        for run_id in &run_ids {
            self.snapshot(run_id).await?;
            self.read_rollup(run_id).await?;
        }
        self.open_roots().await?;
        self.find_stuck(i64::MIN, Some(i64::MAX)).await?;
        self.find_stuck(0, None).await?;
        for limit in [1, 2, i64::MAX] {
            self.page_through(RunListQuery {
                state: None,
                outcome: None,
                origin: None,
                limit,
                before: None,
            })
            .await?;
        }
        for state in [RunState::Open, RunState::Ended] {
            self.page_through(RunListQuery {
                state: Some(state),
                outcome: None,
                origin: None,
                limit: 3,
                before: None,
            })
            .await?;
        }
        let engagements: BTreeSet<String> = self
            .journal_list(None)
            .await?
            .into_iter()
            .chain(pools().ids.iter().cloned())
            .collect();
        for engagement_id in &engagements {
            let events = self.journal_read_from(engagement_id, None).await?;
            if !events
                .iter()
                .map(|event| event.seq)
                .eq(0..events.len() as i64)
            {
                return Err(fail(format!(
                    "{what}: the journal seqs of {engagement_id:?} are not dense from 0"
                )));
            }
            self.journal_summarize(engagement_id).await?;
        }
        self.check_published()?;
        self.check_doorbell(what, self.model.last_change_id)
    }

    /// Close the database (every handle dropped) and open the file again.
    async fn reopen(&mut self) -> Result<(), TestCaseError> {
        self.check_published()?;
        ok("flush", self.live.db.flush().await)?;
        self.live = Live::open(&self.path, self.clock.clone(), self.retention)?;
        Ok(())
    }

    /// After a reopen: every span id still held is refused as a duplicate, alone and in a
    /// batch, and new writes of every kind work.
    async fn after_reopen(&mut self) -> Result<(), TestCaseError> {
        let again = |span: &SpanRow| StartSpanInput {
            span_id: span.span_id.clone(),
            run_id: span.run_id.clone(),
            parent_span_id: None,
            name: "again".to_owned(),
            kind: SpanKind::Turn,
            origin: SpanOrigin::Otlp,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: Some(0),
        };
        let held = self.model.spans.clone();
        for span in &held {
            let result = self.start(0, again(span)).await?;
            if result != Err(Refusal::Duplicate(span.span_id.clone())) {
                return Err(fail("a span id held before the reopen was not refused"));
            }
        }
        let writes = held
            .iter()
            .map(|span| ActivityWrite::StartSpan(again(span)))
            .collect();
        for result in self.batch(2, writes).await? {
            if !matches!(result, Err(Refusal::Duplicate(_))) {
                return Err(fail("a span id held before the reopen was not refused"));
            }
        }
        let (span, run) = ("fresh span after reopen", "fresh run after reopen");
        let _ = self
            .start(
                2,
                StartSpanInput {
                    span_id: span.to_owned(),
                    run_id: run.to_owned(),
                    parent_span_id: None,
                    name: "fresh".to_owned(),
                    kind: SpanKind::Turn,
                    origin: SpanOrigin::Session,
                    session_id: None,
                    job_name: None,
                    attrs: Some(object(json!({"k": "v"}))),
                    started_at: None,
                },
            )
            .await?;
        let _ = self
            .append(1, span, "after", Some(&json!({"n": 1})), None)
            .await?;
        let _ = self
            .patch(
                0,
                span,
                SpanPatch {
                    attrs: Some(object(json!({"k": "w"}))),
                    usage: None,
                    wait_until: Some(1),
                },
            )
            .await?;
        let _ = self
            .end(0, span, end_input(SpanOutcome::Success, None))
            .await?;
        self.rollup(run).await?;
        self.import(
            1,
            vec![imported(
                "fresh import after reopen",
                run,
                Some(span),
                Some(ImportedEnd {
                    ended_at: 5,
                    outcome: SpanOutcome::Success,
                    reason: None,
                }),
            )],
        )
        .await?;
        let event = AppendInput::new("fresh engagement after reopen", 1, "x", JsonObject::new())
            .map_err(|err| fail(format!("{err}")))?;
        let _ = self.journal_append(event).await?;
        self.check_all("after the reopen and new writes").await
    }
}

fn end_input(outcome: SpanOutcome, ended_at: Option<i64>) -> EndSpanInput {
    EndSpanInput {
        outcome,
        reason: None,
        ended_at,
        usage: None,
        attrs: None,
    }
}

fn start_input(
    span_id: &str,
    run_id: &str,
    parent: Option<&str>,
    at: Option<i64>,
) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.to_owned(),
        run_id: run_id.to_owned(),
        parent_span_id: parent.map(str::to_owned),
        name: format!("name of {span_id}"),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: at,
    }
}

fn imported(
    span_id: &str,
    run_id: &str,
    parent: Option<&str>,
    end: Option<ImportedEnd>,
) -> ImportedSpan {
    ImportedSpan {
        priced_at: None,
        span_id: span_id.to_owned(),
        run_id: run_id.to_owned(),
        parent_span_id: parent.map(str::to_owned),
        name: format!("imported {span_id}"),
        kind: SpanKind::Other,
        origin: SpanOrigin::Otlp,
        session_id: None,
        job_name: None,
        attrs: ImportedAttrs::default(),
        started_at: 1,
        end,
        usage: SpanUsage::default(),
        call_id: None,
        remote_parent: None,
        events: vec![ImportedEvent {
            ts: 2,
            event_type: "imported".to_owned(),
            payload: json!({"from": "otlp"}),
        }],
    }
}

// ---------------------------------------------------------------------------------------------
// Generated operations
// ---------------------------------------------------------------------------------------------

/// One span write, its arguments as indexes into the pools.
#[derive(Debug, Clone)]
enum Write {
    Start {
        span: usize,
        run: usize,
        parent: Option<usize>,
        name: usize,
        kind: usize,
        origin: usize,
        session: Option<usize>,
        job: Option<usize>,
        attrs: usize,
        at: Option<usize>,
    },
    End {
        span: usize,
        outcome: usize,
        reason: Option<usize>,
        at: Option<usize>,
        usage: usize,
        attrs: usize,
    },
    Patch {
        span: usize,
        attrs: usize,
        usage: usize,
        wait: Option<usize>,
    },
    Append {
        span: usize,
        event_type: usize,
        payload: usize,
        ts: Option<usize>,
    },
    Heartbeat {
        span: usize,
        at: Option<usize>,
    },
}

impl Write {
    fn resolve(&self) -> ActivityWrite {
        let p = pools();
        let time = |index: &Option<usize>| index.map(|index| TIMES[index]);
        match self {
            Write::Start {
                span,
                run,
                parent,
                name,
                kind,
                origin,
                session,
                job,
                attrs,
                at,
            } => ActivityWrite::StartSpan(StartSpanInput {
                span_id: id(*span),
                run_id: id(*run),
                parent_span_id: parent.map(id),
                name: id(*name),
                kind: KINDS[*kind].clone(),
                origin: ORIGINS[*origin].clone(),
                session_id: session.map(id),
                job_name: job.map(id),
                attrs: p.attrs[*attrs].clone(),
                started_at: time(at),
            }),
            Write::End {
                span,
                outcome,
                reason,
                at,
                usage,
                attrs,
            } => ActivityWrite::EndSpan {
                span_id: id(*span),
                input: EndSpanInput {
                    outcome: OUTCOMES[*outcome].clone(),
                    reason: reason.map(id),
                    ended_at: time(at),
                    usage: p.usages[*usage].clone(),
                    attrs: p.attrs[*attrs].clone(),
                },
            },
            Write::Patch {
                span,
                attrs,
                usage,
                wait,
            } => ActivityWrite::PatchSpan {
                span_id: id(*span),
                patch: SpanPatch {
                    attrs: p.attrs[*attrs].clone(),
                    usage: p.usages[*usage].clone(),
                    wait_until: time(wait),
                },
            },
            Write::Append {
                span,
                event_type,
                payload,
                ts,
            } => {
                let value = p.payloads[*payload].clone();
                // Every other event type's payloads come in their stored form, as the HTTP
                // endpoints read them when they can.
                let stored = (*event_type % 2 == 1)
                    .then(|| cap_payload(value.as_ref()))
                    .filter(|capped| !capped.truncated)
                    .and_then(|capped| PayloadText::from_json_text(&capped.json));
                match stored {
                    Some(payload) => ActivityWrite::AppendEventText {
                        span_id: id(*span),
                        event_type: id(*event_type),
                        payload,
                        ts: time(ts),
                    },
                    None => ActivityWrite::AppendEvent {
                        span_id: id(*span),
                        event_type: id(*event_type),
                        payload: value,
                        ts: time(ts),
                    },
                }
            }
            Write::Heartbeat { span, at } => ActivityWrite::Heartbeat {
                span_id: id(*span),
                at: time(at),
            },
        }
    }
}

#[derive(Debug, Clone)]
struct ImportOp {
    span: usize,
    run: usize,
    parent: Option<usize>,
    kind: usize,
    attrs: usize,
    encoded: bool,
    started: usize,
    end: Option<(usize, usize, Option<usize>)>,
    usage: usize,
    events: Vec<(usize, usize, usize)>,
}

impl ImportOp {
    fn resolve(&self) -> ImportedSpan {
        let p = pools();
        let attrs = p.attrs[self.attrs].clone().unwrap_or_default();
        // The encoded form is the importer's promise of a valid, shallow object: keep it so.
        let attrs = if self.encoded && !object_too_deep(&attrs) {
            ImportedAttrs::Encoded(EncodedAttrs::from_object_text(
                serde_json::to_string(&attrs).expect("attrs serialize"),
            ))
        } else {
            ImportedAttrs::Object(attrs)
        };
        ImportedSpan {
            priced_at: None,
            span_id: id(self.span),
            run_id: id(self.run),
            parent_span_id: self.parent.map(id),
            name: id(self.span),
            kind: KINDS[self.kind].clone(),
            origin: ORIGINS[self.kind % ORIGINS.len()].clone(),
            session_id: None,
            job_name: Some(id(self.run)),
            attrs,
            started_at: TIMES[self.started],
            end: self.end.map(|(at, outcome, reason)| ImportedEnd {
                ended_at: TIMES[at],
                outcome: OUTCOMES[outcome].clone(),
                reason: reason.map(id),
            }),
            usage: p.usages[self.usage].clone().unwrap_or_default(),
            call_id: None,
            remote_parent: None,
            events: self
                .events
                .iter()
                .map(|&(ts, event_type, payload)| ImportedEvent {
                    ts: TIMES[ts],
                    event_type: id(event_type),
                    payload: p.payloads[payload].clone().unwrap_or(Value::Null),
                })
                .collect(),
        }
    }
}

/// The raw input of a journal append: a valid shape, or one of the shapes validation refuses.
#[derive(Debug, Clone)]
struct JournalInput {
    engagement: usize,
    at: usize,
    event_type: usize,
    data: usize,
    /// 0: as built; 1: not an object; 2: `at` as a float; 3: a fractional `at`; 4: `at` past
    /// `i64`; 5: `at` as a string; 6: no type; 7: data not an object; 8: a numeric id.
    shape: usize,
    /// 0: none; 1: the next seq; otherwise `SEQS[expected - 2]`.
    expected: usize,
}

impl JournalInput {
    fn raw(&self) -> Value {
        let at = JOURNAL_ATS[self.at];
        let mut raw = json!({
            "engagementId": id(self.engagement),
            "at": at,
            "type": JOURNAL_TYPES[self.event_type],
            "data": Value::Object(pools().journal_data[self.data].clone()),
        });
        match self.shape {
            1 => raw = json!([raw]),
            2 => raw["at"] = json!(at as f64),
            3 => raw["at"] = json!(1.5),
            4 => raw["at"] = json!(u64::MAX),
            5 => raw["at"] = json!(at.to_string()),
            6 => {
                if let Some(map) = raw.as_object_mut() {
                    map.remove("type");
                }
            }
            7 => raw["data"] = json!([]),
            8 => raw["engagementId"] = json!(5),
            _ => {}
        }
        raw
    }
}

#[derive(Debug, Clone)]
enum Op {
    Clock(usize),
    Write(usize, Write),
    Batch(usize, Vec<Write>),
    Import(usize, Vec<ImportOp>),
    Cascade {
        writer: usize,
        run: usize,
        outcome: usize,
        reason: usize,
    },
    SweepOrphans(usize),
    SweepStale {
        writer: usize,
        after: usize,
        now: Option<usize>,
    },
    FindStuck {
        threshold: usize,
        now: Option<usize>,
    },
    Changes {
        cursor: usize,
        limit: usize,
    },
    TerminalRoots {
        cursor: usize,
        limit: usize,
    },
    Cursors,
    Snapshot(usize),
    GetSpan(usize),
    OpenRoots,
    Rollup(usize),
    ReadRollup(usize),
    Prune {
        floor: usize,
        ceiling: usize,
        now: Option<usize>,
        batch: usize,
    },
    ListRuns {
        state: usize,
        outcome: Option<usize>,
        origin: Option<usize>,
        limit: usize,
        before: Option<(usize, usize)>,
    },
    JournalAppend(JournalInput),
    JournalRead {
        engagement: usize,
        from: Option<usize>,
    },
    JournalSummarize(usize),
    JournalCompact(usize),
    JournalList(usize),
    JournalPrune(usize),
    /// Enough bookkeeping events (and maybe a close) for the engagement to be compactable.
    JournalBurst {
        engagement: usize,
        count: usize,
        closed: bool,
    },
    CheckAll,
}

fn id_index() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 0..HOT_IDS, 1 => 0..pools().ids.len()]
}

fn time_index() -> impl Strategy<Value = usize> {
    0..TIMES.len()
}

fn maybe_time() -> impl Strategy<Value = Option<usize>> {
    proptest::option::of(time_index())
}

fn writer_index() -> impl Strategy<Value = usize> {
    0..pools().writers.len()
}

fn payload_index() -> impl Strategy<Value = usize> {
    prop_oneof![4 => 0..8usize, 1 => 0..pools().payloads.len()]
}

fn attrs_index() -> impl Strategy<Value = usize> {
    0..pools().attrs.len()
}

fn usage_index() -> impl Strategy<Value = usize> {
    0..pools().usages.len()
}

fn write() -> impl Strategy<Value = Write> {
    let start = (
        id_index(),
        id_index(),
        proptest::option::weighted(0.4, id_index()),
        id_index(),
        0..KINDS.len(),
        0..ORIGINS.len(),
        proptest::option::of(id_index()),
        proptest::option::of(id_index()),
        attrs_index(),
        maybe_time(),
    )
        .prop_map(
            |(span, run, parent, name, kind, origin, session, job, attrs, at)| Write::Start {
                span,
                run,
                parent,
                name,
                kind,
                origin,
                session,
                job,
                attrs,
                at,
            },
        );
    let end = (
        id_index(),
        0..OUTCOMES.len(),
        proptest::option::of(id_index()),
        maybe_time(),
        usage_index(),
        attrs_index(),
    )
        .prop_map(|(span, outcome, reason, at, usage, attrs)| Write::End {
            span,
            outcome,
            reason,
            at,
            usage,
            attrs,
        });
    let patch = (id_index(), attrs_index(), usage_index(), maybe_time()).prop_map(
        |(span, attrs, usage, wait)| Write::Patch {
            span,
            attrs,
            usage,
            wait,
        },
    );
    let append = (id_index(), id_index(), payload_index(), maybe_time()).prop_map(
        |(span, event_type, payload, ts)| Write::Append {
            span,
            event_type,
            payload,
            ts,
        },
    );
    let heartbeat = (id_index(), maybe_time()).prop_map(|(span, at)| Write::Heartbeat { span, at });
    prop_oneof![
        4 => start,
        3 => end,
        2 => patch,
        4 => append,
        1 => heartbeat,
    ]
}

fn import_op() -> impl Strategy<Value = ImportOp> {
    (
        id_index(),
        id_index(),
        proptest::option::weighted(0.3, id_index()),
        0..KINDS.len(),
        attrs_index(),
        any::<bool>(),
        time_index(),
        proptest::option::of((
            time_index(),
            0..OUTCOMES.len(),
            proptest::option::of(id_index()),
        )),
        usage_index(),
        prop::collection::vec((time_index(), 0..4usize, payload_index()), 0..3),
    )
        .prop_map(
            |(span, run, parent, kind, attrs, encoded, started, end, usage, events)| ImportOp {
                span,
                run,
                parent,
                kind,
                attrs,
                encoded,
                started,
                end,
                usage,
                events,
            },
        )
}

fn journal_op() -> impl Strategy<Value = Op> {
    let append = (
        id_index(),
        prop_oneof![3 => 0..6usize, 1 => 0..JOURNAL_ATS.len()],
        0..JOURNAL_TYPES.len(),
        0..pools().journal_data.len(),
        prop_oneof![4 => Just(0usize), 1 => 1..9usize],
        prop_oneof![2 => Just(0usize), 1 => 0..SEQS.len() + 2],
    )
        .prop_map(|(engagement, at, event_type, data, shape, expected)| {
            Op::JournalAppend(JournalInput {
                engagement,
                at,
                event_type,
                data,
                shape,
                expected,
            })
        });
    prop_oneof![
        8 => append,
        1 => (id_index(), proptest::option::of(0..SEQS.len()))
            .prop_map(|(engagement, from)| Op::JournalRead { engagement, from }),
        1 => id_index().prop_map(Op::JournalSummarize),
        1 => id_index().prop_map(Op::JournalCompact),
        1 => (0..JOURNAL_LIMITS.len()).prop_map(Op::JournalList),
        1 => time_index().prop_map(Op::JournalPrune),
        1 => (0..HOT_IDS, 18..26usize, any::<bool>()).prop_map(|(engagement, count, closed)| {
            Op::JournalBurst {
                engagement,
                count,
                closed,
            }
        }),
    ]
}

fn read_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (writer_index(), time_index(), maybe_time())
            .prop_map(|(writer, after, now)| Op::SweepStale { writer, after, now }),
        (time_index(), maybe_time()).prop_map(|(threshold, now)| Op::FindStuck { threshold, now }),
        (0..CURSORS.len(), 0..LIMITS.len())
            .prop_map(|(cursor, limit)| Op::Changes { cursor, limit }),
        (0..CURSORS.len(), 0..LIMITS.len())
            .prop_map(|(cursor, limit)| Op::TerminalRoots { cursor, limit }),
        Just(Op::Cursors),
        id_index().prop_map(Op::Snapshot),
        id_index().prop_map(Op::GetSpan),
        Just(Op::OpenRoots),
        id_index().prop_map(Op::ReadRollup),
        (
            0..3usize,
            proptest::option::of(0..OUTCOMES.len()),
            proptest::option::of(0..ORIGINS.len()),
            0..LIMITS.len(),
            proptest::option::of((time_index(), id_index())),
        )
            .prop_map(|(state, outcome, origin, limit, before)| Op::ListRuns {
                state,
                outcome,
                origin,
                limit,
                before,
            }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => time_index().prop_map(Op::Clock),
        16 => (writer_index(), write()).prop_map(|(writer, write)| Op::Write(writer, write)),
        3 => (writer_index(), prop::collection::vec(write(), 1..6))
            .prop_map(|(writer, writes)| Op::Batch(writer, writes)),
        3 => (writer_index(), prop::collection::vec(import_op(), 1..4))
            .prop_map(|(writer, spans)| Op::Import(writer, spans)),
        2 => (writer_index(), id_index(), 0..OUTCOMES.len(), id_index()).prop_map(
            |(writer, run, outcome, reason)| Op::Cascade {
                writer,
                run,
                outcome,
                reason,
            }
        ),
        1 => writer_index().prop_map(Op::SweepOrphans),
        1 => id_index().prop_map(Op::Rollup),
        2 => (time_index(), time_index(), maybe_time(), 0..PRUNE_BATCHES.len()).prop_map(
            |(floor, ceiling, now, batch)| Op::Prune {
                floor,
                ceiling,
                now,
                batch,
            }
        ),
        5 => read_op(),
        6 => journal_op(),
        1 => Just(Op::CheckAll),
    ]
}

/// One case: the journal's retention and the calls.
fn case() -> impl Strategy<Value = (usize, usize, Vec<Op>)> {
    (
        0..MAX_EVENTS.len(),
        0..MAX_AGES.len(),
        prop::collection::vec(op(), 1..80),
    )
}

async fn perform(h: &mut Harness, op: &Op) -> Result<(), TestCaseError> {
    let time = |index: &Option<usize>| index.map(|index| TIMES[index]);
    match op {
        Op::Clock(at) => h.set_clock(TIMES[*at]),
        Op::Write(writer, write) => perform_write(h, *writer, write.resolve()).await?,
        Op::Batch(writer, writes) => {
            h.batch(*writer, writes.iter().map(Write::resolve).collect())
                .await?;
        }
        Op::Import(writer, spans) => {
            h.import(*writer, spans.iter().map(ImportOp::resolve).collect())
                .await?;
        }
        Op::Cascade {
            writer,
            run,
            outcome,
            reason,
        } => {
            h.cascade(*writer, &id(*run), OUTCOMES[*outcome].clone(), &id(*reason))
                .await?;
        }
        Op::SweepOrphans(writer) => {
            h.sweep_orphans(*writer).await?;
        }
        Op::SweepStale { writer, after, now } => {
            h.sweep_stale(*writer, TIMES[*after], time(now)).await?;
        }
        Op::FindStuck { threshold, now } => {
            h.find_stuck(TIMES[*threshold], time(now)).await?;
        }
        Op::Changes { cursor, limit } => {
            h.changes(CURSORS[*cursor], LIMITS[*limit]).await?;
        }
        Op::TerminalRoots { cursor, limit } => {
            h.terminal_roots(CURSORS[*cursor], LIMITS[*limit]).await?;
        }
        Op::Cursors => h.cursors().await?,
        Op::Snapshot(run) => {
            h.snapshot(&id(*run)).await?;
        }
        Op::GetSpan(span) => {
            h.get_span(&id(*span)).await?;
        }
        Op::OpenRoots => {
            h.open_roots().await?;
        }
        Op::Rollup(run) => h.rollup(&id(*run)).await?,
        Op::ReadRollup(run) => {
            h.read_rollup(&id(*run)).await?;
        }
        Op::Prune {
            floor,
            ceiling,
            now,
            batch,
        } => {
            h.prune(PruneOptions {
                max_spans: None,
                digest_floor_at: TIMES[*floor],
                hard_ceiling_ms: TIMES[*ceiling],
                now: time(now),
                batch: PRUNE_BATCHES[*batch],
                scheduled: false,
            })
            .await?;
        }
        Op::ListRuns {
            state,
            outcome,
            origin,
            limit,
            before,
        } => {
            h.list_runs(RunListQuery {
                state: [None, Some(RunState::Open), Some(RunState::Ended)][*state],
                outcome: outcome.map(|outcome| OUTCOMES[outcome].clone()),
                origin: origin.map(|origin| ORIGINS[origin].clone()),
                limit: LIMITS[*limit],
                before: before.map(|(at, run)| RunCursor {
                    started_at: TIMES[at],
                    run_id: id(run),
                }),
            })
            .await?;
        }
        Op::JournalAppend(input) => {
            let raw = input.raw();
            let expected = match input.expected {
                0 => None,
                1 => {
                    let engagement = id(input.engagement);
                    let held = h
                        .journal_model
                        .read(&engagement)
                        .await
                        .map_err(|err| fail(format!("model read: {err}")))?;
                    Some(held.len() as i64)
                }
                other => Some(SEQS[other - 2]),
            };
            match (expected, AppendInput::from_json(raw.clone())) {
                (Some(seq), Ok(append)) => {
                    let _ = h.journal_append(append.with_expected_seq(seq)).await?;
                }
                _ => {
                    let _ = h.journal_append_json(raw).await?;
                }
            }
        }
        Op::JournalRead { engagement, from } => {
            h.journal_read_from(&id(*engagement), from.map(|from| SEQS[from]))
                .await?;
        }
        Op::JournalSummarize(engagement) => {
            h.journal_summarize(&id(*engagement)).await?;
        }
        Op::JournalCompact(engagement) => {
            h.journal_compact(&id(*engagement)).await?;
        }
        Op::JournalList(limit) => {
            h.journal_list(JOURNAL_LIMITS[*limit]).await?;
        }
        Op::JournalPrune(now) => {
            h.journal_prune(TIMES[*now]).await?;
        }
        Op::JournalBurst {
            engagement,
            count,
            closed,
        } => {
            for n in 0..*count {
                let event_type = ["budget_charged", "turn_started", "mail_sent"][n % 3];
                let raw = json!({"engagementId": id(*engagement), "at": n, "type": event_type,
                                 "data": {"amount": 1, "key": "tokens", "mailId": format!("m{n}")}});
                let _ = h.journal_append_json(raw).await?;
            }
            if *closed {
                let raw = json!({"engagementId": id(*engagement), "at": count, "type": "engagement_closed",
                                 "data": {"status": "completed"}});
                let _ = h.journal_append_json(raw).await?;
            }
        }
        Op::CheckAll => h.check_all("a check in the sequence").await?,
    }
    Ok(())
}

async fn perform_write(
    h: &mut Harness,
    writer: usize,
    write: ActivityWrite,
) -> Result<(), TestCaseError> {
    match write {
        ActivityWrite::StartSpan(input) => {
            let _ = h.start(writer, input).await?;
        }
        ActivityWrite::EndSpan { span_id, input } => {
            let _ = h.end(writer, &span_id, input).await?;
        }
        ActivityWrite::PatchSpan { span_id, patch } => {
            let _ = h.patch(writer, &span_id, patch).await?;
        }
        ActivityWrite::AppendEvent {
            span_id,
            event_type,
            payload,
            ts,
        } => {
            let _ = h
                .append(writer, &span_id, &event_type, payload.as_ref(), ts)
                .await?;
        }
        ActivityWrite::AppendEventText {
            span_id,
            event_type,
            payload,
            ts,
        } => {
            let _ = h
                .append_text(writer, &span_id, &event_type, payload, ts)
                .await?;
        }
        ActivityWrite::Heartbeat { span_id, at } => h.heartbeat(writer, &span_id, at).await?,
    }
    Ok(())
}

/// An event's payload as the harness hands it to the store.
enum HarnessPayload {
    /// In its stored form: `append_event_text`.
    Stored(PayloadText),
    /// As a value: `append_event`.
    Value(Option<Value>),
}

/// The value a stored payload's text reads back as.
fn stored_payload_value(payload: &PayloadText) -> Value {
    flightlog_core::json_as_written::from_slice(payload.as_str().as_bytes()).unwrap_or(Value::Null)
}

async fn run_case(max_events: usize, max_age: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig {
        max_events_per_engagement: MAX_EVENTS[max_events],
        max_age_ms: MAX_AGES[max_age],
    })?;
    for (index, op) in ops.iter().enumerate() {
        perform(&mut h, op)
            .await
            .map_err(|err| fail(format!("op #{index} {op:?}: {err}")))?;
    }
    h.check_all("after the sequence").await?;
    h.reopen().await?;
    h.check_all("after reopening the file").await?;
    h.after_reopen().await
}

/// A fixed seed, so the 64 cases are the same on every run.
const SEED: [u8; 32] = *b"flightlog extremes property 2025";

#[test]
fn every_operation_survives_extreme_inputs() {
    let config = ProptestConfig {
        cases: 64,
        failure_persistence: None,
        rng_algorithm: RngAlgorithm::ChaCha,
        max_shrink_iters: 300,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let outcome = runner.run(&case(), |(max_events, max_age, ops)| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(run_case(max_events, max_age, &ops))
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-written cases: what a random walk reaches rarely
// ---------------------------------------------------------------------------------------------

fn everything(limit: i64) -> RunListQuery {
    RunListQuery {
        state: None,
        outcome: None,
        origin: None,
        limit,
        before: None,
    }
}

fn usage(input: Option<i64>, output: Option<i64>, cost: Option<f64>) -> SpanUsage {
    SpanUsage {
        input_tokens: input,
        output_tokens: output,
        cache_read_tokens: None,
        cache_creation_tokens: None,
        cost_usd: cost,
        model: None,
    }
}

/// Reads back, reopens the file, reads back again, and checks old ids and new writes.
async fn read_back_and_reopen(h: &mut Harness) -> Result<(), TestCaseError> {
    h.check_all("before the reopen").await?;
    h.reopen().await?;
    h.check_all("after the reopen").await?;
    h.after_reopen().await
}

/// Ids made of LIKE and GLOB wildcards, NUL bytes and look-alike characters never match each
/// other: each names its own span, run and engagement.
#[tokio::test]
async fn wildcard_and_odd_byte_ids_stay_distinct() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    let mut ids = pools().ids.clone();
    ids.extend(
        [
            "a*", "a?", "[!a]", "[^a]", "a\0b", "a\0c", "\0\0", "%%", "__", "a b", "á", "a\u{301}",
        ]
        .map(str::to_owned),
    );
    for (n, id) in ids.iter().enumerate() {
        let started = h
            .start(n % 3, start_input(id, id, None, Some(n as i64)))
            .await?;
        prop_assert!(started.is_ok(), "start of {:?} refused", short(id));
        let appended = h
            .append(0, id, id, Some(&json!({ "id": id })), None)
            .await?;
        prop_assert!(matches!(appended, Ok(Some(_))));
        let event = AppendInput::new(id.clone(), n as i64, "x", object(json!({ "id": id })));
        if let Ok(event) = event {
            let _ = h.journal_append(event).await?;
        }
    }
    for id in &ids {
        let span = h
            .get_span(id)
            .await?
            .ok_or_else(|| fail("a span is missing"))?;
        prop_assert!(span.span_id == *id && span.run_id == *id);
        let snapshot = h
            .snapshot(id)
            .await?
            .ok_or_else(|| fail("a run is missing"))?;
        prop_assert_eq!(snapshot.spans.len(), 1);
        prop_assert_eq!(snapshot.events.len(), 1);
        prop_assert!(snapshot.events[0].span_id == *id);
    }
    // A cascade and a prune through a wildcard id touch only that run.
    for (writer, id) in ["%", "_", "*", "?", "[a]"].iter().enumerate() {
        let closed = h
            .cascade(writer % 3, id, SpanOutcome::Cancelled, id)
            .await?;
        prop_assert_eq!(closed, 1);
    }
    prop_assert_eq!(h.open_roots().await?.len(), ids.len() - 5);
    let pruned = h
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: i64::MAX,
            hard_ceiling_ms: 0,
            now: None,
            batch: Some(-1),
            scheduled: false,
        })
        .await?;
    prop_assert_eq!(pruned.runs_pruned, 5);
    let listed = h.list_runs(everything(i64::MAX)).await?;
    let listed: BTreeSet<&str> = listed.runs.iter().map(|run| run.run_id.as_str()).collect();
    prop_assert_eq!(listed.len(), ids.len());
    for id in ["%", "_", "a%", "a_b"] {
        let events = h.journal_read_from(id, None).await?;
        prop_assert!(events.len() == 1 && &*events[0].engagement_id == id);
    }
    prop_assert_eq!(h.journal_list(None).await?.len(), ids.len() - 1);
    read_back_and_reopen(&mut h).await
}

/// Parents that loop, point at themselves, at a span of another run, at nothing, or are empty:
/// none of those spans is a root, and every call still answers.
#[tokio::test]
async fn parent_loops_and_parents_in_other_runs() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    for (span, run, parent, at) in [
        ("a", "r1", "b", 3),
        ("b", "r1", "a", 2),
        ("c", "r1", "c", 1),
        ("d", "r2", "a", 1),
        ("e", "r2", "", 2),
        ("f", "r3", "missing", 1),
    ] {
        let _ = h
            .start(0, start_input(span, run, Some(parent), Some(at)))
            .await?;
    }
    // Listed as waiting for their root, each from its earliest span.
    let listed = h.list_runs(everything(i64::MAX)).await?;
    let listed: Vec<(&str, &str, bool)> = listed
        .runs
        .iter()
        .map(|run| (run.run_id.as_str(), run.name.as_str(), run.awaiting_root))
        .collect();
    prop_assert_eq!(listed.len(), 3);
    prop_assert!(listed.iter().all(|(_, _, awaiting)| *awaiting));
    prop_assert!(h.open_roots().await?.is_empty());
    prop_assert!(h.find_stuck(i64::MIN, Some(i64::MAX)).await?.is_empty());
    prop_assert_eq!(h.sweep_stale(1, i64::MIN, Some(i64::MAX)).await?, 0);
    prop_assert_eq!(h.cascade(1, "r1", SpanOutcome::Error, "loop").await?, 3);
    // The run has no root: its rollup is the first span's by start.
    let rollup = h
        .read_rollup("r1")
        .await?
        .ok_or_else(|| fail("no rollup"))?;
    prop_assert_eq!(rollup.name.as_str(), "name of c");
    prop_assert_eq!(rollup.failure_reason.as_deref(), Some("loop"));
    prop_assert_eq!(h.sweep_orphans(2).await?, 3);
    prop_assert!(h.terminal_roots(i64::MIN, -1).await?.is_empty());
    // Roots arrive late; the run is listed once, from the first by start (the two others still
    // wait for theirs).
    let _ = h.start(0, start_input("g", "r1", None, Some(0))).await?;
    let _ = h.start(0, start_input("h", "r1", None, Some(-5))).await?;
    let page = h.list_runs(everything(i64::MAX)).await?;
    prop_assert_eq!(page.runs.len(), 3);
    let r1: Vec<&RunListEntry> = page.runs.iter().filter(|run| run.run_id == "r1").collect();
    prop_assert_eq!(r1.len(), 1);
    prop_assert_eq!(r1[0].name.as_str(), "name of h");
    prop_assert!(!r1[0].awaiting_root);
    let _ = h
        .end(0, "g", end_input(SpanOutcome::Success, Some(9)))
        .await?;
    let _ = h
        .end(0, "h", end_input(SpanOutcome::Success, Some(9)))
        .await?;
    h.rollup("r1").await?;
    // An import into another run under a taken id is refused; a child of a span of another
    // run is stored.
    let report = h
        .import(
            1,
            vec![
                imported("a", "r2", None, None),
                imported(
                    "i",
                    "r2",
                    Some("a"),
                    Some(ImportedEnd {
                        ended_at: 4,
                        outcome: SpanOutcome::Timeout,
                        reason: Some("slow".to_owned()),
                    }),
                ),
            ],
        )
        .await?;
    prop_assert_eq!(report.created, 1);
    prop_assert_eq!(report.rejected.len(), 1);
    let pruned = h
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: i64::MAX,
            hard_ceiling_ms: i64::MAX,
            now: Some(i64::MIN),
            batch: Some(i64::MIN),
            scheduled: false,
        })
        .await?;
    prop_assert_eq!(pruned.runs_pruned, 3);
    let page = h.list_runs(everything(i64::MAX)).await?;
    prop_assert_eq!(page.runs.len(), 3);
    prop_assert!(page.runs.iter().all(|run| run.detail_pruned));
    read_back_and_reopen(&mut h).await
}

/// Calls in the wrong order: an end, patch, heartbeat or event before the start, an end twice,
/// a patch or heartbeat after the end, imports racing native calls.
#[tokio::test]
async fn calls_out_of_order() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    let done = |outcome| end_input(outcome, None);
    prop_assert_eq!(h.end(0, "s", done(SpanOutcome::Success)).await?, Ok(false));
    prop_assert_eq!(h.patch(0, "s", SpanPatch::default()).await?, Ok(false));
    h.heartbeat(0, "s", Some(5)).await?;
    prop_assert_eq!(h.append(0, "s", "early", None, None).await?, Ok(None));
    prop_assert!(h.start(0, start_input("s", "r", None, None)).await?.is_ok());
    prop_assert_eq!(h.end(1, "s", done(SpanOutcome::Error)).await?, Ok(true));
    prop_assert_eq!(h.end(2, "s", done(SpanOutcome::Success)).await?, Ok(false));
    let patch = SpanPatch {
        attrs: Some(object(json!({"late": true}))),
        usage: Some(usage(Some(1), None, None)),
        wait_until: Some(1),
    };
    prop_assert_eq!(h.patch(0, "s", patch).await?, Ok(false));
    h.heartbeat(0, "s", Some(i64::MAX)).await?;
    prop_assert!(matches!(
        h.append(0, "s", "late", Some(&json!("after the end")), None)
            .await?,
        Ok(Some(_))
    ));
    let span = h.get_span("s").await?.ok_or_else(|| fail("no span"))?;
    prop_assert_eq!(span.outcome, Some(SpanOutcome::Error));
    prop_assert_eq!(span.last_heartbeat_at, Some(START_CLOCK));
    // A terminal span is left alone by an import.
    let report = h.import(0, vec![imported("s", "r", None, None)]).await?;
    prop_assert_eq!(report.unchanged, 1);
    // An import announces a span, a native start collides, the import completes it, a native
    // end then finds it terminal.
    let _ = h.import(1, vec![imported("t", "r", None, None)]).await?;
    let again = h.start(0, start_input("t", "r", None, None)).await?;
    prop_assert_eq!(again, Err(Refusal::Duplicate("t".to_owned())));
    let end = ImportedEnd {
        ended_at: 7,
        outcome: SpanOutcome::Success,
        reason: None,
    };
    let report = h
        .import(2, vec![imported("t", "r", None, Some(end))])
        .await?;
    prop_assert_eq!(report.completed, 1);
    prop_assert_eq!(
        report.events_added,
        0,
        "the repeated event is not added twice"
    );
    prop_assert_eq!(h.end(0, "t", done(SpanOutcome::Error)).await?, Ok(false));
    // The same disorder inside one batch.
    let start = ActivityWrite::StartSpan(start_input("u", "r", Some("s"), None));
    let end = ActivityWrite::EndSpan {
        span_id: "u".to_owned(),
        input: done(SpanOutcome::Denied),
    };
    let results = h
        .batch(
            1,
            vec![
                end.clone(),
                start.clone(),
                start,
                end.clone(),
                end,
                ActivityWrite::PatchSpan {
                    span_id: "u".to_owned(),
                    patch: SpanPatch::default(),
                },
                ActivityWrite::AppendEvent {
                    span_id: "u".to_owned(),
                    event_type: "x".to_owned(),
                    payload: None,
                    ts: None,
                },
            ],
        )
        .await?;
    prop_assert_eq!(results[0].clone(), Ok(ActivityWriteResult::Ended(false)));
    prop_assert_eq!(results[2].clone(), Err(Refusal::Duplicate("u".to_owned())));
    prop_assert_eq!(results[3].clone(), Ok(ActivityWriteResult::Ended(true)));
    prop_assert_eq!(results[4].clone(), Ok(ActivityWriteResult::Ended(false)));
    prop_assert_eq!(results[5].clone(), Ok(ActivityWriteResult::Patched(false)));
    prop_assert_eq!(h.cascade(0, "r", SpanOutcome::Cancelled, "x").await?, 0);
    prop_assert!(h.batch(0, Vec::new()).await?.is_empty());
    prop_assert_eq!(h.import(0, Vec::new()).await?, ImportReport::default());
    read_back_and_reopen(&mut h).await
}

/// Every time extreme as a span's start, heartbeat, wait, event time and end, explicit and from
/// the clock; durations that overflow saturate; thresholds at the extremes.
#[tokio::test]
async fn every_time_extreme_through_one_span_life() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    for (n, &t) in TIMES.iter().enumerate() {
        h.set_clock(t);
        for (span, run, at) in [
            (format!("explicit {n}"), format!("run {n}"), Some(t)),
            (format!("clock {n}"), format!("clock run {n}"), None),
        ] {
            let started = h.start(n % 3, start_input(&span, &run, None, at)).await?;
            prop_assert_eq!(started.map(|span| span.started_at), Ok(t));
            h.heartbeat(0, &span, at).await?;
            let patch = SpanPatch {
                attrs: None,
                usage: None,
                wait_until: Some(t),
            };
            let _ = h.patch(1, &span, patch).await?;
            let event = h.append(2, &span, "at", Some(&json!(t)), at).await?;
            prop_assert_eq!(event.map(|event| event.map(|event| event.ts)), Ok(Some(t)));
            let _ = h.end(0, &span, end_input(SpanOutcome::Success, at)).await?;
            h.rollup(&run).await?;
        }
    }
    h.set_clock(START_CLOCK);
    for (n, (from, to)) in [
        (i64::MIN, i64::MAX),
        (i64::MAX, i64::MIN),
        (-1, i64::MAX),
        (1, i64::MIN),
        (i64::MIN + 1, i64::MAX - 1),
        (-(1 << 53), i64::MAX),
    ]
    .into_iter()
    .enumerate()
    {
        let (span, run) = (format!("span {n}"), format!("long run {n}"));
        let _ = h
            .start(0, start_input(&span, &run, None, Some(from)))
            .await?;
        let _ = h
            .end(0, &span, end_input(SpanOutcome::Success, Some(to)))
            .await?;
        let page = h.list_runs(everything(i64::MAX)).await?;
        let live = page.runs.iter().find(|entry| entry.run_id == run);
        prop_assert_eq!(
            live.and_then(|entry| entry.duration_ms),
            Some(to.saturating_sub(from))
        );
        h.rollup(&run).await?;
        let rollup = h.read_rollup(&run).await?;
        prop_assert_eq!(
            rollup.and_then(|row| row.duration_ms),
            Some(to.saturating_sub(from))
        );
    }
    // Open roots at every start, then every threshold against every `now`.
    for (n, &t) in TIMES.iter().enumerate() {
        let _ = h
            .start(
                n % 3,
                start_input(&format!("open {n}"), "open run", None, Some(t)),
            )
            .await?;
    }
    for &threshold in &TIMES {
        for now in TIMES.iter().copied().map(Some).chain([None]) {
            h.find_stuck(threshold, now).await?;
        }
    }
    for (writer, (after, now)) in [
        (i64::MAX, Some(i64::MIN)),
        (i64::MIN, Some(i64::MIN)),
        (i64::MAX, None),
        (i64::MIN, Some(i64::MAX)),
    ]
    .into_iter()
    .enumerate()
    {
        h.sweep_stale(writer % 3, after, now).await?;
    }
    read_back_and_reopen(&mut h).await
}

/// `changes_since` and `terminal_root_changes_since` at every cursor and limit extreme, and at
/// every actual change id and its neighbours.
#[tokio::test]
async fn every_cursor_and_limit_of_the_change_feeds() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    let _ = h.start(0, start_input("root", "r", None, Some(1))).await?;
    let _ = h
        .start(1, start_input("child", "r", Some("root"), Some(2)))
        .await?;
    for ts in [3, 4] {
        let _ = h.append(0, "root", "e", Some(&json!(ts)), Some(ts)).await?;
    }
    let _ = h
        .end(1, "child", end_input(SpanOutcome::Success, Some(5)))
        .await?;
    let _ = h.patch(0, "root", SpanPatch::default()).await?;
    let _ = h
        .end(0, "root", end_input(SpanOutcome::Success, Some(6)))
        .await?;
    let _ = h.start(2, start_input("other", "s", None, Some(7))).await?;
    let _ = h
        .end(2, "other", end_input(SpanOutcome::Error, Some(8)))
        .await?;
    let _ = h.append(2, "other", "late", None, Some(9)).await?;
    let all = h.changes(i64::MIN, i64::MAX).await?;
    let mut cursors: BTreeSet<i64> = CURSORS.into_iter().collect();
    for change in &all {
        cursors.extend([change.change_id - 1, change.change_id, change.change_id + 1]);
    }
    for &cursor in &cursors {
        for &limit in &LIMITS {
            h.changes(cursor, limit).await?;
            h.terminal_roots(cursor, limit).await?;
        }
    }
    prop_assert_eq!(h.changes(0, -1).await?.len(), all.len() - 1);
    prop_assert!(h.changes(i64::MIN, i64::MIN).await?.is_empty());
    prop_assert!(h.changes(i64::MAX, i64::MAX).await?.is_empty());
    prop_assert!(h.changes(0, 0).await?.is_empty());
    prop_assert_eq!(h.terminal_roots(i64::MIN, i64::MIN).await?.len(), 2);
    read_back_and_reopen(&mut h).await
}

/// `prune` with every digest floor, hard ceiling, `now` and batch extreme, each against runs
/// that ended at extreme times.
#[tokio::test]
async fn prune_option_extremes() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    let mut n = 0;
    for floor in [i64::MIN, -1, 0, 1, i64::MAX] {
        for ceiling in [i64::MIN, -1, 0, i64::MAX] {
            for now in [None, Some(i64::MIN), Some(0), Some(i64::MAX)] {
                for ended in [TIMES[n % TIMES.len()], TIMES[(n + 3) % TIMES.len()]] {
                    let (span, run) = (format!("span {n} {ended}"), format!("run {n} {ended}"));
                    let _ = h
                        .start(n % 3, start_input(&span, &run, None, Some(0)))
                        .await?;
                    let end = end_input(SpanOutcome::Success, Some(ended));
                    let _ = h.end(0, &span, end).await?;
                    h.rollup(&run).await?;
                }
                let batch = PRUNE_BATCHES[n % PRUNE_BATCHES.len()];
                let result = h
                    .prune(PruneOptions {
                        max_spans: None,
                        digest_floor_at: floor,
                        hard_ceiling_ms: ceiling,
                        now,
                        batch,
                        scheduled: false,
                    })
                    .await?;
                if batch == Some(0) {
                    prop_assert_eq!(result.runs_pruned, 0);
                }
                n += 1;
            }
        }
    }
    let everything_prunable = PruneOptions {
        max_spans: None,
        digest_floor_at: i64::MAX,
        hard_ceiling_ms: i64::MIN,
        now: Some(i64::MAX),
        batch: Some(i64::MIN),
        scheduled: false,
    };
    h.prune(everything_prunable.clone()).await?;
    prop_assert_eq!(h.prune(everything_prunable).await?.runs_pruned, 0);
    // Only runs that ended at `i64::MAX` are left: no floor or ceiling is above it.
    let left = h.list_runs(everything(i64::MAX)).await?;
    prop_assert!(left
        .runs
        .iter()
        .all(|run| run.detail_pruned || run.ended_at == Some(i64::MAX)));
    read_back_and_reopen(&mut h).await
}

/// A run's usage is its root's, or else the sum over its model spans: sums past the `i64` range
/// saturate, costs past `f64::MAX` are infinite (serialized as `null`), and an infinite cost
/// plus a negative infinite one is NaN, stored as absent. Sums saturate step by step in start
/// order, so a negative part after the bound is reached pulls the total back below it (the
/// model agrees); here it comes first.
#[tokio::test]
async fn rollup_sums_saturate() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    let model_span = |span: &str, run: &str| StartSpanInput {
        kind: SpanKind::Model,
        ..start_input(span, run, Some("root"), Some(2))
    };
    let end_with = |usage: SpanUsage| EndSpanInput {
        usage: Some(usage),
        ..end_input(SpanOutcome::Success, Some(3))
    };
    for (run, parts) in [
        (
            "sum",
            vec![
                usage(Some(-1), Some(1), None),
                usage(Some(i64::MAX), Some(i64::MIN), Some(f64::MAX)),
                usage(Some(i64::MAX), Some(i64::MIN), Some(f64::MAX)),
            ],
        ),
        (
            "nan",
            vec![
                usage(Some(1), None, Some(f64::INFINITY)),
                usage(None, None, Some(f64::NEG_INFINITY)),
            ],
        ),
    ] {
        let root = format!("{run} root");
        let _ = h.start(0, start_input(&root, run, None, Some(1))).await?;
        for (n, part) in parts.into_iter().enumerate() {
            let span = format!("{run} model {n}");
            let mut input = model_span(&span, run);
            input.parent_span_id = Some(root.clone());
            let _ = h.start(1, input).await?;
            let _ = h.end(1, &span, end_with(part)).await?;
        }
        let _ = h
            .end(0, &root, end_input(SpanOutcome::Success, Some(4)))
            .await?;
        h.rollup(run).await?;
    }
    let sum = h
        .read_rollup("sum")
        .await?
        .ok_or_else(|| fail("no rollup"))?;
    // A sum stops at 2^53 - 1, the bound the API holds every count to (the rollup rule);
    // negative counts (the store's API takes them, HTTP refuses them) saturate.
    prop_assert_eq!(sum.input_tokens, Some((1_i64 << 53) - 1));
    prop_assert_eq!(sum.output_tokens, Some(i64::MIN));
    prop_assert_eq!(sum.cost_usd, Some(f64::INFINITY));
    let as_json = serde_json::to_value(&sum).map_err(|err| fail(err.to_string()))?;
    prop_assert_eq!(&as_json["costUsd"], &Value::Null);
    let nan = h
        .read_rollup("nan")
        .await?
        .ok_or_else(|| fail("no rollup"))?;
    prop_assert_eq!(nan.input_tokens, Some(1));
    prop_assert_eq!(nan.cost_usd, None);
    // A root with usage of its own is taken as it is, extremes included.
    let _ = h.start(0, start_input("own", "own", None, Some(1))).await?;
    let own = usage(Some(i64::MIN), Some(i64::MAX), Some(f64::NEG_INFINITY));
    let _ = h.end(0, "own", end_with(own)).await?;
    h.rollup("own").await?;
    let page = h.list_runs(everything(i64::MAX)).await?;
    prop_assert!(page
        .runs
        .iter()
        .any(|run| run.run_id == "sum" && run.cost_usd == Some(f64::INFINITY)));
    read_back_and_reopen(&mut h).await
}

/// Varied tool-output-like text of about `len` bytes (what the dictionary is trained on).
fn varied(seed: u64, len: usize) -> Value {
    let mut state = seed;
    let mut output = String::new();
    while output.len() < len {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let word = ["src", "lib", "tests", "crates", "main", "mod"][(state >> 60) as usize % 6];
        output.push_str(&format!(
            "{word}/file_{}.rs: {} lines\n",
            (state >> 40) % 97,
            (state >> 20) % 1000
        ));
    }
    json!({ "tool": "bash", "seed": seed, "output": output })
}

/// Payloads around the cap, with multi-byte characters at every offset of the cut, stored as
/// text and, once the store has trained its dictionary, compressed: each reads back as the
/// model's capped text (the cut on a character boundary, at most the cap, the marker after it).
#[tokio::test]
async fn payload_cap_on_both_storage_paths() -> Result<(), TestCaseError> {
    let mut h = Harness::new(RetentionConfig::default())?;
    let _ = h.start(0, start_input("p", "r", None, None)).await?;
    let payloads = boundary_payloads();
    let check_kept = |event: &SpanEventRow, original: &Value| -> Result<(), TestCaseError> {
        let stored: Value =
            serde_json::from_str(event.payload.get()).map_err(|err| fail(err.to_string()))?;
        if !event.truncated {
            prop_assert_eq!(&stored, original);
            return Ok(());
        }
        let kept = stored
            .as_str()
            .and_then(|text| text.strip_suffix(MARKER))
            .ok_or_else(|| fail("a truncated payload is not a marked string"))?;
        let source = match original {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        prop_assert!(kept.len() <= CAP && kept.len() + 4 > CAP.min(source.len()));
        prop_assert!(source.starts_with(kept));
        Ok(())
    };
    for payload in &payloads {
        let event = h.append(0, "p", "cap", Some(payload), None).await?;
        let event = event.ok().flatten().ok_or_else(|| fail("not appended"))?;
        check_kept(&event, payload)?;
    }
    // The store trains its dictionary in the background on the first 256 KB of payloads (and
    // collects afresh if training fails): append until payloads are stored compressed.
    let conn = rusqlite::Connection::open(&h.path).map_err(|err| fail(err.to_string()))?;
    let count = |sql: &str| -> Result<i64, TestCaseError> {
        conn.query_row(sql, [], |row| row.get(0))
            .map_err(|err| fail(err.to_string()))
    };
    let waited = Instant::now();
    for seed in 0.. {
        if count("SELECT COUNT(*) FROM activity_events WHERE dict_id IS NOT NULL")? > 0 {
            break;
        }
        prop_assert!(
            waited.elapsed() < Duration::from_secs(60),
            "no payload was stored compressed"
        );
        let _ = h
            .append(1, "p", "train", Some(&varied(seed, 12_000)), None)
            .await?;
        if seed > 24 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for payload in payloads.iter().chain([&varied(99, 3_000)]) {
        let event = h.append(2, "p", "compressed", Some(payload), None).await?;
        let event = event.ok().flatten().ok_or_else(|| fail("not appended"))?;
        check_kept(&event, payload)?;
    }
    let spans = vec![ImportedSpan {
        priced_at: None,
        events: payloads
            .iter()
            .enumerate()
            .map(|(n, payload)| ImportedEvent {
                ts: n as i64,
                event_type: "imported".to_owned(),
                payload: payload.clone(),
            })
            .collect(),
        ..imported("q", "r", Some("p"), None)
    }];
    let _ = h.import(0, spans).await?;
    let compressed = count(
        "SELECT COUNT(*) FROM activity_events WHERE dict_id IS NOT NULL \
         AND event_type IN ('compressed', 'imported')",
    )?;
    prop_assert!(
        compressed > 0,
        "no payload near the cap was stored compressed"
    );
    read_back_and_reopen(&mut h).await
}

/// The journal at its extremes: no room at all, room for one event and room without bound;
/// ages at both ends; times on both sides of 2^53; expected seqs, `read_from` seqs and list
/// limits at the `i64` bounds; data at and past the depth limit; compaction; prune at every
/// time extreme.
#[tokio::test]
async fn journal_extremes() -> Result<(), TestCaseError> {
    for max_events in [0, 1, u64::MAX] {
        for max_age_ms in [i64::MIN, 0, i64::MAX] {
            let mut h = Harness::new(RetentionConfig {
                max_events_per_engagement: max_events,
                max_age_ms,
            })?;
            for (n, engagement) in pools().ids.iter().enumerate() {
                for &at in &JOURNAL_ATS {
                    let raw = json!({"engagementId": engagement, "at": at, "type": "x",
                                     "data": {"n": n}});
                    let appended = h.journal_append_json(raw).await?;
                    if max_events == 0 {
                        prop_assert!(appended.is_err());
                    }
                }
            }
            for &seq in &SEQS {
                let input = AppendInput::new("e", 1, "x", JsonObject::new())
                    .map_err(|err| fail(err.to_string()))?;
                let _ = h.journal_append(input.with_expected_seq(seq)).await?;
            }
            for data in &pools().journal_data {
                let raw = json!({"engagementId": "e", "at": 2, "type": "x", "data": data});
                let _ = h.journal_append_json(raw).await?;
            }
            if max_events == u64::MAX {
                for n in 0..22 {
                    let raw = json!({"engagementId": "c", "at": n, "type": "budget_charged",
                                     "data": {"key": "tokens", "amount": 1}});
                    let _ = h.journal_append_json(raw).await?;
                }
                let raw = json!({"engagementId": "c", "at": 30, "type": "engagement_closed",
                                 "data": {}});
                let _ = h.journal_append_json(raw).await?;
                prop_assert!(h.journal_compact("c").await?);
                prop_assert!(!h.journal_compact("c").await?);
                let raw = json!({"engagementId": "c", "at": 31, "type": "x", "data": {}});
                let _ = h.journal_append_json(raw).await?;
            }
            for engagement in ["e", "c", "", "nobody"] {
                for &seq in &SEQS {
                    h.journal_read_from(engagement, Some(seq)).await?;
                }
                h.journal_summarize(engagement).await?;
                h.journal_compact(engagement).await?;
            }
            for limit in JOURNAL_LIMITS {
                h.journal_list(limit).await?;
            }
            h.check_all("before any prune").await?;
            for &now in &TIMES {
                h.journal_prune(now).await?;
            }
            read_back_and_reopen(&mut h).await?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Regressions: defects this test found (fixed), each pinned by a minimal case
// ---------------------------------------------------------------------------------------------

/// An import that creates a run rolled it up from the delivered spans in memory, where a root
/// whose only usage was a NaN cost counted as carrying usage (the stored root has none: NaN is
/// stored as absent), so the run's model spans' tokens were left out until a later `rollup_run`
/// read the stored spans. The import now holds the cost as it will read back.
#[tokio::test]
async fn an_imported_run_with_a_nan_root_cost_rolls_up_its_model_spans() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("nan.db"))).expect("open");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    let end = Some(ImportedEnd {
        ended_at: 5,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    let mut root = imported("root", "run", None, end.clone());
    root.usage = usage(None, None, Some(f64::NAN));
    let mut model = imported("model", "run", Some("root"), end);
    model.kind = SpanKind::Model;
    model.usage = usage(Some(7), None, None);
    let report = store.import_spans(vec![root, model]).await.expect("import");
    assert_eq!(report.runs_rolled_up, 1);
    let imported = store
        .read_rollup("run")
        .await
        .expect("read")
        .expect("a rollup");
    store.rollup_run("run").await.expect("rollup");
    let recomputed = store
        .read_rollup("run")
        .await
        .expect("read")
        .expect("a rollup");
    assert_eq!(recomputed.input_tokens, Some(7), "the stored spans' rollup");
    assert_eq!(
        imported.input_tokens, recomputed.input_tokens,
        "the import's rollup differs from the stored spans' rollup"
    );
}
