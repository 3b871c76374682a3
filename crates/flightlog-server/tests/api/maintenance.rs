//! The scheduled maintenance (`flightlog_server::maintenance`) over a real server's database,
//! on a manual clock: each test writes through HTTP, moves the clock, runs one pass and reads
//! the result back through HTTP and `/metrics`. The schedule itself (the binary's flags, a pass
//! every interval, the output lines) is tested on the real binary in `tests/binary_settings.rs`.

use std::sync::Arc;

use flightlog_core::journal::RetentionConfig;
use flightlog_core::Clock;
use flightlog_server::maintenance::{
    maintenance_writer, Maintenance, MaintenancePlan, PassReport, Step,
};
use reqwest::Method;
use serde_json::{json, Value};

use crate::metrics::scrape;
use crate::support::{Options, TestServer};

/// A plan with every step off (each test switches on the one it is about).
const NOTHING: MaintenancePlan = MaintenancePlan {
    every: std::time::Duration::from_secs(60),
    stale_after_ms: None,
    stuck_after_ms: None,
    prune_after_ms: None,
    journal_prune: false,
};

async fn manual_server(retention: RetentionConfig) -> TestServer {
    TestServer::start_with(Options {
        manual_clock: true,
        retention,
        ..Options::default()
    })
    .await
}

fn set_clock(server: &TestServer, now: i64) {
    server.clock.as_ref().expect("a manual clock").set(now);
}

/// The maintenance of `server` with `plan`, made at the clock's current time (its start).
fn maintenance(server: &TestServer, plan: MaintenancePlan) -> Maintenance {
    let clock: Arc<dyn Clock> = server.clock.clone().expect("a manual clock");
    Maintenance::new(&server.state, &maintenance_writer("test"), clock, plan)
}

/// Start a span as `writer` (`None`: the server's own identity) at the clock's time.
async fn start(
    server: &TestServer,
    span: &str,
    run: &str,
    parent: Option<&str>,
    writer: Option<&str>,
) {
    let mut body = json!({"spanId": span, "runId": run, "name": format!("{span} work"),
                          "kind": if parent.is_some() { "tool" } else { "turn" },
                          "origin": "session"});
    if let Some(parent) = parent {
        body["parentSpanId"] = json!(parent);
    }
    server
        .send(Method::POST, "/v1/activity/spans", Some(&body), writer)
        .await
        .assert_status(201);
}

async fn end(server: &TestServer, span: &str, body: Value) {
    let reply = server
        .post(&format!("/v1/activity/spans/{span}/end"), &body)
        .await;
    assert_eq!(reply.assert_status(200)["ended"], true);
}

async fn span(server: &TestServer, span: &str) -> Value {
    server
        .get(&format!("/v1/activity/spans/{span}"))
        .await
        .assert_status(200)
        .clone()
}

async fn rollup(server: &TestServer, run: &str) -> Value {
    server
        .get(&format!("/v1/activity/runs/{run}/rollup"))
        .await
        .assert_status(200)
        .clone()
}

async fn pass(maintenance: &mut Maintenance) -> PassReport {
    let report = maintenance.pass().await;
    assert!(report.errors.is_empty(), "{report:?}");
    report
}

