//! `list_runs` on a real SQLite file: open, ended, rolled-up and pruned runs newest first, each
//! filter, and paging that neither skips nor repeats a run while new runs keep starting.

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, PruneOptions, RunCursor, RunListQuery, RunState, SpanKind,
    SpanOrigin, SpanOutcome, SpanUsage, StartSpanInput,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

fn start(span_id: &str, run_id: &str, parent: Option<&str>, at: i64) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: run_id.into(),
        parent_span_id: parent.map(str::to_owned),
        name: format!("{run_id} work"),
        kind: SpanKind::Turn,
        origin: if run_id.starts_with("cron") {
            SpanOrigin::Cron
        } else {
            SpanOrigin::Session
        },
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: Some(at),
    }
}

fn end(outcome: SpanOutcome, at: i64) -> EndSpanInput {
    EndSpanInput {
        outcome,
        reason: Some("why".into()),
        ended_at: Some(at),
        usage: Some(SpanUsage {
            input_tokens: Some(10),
            ..SpanUsage::default()
        }),
        attrs: None,
    }
}

fn query(state: Option<RunState>, limit: i64) -> RunListQuery {
    RunListQuery {
        state,
        outcome: None,
        origin: None,
        limit,
        before: None,
    }
}

async fn ids(store: &SqliteActivityStore, query: RunListQuery) -> Vec<String> {
    let page = store.list_runs(query).await.expect("list_runs");
    page.runs.into_iter().map(|run| run.run_id).collect()
}

/// A run of one root started at 100 and ended at 200, rolled up, then pruned (the only run a
/// prune at 10,000 with a digest floor of 1,000 finds): only its rollup row remains.
async fn end_roll_up_and_prune(store: &SqliteActivityStore, span_id: &str, run_id: &str) {
    store
        .start_span(start(span_id, run_id, None, 100))
        .await
        .expect("start");
    store
        .end_span(span_id, end(SpanOutcome::Success, 200))
        .await
        .expect("end");
    store.rollup_run(run_id).await.expect("rollup");
    let pruned = store
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: 1_000,
            hard_ceiling_ms: 1_000_000,
            now: Some(10_000),
            batch: None,
            scheduled: false,
        })
        .await
        .expect("prune");
    assert_eq!(pruned.runs_pruned, 1);
}

#[tokio::test]
async fn lists_open_ended_and_pruned_runs_newest_first_with_filters() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("runs.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let store = SqliteActivityStore::with_identity(db, clock.clone(), "w");

    // run-a: ended long ago, rolled up, then pruned (only its rollup row remains).
    end_roll_up_and_prune(&store, "a", "run-a").await;
    // run-b: ended with an error and rolled up (cascade close rolls up).
    store
        .start_span(start("b", "run-b", None, 300))
        .await
        .unwrap();
    store
        .start_span(start("b1", "run-b", Some("b"), 310))
        .await
        .unwrap();
    store
        .cascade_close("run-b", SpanOutcome::Error, "broke")
        .await
        .unwrap();
    // cron-c: ended but never rolled up: listed from its root, figures live.
    store
        .start_span(start("c", "cron-c", None, 400))
        .await
        .unwrap();
    store
        .end_span("c", end(SpanOutcome::Timeout, 450))
        .await
        .unwrap();
    // run-d: still open, with a child.
    store
        .start_span(start("d", "run-d", None, 500))
        .await
        .unwrap();
    store
        .start_span(start("d1", "run-d", Some("d"), 510))
        .await
        .unwrap();

    let all = store.list_runs(query(None, 10)).await.unwrap();
    let listed: Vec<&str> = all.runs.iter().map(|run| run.run_id.as_str()).collect();
    assert_eq!(listed, ["run-d", "cron-c", "run-b", "run-a"]);
    assert_eq!(all.next, None);

    let d = &all.runs[0];
    assert_eq!(d.state, RunState::Open);
    assert_eq!((d.span_count, d.ended_at, d.rolled_up), (2, None, false));
    assert_eq!(d.last_heartbeat_at, Some(500));
    let c = &all.runs[1];
    assert_eq!(c.state, RunState::Ended);
    assert_eq!(
        (c.outcome.clone(), c.duration_ms),
        (Some(SpanOutcome::Timeout), Some(50))
    );
    assert_eq!((c.rolled_up, c.input_tokens), (false, Some(10)));
    assert_eq!(c.failure_reason.as_deref(), Some("why"));
    let b = &all.runs[2];
    assert_eq!((b.rolled_up, b.span_count), (true, 2));
    assert_eq!(b.failure_reason.as_deref(), Some("broke"));
    let a = &all.runs[3];
    assert_eq!(
        (a.detail_pruned, a.rolled_up, a.span_count),
        (true, true, 1)
    );
    assert_eq!(a.outcome, Some(SpanOutcome::Success));

    assert_eq!(
        ids(&store, query(Some(RunState::Open), 10)).await,
        ["run-d"]
    );
    assert_eq!(
        ids(&store, query(Some(RunState::Ended), 10)).await,
        ["cron-c", "run-b", "run-a"]
    );
    let mut errors = query(None, 10);
    errors.outcome = Some(SpanOutcome::Error);
    assert_eq!(ids(&store, errors.clone()).await, ["run-b"]);
    errors.state = Some(RunState::Open);
    assert!(ids(&store, errors).await.is_empty());
    let mut crons = query(None, 10);
    crons.origin = Some(SpanOrigin::Cron);
    assert_eq!(ids(&store, crons).await, ["cron-c"]);
    assert!(ids(&store, query(None, 0)).await.is_empty());
}

