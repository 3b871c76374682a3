//! The scheduled retention's prune (`PruneOptions::scheduled`) on a real SQLite file: it judges
//! a run by its last sign of life, not by the end its rollup took from the first root, and the
//! rollup it keeps is made from the detail it deletes.

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, PruneOptions, RunRollupRow, SpanKind, SpanOrigin, SpanOutcome,
    SpanUsage, StartSpanInput,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

/// The retention window of these tests.
const WINDOW_MS: i64 = 5_000;

fn turn(span_id: &str, run_id: &str, started_at: i64) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: run_id.into(),
        parent_span_id: None,
        name: "a turn".into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: Some("session-1".into()),
        job_name: None,
        attrs: None,
        started_at: Some(started_at),
    }
}

fn ended(outcome: SpanOutcome, reason: Option<&str>, at: i64, tokens: i64) -> EndSpanInput {
    EndSpanInput {
        outcome,
        reason: reason.map(str::to_owned),
        ended_at: Some(at),
        usage: Some(SpanUsage {
            input_tokens: Some(tokens),
            ..SpanUsage::default()
        }),
        attrs: None,
    }
}

/// A session of two turns: the first ended long ago and was rolled up; the second ran until
/// 199,500 and failed; `roll_up_last` says whether its writer rolled the run up after that.
async fn session_of_two_turns(store: &SqliteActivityStore, run_id: &str, roll_up_last: bool) {
    let first = format!("{run_id}-t1");
    let second = format!("{run_id}-t2");
    store
        .start_span(turn(&first, run_id, 1_000))
        .await
        .expect("the store answers");
    store
        .end_span(&first, ended(SpanOutcome::Success, None, 2_000, 10))
        .await
        .expect("the store answers");
    store.rollup_run(run_id).await.expect("the store answers");
    store
        .start_span(turn(&second, run_id, 100_000))
        .await
        .expect("the store answers");
    store
        .end_span(
            &second,
            ended(SpanOutcome::Error, Some("the tool failed"), 199_500, 500),
        )
        .await
        .expect("the store answers");
    if roll_up_last {
        store.rollup_run(run_id).await.expect("the store answers");
    }
}

async fn scheduled_prune(store: &SqliteActivityStore, now: i64) -> i64 {
    store
        .prune(PruneOptions {
            digest_floor_at: now - WINDOW_MS,
            hard_ceiling_ms: WINDOW_MS,
            now: Some(now),
            batch: Some(50),
            max_spans: None,
            scheduled: true,
        })
        .await
        .expect("the store answers")
        .runs_pruned
}

fn without_id(mut rollup: RunRollupRow) -> RunRollupRow {
    rollup.run_id = String::new();
    rollup.detail_pruned = false;
    rollup
}

#[tokio::test]
async fn a_session_is_pruned_by_its_latest_turn_and_keeps_it_in_its_rollup() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("prune.db")))
        .expect("the database opens");
    let clock = Arc::new(ManualClock::new(0));
    let store = SqliteActivityStore::with_identity(db, clock.clone(), "writer-a");
    // The writer rolled up after the last turn (the control) and one that had not yet.
    session_of_two_turns(&store, "rolled", true).await;
    session_of_two_turns(&store, "late", false).await;
    let expected = without_id(
        store
            .read_rollup("rolled")
            .await
            .unwrap()
            .expect("rolled up"),
    );
    assert_eq!(expected.span_count, 2);

    // 500 ms after the last turn ended, inside the window: nothing goes, though both
    // rollups' ends (the first turn's) are far older than the window.
    clock.set(200_000);
    assert_eq!(scheduled_prune(&store, 200_000).await, 0);
    for span_id in ["rolled-t2", "late-t2"] {
        assert!(
            store.get_span(span_id).await.unwrap().is_some(),
            "{span_id} was pruned 500 ms after it ended"
        );
    }

    // Past the window: both go, and the run nobody rolled up after its failed turn keeps that
    // turn in its rollup, as its writer's own rollup would have said.
    clock.set(199_500 + WINDOW_MS + 1);
    assert_eq!(scheduled_prune(&store, 199_500 + WINDOW_MS + 1).await, 2);
    assert!(store.get_span("late-t2").await.unwrap().is_none());
    let kept = store.read_rollup("late").await.unwrap().expect("kept");
    assert!(kept.detail_pruned);
    assert_eq!(without_id(kept), expected);
    let control = store.read_rollup("rolled").await.unwrap().expect("kept");
    assert_eq!(without_id(control), expected);
}
