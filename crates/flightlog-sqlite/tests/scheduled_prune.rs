//! The scheduled retention's prune (`PruneOptions::scheduled`) on a real SQLite file: it judges
//! a run by its last span to start or end, not by the end its rollup took from the first root;
//! the rollup it keeps is made from the detail it deletes, named by the root the run is listed
//! by; its span budget counts the spans runs hold, not those their rollups counted. The
//! endpoint's prune keeps the reference's rule.

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

/// Start `span`, then end it with `end`.
async fn start_and_end(store: &SqliteActivityStore, span: StartSpanInput, end: EndSpanInput) {
    let span_id = span.span_id.clone();
    store.start_span(span).await.expect("the store answers");
    store
        .end_span(&span_id, end)
        .await
        .expect("the store answers");
}

/// A session of two turns: the first ended long ago and was rolled up; the second ran until
/// 199,500 and failed; `roll_up_last` says whether its writer rolled the run up after that.
async fn session_of_two_turns(store: &SqliteActivityStore, run_id: &str, roll_up_last: bool) {
    let first = format!("{run_id}-t1");
    let second = format!("{run_id}-t2");
    start_and_end(
        store,
        turn(&first, run_id, 1_000),
        ended(SpanOutcome::Success, None, 2_000, 10),
    )
    .await;
    store.rollup_run(run_id).await.expect("the store answers");
    start_and_end(
        store,
        turn(&second, run_id, 100_000),
        ended(SpanOutcome::Error, Some("the tool failed"), 199_500, 500),
    )
    .await;
    if roll_up_last {
        store.rollup_run(run_id).await.expect("the store answers");
    }
}

async fn scheduled_prune(store: &SqliteActivityStore, now: i64) -> i64 {
    prune(store, now, true, None).await
}

/// A prune at `now` with the window as floor and ceiling: the scheduled one or the endpoint's,
/// deleting at most `max_spans` spans; the runs it pruned.
async fn prune(
    store: &SqliteActivityStore,
    now: i64,
    scheduled: bool,
    max_spans: Option<i64>,
) -> i64 {
    store
        .prune(PruneOptions {
            digest_floor_at: now - WINDOW_MS,
            hard_ceiling_ms: WINDOW_MS,
            now: Some(now),
            batch: Some(50),
            max_spans,
            scheduled,
        })
        .await
        .expect("the store answers")
        .runs_pruned
}

fn store_in(dir: &tempfile::TempDir) -> (SqliteActivityStore, Arc<ManualClock>) {
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("prune.db")))
        .expect("the database opens");
    let clock = Arc::new(ManualClock::new(0));
    let store = SqliteActivityStore::with_identity(db, clock.clone(), "writer-a");
    (store, clock)
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

/// The endpoint keeps the reference's rule: the session goes by its rollup's end (its first
/// turn's), latest turn and all.
#[tokio::test]
async fn the_endpoint_still_prunes_a_session_by_its_rollups_end() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, clock) = store_in(&dir);
    session_of_two_turns(&store, "session", true).await;
    clock.set(200_000);
    assert_eq!(prune(&store, 200_000, false, None).await, 1);
    assert!(store
        .get_span("session-t2")
        .await
        .expect("the store answers")
        .is_none());
}

/// Runs rolled up after their first span and grown since: their rollups count 1 span each, and
/// the scheduled prune's budget of 10 spans took both runs of 8 at once. It counts the spans
/// they hold: one run a call.
#[tokio::test]
async fn the_span_budget_counts_the_spans_a_run_holds_not_its_rollups_count() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, clock) = store_in(&dir);
    for run_id in ["first", "second"] {
        let root = format!("{run_id}-root");
        start_and_end(
            &store,
            turn(&root, run_id, 1_000),
            ended(SpanOutcome::Success, None, 1_100, 1),
        )
        .await;
        store.rollup_run(run_id).await.expect("the store answers");
        for index in 0..7 {
            let id = format!("{run_id}-late-{index}");
            start_and_end(
                &store,
                turn(&id, run_id, 1_200),
                ended(SpanOutcome::Success, None, 1_300, 1),
            )
            .await;
        }
        let rollup = store
            .read_rollup(run_id)
            .await
            .expect("read")
            .expect("kept");
        assert_eq!(rollup.span_count, 1, "rolled up before it grew");
    }
    let now = 1_300 + WINDOW_MS + 1;
    clock.set(now);
    assert_eq!(prune(&store, now, true, Some(10)).await, 1);
    assert_eq!(prune(&store, now, true, Some(10)).await, 1);
    assert_eq!(prune(&store, now, true, Some(10)).await, 0);
    for run_id in ["first", "second"] {
        let rollup = store
            .read_rollup(run_id)
            .await
            .expect("read")
            .expect("kept");
        assert_eq!((rollup.span_count, rollup.detail_pruned), (8, true));
    }
}

