//! `POST /v1/activity/batch`: many span writes in one request.
//!
//! Each op is parsed and checked exactly as its single endpoint checks its body (the same
//! `check_*` functions); the valid ones go to the store in ONE `write_batch` call, which applies
//! them in order, each atomic on its own (the SQLite store runs the whole batch as one writer job:
//! one queue round trip per request instead of one per op). At most
//! [`AppState::BATCH_LANES`] batches are read and parsed at once; the others wait for a lane with
//! their bodies unread, so memory follows the lanes, not the number of clients. A failing op
//! (malformed, an unknown span, a duplicate id) fails alone: its entry in `results` is the
//! `{"error": …}` object the single endpoint would have answered, and the ops after it still
//! run. Only a body that is not `{"ops": [...]}` at all, or one with too many ops, fails the
//! whole request.
//!
//! Order is kept: op N+1 may depend on op N (start a span, then end it), and `write_batch`
//! guarantees in-order application whatever the backend.

use axum::extract::{FromRequest, Request, State};
use axum::Json;
use flightlog_core::activity::{
    ActivityWrite, ActivityWriteResult, EndSpanInput, SpanEventRow, SpanPatch, SpanRow,
    StartSpanInput, StoreError,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::activity::{check_start_span, unknown_span, AppendEventBody, HeartbeatBody};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, WriterStore};
use crate::openapi::tags;
use crate::state::AppState;
use crate::validate::{check_id, check_optional_time};
use crate::wire::{Ended, Patched};

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(batch))
}

/// The batch body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    /// The ops, run in order; each is atomic on its own.
    #[schema(value_type = Vec<BatchOp>)]
    ops: Vec<Map<String, Value>>,
}

/// One op of a batch as the OpenAPI document describes it: `op` names the operation, `spanId`
/// is the single endpoint's path parameter, and the other fields are that endpoint's body.
///
/// Documentation only: the handler reads each op as a loose object, so that a malformed op fails
/// alone instead of failing the whole batch. The bodies are named in the descriptions rather than
/// flattened in, because their schemas forbid unknown fields (which `op` and `spanId` would be).
#[derive(ToSchema)]
#[serde(tag = "op", rename_all = "camelCase")]
#[allow(dead_code)] // never built: it only describes what `run_op` accepts
enum BatchOp {
    /// `startSpan`: plus the fields of `StartSpanInput` (which carries its own `spanId`).
    StartSpan {},
    /// `endSpan`: plus the fields of `EndSpanInput`.
    EndSpan {
        #[serde(rename = "spanId")]
        span_id: String,
    },
    /// `patchSpan`: plus the fields of `SpanPatch`.
    PatchSpan {
        #[serde(rename = "spanId")]
        span_id: String,
    },
    /// `appendEvent`: plus the fields of `AppendEventBody`.
    AppendEvent {
        #[serde(rename = "spanId")]
        span_id: String,
    },
    /// `heartbeat`: plus the fields of `HeartbeatBody`.
    Heartbeat {
        #[serde(rename = "spanId")]
        span_id: String,
    },
}

/// The batch answer.
#[derive(Debug, Serialize, ToSchema)]
struct BatchResponse {
    /// One entry per op, in order.
    results: Vec<BatchResult>,
}

/// One op's result: the single endpoint's answer body, `null` for a heartbeat (whose endpoint
/// answers 204), or the `{"error": …}` body the single endpoint would have answered.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
enum BatchResult {
    /// `startSpan`.
    Span(Box<SpanRow>),
    /// `endSpan`.
    Ended(Ended),
    /// `patchSpan`.
    Patched(Patched),
    /// `appendEvent`.
    Event(Box<SpanEventRow>),
    /// A failed op.
    Error(ErrorBody),
    /// `heartbeat`.
    Heartbeat,
}

/// Run many span writes in order, each atomic on its own; a failing op fails alone.
#[utoipa::path(
    post,
    path = "/v1/activity/batch",
    tag = tags::ACTIVITY,
    operation_id = "batch",
    params(WriterStore),
    request_body = BatchBody,
    responses(
        (status = 200, description = "Every op's result, in order.", body = BatchResponse),
        (status = 400, description = "Not `{\"ops\": [...]}`, or more ops than the server's limit.", body = ErrorBody),
    ),
)]
async fn batch(
    State(state): State<AppState>,
    WriterStore(store): WriterStore,
    request: Request,
) -> Result<Json<BatchResponse>, ApiError> {
    // The body is read only once this request has a lane (see `AppState::BATCH_LANES`): a
    // queued batch holds its socket, not its parsed ops.
    let _lane = state
        .batch_lanes()
        .acquire()
        .await
        .map_err(|_| ApiError::Unavailable("the server is shutting down".into()))?;
    let JsonBody(body) = JsonBody::<BatchBody>::from_request(request, &state).await?;
    let max = state.config().max_batch_ops;
    if body.ops.len() > max {
        return Err(ApiError::invalid(format!(
            "a batch holds at most {max} ops, got {}",
            body.ops.len()
        )));
    }
    // Parse and check every op first; only the valid ones reach the store, in order.
    let parsed: Vec<Result<ActivityWrite, ApiError>> = body
        .ops
        .into_iter()
        .enumerate()
        .map(|(index, op)| parse_op(index, op))
        .collect();
    let mut writes = Vec::with_capacity(parsed.len());
    let mut slots = Vec::with_capacity(parsed.len());
    for op in parsed {
        match op {
            Ok(write) => {
                slots.push(Ok(span_id_of(&write)));
                writes.push(write);
            }
            Err(err) => slots.push(Err(err)),
        }
    }
    let mut outcomes = store.write_batch(writes).await.into_iter();
    let results = slots
        .into_iter()
        .map(|slot| match slot {
            Err(err) => BatchResult::Error(err.error_body()),
            Ok(span_id) => match outcomes.next() {
                Some(outcome) => batch_result(&span_id, outcome),
                None => BatchResult::Error(
                    ApiError::Internal("the store answered fewer results than ops".into())
                        .error_body(),
                ),
            },
        })
        .collect();
    Ok(Json(BatchResponse { results }))
}

