//! [`SqliteActivityStore`]: the activity store trait on one SQLite file.
//!
//! Writes are closures queued to the database's writer thread (group commit); reads run on
//! pooled reader connections. Time defaults are read from the injected clock when the call is
//! made, so a write's timestamps do not depend on how long it waited in the queue.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use flightlog_core::activity::{
    cap_payload, ActivityChange, ActivityStore, ActivityWrite, ActivityWriteResult, CappedPayload,
    ChangeBody, ChangeDoorbell, EndSpanInput, ImportReport, ImportedSpan, LogMovement,
    OpenRootsCursor, OpenRootsPart, PayloadText, PruneOptions, PruneResult, RunListQuery, RunPage,
    RunRollupRow, RunSnapshot, SpanEventRow, SpanOutcome, SpanPatch, SpanRow, StartSpanInput,
    StoreError, TerminalRootChange, DEFAULT_PRUNE_BATCH,
};
use flightlog_core::json_depth;
use flightlog_core::{default_writer_id, BackendMetric, Clock};
use rusqlite::{params, Connection, OptionalExtension};

use crate::activity_batch;
use crate::activity_import;
use crate::activity_listing;
use crate::activity_write::{
    self as write, span_key_of, PrunePlan, LEFTOVER_RUNS_SQL, ORPHAN_RUNS_SQL, PREVIOUS_LIVES_SQL,
    SILENT_STALE_RUNS_SQL, STALE_RUNS_SQL,
};
use crate::database::{in_read_transaction, SqliteDatabase};
use crate::error::backend;
use crate::payload_codec::PayloadCodec;
use crate::rows::{
    event_from_row, payload_from_row, rollup_from_row, span_from_row, KeyNames, EVENT_COLUMNS,
    ROLLUP_COLUMNS, SPAN_COLUMNS, SPAN_COLUMN_COUNT,
};

/// The most changes `changes_since` reads on the caller's thread (a live stream's page is 500);
/// a larger or unlimited read runs apart (see [`SqliteDatabase::read_apart`]).
const LONG_READ_CHANGES: i64 = 1_000;
/// The most runs one write job of a `prune` call deletes the detail of (see `prune`): about
/// 10 – 20 ms of the writer's time, so writes wait no longer than that behind a large prune.
const PRUNE_RUNS_PER_WRITE: i64 = 100;
/// The most spans one write job of the boot sweep (`sweep_previous_lives`) closes: about
/// 10 – 30 ms of the writer's time, and that many spans' attrs in memory.
const SWEEP_SPANS_PER_WRITE: i64 = 1_000;
/// The most runs one write job of `sweep_stale` or `sweep_own_orphans` closes.
const SWEEP_RUNS_PER_WRITE: i64 = 100;

/// The most spans, and separately the most events, a run's snapshot may have to be read on the
/// caller's thread; a bigger run's snapshot runs apart (see [`SqliteDatabase::read_apart`]).
const SMALL_RUN_SPANS: i64 = 200;
const SMALL_RUN_EVENTS: i64 = 1_000;
/// The most bytes of attrs and event payloads (as stored) such a run may hold.
const SMALL_RUN_BYTES: i64 = 1 << 20;

/// The JSON of a span's own fields (ids, name, kind, times, usage, writer) in a snapshot, and
/// of an event's (span id, index, time, type), about.
const SPAN_JSON_BYTES: f64 = 400.0;
const EVENT_JSON_BYTES: f64 = 150.0;
/// How many packed values of a run's spans, and of its events, are sampled (spread over the
/// run) to learn how much text a stored byte of them holds (see [`packed_expansion`]).
const PACKED_SAMPLE: i64 = 16;

/// A run's spans (or events) counted up to `?2` rows (-1: all), with the bytes of their attrs
/// (payloads) as stored, as text and packed (BLOB). `octet_length()` and `typeof()` read a
/// value's size in bytes and its type from its row's header, not the value, for text as for
/// BLOBs (`length()` reads a text whole to count its characters: a packed 20,000-span run is
/// weighed in 20 ms, against 720 ms to read the values).
const SPAN_TALLY_SQL: &str = "SELECT count(*), \
     COALESCE(sum(CASE WHEN packed THEN 0 ELSE bytes END), 0), \
     COALESCE(sum(CASE WHEN packed THEN bytes ELSE 0 END), 0), \
     COALESCE(sum(packed), 0) FROM (SELECT \
     octet_length(attrs) AS bytes, typeof(attrs) = 'blob' AS packed \
     FROM activity_spans WHERE run_key = ?1 LIMIT ?2)";
const EVENT_TALLY_SQL: &str = "SELECT count(*), \
     COALESCE(sum(CASE WHEN packed THEN 0 ELSE bytes END), 0), \
     COALESCE(sum(CASE WHEN packed THEN bytes ELSE 0 END), 0), \
     COALESCE(sum(packed), 0) FROM (SELECT \
     octet_length(e.payload) AS bytes, typeof(e.payload) = 'blob' AS packed \
     FROM activity_spans s JOIN activity_events e ON e.span_key = s.span_key \
     WHERE s.run_key = ?1 LIMIT ?2)";
/// At most `?2` packed attrs (payloads) of a run, every `?3`-th in the run's index order (so a
/// run whose first values pack worse than the rest is not judged by them: its first 16 spans
/// of base64 made a 104 MiB snapshot look like 5 MiB), each value's bytes after its dictionary
/// id, if any, being a zstd frame. The numbering reads only keys and row headers; only the
/// picked values are read.
const SPAN_SAMPLE_SQL: &str = "SELECT attrs, 4 FROM activity_spans WHERE span_key IN \
     (SELECT k FROM (SELECT span_key AS k, row_number() OVER () AS n FROM activity_spans \
     WHERE run_key = ?1 AND typeof(attrs) = 'blob') WHERE n % ?3 = 0 LIMIT ?2)";
const EVENT_SAMPLE_SQL: &str = "SELECT e.payload, 0 FROM (SELECT sk, ei FROM \
     (SELECT e.span_key AS sk, e.event_index AS ei, row_number() OVER () AS n \
     FROM activity_spans s JOIN activity_events e ON e.span_key = s.span_key \
     WHERE s.run_key = ?1 AND e.dict_id IS NOT NULL) WHERE n % ?3 = 0 LIMIT ?2) pick \
     JOIN activity_events e ON e.span_key = pick.sk AND e.event_index = pick.ei";

/// A run's spans or events as [`SPAN_TALLY_SQL`] or [`EVENT_TALLY_SQL`] count them.
struct Tally {
    rows: i64,
    text_bytes: i64,
    packed_bytes: i64,
    packed_rows: i64,
}

impl Tally {
    fn read(conn: &Connection, sql: &str, run_key: i64, limit: i64) -> Result<Self, StoreError> {
        conn.prepare_cached(sql)
            .and_then(|mut stmt| {
                stmt.query_row(params![run_key, limit], |row| {
                    Ok(Self {
                        rows: row.get(0)?,
                        text_bytes: row.get(1)?,
                        packed_bytes: row.get(2)?,
                        packed_rows: row.get(3)?,
                    })
                })
            })
            .map_err(backend)
    }

