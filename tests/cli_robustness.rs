//! Bad command lines, settings and database files against the real `flightlog` binary.
//!
//! Why this file exists: the repository rule "bad input gets a clear error (a CLI message with
//! the fix), never a panic, and never loses what was already stored" is about the binary as a
//! user runs it, so these tests start `flightlog` itself as a child process (never the library
//! functions behind it). Each case checks the exit status (or that `serve` refused before
//! listening), that stderr holds no panic, that the message names the offending flag, variable,
//! config key or file and says what would be valid, and, where a good database was named, that
//! it is byte-for-byte unchanged or, after a start that failed late, still opens with all its
//! runs. Every child gets a time limit, so a hang fails its case instead of the suite.
//!
//! Servers here only ever listen on 127.0.0.1 with port 0, with `--grpc-addr off` unless the
//! gRPC address is what a case is about. The defects this file found are fixed; their minimal
//! cases stay at the end of the file as regression tests.

#![cfg(unix)]

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, ErrorKind, Read, Seek, SeekFrom, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[allow(dead_code)] // Each test file uses its own part of the shared helpers.
mod support;

use support::flightlog_binary as bin;
use support::LISTENING;

/// No case may take longer than this; a child still running then is killed and the case fails.
/// A hang is what it catches: the cases take well under a second alone, and a few seconds on a
/// machine busy with the other test binaries (a 300-run demo beside a sweeping server).
const CASE_TIMEOUT: Duration = Duration::from_secs(30);

/// The flags that keep a `serve` case on loopback and off the default gRPC port.
const LOOPBACK: [&str; 4] = ["--addr", "127.0.0.1:0", "--grpc-addr", "off"];

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// A scratch folder, removed (after restoring write permission) when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "flightlog-cli-robustness-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create the scratch folder");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        make_writable(&self.0);
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn make_writable(path: &Path) {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if meta.is_dir() {
            let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o755));
            if let Ok(entries) = fs::read_dir(path) {
                for entry in entries.flatten() {
                    make_writable(&entry.path());
                }
            }
        } else if meta.is_file() {
            let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o644));
        }
    }
}

fn s(path: &Path) -> String {
    path.to_str().expect("scratch paths are UTF-8").to_owned()
}

/// A running `flightlog` child whose stdout and stderr lines arrive on a channel.
struct Spawned {
    child: Child,
    lines: mpsc::Receiver<(bool, String)>,
    readers: Vec<JoinHandle<()>>,
    stdout: String,
    stderr: String,
    description: String,
}

fn spawn(dir: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Spawned {
    spawn_under(&[], dir, args, env)
}

/// [`spawn`], the binary run by the command `wrapper` (`["prlimit", "--nofile=256:4096"]`).
fn spawn_under(wrapper: &[&str], dir: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Spawned {
    let mut command = match wrapper.split_first() {
        None => Command::new(bin()),
        Some((program, wrapper_args)) => {
            let mut command = Command::new(program);
            command.args(wrapper_args).arg(bin());
            command
        }
    };
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Only what the case sets: nothing inherited may change the settings or the panic output.
    for (name, _) in std::env::vars_os() {
        if name.as_bytes().starts_with(b"FLIGHTLOG_") {
            command.env_remove(&name);
        }
    }
    command.env_remove("RUST_BACKTRACE");
    command.env_remove("RUST_LIB_BACKTRACE");
    for (name, value) in env {
        command.env(name, value);
    }
    let description = format!(
        "{}flightlog {}",
        env.iter()
            .map(|(n, v)| format!("{n}={:?} ", v.to_string_lossy()))
            .collect::<String>(),
        args.iter()
            .map(|a| format!("{:?}", a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut child = command.spawn().expect("start the flightlog binary");
    let (send, lines) = mpsc::channel();
    let mut readers = Vec::new();
    let streams: [(bool, Box<dyn Read + Send>); 2] = [
        (false, Box::new(child.stdout.take().expect("piped stdout"))),
        (true, Box::new(child.stderr.take().expect("piped stderr"))),
    ];
    for (is_stderr, stream) in streams {
        let send = send.clone();
        readers.push(std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = String::from_utf8_lossy(&line).into_owned();
                        if send.send((is_stderr, text)).is_err() {
                            break;
                        }
                    }
                }
            }
        }));
    }
    Spawned {
        child,
        lines,
        readers,
        stdout: String::new(),
        stderr: String::new(),
        description,
    }
}

impl Spawned {
    fn take(&mut self, (is_stderr, line): (bool, String)) -> bool {
        let listening = !is_stderr && line.starts_with(LISTENING);
        if is_stderr {
            self.stderr.push_str(&line);
        } else {
            self.stdout.push_str(&line);
        }
        listening
    }

