//! The engagement journal's records and summaries, shaped and named as the reference's JSON.
//!
//! Field names serialize in camelCase exactly as the reference TypeScript does, and a field the
//! reference leaves `undefined` is an `Option` that is omitted when `None` (never `null`).
//! Budget amounts and board versions are JavaScript numbers in the reference (fractions allowed),
//! so they are `f64` here and serialize the way `JSON.stringify` writes them: an integral value
//! as an integer (`2`, not `2.0`).
//!
//! With the `openapi` feature the types the HTTP API sends also implement `utoipa::ToSchema`.

use std::sync::Arc;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Number, Value};

/// A JSON object, key order preserved (event data, an initiator verbatim).
pub type JsonObject = Map<String, Value>;

/// 2^53: every time and seq is an integer strictly below this in magnitude, as JavaScript's safe
/// integers are.
pub const SAFE_INTEGER_LIMIT: i64 = 1 << 53;

/// One stored journal event. `seq` is the event's position in its engagement (0, 1, 2, …).
///
/// Cheap to clone: the id, type and data sit behind `Arc`s (events of one engagement share one
/// id), so reads, subscriptions and the value `append` returns copy no payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EngagementEvent {
    /// The engagement this event belongs to (never empty).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub engagement_id: Arc<str>,
    /// Position in the engagement, from 0, without gaps.
    pub seq: i64,
    /// When it happened, epoch milliseconds as the writer stated it (need not be monotonic).
    pub at: i64,
    /// What happened (`engagement_opened`, `mail_sent`, …); never empty.
    #[serde(rename = "type")]
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub event_type: Arc<str>,
    /// The payload, a JSON object stored verbatim.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: Arc<JsonObject>,
}

/// How long and how large engagements may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionConfig {
    /// An append to an engagement already holding this many events fails with `JournalFull`.
    pub max_events_per_engagement: u64,
    /// `prune(now)` deletes engagements whose last appended event is older than `now - max_age_ms`.
    pub max_age_ms: i64,
}

impl RetentionConfig {
    /// The reference's default maximum number of events per engagement.
    pub const DEFAULT_MAX_EVENTS_PER_ENGAGEMENT: u64 = 10_000;
    /// The reference's default maximum age: 30 days.
    pub const DEFAULT_MAX_AGE_MS: i64 = 2_592_000_000;
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            max_events_per_engagement: Self::DEFAULT_MAX_EVENTS_PER_ENGAGEMENT,
            max_age_ms: Self::DEFAULT_MAX_AGE_MS,
        }
    }
}

/// Where an engagement takes place (a chat, a thread, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VenueRef {
    /// The venue's kind, free text (`chat`, `thread`).
    pub kind: String,
    /// The venue's id within its kind.
    pub id: String,
}

/// An engagement's state as its events tell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EngagementStatus {
    /// Not closed and never escalated.
    Open,
    /// Closed normally.
    Completed,
    /// Escalated to a human (closed so, or any `escalated` event without a close status).
    Escalated,
    /// Closed as cancelled.
    Cancelled,
    /// Closed as blocked.
    Blocked,
}

impl EngagementStatus {
    /// The statuses an `engagement_closed` record may set (`open` is not one of them).
    pub fn parse_closed(text: &str) -> Option<Self> {
        match text {
            "completed" => Some(Self::Completed),
            "escalated" => Some(Self::Escalated),
            "cancelled" => Some(Self::Cancelled),
            "blocked" => Some(Self::Blocked),
            _ => None,
        }
    }
}

/// What a board entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BoardEntryKind {
    /// A produced artifact (a file, a document).
    Artifact,
    /// A task; it may carry a [`BoardTodoStatus`].
    Todo,
    /// Free text; the default kind.
    Note,
}

impl BoardEntryKind {
    /// The kind named `text`, if it is one.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "artifact" => Some(Self::Artifact),
            "todo" => Some(Self::Todo),
            "note" => Some(Self::Note),
            _ => None,
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Artifact => "artifact",
            Self::Todo => "todo",
            Self::Note => "note",
        }
    }
}

