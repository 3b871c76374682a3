//! Keeps `docs/otlp.md` in sync with the code: every attribute name the mapping reads, every
//! attrs key it writes, the price table's version and the attribute cap must appear there.

#[cfg(test)]
mod tests {
    use crate::attributes::MAX_ATTRIBUTE_VALUE_BYTES;
    use crate::facts::{
        CACHE_CREATION_TOKEN_KEYS, CACHE_READ_TOKEN_KEYS, COST_KEYS, INPUT_TOKEN_KEYS,
        LOGFIRE_PENDING_PARENT, LOGFIRE_SPAN_TYPE, MODEL_CALL_HINTS, MODEL_KEYS,
        OPENINFERENCE_KIND, OPERATION_NAME, OUTPUT_TOKEN_KEYS, SESSION_KEYS, TRACELOOP_KIND,
    };
    use crate::mapping::{
        COST_SOURCE_KEY, LINKS_KEY, OTEL_SPAN_KIND_KEY, PRICE_TABLE_KEY, RESOURCE_KEY, SCOPE_KEY,
    };
    use crate::prices::PriceTable;

    const DOC: &str = include_str!("../docs/otlp.md");

    fn assert_documented(name: &str) {
        assert!(
            DOC.contains(&format!("`{name}`")),
            "docs/otlp.md does not mention `{name}`"
        );
    }

    #[test]
    fn every_attribute_name_is_documented() {
        let tables = [
            SESSION_KEYS,
            MODEL_KEYS,
            MODEL_CALL_HINTS,
            INPUT_TOKEN_KEYS,
            OUTPUT_TOKEN_KEYS,
            CACHE_READ_TOKEN_KEYS,
            CACHE_CREATION_TOKEN_KEYS,
            COST_KEYS,
        ];
        for name in tables.into_iter().flatten() {
            assert_documented(name);
        }
        for name in [
            OPERATION_NAME,
            OPENINFERENCE_KIND,
            TRACELOOP_KIND,
            LOGFIRE_SPAN_TYPE,
            LOGFIRE_PENDING_PARENT,
        ] {
            assert_documented(name);
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
