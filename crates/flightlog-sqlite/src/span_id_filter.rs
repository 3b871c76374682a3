//! An in-memory Bloom filter over every span id in the database, kept by the writer so that a
//! new span's id is usually proved free without touching the span-id indexes.
//!
//! Span ids are random (OTLP's always, most SDKs' UUIDs too), so the existence check every new
//! span needs is two b-tree descents to random leaves: measured at 1.5 µs of the writer's
//! 8.3 µs per imported span. A Bloom filter answers "certainly absent" for nearly every new id
//! in a few nanoseconds; "maybe present" falls back to the SQL check, so a false positive only
//! costs that check.
//!
//! Soundness needs the filter to hold every id the database holds (extra ids are harmless):
//! - it is built from both span-id indexes by a background thread on its own read-only
//!   connection, started at the beginning of a group (so every id this writer registers from
//!   then on is either read by the builder or in the pending list it keeps meanwhile, or both;
//!   the builder reads the main index in short chunks, see [`SpanIdFilter::build`]), and every
//!   id this writer registers is added to it;
//! - deletions (prune) and rolled-back inserts only leave extra ids;
//! - another connection's commit (another process on the same file) may add ids it has not
//!   seen, so the writer drops the filter (and any build in progress) whenever `PRAGMA
//!   data_version` moved, and starts a new build only after [`QUIET_GROUPS_BEFORE_BUILD`]
//!   groups in a row with no foreign commit. Two processes writing at once therefore both use
//!   the SQL check, exactly as without a filter.
//!
//! Building in the background keeps the writer from stalling on a scan of millions of ids (at a
//! restart, or when a full filter is rebuilt twice as large; a full filter keeps answering
//! soundly meanwhile, only with more false positives). Past [`MAX_IDS`] no filter is kept (the
//! memory would exceed ~40 MiB) and every check is the SQL one.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// Groups committed in a row without a foreign commit before the writer builds a filter.
pub(crate) const QUIET_GROUPS_BEFORE_BUILD: u32 = 8;
/// The most ids a filter is built for: sized for twice as many at 10 bits each, its largest
/// bit array is 40 MB.
const MAX_IDS: u64 = 16_000_000;
/// Bits per id at the filter's capacity (with [`BITS_SET`] bits set per id in one 512-bit
/// block: under 1% false positives at capacity, far fewer below it).
const BITS_PER_ID: u64 = 10;
/// Bits set (and tested) per id.
const BITS_SET: u32 = 6;
/// Words per block: 8 × 64 bits, one cache line, so a test touches one line.
const BLOCK_WORDS: usize = 8;

/// The filter: blocks of 512 bits; an id sets [`BITS_SET`] bits in the block its hash picks.
#[derive(Debug)]
pub(crate) struct SpanIdFilter {
    words: Vec<u64>,
    blocks: u64,
    ids: u64,
    capacity: u64,
}

/// 64-bit FNV-1a followed by a final avalanche (SplitMix64's), enough spread for a Bloom filter
/// over ids that are mostly random already.
fn hash(id: &str) -> u64 {
    let mut state: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in id.as_bytes() {
        state ^= u64::from(*byte);
        state = state.wrapping_mul(0x0000_0100_0000_01b3);
    }
    state ^= state >> 30;
    state = state.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    state ^= state >> 27;
    state = state.wrapping_mul(0x94d0_49bb_1331_11eb);
    state ^ (state >> 31)
}

impl SpanIdFilter {
    /// An empty filter for up to `capacity` ids.
    pub(crate) fn with_capacity(capacity: u64) -> Self {
        let bits = capacity.max(1).saturating_mul(BITS_PER_ID);
        let blocks = bits.div_ceil(64 * BLOCK_WORDS as u64).max(1);
        let words = usize::try_from(blocks)
            .unwrap_or(usize::MAX / BLOCK_WORDS)
            .saturating_mul(BLOCK_WORDS);
        Self {
            words: vec![0; words],
            blocks,
            ids: 0,
            capacity,
        }
    }

