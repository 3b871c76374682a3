//! Settings resolution without touching the process: the environment is a map, the config file
//! is parsed from text (or a temporary file where reading it is the point).

use std::collections::BTreeMap;
use std::path::Path;

use super::*;

const FILE: &str = "/etc/flightlog/flightlog.toml";

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

fn file(text: &str) -> ConfigFile {
    ConfigFile::parse(Path::new(FILE), text).expect("a valid config file")
}

/// How a case sets its setting through a flag.
type SetFlag = fn(&mut ServeFlags);
/// What a case reads back from the resolved settings.
type Read = fn(&ServeSettings) -> String;

/// One setting's value through each layer, and what each layer must resolve to.
struct Case {
    setting: Setting,
    set_flag: SetFlag,
    env: &'static str,
    file: &'static str,
    read: Read,
    /// What `read` gives with: nothing, the file, file + env, file + env + flag.
    expected: [&'static str; 4],
}

fn token_scopes(settings: &ServeSettings) -> String {
    let auth = &settings.server.auth;
    ["flag-token", "env-token", "file-token"]
        .iter()
        .map(|token| format!("{token}={:?}", auth.scopes_of(token)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            setting: DB,
            set_flag: |f| f.db = Some("flag.db".into()),
            env: "env.db",
            file: r#"db = "file.db""#,
            read: |s| s.db.display().to_string(),
            expected: [
                "flightlog.db",
                "/etc/flightlog/file.db",
                "env.db",
                "flag.db",
            ],
        },
        Case {
            setting: ADDR,
            set_flag: |f| f.addr = Some("127.0.0.1:3".into()),
            env: "127.0.0.1:2",
            file: r#"addr = "127.0.0.1:1""#,
            read: |s| s.addr.clone(),
            expected: [
                "127.0.0.1:4318",
                "127.0.0.1:1",
                "127.0.0.1:2",
                "127.0.0.1:3",
            ],
        },
        Case {
            setting: GRPC_ADDR,
            set_flag: |f| f.grpc_addr = Some("127.0.0.1:13".into()),
            env: "off",
            file: r#"grpc_addr = "127.0.0.1:11""#,
            read: |s| format!("{:?}", s.grpc_addr),
            expected: [
                "Some(\"127.0.0.1:4317\")",
                "Some(\"127.0.0.1:11\")",
                "None",
                "Some(\"127.0.0.1:13\")",
            ],
        },
        Case {
            setting: DURABILITY,
            set_flag: |f| f.durability = Some("full".into()),
            env: "NORMAL",
            file: r#"durability = "full""#,
            read: |s| format!("{:?}", s.durability),
            expected: ["Normal", "Full", "Normal", "Full"],
        },
        Case {
            setting: BODY_LIMIT,
            set_flag: |f| f.body_limit = Some("1KiB".into()),
            env: "2048",
            file: r#"body_limit = "3MiB""#,
            read: |s| s.server.body_limit.to_string(),
            expected: ["8388608", "3145728", "2048", "1024"],
        },
        Case {
            setting: RESPONSE_BUDGET,
            set_flag: |f| f.response_budget = Some("1MiB".into()),
            env: "65536",
            file: "response_budget = 3145728",
            read: |s| s.server.response_budget_bytes.to_string(),
            expected: ["268435456", "3145728", "65536", "1048576"],
        },
        Case {
            setting: REQUEST_BUDGET,
            set_flag: |f| f.request_budget = Some("2MiB".into()),
            env: "4096",
            file: r#"request_budget = "5MiB""#,
            read: |s| s.server.request_budget_bytes.to_string(),
            expected: ["67108864", "5242880", "4096", "2097152"],
        },
        Case {
            setting: MAX_INFLIGHT_WRITES,
            set_flag: |f| f.max_inflight_writes = Some("3".into()),
            env: "2",
            file: "max_inflight_writes = 1",
            read: |s| s.server.max_inflight_writes.to_string(),
            expected: ["4096", "1", "2", "3"],
        },
        Case {
            setting: MAX_CONNECTIONS,
            set_flag: |f| f.max_connections = Some("30".into()),
            env: "20",
            file: "max_connections = 10",
            read: |s| s.server.max_connections.to_string(),
            expected: ["4096", "10", "20", "30"],
        },
        Case {
            setting: JOURNAL_MAX_EVENTS,
            set_flag: |f| f.journal_max_events = Some("13".into()),
            env: "12",
            file: "[journal]\nmax_events = 11",
            read: |s| s.retention.max_events_per_engagement.to_string(),
            expected: ["10000", "11", "12", "13"],
        },
        Case {
            setting: JOURNAL_MAX_AGE_MS,
            set_flag: |f| f.journal_max_age_ms = Some("23".into()),
            env: "22",
            file: "journal.max_age_ms = 21",
            read: |s| s.retention.max_age_ms.to_string(),
            expected: ["2592000000", "21", "22", "23"],
        },
        Case {
            setting: WRITE_LOCK_WAIT_MS,
            set_flag: |f| f.write_lock_wait_ms = Some("0".into()),
            env: "2500",
            file: "write_lock_wait_ms = 600000",
            read: |s| s.write_lock_wait.as_millis().to_string(),
            expected: ["10000", "600000", "2500", "0"],
        },
        Case {
            setting: INSTANCE,
            set_flag: |f| f.instance = Some("flag-1".into()),
            env: "env.2",
            file: r#"instance = "file:3""#,
            read: |s| format!("{:?}", s.instance),
            expected: [
                "None",
                "Some(\"file:3\")",
                "Some(\"env.2\")",
                "Some(\"flag-1\")",
            ],
        },
        Case {
            setting: ALLOW_UNAUTHENTICATED_NON_LOOPBACK,
            set_flag: |f| f.allow_unauthenticated_non_loopback = Some("true".into()),
            env: "false",
            file: "allow_unauthenticated_non_loopback = true",
            read: |s| s.allow_unauthenticated_non_loopback.to_string(),
            expected: ["false", "true", "false", "true"],
        },
        Case {
            setting: MANUAL_CLOCK,
            set_flag: |f| f.manual_clock = Some("true".into()),
            env: "false",
            file: "manual_clock = true",
            read: |s| s.manual_clock.to_string(),
            expected: ["false", "true", "false", "true"],
        },
        Case {
            setting: MAINTENANCE_EVERY_MS,
            set_flag: |f| f.maintenance_every_ms = Some("20".into()),
            env: "off",
            file: "[maintenance]\nevery_ms = 1000",
            read: |s| format!("{:?}", s.maintenance.every),
            expected: ["None", "Some(Some(1s))", "Some(None)", "Some(Some(20ms))"],
        },
        Case {
            setting: STALE_AFTER_MS,
            set_flag: |f| f.stale_after_ms = Some("OFF".into()),
            env: "5000",
            file: "maintenance.stale_after_ms = 4000",
            read: |s| format!("{:?}", s.maintenance.stale_after_ms),
            expected: ["Some(7200000)", "Some(4000)", "Some(5000)", "None"],
        },
        Case {
            setting: STUCK_AFTER_MS,
            set_flag: |f| f.stuck_after_ms = Some("7".into()),
            env: "off",
            file: "[maintenance]\nstuck_after_ms = \"off\"",
            read: |s| format!("{:?}", s.maintenance.stuck_after_ms),
            expected: ["Some(3600000)", "None", "None", "Some(7)"],
        },
        Case {
            setting: PRUNE_AFTER_MS,
            set_flag: |f| f.prune_after_ms = Some("off".into()),
            env: "86400000",
            file: "maintenance.prune_after_ms = 1",
            read: |s| format!("{:?}", s.maintenance.prune_after_ms),
            expected: ["Some(2592000000)", "Some(1)", "Some(86400000)", "None"],
        },
        Case {
            setting: TOKENS,
            set_flag: |f| f.tokens = vec!["flag-token".into()],
            env: "env-token:read,ingest",
            file: "[[tokens]]\ntoken = \"file-token\"\nscopes = [\"admin\"]",
            read: token_scopes,
            expected: [
                "flag-token=None env-token=None file-token=None",
                "flag-token=None env-token=None file-token=Some({\"admin\"})",
                "flag-token=None env-token=Some({\"read\", \"ingest\"}) file-token=None",
                "flag-token=Some({\"read\", \"ingest\", \"admin\"}) env-token=None \
                 file-token=None",
            ],
        },
    ]
}

#[test]
fn each_setting_takes_the_flag_then_the_environment_then_the_file_then_the_default() {
    let cases = cases();
    // Every setting of the file is covered.
    for setting in SETTINGS {
        assert!(
            cases.iter().any(|case| case.setting == setting),
            "no precedence case for {setting:?}"
        );
    }
    for case in cases {
        let name = case.setting.env;
        let mut flags = ServeFlags::default();
        let file = file(case.file);
        let with_env = env(&[(name, case.env)]);
        let layers = [
            resolve_with_file(&flags, &BTreeMap::new(), None),
            resolve_with_file(&flags, &BTreeMap::new(), Some(&file)),
            resolve_with_file(&flags, &with_env, Some(&file)),
            {
                (case.set_flag)(&mut flags);
                resolve_with_file(&flags, &with_env, Some(&file))
            },
        ];
        for (layer, (resolved, expected)) in layers.iter().zip(case.expected).enumerate() {
            let got = resolved
                .as_ref()
                .map(case.read)
                .unwrap_or_else(|err| panic!("{name}, layer {layer}: {err}"));
            assert_eq!(got, expected, "{name}, layer {layer}");
        }
    }
}

/// The two switches take `=false` on the command line, over a `true` from the environment or
/// the config file; anything but a boolean is refused with the switch named.
#[test]
fn a_switch_given_false_overrides_a_true_below_it() {
    let with_env = env(&[
        ("FLIGHTLOG_MANUAL_CLOCK", "true"),
        ("FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK", "true"),
    ]);
    let flags = ServeFlags {
        manual_clock: Some("false".into()),
        allow_unauthenticated_non_loopback: Some("false".into()),
        ..ServeFlags::default()
    };
    let settings = resolve_with_file(&flags, &with_env, None).expect("false resolves");
    assert!(!settings.manual_clock);
    assert!(!settings.allow_unauthenticated_non_loopback);

    let flags = ServeFlags {
        manual_clock: Some("maybe".into()),
        ..ServeFlags::default()
    };
    let err = resolve_with_file(&flags, &BTreeMap::new(), None)
        .expect_err("maybe is not a boolean")
        .to_string();
    assert!(err.contains("--manual-clock"), "{err}");
    assert!(err.contains("true or false"), "{err}");
}

#[test]
fn defaults_are_the_documented_ones() {
    let settings = resolve_with_file(&ServeFlags::default(), &BTreeMap::new(), None)
        .expect("defaults resolve");
    assert_eq!(
        settings,
        ServeSettings {
            db: PathBuf::from("flightlog.db"),
            addr: "127.0.0.1:4318".into(),
            grpc_addr: Some("127.0.0.1:4317".into()),
            durability: Durability::Normal,
            write_lock_wait: std::time::Duration::from_secs(10),
            server: ServerConfig::default(),
            retention: RetentionConfig::default(),
            instance: None,
            allow_unauthenticated_non_loopback: false,
            manual_clock: false,
            maintenance: MaintenanceSettings {
                every: None,
                stale_after_ms: Some(7_200_000),
                stuck_after_ms: Some(3_600_000),
                prune_after_ms: Some(2_592_000_000),
                journal_prune: true,
            },
            config_file: None,
        }
    );
    assert!(!settings.server.auth.is_enabled());
    assert_eq!(settings.server.max_inflight_writes, 4096);
    assert_eq!(settings.server.max_connections, 4096);
}

#[test]
fn a_blank_environment_variable_counts_as_unset() {
    let file = file("addr = \"127.0.0.1:9\"\n[[tokens]]\ntoken = \"t\"\nscopes = [\"read\"]");
    let env = env(&[("FLIGHTLOG_ADDR", ""), ("FLIGHTLOG_TOKENS", "  ")]);
    let settings = resolve_with_file(&ServeFlags::default(), &env, Some(&file))
        .expect("blank variables are ignored");
    assert_eq!(settings.addr, "127.0.0.1:9");
    assert!(settings.server.auth.is_enabled(), "the file's token stays");
}

#[test]
fn a_token_variable_with_no_entry_is_refused_rather_than_switching_auth_off() {
    let file = file("[[tokens]]\ntoken = \"t\"\nscopes = [\"read\"]");
    for text in [";", " ; ;"] {
        let env = env(&[("FLIGHTLOG_TOKENS", text)]);
        let err = resolve_with_file(&ServeFlags::default(), &env, Some(&file))
            .expect_err("a token list with no token");
        let message = err.to_string();
        assert!(message.contains("FLIGHTLOG_TOKENS"), "{message}");
        assert!(message.contains("holds no token"), "{message}");
    }
}

#[test]
fn an_empty_token_list_in_the_file_is_refused_rather_than_switching_auth_off() {
    let file = file("tokens = []");
    let err = resolve_with_file(&ServeFlags::default(), &BTreeMap::new(), Some(&file))
        .expect_err("a token list with no token");
    let message = err.to_string();
    assert!(message.contains("`tokens` in"), "{message}");
    assert!(message.contains("holds no token"), "{message}");
    assert!(message.contains("remove the key"), "{message}");
}

/// A bad value in a lower-precedence source is refused even while a higher one overrides it:
/// it would otherwise stop the server the day the override goes.
#[test]
fn an_overridden_value_is_checked_all_the_same() {
    let flags = ServeFlags {
        body_limit: Some("1MiB".into()),
        durability: Some("full".into()),
        tokens: vec!["flag-token-secret".into()],
        ..ServeFlags::default()
    };
    /// The config file's text, the environment, and the source the refusal must name.
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case<'_>; 5] = [
        ("body_limit = \"bogus\"", &[], "`body_limit` in"),
        (
            "",
            &[("FLIGHTLOG_BODY_LIMIT", "8 parsecs")],
            "FLIGHTLOG_BODY_LIMIT",
        ),
        (
            "durability = \"fsync\"",
            &[("FLIGHTLOG_DURABILITY", "normal")],
            "`durability` in",
        ),
        (
            "[[tokens]]\ntoken = \"\"\nscopes = [\"nope\"]",
            &[],
            "`tokens` in",
        ),
        (
            "",
            &[("FLIGHTLOG_TOKENS", "secret-without-scopes")],
            "FLIGHTLOG_TOKENS",
        ),
    ];
    for (text, variables, named) in cases {
        let err = resolve_with_file(&flags, &env(variables), Some(&file(text)))
            .expect_err("an overridden bad value");
        let message = err.to_string();
        assert!(message.contains(named), "{text} {variables:?}: {message}");
    }
    // The database path too, under --db.
    let with_db = ServeFlags {
        db: Some("flag.db".into()),
        ..ServeFlags::default()
    };
    let err = resolve_with_file(&with_db, &BTreeMap::new(), Some(&file("db = 5")))
        .expect_err("a database path that is no string");
    assert!(err.to_string().contains("`db` in"), "{err}");
    // Valid overridden values stay overridden.
    let settings = resolve_with_file(
        &flags,
        &env(&[("FLIGHTLOG_BODY_LIMIT", "2MiB")]),
        Some(&file("body_limit = \"4MiB\"\ndurability = \"normal\"")),
    )
    .expect("valid values");
    assert_eq!(settings.server.body_limit, 1 << 20);
    assert_eq!(settings.durability, Durability::Full);
}

