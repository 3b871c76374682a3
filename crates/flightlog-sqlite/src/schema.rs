//! Versioned schema migrations, applied at open.
//!
//! The schema version lives in SQLite's `user_version`. Each migration runs once, in order,
//! inside a `BEGIN IMMEDIATE` transaction that re-reads the version, so two processes opening a
//! fresh file at the same moment apply it exactly once. A file written by a newer flightlog is
//! refused with an error naming both versions rather than misread, and a file of another program
//! (told apart by SQLite's `application_id`, or for files of early flightlogs by their tables)
//! is refused before anything writes to it ([`check_identity`]).
//!
//! Layout choices (bytes per span matter, see BENCHMARKS.md): runs, writers and spans get
//! integer surrogate keys so the change log and the events table carry small integers instead of
//! repeated id strings; events are a `WITHOUT ROWID` table clustered by `(span_key, event_index)`;
//! payloads are JSON text, or zstd frames compressed with a trained dictionary (see
//! `payload_codec`); the change log is indexed by `(run_key, seq)` so a run's next seq is one index seek, never a
//! scan. Change ids are assigned by the writer (the highest id ever used, kept in
//! `flightlog_meta.change_id_floor` when pruning deletes the newest rows, plus one), which keeps
//! AUTOINCREMENT's never-reuse guarantee without its per-insert bookkeeping. Run and writer rows are never deleted, which makes their keys safe to cache.

use flightlog_core::activity::StoreError;
use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::backend;

/// Migrations in order; migration `i` brings the schema to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    // Version 1: the activity store.
    r#"
CREATE TABLE activity_runs (
  run_key INTEGER PRIMARY KEY,
  run_id  TEXT NOT NULL UNIQUE
);
CREATE TABLE activity_writers (
  writer_key INTEGER PRIMARY KEY,
  writer     TEXT NOT NULL UNIQUE
);
CREATE TABLE activity_spans (
  span_key              INTEGER PRIMARY KEY,
  span_id               TEXT NOT NULL UNIQUE,
  run_key               INTEGER NOT NULL,
  parent_span_id        TEXT,
  name                  TEXT NOT NULL,
  kind                  TEXT NOT NULL,
  origin                TEXT NOT NULL,
  session_id            TEXT,
  job_name              TEXT,
  attrs                 TEXT,
  started_at            INTEGER NOT NULL,
  wait_until            INTEGER,
  ended_at              INTEGER,
  outcome               TEXT,
  outcome_reason        TEXT,
  input_tokens          INTEGER,
  output_tokens         INTEGER,
  cache_read_tokens     INTEGER,
  cache_creation_tokens INTEGER,
  cost_usd              REAL,
  model                 TEXT,
  writer_key            INTEGER NOT NULL,
  last_heartbeat_at     INTEGER
);
CREATE INDEX activity_spans_by_run ON activity_spans (run_key, started_at);
CREATE INDEX activity_spans_open_roots ON activity_spans (started_at)
  WHERE outcome IS NULL AND parent_span_id IS NULL;
