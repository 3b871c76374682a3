//! Many span writes in one call: the store side of `POST /v1/activity/batch`.
//!
//! Each write is atomic on its own and the writes apply in order (a later write may depend on an
//! earlier one: start a span, then end it). [`ActivityStore::write_batch`] has a sequential
//! default that any backend gets for free; a backend with a writer queue can do better (the
//! SQLite store runs the whole batch as one job of its writer thread, each write failing alone
//! (with a savepoint around each when one fails after it wrote), so a batch costs one queue
//! round trip instead of one per write).
//!
//! [`ActivityStore::write_batch`]: super::ActivityStore::write_batch

use serde_json::Value;

use super::payload_text::PayloadText;
use super::types::{EndSpanInput, SpanEventRow, SpanPatch, SpanRow, StartSpanInput};

/// One write of a batch: the single-call operations, with their arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum ActivityWrite {
    StartSpan(StartSpanInput),
    EndSpan {
        span_id: String,
        input: EndSpanInput,
    },
    PatchSpan {
        span_id: String,
        patch: SpanPatch,
    },
    AppendEvent {
        span_id: String,
        event_type: String,
        payload: Option<Value>,
        ts: Option<i64>,
    },
    /// [`ActivityWrite::AppendEvent`] with its payload already in its stored form (read from
    /// the request's text, see [`PayloadText`]): the same event is stored.
    AppendEventText {
        span_id: String,
        event_type: String,
        payload: PayloadText,
        ts: Option<i64>,
    },
    Heartbeat {
        span_id: String,
        at: Option<i64>,
    },
}

/// What one write of a batch returned: the single call's return value.
#[derive(Debug, Clone, PartialEq)]
pub enum ActivityWriteResult {
    Started(Box<SpanRow>),
    Ended(bool),
    Patched(bool),
    /// `None`: the span is unknown.
    Appended(Option<SpanEventRow>),
    Heartbeat,
}