    /// The block's first word and the bit positions (0..512) an id's hash maps to.
    fn positions(&self, hashed: u64) -> (usize, [u32; BITS_SET as usize]) {
        // The high half picks the block (multiply-shift: no division).
        let block = ((hashed >> 32) * self.blocks) >> 32;
        let first = usize::try_from(block).unwrap_or(0) * BLOCK_WORDS;
        // The bits come from a remix of the hash, independent of the block index's bits.
        let source = (hashed ^ (hashed >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut bits = [0u32; BITS_SET as usize];
        for (slot, bit) in bits.iter_mut().enumerate() {
            // 6 slices of 9 bits fit in 54 bits; the mask keeps exactly 9, so the cast is exact.
            *bit = ((source >> (10 + 9 * slot as u32)) & 0x1ff) as u32;
        }
        (first, bits)
    }

    pub(crate) fn insert(&mut self, id: &str) {
        self.insert_hash(hash(id));
    }

    fn insert_hash(&mut self, hashed: u64) {
        let (first, bits) = self.positions(hashed);
        for bit in bits {
            if let Some(word) = self.words.get_mut(first + (bit / 64) as usize) {
                *word |= 1 << (bit % 64);
            }
        }
        self.ids += 1;
    }

    /// `false` only when `id` was certainly never inserted.
    pub(crate) fn may_contain(&self, id: &str) -> bool {
        let (first, bits) = self.positions(hash(id));
        bits.iter().all(|bit| {
            self.words
                .get(first + (bit / 64) as usize)
                .is_none_or(|word| word & (1 << (bit % 64)) != 0)
        })
    }

    /// More ids were added than the filter was sized for.
    pub(crate) fn is_full(&self) -> bool {
        self.ids > self.capacity
    }

    /// A filter of every span id in the database at `path`, sized for twice as many, read on a
    /// connection of its own. `None` when there are too many ids.
    ///
    /// The recent index is read first, in one statement; then the middle index, in one
    /// statement; the main index last, in key-order chunks, each its own short read (a read held
    /// for the whole scan of millions of ids would keep the checkpointer from rewinding the WAL
    /// meanwhile). That is still every id committed before the build started, because ids only
    /// move down (recent to middle to main) and each index is read after the one above it: an id
    /// is read in the index where the read of that index finds it, or else it has moved on to a
    /// lower index, read later; an id in the main index stays there (merges only add to it; only
    /// pruning removes, and a pruned id needs no place in the filter); later ids are the
    /// writer's pending ones.
    fn build(path: &Path, busy_timeout: Duration) -> rusqlite::Result<Option<Self>> {
        /// Main-index ids read per statement.
        const CHUNK: i64 = 65_536;
        Self::build_in_chunks(path, busy_timeout, CHUNK)
    }

    fn build_in_chunks(
        path: &Path,
        busy_timeout: Duration,
        chunk: i64,
    ) -> rusqlite::Result<Option<Self>> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(busy_timeout)?;
        // Span keys are rowids allocated as max + 1, so the largest is an O(log n) upper bound
        // of the span count (and so of the ids), without counting them.
        let largest_key: i64 = conn.query_row(
            "SELECT COALESCE(MAX(span_key), 0) FROM activity_spans",
            [],
            |row| row.get(0),
        )?;
        let ids = u64::try_from(largest_key).unwrap_or(0);
        if ids > MAX_IDS {
            return Ok(None);
        }
        let mut filter = Self::with_capacity(ids.saturating_mul(2).max(65_536));
        for sql in [
            "SELECT span_id FROM activity_span_ids_recent",
            "SELECT span_id FROM activity_span_ids_middle",
        ] {
            let mut stmt = conn.prepare(sql)?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                // Span ids are TEXT; anything else cannot equal a text id looked up later.
                if let Ok(text) = row.get_ref(0)?.as_str() {
                    filter.insert(text);
                }
            }
        }
        let mut stmt = conn.prepare(
            "SELECT span_id FROM activity_span_ids WHERE span_id > ?1 ORDER BY span_id LIMIT ?2",
        )?;
        let mut after = String::new();
        let mut next_after = String::new();
        loop {
            let mut rows = stmt.query(rusqlite::params![after, chunk])?;
            let mut read = 0i64;
            while let Some(row) = rows.next()? {
                read += 1;
                if let Ok(text) = row.get_ref(0)?.as_str() {
                    filter.insert(text);
                    next_after.clear();
                    next_after.push_str(text);
                }
            }
            // A short chunk is the last; a chunk that did not move the cursor ends it too.
            if read < chunk || next_after == after {
                break;
            }
            std::mem::swap(&mut after, &mut next_after);
        }
        Ok(Some(filter))
    }
}

