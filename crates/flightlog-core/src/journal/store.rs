//! The engagement journal trait every backend implements, and its error type.
//!
//! The trait is async so a database backend fits without reshaping it, and it names no backend
//! type: in-memory and SQLite journals are interchangeable behind `Arc<dyn EngagementJournal>`,
//! and the conformance replayer drives them all the same way. Semantics follow the reference
//! `EngagementJournal` (FORMAT.md §4); each method's doc says what it guarantees.
//!
//! Several processes or server instances may share one database. Each engagement's seqs are
//! then still 0, 1, 2, … in commit order, the `expectedSeq` check and the `JournalFull` limit are
//! judged inside the append's own transaction against the engagement's committed count (SQLite:
//! under its write lock; a network backend: the engagement's row locked, `FOR UPDATE`), and
//! `compact`, `prune` and `prune_idle`, which every instance's maintenance runs, may run
//! concurrently: each engagement is changed once, inside a transaction that holds it, and the
//! counts returned are what this call changed. A [`JournalSubscription`] carries only this
//! handle's appends; the [`JournalDoorbell`] rings for everyone else's.

use async_trait::async_trait;
use serde_json::Value;

use super::summary::summarize_engagement_events;
use super::types::{EngagementEvent, EngagementSummary, RetentionConfig};
use super::validate::{AppendInput, AppendValidationError};

/// Committed events as they happen: each appended event once, in seq order per engagement,
/// sent after its commit, with the generation it was numbered in. A receiver that falls more
/// than the backend's buffer behind gets `RecvError::Lagged` and must re-read (`read_from`) to
/// catch up. Compaction rewrites are not sent: they are not new events.
pub type JournalSubscription = tokio::sync::broadcast::Receiver<CommittedEvent>;

/// An appended event as a [`JournalSubscription`] carries it: the event and the generation of
/// the numbering its seq belongs to (the one [`EngagementJournal::read_tail`] reports). A live
/// reader that holds the engagement up to `seq - 1` in that generation takes the event as its
/// next one without reading the store: `(generation, seq)` names one event, as a compaction or
/// a re-creation after a prune draws a new generation. Anything else (a seq past the next, a
/// generation the reader does not hold) sends it to the store.
#[derive(Debug, Clone, PartialEq)]
pub struct CommittedEvent {
    /// The event as committed.
    pub event: EngagementEvent,
    /// The generation its seq was given out in.
    pub generation: u64,
}

/// Rings (its value grows) after commits that a [`JournalSubscription`] does not carry:
/// compactions, prunes, and other processes' or instances' appends (within 250 ms of their
/// commit: SQLite polls `data_version` and a count of journal commits, a network backend would
/// `LISTEN`; on SQLite, a process of a flightlog older than that count moves nothing, and its
/// journal writes are seen by a reader's own periodic recheck). It need not ring after the appends the same handle's subscription carried, nor
/// after commits that wrote no journal entry (activity writes), so a reader that wants this
/// handle's appends subscribes; it may ring for nothing (a look that finds nothing new). A live
/// reader re-reads its engagement
/// ([`EngagementJournal::read_tail`]) when it rings, or, following many, asks where they stand
/// ([`EngagementJournal::heads`]) and re-reads those that moved.
pub type JournalDoorbell = tokio::sync::watch::Receiver<u64>;

/// An engagement's events from some seq on, and the generation they belong to, read together
/// (see [`EngagementJournal::read_tail`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalTail {
    /// Names the engagement's current numbering; `None` when the engagement has no events.
    pub generation: Option<u64>,
    /// Its events with `seq >= from_seq`, in seq order.
    pub events: Vec<EngagementEvent>,
}

/// Where an engagement's numbering stands (see [`EngagementJournal::heads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngagementHead {
    /// Its numbering's generation (as [`EngagementJournal::read_tail`] reports it).
    pub generation: u64,
    /// The seq its next event gets: the number of events it holds.
    pub next_seq: i64,
}

