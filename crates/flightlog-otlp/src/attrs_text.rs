//! A span's attrs written as JSON text straight from the decoded OTLP attributes.
//!
//! The map form ([`crate::attributes`]) builds a `serde_json` object per span (every key and
//! value allocated, the resource's object deep-copied into each span) only for the store to
//! serialize it again; that round trip was about a third of ingest's CPU per span. This writer
//! produces, byte for byte, the text serializing the map form would give (the tests compare the
//! two on every value type, capping, escaping and key collision), with the resource and scope
//! encoded once per request.
//!
//! It declines (returns `None`) where plain appending cannot reproduce the map: a key that
//! repeats (the map keeps the last value at the first key's place) or a span attribute named
//! like one of the keys the mapping adds (`resource`, `scope`, …, which replace it in place).
//! The caller then builds the map, as before.

use std::fmt::Write as _;

use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use serde_json::Value;

use crate::attributes::{any_value_to_json, capped_str, hex_capped, MAX_ATTRIBUTE_KEY_BYTES};

/// Append `text` to `out` as a JSON string literal, escaped exactly as `serde_json` escapes.
///
/// Runs of bytes that need no escape are found eight at a time ([`word_needs_escape`]) and
/// copied whole: attribute values are mostly long plain text (prompts, completions, tool input),
/// and the byte-at-a-time loop was 6% of OTLP ingest's instructions per span (callgrind).
pub(crate) fn write_json_string(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        if let Some(word) = bytes[at..].first_chunk::<8>() {
            if !word_needs_escape(u64::from_le_bytes(*word)) {
                at += 8;
                continue;
            }
        }
        let escape: Option<&str> = match byte {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            0x08 => Some("\\b"),
            0x0c => Some("\\f"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0x00..=0x1f => None,
            _ => {
                at += 1;
                continue;
            }
        };
        // Every byte that needs escaping is ASCII, so `at` is a character boundary.
        out.push_str(&text[start..at]);
        match escape {
            Some(escaped) => out.push_str(escaped),
            None => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push_str("\\u00");
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0x0f)]));
            }
        }
        at += 1;
        start = at;
    }
    out.push_str(&text[start..]);
    out.push('"');
}

/// Whether any of the eight bytes in `word` is a control character (below 0x20), `"` or `\`:
/// the classic "has a byte less than n" and "has a zero byte" tests (exact as a yes/no; bytes of
/// 0x80 and above, which every non-ASCII UTF-8 byte is, never count).
fn word_needs_escape(word: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
    let has_zero_byte = |value: u64| value.wrapping_sub(ONES) & !value & HIGH_BITS != 0;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGH_BITS != 0;
    below_space
        || has_zero_byte(word ^ (ONES * u64::from(b'"')))
        || has_zero_byte(word ^ (ONES * u64::from(b'\\')))
}

/// Append one attribute value, capped at `max_bytes` (the rules of [`crate::attributes`]).
fn write_any_value(out: &mut String, value: Option<&AnyValue>, max_bytes: usize) {
    let Some(inner) = value.and_then(|value| value.value.as_ref()) else {
        out.push_str("null");
        return;
    };
    match inner {
        any_value::Value::StringValue(text) => {
            write_json_string(out, &capped_str(text, max_bytes));
        }
        any_value::Value::BoolValue(flag) => out.push_str(if *flag { "true" } else { "false" }),
        any_value::Value::IntValue(number) => {
            // Writing to a String cannot fail.
            let _ = write!(out, "{number}");
        }
        any_value::Value::DoubleValue(number) => match serde_json::Number::from_f64(*number) {
            Some(finite) => {
                let _ = write!(out, "{finite}");
            }
            None if number.is_nan() => out.push_str("\"NaN\""),
            None if *number > 0.0 => out.push_str("\"Infinity\""),
            None => out.push_str("\"-Infinity\""),
        },
        any_value::Value::BytesValue(bytes) => {
            write_json_string(out, &hex_capped(bytes, max_bytes));
        }
        // Arrays and key-value lists are rare in agent traces and capped as a whole (measured
        // as JSON text): they go through the map form's conversion.
        any_value::Value::ArrayValue(_) | any_value::Value::KvlistValue(_) => {
            write_value(out, &any_value_to_json(value, max_bytes));
        }
        any_value::Value::StringValueStrindex(_) => out.push_str("null"),
    }
}

/// Append an already converted JSON value.
pub(crate) fn write_value(out: &mut String, value: &Value) {
    // `Value`'s Display is its compact JSON text, the same serde_json::to_string gives.
    let _ = write!(out, "{value}");
}