/// A run whose root has had no heartbeat for the window is closed, children first, whoever
/// wrote it (a client naming itself, or a request naming no writer, whose spans carry the
/// server's own identity); a run whose writer heartbeats survives; and nothing is judged
/// before the server has been up for the window, since no client could heartbeat while it
/// was down.
#[tokio::test]
async fn the_stale_sweep_closes_silent_runs_of_every_writer_once_the_server_has_been_up_a_window() {
    let server = manual_server(RetentionConfig::default()).await;
    // Written during an earlier life of the server, say.
    set_clock(&server, 1_000);
    start(&server, "a-root", "run-a", None, Some("agent-a")).await;
    start(&server, "a-tool", "run-a", Some("a-root"), Some("agent-a")).await;
    start(&server, "b-root", "run-b", None, None).await;
    start(&server, "c-root", "run-c", None, Some("agent-c")).await;

    // The server (re)starts at 100,000: every root is far past the window already.
    set_clock(&server, 100_000);
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            stale_after_ms: Some(10_000),
            ..NOTHING
        },
    );
    set_clock(&server, 105_000);
    assert_eq!(pass(&mut maintenance).await.stale_spans_closed, 0);
    assert!(span(&server, "a-root").await["outcome"].is_null());

    // agent-c heartbeats its root; the window since the start has passed.
    set_clock(&server, 109_000);
    server
        .post("/v1/activity/spans/c-root/heartbeat", &json!({}))
        .await
        .assert_status(204);
    set_clock(&server, 110_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stale_spans_closed, 3, "{report:?}");
    for closed in ["a-root", "a-tool", "b-root"] {
        let row = span(&server, closed).await;
        assert_eq!(row["outcome"], "interrupted", "{row}");
        assert_eq!(row["outcomeReason"], "writer went silent", "{row}");
    }
    assert!(span(&server, "c-root").await["outcome"].is_null());
    let rollup = rollup(&server, "run-a").await;
    assert_eq!(rollup["outcome"], "interrupted", "{rollup}");

    // Silent since its heartbeat: closed a window later.
    set_clock(&server, 119_001);
    assert_eq!(pass(&mut maintenance).await.stale_spans_closed, 1);
    assert_eq!(span(&server, "c-root").await["outcome"], "interrupted");

    let metrics = scrape(&server).await;
    assert_eq!(
        metrics.get("flightlog_maintenance_stale_spans_closed_total"),
        Some(4.0)
    );
    assert_eq!(
        metrics.get(r#"flightlog_maintenance_passes_total{step="stale_sweep",result="ok"}"#),
        Some(2.0),
        "the pass inside the first window does not count as a sweep"
    );
    // By the machine's clock, not the testing clock the sweep went by.
    let last_success = metrics
        .get(r#"flightlog_maintenance_last_success_timestamp_seconds{step="stale_sweep"}"#)
        .expect("the sweep's last success");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64();
    assert!(
        last_success <= now && last_success > now - 600.0,
        "{last_success} vs now {now}"
    );
    assert_eq!(
        metrics.get(r#"flightlog_maintenance_last_success_timestamp_seconds{step="prune"}"#),
        None,
        "a step that is off has never succeeded"
    );
    server.stop().await;
}

/// A backlog of silent runs (more than one step's worth) is closed in one pass, step after
/// step, every child with its root.
#[tokio::test]
async fn the_stale_sweep_works_off_a_backlog_in_steps() {
    let server = manual_server(RetentionConfig::default()).await;
    let runs = 450;
    let mut ops = Vec::new();
    for n in 0..runs {
        ops.push(
            json!({"op": "startSpan", "spanId": format!("root-{n}"), "runId": format!("run-{n}"),
                        "name": "turn", "kind": "turn", "origin": "session"}),
        );
        ops.push(
            json!({"op": "startSpan", "spanId": format!("tool-{n}"), "runId": format!("run-{n}"),
                        "parentSpanId": format!("root-{n}"), "name": "tool", "kind": "tool",
                        "origin": "session"}),
        );
    }
    let results = server
        .send(
            Method::POST,
            "/v1/activity/batch",
            Some(&json!({"ops": ops})),
            Some("agent"),
        )
        .await
        .assert_status(200)["results"]
        .clone();
    assert!(results
        .as_array()
        .is_some_and(|results| results.iter().all(|r| r.get("error").is_none())));
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            stale_after_ms: Some(1_000),
            ..NOTHING
        },
    );
    set_clock(&server, 5_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stale_spans_closed, 2 * runs, "{report:?}");
    let open = server
        .get("/v1/activity/open-roots")
        .await
        .assert_status(200)
        .clone();
    assert_eq!(open, json!([]));
    assert_eq!(span(&server, "tool-449").await["outcome"], "interrupted");
    server.stop().await;
}

