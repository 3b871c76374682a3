//! [`SqliteEngagementJournal`]: the engagement journal trait on one SQLite file.
//!
//! Writes (append, compact, prune) are closures queued to the database's writer thread, so they
//! commit in queue order inside its `BEGIN IMMEDIATE` group transactions; reads run on pooled
//! reader connections. Behaviour is the in-memory journal's (the conformance fixtures run on
//! both), with the storage choices of schema version 2 (see `schema.rs`).
//!
//! Several rules of the writer thread shape this file:
//! - A write closure may run twice (a neighbour's dirty failure replays the whole group with
//!   savepoints), so the closures only borrow what they capture and re-read every counter they
//!   depend on inside the transaction. That also makes them safe when another process writes the
//!   same file: nothing here is cached between transactions.
//! - A closure's `Err(StoreError)` marks the attempt dirty (rolled back, group replayed). The
//!   journal's own refusals (`JournalFull`, `WrongExpectedSeq`, undecodable rows) are detected
//!   before anything is written and returned as `Ok(Err(JournalError))`, so they cost no replay.
//! - Subscribers are fed from the writer's after-commit hook, which runs once per committed write,
//!   in commit order: each appended event is sent once, in seq order, and only after its commit.
//! - Each engagement's counter row holds its numbering's generation, a random value drawn when
//!   the row is created and again at each compaction (see `EngagementJournal::read_tail`): a
//!   live reader compares it to tell a renumbered or re-created engagement from a longer one.
//!   The commit doorbell is the database's commit watcher noticing that a commit wrote to the
//!   journal (each write closure here marks its group, whose commit then moves
//!   `flightlog_meta.journal_writes`), so it carries other processes' and other handles' appends
//!   and every compaction and prune, and neither activity writes nor the appends this handle's
//!   subscription carried (see `journal_bells`).

use foldhash::{HashSet, HashSetExt};
use std::hash::BuildHasher;
use std::sync::Arc;

use async_trait::async_trait;
use flightlog_core::activity::StoreError;
use flightlog_core::journal::{
    plan_compaction, summarize_engagement_events, AppendInput, CommittedEvent, EngagementEvent,
    EngagementHead, EngagementJournal, EngagementSummary, JournalDoorbell, JournalError,
    JournalSubscription, JournalTail, JsonObject, RetentionConfig, TailBound,
    DEFAULT_SUBSCRIBER_BUFFER, MAX_SUBSCRIBER_BUFFER,
};
use flightlog_core::{Clock, SystemClock};
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::broadcast;

use crate::database::{AfterCommit, SqliteDatabase, WriteContext};
use crate::error::backend;

