//! The newest changes, read once and encoded once, for every client of the global change stream.
//!
//! Why it exists: each client of `GET /v1/activity/changes/stream` used to read every change from
//! the database itself after each commit (a page query, the rows decoded and their payloads
//! decompressed) and serialize it to JSON itself. With many clients at the head of the log that
//! is the same work once per client per commit: 300 clients at 2,000 writes/s left the writers
//! 140 – 300 writes/s (an audit's finding; the clients received everything, but ingest slowed
//! tenfold). Here the clients at the head share one reading: the first one woken by a commit reads
//! the page and encodes each change as its SSE frame; the others take the same frames (a
//! reference count each) when the lock is theirs.
//!
//! It keeps every guarantee of a stream reading the database itself, because it is one:
//! - **Persist, then emit**: frames come only from pages read from the store after its doorbell
//!   rang, so nothing uncommitted is ever in it.
//! - **No gap, no duplicate**: the tail *covers* a range of change ids `(from, to]`: everything the
//!   log held in it when it was read, in order, with the same horizon check after each page as a
//!   client's own reading (a page that may miss pruned or trimmed changes resets the tail, and a
//!   client behind the reset reads the database itself, which tells it to resync; frames below
//!   the horizon are forgotten at each reading). A client takes frames only once it has read
//!   the database itself once (so one that comes back after a prune is told to resync, and
//!   gets its first changes with each span as it is now) and while its cursor is inside the
//!   range, and moves its cursor to what it took.
//! - **Bounded memory, no client holds writers up**: the tail keeps at most [`MAX_ENTRIES`] frames
//!   and about [`MAX_BYTES`]; a client that falls behind its oldest frame reads the database
//!   itself from its own cursor (catching up in pages, as before) and joins the tail again once
//!   it reaches it. Nothing is ever pushed to a client: a client pulls when its socket takes
//!   more.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::body::Bytes;
use flightlog_core::activity::{ActivityChange, ActivityStore, StoreError};

use crate::routes::streams::{PAGE, PAGE_BYTES};

/// The most frames the tail keeps.
pub(crate) const MAX_ENTRIES: usize = 4_096;
/// About the most bytes of frames the tail keeps (the frame that passes it stays).
pub(crate) const MAX_BYTES: usize = 16 * 1024 * 1024;
/// A client takes at most this many frames at once (one response chunk each, written together).
pub(crate) const MAX_TAKE: usize = 256;
/// And at most about this many bytes of them (the first frame always), as a client reading for
/// itself holds at most a page of about that much: a client that stops reading holds what it
/// took until the write-stall limit closes it, and 256 frames of large spans were up to the
/// tail's whole 16 MiB (an audit's finding: 60 such readers took the server from 166 to 226 MiB).
pub(crate) const MAX_TAKE_BYTES: usize = PAGE_BYTES;
/// How far (in change ids) a client that caught up on its own may be ahead of the tail for the
/// tail to be read forward to it; farther, the tail starts again at the client's cursor (an
/// idle tail would otherwise read all the history in between).
const MOST_IDS_TO_FILL_FORWARD: i64 = 2_000;

/// One change, encoded as its SSE frame.
#[derive(Debug, Clone)]
struct Entry {
    change_id: i64,
    frame: Bytes,
}

/// What the tail covers: every change the log held with `from < changeId <= to` when it was
/// read, as `entries` in change-id order (changes deleted before the reading are not in it).
#[derive(Debug, Default)]
struct Covered {
    from: i64,
    to: i64,
    entries: VecDeque<Entry>,
    bytes: usize,
}

/// Frames a client took from the tail, and where its cursor is after them.
#[derive(Debug)]
pub(crate) struct Taken {
    pub(crate) frames: Vec<Bytes>,
    pub(crate) cursor: i64,
}

/// Why a fill ended the caller's stream.
#[derive(Debug)]
pub(crate) enum FillError {
    /// The store failed.
    Store(StoreError),
}

/// The shared tail (see the module doc). One per server.
#[derive(Debug, Default)]
pub(crate) struct ChangeTail {
    /// `None` until a client first caught up with the log.
    covered: Mutex<Option<Covered>>,
    /// Held while the tail reads the store, so one client reads for all.
    reading: tokio::sync::Mutex<()>,
    /// Pages of the change log the tail has read.
    pages_read: std::sync::atomic::AtomicU64,
}

