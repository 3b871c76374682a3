//! The reference engagement-journal workload, measured on both journal backends, so the journal's
//! performance targets are checked by a command rather than by belief.
//!
//! Workload: E engagements (default 1,000) of 60 events each, in the reference's realistic mix:
//! `engagement_opened` (initiator, venue), then rounds of a `mail_sent` ask, `mail_delivered`,
//! `turn_started`, `tool_called`, `budget_charged`, `board_written` (notes, todos, artifacts in
//! turn), a `mail_sent` result with its `causationId`, `turn_finished` and `venue_projected`, and
//! finally `engagement_closed` with a status. Events are appended interleaved across engagements
//! (the next event of every engagement in turn), as many live engagements would produce them.
//!
//! Measured (targets in brackets):
//! - in memory: appends/s from one task [>= 1,000,000/s] and from a few concurrent tasks owning
//!   different engagements; `summarize` of a 60-event engagement, p50/p99 [p50 <= 44 us];
//!   `compact` per engagement, p50/p99;
//! - SQLite (durability normal, fresh temp file): appends/s from 64 concurrent tasks each owning
//!   engagements (the writer commits in groups) [>= 100,000/s] and from one sequential task;
//!   `summarize` of a 1,000-event engagement read from the file, p50/p99 [p50 < 2 ms].
//!
//! The append inputs (validated `AppendInput`s holding their `serde_json` data) are built before
//! any clock starts, so the append figures time the journal call alone: for the in-memory journal
//! the shard lock, the event's `Arc`s and the push; for SQLite also the data's JSON encoding on the
//! caller, the queue to the writer thread, the inserts and the group commit. One line also times
//! `append_json` from pre-built `serde_json::Value`s, i.e. with validation.
//!
//! Run: `cargo bench -p flightlog-sqlite --bench journal_workload -- [--engagements E]
//! [--repeat R] [--sqlite-tasks T] [--only-memory | --only-sqlite]` (unknown arguments, such as
//! cargo's `--bench`, are ignored).

/// The allocator the `flightlog` binary ships with, so the figures are the product's.
#[global_allocator]
static GLOBAL: flightlog_alloc::Mimalloc = flightlog_alloc::Mimalloc;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::journal::{
    AppendInput, EngagementJournal, InMemoryEngagementJournal, JsonObject, RetentionConfig,
};
use flightlog_sqlite::{Durability, SqliteConfig, SqliteDatabase, SqliteEngagementJournal};
use serde_json::{json, Value};
use tokio::runtime::{Builder, Runtime};

/// Events per engagement in the reference workload.
const EVENTS_PER_ENGAGEMENT: usize = 60;
/// Events in the engagement whose summary is read from disk.
const LONG_ENGAGEMENT_EVENTS: usize = 1_000;
/// Concurrent in-memory appenders.
const MEMORY_TASKS: usize = 4;
/// When the workload starts, epoch ms.
const START_AT: i64 = 1_750_000_000_000;

const AGENTS: [&str; 4] = ["planner", "coder", "reviewer", "researcher"];
const TOOLS: [&str; 4] = ["bash", "read_file", "edit_file", "grep"];

struct Options {
    engagements: usize,
    repeat: usize,
    sqlite_tasks: usize,
    /// Run only the in-memory or only the SQLite part (for profiling one of them).
    memory: bool,
    sqlite: bool,
}

fn parse_options() -> Options {
    let mut options = Options {
        engagements: 1_000,
        repeat: 5,
        sqlite_tasks: 64,
        memory: true,
        sqlite: true,
    };
    let args: Vec<String> = std::env::args().collect();
    for (index, arg) in args.iter().enumerate() {
        let value = args.get(index + 1).and_then(|v| v.parse::<usize>().ok());
        match (arg.as_str(), value) {
            ("--engagements", Some(v)) => options.engagements = v.max(MEMORY_TASKS),
            ("--repeat", Some(v)) => options.repeat = v.max(1),
            ("--sqlite-tasks", Some(v)) => options.sqlite_tasks = v.max(1),
            ("--only-memory", _) => options.sqlite = false,
            ("--only-sqlite", _) => options.memory = false,
            // cargo bench passes `--bench`; anything unknown is ignored.
            _ => {}
        }
    }
    options
}

