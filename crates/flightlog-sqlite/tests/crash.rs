//! A writer process killed with SIGKILL in the middle of its load.
//!
//! The crate acknowledges a write only after the transaction holding it committed ("persist,
//! then emit"), and relies on SQLite's WAL to make a committed transaction survive the death of
//! the process. This test kills a real writer process, without warning, while several of its
//! tasks write, and repeats that a few times on the same file. A write counts as acknowledged
//! when the writer printed its `ACK` line, which it does only after the store call returned `Ok`.
//!
//! After each kill it proves that:
//! - the file opens cleanly (schema check, migrations) and passes SQLite's integrity check;
//! - every acknowledged write of every killed writer so far is there: started spans exist,
//!   acknowledged ends show their outcome, acknowledged patches show (at least) their step, and
//!   acknowledged events exist at their index with the exact type and payload written;
//! - no record is torn: every span and every event decodes, and every stored event payload, even
//!   one committed but never acknowledged, is byte for byte the JSON the writer produced;
//! - in change-id order every run's seq is gap-free from 1 and change ids strictly increase;
//! - the change log holds at least one row per acknowledged change-logged write, and at most one
//!   more per writer task per kill (the write that was in flight when the process died).
//!
//! If a write were acknowledged before its commit, a kill between the two would lose it and the
//! checks on acknowledged writes would fail: a writer thread that replies before `COMMIT` (even
//! immediately before) fails this test on every run.

#![cfg(unix)]

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use support::{
    open_store, read_change_log, report, span_input, spawn_writer_process, writer_process_args,
};

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, SpanKind, SpanOutcome, SpanPatch, StoreError,
};
use flightlog_sqlite::{SqliteActivityStore, SCHEMA_VERSION};
use serde_json::{json, Value};

/// The spawned writer process's role (see `support::writer_process_args`); its tag is new for
/// each kill cycle.
const CHILD_ROLE: &str = "crash_writer";
/// The name of the `#[test]` function that is the writer process's body.
const CHILD_TEST: &str = "crash_child_writer";
const KILL_CYCLES: usize = 3;
const TASKS_PER_PROCESS: usize = 6;
/// The writer is killed this long after its first acknowledgement (a little later each cycle, so
/// the kills land at different points of the writer's work) …
const LOAD_BEFORE_KILL: Duration = Duration::from_millis(800);
/// … or once it acknowledged this many writes, whichever comes first.
const ACKS_BEFORE_KILL: usize = 4000;
/// A writer that never acknowledges anything within this time fails the test.
const FIRST_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// A writer that outlives its parent stops by itself after this long.
const CHILD_SAFETY_STOP: Duration = Duration::from_secs(60);
const EVENTS_PER_CHILD_SPAN: usize = 3;

/// The payload of event `index` of `span_id`: deterministic, so the parent can check every
/// stored payload (acknowledged or not) byte for byte. Most are small; one in eight is larger
/// than a database page (overflow pages). The text holds escapes and non-ASCII to catch any
/// re-encoding.
fn event_payload(span_id: &str, index: i64) -> Value {
    let seed = span_id.bytes().fold(index as u64, |acc, byte| {
        acc.wrapping_mul(31).wrapping_add(u64::from(byte))
    });
    let len = if seed.is_multiple_of(8) {
        4500 + seed % 4000
    } else {
        seed % 1500
    };
    // `repeat` rather than a per-character loop: debug builds generate thousands of these.
    let pad = format!(
        "{}é☃ \"quoted\" \\ \n\t{}",
        "x".repeat(len as usize),
        seed % 7
    );
    json!({"span": span_id, "index": index, "seed": seed, "pad": pad, "nested": {"ok": true, "n": [index, -index]}})
}

fn event_type(index: i64) -> String {
    format!("step.{index}")
}

fn outcome_for(span_id: &str) -> SpanOutcome {
    if span_id.len().is_multiple_of(2) {
        SpanOutcome::Success
    } else {
        SpanOutcome::Error
    }
}

// ---------------------------------------------------------------------------------------------
// The writer process.
// ---------------------------------------------------------------------------------------------

fn fail(what: &str, err: impl std::fmt::Display) {
    report(&format!("FAIL {what}: {err}"));
}

fn found<T>(what: &str, result: Result<Option<T>, StoreError>) -> Option<T> {
    match result {
        Ok(Some(value)) => Some(value),
        Ok(None) => {
            fail(what, "the store did not find the span");
            None
        }
        Err(err) => {
            fail(what, err);
            None
        }
    }
}

fn truthy(result: Result<bool, StoreError>) -> Result<Option<()>, StoreError> {
    result.map(|found| found.then_some(()))
}

