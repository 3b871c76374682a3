//! The activity store's writes, run by the writer thread inside the group transaction.
//!
//! Each function is one store call with the reference's semantics: it either completes or
//! returns an error (failing cleanly, before it wrote, or dirty, when the writer rolls the group
//! back and replays it with a savepoint around each job). Per-run `seq` is one past the run's
//! highest seq (its highest logged one, one seek on `(run_key, seq)`, or the highest the trim
//! deleted, whichever is larger; see `RUN_HIGH_SEQ_SQL`); `change_id` is one past the
//! highest id ever used (`flightlog_meta.change_id_floor` keeps it across prunes), so ids never
//! repeat even after the newest rows are pruned.

use std::collections::HashMap;
use std::sync::OnceLock;

use flightlog_core::activity::{
    compute_rollup, rootless_usage, CappedPayload, EndSpanInput, JsonObject, PruneResult,
    RollupSpan, SpanEventRow, SpanKind, SpanOrigin, SpanOutcome, SpanPatch, SpanRow, SpanUsage,
    StartSpanInput, StoreError,
};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::value::RawValue;

use crate::database::WriteContext;
use crate::error::{backend, is_constraint};
use crate::payload_codec::CompressedPayload;
use crate::payload_codec::PayloadCodec;
use crate::remote_callers;
use crate::rows::{parse_attrs, StoredAttrs};
use crate::run_roots;

/// How far behind the newest change id a terminal run's change rows are trimmed by `prune`
/// (the reference's distance; `SqliteConfig::change_log_retention` can change it).
pub(crate) const CHANGE_LOG_TRIM_DISTANCE: i64 = 100_000;

/// SQL for the span key of the span id bound at `$param` (a literal like `"?1"`): the recent
/// span-id index first, then the middle one, then the main one (schema versions 4 and 6); NULL
/// for an unknown id.
macro_rules! span_key_of {
    ($param:literal) => {
        concat!(
            "COALESCE((SELECT span_key FROM activity_span_ids_recent WHERE span_id = ",
            $param,
            "), (SELECT span_key FROM activity_span_ids_middle WHERE span_id = ",
            $param,
            "), (SELECT span_key FROM activity_span_ids WHERE span_id = ",
            $param,
            "))"
        )
    };
}
pub(crate) use span_key_of;

/// How many span ids the recent index holds before the writer merges it into the middle one.
/// The recent index stays small enough (~120 pages) that a commit's random inserts share its
/// pages; a merge inserts in id order, so it touches each page of the middle index at most once.
const RECENT_SPAN_IDS_MERGE_AT: i64 = 16_384;
/// The fewest and the most ids the middle index is kept at (see [`middle_target`]).
const MIDDLE_SPAN_IDS_MIN: i64 = RECENT_SPAN_IDS_MERGE_AT;
const MIDDLE_SPAN_IDS_MAX: i64 = 1 << 20;

/// The size the middle index is kept at, for a database of about `spans` spans.
///
/// Each merge of `R` recent ids costs about the middle index's pages (`M / E` for `M` ids, `E`
/// ids a page) plus the main-index pages of the key range it sweeps: `R` ids of the middle's
/// `M` cover `R / M` of the key space, so `(spans / E) * R / M` pages. The sum is smallest at
/// `M = sqrt(spans * R)`: 128 Ki ids at a million spans, where a merge then writes ~1,800
/// pages instead of the ~7,000 of a main index merged whole.
fn middle_target(spans: i64) -> i64 {
    let ideal = (spans.max(0) as f64 * RECENT_SPAN_IDS_MERGE_AT as f64).sqrt() as i64;
    ideal.clamp(MIDDLE_SPAN_IDS_MIN, MIDDLE_SPAN_IDS_MAX)
}

/// Whether a span id is already taken (by any run): the writer's filter proves most new ids
/// free (see `span_id_filter`); the others are looked up in the span-id indexes.
pub(crate) fn span_id_taken(ctx: &mut WriteContext<'_>, span_id: &str) -> Result<bool, StoreError> {
    if !ctx.keys.span_id_filter.may_be_taken(span_id) {
        return Ok(false);
    }
    ctx.statement(concat!("SELECT ", span_key_of!("?1"), " IS NOT NULL"))
        .and_then(|stmt| stmt.query_row([span_id], |row| row.get(0)))
        .map_err(backend)
}

/// Record a new span's id in the recent index, merging that index into the middle one when it
/// has grown to [`RECENT_SPAN_IDS_MERGE_AT`]. The caller checked that the id is free.
pub(crate) fn register_span_id(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    span_key: i64,
) -> Result<(), StoreError> {
    ctx.statement("INSERT INTO activity_span_ids_recent (span_id, span_key) VALUES (?1, ?2)")
        .and_then(|stmt| stmt.execute(params![span_id, span_key]))
        .map_err(backend)?;
    ctx.keys.span_id_filter.insert(span_id);
    let recent = match ctx.keys.recent_span_ids {
        Some(count) => count + 1,
        None => ctx
            .statement("SELECT COUNT(*) FROM activity_span_ids_recent")
            .and_then(|stmt| stmt.query_row([], |row| row.get(0)))
            .map_err(backend)?,
    };
    ctx.keys.recent_span_ids = Some(recent);
    if recent >= RECENT_SPAN_IDS_MERGE_AT {
        merge_recent_span_ids(ctx, recent)?;
        sweep_middle_span_ids(ctx, span_key)?;
    }
    Ok(())
}

/// Move every id of the recent index into the middle one, in id order, inside the current
/// transaction (so a crash leaves each id in exactly one index).
fn merge_recent_span_ids(ctx: &mut WriteContext<'_>, recent: i64) -> Result<(), StoreError> {
    let middle = middle_span_id_count(ctx)?;
    for sql in [
        "INSERT INTO activity_span_ids_middle (span_id, span_key) \
         SELECT span_id, span_key FROM activity_span_ids_recent ORDER BY span_id",
        "DELETE FROM activity_span_ids_recent",
    ] {
        ctx.statement(sql)
            .and_then(|stmt| stmt.execute([]))
            .map_err(backend)?;
    }
    ctx.keys.recent_span_ids = Some(0);
    ctx.keys.middle_span_ids = Some(middle + recent);
    Ok(())
}

/// How many ids the middle index holds (cached by the writer like the recent count).
fn middle_span_id_count(ctx: &mut WriteContext<'_>) -> Result<i64, StoreError> {
    if let Some(count) = ctx.keys.middle_span_ids {
        return Ok(count);
    }
    let count = ctx
        .statement("SELECT COUNT(*) FROM activity_span_ids_middle")
        .and_then(|stmt| stmt.query_row([], |row| row.get(0)))
        .map_err(backend)?;
    ctx.keys.middle_span_ids = Some(count);
    Ok(count)
}

/// Move the ids of the middle index above its target size (see [`middle_target`]; `newest_key`,
/// the newest span's key, bounds the span count) into the main index: the next ones in id order
/// after the writer's sweep cursor, so successive merges sweep the key space in turn and each
/// main-index page is rewritten about once per sweep. The cursor only spreads the work (any
/// range may move at any time), so it lives in the writer's memory and restarts at the lowest
/// id after a restart.
fn sweep_middle_span_ids(ctx: &mut WriteContext<'_>, newest_key: i64) -> Result<(), StoreError> {
    let middle = middle_span_id_count(ctx)?;
    let excess = middle - middle_target(newest_key);
    if excess <= 0 {
        return Ok(());
    }
    let cursor = std::mem::take(&mut ctx.keys.span_id_sweep_cursor);
    // The last id of the range: `excess` ids on from the cursor, or none when fewer are left:
    // the range then runs to the end (a BLOB sorts after every TEXT value in SQLite, so an empty
    // one bounds nothing), and the next sweep starts again from the lowest id.
    let last: Option<String> = ctx
        .statement(
            "SELECT span_id FROM activity_span_ids_middle WHERE span_id > ?1 \
             ORDER BY span_id LIMIT 1 OFFSET ?2",
        )
        .and_then(|stmt| {
            stmt.query_row(params![cursor, excess - 1], |row| row.get(0))
                .optional()
        })
        .map_err(backend)?;
    let upper = match &last {
        Some(last) => Value::Text(last.clone()),
        None => Value::Blob(Vec::new()),
    };
    let moved = ctx
        .statement(
            "INSERT INTO activity_span_ids (span_id, span_key) \
             SELECT span_id, span_key FROM activity_span_ids_middle \
             WHERE span_id > ?1 AND span_id <= ?2 ORDER BY span_id",
        )
        .and_then(|stmt| stmt.execute(params![cursor, upper]))
        .map_err(backend)?;
    ctx.statement("DELETE FROM activity_span_ids_middle WHERE span_id > ?1 AND span_id <= ?2")
        .and_then(|stmt| stmt.execute(params![cursor, upper]))
        .map_err(backend)?;
    ctx.keys.span_id_sweep_cursor = last.unwrap_or_default();
    ctx.keys.middle_span_ids = Some(middle - i64::try_from(moved).unwrap_or(0));
    Ok(())
}

/// The surrogate key of `name` in an interning table (`activity_runs`, `activity_writers`),
/// inserting it if new, and whether this call created the row. Interned rows are never deleted,
/// so the key is cached for good.
fn interned_key(
    conn: &Connection,
    cache: &mut crate::database::FastMap<String, i64>,
    insert_sql: &str,
    select_sql: &str,
    name: &str,
) -> Result<(i64, bool), StoreError> {
    if let Some(key) = cache.get(name) {
        return Ok((*key, false));
    }
    let inserted = conn
        .prepare_cached(insert_sql)
        .and_then(|mut stmt| stmt.execute([name]))
        .map_err(backend)?;
    let key: i64 = if inserted == 1 {
        conn.last_insert_rowid()
    } else {
        conn.prepare_cached(select_sql)
            .and_then(|mut stmt| stmt.query_row([name], |row| row.get(0)))
            .map_err(backend)?
    };
    cache.insert(name.to_owned(), key);
    Ok((key, inserted == 1))
}

/// The run's key, made if the run is new, and whether it is: created by this call, so every
/// span it will hold is one the caller inserts from here on.
pub(crate) fn run_key_or_new(
    ctx: &mut WriteContext<'_>,
    run_id: &str,
) -> Result<(i64, bool), StoreError> {
    let (run_key, new) = interned_key(
        ctx.conn,
        &mut ctx.keys.run_keys,
        "INSERT INTO activity_runs (run_id) VALUES (?1) ON CONFLICT(run_id) DO NOTHING",
        "SELECT run_key FROM activity_runs WHERE run_id = ?1",
        run_id,
    )?;
    if new {
        // Run rows are never deleted, so a run created just now (under the write lock) has no
        // change rows: its first seq is 1 without the seek for its highest one.
        ctx.keys.run_seq.insert(run_key, 0);
    }
    Ok((run_key, new))
}

