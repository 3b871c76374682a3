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
//! - it is built from both span-id indexes under the write lock, and every id this writer
//!   registers is added to it;
//! - deletions (prune) and rolled-back inserts only leave extra ids;
//! - another connection's commit (another process on the same file) may add ids it has not
//!   seen, so the writer drops the filter whenever `PRAGMA data_version` moved, and rebuilds it
//!   only after [`QUIET_GROUPS_BEFORE_BUILD`] groups in a row with no foreign commit. Two
//!   processes writing at once therefore both use the SQL check, exactly as without a filter.
//!
//! A full filter (more ids than it was sized for) is dropped and rebuilt twice as large, so the
//! scan's cost is amortized over the ids added since. Past [`MAX_IDS`] no filter is built (the
//! memory would exceed ~40 MiB) and every check is the SQL one.

use rusqlite::Connection;

use crate::error::backend;
use flightlog_core::activity::StoreError;

/// Groups committed in a row without a foreign commit before the writer builds a filter.
pub(crate) const QUIET_GROUPS_BEFORE_BUILD: u32 = 8;
/// The most ids a filter is built for.
const MAX_IDS: u64 = 32_000_000;
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

    /// The block's first word and the bit positions (0..512) an id maps to.
    fn positions(&self, id: &str) -> (usize, [u32; BITS_SET as usize]) {
        let hashed = hash(id);
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
        let (first, bits) = self.positions(id);
        for bit in bits {
            if let Some(word) = self.words.get_mut(first + (bit / 64) as usize) {
                *word |= 1 << (bit % 64);
            }
        }
        self.ids += 1;
    }

    /// `false` only when `id` was certainly never inserted.
    pub(crate) fn may_contain(&self, id: &str) -> bool {
        let (first, bits) = self.positions(id);
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

    /// Build a filter of every span id in the database, sized for twice as many, read on the
    /// writer's connection inside its transaction. `None` when there are too many ids for one.
    pub(crate) fn build(conn: &Connection) -> Result<Option<Self>, StoreError> {
        // Span keys are rowids allocated as max + 1, so the largest is an O(log n) upper bound
        // of the span count (and so of the ids), without counting them.
        let largest_key: i64 = conn
            .prepare_cached("SELECT COALESCE(MAX(span_key), 0) FROM activity_spans")
            .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
            .map_err(backend)?;
        let ids = u64::try_from(largest_key).unwrap_or(0);
        if ids > MAX_IDS {
            return Ok(None);
        }
        let mut filter = Self::with_capacity(ids.saturating_mul(2).max(65_536));
        for table in [
            "SELECT span_id FROM activity_span_ids",
            "SELECT span_id FROM activity_span_ids_recent",
        ] {
            let mut stmt = conn.prepare_cached(table).map_err(backend)?;
            let mut rows = stmt.query([]).map_err(backend)?;
            while let Some(row) = rows.next().map_err(backend)? {
                let id = row.get_ref(0).map_err(backend)?;
                // Span ids are TEXT; anything else cannot equal a text id looked up later.
                if let Ok(text) = id.as_str() {
                    filter.insert(text);
                }
            }
        }
        Ok(Some(filter))
    }
}

/// The writer's filter and what it needs to know to trust it (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct SpanIdFilterState {
    filter: Option<SpanIdFilter>,
    /// Groups begun in a row with no foreign commit before them.
    quiet_groups: u32,
    /// Set when a build found too many ids: no filter is attempted again in this process.
    too_many: bool,
}

impl SpanIdFilterState {
    /// Called at the start of each group, under the write lock: `foreign_commit` says whether
    /// another connection committed since this writer's last transaction.
    pub(crate) fn begin_group(&mut self, foreign_commit: bool) {
        if foreign_commit {
            self.filter = None;
            self.quiet_groups = 0;
        } else {
            self.quiet_groups = self.quiet_groups.saturating_add(1);
        }
    }

    /// Whether `id` may be taken: `false` only when the filter proves it free. Builds the filter
    /// first when due.
    pub(crate) fn may_be_taken(&mut self, conn: &Connection, id: &str) -> Result<bool, StoreError> {
        if self.filter.is_none() && !self.too_many && self.quiet_groups >= QUIET_GROUPS_BEFORE_BUILD
        {
            self.filter = SpanIdFilter::build(conn)?;
            self.too_many = self.filter.is_none();
        }
        Ok(self
            .filter
            .as_ref()
            .is_none_or(|filter| filter.may_contain(id)))
    }

    /// Record a span id this writer registered (inside its open transaction).
    pub(crate) fn insert(&mut self, id: &str) {
        if let Some(filter) = &mut self.filter {
            filter.insert(id);
            if filter.is_full() {
                // Rebuilt at the next check, twice as large.
                self.filter = None;
            }
        }
    }

    /// Whether a filter is in use.
    #[cfg(test)]
    fn is_built(&self) -> bool {
        self.filter.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> String {
        format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
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
    fn a_foreign_commit_drops_the_filter_until_the_writer_is_alone_again() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE activity_spans (span_key INTEGER PRIMARY KEY);
             CREATE TABLE activity_span_ids (span_id TEXT PRIMARY KEY, span_key INTEGER);
             CREATE TABLE activity_span_ids_recent (span_id TEXT PRIMARY KEY, span_key INTEGER);
             INSERT INTO activity_spans VALUES (1), (2);
             INSERT INTO activity_span_ids VALUES ('old', 1);
             INSERT INTO activity_span_ids_recent VALUES ('recent', 2);",
        )
        .unwrap();
        let mut state = SpanIdFilterState::default();
        // Not built before enough quiet groups: every id may be taken.
        assert!(state.may_be_taken(&conn, "new").unwrap());
        for _ in 0..QUIET_GROUPS_BEFORE_BUILD {
            state.begin_group(false);
        }
        assert!(!state.may_be_taken(&conn, "new").unwrap());
        assert!(state.is_built());
        assert!(state.may_be_taken(&conn, "old").unwrap());
        assert!(state.may_be_taken(&conn, "recent").unwrap());
        state.insert("new");
        assert!(state.may_be_taken(&conn, "new").unwrap());
        state.begin_group(true);
        assert!(!state.is_built());
        assert!(state.may_be_taken(&conn, "anything").unwrap());
    }
}
