//! `flightlog serve`: resolve the settings (flags, `FLIGHTLOG_*` variables, config file), refuse
//! an unauthenticated non-loopback address, open the database, close what this instance's
//! previous lives left open, and serve the HTTP API (and the OTLP/gRPC listener) until Ctrl-C.
//!
//! The server's writer identity is `serve:<instance>/pid:<pid>:<start-ms>`: writes that name no
//! `Flightlog-Writer` are stamped with it. At boot the spans still open under an earlier
//! identity of the same instance are closed as interrupted ("server restarted"); spans of any
//! other writer (a client naming itself, another instance on the same file, OTLP) are never
//! touched by that sweep and end by their writer or by `sweep-stale`.
//!
//! Boot order matters. Everything that can refuse the start (settings, addresses, binding the
//! listeners, another live server of the same instance on the database: `Backend`'s claim) comes
//! before the database is opened, so a refused start changes nothing stored.
//! The sweep then runs before the first request is served (connections wait in the listener's
//! backlog meanwhile).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use flightlog_core::{default_writer_id, Clock, ManualClock, SystemClock};
use flightlog_server::maintenance::{maintenance_writer, Maintenance};
use flightlog_server::settings::{self, is_loopback, ServeFlags};
use flightlog_server::AppState;

use crate::backend::{Backend, StoppedWhileStarting};

/// Where the listening address can be set, for error messages.
const ADDR_SOURCES: &str = "--addr, FLIGHTLOG_ADDR or `addr` in the config file";
/// Where the OTLP/gRPC address can be set, for error messages.
const GRPC_ADDR_SOURCES: &str =
    "--grpc-addr, FLIGHTLOG_GRPC_ADDR or `grpc_addr` in the config file";

