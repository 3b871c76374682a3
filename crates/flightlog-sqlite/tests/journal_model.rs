//! Model-based property test of the engagement journal: both backends (the in-memory journal and
//! the SQLite journal on a fresh file per case) against a small model of the reference semantics.
//!
//! The conformance fixtures pin the reference down one scripted call at a time; this test explores
//! the space between them. Proptest generates random operation sequences over four engagement ids
//! (one of them favoured, so logs grow past the compaction threshold), with a fake clock that only
//! moves forward and event times spread around it, and a small retention per case: either a cap of
//! 5–12 events (so `JournalFull` is common) or of 22–45 (so finished engagements can be
//! compacted), and a `maxAgeMs` of a few hundred milliseconds (so `prune` deletes and engagements
//! get re-created). Every call's result from each backend is compared with the model's, and after
//! every write the whole visible state (`list_engagements` and `read` of every id) is compared too.
//!
//! The model below is plain vectors, written from `shared/seeds/engagement-journal.ts` and
//! FORMAT.md sections 4, 5 and 8, not from either backend: it validates raw inputs itself, applies
//! the full-then-expected-seq order, keeps engagements in creation order for the recency
//! tie-break, and compacts by the reference's rules. Only summaries are not re-implemented: the
//! model's answer for `summarize` is the pure `summarize_engagement_events` over its own events,
//! which the conformance fixtures already pin.
//!
//! [`Op::Group`] and [`Op::Burst`] issue several calls at once (polled in order), so the SQLite
//! writer applies them in one group transaction, as it does under load.
//!
//! Payloads include arbitrary finite floats, integers past `i64`, control characters and
//! non-ASCII text, because the SQLite journal stores `data` as JSON text and must read back exactly
//! what was appended; `sqlite_reads_floats_back_exactly` pins the one-ULP float drift this
//! property found before serde_json's `float_roundtrip` was enabled.
//!
//! `PROPTEST_CASES` overrides the number of cases (48 by default) for a longer soak.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

use flightlog_core::journal::{
    summarize_engagement_events, AppendInput, EngagementEvent, EngagementJournal,
    InMemoryEngagementJournal, JournalError, JsonObject, RetentionConfig,
};
use flightlog_sqlite::{SqliteConfig, SqliteDatabase, SqliteEngagementJournal};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use serde_json::{json, Number, Value};

/// The engagement ids the operations use (one non-ASCII, to cross the SQLite text boundary).
const ENGAGEMENTS: [&str; 4] = ["eng-a", "eng-b", "eng-c", "eng-δ"];
/// An id no operation appends to.
const UNKNOWN: &str = "nobody";
const ACTORS: [&str; 5] = ["planner", "coder", "reviewer", "human:ann", "system:guard"];
const MAILS: [&str; 5] = ["m0", "m1", "m2", "m3", "m4"];
const START_CLOCK: i64 = 1_000_000;
/// `2^53 - 1`, the largest valid `at`.
const MAX_SAFE: i64 = (1 << 53) - 1;

/// The reference's limits, restated here rather than imported.
const COMPACTION_MIN_EVENTS: usize = 20;
const MAX_DATA_DEPTH: usize = 64;

// ---------------------------------------------------------------------------------------------
// Operations.
// ---------------------------------------------------------------------------------------------

/// When an event happens, relative to the fake clock (or an extreme that is still valid).
#[derive(Debug, Clone)]
enum At {
    Offset(i64),
    /// An offset written as a float (`1000.0`), which is a valid integer time.
    FloatOffset(i64),
    Absolute(i64),
}

/// The seq an append requires, resolved against the model when the op runs.
#[derive(Debug, Clone)]
enum Expected {
    None,
    /// The engagement's current length (right unless the engagement is full).
    Next,
    /// The current length plus this (non-zero) offset: wrong.
    Off(i64),
    /// Any value.
    Exactly(i64),
}

/// A valid append.
#[derive(Debug, Clone)]
struct AppendSpec {
    engagement: usize,
    at: At,
    event_type: String,
    data: Value,
    expected: Expected,
}

/// The ways a raw append input can be wrong (some wrong in several places at once).
#[derive(Debug, Clone, Copy)]
enum Invalid {
    NotAnObject,
    EngagementIdNumber,
    EngagementIdEmpty,
    EngagementIdMissing,
    AtString,
    AtNull,
    AtFraction,
    AtTooLarge,
    AtTooSmall,
    DataNull,
    DataArray,
    DataMissing,
    DataString,
    DataTooDeep,
    TypeMissing,
    TypeEmpty,
    TypeNumber,
    /// Bad `at`, `data` and `type` together: `at` must be reported.
    AtDataAndType,
    /// Bad `data` and `type`: `data` must be reported.
    DataAndType,
    /// Bad `engagementId` and `at`: `engagementId` must be reported.
    EngagementIdAndAt,
}

const INVALIDS: [Invalid; 20] = [
    Invalid::NotAnObject,
    Invalid::EngagementIdNumber,
    Invalid::EngagementIdEmpty,
    Invalid::EngagementIdMissing,
    Invalid::AtString,
    Invalid::AtNull,
    Invalid::AtFraction,
    Invalid::AtTooLarge,
    Invalid::AtTooSmall,
    Invalid::DataNull,
    Invalid::DataArray,
    Invalid::DataMissing,
    Invalid::DataString,
    Invalid::DataTooDeep,
    Invalid::TypeMissing,
    Invalid::TypeEmpty,
    Invalid::TypeNumber,
    Invalid::AtDataAndType,
    Invalid::DataAndType,
    Invalid::EngagementIdAndAt,
];

