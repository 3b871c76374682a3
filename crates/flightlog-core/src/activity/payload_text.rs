//! Event payloads read from the request straight into the text that is stored.
//!
//! A payload is stored as the compact JSON text JavaScript's `JSON.stringify` writes for it
//! (see [`super::payload`]). The general way there reads the text into a `serde_json::Value`
//! (a map per object, hashed; a `String` per key and value) and then writes that tree out: for
//! the ~300-byte tool inputs and outputs agents send, ~12,000 instructions an event, a tenth of
//! a single-op request's share of the server's request threads (callgrind, single-op phase).
//!
//! [`PayloadSeed`] writes the stored text as serde_json reads the value, with the same writers
//! the general path uses (numbers, strings), so the same parse yields the same text without the
//! tree. It gives up (an error, upon which the caller reads the value the general way, with
//! every rule and message of that path) where the general path would reorder or drop members
//! (an object key that is an array index, which JavaScript moves first; a repeated key), past
//! [`MAX_JSON_DEPTH`], and when the text is over the cap (the general path truncates it). A
//! property test holds the two to the same stored text whenever this one gives a result.

use std::fmt;
use std::io::Write as _;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::payload::{array_index, write_string, CappedPayload, MAX_EVENT_PAYLOAD_BYTES};
use crate::json_as_written::OrNull;
use crate::json_depth::MAX_JSON_DEPTH;
use crate::json_number::write_js_double;

/// The most keys one object may have for this reader (it compares each key with the earlier
/// ones of its object); a larger object is read the general way.
const MAX_KEYS_PER_OBJECT: usize = 64;

/// Why the seed gave up: the caller reads the value the general way instead (the message is
/// never shown).
const GIVE_UP: &str = "read this payload the general way";

/// An event payload in its stored form: compact JSON as JavaScript writes it, within the cap
/// (so never truncated). Made only by [`PayloadSeed`] (and so [`PayloadText::from_json_text`],
/// [`PayloadText::optional`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadText(String);

impl PayloadText {
    /// `text` (one JSON value) in its stored form; `None` when the general path must read it
    /// (see the module's comment), including when it is not JSON.
    pub fn from_json_text(text: &str) -> Option<Self> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let payload = PayloadSeed.deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        Some(payload)
    }

    /// For a `#[serde(default, deserialize_with = "PayloadText::optional")]` field: `null` is
    /// `None`; a value this reader gives up on is an error (read the body the general way).
    pub fn optional<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<PayloadText>, D::Error> {
        OrNull(PayloadSeed).deserialize(deserializer)
    }

    /// The stored text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// As the cap's result (never truncated: the text is within the cap).
    pub fn into_capped(self) -> CappedPayload {
        CappedPayload {
            json: self.0,
            truncated: false,
        }
    }
}

/// Reads one JSON value into its stored form (see the module's comment).
#[derive(Debug, Clone, Copy, Default)]
pub struct PayloadSeed;

impl<'de> DeserializeSeed<'de> for PayloadSeed {
    type Value = PayloadText;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<PayloadText, D::Error> {
        let mut out = Vec::with_capacity(256);
        Writer {
            out: &mut out,
            depth: 0,
        }
        .deserialize(deserializer)?;
        if out.len() > MAX_EVENT_PAYLOAD_BYTES {
            return Err(de::Error::custom(GIVE_UP));
        }
        // Only ASCII punctuation and serde_json's own string output were written.
        String::from_utf8(out)
            .map(PayloadText)
            .map_err(|_| de::Error::custom(GIVE_UP))
    }
}

/// Writes the value it reads to `out`; `depth` is how many objects and arrays enclose it.
/// Each visit writes what the general path writes for the `Value` that
/// `json_as_written::AsWritten` builds from the same visit.
struct Writer<'o> {
    out: &'o mut Vec<u8>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Writer<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Writer<'_> {
    /// Entering an object or array: its level, or an error past the limit.
    fn enter<E: de::Error>(&self) -> Result<usize, E> {
        let level = self.depth + 1;
        if level > MAX_JSON_DEPTH {
            return Err(E::custom(GIVE_UP));
        }
        within_cap(self.out)?;
        Ok(level)
    }
}

/// Give up as soon as the text is over the cap (the general path truncates it): the text
/// written stays within the cap and one more member, however large the payload.
fn within_cap<E: de::Error>(out: &[u8]) -> Result<(), E> {
    if out.len() > MAX_EVENT_PAYLOAD_BYTES {
        return Err(E::custom(GIVE_UP));
    }
    Ok(())
}

impl<'de> Visitor<'de> for Writer<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<(), E> {
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E>(self, value: i64) -> Result<(), E> {
        // Writing to a `Vec` cannot fail.
        let _ = write!(self.out, "{value}");
        Ok(())
    }

    fn visit_u64<E>(self, value: u64) -> Result<(), E> {
        let _ = write!(self.out, "{value}");
        Ok(())
    }

