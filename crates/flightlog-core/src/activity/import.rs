//! Spans delivered whole by an importer (OpenTelemetry ingest), and what storing them did.
//!
//! A native client describes a span as a sequence of calls (start, patch, events, end). An OTLP
//! exporter instead delivers each span once it has ended, in any order, in any batch, and retries
//! deliveries it is unsure of. [`ImportedSpan`] is that shape: the span as it is *now*. The store's
//! `import_spans` makes one delivery idempotent: a span it already holds as terminal is left
//! alone (its events too); a span it holds open (started natively, or announced as pending) is
//! completed, not duplicated; an unknown span is created whole.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::types::{JsonObject, SpanKind, SpanOrigin, SpanOutcome, SpanUsage};

/// The terminal part of an imported span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedEnd {
    pub ended_at: i64,
    pub outcome: SpanOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One event of an imported span (an OTLP span event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedEvent {
    pub ts: i64,
    pub event_type: String,
    /// Capped like any event payload when stored.
    pub payload: Value,
}

/// One span as an importer knows it: whole, possibly still running (`end` absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportedSpan {
    pub span_id: String,
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub origin: SpanOrigin,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    pub attrs: JsonObject,
    pub started_at: i64,
    /// `None`: the span was announced before it ended (it stays open until a later delivery
    /// carries its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<ImportedEnd>,
    pub usage: SpanUsage,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ImportedEvent>,
}

/// A span the store refused to import, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportRejection {
    pub span_id: String,
    pub reason: String,
}

/// What one `import_spans` call did, span by span.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportReport {
    /// Spans that did not exist and were written whole.
    pub created: u64,
    /// Spans that existed open and were updated (completed, or refreshed while still pending).
    pub completed: u64,
    /// Spans already terminal: a repeated delivery, nothing written.
    pub unchanged: u64,
    /// Events written.
    pub events_added: u64,
    /// Runs whose rollup was (re)computed because their root is terminal.
    pub runs_rolled_up: u64,
    /// Spans refused (e.g. the span id is already taken by a span of another run); the rest of
    /// the call is unaffected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<ImportRejection>,
}
