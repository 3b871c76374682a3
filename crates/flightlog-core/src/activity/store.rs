//! The activity store trait every backend implements, and its error type.
//!
//! The trait is async so a network database (PostgreSQL) fits without reshaping it, and it
//! names no backend type. Semantics follow the reference `ActivityStore` to the letter; each
//! method's doc says what it guarantees. Writes act as the instance's writer identity
//! ([`ActivityStore::writer`]); [`ActivityStore::with_writer`] gives a handle over the same data
//! with another identity.
//!
//! # What every backend guarantees, whoever else writes the database
//!
//! Several writers may share one database: other processes on one SQLite file today, several
//! server instances on one PostgreSQL database next. The live streams and the maintenance rely
//! on these guarantees, which the SQLite backend gets from its one write lock (each transaction
//! takes `MAX + 1` under `BEGIN IMMEDIATE`, so id order is commit order) and a network backend
//! must give by its own means:
//!
//! - **Change ids are a watermark.** Ids grow with every change, and a change becomes visible
//!   only once every lower id that will ever exist is visible too: no change with an id at or
//!   below a value already seen (the doorbell's, [`ActivityStore::latest_change_cursor`]'s,
//!   [`RunSnapshot::change_cursor`], the last id [`ActivityStore::changes_since`] returned)
//!   commits later. A stream moves its cursor to such a value and never reads below it again,
//!   so a lower id committed late would be skipped for good. A sequence alone does not give
//!   this (two transactions commit in the other order than they took ids); a counter row locked
//!   until commit does, as does reading only up to the oldest id still in flight.
//! - **A run's `seq` is gap-free in commit order**, 1, 2, 3, … per run (a follower of one run
//!   discards deltas at or below its snapshot's `high_water_seq`), whoever writes the run.
//! - **The doorbell hears everyone.** [`ActivityStore::change_doorbell`] rings within 250 ms of a
//!   commit by any process or instance sharing the database (SQLite: a poller on
//!   `data_version`; PostgreSQL: `LISTEN`/`NOTIFY`), and also after a prune or a trim of the
//!   change log, when its value may stay or go down: a reader then checks
//!   [`ActivityStore::change_log_horizon`] again.
//! - **Maintenance is safe to run everywhere at once.** Every instance runs its scheduled
//!   maintenance, so `prune`, `sweep_stale*`, `sweep_leftovers_step`, `cascade_close` and
//!   `rollup_run` may run concurrently from several instances: each run is judged and changed
//!   inside one transaction that holds it (SQLite: the write lock; a network backend: row locks,
//!   e.g. `FOR UPDATE SKIP LOCKED` for the sweeps' candidates), and the counts returned are what
//!   this call changed.
//! - **A failed write has no effect** ([`StoreError`]). A backend that can lose the answer to
//!   its `COMMIT` (a network connection dropped at that moment) must find out what happened
//!   (PostgreSQL: `pg_xact_status` of the transaction's id) before it answers; a database it
//!   cannot reach at all is [`StoreError::Unavailable`].
//! - **`health` does no I/O**: it reports state the backend already holds, since `/healthz`
//!   calls it on every probe.

use std::sync::Arc;

use async_trait::async_trait;

use crate::backend_metrics::BackendMetric;

use super::batch::{ActivityWrite, ActivityWriteResult};
use super::import::{ImportReport, ImportedSpan};
use super::listing::{RunListQuery, RunPage};
use super::payload_text::PayloadText;
use super::types::{
    ActivityChange, EndSpanInput, PruneOptions, PruneResult, RunRollupRow, RunSnapshot,
    SpanEventRow, SpanOutcome, SpanPatch, SpanRow, StartSpanInput, TerminalRootChange,
};

/// The page size of `changes_since` when the caller has no preference.
pub const DEFAULT_CHANGES_LIMIT: i64 = 500;

/// Runs pruned per `prune` call when the caller has no preference.
pub const DEFAULT_PRUNE_BATCH: i64 = 50;

