//! `PUT /v1/testing/clock`: moves the testing clock of a `serve --manual-clock` server, so an
//! outside test suite can replay time-dependent scenarios over HTTP. The route exists only when
//! the state carries a manual clock; otherwise the path is an ordinary 404. With auth on it needs
//! the `admin` scope (it moves every store's time).

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, NoQuery};
use crate::openapi::tags;
use crate::state::AppState;
use crate::validate::check_time;

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(set_clock))
}

/// The route's path (the `#[utoipa::path]` below needs it written out), for the 404 of a server
/// without the testing clock to say how to get one.
pub(crate) const CLOCK_PATH: &str = "/v1/testing/clock";

/// Body of `PUT /v1/testing/clock`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ClockBody {
    /// The new time, epoch milliseconds (below 2^53 either way, as every time of the API).
    #[serde(deserialize_with = "flightlog_core::json_number::integral_i64")]
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    now: i64,
}

/// Set the testing clock (only on a server started with `--manual-clock`).
#[utoipa::path(
    put,
    path = "/v1/testing/clock",
    tag = tags::TESTING,
    operation_id = "setTestingClock",
    request_body = ClockBody,
    responses(
        (status = 204, description = "Every store now reads this time."),
        (status = 400, description = "An invalid time.", body = ErrorBody),
    ),
)]
async fn set_clock(
    _: NoQuery,
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
