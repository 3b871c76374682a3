//! The activity fixture replayer: drives any [`ActivityStore`] through a fixture's steps.
//!
//! The caller supplies a factory that builds a fresh store (sharing one clock) per fixture; the
//! replayer creates further writer identities with [`ActivityStore::with_writer`], sets the
//! manual clock before each step that carries one, and compares every result.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, PruneOptions, SpanOutcome, SpanPatch, StartSpanInput, StoreError,
    DEFAULT_CHANGES_LIMIT,
};
use flightlog_core::ManualClock;
use serde_json::Value;

use crate::fixtures::{arg, check_step, optional_arg, to_json, Fixture};

/// The error kind a fixture's `expectError` names for this store error.
pub fn error_kind(err: &StoreError) -> &'static str {
    match err {
        StoreError::DuplicateSpan { .. } => "constraint",
        _ => "backend",
    }
}

/// Perform one op; `Ok(Err(kind))` is a store error the fixture may expect.
async fn perform(
    store: &dyn ActivityStore,
    op: &str,
    args: &Value,
) -> Result<Result<Value, String>, String> {
    let result = match op {
        "startSpan" => {
            let input: StartSpanInput = arg(args, "input")?;
            store.start_span(input).await.map(to_json)
        }
        "endSpan" => {
            let span_id: String = arg(args, "spanId")?;
            let input: EndSpanInput = arg(args, "input")?;
            store.end_span(&span_id, input).await.map(to_json)
        }
        "patchSpan" => {
            let span_id: String = arg(args, "spanId")?;
            let patch: SpanPatch = arg(args, "patch")?;
            store.patch_span(&span_id, patch).await.map(to_json)
        }
        "appendEvent" => {
            let span_id: String = arg(args, "spanId")?;
            let event_type: String = arg(args, "eventType")?;
            let ts: Option<i64> = optional_arg(args, "ts")?;
            store
                .append_event(&span_id, &event_type, args.get("payload"), ts)
                .await
                .map(to_json)
        }
        "heartbeat" => {
            let span_id: String = arg(args, "spanId")?;
            let at: Option<i64> = optional_arg(args, "at")?;
            store.heartbeat(&span_id, at).await.map(to_json)
        }
        "cascadeClose" => {
            let run_id: String = arg(args, "runId")?;
            let outcome: SpanOutcome = arg(args, "outcome")?;
            let reason: String = arg(args, "reason")?;
            store
                .cascade_close(&run_id, outcome, &reason)
                .await
                .map(to_json)
        }
        "sweepOwnOrphans" => store.sweep_own_orphans().await.map(to_json),
        "sweepStale" => {
            let stale_after: i64 = arg(args, "staleAfterMs")?;
            let now: Option<i64> = optional_arg(args, "now")?;
            store.sweep_stale(stale_after, now).await.map(to_json)
        }
        "findStuck" => {
            let threshold: i64 = arg(args, "thresholdMs")?;
            let now: Option<i64> = optional_arg(args, "now")?;
            store.find_stuck(threshold, now).await.map(to_json)
        }
        "changesSince" => {
            let cursor: i64 = arg(args, "changeCursor")?;
            let limit = optional_arg(args, "limit")?.unwrap_or(DEFAULT_CHANGES_LIMIT);
            store.changes_since(cursor, limit).await.map(to_json)
        }
        "terminalRootChangesSince" => {
            let cursor: i64 = arg(args, "changeCursor")?;
            let limit = optional_arg(args, "limit")?.unwrap_or(DEFAULT_CHANGES_LIMIT);
            store
                .terminal_root_changes_since(cursor, limit)
                .await
                .map(to_json)
        }
        "latestChangeCursor" => store.latest_change_cursor().await.map(to_json),
        "snapshotRun" => {
            let run_id: String = arg(args, "runId")?;
            store.snapshot_run(&run_id).await.map(to_json)
        }
        "runHighWaterSeq" => {
            let run_id: String = arg(args, "runId")?;
            store.run_high_water_seq(&run_id).await.map(to_json)
        }
        "getSpan" => {
            let span_id: String = arg(args, "spanId")?;
            store.get_span(&span_id).await.map(to_json)
        }
        "openRootSpans" => store.open_root_spans().await.map(to_json),
        "rollupRun" => {
            let run_id: String = arg(args, "runId")?;
            store.rollup_run(&run_id).await.map(to_json)
        }
        "readRollup" => {
            let run_id: String = arg(args, "runId")?;
            store.read_rollup(&run_id).await.map(to_json)
        }
        "prune" => {
            let options: PruneOptions = arg(args, "options")?;
            store.prune(options).await.map(to_json)
        }
        other => return Err(format!("unknown activity op {other:?}")),
    };
    match result {
        Ok(value) => value.map(Ok),
        Err(err) => match error_kind(&err) {
            "backend" => Ok(Err(format!("backend ({err})"))),
            kind => Ok(Err(kind.to_owned())),
        },
    }
}

/// Replay one fixture on the store `make(clock, writer)` builds; `Err` describes the first
/// mismatch.
pub async fn replay_activity_fixture<F>(fixture: &Fixture, mut make: F) -> Result<(), String>
where
    F: FnMut(Arc<ManualClock>, &str) -> Result<Arc<dyn ActivityStore>, String>,
{
    replay_activity_fixture_reopening(
        fixture,
        |clock, writer| std::future::ready(make(clock, &writer)),
        None,
    )
    .await
}

/// [`replay_activity_fixture`] with a store built by an async `make(clock, writer)`, and, with
/// `reopen_every: Some(n)`, built again before every n-th step (after every writer's store of
/// the previous build was dropped): for a backend on a file, `make` closes what it opened last
/// and opens the file anew, so a step after the reopen sees only what the file holds. The
/// reference keeps nothing in memory between calls, so no result may change.
pub async fn replay_activity_fixture_reopening<F, Fut>(
    fixture: &Fixture,
    mut make: F,
    reopen_every: Option<usize>,
) -> Result<(), String>
where
    F: FnMut(Arc<ManualClock>, String) -> Fut,
    Fut: Future<Output = Result<Arc<dyn ActivityStore>, String>>,
{
    let setup_clock = fixture
        .setup
        .get("clock")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let default_writer = fixture
        .setup
        .get("writer")
        .and_then(Value::as_str)
        .unwrap_or("writer")
        .to_owned();
    let clock = Arc::new(ManualClock::new(setup_clock));
    let mut default_store = make(clock.clone(), default_writer.clone()).await?;
    let mut stores: HashMap<String, Arc<dyn ActivityStore>> = HashMap::new();
    for (index, step) in fixture.steps.iter().enumerate() {
        if reopen_every.is_some_and(|every| index > 0 && index % every.max(1) == 0) {
            stores.clear();
            drop(default_store);
            default_store = make(clock.clone(), default_writer.clone())
                .await
                .map_err(|err| format!("reopening before step {index}: {err}"))?;
        }
        if let Some(now) = step.clock {
            clock.set(now);
        }
        let store = match &step.writer {
            None => default_store.clone(),
            Some(writer) => stores
                .entry(writer.clone())
                .or_insert_with(|| default_store.with_writer(writer))
                .clone(),
        };
        let context = |detail: String| format!("step {index} ({}): {detail}", step.op);
        let outcome = perform(store.as_ref(), &step.op, &step.args)
            .await
            .map_err(context)?;
        check_step(step, outcome).map_err(context)?;
    }
    Ok(())
}