/// Why a store call failed. A failed write has no effect.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A span with this id already exists (`start_span` twice with one id).
    #[error("a span with id {span_id:?} already exists")]
    DuplicateSpan { span_id: String },
    /// The write queue is full: the caller should retry later. Nothing was written.
    #[error("the store's write queue is full; retry later")]
    Overloaded,
    /// The store has been closed (or its writer stopped); nothing was written.
    #[error("the store is closed")]
    Closed,
    /// The database was written by a newer flightlog whose schema this version cannot read.
    #[error(
        "the database has schema version {found}, but this flightlog supports at most version \
         {supported}; upgrade flightlog to open it"
    )]
    SchemaTooNew { found: i64, supported: i64 },
    /// The file is a database of another program (the message says how it was told apart);
    /// flightlog refuses it without writing to it.
    #[error(
        "the file is not a flightlog database: {0}; choose another path (flightlog creates its \
         database where no file exists)"
    )]
    NotFlightlog(String),
    /// The file holds flightlog's tables but its header does not say which schema version they
    /// are (a copy made with `sqlite3 .dump`, which does not carry the header, or a header
    /// changed by hand); flightlog refuses it without writing to it, and the message says how
    /// to set the header back.
    #[error("{0}")]
    SchemaUnknown(String),
    /// A stored row could not be decoded (corruption or a foreign writer).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// Another process held the database's write lock for longer than the store waits for it
    /// (the message says how long); nothing was written. A retry succeeds once it lets go.
    #[error("{0}; nothing was written, retry later")]
    Busy(String),
    /// The database could not be reached in time (a network database down or restarting, its
    /// connections all busy past the backend's wait); nothing was written. A retry succeeds
    /// once it is back. The SQLite backend, which opens a file, never returns it.
    #[error("the database is unavailable: {0}; nothing was written, retry later")]
    Unavailable(String),
    /// The backend failed (I/O, …).
    #[error("database error: {0}")]
    Backend(String),
    /// The input cannot be stored as given (the message names the offending value and the
    /// limit); nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The disk holding the database is full; nothing was written. A retry succeeds once
    /// space is freed (what was stored before is intact).
    #[error("the disk is full: {0}; free space on it, then retry")]
    StorageFull(String),
    /// The database file was deleted or replaced while this process had it open (the message
    /// names it, and what to do): what the process would write now could never be read at that
    /// path, so nothing was written.
    #[error("nothing was written: {0}")]
    FileLost(String),
    /// The disk or its file system failed a write (an I/O error, a file system the kernel made
    /// read-only after one); nothing was written. A retry succeeds once the disk is back.
    #[error(
        "the disk failed a write ({0}); nothing was written: check the disk and its file system \
         (dmesg; one the kernel made read-only after an error must be remounted writable), then \
         retry"
    )]
    DiskFailed(String),
}

impl StoreError {
    /// Whether the store as a whole refused the write (a full queue, a shutdown, another
    /// process's lock, an unreachable database, a full or failing disk, a lost file), as opposed to this write being
    /// wrong: nothing was written, and the same write may succeed when retried later (the HTTP
    /// API answers such refusals 503 with `Retry-After`).
    pub fn refuses_every_write(&self) -> bool {
        matches!(
            self,
            Self::Overloaded
                | Self::Closed
                | Self::Busy(_)
                | Self::Unavailable(_)
                | Self::StorageFull(_)
                | Self::FileLost(_)
                | Self::DiskFailed(_)
        )
    }
}

/// What [`ActivityStore::log_movement`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMovement {
    /// The runs with a change in the range still in the log, each once, in no order.
    pub runs: Vec<String>,
    /// [`ActivityStore::change_log_horizon`], read after the runs.
    pub horizon: i64,
    /// How many prunes that deleted anything have committed to the database, by any process or
    /// instance: a count that only grows. A prune logs no change, so a follower of a run whose
    /// detail it deleted learns of it only by this (or by the horizon, when it moved).
    pub prunes: i64,
}