#[test]
fn the_config_flag_wins_over_the_config_variable_and_a_missing_file_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let from_flag = dir.path().join("flag.toml");
    let from_env = dir.path().join("env.toml");
    std::fs::write(&from_flag, "addr = \"127.0.0.1:1\"").expect("write");
    std::fs::write(&from_env, "addr = \"127.0.0.1:2\"").expect("write");
    let env_names_file = env(&[("FLIGHTLOG_CONFIG", &from_env.to_string_lossy())]);

    let settings = resolve(&ServeFlags::default(), &env_names_file).expect("resolves");
    assert_eq!(settings.addr, "127.0.0.1:2");
    assert_eq!(settings.config_file.as_deref(), Some(from_env.as_path()));

    let flags = ServeFlags {
        config: Some(from_flag.clone()),
        ..ServeFlags::default()
    };
    let settings = resolve(&flags, &env_names_file).expect("resolves");
    assert_eq!(settings.addr, "127.0.0.1:1");

    let missing = env(&[("FLIGHTLOG_CONFIG", "/nonexistent/flightlog.toml")]);
    let err = resolve(&ServeFlags::default(), &missing).expect_err("missing file");
    let message = err.to_string();
    assert!(
        message.contains("/nonexistent/flightlog.toml") && message.contains("FLIGHTLOG_CONFIG"),
        "{message}"
    );
    assert!(message.contains("check the path"), "{message}");

    // The variable's file is checked while the flag overrides it: missing, or with a bad key.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "adress = \"127.0.0.1:2\"").expect("write");
    for (named, expected) in [
        (
            PathBuf::from("/nonexistent/flightlog.toml"),
            "/nonexistent/flightlog.toml",
        ),
        (bad.clone(), "adress"),
    ] {
        let overridden = env(&[("FLIGHTLOG_CONFIG", &named.to_string_lossy())]);
        let err = resolve(&flags, &overridden).expect_err("a bad overridden file");
        let message = err.to_string();
        assert!(
            message.contains(expected) && message.contains(&*named.to_string_lossy()),
            "{message}"
        );
    }
}

