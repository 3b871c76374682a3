//! flightlog's HTTP server: the wire contract (`shared/docs/http-api.md`) in front of the stores.
//!
//! [`app`] builds the router from an [`AppState`] (the activity store, the engagement journal, an
//! optional testing clock, a [`ServerConfig`]); [`serve`] runs it on a listener until a shutdown
//! future completes. Keeping them apart lets a test call the router in process or bind it to
//! `127.0.0.1:0`, and lets the binary choose the listener and the shutdown signal.
//!
//! Layout:
//! - [`error`]: [`ApiError`], the one mapping of every failure to the contract's status and body;
//! - [`extract`]: request extractors that reject with an [`ApiError`] (JSON bodies, queries, path
//!   ids, the `Flightlog-Writer` header);
//! - [`validate`]: the range checks on ids, times and page sizes;
//! - [`state`]: [`AppState`] and [`ServerConfig`];
//! - [`auth`]: bearer tokens and scopes, checked before any handler runs;
//! - [`overload`]: the write limit that answers `503 unavailable` instead of queueing forever;
//! - [`settings`]: `flightlog serve`'s flags, environment and config file, resolved and checked;
//! - [`wire`]: the small answer bodies the contract spells out inline (`{"ended": bool}`, …);
//! - [`openapi`]: `GET /openapi.json`, the OpenAPI 3.1 document generated from the handlers'
//!   `#[utoipa::path]` annotations and the wire types' `ToSchema` (the core's `openapi` feature),
//!   plus what the middleware adds to every route (security scopes, 401/403/413/415/503);
//! - [`metrics`]: `GET /metrics` (Prometheus text format) and the middleware counting requests;
//! - `routes`: one module per area (activity, batch, maintenance, journal, streams, testing,
//!   health); each route is registered from its `#[utoipa::path]` annotation, so every served
//!   route is in the OpenAPI document.
//!
//! This is the only crate with wire types; the stores know nothing about HTTP.

pub mod auth;
pub mod error;
pub mod extract;
mod gate;
pub mod grpc;
pub mod metrics;
pub mod openapi;
pub mod overload;
mod routes;
pub mod settings;
mod skip_keys;
pub mod state;
pub mod validate;
pub mod wire;

use std::future::Future;

use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::Router;
use tokio::net::TcpListener;
use tower_http::limit::RequestBodyLimitLayer;

pub use auth::{AuthConfig, Scope, Scopes};
pub use error::ApiError;
pub use state::{AppState, ServerConfig};

/// Why [`serve`] stopped other than by its shutdown signal.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener or a connection failed at the socket level.
    #[error("the HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The whole HTTP API over `state`.
pub fn app(state: AppState) -> Router {
    let limit = state.config().body_limit;
    let (routes, document) = routes::router(&state);
    state.set_openapi_document(document);
    routes
        // tower-http enforces the limit (refusing a declared Content-Length up front, cutting a
        // chunked body off at the limit); axum's own 2 MB default would otherwise apply first.
        .layer(DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(limit))
        // Outermost: counting, auth and the write limit, in one layer (see `gate`).
        // `Router::layer` wraps every route (and the fallbacks), after routing, so the gate sees
        // the matched route template.
        .layer(from_fn_with_state(state.clone(), gate::gate))
        .with_state(state)
}

/// Serve [`app`]`(state)` on `listener` until `shutdown` completes, then stop accepting
/// connections and return once the requests in flight have been answered.
pub async fn serve<F>(listener: TcpListener, state: AppState, shutdown: F) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    // Live streams never end on their own; they end when the server starts shutting down, so
    // the graceful shutdown (which waits for open connections) can complete.
    let closing = state.closing_signal();
    let shutdown = async move {
        shutdown.await;
        closing.send_replace(true);
    };
    axum::serve(without_nagle(listener), app(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

/// `listener` with `TCP_NODELAY` set on every accepted connection. axum's plain `serve` leaves
/// Nagle's algorithm on, so a small write that follows another small write (each SSE event of a
/// live stream, a response right after its headers) waited for the peer's delayed ACK, up to
/// 40 ms: the stream-latency benchmark's p99 was 24 ms from that alone. A connection whose
/// option cannot be set is served anyway (a latency defect, not a reason to refuse it).
pub(crate) fn without_nagle(
    listener: TcpListener,
) -> axum::serve::TapIo<TcpListener, impl FnMut(&mut tokio::net::TcpStream) + Send + 'static> {
    use axum::serve::ListenerExt as _;
    listener.tap_io(|connection: &mut tokio::net::TcpStream| {
        let _ = connection.set_nodelay(true);
    })
}