    fn visit_f64<E>(self, value: f64) -> Result<(), E> {
        // As `Value::from(f64)`: a non-finite number (never parsed from JSON) is `null`.
        if value.is_finite() {
            write_js_double(self.out, value);
        } else {
            self.out.extend_from_slice(b"null");
        }
        Ok(())
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        within_cap(value.as_bytes())?;
        write_string(self.out, value);
        Ok(())
    }

    fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<(), E> {
        within_cap(value.as_bytes())?;
        write_unescaped(self.out, value);
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.enter()?;
        self.out.push(b'[');
        let mut first = true;
        loop {
            let comma_at = self.out.len();
            if !first {
                self.out.push(b',');
            }
            let item = Writer {
                out: &mut *self.out,
                depth,
            };
            if seq.next_element_seed(item)?.is_none() {
                self.out.truncate(comma_at);
                break;
            }
            within_cap(self.out)?;
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let depth = self.enter()?;
        self.out.push(b'{');
        // Each key's written text (as a range of `out`): the writing is one-to-one, so equal
        // texts are equal keys.
        let mut keys: Vec<(usize, usize)> = Vec::new();
        loop {
            let comma_at = self.out.len();
            if !keys.is_empty() {
                self.out.push(b',');
            }
            let key_at = self.out.len();
            let key = KeyWriter {
                out: &mut *self.out,
            };
            if map.next_key_seed(key)?.is_none() {
                self.out.truncate(comma_at);
                break;
            }
            let key_end = self.out.len();
            let written = &self.out[key_at..key_end];
            if keys.len() >= MAX_KEYS_PER_OBJECT
                || keys
                    .iter()
                    .any(|&(from, to)| &self.out[from..to] == written)
            {
                return Err(de::Error::custom(GIVE_UP));
            }
            keys.push((key_at, key_end));
            self.out.push(b':');
            map.next_value_seed(Writer {
                out: &mut *self.out,
                depth,
            })?;
            within_cap(self.out)?;
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// Writes an object's key; gives up on a key JavaScript would move first (an array index).
struct KeyWriter<'o> {
    out: &'o mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for KeyWriter<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyWriter<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<(), E> {
        within_cap(key.as_bytes())?;
        if array_index(key).is_some() {
            return Err(E::custom(GIVE_UP));
        }
        write_string(self.out, key);
        Ok(())
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<(), E> {
        within_cap(key.as_bytes())?;
        if array_index(key).is_some() {
            return Err(E::custom(GIVE_UP));
        }
        write_unescaped(self.out, key);
        Ok(())
    }
}

/// A string the deserializer lent from its input: as [`write_string`] writes it. From
/// serde_json's text readers such a string had no escape, so it holds nothing to escape (no `"`,
/// no `\\`, no control character, which JSON allows only escaped) and is copied whole; the
/// check (one pass without branches, which the compiler vectorizes) keeps it right for any other
/// deserializer (`serde_json::Value`'s lends strings that need escapes).
fn write_unescaped(out: &mut Vec<u8>, text: &str) {
    let needs_escapes = text.bytes().fold(false, |found, byte| {
        found | (byte == b'"') | (byte == b'\\') | (byte < 0x20)
    });
    if needs_escapes {
        write_string(out, text);
        return;
    }
    out.reserve(text.len() + 2);
    out.push(b'"');
    out.extend_from_slice(text.as_bytes());
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activity::cap_payload;
    use crate::json_as_written;
    use crate::json_depth;
    use proptest::prelude::*;

    /// What the general path stores for `text`: `None` when it refuses the text or truncates
    /// it.
    fn general(text: &str) -> Option<String> {
        let value = json_as_written::from_slice(text.as_bytes()).ok()?;
        json_depth::check_value("payload", Some(&value)).ok()?;
        let capped = cap_payload(Some(&value));
        (!capped.truncated).then_some(capped.json)
    }

    fn direct(text: &str) -> Option<String> {
        PayloadText::from_json_text(text).map(|payload| payload.as_str().to_owned())
    }

    #[test]
    fn payloads_as_agents_send_them_are_read_directly() {
        let texts = [
            r#"{"tool": "bash", "input": {"command": "cargo test -p agent-core", "cwd": "/home/agent/work", "timeoutMs": 120000, "env": {"RUST_BACKTRACE": "1"}}, "reason": "Run the tests again"}"#,
            "{\"ok\":true,\"exitCode\":0,\"output\":\"running 41 tests\\ntest a ... ok\\n\\ttab \\\"quoted\\\" back\\\\slash é€𝄞\",\"bytes\":1800}",
            r#"[1, -2, 0, 123456789012345678, "x", null, false, [], {}]"#,
            "  \"a plain string\"\n",
            "-7",
            "null",
        ];
        for text in texts {
            let read = direct(text);
            assert!(read.is_some(), "declined: {text}");
            assert_eq!(read, general(text), "{text}");
        }
    }

    #[test]
    fn numbers_and_escapes_are_written_as_the_general_path_writes_them() {
        let texts = [
            r#"{"a": 1.0, "b": 1e3, "c": 1E-7, "d": -0, "e": -0.0, "f": 0.1}"#,
            "[1234567890123456789, 18446744073709551615, -9223372036854775808, 1e400]",
            r#""slash \/ and \u0041 and \u001f and \u2028""#,
            r#"{"-1": 1, "1.5": 2, "01": 3, "4294967295": 4, "": 5}"#,
        ];
        for text in texts {
            assert_eq!(direct(text), general(text), "{text}");
        }
        assert!(direct(texts[0]).is_some());
    }

    #[test]
    fn what_the_general_path_reorders_or_refuses_is_left_to_it() {
        let texts = [
            r#"{"10": 1, "b": 2}"#,
            r#"{"0": 1}"#,
            r#"{"a": {"4294967294": 1}}"#,
            r#"{"a": 1, "a": 2}"#,
            r#"{"a": 1, "\u0061": 2}"#,
            "\"raw\ttab\"",
            "01",
            "[1,]",
            r#"{"a":1,}"#,
            "[1] [2]",
            "",
            "nul",
            r#"{"a" 1}"#,
        ];
        for text in texts {
            assert_eq!(direct(text), None, "{text}");
        }
    }

    /// `serde_json::Value` lends its strings, escapes needed or not.
    #[test]
    fn a_lent_string_that_needs_escapes_gets_them() {
        let value = serde_json::json!({"quote \"": "tab\t nul\u{0} back\\slash"});
        let read = PayloadText::optional(&value).ok().flatten();
        assert_eq!(
            read.map(|payload| payload.as_str().to_owned()),
            Some(value.to_string())
        );
    }

    #[test]
    fn past_the_cap_or_the_depth_limit_is_the_general_paths_to_say() {
        let long = format!("\"{}\"", "x".repeat(MAX_EVENT_PAYLOAD_BYTES));
        assert_eq!(direct(&long), None);
        // Given up on as soon as the text passes the cap, however the payload is made.
        let flat = format!("[{}]", vec!["1"; 100_000].join(","));
        let long_key = format!("{{\"{}\": 1}}", "k".repeat(MAX_EVENT_PAYLOAD_BYTES + 1));
        for text in [&flat, &long_key] {
            assert_eq!(direct(text), None);
            assert_eq!(general(text), None, "truncated");
        }
        let at_limit = format!(
            "{}{}",
            "[".repeat(MAX_JSON_DEPTH),
            "]".repeat(MAX_JSON_DEPTH)
        );
        assert_eq!(direct(&at_limit), general(&at_limit));
        assert!(direct(&at_limit).is_some());
        let past = format!("[{at_limit}]");
        assert_eq!(direct(&past), None);
        assert_eq!(general(&past), None);
        let many_keys = format!(
            "{{{}}}",
            (0..=MAX_KEYS_PER_OBJECT)
                .map(|k| format!("\"k{k}\":{k}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert_eq!(direct(&many_keys), None);
    }

    fn whitespace() -> impl Strategy<Value = String> {
        "[ \t\n\r]{0,2}"
    }

    fn scalar() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
            "-?0[0-9]{1,2}",
            string_text(),
        ]
    }

    fn string_text() -> impl Strategy<Value = String> {
        "\"([a-z0-9 /é€𝄞]|\\\\[\"\\\\/bfnrt]|\\\\u00[0-9a-f]{2}|\\\\u2028|\t){0,6}\""
    }

    fn key_text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"a\"".to_owned()),
            Just("\"b\"".to_owned()),
            "\"(0|[1-9][0-9]{0,10}|0[0-9]|-1|1\\.5)\"",
            string_text(),
        ]
    }

    fn json_text() -> impl Strategy<Value = String> {
        scalar().prop_recursive(5, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec((whitespace(), inner.clone(), whitespace()), 0..5).prop_map(
                    |items| {
                        let items: Vec<String> = items
                            .into_iter()
                            .map(|(before, item, after)| format!("{before}{item}{after}"))
                            .collect();
                        format!("[{}]", items.join(","))
                    }
                ),
                prop::collection::vec((key_text(), whitespace(), inner), 0..5).prop_map(
                    |members| {
                        let members: Vec<String> = members
                            .into_iter()
                            .map(|(key, gap, value)| format!("{key}{gap}:{gap}{value}"))
                            .collect();
                        format!("{{{}}}", members.join(","))
                    }
                ),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        /// Whenever the direct reader accepts a text, it stores what the general path stores.
        #[test]
        fn an_accepted_text_is_stored_as_the_general_path_stores_it(
            text in (whitespace(), json_text(), whitespace())
                .prop_map(|(before, text, after)| format!("{before}{text}{after}")),
            cut in 0usize..64,
        ) {
            if let Some(read) = direct(&text) {
                prop_assert_eq!(Some(read), general(&text), "{}", text);
            }
            // Cut short (mostly no longer JSON): accepted only when the general path agrees.
            let mut end = text.len().saturating_sub(cut);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let cut_text = &text[..end];
            if let Some(read) = direct(cut_text) {
                prop_assert_eq!(Some(read), general(cut_text), "{}", cut_text);
            }
        }
    }
}
