//! `flightlog-loadgen`: measures a real `flightlog serve` process over loopback.
//!
//! The in-process benchmarks (`crates/flightlog-sqlite/benches`) measure the store; this binary
//! measures what a client sees: the server is started as its own process on a fresh database
//! (`--addr 127.0.0.1:0`), driven over keep-alive HTTP/1.1 connections, watched through `/proc`
//! (RSS every 100 ms, `VmHWM`, CPU time) and killed at the end, also on an error or Ctrl-C.
//! Everything connects to 127.0.0.1 only, and every phase is bounded in count and in time.
//!
//! - `http`: the reference workload through the single-op endpoints and through
//!   `POST /v1/activity/batch`, then commit-to-stream latency on the change stream.
//! - `otlp`: pre-encoded OTLP protobuf bodies of agent-shaped traces to `/v1/traces`, until
//!   every body is queryable.
//! - `machine`: only the machine probe ([`machine`]), which `http` and `otlp` also run before
//!   starting the server, so every result says how fast the shared machine was at the time.
//!
//! Output: a table (stdout), the server's own lines (stderr, prefixed), and a last stdout line
//! that is the whole result as one JSON object. The exit status is 1 when a phase had errors or
//! failed a check (missed targets are reported, not failed).

/// `println!` and `eprintln!` for this tool's report, through [`write_line`].
macro_rules! say {
    ($($arg:tt)*) => { $crate::write_line(&mut std::io::stdout().lock(), format_args!($($arg)*)) };
}
macro_rules! say_err {
    ($($arg:tt)*) => { $crate::write_line(&mut std::io::stderr().lock(), format_args!($($arg)*)) };
}

mod client;
mod http_bench;
mod machine;
mod otlp_bench;
mod server;
mod sse;
mod stats;
mod stream_bench;
mod workload;
mod writer_use;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use reqwest::Url;
use serde_json::{json, Map, Value};

use crate::http_bench::{
    batch_phase, single_op_phase, BatchShape, PHASE_BATCH, PHASE_BIG_BATCH, PHASE_WARMUP,
};
use crate::otlp_bench::{otlp_phase, OtlpShape};
use crate::server::{load_average, MemoryReport, ServerOptions, ServerProcess};
use crate::stats::{mib, print_table, PhaseReport, Target};
use crate::stream_bench::{paced_baseline_phase, stream_phase, StreamShape};

/// Load generator for a real `flightlog serve` process over loopback.
///
/// Starts `<server> serve --db <tempdir>/bench.db --addr 127.0.0.1:0 --grpc-addr off`, runs the
/// chosen benchmark against it, samples its RSS from /proc every 100 ms, and kills it at the end
/// (also on errors and Ctrl-C). Prints a table, then one line of JSON.
#[derive(Parser)]
#[command(name = "flightlog-loadgen", version, about, long_about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Common {
    /// The flightlog binary to measure [default: target/release/flightlog of this workspace].
    #[arg(long, value_name = "PATH", global = true)]
    server: Option<PathBuf>,
    /// Directory in which the temporary database directory is made [default: the system's].
    #[arg(long, value_name = "DIR", global = true)]
    tmp_dir: Option<PathBuf>,
    /// Extra argument for `flightlog serve` (repeatable), e.g. --server-arg=--durability=full.
    #[arg(
        long = "server-arg",
        value_name = "ARG",
        global = true,
        allow_hyphen_values = true
    )]
    server_args: Vec<String>,
    /// The longest any one phase may run before it stops and reports itself incomplete.
    #[arg(long, value_name = "SECONDS", default_value_t = 120, global = true)]
    phase_timeout: u64,
    /// Threads of this generator's own runtime (its clients and checks). One by default, as
    /// `wrk -t1 -c64` would be run beside a server on a small machine: the generator shares the
    /// cores with the server it measures, and with two threads it took ~9% more CPU a request
    /// (its connections' tasks moving between the threads), and the server did ~7% fewer
    /// single-op writes/s beside it (BENCHMARKS.md, stop 39). The concurrency is --clients /
    /// --connections either way.
    #[arg(long, value_name = "N", default_value_t = 1, global = true,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    generator_threads: u16,
}

