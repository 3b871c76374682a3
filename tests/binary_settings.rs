//! The settings of `flightlog serve` reach the running server: the real binary, started as a
//! child process on 127.0.0.1 with port 0, driven over real HTTP.
//!
//! Why this file exists: `crates/flightlog-server/src/settings.rs` unit-tests how flags,
//! `FLIGHTLOG_*` variables and the TOML config file resolve into `ServeSettings`, but nothing
//! showed that the resolved values are the ones the server then runs with. These tests start
//! the binary with each setting from each source and look only at what a client sees:
//! - `--manual-clock`: `PUT /v1/testing/clock` moves the time a span takes when it names none;
//!   without the flag the route is a 404 and spans take the wall clock;
//! - journal retention (`journal.max_events`, `journal.max_age_ms`) from the environment, the
//!   config file and the flags, and which source wins when several give it: the append past the
//!   limit is `409 journal_full` with nothing written, and `POST /v1/engagements/prune` removes
//!   exactly the engagements idle past the configured age (numbers chosen so that the defaults,
//!   10,000 events and 30 days, would do neither);
//! - `--grpc-addr`: `off` prints that gRPC is off and leaves the HTTP listener as the process's
//!   only listening socket; `127.0.0.1:0` prints a gRPC address that is the process's second
//!   listening socket and accepts a TCP connection.
//!
//! - the scheduled maintenance: on by default with the wall clock (the start-up output says what
//!   it will do), off by default under `--manual-clock`, and with `--maintenance-every-ms` there
//!   a pass closes a run whose root went silent once the clock has moved past the window, and
//!   says so.
//!
//! One server per case, stopped with SIGTERM and required to exit cleanly.

#[path = "support/http.rs"]
mod http;
#[allow(dead_code)] // Each test file uses its own part of the shared helpers.
mod support;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::ServeProcess;

