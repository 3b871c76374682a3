//! `import_spans` on a real SQLite file: the idempotence an OTLP exporter's retries need, spans
//! arriving in any order and batch, completing natively started or pending spans, and rollups
//! that are right once the last span arrived and updated by late ones.

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, ChangeBody, EncodedAttrs, EndSpanInput, ImportedAttrs, ImportedEnd,
    ImportedEvent, ImportedSpan, JsonObject, PruneOptions, RemoteParent, RunListEntry,
    RunListQuery, RunState, SpanKind, SpanOrigin, SpanOutcome, SpanUsage, StartSpanInput,
};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};
use serde_json::json;

struct Fixture {
    _dir: tempfile::TempDir,
    store: SqliteActivityStore,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("import.db")))
        .expect("the database opens");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(5_000)), "otlp");
    Fixture { _dir: dir, store }
}

fn span(span_id: &str, parent: Option<&str>, kind: SpanKind, started_at: i64) -> ImportedSpan {
    let mut attrs = JsonObject::new();
    attrs.insert("service.name".into(), json!("agent"));
    ImportedSpan {
        priced_at: None,
        span_id: span_id.into(),
        run_id: "trace1".into(),
        parent_span_id: parent.map(str::to_owned),
        name: format!("{span_id}-name"),
        kind,
        origin: SpanOrigin::Otlp,
        session_id: None,
        job_name: None,
        attrs: attrs.into(),
        started_at,
        end: Some(ImportedEnd {
            ended_at: started_at + 100,
            outcome: SpanOutcome::Success,
            reason: None,
        }),
        usage: SpanUsage::default(),
        call_id: None,
        remote_parent: None,
        events: Vec::new(),
    }
}

/// A span started natively (origin `session`, no attrs): a turn named `native` under no parent,
/// which callers adjust.
fn native_start(span_id: &str, run_id: &str, started_at: i64) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: run_id.into(),
        parent_span_id: None,
        name: "native".into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: Some(started_at),
    }
}

/// The run `run_id` as the run list shows it (among the newest ten).
async fn listed_run(fx: &Fixture, run_id: &str) -> RunListEntry {
    let page = fx
        .store
        .list_runs(RunListQuery {
            state: None,
            outcome: None,
            origin: None,
            limit: 10,
            before: None,
        })
        .await
        .expect("the run list");
    page.runs
        .into_iter()
        .find(|run| run.run_id == run_id)
        .unwrap_or_else(|| panic!("run {run_id} is listed"))
}

fn model_span(span_id: &str, parent: &str, started_at: i64, input: i64, cost: f64) -> ImportedSpan {
    let mut model = span(span_id, Some(parent), SpanKind::Model, started_at);
    model.usage = SpanUsage {
        input_tokens: Some(input),
        output_tokens: Some(input / 10),
        cost_usd: Some(cost),
        model: Some("gpt-4o".into()),
        ..SpanUsage::default()
    };
    model
}

fn event(ts: i64, event_type: &str) -> ImportedEvent {
    ImportedEvent {
        ts,
        event_type: event_type.into(),
        payload: json!({"note": event_type}),
    }
}

#[tokio::test]
async fn a_whole_trace_is_created_with_events_and_rolled_up() {
    let fx = fixture();
    let mut root = span("root", None, SpanKind::Turn, 1_000);
    root.end = Some(ImportedEnd {
        ended_at: 2_000,
        outcome: SpanOutcome::Error,
        reason: Some("boom".into()),
    });
    let mut tool = span("tool", Some("root"), SpanKind::Tool, 1_200);
    tool.events = vec![event(1_250, "exception"), event(1_260, "retry")];
    let report = fx
        .store
        .import_spans(vec![root, model_span("m1", "root", 1_100, 100, 0.5), tool])
        .await
        .unwrap();
    assert_eq!(
        (report.created, report.completed, report.unchanged),
        (3, 0, 0)
    );
    assert_eq!(report.events_added, 2);
    assert_eq!(report.runs_rolled_up, 1);
    assert!(report.rejected.is_empty());

    let snapshot = fx.store.snapshot_run("trace1").await.unwrap().unwrap();
    assert_eq!(snapshot.spans.len(), 3);
    assert_eq!(snapshot.events.len(), 2);
    assert_eq!(
        snapshot.high_water_seq, 5,
        "3 spans + 2 events are change-logged"
    );
    let root = fx.store.get_span("root").await.unwrap().unwrap();
    assert_eq!(root.outcome, Some(SpanOutcome::Error));
    assert_eq!(root.outcome_reason.as_deref(), Some("boom"));
    assert_eq!(root.ended_at, Some(2_000));
    assert_eq!(root.writer, "otlp");
    assert_eq!(root.attrs.get("service.name"), Some(&json!("agent")));

    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.span_count, 3);
    assert_eq!(
        rollup.input_tokens,
        Some(100),
        "the root has no usage: model spans sum"
    );
    assert_eq!(rollup.cost_usd, Some(0.5));
    assert_eq!(rollup.outcome, Some(SpanOutcome::Error));
    assert_eq!(rollup.failure_reason.as_deref(), Some("boom"));
    assert_eq!(rollup.duration_ms, Some(1_000));
}

#[tokio::test]
async fn a_repeated_delivery_writes_nothing() {
    let fx = fixture();
    let mut tool = span("tool", Some("root"), SpanKind::Tool, 1_200);
    tool.events = vec![event(1_250, "exception")];
    let batch = vec![span("root", None, SpanKind::Turn, 1_000), tool];
    fx.store.import_spans(batch.clone()).await.unwrap();
    let cursor = fx.store.latest_change_cursor().await.unwrap();

    let again = fx.store.import_spans(batch).await.unwrap();
    assert_eq!((again.created, again.completed, again.unchanged), (0, 0, 2));
    assert_eq!(again.events_added, 0);
    assert_eq!(fx.store.latest_change_cursor().await.unwrap(), cursor);
    let snapshot = fx.store.snapshot_run("trace1").await.unwrap().unwrap();
    assert_eq!((snapshot.spans.len(), snapshot.events.len()), (2, 1));
}

#[tokio::test]
async fn children_before_their_parent_and_a_late_span_after_the_rollup() {
    let fx = fixture();
    // The child batch arrives first: no root yet, so no rollup.
    let first = fx
        .store
        .import_spans(vec![model_span("m1", "root", 1_100, 100, 0.25)])
        .await
        .unwrap();
    assert_eq!(first.runs_rolled_up, 0);
    assert!(fx.store.read_rollup("trace1").await.unwrap().is_none());

    fx.store
        .import_spans(vec![span("root", None, SpanKind::Turn, 1_000)])
        .await
        .unwrap();
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!((rollup.span_count, rollup.input_tokens), (2, Some(100)));

    // A straggler of the already rolled-up run updates its rollup.
    let late = fx
        .store
        .import_spans(vec![model_span("m2", "root", 1_300, 50, 0.5)])
        .await
        .unwrap();
    assert_eq!(late.runs_rolled_up, 1);
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.span_count, 3);
    assert_eq!(rollup.input_tokens, Some(150));
    assert_eq!(rollup.output_tokens, Some(15));
    assert_eq!(rollup.cost_usd, Some(0.75));
}