fn engagement_id(engagement: usize) -> String {
    format!("eng-{engagement:06}-7f3a9c1e")
}

/// Event `index` of an engagement of `total` events: its type and data.
fn event(engagement: usize, index: usize, total: usize) -> (&'static str, Value) {
    if index == 0 {
        return (
            "engagement_opened",
            json!({
                "initiator": {"kind": "human", "id": format!("user-{}", engagement % 97),
                              "trust": "group_member"},
                "venue": {"kind": "chat", "id": format!("chat-{}", engagement % 31)},
                "entry": AGENTS[0],
                "goal": "Fix the failing planner tests and summarise the change for the team",
            }),
        );
    }
    if index == total - 1 {
        return (
            "engagement_closed",
            json!({
                "status": "completed",
                "reason": "all asks answered",
                "budget": {"spent": {"modelCalls": total / 5, "tokens": 1_500 * total / 10}},
            }),
        );
    }
    let round = (index - 1) / 10;
    let agent = AGENTS[1 + (engagement + round) % 3];
    let ask = format!("mail-{engagement}-{round}-ask");
    match (index - 1) % 10 {
        0 => (
            "mail_sent",
            json!({"mailId": ask, "kind": "ask", "from": AGENTS[0], "to": agent,
                   "subject": format!("Step {round}: run the planner tests and fix what fails")}),
        ),
        1 => ("mail_delivered", json!({"mailId": ask, "actor": agent})),
        2 => (
            "turn_started",
            json!({"actor": agent, "mails": [ask], "model": "claude-sonnet-4"}),
        ),
        3 => (
            "tool_called",
            json!({"actor": agent, "tool": TOOLS[round % TOOLS.len()],
                   "input": {"command": format!("cargo test -p agent-core planner::case_{round}"),
                             "cwd": "/home/agent/work"}}),
        ),
        4 => (
            "budget_charged",
            json!({"actor": agent, "usage": {"modelCalls": 1, "tokens": 1_200 + round,
                                             "wallMs": 850, "sideEffects": 0}}),
        ),
        5 => {
            let (key, kind) = match round % 3 {
                0 => (format!("note-{round}"), "note"),
                1 => (format!("todo-{round}"), "todo"),
                _ => (format!("artifact-{round}"), "artifact"),
            };
            (
                "board_written",
                json!({"key": key, "kind": kind, "actor": agent, "status": "in_progress",
                       "content": format!("Round {round}: planner case {round} fails on an \
                                           off-by-one in the step budget; fix drafted")}),
            )
        }
        6 => (
            "mail_sent",
            json!({"mailId": format!("mail-{engagement}-{round}-result"), "kind": "result",
                   "from": agent, "to": AGENTS[0], "causationId": ask,
                   "subject": "Tests pass after the fix"}),
        ),
        7 => (
            "turn_finished",
            json!({"actor": agent, "mails": [ask], "status": "completed"}),
        ),
        8 => (
            "venue_projected",
            json!({"venue": {"kind": "chat", "id": format!("chat-{}", engagement % 31)},
                   "actor": AGENTS[0], "mailId": format!("mail-{engagement}-{round}-result"),
                   "mode": if round.is_multiple_of(2) { "summary" } else { "visible" }}),
        ),
        _ => (
            "tool_called",
            json!({"actor": agent, "tool": "read_file",
                   "input": {"path": format!("src/planner/case_{round}.rs")}}),
        ),
    }
}

fn data_object(data: Value) -> JsonObject {
    match data {
        Value::Object(data) => data,
        other => panic!("event data must be an object: {other}"),
    }
}

