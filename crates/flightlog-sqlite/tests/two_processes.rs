//! Two processes writing one SQLite file at the same time.
//!
//! The crate promises that its file is safe to share between processes: every write takes the
//! lock with `BEGIN IMMEDIATE`, waits out the other process instead of failing, and reads the
//! per-run `seq` and the change id inside that transaction. This test holds it to that promise
//! with real OS processes: only a second process has its own writer thread, its own key caches
//! and its own file locks, which is exactly what a second flightlog on the same file has.
//!
//! Two writer processes (the test binary re-executed, see `two_processes_child_writer`) open the
//! same file and write for a bounded time from several concurrent tasks each, so each process's
//! group-commit path is busy while the other process holds the lock. Some runs are shared: both
//! processes append events to the same root spans and start child spans under them.
//!
//! It proves that:
//! - no call (write or read) returns an error, in particular no `SQLITE_BUSY` /
//!   "database is locked" reaches a caller;
//! - in change-id order every run's `seq` goes 1, 2, 3, … without a gap or a repeat, and change
//!   ids strictly increase;
//! - the change log holds exactly one row per acknowledged change-logged write of either process
//!   (per run and in total), and event indexes on a shared span are 0..n without gaps;
//! - every span carries the writer identity of the process that started it;
//! - the two processes really interleaved (otherwise the test would prove nothing).
//!
//! Taking the lock with a deferred `BEGIN` makes it fail ("database is locked"), and so does a
//! per-run seq cached across another process's commit (duplicate seqs).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};
use support::{
    open_store, read_change_log, report, span_input, spawn_writer_process, writer_process_args,
};

use flightlog_core::activity::{
    ActivityChange, ActivityStore, ChangeBody, EndSpanInput, SpanKind, SpanOutcome, SpanPatch,
    StoreError,
};
use flightlog_sqlite::SqliteActivityStore;
use serde_json::json;

/// The spawned writer process's role (see `support::writer_process_args`).
const CHILD_ROLE: &str = "two_processes_writer";
/// The name of the `#[test]` function that is the writer process's body.
const CHILD_TEST: &str = "two_processes_child_writer";
const TAGS: [&str; 2] = ["a", "b"];
/// Runs both processes write into; each has one root span started by the parent.
const SHARED_RUNS: usize = 4;
const TASKS_PER_PROCESS: usize = 6;
/// How long each writer process writes …
const LOAD_DURATION: Duration = Duration::from_secs(3);
/// … unless each of its tasks has done this many rounds first.
const MAX_ROUNDS_PER_TASK: usize = 250;
/// A writer process that has not finished by then is killed and the test fails.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

fn shared_run(k: usize) -> String {
    format!("shared-{k}")
}

fn shared_root(k: usize) -> String {
    format!("shared-{k}-root")
}

fn writer_name(tag: &str) -> String {
    format!("writer-{tag}")
}

fn end_input(outcome: SpanOutcome) -> EndSpanInput {
    EndSpanInput {
        outcome,
        reason: None,
        ended_at: None,
        usage: None,
        attrs: None,
    }
}

// ---------------------------------------------------------------------------------------------
// The writer process.
// ---------------------------------------------------------------------------------------------

/// What one writer task saw: acknowledged change-logged writes per run, acknowledged events per
/// shared root, and every failed call.
#[derive(Default)]
struct TaskTally {
    changes_per_run: HashMap<String, u64>,
    events_per_shared_root: HashMap<String, u64>,
    errors: Vec<String>,
}

impl TaskTally {
    fn change(&mut self, run_id: &str) {
        *self.changes_per_run.entry(run_id.to_owned()).or_default() += 1;
    }

    /// Count a write that returned `Ok(true)` / `Ok(Some(_))`; anything else is an error.
    fn logged<T>(&mut self, op: &str, run_id: &str, result: Result<Option<T>, StoreError>) -> bool {
        match result {
            Ok(Some(_)) => {
                self.change(run_id);
                true
            }
            Ok(None) => {
                self.errors
                    .push(format!("{op}: the store did not find the span"));
                false
            }
            Err(err) => {
                self.errors.push(format!("{op}: {err}"));
                false
            }
        }
    }

    fn read<T>(&mut self, op: &str, result: Result<T, StoreError>) {
        if let Err(err) = result {
            self.errors.push(format!("{op}: {err}"));
        }
    }
}

fn found(ok: Result<bool, StoreError>) -> Result<Option<()>, StoreError> {
    ok.map(|found| found.then_some(()))
}

