//! OTLP/JSON read straight from the text into the protobuf types, for the bodies exporters send.
//!
//! The general decoder (`decode::decode_json_general`) parses a body into a `serde_json::Value`
//! tree, walks it to check and canonicalize it, and then deserializes the tree: about 20 µs of
//! CPU a span of the OpenTelemetry JavaScript SDK's JSON (an ordered map and its hashing per
//! object, every string copied twice), more than mapping and storing the span, and a tree of
//! about nine times the body's size in memory. This reader takes the form exporters write —
//! lowerCamelCase keys, hex ids, 64-bit integers as numbers or strings, enums as numbers or
//! value names, `null` for a field's default — straight from the text, and declines everything
//! else: a key it does not know (snake_case spellings included) or meets twice, a value in a
//! form the general decoder rewrites (`doubleValue` as a string, unpadded base64), an
//! `AnyValue` with two members. A declined body is read again by the general decoder, which
//! gives its own answer or error message, so what this reader accepts it must read exactly as
//! the general decoder does: the property test below holds the two to the same result.
//!
//! Nesting (`arrayValue` and `kvlistValue` inside each other) is bounded by serde_json's own
//! recursion limit of 128, as in the general decoder.

use std::fmt;
use std::marker::PhantomData;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use flightlog_core::json_as_written::OrNull;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::{Event, Link};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::decode::{is_hex, SPAN_KIND_NAMES, STATUS_CODE_NAMES};

/// The request in `body`, or `None` when this reader declines the body (the general decoder
/// then reads it).
pub(crate) fn read(body: &[u8]) -> Option<ExportTraceServiceRequest> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let request = Msg::<ExportTraceServiceRequest>::read(&mut deserializer).ok()?;
    deserializer.end().ok()?;
    Some(request)
}

/// The error that declines a body. Never shown: the general decoder reads the body again.
fn decline<E: de::Error>() -> E {
    E::custom("declined by the direct OTLP/JSON reader")
}

/// How one JSON value is read into `Out`.
trait Reader {
    type Out;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Self::Out, D::Error>;
}

/// A message's value of one field, `None` for `null` (the field keeps its default, as the
/// general decoder drops `null` members).
fn field<'de, R: Reader, A: MapAccess<'de>>(map: &mut A) -> Result<Option<R::Out>, A::Error> {
    map.next_value_seed(OrNull(Element::<R>(PhantomData)))
}

/// Sets `slot` to `value` when there is one.
fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

/// A JSON string.
struct Text;

impl Reader for Text {
    type Out = String;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
        serde::Deserialize::deserialize(deserializer)
    }
}

/// A JSON boolean.
struct Flag;

impl Reader for Flag {
    type Out = bool;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
        serde::Deserialize::deserialize(deserializer)
    }
}

/// A JSON number read as a double (an integer too, as serde reads one into `f64`). A string
/// (`"NaN"`, `"1.5"`) is declined: the general decoder rewrites it.
struct Double;

impl Reader for Double {
    type Out = f64;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        deserializer.deserialize_any(DoubleVisitor)
    }
}

struct DoubleVisitor;

impl Visitor<'_> for DoubleVisitor {
    type Value = f64;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a number")
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<f64, E> {
        Ok(value)
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<f64, E> {
        Ok(value as f64)
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<f64, E> {
        Ok(value as f64)
    }
}

/// Bytes written as a string, decoded by `C`: an id in hex, `bytesValue` in base64.
struct EncodedBytes<C>(PhantomData<C>);

/// How a string holds bytes; `None` declines the string.
trait BytesText {
    const WHAT: &'static str;
    fn decode(text: &str) -> Option<Vec<u8>>;
}

/// An id: hex of whole bytes, either case (`""` for none).
struct HexText;

impl BytesText for HexText {
    const WHAT: &'static str = "a hex string";

    fn decode(text: &str) -> Option<Vec<u8>> {
        if !is_hex(text) {
            return None;
        }
        let digit = |byte: u8| match byte {
            b'0'..=b'9' => byte - b'0',
            b'a'..=b'f' => byte - b'a' + 10,
            _ => byte - b'A' + 10,
        };
        Some(
            text.as_bytes()
                .chunks_exact(2)
                .map(|pair| (digit(pair[0]) << 4) | digit(pair[1]))
                .collect(),
        )
    }
}

/// `bytesValue`: standard padded base64 (other forms are declined: the general decoder
/// rewrites them).
struct Base64Text;

impl BytesText for Base64Text {
    const WHAT: &'static str = "base64";

    fn decode(text: &str) -> Option<Vec<u8>> {
        STANDARD.decode(text).ok()
    }
}

type Hex = EncodedBytes<HexText>;
type Base64 = EncodedBytes<Base64Text>;

impl<C: BytesText> Reader for EncodedBytes<C> {
    type Out = Vec<u8>;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_str(EncodedBytes::<C>(PhantomData))
    }
}