/// A build in progress, and the ids registered since it started.
#[derive(Debug)]
struct Build {
    /// Hashes of the ids this writer registered since the build started.
    pending: Vec<u64>,
    result: mpsc::Receiver<rusqlite::Result<Option<SpanIdFilter>>>,
}

/// The writer's filter and what it needs to know to trust it (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct SpanIdFilterState {
    /// The database file (`None`: no filter is ever built).
    path: Option<PathBuf>,
    busy_timeout: Duration,
    filter: Option<SpanIdFilter>,
    build: Option<Build>,
    /// Groups begun in a row with no foreign commit before them.
    quiet_groups: u32,
    /// Set when a build found too many ids: no filter is attempted again in this process.
    too_many: bool,
}

impl SpanIdFilterState {
    /// A state that builds its filters from the database at `path`.
    pub(crate) fn new(path: PathBuf, busy_timeout: Duration) -> Self {
        Self {
            path: Some(path),
            busy_timeout,
            ..Self::default()
        }
    }

    /// Called at the start of each group, under the write lock and before any write of the
    /// group: `foreign_commit` says whether another connection committed since this writer's
    /// last transaction. Installs a finished build (and says so) and starts a new one when due.
    pub(crate) fn begin_group(&mut self, foreign_commit: bool) -> bool {
        if foreign_commit {
            self.filter = None;
            self.build = None;
            self.quiet_groups = 0;
            return false;
        }
        let mut installed = false;
        self.quiet_groups = self.quiet_groups.saturating_add(1);
        if let Some(build) = &self.build {
            match build.result.try_recv() {
                Err(mpsc::TryRecvError::Empty) => {}
                Ok(Ok(Some(mut filter))) => {
                    for hashed in &build.pending {
                        filter.insert_hash(*hashed);
                    }
                    self.filter = Some(filter);
                    self.build = None;
                    installed = true;
                }
                Ok(Ok(None)) => {
                    self.too_many = true;
                    self.filter = None;
                    self.build = None;
                }
                // A failed build (or a builder that died) is retried at a later group.
                Ok(Err(_)) | Err(mpsc::TryRecvError::Disconnected) => self.build = None,
            }
        }
        let wanted = self.filter.as_ref().is_none_or(SpanIdFilter::is_full);
        if wanted
            && self.build.is_none()
            && !self.too_many
            && self.quiet_groups >= QUIET_GROUPS_BEFORE_BUILD
        {
            self.start_build();
        }
        installed
    }

    fn start_build(&mut self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let busy_timeout = self.busy_timeout;
        let (sender, result) = mpsc::sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("flightlog-idfilter".into())
            .spawn(move || {
                // The writer may have dropped the build meanwhile: nobody to tell then.
                let _ = sender.send(SpanIdFilter::build(&path, busy_timeout));
            });
        if spawned.is_ok() {
            self.build = Some(Build {
                pending: Vec::new(),
                result,
            });
        }
    }

