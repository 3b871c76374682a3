//! The database `flightlog serve` runs on: the one place the binary claims, opens and closes its
//! storage backend (today the embedded SQLite file).
//!
//! Why it exists: everything else the server does goes through the store traits
//! (`Arc<dyn ActivityStore>`, `Arc<dyn EngagementJournal>`), which name no backend. What the
//! traits do not cover is a backend's life around them: claiming the instance name (one live
//! server per instance on a database, or a boot sweep would close another live server's spans),
//! opening, being told the server is stopping, and closing cleanly with a word on what was left
//! behind. Keeping all of that here means a second backend (PostgreSQL, for several instances
//! behind a load balancer) is added in this file and in its own crate, and `serve.rs` stays as it
//! is: its claim would be a session advisory lock, its close the pool's.
//!
//! For SQLite the claim is an `flock` beside the file (`instance_lock`), taken before the file is
//! opened so a refused start changes nothing stored, and the file is opened under the lock of
//! its name (`file_name_lock`): a flightlog on another name of the same file (a hard link) is
//! refused, since SQLite keeps its `-wal` per name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flightlog_core::activity::ActivityStore;
use flightlog_core::journal::{EngagementJournal, RetentionConfig};
use flightlog_core::Clock;
use flightlog_server::settings::{Durability, ServeSettings};
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};

use crate::file_name_lock::FileNameLock;
use crate::instance_lock::{InstanceFileLock, InstanceLock, Renewal};

/// How long a start waits for another live server of its instance to let the instance go: one
/// stopping after SIGTERM finishes its requests in flight first (about 2 s under load), and a
/// restart that did not wait for the old process to exit was refused (an audit's finding).
const INSTANCE_WAIT: Duration = Duration::from_secs(5);

/// A stop signal came while the start waited for another process (a live server of the same
/// instance, or one holding the database's lock): the start was given up with nothing opened,
/// which is a clean stop. `serve` tells it apart from a refusal by its type.
#[derive(Debug)]
pub(crate) struct StoppedWhileStarting {
    /// What the start was waiting for, as the message says it.
    pub(crate) waiting_for: &'static str,
}

impl std::fmt::Display for StoppedWhileStarting {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "stopped while waiting for {}, before the database was opened",
            self.waiting_for
        )
    }
}

impl std::error::Error for StoppedWhileStarting {}

/// What a start waits for while another live server holds its instance.
const WAITING_FOR_INSTANCE: &str = "another live flightlog of this instance to stop";

/// `take` (an instance lock), tried again while another live server holds it, for up to `wait`
/// (said once on stderr), or until `stop_requested` says so (`Err(Stopped)`); the last answer.
fn wait_for_instance<T>(
    mut take: impl FnMut() -> Result<T, crate::instance_lock::InstanceLockError>,
    instance: &str,
    wait: Duration,
    stop_requested: &dyn Fn() -> bool,
) -> Result<T, crate::instance_lock::InstanceLockError> {
    let deadline = std::time::Instant::now() + wait;
    let mut said = false;
    loop {
        match take() {
            // A stop during the wait ends it at once: the wait is for the start, and the
            // operator who sent the stop no longer wants one (the start used to wait the 5 s
            // out, then exit 1 with "already served" after saying "shutting down").
            Err(_) if stop_requested() => {
                return Err(crate::instance_lock::InstanceLockError::Stopped)
            }
            Err(held) if std::time::Instant::now() >= deadline => return Err(held),
            Err(_) => {
                if !said {
                    said = true;
                    say_err!(
                        "flightlog: instance {instance} is held by another live flightlog on this \
                         database; waiting up to {} s for it to stop",
                        wait.as_secs()
                    );
                }
                std::thread::sleep(crate::instance_lock::RETRY_PAUSE);
            }
            taken => return taken,
        }
    }
}

/// How often the instance's lock file is looked at (see [`Backend::keep_claim`]).
const CLAIM_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long the database's close may take at a stop before the server says what it waits for.
const SLOW_CLOSE_NOTICE: Duration = Duration::from_secs(1);

