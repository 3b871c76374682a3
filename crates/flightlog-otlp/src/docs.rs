//! Keeps `docs/otlp.md` in sync with the code: every attribute name the mapping reads (and
//! every key it reads inside Langfuse's JSON details), every attribute value a kind rule
//! recognises, every attrs key it writes, the price table's version and the attribute cap must
//! appear there.

#[cfg(test)]
mod tests {
    use crate::attributes::MAX_ATTRIBUTE_VALUE_BYTES;
    use crate::facts::{scanned_names, EXCEPTION_EVENT, EXCEPTION_MESSAGE};
    use crate::kind::{
        GEN_AI_OPERATIONS, LANGFUSE_OBSERVATION_TYPES, OPENINFERENCE_KINDS, TRACELOOP_KINDS,
        VERCEL_OPERATIONS,
    };
    use crate::mapping::{
        COST_SOURCE_KEY, DROPPED_EVENTS_KEY, DROPPED_LINKS_KEY, LINKS_KEY, OTEL_SPAN_KIND_KEY,
        PRICE_TABLE_KEY, REMOTE_PARENT_KEY, RESOURCE_KEY, SCOPE_KEY,
    };
    use crate::prices::PriceTable;
    use crate::usage::{
        COST_DETAILS_TOTAL, LANGFUSE_CACHE_CREATION_KEYS, LANGFUSE_CACHE_READ_KEYS, LANGFUSE_INPUT,
        LANGFUSE_OUTPUT, MAX_DETAILS_BYTES, OPENAI_CACHED_TOKENS, OPENAI_COMPLETION_TOKENS,
        OPENAI_PROMPT_DETAILS, OPENAI_PROMPT_TOKENS,
    };

    const DOC: &str = include_str!("../docs/otlp.md");

    fn assert_documented(name: &str) {
        assert!(
            DOC.contains(&format!("`{name}`")),
            "docs/otlp.md does not mention `{name}`"
        );
    }

    #[test]
    fn every_attribute_name_is_documented() {
        for name in scanned_names() {
            assert_documented(name);
        }
        // Read on span events, not among the span's attributes.
        for name in [EXCEPTION_EVENT, EXCEPTION_MESSAGE] {
            assert_documented(name);
        }
    }

    #[test]
    fn every_key_read_inside_langfuse_details_is_documented() {
        let singles = [
            OPENAI_PROMPT_TOKENS,
            OPENAI_COMPLETION_TOKENS,
            OPENAI_PROMPT_DETAILS,
            OPENAI_CACHED_TOKENS,
            LANGFUSE_INPUT,
            LANGFUSE_OUTPUT,
            COST_DETAILS_TOTAL,
        ];
        let tables = [LANGFUSE_CACHE_READ_KEYS, LANGFUSE_CACHE_CREATION_KEYS];
        for name in singles
            .into_iter()
            .chain(tables.into_iter().flatten().copied())
        {
            assert_documented(name);
        }
        assert_eq!(MAX_DETAILS_BYTES, 4_096);
        assert!(DOC.contains("longer than 4,096 bytes"));
    }

    #[test]
    fn every_recognised_kind_value_is_documented() {
        for table in [
            GEN_AI_OPERATIONS,
            OPENINFERENCE_KINDS,
            TRACELOOP_KINDS,
            LANGFUSE_OBSERVATION_TYPES,
            VERCEL_OPERATIONS,
        ] {
            for (value, _) in table {
                assert_documented(value);
            }
        }
    }

    #[test]
    fn every_attrs_key_is_documented() {
        for key in [
            RESOURCE_KEY,
            SCOPE_KEY,
            LINKS_KEY,
            OTEL_SPAN_KIND_KEY,
            COST_SOURCE_KEY,
            PRICE_TABLE_KEY,
            REMOTE_PARENT_KEY,
            DROPPED_EVENTS_KEY,
            DROPPED_LINKS_KEY,
        ] {
            assert_documented(key);
        }
    }

    #[test]
    fn the_price_table_version_and_the_cap_are_documented() {
        assert_documented(PriceTable::bundled().version());
        assert_eq!(MAX_ATTRIBUTE_VALUE_BYTES, 16_384);
        assert!(DOC.contains("**16,384 bytes**"));
    }
}
