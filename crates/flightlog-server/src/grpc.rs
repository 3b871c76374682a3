//! The OTLP/gRPC listener: `opentelemetry.proto.collector.trace.v1.TraceService/Export`, and
//! the metrics and logs services (`MetricsService/Export`, `LogsService/Export`), which read and
//! answer exports without storing them (see `flightlog_otlp::Signal`), each routed by its path
//! prefix; every call passes the same token check and write limit.
//!
//! The service itself (mapping, import, `partialSuccess`) is `flightlog-otlp`'s, shared with the
//! OTLP/HTTP route; this module gives it the server's auth (the `ingest` scope, a token as
//! `Bearer` or as the password of `Basic`, from the call's `authorization` metadata), its writer
//! identity (always `otlp`: a `flightlog-writer` metadata entry is not consulted, since exporters
//! set metadata once per exporter, not per call, and one identity keeps sweeps predictable) and
//! a listener of its own. It is served by axum over HTTP/2 cleartext (h2c, what OTLP exporters use on
//! loopback and behind a TLS-terminating proxy), so no second HTTP stack is needed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use flightlog_otlp::{
    signal_services, trace_service, Authorize, ExportSchema, IngestTally, OtlpError, Signal,
};
use tokio::net::TcpListener;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::auth::{presented_token, AuthConfig, Scope};
use crate::connection_limit::ConnectionOfRequest;
use crate::routes::otlp::OTLP_WRITER;
use crate::state::AppState;
use crate::ServeError;

/// Admit a call when auth is off, or when its token holds the `ingest` scope.
fn authorizer(auth: AuthConfig) -> Arc<Authorize> {
    Arc::new(move |metadata: &MetadataMap| {
        if !auth.is_enabled() {
            return Ok(());
        }
        let mut values = metadata.get_all("authorization").iter();
        let value = values.next().ok_or_else(|| {
            Status::unauthenticated(
                "this server needs `authorization: Bearer <token>` metadata on every call",
            )
        })?;
        // Two credentials: honouring either would make the answer depend on their order (as
        // the HTTP listener refuses two `Authorization` headers).
        if values.next().is_some() {
            return Err(Status::unauthenticated(
                "the authorization metadata is given more than once; send one token",
            ));
        }
        let value = value
            .to_str()
            .map_err(|_| Status::unauthenticated("the authorization metadata must be ASCII"))?;
        let token = presented_token(value).map_err(Status::unauthenticated)?;
        let scopes = auth.scopes_of(&token).ok_or_else(|| {
            Status::unauthenticated(
                "the token is not one this server accepts: check the Bearer token (with Basic \
                 credentials, the password)",
            )
        })?;
        if scopes.contains(Scope::Ingest) {
            Ok(())
        } else {
            Err(Status::permission_denied(
                "this token lacks the `ingest` scope that every OTLP export (traces, metrics, \
                 logs) needs",
            ))
        }
    })
}

/// The gRPC services over `state`'s stores (traces; metrics and logs, answered not stored), as
/// a router.
pub fn grpc_app(state: &AppState) -> Router {
    let counted = state.clone();
    let authorize = authorizer(state.config().auth.clone());
    let service = trace_service(
        state.activity_as(OTLP_WRITER),
        Arc::clone(&authorize),
        state.otlp_mapping().clone(),
        Arc::new(move |tally: &IngestTally| counted.metrics().observe_ingest(tally)),
    )
    // An OTLP batch is bounded as on the HTTP listener: its message by the body limit (checked
    // in `entries_within_budget`), what a compressed one inflates to by the inflated limit
    // (64 MiB by default; tonic's default would be 4 MiB for both). A compressed batch the HTTP
    // listener took was refused here past the body limit (an audit's finding).
    .max_decoding_message_size(state.config().otlp_max_decompressed);
    let counted = state.clone();
    let (metrics, logs) = signal_services(
        Arc::clone(&authorize),
        Arc::new(move |signal: Signal, items: u64| {
            counted.metrics().observe_dropped(signal, items)
        }),
    );
    let inflated_limit = state.config().otlp_max_decompressed;
    let metrics = metrics.max_decoding_message_size(inflated_limit);
    let logs = logs.max_decoding_message_size(inflated_limit);
    // Each service under its own path prefix (`/<package>.<Service>/<Method>`); anything else
    // reaches the trace service, which answers UNIMPLEMENTED for a method it does not have.
    Router::new()
        .route_service(&grpc_route(&metrics), metrics)
        .route_service(&grpc_route(&logs), logs)
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(
            GrpcGate {
                state: state.clone(),
                authorize,
            },
            admit_export,
        ))
}