    /// Bytes as stored.
    fn stored_bytes(&self) -> i64 {
        self.text_bytes + self.packed_bytes
    }

    /// About the bytes of JSON text the values hold, packed ones estimated from the frames of
    /// `sample_sql` (see [`packed_expansion`]).
    fn text_estimate(
        &self,
        conn: &Connection,
        sample_sql: &str,
        run_key: i64,
    ) -> Result<f64, StoreError> {
        let packed = if self.packed_bytes > 0 {
            let stride = (self.packed_rows / PACKED_SAMPLE).max(1);
            self.packed_bytes as f64 * packed_expansion(conn, sample_sql, run_key, stride)?
        } else {
            0.0
        };
        Ok(self.text_bytes as f64 + packed)
    }
}

/// How many bytes of JSON text a stored byte of the run's packed attrs (payloads) holds, from
/// the frame headers of a sample of them (which say how long their text is): from 2 for
/// word-salad tool output to 60 for attrs that repeat the dictionary, so no one figure fits.
/// 1 when none is packed or no header says.
fn packed_expansion(
    conn: &Connection,
    sql: &str,
    run_key: i64,
    stride: i64,
) -> Result<f64, StoreError> {
    let (mut stored, mut text) = (0u64, 0u64);
    let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
    let mut rows = stmt
        .query(params![run_key, PACKED_SAMPLE, stride])
        .map_err(backend)?;
    while let Some(row) = rows.next().map_err(backend)? {
        let value = row.get_ref(0).map_err(backend)?;
        let header: i64 = row.get(1).map_err(backend)?;
        let Ok(bytes) = value.as_blob() else {
            continue;
        };
        if let Some(len) = bytes
            .get(usize::try_from(header).unwrap_or(0)..)
            .and_then(crate::payload_codec::PayloadCodec::frame_text_len)
        {
            stored += bytes.len() as u64;
            text += len;
        }
    }
    Ok(if stored == 0 {
        1.0
    } else {
        (text as f64 / stored as f64).max(1.0)
    })
}

/// Whether a run is small enough for its snapshot to be a point read: at most
/// [`SMALL_RUN_SPANS`] spans, [`SMALL_RUN_EVENTS`] events and [`SMALL_RUN_BYTES`] of attrs and
/// payloads (an unknown run is small). Each count stops one past its bound, so a run of any
/// size costs at most that many index entries.
fn run_is_small(conn: &Connection, run_id: &str) -> Result<bool, StoreError> {
    let Some(key) = run_key(conn, run_id)? else {
        return Ok(true);
    };
    let spans = Tally::read(conn, SPAN_TALLY_SQL, key, SMALL_RUN_SPANS + 1)?;
    if spans.rows > SMALL_RUN_SPANS || spans.stored_bytes() > SMALL_RUN_BYTES {
        return Ok(false);
    }
    let events = Tally::read(conn, EVENT_TALLY_SQL, key, SMALL_RUN_EVENTS + 1)?;
    Ok(events.rows <= SMALL_RUN_EVENTS
        && spans.stored_bytes() + events.stored_bytes() <= SMALL_RUN_BYTES)
}

/// The estimate of [`ActivityStore::snapshot_size_estimate`]: the run's spans and events at
/// [`SPAN_JSON_BYTES`] and [`EVENT_JSON_BYTES`] each plus their attrs and payloads, packed ones
/// at their stored size times the run's [`packed_expansion`]. With `bounded`, the counts stop
/// one past the bounds of a small run and a bigger run gives `None` (to be counted apart).
fn snapshot_size_estimate(
    conn: &Connection,
    run_id: &str,
    bounded: bool,
) -> Result<Option<u64>, StoreError> {
    let Some(key) = run_key(conn, run_id)? else {
        return Ok(Some(0));
    };
    let limit = |bound: i64| if bounded { bound + 1 } else { -1 };
    let spans = Tally::read(conn, SPAN_TALLY_SQL, key, limit(SMALL_RUN_SPANS))?;
    if bounded && spans.rows > SMALL_RUN_SPANS {
        return Ok(None);
    }
    let events = Tally::read(conn, EVENT_TALLY_SQL, key, limit(SMALL_RUN_EVENTS))?;
    if bounded && events.rows > SMALL_RUN_EVENTS {
        return Ok(None);
    }
    let estimate = spans.rows as f64 * SPAN_JSON_BYTES
        + spans.text_estimate(conn, SPAN_SAMPLE_SQL, key)?
        + events.rows as f64 * EVENT_JSON_BYTES
        + events.text_estimate(conn, EVENT_SAMPLE_SQL, key)?;
    // `as` saturates: a negative or NaN sum (never) is 0, a huge one u64::MAX.
    Ok(Some(estimate as u64))
}

/// The activity store over a [`SqliteDatabase`], acting as one writer identity.
#[derive(Debug, Clone)]
pub struct SqliteActivityStore {
    db: Arc<SqliteDatabase>,
    clock: Arc<dyn Clock>,
    writer: Arc<str>,
}

impl SqliteActivityStore {
    /// Store an event whose payload is in its stored form. Compression is pure CPU work: done
    /// on the caller's thread, not the writer's.
    async fn append_capped_event(
        &self,
        span_id: &str,
        event_type: &str,
        capped: CappedPayload,
        ts: Option<i64>,
    ) -> Result<Option<SpanEventRow>, StoreError> {
        let ts = ts.unwrap_or_else(|| self.now());
        let compressed = self.db.codec().encode(&capped.json);
        self.db.maybe_train_payload_dictionary(self.now());
        let span_id = span_id.to_owned();
        let event_type = event_type.to_owned();
        self.db
            .write_deferring_changes(move |ctx| {
                write::append_event(ctx, &span_id, &event_type, &capped, compressed.as_ref(), ts)
            })
            .await
    }

    /// The changes after the cursor (see `changes_after`): a page a live stream reads is quick
    /// and read here (its hand-off to another thread would cost more), a longer or unlimited
    /// read on the long-read threads.
    async fn read_changes(
        &self,
        change_cursor: i64,
        sql_limit: i64,
        max_bytes: Option<usize>,
    ) -> Result<Vec<ActivityChange>, StoreError> {
        let read = move |db: &SqliteDatabase, conn: &Connection| {
            changes_after(
                conn,
                db.names(),
                db.codec(),
                change_cursor,
                sql_limit,
                max_bytes,
            )
        };
        if (0..=LONG_READ_CHANGES).contains(&sql_limit) {
            self.db.read(|conn| read(&self.db, conn))
        } else {
            self.db.read_apart(read).await
        }
    }

    /// A store over `db` with the default writer identity (`pid:<pid>:<start-ms>`).
    pub fn new(db: Arc<SqliteDatabase>, clock: Arc<dyn Clock>) -> Self {
        let writer = default_writer_id(clock.as_ref());
        Self::with_identity(db, clock, &writer)
    }

    /// A store over `db` acting as `writer`.
    pub fn with_identity(db: Arc<SqliteDatabase>, clock: Arc<dyn Clock>, writer: &str) -> Self {
        Self {
            db,
            clock,
            writer: Arc::from(writer),
        }
    }

    /// The database this store lives in.
    pub fn database(&self) -> &Arc<SqliteDatabase> {
        &self.db
    }

    fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    /// One step of a sweep of silent runs (`candidates`: a query of run keys taking the
    /// sweeping writer and the cutoff, such as `STALE_RUNS_SQL` or `LEFTOVER_RUNS_SQL`): a read
    /// to see whether any run qualifies, then the step's transaction, which reads them again.
    async fn sweep_silent_step(
        &self,
        candidates: &'static str,
        stale_after_ms: i64,
        now: Option<i64>,
        max_runs: i64,
    ) -> Result<(i64, bool), StoreError> {
        // Ended spans are stamped with the clock even when `now` is given (reference behaviour).
        let clock_now = self.now();
        let cutoff = now.unwrap_or(clock_now).saturating_sub(stale_after_ms);
        let writer = self.writer.clone();
        // Off the runtime's workers: the leftover candidates are found by grouping the open
        // spans, which may be many.
        let found = self
            .db
            .read_apart(|_, conn| any_row(conn, candidates, params![writer.as_ref(), cutoff]))
            .await?;
        if !found {
            return Ok((0, false));
        }
        self.db
            .write(move |ctx| {
                write::close_silent_runs(
                    ctx,
                    candidates,
                    &writer,
                    cutoff,
                    clock_now,
                    max_runs.max(1),
                )
            })
            .await
    }
}

fn query_spans(
    conn: &Connection,
    names: &KeyNames,
    codec: &PayloadCodec,
    filter_and_order: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<SpanRow>, StoreError> {
    let sql = format!("SELECT {SPAN_COLUMNS} FROM activity_spans s {filter_and_order}");
    conn.prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params, |row| span_from_row(row, 0, names, codec, conn))?
                .collect()
        })
        .map_err(backend)
}

fn run_key(conn: &Connection, run_id: &str) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT run_key FROM activity_runs WHERE run_id = ?1")
        .and_then(|mut stmt| stmt.query_row([run_id], |row| row.get(0)).optional())
        .map_err(backend)
}

fn high_water_seq(conn: &Connection, run_key: i64) -> Result<i64, StoreError> {
    conn.prepare_cached(crate::activity_write::RUN_HIGH_SEQ_SQL)
        .and_then(|mut stmt| stmt.query_row([run_key], |row| row.get(0)))
        .map_err(backend)
}

fn latest_cursor(conn: &Connection) -> Result<i64, StoreError> {
    conn.prepare_cached("SELECT COALESCE(MAX(change_id), 0) FROM activity_changes")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
        .map_err(backend)
}

fn any_row(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<bool, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| stmt.exists(params))
        .map_err(backend)
}

/// About how many bytes `value` takes as compact JSON text, without writing it: each string's
/// length and quotes, 8 bytes a number, the punctuation. For bounding a page in bytes (see
/// `changes_since_bounded`), where a cheap walk beats exactness.
fn approx_json_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 8,
        Value::String(text) => text.len() + 2,
        Value::Array(items) => {
            2 + items
                .iter()
                .map(|item| approx_json_bytes(item) + 1)
                .sum::<usize>()
        }
        Value::Object(members) => {
            2 + members
                .iter()
                .map(|(key, item)| key.len() + 4 + approx_json_bytes(item))
                .sum::<usize>()
        }
    }
}

/// About how many bytes of attrs or payload `change` holds.
fn change_bytes(change: &ActivityChange) -> usize {
    match &change.body {
        ChangeBody::Span { span } => span_attr_bytes(span),
        ChangeBody::Event { event } => event.payload.get().len(),
    }
}

/// About how many bytes of attrs `span` holds.
fn span_attr_bytes(span: &SpanRow) -> usize {
    span.attrs
        .iter()
        .map(|(key, value)| key.len() + 4 + approx_json_bytes(value))
        .sum()
}

/// Changes after the cursor (see `changes_since`), at most `sql_limit`, and when `max_bytes` is
/// given no more once they hold about that many bytes (see `changes_since_bounded`).
fn changes_after(
    conn: &Connection,
    names: &KeyNames,
    codec: &PayloadCodec,
    change_cursor: i64,
    sql_limit: i64,
    max_bytes: Option<usize>,
) -> Result<Vec<ActivityChange>, StoreError> {
    // One pass over the log: a change whose span or event row was pruned drops out of the
    // joins, as in the reference.
    let sql = format!(
        "SELECT c.change_id, c.seq, c.event_index, {SPAN_COLUMNS}, \
                e.ts, e.event_type, e.payload, e.truncated, e.dict_id \
         FROM activity_changes c \
         JOIN activity_spans s ON s.span_key = c.span_key \
         LEFT JOIN activity_events e ON c.event_index IS NOT NULL \
              AND e.span_key = c.span_key AND e.event_index = c.event_index \
         WHERE c.change_id > ?1 AND (c.event_index IS NULL OR e.span_key IS NOT NULL) \
         ORDER BY c.change_id LIMIT ?2"
    );
    let event_base = 3 + SPAN_COLUMN_COUNT;
    conn.prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params![change_cursor, sql_limit], |row| {
                let change_id: i64 = row.get(0)?;
                let seq: i64 = row.get(1)?;
                let event_index: Option<i64> = row.get(2)?;
                let run_id = names.run_id(conn, row.get(4)?)?;
                let body = match event_index {
                    None => ChangeBody::Span {
                        span: Box::new(span_from_row(row, 3, names, codec, conn)?),
                    },
                    Some(event_index) => {
                        let payload =
                            payload_from_row(row, event_base + 2, event_base + 4, codec, conn)?;
                        ChangeBody::Event {
                            event: SpanEventRow {
                                span_id: row.get(3)?,
                                event_index,
                                ts: row.get(event_base)?,
                                event_type: row.get(event_base + 1)?,
                                payload,
                                truncated: row.get::<_, i64>(event_base + 3)? != 0,
                            },
                        }
                    }
                };
                Ok(ActivityChange {
                    change_id,
                    run_id,
                    seq,
                    body,
                })
            })?
            .scan(0usize, |held, change| {
                // Stop after the change that brought the page past the bound.
                if max_bytes.is_some_and(|max| *held > max) {
                    return None;
                }
                if let Ok(change) = &change {
                    *held = held.saturating_add(change_bytes(change));
                }
                Some(change)
            })
            .collect()
        })
        .map_err(backend)
}

fn snapshot(
    conn: &Connection,
    names: &KeyNames,
    codec: &PayloadCodec,
    run_id: &str,
) -> Result<Option<RunSnapshot>, StoreError> {
    let Some(run_key) = run_key(conn, run_id)? else {
        return Ok(None);
    };
    let spans = query_spans(
        conn,
        names,
        codec,
        "WHERE s.run_key = ?1 ORDER BY s.started_at, s.span_key",
        [run_key],
    )?;
    if spans.is_empty() {
        return Ok(None);
    }
    // Events tied on (ts, eventIndex) come in their spans' order, the reference's: its query
    // has no further key, and SQLite meets it by scanning the run's spans by start time and
    // sorting stably, so ties follow the spans' `started_at` (then their insertion).
    let sql = format!(
        "SELECT {EVENT_COLUMNS} FROM activity_events e \
         JOIN activity_spans s ON s.span_key = e.span_key \
         WHERE s.run_key = ?1 ORDER BY e.ts, e.event_index, s.started_at, e.span_key"
    );
    let events = conn
        .prepare_cached(&sql)
        .and_then(|mut stmt| {
            stmt.query_map([run_key], |row| event_from_row(row, 0, codec, conn))?
                .collect()
        })
        .map_err(backend)?;
    Ok(Some(RunSnapshot {
        run_id: run_id.to_owned(),
        spans,
        events,
        high_water_seq: high_water_seq(conn, run_key)?,
        change_cursor: latest_cursor(conn)?,
    }))
}