async fn append(store: &SqliteActivityStore, span_id: &str, index: i64) -> bool {
    let payload = event_payload(span_id, index);
    let result = store
        .append_event(span_id, &event_type(index), Some(&payload), None)
        .await;
    let Some(event) = found(&format!("append event {index} to {span_id}"), result) else {
        return false;
    };
    if event.event_index != index {
        fail(
            span_id,
            format!("event got index {} instead of {index}", event.event_index),
        );
        return false;
    }
    report(&format!("ACK EVENT {span_id} {index}"));
    true
}

async fn patch(store: &SqliteActivityStore, span_id: &str, step: i64) -> bool {
    let patch = SpanPatch {
        attrs: json!({"step": step}).as_object().cloned(),
        ..SpanPatch::default()
    };
    let result = truthy(store.patch_span(span_id, patch).await);
    if found(&format!("patch {span_id}"), result).is_none() {
        return false;
    }
    report(&format!("ACK PATCH {span_id} {step}"));
    true
}

async fn end(store: &SqliteActivityStore, span_id: &str) -> bool {
    let outcome = outcome_for(span_id);
    let input = EndSpanInput {
        outcome: outcome.clone(),
        reason: Some(format!("{span_id} done")),
        ended_at: None,
        usage: None,
        attrs: None,
    };
    let result = truthy(store.end_span(span_id, input).await);
    if found(&format!("end {span_id}"), result).is_none() {
        return false;
    }
    report(&format!("ACK END {span_id} {outcome}"));
    true
}

async fn start(
    store: &SqliteActivityStore,
    span_id: &str,
    run_id: &str,
    parent: Option<&str>,
) -> bool {
    let kind = if parent.is_some() {
        SpanKind::Tool
    } else {
        SpanKind::Turn
    };
    let result = store
        .start_span(span_input(span_id, run_id, parent, kind))
        .await;
    if found(&format!("start {span_id}"), result.map(Some)).is_none() {
        return false;
    }
    report(&format!("ACK START {span_id} {run_id}"));
    true
}

/// One round: a new run with a root and a child span, events on both, patches, ends. Every
/// third root is left open, as a live agent's would be. Returns false after a failed call.
async fn round(store: &SqliteActivityStore, tag: &str, task: usize, round: usize) -> bool {
    let run = format!("{tag}-t{task}-run{round}");
    let root = format!("{run}-root");
    let child = format!("{run}-child");
    if !start(store, &root, &run, None).await || !append(store, &root, 0).await {
        return false;
    }
    if !start(store, &child, &run, Some(&root)).await {
        return false;
    }
    for index in 0..EVENTS_PER_CHILD_SPAN as i64 {
        if !append(store, &child, index).await || !patch(store, &child, index).await {
            return false;
        }
    }
    if !end(store, &child).await || !append(store, &root, 1).await {
        return false;
    }
    if round % 3 == 2 {
        return true;
    }
    patch(store, &root, 1).await && end(store, &root).await
}

