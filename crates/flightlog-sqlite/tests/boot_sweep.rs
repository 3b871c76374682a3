//! The boot sweep (`sweep_previous_lives`) on a real SQLite file: the open spans of a server's
//! earlier lives are closed in write jobs of at most 1,000 spans (one transaction of 300,000
//! held every other server's writes on the file 5.9 s), all of them, and no other writer's.

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