/// How a bad-value case feeds its value in.
enum Input {
    Flags(Box<ServeFlags>),
    Env(&'static str, &'static str),
    File(&'static str),
}

fn resolve_input(input: Input) -> Result<ServeSettings, SettingsError> {
    match input {
        Input::Flags(flags) => resolve_with_file(flags.as_ref(), &BTreeMap::new(), None),
        Input::Env(name, value) => {
            resolve_with_file(&ServeFlags::default(), &env(&[(name, value)]), None)
        }
        Input::File(text) => match ConfigFile::parse(Path::new(FILE), text) {
            Ok(file) => resolve_with_file(&ServeFlags::default(), &BTreeMap::new(), Some(&file)),
            Err(err) => Err(err),
        },
    }
}

#[test]
fn bad_values_name_the_setting_where_it_was_given_and_the_fix() {
    let flags = |set: fn(&mut ServeFlags)| {
        let mut flags = ServeFlags::default();
        set(&mut flags);
        Input::Flags(Box::new(flags))
    };
    let cases: Vec<(Input, &[&str])> = vec![
        (
            Input::Env("FLIGHTLOG_BODY_LIMIT", "8MB"),
            &["FLIGHTLOG_BODY_LIMIT", "\"8MB\"", "8MiB"],
        ),
        (
            Input::Env("FLIGHTLOG_BODY_LIMIT", "0"),
            &["FLIGHTLOG_BODY_LIMIT", "at least 1 byte"],
        ),
        (
            Input::Env("FLIGHTLOG_RESPONSE_BUDGET", "-1"),
            &["FLIGHTLOG_RESPONSE_BUDGET", "\"-1\"", "256MiB"],
        ),
        (
            Input::Env("FLIGHTLOG_REQUEST_BUDGET", "lots"),
            &["FLIGHTLOG_REQUEST_BUDGET", "\"lots\"", "64MiB"],
        ),
        // Too large is said to be too large, not too small.
        (
            Input::Env("FLIGHTLOG_RESPONSE_BUDGET", "99999999999GiB"),
            &["FLIGHTLOG_RESPONSE_BUDGET", "at most 1024GiB"],
        ),
        (
            flags(|f| f.durability = Some("fast".into())),
            &["--durability", "\"fast\"", "normal", "full"],
        ),
        (
            flags(|f| f.addr = Some("localhost".into())),
            &["--addr", "HOST:PORT"],
        ),
        (
            flags(|f| f.max_inflight_writes = Some("many".into())),
            &["--max-inflight-writes", "1 to 1000000"],
        ),
        (
            Input::File("max_inflight_writes = 0"),
            &[
                "`max_inflight_writes` in /etc/flightlog/flightlog.toml",
                "1 to 1000000",
            ],
        ),
        (
            Input::Env("FLIGHTLOG_WRITE_LOCK_WAIT_MS", "600001"),
            &["FLIGHTLOG_WRITE_LOCK_WAIT_MS", "from 0 to 600000"],
        ),
        (
            flags(|f| f.write_lock_wait_ms = Some("-1".into())),
            &["--write-lock-wait-ms", "\"-1\"", "milliseconds"],
        ),
        (
            Input::Env("FLIGHTLOG_INSTANCE", "a/b"),
            &["FLIGHTLOG_INSTANCE", "\"a/b\"", "1 to 64 letters"],
        ),
        (
            flags(|f| f.instance = Some("x".repeat(65))),
            &["--instance", "1 to 64 letters"],
        ),
        (
            Input::File("instance = \"\""),
            &[
                "`instance` in /etc/flightlog/flightlog.toml",
                "1 to 64 letters",
            ],
        ),
        (
            Input::Env("FLIGHTLOG_JOURNAL_MAX_AGE_MS", "-5"),
            &["FLIGHTLOG_JOURNAL_MAX_AGE_MS", "milliseconds"],
        ),
        (
            Input::Env("FLIGHTLOG_JOURNAL_MAX_EVENTS", "1e4"),
            &["FLIGHTLOG_JOURNAL_MAX_EVENTS", "whole number"],
        ),
        (
            Input::Env("FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK", "maybe"),
            &[
                "FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK",
                "true or false",
            ],
        ),
        (
            Input::File("[journal]\nmax_events = \"lots\""),
            &["`journal.max_events` in", "(a TOML string)", "TOML integer"],
        ),
        (
            Input::File("[journal]\nmax_events = -1"),
            &["`journal.max_events` in", "whole number"],
        ),
        (
            Input::File("body_limit = [1]"),
            &["`body_limit` in", "(a TOML array)", "TOML string"],
        ),
        // The file is typed: a value of another type is not read as its text.
        (
            Input::File("db = true"),
            &["`db` in", "(a TOML boolean)", "TOML string"],
        ),
        (
            Input::File("max_inflight_writes = 4096.0"),
            &[
                "`max_inflight_writes` in",
                "is 4096.0 (a TOML float)",
                "TOML integer",
            ],
        ),
        (
            Input::File("max_inflight_writes = \"4096\""),
            &[
                "`max_inflight_writes` in",
                "(a TOML string)",
                "TOML integer",
            ],
        ),
        (
            Input::File("allow_unauthenticated_non_loopback = 1"),
            &["`allow_unauthenticated_non_loopback` in", "TOML boolean"],
        ),
        (
            Input::File("bodylimit = 5"),
            &["unknown key `bodylimit`", "body_limit", "--help"],
        ),
        (
            Input::File("[journal]\nmax_event = 5"),
            &["unknown key `journal.max_event`", "journal.max_events"],
        ),
        (
            Input::File("addr = "),
            &["/etc/flightlog/flightlog.toml", "not valid TOML", "line 1"],
        ),
    ];
    for (input, needles) in cases {
        let err = resolve_input(input).expect_err(needles[0]);
        let message = err.to_string();
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in: {message}");
        }
    }
}