/// What [`admit_export`] needs: the server's state (its write limit) and the token check.
#[derive(Clone)]
struct GrpcGate {
    state: AppState,
    authorize: Arc<Authorize>,
}

/// Every call here is a write: it takes a slot of the server's write limit, shared with the
/// HTTP listener, as an OTLP/HTTP export does, and is refused `UNAVAILABLE` (the exporter backs
/// off and retries) when none is free within the write wait. Without it a flood of gRPC exports
/// bypassed the limit, each holding its decoded batch in memory while waiting for the store.
/// As over HTTP, the message is read whole first, under the budgets of bodies in flight and
/// the HTTP gate's rules (10 s allowed between bytes, 10 s for the first 64 KiB, 60 s in all,
/// then `DEADLINE_EXCEEDED`), and the slot is taken only once it is here, so a slow peer holds
/// no slot while its message trickles in.
///
/// The token is checked first, from the call's headers (its metadata), as the HTTP gate checks
/// it before anything else: a peer without a valid token must not hold any of the budget of
/// bodies in flight (shared with the HTTP listener) for as long as its body takes to arrive.
///
/// The caller's deadline (`grpc-timeout`) bounds the body, the wait for the slot and the
/// export: past it the call ends `DEADLINE_EXCEEDED`; an export already running goes on to its
/// end holding its slot and budget (see `finish_on_drop`: the writer commits it anyway; the
/// exporter's retry of it is idempotent). Every answered call is counted by method and status
/// code (`flightlog_grpc_calls_total`).
async fn admit_export(
    axum::extract::State(gate): axum::extract::State<GrpcGate>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let method = call_method_label(request.uri().path());
    let state = gate.state.clone();
    let response = admit_and_export(gate, request, next).await;
    state
        .metrics()
        .observe_grpc_call(method, call_code_label(&response));
    response
}

/// The methods this listener serves (anything else is `UNIMPLEMENTED`, its message naming these).
const EXPORT_METHODS: [&str; 3] = [
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
];

/// A request that is not gRPC (its `content-type` is not `application/grpc`, `…+proto` and the
/// like) is answered `415`, as the gRPC protocol asks of servers ("so that other HTTP/2 clients
/// do not read a gRPC error, status 200, as a success"), with the contract's error body and a
/// `grpc-status` of `INVALID_ARGUMENT` (how it is counted). It was handled as a gRPC call, and a
/// JSON body's answer was `200` with `grpc-status: 0` (an audit's finding).
fn not_grpc(headers: &axum::http::HeaderMap) -> Option<axum::response::Response> {
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let is_grpc = content_type
        .get(.."application/grpc".len())
        .is_some_and(|start| start.eq_ignore_ascii_case("application/grpc"))
        && matches!(
            content_type.as_bytes().get("application/grpc".len()),
            None | Some(b'+' | b';')
        );
    if is_grpc {
        return None;
    }
    let shown = if content_type.is_empty() {
        "none".to_owned()
    } else {
        format!("{content_type:?}")
    };
    let mut response = axum::response::IntoResponse::into_response(
        crate::ApiError::UnsupportedMediaType(format!(
            "this is flightlog's OTLP/gRPC listener: a call's content-type must be \
             application/grpc (this request's is {shown}); send OTLP/HTTP (JSON or protobuf) to \
             /v1/traces on the HTTP listener"
        )),
    );
    response.headers_mut().insert(
        "grpc-status",
        axum::http::HeaderValue::from(tonic::Code::InvalidArgument as i32),
    );
    Some(response)
}

