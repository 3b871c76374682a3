//! The activity records and call inputs, shaped and named as the reference's JSON.
//!
//! Field names serialize in camelCase exactly as the reference TypeScript does; absent optional
//! fields of `usage` are omitted, nullable columns are `null`. Enumerations read back from a
//! database keep unknown values (written by a newer flightlog) instead of failing the read.
//!
//! With the `openapi` feature every type the HTTP API sends or takes also implements
//! `utoipa::ToSchema`, so the server's OpenAPI document is derived from these definitions; the
//! open enums implement it by hand (a string enum of their known values), raw payloads are any
//! JSON value and `attrs` any JSON object.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A JSON object, key order preserved (attrs).
pub type JsonObject = Map<String, Value>;

macro_rules! open_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
            /// A value this version does not know (written by a newer flightlog); kept verbatim.
            Unrecognized(String),
        }

        impl $name {
            /// Every value this version knows, in declaration order.
            pub const KNOWN: &'static [&'static str] = &[$($text),+];

            /// The wire and database spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $(Self::$variant => $text,)+
                    Self::Unrecognized(other) => other,
                }
            }

            /// Parse a stored value; unknown spellings become [`Self::Unrecognized`].
            pub fn from_stored(text: &str) -> Self {
                match text {
                    $($text => Self::$variant,)+
                    other => Self::Unrecognized(other.to_owned()),
                }
            }

            /// Parse caller input: only known spellings are accepted.
            pub fn parse_known(text: &str) -> Option<Self> {
                match text {
                    $($text => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        /// A string with one of the known values. Responses may carry a value a newer flightlog
        /// wrote (read back as `Unrecognized`), so clients should keep unknown ones as text.
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .enum_values(Some(Self::KNOWN.iter().copied()))
                    .description(Some(concat!(
                        "One of the ",
                        stringify!($name),
                        " values this version knows. A request must use one of them; a response \
                         may carry a value written by a newer flightlog, which clients should keep \
                         as text."
                    )))
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                Self::parse_known(&text).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "unknown {} {:?}, expected one of {:?}",
                        stringify!($name),
                        text,
                        Self::KNOWN
                    ))
                })
            }
        }
    };
}

open_enum!(
    /// What unit of agent work a span is.
    SpanKind {
        /// One agent turn (the usual root).
        Turn => "turn",
        /// One tool call.
        Tool => "tool",
        /// A subagent run.
        Subagent => "subagent",
        /// A scheduled job.
        Cron => "cron",
        /// One call to a language model.
        Model => "model",
        /// Anything else (e.g. an OTLP span that maps to no agent concept).
        Other => "other",
    }
);

open_enum!(
    /// Which kind of writer produced a span.
    SpanOrigin {
        /// Written by the serving process for an interactive session.
        Session => "session",
        /// Written by a scheduled-job wrapper.
        Cron => "cron",
        /// Ingested over OpenTelemetry.
        Otlp => "otlp",
    }
);

open_enum!(
    /// The write-once terminal outcome of a span.
    SpanOutcome {
        /// Finished normally.
        Success => "success",
        /// Failed.
        Error => "error",
        /// Ran out of time.
        Timeout => "timeout",
        /// Cancelled by a caller.
        Cancelled => "cancelled",
        /// Refused by policy.
        Denied => "denied",
        /// Its writer died or restarted before it ended.
        Interrupted => "interrupted",
    }
);

/// The bound of a cost a span may report, in USD (exclusive): far above any real call, and low
/// enough that a run's sum of them stays a finite number (a sum of two costs near `f64::MAX`
/// was infinite, which JSON cannot carry: it read as `null`).
pub const MAX_COST_USD: f64 = 1e15;

/// The bound of a token count a span may report (exclusive): 2^53, above which a JavaScript
/// reader rounds it.
pub const MAX_TOKEN_COUNT: i64 = 1 << 53;

/// Token usage as spans carry it (OpenTelemetry GenAI semantics). Absent fields are omitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpanUsage {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(nullable = false, minimum = 0, maximum = 9_007_199_254_740_991_i64)
    )]
    pub input_tokens: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(nullable = false, minimum = 0, maximum = 9_007_199_254_740_991_i64)
    )]
    pub output_tokens: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(nullable = false, minimum = 0, maximum = 9_007_199_254_740_991_i64)
    )]
    pub cache_read_tokens: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(
        feature = "openapi",
        schema(nullable = false, minimum = 0, maximum = 9_007_199_254_740_991_i64)
    )]
    pub cache_creation_tokens: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::json_number::optional_js_whole_double"
    )]
    #[cfg_attr(feature = "openapi", schema(nullable = false, minimum = 0))]
    pub cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub model: Option<String>,
}