/// How much one [`EngagementJournal::read_tail`] returns: at most `max_events` events, and no
/// more once those read hold about `max_bytes` of data (as JSON text; the event that passes it
/// is the last, and the first always comes, whatever its size). A live reader holds its page
/// until a slow client has taken it, so an unbounded tail was a whole engagement per client:
/// 16 slow stream clients of one 18 MB engagement took a server to 2.6 GB (an audit's finding).
/// The next read starts after the last event returned, so nothing is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailBound {
    /// The most events returned.
    pub max_events: usize,
    /// About the most bytes of event data returned (see the type's doc).
    pub max_bytes: usize,
}

impl TailBound {
    /// Everything from the seq on.
    pub const ALL: TailBound = TailBound {
        max_events: usize::MAX,
        max_bytes: usize::MAX,
    };

    /// Whether a read holding `events` events of `bytes` bytes of data stops there.
    pub fn reached(&self, events: usize, bytes: usize) -> bool {
        events >= self.max_events || bytes > self.max_bytes
    }
}

/// Why a journal call failed. A failed append writes nothing and consumes no seq.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The append input failed validation (the reference's `TypeError`).
    #[error("invalid append input: {0}")]
    Invalid(#[from] AppendValidationError),
    /// The engagement already holds `max_events` events (the reference's `JournalFullError`).
    /// Compaction may free room.
    #[error(
        "engagement {engagement_id:?} is full: it already holds {max_events} event{}, the most \
         one engagement may hold",
        if *max_events == 1 { "" } else { "s" }
    )]
    JournalFull {
        /// The engagement appended to.
        engagement_id: String,
        /// `RetentionConfig::max_events_per_engagement`.
        max_events: u64,
    },
    /// The append carried an expected seq that is not the engagement's next seq (another writer
    /// got there first): re-read and retry.
    #[error("expected to append at seq {expected}, but the next seq is {actual}")]
    WrongExpectedSeq {
        /// The seq the caller required.
        expected: i64,
        /// The seq the append would have had.
        actual: i64,
    },
    /// Compaction would write a number JSON cannot hold (a budget total that overflowed to
    /// infinity): the reference's copy step throws a `TypeError` there, and the engagement is
    /// left as it was.
    #[error("journal data at {path} is not a finite number: the engagement was not compacted")]
    NotFinite {
        /// Where the number would go, e.g. `data.consumed.tokens`.
        path: String,
    },
    /// The journal has been closed (or its writer stopped); nothing was written.
    #[error("the journal is closed")]
    Closed,
    /// A stored event could not be decoded (corruption or a foreign writer).
    #[error("stored journal data is corrupt: {0}")]
    Corrupt(String),
    /// The store's write queue is full: the caller should retry later. Nothing was written.
    #[error("the journal's write queue is full; retry later")]
    Overloaded,
    /// Another process held the database's write lock for longer than the journal waits for
    /// it; nothing was written. A retry succeeds once it lets go.
    #[error("{0}; nothing was written, retry later")]
    Busy(String),
    /// The database could not be reached in time; nothing was written (see
    /// `StoreError::Unavailable`). The SQLite backend never returns it.
    #[error("the database is unavailable: {0}; nothing was written, retry later")]
    Unavailable(String),
    /// The backend failed (I/O, …).
    #[error("journal backend error: {0}")]
    Backend(String),
    /// The disk holding the journal is full; nothing was written. A retry succeeds once space
    /// is freed.
    #[error("the disk is full: {0}; free space on it, then retry")]
    StorageFull(String),
    /// The database file was deleted or replaced while this process had it open; nothing was
    /// written (see `StoreError::FileLost`).
    #[error("nothing was written: {0}")]
    FileLost(String),
    /// The disk or its file system failed a write; nothing was written (see
    /// `StoreError::DiskFailed`).
    #[error(
        "the disk failed a write ({0}); nothing was written: check the disk and its file system \
         (dmesg; one the kernel made read-only after an error must be remounted writable), then \
         retry"
    )]
    DiskFailed(String),
}

/// Per-engagement append-only event logs with summaries, compaction and retention.
#[async_trait]
pub trait EngagementJournal: Send + Sync {
    /// The limits this journal enforces.
    fn retention(&self) -> RetentionConfig;