/// One provider call recorded by two instrumentations side by side (the Anthropic SDK's own
/// span and Traceloop's, both under the agent with the call's usage and response id): the run
/// counted it twice. One call id counts once, in one delivery or across two (the second copy
/// arriving after the rollup, read back from the rows), and the run list says the same.
#[tokio::test]
async fn one_call_recorded_by_two_sibling_spans_counts_once() {
    let fx = fixture();
    let with_call = |span_id: &str, input: i64, call: &str| {
        let mut model = model_span(span_id, "root", 1_100, input, 0.25);
        model.call_id = Some(call.to_owned());
        model
    };
    fx.store
        .import_spans(vec![
            span("root", None, SpanKind::Turn, 1_000),
            with_call("sdk", 100, "msg_1"),
            with_call("other-call", 40, "msg_2"),
        ])
        .await
        .unwrap();
    fx.store
        .import_spans(vec![with_call("traceloop", 100, "msg_1")])
        .await
        .unwrap();
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.span_count, 4);
    assert_eq!(rollup.input_tokens, Some(140));
    assert_eq!(rollup.cost_usd, Some(0.5));

    // Both copies in the delivery that creates the run (rolled up from the delivered spans).
    let mut in_one = vec![span("root2", None, SpanKind::Turn, 1_000)];
    in_one.extend([with_call("a", 100, "msg_9"), with_call("b", 100, "msg_9")]);
    for model in &mut in_one[1..] {
        model.parent_span_id = Some("root2".into());
    }
    for span in &mut in_one {
        span.run_id = "trace2".into();
    }
    fx.store.import_spans(in_one).await.unwrap();
    let rollup = fx.store.read_rollup("trace2").await.unwrap().unwrap();
    assert_eq!(rollup.input_tokens, Some(100));

    // A run still awaiting its root is listed with the same sums.
    let mut rootless = vec![with_call("c", 70, "msg_5"), with_call("d", 70, "msg_5")];
    for span in &mut rootless {
        span.run_id = "trace3".into();
    }
    fx.store.import_spans(rootless).await.unwrap();
    let listed = listed_run(&fx, "trace3").await;
    assert_eq!(listed.input_tokens, Some(70));
}

/// A span continued from a remote caller is a root, unless the caller's span is stored in the
/// same run: then it is stored under it, with a child's kind (Logfire marks a streamed call's
/// usage record's parent, its own agent, as remote; the audit found the call outside its
/// agent). A caller not stored, or stored in another run, leaves it a root.
#[tokio::test]
async fn a_remote_parent_stored_in_the_same_run_is_kept() {
    let fx = fixture();
    let remote = |span_id: &str, run_id: &str, caller: &str| {
        let mut span = span(span_id, None, SpanKind::Turn, 1_100);
        span.run_id = run_id.to_owned();
        span.remote_parent = Some(RemoteParent {
            span_id: caller.to_owned(),
            kind_under_it: SpanKind::Subagent,
        });
        span
    };
    fx.store
        .import_spans(vec![span("agent", None, SpanKind::Turn, 1_000)])
        .await
        .unwrap();
    fx.store
        .import_spans(vec![
            remote("under-agent", "trace1", "agent"),
            remote("caller-elsewhere", "trace1", "not-stored"),
            remote("other-run", "trace2", "agent"),
        ])
        .await
        .unwrap();
    let under = fx.store.get_span("under-agent").await.unwrap().unwrap();
    assert_eq!(under.parent_span_id.as_deref(), Some("agent"));
    assert_eq!(under.kind, SpanKind::Subagent);
    for root in ["caller-elsewhere", "other-run"] {
        let span = fx.store.get_span(root).await.unwrap().unwrap();
        assert_eq!(span.parent_span_id, None, "{root}");
        assert_eq!(span.kind, SpanKind::Turn, "{root}");
    }

    // A span whose remote parent is its own child (delivered before it) stays a root: under
    // it, the two would hang from each other and the run would have no root.
    let mut kid = span("kid", Some("looped"), SpanKind::Tool, 1_200);
    kid.run_id = "trace4".into();
    fx.store.import_spans(vec![kid]).await.unwrap();
    fx.store
        .import_spans(vec![remote("looped", "trace4", "kid")])
        .await
        .unwrap();
    let looped = fx.store.get_span("looped").await.unwrap().unwrap();
    assert_eq!(looped.parent_span_id, None);
    // … and one under a parent adopted in the same delivery that creates the run.
    let mut first = span("first", None, SpanKind::Turn, 1_000);
    first.run_id = "trace5".into();
    fx.store
        .import_spans(vec![first, remote("second", "trace5", "first")])
        .await
        .unwrap();
    let second = fx.store.get_span("second").await.unwrap().unwrap();
    assert_eq!(second.parent_span_id.as_deref(), Some("first"));
}

/// `spans` with every span id they name (own, parent, remote parent) led by `prefix`: the same
/// trace again in another run (span ids are unique across runs).
fn with_id_prefix(spans: Vec<ImportedSpan>, prefix: &str) -> Vec<ImportedSpan> {
    spans
        .into_iter()
        .map(|mut span| {
            span.span_id = format!("{prefix}{}", span.span_id);
            span.parent_span_id = span.parent_span_id.map(|id| format!("{prefix}{id}"));
            if let Some(remote) = span.remote_parent.as_mut() {
                remote.span_id = format!("{prefix}{}", remote.span_id);
            }
            span
        })
        .collect()
}