/// One engagement's append inputs, in order.
fn engagement_inputs(engagement: usize, total: usize) -> Vec<AppendInput> {
    let id = engagement_id(engagement);
    (0..total)
        .map(|index| {
            let (event_type, data) = event(engagement, index, total);
            let at = START_AT + (engagement as i64) * 7 + (index as i64) * 1_000;
            AppendInput::new(id.clone(), at, event_type, data_object(data))
                .expect("workload inputs are valid")
        })
        .collect()
}

/// Every engagement's inputs, interleaved: event 0 of each engagement, then event 1, …
fn interleaved(engagements: &[usize]) -> Vec<AppendInput> {
    let mut per_engagement: Vec<std::vec::IntoIter<AppendInput>> = engagements
        .iter()
        .map(|&engagement| engagement_inputs(engagement, EVENTS_PER_ENGAGEMENT).into_iter())
        .collect();
    let mut out = Vec::with_capacity(engagements.len() * EVENTS_PER_ENGAGEMENT);
    for _ in 0..EVENTS_PER_ENGAGEMENT {
        for inputs in &mut per_engagement {
            out.extend(inputs.next());
        }
    }
    out
}

/// The same workload as raw `serde_json` values, for `append_json`.
fn interleaved_json(engagements: usize) -> Vec<Value> {
    let mut out = Vec::with_capacity(engagements * EVENTS_PER_ENGAGEMENT);
    for index in 0..EVENTS_PER_ENGAGEMENT {
        for engagement in 0..engagements {
            let (event_type, data) = event(engagement, index, EVENTS_PER_ENGAGEMENT);
            let at = START_AT + (engagement as i64) * 7 + (index as i64) * 1_000;
            out.push(json!({"engagementId": engagement_id(engagement), "at": at,
                            "type": event_type, "data": data}));
        }
    }
    out
}

/// Engagements `0..engagements` split round-robin among `tasks` owners.
fn owned_by(task: usize, tasks: usize, engagements: usize) -> Vec<usize> {
    (task..engagements).step_by(tasks).collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "MET"
    } else {
        "MISSED"
    }
}

/// Rates of several runs: the best first, then every run in order (the spread).
fn rates_line(rates: &[f64]) -> String {
    let best = rates.iter().copied().fold(0.0, f64::max);
    let all: Vec<String> = rates.iter().map(|rate| format!("{rate:.0}")).collect();
    format!("best {best:.0}/s (runs: {})", all.join(", "))
}

