//! The real `flightlog serve` as a child process (and a scratch folder), shared by the root
//! package's process-level tests (`connections.rs`, `disk_full.rs`, `binary_settings.rs`,
//! `foreign_lock.rs`, `restart_sweep.rs`, `restart_streams.rs`, `snapshot_memory.rs`).
//!
//! Why it exists: those tests attack or starve the binary itself (hostile connections, a full
//! disk), so each needs the same careful start and stop: an environment without inherited
//! `FLIGHTLOG_*` settings, both output streams collected without ever blocking the child, the
//! bound address read from the listening line (the tests bind port 0 on 127.0.0.1), a bounded
//! wait for it with the output in the failure message, and a SIGTERM stop whose duration and exit
//! status the test can judge. The two files had grown a copy each. Also which binary they run
//! (see [`flightlog_binary`]).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What `serve` prints once its listener is bound.
pub const LISTENING: &str = "flightlog: listening on http://";

/// The variable that points these tests at another build of this source, such as the
/// profile-guided one of `bench/pgo_build.sh`:
/// `FLIGHTLOG_TEST_BINARY=target/pgo/flightlog cargo test -p flightlog --test restart_sweep`.
pub const BINARY_VARIABLE: &str = "FLIGHTLOG_TEST_BINARY";

/// The `flightlog` binary the process-level tests run: this build's, or the one
/// [`BINARY_VARIABLE`] names (a relative path is taken from the package's folder, where cargo
/// runs the tests).
pub fn flightlog_binary() -> &'static str {
    static BINARY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BINARY.get_or_init(|| match std::env::var(BINARY_VARIABLE) {
        // Made absolute: the tests start the server in scratch folders.
        Ok(path) if !path.is_empty() => match std::fs::canonicalize(&path) {
            Ok(absolute) if absolute.is_file() => absolute.to_string_lossy().into_owned(),
            _ => panic!(
                "{BINARY_VARIABLE}={path}: no such file (build it, or unset the variable to test this build)"
            ),
        },
        _ => env!("CARGO_BIN_EXE_flightlog").to_owned(),
    })
}

/// `command` with no input, its output piped, and no `FLIGHTLOG_*` variable inherited: only the
/// test's own flags may change the settings.
pub fn isolate(command: &mut Command) {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FLIGHTLOG_") {
            command.env_remove(&name);
        }
    }
}

/// `flightlog serve --db db` on 127.0.0.1:0 with no gRPC listener, run in `folder`, with
/// `extra` flags: the command the process-level tests start a server with.
pub fn serve_command(folder: &std::path::Path, db: &std::path::Path, extra: &[&str]) -> Command {
    let mut command = Command::new(flightlog_binary());
    command
        .current_dir(folder)
        .args(["serve", "--db"])
        .arg(db)
        .args(["--addr", "127.0.0.1:0", "--grpc-addr", "off"])
        .args(extra);
    command
}

/// A running `flightlog serve`; killed when dropped if it is still running.
pub struct ServeProcess {
    pub child: Child,
    /// The API listener's address, from the listening line.
    pub addr: SocketAddr,
    output: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
}

/// How a server stopped after SIGTERM.
pub struct Stopped {
    /// It exited by itself (it was not killed).
    pub graceful: bool,
    pub status: Option<ExitStatus>,
    pub took: Duration,
    /// Everything it printed, both streams interleaved by line.
    pub output: String,
}

impl ServeProcess {
    /// Spawn `command` (a `flightlog serve … --addr 127.0.0.1:0` or a wrapper running it) with
    /// no `FLIGHTLOG_*` variable inherited and its output collected, and wait up to `timeout`
    /// for its listening line. Panics with the output if it exits or stays silent instead.
    pub fn spawn(mut command: Command, timeout: Duration) -> Self {
        isolate(&mut command);
        let mut child = command.spawn().expect("start flightlog serve");
        let output = Arc::new(Mutex::new(String::new()));
        let (send, lines) = mpsc::channel::<String>();
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().expect("piped stdout")),
            Box::new(child.stderr.take().expect("piped stderr")),
        ];
        let mut readers = Vec::new();
        for stream in streams {
            let send = send.clone();
            let output = Arc::clone(&output);
            readers.push(std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            output.lock().expect("output lock").push_str(&line);
                            let _ = send.send(line.trim_end().to_owned());
                        }
                    }
                }
            }));
        }
        drop(send);
        let started = Instant::now();
        let addr = loop {
            match lines.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(LISTENING) {
                        let addr = rest.split_whitespace().next().expect("an address");
                        break addr.parse::<SocketAddr>().expect("a socket address");
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Both streams closed: the child is exiting; the check below sees it.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            let exited = child.try_wait().expect("poll the server");
            if exited.is_some() || started.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                for reader in readers {
                    let _ = reader.join();
                }
                panic!(
                    "serve did not start (exit {exited:?}, after {:?}):\n{}",
                    started.elapsed(),
                    output.lock().expect("output lock")
                );
            }
        };
        assert!(addr.ip().is_loopback(), "listening on {addr}");
        Self {
            child,
            addr,
            output,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed so far.
    pub fn output(&self) -> String {
        self.output.lock().expect("output lock").clone()
    }

    /// SIGTERM, then SIGKILL if it has not exited within `limit`.
    pub fn stop(&mut self, limit: Duration) -> Stopped {
        let started = Instant::now();
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        let mut status = wait_at_most(&mut self.child, limit);
        let graceful = status.is_some();
        if status.is_none() {
            let _ = self.child.kill();
            status = self.child.wait().ok();
        }
        let took = started.elapsed();
        for reader in std::mem::take(&mut self.readers) {
            let _ = reader.join();
        }
        Stopped {
            graceful,
            status,
            took,
            output: self.output(),
        }
    }

    /// [`Self::stop`], asserting that the server exited by itself, successfully, without a
    /// panic; returns its output.
    pub fn stop_cleanly(&mut self, limit: Duration) -> String {
        let stopped = self.stop(limit);
        assert!(
            stopped.graceful && stopped.status.is_some_and(|status| status.success()),
            "no clean stop ({:?} after {:?}):\n{}",
            stopped.status,
            stopped.took,
            stopped.output
        );
        assert!(!stopped.output.contains("panicked"), "{}", stopped.output);
        stopped.output
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

/// The child's exit status once it exits, or `None` if it is still running after `limit`.
pub fn wait_at_most(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            return Some(status);
        }
        if started.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A scratch folder under the system's temporary one, named after the test file and the case
/// (and this process, so parallel runs do not meet), removed when dropped.
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    pub fn new(file: &str, case: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("flightlog-{file}-{case}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create the scratch folder");
        Self(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
