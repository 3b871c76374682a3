//! `flightlog serve` while another process holds the database's write lock (here Python's
//! `sqlite3` module inside `BEGIN EXCLUSIVE`, as a `sqlite3` shell left in a transaction
//! would): writes wait at most `--write-lock-wait-ms`, then get `503 unavailable` with
//! `Retry-After` and nothing written; reads go on; once the lock is free the same write
//! succeeds; and a shutdown during the wait ends within a bounded time. At start, a database
//! no other process may even read (exclusive locking mode) is waited for `--write-lock-wait-ms`,
//! then refused naming the holder and the fix, and a stop during that wait is a clean stop.

#[path = "support/http.rs"]
mod http;
mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use http::{metric_sample, request, request_with_head};
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
        Self::run(
            db,
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('BEGIN EXCLUSIVE')\n\
             print('locked', flush=True)\n\
             sys.stdin.read()\n\
             c.execute('COMMIT')\n",
        )
    }

    /// Another process with the file (new, so not in WAL mode) in exclusive locking mode and in
    /// `BEGIN EXCLUSIVE`, as the audit's `sqlite3` shell was: no other process may even read
    /// it, so a server cannot open it at all.
    fn hold_so_none_may_read(db: &Path) -> Self {
        Self::run(
            db,
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
             c.execute('PRAGMA locking_mode=EXCLUSIVE')\n\
             c.execute('BEGIN EXCLUSIVE')\n\
             c.execute('CREATE TABLE zz(x)')\n\
             print('locked', flush=True)\n\
             sys.stdin.read()\n\
             c.execute('COMMIT')\n",
        )
    }

    fn run(db: &Path, script: &str) -> Self {
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

/// `POST /v1/activity/spans` of span `span_id` on a connection of its own, closed `after` it
/// was sent without reading the answer: a client that gave up.
fn write_and_go_away(addr: std::net::SocketAddr, span_id: &str, after: Duration) {
    let body = span(span_id).to_string();
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    let head = format!(
        "POST /v1/activity/spans HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send the write");
    std::thread::sleep(after);
}

/// A scratch folder, its database and a server on it waiting at most `wait_ms` for another
/// process's write lock, which has stored span `before`.
fn serving_a_span(name: &str, wait_ms: &str) -> (Scratch, PathBuf, ServeProcess) {
    let scratch = Scratch::new("foreign-lock", name);
    let db = scratch.0.join("flightlog.db");
    let server = serve(&scratch.0, &db, wait_ms);
    let (status, row) = request(
        server.addr,
        "POST",
        "/v1/activity/spans",
        None,
        Some(span("before")),
    );
    assert_eq!(status, 201, "{row}");
    (scratch, db, server)
}

fn span(span_id: &str) -> Value {
    json!({"spanId": span_id, "runId": format!("run-{span_id}"), "name": "turn",
           "kind": "turn", "origin": "session"})
}

#[test]
fn writes_get_503_while_another_process_holds_the_lock_and_succeed_after() {
    let (_scratch, db, mut server) = serving_a_span("503", "300");

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
    let (_scratch, db, mut server) = serving_a_span("shutdown", "2000");

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

/// A write whose client goes away before its answer keeps its slot of the write limit (and its
/// share of the budget of bodies) until the store has answered it, and is counted. With
/// `--max-inflight-writes 1` and the store waiting for another process's lock, writes whose
/// clients each closed 0.1 s after sending left no write in flight and every one of them in
/// the store's queue, each holding its body: 40 such writes of 1 MiB took the server from 30
/// to 174 MB of RSS while `/metrics` said it was idle (an audit's finding).
#[test]
fn a_write_whose_client_went_away_holds_its_slot_until_the_store_answers() {
    let scratch = Scratch::new("foreign-lock", "abandoned");
    let db = scratch.0.join("flightlog.db");
    let mut server = ServeProcess::spawn(
        support::serve_command(
            &scratch.0,
            &db,
            &[
                "--write-lock-wait-ms",
                "20000",
                "--max-inflight-writes",
                "1",
            ],
        ),
        START_TIMEOUT,
    );
    let (status, _) = request(
        server.addr,
        "POST",
        "/v1/activity/spans",
        None,
        Some(span("before")),
    );
    assert_eq!(status, 201);
    let holder = LockHolder::hold(&db);
    for k in 1..=5 {
        write_and_go_away(
            server.addr,
            &format!("gone-{k}"),
            Duration::from_millis(100),
        );
    }
    // The first write holds the one slot while the writer waits for the lock with it; the others
    // found no slot (their clients gone too), so none waits in the store's queue. (Without the
    // slot held, the other four waited in the queue and none was in flight once each client's
    // close was seen, in milliseconds.)
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        metric_sample(server.addr, "flightlog_http_writes_in_flight"),
        Some(1.0),
        "the abandoned write holds its slot"
    );
    assert_eq!(
        metric_sample(server.addr, "flightlog_sqlite_write_queue_depth"),
        Some(0.0),
        "no write waits behind the one the writer holds"
    );
    holder.release();
    // Answered once the lock is free: the slot goes back, the write is counted with its status.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric_sample(server.addr, "flightlog_http_writes_in_flight") != Some(0.0) {
        assert!(Instant::now() < deadline, "the slot never came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        metric_sample(server.addr, "flightlog_http_writes_abandoned_total"),
        Some(1.0),
        "counted once it was answered"
    );
    let (status, _) = request(server.addr, "GET", "/v1/activity/spans/gone-1", None, None);
    assert_eq!(status, 200, "the write that held the slot ran to its end");
    for k in 2..=5 {
        let (status, _) = request(
            server.addr,
            "GET",
            &format!("/v1/activity/spans/gone-{k}"),
            None,
            None,
        );
        assert_eq!(status, 404, "gone-{k} found no slot and was never written");
    }
    assert_eq!(
        metric_sample(
            server.addr,
            "flightlog_http_requests_total{route=\"/v1/activity/spans\",method=\"POST\",status=\"201\"}"
        ),
        Some(2.0),
        "the abandoned write is counted with the answer it would have had"
    );
    server.stop_cleanly(Duration::from_secs(30));
}

/// A stop while a write whose client went away waits for another process's lock: the write
/// goes on after its connection closed (see the test above) and the stop waits for it (the lock
/// wait shortened to 2 s by the stop) before it closes the store. What this checks: the stop
/// ends cleanly and in bounded time with such a write running, says nothing of writes still
/// running past its grace, and nothing of the write is in the file.
#[test]
fn a_stop_waits_for_a_write_whose_client_went_away() {
    let (scratch, db, mut server) = serving_a_span("abandoned-stop", "20000");
    let holder = LockHolder::hold(&db);
    write_and_go_away(server.addr, "gone", Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        metric_sample(server.addr, "flightlog_http_writes_in_flight"),
        Some(1.0),
        "the write goes on without its client"
    );
    let output = server.stop_cleanly(Duration::from_secs(30));
    assert!(!output.contains("were still running"), "{output}");
    holder.release();
    // Nothing of it was written: the file alone, opened by a new server.
    let mut again = serve(&scratch.0, &db, "2000");
    let (status, _) = request(again.addr, "GET", "/v1/activity/spans/gone", None, None);
    assert_eq!(status, 404);
    let (status, _) = request(again.addr, "GET", "/v1/activity/spans/before", None, None);
    assert_eq!(status, 200);
    again.stop_cleanly(Duration::from_secs(30));
}

/// A `flightlog serve` on `db` (with `extra` flags) that is not expected to start: its output
/// lines arrive on the channel as they are printed.
fn spawn_start(folder: &Path, db: &Path, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut command = support::serve_command(folder, db, extra);
    support::isolate(&mut command);
    let mut child = command.spawn().expect("start flightlog serve");
    let (send, lines) = mpsc::channel();
    let streams: [Box<dyn std::io::Read + Send>; 2] = [
        Box::new(child.stdout.take().expect("piped stdout")),
        Box::new(child.stderr.take().expect("piped stderr")),
    ];
    for stream in streams {
        let send = send.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
    }
    (child, lines)
}

/// The lines `lines` brings within `limit` (all of them once the process has exited and its
/// streams are closed), and whether one held `needle` (reading stops there).
fn lines_until(lines: &mpsc::Receiver<String>, needle: &str, limit: Duration) -> (String, bool) {
    let deadline = Instant::now() + limit;
    let mut seen = String::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(needle) {
                    return (seen, true);
                }
            }
            Err(_) => break,
        }
    }
    (seen, false)
}

