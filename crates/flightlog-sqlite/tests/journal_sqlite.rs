//! The SQLite engagement journal where the conformance fixtures cannot reach: concurrent
//! appenders, two OS processes on one file, a process killed mid-compaction, and the
//! subscription's delivery promise.
//!
//! The fixtures (run by the conformance target) pin the journal's results one call at a time;
//! these tests hold it to the promises that only show under contention or failure:
//! - optimistic appends (`expected_seq`) from sixteen tasks: exactly one winner per seq, every
//!   loser told the actual next seq, seqs dense;
//! - two processes appending to the same engagements: every acknowledged append is stored once,
//!   at the seq it was told, seqs dense, and no `SQLITE_BUSY` reaches a caller;
//! - SIGKILL during compaction, many times: each engagement is wholly before or wholly after
//!   (equal to the in-memory journal's compaction of the same events), and compacting again
//!   changes nothing;
//! - subscribers get each committed event once, in seq order, after it is readable, and nothing
//!   for failed appends or compaction rewrites.
//!
//! The multi-process tests re-execute this test binary with a child `#[test]` selected by name
//! (`--exact`); a child test returns at once unless [`CHILD_ENV`] names its role.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flightlog_core::journal::{
    summarize_engagement_events, AppendInput, EngagementEvent, EngagementJournal,
    InMemoryEngagementJournal, JournalError, RetentionConfig, TailBound,
};
use flightlog_sqlite::{SqliteConfig, SqliteDatabase, SqliteEngagementJournal};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

/// Set (to a child role) only in the environment of a spawned child process.
const CHILD_ENV: &str = "FLIGHTLOG_JOURNAL_TEST_CHILD";
/// The database file the child opens.
const DB_ENV: &str = "FLIGHTLOG_JOURNAL_TEST_DB";
/// The child's argument (its tag, or the crash round).
const ARG_ENV: &str = "FLIGHTLOG_JOURNAL_TEST_ARG";
/// Marks the child's report lines. libtest writes to the same stdout, and with `--nocapture`
/// its `test … ` prefix can share a line with a report, so the parent looks for the mark
/// anywhere in a line.
const REPORT_MARK: &str = "@journal-child ";
/// A child that has not reported in this long is killed and its test fails.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

fn open_journal(path: &Path) -> SqliteEngagementJournal {
    let db = SqliteDatabase::open(SqliteConfig::new(path)).expect("the database opens");
    SqliteEngagementJournal::new(db, RetentionConfig::default())
}

fn input(engagement_id: &str, at: i64, event_type: &str, data: Value) -> AppendInput {
    let Value::Object(data) = data else {
        panic!("event data must be a JSON object: {data}");
    };
    AppendInput::new(engagement_id, at, event_type, data).expect("a valid append input")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The role of this process when it is a spawned child.
fn is_child(role: &str) -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok(role)
}

fn child_env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the child needs {name}"))
}

/// Re-execute this test binary running only `test_name`, as `role`.
fn spawn_child(test_name: &str, role: &str, db: &Path, arg: &str) -> Child {
    Command::new(std::env::current_exe().expect("the test binary's path"))
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(DB_ENV, db)
        .env(ARG_ENV, arg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the child process starts")
}

/// The child's report lines (the text after [`REPORT_MARK`]), read by a thread so the child never
/// blocks on a full pipe.
fn child_reports(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let (lines, reports) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(start) = line.find(REPORT_MARK) {
                let report = line[start + REPORT_MARK.len()..].to_owned();
                if lines.send(report).is_err() {
                    break;
                }
            }
        }
    });
    reports
}

/// The next report, failing (after killing the child) when it takes too long or the child died.
fn next_report(child: &mut Child, reports: &mpsc::Receiver<String>) -> String {
    match reports.recv_timeout(CHILD_TIMEOUT) {
        Ok(report) => report,
        Err(err) => {
            let _ = child.kill();
            let status = child.wait();
            panic!("no report from the child ({err}); it exited with {status:?}");
        }
    }
}

/// A child's report line on stdout.
fn report(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{REPORT_MARK}{line}");
    let _ = stdout.flush();
}

/// A small deterministic generator (xorshift64*); the seed is printed so a failure can be
/// replayed with `FLIGHTLOG_JOURNAL_TEST_SEED`.
struct Rng(u64);

impl Rng {
    fn from_env_or_clock() -> Self {
        let seed = std::env::var("FLIGHTLOG_JOURNAL_TEST_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(1, |since| since.as_nanos() as u64)
            });
        println!("journal test seed: {seed}");
        Self(seed | 1)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound.max(1)
    }
}

/// Events as the JSON the reference would print (key order included), for exact comparison.
fn as_json(events: &[EngagementEvent]) -> String {
    serde_json::to_string(events).expect("events serialize")
}

/// Where `found` parts from the `before` and `after` lists, short enough for a failure message.
fn describe_mismatch(
    found: &[EngagementEvent],
    before: &[EngagementEvent],
    after: &[EngagementEvent],
) -> String {
    let first_difference = |expected: &[EngagementEvent]| {
        found
            .iter()
            .zip(expected)
            .position(|(found, expected)| {
                as_json(std::slice::from_ref(found)) != as_json(std::slice::from_ref(expected))
            })
            .unwrap_or(found.len().min(expected.len()))
    };
    format!(
        "found {} events (before: {}, after: {}); first difference from before at index {}, \
         from after at index {}",
        found.len(),
        before.len(),
        after.len(),
        first_difference(before),
        first_difference(after)
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Sixteen optimistic appenders on one engagement.
// ---------------------------------------------------------------------------------------------

const APPENDERS: usize = 16;
const CONTENDED_ROUNDS: i64 = 64;

/// What one appender got in one round.
#[derive(Debug)]
enum Claim {
    Won(i64),
    Lost { expected: i64, actual: i64 },
    Failed(String),
}

#[test]
fn sixteen_expected_seq_appenders_get_exactly_one_winner_per_seq() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let journal = Arc::new(open_journal(&dir.path().join("journal.db")));
    let claims: Vec<Vec<Claim>> = runtime().block_on(async {
        // Every round, all sixteen claim the same seq at once; the barrier also makes round
        // `s + 1` start only after every claim of round `s` was answered.
        let barrier = Arc::new(tokio::sync::Barrier::new(APPENDERS));
        let tasks: Vec<_> = (0..APPENDERS)
            .map(|appender| {
                let journal = Arc::clone(&journal);
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    let mut claims = Vec::new();
                    for seq in 0..CONTENDED_ROUNDS {
                        barrier.wait().await;
                        let claim = input("contended", seq, "claim", json!({"appender": appender}))
                            .with_expected_seq(seq);
                        claims.push(match journal.append(claim).await {
                            Ok(event) => Claim::Won(event.seq),
                            Err(JournalError::WrongExpectedSeq { expected, actual }) => {
                                Claim::Lost { expected, actual }
                            }
                            Err(other) => Claim::Failed(other.to_string()),
                        });
                    }
                    claims
                })
            })
            .collect();
        let mut claims = Vec::new();
        for task in tasks {
            claims.push(task.await.expect("an appender task finishes"));
        }
        claims
    });

    let mut winners: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
    for (appender, appender_claims) in claims.iter().enumerate() {
        for (round, claim) in appender_claims.iter().enumerate() {
            let seq = round as i64;
            match claim {
                Claim::Won(won) => {
                    assert_eq!(*won, seq, "appender {appender} won a seq it did not claim");
                    winners.entry(seq).or_default().push(appender);
                }
                Claim::Lost { expected, actual } => {
                    assert_eq!((*expected, *actual), (seq, seq + 1), "appender {appender}");
                }
                Claim::Failed(err) => panic!("appender {appender}, seq {seq}: {err}"),
            }
        }
    }
    for seq in 0..CONTENDED_ROUNDS {
        let won_by = winners.get(&seq).map_or(0, Vec::len);
        assert_eq!(won_by, 1, "seq {seq} has {won_by} winners: {winners:?}");
    }

    let stored = runtime()
        .block_on(journal.read("contended"))
        .expect("the engagement reads");
    assert_eq!(stored.len() as i64, CONTENDED_ROUNDS);
    for (index, event) in stored.iter().enumerate() {
        assert_eq!(event.seq, index as i64, "seqs are dense");
        let winner = winners[&event.seq][0];
        assert_eq!(event.data.get("appender"), Some(&json!(winner)));
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Two OS processes appending to the same engagements.
// ---------------------------------------------------------------------------------------------

const TWO_PROCESSES_ROLE: &str = "journal_two_processes_writer";
const TWO_PROCESSES_CHILD: &str = "journal_two_processes_child_writer";
const SHARED_ENGAGEMENTS: usize = 4;
const TASKS_PER_PROCESS: usize = 4;
/// How long each process appends …
const LOAD_DURATION: Duration = Duration::from_secs(2);
/// … unless each of its tasks has done this many rounds first.
const MAX_ROUNDS_PER_TASK: usize = 1_500;

fn shared_engagement(index: usize) -> String {
    format!("shared-{index}")
}

/// One acknowledged append.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Ack {
    engagement: usize,
    seq: i64,
    task: usize,
    round: usize,
}