#[tokio::test]
async fn pages_neither_skip_nor_repeat_while_runs_keep_starting() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("pages.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    // 25 runs, several sharing a start time (the run id breaks the tie).
    for index in 0..25 {
        let run = format!("run-{index:02}");
        store
            .start_span(start(&run, &run, None, 1_000 + index / 3))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut before: Option<RunCursor> = None;
    let mut pages = 0;
    loop {
        let mut page_query = query(None, 7);
        page_query.before = before.clone();
        let page = store.list_runs(page_query).await.unwrap();
        pages += 1;
        seen.extend(page.runs.iter().map(|run| run.run_id.clone()));
        // A run starting now sorts before every cursor: it never shifts later pages.
        let fresh = format!("fresh-{pages}");
        store
            .start_span(start(&fresh, &fresh, None, 5_000 + pages))
            .await
            .unwrap();
        match page.next {
            Some(next) => before = Some(RunCursor::decode(&next).unwrap()),
            None => break,
        }
    }
    assert_eq!(pages, 4);
    let mut expected: Vec<String> = (0..25).map(|index| format!("run-{index:02}")).collect();
    expected.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_run_with_several_roots_is_listed_once_from_its_first_root() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("roots.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    // Runs "b" and "d" have several roots (an OTLP trace may), interleaved in time with the
    // one-root runs "a", "c" and "e".
    for (span, run, at) in [
        ("b1", "b", 100),
        ("a1", "a", 200),
        ("b2", "b", 300),
        ("d1", "d", 350),
        ("c1", "c", 400),
        ("d2", "d", 500),
        ("d3", "d", 500),
        ("e1", "e", 600),
        ("b3", "b", 700),
    ] {
        store.start_span(start(span, run, None, at)).await.unwrap();
    }
    // Newest first, each run once, at its first root's start (the root its rollup is made from
    // and a pruned run is listed by).
    let page = store.list_runs(query(None, 10)).await.unwrap();
    let listed: Vec<(String, i64)> = page
        .runs
        .iter()
        .map(|run| (run.run_id.clone(), run.started_at))
        .collect();
    let expected: Vec<(String, i64)> = [("e", 600), ("c", 400), ("d", 350), ("a", 200), ("b", 100)]
        .iter()
        .map(|(run, at)| ((*run).to_owned(), *at))
        .collect();
    assert_eq!(listed, expected);
    assert_eq!(page.next, None);
    // Every page size reaches every run exactly once.
    for limit in 1..=5 {
        let mut seen = Vec::new();
        let mut before: Option<RunCursor> = None;
        loop {
            let mut page_query = query(None, limit);
            page_query.before = before.clone();
            let page = store.list_runs(page_query).await.unwrap();
            assert!(page.runs.len() <= limit as usize);
            seen.extend(page.runs.iter().map(|run| run.run_id.clone()));
            match page.next {
                Some(next) => before = Some(RunCursor::decode(&next).unwrap()),
                None => break,
            }
        }
        assert_eq!(seen, ["e", "c", "d", "a", "b"], "limit {limit}");
    }
}

/// A run with two roots was listed by its newest root's name, origin, start and outcome, with the
/// rollup's duration and failure reason, which come from its first root: a successful run with a
/// failure reason, missed by `outcome=error` and `origin=session`, and listed at another place
/// (and under the other root's name) once `prune` deleted its detail. It is listed from its first
/// root now, before and after the prune, and is open while any root is.
#[tokio::test]
async fn a_run_with_two_roots_is_listed_from_the_root_its_rollup_and_prune_use() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("two.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let store = SqliteActivityStore::with_identity(db, clock.clone(), "w");
    let mut first = start("m1", "m", None, 1_000);
    first.name = "first".into();
    store.start_span(first).await.unwrap();
    let mut second = start("m2", "cron-like", None, 4_000);
    second.run_id = "m".into();
    second.name = "second".into();
    store.start_span(second).await.unwrap();
    store
        .end_span("m1", end(SpanOutcome::Error, 6_000))
        .await
        .unwrap();

    // The first root ended, the second is still running: open, and with no end, outcome,
    // duration or failure yet, even once the first root's end was rolled up (a session whose
    // first turn failed and whose second runs); an outcome filter does not find it.
    store.rollup_run("m").await.unwrap();
    let page = store.list_runs(query(None, 10)).await.unwrap();
    assert_eq!(page.runs.len(), 1);
    let open = &page.runs[0];
    assert_eq!(open.name, "first");
    assert_eq!(open.state, RunState::Open);
    assert_eq!(
        (
            open.ended_at,
            &open.outcome,
            open.duration_ms,
            &open.failure_reason
        ),
        (None, &None, None, &None),
        "{open:?}"
    );
    assert_eq!(open.span_count, 2, "{open:?}");
    // The first turn's rollup says nothing of the run now; the running turn's heartbeat does.
    assert!(!open.rolled_up, "{open:?}");
    assert_eq!(open.last_heartbeat_at, Some(4_000), "{open:?}");
    assert_eq!(ids(&store, query(Some(RunState::Open), 10)).await, ["m"]);
    assert!(ids(&store, query(Some(RunState::Ended), 10))
        .await
        .is_empty());
    let mut failed = query(None, 10);
    failed.outcome = Some(SpanOutcome::Error);
    assert!(ids(&store, failed.clone()).await.is_empty());
    failed.state = Some(RunState::Open);
    assert!(ids(&store, failed).await.is_empty());

    store
        .end_span("m2", end(SpanOutcome::Success, 6_000))
        .await
        .unwrap();
    store.rollup_run("m").await.unwrap();
    let listed = |page: flightlog_core::activity::RunPage| {
        let run = page.runs.into_iter().next().expect("the run");
        (
            run.name,
            run.origin,
            run.started_at,
            run.outcome,
            run.duration_ms,
            run.failure_reason,
            run.state,
        )
    };
    let expected = (
        "first".to_owned(),
        SpanOrigin::Session,
        1_000,
        Some(SpanOutcome::Error),
        Some(5_000),
        Some("why".to_owned()),
        RunState::Ended,
    );
    assert_eq!(
        listed(store.list_runs(query(None, 10)).await.unwrap()),
        expected
    );
    let mut errors = query(None, 10);
    errors.outcome = Some(SpanOutcome::Error);
    errors.origin = Some(SpanOrigin::Session);
    assert_eq!(ids(&store, errors.clone()).await, ["m"]);

    let pruned = store
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: 7_000,
            hard_ceiling_ms: 100_000,
            now: Some(9_000),
            batch: None,
            scheduled: false,
        })
        .await
        .unwrap();
    assert_eq!(pruned.runs_pruned, 1, "{pruned:?}");
    assert_eq!(
        listed(store.list_runs(query(None, 10)).await.unwrap()),
        expected
    );
    assert_eq!(ids(&store, errors).await, ["m"]);
}

/// A rollup made while the run was open holds no end; once the root ended, the list showed the
/// end and outcome with the rollup's null duration and failure reason. Until the next rollup the
/// root's live figures stand now.
#[tokio::test]
async fn a_run_rolled_up_while_open_is_listed_live_once_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("early.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(9_000)), "w");
    store
        .start_span(start("p1", "p", None, 9_000))
        .await
        .unwrap();
    store.rollup_run("p").await.unwrap();
    store
        .end_span("p1", end(SpanOutcome::Error, 9_500))
        .await
        .unwrap();
    let page = store.list_runs(query(None, 1)).await.unwrap();
    let run = &page.runs[0];
    assert_eq!(run.outcome, Some(SpanOutcome::Error));
    assert_eq!(run.duration_ms, Some(500));
    assert_eq!(run.failure_reason.as_deref(), Some("why"));
    assert!(!run.rolled_up);
}

fn model_call(span_id: &str, run_id: &str, parent: &str, at: i64) -> StartSpanInput {
    StartSpanInput {
        name: format!("chat {span_id}"),
        kind: SpanKind::Model,
        ..start(span_id, run_id, Some(parent), at)
    }
}

fn used(input_tokens: i64, cost_usd: f64, at: i64) -> EndSpanInput {
    EndSpanInput {
        outcome: SpanOutcome::Success,
        reason: None,
        ended_at: Some(at),
        usage: Some(SpanUsage {
            input_tokens: Some(input_tokens),
            cost_usd: Some(cost_usd),
            ..SpanUsage::default()
        }),
        attrs: None,
    }
}

