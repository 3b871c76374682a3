//! The run rollup rule: what a run's summary row says, computed from its spans.
//!
//! Aggregation scope is the ROOT span only: result-level accounting on the root already includes
//! subagent consumption, so summing the tree would double-count every fan-out. The failure reason
//! is the first error/timeout reason in start order, else `interrupted` for an interrupted root.
//!
//! One extension beyond the reference: each usage field the root does not carry (typical of
//! OpenTelemetry traces, where only the model-call spans report tokens; or a root that reports
//! its tokens but no cost) is the sum of that field over the run's `model` spans, leaving out a
//! model span below another model span that reports usage. That happens when two
//! instrumentations see one call (pydantic-ai's `chat` span around the OpenAI SDK
//! instrumentation's, a LangChain LLM span around the provider instrumentor's), and both report
//! its tokens: summing both counted the call twice (unless they name different provider calls,
//! or a tool call, subagent, turn or job sits between them: the agent's model → tool → model
//! loop; then each is a call of its own). An outer model span that reports nothing
//! (a framework's span around a streamed call) does not hide the inner one's counts, which would
//! count the call zero times; and when the inner ones report more of the usage fields than the
//! outer one (the OpenAI Agents SDK's `generation` span with prompt and completion tokens around
//! the OpenAI instrumentation's span that also has the cached tokens), the inner ones are
//! counted instead of it (the outer one's cost, priced without the cache, was 9% high), provided
//! each of them reports every field the outer one does (else the outer one counts alone: a field
//! is never taken twice, nor lost). Model spans side by side that name one provider call (the
//! same response id: two instrumentations, neither nested in the other) count once, and a span
//! counted in place of inner ones stands for their calls. A field the root carries wins, so no
//! field is ever counted twice. The reference has no `model` kind, so its behaviour is
//! unchanged.
//!
//! A second extension: an OTLP run with several roots (each call of a service that a caller
//! exporting elsewhere made in one trace is a root) counts every root's usage, each taken as a
//! lone root's is from the model spans below it, one provider call counting once in the whole
//! run (see `usage_over_roots`). Its name, start, end and
//! outcome stay the first root's, as the run list shows them. Runs of the reference's origins
//! keep its rule (the first root alone).

use std::collections::BTreeSet;

// The rollup runs inside the writer's transaction for every write that touches a run: its maps
// hash with foldhash (seeded at random per process) rather than std's SipHash.
use foldhash::{HashMap, HashMapExt as _, HashSet};

use super::types::{SpanKind, SpanOrigin, SpanOutcome, SpanRow, SpanUsage};

/// What the rollup rule needs to know about one span (a backend can read just these columns).
#[derive(Debug, Clone, PartialEq)]
pub struct RollupSpan {
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub is_root: bool,
    pub kind: SpanKind,
    pub origin: SpanOrigin,
    pub name: String,
    pub session_id: Option<String>,
    pub job_name: Option<String>,
    pub started_at: i64,
    pub ended_at: Option<i64>,
    pub outcome: Option<SpanOutcome>,
    pub outcome_reason: Option<String>,
    pub usage: SpanUsage,
    /// The provider's id of the model call the span records (`gen_ai.response.id` over OTLP),
    /// when known: two model spans with one call id are one call (see `counted_model_usage`).
    pub call_id: Option<String>,
}