    /// Whether `id` may be taken: `false` only when the filter proves it free.
    pub(crate) fn may_be_taken(&self, id: &str) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|filter| filter.may_contain(id))
    }

    /// Record a span id this writer registered (inside its open transaction).
    pub(crate) fn insert(&mut self, id: &str) {
        if self.filter.is_none() && self.build.is_none() {
            return;
        }
        let hashed = hash(id);
        if let Some(filter) = &mut self.filter {
            // A full filter still answers soundly; a larger one is built at the next group.
            filter.insert_hash(hashed);
        }
        if let Some(build) = &mut self.build {
            build.pending.push(hashed);
        }
    }

    /// Whether a filter is in use.
    #[cfg(test)]
    fn is_built(&self) -> bool {
        self.filter.is_some()
    }

    /// Wait for the build in progress, if any, to finish (as the next group would find it).
    #[cfg(test)]
    fn wait_for_build(&mut self) {
        if let Some(build) = &self.build {
            if let Ok(result) = build.result.recv() {
                let (sender, receiver) = mpsc::sync_channel(1);
                let _ = sender.send(result);
                if let Some(build) = &mut self.build {
                    build.result = receiver;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> String {
        format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// A file holding just the tables a filter build reads.
    fn span_id_tables() -> (tempfile::TempDir, std::path::PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE activity_spans (span_key INTEGER PRIMARY KEY);
             CREATE TABLE activity_span_ids (span_id TEXT PRIMARY KEY, span_key INTEGER);
             CREATE TABLE activity_span_ids_recent (span_id TEXT PRIMARY KEY, span_key INTEGER);
             CREATE TABLE activity_span_ids_middle (span_id TEXT PRIMARY KEY, span_key INTEGER);",
        )
        .unwrap();
        (dir, path, conn)
    }

    #[test]
    fn every_inserted_id_is_found() {
        let mut filter = SpanIdFilter::with_capacity(100_000);
        for n in 0..100_000 {
            filter.insert(&id(n));
        }
        assert!((0..100_000).all(|n| filter.may_contain(&id(n))));
        assert!(!filter.is_full());
        filter.insert("one more");
        assert!(filter.is_full());
    }

    #[test]
    fn false_positives_stay_rare_at_capacity() {
        let mut filter = SpanIdFilter::with_capacity(100_000);
        for n in 0..100_000 {
            filter.insert(&id(n));
        }
        let false_positives = (100_000..200_000)
            .filter(|n| filter.may_contain(&id(*n)))
            .count();
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
        // Sequential and short ids spread as well as random ones.
        let mut sequential = SpanIdFilter::with_capacity(10_000);
        for n in 0..10_000 {
            sequential.insert(&format!("span-{n}"));
        }
        let false_positives = (10_000..20_000)
            .filter(|n| sequential.may_contain(&format!("span-{n}")))
            .count();
        assert!(false_positives < 200, "{false_positives} of 10,000");
    }

    #[test]
    fn a_filter_is_built_in_the_background_and_dropped_on_a_foreign_commit() {
        let (_dir, path, conn) = span_id_tables();
        conn.execute_batch(
            "INSERT INTO activity_spans VALUES (1), (2), (3);
             INSERT INTO activity_span_ids VALUES ('old', 1);
             INSERT INTO activity_span_ids_middle VALUES ('middle', 3);
             INSERT INTO activity_span_ids_recent VALUES ('recent', 2);",
        )
        .unwrap();
        let mut state = SpanIdFilterState::new(path, Duration::from_secs(1));
        // Not built before enough quiet groups: every id may be taken.
        assert!(state.may_be_taken("new"));
        for _ in 0..QUIET_GROUPS_BEFORE_BUILD {
            state.begin_group(false);
        }
        // Registered while the build runs: kept in the pending list.
        state.insert("during");
        assert!(state.may_be_taken("new"), "no filter until the build is in");
        state.wait_for_build();
        state.begin_group(false);
        assert!(state.is_built());
        assert!(!state.may_be_taken("new"));
        assert!(state.may_be_taken("old"));
        assert!(state.may_be_taken("middle"));
        assert!(state.may_be_taken("recent"));
        assert!(state.may_be_taken("during"));
        state.insert("after");
        assert!(state.may_be_taken("after"));
        state.begin_group(true);
        assert!(!state.is_built());
        assert!(state.may_be_taken("anything"));
    }

    #[test]
    fn the_main_index_is_read_in_chunks_without_missing_an_id() {
        let (_dir, path, conn) = span_id_tables();
        for n in 0..50u64 {
            conn.execute(
                "INSERT INTO activity_span_ids VALUES (?1, ?2)",
                rusqlite::params![id(n), n as i64],
            )
            .unwrap();
        }
        conn.execute("INSERT INTO activity_spans VALUES (50)", [])
            .unwrap();
        // Chunks of 7 (the last one short) and of 10 (the last one exactly full).
        for chunk in [7, 10] {
            let filter = SpanIdFilter::build_in_chunks(&path, Duration::from_secs(1), chunk)
                .unwrap()
                .unwrap();
            assert!((0..50).all(|n| filter.may_contain(&id(n))), "chunk {chunk}");
        }
    }

    #[test]
    fn a_build_in_progress_is_dropped_by_a_foreign_commit() {
        let (_dir, path, conn) = span_id_tables();
        let mut state = SpanIdFilterState::new(path, Duration::from_secs(1));
        for _ in 0..QUIET_GROUPS_BEFORE_BUILD {
            state.begin_group(false);
        }
        state.wait_for_build();
        // Another process took an id after the build's snapshot: the commit drops the build.
        conn.execute_batch("INSERT INTO activity_span_ids_recent VALUES ('theirs', 1)")
            .unwrap();
        state.begin_group(true);
        state.begin_group(false);
        assert!(!state.is_built());
        assert!(state.may_be_taken("theirs"));
    }
}
