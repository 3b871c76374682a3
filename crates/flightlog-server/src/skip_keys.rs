//! A JSON object read as a typed body while some of its members are skipped.
//!
//! A batch op is one object holding `op`, usually `spanId`, and the fields of its single
//! endpoint's body, whose type forbids unknown fields. Reading the op as a `serde_json` map,
//! removing `op` and `spanId` and deserializing the rest took a third of the batch endpoint's
//! request-thread time (every key and value allocated twice). [`SkipKeys`] instead lets the body
//! type read the op's text directly, hiding the named members from it.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::{BorrowedStrDeserializer, CowStrDeserializer};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::forward_to_deserialize_any;

/// `de` (which must hold a JSON object) without its members named in `skip`.
pub(crate) struct SkipKeys<D> {
    de: D,
    skip: &'static [&'static str],
}

impl<D> SkipKeys<D> {
    pub(crate) fn new(de: D, skip: &'static [&'static str]) -> Self {
        Self { de, skip }
    }
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for SkipKeys<D> {
    type Error = D::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        self.de.deserialize_map(SkipVisitor {
            inner: visitor,
            skip: self.skip,
        })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

struct SkipVisitor<V> {
    inner: V,
    skip: &'static [&'static str],
}

impl<'de, V: Visitor<'de>> Visitor<'de> for SkipVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.expecting(formatter)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.inner.visit_map(SkipMap {
            map,
            skip: self.skip,
        })
    }
}

struct SkipMap<A> {
    map: A,
    skip: &'static [&'static str],
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for SkipMap<A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        loop {
            let Some(key) = self.map.next_key_seed(KeyText)? else {
                return Ok(None);
            };
            if self.skip.contains(&key.as_ref()) {
                self.map.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key {
                Cow::Borrowed(text) => seed.deserialize(BorrowedStrDeserializer::new(text)),
                Cow::Owned(text) => seed.deserialize(CowStrDeserializer::new(Cow::Owned(text))),
            }
            .map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        self.map.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        None
    }
}

/// A member name, borrowed from the input when it holds no escapes.
struct KeyText;

impl<'de> DeserializeSeed<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyText {
    type Value = Cow<'de, str>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(text))
    }

    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(text.to_owned()))
    }

    fn visit_string<E>(self, text: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(text))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Body {
        event_type: String,
        payload: Option<serde_json::Value>,
    }

    fn read(text: &str, skip: &'static [&'static str]) -> Result<Body, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        let body = Body::deserialize(SkipKeys::new(&mut de, skip))?;
        de.end()?;
        Ok(body)
    }

    #[test]
    fn skipped_members_are_hidden_and_the_others_read() {
        let body = read(
            r#"{"op": "appendEvent", "spanId": "s\"1", "eventType": "tool\u0041",
                "payload": {"op": 1, "spanId": [2]}}"#,
            &["op", "spanId"],
        )
        .unwrap();
        assert_eq!(
            body,
            Body {
                event_type: "toolA".into(),
                payload: Some(serde_json::json!({"op": 1, "spanId": [2]})),
            }
        );
    }

    #[test]
    fn unknown_and_repeated_members_still_fail() {
        assert!(read(r#"{"op": "x", "eventType": "a", "other": 1}"#, &["op"]).is_err());
        assert!(read(r#"{"eventType": "a", "eventType": "b"}"#, &["op"]).is_err());
        assert!(read(r#"{"op": "x", "spanId": "s", "eventType": "a"}"#, &["op"]).is_err());
        assert!(read(r#"["op"]"#, &["op"]).is_err());
        // An escaped spelling of a skipped name is the same name.
        assert!(read(r#"{"\u006fp": "x", "eventType": "a"}"#, &["op"]).is_ok());
    }
}
