//! The conformance suite: every fixture in the fixture folder on every backend.
//!
//! Prints one line per store and backend, `conformance: <store> <backend>: N fixtures passed`,
//! and fails (non-zero exit) when any fixture fails or the folder holds no fixture at all.
//! Then the same for a fixed set of scenarios the reference itself records at this run
//! (`flightlog_conformance::reference`: seeded random ones and the journal's edge set, with
//! the reference on Bun), labelled `reference-recorded`. `FLIGHTLOG_CONFORMANCE_DIR` points it
//! at another folder of the same format, and then only that folder is replayed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use flightlog_conformance::activity::{replay_activity_fixture, replay_activity_fixture_reopening};
use flightlog_conformance::fixtures::{conformance_dir, load_fixtures, Fixture};
use flightlog_conformance::journal::{replay_journal_fixture, replay_journal_fixture_reopening};
use flightlog_conformance::reference::record_reference_scenarios;
use flightlog_core::activity::ActivityStore;
use flightlog_core::journal::{EngagementJournal, InMemoryEngagementJournal, RetentionConfig};
use flightlog_core::ManualClock;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};

fn report(label: &str, passed: usize, failures: &[String]) -> bool {
    for failure in failures {
        eprintln!("conformance: {label}: FAILED {failure}");
    }
    if failures.is_empty() {
        println!("conformance: {label}: {passed} fixtures passed");
        true
    } else {
        println!(
            "conformance: {label}: {passed} fixtures passed, {} failed",
            failures.len()
        );
        false
    }
}

/// Each `store` fixture under `dir` replayed by `replay(fixture, a database path of its own in a
/// scratch folder)`: how many passed, and one message per failure.
async fn each_fixture(
    dir: &Path,
    store: &str,
    mut replay: impl AsyncFnMut(&Fixture, PathBuf) -> Result<(), String>,
) -> Result<(usize, Vec<String>), String> {
    let fixtures = load_fixtures(dir, store)?;
    let scratch = tempfile::tempdir().map_err(|err| format!("temp dir: {err}"))?;
    let mut passed = 0;
    let mut failures = Vec::new();
    for (index, (path, fixture)) in fixtures.iter().enumerate() {
        let db_path = scratch.path().join(format!("{store}-{index}.db"));
        match replay(fixture, db_path).await {
            Ok(()) => passed += 1,
            Err(err) => failures.push(format!("{} ({}): {err}", fixture.name, path.display())),
        }
    }
    Ok((passed, failures))
}

async fn activity_sqlite(dir: &Path) -> Result<(usize, Vec<String>), String> {
    each_fixture(dir, "activity", async |fixture, db_path| {
        replay_activity_fixture(fixture, |clock, writer| {
            let db =
                SqliteDatabase::open(SqliteConfig::new(&db_path)).map_err(|e| e.to_string())?;
            let store: Arc<dyn ActivityStore> =
                Arc::new(SqliteActivityStore::with_identity(db, clock, writer));
            Ok(store)
        })
        .await
    })
    .await
}

/// How often the reopening backends close and reopen their database file (in steps): often
/// enough that most writes meet a fresh open within a few steps, seldom enough to keep the suite
/// quick.
const REOPEN_EVERY: usize = 5;

/// One fixture's database file, opened anew by each [`Self::reopen`] after the previous opening
/// is closed.
#[derive(Clone)]
struct ReopenedFile {
    path: PathBuf,
    open: Arc<Mutex<Option<Arc<SqliteDatabase>>>>,
}

impl ReopenedFile {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            open: Arc::default(),
        }
    }

    async fn reopen(&self) -> Result<Arc<SqliteDatabase>, String> {
        let previous = self.open.lock().map_err(|e| e.to_string())?.take();
        if let Some(previous) = previous {
            previous.close().await.map_err(|e| format!("close: {e}"))?;
        }
        let db = SqliteDatabase::open(SqliteConfig::new(&self.path))
            .map_err(|e| format!("open: {e}"))?;
        *self.open.lock().map_err(|e| e.to_string())? = Some(Arc::clone(&db));
        Ok(db)
    }
}