/// The engagement journal over a [`SqliteDatabase`].
///
/// A subscription sees the events appended through this handle: two handles on one database
/// each broadcast their own appends, and events another process appends reach reads, not
/// subscribers here.
pub struct SqliteEngagementJournal {
    db: Arc<SqliteDatabase>,
    retention: RetentionConfig,
    committed: broadcast::Sender<CommittedEvent>,
    /// Names this handle's appends to the writer, so that its commit doorbell does not ring for
    /// what its subscription carried (see `journal_bells`).
    carrier: u64,
    /// Stamps each append's arrival (`appended_at`), which [`EngagementJournal::prune_idle`]
    /// judges idleness by.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SqliteEngagementJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteEngagementJournal")
            .field("db", &self.db)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl SqliteEngagementJournal {
    /// A journal over `db` enforcing `retention`.
    pub fn new(db: Arc<SqliteDatabase>, retention: RetentionConfig) -> Self {
        Self::with_subscriber_buffer(db, retention, DEFAULT_SUBSCRIBER_BUFFER)
    }

    /// A journal whose subscribers may fall `buffer` events behind before they lag (1 to
    /// [`MAX_SUBSCRIBER_BUFFER`]).
    pub fn with_subscriber_buffer(
        db: Arc<SqliteDatabase>,
        retention: RetentionConfig,
        buffer: usize,
    ) -> Self {
        let (committed, _) = broadcast::channel(buffer.clamp(1, MAX_SUBSCRIBER_BUFFER));
        Self {
            db,
            retention,
            committed,
            carrier: crate::journal_bells::new_carrier(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The same journal stamping arrivals with `clock` (the wall clock by default; a server
    /// on a testing clock gives its own).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Delete the engagements older than the retention's age before `now`, their age judged
    /// by `age_by`; whole engagements, each in one transaction, so a reader never sees part of
    /// one.
    ///
    /// The reference's `prune(now)` (`AgeBy::LastAt`) is one transaction, as the reference's:
    /// an append racing it lands wholly before or wholly after it. In transactions of
    /// [`PRUNE_EVENT_BUDGET`] events, an engagement deleted by the first one and written again
    /// with a backdated `at` was deleted a second time by a later one (the journal's model test
    /// found it), which no order of the two calls gives. The scheduled retention
    /// (`prune_idle`, `AgeBy::AppendedAt`) goes in transactions of about that many events until
    /// none is left: one transaction for all held every writer of the file for as long as it
    /// took, 3.6 s (and a 638 MB WAL) when 2,000 engagements of 1,000 events expired at once (an
    /// audit's finding). It judges by arrival on the store's clock, so an engagement written to
    /// after the prune began is never expired for a later transaction of it: such an append is
    /// kept, and its engagement with it.
    async fn prune_by(&self, age_by: AgeBy, now: i64) -> Result<u64, JournalError> {
        let cutoff = now.saturating_sub(self.retention.max_age_ms);
        let event_budget = match age_by {
            AgeBy::LastAt => None,
            AgeBy::AppendedAt => Some(PRUNE_EVENT_BUDGET),
        };
        let mut removed_in_all = 0;
        let mut first = true;
        loop {
            let stamp_unstamped = first;
            let removed = self
                .db
                .write(move |ctx| {
                    let removed = prune_in_transaction(
                        ctx.conn,
                        age_by,
                        cutoff,
                        now,
                        stamp_unstamped,
                        event_budget,
                    )?;
                    // Pruned engagements lose their counter rows (and may come back anew). A
                    // prune that removed nothing keeps the cache.
                    if removed > 0 {
                        ctx.keys.engagements.clear();
                        ctx.keys.group_journal.rewrite();
                    }
                    Ok(removed)
                })
                .await
                .map_err(journal_error)?;
            removed_in_all += removed;
            first = false;
            if removed == 0 || event_budget.is_none() {
                return Ok(removed_in_all);
            }
        }
    }

    /// The database this journal lives in.
    pub fn database(&self) -> &Arc<SqliteDatabase> {
        &self.db
    }

    /// The after-commit hook of an append: hands the committed event to the subscribers.
    fn publisher(&self) -> AfterCommit<Result<CommittedEvent, JournalError>> {
        let committed = self.committed.clone();
        Box::new(move |outcome| {
            if let Ok(event) = outcome {
                // A send error only means nobody listens.
                if committed.receiver_count() > 0 {
                    let _ = committed.send(event.clone());
                }
            }
        })
    }
}

/// A store failure seen through the journal's error type.
fn journal_error(err: StoreError) -> JournalError {
    match err {
        StoreError::Closed => JournalError::Closed,
        StoreError::Corrupt(detail) => JournalError::Corrupt(detail),
        StoreError::StorageFull(detail) => JournalError::StorageFull(detail),
        StoreError::FileLost(detail) => JournalError::FileLost(detail),
        StoreError::DiskFailed(detail) => JournalError::DiskFailed(detail),
        StoreError::Overloaded => JournalError::Overloaded,
        StoreError::Busy(detail) => JournalError::Busy(detail),
        StoreError::Unavailable(detail) => JournalError::Unavailable(detail),
        // The inner text, not the store error's: "journal backend error: database error: …"
        // said it twice.
        StoreError::Backend(detail) => JournalError::Backend(detail),
        other => JournalError::Backend(other.to_string()),
    }
}

/// A new numbering generation: 53 random bits (exact in a JavaScript number, as it travels in
/// stream ids), from std's randomly keyed hasher. Another process drawing for the same
/// engagement draws independently, so generations are unique with overwhelming probability
/// without any shared counter.
fn new_generation(salt: i64) -> i64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let random = std::collections::hash_map::RandomState::new().hash_one((nanos, salt));
    (random >> 11) as i64
}

/// The width of the buckets the scheduled retention finds engagements by (schema version 14):
/// an engagement's `appended_bucket` is its exact arrival time `appended_at` floored to a
/// multiple of this, and an append rewrites it (and its index entry) only when it changes, so
/// the appends of a busy engagement within ten seconds touch that index once. The migration
/// that made the buckets uses the same width; changing it needs a migration that redoes them.
pub(crate) const ARRIVAL_BUCKET_MS: i64 = 10_000;

/// The arrival bucket of an append that arrived at `appended_at` (floored, negative times too).
pub(crate) fn arrival_bucket(appended_at: i64) -> i64 {
    appended_at.div_euclid(ARRIVAL_BUCKET_MS)
}

/// An engagement's counter row as the writer caches it: exactly the row's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngagementCounter {
    /// The row's key (the events' `engagement_key`).
    pub key: i64,
    /// The next seq, which is also the number of events the engagement holds.
    pub next_seq: i64,
    /// Its `appended_bucket`; `None` on a row an older flightlog wrote.
    pub arrival_bucket: Option<i64>,
    /// Its numbering's generation (published with each append).
    pub generation: i64,
}

/// The engagement's counter row.
fn engagement_counter(
    conn: &Connection,
    engagement_id: &str,
) -> Result<Option<EngagementCounter>, StoreError> {
    conn.prepare_cached(
        "SELECT engagement_key, next_seq, appended_bucket, generation FROM journal_engagements \
         WHERE engagement_id = ?1",
    )
    .and_then(|mut stmt| {
        stmt.query_row([engagement_id], |row| {
            Ok(EngagementCounter {
                key: row.get(0)?,
                next_seq: row.get(1)?,
                arrival_bucket: row.get(2)?,
                generation: row.get(3)?,
            })
        })
        .optional()
    })
    .map_err(backend)
}

/// Append `template` (its `seq` is ignored) inside the writer's transaction. The checks come
/// first and write nothing, in the in-memory journal's order: full, then the expected seq.
/// The counter row is read from the writer's cache when it holds it (exactly the row's
/// contents: see `WriterCache`), else from the table.
fn append_in_transaction(
    ctx: &mut WriteContext<'_>,
    template: &EngagementEvent,
    data_json: &str,
    expected_seq: Option<i64>,
    max_events: u64,
    appended_at: i64,
    carrier: u64,
) -> Result<Result<CommittedEvent, JournalError>, StoreError> {
    let conn = ctx.conn;
    let counter = match ctx.keys.engagements.get(&*template.engagement_id) {
        Some(counter) => Some(*counter),
        None => engagement_counter(conn, &template.engagement_id)?,
    };
    let seq = counter.map_or(0, |counter| counter.next_seq);
    if u64::try_from(seq).unwrap_or(0) >= max_events {
        return Ok(Err(JournalError::JournalFull {
            engagement_id: template.engagement_id.to_string(),
            max_events,
        }));
    }
    if let Some(expected) = expected_seq {
        if expected != seq {
            return Ok(Err(JournalError::WrongExpectedSeq {
                expected,
                actual: seq,
            }));
        }
    }
    // Marked once the append will write (a refused one writes nothing: no ring for it).
    ctx.keys.group_journal.append(carrier);
    let bucket = arrival_bucket(appended_at);
    let (engagement_key, generation) = match counter {
        // The arrival bucket is indexed: rewritten only when it changes.
        Some(counter) if counter.arrival_bucket == Some(bucket) => {
            ctx.statement(
                "UPDATE journal_engagements SET next_seq = ?2, last_at = ?3, appended_at = ?4 \
                 WHERE engagement_key = ?1",
            )
            .and_then(|stmt| stmt.execute(params![counter.key, seq + 1, template.at, appended_at]))
            .map_err(backend)?;
            (counter.key, counter.generation)
        }
        Some(counter) => {
            ctx.statement(
                "UPDATE journal_engagements SET next_seq = ?2, last_at = ?3, appended_at = ?4, \
                 appended_bucket = ?5 WHERE engagement_key = ?1",
            )
            .and_then(|stmt| {
                stmt.execute(params![
                    counter.key,
                    seq + 1,
                    template.at,
                    appended_at,
                    bucket
                ])
            })
            .map_err(backend)?;
            (counter.key, counter.generation)
        }
        None => {
            let generation = new_generation(seq);
            // The new row's key is one more than the largest present: the creation order.
            conn.prepare_cached(
                "INSERT INTO journal_engagements \
                 (engagement_id, next_seq, last_at, generation, appended_at, appended_bucket) \
                 VALUES (?1, 1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    &*template.engagement_id,
                    template.at,
                    generation,
                    appended_at,
                    bucket
                ])
            })
            .map_err(backend)?;
            (conn.last_insert_rowid(), generation)
        }
    };
    ctx.statement(
        "INSERT INTO journal_events (engagement_key, seq, at, event_type, data) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|stmt| {
        stmt.execute(params![
            engagement_key,
            seq,
            template.at,
            &template.event_type,
            data_json
        ])
    })
    .map_err(backend)?;
    ctx.keys.engagements.insert(
        template.engagement_id.to_string(),
        EngagementCounter {
            key: engagement_key,
            next_seq: seq + 1,
            arrival_bucket: Some(bucket),
            generation,
        },
    );
    Ok(Ok(CommittedEvent {
        event: EngagementEvent {
            seq,
            ..template.clone()
        },
        generation: generation as u64,
    }))
}