use support::flightlog_binary as bin;
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// The limits every retention case configures (through a different source each time).
const MAX_EVENTS: u64 = 2;
const MAX_AGE_MS: i64 = 1_000;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// `flightlog serve` on a fresh database in `dir`, at 127.0.0.1:0, with `extra` flags, and with
/// `env` (`NAME=value` pairs) in its environment and nothing else of flightlog's.
///
/// `ServeProcess::spawn` removes every `FLIGHTLOG_*` variable the test process has, and would
/// so also remove one set here under the same name; the variables are therefore given to
/// `env(1)`, which sets them for the `flightlog` it then executes (the same process id).
fn serve(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> ServeProcess {
    let mut command = if env.is_empty() {
        Command::new(bin())
    } else {
        let mut command = Command::new("env");
        command.args(env.iter().map(|(name, value)| format!("{name}={value}")));
        command.arg(bin());
        command
    };
    command
        .current_dir(dir)
        .args(["serve", "--db"])
        .arg(dir.join("flightlog.db"))
        .args(["--addr", "127.0.0.1:0", "--instance", "settings-test"])
        .args(extra);
    ServeProcess::spawn(command, START_TIMEOUT)
}

/// Stop `server` with SIGTERM, requiring a clean exit; its whole output.
fn stop(mut server: ServeProcess) -> String {
    server.stop_cleanly(STOP_TIMEOUT)
}

/// One request on its own connection, as no particular writer: status and JSON body.
fn request(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    http::request(addr, method, path, None, body)
}

/// Start a span that names no `startedAt`; the stored row.
fn start_span(addr: SocketAddr, span_id: &str) -> Value {
    let (status, row) = request(
        addr,
        "POST",
        "/v1/activity/spans",
        Some(
            json!({"spanId": span_id, "runId": format!("run-{span_id}"), "name": "turn",
                    "kind": "turn", "origin": "session"}),
        ),
    );
    assert_eq!(status, 201, "{row}");
    row
}

/// Append one event to `engagement` at `at`: the status and body.
fn append(addr: SocketAddr, engagement: &str, at: i64) -> (u16, Value) {
    request(
        addr,
        "POST",
        &format!("/v1/engagements/{engagement}/events"),
        Some(json!({"type": "note", "at": at, "data": {}})),
    )
}

/// The engagement's stored events.
fn events(addr: SocketAddr, engagement: &str) -> Vec<Value> {
    let (status, body) = request(
        addr,
        "GET",
        &format!("/v1/engagements/{engagement}/events"),
        None,
    );
    assert_eq!(status, 200, "{body}");
    body.as_array().expect("an array of events").clone()
}

/// The first line of the server's output starting with `prefix`, waiting for it (the lines after
/// the listening line are printed a moment later); panics with the output if it never comes.
fn wait_for_line(server: &ServeProcess, prefix: &str) -> String {
    let started = Instant::now();
    loop {
        let output = server.output();
        if let Some(line) = output.lines().find(|line| line.starts_with(prefix)) {
            return line.to_owned();
        }
        assert!(
            started.elapsed() < START_TIMEOUT,
            "no line starting with {prefix:?}:\n{output}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wall_clock_ms() -> i64 {
    let elapsed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(elapsed.as_millis()).expect("epoch ms fit an i64")
}

/// The TCP ports process `pid` listens on: its socket descriptors' inodes looked up among the
/// listening entries (state `0A`) of the TCP tables of its network namespace. Other processes'
/// sockets, and the ports they hold, play no part.
#[cfg(target_os = "linux")]
fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list the server's descriptors")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut ports = BTreeSet::new();
    for table in ["tcp", "tcp6"] {
        // No IPv6 in the kernel: no tcp6 table, and nothing listening in it.
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if *state == "0A" && inodes.contains(*inode) {
                let port = local.rsplit(':').next().expect("ADDRESS:PORT");
                ports.insert(u16::from_str_radix(port, 16).expect("a hex port"));
            }
        }
    }
    ports
}

// ---------------------------------------------------------------------------------------------
// --manual-clock
// ---------------------------------------------------------------------------------------------

/// With `--manual-clock`, `PUT /v1/testing/clock` sets the time the stores read: a span started
/// without `startedAt` is stamped with exactly the time set, and moving the clock again moves
/// the next span's time (the clock is read at each write, not once at start).
#[test]
fn the_manual_clock_sets_the_start_of_a_span_that_names_none() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(dir.path(), &["--grpc-addr", "off", "--manual-clock"], &[]);
    assert!(
        server.output().contains(", manual clock)"),
        "the listening line does not mention the manual clock:\n{}",
        server.output()
    );

    let (status, body) = request(
        server.addr,
        "PUT",
        "/v1/testing/clock",
        Some(json!({"now": 123_456})),
    );
    assert_eq!(status, 204, "{body}");
    let row = start_span(server.addr, "first");
    assert_eq!(row["startedAt"], 123_456, "{row}");
    // Stored so, not only answered so.
    let (status, stored) = request(server.addr, "GET", "/v1/activity/spans/first", None);
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["startedAt"], 123_456, "{stored}");

    let (status, body) = request(
        server.addr,
        "PUT",
        "/v1/testing/clock",
        Some(json!({"now": 200_000})),
    );
    assert_eq!(status, 204, "{body}");
    let row = start_span(server.addr, "second");
    assert_eq!(row["startedAt"], 200_000, "{row}");
    let line = wait_for_line(&server, "flightlog: no scheduled maintenance");
    assert!(line.contains("the manual clock's default"), "{line}");
    stop(server);
}

