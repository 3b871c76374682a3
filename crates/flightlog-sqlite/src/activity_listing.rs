//! `list_runs`: the newest-first page of runs, from three index-ordered queries merged in Rust.
//!
//! Runs that still have detail are listed from their root span (the partial index
//! `activity_spans_roots` orders them by start; a run with several roots, as OTLP traces and
//! sessions may have, from its first one only, found through `activity_spans_roots_by_run`, so it
//! appears once and paging by cursor never meets it again), with the rollup's totals once the run
//! ended and was rolled up, else the root's own figures as they are now, with the usage a
//! rollup would give it now (`with_live_usage`: the fields the root lacks from its model spans,
//! read only for the entries a page keeps whose root lacks one, within a budget of spans read
//! per page). The first root is the
//! one the rollup is made from (the reference's rule) and the one a pruned run is listed by, so a
//! run's name, origin, outcome and totals come from one root, and its place in the order does not
//! move when `prune` deletes its detail (the newest root named it before: a successful run could
//! show the first root's failure reason, filters missed it, and paging across a prune could list
//! it twice). It is open while any root is. Runs whose detail `prune` deleted
//! exist only as a rollup row (`activity_run_rollups_pruned` orders those). Runs with spans but
//! no root (see `run_roots`) are listed open from `activity_runs_awaiting_root`, named by their
//! earliest span, with the sum of their `model` spans' usage. Each query reads at most
//! `limit + 1` rows in index order, so a page costs the same however deep it is; the three are
//! merged by `(started_at, run_id)` descending and the extra row tells whether a next page exists.
//! Runs that share one start are ordered by run id, which no index holds: a page reads the ids
//! of every run tied with its rows (about 0.7 µs each: 70 ms at 100,000 runs started at one
//! instant, `bench/tied_run_listing.py`), and computes entries only for the rows it keeps.
//! The SQL text is built from which filters are present (a handful of variants, each cached), so
//! every filter is a plain indexable predicate rather than a `?1 IS NULL OR …` that defeats the index.

use flightlog_core::activity::{
    compute_rollup, rootless_usage, RollupSpan, RunCursor, RunListEntry, RunListQuery, RunPage,
    RunState, SpanKind, SpanOrigin, SpanOutcome, StoreError,
};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Row};

use crate::activity_write::{rollup_span_from_row, usage_at};
use crate::error::backend;

/// The most runs a listing may ask for to count as short (see [`is_short`]).
const SHORT_LISTING_LIMIT: i64 = 100;

/// Whether a listing's work is bounded by its limit (an open run waiting for its root that the
/// page keeps reads its spans' ids, parents, kinds and usage: `GET /v1/activity/runs` took 31 –
/// 76 ms with one such run of 50,000 spans, release build, `bench/waiting_run_listing.py`):
/// a page of at most [`SHORT_LISTING_LIMIT`]
/// runs with no state, outcome or origin filter reads at most `limit + 1` rows of each index
/// (a filter can make a page read any number of rows that do not match), plus a count of the
/// spans of each open run listed (about 6 ms for a run of 150,000 spans). The store reads such
/// a page on the short reads' places (`SqliteDatabase::read_apart_short`).
pub(crate) fn is_short(query: &RunListQuery) -> bool {
    query.limit <= SHORT_LISTING_LIMIT
        && query.state.is_none()
        && query.outcome.is_none()
        && query.origin.is_none()
}