/// A span key inserted just now has no events (a span's events are deleted with it when it is
/// pruned, and its key is new under the write lock): its first event gets index 0 without the
/// seek for the highest one. With the first-seq seed of a new run (`run_key_or_new`), the
/// writer thread's instructions per OTLP span went from 49,450 to 48,460 (callgrind,
/// `flightlog-loadgen otlp --spans 20000` against `--spans 60000`).
pub(crate) fn note_new_span(ctx: &mut WriteContext<'_>, span_key: i64) {
    ctx.keys.next_event_index.insert(span_key, 0);
}

fn existing_run_key(conn: &Connection, run_id: &str) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT run_key FROM activity_runs WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| row.get(0)).optional())
        .map_err(backend)
}

pub(crate) fn writer_key_of(ctx: &mut WriteContext<'_>, writer: &str) -> Result<i64, StoreError> {
    interned_key(
        ctx.conn,
        &mut ctx.keys.writer_keys,
        "INSERT INTO activity_writers (writer) VALUES (?1) ON CONFLICT(writer) DO NOTHING",
        "SELECT writer_key FROM activity_writers WHERE writer = ?1",
        writer,
    )
    .map(|(key, _)| key)
}

/// A run's highest seq (0 for none): its newest logged change's, or the highest one the change
/// log's trim deleted, whichever is larger (see schema version 13). Its next change takes the
/// seq after it.
pub(crate) const RUN_HIGH_SEQ_SQL: &str = "SELECT MAX(\
     COALESCE((SELECT seq FROM activity_changes WHERE run_key = ?1 ORDER BY seq DESC LIMIT 1), 0), \
     COALESCE((SELECT trimmed_seq FROM activity_runs WHERE run_key = ?1), 0))";

/// Append one change row; returns `(change_id, seq)`.
pub(crate) fn log_change(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    span_key: i64,
    event_index: Option<i64>,
) -> Result<(i64, i64), StoreError> {
    let high = match ctx.keys.run_seq.get(&run_key) {
        Some(seq) => *seq,
        None => ctx
            .statement(RUN_HIGH_SEQ_SQL)
            .and_then(|stmt| stmt.query_row([run_key], |row| row.get(0)))
            .map_err(backend)?,
    };
    let seq = high + 1;
    let change_id = match ctx.keys.next_change_id {
        Some(next) => next,
        None => next_change_id(ctx.conn)?,
    };
    let row = DeferredChange {
        change_id,
        run_key,
        seq,
        span_key,
        event_index,
    };
    match ctx.deferred_changes.as_mut() {
        Some(rows) => {
            rows.push(row);
            if rows.len() >= CHANGES_HELD_BACK {
                write_deferred_changes(ctx)?;
            }
        }
        None => insert_change_rows(ctx, std::slice::from_ref(&row))?,
    }
    ctx.keys.run_seq.insert(run_key, seq);
    ctx.keys.next_change_id = Some(change_id + 1);
    ctx.keys.group_logged_change = true;
    Ok((change_id, seq))
}

/// A change row [`log_change`] holds back while a job runs under [`defer_changes`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeferredChange {
    change_id: i64,
    run_key: i64,
    seq: i64,
    span_key: i64,
    event_index: Option<i64>,
}

/// Change rows written by one `INSERT` when they are held back (at most).
const CHANGES_PER_INSERT: usize = 16;
/// How many held-back change rows are written as soon as they are there.
const CHANGES_HELD_BACK: usize = 4 * CHANGES_PER_INSERT;

/// The `INSERT` of `rows` change rows (1, 2, 4, 8 or 16), made once.
fn insert_changes_sql(rows: usize) -> &'static str {
    static STATEMENTS: OnceLock<[String; 5]> = OnceLock::new();
    let statements = STATEMENTS.get_or_init(|| {
        [1, 2, 4, 8, 16].map(|rows| {
            let values = vec!["(?,?,?,?,?)"; rows].join(", ");
            format!(
                "INSERT INTO activity_changes (change_id, run_key, seq, span_key, event_index) \
                 VALUES {values}"
            )
        })
    });
    let at = (rows.max(1).trailing_zeros() as usize).min(statements.len() - 1);
    &statements[at]
}

