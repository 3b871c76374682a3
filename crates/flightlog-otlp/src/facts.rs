//! The span attributes the mapping reads, found in one pass over a span's attributes.
//!
//! The attribute names are tables (not scattered string literals) so the documentation test can
//! check that `docs/otlp.md` names every one, and a kind or usage rule reads a field instead of
//! searching the attribute list again. Within each usage table the first name is preferred: a
//! span carrying both the current GenAI name and an older alias uses the current one.
//!
//! Every span attribute name read lives in one of a few namespaces (`gen_ai.`, `llm.`, `ai.`,
//! …; see [`may_be_read`]): the scan skips any other attribute after looking at its first byte
//! (and, for a few first letters, a short prefix), so the many attributes no rule reads (HTTP,
//! database, the application's own) cost next to nothing, and nothing is allocated.

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};

/// The GenAI operation (`invoke_agent`, `execute_tool`, `chat`, …).
pub(crate) const OPERATION_NAME: &str = "gen_ai.operation.name";
/// OpenInference's span kind (`AGENT`, `TOOL`, `LLM`, …).
pub(crate) const OPENINFERENCE_KIND: &str = "openinference.span.kind";
/// OpenLLMetry's (Traceloop's) span kind (`workflow`, `task`, `agent`, `tool`).
pub(crate) const TRACELOOP_KIND: &str = "traceloop.span.kind";
/// Langfuse SDK v3's observation type (`generation`, `agent`, `tool`, `span`, …).
pub(crate) const LANGFUSE_OBSERVATION_TYPE: &str = "langfuse.observation.type";
/// Langfuse's token counts, a JSON object in a string (see `usage::usage_from_details`).
pub(crate) const LANGFUSE_USAGE_DETAILS: &str = "langfuse.observation.usage_details";
/// Langfuse's costs in USD, a JSON object in a string (see `usage::cost_from_details`).
pub(crate) const LANGFUSE_COST_DETAILS: &str = "langfuse.observation.cost_details";
/// The Vercel AI SDK's operation (`ai.generateText`, `ai.toolCall`, …).
pub(crate) const VERCEL_OPERATION_ID: &str = "ai.operationId";
/// The GenAI name of the tool a span executes.
pub(crate) const TOOL_NAME: &str = "gen_ai.tool.name";
/// The OpenTelemetry class of an error (`timeout`, `java.net.UnknownHostException`, `500`, …).
pub(crate) const ERROR_TYPE: &str = "error.type";
/// The name of the span event an exception is recorded as.
pub(crate) const EXCEPTION_EVENT: &str = "exception";
/// The exception event's attribute holding the exception's message.
pub(crate) const EXCEPTION_MESSAGE: &str = "exception.message";
/// Attributes whose mere presence marks a model call when no kind attribute decided.
pub(crate) const MODEL_CALL_HINTS: &[&str] = &[
    "gen_ai.request.model",
    "gen_ai.system",
    "gen_ai.provider.name",
    "llm.request.type",
];
/// Session ids, preferred first.
pub(crate) const SESSION_KEYS: &[&str] = &[
    "session.id",
    "gen_ai.conversation.id",
    "traceloop.association.properties.session_id",
    // The Vercel AI SDK's telemetry metadata, where Langfuse's and others' guides put it.
    "ai.telemetry.metadata.sessionId",
];
/// Model names, preferred first: the model that answered, then the one asked for.
pub(crate) const MODEL_KEYS: &[&str] = &[
    "gen_ai.response.model",
    "gen_ai.request.model",
    "llm.model_name",
    // OpenInference's embedding spans name their model here, not in `llm.model_name`.
    "embedding.model_name",
    "langfuse.observation.model.name",
    "ai.model.id",
];
/// The provider's id of a model call, preferred first: two spans with one id record one call.
pub(crate) const CALL_ID_KEYS: &[&str] = &["gen_ai.response.id", "ai.response.id"];
/// OpenInference's record of a span's output (for a model call, the provider's response, whose
/// top-level `id` is the call id when [`OPENINFERENCE_OUTPUT_MIME_TYPE`] says JSON).
pub(crate) const OPENINFERENCE_OUTPUT_VALUE: &str = "output.value";
/// The media type of [`OPENINFERENCE_OUTPUT_VALUE`] (`application/json`, `text/plain`).
pub(crate) const OPENINFERENCE_OUTPUT_MIME_TYPE: &str = "output.mime_type";
/// Logfire marks its pending (in-progress) span announcements with `pending_span` here.
pub(crate) const LOGFIRE_SPAN_TYPE: &str = "logfire.span_type";
/// Logfire's hex parent id of the real span a pending span announces.
pub(crate) const LOGFIRE_PENDING_PARENT: &str = "logfire.pending_parent_id";
/// Logfire's formatted message (`step 3`), where the OTLP span name is its template
/// (`step {i}`).
pub(crate) const LOGFIRE_MESSAGE: &str = "logfire.msg";

