//! [`LockTurns`]: writers of several processes on one file take turns at SQLite's write lock.
//!
//! Why it exists: SQLite's lock is not fair. A writer that finds it taken sleeps and tries again,
//! and a process committing groups back to back frees the lock only for the instant between two
//! of its transactions, so a second process could wait for the whole length of the first one's
//! burst, and fail as busy after `lock_retry_budget` (measured: two processes importing at once
//! did not interleave at all). flightlog promises that a second process's writes are served.
//!
//! How: a writer that finds the lock taken marks itself waiting with a shared `flock` on a small
//! side file next to the database (`<db>-flightlog-turn`, created by the first writer that ever
//! waits) and polls the lock every few hundred microseconds. After each commit, a writer checks
//! whether anyone holds that mark (a non-blocking exclusive `flock`, two system calls) and, if
//! so, pauses for a millisecond before its next transaction: the waiter's next poll takes the
//! lock. Under contention the writers so alternate group by group; with one process, nothing
//! waits and the check costs the two calls per group. Marks are per open file, so two stores
//! in one process take turns too. The side file holds no data: deleting it only ends the turns
//! until a writer waits again.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::side_files::side_file_path;

/// How long a writer pauses after a commit when another process's writer is waiting: longer
/// than the waiter's poll interval, so its next try falls inside the pause.
const YIELD: Duration = Duration::from_millis(1);
/// How often a waiting writer tries the lock again, in its first second of waiting.
const POLL: Duration = Duration::from_micros(250);
/// … and after that: a lock held that long is held by a long transaction (another tool, a
/// compaction), not by a stream of short ones, and polling it 4,000 times a second would only
/// burn CPU.
const SLOW_POLL: Duration = Duration::from_millis(5);

/// How long a writer that has waited `waited` sleeps before it tries the lock again.
pub(crate) fn poll_interval(waited: Duration) -> Duration {
    if waited < Duration::from_secs(1) {
        POLL
    } else {
        SLOW_POLL
    }
}
/// Groups between looks for the side file while it does not exist yet (opening it is a system
/// call; it exists only once some writer has waited).
const GROUPS_PER_LOOK: u32 = 64;

/// One writer's side of the turns.
#[derive(Debug)]
pub(crate) struct LockTurns {
    path: PathBuf,
    file: Option<File>,
    groups_since_look: u32,
}

/// Marks its writer as waiting for the lock until dropped (it holds a duplicate of the side
/// file's descriptor, which shares the lock with the original).
pub(crate) struct WaitingMark {
    file: File,
}

impl Drop for WaitingMark {
    fn drop(&mut self) {
        // An error leaves the mark until the file is closed; other writers only pause more.
        let _ = self.file.unlock();
    }
}

/// Open a side file for locking, creating it (empty) when it does not exist; `None` when that
/// fails (a read-only folder): what it coordinates then goes on without it.
pub(crate) fn open_or_create_side_file(path: &Path) -> Option<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .ok()
}

impl LockTurns {
    /// The turns of a writer of the database at `db_path`.
    pub(crate) fn new(db_path: &Path) -> Self {
        Self {
            path: side_file_path(db_path, "-flightlog-turn"),
            file: None,
            groups_since_look: GROUPS_PER_LOOK,
        }
    }

    /// Mark this writer as waiting (creating the side file if needed); `None` when the file
    /// cannot be created or locked, and the writer then waits unmarked, as before turns existed.
    pub(crate) fn mark_waiting(&mut self) -> Option<WaitingMark> {
        if self.file.is_none() {
            self.file = open_or_create_side_file(&self.path);
        }
        let file = self.file.as_ref()?.try_clone().ok()?;
        file.lock_shared().ok()?;
        Some(WaitingMark { file })
    }

    /// After a commit: pause briefly if a writer of another process (or another store of this
    /// one) is waiting for the lock.
    pub(crate) fn yield_if_waited_for(&mut self) {
        if self.file.is_none() {
            self.groups_since_look += 1;
            if self.groups_since_look < GROUPS_PER_LOOK {
                return;
            }
            self.groups_since_look = 0;
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = &self.file else {
            return;
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = file.unlock();
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(YIELD),
            Err(TryLockError::Error(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_writer_is_seen_by_the_others_and_only_while_it_waits() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("turns.db");
        let mut holder = LockTurns::new(&db);
        let mut waiter = LockTurns::new(&db);
        // No side file yet: nothing to look at, and no file is created by looking.
        holder.yield_if_waited_for();
        assert!(!dir.path().join("turns.db-flightlog-turn").exists());
        let mark = waiter.mark_waiting().expect("a mark");
        // The holder finds the file at its next look and sees the mark: it pauses.
        holder.groups_since_look = GROUPS_PER_LOOK;
        let holder_file = {
            holder.yield_if_waited_for();
            holder.file.as_ref().expect("opened").try_clone().unwrap()
        };
        assert!(matches!(
            holder_file.try_lock(),
            Err(TryLockError::WouldBlock)
        ));
        drop(mark);
        holder_file.try_lock().expect("no one waits any more");
        holder_file.unlock().unwrap();
    }
}