/// Run `job` with its change rows written [`CHANGES_PER_INSERT`] to an `INSERT` rather than one
/// each: an OTLP delivery logs one and a half rows a span, and each statement's own cost
/// (binding, cursors, reset) was most of a row's (BENCHMARKS.md, stop 28). The rows are those
/// [`log_change`] would have written, in the same order, all written before `job`'s result is
/// returned, so nothing in the job may read `activity_changes` for a run it logged a change of
/// (none does: a run's last seq comes from the writer's cache once it logged one). On an error
/// the rows held back are dropped with the caches that counted them, and the job's error makes
/// the writer roll its writes back.
pub(crate) fn defer_changes<T>(
    ctx: &mut WriteContext<'_>,
    job: impl FnOnce(&mut WriteContext<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    if ctx.deferred_changes.is_some() {
        return job(ctx);
    }
    ctx.deferred_changes = Some(Vec::with_capacity(CHANGES_HELD_BACK));
    let result = job(ctx).and_then(|value| write_deferred_changes(ctx).map(|()| value));
    ctx.deferred_changes = None;
    if result.is_err() {
        ctx.keys.clear_volatile();
    }
    result
}

/// Hold the change rows [`log_change`] writes back from now on, until
/// [`flush_deferred_changes`] (a group's single writes, see `GroupCommitWriter::apply_group`).
pub(crate) fn hold_changes_back(ctx: &mut WriteContext<'_>) {
    ctx.deferred_changes = Some(Vec::with_capacity(CHANGES_HELD_BACK));
}

/// Write the change rows held back for a group's single writes and stop holding them back (see
/// `GroupCommitWriter::apply_group`). On an error the rows are dropped; the caller rolls the
/// group back.
pub(crate) fn flush_deferred_changes(ctx: &mut WriteContext<'_>) -> Result<(), StoreError> {
    let written = write_deferred_changes(ctx);
    ctx.deferred_changes = None;
    written
}

/// Write the change rows held back (see [`insert_change_rows`]).
fn write_deferred_changes(ctx: &mut WriteContext<'_>) -> Result<(), StoreError> {
    let Some(mut rows) = ctx.deferred_changes.take() else {
        return Ok(());
    };
    let written = insert_change_rows(ctx, &rows);
    rows.clear();
    ctx.deferred_changes = Some(rows);
    written
}

/// Write change rows in order: 16 to an `INSERT`, the rest 8, 4, 2, 1.
fn insert_change_rows(
    ctx: &mut WriteContext<'_>,
    rows: &[DeferredChange],
) -> Result<(), StoreError> {
    // A group of single writes holds back a few dozen rows: its remainder one by one cost
    // as much as writing every row so.
    let mut rest = rows;
    while !rest.is_empty() {
        let take = if rest.len() >= CHANGES_PER_INSERT {
            CHANGES_PER_INSERT
        } else {
            1 << rest.len().ilog2()
        };
        let (chunk, after) = rest.split_at(take);
        let stmt = ctx.statement(insert_changes_sql(take)).map_err(backend)?;
        for (at, row) in chunk.iter().enumerate() {
            let first = at * 5 + 1;
            stmt.raw_bind_parameter(first, row.change_id)
                .and_then(|()| stmt.raw_bind_parameter(first + 1, row.run_key))
                .and_then(|()| stmt.raw_bind_parameter(first + 2, row.seq))
                .and_then(|()| stmt.raw_bind_parameter(first + 3, row.span_key))
                .and_then(|()| stmt.raw_bind_parameter(first + 4, row.event_index))
                .map_err(backend)?;
        }
        stmt.raw_execute().map_err(backend)?;
        rest = after;
    }
    Ok(())
}

/// One past the highest change id ever used: the newest row's, or the floor `prune` recorded
/// before deleting the newest rows (ids are never reused, so cursors never see an old id twice).
fn next_change_id(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached(
        "SELECT MAX(COALESCE((SELECT MAX(change_id) FROM activity_changes), 0), \
                COALESCE((SELECT value FROM flightlog_meta WHERE name = 'change_id_floor'), 0)) + 1",
    )
    .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
    .map_err(backend)
}

/// The stored text of attrs, serialized straight from the map (not through a cloned `Value`:
/// a deep copy of every nested object per span was most of this function's cost).
pub(crate) fn attrs_text(attrs: &JsonObject) -> String {
    // A map with string keys always serializes; the fallback only keeps this total.
    serde_json::to_string(attrs).unwrap_or_else(|_| String::from("{}"))
}

/// A write's attrs as they are best stored (see [`StoredAttrs::pack`]): serialized and packed
/// on the caller's thread, before the write is queued.
pub(crate) fn stored_attrs(
    attrs: Option<&JsonObject>,
    codec: &PayloadCodec,
) -> Option<StoredAttrs> {
    attrs.map(|attrs| StoredAttrs::pack(attrs_text(attrs), codec))
}

/// Start a span; `attrs` are `input.attrs` as [`stored_attrs`] made them.
pub(crate) fn start_span(
    ctx: &mut WriteContext<'_>,
    input: &StartSpanInput,
    attrs: Option<&StoredAttrs>,
    writer: &str,
    now: i64,
) -> Result<SpanRow, StoreError> {
    let (run_key, new_run) = run_key_or_new(ctx, &input.run_id)?;
    let writer_key = writer_key_of(ctx, writer)?;
    let started_at = input.started_at.unwrap_or(now);
    // The reference tests the parent for truthiness: an empty-string parent gets a heartbeat.
    let last_heartbeat_at = match input.parent_span_id.as_deref() {
        None | Some("") => Some(started_at),
        Some(_) => None,
    };
    if ctx.keys.spans.contains_key(&input.span_id) || span_id_taken(ctx, &input.span_id)? {
        // Only the run/writer key rows may have been added before this point; they are
        // harmless (a run without spans reads as absent), so this failure counts as clean.
        return Err(StoreError::DuplicateSpan {
            span_id: input.span_id.clone(),
        });
    }
    let inserted = ctx
        .statement(
            "INSERT INTO activity_spans (span_id, run_key, parent_span_id, name, kind, origin, \
             session_id, job_name, attrs, started_at, writer_key, last_heartbeat_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )
        .and_then(|stmt| {
            stmt.execute(params![
                input.span_id,
                run_key,
                input.parent_span_id,
                input.name,
                input.kind.as_str(),
                input.origin.as_str(),
                input.session_id,
                input.job_name,
                attrs,
                started_at,
                writer_key,
                last_heartbeat_at,
            ])
        });
    if let Err(err) = inserted {
        // Only the run/writer key rows may have been added before this point; they are
        // harmless (a run without spans reads as absent), so this failure counts as clean.
        return Err(if is_constraint(&err) {
            StoreError::DuplicateSpan {
                span_id: input.span_id.clone(),
            }
        } else {
            backend(err)
        });
    }
    let span_key = ctx.conn.last_insert_rowid();
    register_span_id(ctx, &input.span_id, span_key)?;
    ctx.keys
        .spans
        .insert(input.span_id.clone(), (span_key, run_key));
    note_new_span(ctx, span_key);
    match input.parent_span_id {
        None => run_roots::note_root_stored(ctx, run_key, new_run)?,
        Some(_) => run_roots::note_child_stored(ctx, run_key, started_at, new_run)?,
    }
    log_change(ctx, run_key, span_key, None)?;
    Ok(SpanRow {
        span_id: input.span_id.clone(),
        run_id: input.run_id.clone(),
        parent_span_id: input.parent_span_id.clone(),
        name: input.name.clone(),
        kind: input.kind.clone(),
        origin: input.origin.clone(),
        session_id: input.session_id.clone(),
        job_name: input.job_name.clone(),
        attrs: input.attrs.clone().unwrap_or_default(),
        started_at,
        wait_until: None,
        ended_at: None,
        outcome: None,
        outcome_reason: None,
        usage: SpanUsage::default(),
        writer: writer.to_owned(),
        last_heartbeat_at,
    })
}

/// The open-ness check and attrs every non-terminal update starts from.
struct OpenSpan {
    span_key: i64,
    run_key: i64,
    attrs: Option<StoredAttrs>,
}

fn open_span(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    want_attrs: bool,
) -> Result<Option<OpenSpan>, StoreError> {
    // A span this writer started is found by its cached key (a rowid lookup, not the span-id
    // indexes), and its attrs are only read when the caller merges into them.
    if let Some(&(span_key, run_key)) = ctx.keys.spans.get(span_id) {
        let sql = if want_attrs {
            "SELECT outcome IS NOT NULL, attrs FROM activity_spans WHERE span_key = ?1"
        } else {
            "SELECT outcome IS NOT NULL, NULL FROM activity_spans WHERE span_key = ?1"
        };
        let found: Option<(bool, Option<StoredAttrs>)> = ctx
            .statement(sql)
            .and_then(|stmt| {
                stmt.query_row([span_key], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(backend)?;
        return Ok(match found {
            Some((false, attrs)) => Some(OpenSpan {
                span_key,
                run_key,
                attrs,
            }),
            _ => None,
        });
    }
    let found = ctx
        .statement(concat!(
            "SELECT span_key, run_key, outcome IS NOT NULL, attrs FROM activity_spans \
                 WHERE span_key = ",
            span_key_of!("?1")
        ))
        .and_then(|stmt| {
            stmt.query_row([span_id], |row| {
                Ok((
                    OpenSpan {
                        span_key: row.get(0)?,
                        run_key: row.get(1)?,
                        attrs: row.get(3)?,
                    },
                    row.get::<_, bool>(2)?,
                ))
            })
            .optional()
        })
        .map_err(backend)?;
    Ok(match found {
        Some((span, false)) => Some(span),
        _ => None,
    })
}

/// `{...old, ...new}`: new keys overwrite in place, unseen keys are appended. Without an
/// update the stored attrs are passed on as they are (packed or not).
pub(crate) fn merged_attrs(
    ctx: &WriteContext<'_>,
    stored: Option<StoredAttrs>,
    update: Option<&JsonObject>,
) -> Option<StoredAttrs> {
    let Some(update) = update else {
        return stored;
    };
    let stored = stored.and_then(|stored| stored.into_text(ctx.codec, ctx.conn));
    let mut merged = parse_attrs(stored.as_deref());
    for (key, value) in update {
        merged.insert(key.clone(), value.clone());
    }
    Some(StoredAttrs::pack(attrs_text(&merged), ctx.codec))
}

fn end_span_by_key(
    ctx: &mut WriteContext<'_>,
    span: OpenSpan,
    input: &EndSpanInput,
    now: i64,
) -> Result<(), StoreError> {
    let attrs = merged_attrs(ctx, span.attrs, input.attrs.as_ref());
    let usage = input.usage.clone().unwrap_or_default();
    ctx.statement(
        "UPDATE activity_spans SET outcome = ?1, outcome_reason = ?2, ended_at = ?3, attrs = ?4, \
         input_tokens = COALESCE(?5, input_tokens), output_tokens = COALESCE(?6, output_tokens), \
         cache_read_tokens = COALESCE(?7, cache_read_tokens), \
         cache_creation_tokens = COALESCE(?8, cache_creation_tokens), \
         cost_usd = COALESCE(?9, cost_usd), model = COALESCE(?10, model) WHERE span_key = ?11",
    )
    .and_then(|stmt| {
        stmt.execute(params![
            input.outcome.as_str(),
            input.reason,
            input.ended_at.unwrap_or(now),
            attrs,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_creation_tokens,
            usage.cost_usd,
            usage.model,
            span.span_key,
        ])
    })
    .map_err(backend)?;
    log_change(ctx, span.run_key, span.span_key, None)?;
    Ok(())
}

/// The common terminal write (no attrs to merge): one `UPDATE … RETURNING` both checks
/// open-ness and writes, instead of a read followed by a write.
fn end_span_without_attrs(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    input: &EndSpanInput,
    now: i64,
) -> Result<bool, StoreError> {
    let usage = input.usage.clone().unwrap_or_default();
    macro_rules! end_span_sql {
        ($span_key_and_rest:expr) => {
            concat!(
                "UPDATE activity_spans SET outcome = ?1, outcome_reason = ?2, ended_at = ?3, \
                 input_tokens = COALESCE(?4, input_tokens), \
                 output_tokens = COALESCE(?5, output_tokens), \
                 cache_read_tokens = COALESCE(?6, cache_read_tokens), \
                 cache_creation_tokens = COALESCE(?7, cache_creation_tokens), \
                 cost_usd = COALESCE(?8, cost_usd), model = COALESCE(?9, model) \
                 WHERE outcome IS NULL AND span_key = ",
                $span_key_and_rest
            )
        };
    }
    // A span this writer started is in its key cache: the update goes by key, without the
    // span-id lookup and without `RETURNING` (an ephemeral table per execution in SQLite).
    let cached = ctx.keys.spans.get(span_id).copied();
    let span_key_param: &dyn rusqlite::ToSql = match &cached {
        Some((span_key, _)) => span_key,
        None => &span_id,
    };
    let values = params![
        input.outcome.as_str(),
        input.reason,
        input.ended_at.unwrap_or(now),
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_creation_tokens,
        usage.cost_usd,
        usage.model,
        span_key_param,
    ];
    let ended: Option<(i64, i64)> = match cached {
        Some(keys) => {
            let changed = ctx
                .statement(end_span_sql!("?10"))
                .and_then(|stmt| stmt.execute(values))
                .map_err(backend)?;
            (changed > 0).then_some(keys)
        }
        None => ctx
            .statement(end_span_sql!(concat!(
                span_key_of!("?10"),
                " RETURNING span_key, run_key"
            )))
            .and_then(|stmt| {
                stmt.query_row(values, |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(backend)?,
    };
    let Some((span_key, run_key)) = ended else {
        return Ok(false);
    };
    log_change(ctx, run_key, span_key, None)?;
    Ok(true)
}

pub(crate) fn end_span(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    input: &EndSpanInput,
    now: i64,
) -> Result<bool, StoreError> {
    if input.attrs.is_none() {
        return end_span_without_attrs(ctx, span_id, input, now);
    }
    let Some(span) = open_span(ctx, span_id, true)? else {
        return Ok(false);
    };
    end_span_by_key(ctx, span, input, now)?;
    Ok(true)
}

pub(crate) fn patch_span(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    patch: &SpanPatch,
) -> Result<bool, StoreError> {
    let Some(span) = open_span(ctx, span_id, patch.attrs.is_some())? else {
        return Ok(false);
    };
    let usage = patch.usage.clone().unwrap_or_default();
    // Without attrs to merge, NULL keeps the stored attrs: they are neither read nor rewritten.
    let attrs = match patch.attrs.as_ref() {
        Some(update) => merged_attrs(ctx, span.attrs, Some(update)),
        None => None,
    };
    ctx.statement(
        "UPDATE activity_spans SET attrs = COALESCE(?1, attrs), \
         wait_until = COALESCE(?2, wait_until), \
         input_tokens = COALESCE(?3, input_tokens), output_tokens = COALESCE(?4, output_tokens), \
         cache_read_tokens = COALESCE(?5, cache_read_tokens), \
         cache_creation_tokens = COALESCE(?6, cache_creation_tokens), \
         cost_usd = COALESCE(?7, cost_usd), model = COALESCE(?8, model) WHERE span_key = ?9",
    )
    .and_then(|stmt| {
        stmt.execute(params![
            attrs,
            patch.wait_until,
            usage.input_tokens,
            usage.output_tokens,
            usage.cache_read_tokens,
            usage.cache_creation_tokens,
            usage.cost_usd,
            usage.model,
            span.span_key,
        ])
    })
    .map_err(backend)?;
    log_change(ctx, span.run_key, span.span_key, None)?;
    Ok(true)
}

pub(crate) fn append_event(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    event_type: &str,
    payload: &CappedPayload,
    compressed: Option<&CompressedPayload>,
    ts: i64,
) -> Result<Option<SpanEventRow>, StoreError> {
    let span = match ctx.keys.spans.get(span_id) {
        Some(keys) => Some(*keys),
        None => ctx
            .statement(concat!(
                "SELECT span_key, run_key FROM activity_spans WHERE span_key = ",
                span_key_of!("?1")
            ))
            .and_then(|stmt| {
                stmt.query_row([span_id], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map_err(backend)?,
    };
    let Some((span_key, run_key)) = span else {
        return Ok(None);
    };
    ctx.keys
        .spans
        .insert(span_id.to_owned(), (span_key, run_key));
    let event_index = insert_event(ctx, span_key, run_key, event_type, payload, compressed, ts)?;
    let truncated = payload.truncated;
    let payload = RawValue::from_string(payload.json.clone())
        .map_err(|err| StoreError::Corrupt(format!("capped payload is not JSON: {err}")))?;
    Ok(Some(SpanEventRow {
        span_id: span_id.to_owned(),
        event_index,
        ts,
        event_type: event_type.to_owned(),
        payload,
        truncated,
    }))
}

/// Insert one event of a known span with the span's next index, change-logged; returns the index.
pub(crate) fn insert_event(
    ctx: &mut WriteContext<'_>,
    span_key: i64,
    run_key: i64,
    event_type: &str,
    payload: &CappedPayload,
    compressed: Option<&CompressedPayload>,
    ts: i64,
) -> Result<i64, StoreError> {
    let event_index = match ctx.keys.next_event_index.get(&span_key) {
        Some(next) => *next,
        None => ctx
            .statement(
                "SELECT event_index FROM activity_events WHERE span_key = ?1 \
                 ORDER BY event_index DESC LIMIT 1",
            )
            .and_then(|stmt| {
                stmt.query_row([span_key], |row| row.get::<_, i64>(0))
                    .optional()
            })
            .map_err(backend)?
            .map_or(0, |index| index + 1),
    };
    ctx.statement(
        "INSERT INTO activity_events \
             (span_key, event_index, ts, event_type, truncated, dict_id, payload) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|stmt| match compressed {
        Some(compressed) => stmt.execute(params![
            span_key,
            event_index,
            ts,
            event_type,
            payload.truncated,
            compressed.dict_id,
            compressed.frame
        ]),
        None => stmt.execute(params![
            span_key,
            event_index,
            ts,
            event_type,
            payload.truncated,
            Option::<i64>::None,
            payload.json
        ]),
    })
    .map_err(backend)?;
    ctx.keys.next_event_index.insert(span_key, event_index + 1);
    log_change(ctx, run_key, span_key, Some(event_index))?;
    Ok(event_index)
}

pub(crate) fn heartbeat(
    ctx: &mut WriteContext<'_>,
    span_id: &str,
    at: i64,
) -> Result<(), StoreError> {
    // Deliberately not change-logged: a heartbeat is liveness metadata, not activity.
    ctx.statement(concat!(
        "UPDATE activity_spans SET last_heartbeat_at = ?1 WHERE span_key = ",
        span_key_of!("?2"),
        " AND outcome IS NULL"
    ))
    .and_then(|stmt| stmt.execute(params![at, span_id]))
    .map_err(backend)?;
    Ok(())
}

/// Close every open span of the run, newest start first (children before parents), then roll
/// the run up if anything was closed. Returns the number of spans closed.
fn close_run(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    outcome: &SpanOutcome,
    reason: &str,
    now: i64,
) -> Result<i64, StoreError> {
    let open: Vec<OpenSpan> = ctx
        .statement(
            "SELECT span_key, attrs FROM activity_spans WHERE run_key = ?1 AND outcome IS NULL \
             ORDER BY started_at DESC, span_key DESC",
        )
        .and_then(|stmt| {
            stmt.query_map([run_key], |row| {
                Ok(OpenSpan {
                    span_key: row.get(0)?,
                    run_key,
                    attrs: row.get(1)?,
                })
            })?
            .collect()
        })
        .map_err(backend)?;
    let input = EndSpanInput {
        outcome: outcome.clone(),
        reason: Some(reason.to_owned()),
        ended_at: None,
        usage: None,
        attrs: None,
    };
    let mut closed = 0;
    for span in open {
        end_span_by_key(ctx, span, &input, now)?;
        closed += 1;
    }
    if closed > 0 {
        rollup_run_key(ctx, run_key, RollupIdentity::KeepFirst)?;
    }
    Ok(closed)
}

pub(crate) fn cascade_close(
    ctx: &mut WriteContext<'_>,
    run_id: &str,
    outcome: &SpanOutcome,
    reason: &str,
    now: i64,
) -> Result<i64, StoreError> {
    match existing_run_key(ctx.conn, run_id)? {
        Some(run_key) => close_run(ctx, run_key, outcome, reason, now),
        None => Ok(0),
    }
}

/// Runs with an open `session`-origin span (any writer), by run id: `sweep_own_orphans`' targets.
pub(crate) const ORPHAN_RUNS_SQL: &str = "SELECT s.run_key FROM activity_spans s \
     JOIN activity_runs r ON r.run_key = s.run_key \
     WHERE s.outcome IS NULL AND s.origin = 'session' GROUP BY s.run_key ORDER BY r.run_id";

/// Open spans written by an earlier life of a server (writer starting with `?1`, not `?2`), of
/// runs from key `?3` on, by run, children before parents: the named boot sweep's targets. It
/// walks the index of open spans, never the whole span table, from the run the last part of the
/// sweep ended in (each part read it from the start again, other writers' open spans too).
pub(crate) const PREVIOUS_LIVES_SQL: &str = "SELECT s.span_key, s.run_key, s.attrs, s.started_at \
     FROM activity_spans s INDEXED BY activity_spans_open_by_run \
     JOIN activity_writers w ON w.writer_key = s.writer_key \
     WHERE s.outcome IS NULL AND s.run_key >= ?3 \
       AND substr(w.writer, 1, length(?1)) = ?1 AND w.writer != ?2 \
     ORDER BY s.run_key, s.started_at DESC, s.span_key DESC";

/// Runs whose open root was started by another writer and whose root heartbeat (or start) is
/// older than the cutoff, by root start: the stale sweep's targets (the reference's
/// `sweepStale`).
pub(crate) const STALE_RUNS_SQL: &str = "SELECT s.run_key FROM activity_spans s \
     INDEXED BY activity_spans_open_roots \
     JOIN activity_writers w ON w.writer_key = s.writer_key \
     WHERE s.outcome IS NULL AND s.parent_span_id IS NULL AND w.writer != ?1 \
       AND COALESCE(s.last_heartbeat_at, s.started_at) < ?2 \
     ORDER BY s.started_at, s.span_key";

/// Runs with open spans but no open root, none of them written by `?1`, whose last sign of
/// life is before the cutoff `?2`: the latest heartbeat (or start) of an open span, and the
/// latest start or end of any span (a root that ended an hour ago, a sibling that started a
/// minute ago, say the run's writer was there then). The leftover sweep's targets
/// (`sweep_leftovers_step`), in run key order: the groups come off the index of open spans in
/// that order, so a `LIMIT` stops the scan (ordered by anything else, every candidate was
/// judged and sorted before the first came out: 0.3 s at 20,000 of them, inside the writer's
/// transaction, found by a review). Only the runs whose open spans are all quiet have their
/// spans read: their starts by a seek on `activity_spans_by_run`, their ends by a scan of the
/// run. Not in the reference, which leaves such spans open for ever (and their runs
/// unprunable).
pub(crate) const LEFTOVER_RUNS_SQL: &str = "SELECT s.run_key FROM activity_spans s \
     INDEXED BY activity_spans_open_by_run \
     JOIN activity_writers w ON w.writer_key = s.writer_key \
     WHERE s.outcome IS NULL GROUP BY s.run_key \
     HAVING SUM(s.parent_span_id IS NULL) = 0 AND SUM(w.writer = ?1) = 0 \
       AND MAX(COALESCE(s.last_heartbeat_at, s.started_at)) < ?2 \
       AND NOT EXISTS (SELECT 1 FROM activity_spans l INDEXED BY activity_spans_by_run \
         WHERE l.run_key = s.run_key AND l.started_at >= ?2) \
       AND NOT EXISTS (SELECT 1 FROM activity_spans l INDEXED BY activity_spans_by_run \
         WHERE l.run_key = s.run_key AND l.ended_at >= ?2) \
     ORDER BY s.run_key";

/// [`STALE_RUNS_SQL`] without the runs that also have an open root alive within the window:
/// the scheduled sweep's targets (`sweep_stale_step`). The reference closes the whole run when
/// any of its roots is stale, so in a session of several turns one turn left open closed the
/// turn running now, heartbeats and all (an audit's finding); such a run waits until every
/// open root is silent.
pub(crate) const SILENT_STALE_RUNS_SQL: &str = "SELECT s.run_key FROM activity_spans s \
     INDEXED BY activity_spans_open_roots \
     JOIN activity_writers w ON w.writer_key = s.writer_key \
     WHERE s.outcome IS NULL AND s.parent_span_id IS NULL AND w.writer != ?1 \
       AND COALESCE(s.last_heartbeat_at, s.started_at) < ?2 \
       AND NOT EXISTS (SELECT 1 FROM activity_spans f INDEXED BY activity_spans_open_by_run \
         WHERE f.run_key = s.run_key AND f.outcome IS NULL AND f.parent_span_id IS NULL \
           AND COALESCE(f.last_heartbeat_at, f.started_at) >= ?2) \
     ORDER BY s.started_at, s.span_key";

pub(crate) fn run_keys(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<i64>, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.query_map(params, |row| row.get(0))?.collect())
        .map_err(backend)
}

/// Close the runs `run_keys` (a part of what [`ORPHAN_RUNS_SQL`] listed): spans closed. A run
/// closed since the list was read closes nothing.
pub(crate) fn sweep_own_orphans(
    ctx: &mut WriteContext<'_>,
    now: i64,
    run_keys: &[i64],
) -> Result<i64, StoreError> {
    let mut closed = 0;
    for &run_key in run_keys {
        closed += close_run(
            ctx,
            run_key,
            &SpanOutcome::Interrupted,
            "server restarted",
            now,
        )?;
    }
    Ok(closed)
}

/// Close the first `max_spans` open spans of a server's earlier lives (see
/// [`PREVIOUS_LIVES_SQL`]) of runs from key `from_run` on and roll up each run touched, and say
/// whether more are left and the last run touched: `(spans closed, more, last run)`. Spans of
/// other writers in the same runs stay open.
pub(crate) fn sweep_previous_lives(
    ctx: &mut WriteContext<'_>,
    life_prefix: &str,
    own_writer: &str,
    now: i64,
    (from_run, max_spans): (i64, i64),
) -> Result<(i64, bool, i64), StoreError> {
    // Re-read inside the transaction: a span ended since the caller's look is simply absent.
    // One more than asked for, to tell whether any remain.
    let sql = format!("{PREVIOUS_LIVES_SQL} LIMIT ?4");
    let mut open: Vec<(OpenSpan, i64)> = ctx
        .conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(
                params![
                    life_prefix,
                    own_writer,
                    from_run,
                    max_spans.saturating_add(1)
                ],
                |row| {
                    let span = OpenSpan {
                        span_key: row.get(0)?,
                        run_key: row.get(1)?,
                        attrs: row.get(2)?,
                    };
                    Ok((span, row.get(3)?))
                },
            )?
            .collect()
        })
        .map_err(backend)?;
    let more = open.len() as i64 > max_spans;
    open.truncate(usize::try_from(max_spans).unwrap_or(usize::MAX));
    let input = EndSpanInput {
        outcome: SpanOutcome::Interrupted,
        reason: Some("server restarted".to_owned()),
        ended_at: None,
        usage: None,
        attrs: None,
    };
    let mut runs: Vec<i64> = Vec::new();
    let mut closed = 0;
    let last_run = open.last().map_or(from_run, |(span, _)| span.run_key);
    for (span, started_at) in open {
        if runs.last() != Some(&span.run_key) {
            runs.push(span.run_key);
        }
        // Never before its start: under `--manual-clock` the clock starts at 0 at each boot,
        // and the leftovers of a life that had moved it on ended at 0, with negative durations
        // (an audit's finding).
        end_span_by_key(ctx, span, &input, now.max(started_at))?;
        closed += 1;
    }
    for run_key in runs {
        rollup_run_key(ctx, run_key, RollupIdentity::KeepFirst)?;
    }
    Ok((closed, more, last_run))
}

/// Close, as interrupted ("writer went silent"), the first `max_runs` runs that `candidates`
/// (a query of run keys taking the sweeping writer and the cutoff) lists, and say whether it
/// lists more: `(spans closed, more)`. The candidates are read inside the transaction, so a
/// run whose writer showed life since the caller's look is spared.
pub(crate) fn close_silent_runs(
    ctx: &mut WriteContext<'_>,
    candidates: &str,
    writer: &str,
    cutoff: i64,
    now: i64,
    max_runs: i64,
) -> Result<(i64, bool), StoreError> {
    let mut closed = 0;
    // One more than asked for, to tell whether any remain.
    let sql = format!("{candidates} LIMIT ?3");
    let mut run_keys = run_keys(
        ctx.conn,
        &sql,
        params![writer, cutoff, max_runs.saturating_add(1)],
    )?;
    let more = run_keys.len() as i64 > max_runs;
    run_keys.truncate(usize::try_from(max_runs).unwrap_or(usize::MAX));
    for run_key in run_keys {
        closed += close_run(
            ctx,
            run_key,
            &SpanOutcome::Interrupted,
            "writer went silent",
            now,
        )?;
    }
    Ok((closed, more))
}

pub(crate) fn rollup_run(ctx: &mut WriteContext<'_>, run_id: &str) -> Result<(), StoreError> {
    match existing_run_key(ctx.conn, run_id)? {
        Some(run_key) => rollup_run_key(ctx, run_key, RollupIdentity::KeepFirst),
        None => Ok(()),
    }
}

/// What a rollup that already exists keeps of its identity (name, origin, session, job, start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RollupIdentity {
    /// The reference's upsert: the identity of the first rollup stays; only the totals, the end
    /// and the outcome are updated. Every native path (the rollup call, sweeps, run close).
    KeepFirst,
    /// Taken from the run's first root as it is now. An importer's spans arrive in any order:
    /// a root that started earlier (a caller exporting here too) may come after the run was
    /// rolled up from another, and the rollup must be the one the last span makes (issue 5),
    /// matching the run list, which shows the first root.
    Refresh,
}

pub(crate) fn rollup_run_key(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    identity: RollupIdentity,
) -> Result<(), StoreError> {
    let spans: Vec<RollupSpan> = ctx
        .statement(ROLLUP_SPANS_SQL)
        .and_then(|stmt| stmt.query_map([run_key], rollup_span_from_row)?.collect())
        .map_err(backend)?;
    store_rollup(ctx, run_key, &spans, identity)
}

/// A run's spans as the rollup rule reads them, in its order (start, then insertion): only the
/// columns it needs, since this runs on every run's terminal write. Read by
/// [`rollup_span_from_row`].
pub(crate) const ROLLUP_SPANS_SQL: &str = "SELECT parent_span_id IS NULL, origin, name, \
     session_id, job_name, started_at, ended_at, outcome, outcome_reason, input_tokens, \
     output_tokens, cache_read_tokens, cache_creation_tokens, cost_usd, kind, span_id, \
     parent_span_id, call_id FROM activity_spans WHERE run_key = ?1 \
     ORDER BY started_at, span_key";

pub(crate) fn rollup_span_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RollupSpan> {
    let origin: String = row.get(1)?;
    let outcome: Option<String> = row.get(7)?;
    let kind: String = row.get(14)?;
    Ok(RollupSpan {
        span_id: row.get(15)?,
        parent_span_id: row.get(16)?,
        is_root: row.get(0)?,
        kind: SpanKind::from_stored(&kind),
        origin: SpanOrigin::from_stored(&origin),
        name: row.get(2)?,
        session_id: row.get(3)?,
        job_name: row.get(4)?,
        started_at: row.get(5)?,
        ended_at: row.get(6)?,
        outcome: outcome.as_deref().map(SpanOutcome::from_stored),
        outcome_reason: row.get(8)?,
        usage: usage_at(row, 9)?,
        call_id: row.get(17)?,
    })
}

/// The usage counts and cost in the five columns from `first` on (input, output, cache read,
/// cache creation tokens, cost), without the model (the rollup rule reads none).
pub(crate) fn usage_at(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<SpanUsage> {
    Ok(SpanUsage {
        input_tokens: row.get(first)?,
        output_tokens: row.get(first + 1)?,
        cache_read_tokens: row.get(first + 2)?,
        cache_creation_tokens: row.get(first + 3)?,
        cost_usd: row.get(first + 4)?,
        model: None,
    })
}

/// Compute the rollup of a run from its spans (in `started_at`, then insertion order) and
/// upsert it.
pub(crate) fn store_rollup(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    spans: &[RollupSpan],
    identity: RollupIdentity,
) -> Result<(), StoreError> {
    let Some(fields) = compute_rollup(spans) else {
        return Ok(());
    };
    macro_rules! upsert_rollup_sql {
        ($identity:expr) => {
            concat!(
                "INSERT INTO activity_run_rollups (run_key, origin, name, session_id, job_name, \
                 started_at, ended_at, outcome, duration_ms, span_count, input_tokens, \
                 output_tokens, cache_read_tokens, cache_creation_tokens, cost_usd, \
                 failure_reason, detail_pruned) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, 0) \
                 ON CONFLICT(run_key) DO UPDATE SET ",
                $identity,
                "ended_at = excluded.ended_at, \
                 outcome = excluded.outcome, duration_ms = excluded.duration_ms, \
                 span_count = excluded.span_count, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, \
                 cache_read_tokens = excluded.cache_read_tokens, \
                 cache_creation_tokens = excluded.cache_creation_tokens, \
                 cost_usd = excluded.cost_usd, failure_reason = excluded.failure_reason, \
                 detail_pruned = CASE detail_pruned WHEN 1 THEN 2 ELSE detail_pruned END"
            )
        };
    }
    let sql = match identity {
        RollupIdentity::KeepFirst => upsert_rollup_sql!(""),
        RollupIdentity::Refresh => upsert_rollup_sql!(
            "origin = excluded.origin, name = excluded.name, \
             session_id = excluded.session_id, job_name = excluded.job_name, \
             started_at = excluded.started_at, "
        ),
    };
    ctx.statement(sql)
        .and_then(|stmt| {
            stmt.execute(params![
                run_key,
                fields.origin.as_str(),
                fields.name,
                fields.session_id,
                fields.job_name,
                fields.started_at,
                fields.ended_at,
                fields.outcome.as_ref().map(SpanOutcome::as_str),
                fields.duration_ms,
                fields.span_count,
                fields.input_tokens,
                fields.output_tokens,
                fields.cache_read_tokens,
                fields.cache_creation_tokens,
                fields.cost_usd,
                fields.failure_reason,
            ])
        })
        .map_err(backend)?;
    Ok(())
}

/// Prune parameters resolved by the caller (`now` and defaults applied).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrunePlan {
    pub floor: i64,
    pub ceiling: i64,
    /// SQL `LIMIT` semantics: 0 = none, negative = all.
    pub batch: i64,
    /// Change rows this far behind the newest are trimmed (runs with open spans keep theirs).
    pub change_log_retention: i64,
    /// The most change rows one call trims, the oldest first.
    pub change_log_trim_batch: i64,
    /// The most spans one call deletes (see `PruneOptions::max_spans`); `None`: no bound.
    pub max_spans: Option<i64>,
    /// The scheduled retention's extra candidates: runs written to and rolled up again after
    /// their prune, ended runs nobody rolled up (see `PruneOptions::scheduled`).
    pub scheduled: bool,
    /// The prune's time (the scheduled prune's "recent" ends a window after it: see
    /// [`PrunePlan::recent`]).
    pub now: i64,
}

impl PrunePlan {
    /// The times that keep a run from the scheduled prune when a span of it started or ended
    /// at one of them: since the floor and the ceiling, up to as far after now. A span far in
    /// the future (a clock in microseconds read as milliseconds) kept its run for good, and
    /// nothing said so (an audit's finding); a writer's clock a little ahead still holds it.
    fn recent(&self) -> (i64, i64) {
        let since = self.floor.max(self.ceiling);
        let window = self.now.saturating_sub(since).max(0);
        (since, self.now.saturating_add(window))
    }
}

/// The first runs of `runs` (each with its span count) that fit in `max_spans` together with
/// the `taken` spans of the runs already chosen (`any_chosen`), and always one run when none is
/// chosen yet; with whether every run fitted and the spans chosen in all.
fn within_span_budget<T>(
    runs: Vec<(T, i64)>,
    max_spans: Option<i64>,
    taken: i64,
    any_chosen: bool,
) -> (Vec<T>, bool, i64) {
    let mut total = taken;
    let mut kept = Vec::with_capacity(runs.len());
    for (run, spans) in runs {
        let with = total.saturating_add(spans.max(0));
        if max_spans.is_some_and(|max| with > max) && (any_chosen || !kept.is_empty()) {
            return (kept, false, total);
        }
        total = with;
        kept.push(run);
    }
    (kept, true, total)
}

/// A run a prune may take: `((run key, end), span count)`.
type PruneCandidate = ((i64, i64), i64);

/// The runs a prune takes through their rollup row: marked `detail_pruned` (0: never pruned,
/// the reference's rule; 2: written to again since their prune), ended before the digest
/// floor or the hard ceiling, with no span open; `((run key, end), span count)`, oldest end
/// first, at most `limit` (SQL `LIMIT` semantics), after `after` (an end and a run key) when
/// given.
///
/// The scheduled prune also asks that no span of the run started since then (an index seek,
/// so a busy session costs little each pass), and [`quiet_candidates`] then that none ended
/// since: the rollup's end is its first root's, so a session of several turns whose first turn
/// ended longer ago than the retention lost its latest turn minutes after it ended (an audit's
/// finding); and that no OTLP delivery wrote to it since (`activity_runs.imported_at`, the
/// server's clock), so a trace replayed with month-old times stays for the retention's length
/// after its arrival. The endpoint keeps the reference's rule.
fn rolled_up_candidates(
    conn: &rusqlite::Connection,
    detail_pruned: i64,
    plan: &PrunePlan,
    limit: i64,
    after: Option<(i64, i64)>,
) -> Result<Vec<PruneCandidate>, StoreError> {
    let (since, until) = plan.recent();
    conn.prepare_cached(
        "SELECT o.run_key, o.ended_at, o.span_count FROM activity_run_rollups o \
         WHERE o.detail_pruned = ?4 AND o.ended_at IS NOT NULL \
           AND (o.ended_at < ?1 OR o.ended_at < ?2) \
           AND (?8 IS NULL OR o.ended_at > ?8 OR (o.ended_at = ?8 AND o.run_key > ?9)) \
           AND NOT EXISTS (SELECT 1 FROM activity_spans s \
                           WHERE s.run_key = o.run_key AND s.outcome IS NULL) \
           AND (?5 = 0 OR NOT EXISTS (SELECT 1 FROM activity_spans s \
                                WHERE s.run_key = o.run_key \
                                  AND s.started_at BETWEEN ?6 AND ?7)) \
           AND (?5 = 0 OR NOT EXISTS (SELECT 1 FROM activity_runs a \
                                WHERE a.run_key = o.run_key \
                                  AND a.imported_at BETWEEN ?6 AND ?7)) \
         ORDER BY o.ended_at, o.run_key LIMIT ?3",
    )
    .and_then(|mut stmt| {
        stmt.query_map(
            params![
                plan.floor,
                plan.ceiling,
                limit,
                detail_pruned,
                plan.scheduled,
                since,
                until,
                after.map(|(ended_at, _)| ended_at),
                after.map(|(_, run_key)| run_key),
            ],
            |row| Ok(((row.get(0)?, row.get(1)?), row.get(2)?)),
        )?
        .collect()
    })
    .map_err(backend)
}

/// The most candidates one scheduled prune call looks at past those it takes: runs held by a
/// span that ended inside the window (see [`quiet_candidates`]) are passed over, and without a
/// bound a long line of them (each swept leftover's run for two hours) could take the writer's
/// transaction as long as it liked.
const MAX_CANDIDATES_PASSED_OVER: usize = 1_000;

/// The scheduled prune's candidates with `detail_pruned` (see [`rolled_up_candidates`]): at
/// most `limit` (SQL `LIMIT` semantics) of the rollups' candidates, oldest end first, that
/// [`quiet_candidates`] keeps, read page after page past those it passes over (at most
/// [`MAX_CANDIDATES_PASSED_OVER`]): taking only the first `limit` and passing over the held
/// ones among them, a line of `limit` held runs at the oldest end stopped every prune behind
/// it (the diff's review).
fn scheduled_candidates(
    conn: &rusqlite::Connection,
    detail_pruned: i64,
    plan: &PrunePlan,
    limit: i64,
    taken: i64,
) -> Result<Vec<PruneCandidate>, StoreError> {
    let wanted = if limit < 0 {
        usize::MAX
    } else {
        usize::try_from(limit).unwrap_or(usize::MAX)
    };
    let mut chosen: Vec<PruneCandidate> = Vec::new();
    let mut total = taken;
    let mut passed_over = 0usize;
    let mut after = None;
    while chosen.len() < wanted {
        let page_limit = if limit < 0 {
            -1
        } else {
            i64::try_from(wanted - chosen.len()).unwrap_or(i64::MAX)
        };
        let page = rolled_up_candidates(conn, detail_pruned, plan, page_limit, after)?;
        let full = limit >= 0 && i64::try_from(page.len()).unwrap_or(i64::MAX) == page_limit;
        after = page
            .last()
            .map(|((run_key, ended_at), _)| (*ended_at, *run_key));
        let read = page.len();
        let (quiet, spans, budget_full) = quiet_candidates(conn, page, plan, total)?;
        passed_over += read - quiet.len();
        total = spans;
        chosen.extend(quiet);
        if budget_full || !full || passed_over >= MAX_CANDIDATES_PASSED_OVER {
            break;
        }
    }
    Ok(chosen)
}

/// Of the scheduled prune's `found` candidates (oldest first), those none of whose spans ended
/// at a recent time ([`PrunePlan::recent`]; their starts are checked already), each with the
/// spans it holds now, read as far as [`PrunePlan::max_spans`] reaches beyond `taken` (the next
/// run that does not fit is the last read; `true` then), with `taken` plus their spans: a rollup's span count is of when it
/// was made, and a session rolled up after its first turn and grown since would take a
/// transaction far past the budget (the re-rollup and the deletes read all its spans). Each
/// run read costs one pass over its spans, as deleting it does; a run that is not taken (its
/// last span started before the window and ended inside it) is read again next pass, until it
/// is old enough.
fn quiet_candidates(
    conn: &rusqlite::Connection,
    found: Vec<PruneCandidate>,
    plan: &PrunePlan,
    taken: i64,
) -> Result<(Vec<PruneCandidate>, i64, bool), StoreError> {
    let (since, until) = plan.recent();
    let mut quiet = Vec::with_capacity(found.len());
    let mut total = taken;
    let mut stmt = conn
        .prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(ended_at BETWEEN ?2 AND ?3), 0) \
             FROM activity_spans WHERE run_key = ?1",
        )
        .map_err(backend)?;
    for ((run_key, ended_at), _counted) in found {
        let (spans, recent_ends): (i64, i64) = stmt
            .query_row(params![run_key, since, until], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .map_err(backend)?;
        if recent_ends > 0 {
            continue;
        }
        quiet.push(((run_key, ended_at), spans));
        total = total.saturating_add(spans);
        if plan.max_spans.is_some_and(|max| total > max) {
            return Ok((quiet, total, true));
        }
    }
    Ok((quiet, total, false))
}

/// Roll up (as `rollupRun` does) up to `batch` ended runs that have no rollup a prune takes
/// them by (none; one made while they were open; a pruned run's, written to again since),
/// whose spans are all ended and whose newest end is before `ceiling`: the scheduled prune
/// then takes them as it takes any rolled-up run. Without it a client that never rolls up
/// (the reference's terminal write), or never after a run ended, kept its detail for good, and a native run whose spans all hang from
/// a span of another run (a subagent's run) was listed open for good. Found among the roots
/// that started before the ceiling (a run with a root older than the retention and still
/// there is one of the few not pruned yet: open, or never rolled up) and among the runs
/// waiting for a root, leaving out those of `otlp` spans alone, which the hard ceiling prunes
/// to a digest of their own.
fn roll_up_forgotten_runs(
    ctx: &mut WriteContext<'_>,
    ceiling: i64,
    batch: i64,
) -> Result<(), StoreError> {
    // No rollup that a prune takes the run by: none, one made while the run was open (no
    // end), or a pruned run's (`1`) while the run holds spans again (written to since).
    const ENDED_AND_QUIET: &str = "NOT EXISTS (SELECT 1 FROM activity_run_rollups o \
         WHERE o.run_key = k.run_key AND o.ended_at IS NOT NULL AND o.detail_pruned <> 1) \
         AND NOT EXISTS (SELECT 1 FROM activity_spans x INDEXED BY activity_spans_open_by_run \
           WHERE x.run_key = k.run_key AND x.outcome IS NULL) \
         AND (SELECT MAX(COALESCE(x.ended_at, x.started_at)) FROM activity_spans x \
           WHERE x.run_key = k.run_key) < ?1";
    let rooted = format!(
        "SELECT DISTINCT k.run_key FROM activity_spans k INDEXED BY activity_spans_roots \
         WHERE k.parent_span_id IS NULL AND k.started_at < ?1 AND {ENDED_AND_QUIET} LIMIT ?2"
    );
    let rootless = format!(
        "SELECT k.run_key FROM activity_runs_awaiting_root k \
         INDEXED BY activity_runs_awaiting_root_by_start \
         WHERE k.started_at < ?1 AND {ENDED_AND_QUIET} \
         AND EXISTS (SELECT 1 FROM activity_spans x WHERE x.run_key = k.run_key \
           AND x.origin <> 'otlp') LIMIT ?2"
    );
    let mut runs: Vec<i64> = Vec::new();
    for sql in [rooted, rootless] {
        let found: Vec<i64> = ctx
            .conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![ceiling, batch], |row| row.get(0))?
                    .collect()
            })
            .map_err(backend)?;
        runs.extend(found);
    }
    for run_key in runs {
        rollup_run_key(ctx, run_key, RollupIdentity::KeepFirst)?;
    }
    Ok(())
}

/// What is left of a prune's batch (SQL `LIMIT` semantics: negative = all) after `taken` runs.
fn remaining_batch(batch: i64, taken: usize) -> i64 {
    if batch < 0 {
        -1
    } else {
        batch.saturating_sub(i64::try_from(taken).unwrap_or(i64::MAX))
    }
}

/// The most change-log rows one `prune` call trims by default (see there): about 50 ms of the
/// writer's time on the benchmark machine. At 100,000, each call of a big database's first
/// prune held writes for about 250 ms (writes fell from 700/s to 12 – 22/s for seconds, an
/// audit's finding).
pub(crate) const MAX_TRIMMED_PER_PRUNE: i64 = 20_000;

/// Delete a run's detail (events, span ids, spans, change rows; its row of runs awaiting a
/// root and its spans' rows of spans awaiting a caller too): `(spans deleted, the newest
/// change id it deleted or 0)`.
fn delete_run_detail(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<(i64, i64), StoreError> {
    let conn = ctx.conn;
    let newest: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(MAX(change_id), 0) FROM activity_changes WHERE run_key = ?1",
        )
        .and_then(|mut stmt| stmt.query_row([run_key], |row| row.get(0)))
        .map_err(backend)?;
    conn.prepare_cached(
        "DELETE FROM activity_events WHERE span_key IN \
         (SELECT span_key FROM activity_spans WHERE run_key = ?1)",
    )
    .and_then(|mut stmt| stmt.execute([run_key]))
    .map_err(backend)?;
    for sql in [
        "DELETE FROM activity_span_ids_recent WHERE span_id IN \
         (SELECT span_id FROM activity_spans WHERE run_key = ?1)",
        "DELETE FROM activity_span_ids_middle WHERE span_id IN \
         (SELECT span_id FROM activity_spans WHERE run_key = ?1)",
        "DELETE FROM activity_span_ids WHERE span_id IN \
         (SELECT span_id FROM activity_spans WHERE run_key = ?1)",
    ] {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| stmt.execute([run_key]))
            .map_err(backend)?;
    }
    let deleted = conn
        .prepare_cached("DELETE FROM activity_spans WHERE run_key = ?1")
        .and_then(|mut stmt| stmt.execute([run_key]))
        .map_err(backend)?;
    // A run started again under its id after its detail is pruned begins anew at seq 1, as
    // the reference's does (its changes went with its detail).
    conn.prepare_cached("UPDATE activity_runs SET trimmed_seq = NULL WHERE run_key = ?1")
        .and_then(|mut stmt| stmt.execute([run_key]))
        .map_err(backend)?;
    conn.prepare_cached("DELETE FROM activity_changes WHERE run_key = ?1")
        .and_then(|mut stmt| stmt.execute([run_key]))
        .map_err(backend)?;
    run_roots::forget(ctx, run_key)?;
    remote_callers::forget(ctx, run_key)?;
    Ok((i64::try_from(deleted).unwrap_or(i64::MAX), newest))
}

/// What a rootless run pruned by the hard ceiling leaves: a rollup row, already marked
/// `detail_pruned`, so the run stays listed (ended) with its usage and cost: named and started
/// by its earliest span, ended at its newest span's end, no outcome (no root said how it went),
/// its `model` spans' usage, and the failure reason `root never arrived`. A run pruned before
/// (it has such a row, and a span came after) keeps the row it has, marked pruned again (`1`:
/// a row left at `2`, rewritten, would be a candidate of every later scheduled prune).
fn store_rootless_digest(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<(), StoreError> {
    let spans: Vec<RollupSpan> = ctx
        .conn
        .prepare_cached(ROLLUP_SPANS_SQL)
        .and_then(|mut stmt| stmt.query_map([run_key], rollup_span_from_row)?.collect())
        .map_err(backend)?;
    let Some(earliest) = spans.first() else {
        return Ok(());
    };
    let ended_at = spans
        .iter()
        .map(|span| span.ended_at.unwrap_or(span.started_at))
        .max();
    let usage = rootless_usage(&spans);
    ctx.conn
        .prepare_cached(
            "INSERT INTO activity_run_rollups (run_key, origin, name, session_id, job_name, \
             started_at, ended_at, outcome, duration_ms, span_count, input_tokens, \
             output_tokens, cache_read_tokens, cache_creation_tokens, cost_usd, \
             failure_reason, detail_pruned) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?8, ?9, ?10, ?11, ?12, ?13, ?14, \
             'root never arrived', 1) ON CONFLICT(run_key) DO UPDATE SET detail_pruned = 1",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                run_key,
                earliest.origin.as_str(),
                earliest.name,
                earliest.session_id,
                earliest.job_name,
                earliest.started_at,
                ended_at,
                ended_at.map(|ended| ended.saturating_sub(earliest.started_at)),
                i64::try_from(spans.len()).unwrap_or(i64::MAX),
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_creation_tokens,
                usage.cost_usd,
            ])
        })
        .map_err(backend)?;
    Ok(())
}