    /// Append an event at seq = the engagement's current number of events. Appends to one
    /// engagement through one handle, each awaited before the next is made, are applied in that
    /// order; other engagements do not wait on them.
    ///
    /// Fails, writing nothing, with [`JournalError::JournalFull`] when the engagement already
    /// holds `max_events_per_engagement` events, then with [`JournalError::WrongExpectedSeq`]
    /// when the input's expected seq is not the next one.
    async fn append(&self, input: AppendInput) -> Result<EngagementEvent, JournalError>;

    /// Validate a raw JSON input `{engagementId, at, type, data}` and append it.
    async fn append_json(&self, raw: Value) -> Result<EngagementEvent, JournalError> {
        let input = AppendInput::from_json(raw)?;
        self.append(input).await
    }

    /// The engagement's events in seq order (`[]` for an unknown engagement).
    async fn read(&self, engagement_id: &str) -> Result<Vec<EngagementEvent>, JournalError>;

    /// The engagement's events with `seq >= from_seq`, in seq order.
    async fn read_from(
        &self,
        engagement_id: &str,
        from_seq: i64,
    ) -> Result<Vec<EngagementEvent>, JournalError>;

    /// The engagement's events with `seq >= from_seq` and its generation, from one consistent
    /// read. The generation changes whenever seqs already given out are given out again: when
    /// compaction renumbers the engagement, and when a prune deletes it and an append creates
    /// it anew. A reader that followed the engagement under another generation must start over
    /// from seq 0, because what it holds no longer matches the stored log. At most what `bound`
    /// allows (the events then stop short of the end: read on from after the last one).
    async fn read_tail(
        &self,
        engagement_id: &str,
        from_seq: i64,
        bound: TailBound,
    ) -> Result<JournalTail, JournalError>;

    /// Where each engagement stands, in the order given: `None` for one with no events. What
    /// the server asks after the commit doorbell rang, for every engagement a live stream
    /// follows at once, to tell only the streams whose engagement moved other than by the
    /// events they were handed: so cheap per id (one index lookup, no event read). Each answer
    /// is read after the call began.
    async fn heads(
        &self,
        engagement_ids: &[std::sync::Arc<str>],
    ) -> Result<Vec<Option<EngagementHead>>, JournalError>;

    /// The summary of the engagement's events, or `None` when it has none.
    async fn summarize(
        &self,
        engagement_id: &str,
    ) -> Result<Option<EngagementSummary>, JournalError> {
        let events = self.read(engagement_id).await?;
        Ok((!events.is_empty()).then(|| summarize_engagement_events(engagement_id, &events)))
    }

    /// Compact a finished engagement atomically (see `plan_compaction`): `true` when it was
    /// compacted, `false` when the rules left it alone or it is unknown. Later appends continue
    /// at the new length.
    async fn compact(&self, engagement_id: &str) -> Result<bool, JournalError>;

    /// Engagement ids, most recent first by the `at` of each one's last **appended** event
    /// (not the largest `at`); ties: the engagement created later (first append, counting
    /// re-creation after a prune) comes first. `None` = all; `Some(n)` = the first `max(0, n)`.
    async fn list_engagements(&self, limit: Option<i64>) -> Result<Vec<String>, JournalError>;

    /// Delete every engagement whose last appended event has `at < now - max_age_ms`; returns how
    /// many were deleted.
    async fn prune(&self, now: i64) -> Result<u64, JournalError>;

    /// Delete every engagement nothing was appended to in the `max_age_ms` before `now`, by the
    /// time of the appends themselves where the backend records it (SQLite: its clock at each
    /// append), not by the `at` clients give their events, which a client may backdate or give
    /// in seconds; returns how many were deleted. What a scheduled retention calls, since it
    /// deletes without anyone asking. A backend that records no arrival time judges by the
    /// events' `at`, as [`EngagementJournal::prune`] does (the default).
    async fn prune_idle(&self, now: i64) -> Result<u64, JournalError> {
        self.prune(now).await
    }

    /// Whether the journal can still keep what it is given (cheap: a live stream asks every few
    /// seconds). `Err` names why not, e.g. [`JournalError::FileLost`]. `Ok` by default.
    fn health(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// A receiver of every event committed from now on (see [`JournalSubscription`]).
    fn subscribe(&self) -> JournalSubscription;

    /// A doorbell for the commits a subscription does not carry (see [`JournalDoorbell`]).
    fn commit_doorbell(&self) -> JournalDoorbell;
}