    /// Wait until the child exits, prints its listening line, or runs out of time.
    fn wait_for_exit_or_listening(&mut self) -> (Option<ExitStatus>, bool, bool) {
        let started = Instant::now();
        loop {
            match self.lines.recv_timeout(Duration::from_millis(20)) {
                Ok(line) => {
                    if self.take(line) {
                        return (None, true, false);
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            if let Some(status) = self.child.try_wait().expect("poll the child") {
                return (Some(status), false, false);
            }
            if started.elapsed() > CASE_TIMEOUT {
                return (None, false, true);
            }
        }
    }

    /// Kill the child (if still running) and collect the rest of its output.
    fn finish(mut self) -> (String, String) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in std::mem::take(&mut self.readers) {
            let _ = reader.join();
        }
        while let Ok(line) = self.lines.try_recv() {
            self.take(line);
        }
        (
            std::mem::take(&mut self.stdout),
            std::mem::take(&mut self.stderr),
        )
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one run of the binary did.
struct Outcome {
    description: String,
    /// `None` when the child was killed: it listened, or it timed out.
    status: Option<ExitStatus>,
    listening: bool,
    timed_out: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "\n  command: {}\n  status: {:?} listening: {} timed out: {}\n  stdout: {}\n  stderr: {}",
            self.description,
            self.status,
            self.listening,
            self.timed_out,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

fn run_os(dir: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Outcome {
    run_under(&[], dir, args, env)
}

/// [`run_os`], the binary run by the command `wrapper` (see [`spawn_under`]).
fn run_under(wrapper: &[&str], dir: &Path, args: &[&OsStr], env: &[(&str, &OsStr)]) -> Outcome {
    let mut spawned = spawn_under(wrapper, dir, args, env);
    let description = spawned.description.clone();
    let (status, listening, timed_out) = spawned.wait_for_exit_or_listening();
    let (stdout, stderr) = spawned.finish();
    Outcome {
        description,
        status,
        listening,
        timed_out,
        stdout,
        stderr,
    }
}

/// Run `flightlog ARGS` in `dir` with only the `FLIGHTLOG_*` variables in `env`.
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(n, v)| (*n, OsStr::new(v))).collect();
    run_os(dir, &args, &env)
}

impl Outcome {
    fn assert_no_panic(&self) {
        assert!(
            !self.timed_out,
            "the case hung (killed after {CASE_TIMEOUT:?}):{self}"
        );
        for marker in ["panicked at", "RUST_BACKTRACE", "stack backtrace"] {
            assert!(!self.stderr.contains(marker), "a panic:{self}");
        }
    }

    /// A refusal: exited non-zero before listening, no panic, and stderr holds every needle.
    fn assert_refused(&self, needles: &[&str]) {
        self.assert_no_panic();
        assert!(!self.listening, "started although the input is bad:{self}");
        let status = self.status.expect("exited");
        assert!(!status.success(), "exit status 0 for bad input:{self}");
        assert!(
            !self.stderr.trim().is_empty(),
            "refused without a message:{self}"
        );
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "the message does not say {needle:?}:{self}"
            );
        }
    }

    /// A `clap` refusal: exit status 2, the usage error names `needles` and points at `--help`.
    fn assert_usage_error(&self, needles: &[&str]) {
        self.assert_refused(needles);
        assert_eq!(self.status.and_then(|s| s.code()), Some(2), "{self}");
        assert!(self.stderr.starts_with("error: "), "{self}");
        assert!(
            self.stderr.contains("--help") || self.stderr.contains("Usage:"),
            "no pointer to the usage:{self}"
        );
    }

    fn assert_listened(&self) {
        self.assert_no_panic();
        assert!(self.listening, "expected a start:{self}");
    }

    fn assert_success(&self) {
        self.assert_no_panic();
        assert!(
            self.status.is_some_and(|s| s.success()),
            "expected success:{self}"
        );
    }
}

/// `GET path` on `addr` over a fresh connection; the status and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_exchange(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )
}

/// `POST path` with a JSON `body` on `addr` over a fresh connection; the status and the body.
fn http_post(addr: &str, path: &str, body: &str) -> (u16, String) {
    http_exchange(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Send `request` (a whole HTTP/1.1 request asking to close) on a fresh connection to `addr`;
/// the answer's status and body.
fn http_exchange(addr: &str, request: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to the server");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("set a read timeout");
    stream
        .write_all(request.as_bytes())
        .expect("send the request");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .expect("read the response");
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The address a spawned `serve` printed in its listening line.
fn listening_addr(server: &Spawned) -> String {
    server
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix(LISTENING))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .expect("the listening address")
}

/// `serve` on `db` (loopback, no gRPC), started in `scratch`; panics with its output unless it
/// listens. The server and its address.
fn serve_on(scratch: &Scratch, db: &Path) -> (Spawned, String) {
    serve_under(&[], scratch, db)
}

/// [`serve_on`], the binary run by the command `wrapper` (see [`spawn_under`]).
fn serve_under(wrapper: &[&str], scratch: &Scratch, db: &Path) -> (Spawned, String) {
    let mut args: Vec<&OsStr> = vec![OsStr::new("serve"), OsStr::new("--db"), db.as_os_str()];
    args.extend(LOOPBACK.map(OsStr::new));
    let mut server = spawn_under(wrapper, scratch.path(), &args, &[]);
    let (_, listening, _) = server.wait_for_exit_or_listening();
    assert!(
        listening,
        "serve on {} does not start:\n{}",
        db.display(),
        server.stderr
    );
    let addr = listening_addr(&server);
    (server, addr)
}

/// A `GET path` on `addr` answered 200 (a live stream, its head read), whose events are read
/// later with `read_stream_until`.
fn open_stream(addr: &str, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect to the server");
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .expect("send the request");
    let head = read_stream_until(
        stream.try_clone().expect("clone the connection"),
        "\r\n\r\n",
        Duration::from_secs(10),
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{path}: {head}");
    stream
}

/// What `stream` sends until its text holds `needle`, it ends, or `limit` passes.
fn read_stream_until(mut stream: TcpStream, needle: &str, limit: Duration) -> String {
    let started = Instant::now();
    let mut text = Vec::new();
    let mut buffer = [0u8; 4096];
    while started.elapsed() < limit && !String::from_utf8_lossy(&text).contains(needle) {
        stream
            .set_read_timeout(Some(Duration::from_millis(500)))
            .expect("set a read timeout");
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => text.extend_from_slice(&buffer[..read]),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(err) => panic!("reading the stream: {err}"),
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Send SIGTERM to a spawned `serve` and wait (bounded) for it to exit; its stdout and stderr.
fn stop_with_sigterm(server: Spawned) -> (ExitStatus, String, String) {
    stop_with_signal(server, "TERM")
}

/// Send the signal `name` (`TERM`, `HUP`) to a spawned `serve` and wait (bounded) for it to
/// exit; its stdout and stderr.
fn stop_with_signal(mut server: Spawned, name: &str) -> (ExitStatus, String, String) {
    let pid = server.child.id().to_string();
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .expect("run kill");
    assert!(sent.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("poll") {
            break status;
        }
        assert!(
            started.elapsed() < CASE_TIMEOUT,
            "serve did not stop on SIG{name}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = server.finish();
    (status, stdout, stderr)
}

/// The database files whose bytes a refused start must leave alone.
fn db_files(db: &Path) -> Vec<PathBuf> {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    vec![db.to_owned(), PathBuf::from(wal)]
}

/// A database recorded by `flightlog demo --runs 5`, with its run ids and its bytes.
struct GoodDb {
    path: PathBuf,
    run_ids: Vec<String>,
    bytes: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl GoodDb {
    fn create(scratch: &Scratch) -> Self {
        let path = scratch.join("good.db");
        let out = run(
            scratch.path(),
            &["demo", "--db", &s(&path), "--runs", "5"],
            &[],
        );
        out.assert_success();
        let mut run_ids: Vec<String> = Vec::new();
        for word in out.stdout.split(|c: char| c.is_whitespace() || c == ',') {
            let word = word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-');
            if word.starts_with("demo")
                && word.contains("-run-")
                && !run_ids.iter().any(|r| r == word)
            {
                run_ids.push(word.to_owned());
            }
        }
        assert_eq!(run_ids.len(), 6, "5 finished runs and 1 running:{out}");
        let mut good = Self {
            path,
            run_ids,
            bytes: Vec::new(),
        };
        good.remember_bytes();
        good
    }

    fn arg(&self) -> String {
        s(&self.path)
    }

    fn remember_bytes(&mut self) {
        self.bytes = db_files(&self.path)
            .into_iter()
            .map(|file| {
                let bytes = fs::read(&file).ok();
                (file, bytes)
            })
            .collect();
    }

    /// For a start refused before the database was opened: not one byte differs.
    fn assert_unchanged(&self, after: &Outcome) {
        for (file, bytes) in &self.bytes {
            assert!(
                fs::read(file).ok() == *bytes,
                "{} changed after a refused start:{after}",
                file.display()
            );
        }
    }

    /// The database still opens and serves every run the demo recorded.
    fn assert_still_serves(&self, scratch: &Scratch) {
        let mut args: Vec<&OsStr> = ["serve", "--db"].map(OsStr::new).to_vec();
        let db = self.path.clone();
        args.push(db.as_os_str());
        args.extend(LOOPBACK.map(OsStr::new));
        let mut server = spawn(scratch.path(), &args, &[]);
        let (status, listening, _) = server.wait_for_exit_or_listening();
        let addr = server
            .stdout
            .lines()
            .find_map(|line| line.strip_prefix(LISTENING))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned);
        let (stdout, stderr) = (server.stdout.clone(), server.stderr.clone());
        assert!(
            listening,
            "the good database no longer opens ({status:?}):\n{stdout}\n{stderr}"
        );
        let addr = addr.expect("the listening address");
        let (code, body) = http_get(&addr, "/v1/activity/runs?limit=50");
        server.finish();
        assert_eq!(code, 200, "{body}");
        for run_id in &self.run_ids {
            assert!(
                body.contains(&format!("\"runId\":\"{run_id}\"")),
                "run {run_id} is gone from the good database: {body}"
            );
        }
    }
}

/// Whether file permissions stop this process (false as root or with CAP_DAC_OVERRIDE).
fn permission_checks_apply(scratch: &Scratch) -> bool {
    let probe = scratch.join("permission-probe");
    fs::write(&probe, b"probe").expect("write the probe");
    fs::set_permissions(&probe, fs::Permissions::from_mode(0o444)).expect("chmod the probe");
    let writable = fs::OpenOptions::new().write(true).open(&probe).is_ok();
    let _ = fs::set_permissions(&probe, fs::Permissions::from_mode(0o644));
    let _ = fs::remove_file(&probe);
    !writable
}

/// `path` given to the user [`unprivileged_wrapper`] runs the binary as, when it runs it as
/// another user (`wrapper` not empty).
fn give_to_runner(wrapper: &[String], path: &Path) {
    if !wrapper.is_empty() {
        std::os::unix::fs::chown(path, Some(UNPRIVILEGED_ID), Some(UNPRIVILEGED_ID))
            .expect("give the file to nobody");
    }
}

/// [`run_under`] with `args` as text.
fn run_wrapped(wrapper: &[String], dir: &Path, args: &[&str]) -> Outcome {
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    run_under(&wrapper, dir, &args, &[])
}

/// The user (and group) id files are given to, and the binary run as, where this process's own
/// ignores file permissions: `nobody`.
const UNPRIVILEGED_ID: u32 = 65_534;

/// How to run the binary so that file permissions stop it: as is where they stop this process;
/// as root, under `setpriv` as [`UNPRIVILEGED_ID`], to which the scratch folder is then given
/// (the files the case makes in it are given by the case). `None` where neither works (root
/// without `setpriv`, or with a binary that user cannot reach): the case is then skipped, said
/// on stderr.
fn unprivileged_wrapper(scratch: &Scratch) -> Option<Vec<String>> {
    if permission_checks_apply(scratch) {
        return Some(Vec::new());
    }
    let wrapper = vec![
        "setpriv".to_owned(),
        format!("--reuid={UNPRIVILEGED_ID}"),
        format!("--regid={UNPRIVILEGED_ID}"),
        "--clear-groups".to_owned(),
    ];
    // `setpriv` there, and the binary reachable by that user (a checkout under a private home
    // folder is not).
    let runs = Command::new(&wrapper[0])
        .args(&wrapper[1..])
        .arg(bin())
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !runs {
        eprintln!(
            "skipped: file permissions do not stop this process (root?), and the binary cannot \
             be run as uid {UNPRIVILEGED_ID} with setpriv"
        );
        return None;
    }
    std::os::unix::fs::chown(scratch.path(), Some(UNPRIVILEGED_ID), Some(UNPRIVILEGED_ID))
        .expect("give the scratch folder to nobody");
    Some(wrapper)
}

fn serve_args<'a>(db: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["serve", "--db", db];
    args.extend_from_slice(extra);
    args
}

/// A copy of the good database with its WAL folded into the main file, so the file alone holds
/// everything: a `serve` on the copy, stopped with SIGTERM, copies its WAL into the file and
/// removes it (see `a_clean_stop_leaves_everything_in_the_database_file_itself`).
fn checkpointed_copy(scratch: &Scratch, good: &GoodDb, name: &str) -> PathBuf {
    let copy = scratch.join(name);
    for (from, to) in db_files(&good.path).iter().zip(db_files(&copy)) {
        if from.exists() {
            fs::copy(from, to).expect("copy the database");
        }
    }
    let (server, _) = serve_on(scratch, &copy);
    let (status, stdout, stderr) = stop_with_sigterm(server);
    assert!(status.success(), "{status:?}\n{stdout}\n{stderr}");
    let wal = db_files(&copy).remove(1);
    assert!(
        fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the WAL of {} was not folded into the file at a clean stop:\n{stdout}\n{stderr}",
        copy.display()
    );
    let _ = fs::remove_file(&wal);
    let mut shm = copy.as_os_str().to_owned();
    shm.push("-shm");
    let _ = fs::remove_file(shm);
    copy
}

// ---------------------------------------------------------------------------------------------
// The command line itself
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_commands_flags_missing_values_and_repeated_flags_are_usage_errors() {
    let scratch = Scratch::new("usage");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    let dir = scratch.path();

    // No command: the usage, with the commands, on stderr and exit status 2.
    let out = run(dir, &[], &[]);
    out.assert_refused(&["Usage: flightlog <COMMAND>", "serve", "demo", "--help"]);
    assert_eq!(out.status.and_then(|s| s.code()), Some(2), "{out}");
    let out = run(dir, &["bogus"], &[]);
    out.assert_usage_error(&["unrecognized subcommand 'bogus'"]);
    let out = run(dir, &["--db", &db], &[]);
    out.assert_usage_error(&["--db"]);

    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        // Unknown flags.
        (serve_args(&db, &["--bogus"]), &["'--bogus'"]),
        (
            serve_args(&db, &["--bodylimit", "8MiB"]),
            &["'--bodylimit'"],
        ),
        (vec!["demo", "--db", &db, "--bogus"], &["'--bogus'"]),
        (
            vec!["demo", "--db", &db, "--addr", "127.0.0.1:0"],
            &["'--addr'"],
        ),
        // A flag without its value.
        (vec!["serve", "--db"], &["--db <PATH>"]),
        (serve_args(&db, &["--addr"]), &["--addr <HOST:PORT>"]),
        (
            serve_args(&db, &["--grpc-addr"]),
            &["--grpc-addr <HOST:PORT|off>"],
        ),
        (serve_args(&db, &["--body-limit"]), &["--body-limit <SIZE>"]),
        (serve_args(&db, &["--token"]), &["--token <SECRET>"]),
        (serve_args(&db, &["--config"]), &["--config <PATH>"]),
        (
            serve_args(&db, &["--journal-max-events"]),
            &["--journal-max-events <N>"],
        ),
        (vec!["demo", "--db", &db, "--runs"], &["--runs <RUNS>"]),
        (vec!["demo", "--db"], &["--db <PATH>"]),
        // A switch's value given apart from it (it takes `=BOOL` only).
        (
            serve_args(&db, &["--manual-clock", "false"]),
            &[
                "unexpected argument 'false'",
                "--manual-clock takes its value after `=`: write --manual-clock=false",
            ],
        ),
        (
            serve_args(&db, &["--allow-unauthenticated-non-loopback", "true"]),
            &["write --allow-unauthenticated-non-loopback=true"],
        ),
        // Flags that cannot sensibly be given twice.
        (
            vec!["serve", "--db", &db, "--db", "other.db"],
            &["'--db <PATH>' cannot be used multiple times"],
        ),
        (
            serve_args(&db, &["--addr", "127.0.0.1:0", "--addr", "127.0.0.1:0"]),
            &["'--addr <HOST:PORT>' cannot be used multiple times"],
        ),
        (
            serve_args(&db, &["--body-limit", "1", "--body-limit", "2"]),
            &["'--body-limit <SIZE>' cannot be used multiple times"],
        ),
        (
            serve_args(&db, &["--config", "a.toml", "--config", "b.toml"]),
            &["'--config <PATH>' cannot be used multiple times"],
        ),
        (
            serve_args(&db, &["--manual-clock", "--manual-clock"]),
            &["'--manual-clock[=<BOOL>]' cannot be used multiple times"],
        ),
        (
            vec!["demo", "--db", &db, "--runs", "1", "--runs", "2"],
            &["'--runs <RUNS>' cannot be used multiple times"],
        ),
    ];
    for (args, needles) in cases {
        let out = run(dir, &args, &[]);
        out.assert_usage_error(needles);
        good.assert_unchanged(&out);
    }
    good.assert_still_serves(&scratch);
}

// ---------------------------------------------------------------------------------------------
// Addresses
// ---------------------------------------------------------------------------------------------

/// `FLIGHTLOG_*` variables for one case.
type Env<'a> = Vec<(&'a str, &'a str)>;

/// An address setting's three names.
#[derive(Clone, Copy)]
struct AddrSetting {
    flag: &'static str,
    env: &'static str,
    key: &'static str,
}

const ADDR: AddrSetting = AddrSetting {
    flag: "--addr",
    env: "FLIGHTLOG_ADDR",
    key: "addr",
};

const GRPC_ADDR: AddrSetting = AddrSetting {
    flag: "--grpc-addr",
    env: "FLIGHTLOG_GRPC_ADDR",
    key: "grpc_addr",
};

/// Run `serve` on the good database with `setting` taken from the flag, the variable and the
/// config file in turn (the other address flags keep it on loopback); each must be refused
/// with `needles`, before the database is touched. `{origin}` in a needle stands for where the
/// value came from (`--addr`, `FLIGHTLOG_ADDR`, `` `addr` in FILE ``).
fn refuse_everywhere(
    scratch: &Scratch,
    good: &GoodDb,
    setting: &AddrSetting,
    text: &str,
    toml: &str,
    needles: &[&str],
) {
    let AddrSetting { flag, env, key } = *setting;
    let db = good.arg();
    let others: Vec<&str> = LOOPBACK
        .chunks(2)
        .filter(|pair| pair[0] != flag)
        .flatten()
        .copied()
        .collect();
    let config = scratch.join("flightlog.toml");
    let config_arg = s(&config);
    let base = serve_args(&db, &others);
    let with_flag = [base.as_slice(), &[flag, text]].concat();
    let with_config = [base.as_slice(), &["--config", &config_arg]].concat();
    let file_origin = format!("`{key}` in {config_arg}");
    let sources: Vec<(Vec<&str>, Env, String)> = vec![
        (with_flag, vec![], flag.to_owned()),
        (base.clone(), vec![(env, text)], env.to_owned()),
        (with_config, vec![], file_origin),
    ];
    for (args, vars, origin) in sources {
        if origin == env && text.trim().is_empty() {
            continue; // an empty variable counts as unset (documented)
        }
        fs::write(&config, format!("{key} = {toml}\n")).expect("write the config file");
        let out = run(scratch.path(), &args, &vars);
        let all: Vec<String> = needles
            .iter()
            .map(|n| n.replace("{origin}", &origin))
            .collect();
        out.assert_refused(&all.iter().map(String::as_str).collect::<Vec<_>>());
        good.assert_unchanged(&out);
    }
}

#[test]
fn bad_addresses_are_refused_with_the_valid_form() {
    let scratch = Scratch::new("addr");
    let good = GoodDb::create(&scratch);
    let fix = "is not valid: give HOST:PORT, such as 127.0.0.1:4318";
    for (text, toml) in [
        ("notanaddress", "\"notanaddress\""),
        ("127.0.0.1:70000", "\"127.0.0.1:70000\""),
        ("127.0.0.1:-1", "\"127.0.0.1:-1\""),
        ("127.0.0.1:", "\"127.0.0.1:\""),
        (":4318", "\":4318\""),
        ("127.0.0.1", "\"127.0.0.1\""),
        ("127.0.0.1 :0", "\"127.0.0.1 :0\""),
        ("", "\"\""),
        ("4318", "\"4318\""),
        ("::1:4318", "\"::1:4318\""),
        ("true", "\"true\""),
    ] {
        refuse_everywhere(&scratch, &good, &ADDR, text, toml, &["{origin} = ", fix]);
    }
    let grpc_fix = "is not valid: give HOST:PORT, such as 127.0.0.1:4317 or [::1]:4317, or `off`";
    for (text, toml) in [
        ("bad", "\"bad\""),
        ("no", "\"no\""),
        ("127.0.0.1:99999", "\"127.0.0.1:99999\""),
        ("", "\"\""),
    ] {
        refuse_everywhere(
            &scratch,
            &good,
            &GRPC_ADDR,
            text,
            toml,
            &["{origin} = ", grpc_fix],
        );
    }
    // An array where one address goes.
    refuse_everywhere(
        &scratch,
        &good,
        &ADDR,
        "[127.0.0.1:0]",
        "[\"127.0.0.1:0\"]",
        &["{origin} ", "is not valid: give"],
    );
    good.assert_still_serves(&scratch);
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused_with_how_to_allow_it() {
    let scratch = Scratch::new("exposure");
    let good = GoodDb::create(&scratch);
    let how = [
        "refusing to listen on",
        "without any token",
        "--token",
        "FLIGHTLOG_TOKENS",
        "127.0.0.1:",
        "--allow-unauthenticated-non-loopback",
        "FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK=true",
        "`allow_unauthenticated_non_loopback = true` in the config file",
    ];
    for addr in ["0.0.0.0:0", "[::]:0"] {
        // The message names the address itself (not where it came from) and how to allow it.
        refuse_everywhere(&scratch, &good, &ADDR, addr, &format!("{addr:?}"), &how);
    }
    let db = good.arg();
    // The gRPC listener gets the same guard.
    let out = run(
        scratch.path(),
        &serve_args(&db, &["--addr", "127.0.0.1:0", "--grpc-addr", "0.0.0.0:0"]),
        &[],
    );
    out.assert_refused(&how);
    // Naming the listener and its setting, not only the address (an audit's finding).
    out.assert_refused(&["the OTLP/gRPC listener at 0.0.0.0:0 (--grpc-addr"]);
    good.assert_unchanged(&out);
    // A broken token is refused itself rather than taken as configured authentication.
    let out = run(
        scratch.path(),
        &serve_args(&db, &["--addr", "0.0.0.0:0", "--grpc-addr", "off"]),
        &[("FLIGHTLOG_TOKENS", "secret-without-scopes")],
    );
    out.assert_refused(&["FLIGHTLOG_TOKENS entry 1"]);
    good.assert_unchanged(&out);
    good.assert_still_serves(&scratch);
}

/// The gRPC listener on the HTTP listener's port failed to bind with "address in use" and
/// "choose a free port", and once the server had exited nothing held the port (an audit's
/// finding): the collision is now said as such, before anything is bound or opened.
#[test]
fn one_port_for_both_listeners_is_refused_as_such() {
    let scratch = Scratch::new("one-port");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    let out = run(
        scratch.path(),
        &serve_args(
            &db,
            &[
                "--addr",
                "127.0.0.1:18698",
                "--grpc-addr",
                "127.0.0.1:18698",
            ],
        ),
        &[],
    );
    out.assert_refused(&[
        "both take port 18698",
        "need different ports",
        "--grpc-addr",
        "--addr",
    ]);
    good.assert_unchanged(&out);
}

#[test]
fn an_unresolvable_host_is_refused_without_a_panic() {
    let scratch = Scratch::new("host");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    let out = run(
        scratch.path(),
        &serve_args(
            &db,
            &["--addr", "no-such-host.invalid:4318", "--grpc-addr", "off"],
        ),
        // A resolver that drops the query rather than answering it (a CI host with its egress
        // limited) would otherwise take up to 5 s a try, twice, a server and search domain.
        &[("RES_OPTIONS", "timeout:1 attempts:1")],
    );
    out.assert_refused(&["no-such-host.invalid:4318", "cannot resolve"]);
    good.assert_unchanged(&out);
    good.assert_still_serves(&scratch);
}

#[test]
fn a_port_already_in_use_is_refused_and_the_database_keeps_its_runs() {
    let scratch = Scratch::new("in-use");
    let mut good = GoodDb::create(&scratch);
    good.remember_bytes();
    let db = good.arg();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = taken.local_addr().expect("its address").port();
    let busy = format!("127.0.0.1:{port}");

    let out = run(
        scratch.path(),
        &serve_args(&db, &["--addr", &busy, "--grpc-addr", "off"]),
        &[],
    );
    out.assert_refused(&["cannot listen on", &busy, "in use", "--addr", "free port"]);
    good.assert_unchanged(&out);

    let out = run(
        scratch.path(),
        &serve_args(&db, &["--addr", "127.0.0.1:0", "--grpc-addr", &busy]),
        &[],
    );
    out.assert_refused(&[
        "cannot listen on",
        &busy,
        "OTLP/gRPC",
        "--grpc-addr",
        "`off`",
        "in use",
    ]);
    // The listeners are bound before the database is opened: the demo's running run was not
    // swept as "server restarted" by a start that never served.
    good.assert_unchanged(&out);
    drop(taken);
    good.assert_still_serves(&scratch);
}

/// An address this machine does not have (192.0.2.1 is reserved for documentation, so no
/// interface holds it): the port is not what to change, and the message says so. Nothing
/// listens: the bind fails.
#[test]
fn an_address_this_machine_does_not_have_is_refused_with_the_right_fix() {
    // A host that lets any address be bound (`net.ipv4.ip_nonlocal_bind`) would have the
    // server listen there, off loopback, which no test may do: nothing to check on such a host.
    let nonlocal_bind = std::fs::read_to_string("/proc/sys/net/ipv4/ip_nonlocal_bind")
        .is_ok_and(|value| value.trim() != "0");
    if nonlocal_bind {
        println!("skipped: net.ipv4.ip_nonlocal_bind is on, so 192.0.2.1 could be bound");
        return;
    }
    let scratch = Scratch::new("foreign-addr");
    let mut good = GoodDb::create(&scratch);
    good.remember_bytes();
    let db = good.arg();
    let out = run(
        scratch.path(),
        &serve_args(
            &db,
            &[
                "--addr",
                "192.0.2.1:4318",
                "--grpc-addr",
                "off",
                "--allow-unauthenticated-non-loopback",
            ],
        ),
        &[],
    );
    out.assert_refused(&[
        "cannot listen on",
        "192.0.2.1:4318",
        "not one of this machine's",
        "127.0.0.1",
    ]);
    good.assert_unchanged(&out);
}

// ---------------------------------------------------------------------------------------------
// Numbers, sizes, durations, switches: flag, variable and config file
// ---------------------------------------------------------------------------------------------

struct Numeric {
    flag: &'static str,
    env: &'static str,
    key: &'static str,
    /// Bad values as flag and variable text.
    texts: &'static [&'static str],
    /// Bad values as TOML literals.
    tomls: &'static [&'static str],
    /// What the fix says.
    fix: &'static str,
    /// The TOML types the file may give it (`toml_kind`'s names); another type is refused for
    /// its type, before its value is looked at.
    takes: &'static [&'static str],
}

/// The TOML type of a literal as these tests write them.
fn toml_kind(toml: &str) -> &'static str {
    match toml.trim().as_bytes().first() {
        Some(b'"') => "string",
        Some(b't' | b'f') => "boolean",
        Some(b'[') => "array",
        Some(b'{') => "table",
        _ if toml.contains('-') && toml.len() == 10 => "datetime",
        _ if toml.contains(['.', 'e']) => "float",
        _ => "integer",
    }
}

/// What a size setting (`--body-limit`, `--response-budget`, `--request-budget`) refuses, as text and in a file,
/// and the fix it names.
/// Values refused by the counts from 1 to 1,000,000 (`--max-inflight-writes`,
/// `--max-connections`): on the command line or in the environment, and in the config file.
const COUNT_TEXTS: &[&str] = &[
    "-1",
    "0",
    "1000001",
    "abc",
    "1.5",
    "+5",
    "1e3",
    "99999999999999999999999",
    "",
];
const COUNT_TOMLS: &[&str] = &[
    "-1",
    "0",
    "1000001",
    "9223372036854775807",
    "1.5",
    "true",
    "\"abc\"",
];
const SIZE_TEXTS: &[&str] = &[
    "-1",
    "0",
    "0KiB",
    "abc",
    "1.5",
    "8 MB",
    "1TiB",
    "MiB",
    "99999999999999999999999",
    "17179869184GiB",
    "",
];
const SIZE_TOMLS: &[&str] = &[
    "-1",
    "0",
    "1.5",
    "true",
    "\"abc\"",
    "1979-05-27",
    "\"-8MiB\"",
];
const SIZE_FIX: &str =
    "give a size of at least 1 byte and at most 1024GiB: a whole number of bytes, or of KiB, MiB or GiB";

const NUMERIC: [Numeric; 14] = [
    Numeric {
        flag: "--body-limit",
        env: "FLIGHTLOG_BODY_LIMIT",
        key: "body_limit",
        texts: &[
            "-1",
            "0",
            "abc",
            "8 MB",
            "1TiB",
            "100GiB",
            "1025MiB",
            "1073741825",
            "",
        ],
        tomls: &["-1", "0", "1.5", "\"abc\"", "\"2GiB\"", "1073741825"],
        fix: "give a size of at least 1 byte and at most 1GiB: a whole number of bytes, or of KiB, MiB or GiB",
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--response-budget",
        env: "FLIGHTLOG_RESPONSE_BUDGET",
        key: "response_budget",
        texts: SIZE_TEXTS,
        tomls: SIZE_TOMLS,
        fix: SIZE_FIX,
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--request-budget",
        env: "FLIGHTLOG_REQUEST_BUDGET",
        key: "request_budget",
        texts: SIZE_TEXTS,
        tomls: SIZE_TOMLS,
        fix: SIZE_FIX,
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--max-inflight-writes",
        env: "FLIGHTLOG_MAX_INFLIGHT_WRITES",
        key: "max_inflight_writes",
        texts: COUNT_TEXTS,
        tomls: COUNT_TOMLS,
        fix: "give a whole number of write requests from 1 to 1000000",
        takes: &["integer"],
    },
    Numeric {
        flag: "--max-connections",
        env: "FLIGHTLOG_MAX_CONNECTIONS",
        key: "max_connections",
        texts: COUNT_TEXTS,
        tomls: COUNT_TOMLS,
        fix: "give a whole number of connections from 1 to 1000000",
        takes: &["integer"],
    },
    Numeric {
        flag: "--write-lock-wait-ms",
        env: "FLIGHTLOG_WRITE_LOCK_WAIT_MS",
        key: "write_lock_wait_ms",
        texts: &["-1", "600001", "10s", "1.5", "99999999999999999999999", ""],
        tomls: &["-1", "600001", "2.5", "true", "\"10s\""],
        fix: "give a wait in milliseconds from 0 to 600000",
        takes: &["integer"],
    },
    Numeric {
        flag: "--journal-max-events",
        env: "FLIGHTLOG_JOURNAL_MAX_EVENTS",
        key: "journal.max_events",
        texts: &[
            "-1",
            "9007199254740992",
            "abc",
            "1.5",
            "99999999999999999999999",
            "",
        ],
        tomls: &["-1", "9007199254740992", "1.5", "false", "\"ten\""],
        fix: "give a whole number of events per engagement from 0 (no append accepted) to \
              9007199254740991",
        takes: &["integer"],
    },
    Numeric {
        flag: "--journal-max-age-ms",
        env: "FLIGHTLOG_JOURNAL_MAX_AGE_MS",
        key: "journal.max_age_ms",
        texts: &[
            "-1",
            "0",
            "9007199254740992",
            "30d",
            "1e9",
            "99999999999999999999999",
            "",
        ],
        tomls: &[
            "-1",
            "0",
            "9223372036854775807",
            "2.5",
            "true",
            "\"30 days\"",
        ],
        fix: "give an age in milliseconds from 1 to 9007199254740991",
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--maintenance-every-ms",
        env: "FLIGHTLOG_MAINTENANCE_EVERY_MS",
        key: "maintenance.every_ms",
        texts: &["-1", "0", "9", "86400001", "1m", "never", ""],
        tomls: &["5", "86400001", "1.5", "true", "\"hourly\""],
        fix: "give a time between passes in milliseconds from 10 to 86400000, or `off`",
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--stale-after-ms",
        env: "FLIGHTLOG_STALE_AFTER_MS",
        key: "maintenance.stale_after_ms",
        texts: &["-1", "0", "9007199254740992", "2h", ""],
        tomls: &["0", "-5", "2.5", "false", "\"2 hours\""],
        fix: "give a time in milliseconds from 1 to 9007199254740991 after which a run whose \
              root had no heartbeat is closed, or `off`",
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--stuck-after-ms",
        env: "FLIGHTLOG_STUCK_AFTER_MS",
        key: "maintenance.stuck_after_ms",
        texts: &["-1", "0", "1h", ""],
        tomls: &["0", "1.5", "[1]"],
        fix: "give a time in milliseconds from 1 to 9007199254740991 after which an open run \
              counts as stuck, or `off`",
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--prune-after-ms",
        env: "FLIGHTLOG_PRUNE_AFTER_MS",
        key: "maintenance.prune_after_ms",
        texts: &["-1", "0", "30d", "never", ""],
        tomls: &["0", "2.5", "true", "\"a month\""],
        fix: "give a time in milliseconds from 1 to 9007199254740991 after which the span \
              detail of an ended run is deleted, or `off` to keep it",
        takes: &["string", "integer"],
    },
    Numeric {
        flag: "--durability",
        env: "FLIGHTLOG_DURABILITY",
        key: "durability",
        texts: &["fast", "1", "normal,full", "fulll", ""],
        tomls: &["1", "true", "\"fast\""],
        fix: "give `normal` (survives a crash of the process) or `full`",
        takes: &["string"],
    },
    Numeric {
        flag: "--allow-unauthenticated-non-loopback",
        env: "FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK",
        key: "allow_unauthenticated_non_loopback",
        // A switch that takes `=BOOL` (so `=false` can override the environment).
        texts: &["maybe", "2", "y", ""],
        tomls: &["\"maybe\"", "2", "0.5"],
        fix: "give true or false",
        takes: &["boolean"],
    },
];

#[test]
fn bad_numbers_sizes_and_switches_are_refused_from_flag_variable_and_file() {
    let scratch = Scratch::new("numeric");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    let config = scratch.join("flightlog.toml");
    let config_arg = s(&config);
    let base = serve_args(&db, &LOOPBACK);
    let mut cases = 0;
    for setting in &NUMERIC {
        let fix = format!("is not valid: {}", setting.fix);
        for text in setting.texts {
            let mut args = base.clone();
            let flag_value = format!("{}={text}", setting.flag);
            args.push(&flag_value);
            let out = run(scratch.path(), &args, &[]);
            out.assert_refused(&[&format!("{} = {text:?}", setting.flag), &fix]);
            good.assert_unchanged(&out);
            cases += 1;
            if text.trim().is_empty() {
                continue; // an empty variable counts as unset (documented)
            }
            let out = run(scratch.path(), &base, &[(setting.env, text)]);
            out.assert_refused(&[&format!("{} = {text:?}", setting.env), &fix]);
            good.assert_unchanged(&out);
            cases += 1;
        }
        let file_origin = format!("`{}` in {config_arg} = ", setting.key);
        for toml in setting.tomls {
            fs::write(&config, format!("{} = {toml}\n", setting.key)).expect("write config");
            let (origin, fix) = if setting.takes.contains(&toml_kind(toml)) {
                (file_origin.clone(), fix.clone())
            } else {
                (
                    format!("`{}` in {config_arg} is ", setting.key),
                    format!(
                        "(a TOML {}), which is not valid: give a TOML",
                        toml_kind(toml)
                    ),
                )
            };
            let mut args = base.clone();
            args.extend(["--config", &config_arg]);
            let out = run(scratch.path(), &args, &[]);
            out.assert_refused(&[&origin, &fix]);
            good.assert_unchanged(&out);
            // The same file named by FLIGHTLOG_CONFIG.
            let out = run(scratch.path(), &base, &[("FLIGHTLOG_CONFIG", &config_arg)]);
            out.assert_refused(&[&origin, &fix]);
            good.assert_unchanged(&out);
            cases += 2;
        }
        // A table or an array where one value goes.
        for toml in ["[1]", "{ value = 1 }"] {
            fs::write(&config, format!("{} = {toml}\n", setting.key)).expect("write config");
            let mut args = base.clone();
            args.extend(["--config", &config_arg]);
            let out = run(scratch.path(), &args, &[]);
            out.assert_refused(&[
                &format!("`{}` in {config_arg} is ", setting.key),
                "which is not valid: give a",
            ]);
            good.assert_unchanged(&out);
            cases += 1;
        }
    }
    // A TOML integer too large for TOML itself: a syntax error that points at the line (by
    // number: the file's text is not quoted, since a line may hold a token).
    fs::write(&config, "body_limit = 99999999999999999999999\n").expect("write config");
    let mut args = base.clone();
    args.extend(["--config", &config_arg]);
    let out = run(scratch.path(), &args, &[]);
    out.assert_refused(&[
        &format!("the config file {config_arg} is not valid TOML"),
        "at line 1, column 14",
    ]);
    good.assert_unchanged(&out);
    // A value that is not UTF-8 names its variable.
    let out = run_os(
        scratch.path(),
        &base.iter().map(OsStr::new).collect::<Vec<_>>(),
        &[("FLIGHTLOG_BODY_LIMIT", OsStr::from_bytes(b"8\xffMiB"))],
    );
    out.assert_refused(&["FLIGHTLOG_BODY_LIMIT", "not valid UTF-8"]);
    good.assert_unchanged(&out);
    eprintln!("{cases} numeric cases refused");
    good.assert_still_serves(&scratch);
}

#[test]
fn bad_tokens_are_refused_without_repeating_the_secret() {
    let scratch = Scratch::new("tokens");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    let config = scratch.join("flightlog.toml");
    let config_arg = s(&config);
    let base = serve_args(&db, &LOOPBACK);
    let secret = "s3cr3t-value";

    for (token, needle) in [
        ("", "--token (the 1st): a token must not be empty"),
        (
            "s3cr3t-value with space",
            "--token (the 1st): a token may hold only visible ASCII",
        ),
        ("s3cr3t-valué", "a token may hold only visible ASCII"),
    ] {
        let mut args = base.clone();
        args.extend(["--token", "fine-token", "--token", token]);
        let out = run(scratch.path(), &args, &[]);
        out.assert_refused(&[&needle.replace("1st", "2nd")]);
        assert!(!out.stderr.contains(secret), "the secret leaked:{out}");
        good.assert_unchanged(&out);
    }
    for (value, needles) in [
        (
            "s3cr3t-value",
            &["FLIGHTLOG_TOKENS entry 1", "has no scopes", "TOKEN:SCOPE"][..],
        ),
        (
            "ok:read;s3cr3t-value:write",
            &[
                "FLIGHTLOG_TOKENS entry 2",
                "scope other than read, ingest, admin",
            ],
        ),
        (
            "s3cr3t value:read",
            &["FLIGHTLOG_TOKENS entry 1", "visible ASCII"],
        ),
        (":read", &["FLIGHTLOG_TOKENS entry 1", "must not be empty"]),
        (
            "s3cr3t-value:",
            &["FLIGHTLOG_TOKENS entry 1", "at least one scope"],
        ),
    ] {
        let out = run(scratch.path(), &base, &[("FLIGHTLOG_TOKENS", value)]);
        out.assert_refused(needles);
        assert!(!out.stderr.contains(secret), "the secret leaked:{out}");
        good.assert_unchanged(&out);
    }
    let shape = "write each token as a [[tokens]] table";
    for (toml, needles) in [
        (
            "tokens = \"s3cr3t-value\"",
            &["is not a list of tables", shape][..],
        ),
        (
            "tokens = [\"s3cr3t-value\"]",
            &["entry 1: is not a table", shape],
        ),
        (
            "[[tokens]]\ntoken = \"s3cr3t-value\"",
            &["entry 1: has no `scopes` list", shape],
        ),
        (
            "[[tokens]]\nscopes = [\"read\"]",
            &["entry 1: has no `token` string", shape],
        ),
        (
            "[[tokens]]\ntoken = \"s3cr3t-value\"\nscopes = []",
            &["entry 1: a token needs at least one scope"],
        ),
        (
            "[[tokens]]\ntoken = \"s3cr3t-value\"\nscopes = [\"write\"]",
            &[
                "entry 1: names the scope \"write\"; the scopes are read, ingest, admin",
                shape,
            ],
        ),
        (
            "[[tokens]]\ntoken = \"s3cr3t-value\"\nscopes = [\"read\"]\nexpires = 1",
            &["entry 1: has an unknown key `expires`", shape],
        ),
        (
            "[[tokens]]\ntoken = 42\nscopes = [\"read\"]",
            &["entry 1: has a `token` that is no string (a TOML integer)", shape],
        ),
        (
            "[[tokens]]\ntoken = \"s3cr3t-value\"\nscopes = \"read\"",
            &["entry 1: has `scopes` that is no list (a TOML string): give a list such as [\"read\"]", shape],
        ),
    ] {
        fs::write(&config, format!("{toml}\n")).expect("write config");
        let mut args = base.clone();
        args.extend(["--config", &config_arg]);
        let out = run(scratch.path(), &args, &[]);
        let mut all = needles.to_vec();
        let origin = format!("`tokens` in {config_arg}");
        all.push(&origin);
        out.assert_refused(&all);
        assert!(!out.stderr.contains(secret), "the secret leaked:{out}");
        good.assert_unchanged(&out);
    }
    good.assert_still_serves(&scratch);
}

// ---------------------------------------------------------------------------------------------
// The config file
// ---------------------------------------------------------------------------------------------

#[test]
fn config_files_that_are_missing_unreadable_not_toml_or_unknown_are_refused() {
    let scratch = Scratch::new("config");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    let base = serve_args(&db, &LOOPBACK);
    let missing = s(&scratch.join("no-such.toml"));
    let folder = scratch.join("a-folder");
    fs::create_dir(&folder).expect("create a folder");
    let folder = s(&folder);
    let binary = scratch.join("binary.toml");
    fs::write(&binary, [0x00, 0xff, 0xfe, 0x13, 0x37, 0x80, 0x81]).expect("write");
    let binary = s(&binary);
    let text = scratch.join("prose.toml");
    fs::write(&text, "this is not a config file\n").expect("write");
    let text = s(&text);
    let duplicate = scratch.join("duplicate.toml");
    fs::write(&duplicate, "body_limit = 1\nbody_limit = 2\n").expect("write");
    let duplicate = s(&duplicate);
    // A FIFO blocked the start until something wrote to it; a device such as /dev/zero was
    // read until memory ran out; a huge file likewise.
    let fifo = scratch.join("fifo.toml");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let fifo = s(&fifo);
    let huge = scratch.join("huge.toml");
    fs::write(&huge, "# a comment\n".repeat(200_000)).expect("write");
    let huge = s(&huge);

    let read_fail =
        |path: &str, by: &str| format!("cannot read the config file {path} (named by {by})");
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            &missing,
            vec![read_fail(&missing, "X"), "No such file".into()],
        ),
        (&folder, vec![read_fail(&folder, "X"), "directory".into()]),
        (
            &binary,
            vec![
                read_fail(&binary, "X"),
                "UTF-8".into(),
                "save it as UTF-8".into(),
            ],
        ),
        (
            &fifo,
            vec![read_fail(&fifo, "X"), "not a regular file".into()],
        ),
        (
            "/dev/zero",
            vec![read_fail("/dev/zero", "X"), "not a regular file".into()],
        ),
        (&huge, vec![read_fail(&huge, "X"), "larger than".into()]),
        (
            &text,
            vec![
                format!("the config file {text} is not valid TOML"),
                "line 1".into(),
            ],
        ),
        (
            &duplicate,
            vec![
                format!("the config file {duplicate} is not valid TOML"),
                "line 2".into(),
                "duplicate key".into(),
            ],
        ),
    ];
    for (path, needles) in &cases {
        for by in ["--config", "FLIGHTLOG_CONFIG"] {
            let needles: Vec<String> = needles
                .iter()
                .map(|n| n.replace("(named by X)", &format!("(named by {by})")))
                .collect();
            let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
            let out = if by == "--config" {
                let mut args = base.clone();
                args.extend(["--config", path]);
                run(scratch.path(), &args, &[])
            } else {
                run(scratch.path(), &base, &[("FLIGHTLOG_CONFIG", path)])
            };
            out.assert_refused(&needles);
            good.assert_unchanged(&out);
        }
    }

    // Unknown keys (typos, sections, keys of a table that is not a section) name the key and
    // list the valid ones.
    let config = scratch.join("flightlog.toml");
    let config_arg = s(&config);
    for (toml, key) in [
        ("bodylimit = \"8MiB\"", "bodylimit"),
        ("Body_Limit = \"8MiB\"", "Body_Limit"),
        ("journal.max_evnts = 5", "journal.max_evnts"),
        ("journal = 5", "journal"),
        ("[server]\nport = 4318", "server"),
        (
            "[journal]\nmax_events = 5\nretention = 1",
            "journal.retention",
        ),
        ("token = \"abc\"", "token"),
        ("manualclock = true", "manualclock"),
    ] {
        fs::write(&config, format!("{toml}\n")).expect("write config");
        let mut args = base.clone();
        args.extend(["--config", &config_arg]);
        let out = run(scratch.path(), &args, &[]);
        out.assert_refused(&[
            &format!("the config file {config_arg} has an unknown key `{key}`"),
            "the keys are: db, addr, grpc_addr",
            "journal.max_events",
            "flightlog serve --help",
        ]);
        good.assert_unchanged(&out);
    }
    good.assert_still_serves(&scratch);
}

// ---------------------------------------------------------------------------------------------
// Database files
// ---------------------------------------------------------------------------------------------

#[test]
fn database_paths_that_cannot_be_a_database_are_refused_and_left_alone() {
    let scratch = Scratch::new("db");
    let dir = scratch.path();
    let folder = scratch.join("a-folder");
    fs::create_dir(&folder).expect("create a folder");
    let folder = s(&folder);
    let in_missing = s(&scratch.join("no-such-folder").join("x.db"));
    let garbage = scratch.join("garbage.db");
    // Deterministic bytes that are not an SQLite header.
    let garbage_bytes: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(&garbage, &garbage_bytes).expect("write garbage");
    let garbage_arg = s(&garbage);
    let prose = scratch.join("prose.db");
    fs::write(&prose, "SQLite format 2\0 but not really a database\n").expect("write");
    let prose_arg = s(&prose);

    for command in ["serve", "demo"] {
        let args_for = |db: &str| -> Vec<String> {
            let mut args = vec![command.to_owned(), "--db".into(), db.to_owned()];
            if command == "serve" {
                args.extend(LOOPBACK.map(str::to_owned));
            } else {
                args.extend(["--runs".into(), "1".into()]);
            }
            args
        };
        for (db, needles) in [
            (&folder, vec![folder.as_str(), "is a directory"]),
            (&in_missing, vec![in_missing.as_str(), "does not exist"]),
            (
                &garbage_arg,
                vec![garbage_arg.as_str(), "file is not a database"],
            ),
            (
                &prose_arg,
                vec![prose_arg.as_str(), "file is not a database"],
            ),
        ] {
            let args = args_for(db);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run(dir, &args, &[]);
            out.assert_refused(&needles);
            if command == "serve" {
                // The same path from the variable and from the config file.
                let out = run(
                    dir,
                    &["serve", "--addr", "127.0.0.1:0", "--grpc-addr", "off"],
                    &[("FLIGHTLOG_DB", db)],
                );
                out.assert_refused(&needles);
                let config = scratch.join("flightlog.toml");
                fs::write(&config, format!("db = {db:?}\n")).expect("write config");
                let config_arg = s(&config);
                let out = run(
                    dir,
                    &[
                        "serve",
                        "--config",
                        &config_arg,
                        "--addr",
                        "127.0.0.1:0",
                        "--grpc-addr",
                        "off",
                    ],
                    &[],
                );
                out.assert_refused(&needles);
            }
        }
        assert_eq!(
            fs::read(&garbage).expect("read garbage"),
            garbage_bytes,
            "the garbage file was changed by `{command}`"
        );
        assert!(
            !db_files(&garbage)[1].exists(),
            "a WAL appeared next to the garbage"
        );
        assert!(
            !Path::new(&in_missing).parent().expect("parent").exists(),
            "a folder was created"
        );
    }

    // An empty path: from the flag it is a usage error, from the variable it counts as unset
    // (documented), from the file it is refused naming the key.
    let out = run(
        dir,
        &[
            "serve",
            "--db",
            "",
            "--addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
        ],
        &[],
    );
    out.assert_usage_error(&["--db <PATH>"]);
    let config = scratch.join("flightlog.toml");
    let config_arg = s(&config);
    for toml in ["\"\"", "\"  \""] {
        fs::write(&config, format!("db = {toml}\n")).expect("write config");
        let out = run(
            dir,
            &[
                "serve",
                "--config",
                &config_arg,
                "--addr",
                "127.0.0.1:0",
                "--grpc-addr",
                "off",
            ],
            &[],
        );
        out.assert_refused(&[
            &format!("`db` in {config_arg}"),
            "give the path of the database file",
        ]);
    }
    fs::write(&config, "db = [\"a.db\"]\n").expect("write config");
    let out = run(
        dir,
        &[
            "serve",
            "--config",
            &config_arg,
            "--addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
        ],
        &[],
    );
    out.assert_refused(&[&format!("`db` in {config_arg}"), "give a TOML string"]);

    // An empty file is an empty SQLite database: nothing is stored in it to lose, and it
    // becomes a flightlog database.
    let empty = scratch.join("empty.db");
    fs::write(&empty, b"").expect("write an empty file");
    let out = run(dir, &serve_args(&s(&empty), &LOOPBACK), &[]);
    out.assert_listened();
    let out = run(dir, &["demo", "--db", &s(&empty), "--runs", "1"], &[]);
    out.assert_success();
}

#[test]
fn a_database_from_a_newer_flightlog_is_refused_naming_both_versions_and_left_unchanged() {
    let scratch = Scratch::new("newer");
    let good = GoodDb::create(&scratch);
    let newer = checkpointed_copy(&scratch, &good, "newer.db");
    let supported = flightlog_sqlite::SCHEMA_VERSION;
    let found = supported + 37;
    {
        // `PRAGMA user_version` is the big-endian u32 at byte 60 of the header.
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&newer)
            .expect("open the copy");
        let mut header = [0u8; 64];
        file.read_exact(&mut header).expect("read the header");
        assert_eq!(&header[..16], b"SQLite format 3\0");
        assert_eq!(
            i64::from(u32::from_be_bytes(
                header[60..64].try_into().expect("4 bytes")
            )),
            supported,
            "the copy is at this build's version"
        );
        file.seek(SeekFrom::Start(60)).expect("seek");
        file.write_all(&u32::try_from(found).expect("small").to_be_bytes())
            .expect("patch user_version");
    }
    let before = fs::read(&newer).expect("read");
    let newer_arg = s(&newer);
    let versions = [
        format!("schema version {found}"),
        format!("at most version {supported}"),
        "upgrade flightlog".to_owned(),
    ];
    let mut needles: Vec<&str> = versions.iter().map(String::as_str).collect();
    needles.push(&newer_arg);
    let out = run(scratch.path(), &serve_args(&newer_arg, &LOOPBACK), &[]);
    out.assert_refused(&needles);
    assert!(
        fs::read(&newer).expect("read") == before,
        "the newer database changed:{out}"
    );
    let out = run(
        scratch.path(),
        &["demo", "--db", &newer_arg, "--runs", "1"],
        &[],
    );
    out.assert_refused(&needles);
    assert!(
        fs::read(&newer).expect("read") == before,
        "the newer database changed:{out}"
    );
    good.assert_still_serves(&scratch);
}