impl ChangeTail {
    /// The frames after `cursor` (at most [`MAX_TAKE`]), when the tail covers it; `None` when it
    /// does not (the client reads the database itself). An empty list when the tail has nothing
    /// after `cursor` yet: the cursor is then the tail's end.
    pub(crate) fn take(&self, cursor: i64) -> Option<Taken> {
        let covered = self.lock();
        let covered = covered.as_ref()?;
        if cursor < covered.from || cursor > covered.to {
            return None;
        }
        let first = covered
            .entries
            .partition_point(|entry| entry.change_id <= cursor);
        let mut bytes = 0;
        let frames: Vec<Bytes> = covered
            .entries
            .range(first..)
            .take(MAX_TAKE)
            .take_while(|entry| {
                bytes += entry.frame.len();
                bytes == entry.frame.len() || bytes <= MAX_TAKE_BYTES
            })
            .map(|entry| entry.frame.clone())
            .collect();
        let next = first + frames.len();
        let cursor = match covered.entries.get(next) {
            // More after what was taken: the cursor is the last one taken.
            Some(_) => covered.entries[next - 1].change_id,
            // All taken: nothing else is in the range, so the cursor is its end.
            None => covered.to,
        };
        Some(Taken { frames, cursor })
    }

    /// Read the log forward from the tail's end when it is at `cursor` (a client that took
    /// everything and heard the doorbell ring at `rung`); when another client read meanwhile,
    /// nothing (the caller takes what it read).
    pub(crate) async fn fill(
        &self,
        store: &dyn ActivityStore,
        cursor: i64,
        rung: i64,
    ) -> Result<(), FillError> {
        let _reading = self.reading.lock().await;
        if self.end() != Some(cursor) {
            return Ok(());
        }
        self.read_page(store, cursor, rung).await
    }

    /// A client that read the database itself caught up at `cursor` (nothing readable after it
    /// up to the doorbell's `rung`): bring the tail to it, so the client follows the tail from
    /// now on. The tail is read forward when it is a little behind, and started again at
    /// `cursor` when it is far behind or not started yet; one ahead of the client is left to
    /// the clients that follow it (the client reads on by itself until it is inside).
    pub(crate) async fn join(
        &self,
        store: &dyn ActivityStore,
        cursor: i64,
        rung: i64,
    ) -> Result<(), FillError> {
        let _reading = self.reading.lock().await;
        loop {
            let end = self.end();
            match end {
                Some(end) if end == cursor => return Ok(()),
                Some(end)
                    if end < cursor && cursor.saturating_sub(end) <= MOST_IDS_TO_FILL_FORWARD =>
                {
                    self.read_page(store, end, rung).await?;
                    if self.end() == Some(end) {
                        // Nothing moved (a reset): start at the client instead.
                        self.restart_at(cursor);
                        return Ok(());
                    }
                }
                // Ahead of the client: others follow it; the client reads on by itself until
                // it is inside (or learns it must resync).
                Some(end) if end > cursor => return Ok(()),
                // Not started, or far behind: start it at the client.
                _ => {
                    self.restart_at(cursor);
                    return Ok(());
                }
            }
        }
    }

    /// One page after `after` (the tail's end), with the reading lock held.
    async fn read_page(
        &self,
        store: &dyn ActivityStore,
        after: i64,
        rung: i64,
    ) -> Result<(), FillError> {
        let page = store
            .changes_since_bounded(after, PAGE, PAGE_BYTES)
            .await
            .map_err(FillError::Store)?;
        self.pages_read
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // As a client reading for itself: the horizon after the page; a prune or trim that
        // committed before the page may have deleted changes after `after`, so the page may
        // have a gap: the tail starts again past it, and the clients at `after` find themselves
        // outside it, read the database themselves and are told to resync.
        let horizon = store.change_log_horizon().await.map_err(FillError::Store)?;
        if after.saturating_add(1) < horizon {
            self.restart_at(horizon.saturating_sub(1).max(after));
            return Ok(());
        }
        // Encoded before the lock is taken: clients taking frames never wait for the encoding.
        let entries: Vec<Entry> = page.iter().map(encode).collect();
        let mut covered = self.lock();
        let Some(covered) = covered.as_mut() else {
            return Ok(());
        };
        // Frames below the horizon may be of changes a prune or trim deleted since they were
        // read: a client behind them must read the database itself (which tells it to
        // resync), not take them (an audit's finding: a client that came back after a prune
        // was sent the pruned run's changes, and no resync).
        forget_below(covered, horizon);
        if covered.to != after {
            return Ok(());
        }
        match entries.last() {
            Some(last) => {
                covered.to = last.change_id;
                for entry in entries {
                    covered.bytes += entry.frame.len();
                    covered.entries.push_back(entry);
                }
            }
            // Everything up to `rung` is committed and none of it readable (pruned).
            None if rung > covered.to => covered.to = rung,
            None => {}
        }
        trim(covered);
        Ok(())
    }