/// A traced call between two services: the callee's spans end, and so are exported, before the
/// caller's span. Its entry span is a root until the caller's span comes, then moves under it
/// with a child's kind, change-logged; the run ends up the same tree in either order, and with
/// the same rollup.
#[tokio::test]
async fn a_callee_delivered_before_its_caller_moves_under_it_when_the_caller_comes() {
    let fx = fixture();
    let callee = |run_id: &str| {
        let mut entry = span("callee", None, SpanKind::Turn, 1_100);
        entry.run_id = run_id.to_owned();
        entry.remote_parent = Some(RemoteParent {
            span_id: "call".to_owned(),
            kind_under_it: SpanKind::Subagent,
        });
        let mut model = model_span("callee-model", "callee", 1_110, 300, 0.3);
        model.run_id = run_id.to_owned();
        vec![entry, model]
    };
    let caller = |run_id: &str| {
        let mut root = span("agent", None, SpanKind::Turn, 1_000);
        root.end = Some(ImportedEnd {
            ended_at: 2_000,
            outcome: SpanOutcome::Success,
            reason: None,
        });
        let mut call = span("call", Some("agent"), SpanKind::Tool, 1_050);
        let mut model = model_span("agent-model", "agent", 1_010, 100, 0.1);
        for span in [&mut root, &mut call, &mut model] {
            span.run_id = run_id.to_owned();
        }
        vec![model, call, root]
    };
    // Run "callee-first": the callee's delivery, then the caller's.
    fx.store.import_spans(callee("callee-first")).await.unwrap();
    let entry = fx.store.get_span("callee").await.unwrap().unwrap();
    assert_eq!(
        entry.parent_span_id, None,
        "a root while its caller is away"
    );
    assert_eq!(entry.kind, SpanKind::Turn);
    let cursor = fx.store.latest_change_cursor().await.unwrap();
    fx.store.import_spans(caller("callee-first")).await.unwrap();
    let entry = fx.store.get_span("callee").await.unwrap().unwrap();
    assert_eq!(entry.parent_span_id.as_deref(), Some("call"));
    assert_eq!(entry.kind, SpanKind::Subagent);
    // The move is a change of the callee's span, after the caller's span was logged.
    let changes = fx.store.changes_since(cursor, 100).await.unwrap();
    let moved = changes.iter().position(|change| {
        matches!(&change.body, ChangeBody::Span { span }
            if span.span_id == "callee" && span.parent_span_id.as_deref() == Some("call"))
    });
    let call_logged = changes.iter().position(
        |change| matches!(&change.body, ChangeBody::Span { span } if span.span_id == "call"),
    );
    assert!(
        matches!((call_logged, moved), (Some(call), Some(moved)) if call < moved),
        "the move is change-logged after the caller: {changes:?}"
    );
    let seqs: Vec<i64> = changes.iter().map(|change| change.seq).collect();
    assert_eq!(
        seqs,
        [3, 4, 5, 6],
        "three spans and one move, one seq each: {changes:?}"
    );

    // Run "caller-first", the other order (other span ids: ids are unique across runs).
    fx.store
        .import_spans(with_id_prefix(caller("caller-first"), "b-"))
        .await
        .unwrap();
    fx.store
        .import_spans(with_id_prefix(callee("caller-first"), "b-"))
        .await
        .unwrap();
    let tree = |run_id: &'static str, prefix: &'static str| {
        let store = &fx.store;
        async move {
            let snapshot = store.snapshot_run(run_id).await.unwrap().unwrap();
            let mut tree: Vec<(String, Option<String>, SpanKind)> = snapshot
                .spans
                .into_iter()
                .map(|span| {
                    let strip = |id: String| id.strip_prefix(prefix).unwrap_or(&id).to_owned();
                    (
                        strip(span.span_id),
                        span.parent_span_id.map(strip),
                        span.kind,
                    )
                })
                .collect();
            tree.sort_by(|a, b| a.0.cmp(&b.0));
            tree
        }
    };
    let first = tree("callee-first", "").await;
    assert_eq!(first, tree("caller-first", "b-").await);
    assert_eq!(
        first
            .iter()
            .filter(|(_, parent, _)| parent.is_none())
            .count(),
        1,
        "one root: {first:?}"
    );
    let rollups = [
        fx.store.read_rollup("callee-first").await.unwrap().unwrap(),
        fx.store.read_rollup("caller-first").await.unwrap().unwrap(),
    ];
    for rollup in &rollups {
        assert_eq!(rollup.name, "agent-name", "{rollup:?}");
        assert_eq!(rollup.input_tokens, Some(400), "{rollup:?}");
        assert_eq!(rollup.span_count, 5, "{rollup:?}");
    }

    // In one delivery, callee first: the same.
    let mut both = callee("one-delivery");
    both.extend(caller("one-delivery"));
    fx.store
        .import_spans(with_id_prefix(both, "c-"))
        .await
        .unwrap();
    assert_eq!(tree("one-delivery", "c-").await, first);
    let rollup = fx.store.read_rollup("one-delivery").await.unwrap().unwrap();
    assert_eq!(rollup.name, "agent-name", "{rollup:?}");

    // A caller that is the waiting span's own descendant (its remote parent named a span
    // below it) leaves it a root: under it, the two would hang from each other.
    let mut looped = span("looped", None, SpanKind::Turn, 1_100);
    looped.run_id = "loop".into();
    looped.remote_parent = Some(RemoteParent {
        span_id: "below".to_owned(),
        kind_under_it: SpanKind::Subagent,
    });
    fx.store.import_spans(vec![looped]).await.unwrap();
    let mut below = span("below", Some("looped"), SpanKind::Tool, 1_200);
    below.run_id = "loop".into();
    fx.store.import_spans(vec![below]).await.unwrap();
    let looped = fx.store.get_span("looped").await.unwrap().unwrap();
    assert_eq!(looped.parent_span_id, None);
    assert_eq!(looped.kind, SpanKind::Turn);

    // A caller deep in its trace (100 spans down) adopts its callee too.
    let mut deep = span("deep-callee", None, SpanKind::Turn, 1_500);
    deep.run_id = "deep".into();
    deep.remote_parent = Some(RemoteParent {
        span_id: "level-99".to_owned(),
        kind_under_it: SpanKind::Subagent,
    });
    fx.store.import_spans(vec![deep]).await.unwrap();
    let chain: Vec<ImportedSpan> = (0..100)
        .map(|level| {
            let parent = (level > 0).then(|| format!("level-{}", level - 1));
            let mut span = span(
                &format!("level-{level}"),
                None,
                SpanKind::Other,
                1_000 + level,
            );
            span.parent_span_id = parent;
            span.run_id = "deep".into();
            span
        })
        .collect();
    fx.store.import_spans(chain).await.unwrap();
    let deep = fx.store.get_span("deep-callee").await.unwrap().unwrap();
    assert_eq!(deep.parent_span_id.as_deref(), Some("level-99"));

    // A callee whose caller never comes waits until its run is pruned, and no longer.
    let waiting = || {
        let path = fx._dir.path().join("import.db");
        let conn = rusqlite::Connection::open(path).expect("the file opens");
        conn.query_row(
            "SELECT COUNT(*) FROM activity_spans_awaiting_caller",
            [],
            |row| row.get::<_, i64>(0),
        )
        .expect("the table reads")
    };
    let lonely = with_id_prefix(callee("never-called"), "d-");
    fx.store.import_spans(lonely).await.unwrap();
    assert_eq!(
        waiting(),
        1,
        "the lonely callee waits (the loop's span no longer: its caller came, below it)"
    );
    // A span whose caller is stored already, below it, is a root that waits for nothing: the
    // caller will not come again.
    let mut child = span("child-first", Some("parent-later"), SpanKind::Tool, 1_200);
    child.run_id = "child-first".into();
    fx.store.import_spans(vec![child]).await.unwrap();
    let mut parent = span("parent-later", None, SpanKind::Turn, 1_100);
    parent.run_id = "child-first".into();
    parent.remote_parent = Some(RemoteParent {
        span_id: "child-first".to_owned(),
        kind_under_it: SpanKind::Subagent,
    });
    fx.store.import_spans(vec![parent]).await.unwrap();
    let parent = fx.store.get_span("parent-later").await.unwrap().unwrap();
    assert_eq!(parent.parent_span_id, None);
    assert_eq!(waiting(), 1, "no row waits for a caller stored already");
    let pruned = fx
        .store
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: 1_000_000,
            hard_ceiling_ms: i64::MAX,
            now: None,
            batch: None,
            scheduled: false,
        })
        .await
        .unwrap();
    assert!(pruned.runs_pruned >= 1, "{pruned:?}");
    assert_eq!(waiting(), 0, "pruned with their runs");
}

/// A callee announced while it runs (its announcement names the caller as a plain parent, which
/// is not stored, so it is a root), then completed by a copy that flags the caller as remote:
/// it waits for the caller, and the caller's span adopts it when it comes.
#[tokio::test]
async fn an_announced_callee_completed_as_a_remote_callers_waits_for_that_caller() {
    let fx = fixture();
    let mut announced = span("callee", Some("call"), SpanKind::Other, 1_100);
    announced.end = None;
    fx.store.import_spans(vec![announced]).await.unwrap();
    let mut completed = span("callee", None, SpanKind::Turn, 1_100);
    completed.remote_parent = Some(RemoteParent {
        span_id: "call".to_owned(),
        kind_under_it: SpanKind::Subagent,
    });
    let report = fx.store.import_spans(vec![completed]).await.unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    let callee = fx.store.get_span("callee").await.unwrap().unwrap();
    assert_eq!(callee.parent_span_id, None);
    assert_eq!(callee.kind, SpanKind::Turn);

    let mut agent = span("agent", None, SpanKind::Turn, 1_000);
    agent.end = Some(ImportedEnd {
        ended_at: 2_000,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    fx.store
        .import_spans(vec![
            span("call", Some("agent"), SpanKind::Tool, 1_050),
            agent,
        ])
        .await
        .unwrap();
    let callee = fx.store.get_span("callee").await.unwrap().unwrap();
    assert_eq!(callee.parent_span_id.as_deref(), Some("call"));
    assert_eq!(callee.kind, SpanKind::Subagent);
    let path = fx._dir.path().join("import.db");
    let conn = rusqlite::Connection::open(path).expect("the file opens");
    let waiting: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM activity_spans_awaiting_caller",
            [],
            |row| row.get(0),
        )
        .expect("the table reads");
    assert_eq!(waiting, 0);
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.name, "agent-name", "{rollup:?}");
}

/// A database an earlier flightlog wrote (schema version 11), with a root it stored for want of
/// its remote caller (its caller's id in its attrs only): opened by this build, it is upgraded,
/// that root stays a root when the caller comes (no row says it waits), and a callee stored
/// from then on is adopted.
#[tokio::test]
async fn an_upgraded_database_keeps_its_old_remote_roots_and_adopts_new_ones() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("v11.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("the file opens");
        flightlog_sqlite::migrate_up_to(&mut conn, 11).expect("schema version 11");
        conn.execute_batch(
            "INSERT INTO activity_writers (writer_key, writer) VALUES (1, 'otlp');
             INSERT INTO activity_runs (run_key, run_id) VALUES (1, 'trace1');
             INSERT INTO activity_spans (span_id, run_key, parent_span_id, name, kind, origin,
               attrs, started_at, ended_at, outcome, writer_key) VALUES
               ('old-callee', 1, NULL, 'old', 'turn', 'otlp',
                '{\"flightlog.remote_parent_span_id\": \"call\"}', 1100, 1200, 'success', 1);
             INSERT INTO activity_span_ids (span_id, span_key) VALUES ('old-callee', 1);",
        )
        .expect("the old rows");
    }
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("the old file opens");
    let store =
        SqliteActivityStore::with_identity(db.clone(), Arc::new(ManualClock::new(5_000)), "otlp");
    let mut callee = span("new-callee", None, SpanKind::Turn, 1_150);
    callee.remote_parent = Some(RemoteParent {
        span_id: "call".to_owned(),
        kind_under_it: SpanKind::Subagent,
    });
    store.import_spans(vec![callee]).await.expect("the callee");
    store
        .import_spans(vec![span("call", None, SpanKind::Tool, 1_050)])
        .await
        .expect("the caller");
    let old = store.get_span("old-callee").await.unwrap().unwrap();
    assert_eq!(
        old.parent_span_id, None,
        "stored before schema 12: stays a root"
    );
    let new = store.get_span("new-callee").await.unwrap().unwrap();
    assert_eq!(new.parent_span_id.as_deref(), Some("call"));
    assert_eq!(new.kind, SpanKind::Subagent);
    db.close().await.expect("the database closes");
}