fn insert_event(
    conn: &Connection,
    engagement_key: i64,
    seq: i64,
    at: i64,
    event_type: &str,
    data_json: &str,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO journal_events (engagement_key, seq, at, event_type, data) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut stmt| stmt.execute(params![engagement_key, seq, at, event_type, data_json]))
    .map(|_| ())
    .map_err(backend)
}

/// Decodes event rows `(seq, at, event_type, data)`, sharing one id `Arc` and one `Arc` per
/// distinct type among the events it builds.
struct EventDecoder {
    engagement_id: Arc<str>,
    types: HashSet<Arc<str>>,
}

impl EventDecoder {
    fn new(engagement_id: &str) -> Self {
        Self {
            engagement_id: Arc::from(engagement_id),
            types: HashSet::new(),
        }
    }

    /// The event in `row`, and its data's JSON text when `keep_text` (compaction rewrites the
    /// survivors from their stored text rather than re-encoding them).
    fn decode(
        &mut self,
        row: &rusqlite::Row<'_>,
        keep_text: bool,
    ) -> Result<(EngagementEvent, Option<String>), StoreError> {
        let seq: i64 = row.get(0).map_err(backend)?;
        let at: i64 = row.get(1).map_err(backend)?;
        let event_type = row
            .get_ref(2)
            .and_then(|value| Ok(value.as_str()?))
            .map_err(backend)?;
        let event_type = match self.types.get(event_type) {
            Some(known) => Arc::clone(known),
            None => {
                let interned: Arc<str> = Arc::from(event_type);
                self.types.insert(Arc::clone(&interned));
                interned
            }
        };
        let text = row
            .get_ref(3)
            .and_then(|value| Ok(value.as_str()?))
            .map_err(backend)?;
        let data: JsonObject =
            flightlog_core::json_as_written::object_from_str(text).map_err(|err| {
                StoreError::Corrupt(format!(
                    "journal event {:?} seq {seq}: data is not a JSON object: {err}",
                    self.engagement_id
                ))
            })?;
        let text = keep_text.then(|| text.to_owned());
        let event = EngagementEvent {
            engagement_id: Arc::clone(&self.engagement_id),
            seq,
            at,
            event_type,
            data: Arc::new(data),
        };
        Ok((event, text))
    }
}