/// Pages overwritten in the middle of the file (its first page, the header and schema, intact):
/// SQLite opens it, but reads of the damaged pages fail. `serve` refuses to start on it, naming
/// the damage and the way to recover, instead of answering every request 500.
#[test]
fn a_database_damaged_in_the_middle_is_refused_with_how_to_recover() {
    let scratch = Scratch::new("damaged");
    let good = GoodDb::create(&scratch);
    let damaged = checkpointed_copy(&scratch, &good, "damaged.db");
    {
        let mut bytes = fs::read(&damaged).expect("read the copy");
        let page_size = usize::from(u16::from_be_bytes([bytes[16], bytes[17]]));
        assert!(
            bytes.len() > 3 * page_size,
            "a copy of {} bytes",
            bytes.len()
        );
        for (offset, byte) in bytes.iter_mut().enumerate().skip(page_size) {
            *byte = (offset.wrapping_mul(2_654_435_761) >> 13) as u8;
        }
        fs::write(&damaged, &bytes).expect("write the damage");
    }
    let damaged_arg = s(&damaged);
    let out = run(scratch.path(), &serve_args(&damaged_arg, &LOOPBACK), &[]);
    out.assert_refused(&[&damaged_arg, "damaged", ".recover"]);
    good.assert_still_serves(&scratch);
}