/// The twenty-one columns both queries select, in [`entry_from_row`]'s order: the entry and
/// its run's key.
fn entry_from_row(row: &Row<'_>) -> rusqlite::Result<(RunListEntry, i64)> {
    let origin: String = row.get(3)?;
    let outcome: Option<String> = row.get(8)?;
    let open: bool = row.get(1)?;
    let started_at: i64 = row.get(6)?;
    // An open run has not ended, whatever its first root did: a session's first turn may have
    // ended (and been rolled up) while a later one runs. Its end, outcome, duration and failure
    // are those of the rollup made once it ends; its totals stay the latest known.
    let ended_at: Option<i64> = if open { None } else { row.get(7)? };
    let rolled_up: bool = row.get(18)?;
    let entry = RunListEntry {
        run_id: row.get(0)?,
        state: if open {
            RunState::Open
        } else {
            RunState::Ended
        },
        name: row.get(2)?,
        origin: SpanOrigin::from_stored(&origin),
        session_id: row.get(4)?,
        job_name: row.get(5)?,
        started_at,
        ended_at,
        outcome: outcome
            .as_deref()
            .filter(|_| !open)
            .map(SpanOutcome::from_stored),
        // A live root's duration is computed here, saturating as the rollup's does (SQLite
        // turns an overflowing subtraction into a real number); an open run is never
        // `rolled_up` (see `LIVE`) and has no end here, so no duration.
        duration_ms: if rolled_up {
            row.get(9)?
        } else {
            ended_at.map(|ended: i64| ended.saturating_sub(started_at))
        },
        span_count: row.get(10)?,
        input_tokens: row.get(11)?,
        output_tokens: row.get(12)?,
        cache_read_tokens: row.get(13)?,
        cache_creation_tokens: row.get(14)?,
        cost_usd: row.get(15)?,
        failure_reason: if open { None } else { row.get(16)? },
        last_heartbeat_at: row.get(17)?,
        rolled_up,
        detail_pruned: row.get(19)?,
        awaiting_root: false,
        live_usage_skipped: false,
    };
    Ok((entry, row.get(20)?))
}

/// The most spans a page reads to give its live entries their usage (see [`with_live_usage`]),
/// in page order: about 0.1 s on the benchmark machine (a live run of 150,000 spans took
/// 0.17 s alone). A page of huge live sessions read them all: seconds for a dashboard's first
/// page. An entry past the budget shows its root's own figures, as all of them did before, and
/// says so (`liveUsageSkipped`).
const LIVE_USAGE_SPAN_BUDGET: i64 = 100_000;

/// The columns of `ROLLUP_SPANS_SQL` the usage rule reads, the others empty (names and
/// reasons are not read at all), in the order `rollup_span_from_row` takes.
const LIVE_USAGE_SPANS_SQL: &str = "SELECT parent_span_id IS NULL, origin, '', NULL, NULL, \
     started_at, NULL, NULL, NULL, input_tokens, output_tokens, cache_read_tokens, \
     cache_creation_tokens, cost_usd, kind, span_id, parent_span_id, call_id \
     FROM activity_spans WHERE run_key = ?1 ORDER BY started_at, span_key";

/// A live entry (its run open, or ended and not rolled up since) with its usage as the run's
/// rollup would say it now: the root's own fields, each one it lacks from the run's `model`
/// spans (and every root's, for an OTLP run of several; see `compute_rollup`). The root's
/// figures alone left a run whose tokens only its model calls report (most OpenTelemetry runs,
/// a native run until its root ends) without usage or cost until someone rolled it up, while
/// a run awaiting its root showed its model spans' sum (an audit's finding). Only an entry whose
/// root lacks a field reads the run's spans (the columns the rule needs, as a rollup does).
/// `budget` is what is left of [`LIVE_USAGE_SPAN_BUDGET`]: the run's spans are read only if
/// they fit, and then taken from it.
fn with_live_usage(
    conn: &Connection,
    mut entry: RunListEntry,
    run_key: i64,
    budget: &mut i64,
) -> Result<RunListEntry, StoreError> {
    let carries_all = entry.input_tokens.is_some()
        && entry.output_tokens.is_some()
        && entry.cache_read_tokens.is_some()
        && entry.cache_creation_tokens.is_some()
        && entry.cost_usd.is_some();
    // A live entry's span count is the run's (see `roots_sql`).
    if entry.rolled_up || carries_all {
        return Ok(entry);
    }
    if entry.span_count > *budget {
        // Said on the entry: its usage looked like the run had none (an audit's finding).
        entry.live_usage_skipped = true;
        return Ok(entry);
    }
    *budget -= entry.span_count;
    let spans: Vec<RollupSpan> = conn
        .prepare_cached(LIVE_USAGE_SPANS_SQL)
        .and_then(|mut stmt| stmt.query_map([run_key], rollup_span_from_row)?.collect())
        .map_err(backend)?;
    if let Some(rollup) = compute_rollup(&spans) {
        entry.input_tokens = rollup.input_tokens;
        entry.output_tokens = rollup.output_tokens;
        entry.cache_read_tokens = rollup.cache_read_tokens;
        entry.cache_creation_tokens = rollup.cache_creation_tokens;
        // As a stored rollup holds it: SQLite keeps no NaN (an infinite cost minus another).
        entry.cost_usd = rollup.cost_usd.filter(|cost| !cost.is_nan());
    }
    Ok(entry)
}