#[derive(Debug, Clone)]
enum Op {
    Append(AppendSpec),
    Invalid {
        engagement: usize,
        offset: i64,
        invalid: Invalid,
    },
    /// Several bookkeeping events (compactable types and tool calls) to one engagement, issued at
    /// once: they must get consecutive seqs in call order.
    Burst {
        engagement: usize,
        offset: i64,
        count: usize,
    },
    /// Move the fake clock forward.
    Advance(i64),
    /// `prune(now)`; `None` = the fake clock's now.
    Prune(Option<i64>),
    Compact(usize),
    Read(usize),
    ReadFrom(usize, i64),
    List(Option<i64>),
    Summarize(usize),
    /// Appends, compactions and prunes issued at once (one writer group on SQLite).
    Group(Vec<Op>),
}

/// A call with every argument resolved, as both backends and the model receive it.
#[derive(Debug, Clone)]
enum Call {
    Append {
        raw: Value,
        expected: Option<i64>,
    },
    Prune {
        now: i64,
    },
    Compact {
        engagement_id: String,
    },
    Read {
        engagement_id: String,
    },
    ReadFrom {
        engagement_id: String,
        from_seq: i64,
    },
    List {
        limit: Option<i64>,
    },
    Summarize {
        engagement_id: String,
    },
}

impl Call {
    fn writes(&self) -> bool {
        matches!(
            self,
            Call::Append { .. } | Call::Prune { .. } | Call::Compact { .. }
        )
    }
}

/// A refusal, reduced to what the contract promises about it.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    /// Validation failed at this JSON path.
    Invalid(String),
    Full {
        engagement_id: String,
        max_events: u64,
    },
    WrongExpectedSeq {
        expected: i64,
        actual: i64,
    },
    /// Anything else: never expected.
    Other(String),
}

/// A call's result: the answer as JSON text (key order matters), or the refusal.
type Outcome = Result<String, Refusal>;

fn refusal(err: JournalError) -> Refusal {
    match err {
        JournalError::Invalid(err) => Refusal::Invalid(err.path().to_owned()),
        JournalError::JournalFull {
            engagement_id,
            max_events,
        } => Refusal::Full {
            engagement_id,
            max_events,
        },
        JournalError::WrongExpectedSeq { expected, actual } => {
            Refusal::WrongExpectedSeq { expected, actual }
        }
        other => Refusal::Other(other.to_string()),
    }
}

/// A value as JSON text (a macro: this crate does not depend on `serde` to name its trait).
macro_rules! to_json_text {
    ($value:expr) => {
        serde_json::to_string($value).unwrap_or_else(|err| format!("<not serializable: {err}>"))
    };
}

// ---------------------------------------------------------------------------------------------
// The model.
// ---------------------------------------------------------------------------------------------

/// The reference journal as plain data.
struct Model {
    retention: RetentionConfig,
    /// Live engagements in creation order (a re-creation after a prune goes to the end); each
    /// holds at least one event, `events[i].seq == i`.
    engagements: Vec<(String, Vec<EngagementEvent>)>,
}

impl Model {
    fn events(&self, engagement_id: &str) -> &[EngagementEvent] {
        self.engagements
            .iter()
            .find(|(id, _)| id == engagement_id)
            .map_or(&[], |(_, events)| events.as_slice())
    }

    fn apply(&mut self, call: &Call) -> Outcome {
        match call {
            Call::Append { raw, expected } => self
                .append(raw, *expected)
                .map(|event| to_json_text!(&event)),
            Call::Prune { now } => Ok(to_json_text!(&self.prune(*now))),
            Call::Compact { engagement_id } => Ok(to_json_text!(&self.compact(engagement_id))),
            Call::Read { engagement_id } => Ok(to_json_text!(&self.events(engagement_id))),
            Call::ReadFrom {
                engagement_id,
                from_seq,
            } => {
                let tail: Vec<&EngagementEvent> = self
                    .events(engagement_id)
                    .iter()
                    .filter(|event| event.seq >= *from_seq)
                    .collect();
                Ok(to_json_text!(&tail))
            }
            Call::List { limit } => Ok(to_json_text!(&self.list(*limit))),
            Call::Summarize { engagement_id } => {
                let events = self.events(engagement_id);
                let summary = (!events.is_empty())
                    .then(|| summarize_engagement_events(engagement_id, events));
                Ok(to_json_text!(&summary))
            }
        }
    }

    /// Validation (FORMAT.md 4.4 and 8), then full, then the expected seq.
    fn append(&mut self, raw: &Value, expected: Option<i64>) -> Result<EngagementEvent, Refusal> {
        let (engagement_id, at, event_type, data) = validate(raw)?;
        let len = self.events(&engagement_id).len();
        if len as u64 >= self.retention.max_events_per_engagement {
            return Err(Refusal::Full {
                engagement_id,
                max_events: self.retention.max_events_per_engagement,
            });
        }
        if let Some(expected) = expected {
            if expected != len as i64 {
                return Err(Refusal::WrongExpectedSeq {
                    expected,
                    actual: len as i64,
                });
            }
        }
        let event = EngagementEvent {
            engagement_id: Arc::from(engagement_id.as_str()),
            seq: len as i64,
            at,
            event_type: Arc::from(event_type.as_str()),
            data: Arc::new(data),
        };
        match self
            .engagements
            .iter_mut()
            .find(|(id, _)| *id == engagement_id)
        {
            Some((_, events)) => events.push(event.clone()),
            None => self.engagements.push((engagement_id, vec![event.clone()])),
        }
        Ok(event)
    }