impl SpanUsage {
    /// Whether every token count and the cost are present: a rollup then takes nothing from
    /// the run's model spans, and a listing nothing from its rollup rule.
    pub fn carries_every_figure(&self) -> bool {
        self.input_tokens.is_some()
            && self.output_tokens.is_some()
            && self.cache_read_tokens.is_some()
            && self.cache_creation_tokens.is_some()
            && self.cost_usd.is_some()
    }
}

/// Token usage as writes may send it: the fields of `SpanUsage`, each of which may also be
/// `null`, read as absent. (Served spans never carry `null` there: an absent field is omitted.)
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)] // never built: it only describes what writes accept
pub(crate) struct SpanUsageInput {
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    input_tokens: Option<i64>,
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    output_tokens: Option<i64>,
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    cache_read_tokens: Option<i64>,
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    cache_creation_tokens: Option<i64>,
    /// USD, below 10^15.
    #[schema(minimum = 0, exclusive_maximum = 1e15)]
    cost_usd: Option<f64>,
    model: Option<String>,
}

/// One span as stored: the unit of agent work.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SpanRow {
    pub span_id: String,
    pub run_id: String,
    /// `None` for a root. An empty string is stored as given and is *not* a root.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub origin: SpanOrigin,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub session_id: Option<String>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub job_name: Option<String>,
    /// The stored attributes (`{}` when none were given).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub attrs: JsonObject,
    pub started_at: i64,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub wait_until: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub ended_at: Option<i64>,
    /// `None` while the span is open; set once, never changed.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub outcome: Option<SpanOutcome>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub outcome_reason: Option<String>,
    pub usage: SpanUsage,
    /// The identity of the store instance that started the span.
    pub writer: String,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub last_heartbeat_at: Option<i64>,
}

impl SpanRow {
    /// A root is a span whose parent is absent (an empty-string parent is not a root).
    pub fn is_root(&self) -> bool {
        self.parent_span_id.is_none()
    }

    /// True once the span has its terminal outcome.
    pub fn is_terminal(&self) -> bool {
        self.outcome.is_some()
    }
}

/// One event attached to a span. The payload is kept as compact JSON text, written as the
/// reference's `JSON.stringify` writes it (a number with a fraction or an exponent in
/// JavaScript's shortest form, `1.0` as `1`; integers with every digit; array-index keys
/// first), and is otherwise never interpreted.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SpanEventRow {
    pub span_id: String,
    pub event_index: i64,
    pub ts: i64,
    pub event_type: String,
    /// The stored payload (`null` when none was given); a string with the truncation marker when
    /// the original's JSON text exceeded 16,384 bytes.
    // (`crate::activity::MAX_EVENT_PAYLOAD_BYTES`; this comment is the OpenAPI description.)
    #[cfg_attr(feature = "openapi", schema(value_type = Value))]
    pub payload: Box<RawValue>,
    pub truncated: bool,
}

impl PartialEq for SpanEventRow {
    fn eq(&self, other: &Self) -> bool {
        self.span_id == other.span_id
            && self.event_index == other.event_index
            && self.ts == other.ts
            && self.event_type == other.event_type
            && self.payload.get() == other.payload.get()
            && self.truncated == other.truncated
    }
}

/// What a change row points at.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ChangeBody {
    /// A span was started, patched or ended; the span as it is at read time.
    Span { span: Box<SpanRow> },
    /// An event was appended.
    Event { event: SpanEventRow },
}

/// One committed write as the delta stream sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ActivityChange {
    /// The global cursor: unique and increasing across all runs.
    pub change_id: i64,
    pub run_id: String,
    /// Per-run order of delta-visible writes, from 1.
    pub seq: i64,
    #[serde(flatten)]
    pub body: ChangeBody,
}

/// A terminal root span and the highest change id it appears under.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct TerminalRootChange {
    pub change_id: i64,
    pub span: SpanRow,
}

