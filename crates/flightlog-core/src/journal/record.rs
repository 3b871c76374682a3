//! A read-only view of "something shaped like a journal record", so the pure functions work on
//! stored events and on loose JSON alike without converting either.
//!
//! The reference's pure functions accept loose records `{at, type?, data?, event?}`: the type is
//! `record.type` when it is a non-empty string, else `record.event.type` when a string, else `""`;
//! the payload is `{...event, ...data}` where a non-object `event`/`data` counts as `{}`.
//! [`Payload`] answers lookups in that merged object without building it.

use serde_json::Value;

use super::types::{EngagementEvent, JsonObject, SAFE_INTEGER_LIMIT};

/// Anything the summary, board and compaction rules can read as a journal record.
pub trait JournalRecord {
    /// The record's `at` when it is an integer; `None` when absent or not an integer.
    fn record_at(&self) -> Option<i64>;
    /// The record's type by the reference's rule (`""` when it has none).
    fn record_type(&self) -> &str;
    /// The record's merged payload.
    fn payload(&self) -> Payload<'_>;
}

/// The merged payload `{...event, ...data}` of a record, looked up lazily: a key of `data` wins
/// over the same key of `event` (even when its value is `null`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Payload<'a> {
    data: Option<&'a JsonObject>,
    event: Option<&'a JsonObject>,
}

impl<'a> Payload<'a> {
    /// A payload merged from an `event` wrapper and `data` (either may be missing).
    pub fn new(data: Option<&'a JsonObject>, event: Option<&'a JsonObject>) -> Self {
        Self { data, event }
    }

    /// The merged payload's value for `key`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        if let Some(value) = self.data.and_then(|data| object_get(data, key)) {
            return Some(value);
        }
        self.event.and_then(|event| object_get(event, key))
    }

    /// The value for `key` when it is a string.
    pub fn str(&self, key: &str) -> Option<&'a str> {
        self.get(key).and_then(Value::as_str)
    }

    /// The value for `key` when it is a non-empty string.
    pub fn non_empty_str(&self, key: &str) -> Option<&'a str> {
        self.str(key).filter(|text| !text.is_empty())
    }

    /// The value for `key` when it is a JSON object (arrays are not).
    pub fn object(&self, key: &str) -> Option<&'a JsonObject> {
        self.get(key).and_then(Value::as_object)
    }

    /// The value for `key` when it is a number (every JSON number is finite).
    pub fn number(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(Value::as_f64)
    }
}

impl JournalRecord for Value {
    fn record_at(&self) -> Option<i64> {
        self.as_object()
            .and_then(|record| object_get(record, "at"))
            .and_then(json_integer)
    }

    fn record_type(&self) -> &str {
        let Some(record) = self.as_object() else {
            return "";
        };
        if let Some(kind) = object_get(record, "type").and_then(Value::as_str) {
            if !kind.is_empty() {
                return kind;
            }
        }
        object_get(record, "event")
            .and_then(Value::as_object)
            .and_then(|event| object_get(event, "type"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    fn payload(&self) -> Payload<'_> {
        let Some(record) = self.as_object() else {
            return Payload::default();
        };
        Payload::new(
            object_get(record, "data").and_then(Value::as_object),
            object_get(record, "event").and_then(Value::as_object),
        )
    }
}

impl JournalRecord for EngagementEvent {
    fn record_at(&self) -> Option<i64> {
        Some(self.at)
    }

    fn record_type(&self) -> &str {
        &self.event_type
    }

    fn payload(&self) -> Payload<'_> {
        Payload::new(Some(self.data.as_ref()), None)
    }
}

impl<T: JournalRecord + ?Sized> JournalRecord for &T {
    fn record_at(&self) -> Option<i64> {
        (**self).record_at()
    }

    fn record_type(&self) -> &str {
        (**self).record_type()
    }

    fn payload(&self) -> Payload<'_> {
        (**self).payload()
    }
}

