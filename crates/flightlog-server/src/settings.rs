//! `flightlog serve`'s settings: command-line flags, `FLIGHTLOG_*` environment variables and an
//! optional TOML config file, resolved into one checked [`ServeSettings`].
//!
//! Two stages, as ripgrep does it: the binary hands over what clap parsed, still as text
//! ([`ServeFlags`]), and the environment as a plain map, so tests pass their own map and never
//! race on the process's environment; [`resolve`] then reads the config file and parses every
//! value. Precedence, per setting: **flag > environment > file > default**. A bad value is a
//! [`SettingsError`] that names the setting as the user wrote it (`--body-limit`,
//! `FLIGHTLOG_BODY_LIMIT`, or `body_limit` in the named file) and says what to write instead.
//!
//! Tokens are a list, and the list follows the same precedence as a whole: the `--token` flags,
//! if any, replace `FLIGHTLOG_TOKENS`, which replaces the file's `[[tokens]]`. Mixing sources
//! would make "which tokens are valid now?" depend on three places at once. An empty
//! environment variable counts as unset, so `FLIGHTLOG_TOKENS=` cannot switch auth off by
//! accident.
//!
//! This module also holds the start-up guard [`check_exposure`]: a server with no token refuses
//! to listen on anything but a loopback address unless that is asked for on purpose.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use flightlog_core::journal::{RetentionConfig, SAFE_INTEGER_LIMIT};
use toml::{Table, Value};

use crate::auth::{AuthConfig, Scope, Scopes, TokenError};
use crate::maintenance::MaintenancePlan;
use crate::state::ServerConfig;

/// One setting's three names: its flag, its environment variable and its config-file key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The command-line flag, `--body-limit`.
    pub flag: &'static str,
    /// The environment variable, `FLIGHTLOG_BODY_LIMIT`.
    pub env: &'static str,
    /// The config-file key, dotted for a nested table (`journal.max_events`).
    pub key: &'static str,
    /// The TOML type the config file must give it.
    pub toml: TomlType,
}

/// The TOML type a setting takes in the config file. Flags and variables are text; the file is
/// typed, and a value of another type is refused rather than read as its text (`db = true`
/// would otherwise name a database file called `true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TomlType {
    /// A string: `db = "agents.db"`.
    String,
    /// An integer: `max_inflight_writes = 4096`.
    Integer,
    /// A string or an integer: `body_limit = "8MiB"` or `body_limit = 8388608`.
    StringOrInteger,
    /// A boolean: `allow_unauthenticated_non_loopback = true`.
    Boolean,
    /// The array of token tables (checked by its own parser).
    Tokens,
}

impl TomlType {
    fn accepts(self, value: &Value) -> bool {
        match self {
            TomlType::String => value.is_str(),
            TomlType::Integer => value.is_integer(),
            TomlType::StringOrInteger => value.is_str() || value.is_integer(),
            TomlType::Boolean => value.is_bool(),
            TomlType::Tokens => true,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            TomlType::String => "a TOML string (in double quotes)",
            TomlType::Integer => "a TOML integer (no quotes, no decimal point)",
            TomlType::StringOrInteger => "a TOML string (in double quotes) or integer",
            TomlType::Boolean => "a TOML boolean (true or false, no quotes)",
            TomlType::Tokens => "an array of token tables",
        }
    }
}

/// The SQLite database file.
pub const DB: Setting = Setting {
    flag: "--db",
    env: "FLIGHTLOG_DB",
    key: "db",
    toml: TomlType::String,
};
/// The listening address.
pub const ADDR: Setting = Setting {
    flag: "--addr",
    env: "FLIGHTLOG_ADDR",
    key: "addr",
    toml: TomlType::String,
};
/// The OTLP/gRPC listening address, or `off`.
pub const GRPC_ADDR: Setting = Setting {
    flag: "--grpc-addr",
    env: "FLIGHTLOG_GRPC_ADDR",
    key: "grpc_addr",
    toml: TomlType::String,
};
/// `normal` or `full`.
pub const DURABILITY: Setting = Setting {
    flag: "--durability",
    env: "FLIGHTLOG_DURABILITY",
    key: "durability",
    toml: TomlType::String,
};
/// The largest request body.
pub const BODY_LIMIT: Setting = Setting {
    flag: "--body-limit",
    env: "FLIGHTLOG_BODY_LIMIT",
    key: "body_limit",
    toml: TomlType::StringOrInteger,
};
/// The memory set aside for large answers (see `response_budget`).
pub const RESPONSE_BUDGET: Setting = Setting {
    flag: "--response-budget",
    env: "FLIGHTLOG_RESPONSE_BUDGET",
    key: "response_budget",
    toml: TomlType::StringOrInteger,
};
/// The memory set aside for request bodies in flight (see `request_budget`).
pub const REQUEST_BUDGET: Setting = Setting {
    flag: "--request-budget",
    env: "FLIGHTLOG_REQUEST_BUDGET",
    key: "request_budget",
    toml: TomlType::StringOrInteger,
};
/// The write limit.
pub const MAX_INFLIGHT_WRITES: Setting = Setting {
    flag: "--max-inflight-writes",
    env: "FLIGHTLOG_MAX_INFLIGHT_WRITES",
    key: "max_inflight_writes",
    toml: TomlType::Integer,
};
/// The connection limit.
pub const MAX_CONNECTIONS: Setting = Setting {
    flag: "--max-connections",
    env: "FLIGHTLOG_MAX_CONNECTIONS",
    key: "max_connections",
    toml: TomlType::Integer,
};
/// The journal's events per engagement.
pub const JOURNAL_MAX_EVENTS: Setting = Setting {
    flag: "--journal-max-events",
    env: "FLIGHTLOG_JOURNAL_MAX_EVENTS",
    key: "journal.max_events",
    toml: TomlType::Integer,
};
/// The journal's retention age.
pub const JOURNAL_MAX_AGE_MS: Setting = Setting {
    flag: "--journal-max-age-ms",
    env: "FLIGHTLOG_JOURNAL_MAX_AGE_MS",
    key: "journal.max_age_ms",
    toml: TomlType::StringOrInteger,
};
/// How long a write waits for a database write lock another process holds.
pub const WRITE_LOCK_WAIT_MS: Setting = Setting {
    flag: "--write-lock-wait-ms",
    env: "FLIGHTLOG_WRITE_LOCK_WAIT_MS",
    key: "write_lock_wait_ms",
    toml: TomlType::Integer,
};
/// The server instance's name (see [`parse_instance`]).
pub const INSTANCE: Setting = Setting {
    flag: "--instance",
    env: "FLIGHTLOG_INSTANCE",
    key: "instance",
    toml: TomlType::String,
};
/// The tokens (a list; see the module docs).
pub const TOKENS: Setting = Setting {
    flag: "--token",
    env: "FLIGHTLOG_TOKENS",
    key: "tokens",
    toml: TomlType::Tokens,
};
/// The deliberate opt-out of [`check_exposure`].
pub const ALLOW_UNAUTHENTICATED_NON_LOOPBACK: Setting = Setting {
    flag: "--allow-unauthenticated-non-loopback",
    env: "FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK",
    key: "allow_unauthenticated_non_loopback",
    toml: TomlType::Boolean,
};
/// The testing clock: starts at 0 and moves only through `PUT /v1/testing/clock`.
pub const MANUAL_CLOCK: Setting = Setting {
    flag: "--manual-clock",
    env: "FLIGHTLOG_MANUAL_CLOCK",
    key: "manual_clock",
    toml: TomlType::Boolean,
};

/// Time between scheduled maintenance passes, or `off`.
pub const MAINTENANCE_EVERY_MS: Setting = Setting {
    flag: "--maintenance-every-ms",
    env: "FLIGHTLOG_MAINTENANCE_EVERY_MS",
    key: "maintenance.every_ms",
    toml: TomlType::StringOrInteger,
};
/// The stale sweep's window, or `off`.
pub const STALE_AFTER_MS: Setting = Setting {
    flag: "--stale-after-ms",
    env: "FLIGHTLOG_STALE_AFTER_MS",
    key: "maintenance.stale_after_ms",
    toml: TomlType::StringOrInteger,
};
/// The stuck-run watchdog's threshold, or `off`.
pub const STUCK_AFTER_MS: Setting = Setting {
    flag: "--stuck-after-ms",
    env: "FLIGHTLOG_STUCK_AFTER_MS",
    key: "maintenance.stuck_after_ms",
    toml: TomlType::StringOrInteger,
};
/// How long the detail of an ended run is kept, or `off`.
pub const PRUNE_AFTER_MS: Setting = Setting {
    flag: "--prune-after-ms",
    env: "FLIGHTLOG_PRUNE_AFTER_MS",
    key: "maintenance.prune_after_ms",
    toml: TomlType::StringOrInteger,
};

