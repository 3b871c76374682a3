//! The reference workload of `crates/flightlog-sqlite/benches/activity_workload.rs`, as HTTP
//! requests: per run a root `turn` span; 5 child `tool` spans, each with two ~300-byte events
//! (tool input, tool output), a usage patch and an end; then the root's end with usage and the
//! run's rollup. 28 writes per run, 27 of which log a change (the rollup logs none).
//!
//! Every body is encoded before a phase's clock starts, so the load generator spends its share
//! of the 2 cores on HTTP, not on building JSON.

use bytes::Bytes;
use http::{Method, Uri};
use serde_json::{json, Value};

/// Writes per run: 1 root start, 5 × (start, 2 events, patch, end), root end, rollup.
pub const WRITES_PER_RUN: usize = 28;
/// Of those, the ones that are batch ops (the rollup is not) and log one change each.
pub const CHANGES_PER_RUN: usize = 27;

const TOOLS: [&str; 5] = ["bash", "read_file", "edit_file", "grep", "web_fetch"];

/// A bijection of `u64` (the splitmix64 finaliser): spreads sequential numbers over the id space
/// as real random ids would (so index pages are hit as in production), without collisions.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Ids of one run of one phase: unique across phases because `phase` is part of every id.
pub struct RunIds {
    pub run_id: String,
    /// The root, then the 5 tools.
    pub span_ids: [String; 6],
}

impl RunIds {
    pub fn new(phase: u8, run: usize) -> Self {
        let run = run as u64;
        let run_id = format!("{:016x}{:016x}", mix(u64::from(phase) << 56 | run), run);
        let span_ids = std::array::from_fn(|k| {
            // `mix` is a bijection, so distinct (phase, run, k) give distinct span ids.
            format!(
                "{:016x}",
                mix(u64::from(phase) << 56 | (run << 3) | k as u64)
            )
        });
        Self { run_id, span_ids }
    }
}

/// About 300 bytes of JSON, shaped like a tool call's input or output (as the store benchmark).
pub fn event_payload(run: usize, tool: usize, output: bool) -> Value {
    if output {
        json!({
            "ok": true,
            "exitCode": 0,
            "output": format!(
                "running {} tests\ntest planner::tests::case_{run} ... ok\n\
                 test result: ok. {} passed; 0 failed; finished in {}.{:02}s\n\
                 warning: unused variable `ctx` in src/agents/tool_{tool}.rs:{}:9 \
                 (run {run}); consider prefixing it with an underscore",
                40 + tool, 40 + tool, tool, run % 100, 100 + run % 900
            ),
            "bytes": 1800 + run % 500,
        })
    } else {
        json!({
            "tool": TOOLS[tool % TOOLS.len()],
            "input": {
                "command": format!("cargo test -p agent-core --lib planner::tests::case_{run}"),
                "cwd": "/home/agent/work/repository",
                "timeoutMs": 120000,
                "env": {"RUST_BACKTRACE": "1", "CARGO_TERM_COLOR": "never"},
            },
            "reason": format!(
                "Run the planner tests again after editing step {tool} to confirm the fix for run {run}"
            ),
        })
    }
}

/// The single endpoint a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    StartSpan,
    AppendEvent,
    PatchSpan,
    EndSpan,
    Rollup,
}

impl Op {
    /// The batch op name (`None` for the rollup, which has no batch op).
    pub fn batch_name(self) -> Option<&'static str> {
        match self {
            Op::StartSpan => Some("startSpan"),
            Op::AppendEvent => Some("appendEvent"),
            Op::PatchSpan => Some("patchSpan"),
            Op::EndSpan => Some("endSpan"),
            Op::Rollup => None,
        }
    }

    /// The status the single endpoint answers on success.
    pub fn expected_status(self) -> u16 {
        match self {
            Op::StartSpan | Op::AppendEvent => 201,
            Op::PatchSpan | Op::EndSpan => 200,
            Op::Rollup => 204,
        }
    }
}