/// Progress of a todo entry. It is kept when an entry's kind later changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BoardTodoStatus {
    /// Not started.
    Pending,
    /// Being worked on.
    InProgress,
    /// Finished.
    Done,
}

impl BoardTodoStatus {
    /// The status named `text`, if it is one.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(Self::Pending),
            "in_progress" => Some(Self::InProgress),
            "done" => Some(Self::Done),
            _ => None,
        }
    }
}

/// One blackboard entry, the fold of every `board_written` record with its key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BoardEntry {
    /// The trimmed key.
    pub key: String,
    /// The last valid kind written, `note` by default.
    pub kind: BoardEntryKind,
    /// The last string content written, `""` by default.
    pub content: String,
    /// The last string `actor` (or else `author`) written, `""` by default.
    pub author: String,
    /// `at` of the last write.
    pub updated_at: i64,
    /// The payload's numeric `version`, else the previous version + 1 (from 0).
    #[serde(serialize_with = "serialize_js_number")]
    pub version: f64,
    /// The last valid todo status written, absent when none was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub status: Option<BoardTodoStatus>,
}

/// Why a guard blocked a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GuardBlockReason {
    /// A machine-readable code (`loop`, `budget`, `denied` by default).
    pub code: String,
    /// Free-text detail, absent when the record had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub detail: Option<String>,
}

/// A `guard_blocked` or `mail_denied` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GuardBlock {
    /// The sender (`""` when the record names none).
    pub from: String,
    /// The addressee, absent when the record has no string `to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub to: Option<String>,
    /// Why it was blocked.
    pub reason: GuardBlockReason,
    /// `at` of the record.
    pub at: i64,
}

/// An `escalated` record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Escalation {
    /// Who escalated (`""` when the record names no one).
    pub by: String,
    /// Why (`""` when the record has no string reason).
    pub reason: String,
    /// `at` of the record.
    pub at: i64,
}

/// How a projection showed a mail in a venue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ProjectionMode {
    /// The mail itself was shown (the default).
    Visible,
    /// Only a summary was shown.
    Summary,
}

/// A `venue_projected` record with a valid venue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    /// Where it was shown.
    pub venue: VenueRef,
    /// Who projected (`""` when unnamed).
    pub actor: String,
    /// The mail shown (`""` when unnamed).
    pub mail_id: String,
    /// How it was shown.
    pub mode: ProjectionMode,
    /// `at` of the record.
    pub at: i64,
}

/// Budget amounts, one per `BUDGET_KEYS` entry. JavaScript numbers: fractions are allowed, and
/// a sum beyond a double's range is written `null`, as JavaScript writes Infinity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct BudgetAmounts {
    /// Model invocations.
    #[serde(serialize_with = "serialize_js_number")]
    #[cfg_attr(feature = "openapi", schema(nullable = true))]
    pub model_calls: f64,
    /// Tokens.
    #[serde(serialize_with = "serialize_js_number")]
    #[cfg_attr(feature = "openapi", schema(nullable = true))]
    pub tokens: f64,
    /// Wall-clock milliseconds.
    #[serde(serialize_with = "serialize_js_number")]
    #[cfg_attr(feature = "openapi", schema(nullable = true))]
    pub wall_ms: f64,
    /// Side effects (writes, sends, …).
    #[serde(serialize_with = "serialize_js_number")]
    #[cfg_attr(feature = "openapi", schema(nullable = true))]
    pub side_effects: f64,
}

/// The budget keys in the reference's order, as they appear in payloads.
pub const BUDGET_KEYS: [&str; 4] = ["modelCalls", "tokens", "wallMs", "sideEffects"];

impl BudgetAmounts {
    /// The amount for `BUDGET_KEYS[index]`.
    pub(crate) fn slot_mut(&mut self, index: usize) -> &mut f64 {
        match index {
            0 => &mut self.model_calls,
            1 => &mut self.tokens,
            2 => &mut self.wall_ms,
            _ => &mut self.side_effects,
        }
    }

