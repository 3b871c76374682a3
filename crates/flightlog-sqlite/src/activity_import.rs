//! `import_spans`: whole spans from an importer (OTLP), stored idempotently in one write job.
//!
//! An OTLP exporter delivers finished spans in any order and batch and retries what it is unsure
//! of, so each span is an upsert with three cases, decided under the write lock:
//! - unknown span id: one `INSERT` creates it whole (the span-id filter proves most ids free;
//!   for the others the insert is an `INSERT … SELECT … WHERE` the id is in no span-id index,
//!   so no separate existence check), then its events. An open one that names a parent not
//!   stored, or ended, is a root until its completed copy comes (see [`stored_parent`]; one
//!   lookup of the parent, for open spans only);
//! - open span (started natively, or announced earlier as pending): completed in place — start
//!   kept, attrs merged, usage fields filled, the end written if the delivery has
//!   one. A span the same importer announced (same origin) takes the delivery's parent, name,
//!   kind, session and job, since the final copy describes it best (an announcement may lack the
//!   attributes its kind comes from); a span started natively keeps the identity its writer
//!   gave it. Only events it does not already hold are added (see [`events_to_add`]): each
//!   held event accounts for one delivered event of the same `ts` and type, the one with the
//!   same payload first, so a span announced and then delivered whole never doubles its events,
//!   distinct events sharing a millisecond and a type are all kept, and an event written
//!   natively with its own payload shape is not doubled by the exporter's copy;
//! - terminal span: its fields are written once and stay. A span this importer wrote is a
//!   repeated delivery: nothing is written, not even its events. A span ended natively before
//!   the exporter's copy came gets the events only the copy carries (matched as above), as a
//!   native append to an ended span would.
//!
//! Every write is change-logged exactly like a native one, so streams and cursors see imports.
//! Afterwards every touched run whose root is terminal is rolled up again: spans of a trace may
//! arrive after the root, and the rollup must include them (and be right once the last arrives).
//!
//! Capping, compression and attrs serialization happen on the caller's thread ([`prepare`]);
//! the writer thread only runs statements.

use std::borrow::Cow;
use std::collections::HashMap;

use flightlog_core::activity::pricing::{cost_usd, count_cache_into_input, TokenCounts};
use flightlog_core::activity::{
    cap_payload, CappedPayload, ImportRejection, ImportReport, ImportedAttrs, ImportedSpan,
    JsonObject, RollupSpan, SpanKind, SpanUsage, StoreError, COST_SOURCE_ATTR,
    COST_SOURCE_PRICE_TABLE, PRICE_TABLE_ATTR,
};
use flightlog_core::json_depth;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, OptionalExtension};
use serde_json::Value;

use crate::activity_write::{
    attrs_text, insert_event, log_change, note_new_span, register_span_id, rollup_run_key,
    run_key_or_new, span_key_of, store_rollup, writer_key_of, RollupIdentity,
};
use crate::database::WriteContext;
use crate::error::backend;
use crate::payload_codec::{CompressedPayload, PayloadCodec};
use crate::remote_callers;
use crate::rows::{parse_attrs, payload_from_row, StoredAttrs};
use crate::run_roots;

/// Events a span already holds: their payloads' JSON text by `(ts, event_type)`.
type HeldEvents = HashMap<(i64, String), Vec<String>>;

/// One event, capped and (maybe) compressed, ready for the writer.
pub(crate) struct PreparedEvent {
    ts: i64,
    event_type: String,
    payload: CappedPayload,
    compressed: Option<CompressedPayload>,
}

/// One imported span with its CPU work done.
pub(crate) struct PreparedSpan {
    /// The span; its `attrs` were moved into [`Self::attrs`].
    span: ImportedSpan,
    /// The attrs' JSON text (what completing an open span merges).
    attrs: String,
    /// The attrs as a new span's row stores them (packed when that is smaller).
    stored_attrs: StoredAttrs,
    events: Vec<PreparedEvent>,
    /// Why the span cannot be stored as given (attrs or a payload nested too deep): it is
    /// reported rejected and nothing of it is written.
    refusal: Option<String>,
}

/// Whether a stored run's detail was pruned and it holds no span now (its rollup row says
/// `detail_pruned = 1`, and nothing was written to it since; a run written to again natively,
/// rolled up yet or not, takes spans as any run), read once per run and delivery.
fn pruned_and_empty(
    ctx: &mut WriteContext<'_>,
    known: &mut HashMap<i64, bool>,
    run_key: i64,
) -> Result<bool, StoreError> {
    if let Some(pruned) = known.get(&run_key) {
        return Ok(*pruned);
    }
    let pruned = ctx
        .conn
        .prepare_cached(
            "SELECT 1 FROM activity_run_rollups o WHERE o.run_key = ?1 AND o.detail_pruned = 1 \
             AND NOT EXISTS (SELECT 1 FROM activity_spans s WHERE s.run_key = ?1)",
        )
        .and_then(|mut stmt| stmt.exists([run_key]))
        .map_err(backend)?;
    known.insert(run_key, pruned);
    Ok(pruned)
}

