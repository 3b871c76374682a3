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
    /// Whether the record has an `at` at all (JavaScript's `record.at !== undefined`), whatever
    /// its value: a loose record's `at` may be `null`, a string or a fraction.
    fn has_at(&self) -> bool;
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

    /// Every entry of `event`, then every entry of `data`: a key in both comes twice, and the
    /// later (`data`'s) is the merged payload's. Reading a record's fields in one pass over this
    /// touches each key once, where [`Payload::get`] scans the object again for every key.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'a String, &'a Value)> {
        let event = self.event.into_iter().flatten();
        event.chain(self.data.into_iter().flatten())
    }
}

/// The payload fields the pure rules read (the summary's and the board's), read in one pass.
/// Each is the merged payload's value for that key, of any JSON type.
#[derive(Default)]
pub(crate) struct Fields<'a> {
    pub actor: Option<&'a Value>,
    pub amount: Option<&'a Value>,
    pub author: Option<&'a Value>,
    pub budget: Option<&'a Value>,
    pub by: Option<&'a Value>,
    pub causation_id: Option<&'a Value>,
    pub code: Option<&'a Value>,
    pub consumed: Option<&'a Value>,
    pub content: Option<&'a Value>,
    pub entry: Option<&'a Value>,
    pub from: Option<&'a Value>,
    pub initiator: Option<&'a Value>,
    pub key: Option<&'a Value>,
    pub kind: Option<&'a Value>,
    pub mail_id: Option<&'a Value>,
    pub mails: Option<&'a Value>,
    pub mode: Option<&'a Value>,
    pub principal: Option<&'a Value>,
    pub reason: Option<&'a Value>,
    pub status: Option<&'a Value>,
    pub to: Option<&'a Value>,
    pub usage: Option<&'a Value>,
    pub venue: Option<&'a Value>,
    pub version: Option<&'a Value>,
    /// The flat budget amounts, in `BUDGET_KEYS` order.
    pub amounts: [Option<&'a Value>; 4],
}

impl<'a> Fields<'a> {
    /// The fields of `payload`, in one pass over its entries.
    pub(crate) fn read(payload: &Payload<'a>) -> Self {
        let mut fields = Self::default();
        for (key, value) in payload.entries() {
            let slot = match key.as_str() {
                "actor" => &mut fields.actor,
                "amount" => &mut fields.amount,
                "author" => &mut fields.author,
                "budget" => &mut fields.budget,
                "by" => &mut fields.by,
                "causationId" => &mut fields.causation_id,
                "code" => &mut fields.code,
                "consumed" => &mut fields.consumed,
                "content" => &mut fields.content,
                "entry" => &mut fields.entry,
                "from" => &mut fields.from,
                "initiator" => &mut fields.initiator,
                "key" => &mut fields.key,
                "kind" => &mut fields.kind,
                "mailId" => &mut fields.mail_id,
                "mails" => &mut fields.mails,
                "mode" => &mut fields.mode,
                "principal" => &mut fields.principal,
                "reason" => &mut fields.reason,
                "status" => &mut fields.status,
                "to" => &mut fields.to,
                "usage" => &mut fields.usage,
                "venue" => &mut fields.venue,
                "version" => &mut fields.version,
                "modelCalls" => &mut fields.amounts[0],
                "tokens" => &mut fields.amounts[1],
                "wallMs" => &mut fields.amounts[2],
                "sideEffects" => &mut fields.amounts[3],
                _ => continue,
            };
            *slot = Some(value);
        }
        fields
    }
}

/// A field's value when it is a string.
pub(crate) fn as_str(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str)
}

/// A field's value when it is a non-empty string.
pub(crate) fn as_non_empty_str(value: Option<&Value>) -> Option<&str> {
    as_str(value).filter(|text| !text.is_empty())
}

/// A field's value when it is a JSON object (arrays are not).
pub(crate) fn as_object(value: Option<&Value>) -> Option<&JsonObject> {
    value.and_then(Value::as_object)
}

/// An object's budget amounts (its values for `BUDGET_KEYS`, in that order), in one pass.
pub(crate) fn budget_amounts(object: &JsonObject) -> [Option<&Value>; 4] {
    let mut amounts = [None; 4];
    for (key, value) in object {
        let slot = match key.as_str() {
            "modelCalls" => 0,
            "tokens" => 1,
            "wallMs" => 2,
            "sideEffects" => 3,
            _ => continue,
        };
        amounts[slot] = Some(value);
    }
    amounts
}

impl JournalRecord for Value {
    fn record_at(&self) -> Option<i64> {
        self.as_object()
            .and_then(|record| object_get(record, "at"))
            .and_then(json_integer)
    }

    fn has_at(&self) -> bool {
        self.as_object()
            .is_some_and(|record| object_get(record, "at").is_some())
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

    fn has_at(&self) -> bool {
        true
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

    fn has_at(&self) -> bool {
        (**self).has_at()
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
    let integer = match number.as_i64() {
        Some(integer) => integer,
        None => crate::json_number::exact_integer(number.as_f64()?)?,
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
    use crate::journal::types::BUDGET_KEYS;
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
    fn fields_read_in_one_pass_agree_with_payload_get() {
        let record = json!({"event": {"type": "x", "actor": "agent:e", "mailId": "m", "to": "t"},
                            "data": {"actor": null, "from": "agent:d", "tokens": 4, "kind": 3}});
        let payload = record.payload();
        let fields = Fields::read(&payload);
        assert_eq!(fields.actor, Some(&Value::Null));
        for (key, field) in [
            ("actor", fields.actor),
            ("mailId", fields.mail_id),
            ("to", fields.to),
            ("from", fields.from),
            ("kind", fields.kind),
            ("status", fields.status),
            ("tokens", fields.amounts[1]),
        ] {
            assert_eq!(field, payload.get(key), "{key}");
        }
    }

    #[test]
    fn budget_amounts_follow_the_budget_keys() {
        let object: JsonObject = BUDGET_KEYS
            .iter()
            .enumerate()
            .rev()
            .map(|(index, key)| ((*key).to_owned(), json!(index)))
            .collect();
        let amounts = budget_amounts(&object);
        for (index, amount) in amounts.iter().enumerate() {
            assert_eq!(*amount, Some(&json!(index)));
        }
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