/// A run whose root reports no usage (its model calls do) is listed with its model spans' usage
/// while it runs and after its root ends, before anyone rolls it up, the figures its rollup then
/// holds: it was listed without tokens or cost until a rollup (an audit's finding). A root that
/// reports a field keeps it.
#[tokio::test]
async fn a_live_run_is_listed_with_the_usage_its_rollup_would_have() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("live.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w");
    store
        .start_span(start("root", "live", None, 1_000))
        .await
        .unwrap();
    for (index, tokens) in [(1, 50), (2, 70)] {
        let id = format!("call-{index}");
        store
            .start_span(model_call(&id, "live", "root", 1_000 + index))
            .await
            .unwrap();
        store
            .end_span(&id, used(tokens, 0.25, 1_100 + index))
            .await
            .unwrap();
    }
    let listed = |page: flightlog_core::activity::RunPage| {
        let run = page.runs.into_iter().next().expect("the run");
        (run.state, run.input_tokens, run.cost_usd, run.rolled_up)
    };
    let page = store.list_runs(query(None, 10)).await.unwrap();
    assert_eq!(
        listed(page),
        (RunState::Open, Some(120), Some(0.5), false),
        "open"
    );
    let mut root_end = end(SpanOutcome::Success, 2_000);
    root_end.usage = Some(SpanUsage {
        output_tokens: Some(9),
        ..SpanUsage::default()
    });
    store.end_span("root", root_end).await.unwrap();
    let page = store.list_runs(query(None, 10)).await.unwrap();
    assert_eq!(page.runs[0].output_tokens, Some(9), "the root's own field");
    assert_eq!(
        listed(page),
        (RunState::Ended, Some(120), Some(0.5), false),
        "ended, not rolled up"
    );
    store.rollup_run("live").await.unwrap();
    let page = store.list_runs(query(None, 10)).await.unwrap();
    assert_eq!(
        listed(page),
        (RunState::Ended, Some(120), Some(0.5), true),
        "rolled up"
    );
}

/// An ended run not rolled up is listed with the failure reason its rollup would have: the
/// first span to start that failed with a reason (a tool call's, under a root that succeeded),
/// else `interrupted` for an interrupted root; it was the root's reason alone (an audit).
#[tokio::test]
async fn a_live_run_is_listed_with_the_failure_reason_its_rollup_would_have() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("reason.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w");
    let ended_with = |outcome: SpanOutcome, reason: Option<&str>, at: i64| EndSpanInput {
        outcome,
        reason: reason.map(str::to_owned),
        ended_at: Some(at),
        usage: None,
        attrs: None,
    };
    // A tool failed under a root that succeeded; a later tool timed out.
    let tool_failed = [
        (
            "tool-1",
            Some("root-a"),
            11,
            SpanOutcome::Error,
            Some("tool crashed"),
        ),
        (
            "tool-2",
            Some("root-a"),
            12,
            SpanOutcome::Timeout,
            Some("too slow"),
        ),
        ("root-a", None, 10, SpanOutcome::Success, None),
    ];
    // An interrupted root, and a second root that failed with a reason.
    let roots = [
        (
            "root-b",
            None,
            20,
            SpanOutcome::Interrupted,
            Some("server restarted"),
        ),
        (
            "root-c",
            None,
            21,
            SpanOutcome::Error,
            Some("later root failed"),
        ),
    ];
    // Only an interrupted root, no reason anywhere.
    let interrupted = [("root-d", None, 30, SpanOutcome::Interrupted, None)];
    for (run_id, spans) in [
        ("tool-failed", &tool_failed[..]),
        ("two-roots", &roots[..]),
        ("interrupted", &interrupted[..]),
    ] {
        for (span_id, parent, at, _, _) in spans {
            store
                .start_span(start(span_id, run_id, *parent, *at))
                .await
                .unwrap();
        }
        for (span_id, _, at, outcome, reason) in spans {
            store
                .end_span(span_id, ended_with(outcome.clone(), *reason, at + 100))
                .await
                .unwrap();
        }
    }
    let reasons = |page: flightlog_core::activity::RunPage| {
        let mut listed: Vec<(String, Option<String>, bool)> = page
            .runs
            .into_iter()
            .map(|run| (run.run_id, run.failure_reason, run.rolled_up))
            .collect();
        listed.sort();
        listed
    };
    let expected = |rolled_up: bool| {
        vec![
            (
                "interrupted".to_owned(),
                Some("interrupted".to_owned()),
                rolled_up,
            ),
            (
                "tool-failed".to_owned(),
                Some("tool crashed".to_owned()),
                rolled_up,
            ),
            (
                "two-roots".to_owned(),
                Some("later root failed".to_owned()),
                rolled_up,
            ),
        ]
    };
    let live = reasons(store.list_runs(query(None, 10)).await.unwrap());
    assert_eq!(live, expected(false), "ended, not rolled up");
    for run_id in ["tool-failed", "two-roots", "interrupted"] {
        store.rollup_run(run_id).await.unwrap();
    }
    let rolled_up = reasons(store.list_runs(query(None, 10)).await.unwrap());
    assert_eq!(rolled_up, expected(true), "rolled up");
}

/// A page reads at most 100,000 spans for its live runs' usage: a run past that budget says
/// its usage was not read (`liveUsageSkipped`), where it looked like a run that used nothing
/// (an audit's finding: the same run showed 60,000 tokens on a page of one, none on a page of
/// two); a page starting at it reads it.
#[tokio::test]
async fn a_live_run_past_the_pages_usage_budget_says_its_usage_was_not_read() {
    use flightlog_core::activity::ActivityWrite;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("budget.db")))
        .expect("the database opens");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w");
    // Two open runs of 60,000 model calls each under a root that reports no usage: "older",
    // then "newer" (listed first).
    for (run_id, at) in [("older", 1_000), ("newer", 2_000)] {
        let root = format!("{run_id}-root");
        store
            .start_span(start(&root, run_id, None, at))
            .await
            .expect("the root starts");
        for chunk in 0..60 {
            let writes = (0..1_000)
                .flat_map(|index| {
                    let id = format!("{run_id}-call-{chunk}-{index}");
                    [
                        ActivityWrite::StartSpan(model_call(&id, run_id, &root, at + 1)),
                        ActivityWrite::EndSpan {
                            span_id: id,
                            input: used(1, 0.0, at + 2),
                        },
                    ]
                })
                .collect();
            for result in store.write_batch(writes).await {
                result.expect("each write of the batch");
            }
        }
    }
    let page = store
        .list_runs(query(None, 2))
        .await
        .expect("a page of two");
    let figures: Vec<(String, Option<i64>, bool)> = page
        .runs
        .into_iter()
        .map(|run| (run.run_id, run.input_tokens, run.live_usage_skipped))
        .collect();
    assert_eq!(
        figures,
        vec![
            ("newer".to_owned(), Some(60_000), false),
            ("older".to_owned(), None, true),
        ]
    );
    let page = store
        .list_runs(RunListQuery {
            before: Some(RunCursor {
                started_at: 2_000,
                run_id: "newer".into(),
            }),
            ..query(None, 1)
        })
        .await
        .expect("a page starting at it");
    assert_eq!(
        (page.runs[0].input_tokens, page.runs[0].live_usage_skipped),
        (Some(60_000), false)
    );
    let json = serde_json::to_value(&page.runs[0]).expect("serialized");
    assert!(json.get("liveUsageSkipped").is_none(), "{json}");
}