#[test]
fn a_read_only_folder_is_refused_and_its_database_left_alone() {
    let scratch = Scratch::new("read-only-folder");
    let good = GoodDb::create(&scratch);
    let Some(wrapper) = unprivileged_wrapper(&scratch) else {
        return;
    };
    let folder = scratch.join("locked");
    fs::create_dir(&folder).expect("create the folder");
    let checkpointed = checkpointed_copy(&scratch, &good, "for-locked.db");
    let db = folder.join("flightlog.db");
    fs::copy(&checkpointed, &db).expect("copy");
    give_to_runner(&wrapper, &folder);
    give_to_runner(&wrapper, &db);
    let before = fs::read(&db).expect("read");
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o555)).expect("chmod");
    let db_arg = s(&db);
    let out = run_wrapped(&wrapper, scratch.path(), &serve_args(&db_arg, &LOOPBACK));
    out.assert_refused(&[&db_arg, "readonly"]);
    // A new database in a read-only folder.
    let fresh = s(&folder.join("new.db"));
    let out = run_wrapped(&wrapper, scratch.path(), &serve_args(&fresh, &LOOPBACK));
    out.assert_refused(&[&fresh]);
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o755)).expect("chmod back");
    assert!(
        fs::read(&db).expect("read") == before,
        "the database changed"
    );
}