/// A run rolled up before its earlier root arrived: its rollup kept the name and start of that
/// first making (the reference's rule) while the run was listed by the earlier root, so the
/// prune moved it in the listing. The scheduled prune's rollup is named by the root the run is
/// listed by.
#[tokio::test]
async fn the_kept_rollup_is_named_by_the_root_the_run_is_listed_by() {
    use flightlog_core::activity::{RunListQuery, SpanOrigin};
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, clock) = store_in(&dir);
    let mut later = turn("later", "moved", 2_000);
    later.name = "the later root".into();
    later.origin = SpanOrigin::Cron;
    start_and_end(&store, later, ended(SpanOutcome::Success, None, 2_500, 1)).await;
    store.rollup_run("moved").await.expect("the store answers");
    let mut earlier = turn("earlier", "moved", 1_000);
    earlier.name = "the earlier root".into();
    start_and_end(&store, earlier, ended(SpanOutcome::Success, None, 1_500, 1)).await;
    let listed = |page: flightlog_core::activity::RunPage| {
        let run = page.runs.into_iter().next().expect("the run");
        (run.name, run.origin, run.started_at)
    };
    let query = RunListQuery {
        state: None,
        outcome: None,
        origin: None,
        limit: 10,
        before: None,
    };
    let before = listed(store.list_runs(query.clone()).await.expect("listed"));
    assert_eq!(
        before,
        ("the earlier root".to_owned(), SpanOrigin::Session, 1_000)
    );
    let now = 2_500 + WINDOW_MS + 1;
    clock.set(now);
    assert_eq!(scheduled_prune(&store, now).await, 1);
    let after = listed(store.list_runs(query).await.expect("listed"));
    assert_eq!(after, before, "the run did not move");
}

/// A span stamped far in the future (a clock in microseconds read as milliseconds) kept its
/// run from the scheduled prune for good, and nothing said so (an audit's finding): only times
/// up to a window after now hold a run; one a little ahead of the server's clock (a writer's
/// clock ahead) still does.
#[tokio::test]
async fn a_span_far_in_the_future_does_not_hold_its_run_for_good() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, clock) = store_in(&dir);
    for (run_id, child_at) in [("far", 1_000_000_000_000_000), ("near", 20_000)] {
        let root = format!("{run_id}-root");
        store
            .start_span(turn(&root, run_id, 1_000))
            .await
            .expect("the store answers");
        let child = format!("{run_id}-child");
        let mut start = turn(&child, run_id, child_at);
        start.parent_span_id = Some(root.clone());
        start_and_end(
            &store,
            start,
            ended(SpanOutcome::Success, None, child_at + 1, 1),
        )
        .await;
        store
            .end_span(&root, ended(SpanOutcome::Success, None, 2_000, 1))
            .await
            .expect("the store answers");
        store.rollup_run(run_id).await.expect("the store answers");
    }
    // At 17,000: "near"'s child (20,000) is 3 s ahead, inside a window after now; "far"'s is
    // not, and the rest of "far" is older than the window.
    clock.set(17_000);
    assert_eq!(scheduled_prune(&store, 17_000).await, 1);
    assert!(
        store
            .read_rollup("far")
            .await
            .expect("read")
            .expect("kept")
            .detail_pruned
    );
    assert!(
        !store
            .read_rollup("near")
            .await
            .expect("read")
            .expect("kept")
            .detail_pruned
    );
}