/// Run the server until Ctrl-C, then shut down gracefully. `flags` are the command line's
/// settings; the rest come from `FLIGHTLOG_*` variables and the config file.
pub async fn run(flags: &ServeFlags) -> anyhow::Result<()> {
    // Listen for Ctrl-C and SIGTERM from the start: a signal during start-up (opening the
    // database, the boot sweep) then stops the server as soon as it is up, through the same
    // clean stop, instead of killing the process mid-sweep with its WAL left behind. One during
    // a wait of the start (for another server of the instance to stop, for another process's
    // lock on the file) ends the start there, a clean stop too (see `Backend::claim_and_open`).
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        say!(
            "flightlog: shutting down (finishing requests in flight; a second Ctrl-C or SIGTERM \
             stops at once)"
        );
        stop.send_replace(true);
        // A second signal stops the process now, as an operator who sent it expects: the first
        // one's handlers stay installed, so it did nothing while the shutdown waited for
        // requests in flight (up to 5 s) or for another process's write lock. Every
        // acknowledged write is committed (in the file or its WAL, which the next start reads);
        // a write in flight is rolled back and its client gets no answer.
        stop_signal().await;
        say_err!(
            "flightlog: a second stop signal: stopping at once, without waiting for the requests \
             in flight (every acknowledged write is kept: the next start reads it)"
        );
        std::process::exit(1);
    });
    survive_file_size_limit();
    // Everything is checked before the database is opened: a typo costs nothing.
    let environment = flightlog_environment()?;
    let settings = resolve_checked(flags, &environment)?;
    raise_open_file_limit(settings.server.max_connections);
    refuse_tokens_meant_but_misnamed(&environment.meant_as_tokens, &settings.server.auth)?;
    refuse_settings_meant_but_shortened(&environment.meant_with_more_words)?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(settings.addr.as_str())
        .await
        .with_context(|| {
            format!(
                "cannot resolve {}, the address to listen on ({ADDR_SOURCES}): give HOST:PORT \
                 with an IP address, such as 127.0.0.1:4318, or a host name this machine \
                 resolves",
                settings.addr
            )
        })?
        .collect();
    settings::check_exposure(
        &addrs,
        &settings.server.auth,
        settings.allow_unauthenticated_non_loopback,
    )?;
    let grpc_addrs: Option<Vec<SocketAddr>> = match &settings.grpc_addr {
        None => None,
        Some(grpc_addr) => {
            let grpc_addrs: Vec<SocketAddr> = tokio::net::lookup_host(grpc_addr.as_str())
                .await
                .with_context(|| {
                    format!(
                        "cannot resolve {grpc_addr}, the OTLP/gRPC address \
                         ({GRPC_ADDR_SOURCES}): give HOST:PORT with an IP address, such as \
                         127.0.0.1:4317, a host name this machine resolves, or `off`"
                    )
                })?
                .collect();
            // Said which listener: the refusal names only the address (an audit's finding).
            settings::check_exposure(
                &grpc_addrs,
                &settings.server.auth,
                settings.allow_unauthenticated_non_loopback,
            )
            .with_context(|| {
                format!("the OTLP/gRPC listener at {grpc_addr} ({GRPC_ADDR_SOURCES})")
            })?;
            // Bound second, the gRPC listener failed on its own server's HTTP port with "address
            // in use", and nothing held the port once the server had exited (an audit's
            // finding).
            if let Some(shared) = shared_listening_port(&addrs, &grpc_addrs) {
                anyhow::bail!(
                    "the OTLP/gRPC address {grpc_addr} ({GRPC_ADDR_SOURCES}) and the HTTP \
                     address {} ({ADDR_SOURCES}) both take port {shared}: the two listeners \
                     need different ports (OTLP's are 4318 for HTTP and 4317 for gRPC), or \
                     give `off` to serve no gRPC listener",
                    settings.addr
                );
            }
            Some(grpc_addrs)
        }
    };

    // Bound before the database is opened (see the module doc); nothing is served until the
    // boot sweep is done.
    let listener = tokio::net::TcpListener::bind(addrs.as_slice())
        .await
        .map_err(|err| {
            let fix = bind_fix(&err);
            anyhow::Error::new(err).context(format!(
                "cannot listen on {} ({ADDR_SOURCES}): {fix}",
                settings.addr
            ))
        })?;
    let local = listener
        .local_addr()
        .context("cannot read the listening address")?;
    let grpc_listener = match (&grpc_addrs, &settings.grpc_addr) {
        (Some(grpc_addrs), Some(grpc_addr)) => Some(
            tokio::net::TcpListener::bind(grpc_addrs.as_slice())
                .await
                .map_err(|err| {
                    let fix = bind_fix(&err);
                    anyhow::Error::new(err).context(format!(
                        "cannot listen on {grpc_addr} for OTLP/gRPC ({GRPC_ADDR_SOURCES}): \
                         {fix}, or `off` to serve no gRPC listener"
                    ))
                })?,
        ),
        _ => None,
    };

    let instance = match &settings.instance {
        Some(instance) => instance.clone(),
        None => {
            if settings.addr.ends_with(":0") {
                say_err!(
                    "flightlog: warning: the port is chosen at each start (port 0), and with it \
                     the default instance name (host and port), so a later start will not \
                     close the spans this one leaves open if it crashes; give a fixed name \
                     with --instance (FLIGHTLOG_INSTANCE, `instance` in the config file)"
                );
            }
            settings::default_instance(&host_name(), local.port())
        }
    };
    // Claimed before the database is opened, and held until the server exits: a second live
    // server of this instance on this database would otherwise close this one's live spans at
    // its boot (see `backend`).
    let stop_requested = || *stopped.borrow();
    let backend = match Backend::claim_and_open(&settings, &instance, &stop_requested) {
        Ok(backend) => backend,
        // A stop during the start's wait is a clean stop (exit 0, as for a stop while serving):
        // nothing was opened, so nothing is left to close.
        Err(err) => match err
            .chain()
            .find_map(|cause| cause.downcast_ref::<StoppedWhileStarting>())
        {
            Some(stopped) => {
                say!("flightlog: {stopped}");
                return Ok(());
            }
            None => return Err(err),
        },
    };
    let manual_clock = settings.manual_clock.then(|| Arc::new(ManualClock::new(0)));
    let clock: Arc<dyn Clock> = match &manual_clock {
        Some(clock) => clock.clone(),
        None => Arc::new(SystemClock),
    };
    // The identity names the instance, then comes from the wall clock even under
    // --manual-clock, so two boots of the same pid (a container's pid 1) never share one.
    let life_prefix = settings::instance_life_prefix(&instance);
    let writer = format!("{life_prefix}{}", default_writer_id(&SystemClock));
    let activity = backend.activity(Arc::clone(&clock), &writer);
    let journal = backend.journal(settings.retention, Arc::clone(&clock));

    // A sweep that cannot write (a full disk) must not keep the recorder from serving what it
    // holds: it starts anyway, and the spans stay open until a later boot's sweep, or
    // `sweep-stale` from another writer, closes them.
    match activity.sweep_previous_lives(&life_prefix).await {
        Ok(0) => {}
        Ok(orphans) => {
            say!(
                "flightlog: closed {orphans} span(s) an earlier server process of instance \
                 {instance} left open, as interrupted (\"server restarted\")"
            )
        }
        // A damaged file fails every later request too: refuse to serve it, and say so.
        Err(err @ flightlog_core::activity::StoreError::Corrupt(_)) => {
            anyhow::bail!("cannot serve the database {}: {err}", backend.describe())
        }
        Err(err) => say_err!(
            "flightlog: warning: could not close the spans a previous run left open ({err}); \
             serving anyway, they stay open until the next start closes them"
        ),
    }

    let server_config = flightlog_server::ServerConfig {
        grpc_listening_on: grpc_listener
            .as_ref()
            .and_then(|grpc_listener| grpc_listener.local_addr().ok()),
        http_listening_on: listener.local_addr().ok(),
        ..settings.server.clone()
    };
    let mut state = AppState::new(activity, journal)
        .with_config(server_config)
        .with_maintenance_writer(&maintenance_writer(&instance));
    if let Some(clock) = &manual_clock {
        state = state.with_manual_clock(Arc::clone(clock));
    }
    say!(
        "flightlog: listening on http://{local} (database {}, writer {writer}{})",
        backend.describe(),
        if manual_clock.is_some() {
            ", manual clock"
        } else {
            ""
        }
    );
    say!("flightlog: {}", settings.describe_storage());
    let auth = &settings.server.auth;
    if auth.is_enabled() {
        say!(
            "flightlog: bearer tokens required ({} configured); GET /healthz is open",
            auth.token_count()
        );
        let short = auth.short_token_count();
        if short > 0 {
            say_err!(
                "flightlog: warning: {short} token(s) shorter than {} characters, which can be \
                 guessed; use long random secrets (such as `openssl rand -hex 32` makes)",
                flightlog_server::auth::SHORT_TOKEN_BYTES
            );
        }
    } else {
        // Both listeners: the gRPC one on the network while HTTP is on loopback was announced
        // as "any local process" (an audit's finding).
        let grpc_local = grpc_listener
            .as_ref()
            .and_then(|grpc_listener| grpc_listener.local_addr().ok());
        let exposed = beyond_loopback(std::iter::once(local).chain(grpc_local));
        if exposed.is_empty() {
            say!("flightlog: no tokens configured: any local process may read and write (web pages in a browser may not)");
        } else {
            say_err!(
                "flightlog: warning: serving {} WITHOUT authentication \
                 (--allow-unauthenticated-non-loopback)",
                exposed.join(" and ")
            );
        }
    }
    if let Some(path) = &settings.config_file {
        say!("flightlog: settings from {}", path.display());
    }
    backend.warn_of_risks();
    // One signal stops both listeners.
    let wait_for_stop = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };
    // The instance's lock file is looked after while the server runs (see `Backend::keep_claim`).
    if let Some(keep_claim) = backend.keep_claim(&instance) {
        let stopping = wait_for_stop(stopped.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stopping => {}
                () = keep_claim => {}
            }
        });
    }
    // The backend hears of the stop at once (see `Backend::on_stop`).
    tokio::spawn({
        let on_stop = backend.on_stop();
        let stopping = wait_for_stop(stopped.clone());
        async move {
            stopping.await;
            on_stop();
        }
    });
    let grpc = match grpc_listener {
        Some(grpc_listener) => {
            let grpc_local = grpc_listener
                .local_addr()
                .context("cannot read the gRPC listening address")?;
            say!("flightlog: OTLP/gRPC on {grpc_local}; OTLP/HTTP at http://{local}/v1/traces");
            Some(tokio::spawn(flightlog_server::grpc::serve_grpc(
                grpc_listener,
                state.clone(),
                wait_for_stop(stopped.clone()),
            )))
        }
        None => {
            say!("flightlog: OTLP/HTTP at http://{local}/v1/traces (OTLP/gRPC off)");
            None
        }
    };
    let maintenance = match settings.maintenance.plan(manual_clock.is_some()) {
        Some(plan) => {
            say!(
                "flightlog: {}",
                plan.describe(settings.retention.max_age_ms)
            );
            let maintenance = Maintenance::new(
                &state,
                &maintenance_writer(&instance),
                Arc::clone(&clock),
                plan,
            );
            Some(tokio::spawn(
                maintenance.run(wait_for_stop(stopped.clone())),
            ))
        }
        None => {
            say!(
                "flightlog: no scheduled maintenance{}",
                if manual_clock.is_some() && settings.maintenance.every.is_none() {
                    " (the manual clock's default; --maintenance-every-ms starts it)"
                } else {
                    " (set `off` by --maintenance-every-ms, FLIGHTLOG_MAINTENANCE_EVERY_MS or \
                     the config file's maintenance.every_ms)"
                }
            );
            None
        }
    };
    let writes = state.clone();
    flightlog_server::serve(listener, state, wait_for_stop(stopped)).await?;
    if let Some(grpc) = grpc {
        grpc.await.context("the gRPC listener's task failed")??;
    }
    // Writes whose clients went away run on after their connections closed: the store closes
    // once they are done.
    let running = writes
        .writes_finished(flightlog_server::SHUTDOWN_GRACE)
        .await;
    if running > 0 {
        say_err!(
            "flightlog: warning: {running} write(s) whose clients went away were still running \
             after {} s; the store closes without them (nothing of them is half-written)",
            flightlog_server::SHUTDOWN_GRACE.as_secs()
        );
    }
    // A pass under way ends at its current store call; the database closes after it.
    if let Some(maintenance) = maintenance {
        // A failed task must not keep the database from closing cleanly.
        if let Err(err) = maintenance.await {
            say_err!("flightlog: warning: the scheduled maintenance's task failed: {err}");
        }
    }
    // The writes still queued are done, then the file is left complete on its own.
    let closed = backend.close().await;
    say!("flightlog: stopped");
    closed
}