/// The body of a writer process, not a test on its own.
///
/// The parent test re-executes this test binary with
/// `crash_child_writer --exact --nocapture --test-threads=1` and sets `FLIGHTLOG_TEST_CHILD`
/// (plus the database path and the process tag) in the child's environment. Without that
/// variable, as in an ordinary `cargo test` run, this function returns at once and passes. The
/// child reports on stdout in lines marked with `support::REPORT_MARK` (`ACK …` after each write
/// returned `Ok`, `FAIL …` for a failed call) because libtest prints its own lines there as well.
/// It writes until the parent kills it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_child_writer() {
    let Some((path, tag)) = writer_process_args(CHILD_ROLE) else {
        return;
    };
    let store = open_store(Path::new(&path), &format!("writer-{tag}"));
    let stop_at = Instant::now() + CHILD_SAFETY_STOP;
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|task| {
            let (store, tag) = (store.clone(), tag.clone());
            tokio::spawn(async move {
                let mut next = 0;
                while Instant::now() < stop_at && round(&store, &tag, task, next).await {
                    next += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a writer task does not panic");
    }
    report("STOPPED");
}

// ---------------------------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------------------------

/// What the killed writers acknowledged, accumulated over every cycle.
#[derive(Debug, Default)]
struct Acked {
    /// Span id → run id, for every acknowledged start.
    spans: BTreeMap<String, String>,
    /// Span id → acknowledged event indexes.
    events: HashMap<String, HashSet<i64>>,
    /// Span id → the highest acknowledged patch step.
    steps: HashMap<String, i64>,
    /// Span id → the acknowledged outcome.
    ends: HashMap<String, String>,
    /// Run id → acknowledged change-logged writes.
    changes_per_run: HashMap<String, i64>,
    changes: i64,
}

impl Acked {
    /// Take one report line; returns false for a line that is not an acknowledgement.
    fn take(&mut self, line: &str) -> bool {
        let fields: Vec<&str> = line.split(' ').collect();
        let run_id = match fields.as_slice() {
            ["ACK", "START", span_id, run_id] => {
                self.spans
                    .insert((*span_id).to_owned(), (*run_id).to_owned());
                (*run_id).to_owned()
            }
            ["ACK", "EVENT", span_id, index] => {
                let index = index.parse().expect("an event index is a number");
                self.events
                    .entry((*span_id).to_owned())
                    .or_default()
                    .insert(index);
                self.run_of(span_id)
            }
            ["ACK", "PATCH", span_id, step] => {
                let step: i64 = step.parse().expect("a step is a number");
                let highest = self.steps.entry((*span_id).to_owned()).or_insert(step);
                *highest = (*highest).max(step);
                self.run_of(span_id)
            }
            ["ACK", "END", span_id, outcome] => {
                self.ends
                    .insert((*span_id).to_owned(), (*outcome).to_owned());
                self.run_of(span_id)
            }
            _ => return false,
        };
        *self.changes_per_run.entry(run_id).or_default() += 1;
        self.changes += 1;
        true
    }

    fn run_of(&self, span_id: &str) -> String {
        self.spans
            .get(span_id)
            .unwrap_or_else(|| panic!("a write on {span_id} was acknowledged before its start"))
            .clone()
    }
}

/// Run one writer until it is killed; returns how many writes it acknowledged.
fn run_and_kill(path: &str, tag: &str, cycle: usize, acked: &mut Acked) -> usize {
    let mut child = spawn_writer_process(CHILD_TEST, CHILD_ROLE, path, tag);
    let mut count = 0;
    let mut failures = Vec::new();
    let mut take = |line: String, count: &mut usize| {
        if acked.take(&line) {
            *count += 1;
        } else if line.starts_with("FAIL ") || line == "STOPPED" {
            failures.push(line);
        }
    };
    let Ok(first) = child.lines.recv_timeout(FIRST_ACK_TIMEOUT) else {
        let _ = child.child.kill();
        let status = child.child.wait();
        let stderr = child.stderr.join().unwrap_or_default();
        panic!(
            "writer {tag} acknowledged nothing within {FIRST_ACK_TIMEOUT:?} ({status:?}); \
             stderr:\n{stderr}"
        );
    };
    take(first, &mut count);
    let kill_at = Instant::now() + LOAD_BEFORE_KILL + Duration::from_millis(150 * cycle as u64);
    while count < ACKS_BEFORE_KILL {
        let left = kill_at.saturating_duration_since(Instant::now());
        match child.lines.recv_timeout(left) {
            Ok(line) => take(line, &mut count),
            Err(_) => break,
        }
    }
    // SIGKILL: no destructor, no flush, no rollback runs in the writer.
    child.child.kill().expect("the writer can be killed");
    let status = child.child.wait().expect("waiting for the killed writer");
    // Lines the writer completed before it died are acknowledgements too.
    while let Ok(line) = child.lines.recv() {
        take(line, &mut count);
    }
    let stderr = child.stderr.join().unwrap_or_default();
    assert!(
        failures.is_empty(),
        "writer {tag} reported failures before the kill: {:#?}\nstderr:\n{stderr}",
        &failures[..failures.len().min(10)]
    );
    assert_eq!(
        status.signal(),
        Some(9),
        "writer {tag} must have been killed while writing, but it exited ({status}); stderr:\n{stderr}"
    );
    count
}

/// The raw file, below the store: SQLite's own integrity check and the schema version.
fn check_file(path: &Path) {
    let conn = rusqlite::Connection::open(path).expect("a raw connection opens");
    let integrity: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut stmt| stmt.query_map([], |row| row.get(0))?.collect())
        .expect("the integrity check runs");
    assert_eq!(integrity, ["ok"], "the file is damaged after a kill");
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("the schema version reads");
    assert_eq!(
        version, SCHEMA_VERSION,
        "the schema version changed across a kill"
    );
}

/// Everything the killed writers acknowledged is in the file, whole.
///
/// `payloads` caches the expected payload texts across cycles: generating them is most of the
/// check's time in a debug build, while comparing them again after every kill is cheap.
async fn check_after_kill(
    path: &Path,
    acked: &Acked,
    cycles_done: usize,
    payloads: &mut HashMap<(String, i64), String>,
) {
    let store = open_store(path, "writer-checker");
    check_file(path);

    // Spans: every acknowledged start, end and patch.
    for (span_id, run_id) in &acked.spans {
        let span = store
            .get_span(span_id)
            .await
            .expect("a span row decodes")
            .unwrap_or_else(|| panic!("acknowledged span {span_id} is missing"));
        assert_eq!(&span.run_id, run_id, "span {span_id} is in the wrong run");
        if let Some(outcome) = acked.ends.get(span_id) {
            assert_eq!(
                span.outcome.as_ref().map(|o| o.as_str()),
                Some(outcome.as_str()),
                "span {span_id}: its acknowledged end is missing"
            );
            assert!(
                span.ended_at.is_some(),
                "span {span_id} ended without an end time"
            );
        }
        if let Some(step) = acked.steps.get(span_id) {
            let stored = span.attrs.get("step").and_then(Value::as_i64);
            // A later patch may have committed without being acknowledged; never an earlier one.
            assert!(
                stored.is_some_and(|stored| stored >= *step),
                "span {span_id}: acknowledged patch step {step}, stored {stored:?}"
            );
        }
    }

    // Events: every acknowledged one at its index, and every stored one exactly as written.
    let runs: HashSet<&String> = acked.spans.values().collect();
    let mut stored_events = 0;
    for run_id in runs {
        let snapshot = store
            .snapshot_run(run_id)
            .await
            .expect("a run's spans and events decode")
            .unwrap_or_else(|| panic!("run {run_id} with acknowledged spans is missing"));
        let mut present: HashMap<&str, Vec<i64>> = HashMap::new();
        for event in &snapshot.events {
            let expected = payloads
                .entry((event.span_id.clone(), event.event_index))
                .or_insert_with(|| event_payload(&event.span_id, event.event_index).to_string());
            assert_eq!(
                event.payload.get(),
                expected.as_str(),
                "event {} of {} is not the payload written",
                event.event_index,
                event.span_id
            );
            assert_eq!(event.event_type, event_type(event.event_index));
            assert!(
                !event.truncated,
                "event {} of {} is marked truncated",
                event.event_index, event.span_id
            );
            present
                .entry(&event.span_id)
                .or_default()
                .push(event.event_index);
            stored_events += 1;
        }
        for span in &snapshot.spans {
            let mut indexes = present.remove(span.span_id.as_str()).unwrap_or_default();
            indexes.sort_unstable();
            let gap_free: Vec<i64> = (0..indexes.len() as i64).collect();
            assert_eq!(
                indexes, gap_free,
                "span {}: event indexes have a gap",
                span.span_id
            );
            for index in acked.events.get(&span.span_id).into_iter().flatten() {
                assert!(
                    indexes.contains(index),
                    "acknowledged event {index} of span {} is missing",
                    span.span_id
                );
            }
        }
        assert!(
            present.is_empty(),
            "run {run_id} has events of spans it does not list"
        );
    }

    // The change log: ordered and gap-free, every acknowledged write in it, and nothing beyond
    // the one write per task that may have committed while its acknowledgement was cut off.
    let high_seq = read_change_log(&store).await.1;
    let in_flight = (TASKS_PER_PROCESS * cycles_done) as i64;
    let logged: i64 = high_seq.values().sum();
    assert!(
        logged >= acked.changes && logged <= acked.changes + in_flight,
        "the change log has {logged} rows for {} acknowledged writes (at most {in_flight} more \
         may have committed unacknowledged)",
        acked.changes
    );
    for (run_id, count) in &acked.changes_per_run {
        let logged = high_seq.get(run_id).copied().unwrap_or(0);
        // One task writes a run, one call at a time: at most one unacknowledged write per run.
        assert!(
            logged == *count || logged == count + 1,
            "run {run_id}: {count} acknowledged change-logged writes but seq reaches {logged}"
        );
    }
    // Nothing in the store closes a span by itself: every root whose start was acknowledged
    // and whose end was not is still open, but for ends that committed unacknowledged.
    let open_roots = store.open_root_spans().await.expect("open roots decode");
    let unended_roots = acked
        .spans
        .keys()
        .filter(|span_id| span_id.ends_with("-root") && !acked.ends.contains_key(*span_id))
        .count() as i64;
    assert!(
        open_roots.len() as i64 >= unended_roots - in_flight,
        "{} open roots, but {unended_roots} acknowledged roots were never acknowledged ended",
        open_roots.len()
    );
    eprintln!(
        "crash: after {cycles_done} kill(s): {} acknowledged writes, {logged} change rows, \
         {stored_events} events",
        acked.changes
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_sigkill() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("crash.db");
    let path_text = path
        .to_str()
        .expect("the temporary path is UTF-8")
        .to_owned();
    let mut acked = Acked::default();
    let mut payloads = HashMap::new();
    for cycle in 0..KILL_CYCLES {
        let started = Instant::now();
        let tag = format!("k{cycle}");
        let count = run_and_kill(&path_text, &tag, cycle, &mut acked);
        assert!(
            count >= 100,
            "writer {tag} acknowledged only {count} writes before the kill: too little load"
        );
        eprintln!(
            "crash: writer {tag} acknowledged {count} writes in {:?}",
            started.elapsed()
        );
        let checking = Instant::now();
        check_after_kill(&path, &acked, cycle + 1, &mut payloads).await;
        eprintln!("crash: checked in {:?}", checking.elapsed());
    }
}