impl<C: BytesText> Visitor<'_> for EncodedBytes<C> {
    type Value = Vec<u8>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(C::WHAT)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Vec<u8>, E> {
        C::decode(text).ok_or_else(decline)
    }
}

/// An integer in an integer visitor's forms: a JSON number within the type's range, or a
/// string the type's `FromStr` reads (opentelemetry-proto's and the general decoder's rules).
macro_rules! integer_reader {
    ($reader:ident, $visitor:ident, $out:ty, $what:literal) => {
        struct $reader;

        impl Reader for $reader {
            type Out = $out;
            fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<$out, D::Error> {
                deserializer.deserialize_any($visitor)
            }
        }

        struct $visitor;

        impl Visitor<'_> for $visitor {
            type Value = $out;

            fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
                formatter.write_str($what)
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<$out, E> {
                <$out>::try_from(value).map_err(|_| decline())
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<$out, E> {
                <$out>::try_from(value).map_err(|_| decline())
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<$out, E> {
                text.parse::<$out>().map_err(|_| decline())
            }
        }
    };
}

// Times (`fixed64`), as opentelemetry-proto reads them.
integer_reader!(
    Unsigned64,
    Unsigned64Visitor,
    u64,
    "a 64-bit unsigned integer"
);
// `intValue`, as the general decoder checks it and opentelemetry-proto reads it.
integer_reader!(Signed64, Signed64Visitor, i64, "a 64-bit integer");
// `flags` and the dropped counts, which the general decoder also takes as strings.
integer_reader!(
    Unsigned32,
    Unsigned32Visitor,
    u32,
    "a 32-bit unsigned integer"
);

/// An enum: its number (within `i32`, as serde reads the field) or one of its value names.
struct Enum<N>(PhantomData<N>);

/// The value names of one enum.
trait EnumNames {
    const NAMES: &'static [(&'static str, i64)];
}

struct SpanKindNames;

impl EnumNames for SpanKindNames {
    const NAMES: &'static [(&'static str, i64)] = &SPAN_KIND_NAMES;
}

struct StatusCodeNames;

impl EnumNames for StatusCodeNames {
    const NAMES: &'static [(&'static str, i64)] = &STATUS_CODE_NAMES;
}

impl<N: EnumNames> Reader for Enum<N> {
    type Out = i32;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
        deserializer.deserialize_any(EnumVisitor::<N>(PhantomData))
    }
}

struct EnumVisitor<N>(PhantomData<N>);

impl<N: EnumNames> Visitor<'_> for EnumVisitor<N> {
    type Value = i32;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an enum's number or value name")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<i32, E> {
        i32::try_from(value).map_err(|_| decline())
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<i32, E> {
        i32::try_from(value).map_err(|_| decline())
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<i32, E> {
        N::NAMES
            .iter()
            .find(|(known, _)| *known == name)
            .and_then(|(_, number)| i32::try_from(*number).ok())
            .ok_or_else(decline)
    }
}

/// A JSON array of `R`s (an element `null` is declined, as no message is `null`).
struct List<R>(PhantomData<R>);

impl<R: Reader> Reader for List<R> {
    type Out = Vec<R::Out>;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<R::Out>, D::Error> {
        deserializer.deserialize_seq(ListVisitor::<R>(PhantomData))
    }
}

struct ListVisitor<R>(PhantomData<R>);

impl<'de, R: Reader> Visitor<'de> for ListVisitor<R> {
    type Value = Vec<R::Out>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<R::Out>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element_seed(Element::<R>(PhantomData))? {
            items.push(item);
        }
        Ok(items)
    }
}

struct Element<R>(PhantomData<R>);

impl<'de, R: Reader> DeserializeSeed<'de> for Element<R> {
    type Value = R::Out;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<R::Out, D::Error> {
        R::read(deserializer)
    }
}

/// An optional message given (`Some`).
struct Present<R>(PhantomData<R>);

impl<R: Reader> Reader for Present<R> {
    type Out = Option<R::Out>;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<R::Out>, D::Error> {
        R::read(deserializer).map(Some)
    }
}

/// `entityRefs` as exporters write it: empty. An entity reference is declined (the general
/// decoder reads it, with its own rules for its required fields).
struct NoEntityRefs;

impl Reader for NoEntityRefs {
    type Out = Vec<EntityRef>;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<EntityRef>, D::Error> {
        deserializer.deserialize_seq(NoEntityRefs)
    }
}

