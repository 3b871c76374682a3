//! One name per database file among the flightlog processes using it.
//!
//! Why it exists: SQLite keeps a database's write-ahead log (`-wal`) and shared-memory index
//! (`-shm`), and with them every lock, beside the *name* a process opened, not the file. Two
//! processes reaching one file through two hard links each write their own `-wal`, unaware of the
//! other: both acknowledge writes, hand out the same change ids, and a restart keeps one side's
//! writes only (an audit lost 3 of 6 acknowledged spans that way; the file itself can be damaged).
//! A warning at start was all there was. Several processes on one *name* are safe (SQLite
//! coordinates them), so that stays allowed: servers of different instances, a demo beside a
//! server.
//!
//! How: every flightlog process (each `serve`, each `demo`) holds, for as long as it runs, a
//! shared `flock` on the database file itself, which follows the file whatever its name, and a
//! shared `flock` on a small file beside the name it uses (`<db>-name.lock`), which follows the
//! name. A process about to open the database tries an exclusive lock on the file: when it is
//! held, someone uses the file; when, then, an exclusive lock on its own name's lock file is
//! free, nobody uses that name, so the users are on another name, and the process refuses to
//! start. `flock` locks are the kernel's, dropped when a process ends in any way, and Linux keeps
//! them apart from the POSIX record locks SQLite takes on the same file.
//!
//! The descriptor of the database file is never closed while the process runs: closing any
//! descriptor of a file drops every POSIX lock the process holds on it, SQLite's included.
//! Processes other than flightlog's (the `sqlite3` shell) take no part; a folder where the
//! name's lock file cannot be made leaves the process unguarded; a `-wal` a crashed process
//! left beside another name is not seen (the warning of hard links says to keep to one
//! name). Two processes starting
//! at the same moment can slip past the check: one on the other name within the microseconds a
//! lock is converted, or two on one name while a third runs on another.

use std::fs::{File, OpenOptions, TryLockError};
use std::mem::ManuallyDrop;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a refusal is checked again before it stands: a process on this name may be between
/// taking its two locks, which looks, for that moment, like a user on another name.
const REFUSAL_CHECKS: usize = 5;
/// The pause between two of those checks.
const RECHECK_PAUSE: Duration = Duration::from_millis(20);

/// How long a process joining others on the file waits for their `-shm` to show before it
/// concludes it was deleted: another process may be between its locks and SQLite's open (which
/// may wait for another program's lock), or stopping (its close removed the `-shm` before the
/// process ended and its locks with it).
const SHM_WAIT: Duration = Duration::from_secs(5);

/// Why the database may not be opened under this name.
#[derive(Debug)]
pub enum FileNameLockError {
    /// Another flightlog process uses the file under another name (a hard link).
    OtherName { database: PathBuf, links: u64 },
    /// Other flightlog processes use the file, and its `-shm` is not there: it was deleted
    /// under them.
    ShmDeleted { database: PathBuf },
}

impl std::fmt::Display for FileNameLockError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OtherName { database, links } => write!(
                formatter,
                "{} is in use by another process under another name (a flightlog, or a \
                 program holding a lock on the file): the file has \
                 {links} hard links, and SQLite keeps its write-ahead log beside the name, so two \
                 names would lose each other's writes. Use the name the other process uses, or \
                 stop it first (`ls -i` shows the names that share the file's inode number)",
                database.display()
            ),
            Self::ShmDeleted { database } => write!(
                formatter,
                "{} is in use by another flightlog process, and its shared-memory index (its \
                 `-shm` file) has been deleted under it: SQLite coordinates the processes on a \
                 file through that index, so a process opening the file now would make another \
                 one, unseen by the first, and the two would damage the file. Stop the other \
                 flightlog cleanly (Ctrl-C or SIGTERM; it loses nothing) and start again; and \
                 leave a live database's `-shm` and `-wal` files alone",
                database.display()
            ),
        }
    }
}

impl std::error::Error for FileNameLockError {}

/// The held locks. Dropping it removes the name's lock file when no other process holds it; the
/// database file's descriptor is left open until the process ends (see the module comment).
#[derive(Debug)]
pub struct FileNameLock {
    /// Never closed: see the module comment.
    _database: ManuallyDrop<File>,
    name_file: Option<File>,
    name_path: PathBuf,
}

impl Drop for FileNameLock {
    fn drop(&mut self) {
        if let Some(name_file) = self.name_file.take() {
            // The last user of the name removes its file, while holding it exclusively, so no
            // one locks the old file between (a later locker checks it is still at the path).
            if name_file.try_lock().is_ok() {
                let _ = std::fs::remove_file(&self.name_path);
            }
        }
    }
}

/// The lock file of the name `database` (the real path: symbolic links resolved, as SQLite
/// resolves them): `<database>-name.lock`.
pub fn name_lock_path(database: &Path) -> PathBuf {
    flightlog_sqlite::side_file_path(database, "-name.lock")
}

