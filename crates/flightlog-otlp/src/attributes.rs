//! OTLP attribute values (`AnyValue`) as JSON, each value capped so one giant attribute (a whole
//! prompt, a base64 image) cannot blow up a span's stored attrs.
//!
//! Conversion: string → string, bool → bool, int → number (every i64 is exact in serde_json),
//! double → number (NaN and ±infinity, which JSON cannot hold, become the strings `"NaN"`,
//! `"Infinity"`, `"-Infinity"` as in OTLP/JSON), array → array, kvlist → object (a repeated key:
//! the last wins), bytes → lower-case hex string, empty value → `null`.
//!
//! Keys are capped the same way at [`MAX_ATTRIBUTE_KEY_BYTES`] (a 500 KB key was stored whole;
//! two keys that share their first bytes then share a key, the last one winning as for a
//! repeated key).
//!
//! The cap is per attribute value, counted in UTF-8 bytes: a longer string keeps its first
//! bytes, cut on a character boundary, plus the core's truncation marker; a longer array or
//! object (measured as its compact JSON text) becomes the first bytes of that text as a string,
//! plus the marker — the same rule the store applies to event payloads.
//!
//! Depth: an array or object nesting more than [`MAX_ATTRIBUTE_VALUE_DEPTH`] levels becomes its
//! compact JSON text as a string (capped the same way), so stored attrs never nest past the
//! limit every stored JSON value keeps (`flightlog_core::json_depth`): reads stay parseable.
//! Today's decoders already stop near 30 levels (prost decodes 100 message levels, three per
//! kvlist level; OTLP/JSON spends four of serde_json's 128 per level); this rule keeps the
//! bound whatever a decoder lets through.

use flightlog_core::activity::{JsonObject, TRUNCATION_MARKER};
use flightlog_core::json_depth::{nesting_depth, MAX_JSON_DEPTH};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use serde_json::{Number, Value};

use crate::ids::to_hex;

/// The default most UTF-8 bytes one attribute value keeps (see the module doc).
pub const MAX_ATTRIBUTE_VALUE_BYTES: usize = 16_384;

/// The most UTF-8 bytes one attribute key keeps (see the module doc): not the values' cap,
/// which a deployment may set far lower than any key worth its name.
pub const MAX_ATTRIBUTE_KEY_BYTES: usize = 16_384;

/// The most levels one attribute value keeps (see the module doc). The deepest place a value
/// sits in a span's stored attrs is level 5 (attrs, `otel.links`, a link, its `attributes`,
/// the value), so values of this depth keep the attrs within [`MAX_JSON_DEPTH`].
pub const MAX_ATTRIBUTE_VALUE_DEPTH: usize = MAX_JSON_DEPTH - 4;

/// `attributes` as one JSON object, keys as given, every value capped at `max_bytes`.
pub(crate) fn attributes_to_json(attributes: &[KeyValue], max_bytes: usize) -> JsonObject {
    attributes_into_json(attributes.to_vec(), max_bytes)
}

/// [`attributes_to_json`] consuming the decoded attributes: keys and string values are moved
/// into the JSON, not copied (a span's attributes are most of an OTLP request's allocations).
pub(crate) fn attributes_into_json(attributes: Vec<KeyValue>, max_bytes: usize) -> JsonObject {
    attributes_into_json_with_room(attributes, max_bytes, 0)
}

/// [`attributes_into_json`] with room for `spare` more keys.
pub(crate) fn attributes_into_json_with_room(
    attributes: Vec<KeyValue>,
    max_bytes: usize,
    spare: usize,
) -> JsonObject {
    let mut object = JsonObject::with_capacity(attributes.len() + spare);
    for attribute in attributes {
        object.insert(
            capped_owned(attribute.key, MAX_ATTRIBUTE_KEY_BYTES),
            any_value_into_json(attribute.value, max_bytes),
        );
    }
    object
}

/// One attribute value as JSON, capped at `max_bytes`.
pub(crate) fn any_value_to_json(value: Option<&AnyValue>, max_bytes: usize) -> Value {
    any_value_into_json(value.cloned(), max_bytes)
}