#[derive(Debug, Default)]
struct WriterReport {
    acks: Vec<Ack>,
    /// Optimistic appends another writer beat to their seq (expected, not an error).
    conflicts: u64,
    errors: Vec<String>,
}

/// Append to the shared engagements from several tasks for [`LOAD_DURATION`]. Every eighth
/// append is optimistic (`expected_seq` = the length just read), so the two processes also race
/// for seqs; every sixteenth acknowledged append is read back.
async fn append_to_shared_engagements(
    journal: Arc<SqliteEngagementJournal>,
    tag: &str,
) -> WriterReport {
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|task| {
            let journal = Arc::clone(&journal);
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let mut report = WriterReport::default();
                let mut known_len = [0_i64; SHARED_ENGAGEMENTS];
                for round in 0..MAX_ROUNDS_PER_TASK {
                    if started.elapsed() >= LOAD_DURATION {
                        break;
                    }
                    let engagement = (task + round) % SHARED_ENGAGEMENTS;
                    let id = shared_engagement(engagement);
                    let data = json!({"tag": tag, "task": task, "round": round});
                    let mut append = input(&id, round as i64, "step", data);
                    let optimistic = round % 8 == 7;
                    if optimistic {
                        match journal.read_from(&id, known_len[engagement]).await {
                            Ok(tail) => known_len[engagement] += tail.len() as i64,
                            Err(err) => report.errors.push(format!("read_from {id}: {err}")),
                        }
                        append = append.with_expected_seq(known_len[engagement]);
                    }
                    match journal.append(append).await {
                        Ok(event) => {
                            known_len[engagement] = known_len[engagement].max(event.seq + 1);
                            if round % 16 == 0 {
                                match journal.read_from(&id, event.seq).await {
                                    Ok(tail) if tail.first() == Some(&event) => {}
                                    Ok(tail) => report.errors.push(format!(
                                        "{id} seq {}: read back {:?}",
                                        event.seq,
                                        tail.first()
                                    )),
                                    Err(err) => report.errors.push(format!("read {id}: {err}")),
                                }
                            }
                            report.acks.push(Ack {
                                engagement,
                                seq: event.seq,
                                task,
                                round,
                            });
                        }
                        Err(JournalError::WrongExpectedSeq { .. }) if optimistic => {
                            report.conflicts += 1;
                        }
                        Err(err) => report.errors.push(format!("append {id}: {err}")),
                    }
                }
                report
            })
        })
        .collect();
    let mut total = WriterReport::default();
    for task in tasks {
        match task.await {
            Ok(report) => {
                total.acks.extend(report.acks);
                total.conflicts += report.conflicts;
                total.errors.extend(report.errors);
            }
            Err(err) => total.errors.push(format!("task panicked: {err}")),
        }
    }
    total
}

/// The child's side: open the file, say `ready`, wait for `go` on stdin, append, report.
#[test]
fn journal_two_processes_child_writer() {
    if !is_child(TWO_PROCESSES_ROLE) {
        return;
    }
    let journal = Arc::new(open_journal(Path::new(&child_env(DB_ENV))));
    let tag = child_env(ARG_ENV);
    report("ready");
    let mut go = String::new();
    let _ = std::io::stdin().read_line(&mut go);
    let outcome = runtime().block_on(append_to_shared_engagements(journal, &tag));
    for ack in &outcome.acks {
        report(&format!(
            "ack {} {} {} {}",
            ack.engagement, ack.seq, ack.task, ack.round
        ));
    }
    for err in &outcome.errors {
        report(&format!("error {err}"));
    }
    report(&format!("done {}", outcome.conflicts));
}

fn parse_ack(text: &str) -> Ack {
    let fields: Vec<&str> = text.split(' ').collect();
    let number = |index: usize| -> i64 {
        fields
            .get(index)
            .and_then(|field| field.parse().ok())
            .unwrap_or_else(|| panic!("malformed ack report {text:?}"))
    };
    Ack {
        engagement: number(0) as usize,
        seq: number(1),
        task: number(2) as usize,
        round: number(3) as usize,
    }
}

