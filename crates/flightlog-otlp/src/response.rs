//! What an exporter is answered: an `ExportTraceServiceResponse` (with `partialSuccess` when
//! spans were rejected) or, for a refused request, a `google.rpc.Status`, each in the request's
//! encoding as OTLP/HTTP requires.
//!
//! The OTLP spec leaves `partialSuccess` unset on full success, and sets `rejectedSpans` and an
//! `errorMessage` a person can act on when some spans were refused. The message names the first
//! rejected spans and why, and is kept short (an exporter logs it, possibly on every retry).

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use prost::Message;
use serde_json::{json, Value};

use crate::decode::OtlpEncoding;
use crate::mapping::RejectedSpan;

/// Rejected spans named individually in `errorMessage`; the rest are counted.
const LISTED_REJECTIONS: usize = 10;
/// The longest `errorMessage`, in bytes.
const MAX_ERROR_MESSAGE_BYTES: usize = 2_048;

/// The gRPC status codes an OTLP error response uses (`google.rpc.Code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum GrpcCode {
    /// 3: the request is malformed; retrying it cannot help.
    InvalidArgument = 3,
    /// 7: the caller's credentials do not allow the call.
    PermissionDenied = 7,
    /// 8: the request is too large.
    ResourceExhausted = 8,
    /// 13: the server failed.
    Internal = 13,
    /// 14: the server is overloaded or shutting down; retry later.
    Unavailable = 14,
    /// 16: no valid credentials.
    Unauthenticated = 16,
}

/// The response to an export whose spans in `rejected` were refused (none: full success).
pub fn export_response(rejected: &[RejectedSpan]) -> ExportTraceServiceResponse {
    if rejected.is_empty() {
        return ExportTraceServiceResponse {
            partial_success: None,
        };
    }
    ExportTraceServiceResponse {
        partial_success: Some(ExportTracePartialSuccess {
            rejected_spans: i64::try_from(rejected.len()).unwrap_or(i64::MAX),
            error_message: rejection_message(rejected),
        }),
    }
}

/// The longest one listed span's part of the message, in bytes: a few long reasons cannot
/// crowd out the count of the spans not listed.
const MAX_LISTED_ENTRY_BYTES: usize = 400;
/// Room kept at the end of the message for `; and N more`.
const MORE_SUFFIX_BYTES: usize = 32;

/// The `errorMessage` of an export whose spans in `rejected` were refused: the count, the
/// first [`LISTED_REJECTIONS`] spans and why (each cut to [`MAX_LISTED_ENTRY_BYTES`]; fewer
/// when the message would pass [`MAX_ERROR_MESSAGE_BYTES`]), and how many more there are. (The
/// whole message used to be cut at the cap, which cut off the count of those not listed: an
/// audit's finding.)
fn rejection_message(rejected: &[RejectedSpan]) -> String {
    let mut message = format!(
        "rejected {} span{}: ",
        rejected.len(),
        if rejected.len() == 1 { "" } else { "s" }
    );
    let mut listed = 0;
    for span in rejected.iter().take(LISTED_REJECTIONS) {
        let mut entry = match (&span.span_id, span.index) {
            (Some(id), _) => format!("span {id}"),
            (None, Some(index)) => format!("span #{index} (no id)"),
            (None, None) => "a span".to_owned(),
        };
        entry.push_str(": ");
        entry.push_str(&span.reason);
        cut_with_ellipsis(&mut entry, MAX_LISTED_ENTRY_BYTES);
        let separator = if listed > 0 { "; " } else { "" };
        let room_left = MAX_ERROR_MESSAGE_BYTES.saturating_sub(MORE_SUFFIX_BYTES);
        if listed > 0 && message.len() + separator.len() + entry.len() > room_left {
            break;
        }
        message.push_str(separator);
        message.push_str(&entry);
        listed += 1;
    }
    if rejected.len() > listed {
        message.push_str(&format!("; and {} more", rejected.len() - listed));
    }
    cut_with_ellipsis(&mut message, MAX_ERROR_MESSAGE_BYTES);
    message
}

