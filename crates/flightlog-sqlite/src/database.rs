//! One SQLite file: its writer thread (group commit) and its pool of reader connections.
//!
//! Every write of every store on this file goes through one writer thread per process. The
//! thread takes the first queued job, drains whatever else is already queued (up to a batch
//! limit), and commits them all in one `BEGIN IMMEDIATE` transaction: one WAL commit for many
//! writes. The jobs run back to back; one that fails after it wrote rolls the attempt back, and
//! the group is replayed with a savepoint around each job, so a failing write fails alone and
//! never takes its neighbours down. Replies are sent only after `COMMIT` returned, so an acknowledged
//! write is on disk (to the durability level configured) and anything a caller learns from a
//! reply is already visible to readers: persist, then emit.
//!
//! `BEGIN IMMEDIATE` takes the write lock up front, so a second process writing the same file
//! makes us wait instead of failing mid-transaction: the writer polls the lock itself (its
//! connection has no busy timeout), taking turns with other processes' writers, for at most
//! `lock_retry_budget`, then fails the group as busy with nothing written.
//!
//! Reads run on separate connections from a small pool, on the caller's thread; in WAL mode they
//! see the last committed state and never block the writer or each other.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flightlog_core::activity::StoreError;
use flightlog_core::BackendMetric;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{mpsc, oneshot};

use crate::error::{backend, is_busy};
use crate::journal_bells::{JournalBells, JournalWrites};
use crate::lock_turns::LockTurns;
use crate::payload_codec::{Dictionary, PayloadCodec};
use crate::rewind_gate::RewindGate;
use crate::rows::KeyNames;
use crate::schema;
use crate::side_files::{side_file_path, NAME_MAX};
use crate::span_id_filter::SpanIdFilterState;
use crate::wal_room::WalRoom;

/// How hard a commit is pushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=NORMAL`: survives a process crash; the last commits may be lost on power loss.
    #[default]
    Normal,
    /// `synchronous=FULL`: every commit survives power loss.
    Full,
}

impl Durability {
    fn pragma_value(self) -> &'static str {
        match self {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        }
    }
}

/// How a database file is opened.
#[derive(Debug, Clone)]
pub struct SqliteConfig {
    /// The database file; created when missing.
    pub path: PathBuf,
    pub durability: Durability,
    /// How long one connection waits for another's lock before SQLite reports busy (at most
    /// `i32::MAX` ms, SQLite's limit).
    pub busy_timeout: Duration,
    /// How long a write keeps retrying a lock another process holds before it fails with
    /// [`StoreError::Busy`] (10 s by default: a writer waits on a stream of other writers'
    /// short transactions for milliseconds, so only a long foreign transaction gets this far).
    pub lock_retry_budget: Duration,
    /// Most writes committed in one transaction (1 to 65,536).
    pub max_group_size: usize,
    /// Writes that may wait in the queue (1 to 2^24); beyond it `try_*` callers get
    /// `Overloaded`.
    pub write_queue_capacity: usize,
    /// `prune` trims change rows of finished runs this many change ids behind the newest.
    pub change_log_retention: i64,
    /// The most change rows one write job of a `prune` call trims (at least 1; default 20,000),
    /// so that the first prune of a big database does not hold the write lock for seconds (an
    /// endpoint prune of many runs is several jobs, each trimming up to this many).
    pub change_log_trim_batch: i64,
    /// WAL frames (pages) in use past which the writer rewinds the WAL itself and takes no new
    /// group until it has (256 to 2^20; default 32,768 frames, 128 MiB of 4 KiB pages). The
    /// checkpointer normally rewinds long before; this bounds the WAL's disk when it cannot.
    pub wal_hard_cap_frames: i64,
}

impl SqliteConfig {
    /// Defaults for the file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            durability: Durability::Normal,
            busy_timeout: Duration::from_secs(5),
            lock_retry_budget: Duration::from_secs(10),
            max_group_size: 512,
            write_queue_capacity: 16_384,
            change_log_retention: crate::activity_write::CHANGE_LOG_TRIM_DISTANCE,
            change_log_trim_batch: crate::activity_write::MAX_TRIMMED_PER_PRUNE,
            wal_hard_cap_frames: 32_768,
        }
    }
}

/// The writer caches' map: std's `HashMap` with foldhash's randomly seeded hasher.
pub(crate) type FastMap<K, V> = foldhash::HashMap<K, V>;

/// The writer's caches, so the hot path skips lookups it already knows the answer to.
///
/// `run_keys` and `writer_keys` map rows that are never deleted, so they stay valid across
/// transactions. The volatile part (span keys, per-run last seq, per-span next event index)
/// mirrors rows other writers could change: it is trusted only while no other connection has
/// committed since our last transaction (`PRAGMA data_version` unchanged, checked right after
/// `BEGIN IMMEDIATE`, i.e. under the write lock) and is dropped after any rollback, after our own
/// prune, and when it grows too large. Everything in it is therefore exactly what a query would
/// return.
///
/// The maps hash with foldhash, seeded at random per process, rather than the standard SipHash:
/// they sit on every write's path (a single-op HTTP write made five lookups in them, a journal
/// append two), and the switch took the writer thread from 41,000 to 38,700 instructions per
/// single-op HTTP write (callgrind, BENCHMARKS.md). Their keys come from clients, and
/// foldhash's random seed keeps colliding keys from being precomputed.
#[derive(Debug, Default)]
pub(crate) struct WriterCache {
    pub run_keys: FastMap<String, i64>,
    pub writer_keys: FastMap<String, i64>,
    /// span id -> (span key, run key)
    pub spans: FastMap<String, (i64, i64)>,
    /// run key -> highest seq logged for the run
    pub run_seq: FastMap<i64, i64>,
    /// span key -> next event index
    pub next_event_index: FastMap<i64, i64>,
    /// run key -> whether the run has a root, or since when it waits for one (see `run_roots`)
    pub run_roots: FastMap<i64, crate::run_roots::RootState>,
    /// run key -> the callers (span ids) spans of the run wait for (see `remote_callers`):
    /// read once per run, then kept by the writer, so a span no span waits for costs a lookup
    /// here and no query.
    pub runs_awaiting_callers: FastMap<i64, foldhash::HashSet<String>>,
    /// The change id the next change row gets.
    pub next_change_id: Option<i64>,
    /// Whether the current group logged a change (set by `activity_write::log_change`, reset
    /// when a group begins, kept by every clear): a group that logged none has nothing to ring
    /// the doorbell for, so it skips the `MAX(change_id)` lookup.
    pub group_logged_change: bool,
    /// Whether the current group deleted runs' detail or change rows (`prune`): no change says
    /// so, so the doorbell is rung without moving once it commits, and the streams look again
    /// (a run stream whose run was pruned ends at once rather than at its next periodic look).
    pub group_deleted_changes: bool,
    /// What the current group wrote to the journal (appends through which handle, a compaction,
    /// a prune that removed something; kept by every clear): a group that wrote anything moves
    /// `flightlog_meta.journal_writes`, which the commit watcher reads, so the journals' commit
    /// doorbells ring for journal commits only, and not for the appends a handle's subscription
    /// carried (see `journal_bells`).
    pub group_journal: JournalWrites,
    /// engagement id -> its counter row (key, next seq, arrival bucket). Only appends keep
    /// entries up to date; compaction and pruning drop them (see `journal.rs`).
    pub engagements: FastMap<String, crate::journal::EngagementCounter>,
    /// How many ids the recent span-id index holds (see `activity_write::register_span_id`).
    pub recent_span_ids: Option<i64>,
    /// How many ids the middle span-id index holds.
    pub middle_span_ids: Option<i64>,
    /// Where the next sweep of the middle span-id index into the main one starts (the last id
    /// swept; empty: from the lowest). Only spreads work, so it survives every cache clear.
    pub span_id_sweep_cursor: String,
    /// Every span id in the database, as a Bloom filter (see `span_id_filter`). Kept across
    /// rollbacks and prunes (they only remove ids); dropped when another connection commits.
    pub span_id_filter: SpanIdFilterState,
}

impl WriterCache {
    /// Entries a map may hold before it is cleared. Each entry costs ~70 – 100 bytes (an id
    /// string and its key), so at 200,000 the maps took ~40 MB of the server's memory during
    /// long OTLP ingest, where they stop helping once a trace's batch is written: at 65,536 the
    /// server's peak RSS over 2,000,000 ingested spans fell from 146.9 / 151.6 MiB to
    /// 140.3 / 132.5 MiB, and `import_workload` stayed within its noise (alternating runs).
    const MAX_ENTRIES: usize = 65_536;

    pub(crate) fn clear(&mut self) {
        self.run_keys.clear();
        self.writer_keys.clear();
        self.clear_volatile();
    }

    pub(crate) fn clear_volatile(&mut self) {
        self.spans.clear();
        self.run_seq.clear();
        self.next_event_index.clear();
        self.run_roots.clear();
        self.runs_awaiting_callers.clear();
        self.next_change_id = None;
        self.engagements.clear();
        self.recent_span_ids = None;
        self.middle_span_ids = None;
    }

    fn trim(&mut self) {
        if self.run_keys.len() > Self::MAX_ENTRIES || self.writer_keys.len() > Self::MAX_ENTRIES {
            self.run_keys.clear();
            self.writer_keys.clear();
        }
        if self.spans.len() > Self::MAX_ENTRIES
            || self.run_seq.len() > Self::MAX_ENTRIES
            || self.next_event_index.len() > Self::MAX_ENTRIES
            || self.run_roots.len() > Self::MAX_ENTRIES
            || self.runs_awaiting_callers.len() > Self::MAX_ENTRIES
            || self.engagements.len() > Self::MAX_ENTRIES
        {
            self.clear_volatile();
        }
    }
}

/// What a write job sees: the connection inside the open transaction and the key caches.
pub(crate) struct WriteContext<'a> {
    pub conn: &'a Connection,
    pub keys: &'a mut WriterCache,
    pub codec: &'a PayloadCodec,
    /// The hot statements, held for the whole group (see [`StatementSlots`]).
    pub statements: StatementSlots<'a>,
    /// Set when the group is being replayed with a savepoint around each job, after a job
    /// failed dirty in the fast pass: a job made of many writes (a batch) then isolates each of
    /// them too, so only the failing one fails (see [`GroupCommitWriter::apply_group`]).
    pub isolated: bool,
    /// Change rows held back to be written several to an `INSERT`, while a job that writes many
    /// of them runs (see `activity_write::defer_changes`); `None`: each is written at once.
    pub deferred_changes: Option<Vec<crate::activity_write::DeferredChange>>,
}

impl<'a> WriteContext<'a> {
    pub(crate) fn new(
        conn: &'a Connection,
        keys: &'a mut WriterCache,
        codec: &'a PayloadCodec,
        isolated: bool,
    ) -> Self {
        Self {
            conn,
            keys,
            codec,
            statements: StatementSlots::default(),
            isolated,
            deferred_changes: None,
        }
    }

    /// The prepared statement for `sql`, taken from the connection's cache once per group and
    /// then found by the address of its text.
    pub(crate) fn statement(
        &mut self,
        sql: &'static str,
    ) -> rusqlite::Result<&mut rusqlite::CachedStatement<'a>> {
        self.statements.get(self.conn, sql)
    }
}

/// Statements a group's writes run many times, held for the whole group.
///
/// `prepare_cached` hashes the whole SQL text to find a statement, and again to put it back
/// (SipHash over a few hundred bytes, twice per execution): measured at 7% of the writer
/// thread's time during OTLP ingest, where each span runs four or five statements. Here a
/// statement is taken from that cache once per group and found by the address of its `'static`
/// text; it goes back to the cache when the group ends.
#[derive(Default)]
pub(crate) struct StatementSlots<'a> {
    /// (address and length of the SQL text, its statement)
    slots: Vec<((usize, usize), rusqlite::CachedStatement<'a>)>,
}

impl<'a> StatementSlots<'a> {
    /// More distinct hot statements than this in one group: the extra ones go through
    /// `prepare_cached` each time (a linear scan of the slots stays cheaper than a hash).
    const MAX_SLOTS: usize = 24;

    fn get(
        &mut self,
        conn: &'a Connection,
        sql: &'static str,
    ) -> rusqlite::Result<&mut rusqlite::CachedStatement<'a>> {
        // Address and length: two texts with both equal are the same bytes.
        let address = (sql.as_ptr() as usize, sql.len());
        let found = self.slots.iter().position(|(at, _)| *at == address);
        let index = match found {
            Some(index) => index,
            None => {
                let statement = conn.prepare_cached(sql)?;
                if self.slots.len() >= Self::MAX_SLOTS {
                    self.slots.remove(0);
                }
                self.slots.push((address, statement));
                self.slots.len() - 1
            }
        };
        match self.slots.get_mut(index) {
            Some((_, statement)) => Ok(statement),
            // Unreachable: `index` was found or pushed just above.
            None => Err(rusqlite::Error::InvalidQuery),
        }
    }
}

/// How a job's attempt went, as far as the transaction is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    /// It succeeded, or failed with an error that guarantees it wrote nothing.
    Clean,
    /// It failed after it may have written: its effects must be rolled back.
    Dirty,
}

/// Errors a write function only returns before it has changed anything, so the group
/// transaction can go on without a savepoint around the failed write.
pub(crate) fn fails_cleanly(err: &StoreError) -> bool {
    matches!(
        err,
        StoreError::DuplicateSpan { .. } | StoreError::InvalidInput(_)
    )
}

/// A queued write: applied inside the group transaction (perhaps twice, see
/// [`GroupCommitWriter::apply_group`]), answered after the group committed.
trait WriteJob: Send {
    fn apply(&mut self, ctx: &mut WriteContext<'_>) -> Applied;
    /// Deliver the outcome; `commit` is the fate of the whole group. A "damaged file" error is
    /// first put to `disk` (see [`DiskFailure::explain`]).
    fn finish(self: Box<Self>, commit: Result<(), StoreError>, disk: &DiskFailure);
    /// Whether its change rows may be held back with those of the jobs around it (see
    /// [`SqliteDatabase::write_deferring_changes`]).
    fn defers_changes(&self) -> bool;
}

/// Runs on the writer thread after the job's group committed, before the caller is answered.
pub(crate) type AfterCommit<T> = Box<dyn FnOnce(&T) + Send>;

struct TypedJob<F, T> {
    work: F,
    outcome: Option<Result<T, StoreError>>,
    after_commit: Option<AfterCommit<T>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
    defers_changes: bool,
}

impl<F, T> WriteJob for TypedJob<F, T>
where
    F: FnMut(&mut WriteContext<'_>) -> Result<T, StoreError> + Send,
    T: Send,
{
    fn apply(&mut self, ctx: &mut WriteContext<'_>) -> Applied {
        let result = (self.work)(ctx);
        let applied = match &result {
            Err(err) if !fails_cleanly(err) => Applied::Dirty,
            _ => Applied::Clean,
        };
        self.outcome = Some(result);
        applied
    }

    fn defers_changes(&self) -> bool {
        self.defers_changes
    }

    fn finish(self: Box<Self>, commit: Result<(), StoreError>, disk: &DiskFailure) {
        let TypedJob {
            work,
            outcome,
            after_commit,
            reply,
            defers_changes: _,
        } = *self;
        // Dropped before the answer, so whatever the work shares with the caller (a batch's
        // spans, their attrs and events) is freed by the caller's last reference, on the
        // caller's thread, and not here on the one serial thread.
        drop(work);
        if let (Ok(()), Some(Ok(value)), Some(after_commit)) = (&commit, &outcome, after_commit) {
            after_commit(value);
        }
        let answer = match (commit, outcome) {
            (Ok(()), Some(outcome)) => outcome,
            (Ok(()), None) => Err(StoreError::Backend("write was never applied".into())),
            // The job's own error explains more than the group's commit failure.
            (Err(_), Some(Err(own))) => Err(own),
            (Err(commit_err), _) => Err(commit_err),
        };
        let answer = answer.map_err(|err| disk.explain(err));
        // The caller may have stopped waiting; the write's fate is already settled either way.
        let _ = reply.send(answer);
    }
}

type QueuedJob = Box<dyn WriteJob>;

/// Counters of the writer thread's work, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Transactions committed (or rolled back) by the writer.
    pub groups: AtomicU64,
    /// Writes applied.
    pub writes: AtomicU64,
    /// Nanoseconds spent applying writes (statements inside the transaction).
    pub apply_nanos: AtomicU64,
    /// Nanoseconds spent in `BEGIN` and `COMMIT`.
    pub commit_nanos: AtomicU64,
    /// Nanoseconds spent checkpointing the WAL (the checkpointer's passes and the writer's
    /// rewinds).
    pub checkpoint_nanos: AtomicU64,
    /// WAL rewinds done by the writer thread (each a `RESTART` checkpoint between two groups).
    pub writer_rewinds: AtomicU64,
    /// Nanoseconds the writer thread spent in those rewinds (time no write could commit).
    pub writer_rewind_nanos: AtomicU64,
    /// WAL frames (pages) the writer appended: the write volume of its commits, which the
    /// checkpointer copies again.
    pub wal_frames: AtomicU64,
    /// Span-id filters the writer installed (see `span_id_filter`): built in the background
    /// after the writer wrote alone for a few groups, rebuilt larger when full.
    pub span_id_filters_installed: AtomicU64,
}

struct ReaderPool {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
}

impl ReaderPool {
    const MAX_IDLE: usize = 8;

