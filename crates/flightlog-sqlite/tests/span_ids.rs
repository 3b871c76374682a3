//! Span ids live in two indexes since schema version 4 (a small recent one, merged into the main
//! one in sorted runs), and in three since version 6 (recent ids merge into a middle index, swept
//! into the main one a key range at a time). These tests hold the store to the same promises as
//! before across that design: an id is found wherever it lives, lives in exactly one index, is
//! never taken twice (across runs, across merges and sweeps, by native starts and OTLP imports
//! alike), leaves every index when its run is pruned, and a database written by schema version 3
//! upgrades with every span still reachable.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, ImportedSpan, PruneOptions, SpanKind, SpanOrigin, SpanOutcome,
    StartSpanInput, StoreError,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{migrate_up_to, SqliteActivityStore, SqliteConfig, SqliteDatabase};
use support::ended_otlp_span;

fn store(path: &std::path::Path) -> SqliteActivityStore {
    let db = SqliteDatabase::open(SqliteConfig::new(path)).expect("open the store");
    SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w")
}

fn start(span_id: &str, run_id: &str) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: run_id.into(),
        parent_span_id: None,
        name: span_id.into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: None,
    }
}

fn imported(span_id: String, run_id: String, parent: Option<String>) -> ImportedSpan {
    ended_otlp_span(span_id, run_id, parent, 10)
}

/// A random-looking id, as OTLP SDKs send.
fn id(n: u64) -> String {
    format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Import spans `0..total` (a multiple of 500) as OTLP delivers them: traces of 10 (`run-N`, a
/// root and 9 children), 500 spans a call, every span new.
async fn import_traces(store: &SqliteActivityStore, total: u64) {
    for call in 0..(total / 500) {
        let spans: Vec<ImportedSpan> = (call * 500..(call + 1) * 500)
            .map(|n| {
                let run = format!("run-{}", n / 10);
                let parent = (n % 10 != 0).then(|| id(n - n % 10));
                imported(id(n), run, parent)
            })
            .collect();
        let report = store.import_spans(spans).await.expect("import");
        assert_eq!(report.created, 500);
    }
}

/// Roll up the runs of [`import_traces`] and prune every rolled-up run (and whatever else is
/// rolled up): the spans deleted.
async fn prune_every_run(store: &SqliteActivityStore, total: u64) -> i64 {
    for run in 0..(total / 10) {
        store
            .rollup_run(&format!("run-{run}"))
            .await
            .expect("rollup");
    }
    store
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: i64::MAX,
            hard_ceiling_ms: i64::MAX,
            batch: Some(-1),
            now: Some(10_000_000),
            scheduled: false,
        })
        .await
        .expect("prune")
        .spans_deleted
}

#[tokio::test]
async fn ids_stay_unique_and_reachable_across_a_merge_and_a_prune() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir.path().join("ids.db"));
    // More spans than the recent index holds, so at least one merge happens in the middle.
    let total = 17_000u64;
    import_traces(&store, total).await;
    // Every id is found, the first ones (merged) and the last ones (recent) alike.
    for n in [0, 1, 9, 8_000, 16_383, 16_384, 16_999] {
        let span = store.get_span(&id(n)).await.unwrap().unwrap();
        assert_eq!(span.run_id, format!("run-{}", n / 10));
    }
    // Taken ids stay taken, wherever they live, for native starts and imports.
    for n in [3, 16_990] {
        let err = store
            .start_span(start(&id(n), "elsewhere"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::DuplicateSpan { .. }), "{err:?}");
        let report = store
            .import_spans(vec![imported(id(n), "elsewhere".into(), None)])
            .await
            .unwrap();
        assert_eq!(report.rejected.len(), 1, "{report:?}");
        // Delivered again to its own run: recognised, nothing written.
        let report = store
            .import_spans(vec![imported(id(n), format!("run-{}", n / 10), None)])
            .await
            .unwrap();
        assert_eq!((report.created, report.unchanged), (0, 1), "{report:?}");
    }
    // Native writes by id reach spans in both indexes.
    store
        .start_span(start("native-root", "native"))
        .await
        .unwrap();
    assert!(store
        .end_span(
            "native-root",
            EndSpanInput {
                outcome: SpanOutcome::Success,
                reason: None,
                ended_at: Some(2_000),
                usage: None,
                attrs: None,
            },
        )
        .await
        .unwrap());
    assert!(store
        .append_event(&id(5), "late", None, None)
        .await
        .unwrap()
        .is_some());

    // Pruning every run frees its ids: they can be used again afterwards.
    store.rollup_run("native").await.unwrap();
    assert_eq!(prune_every_run(&store, total).await, total as i64 + 1);
    assert!(store.get_span(&id(0)).await.unwrap().is_none());
    assert!(store.get_span(&id(16_999)).await.unwrap().is_none());
    store.start_span(start(&id(0), "again")).await.unwrap();
    store.start_span(start(&id(16_999), "again")).await.unwrap();
    assert_eq!(
        store.get_span(&id(16_999)).await.unwrap().unwrap().run_id,
        "again"
    );
}

