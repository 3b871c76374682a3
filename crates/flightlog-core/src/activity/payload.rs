//! The event payload cap: no single event may approach a stream frame's size.
//!
//! The reference measures the payload's compact JSON text; over the cap a string payload keeps
//! its first bytes, any other payload becomes the first bytes of its JSON text as a string, and
//! both get the truncation marker and `truncated: true`. The reference counts UTF-16 units; we
//! count UTF-8 bytes (identical for ASCII) and always cut on a character boundary, so a stored
//! payload is never invalid UTF-8.
//!
//! The text measured and stored is the one JavaScript's `JSON.stringify` writes for the value a
//! JavaScript server's `JSON.parse` would have built (see `compact_json`): numbers in
//! JavaScript's form and keys in a JavaScript object's order, so the cap cuts where the
//! reference cuts and a truncated payload keeps the reference's text. (A differential test
//! against the reference found `[1.0, …]` from a Python client truncated here and kept there.)

use serde::Serialize;
use serde_json::{Map, Number, Value};

/// The most bytes of compact JSON an event payload may have before it is truncated.
pub const MAX_EVENT_PAYLOAD_BYTES: usize = 16_384;

/// Appended to a truncated payload.
pub const TRUNCATION_MARKER: &str = "…[truncated]";

/// A payload ready to store: its JSON text and whether it was cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CappedPayload {
    /// Compact JSON text of the value to store.
    pub json: String,
    /// True when the original exceeded the cap and was replaced by a marked prefix.
    pub truncated: bool,
}

/// Apply the cap to `payload` (`None` stores `null`).
pub fn cap_payload(payload: Option<&Value>) -> CappedPayload {
    let value = payload.unwrap_or(&Value::Null);
    let json = compact_json(value);
    if json.len() <= MAX_EVENT_PAYLOAD_BYTES {
        return CappedPayload {
            json,
            truncated: false,
        };
    }
    let kept = match value {
        Value::String(text) => prefix_on_char_boundary(text, MAX_EVENT_PAYLOAD_BYTES),
        _ => prefix_on_char_boundary(&json, MAX_EVENT_PAYLOAD_BYTES),
    };
    let mut marked = String::with_capacity(kept.len() + TRUNCATION_MARKER.len());
    marked.push_str(kept);
    marked.push_str(TRUNCATION_MARKER);
    CappedPayload {
        json: compact_json(&Value::String(marked)),
        truncated: true,
    }
}

/// `value`'s compact JSON text as JavaScript's `JSON.stringify` writes it:
/// - a number written with a fraction or an exponent (a double) in JavaScript's shortest form
///   (`1.0` → `1`, `1e-6` → `0.000001`, `-0` → `0`, `1e21` → `1e+21`; see [`crate::json_number::write_js_double`]);
///   integers keep every digit, also past 2^53 (a documented difference: JavaScript rounds);
/// - object keys that are array indexes (`"0"` to `"4294967294"`, no leading zero) first, in
///   ascending order, then the others in the order given, as a JavaScript object orders them;
/// - strings escaped as serde_json (and JavaScript) escape them.
///
/// Written straight into a byte buffer (the `Display` path cost 14,000 instructions per
/// ~300-byte payload against 8,000 this way, callgrind, batch endpoint).
fn compact_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_js_json(&mut out, value);
    // Only ASCII punctuation and valid UTF-8 strings were written.
    String::from_utf8(out).unwrap_or_else(|_| value.to_string())
}