/// One write of the workload as data: which op, on which span, with which fields.
pub struct Write {
    pub op: Op,
    /// The span the path names (`None` for a start, whose body names it, and for the rollup).
    pub span_id: Option<String>,
    /// The body fields (the single endpoint's body; a batch op adds `op` and `spanId`).
    pub fields: Value,
}

/// The 28 writes of run `run` of phase `phase`, in order.
pub fn run_writes(phase: u8, run: usize) -> (RunIds, Vec<Write>) {
    let ids = RunIds::new(phase, run);
    let root = &ids.span_ids[0];
    let mut writes = Vec::with_capacity(WRITES_PER_RUN);
    writes.push(Write {
        op: Op::StartSpan,
        span_id: None,
        fields: json!({
            "spanId": root,
            "runId": ids.run_id,
            "name": "agent turn",
            "kind": "turn",
            "origin": "session",
            "sessionId": format!("session-{}", run % 50),
        }),
    });
    for (tool, tool_name) in TOOLS.iter().enumerate() {
        let span_id = &ids.span_ids[tool + 1];
        writes.push(Write {
            op: Op::StartSpan,
            span_id: None,
            fields: json!({
                "spanId": span_id,
                "runId": ids.run_id,
                "parentSpanId": root,
                "name": format!("tool:{tool_name}"),
                "kind": "tool",
                "origin": "session",
            }),
        });
        for (event_type, output) in [("tool_input", false), ("tool_output", true)] {
            writes.push(Write {
                op: Op::AppendEvent,
                span_id: Some(span_id.clone()),
                fields: json!({
                    "eventType": event_type,
                    "payload": event_payload(run, tool, output),
                }),
            });
        }
        writes.push(Write {
            op: Op::PatchSpan,
            span_id: Some(span_id.clone()),
            fields: json!({"usage": {"inputTokens": 1200 + tool, "outputTokens": 300}}),
        });
        writes.push(Write {
            op: Op::EndSpan,
            span_id: Some(span_id.clone()),
            fields: json!({"outcome": "success"}),
        });
    }
    writes.push(Write {
        op: Op::EndSpan,
        span_id: Some(root.clone()),
        fields: json!({
            "outcome": "success",
            "usage": {
                "inputTokens": 6000,
                "outputTokens": 1500,
                "cacheReadTokens": 20000,
                "cacheCreationTokens": 800,
                "costUsd": 0.0425,
                "model": "claude-sonnet-4",
            },
        }),
    });
    writes.push(Write {
        op: Op::Rollup,
        span_id: None,
        fields: Value::Null,
    });
    (ids, writes)
}

/// One pre-encoded HTTP request.
pub struct PreparedRequest {
    pub method: Method,
    /// The path (origin form: the connection knows the host).
    pub uri: Uri,
    /// Empty for the rollup (its endpoint takes no body).
    pub body: Bytes,
    pub expected_status: u16,
    /// Text the answer must contain (`true` of `{"ended":true}` / `{"patched":true}`: a write
    /// answered `false` did nothing).
    pub must_contain: Option<&'static str>,
}

/// A path as a request target.
pub fn uri(path: &str) -> anyhow::Result<Uri> {
    Ok(path.parse()?)
}

/// A write as its single endpoint's request.
pub fn single_request(run_id: &str, write: &Write) -> anyhow::Result<PreparedRequest> {
    let span = write.span_id.as_deref().unwrap_or_default();
    let (method, path) = match write.op {
        Op::StartSpan => (Method::POST, "/v1/activity/spans".to_owned()),
        Op::AppendEvent => (Method::POST, format!("/v1/activity/spans/{span}/events")),
        Op::PatchSpan => (Method::PATCH, format!("/v1/activity/spans/{span}")),
        Op::EndSpan => (Method::POST, format!("/v1/activity/spans/{span}/end")),
        Op::Rollup => (Method::POST, format!("/v1/activity/runs/{run_id}/rollup")),
    };
    let body = if write.op == Op::Rollup {
        Bytes::new()
    } else {
        Bytes::from(serde_json::to_vec(&write.fields)?)
    };
    Ok(PreparedRequest {
        method,
        uri: uri(&path)?,
        body,
        expected_status: write.op.expected_status(),
        must_contain: matches!(write.op, Op::PatchSpan | Op::EndSpan).then_some("true"),
    })
}