/// Take the locks of `database` under its name. `Ok(None)` when there is no file yet (call again
/// once it is created: no other name can reach a file that does not exist) or a lock cannot be
/// taken at all (a folder without write access: opening the database then fails with the real
/// reason, or the process runs without this guard).
pub fn lock_file_name(database: &Path) -> Result<Option<FileNameLock>, FileNameLockError> {
    let name_path = name_lock_path(database);
    // Whether other processes use the file on this name (their `-shm` must then be there).
    let mut joined_others = false;
    // Only a regular file (or a link to one) can be a database, and only one is opened here: an
    // `open` of a FIFO blocks until a writer comes, so a FIFO given as the database hung the
    // start before SQLite's check could say "not a regular file", and no stop signal ended it
    // (an audit's finding). Anything else is left to that check.
    if std::fs::metadata(database).is_ok_and(|metadata| !metadata.is_file()) {
        return Ok(None);
    }
    for _ in 0..REFUSAL_CHECKS {
        let Ok(database_file) = open_without_blocking(database) else {
            return Ok(None);
        };
        // Swapped for a FIFO or a device since the check above: no database, and so no SQLite
        // of this process on it either (the descriptor may be closed).
        if !database_file
            .metadata()
            .is_ok_and(|metadata| metadata.is_file())
        {
            return Ok(None);
        }
        // Never closed, on any path: this process may already have the file open in SQLite.
        let database_file = ManuallyDrop::new(database_file);
        let Ok(name_file) = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&name_path)
        else {
            return Ok(None);
        };
        match database_file.try_lock() {
            Ok(()) => {
                // Nobody else uses the file. Name first, so that from the moment the file's
                // lock is shared a checker finds this process on its name.
                if name_file.lock_shared().is_err() {
                    return Ok(None);
                }
                if database_file.unlock().is_err() || database_file.lock_shared().is_err() {
                    return Ok(None);
                }
            }
            Err(TryLockError::WouldBlock) => match name_file.try_lock() {
                Ok(()) => {
                    // Users of the file, none of this name: another name, or one of this name
                    // between its two locks. Checked again before refusing.
                    drop(name_file);
                    std::thread::sleep(RECHECK_PAUSE);
                    continue;
                }
                Err(TryLockError::WouldBlock) => {
                    if name_file.lock_shared().is_err() || database_file.lock_shared().is_err() {
                        return Ok(None);
                    }
                    joined_others = true;
                }
                Err(TryLockError::Error(_)) => return Ok(None),
            },
            Err(TryLockError::Error(_)) => return Ok(None),
        }
        if same_file(&name_file, &name_path) {
            let lock = FileNameLock {
                _database: database_file,
                name_file: Some(name_file),
                name_path,
            };
            // An audit deleted the `-shm` under a live server and started a second one: each
            // had its own index, neither saw the other's locks, and the file was damaged
            // ("database disk image is malformed"), `/healthz` saying ok on both.
            if joined_others && !shm_shows_or_others_leave(database, &lock._database) {
                // The file's descriptor stays open (see the module comment), its lock does not.
                let _ = lock._database.unlock();
                return Err(FileNameLockError::ShmDeleted {
                    database: database.to_path_buf(),
                });
            }
            return Ok(Some(lock));
        }
        // The last user removed the name's file between our open and our lock: the lock
        // held is on a file nobody else will see. Again, with the file at the path (the
        // file's lock released first: the next try would find it held, by this process).
        let _ = database_file.unlock();
    }
    let links = std::fs::metadata(database).map_or(0, |metadata| metadata.nlink());
    if links <= 1 {
        // One name only: the exclusive lock was a moment's, or the file's other names are gone.
        return Ok(None);
    }
    // The name's lock file this refused start may have made: removed when no one uses it.
    if let Ok(name_file) = File::open(&name_path) {
        if name_file.try_lock().is_ok() && same_file(&name_file, &name_path) {
            let _ = std::fs::remove_file(&name_path);
        }
    }
    Err(FileNameLockError::OtherName {
        database: database.to_path_buf(),
        links,
    })
}

/// Open `database` for reading with `O_NONBLOCK`, which returns at once where a plain `open`
/// would wait (a FIFO with no writer); on a regular file it changes nothing (`flock` and
/// reads of a regular file never block on it). Where `libc` is not a dependency, a plain open
/// (the file type was checked just before).
fn open_without_blocking(database: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(database)
}