    /// The amounts as a JSON object keyed by `BUDGET_KEYS`, numbers written as JavaScript would.
    pub fn to_json_object(&self) -> JsonObject {
        let mut out = JsonObject::new();
        for (key, value) in BUDGET_KEYS.iter().zip([
            self.model_calls,
            self.tokens,
            self.wall_ms,
            self.side_effects,
        ]) {
            out.insert((*key).to_owned(), js_number_value(value));
        }
        out
    }
}

/// How a mail hop stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum HopStatus {
    /// Sent or admitted, not yet picked up.
    Sent,
    /// Delivered to (or picked up by) its addressee.
    Delivered,
    /// Answered or finished.
    Completed,
    /// Cancelled.
    Cancelled,
}

/// One mail in the collaboration graph, in first-seen order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EngagementHopSummary {
    /// The mail's id (never empty).
    pub mail_id: String,
    /// The mail's kind as first seen (`ask` by default; free text).
    pub kind: String,
    /// The sender as first seen (`""` when unnamed).
    pub from: String,
    /// The addressee as first seen (`""` when unnamed).
    pub to: String,
    /// The mail this one answers, absent when none (or empty) was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub causation_id: Option<String>,
    /// Where the hop stands.
    pub status: HopStatus,
}

/// What an engagement's events add up to: who took part, what they did, what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct EngagementSummary {
    /// The engagement summarized.
    pub engagement_id: String,
    /// Who opened it: the `initiator`/`principal` object verbatim, or
    /// `{kind: "human", id, trust: "group_member"}` for a principal string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object, nullable = false))]
    pub initiator: Option<JsonObject>,
    /// Where it was opened, absent when no opened record named a valid venue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub venue: Option<VenueRef>,
    /// `at` of the last `engagement_opened`, else of the first record, else 0.
    pub started_at: i64,
    /// `at` of the last `engagement_closed`, absent while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub ended_at: Option<i64>,
    /// Where it stands.
    pub status: EngagementStatus,
    /// The close reason, else the last escalation's reason; absent when neither exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub reason: Option<String>,
    /// Agent actors in first-appearance order (humans and systems excluded).
    pub actors: Vec<String>,
    /// Distinct mail ids sent or admitted, plus mails without an id.
    pub mail_count: u64,
    /// `tool_called` records.
    pub tool_call_count: u64,
    /// The blackboard as the records leave it.
    pub board_entries: Vec<BoardEntry>,
    /// Guard blocks and denied mails, in record order.
    pub guard_blocks: Vec<GuardBlock>,
    /// Escalations, in record order.
    pub escalations: Vec<Escalation>,
    /// Projections to venues, in record order.
    pub projections: Vec<Projection>,
    /// Budget consumed: positive charges summed, raised to the close record's totals.
    pub consumed: BudgetAmounts,
    /// Mail hops in first-seen order.
    pub hops: Vec<EngagementHopSummary>,
}

/// Serialize an `f64` as `JSON.stringify` writes it: integral values below 2^53 as integers,
/// others in JavaScript's own text (`0.000001`, not serde's `1e-6`; `10000000000000000`, not
/// `1e16`), which a JSON serializer takes verbatim; a non-finite value (a sum that overflowed)
/// as `null`, as in JavaScript.
pub fn serialize_js_number<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if let Some(integer) = crate::json_number::exact_integer(*value) {
        return serializer.serialize_i64(integer);
    }
    if !value.is_finite() {
        return serializer.serialize_none();
    }
    let text = crate::json_number::js_double_text(*value);
    serde_json::value::RawValue::from_string(text)
        .map_err(serde::ser::Error::custom)?
        .serialize(serializer)
}