#[test]
fn token_errors_say_how_to_write_tokens_and_never_repeat_the_secret() {
    let cases: Vec<(Input, &[&str])> = vec![
        (
            Input::Env("FLIGHTLOG_TOKENS", "ok-secret:read;topsecret"),
            &["FLIGHTLOG_TOKENS entry 2", "TOKEN:SCOPE"],
        ),
        (
            Input::Env("FLIGHTLOG_TOKENS", "topsecret:reed"),
            &["FLIGHTLOG_TOKENS entry 1", "read, ingest, admin"],
        ),
        // Entries are numbered as written, blank ones included; the bad scope by its place.
        (
            Input::Env("FLIGHTLOG_TOKENS", "ok-secret:read;;topsecret:ingest,bogus"),
            &[
                "FLIGHTLOG_TOKENS entry 3",
                "scope number 2 after the last ':'",
            ],
        ),
        (
            Input::Env("FLIGHTLOG_TOKENS", "ok-secret:read\ntopsecret:ingest"),
            &[
                "FLIGHTLOG_TOKENS entry 1",
                "line break",
                "separate entries with ';'",
            ],
        ),
        (
            Input::File("[[tokens]]\ntoken = \"topsecret\"\nscopes = [\"read\", \"writer\"]"),
            &["entry 1", "names the scope \"writer\""],
        ),
        (
            Input::Env("FLIGHTLOG_TOKENS", "topsecret:"),
            &["FLIGHTLOG_TOKENS entry 1", "at least one scope"],
        ),
        (
            Input::Env("FLIGHTLOG_TOKENS", "top secret:read"),
            &["FLIGHTLOG_TOKENS entry 1", "visible ASCII"],
        ),
        (
            Input::Flags(Box::new(ServeFlags {
                tokens: vec!["fine".into(), "top\tsecret".into()],
                ..ServeFlags::default()
            })),
            &["--token (the 2nd)", "visible ASCII"],
        ),
        (
            Input::File("[[tokens]]\ntoken = \"topsecret\"\nscopes = [\"root\"]"),
            &[
                "`tokens` in /etc/flightlog/flightlog.toml entry 1",
                "scopes = [",
            ],
        ),
        (
            Input::File("[[tokens]]\ntoken = \"topsecret\""),
            &["entry 1", "no `scopes` list"],
        ),
        (
            Input::File("[[tokens]]\nsecret = \"topsecret\"\nscopes = [\"read\"]"),
            &["entry 1", "unknown key `secret`"],
        ),
        (
            Input::File("tokens = \"topsecret\""),
            &["not a list of tables"],
        ),
        (
            Input::Env("FLIGHTLOG_TOKENS", "topsecret:read;topsecret:admin"),
            &["FLIGHTLOG_TOKENS entry 2", "configured twice"],
        ),
        (
            Input::File(
                "[[tokens]]\ntoken = \"topsecret\"\nscopes = [\"read\"]\n\
                 [[tokens]]\ntoken = \"topsecret\"\nscopes = [\"admin\"]",
            ),
            &["entry 2", "configured twice"],
        ),
        (
            Input::Flags(Box::new(ServeFlags {
                tokens: vec!["topsecret".into(), "topsecret".into()],
                ..ServeFlags::default()
            })),
            &["--token (the 2nd)", "configured twice"],
        ),
    ];
    for (input, needles) in cases {
        let err = resolve_input(input).expect_err(needles[0]);
        let message = err.to_string();
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in: {message}");
        }
        assert!(!message.contains("topsecret"), "leaks the token: {message}");
        assert!(
            !message.contains("top secret"),
            "leaks the token: {message}"
        );
    }
}

