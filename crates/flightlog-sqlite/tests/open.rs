//! Opening database files: migrations, refusing newer schemas, durability settings, and reading
//! rows written by a newer flightlog (unknown enumeration values) without failing.

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, SpanKind, SpanOrigin, SpanOutcome, StartSpanInput, StoreError,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{
    Durability, SqliteActivityStore, SqliteConfig, SqliteDatabase, SCHEMA_VERSION,
};

fn root(span_id: &str, run_id: &str) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: run_id.into(),
        parent_span_id: None,
        name: "turn".into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: None,
    }
}

fn store(db: Arc<SqliteDatabase>) -> SqliteActivityStore {
    SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w1")
}

#[tokio::test]
async fn reopening_keeps_data_and_does_not_migrate_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.db");
    {
        let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
        store(db).start_span(root("s1", "r1")).await.unwrap();
    }
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let span = store(db).get_span("s1").await.unwrap();
    assert_eq!(span.map(|s| s.run_id), Some("r1".to_owned()));
    let conn = rusqlite::Connection::open(&path).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

#[tokio::test]
async fn a_newer_schema_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    assert!(db.close().await.unwrap());
    drop(db);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 7)
        .unwrap();
    drop(conn);
    let companions =
        || ["newer.db-wal", "newer.db-shm"].map(|companion| dir.path().join(companion).exists());
    let companions_before = companions();
    let err = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap_err();
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, supported }
            if found == SCHEMA_VERSION + 7 && supported == SCHEMA_VERSION),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&(SCHEMA_VERSION + 7).to_string()),
        "{message}"
    );
    assert!(message.contains(&SCHEMA_VERSION.to_string()), "{message}");
    // Nothing is left beside the refused file (a read-only check made a -wal and a -shm).
    assert_eq!(companions(), companions_before);
    assert_eq!(
        companions_before,
        [false, false],
        "the setup left companions"
    );
}

/// The longest name that leaves SQLite room for its companions while it creates the file (247
/// bytes: `-journal`) opens and is written to; an existing database keeps the longer limit it
/// was made under (251 bytes: `-wal`; a file in WAL mode needs no `-journal`). flightlog's own
/// side files shorten their names to fit, and can be made.
#[tokio::test]
async fn the_longest_database_names_open_and_take_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{}.db", "l".repeat(244)));
    assert_eq!(path.file_name().map(|name| name.len()), Some(247));
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    store(db.clone()).start_span(root("s", "r")).await.unwrap();
    assert!(db.close().await.unwrap());
    drop(db);
    let longer = dir.path().join(format!("{}.db", "l".repeat(248)));
    std::fs::rename(&path, &longer).unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(&longer)).unwrap();
    let reopened = store(db.clone());
    assert!(reopened.get_span("s").await.unwrap().is_some());
    reopened.start_span(root("t", "r")).await.unwrap();
    assert!(db.close().await.unwrap());
    for suffix in [
        "-flightlog-turn",
        "-flightlog-rewind",
        "-wal.replaced-1764806400000000000",
    ] {
        let side = flightlog_sqlite::side_file_path(&longer, suffix);
        std::fs::File::create(&side).unwrap_or_else(|err| panic!("{suffix}: {err}"));
    }
}

