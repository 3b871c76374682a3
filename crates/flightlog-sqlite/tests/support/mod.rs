//! Shared by the tests that run a second OS process: the child re-executes this test binary
//! with one child `#[test]` function selected and reports on stdout in marked lines, which the
//! parent reads as they arrive; afterwards both read the whole change log back with the same
//! checks (strictly increasing change ids, dense per-run seqs).

// Each test binary compiles its own copy of this module and uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;

use std::path::Path;
use std::sync::Arc;

use flightlog_core::activity::{
    ActivityChange, ActivityStore, ImportedEnd, ImportedSpan, SpanKind, SpanOrigin, SpanOutcome,
    SpanUsage, StartSpanInput,
};
use flightlog_core::SystemClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

/// Marks a child's report lines (libtest prints its own lines on the same stdout, and with
/// `--nocapture` its `test name ...` text can share a line with the first report).
pub const REPORT_MARK: &str = "@flightlog-child ";

/// Write one report line for the parent, flushed at once.
pub fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    // One write per line (well under the pipe's atomic size), flushed at once: the parent sees a
    // line only after the write it acknowledges returned `Ok`. A parent that stopped reading
    // fails on its side.
    let _ = out.write_all(format!("{REPORT_MARK}{line}\n").as_bytes());
    let _ = out.flush();
}

/// A spawned copy of this test binary running one child `#[test]` function.
pub struct ChildProcess {
    pub child: Child,
    /// The child's complete report lines (the text after [`REPORT_MARK`]), as they arrive.
    pub lines: mpsc::Receiver<String>,
    pub stderr: JoinHandle<String>,
}

/// The environment of a spawned writer process: its role (unset in an ordinary test run, where
/// the child test returns at once), the database file it opens, and its tag (the prefix of every
/// id it creates).
const CHILD_ENV: &str = "FLIGHTLOG_TEST_CHILD";
const DB_ENV: &str = "FLIGHTLOG_TEST_DB";
const TAG_ENV: &str = "FLIGHTLOG_TEST_TAG";

/// Run `test_name` of this test binary as the writer process `role` on the database file `db`,
/// with `tag`.
pub fn spawn_writer_process(test_name: &str, role: &str, db: &str, tag: &str) -> ChildProcess {
    spawn_child(
        test_name,
        &[(CHILD_ENV, role), (DB_ENV, db), (TAG_ENV, tag)],
    )
}

/// In the writer process spawned for `role`: the database path and the tag its parent passed.
/// `None` anywhere else (an ordinary test run, or a child of another role).
pub fn writer_process_args(role: &str) -> Option<(String, String)> {
    if std::env::var(CHILD_ENV).as_deref() != Ok(role) {
        return None;
    }
    let path = std::env::var(DB_ENV).expect("the parent passes the database path");
    let tag = std::env::var(TAG_ENV).expect("the parent passes the process tag");
    Some((path, tag))
}

fn spawn_child(test_name: &str, envs: &[(&str, &str)]) -> ChildProcess {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let mut command = Command::new(exe);
    command
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in envs {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("the test binary can be re-executed");
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let (send, lines) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                // A line cut short (the child was killed) was never completely reported: not an ack.
                Ok(0) | Err(_) => break,
                Ok(_) if !line.ends_with('\n') => break,
                Ok(_) => {
                    let Some(at) = line.find(REPORT_MARK) else {
                        continue;
                    };
                    let report = line[at + REPORT_MARK.len()..].trim_end().to_owned();
                    if send.send(report).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    ChildProcess {
        child,
        lines,
        stderr,
    }
}

/// Page size used when reading the whole change log back.
const CHANGE_PAGE: i64 = 500;

/// Page through the whole change log (a positive limit: a negative one drops rows from the end)
/// and check its order: change ids strictly increase, and in that order each run's seq is
/// exactly one more than the run's previous one, starting at 1.
pub async fn read_change_log(
    store: &dyn ActivityStore,
) -> (Vec<ActivityChange>, HashMap<String, i64>) {
    let mut all = Vec::new();
    let mut high_seq: HashMap<String, i64> = HashMap::new();
    let mut cursor = 0;
    loop {
        let page = store
            .changes_since(cursor, CHANGE_PAGE)
            .await
            .expect("the change log reads and every row decodes");
        if page.is_empty() {
            break;
        }
        assert!(
            page.len() as i64 <= CHANGE_PAGE,
            "a page is longer than its limit"
        );
        for change in page {
            assert!(
                change.change_id > cursor,
                "change id {} follows change id {cursor}: ids must strictly increase",
                change.change_id
            );
            cursor = change.change_id;
            let previous = high_seq.entry(change.run_id.clone()).or_insert(0);
            assert_eq!(
                change.seq,
                *previous + 1,
                "run {} has seq {} after seq {} (change id {}): per-run seqs must be gap-free, \
                 unique and in commit order",
                change.run_id,
                change.seq,
                previous,
                change.change_id
            );
            *previous = change.seq;
            all.push(change);
        }
    }
    let latest = store
        .latest_change_cursor()
        .await
        .expect("latest cursor reads");
    assert_eq!(
        latest, cursor,
        "the latest cursor is the last change id read"
    );
    (all, high_seq)
}

impl ChildProcess {
    /// Every report line until the child closes stdout, then its exit status and stderr; kills
    /// the child (and fails) if it runs past `timeout`.
    pub fn finish(mut self, timeout: std::time::Duration) -> (Vec<String>, ExitStatus, String) {
        let deadline = std::time::Instant::now() + timeout;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("a child process ran past {timeout:?} and was killed");
                }
            }
        }
        let status = self.child.wait().expect("waiting for the child process");
        let stderr = self.stderr.join().unwrap_or_default();
        (lines, status, stderr)
    }
}

/// A finished OTLP span as an exporter delivers it (kind `other`, ended a second after its
/// start, successfully, no usage, attrs or events): the shape the import tests vary.
pub fn ended_otlp_span(
    span_id: String,
    run_id: String,
    parent_span_id: Option<String>,
    started_at: i64,
) -> ImportedSpan {
    ImportedSpan {
        priced_at: None,
        span_id,
        run_id,
        parent_span_id,
        name: "op".into(),
        kind: SpanKind::Other,
        origin: SpanOrigin::Otlp,
        session_id: None,
        job_name: None,
        attrs: Default::default(),
        started_at,
        end: Some(ImportedEnd {
            ended_at: started_at + 1_000,
            outcome: SpanOutcome::Success,
            reason: None,
        }),
        usage: SpanUsage::default(),
        call_id: None,
        remote_parent: None,
        events: Vec::new(),
    }
}

/// A store over the file at `path` acting as `writer`.
pub fn open_store(path: &Path, writer: &str) -> SqliteActivityStore {
    let db = SqliteDatabase::open(SqliteConfig::new(path)).expect("the database opens cleanly");
    SqliteActivityStore::with_identity(db, Arc::new(SystemClock), writer)
}

/// A session-origin span start with a name derived from its id.
pub fn span_input(
    span_id: &str,
    run_id: &str,
    parent: Option<&str>,
    kind: SpanKind,
) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.to_owned(),
        run_id: run_id.to_owned(),
        parent_span_id: parent.map(str::to_owned),
        name: format!("{span_id} name"),
        kind,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: None,
    }
}