/// One consistent picture of a run: everything read in the same transaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunSnapshot {
    pub run_id: String,
    /// Spans by `started_at`.
    pub spans: Vec<SpanRow>,
    /// Events of all the run's spans by `(ts, event_index)`.
    pub events: Vec<SpanEventRow>,
    /// The run's high-water seq at the moment of the read: discard deltas at or below it.
    pub high_water_seq: i64,
    /// The global cursor at the same moment, to pin a poller baseline.
    pub change_cursor: i64,
}

/// The rollup of one run: usage and outcome totals that survive pruning.
///
/// As the reference's upsert, a run rolled up again keeps the identity of its first rollup
/// (`origin`, `name`, `sessionId`, `jobName`, `startedAt`; an OpenTelemetry delivery refreshes
/// them) and takes the new end, outcome and totals; the run list names a run from its current
/// first root.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunRollupRow {
    pub run_id: String,
    pub origin: SpanOrigin,
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub session_id: Option<String>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub job_name: Option<String>,
    pub started_at: i64,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub ended_at: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub outcome: Option<SpanOutcome>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub duration_ms: Option<i64>,
    pub span_count: i64,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub input_tokens: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub output_tokens: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub cache_read_tokens: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub cache_creation_tokens: Option<i64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    #[serde(serialize_with = "crate::json_number::optional_js_whole_double")]
    pub cost_usd: Option<f64>,
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub failure_reason: Option<String>,
    /// Retention pruned the run's detail (spans, events, changes): all of it, unless the run
    /// was written to again after the prune (then the detail before that write; the totals of a
    /// later rollup count only the detail left, as the reference's do).
    pub detail_pruned: bool,
}

/// Input of `start_span`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartSpanInput {
    /// Client-chosen, 1 to 256 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub span_id: String,
    /// Client-chosen, 1 to 256 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub run_id: String,
    /// The parent's span id, at most 256 bytes; null or absent for a root. An empty string is
    /// stored as given (the reference's behaviour): such a span is no root to the root-only
    /// reads (open roots, stuck runs, stale sweeps), so send null for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub parent_span_id: Option<String>,
    pub name: String,
    pub kind: SpanKind,
    pub origin: SpanOrigin,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_as_written::optional_object"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub attrs: Option<JsonObject>,
    /// Defaults to the store's clock.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64))]
    pub started_at: Option<i64>,
}

/// Input of `end_span`: the terminal write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndSpanInput {
    pub outcome: SpanOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Defaults to the store's clock.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64))]
    pub ended_at: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "object_or_null"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<SpanUsageInput>))]
    pub usage: Option<SpanUsage>,
    /// Merged shallowly over the stored attrs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_as_written::optional_object"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub attrs: Option<JsonObject>,
}

/// Input of `patch_span`: non-terminal field updates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpanPatch {
    /// Merged shallowly over the stored attrs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_as_written::optional_object"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub attrs: Option<JsonObject>,
    /// Each present field replaces the stored one; absent fields keep theirs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "object_or_null"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<SpanUsageInput>))]
    pub usage: Option<SpanUsage>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64))]
    pub wait_until: Option<i64>,
}

/// An optional nested struct read only from a JSON object (or `null`). A derived `Deserialize`
/// also reads a struct from an array of its fields in declaration order, which a JSON API must
/// not: `"usage": [10, 20]` is a wrong type, not two token counts.
fn object_or_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ObjectOrNull<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectOrNull<T> {
        type Value = Option<T>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("a JSON object or null")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(
            self,
            deserializer: D2,
        ) -> Result<Option<T>, D2::Error> {
            deserializer.deserialize_map(self)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }

    deserializer.deserialize_option(ObjectOrNull(std::marker::PhantomData))
}

