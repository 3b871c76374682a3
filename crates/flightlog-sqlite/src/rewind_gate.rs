//! [`RewindGate`]: while a writer's WAL rewind waits for readers, long reads of every process
//! on the file hold back.
//!
//! Why it exists: a `RESTART` checkpoint first copies the frames committed since the last pass,
//! then waits until no reader uses the WAL. A read that begins during that wait still reads the
//! WAL, so readers looping on long reads kept the rewind, and every write behind it, waiting. In
//! one process an atomic flag holds the long reads back (see `SqliteDatabase::read_apart`);
//! this gate does the same across processes: with the long reads in a second process, the WAL
//! reached its hard cap and a write waited out the 5 s busy timeout.
//!
//! How: a small side file next to the database (`<db>-flightlog-rewind`, created by the first
//! writer that rewinds). The rewinding writer holds an exclusive `flock` on it while it waits;
//! a long read first takes a shared one and lets it go at once (two system calls), waiting while
//! it cannot. Locks are per open file, so two handles in one process see each other too. The
//! file holds no data: deleting it only opens the gate. A process that dies holding the lock
//! releases it with its descriptors.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::lock_turns::open_or_create_side_file;
use crate::side_files::side_file_path;

/// One side of the gate: a writer's or a database handle's readers'. The two sides of one
/// process must be two instances (two open files: a shared lock taken through the writer's own
/// open file would turn its exclusive lock into a shared one).
#[derive(Debug)]
pub(crate) struct RewindGate {
    path: PathBuf,
    /// Opened when first needed (the writer creates the file; readers only open it).
    file: Mutex<Option<File>>,
}

/// The gate closed by a writer until dropped.
pub(crate) struct ClosedGate<'a> {
    file: MutexGuard<'a, Option<File>>,
}

impl Drop for ClosedGate<'_> {
    fn drop(&mut self) {
        // An unlock that fails leaves the gate closed until the process ends (readers wait
        // at most their longest wait meanwhile).
        if let Some(file) = self.file.as_ref() {
            let _ = file.unlock();
        }
    }
}

impl RewindGate {
    pub(crate) fn new(database: &Path) -> Self {
        Self {
            path: side_file_path(database, "-flightlog-rewind"),
            file: Mutex::new(None),
        }
    }

    /// Writer side: close the gate for as long as the returned guard lives, or `None` when it
    /// cannot be closed right now (a reader is passing it, the file cannot be made): the
    /// rewind then goes on without it.
    pub(crate) fn close(&self) -> Option<ClosedGate<'_>> {
        let mut slot = self.file.lock().ok()?;
        if slot.is_none() {
            *slot = open_or_create_side_file(&self.path);
        }
        slot.as_ref()?.try_lock().ok()?;
        Some(ClosedGate { file: slot })
    }

    /// Reader side: wait until no writer holds the gate closed, at most `longest`. Returns at
    /// once when the file does not exist (no writer has rewound yet).
    pub(crate) fn wait_open(&self, longest: Duration) {
        let Ok(mut slot) = self.file.lock() else {
            return;
        };
        if slot.is_none() {
            *slot = File::open(&self.path).ok();
        }
        let Some(file) = slot.as_ref() else {
            return;
        };
        let started = Instant::now();
        loop {
            match file.try_lock_shared() {
                Ok(()) => {
                    let _ = file.unlock();
                    return;
                }
                Err(TryLockError::WouldBlock) if started.elapsed() < longest => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_reader_waits_while_another_handle_rewinds_and_passes_once_it_is_done() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let database = dir.path().join("gate.db");
        let writer = RewindGate::new(&database);
        let reader = Arc::new(RewindGate::new(&database));
        // No file yet: nothing to wait for.
        reader.wait_open(Duration::from_secs(5));

        let closed = writer.close().expect("close the gate");
        let passed = Arc::new(AtomicBool::new(false));
        let waiting = std::thread::spawn({
            let (reader, passed) = (Arc::clone(&reader), Arc::clone(&passed));
            move || {
                reader.wait_open(Duration::from_secs(20));
                passed.store(true, Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !passed.load(Ordering::SeqCst),
            "a reader passed a closed gate"
        );
        drop(closed);
        waiting.join().expect("the reader's thread");
        assert!(passed.load(Ordering::SeqCst));
    }

    #[test]
    fn a_reader_gives_up_waiting_after_its_longest_wait() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let database = dir.path().join("gate.db");
        let writer = RewindGate::new(&database);
        let reader = RewindGate::new(&database);
        let _closed = writer.close().expect("close the gate");
        // Returns (the gate is still closed) instead of waiting for good.
        reader.wait_open(Duration::from_millis(50));
    }
}