/// Input (prompt) tokens, preferred first.
pub(crate) const INPUT_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.token_count.prompt",
    "llm.usage.prompt_tokens",
    "ai.usage.promptTokens",
    "ai.usage.inputTokens",
    // The Vercel AI SDK's embedding calls (`ai.embed`, `ai.embedMany`): input tokens only.
    "ai.usage.tokens",
];
/// Output (completion) tokens, preferred first.
pub(crate) const OUTPUT_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
    "llm.usage.completion_tokens",
    "ai.usage.completionTokens",
    "ai.usage.outputTokens",
];
/// Input tokens read from the provider's prompt cache, preferred first.
pub(crate) const CACHE_READ_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "gen_ai.usage.details.cache_read_input_tokens",
    "gen_ai.usage.details.cache_read_tokens",
    "llm.token_count.prompt_details.cache_read",
    "llm.usage.cache_read_input_tokens",
    "ai.usage.inputTokenDetails.cacheReadTokens",
    "ai.usage.cachedInputTokens",
];
/// Input tokens written to the provider's prompt cache, preferred first. The GenAI convention
/// renamed `cache_creation` to `cache_write` (semantic-conventions-genai#440), and
/// opentelemetry-util-genai 1.3 (behind the `opentelemetry-instrumentation-genai-*` packages)
/// writes the new name.
pub(crate) const CACHE_CREATION_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.cache_write.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.cache_creation_input_tokens",
    "gen_ai.usage.cache_write_input_tokens",
    "gen_ai.usage.details.cache_creation_input_tokens",
    "gen_ai.usage.details.cache_write_tokens",
    "llm.token_count.prompt_details.cache_write",
    "llm.usage.cache_creation_input_tokens",
    // Vercel AI SDK 6 (its `ai.usage.inputTokens` includes these, as the others' counts do).
    "ai.usage.inputTokenDetails.cacheWriteTokens",
];
/// A cost in USD reported by the instrumentation, preferred first.
pub(crate) const COST_KEYS: &[&str] = &["gen_ai.usage.cost", "llm.cost.total", "operation.cost"];
/// Parts of a cost in USD (OpenInference's prompt and completion costs), summed when no
/// [`COST_KEYS`] total is reported.
pub(crate) const COST_PART_KEYS: &[&str] = &["llm.cost.prompt", "llm.cost.completion"];

/// Most names any one table has (the candidate slots of [`Facts`]).
const MAX_ALIASES: usize = 9;

// A name past the slots would be read never, without a word: every table must fit.
const _: () = {
    let mut index = 0;
    while index < ALIAS_TABLES.len() {
        assert!(
            ALIAS_TABLES[index].len() <= MAX_ALIASES,
            "a name table has more names than slots"
        );
        index += 1;
    }
};

/// Candidates for one field, by preference.
pub(crate) type Candidates<'a> = [Option<&'a AnyValue>; MAX_ALIASES];

/// What one span's attributes say, by reference (nothing is copied).
#[derive(Debug, Default)]
pub(crate) struct Facts<'a> {
    pub(crate) operation_name: Option<&'a str>,
    pub(crate) openinference_kind: Option<&'a str>,
    pub(crate) traceloop_kind: Option<&'a str>,
    pub(crate) langfuse_observation_type: Option<&'a str>,
    pub(crate) vercel_operation_id: Option<&'a str>,
    /// [`TOOL_NAME`] is present.
    pub(crate) tool_name: bool,
    /// Any of [`MODEL_CALL_HINTS`] is present.
    pub(crate) model_call_hint: bool,
    pub(crate) session: Candidates<'a>,
    pub(crate) model: Candidates<'a>,
    pub(crate) call_id: Candidates<'a>,
    pub(crate) logfire_span_type: Option<&'a str>,
    pub(crate) logfire_pending_parent: Option<&'a AnyValue>,
    pub(crate) logfire_message: Option<&'a str>,
    pub(crate) output_value: Option<&'a str>,
    pub(crate) output_mime_type: Option<&'a str>,
    pub(crate) error_type: Option<&'a str>,
    pub(crate) input_tokens: Candidates<'a>,
    pub(crate) output_tokens: Candidates<'a>,
    pub(crate) cache_read_tokens: Candidates<'a>,
    pub(crate) cache_creation_tokens: Candidates<'a>,
    pub(crate) cost: Candidates<'a>,
    pub(crate) cost_parts: Candidates<'a>,
    pub(crate) langfuse_usage_details: Option<&'a str>,
    pub(crate) langfuse_cost_details: Option<&'a str>,
}

