//! Spans delivered whole by an importer (OpenTelemetry ingest), and what storing them did.
//!
//! A native client describes a span as a sequence of calls (start, patch, events, end). An OTLP
//! exporter instead delivers each span once it has ended, in any order, in any batch, and retries
//! deliveries it is unsure of. [`ImportedSpan`] is that shape: the span as it is *now*. The store's
//! `import_spans` makes one delivery idempotent: a span it already holds as terminal is left
//! alone, but for the events only the delivered copy carries (a natively ended span gets them
//! once); a span it holds open (started natively, or announced as pending) is
//! completed, not duplicated; an unknown span is created whole.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::pricing::ModelPrice;
use super::types::{JsonObject, SpanKind, SpanOrigin, SpanOutcome, SpanUsage};

/// attrs key an importer writes on a span that has a cost: where the cost came from,
/// [`COST_SOURCE_REPORTED`] or [`COST_SOURCE_PRICE_TABLE`].
pub const COST_SOURCE_ATTR: &str = "flightlog.cost_source";
/// [`COST_SOURCE_ATTR`]: the instrumentation reported the cost.
pub const COST_SOURCE_REPORTED: &str = "reported";
/// [`COST_SOURCE_ATTR`]: computed from the token counts at a price table's prices.
pub const COST_SOURCE_PRICE_TABLE: &str = "price_table";
/// attrs key: the version of the price table a span's cost was computed with.
pub const PRICE_TABLE_ATTR: &str = "flightlog.price_table";

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
    /// The parent a span continued from a remote caller names (it is then a root here,
    /// `parent_span_id` `None`): when that span is stored in the same run, the store keeps it
    /// as the parent; when it is stored later, it adopts the span then (see `docs/otlp.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_parent: Option<RemoteParent>,
    pub name: String,
    pub kind: SpanKind,
    pub origin: SpanOrigin,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    pub attrs: ImportedAttrs,
    pub started_at: i64,
    /// `None`: the span was announced before it ended (it stays open until a later delivery
    /// carries its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<ImportedEnd>,
    pub usage: SpanUsage,
    /// The prices `usage.cost_usd` was computed at from this delivery's token counts (an
    /// importer's price table), none when the cost was reported or there is none. A store that
    /// completes an open span with this delivery prices the counts the span ends up with (some
    /// may come from an earlier delivery, which the merge keeps) at them, so the cost is never
    /// that of this delivery's counts alone; a cost an earlier delivery or the native writer
    /// reported is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priced_at: Option<ModelPrice>,
    /// The provider's id of the model call (over OTLP `gen_ai.response.id`, else
    /// `ai.response.id`), when a model span names one: the rollup counts one call once, however
    /// many spans record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<ImportedEvent>,
}

/// The remote parent of an imported span (see [`ImportedSpan::remote_parent`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemoteParent {
    pub span_id: String,
    /// The span's kind when it is stored under that parent (an agent's span is a `turn` at the
    /// root, a `subagent` below another span).
    pub kind_under_it: SpanKind,
}

/// An imported span's attrs: a map, or the text of one already encoded by the importer.
///
/// The OTLP mapping writes a span's attrs as JSON text straight from the decoded protobuf
/// (the resource and scope parts encoded once per request): building a map per span, deep-copying
/// the resource into it and serializing it again was about a third of ingest's CPU per span.
/// The store keeps the text as it is. Both forms serialize as the same JSON object.
#[derive(Debug, Clone, PartialEq)]
pub enum ImportedAttrs {
    Object(JsonObject),
    Encoded(EncodedAttrs),
}

impl Default for ImportedAttrs {
    fn default() -> Self {
        Self::Object(JsonObject::new())
    }
}

impl From<JsonObject> for ImportedAttrs {
    fn from(object: JsonObject) -> Self {
        Self::Object(object)
    }
}

impl From<EncodedAttrs> for ImportedAttrs {
    fn from(encoded: EncodedAttrs) -> Self {
        Self::Encoded(encoded)
    }
}

impl ImportedAttrs {
    /// The attrs as a map (an encoded text is parsed).
    pub fn to_object(&self) -> Result<JsonObject, serde_json::Error> {
        match self {
            Self::Object(object) => Ok(object.clone()),
            Self::Encoded(encoded) => crate::json_as_written::object_from_str(encoded.as_str()),
        }
    }

    /// The attrs as compact JSON text (a map is serialized; an encoded text is moved out).
    pub fn into_text(self) -> String {
        match self {
            // A map with string keys always serializes; the fallback only keeps this total.
            Self::Object(object) => {
                serde_json::to_string(&object).unwrap_or_else(|_| String::from("{}"))
            }
            Self::Encoded(encoded) => encoded.0,
        }
    }
}

impl Serialize for ImportedAttrs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Object(object) => object.serialize(serializer),
            Self::Encoded(_) => self
                .to_object()
                .map_err(serde::ser::Error::custom)?
                .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ImportedAttrs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        JsonObject::deserialize(deserializer).map(Self::Object)
    }
}

/// The compact text of one JSON object, written by an importer.
///
/// The contract is the producer's: the text must parse as a JSON object (checked in debug
/// builds only; the OTLP encoder's tests compare its output with the map form, shape by shape).
/// It is not re-validated on the ingest path because that parse would cost as much as the
/// encoding saves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedAttrs(String);

impl EncodedAttrs {
    /// Wrap `text`, the compact text of one JSON object nesting at most
    /// [`crate::json_depth::MAX_JSON_DEPTH`] levels (the store keeps it as it is, unchecked:
    /// this form exists so an importer that already wrote the text pays nothing more).
    pub fn from_object_text(text: String) -> Self {
        debug_assert!(
            crate::json_as_written::object_from_str(&text).is_ok(),
            "not a JSON object: {text}"
        );
        Self(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
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
    /// Spans that existed open and were completed (the delivery carried their end).
    pub completed: u64,
    /// Spans that existed open and stay open: an announcement delivered again (an exporter's
    /// retry) or a later, still unfinished copy; attrs merged, usage filled, heartbeat renewed.
    #[serde(default)]
    pub refreshed: u64,
    /// Spans already terminal, whose fields are written once: a repeated delivery writes
    /// nothing at all; a span ended natively before the exporter's copy came gets the events
    /// only that copy carries (counted in `events_added`).
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
