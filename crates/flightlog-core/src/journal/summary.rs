//! The engagement summary: one pass over an engagement's records that yields its collaboration
//! graph (actors, mail hops), its blackboard and metrics, as the reference's
//! `summarizeEngagementEvents` does.
//!
//! The rules are the reference's, every tolerant payload variant included; each `match` arm below
//! names what it accepts. The cost of a summary is mostly memory traffic and allocation, so:
//! each record's payload is read in one pass over its entries (`Fields`); the output lists are
//! sized by a first pass over the record types and built in place (no intermediate copies), with
//! short lists searched linearly (`KeyIndex`); the blackboard is folded in the same pass; and
//! what only the last record decides (initiator, venue, reason) is borrowed until the end.

use serde_json::Value;

use super::board::{BoardFold, BOARD_WRITTEN};
use super::index::KeyIndex;
use super::record::{
    as_non_empty_str, as_object, as_str, budget_amounts, object_get, Fields, JournalRecord,
};
use super::types::{
    BudgetAmounts, EngagementHopSummary, EngagementStatus, EngagementSummary, Escalation,
    GuardBlock, GuardBlockReason, HopStatus, JsonObject, Projection, ProjectionMode, VenueRef,
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
struct Actors {
    order: Vec<String>,
    index: KeyIndex,
}

impl Actors {
    fn add(&mut self, actor: Option<&Value>) {
        if let Some(actor) = as_str(actor) {
            self.add_str(actor);
        }
    }

    fn add_str(&mut self, actor: &str) {
        if is_actor_ref(actor)
            && self
                .index
                .find(&self.order, String::as_str, actor)
                .is_none()
        {
            self.order.push(actor.to_owned());
            self.index.pushed(&self.order, String::as_str);
        }
    }
}

/// Hops kept in place (on the stack) before the list is allocated: a typical engagement's.
const INLINE_HOPS: usize = 16;

/// The mail hops in first-seen order, found by mail id.
///
/// The list is allocated only at the end, after every small string of the summary: glibc
/// consolidates its fast bins (the chunks the previous summary freed) on any request of 1 KiB or
/// more, which a dozen hops are, and every small allocation after that takes its slow path. Up to
/// [`INLINE_HOPS`] hops wait in place; more spill to the heap in the order they come.
struct Hops {
    inline: [EngagementHopSummary; INLINE_HOPS],
    /// Hops in `inline` (all of them while nothing has spilled).
    len: usize,
    /// Every hop, once there are more than `INLINE_HOPS`.
    spilled: Vec<EngagementHopSummary>,
    /// Room to make when spilling: as many hops as there are mail records.
    most: usize,
    index: KeyIndex,
}

impl Hops {
    /// No hops yet, and at most `most` to come.
    fn new(most: usize) -> Self {
        Self {
            inline: std::array::from_fn(|_| empty_hop()),
            len: 0,
            spilled: Vec::new(),
            most,
            index: KeyIndex::default(),
        }
    }

    fn as_slice(&self) -> &[EngagementHopSummary] {
        if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }

    fn mail_id(hop: &EngagementHopSummary) -> &str {
        &hop.mail_id
    }

    fn get_mut(&mut self, mail_id: &str) -> Option<&mut EngagementHopSummary> {
        let index = self.index.find(self.as_slice(), Self::mail_id, mail_id)?;
        if self.spilled.is_empty() {
            self.inline.get_mut(index)
        } else {
            self.spilled.get_mut(index)
        }
    }

    /// Add a hop unless one with its mail id exists (the first seen wins).
    fn add(&mut self, mail_id: &str, make: impl FnOnce() -> EngagementHopSummary) {
        if self
            .index
            .find(self.as_slice(), Self::mail_id, mail_id)
            .is_some()
        {
            return;
        }
        if self.spilled.is_empty() && self.len < INLINE_HOPS {
            self.inline[self.len] = make();
            self.len += 1;
        } else {
            if self.spilled.is_empty() {
                self.spilled.reserve(self.most.max(INLINE_HOPS + 1));
                self.spilled.extend(self.inline.iter_mut().map(take_hop));
            }
            self.spilled.push(make());
        }
        let hops = if self.spilled.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spilled
        };
        self.index.pushed(hops, Self::mail_id);
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// The hops, in a list allocated now.
    fn finish(mut self) -> Vec<EngagementHopSummary> {
        if self.spilled.is_empty() {
            let mut hops = Vec::with_capacity(self.len);
            hops.extend(self.inline[..self.len].iter_mut().map(take_hop));
            hops
        } else {
            self.spilled
        }
    }
}

/// A placeholder hop (allocates nothing).
fn empty_hop() -> EngagementHopSummary {
    EngagementHopSummary {
        mail_id: String::new(),
        kind: String::new(),
        from: String::new(),
        to: String::new(),
        causation_id: None,
        status: HopStatus::Sent,
    }
}

/// The hop in `hop`, leaving a placeholder.
fn take_hop(hop: &mut EngagementHopSummary) -> EngagementHopSummary {
    std::mem::replace(hop, empty_hop())
}

/// Who opened the engagement, before it is copied out.
enum Initiator<'a> {
    /// An `initiator`/`principal` object with a string `id`, kept verbatim.
    Object(&'a JsonObject),
    /// A non-empty `principal` string.
    Principal(&'a str),
}

/// What a record type is to the summary.
#[derive(Clone, Copy)]
enum Kind {
    Opened,
    MailSent,
    Delivered,
    Finished,
    MailCancelled,
    ToolCalled,
    BoardWritten,
    Blocked,
    Escalated,
    Projected,
    BudgetCharged,
    Closed,
    Other,
}

impl Kind {
    fn of(record_type: &str) -> Self {
        match record_type {
            "engagement_opened" => Self::Opened,
            "mail_admitted" | "mail_sent" => Self::MailSent,
            "turn_started" | "mail_delivered" => Self::Delivered,
            "turn_finished" | "mail_completed" => Self::Finished,
            "mail_cancelled" => Self::MailCancelled,
            "tool_called" => Self::ToolCalled,
            BOARD_WRITTEN => Self::BoardWritten,
            "guard_blocked" | "mail_denied" => Self::Blocked,
            "escalated" => Self::Escalated,
            "venue_projected" => Self::Projected,
            "budget_charged" => Self::BudgetCharged,
            "engagement_closed" => Self::Closed,
            _ => Self::Other,
        }
    }
}

/// How many records of each list-producing kind there are: room enough for every list.
#[derive(Default)]
struct Capacities {
    hops: usize,
    board: usize,
    guard_blocks: usize,
    escalations: usize,
    projections: usize,
}

impl Capacities {
    fn of<R: JournalRecord>(records: &[R]) -> Self {
        let mut capacities = Self::default();
        for record in records {
            let count = match Kind::of(record.record_type()) {
                Kind::MailSent => &mut capacities.hops,
                Kind::BoardWritten => &mut capacities.board,
                Kind::Blocked => &mut capacities.guard_blocks,
                Kind::Escalated => &mut capacities.escalations,
                Kind::Projected => &mut capacities.projections,
                _ => continue,
            };
            *count += 1;
        }
        capacities
    }
}

/// The mail ids a delivery/finish record names: its string `mailId`, then the strings of its
/// `mails` array (only when it is an array).
fn named_mail_ids<'a>(fields: &Fields<'a>) -> impl Iterator<Item = &'a str> {
    let single = as_str(fields.mail_id);
    let many = fields.mails.and_then(Value::as_array);
    single
        .into_iter()
        .chain(many.into_iter().flatten().filter_map(Value::as_str))
}

