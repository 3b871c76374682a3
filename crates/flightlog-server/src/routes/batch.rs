//! `POST /v1/activity/batch`: many span writes in one request.
//!
//! The ops run in order, each through the same `op_*` function as its single endpoint, so each is
//! atomic on its own and a failing op (an unknown span, a duplicate id, a malformed op) fails
//! alone: its entry in `results` is the `{"error": …}` object the single endpoint would have
//! answered, and the ops after it still run. Only a body that is not `{"ops": [...]}` at all, or
//! one with too many ops, fails the whole request.
//!
//! The ops run one after another rather than concurrently: op N+1 may depend on op N (start a
//! span, then end it), and waiting for each answer is what guarantees that order whatever the
//! backend.

use axum::extract::State;
use axum::Json;
use flightlog_core::activity::{
    ActivityStore, EndSpanInput, SpanEventRow, SpanPatch, SpanRow, StartSpanInput,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::activity::{
    op_append_event, op_end_span, op_heartbeat, op_patch_span, op_start_span, AppendEventBody,
    HeartbeatBody,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, WriterStore};
use crate::openapi::tags;
use crate::state::AppState;
use crate::validate::check_id;
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
    JsonBody(body): JsonBody<BatchBody>,
) -> Result<Json<BatchResponse>, ApiError> {
    let max = state.config().max_batch_ops;
    if body.ops.len() > max {
        return Err(ApiError::invalid(format!(
            "a batch holds at most {max} ops, got {}",
            body.ops.len()
        )));
    }
    let mut results = Vec::with_capacity(body.ops.len());
    for (index, op) in body.ops.into_iter().enumerate() {
        let result = match run_op(store.as_ref(), index, op).await {
            Ok(result) => result,
            Err(err) => BatchResult::Error(err.error_body()),
        };
        results.push(result);
    }
    Ok(Json(BatchResponse { results }))
}

/// One op: its single endpoint's response body (`null` for heartbeat's empty 204).
async fn run_op(
    store: &dyn ActivityStore,
    index: usize,
    mut op: Map<String, Value>,
) -> Result<BatchResult, ApiError> {
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
            let span = op_start_span(store, input).await?;
            Ok(BatchResult::Span(Box::new(span)))
        }
        "endSpan" => {
            let span_id = span_id(index, &mut op)?;
            let input: EndSpanInput = fields(index, op)?;
            op_end_span(store, &span_id, input)
                .await
                .map(BatchResult::Ended)
        }
        "patchSpan" => {
            let span_id = span_id(index, &mut op)?;
            let patch: SpanPatch = fields(index, op)?;
            op_patch_span(store, &span_id, patch)
                .await
                .map(BatchResult::Patched)
        }
        "appendEvent" => {
            let span_id = span_id(index, &mut op)?;
            let body: AppendEventBody = fields(index, op)?;
            let event = op_append_event(store, &span_id, body).await?;
            Ok(BatchResult::Event(Box::new(event)))
        }
        "heartbeat" => {
            let span_id = span_id(index, &mut op)?;
            let body: HeartbeatBody = fields(index, op)?;
            op_heartbeat(store, &span_id, body).await?;
            Ok(BatchResult::Heartbeat)
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
