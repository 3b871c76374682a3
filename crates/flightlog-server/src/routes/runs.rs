//! `GET /v1/activity/runs`: the newest-first page of runs (open roots and finished runs with
//! their rollups), with the contract's `state`, `outcome`, `origin`, `limit` and `before`
//! filters. The cursor in `next` is opaque to clients: pass it back as `before`.

use axum::extract::State;
use axum::response::Response;
use flightlog_core::activity::{
    RunCursor, RunListQuery, RunPage, RunState, SpanOrigin, SpanOutcome,
};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiQuery;
use crate::openapi::{tags, LARGE_RESPONSE_BUSY};
use crate::state::AppState;
use crate::validate::check_limit;

/// Runs listed per page when the client does not say.
pub(crate) const DEFAULT_RUNS_LIMIT: i64 = 50;

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_runs))
}

/// Query of `GET /v1/activity/runs`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct RunsQuery {
    /// `open` or `ended`; both when absent.
    #[serde(default)]
    #[param(value_type = Option<RunState>)]
    state: Option<String>,
    /// Only ended runs whose outcome is this one (their first root's). A run is open, with no
    /// outcome yet, while any of its roots is: an open run is never listed under an outcome.
    #[serde(default)]
    outcome: Option<SpanOutcome>,
    /// Only runs of this origin.
    #[serde(default)]
    origin: Option<SpanOrigin>,
    /// Page size, 0 to 10,000 (default 50).
    #[serde(default)]
    #[param(minimum = 0, maximum = 10_000)]
    limit: Option<i64>,
    /// The `next` of the previous page, URL-encoded (it holds the run id as written): a start
    /// time in ms, `:`, a run id (empty for a run the library wrote with an empty id: the
    /// store pages past any run it holds).
    #[serde(default)]
    #[param(pattern = r"^[+-]?[0-9]{1,19}:.*$")]
    before: Option<String>,
}

impl RunsQuery {
    fn into_store_query(self) -> Result<RunListQuery, ApiError> {
        let state = match self.state.as_deref() {
            None => None,
            Some(text) => Some(RunState::parse(text).ok_or_else(|| {
                ApiError::invalid(format!(
                    "state: expected `open` or `ended`, got {:?}",
                    flightlog_core::json_text::echoed(text)
                ))
            })?),
        };
        let limit = self.limit.unwrap_or(DEFAULT_RUNS_LIMIT);
        check_limit("limit", limit)?;
        let before = match self.before.as_deref() {
            None => None,
            Some(text) => Some(RunCursor::decode(text).ok_or_else(|| {
                ApiError::invalid(format!(
                    "before: {:?} is not a cursor; pass back the `next` of a previous page",
                    flightlog_core::json_text::echoed(text)
                ))
            })?),
        };
        Ok(RunListQuery {
            state,
            outcome: self.outcome,
            origin: self.origin,
            limit,
            before,
        })
    }
}

/// Runs newest first: open roots, ended runs with their rollups, pruned runs, and runs whose root
/// has not arrived (`awaitingRoot`: an OpenTelemetry trace's root is exported last). A run's
/// place can move when a root that started earlier arrives, and, for a run rolled up before
/// that root came, again when `POST /v1/activity/maintenance/prune` deletes its detail (a
/// rollup keeps the name and start of its first making, the reference's rule, and a pruned run
/// is listed from its rollup; the scheduled retention makes the rollup again from the root the
/// run is listed by): a client paging while traces come in or runs are pruned should drop a
/// `runId` it has already seen, and may miss a run that moved behind its cursor until it lists
/// from the top again.
#[utoipa::path(
    get,
    path = "/v1/activity/runs",
    tag = tags::ACTIVITY,
    operation_id = "listRuns",
    params(RunsQuery),
    responses(
        (status = 200, description = "One page of runs and the cursor of the next (`null` after the last page).", body = RunPage),
        (status = 400, description = "A bad query (unknown state, outcome or origin; a bad limit or cursor).", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn list_runs(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<RunsQuery>,
) -> Result<Response, ApiError> {
    let query = query.into_store_query()?;
    let page = state.activity().list_runs(query).await?;
    state.response_budget().json(page).await
}