impl From<&SpanRow> for RollupSpan {
    fn from(span: &SpanRow) -> Self {
        Self {
            span_id: span.span_id.clone(),
            parent_span_id: span.parent_span_id.clone(),
            is_root: span.is_root(),
            kind: span.kind.clone(),
            origin: span.origin.clone(),
            name: span.name.clone(),
            session_id: span.session_id.clone(),
            job_name: span.job_name.clone(),
            started_at: span.started_at,
            ended_at: span.ended_at,
            outcome: span.outcome.clone(),
            outcome_reason: span.outcome_reason.clone(),
            usage: span.usage.clone(),
            call_id: None,
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
    let roots: Vec<usize> = (0..spans_by_start.len())
        .filter(|&index| spans_by_start[index].is_root)
        .collect();
    let usage = if roots.len() > 1
        && roots
            .iter()
            .all(|&index| spans_by_start[index].origin == SpanOrigin::Otlp)
    {
        usage_over_roots(spans_by_start, &roots)
    } else if roots.is_empty() && root.kind == SpanKind::Model {
        // No root stored and the earliest span, standing in for one, is a model call: it
        // reports that call's usage, not the run's, so the run's usage is its model spans'
        // sum (the earliest among them), as the listing of a run awaiting its root shows.
        // Taken as a root's, the later calls only filled the fields it lacked: two calls of
        // 100 and 200 tokens rolled up as 100, and a prune then made the loss permanent (an
        // audit's finding).
        sum_model_usage(spans_by_start)
    } else {
        root_usage(&root.usage, || sum_model_usage(spans_by_start))
    };
    Some(RollupFields {
        origin: root.origin.clone(),
        name: root.name.clone(),
        session_id: root.session_id.clone(),
        job_name: root.job_name.clone(),
        started_at: root.started_at,
        ended_at: root.ended_at,
        outcome: root.outcome.clone(),
        duration_ms: root
            .ended_at
            .map(|ended| ended.saturating_sub(root.started_at)),
        span_count: i64::try_from(spans_by_start.len()).unwrap_or(i64::MAX),
        input_tokens: usage.input_tokens,
        output_tokens: usage.output_tokens,
        cache_read_tokens: usage.cache_read_tokens,
        cache_creation_tokens: usage.cache_creation_tokens,
        cost_usd: usage.cost_usd,
        failure_reason,
    })
}

/// A root's usage: its own, each field it lacks taken from `model_sum` (its `model` spans'
/// counted usage, worked out only when needed; the models' sum carries no model name, so the
/// root's stays).
fn root_usage(own: &SpanUsage, model_sum: impl FnOnce() -> SpanUsage) -> SpanUsage {
    if own.carries_every_figure() {
        own.clone()
    } else {
        fill_missing_fields(own.clone(), &model_sum())
    }
}

/// The usage of an OTLP run with several roots (a service called twice in one trace by a caller
/// that exports elsewhere: each call's span is a root of the run): the sum over its roots of
/// each root's usage as a lone root's is taken (its own, each field it lacks from the counted
/// `model` spans below it), plus the counted `model` spans below no root; which model spans
/// count is decided over the whole run, as for one root. Only the first root counted, so a later call's tokens and cost
/// were lost (an audit). Runs of the reference's origins keep its rule (the first root alone),
/// which its fixtures pin.
fn usage_over_roots(spans: &[RollupSpan], roots: &[usize]) -> SpanUsage {
    // What the model spans count is decided over the whole run, as for one root: a call seen
    // by two instrumentations counts once even when the copies hang from different roots (or
    // one from no stored root); summed per part, it counted twice (an audit: a root with no
    // usage at all doubled a run's totals).
    let counted = counted_model_usage(spans);
    let root_above = first_ancestor(spans, |parent| spans[parent].is_root);
    let mut below_root: HashMap<usize, SpanUsage> = HashMap::new();
    let mut below_none = SpanUsage::default();
    for (index, usage) in counted.iter().enumerate() {
        let Some(usage) = usage else {
            continue;
        };
        let owner = if spans[index].is_root {
            Some(index)
        } else {
            root_above[index]
        };
        match owner {
            Some(root) => add_usage(below_root.entry(root).or_default(), usage),
            None => add_usage(&mut below_none, usage),
        }
    }
    let mut total = SpanUsage::default();
    for &root in roots {
        let usage = root_usage(&spans[root].usage, || {
            below_root.remove(&root).unwrap_or_default()
        });
        add_usage(&mut total, &usage);
    }
    add_usage(&mut total, &below_none);
    total.cost_usd = total.cost_usd.map(round_cost);
    total
}

/// The largest count a sum reaches: 2^53 - 1, the bound the API holds every count to (a JSON
/// number past it is not exact in most clients); sums of counts within it went past it.
const LARGEST_COUNT: i64 = (1 << 53) - 1;

/// Add each count and the cost `part` has to `total` (a field stays absent when neither has it;
/// a count stops at [`LARGEST_COUNT`]).
fn add_usage(total: &mut SpanUsage, part: &SpanUsage) {
    fn add_count(total: &mut Option<i64>, part: Option<i64>) {
        if let Some(part) = part {
            *total = Some(total.unwrap_or(0).saturating_add(part).min(LARGEST_COUNT));
        }
    }
    add_count(&mut total.input_tokens, part.input_tokens);
    add_count(&mut total.output_tokens, part.output_tokens);
    add_count(&mut total.cache_read_tokens, part.cache_read_tokens);
    add_count(&mut total.cache_creation_tokens, part.cache_creation_tokens);
    if let Some(cost) = part.cost_usd {
        total.cost_usd = Some(total.cost_usd.unwrap_or(0.0) + cost);
    }
}

/// A summed cost to a nano-dollar, as the OTLP mapping rounds a span's cost: a sum of doubles
/// showed binary noise (0.006751999999999999 for spans of 0.006752 in all). A sum too large to
/// scale is left as it is.
fn round_cost(cost: f64) -> f64 {
    let nanos = (cost * 1e9).round();
    if nanos.is_finite() {
        nanos / 1e9
    } else {
        cost
    }
}

/// The usage of a run that has no root stored yet (every span names a parent not stored: an
/// OpenTelemetry trace whose root span has not ended, so not been exported, or lives in a caller
/// that exports elsewhere): the sum over its `model` spans, as [`compute_rollup`] takes for the
/// fields a root does not carry. The spans must be in `started_at` order.
pub fn rootless_usage(spans_by_start: &[RollupSpan]) -> SpanUsage {
    sum_model_usage(spans_by_start)
}

/// True when any token count or the cost is present.
fn carries_usage(usage: &SpanUsage) -> bool {
    usage.input_tokens.is_some()
        || usage.output_tokens.is_some()
        || usage.cache_read_tokens.is_some()
        || usage.cache_creation_tokens.is_some()
        || usage.cost_usd.is_some()
}

/// Whether a span is a `model` span that reports usage.
fn reports_model_usage(span: &RollupSpan) -> bool {
    span.kind == SpanKind::Model && carries_usage(&span.usage)
}

/// Which of the usage fields (four counts and the cost) a span reports, one bit each.
fn usage_field_set(usage: &SpanUsage) -> u8 {
    [
        usage.input_tokens.is_some(),
        usage.output_tokens.is_some(),
        usage.cache_read_tokens.is_some(),
        usage.cache_creation_tokens.is_some(),
        usage.cost_usd.is_some(),
    ]
    .into_iter()
    .enumerate()
    .fold(
        0,
        |set, (bit, present)| if present { set | (1 << bit) } else { set },
    )
}

/// Which `model` spans a run's usage is summed over (see the module doc): each reporting model
/// span with no reporting model span above it; unless every one of the nearest reporting model
/// spans below it reports each usage field it reports, and one of them more: then those are taken
/// the same way instead of it (they cover everything it says, and know more). Model spans that
/// report nothing count nothing. Whole spans are counted, so a field is never taken from a
/// wrapper and its inner span both, nor from neither.
fn counted_model_usage(spans: &[RollupSpan]) -> Vec<Option<SpanUsage>> {
    let mut counted: Vec<Option<SpanUsage>> = vec![None; spans.len()];
    let reporting: Vec<usize> = (0..spans.len())
        .filter(|&index| reports_model_usage(&spans[index]))
        .collect();
    if reporting.len() < 2 {
        for index in reporting {
            counted[index] = Some(spans[index].usage.clone());
        }
        return counted;
    }
    let nearest = nearest_reporting_model_above(spans);
    let mut below: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut to_visit = Vec::new();
    for &index in &reporting {
        match nearest[index] {
            Some(above) => below.entry(above).or_default().push(index),
            None => to_visit.push(index),
        }
    }
    while let Some(index) = to_visit.pop() {
        let own = usage_field_set(&spans[index].usage);
        match below.get(&index) {
            Some(inner)
                if inner.iter().all(|&inner| {
                    let theirs = usage_field_set(&spans[inner].usage);
                    theirs & own == own
                }) && inner
                    .iter()
                    .any(|&inner| usage_field_set(&spans[inner].usage) != own) =>
            {
                to_visit.extend(inner);
            }
            _ => counted[index] = Some(spans[index].usage.clone()),
        }
    }
    let calls = calls_stood_for(spans, &counted, &nearest);
    count_each_call_once(&calls, &mut counted);
    counted
}

/// The provider call each counted span stands for, when one is known: its own call id, else the
/// calls named by the reporting model spans it is counted in place of (below it, not counted).
/// A framework's span with no id around an instrumentation's span with id X stands for X, so a
/// third copy of X beside them (another instrumentation that does not nest) counts once too.
/// One that is also counted in place of a span without an id may hold a call besides X.
fn calls_stood_for<'a>(
    spans: &'a [RollupSpan],
    counted: &[Option<SpanUsage>],
    nearest: &[Option<usize>],
) -> Vec<CallsStoodFor<'a>> {
    let call_id = |index: usize| spans[index].call_id.as_deref().filter(|id| !id.is_empty());
    let mut calls: Vec<CallsStoodFor<'a>> = (0..spans.len())
        .map(|index| match (counted[index].is_some(), call_id(index)) {
            (true, Some(id)) => CallsStoodFor::Own(id),
            _ => CallsStoodFor::Unknown,
        })
        .collect();
    let counted_above = counted_above(counted, nearest);
    for index in 0..spans.len() {
        if counted[index].is_some() || !reports_model_usage(&spans[index]) {
            continue;
        }
        let Some(at) = counted_above[index] else {
            continue;
        };
        if let unknown @ CallsStoodFor::Unknown = &mut calls[at] {
            *unknown = CallsStoodFor::Inner {
                ids: BTreeSet::new(),
                with_unnamed: false,
            };
        }
        if let CallsStoodFor::Inner { ids, with_unnamed } = &mut calls[at] {
            match call_id(index) {
                Some(id) => {
                    ids.insert(id);
                }
                None => *with_unnamed = true,
            }
        }
    }
    calls
}