/// Cap and compress event payloads and serialize attrs, off the writer thread.
pub(crate) fn prepare(spans: Vec<ImportedSpan>, codec: &PayloadCodec) -> Vec<PreparedSpan> {
    spans
        .into_iter()
        .map(|mut span| {
            // The mapping of OTLP already keeps within the limit; this holds it for any caller.
            let refusal = match &span.attrs {
                ImportedAttrs::Object(attrs) => json_depth::check_object("attrs", Some(attrs)),
                ImportedAttrs::Encoded(_) => Ok(()),
            }
            .and_then(|()| {
                span.events
                    .iter()
                    .try_for_each(|event| json_depth::check_value("payload", Some(&event.payload)))
            })
            .err();
            let events = std::mem::take(&mut span.events)
                .into_iter()
                .map(|event| {
                    let payload = cap_payload(Some(&event.payload));
                    let compressed = codec.encode(&payload.json);
                    PreparedEvent {
                        ts: event.ts,
                        event_type: event.event_type,
                        payload,
                        compressed,
                    }
                })
                .collect();
            // SQLite stores a NaN as NULL: the span is held (and rolled up, see `RunSpans::New`)
            // as it will read back.
            span.usage.cost_usd = span.usage.cost_usd.filter(|cost| !cost.is_nan());
            let attrs = std::mem::take(&mut span.attrs).into_text();
            // Packing keeps a copy of the text, which only the rare completion of an open span
            // needs: the copy is the cheaper side (one allocation against a JSON parse there).
            let stored_attrs = StoredAttrs::pack(attrs.clone(), codec);
            PreparedSpan {
                span,
                attrs,
                stored_attrs,
                events,
                refusal,
            }
        })
        .collect()
}

/// What the span id already names in the database.
struct ExistingSpan {
    span_key: i64,
    run_key: i64,
    terminal: bool,
    /// Written by this importer (the span's origin is the delivery's), not natively.
    same_origin: bool,
    /// Stored as a root (no parent).
    root: bool,
    attrs: Option<StoredAttrs>,
}

fn existing_span(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    origin: &str,
) -> Result<Option<ExistingSpan>, StoreError> {
    ctx.statement(concat!(
        "SELECT span_key, run_key, outcome IS NOT NULL, origin = ?2, attrs, \
                 parent_span_id IS NULL FROM activity_spans WHERE span_key = ",
        span_key_of!("?1")
    ))
    .and_then(|stmt| {
        stmt.query_row([span_id, origin], |row| {
            Ok(ExistingSpan {
                span_key: row.get(0)?,
                run_key: row.get(1)?,
                terminal: row.get(2)?,
                same_origin: row.get(3)?,
                attrs: row.get(4)?,
                root: row.get(5)?,
            })
        })
        .optional()
    })
    .map_err(backend)
}

/// The parent a new span is stored under. An open span (announced before it ended) whose parent
/// is not stored, or has ended, is a root until its completed copy says where it belongs: an
/// announcement cannot say that its parent is remote (Logfire's pending span names the real
/// span's parent by id alone), and a span continued from a remote caller waiting under a parent
/// that never comes would leave its run without a root, so neither listed nor live, for as long
/// as it runs; under a caller's span that has ended (a fire-and-forget call, the caller
/// exporting here too) the run would show as ended while the work goes on. Parents announce
/// before their children (they start first), so a local parent is stored, and running, by
/// then; the completed copy sets the parent either way (see [`complete_open_span`]).
///
/// A span continued from a remote caller (a root, its caller's id in `remote_parent`) is stored
/// under that caller when the caller's span is already stored in the same run: the caller
/// exports here too, so the run is one tree, not two roots. Logfire marks the parent of a span
/// it starts after re-attaching a context as remote, though it is the same process's span (a
/// streamed call's usage record under its agent): an audit found such calls outside their
/// agent. A caller's span that is not stored (yet) leaves the span a root.
fn stored_parent<'s>(
    ctx: &mut WriteContext<'_>,
    span: &'s ImportedSpan,
    run_key: i64,
) -> Result<Option<&'s str>, StoreError> {
    match (&span.parent_span_id, &span.end, &span.remote_parent) {
        (Some(parent), None, _) if !parent_is_running(ctx, parent)? => Ok(None),
        (None, _, Some(remote)) if may_adopt(ctx, &remote.span_id, &span.span_id, run_key)? => {
            Ok(Some(remote.span_id.as_str()))
        }
        (parent, _, _) => Ok(parent.as_deref()),
    }
}

/// The kind `span` is stored with under `parent`. The OTLP mapping names an agent span `turn`
/// at the root and `subagent` below one (docs/otlp.md), judging by the parent it was given; a
/// span [`stored_parent`] makes a root is named as a root, and one it stores under its remote
/// parent gets the kind the mapping gave it for there.
fn kind_of<'s>(span: &'s ImportedSpan, parent: Option<&str>) -> Cow<'s, SpanKind> {
    match (&span.remote_parent, parent, &span.kind) {
        (Some(remote), Some(_), _) if span.parent_span_id.is_none() => {
            Cow::Borrowed(&remote.kind_under_it)
        }
        (_, None, SpanKind::Subagent) => Cow::Owned(SpanKind::Turn),
        _ => Cow::Borrowed(&span.kind),
    }
}

/// How far up from a remote parent [`may_adopt`] looks for the span itself: one indexed lookup
/// a step, for spans whose parent is flagged remote only (a few milliseconds at most), and
/// deeper than agent traces nest (64 left the callee of a 70-span-deep caller a root).
const MAX_ADOPTION_WALK: usize = 256;