/// The most engagements whose heads are looked up on the caller's runtime worker.
const HEADS_ON_A_WORKER: usize = 64;

/// Each engagement's head, in the order given (see `EngagementJournal::heads`).
fn read_heads(
    conn: &Connection,
    engagement_ids: &[Arc<str>],
) -> Result<Vec<Option<EngagementHead>>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT generation, next_seq FROM journal_engagements WHERE engagement_id = ?1",
        )
        .map_err(backend)?;
    engagement_ids
        .iter()
        .map(|engagement_id| {
            stmt.query_row([&**engagement_id], |row| {
                Ok(EngagementHead {
                    generation: row.get::<_, i64>(0)? as u64,
                    next_seq: row.get(1)?,
                })
            })
            .optional()
            .map_err(backend)
        })
        .collect()
}

/// The engagement's events with `seq >= from_seq`, in seq order, from one statement (so one
/// consistent snapshot).
fn read_events(
    conn: &Connection,
    engagement_id: &str,
    from_seq: i64,
) -> Result<Vec<EngagementEvent>, StoreError> {
    read_tail(conn, engagement_id, from_seq, TailBound::ALL).map(|tail| tail.events)
}

/// What a read of a whole engagement (from a seq on) reads on the caller's runtime worker: a
/// read that finds more goes again apart (see [`SqliteDatabase::read_apart`]). An engagement of
/// twenty 4 MiB events read on a worker held it 3 – 4 s, and two such reads held up every other
/// request (`/healthz` 4.3 s; an audit).
const WHOLE_READ_ON_A_WORKER: TailBound = TailBound {
    max_events: 1_000,
    max_bytes: 256 * 1024,
};

