//! Whether another process holds the database file so that no one else may even read it, and a
//! start's bounded wait for it to let go.
//!
//! Why it exists: a process with the file in SQLite's exclusive locking mode
//! (`PRAGMA locking_mode=EXCLUSIVE`), or inside a write transaction that has reached its
//! commit (a `sqlite3` shell left in `BEGIN EXCLUSIVE` on a file not in WAL mode), holds
//! SQLite's EXCLUSIVE (or PENDING) lock. SQLite's open then waited its fixed 5 s busy timeout
//! whatever `--write-lock-wait-ms` said, and the start failed with a bare "database is locked"
//! that named neither the other process nor what to do (an audit's finding). The lock is looked
//! at here before SQLite opens the file, so the start waits as long as the setting says, says
//! why while it waits, can be stopped while it waits, and refuses with the fix.
//!
//! How: SQLite's unix VFS takes POSIX record locks on bytes past 1 GiB of the file, however
//! large the file is: PENDING is a write lock on byte `0x4000_0000`, EXCLUSIVE a write lock on
//! the 510 bytes from `0x4000_0002`. A reader needs a read lock on both, so `F_GETLK` asking
//! for a read lock there tells whether a reader would be kept out, and by which process. The
//! RESERVED byte between them is not asked about: a writer holding only it lets readers in.

use std::path::Path;
use std::time::{Duration, Instant};

/// The pause between two looks at the lock while a start waits.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Another process's lock that keeps every other process from reading the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ForeignExclusiveLock {
    /// The process holding it, as the kernel reports it (`None` when it does not say).
    pub(crate) holder: Option<u32>,
}

impl ForeignExclusiveLock {
    /// `another process (pid 1234)`, or `another process` when the kernel does not say which.
    pub(crate) fn describe_holder(&self) -> String {
        match self.holder {
            Some(pid) => format!("another process (pid {pid})"),
            None => "another process".to_owned(),
        }
    }
}

/// How a start's wait for a foreign exclusive lock ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockWait {
    /// No such lock (any more): SQLite may open the file.
    Free,
    /// Still held when the wait was over.
    StillHeld(ForeignExclusiveLock),
    /// A stop was asked for while waiting.
    Stopped,
}

/// The lock that keeps readers out of `database`, if another process holds one. `None` for a
/// file that is not there (yet) or is not a regular file (SQLite's open says what is wrong with
/// it), and where record locks cannot be asked about.
///
/// Call it before this process's SQLite opens the file: the descriptor it opens is closed
/// again, and closing any descriptor of a file drops every POSIX lock the process holds on it
/// (it holds none before SQLite opens the file; `flock` and OFD locks are not affected).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn foreign_exclusive_lock(database: &Path) -> Option<ForeignExclusiveLock> {
    use std::os::unix::fs::OpenOptionsExt as _;

    use nix::fcntl::{fcntl, FcntlArg};

    /// SQLite's PENDING byte (`sqlite3PendingByte`, 1 GiB), as its unix VFS locks it.
    const PENDING_BYTE: i64 = 0x4000_0000;
    /// The first of the bytes SHARED and EXCLUSIVE lock, past PENDING and RESERVED.
    const SHARED_FIRST: i64 = PENDING_BYTE + 2;
    /// How many bytes SHARED and EXCLUSIVE lock.
    const SHARED_SIZE: i64 = 510;

    // Non-blocking: a FIFO swapped in under the path must not hang the start here either.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(database)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    [(PENDING_BYTE, 1), (SHARED_FIRST, SHARED_SIZE)]
        .into_iter()
        .find_map(|(start, len)| {
            let mut wanted = libc::flock {
                l_type: libc::F_RDLCK as libc::c_short,
                l_whence: libc::SEEK_SET as libc::c_short,
                l_start: start,
                l_len: len,
                l_pid: 0,
            };
            fcntl(&file, FcntlArg::F_GETLK(&mut wanted)).ok()?;
            (wanted.l_type != libc::F_UNLCK as libc::c_short).then(|| ForeignExclusiveLock {
                // An OFD lock's holder is reported as -1: no one process.
                holder: u32::try_from(wanted.l_pid).ok().filter(|pid| *pid > 0),
            })
        })
}