/// The newest seq of each span's non-event changes in run `run_key` after seq `after`, by span
/// key (one pass over the run's later changes, in its `(run_key, seq)` index).
fn newest_span_changes_after(
    conn: &Connection,
    run_key: i64,
    after: i64,
) -> Result<HashMap<i64, i64>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT span_key, MAX(seq) FROM activity_changes \
             WHERE run_key = ?1 AND seq > ?2 AND event_index IS NULL GROUP BY span_key",
        )
        .map_err(backend)?;
    let newest = stmt
        .query_map(params![run_key, after], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .and_then(|rows| rows.collect::<rusqlite::Result<HashMap<i64, i64>>>())
        .map_err(backend)?;
    Ok(newest)
}

#[async_trait]
impl ActivityStore for SqliteActivityStore {
    fn writer(&self) -> &str {
        &self.writer
    }

    fn with_writer(&self, writer: &str) -> Arc<dyn ActivityStore> {
        Arc::new(Self::with_identity(
            self.db.clone(),
            self.clock.clone(),
            writer,
        ))
    }

    fn change_doorbell(&self) -> ChangeDoorbell {
        self.db.change_doorbell()
    }

    fn backend_metrics(&self) -> Vec<BackendMetric> {
        self.db.backend_metrics()
    }

    fn health(&self) -> Result<(), StoreError> {
        self.db.check_file()
    }

    async fn start_span(&self, input: StartSpanInput) -> Result<SpanRow, StoreError> {
        json_depth::check_object("attrs", input.attrs.as_ref())
            .map_err(StoreError::InvalidInput)?;
        let now = self.now();
        let writer = self.writer.clone();
        let attrs = write::stored_attrs(input.attrs.as_ref(), self.db.codec());
        self.db.maybe_train_payload_dictionary(now);
        self.db
            .write_deferring_changes(move |ctx| {
                write::start_span(ctx, &input, attrs.as_ref(), &writer, now)
            })
            .await
    }

    async fn end_span(&self, span_id: &str, input: EndSpanInput) -> Result<bool, StoreError> {
        json_depth::check_object("attrs", input.attrs.as_ref())
            .map_err(StoreError::InvalidInput)?;
        let now = self.now();
        let span_id = span_id.to_owned();
        self.db
            .write_deferring_changes(move |ctx| write::end_span(ctx, &span_id, &input, now))
            .await
    }

    async fn patch_span(&self, span_id: &str, patch: SpanPatch) -> Result<bool, StoreError> {
        json_depth::check_object("attrs", patch.attrs.as_ref())
            .map_err(StoreError::InvalidInput)?;
        let span_id = span_id.to_owned();
        self.db
            .write_deferring_changes(move |ctx| write::patch_span(ctx, &span_id, &patch))
            .await
    }

    async fn append_event(
        &self,
        span_id: &str,
        event_type: &str,
        payload: Option<&serde_json::Value>,
        ts: Option<i64>,
    ) -> Result<Option<SpanEventRow>, StoreError> {
        json_depth::check_value("payload", payload).map_err(StoreError::InvalidInput)?;
        // Capping is pure CPU work: done on the caller's thread, not the writer's.
        self.append_capped_event(span_id, event_type, cap_payload(payload), ts)
            .await
    }

    async fn append_event_text(
        &self,
        span_id: &str,
        event_type: &str,
        payload: PayloadText,
        ts: Option<i64>,
    ) -> Result<Option<SpanEventRow>, StoreError> {
        self.append_capped_event(span_id, event_type, payload.into_capped(), ts)
            .await
    }

    async fn heartbeat(&self, span_id: &str, at: Option<i64>) -> Result<(), StoreError> {
        let at = at.unwrap_or_else(|| self.now());
        let span_id = span_id.to_owned();
        self.db
            .write(move |ctx| write::heartbeat(ctx, &span_id, at))
            .await
    }

    async fn cascade_close(
        &self,
        run_id: &str,
        outcome: SpanOutcome,
        reason: &str,
    ) -> Result<i64, StoreError> {
        let now = self.now();
        let run_id = run_id.to_owned();
        let reason = reason.to_owned();
        self.db
            .write(move |ctx| write::cascade_close(ctx, &run_id, &outcome, &reason, now))
            .await
    }

    async fn sweep_own_orphans(&self) -> Result<i64, StoreError> {
        let now = self.now();
        // The runs are read once, as the reference's look (the common case finds none and takes
        // no write lock), then closed in write jobs of at most `SWEEP_RUNS_PER_WRITE` runs in its
        // order (one transaction held every writer for the whole sweep; a list read again for
        // each part grouped every open span each time: a review's finding).
        let run_keys = self
            .db
            .read_apart(|_, conn| write::run_keys(conn, ORPHAN_RUNS_SQL, []))
            .await?;
        let mut closed = 0;
        let part_len = usize::try_from(SWEEP_RUNS_PER_WRITE).unwrap_or(usize::MAX);
        for part in run_keys.chunks(part_len) {
            let part = part.to_vec();
            closed += self
                .db
                .write(move |ctx| write::sweep_own_orphans(ctx, now, &part))
                .await?;
        }
        Ok(closed)
    }

    async fn sweep_previous_lives(&self, life_prefix: &str) -> Result<i64, StoreError> {
        let now = self.now();
        let prefix = life_prefix.to_owned();
        let writer = self.writer.clone();
        // The common case finds nothing and must not take the write lock for it.
        let found = self.db.read(|conn| {
            any_row(
                conn,
                PREVIOUS_LIVES_SQL,
                params![prefix.as_str(), writer.as_ref(), i64::MIN],
            )
        })?;
        if !found {
            return Ok(0);
        }
        // In write jobs of at most `SWEEP_SPANS_PER_WRITE` spans: one transaction closing the
        // 300,000 open spans a killed server left held every other server's writes on the file
        // 5.9 s (1.5 million: 10 s, and a 503), and read every span's attrs at once (824 MB).
        // Each part goes on from the run the last one ended in.
        let mut closed = 0;
        let mut from_run = i64::MIN;
        loop {
            let (prefix, writer) = (prefix.clone(), writer.clone());
            let (part, more, last_run) = self
                .db
                .write(move |ctx| {
                    write::sweep_previous_lives(
                        ctx,
                        &prefix,
                        &writer,
                        now,
                        (from_run, SWEEP_SPANS_PER_WRITE),
                    )
                })
                .await?;
            closed += part;
            from_run = last_run;
            // (A step that closed nothing would find the same candidates again.)
            if !more || part == 0 {
                return Ok(closed);
            }
        }
    }