#[test]
fn paths_that_cannot_be_a_database_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let refusal = |path: &std::path::Path| match SqliteDatabase::open(SqliteConfig::new(path)) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(err) => err.to_string(),
    };
    let message = refusal(dir.path());
    assert!(message.contains("is a directory"), "{message}");
    assert!(message.contains("flightlog.db"), "{message}");
    let message = refusal(&dir.path().join("no/such/folder/a.db"));
    assert!(message.contains("does not exist"), "{message}");
    assert!(message.contains("no/such/folder"), "{message}");
    // A name too long for the file system once SQLite adds `-wal`.
    let message = refusal(&dir.path().join(format!("{}.db", "n".repeat(250))));
    assert!(message.contains("shorter name"), "{message}");
    // … or `-journal`, which it makes while it creates the file (248 bytes: it said the folder
    // must be writable, and left an empty file).
    let too_long = dir.path().join(format!("{}.db", "j".repeat(245)));
    let message = refusal(&too_long);
    assert!(message.contains("shorter name"), "{message}");
    assert!(!too_long.exists());
    // A symbolic link to nothing.
    let dangling = dir.path().join("dangling.db");
    std::os::unix::fs::symlink(dir.path().join("gone.db"), &dangling).unwrap();
    let message = refusal(&dangling);
    assert!(
        message.contains("symbolic link")
            && message.contains("gone.db")
            && message.contains("does not exist"),
        "{message}"
    );
    // Two links to each other: their targets exist, as links (it said "does not exist").
    let (loop_a, loop_b) = (dir.path().join("loop-a.db"), dir.path().join("loop-b.db"));
    std::os::unix::fs::symlink(&loop_b, &loop_a).unwrap();
    std::os::unix::fs::symlink(&loop_a, &loop_b).unwrap();
    let message = refusal(&loop_a);
    assert!(
        message.contains("cannot be reached") && message.contains("levels of symbolic links"),
        "{message}"
    );
    // A FIFO (SQLite answered "disk I/O error").
    let fifo = dir.path().join("fifo.db");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let message = refusal(&fifo);
    assert!(message.contains("not a regular file"), "{message}");
    // A file where a folder should be.
    let file = dir.path().join("plain.txt");
    std::fs::write(&file, "text").unwrap();
    let message = refusal(&file.join("a.db"));
    assert!(message.contains("is a file, not a folder"), "{message}");
    for leftover in ["dangling.db-wal", "fifo.db-wal", "gone.db"] {
        assert!(!dir.path().join(leftover).exists(), "{leftover} was made");
    }
    // A file the process may not write (meaningless for root, which writes anyway).
    let path = dir.path().join("read-only.db");
    drop(SqliteDatabase::open(SqliteConfig::new(&path)).unwrap());
    let mut permissions = std::fs::metadata(&path).unwrap().permissions();
    permissions.set_readonly(true);
    std::fs::set_permissions(&path, permissions).unwrap();
    if std::fs::OpenOptions::new().write(true).open(&path).is_err() {
        let message = refusal(&path);
        assert!(message.contains("is read-only"), "{message}");
    }
}

#[tokio::test]
async fn full_durability_opens_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("full.db"));
    config.durability = Durability::Full;
    let db = SqliteDatabase::open(config).unwrap();
    let store = store(db);
    store.start_span(root("s1", "r1")).await.unwrap();
    assert_eq!(store.latest_change_cursor().await.unwrap(), 1);
}

#[tokio::test]
async fn values_from_a_newer_flightlog_read_back_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = store(db);
    store.start_span(root("s1", "r1")).await.unwrap();
    store.rollup_run("r1").await.unwrap();
    // A newer version wrote kinds, origins and outcomes this one does not know.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "UPDATE activity_spans SET kind = 'workflow', origin = 'webhook', outcome = 'skipped', \
         ended_at = 2000 WHERE span_id = 's1'; \
         UPDATE activity_run_rollups SET origin = 'webhook', outcome = 'skipped';",
    )
    .unwrap();
    let span = store.get_span("s1").await.unwrap().unwrap();
    assert_eq!(span.kind, SpanKind::Unrecognized("workflow".into()));
    assert_eq!(span.origin, SpanOrigin::Unrecognized("webhook".into()));
    assert_eq!(
        span.outcome,
        Some(SpanOutcome::Unrecognized("skipped".into()))
    );
    let json = serde_json::to_value(&span).unwrap();
    assert_eq!(json["kind"], "workflow");
    let rollup = store.read_rollup("r1").await.unwrap().unwrap();
    assert_eq!(rollup.origin, SpanOrigin::Unrecognized("webhook".into()));
    let changes = store.changes_since(0, 10).await.unwrap();
    assert_eq!(changes.len(), 1);
}