/// A run is open while any of its roots is: its first root, which names it, or a later one
/// (another turn of a session, the root of a trace continued from another process). The later
/// ones are looked for among the run's open spans (usually none or a few), not among all its
/// roots (a session of a thousand turns has a thousand).
const OPEN: &str = open_sql!();

/// The text of [`OPEN`], for the constants built from it.
macro_rules! open_sql {
    () => {
        "(s.outcome IS NULL OR EXISTS (SELECT 1 FROM activity_spans o \
         INDEXED BY activity_spans_open_by_run \
         WHERE o.run_key = s.run_key AND o.outcome IS NULL AND o.parent_span_id IS NULL))"
    };
}
use open_sql;

/// A root's figures are live while the run is open or not rolled up; the rollup's once it is.
/// A rollup made while the root was still open (the reference allows one at any time) holds no
/// end: the root's live figures stand until the next rollup, instead of an ended run with the
/// rollup's null duration and failure reason. A rollup of a run that is open again (its first
/// turn ended and was rolled up, the next one runs) says nothing of it now: live too, so the
/// entry is not `rolledUp`. So is a rollup whose end is not the listed root's: it was made from
/// another root (a root that started earlier arrived after the rollup), and showing its
/// duration, counts and failure beside this root's name, end and outcome mixed two roots' facts
/// (an audit's finding); the next rollup is made from this root.
const LIVE: &str = concat!(
    "(u.run_key IS NULL OR u.ended_at IS NULL OR u.ended_at IS NOT s.ended_at OR ",
    open_sql!(),
    ")"
);

/// A live entry's failure reason as the run's rollup would say it now (`compute_rollup`): the
/// reason of the first span to start that ended `error` or `timeout` with one, else (below)
/// `interrupted` for an interrupted root. The root's reason alone left a run that failed in a
/// tool call without one until someone rolled it up (an audit: 65 of 150 ended runs differed).
/// The run's spans in start order on `activity_spans_by_run`, to the first such span; not
/// read for a run whose first root is open (an open run shows no failure reason).
const FIRST_FAILURE_REASON: &str = "(SELECT f.outcome_reason FROM activity_spans f \
     INDEXED BY activity_spans_by_run \
     WHERE f.run_key = s.run_key AND f.outcome IN ('error', 'timeout') \
       AND f.outcome_reason IS NOT NULL ORDER BY f.started_at, f.span_key LIMIT 1)";

/// The newest heartbeat of the run's open roots, for a run whose first root ended while a later
/// one runs (the first root's heartbeat stopped with it).
const OPEN_ROOTS_HEARTBEAT: &str = "(SELECT MAX(COALESCE(o.last_heartbeat_at, o.started_at)) \
     FROM activity_spans o INDEXED BY activity_spans_open_by_run \
     WHERE o.run_key = s.run_key AND o.outcome IS NULL AND o.parent_span_id IS NULL)";

/// The runs with an open root, from the partial index of open roots, for the state filters: a
/// list SQLite builds once per query. (Testing [`OPEN`] on each root in start order instead
/// read every root of a database whose open runs are few and old: 0.24 s at 200,000 runs, and
/// `IN` without the index hint scanned every root too; with it, 0.01 s.)
const OPEN_RUNS: &str = "(SELECT o.run_key FROM activity_spans o \
     INDEXED BY activity_spans_open_roots WHERE o.parent_span_id IS NULL AND o.outcome IS NULL)";

