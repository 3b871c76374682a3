//! One live server per instance name on a database file.
//!
//! Why it exists: at boot a server closes, as interrupted ("server restarted"), the spans its
//! instance's earlier lives left open. That is right only when no other live process is that
//! instance: a second server started with the same `--instance` (a fixed name in a config file
//! shared by two replicas) closed the first one's live spans, and their real outcomes, written
//! later, were refused by the write-once rule.
//!
//! How: each server holds an exclusive `flock` on a small file next to the database, named
//! after the instance, for as long as it runs. The kernel drops the lock when the process ends
//! in any way (a crash or SIGKILL included), so a later life of the instance always gets it, and
//! a second live one is refused before it opens the database. The file is removed at a clean
//! exit; a file left by a crash is simply locked again by the next life. Because a file may be
//! removed while another process opens it, the lock counts only when the locked file is still
//! the one at the path.
//!
//! A lock file deleted while its server runs (a crash leaves such files behind, and they look
//! like leftovers to clean up) locked nothing any more: a second server of the instance made a
//! new one, took it, and its boot closed the first one's live spans (an audit's finding). So the
//! server looks at its lock file every second ([`InstanceLock::renew`], PostgreSQL checks its
//! `postmaster.pid` the same way) and makes it again, locked, when it is gone or another file;
//! the window is that second. A clean exit removes the file only when it is still its own.
//!
//! And one lock that nothing can delete: once the database is open, the server holds an
//! open-file-description lock (`F_OFD_SETLK`) on one byte of the database file itself, at an
//! offset named by the instance ([`lock_instance_in_file`]), far past every byte SQLite locks.
//! A second server of the instance that got past a deleted lock file inside that second is
//! refused there, before its boot's sweep. (OFD locks, unlike the process-wide POSIX record
//! locks SQLite takes, belong to one open file description: they neither meet SQLite's nor are
//! dropped when another descriptor of the file is closed; the descriptor is never closed.)

use std::fs::{File, OpenOptions, TryLockError};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The pause between two tries of a lock another live server holds (see `lock_instance_in_file`
/// and the binary's `backend::wait_for_instance`).
pub const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Where the instances' bytes begin in the database file: 1 PiB, past any database's size and
/// every byte SQLite locks (510 bytes from 1 GiB); an instance's byte is this plus 48 bits of
/// the 64-bit FNV-1a of its name (see [`instance_byte`]).
#[cfg(any(target_os = "linux", target_os = "android"))]
const INSTANCE_BYTES_START: i64 = 1 << 50;

/// The offset of `instance`'s byte in the database file: 48 bits of hash, so two names share a
/// byte (and the second server is refused as if the first were its twin) with odds of about
/// one in 2^47 for a pair (32 bits were found to collide in a search of 700,000 names).
#[cfg(any(target_os = "linux", target_os = "android"))]
fn instance_byte(instance: &str) -> i64 {
    let hash = instance
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    INSTANCE_BYTES_START + (hash & ((1 << 48) - 1)) as i64
}

/// Why the lock was not taken.
#[derive(Debug)]
pub enum InstanceLockError {
    /// Another live process holds the instance's lock on this database.
    Held { lock_file: PathBuf },
    /// A stop was asked for while the lock was waited for: nothing was taken.
    Stopped,
}

/// The held lock; dropping it removes the file (when it is still the one locked) and releases
/// the lock.
#[derive(Debug)]
pub struct InstanceLock {
    /// The locked file; replaced when the one at the path was deleted (see [`Self::renew`]).
    file: Mutex<File>,
    path: PathBuf,
}

/// What [`InstanceLock::renew`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The locked file is still the one at the path.
    Intact,
    /// The file at the path was gone or another one: made again and locked.
    Restored,
    /// It was gone, and the file at the path is locked by another process: a second server of
    /// the instance started meanwhile.
    TakenByAnother,
    /// It was gone, and could not be made again (the folder is read-only or gone); tried again
    /// at the next renewal.
    CannotRestore(String),
}