/// Ids per span-id index, read on a connection of the test's own.
fn index_sizes(path: &std::path::Path) -> [i64; 3] {
    let conn = rusqlite::Connection::open(path).expect("open the database");
    [
        "activity_span_ids_recent",
        "activity_span_ids_middle",
        "activity_span_ids",
    ]
    .map(|table| {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |row| {
            row.get(0)
        })
        .expect("count the ids")
    })
}

/// Some ids of one span-id index, in id order.
fn ids_in(path: &std::path::Path, table: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).expect("open the database");
    let mut stmt = conn
        .prepare(&format!("SELECT span_id FROM {table} ORDER BY span_id"))
        .expect("prepare");
    let all: Vec<String> = stmt
        .query_map([], |row| row.get(0))
        .expect("query")
        .map(|id| id.expect("an id"))
        .collect();
    // The first, the last and a few between.
    let step = (all.len() / 5).max(1);
    let mut some: Vec<String> = all.iter().step_by(step).cloned().collect();
    some.extend(all.last().cloned());
    some
}

#[tokio::test]
async fn ids_stay_unique_and_reachable_across_sweeps_of_the_middle_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sweeps.db");
    let store = store(&path);
    // Four merges of the recent index; from the second on, the middle index is past its target
    // (about sqrt(16,384 x spans) ids) and each merge sweeps the next key range of it into the
    // main one (a sweep that reaches the end of the key space is `activity_write`'s unit test).
    let total = 70_000u64;
    import_traces(&store, total).await;
    let [recent, middle, main] = index_sizes(&path);
    println!("span ids: {recent} recent, {middle} middle, {main} main");
    assert_eq!(
        recent + middle + main,
        total as i64,
        "{recent} {middle} {main}"
    );
    assert!(
        recent > 0 && middle > 0 && main > 0,
        "{recent} {middle} {main}"
    );
    // The middle index was kept near its target, not left to grow with every merge.
    assert!(middle < 40_000, "the middle index holds {middle} ids");
    // No id is in two indexes.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let shared: i64 = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM activity_span_ids_recent r
                       JOIN activity_span_ids_middle m USING (span_id))
                  + (SELECT COUNT(*) FROM activity_span_ids_recent r
                       JOIN activity_span_ids a USING (span_id))
                  + (SELECT COUNT(*) FROM activity_span_ids_middle m
                       JOIN activity_span_ids a USING (span_id))",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(shared, 0);
    // Ids in each index are found, keep their run, and stay taken.
    for table in [
        "activity_span_ids_recent",
        "activity_span_ids_middle",
        "activity_span_ids",
    ] {
        for span_id in ids_in(&path, table) {
            let span = store.get_span(&span_id).await.unwrap();
            let span = span.unwrap_or_else(|| panic!("{span_id} of {table} not found"));
            assert_eq!(span.span_id, span_id);
            let err = store
                .start_span(start(&span_id, "elsewhere"))
                .await
                .unwrap_err();
            assert!(matches!(err, StoreError::DuplicateSpan { .. }), "{err:?}");
            let report = store
                .import_spans(vec![imported(span_id.clone(), span.run_id.clone(), None)])
                .await
                .unwrap();
            assert_eq!((report.created, report.unchanged), (0, 1), "{report:?}");
        }
    }
    // Every id of the workload is found.
    for n in (0..total).step_by(997) {
        assert!(store.get_span(&id(n)).await.unwrap().is_some(), "span {n}");
    }
    // Pruning every run empties all three indexes.
    assert_eq!(prune_every_run(&store, total).await, total as i64);
    assert_eq!(index_sizes(&path), [0, 0, 0]);
    // And the writer goes on registering, merging and sweeping after it.
    for call in 0..40u64 {
        let spans: Vec<ImportedSpan> = (call * 500..(call + 1) * 500)
            .map(|n| imported(id(total + n), format!("again-{}", n / 10), None))
            .collect();
        assert_eq!(store.import_spans(spans).await.unwrap().created, 500);
    }
    let [recent, middle, main] = index_sizes(&path);
    assert_eq!(recent + middle + main, 20_000, "{recent} {middle} {main}");
}