/// With `--maintenance-every-ms` a manual-clock server runs the scheduled passes: a run whose
/// root has had no heartbeat for `--stale-after-ms` (judged once the server has been up that
/// long, on its clock) is closed as interrupted within a few passes of the clock moving, the
/// output says so, and a step switched off through the environment is left out of the plan.
#[test]
fn scheduled_maintenance_closes_a_silent_run_once_the_clock_passes_the_window() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(
        dir.path(),
        &[
            "--grpc-addr",
            "off",
            "--manual-clock",
            "--maintenance-every-ms",
            "50",
            "--stale-after-ms",
            "1000",
        ],
        &[("FLIGHTLOG_PRUNE_AFTER_MS", "off")],
    );
    let plan = wait_for_line(&server, "flightlog: maintenance every 50 ms: ");
    assert_eq!(
        plan,
        "flightlog: maintenance every 50 ms: close runs whose writer is silent for 1 s; report \
         runs open over 1 h as stuck; remove engagements idle for 30 days"
    );
    start_span(server.addr, "silent");
    // Passes run meanwhile; nothing is stale while the clock stands still.
    std::thread::sleep(Duration::from_millis(200));
    let (_, row) = request(server.addr, "GET", "/v1/activity/spans/silent", None);
    assert!(row["outcome"].is_null(), "{row}");

    let (status, body) = request(
        server.addr,
        "PUT",
        "/v1/testing/clock",
        Some(json!({"now": 1_001})),
    );
    assert_eq!(status, 204, "{body}");
    let started = Instant::now();
    let row = loop {
        let (status, row) = request(server.addr, "GET", "/v1/activity/spans/silent", None);
        assert_eq!(status, 200, "{row}");
        if !row["outcome"].is_null() {
            break row;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not closed by a pass: {row}\n{}",
            server.output()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(row["outcome"], "interrupted", "{row}");
    assert_eq!(row["outcomeReason"], "writer went silent", "{row}");
    assert_eq!(row["endedAt"], 1_001, "{row}");
    wait_for_line(
        &server,
        "flightlog: maintenance: closed 1 span(s) of runs whose writer went silent (no \
         sign of life for 1 s) as interrupted",
    );
    stop(server);
}

/// `--manual-clock=false` turns off the environment's `FLIGHTLOG_MANUAL_CLOCK=true` (a switch
/// that could only switch on left no way to override the environment for one start).
#[test]
fn a_switch_given_false_turns_off_the_environments_true() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(
        dir.path(),
        &["--grpc-addr", "off", "--manual-clock=false"],
        &[("FLIGHTLOG_MANUAL_CLOCK", "true")],
    );
    let (status, body) = request(
        server.addr,
        "PUT",
        "/v1/testing/clock",
        Some(json!({"now": 5})),
    );
    assert_eq!(status, 404, "{body}");
    stop(server);

    let server = serve(
        dir.path(),
        &["--grpc-addr", "off", "--manual-clock"],
        &[("FLIGHTLOG_MANUAL_CLOCK", "false")],
    );
    let (status, body) = request(
        server.addr,
        "PUT",
        "/v1/testing/clock",
        Some(json!({"now": 5})),
    );
    assert_eq!(status, 204, "{body}");
    stop(server);
}

/// Without `--manual-clock` the testing route does not exist (404 `not_found`, the contract's
/// error body) and a span started without `startedAt` takes the wall clock.
#[test]
fn without_the_flag_the_clock_route_is_a_404_and_spans_take_the_wall_clock() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(dir.path(), &["--grpc-addr", "off"], &[]);
    assert!(
        !server.output().contains("manual clock"),
        "{}",
        server.output()
    );

    let (status, body) = request(
        server.addr,
        "PUT",
        "/v1/testing/clock",
        Some(json!({"now": 123_456})),
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");

    let line = wait_for_line(&server, "flightlog: maintenance every ");
    assert_eq!(
        line,
        "flightlog: maintenance every 1 min: close runs whose writer is silent for 2 h; \
         report runs open over 1 h as stuck; prune the span detail of runs ended over 30 days \
         ago (rollups kept); remove engagements idle for 30 days"
    );

    let before = wall_clock_ms();
    let row = start_span(server.addr, "wall");
    let after = wall_clock_ms();
    let started_at = row["startedAt"].as_i64().expect("an integer startedAt");
    assert!(
        (before..=after).contains(&started_at),
        "startedAt {started_at} is not the wall clock ({before}..={after}): {row}"
    );
    stop(server);
}

// ---------------------------------------------------------------------------------------------
// Journal retention
// ---------------------------------------------------------------------------------------------