/// The settings `flags`, the process's `FLIGHTLOG_*` variables and the config file say, as
/// `serve` resolves them (for `flightlog demo`, which records into the file `serve` would open).
pub(crate) fn resolve_settings(flags: &ServeFlags) -> anyhow::Result<settings::ServeSettings> {
    let environment = flightlog_environment()?;
    resolve_checked(flags, &environment)
}

/// [`settings::resolve`] with the checks of the config file's naming first (see
/// [`refuse_padded_config_path`], [`refuse_config_meant_but_misnamed`]), and a config file's
/// syntax error told without the file's text (see [`syntax_error_without_source`]).
fn resolve_checked(
    flags: &ServeFlags,
    environment: &FlightlogEnvironment,
) -> anyhow::Result<settings::ServeSettings> {
    refuse_padded_config_path(flags, &environment.settings)?;
    refuse_config_meant_but_misnamed(&environment.meant_as_config, flags, &environment.settings)?;
    settings::resolve(flags, &environment.settings).map_err(|err| match err {
        settings::SettingsError::ConfigSyntax { path, message } => {
            settings::SettingsError::ConfigSyntax {
                path,
                message: syntax_error_without_source(&message),
            }
            .into()
        }
        other => other.into(),
    })
}

/// The TOML parser's message without the excerpt of the file it quotes: the line it points at
/// may be a token's (`token = "SECRET` with its closing quote missing was printed whole, where
/// every other settings error keeps tokens out: an audit's finding). The position (`at line 2,
/// column 9`) and what is wrong are kept; they are enough to find the mistake in the file. A
/// message in a form this does not know is not shown at all, since which of its lines quote
/// the file cannot be told.
fn syntax_error_without_source(message: &str) -> String {
    /// How the parser's message begins (the `toml` crate's `TOML parse error at line L, column
    /// C`, then the excerpt, then what is wrong).
    const HEADER: &str = "TOML parse error ";
    /// An excerpt's line: `  |`, `2 | token = …`, `  |         ^`.
    fn quotes_the_file(line: &str) -> bool {
        line.trim_start()
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start()
            .starts_with('|')
    }
    let mut lines = message.lines();
    let Some(position) = lines
        .next()
        .and_then(|first| first.trim().strip_prefix(HEADER))
    else {
        return "the parser's message is left out, since it may quote the file (tokens \
                included): check the file with a TOML checker"
            .to_owned();
    };
    let what: Vec<&str> = lines
        .filter(|line| !quotes_the_file(line))
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect();
    if what.is_empty() {
        position.to_owned()
    } else {
        format!("{position}: {}", what.join("; "))
    }
}