/// At start, a database another process holds so that no one may even read it (exclusive
/// locking mode, a `sqlite3` shell in `BEGIN EXCLUSIVE` on a file not in WAL mode): SQLite's
/// open waited its fixed 5 s whatever `--write-lock-wait-ms` said, and the start failed with a
/// bare "database error: database is locked" (an audit's finding). Now the start waits
/// `--write-lock-wait-ms`, saying so, then refuses naming the holder and what to do.
#[test]
fn a_start_on_a_database_none_may_read_waits_the_lock_wait_then_says_whose_lock_it_is() {
    let scratch = Scratch::new("foreign-lock", "start-refused");
    let db = scratch.0.join("held.db");
    let holder = LockHolder::hold_so_none_may_read(&db);
    let started = Instant::now();
    let (mut child, lines) = spawn_start(&scratch.0, &db, &["--write-lock-wait-ms", "1000"]);
    let status = support::wait_at_most(&mut child, Duration::from_secs(30));
    let took = started.elapsed();
    let (output, _) = lines_until(&lines, "never printed", Duration::from_secs(5));
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{output}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(4500),
        "the start took {took:?}, not about the 1 s lock wait:\n{output}"
    );
    for needle in [
        "waiting up to 1 s for it to let go",
        "holds the lock of",
        "so that no other process may even read it",
        "did not let go within 1 s (--write-lock-wait-ms",
        "exclusive locking mode",
        "BEGIN EXCLUSIVE",
        "pid ",
    ] {
        assert!(output.contains(needle), "no {needle:?} in:\n{output}");
    }
    holder.release();
}

/// A stop signal while the start waits for such a lock ends the start at once, as a clean
/// stop (exit 0): the operator who sent it wants no server.
#[test]
fn a_stop_while_the_start_waits_for_another_process_s_lock_is_a_clean_stop() {
    let scratch = Scratch::new("foreign-lock", "start-stopped");
    let db = scratch.0.join("held.db");
    let holder = LockHolder::hold_so_none_may_read(&db);
    let (mut child, lines) = spawn_start(&scratch.0, &db, &["--write-lock-wait-ms", "60000"]);
    let (mut output, waiting) = lines_until(&lines, "waiting up to 60 s", START_TIMEOUT);
    assert!(waiting, "the start does not say it waits:\n{output}");
    let asked = Instant::now();
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success());
    let status = support::wait_at_most(&mut child, Duration::from_secs(30));
    let took = asked.elapsed();
    let _ = child.kill();
    output.push_str(&lines_until(&lines, "never printed", Duration::from_secs(5)).0);
    assert!(
        status.is_some_and(|status| status.success()),
        "{status:?}:\n{output}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the stop took {took:?}:\n{output}"
    );
    assert!(
        output.contains("stopped while waiting for another process to let go"),
        "{output}"
    );
    holder.release();
}