/// Regression: a payload column with numeric affinity turned the JSON text `0` into an integer,
/// and every later read of the event failed.
#[tokio::test]
async fn scalar_payloads_read_back_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("scalars.db"))).unwrap();
    let store = store(db);
    store.start_span(root("s1", "r1")).await.unwrap();
    let payloads = [
        serde_json::json!(0),
        serde_json::json!(-1.5),
        serde_json::json!("12"),
        serde_json::json!(true),
        serde_json::Value::Null,
    ];
    for payload in &payloads {
        store
            .append_event("s1", "scalar", Some(payload), None)
            .await
            .unwrap();
    }
    let snapshot = store.snapshot_run("r1").await.unwrap().unwrap();
    let stored: Vec<serde_json::Value> = snapshot
        .events
        .iter()
        .map(|event| serde_json::from_str(event.payload.get()).unwrap())
        .collect();
    assert_eq!(stored, payloads);
    assert_eq!(store.changes_since(0, 100).await.unwrap().len(), 6);
}

/// Another program's SQLite file used to be adopted (a `user_version` of 0: flightlog's tables
/// added beside its own) or switched to WAL before a late, confusing refusal. It is now refused
/// by its header or its tables before anything writes, and keeps every byte.
#[test]
fn another_programs_database_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 9] = [
        (
            "plain.db",
            "CREATE TABLE users (id INTEGER); INSERT INTO users VALUES (1);",
        ),
        ("view-only.db", "CREATE VIEW v AS SELECT 1 AS x;"),
        // `_` in LIKE matches any character: `sqlitedata` is not SQLite's own.
        (
            "sqlite-prefix.db",
            "CREATE TABLE sqlitedata (secret TEXT); INSERT INTO sqlitedata VALUES ('keep');",
        ),
        ("version-no-tables.db", "PRAGMA user_version = 7;"),
        ("old-version-no-tables.db", "PRAGMA user_version = 1;"),
        // Whose file it is comes before its version.
        (
            "foreign-high-version.db",
            "CREATE TABLE places (x); PRAGMA user_version = 74;",
        ),
        (
            "versioned.db",
            "CREATE TABLE users (id INTEGER); PRAGMA user_version = 3;",
        ),
        (
            "same-version.db",
            "CREATE TABLE activity_runs (x); PRAGMA user_version = 7;",
        ),
        (
            "app-id.db",
            "CREATE TABLE t (x); PRAGMA application_id = 1234;",
        ),
    ];
    for (name, sql) in cases {
        let path = dir.path().join(name);
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute_batch(sql).unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        let err = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap_err();
        assert!(
            matches!(err, StoreError::NotFlightlog(_)),
            "{name}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("not a flightlog database"), "{message}");
        assert!(message.contains("choose another path"), "{message}");
        assert_eq!(std::fs::read(&path).unwrap(), before, "{name} changed");
        let wal = dir.path().join(format!("{name}-wal"));
        assert!(!wal.exists(), "{name} was switched to WAL");
    }
    // Another program's WAL-mode database with a WAL not yet copied into it: both files keep
    // their bytes (a read-write connection would have copied the WAL in when it closed).
    let path = dir.path().join("wal-foreign.db");
    let wal = dir.path().join("wal-foreign.db-wal");
    {
        let source = dir.path().join("wal-source.db");
        let conn = rusqlite::Connection::open(&source).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; \
             CREATE TABLE t (a); INSERT INTO t VALUES ('in the wal');",
        )
        .unwrap();
        std::fs::copy(&source, &path).unwrap();
        std::fs::copy(dir.path().join("wal-source.db-wal"), &wal).unwrap();
    }
    let (before, wal_before) = (std::fs::read(&path).unwrap(), std::fs::read(&wal).unwrap());
    let err = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap_err();
    assert!(matches!(err, StoreError::NotFlightlog(_)), "{err:?}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the foreign file changed"
    );
    assert_eq!(std::fs::read(&wal).unwrap(), wal_before, "its WAL changed");

    // Not SQLite at all.
    let path = dir.path().join("notes.db");
    std::fs::write(&path, "not a database ".repeat(100)).unwrap();
    let err = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap_err();
    assert!(err.to_string().contains("not an SQLite database"), "{err}");
}

