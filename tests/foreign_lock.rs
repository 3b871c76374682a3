//! `flightlog serve` while another process holds the database's write lock (here Python's
//! `sqlite3` module inside `BEGIN EXCLUSIVE`, as a `sqlite3` shell left in a transaction
//! would): writes wait at most `--write-lock-wait-ms`, then get `503 unavailable` with
//! `Retry-After` and nothing written; reads go on; once the lock is free the same write
//! succeeds; and a shutdown during the wait ends within a bounded time.

#[path = "support/http.rs"]
mod http;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use http::{request, request_with_head};
use serde_json::{json, Value};
use support::{Scratch, ServeProcess};

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Another process in `BEGIN EXCLUSIVE` on the database until [`LockHolder::release`] (or
/// until it is dropped, which kills it).
struct LockHolder {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl LockHolder {
    fn hold(db: &Path) -> Self {
        let script = "import sqlite3, sys\n\
                      c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                      c.execute('BEGIN EXCLUSIVE')\n\
                      print('locked', flush=True)\n\
                      sys.stdin.read()\n\
                      c.execute('COMMIT')\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(db)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs (the OTLP tests need it too)");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the holder's line");
        assert_eq!(line.trim(), "locked");
        let stdin = child.stdin.take();
        Self { child, stdin }
    }

    fn release(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let status = support::wait_at_most(&mut self.child, Duration::from_secs(30));
        assert!(
            status.is_some_and(|status| status.success()),
            "the holder did not commit: {status:?}"
        );
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn serve(folder: &Path, db: &Path, wait_ms: &str) -> ServeProcess {
    let command = support::serve_command(folder, db, &["--write-lock-wait-ms", wait_ms]);
    ServeProcess::spawn(command, START_TIMEOUT)
}

fn span(span_id: &str) -> Value {
    json!({"spanId": span_id, "runId": format!("run-{span_id}"), "name": "turn",
           "kind": "turn", "origin": "session"})
}

#[test]
fn writes_get_503_while_another_process_holds_the_lock_and_succeed_after() {
    let scratch = Scratch::new("foreign-lock", "503");
    let db = scratch.0.join("flightlog.db");
    let mut server = serve(&scratch.0, &db, "300");
    let (status, row) = request(
        server.addr,
        "POST",
        "/v1/activity/spans",
        None,
        Some(span("before")),
    );
    assert_eq!(status, 201, "{row}");

    let holder = LockHolder::hold(&db);
    let (status, head, body) = request_with_head(
        server.addr,
        "POST",
        "/v1/activity/spans",
        None,
        Some(span("during")),
    );
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nretry-after:"),
        "{head}"
    );
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("write lock"), "{message}");
    // And how to wait longer, from every source of the setting.
    for source in [
        "--write-lock-wait-ms",
        "FLIGHTLOG_WRITE_LOCK_WAIT_MS",
        "`write_lock_wait_ms` in the config file",
    ] {
        assert!(message.contains(source), "{source}: {message}");
    }
    // Journal appends meet the same limit; reads are not held up at all.
    let (status, body) = request(
        server.addr,
        "POST",
        "/v1/engagements/e-1/events",
        None,
        Some(json!({"type": "engagement_opened", "at": 1, "data": {}})),
    );
    assert_eq!(status, 503, "{body}");
    // A batch the store refuses whole is answered as a single write is: 503 with Retry-After
    // (it answered 200 with every op `unavailable`, lost on clients that check the status).
    let batch = json!({"ops": [
        {"op": "startSpan", "spanId": "batched", "runId": "run-batched", "name": "turn",
         "kind": "turn", "origin": "session"},
        {"op": "heartbeat", "spanId": "before"},
    ]});
    let (status, head, body) =
        request_with_head(server.addr, "POST", "/v1/activity/batch", None, Some(batch));
    assert_eq!(status, 503, "{head}\n{body}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nretry-after:"),
        "{head}"
    );
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let (status, row) = request(server.addr, "GET", "/v1/activity/spans/before", None, None);
    assert_eq!(status, 200, "{row}");
    holder.release();

    let (status, _) = request(server.addr, "GET", "/v1/activity/spans/during", None, None);
    assert_eq!(status, 404, "the refused write left nothing");
    let (status, _) = request(server.addr, "GET", "/v1/activity/spans/batched", None, None);
    assert_eq!(status, 404, "the refused batch left nothing");
    let (status, row) = request(
        server.addr,
        "POST",
        "/v1/activity/spans",
        None,
        Some(span("during")),
    );
    assert_eq!(status, 201, "{row}");
    let output = server.stop_cleanly(Duration::from_secs(30));
    assert!(!output.contains("panicked"), "{output}");
}

#[test]
fn a_shutdown_while_a_write_waits_for_the_lock_ends_in_bounded_time() {
    let scratch = Scratch::new("foreign-lock", "shutdown");
    let db = scratch.0.join("flightlog.db");
    let mut server = serve(&scratch.0, &db, "2000");
    let (status, row) = request(
        server.addr,
        "POST",
        "/v1/activity/spans",
        None,
        Some(span("before")),
    );
    assert_eq!(status, 201, "{row}");

    let holder = LockHolder::hold(&db);
    let addr = server.addr;
    let waiting = std::thread::spawn(move || {
        request(
            addr,
            "POST",
            "/v1/activity/spans",
            None,
            Some(span("stuck")),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    // The write's wait (2 s) and the final checkpoint's (5 s at most) bound the stop.
    let stopped = server.stop(Duration::from_secs(20));
    assert!(
        stopped.graceful && stopped.status.is_some_and(|status| status.success()),
        "no clean stop within 20 s ({:?} after {:?}):\n{}",
        stopped.status,
        asked.elapsed(),
        stopped.output
    );
    // The stop says what it waits for (it said nothing while it waited).
    assert!(
        stopped.output.contains("still closing the database"),
        "{}",
        stopped.output
    );
    let (status, body) = waiting.join().expect("the waiting request");
    assert_eq!(status, 503, "{body}");
    holder.release();
}

/// A stop while a write waits for another process's lock, with a lock wait longer than the
/// server's 5 s grace: the write used to be cut off unanswered when the grace ran out (and the
/// stop took the grace and the final checkpoint's wait). Once the stop begins a write waits for
/// the lock at most 2 s more, so it is answered `503` with `Retry-After`, nothing written, and
/// the process still stops cleanly.
#[test]
fn a_write_behind_a_foreign_lock_is_answered_when_the_server_stops() {
    let scratch = Scratch::new("foreign-lock", "stop-answers");
    let db = scratch.0.join("flightlog.db");
    let mut server = serve(&scratch.0, &db, "20000");
    let holder = LockHolder::hold(&db);
    let addr = server.addr;
    let waiting = std::thread::spawn(move || {
        let sent = Instant::now();
        let (status, head, body) = request_with_head(
            addr,
            "POST",
            "/v1/activity/spans",
            None,
            Some(span("waits")),
        );
        (status, head, body, sent.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let stopped = server.stop(Duration::from_secs(30));
    let answer = waiting.join();
    holder.release();
    assert!(
        stopped.graceful && stopped.status.is_some_and(|status| status.success()),
        "no clean stop ({:?} after {:?}):\n{}",
        stopped.status,
        asked.elapsed(),
        stopped.output
    );
    let (status, head, body, took) = answer.unwrap_or_else(|_| {
        panic!(
            "the waiting write got no answer (cut off at the stop):\n{}",
            stopped.output
        )
    });
    assert_eq!(status, 503, "{body}");
    assert!(head.to_ascii_lowercase().contains("retry-after"), "{head}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("stopping")),
        "{body}"
    );
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
}