/// [`any_value_to_json`] consuming the value.
fn any_value_into_json(value: Option<AnyValue>, max_bytes: usize) -> Value {
    let converted = convert(value, max_bytes);
    match converted {
        Value::Array(_) | Value::Object(_) => {
            let text = converted.to_string();
            if text.len() <= max_bytes && nesting_depth(&converted) <= MAX_ATTRIBUTE_VALUE_DEPTH {
                converted
            } else {
                Value::String(capped_owned(text, max_bytes))
            }
        }
        other => other,
    }
}

fn convert(value: Option<AnyValue>, max_bytes: usize) -> Value {
    let Some(value) = value.and_then(|value| value.value) else {
        return Value::Null;
    };
    match value {
        any_value::Value::StringValue(text) => Value::String(capped_owned(text, max_bytes)),
        any_value::Value::BoolValue(flag) => Value::Bool(flag),
        any_value::Value::IntValue(number) => Value::Number(Number::from(number)),
        any_value::Value::DoubleValue(number) => double_to_json(number),
        any_value::Value::ArrayValue(array) => Value::Array(
            array
                .values
                .into_iter()
                .map(|item| convert(Some(item), max_bytes))
                .collect(),
        ),
        any_value::Value::KvlistValue(list) => {
            let mut object = JsonObject::with_capacity(list.values.len());
            for entry in list.values {
                object.insert(
                    capped_owned(entry.key, MAX_ATTRIBUTE_KEY_BYTES),
                    convert(entry.value, max_bytes),
                );
            }
            Value::Object(object)
        }
        any_value::Value::BytesValue(bytes) => Value::String(hex_capped(&bytes, max_bytes)),
        // A profiles-only string-table reference: meaningless in a trace (OTLP says to ignore it).
        any_value::Value::StringValueStrindex(_) => Value::Null,
    }
}

/// `text` itself when it fits in `max_bytes`, else its marked prefix.
pub(crate) fn capped_owned(text: String, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        text
    } else {
        marked_prefix(&text, max_bytes)
    }
}

fn double_to_json(number: f64) -> Value {
    match Number::from_f64(number) {
        Some(number) => Value::Number(number),
        None if number.is_nan() => Value::String("NaN".to_owned()),
        None if number > 0.0 => Value::String("Infinity".to_owned()),
        None => Value::String("-Infinity".to_owned()),
    }
}

/// `bytes` as lower-case hex, capped at `max_bytes`.
pub(crate) fn hex_capped(bytes: &[u8], max_bytes: usize) -> String {
    // Hex doubles the size: cut the bytes first so a huge blob is never fully encoded.
    let keep = bytes.len().min(max_bytes / 2 + 1);
    capped_owned(to_hex(&bytes[..keep]), max_bytes)
}

/// `text` itself (borrowed) when it fits in `max_bytes`, else its marked prefix.
pub(crate) fn capped_str(text: &str, max_bytes: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max_bytes {
        std::borrow::Cow::Borrowed(text)
    } else {
        std::borrow::Cow::Owned(marked_prefix(text, max_bytes))
    }
}

