//! The change doorbell: live readers learn of committed changes from this process at once, and
//! of changes committed by another process on the same file within a bounded delay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{ActivityStore, SpanKind, SpanOrigin, StartSpanInput};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

fn root(span_id: &str) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: format!("run-{span_id}"),
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

#[tokio::test(flavor = "multi_thread")]
async fn rings_after_own_commits_and_after_foreign_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bell.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let ours = SqliteActivityStore::with_identity(
        SqliteDatabase::open(SqliteConfig::new(&path)).unwrap(),
        clock.clone(),
        "ours",
    );
    let mut bell = ours.change_doorbell();
    assert_eq!(*bell.borrow_and_update(), 0);

    ours.start_span(root("a")).await.unwrap();
    // Already rung when the write returned: persist, then emit.
    assert!(bell.has_changed().unwrap());
    assert_eq!(*bell.borrow_and_update(), 1);

    // A second database handle has its own writer and connections, as another process would.
    let theirs = SqliteActivityStore::with_identity(
        SqliteDatabase::open(SqliteConfig::new(&path)).unwrap(),
        clock,
        "theirs",
    );
    theirs.start_span(root("b")).await.unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_millis(1_000), bell.changed())
        .await
        .expect("foreign commit noticed")
        .unwrap();
    assert_eq!(*bell.borrow_and_update(), 2);
    assert!(started.elapsed() < Duration::from_millis(1_000));
    let changes = ours.changes_since(1, 10).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].run_id, "run-b");
}