/// One writer task: rounds of a private run (root, events, patch, end) interleaved with writes
/// into a shared run (an event on the shared root, a child span with an event, patch and end).
async fn writer_task(
    store: SqliteActivityStore,
    tag: String,
    task: usize,
    deadline: Instant,
) -> TaskTally {
    let mut tally = TaskTally::default();
    for round in 0..MAX_ROUNDS_PER_TASK {
        if Instant::now() >= deadline {
            break;
        }
        let run = format!("{tag}-t{task}-run{round}");
        let root = format!("{run}-root");
        let k = (task + round) % SHARED_RUNS;
        let (shared, shared_root) = (shared_run(k), shared_root(k));
        let child = format!("{run}-child");

        let started = store
            .start_span(span_input(&root, &run, None, SpanKind::Turn))
            .await;
        if !tally.logged("start root", &run, started.map(Some)) {
            continue;
        }
        let payload = json!({"tag": tag, "task": task, "round": round});
        let event = store.append_event(&root, "own", Some(&payload), None).await;
        tally.logged("event on own root", &run, event);

        let event = store
            .append_event(&shared_root, "shared", Some(&payload), None)
            .await;
        if tally.logged("event on shared root", &shared, event) {
            *tally
                .events_per_shared_root
                .entry(shared_root.clone())
                .or_default() += 1;
        }
        let started = store
            .start_span(span_input(
                &child,
                &shared,
                Some(&shared_root),
                SpanKind::Tool,
            ))
            .await;
        if tally.logged("start shared child", &shared, started.map(Some)) {
            let event = store
                .append_event(&child, "child", Some(&payload), None)
                .await;
            tally.logged("event on shared child", &shared, event);
            let patch = SpanPatch {
                attrs: Some(
                    json!({"round": round})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                ),
                ..SpanPatch::default()
            };
            let patched = store.patch_span(&child, patch).await;
            tally.logged("patch shared child", &shared, found(patched));
            let ended = store
                .end_span(&child, end_input(SpanOutcome::Success))
                .await;
            tally.logged("end shared child", &shared, found(ended));
        }
        // Liveness is written but not change-logged: it must not disturb the seq count.
        let beat = store.heartbeat(&shared_root, None).await;
        tally.read("heartbeat shared root", beat);

        let patch = SpanPatch {
            wait_until: Some(1),
            ..SpanPatch::default()
        };
        let patched = store.patch_span(&root, patch).await;
        tally.logged("patch own root", &run, found(patched));
        let outcome = if round.is_multiple_of(2) {
            SpanOutcome::Success
        } else {
            SpanOutcome::Error
        };
        let ended = store.end_span(&root, end_input(outcome)).await;
        tally.logged("end own root", &run, found(ended));

        // Reads share the file with the other process's writer too.
        if round.is_multiple_of(5) {
            let snapshot = store.snapshot_run(&shared).await;
            tally.read("snapshot shared run", snapshot);
            let changes = store.changes_since(0, 50).await;
            tally.read("changes since 0", changes);
        }
    }
    tally
}

/// The body of a writer process, not a test on its own.
///
/// The parent test re-executes this test binary with
/// `two_processes_child_writer --exact --nocapture --test-threads=1` and sets `FLIGHTLOG_TEST_CHILD`
/// (plus the database path and the process tag) in the child's environment. Without that
/// variable, as in an ordinary `cargo test` run, this function returns at once and passes. The
/// child reports on stdout in lines marked with `support::REPORT_MARK` (`RUN`, `ROOTEVENTS`, `ERROR`,
/// `DONE`) because libtest prints its own lines there as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_processes_child_writer() {
    let Some((path, tag)) = writer_process_args(CHILD_ROLE) else {
        return;
    };
    let store = open_store(Path::new(&path), &writer_name(&tag));
    let deadline = Instant::now() + LOAD_DURATION;
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|task| tokio::spawn(writer_task(store.clone(), tag.clone(), task, deadline)))
        .collect();
    let mut changes_per_run: BTreeMap<String, u64> = BTreeMap::new();
    let mut events_per_root: BTreeMap<String, u64> = BTreeMap::new();
    let mut errors = Vec::new();
    for task in tasks {
        let tally = task.await.expect("a writer task does not panic");
        for (run, count) in tally.changes_per_run {
            *changes_per_run.entry(run).or_default() += count;
        }
        for (root, count) in tally.events_per_shared_root {
            *events_per_root.entry(root).or_default() += count;
        }
        errors.extend(tally.errors);
    }
    for (run, count) in &changes_per_run {
        report(&format!("RUN {run} {count}"));
    }
    for (root, count) in &events_per_root {
        report(&format!("ROOTEVENTS {root} {count}"));
    }
    for error in &errors {
        report(&format!("ERROR {error}"));
    }
    let total: u64 = changes_per_run.values().sum();
    report(&format!("DONE {total}"));
}

// ---------------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------------

