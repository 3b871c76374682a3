//! `PUT /v1/testing/clock`: moves the testing clock of a `serve --manual-clock` server, so an
//! outside test suite can replay time-dependent scenarios over HTTP. The route exists only when
//! the state carries a manual clock; otherwise the path is an ordinary 404. With auth on it needs
//! the `admin` scope (it moves every store's time).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::put;
use axum::Router;
use serde::Deserialize;

use crate::error::ApiError;
use crate::extract::JsonBody;
use crate::state::AppState;
use crate::validate::check_time;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/v1/testing/clock", put(set_clock))
}

/// Body of `PUT /v1/testing/clock`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClockBody {
    /// The new time, epoch milliseconds.
    now: i64,
}

async fn set_clock(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<ClockBody>,
) -> Result<StatusCode, ApiError> {
    check_time("now", body.now)?;
    let clock = state
        .manual_clock()
        .ok_or_else(|| ApiError::not_found("this server has no testing clock"))?;
    clock.set(body.now);
    Ok(StatusCode::NO_CONTENT)
}
