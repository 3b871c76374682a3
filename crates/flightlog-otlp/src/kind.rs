//! Which flightlog span kind an OTLP span is, from the conventions agent instrumentations use.
//!
//! Precedence, first match wins (the table in `docs/otlp.md` is the same rules):
//! 1. `gen_ai.operation.name` (OpenTelemetry GenAI semantic conventions), when it is one of the
//!    operations below; an unknown operation falls through.
//! 2. `openinference.span.kind` (Arize OpenInference): any string value decides, unknown ones →
//!    `other` (a value of another type is passed over, as in every row).
//! 3. `traceloop.span.kind` (OpenLLMetry), when it is one of its four values.
//! 4. `langfuse.observation.type` (Langfuse SDK v3), when it is one of its types.
//! 5. `ai.operationId` (Vercel AI SDK), when it is a tool call or a top-level call.
//! 6. `gen_ai.tool.name` on a span with no `gen_ai.operation.name` → `tool`.
//! 7. A model-call hint (`gen_ai.request.model`, `gen_ai.system`, `gen_ai.provider.name`,
//!    `llm.request.type`) → `model`.
//! 8. Otherwise `other`.
//!
//! An agent span is a `turn` when it is the root of its trace and a `subagent` below it: the
//! trace is the run, and an agent invoked inside it is work delegated by that run. A workflow
//! (or chain, or a Vercel top-level call) is the `turn` when it is the root, and just a step
//! (`other`) below it. Values are compared without allocating (ASCII case-insensitively).

use flightlog_core::activity::SpanKind;

use crate::facts::Facts;

/// What a recognised attribute value makes a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rule {
    /// `turn` at the root, `subagent` below it.
    Agent,
    /// `turn` at the root, `other` below it (a workflow: the run's unit of work, or a step).
    RootTurn,
    /// `tool`.
    Tool,
    /// `model`.
    Model,
    /// `other`: a step that is neither an agent, a tool call nor a model call.
    Other,
}

/// `gen_ai.operation.name` values; any other falls through. `create_agent` defines an agent
/// (it does not run one), and the retrieval and memory operations are not model calls: all are
/// `other` rather than left to the model hint their `gen_ai.*` attributes would trigger.
pub(crate) const GEN_AI_OPERATIONS: &[(&str, Rule)] = &[
    ("invoke_agent", Rule::Agent),
    ("invoke_workflow", Rule::RootTurn),
    ("execute_tool", Rule::Tool),
    ("chat", Rule::Model),
    ("text_completion", Rule::Model),
    ("generate_content", Rule::Model),
    ("embeddings", Rule::Model),
    ("create_agent", Rule::Other),
    ("retrieval", Rule::Other),
    ("search_memory", Rule::Other),
    ("update_memory", Rule::Other),
    ("delete_memory", Rule::Other),
    ("create_memory_store", Rule::Other),
    ("delete_memory_store", Rule::Other),
];

/// `openinference.span.kind` values; any other (RETRIEVER, RERANKER, GUARDRAIL, EVALUATOR,
/// PROMPT, UNKNOWN, …) is `other`: the attribute always decides.
pub(crate) const OPENINFERENCE_KINDS: &[(&str, Rule)] = &[
    ("AGENT", Rule::Agent),
    ("TOOL", Rule::Tool),
    ("LLM", Rule::Model),
    ("EMBEDDING", Rule::Model),
    // A chain at the root is the whole request (as OpenLLMetry's workflow); below, a step.
    ("CHAIN", Rule::RootTurn),
];

/// `traceloop.span.kind` values; any other falls through.
pub(crate) const TRACELOOP_KINDS: &[(&str, Rule)] = &[
    ("agent", Rule::Agent),
    ("tool", Rule::Tool),
    // A workflow is OpenLLMetry's top-level unit of work: the turn when it is the root; a
    // nested workflow (or a task) is just a step.
    ("workflow", Rule::RootTurn),
    ("task", Rule::Other),
];

/// `langfuse.observation.type` values; any other falls through.
pub(crate) const LANGFUSE_OBSERVATION_TYPES: &[(&str, Rule)] = &[
    ("generation", Rule::Model),
    ("embedding", Rule::Model),
    ("agent", Rule::Agent),
    ("tool", Rule::Tool),
    ("span", Rule::Other),
    ("chain", Rule::Other),
    ("retriever", Rule::Other),
    ("evaluator", Rule::Other),
    ("guardrail", Rule::Other),
    ("event", Rule::Other),
];

