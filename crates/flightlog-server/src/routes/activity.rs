//! The activity endpoints: one per reference `ActivityStore` operation (spans, runs, the change
//! log and its read views). Maintenance calls are in [`super::maintenance`], the batch endpoint
//! in [`super::batch`].
//!
//! Each write is a plain `op_*` function over a store handle and a parsed input, returning the
//! endpoint's response body; the handler and the batch endpoint both call it, so a batch op
//! behaves exactly as the single endpoint does.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use flightlog_core::activity::{
    ActivityChange, ActivityStore, EndSpanInput, OpenRootsPart, PayloadText, RunRollupRow,
    RunSnapshot, SpanEventRow, SpanOutcome, SpanPatch, SpanRow, StartSpanInput, TerminalRootChange,
    DEFAULT_CHANGES_LIMIT,
};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody, PATH_SEGMENT};
use crate::extract::{
    from_utf8_json, json_body_bytes, parse_json, ApiQuery, JsonBody, NoBody, NoMembers, NoQuery,
    OptionalJsonBody, PathId, WriterStore,
};
use crate::openapi::{tags, LARGE_RESPONSE_BUSY, RUN_ID, SPAN_ID};
use crate::response_budget::{self, ChunkedJson};
use crate::state::AppState;
use crate::validate::{
    check_id, check_limit, check_optional_time, check_reference, check_time, check_usage,
};
use crate::wire::{ChangeCursor, Closed, Ended, HighWaterSeq, Json, Patched};

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(start_span))
        .routes(routes!(get_span, patch_span))
        .routes(routes!(end_span))
        .routes(routes!(append_event))
        .routes(routes!(heartbeat))
        .routes(routes!(close_run))
        .routes(routes!(rollup_run, read_rollup))
        .routes(routes!(snapshot_run))
        .routes(routes!(run_high_water_seq))
        .routes(routes!(changes_since))
        .routes(routes!(terminal_root_changes_since))
        .routes(routes!(latest_change_cursor))
        .routes(routes!(open_root_spans))
        .routes(routes!(find_stuck))
}

/// Body of `POST /v1/activity/spans/{spanId}/events`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AppendEventBody {
    /// What happened; free text.
    pub(crate) event_type: String,
    /// Any JSON, at most 64 levels deep; absent and `null` both store `null`. Stored payloads
    /// are capped at 16,384 bytes (a longer one is stored as a truncated string and the event
    /// marked `truncated`).
    #[serde(
        default,
        deserialize_with = "flightlog_core::json_as_written::optional_value"
    )]
    #[schema(value_type = Value)]
    pub(crate) payload: Option<Value>,
    /// When it happened (epoch ms); defaults to the server's clock.
    #[serde(
        default,
        deserialize_with = "flightlog_core::json_number::optional_integral_i64"
    )]
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    pub(crate) ts: Option<i64>,
}

/// Body of `POST /v1/activity/spans/{spanId}/heartbeat` (the body itself may be empty).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct HeartbeatBody {
    /// When the span was last known alive (epoch ms); defaults to the server's clock.
    #[serde(
        default,
        deserialize_with = "flightlog_core::json_number::optional_integral_i64"
    )]
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    pub(crate) at: Option<i64>,
}

/// Body of `POST /v1/activity/runs/{runId}/close`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CloseRunBody {
    /// The outcome every open span of the run gets.
    outcome: SpanOutcome,
    /// The reason every open span of the run gets.
    reason: String,
}

/// Query of the two change-log pages.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ChangesQuery {
    /// The cursor to read after (0, or any negative number: from the start).
    #[serde(default)]
    after: i64,
    /// Page size, 0 to 10,000 (default 500).
    #[serde(default)]
    #[param(minimum = 0, maximum = 10_000)]
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
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct StuckQuery {
    /// How long (ms) before `now` an open root must have started to count as stuck.
    #[param(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    threshold_ms: i64,
    /// The time to judge at (epoch ms); defaults to the server's clock.
    #[serde(default)]
    #[param(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    now: Option<i64>,
}

// ---- the writes, shared with the batch endpoint ----