    fn take(&self) -> Result<Connection, StoreError> {
        if let Some(conn) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) {
            return Ok(conn);
        }
        open_reader(&self.path, self.busy_timeout)
    }

    fn give_back(&self, conn: Connection) {
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < Self::MAX_IDLE {
                idle.push(conn);
            }
        }
    }
}

/// A handle on one SQLite database file shared by the stores that live in it.
pub struct SqliteDatabase {
    queue: mpsc::Sender<QueuedJob>,
    readers: ReaderPool,
    codec: Arc<PayloadCodec>,
    names: KeyNames,
    change_log_retention: i64,
    change_log_trim_batch: i64,
    /// The newest committed change id: set by our writer after each commit, and by the
    /// change watcher when another process commits.
    doorbell: tokio::sync::watch::Sender<i64>,
    /// The journal handles' commit doorbells, rung by the commit watcher (see
    /// `journal_bells`).
    journal_bells: Arc<JournalBells>,
    stats: Arc<WriterStats>,
    /// Set by [`SqliteDatabase::close`]: the writer stops after the group it is committing.
    stop_writer: Arc<AtomicBool>,
    /// Set by [`SqliteDatabase::shutting_down`]: a write waits for another process's write lock
    /// at most [`SHUTDOWN_LOCK_WAIT`] in all.
    shutting_down: Arc<AtomicBool>,
    /// The writer, checkpointer and commit watcher threads, joined by
    /// [`SqliteDatabase::close`]. Without a close they are detached: the writer ends once every
    /// handle is dropped and the queue drained, and the other two after it.
    threads: Mutex<Option<[JoinHandle<()>; 3]>>,
    path: PathBuf,
    /// The file's identity when opened (device and inode), to tell at close whether the path
    /// still names the file this process wrote (see [`SqliteDatabase::close`]).
    file_identity: Option<(u64, u64)>,
    /// The database file as opened and its `-wal`/`-shm` (see [`OpenedFiles`]), shared with the
    /// checkpointer, which looks every period.
    opened_files: Arc<OpenedFiles>,
    /// Bounds the long reads running on blocking threads at once (see
    /// [`SqliteDatabase::read_apart`]).
    long_reads: tokio::sync::Semaphore,
    /// Bounds the short reads apart (see [`SqliteDatabase::read_apart_short`]).
    short_reads: tokio::sync::Semaphore,
    /// Set while the writer's WAL rewind waits for readers (see [`SqliteDatabase::read_apart`]).
    rewinding: Arc<AtomicBool>,
    /// The disk failure of the writer's last group, until a group commits (see [`DiskFailure`]).
    disk_failure: Arc<DiskFailure>,
    /// The readers' side of the gate that holds long reads back while any process's writer
    /// rewinds (see [`RewindGate`]).
    rewind_gate: RewindGate,
    /// The checkpointer's request that the writer rewind the WAL (see
    /// `GroupCommitWriter::rewind_wal_if_asked`); held here so tests can make the request.
    #[cfg_attr(not(test), allow(dead_code))]
    rewind_wanted: Arc<AtomicBool>,
}

/// How long the writer's WAL rewind waits for running readers while the WAL is under its hard
/// cap, and how long it then lets pass before it tries again (doubled after each attempt in a
/// row that found readers, up to [`LONGEST_REWIND_BACKOFF`]).
const UNDER_CAP_REWIND_WAIT: Duration = Duration::from_millis(200);

/// The longest pause between two rewind attempts under the cap: readers this process does not
/// hold back (another process's, a sqlite3 shell's) can keep every attempt waiting its whole
/// `UNDER_CAP_REWIND_WAIT`, and retrying every 200 ms then kept the writer in rewinds 30 - 40% of
/// the time.
const LONGEST_REWIND_BACKOFF: Duration = Duration::from_millis(3_200);

/// The longest a long read waits for the writer's WAL rewind to finish before it starts anyway.
const LONGEST_WAIT_FOR_REWIND: Duration = Duration::from_secs(6);

/// The most a write waits for another process's write lock once the process is stopping (see
/// [`SqliteDatabase::shutting_down`]): well inside the server's 5 s grace for the requests in
/// flight, so their clients hear `503` rather than a closed connection.
pub const SHUTDOWN_LOCK_WAIT: Duration = Duration::from_secs(2);

/// How many long reads (listings, snapshots, scans) may run at once: more than the machine's
/// cores would only make each slower, and every one holds a reader connection.
pub(crate) const LONG_READS_AT_ONCE: usize = 4;

/// How many short reads apart (see [`SqliteDatabase::read_apart_short`]) may run at once, on
/// places of their own.
pub(crate) const SHORT_READS_AT_ONCE: usize = 2;

impl std::fmt::Debug for SqliteDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDatabase")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Run a parameterless statement through the statement cache: transaction control runs for
/// every write group and every consistent read, and parsing it each time showed in profiles.
fn execute_cached_raw(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

fn execute_cached(conn: &Connection, sql: &str) -> Result<(), StoreError> {
    execute_cached_raw(conn, sql).map_err(backend)
}

/// The settings every connection of a [`SqliteDatabase`] gets (public so the statement-cache
/// regression tests check exactly what the store runs with).
///
/// `SQLITE_DBCONFIG_ENABLE_QPSG`: without it this SQLite marks a statement whose plan *could*
/// depend on a bound value (a rowid range with a bound cursor and a bound `LIMIT`, as in the
/// change-log page read of every live stream) and re-prepares it on every execution: profiled at
/// 16% of the server's CPU during streaming. The planner stability guarantee keeps one plan per
/// statement, which is what a cache of prepared statements is for; no query of flightlog relies
/// on value-dependent planning (there are no `sqlite_stat4` statistics).
pub fn configure_connection(conn: &Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    // SQLite takes milliseconds as a C int (rusqlite panics past it): ~24.8 days is the most.
    conn.busy_timeout(busy_timeout.min(MAX_BUSY_TIMEOUT))
        .map_err(backend)?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map_err(backend)?;
    Ok(())
}

fn apply_common_pragmas(conn: &Connection, busy_timeout: Duration) -> Result<(), StoreError> {
    configure_connection(conn, busy_timeout)
}

/// The WAL file SQLite keeps beside `path` (`<path>-wal`).
fn wal_path_of(path: &Path) -> PathBuf {
    companion_path(path, "-wal")
}

/// The files SQLite keeps beside a database in WAL mode.
const COMPANION_SUFFIXES: [&str; 2] = ["-wal", "-shm"];

/// Refuse a `-wal` or `-shm` beside the file that this process may not write (left by a process
/// of another user, root's say, killed): SQLite opened the database anyway, the boot's writes
/// failed with a warning, `/healthz` said ok, and every write was answered 500 "attempt to
/// write a readonly database" (an audit's finding). Asked of the kernel (`faccessat` with the
/// effective ids), not by opening the file: closing a descriptor of a file drops every POSIX
/// lock this process holds on it, SQLite's on the `-shm` of a database it has open already.
fn check_companions_writable(real_path: &Path) -> Result<(), StoreError> {
    use rustix::fs::{accessat, Access, AtFlags, CWD};
    for suffix in COMPANION_SUFFIXES {
        let companion = companion_path(real_path, suffix);
        let writable = accessat(
            CWD,
            &companion,
            Access::READ_OK | Access::WRITE_OK,
            AtFlags::EACCESS,
        );
        if let Err(err) = writable {
            // A missing file is made by SQLite; a read-only file system gets its own message.
            if err == rustix::io::Errno::ACCESS {
                // Owned by this user already, only its mode keeps it from writing (a `chmod`
                // of the database while a server ran left the server's -wal read-only): chown
                // was the wrong fix to name (an audit's finding).
                let own = {
                    use std::os::unix::fs::MetadataExt;
                    std::fs::metadata(&companion)
                        .is_ok_and(|meta| meta.uid() == rustix::process::geteuid().as_raw())
                };
                let fix = if own {
                    "it belongs to this user, but its mode does not let its owner write it: \
                     give it the database's mode (chmod u+rw)"
                } else {
                    "a process of another user, root's say, left it: give it to this user as \
                     the database is (chown)"
                };
                return Err(StoreError::Backend(format!(
                    "{} is not writable by the user this process runs as ({fix}); flightlog \
                     writes to its database's -wal and -shm files as to the database itself, \
                     and do not delete the -wal (it may hold committed writes)",
                    companion.display()
                )));
            }
        }
    }
    Ok(())
}

/// `<path><suffix>`.
fn companion_path(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The (device, inode) of the file at `path`, where the platform has them.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path)
        .ok()
        .and_then(|meta| identity_of(&meta))
}

/// The (device, inode) pair in `meta`; `None` where the platform has none.
fn identity_of(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// Whose is the file at `path`, if one is there: read through a read-only connection opened
/// before any other, so a file that is refused keeps every byte (a read-write connection would
/// switch its journal mode, or copy a foreign WAL into it when closing). A path that cannot be
/// opened read-only is left to the read-write open, whose errors say what to do.
///
/// When no `-wal` and no `-shm` file is beside it, no process has it open in WAL mode and the
/// file alone holds everything: it is read as *immutable* (no locks, no files made), so a
/// refused file does not get a `-wal` and a `-shm` left beside it either (a read-only
/// connection made them, and could not remove them when it closed).
fn check_existing_file(path: &Path, busy_timeout: Duration) -> Result<(), StoreError> {
    if !path.is_file() {
        return Ok(());
    }
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    let alone = !wal_path_of(path).exists() && !Path::new(&shm).exists();
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let opened = match immutable_uri(path) {
        Some(uri) if alone => Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI),
        _ => Connection::open_with_flags(path, flags),
    };
    let Ok(conn) = opened else {
        return Ok(());
    };
    conn.busy_timeout(busy_timeout.min(MAX_BUSY_TIMEOUT))
        .map_err(backend)?;
    let judged = read_identity(&conn, path);
    // An immutable read takes no locks: a process that started on the file after it was found
    // alone (several opening a new file at once) may be writing it, and the read may see half
    // of that. Such a process made the side files by now, so judge the file again the ordinary
    // way, which leaves none behind then.
    let others_started = wal_path_of(path).exists() || Path::new(&shm).exists();
    if judged.is_err() && alone && others_started {
        if let Ok(conn) = Connection::open_with_flags(path, flags) {
            conn.busy_timeout(busy_timeout.min(MAX_BUSY_TIMEOUT))
                .map_err(backend)?;
            return read_identity(&conn, path);
        }
    }
    judged
}

/// `file:<path>?immutable=1`, the path percent-encoded as a URI path; `None` for a path that
/// is not UTF-8 (it is then read the ordinary way).
fn immutable_uri(path: &Path) -> Option<String> {
    let text = path.to_str()?;
    let mut uri = String::from("file:");
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"/-_.~".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            uri.push_str(&format!("%{byte:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    Some(uri)
}

/// The first read of the file (its header and schema, in words that say what to do when SQLite
/// cannot use it), then whose file it is ([`schema::check_identity`]).
fn read_identity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    // One read transaction, so every statement of the check sees the same state: read one by
    // one, a file another process was creating looked half made (its version read before the
    // migration committed, its tables after, without the table a later transaction adds) and
    // was refused as "not a flightlog database".
    let snapshot = conn
        .unchecked_transaction()
        .map_err(|err| unusable_file(path, err))?;
    snapshot
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| {
            row.get::<_, i64>(0)
        })
        .map_err(|err| unusable_file(path, err))?;
    let judged = schema::check_identity(&snapshot, path);
    // Nothing was written: ending the read cannot lose anything.
    let _ = snapshot.rollback();
    judged
}

/// `PRAGMA journal_mode=WAL`, retried while another process holds the lock it needs, for up to
/// `busy_timeout`: the journal mode it ended in.
///
/// Switching a new file (still in rollback mode) to WAL takes its exclusive lock from inside a
/// read, and SQLite does not wait for a lock that another connection's pending lock blocks (the
/// two could wait for each other forever): it answers `SQLITE_BUSY` at once, busy timeout or
/// not. So when several processes open a new file at the same moment (four `flightlog demo`s
/// started together), all but one used to fail with "database is locked". Retried, the loser
/// finds the file in WAL mode already once the winner is done.
fn switch_to_wal(conn: &Connection, busy_timeout: Duration) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + busy_timeout;
    loop {
        match conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get::<_, String>(0)) {
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if failure.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            answer => return answer,
        }
    }
}

/// Why SQLite cannot use the file at `path` it opened, in words that say what to do.
fn unusable_file(path: &Path, err: rusqlite::Error) -> StoreError {
    let code = match err {
        rusqlite::Error::SqliteFailure(inner, _) => Some(inner.code),
        _ => None,
    };
    match code {
        Some(rusqlite::ErrorCode::NotADatabase) => StoreError::NotFlightlog(format!(
            "{} is not an SQLite database file at all ({err})",
            path.display()
        )),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => StoreError::Corrupt(format!(
            "{path} is damaged ({err}): restore it from a backup, or recover what it holds with \
             `sqlite3 {path} .recover | sqlite3 recovered.db` and start on recovered.db (where \
             `.recover` fails, as in SQLite 3.40, `.dump` in its place saves what it can read)",
            path = path.display()
        )),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen) => {
            StoreError::Backend(format!(
                "cannot write {} ({err}): the file and its folder must be writable, because \
                 SQLite keeps a -wal and a -shm file beside the database",
                path.display()
            ))
        }
        _ => backend(err),
    }
}

/// The path of the database file itself, absolute and without symbolic links (the file's
/// folder when the file does not exist yet; the path as given when neither resolves). SQLite
/// resolves links when it names the `-wal` and `-shm` files, and flightlog's side files
/// (`-flightlog-turn`, `-flightlog-rewind`, a server's instance lock) must be beside the same
/// file: named after a link, two processes reaching one file by two paths shared its data but
/// neither the turn-taking at the write lock nor the lock that keeps two live servers from
/// being one instance (the second one's boot sweep closed the first one's live spans). Absolute
/// also keeps a later change of the working folder from moving them.
pub fn real_database_path(path: &Path) -> PathBuf {
    if let Ok(real) = std::fs::canonicalize(path) {
        return real;
    }
    let (Some(name), Some(folder)) = (path.file_name(), path.parent()) else {
        return path.to_path_buf();
    };
    let folder = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder
    };
    match std::fs::canonicalize(folder) {
        Ok(real_folder) => real_folder.join(name),
        Err(_) => path.to_path_buf(),
    }
}