/// Which part of the open roots [`ActivityStore::open_roots_part`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRootsPart {
    /// Newest start first (`openRootSpans`), else oldest first (`findStuck`).
    pub newest_first: bool,
    /// Only roots that started before this (`findStuck`'s cutoff).
    pub started_before: Option<i64>,
    /// Where the part starts: after this root, in the order (`None`: from the first).
    pub after: Option<OpenRootsCursor>,
    /// The part ends once its roots hold about this many bytes of attrs.
    pub max_bytes: usize,
}

/// A position among the open roots: a root's start and a tie-breaker the store chose (its
/// own key of the root, meaningful only to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenRootsCursor {
    pub started_at: i64,
    pub tie: i64,
}

/// The newest committed change id known to a store: a doorbell for live readers.
///
/// It carries no changes itself. A reader that sees it move reads `changes_since(its cursor)`
/// from the store, so what it streams is always what the database holds (persist, then emit),
/// a slow reader simply reads more at a time, and nothing is ever buffered per reader.
pub type ChangeDoorbell = tokio::sync::watch::Receiver<i64>;

/// The canonical record of agent activity: spans in a tree per run, events, the change log,
/// run rollups.
#[async_trait]
pub trait ActivityStore: Send + Sync {
    /// The writer identity stamped on every span this instance starts.
    fn writer(&self) -> &str;

    /// A handle over the same data acting as writer `writer`.
    fn with_writer(&self, writer: &str) -> Arc<dyn ActivityStore>;

    /// Rings (moves to the newest change id) after changes commit, whether written through this
    /// store or, within 250 ms, by another process or instance sharing the database; also after
    /// a prune or a trim of the change log (see the module doc).
    fn change_doorbell(&self) -> ChangeDoorbell;

    /// What the backend reports about its own machinery, for `/metrics` (see
    /// [`BackendMetric`]): cheap to call, read at every scrape. None by default.
    fn backend_metrics(&self) -> Vec<BackendMetric> {
        Vec::new()
    }

    /// Whether the store can still keep what it is given (cheap: `/healthz` calls it on every
    /// probe). `Err` names why not, e.g. [`StoreError::FileLost`]. `Ok` by default.
    fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Write a span at its start. Fails with [`StoreError::DuplicateSpan`] for a known id.
    async fn start_span(&self, input: StartSpanInput) -> Result<SpanRow, StoreError>;

    /// The terminal write. Write-once: `false` (and nothing written) for an unknown or already
    /// terminal span.
    async fn end_span(&self, span_id: &str, input: EndSpanInput) -> Result<bool, StoreError>;

    /// Non-terminal updates (attrs merge, usage, wait boundary); `false` for unknown/terminal.
    async fn patch_span(&self, span_id: &str, patch: SpanPatch) -> Result<bool, StoreError>;

    /// Append an event (payload capped); `None` for an unknown span. Terminal spans accept events.
    async fn append_event(
        &self,
        span_id: &str,
        event_type: &str,
        payload: Option<&serde_json::Value>,
        ts: Option<i64>,
    ) -> Result<Option<SpanEventRow>, StoreError>;

    /// [`Self::append_event`] with a payload already in its stored form (read from the
    /// request's text by [`PayloadText::from_json_text`]): the same event is stored. The
    /// default reads the text back into a value; a backend overrides it to skip that.
    async fn append_event_text(
        &self,
        span_id: &str,
        event_type: &str,
        payload: PayloadText,
        ts: Option<i64>,
    ) -> Result<Option<SpanEventRow>, StoreError> {
        let value = crate::json_as_written::from_slice(payload.as_str().as_bytes())
            .map_err(|err| StoreError::InvalidInput(format!("payload: {err}")))?;
        self.append_event(span_id, event_type, Some(&value), ts)
            .await
    }

    /// Touch an open span's heartbeat. Not change-logged: liveness is not activity.
    async fn heartbeat(&self, span_id: &str, at: Option<i64>) -> Result<(), StoreError>;

