//! `write_batch` on a real SQLite file: in-order writes, each atomic on its own, one failing
//! write failing alone, and the writer's caches staying right after a write was rolled back.

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, ActivityWrite, ActivityWriteResult, EndSpanInput, SpanKind, SpanOrigin,
    SpanOutcome, SpanPatch, StartSpanInput, StoreError,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};
use serde_json::json;

fn start(span_id: &str, run_id: &str, parent: Option<&str>) -> ActivityWrite {
    ActivityWrite::StartSpan(StartSpanInput {
        span_id: span_id.into(),
        run_id: run_id.into(),
        parent_span_id: parent.map(str::to_owned),
        name: span_id.into(),
        kind: SpanKind::Tool,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: None,
    })
}

fn end(span_id: &str) -> ActivityWrite {
    ActivityWrite::EndSpan {
        span_id: span_id.into(),
        input: EndSpanInput {
            outcome: SpanOutcome::Success,
            reason: None,
            ended_at: None,
            usage: None,
            attrs: None,
        },
    }
}

#[tokio::test]
async fn writes_apply_in_order_and_a_failing_write_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("batch.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(7_000)), "w");
    store
        .start_span(match start("taken", "r0", None) {
            ActivityWrite::StartSpan(input) => input,
            _ => unreachable!(),
        })
        .await
        .unwrap();

    let results = store
        .write_batch(vec![
            start("root", "r1", None),
            start("child", "r1", Some("root")),
            ActivityWrite::AppendEvent {
                span_id: "child".into(),
                event_type: "log".into(),
                payload: Some(json!({"line": 1})),
                ts: None,
            },
            // A duplicate id in a run nobody has used yet: the run row it interned is rolled
            // back with it, and the next write in that run must not reuse a stale cached key.
            start("taken", "r-new", None),
            start("fresh", "r-new", None),
            ActivityWrite::PatchSpan {
                span_id: "child".into(),
                patch: SpanPatch {
                    wait_until: Some(9_000),
                    ..SpanPatch::default()
                },
            },
            end("child"),
            end("child"),
            ActivityWrite::AppendEvent {
                span_id: "nobody".into(),
                event_type: "log".into(),
                payload: None,
                ts: Some(1),
            },
            ActivityWrite::Heartbeat {
                span_id: "root".into(),
                at: Some(8_000),
            },
        ])
        .await;
    assert_eq!(results.len(), 10);
    assert!(
        matches!(&results[0], Ok(ActivityWriteResult::Started(span)) if span.span_id == "root")
    );
    assert!(matches!(&results[1], Ok(ActivityWriteResult::Started(_))));
    assert!(
        matches!(&results[2], Ok(ActivityWriteResult::Appended(Some(event))) if event.ts == 7_000)
    );
    assert!(
        matches!(&results[3], Err(StoreError::DuplicateSpan { span_id }) if span_id == "taken")
    );
    assert!(
        matches!(&results[4], Ok(ActivityWriteResult::Started(span)) if span.run_id == "r-new")
    );
    assert!(matches!(
        &results[5],
        Ok(ActivityWriteResult::Patched(true))
    ));
    assert!(matches!(&results[6], Ok(ActivityWriteResult::Ended(true))));
    assert!(
        matches!(&results[7], Ok(ActivityWriteResult::Ended(false))),
        "write-once"
    );
    assert!(matches!(
        &results[8],
        Ok(ActivityWriteResult::Appended(None))
    ));
    assert!(matches!(&results[9], Ok(ActivityWriteResult::Heartbeat)));

    let fresh = store.get_span("fresh").await.unwrap().unwrap();
    assert_eq!(fresh.run_id, "r-new");
    assert_eq!(store.get_span("taken").await.unwrap().unwrap().run_id, "r0");
    let root = store.get_span("root").await.unwrap().unwrap();
    assert_eq!(root.last_heartbeat_at, Some(8_000));
    let snapshot = store.snapshot_run("r1").await.unwrap().unwrap();
    assert_eq!(snapshot.spans.len(), 2);
    assert_eq!(snapshot.events.len(), 1);
    // start, start, event, patch, end: dense per-run seqs.
    assert_eq!(snapshot.high_water_seq, 5);
    let changes = store.changes_since(0, 100).await.unwrap();
    let ids: Vec<i64> = changes.iter().map(|change| change.change_id).collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
    let r1_seqs: Vec<i64> = changes
        .iter()
        .filter(|change| change.run_id == "r1")
        .map(|change| change.seq)
        .collect();
    assert_eq!(r1_seqs, [1, 2, 3, 4, 5]);
    assert!(store
        .snapshot_run("r-new")
        .await
        .unwrap()
        .is_some_and(|snapshot| snapshot.high_water_seq == 1));
}

/// A write that fails after it changed something (here: its span row is in, then a trigger on
/// the file refuses its change row) must fail alone, in a batch and as a single write: the
/// batch is replayed write by write, its neighbours keep their effects, the failed write leaves
/// no trace, and per-run seqs stay dense.
#[tokio::test]
async fn a_write_failing_half_way_fails_alone_and_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dirty.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(7_000)), "w");
    // Another connection to the same file installs the fault: any change row of a span whose
    // id starts with `poison` is refused, after the span row itself was written.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "CREATE TRIGGER poison BEFORE INSERT ON activity_changes
         WHEN NEW.span_key IN (SELECT span_key FROM activity_spans WHERE span_id LIKE 'poison%')
         BEGIN SELECT RAISE(ABORT, 'poisoned write'); END;",
    )
    .unwrap();
    drop(conn);

    let results = store
        .write_batch(vec![
            start("root", "r1", None),
            start("poison-1", "r1", Some("root")),
            start("child", "r1", Some("root")),
            end("child"),
        ])
        .await;
    assert_eq!(results.len(), 4);
    assert!(matches!(&results[0], Ok(ActivityWriteResult::Started(_))));
    assert!(
        matches!(&results[1], Err(StoreError::Backend(message)) if message.contains("poisoned")),
        "{:?}",
        results[1]
    );
    assert!(matches!(&results[2], Ok(ActivityWriteResult::Started(_))));
    assert!(matches!(&results[3], Ok(ActivityWriteResult::Ended(true))));
    assert!(store.get_span("poison-1").await.unwrap().is_none());

    // The same fault on a single write, queued beside other single writes.
    let (poisoned, neighbour) = tokio::join!(
        store.start_span(match start("poison-2", "r1", Some("root")) {
            ActivityWrite::StartSpan(input) => input,
            _ => unreachable!(),
        }),
        store.start_span(match start("after", "r1", Some("root")) {
            ActivityWrite::StartSpan(input) => input,
            _ => unreachable!(),
        }),
    );
    assert!(poisoned.is_err());
    assert!(neighbour.is_ok());
    assert!(store.get_span("poison-2").await.unwrap().is_none());

    let snapshot = store.snapshot_run("r1").await.unwrap().unwrap();
    let mut names: Vec<&str> = snapshot.spans.iter().map(|s| s.span_id.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["after", "child", "root"]);
    let seqs: Vec<i64> = store
        .changes_since(0, 100)
        .await
        .unwrap()
        .iter()
        .filter(|change| change.run_id == "r1")
        .map(|change| change.seq)
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4], "root, child, end child, after");
}