/// An OpenTelemetry SDK exports a span when it ends, so a trace's root, which ends last, comes
/// after all its other spans: such a run is listed open while it waits for its root (it was not
/// listed at all, so a running agent was invisible), named by its earliest span, with its model
/// spans' usage; once the root comes it is listed from the root.
#[tokio::test]
async fn a_run_whose_root_has_not_arrived_is_listed_open_until_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("awaiting.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let store = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "w");

    store
        .start_span(model_call("m1", "run-x", "x", 120))
        .await
        .unwrap();
    store.end_span("m1", used(100, 0.5, 130)).await.unwrap();
    store
        .start_span(model_call("m2", "run-x", "x", 140))
        .await
        .unwrap();
    store.end_span("m2", used(20, 0.25, 150)).await.unwrap();
    // A tool call under the first model call: not summed.
    store
        .start_span(start("t1", "run-x", Some("m1"), 125))
        .await
        .unwrap();
    // An ordinary run that started later.
    store
        .start_span(start("r", "run-r", None, 500))
        .await
        .unwrap();

    let page = store.list_runs(query(None, 10)).await.unwrap();
    let listed: Vec<&str> = page.runs.iter().map(|run| run.run_id.as_str()).collect();
    assert_eq!(listed, ["run-r", "run-x"]);
    let waiting = &page.runs[1];
    assert!(waiting.awaiting_root);
    assert!(!page.runs[0].awaiting_root);
    assert_eq!(waiting.state, RunState::Open);
    assert_eq!(waiting.name, "chat m1");
    assert_eq!(waiting.started_at, 120);
    assert_eq!(
        (
            waiting.ended_at,
            waiting.outcome.clone(),
            waiting.duration_ms
        ),
        (None, None, None)
    );
    assert_eq!(waiting.span_count, 3);
    assert_eq!(waiting.input_tokens, Some(120));
    assert_eq!(waiting.cost_usd, Some(0.75));
    assert!(!waiting.rolled_up && !waiting.detail_pruned);

    // Filters: it is open, has no outcome, and its origin is its earliest span's.
    assert_eq!(
        ids(&store, query(Some(RunState::Open), 10)).await,
        ["run-r", "run-x"]
    );
    assert_eq!(
        ids(&store, query(Some(RunState::Ended), 10)).await,
        Vec::<String>::new()
    );
    let by_outcome = RunListQuery {
        outcome: Some(SpanOutcome::Success),
        ..query(None, 10)
    };
    assert_eq!(ids(&store, by_outcome).await, Vec::<String>::new());
    let by_origin = |origin| RunListQuery {
        origin: Some(origin),
        ..query(None, 10)
    };
    assert_eq!(
        ids(&store, by_origin(SpanOrigin::Session)).await,
        ["run-r", "run-x"]
    );
    assert_eq!(
        ids(&store, by_origin(SpanOrigin::Cron)).await,
        Vec::<String>::new()
    );
    // Paging through both kinds: one run a page, neither skipped nor repeated.
    let first = store.list_runs(query(None, 1)).await.unwrap();
    assert_eq!(first.runs[0].run_id, "run-r");
    let second = store
        .list_runs(RunListQuery {
            before: RunCursor::decode(first.next.as_deref().expect("a next page")),
            ..query(None, 1)
        })
        .await
        .unwrap();
    assert_eq!(second.runs[0].run_id, "run-x");
    assert_eq!(second.next, None);

    // A span that started earlier moves the run's place; the table survives a reopen.
    store
        .start_span(model_call("m0", "run-x", "x", 110))
        .await
        .unwrap();
    db.close().await.unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "w");
    let page = store.list_runs(query(None, 10)).await.unwrap();
    assert_eq!(page.runs[1].run_id, "run-x");
    assert_eq!(page.runs[1].started_at, 110);
    assert_eq!(page.runs[1].name, "chat m0");
    assert!(page.runs[1].awaiting_root);

    // The root arrives (it started first and ends last): listed from it, as any run.
    store
        .start_span(start("x", "run-x", None, 100))
        .await
        .unwrap();
    let page = store.list_runs(query(None, 10)).await.unwrap();
    let run_x = page
        .runs
        .iter()
        .find(|run| run.run_id == "run-x")
        .expect("run-x listed");
    assert!(!run_x.awaiting_root);
    assert_eq!((run_x.name.as_str(), run_x.started_at), ("run-x work", 100));
    assert_eq!(page.runs.len(), 2, "listed once: {:?}", page.runs);
    let waiting_rows: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM activity_runs_awaiting_root",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(waiting_rows, 0);
    db.close().await.unwrap();
}

/// A trace whose root never comes (its caller exports elsewhere) has no rollup, the only thing
/// `prune` picked runs by, so its detail was kept forever: the hard ceiling now prunes such a
/// run of OTLP spans once none of its spans is open and the newest is older than the ceiling,
/// leaving a digest rollup (its usage kept, `root never arrived`). A rootless run of the
/// reference's own origins keeps the reference's prune (kept).
#[tokio::test]
async fn prune_deletes_a_trace_whose_root_never_came_behind_the_hard_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("rootless.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let store = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "w");
    let traced = |span_id: &str, run_id: &str, at: i64| StartSpanInput {
        origin: SpanOrigin::Otlp,
        ..model_call(span_id, run_id, "gone", at)
    };
    // Old and ended: pruned.
    store
        .start_span(traced("o1", "run-old", 100))
        .await
        .unwrap();
    store.end_span("o1", used(1, 0.1, 200)).await.unwrap();
    // Old but one span still open: kept, as any run with an open span.
    store
        .start_span(traced("p1", "run-open", 100))
        .await
        .unwrap();
    // Started before the ceiling but its newest span ended after it: kept.
    store
        .start_span(traced("n1", "run-new", 100))
        .await
        .unwrap();
    store.end_span("n1", used(1, 0.1, 5_000)).await.unwrap();
    // Old and ended, but written natively as a session: the reference keeps it.
    store
        .start_span(model_call("s1", "run-session", "gone", 100))
        .await
        .unwrap();
    store.end_span("s1", used(1, 0.1, 200)).await.unwrap();
    let prune = |batch| PruneOptions {
        max_spans: None,
        digest_floor_at: 0,
        hard_ceiling_ms: 9_000,
        now: Some(10_000),
        batch,
        scheduled: false,
    };
    assert_eq!(store.prune(prune(Some(0))).await.unwrap().runs_pruned, 0);
    let pruned = store.prune(prune(None)).await.unwrap();
    assert_eq!((pruned.runs_pruned, pruned.spans_deleted), (1, 1));
    assert!(store.get_span("o1").await.unwrap().is_none());
    let page = store.list_runs(query(None, 10)).await.unwrap();
    let listed: Vec<&str> = page.runs.iter().map(|run| run.run_id.as_str()).collect();
    assert_eq!(listed, ["run-session", "run-open", "run-old", "run-new"]);
    let digest = &page.runs[2];
    assert_eq!(digest.state, RunState::Ended);
    assert!(digest.detail_pruned && digest.rolled_up && !digest.awaiting_root);
    assert_eq!(digest.failure_reason.as_deref(), Some("root never arrived"));
    assert_eq!(digest.outcome, None);
    assert_eq!((digest.started_at, digest.ended_at), (100, Some(200)));
    assert_eq!((digest.input_tokens, digest.cost_usd), (Some(1), Some(0.1)));
    let rollup = store
        .read_rollup("run-old")
        .await
        .unwrap()
        .expect("a digest");
    assert!(rollup.detail_pruned);
    // The deleted span's id is free again, as after any prune; the run's new detail lists it.
    store
        .start_span(traced("o1", "run-old", 300))
        .await
        .unwrap();
    let page = store.list_runs(query(None, 10)).await.unwrap();
    let run_old = page
        .runs
        .iter()
        .find(|run| run.run_id == "run-old")
        .unwrap();
    assert!(run_old.awaiting_root && run_old.state == RunState::Open);
    // Part of its detail is gone: the entry says so, as its rollup row does.
    assert!(run_old.detail_pruned && !run_old.rolled_up);
    assert!(
        store
            .read_rollup("run-old")
            .await
            .unwrap()
            .unwrap()
            .detail_pruned
    );
    db.close().await.unwrap();
}

