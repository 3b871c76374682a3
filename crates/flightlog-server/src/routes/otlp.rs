//! `POST /v1/traces`: OTLP/HTTP trace ingest on the main listener; and `POST /v1/metrics` and
//! `POST /v1/logs`, which exporters send to the same endpoint by default: read, counted and
//! answered with `partialSuccess` saying they were not kept (see `flightlog_otlp::Signal`).
//!
//! Decoding and the span mapping live in `flightlog-otlp` (no HTTP there); this handler only
//! reads the headers, calls [`flightlog_otlp::decode_request`] and [`flightlog_otlp::ingest`],
//! and answers an `ExportTraceServiceResponse` in the request's own encoding (`partialSuccess`
//! names the spans refused and why).
//!
//! Errors: a request whose body is protobuf gets the OTLP/HTTP error body, a protobuf
//! `google.rpc.Status` (what a protobuf exporter can read); any other request gets the
//! contract's JSON `{"error": …}`. Either way the status code is the contract's (400, 413, 415,
//! 503 with `Retry-After`), so an exporter's retry logic, which reads only the status, behaves.
//!
//! Spans are written as the `Flightlog-Writer` header's identity, else as the writer `otlp`:
//! not the server's own per-boot identity, so a server restart never sweeps the pending spans
//! of traces still being delivered (their staleness is judged by heartbeat age instead).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use flightlog_otlp::{
    count_export, decode_request, encode_response, encode_status, ingest, signal_response,
    GrpcCode, OtlpEncoding, OtlpError, Signal,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{writer_header, WriterStore};
use crate::openapi::tags;
use crate::state::AppState;

/// The writer identity of OTLP spans when the request names none.
pub const OTLP_WRITER: &str = "otlp";

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(export_traces))
        .routes(routes!(export_metrics))
        .routes(routes!(export_logs))
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The route of OTLP/HTTP trace export.
pub(crate) const TRACES_PATH: &str = "/v1/traces";
/// The route of OTLP/HTTP metrics export (read and counted, not stored).
pub(crate) const METRICS_PATH: &str = "/v1/metrics";
/// The route of OTLP/HTTP logs export (read and counted, not stored).
pub(crate) const LOGS_PATH: &str = "/v1/logs";

/// Whether `path` is an OTLP/HTTP export route, whose protobuf requests get their errors in the
/// OTLP encoding.
pub(crate) fn is_otlp_path(path: &str) -> bool {
    path == TRACES_PATH || path == METRICS_PATH || path == LOGS_PATH
}

/// The body-limit refusal of a protobuf request to [`TRACES_PATH`], in the OTLP error encoding
/// (answered by the gate, before the route runs).
pub(crate) fn too_large_answer(limit: usize) -> Response {
    protobuf_failure(
        &crate::extract::payload_too_large_error(limit),
        GrpcCode::ResourceExhausted,
    )
}

/// A refusal of the gate (401, 403, 503) to a protobuf request to [`TRACES_PATH`], in the OTLP
/// error encoding: a `google.rpc.Status` with the matching gRPC code and the contract's HTTP
/// status (and `Retry-After` on a 503).
pub(crate) fn refusal_answer(error: &ApiError) -> Response {
    protobuf_failure(error, grpc_code_of(error))
}

/// The gRPC code of an error answered in protobuf, from its HTTP status (the OTLP
/// specification's table: a 400 is `INVALID_ARGUMENT`, not retried; a 503 `UNAVAILABLE`,
/// retried).
fn grpc_code_of(error: &ApiError) -> GrpcCode {
    match error.status() {
        StatusCode::UNAUTHORIZED => GrpcCode::Unauthenticated,
        StatusCode::FORBIDDEN => GrpcCode::PermissionDenied,
        StatusCode::SERVICE_UNAVAILABLE => GrpcCode::Unavailable,
        StatusCode::PAYLOAD_TOO_LARGE => GrpcCode::ResourceExhausted,
        status if status.is_server_error() => GrpcCode::Internal,
        _ => GrpcCode::InvalidArgument,
    }
}

