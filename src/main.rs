//! The `flightlog` binary: the command line over the stores.
//!
//! Parsing happens here (clap); each command lives in its own module. Errors are `anyhow` at
//! this edge only, printed with the fix when there is one.

/// `println!` that cannot panic: a closed stdout (`flightlog serve | head -1`, a log pipe whose
/// reader died) made `println!` panic at the next line, and the server exited with it.
/// Output is best effort; losing a line to a closed stream is not an error.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

/// `eprintln!` that cannot panic (see [`say!`]).
macro_rules! say_err {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod backend;
mod demo;
mod file_name_lock;
mod foreign_exclusive_lock;
mod instance_lock;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use flightlog_server::settings::ServeFlags;

/// mimalloc instead of the system allocator (see `flightlog-alloc` for why).
#[global_allocator]
static GLOBAL: flightlog_alloc::Mimalloc = flightlog_alloc::Mimalloc;

/// The flight recorder for AI agents.
// No `Debug`: it would print `--token` secrets, and nothing needs it.
#[derive(Parser)]
#[command(name = "flightlog", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record a simulated multi-agent workload into a database file and show what was recorded.
    ///
    /// Its last run stays open, as one whose agent went away does (sweep-stale closes it).
    Demo {
        /// The SQLite database file (created if missing).
        /// [env: FLIGHTLOG_DB] [file: db] [default: flightlog.db]
        #[arg(long, value_name = "PATH", verbatim_doc_comment)]
        db: Option<PathBuf>,
        /// The config file `flightlog serve` reads: the demo records into its `db`, so the
        /// server shows what the demo recorded. The file is checked as `serve` checks it.
        /// [env: FLIGHTLOG_CONFIG]
        #[arg(long, value_name = "PATH", verbatim_doc_comment)]
        config: Option<PathBuf>,
        /// How many finished agent runs to simulate (0 to 100000).
        #[arg(
            long,
            default_value_t = 12,
            allow_negative_numbers = true,
            value_parser = clap::value_parser!(u32).range(0..=100_000)
        )]
        runs: u32,
    },
    /// Serve the HTTP API (activity, journal, OTLP) and OTLP/gRPC on a database file until Ctrl-C.
    Serve(Box<ServeArgs>),
}

