//! Client JSON read into `serde_json::Value`s exactly as written.
//!
//! This program enables serde_json's `raw_value` feature (batch ops and stored payloads are kept
//! as their text), and with it serde_json's own `Value` reads an object whose first key is the
//! feature's private token, `$serde_json::private::RawValue`, as the JSON text held in that
//! key's string: a span's attrs `{"a": {"$serde_json::private::RawValue": "[1,2]"}}` were
//! stored as `{"a": [1, 2]}`, and an OTLP/JSON body could hide an export inside a string, out
//! of reach of the checks that read the text (8 MiB took 530 MB to decode). Every value a
//! client hands flightlog to keep (attrs, event payloads, journal data, OTLP/JSON bodies) is read
//! through [`AsWritten`] instead, where that key is a key like any other, stored as sent; and
//! stored attrs and journal data are read back so ([`object_from_str`]): an OTLP attribute map
//! holding that key made a span's whole attrs read back as `{}`.
//!
//! For a `#[serde(deserialize_with = …)]` field: [`optional_value`] and [`optional_object`] (with `#[serde(default)]`, as for any `Option` field read so).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Reads one JSON value as written (see the module's comment); the errors, messages included,
/// are serde_json's `Value`'s.
#[derive(Debug, Clone, Copy, Default)]
pub struct AsWritten;

impl<'de> DeserializeSeed<'de> for AsWritten {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AsWritten {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Value, E> {
        // (A parsed JSON number is finite; a non-finite one would become `null`, as in serde_json.)
        Ok(Value::from(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element_seed(AsWritten)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        read_object(map).map(Value::Object)
    }
}

/// An object's members as written; a repeated key keeps its first place and its last value,
/// as serde_json's `Value` keeps them.
fn read_object<'de, A: MapAccess<'de>>(mut map: A) -> Result<Map<String, Value>, A::Error> {
    let mut object = Map::new();
    while let Some(key) = map.next_key::<String>()? {
        let value = map.next_value_seed(AsWritten)?;
        object.insert(key, value);
    }
    Ok(object)
}

/// `text` parsed as written, the whole of it (trailing characters are an error, as in
/// `serde_json::from_slice`).
pub fn from_slice(text: &[u8]) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(text);
    let value = AsWritten.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// `text`, a JSON object, parsed as written: how stored attrs and journal data are read back
/// (an object stored with the raw-value key must read back as stored).
pub fn object_from_str(text: &str) -> Result<Map<String, Value>, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let object = ObjectOnly.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(object)
}

/// An optional field holding any JSON value, read as written; `null` is `None`, as for a plain
/// `Option<Value>` field.
pub fn optional_value<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Value>, D::Error> {
    OrNull(AsWritten).deserialize(deserializer)
}

/// An optional field holding a JSON object, read as written; `null` is `None`, anything but an
/// object is refused with serde_json's message (`invalid type: …, expected a map`).
pub fn optional_object<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Map<String, Value>>, D::Error> {
    OrNull(ObjectOnly).deserialize(deserializer)
}

/// Reads a JSON object as written.
struct ObjectOnly;

impl<'de> DeserializeSeed<'de> for ObjectOnly {
    type Value = Map<String, Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectOnly {
    type Value = Map<String, Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        read_object(map)
    }
}

/// A seed for an optional value: `null` as `None`, anything else through the seed `S`.
pub struct OrNull<S>(pub S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for OrNull<S> {
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for OrNull<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a value or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    const TOKEN_OBJECT: &str = r#"{"$serde_json::private::RawValue": "[1,2]"}"#;

    #[test]
    fn the_raw_value_token_is_a_key_like_any_other() {
        // What serde_json's own `Value` does with it, which this module exists to avoid.
        let theirs: Value = serde_json::from_str(TOKEN_OBJECT).expect("parses");
        assert_eq!(theirs, json!([1, 2]));
        let ours = from_slice(TOKEN_OBJECT.as_bytes()).expect("parses");
        assert_eq!(ours, json!({"$serde_json::private::RawValue": "[1,2]"}));
        // Spelt with an escape, nested, in an array.
        let text = r#"[{"a": {"\u0024serde_json::private::RawValue": "{}"}}]"#;
        assert_eq!(
            from_slice(text.as_bytes()).expect("parses"),
            json!([{"a": {"$serde_json::private::RawValue": "{}"}}])
        );
    }

    #[test]
    fn other_json_reads_as_serde_jsons_value_reads_it() {
        for text in [
            r#"{"a": [1, -2, 3.5, 1e300, 18446744073709551615, -9223372036854775808], "b": null}"#,
            r#"{"k": 1, "k": 2, "j": {"k": true}}"#,
            r#""\ud83d\ude00 \u00e9""#,
            "[]",
            "{}",
            "  7 ",
        ] {
            let theirs: Value = serde_json::from_str(text).expect("parses");
            assert_eq!(
                from_slice(text.as_bytes()).expect("parses"),
                theirs,
                "{text}"
            );
            let theirs = serde_json::to_string(&theirs).expect("writes");
            let ours = serde_json::to_string(&from_slice(text.as_bytes()).expect("parses"));
            assert_eq!(ours.expect("writes"), theirs, "key order of {text}");
        }
        for text in ["", "[1,", "{} x", r#""\ud83d""#, "[1,]"] {
            let theirs = serde_json::from_str::<Value>(text).expect_err("refused");
            let ours = from_slice(text.as_bytes()).expect_err("refused");
            assert_eq!(ours.to_string(), theirs.to_string(), "{text:?}");
        }
    }

    #[test]
    fn stored_objects_read_back_as_written() {
        let object = object_from_str(TOKEN_OBJECT).expect("an object");
        assert_eq!(
            Value::Object(object),
            json!({"$serde_json::private::RawValue": "[1,2]"})
        );
        let stored = r#"{"a": {"$serde_json::private::RawValue": "not JSON"}}"#;
        assert!(serde_json::from_str::<Map<String, Value>>(stored).is_err());
        assert!(object_from_str(stored).is_ok());
        for text in ["[]", "5", "{} x", ""] {
            let theirs = serde_json::from_str::<Map<String, Value>>(text).expect_err("refused");
            let ours = object_from_str(text).expect_err("refused");
            assert_eq!(ours.to_string(), theirs.to_string(), "{text:?}");
        }
    }

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(default, deserialize_with = "optional_object")]
        attrs: Option<Map<String, Value>>,
        #[serde(default, deserialize_with = "optional_value")]
        payload: Option<Value>,
    }

