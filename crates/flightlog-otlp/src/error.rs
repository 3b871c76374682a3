//! Why an OTLP/HTTP request body could not be decoded, and the HTTP status each reason deserves.
//!
//! The crate has no HTTP dependency; [`OtlpError::http_status`] is a plain number the server's
//! error mapping uses, so the status each failure gets is decided (and tested) here, next to the
//! decoding rules.

use crate::response::GrpcCode;

/// A request body that is refused as a whole. Spans that are individually unusable are not
/// errors: they are rejected one by one (see [`crate::RejectedSpan`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtlpError {
    /// The `Content-Type` is absent or not one of the OTLP encodings (HTTP 415).
    #[error(
        "unsupported content type {content_type:?}: OTLP/HTTP accepts application/x-protobuf, \
         application/protobuf and application/json"
    )]
    UnsupportedContentType { content_type: String },
    /// The `Content-Encoding` is none of absent, `identity`, `gzip` and `deflate` (HTTP 415).
    #[error("unsupported content encoding {content_encoding:?}: use gzip, deflate or identity")]
    UnsupportedContentEncoding { content_encoding: String },
    /// The body is not a valid request in its declared encoding (HTTP 400); `message` says where.
    #[error("malformed OTLP request: {message}")]
    Malformed { message: String },
    /// The body, once inflated, is larger than the limit (HTTP 413). Inflation stopped at the
    /// limit: the rest of the body was never decompressed.
    #[error("the decompressed request exceeds {limit} bytes")]
    TooLarge { limit: usize },
    /// The body would take more memory decoded than its size allows (HTTP 413): a body of many
    /// tiny or empty entries (see `decoded_size`). Refused before anything is decoded.
    #[error(
        "the request holds too many entries for its size: decoded, it would take more than \
         {budget} bytes (empty or tiny spans, attributes or resources); send real entries, or \
         fewer in one request"
    )]
    TooManyItems { budget: usize },
    /// Every span keeps its resource's and scope's attributes in its own attrs, so a request's
    /// copies of them (each span's share times its spans) may take more than the request
    /// itself: a 249 KB export of one 96 KB resource and 3,000 spans took 600 MiB and wrote 290
    /// MB (an audit's finding). Refused as a whole (HTTP 413) when the copies would pass the
    /// budget of the decoded request (see `decoded_size`).
    #[error(
        "the resource and scope attributes are copied into each of their spans: this request's \
         {spans} spans would take {copies} bytes of copies, more than its budget of {budget} \
         bytes; send fewer spans per request, or smaller resource attributes"
    )]
    TooManyCopies {
        spans: usize,
        copies: usize,
        budget: usize,
    },
}

impl OtlpError {
    pub(crate) fn malformed(message: impl Into<String>) -> Self {
        Self::Malformed {
            message: flightlog_core::json_text::explain_json_error(message.into()),
        }
    }

    /// The HTTP status code of this failure: 415, 400 or 413.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::UnsupportedContentType { .. } | Self::UnsupportedContentEncoding { .. } => 415,
            Self::Malformed { .. } => 400,
            Self::TooLarge { .. } | Self::TooManyItems { .. } | Self::TooManyCopies { .. } => 413,
        }
    }

    /// The gRPC status code for the `google.rpc.Status` body an OTLP/HTTP error response carries.
    pub fn grpc_code(&self) -> GrpcCode {
        match self {
            Self::TooLarge { .. } | Self::TooManyItems { .. } | Self::TooManyCopies { .. } => {
                GrpcCode::ResourceExhausted
            }
            _ => GrpcCode::InvalidArgument,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_has_its_http_status() {
        let cases = [
            (
                OtlpError::UnsupportedContentType {
                    content_type: "text/plain".into(),
                },
                415,
            ),
            (
                OtlpError::UnsupportedContentEncoding {
                    content_encoding: "br".into(),
                },
                415,
            ),
            (OtlpError::malformed("x"), 400),
            (OtlpError::TooLarge { limit: 1 }, 413),
            (OtlpError::TooManyItems { budget: 1 }, 413),
            (
                OtlpError::TooManyCopies {
                    spans: 2,
                    copies: 2,
                    budget: 1,
                },
                413,
            ),
        ];
        for (error, status) in cases {
            assert_eq!(error.http_status(), status, "{error}");
        }
    }
}