/// `flightlog serve`'s flags. Every one is optional: a setting not given here comes from its
/// `FLIGHTLOG_*` variable, then the config file, then its default (resolved, with the error
/// messages, by `flightlog_server::settings`).
#[derive(Args)]
#[command(after_help = flightlog_server::settings::CONFIG_HELP)]
struct ServeArgs {
    /// TOML config file with any of the settings below (format: see the end of this help).
    /// [env: FLIGHTLOG_CONFIG]
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    config: Option<PathBuf>,
    /// SQLite database file, created if missing.
    /// [env: FLIGHTLOG_DB] [file: db] [default: flightlog.db]
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    db: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free one.
    /// [env: FLIGHTLOG_ADDR] [file: addr] [default: 127.0.0.1:4318]
    #[arg(long, value_name = "HOST:PORT", verbatim_doc_comment)]
    addr: Option<String>,
    /// OTLP/gRPC listener (TraceService/Export), or `off`.
    /// [env: FLIGHTLOG_GRPC_ADDR] [file: grpc_addr] [default: 127.0.0.1:4317]
    #[arg(long, value_name = "HOST:PORT|off", verbatim_doc_comment)]
    grpc_addr: Option<String>,
    /// normal: commits survive a crash of the process; full: they also survive power loss
    /// (slower commits).
    /// [env: FLIGHTLOG_DURABILITY] [file: durability] [default: normal]
    #[arg(long, value_name = "normal|full", verbatim_doc_comment)]
    durability: Option<String>,
    /// Largest request body, in whole bytes or KiB/MiB/GiB; larger ones get 413 (a compressed
    /// OTLP body may inflate to 64 MiB, or to this limit when larger); also the largest
    /// OTLP/gRPC message, which may inflate as far (RESOURCE_EXHAUSTED past either). At most
    /// 1GiB.
    /// [env: FLIGHTLOG_BODY_LIMIT] [file: body_limit] [default: 8MiB]
    #[arg(
        long,
        value_name = "SIZE",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    body_limit: Option<String>,
    /// Memory for large answers (over 1 MiB: run snapshots, change pages, listings) until they
    /// are written to the socket, in bytes or with KiB/MiB/GiB (counted in 64 KiB units, at
    /// least one; at most 1024GiB); an answer waits up to 0.5 s for room, then gets 503 with
    /// Retry-After. One larger than this is served alone.
    /// [env: FLIGHTLOG_RESPONSE_BUDGET] [file: response_budget] [default: 256MiB]
    #[arg(
        long,
        value_name = "SIZE",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    response_budget: Option<String>,
    /// Memory for request bodies over 64 KiB from when their first 64 KiB have arrived until
    /// they are answered, in bytes or with KiB/MiB/GiB (counted in 4 KiB units, at least one;
    /// at most 1024GiB); a body that does not fit waits up to 0.5 s for room, then gets 503
    /// with Retry-After (over gRPC, UNAVAILABLE), as does one that holds some while another
    /// waits if it arrives slower than 128 KiB/s. One larger than this is handled alone.
    /// [env: FLIGHTLOG_REQUEST_BUDGET] [file: request_budget] [default: 64MiB]
    #[arg(
        long,
        value_name = "SIZE",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    request_budget: Option<String>,
    /// Write requests handled at once; one more waits up to 100 ms for a slot, then gets 503
    /// with Retry-After (never an unbounded queue). A write takes its slot once its body has
    /// arrived; the first 64 KiB of bodies being read share a budget of 64 KiB per slot, and
    /// one that holds some while another waits gives way (503) if it arrives slower than
    /// 128 KiB/s. From 1 to 1000000.
    /// [env: FLIGHTLOG_MAX_INFLIGHT_WRITES] [file: max_inflight_writes] [default: 4096]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    max_inflight_writes: Option<String>,
    /// Connections open at once, over the HTTP and gRPC listeners together; past it, an idle
    /// connection is closed to make room for a new one (one that never showed a token after
    /// 1 s, one that did after 10 s idle), which waits while every connection is in use (said
    /// on stderr). Bounds the memory connections hold before any request is read (a request
    /// head is at most 32 KiB). Live streams take at most three quarters of it (a stream past
    /// that gets 503 with Retry-After and its connection closed; none at 1), so writes always
    /// find a connection. From 1 to 1000000.
    /// [env: FLIGHTLOG_MAX_CONNECTIONS] [file: max_connections] [default: 4096]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    max_connections: Option<String>,
    /// Events one engagement may hold; appends past it get 409 journal_full (0: every append
    /// does, the journal read-only, as the reference's maxEventsPerEngagement 0).
    /// [env: FLIGHTLOG_JOURNAL_MAX_EVENTS] [file: journal.max_events] [default: 10000]
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    journal_max_events: Option<String>,
    /// Idle time after which an engagement is removed, in ms, or `off` to keep idle engagements:
    /// the scheduled maintenance removes those nothing was appended to for this long (by the
    /// server's clock); POST /v1/engagements/prune those whose last appended event's `at` is
    /// this old (the reference's rule).
    /// [env: FLIGHTLOG_JOURNAL_MAX_AGE_MS] [file: journal.max_age_ms] [default: 2592000000 = 30 days]
    #[arg(
        long,
        value_name = "MS|off",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    journal_max_age_ms: Option<String>,
    /// How long the writer waits, in ms, for the database's write lock while another process
    /// holds it (a long transaction in a `sqlite3` shell, say) before the writes waiting are
    /// answered 503 with Retry-After, nothing written. Writes queued behind one that waits
    /// wait their turn first, so a request may take up to about twice this. Also how long the
    /// start waits for a process that keeps every other from even reading the file (one in
    /// exclusive locking mode) before it refuses to start, naming that process. From 0 to
    /// 600000.
    /// [env: FLIGHTLOG_WRITE_LOCK_WAIT_MS] [file: write_lock_wait_ms] [default: 10000]
    #[arg(
        long,
        value_name = "MS",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    write_lock_wait_ms: Option<String>,
    /// This server's name among the servers sharing the database: at start it closes the
    /// spans its earlier lives under the same name left open (as interrupted, "server
    /// restarted"), and no one else's. Give a fixed one where the default changes from start
    /// to start (a container's host name, --addr with port 0).
    /// [env: FLIGHTLOG_INSTANCE] [file: instance] [default: HOSTNAME:HTTP-PORT]
    #[arg(long, value_name = "NAME", verbatim_doc_comment)]
    instance: Option<String>,
    /// Time between the passes of the scheduled maintenance (the three settings below, and the
    /// removal of engagements idle past --journal-max-age-ms), in ms from 10 to 86400000 (a
    /// day), or `off` for none.
    /// [env: FLIGHTLOG_MAINTENANCE_EVERY_MS] [file: maintenance.every_ms] [default: 60000; off under --manual-clock]
    #[arg(
        long,
        value_name = "MS|off",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    maintenance_every_ms: Option<String>,
    /// Close a run as interrupted ("writer went silent") when its open root has had no
    /// heartbeat (or start) for this long, in ms, or `off`. Writers of long runs heartbeat
    /// their root (POST /v1/activity/spans/{spanId}/heartbeat; writing child spans does not
    /// count); OTLP runs are renewed by every delivery of their spans. Spans left open in a
    /// run whose root ended (or never came) are closed once the run showed no life this long.
    /// Judged only once the server has been up this long.
    /// [env: FLIGHTLOG_STALE_AFTER_MS] [file: maintenance.stale_after_ms] [default: 7200000 = 2 hours]
    #[arg(
        long,
        value_name = "MS|off",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    stale_after_ms: Option<String>,
    /// Count a run as stuck when its root has been open this long, in ms, or `off`: named
    /// once in the output, counted in the flightlog_runs_stuck gauge of /metrics (0 while the
    /// check is off).
    /// [env: FLIGHTLOG_STUCK_AFTER_MS] [file: maintenance.stuck_after_ms] [default: 3600000 = 1 hour]
    #[arg(
        long,
        value_name = "MS|off",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    stuck_after_ms: Option<String>,
    /// Delete the spans, events and change rows of runs that ended this long ago (an
    /// OpenTelemetry run: that also arrived this long ago), in ms, keeping their rollups
    /// (usage, cost, outcome), or `off` to keep all detail (the change log too: its trim of
    /// rows more than 100,000 ids behind the newest is part of the prune).
    /// [env: FLIGHTLOG_PRUNE_AFTER_MS] [file: maintenance.prune_after_ms] [default: 2592000000 = 30 days]
    #[arg(
        long,
        value_name = "MS|off",
        allow_negative_numbers = true,
        verbatim_doc_comment
    )]
    prune_after_ms: Option<String>,
    /// Require `Authorization: Bearer SECRET` (or SECRET as the HTTP Basic password);
    /// repeatable; each grants every scope.
    /// Scoped tokens: FLIGHTLOG_TOKENS or [[tokens]] in the config file (see below).
    // A secret may start with '-' (one random base64url secret in 64 does), so the value is
    // taken as given; the settings refuse one that starts with "--", which is a flag forgotten
    // after `--token`.
    #[arg(
        long = "token",
        value_name = "SECRET",
        allow_hyphen_values = true,
        verbatim_doc_comment
    )]
    tokens: Vec<String>,
    /// Listen on a non-loopback address although no token is configured
    /// (only behind something that authenticates).
    /// `=false` turns off a `true` from the environment or the config file.
    /// [env: FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK] [file: allow_unauthenticated_non_loopback]
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        verbatim_doc_comment
    )]
    allow_unauthenticated_non_loopback: Option<String>,
    /// Testing: the stores read a clock that starts at 0 and moves only through
    /// PUT /v1/testing/clock (a route that exists only with this setting and needs admin).
    /// `=false` turns off a `true` from the environment or the config file.
    /// [env: FLIGHTLOG_MANUAL_CLOCK] [file: manual_clock]
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        verbatim_doc_comment
    )]
    manual_clock: Option<String>,
}

