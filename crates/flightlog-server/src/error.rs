//! [`ApiError`]: the one place where anything that goes wrong becomes the contract's status code
//! and `{"error": {"code", "message"}}` body.
//!
//! Handlers return `Result<_, ApiError>`; store and journal errors convert with `?`, and the
//! extractors of [`crate::extract`] turn every rejection (bad JSON, wrong content type, too large
//! a body, a bad query string) into one of these variants, so no response of this server ever
//! carries axum's plain-text rejection bodies.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flightlog_core::activity::StoreError;
use flightlog_core::journal::{JournalError, COMPACTION_MIN_EVENTS};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::ToSchema;

/// How long a client told `503 unavailable` should wait before retrying, in seconds.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// A request that failed, as the contract's error table names it. Each variant's text is the
/// human sentence sent as `message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid_request`: malformed JSON, wrong types, missing fields, empty or too long ids,
    /// numbers out of range, a bad query string or header.
    #[error("{0}")]
    InvalidRequest(String),
    /// 401 `unauthorized`: tokens are configured and the request carries none, a malformed
    /// `Authorization` header or an unknown token; sent with `WWW-Authenticate: Bearer` and
    /// `Basic`.
    #[error("{0}")]
    Unauthorized(String),
    /// 403 `forbidden`: the token is valid but lacks the scope the route needs.
    #[error("{0}")]
    Forbidden(String),
    /// 404 `not_found`: an unknown span, run or engagement where the reference returns null, or
    /// a path no route serves.
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`: the path exists but not with this method (the `Allow` header is
    /// added by the router).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 409 `conflict`: a duplicate `spanId` on start, an `expectedSeq` mismatch on an append.
    #[error("{0}")]
    Conflict(String),
    /// 409 `journal_full`: the engagement reached `maxEventsPerEngagement`.
    #[error("{0}")]
    JournalFull(String),
    /// 408 `request_timeout`: a write's body stalled (nothing new for a while, or not all of it
    /// within the time a body may take); sent with `Connection: close`, since the rest of the
    /// body is left unread. A stalled body must not keep its connection and what arrived of
    /// it (which holds the budgets of bodies in flight) forever.
    #[error("{0}")]
    RequestTimeout(String),
    /// 413 `payload_too_large`: the body is over the configured limit.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 415 `unsupported_media_type`: a body that is not `application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 503 `unavailable`: the store is overloaded or shutting down; sent with `Retry-After`.
    #[error("{0}")]
    Unavailable(String),
    /// 500 `internal`: the database failed or holds data this version cannot read.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 `invalid_request` with `message` (serde_json's message for a lone UTF-16 surrogate
    /// escape gets what that is: see `flightlog_core::json_text`).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::InvalidRequest(flightlog_core::json_text::explain_json_error(
            message.into(),
        ))
    }

    /// A 404 `not_found` with `message`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::NotFound(message.into())
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict(_) | Self::JournalFull(_) => StatusCode::CONFLICT,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable `code` of the body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) => "invalid_request",
            Self::Unauthorized(_) => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed(_) => "method_not_allowed",
            Self::Conflict(_) => "conflict",
            Self::JournalFull(_) => "journal_full",
            Self::RequestTimeout(_) => "request_timeout",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::UnsupportedMediaType(_) => "unsupported_media_type",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal",
        }
    }

    /// The body `{"error": {"code", "message"}}`; also what a batch op's failed entry holds.
    pub fn body(&self) -> Value {
        json!({"error": {"code": self.code(), "message": self.to_string()}})
    }

    /// [`ApiError::body`] as its typed shape.
    pub fn error_body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message: self.to_string(),
            },
        }
    }
}

/// The body of every error answer, as the OpenAPI document describes it. [`ApiError::body`]
/// writes it (a test checks that what it writes reads back as this type).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The `error` object of an [`ErrorBody`] (a failed op's entry in a batch's `results` is a
/// whole [`ErrorBody`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    /// Machine-readable: `invalid_request`, `unauthorized`, `forbidden`, `not_found`,
    /// `method_not_allowed`, `conflict`, `journal_full`, `request_timeout`, `payload_too_large`,
    /// `unsupported_media_type`, `unavailable` or `internal`.
    #[schema(example = "invalid_request")]
    pub code: String,
    /// A human sentence; not meant to be parsed.
    pub message: String,
}

impl ApiError {
    /// The headers this error's status calls for, whatever the body's encoding (the OTLP
    /// routes answer some in protobuf).
    pub(crate) fn insert_headers(&self, headers: &mut HeaderMap) {
        match self {
            Self::Unavailable(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
            }
            // The rest of the body is unread: the connection cannot carry another request.
            Self::RequestTimeout(_) => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            // RFC 6750: a 401 names the schemes the client may use (see `auth::CHALLENGES`).
            Self::Unauthorized(_) => crate::auth::insert_challenges(headers),
            _ => {}
        }
    }
}