/// The engagement's events from `from_seq` on, all of them: read on the caller's worker when
/// they are few and small ([`WHOLE_READ_ON_A_WORKER`]), else apart; `then` runs where they
/// were read (a summary of many events is work for the read's thread too).
async fn read_whole<T>(
    db: &Arc<SqliteDatabase>,
    engagement_id: &str,
    from_seq: i64,
    then: impl FnOnce(Vec<EngagementEvent>) -> T,
) -> Result<T, StoreError> {
    let (tail, cut) =
        db.read(|conn| read_tail_cut(conn, engagement_id, from_seq, WHOLE_READ_ON_A_WORKER, true))?;
    if !cut {
        return Ok(then(tail.events));
    }
    drop(tail);
    db.read_apart(|_, conn| read_events(conn, engagement_id, from_seq).map(then))
        .await
}

/// The engagement's generation and its events with `seq >= from_seq`, in one statement (one
/// snapshot): a `LEFT JOIN` so an engagement with no events that far still yields its
/// generation, on a row whose event columns are null.
fn read_tail(
    conn: &Connection,
    engagement_id: &str,
    from_seq: i64,
    bound: TailBound,
) -> Result<JournalTail, StoreError> {
    read_tail_cut(conn, engagement_id, from_seq, bound, false).map(|(tail, _)| tail)
}

/// [`read_tail`], and whether the bound left events unread. `strict`: an event whose data would
/// take the read past the bound's bytes is left unread (cut) before it is decoded, the first
/// too (a stream's page takes at least one; a whole read's look on a worker must not decode an
/// 8 MiB event there).
fn read_tail_cut(
    conn: &Connection,
    engagement_id: &str,
    from_seq: i64,
    bound: TailBound,
    strict: bool,
) -> Result<(JournalTail, bool), StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT e.seq, e.at, e.event_type, e.data, g.generation \
             FROM journal_engagements g \
             LEFT JOIN journal_events e ON e.engagement_key = g.engagement_key AND e.seq >= ?2 \
             WHERE g.engagement_id = ?1 \
             ORDER BY e.seq LIMIT ?3",
        )
        .map_err(backend)?;
    // At least one row, so an engagement yields its generation even with a bound of none; and
    // one past the bound, so a read the bound stops says it was cut.
    let sql_limit = i64::try_from(bound.max_events.max(1).saturating_add(1)).unwrap_or(i64::MAX);
    let mut rows = stmt
        .query(params![engagement_id, from_seq, sql_limit])
        .map_err(backend)?;
    let mut decoder = EventDecoder::new(engagement_id);
    let mut tail = JournalTail::default();
    let mut bytes = 0usize;
    while let Some(row) = rows.next().map_err(backend)? {
        let generation: i64 = row.get(4).map_err(backend)?;
        tail.generation = Some(generation as u64);
        let data = row.get_ref(3).map_err(backend)?;
        if data.data_type() == rusqlite::types::Type::Null {
            continue;
        }
        if bound.reached(tail.events.len(), bytes) {
            return Ok((tail, true));
        }
        // The data's stored JSON text: its length is the bound's measure.
        bytes = bytes.saturating_add(data.as_bytes().map_or(0, <[u8]>::len));
        if strict && bytes > bound.max_bytes {
            return Ok((tail, true));
        }
        tail.events.push(decoder.decode(row, false)?.0);
    }
    Ok((tail, false))
}