/// A new database gets flightlog's application id; one an earlier flightlog made (id 0, its
/// tables present) is recognised and gets the id on its next open.
#[tokio::test]
async fn flightlog_databases_carry_the_application_id() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    store(Arc::clone(&db))
        .start_span(root("s1", "r1"))
        .await
        .unwrap();
    let id = |path: &std::path::Path| -> i64 {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row("PRAGMA application_id", [], |row| row.get(0))
            .unwrap()
    };
    assert_eq!(id(&path), flightlog_sqlite::APPLICATION_ID);
    assert!(db.close().await.unwrap(), "nothing else reads the file");
    // As an earlier flightlog left it.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "application_id", 0).unwrap();
    }
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let span = store(db).get_span("s1").await.unwrap();
    assert_eq!(span.map(|s| s.run_id), Some("r1".to_owned()));
    assert_eq!(id(&path), flightlog_sqlite::APPLICATION_ID);
}

/// A copy made with `sqlite3 .dump` (tables and rows, no header) or a header reset by hand:
/// refused unchanged, with the exact command that writes the header back when the tables are
/// this build's, and after that command the file opens with everything in it.
#[tokio::test]
async fn flightlog_tables_without_a_schema_version_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dumped.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    store(Arc::clone(&db))
        .start_span(root("s1", "r1"))
        .await
        .unwrap();
    assert!(db.close().await.unwrap());
    drop(db);
    let set_header = |application_id: i64, version: i64| {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "application_id", application_id)
            .unwrap();
        conn.pragma_update(None, "user_version", version).unwrap();
    };
    for (application_id, version) in [(0, 0), (flightlog_sqlite::APPLICATION_ID, 0), (0, -1)] {
        set_header(application_id, version);
        let before = std::fs::read(&path).unwrap();
        let refused = SqliteDatabase::open(SqliteConfig::new(&path)).map(|_| ());
        let message = match refused {
            Err(err @ StoreError::SchemaUnknown(_)) => err.to_string(),
            other => panic!("({application_id}, {version}): {other:?}"),
        };
        let fix = format!(
            "PRAGMA application_id = {}; PRAGMA user_version = {SCHEMA_VERSION}",
            flightlog_sqlite::APPLICATION_ID
        );
        assert!(
            message.contains("sqlite3 .dump") && message.contains(&fix),
            "{message}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the file was changed"
        );
    }
    // The command the message gives.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA application_id = {}; PRAGMA user_version = {SCHEMA_VERSION}",
            flightlog_sqlite::APPLICATION_ID
        ))
        .unwrap();
    }
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let span = store(db).get_span("s1").await.unwrap();
    assert_eq!(span.map(|s| s.run_id), Some("r1".to_owned()));

    // Tables that are not exactly this build's: no version is guessed.
    let other = dir.path().join("altered.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&other)).unwrap();
    assert!(db.close().await.unwrap());
    drop(db);
    {
        let conn = rusqlite::Connection::open(&other).unwrap();
        conn.execute_batch(
            "DROP INDEX activity_spans_roots_by_run; PRAGMA application_id = 0; \
             PRAGMA user_version = 0",
        )
        .unwrap();
    }
    let message = SqliteDatabase::open(SqliteConfig::new(&other))
        .map(|_| ())
        .err()
        .map(|err| err.to_string())
        .unwrap_or_default();
    assert!(
        message.contains("byte-for-byte copy") && !message.contains("PRAGMA user_version"),
        "{message}"
    );
}