/// Refuse, before SQLite sees it, a path that cannot name a database file, in words that say
/// what is wrong with it (SQLite says only "unable to open database file" or "disk I/O
/// error" for each): a file name longer than a file system takes, a dangling symbolic link, a
/// FIFO, device or socket (which SQLite would open and fail on, or hang), and a folder in the
/// path that is a file.
fn check_path_shape(path: &Path) -> Result<(), StoreError> {
    let shown = path.display();
    if let Some(name) = path.file_name() {
        // SQLite also makes `<name>-wal` and `<name>-shm` beside it, and `<name>-journal`
        // while it creates the file (before it switches to WAL; a file in WAL mode never needs
        // one, so an existing database keeps the longer limit it was made under). flightlog's
        // own side files shorten their names as needed (see `side_files`).
        let suffix = if path.exists() { "-wal" } else { "-journal" };
        if name.len() + suffix.len() > NAME_MAX {
            return Err(StoreError::Backend(format!(
                "the file name of {shown} is {} bytes long; with the `{suffix}` SQLite adds for \
                 its companion files it must stay within {NAME_MAX} bytes: give a shorter name",
                name.len()
            )));
        }
    }
    if let Ok(link) = std::fs::symlink_metadata(path) {
        let target = std::fs::metadata(path);
        if link.file_type().is_symlink() {
            if let Err(err) = &target {
                let points_to = std::fs::read_link(path)
                    .map(|target| target.display().to_string())
                    .unwrap_or_default();
                // Links that lead back to themselves fail with "Too many levels of symbolic
                // links": their target exists, as a link (an audit saw "does not exist").
                let what = if err.kind() == std::io::ErrorKind::NotFound {
                    "which does not exist".to_owned()
                } else {
                    format!("which cannot be reached ({err})")
                };
                return Err(StoreError::Backend(format!(
                    "{shown} is a symbolic link to {points_to}, {what}: remove the link, or give \
                     the path of the database file itself"
                )));
            }
        }
        if let Ok(target) = target {
            if !target.is_file() && !target.is_dir() {
                return Err(StoreError::Backend(format!(
                    "{shown} is not a regular file (a FIFO, a device or a socket): give the path \
                     of a database file, or of one to create"
                )));
            }
        }
    }
    for folder in path.ancestors().skip(1) {
        if folder.as_os_str().is_empty() {
            break;
        }
        match std::fs::metadata(folder) {
            Ok(metadata) if metadata.is_dir() => break,
            Ok(_) => {
                return Err(StoreError::Backend(format!(
                    "{} is a file, not a folder, so {shown} cannot be created in it: give a \
                     path in a folder",
                    folder.display()
                )))
            }
            Err(_) => continue,
        }
    }
    Ok(())
}

/// Why the database at `path` cannot be opened, in words that say what to do.
fn cannot_open(path: &Path, err: &rusqlite::Error) -> StoreError {
    if path.is_dir() {
        return StoreError::Backend(format!(
            "{} is a directory: give the path of a database file, such as {}",
            path.display(),
            path.join("flightlog.db").display()
        ));
    }
    let missing_folder = path
        .parent()
        .filter(|folder| !folder.as_os_str().is_empty() && !folder.exists());
    if let Some(folder) = missing_folder {
        return StoreError::Backend(format!(
            "the folder {} does not exist: create it, or give a database path in an existing \
             folder",
            folder.display()
        ));
    }
    StoreError::Backend(format!(
        "cannot open {}: {err} (the file and its folder must be readable and writable: SQLite \
         keeps a -wal and a -shm file beside the database)",
        path.display()
    ))
}

/// The longest `busy_timeout` SQLite can take (`i32::MAX` milliseconds).
const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);
/// The largest write queue (`SqliteConfig::write_queue_capacity` is clamped to it; tokio's
/// channel refuses more than `usize::MAX >> 3`, and no queue needs to be near that).
const MAX_WRITE_QUEUE_CAPACITY: usize = 1 << 24;
/// The largest group of writes in one transaction (`SqliteConfig::max_group_size` is clamped
/// to it; the writer reserves room for a whole group).
const MAX_GROUP_SIZE: usize = 1 << 16;

/// How much of the database file a reader maps into memory.
const READER_MMAP_BYTES: i64 = 1 << 30;

fn open_reader(path: &Path, busy_timeout: Duration) -> Result<Connection, StoreError> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(backend)?;
    apply_common_pragmas(&conn, busy_timeout)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(backend)?;
    // Readers map the database file instead of copying each page through read(2): a snapshot
    // touches a few dozen scattered pages, and a page-cache miss per page dominated its cost.
    conn.pragma_update(None, "mmap_size", READER_MMAP_BYTES)
        .map_err(backend)?;
    conn.pragma_update(None, "cache_size", -8_192)
        .map_err(backend)?;
    Ok(conn)
}

impl SqliteDatabase {
    /// Open (creating if needed) and migrate the database, and start its writer thread.
    pub fn open(config: SqliteConfig) -> Result<Arc<Self>, StoreError> {
        // The writer appends to the WAL through flightlog's VFS, which writes each commit's
        // frames with one system call instead of two per page (see `flightlog-walvfs`).
        let vfs =
            flightlog_walvfs::register().map_err(|err| StoreError::Backend(err.to_string()))?;
        check_path_shape(&config.path)?;
        // Absolute, so a later change of the working folder moves nothing; links kept, so the
        // file at the path as given is the one watched (a link pointed elsewhere, or a file
        // moved over the link, is a lost file). The side files that coordinate processes go
        // beside the file itself (see `real_database_path`).
        let config = SqliteConfig {
            path: std::path::absolute(&config.path).unwrap_or(config.path),
            ..config
        };
        let real_path = real_database_path(&config.path);
        check_companions_writable(&real_path)?;
        check_existing_file(&config.path, config.busy_timeout)?;
        let mut conn = Connection::open_with_flags_and_vfs(
            &config.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            vfs,
        )
        .map_err(|err| cannot_open(&config.path, &err))?;
        // SQLite opens a file it may not write read-only, without a word; every write would
        // then fail (an HTTP 500 for each).
        if conn.is_readonly(rusqlite::MAIN_DB).map_err(backend)? {
            // A file system mounted read-only is not fixed by a chmod: say which it is.
            let read_only_mount = std::fs::OpenOptions::new()
                .write(true)
                .open(&config.path)
                .is_err_and(|err| err.kind() == std::io::ErrorKind::ReadOnlyFilesystem);
            return Err(StoreError::Backend(if read_only_mount {
                format!(
                    "{} is on a file system mounted read-only: flightlog writes to its \
                     database; choose a file on a writable file system (--db), or remount it \
                     read-write",
                    config.path.display()
                )
            } else {
                format!(
                    "{} is read-only: flightlog writes to its database; make it writable by \
                     the user the server runs as (chmod u+w if that user owns it, else chown \
                     it to that user), or choose another file",
                    config.path.display()
                )
            }));
        }
        apply_common_pragmas(&conn, config.busy_timeout)?;
        // Again on this connection, before anything writes: the read-only check above is
        // skipped for a path it cannot open.
        read_identity(&conn, &config.path)?;
        let mode = switch_to_wal(&conn, config.busy_timeout)
            .map_err(|err| unusable_file(&config.path, err))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Backend(format!(
                "could not switch {} to WAL mode (got {mode})",
                config.path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", config.durability.pragma_value())
            .map_err(backend)?;
        // The writer never checkpoints (a checkpoint fsyncs the database file, which would stall
        // every queued write behind it); a checkpointer thread does it on its own connection.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(backend)?;
        // After the pragma, which would replace it.
        conn.wal_hook(Some(record_wal_frames));
        conn.pragma_update(None, "cache_size", -16_384)
            .map_err(backend)?;
        // After a rewind the writer reuses the WAL file from its start and never truncates it:
        // the first commit after each rewind used to cut the file back to 32 MiB, and the cut
        // waited for the kernel's writeback of every page it dropped (about 90 ms of writer time
        // per 200,000 imported spans, 6% of the run). The checkpointer truncates a long WAL when
        // writes have gone quiet (see `Checkpointer::truncate_long_wal`).
        conn.pragma_update(None, "journal_size_limit", -1)
            .map_err(backend)?;
        schema::migrate(&mut conn)?;
        let codec = Arc::new(PayloadCodec::load(&conn)?);
        // From here on the writer never sleeps inside SQLite for the lock: `begin_immediate`
        // polls it and takes turns with other processes' writers (see `LockTurns`).
        conn.busy_timeout(Duration::ZERO).map_err(backend)?;
        let checkpoint_conn = open_reader(&config.path, config.busy_timeout)?;
        checkpoint_conn
            .pragma_update(None, "query_only", false)
            .map_err(backend)?;
        checkpoint_conn
            .pragma_update(None, "journal_size_limit", 32 * 1024 * 1024)
            .map_err(backend)?;

        let (queue, jobs) = mpsc::channel::<QueuedJob>(
            config
                .write_queue_capacity
                .clamp(1, MAX_WRITE_QUEUE_CAPACITY),
        );
        let stats = Arc::new(WriterStats::default());
        let newest_change: i64 = conn
            .query_row(
                "SELECT COALESCE(MAX(change_id), 0) FROM activity_changes",
                [],
                |row| row.get(0),
            )
            .map_err(backend)?;
        let (doorbell, _) = tokio::sync::watch::channel(newest_change);
        let journal_bells = Arc::new(JournalBells::default());
        let (nudge, nudges) = std::sync::mpsc::sync_channel::<()>(1);
        let rewind_wanted = Arc::new(AtomicBool::new(false));
        let rewinding = Arc::new(AtomicBool::new(false));
        let disk_failure = Arc::new(DiskFailure::new(&config.path));
        let opened_files = Arc::new(OpenedFiles::new(&config.path));
        let watcher = CommitWatcher {
            conn: open_reader(&config.path, config.busy_timeout)?,
            doorbell: doorbell.clone(),
            journal_bells: Arc::clone(&journal_bells),
            data_version: None,
            prunes: None,
            journal_writes: None,
        };
        let (watcher_alive, alive) = std::sync::mpsc::sync_channel::<()>(1);
        let watcher_thread = std::thread::Builder::new()
            .name("flightlog-watch".into())
            .spawn(move || watcher.run(alive))
            .map_err(|err| StoreError::Backend(format!("cannot start commit watcher: {err}")))?;
        let wal_room = Arc::new(WalRoom::default());
        let page_size: i64 = checkpoint_conn
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .map_err(backend)?;
        let checkpointer = Checkpointer {
            opened_files: Arc::clone(&opened_files),
            wal_room: Arc::clone(&wal_room),
            page_size: u64::try_from(page_size).unwrap_or(4096),
            conn: checkpoint_conn,
            stats: stats.clone(),
            data_version: None,
            rewind_wanted: Arc::clone(&rewind_wanted),
            // Beside the file itself: the path may be a symbolic link, and SQLite keeps its
            // `-wal` next to the file it resolves to.
            wal_path: wal_path_of(
                &std::fs::canonicalize(&config.path).unwrap_or_else(|_| config.path.clone()),
            ),
            busy_timeout: config.busy_timeout,
        };
        let checkpointer_thread = std::thread::Builder::new()
            .name("flightlog-ckpt".into())
            .spawn(move || checkpointer.run(nudges))
            .map_err(|err| StoreError::Backend(format!("cannot start checkpointer: {err}")))?;
        let stop_writer = Arc::new(AtomicBool::new(false));
        let shutting_down = Arc::new(AtomicBool::new(false));
        let writer = GroupCommitWriter {
            codec: Arc::clone(&codec),
            doorbell: doorbell.clone(),
            journal_bells: Arc::clone(&journal_bells),
            checkpoint_nudge: nudge,
            stats: stats.clone(),
            conn,
            keys: WriterCache {
                span_id_filter: SpanIdFilterState::new(config.path.clone(), config.busy_timeout),
                ..WriterCache::default()
            },
            data_version: None,
            max_group_size: config.max_group_size.clamp(1, MAX_GROUP_SIZE),
            lock_retry_budget: config.lock_retry_budget,
            rewind_wanted: Arc::clone(&rewind_wanted),
            turns: LockTurns::new(&real_path),
            restart_busy_timeout: config.busy_timeout.min(MAX_BUSY_TIMEOUT),
            rewinding: Arc::clone(&rewinding),
            disk_failure: Arc::clone(&disk_failure),
            next_rewind_attempt: None,
            rewind_backoff: UNDER_CAP_REWIND_WAIT,
            rewind_gate: RewindGate::new(&real_path),
            frames_at_last_nudge: 0,
            frames_after_last_commit: 0,
            wal_hard_cap_frames: config.wal_hard_cap_frames.clamp(256, 1 << 20),
            wal_room,
            stop: Arc::clone(&stop_writer),
            shutting_down: Arc::clone(&shutting_down),
            opened_files: Arc::clone(&opened_files),
            _watcher_alive: watcher_alive,
        };
        let writer_thread = std::thread::Builder::new()
            .name("flightlog-writer".into())
            .spawn(move || writer.run(jobs))
            .map_err(|err| StoreError::Backend(format!("cannot start writer thread: {err}")))?;
        let readers_rewind_gate = RewindGate::new(&real_path);
        Ok(Arc::new(Self {
            queue,
            readers: ReaderPool {
                path: config.path.clone(),
                busy_timeout: config.busy_timeout,
                idle: Mutex::new(Vec::new()),
            },
            codec,
            names: KeyNames::default(),
            change_log_retention: config.change_log_retention.max(0),
            change_log_trim_batch: config.change_log_trim_batch.max(1),
            doorbell,
            journal_bells,
            stats,
            stop_writer,
            shutting_down,
            threads: Mutex::new(Some([writer_thread, checkpointer_thread, watcher_thread])),
            file_identity: file_identity(&config.path),
            opened_files: Arc::clone(&opened_files),
            path: config.path,
            long_reads: tokio::sync::Semaphore::new(LONG_READS_AT_ONCE),
            short_reads: tokio::sync::Semaphore::new(SHORT_READS_AT_ONCE),
            rewinding,
            disk_failure,
            rewind_gate: readers_rewind_gate,
            rewind_wanted,
        }))
    }

    /// The process is stopping (its server stopped taking requests): from now on a write waits
    /// for another process's write lock at most [`SHUTDOWN_LOCK_WAIT`] in all, then fails as
    /// busy (the server answers `503` with `Retry-After`), so the requests in flight are answered
    /// within the server's grace period rather than cut off unanswered after it, as they were
    /// behind a lock held longer than that (the write lock wait is 10 s by default, the grace 5
    /// s). Writes go on as before otherwise; [`Self::close`] stops them.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Stop writing and leave the database file complete on its own: the writer finishes the
    /// group it is committing (writes still queued behind it fail with [`StoreError::Closed`],
    /// unacknowledged), the writer, checkpointer and commit watcher threads are joined, and a `TRUNCATE`
    /// checkpoint copies the whole WAL into the database file and empties it. After a clean
    /// stop, then, a copy of the database file alone holds everything acknowledged (without
    /// it the newest writes lived only in the `-wal` file, and the file alone could lack even
    /// the schema). Every later write fails with [`StoreError::Closed`].
    ///
    /// The checkpoint waits up to the busy timeout (at most 5 s) for other processes' readers;
    /// `Ok(false)` when it could not copy everything (a reader, a full disk: nothing is lost,
    /// the rest stays in the WAL, which SQLite reads on the next open). An error when the file
    /// at the path is no longer the one this process opened (deleted or replaced under it):
    /// nothing is checkpointed into another file. Closing twice does nothing the second time.
    pub async fn close(&self) -> Result<bool, StoreError> {
        let Some([writer, checkpointer, watcher]) =
            self.threads.lock().ok().and_then(|mut t| t.take())
        else {
            return Ok(true);
        };
        // A file deleted or replaced under the running process: checkpointing now would write
        // into someone else's file. Its `-wal` and `-shm` at the path are still this process's:
        // left there, SQLite replays that WAL into whatever file is at the path at the next
        // open (a backup moved over the file: "database disk image is malformed", found by a
        // reliability audit), so they are moved aside, kept for inspection. When only a link
        // on the way moved (the path given now names another file, the file opened is intact
        // at its real path), the file is closed as usual there, and the error says where
        // everything went.
        let path_moved =
            self.file_identity.is_some() && file_identity(&self.path) != self.file_identity;
        let real_intact = self.opened_files.real.look() == Look::Same;
        if path_moved && !real_intact {
            self.stop_writer.store(true, Ordering::Release);
            let _ = self.write(|_| Ok(())).await;
            // Deleted (not replaced): the file lives on only in this process's open descriptor,
            // and is saved beside the path once nothing writes it any more.
            let saved = if self.opened_files.real.look() == Look::Missing {
                let opened_files = Arc::clone(&self.opened_files);
                let (reply, answer) = oneshot::channel();
                std::thread::Builder::new()
                    .name("flightlog-close".into())
                    .spawn(move || {
                        let _ = writer.join();
                        let _ = checkpointer.join();
                        let _ = watcher.join();
                        let _ = reply.send(opened_files.save_deleted());
                    })
                    .map_err(|err| StoreError::Backend(format!("cannot start closing: {err}")))?;
                Some(answer.await.map_err(|_| StoreError::Closed)?)
            } else {
                None
            };
            let moved = self.opened_files.secure_if_lost(true).join(", ");
            let moved = if moved.is_empty() {
                moved
            } else {
                format!(
                    "; its own WAL files were moved aside so the next open does not replay them \
                     into that file: {moved}"
                )
            };
            let saved = match saved {
                None => String::new(),
                Some(Ok(saved)) => format!(
                    "; everything this process held was saved as {} (with its -wal beside it): \
                     move it back to {} to serve it again",
                    saved.display(),
                    self.path.display()
                ),
                Some(Err(why)) => format!("; what this process held could not be saved: {why}"),
            };
            return Err(StoreError::Backend(format!(
                "{} was deleted or replaced while this process had it open: nothing was \
                 written to the file now at that path{moved}{saved}",
                self.path.display()
            )));
        }
        self.stop_writer.store(true, Ordering::Release);
        // Wakes a writer waiting for work; refused (fine) when it has already stopped.
        let _ = self.write(|_| Ok(())).await;
        let path = self.opened_files.resolved.clone();
        let opened_files = Arc::clone(&self.opened_files);
        let busy_timeout = self.readers.busy_timeout.min(Duration::from_secs(5));
        if let Ok(mut idle) = self.readers.idle.lock() {
            idle.clear();
        }
        // Joining blocks, so on a thread of its own rather than the caller's async task.
        let (reply, answer) = oneshot::channel();
        let closing = move || -> Result<bool, StoreError> {
            // The writer's nudge sender goes with it, which ends the checkpointer, and so does
            // its sender that keeps the commit watcher going: no connection of theirs may hold
            // a read while the checkpoint below truncates the WAL.
            let _ = writer.join();
            let _ = checkpointer.join();
            let _ = watcher.join();
            // The joins may take seconds: a file replaced at its real path meanwhile must not
            // get this process's WAL checkpointed into it.
            if opened_files.real.look() != Look::Same {
                let moved = opened_files.secure_if_lost(true).join(", ");
                return Err(StoreError::Backend(format!(
                    "{} was replaced while this process was closing it: nothing was written to \
                     the file now at that path; its own WAL files were moved aside: {moved}",
                    path.display()
                )));
            }
            // A checkpoint that cannot run (a reader of another process, a full disk) only
            // leaves the newest writes in the WAL, where the next open finds them.
            let checkpointed = open_reader(&path, busy_timeout).ok().and_then(|conn| {
                conn.pragma_update(None, "query_only", false).ok()?;
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                    row.get::<_, i64>(0)
                })
                .ok()
            });
            Ok(checkpointed == Some(0))
        };
        std::thread::Builder::new()
            .name("flightlog-close".into())
            .spawn(move || {
                let _ = reply.send(closing());
            })
            .map_err(|err| StoreError::Backend(format!("cannot start closing: {err}")))?;
        let closed = answer.await.map_err(|_| StoreError::Closed)??;
        if path_moved {
            let real = self.opened_files.resolved.display();
            let where_it_is = if closed {
                format!("everything this process wrote is in {real}, closed as usual")
            } else {
                // As a stop that cannot checkpoint says: the newest writes are in the WAL.
                format!(
                    "everything this process wrote is in {real} and, the newest writes, in \
                     {real}-wal (another process was reading, or the disk is full): copy both \
                     files for a backup"
                )
            };
            return Err(StoreError::Backend(format!(
                "{} no longer names the database file this process opened (a symbolic link on \
                 the way was pointed elsewhere): nothing was written to the file it names now; \
                 {where_it_is}",
                self.path.display()
            )));
        }
        Ok(closed)
    }