/// The process tag of the span a change is about, when the id says so (shared roots: none).
fn change_tag(change: &ActivityChange) -> Option<&'static str> {
    let span_id = match &change.body {
        ChangeBody::Span { span } => &span.span_id,
        ChangeBody::Event { event } => &event.span_id,
    };
    TAGS.into_iter()
        .find(|tag| span_id.starts_with(&format!("{tag}-")))
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_share_one_file_without_errors_or_seq_gaps() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("shared.db");
    let path_text = path
        .to_str()
        .expect("the temporary path is UTF-8")
        .to_owned();

    // The shared runs' roots exist before the writers start, so both can write under them.
    let mut expected_per_run: HashMap<String, u64> = HashMap::new();
    {
        let store = open_store(&path, "writer-parent");
        for k in 0..SHARED_RUNS {
            store
                .start_span(span_input(
                    &shared_root(k),
                    &shared_run(k),
                    None,
                    SpanKind::Turn,
                ))
                .await
                .expect("the parent starts a shared root");
            expected_per_run.insert(shared_run(k), 1);
        }
        store
            .database()
            .flush()
            .await
            .expect("the seed writes commit");
    }

    // Both children are started before either is waited for: they write at the same time.
    let started = Instant::now();
    let children: Vec<_> = TAGS
        .iter()
        .map(|tag| {
            let child = spawn_writer_process(CHILD_TEST, CHILD_ROLE, &path_text, tag);
            (*tag, child)
        })
        .collect();
    let mut expected_root_events: HashMap<String, u64> = HashMap::new();
    let mut acknowledged_total = SHARED_RUNS as u64;
    for (tag, child) in children {
        let (lines, status, stderr) = child.finish(CHILD_TIMEOUT);
        assert!(
            status.success(),
            "writer {tag} failed ({status}); stderr:\n{stderr}\nstdout:\n{}",
            lines.join("\n")
        );
        let errors: Vec<_> = lines
            .iter()
            .filter(|line| line.starts_with("ERROR "))
            .collect();
        assert!(
            errors.is_empty(),
            "writer {tag}: {} calls returned an error; the first ones: {:#?}",
            errors.len(),
            &errors[..errors.len().min(10)]
        );
        let mut done = None;
        for line in &lines {
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                ["RUN", run, count] => {
                    let count: u64 = count.parse().expect("RUN count is a number");
                    *expected_per_run.entry((*run).to_owned()).or_default() += count;
                }
                ["ROOTEVENTS", root, count] => {
                    let count: u64 = count.parse().expect("ROOTEVENTS count is a number");
                    *expected_root_events.entry((*root).to_owned()).or_default() += count;
                }
                ["DONE", total] => {
                    done = Some(total.parse::<u64>().expect("DONE total is a number"))
                }
                _ => {}
            }
        }
        let done = done
            .unwrap_or_else(|| panic!("writer {tag} never reported DONE:\n{}", lines.join("\n")));
        assert!(
            done > 100,
            "writer {tag} acknowledged only {done} writes: too little load to prove anything"
        );
        acknowledged_total += done;
    }
    let load_time = started.elapsed();

    let store = open_store(&path, "writer-reader");
    let (changes, high_seq) = read_change_log(&store).await;
    assert_eq!(
        changes.len() as u64,
        acknowledged_total,
        "the change log must hold exactly one row per acknowledged change-logged write"
    );
    let mut runs: Vec<_> = expected_per_run.keys().collect();
    runs.sort();
    for run in runs {
        let expected = expected_per_run[run] as i64;
        assert_eq!(
            high_seq.get(run).copied(),
            Some(expected),
            "run {run}: its last seq must equal its acknowledged change-logged writes"
        );
        assert_eq!(
            store
                .run_high_water_seq(run)
                .await
                .expect("high water reads"),
            expected
        );
    }
    assert_eq!(
        high_seq.len(),
        expected_per_run.len(),
        "the change log names runs nobody acknowledged writing"
    );

    // Spans carry their own process's writer identity, whichever process wrote around them.
    for change in &changes {
        if let (ChangeBody::Span { span }, Some(tag)) = (&change.body, change_tag(change)) {
            assert_eq!(
                span.writer,
                writer_name(tag),
                "span {} has the wrong writer",
                span.span_id
            );
        }
    }

    // Both processes appended to the shared roots: indexes are unique and gap-free.
    for k in 0..SHARED_RUNS {
        let snapshot = store
            .snapshot_run(&shared_run(k))
            .await
            .expect("a shared run reads")
            .expect("a shared run exists");
        let mut indexes: Vec<i64> = snapshot
            .events
            .iter()
            .filter(|event| event.span_id == shared_root(k))
            .map(|event| event.event_index)
            .collect();
        indexes.sort_unstable();
        let expected = expected_root_events
            .get(&shared_root(k))
            .copied()
            .unwrap_or(0);
        assert_eq!(
            indexes,
            (0..expected as i64).collect::<Vec<_>>(),
            "shared root {k}: event indexes must be 0..{expected}"
        );
    }

    // The writes really interleaved: in commit order the writing process changes many times.
    let mut switches = 0;
    let mut last = None;
    for tag in changes.iter().filter_map(change_tag) {
        if last.is_some_and(|last| last != tag) {
            switches += 1;
        }
        last = Some(tag);
    }
    assert!(
        switches >= 20,
        "the two processes' writes switched only {switches} times in commit order: they did \
         not write concurrently, so the test proved nothing"
    );
    eprintln!(
        "two processes: {} change rows, {switches} switches between processes, load {load_time:?}",
        changes.len()
    );
}
