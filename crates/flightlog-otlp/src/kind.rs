//! Which flightlog span kind an OTLP span is, from the conventions agent instrumentations use.
//!
//! Precedence, first match wins (the table in `docs/otlp.md` is the same rules):
//! 1. `gen_ai.operation.name` (OpenTelemetry GenAI semantic conventions), when it is one of the
//!    operations below; an unknown operation falls through.
//! 2. `openinference.span.kind` (Arize OpenInference): any value decides, unknown ones → `other`.
//! 3. `traceloop.span.kind` (OpenLLMetry), when it is one of its four values.
//! 4. A model-call hint (`gen_ai.request.model`, `gen_ai.system`, `gen_ai.provider.name`,
//!    `llm.request.type`) → `model`.
//! 5. Otherwise `other`.
//!
//! An agent span is a `turn` when it is the root of its trace and a `subagent` below it: the
//! trace is the run, and an agent invoked inside it is work delegated by that run.

use flightlog_core::activity::SpanKind;

use crate::facts::Facts;

/// The kind of a span with these attributes; `is_root` is whether it has no parent.
pub(crate) fn span_kind(facts: &Facts<'_>, is_root: bool) -> SpanKind {
    let agent = || {
        if is_root {
            SpanKind::Turn
        } else {
            SpanKind::Subagent
        }
    };
    if let Some(operation) = facts.operation_name {
        match operation.trim().to_ascii_lowercase().as_str() {
            "invoke_agent" | "create_agent" => return agent(),
            "execute_tool" => return SpanKind::Tool,
            "chat" | "text_completion" | "generate_content" | "embeddings" => {
                return SpanKind::Model
            }
            _ => {}
        }
    }
    if let Some(kind) = facts.openinference_kind {
        return match kind.trim().to_ascii_uppercase().as_str() {
            "AGENT" => agent(),
            "TOOL" => SpanKind::Tool,
            "LLM" | "EMBEDDING" => SpanKind::Model,
            // CHAIN, RETRIEVER, RERANKER, GUARDRAIL, EVALUATOR, PROMPT, UNKNOWN, …: steps that
            // are neither an agent, a tool call nor a model call.
            _ => SpanKind::Other,
        };
    }
    if let Some(kind) = facts.traceloop_kind {
        match kind.trim().to_ascii_lowercase().as_str() {
            "agent" => return agent(),
            "tool" => return SpanKind::Tool,
            // A workflow is OpenLLMetry's top-level unit of work: the turn when it is the root;
            // a nested workflow (or a task) is just a step.
            "workflow" if is_root => return SpanKind::Turn,
            "workflow" | "task" => return SpanKind::Other,
            _ => {}
        }
    }
    if facts.model_call_hint {
        return SpanKind::Model;
    }
    SpanKind::Other
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::KeyValue;

    use super::*;
    use crate::test_support::{kv, string};

    fn kind_of(attributes: &[(&str, &str)], is_root: bool) -> SpanKind {
        let attributes: Vec<KeyValue> = attributes
            .iter()
            .map(|(key, value)| kv(key, string(value)))
            .collect();
        span_kind(&Facts::scan(&attributes), is_root)
    }

    /// One row of the kind table: the attributes, the kind at the root, the kind below it.
    type Row = (&'static [(&'static str, &'static str)], SpanKind, SpanKind);

    /// Every row of the kind table in docs/otlp.md.
    #[test]
    fn kind_table() {
        use SpanKind::*;
        let rows: &[Row] = &[
            (&[("gen_ai.operation.name", "invoke_agent")], Turn, Subagent),
            (&[("gen_ai.operation.name", "create_agent")], Turn, Subagent),
            (&[("gen_ai.operation.name", "execute_tool")], Tool, Tool),
            (&[("gen_ai.operation.name", "chat")], Model, Model),
            (
                &[("gen_ai.operation.name", "text_completion")],
                Model,
                Model,
            ),
            (
                &[("gen_ai.operation.name", "generate_content")],
                Model,
                Model,
            ),
            (&[("gen_ai.operation.name", "embeddings")], Model, Model),
            (&[("openinference.span.kind", "AGENT")], Turn, Subagent),
            (&[("openinference.span.kind", "TOOL")], Tool, Tool),
            (&[("openinference.span.kind", "LLM")], Model, Model),
            (&[("openinference.span.kind", "EMBEDDING")], Model, Model),
            (&[("openinference.span.kind", "CHAIN")], Other, Other),
            (&[("openinference.span.kind", "RETRIEVER")], Other, Other),
            (&[("openinference.span.kind", "RERANKER")], Other, Other),
            (&[("openinference.span.kind", "GUARDRAIL")], Other, Other),
            (&[("openinference.span.kind", "EVALUATOR")], Other, Other),
            (&[("traceloop.span.kind", "agent")], Turn, Subagent),
            (&[("traceloop.span.kind", "tool")], Tool, Tool),
            (&[("traceloop.span.kind", "workflow")], Turn, Other),
            (&[("traceloop.span.kind", "task")], Other, Other),
            (&[("gen_ai.request.model", "gpt-4o")], Model, Model),
            (&[("gen_ai.system", "openai")], Model, Model),
            (&[("gen_ai.provider.name", "anthropic")], Model, Model),
            (&[("llm.request.type", "chat")], Model, Model),
            (&[("http.method", "GET")], Other, Other),
            (&[], Other, Other),
        ];
        for (attributes, at_root, below) in rows {
            assert_eq!(
                &kind_of(attributes, true),
                at_root,
                "{attributes:?} at the root"
            );
            assert_eq!(
                &kind_of(attributes, false),
                below,
                "{attributes:?} below the root"
            );
        }
    }

    #[test]
    fn precedence_operation_then_openinference_then_traceloop_then_hints() {
        // A known operation beats OpenInference.
        assert_eq!(
            kind_of(
                &[
                    ("openinference.span.kind", "CHAIN"),
                    ("gen_ai.operation.name", "execute_tool")
                ],
                false
            ),
            SpanKind::Tool
        );
        // An unknown operation falls through to OpenInference.
        assert_eq!(
            kind_of(
                &[
                    ("gen_ai.operation.name", "invoke_workflow"),
                    ("openinference.span.kind", "LLM")
                ],
                false
            ),
            SpanKind::Model
        );
        // OpenInference, even unknown, beats Traceloop and the model hint.
        assert_eq!(
            kind_of(
                &[
                    ("openinference.span.kind", "RETRIEVER"),
                    ("traceloop.span.kind", "tool"),
                    ("gen_ai.system", "openai")
                ],
                false
            ),
            SpanKind::Other
        );
        // Traceloop beats the model hint.
        assert_eq!(
            kind_of(
                &[
                    ("traceloop.span.kind", "agent"),
                    ("gen_ai.request.model", "gpt-4o")
                ],
                false
            ),
            SpanKind::Subagent
        );
        // Values are matched case-insensitively.
        assert_eq!(
            kind_of(&[("openinference.span.kind", "agent")], true),
            SpanKind::Turn
        );
    }
}
