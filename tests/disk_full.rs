//! A full disk under the real `flightlog serve`, over real HTTP on 127.0.0.1.
//!
//! Why this file exists: flightlog is a flight recorder that must survive whatever the agents and
//! machines do to it, and a disk that fills up is the most ordinary of those things. What must
//! hold then: every write is answered (an acknowledgement or the contract's error body, never a
//! dropped connection or a hang), the process stays up, reads keep working, nothing that was
//! acknowledged is lost or left half-written, and writing resumes once there is room again.
//!
//! How a full disk is made without root: the server runs under a file-size limit
//! (`RLIMIT_FSIZE`, via `prlimit`, or bash's `ulimit -f` where `prlimit` is missing). A write past
//! the limit then fails with `EFBIG`, but only while `SIGXFSZ` is ignored (otherwise the kernel
//! kills the process), so the child is started through `bash -c 'trap "" XFSZ; exec …'`: an
//! ignored signal stays ignored across `exec`. Each case first checks that this really turns a
//! write past the limit into an error rather than a kill. Only the soft limit is set, so the test
//! can lift it on the running process later (`prlimit --pid PID --fsize=unlimited:`) without
//! privileges. The limit is per file, so the database file and its WAL each fill up on their own;
//! SQLite's `unix` VFS reports `EFBIG` as `SQLITE_IOERR_WRITE` ("disk I/O error") where a real
//! `ENOSPC` is `SQLITE_FULL`; the writer's VFS (`flightlog-walvfs`) reports both as full, so
//! the WAL's writes are answered 503 like a full disk, while the checkpointer's writes to the
//! database file may still show as I/O errors. (The server itself also handles SIGXFSZ, so it
//! survives a limit without the wrapper: the last case.)
//!
//! The cases:
//! - the WAL hits the limit first (several clients writing as fast as they can), then the
//!   database file hits it while a checkpoint copies the WAL into it; a live change stream runs
//!   throughout; the server is stopped while full, restarted under the same limit (it must come
//!   up and serve reads), then restarted without it;
//! - the database file hits the limit during a checkpoint while the WAL still has room (one paced
//!   client), so the writes acknowledged after that live only in the WAL; then the limit is lifted
//!   on the running process: writing must resume without a restart, and refused writes sent
//!   again must be taken;
//! - the disk is full before a new database is created: a clear refusal, and a file that opens
//!   once there is room;
//! - a crash, then a start with no room to grow the WAL's index (`-shm`): a refusal that says
//!   the disk is full (not "disk I/O error"), and every acknowledged write served once there is
//!   room.
//!
//! After the restart every acknowledged write (single-op spans, events and ends, batch ops,
//! journal appends, OTLP/JSON spans, a heartbeat) must be present and equal to its
//! acknowledgement, each run's change seqs dense from 1, the change log's ids gap-free, each
//! span's event indexes and each engagement's journal seqs dense from 0, and any refused write
//! that did land must be whole. Every child and every request has a time limit, and the scratch
//! folders are removed.
//!
//! The defect this file found (a start refused on a full disk because the boot sweep could not
//! write) is fixed; its minimal case stays at the end as a regression test.

#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "support/sse.rs"]
#[allow(dead_code)] // Each test file uses its own part of the shared helpers.
mod sse;
#[allow(dead_code)] // Each test file uses its own part of the shared helpers.
mod support;
use support::{wait_at_most, ServeProcess, Stopped, LISTENING};

use support::flightlog_binary as bin;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The file-size limit of the "full" server. A fresh database needs ~112 KiB of file and ~113 KiB
/// of WAL; a few MiB more is filled within seconds by the loads below.
const LIMIT: u64 = 3 * MIB;

/// How long a server may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a server may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The limit on connecting, sending a request and reading its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a load may take to fill the files up.
const FILL_DEADLINE: Duration = Duration::from_secs(30);

/// Print `text` with every line tagged with the case it belongs to (the cases run in parallel).
fn say(case: &str, text: impl fmt::Display) {
    for line in text.to_string().lines() {
        println!("[{case}] {line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Scratch folders, the file-size limit, the server process
// ---------------------------------------------------------------------------------------------

/// A scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "flightlog-disk-full-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create the scratch folder");
        Self(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// How the file-size limit is put on a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limiter {
    /// util-linux `prlimit`: also lifts the limit of a running process.
    Prlimit,
    /// bash's `ulimit -f` (1024-byte units outside POSIX mode); cannot be lifted from outside.
    Ulimit,
}

fn limiter() -> Limiter {
    static FOUND: OnceLock<Limiter> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let prlimit = Command::new("prlimit")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if prlimit {
            Limiter::Prlimit
        } else {
            eprintln!("prlimit is missing: using bash's ulimit -f (the limit cannot be lifted)");
            Limiter::Ulimit
        }
    })
}

/// `program args` under a soft file-size limit of `limit` bytes, with SIGXFSZ ignored.
fn limited_command(limit: u64, program: &str, args: &[&str]) -> Command {
    let script = match limiter() {
        Limiter::Prlimit => {
            format!(r#"trap "" XFSZ; exec prlimit --fsize={limit}: -- "$0" "$@""#)
        }
        Limiter::Ulimit => {
            assert_eq!(limit % KIB, 0, "ulimit -f counts whole KiB");
            format!(
                r#"trap "" XFSZ; ulimit -S -f {}; exec "$0" "$@""#,
                limit / KIB
            )
        }
    };
    let mut command = Command::new("bash");
    command.arg("-c").arg(script).arg(program).args(args);
    command
}

/// The premise of this file: under the wrapper, a write past the limit fails (`EFBIG`, "File too
/// large") and the writer lives on to report it, instead of being killed by SIGXFSZ.
fn assert_the_limit_fails_writes(scratch: &Scratch) {
    let probe = scratch.join("limit-probe");
    let out = fs::File::create(&probe).expect("create the probe file");
    let mut child = limited_command(64 * KIB, "head", &["-c", "200000", "/dev/zero"])
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bash");
    let status = wait_at_most(&mut child, Duration::from_secs(10));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = status.expect("the limit probe hung");
    assert_eq!(
        status.signal(),
        None,
        "the probe was killed by a signal ({status}): SIGXFSZ is not ignored; {stderr}"
    );
    assert_eq!(
        status.code(),
        Some(1),
        "`head` past the limit should fail with EFBIG: {stderr}"
    );
    assert!(stderr.contains("File too large"), "{stderr}");
    let size = fs::metadata(&probe).expect("the probe file").len();
    assert_eq!(size, 64 * KIB, "the probe file stopped at the limit");
    let _ = fs::remove_file(&probe);
}

/// Sizes of the database file and its companions.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    db: u64,
    wal: u64,
    shm: u64,
}

fn file_len(path: &Path, suffix: &str) -> u64 {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    fs::metadata(PathBuf::from(name)).map_or(0, |meta| meta.len())
}

fn sizes(db: &Path) -> Sizes {
    Sizes {
        db: file_len(db, ""),
        wal: file_len(db, "-wal"),
        shm: file_len(db, "-shm"),
    }
}

/// The WAL's frame count and how many of its frames a checkpoint has copied into the database
/// file: `mxFrame` and `nBackfill` of the wal-index in the `-shm` file (native byte order; format:
/// <https://sqlite.org/walformat.html>).
fn wal_progress(db: &Path) -> Option<(u32, u32)> {
    let mut name = db.as_os_str().to_owned();
    name.push("-shm");
    let bytes = fs::read(PathBuf::from(name)).ok()?;
    let word = |at: usize| {
        let four: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_ne_bytes(four))
    };
    Some((word(16)?, word(96)?))
}

impl fmt::Display for Sizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "database {} KiB, WAL {} KiB, shm {} KiB",
            self.db / KIB,
            self.wal / KIB,
            self.shm / KIB
        )
    }
}

/// A running `flightlog serve` child (see `support::ServeProcess`), with its address as text.
struct Server {
    process: ServeProcess,
    addr: String,
}