/// A page's entries read from their runs' first roots (see [`page_roots_sql`]).
fn roots_sql(query: &RunListQuery) -> String {
    let page = page_roots_sql(query);
    format!(
        "SELECT r.run_id, {OPEN}, s.name, s.origin, s.session_id, s.job_name, \
         s.started_at, s.ended_at, s.outcome, \
         CASE WHEN {LIVE} THEN NULL ELSE u.duration_ms END, \
         CASE WHEN {LIVE} THEN (SELECT COUNT(*) FROM activity_spans c WHERE c.run_key = s.run_key) \
           ELSE u.span_count END, \
         CASE WHEN {LIVE} THEN s.input_tokens ELSE u.input_tokens END, \
         CASE WHEN {LIVE} THEN s.output_tokens ELSE u.output_tokens END, \
         CASE WHEN {LIVE} THEN s.cache_read_tokens ELSE u.cache_read_tokens END, \
         CASE WHEN {LIVE} THEN s.cache_creation_tokens ELSE u.cache_creation_tokens END, \
         CASE WHEN {LIVE} THEN s.cost_usd ELSE u.cost_usd END, \
         CASE WHEN NOT {LIVE} THEN u.failure_reason WHEN s.outcome IS NULL THEN NULL \
           ELSE COALESCE({FIRST_FAILURE_REASON}, \
           CASE WHEN s.outcome = 'interrupted' THEN 'interrupted' END) END, \
         CASE WHEN s.outcome IS NULL THEN s.last_heartbeat_at \
           ELSE COALESCE({OPEN_ROOTS_HEARTBEAT}, s.last_heartbeat_at) END, NOT {LIVE}, \
         COALESCE(u.detail_pruned, 0), s.run_key \
         FROM ({page}) p JOIN activity_spans s ON s.span_key = p.span_key \
         JOIN activity_runs r ON r.run_key = s.run_key \
         LEFT JOIN activity_run_rollups u ON u.run_key = s.run_key \
         ORDER BY s.started_at DESC, r.run_id DESC"
    )
}

/// The first roots of the page's runs, in the listing's order: which rows a page keeps is
/// decided from the index and the run ids alone, and [`roots_sql`] computes the entries of
/// those `limit + 1` only. (Computed for every row before the sort, as one query did, the
/// entries of runs sharing one start cost ~3.8 µs each: 380 ms a page at 100,000 runs started
/// at one instant, as a test suite on a manual clock records them; 70 – 86 ms this way.)
fn page_roots_sql(query: &RunListQuery) -> String {
    let mut sql = String::from(
        "SELECT s.span_key FROM activity_spans s JOIN activity_runs r ON r.run_key = s.run_key \
         WHERE s.parent_span_id IS NULL \
         AND s.span_key = (SELECT n.span_key FROM activity_spans n WHERE n.run_key = s.run_key \
           AND n.parent_span_id IS NULL ORDER BY n.started_at, n.span_key LIMIT 1)",
    );
    match query.state {
        Some(RunState::Open) => sql.push_str(&format!(" AND s.run_key IN {OPEN_RUNS}")),
        Some(RunState::Ended) => sql.push_str(&format!(" AND s.run_key NOT IN {OPEN_RUNS}")),
        None => {}
    }
    if query.outcome.is_some() && query.state != Some(RunState::Ended) {
        // An open run has no outcome yet (see `entry_from_row`), whatever its first root's.
        sql.push_str(&format!(" AND s.run_key NOT IN {OPEN_RUNS}"));
    }
    push_filters(&mut sql, query, "s");
    sql
}

/// The rollups of pruned runs that hold no spans again (a run written to after its prune is
/// listed from its new detail, a root or its earliest span), through their own index by start (`INDEXED BY`: without
/// statistics SQLite chose the prune index on `(detail_pruned, ended_at)` and sorted every pruned
/// rollup for each page, 100 ms a page at 100,000 pruned runs).
fn pruned_sql(query: &RunListQuery) -> String {
    let mut sql = String::from(
        "SELECT r.run_id, 0, u.name, u.origin, u.session_id, u.job_name, u.started_at, \
         u.ended_at, u.outcome, u.duration_ms, u.span_count, u.input_tokens, u.output_tokens, \
         u.cache_read_tokens, u.cache_creation_tokens, u.cost_usd, u.failure_reason, NULL, 1, 1, \
         u.run_key \
         FROM activity_run_rollups u INDEXED BY activity_run_rollups_pruned \
         JOIN activity_runs r ON r.run_key = u.run_key \
         WHERE u.detail_pruned = 1 AND NOT EXISTS (SELECT 1 FROM activity_spans s \
           WHERE s.run_key = u.run_key AND s.parent_span_id IS NULL) \
         AND NOT EXISTS (SELECT 1 FROM activity_runs_awaiting_root w \
           WHERE w.run_key = u.run_key)",
    );
    push_filters(&mut sql, query, "u");
    sql
}

