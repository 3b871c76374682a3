//! The order of a run snapshot's events where the reference's query leaves it to SQLite's plan:
//! events tied on `(ts, eventIndex)` come in their spans' order (start time, then insertion),
//! as the reference's stable sort over a by-start-time scan of the run's spans gives them. The
//! conformance fixtures never tie two spans' events, so this pins what they cannot.

use std::sync::Arc;

use flightlog_core::activity::{ActivityStore, SpanKind, SpanOrigin, StartSpanInput};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

fn start(span_id: &str, parent: Option<&str>, started_at: i64) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: "run".into(),
        parent_span_id: parent.map(str::to_owned),
        name: format!("{span_id} work"),
        kind: if parent.is_some() {
            SpanKind::Tool
        } else {
            SpanKind::Turn
        },
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: Some(started_at),
    }
}

#[tokio::test]
async fn events_tied_on_time_and_index_follow_their_spans_start_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("order.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(10_000)), "w");

    // Inserted m, z, a; started z (1000), a (1500), m (2000); y starts with a, after it.
    store.start_span(start("m", None, 2_000)).await.unwrap();
    store
        .start_span(start("z", Some("m"), 1_000))
        .await
        .unwrap();
    store
        .start_span(start("a", Some("m"), 1_500))
        .await
        .unwrap();
    store
        .start_span(start("y", Some("m"), 1_500))
        .await
        .unwrap();
    for span_id in ["m", "y", "z", "a"] {
        store
            .append_event(span_id, "tick", None, Some(5_000))
            .await
            .unwrap()
            .unwrap();
    }
    // A second event of m at the same time has index 1: after every index-0 event.
    store
        .append_event("m", "tick", None, Some(5_000))
        .await
        .unwrap()
        .unwrap();
    // An earlier event of the last-started span comes first whatever its span.
    store
        .append_event("m", "early", None, Some(4_000))
        .await
        .unwrap()
        .unwrap();

    let snapshot = store.snapshot_run("run").await.unwrap().unwrap();
    let order: Vec<(String, String, i64)> = snapshot
        .events
        .iter()
        .map(|event| {
            (
                event.span_id.clone(),
                event.event_type.clone(),
                event.event_index,
            )
        })
        .collect();
    let expected = [
        ("m", "early", 2),
        ("z", "tick", 0),
        ("a", "tick", 0),
        ("y", "tick", 0),
        ("m", "tick", 0),
        ("m", "tick", 1),
    ];
    let expected: Vec<(String, String, i64)> = expected
        .iter()
        .map(|(span, kind, index)| (span.to_string(), kind.to_string(), *index))
        .collect();
    assert_eq!(order, expected);
}