/// Every activity fixture on SQLite again, the database closed and reopened every
/// [`REOPEN_EVERY`] steps: a result that changes across a reopen came from memory the file
/// does not back (a writer cache, a counter, a filter), which the reference does not have.
async fn activity_sqlite_reopened(dir: &Path) -> Result<(usize, Vec<String>), String> {
    each_fixture(dir, "activity", async |fixture, db_path| {
        let file = ReopenedFile::new(db_path);
        let make = |clock: Arc<ManualClock>, writer: String| {
            let file = file.clone();
            async move {
                let db = file.reopen().await?;
                let store: Arc<dyn ActivityStore> =
                    Arc::new(SqliteActivityStore::with_identity(db, clock, &writer));
                Ok(store)
            }
        };
        replay_activity_fixture_reopening(fixture, make, Some(REOPEN_EVERY)).await
    })
    .await
}

/// Every journal fixture on SQLite again, reopened every [`REOPEN_EVERY`] steps (see
/// [`activity_sqlite_reopened`]).
async fn journal_sqlite_reopened(dir: &Path) -> Result<(usize, Vec<String>), String> {
    each_fixture(dir, "journal", async |fixture, db_path| {
        let file = ReopenedFile::new(db_path);
        let make = |retention: RetentionConfig| {
            let file = file.clone();
            async move {
                let db = file.reopen().await?;
                let journal: Arc<dyn EngagementJournal> =
                    Arc::new(SqliteEngagementJournal::new(db, retention));
                Ok(journal)
            }
        };
        replay_journal_fixture_reopening(fixture, make, Some(REOPEN_EVERY)).await
    })
    .await
}

async fn journal_memory(dir: &Path) -> Result<(usize, Vec<String>), String> {
    let make = |retention: RetentionConfig| -> Arc<dyn EngagementJournal> {
        Arc::new(InMemoryEngagementJournal::new(retention))
    };
    each_fixture(dir, "journal", async |fixture, _| {
        replay_journal_fixture(fixture, &make).await
    })
    .await
}

/// Every journal fixture on the SQLite journal, each on a fresh database file.
async fn journal_sqlite(dir: &Path) -> Result<(usize, Vec<String>), String> {
    each_fixture(dir, "journal", async |fixture, db_path| {
        let db = SqliteDatabase::open(SqliteConfig::new(&db_path))
            .map_err(|err| format!("open: {err}"))?;
        // The factory cannot fail, so the file is opened first and the factory only wraps it.
        let make = |retention: RetentionConfig| -> Arc<dyn EngagementJournal> {
            Arc::new(SqliteEngagementJournal::new(Arc::clone(&db), retention))
        };
        replay_journal_fixture(fixture, &make).await
    })
    .await
}

/// Every fixture under `dir` on every backend, each line's label followed by `suffix`; false
/// when any failed or there was none.
async fn replay_everywhere(dir: &Path, suffix: &str) -> bool {
    let mut ok = true;
    let mut total = 0;
    let runs = [
        ("activity sqlite", activity_sqlite(dir).await),
        (
            "activity sqlite reopened",
            activity_sqlite_reopened(dir).await,
        ),
        ("journal memory", journal_memory(dir).await),
        ("journal sqlite", journal_sqlite(dir).await),
        (
            "journal sqlite reopened",
            journal_sqlite_reopened(dir).await,
        ),
    ];
    for (label, outcome) in runs {
        let label = format!("{label}{suffix}");
        match outcome {
            Ok((passed, failures)) => {
                total += passed + failures.len();
                ok &= report(&label, passed, &failures);
            }
            Err(err) => {
                eprintln!("conformance: {label}: {err}");
                ok = false;
            }
        }
    }
    if total == 0 {
        eprintln!("conformance: no fixtures found under {}", dir.display());
        ok = false;
    }
    ok
}

/// The fixed set the reference records at this run (see `flightlog_conformance::reference`).
async fn reference_recorded() -> bool {
    let scratch = match tempfile::tempdir() {
        Ok(scratch) => scratch,
        Err(err) => {
            eprintln!("conformance: reference-recorded: temp dir: {err}");
            return false;
        }
    };
    if let Err(err) = record_reference_scenarios(scratch.path()) {
        eprintln!("conformance: reference-recorded: {err}");
        return false;
    }
    replay_everywhere(scratch.path(), " (reference-recorded)").await
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut ok = replay_everywhere(&conformance_dir(), "").await;
    if std::env::var_os("FLIGHTLOG_CONFORMANCE_DIR").is_none() {
        ok &= reference_recorded().await;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