/// Every setting the config file may hold.
pub const SETTINGS: [Setting; 20] = [
    DB,
    ADDR,
    GRPC_ADDR,
    DURABILITY,
    BODY_LIMIT,
    RESPONSE_BUDGET,
    REQUEST_BUDGET,
    MAX_INFLIGHT_WRITES,
    MAX_CONNECTIONS,
    JOURNAL_MAX_EVENTS,
    JOURNAL_MAX_AGE_MS,
    WRITE_LOCK_WAIT_MS,
    INSTANCE,
    TOKENS,
    ALLOW_UNAUTHENTICATED_NON_LOOPBACK,
    MANUAL_CLOCK,
    MAINTENANCE_EVERY_MS,
    STALE_AFTER_MS,
    STUCK_AFTER_MS,
    PRUNE_AFTER_MS,
];

/// The flag naming the config file.
pub const CONFIG_FLAG: &str = "--config";
/// The environment variable naming the config file.
pub const CONFIG_ENV: &str = "FLIGHTLOG_CONFIG";

/// The database file when nothing names one.
pub const DEFAULT_DB: &str = "flightlog.db";
/// The address when nothing names one: loopback, the standard OTLP/HTTP port.
pub const DEFAULT_ADDR: &str = "127.0.0.1:4318";
/// The OTLP/gRPC address when nothing names one: loopback, the standard OTLP/gRPC port.
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:4317";
/// How long a write waits for another process's write lock when nothing says (ms).
pub const DEFAULT_WRITE_LOCK_WAIT_MS: u64 = 10_000;
/// The longest `--write-lock-wait-ms` accepted: ten minutes.
pub const MAX_WRITE_LOCK_WAIT_MS: u64 = 600_000;
/// The largest `--body-limit` accepted (1 GiB): a request's body is held in memory whole, so
/// a larger limit would let one request take more memory than a server should risk.
pub const MAX_BODY_LIMIT: usize = 1 << 30;
/// The largest config file read (1 MiB): a real one is a few hundred bytes.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1024 * 1024;
/// The shortest `--maintenance-every-ms` accepted.
pub const MIN_MAINTENANCE_EVERY_MS: u64 = 10;
/// The longest `--maintenance-every-ms` accepted: a day.
pub const MAX_MAINTENANCE_EVERY_MS: u64 = 86_400_000;

/// The largest `--response-budget`: far more memory than a server has, small enough to count.
pub const MAX_RESPONSE_BUDGET: usize = 1 << 40;
/// The largest `--max-inflight-writes` accepted.
pub const MAX_INFLIGHT_WRITES_LIMIT: usize = 1_000_000;
/// The largest `--max-connections` accepted.
pub const MAX_CONNECTIONS_LIMIT: usize = 1_000_000;

/// The config file's format and the token syntax, for `flightlog serve --help`.
pub const CONFIG_HELP: &str = "\
Settings come from flags, FLIGHTLOG_* environment variables and an optional TOML config file
(--config PATH or FLIGHTLOG_CONFIG). Each setting takes the first of: flag, environment
variable, config file, default. An empty environment variable counts as unset. A value that
another source overrides must be valid all the same (a bad one in the file is refused even
while a flag overrides it), so it cannot stop the server later, when the override goes.

Config file (every key optional; relative paths are relative to the file's folder):

    db = \"/var/lib/flightlog/flightlog.db\"
    addr = \"127.0.0.1:4318\"
    grpc_addr = \"127.0.0.1:4317\"  # OTLP/gRPC; \"off\" disables it
    durability = \"normal\"          # or \"full\"
    body_limit = \"8MiB\"            # bytes, or with KiB / MiB / GiB
    response_budget = \"256MiB\"     # memory for large answers (snapshots, pages) in flight
    request_budget = \"64MiB\"       # memory for request bodies being read and handled
    max_inflight_writes = 4096
    max_connections = 4096         # served at once; past it an idle one is closed to make room
    write_lock_wait_ms = 10000     # then 503: another process holds the database's write lock
    instance = \"ingest-1\"           # default: this host's name and the HTTP port
    allow_unauthenticated_non_loopback = false
    manual_clock = false           # testing: time starts at 0, moves by PUT /v1/testing/clock

    [journal]
    max_events = 10000             # events per engagement
    max_age_ms = 2592000000        # 30 days; idle engagements are removed after it (\"off\")

    [maintenance]                  # what the server does on its own; each also takes \"off\"
    every_ms = 60000               # a pass a minute (\"off\": none; none by default under
                                   # --manual-clock, whose time moves only when told)
    stale_after_ms = 7200000       # close runs whose root (or, root ended, whose open
                                   # spans) showed no life for 2 hours
    stuck_after_ms = 3600000       # report runs open for over an hour (flightlog_runs_stuck)
    prune_after_ms = 2592000000    # delete span detail of runs ended 30 days ago (rollups kept)

    [[tokens]]
    token = \"a-long-random-secret\"
    scopes = [\"read\", \"ingest\"]

    [[tokens]]
    token = \"another-long-random-secret\"
    scopes = [\"admin\"]

Tokens and scopes: with any token configured, every request but GET /healthz needs
`Authorization: Bearer <token>` (401 without a valid one, 403 without the scope); HTTP Basic
auth with the token as the password (any user name) works too, as some OTLP exporters prefer.
  read    all GETs and live streams
  ingest  all writes: spans, events, batch, journal appends, OTLP
  admin   maintenance: sweep-orphans, sweep-stale, prune, journal compact and prune,
          and the testing clock
--token SECRET (repeatable) grants all three scopes. FLIGHTLOG_TOKENS holds scoped tokens as
TOKEN:SCOPE[,SCOPE...] entries separated by ';', e.g.
    FLIGHTLOG_TOKENS=\"s3cret-reader:read;s3cret-agent:read,ingest;s3cret-ops:admin\"
(a token may hold any visible ASCII but ';'; its scopes follow its last ':'). The token list
is taken whole from the first source that has one: --token, else FLIGHTLOG_TOKENS, else the
file. Prefer the environment or a file readable only by the service over --token, which other
local users can see in the process list.

Without any token the server refuses to listen on a non-loopback address (such as 0.0.0.0)
unless --allow-unauthenticated-non-loopback says so on purpose (e.g. behind an authenticating
proxy).

Exit status: 0 after a clean stop (Ctrl-C, SIGTERM or SIGHUP); 1 when a setting is refused or the
server cannot start, fails while running, or is stopped at once by a second stop signal; 2 for a
command line it cannot read.";

/// What `flightlog serve` got on its command line, still as text: parsing happens in
/// [`resolve`], so a bad flag value gets the same message as a bad variable or file entry.
#[derive(Clone, Default)]
pub struct ServeFlags {
    /// `--config PATH`.
    pub config: Option<PathBuf>,
    /// `--db PATH`.
    pub db: Option<PathBuf>,
    /// `--addr HOST:PORT`.
    pub addr: Option<String>,
    /// `--grpc-addr HOST:PORT|off`.
    pub grpc_addr: Option<String>,
    /// `--durability normal|full`.
    pub durability: Option<String>,
    /// `--body-limit SIZE`.
    pub body_limit: Option<String>,
    /// `--response-budget SIZE`.
    pub response_budget: Option<String>,
    /// `--request-budget SIZE`.
    pub request_budget: Option<String>,
    /// `--max-inflight-writes N`.
    pub max_inflight_writes: Option<String>,
    /// `--max-connections N`.
    pub max_connections: Option<String>,
    /// `--journal-max-events N`.
    pub journal_max_events: Option<String>,
    /// `--journal-max-age-ms MS`.
    pub journal_max_age_ms: Option<String>,
    /// `--write-lock-wait-ms MS`.
    pub write_lock_wait_ms: Option<String>,
    /// `--instance NAME`.
    pub instance: Option<String>,
    /// `--maintenance-every-ms MS|off`.
    pub maintenance_every_ms: Option<String>,
    /// `--stale-after-ms MS|off`.
    pub stale_after_ms: Option<String>,
    /// `--stuck-after-ms MS|off`.
    pub stuck_after_ms: Option<String>,
    /// `--prune-after-ms MS|off`.
    pub prune_after_ms: Option<String>,
    /// Every `--token SECRET`, each with all scopes.
    pub tokens: Vec<String>,
    /// `--allow-unauthenticated-non-loopback[=BOOL]` (the bare flag means `true`).
    pub allow_unauthenticated_non_loopback: Option<String>,
    /// `--manual-clock[=BOOL]` (the bare flag means `true`).
    pub manual_clock: Option<String>,
}

impl fmt::Debug for ServeFlags {
    /// Everything but the token secrets, which show as a count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeFlags")
            .field("config", &self.config)
            .field("db", &self.db)
            .field("addr", &self.addr)
            .field("grpc_addr", &self.grpc_addr)
            .field("durability", &self.durability)
            .field("body_limit", &self.body_limit)
            .field("response_budget", &self.response_budget)
            .field("request_budget", &self.request_budget)
            .field("max_inflight_writes", &self.max_inflight_writes)
            .field("max_connections", &self.max_connections)
            .field("journal_max_events", &self.journal_max_events)
            .field("journal_max_age_ms", &self.journal_max_age_ms)
            .field("write_lock_wait_ms", &self.write_lock_wait_ms)
            .field("instance", &self.instance)
            .field("maintenance_every_ms", &self.maintenance_every_ms)
            .field("stale_after_ms", &self.stale_after_ms)
            .field("stuck_after_ms", &self.stuck_after_ms)
            .field("prune_after_ms", &self.prune_after_ms)
            .field("tokens", &format_args!("<{} redacted>", self.tokens.len()))
            .field(
                "allow_unauthenticated_non_loopback",
                &self.allow_unauthenticated_non_loopback,
            )
            .field("manual_clock", &self.manual_clock)
            .finish()
    }
}

/// How hard the database works to keep a commit (maps to the SQLite store's `Durability`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// Survives a crash of the process; the last commits may be lost on power loss.
    #[default]
    Normal,
    /// Every commit survives power loss (an fsync per group commit).
    Full,
}

/// Everything `flightlog serve` needs, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeSettings {
    /// The SQLite database file.
    pub db: PathBuf,
    /// `HOST:PORT` to listen on (resolved and checked by [`check_exposure`] at start).
    pub addr: String,
    /// `HOST:PORT` of the OTLP/gRPC listener; `None` when set to `off`.
    pub grpc_addr: Option<String>,
    /// The SQLite durability level.
    pub durability: Durability,
    /// How long a write waits for a write lock another process holds on the database before
    /// it is answered `503` (nothing written).
    pub write_lock_wait: Duration,
    /// The HTTP server's configuration (body limit, tokens, write limit).
    pub server: ServerConfig,
    /// The engagement journal's retention.
    pub retention: RetentionConfig,
    /// The instance name this server's writer identity starts with; `None`: this host's name
    /// and the HTTP listener's port (see [`default_instance`]).
    pub instance: Option<String>,
    /// Serve without tokens on a non-loopback address anyway.
    pub allow_unauthenticated_non_loopback: bool,
    /// The stores read a testing clock that starts at 0 and moves only through
    /// `PUT /v1/testing/clock` (a route served only then).
    pub manual_clock: bool,
    /// The scheduled maintenance.
    pub maintenance: MaintenanceSettings,
    /// The config file read, if any.
    pub config_file: Option<PathBuf>,
}