CREATE INDEX activity_spans_open_by_run ON activity_spans (run_key) WHERE outcome IS NULL;
CREATE TABLE activity_events (
  span_key    INTEGER NOT NULL,
  event_index INTEGER NOT NULL,
  ts          INTEGER NOT NULL,
  event_type  TEXT NOT NULL,
  truncated   INTEGER NOT NULL,
  dict_id     INTEGER,
  payload     BLOB NOT NULL, -- JSON text, or a zstd frame when dict_id is set
  PRIMARY KEY (span_key, event_index)
) WITHOUT ROWID;
CREATE TABLE payload_dictionaries (
  dict_id    INTEGER PRIMARY KEY,
  created_at INTEGER NOT NULL,
  dictionary BLOB NOT NULL
);
CREATE TABLE flightlog_meta (
  name  TEXT PRIMARY KEY,
  value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE activity_changes (
  change_id   INTEGER PRIMARY KEY,
  run_key     INTEGER NOT NULL,
  seq         INTEGER NOT NULL,
  span_key    INTEGER NOT NULL,
  event_index INTEGER
);
CREATE UNIQUE INDEX activity_changes_by_run ON activity_changes (run_key, seq);
CREATE TABLE activity_run_rollups (
  run_key               INTEGER PRIMARY KEY,
  origin                TEXT NOT NULL,
  name                  TEXT NOT NULL,
  session_id            TEXT,
  job_name              TEXT,
  started_at            INTEGER NOT NULL,
  ended_at              INTEGER,
  outcome               TEXT,
  duration_ms           INTEGER,
  span_count            INTEGER NOT NULL,
  input_tokens          INTEGER,
  output_tokens         INTEGER,
  cache_read_tokens     INTEGER,
  cache_creation_tokens INTEGER,
  cost_usd              REAL,
  failure_reason        TEXT,
  detail_pruned         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX activity_run_rollups_prune ON activity_run_rollups (detail_pruned, ended_at);
"#,
    // Version 2: the engagement journal. One counter row per engagement holds everything an
    // append depends on (its next seq, which is also its event count, and its last appended
    // `at`), so an append is one index seek plus two writes, never a scan. `engagement_key` is
    // the rowid: SQLite gives a new row one more than the largest key present, so among live
    // engagements a larger key means created later (re-creation after a prune included), which
    // is the listing's tie-break. Events carry that small key instead of the id text and are
    // clustered by (engagement_key, seq), so reading an engagement is one range scan.
    r#"
CREATE TABLE journal_engagements (
  engagement_key INTEGER PRIMARY KEY,
  engagement_id  TEXT NOT NULL UNIQUE,
  next_seq       INTEGER NOT NULL,
  last_at        INTEGER NOT NULL
);
CREATE INDEX journal_engagements_by_recency ON journal_engagements (last_at);
CREATE TABLE journal_events (
  engagement_key INTEGER NOT NULL,
  seq            INTEGER NOT NULL,
  at             INTEGER NOT NULL,
  event_type     TEXT NOT NULL,
  data           TEXT NOT NULL, -- compact JSON text of the event's data object
  PRIMARY KEY (engagement_key, seq)
) WITHOUT ROWID;
"#,
    // Version 3: listing runs newest first. Roots (open or ended) by start, and the rollups of
    // pruned runs (which have no root left) by start: each page is an index range scan.
    r#"
CREATE INDEX activity_spans_roots ON activity_spans (started_at) WHERE parent_span_id IS NULL;
CREATE INDEX activity_run_rollups_pruned ON activity_run_rollups (started_at)
  WHERE detail_pruned = 1;
"#,
    // Version 4: span ids looked up through two small-key indexes instead of a UNIQUE index on
    // the span table. Span ids are random (OTLP's always are, and most SDKs' UUIDs too), so
    // every insert into one big index dirtied a different page, written whole to the WAL and
    // copied again by the checkpointer: measured 1.6x slower ingest than time-ordered ids.
    // New ids go into `activity_span_ids_recent`, small enough that a commit's inserts share
    // its pages; the writer merges it into `activity_span_ids` in sorted runs (see
    // `activity_write::merge_recent_span_ids`), touching each page of the big index once per
    // merge instead of once per span. A span id lives in exactly one of the two; lookups try
    // the recent one first. `activity_spans` is rebuilt without its UNIQUE constraint.
    r#"
CREATE TABLE activity_span_ids (
  span_id  TEXT PRIMARY KEY,
  span_key INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE activity_span_ids_recent (
  span_id  TEXT PRIMARY KEY,
  span_key INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE activity_spans_v4 (
  span_key              INTEGER PRIMARY KEY,
  span_id               TEXT NOT NULL,
  run_key               INTEGER NOT NULL,
  parent_span_id        TEXT,
  name                  TEXT NOT NULL,
  kind                  TEXT NOT NULL,
  origin                TEXT NOT NULL,
  session_id            TEXT,
  job_name              TEXT,
  attrs                 TEXT,
  started_at            INTEGER NOT NULL,
  wait_until            INTEGER,
  ended_at              INTEGER,
  outcome               TEXT,
  outcome_reason        TEXT,
  input_tokens          INTEGER,
  output_tokens         INTEGER,
  cache_read_tokens     INTEGER,
  cache_creation_tokens INTEGER,
  cost_usd              REAL,
  model                 TEXT,
  writer_key            INTEGER NOT NULL,
  last_heartbeat_at     INTEGER
);
INSERT INTO activity_spans_v4 (span_key, span_id, run_key, parent_span_id, name, kind, origin,
  session_id, job_name, attrs, started_at, wait_until, ended_at, outcome, outcome_reason,
  input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, cost_usd, model,
  writer_key, last_heartbeat_at)
SELECT span_key, span_id, run_key, parent_span_id, name, kind, origin,
  session_id, job_name, attrs, started_at, wait_until, ended_at, outcome, outcome_reason,
  input_tokens, output_tokens, cache_read_tokens, cache_creation_tokens, cost_usd, model,
  writer_key, last_heartbeat_at
FROM activity_spans;
DROP TABLE activity_spans;
ALTER TABLE activity_spans_v4 RENAME TO activity_spans;
CREATE INDEX activity_spans_by_run ON activity_spans (run_key, started_at);
CREATE INDEX activity_spans_open_roots ON activity_spans (started_at)
  WHERE outcome IS NULL AND parent_span_id IS NULL;
CREATE INDEX activity_spans_open_by_run ON activity_spans (run_key) WHERE outcome IS NULL;
CREATE INDEX activity_spans_roots ON activity_spans (started_at) WHERE parent_span_id IS NULL;
INSERT INTO activity_span_ids (span_id, span_key) SELECT span_id, span_key FROM activity_spans;
"#,
    // Version 5: each run's roots by start. A run may have several roots (an OTLP trace often
    // does), and the run list shows it once, from one root (its newest when this was written, its
    // first since): this index makes "is this the run's first root?" one seek per listed row.
    r#"
CREATE INDEX activity_spans_roots_by_run ON activity_spans (run_key, started_at)
  WHERE parent_span_id IS NULL;
"#,
    // Version 6: a middle level between the recent span-id index and the main one. Merging the
    // recent ids straight into the main index touched nearly every page of it each time, so a
    // merge cost in proportion to the database (59 ms per 16,384 ids at 1,000,000 spans, a third
    // of the writer's time). Recent ids now merge into this middle index, kept near
    // sqrt(16,384 x spans) ids, and each merge sweeps one key range of the middle into the main
    // index, so a main-index page is written about once per sweep of the key space (see
    // `activity_write::register_span_id`). A span id lives in exactly one of the three; lookups
    // try recent, middle, main.
    r#"
CREATE TABLE activity_span_ids_middle (
  span_id  TEXT PRIMARY KEY,
  span_key INTEGER NOT NULL
) WITHOUT ROWID;
"#,
    // Version 7: each engagement's numbering generation (see `EngagementJournal::read_tail`): a
    // random value set when the counter row is created and again at each compaction, so a live
    // reader can tell that the seqs it followed were given out again. Existing rows start at 0.
    r#"
ALTER TABLE journal_engagements ADD COLUMN generation INTEGER NOT NULL DEFAULT 0;
"#,
    // Version 8: a span's `attrs` may be stored packed, as a BLOB (the id of a payload
    // dictionary, 4 bytes little endian, then a zstd frame; see `PayloadCodec::pack_attrs`)
    // instead of JSON text; the version keeps earlier flightlogs, which read attrs as text
    // only, from opening such a file. Dictionaries trained before it saw event payloads only
    // and pack attrs poorly (400 bytes a span against 115): the newest of them is noted, and a
    // database whose newest dictionary is no newer trains one more, on payloads and attrs.
    r#"
INSERT OR REPLACE INTO flightlog_meta (name, value)
  SELECT 'dictionaries_before_attrs', COALESCE(MAX(dict_id), 0) FROM payload_dictionaries;
"#,
    // Version 9: the runs that have spans but no root, by their earliest span's start, so the
    // run list shows them (see `run_roots`): an OpenTelemetry trace's root ends, and so is
    // exported, last. Filled from the spans an earlier flightlog stored.
    r#"
CREATE TABLE activity_runs_awaiting_root (
  run_key    INTEGER PRIMARY KEY,
  started_at INTEGER NOT NULL
);
CREATE INDEX activity_runs_awaiting_root_by_start ON activity_runs_awaiting_root (started_at);
INSERT INTO activity_runs_awaiting_root (run_key, started_at)
  SELECT run_key, MIN(started_at) FROM activity_spans GROUP BY run_key
  HAVING SUM(parent_span_id IS NULL) = 0;
"#,
    // Version 10: when something was last appended to each engagement, by the appending
    // process's clock (`SqliteEngagementJournal::prune_idle`: the scheduled retention judges
    // idleness by it, not by the `at` clients give their events). The engagements of an
    // earlier flightlog count as appended to at the upgrade, so none is removed before a full
    // retention period has passed.
    r#"
ALTER TABLE journal_engagements ADD COLUMN appended_at INTEGER;
UPDATE journal_engagements SET appended_at = CAST(unixepoch('subsec') * 1000 AS INTEGER);
CREATE INDEX journal_engagements_by_arrival ON journal_engagements (appended_at);
"#,
    // Version 11: the provider's id of the model call an imported span records
    // (`gen_ai.response.id`), so the run's rollup counts a call recorded by two instrumentations
    // side by side once. Absent on every earlier span (a column added with no default: no row
    // is rewritten).
    r#"
ALTER TABLE activity_spans ADD COLUMN call_id TEXT;
"#,
    // Version 12: the spans stored as roots because their remote caller's span was not stored
    // (an OpenTelemetry trace continued from an incoming `traceparent`), by run and caller id,
    // with the kind each takes under its caller, so the caller's span adopts them when it comes
    // (see `remote_callers`): a callee's spans end, and so are exported, before its caller's.
    // Spans an earlier flightlog stored so are not listed (their caller's id is inside their
    // packed attrs), and stay roots.
    r#"
CREATE TABLE activity_spans_awaiting_caller (
  run_key           INTEGER NOT NULL,
  caller_span_id    TEXT NOT NULL,
  span_key          INTEGER NOT NULL,
  kind_under_caller TEXT NOT NULL,
  PRIMARY KEY (run_key, caller_span_id, span_key)
) WITHOUT ROWID;
"#,
    // Version 13: the highest seq of each run whose change rows the change log's trim deleted
    // while the run's spans stay (see `activity_write::prune`), so the run's next change goes on
    // from it: a run's next seq was its highest logged seq plus one, and a late change of a run
    // whose rows were all trimmed was given seq 1 again, which a client that took the run's
    // snapshot and followed the change stream dropped as already seen (an audit's finding).
    r#"
ALTER TABLE activity_runs ADD COLUMN trimmed_seq INTEGER;
"#,
    // Version 14: engagements found for the scheduled retention by the ten-second bucket of
    // their arrival time (`appended_at` floored to 10,000 ms: `journal::ARRIVAL_BUCKET_MS`),
    // which an append rewrites only when it changes, instead of by the arrival time itself,
    // whose index every append rewrote (an index entry deleted and one inserted: a fifth of the
    // writer's instructions per append). The prune still judges by the exact `appended_at`.
    // Rows without an arrival time (an older flightlog's) get their bucket when it is stamped.
    // The index keeps its name: an older flightlog still running on the file during the upgrade
    // names it in its own prune (`INDEXED BY`), which failed on every pass once the name was
    // gone (an audit's finding); under the old name its prune scans the index whole and sorts,
    // right if slower, until it stops.
    r#"
ALTER TABLE journal_engagements ADD COLUMN appended_bucket INTEGER;
UPDATE journal_engagements
  SET appended_bucket = (appended_at - ((appended_at % 10000) + 10000) % 10000) / 10000
  WHERE appended_at IS NOT NULL;
DROP INDEX journal_engagements_by_arrival;
CREATE INDEX journal_engagements_by_arrival ON journal_engagements (appended_bucket);
"#,
    // Version 15: when an OTLP delivery last wrote to each run, by the server's clock (to ten
    // seconds: a delivery rewrites it only when it is older than that), so the scheduled
    // retention and the hard ceiling judge an imported run by its arrival too, not by the
    // exporter's times alone: a trace replayed or backfilled with month-old timestamps was
    // pruned within a minute of its arrival, and its later spans refused (an audit's finding).
    // Rows of runs no delivery touched keep it null.
    r#"
ALTER TABLE activity_runs ADD COLUMN imported_at INTEGER;
"#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// SQLite's `application_id` of a flightlog database ("FLLG"): set when the schema is first
/// created (and on the first open of a file an earlier flightlog made, which left it 0), so a
/// database of another program is told apart by its header before anything is written to it.
pub const APPLICATION_ID: i64 = 0x464c_4c47;

/// Tables every flightlog schema since version 1 has: how a file an earlier flightlog made
/// without the application id is recognised.
const FLIGHTLOG_TABLES: [&str; 2] = ["activity_runs", "flightlog_meta"];

/// Refuse, before anything writes to it, a file this build must not touch: another program's
/// ([`StoreError::NotFlightlog`]) or a newer flightlog's ([`StoreError::SchemaTooNew`]). The
/// caller runs it on a *read-only* connection opened before any other, so a refused file keeps
/// every byte: its journal mode (which switching to WAL would change) and a foreign WAL file
/// beside it (which a read-write connection copies into the file when it closes).
///
/// Whose file it is comes first, then its version: flightlog's application id; else, for a file
/// an earlier flightlog made before the id existed, flightlog's tables and a version; else a
/// new file has no schema object at all and version 0. Anything else (another program's
/// tables, views or indexes; a version with no schema) is not flightlog's.
pub fn check_identity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let found = user_version(conn)?;
    let application_id = application_id(conn)?;
    // Flightlog's tables under a header that names no version: a `.dump` copy (which keeps the
    // tables but not the header) or a header reset by hand. Migrating from version 0 would
    // create tables that already exist; guessing a version could corrupt the file.
    if found <= 0 && matches!(application_id, 0 | APPLICATION_ID) {
        let objects = schema_objects(conn)?;
        let has_flightlog_tables = FLIGHTLOG_TABLES.iter().all(|table| {
            objects
                .iter()
                .any(|(kind, name)| kind == "table" && name == table)
        });
        if has_flightlog_tables {
            return Err(StoreError::SchemaUnknown(header_lost_message(conn, path)?));
        }
    }
    let ours = match application_id {
        APPLICATION_ID => true,
        0 => false,
        other => {
            return Err(StoreError::NotFlightlog(format!(
                "its header names another program (application id {other:#x})"
            )))
        }
    };
    if !ours {
        let objects = schema_objects(conn)?;
        let made_by_flightlog = FLIGHTLOG_TABLES.iter().all(|table| {
            objects
                .iter()
                .any(|(kind, name)| kind == "table" && name == table)
        });
        if objects.is_empty() && found != 0 {
            return Err(StoreError::NotFlightlog(format!(
                "it says schema version {found} but holds no tables"
            )));
        }
        let earlier_flightlog = found >= 1 && made_by_flightlog;
        if !objects.is_empty() && !earlier_flightlog {
            let shown: Vec<String> = objects
                .iter()
                .take(3)
                .map(|(kind, name)| format!("{kind} {name}"))
                .collect();
            return Err(StoreError::NotFlightlog(format!(
                "it holds things flightlog did not make ({}{})",
                shown.join(", "),
                if objects.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            )));
        }
    }
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// What to do about a file with flightlog's tables and no schema version in its header: when
/// its schema is exactly this build's (every table's and index's SQL text, as a fresh file
/// migrated to [`SCHEMA_VERSION`] has it), the command that writes the header back; otherwise
/// how to get a faithful copy instead.
fn header_lost_message(conn: &Connection, path: &Path) -> Result<String, StoreError> {
    let schema_text =
        |conn: &Connection| -> Result<Vec<(String, String, Option<String>)>, StoreError> {
            let mut statement = conn
                .prepare(
                    "SELECT type, name, sql FROM sqlite_schema \
                 WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type, name",
                )
                .map_err(backend)?;
            let rows = statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                .map_err(backend)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(backend)?;
            Ok(rows)
        };
    let mut fresh = Connection::open_in_memory().map_err(backend)?;
    migrate(&mut fresh)?;
    let path = path.display();
    let opening = format!(
        "{path} holds flightlog's tables, but its header does not say which schema version \
         they are (a copy made with `sqlite3 .dump` does not carry the header, and neither does \
         one whose header was changed by hand), so flightlog will not write to it"
    );
    if schema_text(conn)? == schema_text(&fresh)? {
        Ok(format!(
            "{opening}. Its tables are exactly those of this flightlog (schema version \
             {SCHEMA_VERSION}): write the header back with `sqlite3 {path} \"PRAGMA \
             application_id = {APPLICATION_ID}; PRAGMA user_version = {SCHEMA_VERSION}\"`, then \
             start again"
        ))
    } else {
        Ok(format!(
            "{opening}. Its tables are not those of this flightlog's schema version \
             {SCHEMA_VERSION}, so the version cannot be told: start on a byte-for-byte copy of \
             the original file instead (a copy of a stopped server's file, or one made with \
             `sqlite3 FILE \".backup copy.db\"`, keeps the header)"
        ))
    }
}

/// Every schema object but SQLite's own (`sqlite_…`, with the underscore taken literally), as
/// (type, name).
fn schema_objects(conn: &Connection) -> Result<Vec<(String, String)>, StoreError> {
    let mut statement = conn
        .prepare(
            "SELECT type, name FROM sqlite_schema WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' \
             ORDER BY type DESC, name",
        )
        .map_err(backend)?;
    let objects = statement
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .map_err(backend)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(backend)?;
    Ok(objects)
}

fn application_id(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("PRAGMA application_id", [], |row| row.get(0))
        .map_err(backend)
}

fn user_version(conn: &Connection) -> Result<i64, StoreError> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(backend)
}

/// Apply the migrations up to `version` (at most [`SCHEMA_VERSION`]) to a file at an older
/// version: how the upgrade tests build a database as an older flightlog left it.
#[doc(hidden)]
pub fn migrate_up_to(conn: &mut Connection, version: i64) -> Result<(), StoreError> {
    let found = user_version(conn)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend)?;
    let start = usize::try_from(found.max(0)).unwrap_or(0);
    let end = usize::try_from(version.clamp(0, SCHEMA_VERSION)).unwrap_or(0);
    for (index, sql) in MIGRATIONS.iter().enumerate().take(end).skip(start) {
        tx.execute_batch(sql).map_err(backend)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(backend)?;
    }
    tx.commit().map_err(backend)
}

/// Bring the file's schema to [`SCHEMA_VERSION`], or refuse a newer one.
pub fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let found = user_version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION && application_id(conn)? == APPLICATION_ID {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(backend)?;
    // Another process may have migrated while we waited for the lock.
    let found = user_version(&tx)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let start = usize::try_from(found.max(0)).unwrap_or(0);
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(start) {
        tx.execute_batch(sql).map_err(backend)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)
            .map_err(backend)?;
    }
    if application_id(&tx)? != APPLICATION_ID {
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(backend)?;
    }
    tx.commit().map_err(backend)
}
