//! The sweeps on a real SQLite file, each in bounded write jobs: the boot sweep
//! (`sweep_previous_lives`) closes the open spans of a server's earlier lives in jobs of at
//! most 1,000 spans (one transaction of 300,000 held every other server's writes on the file
//! 5.9 s), all of them, and no other writer's; `sweep_stale` and `sweep_own_orphans` (the
//! reference's endpoints) close their runs 100 a job, every one of them, counted together.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use flightlog_core::activity::{ActivityStore, SpanKind, SpanOrigin, SpanOutcome, StartSpanInput};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

fn span(span_id: String, run_id: &str, parent: Option<String>, at: i64) -> StartSpanInput {
    StartSpanInput {
        span_id,
        run_id: run_id.into(),
        parent_span_id: parent,
        name: "work".into(),
        kind: if at == 0 {
            SpanKind::Turn
        } else {
            SpanKind::Tool
        },
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: Some(1_000 + at),
    }
}

#[tokio::test]
async fn an_earlier_lifes_open_spans_are_closed_in_parts_and_no_one_elses() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("sweep.db")))
        .expect("the database opens");
    let clock = Arc::new(ManualClock::new(5_000));
    let earlier = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "serve:a/pid:1");
    let other = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "client-7");
    // Five runs of a root and 499 children, all open, by the earlier life; one more open span
    // in the first run by another writer.
    let runs = 5;
    let per_run = 500;
    for run in 0..runs {
        let run_id = format!("run-{run}");
        let root = format!("{run_id}-0");
        for index in 0..per_run {
            let parent = (index > 0).then(|| root.clone());
            earlier
                .start_span(span(format!("{run_id}-{index}"), &run_id, parent, index))
                .await
                .expect("started");
        }
    }
    other
        .start_span(span("theirs".into(), "run-0", Some("run-0-0".into()), 1))
        .await
        .expect("started");
    let now = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "serve:a/pid:2");
    let transactions = || db.writer_stats().groups.load(Ordering::Relaxed);
    let before = transactions();
    let closed = now.sweep_previous_lives("serve:a/").await.expect("swept");
    assert_eq!(closed, runs * per_run);
    assert!(
        transactions() - before >= 3,
        "2,500 spans in parts of at most 1,000: {} transactions",
        transactions() - before
    );
    for run in 0..runs {
        let snapshot = now
            .snapshot_run(&format!("run-{run}"))
            .await
            .expect("read")
            .expect("the run");
        for row in &snapshot.spans {
            let expected = if row.span_id == "theirs" {
                None
            } else {
                Some(SpanOutcome::Interrupted)
            };
            assert_eq!(row.outcome, expected, "{}", row.span_id);
        }
        let rollup = now
            .read_rollup(&format!("run-{run}"))
            .await
            .expect("read")
            .expect("rolled up");
        assert_eq!(rollup.outcome, Some(SpanOutcome::Interrupted));
    }
    assert_eq!(
        now.sweep_previous_lives("serve:a/").await.expect("swept"),
        0,
        "nothing left"
    );
}

#[tokio::test]
async fn the_stale_and_orphan_sweeps_close_every_run_in_parts() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("sweeps.db")))
        .expect("the database opens");
    let clock = Arc::new(ManualClock::new(5_000));
    let writer = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "client-1");
    let sweeper = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "maintenance");
    let transactions = || db.writer_stats().groups.load(Ordering::Relaxed);
    // 250 runs of an open root and an open child each: stale by 100,000.
    let open_runs = |prefix: &'static str| {
        let writer = &writer;
        async move {
            for run in 0..250 {
                let run_id = format!("{prefix}-{run}");
                let root = format!("{run_id}-root");
                writer
                    .start_span(span(root.clone(), &run_id, None, 0))
                    .await
                    .expect("started");
                writer
                    .start_span(span(format!("{run_id}-child"), &run_id, Some(root), 1))
                    .await
                    .expect("started");
            }
        }
    };
    open_runs("stale").await;
    clock.set(100_000);
    let before = transactions();
    let closed = sweeper.sweep_stale(10_000, None).await.expect("swept");
    assert_eq!(closed, 500);
    assert!(transactions() - before >= 3, "{}", transactions() - before);
    assert!(sweeper.open_root_spans().await.expect("read").is_empty());
    open_runs("orphan").await;
    let before = transactions();
    let closed = sweeper.sweep_own_orphans().await.expect("swept");
    assert_eq!(closed, 500);
    assert!(transactions() - before >= 3, "{}", transactions() - before);
    assert!(sweeper.open_root_spans().await.expect("read").is_empty());
    assert_eq!(sweeper.sweep_own_orphans().await.expect("swept"), 0);
    assert_eq!(sweeper.sweep_stale(10_000, None).await.expect("swept"), 0);
}