    /// `Err(StoreError::FileLost)` when the path no longer names the database file this process
    /// opened (deleted, or replaced by another file): nothing written from then on could be read
    /// at the path, and the writer refuses every write. One `stat`: cheap enough for a health
    /// check.
    pub fn check_file(&self) -> Result<(), StoreError> {
        self.opened_files.check_secured()?;
        self.disk_failure.check()
    }

    /// What the writer thread has done so far.
    pub fn writer_stats(&self) -> &WriterStats {
        &self.stats
    }

    /// The writer's work, its queue and the file sizes, as `/metrics` samples (the activity
    /// store and the journal share this database, so these cover both). Only atomic loads and
    /// two `stat` calls: cheap enough for every scrape.
    pub fn backend_metrics(&self) -> Vec<BackendMetric> {
        let stats = &self.stats;
        let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
        let seconds = |nanos: &AtomicU64| nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let queued = self.queue.max_capacity() - self.queue.capacity();
        let mut metrics = vec![
            BackendMetric::counter(
                "flightlog_sqlite_writer_transactions",
                "Transactions (group commits) the writer thread ran; writes / transactions is \
                 the average group size",
                count(&stats.groups),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_writer_writes",
                "Write jobs the writer thread took (one per single write, batch, import or \
                 maintenance step, those the store refused, such as a duplicate span, included)",
                count(&stats.writes),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_writer_apply_seconds",
                "Time the writer thread spent running writes' statements",
                seconds(&stats.apply_nanos),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_writer_commit_seconds",
                "Time the writer thread spent in BEGIN and COMMIT; with the apply time, how \
                 busy the one serial resource of the SQLite backend is",
                seconds(&stats.commit_nanos),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_wal_frames",
                "WAL frames (pages) the writer's commits appended",
                count(&stats.wal_frames),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_wal_rewinds",
                "WAL rewinds (RESTART checkpoints) the writer thread ran between groups",
                count(&stats.writer_rewinds),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_wal_rewind_seconds",
                "Time the writer thread spent in WAL rewinds (no write commits meanwhile)",
                seconds(&stats.writer_rewind_nanos),
            ),
            BackendMetric::counter(
                "flightlog_sqlite_checkpoint_seconds",
                "Time spent checkpointing the WAL into the database file (checkpointer passes \
                 and the writer's rewinds)",
                seconds(&stats.checkpoint_nanos),
            ),
            BackendMetric::gauge(
                "flightlog_sqlite_write_queue_depth",
                "Write jobs waiting for the writer thread now",
                queued as f64,
            ),
            BackendMetric::gauge(
                "flightlog_sqlite_write_queue_capacity",
                "The most write jobs that may wait; past it a write waits for room (the HTTP \
                 write limit, smaller by default, answers 503 before the queue fills)",
                self.queue.max_capacity() as f64,
            ),
        ];
        // A file that cannot be read leaves its size out rather than reporting a wrong one.
        for (name, help, path) in [
            (
                "flightlog_sqlite_database_bytes",
                "Size of the database file",
                self.path.clone(),
            ),
            (
                "flightlog_sqlite_wal_bytes",
                "Size of the WAL file beside it (kept at its high-water mark under load; once \
                 writes go quiet, a WAL over 32 MiB is cut back, a smaller one kept for reuse)",
                wal_path_of(&self.path),
            ),
        ] {
            if let Ok(meta) = std::fs::metadata(&path) {
                metrics.push(BackendMetric::gauge(name, help, meta.len() as f64));
            }
        }
        metrics
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Queue a write and wait until its group committed. Waits (asynchronously) while the queue
    /// is full. `work` may run twice (see `apply_group`), so it must not consume its inputs.
    pub(crate) async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteContext<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.write_then(work, None).await
    }

    /// [`Self::write`] for a single activity write (a span's start, end or patch, an event):
    /// its change rows may be held back and written with those of the other such writes of its
    /// group, 16 to an `INSERT` (see [`GroupCommitWriter::apply_group`]). `work` must read
    /// `activity_changes` only through the writer's caches (`log_change`'s cached seq and
    /// change id), as those writes do; were it not to, a unique index refusing a row would
    /// only send the group to its replay, where every row is written at once.
    pub(crate) async fn write_deferring_changes<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteContext<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.queue_job(work, None, true).await
    }

    /// [`Self::write`], plus `after_commit`, run on the writer thread once the write committed
    /// successfully and before the caller is answered. Writes commit in queue order and their
    /// `after_commit`s run in that same order, so a publisher called from there emits committed
    /// changes in commit order: persist, then emit.
    pub(crate) async fn write_then<T, F>(
        &self,
        work: F,
        after_commit: Option<AfterCommit<T>>,
    ) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteContext<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        self.queue_job(work, after_commit, false).await
    }

    async fn queue_job<T, F>(
        &self,
        work: F,
        after_commit: Option<AfterCommit<T>>,
        defers_changes: bool,
    ) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteContext<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: QueuedJob = Box::new(TypedJob {
            work,
            outcome: None,
            after_commit,
            reply,
            defers_changes,
        });
        self.queue.send(job).await.map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// The same as [`Self::write`], for a thread that is not running async code.
    pub(crate) fn write_blocking<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: FnMut(&mut WriteContext<'_>) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: QueuedJob = Box::new(TypedJob {
            work,
            outcome: None,
            after_commit: None,
            reply,
            defers_changes: false,
        });
        self.queue
            .blocking_send(job)
            .map_err(|_| StoreError::Closed)?;
        answer.blocking_recv().map_err(|_| StoreError::Closed)?
    }

    /// A receiver that moves to the newest committed change id.
    pub fn change_doorbell(&self) -> tokio::sync::watch::Receiver<i64> {
        self.doorbell.subscribe()
    }

    /// The commit doorbell of the journal handle of `carrier` (see `journal_bells`): it moves
    /// when the commit watcher sees, within its period, that a commit by any connection (another
    /// process's included) wrote to the journal, other than with appends that handle carried.
    pub(crate) fn journal_doorbell(&self, carrier: u64) -> tokio::sync::watch::Receiver<u64> {
        self.journal_bells.subscribe(carrier)
    }

    /// How far behind the newest change `prune` trims the change log.
    pub(crate) fn change_log_retention(&self) -> i64 {
        self.change_log_retention
    }

    /// The most change rows one `prune` trims.
    pub(crate) fn change_log_trim_batch(&self) -> i64 {
        self.change_log_trim_batch
    }

    /// Run ids and writer names by key.
    pub(crate) fn names(&self) -> &KeyNames {
        &self.names
    }

    /// The event payload codec of this database.
    pub(crate) fn codec(&self) -> &PayloadCodec {
        &self.codec
    }

    /// Hand payload samples to a training thread once enough were collected. Training, storing
    /// the dictionary and switching to it all happen off the caller's path.
    pub(crate) fn maybe_train_payload_dictionary(self: &Arc<Self>, now: i64) {
        let Some(samples) = self.codec.take_training_samples() else {
            return;
        };
        let db = self.clone();
        let spawned = std::thread::Builder::new()
            .name("flightlog-dict".into())
            .spawn(move || {
                let Some(bytes) = PayloadCodec::train(&samples) else {
                    db.codec.training_failed();
                    return;
                };
                let stored = bytes.clone();
                let id = db.write_blocking(move |ctx| {
                    ctx.conn
                        .prepare_cached(
                            "INSERT INTO payload_dictionaries (created_at, dictionary) \
                             VALUES (?1, ?2)",
                        )
                        .and_then(|mut stmt| stmt.execute(rusqlite::params![now, stored]))
                        .map_err(backend)?;
                    Ok(ctx.conn.last_insert_rowid())
                });
                match id {
                    Ok(id) => db.codec.install(Arc::new(Dictionary { id, bytes })),
                    Err(_) => db.codec.training_failed(),
                }
            });
        if spawned.is_err() {
            self.codec.training_failed();
        }
    }

    /// Run a read on a pooled reader connection.
    pub(crate) fn read<T>(
        &self,
        work: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.readers.take()?;
        let result = work(&conn).map_err(|err| self.disk_failure.explain(err));
        // A connection left inside a transaction by a failed read must not be reused.
        if conn.is_autocommit() {
            self.readers.give_back(conn);
        }
        result
    }

    /// Run a read that may take long (a listing, a run's snapshot, a scan of the change log)
    /// so that it never holds up the other tasks of the caller's tokio runtime: with one
    /// worker per core, two such reads on the workers stalled every other request (`/healthz`
    /// p50 106 ms while four clients listed runs). On a multi-thread runtime the read runs in
    /// `block_in_place`: the worker's other tasks move to another thread while this one reads,
    /// and the rows stay on the thread that goes on to serialize them (a `spawn_blocking`
    /// hand-off made pages of 10,000 changes a third slower: built on one thread, freed on
    /// another). At most [`LONG_READS_AT_ONCE`] run at once; the rest wait without blocking.
    /// Elsewhere (a current-thread runtime, no runtime) the read runs as it is. Point reads do
    /// not come here: a hand-off costs more than they do.
    pub(crate) async fn read_apart<T>(
        self: &Arc<Self>,
        work: impl FnOnce(&SqliteDatabase, &Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.read_apart_on(&self.long_reads, work).await
    }

    /// [`Self::read_apart`] for a read whose work a small limit bounds (a page of the newest
    /// runs: a few milliseconds, too long for a runtime worker), on
    /// [`SHORT_READS_AT_ONCE`] places of its own: it never queues behind long reads. With
    /// twelve clients looping on long reads, the 50 newest runs took 190 ms (p50) waiting for
    /// a long read's place.
    pub(crate) async fn read_apart_short<T>(
        self: &Arc<Self>,
        work: impl FnOnce(&SqliteDatabase, &Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.read_apart_on(&self.short_reads, work).await
    }

    async fn read_apart_on<T>(
        self: &Arc<Self>,
        places: &tokio::sync::Semaphore,
        work: impl FnOnce(&SqliteDatabase, &Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let multi_thread = tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
            runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
        });
        if !multi_thread {
            return self.read(|conn| work(self, conn));
        }
        let _permit = places.acquire().await.map_err(|_| StoreError::Closed)?;
        tokio::task::block_in_place(|| {
            self.wait_for_rewind();
            self.read(|conn| work(self, conn))
        })
    }

    /// While the writer's WAL rewind waits for readers to finish, a long read does not start
    /// (it would make the rewind, and every write behind it, wait for it too). Called on a
    /// thread that may block; bounded by [`LONGEST_WAIT_FOR_REWIND`].
    fn wait_for_rewind(&self) {
        let started = Instant::now();
        while self.rewinding.load(Ordering::Acquire) && started.elapsed() < LONGEST_WAIT_FOR_REWIND
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Another process's writer (or another handle's in this one) may be rewinding too.
        self.rewind_gate
            .wait_open(LONGEST_WAIT_FOR_REWIND.saturating_sub(started.elapsed()));
    }

    /// Wait until every write queued before this call has committed.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.write(|_| Ok(())).await
    }
}