    /// Close every open span of a run (children first) and roll it up; returns spans closed.
    async fn cascade_close(
        &self,
        run_id: &str,
        outcome: SpanOutcome,
        reason: &str,
    ) -> Result<i64, StoreError>;

    /// The reference's boot sweep (`POST /v1/activity/sweep-orphans`; `flightlog serve` runs
    /// [`Self::sweep_previous_lives`] at boot instead): close every run with an open
    /// `session`-origin span as interrupted ("server restarted"); returns spans closed.
    async fn sweep_own_orphans(&self) -> Result<i64, StoreError>;

    /// Boot sweep of a server that names its lives: close every open span whose writer starts
    /// with `life_prefix`, other than this store's own writer, as interrupted ("server
    /// restarted"), children first, then roll up each run it touched; returns spans closed.
    /// Spans of every other writer are left alone, whatever their origin: they end by their
    /// writer or by [`ActivityStore::sweep_stale`].
    async fn sweep_previous_lives(&self, life_prefix: &str) -> Result<i64, StoreError>;

    /// Close runs whose open root's heartbeat is older than `stale_after_ms` before `now`,
    /// never runs whose root this writer started ("writer went silent"); returns spans closed.
    async fn sweep_stale(&self, stale_after_ms: i64, now: Option<i64>) -> Result<i64, StoreError>;

    /// [`ActivityStore::sweep_stale`] in steps, for a caller that must not hold writers up for
    /// long (a scheduled sweep meeting a backlog): closes the stale runs of at most `max_roots`
    /// open roots in one transaction and says whether stale runs remain, as `(spans closed,
    /// more)`. A backend should, unlike the reference's sweep, spare a run that also has an
    /// open root alive within the window (a session's turn left open beside the turn running
    /// now: the reference closes both), so that such a run goes once every open root is silent;
    /// the SQLite store does. The default is `sweep_stale`, everything at once by the
    /// reference's rule.
    async fn sweep_stale_step(
        &self,
        stale_after_ms: i64,
        now: Option<i64>,
        max_roots: i64,
    ) -> Result<(i64, bool), StoreError> {
        let _ = max_roots;
        Ok((self.sweep_stale(stale_after_ms, now).await?, false))
    }

    /// Close the spans left open in runs that have no open root (their roots ended, or none
    /// arrived yet), which [`ActivityStore::sweep_stale`] never judges: a tool span the agent
    /// forgot to end, a pending OpenTelemetry span whose end never came. Such spans would read
    /// as running forever and keep the run from ever being pruned. A run is closed, as
    /// interrupted ("writer went silent"), when its last sign of life (a start, an end, or a
    /// heartbeat of an open span) is older than `stale_after_ms` before `now`, and never when
    /// this store's writer has an open span in it; at most `max_runs` runs in one transaction
    /// (in the backend's cheapest order), returning `(spans closed, more)`. Not in the
    /// reference: the maintenance of `flightlog serve` calls it after the stale sweep. Events
    /// and patches are not signs of life, as for roots: a writer whose spans may stay open and
    /// quiet that long heartbeats them.
    async fn sweep_leftovers_step(
        &self,
        stale_after_ms: i64,
        now: Option<i64>,
        max_runs: i64,
    ) -> Result<(i64, bool), StoreError>;

    /// The time by the store's clock (injected: a testing clock in tests and under
    /// `--manual-clock`), as its time-dependent operations take it.
    fn now_ms(&self) -> i64;

    /// A part of the open roots (`openRootSpans`, or with `part.started_before` those of
    /// `findStuck`), in `part`'s order after `part.after`, stopping once they hold about
    /// `part.max_bytes` of attrs (at least one root), with where the next part starts (`None`
    /// after the last): an answer of tens of thousands of roots is read and serialized part by
    /// part, each part taking its room in the server's budget of large answers first.
    async fn open_roots_part(
        &self,
        part: OpenRootsPart,
    ) -> Result<(Vec<SpanRow>, Option<OpenRootsCursor>), StoreError>;