/// Options of `prune`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PruneOptions {
    /// Runs that ended before this absolute epoch-ms time are covered by a digest and prunable.
    #[serde(deserialize_with = "crate::json_number::integral_i64")]
    #[cfg_attr(feature = "openapi", schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64))]
    pub digest_floor_at: i64,
    /// Runs that ended more than this long before `now` are pruned regardless of the digest
    /// floor, and marked with the `digest coverage gap` failure reason when the floor had not
    /// covered them. Also a run of OTLP spans alone whose root never arrived, once none of its
    /// spans is open and its newest is this old (its digest says `root never arrived`).
    #[serde(deserialize_with = "crate::json_number::integral_i64")]
    #[cfg_attr(feature = "openapi", schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64))]
    pub hard_ceiling_ms: i64,
    /// Defaults to the store's clock.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64))]
    pub now: Option<i64>,
    /// Most runs pruned per call (default 50): pruning is batched so writers are not starved.
    /// Zero prunes nothing. Over HTTP an integer from 0 to 10,000; the store itself also takes
    /// a negative value, meaning no limit (the reference's SQL `LIMIT`).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 10_000))]
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::json_number::optional_integral_i64"
    )]
    pub batch: Option<i64>,
    /// Beyond the reference, and not on the wire: the most spans one call deletes, as the
    /// runs' rollups count them (the first run is always taken, however big). A scheduled
    /// prune bounds its transactions with it: 50 runs may be 500 spans or 50 million. `None`:
    /// no bound.
    #[serde(skip)]
    pub max_spans: Option<i64>,
    /// Beyond the reference, and not on the wire: the scheduled retention's prune, which also
    /// takes what the reference's rule never would, so that detail never stays for good:
    /// - runs written to (and rolled up) again after their prune: their rollup keeps saying
    ///   `detailPruned` (as the reference's does), and the rule takes only runs not pruned
    ///   before;
    /// - ended runs nobody rolled up (the rule takes runs through their rollup only): once none
    ///   of their spans is open and the newest ended before the hard ceiling, they are rolled up
    ///   (the reference's rollup) and so pruned like any other.
    ///
    /// And it takes a run only once no span of it started or ended since the floor and the
    /// ceiling (a rollup's end is its first root's: a session's latest turn went minutes after
    /// it ended), rolling it up again just before its detail goes (a turn ended after the
    /// writer's last rollup is counted). The endpoint keeps the reference's rule and counts.
    #[serde(skip)]
    pub scheduled: bool,
}

/// What one `prune` call removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PruneResult {
    pub runs_pruned: i64,
    pub spans_deleted: i64,
    /// Change-log rows the call trimmed (rows far behind the newest; not those of the runs it
    /// pruned). Not in the reference's answer, nor on the wire: the scheduled maintenance goes
    /// on while a call still trims, so the log is held to its bound even when no run is left
    /// to prune.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub changes_trimmed: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_an_object_or_null_and_never_from_an_array() {
        let patch: SpanPatch =
            serde_json::from_str(r#"{"usage": {"inputTokens": 10}}"#).expect("an object");
        assert_eq!(patch.usage.and_then(|usage| usage.input_tokens), Some(10));
        for text in [r#"{"usage": null}"#, "{}"] {
            let patch: SpanPatch = serde_json::from_str(text).expect("null or absent");
            assert_eq!(patch.usage, None, "{text}");
        }
        for text in [
            r#"{"usage": [10, 20]}"#,
            r#"{"usage": "x"}"#,
            r#"{"usage": {"tokens": 1}}"#,
        ] {
            assert!(serde_json::from_str::<SpanPatch>(text).is_err(), "{text}");
        }
        // The same through a `Value` (how a batch op's fields are read when they fail fast).
        let end = serde_json::json!({"outcome": "success", "usage": [10]});
        assert!(serde_json::from_value::<EndSpanInput>(end).is_err());
        let end = serde_json::json!({"outcome": "success", "usage": {"outputTokens": 3}});
        let end: EndSpanInput = serde_json::from_value(end).expect("an object");
        assert_eq!(end.usage.and_then(|usage| usage.output_tokens), Some(3));
    }

    #[test]
    fn unknown_stored_kind_is_kept_not_rejected() {
        let kind = SpanKind::from_stored("workflow");
        assert_eq!(kind, SpanKind::Unrecognized("workflow".into()));
        assert_eq!(kind.as_str(), "workflow");
        assert_eq!(SpanKind::from_stored("model"), SpanKind::Model);
    }

    #[test]
    fn unknown_input_kind_is_rejected_with_the_known_list() {
        let err = serde_json::from_str::<SpanKind>("\"workflow\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("turn"), "{err}");
    }

    #[test]
    fn usage_omits_absent_fields() {
        let usage = SpanUsage {
            input_tokens: Some(3),
            ..SpanUsage::default()
        };
        assert_eq!(
            serde_json::to_value(&usage).ok(),
            Some(serde_json::json!({"inputTokens": 3}))
        );
    }
}