/// A callee rolled up as its run's only root, then moved under its caller's span while the
/// caller's root has not come: the run has no root, so no rollup (as when the caller's span came
/// first), and is listed open, awaiting its root, not ended by the callee's old rollup; the
/// caller's root then rolls it up.
#[tokio::test]
async fn a_callee_rolled_up_as_the_root_loses_that_rollup_when_its_caller_adopts_it() {
    let fx = fixture();
    let mut entry = span("callee", None, SpanKind::Turn, 1_100);
    entry.remote_parent = Some(RemoteParent {
        span_id: "call".to_owned(),
        kind_under_it: SpanKind::Subagent,
    });
    fx.store
        .import_spans(vec![
            entry,
            model_span("callee-model", "callee", 1_110, 300, 0.3),
        ])
        .await
        .unwrap();
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(
        rollup.name, "callee-name",
        "the callee is the run's root for now"
    );

    let call = span("call", Some("agent"), SpanKind::Tool, 1_050);
    fx.store.import_spans(vec![call]).await.unwrap();
    assert_eq!(
        fx.store.read_rollup("trace1").await.unwrap(),
        None,
        "no root, no rollup"
    );
    let run = listed_run(&fx, "trace1").await;
    assert!(run.awaiting_root, "{run:?}");
    assert_eq!(
        run.state,
        RunState::Open,
        "while its root has not come: {run:?}"
    );
    assert!(!run.rolled_up, "{run:?}");
    assert_eq!(run.outcome, None, "{run:?}");

    let mut agent = span("agent", None, SpanKind::Turn, 1_000);
    agent.end = Some(ImportedEnd {
        ended_at: 2_000,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    fx.store.import_spans(vec![agent]).await.unwrap();
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.name, "agent-name", "{rollup:?}");
    assert_eq!(rollup.span_count, 4, "{rollup:?}");
    assert_eq!(rollup.input_tokens, Some(300), "{rollup:?}");
}

/// The root `root` of run `trace1` started through the native API (name "native name", kind
/// turn, attrs `{native: true}`, at 900), with an `exception` event at 950: what the OTLP
/// copy of the same span then meets.
async fn native_root_with_an_event(fx: &Fixture, session_id: Option<&str>) {
    fx.store
        .start_span(StartSpanInput {
            name: "native name".into(),
            session_id: session_id.map(str::to_owned),
            attrs: Some(JsonObject::from_iter([("native".to_owned(), json!(true))])),
            ..native_start("root", "trace1", 900)
        })
        .await
        .expect("the native start");
    fx.store
        .append_event("root", "exception", Some(&json!({"a": 1})), Some(950))
        .await
        .expect("the native event");
}

#[tokio::test]
async fn a_natively_started_span_is_completed_not_duplicated() {
    let fx = fixture();
    native_root_with_an_event(&fx, Some("s1")).await;

    let mut delivered = span("root", None, SpanKind::Other, 1_000);
    delivered.events = vec![event(950, "exception"), event(960, "second")];
    let report = fx.store.import_spans(vec![delivered]).await.unwrap();
    assert_eq!((report.created, report.completed), (0, 1));
    assert_eq!(
        report.events_added, 1,
        "the event it already had is not added again"
    );

    let root = fx.store.get_span("root").await.unwrap().unwrap();
    assert_eq!(
        root.name, "native name",
        "the native start's fields are kept"
    );
    assert_eq!(root.kind, SpanKind::Turn);
    assert_eq!(root.started_at, 900);
    assert_eq!(root.outcome, Some(SpanOutcome::Success));
    assert_eq!(root.ended_at, Some(1_100));
    assert_eq!(root.attrs.get("native"), Some(&json!(true)));
    assert_eq!(root.attrs.get("service.name"), Some(&json!("agent")));
    let snapshot = fx.store.snapshot_run("trace1").await.unwrap().unwrap();
    assert_eq!(snapshot.spans.len(), 1);
    assert_eq!(snapshot.events.len(), 2);
    // The completion is delta-visible like a native end.
    let changes = fx.store.changes_since(0, 100).await.unwrap();
    let seqs: Vec<i64> = changes.iter().map(|change| change.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert!(matches!(&changes[2].body, ChangeBody::Span { span } if span.outcome.is_some()));
}

/// A span started and ended through the native API before its OTLP copy arrives (an agent
/// that reports natively and exports OpenTelemetry, whose exporter batches): the end, outcome,
/// name and attrs are written once and stay, but the events only the copy carries are added (a
/// native append to an ended span adds them too) and the ones it holds are not doubled; a retry
/// of the copy then adds nothing, and a retried OTLP span that ended over OTLP writes nothing.
#[tokio::test]
async fn a_natively_ended_span_gets_only_the_events_its_otlp_copy_adds() {
    let fx = fixture();
    native_root_with_an_event(&fx, None).await;
    let ended = fx
        .store
        .end_span(
            "root",
            EndSpanInput {
                outcome: SpanOutcome::Error,
                reason: Some("native end".into()),
                ended_at: Some(990),
                usage: None,
                attrs: None,
            },
        )
        .await
        .unwrap();
    assert!(ended);
    let cursor = fx.store.latest_change_cursor().await.unwrap();

    let mut delivered = span("root", None, SpanKind::Other, 1_000);
    delivered.events = vec![event(950, "exception"), event(960, "second")];
    let report = fx
        .store
        .import_spans(vec![delivered.clone()])
        .await
        .unwrap();
    assert_eq!(
        (report.created, report.completed, report.unchanged),
        (0, 0, 1)
    );
    assert_eq!(report.events_added, 1, "only the event the span lacked");
    let root = fx.store.get_span("root").await.unwrap().unwrap();
    assert_eq!(root.name, "native name");
    assert_eq!(root.outcome, Some(SpanOutcome::Error), "write-once");
    assert_eq!(root.outcome_reason.as_deref(), Some("native end"));
    assert_eq!(root.ended_at, Some(990));
    assert_eq!(root.attrs.get("service.name"), None, "attrs stay as ended");
    let snapshot = fx.store.snapshot_run("trace1").await.unwrap().unwrap();
    let events: Vec<(i64, &str)> = snapshot
        .events
        .iter()
        .map(|event| (event.ts, event.event_type.as_str()))
        .collect();
    assert_eq!(events, [(950, "exception"), (960, "second")]);
    // The added event is change-logged like a native append.
    let changes = fx.store.changes_since(cursor, 100).await.unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert!(matches!(&changes[0].body, ChangeBody::Event { .. }));

    let retry = fx.store.import_spans(vec![delivered]).await.unwrap();
    assert_eq!((retry.unchanged, retry.events_added), (1, 0));
    assert_eq!(
        fx.store
            .snapshot_run("trace1")
            .await
            .unwrap()
            .unwrap()
            .events
            .len(),
        2
    );

    // A span ended over OTLP and delivered again with another event: a retry, nothing added.
    let mut otlp = span("otlp-span", Some("root"), SpanKind::Tool, 1_000);
    otlp.events = vec![event(970, "one")];
    fx.store.import_spans(vec![otlp.clone()]).await.unwrap();
    otlp.events.push(event(980, "two"));
    let again = fx.store.import_spans(vec![otlp]).await.unwrap();
    assert_eq!((again.unchanged, again.events_added), (1, 0));
}

#[tokio::test]
async fn a_pending_span_is_live_until_its_final_delivery() {
    let fx = fixture();
    let mut pending = span("root", None, SpanKind::Turn, 1_000);
    pending.end = None;
    let report = fx.store.import_spans(vec![pending.clone()]).await.unwrap();
    assert_eq!((report.created, report.runs_rolled_up), (1, 0));
    let open = fx.store.open_root_spans().await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(
        open[0].last_heartbeat_at,
        Some(5_000),
        "alive from its announcement"
    );

    // Announced again (still running): refreshed, still open.
    let again = fx.store.import_spans(vec![pending]).await.unwrap();
    assert_eq!((again.completed, again.refreshed), (0, 1));
    assert_eq!(fx.store.open_root_spans().await.unwrap().len(), 1);

    let report = fx
        .store
        .import_spans(vec![span("root", None, SpanKind::Turn, 1_000)])
        .await
        .unwrap();
    assert_eq!((report.completed, report.runs_rolled_up), (1, 1));
    assert!(fx.store.open_root_spans().await.unwrap().is_empty());
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.outcome, Some(SpanOutcome::Success));
}

/// A delivery that completes an open span never ends it before the start it keeps: the start
/// kept may be later than the delivery's own (a native start by the server's clock, an
/// announcement from a clock ahead of the final copy's), and a negative duration would skew
/// every total it enters.
#[tokio::test]
async fn a_completed_span_never_ends_before_the_start_it_keeps() {
    let fx = fixture();
    // Announced (open) at 1_050, then delivered whole as 1_000 .. 1_010.
    let mut announced = span("root", None, SpanKind::Turn, 1_050);
    announced.end = None;
    fx.store.import_spans(vec![announced]).await.unwrap();
    let mut final_copy = span("root", None, SpanKind::Turn, 1_000);
    final_copy.end = Some(ImportedEnd {
        ended_at: 1_010,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    let report = fx.store.import_spans(vec![final_copy]).await.unwrap();
    assert_eq!((report.completed, report.runs_rolled_up), (1, 1));
    let root = fx.store.get_span("root").await.unwrap().unwrap();
    assert_eq!((root.started_at, root.ended_at), (1_050, Some(1_050)));
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.duration_ms, Some(0), "not -40");
    assert_eq!(listed_run(&fx, "trace1").await.duration_ms, Some(0));

    // Started natively at 2_050 (the server's clock); the exporter's copy says 2_000 .. 2_010.
    fx.store
        .start_span(native_start("native", "trace2", 2_050))
        .await
        .unwrap();
    let mut exported = span("native", None, SpanKind::Turn, 2_000);
    exported.run_id = "trace2".into();
    exported.end = Some(ImportedEnd {
        ended_at: 2_010,
        outcome: SpanOutcome::Error,
        reason: Some("boom".into()),
    });
    fx.store.import_spans(vec![exported]).await.unwrap();
    let native = fx.store.get_span("native").await.unwrap().unwrap();
    assert_eq!((native.started_at, native.ended_at), (2_050, Some(2_050)));
    assert_eq!(native.outcome, Some(SpanOutcome::Error));
    let rollup = fx.store.read_rollup("trace2").await.unwrap().unwrap();
    assert_eq!(rollup.duration_ms, Some(0));

    // An end after the kept start is kept as delivered.
    let mut later = span("later", None, SpanKind::Turn, 3_050);
    later.run_id = "trace3".into();
    later.end = None;
    fx.store.import_spans(vec![later.clone()]).await.unwrap();
    later.started_at = 3_000;
    later.end = Some(ImportedEnd {
        ended_at: 3_100,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    fx.store.import_spans(vec![later]).await.unwrap();
    let rollup = fx.store.read_rollup("trace3").await.unwrap().unwrap();
    assert_eq!((rollup.started_at, rollup.duration_ms), (3_050, Some(50)));
}

#[tokio::test]
async fn a_span_id_of_another_run_is_rejected_and_the_rest_stored() {
    let fx = fixture();
    fx.store
        .import_spans(vec![span("shared", None, SpanKind::Turn, 1_000)])
        .await
        .unwrap();
    let mut clash = span("shared", None, SpanKind::Turn, 1_000);
    clash.run_id = "trace2".into();
    let mut fine = span("other", None, SpanKind::Turn, 1_000);
    fine.run_id = "trace2".into();
    let report = fx.store.import_spans(vec![clash, fine]).await.unwrap();
    assert_eq!(report.created, 1);
    assert_eq!(report.rejected.len(), 1);
    assert_eq!(report.rejected[0].span_id, "shared");
    assert!(report.rejected[0].reason.contains("another run"));
    assert_eq!(
        fx.store.get_span("shared").await.unwrap().unwrap().run_id,
        "trace1"
    );
    assert!(fx.store.get_span("other").await.unwrap().is_some());
    // A native end after an import still honours write-once.
    let ended = fx
        .store
        .end_span(
            "other",
            EndSpanInput {
                outcome: SpanOutcome::Error,
                reason: None,
                ended_at: None,
                usage: None,
                attrs: None,
            },
        )
        .await
        .unwrap();
    assert!(!ended);
}

#[tokio::test]
async fn attrs_encoded_by_the_importer_are_stored_as_given_and_merged_on_completion() {
    let fx = fixture();
    let encoded =
        |text: &str| ImportedAttrs::Encoded(EncodedAttrs::from_object_text(text.to_owned()));
    let mut whole = span("whole", None, SpanKind::Turn, 1_000);
    whole.attrs = encoded(r#"{"b":1,"a":{"nested":[true,null]},"service.name":"agent"}"#);
    fx.store
        .start_span(StartSpanInput {
            attrs: Some(JsonObject::from_iter([
                ("native".to_owned(), json!(true)),
                ("b".to_owned(), json!("old")),
            ])),
            ..native_start("open", "trace2", 900)
        })
        .await
        .unwrap();
    let mut completing = span("open", None, SpanKind::Turn, 1_000);
    completing.run_id = "trace2".into();
    completing.attrs = encoded(r#"{"b":"new","otel.span_kind":"server"}"#);
    let report = fx
        .store
        .import_spans(vec![whole, completing])
        .await
        .unwrap();
    assert_eq!((report.created, report.completed), (1, 1));

    let whole = fx.store.get_span("whole").await.unwrap().unwrap();
    assert_eq!(
        serde_json::Value::Object(whole.attrs),
        json!({"b": 1, "a": {"nested": [true, null]}, "service.name": "agent"})
    );
    let completed = fx.store.get_span("open").await.unwrap().unwrap();
    assert_eq!(
        serde_json::Value::Object(completed.attrs),
        json!({"native": true, "b": "new", "otel.span_kind": "server"})
    );
}

/// A run created by one delivery is rolled up from the delivered spans without reading them
/// back; the result must be exactly what the stored rule computes from the rows. Varied shapes:
/// usage on the root or only on model spans, failures with and without reasons, several roots,
/// equal start times, a root that is still open, a repeat of a span within the delivery.
#[tokio::test]
async fn the_rollup_of_a_new_run_equals_the_one_computed_from_its_rows() {
    let fx = fixture();
    let in_run = |mut span: ImportedSpan, run: &str| {
        span.run_id = run.into();
        span
    };
    let mut with_root_usage = span("a-root", None, SpanKind::Turn, 1_000);
    with_root_usage.usage = SpanUsage {
        input_tokens: Some(7),
        cost_usd: Some(0.25),
        ..SpanUsage::default()
    };
    let mut failed_child = span("b-tool", Some("b-root"), SpanKind::Tool, 1_000);
    failed_child.end = Some(ImportedEnd {
        ended_at: 1_400,
        outcome: SpanOutcome::Error,
        reason: Some("tool failed".into()),
    });
    let mut failed_root = span("b-root", None, SpanKind::Turn, 1_000);
    failed_root.end = Some(ImportedEnd {
        ended_at: 1_900,
        outcome: SpanOutcome::Error,
        reason: None,
    });
    let mut open_root = span("c-root", None, SpanKind::Turn, 500);
    open_root.end = None;
    let mut second_root = span("d-root2", None, SpanKind::Subagent, 900);
    second_root.end = Some(ImportedEnd {
        ended_at: 3_000,
        outcome: SpanOutcome::Cancelled,
        reason: Some("stopped".into()),
    });
    let mut later_failure = span("b-later", Some("b-root"), SpanKind::Tool, 1_300);
    later_failure.end = Some(ImportedEnd {
        ended_at: 1_350,
        outcome: SpanOutcome::Timeout,
        reason: Some("later failure".into()),
    });
    let delivery = vec![
        in_run(model_span("a-m1", "a-root", 1_100, 100, 0.5), "run-a"),
        in_run(with_root_usage, "run-a"),
        in_run(model_span("a-m2", "a-root", 1_100, 50, 0.25), "run-a"),
        in_run(later_failure, "run-b"),
        in_run(failed_child, "run-b"),
        in_run(model_span("b-m1", "b-root", 1_050, 10, 0.1), "run-b"),
        in_run(failed_root, "run-b"),
        in_run(open_root, "run-c"),
        in_run(model_span("c-m1", "c-root", 600, 10, 0.1), "run-c"),
        in_run(second_root, "run-d"),
        in_run(model_span("d-m1", "d-root1", 950, 30, 0.3), "run-d"),
        in_run(span("d-root1", None, SpanKind::Turn, 800), "run-d"),
        in_run(span("e-root", None, SpanKind::Turn, 10), "run-e"),
        in_run(model_span("e-m1", "e-root", 20, 5, 0.05), "run-e"),
        in_run(model_span("e-m1", "e-root", 20, 5, 0.05), "run-e"),
    ];
    let report = fx.store.import_spans(delivery).await.unwrap();
    assert_eq!((report.created, report.unchanged), (14, 1), "{report:?}");
    assert_eq!(report.runs_rolled_up, 4, "not the run whose root is open");
    assert_eq!(fx.store.read_rollup("run-c").await.unwrap(), None);
    for run in ["run-a", "run-b", "run-d", "run-e"] {
        let from_delivery = fx.store.read_rollup(run).await.unwrap();
        assert!(from_delivery.is_some(), "{run}");
        fx.store.rollup_run(run).await.unwrap();
        let from_rows = fx.store.read_rollup(run).await.unwrap();
        assert_eq!(from_delivery, from_rows, "{run}");
    }
}

/// Regression (found by an audit): a span announced open before it had the attributes its kind
/// comes from kept the announcement's kind `other`, name and (no) session when its final copy
/// arrived, so the run's rollup, which sums `model` spans, lost its usage and cost. A span the
/// importer itself announced now takes the final copy's name, kind, session and job.
#[tokio::test]
async fn the_final_copy_of_an_announced_span_gives_its_name_kind_and_session() {
    let fx = fixture();
    let mut root = span("root", None, SpanKind::Turn, 1_000);
    root.end = None;
    root.name = "starting".into();
    let mut call = span("call", Some("root"), SpanKind::Other, 1_100);
    call.end = None;
    call.name = "llm call".into();
    fx.store.import_spans(vec![root, call]).await.unwrap();
    let announced = fx.store.get_span("call").await.unwrap().unwrap();
    assert_eq!(announced.kind, SpanKind::Other);

    let mut final_root = span("root", None, SpanKind::Turn, 1_000);
    final_root.name = "agent run".into();
    final_root.session_id = Some("sess-9".into());
    final_root.end = Some(ImportedEnd {
        ended_at: 3_000,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    let mut final_call = model_span("call", "root", 1_100, 1_000, 0.0035);
    final_call.name = "chat gpt-4o".into();
    let report = fx
        .store
        .import_spans(vec![final_call, final_root])
        .await
        .unwrap();
    assert_eq!((report.created, report.completed), (0, 2));

    let call = fx.store.get_span("call").await.unwrap().unwrap();
    assert_eq!(call.kind, SpanKind::Model);
    assert_eq!(call.name, "chat gpt-4o");
    assert_eq!(call.started_at, 1_100, "the start stays");
    let root = fx.store.get_span("root").await.unwrap().unwrap();
    assert_eq!(root.name, "agent run");
    assert_eq!(root.session_id.as_deref(), Some("sess-9"));
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.name, "agent run");
    assert_eq!(rollup.session_id.as_deref(), Some("sess-9"));
    assert_eq!(
        rollup.input_tokens,
        Some(1_000),
        "the model span's usage counts"
    );
    assert_eq!(rollup.output_tokens, Some(100));
    assert_eq!(rollup.cost_usd, Some(0.0035));
}

/// Regression (found by an audit): completing an announced span skipped every delivered event
/// whose `ts` and type matched a held one, so distinct events in the same millisecond (stream
/// chunks) were lost. Each held event now accounts for one delivered event of its `ts` and type
/// (the same payload first), and the rest are added.
#[tokio::test]
async fn completing_a_span_keeps_distinct_events_of_one_millisecond() {
    let fx = fixture();
    let chunk = |i: i64, ts: i64| ImportedEvent {
        ts,
        event_type: "chunk".into(),
        payload: json!({"i": i}),
    };
    let mut announced = span("s", None, SpanKind::Model, 1_000);
    announced.end = None;
    announced.events = vec![chunk(0, 5)];
    fx.store.import_spans(vec![announced]).await.unwrap();

    let mut delivered = span("s", None, SpanKind::Model, 1_000);
    // The held chunk again, a distinct one in the same ms, the same one twice more (one of the
    // two is new: the span holds it once), and one in the next ms.
    delivered.events = vec![chunk(0, 5), chunk(1, 5), chunk(0, 5), chunk(2, 6)];
    let report = fx
        .store
        .import_spans(vec![delivered.clone()])
        .await
        .unwrap();
    assert_eq!(report.events_added, 3, "{report:?}");
    let snapshot = fx.store.snapshot_run("trace1").await.unwrap().unwrap();
    let mut held: Vec<(i64, String)> = snapshot
        .events
        .iter()
        .map(|event| (event.ts, event.payload.get().to_owned()))
        .collect();
    held.sort();
    assert_eq!(
        held,
        vec![
            (5, r#"{"i":0}"#.to_owned()),
            (5, r#"{"i":0}"#.to_owned()),
            (5, r#"{"i":1}"#.to_owned()),
            (6, r#"{"i":2}"#.to_owned()),
        ]
    );
    // The span is terminal now: a retry of the same delivery adds nothing.
    let retry = fx.store.import_spans(vec![delivered]).await.unwrap();
    assert_eq!((retry.unchanged, retry.events_added), (1, 0));
}

/// A run with two roots whose later-starting one arrives (and is rolled up) first, as a
/// service continuing a caller's trace exports before its caller does: once the earlier root
/// arrives, the rollup is the run's first root's, as the run list shows it (a native rollup
/// keeps its first identity, the reference's upsert; an import's spans arrive in any order).
#[tokio::test]
async fn a_root_that_arrives_late_but_started_first_names_the_rollup() {
    use flightlog_core::activity::RunListQuery;
    let fx = fixture();
    let callee = span("callee", None, SpanKind::Turn, 2_000);
    fx.store.import_spans(vec![callee]).await.unwrap();
    let first = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(
        (first.name.as_str(), first.started_at),
        ("callee-name", 2_000)
    );

    let mut caller = span("caller", None, SpanKind::Turn, 1_000);
    caller.end = Some(ImportedEnd {
        ended_at: 3_000,
        outcome: SpanOutcome::Success,
        reason: None,
    });
    fx.store.import_spans(vec![caller]).await.unwrap();
    let rollup = fx.store.read_rollup("trace1").await.unwrap().unwrap();
    assert_eq!(rollup.name, "caller-name");
    assert_eq!(rollup.started_at, 1_000);
    assert_eq!(rollup.ended_at, Some(3_000));
    assert_eq!(rollup.duration_ms, Some(2_000), "start + duration = end");
    let listed = listed_run(&fx, "trace1").await;
    assert_eq!(listed.name, rollup.name, "the list and the rollup agree");
    assert_eq!(listed.started_at, rollup.started_at);
    let runs = fx.store.list_runs(RunListQuery {
        state: None,
        outcome: None,
        origin: None,
        limit: 10,
        before: None,
    });
    assert_eq!(
        runs.await.expect("the run list").runs.len(),
        1,
        "listed once"
    );
}

/// A store importing as `otlp` and a sweeper on one file, on a manual clock at `t0`, and a
/// client whose clock is three hours behind it (`behind` is its time then); the client has
/// announced a pending root `root` and, under it, a pending `tool`.
struct LateClient {
    _dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    store: SqliteActivityStore,
    sweeper: SqliteActivityStore,
    t0: i64,
    behind: i64,
}

async fn late_client_with_pending_tool() -> LateClient {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("import.db")))
        .expect("the database opens");
    let t0 = 10_000_000;
    let clock = Arc::new(ManualClock::new(t0));
    let store = SqliteActivityStore::with_identity(db.clone(), clock.clone(), "otlp");
    let sweeper = SqliteActivityStore::with_identity(db, clock.clone(), "sweeper");
    let behind = t0 - 3 * 3_600_000;
    let mut pending_root = span("root", None, SpanKind::Turn, behind);
    pending_root.end = None;
    let mut pending = span("tool", Some("root"), SpanKind::Tool, behind + 10);
    pending.end = None;
    store
        .import_spans(vec![pending_root, pending])
        .await
        .expect("the announcements are stored");
    LateClient {
        _dir: dir,
        clock,
        store,
        sweeper,
        t0,
        behind,
    }
}

/// A pending span whose run has no open root here (its root's completed copy arrived, its own
/// end has not yet) counts as alive from its announcement by the server's clock, and each
/// delivery of the run renews it: the leftover sweep spares it while its exporter delivers,
/// even from a client whose clock is hours behind, and closes it once the deliveries stop for
/// the window (its exporter died before sending its end).
#[tokio::test]
async fn a_pending_span_under_an_ended_root_lives_while_its_trace_is_delivered() {
    let LateClient {
        _dir,
        clock,
        store,
        sweeper,
        t0,
        behind,
    } = late_client_with_pending_tool().await;
    let root = span("root", None, SpanKind::Turn, behind);
    let window = 3_600_000;
    let sweep = || sweeper.sweep_leftovers_step(window, None, 10);

    // Nearly a window later the root's completed copy arrives (ended by the late clock), the
    // tool still running.
    clock.set(t0 + window - 1);
    store.import_spans(vec![root]).await.unwrap();
    assert!(store
        .get_span("root")
        .await
        .unwrap()
        .unwrap()
        .outcome
        .is_some());
    clock.set(t0 + window + 1);
    assert_eq!(
        sweep().await.unwrap(),
        (0, false),
        "renewed by the delivery"
    );
    let tool = store.get_span("tool").await.unwrap().unwrap();
    assert_eq!(tool.parent_span_id.as_deref(), Some("root"));
    assert!(tool.outcome.is_none());

    // Then the exporter goes quiet for a whole window: the span is closed.
    clock.set(t0 + 2 * window);
    assert_eq!(sweep().await.unwrap(), (1, false));
    let tool = store.get_span("tool").await.unwrap().unwrap();
    assert_eq!(tool.outcome, Some(SpanOutcome::Interrupted));
}

/// The heartbeat an open span gets at its announcement is the server's clock, whatever the
/// client's: a pending child whose run loses its open root without another delivery (the root
/// ended through the native API with the client's late clock) is not judged silent at once.
#[tokio::test]
async fn a_pending_span_is_alive_from_its_announcement_by_the_servers_clock() {
    let LateClient {
        _dir,
        clock,
        store,
        sweeper,
        t0,
        behind,
    } = late_client_with_pending_tool().await;
    assert_eq!(
        store
            .get_span("tool")
            .await
            .unwrap()
            .unwrap()
            .last_heartbeat_at,
        Some(t0)
    );
    assert!(store
        .end_span(
            "root",
            EndSpanInput {
                outcome: SpanOutcome::Success,
                reason: None,
                ended_at: Some(behind + 1_000),
                usage: None,
                attrs: None,
            },
        )
        .await
        .unwrap());
    clock.set(t0 + 60_000);
    let window = 3_600_000;
    assert_eq!(
        sweeper
            .sweep_leftovers_step(window, None, 10)
            .await
            .unwrap(),
        (0, false)
    );
    clock.set(t0 + window + 1);
    assert_eq!(
        sweeper
            .sweep_leftovers_step(window, None, 10)
            .await
            .unwrap(),
        (1, false),
        "silent for a window since its announcement"
    );
}

/// A pending span from a client whose clock is ahead is alive from its announcement by the
/// server's clock, not until the client's start time: an hour of skew kept a dead exporter's
/// run open an hour longer.
#[tokio::test]
async fn a_pending_span_from_a_clock_ahead_is_judged_by_the_servers_clock() {
    let fx = fixture();
    let mut ahead = span("root", None, SpanKind::Turn, 5_000 + 3_600_000);
    ahead.end = None;
    fx.store.import_spans(vec![ahead]).await.unwrap();
    let open = fx.store.open_root_spans().await.unwrap();
    assert_eq!(open[0].last_heartbeat_at, Some(5_000));
}

/// A delivery's change rows are written several to a statement (stop 28): the log must be the
/// one a row at a time gave. 150 spans in three runs, every other one with two events, in one
/// delivery: change ids dense from 1 in delivery order (each span, then its events), each run's
/// seqs dense from 1, and a native write after it continues both without a gap.
#[tokio::test]
async fn a_delivery_logs_its_changes_densely_in_delivery_order() {
    let fx = fixture();
    let mut spans = Vec::new();
    for index in 0..150 {
        let run = index % 3;
        let mut one = span(&format!("s{index}"), None, SpanKind::Tool, 1_000 + index);
        one.run_id = format!("run-{run}");
        if index >= 3 {
            one.parent_span_id = Some(format!("s{run}"));
        }
        if index % 2 == 0 {
            one.events = vec![
                event(1_000 + index, "first"),
                event(1_001 + index, "second"),
            ];
        }
        spans.push(one);
    }
    let expected: Vec<(String, String, Option<i64>)> = spans
        .iter()
        .flat_map(|span| {
            let events = (0..span.events.len()).map(|at| {
                (
                    span.run_id.clone(),
                    span.span_id.clone(),
                    i64::try_from(at).ok(),
                )
            });
            std::iter::once((span.run_id.clone(), span.span_id.clone(), None)).chain(events)
        })
        .collect();
    let report = fx.store.import_spans(spans).await.expect("imported");
    assert_eq!(report.created, 150);
    let changes = fx
        .store
        .changes_since(0, 1_000)
        .await
        .expect("the change log");
    assert_eq!(changes.len(), expected.len());
    let mut next_seq = std::collections::HashMap::new();
    for (at, (change, (run, span_id, event_index))) in changes.iter().zip(&expected).enumerate() {
        assert_eq!(change.change_id, i64::try_from(at).expect("small") + 1);
        assert_eq!(&change.run_id, run);
        let seq = next_seq.entry(run.clone()).or_insert(1);
        assert_eq!(change.seq, *seq, "{change:?}");
        *seq += 1;
        match (&change.body, event_index) {
            (ChangeBody::Span { span }, None) => assert_eq!(&span.span_id, span_id),
            (ChangeBody::Event { event }, Some(index)) => {
                assert_eq!(&event.span_id, span_id);
                assert_eq!(event.event_index, *index);
            }
            (body, _) => panic!("change {at}: {body:?}, expected {span_id} {event_index:?}"),
        }
    }
    fx.store
        .start_span(StartSpanInput {
            parent_span_id: Some("s0".into()),
            name: "after".into(),
            kind: SpanKind::Tool,
            ..native_start("native", "run-0", 2_000)
        })
        .await
        .expect("started");
    let after = fx
        .store
        .changes_since(i64::try_from(expected.len()).expect("small"), 10)
        .await
        .expect("the change log");
    assert_eq!(after.len(), 1);
    assert_eq!(
        after[0].change_id,
        i64::try_from(expected.len()).expect("small") + 1
    );
    assert_eq!(after[0].seq, next_seq["run-0"]);
}

/// A delivery whose change rows the file refuses (a trigger installed by another connection)
/// fails whole, and leaves no trace: the rows it held back are dropped with the counters that
/// numbered them, so the next delivery's change ids and seqs start where the log left off.
#[tokio::test]
async fn a_delivery_failing_at_its_change_rows_leaves_no_trace_and_no_gap() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("poisoned.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("the database opens");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(5_000)), "otlp");
    let conn = rusqlite::Connection::open(&path).expect("a second connection");
    conn.execute_batch(
        "CREATE TRIGGER poison BEFORE INSERT ON activity_changes
         WHEN NEW.span_key IN (SELECT span_key FROM activity_spans WHERE span_id LIKE 'poison%')
         BEGIN SELECT RAISE(ABORT, 'poisoned write'); END;",
    )
    .expect("the trigger");
    drop(conn);
    let delivery = |prefix: &str, poisoned: Option<usize>| -> Vec<ImportedSpan> {
        (0..40)
            .map(|index| {
                let id = if Some(index) == poisoned {
                    format!("poison-{prefix}{index}")
                } else {
                    format!("{prefix}{index}")
                };
                let mut one = span(&id, None, SpanKind::Tool, 1_000 + index as i64);
                one.run_id = format!("{prefix}-run");
                one.events = vec![event(1_000, "e")];
                one
            })
            .collect()
    };
    store
        .import_spans(delivery("a", None))
        .await
        .expect("a clean delivery");
    let failed = store.import_spans(delivery("b", Some(30))).await;
    assert!(failed.is_err(), "{failed:?}");
    assert!(store.get_span("b0").await.expect("read").is_none());
    store
        .import_spans(delivery("c", None))
        .await
        .expect("a clean delivery after");
    let changes = store.changes_since(0, 1_000).await.expect("the change log");
    let ids: Vec<i64> = changes.iter().map(|change| change.change_id).collect();
    assert_eq!(
        ids,
        (1..=160).collect::<Vec<i64>>(),
        "80 rows a delivery, no gap"
    );
    let seqs: Vec<i64> = changes
        .iter()
        .filter(|change| change.run_id == "c-run")
        .map(|change| change.seq)
        .collect();
    assert_eq!(seqs, (1..=80).collect::<Vec<i64>>());
}

/// A span of a run whose detail was pruned, delivered again (an exporter's retry or a replay
/// long after): it is rejected, named with the reason, and the run's kept rollup (its usage,
/// cost, outcome) stays as it was. Stored, it was the run's only span and the rollup read back
/// from it lost the model spans' tokens; a later prune then never took the run again.
#[tokio::test]
async fn a_span_of_a_pruned_run_is_rejected_and_the_kept_rollup_stays() {
    let fx = fixture();
    let root = span("root", None, SpanKind::Turn, 1_000);
    let model = model_span("m1", "root", 1_100, 1_000, 0.25);
    fx.store
        .import_spans(vec![root.clone(), model.clone()])
        .await
        .unwrap();
    let before = fx
        .store
        .read_rollup("trace1")
        .await
        .unwrap()
        .expect("rolled up");
    assert_eq!(before.input_tokens, Some(1_000));
    let pruned = fx
        .store
        .prune(PruneOptions {
            max_spans: None,
            digest_floor_at: 1_000_000,
            hard_ceiling_ms: 0,
            now: Some(1_000_000),
            batch: None,
            scheduled: true,
        })
        .await
        .unwrap();
    assert_eq!(pruned.runs_pruned, 1);
    let kept = fx.store.read_rollup("trace1").await.unwrap().expect("kept");
    assert!(kept.detail_pruned);
    assert_eq!(
        (kept.input_tokens, kept.cost_usd),
        (before.input_tokens, before.cost_usd)
    );

    let mut late = model_span("m2", "root", 1_150, 5, 0.01);
    late.run_id = "trace1".into();
    let report = fx
        .store
        .import_spans(vec![root, model, late])
        .await
        .unwrap();
    assert_eq!(
        (report.created, report.completed, report.unchanged),
        (0, 0, 0)
    );
    assert_eq!(report.rejected.len(), 3, "{report:?}");
    for rejection in &report.rejected {
        assert!(
            rejection
                .reason
                .contains("run \"trace1\" was pruned (its spans deleted, its rollup kept)"),
            "{rejection:?}"
        );
    }
    assert!(fx.store.get_span("root").await.unwrap().is_none());
    let after = fx.store.read_rollup("trace1").await.unwrap().expect("kept");
    assert_eq!(after, kept);
}

/// A trace with two roots (a service called twice by a caller that exports elsewhere), each
/// delivered with its model call: the run's rollup counts both calls, whichever came first.
#[tokio::test]
async fn a_trace_with_two_roots_rolls_up_both_calls() {
    let fx = fixture();
    fx.store
        .import_spans(vec![
            span("call-1", None, SpanKind::Turn, 1_000),
            model_span("m1", "call-1", 1_010, 1_000, 0.25),
        ])
        .await
        .unwrap();
    let first = fx
        .store
        .read_rollup("trace1")
        .await
        .unwrap()
        .expect("rolled up");
    assert_eq!(
        (first.input_tokens, first.cost_usd),
        (Some(1_000), Some(0.25))
    );
    let report = fx
        .store
        .import_spans(vec![
            model_span("m2", "call-2", 3_010, 2_000, 0.5),
            span("call-2", None, SpanKind::Turn, 3_000),
        ])
        .await
        .unwrap();
    assert!(report.rejected.is_empty(), "{report:?}");
    let both = fx
        .store
        .read_rollup("trace1")
        .await
        .unwrap()
        .expect("rolled up");
    assert_eq!(
        (both.input_tokens, both.output_tokens, both.cost_usd),
        (Some(3_000), Some(300), Some(0.75))
    );
    assert_eq!(both.name, "call-1-name");
    assert_eq!(both.span_count, 4);
}

/// An imported run is judged by the scheduled retention and the hard ceiling by its arrival
/// too (`activity_runs.imported_at`, the server's clock), not by its exporter's times alone: a
/// trace replayed with timestamps far in the past was pruned within a minute of arriving, and
/// its later spans refused (an audit's finding). Once its arrival is older than the window,
/// it goes as any run.
#[tokio::test]
async fn an_imported_run_is_kept_for_the_retention_after_it_arrived() {
    const DAY: i64 = 86_400_000;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("arrival.db")))
        .expect("the database opens");
    let clock = Arc::new(ManualClock::new(100 * DAY));
    let store = SqliteActivityStore::with_identity(db, clock.clone(), "otlp");
    // A whole trace and one whose root never comes, both stamped 100 days ago by the exporter.
    let whole = vec![
        span("root", None, SpanKind::Turn, 1_000),
        span("tool", Some("root"), SpanKind::Tool, 1_010),
    ];
    let mut rootless = span("orphan", Some("elsewhere"), SpanKind::Tool, 1_000);
    rootless.run_id = "trace2".into();
    store.import_spans(whole).await.expect("imported");
    store.import_spans(vec![rootless]).await.expect("imported");
    let scheduled = |now: i64| PruneOptions {
        digest_floor_at: now - 30 * DAY,
        hard_ceiling_ms: 30 * DAY,
        now: Some(now),
        batch: Some(50),
        max_spans: Some(5_000),
        scheduled: true,
    };
    let pruned = store
        .prune(scheduled(100 * DAY + 60_000))
        .await
        .expect("pruned");
    assert_eq!(pruned.runs_pruned, 0, "both arrived a minute ago");
    // A late span of the replayed trace is taken, not refused as a pruned run's.
    let late = store
        .import_spans(vec![span("late", Some("root"), SpanKind::Tool, 1_020)])
        .await
        .expect("imported");
    assert!(late.rejected.is_empty(), "{:?}", late.rejected);
    // The endpoint's hard ceiling keeps the rootless run by its arrival too (the whole trace,
    // rolled up, goes by the reference's rule).
    let endpoint = PruneOptions {
        scheduled: false,
        max_spans: None,
        ..scheduled(100 * DAY + 60_000)
    };
    store.prune(endpoint).await.expect("pruned");
    assert!(store.get_span("orphan").await.expect("read").is_some());
    // A month and a day after its arrival, the rootless run goes as any old run, even when the
    // same ended span is delivered again (a repeat writes nothing, so stamps no arrival).
    clock.set(131 * DAY);
    let mut again = span("orphan", Some("elsewhere"), SpanKind::Tool, 1_000);
    again.run_id = "trace2".into();
    let repeat = store.import_spans(vec![again]).await.expect("imported");
    assert_eq!(repeat.unchanged, 1);
    let pruned = store.prune(scheduled(131 * DAY)).await.expect("pruned");
    assert!(pruned.runs_pruned >= 1, "{pruned:?}");
    assert!(store.get_span("orphan").await.expect("read").is_none());
}