/// After `close`, the database file alone holds every write (the WAL is copied into it), and
/// later writes fail as closed rather than hang.
#[tokio::test]
async fn close_leaves_everything_in_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("closed.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let writer = store(Arc::clone(&db));
    for i in 0..50 {
        writer
            .start_span(root(&format!("s{i}"), &format!("r{i}")))
            .await
            .unwrap();
    }
    assert!(db.close().await.unwrap());
    assert!(db.close().await.unwrap(), "closing twice is harmless");
    let err = writer.start_span(root("late", "late")).await.unwrap_err();
    assert!(matches!(err, StoreError::Closed), "{err:?}");
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    let conn = rusqlite::Connection::open(&copy).unwrap();
    let spans: i64 = conn
        .query_row("SELECT COUNT(*) FROM activity_spans", [], |row| row.get(0))
        .unwrap();
    assert_eq!(spans, 50);
}

/// A prune at 2,000 ms that prunes no run (the digest floor at 0, the hard ceiling far away):
/// it only trims the change log.
fn prune_no_run() -> flightlog_core::activity::PruneOptions {
    flightlog_core::activity::PruneOptions {
        max_spans: None,
        digest_floor_at: 0,
        hard_ceiling_ms: i64::MAX / 2,
        now: Some(2_000),
        batch: None,
        scheduled: false,
    }
}

/// The change-log trim of `prune` deleted every row behind the retention distance in one
/// transaction: the first prune of a big database (7.2 million rows) held the write lock for
/// 5.7 s. It now trims at most `change_log_trim_batch` rows a call, the oldest first, and moves
/// the horizon only as far as it trimmed.
#[tokio::test]
async fn prune_trims_the_change_log_a_batch_at_a_time() {
    use flightlog_core::activity::EndSpanInput;
    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("trim.db"));
    config.change_log_retention = 2;
    config.change_log_trim_batch = 3;
    let store = store(SqliteDatabase::open(config).unwrap());
    // Ten finished one-span runs whose detail the prune keeps (the floor and ceiling are far
    // in the past): changes 1 to 20.
    for i in 0..10 {
        let mut span = root(&format!("s{i}"), &format!("r{i}"));
        span.started_at = Some(1_000);
        store.start_span(span).await.unwrap();
        let end = EndSpanInput {
            outcome: SpanOutcome::Success,
            reason: None,
            ended_at: Some(1_001),
            usage: None,
            attrs: None,
        };
        store.end_span(&format!("s{i}"), end).await.unwrap();
    }
    assert_eq!(store.latest_change_cursor().await.unwrap(), 20);
    let keep_all = prune_no_run();
    let oldest = |changes: Vec<flightlog_core::activity::ActivityChange>| {
        changes.first().map(|change| change.change_id)
    };
    // Rows below 20 - 2 = 18 may go: three a call.
    for (call, (first_left, horizon)) in [(4, 4), (7, 7), (10, 10)].into_iter().enumerate() {
        let result = store.prune(keep_all.clone()).await.unwrap();
        // Said, so the scheduled maintenance goes on while there is more to trim.
        assert_eq!(result.changes_trimmed, 3, "after call {call}");
        assert_eq!(result.runs_pruned, 0);
        assert_eq!(
            oldest(store.changes_since(0, 1).await.unwrap()),
            Some(first_left),
            "after call {call}"
        );
        assert_eq!(store.change_log_horizon().await.unwrap(), horizon);
    }
    for _ in 0..5 {
        store.prune(keep_all.clone()).await.unwrap();
    }
    assert_eq!(oldest(store.changes_since(0, 1).await.unwrap()), Some(18));
    assert_eq!(store.change_log_horizon().await.unwrap(), 18);
}