/// Run `work` inside one read transaction, so every query sees the same committed state.
pub(crate) fn in_read_transaction<T>(
    conn: &Connection,
    work: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    execute_cached(conn, "BEGIN DEFERRED")?;
    let result = work(conn);
    let end = execute_cached(conn, "COMMIT");
    let value = result?;
    end?;
    Ok(value)
}

/// The database's background housekeeper, on its own connection:
/// - copies committed WAL frames into the database file (`PASSIVE`: never waits for, or blocks,
///   readers and the writer), when nudged by the writer every few commits and on a timer;
/// - looks whether the database file is still the one opened (see [`OpenedFiles`]).
///
/// It ends when the writer is gone.
struct Checkpointer {
    /// The database file as opened and its `-wal`/`-shm`, looked at every period.
    opened_files: Arc<OpenedFiles>,
    conn: Connection,
    stats: Arc<WriterStats>,
    /// `PRAGMA data_version` at the last look: whether anyone committed since (the commit
    /// watcher tells the readers; this only says whether writes have gone quiet).
    data_version: Option<i64>,
    /// Set when the WAL is long and a `RESTART` from here could not rewind it (see
    /// [`GroupCommitWriter::rewind_wal_if_asked`]).
    rewind_wanted: Arc<AtomicBool>,
    /// The `-wal` file, whose length a quiet pass checks (see `truncate_long_wal`).
    wal_path: PathBuf,
    /// The WAL's share of the disk's room, measured here once a period (see `wal_room`).
    wal_room: Arc<WalRoom>,
    /// The database's page size: a WAL frame holds one page.
    page_size: u64,
    /// The connection's busy timeout, restored after a truncation that must not wait.
    busy_timeout: Duration,
}

impl Checkpointer {
    /// How often it looks for foreign commits (and checkpoints if nudged less often).
    const PERIOD: Duration = Duration::from_millis(100);
    /// Timer-driven checkpoints happen every this many periods.
    const PERIODS_PER_CHECKPOINT: u32 = 5;

    /// Whether another connection (this process's writer or another process) committed since
    /// the last look (or whether that is unknown).
    fn anyone_committed(&mut self) -> bool {
        let Ok(version) = data_version(&self.conn) else {
            return true;
        };
        self.data_version.replace(version) != Some(version)
    }

    /// WAL frames (pages) beyond which a checkpoint also rewinds the WAL. Each rewind stalls the
    /// writer for one `RESTART` (two fsyncs; 18 - 24 ms measured under OTLP ingest), so this is
    /// a trade of WAL size (64 MiB of frames at most before a rewind is asked) against writer
    /// time: 4,096 frames cost the writer 10% of an import run, 16,384 cost 4%.
    const WAL_RESTART_FRAMES: i64 = 16_384;
    /// Extra passes a checkpoint makes before asking for a rewind (see `checkpoint`).
    const MAX_CATCH_UP_PASSES: u32 = 8;
    /// New frames few enough for the writer's `RESTART` to copy and sync itself (2 MiB).
    const FEW_FRAMES: i64 = 512;
    /// The WAL file length past which a quiet pass truncates it (see `truncate_long_wal`).
    const QUIET_WAL_BYTES: u64 = 32 * 1024 * 1024;

    /// Copy the WAL into the database file. A passive checkpoint never blocks anyone, but under
    /// sustained writes the WAL never becomes fully checkpointed at the moment a write begins, so
    /// SQLite never rewinds it and the file grows without bound. Past a size, the checkpointer
    /// asks the writer to rewind it (a `RESTART` between two groups, when the writer holds no
    /// transaction and this pass has already copied nearly everything) and starts no new pass
    /// until that is done. The rewound file is reused from its start, not truncated (see
    /// `truncate_long_wal`).
    fn checkpoint(&self) {
        // While a rewind is pending, stay out of the writer's way: a checkpoint here would hold
        // the checkpoint lock and make the writer's `RESTART` fail as busy.
        if self.rewind_wanted.load(Ordering::Acquire) {
            return;
        }
        // A failed checkpoint only means the WAL stays longer; the next one retries.
        let Some(mut frames) = self.passive_checkpoint() else {
            return;
        };
        if frames <= Self::WAL_RESTART_FRAMES.min(self.wal_room.frames() / 2) {
            return;
        }
        // The writer's `RESTART` copies and syncs whatever this pass did not: the frames
        // committed while it ran, thousands under sustained ingest (a rewind then stalled every
        // write for 20 - 30 ms). Catch up here, off the writer's path, until a pass finds only a
        // few new frames (each pass is shorter than the one before while copying outpaces
        // writing; the pass count bounds it when it does not).
        for _ in 0..Self::MAX_CATCH_UP_PASSES {
            // The writer reached its hard cap and asked for the rewind itself: it is waiting
            // for the checkpoint lock these passes hold.
            if self.rewind_wanted.load(Ordering::Acquire) {
                return;
            }
            let Some(now) = self.passive_checkpoint() else {
                return;
            };
            let written_meanwhile = now - frames;
            frames = now;
            if written_meanwhile <= Self::FEW_FRAMES {
                break;
            }
        }
        // The writer's `RESTART` ends with a sync of the database file, and under load it is
        // the first for a while: a pass syncs the file only when it copied the whole WAL, which
        // a writer always mid-transaction seldom lets it do, so the file held tens of MB not yet
        // synced (measured: 17 ms a rewind, 90% of its time). Sync it here, off the writer's path,
        // so the `RESTART` syncs only what it copies itself. Through SQLite's own handle: a
        // descriptor of our own would drop the process's locks on the file when closed.
        // A failed sync only leaves the work to the `RESTART`'s own sync, which reports it.
        let _ = flightlog_walvfs::sync_database_file(&self.conn);
        // Rewinding is the writer's job: a `RESTART` here would wait for the write lock while
        // holding the checkpoint lock, so under back-to-back commits it neither got in nor let
        // the writer rewind (measured: 766 MB of WAL after 200,000 imported spans).
        self.rewind_wanted.store(true, Ordering::Release);
    }

    /// Once no connection has committed for [`Self::PERIODS_PER_CHECKPOINT`] periods (writes
    /// have gone quiet, in this process and in any other), cut a WAL file longer than
    /// [`Self::QUIET_WAL_BYTES`] back to nothing: the writer
    /// reuses the file after each rewind and never shrinks it, so after a burst of ingest it
    /// would keep its high-water size (up to ~100 MiB) for good. A `TRUNCATE` checkpoint needs
    /// the write lock and a WAL no reader uses; it is tried without waiting, so a writer or
    /// reader that is busy after all is never held up, and the next quiet pass tries again.
    ///
    /// A truncation rewinds the WAL as well, so it also settles a rewind the writer was asked for
    /// but never got to: it rewinds between groups, and after the last group of a burst there
    /// is none (the request then stayed pending, and with it every checkpoint, until the next
    /// write).
    fn truncate_long_wal(&self) {
        // On a disk with little room, a quarter of the WAL's share of it.
        let room_bytes = u64::try_from(self.wal_room.frames())
            .unwrap_or(0)
            .saturating_mul(self.page_size);
        let quiet_len = Self::QUIET_WAL_BYTES.min(room_bytes / 4);
        let long = std::fs::metadata(&self.wal_path).is_ok_and(|meta| meta.len() > quiet_len);
        if !long || self.conn.busy_timeout(Duration::ZERO).is_err() {
            return;
        }
        // Busy or failed: the WAL stays long until the next quiet pass.
        let truncated = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                row.get::<_, i64>(0)
            })
            .is_ok_and(|busy| busy == 0);
        if truncated {
            self.rewind_wanted.store(false, Ordering::Release);
        }
        let _ = self.conn.busy_timeout(self.busy_timeout);
    }

    /// The `-wal` was found deleted or replaced (see [`OpenedFiles::wal_newly_lost`]): a file put
    /// in its place is moved aside, what the log holds is copied into the database file
    /// (through this connection's descriptor of the deleted log), writes are refused, and what
    /// was committed meanwhile is copied too before `/healthz` says so
    /// ([`OpenedFiles::secure_refused_wal`]; the writer does the same before it answers its
    /// first refused group): a supervisor that kills the server at the first 503 finds every
    /// acknowledged write in the file (refused first, an audit lost 368 of 368 that way).
    fn secure_lost_wal(&self) {
        self.opened_files.move_replaced_wal_aside();
        let _ = self.passive_checkpoint();
        self.opened_files.refuse_writes_for_lost_wal();
        self.opened_files.secure_refused_wal(&self.conn);
    }

    /// One `PASSIVE` checkpoint: the WAL's length in frames when it began, or `None` when it
    /// failed.
    fn passive_checkpoint(&self) -> Option<i64> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                row.get::<_, i64>(1)
            })
            .ok()
    }

    fn run(mut self, nudges: std::sync::mpsc::Receiver<()>) {
        // Periods since the last checkpoint pass (a nudge makes the next look a pass).
        let mut quiet_periods = 0u32;
        // Looks in a row at which nobody, in this process or another, had committed.
        let mut idle_looks = 0u32;
        loop {
            let last = match nudges.recv_timeout(Self::PERIOD) {
                Ok(()) => {
                    quiet_periods = Self::PERIODS_PER_CHECKPOINT;
                    false
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    quiet_periods += 1;
                    false
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => true,
            };
            // One `stat` a period: a file replaced under the process gets its WAL out of the
            // replacement's way at once, not only at a clean stop (a crash would leave it).
            self.opened_files.secure_if_lost(false);
            // And one for the `-wal` (see `secure_lost_wal`).
            if self.opened_files.wal_newly_lost() {
                self.secure_lost_wal();
            }
            // And a `statvfs`: how long the WAL may grow on its disk.
            self.wal_room.measure(&self.wal_path, self.page_size);
            idle_looks = if self.anyone_committed() {
                0
            } else {
                idle_looks.saturating_add(1)
            };
            let started = Instant::now();
            if quiet_periods >= Self::PERIODS_PER_CHECKPOINT || last {
                quiet_periods = 0;
                self.checkpoint();
            }
            // Only when nobody has committed for a while: a `TRUNCATE` holds the write lock
            // while it runs, and another process writing the same file must not be stalled by
            // it every few periods.
            if idle_looks >= Self::PERIODS_PER_CHECKPOINT && !last {
                self.truncate_long_wal();
            }
            let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.stats
                .checkpoint_nanos
                .fetch_add(nanos, Ordering::Relaxed);
            if last {
                return;
            }
        }
    }
}

/// `PRAGMA data_version` of `conn`: it moves when another connection commits to the file.
fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)))
}

/// Notices commits by other processes (`PRAGMA data_version` moved) and rings the change
/// doorbell with the newest change id (without moving it after a prune, which logs no change
/// but which a run stream must see: `flightlog_meta.activity_prunes` counts them), and the
/// commit doorbell when the commits wrote to the journal (`flightlog_meta.journal_writes`, moved
/// once by every group that did, counts them), so live readers see foreign writes (and the
/// journal's rewrites) within [`CommitWatcher::PERIOD`]. The journal's doorbell rang for every
/// commit, activity writes included, and the engagement streams' hub read the head of every
/// engagement it followed at each ring (at most 25 a second): 3,000 idle engagement streams cost
/// a quarter of a core while only activity was written (an audit's finding). A writer of an
/// earlier flightlog, which does not move the count, is seen by a stream at its periodic
/// recheck instead. On a thread and a
/// connection of its own: done between the checkpointer's passes, a stream reading another
/// process's writes waited behind each checkpoint (which copies every frame that process wrote):
/// p99 225 ms and up to 420 ms from a commit on one server to a stream on another, at 6,000 to
/// 43,000 writes/s (a multi-process audit), against 250 ms promised.
struct CommitWatcher {
    conn: Connection,
    doorbell: tokio::sync::watch::Sender<i64>,
    journal_bells: Arc<JournalBells>,
    data_version: Option<i64>,
    /// `flightlog_meta.activity_prunes` at the last look.
    prunes: Option<i64>,
    /// `flightlog_meta.journal_writes` at the last look.
    journal_writes: Option<i64>,
}

impl CommitWatcher {
    /// How often it looks: one `PRAGMA` on a page already cached, about 20 us.
    const PERIOD: Duration = Duration::from_millis(40);

    /// Looks every period until the writer is gone (its end drops the sender of `alive`).
    fn run(mut self, alive: std::sync::mpsc::Receiver<()>) {
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = alive.recv_timeout(Self::PERIOD)
        {
            self.watch_commits();
        }
    }

    /// Ring the doorbells if another connection (this process's writer or another process)
    /// committed since the last look.
    fn watch_commits(&mut self) {
        let Ok(version) = data_version(&self.conn) else {
            return;
        };
        if self.data_version.replace(version) == Some(version) {
            return;
        }
        let looked = self
            .conn
            .prepare_cached(
                "SELECT COALESCE(MAX(change_id), 0), \
                 (SELECT value FROM flightlog_meta WHERE name = 'activity_prunes'), \
                 (SELECT value FROM flightlog_meta WHERE name = 'journal_writes') \
                 FROM activity_changes",
            )
            .and_then(|mut stmt| {
                stmt.query_row([], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, Option<i64>>(1)?,
                        row.get::<_, Option<i64>>(2)?,
                    ))
                })
            });
        match &looked {
            Ok((_, _, journal_writes)) => {
                let count = journal_writes.unwrap_or(0);
                let before = self.journal_writes.replace(count);
                if before != Some(count) {
                    self.journal_bells.moved(before, count);
                }
            }
            // A failed look rings, as one that cannot tell what was written.
            Err(_) => self.journal_bells.ring_all(),
        }
        if let Ok((newest, prunes, _)) = looked {
            // The first look only learns the count.
            let prunes = prunes.unwrap_or(0);
            let pruned = self
                .prunes
                .replace(prunes)
                .is_some_and(|before| before != prunes);
            self.doorbell.send_if_modified(|current| {
                let moved = newest > *current;
                if moved {
                    *current = newest;
                }
                moved || pruned
            });
        }
    }
}

struct GroupCommitWriter {
    /// The database's payload codec: writes that merge into packed attrs unpack and pack them.
    codec: Arc<PayloadCodec>,
    doorbell: tokio::sync::watch::Sender<i64>,
    /// Told of each committed group whose journal writes one handle's subscription carried.
    journal_bells: Arc<JournalBells>,
    /// Wakes the checkpointer; full means it already has a wake-up pending.
    checkpoint_nudge: std::sync::mpsc::SyncSender<()>,
    stats: Arc<WriterStats>,
    conn: Connection,
    keys: WriterCache,
    /// `PRAGMA data_version` after our last transaction: a change means another connection wrote.
    data_version: Option<i64>,
    max_group_size: usize,
    lock_retry_budget: Duration,
    /// Set by the checkpointer when the WAL needs rewinding and it could not do it itself.
    rewind_wanted: Arc<AtomicBool>,
    /// Taking turns at the write lock with writers of other processes.
    turns: LockTurns,
    /// How long a `RESTART` may wait for readers (the configured busy timeout).
    restart_busy_timeout: Duration,
    /// Set while this writer's `RESTART` waits for readers: long reads do not start meanwhile
    /// (see [`SqliteDatabase::read_apart`]), so the wait is for those already running only.
    rewinding: Arc<AtomicBool>,
    /// Told of each group's disk failure, and of the next commit (see [`DiskFailure`]).
    disk_failure: Arc<DiskFailure>,
    /// No rewind is tried again before this (after one that found readers).
    next_rewind_attempt: Option<Instant>,
    /// The pause after the next attempt that finds readers (see [`LONGEST_REWIND_BACKOFF`]).
    rewind_backoff: Duration,
    /// The writer's side of the gate that holds other processes' long reads back while it
    /// rewinds (see [`RewindGate`]).
    rewind_gate: RewindGate,
    /// The WAL's frame count when the checkpointer was last nudged.
    frames_at_last_nudge: i64,
    /// The WAL's frame count after the previous commit.
    frames_after_last_commit: i64,
    /// `SqliteConfig::wal_hard_cap_frames`, clamped.
    wal_hard_cap_frames: i64,
    /// The WAL's share of the disk's room (see `wal_room`): the hard cap and the nudges come
    /// sooner on a disk with little free space.
    wal_room: Arc<WalRoom>,
    /// Set by [`SqliteDatabase::close`]: stop after the current group.
    stop: Arc<AtomicBool>,
    /// Set by [`SqliteDatabase::shutting_down`] (see there).
    shutting_down: Arc<AtomicBool>,
    /// Never sent on: dropped with the writer, which ends the commit watcher.
    _watcher_alive: std::sync::mpsc::SyncSender<()>,
    /// The database file and its `-wal` as opened, checked before every commit (see
    /// [`OpenedFiles::check`]).
    opened_files: Arc<OpenedFiles>,
}