impl ServeArgs {
    fn into_flags(self) -> ServeFlags {
        ServeFlags {
            config: self.config,
            db: self.db,
            addr: self.addr,
            grpc_addr: self.grpc_addr,
            durability: self.durability,
            body_limit: self.body_limit,
            response_budget: self.response_budget,
            request_budget: self.request_budget,
            max_inflight_writes: self.max_inflight_writes,
            max_connections: self.max_connections,
            journal_max_events: self.journal_max_events,
            journal_max_age_ms: self.journal_max_age_ms,
            write_lock_wait_ms: self.write_lock_wait_ms,
            instance: self.instance,
            maintenance_every_ms: self.maintenance_every_ms,
            stale_after_ms: self.stale_after_ms,
            stuck_after_ms: self.stuck_after_ms,
            prune_after_ms: self.prune_after_ms,
            tokens: self.tokens,
            allow_unauthenticated_non_loopback: self.allow_unauthenticated_non_loopback,
            manual_clock: self.manual_clock,
        }
    }
}

/// The demo's database, found as `serve` finds its own: `--db`, else `FLIGHTLOG_DB` unless it
/// is empty, else the config file's `db` (`--config` or `FLIGHTLOG_CONFIG`), else
/// `flightlog.db`. The other settings are checked too (a bad one would stop `serve` on the same
/// file), but the demo uses none of them.
fn demo_db(db: Option<PathBuf>, config: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let flags = ServeFlags {
        db,
        config,
        ..ServeFlags::default()
    };
    let settings = serve::resolve_settings(&flags).context(
        "the demo records into the database `flightlog serve` would open, and so reads serve's \
         settings",
    )?;
    Ok(settings.db)
}

