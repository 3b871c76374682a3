//! The span attributes the mapping reads, found in one pass over a span's attributes.
//!
//! The attribute names are tables (not scattered string literals) so the documentation test can
//! check that `docs/otlp.md` names every one, and a kind or usage rule reads a field instead of
//! searching the attribute list again. Within each usage table the first name is preferred: a
//! span carrying both the current GenAI name and an older alias uses the current one.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};

/// The GenAI operation (`invoke_agent`, `execute_tool`, `chat`, …).
pub(crate) const OPERATION_NAME: &str = "gen_ai.operation.name";
/// OpenInference's span kind (`AGENT`, `TOOL`, `LLM`, …).
pub(crate) const OPENINFERENCE_KIND: &str = "openinference.span.kind";
/// OpenLLMetry's (Traceloop's) span kind (`workflow`, `task`, `agent`, `tool`).
pub(crate) const TRACELOOP_KIND: &str = "traceloop.span.kind";
/// Attributes whose mere presence marks a model call when no kind attribute decided.
pub(crate) const MODEL_CALL_HINTS: &[&str] = &[
    "gen_ai.request.model",
    "gen_ai.system",
    "gen_ai.provider.name",
    "llm.request.type",
];
/// Session ids, preferred first.
pub(crate) const SESSION_KEYS: &[&str] = &["session.id", "gen_ai.conversation.id"];
/// Model names, preferred first: the model that answered, then the one asked for.
pub(crate) const MODEL_KEYS: &[&str] = &[
    "gen_ai.response.model",
    "gen_ai.request.model",
    "llm.model_name",
];
/// Logfire marks its pending (in-progress) span announcements with `pending_span` here.
pub(crate) const LOGFIRE_SPAN_TYPE: &str = "logfire.span_type";
/// Logfire's hex parent id of the real span a pending span announces.
pub(crate) const LOGFIRE_PENDING_PARENT: &str = "logfire.pending_parent_id";

/// Input (prompt) tokens, preferred first.
pub(crate) const INPUT_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.token_count.prompt",
    "llm.usage.prompt_tokens",
];
/// Output (completion) tokens, preferred first.
pub(crate) const OUTPUT_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
    "llm.usage.completion_tokens",
];
/// Input tokens read from the provider's prompt cache, preferred first.
pub(crate) const CACHE_READ_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "llm.token_count.prompt_details.cache_read",
    "llm.usage.cache_read_input_tokens",
];
/// Input tokens written to the provider's prompt cache, preferred first.
pub(crate) const CACHE_CREATION_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.cache_creation_input_tokens",
    "llm.token_count.prompt_details.cache_write",
    "llm.usage.cache_creation_input_tokens",
];
/// A cost in USD reported by the instrumentation, preferred first.
pub(crate) const COST_KEYS: &[&str] = &["gen_ai.usage.cost", "llm.cost.total", "operation.cost"];

/// Most names any one table has (the candidate slots of [`Facts`]).
const MAX_ALIASES: usize = 4;

/// Candidates for one field, by preference.
pub(crate) type Candidates<'a> = [Option<&'a AnyValue>; MAX_ALIASES];

/// What one span's attributes say, by reference (nothing is copied).
#[derive(Debug, Default)]
pub(crate) struct Facts<'a> {
    pub(crate) operation_name: Option<&'a str>,
    pub(crate) openinference_kind: Option<&'a str>,
    pub(crate) traceloop_kind: Option<&'a str>,
    /// Any of [`MODEL_CALL_HINTS`] is present.
    pub(crate) model_call_hint: bool,
    pub(crate) session: Candidates<'a>,
    pub(crate) model: Candidates<'a>,
    pub(crate) logfire_span_type: Option<&'a str>,
    pub(crate) logfire_pending_parent: Option<&'a AnyValue>,
    pub(crate) input_tokens: Candidates<'a>,
    pub(crate) output_tokens: Candidates<'a>,
    pub(crate) cache_read_tokens: Candidates<'a>,
    pub(crate) cache_creation_tokens: Candidates<'a>,
    pub(crate) cost: Candidates<'a>,
}