    /// Deletes engagements whose last event (the last appended, or the last kept by a
    /// compaction) is older than `now - maxAgeMs`.
    fn prune(&mut self, now: i64) -> u64 {
        let cutoff = now.saturating_sub(self.retention.max_age_ms);
        let before = self.engagements.len();
        self.engagements
            .retain(|(_, events)| events.last().is_some_and(|last| last.at >= cutoff));
        (before - self.engagements.len()) as u64
    }

    /// The reference's `compactRecordList`, applied in place.
    fn compact(&mut self, engagement_id: &str) -> bool {
        let Some((_, events)) = self
            .engagements
            .iter_mut()
            .find(|(id, _)| id == engagement_id)
        else {
            return false;
        };
        if events.len() <= COMPACTION_MIN_EVENTS {
            return false;
        }
        let mut closed = None;
        for (index, event) in events.iter().enumerate() {
            match &*event.event_type {
                "guard_blocked" | "mail_denied" | "escalated" => return false,
                "engagement_closed" => closed = Some(index),
                _ => {}
            }
        }
        let Some(closed) = closed else {
            return false;
        };
        // `undefined` passes, `null` does not: `closedStatus !== undefined && … !== 'completed'`.
        if events[closed]
            .data
            .get("status")
            .is_some_and(|status| *status != json!("completed"))
        {
            return false;
        }
        let compactable = |event: &EngagementEvent| {
            matches!(
                &*event.event_type,
                "budget_charged" | "budget_granted" | "mail_delivered" | "turn_started"
            )
        };
        if !events.iter().any(compactable) {
            return false;
        }
        let consumed = summarize_engagement_events(engagement_id, events).consumed;
        let consumed = serde_json::to_value(consumed).unwrap_or(Value::Null);
        let mut compacted = Vec::new();
        for (index, event) in events.iter().enumerate() {
            if compactable(event) {
                continue;
            }
            let mut event = event.clone();
            if index == closed {
                // `{...data, status: 'completed', consumed}`: existing keys keep their place.
                let mut data = JsonObject::clone(&event.data);
                data.insert("status".to_owned(), json!("completed"));
                data.insert("consumed".to_owned(), consumed.clone());
                event.data = Arc::new(data);
            }
            event.seq = compacted.len() as i64;
            compacted.push(event);
        }
        *events = compacted;
        true
    }

    /// Most recent last event first; ties: created later first. `limit` as `slice(0, max(0, n))`.
    fn list(&self, limit: Option<i64>) -> Vec<String> {
        let mut entries: Vec<(usize, &str, i64)> = self
            .engagements
            .iter()
            .enumerate()
            .filter_map(|(order, (id, events))| Some((order, id.as_str(), events.last()?.at)))
            .collect();
        entries.sort_by(|a, b| b.2.cmp(&a.2).then(b.0.cmp(&a.0)));
        let take = limit.map_or(usize::MAX, |limit| limit.max(0) as usize);
        entries
            .into_iter()
            .take(take)
            .map(|(_, id, _)| id.to_owned())
            .collect()
    }
}

/// The reference's checks in its order (`engagementId`, `at`, `data`), plus flightlog's: `at` an
/// integer below 2^53 in magnitude, `data` at most 64 levels deep, then `type` a non-empty string.
fn validate(raw: &Value) -> Result<(String, i64, String, JsonObject), Refusal> {
    let invalid = |path: &str| Refusal::Invalid(path.to_owned());
    let Some(input) = raw.as_object() else {
        return Err(invalid(""));
    };
    let engagement_id = match input.get("engagementId") {
        Some(Value::String(id)) if !id.is_empty() => id.clone(),
        _ => return Err(invalid("engagementId")),
    };
    let at = match input.get("at") {
        Some(Value::Number(number)) => safe_integer(number).ok_or_else(|| invalid("at"))?,
        _ => return Err(invalid("at")),
    };
    let Some(Value::Object(data)) = input.get("data") else {
        return Err(invalid("data"));
    };
    let mut path = String::from("data");
    if object_too_deep(data, 1, &mut path) {
        return Err(Refusal::Invalid(path));
    }
    let event_type = match input.get("type") {
        Some(Value::String(kind)) if !kind.is_empty() => kind.clone(),
        _ => return Err(invalid("type")),
    };
    Ok((engagement_id, at, event_type, data.clone()))
}

fn safe_integer(number: &Number) -> Option<i64> {
    let value = number.as_f64()?;
    if let Some(integer) = number.as_i64() {
        return (integer.unsigned_abs() <= MAX_SAFE.unsigned_abs()).then_some(integer);
    }
    (value.fract() == 0.0 && value.abs() <= MAX_SAFE as f64).then_some(value as i64)
}

/// Whether a container inside `object` (which sits at `depth`) lies deeper than the limit; on
/// `true`, `path` names the first such container.
fn object_too_deep(object: &JsonObject, depth: usize, path: &mut String) -> bool {
    for (key, value) in object {
        let mark = path.len();
        path.push('.');
        path.push_str(key);
        if value_too_deep(value, depth + 1, path) {
            return true;
        }
        path.truncate(mark);
    }
    false
}