fn current_thread() -> Runtime {
    Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn multi_thread(workers: usize) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// One task appends everything; returns appends/s and the filled journal.
fn memory_single_task(
    runtime: &Runtime,
    engagements: usize,
) -> (f64, Arc<InMemoryEngagementJournal>) {
    let all: Vec<usize> = (0..engagements).collect();
    let inputs = interleaved(&all);
    let count = inputs.len();
    let journal = Arc::new(InMemoryEngagementJournal::new(RetentionConfig::default()));
    let elapsed = runtime.block_on(async {
        let started = Instant::now();
        for input in inputs {
            journal.append(input).await.expect("append");
        }
        started.elapsed()
    });
    (count as f64 / elapsed.as_secs_f64(), journal)
}

/// `tasks` tasks on `runtime`, each appending its own engagements' events.
fn memory_concurrent(runtime: &Runtime, engagements: usize, tasks: usize) -> f64 {
    let journal = Arc::new(InMemoryEngagementJournal::new(RetentionConfig::default()));
    let per_task: Vec<Vec<AppendInput>> = (0..tasks)
        .map(|task| interleaved(&owned_by(task, tasks, engagements)))
        .collect();
    let count: usize = per_task.iter().map(Vec::len).sum();
    let elapsed = runtime.block_on(async {
        // Spawned only once every input is built; the clock starts just before.
        let started = Instant::now();
        let handles: Vec<_> = per_task
            .into_iter()
            .map(|inputs| {
                let journal = journal.clone();
                tokio::spawn(async move {
                    for input in inputs {
                        journal.append(input).await.expect("append");
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("appender task");
        }
        started.elapsed()
    });
    count as f64 / elapsed.as_secs_f64()
}

fn memory_append_json(runtime: &Runtime, engagements: usize) -> f64 {
    let raws = interleaved_json(engagements);
    let count = raws.len();
    let journal = InMemoryEngagementJournal::new(RetentionConfig::default());
    let elapsed = runtime.block_on(async {
        let started = Instant::now();
        for raw in raws {
            journal.append_json(raw).await.expect("append");
        }
        started.elapsed()
    });
    count as f64 / elapsed.as_secs_f64()
}

/// A fresh SQLite journal (durability normal) in `dir`.
fn open_sqlite(dir: &std::path::Path, name: &str) -> SqliteEngagementJournal {
    let mut config = SqliteConfig::new(dir.join(name));
    config.durability = Durability::Normal;
    let db = SqliteDatabase::open(config).expect("open database");
    SqliteEngagementJournal::new(db, RetentionConfig::default())
}

struct SqliteAppends {
    rate: f64,
    p50: Duration,
    p99: Duration,
    groups: u64,
    wal_frames: u64,
    rewinds: u64,
    rewind: Duration,
    writes: u64,
    apply: Duration,
    commit: Duration,
    /// Sizes of the database file and of its WAL right after the last append.
    db_bytes: u64,
    wal_bytes: u64,
}

/// `tasks` tasks on `runtime`, each appending its own engagements' events to a fresh file.
fn sqlite_appends(
    runtime: &Runtime,
    dir: &std::path::Path,
    name: &str,
    engagements: usize,
    tasks: usize,
) -> SqliteAppends {
    let journal = Arc::new(open_sqlite(dir, name));
    let per_task: Vec<Vec<AppendInput>> = (0..tasks)
        .map(|task| interleaved(&owned_by(task, tasks, engagements)))
        .collect();
    let count: usize = per_task.iter().map(Vec::len).sum();
    let (elapsed, mut latencies) = runtime.block_on(async {
        let started = Instant::now();
        let handles: Vec<_> = per_task
            .into_iter()
            .map(|inputs| {
                let journal = journal.clone();
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(inputs.len());
                    for input in inputs {
                        let call = Instant::now();
                        journal.append(input).await.expect("append");
                        latencies.push(call.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let mut latencies = Vec::with_capacity(count);
        for handle in handles {
            latencies.extend(handle.await.expect("appender task"));
        }
        (started.elapsed(), latencies)
    });
    latencies.sort_unstable();
    let file_bytes = |path: std::path::PathBuf| std::fs::metadata(path).map_or(0, |m| m.len());
    let stats = journal.database().writer_stats();
    SqliteAppends {
        rate: count as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        groups: stats.groups.load(Relaxed),
        wal_frames: stats.wal_frames.load(Relaxed),
        rewinds: stats.writer_rewinds.load(Relaxed),
        rewind: Duration::from_nanos(stats.writer_rewind_nanos.load(Relaxed)),
        writes: stats.writes.load(Relaxed),
        apply: Duration::from_nanos(stats.apply_nanos.load(Relaxed)),
        commit: Duration::from_nanos(stats.commit_nanos.load(Relaxed)),
        db_bytes: file_bytes(dir.join(name)),
        wal_bytes: file_bytes(dir.join(format!("{name}-wal"))),
    }
}

fn print_sqlite_appends(label: &str, runs: &[SqliteAppends], target: Option<f64>) {
    let rates: Vec<f64> = runs.iter().map(|run| run.rate).collect();
    let Some(best) = runs.iter().max_by(|a, b| a.rate.total_cmp(&b.rate)) else {
        return;
    };
    let target = target.map_or(String::new(), |target| {
        format!(
            "  [target >= {target:.0}/s: {}]",
            verdict(best.rate >= target)
        )
    });
    println!("{label}: {}{target}", rates_line(&rates));
    println!(
        "    best run: per call p50 {:.1} us, p99 {:.1} us; writer: {} transactions, {:.1} \
         writes each, {:.1} WAL pages each, apply {:.3} s, begin+commit {:.3} s, {} WAL rewinds \
         {:.3} s; file {:.1} MB, WAL {:.1} MB",
        micros(best.p50),
        micros(best.p99),
        best.groups,
        best.writes as f64 / best.groups.max(1) as f64,
        best.wal_frames as f64 / best.groups.max(1) as f64,
        best.apply.as_secs_f64(),
        best.commit.as_secs_f64(),
        best.rewinds,
        best.rewind.as_secs_f64(),
        best.db_bytes as f64 / 1e6,
        best.wal_bytes as f64 / 1e6,
    );
}

fn main() {
    let options = parse_options();
    let engagements = options.engagements;
    let appends = engagements * EVENTS_PER_ENGAGEMENT;
    println!(
        "journal workload: {engagements} engagements x {EVENTS_PER_ENGAGEMENT} events = \
         {appends} appends, interleaved across engagements; each rate is the best of {} runs \
         (all runs listed)",
        options.repeat
    );
    println!(
        "timed: journal.append(AppendInput) only; inputs (validated, serde_json data) are built \
         before the clock starts"
    );

    let single = current_thread();
    let workers = multi_thread(2);
    if options.memory {
        memory_part(&options, &single, &workers);
    }
    if options.sqlite {
        sqlite_part(&options, &single, &workers);
    }
}

fn memory_part(options: &Options, single: &Runtime, workers: &Runtime) {
    let engagements = options.engagements;
    let mut rates = Vec::new();
    let mut filled = None;
    for _ in 0..options.repeat {
        let (rate, journal) = memory_single_task(single, engagements);
        rates.push(rate);
        filled = Some(journal);
    }
    let best = rates.iter().copied().fold(0.0, f64::max);
    println!(
        "in-memory append, 1 task: {}  [target >= 1000000/s: {}]",
        rates_line(&rates),
        verdict(best >= 1_000_000.0)
    );

    let rates: Vec<f64> = (0..options.repeat)
        .map(|_| memory_concurrent(workers, engagements, MEMORY_TASKS))
        .collect();
    println!(
        "in-memory append, {MEMORY_TASKS} tasks on 2 worker threads: {}",
        rates_line(&rates)
    );

    let rates: Vec<f64> = (0..options.repeat)
        .map(|_| memory_append_json(single, engagements))
        .collect();
    println!(
        "in-memory append_json (validation included, Value pre-built), 1 task: {}",
        rates_line(&rates)
    );

    let journal = filled.expect("at least one run");
    let mut times = Vec::with_capacity(engagements * 5);
    single.block_on(async {
        for _ in 0..5 {
            for engagement in 0..engagements {
                let id = engagement_id(engagement);
                let started = Instant::now();
                let summary = journal.summarize(&id).await.expect("summarize");
                times.push(started.elapsed());
                assert!(summary.is_some_and(|summary| summary.hops.len() == 12));
            }
        }
    });
    times.sort_unstable();
    let p50 = percentile(&times, 0.5);
    println!(
        "in-memory summarize, 60-event engagement, each of the {engagements} in turn ({} calls): \
         p50 {:.1} us, p99 {:.1} us  \
         [target p50 <= 44 us: {}]",
        times.len(),
        micros(p50),
        micros(percentile(&times, 0.99)),
        verdict(p50 <= Duration::from_micros(44))
    );

    // The same engagement again and again: its events stay in the CPU caches.
    let mut times = Vec::with_capacity(5_000);
    single.block_on(async {
        let id = engagement_id(engagements / 2);
        for _ in 0..5_000 {
            let started = Instant::now();
            let summary = journal.summarize(&id).await.expect("summarize");
            times.push(started.elapsed());
            assert!(summary.is_some());
        }
    });
    times.sort_unstable();
    println!(
        "in-memory summarize, one 60-event engagement repeated (cache-warm, {} calls): p50 {:.1} \
         us, p99 {:.1} us",
        times.len(),
        micros(percentile(&times, 0.5)),
        micros(percentile(&times, 0.99))
    );

    let mut times = Vec::with_capacity(engagements);
    single.block_on(async {
        for engagement in 0..engagements {
            let id = engagement_id(engagement);
            let started = Instant::now();
            let compacted = journal.compact(&id).await.expect("compact");
            times.push(started.elapsed());
            assert!(compacted, "every workload engagement is compactable");
        }
    });
    times.sort_unstable();
    let remaining = single
        .block_on(journal.read(&engagement_id(0)))
        .map_or(0, |events| events.len());
    println!(
        "in-memory compact, 60 -> {remaining} events ({} engagements): p50 {:.1} us, p99 {:.1} us",
        times.len(),
        micros(percentile(&times, 0.5)),
        micros(percentile(&times, 0.99))
    );
}

fn sqlite_part(options: &Options, single: &Runtime, workers: &Runtime) {
    let engagements = options.engagements;
    let dir = tempfile::tempdir().expect("temp dir");
    let tasks = options.sqlite_tasks;
    let runs: Vec<SqliteAppends> = (0..options.repeat.min(3))
        .map(|run| {
            sqlite_appends(
                single,
                dir.path(),
                &format!("concurrent-{run}.db"),
                engagements,
                tasks,
            )
        })
        .collect();
    print_sqlite_appends(
        &format!("sqlite append, {tasks} tasks on one runtime thread, durability normal"),
        &runs,
        Some(100_000.0),
    );
    let runs: Vec<SqliteAppends> = (0..options.repeat.min(3))
        .map(|run| {
            sqlite_appends(
                workers,
                dir.path(),
                &format!("concurrent-mt-{run}.db"),
                engagements,
                tasks,
            )
        })
        .collect();
    print_sqlite_appends(
        &format!("sqlite append, {tasks} tasks on 2 worker threads, durability normal"),
        &runs,
        None,
    );
    let runs = vec![sqlite_appends(
        single,
        dir.path(),
        "sequential.db",
        engagements,
        1,
    )];
    print_sqlite_appends(
        "sqlite append, 1 sequential task (one commit per append), durability normal",
        &runs,
        None,
    );

    // A 1,000-event engagement, then its summary read from the file.
    let journal = open_sqlite(dir.path(), "long.db");
    let long_id = engagement_id(999_999);
    let mut times = Vec::new();
    single.block_on(async {
        for input in engagement_inputs(999_999, LONG_ENGAGEMENT_EVENTS) {
            journal.append(input).await.expect("append");
        }
        for _ in 0..200 {
            let started = Instant::now();
            let summary = journal.summarize(&long_id).await.expect("summarize");
            times.push(started.elapsed());
            assert!(summary.is_some());
        }
    });
    times.sort_unstable();
    let p50 = percentile(&times, 0.5);
    // The first read of a freshly opened handle: no SQLite page cache (the OS cache is warm).
    drop(journal);
    let reopened = open_sqlite(dir.path(), "long.db");
    let first = single.block_on(async {
        let started = Instant::now();
        let summary = reopened.summarize(&long_id).await.expect("summarize");
        assert!(summary.is_some());
        started.elapsed()
    });
    println!(
        "sqlite summarize, 1,000-event engagement from the file ({} calls): p50 {:.2} ms, p99 \
         {:.2} ms; first call after reopening {:.2} ms  [target p50 < 2 ms: {}]",
        times.len(),
        micros(p50) / 1000.0,
        micros(percentile(&times, 0.99)) / 1000.0,
        micros(first) / 1000.0,
        verdict(p50 < Duration::from_millis(2))
    );
}