impl<'a> Facts<'a> {
    /// Read `attributes` once. A repeated key: the last occurrence wins, as in the attrs object.
    pub(crate) fn scan(attributes: &'a [KeyValue]) -> Self {
        let mut facts = Facts::default();
        for attribute in attributes {
            let key = attribute.key.as_str();
            let value = attribute.value.as_ref();
            match key {
                OPERATION_NAME => facts.operation_name = value.and_then(as_str),
                OPENINFERENCE_KIND => facts.openinference_kind = value.and_then(as_str),
                TRACELOOP_KIND => facts.traceloop_kind = value.and_then(as_str),
                LOGFIRE_SPAN_TYPE => facts.logfire_span_type = value.and_then(as_str),
                LOGFIRE_PENDING_PARENT => facts.logfire_pending_parent = value,
                _ => {}
            }
            if MODEL_CALL_HINTS.contains(&key) {
                facts.model_call_hint = true;
            }
            // Only namespaced keys can be in the tables below: skip the rest cheaply.
            if !(key.starts_with("gen_ai.")
                || key.starts_with("llm.")
                || key.starts_with("session.")
                || key.starts_with("operation."))
            {
                continue;
            }
            let tables: [(&[&str], &mut Candidates<'a>); 7] = [
                (SESSION_KEYS, &mut facts.session),
                (MODEL_KEYS, &mut facts.model),
                (INPUT_TOKEN_KEYS, &mut facts.input_tokens),
                (OUTPUT_TOKEN_KEYS, &mut facts.output_tokens),
                (CACHE_READ_TOKEN_KEYS, &mut facts.cache_read_tokens),
                (CACHE_CREATION_TOKEN_KEYS, &mut facts.cache_creation_tokens),
                (COST_KEYS, &mut facts.cost),
            ];
            for (names, slots) in tables {
                if let Some(position) = names.iter().position(|name| *name == key) {
                    if let Some(slot) = slots.get_mut(position) {
                        *slot = value;
                    }
                    break;
                }
            }
        }
        facts
    }
}

/// The string inside an attribute value, if it is one.
pub(crate) fn as_str(value: &AnyValue) -> Option<&str> {
    match value.value.as_ref()? {
        any_value::Value::StringValue(text) => Some(text),
        _ => None,
    }
}

/// The first candidate for which `read` gives a value.
pub(crate) fn first_of<'a, T>(
    candidates: &Candidates<'a>,
    read: impl Fn(&'a AnyValue) -> Option<T>,
) -> Option<T> {
    candidates.iter().flatten().find_map(|value| read(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{int, kv, string};

    #[test]
    fn every_table_fits_the_candidate_slots() {
        for table in [
            SESSION_KEYS,
            MODEL_KEYS,
            INPUT_TOKEN_KEYS,
            OUTPUT_TOKEN_KEYS,
            CACHE_READ_TOKEN_KEYS,
            CACHE_CREATION_TOKEN_KEYS,
            COST_KEYS,
        ] {
            assert!(table.len() <= MAX_ALIASES, "{table:?}");
        }
    }

    #[test]
    fn the_preferred_name_wins_whatever_the_order() {
        let attributes = vec![
            kv("llm.token_count.prompt", int(7)),
            kv("gen_ai.usage.input_tokens", int(5)),
            kv("gen_ai.operation.name", string("chat")),
        ];
        let facts = Facts::scan(&attributes);
        let read_int = |value: &AnyValue| match value.value {
            Some(any_value::Value::IntValue(number)) => Some(number),
            _ => None,
        };
        assert_eq!(first_of(&facts.input_tokens, read_int), Some(5));
        assert_eq!(facts.operation_name, Some("chat"));
        assert!(!facts.model_call_hint);
    }
}