/// The contract's error code of an error answer, in the answer's extensions, for the gate to
/// count (`flightlog_http_errors_total`): two 409s, `conflict` and `journal_full`, ask
/// different things of an operator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ErrorCode(pub(crate) &'static str);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        self.insert_headers(response.headers_mut());
        response.extensions_mut().insert(ErrorCode(self.code()));
        if let Self::Internal(message) = self {
            report_internal_error(&message);
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        let message = err.to_string();
        match err {
            StoreError::DuplicateSpan { .. } => Self::Conflict(message),
            StoreError::InvalidInput(_) => Self::InvalidRequest(message),
            StoreError::StorageFull(_) => {
                report_storage_full(&message);
                Self::Unavailable(message)
            }
            StoreError::Overloaded
            | StoreError::Closed
            | StoreError::Busy(_)
            | StoreError::Unavailable(_) => Self::Unavailable(message),
            StoreError::FileLost(_) => {
                report_file_lost(&message);
                Self::Unavailable(message)
            }
            StoreError::DiskFailed(_) => {
                report_disk_failed(&message);
                Self::Unavailable(message)
            }
            StoreError::SchemaTooNew { .. }
            | StoreError::SchemaUnknown(_)
            | StoreError::NotFlightlog(_)
            | StoreError::Corrupt(_)
            | StoreError::Backend(_) => Self::Internal(message),
        }
    }
}

/// The bytes an id keeps in a path segment of a message's example URL unencoded: RFC 3986's
/// unreserved ones.
pub(crate) const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl From<JournalError> for ApiError {
    fn from(err: JournalError) -> Self {
        let message = err.to_string();
        match err {
            JournalError::Invalid(_) | JournalError::NotFinite { .. } => {
                Self::InvalidRequest(message)
            }
            JournalError::JournalFull {
                engagement_id,
                max_events,
            } => {
                // Compaction leaves an engagement of at most COMPACTION_MIN_EVENTS events alone,
                // so under such a limit it cannot make room: not offered then.
                let compact =
                    if usize::try_from(max_events).is_ok_and(|max| max > COMPACTION_MIN_EVENTS) {
                        // Only an engagement already closed as completed can be compacted (a
                        // full one cannot take its closing record any more).
                        format!(
                            "if it was already closed as completed, compact it (POST \
                             /v1/engagements/{}/compact); otherwise ",
                            percent_encoding::utf8_percent_encode(&engagement_id, PATH_SEGMENT)
                        )
                    } else {
                        String::new()
                    };
                Self::JournalFull(format!(
                    "{message}: {compact}continue in a new engagement, or start the server with \
                     a higher limit (--journal-max-events, FLIGHTLOG_JOURNAL_MAX_EVENTS or \
                     `journal.max_events` in the config file)"
                ))
            }
            JournalError::WrongExpectedSeq { .. } => Self::Conflict(message),
            JournalError::StorageFull(_) => {
                report_storage_full(&message);
                Self::Unavailable(message)
            }
            JournalError::Closed
            | JournalError::Overloaded
            | JournalError::Busy(_)
            | JournalError::Unavailable(_) => Self::Unavailable(message),
            JournalError::FileLost(_) => {
                report_file_lost(&message);
                Self::Unavailable(message)
            }
            JournalError::DiskFailed(_) => {
                report_disk_failed(&message);
                Self::Unavailable(message)
            }
            JournalError::Corrupt(_) | JournalError::Backend(_) => Self::Internal(message),
        }
    }
}

/// Says on stderr, once per process, that the database file was lost (deleted or replaced
/// under the server): from then on every write and `/healthz` answer 503 until a stop and a
/// start (the message says what to do between them), and
/// the operator heard of it only when the server stopped.
fn report_file_lost(message: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr().lock(),
            "flightlog: error: {message} (noticed now: every write and /healthz answer 503 \
             until the server ends and is started again)"
        );
    }
}

/// Says on stderr that a request was answered `500` and why, at most once a second (with the
/// count of those not shown since): a 500 means the server could not do what the contract
/// promises (a damaged file, an I/O error), which the operator must hear about even when every
/// client just retries, but a failing disk must not turn into a flood of identical lines.
pub(crate) fn report_internal_error(message: &str) {
    static LIMITER: std::sync::Mutex<ReportLimiter> =
        std::sync::Mutex::new(ReportLimiter::new(std::time::Duration::from_secs(1)));
    report_limited(&LIMITER, |withheld| internal_error_line(message, withheld));
}

