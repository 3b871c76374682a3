//! The activity endpoints: one per reference `ActivityStore` operation (spans, runs, the change
//! log and its read views). Maintenance calls are in [`super::maintenance`], the batch endpoint
//! in [`super::batch`].
//!
//! Each write is a plain `op_*` function over a store handle and a parsed input, returning the
//! endpoint's response body; the handler and the batch endpoint both call it, so a batch op
//! behaves exactly as the single endpoint does.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use flightlog_core::activity::{
    ActivityChange, ActivityStore, EndSpanInput, RunRollupRow, RunSnapshot, SpanEventRow,
    SpanOutcome, SpanPatch, SpanRow, StartSpanInput, TerminalRootChange, DEFAULT_CHANGES_LIMIT,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::{ApiQuery, JsonBody, OptionalJsonBody, PathId, WriterStore};
use crate::state::AppState;
use crate::validate::{check_id, check_limit, check_optional_time, check_reference, check_time};

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/activity/spans", post(start_span))
        .route(
            "/v1/activity/spans/{spanId}",
            get(get_span).patch(patch_span),
        )
        .route("/v1/activity/spans/{spanId}/end", post(end_span))
        .route("/v1/activity/spans/{spanId}/events", post(append_event))
        .route("/v1/activity/spans/{spanId}/heartbeat", post(heartbeat))
        .route("/v1/activity/runs/{runId}/close", post(close_run))
        .route(
            "/v1/activity/runs/{runId}/rollup",
            post(rollup_run).get(read_rollup),
        )
        .route("/v1/activity/runs/{runId}/snapshot", get(snapshot_run))
        .route("/v1/activity/runs/{runId}/seq", get(run_high_water_seq))
        .route("/v1/activity/changes", get(changes_since))
        .route(
            "/v1/activity/changes/terminal-roots",
            get(terminal_root_changes_since),
        )
        .route("/v1/activity/cursor", get(latest_change_cursor))
        .route("/v1/activity/open-roots", get(open_root_spans))
        .route("/v1/activity/stuck", get(find_stuck))
}

/// Body of `POST /v1/activity/spans/{spanId}/events`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AppendEventBody {
    event_type: String,
    /// Any JSON; absent and `null` both store `null`.
    #[serde(default)]
    payload: Option<Value>,
    #[serde(default)]
    ts: Option<i64>,
}

/// Body of `POST /v1/activity/spans/{spanId}/heartbeat` (the body itself may be empty).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HeartbeatBody {
    #[serde(default)]
    at: Option<i64>,
}

/// Body of `POST /v1/activity/runs/{runId}/close`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CloseRunBody {
    outcome: SpanOutcome,
    reason: String,
}

/// Query of the two change-log pages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChangesQuery {
    /// The cursor to read after (0: from the start).
    #[serde(default)]
    after: i64,
    /// Page size, 0 to 10,000 (default 500).
    #[serde(default)]
    limit: Option<i64>,
}

impl ChangesQuery {
    fn limit(&self) -> Result<i64, ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_CHANGES_LIMIT);
        check_limit("limit", limit)?;
        Ok(limit)
    }
}

/// Query of `GET /v1/activity/stuck`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StuckQuery {
    threshold_ms: i64,
    #[serde(default)]
    now: Option<i64>,
}

// ---- the writes, shared with the batch endpoint ----

/// `startSpan`: the new span.
pub(crate) async fn op_start_span(
    store: &dyn ActivityStore,
    input: StartSpanInput,
) -> Result<SpanRow, ApiError> {
    check_id("spanId", &input.span_id)?;
    check_id("runId", &input.run_id)?;
    check_reference("parentSpanId", input.parent_span_id.as_deref())?;
    check_optional_time("startedAt", input.started_at)?;
    Ok(store.start_span(input).await?)
}

/// `endSpan`: `{"ended": bool}`.
pub(crate) async fn op_end_span(
    store: &dyn ActivityStore,
    span_id: &str,
    input: EndSpanInput,
) -> Result<Value, ApiError> {
    check_optional_time("endedAt", input.ended_at)?;
    let ended = store.end_span(span_id, input).await?;
    Ok(json!({ "ended": ended }))
}

/// `patchSpan`: `{"patched": bool}`.
pub(crate) async fn op_patch_span(
    store: &dyn ActivityStore,
    span_id: &str,
    patch: SpanPatch,
) -> Result<Value, ApiError> {
    check_optional_time("waitUntil", patch.wait_until)?;
    let patched = store.patch_span(span_id, patch).await?;
    Ok(json!({ "patched": patched }))
}

/// `appendEvent`: the stored event; 404 for an unknown span.
pub(crate) async fn op_append_event(
    store: &dyn ActivityStore,
    span_id: &str,
    body: AppendEventBody,
) -> Result<SpanEventRow, ApiError> {
    check_optional_time("ts", body.ts)?;
    store
        .append_event(span_id, &body.event_type, body.payload.as_ref(), body.ts)
        .await?
        .ok_or_else(|| unknown_span(span_id))
}