/// Cut `text` to at most `most` bytes on a character boundary, ending it with `…` when cut.
fn cut_with_ellipsis(text: &mut String, most: usize) {
    if text.len() <= most {
        return;
    }
    let mut end = most.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

/// The body of `response` in `encoding`, with its `Content-Type`. The JSON form is OTLP/JSON
/// (`{}` on full success; `rejectedSpans` as a number, which every protobuf-JSON reader
/// accepts).
pub fn encode_response(
    response: &ExportTraceServiceResponse,
    encoding: OtlpEncoding,
) -> (&'static str, Vec<u8>) {
    let body = match encoding {
        OtlpEncoding::Protobuf => response.encode_to_vec(),
        OtlpEncoding::Json => {
            let value = match &response.partial_success {
                None => json!({}),
                Some(partial) => json!({
                    "partialSuccess": {
                        "rejectedSpans": partial.rejected_spans,
                        "errorMessage": partial.error_message,
                    }
                }),
            };
            value.to_string().into_bytes()
        }
    };
    (encoding.content_type(), body)
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error response (`details` is never sent).
#[derive(Clone, PartialEq, Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// The body of an error response (`google.rpc.Status { code, message }`) in `encoding`, with
/// its `Content-Type`.
pub fn encode_status(
    code: GrpcCode,
    message: &str,
    encoding: OtlpEncoding,
) -> (&'static str, Vec<u8>) {
    let body = match encoding {
        OtlpEncoding::Protobuf => RpcStatus {
            code: code as i32,
            message: message.to_owned(),
        }
        .encode_to_vec(),
        OtlpEncoding::Json => {
            let value: Value = json!({"code": code as i32, "message": message});
            value.to_string().into_bytes()
        }
    };
    (encoding.content_type(), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(count: usize) -> Vec<RejectedSpan> {
        (0..count)
            .map(|index| RejectedSpan {
                index: Some(index),
                span_id: Some(format!("{index:016x}")),
                reason: "trace id is all zero".into(),
            })
            .collect()
    }

    #[test]
    fn full_success_leaves_partial_success_unset() {
        let response = export_response(&[]);
        assert_eq!(response.partial_success, None);
        assert_eq!(
            encode_response(&response, OtlpEncoding::Json),
            ("application/json", b"{}".to_vec())
        );
        assert_eq!(
            encode_response(&response, OtlpEncoding::Protobuf),
            ("application/x-protobuf", Vec::new())
        );
    }

    #[test]
    fn rejected_spans_are_counted_and_named() {
        let mut spans = rejected(2);
        spans.push(RejectedSpan {
            index: Some(7),
            span_id: None,
            reason: "span id must be 8 bytes, got 0".into(),
        });
        let response = export_response(&spans);
        assert_eq!(
            response.partial_success,
            Some(ExportTracePartialSuccess {
                rejected_spans: 3,
                error_message: "rejected 3 spans: span 0000000000000000: trace id is all zero; \
                                span 0000000000000001: trace id is all zero; span #7 (no id): \
                                span id must be 8 bytes, got 0"
                    .into(),
            })
        );
        let (content_type, body) = encode_response(&response, OtlpEncoding::Json);
        assert_eq!(content_type, "application/json");
        let value: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["partialSuccess"]["rejectedSpans"], json!(3));
        assert_eq!(
            value["partialSuccess"]["errorMessage"],
            json!(response.partial_success.as_ref().unwrap().error_message)
        );
        let (content_type, body) = encode_response(&response, OtlpEncoding::Protobuf);
        assert_eq!(content_type, "application/x-protobuf");
        assert_eq!(
            ExportTraceServiceResponse::decode(body.as_slice()).unwrap(),
            response
        );
    }

    #[test]
    fn a_long_list_is_cut_to_ten_and_counted() {
        let response = export_response(&rejected(25));
        let partial = response.partial_success.unwrap();
        assert_eq!(partial.rejected_spans, 25);
        assert!(partial
            .error_message
            .starts_with("rejected 25 spans: span 0000000000000000:"));
        assert!(
            partial.error_message.ends_with("; and 15 more"),
            "{}",
            partial.error_message
        );
        assert_eq!(
            partial
                .error_message
                .matches("trace id is all zero")
                .count(),
            10
        );
    }

    /// The `errorMessage` for `spans`, checked to be within its cap.
    fn capped_message(spans: &[RejectedSpan]) -> String {
        let message = export_response(spans)
            .partial_success
            .expect("spans were rejected")
            .error_message;
        assert!(
            message.len() <= MAX_ERROR_MESSAGE_BYTES,
            "{}",
            message.len()
        );
        message
    }

    #[test]
    fn a_huge_message_is_truncated() {
        let spans = vec![RejectedSpan {
            index: Some(0),
            span_id: None,
            reason: "é".repeat(5_000),
        }];
        let message = capped_message(&spans);
        assert!(message.ends_with('…'));
    }

    #[test]
    fn long_reasons_leave_the_count_of_the_spans_not_listed() {
        let spans: Vec<RejectedSpan> = (0..30)
            .map(|index| RejectedSpan {
                index: Some(index),
                span_id: Some(format!("{index:016x}")),
                reason: format!("{index}: {}", "x".repeat(1_000)),
            })
            .collect();
        let message = capped_message(&spans);
        let listed = message.matches("span 0000").count();
        assert!(listed >= 1, "{message}");
        assert!(
            message.ends_with(&format!("; and {} more", 30 - listed)),
            "{message}"
        );
    }

    #[test]
    fn the_error_status_in_both_encodings() {
        let (content_type, body) =
            encode_status(GrpcCode::InvalidArgument, "bad body", OtlpEncoding::Json);
        assert_eq!(content_type, "application/json");
        assert_eq!(body, br#"{"code":3,"message":"bad body"}"#.to_vec());
        let (content_type, body) =
            encode_status(GrpcCode::Unavailable, "busy", OtlpEncoding::Protobuf);
        assert_eq!(content_type, "application/x-protobuf");
        assert_eq!(
            RpcStatus::decode(body.as_slice()).unwrap(),
            RpcStatus {
                code: 14,
                message: "busy".into()
            }
        );
        // Field 1 varint 14, field 2 length 4 "busy".
        assert_eq!(body, vec![0x08, 14, 0x12, 4, b'b', b'u', b's', b'y']);
    }
}