/// The `method` label of `flightlog_grpc_calls_total` for a call to `path`: one of the OTLP
/// Export methods, else `other` (the trace service answers it UNIMPLEMENTED), so that made-up
/// paths add no series.
fn call_method_label(path: &str) -> &'static str {
    EXPORT_METHODS
        .into_iter()
        .find(|method| *method == path)
        .unwrap_or("other")
}

/// The `code` label of `flightlog_grpc_calls_total` for an answer: the `grpc-status` of a
/// trailers-only answer (every refusal and every error of a unary call), else `OK` (a unary
/// call that succeeded sends its status in the trailers).
fn call_code_label(response: &axum::response::Response) -> &'static str {
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32);
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// [`admit_export`] but for counting: the token, the deadline, the export in its slot.
async fn admit_and_export(
    gate: GrpcGate,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(refusal) = not_grpc(request.headers()) {
        return refusal;
    }
    let metadata = MetadataMap::from_headers(request.headers().clone());
    if let Err(status) = (gate.authorize)(&metadata) {
        return refuse(status);
    }
    let path = request.uri().path();
    if call_method_label(path) == "other" {
        return refuse(Status::unimplemented(format!(
            "this server has no gRPC method {path}; it serves {}",
            EXPORT_METHODS.join(", ")
        )));
    }
    // A call with a valid token (or to a server without tokens) keeps its connection from being
    // closed to make room while it is in use (see `connection_limit`).
    ConnectionOfRequest::vouch_for(request.extensions());
    let deadline = request
        .headers()
        .get("grpc-timeout")
        .and_then(|value| value.to_str().ok())
        .and_then(grpc_timeout);
    let body_limit = gate.state.config().body_limit;
    let call = export_in_slot(gate.state, request, next);
    let response = match deadline {
        None => call.await,
        Some(timeout) => match tokio::time::timeout(timeout, call).await {
            Ok(response) => response,
            Err(_) => {
                return refuse(Status::deadline_exceeded(format!(
                    "the call's deadline (grpc-timeout, {timeout:?}) passed before the export \
                     was done"
                )))
            }
        },
    };
    too_large_is_resource_exhausted(response, body_limit)
}

/// A gRPC error answer (trailers-only: the status in the headers).
fn refuse(status: Status) -> axum::response::Response {
    status.into_http::<axum::body::Body>()
}

/// The export: its message read, then run under a slot of the write limit (see
/// [`admit_export`]).
async fn export_in_slot(
    state: AppState,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    // The message limit is tonic's to enforce; this bound only keeps a runaway body from being
    // buffered: the message, its 5-byte frame prefix and some slack.
    let limit = state.config().body_limit.saturating_add(64 * 1024);
    // The call's message holds its size of the budget of bodies in flight until the answer
    // (see `request_budget`); a gRPC body declares no length, so it is taken as it arrives.
    let mut hold = state.request_budget().hold();
    let request = match crate::gate::read_whole(request, limit, &mut hold).await {
        Ok(request) => request,
        Err(crate::gate::BodyRead::OverBudget(refusal, _)) => {
            return refuse(Status::unavailable(refusal.to_string()))
        }
        Err(crate::gate::BodyRead::TooLarge(_)) => {
            return refuse(message_too_large(state.config().body_limit))
        }
        Err(crate::gate::BodyRead::Failed(error)) => {
            return refuse(Status::cancelled(error.to_string()))
        }
        Err(crate::gate::BodyRead::Stalled(error)) => {
            return refuse(Status::deadline_exceeded(error.to_string()))
        }
    };
    let limits = MessageLimits {
        body_limit: state.config().body_limit,
        inflated_limit: state.config().otlp_max_decompressed,
    };
    let request = match entries_within_budget(request, limits, &mut hold).await {
        Ok(request) => request,
        Err(status) => return refuse(status),
    };
    // The message is all here: only now does the call take its slot (a slow message holds
    // none; see `overload`).
    let slot = match crate::overload::take_write_slot(&state, &axum::http::Method::POST, true).await
    {
        Ok(slot) => slot,
        Err(refusal) => return refuse(Status::unavailable(refusal.to_string())),
    };
    // The export runs to its answer holding its slot and budget, its client there or not (see
    // `finish_on_drop`): a client's deadline or reset cancels the call, not the write.
    let abandoned = {
        let state = state.clone();
        move |_| state.metrics().write_abandoned()
    };
    crate::finish_on_drop::FinishOnDrop::new(next.run(request), (hold, slot), abandoned).await
}

