//! The boot sweep of `flightlog serve`, through the real binary: at start a server closes, as
//! interrupted ("server restarted"), exactly the spans its own earlier lives left open, and
//! never a span of another writer: not a client that named itself in `Flightlog-Writer`
//! (whatever the span's origin), not another instance serving the same database file.
//!
//! A server's writer identity is `serve:<instance>/pid:<pid>:<start-ms>`; `--instance` names
//! the instance (by default this host's name and the HTTP port, which changes with port 0, so
//! these tests name theirs).

#[path = "support/http.rs"]
mod http;
mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use http::request;
use serde_json::{json, Value};
use support::{Scratch, ServeProcess};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// `flightlog serve` on `db` at 127.0.0.1:0, with `extra` flags.
fn serve(folder: &Path, db: &Path, extra: &[&str]) -> ServeProcess {
    ServeProcess::spawn(support::serve_command(folder, db, extra), START_TIMEOUT)
}

/// Start a span (as `writer` when given) and return the stored row.
fn start(addr: SocketAddr, writer: Option<&str>, span: Value) -> Value {
    let (status, row) = request(addr, "POST", "/v1/activity/spans", writer, Some(span));
    assert_eq!(status, 201, "{row}");
    row
}

fn span(addr: SocketAddr, span_id: &str) -> Value {
    let (status, row) = request(
        addr,
        "GET",
        &format!("/v1/activity/spans/{span_id}"),
        None,
        None,
    );
    assert_eq!(status, 200, "{span_id}: {row}");
    row
}

fn stop(mut server: ServeProcess) -> String {
    server.stop_cleanly(STOP_TIMEOUT)
}