#[test]
fn two_processes_appending_to_the_same_engagements_keep_seqs_dense_and_unique() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("shared.db");
    let journal = Arc::new(open_journal(&path));
    let mut child = spawn_child(TWO_PROCESSES_CHILD, TWO_PROCESSES_ROLE, &path, "b");
    let reports = child_reports(&mut child);
    assert_eq!(next_report(&mut child, &reports), "ready");
    {
        let mut stdin = child.stdin.take().expect("the child's stdin is piped");
        stdin.write_all(b"go\n").expect("the child reads go");
    }
    let runtime = runtime();
    let ours = runtime.block_on(append_to_shared_engagements(Arc::clone(&journal), "a"));

    let mut theirs = WriterReport::default();
    loop {
        let line = next_report(&mut child, &reports);
        if let Some(ack) = line.strip_prefix("ack ") {
            theirs.acks.push(parse_ack(ack));
        } else if let Some(err) = line.strip_prefix("error ") {
            theirs.errors.push(err.to_owned());
        } else if let Some(conflicts) = line.strip_prefix("done ") {
            theirs.conflicts = conflicts.parse().expect("a conflict count");
            break;
        }
    }
    let status = child.wait().expect("the child exits");
    assert!(status.success(), "the child failed: {status}");
    assert!(ours.errors.is_empty(), "parent errors: {:?}", ours.errors);
    assert!(
        theirs.errors.is_empty(),
        "child errors: {:?}",
        theirs.errors
    );
    assert!(!ours.acks.is_empty() && !theirs.acks.is_empty());

    // Every stored event is one acknowledged append, at the seq its writer was told.
    let mut expected: HashMap<(usize, i64), (&str, &Ack)> = HashMap::new();
    for (tag, writer) in [("a", &ours), ("b", &theirs)] {
        for ack in &writer.acks {
            let previous = expected.insert((ack.engagement, ack.seq), (tag, ack));
            assert!(
                previous.is_none(),
                "seq {} of engagement {} acknowledged twice",
                ack.seq,
                ack.engagement
            );
        }
    }
    let mut stored_total = 0;
    let mut tag_switches = 0;
    for engagement in 0..SHARED_ENGAGEMENTS {
        let id = shared_engagement(engagement);
        let events = runtime
            .block_on(journal.read(&id))
            .expect("the engagement reads");
        stored_total += events.len();
        let mut seen = HashSet::new();
        for (index, event) in events.iter().enumerate() {
            assert_eq!(event.seq, index as i64, "{id}: seqs are dense from 0");
            let (tag, ack) = expected
                .get(&(engagement, event.seq))
                .unwrap_or_else(|| panic!("{id} seq {}: stored but never acknowledged", event.seq));
            let data = json!({"tag": tag, "task": ack.task, "round": ack.round});
            assert_eq!(
                Value::Object((*event.data).clone()),
                data,
                "{id} seq {}",
                event.seq
            );
            assert!(
                seen.insert((*tag, ack.task, ack.round)),
                "{id}: an append stored twice"
            );
            if index > 0 && events[index - 1].data.get("tag") != event.data.get("tag") {
                tag_switches += 1;
            }
        }
    }
    assert_eq!(
        stored_total,
        expected.len(),
        "every acknowledged append is stored"
    );
    assert!(tag_switches > 0, "the two processes never interleaved");
    println!(
        "two processes: {} + {} appends, {} optimistic conflicts, {tag_switches} switches",
        ours.acks.len(),
        theirs.acks.len(),
        ours.conflicts + theirs.conflicts
    );
}

// ---------------------------------------------------------------------------------------------
// 3. SIGKILL mid-compaction.
// ---------------------------------------------------------------------------------------------

const CRASH_ROLE: &str = "journal_crash_compactor";
const CRASH_CHILD: &str = "journal_crash_child_compactor";
const CRASH_ROUNDS: usize = 10;
const CRASH_ENGAGEMENTS: usize = 6;
const CRASH_EVENTS: usize = 200;

fn crash_engagement(round: usize, index: usize) -> String {
    format!("crash-{round}-{index}")
}

/// A finished, compactable engagement of [`CRASH_EVENTS`] events: mail, turns, tools, board
/// writes and budget charges, then a completed close (and one turn after it, so compaction also
/// moves the engagement's last `at`).
fn finished_engagement(id: &str, base_at: i64) -> Vec<AppendInput> {
    let mut inputs = vec![input(
        id,
        base_at,
        "engagement_opened",
        json!({"initiator": {"kind": "human", "id": "u1", "trust": "group_member"},
               "venue": {"kind": "chat", "id": "c1"}}),
    )];
    for step in 0..CRASH_EVENTS - 3 {
        let at = base_at + 1 + step as i64;
        let (kind, data) = match step % 6 {
            0 => (
                "mail_sent",
                json!({"mailId": format!("m{step}"), "from": "agent:planner",
                       "to": "agent:coder", "kind": "ask", "body": "please look"}),
            ),
            1 => (
                "mail_delivered",
                json!({"mailId": format!("m{}", step - 1), "actor": "agent:coder"}),
            ),
            2 => ("turn_started", json!({"actor": "agent:coder"})),
            3 => (
                "budget_charged",
                json!({"usage": {"tokens": step, "modelCalls": 1, "wallMs": 2.5}}),
            ),
            4 => (
                "tool_called",
                json!({"actor": "agent:coder", "tool": "grep"}),
            ),
            _ => (
                "board_written",
                json!({"key": format!("k{}", step % 7), "content": format!("v{step}"),
                       "actor": "agent:coder", "kind": "note"}),
            ),
        };
        inputs.push(input(id, at, kind, data));
    }
    let end = base_at + CRASH_EVENTS as i64;
    inputs.push(input(
        id,
        end,
        "engagement_closed",
        json!({"status": "completed", "reason": "done"}),
    ));
    inputs.push(input(
        id,
        end + 1,
        "turn_started",
        json!({"actor": "agent:late"}),
    ));
    inputs
}

/// The child's side: compact the round's engagements one by one (reporting each), then keep
/// compacting them (no-ops now) until it is killed.
#[test]
fn journal_crash_child_compactor() {
    if !is_child(CRASH_ROLE) {
        return;
    }
    let journal = open_journal(Path::new(&child_env(DB_ENV)));
    let round: usize = child_env(ARG_ENV).parse().expect("a round number");
    let runtime = runtime();
    report("ready");
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let mut first_pass = true;
    while Instant::now() < deadline {
        for index in 0..CRASH_ENGAGEMENTS {
            if first_pass {
                report(&format!("compacting {index}"));
            }
            let started = Instant::now();
            let outcome = runtime.block_on(journal.compact(&crash_engagement(round, index)));
            match outcome {
                Ok(_) if first_pass => report(&format!(
                    "compacted {index} {}",
                    started.elapsed().as_micros()
                )),
                Ok(_) => {}
                Err(err) => report(&format!("error {err}")),
            }
        }
        first_pass = false;
    }
}