/// A config file named with white space at the start or end of its name
/// (`FLIGHTLOG_CONFIG="c/3.toml "` from an env file that keeps trailing spaces, as Docker's
/// `--env-file` does): refused as `FLIGHTLOG_DB` is, naming the fix, where it was "cannot read
/// the config file c/3.toml  … No such file" with the space invisible (an audit's finding).
/// Both names are checked, the variable's too when the flag overrides it, as the settings read
/// both files.
fn refuse_padded_config_path(
    flags: &ServeFlags,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let from_flag = flags.config.as_ref().map(|path| {
        (
            path.as_os_str().to_string_lossy().into_owned(),
            settings::CONFIG_FLAG,
        )
    });
    let from_env = env
        .get(settings::CONFIG_ENV)
        .map(|text| (text.clone(), settings::CONFIG_ENV));
    for (text, origin) in from_flag.into_iter().chain(from_env) {
        // A blank one is no name (the variable counts as unset; the flag's is refused by the
        // settings as a file that cannot be read).
        if !text.trim().is_empty() && text.trim() != text {
            anyhow::bail!(
                "{origin} = {text:?} is not valid: remove the white space at its start or end \
                 (an env file may keep trailing spaces); flightlog does not take a config file \
                 whose name begins or ends with white space"
            );
        }
    }
    Ok(())
}

