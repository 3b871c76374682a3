//! `GET /healthz`: answers 200 while the server runs and its store can keep what it is given;
//! the one route that needs no token.

use crate::wire::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::openapi::tags;
use crate::state::AppState;
use crate::wire::Health;

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz))
}

/// Liveness: 200 while the server runs and its store can keep writes; 503 `unavailable` when it
/// cannot, with the reason (the database file was deleted or replaced under it: restart it).
/// Needs no token.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = tags::OPERATIONS,
    operation_id = "healthz",
    responses(
        (status = 200, description = "The server runs.", body = Health),
        (status = 503, description = "The store cannot keep writes (the message says why, e.g. \
            its database file was deleted or replaced while the server ran: restart it).", body = ErrorBody),
    ),
)]
async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.activity().health()?;
    Ok(Json(Health { status: "ok" }))
}