/// The checks of `startSpan` beyond its body's types.
pub(crate) fn check_start_span(input: &StartSpanInput) -> Result<(), ApiError> {
    check_id("spanId", &input.span_id)?;
    check_id("runId", &input.run_id)?;
    check_reference("parentSpanId", input.parent_span_id.as_deref())?;
    check_optional_time("startedAt", input.started_at)
}

/// The checks of `endSpan` beyond its body's types.
pub(crate) fn check_end_span(input: &EndSpanInput) -> Result<(), ApiError> {
    check_optional_time("endedAt", input.ended_at)?;
    check_usage("usage", input.usage.as_ref())
}

/// The checks of `patchSpan` beyond its body's types.
pub(crate) fn check_patch_span(patch: &SpanPatch) -> Result<(), ApiError> {
    check_optional_time("waitUntil", patch.wait_until)?;
    check_usage("usage", patch.usage.as_ref())
}

/// The checks of `appendEvent` beyond its body's types.
pub(crate) fn check_append_event(body: &AppendEventBody) -> Result<(), ApiError> {
    check_optional_time("ts", body.ts)
}

/// The checks of `heartbeat` beyond its body's types.
pub(crate) fn check_heartbeat(body: &HeartbeatBody) -> Result<(), ApiError> {
    check_optional_time("at", body.at)
}

/// `startSpan`: the new span.
pub(crate) async fn op_start_span(
    store: &dyn ActivityStore,
    input: StartSpanInput,
) -> Result<SpanRow, ApiError> {
    check_start_span(&input)?;
    Ok(store.start_span(input).await?)
}

/// `endSpan`: `{"ended": bool}`.
pub(crate) async fn op_end_span(
    store: &dyn ActivityStore,
    span_id: &str,
    input: EndSpanInput,
) -> Result<Ended, ApiError> {
    check_end_span(&input)?;
    let ended = store.end_span(span_id, input).await?;
    Ok(Ended { ended })
}

/// `patchSpan`: `{"patched": bool}`.
pub(crate) async fn op_patch_span(
    store: &dyn ActivityStore,
    span_id: &str,
    patch: SpanPatch,
) -> Result<Patched, ApiError> {
    check_patch_span(&patch)?;
    let patched = store.patch_span(span_id, patch).await?;
    Ok(Patched { patched })
}

/// `appendEvent`: the stored event; 404 for an unknown span.
pub(crate) async fn op_append_event(
    store: &dyn ActivityStore,
    span_id: &str,
    body: AppendEventBody,
) -> Result<SpanEventRow, ApiError> {
    check_append_event(&body)?;
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
    check_heartbeat(&body)?;
    Ok(store.heartbeat(span_id, body.at).await?)
}

pub(crate) fn unknown_span(span_id: &str) -> ApiError {
    ApiError::not_found(format!("no span with id {span_id:?}"))
}

/// The 404 of a run with no spans to show: a run whose detail was pruned is still listed (its
/// rollup is kept), so saying it does not exist sent its users looking for a typo.
pub(crate) async fn run_without_spans(store: &dyn ActivityStore, run_id: &str) -> ApiError {
    match store.read_rollup(run_id).await {
        Ok(Some(rollup)) if rollup.detail_pruned => ApiError::not_found(format!(
            "the detail (spans, events) of run {run_id:?} was pruned by the retention; its \
             rollup is kept: GET /v1/activity/runs/{}/rollup",
            percent_encoding::utf8_percent_encode(run_id, PATH_SEGMENT)
        )),
        _ => ApiError::not_found(format!("no run with id {run_id:?}")),
    }
}

// ---- handlers ----

/// Start a span (`startSpan`).
#[utoipa::path(
    post,
    path = "/v1/activity/spans",
    tag = tags::ACTIVITY,
    operation_id = "startSpan",
    params(WriterStore),
    request_body = StartSpanInput,
    responses(
        (status = 201, description = "The span as stored.", body = SpanRow),
        (status = 400, description = "An invalid input (empty id, unknown kind, …).", body = ErrorBody),
        (status = 409, description = "A span with this `spanId` exists (`conflict`).", body = ErrorBody),
    ),
)]
async fn start_span(
    _: NoQuery,
    WriterStore(store): WriterStore,
    JsonBody(input): JsonBody<StartSpanInput>,
) -> Result<(StatusCode, Json<SpanRow>), ApiError> {
    let span = op_start_span(store.as_ref(), input).await?;
    Ok((StatusCode::CREATED, Json(span)))
}