#[tokio::test]
async fn a_version_3_database_upgrades_with_every_span_reachable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v3.db");
    {
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        migrate_up_to(&mut conn, 3).unwrap();
        conn.execute_batch(
            "INSERT INTO activity_runs (run_key, run_id) VALUES (1, 'old-run');
             INSERT INTO activity_writers (writer_key, writer) VALUES (1, 'old-writer');
             INSERT INTO activity_spans (span_key, span_id, run_key, parent_span_id, name, kind,
               origin, started_at, writer_key, last_heartbeat_at)
             VALUES (1, 'old-root', 1, NULL, 'root', 'turn', 'session', 100, 1, 100),
                    (2, 'old-child', 1, 'old-root', 'child', 'tool', 'session', 110, 1, NULL);
             INSERT INTO activity_changes (change_id, run_key, seq, span_key, event_index)
             VALUES (1, 1, 1, 1, NULL), (2, 1, 2, 2, NULL);",
        )
        .unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .unwrap();
        assert_eq!(version, 3);
    }
    let store = store(&path);
    let child = store.get_span("old-child").await.unwrap().unwrap();
    assert_eq!(child.parent_span_id.as_deref(), Some("old-root"));
    let err = store
        .start_span(start("old-root", "other"))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::DuplicateSpan { .. }), "{err:?}");
    let event = store
        .append_event("old-child", "note", None, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(event.event_index, 0);
    // The run's seq continues from the old change rows.
    let snapshot = store.snapshot_run("old-run").await.unwrap().unwrap();
    assert_eq!(snapshot.high_water_seq, 3);
    assert_eq!(snapshot.spans.len(), 2);
    // New spans get keys after the old ones.
    let fresh = store
        .start_span(start("new-root", "new-run"))
        .await
        .unwrap();
    assert_eq!(fresh.span_id, "new-root");
}

/// The writer proves most new ids free with an in-memory filter once it has written alone for a
/// few groups. Ids taken behind its back (another process on the same file, here a second
/// store) must still be refused: a foreign commit makes it drop the filter.
#[tokio::test]
async fn ids_taken_by_another_writer_are_refused_after_the_filter_is_built() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.db");
    let first = store(&path);
    let second = store(&path);
    // Enough groups alone for the first writer to build and install its filter (in the
    // background: the loop goes on until it is in), then repeats it must see.
    let mut call = 0u64;
    while first
        .database()
        .writer_stats()
        .span_id_filters_installed
        .load(Ordering::Relaxed)
        == 0
    {
        assert!(call < 1_000, "no filter was installed after {call} groups");
        let spans: Vec<ImportedSpan> = (call * 100..(call + 1) * 100)
            .map(|n| imported(id(n), format!("run-{}", n / 10), None))
            .collect();
        assert_eq!(first.import_spans(spans).await.unwrap().created, 100);
        call += 1;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let delivered = call * 100;
    let again: Vec<ImportedSpan> = (0..delivered)
        .map(|n| imported(id(n), format!("run-{}", n / 10), None))
        .collect();
    let report = first.import_spans(again).await.unwrap();
    assert_eq!((report.created, report.unchanged), (0, delivered));
    first.start_span(start("native-1", "native")).await.unwrap();
    for _ in 0..12 {
        first
            .start_span(start("native-1", "native"))
            .await
            .unwrap_err();
    }

    // The second writer takes ids the first has never seen, natively and by import.
    second.start_span(start("theirs", "r2")).await.unwrap();
    let report = second
        .import_spans(vec![imported("imported-theirs".into(), "r2".into(), None)])
        .await
        .unwrap();
    assert_eq!(report.created, 1);

    assert!(matches!(
        first.start_span(start("theirs", "r1")).await,
        Err(StoreError::DuplicateSpan { .. })
    ));
    let report = first
        .import_spans(vec![
            imported("imported-theirs".into(), "r2".into(), None),
            imported("theirs".into(), "r2".into(), None),
        ])
        .await
        .unwrap();
    assert_eq!(report.created, 0, "{report:?}");
    assert_eq!(
        report.unchanged + report.completed,
        2,
        "both already exist: {report:?}"
    );
    // And after writing alone again until a new filter is in, still refused.
    let mut n = 0;
    while first
        .database()
        .writer_stats()
        .span_id_filters_installed
        .load(Ordering::Relaxed)
        < 2
    {
        assert!(n < 1_000, "no second filter after {n} groups");
        first
            .start_span(start(&format!("later-{n}"), "later"))
            .await
            .unwrap();
        n += 1;
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(matches!(
        first.start_span(start("theirs", "r3")).await,
        Err(StoreError::DuplicateSpan { .. })
    ));
    assert!(matches!(
        second.start_span(start("later-0", "r3")).await,
        Err(StoreError::DuplicateSpan { .. })
    ));
}