impl ServeSettings {
    /// The settings that shape what is kept and refused, as the start-up line says them, so an
    /// operator sees that `--durability full` (or a body limit, a journal's cap) took effect
    /// without reading `/metrics` or counting fsyncs (an audit's finding).
    pub fn describe_storage(&self) -> String {
        let durability = match self.durability {
            Durability::Normal => "normal (commits survive a crash of this process)",
            Durability::Full => "full (commits survive power loss)",
        };
        let journals = match self.retention.max_events_per_engagement {
            0 => "journals read-only (journal.max_events 0: every append refused)".to_owned(),
            max => format!("journals of up to {max} events each"),
        };
        format!(
            "durability {durability}; request bodies up to {}; {journals}; a write waits up to \
             {} for another process's write lock",
            describe_bytes(self.server.body_limit),
            describe_duration(self.write_lock_wait)
        )
    }
}

/// `bytes` in the largest unit that writes it whole (`8 MiB`, `1536 KiB`, `1000 bytes`).
fn describe_bytes(bytes: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    const GIB: usize = 1 << 30;
    match bytes {
        0 => "0 bytes".to_owned(),
        _ if bytes.is_multiple_of(GIB) => format!("{} GiB", bytes / GIB),
        _ if bytes.is_multiple_of(MIB) => format!("{} MiB", bytes / MIB),
        _ if bytes.is_multiple_of(KIB) => format!("{} KiB", bytes / KIB),
        _ => format!("{bytes} bytes"),
    }
}

/// `duration` in whole seconds when it is, else in milliseconds (`10 s`, `250 ms`).
fn describe_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis.is_multiple_of(1000) {
        format!("{} s", millis / 1000)
    } else {
        format!("{millis} ms")
    }
}

/// The scheduled maintenance as configured (see [`crate::maintenance`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaintenanceSettings {
    /// Time between passes: `None` when no source sets it (a minute, or no passes under
    /// `--manual-clock`), `Some(None)` for `off`.
    pub every: Option<Option<Duration>>,
    /// The stale sweep's window in ms (`None`: off).
    pub stale_after_ms: Option<i64>,
    /// The stuck-run watchdog's threshold in ms (`None`: off).
    pub stuck_after_ms: Option<i64>,
    /// How long an ended run's detail is kept, in ms (`None`: forever).
    pub prune_after_ms: Option<i64>,
    /// Whether the passes remove engagements idle past the journal's retention (`false` when
    /// `journal.max_age_ms` is `off`).
    pub journal_prune: bool,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        let plan = MaintenancePlan::DEFAULT;
        Self {
            every: None,
            stale_after_ms: plan.stale_after_ms,
            stuck_after_ms: plan.stuck_after_ms,
            prune_after_ms: plan.prune_after_ms,
            journal_prune: plan.journal_prune,
        }
    }
}

impl MaintenanceSettings {
    /// The passes to run, `None` for none. A server on a manual clock runs none unless
    /// `every_ms` is set: its time moves only when a test says, and a pass nobody asked for
    /// would change what such a test expects.
    pub fn plan(&self, manual_clock: bool) -> Option<MaintenancePlan> {
        let every = match self.every {
            Some(every) => every?,
            None if manual_clock => return None,
            None => MaintenancePlan::DEFAULT.every,
        };
        Some(MaintenancePlan {
            every,
            stale_after_ms: self.stale_after_ms,
            stuck_after_ms: self.stuck_after_ms,
            prune_after_ms: self.prune_after_ms,
            journal_prune: self.journal_prune,
        })
    }
}

/// Why the settings cannot be used. Each message names the setting and the way to fix it, and
/// none repeats a token.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// A value that does not parse or is out of range.
    #[error("{origin} = {value:?} is not valid: {fix}")]
    Invalid {
        /// Where the value came from (`--body-limit`, `FLIGHTLOG_BODY_LIMIT`, a file key).
        origin: String,
        /// The value as given.
        value: String,
        /// What a valid value looks like.
        fix: String,
    },
    /// A config file value of the wrong TOML type (`addr = 5`).
    #[error("{origin} is {value} (a TOML {found}), which is not valid: {fix}")]
    WrongType {
        /// The file key and the file.
        origin: String,
        /// The value as TOML writes it.
        value: String,
        /// Its TOML type (`integer`, `array`, …).
        found: String,
        /// What a valid value looks like.
        fix: String,
    },
    /// A token that cannot be used (its text is never repeated).
    #[error("{origin}: {problem}")]
    Token {
        /// Where the token came from, with its position (`FLIGHTLOG_TOKENS entry 2`).
        origin: String,
        /// What is wrong and how to write it instead.
        problem: String,
    },
    /// The config file cannot be read.
    #[error(
        "cannot read the config file {} (named by {named_by}): {error}{hint}",
        .path.display(),
        hint = read_config_hint(error)
    )]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// `--config` or `FLIGHTLOG_CONFIG`.
        named_by: &'static str,
        /// Why (in the message, not as a `source`, so a chain printer says it once).
        error: std::io::Error,
    },
    /// The config file is not valid TOML.
    #[error("the config file {} is not valid TOML: {message}", .path.display())]
    ConfigSyntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// The config file has a key this version does not know (a typo, most likely).
    #[error(
        "the config file {} has an unknown key `{key}`{hint}; the keys are: {known} \
         (see `flightlog serve --help`)",
        .path.display()
    )]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key, dotted when nested.
        key: String,
        /// What was most likely meant (empty when nothing is close).
        hint: String,
        /// The keys it may hold.
        known: String,
    },
    /// A config file giving one setting twice: as a quoted dotted key (`"journal.max_events"`)
    /// and in its section (`[journal] max_events`), two keys to TOML; one of the two values
    /// was dropped without a word (an audit's finding).
    #[error(
        "the config file {} gives `{key}` twice (as `\"{key}\" = …` and in its section): \
         keep one",
        .path.display()
    )]
    DuplicateKey {
        /// The file.
        path: PathBuf,
        /// The key, dotted.
        key: &'static str,
    },
    /// A server without tokens was asked to listen on a non-loopback address.
    #[error(
        "refusing to listen on {addr} without any token: anyone who can reach that address \
         could read and change all data. Configure a token (--token, FLIGHTLOG_TOKENS or \
         [[tokens]] in the config file), or listen on a loopback address such as \
         127.0.0.1:{port}, or, if something in front of this server does the \
         authentication, allow it on purpose with --allow-unauthenticated-non-loopback \
         (or FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK=true, or \
         `allow_unauthenticated_non_loopback = true` in the config file)",
        port = .addr.port()
    )]
    UnauthenticatedNonLoopback {
        /// The first non-loopback address it would have listened on.
        addr: SocketAddr,
    },
}