/// `object.get(key)`, by a linear scan when the object is small: comparing a few short keys is
/// several times cheaper than hashing one, and journal payloads are mostly a handful of keys.
pub fn object_get<'a>(object: &'a JsonObject, key: &str) -> Option<&'a Value> {
    const LINEAR_SCAN_MAX: usize = 8;
    if object.len() <= LINEAR_SCAN_MAX {
        object
            .iter()
            .find_map(|(name, value)| (name == key).then_some(value))
    } else {
        object.get(key)
    }
}

/// A JSON number that is an integer of magnitude below 2^53 (`1000` or `1000.0`), else `None`.
pub fn json_integer(value: &Value) -> Option<i64> {
    let number = value.as_number()?;
    let integer = if let Some(integer) = number.as_i64() {
        integer
    } else {
        let float = number.as_f64()?;
        if float.fract() != 0.0 || float.abs() >= SAFE_INTEGER_LIMIT as f64 {
            return None;
        }
        // Exact: integral and below 2^53.
        float as i64
    };
    (integer.unsigned_abs() < SAFE_INTEGER_LIMIT.unsigned_abs()).then_some(integer)
}

/// `String.prototype.trim`: JavaScript's whitespace is Unicode White_Space without U+0085 (NEL)
/// plus U+FEFF (the byte-order mark).
pub fn js_trim(text: &str) -> &str {
    text.trim_matches(|c: char| (c.is_whitespace() && c != '\u{85}') || c == '\u{feff}')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn type_falls_back_to_the_event_wrapper_only_when_blank_or_not_a_string() {
        assert_eq!(
            json!({"type": "a", "event": {"type": "b"}}).record_type(),
            "a"
        );
        assert_eq!(
            json!({"type": "", "event": {"type": "b"}}).record_type(),
            "b"
        );
        assert_eq!(
            json!({"type": 9, "event": {"type": "b"}}).record_type(),
            "b"
        );
        assert_eq!(json!({"event": {"type": 3}}).record_type(), "");
        assert_eq!(json!({"event": "str"}).record_type(), "");
        assert_eq!(json!(null).record_type(), "");
    }

    #[test]
    fn data_wins_over_event_even_with_null() {
        let record = json!({"event": {"a": 1, "b": 2}, "data": {"b": null}});
        let payload = record.payload();
        assert_eq!(payload.get("a"), Some(&json!(1)));
        assert_eq!(payload.get("b"), Some(&Value::Null));
        let array_data = json!({"event": {"a": 1}, "data": [1]});
        assert_eq!(array_data.payload().get("a"), Some(&json!(1)));
    }

    #[test]
    fn integers_only_below_two_to_the_53() {
        assert_eq!(json_integer(&json!(5)), Some(5));
        assert_eq!(json_integer(&json!(-5.0)), Some(-5));
        assert_eq!(json_integer(&json!(5.5)), None);
        assert_eq!(
            json_integer(&json!(9_007_199_254_740_991_i64)),
            Some(9_007_199_254_740_991)
        );
        assert_eq!(json_integer(&json!(9_007_199_254_740_992_i64)), None);
        assert_eq!(json_integer(&json!(u64::MAX)), None);
        assert_eq!(json_integer(&json!("5")), None);
    }

    #[test]
    fn lookups_agree_on_small_and_large_objects() {
        let small = json!({"a": 1, "b": 2});
        let large: JsonObject = (0..20).map(|i| (format!("k{i}"), json!(i))).collect();
        let small = small.as_object().cloned().unwrap_or_default();
        assert_eq!(object_get(&small, "b"), Some(&json!(2)));
        assert_eq!(object_get(&small, "c"), None);
        assert_eq!(object_get(&large, "k17"), Some(&json!(17)));
        assert_eq!(object_get(&large, "k20"), None);
    }

    #[test]
    fn trim_follows_javascript_not_rust() {
        assert_eq!(js_trim("\u{feff} plan \n"), "plan");
        assert_eq!(js_trim("\u{85}plan"), "\u{85}plan");
        assert_eq!(js_trim("\u{a0}\u{2028}x\u{3000}"), "x");
    }
}