#[derive(Subcommand)]
enum Command {
    /// HTTP writes/s through the single-op endpoints and through /v1/activity/batch, and
    /// commit-to-stream latency on /v1/activity/changes/stream.
    ///
    /// The workload is the store benchmark's (crates/flightlog-sqlite/benches/activity_workload.rs):
    /// per run a root `turn` span; 5 child `tool` spans, each with two ~300-byte events, a usage
    /// patch and an end; then the root's end with usage and the rollup: 28 writes, 27 of them
    /// change-logged. All bodies are encoded before each phase's clock starts.
    ///
    /// Phases (in this order; --phases picks some):
    ///
    /// single: --runs runs by --clients concurrent tasks, each with its own keep-alive
    /// connection, one request per write; writes/s and request latency.
    ///
    /// batch: each run's 27 span writes as ONE POST /v1/activity/batch (startSpan, appendEvent,
    /// patchSpan, endSpan ops), the run's rollup POSTed right after it (a rollup is not a batch
    /// op; --no-batch-rollup leaves it out); the rate counts batch ops only.
    ///
    /// big-batch: the same with --big-batch runs per request (8 runs = 216 ops).
    ///
    /// stream: one SSE client on /v1/activity/changes/stream?after=<cursor> while writer tasks
    /// pace span starts and ends at --stream-rate writes/s for --stream-seconds (each span a
    /// run's root, ended ~20 ms after its start); per write, delivered - acknowledged (HTTP
    /// answer) and delivered - sent, p50/p99/max; checks that every acknowledged change arrived
    /// exactly once, in changeId order, with its run seq. --stream-baseline first runs the same
    /// paced writes with no stream client (phase paced-no-stream), to tell the costs apart.
    ///
    /// Every write phase also checks that the change log grew by exactly 27 per run.
    /// Targets (from the issue): single-op >= 50,000 writes/s, batch >= 150,000 writes/s,
    /// stream p99 <= 10 ms at 5,000 writes/s, server RSS < 100 MiB.
    #[command(verbatim_doc_comment)]
    Http(HttpArgs),
    /// OTLP/HTTP protobuf ingest: spans/s accepted and spans/s end to end (queryable).
    ///
    /// Bodies of agent-shaped traces (a root invoke_agent span, 5 `chat` model spans with
    /// gen_ai.request.model and gen_ai.usage.*, 4 execute_tool spans, 5 span events per trace of
    /// 10 spans), --spans-per-body spans each, unique trace and span ids across all bodies, all
    /// encoded before the clock starts, POSTed as application/x-protobuf to /v1/traces over
    /// --connections keep-alive connections.
    ///
    /// Accepted: every POST answered 200 with an empty partialSuccess; rate = spans / time to the
    /// last answer. End to end: the last span of every body read back with
    /// GET /v1/activity/spans/{id} as soon as its body is accepted (re-read until found, for at
    /// most --wait-seconds after the last POST); rate = spans / time to the last one found.
    /// Afterwards --verify-sample random spans are read back and their kind checked.
    ///
    /// Targets (from the issue): >= 100,000 spans/s end to end, server RSS < 150 MiB.
    #[command(verbatim_doc_comment)]
    Otlp(OtlpArgs),
    /// Only the machine probe: how fast this shared machine is right now (a CPU step, a random
    /// memory load, a cross-thread wake-up round trip; best of 3, about half a second), to read
    /// any benchmark's figures against. `http` and `otlp` run it too, before the server starts.
    Machine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum HttpPhase {
    Single,
    Batch,
    BigBatch,
    Stream,
}

#[derive(Args)]
struct HttpArgs {
    /// Runs of the reference workload in the single-op phase (28 writes each).
    #[arg(long, default_value_t = 2_000)]
    runs: usize,
    /// Concurrent client tasks (each with its own keep-alive connection).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Runs in each batch phase [default: --runs].
    #[arg(long)]
    batch_runs: Option<usize>,
    /// Concurrent clients in the batch phases [default: --clients].
    #[arg(long)]
    batch_clients: Option<usize>,
    /// Runs per request in the big-batch phase (27 ops each; the server takes at most 1,000
    /// ops, so at most 37 runs).
    #[arg(long, default_value_t = 8)]
    big_batch: usize,
    /// Do not send the rollups after the batches (the batch phases then time batch requests
    /// only).
    #[arg(long)]
    no_batch_rollup: bool,
    /// Writes per second (span starts and ends) in the stream phase.
    #[arg(long, default_value_t = 5_000.0)]
    stream_rate: f64,
    /// Length of the stream phase's paced writing, in seconds.
    #[arg(long, default_value_t = 5.0)]
    stream_seconds: f64,
    /// Before the stream phase, run its paced writes once with no stream client
    /// (`paced-no-stream`), to tell the writes' cost from the stream's.
    #[arg(long)]
    stream_baseline: bool,
    /// Writer tasks pacing the stream phase's writes.
    #[arg(long, default_value_t = 64)]
    stream_writers: usize,
    /// How long to wait, after the last write was answered, for the stream to deliver the rest.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    stream_grace_ms: u64,
    /// More clients of the change stream in the stream phase, beside the measured one (all on
    /// one thread of their own): each must receive exactly the changes the measured one did, in
    /// the same order. What many dashboards cost the writers shows in the achieved rate and
    /// the server's CPU.
    #[arg(long, default_value_t = 0)]
    stream_crowd: usize,
    /// Runs written (through the batch endpoint, unmeasured) before the first phase, so the
    /// phases see a server in its steady state: the event-payload compression dictionary is
    /// trained once per database on its first 256 KB of payloads, a one-time ~0.1 - 0.2 s of
    /// CPU that would otherwise land in the first phase. 0: no warm-up.
    #[arg(long, default_value_t = 150)]
    warmup_runs: usize,
    /// The phases to run, in the fixed order single, batch, big-batch, stream.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,batch,big-batch,stream"
    )]
    phases: Vec<HttpPhase>,
}