/// The server at `addr` enforces [`MAX_EVENTS`] events per engagement and prunes engagements
/// idle for more than [`MAX_AGE_MS`].
fn assert_retention(addr: SocketAddr) {
    // The limit: appends 0 and 1 are taken, the next is refused and writes nothing.
    for seq in 0..MAX_EVENTS {
        let (status, event) = append(addr, "full", 5_000);
        assert_eq!(status, 201, "{event}");
        assert_eq!(event["seq"], seq, "{event}");
    }
    let (status, body) = append(addr, "full", 5_000);
    assert_eq!(status, 409, "append past the limit: {body}");
    assert_eq!(body["error"]["code"], "journal_full", "{body}");
    assert_eq!(events(addr, "full").len() as u64, MAX_EVENTS);
    // The limit is per engagement.
    let (status, event) = append(addr, "other", 5_000);
    assert_eq!(status, 201, "{event}");

    // The age: at now = 6,000 the cutoff is 5,000; an engagement whose last event is at 1,000
    // is removed, those whose last event is at the cutoff are kept. With the default age
    // (30 days) nothing would be.
    let (status, event) = append(addr, "idle", 1_000);
    assert_eq!(status, 201, "{event}");
    let (status, body) = request(
        addr,
        "POST",
        "/v1/engagements/prune",
        Some(json!({"now": 5_000 + MAX_AGE_MS})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"removed": 1}));
    assert!(events(addr, "idle").is_empty());
    let (status, ids) = request(addr, "GET", "/v1/engagements", None);
    assert_eq!(status, 200, "{ids}");
    let ids: BTreeSet<&str> = ids
        .as_array()
        .expect("an array of ids")
        .iter()
        .map(|id| id.as_str().expect("an id"))
        .collect();
    assert_eq!(ids, BTreeSet::from(["full", "other"]));
}

/// `FLIGHTLOG_JOURNAL_MAX_EVENTS` and `FLIGHTLOG_JOURNAL_MAX_AGE_MS` in the environment set the
/// running server's journal retention.
#[test]
fn journal_retention_from_the_environment() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(
        dir.path(),
        &["--grpc-addr", "off"],
        &[
            ("FLIGHTLOG_JOURNAL_MAX_EVENTS", &MAX_EVENTS.to_string()),
            ("FLIGHTLOG_JOURNAL_MAX_AGE_MS", &MAX_AGE_MS.to_string()),
        ],
    );
    assert_retention(server.addr);
    stop(server);
}

/// `[journal] max_events` and `max_age_ms` in the TOML file named by `--config` set the running
/// server's journal retention.
#[test]
fn journal_retention_from_the_config_file() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let config = dir.path().join("flightlog.toml");
    std::fs::write(
        &config,
        format!("[journal]\nmax_events = {MAX_EVENTS}\nmax_age_ms = {MAX_AGE_MS}\n"),
    )
    .expect("write the config file");
    let config = config.to_str().expect("a UTF-8 path");
    let server = serve(dir.path(), &["--grpc-addr", "off", "--config", config], &[]);
    // Printed a moment after the listening line.
    assert_eq!(
        wait_for_line(&server, "flightlog: settings from "),
        format!("flightlog: settings from {config}")
    );
    assert_retention(server.addr);
    stop(server);
}

/// `--journal-max-events` and `--journal-max-age-ms` set the running server's journal
/// retention.
#[test]
fn journal_retention_from_the_flags() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(
        dir.path(),
        &[
            "--grpc-addr",
            "off",
            "--journal-max-events",
            &MAX_EVENTS.to_string(),
            "--journal-max-age-ms",
            &MAX_AGE_MS.to_string(),
        ],
        &[],
    );
    assert_retention(server.addr);
    stop(server);
}

/// When several sources give the limit, the running server takes the flag's over the
/// variable's over the file's, as `--help` says: with the file at 4 and the variable at 3, the
/// fourth append is refused; with a flag of 2 as well, the third is.
#[test]
fn journal_limit_precedence_flag_then_environment_then_file() {
    for (flag, allowed) in [(None, 3_u64), (Some("2"), 2)] {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let config = dir.path().join("flightlog.toml");
        std::fs::write(&config, "[journal]\nmax_events = 4\n").expect("write the config file");
        let mut flags = vec![
            "--grpc-addr",
            "off",
            "--config",
            config.to_str().expect("a UTF-8 path"),
        ];
        if let Some(limit) = flag {
            flags.extend(["--journal-max-events", limit]);
        }
        let server = serve(dir.path(), &flags, &[("FLIGHTLOG_JOURNAL_MAX_EVENTS", "3")]);
        for seq in 0..allowed {
            let (status, event) = append(server.addr, "e", 1);
            assert_eq!(status, 201, "flag {flag:?}, append {seq}: {event}");
        }
        let (status, body) = append(server.addr, "e", 1);
        assert_eq!(status, 409, "flag {flag:?}: {body}");
        assert_eq!(body["error"]["code"], "journal_full", "{body}");
        stop(server);
    }
}