/// A tool span its agent forgot to end, under a root that ended, was open for ever: the
/// reference's sweep judges open roots only, and a run with an open span is never pruned. The
/// pass closes it once the run has shown no life for the window (the root's end counts), and
/// the run's detail can then go by the retention; the run's outcome stays its root's.
#[tokio::test]
async fn a_span_left_open_after_its_run_ended_is_closed_and_the_run_pruned() {
    let server = manual_server(RetentionConfig::default()).await;
    set_clock(&server, 1_000);
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            stale_after_ms: Some(10_000),
            prune_after_ms: Some(50_000),
            ..NOTHING
        },
    );
    start(&server, "root", "run", None, Some("agent")).await;
    start(&server, "forgotten", "run", Some("root"), Some("agent")).await;
    set_clock(&server, 5_000);
    end(&server, "root", json!({"outcome": "success"})).await;
    server
        .post_empty("/v1/activity/runs/run/rollup")
        .await
        .assert_status(204);

    // A window after the start, but not after the root's end: spared.
    set_clock(&server, 12_000);
    assert_eq!(pass(&mut maintenance).await.stale_spans_closed, 0);
    assert!(span(&server, "forgotten").await["outcome"].is_null());

    set_clock(&server, 15_001);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stale_spans_closed, 1, "{report:?}");
    let forgotten = span(&server, "forgotten").await;
    assert_eq!(forgotten["outcome"], "interrupted", "{forgotten}");
    assert_eq!(
        forgotten["outcomeReason"], "writer went silent",
        "{forgotten}"
    );
    let rollup = rollup(&server, "run").await;
    assert_eq!(rollup["outcome"], "success", "{rollup}");

    // The retention goes by the run's last span to end: the sweep's close at 15,001.
    set_clock(&server, 65_000);
    assert_eq!(pass(&mut maintenance).await.runs_pruned, 0);
    set_clock(&server, 65_002);
    let report = pass(&mut maintenance).await;
    assert_eq!(
        (report.runs_pruned, report.spans_pruned),
        (1, 2),
        "{report:?}"
    );
    server
        .get("/v1/activity/spans/forgotten")
        .await
        .assert_status(404);
    // Its snapshot and stream say why there is nothing to show, not that the run is unknown.
    for path in [
        "/v1/activity/runs/run/snapshot",
        "/v1/activity/runs/run/stream",
    ] {
        let message = server.get(path).await.assert_status(404)["error"]["message"].clone();
        assert!(
            message.as_str().is_some_and(
                |m| m.contains("was pruned") && m.contains("GET /v1/activity/runs/run/rollup")
            ),
            "{path}: {message}"
        );
    }
    let unknown = server.get("/v1/activity/runs/nope/snapshot").await;
    assert_eq!(
        unknown.assert_status(404)["error"]["message"],
        "no run with id \"nope\""
    );
}

/// Open roots running longer than the threshold are counted in the gauge at every pass and
/// named once; a run that ends leaves the count, and nothing else is changed.
#[tokio::test]
async fn the_watchdog_counts_stuck_runs_and_names_each_once() {
    let server = manual_server(RetentionConfig::default()).await;
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            stuck_after_ms: Some(60_000),
            ..NOTHING
        },
    );
    start(&server, "long-root", "run-long", None, Some("agent")).await;
    set_clock(&server, 30_000);
    start(&server, "later-root", "run-later", None, Some("agent")).await;

    set_clock(&server, 59_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stuck_runs, Some(0));

    set_clock(&server, 61_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stuck_runs, Some(1));
    assert_eq!(report.newly_stuck, vec!["run-long".to_owned()]);
    assert_eq!(scrape(&server).await.get("flightlog_runs_stuck"), Some(1.0));

    set_clock(&server, 95_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stuck_runs, Some(2));
    assert_eq!(
        report.newly_stuck,
        vec!["run-later".to_owned()],
        "named once each"
    );

    end(&server, "long-root", json!({"outcome": "success"})).await;
    let report = pass(&mut maintenance).await;
    assert_eq!(report.stuck_runs, Some(1));
    assert!(report.newly_stuck.is_empty());
    assert_eq!(scrape(&server).await.get("flightlog_runs_stuck"), Some(1.0));
    // The watchdog reports; it closes nothing.
    assert!(span(&server, "later-root").await["outcome"].is_null());
    server.stop().await;
}