    /// Pages of the change log the tail has read so far (what the tests hold to one a commit).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn pages_read(&self) -> u64 {
        self.pages_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Start the tail afresh, empty, at `cursor`.
    fn restart_at(&self, cursor: i64) {
        *self.lock() = Some(Covered {
            from: cursor,
            to: cursor,
            entries: VecDeque::new(),
            bytes: 0,
        });
    }

    fn end(&self) -> Option<i64> {
        self.lock().as_ref().map(|covered| covered.to)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Covered>> {
        // A panic while the lock was held cannot leave `Covered` half changed in a way that
        // matters (each change to it is one assignment or push): go on with it.
        self.covered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A change as its SSE frame (what a stream reading for itself sends for it).
fn encode(change: &ActivityChange) -> Entry {
    Entry {
        change_id: change.change_id,
        frame: crate::sse::encode_json("change", Some(&change.change_id.to_string()), change),
    }
}

/// Drop the frames below the change log's `horizon` (what may have been deleted); the range
/// then starts just below it.
fn forget_below(covered: &mut Covered, horizon: i64) {
    let below = horizon.saturating_sub(1);
    if covered.from >= below {
        return;
    }
    while covered
        .entries
        .front()
        .is_some_and(|oldest| oldest.change_id <= below)
    {
        if let Some(oldest) = covered.entries.pop_front() {
            covered.bytes -= oldest.frame.len();
        }
    }
    covered.from = below.min(covered.to);
}

/// Drop the oldest frames past the bounds; the range then starts at the last one dropped.
fn trim(covered: &mut Covered) {
    while covered.entries.len() > MAX_ENTRIES
        || (covered.bytes > MAX_BYTES && covered.entries.len() > 1)
    {
        let Some(oldest) = covered.entries.pop_front() else {
            break;
        };
        covered.bytes -= oldest.frame.len();
        covered.from = oldest.change_id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail_of(frame_sizes: &[usize]) -> ChangeTail {
        let tail = ChangeTail::default();
        let entries: VecDeque<Entry> = frame_sizes
            .iter()
            .enumerate()
            .map(|(k, &size)| Entry {
                change_id: k as i64 + 1,
                frame: Bytes::from(vec![b'x'; size]),
            })
            .collect();
        *tail.lock() = Some(Covered {
            from: 0,
            to: frame_sizes.len() as i64,
            bytes: frame_sizes.iter().sum(),
            entries,
        });
        tail
    }

    #[test]
    fn a_take_is_bounded_in_frames_and_in_bytes() {
        let tail = tail_of(&[100; 300]);
        let taken = tail.take(0).expect("covered");
        assert_eq!(
            (taken.frames.len(), taken.cursor),
            (MAX_TAKE, MAX_TAKE as i64)
        );
        let rest = tail.take(taken.cursor).expect("covered");
        assert_eq!((rest.frames.len(), rest.cursor), (300 - MAX_TAKE, 300));
        // 1 MiB frames: about the byte bound's worth, and the first however large.
        let mib = 1024 * 1024;
        let tail = tail_of(&[mib; 10]);
        let taken = tail.take(0).expect("covered");
        assert_eq!(taken.frames.len(), MAX_TAKE_BYTES / mib);
        let tail = tail_of(&[MAX_TAKE_BYTES * 2, 10]);
        let taken = tail.take(0).expect("covered");
        assert_eq!((taken.frames.len(), taken.cursor), (1, 1));
    }

    #[test]
    fn frames_below_the_horizon_are_forgotten() {
        let tail = tail_of(&[10; 5]);
        let mut covered = tail.lock();
        let covered = covered.as_mut().expect("covered");
        forget_below(covered, 4);
        assert_eq!((covered.from, covered.to, covered.bytes), (3, 5, 20));
        assert_eq!(covered.entries.front().map(|e| e.change_id), Some(4));
        // A horizon at or below the range changes nothing.
        forget_below(covered, 2);
        assert_eq!((covered.from, covered.entries.len()), (3, 2));
        // One past the end empties it; the range ends where it did.
        forget_below(covered, 9);
        assert_eq!((covered.from, covered.to, covered.entries.len()), (5, 5, 0));
    }

    #[test]
    fn a_cursor_outside_the_range_is_not_served() {
        let tail = tail_of(&[10; 5]);
        assert!(tail.take(6).is_none());
        let caught_up = tail.take(5).expect("its end is covered");
        assert_eq!((caught_up.frames.len(), caught_up.cursor), (0, 5));
        *tail.lock() = None;
        assert!(tail.take(0).is_none());
    }
}
