//! The engagement summary: one pass over an engagement's records that yields its collaboration
//! graph (actors, mail hops) and metrics, as the reference's `summarizeEngagementEvents` does.
//!
//! The rules are the reference's, every tolerant payload variant included; each `match` arm below
//! names what it accepts. Strings are borrowed from the records while folding and copied once at
//! the end, which keeps a 60-event summary in the tens of microseconds.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::board::reconstruct_board_from_events;
use super::record::{object_get, JournalRecord, Payload};
use super::types::{
    BudgetAmounts, EngagementHopSummary, EngagementStatus, EngagementSummary, Escalation,
    GuardBlock, GuardBlockReason, HopStatus, JsonObject, Projection, ProjectionMode, VenueRef,
    BUDGET_KEYS,
};

/// Whether `actor` names an agent: a non-empty string that is not a human or system principal
/// (`human`, `system`, or prefixed `human:` / `system:`).
pub fn is_actor_ref(actor: &str) -> bool {
    !actor.is_empty()
        && !actor.starts_with("human:")
        && !actor.starts_with("system:")
        && actor != "human"
        && actor != "system"
}

/// Actors in first-appearance order, deduplicated.
#[derive(Default)]
struct Actors<'a> {
    order: Vec<&'a str>,
    seen: HashSet<&'a str>,
}

impl<'a> Actors<'a> {
    fn add(&mut self, actor: Option<&'a Value>) {
        if let Some(actor) = actor.and_then(Value::as_str) {
            self.add_str(actor);
        }
    }

    fn add_str(&mut self, actor: &'a str) {
        if is_actor_ref(actor) && self.seen.insert(actor) {
            self.order.push(actor);
        }
    }
}

/// A hop while folding.
struct Hop<'a> {
    mail_id: &'a str,
    kind: &'a str,
    from: &'a str,
    to: &'a str,
    causation_id: Option<&'a str>,
    status: HopStatus,
}

/// Who opened the engagement, before it is copied out.
enum Initiator<'a> {
    /// An `initiator`/`principal` object with a string `id`, kept verbatim.
    Object(&'a JsonObject),
    /// A non-empty `principal` string.
    Principal(&'a str),
}

/// Where `budget_charged` reads its amounts from.
enum Amounts<'a> {
    Object(&'a JsonObject),
    Flat(Payload<'a>),
}

impl Amounts<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Self::Object(object) => object_get(object, key),
            Self::Flat(payload) => payload.get(key),
        }
    }
}

/// The mail ids a delivery/finish record names: its string `mailId`, then the strings of its
/// `mails` array (only when it is an array).
fn named_mail_ids<'a>(payload: &Payload<'a>) -> impl Iterator<Item = &'a str> {
    let single = payload.str("mailId");
    let many = payload.get("mails").and_then(Value::as_array);
    single
        .into_iter()
        .chain(many.into_iter().flatten().filter_map(Value::as_str))
}

