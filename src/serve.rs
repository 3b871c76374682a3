//! `flightlog serve`: open the database, sweep the orphans a previous life left open, and serve
//! the HTTP API until Ctrl-C.
//!
//! Boot order matters: the orphan sweep runs before the listener is bound, so no client can start
//! a `session` span that the sweep would then wrongly close as "server restarted".

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use flightlog_core::activity::ActivityStore;
use flightlog_core::journal::{EngagementJournal, RetentionConfig};
use flightlog_core::{default_writer_id, Clock, ManualClock, SystemClock};
use flightlog_server::AppState;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};

/// What `flightlog serve` was asked for.
#[derive(Debug)]
pub struct ServeOptions<'a> {
    /// The SQLite file, created when missing.
    pub db: &'a Path,
    /// `HOST:PORT` to listen on.
    pub addr: &'a str,
    /// Give the stores a testing clock at 0 and expose `PUT /v1/testing/clock`.
    pub manual_clock: bool,
}

/// Run the server until Ctrl-C, then shut down gracefully.
pub async fn run(options: ServeOptions<'_>) -> anyhow::Result<()> {
    let db = SqliteDatabase::open(SqliteConfig::new(options.db))
        .with_context(|| format!("cannot open the database {}", options.db.display()))?;
    let manual_clock = options.manual_clock.then(|| Arc::new(ManualClock::new(0)));
    let clock: Arc<dyn Clock> = match &manual_clock {
        Some(clock) => clock.clone(),
        None => Arc::new(SystemClock),
    };
    // The identity comes from the wall clock even under --manual-clock, so two boots of the same
    // pid (a container's pid 1) never share one.
    let writer = default_writer_id(&SystemClock);
    let activity: Arc<dyn ActivityStore> = Arc::new(SqliteActivityStore::with_identity(
        Arc::clone(&db),
        clock,
        &writer,
    ));
    let journal: Arc<dyn EngagementJournal> =
        Arc::new(SqliteEngagementJournal::new(db, RetentionConfig::default()));

    let orphans = activity
        .sweep_own_orphans()
        .await
        .context("the boot sweep of orphaned session spans failed")?;
    if orphans > 0 {
        println!("flightlog: closed {orphans} span(s) left open by a previous run as interrupted");
    }

    let mut state = AppState::new(activity, journal);
    if let Some(clock) = manual_clock {
        state = state.with_manual_clock(clock);
    }
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .with_context(|| format!("cannot listen on {}", options.addr))?;
    let local = listener
        .local_addr()
        .context("cannot read the listening address")?;
    println!(
        "flightlog: listening on http://{local} (database {}, writer {writer}{})",
        options.db.display(),
        if options.manual_clock {
            ", manual clock"
        } else {
            ""
        }
    );
    flightlog_server::serve(listener, state, shutdown_signal()).await?;
    println!("flightlog: stopped");
    Ok(())
}

/// Completes on Ctrl-C (SIGINT) or, on Unix, SIGTERM (what a container runtime or service
/// manager sends). A handler that cannot be installed never completes: the server then runs until
/// killed, which is what it would do without one.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            eprintln!("flightlog: cannot listen for Ctrl-C ({err})");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(err) => {
                eprintln!("flightlog: cannot listen for SIGTERM ({err})");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    println!("flightlog: shutting down (finishing requests in flight)");
}