/// For each span, the first counted span up its chain of nearest reporting model spans (the
/// one it is counted under), if any, found by [`first_above`].
fn counted_above(counted: &[Option<SpanUsage>], nearest: &[Option<usize>]) -> Vec<Option<usize>> {
    first_above(counted.len(), |at| nearest[at], |up| counted[up].is_some())
}

/// For each of `len` nodes, the first node up its chain (`up` of it, `up` of that, …) that
/// `is_answer`, if any. Each chain is walked once: the answer is the same for every node on a
/// walk up to where it is known, so it is stored for all of them (a chain walked again from
/// every node cost nodes x depth: seconds for a run of 8,000 nested spans). A chain that comes
/// back to a node on it (ids are the writers', so cycles happen) ends there, with no answer.
fn first_above(
    len: usize,
    up: impl Fn(usize) -> Option<usize>,
    is_answer: impl Fn(usize) -> bool,
) -> Vec<Option<usize>> {
    #[derive(Clone, Copy)]
    enum Known {
        Not,
        OnThisWalk,
        Is(Option<usize>),
    }
    let mut known = vec![Known::Not; len];
    let mut walk = Vec::new();
    for start in 0..len {
        if matches!(known[start], Known::Is(_)) {
            continue;
        }
        walk.clear();
        let mut at = start;
        let answer = loop {
            known[at] = Known::OnThisWalk;
            walk.push(at);
            let Some(next) = up(at) else {
                break None;
            };
            if is_answer(next) {
                break Some(next);
            }
            match known[next] {
                Known::Is(answer) => break answer,
                Known::OnThisWalk => break None,
                Known::Not => at = next,
            }
        };
        for &index in &walk {
            known[index] = Known::Is(answer);
        }
    }
    known
        .into_iter()
        .map(|known| match known {
            Known::Is(answer) => answer,
            Known::Not | Known::OnThisWalk => None,
        })
        .collect()
}

/// What [`calls_stood_for`] knows of one span.
#[derive(Debug, Clone, PartialEq)]
enum CallsStoodFor<'a> {
    /// Not counted, or no call id at or below it.
    Unknown,
    /// Counted, and the call id is its own.
    Own(&'a str),
    /// Counted in place of model spans below it that name these calls, and (`with_unnamed`)
    /// of at least one that names none.
    Inner {
        ids: BTreeSet<&'a str>,
        with_unnamed: bool,
    },
}

impl CallsStoodFor<'_> {
    /// The one call a counted span stands for, when it stands for exactly one known call.
    fn single(&self) -> Option<&str> {
        match self {
            CallsStoodFor::Own(id) => Some(id),
            CallsStoodFor::Inner {
                ids,
                with_unnamed: false,
            } if ids.len() == 1 => ids.first().copied(),
            CallsStoodFor::Inner { .. } | CallsStoodFor::Unknown => None,
        }
    }

    /// The calls of a span counted in place of several (or of one and an unnamed one): its
    /// usage is their sum, so another copy of one of them is already in it.
    fn several(&self) -> impl Iterator<Item = &str> {
        let ids = match self {
            CallsStoodFor::Inner { ids, with_unnamed } if ids.len() > 1 || *with_unnamed => {
                Some(ids.iter().copied())
            }
            _ => None,
        };
        ids.into_iter().flatten()
    }
}