/// A run written to again after its prune is listed from its new root, live, and still says its
/// earlier detail was pruned: the list entry and the rollup row agree.
#[tokio::test]
async fn a_run_written_again_after_its_prune_says_its_detail_was_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("runs.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db.clone(), Arc::new(ManualClock::new(0)), "w");
    end_roll_up_and_prune(&store, "a", "again").await;
    let listed = store.list_runs(query(None, 10)).await.unwrap().runs;
    assert!(listed[0].detail_pruned && listed[0].rolled_up);

    store
        .start_span(start("b", "again", None, 300))
        .await
        .unwrap();
    let listed = store.list_runs(query(None, 10)).await.unwrap().runs;
    assert_eq!(listed.len(), 1);
    let entry = &listed[0];
    assert_eq!((entry.state, entry.started_at), (RunState::Open, 300));
    assert!(entry.detail_pruned && !entry.rolled_up && !entry.awaiting_root);
    assert!(
        store
            .read_rollup("again")
            .await
            .unwrap()
            .unwrap()
            .detail_pruned
    );

    // Ended and rolled up again: listed from the new rollup, which counts the detail left.
    store
        .end_span("b", end(SpanOutcome::Success, 400))
        .await
        .unwrap();
    store.rollup_run("again").await.unwrap();
    let listed = store.list_runs(query(None, 10)).await.unwrap().runs;
    let entry = &listed[0];
    assert_eq!((entry.state, entry.span_count), (RunState::Ended, 1));
    assert!(entry.detail_pruned && entry.rolled_up);
    db.close().await.unwrap();
}

/// A database an earlier flightlog wrote (schema version 8) learns which of its runs wait for a
/// root when it is opened: they are listed at once.
#[tokio::test]
async fn an_upgraded_database_lists_its_runs_that_wait_for_a_root() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v8.db");
    {
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        flightlog_sqlite::migrate_up_to(&mut conn, 8).unwrap();
        conn.execute_batch(
            "INSERT INTO activity_writers (writer_key, writer) VALUES (1, 'w');
             INSERT INTO activity_runs (run_key, run_id) VALUES (1, 'rooted'), (2, 'waiting');
             INSERT INTO activity_spans (span_id, run_key, parent_span_id, name, kind, origin,
               started_at, writer_key) VALUES
               ('r', 1, NULL, 'root', 'turn', 'session', 50, 1),
               ('r1', 1, 'r', 'child', 'tool', 'session', 60, 1),
               ('w2', 2, 'elsewhere', 'second', 'model', 'otlp', 90, 1),
               ('w1', 2, 'elsewhere', 'first', 'model', 'otlp', 70, 1);",
        )
        .unwrap();
    }
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = SqliteActivityStore::with_identity(db.clone(), Arc::new(ManualClock::new(0)), "w");
    let page = store.list_runs(query(None, 10)).await.unwrap();
    let listed: Vec<(&str, &str, i64, bool)> = page
        .runs
        .iter()
        .map(|run| {
            (
                run.run_id.as_str(),
                run.name.as_str(),
                run.started_at,
                run.awaiting_root,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("waiting", "first", 70, true),
            ("rooted", "root", 50, false)
        ]
    );
    db.close().await.unwrap();
}

/// A run with no root that a native writer closed (cascade close rolls it up) has ended: it is
/// listed ended with its rollup's outcome and totals, and found by the `ended` and outcome
/// filters (it was listed open forever, with no outcome).
#[tokio::test]
async fn a_rootless_run_closed_and_rolled_up_is_listed_ended() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("closed.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db.clone(), Arc::new(ManualClock::new(0)), "w");
    store
        .start_span(model_call("m", "run-c", "", 10))
        .await
        .unwrap();
    store.end_span("m", used(5, 0.5, 20)).await.unwrap();
    store
        .start_span(start("t", "run-c", Some("m"), 12))
        .await
        .unwrap();
    store
        .cascade_close("run-c", SpanOutcome::Timeout, "slow")
        .await
        .unwrap();
    let page = store.list_runs(query(None, 10)).await.unwrap();
    let run = &page.runs[0];
    assert_eq!(run.state, RunState::Ended, "{run:?}");
    assert!(run.awaiting_root && run.rolled_up, "{run:?}");
    assert_eq!(run.outcome, Some(SpanOutcome::Success), "{run:?}");
    assert_eq!(run.input_tokens, Some(5), "{run:?}");
    assert_eq!(run.failure_reason.as_deref(), Some("slow"), "{run:?}");
    assert_eq!(
        ids(&store, query(Some(RunState::Ended), 10)).await,
        ["run-c"]
    );
    assert!(ids(&store, query(Some(RunState::Open), 10))
        .await
        .is_empty());
    let by_outcome = |outcome| RunListQuery {
        outcome: Some(outcome),
        ..query(None, 10)
    };
    assert_eq!(
        ids(&store, by_outcome(SpanOutcome::Success)).await,
        ["run-c"]
    );
    assert!(ids(&store, by_outcome(SpanOutcome::Error)).await.is_empty());
    db.close().await.unwrap();
}

/// `max_spans` bounds what one prune deletes by the runs' span counts (the first run always
/// goes, however big), so a scheduled prune's transaction stays short whatever the runs' sizes;
/// without it, the run count alone bounds it, as the reference's `batch`.
#[tokio::test]
async fn a_span_budget_bounds_what_one_prune_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("runs.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(10_000)), "w");
    // Runs of 3, 3, 6 and 1 spans, ended in that order.
    for (run, spans, ended) in [
        ("r1", 3, 200),
        ("r2", 3, 300),
        ("r3", 6, 400),
        ("r4", 1, 500),
    ] {
        store
            .start_span(start(&format!("{run}-0"), run, None, 100))
            .await
            .unwrap();
        for n in 1..spans {
            let id = format!("{run}-{n}");
            store
                .start_span(start(&id, run, Some(&format!("{run}-0")), 110))
                .await
                .unwrap();
            store
                .end_span(&id, end(SpanOutcome::Success, 150))
                .await
                .unwrap();
        }
        store
            .end_span(&format!("{run}-0"), end(SpanOutcome::Success, ended))
            .await
            .unwrap();
        store.rollup_run(run).await.unwrap();
    }
    let prune = |max_spans| PruneOptions {
        digest_floor_at: 1_000,
        hard_ceiling_ms: 1_000_000,
        now: Some(10_000),
        batch: Some(50),
        max_spans,
        scheduled: false,
    };
    let mut calls = Vec::new();
    loop {
        let pruned = store.prune(prune(Some(5))).await.unwrap();
        if pruned.runs_pruned == 0 {
            break;
        }
        calls.push((pruned.runs_pruned, pruned.spans_deleted));
    }
    // 3 fits, 3 + 3 does not; 3; 6 alone (the first always goes); 1.
    assert_eq!(calls, [(1, 3), (1, 3), (1, 6), (1, 1)]);
    assert!(store.get_span("r4-0").await.unwrap().is_none());
    for run in ["r1", "r2", "r3", "r4"] {
        assert!(store.read_rollup(run).await.unwrap().unwrap().detail_pruned);
    }
}