/// What to do about a config file that cannot be read, for the errors that have a usual fix.
fn read_config_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::NotFound => {
            "; check the path (a relative one starts from the current folder), or leave the \
             setting out to run without a config file"
        }
        std::io::ErrorKind::PermissionDenied => {
            "; make the file readable by the user the server runs as"
        }
        // `read_to_string` of bytes that are not UTF-8.
        std::io::ErrorKind::InvalidData => {
            "; TOML files are UTF-8 text: save it as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8`)"
        }
        _ => "",
    }
}

/// Where a value came from, as the user wrote it.
#[derive(Debug, Clone)]
enum Origin<'a> {
    Flag(&'static str),
    Env(&'static str),
    File { key: &'static str, path: &'a Path },
}

impl fmt::Display for Origin<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => f.write_str(flag),
            Origin::Env(name) => f.write_str(name),
            Origin::File { key, path } => write!(f, "`{key}` in {}", path.display()),
        }
    }
}

/// A parsed config file: its settings by dotted key, unknown keys already refused.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    values: BTreeMap<&'static str, Value>,
}

impl ConfigFile {
    /// Read and parse the file at `path`; `named_by` is the flag or variable that named it.
    pub fn read(path: &Path, named_by: &'static str) -> Result<Self, SettingsError> {
        let refuse = |error: std::io::Error| SettingsError::ReadConfig {
            path: path.to_owned(),
            named_by,
            error,
        };
        // A FIFO would block the start until something writes to it, and a device such as
        // /dev/zero never ends: only a regular file (or a link to one) is read, and only so far.
        let metadata = std::fs::metadata(path).map_err(refuse)?;
        if !metadata.is_file() {
            return Err(refuse(std::io::Error::other(if metadata.is_dir() {
                "it is a directory; give the path of a TOML file"
            } else {
                "it is not a regular file (a FIFO, a device or a socket); give the path of a \
                 TOML file"
            })));
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|file| {
                use std::io::Read;
                file.take(MAX_CONFIG_FILE_BYTES + 1)
                    .read_to_string(&mut text)
            })
            .map_err(refuse)?;
        if text.len() as u64 > MAX_CONFIG_FILE_BYTES {
            return Err(refuse(std::io::Error::other(format!(
                "it is larger than {MAX_CONFIG_FILE_BYTES} bytes, which no flightlog config \
                 file needs; is it the right file?"
            ))));
        }
        Self::parse(path, &text)
    }

    /// Parse `text` as the config file at `path` (which relative paths in it are resolved
    /// against).
    pub fn parse(path: &Path, text: &str) -> Result<Self, SettingsError> {
        let table: Table =
            text.parse()
                .map_err(|err: toml::de::Error| SettingsError::ConfigSyntax {
                    path: path.to_owned(),
                    message: err.to_string().trim_end().to_owned(),
                })?;
        let mut values = BTreeMap::new();
        collect_keys(path, "", table, &mut values)?;
        Ok(Self {
            path: path.to_owned(),
            values,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn get(&self, setting: &Setting) -> Option<(&Value, Origin<'_>)> {
        self.values.get(setting.key).map(|value| {
            let origin = Origin::File {
                key: setting.key,
                path: &self.path,
            };
            (value, origin)
        })
    }
}

/// File `table`'s settings into `values` by dotted key (`prefix` is the enclosing table's).
fn collect_keys(
    path: &Path,
    prefix: &str,
    table: Table,
    values: &mut BTreeMap<&'static str, Value>,
) -> Result<(), SettingsError> {
    for (key, value) in table {
        let dotted = if prefix.is_empty() {
            key
        } else {
            format!("{prefix}.{key}")
        };
        if let Some(setting) = SETTINGS.iter().find(|s| s.key == dotted) {
            if values.insert(setting.key, value).is_some() {
                return Err(SettingsError::DuplicateKey {
                    path: path.to_owned(),
                    key: setting.key,
                });
            }
            continue;
        }
        let is_section = SETTINGS
            .iter()
            .any(|s| s.key.starts_with(&format!("{dotted}.")));
        match value {
            Value::Table(inner) if is_section => collect_keys(path, &dotted, inner, values)?,
            _ => {
                let known: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
                let hint = if is_section {
                    format!(
                        " (`{dotted}` is a section: write `[{dotted}]` on a line of its own, \
                         then its keys below it)"
                    )
                } else if let (Value::Table(_), Some(section)) = (&value, meant_section(&dotted)) {
                    format!(" (did you mean `[{section}]`?)")
                } else {
                    meant_key(&dotted)
                        .map(|meant| format!(" (did you mean `{meant}`?)"))
                        .unwrap_or_default()
                };
                return Err(SettingsError::UnknownKey {
                    path: path.to_owned(),
                    key: dotted,
                    hint,
                    known: known.join(", "),
                });
            }
        }
    }
    Ok(())
}

/// Of `candidates` (each compared as `spelled` spells it), the first one closest to `wanted`, if
/// it is at most two edits away: the guess behind every "did you mean" of the settings.
fn closest_within_two<'a>(
    wanted: &str,
    candidates: impl Iterator<Item = &'a str>,
    spelled: impl Fn(&str) -> String,
) -> Option<&'a str> {
    candidates
        .map(|candidate| (strsim::levenshtein(wanted, &spelled(candidate)), candidate))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// The section (`journal`, `maintenance`) closest to an unknown table's name (`jornal`).
fn meant_section(name: &str) -> Option<&'static str> {
    let sections = SETTINGS
        .iter()
        .filter_map(|setting| setting.key.split_once('.').map(|(section, _)| section));
    closest_within_two(&name.to_ascii_lowercase(), sections, str::to_owned)
}

/// The config-file key closest to an unknown `key` (`bodylimit`, `Body-Limit`,
/// `journal.max_event`), if one is close: compared without case and without `_` or `-`, first
/// whole, then by the part after the last `.` (`max_events` outside its `[journal]`). Keys of
/// fewer than 3 letters get no guess.
fn meant_key(key: &str) -> Option<&'static str> {
    fn plain(text: &str) -> String {
        text.chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .map(|c| c.to_ascii_lowercase())
            .collect()
    }
    fn last_part(key: &str) -> &str {
        key.rsplit('.').next().unwrap_or(key)
    }
    if plain(last_part(key)).len() < 3 {
        return None;
    }
    let keys = || SETTINGS.iter().map(|setting| setting.key);
    closest_within_two(&plain(key), keys(), plain).or_else(|| {
        closest_within_two(&plain(last_part(key)), keys(), |known| {
            plain(last_part(known))
        })
    })
}

/// The config file `flags` or `env` name, if any, with the name of what named it.
pub fn config_path(
    flags: &ServeFlags,
    env: &BTreeMap<String, String>,
) -> Option<(PathBuf, &'static str)> {
    if let Some(path) = &flags.config {
        return Some((path.clone(), CONFIG_FLAG));
    }
    env_value(env, CONFIG_ENV).map(|path| (PathBuf::from(path), CONFIG_ENV))
}

/// Resolve the settings: read the config file `flags` or `env` name (if any), then take each
/// setting from the flag, the environment, the file or the default, in that order.
pub fn resolve(
    flags: &ServeFlags,
    env: &BTreeMap<String, String>,
) -> Result<ServeSettings, SettingsError> {
    let file = match config_path(flags, env) {
        Some((path, named_by)) => Some(ConfigFile::read(&path, named_by)?),
        None => None,
    };
    // The file the variable names, when the flag names another: read and checked all the same
    // (it used to be ignored, so a bad one stopped the server only once the flag went).
    if let (Some(_), Some(overridden)) = (&flags.config, env_value(env, CONFIG_ENV)) {
        let overridden = ConfigFile::read(Path::new(&overridden), CONFIG_ENV)?;
        let without_flag = ServeFlags {
            config: None,
            ..flags.clone()
        };
        resolve_with_file(&without_flag, env, Some(&overridden))?;
    }
    resolve_with_file(flags, env, file.as_ref())
}

/// The fix for a database path that begins or ends with white space: taken as written, it
/// opened a new, empty file beside the real one, and everything stored looked lost (an env file
/// that keeps trailing spaces, as Docker's `--env-file` does; an audit's finding). Every other
/// setting's value is trimmed; a path is refused, since the space could be the file's.
const PADDED_DB_PATH: &str = "remove the white space at its start or end (an env file may keep \
     trailing spaces); flightlog does not take a database file whose name begins or ends with \
     white space";

