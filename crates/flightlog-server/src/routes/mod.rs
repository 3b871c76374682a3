//! The router, assembled from one module per area of the contract.
//!
//! Each module exposes `router() -> Router<AppState>` with its own paths; [`router`] merges them
//! and adds what applies to all: the 404 and 405 answers in the contract's error body. A new
//! area (streams, OTLP, metrics, the web UI) is one more module and one more `merge` line.

pub(crate) mod activity;
pub(crate) mod batch;
pub(crate) mod health;
pub(crate) mod journal;
pub(crate) mod maintenance;
pub(crate) mod runs;
pub(crate) mod streams;
pub(crate) mod testing;

use axum::http::{Method, Uri};
use axum::Router;

use crate::error::ApiError;
use crate::state::AppState;

/// Every route `state` calls for, with the contract's 404 and 405 fallbacks.
pub(crate) fn router(state: &AppState) -> Router<AppState> {
    let mut router = Router::new()
        .merge(health::router())
        .merge(activity::router())
        .merge(runs::router())
        .merge(batch::router())
        .merge(maintenance::router())
        .merge(journal::router())
        .merge(streams::router());
    if state.manual_clock().is_some() {
        router = router.merge(testing::router());
    }
    // `method_not_allowed_fallback` applies to the routes registered so far, so it comes last;
    // axum still adds the `Allow` header to its answer.
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}