impl InstanceLock {
    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Check that the locked file is still the one at the path, and make it again, locked, when
    /// it is not (see the module docs).
    pub fn renew(&self) -> Renewal {
        let mut held = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if crate::file_name_lock::same_file(&held, &self.path) {
            return Renewal::Intact;
        }
        match take(&self.path) {
            Ok(Some(file)) => {
                // The old file (deleted, or no longer at the path) is let go.
                *held = file;
                Renewal::Restored
            }
            Ok(None) => Renewal::CannotRestore(format!(
                "cannot make {} again (is its folder writable?)",
                self.path.display()
            )),
            // `take` does not wait, so `Held` is the only refusal it gives.
            Err(InstanceLockError::Held { .. } | InstanceLockError::Stopped) => {
                Renewal::TakenByAnother
            }
        }
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // Remove the path while still holding the lock, so no one can lock the old file between;
        // only when it is still this lock's file (another server's, made after this one's was
        // deleted, is left alone).
        let held = self.file.get_mut().unwrap_or_else(PoisonError::into_inner);
        if crate::file_name_lock::same_file(held, &self.path) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The lock file of `instance` on `database`: `<database>-serve-<readable part>-<hash>.lock`.
/// The readable part keeps the name's letters, digits, `.`, `_` and `-` (at most 40); the hash
/// of the whole name keeps two names that differ only elsewhere apart. A database name too long
/// for that is shortened (`flightlog_sqlite::side_file_path`).
pub fn lock_file_path(database: &Path, instance: &str) -> PathBuf {
    let readable: String = instance
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let hash = instance_hash(instance);
    // Shortened when the database's own name leaves no room (it was once not made at all, and
    // the server ran unguarded).
    flightlog_sqlite::side_file_path(database, &format!("-serve-{readable}-{hash:08x}.lock"))
}

/// FNV-1a of the instance's name: stable across builds, so every flightlog version names the same
/// lock file and locks the same byte.
fn instance_hash(instance: &str) -> u32 {
    instance.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The instance's lock on a byte of the database file (see the module docs); held until the
/// process ends: its descriptor is never closed.
#[derive(Debug)]
pub struct InstanceFileLock {
    _file: ManuallyDrop<File>,
}

/// Lock the instance's byte of the existing `database` file, waiting up to `wait` for another
/// holder to let go. `Err(Held)` when another open file (another live server of the instance)
/// holds it still; `Err(Stopped)` when `stop_requested` said so meanwhile; `Ok(None)` when the
/// file cannot be opened for writing or the platform or file system has no OFD locks (the lock
/// file is then the only guard).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn lock_instance_in_file(
    database: &Path,
    instance: &str,
    wait: Duration,
    stop_requested: &dyn Fn() -> bool,
) -> Result<Option<InstanceFileLock>, InstanceLockError> {
    use nix::errno::Errno;
    use nix::fcntl::{fcntl, FcntlArg};
    let Ok(file) = OpenOptions::new().read(true).write(true).open(database) else {
        return Ok(None);
    };
    // Never closed, on any path: closing a descriptor of the file would drop SQLite's locks.
    // (So the tries below share it.)
    let file = ManuallyDrop::new(file);
    let byte = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: instance_byte(instance),
        l_len: 1,
        l_pid: 0,
    };
    let deadline = std::time::Instant::now() + wait;
    loop {
        match fcntl(&*file, FcntlArg::F_OFD_SETLK(&byte)) {
            Ok(_) => return Ok(Some(InstanceFileLock { _file: file })),
            Err(Errno::EAGAIN | Errno::EACCES) if stop_requested() => {
                return Err(InstanceLockError::Stopped)
            }
            Err(Errno::EAGAIN | Errno::EACCES) if std::time::Instant::now() < deadline => {
                std::thread::sleep(RETRY_PAUSE);
            }
            Err(Errno::EAGAIN | Errno::EACCES) => {
                return Err(InstanceLockError::Held {
                    lock_file: database.to_path_buf(),
                })
            }
            Err(_) => return Ok(None),
        }
    }
}

/// Elsewhere there are no OFD locks: the lock file is the only guard.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn lock_instance_in_file(
    _database: &Path,
    _instance: &str,
    _wait: Duration,
    _stop_requested: &dyn Fn() -> bool,
) -> Result<Option<InstanceFileLock>, InstanceLockError> {
    Ok(None)
}

/// Take the instance's lock. `Ok(None)` when the lock file cannot be made at all (the folder is
/// missing or read-only): opening the database then fails with the real reason, or, on a
/// database that is somehow writable, the server runs without this guard.
pub fn lock_instance(
    database: &Path,
    instance: &str,
) -> Result<Option<InstanceLock>, InstanceLockError> {
    let path = lock_file_path(database, instance);
    Ok(take(&path)?.map(|file| InstanceLock {
        file: Mutex::new(file),
        path,
    }))
}