#[derive(Args)]
struct OtlpArgs {
    /// Spans in all (rounded up to whole bodies).
    #[arg(long, default_value_t = 200_000)]
    spans: usize,
    /// Concurrent connections posting bodies.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Spans per body (a multiple of 10: whole traces).
    #[arg(long, default_value_t = 500)]
    spans_per_body: usize,
    /// Spans read back after the clock to check their mapped kind and origin.
    #[arg(long, default_value_t = 200)]
    verify_sample: usize,
    /// The longest wait, after the last POST was answered, for every body to be queryable.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    wait_seconds: u64,
    /// Send every body gzip-compressed (`Content-Encoding: gzip`), as the OpenTelemetry
    /// Collector's OTLP exporters do by default.
    #[arg(long)]
    gzip: bool,
    /// Send OTLP/JSON bodies (`application/json`, hex ids, as the OpenTelemetry JavaScript
    /// SDK's OTLP/HTTP JSON exporter sends them) instead of protobuf.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before any runtime or server thread exists, so nothing of ours competes with the probe.
    let speed = machine::measure();
    if matches!(cli.command, Command::Machine) {
        say!("{}", speed.describe());
        say!(
            "{}",
            json!({"loadgen": "machine", "machine": speed.to_json()})
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(cli.common.generator_threads))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            say_err!("flightlog-loadgen: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // When a signal wins, the benchmark's future is dropped, and with it the server process
    // (its Drop kills it) and the temporary database.
    let result = runtime.block_on(async {
        tokio::select! {
            result = run(cli, speed) => result,
            signal = interrupted() => Err(anyhow::anyhow!("interrupted by {signal}; the server was stopped")),
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            say_err!("flightlog-loadgen: some phase had errors or failed a check (see above)");
            ExitCode::FAILURE
        }
        Err(err) => {
            say_err!("flightlog-loadgen: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on Ctrl-C or SIGTERM, naming it.
async fn interrupted() -> &'static str {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => "Ctrl-C",
        () = terminate => "SIGTERM",
    }
}

fn default_server() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/flightlog")
}

/// Run the chosen benchmark; `Ok(false)` when a phase had errors or failed a check.
async fn run(cli: Cli, speed: machine::MachineSpeed) -> anyhow::Result<bool> {
    let options = ServerOptions {
        binary: cli.common.server.clone().unwrap_or_else(default_server),
        tmp_parent: cli.common.tmp_dir.clone(),
        extra_args: cli.common.server_args.clone(),
    };
    let time_limit = Duration::from_secs(cli.common.phase_timeout.max(1));
    let load_before = load_average();
    say_err!("flightlog-loadgen: {}", speed.describe());
    let mut server = ServerProcess::spawn(&options).await?;
    let base = Url::parse(&server.base_url()).context("the server's address is not a URL")?;
    say_err!(
        "flightlog-loadgen: server pid {} at {base} (binary {}), load average {load_before}",
        server.pid(),
        options.binary.display()
    );
    let idle_rss = {
        tokio::time::sleep(Duration::from_millis(250)).await;
        server.rss().last()
    };

    let (name, phases, targets) = match &cli.command {
        Command::Http(args) => {
            let phases = run_http(&mut server, &base, args, time_limit).await?;
            let targets = http_targets(&phases);
            ("http", phases, targets)
        }
        Command::Otlp(args) => {
            let phases = run_otlp(&mut server, &base, args, time_limit).await?;
            let targets = otlp_targets(&phases);
            ("otlp", phases, targets)
        }
        Command::Machine => return Ok(true),
    };
    let disk = disk_bytes(&server);
    let memory = server.finish();
    let load_after = load_average();

    // The RSS targets use the larger of the sampled peak and the kernel's high-water mark.
    let rss_limit = if name == "http" { 100.0 } else { 150.0 };
    let mut targets = targets;
    targets.push(Target {
        what: "server peak RSS (max of sampled VmRSS and VmHWM)".into(),
        measured: mib(memory.sampled_peak_rss.max(memory.vm_hwm)),
        goal: rss_limit,
        at_least: false,
        unit: "MiB",
    });
    print_table(
        &format!(
            "flightlog-loadgen {name}: {} (load average {load_before} before, {load_after} \
             after; {} cores shared by server and generator)",
            options.binary.display(),
            cores()
        ),
        &phases,
        &targets,
    );
    say!("");
    say!(
        "server memory: idle {:.1} MiB, sampled peak {:.1} MiB ({} samples), VmHWM {:.1} MiB; \
         database + WAL at the end {:.1} MiB",
        mib(idle_rss),
        mib(memory.sampled_peak_rss),
        memory.samples,
        mib(memory.vm_hwm),
        disk as f64 / 1e6 / 1.048_576
    );
    say!("{}", speed.describe());
    let ok = phases
        .iter()
        .all(|phase| phase.errors.count == 0 && phase.violations == 0);
    say!(
        "{}",
        summary_json(
            name,
            &options,
            &phases,
            &targets,
            memory,
            idle_rss,
            ok,
            [&load_before, &load_after],
            speed,
            cli.common.generator_threads,
        )
    );
    Ok(ok)
}

async fn run_http(
    server: &mut ServerProcess,
    base: &Url,
    args: &HttpArgs,
    time_limit: Duration,
) -> anyhow::Result<Vec<PhaseReport>> {
    let wants = |phase| args.phases.contains(&phase);
    let mut phases = Vec::new();
    if args.warmup_runs > 0 {
        say_err!(
            "flightlog-loadgen: warm-up ({} runs, not measured) ...",
            args.warmup_runs
        );
        let shape = BatchShape {
            name: "warm-up".to_owned(),
            phase: PHASE_WARMUP,
            runs: args.warmup_runs,
            runs_per_request: 1,
            clients: args.clients.clamp(1, 8),
            rollups: true,
        };
        batch_phase(server, base, &shape, time_limit).await?;
        // The dictionary is trained on a thread of its own once the samples are in; give it
        // and the checkpointer time to finish before the clock of the first phase starts.
        tokio::time::sleep(Duration::from_secs(1)).await;
        server.check_alive()?;
    }
    if wants(HttpPhase::Single) {
        say_err!("flightlog-loadgen: single-op phase ...");
        phases.push(
            single_op_phase(
                server,
                base,
                args.runs.max(1),
                args.clients.max(1),
                time_limit,
            )
            .await?,
        );
        server.check_alive()?;
    }
    let batch_runs = args.batch_runs.unwrap_or(args.runs).max(1);
    let batch_clients = args.batch_clients.unwrap_or(args.clients).max(1);
    for (phase, tag, runs_per_request) in [
        (HttpPhase::Batch, PHASE_BATCH, 1),
        (HttpPhase::BigBatch, PHASE_BIG_BATCH, args.big_batch),
    ] {
        if !wants(phase) {
            continue;
        }
        let shape = BatchShape {
            name: format!("batch-{}ops", runs_per_request * workload::CHANGES_PER_RUN),
            phase: tag,
            runs: batch_runs,
            runs_per_request,
            clients: batch_clients,
            rollups: !args.no_batch_rollup,
        };
        say_err!("flightlog-loadgen: {} phase ...", shape.name);
        phases.push(batch_phase(server, base, &shape, time_limit).await?);
        server.check_alive()?;
    }
    if wants(HttpPhase::Stream) {
        say_err!("flightlog-loadgen: stream-latency phase ...");
        let shape = StreamShape {
            rate: args.stream_rate.max(1.0),
            seconds: args.stream_seconds.max(0.1),
            writers: args.stream_writers.max(1),
            grace: Duration::from_millis(args.stream_grace_ms),
            crowd: args.stream_crowd,
        };
        if args.stream_baseline {
            say_err!("flightlog-loadgen: paced-no-stream phase ...");
            phases.push(paced_baseline_phase(server, &shape, time_limit).await?);
            server.check_alive()?;
        }
        phases.push(stream_phase(server, base, &shape, time_limit).await?);
        server.check_alive()?;
    }
    Ok(phases)
}

async fn run_otlp(
    server: &mut ServerProcess,
    base: &Url,
    args: &OtlpArgs,
    time_limit: Duration,
) -> anyhow::Result<Vec<PhaseReport>> {
    say_err!("flightlog-loadgen: encoding OTLP bodies, then the otlp phase ...");
    let shape = OtlpShape {
        spans: args.spans.max(1),
        spans_per_body: args.spans_per_body,
        connections: args.connections.max(1),
        verify_sample: args.verify_sample,
        wait: Duration::from_secs(args.wait_seconds),
        gzip: args.gzip,
        json: args.json,
    };
    let report = otlp_phase(server, base, &shape, time_limit).await?;
    server.check_alive()?;
    Ok(vec![report])
}

fn http_targets(phases: &[PhaseReport]) -> Vec<Target> {
    let mut targets = Vec::new();
    for phase in phases {
        match phase.name.as_str() {
            "single-op" => targets.push(Target {
                what: "single-op writes/s".into(),
                measured: phase.throughput,
                goal: 50_000.0,
                at_least: true,
                unit: "writes/s",
            }),
            "stream-latency" => targets.push(Target {
                what: format!(
                    "stream p99 delivered - acknowledged at {:.0} writes/s",
                    phase.throughput
                ),
                measured: phase.latency.map_or(f64::NAN, |l| l.p99),
                goal: 10.0,
                at_least: false,
                unit: "ms",
            }),
            name if name.starts_with("batch-") => targets.push(Target {
                what: format!("{name} batch ops/s"),
                measured: phase.throughput,
                goal: 150_000.0,
                at_least: true,
                unit: "ops/s",
            }),
            _ => {}
        }
    }
    targets
}

fn otlp_targets(phases: &[PhaseReport]) -> Vec<Target> {
    phases
        .iter()
        .map(|phase| Target {
            what: "OTLP spans/s end to end".into(),
            measured: phase.throughput,
            goal: 100_000.0,
            at_least: true,
            unit: "spans/s",
        })
        .collect()
}

fn disk_bytes(server: &ServerProcess) -> u64 {
    let db = server.db_path();
    let size = |path: PathBuf| std::fs::metadata(path).map_or(0, |m| m.len());
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    size(db.to_path_buf()) + size(PathBuf::from(wal))
}

/// Write one line of the report. A closed stream (`flightlog-loadgen machine | head -1`) made
/// `println!` panic at the next line; here the line is dropped instead, as there is no one left
/// to read it.
fn write_line(out: &mut impl std::io::Write, line: std::fmt::Arguments<'_>) {
    let _ = writeln!(out, "{line}");
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, usize::from)
}

#[allow(clippy::too_many_arguments)]
fn summary_json(
    name: &str,
    options: &ServerOptions,
    phases: &[PhaseReport],
    targets: &[Target],
    memory: MemoryReport,
    idle_rss: u64,
    ok: bool,
    load: [&str; 2],
    speed: machine::MachineSpeed,
    generator_threads: u16,
) -> Value {
    let mut by_name = Map::new();
    for phase in phases {
        by_name.insert(phase.name.clone(), phase.to_json());
    }
    json!({
        "loadgen": name,
        "server": options.binary.display().to_string(),
        "serverArgs": options.extra_args,
        "cores": cores(),
        "generatorThreads": generator_threads,
        "loadAverage": {"before": load[0], "after": load[1]},
        "machine": speed.to_json(),
        "phases": by_name,
        "rss": {
            "idleMiB": stats::round3(mib(idle_rss)),
            "sampledPeakMiB": stats::round3(mib(memory.sampled_peak_rss)),
            "vmHwmMiB": stats::round3(mib(memory.vm_hwm)),
            "samples": memory.samples,
        },
        "targets": targets.iter().map(Target::to_json).collect::<Vec<_>>(),
        "ok": ok,
    })
}