// ---------------------------------------------------------------------------------------------
// --grpc-addr
// ---------------------------------------------------------------------------------------------

/// `--grpc-addr off`: the server says gRPC is off and names no gRPC address, and the HTTP
/// listener is the only socket the process listens on.
#[cfg(target_os = "linux")]
#[test]
fn grpc_off_leaves_http_as_the_only_listener() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(dir.path(), &["--grpc-addr", "off"], &[]);
    let line = wait_for_line(&server, "flightlog: OTLP/HTTP at ");
    assert!(line.ends_with("(OTLP/gRPC off)"), "{line}");
    assert!(
        !server.output().contains("OTLP/gRPC on"),
        "{}",
        server.output()
    );
    assert_eq!(
        listening_ports(server.pid()),
        BTreeSet::from([server.addr.port()]),
        "the server listens on more than its HTTP port"
    );
    stop(server);
}

/// `--grpc-addr 127.0.0.1:0`: the server prints the gRPC address it bound, that address is the
/// process's second listening socket (beside HTTP), and it accepts a TCP connection.
#[cfg(target_os = "linux")]
#[test]
fn grpc_on_port_zero_prints_an_address_that_accepts_connections() {
    const GRPC_LINE: &str = "flightlog: OTLP/gRPC on ";
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(dir.path(), &["--grpc-addr", "127.0.0.1:0"], &[]);
    let line = wait_for_line(&server, GRPC_LINE);
    let grpc: SocketAddr = line[GRPC_LINE.len()..]
        .split(';')
        .next()
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no gRPC address in {line:?}"));
    assert!(grpc.ip().is_loopback(), "{line}");
    assert_ne!(grpc.port(), 0, "{line}");
    assert_ne!(grpc.port(), server.addr.port(), "{line}");
    assert!(
        !server.output().contains("OTLP/gRPC off"),
        "{}",
        server.output()
    );
    assert_eq!(
        listening_ports(server.pid()),
        BTreeSet::from([server.addr.port(), grpc.port()])
    );
    TcpStream::connect_timeout(&grpc, Duration::from_secs(10))
        .expect("the printed gRPC address accepts a connection");
    stop(server);
}

/// A short token works but is called guessable at start; a long one is not mentioned.
#[test]
fn a_short_token_is_warned_about_and_a_long_one_is_not() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(dir.path(), &["--grpc-addr", "off", "--token", "x"], &[]);
    let output = stop(server);
    assert!(
        output.contains("warning: 1 token(s) shorter than 16 characters"),
        "{output}"
    );
    let dir = tempfile::tempdir().expect("a scratch folder");
    let server = serve(
        dir.path(),
        &[
            "--grpc-addr",
            "off",
            "--token",
            "0123456789abcdef0123456789abcdef",
        ],
        &[],
    );
    let output = stop(server);
    assert!(!output.contains("shorter than"), "{output}");
}

/// A database file with another hard link: a process opening it by the other name would keep a
/// WAL of its own and its writes would be lost to this one, so the start says so (it still
/// serves: one name in use is safe).
#[test]
fn a_database_with_another_hard_link_is_warned_about() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let db = dir.path().join("flightlog.db");
    std::fs::write(&db, b"").expect("make the file");
    std::fs::hard_link(&db, dir.path().join("same-file.db")).expect("link it");
    let server = serve(dir.path(), &["--grpc-addr", "off"], &[]);
    let line = wait_for_line(&server, "flightlog: warning:");
    assert!(
        line.contains("has 2 hard links")
            && line.contains("by this one name")
            && line.contains("damage the file"),
        "{line}"
    );
    stop(server);
    // `demo` says it too (it said nothing, an audit found).
    let demo = std::process::Command::new(bin())
        .args(["demo", "--runs", "2", "--db"])
        .arg(&db)
        .output()
        .expect("run the demo");
    let stderr = String::from_utf8_lossy(&demo.stderr);
    assert!(demo.status.success(), "{stderr}");
    assert!(stderr.contains("has 2 hard links"), "{stderr}");
}