#[test]
fn environment_tokens_take_several_scoped_entries() {
    let env = env(&[(
        "FLIGHTLOG_TOKENS",
        " reader:read,admin ; agent:read, ingest;ops:admin;with:colon:ingest; ",
    )]);
    let settings = resolve_with_file(&ServeFlags::default(), &env, None).expect("valid token list");
    let auth = &settings.server.auth;
    assert_eq!(auth.token_count(), 4);
    let scopes = |names: &[Scope]| Some(names.iter().copied().collect::<Scopes>());
    assert_eq!(
        auth.scopes_of("reader"),
        scopes(&[Scope::Read, Scope::Admin])
    );
    assert_eq!(
        auth.scopes_of("agent"),
        scopes(&[Scope::Read, Scope::Ingest])
    );
    assert_eq!(auth.scopes_of("ops"), scopes(&[Scope::Admin]));
    assert_eq!(auth.scopes_of("with:colon"), scopes(&[Scope::Ingest]));
    assert_eq!(auth.scopes_of("nobody"), None);
    assert!(!format!("{settings:?}").contains("reader"));
}

#[test]
fn sizes_take_bytes_or_binary_units() {
    let cases = [
        ("1", Some(1)),
        ("8388608", Some(8_388_608)),
        ("512KiB", Some(512 * 1024)),
        ("8MiB", Some(8 << 20)),
        ("8 mib", Some(8 << 20)),
        ("1GiB", Some(1 << 30)),
        ("100B", Some(100)),
        ("0", None),
        ("8MB", None),
        ("-1", None),
        ("1.5MiB", None),
        ("MiB", None),
        ("", None),
        ("99999999999999999999GiB", None),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_size(text), expected, "{text:?}");
    }
}

#[test]
fn the_flags_debug_output_hides_the_tokens() {
    let flags = ServeFlags {
        tokens: vec!["hunter2".into()],
        ..ServeFlags::default()
    };
    let debug = format!("{flags:?}");
    assert!(
        !debug.contains("hunter2") && debug.contains("1 redacted"),
        "{debug}"
    );
}

#[test]
fn each_file_setting_takes_its_toml_type() {
    let settings = resolve_input(Input::File(
        "db = \"a.db\"\nbody_limit = 2048\nmax_inflight_writes = 7\n\
         allow_unauthenticated_non_loopback = true\n[journal]\nmax_events = 9\nmax_age_ms = 60000",
    ))
    .expect("every value of its type");
    assert_eq!(settings.server.body_limit, 2048);
    assert_eq!(settings.server.max_inflight_writes, 7);
    assert!(settings.allow_unauthenticated_non_loopback);
    assert_eq!(settings.retention.max_events_per_engagement, 9);
    assert_eq!(settings.retention.max_age_ms, 60_000);
    let settings = resolve_input(Input::File("body_limit = \"2KiB\"")).expect("a size text");
    assert_eq!(settings.server.body_limit, 2048);
}

#[test]
fn the_default_instance_is_the_host_and_port_in_instance_characters() {
    assert_eq!(
        default_instance("build-7.example.org", 4318),
        "build-7.example.org:4318"
    );
    assert_eq!(default_instance(" odd host/name\n", 80), "odd-host-name:80");
    assert_eq!(default_instance("", 1), "localhost:1");
    let long = default_instance(&"h".repeat(300), 65535);
    assert_eq!(long.len(), 48 + 6);
    for name in [long, default_instance("ünïcode", 9)] {
        assert_eq!(
            parse_instance(&name).as_deref(),
            Some(name.as_str()),
            "{name}"
        );
    }
    assert_eq!(instance_life_prefix("a:1"), "serve:a:1/");
}