#[test]
fn a_compaction_killed_at_any_moment_leaves_each_engagement_wholly_before_or_after() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path: PathBuf = dir.path().join("crash.db");
    let mut rng = Rng::from_env_or_clock();
    let runtime = runtime();
    let (mut saw_before, mut saw_after) = (0, 0);
    let mut killed_mid_compaction = 0;
    // Of the compactions in flight at the kill: [found before, found after].
    let mut in_flight_outcomes = [0_usize; 2];
    let mut compaction_micros: Vec<Option<u64>> = Vec::new();
    for round in 0..CRASH_ROUNDS {
        // Fill the round's engagements, and compute what compaction must produce.
        let (before, after) = runtime.block_on(async {
            let journal = Arc::new(open_journal(&path));
            let reference = InMemoryEngagementJournal::default();
            let mut fills = tokio::task::JoinSet::new();
            let mut before = Vec::new();
            let mut after = Vec::new();
            for index in 0..CRASH_ENGAGEMENTS {
                let id = crash_engagement(round, index);
                let inputs =
                    finished_engagement(&id, 1_000_000 * round as i64 + 10_000 * index as i64);
                for input in inputs.clone() {
                    reference
                        .append(input)
                        .await
                        .expect("the reference appends");
                }
                before.push(reference.read(&id).await.expect("the reference reads"));
                assert!(reference
                    .compact(&id)
                    .await
                    .expect("the reference compacts"));
                after.push(reference.read(&id).await.expect("the reference reads"));
                let journal = Arc::clone(&journal);
                fills.spawn(async move {
                    for input in inputs {
                        journal.append(input).await.expect("the fill appends");
                    }
                });
            }
            while let Some(filled) = fills.join_next().await {
                filled.expect("a fill task finishes");
            }
            (before, after)
        });

        let mut child = spawn_child(CRASH_CHILD, CRASH_ROLE, &path, &round.to_string());
        let reports = child_reports(&mut child);
        assert_eq!(next_report(&mut child, &reports), "ready");
        // Let the child finish `wait_for` compactions, then kill it a random moment later:
        // usually in the middle of the next one.
        let wait_for = rng.below(CRASH_ENGAGEMENTS as u64 - 1) as usize;
        let mut compacted = 0;
        while compacted < wait_for {
            let line = next_report(&mut child, &reports);
            assert!(line.starts_with("compact"), "child: {line}");
            if let Some(done) = line.strip_prefix("compacted ") {
                compacted += 1;
                compaction_micros.push(done.split(' ').nth(1).and_then(|m| m.parse().ok()));
            }
        }
        // Spread the kills over the whole of a compaction (reading, rewriting, committing) and a
        // little past it.
        let timed: Vec<u64> = compaction_micros.iter().flatten().copied().collect();
        let typical = timed.iter().sum::<u64>() / (timed.len() as u64).max(1);
        let window = if timed.is_empty() {
            4_000
        } else {
            typical * 5 / 4
        };
        std::thread::sleep(Duration::from_micros(rng.below(window.max(100))));
        child.kill().expect("SIGKILL reaches the child");
        let _ = child.wait();
        // The child is gone, so its pipe ends and this drains every line it wrote.
        let mut last = String::new();
        while let Ok(line) = reports.recv_timeout(CHILD_TIMEOUT) {
            assert!(!line.starts_with("error"), "child: {line}");
            last = line;
        }
        let in_flight = last
            .strip_prefix("compacting ")
            .and_then(|index| index.parse::<usize>().ok());
        killed_mid_compaction += usize::from(in_flight.is_some());

        // A fresh handle, as a restarted process would open the file.
        runtime.block_on(async {
            let journal = open_journal(&path);
            for index in 0..CRASH_ENGAGEMENTS {
                let id = crash_engagement(round, index);
                let found = journal.read(&id).await.expect("the engagement reads");
                let (pre, post) = (as_json(&before[index]), as_json(&after[index]));
                let was_compacted = if as_json(&found) == post {
                    saw_after += 1;
                    true
                } else {
                    assert!(
                        as_json(&found) == pre,
                        "{id} is neither before nor after compaction: {}",
                        describe_mismatch(&found, &before[index], &after[index])
                    );
                    saw_before += 1;
                    false
                };
                if in_flight == Some(index) {
                    in_flight_outcomes[usize::from(was_compacted)] += 1;
                }
                let compacted = journal.compact(&id).await.expect("compaction runs");
                assert_eq!(compacted, !was_compacted, "{id}: compact() after the crash");
                assert_eq!(
                    as_json(&journal.read(&id).await.expect("reads")),
                    post,
                    "{id}"
                );
                assert!(
                    !journal.compact(&id).await.expect("compaction runs"),
                    "{id}: twice"
                );
                assert_eq!(
                    as_json(&journal.read(&id).await.expect("reads")),
                    post,
                    "{id}"
                );
                // The counter row moved with the rewrite: the next append follows the survivors.
                let next = journal
                    .append(input(&id, 1, "note", json!({})))
                    .await
                    .expect("appending after compaction");
                assert_eq!(next.seq, after[index].len() as i64, "{id}");
            }
        });
    }
    let timed: Vec<u64> = compaction_micros.iter().flatten().copied().collect();
    println!(
        "crash: {saw_before} engagements found before compaction, {saw_after} after; \
         {killed_mid_compaction} of {CRASH_ROUNDS} kills landed while a compaction was in \
         flight (one takes ~{} µs), which then was found before {} times, after {} times",
        timed.iter().sum::<u64>() / (timed.len() as u64).max(1),
        in_flight_outcomes[0],
        in_flight_outcomes[1]
    );
    assert!(
        saw_after > 0,
        "no compaction ever committed before the kill"
    );
    // The point of the test is kills in the middle of a compaction: most rounds must land one
    // (every round did in practice; a kill between two compactions proves less).
    assert!(
        killed_mid_compaction * 2 >= CRASH_ROUNDS,
        "only {killed_mid_compaction} of {CRASH_ROUNDS} kills landed while a compaction was in \
         flight"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Subscriptions.
// ---------------------------------------------------------------------------------------------

const SUBSCRIBED_ENGAGEMENTS: usize = 4;
const SUBSCRIBED_TASKS: usize = 4;
const SUBSCRIBED_ROUNDS: usize = 60;
/// Below the ~54 appends each engagement gets, so some fail with `JournalFull` (and must not be
/// delivered).
const SUBSCRIBED_MAX_EVENTS: u64 = 40;
const SENTINEL: &str = "sentinel";

#[test]
fn subscribers_get_each_committed_event_once_in_seq_order_after_commit() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("subscribed.db")))
        .expect("the database opens");
    let retention = RetentionConfig {
        max_events_per_engagement: SUBSCRIBED_MAX_EVENTS,
        ..RetentionConfig::default()
    };
    let journal = Arc::new(SqliteEngagementJournal::new(db, retention));
    runtime().block_on(async {
        let mut subscription = journal.subscribe();
        // The subscriber checks, as each event arrives, that it is already readable.
        let receiver = {
            let journal = Arc::clone(&journal);
            tokio::spawn(async move {
                let mut received = Vec::new();
                loop {
                    let event = match subscription.recv().await {
                        Ok(committed) => committed.event,
                        Err(RecvError::Lagged(missed)) => panic!("lagged by {missed}"),
                        Err(RecvError::Closed) => panic!("the journal closed"),
                    };
                    if &*event.engagement_id == SENTINEL {
                        return (received, subscription);
                    }
                    let stored = journal
                        .read_from(&event.engagement_id, event.seq)
                        .await
                        .expect("the subscriber reads");
                    assert_eq!(
                        stored.first(),
                        Some(&event),
                        "delivered before it was readable"
                    );
                    received.push(event);
                }
            })
        };

        let appenders: Vec<_> = (0..SUBSCRIBED_TASKS)
            .map(|task| {
                let journal = Arc::clone(&journal);
                tokio::spawn(async move {
                    let (mut acked, mut full, mut wrong) = (Vec::new(), 0, 0);
                    for round in 0..SUBSCRIBED_ROUNDS {
                        let id = format!("sub-{}", (task + round) % SUBSCRIBED_ENGAGEMENTS);
                        let mut append = input(&id, round as i64, "step", json!({"task": task}));
                        if round % 10 == 9 {
                            append = append.with_expected_seq(-1);
                        }
                        match journal.append(append).await {
                            Ok(event) => acked.push(event),
                            Err(JournalError::JournalFull { .. }) => full += 1,
                            Err(JournalError::WrongExpectedSeq { .. }) => wrong += 1,
                            Err(err) => panic!("append: {err}"),
                        }
                    }
                    (acked, full, wrong)
                })
            })
            .collect();
        let (mut acked, mut full, mut wrong) = (Vec::new(), 0, 0);
        for appender in appenders {
            let (events, task_full, task_wrong) = appender.await.expect("an appender finishes");
            acked.extend(events);
            full += task_full;
            wrong += task_wrong;
        }
        assert!(full > 0 && wrong > 0, "the failure paths were exercised");
        journal
            .append(input(SENTINEL, 0, "end", json!({})))
            .await
            .expect("the sentinel appends");
        let (received, mut subscription) = receiver.await.expect("the subscriber finishes");

        // Exactly the acknowledged events, each once, and per engagement in seq order.
        assert_eq!(
            received.len(),
            acked.len(),
            "one delivery per committed append"
        );
        let mut per_engagement: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for event in &received {
            per_engagement
                .entry(&event.engagement_id)
                .or_default()
                .push(event.seq);
        }
        for engagement in 0..SUBSCRIBED_ENGAGEMENTS {
            let id = format!("sub-{engagement}");
            let stored = journal.read(&id).await.expect("reads");
            let seqs: Vec<i64> = stored.iter().map(|event| event.seq).collect();
            assert_eq!(per_engagement.get(id.as_str()), Some(&seqs), "{id}");
            let delivered: Vec<&EngagementEvent> = received
                .iter()
                .filter(|event| *event.engagement_id == *id)
                .collect();
            assert!(
                delivered.iter().copied().eq(stored.iter()),
                "{id}: the stored events"
            );
        }
        let acked: HashSet<String> = acked
            .iter()
            .map(|event| as_json(std::slice::from_ref(event)))
            .collect();
        assert_eq!(acked.len(), received.len());

        assert!(
            subscription.try_recv().is_err(),
            "nothing after the sentinel"
        );

        // A compaction rewrite is not new events: nothing is sent for it, and the next append
        // is delivered at the compacted length. (A second handle on the same file, with room for
        // a compactable engagement; its subscribers are its own.)
        let roomy = SqliteEngagementJournal::new(
            Arc::clone(journal.database()),
            RetentionConfig::default(),
        );
        let mut roomy_subscription = roomy.subscribe();
        for input in finished_engagement("sub-compact", 0) {
            roomy.append(input).await.expect("appends");
        }
        for expected_seq in 0..CRASH_EVENTS as i64 {
            let event = roomy_subscription.recv().await.expect("delivered").event;
            assert_eq!(
                (&*event.engagement_id, event.seq),
                ("sub-compact", expected_seq)
            );
        }
        assert!(roomy.compact("sub-compact").await.expect("compacts"));
        let compacted_len = roomy.read("sub-compact").await.expect("reads").len() as i64;
        let next = roomy
            .append(input("sub-compact", 9, "after", json!({})))
            .await
            .expect("appends");
        assert_eq!(next.seq, compacted_len);
        let delivered = roomy_subscription.recv().await.expect("delivered").event;
        assert_eq!(delivered, next, "nothing was sent for the rewrite");
        assert!(roomy_subscription.try_recv().is_err());
        assert!(
            subscription.try_recv().is_err(),
            "another handle's appends are not ours"
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 5. Summary of a large stored engagement (its speed is measured by the journal benchmark, not
//    asserted here).
// ---------------------------------------------------------------------------------------------

/// Summarizing ~1,000 events read back from disk equals the pure summary of those events.
#[test]
fn summarizing_a_thousand_stored_events_matches_the_pure_summary() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let journal = open_journal(&dir.path().join("summary.db"));
    let runtime = runtime();
    let id = "big";
    runtime.block_on(async {
        let mut inputs = Vec::new();
        for copy in 0..5 {
            let inputs_of_copy = finished_engagement(id, copy * 1_000);
            // One open and one close for the whole engagement.
            let skip_open = usize::from(copy > 0);
            let keep = inputs_of_copy.len() - if copy < 4 { 2 } else { 0 };
            inputs.extend(inputs_of_copy.into_iter().take(keep).skip(skip_open));
        }
        for input in inputs {
            journal.append(input).await.expect("appends");
        }
    });
    let events = runtime.block_on(journal.read(id)).expect("reads");
    assert!(
        (950..=1_050).contains(&events.len()),
        "{} events",
        events.len()
    );
    let expected = summarize_engagement_events(id, &events);
    let summary = runtime.block_on(journal.summarize(id)).expect("summarizes");
    assert_eq!(summary.as_ref(), Some(&expected));
}

/// A journal and the backend's name, for failure messages.
type NamedJournal = (&'static str, Arc<dyn EngagementJournal>);

/// A fresh in-memory journal and a fresh SQLite one (in a scratch folder the caller removes),
/// for a test that holds both backends to one rule.
fn both_journals(tag: &str) -> (PathBuf, Vec<NamedJournal>) {
    let folder =
        std::env::temp_dir().join(format!("flightlog-journal-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).expect("scratch folder");
    let journals: Vec<NamedJournal> = vec![
        (
            "memory",
            Arc::new(InMemoryEngagementJournal::new(RetentionConfig::default())),
        ),
        ("sqlite", Arc::new(open_journal(&folder.join("journal.db")))),
    ];
    (folder, journals)
}

/// `read_tail`'s generation, on both backends: the same while an engagement only grows, new
/// when compaction renumbers it, gone when a prune deletes it, and new again (not the old one)
/// when an append re-creates it; the doorbell rings for the compaction and the prune.
#[test]
fn the_generation_changes_exactly_when_seqs_are_given_out_again() {
    let (folder, journals) = both_journals("generation");
    let rt = runtime();
    for (name, journal) in journals {
        rt.block_on(async {
            let mut doorbell = journal.commit_doorbell();
            doorbell.borrow_and_update();
            let mut subscription = journal.subscribe();
            let tail = journal
                .read_tail("g", 0, TailBound::ALL)
                .await
                .expect("read");
            assert_eq!(tail.generation, None, "{name}: unknown engagement");
            assert!(tail.events.is_empty());
            let events = finished_engagement("g", 1_000);
            let count = events.len() as i64;
            for event in events {
                journal.append(event).await.expect("append");
            }
            let first = journal
                .read_tail("g", 0, TailBound::ALL)
                .await
                .expect("read");
            let generation = first.generation.expect("a generation");
            assert_eq!(first.events.len() as i64, count, "{name}");
            let tail = journal
                .read_tail("g", count - 2, TailBound::ALL)
                .await
                .expect("read");
            assert_eq!(tail.generation, Some(generation), "{name}: appends keep it");
            // Each append was published with the generation a read reports (also the first,
            // which created the engagement).
            let mut published = Vec::new();
            while let Ok(committed) = subscription.try_recv() {
                published.push((committed.event.seq, committed.generation));
            }
            let expected: Vec<_> = (0..count).map(|seq| (seq, generation)).collect();
            assert_eq!(published, expected, "{name}");
            assert_eq!(
                tail.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
                vec![count - 2, count - 1],
                "{name}"
            );
            // Past the end: no events, the generation still told.
            let past = journal
                .read_tail("g", count + 5, TailBound::ALL)
                .await
                .expect("read");
            assert_eq!(past.generation, Some(generation), "{name}");
            assert!(past.events.is_empty(), "{name}");

            assert!(journal.compact("g").await.expect("compact"), "{name}");
            let compacted = journal
                .read_tail("g", 0, TailBound::ALL)
                .await
                .expect("read");
            let renumbered = compacted.generation.expect("a generation");
            assert_ne!(renumbered, generation, "{name}: compaction renews it");
            // An append after the compaction is published under the new numbering.
            let after = journal
                .append(input("g", 1, "note", json!({"after": "compaction"})))
                .await
                .expect("append after the compaction");
            let committed = subscription.try_recv().expect("published");
            assert_eq!(
                (committed.event.seq, committed.generation),
                (after.seq, renumbered),
                "{name}: the compacted numbering's generation"
            );
            let compacted = journal
                .read_tail("g", 0, TailBound::ALL)
                .await
                .expect("read");
            assert_eq!(compacted.events, journal.read("g").await.expect("read"));
            tokio::time::timeout(Duration::from_secs(5), doorbell.changed())
                .await
                .unwrap_or_else(|_| panic!("{name}: no ring for the compaction"))
                .expect("the doorbell is open");

            let removed = journal.prune(i64::MAX / 2).await.expect("prune everything");
            assert_eq!(removed, 1, "{name}");
            let gone = journal
                .read_tail("g", 0, TailBound::ALL)
                .await
                .expect("read");
            assert_eq!(gone, Default::default(), "{name}: pruned");
            tokio::time::timeout(Duration::from_secs(5), doorbell.changed())
                .await
                .unwrap_or_else(|_| panic!("{name}: no ring for the prune"))
                .expect("the doorbell is open");

            journal
                .append(input("g", 1, "note", json!({"again": true})))
                .await
                .expect("re-create");
            let recreated = journal
                .read_tail("g", 0, TailBound::ALL)
                .await
                .expect("read");
            let fresh = recreated.generation.expect("a generation");
            assert!(
                fresh != generation && fresh != renumbered,
                "{name}: a re-created engagement gets a generation of its own"
            );
            let committed = subscription.try_recv().expect("published");
            assert_eq!(
                (committed.event.seq, committed.generation),
                (0, fresh),
                "{name}: the re-created numbering's generation"
            );
            assert_eq!(recreated.events.len(), 1, "{name}");
            assert_eq!(recreated.events[0].seq, 0, "{name}");
        });
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// `read_tail` returns at most what its bound allows, on both backends: `max_events` events,
/// and no more once the data read passes `max_bytes` (the event that passes it is the last; the
/// first always comes); reading on from after the last event returned gives the rest, each
/// event once. A live stream reads its engagement this way, so a slow client holds one page,
/// not the whole engagement.
#[test]
fn a_tail_read_stops_at_its_bound_and_the_next_read_goes_on_from_there() {
    let (folder, journals) = both_journals("tail-bound");
    let rt = runtime();
    for (name, journal) in journals {
        rt.block_on(async {
            // 30 events with about 1 KB of data each.
            for seq in 0..30 {
                journal
                    .append(input("g", seq, "note", json!({"text": "x".repeat(1_000)})))
                    .await
                    .expect("append");
            }
            let by_count = TailBound {
                max_events: 7,
                max_bytes: usize::MAX,
            };
            let by_bytes = TailBound {
                max_events: usize::MAX,
                max_bytes: 4_500,
            };
            for (bound, page_len) in [(by_count, 7), (by_bytes, 5)] {
                let mut seqs = Vec::new();
                let mut generation = None;
                loop {
                    let next = seqs.last().map_or(0, |seq| seq + 1);
                    let tail = journal.read_tail("g", next, bound).await.expect("read");
                    assert!(tail.generation.is_some(), "{name}");
                    generation = generation.or(tail.generation);
                    assert_eq!(tail.generation, generation, "{name}");
                    if tail.events.is_empty() {
                        break;
                    }
                    assert!(tail.events.len() <= page_len, "{name}: {bound:?}");
                    if next + (page_len as i64) <= 30 {
                        assert_eq!(tail.events.len(), page_len, "{name}: {bound:?}");
                    }
                    seqs.extend(tail.events.iter().map(|event| event.seq));
                }
                assert_eq!(seqs, (0..30).collect::<Vec<i64>>(), "{name}: {bound:?}");
            }
            // One event larger than the byte bound still comes, alone.
            let tiny = TailBound {
                max_events: usize::MAX,
                max_bytes: 10,
            };
            let tail = journal.read_tail("g", 3, tiny).await.expect("read");
            assert_eq!(
                tail.events
                    .iter()
                    .map(|event| event.seq)
                    .collect::<Vec<_>>(),
                vec![3],
                "{name}"
            );
            // A bound of no events still tells the generation.
            let none = TailBound {
                max_events: 0,
                max_bytes: usize::MAX,
            };
            let tail = journal.read_tail("g", 0, none).await.expect("read");
            assert!(
                tail.events.is_empty() && tail.generation.is_some(),
                "{name}"
            );
        });
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// A budget total past `f64::MAX` makes compaction fail as the reference's does (a
/// `TypeError` from its copy step), on both backends, and leaves the engagement unchanged.
#[test]
fn a_total_that_is_not_finite_leaves_the_engagement_uncompacted() {
    let (folder, journals) = both_journals("not-finite");
    let rt = runtime();
    for (name, journal) in journals {
        rt.block_on(async {
            let mut events = vec![input("inf", 1, "engagement_opened", json!({}))];
            for _ in 0..2 {
                events.push(input("inf", 2, "budget_charged", json!({"tokens": 1e308})));
            }
            for _ in 0..18 {
                events.push(input("inf", 3, "tool_called", json!({})));
            }
            events.push(input(
                "inf",
                4,
                "engagement_closed",
                json!({"status": "completed"}),
            ));
            for event in events {
                journal.append(event).await.expect("append");
            }
            let before = journal.read("inf").await.expect("read");
            match journal.compact("inf").await {
                Err(JournalError::NotFinite { path }) => {
                    assert_eq!(path, "data.consumed.tokens", "{name}")
                }
                other => panic!("{name}: expected NotFinite, got {other:?}"),
            }
            assert_eq!(journal.read("inf").await.expect("read"), before, "{name}");
        });
    }
    let _ = std::fs::remove_dir_all(&folder);
}

/// The scheduled retention (`prune_idle`) of many engagements is many short transactions of
/// whole engagements (about 5,000 events each), so writers are never held up behind one long
/// delete: 2,000 engagements of 1,000 events in one transaction stalled every write for 3.6 s.
/// What is kept and what is counted stay as they were. The reference's `prune(now)` stays one
/// transaction (see `SqliteEngagementJournal::prune_by`).
#[test]
fn a_large_prune_is_many_short_transactions_of_whole_engagements() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("prune.db"))).expect("open");
    let retention = RetentionConfig {
        max_age_ms: 1_000,
        ..RetentionConfig::default()
    };
    let clock = Arc::new(flightlog_core::ManualClock::new(1_000));
    let journal =
        Arc::new(SqliteEngagementJournal::new(db.clone(), retention).with_clock(clock.clone()));
    runtime().block_on(async {
        let mut appends = Vec::new();
        for engagement in 0..12 {
            let journal = journal.clone();
            appends.push(tokio::spawn(async move {
                for seq in 0..1_000 {
                    journal
                        .append(input(&format!("old-{engagement}"), seq, "note", json!({})))
                        .await
                        .expect("append");
                }
            }));
        }
        for append in appends {
            append.await.expect("the appender finishes");
        }
        clock.set(5_000);
        journal
            .append(input("fresh", 5_000, "note", json!({})))
            .await
            .expect("append");
        let groups = || {
            db.writer_stats()
                .groups
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = groups();
        assert_eq!(journal.prune_idle(5_500).await.ok(), Some(12));
        let transactions = groups() - before;
        // 12,000 events at about 5,000 a transaction, then one that finds nothing left.
        assert!(
            (3..=5).contains(&transactions),
            "{transactions} transactions"
        );
        assert_eq!(
            journal.list_engagements(None).await.unwrap_or_default(),
            ["fresh"]
        );
        assert_eq!(
            journal.read("old-3").await.map(|events| events.len()).ok(),
            Some(0)
        );
        assert_eq!(journal.prune_idle(5_500).await.ok(), Some(0));
    });
}

/// `prune_idle` judges an engagement by when appends to it arrived (the journal's clock), not
/// by its events' `at`; and the engagements of a file an earlier flightlog wrote (schema 9, no
/// arrival times) count as appended to at the upgrade, so none is removed before a whole
/// retention period has passed since.
#[test]
fn prune_idle_judges_by_arrival_and_spares_an_upgraded_files_engagements() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("v9.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("open");
        flightlog_sqlite::migrate_up_to(&mut conn, 9).expect("schema version 9");
        conn.execute_batch(
            "INSERT INTO journal_engagements (engagement_key, engagement_id, next_seq, last_at)
               VALUES (1, 'old', 1, 5);
             INSERT INTO journal_events (engagement_key, seq, event_type, at, data)
               VALUES (1, 0, 'note', 5, '{}');",
        )
        .expect("an engagement of schema 9");
    }
    let upgraded_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64;
    let clock = Arc::new(flightlog_core::ManualClock::new(upgraded_at));
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("open and upgrade");
    let retention = RetentionConfig {
        max_age_ms: 60_000,
        ..RetentionConfig::default()
    };
    let journal = SqliteEngagementJournal::new(db.clone(), retention).with_clock(clock.clone());
    // An older flightlog still running on the file during the upgrade inserts a row without an
    // arrival time, its event backdated: it counts as arriving at the next prune, not as old.
    {
        let conn = rusqlite::Connection::open(&path).expect("a second connection");
        conn.busy_timeout(Duration::from_secs(10))
            .expect("busy timeout");
        conn.execute_batch(
            "INSERT INTO journal_engagements (engagement_id, next_seq, last_at) \
               VALUES ('older-writer', 1, 5);
             INSERT INTO journal_events (engagement_key, seq, event_type, at, data)
               SELECT engagement_key, 0, 'note', 5, '{}' FROM journal_engagements
               WHERE engagement_id = 'older-writer';",
        )
        .expect("a row as an older flightlog writes it");
    }
    runtime().block_on(async {
        // Appended now, dated at the epoch: live.
        journal
            .append(input("backdated", 0, "note", json!({})))
            .await
            .expect("append");
        assert_eq!(journal.prune_idle(upgraded_at + 30_000).await.ok(), Some(0));
        // The reference's prune would have removed both (their last `at` is ancient).
        clock.set(upgraded_at + 50_000);
        journal
            .append(input("backdated", 1, "note", json!({})))
            .await
            .expect("append");
        // A retention period after the upgrade: the old one goes; the one appended to since
        // and the older writer's (stamped by the prune at +30 s) stay.
        assert_eq!(journal.prune_idle(upgraded_at + 80_000).await.ok(), Some(1));
        let mut left = journal.list_engagements(None).await.unwrap_or_default();
        left.sort();
        assert_eq!(left, ["backdated", "older-writer"]);
        assert_eq!(
            journal.prune_idle(upgraded_at + 100_000).await.ok(),
            Some(1)
        );
        assert_eq!(
            journal.list_engagements(None).await.ok(),
            Some(vec!["backdated".to_owned()])
        );
        assert_eq!(
            journal.prune_idle(upgraded_at + 110_001).await.ok(),
            Some(1)
        );
        assert_eq!(journal.list_engagements(None).await.ok(), Some(vec![]));
    });
    runtime().block_on(db.close()).expect("close");
}

/// `prune_idle` finds engagements by the ten-second bucket of their arrival (schema version 14:
/// an append rewrites the indexed bucket only when it changes) but judges them by the exact
/// arrival time: two engagements in one bucket on either side of the cutoff, a negative time,
/// and an engagement whose last append came when the clock had gone back (its bucket moved
/// back with it, or it would never be found) are each removed at their exact millisecond.
#[test]
fn prune_idle_is_exact_to_the_millisecond_within_an_arrival_bucket() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("buckets.db"))).expect("open");
    let retention = RetentionConfig {
        max_age_ms: 60_000,
        ..RetentionConfig::default()
    };
    let clock = Arc::new(flightlog_core::ManualClock::new(0));
    let journal = SqliteEngagementJournal::new(db.clone(), retention).with_clock(clock.clone());
    runtime().block_on(async {
        for (engagement, arrival) in [
            ("early", 9_999),
            ("first-of-bucket", 10_000),
            ("last-of-bucket", 19_999),
            ("negative", -5),
            ("went-back", 45_000),
        ] {
            clock.set(arrival);
            journal
                .append(input(engagement, 0, "note", json!({})))
                .await
                .expect("append");
        }
        // The clock goes back: the last append to `went-back` arrived at 5,000.
        clock.set(5_000);
        journal
            .append(input("went-back", 1, "note", json!({})))
            .await
            .expect("append");
        let expect_removed = [
            (59_995, 0, vec![]),
            (59_996, 1, vec!["negative"]),
            (65_000, 0, vec![]),
            (65_001, 1, vec!["went-back"]),
            (69_999, 0, vec![]),
            (70_000, 1, vec!["early"]),
            (70_000, 0, vec![]),
            (70_001, 1, vec!["first-of-bucket"]),
            (79_999, 0, vec![]),
            (80_000, 1, vec!["last-of-bucket"]),
        ];
        let mut gone: Vec<&str> = Vec::new();
        for (now, removed, newly_gone) in expect_removed {
            assert_eq!(
                journal.prune_idle(now).await.ok(),
                Some(removed),
                "prune_idle({now})"
            );
            gone.extend(newly_gone);
            let mut expected: Vec<String> = [
                "early",
                "first-of-bucket",
                "last-of-bucket",
                "negative",
                "went-back",
            ]
            .into_iter()
            .filter(|engagement| !gone.contains(engagement))
            .map(str::to_owned)
            .collect();
            expected.sort();
            let mut left = journal.list_engagements(None).await.expect("list");
            left.sort();
            assert_eq!(left, expected, "after prune_idle({now})");
        }
    });
    runtime().block_on(db.close()).expect("close");
}

/// A database file in `dir` at schema version 13 (the last before the arrival buckets), with
/// `rows` (SQL) inserted: what an earlier flightlog left.
fn schema_13_file(dir: &Path, rows: &str) -> PathBuf {
    let path = dir.join("v13.db");
    let mut conn = rusqlite::Connection::open(&path).expect("open");
    flightlog_sqlite::migrate_up_to(&mut conn, 13).expect("schema version 13");
    conn.execute_batch(rows).expect("rows of schema 13");
    path
}

/// A file of schema version 13 keeps its engagements' arrival times through the upgrade to 14
/// (each gets the bucket of its time), so the scheduled retention removes each exactly when it
/// did before: not a millisecond early, not a bucket late.
#[test]
fn an_upgraded_files_arrival_times_keep_their_retention() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = schema_13_file(
        dir.path(),
        "INSERT INTO journal_engagements
           (engagement_key, engagement_id, next_seq, last_at, generation, appended_at)
           VALUES (1, 'old', 1, 5, 7, 123_456), (2, 'older', 1, 5, 7, -12_345);
         INSERT INTO journal_events (engagement_key, seq, event_type, at, data)
           VALUES (1, 0, 'note', 5, '{}'), (2, 0, 'note', 5, '{}');",
    );
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("open and upgrade");
    let retention = RetentionConfig {
        max_age_ms: 1_000,
        ..RetentionConfig::default()
    };
    let journal = SqliteEngagementJournal::new(db.clone(), retention);
    runtime().block_on(async {
        assert_eq!(journal.prune_idle(-11_345).await.ok(), Some(0));
        assert_eq!(journal.prune_idle(-11_344).await.ok(), Some(1));
        assert_eq!(journal.prune_idle(124_456).await.ok(), Some(0));
        assert_eq!(
            journal.list_engagements(None).await.ok(),
            Some(vec!["old".to_owned()])
        );
        assert_eq!(journal.prune_idle(124_457).await.ok(), Some(1));
        assert_eq!(journal.list_engagements(None).await.ok(), Some(vec![]));
    });
    runtime().block_on(db.close()).expect("close");
}

/// An older flightlog still running on the file while a newer one upgrades it to schema 14
/// keeps its scheduled retention: its prune names the arrival index (`INDEXED BY`), which kept
/// its name, so the statement it prepares still runs and finds what it found before (an
/// audit's finding: the old process's every pass failed with "no such index").
#[test]
fn an_older_flightlogs_prune_still_runs_on_an_upgraded_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = schema_13_file(
        dir.path(),
        "INSERT INTO journal_engagements
           (engagement_key, engagement_id, next_seq, last_at, generation, appended_at)
           VALUES (1, 'idle', 1, 5, 7, 1_000), (2, 'busy', 1, 5, 7, 90_000);",
    );
    let older = rusqlite::Connection::open(&path).expect("the older flightlog's connection");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("open and upgrade");
    // The older flightlog's statements, as schema 13 builds prepare them.
    older
        .execute(
            "UPDATE journal_engagements SET next_seq = 2, last_at = 6, appended_at = 95_000 \
             WHERE engagement_key = 2",
            [],
        )
        .expect("the older flightlog's append");
    let expired: Vec<(i64, i64)> = older
        .prepare(
            "SELECT engagement_key, next_seq FROM journal_engagements \
             INDEXED BY journal_engagements_by_arrival WHERE appended_at < ?1 \
             ORDER BY appended_at LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(rusqlite::params![50_000, 500], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect()
        })
        .expect("the older flightlog's prune query runs");
    assert_eq!(expired, [(1, 1)]);
    drop(older);
    runtime().block_on(db.close()).expect("close");
}

/// A journal handle's commit doorbell rings for the commits that wrote to the journal other than
/// by the appends its subscription carried (another process's or another handle's append, a
/// compaction, a prune): it rang for every commit, and the engagement streams' hub looked at
/// 1,000 heads up to 25 times a second for the appends it had routed. (Activity writes ring it
/// no more: `doorbell.rs`.)
#[test]
fn the_commit_doorbell_rings_for_journal_commits_its_subscription_did_not_carry() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("bell.db");
    let retention = RetentionConfig {
        max_age_ms: 1_000,
        ..RetentionConfig::default()
    };
    let ours_db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("open");
    let ours = SqliteEngagementJournal::new(Arc::clone(&ours_db), retention);
    let our_other_handle = SqliteEngagementJournal::new(ours_db, retention);
    // A second database handle has its own writer and connections, as another process would.
    let theirs_db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("open again");
    let theirs = SqliteEngagementJournal::new(theirs_db, retention);
    let watcher_period = Duration::from_millis(40);
    runtime().block_on(async {
        let mut bell = ours.commit_doorbell();
        // The watcher's first look learns where the count stands and rings for it (unless it
        // came before this subscription): wait for that ring rather than a fixed time a busy
        // machine may overrun.
        let _ = tokio::time::timeout(Duration::from_secs(5), bell.changed()).await;
        bell.borrow_and_update();

        // This handle's appends, which its subscription carries: no ring, each seen by the
        // watcher on its own. (One may ring, for nothing, if the watcher looks between its
        // commit and the writer's note of it: a preempted writer thread, under load; with the
        // doorbell ringing for every journal group there were 5.)
        let mut carried = ours.subscribe();
        let rings_before = *bell.borrow_and_update();
        for at in 0..5 {
            ours.append(input("mine", at, "note", json!({"text": "hi"})))
                .await
                .expect("append");
            tokio::time::sleep(watcher_period * 2).await;
        }
        tokio::time::sleep(watcher_period * 2).await;
        let rings = *bell.borrow_and_update() - rings_before;
        assert!(
            rings <= 2,
            "this handle's own appends rang its doorbell {rings} times"
        );
        assert_eq!(carried.try_recv().expect("carried").event.seq, 0);

        // Every other journal write rings: another handle's append, another process's, a
        // compaction and a prune, this handle's own included.
        our_other_handle
            .append(input("mine", 9, "note", json!({"text": "hi"})))
            .await
            .expect("append");
        rang(&mut bell, "another handle's append").await;
        theirs
            .append(input("yours", 1, "note", json!({"text": "hi"})))
            .await
            .expect("append");
        rang(&mut bell, "their append").await;
        for event in finished_engagement("done", 10) {
            theirs.append(event).await.expect("append");
        }
        tokio::time::sleep(watcher_period * 4).await;
        bell.borrow_and_update();
        assert!(ours.compact("done").await.expect("compact"));
        rang(&mut bell, "our compaction").await;
        assert!(ours.prune(1_000_000).await.expect("prune") > 0);
        rang(&mut bell, "our prune").await;
    });
}