/// `flightlog demo` records into the file `serve` would open: the config file's `db` (named by
/// `--config` or `FLIGHTLOG_CONFIG`) when neither `--db` nor `FLIGHTLOG_DB` names one. It
/// recorded into `./flightlog.db` whatever the config said, so a server started with that config
/// showed none of it (an audit's finding). A config `serve` would refuse is refused here too.
#[test]
fn the_demo_records_into_the_database_the_config_file_names() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let config_dir = dir.path().join("etc");
    let work_dir = dir.path().join("work");
    std::fs::create_dir_all(&config_dir).expect("make the config folder");
    std::fs::create_dir_all(&work_dir).expect("make the working folder");
    let config = config_dir.join("flightlog.toml");
    // A relative `db` is relative to the file's folder, as `serve` reads it.
    std::fs::write(&config, "db = \"from-config.db\"\n").expect("write the config");
    let demo = |args: &[&str], env: &[(&str, &str)]| {
        let mut command = Command::new(bin());
        command.arg("demo").args(args).current_dir(&work_dir);
        for (name, _) in std::env::vars() {
            if name.starts_with("FLIGHTLOG") {
                command.env_remove(name);
            }
        }
        command.envs(env.iter().copied());
        command.output().expect("run the demo")
    };
    let config_text = config.to_string_lossy().into_owned();

    let by_variable = demo(&["--runs", "1"], &[("FLIGHTLOG_CONFIG", &config_text)]);
    let stdout = String::from_utf8_lossy(&by_variable.stdout);
    assert!(by_variable.status.success(), "{by_variable:?}");
    assert!(stdout.contains("from-config.db"), "{stdout}");
    assert!(config_dir.join("from-config.db").exists());
    assert!(!work_dir.join("flightlog.db").exists(), "{stdout}");

    let by_flag = demo(&["--runs", "1", "--config", &config_text], &[]);
    assert!(by_flag.status.success(), "{by_flag:?}");
    assert!(String::from_utf8_lossy(&by_flag.stdout).contains("from-config.db"));

    // `--db` and `FLIGHTLOG_DB` come first, as for `serve`.
    let flag_wins = demo(
        &["--runs", "1", "--config", &config_text, "--db", "flag.db"],
        &[],
    );
    assert!(flag_wins.status.success(), "{flag_wins:?}");
    assert!(work_dir.join("flag.db").exists());
    let variable_wins = demo(
        &["--runs", "1", "--config", &config_text],
        &[("FLIGHTLOG_DB", "variable.db")],
    );
    assert!(variable_wins.status.success(), "{variable_wins:?}");
    assert!(work_dir.join("variable.db").exists());

    // A config `serve` would refuse: refused, naming the file and the key, nothing recorded.
    let bad = config_dir.join("bad.toml");
    std::fs::write(&bad, "db = \"bad.db\"\ndurability = \"sometimes\"\n").expect("write it");
    let refused = demo(&["--runs", "1", "--config", &bad.to_string_lossy()], &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("bad.toml") && stderr.contains("durability"),
        "{stderr}"
    );
    assert!(!config_dir.join("bad.db").exists());
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `flightlog demo --runs 0` says there are no finished runs instead of printing a table
/// header with nothing under it; its running run is still shown.
#[test]
fn a_demo_of_no_finished_runs_says_so() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let out = Command::new(bin())
        .args(["demo", "--runs", "0", "--db"])
        .arg(dir.path().join("none.db"))
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains("Recorded 0 finished runs and 1 running run"),
        "{stdout}"
    );
    assert!(stdout.contains("(no finished runs: --runs 0)"), "{stdout}");
    assert!(!stdout.contains("in tok"), "{stdout}");
    assert!(stdout.contains("Running now:"), "{stdout}");
}