/// Whether a run waiting for its root has ended: it was rolled up with an end (a native writer
/// closed it: `cascade_close`, a sweep, a rollup after its spans ended) and none of its spans is
/// open. Otherwise it is open: its root, which would say it ended, has not come. A pruned run's
/// rollup (`detail_pruned = 1`) of a run that holds spans again says how its earlier life
/// ended, not this one: such a run was listed ended with the old figures (an audit); it is
/// ended once rolled up again (`2`).
const AWAITING_ENDED: &str = "(u.ended_at IS NOT NULL AND u.detail_pruned <> 1 AND NOT EXISTS \
     (SELECT 1 FROM activity_spans o WHERE o.run_key = w.run_key AND o.outcome IS NULL))";

/// The runs waiting for their root (see `run_roots`), by their earliest span's start: id, key,
/// start and whether it ended ([`AWAITING_ENDED`]); [`awaiting_entry`] builds the entries of
/// those a page keeps. Its origin is its earliest span's; its outcome its rollup's, once ended.
fn awaiting_sql(query: &RunListQuery) -> String {
    let mut sql = format!(
        "SELECT r.run_id, w.run_key, w.started_at, {AWAITING_ENDED}, COALESCE(u.detail_pruned, 0) \
         FROM activity_runs_awaiting_root w \
         INDEXED BY activity_runs_awaiting_root_by_start \
         JOIN activity_runs r ON r.run_key = w.run_key \
         LEFT JOIN activity_run_rollups u ON u.run_key = w.run_key WHERE 1"
    );
    match query.state {
        Some(RunState::Open) => sql.push_str(&format!(" AND NOT {AWAITING_ENDED}")),
        Some(RunState::Ended) => sql.push_str(&format!(" AND {AWAITING_ENDED}")),
        None => {}
    }
    if query.outcome.is_some() {
        sql.push_str(&format!(" AND {AWAITING_ENDED} AND u.outcome = ?"));
    }
    if query.origin.is_some() {
        sql.push_str(
            " AND (SELECT n.origin FROM activity_spans n WHERE n.run_key = w.run_key \
             ORDER BY n.started_at, n.span_key LIMIT 1) = ?",
        );
    }
    if query.before.is_some() {
        sql.push_str(" AND w.started_at <= ? AND (w.started_at < ? OR r.run_id < ?)");
    }
    sql.push_str(" ORDER BY w.started_at DESC, r.run_id DESC LIMIT ?");
    sql
}

/// A run waiting for its root, as the page's merge sees it before its entry is built.
struct AwaitingRun {
    run_id: String,
    run_key: i64,
    started_at: i64,
    ended: bool,
    /// Its rollup row says detail of it was pruned (it was written to again after a prune).
    detail_pruned: bool,
}

fn awaiting_runs(
    conn: &Connection,
    query: &RunListQuery,
    limit: i64,
) -> Result<Vec<AwaitingRun>, StoreError> {
    conn.prepare_cached(&awaiting_sql(query))
        .and_then(|mut stmt| {
            stmt.query_map(params_from_iter(parameters(query, limit)), |row| {
                Ok(AwaitingRun {
                    run_id: row.get(0)?,
                    run_key: row.get(1)?,
                    started_at: row.get(2)?,
                    ended: row.get(3)?,
                    detail_pruned: row.get(4)?,
                })
            })?
            .collect()
        })
        .map_err(backend)
}