/// Summarize an engagement's records (stored events or loose JSON records) by the reference's
/// rules. Never fails: anything unusable in a record is ignored.
///
/// Records without an integer `at` count as `at: 0` wherever a time is reported (the reference
/// would report the value as it is, or leave it out when there is none). Whether an
/// `engagement_closed` ended the engagement follows the reference exactly: it did when the
/// record has an `at` at all (`null`, a string and a fraction included, though `endedAt` is then
/// left out), and not when it has none.
pub fn summarize_engagement_events<R: JournalRecord>(
    engagement_id: &str,
    records: &[R],
) -> EngagementSummary {
    let capacities = Capacities::of(records);
    let mut initiator: Option<Initiator<'_>> = None;
    let mut venue: Option<(&str, &str)> = None;
    let mut started_at = records.first().and_then(R::record_at).unwrap_or(0);
    let mut ended_at: Option<i64> = None;
    // The reference's `endedAt !== undefined`, which a loose record's non-integer `at` also sets.
    let mut ended = false;
    let mut closed_status: Option<EngagementStatus> = None;
    let mut reason: Option<&str> = None;
    let mut tool_call_count = 0_u64;
    let mut actors = Actors::default();
    let mut board = BoardFold::with_capacity(capacities.board);
    let mut guard_blocks: Vec<GuardBlock> = Vec::with_capacity(capacities.guard_blocks);
    let mut escalations: Vec<Escalation> = Vec::with_capacity(capacities.escalations);
    let mut projections: Vec<Projection> = Vec::with_capacity(capacities.projections);
    let mut consumed = BudgetAmounts::default();
    let mut closed_spent: Option<&JsonObject> = None;
    let mut hops = Hops::new(capacities.hops);
    let mut anonymous_mail_count = 0_u64;

    for record in records {
        let record_kind = Kind::of(record.record_type());
        if let Kind::Other = record_kind {
            continue;
        }
        let payload = record.payload();
        let fields = Fields::read(&payload);
        let at = record.record_at();
        match record_kind {
            Kind::Opened => {
                started_at = at.unwrap_or(0);
                let with_string_id =
                    |object: &&JsonObject| object_get(object, "id").is_some_and(Value::is_string);
                if let Some(object) = as_object(fields.initiator).filter(with_string_id) {
                    initiator = Some(Initiator::Object(object));
                } else if let Some(object) = as_object(fields.principal).filter(with_string_id) {
                    initiator = Some(Initiator::Object(object));
                } else if let Some(principal) = as_non_empty_str(fields.principal) {
                    initiator = Some(Initiator::Principal(principal));
                }
                if let Some(found) = as_object(fields.venue).and_then(venue_of) {
                    venue = Some(found);
                }
                actors.add(fields.entry);
            }

            Kind::MailSent => {
                let mail_id = as_str(fields.mail_id).unwrap_or("");
                let kind = as_str(fields.kind).unwrap_or("ask");
                let from = as_str(fields.from).unwrap_or("");
                let to = as_str(fields.to).unwrap_or("");
                let causation_id = as_non_empty_str(fields.causation_id);
                actors.add_str(from);
                actors.add_str(to);
                if mail_id.is_empty() {
                    anonymous_mail_count += 1;
                    continue;
                }
                hops.add(mail_id, || EngagementHopSummary {
                    mail_id: mail_id.to_owned(),
                    kind: kind.to_owned(),
                    from: from.to_owned(),
                    to: to.to_owned(),
                    causation_id: causation_id.map(str::to_owned),
                    status: HopStatus::Sent,
                });
                if kind == "result" {
                    if let Some(parent) = causation_id.and_then(|id| hops.get_mut(id)) {
                        parent.status = if as_str(fields.status) == Some("cancelled") {
                            HopStatus::Cancelled
                        } else {
                            HopStatus::Completed
                        };
                    }
                }
            }

            Kind::Delivered => {
                actors.add(fields.actor);
                for id in named_mail_ids(&fields) {
                    if let Some(hop) = hops.get_mut(id) {
                        if hop.status == HopStatus::Sent {
                            hop.status = HopStatus::Delivered;
                        }
                    }
                }
            }

            Kind::Finished => {
                actors.add(fields.actor);
                let next = if as_str(fields.status) == Some("cancelled") {
                    HopStatus::Cancelled
                } else {
                    HopStatus::Completed
                };
                for id in named_mail_ids(&fields) {
                    if let Some(hop) = hops.get_mut(id) {
                        hop.status = next;
                    }
                }
            }

            Kind::MailCancelled => {
                if let Some(hop) = as_non_empty_str(fields.mail_id).and_then(|id| hops.get_mut(id))
                {
                    hop.status = HopStatus::Cancelled;
                }
            }

            Kind::ToolCalled => {
                tool_call_count += 1;
                actors.add(fields.actor);
            }

            Kind::BoardWritten => {
                // `actor ?? author`: a present, non-null `actor` hides `author` even when it is not
                // a string (the board entry itself still falls back to `author`).
                let actor = fields.actor.filter(|actor| !actor.is_null());
                actors.add(actor.or(fields.author));
                board.write(&fields, at);
            }

            Kind::Blocked => {
                let from = as_str(fields.from)
                    .or_else(|| as_str(fields.actor))
                    .unwrap_or("");
                let to = as_str(fields.to);
                actors.add_str(from);
                if let Some(to) = to {
                    actors.add_str(to);
                }
                // A reason object counts only with a string code.
                let coded_reason = as_object(fields.reason)
                    .and_then(|reason| Some((reason, object_get(reason, "code")?.as_str()?)));
                let reason = match coded_reason {
                    Some((object, code)) => GuardBlockReason {
                        code: code.to_owned(),
                        detail: object_get(object, "detail")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    },
                    None => GuardBlockReason {
                        code: as_str(fields.code).unwrap_or("denied").to_owned(),
                        detail: as_str(fields.reason).map(str::to_owned),
                    },
                };
                guard_blocks.push(GuardBlock {
                    from: from.to_owned(),
                    to: to.map(str::to_owned),
                    reason,
                    at: at.unwrap_or(0),
                });
            }

            Kind::Escalated => {
                let by = as_str(fields.by)
                    .or_else(|| as_str(fields.from))
                    .or_else(|| as_str(fields.actor))
                    .unwrap_or("");
                actors.add_str(by);
                escalations.push(Escalation {
                    by: by.to_owned(),
                    reason: as_str(fields.reason).unwrap_or("").to_owned(),
                    at: at.unwrap_or(0),
                });
            }

            Kind::Projected => {
                actors.add(fields.actor);
                if let Some((kind, id)) = as_object(fields.venue).and_then(venue_of) {
                    projections.push(Projection {
                        venue: VenueRef {
                            kind: kind.to_owned(),
                            id: id.to_owned(),
                        },
                        actor: as_str(fields.actor).unwrap_or("").to_owned(),
                        mail_id: as_str(fields.mail_id).unwrap_or("").to_owned(),
                        mode: if as_str(fields.mode) == Some("summary") {
                            ProjectionMode::Summary
                        } else {
                            ProjectionMode::Visible
                        },
                        at: at.unwrap_or(0),
                    });
                }
            }

            Kind::BudgetCharged => {
                let amounts = as_object(fields.usage)
                    .or_else(|| as_object(fields.amount))
                    .or_else(|| as_object(fields.consumed))
                    .map_or(fields.amounts, budget_amounts);
                for (index, amount) in amounts.into_iter().enumerate() {
                    if let Some(value) = amount.and_then(Value::as_f64) {
                        if value > 0.0 {
                            *consumed.slot_mut(index) += value;
                        }
                    }
                }
            }

            Kind::Closed => {
                // The reference assigns `record.at` even when it is undefined.
                ended_at = at;
                ended = record.has_at();
                if let Some(status) = as_str(fields.status).and_then(EngagementStatus::parse_closed)
                {
                    closed_status = Some(status);
                }
                if let Some(text) = as_str(fields.reason) {
                    reason = Some(text);
                }
                let spent = as_object(fields.budget)
                    .and_then(|budget| object_get(budget, "spent"))
                    .and_then(Value::as_object);
                if let Some(spent) = spent.or_else(|| as_object(fields.consumed)) {
                    closed_spent = Some(spent);
                }
            }

            Kind::Other => {}
        }
    }

    if let Some(spent) = closed_spent {
        for (index, amount) in budget_amounts(spent).into_iter().enumerate() {
            if let Some(value) = amount.and_then(Value::as_f64) {
                let slot = consumed.slot_mut(index);
                *slot = slot.max(value);
            }
        }
    }

    let status = closed_status.unwrap_or(if !escalations.is_empty() {
        EngagementStatus::Escalated
    } else if ended {
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

    let mail_count = hops.len() as u64 + anonymous_mail_count;
    let mut summary = EngagementSummary {
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
        actors: actors.order,
        mail_count,
        tool_call_count,
        board_entries: board.finish(),
        guard_blocks,
        escalations,
        projections,
        consumed,
        hops: Vec::new(),
    };
    // Last: see `Hops`.
    summary.hops = hops.finish();
    summary
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

    /// The reference ends the engagement on `record.at !== undefined`; checked on node 20 for
    /// each value below (its `endedAt` is then the value as given, which an `i64` cannot hold).
    #[test]
    fn a_close_whose_at_is_not_an_integer_still_ends_the_engagement() {
        for at in [
            json!(null),
            json!("7"),
            json!(1.5),
            json!(9_007_199_254_740_993_u64),
        ] {
            let value = summary(json!([
                {"at": 1, "type": "engagement_opened", "data": {}},
                {"at": at.clone(), "type": "engagement_closed", "data": {}},
            ]));
            assert_eq!(value["status"], json!("completed"), "at: {at}");
            assert_eq!(value.get("endedAt"), None, "at: {at}");
        }
        let value = summary(json!([
            {"at": 1, "type": "engagement_opened", "data": {}},
            {"type": "engagement_closed", "data": {}},
        ]));
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

    #[test]
    fn hops_past_the_inline_list_keep_their_order_and_statuses() {
        let count = INLINE_HOPS * 3 + 1;
        let mut records = Vec::new();
        for n in 0..count {
            records.push(json!({"at": n, "type": "mail_sent",
                                "data": {"mailId": format!("m{n}"), "from": "agent:p", "to": "agent:q"}}));
        }
        // A duplicate id is not a new hop; statuses reach hops in the inline part and past it.
        records.push(json!({"at": 0, "type": "mail_sent", "data": {"mailId": "m3", "kind": "x"}}));
        records.push(json!({"at": 0, "type": "mail_delivered", "data": {"mailId": "m1"}}));
        records.push(json!({"at": 0, "type": "turn_finished",
                            "data": {"mails": ["m2", format!("m{}", count - 1)]}}));
        records.push(json!({"at": 0, "type": "mail_cancelled", "data": {"mailId": "m20"}}));
        let value = summary(Value::Array(records));
        let hops = value["hops"].as_array().cloned().unwrap_or_default();
        assert_eq!(hops.len(), count);
        assert_eq!(value["mailCount"], json!(count));
        for (n, hop) in hops.iter().enumerate() {
            assert_eq!(hop["mailId"], json!(format!("m{n}")));
            assert_eq!(hop["kind"], json!("ask"));
            let status = match n {
                1 => "delivered",
                2 => "completed",
                20 => "cancelled",
                n if n == count - 1 => "completed",
                _ => "sent",
            };
            assert_eq!(hop["status"], json!(status), "hop {n}");
        }
    }
}