/// Of the counted model spans that name one provider call (the same [`RollupSpan::call_id`]),
/// count one: two instrumentations that see one call side by side rather than nested (the
/// Anthropic SDK's own `anthropic.messages.create` span beside Traceloop's `anthropic.chat`,
/// which does not make itself current) each report its usage, and the run counted it twice
/// (an audit). The one counted reports the most usage fields (on a tie, the first to start),
/// and takes each field it lacks from the others (one reports the cost, another the cache
/// counts: the call has both, once). A span counted in place of inner spans of several calls
/// (or of one named and one unnamed) holds their sum, so a copy of one of those calls elsewhere
/// is left out and lends it nothing (a field only that copy reported is lost: never counted
/// twice is the rule that wins). Two such spans whose calls overlap both count (the overlap
/// twice): neither sum can be split.
fn count_each_call_once(calls: &[CallsStoodFor<'_>], counted: &mut [Option<SpanUsage>]) {
    let within_several: HashSet<&str> = calls.iter().flat_map(CallsStoodFor::several).collect();
    let mut kept: HashMap<&str, usize> = HashMap::new();
    for index in 0..calls.len() {
        let Some(call_id) = calls[index].single() else {
            continue;
        };
        if within_several.contains(&call_id) {
            counted[index] = None;
            continue;
        }
        let Some(usage) = counted[index].take() else {
            continue;
        };
        let Some(&first) = kept.get(call_id) else {
            kept.insert(call_id, index);
            counted[index] = Some(usage);
            continue;
        };
        let held = counted[first].take().unwrap_or_default();
        let (at, winner, filler) =
            if usage_field_set(&usage).count_ones() > usage_field_set(&held).count_ones() {
                kept.insert(call_id, index);
                (index, usage, held)
            } else {
                (first, held, usage)
            };
        counted[at] = Some(fill_missing_fields(winner, &filler));
    }
}

/// `usage` with each count and cost it lacks taken from `other`.
fn fill_missing_fields(usage: SpanUsage, other: &SpanUsage) -> SpanUsage {
    SpanUsage {
        input_tokens: usage.input_tokens.or(other.input_tokens),
        output_tokens: usage.output_tokens.or(other.output_tokens),
        cache_read_tokens: usage.cache_read_tokens.or(other.cache_read_tokens),
        cache_creation_tokens: usage.cache_creation_tokens.or(other.cache_creation_tokens),
        cost_usd: usage.cost_usd.or(other.cost_usd),
        model: usage.model.or_else(|| other.model.clone()),
    }
}

/// The field-wise sum of what [`counted_model_usage`] counts (see the module doc); a field stays
/// absent when nothing counted has it.
fn sum_model_usage(spans: &[RollupSpan]) -> SpanUsage {
    let mut total = SpanUsage::default();
    for usage in counted_model_usage(spans).into_iter().flatten() {
        add_usage(&mut total, &usage);
    }
    total.cost_usd = total.cost_usd.map(round_cost);
    total
}

/// For each span, its nearest ancestor (within `spans`) that is a `model` span reporting usage
/// and may record the same provider call, found by [`first_above`] (a parent id that is not a
/// span of `spans` ends the chain). Two kinds of evidence say a nested model span is a call of
/// its own, not a second instrumentation's copy of the one above it, whose usage it would
/// otherwise be taken for (an audit: a Google ADK run counted 100 of 400 input tokens):
/// - a unit of agent work between them (a tool call, a subagent, a turn, a job): the agent's
///   model → tool → model loop, a tool that calls a model;
/// - the two name different provider calls (response ids): Google ADK hangs its later
///   `call_llm` spans under the first, each with its own response id.
fn nearest_reporting_model_above(spans: &[RollupSpan]) -> Vec<Option<usize>> {
    let by_id = index_by_span_id(spans);
    let separates_calls = |span: &RollupSpan| {
        matches!(
            span.kind,
            SpanKind::Tool | SpanKind::Subagent | SpanKind::Turn | SpanKind::Cron
        )
    };
    let nearest = first_above(
        spans.len(),
        |at| {
            spans[at]
                .parent_span_id
                .as_deref()
                .and_then(|id| by_id.get(id).copied())
                .filter(|&parent| !separates_calls(&spans[parent]))
        },
        |parent| reports_model_usage(&spans[parent]),
    );
    // A span naming a call other than the one above it looks further up, past it: one whose
    // call it may be is a framework's span around both (an aggregate with no id, say), which
    // must still stand for it, or the call counted twice (a review's finding). At most
    // `MOST_CALL_HOPS` spans are passed over (chains of distinct calls are the writers' ids:
    // walking every one to its top cost nodes x depth); past that the span is a call of its own.
    let call_id = |index: usize| spans[index].call_id.as_deref().filter(|id| !id.is_empty());
    (0..spans.len())
        .map(|index| {
            let Some(own) = call_id(index) else {
                return nearest[index];
            };
            let mut above = nearest[index];
            for _ in 0..MOST_CALL_HOPS {
                match above {
                    Some(at) if call_id(at).is_some_and(|theirs| theirs != own) => {
                        above = nearest[at];
                    }
                    _ => return above,
                }
            }
            None
        })
        .collect()
}

/// The most model spans naming other calls that a span's look for the span above it that may
/// be its call passes over (see [`nearest_reporting_model_above`]).
const MOST_CALL_HOPS: usize = 64;

/// Each span's index by its id (a repeated id: the last span with it).
fn index_by_span_id(spans: &[RollupSpan]) -> HashMap<&str, usize> {
    spans
        .iter()
        .enumerate()
        .map(|(index, span)| (span.span_id.as_str(), index))
        .collect()
}

/// For each span, its nearest ancestor (within `spans`) that `is_answer`, up the parent ids
/// ([`first_above`]; a parent id that is not a span of `spans` ends the chain).
fn first_ancestor(spans: &[RollupSpan], is_answer: impl Fn(usize) -> bool) -> Vec<Option<usize>> {
    let by_id = index_by_span_id(spans);
    first_above(
        spans.len(),
        |at| {
            spans[at]
                .parent_span_id
                .as_deref()
                .and_then(|id| by_id.get(id).copied())
        },
        is_answer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::types::JsonObject;

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

    /// Summed counts stop at 2^53 - 1, the bound every count of the API keeps.
    #[test]
    fn summed_counts_stay_within_the_apis_bound() {
        let mut root = span("root", None, 1);
        root.is_root = true;
        let model = |id: &str| {
            let mut model = span(id, Some("root"), 2);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(LARGEST_COUNT);
            model.usage.output_tokens = Some(1);
            model
        };
        let rollup = compute_rollup(&[root, model("a"), model("b")]).expect("a rollup");
        assert_eq!(rollup.input_tokens, Some(LARGEST_COUNT));
        assert_eq!(rollup.output_tokens, Some(2));
    }

    /// An OTLP run with two roots (a service called twice by a caller that exports elsewhere)
    /// counts both calls: each root's own usage, or its model spans' when it carries none. A run
    /// of the reference's origins keeps the first root's rule, as its fixtures pin.
    #[test]
    fn an_otlp_run_with_several_roots_counts_every_root() {
        let otlp = |mut span: RollupSpan| {
            span.origin = SpanOrigin::Otlp;
            span
        };
        let mut first = otlp(span("call-1", None, 1));
        first.is_root = true;
        let mut model = otlp(span("m1", Some("call-1"), 2));
        model.kind = SpanKind::Model;
        model.usage.input_tokens = Some(1_000);
        model.usage.cost_usd = Some(0.25);
        let mut second = otlp(span("call-2", None, 3));
        second.is_root = true;
        second.usage.input_tokens = Some(5_000);
        second.usage.output_tokens = Some(500);
        second.usage.cost_usd = Some(0.5);
        // Its model span is already in the root's own totals: not counted again.
        let mut inner = otlp(span("m2", Some("call-2"), 4));
        inner.kind = SpanKind::Model;
        inner.usage.input_tokens = Some(5_000);
        // A model span below no stored root still counts.
        let mut stray = otlp(span("m3", Some("gone"), 5));
        stray.kind = SpanKind::Model;
        stray.usage.input_tokens = Some(7);
        let spans = vec![first, model, second, inner, stray];
        let rollup = compute_rollup(&spans).expect("a rollup");
        assert_eq!(rollup.name, "call-1");
        assert_eq!(rollup.input_tokens, Some(6_007));
        assert_eq!(rollup.output_tokens, Some(500));
        assert_eq!(rollup.cost_usd, Some(0.75));
        assert_eq!(rollup.span_count, 5);

        let native: Vec<RollupSpan> = spans
            .into_iter()
            .map(|mut span| {
                span.origin = SpanOrigin::Session;
                span
            })
            .collect();
        // (The first root carries nothing, so every model span of the run fills it in.)
        let rollup = compute_rollup(&native).expect("a rollup");
        assert_eq!(rollup.input_tokens, Some(6_007));
        assert_eq!(rollup.output_tokens, None);
        assert_eq!(rollup.cost_usd, Some(0.25));
    }

    /// One call seen by two instrumentations counts once in a run with several roots, when
    /// the copies hang from different roots or from no stored root (an audit: an OTLP root
    /// with no usage at all doubled the run's totals).
    #[test]
    fn one_call_counts_once_across_several_roots() {
        let otlp_root = |id: &str, at: i64| {
            let mut root = span(id, None, at);
            root.origin = SpanOrigin::Otlp;
            root.is_root = true;
            root
        };
        let copy = |id: &str, parent: &str| {
            let mut model = span(id, Some(parent), 2);
            model.origin = SpanOrigin::Otlp;
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(100);
            model.usage.output_tokens = Some(10);
            model.call_id = Some("resp_1".into());
            model
        };
        let one_root = vec![
            otlp_root("agent-a", 1),
            copy("m1", "agent-a"),
            copy("m2", "not-stored"),
        ];
        let single = compute_rollup(&one_root).expect("a rollup");
        assert_eq!(
            (single.input_tokens, single.output_tokens),
            (Some(100), Some(10))
        );
        let mut two_roots = one_root.clone();
        two_roots.push(otlp_root("agent-b", 3));
        let double = compute_rollup(&two_roots).expect("a rollup");
        assert_eq!(
            (double.input_tokens, double.output_tokens),
            (Some(100), Some(10))
        );
        let apart = vec![
            otlp_root("agent-a", 1),
            copy("m1", "agent-a"),
            otlp_root("agent-b", 3),
            copy("m2", "agent-b"),
        ];
        let apart = compute_rollup(&apart).expect("a rollup");
        assert_eq!(
            (apart.input_tokens, apart.output_tokens),
            (Some(100), Some(10))
        );
    }

    /// Two instrumentations beside each other record one call (the Anthropic SDK's own span and
    /// Traceloop's, siblings under the agent, both with the call's usage and response id): it
    /// counted twice. One call id counts once, the span reporting more fields kept; spans of
    /// other calls, or with no id, still add up.
    #[test]
    fn model_spans_that_name_one_call_count_once() {
        let root = span("root", None, 1);
        let model = |id: &str, call: Option<&str>, input: i64, cost: Option<f64>| {
            let mut model = span(id, Some("root"), 2);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(input);
            model.usage.cost_usd = cost;
            model.call_id = call.map(str::to_owned);
            model
        };
        let mut cached = model("cached", Some("msg_3"), 1_000, None);
        cached.usage.cache_read_tokens = Some(600);
        cached.usage.output_tokens = Some(20);
        let spans = [
            root,
            model("sdk", Some("msg_1"), 100, None),
            model("traceloop", Some("msg_1"), 100, Some(0.5)),
            model("second", Some("msg_2"), 10, Some(0.25)),
            model("anonymous", None, 1, None),
            model("blank", Some(""), 1, None),
            // One call, its cost on one copy and its cache counts on the other: both count.
            model("priced", Some("msg_3"), 1_000, Some(0.125)),
            cached,
        ];
        let fields = compute_rollup(&spans).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(1_112));
        assert_eq!(fields.cost_usd, Some(0.875));
        assert_eq!(fields.cache_read_tokens, Some(600));
        assert_eq!(fields.output_tokens, Some(20));
    }

    /// The models' cost sum is rounded to a nano-dollar (it showed binary noise:
    /// 0.006751999999999999); a sum too large to scale stays as it is.
    #[test]
    fn a_summed_cost_has_no_binary_noise() {
        let model = |id: &str, cost: f64| {
            let mut model = span(id, Some("root"), 2);
            model.kind = SpanKind::Model;
            model.usage.cost_usd = Some(cost);
            model
        };
        let spans = [span("root", None, 1), model("a", 0.1), model("b", 0.2)];
        assert_ne!(0.1 + 0.2, 0.3);
        assert_eq!(compute_rollup(&spans).and_then(|f| f.cost_usd), Some(0.3));
        let spans = [span("root", None, 1), model("a", 1e300), model("b", 1e300)];
        assert_eq!(compute_rollup(&spans).and_then(|f| f.cost_usd), Some(2e300));
    }

    /// A framework's model span with no call id around an instrumentation's span of call X (the
    /// same fields, so the wrapper counts), and a third instrumentation's span of X beside them:
    /// the wrapper stands for X, so X counts once. A wrapper around two calls holds both, so a
    /// copy of either elsewhere counts nothing more.
    #[test]
    fn a_wrapper_counted_for_an_inner_call_stands_for_that_call() {
        let model = |id: &str, parent: &str, call: Option<&str>, input: i64| {
            let mut model = span(id, Some(parent), 2);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(input);
            model.call_id = call.map(str::to_owned);
            model
        };
        let spans = [
            span("root", None, 1),
            model("framework", "root", None, 100),
            model("openai", "framework", Some("chatcmpl-1"), 100),
            model("traceloop", "root", Some("chatcmpl-1"), 100),
            model("other-call", "root", Some("chatcmpl-2"), 7),
        ];
        let fields = compute_rollup(&spans).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(107));

        let spans = [
            span("root", None, 1),
            model("batch", "root", None, 30),
            model("first", "batch", Some("a"), 10),
            model("second", "batch", Some("b"), 20),
            model("copy-of-b", "root", Some("b"), 20),
            model("unrelated", "root", Some("c"), 1),
        ];
        let fields = compute_rollup(&spans).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(31));

        // A wrapper around call X and a call without an id holds both: the copy of X beside it
        // counts nothing more, and takes nothing from the wrapper (a review found the wrapper's
        // 100 replaced by the copy's 60).
        let mut priced = model("priced-copy", "root", Some("x"), 60);
        priced.usage.cost_usd = Some(0.5);
        let spans = [
            span("root", None, 1),
            model("wrapper", "root", None, 100),
            model("named", "wrapper", Some("x"), 60),
            model("unnamed", "wrapper", None, 40),
            priced,
        ];
        let fields = compute_rollup(&spans).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(100));
        assert_eq!(fields.cost_usd, None);

        // Parents that point at each other (ids are the writers'): the walks up end.
        let spans = [
            span("root", None, 1),
            model("x", "y", Some("p"), 1),
            model("y", "x", Some("q"), 2),
        ];
        assert!(compute_rollup(&spans).is_some());
    }

    /// A model span below another is a call of its own when they name different provider calls
    /// (Google ADK hangs its later `call_llm` spans under the first) or when a unit of agent
    /// work sits between them (model → tool → model): an audit's ADK run counted 100 of 400
    /// input tokens. The same call named twice, nested, still counts once.
    #[test]
    fn nested_model_spans_of_different_calls_all_count() {
        let model = |id: &str, parent: &str, call: Option<&str>, tokens: i64| {
            let mut model = span(id, Some(parent), 2);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(tokens);
            model.usage.output_tokens = Some(tokens / 5);
            model.call_id = call.map(str::to_owned);
            model
        };
        let mut agent = span("agent", None, 1);
        agent.kind = SpanKind::Subagent;
        let adk = [
            agent.clone(),
            model("llm-1", "agent", Some("resp-1"), 100),
            model("llm-2", "llm-1", Some("resp-2"), 300),
        ];
        let fields = compute_rollup(&adk).expect("a rollup");
        assert_eq!(
            (fields.input_tokens, fields.output_tokens),
            (Some(400), Some(80))
        );
        let tool = span("tool", Some("llm-1"), 3);
        let through_a_tool = [
            agent.clone(),
            model("llm-1", "agent", None, 1_000),
            tool,
            model("llm-2", "tool", None, 500),
        ];
        let fields = compute_rollup(&through_a_tool).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(1_500));
        let one_call_twice = [
            agent,
            model("framework", "agent", Some("resp-1"), 100),
            model("sdk", "framework", Some("resp-1"), 100),
        ];
        let fields = compute_rollup(&one_call_twice).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(100));
        // A framework's aggregate around two calls of their own stands for both: counted once.
        let aggregate = [
            span("agent", None, 1),
            model("aggregate", "agent", None, 400),
            model("llm-1", "aggregate", Some("resp-1"), 100),
            model("llm-2", "llm-1", Some("resp-2"), 300),
        ];
        let fields = compute_rollup(&aggregate).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(400));
    }

    /// Deep chains and long cycles of model spans with call ids (ids are the writers'): each
    /// chain is walked once, so these take milliseconds (a walk per span took seconds here).
    #[test]
    fn deep_chains_and_long_cycles_of_model_spans_with_ids_are_walked_once() {
        const DEPTH: usize = 30_000;
        let model = |index: usize, parent: Option<String>| {
            let mut model = span(&format!("m{index}"), parent.as_deref(), 2);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(1);
            model.call_id = Some(format!("call-{index}"));
            model
        };
        let mut chain = vec![span("root", None, 1)];
        chain.extend((0..DEPTH).map(|index| {
            let parent = if index == 0 {
                "root".to_owned()
            } else {
                format!("m{}", index - 1)
            };
            model(index, Some(parent))
        }));
        // Each names its own provider call, so each counts, however deep.
        let fields = compute_rollup(&chain).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(DEPTH as i64));
        let mut cycle = vec![span("root", None, 1)];
        cycle.extend(
            (0..DEPTH).map(|index| model(index, Some(format!("m{}", (index + 1) % DEPTH)))),
        );
        // Each span of the cycle names a call other than its parent's, so each counts.
        let fields = compute_rollup(&cycle).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(DEPTH as i64));
        // Without ids, no span of the cycle has a reporting model span above it that is not on
        // the cycle, so none is counted.
        let unnamed: Vec<RollupSpan> = cycle
            .into_iter()
            .map(|mut span| {
                span.call_id = None;
                span
            })
            .collect();
        let fields = compute_rollup(&unnamed).expect("a rollup");
        assert_eq!(fields.input_tokens, None);
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
    fn a_root_without_usage_sums_its_model_spans_and_nothing_else() {
        let root = span("root", None, 1);
        let mut model_a = span("a", Some("root"), 2);
        model_a.kind = SpanKind::Model;
        model_a.usage.input_tokens = Some(100);
        model_a.usage.cost_usd = Some(0.25);
        let mut model_b = span("b", Some("t"), 3);
        model_b.kind = SpanKind::Model;
        model_b.usage.input_tokens = Some(20);
        model_b.usage.output_tokens = Some(7);
        model_b.usage.cost_usd = Some(0.5);
        let mut tool = span("t", Some("root"), 4);
        tool.usage.input_tokens = Some(1_000);
        let fields = compute_rollup(&[root.clone(), model_a, model_b, tool]);
        let fields = fields.as_ref();
        assert_eq!(fields.and_then(|f| f.input_tokens), Some(120));
        assert_eq!(fields.and_then(|f| f.output_tokens), Some(7));
        assert_eq!(fields.and_then(|f| f.cache_read_tokens), None);
        assert_eq!(fields.and_then(|f| f.cost_usd), Some(0.75));
        // No model spans: usage stays absent, never an invented zero.
        let bare = compute_rollup(&[root]);
        assert_eq!(bare.and_then(|f| f.input_tokens), None);
    }

    /// Two instrumentations of one call (a framework's `chat` span around the provider SDK's,
    /// both reporting the tokens): only the outer one counts, also when a span sits between
    /// them, while model spans side by side (or under a tool) all count.
    #[test]
    fn a_model_span_inside_another_model_span_is_not_counted_again() {
        let root = span("root", None, 1);
        let model = |id: &str, parent: &str, started_at: i64, tokens: i64| {
            let mut model = span(id, Some(parent), started_at);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(tokens);
            model.usage.cost_usd = Some(tokens as f64);
            model
        };
        let outer = model("outer", "root", 2, 1_000);
        let inner = model("inner", "outer", 3, 1_000);
        let mut http = span("http", Some("inner"), 4);
        http.kind = SpanKind::Other;
        let innermost = model("innermost", "http", 5, 1_000);
        let tool = span("tool", Some("root"), 6);
        let beside = model("beside", "root", 7, 300);
        let under_tool = model("under-tool", "tool", 8, 20);
        let fields = compute_rollup(&[
            root, outer, inner, http, innermost, tool, beside, under_tool,
        ]);
        let fields = fields.as_ref();
        assert_eq!(fields.and_then(|f| f.input_tokens), Some(1_320));
        assert_eq!(fields.and_then(|f| f.cost_usd), Some(1_320.0));
        // A parent cycle (ids are the writers') ends instead of looping.
        let a = model("a", "b", 1, 5);
        let b = model("b", "a", 2, 7);
        let cyclic = compute_rollup(&[span("r", None, 0), a, b]);
        assert_eq!(cyclic.and_then(|f| f.input_tokens), None);
    }

    /// The OpenAI Agents SDK's `generation` span (prompt and completion tokens, a cost priced
    /// from them) around the OpenAI instrumentation's span of the same call, which also has the
    /// cached tokens (and the cheaper cost they make): the inner spans know more, so they are
    /// counted instead of the outer one (the run's cost was 9% high); an outer span that knows
    /// as much as the inner ones is still counted alone.
    #[test]
    fn inner_model_spans_that_report_more_fields_are_counted_instead_of_their_wrapper() {
        let model = |id: &str, parent: &str, input: i64, cached: Option<i64>, cost: f64| {
            let mut model = span(id, Some(parent), 1);
            model.kind = SpanKind::Model;
            model.usage.input_tokens = Some(input);
            model.usage.output_tokens = Some(30);
            model.usage.cache_read_tokens = cached;
            model.usage.cost_usd = Some(cost);
            model
        };
        let fields = compute_rollup(&[
            span("root", None, 0),
            model("generation-1", "root", 120, None, 3.6e-5),
            model("chat-1", "generation-1", 120, Some(40), 3.3e-5),
            model("generation-2", "root", 200, None, 6.0e-5),
            model("chat-2", "generation-2", 200, Some(64), 5.5e-5),
        ]);
        let fields = fields.as_ref();
        assert_eq!(fields.and_then(|f| f.input_tokens), Some(320));
        assert_eq!(fields.and_then(|f| f.cache_read_tokens), Some(104));
        let cost = fields.and_then(|f| f.cost_usd).unwrap_or_default();
        assert!((cost - 8.8e-5).abs() < 1e-12, "{cost}");
        // The outer one knows as much: it alone counts.
        let fields = compute_rollup(&[
            span("root", None, 0),
            model("outer", "root", 120, Some(40), 3.3e-5),
            model("inner", "outer", 120, Some(40), 3.3e-5),
        ]);
        assert_eq!(fields.and_then(|f| f.input_tokens), Some(120));
        // An inner span that does not report everything the wrapper does (a second call to a
        // model the price table lacks: no cost) leaves the wrapper counted whole: replacing it
        // would cost that call at nothing.
        let mut partial = model("chat-b", "generation-1", 80, None, 0.0);
        partial.usage.cost_usd = None;
        let fields = compute_rollup(&[
            span("root", None, 0),
            model("generation-1", "root", 200, None, 9.0e-5),
            model("chat-a", "generation-1", 120, Some(40), 3.3e-5),
            partial,
        ]);
        let fields = fields.as_ref();
        assert_eq!(fields.and_then(|f| f.input_tokens), Some(200));
        assert_eq!(fields.and_then(|f| f.cost_usd), Some(9.0e-5));
    }

    #[test]
    fn a_field_the_root_carries_wins_and_the_others_come_from_its_model_spans() {
        let mut root = span("root", None, 1);
        root.usage.cost_usd = Some(2.0);
        let mut model = span("m", Some("root"), 2);
        model.kind = SpanKind::Model;
        model.usage.input_tokens = Some(100);
        model.usage.cost_usd = Some(1.0);
        let fields = compute_rollup(&[root.clone(), model.clone()]);
        assert_eq!(fields.as_ref().and_then(|f| f.cost_usd), Some(2.0));
        assert_eq!(fields.and_then(|f| f.input_tokens), Some(100));

        // A root that reports its tokens but no cost (pydantic-ai's agent span, a Logfire root
        // with usage set on it): the tokens are the root's, the cost the model spans'.
        root.usage = SpanUsage {
            input_tokens: Some(30),
            output_tokens: Some(3),
            ..SpanUsage::default()
        };
        let fields = compute_rollup(&[root.clone(), model.clone()]);
        assert_eq!(fields.as_ref().and_then(|f| f.input_tokens), Some(30));
        assert_eq!(fields.as_ref().and_then(|f| f.output_tokens), Some(3));
        assert_eq!(fields.and_then(|f| f.cost_usd), Some(1.0));

        // A root that carries every field takes nothing from below.
        root.usage = SpanUsage {
            input_tokens: Some(30),
            output_tokens: Some(3),
            cache_read_tokens: Some(0),
            cache_creation_tokens: Some(0),
            cost_usd: Some(0.5),
            ..SpanUsage::default()
        };
        let fields = compute_rollup(&[root.clone(), model]);
        assert_eq!(fields.as_ref().and_then(|f| f.input_tokens), Some(30));
        assert_eq!(fields.and_then(|f| f.cost_usd), Some(0.5));
    }

    /// A framework's model span that reports nothing (LangChain's around a streamed call)
    /// around the provider instrumentor's span that has the counts: the call counts once, not
    /// zero times.
    #[test]
    fn a_model_span_inside_a_model_span_that_reports_nothing_is_counted() {
        let root = span("root", None, 1);
        let mut outer = span("outer", Some("root"), 2);
        outer.kind = SpanKind::Model;
        let mut inner = span("inner", Some("outer"), 3);
        inner.kind = SpanKind::Model;
        inner.usage.input_tokens = Some(500);
        inner.usage.output_tokens = Some(50);
        let fields = compute_rollup(&[root, outer, inner]);
        assert_eq!(fields.as_ref().and_then(|f| f.input_tokens), Some(500));
        assert_eq!(fields.and_then(|f| f.output_tokens), Some(50));
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

    /// A run with no root stored whose earliest span is a model call: every model call
    /// counts, not just the earliest one (it stands in for the root only for the run's name,
    /// start, end and outcome, as the reference's fallback does).
    #[test]
    fn a_run_without_a_root_whose_first_span_is_a_model_call_sums_every_call() {
        let mut first = span("q1", Some("agent"), 1);
        first.kind = SpanKind::Model;
        first.usage.input_tokens = Some(100);
        first.usage.output_tokens = Some(10);
        first.usage.cost_usd = Some(0.1);
        first.ended_at = Some(5);
        let mut second = span("q3", Some("agent"), 6);
        second.kind = SpanKind::Model;
        second.usage.input_tokens = Some(200);
        second.usage.output_tokens = Some(20);
        second.usage.cost_usd = Some(0.2);
        let mut tool = span("t", Some("agent"), 7);
        tool.usage.input_tokens = Some(5_000);
        let spans = [first, second, tool];
        let fields = compute_rollup(&spans).expect("a rollup");
        assert_eq!(fields.name, "q1");
        assert_eq!(fields.input_tokens, Some(300));
        assert_eq!(fields.output_tokens, Some(30));
        assert_eq!(fields.cost_usd, Some(0.3));
        // The same figures as the listing of the run awaiting its root.
        let listed = rootless_usage(&spans);
        assert_eq!(listed.input_tokens, fields.input_tokens);
        assert_eq!(listed.cost_usd, fields.cost_usd);
        // A non-model span first keeps the reference's rule: its own usage wins.
        let mut subagent = span("s", Some("agent"), 0);
        subagent.kind = SpanKind::Subagent;
        subagent.usage.input_tokens = Some(1_000);
        let mut with_subagent = vec![subagent];
        with_subagent.extend(spans);
        let fields = compute_rollup(&with_subagent).expect("a rollup");
        assert_eq!(fields.input_tokens, Some(1_000));
        assert_eq!(fields.output_tokens, Some(30));
    }

    #[test]
    fn no_root_falls_back_to_first_span_and_no_spans_to_none() {
        let fields = compute_rollup(&[span("a", Some(""), 5), span("b", Some("a"), 6)]);
        assert_eq!(fields.map(|f| f.name), Some("a".to_owned()));
        assert_eq!(compute_rollup(&[]), None);
    }

    /// The chain walk of `nearest_reporting_model_above`, each span walked on its own as it was
    /// before the walks were shared: the reference for the property below.
    fn nested_walking_each_chain(spans: &[RollupSpan]) -> Vec<bool> {
        let by_id: HashMap<&str, &RollupSpan> = spans
            .iter()
            .map(|span| (span.span_id.as_str(), span))
            .collect();
        spans
            .iter()
            .map(|span| {
                let mut parent = span.parent_span_id.as_deref();
                for _ in 0..spans.len() {
                    let Some(ancestor) = parent.and_then(|id| by_id.get(id)) else {
                        return false;
                    };
                    if ancestor.kind == SpanKind::Model && carries_usage(&ancestor.usage) {
                        return true;
                    }
                    if ancestor.kind != SpanKind::Model && ancestor.kind != SpanKind::Other {
                        return false;
                    }
                    parent = ancestor.parent_span_id.as_deref();
                }
                false
            })
            .collect()
    }

    proptest::proptest! {
        /// Shared walks answer what walking every chain on its own answers, on any forest of
        /// spans: cycles, self-parents, missing parents and repeated ids included.
        #[test]
        fn shared_chain_walks_answer_as_single_walks(
            shape in proptest::collection::vec(
                (0u8..12, proptest::option::of(0u8..14), 0u8..3, proptest::bool::ANY),
                0..40,
            )
        ) {
            let spans: Vec<RollupSpan> = shape
                .iter()
                .enumerate()
                .map(|(index, (id, parent, kind, reports))| {
                    let parent = parent.map(|parent| format!("s{parent}"));
                    let mut span = span(&format!("s{id}"), parent.as_deref(), index as i64);
                    span.kind = match kind {
                        0 => SpanKind::Model,
                        1 => SpanKind::Other,
                        _ => SpanKind::Tool,
                    };
                    if *reports {
                        span.usage.input_tokens = Some(1);
                    }
                    span
                })
                .collect();
            let shared: Vec<bool> = nearest_reporting_model_above(&spans)
                .iter()
                .map(Option::is_some)
                .collect();
            proptest::prop_assert_eq!(shared, nested_walking_each_chain(&spans));
        }

        /// The shared walks of `counted_above` answer what a walk from each span alone answers,
        /// on any links between spans (cycles and self-links included) and any counted set.
        #[test]
        fn counted_above_answers_as_single_walks(
            shape in proptest::collection::vec(
                (proptest::option::of(0usize..40), proptest::bool::ANY),
                0..40,
            )
        ) {
            let n = shape.len();
            let nearest: Vec<Option<usize>> = shape
                .iter()
                .map(|(up, _)| up.filter(|&up| up < n))
                .collect();
            let counted: Vec<Option<SpanUsage>> = shape
                .iter()
                .map(|(_, counted)| counted.then(SpanUsage::default))
                .collect();
            let single: Vec<Option<usize>> = (0..n)
                .map(|start| {
                    let mut at = start;
                    for _ in 0..=n {
                        let up = nearest[at]?;
                        if counted[up].is_some() {
                            return Some(up);
                        }
                        at = up;
                    }
                    None
                })
                .collect();
            proptest::prop_assert_eq!(counted_above(&counted, &nearest), single);
        }
    }
}