/// [`resolve`] with the config file already parsed (or none).
pub fn resolve_with_file(
    flags: &ServeFlags,
    env: &BTreeMap<String, String>,
    file: Option<&ConfigFile>,
) -> Result<ServeSettings, SettingsError> {
    let layers = Layers { flags, env, file };

    // The variable's and the file's paths are checked here, even when the flag overrides them;
    // the one taken below is therefore not blank.
    for (text, origin) in layers.sources(&DB, None::<String>)? {
        if text.trim().is_empty() {
            return Err(invalid(
                &origin,
                &text,
                "give the path of the database file",
            ));
        }
        if text.trim() != text {
            return Err(invalid(&origin, &text, PADDED_DB_PATH));
        }
        if names_a_folder(Path::new(&text)) {
            return Err(invalid(&origin, &text, &folder_not_file(&text)));
        }
    }
    let db = match &flags.db {
        // Taken as given, so a path that is not UTF-8 still works.
        Some(path) if path.as_os_str().is_empty() => {
            return Err(invalid(
                &Origin::Flag(DB.flag),
                "",
                "give the path of the database file",
            ))
        }
        Some(path) if path.to_str().is_some_and(|text| text.trim() != text) => {
            return Err(invalid(
                &Origin::Flag(DB.flag),
                &path.to_string_lossy(),
                PADDED_DB_PATH,
            ))
        }
        Some(path) if names_a_folder(path) => {
            let text = path.to_string_lossy();
            return Err(invalid(
                &Origin::Flag(DB.flag),
                &text,
                &folder_not_file(&text),
            ));
        }
        Some(path) => path.clone(),
        None => match layers.pick(&DB, None::<String>)? {
            None => PathBuf::from(DEFAULT_DB),
            // A relative path in the file is relative to the file, not to wherever the server
            // happens to be started.
            Some((text, Origin::File { path, .. })) => match path.parent() {
                Some(folder) => folder.join(text),
                None => PathBuf::from(text),
            },
            Some((text, _)) => PathBuf::from(text),
        },
    };
    let addr = layers.parse(
        &ADDR,
        flags.addr.as_deref(),
        DEFAULT_ADDR.to_owned(),
        parse_addr,
        "give HOST:PORT, such as 127.0.0.1:4318, [::1]:4318 or 0.0.0.0:4318 (port 0 picks a \
         free one)",
    )?;
    let grpc_addr = layers.parse(
        &GRPC_ADDR,
        flags.grpc_addr.as_deref(),
        Some(DEFAULT_GRPC_ADDR.to_owned()),
        |text| parse_off_or(text, parse_addr),
        "give HOST:PORT, such as 127.0.0.1:4317 or [::1]:4317, or `off` to serve no OTLP/gRPC \
         listener",
    )?;
    let durability = layers.parse(
        &DURABILITY,
        flags.durability.as_deref(),
        Durability::default(),
        parse_durability,
        "give `normal` (survives a crash of the process) or `full` (survives power loss)",
    )?;
    let body_limit = layers.parse(
        &BODY_LIMIT,
        flags.body_limit.as_deref(),
        ServerConfig::DEFAULT_BODY_LIMIT,
        |text| parse_size(text).filter(|size| *size <= MAX_BODY_LIMIT),
        "give a size of at least 1 byte and at most 1GiB: a whole number of bytes, or of KiB, \
         MiB or GiB, such as 8388608 or 8MiB (1.5MiB is 1536KiB)",
    )?;
    let response_budget_bytes = layers.parse_budget(
        &RESPONSE_BUDGET,
        flags.response_budget.as_deref(),
        ServerConfig::DEFAULT_RESPONSE_BUDGET_BYTES,
        "such as 268435456 or 256MiB",
    )?;
    let request_budget_bytes = layers.parse_budget(
        &REQUEST_BUDGET,
        flags.request_budget.as_deref(),
        ServerConfig::DEFAULT_REQUEST_BUDGET_BYTES,
        "such as 67108864 or 64MiB",
    )?;
    let max_inflight_writes = layers.parse(
        &MAX_INFLIGHT_WRITES,
        flags.max_inflight_writes.as_deref(),
        ServerConfig::DEFAULT_MAX_INFLIGHT_WRITES,
        |text| parse_in_range(text, 1, MAX_INFLIGHT_WRITES_LIMIT as u64).map(|n| n as usize),
        "give a whole number of write requests from 1 to 1000000 (default 4096)",
    )?;
    let max_connections = layers.parse(
        &MAX_CONNECTIONS,
        flags.max_connections.as_deref(),
        ServerConfig::DEFAULT_MAX_CONNECTIONS,
        |text| parse_in_range(text, 1, MAX_CONNECTIONS_LIMIT as u64).map(|n| n as usize),
        "give a whole number of connections from 1 to 1000000 (default 4096)",
    )?;
    let max_events = layers.parse(
        &JOURNAL_MAX_EVENTS,
        flags.journal_max_events.as_deref(),
        RetentionConfig::DEFAULT_MAX_EVENTS_PER_ENGAGEMENT,
        |text| parse_in_range(text, 0, SAFE_INTEGER_LIMIT as u64 - 1),
        "give a whole number of events per engagement from 0 (no append accepted) to \
         9007199254740991 (default 10000)",
    )?;
    let journal_max_age_ms = layers.parse(
        &JOURNAL_MAX_AGE_MS,
        flags.journal_max_age_ms.as_deref(),
        Some(RetentionConfig::DEFAULT_MAX_AGE_MS),
        |text| {
            parse_off_or(text, |text| {
                parse_in_range(text, 1, SAFE_INTEGER_LIMIT as u64 - 1).map(|n| n as i64)
            })
        },
        "give an age in milliseconds from 1 to 9007199254740991, or `off` to keep idle \
         engagements (default 2592000000, 30 days)",
    )?;
    // `off`: no age is old enough (the cutoff, now minus this, is below every `at`).
    let max_age_ms = journal_max_age_ms.unwrap_or(i64::MAX);
    let write_lock_wait_ms = layers.parse(
        &WRITE_LOCK_WAIT_MS,
        flags.write_lock_wait_ms.as_deref(),
        DEFAULT_WRITE_LOCK_WAIT_MS,
        |text| parse_in_range(text, 0, MAX_WRITE_LOCK_WAIT_MS),
        "give a wait in milliseconds from 0 to 600000 (default 10000)",
    )?;
    let instance = layers.parse(
        &INSTANCE,
        flags.instance.as_deref(),
        None,
        |text| parse_instance(text).map(Some),
        "give 1 to 64 letters, digits, '.', '_', ':' or '-', a name no other server on this \
         database uses at the same time (default: this host's name and the HTTP port)",
    )?;
    let allow_unauthenticated_non_loopback = layers.parse(
        &ALLOW_UNAUTHENTICATED_NON_LOOPBACK,
        flags.allow_unauthenticated_non_loopback.as_deref(),
        false,
        parse_bool,
        BOOL_VALUES,
    )?;
    let manual_clock = layers.parse(
        &MANUAL_CLOCK,
        flags.manual_clock.as_deref(),
        false,
        parse_bool,
        BOOL_VALUES,
    )?;
    let every = layers.parse(
        &MAINTENANCE_EVERY_MS,
        flags.maintenance_every_ms.as_deref(),
        None,
        |text| {
            parse_off_or(text, |text| {
                parse_in_range(text, MIN_MAINTENANCE_EVERY_MS, MAX_MAINTENANCE_EVERY_MS)
                    .map(Duration::from_millis)
            })
            .map(Some)
        },
        "give a time between passes in milliseconds from 10 to 86400000, or `off` for no \
         scheduled maintenance (default 60000, a minute; off under --manual-clock)",
    )?;
    let defaults = MaintenanceSettings::default();
    let window = |setting: &Setting, flag: &Option<String>, default: Option<i64>, fix| {
        layers.parse(
            setting,
            flag.as_deref(),
            default,
            |text| {
                parse_off_or(text, |text| {
                    parse_in_range(text, 1, SAFE_INTEGER_LIMIT as u64 - 1).map(|n| n as i64)
                })
            },
            fix,
        )
    };
    let maintenance = MaintenanceSettings {
        every,
        stale_after_ms: window(
            &STALE_AFTER_MS,
            &flags.stale_after_ms,
            defaults.stale_after_ms,
            "give a time in milliseconds from 1 to 9007199254740991 after which a run whose \
             root had no heartbeat is closed, or `off` (default 7200000, 2 hours)",
        )?,
        stuck_after_ms: window(
            &STUCK_AFTER_MS,
            &flags.stuck_after_ms,
            defaults.stuck_after_ms,
            "give a time in milliseconds from 1 to 9007199254740991 after which an open run \
             counts as stuck, or `off` (default 3600000, an hour)",
        )?,
        prune_after_ms: window(
            &PRUNE_AFTER_MS,
            &flags.prune_after_ms,
            defaults.prune_after_ms,
            "give a time in milliseconds from 1 to 9007199254740991 after which the span \
             detail of an ended run is deleted, or `off` to keep it (default 2592000000, 30 \
             days)",
        )?,
        journal_prune: journal_max_age_ms.is_some(),
    };
    let auth = layers.tokens()?;

    Ok(ServeSettings {
        db,
        addr,
        grpc_addr,
        durability,
        write_lock_wait: Duration::from_millis(write_lock_wait_ms),
        server: ServerConfig {
            body_limit,
            auth,
            max_inflight_writes,
            max_connections,
            response_budget_bytes,
            request_budget_bytes,
            // What an OTLP body may inflate to is never below what it may be sent as: a plain
            // body over 64 MiB was refused as "decompressed" past a larger --body-limit.
            otlp_max_decompressed: ServerConfig::DEFAULT_OTLP_MAX_DECOMPRESSED.max(body_limit),
            loopback_names_only: !allow_unauthenticated_non_loopback,
            ..ServerConfig::default()
        },
        retention: RetentionConfig {
            max_events_per_engagement: max_events,
            max_age_ms,
        },
        instance,
        allow_unauthenticated_non_loopback,
        manual_clock,
        maintenance,
        config_file: file.map(|file| file.path.clone()),
    })
}