/// Summarize an engagement's records (stored events or loose JSON records) by the reference's
/// rules. Never fails: anything unusable in a record is ignored.
///
/// Records without an integer `at` count as `at: 0` wherever a time is reported (the reference
/// would report `undefined`), except that an `engagement_closed` without one leaves the
/// engagement not ended, exactly as in the reference.
pub fn summarize_engagement_events<R: JournalRecord>(
    engagement_id: &str,
    records: &[R],
) -> EngagementSummary {
    let mut initiator: Option<Initiator<'_>> = None;
    let mut venue: Option<(&str, &str)> = None;
    let mut started_at = records.first().and_then(R::record_at).unwrap_or(0);
    let mut ended_at: Option<i64> = None;
    let mut closed_status: Option<EngagementStatus> = None;
    let mut reason: Option<&str> = None;
    let mut tool_call_count = 0_u64;
    let mut actors = Actors::default();
    let mut guard_blocks: Vec<GuardBlock> = Vec::new();
    let mut escalations: Vec<Escalation> = Vec::new();
    let mut projections: Vec<Projection> = Vec::new();
    let mut consumed = BudgetAmounts::default();
    let mut closed_spent: Option<&JsonObject> = None;
    let mut hops: Vec<Hop<'_>> = Vec::new();
    let mut hop_index: HashMap<&str, usize> = HashMap::new();
    let mut anonymous_mail_count = 0_u64;

    for record in records {
        let payload = record.payload();
        let at = record.record_at();
        match record.record_type() {
            "engagement_opened" => {
                started_at = at.unwrap_or(0);
                let with_string_id =
                    |object: &&JsonObject| object_get(object, "id").is_some_and(Value::is_string);
                if let Some(object) = payload.object("initiator").filter(with_string_id) {
                    initiator = Some(Initiator::Object(object));
                } else if let Some(object) = payload.object("principal").filter(with_string_id) {
                    initiator = Some(Initiator::Object(object));
                } else if let Some(principal) = payload.non_empty_str("principal") {
                    initiator = Some(Initiator::Principal(principal));
                }
                if let Some(found) = payload.object("venue").and_then(venue_of) {
                    venue = Some(found);
                }
                actors.add(payload.get("entry"));
            }

            "mail_admitted" | "mail_sent" => {
                let mail_id = payload.str("mailId").unwrap_or("");
                let kind = payload.str("kind").unwrap_or("ask");
                let from = payload.str("from").unwrap_or("");
                let to = payload.str("to").unwrap_or("");
                let causation_id = payload.non_empty_str("causationId");
                actors.add_str(from);
                actors.add_str(to);
                if mail_id.is_empty() {
                    anonymous_mail_count += 1;
                    continue;
                }
                if !hop_index.contains_key(mail_id) {
                    hop_index.insert(mail_id, hops.len());
                    hops.push(Hop {
                        mail_id,
                        kind,
                        from,
                        to,
                        causation_id,
                        status: HopStatus::Sent,
                    });
                }
                if kind == "result" {
                    if let Some(&parent) = causation_id.and_then(|id| hop_index.get(id)) {
                        hops[parent].status = if payload.str("status") == Some("cancelled") {
                            HopStatus::Cancelled
                        } else {
                            HopStatus::Completed
                        };
                    }
                }
            }

            "turn_started" | "mail_delivered" => {
                actors.add(payload.get("actor"));
                for id in named_mail_ids(&payload) {
                    if let Some(&index) = hop_index.get(id) {
                        if hops[index].status == HopStatus::Sent {
                            hops[index].status = HopStatus::Delivered;
                        }
                    }
                }
            }

            "turn_finished" | "mail_completed" => {
                actors.add(payload.get("actor"));
                let next = if payload.str("status") == Some("cancelled") {
                    HopStatus::Cancelled
                } else {
                    HopStatus::Completed
                };
                for id in named_mail_ids(&payload) {
                    if let Some(&index) = hop_index.get(id) {
                        hops[index].status = next;
                    }
                }
            }

            "mail_cancelled" => {
                if let Some(&index) = payload
                    .non_empty_str("mailId")
                    .and_then(|id| hop_index.get(id))
                {
                    hops[index].status = HopStatus::Cancelled;
                }
            }

            "tool_called" => {
                tool_call_count += 1;
                actors.add(payload.get("actor"));
            }

            "board_written" => {
                // `actor ?? author`: a present, non-null `actor` hides `author` even when it is not
                // a string (the board entry itself still falls back to `author`).
                let actor = payload.get("actor").filter(|actor| !actor.is_null());
                actors.add(actor.or_else(|| payload.get("author")));
            }

            "guard_blocked" | "mail_denied" => {
                let from = payload
                    .str("from")
                    .or_else(|| payload.str("actor"))
                    .unwrap_or("");
                let to = payload.str("to");
                actors.add_str(from);
                if let Some(to) = to {
                    actors.add_str(to);
                }
                // A reason object counts only with a string code.
                let coded_reason = payload
                    .object("reason")
                    .and_then(|reason| Some((reason, object_get(reason, "code")?.as_str()?)));
                let reason = match coded_reason {
                    Some((object, code)) => GuardBlockReason {
                        code: code.to_owned(),
                        detail: object_get(object, "detail")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    },
                    None => GuardBlockReason {
                        code: payload.str("code").unwrap_or("denied").to_owned(),
                        detail: payload.str("reason").map(str::to_owned),
                    },
                };
                guard_blocks.push(GuardBlock {
                    from: from.to_owned(),
                    to: to.map(str::to_owned),
                    reason,
                    at: at.unwrap_or(0),
                });
            }

            "escalated" => {
                let by = payload
                    .str("by")
                    .or_else(|| payload.str("from"))
                    .or_else(|| payload.str("actor"))
                    .unwrap_or("");
                actors.add_str(by);
                escalations.push(Escalation {
                    by: by.to_owned(),
                    reason: payload.str("reason").unwrap_or("").to_owned(),
                    at: at.unwrap_or(0),
                });
            }

            "venue_projected" => {
                actors.add(payload.get("actor"));
                if let Some((kind, id)) = payload.object("venue").and_then(venue_of) {
                    projections.push(Projection {
                        venue: VenueRef {
                            kind: kind.to_owned(),
                            id: id.to_owned(),
                        },
                        actor: payload.str("actor").unwrap_or("").to_owned(),
                        mail_id: payload.str("mailId").unwrap_or("").to_owned(),
                        mode: if payload.str("mode") == Some("summary") {
                            ProjectionMode::Summary
                        } else {
                            ProjectionMode::Visible
                        },
                        at: at.unwrap_or(0),
                    });
                }
            }

            "budget_charged" => {
                let amounts = payload
                    .object("usage")
                    .or_else(|| payload.object("amount"))
                    .or_else(|| payload.object("consumed"))
                    .map_or(Amounts::Flat(payload), Amounts::Object);
                for (index, key) in BUDGET_KEYS.iter().enumerate() {
                    if let Some(value) = amounts.get(key).and_then(Value::as_f64) {
                        if value > 0.0 {
                            *consumed.slot_mut(index) += value;
                        }
                    }
                }
            }

            "engagement_closed" => {
                // The reference assigns `record.at` even when it is undefined.
                ended_at = at;
                if let Some(status) = payload
                    .str("status")
                    .and_then(EngagementStatus::parse_closed)
                {
                    closed_status = Some(status);
                }
                if let Some(text) = payload.str("reason") {
                    reason = Some(text);
                }
                let spent = payload
                    .object("budget")
                    .and_then(|budget| object_get(budget, "spent"))
                    .and_then(Value::as_object);
                if let Some(spent) = spent.or_else(|| payload.object("consumed")) {
                    closed_spent = Some(spent);
                }
            }

            _ => {}
        }
    }

    if let Some(spent) = closed_spent {
        for (index, key) in BUDGET_KEYS.iter().enumerate() {
            if let Some(value) = object_get(spent, key).and_then(Value::as_f64) {
                let slot = consumed.slot_mut(index);
                *slot = slot.max(value);
            }
        }
    }

    let status = closed_status.unwrap_or(if !escalations.is_empty() {
        EngagementStatus::Escalated
    } else if ended_at.is_some() {
        EngagementStatus::Completed
    } else {
        EngagementStatus::Open
    });
    let reason = match reason {
        Some(text) => Some(text.to_owned()),
        None => escalations
            .last()
            .map(|escalation| escalation.reason.clone()),
    };

    EngagementSummary {
        engagement_id: engagement_id.to_owned(),
        initiator: initiator.map(|initiator| match initiator {
            Initiator::Object(object) => object.clone(),
            Initiator::Principal(id) => human_principal(id),
        }),
        venue: venue.map(|(kind, id)| VenueRef {
            kind: kind.to_owned(),
            id: id.to_owned(),
        }),
        started_at,
        ended_at,
        status,
        reason,
        actors: actors.order.into_iter().map(str::to_owned).collect(),
        mail_count: hops.len() as u64 + anonymous_mail_count,
        tool_call_count,
        board_entries: reconstruct_board_from_events(records, None),
        guard_blocks,
        escalations,
        projections,
        consumed,
        hops: hops
            .into_iter()
            .map(|hop| EngagementHopSummary {
                mail_id: hop.mail_id.to_owned(),
                kind: hop.kind.to_owned(),
                from: hop.from.to_owned(),
                to: hop.to.to_owned(),
                causation_id: hop.causation_id.map(str::to_owned),
                status: hop.status,
            })
            .collect(),
    }
}

