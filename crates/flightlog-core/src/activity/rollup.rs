//! The run rollup rule: what a run's summary row says, computed from its spans.
//!
//! Aggregation scope is the ROOT span only: result-level accounting on the root already includes
//! subagent consumption, so summing the tree would double-count every fan-out. The failure reason
//! is the first error/timeout reason in start order, else `interrupted` for an interrupted root.

use super::types::{SpanOrigin, SpanOutcome, SpanRow, SpanUsage};

/// What the rollup rule needs to know about one span (a backend can read just these columns).
#[derive(Debug, Clone, PartialEq)]
pub struct RollupSpan {
    pub is_root: bool,
    pub origin: SpanOrigin,
    pub name: String,
    pub session_id: Option<String>,
    pub job_name: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub outcome: Option<SpanOutcome>,
    pub outcome_reason: Option<String>,
    pub usage: SpanUsage,
}

impl From<&SpanRow> for RollupSpan {
    fn from(span: &SpanRow) -> Self {
        Self {
            is_root: span.is_root(),
            origin: span.origin.clone(),
            name: span.name.clone(),
            session_id: span.session_id.clone(),
            job_name: span.job_name.clone(),
            started_at: span.started_at,
            ended_at: span.ended_at,
            outcome: span.outcome.clone(),
            outcome_reason: span.outcome_reason.clone(),
            usage: span.usage.clone(),
        }
    }
}

/// The columns a rollup upsert writes, before the backend merges them with an existing row.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupFields {
    pub origin: SpanOrigin,
    pub name: String,
    pub session_id: Option<String>,
    pub job_name: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub outcome: Option<SpanOutcome>,
    pub duration_ms: Option<i64>,
    pub span_count: i64,
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cache_read_tokens: Option<i64>,
    pub cache_creation_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
    pub failure_reason: Option<String>,
}

/// Roll up a run from its spans, which must be in `started_at` order. `None` for no spans.
pub fn compute_rollup(spans_by_start: &[RollupSpan]) -> Option<RollupFields> {
    let root = spans_by_start
        .iter()
        .find(|span| span.is_root)
        .or_else(|| spans_by_start.first())?;
    let failure_reason = spans_by_start
        .iter()
        .find(|span| {
            matches!(
                span.outcome,
                Some(SpanOutcome::Error) | Some(SpanOutcome::Timeout)
            ) && span.outcome_reason.is_some()
        })
        .and_then(|span| span.outcome_reason.clone())
        .or_else(|| {
            (root.outcome == Some(SpanOutcome::Interrupted)).then(|| "interrupted".to_owned())
        });
    Some(RollupFields {
        origin: root.origin.clone(),
        name: root.name.clone(),
        session_id: root.session_id.clone(),
        job_name: root.job_name.clone(),
        started_at: root.started_at,
        ended_at: root.ended_at,
        outcome: root.outcome.clone(),
        duration_ms: root.ended_at.map(|ended| ended - root.started_at),
        span_count: i64::try_from(spans_by_start.len()).unwrap_or(i64::MAX),
        input_tokens: root.usage.input_tokens,
        output_tokens: root.usage.output_tokens,
        cache_read_tokens: root.usage.cache_read_tokens,
        cache_creation_tokens: root.usage.cache_creation_tokens,
        cost_usd: root.usage.cost_usd,
        failure_reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::types::{JsonObject, SpanKind};

    fn span(id: &str, parent: Option<&str>, started_at: i64) -> RollupSpan {
        RollupSpan::from(&SpanRow {
            span_id: id.into(),
            run_id: "r".into(),
            parent_span_id: parent.map(str::to_owned),
            name: id.into(),
            kind: SpanKind::Tool,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: JsonObject::new(),
            started_at,
            wait_until: None,
            ended_at: None,
            outcome: None,
            outcome_reason: None,
            usage: SpanUsage::default(),
            writer: "w".into(),
            last_heartbeat_at: None,
        })
    }

    #[test]
    fn usage_comes_from_the_root_only() {
        let mut root = span("root", None, 1);
        root.usage.input_tokens = Some(10);
        root.ended_at = Some(11);
        let mut child = span("child", Some("root"), 2);
        child.usage.input_tokens = Some(99);
        let fields = compute_rollup(&[root, child]);
        assert_eq!(fields.as_ref().and_then(|f| f.input_tokens), Some(10));
        assert_eq!(fields.as_ref().and_then(|f| f.duration_ms), Some(10));
        assert_eq!(fields.map(|f| f.span_count), Some(2));
    }

    #[test]
    fn failure_reason_prefers_first_error_reason_then_interrupted_root() {
        let mut root = span("root", None, 1);
        root.outcome = Some(SpanOutcome::Interrupted);
        let mut failed = span("t", Some("root"), 2);
        failed.outcome = Some(SpanOutcome::Timeout);
        failed.outcome_reason = Some("slow".into());
        let with_error = compute_rollup(&[root.clone(), failed]);
        assert_eq!(
            with_error.and_then(|f| f.failure_reason).as_deref(),
            Some("slow")
        );
        let only_root = compute_rollup(&[root]);
        assert_eq!(
            only_root.and_then(|f| f.failure_reason).as_deref(),
            Some("interrupted")
        );
    }

    #[test]
    fn no_root_falls_back_to_first_span_and_no_spans_to_none() {
        let fields = compute_rollup(&[span("a", Some(""), 5), span("b", Some("a"), 6)]);
        assert_eq!(fields.map(|f| f.name), Some("a".to_owned()));
        assert_eq!(compute_rollup(&[]), None);
    }
}