/// Compact the engagement inside the writer's transaction: everything is read and planned
/// before the first write, and the rewrite (delete the old rows, insert the survivors
/// renumbered, move the counter row) is one transaction, so a crash leaves the engagement
/// wholly before or wholly after. `Ok(Ok(false))` when the rules leave it alone.
fn compact_in_transaction(
    conn: &Connection,
    engagement_id: &str,
) -> Result<Result<bool, JournalError>, StoreError> {
    let Some(EngagementCounter {
        key: engagement_key,
        next_seq,
        ..
    }) = engagement_counter(conn, engagement_id)?
    else {
        return Ok(Ok(false));
    };
    let mut events = Vec::new();
    let mut texts = Vec::new();
    {
        let mut stmt = conn
            .prepare_cached(
                "SELECT seq, at, event_type, data FROM journal_events \
                 WHERE engagement_key = ?1 ORDER BY seq",
            )
            .map_err(backend)?;
        let mut rows = stmt.query([engagement_key]).map_err(backend)?;
        let mut decoder = EventDecoder::new(engagement_id);
        while let Some(row) = rows.next().map_err(backend)? {
            let (event, text) = match decoder.decode(row, true) {
                Ok(decoded) => decoded,
                Err(StoreError::Corrupt(detail)) => return Ok(Err(JournalError::Corrupt(detail))),
                Err(other) => return Err(other),
            };
            events.push(event);
            texts.push(text.unwrap_or_default());
        }
    }
    // The plan's indexes are seqs; a log that is not dense from 0 is not ours to rewrite.
    let dense = events.len() as i64 == next_seq
        && events
            .iter()
            .enumerate()
            .all(|(index, event)| event.seq == index as i64);
    if !dense {
        return Ok(Err(JournalError::Corrupt(format!(
            "journal engagement {engagement_id:?}: {} stored events do not match its next seq \
             {next_seq}",
            events.len()
        ))));
    }
    let plan = match plan_compaction(&events) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Ok(Ok(false)),
        // Refused before anything was written: no replay of the group.
        Err(refusal) => return Ok(Err(refusal)),
    };
    let closed_json = match serde_json::to_string(&plan.closed_data) {
        Ok(json) => json,
        Err(err) => {
            return Ok(Err(JournalError::Backend(format!(
                "cannot encode the compacted close record: {err}"
            ))))
        }
    };
    conn.prepare_cached("DELETE FROM journal_events WHERE engagement_key = ?1")
        .and_then(|mut stmt| stmt.execute([engagement_key]))
        .map_err(backend)?;
    let mut last_at = 0;
    for (seq, &index) in plan.kept.iter().enumerate() {
        let Some(event) = events.get(index) else {
            return Err(StoreError::Backend(format!(
                "compaction plan names event {index} of {}",
                events.len()
            )));
        };
        let data_json = if index == plan.closed_index {
            closed_json.as_str()
        } else {
            texts[index].as_str()
        };
        insert_event(
            conn,
            engagement_key,
            seq as i64,
            event.at,
            &event.event_type,
            data_json,
        )?;
        last_at = event.at;
    }
    // Recency follows the last event the log now holds, as in the in-memory journal.
    // The survivors' seqs are given out again: a new generation tells live readers.
    conn.prepare_cached(
        "UPDATE journal_engagements SET next_seq = ?2, last_at = ?3, generation = ?4 \
         WHERE engagement_key = ?1",
    )
    .and_then(|mut stmt| {
        stmt.execute(params![
            engagement_key,
            plan.kept.len() as i64,
            last_at,
            new_generation(engagement_key)
        ])
    })
    .map_err(backend)?;
    Ok(Ok(true))
}