fn value_too_deep(value: &Value, depth: usize, path: &mut String) -> bool {
    match value {
        Value::Object(_) | Value::Array(_) if depth > MAX_DATA_DEPTH => true,
        Value::Object(object) => object_too_deep(object, depth, path),
        Value::Array(items) => items.iter().enumerate().any(|(index, item)| {
            let mark = path.len();
            path.push_str(&format!("[{index}]"));
            let found = value_too_deep(item, depth + 1, path);
            if !found {
                path.truncate(mark);
            }
            found
        }),
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------------------------

fn pick(values: &'static [&'static str]) -> impl Strategy<Value = &'static str> {
    prop::sample::select(values)
}

/// Engagement 0 is favoured so its log grows past the compaction threshold.
fn engagement() -> impl Strategy<Value = usize> {
    prop_oneof![6 => Just(0_usize), 2 => Just(1_usize), 1 => Just(2_usize), 1 => Just(3_usize)]
}

/// A number JSON can carry, including fractions, huge and tiny floats and integers past i64.
fn odd_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Every finite float: the SQLite journal stores `data` as JSON text, and it must read
        // back the very number appended (see `sqlite_reads_floats_back_exactly`).
        any::<f64>().prop_filter_map("finite", |float| Number::from_f64(float).map(Value::Number)),
        (-1_000_i64..1_000).prop_map(|n| json!(n as f64 / 8.0)),
    ]
}

/// Loose text: any characters, control characters, quotes and escapes included.
fn odd_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s).{0,8}",
        Just("\"quoted\" \\ back\\slash\u{0}nul".to_owned()),
        Just("ünïcödé ✓ 𝄞".to_owned()),
    ]
}

/// Budget usage in the reference's tolerated shapes (`usage`, `amount`, `consumed`, flat).
fn usage() -> impl Strategy<Value = Value> {
    let amounts =
        (0_i64..50, 0_i64..3, prop::option::of(-5_i64..5)).prop_map(|(tokens, calls, odd)| {
            let mut amounts = json!({"tokens": tokens, "modelCalls": calls});
            if let Some(odd) = odd {
                amounts["wallMs"] = json!(odd as f64 + 0.5);
                amounts["sideEffects"] = json!(odd);
            }
            amounts
        });
    (amounts, 0_usize..4).prop_map(|(amounts, shape)| match shape {
        0 => json!({ "usage": amounts }),
        1 => json!({ "amount": amounts }),
        2 => json!({ "consumed": amounts }),
        _ => amounts,
    })
}

/// An event type and its data, in the reference's realistic mix plus some odd payloads.
fn event() -> impl Strategy<Value = (String, Value)> {
    let mail_sent = (
        pick(&MAILS),
        pick(&ACTORS),
        pick(&ACTORS),
        prop::option::of(pick(&MAILS)),
        pick(&["ask", "result", "notify"]),
    )
        .prop_map(|(mail, from, to, cause, kind)| {
            let mut data = json!({"mailId": mail, "from": from, "to": to, "kind": kind});
            if let Some(cause) = cause {
                data["causationId"] = json!(cause);
            }
            ("mail_sent".to_owned(), data)
        });
    let delivered = (pick(&MAILS), pick(&ACTORS)).prop_map(|(mail, actor)| {
        (
            "mail_delivered".to_owned(),
            json!({"mailId": mail, "actor": actor}),
        )
    });
    let turn = (
        pick(&ACTORS),
        prop::collection::vec(pick(&MAILS), 0..3),
        any::<bool>(),
        pick(&["completed", "cancelled"]),
    )
        .prop_map(|(actor, mails, started, status)| {
            if started {
                (
                    "turn_started".to_owned(),
                    json!({"actor": actor, "mails": mails}),
                )
            } else {
                (
                    "turn_finished".to_owned(),
                    json!({"actor": actor, "mails": mails, "status": status}),
                )
            }
        });
    let tool = (pick(&ACTORS), pick(&["bash", "read_file", "grep"])).prop_map(|(actor, tool)| {
        (
            "tool_called".to_owned(),
            json!({"actor": actor, "tool": tool, "input": {"args": [tool, 1, null]}}),
        )
    });
    let budget = usage().prop_map(|data| ("budget_charged".to_owned(), data));
    let board = (
        pick(&[" plan ", "todo-1", "artifact:report", "", "\u{feff}plan"]),
        pick(&["note", "todo", "artifact", "bogus"]),
        odd_text(),
        pick(&ACTORS),
        prop::option::of(pick(&["pending", "in_progress", "done", "nope"])),
    )
        .prop_map(|(key, kind, content, actor, status)| {
            let mut data = json!({"key": key, "kind": kind, "content": content, "actor": actor});
            if let Some(status) = status {
                data["status"] = json!(status);
            }
            ("board_written".to_owned(), data)
        });
    let projected = (pick(&ACTORS), pick(&MAILS), pick(&["visible", "summary"])).prop_map(
        |(actor, mail, mode)| {
            (
                "venue_projected".to_owned(),
                json!({"venue": {"kind": "chat", "id": "c-1"}, "actor": actor,
                       "mailId": mail, "mode": mode}),
            )
        },
    );
    let opened = (pick(&ACTORS), any::<bool>()).prop_map(|(entry, object)| {
        let initiator = if object {
            json!({"initiator": {"kind": "human", "id": "ann", "trust": "owner", "extra": [1]}})
        } else {
            json!({"principal": "ann"})
        };
        let mut data = json!({"venue": {"kind": "thread", "id": "t-9"}, "entry": entry});
        if let (Some(data), Value::Object(initiator)) = (data.as_object_mut(), initiator) {
            data.extend(initiator);
        }
        ("engagement_opened".to_owned(), data)
    });
    let closed = (
        0_usize..7,
        prop::option::of(pick(&["done", "gave up"])),
        prop::option::of(usage()),
    )
        .prop_map(|(status, reason, totals)| {
            let mut data = json!({});
            // Mostly compactable: no status or "completed".
            match status {
                0..=2 => {}
                3 | 4 => data["status"] = json!("completed"),
                5 => data["status"] = Value::Null,
                _ => data["status"] = json!("cancelled"),
            }
            if let Some(reason) = reason {
                data["reason"] = json!(reason);
            }
            match totals {
                Some(Value::Object(mut totals)) if totals.contains_key("usage") => {
                    data["budget"] = json!({ "spent": totals.remove("usage") });
                }
                Some(totals) => data["consumed"] = totals,
                None => {}
            }
            ("engagement_closed".to_owned(), data)
        });
    let blocking = (
        pick(&["guard_blocked", "mail_denied", "escalated"]),
        pick(&ACTORS),
        pick(&ACTORS),
    )
        .prop_map(|(kind, from, to)| {
            (
                kind.to_owned(),
                json!({"from": from, "to": to, "reason": {"code": "loop", "detail": "again"}}),
            )
        });
    let odd = (
        pick(&["custom.note", "ünïcode_type", "x", "budget_granted"]),
        prop::collection::vec((odd_text(), odd_number()), 0..4),
        odd_text(),
    )
        .prop_map(|(kind, fields, text)| {
            let mut data = JsonObject::new();
            for (key, number) in fields {
                data.insert(key, number);
            }
            data.insert(
                "nested".to_owned(),
                json!([[text, {"deep": [null, true, -0.0]}], {}]),
            );
            (kind.to_owned(), Value::Object(data))
        });
    prop_oneof![
        4 => mail_sent,
        3 => delivered,
        3 => turn,
        3 => tool,
        5 => budget,
        3 => board,
        1 => projected,
        1 => opened,
        4 => closed,
        1 => blocking,
        2 => odd,
    ]
}

fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        24 => (-60_i64..=60).prop_map(At::Offset),
        6 => (-250_i64..=-61).prop_map(At::Offset),
        1 => prop::sample::select(vec![MAX_SAFE, -MAX_SAFE, 0]).prop_map(At::Absolute),
        1 => (-60_i64..=60).prop_map(At::FloatOffset),
    ]
}

fn expected() -> impl Strategy<Value = Expected> {
    prop_oneof![
        6 => Just(Expected::None),
        3 => Just(Expected::Next),
        1 => prop_oneof![-2_i64..=-1, 1_i64..=2].prop_map(Expected::Off),
        1 => (-3_i64..30).prop_map(Expected::Exactly),
    ]
}

fn append_op() -> impl Strategy<Value = Op> {
    (engagement(), at(), event(), expected()).prop_map(
        |(engagement, at, (event_type, data), expected)| {
            Op::Append(AppendSpec {
                engagement,
                at,
                event_type,
                data,
                expected,
            })
        },
    )
}

fn write_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => append_op(),
        2 => engagement().prop_map(Op::Compact),
        1 => Just(Op::Prune(None)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        14 => append_op(),
        2 => (engagement(), -50_i64..50, prop::sample::select(INVALIDS.to_vec()))
            .prop_map(|(engagement, offset, invalid)| Op::Invalid { engagement, offset, invalid }),
        4 => (engagement(), -60_i64..=20, 5_usize..=15)
            .prop_map(|(engagement, offset, count)| Op::Burst { engagement, offset, count }),
        3 => (0_i64..=100).prop_map(Op::Advance),
        2 => prop_oneof![
            12 => Just(None),
            1 => prop::sample::select(vec![i64::MAX, i64::MIN, -MAX_SAFE]).prop_map(Some),
        ]
        .prop_map(Op::Prune),
        4 => engagement().prop_map(Op::Compact),
        1 => (0_usize..5).prop_map(Op::Read),
        1 => ((0_usize..5), -3_i64..30).prop_map(|(engagement, from)| Op::ReadFrom(engagement, from)),
        1 => prop::option::of(-2_i64..6).prop_map(Op::List),
        2 => (0_usize..5).prop_map(Op::Summarize),
        2 => prop::collection::vec(write_op(), 2..6).prop_map(Op::Group),
        2 => (engagement(), -30_i64..=30, any::<bool>()).prop_map(|(engagement, offset, status)| {
            // Finish an engagement and compact it at once (in one SQLite writer group).
            let data = if status {
                json!({"status": "completed", "reason": "done"})
            } else {
                json!({"reason": "done"})
            };
            let close = Op::Append(AppendSpec {
                engagement,
                at: At::Offset(offset),
                event_type: "engagement_closed".to_owned(),
                data,
                expected: Expected::None,
            });
            Op::Group(vec![close, Op::Compact(engagement)])
        }),
    ]
}