fn write_js_json(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_js_number(out, number),
        Value::String(text) => write_string(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (at, item) in items.iter().enumerate() {
                if at > 0 {
                    out.push(b',');
                }
                write_js_json(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_js_object(out, map),
    }
}

pub(super) fn write_string(out: &mut Vec<u8>, text: &str) {
    // serde_json's escaping is JSON.stringify's: `"`, `\`, and control characters.
    let mut serializer = serde_json::Serializer::new(&mut *out);
    if text.serialize(&mut serializer).is_err() {
        out.extend_from_slice(b"\"\"");
    }
}

fn write_js_object(out: &mut Vec<u8>, map: &Map<String, Value>) {
    out.push(b'{');
    let mut first = true;
    let mut entry = |out: &mut Vec<u8>, key: &str, value: &Value| {
        if !first {
            out.push(b',');
        }
        first = false;
        write_string(out, key);
        out.push(b':');
        write_js_json(out, value);
    };
    if map.keys().any(|key| array_index(key).is_some()) {
        let mut indexes: Vec<(u32, &str, &Value)> = map
            .iter()
            .filter_map(|(key, value)| Some((array_index(key)?, key.as_str(), value)))
            .collect();
        indexes.sort_unstable_by_key(|(index, _, _)| *index);
        for (_, key, value) in indexes {
            entry(out, key, value);
        }
        for (key, value) in map.iter().filter(|(key, _)| array_index(key).is_none()) {
            entry(out, key, value);
        }
    } else {
        for (key, value) in map {
            entry(out, key, value);
        }
    }
    out.push(b'}');
}

/// The array index a JavaScript object key names: the canonical decimal text of an integer
/// from 0 to 2^32 − 2 (such keys come first in a JavaScript object, in numeric order).
pub(super) fn array_index(key: &str) -> Option<u32> {
    let bytes = key.as_bytes();
    let canonical = !bytes.is_empty()
        && bytes.len() <= 10
        && bytes.iter().all(u8::is_ascii_digit)
        && (bytes[0] != b'0' || bytes.len() == 1);
    if !canonical {
        return None;
    }
    key.parse::<u32>().ok().filter(|index| *index < u32::MAX)
}

fn write_js_number(out: &mut Vec<u8>, number: &Number) {
    if let Some(integer) = number.as_i64() {
        out.extend_from_slice(integer.to_string().as_bytes());
    } else if let Some(integer) = number.as_u64() {
        out.extend_from_slice(integer.to_string().as_bytes());
    } else {
        crate::json_number::write_js_double(out, number.as_f64().unwrap_or(0.0));
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a character boundary.
fn prefix_on_char_boundary(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn compact_json_is_the_display_text_without_doubles_or_index_keys() {
        let values = [
            json!(null),
            json!({"b": 1, "a": [true, "x", -7, 18446744073709551615u64, -9223372036854775808i64]}),
            json!({"text": "tab\t quote\" backslash\\ nul\u{0} é€𝄞 \u{2028}"}),
            json!([[], {}, [{"deep": {"er": [1, 2, {"est": null}]}}]]),
            json!("a plain string"),
            json!({"01": 1, "-1": 2, "1.5": 3, "4294967295": 4, "": 5}),
        ];
        for value in values {
            assert_eq!(compact_json(&value), value.to_string(), "{value:?}");
        }
    }

    /// Each JSON number text, parsed by serde_json, against what `JSON.stringify(JSON.parse(
    /// text))` printed in node 20 (integers past 2^53 excepted: they keep their digits here).
    #[test]
    fn doubles_are_written_as_javascript_writes_them() {
        let cases = [
            ("1.0", "1"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("1.5e-7", "1.5e-7"),
            ("123456789012345680000", "123456789012345680000"),
            ("1e21", "1e+21"),
            ("1.2345e21", "1.2345e+21"),
            ("0.1", "0.1"),
            ("1e300", "1e+300"),
            ("-1e-300", "-1e-300"),
            ("5e-324", "5e-324"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("123.456", "123.456"),
            ("0.00001234", "0.00001234"),
            ("-0.0000001", "-1e-7"),
            ("1e20", "100000000000000000000"),
            ("1e16", "10000000000000000"),
            ("255.0", "255"),
            ("4.35", "4.35"),
            ("2.5e-6", "0.0000025"),
            ("-5.0e-1", "-0.5"),
            ("100", "100"),
        ];
        for (text, javascript) in cases {
            let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            assert_eq!(compact_json(&value), javascript, "{text}");
        }
    }

    /// `JSON.stringify(JSON.parse(...))` of this object in node 20.
    #[test]
    fn array_index_keys_come_first_in_numeric_order() {
        let value: Value = serde_json::from_str(
            r#"{"b":1,"10":2,"2":3,"a":4,"01":5,"4294967294":6,"4294967295":7,"-1":8,"1.5":9}"#,
        )
        .unwrap_or(Value::Null);
        assert_eq!(
            compact_json(&value),
            r#"{"2":3,"10":2,"4294967294":6,"b":1,"a":4,"01":5,"4294967295":7,"-1":8,"1.5":9}"#
        );
        // Nested objects too, and inside arrays.
        let nested = json!({"x": [{"z": 1, "0": 2}]});
        assert_eq!(compact_json(&nested), r#"{"x":[{"0":2,"z":1}]}"#);
    }

    /// Regression (found by a differential test against the reference): 4,096 `1.0`s (a Python
    /// client's `json.dumps`) are 8,193 bytes as JavaScript writes them, under the cap.
    #[test]
    fn the_cap_measures_the_javascript_text() {
        let text = format!("[{}]", vec!["1.0"; 4096].join(","));
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let capped = cap_payload(Some(&value));
        assert!(!capped.truncated);
        assert_eq!(capped.json.len(), 8_193);
    }

    #[test]
    fn small_payload_is_kept_verbatim() {
        let capped = cap_payload(Some(&json!({"b": 1, "a": [true, "x"]})));
        assert_eq!(capped.json, r#"{"b":1,"a":[true,"x"]}"#);
        assert!(!capped.truncated);
        assert_eq!(cap_payload(None).json, "null");
    }

    #[test]
    fn string_whose_json_exceeds_the_cap_gets_the_marker_even_when_nothing_is_cut() {
        // 16,383 characters plus two quotes is over the cap although the string itself fits.
        let text = "q".repeat(MAX_EVENT_PAYLOAD_BYTES - 1);
        let capped = cap_payload(Some(&Value::String(text.clone())));
        assert!(capped.truncated);
        assert_eq!(
            capped.json,
            json!(format!("{text}{TRUNCATION_MARKER}")).to_string()
        );
    }

    #[test]
    fn object_over_the_cap_becomes_a_marked_prefix_of_its_json() {
        let payload = json!({"data": "b".repeat(MAX_EVENT_PAYLOAD_BYTES)});
        let capped = cap_payload(Some(&payload));
        assert!(capped.truncated);
        let stored: Value = serde_json::from_str(&capped.json).unwrap_or(Value::Null);
        let text = stored.as_str().unwrap_or_default();
        assert!(text.starts_with("{\"data\":\"bbb"));
        assert_eq!(
            text.len(),
            MAX_EVENT_PAYLOAD_BYTES + TRUNCATION_MARKER.len()
        );
    }

    #[test]
    fn cut_never_splits_a_multibyte_character() {
        // 'é' is two bytes; an odd cap position would land inside one.
        let text = format!("a{}", "é".repeat(MAX_EVENT_PAYLOAD_BYTES));
        let capped = cap_payload(Some(&Value::String(text)));
        let stored: Value = serde_json::from_str(&capped.json).unwrap_or(Value::Null);
        let kept = stored
            .as_str()
            .and_then(|s| s.strip_suffix(TRUNCATION_MARKER))
            .unwrap_or_default();
        assert!(kept.len() <= MAX_EVENT_PAYLOAD_BYTES);
        assert_eq!(kept.len(), MAX_EVENT_PAYLOAD_BYTES - 1);
    }
}
