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
use axum::routing::post;
use axum::{Json, Router};
use flightlog_core::activity::{ActivityStore, EndSpanInput, SpanPatch, StartSpanInput};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::activity::{
    op_append_event, op_end_span, op_heartbeat, op_patch_span, op_start_span, AppendEventBody,
    HeartbeatBody,
};
use crate::error::ApiError;
use crate::extract::{JsonBody, WriterStore};
use crate::state::AppState;
use crate::validate::check_id;

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new().route("/v1/activity/batch", post(batch))
}

/// The batch body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    ops: Vec<Map<String, Value>>,
}

async fn batch(
    State(state): State<AppState>,
    WriterStore(store): WriterStore,
    JsonBody(body): JsonBody<BatchBody>,
) -> Result<Json<Value>, ApiError> {
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
            Ok(value) => value,
            Err(err) => err.body(),
        };
        results.push(result);
    }
    Ok(Json(json!({ "results": results })))
}

/// One op: its single endpoint's response body (`null` for heartbeat's empty 204).
async fn run_op(
    store: &dyn ActivityStore,
    index: usize,
    mut op: Map<String, Value>,
) -> Result<Value, ApiError> {
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
            to_value(op_start_span(store, input).await?)
        }
        "endSpan" => {
            let span_id = span_id(index, &mut op)?;
            let input: EndSpanInput = fields(index, op)?;
            op_end_span(store, &span_id, input).await
        }
        "patchSpan" => {
            let span_id = span_id(index, &mut op)?;
            let patch: SpanPatch = fields(index, op)?;
            op_patch_span(store, &span_id, patch).await
        }
        "appendEvent" => {
            let span_id = span_id(index, &mut op)?;
            let body: AppendEventBody = fields(index, op)?;
            to_value(op_append_event(store, &span_id, body).await?)
        }
        "heartbeat" => {
            let span_id = span_id(index, &mut op)?;
            let body: HeartbeatBody = fields(index, op)?;
            op_heartbeat(store, &span_id, body).await?;
            Ok(Value::Null)
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

fn to_value(value: impl serde::Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(value)
        .map_err(|err| ApiError::Internal(format!("cannot serialize a result: {err}")))
}