/// Either a small cap (full engagements) or one large enough for compaction.
fn retention() -> impl Strategy<Value = RetentionConfig> {
    let cap = prop_oneof![1 => 5_u64..=12, 2 => 22_u64..=45];
    (cap, 40_i64..=400).prop_map(|(max_events_per_engagement, max_age_ms)| RetentionConfig {
        max_events_per_engagement,
        max_age_ms,
    })
}

/// `{"k": {"k": … {}}}` with `levels` objects in all.
fn nested(levels: usize) -> Value {
    let mut value = json!({});
    for _ in 1..levels {
        value = json!({ "k": value });
    }
    value
}

fn invalid_input(engagement_id: &str, at: i64, invalid: Invalid) -> Value {
    let mut raw = json!({"engagementId": engagement_id, "at": at, "type": "tool_called",
                         "data": {"tool": "bash"}});
    let set = |raw: &mut Value, key: &str, value: Value| raw[key] = value;
    let remove = |raw: &mut Value, key: &str| {
        if let Some(object) = raw.as_object_mut() {
            object.remove(key);
        }
    };
    match invalid {
        Invalid::NotAnObject => raw = json!([engagement_id, at]),
        Invalid::EngagementIdNumber => set(&mut raw, "engagementId", json!(42)),
        Invalid::EngagementIdEmpty => set(&mut raw, "engagementId", json!("")),
        Invalid::EngagementIdMissing => remove(&mut raw, "engagementId"),
        Invalid::AtString => set(&mut raw, "at", json!(at.to_string())),
        Invalid::AtNull => set(&mut raw, "at", Value::Null),
        Invalid::AtFraction => set(&mut raw, "at", json!(at as f64 + 0.5)),
        Invalid::AtTooLarge => set(&mut raw, "at", json!(MAX_SAFE + 1)),
        Invalid::AtTooSmall => set(&mut raw, "at", json!(-MAX_SAFE as f64 - 1.0)),
        Invalid::DataNull => set(&mut raw, "data", Value::Null),
        Invalid::DataArray => set(&mut raw, "data", json!([1, 2])),
        Invalid::DataMissing => remove(&mut raw, "data"),
        Invalid::DataString => set(&mut raw, "data", json!("{}")),
        Invalid::DataTooDeep => set(&mut raw, "data", nested(MAX_DATA_DEPTH + 1)),
        Invalid::TypeMissing => remove(&mut raw, "type"),
        Invalid::TypeEmpty => set(&mut raw, "type", json!("")),
        Invalid::TypeNumber => set(&mut raw, "type", json!(7)),
        Invalid::AtDataAndType => {
            set(&mut raw, "at", json!("soon"));
            set(&mut raw, "data", json!([]));
            remove(&mut raw, "type");
        }
        Invalid::DataAndType => {
            set(&mut raw, "data", json!(true));
            set(&mut raw, "type", json!(""));
        }
        Invalid::EngagementIdAndAt => {
            set(&mut raw, "engagementId", Value::Null);
            set(&mut raw, "at", json!(1.25));
        }
    }
    raw
}

/// The `index`-th event of a burst: bookkeeping the compaction drops, and some tool calls.
fn burst_event(index: usize) -> (&'static str, Value) {
    let mail = MAILS[index % MAILS.len()];
    let actor = ACTORS[index % 3];
    match index % 5 {
        0 | 3 => (
            "budget_charged",
            json!({"usage": {"tokens": index + 1, "modelCalls": 1, "wallMs": 2.5}}),
        ),
        1 => ("mail_delivered", json!({"mailId": mail, "actor": actor})),
        2 => ("turn_started", json!({"actor": actor, "mails": [mail]})),
        _ => ("tool_called", json!({"actor": actor, "tool": "grep"})),
    }
}

fn event_input(engagement_id: &str, at: impl Into<Value>, event_type: &str, data: &Value) -> Value {
    let at: Value = at.into();
    json!({"engagementId": engagement_id, "at": at, "type": event_type, "data": data})
}

// ---------------------------------------------------------------------------------------------
// The harness.
// ---------------------------------------------------------------------------------------------

/// Totals over every case, to show that the generator reaches the interesting states.
struct Coverage {
    appended: AtomicU64,
    full: AtomicU64,
    wrong_seq: AtomicU64,
    invalid: AtomicU64,
    compacted: AtomicU64,
    pruned: AtomicU64,
}

static COVERAGE: Coverage = Coverage {
    appended: AtomicU64::new(0),
    full: AtomicU64::new(0),
    wrong_seq: AtomicU64::new(0),
    invalid: AtomicU64::new(0),
    compacted: AtomicU64::new(0),
    pruned: AtomicU64::new(0),
};