    async fn sweep_stale(&self, stale_after_ms: i64, now: Option<i64>) -> Result<i64, StoreError> {
        // Every stale run, as the reference's, in steps of at most `SWEEP_RUNS_PER_WRITE` runs
        // in its order (one transaction held every writer for as long as the whole sweep), all
        // judged by one cutoff, as the reference's one look.
        let now = Some(now.unwrap_or_else(|| self.now()));
        let mut closed = 0;
        loop {
            let (part, more) = self
                .sweep_silent_step(STALE_RUNS_SQL, stale_after_ms, now, SWEEP_RUNS_PER_WRITE)
                .await?;
            closed += part;
            // (A step that closed nothing would find the same candidates again.)
            if !more || part == 0 {
                return Ok(closed);
            }
        }
    }

    async fn sweep_stale_step(
        &self,
        stale_after_ms: i64,
        now: Option<i64>,
        max_roots: i64,
    ) -> Result<(i64, bool), StoreError> {
        self.sweep_silent_step(SILENT_STALE_RUNS_SQL, stale_after_ms, now, max_roots)
            .await
    }

    async fn sweep_leftovers_step(
        &self,
        stale_after_ms: i64,
        now: Option<i64>,
        max_runs: i64,
    ) -> Result<(i64, bool), StoreError> {
        self.sweep_silent_step(LEFTOVER_RUNS_SQL, stale_after_ms, now, max_runs)
            .await
    }

    fn now_ms(&self) -> i64 {
        self.now()
    }

    async fn open_roots_part(
        &self,
        part: OpenRootsPart,
    ) -> Result<(Vec<SpanRow>, Option<OpenRootsCursor>), StoreError> {
        // On the open roots' own partial index (by start, then key; without statistics SQLite
        // read every root through `activity_spans_roots`, 0.3 – 0.45 s at 340,000 roots): a
        // range seek to the cursor, so a part far into the roots reads no entry before it; the
        // cutoff of `findStuck` bounds the start.
        let (order, past, cmp) = if part.newest_first {
            ("DESC", "<", "<=")
        } else {
            ("ASC", ">", ">=")
        };
        let after = if part.after.is_some() {
            format!(
                "AND s.started_at {cmp} ?2 AND (s.started_at {past} ?2 OR s.span_key {past} ?3)"
            )
        } else {
            "AND ?2 IS NULL AND ?3 = 0".to_owned()
        };
        // No cutoff is no bound at all (a start may be `i64::MAX` through the store's API).
        let cutoff = if part.started_before.is_some() {
            "AND s.started_at < ?1"
        } else {
            "AND ?1 IS NULL"
        };
        let sql = format!(
            "SELECT s.span_key, {SPAN_COLUMNS} FROM activity_spans s \
             INDEXED BY activity_spans_open_roots \
             WHERE s.outcome IS NULL AND s.parent_span_id IS NULL {cutoff} {after} \
             ORDER BY s.started_at {order}, s.span_key {order}"
        );
        let before = part.started_before;
        let (after_start, after_key) = match part.after {
            Some(cursor) => (Some(cursor.started_at), cursor.tie),
            None => (None, 0),
        };
        self.db
            .read_apart(move |db, conn| {
                let mut roots = Vec::new();
                let mut held = 0usize;
                let mut last = None;
                let mut more = false;
                let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
                let mut rows = stmt
                    .query(params![before, after_start, after_key])
                    .map_err(backend)?;
                while let Some(row) = rows.next().map_err(backend)? {
                    if held > part.max_bytes {
                        more = true;
                        break;
                    }
                    let key: i64 = row.get(0).map_err(backend)?;
                    let span =
                        span_from_row(row, 1, db.names(), db.codec(), conn).map_err(backend)?;
                    held = held.saturating_add(span_attr_bytes(&span));
                    last = Some(OpenRootsCursor {
                        started_at: span.started_at,
                        tie: key,
                    });
                    roots.push(span);
                }
                Ok((roots, if more { last } else { None }))
            })
            .await
    }

    async fn find_stuck(
        &self,
        threshold_ms: i64,
        now: Option<i64>,
    ) -> Result<Vec<SpanRow>, StoreError> {
        let cutoff = now
            .unwrap_or_else(|| self.now())
            .saturating_sub(threshold_ms);
        let (stuck, _) = self
            .open_roots_part(OpenRootsPart {
                newest_first: false,
                started_before: Some(cutoff),
                after: None,
                max_bytes: usize::MAX,
            })
            .await?;
        Ok(stuck)
    }

    async fn changes_since(
        &self,
        change_cursor: i64,
        limit: i64,
    ) -> Result<Vec<ActivityChange>, StoreError> {
        let mut changes = self.read_changes(change_cursor, limit, None).await?;
        if limit < 0 {
            // The reference slices with the negative limit after an unlimited SQL LIMIT.
            let keep = changes.len().saturating_sub(limit.unsigned_abs() as usize);
            changes.truncate(keep);
        }
        Ok(changes)
    }