/// End a span with its write-once outcome (`endSpan`).
#[utoipa::path(
    post,
    path = "/v1/activity/spans/{spanId}/end",
    tag = tags::ACTIVITY,
    operation_id = "endSpan",
    params(("spanId" = String, Path, description = SPAN_ID), WriterStore),
    request_body = EndSpanInput,
    responses(
        (status = 200, description = "Whether this call ended the span.", body = Ended),
        (status = 400, description = "An invalid input.", body = ErrorBody),
    ),
)]
async fn end_span(
    _: NoQuery,
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    JsonBody(input): JsonBody<EndSpanInput>,
) -> Result<Json<Ended>, ApiError> {
    op_end_span(store.as_ref(), &span_id, input).await.map(Json)
}

/// Update an open span's attrs, usage or wait (`patchSpan`).
#[utoipa::path(
    patch,
    path = "/v1/activity/spans/{spanId}",
    tag = tags::ACTIVITY,
    operation_id = "patchSpan",
    params(("spanId" = String, Path, description = SPAN_ID), WriterStore),
    request_body = SpanPatch,
    responses(
        (status = 200, description = "Whether the span was patched.", body = Patched),
        (status = 400, description = "An invalid input.", body = ErrorBody),
    ),
)]
async fn patch_span(
    _: NoQuery,
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    JsonBody(patch): JsonBody<SpanPatch>,
) -> Result<Json<Patched>, ApiError> {
    op_patch_span(store.as_ref(), &span_id, patch)
        .await
        .map(Json)
}

/// Append an event to a span (`appendEvent`).
#[utoipa::path(
    post,
    path = "/v1/activity/spans/{spanId}/events",
    tag = tags::ACTIVITY,
    operation_id = "appendEvent",
    params(("spanId" = String, Path, description = SPAN_ID), WriterStore),
    request_body = AppendEventBody,
    responses(
        (status = 201, description = "The event as stored.", body = SpanEventRow),
        (status = 400, description = "An invalid input.", body = ErrorBody),
        (status = 404, description = "No span with this id.", body = ErrorBody),
    ),
)]
async fn append_event(
    _: NoQuery,
    State(state): State<AppState>,
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    request: Request,
) -> Result<(StatusCode, Json<SpanEventRow>), ApiError> {
    let bytes = json_body_bytes(request, &state).await?;
    if let Some(event) = append_event_as_written(store.as_ref(), &span_id, &bytes).await {
        return Ok((StatusCode::CREATED, Json(event?)));
    }
    let body: AppendEventBody = parse_json(&bytes)?;
    let event = op_append_event(store.as_ref(), &span_id, body).await?;
    Ok((StatusCode::CREATED, Json(event)))
}

/// [`AppendEventBody`] with its payload read straight into its stored form.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AppendEventStored {
    pub(crate) event_type: String,
    #[serde(default, deserialize_with = "PayloadText::optional")]
    pub(crate) payload: Option<PayloadText>,
    #[serde(
        default,
        deserialize_with = "flightlog_core::json_number::optional_integral_i64"
    )]
    pub(crate) ts: Option<i64>,
}

/// `appendEvent` with the payload read from the body straight into its stored form
/// ([`PayloadText`]), without the value tree the general path builds and writes out again;
/// `None` when the body is not one this path takes (not an object, any error, a payload
/// [`PayloadText`] leaves to the general path), which [`op_append_event`] then reads with every
/// rule and message of that path.
async fn append_event_as_written(
    store: &dyn ActivityStore,
    span_id: &str,
    bytes: &[u8],
) -> Option<Result<SpanEventRow, ApiError>> {
    // A derived struct also reads a JSON array as its fields in order: objects only.
    let first = bytes
        .iter()
        .find(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))?;
    if *first != b'{' {
        return None;
    }
    let body: AppendEventStored = from_utf8_json(bytes)?;
    if let Err(err) = check_optional_time("ts", body.ts) {
        return Some(Err(err));
    }
    let stored = match body.payload {
        Some(payload) => {
            store
                .append_event_text(span_id, &body.event_type, payload, body.ts)
                .await
        }
        None => {
            store
                .append_event(span_id, &body.event_type, None, body.ts)
                .await
        }
    };
    Some(match stored {
        Ok(Some(event)) => Ok(event),
        Ok(None) => Err(unknown_span(span_id)),
        Err(err) => Err(err.into()),
    })
}