#[test]
fn a_misspelled_variable_is_matched_to_the_setting_it_was_meant_to_be() {
    assert_eq!(meant_variable("FLIGHTLOG_TOKEN"), Some("FLIGHTLOG_TOKENS"));
    assert_eq!(meant_variable("flightlog_tokens"), Some("FLIGHTLOG_TOKENS"));
    assert_eq!(meant_variable("FLIGHTLOG_ADR"), Some("FLIGHTLOG_ADDR"));
    assert_eq!(meant_variable("FLIGHTLOG_CONFG"), Some("FLIGHTLOG_CONFIG"));
    assert_eq!(meant_variable("FLIGHTLOG_TOKENS"), None, "a setting itself");
    // Other servers' words for a setting (an audit found them ignored without a word).
    for (other, meant) in [
        ("FLIGHTLOG_PORT", "FLIGHTLOG_ADDR"),
        ("FLIGHTLOG_HOST", "FLIGHTLOG_ADDR"),
        ("FLIGHTLOG_HTTP_LISTEN", "FLIGHTLOG_ADDR"),
        ("FLIGHTLOG_DATABASE", "FLIGHTLOG_DB"),
        ("FLIGHTLOG_DB_PATH", "FLIGHTLOG_DB"),
        ("FLIGHTLOG_SQLITE_FILE", "FLIGHTLOG_DB"),
        ("FLIGHTLOG_GRPC", "FLIGHTLOG_GRPC_ADDR"),
        ("FLIGHTLOG_GRPC_PORT", "FLIGHTLOG_GRPC_ADDR"),
        ("FLIGHTLOG_CONFIG_FILE", "FLIGHTLOG_CONFIG"),
        ("FLIGHTLOG_CLOCK", "FLIGHTLOG_MANUAL_CLOCK"),
    ] {
        assert_eq!(meant_variable(other), Some(meant), "{other}");
    }
    // The test suites' own variables are not settings misspelt.
    for own in [
        "FLIGHTLOG_TEST_DATABASE_URL",
        "FLIGHTLOG_TEST_AUTH_TOKEN",
        "FLIGHTLOG_BENCH_DB",
        "FLIGHTLOG_CONFORMANCE_DIR",
        "FLIGHTLOG_OTLP_CLIENTS_DIR",
        "FLIGHTLOG_STREAM_CHILD_DB",
        "FLIGHTLOG_FUZZ_SEED",
    ] {
        assert_eq!(meant_variable(own), None, "{own}");
    }
    for far in ["FLIGHTLOG_API_TOKEN", "FLIGHTLOG_AUTH", "FLIGHTLOG_SECRET"] {
        assert_eq!(meant_variable(far), Some("FLIGHTLOG_TOKENS"), "{far}");
    }
    for far in ["FLIGHTLOG_API_KEY", "FLIGHTLOG_PASSWORD"] {
        assert_eq!(meant_variable(far), Some("FLIGHTLOG_TOKENS"), "{far}");
    }
    // The prefix misspelt.
    assert_eq!(
        meant_variable("FLIGHT_LOG_TOKENS"),
        Some("FLIGHTLOG_TOKENS")
    );
    assert_eq!(meant_variable("FLIGHTLOGTOKENS"), Some("FLIGHTLOG_TOKENS"));
    assert_eq!(meant_variable("FlightLog_Db"), Some("FLIGHTLOG_DB"));
    assert_eq!(meant_variable("FLIGHT_LOGADDR"), Some("FLIGHTLOG_ADDR"));
    // Three edits and more from every name until the prefix is read as the right one.
    assert_eq!(
        meant_variable("FLIGHT_LOG_BODYLIMT"),
        Some("FLIGHTLOG_BODY_LIMIT")
    );
    assert_eq!(
        meant_variable("FLIGHTLOGJOURNAL_MAX_EVNTS"),
        Some("FLIGHTLOG_JOURNAL_MAX_EVENTS")
    );
    assert_eq!(meant_variable("FLIGHTLOG_TEST_DATABASE_URL"), None);
    assert_eq!(meant_variable("FLIGHTLOG_OTLP_CLIENTS_DIR"), None);
    // A unit left out, or the last words: the one setting that extends it.
    for (shortened, meant) in [
        ("FLIGHTLOG_PRUNE_AFTER", "FLIGHTLOG_PRUNE_AFTER_MS"),
        ("FLIGHTLOG_WRITE_LOCK_WAIT", "FLIGHTLOG_WRITE_LOCK_WAIT_MS"),
        ("FLIGHTLOG_BODY", "FLIGHTLOG_BODY_LIMIT"),
        ("FLIGHTLOG_STUCK_AFTER_", "FLIGHTLOG_STUCK_AFTER_MS"),
        // The prefix misspelt too.
        ("FLIGHT_LOG_PRUNE_AFTER", "FLIGHTLOG_PRUNE_AFTER_MS"),
        ("FlightLogPrune_After", "FLIGHTLOG_PRUNE_AFTER_MS"),
        ("FLIGHTLOG__PRUNE_AFTER", "FLIGHTLOG_PRUNE_AFTER_MS"),
        // Another unit, and the names the config file's keys would give.
        ("FLIGHTLOG_PRUNE_AFTER_SECS", "FLIGHTLOG_PRUNE_AFTER_MS"),
        ("FLIGHTLOG_BODY_LIMIT_BYTES", "FLIGHTLOG_BODY_LIMIT"),
        (
            "FLIGHTLOG_MAINTENANCE_PRUNE_AFTER_MS",
            "FLIGHTLOG_PRUNE_AFTER_MS",
        ),
        (
            "FLIGHTLOG_MAINTENANCE_PRUNE_AFTER",
            "FLIGHTLOG_PRUNE_AFTER_MS",
        ),
        ("FLIGHTLOG_JOURNAL_MAX_AGE", "FLIGHTLOG_JOURNAL_MAX_AGE_MS"),
    ] {
        assert_eq!(meant_variable(shortened), Some(meant), "{shortened}");
        assert_eq!(
            setting_with_more_words(shortened),
            Some(meant),
            "{shortened}"
        );
    }
    // The project's own variables (tests, benchmarks, CI) are never taken for settings.
    for own in [
        "FLIGHTLOG_TEST_DATABASE_URL",
        "FLIGHTLOG_BENCH_DB",
        "FLIGHTLOG_CONFORMANCE_DIR",
        "FLIGHTLOG_OTLP_CLIENTS_DIR",
        "FLIGHTLOG_STREAM_CHILD_DB",
        "FLIGHTLOG_FUZZ_SEED",
        "FLIGHTLOG_JOURNAL_TEST_DB",
        "FLIGHTLOG_JOURNAL_TEST_ARG",
        "FLIGHTLOG_JOURNAL_TEST_CHILD",
        "FLIGHTLOG_JOURNAL_TEST_SEED",
        "FLIGHTLOG_STREAM_CHILD_JOURNAL_DB",
        "FLIGHTLOG_STREAM_CHILD_PRUNE_DB",
        "FLIGHTLOG_TEST_BINARY",
        "FLIGHTLOG_TEST_TAG",
        "FLIGHTLOG_TABLES",
    ] {
        assert_eq!(setting_with_more_words(own), None, "{own}");
    }
    for ambiguous in [
        "FLIGHTLOG_JOURNAL_MAX",
        "FLIGHTLOG_MAX",
        "FLIGHTLOG_",
        "FLIGHTLOG_TEST",
    ] {
        assert_eq!(setting_with_more_words(ambiguous), None, "{ambiguous}");
    }
    assert_eq!(setting_with_more_words("FLIGHTLOG_PRUNE_AFTER_MS"), None);
    // Other words for two settings (an audit's examples).
    assert_eq!(
        meant_variable("FLIGHTLOG_DURABLE"),
        Some("FLIGHTLOG_DURABILITY")
    );
    assert_eq!(
        meant_variable("FLIGHTLOG_MAX_BODY"),
        Some("FLIGHTLOG_BODY_LIMIT")
    );
    // A near miss of a setting holding `AUTH` is that setting, not the token list.
    assert_eq!(
        meant_variable("FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBAK"),
        Some("FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK")
    );
    assert!(is_setting_variable("FLIGHTLOG_CONFIG"));
    assert!(is_setting_variable("FLIGHTLOG_JOURNAL_MAX_AGE_MS"));
    assert!(!is_setting_variable("FLIGHTLOG_TOKEN"));
}