    async fn changes_since_bounded(
        &self,
        change_cursor: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Vec<ActivityChange>, StoreError> {
        self.read_changes(change_cursor, limit.clamp(0, 10_000), Some(max_bytes))
            .await
    }

    async fn terminal_root_changes_since(
        &self,
        change_cursor: i64,
        limit: i64,
    ) -> Result<Vec<TerminalRootChange>, StoreError> {
        // The reference groups every change after the cursor by span and keeps each group's
        // newest (0.5 s for `after=0` over 2.4 million changes, all of it before the first row).
        // The same rows, found in change order and stopping at the limit: a terminal root's
        // change is its newest when no later non-event change of the same span follows it in
        // its run (a run's seqs grow with change ids). That is decided per run, not per row:
        // the first candidate of a run met reads the newest seq of each span's non-event
        // changes after it, once (a probe per candidate scanned the run's later changes each
        // time, so a run of 20,000 roots, as a trace whose spans lost their parents gives,
        // took 10 s a page).
        let sql = format!(
            "SELECT c.change_id, c.run_key, c.seq, c.span_key, {SPAN_COLUMNS} \
             FROM activity_changes c \
             JOIN activity_spans s ON s.span_key = c.span_key \
             WHERE c.change_id > ?1 AND c.event_index IS NULL \
               AND s.parent_span_id IS NULL AND s.outcome IS NOT NULL \
             ORDER BY c.change_id"
        );
        // SQLite's `LIMIT` with a negative value: no limit (the reference's behaviour).
        let wanted = usize::try_from(limit).unwrap_or(usize::MAX);
        self.db
            .read_apart(move |db, conn| {
                let mut found = Vec::new();
                if wanted == 0 {
                    return Ok(found);
                }
                let mut newest_by_run: HashMap<i64, HashMap<i64, i64>> = HashMap::new();
                let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
                let mut rows = stmt.query(params![change_cursor]).map_err(backend)?;
                while let Some(row) = rows.next().map_err(backend)? {
                    let run_key: i64 = row.get(1).map_err(backend)?;
                    let seq: i64 = row.get(2).map_err(backend)?;
                    let span_key: i64 = row.get(3).map_err(backend)?;
                    let newest = match newest_by_run.entry(run_key) {
                        std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
                        std::collections::hash_map::Entry::Vacant(entry) => {
                            entry.insert(newest_span_changes_after(conn, run_key, seq)?)
                        }
                    };
                    if newest.get(&span_key).is_some_and(|newest| *newest > seq) {
                        continue;
                    }
                    found.push(TerminalRootChange {
                        change_id: row.get(0).map_err(backend)?,
                        span: span_from_row(row, 4, db.names(), db.codec(), conn)
                            .map_err(backend)?,
                    });
                    if found.len() >= wanted {
                        break;
                    }
                }
                Ok(found)
            })
            .await
    }

    async fn change_log_horizon(&self) -> Result<i64, StoreError> {
        self.db.read(|conn| {
            conn.prepare_cached(
                "SELECT COALESCE((SELECT value FROM flightlog_meta \
                 WHERE name = 'change_log_trimmed_below'), 0)",
            )
            .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
            .map_err(backend)
        })
    }

    async fn latest_change_cursor(&self) -> Result<i64, StoreError> {
        self.db.read(latest_cursor)
    }

    async fn snapshot_run(&self, run_id: &str) -> Result<Option<RunSnapshot>, StoreError> {
        // Most runs are small: theirs is a point read, and waiting for one of the long reads'
        // places behind listings made a small run's snapshot take 230 - 320 ms (p50) while
        // twenty clients listed runs. Only a run too big to tell at a glance goes apart.
        // The size check and a small run's read share one reader and one read transaction.
        let small = self.db.read(|conn| {
            in_read_transaction(conn, |conn| {
                if !run_is_small(conn, run_id)? {
                    return Ok(None);
                }
                snapshot(conn, self.db.names(), self.db.codec(), run_id).map(Some)
            })
        })?;
        if let Some(snapshot_of_small_run) = small {
            return Ok(snapshot_of_small_run);
        }
        self.db
            .read_apart(|db, conn| {
                in_read_transaction(conn, |conn| snapshot(conn, db.names(), db.codec(), run_id))
            })
            .await
    }

    async fn snapshot_size_estimate(&self, run_id: &str) -> Result<u64, StoreError> {
        // A small run is counted on the caller's thread, a bigger one apart: counting a run of
        // a million events walks a million index entries.
        if let Some(estimate) = self
            .db
            .read(|conn| snapshot_size_estimate(conn, run_id, true))?
        {
            return Ok(estimate);
        }
        self.db
            .read_apart(|_, conn| snapshot_size_estimate(conn, run_id, false))
            .await
            .map(Option::unwrap_or_default)
    }

    async fn run_high_water_seq(&self, run_id: &str) -> Result<i64, StoreError> {
        self.db.read(|conn| match run_key(conn, run_id)? {
            Some(key) => high_water_seq(conn, key),
            None => Ok(0),
        })
    }

    async fn run_trimmed_seq(&self, run_id: &str) -> Result<i64, StoreError> {
        self.db.read(|conn| match run_key(conn, run_id)? {
            Some(key) => conn
                .prepare_cached(
                    "SELECT COALESCE(trimmed_seq, 0) FROM activity_runs WHERE run_key = ?1",
                )
                .and_then(|mut stmt| stmt.query_row([key], |row| row.get(0)))
                .map_err(backend),
            None => Ok(0),
        })
    }

    async fn run_newest_change_id(&self, run_id: &str) -> Result<Option<i64>, StoreError> {
        // A run's seqs grow with its change ids (a pruned run's changes go with it, so a run
        // started again under its id begins anew), so its highest seq is its newest change.
        self.db.read(|conn| match run_key(conn, run_id)? {
            Some(key) => conn
                .prepare_cached(
                    "SELECT change_id FROM activity_changes WHERE run_key = ?1 \
                     ORDER BY seq DESC LIMIT 1",
                )
                .and_then(|mut stmt| stmt.query_row([key], |row| row.get(0)).optional())
                .map_err(backend),
            None => Ok(None),
        })
    }

    async fn log_movement(&self, after: i64, up_to: i64) -> Result<LogMovement, StoreError> {
        self.db.read(|conn| {
            let runs = if up_to > after {
                conn.prepare_cached(
                    "SELECT r.run_id FROM activity_runs r WHERE r.run_key IN \
                     (SELECT run_key FROM activity_changes WHERE change_id > ?1 AND change_id <= ?2)",
                )
                .and_then(|mut stmt| {
                    stmt.query_map([after, up_to], |row| row.get(0))?
                        .collect::<Result<Vec<String>, _>>()
                })
                .map_err(backend)?
            } else {
                Vec::new()
            };
            let (horizon, prunes) = conn
                .prepare_cached(
                    "SELECT \
                     COALESCE((SELECT value FROM flightlog_meta \
                       WHERE name = 'change_log_trimmed_below'), 0), \
                     COALESCE((SELECT value FROM flightlog_meta WHERE name = 'activity_prunes'), 0)",
                )
                .and_then(|mut stmt| stmt.query_row([], |row| Ok((row.get(0)?, row.get(1)?))))
                .map_err(backend)?;
            Ok(LogMovement {
                runs,
                horizon,
                prunes,
            })
        })
    }

    async fn get_span(&self, span_id: &str) -> Result<Option<SpanRow>, StoreError> {
        self.db.read(|conn| {
            Ok(query_spans(
                conn,
                self.db.names(),
                self.db.codec(),
                concat!("WHERE s.span_key = ", span_key_of!("?1")),
                [span_id],
            )?
            .into_iter()
            .next())
        })
    }

    async fn open_root_spans(&self) -> Result<Vec<SpanRow>, StoreError> {
        // One part without a bound: all of them.
        let (roots, _) = self
            .open_roots_part(OpenRootsPart {
                newest_first: true,
                started_before: None,
                after: None,
                max_bytes: usize::MAX,
            })
            .await?;
        Ok(roots)
    }

    async fn rollup_run(&self, run_id: &str) -> Result<(), StoreError> {
        let run_id = run_id.to_owned();
        self.db
            .write(move |ctx| write::rollup_run(ctx, &run_id))
            .await
    }

    async fn read_rollup(&self, run_id: &str) -> Result<Option<RunRollupRow>, StoreError> {
        let sql = format!(
            "SELECT {ROLLUP_COLUMNS} FROM activity_run_rollups o \
             JOIN activity_runs r ON r.run_key = o.run_key WHERE r.run_id = ?1"
        );
        self.db.read(|conn| {
            conn.prepare_cached(&sql)
                .and_then(|mut stmt| stmt.query_row([run_id], rollup_from_row).optional())
                .map_err(backend)
        })
    }

    async fn prune(&self, options: PruneOptions) -> Result<PruneResult, StoreError> {
        let now = options.now.unwrap_or_else(|| self.now());
        let plan = PrunePlan {
            floor: options.digest_floor_at.max(0),
            ceiling: now.saturating_sub(options.hard_ceiling_ms),
            batch: options.batch.unwrap_or(DEFAULT_PRUNE_BATCH),
            change_log_retention: self.db.change_log_retention(),
            change_log_trim_batch: self.db.change_log_trim_batch(),
            max_spans: options.max_spans,
            scheduled: options.scheduled,
            now,
        };
        // One write job prunes at most `PRUNE_RUNS_PER_WRITE` runs: an admin prune of 10,000
        // runs in one transaction held every writer for 0.25 s (10 spans a run: bench/
        // prune_under_load.py) to 2 s (a scale audit's larger runs). Each part
        // takes the next runs of the same order (ended, then key), so the parts together prune
        // what one transaction would, and count as much; a part that finds fewer runs than it
        // may take is the last. The scheduled prune bounds itself (a span budget) and stays one.
        let chunked = !plan.scheduled
            && plan.max_spans.is_none()
            && (plan.batch < 0 || plan.batch > PRUNE_RUNS_PER_WRITE);
        if !chunked {
            return self.db.write(move |ctx| write::prune(ctx, plan)).await;
        }
        let mut total = PruneResult::default();
        // Negative: no limit (the reference's SQL `LIMIT`).
        let mut left = plan.batch;
        loop {
            let part_batch = if left < 0 {
                PRUNE_RUNS_PER_WRITE
            } else {
                left.min(PRUNE_RUNS_PER_WRITE)
            };
            let part_plan = PrunePlan {
                batch: part_batch,
                ..plan
            };
            let part = self
                .db
                .write(move |ctx| write::prune(ctx, part_plan))
                .await?;
            total.runs_pruned += part.runs_pruned;
            total.spans_deleted += part.spans_deleted;
            total.changes_trimmed += part.changes_trimmed;
            if left > 0 {
                left = left.saturating_sub(part.runs_pruned);
            }
            if part.runs_pruned < part_batch || left == 0 {
                return Ok(total);
            }
        }
    }

    async fn write_batch(
        &self,
        writes: Vec<ActivityWrite>,
    ) -> Vec<Result<ActivityWriteResult, StoreError>> {
        let now = self.now();
        let count = writes.len();
        // Shared, so the inputs are dropped by the caller, not on the writer thread.
        let prepared = Arc::new(activity_batch::prepare(writes, self.db.codec(), now));
        self.db.maybe_train_payload_dictionary(now);
        let writer = self.writer.clone();
        let for_writer = Arc::clone(&prepared);
        let outcome = self
            .db
            .write(move |ctx| activity_batch::apply_batch(ctx, &for_writer, &writer, now))
            .await;
        drop(prepared);
        match outcome {
            Ok(results) => results,
            Err(err) => (0..count).map(|_| Err(err.clone())).collect(),
        }
    }

    async fn list_runs(&self, query: RunListQuery) -> Result<RunPage, StoreError> {
        let short = activity_listing::is_short(&query);
        let read =
            move |_: &SqliteDatabase, conn: &Connection| activity_listing::list_runs(conn, &query);
        if short {
            self.db.read_apart_short(read).await
        } else {
            self.db.read_apart(read).await
        }
    }

    async fn import_spans(&self, spans: Vec<ImportedSpan>) -> Result<ImportReport, StoreError> {
        if spans.is_empty() {
            return Ok(ImportReport::default());
        }
        let now = self.now();
        // Shared, so the last reference (and the drop of every span's attrs and events) is the
        // caller's, after the answer, not the writer thread's.
        let prepared = Arc::new(activity_import::prepare(spans, self.db.codec()));
        self.db.maybe_train_payload_dictionary(now);
        let writer = self.writer.clone();
        let for_writer = Arc::clone(&prepared);
        let db = Arc::clone(&self.db);
        let report = self
            .db
            .write(move |ctx| {
                activity_import::import_spans(ctx, &for_writer, &writer, now, db.codec())
            })
            .await;
        drop(prepared);
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::LONG_READS_AT_ONCE;
    use crate::SqliteConfig;
    use flightlog_core::activity::{ActivityWrite, SpanKind, SpanOrigin};
    use flightlog_core::SystemClock;
    use std::time::Duration;

    fn start_input(span_id: String, run_id: &str) -> StartSpanInput {
        StartSpanInput {
            span_id,
            run_id: run_id.to_owned(),
            parent_span_id: None,
            name: "tool".to_owned(),
            kind: SpanKind::Tool,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: None,
        }
    }

    fn start(span_id: String, run_id: &str) -> ActivityWrite {
        ActivityWrite::StartSpan(start_input(span_id, run_id))
    }

    /// A runtime like the server's (long reads run apart only on a multi-thread one).
    fn multi_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("runtime")
    }

    /// A store on a new database file in a temporary directory (kept while the handle lives).
    fn open_store() -> (tempfile::TempDir, Arc<SqliteDatabase>, SqliteActivityStore) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("activity.db")))
            .expect("open the database");
        let store = SqliteActivityStore::new(Arc::clone(&db), Arc::new(SystemClock));
        (dir, db, store)
    }

    /// Fill every place for long reads with a read that waits for the returned sender.
    fn hold_every_long_read_place(
        runtime: &tokio::runtime::Runtime,
        db: &Arc<SqliteDatabase>,
    ) -> Vec<std::sync::mpsc::Sender<()>> {
        let mut releases = Vec::new();
        let (started, all_started) = std::sync::mpsc::channel::<()>();
        for _ in 0..LONG_READS_AT_ONCE {
            let (release, released) = std::sync::mpsc::channel::<()>();
            releases.push(release);
            let (db, started) = (Arc::clone(db), started.clone());
            runtime.spawn(async move {
                db.read_apart(move |_, _| {
                    let _ = started.send(());
                    let _ = released.recv_timeout(Duration::from_secs(30));
                    Ok(())
                })
                .await
            });
        }
        for _ in 0..LONG_READS_AT_ONCE {
            all_started
                .recv_timeout(Duration::from_secs(20))
                .expect("a long read took its place");
        }
        releases
    }

    /// Run `read` while every long read's place is held (by [`hold_every_long_read_place`]),
    /// check that it is still waiting after a while, then free the places and return its result.
    fn waits_for_a_long_read_place<T: Send + 'static>(
        runtime: &tokio::runtime::Runtime,
        releases: Vec<std::sync::mpsc::Sender<()>>,
        what: &str,
        read: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let task = runtime.spawn(read);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !task.is_finished(),
            "{what} did not wait for a long read's place"
        );
        for release in releases {
            let _ = release.send(());
        }
        runtime.block_on(task).expect("the read's task")
    }

    #[test]
    fn a_small_runs_snapshot_does_not_wait_for_a_long_read_place_and_a_big_ones_does() {
        let (_dir, db, store) = open_store();
        let runtime = multi_thread_runtime();
        runtime.block_on(async {
            let small = (0..3)
                .map(|n| start(format!("small-{n}"), "small"))
                .collect();
            let big = (0..=SMALL_RUN_SPANS)
                .map(|n| start(format!("big-{n}"), "big"))
                .collect();
            for batch in [small, big] {
                for result in store.write_batch(batch).await {
                    result.expect("start a span");
                }
            }
        });
        let releases = hold_every_long_read_place(&runtime, &db);

        let small = runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), store.snapshot_run("small")).await
            })
            .expect("a small run's snapshot waited for a long read's place")
            .expect("the snapshot")
            .expect("the run exists");
        assert_eq!(small.spans.len(), 3);

        let big = waits_for_a_long_read_place(&runtime, releases, "a big run's snapshot", {
            let store = store.clone();
            async move { store.snapshot_run("big").await }
        })
        .expect("the snapshot")
        .expect("the run exists");
        assert_eq!(big.spans.len(), SMALL_RUN_SPANS as usize + 1);
    }

    /// A page of the newest runs is read on places of its own; a filtered listing, whose work
    /// its limit does not bound, waits for a long read's place.
    #[test]
    fn a_short_listing_does_not_wait_for_a_long_read_place_and_a_filtered_one_does() {
        use flightlog_core::activity::{RunListQuery, SpanOutcome};
        let (_dir, db, store) = open_store();
        let runtime = multi_thread_runtime();
        runtime.block_on(async {
            let roots = (0..3).map(|n| start(format!("root-{n}"), &format!("run-{n}")));
            for result in store.write_batch(roots.collect()).await {
                result.expect("start a span");
            }
        });
        let listing = |outcome: Option<SpanOutcome>| RunListQuery {
            state: None,
            outcome,
            origin: None,
            limit: 50,
            before: None,
        };
        let releases = hold_every_long_read_place(&runtime, &db);

        let page = runtime
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), store.list_runs(listing(None))).await
            })
            .expect("a page of the newest runs waited for a long read's place")
            .expect("the page");
        assert_eq!(page.runs.len(), 3);

        let filtered = waits_for_a_long_read_place(&runtime, releases, "a filtered listing", {
            let store = store.clone();
            async move { store.list_runs(listing(Some(SpanOutcome::Error))).await }
        })
        .expect("the listing");
        assert!(filtered.runs.is_empty());
    }

    #[test]
    fn a_run_is_small_up_to_its_bounds_of_spans_events_and_bytes() {
        let (_dir, db, store) = open_store();
        let small = |run: &str| db.read(|conn| run_is_small(conn, run)).expect("size a run");
        assert!(small("unknown"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let spans = (0..SMALL_RUN_SPANS)
                .map(|n| start(format!("s-{n}"), "spans"))
                .collect();
            for result in store.write_batch(spans).await {
                result.expect("start a span");
            }
            let one = (0..1).map(|n| start(format!("e-{n}"), "events")).collect();
            for result in store.write_batch(one).await {
                result.expect("start a span");
            }
            for _ in 0..SMALL_RUN_EVENTS {
                store
                    .append_event("e-0", "note", None, None)
                    .await
                    .expect("append")
                    .expect("the span exists");
            }
        });
        assert!(small("spans"), "{SMALL_RUN_SPANS} spans is small");
        assert!(small("events"), "{SMALL_RUN_EVENTS} events is small");
        runtime.block_on(async {
            store
                .write_batch(vec![start("s-last".to_owned(), "spans")])
                .await
                .remove(0)
                .expect("start a span");
            store
                .append_event("e-0", "note", None, None)
                .await
                .expect("append")
                .expect("the span exists");
        });
        assert!(!small("spans"), "one span more is not small");
        assert!(!small("events"), "one event more is not small");

        // Two spans whose attrs (text: no dictionary is trained yet) hold 0.6 MiB each.
        runtime.block_on(async {
            for n in 0..2 {
                let mut attrs = serde_json::Map::new();
                attrs.insert("big".into(), "x".repeat(600 * 1024).into());
                let mut input = start_input(format!("b-{n}"), "bytes");
                input.attrs = Some(attrs);
                store.start_span(input).await.expect("start a span");
                assert_eq!(small("bytes"), n == 0, "after {} big spans", n + 1);
            }
        });
    }

    /// The estimate of a snapshot's size is near the size of the snapshot serialized, for a
    /// small run counted on the caller's thread and for a big one (past the small bounds,
    /// counted apart), with attrs as text and packed with a trained dictionary, and for a run
    /// whose first values pack far worse than the rest.
    #[test]
    fn a_snapshot_size_estimate_is_near_the_snapshot_json() {
        let (_dir, db, store) = open_store();
        let store = &store;
        let runtime = multi_thread_runtime();
        // Varied text (not one letter repeated): compressible like real attrs, not absurdly;
        // some of it not ASCII (the estimate counts bytes, as the JSON does).
        let words = [
            "grep",
            "src/main.rs",
            "über",
            "build",
            "日本語",
            "error: E0308",
            "fn",
            "{",
        ];
        // The first `noisy` spans get hex noise too (they pack far worse than the others).
        let write_run = |run: &'static str, spans: usize, noisy: usize| async move {
            let writes = (0..spans)
                .map(|n| {
                    let words: Vec<&str> = (0..400)
                        .map(|i| words[(i * 7 + n + i / 13) % words.len()])
                        .collect();
                    let mut text = words.join(" ");
                    if n < noisy {
                        let mut state = n as u64 + 1;
                        for _ in 0..600 {
                            state = state
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            text.push_str(&format!("{:x}", state >> 60));
                        }
                    }
                    let mut attrs = serde_json::Map::new();
                    attrs.insert("output".into(), text.into());
                    let mut input = start_input(format!("{run}-{n}"), run);
                    input.attrs = Some(attrs);
                    ActivityWrite::StartSpan(input)
                })
                .collect();
            for result in store.write_batch(writes).await {
                result.expect("start a span");
            }
            for n in 0..spans {
                store
                    .append_event(&format!("{run}-{n}"), "note", None, None)
                    .await
                    .expect("append")
                    .expect("the span exists");
            }
        };
        let packed_spans = |run: &str| -> i64 {
            db.read(|conn| {
                conn.query_row(
                    "SELECT count(*) FROM activity_spans s JOIN activity_runs r \
                     ON r.run_key = s.run_key WHERE r.run_id = ?1 AND typeof(s.attrs) = 'blob'",
                    [run],
                    |row| row.get(0),
                )
                .map_err(backend)
            })
            .expect("count packed spans")
        };
        let check = |run: &'static str| async move {
            let snapshot = store.snapshot_run(run).await.expect("read").expect("a run");
            let actual = serde_json::to_vec(&snapshot).expect("serialize").len() as f64;
            let estimate = store.snapshot_size_estimate(run).await.expect("estimate") as f64;
            assert!(
                (0.75..=1.5).contains(&(estimate / actual)),
                "{run}: estimate {estimate} against {actual} bytes"
            );
        };
        runtime.block_on(async {
            assert_eq!(store.snapshot_size_estimate("unknown").await.ok(), Some(0));
            write_run("small-text", 20, 0).await;
            write_run("big-text", 600, 0).await;
            assert_eq!(packed_spans("big-text"), 0, "no dictionary yet");
            check("small-text").await;
            check("big-text").await;
            // The first runs' samples train a dictionary (on a thread of its own).
            let waited = std::time::Instant::now();
            let dictionaries = || -> i64 {
                db.read(|conn| {
                    conn.query_row("SELECT count(*) FROM payload_dictionaries", [], |row| {
                        row.get(0)
                    })
                    .map_err(backend)
                })
                .expect("count dictionaries")
            };
            while dictionaries() == 0 {
                assert!(waited.elapsed().as_secs() < 30, "no dictionary was trained");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            write_run("small-packed", 20, 0).await;
            write_run("big-packed", 600, 0).await;
            assert!(packed_spans("big-packed") > 500, "the attrs are packed");
            check("small-packed").await;
            // Its first values pack worse than the rest: judged by a sample spread over it.
            write_run("uneven", 600, 16).await;
            check("uneven").await;
            check("big-packed").await;
        });
    }
}