/// The entry of a run waiting for its root: named and placed by its earliest span; open with
/// its `model` spans' usage so far, or, once ended ([`AWAITING_ENDED`]), with its rollup's end,
/// outcome and totals. Only the columns each part needs are read.
fn awaiting_entry(conn: &Connection, run: AwaitingRun) -> Result<RunListEntry, StoreError> {
    let corrupt = |run_id: &str| {
        StoreError::Corrupt(format!(
            "run {run_id:?} is listed as waiting for its root but holds no span"
        ))
    };
    let earliest = conn
        .prepare_cached(
            "SELECT name, origin, session_id, job_name FROM activity_spans \
             WHERE run_key = ?1 ORDER BY started_at, span_key LIMIT 1",
        )
        .and_then(|mut stmt| {
            stmt.query_row([run.run_key], |row| {
                let origin: String = row.get(1)?;
                Ok((
                    row.get::<_, String>(0)?,
                    SpanOrigin::from_stored(&origin),
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<String>>(3)?,
                ))
            })
            .optional()
        })
        .map_err(backend)?
        .ok_or_else(|| corrupt(&run.run_id))?;
    let (name, origin, session_id, job_name) = earliest;
    let mut entry = RunListEntry {
        run_id: run.run_id,
        state: RunState::Open,
        name,
        origin,
        session_id,
        job_name,
        started_at: run.started_at,
        ended_at: None,
        outcome: None,
        duration_ms: None,
        span_count: 0,
        input_tokens: None,
        output_tokens: None,
        cache_read_tokens: None,
        cache_creation_tokens: None,
        cost_usd: None,
        failure_reason: None,
        last_heartbeat_at: None,
        rolled_up: false,
        detail_pruned: run.detail_pruned,
        awaiting_root: true,
        live_usage_skipped: false,
    };
    if run.ended {
        conn.prepare_cached(
            "SELECT ended_at, outcome, duration_ms, span_count, input_tokens, output_tokens, \
             cache_read_tokens, cache_creation_tokens, cost_usd, failure_reason \
             FROM activity_run_rollups WHERE run_key = ?1",
        )
        .and_then(|mut stmt| {
            stmt.query_row([run.run_key], |row| {
                let outcome: Option<String> = row.get(1)?;
                entry.ended_at = row.get(0)?;
                entry.outcome = outcome.as_deref().map(SpanOutcome::from_stored);
                entry.duration_ms = row.get(2)?;
                entry.span_count = row.get(3)?;
                entry.input_tokens = row.get(4)?;
                entry.output_tokens = row.get(5)?;
                entry.cache_read_tokens = row.get(6)?;
                entry.cache_creation_tokens = row.get(7)?;
                entry.cost_usd = row.get(8)?;
                entry.failure_reason = row.get(9)?;
                Ok(())
            })
        })
        .map_err(backend)?;
        entry.state = RunState::Ended;
        entry.rolled_up = true;
        return Ok(entry);
    }
    // The usage rule needs each span's place in the tree (a model span below another one that
    // reports usage is not counted twice), so every span's id, parent, kind and usage.
    let spans: Vec<RollupSpan> = conn
        .prepare_cached(
            "SELECT span_id, parent_span_id, kind, input_tokens, output_tokens, \
             cache_read_tokens, cache_creation_tokens, cost_usd, call_id FROM activity_spans \
             WHERE run_key = ?1 ORDER BY started_at, span_key",
        )
        .and_then(|mut stmt| {
            stmt.query_map([run.run_key], |row| {
                let kind: String = row.get(2)?;
                Ok(RollupSpan {
                    span_id: row.get(0)?,
                    parent_span_id: row.get(1)?,
                    is_root: false,
                    kind: SpanKind::from_stored(&kind),
                    origin: SpanOrigin::Otlp,
                    name: String::new(),
                    session_id: None,
                    job_name: None,
                    started_at: 0,
                    ended_at: None,
                    outcome: None,
                    outcome_reason: None,
                    usage: usage_at(row, 3)?,
                    call_id: row.get(8)?,
                })
            })?
            .collect()
        })
        .map_err(backend)?;
    if spans.is_empty() {
        return Err(corrupt(&entry.run_id));
    }
    let usage = rootless_usage(&spans);
    entry.span_count = i64::try_from(spans.len()).unwrap_or(i64::MAX);
    entry.input_tokens = usage.input_tokens;
    entry.output_tokens = usage.output_tokens;
    entry.cache_read_tokens = usage.cache_read_tokens;
    entry.cache_creation_tokens = usage.cache_creation_tokens;
    entry.cost_usd = usage.cost_usd;
    Ok(entry)
}

/// One run of a page being merged: an entry already read, or a run waiting for its root whose
/// entry is built only if the page keeps it. (At most `2 × limit + 2` of them live for a
/// moment: boxing the entries would only add an allocation each.)
#[allow(clippy::large_enum_variant)]
enum Listed {
    Entry(RunListEntry),
    /// An entry read from its run's first root, with the run's key: its usage is completed
    /// (see [`with_live_usage`]) only if the page keeps it.
    Rooted(RunListEntry, i64),
    Awaiting(AwaitingRun),
}