impl<'de> Visitor<'de> for NoEntityRefs {
    type Value = Vec<EntityRef>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an empty array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<EntityRef>, A::Error> {
        match seq.next_element::<de::IgnoredAny>()? {
            Some(_) => Err(decline()),
            None => Ok(Vec::new()),
        }
    }
}

/// A JSON object read into a protobuf message, field by field.
trait Message: Default {
    /// Reads the value of `key` into `self`; returns the field's bit (a key met twice is
    /// declined), or declines a key the message does not take.
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<u32, A::Error>;

    /// Whether the fields met (their bits) make a message the general decoder reads alike.
    fn complete(_seen: u32) -> bool {
        true
    }
}

struct Msg<M>(PhantomData<M>);

impl<M: Message> Reader for Msg<M> {
    type Out = M;
    fn read<'de, D: Deserializer<'de>>(deserializer: D) -> Result<M, D::Error> {
        deserializer.deserialize_map(MessageVisitor::<M>(PhantomData))
    }
}

struct MessageVisitor<M>(PhantomData<M>);

impl<'de, M: Message> Visitor<'de> for MessageVisitor<M> {
    type Value = M;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<M, A::Error> {
        let mut message = M::default();
        let mut seen = 0u32;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let bit = message.field(key.as_str(), &mut map)?;
            if seen & bit != 0 {
                return Err(decline());
            }
            seen |= bit;
        }
        if M::complete(seen) {
            Ok(message)
        } else {
            Err(decline())
        }
    }
}

/// An object's key, borrowed from the body when it has no escapes.
enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(key) => key,
            Key::Owned(key) => key,
        }
    }
}

struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Key<'de>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a key")
    }

    fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key::Borrowed(key))
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key::Owned(key.to_owned()))
    }
}

type Attributes = List<Msg<KeyValue>>;

/// A message's `Message` impl from its fields: each key, the bit that catches it given twice,
/// the field it sets and the [`Reader`] of its value. Any other key declines the body.
macro_rules! message {
    ($message:ty { $($bit:literal: $key:literal => $field:ident: $reader:ty,)+ }) => {
        impl Message for $message {
            fn field<'de, A: MapAccess<'de>>(
                &mut self,
                key: &str,
                map: &mut A,
            ) -> Result<u32, A::Error> {
                match key {
                    $($key => {
                        set(&mut self.$field, field::<$reader, A>(map)?);
                        Ok(1 << $bit)
                    })+
                    _ => Err(decline()),
                }
            }
        }
    };
}

message!(ExportTraceServiceRequest {
    0: "resourceSpans" => resource_spans: List<Msg<ResourceSpans>>,
});

message!(ResourceSpans {
    0: "resource" => resource: Present<Msg<Resource>>,
    1: "scopeSpans" => scope_spans: List<Msg<ScopeSpans>>,
    2: "schemaUrl" => schema_url: Text,
});

message!(Resource {
    0: "attributes" => attributes: Attributes,
    1: "droppedAttributesCount" => dropped_attributes_count: Unsigned32,
    2: "entityRefs" => entity_refs: NoEntityRefs,
});

message!(ScopeSpans {
    0: "scope" => scope: Present<Msg<InstrumentationScope>>,
    1: "spans" => spans: List<Msg<Span>>,
    2: "schemaUrl" => schema_url: Text,
});

message!(InstrumentationScope {
    0: "name" => name: Text,
    1: "version" => version: Text,
    2: "attributes" => attributes: Attributes,
    3: "droppedAttributesCount" => dropped_attributes_count: Unsigned32,
});

message!(Span {
    0: "traceId" => trace_id: Hex,
    1: "spanId" => span_id: Hex,
    2: "traceState" => trace_state: Text,
    3: "parentSpanId" => parent_span_id: Hex,
    4: "flags" => flags: Unsigned32,
    5: "name" => name: Text,
    6: "kind" => kind: Enum<SpanKindNames>,
    7: "startTimeUnixNano" => start_time_unix_nano: Unsigned64,
    8: "endTimeUnixNano" => end_time_unix_nano: Unsigned64,
    9: "attributes" => attributes: Attributes,
    10: "droppedAttributesCount" => dropped_attributes_count: Unsigned32,
    11: "events" => events: List<Msg<Event>>,
    12: "droppedEventsCount" => dropped_events_count: Unsigned32,
    13: "links" => links: List<Msg<Link>>,
    14: "droppedLinksCount" => dropped_links_count: Unsigned32,
    15: "status" => status: Present<Msg<Status>>,
});

message!(Event {
    0: "timeUnixNano" => time_unix_nano: Unsigned64,
    1: "name" => name: Text,
    2: "attributes" => attributes: Attributes,
    3: "droppedAttributesCount" => dropped_attributes_count: Unsigned32,
});