impl Coverage {
    fn count(&self, call: &Call, outcome: &Outcome) {
        let counter = match (call, outcome) {
            (Call::Append { .. }, Ok(_)) => &self.appended,
            (_, Err(Refusal::Full { .. })) => &self.full,
            (_, Err(Refusal::WrongExpectedSeq { .. })) => &self.wrong_seq,
            (_, Err(Refusal::Invalid(_))) => &self.invalid,
            (Call::Compact { .. }, Ok(text)) if text == "true" => &self.compacted,
            (Call::Prune { .. }, Ok(text)) if text != "0" => &self.pruned,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

async fn run_call(journal: &dyn EngagementJournal, call: &Call) -> Outcome {
    match call {
        Call::Append {
            raw,
            expected: None,
        } => journal
            .append_json(raw.clone())
            .await
            .map(|event| to_json_text!(&event))
            .map_err(refusal),
        Call::Append {
            raw,
            expected: Some(seq),
        } => match AppendInput::from_json(raw.clone()) {
            Ok(input) => journal
                .append(input.with_expected_seq(*seq))
                .await
                .map(|event| to_json_text!(&event))
                .map_err(refusal),
            Err(err) => Err(Refusal::Invalid(err.path().to_owned())),
        },
        Call::Prune { now } => journal
            .prune(*now)
            .await
            .map(|n| to_json_text!(&n))
            .map_err(refusal),
        Call::Compact { engagement_id } => journal
            .compact(engagement_id)
            .await
            .map(|done| to_json_text!(&done))
            .map_err(refusal),
        Call::Read { engagement_id } => journal
            .read(engagement_id)
            .await
            .map(|events| to_json_text!(&events))
            .map_err(refusal),
        Call::ReadFrom {
            engagement_id,
            from_seq,
        } => journal
            .read_from(engagement_id, *from_seq)
            .await
            .map(|events| to_json_text!(&events))
            .map_err(refusal),
        Call::List { limit } => journal
            .list_engagements(*limit)
            .await
            .map(|ids| to_json_text!(&ids))
            .map_err(refusal),
        Call::Summarize { engagement_id } => journal
            .summarize(engagement_id)
            .await
            .map(|summary| to_json_text!(&summary))
            .map_err(refusal),
    }
}

/// Poll every future in order until all are done: each is first polled (and so queues its
/// write) in list order, so the SQLite writer sees the writes in that order, often in one group.
async fn join_in_order<F: Future + ?Sized>(mut futures: Vec<Pin<Box<F>>>) -> Vec<F::Output> {
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

/// Long texts shortened so a failure report stays readable.
fn shorten(outcome: &Outcome) -> String {
    let text = format!("{outcome:?}");
    if text.chars().count() <= 2_000 {
        return text;
    }
    let head: String = text.chars().take(2_000).collect();
    format!("{head}… ({} chars)", text.chars().count())
}

struct Harness {
    model: Model,
    now: i64,
    backends: [(&'static str, Box<dyn EngagementJournal>); 2],
}

impl Harness {
    fn engagement_id(index: usize) -> String {
        ENGAGEMENTS
            .get(index)
            .copied()
            .unwrap_or(UNKNOWN)
            .to_owned()
    }

    fn at(&self, at: &At) -> Value {
        match at {
            At::Offset(offset) => json!(self.now + offset),
            At::FloatOffset(offset) => json!((self.now + offset) as f64),
            At::Absolute(at) => json!(at),
        }
    }

    /// The op's calls, resolved in order against the model, each with the model's outcome.
    fn resolve(&mut self, op: &Op, calls: &mut Vec<(Call, Outcome)>) {
        let mut push = |model: &mut Model, call: Call| {
            let outcome = model.apply(&call);
            COVERAGE.count(&call, &outcome);
            calls.push((call, outcome));
        };
        match op {
            Op::Append(spec) => {
                let engagement_id = Self::engagement_id(spec.engagement);
                let len = self.model.events(&engagement_id).len() as i64;
                let expected = match spec.expected {
                    Expected::None => None,
                    Expected::Next => Some(len),
                    Expected::Off(offset) => Some(len + offset),
                    Expected::Exactly(seq) => Some(seq),
                };
                let raw = event_input(
                    &engagement_id,
                    self.at(&spec.at),
                    &spec.event_type,
                    &spec.data,
                );
                push(&mut self.model, Call::Append { raw, expected });
            }
            Op::Invalid {
                engagement,
                offset,
                invalid,
            } => {
                let raw = invalid_input(
                    &Self::engagement_id(*engagement),
                    self.now + offset,
                    *invalid,
                );
                push(
                    &mut self.model,
                    Call::Append {
                        raw,
                        expected: None,
                    },
                );
            }
            Op::Burst {
                engagement,
                offset,
                count,
            } => {
                let engagement_id = Self::engagement_id(*engagement);
                for index in 0..*count {
                    let (event_type, data) = burst_event(index);
                    let at = self.now + offset + index as i64;
                    let raw = event_input(&engagement_id, at, event_type, &data);
                    push(
                        &mut self.model,
                        Call::Append {
                            raw,
                            expected: None,
                        },
                    );
                }
            }
            Op::Advance(by) => self.now += by,
            Op::Prune(now) => {
                let now = now.unwrap_or(self.now);
                push(&mut self.model, Call::Prune { now });
            }
            Op::Compact(engagement) => {
                let engagement_id = Self::engagement_id(*engagement);
                push(&mut self.model, Call::Compact { engagement_id });
            }
            Op::Read(engagement) => {
                let engagement_id = Self::engagement_id(*engagement);
                push(&mut self.model, Call::Read { engagement_id });
            }
            Op::ReadFrom(engagement, from_seq) => {
                let engagement_id = Self::engagement_id(*engagement);
                push(
                    &mut self.model,
                    Call::ReadFrom {
                        engagement_id,
                        from_seq: *from_seq,
                    },
                );
            }
            Op::List(limit) => push(&mut self.model, Call::List { limit: *limit }),
            Op::Summarize(engagement) => {
                let engagement_id = Self::engagement_id(*engagement);
                push(&mut self.model, Call::Summarize { engagement_id });
            }
            Op::Group(members) => {
                for member in members {
                    self.resolve(member, calls);
                }
            }
        }
    }

    async fn step(&mut self, label: &str, op: &Op) -> Result<(), TestCaseError> {
        let mut calls = Vec::new();
        self.resolve(op, &mut calls);
        for (name, journal) in &self.backends {
            let futures: Vec<Pin<Box<dyn Future<Output = Outcome> + '_>>> = calls
                .iter()
                .map(|(call, _)| Box::pin(run_call(journal.as_ref(), call)) as Pin<Box<_>>)
                .collect();
            let outcomes = join_in_order(futures).await;
            for ((call, expected), actual) in calls.iter().zip(&outcomes) {
                if actual != expected {
                    return Err(TestCaseError::fail(format!(
                        "{label}: {name} disagrees with the model on {call:?}\n  model: {}\n  \
                         {name}: {}",
                        shorten(expected),
                        shorten(actual)
                    )));
                }
            }
        }
        if calls.iter().any(|(call, _)| call.writes()) {
            self.check_all(label, false).await?;
        }
        Ok(())
    }

    /// Compare everything visible: the listing and every engagement's events (and, when
    /// `summaries`, every summary).
    async fn check_all(&mut self, label: &str, summaries: bool) -> Result<(), TestCaseError> {
        let mut calls = vec![Call::List { limit: None }];
        for engagement_id in ENGAGEMENTS.iter().chain([&UNKNOWN]) {
            let engagement_id = (*engagement_id).to_owned();
            calls.push(Call::Read {
                engagement_id: engagement_id.clone(),
            });
            if summaries {
                calls.push(Call::Summarize { engagement_id });
            }
        }
        for call in &calls {
            let expected = self.model.apply(call);
            for (name, journal) in &self.backends {
                let actual = run_call(journal.as_ref(), call).await;
                if actual != expected {
                    return Err(TestCaseError::fail(format!(
                        "{label}, state check: {name} disagrees with the model on {call:?}\n  \
                         model: {}\n  {name}: {}",
                        shorten(&expected),
                        shorten(&actual)
                    )));
                }
            }
        }
        Ok(())
    }
}

async fn run_case(retention: RetentionConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|err| TestCaseError::fail(format!("temp dir: {err}")))?;
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("journal.db")))
        .map_err(|err| TestCaseError::fail(format!("open: {err}")))?;
    let mut harness = Harness {
        model: Model {
            retention,
            engagements: Vec::new(),
        },
        now: START_CLOCK,
        backends: [
            (
                "in-memory",
                Box::new(InMemoryEngagementJournal::new(retention)),
            ),
            (
                "sqlite",
                Box::new(SqliteEngagementJournal::new(db, retention)),
            ),
        ],
    };
    for (_, journal) in &harness.backends {
        prop_assert_eq!(journal.retention(), retention);
    }
    for (index, op) in ops.iter().enumerate() {
        harness.step(&format!("op #{index} {op:?}"), op).await?;
    }
    harness.check_all("final state", true).await
}

#[test]
fn both_journals_behave_like_the_reference_model() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(48);
    let config = ProptestConfig {
        cases,
        // Keep the work tree clean: a failure prints its shrunk sequence instead.
        failure_persistence: None,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = (retention(), prop::collection::vec(op(), 8..80));
    let outcome = runner.run(&strategy, |(retention, ops)| {
        runtime.block_on(run_case(retention, ops))
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
    // The generator must reach every interesting state, or the property proves little.
    let coverage = [
        ("appends", &COVERAGE.appended),
        ("full refusals", &COVERAGE.full),
        ("wrong expected seqs", &COVERAGE.wrong_seq),
        ("invalid inputs", &COVERAGE.invalid),
        ("compactions", &COVERAGE.compacted),
        ("prunes that deleted", &COVERAGE.pruned),
    ];
    for (what, counter) in coverage {
        let count = counter.load(Ordering::Relaxed);
        eprintln!("journal model coverage: {what}: {count}");
        assert!(count > 0, "no case reached {what}");
    }
}

/// Regression: the SQLite journal stores `data` as JSON text, and serde_json's default float
/// parser (without the `float_roundtrip` feature) read some 17-digit numbers back one ULP off:
/// `read` returned `4.1877187579629147e-243` where `append` and the in-memory journal had
/// `4.187718757962915e-243`. The property above found it; this pins the value it found.
#[test]
fn sqlite_reads_floats_back_exactly() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("journal.db")))
        .expect("the database opens");
    let journal = SqliteEngagementJournal::new(db, RetentionConfig::default());
    let appended: Value = serde_json::from_str("4.187718757962915e-243").expect("a number");
    let raw = event_input("e", 1, "x", &json!({ "x": appended }));
    let (stored, read) = runtime.block_on(async {
        let stored = journal.append_json(raw).await.expect("the append succeeds");
        let read = journal.read("e").await.expect("the read succeeds");
        (stored, read)
    });
    assert_eq!(stored.data.get("x"), Some(&appended));
    let read_back = read.first().and_then(|event| event.data.get("x"));
    assert_eq!(read_back, Some(&appended));
    assert_eq!(
        read_back.map(Value::to_string).as_deref(),
        Some("4.187718757962915e-243")
    );
}