/// The claimed and opened database of one server. Its locks are held until it is dropped, which
/// is after [`Backend::close`] at a clean stop, and at the process's end otherwise (the kernel
/// drops an `flock` with its process, a crash or SIGKILL included).
pub(crate) struct Backend {
    db: Arc<SqliteDatabase>,
    /// The path as given (`--db`), for messages.
    path: PathBuf,
    /// The path with its symbolic links resolved, where the side files live.
    real_path: PathBuf,
    write_lock_wait: Duration,
    /// Shared with the task that renews it (see [`Backend::keep_claim`]), which holds it only
    /// weakly: it is let go when the backend is dropped.
    instance_lock: Option<Arc<InstanceLock>>,
    /// The instance's byte of the database file (see `instance_lock`).
    instance_byte: Option<InstanceFileLock>,
    _name_lock: Option<FileNameLock>,
}

/// Say on stderr what a renewal of the instance's lock found (see [`Backend::keep_claim`]).
/// `holds_byte`: this server holds the instance's byte of the database file, which no second
/// server of the instance can take while it runs.
fn tell_renewal(renewal: &Renewal, instance: &str, lock_file: &Path, holds_byte: bool) {
    match renewal {
        Renewal::Intact => {}
        Renewal::Restored => say_err!(
            "flightlog: warning: the lock file of instance {instance}, {}, was deleted or \
             replaced while this server runs; made again. While it was missing a second server \
             of instance {instance} could have started and closed this one's open spans: \
             leave the lock files of live servers alone (a stopped server removes its own)",
            lock_file.display()
        ),
        // The newcomer made a lock file and waits for the byte this server holds, then is
        // refused: "two servers are instance …" made an operator stop a healthy server (an
        // audit's finding).
        Renewal::TakenByAnother if holds_byte => say_err!(
            "flightlog: warning: the lock file of instance {instance}, {}, was deleted while this \
             server runs, and another process has made and locked one since: a second server \
             of instance {instance} is starting on this database. It cannot take the instance \
             while this server runs (this server holds the instance's lock in the database \
             file), so it is refused; this server then makes its lock file again",
            lock_file.display()
        ),
        Renewal::TakenByAnother => say_err!(
            "flightlog: error: the lock file of instance {instance}, {}, was deleted while this \
             server runs, and another live flightlog has taken instance {instance} since: two \
             servers are instance {instance} on this database, and each start of one closes \
             the other's open spans as interrupted. Stop one of them, or give it another \
             --instance",
            lock_file.display()
        ),
        Renewal::CannotRestore(why) => say_err!(
            "flightlog: warning: the lock file of instance {instance} was deleted while this \
             server runs and {why}; a second server of instance {instance} could start and \
             close this one's open spans. Tried again every second"
        ),
    }
}

