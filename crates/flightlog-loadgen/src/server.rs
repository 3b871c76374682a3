//! The measured server: a real `flightlog serve` child process on a fresh database in a temporary
//! directory, listening on `127.0.0.1:0`, and what is read about it from `/proc` (resident memory
//! sampled every 100 ms, CPU time).
//!
//! The process is owned by [`ServerProcess`], whose `Drop` kills it: whatever way the load
//! generator leaves (success, an error, Ctrl-C, a panic that unwinds), the server never outlives
//! it.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};

/// How long the server may take from spawn to its "listening on" line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The RSS sampling period the brief asks for.
const RSS_PERIOD: Duration = Duration::from_millis(100);
/// `/proc/<pid>/stat` counts CPU time in clock ticks of `USER_HZ`, which is 100 on every Linux
/// architecture this runs on (reading `sysconf(_SC_CLK_TCK)` would need `unsafe` libc calls,
/// which the workspace forbids).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// How to start the server.
pub struct ServerOptions {
    /// The `flightlog` binary.
    pub binary: PathBuf,
    /// Where the temporary directory with the database is made (default: the system's).
    pub tmp_parent: Option<PathBuf>,
    /// Extra `flightlog serve` arguments, after the ones the load generator sets.
    pub extra_args: Vec<String>,
}

/// A running server. Dropping it kills the process and removes its database.
pub struct ServerProcess {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    rss: Arc<RssSampler>,
    sampler: Option<std::thread::JoinHandle<()>>,
    // Dropped after the child is killed (field order does not matter: `Drop` kills first).
    _dir: tempfile::TempDir,
    db: PathBuf,
}

/// Peak memory figures read at the end of a run.
#[derive(Debug, Clone, Copy)]
pub struct MemoryReport {
    /// The highest `VmRSS` seen by the 100 ms sampler, in bytes.
    pub sampled_peak_rss: u64,
    /// `VmHWM`: the kernel's own resident high-water mark, in bytes (catches peaks between
    /// samples).
    pub vm_hwm: u64,
    /// How many samples were taken.
    pub samples: u64,
}

impl ServerProcess {
    /// Spawn `flightlog serve` on a fresh database and wait for its listening line.
    pub async fn spawn(options: &ServerOptions) -> anyhow::Result<Self> {
        if !options.binary.is_file() {
            bail!(
                "the flightlog binary {} does not exist; build it with \
                 `cargo build --release -p flightlog` or pass --server PATH",
                options.binary.display()
            );
        }
        let mut builder = tempfile::Builder::new();
        builder.prefix("flightlog-loadgen-");
        let dir = match &options.tmp_parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .context("cannot create the temporary directory for the database")?;
        let db = dir.path().join("bench.db");

        let mut command = Command::new(&options.binary);
        command
            .arg("serve")
            .arg("--db")
            .arg(&db)
            .args(["--addr", "127.0.0.1:0", "--grpc-addr", "off"])
            .args(&options.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The measured server has the default configuration: no FLIGHTLOG_* variable of this
        // shell (a token, a config file, another durability) leaks into it.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("FLIGHTLOG_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", options.binary.display()))?;
        let pid = child.id();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        // From here on the process is owned by a value whose Drop kills it.
        let rss = Arc::new(RssSampler::default());
        let mut server = Self {
            child,
            pid,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            rss,
            sampler: None,
            _dir: dir,
            db,
        };

        let stderr_tail = Arc::new(Mutex::new(Vec::<String>::new()));
        if let Some(stderr) = stderr {
            let tail = Arc::clone(&stderr_tail);
            std::thread::Builder::new()
                .name("server-stderr".into())
                .spawn(move || forward_stderr(stderr, &tail))
                .context("cannot start the stderr reader thread")?;
        }
        let (found, listening) = tokio::sync::oneshot::channel::<Option<SocketAddr>>();
        let stdout = stdout.ok_or_else(|| anyhow!("the server's stdout was not captured"))?;
        std::thread::Builder::new()
            .name("server-stdout".into())
            .spawn(move || forward_stdout(stdout, found))
            .context("cannot start the stdout reader thread")?;

        let addr = match tokio::time::timeout(STARTUP_TIMEOUT, listening).await {
            Ok(Ok(Some(addr))) => addr,
            outcome => {
                // Give stderr a moment to be read, so the message says why.
                tokio::time::sleep(Duration::from_millis(200)).await;
                let status = server.child.try_wait().ok().flatten();
                let tail = stderr_tail.lock().map(|t| t.join("\n")).unwrap_or_default();
                let why = match outcome {
                    Err(_) => format!("no listening line within {STARTUP_TIMEOUT:?}"),
                    _ => "it closed its stdout without a listening line".to_owned(),
                };
                bail!(
                    "the server did not start: {why}{}{}",
                    status.map(|s| format!(" ({s})")).unwrap_or_default(),
                    if tail.is_empty() {
                        String::new()
                    } else {
                        format!("; its stderr:\n{tail}")
                    }
                );
            }
        };
        if !addr.ip().is_loopback() {
            bail!("the server listens on {addr}, which is not a loopback address");
        }
        server.addr = addr;
        let rss = Arc::clone(&server.rss);
        server.sampler = Some(
            std::thread::Builder::new()
                .name("rss-sampler".into())
                .spawn(move || rss.run(pid))
                .context("cannot start the RSS sampler thread")?,
        );
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address (always a loopback address).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The database file (its size is reported at the end).
    pub fn db_path(&self) -> &Path {
        &self.db
    }

    /// The sampler, to read and reset phase peaks.
    pub fn rss(&self) -> &RssSampler {
        &self.rss
    }

    /// The server's CPU time so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        process_cpu_seconds(&format!("/proc/{}/stat", self.pid)).unwrap_or(f64::NAN)
    }

    /// Fail when the server has exited on its own (a crash during a phase).
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => bail!("the server exited during the run ({status})"),
            Err(err) => bail!("cannot check the server process: {err}"),
        }
    }

    /// Read the final memory figures, then kill the server.
    pub fn finish(mut self) -> MemoryReport {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        let vm_hwm = status_kib(&status, "VmHWM:").map_or(0, |kib| kib * 1024);
        let report = MemoryReport {
            sampled_peak_rss: self.rss.peak(),
            vm_hwm,
            samples: self.rss.samples.load(Ordering::Relaxed),
        };
        self.stop();
        report
    }

    fn stop(&mut self) {
        self.rss.stop.store(true, Ordering::Relaxed);
        // SIGKILL: the database is a throwaway, and a kill cannot be ignored or delayed by
        // requests in flight.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Echo the server's stdout to our stderr (stdout is kept for the results) and report the
/// address of its listening line.
fn forward_stdout(
    stdout: std::process::ChildStdout,
    found: tokio::sync::oneshot::Sender<Option<SocketAddr>>,
) {
    let mut found = Some(found);
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        say_err!("  server | {line}");
        if let Some(addr) = parse_listening_line(&line) {
            if let Some(found) = found.take() {
                let _ = found.send(Some(addr));
            }
        }
    }
    if let Some(found) = found.take() {
        let _ = found.send(None);
    }
}