/// `heartbeat`: nothing.
pub(crate) async fn op_heartbeat(
    store: &dyn ActivityStore,
    span_id: &str,
    body: HeartbeatBody,
) -> Result<(), ApiError> {
    check_optional_time("at", body.at)?;
    Ok(store.heartbeat(span_id, body.at).await?)
}

fn unknown_span(span_id: &str) -> ApiError {
    ApiError::not_found(format!("no span with id {span_id:?}"))
}

fn unknown_run(run_id: &str) -> ApiError {
    ApiError::not_found(format!("no run with id {run_id:?}"))
}

// ---- handlers ----

async fn start_span(
    WriterStore(store): WriterStore,
    JsonBody(input): JsonBody<StartSpanInput>,
) -> Result<(StatusCode, Json<SpanRow>), ApiError> {
    let span = op_start_span(store.as_ref(), input).await?;
    Ok((StatusCode::CREATED, Json(span)))
}

async fn end_span(
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    JsonBody(input): JsonBody<EndSpanInput>,
) -> Result<Json<Value>, ApiError> {
    op_end_span(store.as_ref(), &span_id, input).await.map(Json)
}

async fn patch_span(
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    JsonBody(patch): JsonBody<SpanPatch>,
) -> Result<Json<Value>, ApiError> {
    op_patch_span(store.as_ref(), &span_id, patch)
        .await
        .map(Json)
}

async fn append_event(
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    JsonBody(body): JsonBody<AppendEventBody>,
) -> Result<(StatusCode, Json<SpanEventRow>), ApiError> {
    let event = op_append_event(store.as_ref(), &span_id, body).await?;
    Ok((StatusCode::CREATED, Json(event)))
}

async fn heartbeat(
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    OptionalJsonBody(body): OptionalJsonBody<HeartbeatBody>,
) -> Result<StatusCode, ApiError> {
    op_heartbeat(store.as_ref(), &span_id, body.unwrap_or_default()).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn get_span(
    State(state): State<AppState>,
    PathId(span_id): PathId,
) -> Result<Json<SpanRow>, ApiError> {
    state
        .activity()
        .get_span(&span_id)
        .await?
        .map(Json)
        .ok_or_else(|| unknown_span(&span_id))
}

async fn close_run(
    WriterStore(store): WriterStore,
    PathId(run_id): PathId,
    JsonBody(body): JsonBody<CloseRunBody>,
) -> Result<Json<Value>, ApiError> {
    let closed = store
        .cascade_close(&run_id, body.outcome, &body.reason)
        .await?;
    Ok(Json(json!({ "closed": closed })))
}

async fn rollup_run(
    WriterStore(store): WriterStore,
    PathId(run_id): PathId,
) -> Result<StatusCode, ApiError> {
    store.rollup_run(&run_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn read_rollup(
    State(state): State<AppState>,
    PathId(run_id): PathId,
) -> Result<Json<RunRollupRow>, ApiError> {
    state
        .activity()
        .read_rollup(&run_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("run {run_id:?} has no rollup")))
}

async fn snapshot_run(
    State(state): State<AppState>,
    PathId(run_id): PathId,
) -> Result<Json<RunSnapshot>, ApiError> {
    state
        .activity()
        .snapshot_run(&run_id)
        .await?
        .map(Json)
        .ok_or_else(|| unknown_run(&run_id))
}

async fn run_high_water_seq(
    State(state): State<AppState>,
    PathId(run_id): PathId,
) -> Result<Json<Value>, ApiError> {
    let seq = state.activity().run_high_water_seq(&run_id).await?;
    Ok(Json(json!({ "highWaterSeq": seq })))
}

async fn changes_since(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ChangesQuery>,
) -> Result<Json<Vec<ActivityChange>>, ApiError> {
    let limit = query.limit()?;
    let changes = state.activity().changes_since(query.after, limit).await?;
    Ok(Json(changes))
}

async fn terminal_root_changes_since(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ChangesQuery>,
) -> Result<Json<Vec<TerminalRootChange>>, ApiError> {
    let limit = query.limit()?;
    let changes = state
        .activity()
        .terminal_root_changes_since(query.after, limit)
        .await?;
    Ok(Json(changes))
}

async fn latest_change_cursor(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let cursor = state.activity().latest_change_cursor().await?;
    Ok(Json(json!({ "changeCursor": cursor })))
}

async fn open_root_spans(State(state): State<AppState>) -> Result<Json<Vec<SpanRow>>, ApiError> {
    Ok(Json(state.activity().open_root_spans().await?))
}

async fn find_stuck(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<StuckQuery>,
) -> Result<Json<Vec<SpanRow>>, ApiError> {
    check_time("thresholdMs", query.threshold_ms)?;
    check_optional_time("now", query.now)?;
    let stuck = state
        .activity()
        .find_stuck(query.threshold_ms, query.now)
        .await?;
    Ok(Json(stuck))
}