/// Vercel AI SDK `ai.operationId` values; any other falls through. The top-level calls wrap
/// their `….doGenerate` / `….doStream` model calls, which carry `gen_ai.*` attributes and so
/// become `model` through the hint. The embedding calls (`….doEmbed`) carry no `gen_ai.*`
/// attribute, so they are named here: left to the later rows they were `other`, and their
/// tokens and cost were in no run's usage (an audit's finding).
pub(crate) const VERCEL_OPERATIONS: &[(&str, Rule)] = &[
    ("ai.toolCall", Rule::Tool),
    ("ai.generateText", Rule::RootTurn),
    ("ai.streamText", Rule::RootTurn),
    ("ai.generateObject", Rule::RootTurn),
    ("ai.streamObject", Rule::RootTurn),
    ("ai.embed", Rule::RootTurn),
    ("ai.embedMany", Rule::RootTurn),
    ("ai.embed.doEmbed", Rule::Model),
    ("ai.embedMany.doEmbed", Rule::Model),
];

/// The rule `table` gives `value` (trimmed, ASCII case-insensitive), if any.
fn rule_for(table: &[(&str, Rule)], value: &str) -> Option<Rule> {
    let value = value.trim();
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(value))
        .map(|(_, rule)| *rule)
}

/// The kind of a span with these attributes; `is_root` is whether it has no parent.
pub(crate) fn span_kind(facts: &Facts<'_>, is_root: bool) -> SpanKind {
    let rule = facts
        .operation_name
        .and_then(|operation| rule_for(GEN_AI_OPERATIONS, operation))
        .or_else(|| {
            facts
                .openinference_kind
                .map(|kind| rule_for(OPENINFERENCE_KINDS, kind).unwrap_or(Rule::Other))
        })
        .or_else(|| {
            facts
                .traceloop_kind
                .and_then(|kind| rule_for(TRACELOOP_KINDS, kind))
        })
        .or_else(|| {
            facts
                .langfuse_observation_type
                .and_then(|kind| rule_for(LANGFUSE_OBSERVATION_TYPES, kind))
        })
        .or_else(|| {
            facts
                .vercel_operation_id
                .and_then(|operation| rule_for(VERCEL_OPERATIONS, operation))
        })
        .or_else(|| (facts.tool_name && facts.operation_name.is_none()).then_some(Rule::Tool))
        .or_else(|| facts.model_call_hint.then_some(Rule::Model))
        .unwrap_or(Rule::Other);
    match rule {
        Rule::Agent if is_root => SpanKind::Turn,
        Rule::Agent => SpanKind::Subagent,
        Rule::RootTurn if is_root => SpanKind::Turn,
        Rule::RootTurn | Rule::Other => SpanKind::Other,
        Rule::Tool => SpanKind::Tool,
        Rule::Model => SpanKind::Model,
    }
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
            (&[("gen_ai.operation.name", "invoke_workflow")], Turn, Other),
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
            // Defines an agent, runs nothing: not a turn (it was one before the audit).
            (
                &[
                    ("gen_ai.operation.name", "create_agent"),
                    ("gen_ai.request.model", "gpt-4o"),
                ],
                Other,
                Other,
            ),
            // Not model calls, though they carry the model hint's attributes.
            (
                &[
                    ("gen_ai.operation.name", "retrieval"),
                    ("gen_ai.provider.name", "pinecone"),
                ],
                Other,
                Other,
            ),
            (
                &[
                    ("gen_ai.operation.name", "search_memory"),
                    ("gen_ai.system", "openai"),
                ],
                Other,
                Other,
            ),
            (&[("gen_ai.operation.name", "update_memory")], Other, Other),
            (&[("gen_ai.operation.name", "delete_memory")], Other, Other),
            (
                &[("gen_ai.operation.name", "create_memory_store")],
                Other,
                Other,
            ),
            (
                &[("gen_ai.operation.name", "delete_memory_store")],
                Other,
                Other,
            ),
            (&[("openinference.span.kind", "AGENT")], Turn, Subagent),
            (&[("openinference.span.kind", "TOOL")], Tool, Tool),
            (&[("openinference.span.kind", "LLM")], Model, Model),
            (&[("openinference.span.kind", "EMBEDDING")], Model, Model),
            (&[("openinference.span.kind", "CHAIN")], Turn, Other),
            (&[("openinference.span.kind", "RETRIEVER")], Other, Other),
            (&[("openinference.span.kind", "RERANKER")], Other, Other),
            (&[("openinference.span.kind", "GUARDRAIL")], Other, Other),
            (&[("openinference.span.kind", "EVALUATOR")], Other, Other),
            (&[("openinference.span.kind", "PROMPT")], Other, Other),
            (&[("traceloop.span.kind", "agent")], Turn, Subagent),
            (&[("traceloop.span.kind", "tool")], Tool, Tool),
            (&[("traceloop.span.kind", "workflow")], Turn, Other),
            (&[("traceloop.span.kind", "task")], Other, Other),
            (&[("langfuse.observation.type", "generation")], Model, Model),
            (&[("langfuse.observation.type", "embedding")], Model, Model),
            (&[("langfuse.observation.type", "agent")], Turn, Subagent),
            (&[("langfuse.observation.type", "tool")], Tool, Tool),
            (&[("langfuse.observation.type", "span")], Other, Other),
            (&[("langfuse.observation.type", "chain")], Other, Other),
            (&[("langfuse.observation.type", "retriever")], Other, Other),
            (&[("langfuse.observation.type", "evaluator")], Other, Other),
            (&[("langfuse.observation.type", "guardrail")], Other, Other),
            (&[("langfuse.observation.type", "event")], Other, Other),
            // An unknown Langfuse type falls through to the next rows.
            (
                &[
                    ("langfuse.observation.type", "future_type"),
                    ("gen_ai.system", "openai"),
                ],
                Model,
                Model,
            ),
            (&[("ai.operationId", "ai.toolCall")], Tool, Tool),
            (&[("ai.operationId", "ai.generateText")], Turn, Other),
            (&[("ai.operationId", "ai.streamText")], Turn, Other),
            (&[("ai.operationId", "ai.generateObject")], Turn, Other),
            (&[("ai.operationId", "ai.streamObject")], Turn, Other),
            (&[("ai.operationId", "ai.embedMany")], Turn, Other),
            (&[("ai.operationId", "ai.embed")], Turn, Other),
            // Embedding calls carry no gen_ai.* hint: named.
            (&[("ai.operationId", "ai.embedMany.doEmbed")], Model, Model),
            (&[("ai.operationId", "ai.embed.doEmbed")], Model, Model),
            // The model call inside a Vercel top-level call: its gen_ai.* hint decides.
            (
                &[
                    ("ai.operationId", "ai.generateText.doGenerate"),
                    ("gen_ai.system", "openai.chat"),
                ],
                Model,
                Model,
            ),
            (&[("gen_ai.tool.name", "web_search")], Tool, Tool),
            // A tool name with an operation name: the operation's row decides, or the rows
            // after this one when the operation is unknown.
            (
                &[
                    ("gen_ai.operation.name", "custom_step"),
                    ("gen_ai.tool.name", "web_search"),
                ],
                Other,
                Other,
            ),
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
    fn precedence_follows_the_table_top_to_bottom() {
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
                    ("gen_ai.operation.name", "custom_operation"),
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
        // Traceloop beats Langfuse.
        assert_eq!(
            kind_of(
                &[
                    ("langfuse.observation.type", "generation"),
                    ("traceloop.span.kind", "task")
                ],
                false
            ),
            SpanKind::Other
        );
        // Langfuse beats Vercel, which beats a tool name, which beats the model hint.
        assert_eq!(
            kind_of(
                &[
                    ("ai.operationId", "ai.generateText"),
                    ("langfuse.observation.type", "tool")
                ],
                true
            ),
            SpanKind::Tool
        );
        assert_eq!(
            kind_of(
                &[
                    ("gen_ai.tool.name", "web_search"),
                    ("ai.operationId", "ai.generateText")
                ],
                true
            ),
            SpanKind::Turn
        );
        assert_eq!(
            kind_of(
                &[
                    ("gen_ai.request.model", "gpt-4o"),
                    ("gen_ai.tool.name", "web_search")
                ],
                false
            ),
            SpanKind::Tool
        );
        // A known operation beats a tool name.
        assert_eq!(
            kind_of(
                &[
                    ("gen_ai.tool.name", "web_search"),
                    ("gen_ai.operation.name", "chat")
                ],
                false
            ),
            SpanKind::Model
        );
        // Values are matched case-insensitively, and trimmed.
        assert_eq!(
            kind_of(&[("openinference.span.kind", "agent")], true),
            SpanKind::Turn
        );
        assert_eq!(
            kind_of(&[("langfuse.observation.type", " Generation ")], false),
            SpanKind::Model
        );
        assert_eq!(
            kind_of(&[("ai.operationId", "AI.TOOLCALL")], false),
            SpanKind::Tool
        );
        assert_eq!(
            kind_of(&[("gen_ai.operation.name", "Invoke_Workflow")], true),
            SpanKind::Turn
        );
    }
}