/// The detail of runs that ended longer ago than the retention is deleted, in as many batches
/// as it takes, their rollups kept (usage and cost included) and marked `detailPruned`, with no
/// coverage-gap reason: the retention is the operator's choice, not a missed digest. Runs that
/// ended later, and open runs, keep everything.
#[tokio::test]
async fn the_retention_prunes_the_detail_of_old_runs_in_batches_and_keeps_their_rollups() {
    let server = manual_server(RetentionConfig::default()).await;
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            prune_after_ms: Some(1_000_000),
            ..NOTHING
        },
    );
    // 120 old runs: more than two batches.
    let old_runs = 120;
    let mut ops = Vec::new();
    for n in 0..old_runs {
        ops.push(
            json!({"op": "startSpan", "spanId": format!("old-{n}"), "runId": format!("old-run-{n}"),
                        "name": "turn", "kind": "turn", "origin": "session", "startedAt": 1_000}),
        );
        ops.push(
            json!({"op": "endSpan", "spanId": format!("old-{n}"), "outcome": "success",
                        "endedAt": 2_000,
                        "usage": {"inputTokens": 100, "outputTokens": 10, "costUsd": 0.5}}),
        );
    }
    let results = server
        .post("/v1/activity/batch", &json!({"ops": ops}))
        .await
        .assert_status(200)["results"]
        .clone();
    assert!(
        results
            .as_array()
            .expect("results")
            .iter()
            .all(|result| result.get("error").is_none()),
        "{results}"
    );
    for n in 0..old_runs {
        server
            .post_empty(&format!("/v1/activity/runs/old-run-{n}/rollup"))
            .await
            .assert_status(204);
    }
    set_clock(&server, 500_000);
    start(&server, "recent-root", "recent-run", None, None).await;
    end(&server, "recent-root", json!({"outcome": "success"})).await;
    start(&server, "open-root", "open-run", None, None).await;

    set_clock(&server, 1_002_001);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.runs_pruned, old_runs, "{report:?}");
    assert_eq!(report.spans_pruned, old_runs, "{report:?}");
    for n in [0, 59, 119] {
        server
            .get(&format!("/v1/activity/runs/old-run-{n}/snapshot"))
            .await
            .assert_error(404, "not_found");
        let rollup = server
            .get(&format!("/v1/activity/runs/old-run-{n}/rollup"))
            .await
            .assert_status(200)
            .clone();
        assert_eq!(rollup["detailPruned"], true, "{rollup}");
        assert_eq!(rollup["inputTokens"], 100, "{rollup}");
        assert_eq!(rollup["costUsd"], 0.5, "{rollup}");
        assert!(rollup["failureReason"].is_null(), "{rollup}");
    }
    for kept in ["recent-run", "open-run"] {
        let snapshot = server
            .get(&format!("/v1/activity/runs/{kept}/snapshot"))
            .await
            .assert_status(200)
            .clone();
        assert_eq!(
            snapshot["spans"].as_array().map(Vec::len),
            Some(1),
            "{snapshot}"
        );
    }
    // Nothing left to prune: the next pass does nothing.
    assert_eq!(pass(&mut maintenance).await.runs_pruned, 0);
    let metrics = scrape(&server).await;
    assert_eq!(
        metrics.get("flightlog_maintenance_runs_pruned_total"),
        Some(old_runs as f64)
    );
    assert_eq!(
        metrics.get("flightlog_maintenance_spans_pruned_total"),
        Some(old_runs as f64)
    );

    // A pruned run written to again (its id reused) and rolled up: its rollup still says
    // `detailPruned`, which the reference's prune rule (and the endpoint) never takes again,
    // so its new detail stayed for good. The scheduled prune takes it once it is old enough.
    start(&server, "old-0-again", "old-run-0", None, None).await;
    end(
        &server,
        "old-0-again",
        json!({"outcome": "error", "reason": "again"}),
    )
    .await;
    server
        .post_empty("/v1/activity/runs/old-run-0/rollup")
        .await
        .assert_status(204);
    let endpoint = server
        .post(
            "/v1/activity/maintenance/prune",
            &json!({"digestFloorAt": 5_000_000, "hardCeilingMs": 0, "now": 5_000_000}),
        )
        .await
        .assert_status(200)
        .clone();
    assert_eq!(
        endpoint["runsPruned"], 0,
        "the reference's rule: {endpoint}"
    );
    assert_eq!(
        pass(&mut maintenance).await.runs_pruned,
        0,
        "not old enough"
    );
    set_clock(&server, 2_002_002);
    let report = pass(&mut maintenance).await;
    // With it `recent-run`, ended at 500,000 and never rolled up: rolled up, then pruned.
    assert_eq!(
        (report.runs_pruned, report.spans_pruned),
        (2, 2),
        "{report:?}"
    );
    let recent = rollup(&server, "recent-run").await;
    assert_eq!(
        (&recent["detailPruned"], &recent["outcome"]),
        (&json!(true), &json!("success")),
        "{recent}"
    );
    assert!(span(&server, "open-root").await["outcome"].is_null());
    server
        .get("/v1/activity/runs/old-run-0/snapshot")
        .await
        .assert_error(404, "not_found");
    let rollup = rollup(&server, "old-run-0").await;
    assert_eq!(rollup["detailPruned"], true, "{rollup}");
    assert_eq!(pass(&mut maintenance).await.runs_pruned, 0);
    server.stop().await;
}