/// `sweep_stale_step` closes the runs of at most `max_roots` stale roots a call, oldest first,
/// and says whether more remain; what it closes is what `sweep_stale` would (its own writer's
/// runs and live roots spared).
#[tokio::test]
async fn a_stale_sweep_in_steps_closes_the_oldest_first_and_says_when_done() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("runs.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let sweeper = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "sweeper");
    let agent = SqliteActivityStore::with_identity(db, clock.clone(), "agent");
    for (n, at) in [(1, 100), (2, 200), (3, 300), (4, 9_500)] {
        let run = format!("run-{n}");
        agent
            .start_span(start(&format!("root-{n}"), &run, None, at))
            .await
            .unwrap();
        agent
            .start_span(start(
                &format!("child-{n}"),
                &run,
                Some(&format!("root-{n}")),
                at,
            ))
            .await
            .unwrap();
    }
    // The sweeper's own run is never its to close.
    sweeper
        .start_span(start("own", "run-own", None, 100))
        .await
        .unwrap();
    let step = || sweeper.sweep_stale_step(1_000, Some(10_000), 2);
    assert_eq!(step().await.unwrap(), (4, true));
    assert!(agent
        .get_span("root-2")
        .await
        .unwrap()
        .unwrap()
        .outcome
        .is_some());
    assert!(agent
        .get_span("root-3")
        .await
        .unwrap()
        .unwrap()
        .outcome
        .is_none());
    assert_eq!(step().await.unwrap(), (2, false));
    assert_eq!(step().await.unwrap(), (0, false));
    // run-4 (heartbeat age 500 ms) and the sweeper's own survive.
    assert!(agent
        .get_span("root-4")
        .await
        .unwrap()
        .unwrap()
        .outcome
        .is_none());
    assert!(sweeper
        .get_span("own")
        .await
        .unwrap()
        .unwrap()
        .outcome
        .is_none());
}

/// `sweep_leftovers_step` closes the spans left open in runs without an open root (the root
/// ended without them, or never came) once the run's last sign of life is older than the
/// window, in steps; a recent end, a recent sibling, a heartbeat of the open
/// span, an open root (the stale sweep's to judge) and the sweeper's own span each spare a run.
/// A run it closes can then be pruned, which its open span kept from ever happening.
#[tokio::test]
async fn the_leftover_sweep_closes_spans_left_open_after_their_run_ended() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("runs.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let sweeper = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "sweeper");
    let agent = SqliteActivityStore::with_identity(db, clock.clone(), "agent");
    // (run, root end (None: open), open child's start, writer of the open child)
    let runs: [(&str, Option<i64>, i64, &SqliteActivityStore); 5] = [
        ("ended", Some(200), 150, &agent),
        ("ended-recently", Some(9_500), 150, &agent),
        ("heartbeating", Some(200), 150, &agent),
        ("open-root", None, 150, &agent),
        ("sweepers-own", Some(200), 150, &sweeper),
    ];
    for (run, root_end, child_start, child_writer) in runs {
        let root = format!("{run}/root");
        agent
            .start_span(start(&root, run, None, 100))
            .await
            .unwrap();
        child_writer
            .start_span(start(&format!("{run}/left"), run, Some(&root), child_start))
            .await
            .unwrap();
        if let Some(at) = root_end {
            assert!(agent
                .end_span(&root, end(SpanOutcome::Success, at))
                .await
                .unwrap());
            agent.rollup_run(run).await.unwrap();
        }
    }
    agent
        .heartbeat("heartbeating/left", Some(9_600))
        .await
        .unwrap();
    // A sibling that started and ended a moment ago says the writer is still at work.
    agent
        .start_span(start("ended/busy", "busy", None, 100))
        .await
        .unwrap();
    agent
        .end_span("ended/busy", end(SpanOutcome::Success, 200))
        .await
        .unwrap();
    agent
        .start_span(start("busy/left", "busy", Some("ended/busy"), 120))
        .await
        .unwrap();
    agent
        .start_span(start("busy/sibling", "busy", Some("ended/busy"), 9_800))
        .await
        .unwrap();
    agent
        .end_span("busy/sibling", end(SpanOutcome::Success, 9_900))
        .await
        .unwrap();
    // A run whose root never came (an OTLP trace continued from another service, say).
    agent
        .start_span(start("rootless/left", "rootless", Some("elsewhere"), 50))
        .await
        .unwrap();

    let prune_all = || PruneOptions {
        max_spans: None,
        digest_floor_at: 10_000,
        hard_ceiling_ms: 0,
        now: Some(10_000),
        batch: None,
        scheduled: false,
    };
    assert_eq!(agent.prune(prune_all()).await.unwrap().runs_pruned, 0);

    let step = || sweeper.sweep_leftovers_step(1_000, Some(10_000), 1);
    assert_eq!(step().await.unwrap(), (1, true), "one run a step");
    let open = |span: &'static str| {
        let agent = &agent;
        async move {
            agent
                .get_span(span)
                .await
                .unwrap()
                .unwrap()
                .outcome
                .is_none()
        }
    };
    assert_ne!(open("ended/left").await, open("rootless/left").await);
    assert_eq!(step().await.unwrap(), (1, false));
    assert_eq!(step().await.unwrap(), (0, false));
    for closed in ["rootless/left", "ended/left"] {
        let span = agent.get_span(closed).await.unwrap().unwrap();
        assert_eq!(span.outcome, Some(SpanOutcome::Interrupted), "{closed}");
        assert_eq!(span.outcome_reason.as_deref(), Some("writer went silent"));
    }
    for spared in [
        "ended-recently/left",
        "heartbeating/left",
        "open-root/left",
        "sweepers-own/left",
        "busy/left",
    ] {
        let span = agent.get_span(spared).await.unwrap().unwrap();
        assert!(span.outcome.is_none(), "{spared} was closed");
    }
    // The run keeps the outcome its root gave it; its detail can now go.
    let rollup = agent.read_rollup("ended").await.unwrap().unwrap();
    assert_eq!(rollup.outcome, Some(SpanOutcome::Success));
    let pruned = agent.prune(prune_all()).await.unwrap();
    assert!(pruned.runs_pruned >= 1, "{pruned:?}");
    assert!(agent.get_span("ended/left").await.unwrap().is_none());

    // Once the window has passed for the others too, only the open root's run (the stale
    // sweep's) and the sweeper's own remain open.
    assert_eq!(
        sweeper
            .sweep_leftovers_step(1_000, Some(20_000), 10)
            .await
            .unwrap(),
        (3, false)
    );
    for still_open in ["open-root/left", "sweepers-own/left"] {
        let span = agent.get_span(still_open).await.unwrap().unwrap();
        assert!(span.outcome.is_none(), "{still_open} was closed");
    }
}