/// Elsewhere the lock is not looked at: SQLite's open waits its busy timeout, and its error is
/// explained by [`is_locked_by_another`].
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn foreign_exclusive_lock(_database: &Path) -> Option<ForeignExclusiveLock> {
    None
}

/// Wait up to `wait` for another process's exclusive lock on `database` to go (said once on
/// stderr, with `shown` as the file's name, when there is one), looking again every 50 ms, and
/// giving up at once when `stop_requested` says so.
pub(crate) fn wait_for_foreign_exclusive_lock(
    database: &Path,
    shown: &Path,
    wait: Duration,
    stop_requested: &dyn Fn() -> bool,
) -> LockWait {
    let deadline = Instant::now() + wait;
    let mut said = false;
    loop {
        let Some(lock) = foreign_exclusive_lock(database) else {
            return LockWait::Free;
        };
        if stop_requested() {
            return LockWait::Stopped;
        }
        if Instant::now() >= deadline {
            return LockWait::StillHeld(lock);
        }
        if !said {
            said = true;
            say_err!(
                "flightlog: the database {} is locked by {} so that no other process may read \
                 it; waiting up to {} for it to let go (--write-lock-wait-ms)",
                shown.display(),
                lock.describe_holder(),
                seconds(wait)
            );
        }
        std::thread::sleep(RETRY_PAUSE.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// Whether SQLite's open failed because another process held the file's lock (the moment
/// between [`foreign_exclusive_lock`] finding it free and SQLite's open, or a platform where it
/// is not looked at).
pub(crate) fn is_locked_by_another(err: &flightlog_core::activity::StoreError) -> bool {
    matches!(err, flightlog_core::activity::StoreError::Busy(_))
        || err.to_string().contains("database is locked")
}

/// The refusal of a start that found the database `shown` locked by `holder` (as
/// [`ForeignExclusiveLock::describe_holder`] names it) after waiting `waited` for it.
pub(crate) fn refusal(shown: &Path, holder: &str, waited: Duration) -> String {
    format!(
        "{holder} holds the lock of {} so that no other process may even read it, and did \
         not let go within {} (--write-lock-wait-ms, \
         FLIGHTLOG_WRITE_LOCK_WAIT_MS or `write_lock_wait_ms` in the config file). That is a \
         program with the file in SQLite's exclusive locking mode (`PRAGMA \
         locking_mode=EXCLUSIVE`) or in a long write transaction, such as a `sqlite3` shell \
         left inside `BEGIN EXCLUSIVE`: end its transaction or close it (`fuser {}` names the \
         processes that have the file open), then start again, or give a longer \
         --write-lock-wait-ms",
        shown.display(),
        seconds(waited),
        shown.display()
    )
}

/// `2.5 s`, `10 s`: a wait as the messages give it.
fn seconds(wait: Duration) -> String {
    format!("{} s", wait.as_secs_f64())
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;

    #[test]
    fn a_file_nobody_locks_is_free_and_a_missing_one_is_not_judged() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = dir.path().join("free.db");
        std::fs::write(&database, b"").expect("make the file");
        assert_eq!(foreign_exclusive_lock(&database), None);
        assert_eq!(foreign_exclusive_lock(&dir.path().join("missing.db")), None);
        assert_eq!(
            wait_for_foreign_exclusive_lock(&database, &database, Duration::ZERO, &|| false),
            LockWait::Free
        );
    }

    #[test]
    fn waits_report_their_seconds_as_given() {
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(seconds(Duration::from_secs(10)), "10 s");
        let message = refusal(
            Path::new("lx.db"),
            "another process (pid 7)",
            Duration::ZERO,
        );
        assert!(
            message.contains("pid 7") && message.contains("--write-lock-wait-ms"),
            "{message}"
        );
    }
}