/// The rollup request of a run.
pub fn rollup_request(run_id: &str) -> anyhow::Result<PreparedRequest> {
    Ok(PreparedRequest {
        method: Method::POST,
        uri: uri(&format!("/v1/activity/runs/{run_id}/rollup"))?,
        body: Bytes::new(),
        expected_status: 204,
        must_contain: None,
    })
}

/// A write as a batch op (`None` for the rollup).
pub fn batch_op(write: &Write) -> Option<Value> {
    let name = write.op.batch_name()?;
    let mut op = match &write.fields {
        Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    op.insert("op".into(), json!(name));
    if let Some(span_id) = &write.span_id {
        op.insert("spanId".into(), json!(span_id));
    }
    Some(Value::Object(op))
}

/// `{"ops": [...]}` for the runs `runs` of phase `phase`, plus their run ids (for the rollups).
pub fn batch_body(phase: u8, runs: std::ops::Range<usize>) -> anyhow::Result<(Bytes, Vec<String>)> {
    let mut ops = Vec::with_capacity(runs.len() * CHANGES_PER_RUN);
    let mut run_ids = Vec::with_capacity(runs.len());
    for run in runs {
        let (ids, writes) = run_writes(phase, run);
        ops.extend(writes.iter().filter_map(batch_op));
        run_ids.push(ids.run_id);
    }
    let body = serde_json::to_vec(&json!({ "ops": ops }))?;
    Ok((Bytes::from(body), run_ids))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_run_is_28_writes_of_which_27_are_batch_ops() {
        let (_, writes) = run_writes(1, 7);
        assert_eq!(writes.len(), WRITES_PER_RUN);
        assert_eq!(writes.iter().filter_map(batch_op).count(), CHANGES_PER_RUN);
        assert_eq!(writes.last().map(|w| w.op), Some(Op::Rollup));
    }

    #[test]
    fn event_payloads_are_about_300_bytes() {
        for output in [false, true] {
            let len = serde_json::to_vec(&event_payload(1234, 3, output))
                .map(|v| v.len())
                .unwrap_or_default();
            assert!((250..=380).contains(&len), "payload of {len} bytes");
        }
    }

    #[test]
    fn ids_are_unique_across_runs_and_phases() {
        let mut spans = HashSet::new();
        let mut runs = HashSet::new();
        for phase in 1..4u8 {
            for run in 0..2_000 {
                let ids = RunIds::new(phase, run);
                assert!(runs.insert(ids.run_id));
                for span in ids.span_ids {
                    assert!(spans.insert(span));
                }
            }
        }
    }

    #[test]
    fn batch_ops_carry_the_op_and_the_path_span_id() {
        let (_, writes) = run_writes(1, 0);
        let ops: Vec<Value> = writes.iter().filter_map(batch_op).collect();
        assert_eq!(ops[0]["op"], "startSpan");
        assert!(ops[0].get("spanId").is_some());
        assert_eq!(ops[1]["op"], "startSpan");
        assert_eq!(ops[2]["op"], "appendEvent");
        assert_eq!(ops[2]["spanId"], ops[1]["spanId"]);
        assert_eq!(ops[2]["eventType"], "tool_input");
        assert_eq!(ops[26]["op"], "endSpan");
        assert_eq!(ops[26]["spanId"], ops[0]["spanId"]);
    }
}