/// A root that started before the run's first one arrives after the run was rolled up: the
/// run is listed by it now, and the rollup, made from the other root, is not mixed in (its
/// duration, count and failure beside this root's name, end and outcome) until the next rollup.
#[tokio::test]
async fn a_rollup_made_from_another_root_is_not_mixed_into_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("late.db"))).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    let mut turn = start("turn", "b", None, 1_000);
    turn.name = "turn".into();
    store.start_span(turn).await.unwrap();
    store
        .end_span("turn", end(SpanOutcome::Error, 2_000))
        .await
        .unwrap();
    store.rollup_run("b").await.unwrap();
    let mut earlier = start("earlier", "b", None, 500);
    earlier.name = "earlier".into();
    store.start_span(earlier).await.unwrap();
    store
        .end_span("earlier", end(SpanOutcome::Success, 2_500))
        .await
        .unwrap();

    let entry = store.list_runs(query(None, 10)).await.unwrap().runs[0].clone();
    assert_eq!(
        (
            entry.name.as_str(),
            entry.started_at,
            entry.ended_at,
            entry.outcome.clone(),
            entry.duration_ms,
            entry.span_count,
            entry.rolled_up
        ),
        (
            "earlier",
            500,
            Some(2_500),
            Some(SpanOutcome::Success),
            Some(2_000),
            2,
            false
        ),
        "{entry:?}"
    );
    // The next rollup is made from the listed root: its figures again.
    store.rollup_run("b").await.unwrap();
    let entry = store.list_runs(query(None, 10)).await.unwrap().runs[0].clone();
    assert!(entry.rolled_up, "{entry:?}");
    assert_eq!(
        (entry.ended_at, entry.duration_ms, entry.span_count),
        (Some(2_500), Some(2_000), 2)
    );
}

/// A session whose first turn was left open while its second one runs: the reference's
/// `sweep_stale` closes the whole run for the silent turn, the live one with it; the scheduled
/// sweep's steps spare the run until every open root is silent.
#[tokio::test]
async fn the_scheduled_stale_sweep_spares_a_run_with_a_live_root() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("turns.db"))).unwrap();
    let clock = Arc::new(ManualClock::new(10_000));
    let sweeper = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "sweeper");
    let agent = SqliteActivityStore::with_identity(db, clock.clone(), "agent");
    for (run, live_at) in [("kept", 9_800), ("reference", 9_800)] {
        agent
            .start_span(start(&format!("{run}-turn-1"), run, None, 100))
            .await
            .unwrap();
        agent
            .start_span(start(&format!("{run}-turn-2"), run, None, live_at))
            .await
            .unwrap();
    }
    let open = |span: &'static str| {
        let agent = &agent;
        async move {
            agent
                .get_span(span)
                .await
                .unwrap()
                .unwrap()
                .outcome
                .is_none()
        }
    };
    assert_eq!(
        sweeper
            .sweep_stale_step(1_000, Some(10_000), 10)
            .await
            .unwrap(),
        (0, false)
    );
    assert!(open("kept-turn-1").await && open("kept-turn-2").await);
    // The reference's sweep closes both runs, live turns and all.
    assert_eq!(sweeper.sweep_stale(1_000, Some(10_000)).await.unwrap(), 4);
    assert!(!open("kept-turn-2").await);

    // Once every open root is silent, the step closes the run.
    agent
        .start_span(start("late-1", "late", None, 100))
        .await
        .unwrap();
    agent
        .start_span(start("late-2", "late", None, 9_800))
        .await
        .unwrap();
    assert_eq!(
        sweeper
            .sweep_stale_step(1_000, Some(20_000), 10)
            .await
            .unwrap()
            .0,
        2
    );
}

/// A store on a new file in a scratch folder, its clock at 10,000 (the folder goes with the
/// first value).
fn store_at_10_000() -> (tempfile::TempDir, SqliteActivityStore) {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("runs.db")))
        .expect("the database opens");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(10_000)), "w");
    (dir, store)
}

/// A prune at 10,000 in batches of 50: the endpoint's (`scheduled` false) or the scheduled one.
fn prune_at_10_000(digest_floor_at: i64, hard_ceiling_ms: i64, scheduled: bool) -> PruneOptions {
    PruneOptions {
        digest_floor_at,
        hard_ceiling_ms,
        now: Some(10_000),
        batch: Some(50),
        max_spans: None,
        scheduled,
    }
}

/// A run written to again after its prune (its id reused: a new root, ended and rolled up)
/// keeps a rollup that says `detailPruned`, as the reference's row does, so the reference's
/// prune rule (`detail_pruned = 0`) never takes it again and its new detail would stay forever.
/// The endpoint's prune keeps the reference's count; the scheduled prune (`scheduled`)
/// takes such a run once its new life is old enough, and takes it only once.
#[tokio::test]
async fn a_run_written_to_again_after_its_prune_is_pruned_again_by_the_scheduled_prune() {
    let (_dir, store) = store_at_10_000();
    end_roll_up_and_prune(&store, "a", "run-a").await;

    // Its second life: a root started and ended at 3,000 and 3,500, rolled up.
    store
        .start_span(start("a2", "run-a", None, 3_000))
        .await
        .expect("the id is taken again");
    store
        .start_span(start("a2-child", "run-a", Some("a2"), 3_100))
        .await
        .expect("a child");
    for span in ["a2-child", "a2"] {
        store
            .end_span(span, end(SpanOutcome::Error, 3_500))
            .await
            .expect("end");
    }
    store.rollup_run("run-a").await.expect("rollup");
    let rollup = store.read_rollup("run-a").await.unwrap().expect("a rollup");
    assert!(rollup.detail_pruned, "{rollup:?}");
    assert_eq!(rollup.ended_at, Some(3_500));

    let prune = |floor, scheduled| prune_at_10_000(floor, 1_000_000, scheduled);
    // The reference's rule: never again.
    assert_eq!(
        store.prune(prune(5_000, false)).await.unwrap().runs_pruned,
        0
    );
    assert!(store.get_span("a2").await.unwrap().is_some());
    // Not before its new life is old enough.
    assert_eq!(
        store.prune(prune(3_000, true)).await.unwrap().runs_pruned,
        0
    );
    assert!(store.get_span("a2").await.unwrap().is_some());
    let pruned = store.prune(prune(5_000, true)).await.unwrap();
    assert_eq!((pruned.runs_pruned, pruned.spans_deleted), (1, 2));
    assert!(store.get_span("a2").await.unwrap().is_none());
    assert!(store.get_span("a2-child").await.unwrap().is_none());
    let rollup = store.read_rollup("run-a").await.unwrap().expect("kept");
    assert!(rollup.detail_pruned, "{rollup:?}");
    assert_eq!(rollup.ended_at, Some(3_500));
    // Once: nothing is left to take.
    assert_eq!(
        store.prune(prune(5_000, true)).await.unwrap().runs_pruned,
        0
    );
    // Listed as a pruned run again.
    let page = store.list_runs(query(None, 10)).await.unwrap();
    assert_eq!(page.runs.len(), 1);
    assert!(page.runs[0].detail_pruned, "{:?}", page.runs[0]);
}