impl Backend {
    /// Claim `instance` on the database `settings` name, then open it (creating it if needed).
    /// A claim refused (another live server of the instance) opens nothing. The waits of the
    /// start (for another server of the instance to stop, for another process's lock on the
    /// file) end early when `stop_requested` says so, with a [`StoppedWhileStarting`] error.
    pub(crate) fn claim_and_open(
        settings: &ServeSettings,
        instance: &str,
        stop_requested: &dyn Fn() -> bool,
    ) -> anyhow::Result<Self> {
        // Beside the file itself, as SQLite's own files are: a server reaching the file through
        // a symbolic link takes the same lock as one given its real path.
        let real_path = flightlog_sqlite::real_database_path(&settings.db);
        let instance_lock = match wait_for_instance(
            || crate::instance_lock::lock_instance(&real_path, instance),
            instance,
            INSTANCE_WAIT,
            stop_requested,
        ) {
            Ok(lock) => lock,
            Err(crate::instance_lock::InstanceLockError::Stopped) => {
                return Err(StoppedWhileStarting {
                    waiting_for: WAITING_FOR_INSTANCE,
                }
                .into())
            }
            Err(crate::instance_lock::InstanceLockError::Held { lock_file }) => anyhow::bail!(
                "instance {instance} is already served by another live flightlog on {} (it \
                 holds {}, and did not stop within {} s): its boot would close that server's \
                 open spans as interrupted. Give this server another name with --instance \
                 (FLIGHTLOG_INSTANCE, `instance` in the config file), or stop the other one \
                 first",
                settings.db.display(),
                lock_file.display(),
                INSTANCE_WAIT.as_secs()
            ),
        };
        let mut sqlite = SqliteConfig::new(&settings.db);
        sqlite.lock_retry_budget = settings.write_lock_wait;
        sqlite.durability = match settings.durability {
            Durability::Normal => flightlog_sqlite::Durability::Normal,
            Durability::Full => flightlog_sqlite::Durability::Full,
        };
        let (db, name_lock) = crate::file_name_lock::open_under_name_lock(&real_path, || {
            open_once_not_locked_by_another(
                sqlite,
                &settings.db,
                settings.write_lock_wait,
                stop_requested,
            )
            .with_context(|| {
                format!(
                    "cannot open the database {} (--db, FLIGHTLOG_DB or `db` in the config file)",
                    settings.db.display()
                )
            })
        })?;
        // Before the boot's sweep: a server of the instance that got past a deleted lock file
        // (see `instance_lock`) is refused here.
        let instance_byte = match crate::instance_lock::lock_instance_in_file(
            &real_path,
            instance,
            INSTANCE_WAIT,
            stop_requested,
        ) {
            Ok(lock) => lock,
            Err(crate::instance_lock::InstanceLockError::Stopped) => {
                return Err(StoppedWhileStarting {
                    waiting_for: WAITING_FOR_INSTANCE,
                }
                .into())
            }
            Err(crate::instance_lock::InstanceLockError::Held { .. }) => anyhow::bail!(
                "instance {instance} is already served by another live flightlog on {} (it \
                 holds the instance's lock in the database file, and did not stop within {} s; \
                 its lock file beside the file was deleted): its boot would close that \
                 server's open spans as interrupted. Give this server another name with \
                 --instance (FLIGHTLOG_INSTANCE, `instance` in the config file), or stop the \
                 other one first",
                settings.db.display(),
                INSTANCE_WAIT.as_secs()
            ),
        };
        Ok(Self {
            db,
            path: settings.db.clone(),
            real_path,
            write_lock_wait: settings.write_lock_wait,
            instance_lock: instance_lock.map(Arc::new),
            instance_byte,
            _name_lock: name_lock,
        })
    }

    /// Open the database at `path` with the default settings and claim no instance: for
    /// `flightlog demo`, which runs no sweep of earlier lives (still refused while a flightlog
    /// uses the file under another name, as `serve` is).
    pub(crate) fn open_unclaimed(path: &Path) -> anyhow::Result<Self> {
        let real_path = flightlog_sqlite::real_database_path(path);
        let config = SqliteConfig::new(path);
        let write_lock_wait = config.lock_retry_budget;
        let (db, name_lock) = crate::file_name_lock::open_under_name_lock(&real_path, || {
            // The demo listens for no stop signal: Ctrl-C ends it as it ends any program.
            open_once_not_locked_by_another(config, path, write_lock_wait, &|| false)
                .with_context(|| format!("cannot open database {}", path.display()))
        })?;
        Ok(Self {
            db,
            path: path.to_path_buf(),
            real_path,
            write_lock_wait,
            instance_lock: None,
            instance_byte: None,
            _name_lock: name_lock,
        })
    }

    /// The database as messages name it (`database <this>`).
    pub(crate) fn describe(&self) -> String {
        self.path.display().to_string()
    }

    /// The activity store over this database, writing as `writer`, on `clock`.
    pub(crate) fn activity(&self, clock: Arc<dyn Clock>, writer: &str) -> Arc<dyn ActivityStore> {
        Arc::new(SqliteActivityStore::with_identity(
            Arc::clone(&self.db),
            clock,
            writer,
        ))
    }

    /// The engagement journal over this database, keeping `retention`, on `clock`.
    pub(crate) fn journal(
        &self,
        retention: RetentionConfig,
        clock: Arc<dyn Clock>,
    ) -> Arc<dyn EngagementJournal> {
        Arc::new(SqliteEngagementJournal::new(Arc::clone(&self.db), retention).with_clock(clock))
    }

    /// Say on stderr what is unsafe about how the database is reached (see
    /// [`hard_link_warning`]).
    pub(crate) fn warn_of_risks(&self) {
        if let Some(warning) = hard_link_warning(&self.real_path) {
            say_err!("{warning}");
        }
    }