/// `text` itself when it fits in `max_bytes`, else its marked prefix.
pub(crate) fn capped_string(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        text.to_owned()
    } else {
        marked_prefix(text, max_bytes)
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes ending on a character boundary,
/// followed by the truncation marker.
fn marked_prefix(text: &str, max_bytes: usize) -> String {
    let mut end = max_bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut marked = String::with_capacity(end + TRUNCATION_MARKER.len());
    marked.push_str(&text[..end]);
    marked.push_str(TRUNCATION_MARKER);
    marked
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::{array, bytes, double, int, kv, kvlist, string};

    #[test]
    fn every_value_type_converts() {
        let attributes = vec![
            kv("s", string("text")),
            kv(
                "b",
                AnyValue {
                    value: Some(any_value::Value::BoolValue(true)),
                },
            ),
            kv("i", int(i64::MAX)),
            kv("d", double(1.5)),
            kv("nan", double(f64::NAN)),
            kv("inf", double(f64::NEG_INFINITY)),
            kv("a", array(vec![int(1), string("two")])),
            kv("o", kvlist(vec![kv("k", int(3)), kv("k", int(4))])),
            kv("bytes", bytes(&[0xde, 0xad])),
            KeyValue {
                key: "empty".into(),
                value: None,
                key_strindex: 0,
            },
        ];
        assert_eq!(
            Value::Object(attributes_to_json(&attributes, MAX_ATTRIBUTE_VALUE_BYTES)),
            json!({
                "s": "text",
                "b": true,
                "i": 9_223_372_036_854_775_807_i64,
                "d": 1.5,
                "nan": "NaN",
                "inf": "-Infinity",
                "a": [1, "two"],
                "o": {"k": 4},
                "bytes": "dead",
                "empty": null,
            })
        );
    }

    #[test]
    fn a_huge_string_is_cut_on_a_char_boundary_with_the_marker() {
        // 'é' is two bytes: a cut at an odd byte must step back to the boundary.
        let huge = "é".repeat(20_000);
        let capped = any_value_to_json(Some(&string(&huge)), 16_383);
        let Value::String(text) = capped else {
            panic!("not a string: {capped:?}");
        };
        assert!(text.ends_with(TRUNCATION_MARKER));
        let kept = text.trim_end_matches(TRUNCATION_MARKER);
        assert_eq!(kept.len(), 16_382);
        assert_eq!(kept, "é".repeat(8_191));
    }

    #[test]
    fn a_string_at_the_cap_is_kept_whole() {
        let exact = "x".repeat(MAX_ATTRIBUTE_VALUE_BYTES);
        assert_eq!(
            any_value_to_json(Some(&string(&exact)), MAX_ATTRIBUTE_VALUE_BYTES),
            Value::String(exact)
        );
    }

    #[test]
    fn a_value_nested_past_the_depth_limit_becomes_its_json_text() {
        fn nested(levels: usize) -> AnyValue {
            let mut value = string("leaf");
            for _ in 0..levels {
                value = array(vec![value]);
            }
            value
        }
        let kept = any_value_to_json(Some(&nested(MAX_ATTRIBUTE_VALUE_DEPTH)), 16_384);
        assert_eq!(nesting_depth(&kept), MAX_ATTRIBUTE_VALUE_DEPTH);
        let deep = nested(MAX_ATTRIBUTE_VALUE_DEPTH + 1);
        let text = any_value_to_json(Some(&deep), 16_384);
        let expected = format!(
            "{}\"leaf\"{}",
            "[".repeat(MAX_ATTRIBUTE_VALUE_DEPTH + 1),
            "]".repeat(MAX_ATTRIBUTE_VALUE_DEPTH + 1)
        );
        assert_eq!(text, Value::String(expected));
        // Deep and long: the marked prefix, as for any long value.
        let Value::String(cut) = any_value_to_json(Some(&nested(90)), 40) else {
            panic!("not a string");
        };
        assert!(cut.ends_with(TRUNCATION_MARKER), "{cut}");
    }

    #[test]
    fn a_huge_array_becomes_its_marked_json_prefix() {
        let items = (0..10_000).map(int).collect();
        let capped = any_value_to_json(Some(&array(items)), 100);
        let Value::String(text) = capped else {
            panic!("not a string: {capped:?}");
        };
        let full: Vec<String> = (0..10_000).map(|n| n.to_string()).collect();
        let full = format!("[{}]", full.join(","));
        assert_eq!(text, format!("{}{TRUNCATION_MARKER}", &full[..100]));
        assert!(text.starts_with("[0,1,2,3,"));
    }

    #[test]
    fn huge_bytes_are_capped_without_encoding_them_all() {
        let blob = vec![0xab; 1_000_000];
        let capped = any_value_to_json(Some(&bytes(&blob)), 10);
        assert_eq!(
            capped,
            Value::String(format!("ababababab{TRUNCATION_MARKER}"))
        );
    }
}