    /// Open roots that started more than `threshold_ms` before `now`, oldest first.
    async fn find_stuck(
        &self,
        threshold_ms: i64,
        now: Option<i64>,
    ) -> Result<Vec<SpanRow>, StoreError>;

    /// Changes after `change_cursor` whose span/event still exists, by change id, at most
    /// `limit` (zero gives none; a negative limit drops that many from the end, as the reference).
    async fn changes_since(
        &self,
        change_cursor: i64,
        limit: i64,
    ) -> Result<Vec<ActivityChange>, StoreError>;

    /// [`ActivityStore::changes_since`] for a reader that holds its page in memory while a
    /// slow client takes it (a live stream): at most `limit` changes (0 to 10,000), and no
    /// more once those read hold about `max_bytes` of span attrs and event payloads (the change
    /// that passes it is the last; the first always comes, whatever its size). Every span
    /// change carries its span's attrs, so 500 changes of a span with a megabyte of attrs are
    /// half a gigabyte; a page bounded in bytes holds a few megabytes whatever the rows. The
    /// next page starts after the last change returned, so nothing is skipped.
    async fn changes_since_bounded(
        &self,
        change_cursor: i64,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Vec<ActivityChange>, StoreError>;

    /// Span changes after the cursor of spans that are now terminal roots, one per span (its
    /// highest change id), by change id; a negative limit means no limit.
    async fn terminal_root_changes_since(
        &self,
        change_cursor: i64,
        limit: i64,
    ) -> Result<Vec<TerminalRootChange>, StoreError>;

    /// Change ids below this may be missing from the log: trimmed while their spans still exist,
    /// or deleted with a pruned run (0 when neither ever happened). A reader whose cursor is
    /// below it cannot be brought up to date from the log and must start again from a snapshot.
    async fn change_log_horizon(&self) -> Result<i64, StoreError>;

    /// The highest change id still in the log (0 when empty; can go down after a prune).
    async fn latest_change_cursor(&self) -> Result<i64, StoreError>;

    /// Spans, events, high-water seq and global cursor of a run, from one read transaction;
    /// `None` when the run has no spans.
    async fn snapshot_run(&self, run_id: &str) -> Result<Option<RunSnapshot>, StoreError>;

    /// About how many bytes the run's snapshot takes serialized as JSON, worked out from what
    /// is stored without reading the attrs and payloads themselves (0 for an unknown run), so a
    /// caller can set memory aside for a snapshot before reading it. An estimate: compressed
    /// values count at a typical ratio, so a snapshot can come out larger or smaller.
    async fn snapshot_size_estimate(&self, run_id: &str) -> Result<u64, StoreError>;

    /// The run's highest seq (0 when it has none): its newest logged change's, or the highest
    /// one the change log's trim deleted while the run's spans stay, whichever is larger; its
    /// next change takes the seq after it. A run whose detail `prune` deleted has none.
    async fn run_high_water_seq(&self, run_id: &str) -> Result<i64, StoreError>;

    /// The highest seq of the run whose change the change log's trim deleted while the run's
    /// spans stay (0 when none): a follower of the run that holds a lower seq missed changes
    /// the log can no longer give it.
    async fn run_trimmed_seq(&self, run_id: &str) -> Result<i64, StoreError>;

    /// The change id of the run's newest logged change (`None` when it logs none). Cheap (one
    /// index probe), so a follower of one run asks this after each commit and reads the change
    /// log only when the run moved past its cursor: following a quiet run costs nothing like
    /// reading every other run's changes (an audit's finding: 200 run streams on idle runs
    /// read and decoded the whole log on every commit, a core's worth of CPU at 2,000 writes/s).
    async fn run_newest_change_id(&self, run_id: &str) -> Result<Option<i64>, StoreError>;

    /// What moved in the change log in `(after, up_to]` (see [`LogMovement`]), for a server
    /// that follows many runs at once: one look after a ring of the doorbell tells it which of
    /// them to read, where each follower of a run asked [`Self::run_newest_change_id`] and the
    /// horizon itself (two probes per follower per look: 200 run streams on quiet runs took a
    /// core at 1,000 writes/s). The horizon and the prune count are read after the runs, so a
    /// prune or trim that deleted changes of the range before they were read shows in them.
    async fn log_movement(&self, after: i64, up_to: i64) -> Result<LogMovement, StoreError>;

    /// One span by id.
    async fn get_span(&self, span_id: &str) -> Result<Option<SpanRow>, StoreError>;

    /// Open root spans, newest start first.
    async fn open_root_spans(&self) -> Result<Vec<SpanRow>, StoreError>;

    /// Upsert the run's rollup from its current spans (no-op for a run without spans).
    async fn rollup_run(&self, run_id: &str) -> Result<(), StoreError>;

    /// The run's rollup row, if any.
    async fn read_rollup(&self, run_id: &str) -> Result<Option<RunRollupRow>, StoreError>;

    /// Delete the detail of finished runs behind the digest floor or the hard ceiling.
    async fn prune(&self, options: PruneOptions) -> Result<PruneResult, StoreError>;

    /// Apply `writes` in order, each atomic on its own (a failing write fails alone); one result
    /// per write, in order. The default runs them one call after another; a backend may
    /// override it to commit the batch in fewer round trips, with the same semantics.
    async fn write_batch(
        &self,
        writes: Vec<ActivityWrite>,
    ) -> Vec<Result<ActivityWriteResult, StoreError>> {
        let mut results = Vec::with_capacity(writes.len());
        for write in writes {
            let result = match write {
                ActivityWrite::StartSpan(input) => self
                    .start_span(input)
                    .await
                    .map(|span| ActivityWriteResult::Started(Box::new(span))),
                ActivityWrite::EndSpan { span_id, input } => self
                    .end_span(&span_id, input)
                    .await
                    .map(ActivityWriteResult::Ended),
                ActivityWrite::PatchSpan { span_id, patch } => self
                    .patch_span(&span_id, patch)
                    .await
                    .map(ActivityWriteResult::Patched),
                ActivityWrite::AppendEvent {
                    span_id,
                    event_type,
                    payload,
                    ts,
                } => self
                    .append_event(&span_id, &event_type, payload.as_ref(), ts)
                    .await
                    .map(ActivityWriteResult::Appended),
                ActivityWrite::AppendEventText {
                    span_id,
                    event_type,
                    payload,
                    ts,
                } => self
                    .append_event_text(&span_id, &event_type, payload, ts)
                    .await
                    .map(ActivityWriteResult::Appended),
                ActivityWrite::Heartbeat { span_id, at } => self
                    .heartbeat(&span_id, at)
                    .await
                    .map(|()| ActivityWriteResult::Heartbeat),
            };
            results.push(result);
        }
        results
    }

    /// Runs newest first (by start, then id, both descending): every run with a root span, open
    /// or ended (with its rollup's totals once rolled up), and runs whose detail was pruned
    /// (from their rollup alone). See [`RunListQuery`] for the filters and paging.
    async fn list_runs(&self, query: RunListQuery) -> Result<RunPage, StoreError>;

    /// Store spans delivered whole by an importer (OTLP), idempotently, in one atomic write:
    /// an unknown span is created with its events (an open one whose parent is not stored, or
    /// has ended, is a root until a later delivery names its parent); an open one is completed (its new
    /// events added; one the same importer stored takes the delivery's parent, name and kind);
    /// a terminal one is left alone, except that a root stored for want of its remote caller
    /// (see [`ImportedSpan::remote_parent`]) moves under the caller's span when that is stored
    /// (its parent and kind rewritten, change-logged, and a rollup made from it as the run's
    /// root deleted). Every write is change-logged like a native one.
    /// Afterwards each touched run whose root is terminal is rolled up again, so a late span
    /// of an already rolled-up run updates the rollup. See [`ImportedSpan`].
    async fn import_spans(&self, spans: Vec<ImportedSpan>) -> Result<ImportReport, StoreError>;
}