/// A variable that looks like the config file's (`FLIGHTLOG_CONFIG_FILE`, `FLIGHTLOG_CONF`)
/// when no config file is named (`--config`, `FLIGHTLOG_CONFIG`): the operator meant the
/// server to read that file, and starting without it would start without its settings, its
/// tokens above all, so open to every local process (an audit started one so; the warning
/// scrolled past). The start is refused, as for a misnamed token variable (see
/// [`refuse_tokens_meant_but_misnamed`]). With a config file named, the warning alone is given.
fn refuse_config_meant_but_misnamed(
    meant_as_config: &[String],
    flags: &ServeFlags,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    if meant_as_config.is_empty() || settings::config_path(flags, env).is_some() {
        return Ok(());
    }
    let (names, looks, it) = match meant_as_config {
        [one] => (one.clone(), "looks like the variable", "it"),
        many => (many.join(", "), "look like the variable", "them"),
    };
    anyhow::bail!(
        "{names} {looks} naming the config file, but the config file is named by {config} \
         (or --config), and none is named: rather than start without that file's settings \
         (its tokens above all: without them the server would serve without authentication), \
         flightlog does not start. Rename {it} to {config} to read that file, or unset {it} to \
         start without a config file",
        config = settings::CONFIG_ENV
    )
}