/// Wait (at most 2 s) for `bell` to ring after `what`, and take the ring.
async fn rang(bell: &mut flightlog_core::journal::JournalDoorbell, what: &str) {
    tokio::time::timeout(Duration::from_secs(2), bell.changed())
        .await
        .unwrap_or_else(|_| panic!("{what} did not ring within 2 s"))
        .expect("the watcher lives");
    bell.borrow_and_update();
}

/// A read of a whole engagement that is large (more than 1,000 events, or more than 256 KiB of
/// data) goes apart from the runtime's worker after a first bounded look: whichever way it is
/// read, it is whole and in seq order, from any seq, and its summary is the in-memory
/// journal's.
#[test]
fn large_engagements_are_read_whole_from_any_seq() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let journal = open_journal(&dir.path().join("large.db"));
    let memory = InMemoryEngagementJournal::new(RetentionConfig::default());
    runtime().block_on(async {
        // Many small events; a few large ones; a small engagement read on the worker.
        let big_text = "x".repeat(200 * 1024);
        let mut appends = Vec::new();
        for seq in 0..1_500 {
            appends.push(input("many", seq, "note", json!({ "n": seq })));
        }
        for seq in 0..4 {
            appends.push(input("large", seq, "note", json!({ "text": big_text })));
        }
        for seq in 0..3 {
            appends.push(input("small", seq, "note", json!({ "n": seq })));
        }
        for append in appends {
            journal.append(append.clone()).await.expect("appended");
            memory.append(append).await.expect("appended");
        }
        for (engagement, count) in [("many", 1_500), ("large", 4), ("small", 3)] {
            for from_seq in [0, 1, count - 1, count, count + 5] {
                let events = journal.read_from(engagement, from_seq).await.expect("read");
                let seqs: Vec<i64> = events.iter().map(|event| event.seq).collect();
                let expected: Vec<i64> = (from_seq.min(count)..count).collect();
                assert!(
                    seqs == expected,
                    "{engagement} from {from_seq}: {} events, {:?} to {:?}",
                    seqs.len(),
                    seqs.first(),
                    seqs.last()
                );
            }
            let summary = journal.summarize(engagement).await.expect("summarized");
            let events = memory.read(engagement).await.expect("read");
            assert_eq!(
                summary,
                Some(summarize_engagement_events(engagement, &events)),
                "{engagement}"
            );
        }
        assert_eq!(journal.summarize("none").await.expect("summarized"), None);
    });
}