/// Whether the request declared a protobuf body (its errors are then answered in protobuf).
pub(crate) fn is_protobuf(headers: &HeaderMap) -> bool {
    header_text(headers, CONTENT_TYPE.as_str())
        .and_then(OtlpEncoding::from_content_type)
        .is_some_and(|encoding| encoding == OtlpEncoding::Protobuf)
}

/// An error answer: the OTLP `Status` for protobuf requests, the contract's body otherwise.
fn failure(headers: &HeaderMap, error: ApiError, code: GrpcCode) -> Response {
    if !is_protobuf(headers) {
        return error.into_response();
    }
    protobuf_failure(&error, code)
}

/// `error` as a protobuf `google.rpc.Status` with the contract's HTTP status (and, as every
/// answer of an internal error, a line in the server's log).
fn protobuf_failure(error: &ApiError, code: GrpcCode) -> Response {
    let status = error.status();
    let (content_type, body) = encode_status(code, &error.to_string(), OtlpEncoding::Protobuf);
    let mut response = (status, [(CONTENT_TYPE, content_type)], body).into_response();
    error.insert_headers(response.headers_mut());
    if let ApiError::Internal(message) = error {
        crate::error::report_internal_error(message);
    }
    response
}

/// What an OTLP decoding error says to the client: the library's words, and for a body that
/// inflates past the limit how to fit (that 413 named no fix, where every other one names the
/// setting; an audit's finding).
pub(crate) fn otlp_error_message(error: &OtlpError) -> String {
    match error {
        OtlpError::TooLarge { .. } => format!(
            "{error}: split the export into smaller requests, or start the server with a higher \
             --body-limit (FLIGHTLOG_BODY_LIMIT or `body_limit` in the config file), which \
             raises this limit too once it is the larger (64 MiB by default)"
        ),
        _ => error.to_string(),
    }
}

fn decode_failure(headers: &HeaderMap, error: &OtlpError) -> Response {
    let message = otlp_error_message(error);
    let api_error = match error {
        OtlpError::UnsupportedContentType { .. } | OtlpError::UnsupportedContentEncoding { .. } => {
            ApiError::UnsupportedMediaType(message)
        }
        OtlpError::TooLarge { .. }
        | OtlpError::TooManyItems { .. }
        | OtlpError::TooManyCopies { .. } => ApiError::PayloadTooLarge(message),
        OtlpError::Malformed { .. } => ApiError::InvalidRequest(message),
    };
    failure(headers, api_error, error.grpc_code())
}