/// Ended runs nobody rolled up (the reference prunes a run through its rollup only): the
/// scheduled prune rolls up those whose spans all ended before the ceiling and prunes them,
/// a rooted one and one whose spans hang from a span of another run (a subagent's run, listed
/// open for good before); a run with an open span, or one that ended after the ceiling, stays.
/// The endpoint's prune (the reference's rule) takes none of them.
#[tokio::test]
async fn ended_runs_nobody_rolled_up_are_rolled_up_and_pruned_by_the_scheduled_prune() {
    let (_dir, store) = store_at_10_000();
    // Rooted, ended at 200, never rolled up.
    store
        .start_span(start("r", "rooted", None, 100))
        .await
        .unwrap();
    store
        .start_span(start("r-tool", "rooted", Some("r"), 110))
        .await
        .unwrap();
    for span in ["r-tool", "r"] {
        store
            .end_span(span, end(SpanOutcome::Success, 200))
            .await
            .unwrap();
    }
    // A subagent's run: its span's parent is a span of `rooted`.
    store
        .start_span(start("sub", "subagent", Some("r"), 120))
        .await
        .unwrap();
    store
        .end_span("sub", end(SpanOutcome::Error, 190))
        .await
        .unwrap();
    // Still running, and ended after the ceiling: both stay.
    store
        .start_span(start("o", "open", None, 100))
        .await
        .unwrap();
    store
        .start_span(start("l", "late", None, 100))
        .await
        .unwrap();
    store
        .end_span("l", end(SpanOutcome::Success, 5_000))
        .await
        .unwrap();

    let prune = |scheduled| prune_at_10_000(1_000, 9_000, scheduled);
    assert_eq!(store.prune(prune(false)).await.unwrap().runs_pruned, 0);
    let pruned = store.prune(prune(true)).await.unwrap();
    assert_eq!(
        (pruned.runs_pruned, pruned.spans_deleted),
        (2, 3),
        "{pruned:?}"
    );
    for (run, outcome) in [
        ("rooted", SpanOutcome::Success),
        ("subagent", SpanOutcome::Error),
    ] {
        let rollup = store.read_rollup(run).await.unwrap().expect("rolled up");
        assert!(rollup.detail_pruned, "{rollup:?}");
        assert_eq!(rollup.outcome, Some(outcome), "{rollup:?}");
        assert!(store.snapshot_run(run).await.unwrap().is_none(), "{run}");
    }
    assert_eq!(
        store
            .read_rollup("subagent")
            .await
            .unwrap()
            .unwrap()
            .ended_at,
        Some(190)
    );
    for run in ["open", "late"] {
        assert!(store.read_rollup(run).await.unwrap().is_none(), "{run}");
        assert!(store.snapshot_run(run).await.unwrap().is_some(), "{run}");
    }
    let ended = ids(&store, query(Some(RunState::Ended), 10)).await;
    assert_eq!(ended, ["subagent", "rooted", "late"]);
    assert_eq!(store.prune(prune(true)).await.unwrap().runs_pruned, 0);
}

/// A pruned run written to again with `otlp` spans and no root, then rolled up, is both a
/// rewritten run and a rootless one: the scheduled prune takes it once and counts it once.
#[tokio::test]
async fn a_rewritten_rootless_run_is_pruned_and_counted_once() {
    let (_dir, store) = store_at_10_000();
    end_roll_up_and_prune(&store, "a", "run-a").await;
    let mut again = start("a2", "run-a", Some("gone"), 3_000);
    again.origin = SpanOrigin::Otlp;
    store.start_span(again).await.unwrap();
    store
        .end_span("a2", end(SpanOutcome::Success, 3_010))
        .await
        .unwrap();
    store.rollup_run("run-a").await.unwrap();
    let pruned = store
        .prune(prune_at_10_000(5_000, 5_000, true))
        .await
        .unwrap();
    assert_eq!(
        (pruned.runs_pruned, pruned.spans_deleted),
        (1, 1),
        "{pruned:?}"
    );
    assert!(store.get_span("a2").await.unwrap().is_none());
}

/// Runs a prune could not take by their rollup: one rolled up while still open (the reference
/// allows a rollup at any time; it has no end) and a pruned run written to again and not rolled
/// up since. The scheduled prune rolls them up and takes them once they ended before the window.
#[tokio::test]
async fn runs_rolled_up_while_open_or_rewritten_without_a_rollup_are_pruned_by_the_scheduled_prune()
{
    let (_dir, store) = store_at_10_000();
    end_roll_up_and_prune(&store, "a", "run-a").await;
    store
        .start_span(start("a2", "run-a", None, 3_000))
        .await
        .unwrap();
    store
        .end_span("a2", end(SpanOutcome::Success, 3_100))
        .await
        .unwrap();
    store
        .start_span(start("b", "run-b", None, 3_000))
        .await
        .unwrap();
    store.rollup_run("run-b").await.unwrap();
    store
        .end_span("b", end(SpanOutcome::Success, 3_200))
        .await
        .unwrap();
    let prune = |scheduled| prune_at_10_000(5_000, 5_000, scheduled);
    assert_eq!(store.prune(prune(false)).await.unwrap().runs_pruned, 0);
    let pruned = store.prune(prune(true)).await.unwrap();
    assert_eq!(
        (pruned.runs_pruned, pruned.spans_deleted),
        (2, 2),
        "{pruned:?}"
    );
    assert!(store.get_span("a2").await.unwrap().is_none());
    let b = store.read_rollup("run-b").await.unwrap().expect("kept");
    assert_eq!((b.ended_at, b.detail_pruned), (Some(3_200), true), "{b:?}");
    assert_eq!(store.prune(prune(true)).await.unwrap().runs_pruned, 0);
}

/// A pruned run written to again with a span whose parent is not stored: the rollup it has
/// says how its earlier life ended, so it is not listed ended by it (it was, with that life's
/// end before this one's start: an audit); once rolled up again it is ended by the new rollup.
#[tokio::test]
async fn a_pruned_run_written_to_again_without_a_root_is_not_ended_by_its_old_rollup() {
    let (_dir, store) = store_at_10_000();
    end_roll_up_and_prune(&store, "a", "run-a").await;
    store
        .start_span(start("a2", "run-a", Some("gone"), 3_000))
        .await
        .unwrap();
    store
        .end_span("a2", end(SpanOutcome::Error, 3_100))
        .await
        .unwrap();
    let listed = |store: &SqliteActivityStore| {
        let store = store.clone();
        async move {
            let page = store.list_runs(query(None, 10)).await.unwrap();
            page.runs
                .into_iter()
                .find(|run| run.run_id == "run-a")
                .expect("run-a is listed")
        }
    };
    let before = listed(&store).await;
    assert_eq!(
        (
            before.state,
            before.awaiting_root,
            before.ended_at,
            before.started_at
        ),
        (RunState::Open, true, None, 3_000),
        "{before:?}"
    );
    store.rollup_run("run-a").await.unwrap();
    let after = listed(&store).await;
    assert_eq!(
        (after.state, after.ended_at, after.outcome.clone()),
        (RunState::Ended, Some(3_100), Some(SpanOutcome::Error)),
        "{after:?}"
    );
}
