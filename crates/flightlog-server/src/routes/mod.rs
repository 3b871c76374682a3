//! The router, assembled from one module per area of the contract.
//!
//! Each module exposes `router() -> OpenApiRouter<AppState>` whose routes are registered *from*
//! their `#[utoipa::path]` annotations (utoipa-axum's `routes!`): the annotation's method and
//! path are what the router serves, so a route cannot exist without its OpenAPI description.
//! [`router`] merges them, hands the collected document to [`crate::openapi::finish`], and adds
//! what applies to all: the 404 and 405 answers in the contract's error body. A new area (the
//! web UI, say) is one more module and one more `merge` line; a new endpoint is one more
//! annotated handler and one more `.routes(routes!(handler))` line in its module.

pub(crate) mod activity;
pub(crate) mod batch;
pub(crate) mod health;
pub(crate) mod journal;
pub(crate) mod maintenance;
pub(crate) mod otlp;
pub(crate) mod runs;
pub(crate) mod streams;
pub(crate) mod testing;

use axum::http::{Method, Uri};
use axum::Router;
use utoipa::openapi::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::error::ApiError;
use crate::state::AppState;
use crate::{metrics, openapi};

/// Every route `state` calls for, with the contract's 404 and 405 fallbacks, and the OpenAPI
/// document describing exactly those routes.
pub(crate) fn router(state: &AppState) -> (Router<AppState>, OpenApi) {
    let mut router = OpenApiRouter::with_openapi(openapi::base())
        .merge(health::router())
        .merge(metrics::router())
        .merge(openapi::router())
        .merge(activity::router())
        .merge(runs::router())
        .merge(otlp::router())
        .merge(batch::router())
        .merge(maintenance::router())
        .merge(journal::router())
        .merge(streams::router());
    if state.manual_clock().is_some() {
        router = router.merge(testing::router());
    }
    let (router, mut document) = router.split_for_parts();
    openapi::finish(&mut document);
    batch::document_op_limit(&mut document, state.config().max_batch_ops);
    // `method_not_allowed_fallback` applies to the routes registered so far, so it comes last;
    // axum still adds the `Allow` header to its answer.
    let router = router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    (router, document)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    let mut message = format!(
        "no route for {method} {}",
        flightlog_core::json_text::echoed(uri.path())
    );
    if uri.path() == testing::CLOCK_PATH {
        message.push_str(": the testing clock exists only on a server started with --manual-clock");
    }
    ApiError::not_found(message)
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!(
        "{method} is not allowed on {}",
        flightlog_core::json_text::echoed(uri.path())
    ))
}