/// Runs held by a span that ended inside the window (a leftover the sweep closed late) are
/// passed over, and a line of as many of them as a prune takes at once, at the oldest end, no
/// longer stops every run behind them from being pruned (the diff's review): a call reads on
/// past them.
#[tokio::test]
async fn runs_held_at_the_oldest_end_do_not_stop_the_prune_behind_them() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, clock) = store_in(&dir);
    // Two held runs, rolled up with the oldest ends, each with a child ending at 20,000.
    for (run_id, root_end) in [("held-1", 1_100), ("held-2", 1_200)] {
        let root = format!("{run_id}-root");
        store
            .start_span(turn(&root, run_id, 1_000))
            .await
            .expect("the store answers");
        let mut child = turn(&format!("{run_id}-child"), run_id, 1_050);
        child.parent_span_id = Some(root.clone());
        start_and_end(&store, child, ended(SpanOutcome::Success, None, 20_000, 1)).await;
        store
            .end_span(&root, ended(SpanOutcome::Success, None, root_end, 1))
            .await
            .expect("the store answers");
        store.rollup_run(run_id).await.expect("the store answers");
    }
    start_and_end(
        &store,
        turn("quiet-root", "quiet", 1_300),
        ended(SpanOutcome::Success, None, 1_400, 1),
    )
    .await;
    store.rollup_run("quiet").await.expect("the store answers");
    clock.set(17_000);
    let pruned = store
        .prune(PruneOptions {
            digest_floor_at: 17_000 - WINDOW_MS,
            hard_ceiling_ms: WINDOW_MS,
            now: Some(17_000),
            batch: Some(2),
            max_spans: None,
            scheduled: true,
        })
        .await
        .expect("the store answers");
    assert_eq!(pruned.runs_pruned, 1);
    assert!(
        store
            .read_rollup("quiet")
            .await
            .expect("read")
            .expect("kept")
            .detail_pruned
    );
    for held in ["held-1", "held-2"] {
        assert!(
            !store
                .read_rollup(held)
                .await
                .expect("read")
                .expect("kept")
                .detail_pruned
        );
    }
}

/// The endpoint's prune of many runs is written in parts of at most 100 runs (one transaction
/// of 10,000 held every writer for 1 – 2 s): the parts prune the oldest-ended runs first, as one
/// transaction would, count the runs and spans of every part, stop at `batch`, and a negative
/// `batch` (no limit) prunes every candidate.
#[tokio::test]
async fn a_large_endpoint_prune_is_written_in_parts_and_counts_them_all() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (store, clock) = store_in(&dir);
    // 250 runs of a turn and its tool call, ended in the reverse order of their ids (so the
    // order is the end's, not the id's), then rolled up.
    let runs = 250;
    for i in 0..runs {
        let run_id = format!("run-{i:03}");
        let ended_at = 10_000 - i;
        let root = format!("{run_id}-turn");
        let mut tool = turn(&format!("{run_id}-tool"), &run_id, 1_000);
        tool.parent_span_id = Some(root.clone());
        tool.kind = SpanKind::Tool;
        store
            .start_span(turn(&root, &run_id, 1_000))
            .await
            .expect("the store answers");
        start_and_end(&store, tool, ended(SpanOutcome::Success, None, ended_at, 1)).await;
        store
            .end_span(&root, ended(SpanOutcome::Success, None, ended_at, 1))
            .await
            .expect("the store answers");
        store.rollup_run(&run_id).await.expect("the store answers");
    }
    clock.set(100_000);
    let transactions = || {
        store
            .database()
            .writer_stats()
            .groups
            .load(Ordering::Relaxed)
    };
    let endpoint_prune = |batch: i64| PruneOptions {
        digest_floor_at: 20_000,
        hard_ceiling_ms: WINDOW_MS,
        now: Some(100_000),
        batch: Some(batch),
        max_spans: None,
        scheduled: false,
    };
    let before = transactions();
    let first = store
        .prune(endpoint_prune(230))
        .await
        .expect("the store answers");
    assert_eq!((first.runs_pruned, first.spans_deleted), (230, 460));
    assert!(
        transactions() - before >= 3,
        "230 runs in parts of at most 100: {} transactions",
        transactions() - before
    );
    // The 230 that ended first (the highest ids) went; the 20 that ended last stay whole.
    for i in 0..runs {
        let rollup = store
            .read_rollup(&format!("run-{i:03}"))
            .await
            .expect("the store answers")
            .expect("every run keeps its rollup");
        assert_eq!(rollup.detail_pruned, i >= 20, "run-{i:03}");
        // The rollup stays as it was made (the root's usage, as the reference's).
        assert_eq!(rollup.input_tokens, Some(1), "run-{i:03}");
        assert_eq!(rollup.span_count, 2, "run-{i:03}");
    }
    let rest = store
        .prune(endpoint_prune(-1))
        .await
        .expect("the store answers");
    assert_eq!((rest.runs_pruned, rest.spans_deleted), (20, 40));
    let none = store
        .prune(endpoint_prune(-1))
        .await
        .expect("the store answers");
    assert_eq!((none.runs_pruned, none.spans_deleted), (0, 0));
}