/// Delete every engagement whose last appended event has `at < cutoff`; how many were deleted.
/// What an engagement's age is judged by: the `at` of its last appended event (the
/// reference's `prune`), or when something was last appended to it (`prune_idle`; a row with
/// no arrival time, inserted by a flightlog older than schema 10 still running on the file
/// during an upgrade, counts as appended to now, as the upgrade counts every row).
#[derive(Debug, Clone, Copy)]
enum AgeBy {
    LastAt,
    AppendedAt,
}

/// About the most events one prune transaction deletes: a few tens of milliseconds of the
/// writer's time. Whole engagements are taken while they fit, and always one (an engagement
/// holds at most the retention's `max_events_per_engagement`, 10,000 by default).
pub(crate) const PRUNE_EVENT_BUDGET: i64 = 5_000;

/// Expired engagements one prune transaction looks at (by the index of its age column).
const PRUNE_CANDIDATES: i64 = 500;

/// One prune transaction: delete the oldest expired engagements (their age judged by `age_by`)
/// that fit in `event_budget` events together, at least one (`None`: every expired one); how
/// many were deleted (0: none is left). `stamp_unstamped` first gives an arrival time to the
/// rows that have none (see [`AgeBy`]), as every prune did in one transaction before.
fn prune_in_transaction(
    conn: &Connection,
    age_by: AgeBy,
    cutoff: i64,
    now: i64,
    stamp_unstamped: bool,
    event_budget: Option<i64>,
) -> Result<u64, StoreError> {
    if stamp_unstamped && matches!(age_by, AgeBy::AppendedAt) {
        // The rows an older flightlog wrote have no bucket (and, before schema version 10, no
        // arrival time): the bucket floored as `arrival_bucket` does.
        conn.prepare_cached(
            "UPDATE journal_engagements SET appended_at = coalesce(appended_at, ?1), \
             appended_bucket = (coalesce(appended_at, ?1) \
               - ((coalesce(appended_at, ?1) % ?2) + ?2) % ?2) / ?2 \
             WHERE appended_bucket IS NULL",
        )
        .and_then(|mut stmt| stmt.execute([now, ARRIVAL_BUCKET_MS]))
        .map_err(backend)?;
    }
    let limit = if event_budget.is_some() {
        PRUNE_CANDIDATES
    } else {
        -1
    };
    let expired: Vec<(i64, i64)> = match age_by {
        AgeBy::LastAt => conn
            .prepare_cached(
                "SELECT engagement_key, next_seq FROM journal_engagements \
                 INDEXED BY journal_engagements_by_recency WHERE last_at < ?1 \
                 ORDER BY last_at LIMIT ?2",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![cutoff, limit], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect()
            }),
        // Every row that arrived before the cutoff has a bucket at most the cutoff's (a row an
        // older flightlog still running rewrote keeps an older bucket: still found); the exact
        // time then decides, so the bucket costs only a look at the rows of the cutoff's.
        AgeBy::AppendedAt => conn
            .prepare_cached(
                "SELECT engagement_key, next_seq FROM journal_engagements \
                 INDEXED BY journal_engagements_by_arrival \
                 WHERE appended_bucket <= ?3 AND appended_at < ?1 \
                 ORDER BY appended_bucket LIMIT ?2",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![cutoff, limit, arrival_bucket(cutoff)], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?
                .collect()
            }),
    }
    .map_err(backend)?;
    let mut events_taken: i64 = 0;
    let mut removed = 0;
    for (engagement_key, events) in expired {
        // `next_seq` counts the events an engagement holds (compaction renumbers from 0).
        if removed > 0
            && event_budget.is_some_and(|budget| events_taken.saturating_add(events) > budget)
        {
            break;
        }
        events_taken = events_taken.saturating_add(events);
        for sql in [
            "DELETE FROM journal_events WHERE engagement_key = ?1",
            "DELETE FROM journal_engagements WHERE engagement_key = ?1",
        ] {
            conn.prepare_cached(sql)
                .and_then(|mut stmt| stmt.execute([engagement_key]))
                .map_err(backend)?;
        }
        removed += 1;
    }
    Ok(removed)
}

#[async_trait]
impl EngagementJournal for SqliteEngagementJournal {
    fn retention(&self) -> RetentionConfig {
        self.retention
    }

    fn health(&self) -> Result<(), JournalError> {
        self.db.check_file().map_err(journal_error)
    }