/// The message's entries checked before tonic decodes them, as an OTLP/HTTP body's are: a
/// message of empty or tiny entries decodes to fifty times its size (see
/// `flightlog_otlp::check_grpc_messages`). The body is in memory already (read whole above).
/// A compressed message (`grpc-encoding: gzip` or `deflate`) also holds what it inflates to of the request
/// budget, as a compressed OTLP/HTTP body does (`UNAVAILABLE` when it does not fit).
async fn entries_within_budget(
    request: axum::extract::Request,
    limits: MessageLimits,
    hold: &mut crate::request_budget::BodyHold,
) -> Result<axum::extract::Request, Status> {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|error| Status::cancelled(error.to_string()))?;
    // One message and its 5-byte prefix: tonic's own limit is the inflated one.
    if bytes.len() > limits.body_limit.saturating_add(5) {
        return Err(message_too_large(limits.body_limit));
    }
    let encoding = parts
        .headers
        .get("grpc-encoding")
        .and_then(|value| value.to_str().ok());
    let path = parts.uri.path();
    let schema = if path.starts_with("/opentelemetry.proto.collector.metrics.") {
        ExportSchema::Metrics
    } else if path.starts_with("/opentelemetry.proto.collector.logs.") {
        ExportSchema::Logs
    } else {
        ExportSchema::Traces
    };
    // What the compressed messages inflate to holds the budget before anything is inflated
    // into memory, counted by inflating into nothing, as the HTTP gate counts an OTLP body
    // (the check below, and tonic after it, inflate it for real): sixteen calls of a 65 KB zlib
    // message inflating to 64 MiB each held a gigabyte the budget did not see (the review).
    let inflated = inflated_len(&bytes, encoding, limits.inflated_limit);
    if inflated > 0 {
        hold.cover(bytes.len().saturating_add(inflated))
            .await
            .map_err(|refusal| Status::unavailable(refusal.to_string()))?;
    }
    let found =
        flightlog_otlp::check_grpc_messages(&bytes, encoding, schema, limits.inflated_limit)
            .map_err(|error| match error {
                // A message that tonic would inflate only in part.
                OtlpError::Malformed { .. } => Status::invalid_argument(error.to_string()),
                _ => Status::resource_exhausted(crate::routes::otlp::otlp_error_message(&error)),
            })?;
    let messages = found.count;
    // tonic reads a unary call's first message and drops the rest unread: a client that sent
    // two was answered OK and lost the second's spans without a word (an audit's finding).
    if messages > 1 {
        return Err(Status::internal(format!(
            "protocol violation: an export is a unary call, one message, and this call carried \
             {messages}; nothing was stored: send each batch as its own call"
        )));
    }
    Ok(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
}

/// What the compressed messages of a gRPC request body (its length-prefixed frames flagged
/// compressed, under `grpc-encoding` gzip or deflate) inflate to, each counted up to `limit`
/// without being kept ([`flightlog_otlp::inflated_len`]); 0 when none is.
fn inflated_len(body: &[u8], encoding: Option<&str>, limit: usize) -> usize {
    let Some(encoding) = encoding else {
        return 0;
    };
    flightlog_otlp::grpc_frames(body)
        .filter(|(flag, _)| *flag != 0)
        .map(|(_, message)| flightlog_otlp::inflated_len(Some(encoding), message, limit))
        .fold(0usize, |total, counted| {
            total.saturating_add(counted.unwrap_or(0))
        })
}