/// An `f64` as the JSON value closest to what `JSON.stringify` would write. A `Value` number
/// is an `i64`, a `u64` or a double that serde writes in its own shortest form, so an integral
/// value whose JavaScript text is a whole number within 64 bits (up to about 1.8e19) is that
/// integer, written as JavaScript writes it (`100000000000000000` for 1e17, the shortest digits
/// padded with zeros for 2^60); a fraction is the same double in serde's text (`1e-6` where
/// JavaScript writes `0.000001`), which any JSON reader takes as the same number.
pub fn js_number_value(value: f64) -> Value {
    if let Some(integer) = crate::json_number::exact_integer(value) {
        return Value::from(integer);
    }
    if !value.is_finite() {
        return Value::Null;
    }
    if value.fract() == 0.0 {
        let text = crate::json_number::js_double_text(value);
        if let Ok(integer) = text.parse::<i64>() {
            return Value::from(integer);
        }
        if let Ok(integer) = text.parse::<u64>() {
            return Value::from(integer);
        }
    }
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn js_numbers_drop_the_fraction_only_when_integral() {
        assert_eq!(js_number_value(2.0), json!(2));
        assert_eq!(js_number_value(-0.0), json!(0));
        assert_eq!(js_number_value(135.5), json!(135.5));
        assert_eq!(js_number_value(f64::INFINITY), Value::Null);
        let amounts = BudgetAmounts {
            model_calls: 1.0,
            tokens: 0.25,
            wall_ms: 0.0,
            side_effects: 3.0,
        };
        assert_eq!(
            serde_json::to_string(&amounts).ok().as_deref(),
            Some(r#"{"modelCalls":1,"tokens":0.25,"wallMs":0,"sideEffects":3}"#)
        );
    }

    /// The texts are what node 20 prints for `JSON.stringify({n})`.
    #[test]
    fn summary_numbers_are_written_in_javascripts_text() {
        let cases: [(f64, &str); 9] = [
            (0.000001, "0.000001"),
            (0.0000015, "0.0000015"),
            (1.5e-7, "1.5e-7"),
            (1e16, "10000000000000000"),
            (1e17, "100000000000000000"),
            (1_152_921_504_606_846_976.0, "1152921504606847000"),
            (1e20, "100000000000000000000"),
            (1e21, "1e+21"),
            (-2.5e-7, "-2.5e-7"),
        ];
        for (value, javascript) in cases {
            let amounts = BudgetAmounts {
                tokens: value,
                ..BudgetAmounts::default()
            };
            let expected =
                format!(r#"{{"modelCalls":0,"tokens":{javascript},"wallMs":0,"sideEffects":0}}"#);
            assert_eq!(
                serde_json::to_string(&amounts).ok(),
                Some(expected),
                "{value:e}"
            );
        }
        let overflowed = BudgetAmounts {
            wall_ms: f64::INFINITY,
            ..BudgetAmounts::default()
        };
        assert_eq!(
            serde_json::to_value(overflowed).ok(),
            Some(json!({"modelCalls": 0, "tokens": 0, "wallMs": null, "sideEffects": 0}))
        );
        // A `Value` holds integral ones as JavaScript writes them, as far as 64 bits reach.
        assert_eq!(js_number_value(1e17).to_string(), "100000000000000000");
        assert_eq!(
            js_number_value(1_152_921_504_606_846_976.0).to_string(),
            "1152921504606847000"
        );
        assert_eq!(js_number_value(-1e18).to_string(), "-1000000000000000000");
        assert_eq!(js_number_value(1e-6).as_f64(), Some(1e-6));
    }

    #[test]
    fn absent_optionals_are_omitted_not_null() {
        let entry = BoardEntry {
            key: "k".into(),
            kind: BoardEntryKind::Note,
            content: String::new(),
            author: String::new(),
            updated_at: 5,
            version: 1.0,
            status: None,
        };
        assert_eq!(
            serde_json::to_value(&entry).ok(),
            Some(
                json!({"key": "k", "kind": "note", "content": "", "author": "", "updatedAt": 5, "version": 1})
            )
        );
        let hop = EngagementHopSummary {
            mail_id: "m".into(),
            kind: "ask".into(),
            from: "a".into(),
            to: "b".into(),
            causation_id: None,
            status: HopStatus::Delivered,
        };
        assert_eq!(
            serde_json::to_value(&hop).ok(),
            Some(
                json!({"mailId": "m", "kind": "ask", "from": "a", "to": "b", "status": "delivered"})
            )
        );
    }
}