// ---------------------------------------------------------------------------------------------
// `flightlog demo`
// ---------------------------------------------------------------------------------------------

#[test]
fn demo_refuses_bad_run_counts_and_keeps_the_database() {
    let scratch = Scratch::new("demo");
    let good = GoodDb::create(&scratch);
    let db = good.arg();
    for (runs, needle) in [
        (
            "-1",
            "invalid value '-1' for '--runs <RUNS>': -1 is not in 0..=100000",
        ),
        ("abc", "invalid value 'abc' for '--runs <RUNS>'"),
        ("1.5", "invalid value '1.5' for '--runs <RUNS>'"),
        ("", "invalid value '' for '--runs <RUNS>'"),
        (
            "99999999999999999999999",
            "invalid value '99999999999999999999999' for '--runs <RUNS>'",
        ),
    ] {
        let out = run(scratch.path(), &["demo", "--db", &db, "--runs", runs], &[]);
        out.assert_usage_error(&[needle]);
        good.assert_unchanged(&out);
    }
    // Zero finished runs is a (small) demo: it still records the one running run.
    let zero = s(&scratch.join("zero.db"));
    let out = run(scratch.path(), &["demo", "--db", &zero, "--runs", "0"], &[]);
    out.assert_success();
    assert!(
        out.stdout
            .contains("Recorded 0 finished runs and 1 running run"),
        "{out}"
    );
    // The variable is read too.
    let out = run(
        scratch.path(),
        &["demo", "--runs", "1"],
        &[("FLIGHTLOG_DB", "no-such-folder/x.db")],
    );
    out.assert_refused(&["no-such-folder/x.db"]);
    // A path that is not UTF-8 is refused, as `serve` refuses it.
    let out = run_os(
        scratch.path(),
        &[OsStr::new("demo"), OsStr::new("--runs"), OsStr::new("1")],
        &[(
            "FLIGHTLOG_DB",
            std::os::unix::ffi::OsStrExt::from_bytes(b"bad-\xff.db"),
        )],
    );
    out.assert_refused(&["FLIGHTLOG_DB is not valid UTF-8"]);
    assert!(!scratch.join("bad-\u{fffd}.db").exists());
    // Adding runs to the good database keeps the old ones (one run: no plural).
    let out = run(scratch.path(), &["demo", "--db", &db, "--runs", "1"], &[]);
    out.assert_success();
    assert!(
        out.stdout
            .contains("Recorded 1 finished run and 1 running run"),
        "{out}"
    );
    good.assert_still_serves(&scratch);
}

/// Demos running at once on one file each record their runs, the file new or not: their ids
/// carry the process id, so two that start in the same millisecond do not collide (they did,
/// one in ten tries with four at once, and the loser stopped halfway: "a span with id …
/// already exists"), and opening a new file together neither fails with "database is locked"
/// (the switch to WAL mode was not retried) nor refuses it as "not a flightlog database" (its
/// identity was read in several statements, across another process's migration): each of
/// those failed once in 25 – 40 rounds of four.
#[test]
fn demos_running_at_once_on_one_file_all_record_their_runs() {
    let scratch = Scratch::new("demo-concurrent");
    for round in 0..40 {
        let db = s(&scratch.join(&format!("shared-{}.db", round / 2)));
        let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| run(scratch.path(), &["demo", "--db", &db, "--runs", "2"], &[]))
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("a demo thread"))
                .collect()
        });
        for out in &outcomes {
            out.assert_success();
            assert!(
                out.stdout
                    .contains("Recorded 2 finished runs and 1 running run"),
                "round {round}: {out}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Regressions: the defects this file found, each a minimal case of what the rule expects.
// ---------------------------------------------------------------------------------------------

#[test]
fn demo_refuses_a_run_count_that_would_overflow() {
    let scratch = Scratch::new("defect-demo-overflow");
    let db = s(&scratch.join("d.db"));
    let out = run(
        scratch.path(),
        &["demo", "--db", &db, "--runs", "4611686018427387904"],
        &[],
    );
    out.assert_refused(&["--runs"]);
}

#[test]
fn demo_refuses_an_unbounded_run_count() {
    let scratch = Scratch::new("defect-demo-unbounded");
    let db = s(&scratch.join("d.db"));
    let out = run(
        scratch.path(),
        &["demo", "--db", &db, "--runs", "18446744073709551615"],
        &[],
    );
    out.assert_refused(&["--runs"]);
}

#[test]
fn a_config_db_of_the_wrong_toml_type_is_refused() {
    let scratch = Scratch::new("db-type");
    let config = scratch.join("flightlog.toml");
    let config_arg = s(&config);
    // Each once without `--addr`/`--grpc-addr` flags when it is the address at stake.
    for (line, key, found) in [
        ("db = true", "db", "boolean"),
        ("db = 5", "db", "integer"),
        ("addr = 4318", "addr", "integer"),
        ("grpc_addr = false", "grpc_addr", "boolean"),
        ("durability = 1", "durability", "integer"),
    ] {
        fs::write(&config, format!("{line}\n")).expect("write config");
        let mut args = vec!["serve", "--config", &config_arg];
        if key != "addr" {
            args.extend(["--addr", "127.0.0.1:0"]);
        }
        if key != "grpc_addr" {
            args.extend(["--grpc-addr", "off"]);
        }
        let out = run(scratch.path(), &args, &[]);
        out.assert_refused(&[
            &format!("`{key}` in {config_arg} is "),
            &format!("(a TOML {found}), which is not valid"),
            "give a TOML string",
        ]);
        assert!(!scratch.join("true").exists() && !scratch.join("5").exists());
    }
}

#[test]
fn an_unresolvable_addr_names_the_setting_and_the_form() {
    let scratch = Scratch::new("defect-resolve");
    let db = s(&scratch.join("x.db"));
    let out = run(
        scratch.path(),
        &serve_args(
            &db,
            &["--addr", "no-such-host.invalid:4318", "--grpc-addr", "off"],
        ),
        // A resolver that drops the query rather than answering it (a CI host with its egress
        // limited) would otherwise take up to 5 s a try, twice, a server and search domain.
        &[("RES_OPTIONS", "timeout:1 attempts:1")],
    );
    out.assert_refused(&["--addr", "give HOST:PORT"]);
}

#[test]
fn an_addr_in_use_names_the_setting_and_the_fix() {
    let scratch = Scratch::new("defect-in-use");
    let db = s(&scratch.join("x.db"));
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy = taken.local_addr().expect("address").to_string();
    let out = run(
        scratch.path(),
        &serve_args(&db, &["--addr", &busy, "--grpc-addr", "off"]),
        &[],
    );
    out.assert_refused(&["--addr", "free port"]);
}

#[test]
fn a_db_that_is_a_directory_is_called_one() {
    let scratch = Scratch::new("defect-db-dir");
    let folder = scratch.join("a-folder");
    fs::create_dir(&folder).expect("create");
    let out = run(scratch.path(), &serve_args(&s(&folder), &LOOPBACK), &[]);
    out.assert_refused(&["directory"]);
}

#[test]
fn a_db_in_a_missing_folder_says_the_folder_is_missing() {
    let scratch = Scratch::new("defect-db-missing");
    let db = s(&scratch.join("no-such-folder").join("x.db"));
    let out = run(scratch.path(), &serve_args(&db, &LOOPBACK), &[]);
    out.assert_refused(&["no-such-folder"]);
    let lower = out.stderr.to_lowercase();
    assert!(
        lower.contains("does not exist") || lower.contains("no such"),
        "the message does not say the folder is missing:{out}"
    );
}

#[test]
fn serve_refuses_a_read_only_database_at_start() {
    let scratch = Scratch::new("defect-read-only");
    let good = GoodDb::create(&scratch);
    let Some(wrapper) = unprivileged_wrapper(&scratch) else {
        return;
    };
    let db = checkpointed_copy(&scratch, &good, "read-only.db");
    give_to_runner(&wrapper, &db);
    fs::set_permissions(&db, fs::Permissions::from_mode(0o444)).expect("chmod");
    let db_arg = s(&db);
    let out = run_wrapped(&wrapper, scratch.path(), &serve_args(&db_arg, &LOOPBACK));
    out.assert_refused(&[&db_arg, "read"]);
}

/// A `-wal` and `-shm` the server's user may not write (a root process killed on the file left
/// them): the start is refused, naming the file and the fix. It started, said ok on
/// `/healthz`, and answered every write 500 "attempt to write a readonly database" (an
/// audit's finding).
#[test]
fn serve_refuses_a_wal_or_shm_it_cannot_write() {
    let scratch = Scratch::new("defect-foreign-wal");
    let good = GoodDb::create(&scratch);
    let Some(wrapper) = unprivileged_wrapper(&scratch) else {
        return;
    };
    let db = checkpointed_copy(&scratch, &good, "foreign-wal.db");
    let wal = scratch.join("foreign-wal.db-wal");
    let shm = scratch.join("foreign-wal.db-shm");
    fs::write(&wal, b"").expect("make the -wal");
    fs::write(&shm, b"").expect("make the -shm");
    if wrapper.is_empty() {
        // Ours, but read-only.
        for companion in [&wal, &shm] {
            fs::set_permissions(companion, fs::Permissions::from_mode(0o444)).expect("chmod");
        }
    }
    // The database is the server's user's; run as another user, the -wal and -shm stay
    // root's (0644).
    give_to_runner(&wrapper, &db);
    let before = fs::read(&db).expect("read");
    let db_arg = s(&db);
    let out = run_wrapped(&wrapper, scratch.path(), &serve_args(&db_arg, &LOOPBACK));
    // Its owner's own file wants a chmod; another user's, a chown.
    let fix = if wrapper.is_empty() {
        "chmod u+rw"
    } else {
        "chown"
    };
    out.assert_refused(&[&s(&wal), "not writable", fix]);
    assert!(
        fs::read(&db).expect("read") == before,
        "the database changed"
    );
    if !wrapper.is_empty() {
        // The server's user's own -wal and -shm, read-only (a `chmod 444` of the database while
        // a server ran leaves them so): the fix is a chmod, not the chown it was told.
        for companion in [&wal, &shm] {
            give_to_runner(&wrapper, companion);
            fs::set_permissions(companion, fs::Permissions::from_mode(0o444)).expect("chmod");
        }
        let out = run_wrapped(&wrapper, scratch.path(), &serve_args(&db_arg, &LOOPBACK));
        out.assert_refused(&[&s(&wal), "not writable", "chmod u+rw"]);
    }
}

#[test]
fn demo_on_a_read_only_database_names_the_file() {
    let scratch = Scratch::new("defect-demo-read-only");
    let good = GoodDb::create(&scratch);
    let Some(wrapper) = unprivileged_wrapper(&scratch) else {
        return;
    };
    let db = checkpointed_copy(&scratch, &good, "read-only.db");
    give_to_runner(&wrapper, &db);
    fs::set_permissions(&db, fs::Permissions::from_mode(0o444)).expect("chmod");
    let db_arg = s(&db);
    let out = run_wrapped(
        &wrapper,
        scratch.path(),
        &["demo", "--db", &db_arg, "--runs", "1"],
    );
    out.assert_refused(&[&db_arg]);
}

#[test]
fn demo_treats_an_empty_db_variable_as_unset() {
    let scratch = Scratch::new("defect-demo-empty-env");
    let out = run(
        scratch.path(),
        &["demo", "--runs", "1"],
        &[("FLIGHTLOG_DB", "")],
    );
    out.assert_no_panic();
    let succeeded = out.status.is_some_and(|s| s.success());
    assert!(
        succeeded || out.stderr.contains("FLIGHTLOG_DB"),
        "the message does not name FLIGHTLOG_DB:{out}"
    );
}

/// A closed stdout (`flightlog serve | head -1`, or a log pipe whose reader died) made the next
/// `println!` panic, and the server exited at start. Output is now best effort: the server keeps
/// serving and stops cleanly on SIGTERM, its shutdown lines going nowhere.
#[test]
fn serve_keeps_serving_and_stops_cleanly_when_its_stdout_is_closed() {
    let scratch = Scratch::new("closed-stdout");
    let db = s(&scratch.join("closed.db"));
    let stderr_path = scratch.join("stderr.txt");
    let mut command = Command::new(bin());
    command
        .args(serve_args(&db, &LOOPBACK))
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            fs::File::create(&stderr_path).expect("create the stderr file"),
        ));
    for (name, _) in std::env::vars_os() {
        if name.as_bytes().starts_with(b"FLIGHTLOG_") {
            command.env_remove(&name);
        }
    }
    let mut child = command.spawn().expect("start flightlog serve");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let addr = loop {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).expect("read serve's stdout");
        assert!(read > 0, "serve closed its stdout before listening");
        if let Some(rest) = line.trim_end().strip_prefix(LISTENING) {
            break rest
                .split_whitespace()
                .next()
                .expect("an address")
                .to_owned();
        }
    };
    // What `head -1` does once it has its line.
    drop(stdout);
    std::thread::sleep(Duration::from_millis(200));

    let (status, body) = http_get(&addr, "/healthz");
    assert_eq!(status, 200, "{body}");
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -TERM failed");
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().expect("poll serve") {
            break exit;
        }
        if started.elapsed() > CASE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve did not stop on SIGTERM with its stdout closed");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = fs::read_to_string(&stderr_path).expect("read the stderr file");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(exit.success(), "exit {exit:?}; stderr:\n{stderr}");
}