impl Listed {
    fn order_key(&self) -> (i64, &str) {
        match self {
            Listed::Entry(entry) | Listed::Rooted(entry, _) => (entry.started_at, &entry.run_id),
            Listed::Awaiting(run) => (run.started_at, &run.run_id),
        }
    }
}

/// The outcome, origin and cursor predicates and the order, on table alias `table`; the
/// parameters are bound in this order by [`parameters`].
fn push_filters(sql: &mut String, query: &RunListQuery, table: &str) {
    if query.outcome.is_some() {
        sql.push_str(&format!(" AND {table}.outcome = ?"));
    }
    if query.origin.is_some() {
        sql.push_str(&format!(" AND {table}.origin = ?"));
    }
    if query.before.is_some() {
        // The same rows as `started_at < ? OR (started_at = ? AND run_id < ?)`, written so that
        // the first term bounds a range of the `started_at` index: with the disjunction alone
        // SQLite read the index from the newest root down to the cursor, so a deep page cost
        // time in proportion to its depth (336 – 452 ms at 340,000 runs).
        sql.push_str(&format!(
            " AND {table}.started_at <= ? AND ({table}.started_at < ? OR r.run_id < ?)"
        ));
    }
    sql.push_str(&format!(
        " ORDER BY {table}.started_at DESC, r.run_id DESC LIMIT ?"
    ));
}

fn parameters(query: &RunListQuery, limit: i64) -> Vec<SqlValue> {
    let mut values = Vec::new();
    if let Some(outcome) = &query.outcome {
        values.push(SqlValue::Text(outcome.as_str().to_owned()));
    }
    if let Some(origin) = &query.origin {
        values.push(SqlValue::Text(origin.as_str().to_owned()));
    }
    if let Some(RunCursor { started_at, run_id }) = &query.before {
        values.push(SqlValue::Integer(*started_at));
        values.push(SqlValue::Integer(*started_at));
        values.push(SqlValue::Text(run_id.clone()));
    }
    values.push(SqlValue::Integer(limit));
    values
}

fn run_query(
    conn: &Connection,
    sql: &str,
    query: &RunListQuery,
    limit: i64,
) -> Result<Vec<(RunListEntry, i64)>, StoreError> {
    conn.prepare_cached(sql)
        .and_then(|mut stmt| {
            stmt.query_map(params_from_iter(parameters(query, limit)), entry_from_row)?
                .collect()
        })
        .map_err(backend)
}

/// One page of runs per [`RunListQuery`] (read inside the caller's read transaction).
pub(crate) fn list_runs(conn: &Connection, query: &RunListQuery) -> Result<RunPage, StoreError> {
    let limit = query.limit.max(0);
    if limit == 0 {
        return Ok(RunPage {
            runs: Vec::new(),
            next: None,
        });
    }
    let fetch = limit.saturating_add(1);
    let mut runs: Vec<Listed> = run_query(conn, &roots_sql(query), query, fetch)?
        .into_iter()
        .map(|(entry, run_key)| Listed::Rooted(entry, run_key))
        .collect();
    if query.state != Some(RunState::Open) {
        runs.extend(
            run_query(conn, &pruned_sql(query), query, fetch)?
                .into_iter()
                .map(|(entry, _)| Listed::Entry(entry)),
        );
    }
    runs.extend(
        awaiting_runs(conn, query, fetch)?
            .into_iter()
            .map(Listed::Awaiting),
    );
    runs.sort_by(|a, b| b.order_key().cmp(&a.order_key()));
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = runs.len() > limit;
    runs.truncate(limit);
    let mut live_usage_budget = LIVE_USAGE_SPAN_BUDGET;
    let runs = runs
        .into_iter()
        .map(|listed| match listed {
            Listed::Entry(entry) => Ok(entry),
            Listed::Rooted(entry, run_key) => {
                with_live_usage(conn, entry, run_key, &mut live_usage_budget)
            }
            Listed::Awaiting(run) => awaiting_entry(conn, run),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let next = if more {
        runs.last().map(|last| {
            RunCursor {
                started_at: last.started_at,
                run_id: last.run_id.clone(),
            }
            .encode()
        })
    } else {
        None
    };
    Ok(RunPage { runs, next })
}