/// The three sources, looked up in precedence order.
struct Layers<'a> {
    flags: &'a ServeFlags,
    env: &'a BTreeMap<String, String>,
    file: Option<&'a ConfigFile>,
}

impl<'a> Layers<'a> {
    /// Every source's text for `setting` (`flag` is the flag's value) with its origin, in
    /// precedence order: the first one is the value used.
    fn sources(
        &self,
        setting: &Setting,
        flag: Option<impl Into<String>>,
    ) -> Result<Vec<(String, Origin<'a>)>, SettingsError> {
        let mut sources = Vec::with_capacity(3);
        if let Some(text) = flag {
            sources.push((text.into(), Origin::Flag(setting.flag)));
        }
        if let Some(text) = env_value(self.env, setting.env) {
            sources.push((text.to_owned(), Origin::Env(setting.env)));
        }
        let Some((value, origin)) = self.file.and_then(|file| file.get(setting)) else {
            return Ok(sources);
        };
        let wrong_type = |fix: String| SettingsError::WrongType {
            origin: origin.to_string(),
            value: toml_text(value),
            found: value.type_str().to_owned(),
            fix,
        };
        if !setting.toml.accepts(value) {
            return Err(wrong_type(format!("give {}", setting.toml.describe())));
        }
        match scalar_text(value) {
            Some(text) => sources.push((text, origin)),
            None => {
                return Err(wrong_type(
                    "give a single value, not a table or an array".to_owned(),
                ))
            }
        }
        Ok(sources)
    }

    /// The highest-precedence text for `setting` and its origin.
    fn pick(
        &self,
        setting: &Setting,
        flag: Option<impl Into<String>>,
    ) -> Result<Option<(String, Origin<'a>)>, SettingsError> {
        Ok(self.sources(setting, flag)?.into_iter().next())
    }

    /// The setting parsed by `parse`, or `default` when no source has it. A value a
    /// higher-precedence source overrides is checked too: it would otherwise surface only the
    /// day the override goes (a deploy dropping a variable), as a server that no longer starts.
    /// A memory budget: a size from 1 byte to [`MAX_RESPONSE_BUDGET`]; `example` ends the fix.
    fn parse_budget(
        &self,
        setting: &Setting,
        flag: Option<&str>,
        default: usize,
        example: &str,
    ) -> Result<usize, SettingsError> {
        self.parse(
            setting,
            flag,
            default,
            |text| parse_size(text).filter(|size| *size <= MAX_RESPONSE_BUDGET),
            &format!(
                "give a size of at least 1 byte and at most 1024GiB: a whole number of bytes, or of \
                 KiB, MiB or GiB, {example}"
            ),
        )
    }

    fn parse<T>(
        &self,
        setting: &Setting,
        flag: Option<&str>,
        default: T,
        parse: impl Fn(&str) -> Option<T>,
        fix: &str,
    ) -> Result<T, SettingsError> {
        let mut chosen = None;
        for (text, origin) in self.sources(setting, flag)? {
            let value = parse(text.trim()).ok_or_else(|| invalid(&origin, &text, fix))?;
            chosen.get_or_insert(value);
        }
        Ok(chosen.unwrap_or(default))
    }

    /// The token list of the highest-precedence source that has one. The lists the chosen one
    /// overrides are checked all the same (see [`Self::parse`]).
    fn tokens(&self) -> Result<AuthConfig, SettingsError> {
        if let Some(text) = env_value(self.env, TOKENS.env) {
            parse_env_tokens(text, &mut AuthConfig::open())?;
        }
        if let Some((value, origin)) = self.file.and_then(|file| file.get(&TOKENS)) {
            parse_file_tokens(value, &origin, &mut AuthConfig::open())?;
        }
        let mut auth = AuthConfig::open();
        if !self.flags.tokens.is_empty() {
            for (index, secret) in self.flags.tokens.iter().enumerate() {
                let origin = || format!("{} (the {})", TOKENS.flag, ordinal(index + 1));
                if secret.starts_with("--") {
                    return Err(SettingsError::Token {
                        origin: origin(),
                        problem: format!(
                            "starts with \"--\", so it looks like a flag: give the secret \
                             right after {} (a secret that really starts with \"--\" goes in \
                             FLIGHTLOG_TOKENS or the config file)",
                            TOKENS.flag
                        ),
                    });
                }
                if looks_scoped(secret) {
                    return Err(SettingsError::Token {
                        origin: origin(),
                        problem: format!(
                            "ends in \":\" and scope names, as a token of FLIGHTLOG_TOKENS is \
                             written, but {} takes the secret alone and grants it every scope: \
                             give a token with fewer scopes in FLIGHTLOG_TOKENS \
                             (\"SECRET:read,ingest\") or the config file ([[tokens]])",
                            TOKENS.flag
                        ),
                    });
                }
                auth.add_token(secret, Scopes::ALL)
                    .map_err(|err| token_error(origin(), &err))?;
            }
            return Ok(auth);
        }
        if let Some(text) = env_value(self.env, TOKENS.env) {
            parse_env_tokens(text, &mut auth)?;
            return Ok(auth);
        }
        if let Some((value, origin)) = self.file.and_then(|file| file.get(&TOKENS)) {
            parse_file_tokens(value, &origin, &mut auth)?;
        }
        Ok(auth)
    }
}

/// Whether `name` is an environment variable `flightlog serve` reads.
pub fn is_setting_variable(name: &str) -> bool {
    name == CONFIG_ENV || SETTINGS.iter().any(|setting| setting.env == name)
}

/// The setting variable a `FLIGHTLOG_*` name that is none was probably meant to be
/// (`FLIGHTLOG_TOKEN` → `FLIGHTLOG_TOKENS`), if one is close. A misspelled variable is otherwise
/// ignored without a word, and for the token list that means a server without authentication.
/// Names far from every setting (other tools' variables, test harnesses') get `None`.
pub fn meant_variable(name: &str) -> Option<&'static str> {
    if is_setting_variable(name) {
        return None;
    }
    let upper = with_prefix_mended(name);
    if is_setting_variable(&upper) {
        return SETTINGS
            .iter()
            .map(|setting| setting.env)
            .chain([CONFIG_ENV])
            .find(|known| *known == upper);
    }
    // The test suites' own variables (`FLIGHTLOG_TEST_AUTH_TOKEN` too) are no setting misspelt:
    // `serve` refuses to start beside a token-like one (see `src/serve.rs`).
    if upper.starts_with("FLIGHTLOG_TEST_") {
        return None;
    }
    if let Some(meant) = setting_with_more_words(&upper) {
        return Some(meant);
    }
    let variables = SETTINGS
        .iter()
        .map(|setting| setting.env)
        .chain([CONFIG_ENV]);
    // A near miss first: `FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBAK` holds `AUTH`, and was
    // told to be renamed to the token list (an audit's finding).
    if let Some(meant) = closest_within_two(&upper, variables, str::to_owned) {
        return Some(meant);
    }
    // However far from the name: a token meant for the server that it ignores means a server
    // without authentication (`FLIGHTLOG_API_TOKEN`, `FLIGHTLOG_AUTH`, `FLIGHTLOG_API_KEY`).
    if [
        "TOKEN",
        "AUTH",
        "SECRET",
        "BEARER",
        "KEY",
        "PASSWORD",
        "CREDENTIAL",
    ]
    .iter()
    .any(|word| upper.contains(word))
    {
        return Some(TOKENS.env);
    }
    meant_by_another_word(&upper)
}

/// `name` in upper case, its prefix misspelt (`FLIGHT_LOG_TOKENS`, `FLIGHTLOGTOKENS`) read as
/// the right one.
fn with_prefix_mended(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    match upper
        .strip_prefix("FLIGHT_LOG_")
        .or_else(|| {
            upper
                .strip_prefix("FLIGHTLOG")
                .filter(|rest| !rest.starts_with('_'))
        })
        .or_else(|| upper.strip_prefix("FLIGHT_LOG"))
    {
        Some(rest) if !rest.is_empty() => format!("FLIGHTLOG_{rest}"),
        _ => upper,
    }
}