/// Two flightlogs on two names of one file (hard links): the second is refused before it
/// touches the file, where it used to start with a warning, and each acknowledged writes the
/// other never saw (an audit: 6 spans acknowledged, 3 left after a restart). Processes on the
/// same name stay allowed (another instance, a demo), and the other name is free again once
/// the first process has stopped.
#[test]
fn a_second_name_of_a_file_in_use_is_refused() {
    let dir = tempfile::tempdir().expect("a scratch folder");
    let first_name = dir.path().join("flightlog.db");
    std::fs::write(&first_name, b"").expect("make the file");
    let second_name = dir.path().join("linked.db");
    std::fs::hard_link(&first_name, &second_name).expect("link it");
    let server = serve(dir.path(), &["--grpc-addr", "off"], &[]);
    start_span(server.addr, "written-by-the-first");
    // `flightlog serve` on `db` (the harness's `serve` names its own file).
    let serve_on = |db: &Path| {
        let mut command = Command::new(bin());
        command
            .current_dir(dir.path())
            .args([
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--grpc-addr",
                "off",
                "--db",
            ])
            .arg(db);
        command
    };

    let serve_second_name = output_within(serve_on(&second_name), dir.path());
    let stderr = String::from_utf8_lossy(&serve_second_name.stderr);
    assert_eq!(serve_second_name.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("linked.db")
            && stderr.contains("another name")
            && stderr.contains("2 hard links"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        !dir.path().join("linked.db-wal").exists(),
        "refused before SQLite opened the file"
    );
    let mut command = Command::new(bin());
    command
        .args(["demo", "--runs", "1", "--db"])
        .arg(&second_name);
    let demo_second_name = output_within(command, dir.path());
    let stderr = String::from_utf8_lossy(&demo_second_name.stderr);
    assert!(!demo_second_name.status.success(), "{stderr}");
    assert!(stderr.contains("another name"), "{stderr}");

    // The same name: a demo and a second instance work beside the first server.
    let mut command = Command::new(bin());
    command
        .args(["demo", "--runs", "1", "--db"])
        .arg(&first_name);
    let demo_same_name = output_within(command, dir.path());
    assert!(demo_same_name.status.success(), "{demo_same_name:?}");
    let mut command = serve_on(&first_name);
    command.args(["--instance", "another-instance"]);
    let other_instance = ServeProcess::spawn(command, START_TIMEOUT);
    start_span(other_instance.addr, "written-by-the-second-instance");
    let (status, _) = request(
        server.addr,
        "GET",
        "/v1/activity/spans/written-by-the-second-instance",
        None,
    );
    assert_eq!(
        status, 200,
        "one file, one log: each server reads the other's writes"
    );
    stop(other_instance);
    stop(server);

    // Free again: the other name serves the same file, with everything written before.
    let on_second_name = ServeProcess::spawn(serve_on(&second_name), START_TIMEOUT);
    for span in ["written-by-the-first", "written-by-the-second-instance"] {
        let (status, body) = request(
            on_second_name.addr,
            "GET",
            &format!("/v1/activity/spans/{span}"),
            None,
        );
        assert_eq!(status, 200, "{span}: {body}");
    }
    stop(on_second_name);
}

/// Run `command` (with no `FLIGHTLOG_*` variable inherited) to its end, its output collected in
/// files under `dir`; a process still running after a minute is killed and the test fails (a
/// server that should have been refused would otherwise keep the test waiting for ever).
fn output_within(mut command: Command, dir: &Path) -> std::process::Output {
    let stdout_path = dir.join("command.stdout");
    let stderr_path = dir.join("command.stderr");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FLIGHTLOG") {
            command.env_remove(&name);
        }
    }
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("an output file"))
        .stderr(std::fs::File::create(&stderr_path).expect("an output file"));
    let mut child = command.spawn().expect("start the command");
    let status = support::wait_at_most(&mut child, START_TIMEOUT);
    let read = |path: &Path| std::fs::read(path).unwrap_or_default();
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "{command:?} still ran after {START_TIMEOUT:?}:\n{}",
            String::from_utf8_lossy(&read(&stderr_path))
        );
    };
    std::process::Output {
        status,
        stdout: read(&stdout_path),
        stderr: read(&stderr_path),
    }
}