/// Whether the database's `-shm` is there, or comes within [`SHM_WAIT`] (a process that has
/// just taken its locks makes it when SQLite opens the file), or the other users leave
/// meanwhile (this process, `database_file` locked shared, then holds the file alone: a
/// stopping server's close removes its `-shm` before its locks go).
fn shm_shows_or_others_leave(database: &Path, database_file: &File) -> bool {
    let mut shm = database.as_os_str().to_owned();
    shm.push("-shm");
    let shm = PathBuf::from(shm);
    let deadline = std::time::Instant::now() + SHM_WAIT;
    loop {
        if shm.exists() {
            return true;
        }
        // Alone now: an exclusive lock is had (a conversion of this process's shared one),
        // and given back as shared, as the lock of a process that found the file free.
        if database_file.try_lock().is_ok() {
            return database_file.lock_shared().is_ok();
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(RECHECK_PAUSE);
    }
}

/// Open the database with `open` under the name's locks: taken before, when the file exists (so
/// a refusal comes before SQLite touches the file), else once `open` has created it.
pub fn open_under_name_lock<T, E: Into<anyhow::Error>>(
    database: &Path,
    open: impl FnOnce() -> Result<T, E>,
) -> anyhow::Result<(T, Option<FileNameLock>)> {
    let before = lock_file_name(database)?;
    let opened = open().map_err(Into::into)?;
    let lock = match before {
        Some(lock) => Some(lock),
        None => lock_file_name(database)?,
    };
    Ok((opened, lock))
}

/// Whether `file` is still the file at `path` (not removed, nor replaced, since it was opened).
pub(crate) fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(held), Ok(at_path)) => held.dev() == at_path.dev() && held.ino() == at_path.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database file and its `-shm`, as a process using it in WAL mode keeps them.
    fn database_in(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, b"").expect("make the database file");
        std::fs::write(dir.join(format!("{name}-shm")), b"").expect("make the -shm");
        path
    }

    #[test]
    fn several_users_of_one_name_are_allowed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = database_in(dir.path(), "flightlog.db");
        let first = lock_file_name(&database).expect("free");
        assert!(first.is_some());
        let second = lock_file_name(&database).expect("the same name");
        assert!(second.is_some());
        drop(first);
        assert!(
            name_lock_path(&database).exists(),
            "the second still uses it"
        );
        drop(second);
        assert!(
            !name_lock_path(&database).exists(),
            "the last user removes it"
        );
    }

    #[test]
    fn a_user_under_another_name_is_refused_until_the_first_name_is_free() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let first_name = database_in(dir.path(), "h1.db");
        let second_name = dir.path().join("h2.db");
        std::fs::hard_link(&first_name, &second_name).expect("link the file");
        let first = lock_file_name(&first_name).expect("free");
        assert!(first.is_some());
        let refused = lock_file_name(&second_name);
        let Err(FileNameLockError::OtherName { links, .. }) = &refused else {
            panic!("expected a refusal, got {refused:?}");
        };
        assert_eq!(*links, 2);
        let message = refused.err().map(|err| err.to_string()).unwrap_or_default();
        assert!(
            message.contains("h2.db") && message.contains("another name"),
            "{message}"
        );
        // The refused process left no lock behind: the first name still works for others,
        // and the second name's lock file it made is gone.
        assert!(lock_file_name(&first_name).expect("same name").is_some());
        assert!(!name_lock_path(&second_name).exists());
        drop(first);
    }

    /// Its `-shm` deleted under a live user, a second one is refused (it would make an index
    /// of its own and the two would damage the file). (A process alone on the file takes its
    /// lock exclusively and never looks: the binary's tests start servers on fresh files.)
    #[test]
    fn a_second_user_is_refused_when_the_shm_was_deleted_under_the_first() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let database = database_in(dir.path(), "flightlog.db");
        let shm = dir.path().join("flightlog.db-shm");
        let first = lock_file_name(&database).expect("free");
        assert!(first.is_some());
        std::fs::remove_file(&shm).expect("delete the -shm");
        let refused = lock_file_name(&database);
        let Err(err @ FileNameLockError::ShmDeleted { .. }) = &refused else {
            panic!("expected a refusal, got {refused:?}");
        };
        assert!(err.to_string().contains("-shm"), "{err}");
        assert!(
            name_lock_path(&database).exists(),
            "the first still holds its name"
        );
        // With an index there (the first one's, as ever), a second user joins.
        std::fs::write(&shm, b"").expect("make the -shm");
        assert!(lock_file_name(&database).expect("joins").is_some());
        drop(first);
    }

    /// A FIFO is no database: left to SQLite's open to refuse, at once (its `open` used to
    /// wait here for a writer that never came).
    #[test]
    fn a_fifo_is_left_alone_without_waiting() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let fifo = dir.path().join("f.db");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success());
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(matches!(lock_file_name(&fifo), Ok(None)));
        });
        assert_eq!(
            finished.recv_timeout(Duration::from_secs(10)),
            Ok(true),
            "a FIFO is not taken as a database, and not waited on"
        );
    }

    #[test]
    fn a_missing_file_or_folder_is_not_a_refusal() {
        let dir = tempfile::tempdir().expect("a temp dir");
        assert!(matches!(
            lock_file_name(&dir.path().join("not-yet.db")),
            Ok(None)
        ));
        assert!(matches!(
            lock_file_name(Path::new("/nonexistent-flightlog-folder/flightlog.db")),
            Ok(None)
        ));
    }
}