/// A venue object's `(kind, id)` when both are strings (other keys are dropped).
fn venue_of(venue: &JsonObject) -> Option<(&str, &str)> {
    Some((
        object_get(venue, "kind")?.as_str()?,
        object_get(venue, "id")?.as_str()?,
    ))
}

/// The initiator a bare principal string stands for.
fn human_principal(id: &str) -> JsonObject {
    let mut object = JsonObject::new();
    object.insert("kind".to_owned(), Value::from("human"));
    object.insert("id".to_owned(), Value::from(id));
    object.insert("trust".to_owned(), Value::from("group_member"));
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn summary(records: Value) -> Value {
        let records = records.as_array().cloned().unwrap_or_default();
        serde_json::to_value(summarize_engagement_events("e", &records)).unwrap_or_default()
    }

    #[test]
    fn empty_records_summarize_to_an_open_engagement_at_zero() {
        assert_eq!(
            summary(json!([])),
            json!({"engagementId": "e", "startedAt": 0, "status": "open", "actors": [],
                   "mailCount": 0, "toolCallCount": 0, "boardEntries": [], "guardBlocks": [],
                   "escalations": [], "projections": [],
                   "consumed": {"modelCalls": 0, "tokens": 0, "wallMs": 0, "sideEffects": 0},
                   "hops": []})
        );
    }

    #[test]
    fn a_close_without_at_leaves_the_engagement_not_ended() {
        let value = summary(json!([
            {"at": 5, "type": "engagement_closed", "data": {}},
            {"type": "engagement_closed", "data": {}},
        ]));
        assert_eq!(value.get("endedAt"), None);
        assert_eq!(value["status"], json!("open"));
    }

    #[test]
    fn board_written_actor_hides_author_unless_null() {
        let value = summary(json!([
            {"at": 1, "type": "board_written", "data": {"key": "a", "actor": 42, "author": "agent:hidden"}},
            {"at": 2, "type": "board_written", "data": {"key": "b", "actor": null, "author": "agent:shown"}},
        ]));
        assert_eq!(value["actors"], json!(["agent:shown"]));
    }

    #[test]
    fn close_totals_raise_charges_but_never_lower_them() {
        let value = summary(json!([
            {"at": 1, "type": "budget_charged", "data": {"usage": {"tokens": 10, "wallMs": -4}}},
            {"at": 2, "type": "budget_charged", "data": {"usage": [1], "tokens": 0.5}},
            {"at": 3, "type": "engagement_closed",
             "data": {"budget": {"spent": {"tokens": 3, "modelCalls": 2}}, "consumed": {"sideEffects": 9}}},
        ]));
        assert_eq!(
            value["consumed"],
            json!({"modelCalls": 2, "tokens": 10.5, "wallMs": 0, "sideEffects": 0})
        );
        assert_eq!(value["status"], json!("completed"));
    }

    #[test]
    fn a_result_completes_or_cancels_its_parent_hop() {
        let value = summary(json!([
            {"at": 1, "type": "mail_sent", "data": {"mailId": "a", "from": "agent:p", "to": "agent:q"}},
            {"at": 2, "type": "mail_sent", "data": {"mailId": "b", "from": "agent:p", "to": "agent:q"}},
            {"at": 3, "type": "mail_sent",
             "data": {"mailId": "r1", "kind": "result", "causationId": "a"}},
            {"at": 4, "type": "mail_sent",
             "data": {"mailId": "r2", "kind": "result", "causationId": "b", "status": "cancelled"}},
            {"at": 5, "type": "mail_sent", "data": {"from": "agent:p"}},
        ]));
        let statuses: Vec<&Value> = value["hops"]
            .as_array()
            .map(|hops| hops.iter().map(|hop| &hop["status"]).collect())
            .unwrap_or_default();
        assert_eq!(
            statuses,
            [
                &json!("completed"),
                &json!("cancelled"),
                &json!("sent"),
                &json!("sent")
            ]
        );
        assert_eq!(value["mailCount"], json!(5));
    }
}
