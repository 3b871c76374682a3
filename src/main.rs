//! The `flightlog` binary: the command line over the stores.
//!
//! Parsing happens here (clap); each command lives in its own module. Errors are `anyhow` at
//! this edge only, printed with the fix when there is one.

mod demo;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The flight recorder for AI agents.
#[derive(Debug, Parser)]
#[command(name = "flightlog", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Record a simulated multi-agent workload into a database file and show what was recorded.
    Demo {
        /// The SQLite database file (created if missing).
        #[arg(long, env = "FLIGHTLOG_DB", default_value = "flightlog.db")]
        db: PathBuf,
        /// How many agent runs to simulate.
        #[arg(long, default_value_t = 12)]
        runs: usize,
    },
    /// Serve the HTTP API (activity, engagement journal) on a database file until Ctrl-C.
    Serve {
        /// The SQLite database file (created if missing).
        #[arg(long, env = "FLIGHTLOG_DB", default_value = "flightlog.db")]
        db: PathBuf,
        /// The address to listen on, HOST:PORT (port 0 picks a free one).
        #[arg(long, env = "FLIGHTLOG_ADDR", default_value = "127.0.0.1:4318")]
        addr: String,
        /// Testing: the stores read a clock that starts at 0 and moves only through
        /// `PUT /v1/testing/clock` (the route exists only with this flag).
        #[arg(long)]
        manual_clock: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("flightlog: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo { db, runs } => demo::run(&db, runs).await,
            Command::Serve {
                db,
                addr,
                manual_clock,
            } => {
                serve::run(serve::ServeOptions {
                    db: &db,
                    addr: &addr,
                    manual_clock,
                })
                .await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("flightlog: {err:#}");
            ExitCode::FAILURE
        }
    }
}