    #[test]
    fn fields_read_as_written_with_the_messages_of_plain_fields() {
        let text = format!(r#"{{"attrs": {TOKEN_OBJECT}, "payload": {TOKEN_OBJECT}}}"#);
        let body: Body = serde_json::from_str(&text).expect("parses");
        let written = json!({"$serde_json::private::RawValue": "[1,2]"});
        assert_eq!(body.attrs.map(Value::Object), Some(written.clone()));
        assert_eq!(body.payload, Some(written));

        let body: Body = serde_json::from_str(r#"{"attrs": null, "payload": null}"#).expect("ok");
        assert_eq!((body.attrs, body.payload), (None, None));
        let body: Body = serde_json::from_str("{}").expect("parses");
        assert_eq!((body.attrs, body.payload), (None, None));

        #[derive(Debug, Deserialize)]
        struct PlainBody {
            #[serde(default)]
            #[allow(dead_code)] // read for its errors only
            attrs: Option<Map<String, Value>>,
        }
        for attrs in ["5", r#""x""#, "[]", "true", "-1.5", "{", r#"{"a": }"#] {
            let text = format!(r#"{{"attrs": {attrs}}}"#);
            let ours = serde_json::from_str::<Body>(&text).expect_err("refused");
            let theirs = serde_json::from_str::<PlainBody>(&text).expect_err("refused");
            assert_eq!(ours.to_string(), theirs.to_string(), "{text}");
        }
    }
}
