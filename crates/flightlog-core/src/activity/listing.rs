//! Listing runs, newest first: the "what ran, what is running" page of the API and the UI.
//!
//! A run is listed from its root span while the root exists (open or ended, with its rollup's
//! totals when it has been rolled up), and from its rollup row alone once `prune` removed its
//! detail. A run with spans but no root stored yet (every span names a parent that is not
//! stored: an OpenTelemetry trace whose root has not ended, since SDKs export a span when it
//! ends, or whose root lives in a caller exporting elsewhere) is listed too, marked
//! [`RunListEntry::awaiting_root`], from its earliest span. Pages are keyed by `(started_at, run_id)`, both descending, so a cursor stays valid
//! while new runs start (they sort before it) and never skips or repeats a run that keeps its
//! place. A run's place is its first root's start, or its earliest span's while it waits for a
//! root: an imported root that started earlier moves it back (OpenTelemetry's roots arrive
//! last), so a client paging while traces come in should drop a run id it has already seen.

use serde::{Deserialize, Serialize};

use super::types::{SpanOrigin, SpanOutcome};

/// Whether any of the run's roots is still open (a run whose root has not arrived is open: its
/// end is not recorded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Open,
    Ended,
}

impl RunState {
    /// Parse the query-string form (`open`, `ended`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "open" => Some(Self::Open),
            "ended" => Some(Self::Ended),
            _ => None,
        }
    }
}

/// The position after which a page continues: the last listed run's start and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCursor {
    pub started_at: i64,
    pub run_id: String,
}

impl RunCursor {
    /// The wire form, `<startedAt>:<runId>` (a run id may itself contain `:`).
    pub fn encode(&self) -> String {
        format!("{}:{}", self.started_at, self.run_id)
    }

    /// Parse the wire form; `None` when it is not `<integer>:<run id>`.
    pub fn decode(text: &str) -> Option<Self> {
        let (started_at, run_id) = text.split_once(':')?;
        Some(Self {
            started_at: started_at.parse().ok()?,
            run_id: run_id.to_owned(),
        })
    }
}

/// Which runs to list.
#[derive(Debug, Clone, PartialEq)]
pub struct RunListQuery {
    pub state: Option<RunState>,
    /// Only runs whose first root ended with this outcome (such a run is still open while a
    /// later root is).
    pub outcome: Option<SpanOutcome>,
    pub origin: Option<SpanOrigin>,
    /// Most runs returned.
    pub limit: i64,
    /// Continue after this run (exclusive).
    pub before: Option<RunCursor>,
}

/// One listed run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunListEntry {
    pub run_id: String,
    pub state: RunState,
    pub name: String,
    pub origin: SpanOrigin,
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
    /// The root's last heartbeat (`None` once pruned).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub last_heartbeat_at: Option<i64>,
    /// Totals come from the run's rollup row (else from the root span as it is now).
    pub rolled_up: bool,
    /// Retention pruned the run's detail (spans, events, changes): all of it for a run listed
    /// from its rollup alone; for a run written to again after the prune, the detail before
    /// that write (its rollup row says `detailPruned` too, and the next rollup counts only the
    /// detail that is left, as the reference's does).
    pub detail_pruned: bool,
    /// The run has spans but no root: every span names a parent that is not stored (an
    /// OpenTelemetry SDK exports a span when it ends, so a trace's root usually arrives last,
    /// or never when the caller that started the trace exports elsewhere). Such a run is named
    /// and started by its earliest span and listed `open`, with no end or outcome, its usage
    /// the sum over its `model` spans; or `ended` with its rollup's figures once a writer closed
    /// and rolled it up (cascade close, a sweep) and none of its spans is open. Once a root
    /// arrives it is listed from the root.
    pub awaiting_root: bool,
    /// Present (`true`) only on a live entry (not rolled up) whose usage was not read: a page
    /// reads at most 100,000 spans to give its live runs the usage their rollup would have now,
    /// in page order, and this run's did not fit, so its usage fields are its root's own (null
    /// where the root has none). A page with a smaller `limit` starting at it reads them, unless
    /// the run alone holds more than 100,000 spans; its rollup (`POST
    /// /v1/activity/runs/{runId}/rollup` once it ends) has them always.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub live_usage_skipped: bool,
}

/// One page of runs and the cursor of the next (`None`: this was the last page; a page asked
/// with `limit` 0 holds no run and has no next either, whatever runs there are).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunPage {
    pub runs: Vec<RunListEntry>,
    /// The cursor of the next page, `<startedAt>:<runId>` with the run id as written (null: no
    /// run follows this page; always null for `limit` 0, which asks for none): send it
    /// back as `before`, URL-encoded like any query value (a run id may hold `+`, `&`, `#` or
    /// `%`, which a URL read raw would change).
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub next: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_run_ids_with_colons_and_negative_times() {
        let cursor = RunCursor {
            started_at: -5,
            run_id: "a:b:c".into(),
        };
        assert_eq!(cursor.encode(), "-5:a:b:c");
        assert_eq!(RunCursor::decode(&cursor.encode()), Some(cursor));
        assert_eq!(RunCursor::decode("x:run"), None);
        assert_eq!(RunCursor::decode("12"), None);
    }
}