/// `flightlog serve` on `db` with `extra` flags, expected to be refused at start: exit status 1,
/// no panic. Its stderr.
fn refused_start(folder: &Path, db: &Path, extra: &[&str]) -> String {
    let mut server = support::serve_command(folder, db, extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the server");
    let status = support::wait_at_most(&mut server, START_TIMEOUT);
    if status.is_none() {
        let _ = server.kill();
    }
    let output = server.wait_with_output().expect("the server's output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        status.is_some_and(|status| status.code() == Some(1)),
        "{}: {status:?}: {stderr}",
        db.display()
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_restart_closes_only_what_its_own_earlier_life_left_open() {
    let scratch = Scratch::new("restart-sweep", "own");
    let db = scratch.0.join("flightlog.db");

    // The first life of instance `alpha`: spans without a writer header are its own.
    let alpha = serve(&scratch.0, &db, &["--instance", "alpha"]);
    let own = start(
        alpha.addr,
        None,
        json!({"spanId": "own-session", "runId": "run-own", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    assert!(!alpha.output().contains("(port 0)"), "{}", alpha.output());
    let alpha_writer = own["writer"].as_str().expect("a writer").to_owned();
    assert!(
        alpha_writer.starts_with("serve:alpha/pid:"),
        "{alpha_writer}"
    );
    start(
        alpha.addr,
        None,
        json!({"spanId": "own-cron", "runId": "run-cron", "name": "nightly", "kind": "cron",
               "origin": "cron"}),
    );
    start(
        alpha.addr,
        None,
        json!({"spanId": "own-cron-step", "runId": "run-cron", "parentSpanId": "own-cron",
               "name": "step", "kind": "tool", "origin": "cron"}),
    );
    // Clients that name themselves, one of them with a session span in alpha's own run.
    start(
        alpha.addr,
        Some("agent-7"),
        json!({"spanId": "client-session", "runId": "run-client", "name": "turn",
               "kind": "turn", "origin": "session"}),
    );
    start(
        alpha.addr,
        Some("agent-7"),
        json!({"spanId": "client-in-own-run", "runId": "run-own", "parentSpanId": "own-session",
               "name": "tool", "kind": "tool", "origin": "session"}),
    );

    // Another instance on the same file, started while alpha serves: alpha's spans are not its
    // own, so its start closes none of them.
    let beta = serve(&scratch.0, &db, &["--instance", "beta"]);
    assert_eq!(span(beta.addr, "own-session")["outcome"], Value::Null);
    start(
        beta.addr,
        None,
        json!({"spanId": "beta-session", "runId": "run-beta", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    let beta_output = stop(beta);
    assert!(!beta_output.contains("closed"), "{beta_output}");
    stop(alpha);

    // A later life of alpha.
    let alpha = serve(&scratch.0, &db, &["--instance", "alpha"]);
    let output = alpha.output();
    assert!(
        output.contains("closed 3 span(s) an earlier server process of instance alpha left open"),
        "{output}"
    );
    for span_id in ["own-session", "own-cron", "own-cron-step"] {
        let row = span(alpha.addr, span_id);
        assert_eq!(row["outcome"], "interrupted", "{span_id}: {row}");
        assert_eq!(row["outcomeReason"], "server restarted", "{span_id}: {row}");
        assert_eq!(row["writer"], alpha_writer.as_str(), "{span_id}: {row}");
    }
    for span_id in ["client-session", "client-in-own-run", "beta-session"] {
        let row = span(alpha.addr, span_id);
        assert_eq!(row["outcome"], Value::Null, "{span_id} was closed: {row}");
    }
    // Every run it closed spans of is rolled up.
    let (status, rollup) = request(
        alpha.addr,
        "GET",
        "/v1/activity/runs/run-cron/rollup",
        None,
        None,
    );
    assert_eq!(status, 200, "{rollup}");
    assert_eq!(rollup["outcome"], "interrupted", "{rollup}");
    assert_eq!(rollup["spanCount"], 2, "{rollup}");
    // The spans this life starts are not swept by anything at its own start.
    start(
        alpha.addr,
        None,
        json!({"spanId": "alpha-again", "runId": "run-again", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    stop(alpha);

    // Beta's next life closes beta's span and nothing else.
    let beta = serve(&scratch.0, &db, &["--instance", "beta"]);
    let output = beta.output();
    assert!(
        output.contains("closed 1 span(s) an earlier server process of instance beta left open"),
        "{output}"
    );
    assert_eq!(span(beta.addr, "beta-session")["outcome"], "interrupted");
    assert_eq!(span(beta.addr, "alpha-again")["outcome"], Value::Null);
    assert_eq!(span(beta.addr, "client-session")["outcome"], Value::Null);
    stop(beta);
}

#[test]
fn the_default_instance_is_the_host_and_the_port() {
    let scratch = Scratch::new("restart-sweep", "default");
    let db = scratch.0.join("flightlog.db");
    let server = serve(&scratch.0, &db, &[]);
    let output = server.output();
    // Port 0 changes the default name at each start: the server says what that costs.
    assert!(
        output.contains("(port 0)") && output.contains("--instance"),
        "{output}"
    );
    let port = server.addr.port();
    let writer = output
        .split("writer ")
        .nth(1)
        .and_then(|rest| rest.split([',', ')']).next())
        .unwrap_or_else(|| panic!("no writer in the listening line:\n{output}"));
    assert!(writer.starts_with("serve:"), "{writer}");
    assert!(writer.contains(&format!(":{port}/pid:")), "{writer}");
    let row = start(
        server.addr,
        None,
        json!({"spanId": "s", "runId": "r", "name": "turn", "kind": "turn", "origin": "session"}),
    );
    assert_eq!(row["writer"], writer, "{row}");
    stop(server);
}

#[test]
fn a_second_live_server_of_one_instance_is_refused_and_closes_nothing() {
    let scratch = Scratch::new("restart-sweep", "twin");
    let db = scratch.0.join("flightlog.db");
    let mut first = serve(&scratch.0, &db, &["--instance", "shared"]);
    start(
        first.addr,
        None,
        json!({"spanId": "live", "runId": "run-live", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );

    // The twin: refused before it opens the database, with the fix in the message; also when
    // it reaches the file through a symbolic link in another folder (its lock was once made
    // beside the link, so it started and its boot sweep closed the first server's live span).
    let linked = scratch.0.join("linked");
    std::fs::create_dir(&linked).expect("make a folder");
    let link = linked.join("same.db");
    std::os::unix::fs::symlink(&db, &link).expect("make a symbolic link");
    for twin_db in [&db, &link] {
        let stderr = refused_start(&scratch.0, twin_db, &["--instance", "shared"]);
        assert!(
            stderr.contains("instance shared is already served by another live flightlog")
                && stderr.contains("--instance"),
            "{stderr}"
        );
        assert_eq!(span(first.addr, "live")["outcome"], Value::Null);
    }
    // The first server's live span is untouched, and it can still end it.
    assert_eq!(span(first.addr, "live")["outcome"], Value::Null);

    // A crash releases the lock: the next life starts and closes what the first left open.
    let killed = Command::new("kill")
        .args(["-KILL", &first.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let _ = first.stop(STOP_TIMEOUT);
    let next = serve(&scratch.0, &db, &["--instance", "shared"]);
    assert_eq!(span(next.addr, "live")["outcome"], "interrupted");
    let lock_files = |containing: &str| {
        std::fs::read_dir(&scratch.0)
            .expect("list the folder")
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".lock") && name.contains(containing))
            .count()
    };
    // The instance's lock, and the name's (`file_name_lock`).
    assert_eq!(lock_files("-serve-"), 1);
    assert_eq!(lock_files("-name.lock"), 1);
    stop(next);
    // A clean exit removes its lock files.
    assert_eq!(lock_files(""), 0);
}

/// A lock file deleted while its server runs (crashes leave such files, which look like
/// leftovers to clean up) is made again within a second, and a second server of the instance
/// is refused, at once by the instance's lock in the database file and later by the lock file
/// too: it started, and its boot closed the first one's live span, whose real end was then
/// refused (an audit's finding).
#[test]
fn a_lock_file_deleted_under_a_live_server_is_made_again() {
    let scratch = Scratch::new("restart-sweep", "relock");
    let db = scratch.0.join("flightlog.db");
    let first = serve(&scratch.0, &db, &["--instance", "shared"]);
    start(
        first.addr,
        None,
        json!({"spanId": "live", "runId": "run-live", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    let lock_file = std::fs::read_dir(&scratch.0)
        .expect("list the folder")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.contains("-serve-shared-") && name.ends_with(".lock"))
        })
        .expect("the instance's lock file");
    std::fs::remove_file(&lock_file).expect("delete the lock file");
    // A twin started at once, before the file is made again, gets past it, and is refused by
    // the instance's lock in the database file, before its boot's sweep.
    let stderr = refused_start(&scratch.0, &db, &["--instance", "shared"]);
    assert!(
        stderr.contains("holds the instance's lock in the database file"),
        "{stderr}"
    );
    assert_eq!(span(first.addr, "live")["outcome"], Value::Null);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !lock_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "not made again within 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stderr = refused_start(&scratch.0, &db, &["--instance", "shared"]);
    assert!(
        stderr.contains("instance shared is already served by another live flightlog"),
        "{stderr}"
    );
    assert_eq!(span(first.addr, "live")["outcome"], Value::Null);
    let (status, ended) = request(
        first.addr,
        "POST",
        "/v1/activity/spans/live/end",
        None,
        Some(json!({"outcome": "success"})),
    );
    assert_eq!(status, 200, "{ended}");
    assert_eq!(ended["ended"], true, "{ended}");
    let output = stop(first);
    assert!(
        output.contains("was deleted or replaced while this server runs; made again"),
        "{output}"
    );
    // While the twin waited for the instance's byte (5 s), this server saw the twin's lock
    // file: told as a second server starting, which is refused, not as two servers of the
    // instance (which made an operator stop a healthy server: an audit's finding).
    assert!(
        output.contains("a second server of instance shared is starting"),
        "{output}"
    );
    assert!(!output.contains("two servers are instance"), "{output}");
    assert!(!lock_file.exists(), "a clean exit removes it");
}

/// A restart that does not wait for the old process to exit (`kill -TERM`, then start at once,
/// as a script may): the new life waits for the stopping one to let the instance go, then
/// starts and closes what it left open. It was refused while the old one finished its requests
/// (an audit's finding: 4 of 8 such restarts under load).
#[test]
fn a_restart_that_does_not_wait_for_the_old_exit_waits_for_it() {
    let scratch = Scratch::new("restart-sweep", "handover");
    let db = scratch.0.join("flightlog.db");
    let mut old = serve(&scratch.0, &db, &["--instance", "handover"]);
    start(
        old.addr,
        None,
        json!({"spanId": "left", "runId": "run-left", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    let terminated = Command::new("kill")
        .args(["-TERM", &old.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(terminated.success());
    let new = serve(&scratch.0, &db, &["--instance", "handover"]);
    let _ = old.stop(STOP_TIMEOUT);
    assert_eq!(span(new.addr, "left")["outcome"], "interrupted");
    stop(new);
}

/// The `-shm` deleted under a live server: a second server on the file (another instance) is
/// refused, with the fix; it started, each had an index of its own, and their writes damaged
/// the file ("database disk image is malformed"; an audit's finding).
#[test]
fn a_second_server_is_refused_when_the_shm_was_deleted_under_the_first() {
    let scratch = Scratch::new("restart-sweep", "shm");
    let db = scratch.0.join("flightlog.db");
    let first = serve(&scratch.0, &db, &["--instance", "first"]);
    start(
        first.addr,
        None,
        json!({"spanId": "s", "runId": "r", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    let shm = scratch.0.join("flightlog.db-shm");
    std::fs::remove_file(&shm).expect("delete the -shm");
    let stderr = refused_start(&scratch.0, &db, &["--instance", "second"]);
    assert!(
        stderr.contains("shared-memory index") && stderr.contains("Stop the other flightlog"),
        "{stderr}"
    );
    // The first goes on, and a clean stop keeps what it wrote.
    assert_eq!(span(first.addr, "s")["outcome"], Value::Null);
    stop(first);
    let again = serve(&scratch.0, &db, &["--instance", "first"]);
    assert_eq!(span(again.addr, "s")["outcome"], "interrupted");
    stop(again);
}

/// Under `--manual-clock` the clock starts at 0 at each boot, so the boot sweep closed a
/// leftover started at 5,000,000 "at 0": an end before its start and a negative duration (an
/// audit's finding). A leftover never ends before it started.
#[test]
fn a_leftover_never_ends_before_it_started_under_the_manual_clock() {
    let scratch = Scratch::new("restart-sweep", "manual-clock");
    let db = scratch.0.join("flightlog.db");
    let flags = ["--instance", "tests", "--manual-clock"];
    let first = serve(&scratch.0, &db, &flags);
    let (status, body) = request(
        first.addr,
        "PUT",
        "/v1/testing/clock",
        None,
        Some(json!({"now": 5_000_000})),
    );
    assert_eq!(status, 204, "{body}");
    start(
        first.addr,
        None,
        json!({"spanId": "left-open", "runId": "run-left", "name": "turn", "kind": "turn",
               "origin": "session"}),
    );
    stop(first);
    let second = serve(&scratch.0, &db, &flags);
    let row = span(second.addr, "left-open");
    assert_eq!(row["outcome"], "interrupted", "{row}");
    assert_eq!(row["startedAt"], 5_000_000, "{row}");
    assert_eq!(row["endedAt"], 5_000_000, "{row}");
    stop(second);
}