/// Whether `attributes` can be written by appending: no key repeats and none is in `reserved`.
fn appendable(attributes: &[KeyValue], reserved: &[&str]) -> bool {
    const SMALL: usize = 32;
    // A key over its cap is capped by the map form (see `attributes`).
    if attributes.iter().any(|attribute| {
        attribute.key.len() > MAX_ATTRIBUTE_KEY_BYTES || reserved.contains(&attribute.key.as_str())
    }) {
        return false;
    }
    if attributes.len() <= SMALL {
        // Quadratic, but over a handful of short keys it beats hashing them.
        return attributes.iter().enumerate().all(|(at, attribute)| {
            attributes[..at]
                .iter()
                .all(|earlier| earlier.key != attribute.key)
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(attributes.len());
    attributes
        .iter()
        .all(|attribute| seen.insert(attribute.key.as_str()))
}

/// One member the mapping adds after the span's own attributes.
pub(crate) enum Extra<'a> {
    /// Already JSON text (the resource and scope, encoded once per request).
    Text(&'a str),
    /// A string value.
    Str(&'a str),
    /// A converted value (links).
    Value(&'a Value),
}

/// The attrs object: the span's `attributes` (each value capped at `max_bytes`) followed by
/// `extras` in order, as compact JSON text. `None` when a key repeats, is longer than
/// [`MAX_ATTRIBUTE_KEY_BYTES`] or an attribute is named like one of `reserved` (see the module
/// doc); the caller then builds the map.
pub(crate) fn attrs_object_text(
    attributes: &[KeyValue],
    extras: &[(&str, Extra<'_>)],
    reserved: &[&str],
    max_bytes: usize,
    size_hint: usize,
) -> Option<String> {
    if !appendable(attributes, reserved) {
        return None;
    }
    let mut out = String::with_capacity(size_hint);
    out.push('{');
    let mut first = true;
    let mut separate = |out: &mut String| {
        if !first {
            out.push(',');
        }
        first = false;
    };
    for attribute in attributes {
        separate(&mut out);
        write_json_string(&mut out, &attribute.key);
        out.push(':');
        write_any_value(&mut out, attribute.value.as_ref(), max_bytes);
    }
    for (key, extra) in extras {
        separate(&mut out);
        write_json_string(&mut out, key);
        out.push(':');
        match extra {
            Extra::Text(text) => out.push_str(text),
            Extra::Str(text) => write_json_string(&mut out, text),
            Extra::Value(value) => write_value(&mut out, value),
        }
    }
    out.push('}');
    Some(out)
}

#[cfg(test)]
mod tests {
    use flightlog_core::activity::{JsonObject, TRUNCATION_MARKER};
    use proptest::prelude::*;

    use super::*;
    use crate::attributes::attributes_to_json;
    use crate::test_support::{array, bytes, double, int, kv, kvlist, string};

    fn map_text(attributes: &[KeyValue], max_bytes: usize) -> String {
        serde_json::to_string(&attributes_to_json(attributes, max_bytes)).unwrap()
    }

    fn direct_text(attributes: &[KeyValue], max_bytes: usize) -> Option<String> {
        attrs_object_text(attributes, &[], &["resource"], max_bytes, 64)
    }

    #[test]
    fn strings_escape_exactly_as_serde_json() {
        let mut every_ascii: String = (0u8..0x80).map(char::from).collect();
        every_ascii.push_str("é€𝄞 \u{2028}\u{fffd}");
        for text in [every_ascii.as_str(), "", "plain", "\"\\", "end\\"] {
            let mut written = String::new();
            write_json_string(&mut written, text);
            assert_eq!(written, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn the_word_test_finds_every_byte_that_needs_escaping_at_every_position() {
        for filler in [b'a', b' ', 0x80, 0xff, 0x21, 0x5d] {
            for byte in 0..=u8::MAX {
                for position in 0..8 {
                    let mut word = [filler; 8];
                    word[position] = byte;
                    let expected = byte < 0x20 || byte == b'"' || byte == b'\\';
                    assert_eq!(
                        word_needs_escape(u64::from_le_bytes(word)),
                        expected,
                        "byte {byte:#04x} at {position} among {filler:#04x}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_value_type_writes_the_map_forms_text() {
        let attributes = vec![
            kv("s", string("text with \"quotes\" and\nlines")),
            kv(
                "b",
                AnyValue {
                    value: Some(any_value::Value::BoolValue(false)),
                },
            ),
            kv("i", int(i64::MIN)),
            kv("i2", int(0)),
            kv("d", double(1.5)),
            kv("d2", double(1.0)),
            kv("d3", double(-0.0)),
            kv("d4", double(1e300)),
            kv("d5", double(0.1 + 0.2)),
            kv("nan", double(f64::NAN)),
            kv("inf", double(f64::INFINITY)),
            kv("ninf", double(f64::NEG_INFINITY)),
            kv("a", array(vec![int(1), string("two"), double(f64::NAN)])),
            kv("o", kvlist(vec![kv("k", int(3)), kv("k", int(4))])),
            kv("bytes", bytes(&[0xde, 0xad, 0x00])),
            KeyValue {
                key: "empty".into(),
                value: None,
                key_strindex: 0,
            },
            kv("", AnyValue { value: None }),
            kv("ключ \u{1}", string("значение")),
            kv(
                "strindex",
                AnyValue {
                    value: Some(any_value::Value::StringValueStrindex(3)),
                },
            ),
        ];
        assert_eq!(
            direct_text(&attributes, 16_384).unwrap(),
            map_text(&attributes, 16_384)
        );
    }

    #[test]
    fn capping_matches_the_map_form_at_every_cut() {
        let text = "aé€𝄞".repeat(40);
        let blob: Vec<u8> = (0..=255).collect();
        let list = array((0..50).map(int).collect());
        for max_bytes in 0..200 {
            let attributes = vec![
                kv("s", string(&text)),
                kv("b", bytes(&blob)),
                kv("a", list.clone()),
            ];
            let direct = direct_text(&attributes, max_bytes).unwrap();
            assert_eq!(direct, map_text(&attributes, max_bytes), "cap {max_bytes}");
            if max_bytes < 10 {
                assert!(direct.contains(TRUNCATION_MARKER));
            }
        }
    }

    #[test]
    fn extras_follow_the_attributes_in_order() {
        let resource: Value = serde_json::json!({"service.name": "svc", "n": 1});
        let resource_text = resource.to_string();
        let links = serde_json::json!([{"traceId": "ab", "spanId": "cd"}]);
        let text = attrs_object_text(
            &[kv("gen_ai.system", string("openai"))],
            &[
                ("resource", Extra::Text(&resource_text)),
                ("links", Extra::Value(&links)),
                ("otel.span_kind", Extra::Str("client")),
            ],
            &["resource", "links", "otel.span_kind"],
            16_384,
            0,
        )
        .unwrap();
        let mut expected = JsonObject::new();
        expected.insert("gen_ai.system".into(), Value::from("openai"));
        expected.insert("resource".into(), resource);
        expected.insert("links".into(), links);
        expected.insert("otel.span_kind".into(), Value::from("client"));
        assert_eq!(text, serde_json::to_string(&expected).unwrap());
    }

    /// Any attribute value: every scalar kind, and arrays and key-value lists nested a few
    /// levels (with repeated keys inside lists, which the map form resolves).
    fn any_value() -> impl Strategy<Value = AnyValue> {
        let text = proptest::collection::vec(
            prop_oneof![
                Just('a'),
                Just('"'),
                Just('\\'),
                Just('\u{1}'),
                Just('\u{1f}'),
                Just('\n'),
                Just('\u{7f}'),
                Just('é'),
                Just('€'),
                Just('𝄞'),
                Just(' '),
            ],
            0..12,
        )
        .prop_map(|chars| chars.into_iter().collect::<String>());
        let scalar = prop_oneof![
            text.prop_map(|text: String| string(&text)),
            any::<bool>().prop_map(|flag| AnyValue {
                value: Some(any_value::Value::BoolValue(flag)),
            }),
            any::<i64>().prop_map(int),
            any::<f64>().prop_map(double),
            proptest::collection::vec(any::<u8>(), 0..12).prop_map(|data| bytes(&data)),
            Just(AnyValue { value: None }),
        ];
        scalar.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(array),
                proptest::collection::vec(("[a-c]{1,2}", inner), 0..4).prop_map(|members| {
                    kvlist(
                        members
                            .into_iter()
                            .map(|(key, value): (String, AnyValue)| kv(&key, value))
                            .collect(),
                    )
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn generated_strings_escape_exactly_as_serde_json(
            pieces in proptest::collection::vec(
                prop_oneof![
                    Just("\"".to_string()),
                    Just("\\".to_string()),
                    (0u8..0x20).prop_map(|byte| char::from(byte).to_string()),
                    Just("é€𝄞\u{2028}".to_string()),
                    "[a-z ]{0,17}",
                ],
                0..24,
            ),
        ) {
            let text: String = pieces.concat();
            let mut written = String::from("prefix kept");
            write_json_string(&mut written, &text);
            prop_assert_eq!(written, format!("prefix kept{}", serde_json::to_string(&text).unwrap()));
        }

        #[test]
        fn generated_attributes_write_the_map_forms_text(
            values in proptest::collection::vec(any_value(), 0..6),
            max_bytes in prop_oneof![Just(16_384usize), 0usize..40],
        ) {
            let attributes: Vec<KeyValue> = values
                .into_iter()
                .enumerate()
                .map(|(at, value)| kv(&format!("key.{at}"), value))
                .collect();
            let direct = direct_text(&attributes, max_bytes);
            prop_assert_eq!(direct, Some(map_text(&attributes, max_bytes)));
        }
    }

    #[test]
    fn repeated_or_reserved_keys_are_declined() {
        assert_eq!(direct_text(&[kv("k", int(1)), kv("k", int(2))], 100), None);
        assert_eq!(direct_text(&[kv("resource", int(1))], 100), None);
        let many: Vec<KeyValue> = (0..40)
            .map(|n| kv(&format!("k{}", n % 39), int(n)))
            .collect();
        assert_eq!(direct_text(&many, 100), None);
        let distinct: Vec<KeyValue> = (0..40).map(|n| kv(&format!("k{n}"), int(n))).collect();
        assert_eq!(
            direct_text(&distinct, 100).unwrap(),
            map_text(&distinct, 100)
        );
    }
}