/// Engagements nothing was appended to for the journal's retention are removed, the others
/// kept, judged by when the appends arrived (the store's clock), not by the `at` clients give
/// their events: an engagement whose events are backdated (or given in seconds) is live while
/// appends keep coming, and one whose events claim to be in the future is still idle when
/// nothing comes.
/// A pass trims the change log to its bound even when no run is old enough to prune: it goes
/// on while a prune call trims anything (at most 20,000 rows a call). It stopped at the first
/// call that pruned no run, so the log kept growing behind a burst, 100,000 rows a pass.
#[tokio::test]
async fn a_pass_trims_the_whole_change_log_backlog_even_when_no_run_is_pruned() {
    let server = TestServer::start_with(Options {
        manual_clock: true,
        change_log_retention: Some(100),
        ..Options::default()
    })
    .await;
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            prune_after_ms: Some(1_000_000),
            ..NOTHING
        },
    );
    // 45,000 changes: 900 finished runs of 25 spans, each started and ended.
    for request in 0..45 {
        let mut ops = Vec::new();
        for run in 0..20 {
            let run_id = format!("burst-{request}-{run}");
            for span in 0..25 {
                let span_id = format!("{run_id}-{span}");
                let mut start = json!({"op": "startSpan", "spanId": span_id, "runId": run_id,
                                       "name": "step", "kind": "tool", "origin": "session"});
                if span > 0 {
                    start["parentSpanId"] = json!(format!("{run_id}-0"));
                }
                ops.push(start);
            }
            for span in (0..25).rev() {
                ops.push(
                    json!({"op": "endSpan", "spanId": format!("{run_id}-{span}"),
                                "outcome": "success"}),
                );
            }
        }
        server
            .post("/v1/activity/batch", &json!({"ops": ops}))
            .await
            .assert_status(200);
    }
    let newest = server.get("/v1/activity/cursor").await.assert_status(200)["changeCursor"]
        .as_i64()
        .expect("a cursor");
    assert_eq!(newest, 45_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.runs_pruned, 0, "{report:?}");
    // Every row below 45,000 - 100 is behind the retention: 44,899 of them, the pass done.
    let metrics = scrape(&server).await;
    assert_eq!(
        metrics.get("flightlog_maintenance_changes_trimmed_total"),
        Some(44_899.0)
    );
    assert_eq!(metrics.get("flightlog_maintenance_prune_behind"), Some(0.0));
    let page = server.get("/v1/activity/changes?after=0&limit=1").await;
    let oldest = page.assert_status(200)[0]["changeId"].as_i64();
    assert!(
        oldest.is_some_and(|oldest| oldest >= newest - 100),
        "the oldest change left is {oldest:?}, the newest {newest}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_journal_retention_removes_engagements_nothing_was_appended_to() {
    let server = manual_server(RetentionConfig {
        max_age_ms: 1_000,
        ..RetentionConfig::default()
    })
    .await;
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            journal_prune: true,
            ..NOTHING
        },
    );
    let append = |engagement: &'static str, at: i64| {
        let server = &server;
        async move {
            server
                .post(
                    &format!("/v1/engagements/{engagement}/events"),
                    &json!({"type": "note", "at": at, "data": {}}),
                )
                .await
                .assert_status(201);
        }
    };
    // Appended at clock 0, its event dated far ahead.
    append("idle", 5_000_000).await;
    set_clock(&server, 1_500);
    // Appended at 1,500, its events backdated to the epoch and in seconds.
    append("busy", 1_700_000).await;
    append("busy", 0).await;
    set_clock(&server, 2_000);
    let report = pass(&mut maintenance).await;
    assert_eq!(report.engagements_removed, 1, "{report:?}");
    let listed = server
        .get("/v1/engagements")
        .await
        .assert_status(200)
        .clone();
    assert_eq!(listed, json!(["busy"]));
    assert_eq!(
        scrape(&server)
            .await
            .get("flightlog_maintenance_engagements_removed_total"),
        Some(1.0)
    );
    // The reference's prune, on demand, still judges by the last appended event's `at` (0):
    // it removes the live one.
    let pruned = server
        .post("/v1/engagements/prune", &json!({"now": 2_000}))
        .await
        .assert_status(200)
        .clone();
    assert_eq!(pruned, json!({"removed": 1}));
    server.stop().await;
}