/// Make (or open) the lock file at `path` and lock it: `Ok(None)` when it cannot be made.
fn take(path: &Path) -> Result<Option<File>, InstanceLockError> {
    // A few tries: another life may remove the file between our open and our lock.
    for _ in 0..3 {
        let Ok(file) = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
        else {
            return Ok(None);
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(InstanceLockError::Held {
                    lock_file: path.to_path_buf(),
                });
            }
            Err(TryLockError::Error(_)) => return Ok(None),
        }
        if crate::file_name_lock::same_file(&file, path) {
            return Ok(Some(file));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_one_instance_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = dir.path().join("flightlog.db");
        let first = lock_instance(&database, "shared").expect("free");
        assert!(first.is_some());
        let refused = lock_instance(&database, "shared");
        assert!(
            matches!(refused, Err(InstanceLockError::Held { .. })),
            "{refused:?}"
        );
        // Another instance on the same file, or the same instance on another file, is free.
        assert!(matches!(lock_instance(&database, "other"), Ok(Some(_))));
        let elsewhere = dir.path().join("other.db");
        assert!(matches!(lock_instance(&elsewhere, "shared"), Ok(Some(_))));
        drop(first);
        assert!(!lock_file_path(&database, "shared").exists());
        assert!(matches!(lock_instance(&database, "shared"), Ok(Some(_))));
    }

    /// A lock file deleted under a live server is made again at its next renewal, so a second
    /// server of the instance is refused again; one that took the instance meanwhile is seen,
    /// and its file is not removed when the first one stops.
    #[test]
    fn a_deleted_lock_file_is_made_again_and_a_taker_is_seen() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = dir.path().join("flightlog.db");
        let first = lock_instance(&database, "x").expect("free").expect("made");
        assert_eq!(first.renew(), Renewal::Intact);
        std::fs::remove_file(first.path()).expect("delete the lock file");
        assert_eq!(first.renew(), Renewal::Restored);
        assert!(first.path().exists());
        assert!(matches!(
            lock_instance(&database, "x"),
            Err(InstanceLockError::Held { .. })
        ));
        assert_eq!(first.renew(), Renewal::Intact);

        // Deleted again, and a second server of "x" starts before the renewal.
        std::fs::remove_file(first.path()).expect("delete the lock file");
        let second = lock_instance(&database, "x").expect("free").expect("made");
        assert_eq!(first.renew(), Renewal::TakenByAnother);
        drop(first);
        assert!(second.path().exists(), "the second one's file is kept");
        assert_eq!(second.renew(), Renewal::Intact);
        drop(second);
        assert!(!lock_file_path(&database, "x").exists());
    }

    /// The byte lock in the database file: a second holder of the instance is refused, another
    /// instance is not; it holds whatever happens to the lock file.
    #[test]
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn the_instance_byte_of_the_database_file_is_held_once() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = dir.path().join("flightlog.db");
        std::fs::write(&database, b"").expect("make the database file");
        let first = lock_instance_in_file(&database, "x", Duration::ZERO, &|| false).expect("free");
        assert!(first.is_some());
        assert!(matches!(
            lock_instance_in_file(&database, "x", Duration::ZERO, &|| false),
            Err(InstanceLockError::Held { .. })
        ));
        assert!(matches!(
            lock_instance_in_file(&database, "y", Duration::ZERO, &|| false),
            Ok(Some(_))
        ));
        assert!(matches!(
            lock_instance_in_file(&dir.path().join("missing.db"), "x", Duration::ZERO, &|| {
                false
            }),
            Ok(None)
        ));
        // Two names whose 32-bit FNV-1a is the same (an audit's search) get bytes of their own.
        assert_eq!(
            instance_hash("ingest-522789"),
            instance_hash("ingest-739192")
        );
        assert_ne!(
            instance_byte("ingest-522789"),
            instance_byte("ingest-739192")
        );
        assert!(matches!(
            lock_instance_in_file(&database, "ingest-522789", Duration::ZERO, &|| false),
            Ok(Some(_))
        ));
        assert!(matches!(
            lock_instance_in_file(&database, "ingest-739192", Duration::ZERO, &|| false),
            Ok(Some(_))
        ));
    }

    #[test]
    fn names_that_differ_only_in_unreadable_characters_get_different_files() {
        let database = Path::new("/data/flightlog.db");
        let a = lock_file_path(database, "host a:4318");
        let b = lock_file_path(database, "host/a:4318");
        assert_ne!(a, b);
        let name = a.file_name().and_then(|name| name.to_str()).unwrap_or("");
        assert!(
            name.starts_with("flightlog.db-serve-host_a_4318-"),
            "{name}"
        );
        assert!(name.ends_with(".lock"), "{name}");
    }

    /// A database name that left no room for the lock file's suffix: the lock was not made,
    /// and a second server of the same instance started unguarded (an audit's finding).
    #[test]
    fn a_long_database_name_still_gets_its_lock() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = dir.path().join("x".repeat(230));
        let instance = "replica-shared-instance-name";
        let first = lock_instance(&database, instance).expect("free");
        assert!(first.is_some());
        let refused = lock_instance(&database, instance);
        assert!(
            matches!(refused, Err(InstanceLockError::Held { .. })),
            "{refused:?}"
        );
        drop(first);
        assert!(matches!(lock_instance(&database, instance), Ok(Some(_))));
    }

    #[test]
    fn a_missing_folder_is_not_a_refusal() {
        let database = Path::new("/nonexistent-flightlog-folder/flightlog.db");
        assert!(matches!(lock_instance(database, "x"), Ok(None)));
    }
}