/// A run whose change rows the trim deleted while its spans stay goes on from its highest seq:
/// it restarted at 1 (the next seq was the highest *logged* one plus one), so a late event of
/// an ended run had seq 1 twice, and a client that took the run's snapshot and followed the
/// change stream dropped the late change as already seen (an audit's finding). A run whose
/// detail is pruned and that is started again still begins at 1, as the reference's does.
#[tokio::test]
async fn a_trimmed_runs_next_change_goes_on_from_its_highest_seq() {
    use flightlog_core::activity::{EndSpanInput, PruneOptions};
    let dir = tempfile::tempdir().unwrap();
    let mut config = SqliteConfig::new(dir.path().join("trimmed-seq.db"));
    config.change_log_retention = 2;
    let store = store(SqliteDatabase::open(config).unwrap());
    let end = || EndSpanInput {
        outcome: SpanOutcome::Success,
        reason: None,
        ended_at: Some(1_001),
        usage: None,
        attrs: None,
    };
    // Run "old": start, three events, end (seqs 1 – 5); then ten other runs' changes.
    let mut span = root("old-root", "old");
    span.started_at = Some(1_000);
    store.start_span(span).await.unwrap();
    for n in 0..3 {
        store
            .append_event("old-root", "note", None, Some(1_000 + n))
            .await
            .unwrap()
            .unwrap();
    }
    store.end_span("old-root", end()).await.unwrap();
    for i in 0..5 {
        let mut other = root(&format!("s{i}"), &format!("r{i}"));
        other.started_at = Some(1_000);
        store.start_span(other).await.unwrap();
        store.end_span(&format!("s{i}"), end()).await.unwrap();
    }
    assert_eq!(store.run_high_water_seq("old").await.unwrap(), 5);
    let keep_detail = prune_no_run();
    let result = store.prune(keep_detail).await.unwrap();
    assert_eq!(result.runs_pruned, 0);
    assert!(result.changes_trimmed >= 5, "{result:?}");
    assert!(store
        .changes_since(0, 100)
        .await
        .unwrap()
        .iter()
        .all(|c| c.run_id != "old"));
    // The trim took the run's rows, not its place in the numbering.
    assert_eq!(store.run_high_water_seq("old").await.unwrap(), 5);
    let snapshot = store.snapshot_run("old").await.unwrap().unwrap();
    assert_eq!(snapshot.high_water_seq, 5);

    store
        .append_event("old-root", "late", None, Some(1_500))
        .await
        .unwrap()
        .unwrap();
    let late = store
        .changes_since(snapshot.change_cursor, 10)
        .await
        .unwrap();
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!((late[0].run_id.as_str(), late[0].seq), ("old", 6));
    assert_eq!(store.run_high_water_seq("old").await.unwrap(), 6);

    // Rolled up and pruned (its detail deleted), then started again: it begins anew.
    store.rollup_run("old").await.unwrap();
    let prune_all = PruneOptions {
        max_spans: None,
        digest_floor_at: i64::MAX / 2,
        hard_ceiling_ms: 0,
        now: Some(2_000),
        batch: None,
        scheduled: false,
    };
    assert!(store.prune(prune_all).await.unwrap().runs_pruned >= 1);
    assert_eq!(store.run_high_water_seq("old").await.unwrap(), 0);
    let mut again = root("new-root", "old");
    again.started_at = Some(3_000);
    store.start_span(again).await.unwrap();
    assert_eq!(store.run_high_water_seq("old").await.unwrap(), 1);
}