    /// The claim of `instance` kept up while the server runs: every second its lock file is
    /// looked at and made again when it was deleted (`InstanceLock::renew`), and what was found
    /// is said on stderr (once while it lasts). Ends when the backend is dropped. `None` when
    /// no lock was taken.
    pub(crate) fn keep_claim(
        &self,
        instance: &str,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let lock = Arc::downgrade(self.instance_lock.as_ref()?);
        let instance = instance.to_owned();
        let holds_byte = self.instance_byte.is_some();
        Some(async move {
            let mut ticks = tokio::time::interval(CLAIM_CHECK_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last = Renewal::Intact;
            loop {
                ticks.tick().await;
                let Some(lock) = lock.upgrade() else {
                    return;
                };
                let renewal = lock.renew();
                if renewal != last {
                    tell_renewal(&renewal, &instance, lock.path(), holds_byte);
                }
                last = match renewal {
                    // Restored is news once; the file is then intact.
                    Renewal::Restored => Renewal::Intact,
                    other => other,
                };
            }
        })
    }

    /// A callback for the moment the server starts stopping: from then on a write behind
    /// another process's write lock waits at most 2 s, so the requests in flight are answered
    /// (503) within the shutdown's grace instead of cut off after it.
    pub(crate) fn on_stop(&self) -> impl FnOnce() + Send + 'static {
        let db = Arc::clone(&self.db);
        move || db.shutting_down()
    }

    /// Close the database once nothing uses it any more: the writes still queued are done, then
    /// the file is left complete on its own (the WAL copied into it), so that copying the stopped
    /// server's file is a backup of everything it acknowledged. A close that takes long is
    /// explained as it happens, and one that leaves writes in the `-wal` says why and what is
    /// kept.
    pub(crate) async fn close(self) -> anyhow::Result<()> {
        let closing = self.db.close();
        tokio::pin!(closing);
        let closed = tokio::select! {
            closed = &mut closing => closed,
            () = tokio::time::sleep(SLOW_CLOSE_NOTICE) => {
                say!(
                    "flightlog: still closing the database: finishing the writes queued before \
                     the stop, then copying the WAL into the file; another process holding the \
                     database's lock makes the writes wait up to {} s and the copy up to 5 s; a \
                     second Ctrl-C or SIGTERM stops at once",
                    flightlog_sqlite::SHUTDOWN_LOCK_WAIT
                        .min(self.write_lock_wait)
                        .as_secs_f64()
                );
                closing.await
            }
        };
        match closed {
            Ok(true) => Ok(()),
            Ok(false) => {
                let (why, outcome) = why_the_wal_stayed(&self.path);
                say_err!(
                    "flightlog: warning: the newest writes stay in the -wal file beside {} \
                     ({why}); {outcome}",
                    self.path.display()
                );
                Ok(())
            }
            Err(err) => Err(anyhow::anyhow!(
                "the database could not be closed cleanly: {err}"
            )),
        }
    }
}

/// Open the SQLite database `config` names once no other process holds its lock so that no one
/// else may read it (see `foreign_exclusive_lock`), waiting up to `wait` for that (the write
/// lock's wait, `--write-lock-wait-ms`: the same kind of wait, for the same kind of process),
/// or until `stop_requested` says so. `shown` names the file in messages. A lock still held,
/// or taken in the moment before SQLite's open, is refused saying whose it is and what to do.
fn open_once_not_locked_by_another(
    config: SqliteConfig,
    shown: &Path,
    wait: Duration,
    stop_requested: &dyn Fn() -> bool,
) -> anyhow::Result<Arc<SqliteDatabase>> {
    use crate::foreign_exclusive_lock::{refusal, wait_for_foreign_exclusive_lock, LockWait};
    match wait_for_foreign_exclusive_lock(&config.path, shown, wait, stop_requested) {
        LockWait::Free => {}
        LockWait::StillHeld(lock) => {
            anyhow::bail!(refusal(shown, &lock.describe_holder(), wait))
        }
        LockWait::Stopped => {
            return Err(StoppedWhileStarting {
                waiting_for: "another process to let go of the database's lock",
            }
            .into())
        }
    }
    SqliteDatabase::open(config).map_err(|err| {
        if crate::foreign_exclusive_lock::is_locked_by_another(&err) {
            anyhow::anyhow!(refusal(shown, "another process", wait))
        } else {
            err.into()
        }
    })
}