/// The `FLIGHTLOG_*` variables of the process, as `serve` reads them.
struct FlightlogEnvironment {
    /// The setting variables (the resolver takes the environment as a map, so its tests never
    /// touch the process's).
    settings: BTreeMap<String, String>,
    /// Variables that are no setting but look like the token list (`FLIGHTLOG_TOKEN`,
    /// `FLIGHTLOG_API_KEY`): see [`refuse_tokens_meant_but_misnamed`].
    meant_as_tokens: Vec<String>,
    /// Variables that are a setting's name short of its last words (`FLIGHTLOG_PRUNE_AFTER`),
    /// with that setting: see [`refuse_settings_meant_but_shortened`].
    meant_with_more_words: Vec<(String, &'static str)>,
    /// Variables that are no setting but look like the config file's (`FLIGHTLOG_CONFIG_FILE`,
    /// `FLIGHTLOG_CONF`), and name something (not blank): see
    /// [`refuse_config_meant_but_misnamed`].
    meant_as_config: Vec<String>,
}

/// The process's `FLIGHTLOG_*` variables. A setting whose value is not UTF-8 is an error naming
/// the variable, rather than being skipped silently; a name close to a setting's
/// (`FLIGHTLOG_ADR`) gets a warning naming the setting (and one that looks like the token list
/// or the config file's variable, or is a setting's name short of its last words, is kept to
/// stop the start: see [`refuse_tokens_meant_but_misnamed`],
/// [`refuse_config_meant_but_misnamed`], [`refuse_settings_meant_but_shortened`]); other
/// variables are not ours to judge.
fn flightlog_environment() -> anyhow::Result<FlightlogEnvironment> {
    let mut environment = FlightlogEnvironment {
        settings: BTreeMap::new(),
        meant_as_tokens: Vec::new(),
        meant_with_more_words: Vec::new(),
        meant_as_config: Vec::new(),
    };
    for (name, value) in std::env::vars_os() {
        // `FLIGHTLOG*` and `FLIGHT_LOG*`: a misspelt prefix deserves the warning as much.
        let Some(name) = name.to_str().filter(|n| {
            let upper = n.to_ascii_uppercase();
            upper.starts_with("FLIGHTLOG") || upper.starts_with("FLIGHT_LOG")
        }) else {
            continue;
        };
        if !settings::is_setting_variable(name) {
            let meant = settings::meant_variable(name).or_else(|| {
                // The settings' guess is by edits and words (`FLIGHTLOG_CONF`,
                // `FLIGHTLOG_CONFIG_FILE`); any name that begins with the config file's
                // variable (`FLIGHTLOG_CONFIGFILE`, `FLIGHTLOG_CONFIGURATION`) means it too.
                name.to_ascii_uppercase()
                    .starts_with(settings::CONFIG_ENV)
                    .then_some(settings::CONFIG_ENV)
            });
            if let Some(meant) = meant {
                say_err!(
                    "flightlog: warning: {name} is not a setting and is ignored; did you mean \
                     {meant}? (flightlog serve --help lists them)"
                );
                if meant == settings::TOKENS.env {
                    environment.meant_as_tokens.push(name.to_owned());
                } else if meant == settings::CONFIG_ENV {
                    // Blank, it names no file: as a blank `FLIGHTLOG_CONFIG` is unset.
                    if !value.to_string_lossy().trim().is_empty() {
                        environment.meant_as_config.push(name.to_owned());
                    }
                } else if settings::setting_with_more_words(name).is_some() {
                    environment
                        .meant_with_more_words
                        .push((name.to_owned(), meant));
                }
            } else if let several @ [_, _, ..] = settings::settings_with_more_words(name).as_slice()
            {
                // Short of words two settings share (`FLIGHTLOG_JOURNAL_MAX`): no one setting
                // to name, but not ignored without a word (an audit's finding).
                say_err!(
                    "flightlog: warning: {name} is not a setting and is ignored; did you mean \
                     one of {}? (flightlog serve --help lists them)",
                    several.join(", ")
                );
            }
            continue;
        }
        let value = value.into_string().map_err(|_| {
            anyhow::anyhow!(
                "the environment variable {name} is not valid UTF-8 text: set it to plain text, \
                 or unset it"
            )
        })?;
        environment.settings.insert(name.to_owned(), value);
    }
    Ok(environment)
}

/// A variable that looks like the token list (`FLIGHTLOG_TOKEN=secret`) on a server that has
/// no token from anywhere else: the operator meant to require a token, and starting would
/// serve without authentication (an audit started one so; the warning scrolled past). The
/// server refuses to start, saying how to require the token or to run without one. With a
/// token configured the server is not open, so the warning alone is given.
fn refuse_tokens_meant_but_misnamed(
    meant_as_tokens: &[String],
    auth: &flightlog_server::AuthConfig,
) -> anyhow::Result<()> {
    if meant_as_tokens.is_empty() || auth.is_enabled() {
        return Ok(());
    }
    let (names, looks, it) = match meant_as_tokens {
        [one] => (one.clone(), "looks like a token", "it"),
        many => (many.join(", "), "look like tokens", "them"),
    };
    anyhow::bail!(
        "{names} {looks} for this server, but the tokens are read from {tokens} (or --token, or \
         the config file), and none is configured: rather than serve without authentication, \
         flightlog does not start. Rename {it} to {tokens}, each token followed by its scopes \
         ({tokens}=SECRET:read,ingest,admin for one with every scope; entries apart by `;`), to \
         require that token, or unset {it} to serve without tokens",
        tokens = settings::TOKENS.env
    )
}

/// A variable that is a setting's name short of its last words (`FLIGHTLOG_PRUNE_AFTER=off`
/// for `FLIGHTLOG_PRUNE_AFTER_MS`): the operator set that setting, and starting without it
/// would do what they set it against (delete the detail of runs ended 30 days ago; an audit
/// found it started so, with no word). The server refuses to start, naming the setting.
fn refuse_settings_meant_but_shortened(meant: &[(String, &'static str)]) -> anyhow::Result<()> {
    let Some((name, setting)) = meant.first() else {
        return Ok(());
    };
    let others = if meant.len() > 1 {
        format!(
            " (and {})",
            meant[1..]
                .iter()
                .map(|(name, setting)| format!("{name} for {setting}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        String::new()
    };
    anyhow::bail!(
        "{name} is not a setting: {setting} is{others}. Rather than start without what it says, \
         flightlog does not start: rename it to {setting} (flightlog serve --help says what it \
         takes), or unset it"
    )
}

/// What to do when a listener cannot be bound: a port below 1024 needs privileges (the error
/// is "permission denied", though the port may well be free); an address that is not this
/// machine's cannot be bound whatever the port; otherwise the port is taken.
/// The listening addresses other machines can reach, as text.
fn beyond_loopback(listening: impl Iterator<Item = SocketAddr>) -> Vec<String> {
    listening
        .filter(|addr| !is_loopback(addr))
        .map(|addr| addr.to_string())
        .collect()
}

/// The port two address lists both listen on (a port 0 is chosen apart and never shared): the
/// same port on the same address, or on any address where one of them is the unspecified one.
fn shared_listening_port(first: &[SocketAddr], second: &[SocketAddr]) -> Option<u16> {
    first.iter().find_map(|a| {
        second
            .iter()
            .any(|b| {
                a.port() != 0
                    && a.port() == b.port()
                    && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
            })
            .then_some(a.port())
    })
}

fn bind_fix(err: &std::io::Error) -> &'static str {
    match err.kind() {
        std::io::ErrorKind::PermissionDenied => {
            "ports below 1024 need privileges (root, or the CAP_NET_BIND_SERVICE capability); \
             choose a port of 1024 or above"
        }
        // EADDRNOTAVAIL: the port may well be free; the host part is not this machine's.
        std::io::ErrorKind::AddrNotAvailable => {
            "the address is not one of this machine's: use 127.0.0.1 (this machine only), \
             0.0.0.0 or [::] (every interface), or an address `ip addr` lists"
        }
        _ => "choose a free port, or port 0 for any free one",
    }
}

/// This machine's host name, for the default instance name (empty when it cannot be read).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

/// A file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`) sends SIGXFSZ to a process whose
/// write goes past it, and that signal's default action kills the process: the server died
/// mid-request, without a word, where a full disk gets every write answered 503 and keeps
/// serving reads. With a handler installed the write fails with `EFBIG` instead, which the store
/// reports as a full disk. (tokio's handler only records the signal; the task drains it.)
fn survive_file_size_limit() {
    #[cfg(target_os = "linux")]
    {
        use tokio::signal::unix::{signal, SignalKind};
        /// SIGXFSZ on Linux.
        const SIGXFSZ: i32 = 25;
        match signal(SignalKind::from_raw(SIGXFSZ)) {
            Ok(mut file_size) => {
                tokio::spawn(async move { while file_size.recv().await.is_some() {} });
            }
            Err(err) => say_err!(
                "flightlog: warning: cannot handle SIGXFSZ ({err}); a file-size limit would \
                 stop the server"
            ),
        }
    }
}

/// Every connection (an idle keep-alive one, a live stream) holds a file descriptor, and the
/// soft limit most shells and service managers start a process with is 1,024: about a thousand
/// idle connections then kept every new client out until the 30 s head timeout closed them (a
/// reliability audit), while the hard limit allowed far more. The soft limit is raised to the
/// hard one, as Go's runtime does for every program; a hard limit still below what
/// `--max-connections` allows is worth a warning (connections past it cannot be accepted; idle
/// ones are then closed to make room, see `connection_limit`).
fn raise_open_file_limit(max_connections: usize) {
    /// Descriptors the server holds besides its connections: the database's files for its
    /// writer and readers, the listeners, the runtime's own.
    const RESERVE: u64 = 64;
    let wanted = u64::try_from(max_connections)
        .unwrap_or(u64::MAX)
        .saturating_add(RESERVE);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < wanted => say_err!(
            "flightlog: warning: this process may open at most {limit} files, fewer than \
             --max-connections ({max_connections}) needs (one a connection, and about \
             {RESERVE} of its own); raise the limit (`ulimit -n`, systemd's LimitNOFILE=) or \
             lower --max-connections"
        ),
        Ok(_) => {}
        Err(err) => say_err!("flightlog: warning: cannot raise the open-file limit: {err}"),
    }
}

/// Completes on the next Ctrl-C (SIGINT) or, on Unix, SIGTERM (what a container runtime or
/// service manager sends) or SIGHUP (the terminal it ran in was closed: by default the process
/// would die there and then, its WAL and lock file left behind, with no word; an audit's
/// finding), unless SIGHUP was ignored at the start (`nohup`). A handler that cannot be installed never completes: the server then runs until
/// killed, which is what it would do without one.
async fn stop_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            say_err!("flightlog: cannot listen for Ctrl-C ({err})");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = unix_signal(tokio::signal::unix::SignalKind::terminate(), "SIGTERM");
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    #[cfg(unix)]
    let hang_up = async {
        if hang_up_ignored_at_start() {
            std::future::pending::<()>().await;
        }
        unix_signal(tokio::signal::unix::SignalKind::hangup(), "SIGHUP").await;
    };
    #[cfg(not(unix))]
    let hang_up = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
        () = hang_up => {}
    }
}

/// Whether SIGHUP was ignored when the process started (`nohup flightlog serve`, a service
/// manager's setting): listening for it would undo what whoever started the server asked for,
/// so a hang-up then stops nothing. Read from `/proc/self/status` before the first listener is
/// installed (which clears the ignore) and kept; elsewhere than Linux, taken as not ignored.
#[cfg(unix)]
fn hang_up_ignored_at_start() -> bool {
    static IGNORED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        /// SIGHUP is signal 1: bit 0 of the `SigIgn` mask.
        const SIGHUP_BIT: u64 = 1;
        cfg!(target_os = "linux")
            && std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|status| {
                    status
                        .lines()
                        .find_map(|line| line.strip_prefix("SigIgn:"))
                        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                })
                .is_some_and(|mask| mask & SIGHUP_BIT != 0)
    })
}