/// OTLP/HTTP trace export: each trace a run, each span a span (mapping:
/// `crates/flightlog-otlp/docs/otlp.md` in flightlog's repository).
#[utoipa::path(
    post,
    path = "/v1/traces",
    tag = tags::INGEST,
    operation_id = "exportTraces",
    params(WriterStore),
    request_body(
        description = "An OTLP `ExportTraceServiceRequest`, optionally `Content-Encoding: gzip` or \
            `deflate`.",
        content(
            (Vec<u8> = "application/x-protobuf"),
            (Object = "application/json"),
        ),
    ),
    responses(
        (status = 200, description = "An `ExportTraceServiceResponse` in the request's encoding; \
            `partialSuccess` counts the spans refused and says why.",
            content((Vec<u8> = "application/x-protobuf"), (Object = "application/json"))),
        (status = 400, description = "Malformed protobuf or OTLP/JSON (a protobuf request gets a \
            protobuf `google.rpc.Status` body).", body = ErrorBody),
        (status = 413, description = "The body, or what it inflates to, is too large.", body = ErrorBody),
        (status = 415, description = "Neither protobuf nor JSON, or an unknown `Content-Encoding`.", body = ErrorBody),
    ),
)]
async fn export_traces(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let writer = match writer_header(&headers) {
        Ok(writer) => writer.unwrap_or(OTLP_WRITER),
        Err(error) => return failure(&headers, error, GrpcCode::InvalidArgument),
    };
    let max_decompressed = state.config().otlp_max_decompressed;
    let (request, encoding) = match decode_request(
        header_text(&headers, CONTENT_TYPE.as_str()),
        header_text(&headers, CONTENT_ENCODING.as_str()),
        &body,
        max_decompressed,
    ) {
        Ok(decoded) => decoded,
        Err(error) => return decode_failure(&headers, &error),
    };
    let store = state.activity_as(writer);
    match ingest(store.as_ref(), request, state.otlp_mapping()).await {
        Ok((response, tally)) => {
            state.metrics().observe_ingest(&tally);
            let (content_type, body) = encode_response(&response, encoding);
            (StatusCode::OK, [(CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(error) => {
            let api_error = ApiError::from(error);
            let code = grpc_code_of(&api_error);
            failure(&headers, api_error, code)
        }
    }
}

/// OTLP/HTTP metrics export: read and counted, not stored (flightlog keeps traces; a run's
/// usage and cost come from its spans). `partialSuccess` says how many data points were not
/// kept and why, so an exporter neither fails nor retries.
#[utoipa::path(
    post,
    path = "/v1/metrics",
    tag = tags::INGEST,
    operation_id = "exportMetrics",
    request_body(
        description = "An OTLP `ExportMetricsServiceRequest`, optionally `Content-Encoding: gzip` \
            or `deflate`.",
        content(
            (Vec<u8> = "application/x-protobuf"),
            (Object = "application/json"),
        ),
    ),
    responses(
        (status = 200, description = "An `ExportMetricsServiceResponse` in the request's \
            encoding; `partialSuccess.rejectedDataPoints` counts the data points not kept.",
            content((Vec<u8> = "application/x-protobuf"), (Object = "application/json"))),
        (status = 400, description = "Malformed protobuf or OTLP/JSON (a protobuf request gets a \
            protobuf `google.rpc.Status` body).", body = ErrorBody),
        (status = 413, description = "The body, or what it inflates to, is too large.", body = ErrorBody),
        (status = 415, description = "Neither protobuf nor JSON, or an unknown `Content-Encoding`.", body = ErrorBody),
    ),
)]
async fn export_metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    export_signal(&state, &headers, &body, Signal::Metrics)
}

/// OTLP/HTTP logs export: read and counted, not stored (span events are kept with their
/// spans). `partialSuccess` says how many log records were not kept and why.
#[utoipa::path(
    post,
    path = "/v1/logs",
    tag = tags::INGEST,
    operation_id = "exportLogs",
    request_body(
        description = "An OTLP `ExportLogsServiceRequest`, optionally `Content-Encoding: gzip` or \
            `deflate`.",
        content(
            (Vec<u8> = "application/x-protobuf"),
            (Object = "application/json"),
        ),
    ),
    responses(
        (status = 200, description = "An `ExportLogsServiceResponse` in the request's encoding; \
            `partialSuccess.rejectedLogRecords` counts the log records not kept.",
            content((Vec<u8> = "application/x-protobuf"), (Object = "application/json"))),
        (status = 400, description = "Malformed protobuf or OTLP/JSON (a protobuf request gets a \
            protobuf `google.rpc.Status` body).", body = ErrorBody),
        (status = 413, description = "The body, or what it inflates to, is too large.", body = ErrorBody),
        (status = 415, description = "Neither protobuf nor JSON, or an unknown `Content-Encoding`.", body = ErrorBody),
    ),
)]
async fn export_logs(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    export_signal(&state, &headers, &body, Signal::Logs)
}

/// Read and count an export of `signal`, and answer it.
fn export_signal(state: &AppState, headers: &HeaderMap, body: &[u8], signal: Signal) -> Response {
    match count_export(
        signal,
        header_text(headers, CONTENT_TYPE.as_str()),
        header_text(headers, CONTENT_ENCODING.as_str()),
        body,
        state.config().otlp_max_decompressed,
    ) {
        Ok((dropped, encoding)) => {
            state.metrics().observe_dropped(signal, dropped);
            let (content_type, body) = signal_response(signal, dropped, encoding);
            (StatusCode::OK, [(CONTENT_TYPE, content_type)], body).into_response()
        }
        Err(error) => decode_failure(headers, &error),
    }
}