/// Why a clean close left writes in the `-wal` file, and what that means for them, where it can
/// be told: a file whose permissions were taken away while serving was blamed on readers or the
/// disk.
fn why_the_wal_stayed(path: &Path) -> (&'static str, &'static str) {
    // EROFS: the file system was made read-only under the server, typically by the kernel
    // after an I/O error: writes the kernel held then may never have reached the disk, so
    // "nothing is lost" would be a promise it cannot keep (an audit lost 156 of 4,159
    // acknowledged spans that way under `normal` durability).
    const READ_ONLY_FILE_SYSTEM: i32 = 30;
    const KEPT: &str =
        "nothing is lost: the next start reads them, and a backup must copy both files";
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(_) => (
            "another process is reading the database, or there was no room to copy them into it",
            KEPT,
        ),
        Err(err) if err.raw_os_error() == Some(READ_ONLY_FILE_SYSTEM) => (
            "the file system holding it became read-only while serving, as the kernel makes one \
             after a disk error: check the disk (dmesg) and remount it writable",
            "writes acknowledged since the last sync may not have reached the disk (--durability \
             full syncs each one); the next start on a writable file system reads what did",
        ),
        Err(_) => (
            "the database file is no longer writable by this user: its permissions changed \
             while serving; make it writable again (chmod u+w) and start and stop the server \
             once to copy them in",
            KEPT,
        ),
    }
}

/// The warning for a database file with other hard links (`serve` and `demo` say it): SQLite
/// names its `-wal` and `-shm`, and with them its locks, after the name a process opened, so two
/// processes on two names of one file write it unaware of each other: one's writes are lost to
/// the other (an audit lost 20 acknowledged writes that way), and the file itself is damaged
/// ("2nd reference to page", found by another; the instance lock, named after the file, does
/// not see it either). A flightlog on another name of a file in use is refused
/// (`file_name_lock`); the warning is for the rest (`sqlite3`, a tool on the other name later).
/// A link alone is not refused: a backup tool may link the file on purpose, and one name in use
/// is safe.
pub(crate) fn hard_link_warning(db: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let links = std::fs::metadata(db).ok()?.nlink();
    (links > 1).then(|| {
        format!(
            "flightlog: warning: {} has {links} hard links: every process (servers, demos, \
             sqlite3) must open it by this one name: SQLite keeps its -wal file and its locks \
             per name, so processes on two names at once lose each other's writes and damage \
             the file",
            db.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance_lock::InstanceLockError;

    fn held() -> InstanceLockError {
        InstanceLockError::Held {
            lock_file: PathBuf::from("x.lock"),
        }
    }

    /// A server of the instance that stops within the wait lets the start go on; one that does
    /// not is refused once the wait is over.
    #[test]
    fn a_start_waits_for_a_stopping_server_of_its_instance_then_gives_up() {
        let mut tries = 0;
        let taken = wait_for_instance(
            || {
                tries += 1;
                if tries < 3 {
                    Err(held())
                } else {
                    Ok(tries)
                }
            },
            "x",
            Duration::from_secs(5),
            &|| false,
        );
        assert!(matches!(taken, Ok(3)), "{taken:?}");
        let started = std::time::Instant::now();
        let refused = wait_for_instance(
            || Err::<(), _>(held()),
            "x",
            Duration::from_millis(200),
            &|| false,
        );
        assert!(matches!(refused, Err(InstanceLockError::Held { .. })));
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    /// A stop asked for while the start waits for its instance ends the wait at the next try,
    /// not when the wait is over.
    #[test]
    fn a_stop_ends_the_wait_for_the_instance_at_once() {
        let started = std::time::Instant::now();
        let stopped = wait_for_instance(
            || Err::<(), _>(held()),
            "x",
            Duration::from_secs(30),
            &|| started.elapsed() >= Duration::from_millis(100),
        );
        assert!(matches!(stopped, Err(InstanceLockError::Stopped)));
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
