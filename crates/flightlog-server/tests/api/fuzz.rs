//! A bounded, deterministic robustness ("fuzz") test of the HTTP API, checking the repository
//! rule "bad input gets a clear error (HTTP status plus the error body of the contract), never a
//! panic, and never loses what was already stored" on one real server.
//!
//! It stores a run and an engagement first, then sends a few thousand requests derived from
//! valid ones with a seeded xorshift generator: every write endpoint of the contract (and the
//! testing clock) gets bodies with dropped fields, wrong JSON types, huge and odd numbers, long,
//! unicode and control-character strings, deep nesting, duplicated keys, truncated or non-JSON
//! text, invalid UTF-8, empty bodies and wrong content types, and bad path ids; every read
//! endpoint gets bad path ids and bad query strings. Every answer must be 2xx or 4xx (never 5xx,
//! never a dropped or hung connection), every 4xx must carry the contract's
//! `{"error": {"code", "message"}}` body with the code of its status, and a body that cannot be
//! valid must be refused. Afterwards the stored run and engagement must read back exactly as
//! before, and the server must still answer `/healthz` and stop cleanly.
//!
//! The stored data is out of reach of valid maintenance calls by construction (an open run of
//! `cron` origin written as the server's own writer, which the fuzzed `sweep-stale` calls act
//! as, an engagement that never ages out), so any
//! change to it would be input that should have been refused losing data. The numbers of
//! requests per endpoint and the status histogram are printed (`--nocapture` shows them).
//!
//! The defects it found (arrays read as structs, a `Last-Event-ID` overflow, stored values too
//! deep for reads, repeated members in batch ops) are fixed; their minimal reproductions stay at
//! the end of this file as regression tests.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flightlog_core::journal::RetentionConfig;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::Method;
use serde_json::{json, Map, Value};

use crate::support::{
    assert_no_fuzz_failures, contract_error_problem, fuzz_seed, segment, Options, Rng, TestServer,
    SERVER_WRITER,
};

/// The fixed seed: the same requests on every run (`FLIGHTLOG_FUZZ_SEED` explores others).
const SEED: u64 = 0x5eed_f1a6_2024_0001;
/// Mutated requests per write endpoint.
const WRITE_ROUNDS: usize = 150;
/// Mutated requests per read endpoint (streams get fewer: each one opens a live stream).
const READ_ROUNDS: usize = 45;
const STREAM_ROUNDS: usize = 15;
/// Longer than any answer of this server takes; past it the request counts as hung.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A placeholder string replaced in the serialized body by raw text (serde_json writes the
/// control characters as `\u0001`).
const RAW_MARK: &str = "\u{1}raw\u{1}";
const RAW_MARK_JSON: &str = "\"\\u0001raw\\u0001\"";
const DUP_MARK: &str = "\u{1}dup\u{1}";
const DUP_MARK_JSON: &str = "\"\\u0001dup\\u0001\"";

/// What an answer must be beyond the general rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Anything 2xx or 4xx.
    Any,
    /// A 4xx: the body cannot be valid (malformed JSON, a wrong content type, …).
    Refused,
}

/// One request to send.
struct Probe {
    /// The endpoint, for the counts (`POST /v1/activity/spans`).
    endpoint: String,
    method: Method,
    /// Path and query, already percent-encoded as they go on the wire.
    path: String,
    content_type: Option<HeaderValue>,
    headers: Vec<(&'static str, HeaderValue)>,
    body: Option<Vec<u8>>,
    /// How the request was derived, for the failure report.
    what: String,
    expect: Expect,
}

impl Probe {
    /// A plain `GET` of what the fuzzing left behind.
    fn read_back(path: String) -> Self {
        Self {
            endpoint: "(read back)".into(),
            method: Method::GET,
            what: format!("read back {path}"),
            path,
            content_type: None,
            headers: Vec::new(),
            body: None,
            expect: Expect::Any,
        }
    }
}

/// How a write endpoint uses its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyUse {
    /// A JSON body is required.
    Required,
    /// An empty body is also valid (heartbeat, OTLP).
    Optional,
    /// The endpoint reads no body (rollup, compact, sweep-orphans): only its path is fuzzed.
    Ignored,
}

/// A write endpoint (its method and path) and how to build a valid request for it.
struct WriteEndpoint {
    method: Method,
    /// The path; `{id}` is replaced by one of `ids` (or, sometimes, by a bad id).
    path: &'static str,
    ids: &'static [&'static str],
    body: BodyUse,
    /// A valid body; `n` makes new ids unique.
    valid: fn(u64, &mut Rng) -> Value,
}

/// A read endpoint (`GET` and its path), its valid ids and its query parameters.
struct ReadEndpoint {
    path: &'static str,
    ids: &'static [&'static str],
    /// A valid query string, the starting point of the mutated ones.
    valid_query: &'static str,
    params: &'static [&'static str],
    rounds: usize,
}

/// Spans the patch, event and heartbeat fuzzing writes to. The `fz-pool-*` spans stay open all
/// along (an open `cron` run of the server's own writer: no sweep reaches it, nothing closes it),
/// so valid requests keep doing real writes; `fz-root` may be closed by the fuzzing.
const FUZZ_POOL: &[&str] = &[
    "fz-pool-0",
    "fz-pool-1",
    "fz-pool-2",
    "fz-pool-3",
    "fz-root",
    "fz-missing",
];
/// Spans the end fuzzing ends (run `fz-run-d`).
const FUZZ_ENDS: &[&str] = &[
    "fz-end-0",
    "fz-end-1",
    "fz-end-2",
    "fz-end-3",
    "fz-end-4",
    "fz-end-5",
    "fz-end-6",
    "fz-end-7",
    "fz-missing",
];
/// Runs the close and rollup fuzzing acts on (not the pool's `fz-run-b`).
const FUZZ_RUNS: &[&str] = &["fz-run-a", "fz-run-c", "fz-run-d", "fz-run-missing"];
const FUZZ_ENGAGEMENTS: &[&str] = &["fz-eng-1", "fz-eng-2", "fz-eng-missing"];
const NO_IDS: &[&str] = &[];
const READ_SPANS: &[&str] = &[
    "keep-root",
    "keep-child",
    "keep-open",
    "fz-root",
    "fz-pool-1",
];
const READ_RUNS: &[&str] = &["keep-run", "fz-run-a", "fz-run-b", "fz-run-c", "fz-run-d"];
const READ_ENGAGEMENTS: &[&str] = &["keep-eng", "fz-eng-1", "fz-eng-2"];

fn usage() -> Value {
    json!({"inputTokens": 10, "outputTokens": 20, "cacheReadTokens": 3, "cacheCreationTokens": 4,
           "costUsd": 0.25, "model": "fuzz-model"})
}

