//! The compaction plan: which events of a finished engagement survive, how they are renumbered,
//! and how the close record is rewritten to keep the totals of what was dropped.
//!
//! A plain function over plain data so every backend compacts identically: the in-memory journal
//! applies the plan to its vector, a database backend turns it into deletes and rewrites inside
//! one transaction.

use std::sync::Arc;

use serde_json::Value;

use super::record::JournalRecord;
use super::store::JournalError;
use super::summary::summarize_engagement_events;
use super::types::{EngagementEvent, JsonObject, BUDGET_KEYS};

/// An engagement is compacted only when it holds more events than this.
pub const COMPACTION_MIN_EVENTS: usize = 20;

/// Event types compaction drops: bookkeeping whose effect the close record's `consumed` keeps.
pub const COMPACTABLE_EVENT_TYPES: [&str; 4] = [
    "budget_charged",
    "budget_granted",
    "mail_delivered",
    "turn_started",
];

/// Event types that keep an engagement from being compacted at all (its history is evidence).
pub const COMPACTION_BLOCKING_EVENT_TYPES: [&str; 3] =
    ["guard_blocked", "mail_denied", "escalated"];

/// What compacting an engagement does. Indexes refer to the event slice the plan was made from
/// (equal to the events' `seq` there).
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPlan {
    /// Indexes of the surviving events, ascending; survivor `i` gets `seq = i`.
    pub kept: Vec<usize>,
    /// Index of the last `engagement_closed` event (always kept).
    pub closed_index: usize,
    /// The close event's new data: its old data with `status: "completed"` and `consumed` set to
    /// the summary's totals over all events (existing keys keep their position).
    pub closed_data: JsonObject,
}

impl CompactionPlan {
    /// The compacted list, taking the old events by value (no copies of the survivors' data).
    pub fn apply(self, events: Vec<EngagementEvent>) -> Vec<EngagementEvent> {
        let mut kept = self.kept.iter().copied().peekable();
        let mut closed_data = Some(self.closed_data);
        let mut out = Vec::with_capacity(self.kept.len());
        for (index, mut event) in events.into_iter().enumerate() {
            if kept.peek() != Some(&index) {
                continue;
            }
            kept.next();
            if index == self.closed_index {
                if let Some(data) = closed_data.take() {
                    event.data = Arc::new(data);
                }
            }
            event.seq = out.len() as i64;
            out.push(event);
        }
        out
    }

    /// The compacted list built from borrowed events (the survivors' data is shared, not copied).
    pub fn compacted_events(&self, events: &[EngagementEvent]) -> Vec<EngagementEvent> {
        self.kept
            .iter()
            .enumerate()
            .filter_map(|(seq, &index)| {
                let event = events.get(index)?;
                Some(EngagementEvent {
                    engagement_id: event.engagement_id.clone(),
                    seq: seq as i64,
                    at: event.at,
                    event_type: event.event_type.clone(),
                    data: if index == self.closed_index {
                        Arc::new(self.closed_data.clone())
                    } else {
                        Arc::clone(&event.data)
                    },
                })
            })
            .collect()
    }
}

/// The compaction plan for an engagement's events (in seq order), or `None` when the reference
/// leaves the engagement alone: at most [`COMPACTION_MIN_EVENTS`] events; any guard block, denied
/// mail or escalation; no `engagement_closed`; the last close's `data.status` present (even
/// `null`) and not `"completed"`; or nothing to drop.
///
/// [`JournalError::NotFinite`] when the closing record's `consumed` would hold a total that is
/// not a finite number (amounts summed past `f64::MAX`): the reference's copy step throws a
/// `TypeError` for it, so nothing is compacted, rather than the total being written as `null`.
pub fn plan_compaction(events: &[EngagementEvent]) -> Result<Option<CompactionPlan>, JournalError> {
    match plan(events) {
        Some(Err(path)) => Err(JournalError::NotFinite { path }),
        Some(Ok(plan)) => Ok(Some(plan)),
        None => Ok(None),
    }
}