impl<'a> Facts<'a> {
    /// Read `attributes` once. A repeated key: the last occurrence wins, as in the attrs object.
    pub(crate) fn scan(attributes: &'a [KeyValue]) -> Self {
        let mut facts = Facts::default();
        for attribute in attributes {
            let key = attribute.key.as_str();
            // Only namespaced keys are read at all: skip the rest cheaply.
            if !may_be_read(key) {
                continue;
            }
            let value = attribute.value.as_ref();
            match key {
                OPERATION_NAME => facts.operation_name = value.and_then(as_str),
                OPENINFERENCE_KIND => facts.openinference_kind = value.and_then(as_str),
                TRACELOOP_KIND => facts.traceloop_kind = value.and_then(as_str),
                LANGFUSE_OBSERVATION_TYPE => {
                    facts.langfuse_observation_type = value.and_then(as_str);
                }
                LANGFUSE_USAGE_DETAILS => facts.langfuse_usage_details = value.and_then(as_str),
                LANGFUSE_COST_DETAILS => facts.langfuse_cost_details = value.and_then(as_str),
                VERCEL_OPERATION_ID => facts.vercel_operation_id = value.and_then(as_str),
                TOOL_NAME => facts.tool_name = true,
                ERROR_TYPE => facts.error_type = value.and_then(as_str),
                LOGFIRE_SPAN_TYPE => facts.logfire_span_type = value.and_then(as_str),
                LOGFIRE_PENDING_PARENT => facts.logfire_pending_parent = value,
                LOGFIRE_MESSAGE => facts.logfire_message = value.and_then(as_str),
                OPENINFERENCE_OUTPUT_VALUE => facts.output_value = value.and_then(as_str),
                OPENINFERENCE_OUTPUT_MIME_TYPE => {
                    facts.output_mime_type = value.and_then(as_str);
                }
                _ => {}
            }
            if MODEL_CALL_HINTS.contains(&key) {
                facts.model_call_hint = true;
            }
            let tables: [(&[&str], &mut Candidates<'a>); 9] = [
                (SESSION_KEYS, &mut facts.session),
                (MODEL_KEYS, &mut facts.model),
                (CALL_ID_KEYS, &mut facts.call_id),
                (INPUT_TOKEN_KEYS, &mut facts.input_tokens),
                (OUTPUT_TOKEN_KEYS, &mut facts.output_tokens),
                (CACHE_READ_TOKEN_KEYS, &mut facts.cache_read_tokens),
                (CACHE_CREATION_TOKEN_KEYS, &mut facts.cache_creation_tokens),
                (COST_KEYS, &mut facts.cost),
                (COST_PART_KEYS, &mut facts.cost_parts),
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

/// Whether `key` is in one of the namespaces the mapping reads (`gen_ai.`, `llm.`,
/// `langfuse.`, `logfire.`, `session.`, `operation.`, `openinference.`, `output.`, `ai.`, `traceloop.`,
/// `error.`, `embedding.`). The first byte picks the one to three prefixes worth comparing, so most keys of
/// no such namespace cost a single byte comparison.
fn may_be_read(key: &str) -> bool {
    let prefixes: &[&str] = match key.as_bytes().first() {
        Some(b'g') => &["gen_ai."],
        Some(b'l') => &["llm.", "langfuse.", "logfire."],
        Some(b's') => &["session."],
        Some(b'o') => &["operation.", "openinference.", "output."],
        Some(b'a') => &["ai."],
        Some(b't') => &["traceloop."],
        Some(b'e') => &["error.", "embedding."],
        _ => return false,
    };
    prefixes.iter().any(|prefix| key.starts_with(prefix))
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

/// The tables of names read into candidate slots, preferred name first.
pub(crate) const ALIAS_TABLES: [&[&str]; 9] = [
    SESSION_KEYS,
    MODEL_KEYS,
    CALL_ID_KEYS,
    INPUT_TOKEN_KEYS,
    OUTPUT_TOKEN_KEYS,
    CACHE_READ_TOKEN_KEYS,
    CACHE_CREATION_TOKEN_KEYS,
    COST_KEYS,
    COST_PART_KEYS,
];

/// Every attribute name the scan reads, singular or in a table (for the tests that hold the
/// namespace filter and the docs to it).
#[cfg(test)]
pub(crate) fn scanned_names() -> Vec<&'static str> {
    let singular = [
        OPERATION_NAME,
        OPENINFERENCE_KIND,
        TRACELOOP_KIND,
        LANGFUSE_OBSERVATION_TYPE,
        LANGFUSE_USAGE_DETAILS,
        LANGFUSE_COST_DETAILS,
        VERCEL_OPERATION_ID,
        TOOL_NAME,
        ERROR_TYPE,
        LOGFIRE_SPAN_TYPE,
        LOGFIRE_PENDING_PARENT,
        OPENINFERENCE_OUTPUT_VALUE,
        OPENINFERENCE_OUTPUT_MIME_TYPE,
    ];
    singular
        .into_iter()
        .chain(MODEL_CALL_HINTS.iter().copied())
        .chain(ALIAS_TABLES.into_iter().flatten().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{int, kv, string};

    /// The prefixes of every attribute name the scan reads; `may_be_read` admits exactly these.
    const READ_NAMESPACES: &[&str] = &[
        "gen_ai.",
        "llm.",
        "langfuse.",
        "logfire.",
        "session.",
        "operation.",
        "openinference.",
        "output.",
        "ai.",
        "traceloop.",
        "error.",
        "embedding.",
    ];

    #[test]
    fn every_table_fits_the_candidate_slots() {
        for table in ALIAS_TABLES {
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

    #[test]
    fn the_namespace_filter_admits_every_read_name_and_nothing_else() {
        for name in scanned_names() {
            assert!(may_be_read(name), "{name} is filtered out");
            assert!(
                READ_NAMESPACES
                    .iter()
                    .any(|namespace| name.starts_with(namespace)),
                "{name} is in no namespace"
            );
        }
        for namespace in READ_NAMESPACES {
            assert!(may_be_read(&format!("{namespace}x")), "{namespace}");
        }
        for other in [
            "",
            "a",
            "ai",
            "aix.usage.promptTokens",
            "gen_aix.usage.input_tokens",
            "http.method",
            "service.name",
            "exception.message",
            "Gen_ai.operation.name",
        ] {
            assert!(!may_be_read(other), "{other:?} is admitted");
        }
    }

    #[test]
    fn every_table_name_fills_its_own_slot() {
        type Table = (
            &'static [&'static str],
            for<'a, 'f> fn(&'f Facts<'a>) -> &'f Candidates<'a>,
        );
        let tables: [Table; 7] = [
            (SESSION_KEYS, |facts| &facts.session),
            (MODEL_KEYS, |facts| &facts.model),
            (INPUT_TOKEN_KEYS, |facts| &facts.input_tokens),
            (OUTPUT_TOKEN_KEYS, |facts| &facts.output_tokens),
            (CACHE_READ_TOKEN_KEYS, |facts| &facts.cache_read_tokens),
            (CACHE_CREATION_TOKEN_KEYS, |facts| {
                &facts.cache_creation_tokens
            }),
            (COST_KEYS, |facts| &facts.cost),
        ];
        for (names, slots) in tables {
            for (position, name) in names.iter().enumerate() {
                let attributes = vec![kv(name, string("value"))];
                let facts = Facts::scan(&attributes);
                let filled: Vec<usize> = slots(&facts)
                    .iter()
                    .enumerate()
                    .filter(|(_, slot)| slot.is_some())
                    .map(|(slot, _)| slot)
                    .collect();
                assert_eq!(filled, vec![position], "{name}");
            }
        }
    }

    #[test]
    fn singular_names_are_read() {
        let attributes = vec![
            kv(LANGFUSE_OBSERVATION_TYPE, string("generation")),
            kv(LANGFUSE_USAGE_DETAILS, string("{\"input\":1}")),
            kv(LANGFUSE_COST_DETAILS, string("{\"total\":0.5}")),
            kv(VERCEL_OPERATION_ID, string("ai.toolCall")),
            kv(TOOL_NAME, int(3)),
            kv(ERROR_TYPE, string("timeout")),
            kv(OPENINFERENCE_KIND, string("LLM")),
            kv(TRACELOOP_KIND, string("task")),
        ];
        let facts = Facts::scan(&attributes);
        assert_eq!(facts.langfuse_observation_type, Some("generation"));
        assert_eq!(facts.langfuse_usage_details, Some("{\"input\":1}"));
        assert_eq!(facts.langfuse_cost_details, Some("{\"total\":0.5}"));
        assert_eq!(facts.vercel_operation_id, Some("ai.toolCall"));
        // Presence is what counts for the tool name, whatever its type.
        assert!(facts.tool_name);
        assert_eq!(facts.error_type, Some("timeout"));
        assert_eq!(facts.openinference_kind, Some("LLM"));
        assert_eq!(facts.traceloop_kind, Some("task"));
        let empty = Facts::scan(&[]);
        assert!(!empty.tool_name);
        assert_eq!(empty.langfuse_usage_details, None);
    }
}
