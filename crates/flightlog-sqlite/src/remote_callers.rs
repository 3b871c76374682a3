//! Which spans wait for their remote caller's span: the table that makes a traced call between
//! two services one tree whatever order the two services export in.
//!
//! A span continued from a remote caller (an OpenTelemetry span whose parent is flagged remote:
//! the SDK picked the trace up from an incoming `traceparent`) is stored under that caller when
//! the caller's span is stored in the run, else as a root (see `activity_import::stored_parent`).
//! A callee's spans end before its caller's span does, and SDKs export a span when it ends, so
//! the callee's usually arrive first: the run was two roots when the callee exported first and
//! one tree when the caller did. `activity_spans_awaiting_caller` lists each span stored as a
//! root for want of its caller, by run and caller id, with the kind it takes under the caller
//! (an agent's span is a `turn` at the root, a `subagent` below), and each span the importer
//! inserts adopts the spans that wait for it: they move under it, take their child's kind, and
//! each move is change-logged, so streams and snapshots see it.
//!
//! The writer keeps the table under its write lock, in the transaction of the write that
//! changes it; `prune` deletes a run's rows with its detail. `WriterCache::runs_awaiting_callers`
//! holds, per run, the callers its spans wait for, read at the run's first look (none, with no
//! query, for a run this transaction created): a span inserted that no span waits for costs a
//! set lookup and no statement, whether or not other spans of its run wait (a service whose
//! callers export elsewhere has such a span in every trace).

use flightlog_core::activity::{RemoteParent, StoreError};
use rusqlite::params;

use crate::activity_import::may_adopt;
use crate::activity_write::{log_change, span_id_taken};
use crate::database::WriteContext;
use crate::error::backend;

/// The span `span_key` of run `run_key` was stored as a root: when that is for want of its
/// remote caller (`remote`), it waits for it, unless the caller is stored after all (in another
/// run, or below the span itself), since a stored span id never comes again.
pub(crate) fn note_awaiting(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    span_key: i64,
    remote: Option<&RemoteParent>,
) -> Result<(), StoreError> {
    let Some(RemoteParent {
        span_id: caller_span_id,
        kind_under_it: kind_under_caller,
    }) = remote
    else {
        return Ok(());
    };
    if span_id_taken(ctx, caller_span_id)? {
        return Ok(());
    }
    ctx.statement(
        "INSERT INTO activity_spans_awaiting_caller \
         (run_key, caller_span_id, span_key, kind_under_caller) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT DO UPDATE SET kind_under_caller = excluded.kind_under_caller",
    )
    .and_then(|stmt| {
        stmt.execute(params![
            run_key,
            caller_span_id,
            span_key,
            kind_under_caller.as_str()
        ])
    })
    .map_err(backend)?;
    // Not read yet: the first look at the run reads this row with the others.
    if let Some(callers) = ctx.keys.runs_awaiting_callers.get_mut(&run_key) {
        callers.insert(caller_span_id.clone());
    }
    Ok(())
}

/// The span `caller_span_id` was just stored in run `run_key` (`new_run`: created in this
/// transaction, and this is the run's first look, before any [`note_awaiting`] in it): move the
/// roots that wait for it under it. Returns how many moved. A root that is the caller's own
/// ancestor stays a root (under the caller the two would hang from each other and the run
/// would lose its root).
pub(crate) fn adopt(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    new_run: bool,
    caller_span_id: &str,
) -> Result<usize, StoreError> {
    if !ctx.keys.runs_awaiting_callers.contains_key(&run_key) {
        let callers = if new_run {
            foldhash::HashSet::default()
        } else {
            awaited_callers(ctx, run_key)?
        };
        ctx.keys.runs_awaiting_callers.insert(run_key, callers);
    }
    let awaited = ctx
        .keys
        .runs_awaiting_callers
        .get_mut(&run_key)
        .is_some_and(|callers| callers.remove(caller_span_id));
    if !awaited {
        return Ok(0);
    }
    // Rows of spans that are no longer roots (their completed copy named a parent) are deleted
    // with the others and move nothing. The run is checked too: a flightlog before schema 12
    // still open on the file prunes spans without their rows, and span keys are reused.
    let waiting: Vec<(i64, String, String, bool)> = ctx
        .statement(
            "SELECT w.span_key, w.kind_under_caller, s.span_id, s.parent_span_id IS NULL \
             FROM activity_spans_awaiting_caller w \
             JOIN activity_spans s ON s.span_key = w.span_key AND s.run_key = w.run_key \
             WHERE w.run_key = ?1 AND w.caller_span_id = ?2",
        )
        .and_then(|stmt| {
            stmt.query_map(params![run_key, caller_span_id], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    ctx.statement(
        "DELETE FROM activity_spans_awaiting_caller WHERE run_key = ?1 AND caller_span_id = ?2",
    )
    .and_then(|stmt| stmt.execute(params![run_key, caller_span_id]))
    .map_err(backend)?;
    let mut adopted = 0;
    for (span_key, kind_under_caller, span_id, is_root) in waiting {
        if !is_root || !may_adopt(ctx, caller_span_id, &span_id, run_key)? {
            continue;
        }
        ctx.statement(
            "UPDATE activity_spans SET parent_span_id = ?2, kind = ?3 WHERE span_key = ?1",
        )
        .and_then(|stmt| stmt.execute(params![span_key, caller_span_id, kind_under_caller]))
        .map_err(backend)?;
        log_change(ctx, run_key, span_key, None)?;
        forget_rollup_from(ctx, run_key, span_key)?;
        adopted += 1;
    }
    Ok(adopted)
}

/// The span `span_key`, a root of run `run_key` until now, was moved under its caller: a rollup
/// computed from it as the run's root (its name and start) no longer describes the run. It is
/// deleted; the import rolls the run up again from its roots as they are now when one has
/// ended, so the run has the rollup it would have had if the caller had come first (none while
/// no root has ended). A digest left by `prune` stays, even one a later delivery refreshed from
/// the moved root (a pruned run written to again: rare, and the digest is all that is left of
/// the pruned detail).
pub(crate) fn forget_rollup_from(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    span_key: i64,
) -> Result<(), StoreError> {
    ctx.statement(
        "DELETE FROM activity_run_rollups WHERE run_key = ?1 AND detail_pruned = 0 \
         AND EXISTS (SELECT 1 FROM activity_spans s WHERE s.span_key = ?2 \
           AND s.started_at = activity_run_rollups.started_at \
           AND s.name = activity_run_rollups.name)",
    )
    .and_then(|stmt| stmt.execute(params![run_key, span_key]))
    .map_err(backend)?;
    Ok(())
}

/// The callers the spans of run `run_key` wait for, as its rows say.
fn awaited_callers(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
) -> Result<foldhash::HashSet<String>, StoreError> {
    ctx.statement(
        "SELECT DISTINCT caller_span_id FROM activity_spans_awaiting_caller WHERE run_key = ?1",
    )
    .and_then(|stmt| stmt.query_map([run_key], |row| row.get(0))?.collect())
    .map_err(backend)
}

/// The run's detail is being deleted (`prune`): so are its rows.
pub(crate) fn forget(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<(), StoreError> {
    ctx.statement("DELETE FROM activity_spans_awaiting_caller WHERE run_key = ?1")
        .and_then(|stmt| stmt.execute([run_key]))
        .map_err(backend)?;
    ctx.keys.runs_awaiting_callers.remove(&run_key);
    Ok(())
}