fn plan(events: &[EngagementEvent]) -> Option<Result<CompactionPlan, String>> {
    if events.len() <= COMPACTION_MIN_EVENTS {
        return None;
    }
    let mut closed_index = None;
    for (index, event) in events.iter().enumerate() {
        let kind = event.record_type();
        if COMPACTION_BLOCKING_EVENT_TYPES.contains(&kind) {
            return None;
        }
        if kind == "engagement_closed" {
            closed_index = Some(index);
        }
    }
    let closed_index = closed_index?;
    let closed = &events[closed_index];
    if closed
        .data
        .get("status")
        .is_some_and(|status| status != "completed")
    {
        return None;
    }
    let kept: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, event)| !COMPACTABLE_EVENT_TYPES.contains(&event.record_type()))
        .map(|(index, _)| index)
        .collect();
    if kept.len() == events.len() {
        return None;
    }
    let consumed = summarize_engagement_events(&closed.engagement_id, events).consumed;
    // The reference copies the close's data, then `status`, then `consumed`, key by key.
    let amounts = [
        consumed.model_calls,
        consumed.tokens,
        consumed.wall_ms,
        consumed.side_effects,
    ];
    if let Some((key, _)) = BUDGET_KEYS
        .iter()
        .zip(amounts)
        .find(|(_, amount)| !amount.is_finite())
    {
        return Some(Err(format!("data.consumed.{key}")));
    }
    let mut closed_data = JsonObject::clone(&closed.data);
    closed_data.insert("status".to_owned(), Value::from("completed"));
    closed_data.insert(
        "consumed".to_owned(),
        Value::Object(consumed.to_json_object()),
    );
    Some(Ok(CompactionPlan {
        kept,
        closed_index,
        closed_data,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The plan, for events that cannot make compaction fail.
    fn planned(events: &[EngagementEvent]) -> Option<CompactionPlan> {
        match plan_compaction(events) {
            Ok(plan) => plan,
            Err(err) => panic!("no plan error expected: {err}"),
        }
    }

    /// Regression (found by a differential test against the reference): totals summed past
    /// `f64::MAX` were written into the close record as `null` (and read back as 0), silently
    /// losing them; the reference's copy step throws a `TypeError` and compacts nothing.
    #[test]
    fn a_total_that_is_not_finite_refuses_the_compaction() {
        let mut events = finished(json!({"status": "completed"}));
        events[0] = event(0, "budget_charged", json!({"tokens": 1e308}));
        events[1] = event(1, "budget_charged", json!({"tokens": 1e308}));
        match plan_compaction(&events) {
            Err(JournalError::NotFinite { path }) => assert_eq!(path, "data.consumed.tokens"),
            other => panic!(
                "expected NotFinite, got {:?}",
                other.map(|plan| plan.is_some())
            ),
        }
        // Large but finite totals still compact.
        events[1] = event(1, "budget_charged", json!({"tokens": 1}));
        assert!(planned(&events).is_some());
    }

    fn event(seq: usize, kind: &str, data: Value) -> EngagementEvent {
        EngagementEvent {
            engagement_id: "e".into(),
            seq: seq as i64,
            at: 100 + seq as i64,
            event_type: kind.into(),
            data: Arc::new(data.as_object().cloned().unwrap_or_default()),
        }
    }

    /// 19 charges, a tool call and a close: 21 events.
    fn finished(close_data: Value) -> Vec<EngagementEvent> {
        let mut events: Vec<EngagementEvent> = (0..19)
            .map(|seq| event(seq, "budget_charged", json!({"usage": {"tokens": 1}})))
            .collect();
        events.push(event(19, "tool_called", json!({})));
        events.push(event(20, "engagement_closed", close_data));
        events
    }

    #[test]
    fn drops_bookkeeping_renumbers_and_keeps_totals_in_the_close_record() {
        let events = finished(json!({"consumed": {"x": 1}, "reason": "ok"}));
        let plan = planned(&events);
        assert!(plan.is_some(), "21 finished events compact");
        let compacted = plan.map(|plan| plan.apply(events)).unwrap_or_default();
        let value = serde_json::to_value(&compacted).unwrap_or_default();
        assert_eq!(
            value,
            json!([
                {"engagementId": "e", "seq": 0, "at": 119, "type": "tool_called", "data": {}},
                {"engagementId": "e", "seq": 1, "at": 120, "type": "engagement_closed",
                 "data": {"consumed": {"modelCalls": 0, "tokens": 19, "wallMs": 0, "sideEffects": 0},
                          "reason": "ok", "status": "completed"}},
            ])
        );
        // `{...data, status, consumed}`: an existing key keeps its place.
        let keys: Vec<&String> = compacted[1].data.keys().collect();
        assert_eq!(keys, ["consumed", "reason", "status"]);
    }

    #[test]
    fn borrowed_and_owned_application_agree() {
        let events = finished(json!({"status": "completed"}));
        let Some(plan) = planned(&events) else {
            panic!("expected a plan");
        };
        assert_eq!(plan.compacted_events(&events), plan.apply(events));
    }

    #[test]
    fn leaves_alone_what_the_reference_leaves_alone() {
        assert_eq!(planned(&finished(json!({"status": null}))), None);
        assert_eq!(planned(&finished(json!({"status": "cancelled"}))), None);
        let mut short = finished(json!({}));
        short.remove(0);
        assert_eq!(planned(&short), None, "20 events are not enough");
        let mut escalated = finished(json!({}));
        escalated[3] = event(3, "escalated", json!({}));
        assert_eq!(planned(&escalated), None);
        let mut open = finished(json!({}));
        open[20] = event(20, "tool_called", json!({}));
        assert_eq!(planned(&open), None);
        let nothing_to_drop: Vec<EngagementEvent> = (0..20)
            .map(|seq| event(seq, "tool_called", json!({})))
            .chain([event(20, "engagement_closed", json!({}))])
            .collect();
        assert_eq!(planned(&nothing_to_drop), None);
    }
}