/// The switches that take their value only after `=` (`--manual-clock=false`): given apart
/// (`--manual-clock false`), clap reads the value as a stray argument and says only that.
const EQUALS_ONLY_SWITCHES: [&str; 2] = ["--manual-clock", "--allow-unauthenticated-non-loopback"];

/// Parse the command line; a switch's value given apart from it gets clap's error and how to
/// write it (an audit's finding: the error alone named no fix).
fn parse_command_line() -> Cli {
    let err = match Cli::try_parse() {
        Ok(cli) => return cli,
        Err(err) => err,
    };
    if err.kind() == clap::error::ErrorKind::UnknownArgument {
        let args: Vec<String> = std::env::args().collect();
        let switch = args.windows(2).find_map(|pair| {
            let is_bool = matches!(
                pair[1].to_ascii_lowercase().as_str(),
                "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
            );
            (is_bool && EQUALS_ONLY_SWITCHES.contains(&pair[0].as_str()))
                .then(|| (pair[0].clone(), pair[1].clone()))
        });
        if let Some((switch, value)) = switch {
            eprint!("{err}");
            eprintln!("\nflightlog: {switch} takes its value after `=`: write {switch}={value}");
            std::process::exit(err.exit_code());
        }
    }
    err.exit()
}

fn main() -> ExitCode {
    let cli = parse_command_line();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            say_err!("flightlog: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo { db, config, runs } => match demo_db(db, config) {
                Ok(db) => demo::run(&db, runs as usize).await,
                Err(err) => Err(err),
            },
            Command::Serve(args) => serve::run(&args.into_flags()).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            say_err!("flightlog: {err:#}");
            ExitCode::FAILURE
        }
    }
}