/// A database opened through a symbolic link is watched at the path as given: pointing the link
/// at another file (or moving a file over the link) is a lost file, as replacing a plain file
/// is, even though the file the link first named is still there. That file keeps its WAL
/// (with the acknowledged writes a reader kept in it; they were once moved aside with it) and
/// is closed as usual, the close saying where everything went.
#[tokio::test]
async fn a_database_opened_through_a_link_is_lost_when_the_link_moves() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.db");
    let other = dir.path().join("other.db");
    std::fs::write(&other, b"").unwrap();
    let link = dir.path().join("link.db");
    std::fs::write(&real, b"").unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(&link)).unwrap();
    let store = store(db.clone());
    store.start_span(root("s", "r")).await.unwrap();
    assert!(db.check_file().is_ok());
    assert!(dir.path().join("real.db-wal").exists());

    // A reader of another connection holds the WAL, so the writes stay in it (not yet copied
    // into the file), as with another process reading.
    let reader = rusqlite::Connection::open(&real).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT COUNT(*) FROM activity_spans", [], |row| row.get(0))
        .unwrap();
    for n in 0..20 {
        store
            .start_span(root(&format!("held-{n}"), "r"))
            .await
            .unwrap();
    }

    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&other, &link).unwrap();
    assert!(matches!(db.check_file(), Err(StoreError::FileLost(_))));
    // The file itself is still there, so its WAL stays with it (moving it aside lost the
    // acknowledged writes it held): the checkpointer's looks, then the close.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert!(dir.path().join("real.db-wal").exists());
    // Closed while the reader still holds the WAL: the close says the newest writes are in it
    // (a backup must copy both files), as any stop that cannot checkpoint does.
    let closed = db.close().await;
    let message = format!("{closed:?}");
    assert!(
        message.contains("no longer names")
            && message.contains("real.db-wal")
            && message.contains("copy both"),
        "{message}"
    );
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("replaced"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    drop(store);
    let reopened = self::store(SqliteDatabase::open(SqliteConfig::new(&real)).unwrap());
    for n in 0..20 {
        assert!(reopened
            .get_span(&format!("held-{n}"))
            .await
            .unwrap()
            .is_some());
    }
}

/// A file moved over the database of a running process, and another process writing to that
/// new file: when the first process closes, SQLite's close of its last connection would
/// checkpoint and then delete the `-wal` and `-shm` *by name*, which by then are the other
/// process's (its committed writes still in that WAL). SQLite's pager checks that the file has
/// not moved (`SQLITE_FCNTL_HAS_MOVED`) before it checkpoints on close; this guards that the
/// whole close (ours and SQLite's) leaves the new file's WAL alone.
#[tokio::test]
async fn closing_a_replaced_database_leaves_the_new_files_wal_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.db");
    let backup = dir.path().join("backup.db");
    {
        let conn = rusqlite::Connection::open(&backup).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE kept(n INTEGER);")
            .unwrap();
    }
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = store(db.clone());
    store.start_span(root("s", "r")).await.unwrap();
    std::fs::rename(&backup, &path).unwrap();
    // The checkpointer's look moves this process's WAL aside (so nothing replays it into the
    // new file): within a few of its periods, however busy the machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while dir.path().join("live.db-wal").exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!dir.path().join("live.db-wal").exists());
    // Another process (here: another connection to the new file, which SQLite treats as a
    // different file) commits into its WAL and keeps it there.
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute_batch("PRAGMA wal_autocheckpoint=0; INSERT INTO kept VALUES (7);")
        .unwrap();
    assert!(dir.path().join("live.db-wal").exists());
    let closed = db.close().await;
    assert!(closed.is_err(), "{closed:?}");
    drop(store);
    drop(db);
    assert!(dir.path().join("live.db-wal").exists());
    assert!(dir.path().join("live.db-shm").exists());
    let later = rusqlite::Connection::open(&path).unwrap();
    let kept: i64 = later
        .query_row("SELECT COUNT(*) FROM kept", [], |row| row.get(0))
        .unwrap();
    assert_eq!(kept, 1);
    drop(other);
}

/// A `-wal` deleted under the running process (the database file still there): SQLite writes
/// on into the deleted log through its open descriptor, so writes were acknowledged that a
/// crash then lost, `/healthz` saying ok (an audit: 4 of 5 acknowledged spans gone). The
/// checkpointer notices within a period, copies the log into the file, and only then refuses
/// every write as a lost file: at the first refusal the database file alone (all a crash
/// leaves, the log being gone) already holds every write acknowledged, while a writer kept
/// writing throughout (refused first, an audit lost 368 of 368 when killed at the first 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_wal_stops_writes_and_what_it_held_reaches_the_file() {
    lose_the_wal_while_writing(false).await;
}