/// How large a call's message may be: as sent (`--body-limit`), and inflated when compressed
/// (`ServerConfig::otlp_max_decompressed`, as for an OTLP/HTTP body).
#[derive(Debug, Clone, Copy)]
struct MessageLimits {
    body_limit: usize,
    inflated_limit: usize,
}

/// The refusal of a message over the limit: `RESOURCE_EXHAUSTED`, which OTLP says to retry only
/// with `RetryInfo` (never sent here: the same batch can never fit), as the HTTP listener's 413
/// is not retried; the Python exporter retries it all the same, for its retry time
/// (an audit; `docs/otlp.md` says so). (`OUT_OF_RANGE`, tonic's code for it, is one OTLP says
/// to retry.)
fn message_too_large(body_limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "the message is larger than this server's limit of {body_limit} bytes (--body-limit): \
         send smaller batches"
    ))
}

/// tonic refuses a message over `max_decoding_message_size` with `OUT_OF_RANGE`, in the
/// headers of a trailers-only answer; nothing else here answers that code, so it becomes
/// [`message_too_large`]. (A compressed message inflating past the limit is tonic's
/// `RESOURCE_EXHAUSTED` already.)
fn too_large_is_resource_exhausted(
    response: axum::response::Response,
    body_limit: usize,
) -> axum::response::Response {
    let out_of_range = response
        .headers()
        .get("grpc-status")
        .is_some_and(|status| status.as_bytes() == b"11");
    if out_of_range {
        refuse(message_too_large(body_limit))
    } else {
        response
    }
}

/// A `grpc-timeout` header's duration: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`,
/// `n`); anything else is no deadline, as tonic's own server reads it.
fn grpc_timeout(text: &str) -> Option<Duration> {
    let unit_at = text.len().checked_sub(1)?;
    let (digits, unit) = text.split_at(unit_at);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3_600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Serve [`grpc_app`] on `listener` until `shutdown` completes.
pub async fn serve_grpc<F>(
    listener: TcpListener,
    state: AppState,
    shutdown: F,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let write_stall_limit = state.config().write_stall_limit;
    crate::serve_router(
        listener,
        grpc_app(&state),
        shutdown,
        crate::Protocol::Http2,
        write_stall_limit,
        state.connection_slots().clone(),
        crate::ListenerAnswers {
            wrong_port: crate::wrong_port::refusal_of_http1(state.config().http_listening_on),
            unparsed: None,
        },
    )
    .await
}

/// The route of every method of the gRPC service `service`: `/<its full name>/{*method}`.
fn grpc_route<S: tonic::server::NamedService>(_service: &S) -> String {
    format!("/{}/{{*method}}", S::NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_read_as_the_protocol_writes_them() {
        assert_eq!(grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout("2H"), Some(Duration::from_secs(7_200)));
        assert_eq!(grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(grpc_timeout("7u"), Some(Duration::from_micros(7)));
        for bad in ["", "S", "1", "123456789S", "1s", "-1S", "1.5S", "1 S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }

    /// Made-up paths add no series; each status code has its canonical name.
    #[test]
    fn calls_are_labelled_by_a_known_method_and_the_status_code() {
        assert_eq!(
            call_method_label("/opentelemetry.proto.collector.logs.v1.LogsService/Export"),
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
        );
        for path in [
            "/",
            "/x.Y/Z",
            "/opentelemetry.proto.collector.trace.v1.TraceService/Other",
        ] {
            assert_eq!(call_method_label(path), "other", "{path}");
        }
        let answer = |status: Option<&str>| {
            let mut response = axum::response::Response::new(axum::body::Body::empty());
            if let Some(status) = status {
                response
                    .headers_mut()
                    .insert("grpc-status", status.parse().expect("a header value"));
            }
            response
        };
        assert_eq!(call_code_label(&answer(None)), "OK");
        assert_eq!(call_code_label(&answer(Some("0"))), "OK");
        assert_eq!(call_code_label(&answer(Some("14"))), "UNAVAILABLE");
        assert_eq!(call_code_label(&answer(Some("16"))), "UNAUTHENTICATED");
        assert_eq!(call_code_label(&answer(Some("99"))), "UNKNOWN");
    }
}