/// The database file's path and its identity (device and inode) when this process opened it.
///
/// A file deleted or replaced (a backup moved over it) under a running process is not noticed
/// by SQLite: the process's connections keep the old inode open, every write commits into it and
/// is acknowledged, and all of it is gone at the next start (a reliability audit lost every
/// write acknowledged after an `rm`). The writer checks the path before each commit (one `stat`
/// a group) and from then on refuses every write with [`StoreError::FileLost`]; `/healthz` asks
/// too.
#[derive(Debug, Clone)]
pub(crate) struct WatchedFile {
    path: PathBuf,
    identity: Option<(u64, u64)>,
}

/// What a look at the database file's path finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// The file this process opened (or no identity to compare: not a Unix platform).
    Same,
    /// Another file (a backup moved over it, the file re-created).
    Replaced,
    /// No file at the path.
    Missing,
    /// The look failed otherwise (a network file system's stale handle, an I/O error): nothing
    /// is concluded from it.
    Unknown,
}

impl WatchedFile {
    fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            identity: file_identity(path),
        }
    }

    fn look(&self) -> Look {
        if self.identity.is_none() {
            return Look::Same;
        }
        // One `stat` a commit (it was two: the identity was read again).
        match std::fs::metadata(&self.path) {
            Ok(meta) if identity_of(&meta) == self.identity => Look::Same,
            Ok(_) => Look::Replaced,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Look::Missing,
            Err(_) => Look::Unknown,
        }
    }

    /// `Err(FileLost)` when the path names another file than the one this process opened, or
    /// none.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match self.look() {
            Look::Same | Look::Unknown => Ok(()),
            Look::Replaced => Err(StoreError::FileLost(format!(
                "the database file {} was deleted or replaced while this process had it open (a \
                 file now at that path is another one): restart the server to serve the file \
                 now at the path",
                self.path.display()
            ))),
            // "Restart the server" lost everything: the file lived on only in this process's
            // open descriptor, and a restart opened a new, empty one (an audit's finding).
            Look::Missing => Err(StoreError::FileLost(format!(
                "the database file {} was deleted or replaced while this process had it open (no \
                 file is at that path now): stop the server (Ctrl-C or SIGTERM), which saves \
                 everything it holds as {}.recovered-<time> with its -wal; move those back to \
                 serve it again (a restart before the stop starts an empty database)",
                self.path.display(),
                self.path.display()
            ))),
        }
    }
}

/// The database file as this process opened it, and the identities of its `-wal` and `-shm`
/// then. When the path comes to name another file (a backup moved over it), those two files at
/// the path are still this process's, and SQLite would replay that WAL into the new file at its
/// next open: "database disk image is malformed" (a reliability audit). Once the database file
/// is lost they are moved aside (`<name>.replaced-<unix nanoseconds>`, kept for inspection), by
/// the checkpointer within a period (two, for a file gone from the path: a tool that renames the
/// file away and back must not lose this process its WAL) and at the latest by `close`. A look
/// that fails otherwise moves nothing. The `-wal` and `-shm` are looked for where SQLite keeps
/// them: beside the file the path resolves to (the path may be a symbolic link).
pub(crate) struct OpenedFiles {
    database: WatchedFile,
    /// The same file at its real path (links resolved at open): whether the file itself, with
    /// which its `-wal` and `-shm` go, is still there.
    real: WatchedFile,
    /// The path with every symbolic link resolved, at open: SQLite keeps `-wal` and `-shm`
    /// beside the file itself.
    resolved: PathBuf,
    /// Looks in a row that found no file at the path.
    missing_looks: std::sync::atomic::AtomicU32,
    companions: [Option<(u64, u64)>; 2],
    /// What was moved aside, for `close` to say.
    moved: Mutex<Vec<String>>,
    /// The `-wal` as this process opened it (see [`OpenedFiles::wal_newly_lost`]).
    wal: WatchedFile,
    /// Set, for good, once the `-wal` was found deleted or replaced while the file itself was
    /// still there: every write is refused from then on.
    wal_lost: AtomicBool,
    /// Set once, after `wal_lost`, a checkpoint has copied into the database file every write
    /// committed before the refusals began; from then on `/healthz` says so (see
    /// [`SqliteDatabase::check_file`]).
    wal_secured: AtomicBool,
    /// Held while one thread copies the lost log (the writer and the checkpointer may both try;
    /// a second checkpoint at once would find the checkpoint lock busy and copy nothing).
    wal_securing: Mutex<()>,
}

impl OpenedFiles {
    fn new(path: &Path) -> Self {
        let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        Self {
            database: WatchedFile::new(path),
            real: WatchedFile::new(&resolved),
            companions: COMPANION_SUFFIXES
                .map(|suffix| file_identity(&companion_path(&resolved, suffix))),
            wal: WatchedFile::new(&companion_path(&resolved, "-wal")),
            wal_lost: AtomicBool::new(false),
            wal_secured: AtomicBool::new(false),
            wal_securing: Mutex::new(()),
            resolved,
            missing_looks: std::sync::atomic::AtomicU32::new(0),
            moved: Mutex::new(Vec::new()),
        }
    }

    /// Whether writes may go on: `Err(FileLost)` when the database file is no longer at its
    /// path (see [`WatchedFile`]) or its `-wal` was lost (see [`Self::wal_newly_lost`]). One
    /// `stat` and one atomic load: the writer asks before every commit.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        self.check_with(&self.wal_lost)
    }

    /// [`Self::check`] as `/healthz` asks: a lost `-wal` is said once what it held is in the
    /// database file, so a supervisor that stops the server at the first 503 loses nothing.
    fn check_secured(&self) -> Result<(), StoreError> {
        self.check_with(&self.wal_secured)
    }

    fn check_with(&self, wal_flag: &AtomicBool) -> Result<(), StoreError> {
        self.database.check()?;
        if wal_flag.load(Ordering::Acquire) {
            return Err(StoreError::FileLost(format!(
                "the write-ahead log {} was deleted or replaced while this process had it open: \
                 SQLite writes on into the deleted file, which a crash would lose, so no write is \
                 taken any more. Stop the server cleanly (Ctrl-C or SIGTERM), which copies what \
                 it holds into the database file, and start it again (the start makes a new log)",
                self.wal.path.display()
            )));
        }
        Ok(())
    }

    /// Whether the `-wal` this process opened is, newly, no longer at its path while the
    /// database file still is (an `rm` of it, a cleanup script, a copy put back over it):
    /// SQLite keeps writing the deleted file through its open descriptors, so every write
    /// acknowledged from then on, and every one not yet copied into the database file, would be
    /// gone after a crash (an audit lost 4 of 5 acknowledged spans that way, `/healthz` saying
    /// ok); and a file put in its place would be replayed over the database file at the next
    /// open. `true` once, when this look finds it (and nothing is refused yet: the caller
    /// secures the log first, see `Checkpointer::secure_lost_wal`). A database file itself lost
    /// is [`Self::secure_if_lost`]'s, which moves the `-wal` away on purpose.
    fn wal_newly_lost(&self) -> bool {
        if self.wal_lost.load(Ordering::Acquire) || self.real.look() != Look::Same {
            return false;
        }
        matches!(self.wal.look(), Look::Missing | Look::Replaced)
    }

    /// From now on every write is refused (see [`Self::check`]).
    fn refuse_writes_for_lost_wal(&self) {
        self.wal_lost.store(true, Ordering::Release);
    }

    /// Once writes are refused for a lost `-wal`, copy what the log holds into the database file
    /// through `conn` (a connection of this process, out of any transaction), unless done
    /// already, and let `/healthz` say so. The writer calls it before it answers its first
    /// refused group, the checkpointer after its own copy: whichever comes first, nothing is
    /// refused or reported before every acknowledged write is in the file.
    fn secure_refused_wal(&self, conn: &Connection) {
        if !self.wal_lost.load(Ordering::Acquire) || self.wal_secured.load(Ordering::Acquire) {
            return;
        }
        self.copy_lost_wal(conn);
        self.wal_secured.store(true, Ordering::Release);
    }

    /// After a group committed: when the `-wal` was found lost between the writer's check and
    /// its commit, the group's frames came after the checkpointer's copy; the writer copies
    /// them before it answers the group (an audit lost 1 acknowledged write in 6 rounds to that
    /// window). One atomic load otherwise.
    fn copy_if_committed_after_loss(&self, conn: &Connection) {
        if self.wal_lost.load(Ordering::Acquire) {
            self.copy_lost_wal(conn);
        }
    }

    /// Copy the lost log into the database file through `conn`, one copier at a time.
    fn copy_lost_wal(&self, conn: &Connection) {
        let Ok(_copying) = self.wal_securing.lock() else {
            return;
        };
        // Whole when the checkpoint was not busy and copied every frame of the log. A reader of
        // another process holding old frames can keep it from that for a while: tried for up to
        // a second, then said all the same (the log stays readable through this process's
        // descriptors, and a clean stop copies it).
        for _ in 0..100 {
            let whole = conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, i64>(2)?,
                    ))
                })
                .is_ok_and(|(busy, log, copied)| busy == 0 && copied >= log);
            if whole {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Move a file put at the `-wal`'s path in place of this process's (a copy put back) aside,
    /// as `<name>-wal.replaced-<unix nanoseconds>`: the next open would replay it over the
    /// database file, undoing writes already copied there (an audit lost 100 of 200 acknowledged
    /// spans so). Listed for `close` to say.
    fn move_replaced_wal_aside(&self) {
        if self.wal.look() != Look::Replaced {
            return;
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let aside = side_file_path(&self.resolved, &format!("-wal.replaced-{stamp}"));
        if !aside.exists() && std::fs::rename(&self.wal.path, &aside).is_ok() {
            if let Ok(mut moved) = self.moved.lock() {
                moved.push(aside.display().to_string());
            }
        }
    }

    /// When the database file itself is lost (replaced at once; missing at two looks in a
    /// row), move this process's `-wal`/`-shm` aside (those still where they were and still its
    /// own); every file moved so far. `close` asks with `final_look`: the process is ending, so
    /// a missing file is not waited for. Judged at the file's real path: when only a symbolic
    /// link was pointed elsewhere, the file and its WAL are still together (and the WAL may
    /// hold acknowledged writes a reader kept from being checkpointed: moving it aside lost
    /// them, found by an audit).
    /// Save the database file deleted under this process (its writer, checkpointer and watcher
    /// stopped, so nothing writes it) beside its path: its bytes copied out of this process's
    /// open descriptor to `<file>.recovered-<unix nanoseconds>`, and its WAL (still at the path,
    /// or moved aside already) renamed to go with it, so SQLite replays it at the next open.
    /// The path of the copy; `Err` saying why when no descriptor of the file is found.
    fn save_deleted(&self) -> Result<PathBuf, String> {
        let open_descriptor = |identity: Option<(u64, u64)>| -> Option<PathBuf> {
            std::fs::read_dir("/proc/self/fd")
                .ok()?
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .find(|path| identity.is_some() && file_identity(path) == identity)
        };
        let descriptor = open_descriptor(self.real.identity)
            .ok_or_else(|| "no open descriptor of the file was found".to_owned())?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let saved = side_file_path(&self.resolved, &format!(".recovered-{stamp}"));
        std::fs::copy(&descriptor, &saved)
            .map_err(|err| format!("cannot copy it to {}: {err}", saved.display()))?;
        let wal = companion_path(&self.resolved, "-wal");
        let wal_at_path = self.companions[0].is_some() && file_identity(&wal) == self.companions[0];
        let wal = if wal_at_path {
            Some(wal)
        } else {
            // Moved aside by an earlier look: taken from there (and no longer listed).
            self.moved.lock().ok().and_then(|mut moved| {
                let index = moved
                    .iter()
                    .position(|aside| aside.contains("-wal.replaced-"))?;
                Some(PathBuf::from(moved.remove(index)))
            })
        };
        // Deleted with the file: copied out of an open descriptor of it too (the readers'
        // connections keep it open).
        let wal_copy = companion_path(&saved, "-wal");
        if wal.is_none() {
            if let Some(descriptor) = open_descriptor(self.companions[0]) {
                std::fs::copy(&descriptor, &wal_copy).map_err(|err| {
                    format!("cannot copy its WAL to {}: {err}", wal_copy.display())
                })?;
            }
        }
        if let Some(wal) = wal {
            std::fs::rename(&wal, &wal_copy).map_err(|err| {
                format!(
                    "the file was copied to {}, but its WAL {} could not be moved beside it \
                     (rename it to {}-wal): {err}",
                    saved.display(),
                    wal.display(),
                    saved.display()
                )
            })?;
        }
        Ok(saved)
    }

    fn secure_if_lost(&self, final_look: bool) -> Vec<String> {
        let Ok(mut moved) = self.moved.lock() else {
            return Vec::new();
        };
        let lost = match self.real.look() {
            Look::Replaced => true,
            Look::Missing => {
                let looks = self.missing_looks.fetch_add(1, Ordering::Relaxed) + 1;
                final_look || looks >= 2
            }
            Look::Same | Look::Unknown => {
                self.missing_looks.store(0, Ordering::Relaxed);
                false
            }
        };
        if lost {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos());
            for (suffix, identity) in COMPANION_SUFFIXES.iter().zip(self.companions) {
                let path = companion_path(&self.resolved, suffix);
                if identity.is_none() || file_identity(&path) != identity {
                    continue;
                }
                let aside = side_file_path(&self.resolved, &format!("{suffix}.replaced-{stamp}"));
                if !aside.exists() && std::fs::rename(&path, &aside).is_ok() {
                    moved.push(aside.display().to_string());
                }
            }
        }
        moved.clone()
    }
}

/// Whether the writer's last group failed on the disk (an I/O error; a file system the kernel
/// made read-only after one): `/healthz` then says so, until a group commits again. Writes
/// failing that way while `/healthz` said ok kept a supervisor from restarting a server whose
/// every write failed (an audit's finding).
///
/// It also asks the disk before a "damaged file" error is reported (see [`crate::disk_probe`]):
/// a failing file system makes SQLite report `SQLITE_CORRUPT`, and such an error becomes the
/// disk's, for the write or read that got it and for `/healthz`.
struct DiskFailure {
    failed: AtomicBool,
    why: Mutex<String>,
    /// The database file, whose file system is asked.
    path: PathBuf,
    /// The last answer of the disk and when it was given: a failing disk fails every request,
    /// and each would ask.
    last_probe: Mutex<Option<(Instant, Option<String>)>>,
    /// Set when an error was found to be the disk's since the last group was finished (by a
    /// write of the group, or by a read meanwhile): that group's success then does not clear
    /// the failure.
    found_in_group: AtomicBool,
}

/// SQLite's own words in a [`StoreError::Corrupt`] detail ("database disk image is malformed"),
/// without the advice to restore the file that follows them.
fn sqlite_words(detail: &str) -> &str {
    detail
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map_or(detail, |(words, _)| words)
}