/// Says on stderr that a write was refused because the disk is full, at most once every ten
/// seconds (with the count of those not shown since): the clients hear `503` with
/// `Retry-After` and retry, and without a line here the operator who must free the space heard
/// nothing until the scheduled maintenance happened to fail too.
fn report_storage_full(message: &str) {
    static LIMITER: std::sync::Mutex<ReportLimiter> =
        std::sync::Mutex::new(ReportLimiter::new(std::time::Duration::from_secs(10)));
    report_limited(&LIMITER, |withheld| storage_full_line(message, withheld));
}

/// Says on stderr that a write was refused because the disk failed it (an I/O error, a file
/// system made read-only), at most once every ten seconds, as a full disk is said.
fn report_disk_failed(message: &str) {
    static LIMITER: std::sync::Mutex<ReportLimiter> =
        std::sync::Mutex::new(ReportLimiter::new(std::time::Duration::from_secs(10)));
    report_limited(&LIMITER, |withheld| storage_full_line(message, withheld));
}

/// Writes the line `line(withheld)` to stderr when `limiter` admits one now.
fn report_limited(limiter: &std::sync::Mutex<ReportLimiter>, line: impl FnOnce(u64) -> String) {
    let admitted = match limiter.lock() {
        Ok(mut limiter) => limiter.admit(std::time::Instant::now()),
        Err(_) => None,
    };
    if let Some(withheld) = admitted {
        use std::io::Write;
        // Written, not `eprintln!`: a closed stderr must not panic the request.
        let _ = writeln!(std::io::stderr().lock(), "{}", line(withheld));
    }
}

fn internal_error_line(message: &str, withheld: u64) -> String {
    let mut line = format!("flightlog: error: a request was answered 500: {message}");
    if withheld > 0 {
        line.push_str(&format!(
            " ({withheld} more 500s since the last line like this)"
        ));
    }
    line
}

fn storage_full_line(message: &str, withheld: u64) -> String {
    let mut line = format!("flightlog: error: a write was refused (503, Retry-After): {message}");
    if withheld > 0 {
        line.push_str(&format!(
            " ({withheld} more refused since the last line like this)"
        ));
    }
    line
}

/// One report an interval; the rest are counted.
struct ReportLimiter {
    interval: std::time::Duration,
    last: Option<std::time::Instant>,
    withheld: u64,
}

impl ReportLimiter {
    const fn new(interval: std::time::Duration) -> Self {
        Self {
            interval,
            last: None,
            withheld: 0,
        }
    }