/// Touch an open span's heartbeat (`heartbeat`); not change-logged.
#[utoipa::path(
    post,
    path = "/v1/activity/spans/{spanId}/heartbeat",
    tag = tags::ACTIVITY,
    operation_id = "heartbeat",
    params(("spanId" = String, Path, description = SPAN_ID), WriterStore),
    request_body = Option<HeartbeatBody>,
    responses(
        (status = 204, description = "Recorded (an unknown or terminal span is ignored)."),
        (status = 400, description = "An invalid input.", body = ErrorBody),
    ),
)]
async fn heartbeat(
    _: NoQuery,
    WriterStore(store): WriterStore,
    PathId(span_id): PathId,
    OptionalJsonBody(body): OptionalJsonBody<HeartbeatBody>,
) -> Result<StatusCode, ApiError> {
    op_heartbeat(store.as_ref(), &span_id, body.unwrap_or_default()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Read one span (`getSpan`).
#[utoipa::path(
    get,
    path = "/v1/activity/spans/{spanId}",
    tag = tags::ACTIVITY,
    operation_id = "getSpan",
    params(("spanId" = String, Path, description = SPAN_ID)),
    responses(
        (status = 200, description = "The span.", body = SpanRow),
        (status = 400, description = "An invalid id.", body = ErrorBody),
        (status = 404, description = "No span with this id.", body = ErrorBody),
    ),
)]
async fn get_span(
    _: NoQuery,
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

/// Close every open span of a run, children first, and roll it up (`cascadeClose`).
#[utoipa::path(
    post,
    path = "/v1/activity/runs/{runId}/close",
    tag = tags::ACTIVITY,
    operation_id = "cascadeClose",
    params(("runId" = String, Path, description = RUN_ID), WriterStore),
    request_body = CloseRunBody,
    responses(
        (status = 200, description = "How many spans were closed.", body = Closed),
        (status = 400, description = "An invalid input.", body = ErrorBody),
    ),
)]
async fn close_run(
    _: NoQuery,
    WriterStore(store): WriterStore,
    PathId(run_id): PathId,
    JsonBody(body): JsonBody<CloseRunBody>,
) -> Result<Json<Closed>, ApiError> {
    let closed = store
        .cascade_close(&run_id, body.outcome, &body.reason)
        .await?;
    Ok(Json(Closed { closed }))
}

