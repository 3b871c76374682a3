//! Which runs wait for their root: the table behind the run list's third source.
//!
//! The run list shows a run from its root span (see `activity_listing`). A run can have spans and
//! no root: an OpenTelemetry SDK exports a span when it ends, so a trace's root, which ends last,
//! arrives after every other span of it, minutes or hours later for a long agent run; and a
//! trace continued from a caller that exports elsewhere names a parent that never comes here
//! (SDKs that do not flag a remote parent, see the OTLP mapping). Such a run was neither listed
//! nor live: "what is running now?" answered nothing while it ran. `activity_runs_awaiting_root`
//! holds one row per such run, keyed by run, with its earliest span's start (the list's order),
//! so the list reads them by an index as it reads roots.
//!
//! The writer keeps the table exact under its write lock, in the transaction of the write that
//! changes it: a root stored deletes the run's row, a span stored under a parent in a run with
//! no root inserts it (or moves its start earlier), an import that moved spans between parent
//! and root settles each run it touched from the stored rows, and `prune` deletes it with the
//! run's detail. [`RootState`] in the writer's cache spares the common case (a run whose root
//! was stored first, as every native client and Logfire do) any query.

use rusqlite::{params, OptionalExtension};

use flightlog_core::activity::StoreError;

use crate::database::WriteContext;
use crate::error::backend;

/// What the writer knows of a run's root (kept in `WriterCache::run_roots`, volatile: dropped
/// whenever another connection may have written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootState {
    /// The run has a root: nothing to keep.
    HasRoot,
    /// The run has no root; its row says it waits since this start.
    Awaiting { since: i64 },
}

/// A root of the run was stored (inserted, or an existing span made one). `new_run`: the run was
/// created in this transaction, so it has no row to delete.
pub(crate) fn note_root_stored(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    new_run: bool,
) -> Result<(), StoreError> {
    if ctx.keys.run_roots.get(&run_key) == Some(&RootState::HasRoot) {
        return Ok(());
    }
    if !new_run {
        delete_row(ctx, run_key)?;
    }
    ctx.keys.run_roots.insert(run_key, RootState::HasRoot);
    Ok(())
}

/// A span was stored under a parent, starting at `started_at`. `new_run` as for
/// [`note_root_stored`] (a root inserted earlier in the transaction is in the cache).
pub(crate) fn note_child_stored(
    ctx: &mut WriteContext<'_>,
    run_key: i64,
    started_at: i64,
    new_run: bool,
) -> Result<(), StoreError> {
    let known = ctx.keys.run_roots.get(&run_key).copied();
    match known {
        Some(RootState::HasRoot) => return Ok(()),
        Some(RootState::Awaiting { since }) if since <= started_at => return Ok(()),
        Some(RootState::Awaiting { .. }) => {}
        None if !new_run && has_root(ctx, run_key)? => {
            ctx.keys.run_roots.insert(run_key, RootState::HasRoot);
            return Ok(());
        }
        None => {}
    }
    let since: i64 = ctx
        .statement(
            "INSERT INTO activity_runs_awaiting_root (run_key, started_at) VALUES (?1, ?2) \
             ON CONFLICT(run_key) DO UPDATE SET started_at = MIN(started_at, excluded.started_at) \
             RETURNING started_at",
        )
        .and_then(|stmt| stmt.query_row(params![run_key, started_at], |row| row.get(0)))
        .map_err(backend)?;
    ctx.keys
        .run_roots
        .insert(run_key, RootState::Awaiting { since });
    Ok(())
}

/// Make the run's row what its stored spans say (after spans moved between a parent and the
/// root, or whenever the cache cannot tell): none when it has a root or no span, else its
/// earliest span's start.
pub(crate) fn settle(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<(), StoreError> {
    if has_root(ctx, run_key)? {
        delete_row(ctx, run_key)?;
        ctx.keys.run_roots.insert(run_key, RootState::HasRoot);
        return Ok(());
    }
    let earliest: Option<i64> = ctx
        .statement(
            "SELECT started_at FROM activity_spans WHERE run_key = ?1 \
             ORDER BY started_at LIMIT 1",
        )
        .and_then(|stmt| stmt.query_row([run_key], |row| row.get(0)).optional())
        .map_err(backend)?;
    match earliest {
        // Already so (every delivery of a long trace's children settles its run again): no write.
        Some(since) if ctx.keys.run_roots.get(&run_key) == Some(&RootState::Awaiting { since }) => {
        }
        Some(since) => {
            ctx.statement(
                "INSERT INTO activity_runs_awaiting_root (run_key, started_at) VALUES (?1, ?2) \
                 ON CONFLICT(run_key) DO UPDATE SET started_at = excluded.started_at",
            )
            .and_then(|stmt| stmt.execute(params![run_key, since]))
            .map_err(backend)?;
            ctx.keys
                .run_roots
                .insert(run_key, RootState::Awaiting { since });
        }
        None => {
            delete_row(ctx, run_key)?;
            ctx.keys.run_roots.remove(&run_key);
        }
    }
    Ok(())
}

/// The run's detail is being deleted (`prune`): so is its row.
pub(crate) fn forget(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<(), StoreError> {
    delete_row(ctx, run_key)?;
    ctx.keys.run_roots.remove(&run_key);
    Ok(())
}

fn has_root(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<bool, StoreError> {
    ctx.statement(
        "SELECT EXISTS (SELECT 1 FROM activity_spans WHERE run_key = ?1 \
         AND parent_span_id IS NULL)",
    )
    .and_then(|stmt| stmt.query_row([run_key], |row| row.get(0)))
    .map_err(backend)
}

fn delete_row(ctx: &mut WriteContext<'_>, run_key: i64) -> Result<(), StoreError> {
    ctx.statement("DELETE FROM activity_runs_awaiting_root WHERE run_key = ?1")
        .and_then(|stmt| stmt.execute([run_key]))
        .map_err(backend)?;
    Ok(())
}