/// A step that fails (here: the database file deleted under the server, so every write is
/// refused and new read connections cannot open it) is counted as an error and does not keep
/// the steps after it from running; the next pass tries again; the server goes on answering.
#[tokio::test]
async fn a_failing_step_is_counted_and_the_other_steps_still_run() {
    let server = manual_server(RetentionConfig::default()).await;
    let mut maintenance = maintenance(
        &server,
        MaintenancePlan {
            stuck_after_ms: Some(1_000),
            prune_after_ms: Some(1_000),
            journal_prune: true,
            ..NOTHING
        },
    );
    start(&server, "root", "run", None, Some("agent")).await;
    std::fs::remove_file(&server.db_path).expect("delete the database file");
    set_clock(&server, 5_000);
    for _ in 0..2 {
        let report = maintenance.pass().await;
        let failed: Vec<Step> = report.errors.iter().map(|(step, _)| *step).collect();
        assert_eq!(
            failed,
            vec![Step::Stuck, Step::Prune, Step::JournalPrune],
            "{report:?}"
        );
        assert!(
            report.errors[1].1.contains("deleted or replaced"),
            "{report:?}"
        );
    }
    let metrics = scrape(&server).await;
    for step in ["stuck", "prune", "journal_prune"] {
        assert_eq!(
            metrics.get(&format!(
                r#"flightlog_maintenance_passes_total{{step="{step}",result="error"}}"#
            )),
            Some(2.0),
            "{step}"
        );
        assert_eq!(
            metrics.get(&format!(
                r#"flightlog_maintenance_last_success_timestamp_seconds{{step="{step}"}}"#
            )),
            None,
            "{step} never succeeded"
        );
    }
    server.get("/healthz").await.assert_status(503);
    server.stop().await;
}
