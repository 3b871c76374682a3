//! `GET /healthz`: answers 200 while the server runs and its store can keep what it is given;
//! the one route that needs no token.
//!
//! An unhealthy store's reason names the database file by its absolute path ("the database
//! file /srv/…/agents.db was deleted…"), which a server with tokens must not tell whoever can
//! reach the port (an audit's finding). Without an accepted token the answer says what is
//! wrong in general words; a request with any accepted token, and the server's stderr, get
//! the full reason.

use crate::wire::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use flightlog_core::activity::StoreError;
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
/// Needs no token; with tokens configured, the reason names files only for a request with one.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = tags::OPERATIONS,
    operation_id = "healthz",
    responses(
        (status = 200, description = "The server runs.", body = Health),
        (status = 503, description = "The store cannot keep writes (the message says why, e.g. \
            its database file was deleted or replaced while the server ran: restart it; with \
            tokens configured, file paths only to a request with an accepted token).",
            body = ErrorBody),
    ),
)]
async fn healthz(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Health>, ApiError> {
    let Err(unhealthy) = state.activity().health() else {
        return Ok(Json(Health { status: "ok" }));
    };
    let reason = reason_without_paths(&unhealthy);
    // Converted either way: the conversion is what says it on stderr (once, or rate-limited).
    let detailed = ApiError::from(unhealthy);
    if crate::auth::shows_accepted_token(&state.config().auth, &headers) {
        return Err(detailed);
    }
    Err(match detailed {
        ApiError::Internal(full) => {
            // The 500 below says the general reason on stderr as it is sent; the full one is
            // said here, so the log keeps it.
            crate::error::report_internal_error(&full);
            ApiError::Internal(reason)
        }
        ApiError::Unavailable(_) => ApiError::Unavailable(reason),
        other => other,
    })
}

/// Why the store is unhealthy, in words that name no file: for an answer to a request without
/// a token, on a server that has tokens.
fn reason_without_paths(unhealthy: &StoreError) -> String {
    /// Where the rest is said.
    const MORE: &str = "the server's log, or this answer to a request with a token, says more";
    let what = match unhealthy {
        StoreError::FileLost(_) => {
            "the database file was deleted or replaced while the server ran: writes are refused \
             until the server is stopped and started again"
        }
        StoreError::DiskFailed(_) => {
            "the disk under the database failed (an I/O error, or a file system made \
             read-only): check the disk"
        }
        StoreError::StorageFull(_) => "the disk holding the database is full: free space on it",
        StoreError::Overloaded | StoreError::Busy(_) => "the store is busy: retry later",
        StoreError::Closed => "the store is closed: the server is stopping",
        _ => "the store cannot keep writes",
    };
    format!("{what} ({MORE})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_without_a_token_names_no_file() {
        let lost = StoreError::FileLost(
            "the database file /srv/secret/agents.db was deleted or replaced".into(),
        );
        let reason = reason_without_paths(&lost);
        assert!(!reason.contains('/'), "{reason}");
        assert!(reason.contains("deleted or replaced"), "{reason}");
        let other = StoreError::Backend("cannot read /srv/secret/agents.db".into());
        assert!(!reason_without_paths(&other).contains('/'));
    }
}