message!(Link {
    0: "traceId" => trace_id: Hex,
    1: "spanId" => span_id: Hex,
    2: "traceState" => trace_state: Text,
    3: "attributes" => attributes: Attributes,
    4: "droppedAttributesCount" => dropped_attributes_count: Unsigned32,
    5: "flags" => flags: Unsigned32,
});

message!(Status {
    0: "message" => message: Text,
    1: "code" => code: Enum<StatusCodeNames>,
});

impl Message for KeyValue {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<u32, A::Error> {
        match key {
            "key" => {
                // Required by opentelemetry-proto: a `null` one, which the general decoder
                // drops and then misses, is declined.
                self.key = field::<Text, A>(map)?.ok_or_else(decline)?;
                Ok(1)
            }
            "value" => {
                set(&mut self.value, field::<Present<Msg<AnyValue>>, A>(map)?);
                Ok(2)
            }
            _ => Err(decline()),
        }
    }

    /// opentelemetry-proto requires `key`.
    fn complete(seen: u32) -> bool {
        seen & 1 != 0
    }
}

impl Message for AnyValue {
    fn field<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<u32, A::Error> {
        use any_value::Value;
        let (bit, value) = match key {
            "stringValue" => (1, field::<Text, A>(map)?.map(Value::StringValue)),
            "boolValue" => (1 << 1, field::<Flag, A>(map)?.map(Value::BoolValue)),
            "intValue" => (1 << 2, field::<Signed64, A>(map)?.map(Value::IntValue)),
            "doubleValue" => (1 << 3, field::<Double, A>(map)?.map(Value::DoubleValue)),
            "arrayValue" => (
                1 << 4,
                field::<Msg<ArrayValue>, A>(map)?.map(Value::ArrayValue),
            ),
            "kvlistValue" => (
                1 << 5,
                field::<Msg<KeyValueList>, A>(map)?.map(Value::KvlistValue),
            ),
            "bytesValue" => (1 << 6, field::<Base64, A>(map)?.map(Value::BytesValue)),
            _ => return Err(decline()),
        };
        match value {
            // A second member: the general decoder refuses the value, naming both.
            Some(_) if self.value.is_some() => Err(decline()),
            Some(value) => {
                self.value = Some(value);
                Ok(bit)
            }
            // `null`: not a member given (the general decoder drops it).
            None => Ok(bit),
        }
    }
}

message!(ArrayValue {
    0: "values" => values: List<Msg<AnyValue>>,
});