fn write_endpoints() -> Vec<WriteEndpoint> {
    vec![
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/spans",
            ids: NO_IDS,
            body: BodyUse::Required,
            valid: |n, rng| {
                json!({"spanId": format!("fz-span-{n}"), "runId": rng.pick(&["fz-run-a", "fz-run-c"]),
                       "parentSpanId": "fz-root", "name": "fuzz span",
                       "kind": rng.pick(&["turn", "tool", "subagent", "cron", "model", "other"]),
                       "origin": rng.pick(&["session", "cron", "otlp"]),
                       "sessionId": "fz-session", "jobName": "fz-job",
                       "attrs": {"k": "v", "n": 1, "nested": {"list": [1, 2.5, "three"]}},
                       "startedAt": 1_000 + n})
            },
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/spans/{id}/end",
            ids: FUZZ_ENDS,
            body: BodyUse::Required,
            valid: |n, rng| {
                json!({"outcome": rng.pick(&["success", "error", "timeout", "cancelled", "denied",
                                             "interrupted"]),
                       "reason": "fuzz", "endedAt": 5_000 + n, "usage": usage(),
                       "attrs": {"ended": true}})
            },
        },
        WriteEndpoint {
            method: Method::PATCH,
            path: "/v1/activity/spans/{id}",
            ids: FUZZ_POOL,
            body: BodyUse::Required,
            valid: |n, _| {
                json!({"attrs": {"patched": n, "deep": {"a": [1, {"b": null}]}}, "usage": usage(),
                       "waitUntil": 3_000 + n})
            },
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/spans/{id}/events",
            ids: FUZZ_POOL,
            body: BodyUse::Required,
            valid: |n, _| {
                json!({"eventType": "tool.output", "payload": {"text": "hi", "n": n, "list": [1, 2]},
                       "ts": 1_500 + n})
            },
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/spans/{id}/heartbeat",
            ids: FUZZ_POOL,
            body: BodyUse::Optional,
            valid: |n, _| json!({"at": 1_600 + n}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/batch",
            ids: NO_IDS,
            body: BodyUse::Required,
            valid: |n, rng| {
                let span = format!("fz-batch-{n}");
                json!({"ops": [
                    {"op": "startSpan", "spanId": span, "runId": "fz-run-c", "name": "batched",
                     "kind": "model", "origin": rng.pick(&["session", "otlp"]), "startedAt": 10 + n,
                     "attrs": {"i": n}},
                    {"op": "appendEvent", "spanId": span, "eventType": "note", "payload": [1, "x"],
                     "ts": 11 + n},
                    {"op": "patchSpan", "spanId": span, "usage": {"inputTokens": 5},
                     "waitUntil": 20 + n},
                    {"op": "heartbeat", "spanId": span, "at": 12 + n},
                    {"op": "endSpan", "spanId": span, "outcome": "success", "endedAt": 13 + n},
                ]})
            },
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/runs/{id}/close",
            ids: FUZZ_RUNS,
            body: BodyUse::Required,
            valid: |_, rng| json!({"outcome": rng.pick(&["cancelled", "error", "success"]), "reason": "fuzz"}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/runs/{id}/rollup",
            ids: FUZZ_RUNS,
            body: BodyUse::Ignored,
            valid: |_, _| json!({}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/maintenance/sweep-orphans",
            ids: NO_IDS,
            body: BodyUse::Ignored,
            valid: |_, _| json!({}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/maintenance/sweep-stale",
            ids: NO_IDS,
            body: BodyUse::Required,
            valid: |n, _| json!({"staleAfterMs": 60_000, "now": 100_000 + n}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/activity/maintenance/prune",
            ids: NO_IDS,
            body: BodyUse::Required,
            valid: |n, _| {
                json!({"digestFloorAt": 1_000 + n, "hardCeilingMs": 500, "now": 2_000 + n,
                       "batch": 10})
            },
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/engagements/{id}/events",
            ids: FUZZ_ENGAGEMENTS,
            body: BodyUse::Required,
            valid: |n, rng| {
                let at = 10 + i64::try_from(n).unwrap_or(0);
                let mut body = match rng.below(6) {
                    0 => json!({"type": "engagement_opened", "at": at, "data": {
                        "initiator": {"id": "u1", "kind": "human"},
                        "venue": {"kind": "chat", "id": "c1"}, "entry": "agent:a"}}),
                    1 => json!({"type": "board_written", "at": at, "data": {
                        "key": "plan", "kind": "todo", "content": "c", "actor": "agent:a",
                        "status": "pending", "version": 1}}),
                    2 => json!({"type": "mail_sent", "at": at, "data": {
                        "mailId": format!("m{n}"), "kind": "ask", "from": "agent:a",
                        "to": "agent:b", "causationId": "m0"}}),
                    3 => json!({"type": "budget_charged", "at": at, "data": {
                        "usage": {"modelCalls": 1, "tokens": 100, "wallMs": 5, "sideEffects": 0}}}),
                    4 => json!({"type": "tool_called", "at": at, "data": {"actor": "agent:a"}}),
                    _ => json!({"type": "engagement_closed", "at": at, "data": {
                        "status": "completed", "reason": "done",
                        "budget": {"spent": {"tokens": 3}}}}),
                };
                if rng.percent(20) {
                    body["expectedSeq"] = json!(rng.below(4));
                }
                body
            },
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/engagements/{id}/compact",
            ids: FUZZ_ENGAGEMENTS,
            body: BodyUse::Ignored,
            valid: |_, _| json!({}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/engagements/prune",
            ids: NO_IDS,
            body: BodyUse::Required,
            valid: |n, _| json!({"now": 5_000 + n}),
        },
        WriteEndpoint {
            method: Method::POST,
            path: "/v1/traces",
            ids: NO_IDS,
            body: BodyUse::Optional,
            valid: |n, _| {
                let trace = format!("{:032x}", 0xf0_0000 + n);
                json!({"resourceSpans": [{
                    "resource": {"attributes": [
                        {"key": "service.name", "value": {"stringValue": "fuzz"}}]},
                    "scopeSpans": [{"scope": {"name": "fuzz", "version": "1"}, "spans": [
                        {"traceId": trace, "spanId": format!("{:016x}", 2 * n + 1), "name": "agent",
                         "kind": 1, "startTimeUnixNano": "1000000000", "endTimeUnixNano": "1200000000",
                         "attributes": [
                             {"key": "openinference.span.kind", "value": {"stringValue": "AGENT"}}],
                         "status": {"code": 1}},
                        {"traceId": trace, "spanId": format!("{:016x}", 2 * n + 2),
                         "parentSpanId": format!("{:016x}", 2 * n + 1), "name": "chat",
                         "kind": 3, "startTimeUnixNano": "1050000000", "endTimeUnixNano": 1_150_000_000u64,
                         "attributes": [
                             {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                             {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
                             {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}},
                             {"key": "gen_ai.usage.output_tokens", "value": {"intValue": 7}},
                             {"key": "llm.token_count.total", "value": {"doubleValue": 19.0}},
                             {"key": "flag", "value": {"boolValue": true}},
                             {"key": "list", "value": {"arrayValue": {"values": [
                                 {"stringValue": "a"}, {"intValue": "1"}]}}}],
                         "events": [{"timeUnixNano": "1100000000", "name": "token",
                                     "attributes": [{"key": "i", "value": {"intValue": "1"}}]}],
                         "status": {"code": 2, "message": "boom"}}]}]}]})
            },
        },
        WriteEndpoint {
            method: Method::PUT,
            path: "/v1/testing/clock",
            ids: NO_IDS,
            body: BodyUse::Required,
            valid: |n, _| json!({"now": 1_000 + n}),
        },
    ]
}

fn read_endpoints() -> Vec<ReadEndpoint> {
    fn read(
        path: &'static str,
        ids: &'static [&'static str],
        valid_query: &'static str,
        params: &'static [&'static str],
    ) -> ReadEndpoint {
        ReadEndpoint {
            path,
            ids,
            valid_query,
            params,
            rounds: READ_ROUNDS,
        }
    }
    let runs = &["state", "outcome", "origin", "limit", "before"];
    let page = &["after", "limit"];
    vec![
        read("/v1/activity/spans/{id}", READ_SPANS, "", &[]),
        read("/v1/activity/runs/{id}/snapshot", READ_RUNS, "", &[]),
        read("/v1/activity/runs/{id}/seq", READ_RUNS, "", &[]),
        read("/v1/activity/runs/{id}/rollup", READ_RUNS, "", &[]),
        read(
            "/v1/activity/runs",
            NO_IDS,
            "state=open&origin=cron&limit=5",
            runs,
        ),
        read("/v1/activity/changes", NO_IDS, "after=0&limit=5", page),
        read(
            "/v1/activity/changes/terminal-roots",
            NO_IDS,
            "after=0&limit=5",
            page,
        ),
        read("/v1/activity/cursor", NO_IDS, "", &[]),
        read("/v1/activity/open-roots", NO_IDS, "", &[]),
        read(
            "/v1/activity/stuck",
            NO_IDS,
            "thresholdMs=50&now=100000",
            &["thresholdMs", "now"],
        ),
        read(
            "/v1/engagements/{id}/events",
            READ_ENGAGEMENTS,
            "fromSeq=1",
            &["fromSeq"],
        ),
        read("/v1/engagements/{id}/summary", READ_ENGAGEMENTS, "", &[]),
        read(
            "/v1/engagements/{id}/board",
            READ_ENGAGEMENTS,
            "key=plan&kind=todo",
            &["key", "kind"],
        ),
        read("/v1/engagements", NO_IDS, "limit=5", &["limit"]),
        ReadEndpoint {
            rounds: READ_ROUNDS / 3,
            ..read("/healthz", NO_IDS, "", &[])
        },
        ReadEndpoint {
            rounds: READ_ROUNDS / 3,
            ..read("/metrics", NO_IDS, "", &[])
        },
        ReadEndpoint {
            rounds: STREAM_ROUNDS,
            ..read("/v1/activity/runs/{id}/stream", READ_RUNS, "", &[])
        },
        ReadEndpoint {
            rounds: STREAM_ROUNDS,
            ..read("/v1/activity/changes/stream", NO_IDS, "after=0", &["after"])
        },
        ReadEndpoint {
            rounds: STREAM_ROUNDS,
            ..read(
                "/v1/engagements/{id}/stream",
                READ_ENGAGEMENTS,
                "fromSeq=0",
                &["fromSeq"],
            )
        },
    ]
}

/// Path ids that are not (or only barely) valid ids, as they go on the wire: NUL, invalid
/// UTF-8 and bad percent-escapes, dot segments, separators, control and format characters, and
/// lengths at and past the 256-byte limit.
fn bad_ids() -> Vec<String> {
    let mut ids: Vec<String> = "%00 a%00b %FF %C3%28 %ED%A0%80 %F4%90%80%80 %C0%AF % %zz %2 .. . \
                                %2E%2E %2e a%2Fb %2F %20 + %0A %0D%0A %09 %7F null \
                                %7B%22a%22%3A1%7D %25 ~ a;b=c %3F %23 %E2%80%AE %EF%BB%BF \
                                %F0%9F%A6%80"
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    ids.push(segment("é🦀 ünïcode ✓"));
    ids.push("x".repeat(256));
    ids.push("x".repeat(257));
    ids.push(segment(&"é".repeat(129)));
    ids.push("y".repeat(10_000));
    ids.push("%00".repeat(300));
    ids
}

/// Query values: negative, fractional, out of range (10001, 2^53, 2^63, 2^64), not numbers,
/// NUL and invalid UTF-8, cursors, some valid ones, and very long ones.
fn query_values() -> Vec<String> {
    let mut values: Vec<String> = "-1 0 1 1.5 10000 10001 abc 18446744073709551616 \
                                   9223372036854775807 9223372036854775808 -9223372036854775808 \
                                   -9223372036854775809 9007199254740992 9007199254740991 \
                                   -9007199254740992 1e3 %00 %FF %2B1 +1 %201 0x10 true null \
                                   %E2%80%AE open ended success interrupted session cron todo \
                                   note plan 1000%3Akeep-run 1: :x -5:r 99999999999999999999:r \
                                   %3A %5B%5D %7B%7D"
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    values.push(String::new());
    values.push("9".repeat(1_000));
    values.push("a".repeat(10_000));
    values
}

/// Extra query text appended as is.
const QUERY_NOISE: &[&str] = &[
    "&",
    "&&&",
    "zzz=1",
    "limit",
    "=1",
    "limit[]=1",
    "%ZZ=1",
    "a=%FF",
    "after=1&after=2",
    "%00=%00",
];

/// Header values for `Last-Event-ID` on the streams.
const LAST_EVENT_IDS: &[&str] = &[
    "-1",
    "0",
    "abc",
    "1.5",
    "99999999999999999999",
    "",
    "7",
    "9223372036854775806",
    "9223372036854775807",
    " 3 ",
];

/// One replacement value for a field: a JSON value, or raw text that is (`true`) or may be
/// (`false`) invalid JSON.
enum Wrong {
    Value(Value),
    Raw(&'static str, bool),
}

fn nested_object(depth: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..depth {
        value = json!({ "d": value });
    }
    value
}

fn nested_array(depth: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..depth {
        value = json!([value]);
    }
    value
}

/// A wrong value for any field, with a label for the report.
fn wrong_value(rng: &mut Rng) -> (String, Wrong) {
    let control: String = (0u8..0x20)
        .map(char::from)
        .chain(['\u{7f}', '\u{85}', '\u{2028}'])
        .collect();
    let (label, value) = match rng.below(48) {
        0 => ("null", Value::Null),
        1 => ("true", json!(true)),
        2 => ("false", json!(false)),
        3 => ("0", json!(0)),
        4 => ("-1", json!(-1)),
        5 => ("1.5", json!(1.5)),
        6 => ("-0.5", json!(-0.5)),
        7 => ("1e300", json!(1e300)),
        8 => ("-1e300", json!(-1e300)),
        9 => ("2^53", json!(9_007_199_254_740_992_i64)),
        10 => ("-2^53", json!(-9_007_199_254_740_992_i64)),
        11 => ("2^53-1", json!(9_007_199_254_740_991_i64)),
        12 => ("2^63", json!(9_223_372_036_854_775_808_u64)),
        13 => ("i64::MAX", json!(i64::MAX)),
        14 => ("i64::MIN", json!(i64::MIN)),
        15 => ("u64::MAX", json!(u64::MAX)),
        16 => ("f64::MAX", json!(f64::MAX)),
        17 => ("f64::MIN_POSITIVE", json!(f64::MIN_POSITIVE)),
        18 => ("empty string", json!("")),
        19 => ("\"x\"", json!("x")),
        20 => ("\"123\"", json!("123")),
        21 => ("100 KB string", json!("a".repeat(100_000))),
        22 => ("40 KB of é", json!("é".repeat(20_000))),
        23 => ("unicode", json!("é🦀\u{202e}\u{fffd}\u{10ffff}ä\u{0}z")),
        24 => ("control characters", json!(control)),
        25 => ("BOM string", json!("\u{feff}")),
        26 => ("256-byte string", json!("s".repeat(256))),
        27 => ("257-byte string", json!("s".repeat(257))),
        28 => ("129 é (258 bytes)", json!("é".repeat(129))),
        29 => ("[]", json!([])),
        30 => ("mixed array", json!([1, "a", null, {}, [true]])),
        31 => ("{}", json!({})),
        32 => ("{\"a\": 1}", json!({"a": 1})),
        33 => (
            "odd keys",
            json!({"": null, "\u{0}": "\u{0}", "é🦀": [], "a.b": {}}),
        ),
        34 => ("object nested 200 deep", nested_object(200)),
        35 => ("array nested 200 deep", nested_array(200)),
        // Deep, but within the parser's 128 levels: past the stored-value limit of 64 (see
        // `stored_values_never_make_reads_deeper_than_the_parse_limit`).
        36 => ("object nested 100 deep", nested_object(100)),
        37 => ("array nested 110 deep", nested_array(110)),
        38 => (
            "5000 numbers",
            Value::Array((0..5_000).map(Value::from).collect()),
        ),
        39 => (
            "2000 keys",
            Value::Object((0..2_000).map(|i| (format!("k{i}"), json!(i))).collect()),
        ),
        40 => return ("raw NaN".into(), Wrong::Raw("NaN", true)),
        41 => {
            let raws: &[&str] = &[
                "Infinity",
                "-Infinity",
                "01",
                "+1",
                "0x10",
                "1.",
                ".5",
                "-",
                "1e",
                "1e400",
                "-1e400",
                "tru",
                "nul",
                "'single'",
                "\"unterminated",
                "\"bad escape \\x\"",
                "\"short escape \\u12\"",
                "\"raw\ttab\"",
                "\"raw\nnewline\"",
            ];
            let raw = *rng.pick(raws);
            return (format!("raw {raw:?}"), Wrong::Raw(raw, true));
        }
        42 => {
            let raws: &[&str] = &[
                "18446744073709551616",
                "-18446744073709551617",
                "100000000000000000000000000000000000000000000000000",
                "1e-400",
                "-0",
                "-0.0",
                "1E2",
                "1.0",
                "9223372036854775807",
                "-9223372036854775808",
                "\"\\ud800\"",
                "\"\\udc00\\ud800\"",
                "\"\\u0000\"",
                "\"\\/\\b\\f\"",
            ];
            let raw = *rng.pick(raws);
            return (format!("raw {raw:?}"), Wrong::Raw(raw, false));
        }
        43 => ("\"2024-01-01T00:00:00Z\"", json!("2024-01-01T00:00:00Z")),
        44 => ("\"1e3\"", json!("1e3")),
        45 => (
            "{\"$ref\"}",
            json!({"$ref": "#/x", "__proto__": {"polluted": true}}),
        ),
        46 => ("unknown enum", json!("workflow")),
        _ => ("[valid value]", json!(["x"])),
    };
    (label.to_owned(), Wrong::Value(value))
}

/// One step of a path into a JSON value.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

fn path_text(path: &[Step]) -> String {
    let mut text = String::new();
    for step in path {
        match step {
            Step::Key(key) if text.is_empty() => text.push_str(key),
            Step::Key(key) => {
                text.push('.');
                text.push_str(key);
            }
            Step::Index(index) => text.push_str(&format!("[{index}]")),
        }
    }
    if text.is_empty() {
        "(body)".into()
    } else {
        text
    }
}

/// Every path below the root, in document order (at most a few dozen for these templates).
fn paths(value: &Value) -> Vec<Vec<Step>> {
    fn walk(value: &Value, prefix: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    prefix.push(Step::Key(key.clone()));
                    out.push(prefix.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    prefix.push(Step::Index(index));
                    out.push(prefix.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

fn get_mut<'a>(value: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, step| match step {
        Step::Key(key) => value.get_mut(key.as_str()),
        Step::Index(index) => value.get_mut(*index),
    })
}

/// Remove the value at `path` (a member of an object or an element of an array).
fn remove(value: &mut Value, path: &[Step]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    match (get_mut(value, parent), last) {
        (Some(Value::Object(map)), Step::Key(key)) => {
            map.shift_remove(key);
        }
        (Some(Value::Array(items)), Step::Index(index)) if *index < items.len() => {
            items.remove(*index);
        }
        _ => {}
    }
}

/// Paths of objects (the root included), where fields can be added.
fn object_paths(value: &Value) -> Vec<Vec<Step>> {
    let mut out: Vec<Vec<Step>> = vec![Vec::new()];
    out.extend(paths(value).into_iter().filter(|path| {
        let mut copy = value.clone();
        matches!(get_mut(&mut copy, path), Some(Value::Object(_)))
    }));
    out
}

fn to_bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("a JSON value serializes")
}

/// Replace the first occurrence of `mark` in `bytes` with `with`.
fn splice(bytes: &[u8], mark: &str, with: &[u8]) -> Vec<u8> {
    let mark = mark.as_bytes();
    match bytes.windows(mark.len()).position(|window| window == mark) {
        Some(at) => [&bytes[..at], with, &bytes[at + mark.len()..]].concat(),
        None => bytes.to_vec(),
    }
}

/// A request body derived from `valid`, its content type, what was done and what it must get.
struct Mutated {
    body: Option<Vec<u8>>,
    content_type: Option<HeaderValue>,
    headers: Vec<(&'static str, HeaderValue)>,
    what: String,
    expect: Expect,
}

fn json_type() -> Option<HeaderValue> {
    Some(HeaderValue::from_static("application/json"))
}

fn mutate(rng: &mut Rng, valid: &Value, uses: BodyUse, otlp: bool) -> Mutated {
    let mut out = Mutated {
        body: Some(to_bytes(valid)),
        content_type: json_type(),
        headers: Vec::new(),
        what: String::new(),
        expect: Expect::Any,
    };
    let all_paths = paths(valid);
    let roll = rng.below(100);
    match roll {
        0..=5 => out.what = "valid".into(),
        6..=20 if !all_paths.is_empty() => {
            let path = rng.pick(&all_paths).clone();
            let mut body = valid.clone();
            remove(&mut body, &path);
            out.what = format!("drop {}", path_text(&path));
            out.body = Some(to_bytes(&body));
        }
        6..=52 if !all_paths.is_empty() => {
            let path = rng.pick(&all_paths).clone();
            let (label, wrong) = wrong_value(rng);
            let mut body = valid.clone();
            out.what = format!("set {} = {label}", path_text(&path));
            match wrong {
                Wrong::Value(value) => {
                    if let Some(slot) = get_mut(&mut body, &path) {
                        *slot = value;
                    }
                    out.body = Some(to_bytes(&body));
                }
                Wrong::Raw(raw, invalid) => {
                    if let Some(slot) = get_mut(&mut body, &path) {
                        *slot = json!(RAW_MARK);
                    }
                    out.body = Some(splice(&to_bytes(&body), RAW_MARK_JSON, raw.as_bytes()));
                    if invalid {
                        out.expect = Expect::Refused;
                    }
                }
            }
        }
        53..=57 => {
            let targets = object_paths(valid);
            let path = rng.pick(&targets).clone();
            let (label, wrong) = wrong_value(rng);
            let value = match wrong {
                Wrong::Value(value) => value,
                Wrong::Raw(..) => json!("raw"),
            };
            let mut body = valid.clone();
            if let Some(Value::Object(map)) = get_mut(&mut body, &path) {
                map.insert("surprise".into(), value);
            }
            out.what = format!("add {}.surprise = {label}", path_text(&path));
            out.body = Some(to_bytes(&body));
        }
        58..=62 => {
            let (label, body) = match rng.below(7) {
                0 => ("null", Value::Null),
                1 => ("true", json!(true)),
                2 => ("1", json!(1)),
                3 => ("\"text\"", json!("text")),
                4 => ("[]", json!([])),
                5 => ("[valid]", json!([valid])),
                _ => ("{\"body\": valid}", json!({ "body": valid })),
            };
            out.what = format!("whole body = {label}");
            out.body = Some(to_bytes(&body));
            // `{"body": valid}` is an object with an unknown member: not always refused (OTLP
            // JSON, journal appends ignore unknown members). Every other whole body is.
            if !label.starts_with('{') {
                out.expect = Expect::Refused;
            }
        }
        63..=68 => {
            let text = to_bytes(valid);
            let at = 1 + rng.below(text.len().saturating_sub(1).max(1));
            out.what = format!("truncated to {at} of {} bytes", text.len());
            out.body = Some(text[..at.min(text.len())].to_vec());
            if at < text.len() {
                out.expect = Expect::Refused;
            }
        }
        69..=72 => {
            let targets: Vec<Vec<Step>> = object_paths(valid)
                .into_iter()
                .filter(|path| {
                    let mut copy = valid.clone();
                    matches!(get_mut(&mut copy, path), Some(Value::Object(map)) if !map.is_empty())
                })
                .collect();
            if targets.is_empty() {
                out.what = "valid (no key to duplicate)".into();
                return out;
            }
            let mut body = valid.clone();
            let path = rng.pick(&targets).clone();
            let (label, wrong) = wrong_value(rng);
            let value = match wrong {
                Wrong::Value(value) => value,
                Wrong::Raw(..) => json!(null),
            };
            let first = rng.percent(50);
            let mut key = String::new();
            if let Some(Value::Object(map)) = get_mut(&mut body, &path) {
                let keys: Vec<String> = map.keys().cloned().collect();
                key = rng.pick(&keys).clone();
                let mut rebuilt = Map::new();
                if first {
                    rebuilt.insert(DUP_MARK.into(), value);
                    rebuilt.extend(std::mem::take(map));
                } else {
                    rebuilt.extend(std::mem::take(map));
                    rebuilt.insert(DUP_MARK.into(), value);
                }
                *map = rebuilt;
            }
            let key_json = serde_json::to_string(&key).expect("a key serializes");
            out.what = format!(
                "duplicate key {}.{key} ({}) = {label}",
                path_text(&path),
                if first { "first" } else { "last" }
            );
            out.body = Some(splice(&to_bytes(&body), DUP_MARK_JSON, key_json.as_bytes()));
        }
        73..=76 => {
            let bad: &[(&str, &[u8])] = &[
                ("0xFF", &[0xff]),
                ("C3 28", &[0xc3, 0x28]),
                ("a UTF-16 surrogate (ED A0 80)", &[0xed, 0xa0, 0x80]),
                ("above U+10FFFF (F4 90 80 80)", &[0xf4, 0x90, 0x80, 0x80]),
                ("overlong / (C0 AF)", &[0xc0, 0xaf]),
                ("a cut sequence (E2 82)", &[0xe2, 0x82]),
                ("a lone continuation byte", &[0x80]),
            ];
            let (label, bytes) = *rng.pick(bad);
            let strings: Vec<Vec<Step>> = all_paths
                .iter()
                .filter(|path| {
                    let mut copy = valid.clone();
                    matches!(get_mut(&mut copy, path), Some(Value::String(_)))
                })
                .cloned()
                .collect();
            let mut body = valid.clone();
            let quoted = [b"\"x".as_slice(), bytes, b"y\""].concat();
            if strings.is_empty() || rng.percent(25) {
                // In a key instead.
                if let Value::Object(map) = &mut body {
                    map.insert(RAW_MARK.into(), json!(1));
                }
                out.what = format!("invalid UTF-8 ({label}) in a key");
            } else {
                let path = rng.pick(&strings).clone();
                if let Some(slot) = get_mut(&mut body, &path) {
                    *slot = json!(RAW_MARK);
                }
                out.what = format!("invalid UTF-8 ({label}) in {}", path_text(&path));
            }
            out.body = Some(splice(&to_bytes(&body), RAW_MARK_JSON, &quoted));
            out.expect = Expect::Refused;
        }
        77..=80 => {
            let garbage: &[(&str, &[u8])] = &[
                ("hello", b"hello"),
                ("xml", b"<?xml version=\"1.0\"?><span/>"),
                ("form", b"spanId=s1&runId=r1"),
                ("NULs", b"\0\0\0\0"),
                ("{", b"{"),
                ("}", b"}"),
                ("]]]", b"]]]"),
                ("{\"a\":}", b"{\"a\":}"),
                ("{,}", b"{,}"),
                ("{\"a\" 1}", b"{\"a\" 1}"),
                ("{'a': 1}", b"{'a': 1}"),
                ("{a: 1}", b"{a: 1}"),
                ("\"unterminated", b"\"unterminated"),
                ("protobuf-ish", &[0x0a, 0x05, 0x12, 0x03, 0x1a, 0x01, 0xff]),
                ("gzip magic", &[0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00]),
            ];
            let (label, bytes) = *rng.pick(garbage);
            out.what = format!("non-JSON body {label}");
            out.body = Some(bytes.to_vec());
            out.expect = Expect::Refused;
        }
        81..=83 => {
            out.what = "empty body".into();
            out.body = Some(Vec::new());
            if uses == BodyUse::Required {
                out.expect = Expect::Refused;
            }
        }
        84..=87 => {
            let text = to_bytes(valid);
            let (label, body): (&str, Vec<u8>) = match rng.below(6) {
                0 => ("whitespace only", b" \t\r\n ".to_vec()),
                1 => ("a BOM first", [b"\xef\xbb\xbf".as_slice(), &text].concat()),
                2 => ("trailing garbage", [text.as_slice(), b" x"].concat()),
                3 => ("two values", [text.as_slice(), &text].concat()),
                4 => {
                    let mut body = text.clone();
                    body.pop();
                    body.extend_from_slice(b",}");
                    ("a trailing comma", body)
                }
                _ => ("a NUL after it", [text.as_slice(), b"\0"].concat()),
            };
            out.what = format!("raw text: {label}");
            out.body = Some(body);
            out.expect = Expect::Refused;
        }
        88..=94 => {
            let types: &[(&str, Option<&[u8]>, bool)] = &[
                ("text/plain", Some(b"text/plain"), true),
                ("none", None, true),
                ("form", Some(b"application/x-www-form-urlencoded"), true),
                ("multipart", Some(b"multipart/form-data; boundary=x"), true),
                ("xml", Some(b"application/xml"), true),
                ("application/jsonx", Some(b"application/jsonx"), true),
                ("json", Some(b"json"), true),
                ("empty", Some(b""), true),
                ("non-ASCII bytes", Some(b"application/json\xff"), true),
                ("json;;;", Some(b"application/json;;;"), false),
                ("problem+json", Some(b"application/problem+json"), false),
                (
                    "JSON upper case",
                    Some(b"APPLICATION/JSON; charset=utf-8"),
                    false,
                ),
                ("x-protobuf", Some(b"application/x-protobuf"), false),
            ];
            let (label, value, refused) = *rng.pick(types);
            out.content_type = value.map(|v| HeaderValue::from_bytes(v).expect("a header value"));
            out.what = format!("content type {label}");
            if refused {
                out.expect = Expect::Refused;
            }
            if otlp && rng.percent(40) {
                let (label, value, refused) = *rng.pick(&[
                    ("gzip", "gzip", true),
                    ("br", "br", true),
                    ("identity", "identity", false),
                ]);
                out.content_type = json_type();
                out.headers
                    .push(("content-encoding", HeaderValue::from_static(value)));
                out.what = format!("content encoding {label} on a plain body");
                out.expect = if refused {
                    Expect::Refused
                } else {
                    Expect::Any
                };
            }
        }
        _ => {
            // A body with many members of its object replaced at once.
            let mut body = valid.clone();
            let mut labels = Vec::new();
            for path in &all_paths {
                if !rng.percent(40) {
                    continue;
                }
                let (label, wrong) = wrong_value(rng);
                if let (Some(slot), Wrong::Value(value)) = (get_mut(&mut body, path), wrong) {
                    *slot = value;
                    labels.push(format!("{} = {label}", path_text(path)));
                }
            }
            out.what = format!("set many: {}", labels.join(", "));
            out.body = Some(to_bytes(&body));
        }
    }
    if out.what.is_empty() {
        out.what = "valid (no fields to mutate)".into();
    }
    if uses == BodyUse::Ignored {
        out.expect = Expect::Any;
    }
    out
}

/// Why an error body is not the contract's `{"error": {"code", "message"}}`, if it is not.
fn error_body_problem(status: u16, bytes: &[u8]) -> Option<String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(body) => contract_error_problem(status, &body),
        Err(_) => Some("the error body is not JSON".into()),
    }
}

fn excerpt(bytes: &[u8], max: usize) -> String {
    let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned();
    if bytes.len() > max {
        format!("{shown:?}… ({} bytes)", bytes.len())
    } else {
        format!("{shown:?}")
    }
}

/// The fuzzer: the server, the generator, and what was seen.
struct Fuzz<'a> {
    server: &'a TestServer,
    rng: Rng,
    next_id: u64,
    counts: BTreeMap<String, BTreeMap<u16, usize>>,
    statuses: BTreeMap<u16, usize>,
    failures: Vec<String>,
    sent: usize,
}

impl<'a> Fuzz<'a> {
    fn new(server: &'a TestServer) -> Self {
        Self {
            server,
            rng: Rng(fuzz_seed(SEED)),
            next_id: 0,
            counts: BTreeMap::new(),
            statuses: BTreeMap::new(),
            failures: Vec::new(),
            sent: 0,
        }
    }

    fn fail(&mut self, probe: &Probe, problem: &str, answer: &str) {
        let body = probe
            .body
            .as_deref()
            .map_or("none".into(), |b| excerpt(b, 300));
        self.failures.push(format!(
            "{} [{}]\n    request: {} {} content-type={:?} body={body}\n    problem: {problem}\n    answer: {answer}",
            probe.endpoint,
            probe.what,
            probe.method,
            excerpt(probe.path.as_bytes(), 200),
            probe.content_type,
        ));
    }

    /// Send `probe`, check the answer against the rules, and return its status and JSON body
    /// (`Null` when empty or not JSON).
    async fn fire(&mut self, probe: Probe) -> Option<(u16, Value)> {
        let url = format!("{}{}", self.server.base, probe.path);
        let mut request = self.server.client.request(probe.method.clone(), url);
        if let Some(content_type) = &probe.content_type {
            request = request.header(CONTENT_TYPE, content_type.clone());
        }
        for (name, value) in &probe.headers {
            request = request.header(*name, value.clone());
        }
        if let Some(body) = &probe.body {
            request = request.body(body.clone());
        }
        self.sent += 1;
        let response = match tokio::time::timeout(REQUEST_TIMEOUT, request.send()).await {
            Err(_) => {
                self.fail(&probe, "no answer within 10 s (a hung request)", "none");
                return None;
            }
            Ok(Err(err)) => {
                let problem = format!("no HTTP answer (dropped connection?): {err:?}");
                self.fail(&probe, &problem, "none");
                return None;
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        *self
            .counts
            .entry(probe.endpoint.clone())
            .or_default()
            .entry(status)
            .or_default() += 1;
        *self.statuses.entry(status).or_default() += 1;
        let answer_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if status == 200 && answer_type.starts_with("text/event-stream") {
            // A live stream never ends: its head is the answer; dropping it closes the stream.
            return Some((status, Value::Null));
        }
        let bytes = match tokio::time::timeout(REQUEST_TIMEOUT, response.bytes()).await {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(err)) => {
                let problem = format!("the answer's body broke off: {err:?}");
                self.fail(&probe, &problem, &status.to_string());
                return None;
            }
            Err(_) => {
                self.fail(&probe, "the answer's body hung", &status.to_string());
                return None;
            }
        };
        let answer = format!("{status} {answer_type} {}", excerpt(&bytes, 300));
        let protobuf_answer = answer_type.starts_with("application/x-protobuf");
        let mut problem = None;
        if !(200..300).contains(&status) && !(400..500).contains(&status) {
            problem = Some(format!("status {status} is neither 2xx nor 4xx"));
        } else if probe.expect == Expect::Refused && status < 300 {
            problem = Some("a body that cannot be valid was accepted".to_owned());
        } else if probe.method == Method::HEAD || protobuf_answer {
            // No body to a HEAD; a protobuf request's OTLP error is a protobuf `Status`.
        } else if status >= 400 {
            problem = error_body_problem(status, &bytes);
        } else if status == 204 && !bytes.is_empty() {
            problem = Some("a 204 with a body".into());
        } else if !bytes.is_empty()
            && !probe.path.starts_with("/metrics")
            && serde_json::from_slice::<Value>(&bytes).is_err()
        {
            problem = Some("a 2xx body that is not JSON".into());
        }
        if let Some(problem) = problem {
            self.fail(&probe, &problem, &answer);
        }
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Some((status, body))
    }

    fn fill_id(
        &mut self,
        path: &str,
        ids: &[&str],
        bad_ids: &[String],
        bad_percent: u64,
    ) -> (String, String) {
        if !path.contains("{id}") {
            return (path.to_owned(), String::new());
        }
        if ids.is_empty() || self.rng.percent(bad_percent) {
            let id = self.rng.pick(bad_ids).clone();
            let what = format!("path id {}", excerpt(id.as_bytes(), 40));
            (path.replace("{id}", &id), what)
        } else {
            let id = *self.rng.pick(ids);
            (path.replace("{id}", id), String::new())
        }
    }

    /// One mutated request to a write endpoint.
    fn write_probe(&mut self, endpoint: &WriteEndpoint, bad_ids: &[String]) -> Probe {
        self.next_id += 1;
        let valid = (endpoint.valid)(self.next_id, &mut self.rng);
        let (path, path_what) = self.fill_id(endpoint.path, endpoint.ids, bad_ids, 12);
        let otlp = endpoint.path == "/v1/traces";
        let mut mutated = mutate(&mut self.rng, &valid, endpoint.body, otlp);
        if endpoint.path == "/v1/activity/maintenance/sweep-stale" {
            // A sweep spares the runs of the writer it acts as, and no one's when told no
            // writer: the kept run is the server's own writer's, so the sweep names that one,
            // as a writer sweeping everyone else's runs does.
            mutated
                .headers
                .push(("flightlog-writer", HeaderValue::from_static(SERVER_WRITER)));
        }
        if endpoint.body == BodyUse::Ignored && self.rng.percent(50) {
            mutated.body = None;
            mutated.content_type = None;
            mutated.what = "no body".into();
        }
        if !path_what.is_empty() {
            mutated.what = format!("{path_what}; {}", mutated.what);
            // The bad id decides the answer (a 4xx, or a 2xx where it decodes to a valid id).
            mutated.expect = Expect::Any;
        }
        Probe {
            endpoint: format!("{} {}", endpoint.method, endpoint.path),
            method: endpoint.method.clone(),
            path,
            content_type: mutated.content_type,
            headers: mutated.headers,
            body: mutated.body,
            what: mutated.what,
            expect: mutated.expect,
        }
    }

    /// One request to a read endpoint with a mutated id and query.
    fn read_probe(
        &mut self,
        endpoint: &ReadEndpoint,
        bad_ids: &[String],
        values: &[String],
    ) -> Probe {
        let (mut path, mut what) = self.fill_id(endpoint.path, endpoint.ids, bad_ids, 40);
        // From the valid query: set, drop or repeat parameters, and sometimes add noise.
        let mut query: Vec<String> = endpoint
            .valid_query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(str::to_owned)
            .collect();
        if !endpoint.params.is_empty() && self.rng.percent(85) {
            for _ in 0..=self.rng.below(3) {
                let name = *self.rng.pick(endpoint.params);
                let value = self.rng.pick(values).clone();
                let existing = query
                    .iter()
                    .position(|pair| pair.split('=').next() == Some(name));
                match (existing, self.rng.below(4)) {
                    (Some(at), 0) => {
                        query.remove(at);
                    }
                    (Some(at), 1 | 2) => query[at] = format!("{name}={value}"),
                    _ => query.push(format!("{name}={value}")),
                }
            }
        }
        if self.rng.percent(20) {
            query.push((*self.rng.pick(QUERY_NOISE)).to_owned());
        }
        if !query.is_empty() {
            let query = query.join("&");
            what = format!("{what} query {}", excerpt(query.as_bytes(), 80));
            path = format!("{path}?{query}");
        }
        let mut headers = Vec::new();
        if endpoint.path.ends_with("/stream") && self.rng.percent(30) {
            let id = *self.rng.pick(LAST_EVENT_IDS);
            headers.push(("last-event-id", HeaderValue::from_static(id)));
            what = format!("{what} Last-Event-ID {id:?}");
        }
        Probe {
            endpoint: format!("GET {}", endpoint.path),
            method: Method::GET,
            path,
            content_type: None,
            headers,
            body: None,
            what: what.trim().to_owned(),
            expect: Expect::Any,
        }
    }

    /// A request with another method than the route's.
    fn method_probe(&mut self, path: &str) -> Probe {
        let methods = [
            Method::DELETE,
            Method::PUT,
            Method::PATCH,
            Method::OPTIONS,
            Method::HEAD,
            Method::TRACE,
            Method::from_bytes(b"FOO").expect("a method"),
        ];
        let method = self.rng.pick(&methods).clone();
        let path = path.replace("{id}", "fz-method");
        Probe {
            endpoint: "(other methods)".into(),
            what: format!("{method} {path}"),
            method,
            path,
            content_type: json_type(),
            headers: Vec::new(),
            body: Some(b"{}".to_vec()),
            expect: Expect::Any,
        }
    }

    fn report(&self, elapsed: Duration) {
        println!(
            "fuzz: {} requests to {} endpoints in {:.1} s (seed {:#x})",
            self.sent,
            self.counts.len(),
            elapsed.as_secs_f64(),
            fuzz_seed(SEED)
        );
        for (endpoint, statuses) in &self.counts {
            let total: usize = statuses.values().sum();
            let histogram: Vec<String> = statuses.iter().map(|(s, n)| format!("{s}:{n}")).collect();
            println!("  {endpoint:<46} {total:>4}  {}", histogram.join(" "));
        }
        let histogram: Vec<String> = self
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}:{n}"))
            .collect();
        println!("  statuses: {}", histogram.join(" "));
    }
}

fn start_input(
    span_id: &str,
    run_id: &str,
    parent: Option<&str>,
    kind: &str,
    origin: &str,
    at: i64,
) -> Value {
    let mut input = json!({"spanId": span_id, "runId": run_id, "name": format!("span {span_id}"),
                           "kind": kind, "origin": origin, "startedAt": at,
                           "attrs": {"stored": span_id}});
    if let Some(parent) = parent {
        input["parentSpanId"] = json!(parent);
    }
    input
}

/// Store the data the fuzzing must not lose, and the fuzz targets.
async fn store_data(server: &TestServer) {
    // The kept run: an open `cron` root written as the server's own writer (no sweep reaches it,
    // and an open run is never pruned), an ended child with events, an open child.
    let kept = [
        start_input("keep-root", "keep-run", None, "cron", "cron", 1_000),
        start_input(
            "keep-child",
            "keep-run",
            Some("keep-root"),
            "tool",
            "cron",
            1_100,
        ),
        start_input(
            "keep-open",
            "keep-run",
            Some("keep-root"),
            "model",
            "cron",
            1_200,
        ),
    ];
    for input in &kept {
        server
            .post("/v1/activity/spans", input)
            .await
            .assert_status(201);
    }
    for (span, body) in [
        (
            "keep-child",
            json!({"eventType": "tool.input", "payload": {"q": "x"}, "ts": 1_110}),
        ),
        (
            "keep-child",
            json!({"eventType": "tool.output", "payload": "done", "ts": 1_120}),
        ),
        (
            "keep-open",
            json!({"eventType": "token", "payload": [1, 2, 3], "ts": 1_210}),
        ),
    ] {
        server
            .post(&format!("/v1/activity/spans/{span}/events"), &body)
            .await
            .assert_status(201);
    }
    server
        .send(
            Method::PATCH,
            "/v1/activity/spans/keep-open",
            Some(&json!({"usage": {"inputTokens": 7, "model": "kept"}, "attrs": {"p": 1}})),
            None,
        )
        .await
        .assert_status(200);
    server
        .post(
            "/v1/activity/spans/keep-root/heartbeat",
            &json!({"at": 1_300}),
        )
        .await
        .assert_status(204);
    let end = json!({"outcome": "success", "endedAt": 1_500, "usage": {"outputTokens": 3}});
    server
        .post("/v1/activity/spans/keep-child/end", &end)
        .await
        .assert_status(200);

    // The kept engagement (retention keeps it from ageing out; see the server options).
    for event in [
        json!({"type": "engagement_opened", "at": 100, "data": {"initiator": {"id": "u1"},
               "venue": {"kind": "chat", "id": "c1"}, "entry": "agent:a"}}),
        json!({"type": "board_written", "at": 110, "data": {"key": "plan", "kind": "todo",
               "content": "keep me", "actor": "agent:a", "status": "pending"}}),
        json!({"type": "mail_sent", "at": 120, "data": {"mailId": "m1", "from": "agent:a",
               "to": "agent:b"}}),
        json!({"type": "budget_charged", "at": 130, "data": {"usage": {"tokens": 40}}}),
    ] {
        server
            .post("/v1/engagements/keep-eng/events", &event)
            .await
            .assert_status(201);
    }

    // The fuzz targets: a root, a pool of spans that stays open, spans to end, an engagement.
    server
        .post(
            "/v1/activity/spans",
            &start_input("fz-root", "fz-run-a", None, "turn", "session", 900),
        )
        .await
        .assert_status(201);
    for n in 0..4 {
        let span = format!("fz-pool-{n}");
        let parent = (n > 0).then_some("fz-pool-0");
        let input = start_input(&span, "fz-run-b", parent, "tool", "cron", 950 + n);
        server
            .post("/v1/activity/spans", &input)
            .await
            .assert_status(201);
    }
    for n in 0..8 {
        let span = format!("fz-end-{n}");
        let input = start_input(&span, "fz-run-d", None, "turn", "cron", 960 + n);
        server
            .post("/v1/activity/spans", &input)
            .await
            .assert_status(201);
    }
    server
        .post(
            "/v1/engagements/fz-eng-1/events",
            &json!({"type": "engagement_opened", "at": 1, "data": {}}),
        )
        .await
        .assert_status(201);
}

/// Everything read back about the kept data: (path, status, body), `changeCursor` (global, it
/// moves with any write) left out of the snapshot.
async fn kept_state(server: &TestServer) -> Vec<(String, u16, Value)> {
    let mut state = Vec::new();
    for path in [
        "/v1/activity/spans/keep-root",
        "/v1/activity/spans/keep-child",
        "/v1/activity/spans/keep-open",
        "/v1/activity/runs/keep-run/snapshot",
        "/v1/activity/runs/keep-run/seq",
        "/v1/activity/runs/keep-run/rollup",
        "/v1/engagements/keep-eng/events",
        "/v1/engagements/keep-eng/summary",
        "/v1/engagements/keep-eng/board",
    ] {
        let reply = server.get(path).await;
        let mut body = reply.body;
        if let Some(snapshot) = body.as_object_mut() {
            snapshot.remove("changeCursor");
        }
        state.push((path.to_owned(), reply.status.as_u16(), body));
    }
    // The kept run's part of the change log.
    let mut changes = Vec::new();
    let mut after = 0;
    loop {
        let page = server
            .get(&format!("/v1/activity/changes?after={after}&limit=10000"))
            .await;
        let page = page
            .assert_status(200)
            .as_array()
            .cloned()
            .unwrap_or_default();
        let Some(last) = page.last().and_then(|c| c["changeId"].as_i64()) else {
            break;
        };
        after = last;
        changes.extend(page.into_iter().filter(|c| c["runId"] == "keep-run"));
    }
    state.push(("changes of keep-run".into(), 200, Value::Array(changes)));
    let roots = server.get("/v1/activity/open-roots").await;
    let kept_root: Vec<Value> = roots
        .assert_status(200)
        .as_array()
        .map(|roots| {
            roots
                .iter()
                .filter(|r| r["spanId"] == "keep-root")
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    state.push(("open root keep-root".into(), 200, Value::Array(kept_root)));
    let listed = server.get("/v1/engagements?limit=10000").await;
    let listed = listed
        .assert_status(200)
        .as_array()
        .is_some_and(|ids| ids.contains(&json!("keep-eng")));
    state.push(("keep-eng listed".into(), 200, json!(listed)));
    state
}

fn server_options() -> Options {
    Options {
        // The testing clock makes the server's own times deterministic (and adds its PUT route).
        manual_clock: true,
        // Valid `POST /v1/engagements/prune` calls must not age the kept engagement out: that
        // would be a correct deletion, not bad input losing data.
        retention: RetentionConfig {
            max_age_ms: i64::MAX,
            ..RetentionConfig::default()
        },
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_requests_get_contract_errors_and_lose_nothing() {
    let started = Instant::now();
    let server = TestServer::start_with(server_options()).await;
    store_data(&server).await;
    let before = kept_state(&server).await;
    assert_eq!(before[0].1, 200, "the kept data is stored");

    let mut fuzz = Fuzz::new(&server);
    let bad_ids = bad_ids();
    let values = query_values();
    let writes = write_endpoints();
    let reads = read_endpoints();

    // The writes, round-robin so that the endpoints see each other's effects.
    for _ in 0..WRITE_ROUNDS {
        for endpoint in &writes {
            let probe = fuzz.write_probe(endpoint, &bad_ids);
            fuzz.fire(probe).await;
        }
    }
    // The reads, over the kept data and whatever the fuzzing stored.
    for round in 0..READ_ROUNDS {
        for endpoint in reads.iter().filter(|e| round < e.rounds) {
            let probe = fuzz.read_probe(endpoint, &bad_ids, &values);
            fuzz.fire(probe).await;
        }
    }
    // Other methods on every route.
    for path in writes
        .iter()
        .map(|e| e.path)
        .chain(reads.iter().map(|e| e.path))
        .collect::<Vec<_>>()
    {
        for _ in 0..2 {
            let probe = fuzz.method_probe(path);
            fuzz.fire(probe).await;
        }
    }
    // Every read view over what the fuzzing stored must still answer.
    let mut views: Vec<String> = [
        "/v1/activity/runs?limit=10000",
        "/v1/activity/runs?state=ended&limit=10000",
        "/v1/activity/changes?after=0&limit=10000",
        "/v1/activity/changes/terminal-roots?after=0&limit=10000",
        "/v1/activity/open-roots",
        "/v1/activity/cursor",
        "/v1/activity/stuck?thresholdMs=0&now=9000000000000000",
        "/v1/engagements?limit=10000",
        "/metrics",
        "/openapi.json",
    ]
    .iter()
    .map(|p| (*p).to_owned())
    .collect();
    for run in READ_RUNS {
        for view in ["snapshot", "seq", "rollup"] {
            views.push(format!("/v1/activity/runs/{run}/{view}"));
        }
    }
    for engagement in FUZZ_ENGAGEMENTS {
        for view in ["events", "summary", "board"] {
            views.push(format!("/v1/engagements/{engagement}/{view}"));
        }
    }
    let mut run_ids = Vec::new();
    for path in views {
        let answer = fuzz.fire(Probe::read_back(path.clone())).await;
        if path.starts_with("/v1/activity/runs?limit") {
            if let Some((200, page)) = answer {
                run_ids = page["runs"]
                    .as_array()
                    .map(|runs| {
                        runs.iter()
                            .filter_map(|r| r["runId"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
            }
        }
    }
    // Each run the fuzzing created (OTLP traces included), as a snapshot.
    for run in run_ids.iter().take(300) {
        let path = format!("/v1/activity/runs/{}/snapshot", segment(run));
        fuzz.fire(Probe::read_back(path)).await;
    }

    let after = kept_state(&server).await;
    for ((path, status, body), (_, status_after, body_after)) in before.iter().zip(&after) {
        if (status, body) != (status_after, body_after) {
            fuzz.failures.push(format!(
                "stored data changed: {path}\n    before: {status} {body}\n    after: {status_after} {body_after}"
            ));
        }
    }
    let health = server.get("/healthz").await;
    assert_eq!(health.assert_status(200), &json!({"status": "ok"}));

    fuzz.report(started.elapsed());
    assert_no_fuzz_failures(&fuzz.failures, fuzz.sent);
    server.stop().await;
}

/// Regression (found by the fuzzing): serde's derived `Deserialize` also reads a struct from an
/// array of its fields in declaration order, so `[2^50, 1]` to `maintenance/prune` deleted a
/// finished run, `["cancelled", "x"]` closed a run, `["success"]` ended a span. Every array where
/// the contract has an object, at the top or nested (`usage`), must be a `400 invalid_request`
/// that writes nothing.
#[tokio::test]
async fn array_bodies_are_refused_not_read_as_positional_fields() {
    let server = TestServer::start().await;
    for (span, run) in [("done", "r-done"), ("a", "r-a"), ("b", "r-b")] {
        let input = start_input(span, run, None, "turn", "session", 1_000);
        server
            .post("/v1/activity/spans", &input)
            .await
            .assert_status(201);
    }
    // A finished, rolled-up run: what prune may delete when asked to.
    let close = json!({"outcome": "success", "reason": "done"});
    server
        .post("/v1/activity/runs/r-done/close", &close)
        .await
        .assert_status(200);

    // The span writes before the end, which would make them no-ops.
    let cases = [
        (
            Method::POST,
            "/v1/activity/maintenance/prune",
            json!([1_i64 << 50, 1]),
        ),
        (
            Method::POST,
            "/v1/activity/runs/r-a/close",
            json!(["cancelled", "x"]),
        ),
        (
            Method::POST,
            "/v1/activity/spans",
            json!(["s2", "r2", null, "n", "turn", "session"]),
        ),
        (Method::PATCH, "/v1/activity/spans/b", json!([{"k": 1}])),
        (Method::POST, "/v1/activity/spans/b/events", json!(["note"])),
        (Method::POST, "/v1/activity/spans/b/heartbeat", json!([5])),
        (
            Method::POST,
            "/v1/activity/batch",
            json!([[{"op": "heartbeat", "spanId": "b", "at": 6}]]),
        ),
        (Method::POST, "/v1/activity/spans/b/end", json!(["success"])),
        (
            Method::POST,
            "/v1/activity/spans/b/end",
            json!({"outcome": "success", "usage": [10, 20]}),
        ),
        (
            Method::PATCH,
            "/v1/activity/spans/b",
            json!({"usage": [10, 20]}),
        ),
        (
            Method::POST,
            "/v1/activity/maintenance/sweep-stale",
            json!([0]),
        ),
        (Method::POST, "/v1/engagements/prune", json!([5_000])),
    ];
    let mut problems = Vec::new();
    for (method, path, body) in cases {
        let reply = server.send(method.clone(), path, Some(&body), None).await;
        if reply.code() != Some("invalid_request") {
            problems.push(format!(
                "{method} {path} {body}: {} {}",
                reply.status, reply.body
            ));
        }
    }
    // In a batch, the op alone is refused.
    let batch = json!({"ops": [{"op": "patchSpan", "spanId": "b", "usage": [10, 20]}]});
    let reply = server.post("/v1/activity/batch", &batch).await;
    let result = reply.assert_status(200)["results"][0].clone();
    if result["error"]["code"] != "invalid_request" {
        problems.push(format!("batch {batch}: {result}"));
    }
    // Nothing was written by them.
    let done = server.get("/v1/activity/runs/r-done/snapshot").await;
    if done.status != 200 {
        problems.push(format!(
            "run r-done was pruned: {} {}",
            done.status, done.body
        ));
    }
    let a = server.get("/v1/activity/spans/a").await;
    let b = server.get("/v1/activity/spans/b").await;
    for (span, field, stored) in [
        (&a, "outcome", Value::Null),
        (&b, "outcome", Value::Null),
        (&b, "lastHeartbeatAt", json!(1_000)),
    ] {
        if span.body[field] != stored {
            problems.push(format!("{field} written: {}", span.body));
        }
    }
    if b.body["attrs"].get("k").is_some() {
        problems.push(format!("attrs written: {}", b.body));
    }
    let snapshot = server.get("/v1/activity/runs/r-b/snapshot").await;
    if snapshot.body["events"] != json!([]) {
        problems.push(format!("an event was appended: {}", snapshot.body));
    }
    if server.get("/v1/activity/spans/s2").await.status != 404 {
        problems.push("span s2 was started".into());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    server.stop().await;
}

/// Regression (found by the fuzzing): `Last-Event-ID: 9223372036854775807` on the journal stream
/// overflowed `id + 1` (a panic and a dropped connection in a debug build, a replay of the whole
/// journal in a release build). The stream must answer and send nothing of the past.
#[tokio::test]
async fn journal_stream_survives_last_event_id_i64_max() {
    let server = TestServer::start().await;
    let event = json!({"type": "t", "at": 1, "data": {}});
    server
        .post("/v1/engagements/e1/events", &event)
        .await
        .assert_status(201);
    let response = server
        .client
        .get(format!("{}/v1/engagements/e1/stream", server.base))
        .header("last-event-id", i64::MAX.to_string())
        .send()
        .await
        .expect("an HTTP answer, not a dropped connection");
    let mut response = response;
    match response.status().as_u16() {
        400 => {
            let body: Value = response.json().await.expect("a JSON error body");
            assert_eq!(body["error"]["code"], "invalid_request", "{body}");
        }
        200 => {
            // What the stream sends in half a second: nothing of the journal's past.
            let mut seen = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
            while let Ok(Ok(Some(chunk))) =
                tokio::time::timeout_at(deadline, response.chunk()).await
            {
                seen.extend_from_slice(&chunk);
            }
            let seen = String::from_utf8_lossy(&seen);
            assert!(!seen.contains("event: journal"), "replayed: {seen}");
        }
        status => panic!("status {status}"),
    }
    assert_eq!(server.get("/healthz").await.status, 200);
    server.stop().await;
}

/// Regression (found by the fuzzing): attrs nested 125 levels deep were stored, and then every
/// read that includes them (a snapshot, the change log, the open roots) nested deeper than the
/// 128 levels serde_json (and many clients) parse. Stored values are refused past 64 levels,
/// naming the path, through the single endpoints and batch ops alike; 64 levels are stored and
/// read back.
#[tokio::test]
async fn stored_values_never_make_reads_deeper_than_the_parse_limit() {
    let server = TestServer::start().await;
    // At the limit: `attrs` is level 1, so its member may take 63 more.
    let mut input = start_input("deep", "r-deep", None, "turn", "session", 1_000);
    input["attrs"] = json!({ "x": nested_array(63) });
    server
        .post("/v1/activity/spans", &input)
        .await
        .assert_status(201);
    let payload = json!({ "payload": nested_object(64), "eventType": "deep" });
    server
        .post("/v1/activity/spans/deep/events", &payload)
        .await
        .assert_status(201);
    // One level more: refused, wherever it comes in.
    let mut input = start_input("deeper", "r-deep", None, "turn", "session", 1_000);
    input["attrs"] = json!({ "x": nested_array(64) });
    let refused = [
        ("/v1/activity/spans", input.clone()),
        (
            "/v1/activity/spans/deep/events",
            json!({ "payload": nested_object(65), "eventType": "deeper" }),
        ),
        (
            "/v1/activity/spans/deep/end",
            json!({ "outcome": "success", "attrs": { "x": nested_array(64) } }),
        ),
    ];
    for (path, body) in &refused {
        let reply = server.post(path, body).await;
        reply.assert_error(400, "invalid_request");
        let message = reply.body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("nests deeper than 64 levels"), "{message}");
    }
    let reply = server
        .send(
            Method::PATCH,
            "/v1/activity/spans/deep",
            Some(&json!({ "attrs": { "x": nested_array(64) } })),
            None,
        )
        .await;
    reply.assert_error(400, "invalid_request");
    let mut op = input;
    op["op"] = json!("startSpan");
    let batch = json!({ "ops": [op] });
    let results = server.post("/v1/activity/batch", &batch).await;
    let result = results.assert_status(200)["results"][0].clone();
    assert_eq!(result["error"]["code"], "invalid_request", "{result}");
    assert_eq!(server.get("/v1/activity/spans/deeper").await.status, 404);

    // What was stored reads back, parseable, everywhere it appears.
    for path in [
        "/v1/activity/spans/deep",
        "/v1/activity/runs/r-deep/snapshot",
        "/v1/activity/changes?after=0",
        "/v1/activity/open-roots",
    ] {
        let bytes = server
            .client
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .expect("an answer")
            .bytes()
            .await
            .expect("a body");
        let read: Result<Value, _> = serde_json::from_slice(&bytes);
        assert!(read.is_ok(), "{path}: {read:?}");
    }
    server.stop().await;
}

/// Regression (found by the fuzzing): a batch op with a repeated member ran with the member's
/// last value (even `{"op": "heartbeat", "op": "endSpan", …}` ran as an `endSpan`) while the
/// single endpoint refuses the same body. Both must refuse it.
#[tokio::test]
async fn batch_ops_with_repeated_keys_are_judged_as_their_single_endpoint() {
    let server = TestServer::start().await;
    for span in ["e1", "e2"] {
        let input = start_input(span, "r-dup", None, "turn", "cron", 1_000);
        server
            .post("/v1/activity/spans", &input)
            .await
            .assert_status(201);
    }
    let json = Some("application/json");
    let pairs = [
        (
            "/v1/activity/spans/e1/end",
            r#"{"outcome": "error", "outcome": "success"}"#,
            r#"{"op": "endSpan", "spanId": "e2", "outcome": "error", "outcome": "success"}"#,
        ),
        (
            "/v1/activity/spans",
            r#"{"spanId": "s1", "spanId": "t1", "runId": "r", "name": "n", "kind": "turn", "origin": "cron"}"#,
            r#"{"op": "startSpan", "spanId": "s2", "spanId": "t2", "runId": "r", "name": "n", "kind": "turn", "origin": "cron"}"#,
        ),
    ];
    let mut differ = Vec::new();
    for (path, single_body, op) in pairs {
        let single = server.send_raw(Method::POST, path, json, single_body).await;
        let batch = format!(r#"{{"ops": [{op}]}}"#);
        let batch = server
            .send_raw(Method::POST, "/v1/activity/batch", json, batch)
            .await;
        let result = batch.assert_status(200)["results"][0].clone();
        let single_refused = single.code() == Some("invalid_request");
        let batch_refused = result["error"]["code"] == "invalid_request";
        if !single_refused || !batch_refused {
            differ.push(format!(
                "{path} {single_body}: {} {}\n  as a batch op: {result}",
                single.status, single.body
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    // A repeated `op` names no one operation: refused, and nothing runs.
    let batch =
        r#"{"ops": [{"op": "heartbeat", "op": "endSpan", "spanId": "e2", "outcome": "success"}]}"#;
    let batch = server
        .send_raw(Method::POST, "/v1/activity/batch", json, batch)
        .await;
    let result = batch.assert_status(200)["results"][0].clone();
    assert_eq!(result["error"]["code"], "invalid_request", "{result}");
    for span in ["e1", "e2"] {
        let read = server.get(&format!("/v1/activity/spans/{span}")).await;
        assert_eq!(read.assert_status(200)["outcome"], Value::Null, "{span}");
    }
    server.stop().await;
}