pub(crate) fn prune(
    ctx: &mut WriteContext<'_>,
    plan: PrunePlan,
) -> Result<PruneResult, StoreError> {
    if plan.scheduled && plan.batch != 0 {
        roll_up_forgotten_runs(ctx, plan.ceiling, plan.batch)?;
    }
    let conn = ctx.conn;
    // Candidates come from the rollups (a finished run's terminal write made it prunable),
    // guarded against any run that still has an open span.
    let candidates = if plan.scheduled {
        scheduled_candidates(conn, 0, &plan, plan.batch, 0)?
    } else {
        rolled_up_candidates(conn, 0, &plan, plan.batch, None)?
    };
    let (mut candidates, mut all_fitted, mut candidate_spans) =
        within_span_budget(candidates, plan.max_spans, 0, false);
    // Runs written to again after their prune: a rollup after that marks the row
    // `detail_pruned = 2` (still pruned to every reader, as the reference's row stays marked),
    // and the reference's rule (`detail_pruned = 0`) would never take them again, so their new
    // detail would stay forever. Only when asked (the scheduled prune): the endpoint keeps the
    // reference's counts.
    let remaining = remaining_batch(plan.batch, candidates.len());
    if plan.scheduled && remaining != 0 && all_fitted {
        let rewritten = scheduled_candidates(conn, 2, &plan, remaining, candidate_spans)?;
        let (rewritten, fitted, spans) = within_span_budget(
            rewritten,
            plan.max_spans,
            candidate_spans,
            !candidates.is_empty(),
        );
        candidates.extend(rewritten);
        all_fitted = fitted;
        candidate_spans = spans;
    }
    // Runs that never had a root stored (see `run_roots`) have no rollup to be a candidate by.
    // A trace whose root never comes (its caller exports elsewhere, with an SDK that does not
    // flag remote parents) would keep its detail forever, so the hard ceiling prunes such a run
    // once its newest span is older than it and none is open, leaving a digest (see
    // `store_rootless_digest`). Only runs whose spans are all of origin `otlp`: the reference
    // (origins `session` and `cron`) never prunes a run it has no rollup for, and its prune
    // counts must stay; a run with a rollup not yet pruned is the reference's kind of candidate
    // (above, or never).
    let remaining = remaining_batch(plan.batch, candidates.len());
    let rootless: Vec<i64> = if remaining == 0 || !all_fitted {
        Vec::new()
    } else {
        let rootless: Vec<(i64, i64)> = conn
            .prepare_cached(
                "SELECT w.run_key, \
               (SELECT COUNT(*) FROM activity_spans s WHERE s.run_key = w.run_key) \
             FROM activity_runs_awaiting_root w \
             WHERE w.started_at < ?1 \
               AND NOT EXISTS (SELECT 1 FROM activity_run_rollups o \
                               WHERE o.run_key = w.run_key AND o.detail_pruned = 0) \
               AND NOT EXISTS (SELECT 1 FROM activity_spans s WHERE s.run_key = w.run_key \
                               AND (s.outcome IS NULL OR s.origin <> 'otlp')) \
               AND NOT EXISTS (SELECT 1 FROM activity_runs a \
                               WHERE a.run_key = w.run_key AND a.imported_at BETWEEN ?1 AND ?3) \
               AND (SELECT MAX(MAX(s.started_at, COALESCE(s.ended_at, s.started_at))) \
                    FROM activity_spans s WHERE s.run_key = w.run_key) < ?1 \
             ORDER BY w.started_at, w.run_key LIMIT ?2",
            )
            .and_then(|mut stmt| {
                // (An arrival stamped far after now, by a clock since set back, holds a run no
                // longer than a span's time does: see `PrunePlan::recent`.)
                stmt.query_map(params![plan.ceiling, remaining, plan.recent().1], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?
                .collect()
            })
            .map_err(backend)?;
        // A run written to again after its prune, rolled up (`2`), and all `otlp` with no root
        // is a candidate above already: counted once (an audit saw it counted twice).
        let taken: std::collections::HashSet<i64> =
            candidates.iter().map(|(run_key, _)| *run_key).collect();
        let rootless = rootless
            .into_iter()
            .filter(|(run_key, _)| !taken.contains(run_key))
            .collect();
        within_span_budget(
            rootless,
            plan.max_spans,
            candidate_spans,
            !candidates.is_empty(),
        )
        .0
    };
    if !candidates.is_empty() || !rootless.is_empty() {
        // Deleting the newest change rows must not let their ids be handed out again.
        conn.prepare_cached(
            "INSERT INTO flightlog_meta (name, value) \
             SELECT 'change_id_floor', COALESCE(MAX(change_id), 0) FROM activity_changes WHERE 1 \
             ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)",
        )
        .and_then(|mut stmt| stmt.execute([]))
        .map_err(backend)?;
    }
    let mut spans_deleted = 0i64;
    // The newest change id this prune deletes: a live reader whose cursor is below it may not
    // have seen every change of a pruned run (its root's end, say), and the log can no longer
    // tell it; the horizon below makes the streams tell such a reader to resync.
    let mut newest_pruned_change = 0i64;
    for (run_key, ended_at) in &candidates {
        let run_key = *run_key;
        if plan.scheduled {
            // The rollup is all that stays: made again from the detail about to go, so what a
            // writer ended after its last rollup (a failed last turn, its tokens) is kept; named
            // and started by the root the run is listed by now (a rollup made before an earlier
            // root arrived keeps its first making's, and the run moved in the listing when
            // listed from it).
            rollup_run_key(ctx, run_key, RollupIdentity::Refresh)?;
        }
        // Pruned by the hard ceiling alone: the digest never covered this run, so the rollup
        // says so instead of silently losing its detail.
        let gap = *ended_at >= plan.floor;
        conn.prepare_cached(
            "UPDATE activity_run_rollups SET detail_pruned = 1, failure_reason = \
             CASE WHEN ?2 THEN COALESCE(failure_reason, 'digest coverage gap') \
             ELSE failure_reason END WHERE run_key = ?1",
        )
        .and_then(|mut stmt| stmt.execute(params![run_key, gap]))
        .map_err(backend)?;
        let (deleted, newest) = delete_run_detail(ctx, run_key)?;
        spans_deleted += deleted;
        newest_pruned_change = newest_pruned_change.max(newest);
    }
    for run_key in &rootless {
        store_rootless_digest(ctx, *run_key)?;
        let (deleted, newest) = delete_run_detail(ctx, *run_key)?;
        spans_deleted += deleted;
        newest_pruned_change = newest_pruned_change.max(newest);
    }
    let conn = ctx.conn;
    // The change log only serves live cursors; rows this far behind the newest are unreachable
    // by any live poller. Runs with open spans keep theirs.
    let horizon: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(change_id), 0) - ?1 FROM activity_changes")
        .and_then(|mut stmt| stmt.query_row([plan.change_log_retention], |row| row.get(0)))
        .map_err(backend)?;
    // At most `change_log_trim_batch` rows a call (20,000 by default), the oldest first: the
    // first prune of a big database trimmed 7.2 million rows in one transaction, and every
    // writer waited 5.7 s for it (and the WAL grew to 259 MB). Later calls trim the rest.
    let newest_trimmed: Option<i64> = conn
        .prepare_cached(
            "SELECT MAX(change_id) FROM (SELECT change_id FROM activity_changes \
             WHERE change_id < ?1 \
             AND run_key NOT IN (SELECT run_key FROM activity_spans WHERE outcome IS NULL) \
             ORDER BY change_id LIMIT ?2)",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![horizon, plan.change_log_trim_batch], |row| {
                row.get(0)
            })
        })
        .map_err(backend)?;
    let (trimmed_below, changes_trimmed) = match newest_trimmed {
        None => (0, 0),
        Some(newest) => {
            // Each run keeps the highest seq trimmed of it, so its next change goes on from
            // there rather than from 1 once all its rows are gone (see `RUN_HIGH_SEQ_SQL`): read
            // from the rows about to go in one scan (a 20,000-row trim took 11.5 ms before;
            // grouping the rows in SQL, or `DELETE … RETURNING`, made it 17 – 23 ms; this 15).
            let mut highest: HashMap<i64, i64> = HashMap::new();
            conn.prepare_cached(
                "SELECT run_key, seq FROM activity_changes WHERE change_id <= ?1 AND run_key \
                 NOT IN (SELECT run_key FROM activity_spans WHERE outcome IS NULL)",
            )
            .and_then(|mut stmt| {
                let mut rows = stmt.query([newest])?;
                while let Some(row) = rows.next()? {
                    let (run_key, seq): (i64, i64) = (row.get(0)?, row.get(1)?);
                    let high = highest.entry(run_key).or_insert(seq);
                    *high = (*high).max(seq);
                }
                Ok(())
            })
            .map_err(backend)?;
            let trimmed = conn
                .prepare_cached(
                    "DELETE FROM activity_changes WHERE change_id <= ?1 \
                     AND run_key NOT IN (SELECT run_key FROM activity_spans WHERE outcome IS NULL)",
                )
                .and_then(|mut stmt| stmt.execute([newest]))
                .map_err(backend)?;
            let mut keep = conn
                .prepare_cached(
                    "UPDATE activity_runs SET trimmed_seq = MAX(COALESCE(trimmed_seq, 0), ?2) \
                     WHERE run_key = ?1",
                )
                .map_err(backend)?;
            for (run_key, seq) in highest {
                keep.execute([run_key, seq]).map_err(backend)?;
            }
            (newest + 1, i64::try_from(trimmed).unwrap_or(i64::MAX))
        }
    };
    // A cursor below this may have missed changes the log no longer holds (trimmed ones of spans
    // that still exist, or a pruned run's): live readers compare against it and tell such a
    // client to resync instead of going silent.
    let pruned_horizon = if newest_pruned_change > 0 {
        newest_pruned_change + 1
    } else {
        0
    };
    let new_horizon = trimmed_below.max(pruned_horizon);
    if new_horizon > 0 {
        conn.prepare_cached(
            "INSERT INTO flightlog_meta (name, value) VALUES ('change_log_trimmed_below', ?1) \
             ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)",
        )
        .and_then(|mut stmt| stmt.execute([new_horizon]))
        .map_err(backend)?;
    }
    // Spans, events and change rows are gone: cached keys and counters may now be wrong. A
    // prune that deleted nothing (the scheduled one, most passes) keeps the caches warm.
    if !candidates.is_empty() || !rootless.is_empty() || newest_trimmed.is_some() {
        ctx.keys.clear_volatile();
        ctx.keys.group_deleted_changes = true;
        // Counted, for the commit watchers of other processes: a prune logs no change, so
        // without it they saw the commit but nothing to ring for, and a run stream of theirs
        // whose run this pruned ended only at its next periodic look (2 – 4 s later; an audit).
        conn.prepare_cached(
            "INSERT INTO flightlog_meta (name, value) VALUES ('activity_prunes', 1) \
             ON CONFLICT(name) DO UPDATE SET value = value + 1",
        )
        .and_then(|mut stmt| stmt.execute([]))
        .map_err(backend)?;
    }
    Ok(PruneResult {
        runs_pruned: i64::try_from(candidates.len() + rootless.len()).unwrap_or(i64::MAX),
        spans_deleted,
        changes_trimmed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::{WriteContext, WriterCache};

    #[test]
    fn a_span_budget_takes_runs_while_they_fit_and_always_one() {
        let runs = || vec![("a", 400), ("b", 500), ("c", 200), ("d", 1)];
        assert_eq!(
            within_span_budget(runs(), None, 0, false),
            (vec!["a", "b", "c", "d"], true, 1_101)
        );
        assert_eq!(
            within_span_budget(runs(), Some(1_000), 0, false),
            (vec!["a", "b"], false, 900)
        );
        // The first run is taken however big; nothing after it that does not fit.
        assert_eq!(
            within_span_budget(vec![("huge", 50_000), ("small", 1)], Some(1_000), 0, false),
            (vec!["huge"], false, 50_000)
        );
        // Spans already taken count; then even the first may not fit, also when the runs
        // chosen before had no spans.
        assert_eq!(
            within_span_budget(runs(), Some(1_000), 700, true),
            (vec![], false, 700)
        );
        assert_eq!(
            within_span_budget(vec![("big", 5_000)], Some(1_000), 0, true),
            (vec![], false, 0)
        );
        assert_eq!(
            within_span_budget(Vec::<(&str, i64)>::new(), Some(1), 0, false),
            (vec![], true, 0)
        );
    }

    /// Held-back change rows go in whole and in order, whatever their number: statements of
    /// [`CHANGES_PER_INSERT`] rows, then of 8, 4, 2 and 1.
    #[test]
    fn change_rows_go_in_whole_whatever_their_number() {
        for count in 1..=40_i64 {
            let mut conn = Connection::open_in_memory().expect("in-memory database");
            crate::schema::migrate(&mut conn).expect("schema");
            let rows: Vec<DeferredChange> = (1..=count)
                .map(|n| DeferredChange {
                    change_id: n,
                    run_key: n % 3,
                    seq: n,
                    span_key: n * 10,
                    event_index: (n % 2 == 0).then_some(n),
                })
                .collect();
            let mut keys = WriterCache::default();
            let codec = PayloadCodec::default();
            let mut ctx = WriteContext::new(&conn, &mut keys, &codec, false);
            insert_change_rows(&mut ctx, &rows).expect("the rows go in");
            drop(ctx);
            let stored: Vec<(i64, i64, i64, i64, Option<i64>)> = conn
                .prepare(
                    "SELECT change_id, run_key, seq, span_key, event_index FROM activity_changes \
                     ORDER BY change_id",
                )
                .and_then(|mut stmt| {
                    stmt.query_map([], |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                        ))
                    })?
                    .collect()
                })
                .expect("read back");
            let expected: Vec<_> = rows
                .iter()
                .map(|row| {
                    (
                        row.change_id,
                        row.run_key,
                        row.seq,
                        row.span_key,
                        row.event_index,
                    )
                })
                .collect();
            assert_eq!(stored, expected, "{count} rows");
        }
    }

    fn id(n: usize) -> String {
        format!("{:016x}", (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn ids_of(conn: &Connection, table: &str) -> Vec<String> {
        let mut stmt = conn
            .prepare(&format!("SELECT span_id FROM {table} ORDER BY span_id"))
            .expect("prepare");
        let ids = stmt
            .query_map([], |row| row.get(0))
            .expect("query")
            .map(|id| id.expect("an id"))
            .collect();
        ids
    }

    /// The end-to-end test (`tests/span_ids.rs`) sweeps from the lowest id on; this one starts a
    /// sweep near the end of the key space, where fewer ids are left than are due.
    #[test]
    fn a_sweep_that_reaches_the_end_of_the_key_space_starts_over_from_the_lowest_id() {
        let mut conn = Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        let total = 40_000;
        {
            let tx = conn.transaction().unwrap();
            let mut insert = tx
                .prepare("INSERT INTO activity_span_ids_middle (span_id, span_key) VALUES (?1, ?2)")
                .unwrap();
            for n in 0..total {
                insert.execute(params![id(n), n as i64]).unwrap();
            }
            drop(insert);
            tx.commit().unwrap();
        }
        let mut sorted: Vec<String> = (0..total).map(id).collect();
        sorted.sort();
        // The 100 highest ids lie after the cursor.
        let mut keys = WriterCache {
            span_id_sweep_cursor: sorted[total - 101].clone(),
            ..WriterCache::default()
        };
        let codec = PayloadCodec::default();
        let mut ctx = WriteContext::new(&conn, &mut keys, &codec, false);
        // A small database: the middle's target is its minimum, so 40,000 - 16,384 ids are due,
        // but only the 100 after the cursor are taken; the next sweep starts from the lowest.
        sweep_middle_span_ids(&mut ctx, 1).unwrap();
        assert_eq!(ctx.keys.span_id_sweep_cursor, "");
        assert_eq!(ctx.keys.middle_span_ids, Some(39_900));
        assert_eq!(ids_of(&conn, "activity_span_ids"), sorted[total - 100..]);
        sweep_middle_span_ids(&mut ctx, 1).unwrap();
        let due = 39_900 - MIDDLE_SPAN_IDS_MIN as usize;
        assert_eq!(ctx.keys.span_id_sweep_cursor, sorted[due - 1]);
        assert_eq!(ctx.keys.middle_span_ids, Some(MIDDLE_SPAN_IDS_MIN));
        let mut main = sorted[..due].to_vec();
        main.extend_from_slice(&sorted[total - 100..]);
        assert_eq!(ids_of(&conn, "activity_span_ids"), main);
        assert_eq!(
            ids_of(&conn, "activity_span_ids_middle"),
            sorted[due..total - 100]
        );
        // At its target, the middle index is left alone.
        sweep_middle_span_ids(&mut ctx, 1).unwrap();
        assert_eq!(ctx.keys.middle_span_ids, Some(MIDDLE_SPAN_IDS_MIN));
    }
}