/// Whether the span `own_id` may be stored under its remote parent `parent_id`: the parent is
/// stored in the run `run_key`, and is not below the span itself (a child delivered earlier, or
/// a pending span's descendant, named as its remote parent: the run would have no root). The
/// walk up stops at a root, at a span of another run or not stored, or after
/// [`MAX_ADOPTION_WALK`] steps (then the span is left a root).
pub(crate) fn may_adopt(
    ctx: &mut WriteContext<'_>,
    parent_id: &str,
    own_id: &str,
    run_key: i64,
) -> Result<bool, StoreError> {
    let mut at = parent_id.to_owned();
    for step in 0..MAX_ADOPTION_WALK {
        if at == own_id {
            return Ok(false);
        }
        if !ctx.keys.span_id_filter.may_be_taken(&at) {
            // The parent itself must be stored; an ancestor that is not ends the walk.
            return Ok(step > 0);
        }
        let stored: Option<(i64, Option<String>)> = ctx
            .statement(concat!(
                "SELECT run_key, parent_span_id FROM activity_spans WHERE span_key = ",
                span_key_of!("?1")
            ))
            .and_then(|stmt| {
                stmt.query_row([&at], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(backend)?;
        match stored {
            Some((stored_run, _)) if stored_run != run_key => return Ok(step > 0),
            Some((_, Some(above))) => at = above,
            Some((_, None)) => return Ok(true),
            None => return Ok(step > 0),
        }
    }
    Ok(false)
}

/// Whether a span with this id is stored and has not ended (the span-id filter answers most
/// "not stored" without a query).
fn parent_is_running(ctx: &mut WriteContext<'_>, span_id: &str) -> Result<bool, StoreError> {
    if !ctx.keys.span_id_filter.may_be_taken(span_id) {
        return Ok(false);
    }
    ctx.statement(concat!(
        "SELECT outcome IS NULL FROM activity_spans WHERE span_key = ",
        span_key_of!("?1")
    ))
    .and_then(|stmt| stmt.query_row([span_id], |row| row.get(0)).optional())
    .map(|running| running.unwrap_or(false))
    .map_err(backend)
}

/// Insert the span if its id is free, under `parent` (see [`stored_parent`]); `Some(span_key)`
/// when it was inserted.
fn insert_new_span(
    ctx: &mut WriteContext<'_>,
    prepared: &PreparedSpan,
    parent: Option<&str>,
    run_key: i64,
    writer_key: i64,
    now: i64,
) -> Result<Option<i64>, StoreError> {
    let span = &prepared.span;
    // Roots get a heartbeat like a native start; an open (pending) span counts as alive from
    // the moment it is announced (by the server's clock), so a long-running trace delivered
    // late, or from a client whose clock is behind, is not swept at once: the root by the
    // stale sweep, a span of a run whose root is elsewhere by the leftover sweep.
    let last_heartbeat_at = match (parent, &span.end) {
        (Some(_), Some(_)) => None,
        (None, Some(_)) => Some(span.started_at),
        // Not the later of the two: a client whose clock is ahead kept its run "alive" until
        // its own clock's start time (an hour of skew, an hour open after the exporter died).
        (_, None) => Some(now),
    };
    let end = span.end.as_ref();
    // The id check: the writer's filter proves most new ids free; for the others the check is
    // part of the insert (one statement, not a lookup and then an insert). The new key is read
    // with `last_insert_rowid` (a `RETURNING` clause costs SQLite an ephemeral table per
    // execution).
    let proved_free = !ctx.keys.span_id_filter.may_be_taken(&span.span_id);
    macro_rules! insert_span_sql {
        ($values:expr) => {
            concat!(
                "INSERT INTO activity_spans (span_id, run_key, parent_span_id, name, kind, \
                 origin, session_id, job_name, attrs, started_at, ended_at, outcome, \
                 outcome_reason, input_tokens, output_tokens, cache_read_tokens, \
                 cache_creation_tokens, cost_usd, model, writer_key, last_heartbeat_at, \
                 call_id) ",
                $values
            )
        };
    }
    // A proved-free id takes the plain `VALUES` form: SQLite runs an `INSERT … SELECT` with a
    // statement journal (it could insert many rows and fail half-way), copying each page it
    // touches first.
    let sql = if proved_free {
        insert_span_sql!(
            "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20, ?21, ?22)"
        )
    } else {
        insert_span_sql!(concat!(
            "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, \
             ?18, ?19, ?20, ?21, ?22 WHERE ",
            span_key_of!("?1"),
            " IS NULL"
        ))
    };
    let inserted = ctx
        .statement(sql)
        .and_then(|stmt| {
            stmt.execute(params![
                span.span_id,
                run_key,
                parent,
                span.name,
                kind_of(span, parent).as_str(),
                span.origin.as_str(),
                span.session_id,
                span.job_name,
                prepared.stored_attrs,
                span.started_at,
                end.map(|end| end.ended_at),
                end.map(|end| end.outcome.as_str()),
                end.and_then(|end| end.reason.as_deref()),
                span.usage.input_tokens,
                span.usage.output_tokens,
                span.usage.cache_read_tokens,
                span.usage.cache_creation_tokens,
                span.usage.cost_usd,
                span.usage.model,
                writer_key,
                last_heartbeat_at,
                span.call_id,
            ])
        })
        .map_err(backend)?;
    if inserted == 0 {
        return Ok(None);
    }
    let span_key = ctx.conn.last_insert_rowid();
    register_span_id(ctx, &span.span_id, span_key)?;
    Ok(Some(span_key))
}

/// Complete (or refresh) an open span from a later delivery, whose parent is `parent` (see
/// [`stored_parent`]: an announcement delivered again whose parent is still unknown leaves the
/// span a root).
fn complete_open_span(
    ctx: &mut WriteContext<'_>,
    prepared: &PreparedSpan,
    parent: Option<&str>,
    update: &JsonObject,
    existing: ExistingSpan,
    now: i64,
) -> Result<(), StoreError> {
    let span = &prepared.span;
    let held = open_span_fields(ctx, existing.span_key)?;
    let held_attrs = parse_attrs(
        existing
            .attrs
            .and_then(|stored| stored.into_text(ctx.codec, ctx.conn))
            .as_deref(),
    );
    let mut attrs_now = held_attrs.clone();
    let (cost, input_tokens) = completed_cost(span, &held, update, &mut attrs_now);
    let attrs = StoredAttrs::pack(attrs_text(&attrs_now), ctx.codec);
    let end = span.end.as_ref();
    // ?18: the delivery's parent. A span this importer announced takes it, as it takes the
    // name: an announcement cannot say that its parent is remote (Logfire's pending span
    // names the real span's parent by id alone), while the OTLP mapping makes the delivery of
    // a span continued from a remote caller a root. A span that becomes a root while open
    // gets a root's heartbeat (as a root delivered whole would). A span started natively keeps
    // the parent its writer gave it. A delivery that leaves a span open renews its heartbeat.
    // The end is never before the kept start (the mapping clamps a delivery's end to the
    // delivery's own start, but the start kept may be later: a native start by the server's
    // clock, an announcement from a clock ahead), as a negative duration would skew every total
    // it enters. (SQLite's two-argument MAX is NULL when ?2 is: the end stays as it was.)
    ctx.statement(
            "UPDATE activity_spans SET attrs = ?1, \
             parent_span_id = CASE WHEN origin = ?13 THEN ?18 ELSE parent_span_id END, \
             name = CASE WHEN origin = ?13 THEN ?14 ELSE name END, \
             kind = CASE WHEN origin = ?13 THEN ?15 ELSE kind END, \
             session_id = CASE WHEN origin = ?13 THEN COALESCE(?16, session_id) \
               ELSE session_id END, \
             job_name = CASE WHEN origin = ?13 THEN COALESCE(?17, job_name) ELSE job_name END, \
             ended_at = COALESCE(MAX(?2, started_at), ended_at), outcome = COALESCE(?3, outcome), \
             outcome_reason = CASE WHEN ?3 IS NULL THEN outcome_reason ELSE ?4 END, \
             input_tokens = COALESCE(?5, input_tokens), output_tokens = COALESCE(?6, output_tokens), \
             cache_read_tokens = COALESCE(?7, cache_read_tokens), \
             cache_creation_tokens = COALESCE(?8, cache_creation_tokens), \
             cost_usd = COALESCE(?9, cost_usd), model = COALESCE(?10, model), \
             call_id = COALESCE(?19, call_id), \
             last_heartbeat_at = CASE \
               WHEN ?3 IS NULL THEN MAX(COALESCE(last_heartbeat_at, 0), ?11) \
               WHEN NOT (CASE WHEN origin = ?13 THEN ?18 IS NULL ELSE parent_span_id IS NULL END) \
                 THEN CASE WHEN origin = ?13 THEN NULL ELSE last_heartbeat_at END \
               ELSE COALESCE(last_heartbeat_at, started_at) END \
             WHERE span_key = ?12",
        )
        .and_then(|stmt| {
            stmt.execute(params![
                attrs,
                end.map(|end| end.ended_at),
                end.map(|end| end.outcome.as_str()),
                end.and_then(|end| end.reason.as_deref()),
                input_tokens,
                span.usage.output_tokens,
                span.usage.cache_read_tokens,
                span.usage.cache_creation_tokens,
                cost,
                span.usage.model,
                now,
                existing.span_key,
                span.origin.as_str(),
                span.name,
                kind_of(span, parent).as_str(),
                span.session_id,
                span.job_name,
                parent,
                span.call_id,
            ])
        })
        .map_err(backend)?;
    // A delivery that leaves the span open and changes none of its fields (an announcement
    // sent again, an exporter's retry) renewed its heartbeat only, which is not change-logged
    // (as a native heartbeat is not): logged, it was a change for every stream and cursor that
    // said nothing new.
    let changed = end.is_some()
        || attrs_now != held_attrs
        || open_span_fields(ctx, existing.span_key)? != held;
    if changed {
        log_change(ctx, existing.run_key, existing.span_key, None)?;
    }
    Ok(())
}

/// The fields of a stored span a delivery may change but its attrs (compared apart, parsed:
/// stored text may be compressed), as `open_span_fields(..)[HELD_*]`.
fn open_span_fields(
    ctx: &mut WriteContext<'_>,
    span_key: i64,
) -> Result<Vec<SqlValue>, StoreError> {
    ctx.statement(
        "SELECT input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, cost_usd, \
         parent_span_id, name, kind, session_id, job_name, ended_at, outcome, outcome_reason, \
         model, call_id, last_heartbeat_at IS NULL FROM activity_spans WHERE span_key = ?1",
    )
    .and_then(|stmt| {
        stmt.query_row([span_key], |row| {
            (0..16).map(|index| row.get::<_, SqlValue>(index)).collect()
        })
    })
    .map_err(backend)
}

/// The held token count at `index` of [`open_span_fields`] (0 to 3: input, output, cache read,
/// cache creation).
fn held_count(held: &[SqlValue], index: usize) -> Option<i64> {
    match held.get(index) {
        Some(SqlValue::Integer(count)) => Some(*count),
        _ => None,
    }
}

/// [`open_span_fields`]' index of `cost_usd`.
const HELD_COST: usize = 4;

/// The cost and the input count to write for an open span completed (or refreshed) by `span`
/// (`None`: the held one stays), with `attrs` (the held attrs) updated by the delivery's
/// `update` so they say where the cost came from:
/// - a reported cost in the delivery replaces the held one (a price-table version an earlier
///   priced delivery left is dropped with it);
/// - a cost the delivery priced from its own counts: a held cost that was not priced (reported
///   by an earlier delivery, or by the native writer) stays, with its source; otherwise the
///   counts the span ends up with, each the delivery's or else the one held, are priced at the
///   delivery's prices (priced from the delivery's counts alone, an announcement's 100,000
///   input tokens completed by a copy that carries only the output count cost 0.000006 USD for
///   0.015006 USD of tokens);
/// - no cost in the delivery: the held cost stays.
///
/// Priced, the input count is that of the counts priced: cached counts larger than the input
/// are added to it as the importer adds them within one delivery (an announcement's raw
/// Anthropic input of 100 beside a final copy's cache read of 5,000 was priced as no uncached
/// input at all).
fn completed_cost(
    span: &ImportedSpan,
    held: &[SqlValue],
    update: &JsonObject,
    attrs: &mut JsonObject,
) -> (Option<f64>, Option<i64>) {
    let held_cost = matches!(
        held.get(HELD_COST),
        Some(SqlValue::Real(_) | SqlValue::Integer(_))
    );
    let held_priced =
        attrs.get(COST_SOURCE_ATTR).and_then(Value::as_str) == Some(COST_SOURCE_PRICE_TABLE);
    let keep_held = held_cost && !held_priced && span.priced_at.is_some();
    for (key, value) in update {
        if keep_held && (key == COST_SOURCE_ATTR || key == PRICE_TABLE_ATTR) {
            continue;
        }
        attrs.insert(key.clone(), value.clone());
    }
    let input = span.usage.input_tokens;
    let Some(cost) = span.usage.cost_usd else {
        return (None, input);
    };
    let Some(prices) = span.priced_at else {
        if !update.contains_key(PRICE_TABLE_ATTR) {
            attrs.remove(PRICE_TABLE_ATTR);
        }
        return (Some(cost), input);
    };
    if keep_held {
        return (None, input);
    }
    let usage = &span.usage;
    let mut counts = TokenCounts {
        input: usage.input_tokens.or_else(|| held_count(held, 0)),
        output: usage.output_tokens.or_else(|| held_count(held, 1)),
        cache_read: usage.cache_read_tokens.or_else(|| held_count(held, 2)),
        cache_creation: usage.cache_creation_tokens.or_else(|| held_count(held, 3)),
    };
    count_cache_into_input(&mut counts);
    (Some(cost_usd(counts, &prices)), counts.input)
}

/// A span this importer stored as a root while it ran (an announcement whose parent was not
/// stored yet, or had ended), closed by the server since (its run closed, a stale sweep), whose
/// completed copy now names its parent: it moves under that parent, as the completed copy of a
/// span still open would have moved it (see [`complete_open_span`]). Its end and outcome stay
/// (written once); the move is change-logged, and a rollup made from it as a root is dropped
/// (the import rolls the run up again from its roots). Left a root was a run with two roots
/// for good, the parent's id the copy named thrown away, and the run's name and outcome taken
/// from the wrong root when their starts tied (an audit's finding). Only under a parent stored
/// in the same run and not below the span itself (the walk of [`may_adopt`]). Whether it
/// moved.
fn place_closed_root(
    ctx: &mut WriteContext<'_>,
    span: &ImportedSpan,
    parent: Option<&str>,
    existing: &ExistingSpan,
) -> Result<bool, StoreError> {
    let Some(parent) = parent else {
        return Ok(false);
    };
    if parent == span.span_id || !may_adopt(ctx, parent, &span.span_id, existing.run_key)? {
        return Ok(false);
    }
    ctx.statement(
        "UPDATE activity_spans SET parent_span_id = ?2, kind = ?3, last_heartbeat_at = NULL \
         WHERE span_key = ?1",
    )
    .and_then(|stmt| {
        stmt.execute(params![
            existing.span_key,
            parent,
            kind_of(span, Some(parent)).as_str()
        ])
    })
    .map_err(backend)?;
    log_change(ctx, existing.run_key, existing.span_key, None)?;
    remote_callers::forget_rollup_from(ctx, existing.run_key, existing.span_key)?;
    Ok(true)
}

/// The events a span already holds (payloads decoded, so a payload compressed with another
/// dictionary still matches its text). Only spans completed by a delivery are read this way.
fn held_events(
    ctx: &mut WriteContext<'_>,
    span_key: i64,
    codec: &PayloadCodec,
) -> Result<HeldEvents, StoreError> {
    let conn = ctx.conn;
    let rows: Vec<(i64, String, String)> = ctx
        .statement(
            "SELECT ts, event_type, payload, dict_id FROM activity_events WHERE span_key = ?1",
        )
        .and_then(|stmt| {
            stmt.query_map([span_key], |row| {
                let payload = payload_from_row(row, 2, 3, codec, conn)?;
                Ok((row.get(0)?, row.get(1)?, payload.get().to_owned()))
            })?
            .collect()
        })
        .map_err(backend)?;
    let mut held = HeldEvents::new();
    for (ts, event_type, payload) in rows {
        held.entry((ts, event_type)).or_default().push(payload);
    }
    Ok(held)
}

/// Which delivered events a span does not hold yet. Each held event accounts for one delivered
/// event of its `ts` and type: first one with the same payload, then (for held events whose
/// payload no delivered event repeats, such as one written natively in another shape) the
/// earliest delivered one left. The rest are new.
fn events_to_add(events: &[PreparedEvent], mut held: HeldEvents) -> Vec<bool> {
    let mut add = vec![true; events.len()];
    if held.is_empty() {
        return add;
    }
    let key = |event: &PreparedEvent| (event.ts, event.event_type.clone());
    for (index, event) in events.iter().enumerate() {
        if let Some(payloads) = held.get_mut(&key(event)) {
            if let Some(at) = payloads.iter().position(|held| *held == event.payload.json) {
                payloads.swap_remove(at);
                add[index] = false;
            }
        }
    }
    for (index, event) in events.iter().enumerate() {
        if add[index] {
            if let Some(payloads) = held.get_mut(&key(event)) {
                if payloads.pop().is_some() {
                    add[index] = false;
                }
            }
        }
    }
    add
}

fn insert_events(
    ctx: &mut WriteContext<'_>,
    span_key: i64,
    run_key: i64,
    events: &[PreparedEvent],
    add: Option<&[bool]>,
) -> Result<u64, StoreError> {
    let mut added = 0;
    for (index, event) in events.iter().enumerate() {
        // (A new span holds no events: nothing is checked then.)
        if add.is_some_and(|add| !add.get(index).copied().unwrap_or(true)) {
            continue;
        }
        insert_event(
            ctx,
            span_key,
            run_key,
            &event.event_type,
            &event.payload,
            event.compressed.as_ref(),
            event.ts,
        )?;
        added += 1;
    }
    Ok(added)
}

/// A delivery of a run's spans is its exporter's heartbeat: the run's open spans this importer
/// stored count as alive as of `now`. OTLP has no other way to say a long span is still
/// running, and `sweep_stale` judges a run by its root's heartbeat: a Logfire run whose root was
/// announced once and whose children kept arriving was closed as "writer went silent" while it
/// ran, and its real end then bounced off the write-once outcome. When the run has no open root
/// (its root's completed copy came first), its open children are renewed instead, for the
/// leftover sweep, which judges such a run by its open spans' heartbeats (while a root is open
/// nothing reads a child's, and renewing each would be a row write per pending span per
/// delivery). A run whose exporter died stops being delivered, so it still goes stale; a
/// pending span orphaned by one dead process in a trace that others keep exporting lives as
/// long as those deliveries go on. Not change-logged, as a native heartbeat is not. (A run new
/// in this delivery has nothing older to renew: its spans were stored now.)
fn renew_open_spans(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    origin: &str,
    now: i64,
) -> Result<(), StoreError> {
    ctx.statement(
        "UPDATE activity_spans INDEXED BY activity_spans_open_by_run \
         SET last_heartbeat_at = MAX(COALESCE(last_heartbeat_at, 0), ?2) \
         WHERE run_key = ?1 AND outcome IS NULL AND origin = ?3 \
           AND (parent_span_id IS NULL OR NOT EXISTS (SELECT 1 FROM activity_spans r \
             INDEXED BY activity_spans_open_by_run \
             WHERE r.run_key = ?1 AND r.outcome IS NULL AND r.parent_span_id IS NULL))",
    )
    .and_then(|stmt| stmt.execute(params![run_key, now, origin]))
    .map_err(backend)?;
    Ok(())
}

fn root_is_terminal(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<bool, StoreError> {
    ctx.statement(
        "SELECT EXISTS (SELECT 1 FROM activity_spans WHERE run_key = ?1 \
             AND parent_span_id IS NULL AND outcome IS NOT NULL)",
    )
    .and_then(|stmt| stmt.query_row([run_key], |row| row.get(0)))
    .map_err(backend)
}

/// How a touched run's rollup is computed at the end of the job.
enum RunSpans {
    /// The run was created by this job and holds exactly the spans it inserted (in insertion
    /// order): the rollup is computed from them, with no query.
    New(Vec<RollupSpan>),
    /// The run existed (or a span of it was completed rather than created): read it back.
    Stored,
}

/// The rollup's view of a span just stored under `parent`.
fn rollup_span(span: &ImportedSpan, parent: Option<&str>) -> RollupSpan {
    let end = span.end.as_ref();
    RollupSpan {
        span_id: span.span_id.clone(),
        parent_span_id: parent.map(str::to_owned),
        is_root: parent.is_none(),
        kind: kind_of(span, parent).into_owned(),
        origin: span.origin.clone(),
        name: span.name.clone(),
        session_id: span.session_id.clone(),
        job_name: span.job_name.clone(),
        started_at: span.started_at,
        ended_at: end.map(|end| end.ended_at),
        outcome: end.map(|end| end.outcome.clone()),
        outcome_reason: end.and_then(|end| end.reason.clone()),
        // The stored rollup rule reads no model (see `rollup_run_key`).
        usage: SpanUsage {
            model: None,
            ..span.usage.clone()
        },
        call_id: span.call_id.clone(),
    }
}

/// The write job: every span of one delivery, then the rollups of the runs it touched.
pub(crate) fn import_spans(
    ctx: &mut WriteContext<'_>,
    spans: &[PreparedSpan],
    writer: &str,
    now: i64,
    codec: &PayloadCodec,
) -> Result<ImportReport, StoreError> {
    // A delivery logs a change row for each new span and event: written several to a statement.
    crate::activity_write::defer_changes(ctx, |ctx| import_each(ctx, spans, writer, now, codec))
}

/// How stale a run's `imported_at` may be before a delivery rewrites it: the row is written at
/// most once in this long, not at every delivery.
const ARRIVAL_STAMP_MS: i64 = 10_000;

/// Stamp the run as written by a delivery at `now` (see schema version 15): the scheduled
/// retention and the hard ceiling keep a run that arrived within their window, whatever times
/// its exporter gave its spans. A stamp after `now` (a clock set back since) is rewritten.
fn note_arrival(ctx: &mut WriteContext<'_>, run_key: i64, now: i64) -> Result<(), StoreError> {
    ctx.conn
        .prepare_cached(
            "UPDATE activity_runs SET imported_at = ?2 WHERE run_key = ?1 \
             AND (COALESCE(imported_at, -9223372036854775807 - 1) < ?2 - ?3 \
                  OR imported_at > ?2)",
        )
        .and_then(|mut stmt| stmt.execute(params![run_key, now, ARRIVAL_STAMP_MS]))
        .map_err(backend)?;
    Ok(())
}

/// [`import_spans`]' work, each span in turn.
fn import_each(
    ctx: &mut WriteContext<'_>,
    spans: &[PreparedSpan],
    writer: &str,
    now: i64,
    codec: &PayloadCodec,
) -> Result<ImportReport, StoreError> {
    let mut report = ImportReport::default();
    // Touched runs in first-touch order, with how each one's rollup is computed and the origin
    // of the spans delivered for it.
    let mut touched: Vec<(i64, RunSpans, &str)> = Vec::new();
    let mut touched_at: HashMap<i64, usize> = HashMap::new();
    // Whether each stored run this delivery names had its detail pruned (read once a run).
    let mut pruned_runs: HashMap<i64, bool> = HashMap::new();
    // The runs this delivery wrote to (a span or an event stored, a span completed or renewed):
    // stamped as arrived. Not a run it only repeated ended spans of: a replayer sending one old
    // trace again and again would hold it from the retention for good (a review's finding).
    let mut written_runs: foldhash::HashSet<i64> = foldhash::HashSet::default();
    let writer_key = writer_key_of(ctx, writer)?;
    for prepared in spans {
        let span = &prepared.span;
        if let Some(reason) = &prepared.refusal {
            report.rejected.push(ImportRejection {
                span_id: span.span_id.clone(),
                reason: reason.clone(),
            });
            continue;
        }
        let (run_key, new_run) = run_key_or_new(ctx, &span.run_id)?;
        // A span of a run whose detail was pruned (an exporter's retry, or a replay, long
        // after): stored, it would be the run's only span, and the rollup read back from it
        // would replace the kept summary (its usage, cost and outcome) with this span's.
        if !new_run && pruned_and_empty(ctx, &mut pruned_runs, run_key)? {
            report.rejected.push(ImportRejection {
                span_id: span.span_id.clone(),
                reason: format!(
                    "run {:?} was pruned (its spans deleted, its rollup kept); a span \
                     delivered for it after that is not stored",
                    span.run_id
                ),
            });
            continue;
        }
        let at = *touched_at.entry(run_key).or_insert_with(|| {
            touched.push((
                run_key,
                if new_run {
                    RunSpans::New(Vec::new())
                } else {
                    RunSpans::Stored
                },
                span.origin.as_str(),
            ));
            touched.len() - 1
        });
        // (New spans are not added to the writer's span-key cache: an importer delivers a span
        // whole, so no later call of this batch looks it up; the insert cost a clone and a hash
        // per span.)
        let parent = stored_parent(ctx, span, run_key)?;
        if let Some(span_key) = insert_new_span(ctx, prepared, parent, run_key, writer_key, now)? {
            written_runs.insert(run_key);
            log_change(ctx, run_key, span_key, None)?;
            // Spans continued from this one in another service, delivered before it, come
            // under it (the rollup then reads the run back: a root of it moved). First, so
            // the writer knows the run's waiting callers before this span may join them.
            if remote_callers::adopt(ctx, run_key, new_run, &span.span_id)? > 0 {
                if let Some((_, run_spans, _)) = touched.get_mut(at) {
                    *run_spans = RunSpans::Stored;
                }
            }
            if parent.is_none() {
                remote_callers::note_awaiting(ctx, run_key, span_key, span.remote_parent.as_ref())?;
            }
            if !prepared.events.is_empty() {
                note_new_span(ctx, span_key);
            }
            report.events_added += insert_events(ctx, span_key, run_key, &prepared.events, None)?;
            report.created += 1;
            if let Some((_, RunSpans::New(run_spans), _)) = touched.get_mut(at) {
                run_spans.push(rollup_span(span, parent));
            }
        } else {
            let Some(existing) = existing_span(ctx, &span.span_id, span.origin.as_str())? else {
                return Err(StoreError::Corrupt(format!(
                    "span {:?} neither inserted nor found",
                    span.span_id
                )));
            };
            if existing.run_key != run_key {
                report.rejected.push(ImportRejection {
                    span_id: span.span_id.clone(),
                    reason: format!(
                        "span id {:?} already belongs to another run, not to {:?}: a span id \
                         is one span in the whole database",
                        span.span_id, span.run_id
                    ),
                });
                continue;
            }
            // A span of this run already stored (a repeat within the delivery): the run's
            // rows are no longer just the inserted ones.
            if let Some((_, run_spans, _)) = touched.get_mut(at) {
                *run_spans = RunSpans::Stored;
            }
            if existing.terminal
                && existing.same_origin
                && existing.root
                && span.end.is_some()
                && place_closed_root(ctx, span, parent, &existing)?
            {
                written_runs.insert(run_key);
                report.completed += 1;
                continue;
            }
            if existing.terminal {
                report.unchanged += 1;
                // Ended natively before the exporter's copy came: the span's fields are
                // written once and stay, but the events only the copy carries are added, as a
                // native append to an ended span would add them. A span this importer wrote is
                // a repeated delivery: nothing at all (the common case reads no events).
                if !existing.same_origin && !prepared.events.is_empty() {
                    let span_key = existing.span_key;
                    let add = events_to_add(&prepared.events, held_events(ctx, span_key, codec)?);
                    let added =
                        insert_events(ctx, span_key, run_key, &prepared.events, Some(&add))?;
                    if added > 0 {
                        written_runs.insert(run_key);
                    }
                    report.events_added += added;
                }
                continue;
            }
            // The delivery's attrs are text by now (see `prepare`); completing an open span is
            // the rare case, so they are parsed back here rather than kept as a map for all.
            let update: JsonObject =
                match flightlog_core::json_as_written::object_from_str(&prepared.attrs) {
                    Ok(update) => update,
                    Err(err) => {
                        report.rejected.push(ImportRejection {
                            span_id: span.span_id.clone(),
                            reason: format!("the span's attrs are not a JSON object: {err}"),
                        });
                        continue;
                    }
                };
            let span_key = existing.span_key;
            // The completed copy of a span this importer announced takes the copy's parent: a
            // root still waiting for its remote caller waits on.
            let awaits_caller = existing.same_origin && parent.is_none();
            complete_open_span(ctx, prepared, parent, &update, existing, now)?;
            written_runs.insert(run_key);
            if awaits_caller {
                remote_callers::note_awaiting(ctx, run_key, span_key, span.remote_parent.as_ref())?;
            }
            let add = events_to_add(&prepared.events, held_events(ctx, span_key, codec)?);
            report.events_added +=
                insert_events(ctx, span_key, run_key, &prepared.events, Some(&add))?;
            if span.end.is_some() {
                report.completed += 1;
            } else {
                report.refreshed += 1;
            }
        }
    }
    for (run_key, run_spans, origin) in touched {
        if written_runs.contains(&run_key) {
            note_arrival(ctx, run_key, now)?;
        }
        match run_spans {
            RunSpans::New(mut run_spans) => {
                // A new run holds just these spans: without a root among them it waits for one.
                match run_spans.iter().map(|span| span.started_at).min() {
                    Some(_) if run_spans.iter().any(|span| span.is_root) => {
                        run_roots::note_root_stored(ctx, run_key, true)?;
                    }
                    Some(earliest) => run_roots::note_child_stored(ctx, run_key, earliest, true)?,
                    None => {}
                }
                if run_spans
                    .iter()
                    .any(|span| span.is_root && span.outcome.is_some())
                {
                    // The stored order: by start, then insertion (a stable sort keeps it).
                    run_spans.sort_by_key(|span| span.started_at);
                    store_rollup(ctx, run_key, &run_spans, RollupIdentity::Refresh)?;
                    report.runs_rolled_up += 1;
                }
            }
            RunSpans::Stored => {
                // Spans may have come under a parent or become roots (a completed copy moves
                // an announced span): the run's place among those awaiting a root is re-read.
                run_roots::settle(ctx, run_key)?;
                renew_open_spans(ctx, run_key, origin, now)?;
                if root_is_terminal(ctx, run_key)? {
                    rollup_run_key(ctx, run_key, RollupIdentity::Refresh)?;
                    report.runs_rolled_up += 1;
                }
            }
        }
    }
    Ok(report)
}