impl Server {
    /// Start `serve` on `db`, under the file-size `limit` if given, and wait until it listens.
    /// Each start is a new instance, named here: it closes nothing an earlier start left open,
    /// so what a test finds after a restart is what the disk let it store. The default name
    /// (host and port) is not enough: a restart the system gave the same port to was another
    /// life of the same instance, and its boot sweep closed the load's open spans (a CI run
    /// failed on it: a span whose end was refused came back `interrupted`).
    fn start(folder: &Path, db: &Path, limit: Option<u64>) -> Self {
        static STARTS: AtomicUsize = AtomicUsize::new(0);
        let instance = format!(
            "disk-full-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        );
        Self::start_as(folder, db, limit, &instance)
    }

    /// [`Server::start`] as `instance`: two starts under one name are two lives of
    /// one server, and the later one's boot sweep closes what the earlier one left open.
    fn start_as(folder: &Path, db: &Path, limit: Option<u64>, instance: &str) -> Self {
        let db_arg = db.to_str().expect("scratch paths are UTF-8");
        let args = [
            "serve",
            "--db",
            db_arg,
            "--addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "off",
            "--instance",
            instance,
        ];
        let mut command = match limit {
            Some(limit) => limited_command(limit, bin(), &args),
            None => {
                let mut command = Command::new(bin());
                command.args(args);
                command
            }
        };
        command.current_dir(folder);
        let process = ServeProcess::spawn(command, START_TIMEOUT);
        let addr = process.addr.to_string();
        Self { process, addr }
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    fn output(&self) -> String {
        self.process.output()
    }

    /// The process is still running and has printed no panic.
    fn assert_alive(&mut self, when: &str) {
        let status = self.process.child.try_wait().expect("poll the server");
        let output = self.output();
        assert!(
            status.is_none(),
            "the server died {when} ({status:?}):\n{output}"
        );
        assert!(
            !output.contains("panicked"),
            "the server panicked {when}:\n{output}"
        );
    }

    /// SIGTERM, then SIGKILL after [`STOP_TIMEOUT`].
    fn stop(mut self) -> Stopped {
        self.process.stop(STOP_TIMEOUT)
    }
}

/// Stop `server` and require a clean stop: graceful, exit status 0, no panic.
fn stop_cleanly(case: &str, server: Server, when: &str) -> Duration {
    let stopped = server.stop();
    say(
        case,
        format_args!(
            "stop {when}: SIGTERM -> {} after {:?} (status {:?})",
            if stopped.graceful {
                "exited"
            } else {
                "KILLED (no exit)"
            },
            stopped.took,
            stopped.status
        ),
    );
    assert!(
        stopped.graceful,
        "the server did not stop within {STOP_TIMEOUT:?} of SIGTERM {when}:\n{}",
        stopped.output
    );
    assert!(
        stopped.status.is_some_and(|s| s.success()),
        "the server exited with {:?} {when}:\n{}",
        stopped.status,
        stopped.output
    );
    assert!(
        !stopped.output.contains("panicked"),
        "a panic {when}:\n{}",
        stopped.output
    );
    stopped.took
}

// ---------------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client with keep-alive and time limits
// ---------------------------------------------------------------------------------------------

/// One answer.
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// One keep-alive connection to the server (reopened after an error or `Connection: close`).
struct Http {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
}

impl Http {
    fn new(addr: &str) -> Self {
        Self {
            addr: addr.to_owned(),
            conn: None,
        }
    }

    /// `method path` with a JSON `body`; `Err` for a connection that failed, was dropped or timed
    /// out (never retried: a write must not be sent twice).
    fn send(&mut self, method: &str, path: &str, body: Option<&Value>) -> Result<Reply, String> {
        let result = self.exchange(method, path, body);
        if result.is_err() {
            self.conn = None;
        }
        result.map_err(|err| format!("{method} {path}: {err} ({:?})", err.kind()))
    }

    fn get(&mut self, path: &str) -> Result<Reply, String> {
        self.send("GET", path, None)
    }

    fn exchange(&mut self, method: &str, path: &str, body: Option<&Value>) -> io::Result<Reply> {
        if self.conn.is_none() {
            let addr: SocketAddr = self.addr.parse().map_err(io::Error::other)?;
            let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
            stream.set_read_timeout(Some(IO_TIMEOUT))?;
            stream.set_write_timeout(Some(IO_TIMEOUT))?;
            stream.set_nodelay(true)?;
            self.conn = Some(BufReader::new(stream));
        }
        let conn = self.conn.as_mut().expect("connected above");
        let payload = body.map(Value::to_string).unwrap_or_default();
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if body.is_some() {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
        let stream = conn.get_mut();
        stream.write_all(head.as_bytes())?;
        stream.write_all(payload.as_bytes())?;
        stream.flush()?;

        let eof = || {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection without a full answer",
            )
        };
        let mut line = String::new();
        if conn.read_line(&mut line)? == 0 {
            return Err(eof());
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
        let mut length = None;
        let mut chunked = false;
        let mut close = false;
        loop {
            line.clear();
            if conn.read_line(&mut line)? == 0 {
                return Err(eof());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                let value = value.trim().to_ascii_lowercase();
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.parse::<usize>().ok(),
                    "transfer-encoding" => chunked = value.contains("chunked"),
                    "connection" => close = value.contains("close"),
                    _ => {}
                }
            }
        }
        let mut bytes = Vec::new();
        if chunked {
            loop {
                line.clear();
                if conn.read_line(&mut line)? == 0 {
                    return Err(eof());
                }
                let size_text = line.trim().split(';').next().unwrap_or_default();
                let size = usize::from_str_radix(size_text, 16).map_err(io::Error::other)?;
                if size == 0 {
                    loop {
                        line.clear();
                        if conn.read_line(&mut line)? == 0 || line.trim().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let start = bytes.len();
                bytes.resize(start + size, 0);
                conn.read_exact(&mut bytes[start..])?;
                line.clear();
                conn.read_line(&mut line)?;
            }
        } else if let Some(length) = length {
            bytes.resize(length, 0);
            conn.read_exact(&mut bytes)?;
        } else if status != 204 && status != 304 && !(100..200).contains(&status) {
            conn.read_to_end(&mut bytes)?;
            close = true;
        }
        if close {
            self.conn = None;
        }
        Ok(Reply {
            status,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

/// `{"error": {"code", "message"}}` with string members, as the contract words every error.
fn contract_error(body: &Value) -> Option<(String, String)> {
    let error = body.get("error")?.as_object()?;
    let code = error.get("code")?.as_str()?;
    let message = error.get("message")?.as_str()?;
    Some((code.to_owned(), message.to_owned()))
}

/// What a live change stream delivered before it ended.
struct StreamLog {
    /// `(id, data)` of each `change` event, in order.
    changes: Vec<(i64, Value)>,
    /// How it ended: `Ok` for the server's terminating chunk, `Err` for anything else.
    ended: Result<(), String>,
    ended_at: Instant,
}

/// `GET /v1/activity/changes/stream?after=0`, read on its own thread until the server ends it
/// (it does when it shuts down).
fn open_change_stream(addr: &str) -> JoinHandle<StreamLog> {
    let addr = addr.to_owned();
    std::thread::spawn(move || {
        let mut changes = Vec::new();
        let ended = read_change_stream(&addr, &mut changes).map_err(|err| err.to_string());
        StreamLog {
            changes,
            ended,
            ended_at: Instant::now(),
        }
    })
}

fn read_change_stream(addr: &str, changes: &mut Vec<(i64, Value)>) -> io::Result<()> {
    let socket: SocketAddr = addr.parse().map_err(io::Error::other)?;
    // The server sends a keep-alive comment at least every 15 s.
    sse::follow(
        socket,
        "/v1/activity/changes/stream?after=0",
        None,
        Duration::from_secs(20),
        |event| {
            if let Some(id) = event.id.as_deref().and_then(|id| id.parse::<i64>().ok()) {
                changes.push((id, serde_json::from_str(&event.data).unwrap_or(Value::Null)));
            }
        },
        &|| false,
    )
    .map(|_| ())
}

/// The stream delivered committed changes only: ids gap-free from 1, each the change the log
/// holds under that id after the restart; and it ran until the server shut down.
fn assert_stream_matches(case: &str, log: &StreamLog, stopped_at: Instant, changes: &[Value]) {
    assert!(
        log.ended.is_ok(),
        "the live change stream failed: {:?}",
        log.ended
    );
    assert!(
        log.ended_at >= stopped_at,
        "the live change stream ended before the server was stopped"
    );
    // A span change carries the span as it is when read (a later end shows), so only what
    // identifies the change is compared.
    let identity = |change: &Value| {
        json!([
            change["changeId"],
            change["runId"],
            change["seq"],
            change["kind"],
            change["span"]["spanId"],
            change["event"]["spanId"],
            change["event"]["eventIndex"]
        ])
    };
    for (position, (id, change)) in log.changes.iter().enumerate() {
        assert_eq!(
            *id,
            position as i64 + 1,
            "the live stream skipped or repeated"
        );
        assert_eq!(
            Some(identity(change)),
            changes.get(position).map(identity),
            "streamed change {id} is not the change the log holds after the restart"
        );
    }
    say(
        case,
        format_args!(
            "live change stream: {} changes, gap-free, each the stored change; it ended with \
             the server",
            log.changes.len()
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// Writes and what became of them
// ---------------------------------------------------------------------------------------------

/// What the server answered to one write.
#[derive(Debug, Clone)]
enum Fate {
    /// 2xx: the body (or the batch entry) it answered.
    Acked(Value),
    /// A contract error (HTTP 5xx, or a batch entry's error object).
    Refused,
    /// No usable answer (dropped connection, time-out, malformed answer): either outcome is
    /// possible, so it is checked like a refusal.
    Unknown,
}

impl Fate {
    fn acked(&self) -> Option<&Value> {
        match self {
            Fate::Acked(value) => Some(value),
            _ => None,
        }
    }
}

struct SpanWrite {
    span_id: String,
    run_id: String,
    name: String,
    attrs: Value,
    at: Instant,
    fate: Fate,
}

struct EventWrite {
    span_id: String,
    marker: String,
    payload: Value,
    at: Instant,
    fate: Fate,
}

struct EndWrite {
    span_id: String,
    fate: Fate,
}

struct JournalWrite {
    engagement: String,
    marker: String,
    data: Value,
    at: Instant,
    fate: Fate,
}

struct OtlpWrite {
    trace_hex: String,
    span_hex: String,
    name: String,
    at: Instant,
    fate: Fate,
}

struct HeartbeatWrite {
    span_id: String,
    beat_at: i64,
    fate: Fate,
}

/// Every write sent and its fate, plus everything that was not a contract answer.
#[derive(Default)]
struct Ledger {
    spans: Vec<SpanWrite>,
    events: Vec<EventWrite>,
    ends: Vec<EndWrite>,
    journal: Vec<JournalWrite>,
    otlp: Vec<OtlpWrite>,
    heartbeats: Vec<HeartbeatWrite>,
    /// Dropped connections, time-outs, answers that are neither 2xx nor a contract 5xx.
    failures: Vec<String>,
    /// "HTTP status code: message" -> how many refusals said it.
    refusals: BTreeMap<String, usize>,
    /// The first refusal.
    first_refusal: Option<Instant>,
}

impl Ledger {
    fn absorb(&mut self, other: Ledger) {
        self.spans.extend(other.spans);
        self.events.extend(other.events);
        self.ends.extend(other.ends);
        self.journal.extend(other.journal);
        self.otlp.extend(other.otlp);
        self.heartbeats.extend(other.heartbeats);
        self.failures.extend(other.failures);
        for (message, count) in other.refusals {
            *self.refusals.entry(message).or_default() += count;
        }
        self.first_refusal = match (self.first_refusal, other.first_refusal) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    fn fates(&self) -> impl Iterator<Item = (&Fate, Instant)> {
        let spans = self.spans.iter().map(|w| (&w.fate, w.at));
        let events = self.events.iter().map(|w| (&w.fate, w.at));
        let journal = self.journal.iter().map(|w| (&w.fate, w.at));
        let otlp = self.otlp.iter().map(|w| (&w.fate, w.at));
        spans.chain(events).chain(journal).chain(otlp)
    }

    fn acked(&self) -> usize {
        self.fates().filter(|(f, _)| f.acked().is_some()).count()
            + self
                .ends
                .iter()
                .filter(|w| w.fate.acked().is_some())
                .count()
    }

    fn acked_after(&self, when: Instant) -> usize {
        self.fates()
            .filter(|(f, at)| f.acked().is_some() && *at > when)
            .count()
    }

    fn refused(&self) -> usize {
        self.refusals.values().sum()
    }

    fn assert_no_failures(&self, when: &str) {
        assert!(
            self.failures.is_empty(),
            "{} write(s) {when} got no contract answer (dropped connection, time-out or a \
             malformed answer), first ones: {:#?}",
            self.failures.len(),
            &self.failures[..self.failures.len().min(5)]
        );
    }

    fn print_refusals(&self, case: &str) {
        say(case, "refusals (answer: count):");
        for (message, count) in &self.refusals {
            say(case, format_args!("  {message}: {count}"));
        }
    }
}

/// A cheap, deterministic pseudo-random source for incompressible padding and ids.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn text(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..len)
            .map(|_| char::from(ALPHABET[(self.next() % ALPHABET.len() as u64) as usize]))
            .collect()
    }
}

/// One client writing into its own run and its own engagement, recording every fate.
struct Writer {
    http: Http,
    ledger: Ledger,
    tag: String,
    /// Distinguishes OTLP trace ids of different writers.
    number: u64,
    run_id: String,
    engagement: String,
    n: u64,
    steps: u64,
    rng: Rng,
    pad: usize,
}

impl Writer {
    fn new(addr: &str, tag: &str, number: u64, pad: usize) -> Self {
        Self {
            http: Http::new(addr),
            ledger: Ledger::default(),
            tag: tag.to_owned(),
            number,
            run_id: format!("run-{tag}"),
            engagement: format!("eng-{tag}"),
            n: 0,
            steps: 0,
            rng: Rng(0x9E37_79B9_7F4A_7C15 ^ number.wrapping_mul(0x1234_5678_9ABC_DEF1)),
            pad,
        }
    }

    fn next_id(&mut self) -> String {
        self.n += 1;
        format!("{}-{}", self.tag, self.n)
    }

    /// The fate of one answer; a refusal must be a 5xx with the contract's error body.
    fn judge(&mut self, what: &str, reply: Result<Reply, String>, ok: u16) -> Fate {
        match reply {
            Err(err) => {
                self.ledger.failures.push(format!("{what}: {err}"));
                Fate::Unknown
            }
            Ok(reply) if reply.status == ok => Fate::Acked(reply.json()),
            Ok(reply) => match contract_error(&reply.json()) {
                Some((code, message)) if reply.status >= 500 => {
                    self.refusal(format!("HTTP {} {code}: {message}", reply.status));
                    Fate::Refused
                }
                _ => {
                    self.ledger.failures.push(format!(
                        "{what}: not a contract answer: {} {}",
                        reply.status, reply.body
                    ));
                    Fate::Unknown
                }
            },
        }
    }

    fn refusal(&mut self, key: String) {
        *self.ledger.refusals.entry(key).or_default() += 1;
        self.ledger.first_refusal.get_or_insert_with(Instant::now);
    }

    /// Spans whose end was acknowledged or went unanswered (a refused end leaves a span open, to
    /// be ended again later, as a client would retry).
    fn ended(&self) -> BTreeSet<&str> {
        self.ledger
            .ends
            .iter()
            .filter(|e| !matches!(e.fate, Fate::Refused))
            .map(|e| e.span_id.as_str())
            .collect()
    }

    /// The newest acknowledged span of this writer that is not ended.
    fn open_span(&self) -> Option<String> {
        let ended = self.ended();
        self.ledger
            .spans
            .iter()
            .rev()
            .find(|s| s.fate.acked().is_some() && !ended.contains(s.span_id.as_str()))
            .map(|s| s.span_id.clone())
    }

    /// The oldest acknowledged span of this writer that is not ended.
    fn oldest_open_span(&self) -> Option<String> {
        let ended = self.ended();
        self.ledger
            .spans
            .iter()
            .find(|s| s.fate.acked().is_some() && !ended.contains(s.span_id.as_str()))
            .map(|s| s.span_id.clone())
    }

    fn span_input(&mut self, pad: usize) -> (String, String, Value, Value) {
        let span_id = self.next_id();
        let name = format!("span {span_id}");
        let attrs = json!({"marker": span_id, "pad": self.rng.text(pad)});
        let input = json!({"spanId": span_id, "runId": self.run_id, "name": name,
                           "kind": "tool", "origin": "cron", "attrs": attrs});
        (span_id, name, attrs, input)
    }

    /// `POST /v1/activity/spans` with `pad` bytes of attrs.
    fn start_span_padded(&mut self, pad: usize) -> Fate {
        let (span_id, name, attrs, input) = self.span_input(pad);
        let reply = self.http.send("POST", "/v1/activity/spans", Some(&input));
        let fate = self.judge("start span", reply, 201);
        self.ledger.spans.push(SpanWrite {
            span_id,
            run_id: self.run_id.clone(),
            name,
            attrs,
            at: Instant::now(),
            fate: fate.clone(),
        });
        fate
    }

    fn start_span(&mut self) -> Fate {
        self.start_span_padded(self.pad)
    }

    fn event_input(&mut self) -> (String, Value) {
        let marker = format!("ev-{}", self.next_id());
        let payload = json!({"marker": marker, "pad": self.rng.text(self.pad.min(2_000))});
        (marker, payload)
    }

    /// `POST /v1/activity/spans/{id}/events` on an acknowledged span.
    fn append_event(&mut self) -> Option<Fate> {
        let span_id = self.open_span()?;
        let (marker, payload) = self.event_input();
        let body = json!({"eventType": "disk.fill", "payload": payload});
        let path = format!("/v1/activity/spans/{span_id}/events");
        let reply = self.http.send("POST", &path, Some(&body));
        let fate = self.judge("append event", reply, 201);
        self.ledger.events.push(EventWrite {
            span_id,
            marker,
            payload,
            at: Instant::now(),
            fate: fate.clone(),
        });
        Some(fate)
    }

    /// `POST /v1/activity/spans/{id}/end` on the oldest open acknowledged span.
    fn end_span(&mut self) -> Option<Fate> {
        let span_id = self.oldest_open_span()?;
        let body = json!({"outcome": "success", "reason": "done"});
        let path = format!("/v1/activity/spans/{span_id}/end");
        let reply = self.http.send("POST", &path, Some(&body));
        let fate = self.judge("end span", reply, 200);
        self.ledger.ends.push(EndWrite {
            span_id,
            fate: fate.clone(),
        });
        Some(fate)
    }

    /// `POST /v1/activity/batch`: two span starts and an event on an acknowledged span.
    fn batch(&mut self) -> Vec<Fate> {
        let (a_id, a_name, a_attrs, mut a) = self.span_input(self.pad);
        let (b_id, b_name, b_attrs, mut b) = self.span_input(self.pad);
        a["op"] = json!("startSpan");
        b["op"] = json!("startSpan");
        let mut ops = vec![a, b];
        let event = self.open_span().map(|span_id| {
            let (marker, payload) = self.event_input();
            ops.push(json!({"op": "appendEvent", "spanId": span_id,
                            "eventType": "disk.fill", "payload": payload}));
            (span_id, marker, payload)
        });
        let reply = self
            .http
            .send("POST", "/v1/activity/batch", Some(&json!({"ops": ops})));
        let whole = self.judge("batch", reply, 200);
        let mut fates = Vec::new();
        for index in 0..ops.len() {
            let fate = match &whole {
                Fate::Acked(body) => {
                    let entry = body["results"].get(index).cloned().unwrap_or(Value::Null);
                    if let Some((code, message)) = contract_error(&entry) {
                        if code == "internal" || code == "unavailable" {
                            self.refusal(format!("batch entry {code}: {message}"));
                            Fate::Refused
                        } else {
                            self.ledger
                                .failures
                                .push(format!("batch op {index}: unexpected error entry {entry}"));
                            Fate::Unknown
                        }
                    } else if entry.is_object() {
                        Fate::Acked(entry)
                    } else {
                        self.ledger
                            .failures
                            .push(format!("batch op {index}: no result in {body}"));
                        Fate::Unknown
                    }
                }
                other => other.clone(),
            };
            fates.push(fate);
        }
        let now = Instant::now();
        for (id, name, attrs, fate) in [
            (a_id, a_name, a_attrs, fates[0].clone()),
            (b_id, b_name, b_attrs, fates[1].clone()),
        ] {
            self.ledger.spans.push(SpanWrite {
                span_id: id,
                run_id: self.run_id.clone(),
                name,
                attrs,
                at: now,
                fate,
            });
        }
        if let Some((span_id, marker, payload)) = event {
            self.ledger.events.push(EventWrite {
                span_id,
                marker,
                payload,
                at: now,
                fate: fates[2].clone(),
            });
        }
        fates
    }

    /// `POST /v1/engagements/{id}/events`.
    fn journal_append(&mut self) -> Fate {
        let marker = format!("j-{}", self.next_id());
        let data = json!({"marker": marker, "pad": self.rng.text(self.pad.min(1_000))});
        let body = json!({"type": "disk.fill", "at": 1_000 + self.n, "data": data});
        let path = format!("/v1/engagements/{}/events", self.engagement);
        let reply = self.http.send("POST", &path, Some(&body));
        let fate = self.judge("journal append", reply, 201);
        self.ledger.journal.push(JournalWrite {
            engagement: self.engagement.clone(),
            marker,
            data,
            at: Instant::now(),
            fate: fate.clone(),
        });
        fate
    }

    /// `POST /v1/traces` with one finished OTLP/JSON span.
    fn otlp_span(&mut self) -> Fate {
        self.n += 1;
        let trace_hex = format!("{:08x}{:08x}{:016x}", 0xd15c_u32, self.number, self.n);
        let span_hex = format!("{:04x}{:012x}", self.number + 1, self.n);
        let name = format!("otlp {}-{}", self.tag, self.n);
        let body = json!({"resourceSpans": [{
            "resource": {"attributes": [{"key": "service.name",
                                         "value": {"stringValue": "disk-full"}}]},
            "scopeSpans": [{"scope": {"name": "disk-full"}, "spans": [{
                "traceId": trace_hex, "spanId": span_hex, "name": name, "kind": 1,
                "startTimeUnixNano": "1700000000000000000",
                "endTimeUnixNano": "1700000001000000000",
                "attributes": [{"key": "pad",
                                "value": {"stringValue": self.rng.text(self.pad.min(2_000))}}]
            }]}]
        }]});
        let reply = self.http.send("POST", "/v1/traces", Some(&body));
        let mut fate = self.judge("OTLP export", reply, 200);
        if let Fate::Acked(answer) = &fate {
            let rejected = &answer["partialSuccess"]["rejectedSpans"];
            let rejected = rejected
                .as_i64()
                .or_else(|| rejected.as_str().and_then(|text| text.parse().ok()))
                .unwrap_or(0);
            if rejected != 0 {
                self.refusal(format!(
                    "OTLP 200 with {rejected} rejected span(s): {}",
                    answer["partialSuccess"]["errorMessage"]
                ));
                fate = Fate::Refused;
            }
        }
        self.ledger.otlp.push(OtlpWrite {
            trace_hex,
            span_hex,
            name,
            at: Instant::now(),
            fate: fate.clone(),
        });
        fate
    }

    /// `POST /v1/activity/spans/{id}/heartbeat` with an explicit `at`.
    fn heartbeat(&mut self, beat_at: i64) -> Option<Fate> {
        let span_id = self.open_span()?;
        let path = format!("/v1/activity/spans/{span_id}/heartbeat");
        let reply = self.http.send("POST", &path, Some(&json!({"at": beat_at})));
        let fate = self.judge("heartbeat", reply, 204);
        self.ledger.heartbeats.push(HeartbeatWrite {
            span_id,
            beat_at,
            fate: fate.clone(),
        });
        Some(fate)
    }

    /// The next write of the mix: span starts (the bulk of the bytes), events, batches, journal
    /// appends, OTLP spans and ends, in turn.
    fn step(&mut self) {
        self.steps += 1;
        match self.steps % 7 {
            0 | 1 => {
                self.start_span();
            }
            2 => {
                if self.append_event().is_none() {
                    self.start_span();
                }
            }
            3 => {
                self.batch();
            }
            4 => {
                self.journal_append();
            }
            5 => {
                self.otlp_span();
            }
            _ => {
                if self.end_span().is_none() {
                    self.start_span();
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// While full: writes are refused with the contract's body, reads work, the process lives
// ---------------------------------------------------------------------------------------------

/// Every kind of write once more, with the files full. A big span start must be refused; smaller
/// writes may still fit into the last bytes below the limit (a heartbeat touches one page), in
/// which case they are acknowledged and checked after the restart like every other. `round`
/// keeps the ids of successive probes apart.
fn probe_writes_while_full(case: &str, round: u64, server: &mut Server, ledger: &mut Ledger) {
    let mut probe = Writer::new(&server.addr, &format!("probe{round}"), 90 + round, 8_000);
    // The probe's spans and events go to acknowledged spans of the load (its own run is empty).
    probe.ledger.spans = std::mem::take(&mut ledger.spans);
    probe.ledger.ends = std::mem::take(&mut ledger.ends);
    let mut report = Vec::new();
    for _ in 0..3 {
        let fate = probe.start_span_padded(16_000);
        assert!(
            !matches!(fate, Fate::Acked(_)),
            "a 16 KB span start was acknowledged with both files at the limit"
        );
        report.push(("start span (16 KB attrs)", fate));
    }
    if let Some(fate) = probe.append_event() {
        report.push(("append event", fate));
    }
    // A value no earlier heartbeat set, so that it changes the row.
    let beat_at = 4_242 + ledger.heartbeats.len() as i64;
    if let Some(fate) = probe.heartbeat(beat_at) {
        report.push(("heartbeat", fate));
    }
    for fate in probe.batch() {
        report.push(("batch op", fate));
    }
    report.push(("journal append", probe.journal_append()));
    report.push(("OTLP export", probe.otlp_span()));
    if let Some(fate) = probe.end_span() {
        report.push(("end span", fate));
    }
    say(case, "writes while full:");
    for (what, fate) in &report {
        let word = match fate {
            Fate::Acked(_) => "ACKNOWLEDGED (fit below the limit; checked after restart)",
            Fate::Refused => "refused",
            Fate::Unknown => "NO ANSWER",
        };
        say(case, format_args!("  {what}: {word}"));
    }
    server.assert_alive("after the writes probed the full disk");
    ledger.absorb(probe.ledger);
}

/// Reads with the files full: spans, snapshots, the change log, the journal, runs, health.
fn assert_reads_work(addr: &str, ledger: &Ledger) -> Duration {
    let started = Instant::now();
    let mut http = Http::new(addr);
    let get = |http: &mut Http, path: &str| -> Value {
        let reply = http.get(path).expect("a read while full got no answer");
        assert_eq!(
            reply.status, 200,
            "GET {path} while full: {} {}",
            reply.status, reply.body
        );
        reply.json()
    };
    assert_eq!(get(&mut http, "/healthz")["status"], "ok");
    let acked: Vec<&SpanWrite> = ledger
        .spans
        .iter()
        .filter(|s| s.fate.acked().is_some())
        .collect();
    assert!(!acked.is_empty(), "no span was acknowledged before full");
    let sample = acked
        .iter()
        .take(10)
        .chain(acked.iter().rev().take(10))
        .copied();
    for span in sample {
        let stored = get(&mut http, &format!("/v1/activity/spans/{}", span.span_id));
        assert_same_span(span, &stored, "read while full");
    }
    let runs: BTreeSet<&str> = acked.iter().map(|s| s.run_id.as_str()).collect();
    for run in runs {
        let snapshot = get(&mut http, &format!("/v1/activity/runs/{run}/snapshot"));
        assert!(snapshot["highWaterSeq"].as_i64().is_some_and(|seq| seq > 0));
        let seq = get(&mut http, &format!("/v1/activity/runs/{run}/seq"));
        assert_eq!(seq["highWaterSeq"], snapshot["highWaterSeq"]);
    }
    let changes = get(&mut http, "/v1/activity/changes?after=0&limit=100");
    assert!(changes.as_array().is_some_and(|c| !c.is_empty()));
    let cursor = get(&mut http, "/v1/activity/cursor");
    assert!(cursor["changeCursor"].as_i64().is_some_and(|c| c > 0));
    get(&mut http, "/v1/activity/runs?limit=20");
    get(&mut http, "/v1/activity/open-roots");
    let engagements: BTreeSet<&str> = ledger
        .journal
        .iter()
        .filter(|j| j.fate.acked().is_some())
        .map(|j| j.engagement.as_str())
        .collect();
    for engagement in engagements {
        let events = get(
            &mut http,
            &format!("/v1/engagements/{engagement}/events?fromSeq=0"),
        );
        for write in ledger.journal.iter().filter(|j| j.engagement == engagement) {
            if let Some(ack) = write.fate.acked() {
                assert!(
                    events
                        .as_array()
                        .is_some_and(|all| all.iter().any(|e| e == ack)),
                    "acknowledged journal event {} missing while full",
                    write.marker
                );
            }
        }
    }
    started.elapsed()
}

/// The stored span equals its acknowledgement, apart from what later writes change.
fn assert_same_span(span: &SpanWrite, stored: &Value, when: &str) {
    let Some(ack) = span.fate.acked() else {
        return;
    };
    let mutable = ["endedAt", "outcome", "outcomeReason", "lastHeartbeatAt"];
    let strip = |value: &Value| {
        let mut value = value.clone();
        if let Some(object) = value.as_object_mut() {
            for key in mutable {
                object.remove(key);
            }
        }
        value
    };
    assert_eq!(
        strip(stored),
        strip(ack),
        "span {} ({when}) differs from its acknowledgement",
        span.span_id
    );
    assert_eq!(stored["attrs"], span.attrs, "span {} attrs", span.span_id);
}

// ---------------------------------------------------------------------------------------------
// After the restart: everything acknowledged is there, whole, and densely numbered
// ---------------------------------------------------------------------------------------------

/// What the check after the restart found.
#[derive(Default, Debug)]
struct Verified {
    changes: usize,
    runs: usize,
    spans_acked: usize,
    events_acked: usize,
    ends_acked: usize,
    journal_acked: usize,
    otlp_acked: usize,
    /// Refused (or unanswered) writes that are nevertheless stored, whole.
    refused_but_stored: usize,
}

fn get_ok(http: &mut Http, path: &str) -> Value {
    let reply = http.get(path).expect("a read after the restart");
    assert_eq!(reply.status, 200, "GET {path}: {}", reply.body);
    reply.json()
}

/// The stored span for `span_id`, or `None` for a 404.
fn get_span(http: &mut Http, span_id: &str) -> Option<Value> {
    let reply = http
        .get(&format!("/v1/activity/spans/{span_id}"))
        .expect("a span read after the restart");
    match reply.status {
        200 => Some(reply.json()),
        404 => None,
        other => panic!("GET span {span_id}: {other} {}", reply.body),
    }
}

fn verify_after_restart(addr: &str, ledger: &Ledger) -> (Verified, Vec<Value>) {
    let mut http = Http::new(addr);
    let mut verified = Verified::default();

    // The change log: gap-free ids, per-run seqs dense from 1, each for a span this test wrote.
    let mut changes: Vec<Value> = Vec::new();
    let mut after = 0;
    loop {
        let page = get_ok(
            &mut http,
            &format!("/v1/activity/changes?after={after}&limit=1000"),
        );
        let page = page.as_array().cloned().expect("changes are an array");
        let Some(last) = page.last() else { break };
        after = last["changeId"].as_i64().expect("a changeId");
        changes.extend(page);
    }
    verified.changes = changes.len();
    let ids: Vec<i64> = changes
        .iter()
        .map(|c| c["changeId"].as_i64().expect("a changeId"))
        .collect();
    assert_eq!(ids.first(), Some(&1), "the change log starts at 1");
    for pair in ids.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "a gap in the change log: {pair:?}");
    }
    let sent_spans: BTreeSet<&str> = ledger
        .spans
        .iter()
        .map(|s| s.span_id.as_str())
        .chain(ledger.otlp.iter().map(|o| o.span_hex.as_str()))
        .collect();
    let mut seqs: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut logged_spans: BTreeSet<String> = BTreeSet::new();
    let mut logged_events: BTreeSet<(String, i64)> = BTreeSet::new();
    for change in &changes {
        let run = change["runId"].as_str().expect("a runId").to_owned();
        seqs.entry(run)
            .or_default()
            .push(change["seq"].as_i64().expect("a seq"));
        match change["kind"].as_str() {
            Some("span") => {
                let id = change["span"]["spanId"].as_str().expect("a spanId");
                assert!(
                    sent_spans.contains(id),
                    "a change for span {id}, which no one wrote"
                );
                logged_spans.insert(id.to_owned());
            }
            Some("event") => {
                let event = &change["event"];
                let id = event["spanId"].as_str().expect("a spanId").to_owned();
                logged_events.insert((id, event["eventIndex"].as_i64().expect("an index")));
            }
            other => panic!("a change of kind {other:?}: {change}"),
        }
    }
    verified.runs = seqs.len();
    let mut stored_events: Vec<Value> = Vec::new();
    for (run, run_seqs) in &seqs {
        let expected: Vec<i64> = (1..=run_seqs.len() as i64).collect();
        assert_eq!(run_seqs, &expected, "run {run}: seqs not dense from 1");
        let snapshot = get_ok(&mut http, &format!("/v1/activity/runs/{run}/snapshot"));
        assert_eq!(
            snapshot["highWaterSeq"].as_i64(),
            Some(run_seqs.len() as i64),
            "run {run}: the snapshot's highWaterSeq"
        );
        stored_events.extend(snapshot["events"].as_array().cloned().unwrap_or_default());
    }

    // Spans: acknowledged ones equal their acknowledgement; refused ones absent or whole.
    let acked_end: BTreeSet<&str> = ledger
        .ends
        .iter()
        .filter(|e| e.fate.acked().is_some_and(|a| a["ended"] == true))
        .map(|e| e.span_id.as_str())
        .collect();
    let tried_end: BTreeSet<&str> = ledger.ends.iter().map(|e| e.span_id.as_str()).collect();
    let mut beats: HashMap<&str, Vec<&HeartbeatWrite>> = HashMap::new();
    for beat in &ledger.heartbeats {
        beats.entry(beat.span_id.as_str()).or_default().push(beat);
    }
    for span in &ledger.spans {
        let stored = get_span(&mut http, &span.span_id);
        match (&span.fate, stored) {
            (Fate::Acked(_), None) => panic!(
                "acknowledged span {} is gone after the restart",
                span.span_id
            ),
            (Fate::Acked(ack), Some(stored)) => {
                verified.spans_acked += 1;
                assert_same_span(span, &stored, "after the restart");
                let id = span.span_id.as_str();
                if acked_end.contains(id) {
                    assert_eq!(stored["outcome"], "success", "acknowledged end of {id}");
                    assert_eq!(stored["outcomeReason"], "done");
                } else if !tried_end.contains(id) {
                    assert_eq!(stored["outcome"], Value::Null, "span {id} was never ended");
                    assert_eq!(stored["endedAt"], Value::Null);
                } else if stored["outcome"] != Value::Null {
                    // Only refused (or unanswered) ends were sent, and one landed: whole.
                    verified.refused_but_stored += 1;
                    assert_eq!(stored["outcome"], "success", "end of {id}");
                    assert_eq!(stored["outcomeReason"], "done", "end of {id}");
                    assert!(stored["endedAt"].is_i64(), "end of {id}");
                }
                // The last acknowledged heartbeat (or the start), unless a later refused one
                // landed anyway.
                let list = beats.get(id).map(Vec::as_slice).unwrap_or_default();
                let last_acked = list.iter().rposition(|b| b.fate.acked().is_some());
                let expected = match last_acked {
                    Some(index) => json!(list[index].beat_at),
                    None => ack["lastHeartbeatAt"].clone(),
                };
                if stored["lastHeartbeatAt"] != expected {
                    let later = &list[last_acked.map_or(0, |index| index + 1)..];
                    assert!(
                        later
                            .iter()
                            .any(|b| stored["lastHeartbeatAt"] == json!(b.beat_at)),
                        "span {id}: lastHeartbeatAt {} instead of {expected}",
                        stored["lastHeartbeatAt"]
                    );
                    verified.refused_but_stored += 1;
                }
                assert!(
                    logged_spans.contains(id),
                    "span {id} has no change in the log"
                );
            }
            (_, None) => {}
            (_, Some(stored)) => {
                // A refused start that landed anyway: it must be whole.
                verified.refused_but_stored += 1;
                assert_eq!(stored["runId"], json!(span.run_id), "{}", span.span_id);
                assert_eq!(stored["name"], json!(span.name), "{}", span.span_id);
                assert_eq!(stored["attrs"], span.attrs, "{}", span.span_id);
                assert!(logged_spans.contains(&span.span_id));
            }
        }
    }
    verified.ends_acked = ledger
        .ends
        .iter()
        .filter(|e| e.fate.acked().is_some())
        .count();

    // Events: indexes dense per span, each stored one whole and sent by this test, each
    // acknowledged one stored as acknowledged.
    let by_marker: HashMap<&str, &EventWrite> = ledger
        .events
        .iter()
        .map(|e| (e.marker.as_str(), e))
        .collect();
    let mut indexes: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut stored_markers: HashMap<String, Value> = HashMap::new();
    for event in &stored_events {
        let span_id = event["spanId"].as_str().expect("a spanId").to_owned();
        let index = event["eventIndex"].as_i64().expect("an eventIndex");
        assert!(
            logged_events.contains(&(span_id.clone(), index)),
            "event {span_id}#{index} has no change in the log"
        );
        indexes.entry(span_id).or_default().push(index);
        let marker = event["payload"]["marker"].as_str().expect("a marker");
        let sent = by_marker
            .get(marker)
            .unwrap_or_else(|| panic!("a stored event no one sent: {event}"));
        assert_eq!(
            event["payload"], sent.payload,
            "event {marker} is not whole"
        );
        assert_eq!(event["spanId"], json!(sent.span_id));
        stored_markers.insert(marker.to_owned(), event.clone());
    }
    for (span_id, mut list) in indexes {
        list.sort_unstable();
        let expected: Vec<i64> = (0..list.len() as i64).collect();
        assert_eq!(list, expected, "span {span_id}: event indexes not dense");
    }
    for event in &ledger.events {
        match (&event.fate, stored_markers.get(&event.marker)) {
            (Fate::Acked(ack), Some(stored)) => {
                verified.events_acked += 1;
                assert_eq!(stored, ack, "event {}", event.marker);
            }
            (Fate::Acked(_), None) => panic!(
                "acknowledged event {} is gone after the restart",
                event.marker
            ),
            (_, Some(_)) => verified.refused_but_stored += 1,
            (_, None) => {}
        }
    }

    // The journal: seqs dense from 0, each stored event whole, each acknowledged one present.
    let engagements: BTreeSet<&str> = ledger
        .journal
        .iter()
        .map(|j| j.engagement.as_str())
        .collect();
    let journal_by_marker: HashMap<&str, &JournalWrite> = ledger
        .journal
        .iter()
        .map(|j| (j.marker.as_str(), j))
        .collect();
    let mut stored_journal: HashMap<String, Value> = HashMap::new();
    for engagement in engagements {
        let events = get_ok(
            &mut http,
            &format!("/v1/engagements/{engagement}/events?fromSeq=0"),
        );
        let events = events.as_array().cloned().expect("an array");
        for (position, event) in events.iter().enumerate() {
            assert_eq!(
                event["seq"].as_i64(),
                Some(position as i64),
                "engagement {engagement}: journal seqs not dense from 0"
            );
            let marker = event["data"]["marker"].as_str().expect("a marker");
            let sent = journal_by_marker
                .get(marker)
                .unwrap_or_else(|| panic!("a journal event no one sent: {event}"));
            assert_eq!(
                event["data"], sent.data,
                "journal event {marker} is not whole"
            );
            stored_journal.insert(marker.to_owned(), event.clone());
        }
    }
    for write in &ledger.journal {
        match (&write.fate, stored_journal.get(&write.marker)) {
            (Fate::Acked(ack), Some(stored)) => {
                verified.journal_acked += 1;
                assert_eq!(stored, ack, "journal event {}", write.marker);
            }
            (Fate::Acked(_), None) => panic!(
                "acknowledged journal event {} is gone after the restart",
                write.marker
            ),
            (_, Some(_)) => verified.refused_but_stored += 1,
            (_, None) => {}
        }
    }

    // OTLP spans: acknowledged ones stored under their hex ids.
    for write in &ledger.otlp {
        let stored = get_span(&mut http, &write.span_hex);
        match (&write.fate, stored) {
            (Fate::Acked(_), None) => panic!(
                "acknowledged OTLP span {} is gone after the restart",
                write.span_hex
            ),
            (fate, Some(stored)) => {
                assert_eq!(stored["runId"], json!(write.trace_hex));
                assert_eq!(stored["name"], json!(write.name));
                assert!(logged_spans.contains(&write.span_hex));
                if fate.acked().is_some() {
                    verified.otlp_acked += 1;
                } else {
                    verified.refused_but_stored += 1;
                }
            }
            (_, None) => {}
        }
    }
    (verified, changes)
}

/// Send up to `count` refused span starts again, as a client retrying would: each must now be
/// acknowledged (a 409 would mean the refused write had landed after all).
fn retry_refused_span_starts(addr: &str, ledger: &mut Ledger, count: usize) -> usize {
    let mut http = Http::new(addr);
    let mut retried = 0;
    for span in ledger
        .spans
        .iter_mut()
        .filter(|s| matches!(s.fate, Fate::Refused))
        .take(count)
    {
        let input = json!({"spanId": span.span_id, "runId": span.run_id, "name": span.name,
                           "kind": "tool", "origin": "cron", "attrs": span.attrs});
        let reply = http
            .send("POST", "/v1/activity/spans", Some(&input))
            .expect("a retried span start got no answer");
        assert_eq!(
            reply.status, 201,
            "retrying refused span start {}: {}",
            span.span_id, reply.body
        );
        span.fate = Fate::Acked(reply.json());
        span.at = Instant::now();
        retried += 1;
    }
    assert!(retried > 0, "no refused span start to retry");
    retried
}

/// After the restart, every kind of write succeeds again.
fn assert_new_writes_succeed(addr: &str) {
    let mut writer = Writer::new(addr, "after", 77, 2_000);
    for _ in 0..14 {
        writer.step();
    }
    writer.heartbeat(9_000);
    writer.ledger.assert_no_failures("after the restart");
    assert_eq!(
        writer.ledger.refused(),
        0,
        "writes refused after the restart: {:?}",
        writer.ledger.refusals
    );
    assert!(writer.ledger.acked() >= 14);
}

fn print_verified(case: &str, verified: &Verified) {
    say(
        case,
        format_args!(
            "after the restart without the limit: {} changes over {} runs, gap-free and dense; present and equal: {} \
         spans, {} events, {} ends, {} journal events, {} OTLP spans; refused writes stored \
         anyway (whole): {}",
        verified.changes,
        verified.runs,
        verified.spans_acked,
        verified.events_acked,
        verified.ends_acked,
        verified.journal_acked,
            verified.otlp_acked,
            verified.refused_but_stored
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// Filling the files up
// ---------------------------------------------------------------------------------------------

/// What a [`fill_up`] load did.
struct Fill {
    ledger: Ledger,
    started: Instant,
    took: Duration,
    /// When the WAL reached the limit, and the sizes then.
    wal_full: (Instant, Sizes),
    /// When the database file reached the limit, and the sizes then.
    db_full: (Instant, Sizes),
}

/// Three writers as fast as they go, until both files are at the limit and nothing has been
/// acknowledged for a second; every answer recorded.
fn fill_up(server: &mut Server, db: &Path) -> Fill {
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(AtomicUsize::new(0));
    let workers: Vec<JoinHandle<Ledger>> = (0..3u64)
        .map(|number| {
            let addr = server.addr.clone();
            let stop = Arc::clone(&stop);
            let acks = Arc::clone(&acks);
            std::thread::spawn(move || {
                let mut writer = Writer::new(&addr, &format!("w{number}"), number, 3_000);
                while !stop.load(Ordering::Relaxed) {
                    let before = writer.ledger.acked();
                    writer.step();
                    acks.fetch_add(writer.ledger.acked() - before, Ordering::Relaxed);
                }
                writer.ledger
            })
        })
        .collect();
    let started = Instant::now();
    let mut wal_full = None;
    let mut db_full = None;
    let mut last_ack = (0, Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = sizes(db);
        if wal_full.is_none() && now.wal + 64 * KIB >= LIMIT {
            wal_full = Some((Instant::now(), now));
        }
        if db_full.is_none() && now.db >= LIMIT {
            db_full = Some((Instant::now(), now));
        }
        let count = acks.load(Ordering::Relaxed);
        if count != last_ack.0 {
            last_ack = (count, Instant::now());
        }
        let quiet = last_ack.1.elapsed() > Duration::from_secs(1);
        if db_full.is_some() && now.wal + 64 * KIB >= LIMIT && quiet {
            break;
        }
        let died = server.process.child.try_wait().ok().flatten().is_some();
        if started.elapsed() > FILL_DEADLINE || died {
            stop.store(true, Ordering::Relaxed);
            for worker in workers {
                let _ = worker.join();
            }
            panic!(
                "the files did not fill up within {FILL_DEADLINE:?} (or the server died: \
                 {died}): {now}, {count} acknowledged\n{}",
                server.output()
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut ledger = Ledger::default();
    for worker in workers {
        ledger.absorb(worker.join().expect("a writer thread panicked"));
    }
    Fill {
        ledger,
        started,
        took: started.elapsed(),
        wal_full: wal_full.expect("the WAL filled up"),
        db_full: db_full.expect("the database file filled up"),
    }
}

// ---------------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------------

/// Fast writers fill the WAL first (writes are refused, and acknowledged again each time a
/// checkpoint let the WAL be rewound), then the database file fills during a checkpoint, after
/// which every sizable write is refused. The server is stopped while full, restarted under the
/// same limit (it must come up and serve reads), then restarted without the limit.
#[test]
fn the_wal_then_the_database_fill_up_and_a_restart_keeps_every_acknowledged_write() {
    let case = "wal first";
    let started = Instant::now();
    let scratch = Scratch::new("wal-first");
    assert_the_limit_fails_writes(&scratch);
    let db = scratch.join("flightlog.db");
    let mut server = Server::start(&scratch.0, &db, Some(LIMIT));
    let at_start = sizes(&db);
    say(
        case,
        format_args!(
            "limit {} KiB per file ({:?}); at start: {at_start}",
            LIMIT / KIB,
            limiter()
        ),
    );
    assert!(
        at_start.db.max(at_start.wal) + 2 * MIB <= LIMIT,
        "the limit must leave a few MiB above what the server needs at start"
    );

    // A live change stream runs through all of it, until the server stops.
    let stream = open_change_stream(&server.addr);
    let fill = fill_up(&mut server, &db);
    let mut ledger = fill.ledger;
    server.assert_alive("while the files filled up");
    ledger.assert_no_failures("while the files filled up");
    let (wal_full, wal_sizes) = fill.wal_full;
    let (db_full, db_sizes) = fill.db_full;
    let first_refusal = ledger.first_refusal.expect("some write was refused");
    say(
        case,
        format_args!(
            "load of {:?}: {} writes acknowledged, {} refused\nfirst refusal after {:?}\nWAL at \
             the limit after {:?} ({wal_sizes}); acknowledged after that: {}\ndatabase file at \
             the limit after {:?} ({db_sizes}); acknowledged after that: {}\nnow {}",
            fill.took,
            ledger.acked(),
            ledger.refused(),
            first_refusal - fill.started,
            wal_full - fill.started,
            ledger.acked_after(wal_full),
            db_full - fill.started,
            ledger.acked_after(db_full),
            sizes(&db),
        ),
    );
    ledger.print_refusals(case);
    assert!(
        wal_full <= db_full,
        "this case is about the WAL filling first"
    );
    assert!(ledger.acked() > 0 && ledger.refused() > 0);

    probe_writes_while_full(case, 1, &mut server, &mut ledger);
    ledger.assert_no_failures("while full");
    let reads = assert_reads_work(&server.addr, &ledger);
    say(case, format_args!("reads while full: all 200 ({reads:?})"));
    server.assert_alive("after the reads while full");
    let stopping = Instant::now();
    stop_cleanly(case, server, "while full");
    let stream = stream.join().expect("the stream reader panicked");
    say(case, format_args!("files left: {}", sizes(&db)));

    // Still full: a restart under the same limit must come up, serve reads and refuse writes.
    let mut server = Server::start(&scratch.0, &db, Some(LIMIT));
    say(
        case,
        "restarted under the same limit, still full: listening",
    );
    probe_writes_while_full(case, 2, &mut server, &mut ledger);
    ledger.assert_no_failures("after a restart while full");
    assert_reads_work(&server.addr, &ledger);
    stop_cleanly(case, server, "after a restart while full");

    let server = Server::start(&scratch.0, &db, None);
    let (verified, changes) = verify_after_restart(&server.addr, &ledger);
    print_verified(case, &verified);
    assert_stream_matches(case, &stream, stopping, &changes);
    assert_new_writes_succeed(&server.addr);
    stop_cleanly(case, server, "after the restart without the limit");
    say(case, format_args!("took {:?}", started.elapsed()));
}

/// One paced writer keeps the WAL short (each burst is copied into the database file and the WAL
/// rewound before the next), so the database file is the one to hit the limit, during a
/// checkpoint; writes then go on into the WAL, which can no longer be rewound, until it is full
/// too. Those writes live only in the WAL. Then the limit is lifted on the running process:
/// writes must resume without a restart. Finally a restart without the limit must hold
/// everything.
#[test]
fn the_database_fills_during_a_checkpoint_and_writes_resume_once_there_is_room() {
    let case = "database first";
    let started = Instant::now();
    let scratch = Scratch::new("db-first");
    assert_the_limit_fails_writes(&scratch);
    let db = scratch.join("flightlog.db");
    let mut server = Server::start(&scratch.0, &db, Some(LIMIT));
    say(
        case,
        format_args!(
            "limit {} KiB per file; at start: {}",
            LIMIT / KIB,
            sizes(&db)
        ),
    );
    let mut writer = Writer::new(&server.addr, "paced", 1, 20_000);

    // Bursts the WAL can hold (~1.6 MiB of it), each followed by a pause until the checkpointer
    // (every 500 ms) has copied it, until the database file is at the limit.
    const BURST: usize = 30;
    let load_started = Instant::now();
    let (db_full_at, at_db_full) = loop {
        for _ in 0..BURST {
            writer.step();
        }
        assert_eq!(
            writer.ledger.refused(),
            0,
            "a write was refused before the database file was full ({}): the WAL filled \
             first; refusals {:?}",
            sizes(&db),
            writer.ledger.refusals
        );
        // Until the checkpointer copied the burst into the database file (its next write then
        // rewinds the WAL), or failed to because the database file is full; ~450 ms measured.
        // Without a readable wal-index, a pause longer than the checkpointer's period.
        let settle = Instant::now();
        while sizes(&db).db < LIMIT
            && wal_progress(&db).map_or(
                settle.elapsed() < Duration::from_millis(600),
                |(frames, copied)| copied < frames,
            )
            // A bound for a checkpointer that is stuck, not slow: a busy machine's may take
            // seconds, and the next burst on an un-rewound WAL would fill it first.
            && settle.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let now = sizes(&db);
        if now.db >= LIMIT {
            break (Instant::now(), now);
        }
        assert!(
            load_started.elapsed() < FILL_DEADLINE,
            "the database file did not fill up within {FILL_DEADLINE:?}: {now}"
        );
    };
    say(
        case,
        format_args!(
            "database file at the limit after {:?}, {} writes acknowledged before: {at_db_full}",
            db_full_at - load_started,
            writer.ledger.acked()
        ),
    );
    assert!(
        at_db_full.wal < LIMIT,
        "the WAL must still have room when the database file fills"
    );

    // Now without pauses: the WAL can no longer be rewound and fills up.
    let mut refused_in_a_row = 0;
    while refused_in_a_row < 30 {
        let before = writer.ledger.acked();
        writer.start_span();
        if writer.ledger.acked() > before {
            refused_in_a_row = 0;
        } else {
            refused_in_a_row += 1;
        }
        assert!(
            load_started.elapsed() < FILL_DEADLINE,
            "the WAL did not fill up within {FILL_DEADLINE:?}: {}",
            sizes(&db)
        );
    }
    let only_in_wal = writer.ledger.acked_after(db_full_at);
    say(
        case,
        format_args!(
            "then {only_in_wal} writes acknowledged into the WAL alone, until it was full too \
             ({}); {} refused",
            sizes(&db),
            writer.ledger.refused()
        ),
    );
    writer.ledger.print_refusals(case);
    assert!(
        only_in_wal > 0,
        "no write was acknowledged after the database file filled"
    );
    server.assert_alive("while the files filled up");
    writer
        .ledger
        .assert_no_failures("while the files filled up");
    let mut ledger = std::mem::take(&mut writer.ledger);
    drop(writer);

    probe_writes_while_full(case, 1, &mut server, &mut ledger);
    ledger.assert_no_failures("while full");
    let reads = assert_reads_work(&server.addr, &ledger);
    say(case, format_args!("reads while full: all 200 ({reads:?})"));

    // Make room: lift the soft limit of the running server.
    if limiter() == Limiter::Prlimit {
        let lifted = Command::new("prlimit")
            .args(["--pid", &server.pid().to_string(), "--fsize=unlimited:"])
            .output()
            .expect("run prlimit --pid");
        assert!(
            lifted.status.success(),
            "prlimit --pid failed: {}",
            String::from_utf8_lossy(&lifted.stderr)
        );
        let lifted_at = Instant::now();
        let mut writer = Writer::new(&server.addr, "room", 2, 6_000);
        let recovered = loop {
            let fate = writer.start_span();
            if fate.acked().is_some() {
                break lifted_at.elapsed();
            }
            assert!(
                lifted_at.elapsed() < Duration::from_secs(10),
                "writes did not resume within 10 s of lifting the limit: {:?}",
                writer.ledger.refusals
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let refused_before = writer.ledger.refused();
        for _ in 0..28 {
            writer.step();
        }
        writer.ledger.assert_no_failures("after lifting the limit");
        assert_eq!(
            writer.ledger.refused(),
            refused_before,
            "writes refused after they had resumed: {:?}",
            writer.ledger.refusals
        );
        // The checkpointer must catch up: the database file grows past the old limit.
        let caught_up = Instant::now();
        while sizes(&db).db <= LIMIT && caught_up.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        say(
            case,
            format_args!(
                "limit lifted (prlimit --pid): first write acknowledged after {recovered:?} \
                 ({refused_before} refused before it), the next {} all acknowledged; \
                 checkpoint caught up after {:?}: {}",
                writer.ledger.acked() - 1,
                caught_up.elapsed(),
                sizes(&db)
            ),
        );
        assert!(
            sizes(&db).db > LIMIT,
            "the checkpoint never copied the WAL past the old limit: {}",
            sizes(&db)
        );
        ledger.absorb(std::mem::take(&mut writer.ledger));
        let retried = retry_refused_span_starts(&server.addr, &mut ledger, 5);
        say(
            case,
            format_args!("{retried} refused span starts sent again: all acknowledged (201)"),
        );
    } else {
        say(
            case,
            "prlimit is missing: the limit cannot be lifted on the running server",
        );
    }
    server.assert_alive("after lifting the limit");
    stop_cleanly(case, server, "after making room");

    let server = Server::start(&scratch.0, &db, None);
    let (verified, _) = verify_after_restart(&server.addr, &ledger);
    print_verified(case, &verified);
    assert_new_writes_succeed(&server.addr);
    stop_cleanly(case, server, "after the restart without the limit");
    say(case, format_args!("took {:?}", started.elapsed()));
}

/// The disk is already full when `serve` creates its database: it must refuse to start with a
/// message naming the database (no panic, no listening), and the file it left must open once
/// there is room.
/// `serve` on `db` at a port of its choosing, without the gRPC listener.
fn serve_args(db: &str) -> [&str; 7] {
    [
        "serve",
        "--db",
        db,
        "--addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "off",
    ]
}

/// A start that exited 1 before listening, without a panic.
fn assert_refused_start(status: ExitStatus, output: &str) {
    assert!(!output.contains(LISTENING), "it listened:\n{output}");
    assert!(!output.contains("panicked"), "a panic:\n{output}");
    assert_eq!(status.code(), Some(1), "{output}");
}

/// Run `flightlog` with `args` under the file-size `limit`, in `scratch`, expecting it to exit
/// by itself within [`START_TIMEOUT`]: its exit status and everything it printed.
fn refused_start(scratch: &Scratch, limit: u64, args: &[&str]) -> (ExitStatus, String) {
    let mut child = limited_command(limit, bin(), args)
        .current_dir(&scratch.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start flightlog serve");
    let status = wait_at_most(&mut child, START_TIMEOUT);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut output = String::new();
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut pipe = pipe;
        let _ = pipe.read_to_string(&mut output);
    }
    let status = status.unwrap_or_else(|| panic!("serve neither refused nor exited:\n{output}"));
    (status, output)
}

#[test]
fn a_new_database_on_a_full_disk_is_refused_and_opens_once_there_is_room() {
    let case = "full at start";
    let scratch = Scratch::new("full-at-start");
    assert_the_limit_fails_writes(&scratch);
    let db = scratch.join("flightlog.db");
    let db_arg = db.to_str().expect("scratch paths are UTF-8");
    let args = serve_args(db_arg);
    // Below what a fresh database needs (~112 KiB of file and as much WAL).
    let (status, output) = refused_start(&scratch, 64 * KIB, &args);
    say(
        case,
        format_args!("limit 64 KiB: {status}: {}", output.trim()),
    );
    assert_refused_start(status, &output);
    assert!(
        output.contains("cannot open the database") && output.contains(db_arg),
        "the message names the database:\n{output}"
    );
    say(case, format_args!("left behind: {}", sizes(&db)));

    let server = Server::start(&scratch.0, &db, None);
    let mut writer = Writer::new(&server.addr, "roomy", 5, 500);
    for _ in 0..7 {
        writer.step();
    }
    writer.ledger.assert_no_failures("once there is room");
    assert_eq!(writer.ledger.refused(), 0, "{:?}", writer.ledger.refusals);
    drop(writer);
    stop_cleanly(case, server, "once there is room");
}

/// After a crash, the first connection to open the database cuts the `-shm` file (the WAL's
/// index) to 3 bytes and grows it again, 32 KiB at a time; the WAL's index also grows as the WAL
/// passes each 4,096 pages. With no room for that growth SQLite answers "disk I/O error"
/// (`SQLITE_IOERR_SHMSIZE`), and the start was refused with that alone, which reads as a broken
/// disk. The refusal now says the disk is full and what to do, the files are left as they were,
/// and a start once there is room serves every write acknowledged before the crash.
#[test]
fn a_restart_after_a_crash_with_no_room_for_the_wal_index_says_the_disk_is_full() {
    let case = "no room for -shm";
    let scratch = Scratch::new("shm-growth");
    assert_the_limit_fails_writes(&scratch);
    let db = scratch.join("flightlog.db");
    let db_arg = db.to_str().expect("scratch paths are UTF-8");
    let mut server = Server::start(&scratch.0, &db, None);
    let mut writer = Writer::new(&server.addr, "crashed", 11, 500);
    for _ in 0..5 {
        writer.step();
    }
    writer.ledger.assert_no_failures("before the crash");
    assert_eq!(writer.ledger.refused(), 0, "{:?}", writer.ledger.refusals);
    let ledger = std::mem::take(&mut writer.ledger);
    drop(writer);
    server.process.child.kill().expect("SIGKILL the server");
    let _ = server.process.child.wait();
    let crashed = sizes(&db);
    say(case, format_args!("after SIGKILL: {crashed}"));
    assert!(
        file_len(&db, "-wal") > 0 && file_len(&db, "-shm") >= 32 * KIB,
        "the crash left a WAL and its index: {crashed}"
    );

    // Room for reads, none for the first 32 KiB region of the index.
    let args = serve_args(db_arg);
    let (status, output) = refused_start(&scratch, 16 * KIB, &args);
    say(
        case,
        format_args!("limit 16 KiB: {status}: {}", output.trim()),
    );
    assert_refused_start(status, &output);
    assert!(
        output.contains(db_arg)
            && output.contains("the disk is full")
            && output.contains("-shm")
            && output.contains("free space"),
        "the refusal names the database, says the disk is full and what to do:\n{output}"
    );
    assert_eq!(
        file_len(&db, "-wal"),
        crashed.wal,
        "the refused start left the WAL as it was"
    );

    let server = Server::start(&scratch.0, &db, None);
    let (verified, _) = verify_after_restart(&server.addr, &ledger);
    print_verified(case, &verified);
    assert_new_writes_succeed(&server.addr);
    stop_cleanly(case, server, "once there is room");
}

// ---------------------------------------------------------------------------------------------
// Regression: the defect this file found
// ---------------------------------------------------------------------------------------------

/// A run left a `session` span open (a crash, or the server stopped while full), and the disk is
/// still full when `serve` starts again: the boot sweep, which closes such spans as
/// interrupted, is a write, it failed, and `serve` exited instead of serving, so the recorder
/// could not even show what it holds until room was made. It comes up now (reads served, writes
/// refused with the contract's error), with a warning that the spans stay open.
#[test]
fn a_restart_on_a_full_disk_with_an_open_session_span_still_serves() {
    let case = "restart while full";
    let scratch = Scratch::new("boot-sweep");
    assert_the_limit_fails_writes(&scratch);
    let db = scratch.join("flightlog.db");
    let mut server = Server::start_as(&scratch.0, &db, Some(LIMIT), "restarted");
    let mut http = Http::new(&server.addr);
    let session = json!({"spanId": "session-1", "runId": "run-session", "name": "a session",
                         "kind": "turn", "origin": "session"});
    let reply = http
        .send("POST", "/v1/activity/spans", Some(&session))
        .expect("start a session span");
    assert_eq!(reply.status, 201, "{}", reply.body);
    drop(http);
    fill_up(&mut server, &db);
    stop_cleanly(case, server, "while full");

    // Panics with the server's output if it does not come up.
    let server = Server::start_as(&scratch.0, &db, Some(LIMIT), "restarted");
    let mut http = Http::new(&server.addr);
    let reply = http
        .get("/v1/activity/spans/session-1")
        .expect("read the session span");
    assert_eq!(reply.status, 200, "{}", reply.body);
    drop(http);
    let output = server.output();
    assert!(
        output.contains("could not close the spans a previous run left open"),
        "the boot sweep was tried, failed and said so:\n{output}"
    );
    stop_cleanly(case, server, "after a restart while full");
}

/// Under a file-size limit *without* the wrapper that ignores SIGXFSZ (a service manager's
/// `LimitFSIZE=`, a shell's `ulimit -f`), the first write past the limit killed the server with
/// that signal, without a word: connections dropped, nothing answered. It now handles the
/// signal, and the write past the limit is answered like one on a full disk: 503 with
/// `Retry-After`, the server up and reading.
#[test]
fn a_file_size_limit_without_the_signal_ignored_is_a_full_disk_not_a_kill() {
    if limiter() != Limiter::Prlimit {
        eprintln!("skipped: needs prlimit");
        return;
    }
    let scratch = Scratch::new("sigxfsz");
    let db = scratch.join("flightlog.db");
    let limit = 1_500_000u64;
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--fsize={limit}:"))
        .arg("--")
        .arg(bin())
        .args(["serve", "--db"])
        .arg(&db)
        .args(["--addr", "127.0.0.1:0", "--grpc-addr", "off"])
        .current_dir(&scratch.0);
    let mut server = ServeProcess::spawn(command, START_TIMEOUT);
    let addr = server.addr.to_string();
    let mut http = Http::new(&addr);
    let filler = "x".repeat(3_000);
    let mut acknowledged = 0;
    let refused = (0..2_000).find_map(|i| {
        let span = json!({"spanId": format!("s{i}"), "runId": "r", "name": "t", "kind": "turn",
                          "origin": "session", "attrs": {"filler": filler}});
        match http.send("POST", "/v1/activity/spans", Some(&span)) {
            Ok(reply) if reply.status == 201 => {
                acknowledged += 1;
                None
            }
            other => Some(other),
        }
    });
    let Some(refused) = refused else {
        panic!("2,000 writes of 3 KB fit under a {limit}-byte file-size limit");
    };
    let refused = refused.unwrap_or_else(|err| {
        panic!(
            "the write past the limit got no answer ({err}); the server:\n{}",
            server.output()
        )
    });
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(
        server.child.try_wait().expect("poll").is_none(),
        "the server died"
    );
    // The operator hears of it too, not only the clients (the log said nothing before).
    let said = "flightlog: error: a write was refused (503, Retry-After): the disk is full";
    let deadline = Instant::now() + Duration::from_secs(5);
    while !server.output().contains(said) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.output().contains(said), "{}", server.output());
    let reply = http
        .get("/v1/activity/spans/s0")
        .expect("a read while full");
    assert_eq!(reply.status, 200, "{}", reply.body);
    say(
        "sigxfsz",
        format!("{acknowledged} writes acknowledged, then 503 past the limit; still serving"),
    );
    drop(http);
    let stopped = server.stop(STOP_TIMEOUT);
    assert!(stopped.graceful, "a clean stop while full");
}