/// A closed terminal (SIGHUP) stops the server as Ctrl-C does: every write kept, the WAL folded
/// into the file, exit status 0 (an audit's finding: by default SIGHUP killed it on the spot,
/// exit 129, its WAL and lock file left behind).
#[test]
fn a_hang_up_stops_the_server_cleanly() {
    let scratch = Scratch::new("hang-up");
    let db = scratch.join("hung-up.db");
    // SIGHUP at its default, whatever this test runs under (a suite started with `nohup` passes
    // the ignore on to every process it starts).
    let (server, addr) = serve_under(&["env", "--default-signal=HUP"], &scratch, &db);
    let (status, body) = http_post(
        &addr,
        "/v1/engagements/hang-up/events",
        r#"{"type":"note","at":1,"data":{}}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (exit, stdout, stderr) = stop_with_signal(server, "HUP");
    assert_eq!(exit.code(), Some(0), "{exit:?}\n{stdout}\n{stderr}");
    assert!(stdout.contains("shutting down"), "{stdout}");
    let wal = db_files(&db).remove(1);
    assert!(
        fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the WAL still holds writes after the stop:\n{stdout}\n{stderr}"
    );
    let (server, addr) = serve_on(&scratch, &db);
    let (status, events) = http_get(&addr, "/v1/engagements/hang-up/events");
    server.finish();
    assert_eq!(status, 200, "{events}");
    assert!(events.contains(r#""seq":0"#), "{events}");
}

/// Started with SIGHUP ignored (`nohup`), the server keeps it ignored: a hang-up stops nothing.
#[test]
fn a_hang_up_is_ignored_under_nohup() {
    let scratch = Scratch::new("nohup");
    let db = scratch.join("nohup.db");
    let (mut server, addr) = serve_under(&["nohup"], &scratch, &db);
    let pid = server.child.id().to_string();
    let sent = Command::new("kill").args(["-HUP", &pid]).status();
    assert!(sent.expect("run kill").success());
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        server.child.try_wait().expect("poll").is_none(),
        "a hang-up stopped a server started under nohup"
    );
    let (status, body) = http_get(&addr, "/healthz");
    assert_eq!(status, 200, "{body}");
    let (exit, stdout, stderr) = stop_with_sigterm(server);
    assert_eq!(exit.code(), Some(0), "{exit:?}\n{stdout}\n{stderr}");
}

/// A clean stop (SIGTERM) used to leave the newest writes, and on a new file even the schema,
/// only in the `-wal` file beside the database: copying the stopped server's database file, the
/// natural backup, gave an empty or stale copy. Now the stop copies the WAL into the file.
#[test]
fn a_clean_stop_leaves_everything_in_the_database_file_itself() {
    let scratch = Scratch::new("clean-stop");
    let db = scratch.join("stopped.db");
    let (server, addr) = serve_on(&scratch, &db);
    for at in 0..3 {
        let (status, body) = http_post(
            &addr,
            "/v1/engagements/backup-check/events",
            &format!(r#"{{"type":"note","at":{at},"data":{{"n":{at}}}}}"#),
        );
        assert_eq!(status, 201, "{body}");
    }
    let (status, body) = http_post(
        &addr,
        "/v1/activity/spans",
        r#"{"spanId":"backup-span","runId":"backup-run","kind":"turn","name":"t","origin":"session"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (exit, stdout, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{exit:?}\n{stdout}\n{stderr}");
    // No warning about the stop (the one about port 0's changing instance name is expected).
    assert!(
        !stderr
            .lines()
            .any(|line| line.contains("warning") && !line.contains("(port 0)")),
        "{stderr}"
    );
    let wal = db_files(&db).remove(1);
    assert!(
        fs::metadata(&wal).map_or(true, |m| m.len() == 0),
        "the WAL still holds writes after a clean stop:\n{stdout}\n{stderr}"
    );

    // The database file alone, as a backup would copy it.
    let backup_dir = scratch.join("backup");
    fs::create_dir(&backup_dir).expect("create the backup folder");
    let backup = backup_dir.join("copy.db");
    fs::copy(&db, &backup).expect("copy the database file");
    let (server, addr) = serve_on(&scratch, &backup);
    let (status, events) = http_get(&addr, "/v1/engagements/backup-check/events");
    let (span_status, span) = http_get(&addr, "/v1/activity/spans/backup-span");
    server.finish();
    assert_eq!(status, 200, "{events}");
    for at in 0..3 {
        assert!(events.contains(&format!(r#""seq":{at}"#)), "{events}");
    }
    assert_eq!(span_status, 200, "{span}");
    assert!(span.contains(r#""runId":"backup-run""#), "{span}");
}

/// clap took `-5` after `--body-limit`, and a secret starting with `-` after `--token`, for
/// flags of their own and answered "unexpected argument '-5' found", naming neither the setting
/// nor the fix. Now the value reaches the settings' checks: a negative number gets the setting's
/// own message, a `-` secret works, and a `--` one (a flag where the secret was forgotten) is
/// refused saying so. A misspelled variable (`FLIGHTLOG_TOKEN`, as the flag is `--token`) was
/// ignored without a word, which here means a server without authentication: it now gets a
/// warning naming `FLIGHTLOG_TOKENS`, and when no token is configured at all the server does not
/// start (an audit started one open, the warning having scrolled past); `FLIGHTLOG_TOKENS=";"`
/// (no entry) is refused instead of replacing the config file's tokens with none.
#[test]
fn hyphen_values_and_misspelled_variables_get_the_settings_messages() {
    let scratch = Scratch::new("hyphen-values");
    let db = s(&scratch.join("hyphen.db"));
    for (flag, value) in [
        ("--body-limit", "-5"),
        ("--max-inflight-writes", "-1"),
        ("--journal-max-events", "-3"),
        ("--journal-max-age-ms", "-1"),
    ] {
        let mut args = serve_args(&db, &LOOPBACK);
        args.extend([flag, value]);
        let out = run(scratch.path(), &args, &[]);
        out.assert_refused(&[&format!("{flag} = {value:?} is not valid: give")]);
    }
    let mut args = serve_args(&db, &LOOPBACK);
    args.extend(["--token", "-Xy9_secret"]);
    let out = run(scratch.path(), &args, &[]);
    // The secret was taken (a refusal would not listen). What the server prints after its
    // listening line is not asserted: the harness stops it as soon as it listens.
    out.assert_listened();

    let mut args = serve_args(&db, &LOOPBACK);
    args.extend(["--token", "--manual-clock"]);
    let out = run(scratch.path(), &args, &[]);
    out.assert_refused(&["--token (the 1st)", "looks like a flag"]);

    // FLIGHTLOG_TOKENS' `SECRET:SCOPES` on the flag would be a token with every scope; a colon
    // followed by anything else is part of the secret.
    for scoped in [
        "s3cr3t-value:read",
        "s3cr3t-value:read, ingest",
        "s3cr3t-value:read,",
        "s3cr3t-value:read,,ingest",
        "s3cr3t-value:read;",
    ] {
        let mut args = serve_args(&db, &LOOPBACK);
        args.extend(["--token", "other-secret", "--token", scoped]);
        let out = run(scratch.path(), &args, &[]);
        out.assert_refused(&[
            "--token (the 2nd)",
            "takes the secret alone",
            "FLIGHTLOG_TOKENS",
        ]);
        assert!(
            !out.stderr.contains("s3cr3t-value"),
            "the secret leaked:{out}"
        );
    }
    let mut args = serve_args(&db, &LOOPBACK);
    args.extend(["--token", "s3cr3t:value:42"]);
    run(scratch.path(), &args, &[]).assert_listened();

    // The name misspelt, then the prefix (read too, and matched as if it were right), then
    // another tool's word for it. With no token configured anywhere the server does not start
    // (it would serve without the authentication the variable asked for); with one, the
    // warning is enough. The secret is never printed.
    for misspelt in ["FLIGHTLOG_TOKEN", "FLIGHT_LOG_TOKENS", "FLIGHTLOG_API_KEY"] {
        let out = run(
            scratch.path(),
            &serve_args(&db, &LOOPBACK),
            &[(misspelt, "supersecret")],
        );
        out.assert_refused(&[
            &format!("{misspelt} looks like a token for this server"),
            "Rename it to FLIGHTLOG_TOKENS, each token followed by its scopes",
            "FLIGHTLOG_TOKENS=SECRET:read,ingest,admin",
            "or unset it",
        ]);
        assert!(
            out.stderr.contains("did you mean FLIGHTLOG_TOKENS?"),
            "{out}"
        );
        assert!(!out.stderr.contains("supersecret"), "{out}");

        let mut args = serve_args(&db, &LOOPBACK);
        args.extend(["--token", "a-configured-token-0123456789"]);
        let out = run(scratch.path(), &args, &[(misspelt, "supersecret")]);
        out.assert_listened();
        assert!(
            out.stderr.contains(&format!("{misspelt} is not a setting"))
                && out.stderr.contains("did you mean FLIGHTLOG_TOKENS?"),
            "{out}"
        );
        assert!(!out.stderr.contains("supersecret"), "{out}");
    }

    let out = run(
        scratch.path(),
        &serve_args(&db, &LOOPBACK),
        &[("FLIGHTLOG_TOKENS", ";")],
    );
    out.assert_refused(&["FLIGHTLOG_TOKENS", "holds no token"]);
}

/// A setting's variable with its unit left out (`FLIGHTLOG_PRUNE_AFTER=off`) was ignored without
/// a word, three edits from its name: the server started on the 30-day retention the operator
/// had set against (an audit's finding). Such a name, which one setting extends by words, now
/// stops the start naming the setting. A near miss of the switch to allow an open listener
/// (`…_NON_LOOPBAK`, which holds `AUTH`) is matched to that switch, not to the token list.
#[test]
fn a_setting_variable_short_of_its_unit_stops_the_start() {
    let scratch = Scratch::new("shortened-variables");
    let db = s(&scratch.join("shortened.db"));
    for (shortened, setting) in [
        ("FLIGHTLOG_PRUNE_AFTER", "FLIGHTLOG_PRUNE_AFTER_MS"),
        ("FLIGHTLOG_JOURNAL_MAX_AGE", "FLIGHTLOG_JOURNAL_MAX_AGE_MS"),
        ("FLIGHTLOG_STALE_AFTER", "FLIGHTLOG_STALE_AFTER_MS"),
        (
            "flightlog_maintenance_every",
            "FLIGHTLOG_MAINTENANCE_EVERY_MS",
        ),
        // Named after the config file's key, another unit (an audit's examples).
        (
            "FLIGHTLOG_MAINTENANCE_PRUNE_AFTER_MS",
            "FLIGHTLOG_PRUNE_AFTER_MS",
        ),
        ("FLIGHTLOG_PRUNE_AFTER_SECS", "FLIGHTLOG_PRUNE_AFTER_MS"),
    ] {
        let out = run(
            scratch.path(),
            &serve_args(&db, &LOOPBACK),
            &[(shortened, "off")],
        );
        out.assert_refused(&[
            &format!("{shortened} is not a setting: {setting} is"),
            &format!("rename it to {setting}"),
            "or unset it",
        ]);
    }
    // Several settings extend it: no one to name, so a warning naming them all, and the start.
    let out = run(
        scratch.path(),
        &serve_args(&db, &LOOPBACK),
        &[("FLIGHTLOG_JOURNAL_MAX", "5")],
    );
    out.assert_listened();
    assert!(
        out.stderr.contains(
            "FLIGHTLOG_JOURNAL_MAX is not a setting and is ignored; did you mean one of \
             FLIGHTLOG_JOURNAL_MAX_EVENTS, FLIGHTLOG_JOURNAL_MAX_AGE_MS?"
        ),
        "{out}"
    );

    let out = run(
        scratch.path(),
        &serve_args(&db, &LOOPBACK),
        &[("FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBAK", "true")],
    );
    out.assert_listened();
    assert!(
        out.stderr
            .contains("did you mean FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK?"),
        "{out}"
    );
    assert!(!out.stderr.contains("FLIGHTLOG_TOKENS"), "{out}");
}

/// A database file deleted under the running server: the writes it went on acknowledging went
/// to the unlinked file and were gone at the next start (a reliability audit lost every write
/// acknowledged after an `rm`), `/healthz` said ok, and only the stop noticed. Now the writes
/// are refused (503, the reason, nothing acknowledged), `/healthz` answers 503 so a supervisor
/// restarts the server, and the stop says what happened and exits non-zero (copying nothing into
/// whatever file is at the path now).
#[test]
fn a_database_deleted_under_the_server_refuses_writes_and_is_reported() {
    let scratch = Scratch::new("deleted-db");
    let db = scratch.join("doomed.db");
    let (server, addr) = serve_on(&scratch, &db);
    let (status, body) = http_post(
        &addr,
        "/v1/engagements/e/events",
        r#"{"type":"t","at":1,"data":{}}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (status, body) = http_post(
        &addr,
        "/v1/activity/spans",
        r#"{"spanId":"before","runId":"r0","name":"n","kind":"turn","origin":"session"}"#,
    );
    assert_eq!(status, 201, "{body}");
    // Live streams open before the loss: each ends with an `error` event saying it.
    let streams: Vec<(&str, TcpStream)> = [
        "/v1/activity/changes/stream",
        "/v1/activity/runs/r0/stream",
        "/v1/engagements/e/stream",
    ]
    .into_iter()
    .map(|path| (path, open_stream(&addr, path)))
    .collect();
    for file in db_files(&db) {
        let _ = fs::remove_file(file);
    }
    let mut shm = db.as_os_str().to_owned();
    shm.push("-shm");
    let _ = fs::remove_file(PathBuf::from(shm));
    let (status, body) = http_post(
        &addr,
        "/v1/engagements/e/events",
        r#"{"type":"t","at":2,"data":{}}"#,
    );
    assert_eq!(status, 503, "{body}");
    // Not "restart the server": the data lives on only in the server's open file, and a
    // restart started an empty database (an audit's finding).
    assert!(
        body.contains("was deleted or replaced")
            && body.contains("stop the server")
            && body.contains(".recovered-"),
        "{body}"
    );
    let (status, body) = http_post(
        &addr,
        "/v1/activity/spans",
        r#"{"spanId":"s","runId":"r","name":"n","kind":"turn","origin":"session"}"#,
    );
    assert_eq!(status, 503, "{body}");
    let (status, body) = http_get(&addr, "/healthz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("was deleted or replaced"), "{body}");
    // They used to go on sending keep-alives (reads still work on the deleted file), so a
    // dashboard looked live on a dead server; and a new stream was served from the lost file.
    for (path, stream) in streams {
        let text = read_stream_until(stream, "event: error", Duration::from_secs(20));
        assert!(
            text.contains("event: error") && text.contains("was deleted or replaced"),
            "{path}: {text}"
        );
    }
    for path in [
        "/v1/activity/changes/stream",
        "/v1/activity/runs/r0/stream",
        "/v1/engagements/e/stream",
    ] {
        let (status, body) = http_get(&addr, path);
        assert_eq!(status, 503, "{path}: {body}");
        assert!(body.contains("was deleted or replaced"), "{path}: {body}");
    }
    let (exit, stdout, stderr) = stop_with_sigterm(server);
    assert!(!exit.success(), "{exit:?}\n{stdout}\n{stderr}");
    assert!(stderr.contains("was deleted or replaced"), "{stderr}");
    // Said when first noticed (once, however many requests met it), not only at the stop.
    let noticed: Vec<usize> = stderr
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains("noticed now: every write and /healthz answer 503"))
        .map(|(index, _)| index)
        .collect();
    let stopped = stderr.lines().position(|line| line.contains("stopped"));
    assert!(
        noticed.len() == 1 && stopped.is_none_or(|stopped| noticed[0] < stopped),
        "{stderr}"
    );
    assert!(!stderr.contains("nothing is lost"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // The stop saved what the server held beside the path; moved back, it serves it all.
    assert!(stderr.contains("was saved as"), "{stderr}");
    let saved: Vec<PathBuf> = fs::read_dir(scratch.path())
        .expect("list the scratch folder")
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("doomed.db.recovered-") && !name.ends_with("-wal")
        })
        .collect();
    assert_eq!(saved.len(), 1, "{saved:?}\n{stderr}");
    let restored = scratch.join("restored.db");
    fs::rename(&saved[0], &restored).expect("move the saved file back");
    let mut saved_wal = saved[0].as_os_str().to_owned();
    saved_wal.push("-wal");
    let mut restored_wal = restored.as_os_str().to_owned();
    restored_wal.push("-wal");
    if PathBuf::from(&saved_wal).exists() {
        fs::rename(&saved_wal, &restored_wal).expect("move the saved WAL back");
    }
    let (server, addr) = serve_on(&scratch, &restored);
    let (status, body) = http_get(&addr, "/v1/activity/spans/before");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_get(&addr, "/v1/engagements/e/events");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"seq\":0"), "{body}");
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{stderr}");
}

/// `flightlog demo` on the file of a running server whose stale sweep runs often: the demo's
/// runs start up to a week back and send no heartbeat, and written call by call they were open
/// (so "stale") while the demo wrote them: the sweep closed 43 of 400 as interrupted, and the
/// demo's own ends were refused (an audit's finding). Each run is now one transaction.
#[test]
fn a_demo_beside_a_sweeping_server_records_every_run_whole() {
    let scratch = Scratch::new("demo-sweep");
    let db = scratch.join("shared.db");
    let mut args: Vec<&OsStr> = vec![OsStr::new("serve"), OsStr::new("--db"), db.as_os_str()];
    args.extend(LOOPBACK.map(OsStr::new));
    args.extend(["--stale-after-ms", "1000", "--maintenance-every-ms", "20"].map(OsStr::new));
    let mut server = spawn(scratch.path(), &args, &[]);
    let (_, listening, _) = server.wait_for_exit_or_listening();
    assert!(listening, "serve does not start:\n{}", server.stderr);
    let addr = listening_addr(&server);
    // The sweep judges writers silent only once the server has been up for the window.
    std::thread::sleep(Duration::from_millis(1_500));
    let db_arg = db.to_string_lossy().into_owned();
    let out = run(
        scratch.path(),
        &["demo", "--runs", "300", "--db", &db_arg],
        &[],
    );
    assert!(out.status.is_some_and(|status| status.success()), "{out}");
    let (status, body) = http_get(&addr, "/v1/activity/runs?outcome=interrupted&limit=1000");
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).expect("a run page");
    let interrupted: Vec<&str> = page["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter_map(|run| run["runId"].as_str())
        .filter(|run_id| !run_id.ends_with("-run-301"))
        .collect();
    assert!(
        interrupted.is_empty(),
        "finished demo runs swept: {interrupted:?}"
    );
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{stderr}");
}

/// A backup moved over the database file of a running server: the server's WAL beside it was
/// left there at the stop, and the next start replayed it into the backup ("database disk image
/// is malformed", the run list answering 500, while `/healthz` said ok). Now the server refuses
/// writes once the file is replaced, and its stop moves its own `-wal`/`-shm` aside: the next
/// start opens the backup intact, with what the backup holds.
#[test]
fn a_backup_moved_over_the_database_of_a_running_server_opens_intact() {
    let scratch = Scratch::new("replaced-db");
    let (db, server, addr) = live_server_with_a_backup_beside(&scratch);
    let (status, body) = http_post(
        &addr,
        "/v1/engagements/after/events",
        r#"{"type":"t","at":1,"data":{}}"#,
    );
    assert_eq!(status, 503, "{body}");
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(!exit.success(), "{stderr}");
    assert!(stderr.contains("moved aside"), "{stderr}");
    assert_the_backup_opens_intact(&scratch, &db);
}

/// A server on `live.db` that wrote 200 engagements, and a cleanly stopped server's
/// `backup.db` (one engagement, `kept`) moved over its file: (`live.db`, the server, its
/// address).
fn live_server_with_a_backup_beside(scratch: &Scratch) -> (PathBuf, Spawned, String) {
    let db = scratch.join("live.db");
    let backup = backup_with_one_engagement(scratch);
    let (server, addr) = serve_on(scratch, &db);
    write_live_engagements(&addr, 200);
    fs::rename(&backup, &db).expect("move the backup over the live file");
    (db, server, addr)
}

/// A cleanly stopped server's `backup.db` in `scratch`, holding one engagement, `kept`.
fn backup_with_one_engagement(scratch: &Scratch) -> PathBuf {
    let backup = scratch.join("backup.db");
    let (server, addr) = serve_on(scratch, &backup);
    let (status, body) = http_post(
        &addr,
        "/v1/engagements/kept/events",
        r#"{"type":"t","at":1,"data":{}}"#,
    );
    assert_eq!(status, 201, "{body}");
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{stderr}");
    backup
}

/// Engagements `live-0` … `live-<count - 1>`, one event each, through the server at `addr`.
fn write_live_engagements(addr: &str, count: usize) {
    for n in 0..count {
        let (status, body) = http_post(
            addr,
            &format!("/v1/engagements/live-{n}/events"),
            r#"{"type":"t","at":1,"data":{"text":"written before the backup came back"}}"#,
        );
        assert_eq!(status, 201, "{body}");
    }
}

/// A server started on `db` finds the backup's engagement (and none of the replaced file's),
/// lists runs, stops cleanly, and leaves a file that passes SQLite's integrity check.
fn assert_the_backup_opens_intact(scratch: &Scratch, db: &Path) {
    let (server, addr) = serve_on(scratch, db);
    let (status, body) = http_get(&addr, "/v1/engagements?limit=100");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"kept\""), "{body}");
    assert!(!body.contains("live-"), "{body}");
    let (status, body) = http_get(&addr, "/v1/activity/runs");
    assert_eq!(status, 200, "{body}");
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{stderr}");
    let check = rusqlite::Connection::open(db)
        .and_then(|conn| {
            conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0))
        })
        .expect("integrity check");
    assert_eq!(check, "ok");
}

/// `demo` whose standard output cannot be written (`>/dev/full`) exited 0 with its whole report
/// lost. It now exits 1 and says the runs are recorded but the report could not be written; a
/// reader that stops early (`demo | head -1`) is not an error.
#[cfg(target_os = "linux")]
#[test]
fn demo_says_so_when_its_report_cannot_be_written() {
    let scratch = Scratch::new("demo-full");
    let db = scratch.join("demo.db");
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let mut child = Command::new(bin())
        .args(["demo", "--db", &s(&db), "--runs", "2"])
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(full)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flightlog demo");
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child.wait().expect("wait for demo");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the runs are recorded in") && stderr.contains("No space left"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The runs are there: a second demo's report lists the first one's running run too.
    let out = run(
        scratch.path(),
        &["demo", "--db", &s(&db), "--runs", "1"],
        &[],
    );
    out.assert_success();
    assert_eq!(out.stdout.matches("(still running)").count(), 2, "{out}");

    // A report larger than a pipe holds, to a reader that hangs up after one line.
    let mut child = Command::new(bin())
        .args(["demo", "--db", &s(&db), "--runs", "1000"])
        .current_dir(scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flightlog demo");
    let mut first_line = String::new();
    if let Some(pipe) = child.stdout.take() {
        let _ = BufReader::new(pipe).read_line(&mut first_line);
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child.wait().expect("wait for demo");
    assert!(
        first_line.starts_with("Recorded 1000 finished runs"),
        "{first_line}"
    );
    assert!(
        status.success(),
        "a reader that hung up early: {status:?} {stderr}"
    );
}

/// Every connection holds a file descriptor, and a soft limit of 1,024 (most shells' and service
/// managers' default) let about a thousand idle clients lock every new one out (a reliability
/// audit). `serve` raises its soft limit to the hard one, and says when even that is below what
/// `--max-connections` needs.
#[cfg(target_os = "linux")]
#[test]
fn serve_raises_its_open_file_limit_to_the_hard_one() {
    if Command::new("prlimit").arg("--version").output().is_err() {
        panic!("this test needs util-linux's prlimit");
    }
    let scratch = Scratch::new("nofile");
    let db = scratch.join("limits.db");
    let mut args: Vec<&OsStr> = vec![OsStr::new("serve"), OsStr::new("--db"), db.as_os_str()];
    args.extend(LOOPBACK.map(OsStr::new));
    let mut server = spawn_under(
        &["prlimit", "--nofile=256:4096"],
        scratch.path(),
        &args,
        &[],
    );
    let (_, listening, _) = server.wait_for_exit_or_listening();
    assert!(listening, "{}", server.stderr);
    let limits = fs::read_to_string(format!("/proc/{}/limits", server.child.id()))
        .expect("the server's limits");
    let open_files = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("a Max open files line");
    let numbers: Vec<&str> = open_files.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["4096", "4096"], "{open_files}");
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{stderr}");
    assert!(
        stderr.contains("may open at most 4096 files, fewer than --max-connections (4096) needs"),
        "a hard limit under what the connection limit needs is worth a warning: {stderr}"
    );
}

/// The same with the server killed after the swap instead of stopped: its WAL, left beside the
/// backup, was replayed into it at the next start. The server moves its `-wal`/`-shm` aside as
/// soon as it sees the database file replaced (its housekeeper looks every 100 ms), so a crash
/// after the swap leaves the backup intact too.
#[test]
fn a_backup_moved_over_the_database_survives_the_server_being_killed() {
    let scratch = Scratch::new("replaced-killed");
    let (db, server, _) = live_server_with_a_backup_beside(&scratch);
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    kill_once_moved_aside(server, Path::new(&wal));
    assert_the_backup_opens_intact(&scratch, &db);
}

/// Wait (at most 10 s) until the server has moved its `wal` aside, then kill it.
fn kill_once_moved_aside(mut server: Spawned, wal: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while wal.exists() {
        assert!(
            Instant::now() < deadline,
            "the server's WAL is still beside the backup"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server.child.kill().expect("kill the server");
    let _ = server.child.wait();
}

/// `--db` a symbolic link: SQLite keeps the `-wal` beside the file the link resolves to, and the
/// server looked for its own beside the link, so a backup moved over the real file was still
/// corrupted by a crash after the swap (a review). Now the WAL beside the real file is moved
/// aside, and the backup opens intact through the link.
#[test]
fn a_backup_moved_over_a_symlinked_database_survives_the_server_being_killed() {
    let scratch = Scratch::new("replaced-symlink");
    let real_dir = scratch.join("real");
    fs::create_dir_all(&real_dir).expect("a folder for the real file");
    let real = real_dir.join("live.db");
    let link = scratch.join("link.db");
    let (server, _) = serve_on(&scratch, &real);
    let (exit, _, stderr) = stop_with_sigterm(server);
    assert!(exit.success(), "{stderr}");
    std::os::unix::fs::symlink(&real, &link).expect("a symbolic link to the database");
    let backup = backup_with_one_engagement(&scratch);

    let (server, addr) = serve_on(&scratch, &link);
    write_live_engagements(&addr, 100);
    let wal = real_dir.join("live.db-wal");
    assert!(wal.exists(), "SQLite's WAL is beside the real file");
    fs::rename(&backup, &real).expect("move the backup over the real file");
    kill_once_moved_aside(server, &wal);
    assert_the_backup_opens_intact(&scratch, &link);
}

// ---------------------------------------------------------------------------------------------
// Settings, start-up and stop findings of the audit of `serve`'s settings, auth and start
// ---------------------------------------------------------------------------------------------

/// Read `server`'s output until a line holds `needle` (`true`), or `limit` passes or the
/// process's streams close first (`false`).
fn wait_for_output(server: &mut Spawned, needle: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if server.stdout.contains(needle) || server.stderr.contains(needle) {
            return true;
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return false;
        };
        match server
            .lines
            .recv_timeout(left.min(Duration::from_millis(20)))
        {
            Ok(line) => {
                server.take(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return server.stdout.contains(needle) || server.stderr.contains(needle)
            }
        }
    }
}

/// A FIFO given as the database: `open` of a FIFO waits for a writer, and the name lock opened
/// the file before anything looked at its type, so `serve` and `demo` hung at start (a stop
/// signal did not end it either) where the "not a regular file" refusal was meant to come (an
/// audit's finding).
#[test]
fn a_fifo_as_the_database_is_refused_at_once_as_not_a_regular_file() {
    let scratch = Scratch::new("fifo-db");
    let fifo = scratch.join("f.db");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let fifo = s(&fifo);
    for args in [
        serve_args(&fifo, &LOOPBACK),
        vec!["demo", "--db", fifo.as_str(), "--runs", "1"],
    ] {
        let out = run(scratch.path(), &args, &[]);
        out.assert_refused(&[fifo.as_str(), "not a regular file"]);
        assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    }
}

/// A config file that is not valid TOML, its error on the line of a token: the parser's
/// message quoted that line, and with it the secret (`2 | token = "SUPERSECRET-…`), where the
/// settings promise that no error repeats a token (an audit's finding). The position and what
/// is wrong are said, no text of the file.
#[test]
fn a_config_file_syntax_error_is_told_by_position_without_the_file_s_text() {
    let scratch = Scratch::new("toml-syntax-secret");
    let config = scratch.join("t.toml");
    fs::write(
        &config,
        "[[tokens]]\ntoken = \"SUPERSECRET-AAAA-1111\nscopes=[\"read\"]\n",
    )
    .expect("write the config file");
    let config = s(&config);
    let db = s(&scratch.join("t.db"));
    for (args, env) in [
        (
            serve_args(
                &db,
                &[
                    "--config",
                    config.as_str(),
                    "--addr",
                    "127.0.0.1:0",
                    "--grpc-addr",
                    "off",
                ],
            ),
            vec![],
        ),
        (
            serve_args(&db, &LOOPBACK),
            vec![("FLIGHTLOG_CONFIG", config.as_str())],
        ),
        (
            vec!["demo", "--config", config.as_str(), "--runs", "1"],
            vec![],
        ),
    ] {
        let out = run(scratch.path(), &args, &env);
        out.assert_refused(&[
            &format!("the config file {config} is not valid TOML"),
            "at line 2, column",
            "invalid basic string",
        ]);
        assert!(
            !out.stderr.contains("SUPERSECRET") && !out.stdout.contains("SUPERSECRET"),
            "the secret is repeated:{out}"
        );
    }
}

/// A variable meant to name the config file but misnamed (`FLIGHTLOG_CONFIG_FILE`,
/// `FLIGHTLOG_CONF`): the server warned and started without the file, its tokens included,
/// so open to every local process (an audit's finding). With no config file named otherwise
/// the start is refused, as for a misnamed token variable; with one named, the warning alone.
#[test]
fn a_misnamed_config_file_variable_stops_the_start() {
    let scratch = Scratch::new("misnamed-config-variable");
    fs::write(
        scratch.join("tok.toml"),
        "[[tokens]]\ntoken = \"a-long-enough-secret-for-the-test-0001\"\nscopes = [\"read\"]\n",
    )
    .expect("write the config file");
    let db = s(&scratch.join("m.db"));
    for misnamed in [
        "FLIGHTLOG_CONFIG_FILE",
        "FLIGHTLOG_CONF",
        "FLIGHTLOG_CONFIGURATION",
    ] {
        let out = run(
            scratch.path(),
            &serve_args(&db, &LOOPBACK),
            &[(misnamed, "tok.toml")],
        );
        out.assert_refused(&[
            &format!("{misnamed} looks like the variable naming the config file"),
            "Rename it to FLIGHTLOG_CONFIG",
            "or unset it",
        ]);
        let out = run(
            scratch.path(),
            &["demo", "--db", db.as_str(), "--runs", "1"],
            &[(misnamed, "tok.toml")],
        );
        out.assert_refused(&["Rename it to FLIGHTLOG_CONFIG"]);
    }
    // A config file named: the warning alone, and its tokens are required.
    let out = run(
        scratch.path(),
        &serve_args(&db, &LOOPBACK),
        &[
            ("FLIGHTLOG_CONFIG_FILE", "tok.toml"),
            ("FLIGHTLOG_CONFIG", "tok.toml"),
        ],
    );
    out.assert_listened();
    assert!(
        out.stderr.contains("did you mean FLIGHTLOG_CONFIG?")
            && out.stdout.contains("bearer tokens required"),
        "{out}"
    );
    // A blank one names no file (as a blank FLIGHTLOG_CONFIG is unset).
    let out = run(
        scratch.path(),
        &serve_args(&db, &LOOPBACK),
        &[("FLIGHTLOG_CONF", "")],
    );
    out.assert_listened();
}

/// A config file's name with white space at an end (`FLIGHTLOG_CONFIG="c/3.toml "`, from an
/// env file that keeps trailing spaces): "cannot read the config file c/3.toml  … No such
/// file", the space invisible, where `FLIGHTLOG_DB` so written says to remove it (an audit's
/// finding). Now both the variable and `--config` say so.
#[test]
fn a_config_file_name_with_white_space_at_an_end_is_refused_naming_the_fix() {
    let scratch = Scratch::new("padded-config");
    fs::create_dir(scratch.join("c")).expect("make a folder");
    fs::write(
        scratch.join("c").join("3.toml"),
        "durability = \"normal\"\n",
    )
    .expect("write the config file");
    let db = s(&scratch.join("p.db"));
    for (name, args, env) in [
        (
            "FLIGHTLOG_CONFIG = \"c/3.toml \"",
            serve_args(&db, &LOOPBACK),
            vec![("FLIGHTLOG_CONFIG", "c/3.toml ")],
        ),
        (
            "--config = \" c/3.toml\"",
            serve_args(
                &db,
                &[
                    "--config",
                    " c/3.toml",
                    "--addr",
                    "127.0.0.1:0",
                    "--grpc-addr",
                    "off",
                ],
            ),
            vec![],
        ),
        (
            "FLIGHTLOG_CONFIG = \"c/3.toml\\t\"",
            vec!["demo", "--db", db.as_str(), "--runs", "1"],
            vec![("FLIGHTLOG_CONFIG", "c/3.toml\t")],
        ),
    ] {
        let out = run(scratch.path(), &args, &env);
        out.assert_refused(&[name, "remove the white space at its start or end"]);
        assert!(!out.stderr.contains("No such file"), "{out}");
    }
    // Written without the space, the same file is read.
    let out = run(
        scratch.path(),
        &serve_args(&db, &LOOPBACK),
        &[("FLIGHTLOG_CONFIG", "c/3.toml")],
    );
    out.assert_listened();
}

/// SIGTERM while a start waits for another live server of its instance to stop: it said
/// "shutting down", then waited the 5 s out and exited 1 with "already served" (an audit's
/// finding). A stop at start is a clean stop: at once, exit 0, nothing opened.
#[test]
fn a_stop_while_the_start_waits_for_its_instance_ends_it_at_once_and_cleanly() {
    let scratch = Scratch::new("instance-wait-stop");
    let db = scratch.join("i.db");
    let db_arg = s(&db);
    let args = serve_args(
        &db_arg,
        &[
            "--instance",
            "A",
            "--addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
        ],
    );
    let first_args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
    let mut first = spawn(scratch.path(), &first_args, &[]);
    let (_, listening, _) = first.wait_for_exit_or_listening();
    assert!(
        listening,
        "the first server does not start:\n{}",
        first.stderr
    );
    let mut second = spawn(scratch.path(), &first_args, &[]);
    assert!(
        wait_for_output(
            &mut second,
            "waiting up to 5 s for it to stop",
            CASE_TIMEOUT
        ),
        "the second start does not wait:\n{}\n{}",
        second.stdout,
        second.stderr
    );
    let asked = Instant::now();
    let (exit, stdout, stderr) = stop_with_sigterm(second);
    let took = asked.elapsed();
    assert_eq!(exit.code(), Some(0), "{exit:?}\n{stdout}\n{stderr}");
    assert!(took < Duration::from_secs(3), "the stop took {took:?}");
    assert!(
        stdout.contains("stopped while waiting for another live flightlog of this instance"),
        "{stdout}\n{stderr}"
    );
    assert!(!stderr.contains("already served"), "{stderr}");
    let (exit, _, stderr) = stop_with_sigterm(first);
    assert!(exit.success(), "{stderr}");
}