/// The one setting variable whose name is `name` (a `FLIGHTLOG_*` name that is none) with
/// words more at its end: its unit left out (`FLIGHTLOG_PRUNE_AFTER` for
/// `FLIGHTLOG_PRUNE_AFTER_MS`, three edits away), or its last words (`FLIGHTLOG_BODY`). Such a
/// name cannot mean anything else, and ignored it costs what the operator set it against (the
/// retention's `off` above all: the detail of runs deleted after 30 days), so `serve` refuses
/// to start beside it. `None` when no setting, or several (`FLIGHTLOG_JOURNAL_MAX`: see
/// [`settings_with_more_words`]), extend it.
pub fn setting_with_more_words(name: &str) -> Option<&'static str> {
    match settings_with_more_words(name).as_slice() {
        [only] => Some(only),
        _ => None,
    }
}

/// Every setting variable whose name is `name` with words more at its end, as
/// [`setting_with_more_words`] matches them (`FLIGHTLOG_JOURNAL_MAX`: both journal limits).
pub fn settings_with_more_words(name: &str) -> Vec<&'static str> {
    let upper = with_prefix_mended(name);
    if is_setting_variable(&upper) || upper.starts_with("FLIGHTLOG_TEST_") {
        return Vec::new();
    }
    let Some(rest) = upper.strip_prefix("FLIGHTLOG_") else {
        return Vec::new();
    };
    // Words apart by one `_` (`FLIGHTLOG__PRUNE_AFTER`), a unit of another name left out
    // (`FLIGHTLOG_PRUNE_AFTER_SECS`: the setting takes milliseconds).
    let mut words: Vec<&str> = rest.split('_').filter(|word| !word.is_empty()).collect();
    if words.len() > 1 && words.last().is_some_and(|word| OTHER_UNITS.contains(word)) {
        words.pop();
    }
    if words.is_empty() {
        return Vec::new();
    }
    let wanted = format!("FLIGHTLOG_{}", words.join("_"));
    let extended = format!("{wanted}_");
    // A setting's variable, or the name its config-file key would give
    // (`FLIGHTLOG_MAINTENANCE_PRUNE_AFTER_MS` for `maintenance.prune_after_ms`).
    SETTINGS
        .iter()
        .filter(|setting| {
            let from_key = format!(
                "FLIGHTLOG_{}",
                setting.key.replace('.', "_").to_ascii_uppercase()
            );
            setting.env == wanted
                || setting.env.starts_with(&extended)
                || (from_key != setting.env
                    && (from_key == wanted || from_key.starts_with(&extended)))
        })
        .map(|setting| setting.env)
        .chain(CONFIG_ENV.starts_with(&extended).then_some(CONFIG_ENV))
        .collect()
}

/// Units a `FLIGHTLOG_*` name may end with where its setting's takes another
/// (`FLIGHTLOG_PRUNE_AFTER_SECS`): left out when the name is matched to its setting.
const OTHER_UNITS: &[&str] = &[
    "S",
    "SEC",
    "SECS",
    "SECOND",
    "SECONDS",
    "MIN",
    "MINS",
    "MINUTE",
    "MINUTES",
    "H",
    "HOUR",
    "HOURS",
    "DAY",
    "DAYS",
    "MSEC",
    "MSECS",
    "MILLIS",
    "MILLISECONDS",
    "B",
    "BYTES",
    "KB",
    "MB",
    "KIB",
    "MIB",
];

/// The setting a `FLIGHTLOG_*` name means in other words, as other servers name theirs
/// (`FLIGHTLOG_PORT`, `FLIGHTLOG_DATABASE`, `FLIGHTLOG_GRPC_PORT`): ignored without a word, the
/// server started on its defaults (a warning names the setting now). The test suites' own variables (`FLIGHTLOG_TEST_*`) are not settings
/// and are left alone.
fn meant_by_another_word(upper: &str) -> Option<&'static str> {
    let rest = upper.strip_prefix("FLIGHTLOG_")?;
    let words: Vec<&str> = rest.split('_').filter(|word| !word.is_empty()).collect();
    let has = |candidates: &[&str]| words.iter().any(|word| candidates.contains(word));
    if words.first() == Some(&"TEST") {
        return None;
    }
    if has(&["GRPC"]) {
        return Some(GRPC_ADDR.env);
    }
    if has(&["DURABLE", "FSYNC", "SYNC", "SYNCHRONOUS"]) {
        return Some(DURABILITY.env);
    }
    if has(&["BODY"]) {
        return Some(BODY_LIMIT.env);
    }
    if has(&["CONFIG", "CONF", "TOML"]) {
        return Some(CONFIG_ENV);
    }
    if has(&["CLOCK"]) {
        return Some(MANUAL_CLOCK.env);
    }
    if has(&["DATABASE", "SQLITE", "DBPATH", "DBFILE"]) || rest == "DB_PATH" || rest == "DB_FILE" {
        return Some(DB.env);
    }
    if has(&["PORT", "HOST", "LISTEN", "BIND", "ADDRESS"]) {
        return Some(ADDR.env);
    }
    None
}

/// `name`'s value in `env`, unless unset or blank.
fn env_value<'e>(env: &'e BTreeMap<String, String>, name: &str) -> Option<&'e str> {
    env.get(name)
        .map(String::as_str)
        .filter(|text| !text.trim().is_empty())
}

/// A TOML value as a config file writes it (a table or an array shortened).
fn toml_text(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        Value::Integer(number) => number.to_string(),
        // As written: `10.0` is a float, where `10` would read as the integer it is not.
        Value::Float(number) if number.is_nan() => "nan".to_owned(),
        Value::Float(number) if number.is_infinite() => if number.is_sign_negative() {
            "-inf"
        } else {
            "inf"
        }
        .to_owned(),
        Value::Float(number) => format!("{number:?}"),
        Value::Boolean(switch) => switch.to_string(),
        Value::Datetime(datetime) => datetime.to_string(),
        Value::Array(_) => "[…]".to_owned(),
        Value::Table(_) => "{…}".to_owned(),
    }
}

fn invalid(origin: &Origin<'_>, value: &str, fix: &str) -> SettingsError {
    SettingsError::Invalid {
        origin: origin.to_string(),
        value: value.to_owned(),
        fix: fix.to_owned(),
    }
}

/// Whether a `--token` secret is written as `SECRET:SCOPES`, the form of `FLIGHTLOG_TOKENS`:
/// taken whole, it would be a token with every scope where fewer were meant (an audit's finding).
/// Read as `FLIGHTLOG_TOKENS` reads an entry: a trailing `;` ends it, blank scope names are
/// skipped (`x:read,` and `x:read;` are scoped there too).
fn looks_scoped(secret: &str) -> bool {
    let entry = secret.trim().trim_end_matches([';', ' ']);
    entry.rsplit_once(':').is_some_and(|(_, scopes)| {
        let names: Vec<&str> = scopes
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
            .collect();
        !names.is_empty() && names.iter().all(|name| Scope::parse(name).is_some())
    })
}

fn token_error(origin: String, err: &TokenError) -> SettingsError {
    SettingsError::Token {
        origin,
        problem: err.to_string(),
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A TOML scalar as the text a flag would hold; `None` for arrays and tables.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Integer(n) => Some(n.to_string()),
        Value::Float(x) => Some(x.to_string()),
        Value::Boolean(b) => Some(b.to_string()),
        Value::Datetime(d) => Some(d.to_string()),
        Value::Array(_) | Value::Table(_) => None,
    }
}

/// Whether a database path ends with a path separator (`./data/`) or with `.` or `..`: it
/// names a folder, and SQLite would create a file called `data` (or refuse, when the folder
/// exists). An existing folder named without a separator is refused when the database opens.
fn names_a_folder(path: &Path) -> bool {
    let bytes = path.as_os_str().as_encoded_bytes();
    bytes.ends_with(b"/")
        || (cfg!(windows) && bytes.ends_with(b"\\"))
        || matches!(
            path.components().next_back(),
            Some(std::path::Component::CurDir | std::path::Component::ParentDir)
        )
}

/// The fix for a database path that names a folder.
fn folder_not_file(text: &str) -> String {
    let folder = text.trim_end_matches(['/', '\\']);
    format!(
        "it ends with a path separator, so it names a folder: give the path of a database file, \
         such as {folder}/flightlog.db"
    )
}

/// `HOST:PORT` with a numeric port and a non-empty host (resolved only at start). An IPv6
/// address is written in brackets (`[::1]:4318`): `::1:4318` is itself an IPv6 address, so
/// reading its last group as the port would be a guess.
fn parse_addr(text: &str) -> Option<String> {
    let (host, port) = text.rsplit_once(':')?;
    if host.is_empty() || host.contains(char::is_whitespace) {
        return None;
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return None;
    }
    port.parse::<u16>().ok()?;
    Some(text.to_owned())
}

