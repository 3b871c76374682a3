//! `GET /healthz`: answers 200 while the server runs; the one route that needs no token.

use axum::Json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::openapi::tags;
use crate::state::AppState;
use crate::wire::Health;

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz))
}

/// Liveness: 200 while the server runs. Needs no token.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = tags::OPERATIONS,
    operation_id = "healthz",
    responses((status = 200, description = "The server runs.", body = Health)),
)]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}
