//! Builders for OTLP messages in tests, so each test states only what it is about.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

pub(crate) fn string(text: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(text.to_owned())),
    }
}

pub(crate) fn int(number: i64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::IntValue(number)),
    }
}

pub(crate) fn double(number: f64) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::DoubleValue(number)),
    }
}

pub(crate) fn bytes(data: &[u8]) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::BytesValue(data.to_vec())),
    }
}

pub(crate) fn array(values: Vec<AnyValue>) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::ArrayValue(ArrayValue { values })),
    }
}

pub(crate) fn kvlist(values: Vec<KeyValue>) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::KvlistValue(KeyValueList { values })),
    }
}

pub(crate) fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(value),
        key_strindex: 0,
    }
}

/// The trace id `0x01 × 16`, as bytes; its hex is `TRACE_HEX`.
pub(crate) const TRACE: [u8; 16] = [1; 16];
pub(crate) const TRACE_HEX: &str = "01010101010101010101010101010101";

/// A span id whose every byte is `byte`.
pub(crate) fn sid(byte: u8) -> Vec<u8> {
    vec![byte; 8]
}

/// The hex of [`sid`]`(byte)`.
pub(crate) fn sid_hex(byte: u8) -> String {
    format!("{byte:02x}").repeat(8)
}

/// An ended span of trace [`TRACE`]: started at 1,000 ms, ended at 2,500 ms.
pub(crate) fn span(id: u8, parent: Option<u8>, name: &str, attributes: Vec<KeyValue>) -> Span {
    Span {
        trace_id: TRACE.to_vec(),
        span_id: sid(id),
        parent_span_id: parent.map(sid).unwrap_or_default(),
        name: name.to_owned(),
        start_time_unix_nano: 1_000_000_000,
        end_time_unix_nano: 2_500_000_000,
        attributes,
        ..Span::default()
    }
}

/// One resource (`service.name = svc`) with one scope (`agent-lib 1.2`) holding `spans`.
pub(crate) fn request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", string("svc"))],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "agent-lib".into(),
                    version: "1.2".into(),
                    ..InstrumentationScope::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}