#[test]
fn a_body_limit_above_the_otlp_inflate_limit_raises_it() {
    let flags = ServeFlags {
        body_limit: Some("128MiB".into()),
        ..ServeFlags::default()
    };
    let settings = resolve_with_file(&flags, &env(&[]), None).expect("valid");
    assert_eq!(settings.server.otlp_max_decompressed, 128 << 20);
    let settings = resolve_with_file(&ServeFlags::default(), &env(&[]), None).expect("valid");
    assert_eq!(
        settings.server.otlp_max_decompressed,
        ServerConfig::DEFAULT_OTLP_MAX_DECOMPRESSED
    );
}

/// `serve --help` once printed one of its paragraphs twice (an edit applied twice): no sentence
/// of the help may repeat.
#[test]
fn the_config_help_says_each_thing_once() {
    let text = CONFIG_HELP.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut seen = std::collections::BTreeSet::new();
    for sentence in text.split(". ").filter(|sentence| sentence.len() > 30) {
        assert!(seen.insert(sentence), "said twice: {sentence:?}");
    }
}

/// The scheduled maintenance runs every minute by default, never by default on a manual clock
/// (whose time moves only when a test says), and on either whenever `every_ms` is set; `off`
/// runs none.
#[test]
fn maintenance_runs_by_default_except_on_a_manual_clock_unless_asked() {
    let resolve_env = |pairs: &[(&str, &str)]| {
        resolve_with_file(&ServeFlags::default(), &env(pairs), None).expect("valid settings")
    };
    let defaults = resolve_env(&[]).maintenance;
    assert_eq!(defaults.plan(false), Some(MaintenancePlan::DEFAULT));
    assert_eq!(defaults.plan(true), None);

    let asked = resolve_env(&[("FLIGHTLOG_MAINTENANCE_EVERY_MS", "50")]).maintenance;
    let plan = asked
        .plan(true)
        .expect("a plan on the manual clock when asked");
    assert_eq!(plan.every, Duration::from_millis(50));
    assert_eq!(plan.stale_after_ms, MaintenancePlan::DEFAULT.stale_after_ms);

    let off = resolve_env(&[("FLIGHTLOG_MAINTENANCE_EVERY_MS", "off")]).maintenance;
    assert_eq!(off.plan(false), None);
    assert_eq!(off.plan(true), None);

    let no_stale = resolve_env(&[("FLIGHTLOG_STALE_AFTER_MS", "off")]).maintenance;
    let plan = no_stale.plan(false).expect("the other steps still run");
    assert_eq!(plan.stale_after_ms, None);
    assert!(plan.journal_prune);

    // The journal's retention off: no scheduled journal prune, and the endpoint's prune
    // removes nothing either (no age is old enough).
    let keep = resolve_env(&[("FLIGHTLOG_JOURNAL_MAX_AGE_MS", "off")]);
    let plan = keep
        .maintenance
        .plan(false)
        .expect("the other steps still run");
    assert!(!plan.journal_prune);
    assert_eq!(plan.prune_after_ms, MaintenancePlan::DEFAULT.prune_after_ms);
    assert_eq!(keep.retention.max_age_ms, i64::MAX);
    // Even at the latest time a clock can say, the cutoff is before the earliest `at`.
    let latest = 9_007_199_254_740_991_i64;
    assert!(latest.saturating_sub(keep.retention.max_age_ms) < -latest);
}

/// Out-of-range and malformed maintenance values are refused, naming the setting and the fix.
#[test]
fn bad_maintenance_values_are_refused_with_the_fix() {
    for (name, value, fix) in [
        ("FLIGHTLOG_MAINTENANCE_EVERY_MS", "5", "from 10 to 86400000"),
        (
            "FLIGHTLOG_MAINTENANCE_EVERY_MS",
            "86400001",
            "from 10 to 86400000",
        ),
        ("FLIGHTLOG_MAINTENANCE_EVERY_MS", "1m", "or `off`"),
        (
            "FLIGHTLOG_STALE_AFTER_MS",
            "0",
            "from 1 to 9007199254740991",
        ),
        ("FLIGHTLOG_STALE_AFTER_MS", "-1", "or `off`"),
        ("FLIGHTLOG_STUCK_AFTER_MS", "never", "or `off`"),
        ("FLIGHTLOG_PRUNE_AFTER_MS", "9007199254740992", "to keep it"),
    ] {
        let err = resolve_with_file(&ServeFlags::default(), &env(&[(name, value)]), None)
            .expect_err(value);
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("{name} = {value:?} is not valid")),
            "{message}"
        );
        assert!(message.contains(fix), "{message}");
    }
    let file = file("[maintenance]\nstale_after_ms = true");
    let err = resolve_with_file(&ServeFlags::default(), &BTreeMap::new(), Some(&file))
        .expect_err("a boolean");
    assert!(
        err.to_string().contains("maintenance.stale_after_ms"),
        "{err}"
    );
}

/// `"journal.max_events" = 7` beside `[journal] max_events = 9` is valid TOML (two keys), and
/// one of the two values was dropped without a word (an audit's finding): refused, naming the
/// key. Either form alone is taken.
#[test]
fn a_setting_given_twice_in_the_config_file_is_refused() {
    for text in [
        "\"journal.max_events\" = 7\n[journal]\nmax_events = 9\n",
        "\"maintenance.every_ms\" = 1000\nmaintenance = { every_ms = 2000 }\n",
    ] {
        match ConfigFile::parse(Path::new(FILE), text) {
            Err(err @ SettingsError::DuplicateKey { .. }) => {
                let message = err.to_string();
                assert!(
                    message.contains("twice") && message.contains("keep one"),
                    "{message}"
                );
            }
            other => panic!("{text:?} was not refused as a key given twice: {other:?}"),
        }
    }
    let err = ConfigFile::parse(
        Path::new(FILE),
        "\"journal.max_events\" = 7\n[journal]\nmax_events = 9\n",
    )
    .expect_err("refused")
    .to_string();
    assert!(err.contains("`journal.max_events` twice"), "{err}");
    file("\"journal.max_events\" = 7\n");
    file("[journal]\nmax_events = 9\n");
}