    /// `Some(withheld since the last report)` when a report may go out at `now`.
    fn admit(&mut self, now: std::time::Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last) < self.interval)
        {
            self.withheld += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.withheld))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_errors_are_reported_once_a_second_with_a_count_of_the_rest() {
        let start = std::time::Instant::now();
        let mut limiter = ReportLimiter::new(std::time::Duration::from_secs(1));
        let at = |ms: u64| start + std::time::Duration::from_millis(ms);
        assert_eq!(limiter.admit(at(0)), Some(0));
        assert_eq!(limiter.admit(at(10)), None);
        assert_eq!(limiter.admit(at(999)), None);
        assert_eq!(limiter.admit(at(1_000)), Some(2));
        assert_eq!(limiter.admit(at(5_000)), Some(0));
        assert_eq!(
            internal_error_line("database error: disk I/O error", 2),
            "flightlog: error: a request was answered 500: database error: disk I/O error \
             (2 more 500s since the last line like this)"
        );
        assert_eq!(
            storage_full_line("the disk is full: x; free space on it, then retry", 7),
            "flightlog: error: a write was refused (503, Retry-After): the disk is full: x; \
             free space on it, then retry (7 more refused since the last line like this)"
        );
    }
    /// Compaction is offered only where it can make room: an engagement may hold more events
    /// than compaction ever leaves alone.
    #[test]
    fn a_full_journal_offers_compaction_only_above_the_events_compaction_leaves_alone() {
        let message = |max_events: u64| {
            ApiError::from(JournalError::JournalFull {
                engagement_id: "a b".into(),
                max_events,
            })
            .to_string()
        };
        for max in [1, 3, 20] {
            let text = message(max);
            assert!(!text.contains("compact"), "{max}: {text}");
            assert!(
                text.contains("continue in a new engagement"),
                "{max}: {text}"
            );
        }
        let text = message(21);
        assert!(
            text.contains(
                "if it was already closed as completed, compact it (POST \
                 /v1/engagements/a%20b/compact); otherwise continue in a new engagement"
            ),
            "{text}"
        );
    }

    use flightlog_core::journal::AppendValidationError;

    fn status_and_code(err: impl Into<ApiError>) -> (u16, &'static str) {
        let err = err.into();
        (err.status().as_u16(), err.code())
    }

    #[test]
    fn every_store_error_has_a_contract_status() {
        let cases = [
            (
                StoreError::DuplicateSpan {
                    span_id: "s".into(),
                },
                (409, "conflict"),
            ),
            (StoreError::Overloaded, (503, "unavailable")),
            (StoreError::Closed, (503, "unavailable")),
            (StoreError::Busy("x".into()), (503, "unavailable")),
            (StoreError::Unavailable("x".into()), (503, "unavailable")),
            (StoreError::StorageFull("x".into()), (503, "unavailable")),
            (StoreError::DiskFailed("x".into()), (503, "unavailable")),
            (StoreError::FileLost("x".into()), (503, "unavailable")),
            (
                StoreError::SchemaTooNew {
                    found: 9,
                    supported: 1,
                },
                (500, "internal"),
            ),
            (StoreError::NotFlightlog("x".into()), (500, "internal")),
            (StoreError::Corrupt("x".into()), (500, "internal")),
            (StoreError::Backend("x".into()), (500, "internal")),
        ];
        for (err, expected) in cases {
            assert_eq!(status_and_code(err), expected);
        }
    }

    #[test]
    fn every_journal_error_has_a_contract_status() {
        let cases = [
            (
                JournalError::Invalid(AppendValidationError::Type { found: "nothing" }),
                (400, "invalid_request"),
            ),
            (
                JournalError::JournalFull {
                    engagement_id: "e".into(),
                    max_events: 1,
                },
                (409, "journal_full"),
            ),
            (
                JournalError::WrongExpectedSeq {
                    expected: 1,
                    actual: 2,
                },
                (409, "conflict"),
            ),
            (JournalError::Closed, (503, "unavailable")),
            (JournalError::StorageFull("x".into()), (503, "unavailable")),
            (JournalError::DiskFailed("x".into()), (503, "unavailable")),
            (JournalError::FileLost("x".into()), (503, "unavailable")),
            (JournalError::Overloaded, (503, "unavailable")),
            (JournalError::Busy("x".into()), (503, "unavailable")),
            (JournalError::Unavailable("x".into()), (503, "unavailable")),
            (JournalError::Corrupt("x".into()), (500, "internal")),
            (JournalError::Backend("x".into()), (500, "internal")),
        ];
        for (err, expected) in cases {
            assert_eq!(status_and_code(err), expected);
        }
    }

    #[test]
    fn every_error_body_reads_back_as_the_documented_shape() {
        let errors = [
            ApiError::invalid("i"),
            ApiError::Unauthorized("u".into()),
            ApiError::Forbidden("f".into()),
            ApiError::not_found("n"),
            ApiError::MethodNotAllowed("m".into()),
            ApiError::Conflict("c".into()),
            ApiError::JournalFull("j".into()),
            ApiError::PayloadTooLarge("p".into()),
            ApiError::UnsupportedMediaType("u".into()),
            ApiError::Unavailable("u".into()),
            ApiError::Internal("i".into()),
        ];
        for err in errors {
            let body: Result<ErrorBody, _> = serde_json::from_value(err.body());
            assert_eq!(
                body.ok().map(|body| body.error),
                Some(ErrorDetail {
                    code: err.code().to_owned(),
                    message: err.to_string(),
                }),
                "{err:?}"
            );
        }
    }

    /// The store errors a batch answers 503 as a whole for are exactly those a single write
    /// answers 503 for.
    #[test]
    fn the_store_refusals_of_every_write_are_the_unavailable_ones() {
        let errors = [
            StoreError::DuplicateSpan {
                span_id: "s".into(),
            },
            StoreError::Overloaded,
            StoreError::Closed,
            StoreError::SchemaTooNew {
                found: 2,
                supported: 1,
            },
            StoreError::NotFlightlog("n".into()),
            StoreError::SchemaUnknown("u".into()),
            StoreError::Corrupt("c".into()),
            StoreError::Busy("b".into()),
            StoreError::Unavailable("u".into()),
            StoreError::Backend("b".into()),
            StoreError::InvalidInput("i".into()),
            StoreError::StorageFull("f".into()),
            StoreError::FileLost("l".into()),
            StoreError::DiskFailed("d".into()),
        ];
        for err in errors {
            assert_eq!(
                err.refuses_every_write(),
                matches!(ApiError::from(err.clone()), ApiError::Unavailable(_)),
                "{err:?}"
            );
        }
    }

    #[test]
    fn unavailable_carries_retry_after_and_the_error_body() {
        let response = ApiError::from(StoreError::Overloaded).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from(RETRY_AFTER_SECONDS))
        );
        assert_eq!(
            ApiError::from(StoreError::Overloaded).body(),
            json!({"error": {"code": "unavailable",
                             "message": "the store's write queue is full; retry later"}})
        );
    }
}