/// An instance name: 1 to 64 of `[A-Za-z0-9._:-]`. A server's writer identity is
/// `serve:<instance>/pid:<pid>:<start-ms>`, and at boot it closes the open spans of every
/// earlier `serve:<instance>/` identity; `/` cannot occur in a name, so no instance's prefix is
/// another's.
pub fn parse_instance(text: &str) -> Option<String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    (!text.is_empty() && text.len() <= 64 && text.chars().all(allowed)).then(|| text.to_owned())
}

/// The instance name when none is set: this host's name (its characters outside an instance
/// name's replaced by `-`, at most 48 of them) and the HTTP listener's port. Two servers on one
/// host cannot listen on one port, so they never share it.
pub fn default_instance(host_name: &str, port: u16) -> String {
    let mut host: String = host_name
        .trim()
        .chars()
        .take(48)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if host.is_empty() {
        host.push_str("localhost");
    }
    format!("{host}:{port}")
}

/// The writer-identity prefix of every life of `instance` (see [`parse_instance`]).
pub fn instance_life_prefix(instance: &str) -> String {
    format!("serve:{instance}/")
}

fn parse_durability(text: &str) -> Option<Durability> {
    if text.eq_ignore_ascii_case("normal") {
        Some(Durability::Normal)
    } else if text.eq_ignore_ascii_case("full") {
        Some(Durability::Full)
    } else {
        None
    }
}

/// A byte size: plain bytes, or a whole number with `B`, `KiB`, `MiB` or `GiB` (any case).
pub fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let lower = text.to_ascii_lowercase();
    let (digits, unit) = [
        ("kib", 1u64 << 10),
        ("mib", 1 << 20),
        ("gib", 1 << 30),
        ("b", 1),
    ]
    .into_iter()
    .find_map(|(suffix, unit)| lower.strip_suffix(suffix).map(|digits| (digits, unit)))
    .unwrap_or((lower.as_str(), 1));
    let digits = digits.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let bytes = digits.parse::<u64>().ok()?.checked_mul(unit)?;
    usize::try_from(bytes).ok().filter(|bytes| *bytes >= 1)
}

/// A whole number from `min` to `max`.
fn parse_in_range(text: &str, min: u64, max: u64) -> Option<u64> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>().ok().filter(|n| (min..=max).contains(n))
}

/// `off` as `Some(None)`, anything else through `parse` (`None` when it does not parse).
fn parse_off_or<T>(text: &str, parse: impl Fn(&str) -> Option<T>) -> Option<Option<T>> {
    if text.eq_ignore_ascii_case("off") {
        return Some(None);
    }
    parse(text).map(Some)
}

/// What a yes/no setting takes on the command line and in the environment, as its error says
/// (it said "true or false" and took the rest silently; the config file takes TOML booleans).
const BOOL_VALUES: &str = "give true or false (also 1/0, yes/no, on/off)";

fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// `FLIGHTLOG_TOKENS`: `TOKEN:SCOPE[,SCOPE...]` entries separated by `;` (blank entries skipped).
///
/// A value with no entry at all (`";"`) is refused: it would replace the config file's tokens
/// with none and so switch authentication off.
fn parse_env_tokens(text: &str, auth: &mut AuthConfig) -> Result<(), SettingsError> {
    // Numbered as written, blank entries included, so "entry 3" is the third between ';'s.
    let entries = text
        .split(';')
        .map(str::trim)
        .enumerate()
        .filter(|(_, e)| !e.is_empty());
    let mut seen = 0;
    for (index, entry) in entries {
        seen += 1;
        let origin = || format!("{} entry {}", TOKENS.env, index + 1);
        if entry.contains(['\n', '\r']) {
            return Err(SettingsError::Token {
                origin: origin(),
                problem: "holds a line break: separate entries with ';' (TOKEN:SCOPE[,SCOPE...];\
                          TOKEN:SCOPE...), not with new lines"
                    .into(),
            });
        }
        let Some((secret, scopes)) = entry.rsplit_once(':') else {
            return Err(SettingsError::Token {
                origin: origin(),
                problem: "has no scopes: write TOKEN:SCOPE[,SCOPE...] with scopes read, \
                          ingest, admin, and separate entries with ';'"
                    .into(),
            });
        };
        let names: Vec<&str> = scopes
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        // The unknown name is not repeated: it may be part of a secret that holds a ':' and
        // was given no scopes; its place says which it is.
        let scopes = parse_scopes(&names).map_err(|unknown| {
            let place = names.iter().position(|name| *name == unknown).unwrap_or(0) + 1;
            SettingsError::Token {
                origin: origin(),
                problem: format!(
                    "names a scope other than read, ingest, admin (its scope number {place} \
                     after the last ':'): write TOKEN:SCOPE[,SCOPE...]"
                ),
            }
        })?;
        auth.add_token(secret.trim(), scopes)
            .map_err(|err| token_error(origin(), &err))?;
    }
    if seen == 0 {
        return Err(SettingsError::Token {
            origin: TOKENS.env.to_owned(),
            problem: "holds no token: write TOKEN:SCOPE[,SCOPE...] entries separated by ';', \
                      or unset it"
                .into(),
        });
    }
    Ok(())
}

/// The scopes `names` name, or the first name that is no scope.
fn parse_scopes<'a>(names: &[&'a str]) -> Result<Scopes, &'a str> {
    names
        .iter()
        .map(|name| Scope::parse(name).ok_or(*name))
        .collect()
}

/// The file's `[[tokens]]`: tables `{token = "...", scopes = ["read", ...]}`.
fn parse_file_tokens(
    value: &Value,
    origin: &Origin<'_>,
    auth: &mut AuthConfig,
) -> Result<(), SettingsError> {
    let shape = "write each token as a [[tokens]] table with token = \"...\" and scopes = \
                 [\"read\", \"ingest\", \"admin\"] (any of them)";
    let Value::Array(entries) = value else {
        return Err(SettingsError::Token {
            origin: origin.to_string(),
            problem: format!("is not a list of tables: {shape}"),
        });
    };
    for (index, entry) in entries.iter().enumerate() {
        let origin = || format!("{origin} entry {}", index + 1);
        let problem = |problem: &str| SettingsError::Token {
            origin: origin(),
            problem: format!("{problem}: {shape}"),
        };
        let Value::Table(table) = entry else {
            return Err(problem("is not a table"));
        };
        if let Some(key) = table.keys().find(|k| *k != "token" && *k != "scopes") {
            return Err(problem(&format!("has an unknown key `{key}`")));
        }
        let secret = match table.get("token") {
            Some(Value::String(secret)) => secret,
            Some(other) => {
                return Err(problem(&format!(
                    "has a `token` that is no string (a TOML {})",
                    other.type_str()
                )))
            }
            None => return Err(problem("has no `token` string")),
        };
        let names = match table.get("scopes") {
            Some(Value::Array(names)) => names,
            Some(other) => {
                return Err(problem(&format!(
                    "has `scopes` that is no list (a TOML {}): give a list such as [\"read\"]",
                    other.type_str()
                )))
            }
            None => return Err(problem("has no `scopes` list")),
        };
        let Some(names) = names
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<&str>>>()
        else {
            return Err(problem("has a scope that is not a string"));
        };
        let scopes = parse_scopes(&names).map_err(|unknown| {
            problem(&format!(
                "names the scope {unknown:?}; the scopes are read, ingest, admin"
            ))
        })?;
        auth.add_token(secret, scopes)
            .map_err(|err| token_error(origin(), &err))?;
    }
    // As an empty FLIGHTLOG_TOKENS is refused: an empty list switches authentication off, which
    // is better said by having no `tokens` key at all.
    if entries.is_empty() {
        return Err(SettingsError::Token {
            origin: origin.to_string(),
            problem: format!("holds no token: {shape}, or remove the key"),
        });
    }
    Ok(())
}

/// Whether `addr` only reaches this machine (IPv4 127/8, IPv6 `::1`, or `::ffff:127.x.y.z`).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(v4) => v4.ip().is_loopback(),
        SocketAddr::V6(v6) => {
            v6.ip().is_loopback() || v6.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// The start-up guard: listening on `addrs` (what the address resolved to) without any token is
/// refused when one of them is not loopback, unless `allow_unauthenticated_non_loopback`.
pub fn check_exposure(
    addrs: &[SocketAddr],
    auth: &AuthConfig,
    allow_unauthenticated_non_loopback: bool,
) -> Result<(), SettingsError> {
    if auth.is_enabled() || allow_unauthenticated_non_loopback {
        return Ok(());
    }
    match addrs.iter().find(|addr| !is_loopback(addr)) {
        Some(addr) => Err(SettingsError::UnauthenticatedNonLoopback { addr: *addr }),
        None => Ok(()),
    }
}
