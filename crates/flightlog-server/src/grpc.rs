//! The OTLP/gRPC listener: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
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

use axum::Router;
use flightlog_otlp::{trace_service, Authorize, IngestTally};
use tokio::net::TcpListener;
use tonic::metadata::MetadataMap;
use tonic::Status;

use crate::auth::{presented_token, AuthConfig, Scope};
use crate::routes::otlp::OTLP_WRITER;
use crate::state::AppState;
use crate::ServeError;

/// Admit a call when auth is off, or when its token holds the `ingest` scope.
fn authorizer(auth: AuthConfig) -> Arc<Authorize> {
    Arc::new(move |metadata: &MetadataMap| {
        if !auth.is_enabled() {
            return Ok(());
        }
        let value = metadata
            .get("authorization")
            .ok_or_else(|| {
                Status::unauthenticated(
                    "this server needs `authorization: Bearer <token>` metadata on every call",
                )
            })?
            .to_str()
            .map_err(|_| Status::unauthenticated("the authorization metadata must be ASCII"))?;
        let token = presented_token(value).map_err(Status::unauthenticated)?;
        let scopes = auth
            .scopes_of(&token)
            .ok_or_else(|| Status::unauthenticated("the token is not valid here"))?;
        if scopes.contains(Scope::Ingest) {
            Ok(())
        } else {
            Err(Status::permission_denied(
                "this token lacks the `ingest` scope that trace export needs",
            ))
        }
    })
}

/// The gRPC trace service over `state`'s activity store, as a router.
pub fn grpc_app(state: &AppState) -> Router {
    let counted = state.clone();
    let authorize = authorizer(state.config().auth.clone());
    let service = trace_service(
        state.activity_as(OTLP_WRITER),
        Arc::clone(&authorize),
        state.otlp_mapping().clone(),
        Arc::new(move |tally: &IngestTally| counted.metrics().observe_ingest(tally)),
    )
    // An OTLP batch is bounded by the HTTP body limit on the other listener; the same here
    // (tonic's default would be 4 MiB).
    .max_decoding_message_size(state.config().body_limit);
    Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn_with_state(
            GrpcGate {
                state: state.clone(),
                authorize,
            },
            write_slot,
        ))
}

/// What [`write_slot`] needs: the server's state (its write limit) and the token check.
#[derive(Clone)]
struct GrpcGate {
    state: AppState,
    authorize: Arc<Authorize>,
}

/// Every call here is a write: it takes a slot of the server's write limit, shared with the
/// HTTP listener, as an OTLP/HTTP export does, and is refused `UNAVAILABLE` (the exporter backs
/// off and retries) when none is free within the write wait. Without it a flood of gRPC exports
/// bypassed the limit, each holding its decoded batch in memory while waiting for the store.
/// With the slot held the request is read whole under the HTTP gate's rules (10 s allowed
/// between bytes, 60 s in all), so a stalled call gives its slot back (`DEADLINE_EXCEEDED`)
/// instead of holding it as long as the peer answers pings.
///
/// The token is checked first, from the call's headers (its metadata), as the HTTP gate checks
/// it before anything else: a peer without a valid token must not hold a write slot (shared
/// with the HTTP listener) for as long as its body takes to arrive.
async fn write_slot(
    axum::extract::State(gate): axum::extract::State<GrpcGate>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let refuse = |status: Status| status.into_http::<axum::body::Body>();
    let state = gate.state;
    let metadata = MetadataMap::from_headers(request.headers().clone());
    if let Err(status) = (gate.authorize)(&metadata) {
        return refuse(status);
    }
    let slot = match crate::overload::take_write_slot(&state, &axum::http::Method::POST, true).await
    {
        Ok(slot) => slot,
        Err(refusal) => return refuse(Status::unavailable(refusal.to_string())),
    };
    // The message limit is tonic's to enforce (`OUT_OF_RANGE`); this bound only keeps a
    // runaway body from being buffered: the message, its 5-byte frame prefix and some slack.
    let limit = state.config().body_limit.saturating_add(64 * 1024);
    let request = match crate::gate::read_whole(request, limit).await {
        Ok(request) => request,
        Err(crate::gate::BodyRead::TooLarge(_)) => {
            return refuse(Status::out_of_range(format!(
                "the request is larger than this server's message limit of {} bytes",
                state.config().body_limit
            )))
        }
        Err(crate::gate::BodyRead::Failed(error)) => {
            return refuse(Status::cancelled(error.to_string()))
        }
        Err(crate::gate::BodyRead::Stalled(error)) => {
            return refuse(Status::deadline_exceeded(error.to_string()))
        }
    };
    let response = next.run(request).await;
    drop(slot);
    response
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
    )
    .await
}