/// Completes on the next `kind` signal (never, said on stderr, when it cannot be listened for).
#[cfg(unix)]
async fn unix_signal(kind: tokio::signal::unix::SignalKind, name: &str) {
    match tokio::signal::unix::signal(kind) {
        Ok(mut signal) => {
            signal.recv().await;
        }
        Err(err) => {
            say_err!("flightlog: cannot listen for {name} ({err})");
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `toml` crate's message for a string left open on a token's line: the position and
    /// what is wrong stay, the quoted line (the secret) goes.
    #[test]
    fn a_syntax_error_keeps_its_position_and_loses_the_file_s_text() {
        let message = "TOML parse error at line 2, column 31\n  |\n2 | token = \
                       \"SUPERSECRET-AAAA-1111\n  |                               ^\n\
                       invalid basic string, expected `\"`";
        assert_eq!(
            syntax_error_without_source(message),
            "at line 2, column 31: invalid basic string, expected `\"`"
        );
        // A form it does not know is not shown at all: its lines may quote the file.
        let unknown = syntax_error_without_source("token = \"SUPERSECRET\nbad");
        assert!(!unknown.contains("SUPERSECRET"), "{unknown}");
    }

    #[test]
    fn a_privileged_port_is_not_called_taken() {
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(bind_fix(&denied).contains("below 1024"));
        let taken = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        assert!(bind_fix(&taken).contains("free port"));
        let foreign = std::io::Error::from(std::io::ErrorKind::AddrNotAvailable);
        assert!(bind_fix(&foreign).contains("not one of this machine's"));
    }

    fn addrs(list: &[&str]) -> Vec<SocketAddr> {
        list.iter()
            .map(|addr| addr.parse().expect("an address"))
            .collect()
    }

    #[test]
    fn listeners_sharing_a_port_are_told_apart_from_neighbours() {
        let http = addrs(&["127.0.0.1:4318"]);
        assert_eq!(
            shared_listening_port(&http, &addrs(&["127.0.0.1:4318"])),
            Some(4318)
        );
        assert_eq!(
            shared_listening_port(&http, &addrs(&["0.0.0.0:4318"])),
            Some(4318)
        );
        assert_eq!(
            shared_listening_port(&addrs(&["[::]:4318"]), &http),
            Some(4318)
        );
        assert_eq!(
            shared_listening_port(&http, &addrs(&["127.0.0.1:4317"])),
            None
        );
        assert_eq!(
            shared_listening_port(&http, &addrs(&["127.0.0.2:4318"])),
            None
        );
        // Port 0 is chosen apart for each.
        let any = addrs(&["127.0.0.1:0"]);
        assert_eq!(shared_listening_port(&any, &any), None);
    }

    /// The gRPC listener on the network while HTTP is on loopback is named in the warning
    /// (it was announced as "any local process may read and write").
    #[test]
    fn an_exposed_grpc_listener_is_named_whatever_the_http_one_is() {
        let listening = addrs(&["127.0.0.1:4318", "0.0.0.0:4317"]);
        assert_eq!(beyond_loopback(listening.into_iter()), ["0.0.0.0:4317"]);
        let local = addrs(&["127.0.0.1:4318", "[::1]:4317"]);
        assert!(beyond_loopback(local.into_iter()).is_empty());
    }
}