/// The span an op writes (for the `not_found` message of an append to an unknown span).
fn span_id_of(write: &ActivityWrite) -> String {
    match write {
        ActivityWrite::StartSpan(input) => input.span_id.clone(),
        ActivityWrite::EndSpan { span_id, .. }
        | ActivityWrite::PatchSpan { span_id, .. }
        | ActivityWrite::AppendEvent { span_id, .. }
        | ActivityWrite::Heartbeat { span_id, .. } => span_id.clone(),
    }
}

/// One op's store outcome as its single endpoint's answer body.
fn batch_result(span_id: &str, outcome: Result<ActivityWriteResult, StoreError>) -> BatchResult {
    match outcome {
        Ok(ActivityWriteResult::Started(span)) => BatchResult::Span(span),
        Ok(ActivityWriteResult::Ended(ended)) => BatchResult::Ended(Ended { ended }),
        Ok(ActivityWriteResult::Patched(patched)) => BatchResult::Patched(Patched { patched }),
        Ok(ActivityWriteResult::Appended(Some(event))) => BatchResult::Event(Box::new(event)),
        Ok(ActivityWriteResult::Appended(None)) => {
            BatchResult::Error(unknown_span(span_id).error_body())
        }
        Ok(ActivityWriteResult::Heartbeat) => BatchResult::Heartbeat,
        Err(err) => BatchResult::Error(ApiError::from(err).error_body()),
    }
}

/// One op, parsed and checked as its single endpoint would: the write to apply.
fn parse_op(index: usize, mut op: Map<String, Value>) -> Result<ActivityWrite, ApiError> {
    let name = match op.remove("op") {
        Some(Value::String(name)) => name,
        _ => {
            return Err(ApiError::invalid(format!(
                "ops[{index}].op must be one of startSpan, endSpan, patchSpan, appendEvent, \
                 heartbeat"
            )))
        }
    };
    match name.as_str() {
        "startSpan" => {
            let input: StartSpanInput = fields(index, op)?;
            check_start_span(&input)?;
            Ok(ActivityWrite::StartSpan(input))
        }
        "endSpan" => {
            let span_id = span_id(index, &mut op)?;
            let input: EndSpanInput = fields(index, op)?;
            check_optional_time("endedAt", input.ended_at)?;
            Ok(ActivityWrite::EndSpan { span_id, input })
        }
        "patchSpan" => {
            let span_id = span_id(index, &mut op)?;
            let patch: SpanPatch = fields(index, op)?;
            check_optional_time("waitUntil", patch.wait_until)?;
            Ok(ActivityWrite::PatchSpan { span_id, patch })
        }
        "appendEvent" => {
            let span_id = span_id(index, &mut op)?;
            let body: AppendEventBody = fields(index, op)?;
            check_optional_time("ts", body.ts)?;
            Ok(ActivityWrite::AppendEvent {
                span_id,
                event_type: body.event_type,
                payload: body.payload,
                ts: body.ts,
            })
        }
        "heartbeat" => {
            let span_id = span_id(index, &mut op)?;
            let body: HeartbeatBody = fields(index, op)?;
            check_optional_time("at", body.at)?;
            Ok(ActivityWrite::Heartbeat {
                span_id,
                at: body.at,
            })
        }
        other => Err(ApiError::invalid(format!(
            "ops[{index}].op {other:?} is not one of startSpan, endSpan, patchSpan, \
             appendEvent, heartbeat"
        ))),
    }
}

/// Take the op's `spanId` (the path parameter of the single endpoint).
fn span_id(index: usize, op: &mut Map<String, Value>) -> Result<String, ApiError> {
    match op.remove("spanId") {
        Some(Value::String(span_id)) => {
            check_id(&format!("ops[{index}].spanId"), &span_id)?;
            Ok(span_id)
        }
        _ => Err(ApiError::invalid(format!(
            "ops[{index}].spanId must be a non-empty string"
        ))),
    }
}

/// The op's remaining fields as the single endpoint's body.
fn fields<T: DeserializeOwned>(index: usize, op: Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(op))
        .map_err(|err| ApiError::invalid(format!("ops[{index}]: {err}")))
}