fn forward_stderr(stderr: std::process::ChildStderr, tail: &Mutex<Vec<String>>) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        say_err!("  server! {line}");
        if let Ok(mut tail) = tail.lock() {
            if tail.len() >= 40 {
                tail.remove(0);
            }
            tail.push(line);
        }
    }
}

/// The address in `flightlog: listening on http://127.0.0.1:PORT (database …)`.
pub fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    let rest = line.split_once("listening on http://")?.1;
    let addr = rest.split(|c: char| c.is_whitespace() || c == '/').next()?;
    addr.parse().ok()
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:   12345 kB`).
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// User + system CPU seconds from a `/proc/<pid>/stat` file.
pub fn process_cpu_seconds(stat_path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    parse_stat_cpu_seconds(&stat)
}

fn parse_stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLOCK_TICKS_PER_SECOND)
}

/// The load generator's own CPU seconds (it shares the 2 cores with the server).
pub fn own_cpu_seconds() -> f64 {
    process_cpu_seconds("/proc/self/stat").unwrap_or(f64::NAN)
}

/// The 1-minute load average, to say how busy the machine was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// `VmRSS` every 100 ms: the overall peak and the peak of the current phase.
#[derive(Default)]
pub struct RssSampler {
    peak: AtomicU64,
    phase_peak: AtomicU64,
    last: AtomicU64,
    samples: AtomicU64,
    stop: AtomicBool,
}

impl RssSampler {
    fn run(&self, pid: u32) {
        let path = format!("/proc/{pid}/status");
        while !self.stop.load(Ordering::Relaxed) {
            let Ok(status) = std::fs::read_to_string(&path) else {
                return;
            };
            if let Some(kib) = status_kib(&status, "VmRSS:") {
                let bytes = kib * 1024;
                self.last.store(bytes, Ordering::Relaxed);
                self.peak.fetch_max(bytes, Ordering::Relaxed);
                self.phase_peak.fetch_max(bytes, Ordering::Relaxed);
                self.samples.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(RSS_PERIOD);
        }
    }

    /// The highest sample so far.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// The latest sample.
    pub fn last(&self) -> u64 {
        self.last.load(Ordering::Relaxed)
    }

    /// The highest sample since the previous call (a phase's peak), starting the next phase at
    /// the current value.
    pub fn take_phase_peak(&self) -> u64 {
        let last = self.last();
        self.phase_peak.swap(last, Ordering::Relaxed).max(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_line_gives_the_address() {
        let line = "flightlog: listening on http://127.0.0.1:41234 (database /tmp/x/bench.db, \
                    writer host-1-2)";
        assert_eq!(
            parse_listening_line(line),
            Some(SocketAddr::from(([127, 0, 0, 1], 41234)))
        );
        assert_eq!(parse_listening_line("flightlog: stopped"), None);
        assert_eq!(
            parse_listening_line("flightlog: listening on http://[::1]:80/x"),
            Some("[::1]:80".parse().expect("v6"))
        );
    }

    #[test]
    fn status_fields_are_read_in_kib() {
        let status = "Name:\tflightlog\nVmHWM:\t   52000 kB\nVmRSS:\t   41000 kB\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(41_000));
        assert_eq!(status_kib(status, "VmHWM:"), Some(52_000));
        assert_eq!(status_kib(status, "VmSwap:"), None);
    }

    #[test]
    fn cpu_time_is_counted_after_the_command_name() {
        let stat = "4242 (flight log) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100";
        assert_eq!(parse_stat_cpu_seconds(stat), Some(3.0));
    }
}