/// Compute and store a run's rollup (`rollupRun`).
#[utoipa::path(
    post,
    path = "/v1/activity/runs/{runId}/rollup",
    tag = tags::ACTIVITY,
    operation_id = "rollupRun",
    params(("runId" = String, Path, description = RUN_ID), WriterStore),
    request_body = Option<NoMembers>,
    responses(
        (status = 204, description = "Rolled up (a run without spans is left alone)."),
        (status = 400, description = "An invalid id, or a body with a member (it takes none: send no body, or `{}`).", body = ErrorBody),
    ),
)]
async fn rollup_run(
    _: NoQuery,
    WriterStore(store): WriterStore,
    PathId(run_id): PathId,
    _: NoBody,
) -> Result<StatusCode, ApiError> {
    store.rollup_run(&run_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Read a run's rollup (`readRollup`).
#[utoipa::path(
    get,
    path = "/v1/activity/runs/{runId}/rollup",
    tag = tags::ACTIVITY,
    operation_id = "readRollup",
    params(("runId" = String, Path, description = RUN_ID)),
    responses(
        (status = 200, description = "The rollup.", body = RunRollupRow),
        (status = 400, description = "An invalid id.", body = ErrorBody),
        (status = 404, description = "The run has no rollup.", body = ErrorBody),
    ),
)]
async fn read_rollup(
    _: NoQuery,
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

/// A consistent picture of a run: its spans, events, high-water seq and the global cursor
/// (`snapshotRun`).
#[utoipa::path(
    get,
    path = "/v1/activity/runs/{runId}/snapshot",
    tag = tags::ACTIVITY,
    operation_id = "snapshotRun",
    params(("runId" = String, Path, description = RUN_ID)),
    responses(
        (status = 200, description = "The snapshot.", body = RunSnapshot),
        (status = 400, description = "An invalid id.", body = ErrorBody),
        (status = 404, description = "No run with this id.", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn snapshot_run(
    _: NoQuery,
    State(state): State<AppState>,
    PathId(run_id): PathId,
) -> Result<Response, ApiError> {
    let budget = state.response_budget();
    let Some((snapshot, reserved)) = budget
        .read_snapshot(state.activity().as_ref(), &run_id)
        .await?
    else {
        return Err(run_without_spans(state.activity().as_ref(), &run_id).await);
    };
    let json = ChunkedJson::drain(snapshot)?;
    let permit = budget.settle(reserved, json.len()).await?;
    Ok(response_budget::json_response(json, permit))
}

/// A run's highest change-logged seq (`runHighWaterSeq`).
#[utoipa::path(
    get,
    path = "/v1/activity/runs/{runId}/seq",
    tag = tags::ACTIVITY,
    operation_id = "runHighWaterSeq",
    params(("runId" = String, Path, description = RUN_ID)),
    responses(
        (status = 200, description = "The seq (0 for an unknown run).", body = HighWaterSeq),
        (status = 400, description = "An invalid id.", body = ErrorBody),
    ),
)]
async fn run_high_water_seq(
    _: NoQuery,
    State(state): State<AppState>,
    PathId(run_id): PathId,
) -> Result<Json<HighWaterSeq>, ApiError> {
    let high_water_seq = state.activity().run_high_water_seq(&run_id).await?;
    Ok(Json(HighWaterSeq { high_water_seq }))
}

/// The change log after a cursor, in `changeId` order (`changesSince`).
#[utoipa::path(
    get,
    path = "/v1/activity/changes",
    tag = tags::ACTIVITY,
    operation_id = "changesSince",
    params(ChangesQuery),
    responses(
        (status = 200, description = "At most `limit` changes. A page whose JSON reaches 32 MiB stops there, with `Flightlog-Page-Cut: true` (each change carries its span's whole current row, so a page of a span's many changes repeats its attrs): read on from its last `changeId`.", body = Vec<ActivityChange>,
            headers(
                ("Flightlog-Page-Cut" = String, description = "`true` when the page stopped short of `limit` at 32 MiB of JSON: more changes may follow its last one."),
                ("Flightlog-Change-Log-Horizon" = i64, description = "Change ids below this may be missing from the log (trimmed, or pruned with their runs)."),
                ("Flightlog-Resync" = String, description = "`true` when `after` is below the horizon minus one: changes after it may be missing; take a new snapshot, then continue from the larger of your cursor and the horizon minus one."),
            )),
        (status = 400, description = "A bad query.", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn changes_since(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ChangesQuery>,
) -> Result<Response, ApiError> {
    let limit = query.limit()?;
    let store = state.activity();
    let budget = state.response_budget();
    let mut page = response_budget::JsonArray::default();
    let (mut cursor, mut wanted) = (query.after, limit);
    let mut reserved = None;
    let mut cut = false;
    loop {
        let part = store
            .changes_since_bounded(cursor, wanted, CHANGE_PAGE_PART_BYTES)
            .await?;
        let Some(last) = part.last() else { break };
        cursor = last.change_id;
        wanted = wanted.saturating_sub(i64::try_from(part.len()).unwrap_or(i64::MAX));
        let before = page.len();
        page.extend(part)?;
        // A part that the bound cut holds more than an eighth of it in JSON (the store's
        // estimate of a change's bytes is at most eight times its JSON: a number counts 8);
        // a smaller one ended with the log.
        if wanted <= 0 || page.len() - before <= CHANGE_PAGE_PART_BYTES / 8 {
            break;
        }
        if page.len() >= CHANGE_PAGE_MAX_BYTES {
            cut = true;
            break;
        }
        // Before more is read: room for the page so far and two parts more (a part may pass
        // its bound by a change), waited for as any large answer's (503 when it stays taken).
        // A page still small after it ends with the log gives it back.
        reserved = budget
            .settle(reserved, page.len() + 2 * CHANGE_PAGE_PART_BYTES)
            .await?;
    }
    let horizon = store.change_log_horizon().await?;
    let mut response = budget.serialized(page.finish(), reserved).await?;
    if cut {
        response
            .headers_mut()
            .insert(PAGE_CUT, HeaderValue::from_static("true"));
    }
    Ok(with_change_log_horizon(response, query.after, horizon))
}

/// A change page is read from the store in parts of about this many bytes of attrs and
/// payloads (`changes_since_bounded`), serialized as they come.
const CHANGE_PAGE_PART_BYTES: usize = 1 << 20;
/// A change page stops once its JSON reaches this size, short of its `limit`, and says so
/// ([`PAGE_CUT`]). Each change carries its span's whole current row, so a page repeats a span
/// once per change: 200 patches of one span with 1 MB of attrs, a 2 MB database, made a
/// 201 MB page, read and serialized whole before the budget of large answers was asked (six
/// such requests at once took the server to 1.4 GB; at 10,000 changes one page would be
/// tens of GB). A page that reads past its first part holds its size so far and two parts
/// more of the budget before each read.
const CHANGE_PAGE_MAX_BYTES: usize = 32 << 20;
/// The header of a change page cut short of its `limit` by [`CHANGE_PAGE_MAX_BYTES`].
pub(crate) const PAGE_CUT: &str = "flightlog-page-cut";

/// The header that tells a client polling the change log (rather than streaming it, whose
/// stream says `resync`) whether the page can be trusted to miss nothing:
/// `Flightlog-Change-Log-Horizon` always (change ids below it may be missing: trimmed, or
/// pruned with their runs, the value of `POST /v1/activity/maintenance/prune`'s trim), and
/// `Flightlog-Resync: true` when the cursor asked from is below it, so changes after it may be
/// missing and the client should take a new snapshot (then continue from the larger of its
/// cursor and the horizon minus one). Read after the page, so a trim that raced the read is
/// not missed (at worst a resync is asked for without need).
fn with_change_log_horizon(mut response: Response, after: i64, horizon: i64) -> Response {
    let headers = response.headers_mut();
    headers.insert(CHANGE_LOG_HORIZON, HeaderValue::from(horizon));
    // A negative cursor reads from the start, as 0 does (the reference takes it, and so does
    // the conformance replay): it misses nothing 0 would not (it was told to resync on a
    // server that had never trimmed anything, an audit's finding).
    if after.max(0) < horizon.saturating_sub(1) {
        headers.insert(RESYNC, HeaderValue::from_static("true"));
    }
    response
}

/// See [`with_change_log_horizon`].
pub(crate) const CHANGE_LOG_HORIZON: &str = "flightlog-change-log-horizon";
/// See [`with_change_log_horizon`].
pub(crate) const RESYNC: &str = "flightlog-resync";

/// Terminal root spans with the highest change id they appear under, after a cursor
/// (`terminalRootChangesSince`).
#[utoipa::path(
    get,
    path = "/v1/activity/changes/terminal-roots",
    tag = tags::ACTIVITY,
    operation_id = "terminalRootChangesSince",
    params(ChangesQuery),
    responses(
        (status = 200, description = "At most `limit` entries.", body = Vec<TerminalRootChange>,
            headers(
                ("Flightlog-Change-Log-Horizon" = i64, description = "Change ids below this may be missing from the log (trimmed, or pruned with their runs)."),
                ("Flightlog-Resync" = String, description = "`true` when `after` is below the horizon minus one: changes after it may be missing; take a new snapshot, then continue from the larger of your cursor and the horizon minus one."),
            )),
        (status = 400, description = "A bad query.", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn terminal_root_changes_since(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ChangesQuery>,
) -> Result<Response, ApiError> {
    let limit = query.limit()?;
    let changes = state
        .activity()
        .terminal_root_changes_since(query.after, limit)
        .await?;
    let horizon = state.activity().change_log_horizon().await?;
    let response = state.response_budget().json(changes).await?;
    Ok(with_change_log_horizon(response, query.after, horizon))
}

/// The highest change id still in the log (`latestChangeCursor`, as the reference: a prune that
/// deletes the newest changes with their runs takes it down, to 0 when none is left). The
/// `Flightlog-Change-Log-Horizon` header says where the log starts: a client that follows the
/// log from here continues after the larger of the cursor and the horizon minus one, every id
/// below which was given out.
#[utoipa::path(
    get,
    path = "/v1/activity/cursor",
    tag = tags::ACTIVITY,
    operation_id = "latestChangeCursor",
    responses((status = 200, description = "The cursor.", body = ChangeCursor,
        headers(
            ("Flightlog-Change-Log-Horizon" = i64, description = "Change ids below this may be missing from the log (trimmed, or pruned with their runs)."),
        ))),
)]
async fn latest_change_cursor(
    _: NoQuery,
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let change_cursor = state.activity().latest_change_cursor().await?;
    let horizon = state.activity().change_log_horizon().await?;
    let mut response = Json(ChangeCursor { change_cursor }).into_response();
    response
        .headers_mut()
        .insert(CHANGE_LOG_HORIZON, HeaderValue::from(horizon));
    Ok(response)
}

/// Every open root span (`openRootSpans`).
#[utoipa::path(
    get,
    path = "/v1/activity/open-roots",
    tag = tags::ACTIVITY,
    operation_id = "openRootSpans",
    responses(
        (status = 200, description = "The open roots, newest start first.", body = Vec<SpanRow>),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn open_root_spans(_: NoQuery, State(state): State<AppState>) -> Result<Response, ApiError> {
    open_roots_answer(&state, true, None).await
}

/// The open roots (newest start first, or oldest first before `started_before` for
/// `findStuck`) as a JSON answer read and serialized part by part: before each part after the
/// first, the answer holds its size so far and two parts more of the budget of large answers
/// (503 when that room stays taken). Read whole, then charged, sixteen readers of 40,000 open
/// roots with 4 KB of attrs each (173 MB an answer) took the server to 2.85 GB (an audit's
/// finding); the answer is still whole (the contract has no limit on these).
async fn open_roots_answer(
    state: &AppState,
    newest_first: bool,
    started_before: Option<i64>,
) -> Result<Response, ApiError> {
    let store = state.activity();
    let budget = state.response_budget();
    let mut answer = response_budget::JsonArray::default();
    let mut reserved = None;
    let mut after = None;
    loop {
        let (roots, next) = store
            .open_roots_part(OpenRootsPart {
                newest_first,
                started_before,
                after,
                max_bytes: OPEN_ROOTS_PART_BYTES,
            })
            .await?;
        answer.extend(roots)?;
        let Some(next) = next else { break };
        after = Some(next);
        reserved = budget
            .settle(reserved, answer.len() + 2 * OPEN_ROOTS_PART_BYTES)
            .await?;
    }
    budget.serialized(answer.finish(), reserved).await
}

/// The open roots are read in parts of about this many bytes of attrs.
const OPEN_ROOTS_PART_BYTES: usize = 1 << 20;

/// Open roots that started more than `thresholdMs` before `now`, oldest first (`findStuck`).
#[utoipa::path(
    get,
    path = "/v1/activity/stuck",
    tag = tags::ACTIVITY,
    operation_id = "findStuck",
    params(StuckQuery),
    responses(
        (status = 200, description = "The stuck roots, oldest first.", body = Vec<SpanRow>),
        (status = 400, description = "A bad query.", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn find_stuck(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<StuckQuery>,
) -> Result<Response, ApiError> {
    check_time("thresholdMs", query.threshold_ms)?;
    check_optional_time("now", query.now)?;
    // The store's `find_stuck` cutoff: its clock's now, or the query's, less the threshold.
    let now = match query.now {
        Some(now) => now,
        None => state.activity().now_ms(),
    };
    open_roots_answer(&state, false, Some(now.saturating_sub(query.threshold_ms))).await
}