/// How long one answer of the disk is reused (see [`DiskFailure::explain`]).
const DISK_PROBE_REUSE: Duration = Duration::from_secs(1);

impl DiskFailure {
    fn new(path: &Path) -> Self {
        Self {
            failed: AtomicBool::new(false),
            why: Mutex::new(String::new()),
            // The file itself (through any symbolic link): the probe reads its header and
            // writes beside it, on its own file system.
            path: real_database_path(path),
            last_probe: Mutex::new(None),
            found_in_group: AtomicBool::new(false),
        }
    }

    fn after_group(&self, outcome: &Result<(), StoreError>) {
        let found = self.found_in_group.swap(false, Ordering::AcqRel);
        match outcome {
            Err(StoreError::DiskFailed(why)) => self.mark(why),
            // A group that committed clears the failure, unless one of its own writes found
            // the disk failing (a group whose every write failed commits nothing, and succeeds).
            Ok(()) if self.failed.load(Ordering::Acquire) && !found => {
                self.failed.store(false, Ordering::Release);
            }
            _ => {}
        }
    }

    fn mark(&self, why: &str) {
        if let Ok(mut held) = self.why.lock() {
            why.clone_into(&mut held);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn check(&self) -> Result<(), StoreError> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let why = self.why.lock().map(|why| why.clone()).unwrap_or_default();
        Err(StoreError::DiskFailed(why))
    }

    /// `err`, unless it says the file is damaged (or the disk full) while the disk fails: then the
    /// disk's failure, which `/healthz` reports too. Every other error passes untouched, without
    /// a look at the disk.
    fn explain(&self, err: StoreError) -> StoreError {
        let why = match &err {
            StoreError::Corrupt(detail) => match self.probe() {
                Some(trouble) => format!(
                    "{trouble}; SQLite reports the file damaged ({}), as a failing disk makes it \
                     do: do not restore the file before the disk is checked",
                    sqlite_words(detail)
                ),
                None => return err,
            },
            // A write that fails on a dead file system may come back as "disk full" too (the
            // first one did, under the audit's shut-down file system); a disk that is only full
            // reads and writes a small file, and stays full.
            StoreError::StorageFull(_) => match self.probe() {
                Some(trouble) => trouble,
                None => return err,
            },
            _ => return err,
        };
        self.mark(&why);
        self.found_in_group.store(true, Ordering::Release);
        StoreError::DiskFailed(why)
    }

    /// The disk's answer, asked at most once per [`DISK_PROBE_REUSE`].
    fn probe(&self) -> Option<String> {
        let Ok(mut last) = self.last_probe.lock() else {
            return crate::disk_probe::file_system_trouble(&self.path);
        };
        if let Some((asked, answer)) = last.as_ref() {
            if asked.elapsed() < DISK_PROBE_REUSE {
                return answer.clone();
            }
        }
        let answer = crate::disk_probe::file_system_trouble(&self.path);
        *last = Some((Instant::now(), answer.clone()));
        answer
    }
}

thread_local! {
    /// The frame count of the WAL after the writer thread's last commit, set by SQLite's WAL
    /// hook on the writer's connection (which runs on the committing thread).
    static WAL_FRAMES: Cell<i64> = const { Cell::new(0) };
}

/// The writer connection's WAL hook: remember the WAL's size in frames (see
/// [`GroupCommitWriter::nudge_checkpointer_if_due`]).
fn record_wal_frames(_wal: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|count| count.set(i64::from(frames)));
    Ok(())
}

impl GroupCommitWriter {
    /// How many WAL frames (pages) the writer appends between checkpoint nudges (32 MiB). Each
    /// pass copies every page the WAL holds a newer version of and syncs the file when it
    /// copied everything, so fewer, longer passes copy a hot page (a table's tail, an index's
    /// inner pages, a busy engagement's last page) once instead of several times. 8,192
    /// against 2,048 in alternating runs (two rounds, 4 + 3 pairs, on 2026-12-01): journal
    /// appends +14% / +10%, `activity_workload` +19% / +9%, OTLP end to end +7% / +6%,
    /// `import_workload` +10% / -6%. The rewind is still asked at about 16,384 frames (the
    /// second nudge's pass; see `Checkpointer::WAL_RESTART_FRAMES`), so the WAL's length and the
    /// readers' lookups in it stay as they were.
    const FRAMES_PER_CHECKPOINT: i64 = 8_192;

    fn run(mut self, mut jobs: mpsc::Receiver<QueuedJob>) {
        let mut group: Vec<QueuedJob> = Vec::with_capacity(self.max_group_size);
        while let Some(first) = jobs.blocking_recv() {
            group.push(first);
            while group.len() < self.max_group_size {
                match jobs.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.commit_group(&mut group);
            if self.stop.load(Ordering::Acquire) {
                // Refuse every job already queued or on its way, each caller told `Closed`.
                // Dropping the receiver is not enough: it drops the jobs queued at that moment,
                // but a job whose sender had its slot then lands in the queue afterwards and
                // stays there while any sender lives, its caller waiting for ever (`close`
                // itself sends one to wake this thread: `flightlog demo` hung at its close
                // about once in a hundred runs on a loaded machine). After `close()` the
                // receiver's `recv` ends only once every slot taken has been used or released.
                jobs.close();
                while let Some(job) = jobs.blocking_recv() {
                    drop(job);
                }
                return;
            }
            self.rewind_wal_if_asked();
            self.turns.yield_if_waited_for();
        }
    }

    /// Rewind the WAL when the checkpointer asked (between groups, holding no transaction).
    /// It costs this thread one checkpoint of the few frames written since the checkpointer's
    /// last pass and a sync of the database file, once per few thousand frames; what it buys is
    /// a WAL that stays bounded under any sustained load. A failure only leaves the WAL long.
    ///
    /// Independently of the checkpointer, after each group the writer looks at the WAL's length
    /// (its frame count from the WAL hook; the file itself keeps its high-water size, see the
    /// `journal_size_limit` at open): past `SqliteConfig::wal_hard_cap_frames` (the checkpointer
    /// cannot keep up, e.g. both cores saturated by ingest) it rewinds the WAL itself, copying
    /// what the checkpointer has not, so the disk the WAL takes is bounded under any load, at the
    /// price of this thread's time. Past the cap the writer does not move on until the rewind
    /// is done (or the busy timeout has passed): a `RESTART` fails at once while the
    /// checkpointer is in a pass, and retrying only at the next group let the WAL grow to
    /// 160 - 230 MiB under four back-to-back importers (release build, `wal_bounded.rs`). A
    /// reader that outlasts the whole wait is not this process's (its own long reads wait for
    /// the rewind): the WAL cannot be rewound past it, so the writer goes on, and tries again
    /// after a pause, briefly, as under the cap.
    fn rewind_wal_if_asked(&mut self) {
        let over_cap =
            self.frames_after_last_commit > self.wal_hard_cap_frames.min(self.wal_room.frames());
        if over_cap {
            self.rewind_wanted.store(true, Ordering::Release);
        }
        if !self.rewind_wanted.load(Ordering::Acquire) {
            return;
        }
        // After an attempt that found readers, the next waits its turn, over the cap too: a
        // reader this process does not hold back (a sqlite3 shell in a transaction, a backup)
        // pinned the WAL, and every group waited the whole busy timeout for a rewind that could
        // not happen (an audit's finding: 12 appends in 15 s, 5 s each; the WAL grew all the
        // same, since no rewind passes such a reader).
        if self
            .next_rewind_attempt
            .is_some_and(|next| Instant::now() < next)
        {
            return;
        }
        let found_readers_before = self.next_rewind_attempt.is_some();
        let started = Instant::now();
        // A `RESTART` waits for the readers of older snapshots to finish; the connection
        // otherwise has no busy timeout (see `begin_immediate`), and without one the rewind
        // failed whenever any reader was mid-read, which under steady reads is always. No long
        // read starts while it waits (one that began while the `RESTART` still copied frames
        // would read the WAL, and the rewind would wait for it too), so it waits for those
        // already running; under the cap at
        // most `UNDER_CAP_REWIND_WAIT` (long reads back to back kept every rewind waiting its
        // whole 5 s busy timeout, and every write with it), then the WAL grows a little longer
        // and the rewind is tried again a moment later (later after each attempt in a row that
        // found readers: those of other processes are not held back).
        // Over the cap the first attempt waits the whole busy timeout (the checkpointer's pass,
        // which stops for the request, ends well within it); once one found readers that
        // outlasted it, the attempts in a row after it wait as briefly as under the cap.
        let wait = if over_cap && !found_readers_before {
            self.restart_busy_timeout
        } else {
            self.restart_busy_timeout.min(UNDER_CAP_REWIND_WAIT)
        };
        self.rewinding.store(true, Ordering::Release);
        let closed_gate = self.rewind_gate.close();
        let _ = self.conn.busy_timeout(wait);
        let rewound = loop {
            // Cached: over the cap this may run once a millisecond until the rewind is done.
            let rewound = self
                .conn
                .prepare_cached("PRAGMA wal_checkpoint(RESTART)")
                .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)))
                .is_ok_and(|busy| busy == 0);
            // Busy under the cap (the checkpointer is finishing a pass): the request stays, and
            // the next group retries; the checkpointer starts no new pass meanwhile. Over the
            // cap: the checkpointer stops its catch-up passes when it sees the request, so the
            // wait is at most the rest of one pass.
            if rewound || !over_cap || started.elapsed() >= wait {
                break rewound;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let _ = self.conn.busy_timeout(Duration::ZERO);
        drop(closed_gate);
        self.rewinding.store(false, Ordering::Release);
        if rewound {
            self.rewind_wanted.store(false, Ordering::Release);
            self.next_rewind_attempt = None;
            self.rewind_backoff = UNDER_CAP_REWIND_WAIT;
        } else {
            self.next_rewind_attempt = Some(Instant::now() + self.rewind_backoff);
            self.rewind_backoff = (self.rewind_backoff * 2).min(LONGEST_REWIND_BACKOFF);
        }
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats
            .checkpoint_nanos
            .fetch_add(nanos, Ordering::Relaxed);
        self.stats.writer_rewinds.fetch_add(1, Ordering::Relaxed);
        self.stats
            .writer_rewind_nanos
            .fetch_add(nanos, Ordering::Relaxed);
    }

    fn exec(&self, sql: &str) -> Result<(), StoreError> {
        execute_cached(&self.conn, sql)
    }