message!(KeyValueList {
    0: "values" => values: Attributes,
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_json_general;
    use crate::test_support::{array, bytes, double, int, kv, kvlist, request, span, string};
    use opentelemetry_proto::tonic::trace::v1::span::Event;
    use proptest::prelude::*;

    /// `text` read directly, checked against the general decoder (which must read it alike).
    fn direct(text: &str) -> Option<ExportTraceServiceRequest> {
        let read = read(text.as_bytes())?;
        match decode_json_general(text.as_bytes()) {
            Ok(general) => assert_eq!(read, general, "{text}"),
            Err(error) => panic!("read directly, refused the general way ({error}): {text}"),
        }
        Some(read)
    }

    /// An export with every kind of value, in the form opentelemetry-proto's serde writes it
    /// (hex ids, 64-bit integers as strings, enums as numbers, base64 bytes).
    fn every_kind_of_value() -> ExportTraceServiceRequest {
        let mut root = span(
            1,
            None,
            "invoke_agent coder",
            vec![
                kv("gen_ai.operation.name", string("invoke_agent")),
                kv("gen_ai.usage.input_tokens", int(-9_007_199_254_740_993)),
                kv("ratio", double(0.25)),
                kv("whole", double(3.0)),
                kv("blob", bytes(&[0, 1, 2, 250, 255])),
                kv(
                    "flag",
                    AnyValue {
                        value: Some(any_value::Value::BoolValue(true)),
                    },
                ),
                kv("empty", AnyValue { value: None }),
                kv("list", array(vec![string("a"), int(1), array(vec![])])),
                kv(
                    "map",
                    kvlist(vec![kv("inner", kvlist(vec![kv("x", int(2))]))]),
                ),
            ],
        );
        root.flags = 257;
        root.kind = 2;
        root.trace_state = "vendor=1".into();
        root.dropped_attributes_count = 3;
        root.dropped_events_count = 4;
        root.dropped_links_count = 5;
        root.status = Some(Status {
            message: "boom".into(),
            code: 2,
        });
        root.events = vec![Event {
            time_unix_nano: u64::MAX,
            name: "gen_ai.choice".into(),
            attributes: vec![kv("index", int(0))],
            dropped_attributes_count: 1,
        }];
        root.links = vec![Link {
            trace_id: vec![7; 16],
            span_id: vec![8; 8],
            trace_state: "a=b".into(),
            attributes: vec![kv("link.kind", string("follows"))],
            dropped_attributes_count: 2,
            flags: 1,
        }];
        let child = span(2, Some(1), "chat \"quoted\" \u{e9}\u{1F600}", vec![]);
        let mut export = request(vec![root, child]);
        export.resource_spans[0].schema_url = "https://opentelemetry.io/schemas/1.26.0".into();
        export.resource_spans[0].scope_spans[0].schema_url = "s".into();
        export
    }

    #[test]
    fn the_form_opentelemetry_proto_writes_is_read_directly() {
        let original = every_kind_of_value();
        let text = serde_json::to_string(&original).expect("serializes");
        assert_eq!(direct(&text), Some(original));
    }

    #[test]
    fn a_real_javascript_sdk_export_is_read_directly() {
        // The body @opentelemetry/exporter-trace-otlp-http 0.212.0 sent for
        // tests/otlp-clients/js/send_trace.mjs (captured from the wire).
        let text = include_str!("../testdata/javascript-sdk-export.json");
        let read = direct(text).expect("read directly");
        let spans = &read.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 5);
        assert!(spans
            .iter()
            .all(|span| span.flags == 257 && span.trace_id.len() == 16));
    }

    #[test]
    fn the_javascript_sdks_form_is_read_directly() {
        // As @opentelemetry/otlp-transformer's JSON serializer writes a span: times as decimal
        // strings, ints as numbers, empty lists and zero counts written out, no parent for a
        // root (here an empty one for the first), `\/` and `\u` escapes in strings.
        let text = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"coder"}},{"key":"telemetry.sdk.language","value":{"stringValue":"nodejs"}}],"droppedAttributesCount":0},"scopeSpans":[{"scope":{"name":"ai","version":"4.3.1"},"spans":[{"traceId":"5b8efff798038103d269b633813fc60c","spanId":"eee19b7ec3c1b174","parentSpanId":"","name":"ai.generateText","kind":1,"startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000","attributes":[{"key":"gen_ai.usage.input_tokens","value":{"intValue":12}},{"key":"ai.prompt","value":{"stringValue":"a\/b \u00e9 \ud83d\ude00"}},{"key":"ai.settings.temperature","value":{"doubleValue":0.7}}],"droppedAttributesCount":0,"events":[{"attributes":[],"name":"exception","timeUnixNano":"1544712660500000000","droppedAttributesCount":0}],"droppedEventsCount":0,"status":{"code":2,"message":"rate limited"},"links":[],"droppedLinksCount":0,"flags":1}]}]}]}"#;
        let read = direct(text).expect("read directly");
        let span = &read.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(span.status.as_ref().map(|status| status.code), Some(2));
        assert_eq!(
            span.attributes[1]
                .value
                .as_ref()
                .and_then(|v| v.value.clone()),
            Some(any_value::Value::StringValue("a/b \u{e9} \u{1F600}".into()))
        );
        // The forms the mapping allows besides: numbers for 64-bit integers, enum value names,
        // upper-case hex, `null` for a default.
        let text = r#"{"resourceSpans":[{"resource":null,"scopeSpans":[{"spans":[{"traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"EEE19B7EC3C1B174","kind":"SPAN_KIND_CLIENT","startTimeUnixNano":1544712660000000000,"endTimeUnixNano":null,"attributes":[{"key":"n","value":{"intValue":"-7","stringValue":null}},{"key":"v","value":null}],"status":{"code":"STATUS_CODE_OK"}}]}]}]}"#;
        let read = direct(text).expect("read directly");
        let span = &read.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.kind, 3);
        assert_eq!(span.end_time_unix_nano, 0);
        assert_eq!(span.attributes[1].value, None);
        let text = r#"{"resourceSpans":[{"resource":{"entityRefs":[]},"scopeSpans":[{"spans":[{"flags":"257","droppedEventsCount":"2"}]}]}]}"#;
        let read = direct(text).expect("read directly");
        let span = &read.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!((span.flags, span.dropped_events_count), (257, 2));
        assert_eq!(direct("{}"), Some(ExportTraceServiceRequest::default()));
        assert_eq!(
            direct(r#"{"resourceSpans":[]}"#),
            Some(ExportTraceServiceRequest::default())
        );
    }

    #[test]
    fn forms_the_general_decoder_rewrites_or_refuses_are_declined() {
        let declined = [
            // spellings and shapes the general decoder rewrites
            r#"{"resource_spans":[]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"trace_id":"01"}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"d","value":{"doubleValue":"NaN"}}]}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"b","value":{"bytesValue":"AAE"}}]}]}]}]}"#,
            r#"{"resourceSpans":[{"resource":{"entityRefs":[{"schemaUrl":"s","type":"t","idKeys":[],"descriptionKeys":[]}]}}]}"#,
            // what it refuses, with its own message
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"a","name":"b"}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"k","value":{"stringValue":"a","intValue":1}}]}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":null,"value":{"intValue":1}}]}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"value":{"intValue":1}}]}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"attributes":[{"key":"k","value":{"intValue":1.5}}]}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"0x0102"}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"spanId":"abc"}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[{"kind":"SPAN_KIND_BOGUS"}]}]}]}"#,
            r#"{"resourceSpans":[{"scopeSpans":[{"spans":[null]}]}]}"#,
            r#"{"resourceLogs":[]}"#,
            r#"[]"#,
            r#"{"resourceSpans":[]} trailing"#,
            r#"{"resourceSpans":[]"#,
        ];
        for text in declined {
            assert_eq!(read(text.as_bytes()), None, "{text}");
        }
    }

    #[test]
    fn nesting_is_read_up_to_serde_jsons_limit_on_a_small_stack() {
        let nested = |depth: usize| {
            let mut value = r#"{"stringValue":"leaf"}"#.to_owned();
            for _ in 0..depth {
                value = format!(r#"{{"arrayValue":{{"values":[{value}]}}}}"#);
            }
            format!(
                r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"attributes":[{{"key":"k","value":{value}}}]}}]}}]}}]}}"#
            )
        };
        // Run where a runtime worker would: tokio's default thread stack is 2 MiB.
        std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || {
                // Three JSON levels a step (the value, `arrayValue`, `values`).
                assert!(direct(&nested(38)).is_some());
                assert_eq!(read(nested(45).as_bytes()), None, "past serde_json's limit");
                assert!(decode_json_general(nested(45).as_bytes()).is_err());
            })
            .expect("spawns")
            .join()
            .expect("no overflow");
    }

    /// A JSON value written out as given: keys may repeat, numbers are their text.
    #[derive(Debug, Clone)]
    enum Json {
        Null,
        Bool(bool),
        Number(String),
        Text(String),
        Array(Vec<Json>),
        Object(Vec<(String, Json)>),
    }

    impl Json {
        fn write(&self, out: &mut String) {
            match self {
                Json::Null => out.push_str("null"),
                Json::Bool(value) => out.push_str(if *value { "true" } else { "false" }),
                Json::Number(text) => out.push_str(text),
                Json::Text(text) => out.push_str(&serde_json::to_string(text).expect("string")),
                Json::Array(items) => {
                    out.push('[');
                    for (index, item) in items.iter().enumerate() {
                        if index > 0 {
                            out.push(',');
                        }
                        item.write(out);
                    }
                    out.push(']');
                }
                Json::Object(members) => {
                    out.push('{');
                    for (index, (key, value)) in members.iter().enumerate() {
                        if index > 0 {
                            out.push(',');
                        }
                        out.push_str(&serde_json::to_string(key).expect("key"));
                        out.push(':');
                        value.write(out);
                    }
                    out.push('}');
                }
            }
        }
    }

    fn number(text: &str) -> Json {
        Json::Number(text.to_owned())
    }

    fn text(text: &str) -> Json {
        Json::Text(text.to_owned())
    }

    /// Members from `fields`, each present or not, then one of: none changed, a member repeated,
    /// an unknown member, a key in snake_case, a value `null`.
    fn object(fields: Vec<(&'static str, BoxedStrategy<Json>)>) -> BoxedStrategy<Json> {
        let members: Vec<BoxedStrategy<Option<(String, Json)>>> = fields
            .into_iter()
            .map(|(key, values)| {
                proptest::option::weighted(0.75, values.prop_map(move |v| (key.to_owned(), v)))
                    .boxed()
            })
            .collect();
        (members, 0..64u8, any::<prop::sample::Index>())
            .prop_map(|(members, change, index)| {
                let mut members: Vec<(String, Json)> = members.into_iter().flatten().collect();
                if !members.is_empty() {
                    let at = index.index(members.len());
                    match change {
                        0 => members.push(members[at].clone()),
                        1 => members[at].0 = snake_case(&members[at].0),
                        2 => members[at].1 = Json::Null,
                        3 => members.rotate_left(at),
                        _ => {}
                    }
                }
                if change == 4 {
                    members.push(("unknownField".to_owned(), number("1")));
                }
                Json::Object(members)
            })
            .boxed()
    }

    fn snake_case(camel: &str) -> String {
        let mut snake = String::new();
        for character in camel.chars() {
            if character.is_ascii_uppercase() {
                snake.push('_');
                snake.push(character.to_ascii_lowercase());
            } else {
                snake.push(character);
            }
        }
        snake
    }

    fn id() -> BoxedStrategy<Json> {
        prop_oneof![
            16 => prop::collection::vec(any::<u8>(), 8..=16)
                .prop_map(|bytes| Json::Text(bytes.iter().map(|b| format!("{b:02x}")).collect())),
            1 => prop::collection::vec(any::<u8>(), 8)
                .prop_map(|bytes| Json::Text(bytes.iter().map(|b| format!("{b:02X}")).collect())),
            1 => prop_oneof![Just(text("")), Just(text("abc")), Just(text("0x0102")),
                Just(text("zz")), Just(number("5")), Just(Json::Null)],
        ]
        .boxed()
    }

    fn unsigned64() -> BoxedStrategy<Json> {
        prop_oneof![
            8 => any::<u64>().prop_map(|n| number(&n.to_string())),
            8 => any::<u64>().prop_map(|n| text(&n.to_string())),
            1 => prop_oneof![Just(text("+5")), Just(number("-1")), Just(number("1.5")),
                Just(text("abc")), Just(number("1e3")), Just(text(" 5")), Just(Json::Null)],
        ]
        .boxed()
    }

    fn unsigned32() -> BoxedStrategy<Json> {
        prop_oneof![
            16 => (0u32..1000).prop_map(|n| number(&n.to_string())),
            2 => (0u32..1000).prop_map(|n| text(&n.to_string())),
            1 => prop_oneof![Just(number("4294967296")), Just(text("7")), Just(text("-1")),
                Just(number("-3")), Just(number("2.0")), Just(Json::Bool(true))],
        ]
        .boxed()
    }

    fn enumeration(names: &'static [(&'static str, i64)]) -> BoxedStrategy<Json> {
        prop_oneof![
            10 => (0i64..7).prop_map(|n| number(&n.to_string())),
            4 => prop::sample::select(names).prop_map(|(name, _)| text(name)),
            1 => prop_oneof![Just(number("-1")), Just(number("3000000000")),
                Just(text("BOGUS")), Just(number("1.0")), Just(Json::Null)],
        ]
        .boxed()
    }

    fn any_value() -> BoxedStrategy<Json> {
        let members: Vec<(&'static str, BoxedStrategy<Json>)> = vec![
            (
                "stringValue",
                "[a-z\u{e9}\"\\\\]{0,6}".prop_map(Json::Text).boxed(),
            ),
            ("boolValue", any::<bool>().prop_map(Json::Bool).boxed()),
            (
                "intValue",
                prop_oneof![
                    8 => any::<i64>().prop_map(|n| number(&n.to_string())),
                    8 => any::<i64>().prop_map(|n| text(&n.to_string())),
                    1 => prop_oneof![
                        Just(number("9223372036854775808")),
                        Just(number("1.0")),
                        Just(text("x")),
                        Just(Json::Bool(false)),
                    ],
                ]
                .boxed(),
            ),
            (
                "doubleValue",
                prop_oneof![
                    8 => any::<f64>()
                        .prop_filter("finite", |n| n.is_finite())
                        .prop_map(|n| number(&n.to_string())),
                    4 => prop_oneof![Just(number("3")), Just(number("-2e10"))],
                    1 => prop_oneof![Just(text("NaN")), Just(text("1.5"))],
                ]
                .boxed(),
            ),
            (
                "bytesValue",
                prop_oneof![
                    8 => prop::collection::vec(any::<u8>(), 0..6)
                        .prop_map(|data| Json::Text(STANDARD.encode(data))),
                    1 => prop_oneof![Just(text("AAE")), Just(text("-_8")), Just(text("!!"))],
                ]
                .boxed(),
            ),
        ];
        // Mostly one member (or none: an empty value), sometimes all of them at once.
        let single: Vec<_> = members
            .iter()
            .map(|(key, values)| (1, object(vec![(*key, values.clone())])))
            .collect();
        let leaf = prop_oneof![
            12 => proptest::strategy::Union::new_weighted(single),
            1 => object(members),
        ];
        leaf.prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                object(vec![(
                    "arrayValue",
                    object(vec![(
                        "values",
                        prop::collection::vec(inner.clone(), 0..3)
                            .prop_map(Json::Array)
                            .boxed()
                    )])
                )]),
                object(vec![(
                    "kvlistValue",
                    object(vec![(
                        "values",
                        prop::collection::vec(key_value(inner), 0..3)
                            .prop_map(Json::Array)
                            .boxed()
                    )])
                )]),
            ]
        })
        .boxed()
    }

    /// An attribute: its key always there (unless changed as [`object`] changes members).
    fn key_value(value: BoxedStrategy<Json>) -> BoxedStrategy<Json> {
        let key = "[a-z.]{1,8}".prop_map(Json::Text).boxed();
        prop_oneof![
            12 => (key.clone(), value.clone()).prop_map(|(key, value)| {
                Json::Object(vec![("key".to_owned(), key), ("value".to_owned(), value)])
            }),
            1 => object(vec![("key", key), ("value", value)]),
        ]
        .boxed()
    }

    fn attributes() -> BoxedStrategy<Json> {
        prop::collection::vec(key_value(any_value()), 0..3)
            .prop_map(Json::Array)
            .boxed()
    }

    fn export() -> BoxedStrategy<Json> {
        let status = object(vec![
            ("message", "[a-z ]{0,6}".prop_map(Json::Text).boxed()),
            ("code", enumeration(&STATUS_CODE_NAMES)),
        ]);
        let event = object(vec![
            ("timeUnixNano", unsigned64()),
            ("name", "[a-z.]{0,6}".prop_map(Json::Text).boxed()),
            ("attributes", attributes()),
            ("droppedAttributesCount", unsigned32()),
        ]);
        let link = object(vec![
            ("traceId", id()),
            ("spanId", id()),
            ("traceState", Just(text("a=b")).boxed()),
            ("attributes", attributes()),
            ("droppedAttributesCount", unsigned32()),
            ("flags", unsigned32()),
        ]);
        let span = object(vec![
            ("traceId", id()),
            ("spanId", id()),
            ("traceState", Just(text("k=v")).boxed()),
            ("parentSpanId", id()),
            ("flags", unsigned32()),
            ("name", "[a-z_ ]{0,8}".prop_map(Json::Text).boxed()),
            ("kind", enumeration(&SPAN_KIND_NAMES)),
            ("startTimeUnixNano", unsigned64()),
            ("endTimeUnixNano", unsigned64()),
            ("attributes", attributes()),
            ("droppedAttributesCount", unsigned32()),
            (
                "events",
                prop::collection::vec(event, 0..2)
                    .prop_map(Json::Array)
                    .boxed(),
            ),
            ("droppedEventsCount", unsigned32()),
            (
                "links",
                prop::collection::vec(link, 0..2)
                    .prop_map(Json::Array)
                    .boxed(),
            ),
            ("droppedLinksCount", unsigned32()),
            ("status", status),
        ]);
        let scope = object(vec![
            ("name", "[a-z]{0,4}".prop_map(Json::Text).boxed()),
            ("version", Just(text("1.0")).boxed()),
            ("attributes", attributes()),
            ("droppedAttributesCount", unsigned32()),
        ]);
        let scope_spans = object(vec![
            ("scope", scope),
            (
                "spans",
                prop::collection::vec(span, 1..4)
                    .prop_map(Json::Array)
                    .boxed(),
            ),
            ("schemaUrl", Just(text("https://s")).boxed()),
        ]);
        let resource = object(vec![
            ("attributes", attributes()),
            ("droppedAttributesCount", unsigned32()),
        ]);
        let resource_spans = object(vec![
            ("resource", resource),
            (
                "scopeSpans",
                prop::collection::vec(scope_spans, 1..3)
                    .prop_map(Json::Array)
                    .boxed(),
            ),
            ("schemaUrl", Just(text("")).boxed()),
        ]);
        object(vec![(
            "resourceSpans",
            prop::collection::vec(resource_spans, 1..3)
                .prop_map(Json::Array)
                .boxed(),
        )])
    }

    fn written(json: &Json) -> String {
        let mut out = String::new();
        json.write(&mut out);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the direct reader accepts, the general decoder reads alike.
        #[test]
        fn what_is_read_directly_is_read_alike_the_general_way(json in export()) {
            direct(&written(&json));
        }
    }

    /// The property above is not vacuous: the generated exports are often in the direct form,
    /// and often not.
    #[test]
    fn the_generated_exports_are_both_read_and_declined() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = export();
        let (mut accepted, mut declined, mut with_spans) = (0, 0, 0);
        for _ in 0..1000 {
            let json = strategy.new_tree(&mut runner).expect("a value").current();
            match direct(&written(&json)) {
                Some(request) => {
                    accepted += 1;
                    if request
                        .resource_spans
                        .iter()
                        .flat_map(|r| &r.scope_spans)
                        .any(|s| !s.spans.is_empty())
                    {
                        with_spans += 1;
                    }
                }
                None => declined += 1,
            }
        }
        assert!(
            accepted >= 100,
            "{accepted} read directly, {declined} declined"
        );
        assert!(
            declined >= 100,
            "{accepted} read directly, {declined} declined"
        );
        assert!(
            with_spans >= 30,
            "{with_spans} of {accepted} read directly hold spans"
        );
    }
}