/// A copy of the `-wal` put back over it under the running process: refused as a deleted one
/// is, and the copy moved aside at once, since the next open would replay it over the pages
/// already copied into the file (an audit lost 100 of 200 acknowledged spans so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_wal_is_moved_aside_and_what_it_held_reaches_the_file() {
    lose_the_wal_while_writing(true).await;
}

/// Write spans, lose the `-wal` (deleted, or replaced by a copy of itself taken midway) while a
/// writer goes on, and check at the first refusal what a crash would leave: the file, and
/// whatever is at the `-wal`'s path then.
async fn lose_the_wal_while_writing(replace: bool) {
    let dir = tempfile::tempdir().expect("the test's step");
    let path = dir.path().join("flightlog.db");
    let wal = dir.path().join("flightlog.db-wal");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("the test's step");
    let store = Arc::new(store(db.clone()));
    for n in 0..20 {
        store
            .start_span(root(&format!("before-{n}"), "r"))
            .await
            .expect("the test's step");
    }
    let copy_of_wal = dir.path().join("copy-of-wal");
    if replace {
        std::fs::copy(&wal, &copy_of_wal).expect("the test's step");
    }
    for n in 0..20 {
        store
            .start_span(root(&format!("between-{n}"), "r"))
            .await
            .expect("the test's step");
    }
    assert!(db.check_file().is_ok());
    // A writer that goes on until it is refused; it counts what was acknowledged.
    let writer = tokio::spawn({
        let store = Arc::clone(&store);
        async move {
            let mut acknowledged = 40_i64;
            for n in 0.. {
                match store.start_span(root(&format!("during-{n}"), "r")).await {
                    Ok(_) => acknowledged += 1,
                    Err(StoreError::FileLost(_)) => return acknowledged,
                    Err(other) => panic!("{other:?}"),
                }
            }
            acknowledged
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    if replace {
        std::fs::rename(&copy_of_wal, &wal).expect("the test's step");
    } else {
        std::fs::remove_file(&wal).expect("the test's step");
    }

    // Bounded, so a regression fails instead of hanging.
    let acknowledged = tokio::time::timeout(std::time::Duration::from_secs(30), writer)
        .await
        .expect("the lost -wal was never noticed")
        .expect("the test's step");
    // What a crash at the first refusal leaves: copied at once.
    let crash = dir.path().join("crash");
    std::fs::create_dir(&crash).expect("the test's step");
    std::fs::copy(&path, crash.join("flightlog.db")).expect("the test's step");
    let wal_left = wal.exists();
    if wal_left {
        std::fs::copy(&wal, crash.join("flightlog.db-wal")).expect("the test's step");
    }
    assert!(
        !wal_left,
        "nothing is left at the -wal's path to be replayed"
    );
    // `/healthz` says so once the log is copied (the writer copied it before its refusal).
    let Err(StoreError::FileLost(message)) = db.check_file() else {
        panic!("the health check says nothing of the lost -wal");
    };
    assert!(
        message.contains("flightlog.db-wal") && message.contains("Stop the server cleanly"),
        "{message}"
    );
    let moved_aside = std::fs::read_dir(dir.path())
        .expect("the test's step")
        .filter_map(Result::ok)
        .any(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .contains("-wal.replaced-")
        });
    assert_eq!(moved_aside, replace, "only a replacement is moved aside");

    let alone = rusqlite::Connection::open(crash.join("flightlog.db")).expect("the test's step");
    let spans: i64 = alone
        .query_row("SELECT COUNT(*) FROM activity_spans", [], |row| row.get(0))
        .expect("the test's step");
    assert_eq!(
        spans, acknowledged,
        "the file alone holds every acknowledged write"
    );
}