    /// `BEGIN IMMEDIATE`, retrying a busy lock (another process writing) within the budget.
    /// The connection's busy timeout is zero: this loop is the wait. While it waits, the writer
    /// is marked waiting (see [`LockTurns`]), so a writer of another process that holds the lock
    /// pauses after its next commit, and the next poll here takes the lock.
    ///
    /// Past the budget the group fails with [`StoreError::Busy`] (nothing was written, so the
    /// callers can be told to retry), and a store that is closing stops waiting at once with
    /// [`StoreError::Closed`]: another process holding the lock (a `sqlite3` shell in a long
    /// transaction) must neither keep writers waiting for long nor hold up a shutdown.
    fn begin_immediate(&mut self) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut mark = None;
        loop {
            match execute_cached_raw(&self.conn, "BEGIN IMMEDIATE") {
                Ok(()) => return Ok(()),
                Err(err) if is_busy(&err) => {
                    if self.stop.load(Ordering::Acquire) {
                        return Err(StoreError::Closed);
                    }
                    let waited = started.elapsed();
                    if waited >= SHUTDOWN_LOCK_WAIT.min(self.lock_retry_budget)
                        && self.shutting_down.load(Ordering::Acquire)
                    {
                        return Err(StoreError::Busy(format!(
                            "the server is stopping and another process holds the database's \
                             write lock; the writer waited {:.1} s for it with this write \
                             (after any wait for its turn in the queue), which was not made: \
                             send it again (to another server on this database, or to this \
                             one once it is back)",
                            waited.as_secs_f64()
                        )));
                    }
                    if waited >= self.lock_retry_budget {
                        return Err(StoreError::Busy(format!(
                            "another process holds the database's write lock; the writer \
                             waited {:.1} s for it with this write (after any wait for its turn \
                             in the queue), the most it waits ({} ms; `flightlog serve \
                             --write-lock-wait-ms`, FLIGHTLOG_WRITE_LOCK_WAIT_MS or \
                             `write_lock_wait_ms` in the config file sets it)",
                            waited.as_secs_f64(),
                            self.lock_retry_budget.as_millis()
                        )));
                    }
                    if mark.is_none() {
                        mark = Some(self.turns.mark_waiting());
                    }
                    std::thread::sleep(crate::lock_turns::poll_interval(waited));
                }
                Err(err) => return Err(backend(err)),
            }
        }
    }

    fn commit_group(&mut self, group: &mut Vec<QueuedJob>) {
        let outcome = self
            .apply_group(group)
            .map_err(|err| self.disk_failure.explain(err));
        if outcome.is_err() {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            self.keys.clear();
            // The first group refused for a lost `-wal` is answered once the log is copied.
            if matches!(outcome, Err(StoreError::FileLost(_))) {
                self.opened_files.secure_refused_wal(&self.conn);
            }
        }
        if outcome.is_ok() {
            self.opened_files.copy_if_committed_after_loss(&self.conn);
        }
        self.keys.trim();
        for job in group.drain(..) {
            let commit = match &outcome {
                Ok(()) => Ok(()),
                Err(err) => Err(err.clone()),
            };
            job.finish(commit, &self.disk_failure);
        }
        self.disk_failure.after_group(&outcome);
    }

    /// Begin the group's transaction and drop cached state if another connection wrote since
    /// our last one.
    fn begin_group(&mut self) -> Result<(), StoreError> {
        self.begin_immediate()?;
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
            .map_err(backend)?;
        let foreign_commit = self.data_version != Some(version);
        if foreign_commit {
            self.keys.clear_volatile();
            self.data_version = Some(version);
        }
        if self.keys.span_id_filter.begin_group(foreign_commit) {
            self.stats
                .span_id_filters_installed
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Apply every job and commit. The fast path runs the jobs back to back with no savepoint
    /// (a failed statement undoes itself in SQLite, and clean failures wrote nothing). If a job
    /// fails dirty, the whole attempt is rolled back and replayed with a savepoint around each
    /// job, so only the failing write fails and its neighbours still commit.
    fn apply_group(&mut self, group: &mut [QueuedJob]) -> Result<(), StoreError> {
        let began = Instant::now();
        self.begin_group()?;
        self.keys.group_logged_change = false;
        self.keys.group_deleted_changes = false;
        self.keys.group_journal = JournalWrites::Nothing;
        let applying = Instant::now();
        let mut dirty = false;
        {
            let mut ctx = WriteContext::new(&self.conn, &mut self.keys, &self.codec, false);
            // The change rows of single activity writes back to back are held back and written
            // 16 to an `INSERT` (a statement's own cost, binding, cursors and reset, was most of
            // a row's; see `defer_changes`), before any other job and at the group's end. Any
            // failure, a held-back row's included (a unique index refusing it), fails this
            // pass, and the replay below writes each job's rows as it goes.
            for job in group.iter_mut() {
                let deferring = ctx.deferred_changes.is_some();
                if job.defers_changes() && !deferring {
                    crate::activity_write::hold_changes_back(&mut ctx);
                } else if !job.defers_changes()
                    && deferring
                    && crate::activity_write::flush_deferred_changes(&mut ctx).is_err()
                {
                    dirty = true;
                    break;
                }
                if job.apply(&mut ctx) == Applied::Dirty {
                    dirty = true;
                    break;
                }
            }
            if !dirty && crate::activity_write::flush_deferred_changes(&mut ctx).is_err() {
                dirty = true;
            }
            ctx.deferred_changes = None;
        }
        if dirty {
            self.exec("ROLLBACK")?;
            self.keys.clear();
            self.begin_group()?;
            for job in group.iter_mut() {
                self.exec("SAVEPOINT write")?;
                let applied = job.apply(&mut WriteContext::new(
                    &self.conn,
                    &mut self.keys,
                    &self.codec,
                    true,
                ));
                if applied == Applied::Dirty {
                    self.exec("ROLLBACK TO write")?;
                    self.keys.clear();
                }
                self.exec("RELEASE write")?;
            }
        }
        let journal_count = if self.keys.group_journal == JournalWrites::Nothing {
            None
        } else {
            // One row a group, not a statement an append (see `CommitWatcher`).
            Some(
                self.conn
                    .prepare_cached(
                        "INSERT INTO flightlog_meta (name, value) VALUES ('journal_writes', 1) \
                         ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
                    )
                    .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, i64>(0)))
                    .map_err(backend)?,
            )
        };
        // The file at the path must still be the one written: a commit into a deleted or
        // replaced one would be acknowledged and lost (see `WatchedFile`). Rolled back instead,
        // so the group fails clean; every later group fails the same way.
        self.opened_files.check()?;
        let committing = Instant::now();
        let committed = self.commit();
        if committed.is_ok() {
            if let (Some(count), JournalWrites::CarriedBy(carrier)) =
                (journal_count, self.keys.group_journal)
            {
                self.journal_bells.carried(count, carrier);
            }
            let newest = match self.keys.next_change_id {
                Some(next) => Some(next - 1),
                // The group logged changes but the cache was cleared after them (a prune, a
                // rolled-back neighbour): the committed newest is one index seek away, and a
                // reader waiting on this group's changes must not wait for the checkpointer's
                // next look.
                None if self.keys.group_logged_change => self
                    .conn
                    .prepare_cached("SELECT MAX(change_id) FROM activity_changes")
                    .and_then(|mut stmt| stmt.query_row([], |row| row.get::<_, Option<i64>>(0)))
                    .ok()
                    .flatten(),
                // No change logged (journal appends, say): nothing to ring. Profiled: this
                // query, prepared afresh after every such group, was 7% of the writer's time
                // in the journal benchmark and most of it for one-append-per-commit callers.
                None => None,
            };
            let deleted = self.keys.group_deleted_changes;
            self.doorbell.send_if_modified(|current| {
                let moved = newest.is_some_and(|newest| newest > *current);
                if let Some(newest) = newest.filter(|_| moved) {
                    *current = newest;
                }
                moved || deleted
            });
        }
        let done = Instant::now();
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.stats.groups.fetch_add(1, Ordering::Relaxed);
        self.nudge_checkpointer_if_due();
        self.stats
            .writes
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        self.stats
            .apply_nanos
            .fetch_add(nanos(committing - applying), Ordering::Relaxed);
        self.stats.commit_nanos.fetch_add(
            nanos(applying - began) + nanos(done - committing),
            Ordering::Relaxed,
        );
        committed
    }

    /// Wake the checkpointer once every [`Self::FRAMES_PER_CHECKPOINT`] WAL frames this writer
    /// appended (read from the WAL hook after each commit). Counting frames, not groups, keeps
    /// the WAL short whatever the group size: nudging every 64 groups let 500-span OTLP imports
    /// (~250 frames a group) grow the WAL past 100 MB before the first checkpoint started.
    fn nudge_checkpointer_if_due(&mut self) {
        let frames = WAL_FRAMES.with(Cell::get);
        // After a rewind the WAL counts from its start again.
        let appended = if frames >= self.frames_after_last_commit {
            frames - self.frames_after_last_commit
        } else {
            frames
        };
        self.frames_after_last_commit = frames;
        self.stats
            .wal_frames
            .fetch_add(u64::try_from(appended).unwrap_or(0), Ordering::Relaxed);
        if frames < self.frames_at_last_nudge {
            // The WAL was rewound since: count from its start.
            self.frames_at_last_nudge = 0;
        }
        let every = Self::FRAMES_PER_CHECKPOINT.min(self.wal_room.frames() / 4);
        if frames - self.frames_at_last_nudge >= every {
            self.frames_at_last_nudge = frames;
            let _ = self.checkpoint_nudge.try_send(());
        }
    }

    fn commit(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        loop {
            match execute_cached_raw(&self.conn, "COMMIT") {
                Ok(()) => return Ok(()),
                Err(err) if is_busy(&err) && started.elapsed() < self.lock_retry_budget => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(err) => return Err(backend(err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn database() -> (tempfile::TempDir, Arc<SqliteDatabase>) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("reads.db")))
            .expect("open the database");
        (dir, db)
    }

    fn multi_thread_runtime(workers: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_time()
            .build()
            .expect("runtime")
    }

    /// A group failed on the disk makes the file's health check fail, saying why, until a group
    /// commits again; other failures leave it as it was.
    #[test]
    fn a_disk_failure_is_told_until_a_group_commits() {
        let failure = DiskFailure::new(Path::new("/nonexistent/flightlog.db"));
        assert!(failure.check().is_ok());
        failure.after_group(&Err(StoreError::DiskFailed("disk I/O error".into())));
        let told = failure.check().expect_err("told");
        assert!(told.to_string().contains("disk I/O error"), "{told}");
        failure.after_group(&Err(StoreError::Busy("locked".into())));
        assert!(
            failure.check().is_err(),
            "still failed: nothing committed since"
        );
        failure.after_group(&Ok(()));
        assert!(failure.check().is_ok());
    }

    /// SQLite's "damaged file" on a disk that fails reads (`/proc/self/mem` at offset 0 fails
    /// with `EIO`, as a shut-down file system's reads do) is the disk's failure: the answer
    /// says so, and the health check too, also past a group that committed nothing but the
    /// failed writes (a group whose every write failed succeeds); the next clean group clears it.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_damaged_file_on_a_failing_disk_is_the_disks_failure() {
        let failure = DiskFailure::new(Path::new("/proc/self/mem"));
        let explained = failure.explain(StoreError::Corrupt(
            "database disk image is malformed".into(),
        ));
        let StoreError::DiskFailed(why) = &explained else {
            panic!("not the disk's: {explained:?}");
        };
        // The path resolved (`/proc/self` is a link to `/proc/<pid>`).
        assert!(
            why.starts_with("reading /proc/") && why.contains("/mem fails"),
            "{why}"
        );
        assert!(why.contains("database disk image is malformed"), "{why}");
        assert!(failure.check().is_err(), "the health check says so");
        failure.after_group(&Ok(()));
        assert!(
            failure.check().is_err(),
            "the group's own writes found the disk failing"
        );
        failure.after_group(&Ok(()));
        assert!(failure.check().is_ok(), "a clean group clears it");
        // "Full" on a failing disk is the disk's failure too; other errors pass untouched.
        let full = failure.explain(StoreError::StorageFull("database or disk is full".into()));
        assert!(matches!(full, StoreError::DiskFailed(_)), "{full:?}");
        let busy = failure.explain(StoreError::Busy("locked".into()));
        assert!(matches!(busy, StoreError::Busy(_)), "{busy:?}");
    }

    /// On a disk that answers, a damaged file is reported as damaged.
    #[test]
    fn a_damaged_file_on_a_disk_that_answers_stays_damaged() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("x.db");
        std::fs::write(&path, b"not a database").expect("write");
        let failure = DiskFailure::new(&path);
        let explained = failure.explain(StoreError::Corrupt("malformed".into()));
        assert!(matches!(explained, StoreError::Corrupt(_)), "{explained:?}");
        let full = failure.explain(StoreError::StorageFull("full".into()));
        assert!(matches!(full, StoreError::StorageFull(_)), "{full:?}");
        assert!(failure.check().is_ok());
    }

    /// A job whose sender took its slot in the queue before the writer stopped, and put the job
    /// there after: it is answered `Closed`. The writer used to drop its end of the queue and
    /// go, and such a job stayed in the queue unanswered while any sender lived (`close` waits
    /// on one of its own: `flightlog demo` hung at its close about once in a hundred runs on a
    /// loaded machine). Here the slot is held across the stop, so the race is certain.
    #[test]
    fn a_job_on_its_way_when_the_writer_stops_is_answered() {
        let (_dir, db) = database();
        let runtime = multi_thread_runtime(1);
        runtime.block_on(async {
            // A sender between its reservation and its push.
            let slot = db.queue.reserve().await.expect("a slot in the queue");
            // Stop the writer as `close` does: the flag, then a job to wake it.
            db.stop_writer.store(true, Ordering::Release);
            let _ = db.write(|_| Ok(())).await;
            let started = Instant::now();
            while !db.queue.is_closed() {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the writer never closed its queue"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let (reply, answer) = oneshot::channel::<Result<(), StoreError>>();
            slot.send(Box::new(TypedJob {
                work: |_: &mut WriteContext<'_>| Ok(()),
                outcome: None,
                after_commit: None,
                reply,
                defers_changes: false,
            }));
            let answered = tokio::time::timeout(Duration::from_secs(10), answer).await;
            assert!(
                matches!(answered, Ok(Err(_))),
                "the job was never answered: {answered:?}"
            );
        });
    }

    #[test]
    fn a_long_read_leaves_the_runtime_worker_free_for_other_tasks() {
        let (_dir, db) = database();
        let runtime = multi_thread_runtime(1);
        let (release, released) = std::sync::mpsc::channel::<()>();
        // The long read waits until another task lets it go. The runtime has one worker: were
        // the read to keep it, that task could never run (and the read would time out).
        let long_read = runtime.spawn(async move {
            db.read_apart(move |_, conn| {
                released
                    .recv_timeout(Duration::from_secs(20))
                    .map_err(|_| StoreError::Backend("the read held up the runtime".into()))?;
                conn.query_row("SELECT 7", [], |row| row.get::<_, i64>(0))
                    .map_err(backend)
            })
            .await
        });
        let other_task = runtime.spawn(async move {
            tokio::task::yield_now().await;
            release.send(()).expect("the read is waiting");
        });
        runtime.block_on(async {
            other_task.await.expect("the other task ran");
            let value = long_read.await.expect("the read's task");
            assert_eq!(value.expect("the read completes"), 7);
        });
    }

    #[test]
    fn at_most_the_bounded_number_of_long_reads_run_at_once() {
        let (_dir, db) = database();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let results = multi_thread_runtime(2).block_on(async {
            let mut reads = tokio::task::JoinSet::new();
            for _ in 0..3 * LONG_READS_AT_ONCE {
                let (db, running, most) =
                    (Arc::clone(&db), Arc::clone(&running), Arc::clone(&most));
                reads.spawn(async move {
                    db.read_apart(move |_, conn| {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(50));
                        running.fetch_sub(1, Ordering::SeqCst);
                        conn.query_row("SELECT 1", [], |row| row.get::<_, i64>(0))
                            .map_err(backend)
                    })
                    .await
                });
            }
            reads.join_all().await
        });
        assert_eq!(results.len(), 3 * LONG_READS_AT_ONCE);
        assert!(results.iter().all(|result| matches!(result, Ok(1))));
        let most = most.load(Ordering::SeqCst);
        assert!(
            (2..=LONG_READS_AT_ONCE).contains(&most),
            "{most} long reads ran at once"
        );
    }

    /// Write one row to the meta table: frames in the WAL.
    async fn write_a_row(db: &SqliteDatabase, name: &'static str) {
        db.write(move |ctx| {
            ctx.conn
                .execute(
                    "INSERT OR REPLACE INTO flightlog_meta (name, value) VALUES (?1, 'x')",
                    [name],
                )
                .map_err(backend)?;
            Ok(())
        })
        .await
        .expect("the write commits");
    }

    #[test]
    fn a_rewind_under_the_cap_does_not_hold_writes_behind_a_long_read() {
        let (dir, db) = database();
        let runtime = multi_thread_runtime(2);
        // A reader of the database file alone (no WAL frames yet to read) keeps every
        // checkpoint from copying what is written next, so the long read below is sure to read
        // frames from the WAL, which is what makes a `RESTART` wait for it.
        let pin = Connection::open(dir.path().join("reads.db")).expect("open a pinning reader");
        pin.execute_batch("BEGIN; SELECT count(*) FROM flightlog_meta;")
            .expect("the pinning reader's snapshot");
        runtime.block_on(write_a_row(&db, "before"));
        let read_done = Arc::new(AtomicBool::new(false));
        let (inside, reading) = std::sync::mpsc::channel::<()>();
        let long_read = runtime.spawn({
            let (db, read_done) = (Arc::clone(&db), Arc::clone(&read_done));
            async move {
                db.read_apart(move |_, conn| {
                    conn.execute_batch("BEGIN").map_err(backend)?;
                    let rows = conn
                        .query_row("SELECT count(*) FROM flightlog_meta", [], |row| {
                            row.get::<_, i64>(0)
                        })
                        .map_err(backend)?;
                    inside
                        .send(())
                        .map_err(|_| StoreError::Backend("the test stopped waiting".into()))?;
                    std::thread::sleep(Duration::from_secs(2));
                    conn.execute_batch("COMMIT").map_err(backend)?;
                    read_done.store(true, Ordering::SeqCst);
                    Ok(rows)
                })
                .await
            }
        });
        reading
            .recv_timeout(Duration::from_secs(20))
            .expect("the long read began");
        pin.execute_batch("COMMIT")
            .expect("the pinning reader ends");
        db.rewind_wanted.store(true, Ordering::SeqCst);
        runtime.block_on(async {
            // The rewind is tried after the first write's group and finds the long read; the
            // second write waits for that attempt, which gives up after a moment.
            write_a_row(&db, "first").await;
            write_a_row(&db, "second").await;
        });
        assert!(
            !read_done.load(Ordering::SeqCst),
            "a write waited for the long read to end: the rewind held the writer"
        );
        assert!(
            db.rewind_wanted.load(Ordering::SeqCst),
            "the rewind went through while a reader used the WAL"
        );
        let read = runtime.block_on(long_read).expect("the read's task");
        assert!(read.expect("the long read") >= 1);
        // Once the read is over, a later write's rewind goes through.
        runtime.block_on(async {
            for _ in 0..500 {
                if !db.rewind_wanted.load(Ordering::SeqCst) {
                    break;
                }
                write_a_row(&db, "after").await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert!(
            !db.rewind_wanted.load(Ordering::SeqCst),
            "the rewind never went through after the long read ended"
        );
    }

    #[test]
    fn a_long_read_does_not_start_while_a_rewind_waits_for_readers() {
        let (_dir, db) = database();
        let runtime = multi_thread_runtime(2);
        let started = Arc::new(AtomicBool::new(false));
        db.rewinding.store(true, Ordering::SeqCst);
        let read = runtime.spawn({
            let (db, started) = (Arc::clone(&db), Arc::clone(&started));
            async move {
                db.read_apart(move |_, conn| {
                    started.store(true, Ordering::SeqCst);
                    conn.query_row("SELECT 3", [], |row| row.get::<_, i64>(0))
                        .map_err(backend)
                })
                .await
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !started.load(Ordering::SeqCst),
            "a long read started while the rewind waited"
        );
        db.rewinding.store(false, Ordering::SeqCst);
        let value = runtime.block_on(read).expect("the read's task");
        assert_eq!(value.expect("the read"), 3);
        assert!(started.load(Ordering::SeqCst));
    }

    #[test]
    fn without_a_multi_thread_runtime_a_long_read_runs_on_the_calling_thread() {
        let (_dir, db) = database();
        let caller = std::thread::current().id();
        let read = db.read_apart(move |_, _| Ok(std::thread::current().id()));
        let mut read = std::pin::pin!(read);
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        match std::future::Future::poll(read.as_mut(), &mut context) {
            std::task::Poll::Ready(Ok(thread)) => assert_eq!(thread, caller),
            other => panic!("expected the read done at once on this thread, got {other:?}"),
        }
        let on_one_thread = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(db.read_apart(move |_, _| Ok(std::thread::current().id())));
        assert_eq!(on_one_thread.expect("the read"), caller);
    }
}