/// Found by an audit: `FLIGHTLOG_DB="/data/real.db "` (an env file keeping a trailing space)
/// opened a new, empty `real.db ` beside the real file. A database path that begins or ends
/// with white space is refused from the flag, the variable and the file, naming where it came
/// from; other settings' values are trimmed.
#[test]
fn a_database_path_padded_with_white_space_is_refused() {
    let padded = [" /data/real.db", "/data/real.db ", "/data/real.db\t"];
    for text in padded {
        let flags = ServeFlags {
            db: Some(PathBuf::from(text)),
            ..ServeFlags::default()
        };
        let err = resolve(&flags, &env(&[]))
            .expect_err("refused from the flag")
            .to_string();
        assert!(err.contains("--db") && err.contains("white space"), "{err}");
        let err = resolve(&ServeFlags::default(), &env(&[("FLIGHTLOG_DB", text)]))
            .expect_err("refused from the variable")
            .to_string();
        assert!(
            err.contains("FLIGHTLOG_DB") && err.contains("white space"),
            "{err}"
        );
    }
    let resolved = resolve(
        &ServeFlags::default(),
        &env(&[
            ("FLIGHTLOG_DB", "/data/real.db"),
            ("FLIGHTLOG_INSTANCE", "i1 "),
        ]),
    )
    .expect("no padding");
    assert_eq!(resolved.db, PathBuf::from("/data/real.db"));
}

/// Found by an audit: `--db ./data/` made a file called `data`; `--grpc-addr OFF` was refused
/// while every other `off` takes any case; `::1:4731` was read as `[::1]:4731`, though it is an
/// IPv6 address of its own.
#[test]
fn a_folder_path_an_upper_case_off_and_an_unbracketed_ipv6_address() {
    for (flags, env) in [
        (
            ServeFlags {
                db: Some(PathBuf::from("./data/")),
                ..ServeFlags::default()
            },
            env(&[]),
        ),
        (ServeFlags::default(), env(&[("FLIGHTLOG_DB", "data/")])),
        (
            ServeFlags {
                db: Some(PathBuf::from("./data/..")),
                ..ServeFlags::default()
            },
            env(&[]),
        ),
    ] {
        let err = resolve(&flags, &env)
            .expect_err("a folder is refused")
            .to_string();
        assert!(err.contains("flightlog.db"), "{err}");
        assert!(err.contains("names a folder"), "{err}");
    }
    for off in ["OFF", "Off", " off "] {
        let flags = ServeFlags {
            grpc_addr: Some(off.into()),
            ..ServeFlags::default()
        };
        let resolved = resolve(&flags, &env(&[])).expect("off in any case");
        assert_eq!(resolved.grpc_addr, None, "{off}");
    }
    let flags = ServeFlags {
        addr: Some("::1:4731".into()),
        ..ServeFlags::default()
    };
    let err = resolve(&flags, &env(&[]))
        .expect_err("ambiguous")
        .to_string();
    assert!(err.contains("[::1]:4318"), "{err}");
    for fine in ["[::1]:4731", "127.0.0.1:4731", "localhost:0"] {
        let flags = ServeFlags {
            addr: Some(fine.into()),
            ..ServeFlags::default()
        };
        assert_eq!(resolve(&flags, &env(&[])).expect("fine").addr, fine);
    }
}

/// An unknown config key names what was most likely meant (an audit: `journal = 5` was only
/// "an unknown key", though `journal` is a section; `bodylimit` listed every key).
#[test]
fn an_unknown_config_key_says_what_was_meant() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("flightlog.toml");
    for (text, hint) in [
        ("journal = 5", "`journal` is a section: write `[journal]`"),
        ("bodylimit = \"8MiB\"", "did you mean `body_limit`?"),
        ("Body-Limit = \"8MiB\"", "did you mean `body_limit`?"),
        (
            "[journal]\nmax_event = 5",
            "did you mean `journal.max_events`?",
        ),
        (
            "[maintenance]\nstale_after = 5",
            "did you mean `maintenance.stale_after_ms`?",
        ),
        ("max_events = 5", "did you mean `journal.max_events`?"),
        ("[jornal]\nmax_events = 5", "did you mean `[journal]`?"),
    ] {
        std::fs::write(&path, text).expect("write config");
        let env = env(&[("FLIGHTLOG_CONFIG", path.to_str().expect("utf-8 path"))]);
        let err = resolve(&ServeFlags::default(), &env)
            .expect_err("an unknown key is refused")
            .to_string();
        assert!(err.contains(hint), "{text}: {err}");
    }
    std::fs::write(&path, "colour = 5").expect("write config");
    let env = env(&[("FLIGHTLOG_CONFIG", path.to_str().expect("utf-8 path"))]);
    let err = resolve(&ServeFlags::default(), &env)
        .expect_err("refused")
        .to_string();
    assert!(!err.contains("did you mean"), "{err}");
}

/// The start-up line names durability, the body limit, the journal's cap and the write-lock
/// wait as they were resolved, from whichever source.
#[test]
fn the_storage_settings_are_described_as_resolved() {
    let defaults = resolve_with_file(&ServeFlags::default(), &env(&[]), None).expect("defaults");
    assert_eq!(
        defaults.describe_storage(),
        "durability normal (commits survive a crash of this process); request bodies up to \
         8 MiB; journals of up to 10000 events each; a write waits up to 10 s for another \
         process's write lock"
    );
    let chosen = resolve_with_file(
        &ServeFlags {
            durability: Some("full".into()),
            body_limit: Some("1536KiB".into()),
            ..ServeFlags::default()
        },
        &env(&[
            ("FLIGHTLOG_JOURNAL_MAX_EVENTS", "50"),
            ("FLIGHTLOG_WRITE_LOCK_WAIT_MS", "250"),
        ]),
        None,
    )
    .expect("valid settings");
    assert_eq!(
        chosen.describe_storage(),
        "durability full (commits survive power loss); request bodies up to 1536 KiB; journals \
         of up to 50 events each; a write waits up to 250 ms for another process's write lock"
    );
    // 0, as the reference's maxEventsPerEngagement 0 (a journal-full fixture): no append.
    let read_only = resolve_with_file(
        &ServeFlags {
            journal_max_events: Some("0".into()),
            ..ServeFlags::default()
        },
        &env(&[]),
        None,
    )
    .expect("valid settings");
    assert_eq!(read_only.retention.max_events_per_engagement, 0);
    assert!(
        read_only
            .describe_storage()
            .contains("journals read-only (journal.max_events 0: every append refused)"),
        "{}",
        read_only.describe_storage()
    );
    assert_eq!(describe_bytes(1000), "1000 bytes");
    assert_eq!(describe_bytes(2 << 30), "2 GiB");
}