    async fn append(&self, input: AppendInput) -> Result<EngagementEvent, JournalError> {
        let expected_seq = input.expected_seq();
        // Built and encoded once, on the caller's thread; the closure only borrows them.
        let template = input.into_event(0);
        let data_json = serde_json::to_string(&*template.data)
            .map_err(|err| JournalError::Backend(format!("cannot encode event data: {err}")))?;
        let max_events = self.retention.max_events_per_engagement;
        let appended_at = self.clock.now_ms();
        let carrier = self.carrier;
        let work = move |ctx: &mut WriteContext<'_>| {
            append_in_transaction(
                ctx,
                &template,
                &data_json,
                expected_seq,
                max_events,
                appended_at,
                carrier,
            )
        };
        self.db
            .write_then(work, Some(self.publisher()))
            .await
            .map_err(journal_error)?
            .map(|committed| committed.event)
    }

    async fn read(&self, engagement_id: &str) -> Result<Vec<EngagementEvent>, JournalError> {
        self.read_from(engagement_id, 0).await
    }

    async fn read_from(
        &self,
        engagement_id: &str,
        from_seq: i64,
    ) -> Result<Vec<EngagementEvent>, JournalError> {
        read_whole(&self.db, engagement_id, from_seq, |events| events)
            .await
            .map_err(journal_error)
    }

    async fn summarize(
        &self,
        engagement_id: &str,
    ) -> Result<Option<EngagementSummary>, JournalError> {
        read_whole(&self.db, engagement_id, 0, |events| {
            (!events.is_empty()).then(|| summarize_engagement_events(engagement_id, &events))
        })
        .await
        .map_err(journal_error)
    }

    async fn read_tail(
        &self,
        engagement_id: &str,
        from_seq: i64,
        bound: TailBound,
    ) -> Result<JournalTail, JournalError> {
        self.db
            .read(|conn| read_tail(conn, engagement_id, from_seq, bound))
            .map_err(journal_error)
    }

    async fn heads(
        &self,
        engagement_ids: &[Arc<str>],
    ) -> Result<Vec<Option<EngagementHead>>, JournalError> {
        // An index lookup an id, a few microseconds: many ids are a read apart.
        let ids = engagement_ids.to_vec();
        let look = move |_: &SqliteDatabase, conn: &Connection| read_heads(conn, &ids);
        if engagement_ids.len() > HEADS_ON_A_WORKER {
            self.db.read_apart_short(look).await
        } else {
            self.db.read(|conn| look(&self.db, conn))
        }
        .map_err(journal_error)
    }

    async fn compact(&self, engagement_id: &str) -> Result<bool, JournalError> {
        let engagement_id = engagement_id.to_owned();
        self.db
            .write(move |ctx| {
                // Compaction renumbers the engagement: its cached counter is stale.
                ctx.keys.engagements.remove(&engagement_id);
                ctx.keys.group_journal.rewrite();
                compact_in_transaction(ctx.conn, &engagement_id)
            })
            .await
            .map_err(journal_error)?
    }

    async fn list_engagements(&self, limit: Option<i64>) -> Result<Vec<String>, JournalError> {
        // SQLite reads a negative LIMIT as "no limit".
        let sql_limit = limit.map_or(-1, |limit| limit.max(0));
        self.db
            .read(|conn| {
                conn.prepare_cached(
                    "SELECT engagement_id FROM journal_engagements \
                     ORDER BY last_at DESC, engagement_key DESC LIMIT ?1",
                )
                .and_then(|mut stmt| {
                    stmt.query_map([sql_limit], |row| row.get(0))?
                        .collect::<Result<Vec<String>, _>>()
                })
                .map_err(backend)
            })
            .map_err(journal_error)
    }

    async fn prune(&self, now: i64) -> Result<u64, JournalError> {
        self.prune_by(AgeBy::LastAt, now).await
    }

    async fn prune_idle(&self, now: i64) -> Result<u64, JournalError> {
        self.prune_by(AgeBy::AppendedAt, now).await
    }

    fn subscribe(&self) -> JournalSubscription {
        self.committed.subscribe()
    }

    fn commit_doorbell(&self) -> JournalDoorbell {
        self.db.journal_doorbell(self.carrier)
    }
}
