//! `POST /v1/activity/batch`: many span writes in one request.
//!
//! Each op is parsed and checked exactly as its single endpoint checks its body (the same
//! `check_*` functions); the valid ones go to the store in ONE `write_batch` call, which applies
//! them in order, each atomic on its own (the SQLite store runs the whole batch as one writer job:
//! one queue round trip per request instead of one per op). At most
//! [`AppState::BATCH_LANES`] batches are read and parsed at once; the others wait for a lane with
//! their bodies unread, so memory follows the lanes, not the number of clients. A failing op
//! (malformed, an unknown span, a duplicate id) fails alone: its entry in `results` is the
//! `{"error": …}` object the single endpoint would have answered (same code and status; a
//! refused op's message starts with its position, `ops[3]: …`, and of several bad members
//! may name another than the single endpoint, which names the first in its body), and the ops after it still run. Only a body that is not `{"ops": [...]}` at all, or one with too many ops, fails the
//! whole request, and so does a store that refused every op as a whole (503 with `Retry-After`,
//! nothing written: see `StoreError::refuses_every_write`).
//!
//! Order is kept: op N+1 may depend on op N (start a span, then end it), and `write_batch`
//! guarantees in-order application whatever the backend.
//!
//! An answer gives back what the ops sent (attrs, payloads): one that may pass 1 MiB takes its
//! room in the budget of large answers (`response_budget`) before anything is written, so that
//! its 503 still means nothing was written, and holds it until it is handed to the socket.

use crate::response_budget::SMALL_RESPONSE_BYTES;
use crate::wire::Json;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use flightlog_core::activity::{
    ActivityWrite, ActivityWriteResult, EndSpanInput, SpanEventRow, SpanPatch, SpanRow,
    StartSpanInput, StoreError,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::activity::{
    check_append_event, check_end_span, check_heartbeat, check_patch_span, check_start_span,
    unknown_span, AppendEventBody, AppendEventStored, HeartbeatBody,
};
use crate::error::{ApiError, ErrorBody};
use crate::extract::{
    json_body_bytes, non_object_json, parse_json, require_json_object, NoQuery, WriterStore,
};
use crate::openapi::tags;
use crate::skip_keys::SkipKeys;
use crate::state::AppState;
use crate::validate::{check_id, check_optional_time};
use crate::wire::{Ended, Patched};

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(batch))
}

/// Say in `document` how many ops a batch may hold on this server
/// (`ServerConfig::max_batch_ops`, 1,000 by default): the `maxItems` of [`BatchBody`]'s `ops`.
pub(crate) fn document_op_limit(document: &mut utoipa::openapi::OpenApi, max_ops: usize) {
    use utoipa::openapi::schema::Schema;
    use utoipa::openapi::RefOr;
    let Some(RefOr::T(Schema::Object(body))) = document
        .components
        .as_mut()
        .and_then(|components| components.schemas.get_mut("BatchBody"))
    else {
        return;
    };
    if let Some(RefOr::T(Schema::Array(ops))) = body.properties.get_mut("ops") {
        ops.max_items = Some(max_ops);
    }
}

/// The batch body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    /// The ops, run in order; each is atomic on its own.
    #[schema(value_type = Vec<BatchOp>)]
    ops: Vec<OpMembers>,
}

/// One op's members as a map, and the first member name it repeats, if any: the single
/// endpoints' typed bodies refuse a repeated field, so an op that repeats one is refused too
/// (a plain map would keep the last value and run the op).
#[derive(Debug)]
struct OpMembers {
    members: Map<String, Value>,
    repeated: Option<String>,
}

impl<'de> Deserialize<'de> for OpMembers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MembersVisitor;

        impl<'de> serde::de::Visitor<'de> for MembersVisitor {
            type Value = OpMembers;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OpMembers, A::Error> {
                let mut op = OpMembers {
                    members: Map::new(),
                    repeated: None,
                };
                while let Some(name) = map.next_key::<String>()? {
                    // As written (see `flightlog_core::json_as_written`), as the fast path
                    // reads the same members.
                    let value = map.next_value_seed(flightlog_core::json_as_written::AsWritten)?;
                    if op.members.contains_key(&name) {
                        op.repeated.get_or_insert(name);
                    } else {
                        op.members.insert(name, value);
                    }
                }
                Ok(op)
            }
        }

        deserializer.deserialize_map(MembersVisitor)
    }
}

/// One op of a batch as the OpenAPI document describes it: `op` names the operation, `spanId`
/// is the single endpoint's path parameter, and the other fields are that endpoint's body.
// Documentation only: the handler reads each op as a loose object, so that a malformed op fails
// alone instead of failing the whole batch. The bodies are named in the descriptions rather than
// flattened in, because their schemas forbid unknown fields (which `op` and `spanId` would be).
// (A `//` comment: the `///` ones are the OpenAPI description, which API readers see.)
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
/// answers 204), or the `{"error": …}` body the single endpoint would have answered: its
/// `code` (and status); the message starts with the op's position (`ops[3]: …`) and names the
/// member at fault without a line and column, and an op with several bad members may name
/// another of them than the single endpoint does (which names the first in its body).
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
///
/// Sending a batch again (after a timeout, say: a write whose client went away is still made)
/// is safe for its starts (a second start answers 409 `conflict`), ends (a span's end is
/// written once; a second answers `{"ended": false}`), patches (the same values again, on an
/// open span) and heartbeats, as for the single
/// endpoints and the reference; an `appendEvent` sent again is a second event. A client that
/// must not record an event twice retries only the ops whose answers it did not get, or reads
/// the span's events (`GET /v1/activity/runs/{runId}/snapshot`) before it sends them again.
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
        (status = 503, description = "The store refused every op (overload, shutdown, another process holding the write lock, a full disk), or other clients' large answers held the budget this batch's answer needs (a batch whose answer may pass 1 MiB takes its room before anything is written): nothing was written; retry after `Retry-After`.", body = ErrorBody),
    ),
)]
async fn batch(
    _: NoQuery,
    State(state): State<AppState>,
    WriterStore(store): WriterStore,
    request: Request,
) -> Result<Response, ApiError> {
    // The body is read only once this request has a lane (see `AppState::BATCH_LANES`): a
    // queued batch holds its socket, not its parsed ops.
    let _lane = state
        .batch_lanes()
        .acquire()
        .await
        .map_err(|_| ApiError::Unavailable("the server is shutting down".into()))?;
    let bytes = json_body_bytes(request, &state).await?;
    // Parse and check every op first; only the valid ones reach the store, in order.
    let parsed = parse_ops(&bytes, state.config().max_batch_ops)?;
    // A large answer's room in the budget of large answers is taken before anything is
    // written, so that a refusal (503) still means nothing was written; the answer then holds
    // it until it is handed to the socket. Answers of 8 MB batches left unread held 7.3 MiB
    // each outside any budget (572 MiB for 60 clients; an audit's finding).
    let estimate = answer_estimate(bytes.len(), parsed.len());
    let large = estimate > SMALL_RESPONSE_BYTES;
    let reserved = if large {
        state.response_budget().reserve(estimate).await?
    } else {
        None
    };
    drop(bytes);
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
    let outcomes = store.write_batch(writes).await;
    // The store refused the whole batch (a lock held by another process, a full disk):
    // nothing was written, so the request is answered as a single write would be, 503 with
    // `Retry-After`. A 200 whose every op said `unavailable` was lost on clients that check
    // only the status (an audit's finding), while a full gate already answered 503.
    if !outcomes.is_empty()
        && outcomes
            .iter()
            .all(|outcome| outcome.as_ref().is_err_and(StoreError::refuses_every_write))
    {
        if let Some(Err(refusal)) = outcomes.into_iter().next() {
            return Err(ApiError::from(refusal));
        }
        return Err(ApiError::Internal(
            "the store's refusal went missing".into(),
        ));
    }
    let mut outcomes = outcomes.into_iter();
    let results = slots
        .into_iter()
        .enumerate()
        .map(|(index, slot)| match slot {
            Err(err) => BatchResult::Error(op_error(index, err)),
            Ok(span_id) => match outcomes.next() {
                Some(outcome) => batch_result(index, &span_id, outcome),
                None => BatchResult::Error(op_error(
                    index,
                    ApiError::Internal("the store answered fewer results than ops".into()),
                )),
            },
        })
        .collect();
    let answer = BatchResponse { results };
    if large {
        state.response_budget().json_after_writes(answer, reserved)
    } else {
        Ok(Json(answer).into_response())
    }
}

/// What an op's answer adds to the op's own text at most, about: a started span's answer is its
/// whole row (every column named, `null` or not: ~400 bytes) around the attrs the op sent; an
/// event's is its row around the payload sent.
const ANSWER_BYTES_PER_OP: usize = 512;

/// About the most bytes the answer of a batch of `ops` ops in a body of `body_bytes` takes: an
/// answer gives back what the ops sent (attrs, payloads, ids) with each op's row around it.
fn answer_estimate(body_bytes: usize, ops: usize) -> usize {
    body_bytes.saturating_add(ops.saturating_mul(ANSWER_BYTES_PER_OP))
}

/// The span an op writes (for the `not_found` message of an append to an unknown span).
fn span_id_of(write: &ActivityWrite) -> String {
    match write {
        ActivityWrite::StartSpan(input) => input.span_id.clone(),
        ActivityWrite::EndSpan { span_id, .. }
        | ActivityWrite::PatchSpan { span_id, .. }
        | ActivityWrite::AppendEvent { span_id, .. }
        | ActivityWrite::AppendEventText { span_id, .. }
        | ActivityWrite::Heartbeat { span_id, .. } => span_id.clone(),
    }
}

/// One op's store outcome as its single endpoint's answer body (an error named by the op's
/// position, see [`op_error`]).
fn batch_result(
    index: usize,
    span_id: &str,
    outcome: Result<ActivityWriteResult, StoreError>,
) -> BatchResult {
    match outcome {
        Ok(ActivityWriteResult::Started(span)) => BatchResult::Span(span),
        Ok(ActivityWriteResult::Ended(ended)) => BatchResult::Ended(Ended { ended }),
        Ok(ActivityWriteResult::Patched(patched)) => BatchResult::Patched(Patched { patched }),
        Ok(ActivityWriteResult::Appended(Some(event))) => BatchResult::Event(Box::new(event)),
        Ok(ActivityWriteResult::Appended(None)) => {
            BatchResult::Error(op_error(index, unknown_span(span_id)))
        }
        Ok(ActivityWriteResult::Heartbeat) => BatchResult::Heartbeat,
        Err(err) => BatchResult::Error(op_error(index, ApiError::from(err))),
    }
}

/// The body with each op kept as its text, borrowed from the request's bytes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatchBody<'a> {
    #[serde(borrow)]
    ops: Vec<&'a RawValue>,
}

/// Every op of the body, parsed and checked (or the whole body's error).
///
/// The fast path reads each op's text straight into its body type ([`RawOp`]); whatever it
/// cannot take (a body that is not `{"ops": [...]}`, or an op with any error at all) is read
/// again the original way, through a `serde_json` map ([`MapOp`]), so every answer, error
/// messages included, is exactly what that way gives. An op that is not a JSON object is an
/// error of its own entry.
fn parse_ops(bytes: &[u8], max: usize) -> Result<Vec<Result<ActivityWrite, ApiError>>, ApiError> {
    // Before the fast path too: it would read `[[op, …]]` as `{"ops": [op, …]}`.
    require_json_object(bytes)?;
    let Ok(body) = serde_json::from_slice::<RawBatchBody<'_>>(bytes) else {
        let body: BatchBody = parse_json(bytes)?;
        check_op_count(body.ops.len(), max)?;
        return Ok(body
            .ops
            .into_iter()
            .enumerate()
            .map(|(index, op)| parse_op(index, MapOp(op)).map_err(|error| in_op(index, error)))
            .collect());
    };
    check_op_count(body.ops.len(), max)?;
    Ok(body
        .ops
        .into_iter()
        .enumerate()
        .map(|(index, raw)| {
            // An op that is not an object is that op's error (as its single endpoint refuses a
            // body that is not one), not the whole batch's.
            if let Some(found) = non_object_json(raw.get().as_bytes()) {
                return Err(ApiError::invalid(format!(
                    "ops[{index}]: an op is a JSON object, got {found}"
                )));
            }
            RawOp::new(raw)
                .and_then(|op| parse_op(index, op).ok())
                .map_or_else(|| reparse_op(index, raw), Ok)
                .map_err(|error| in_op(index, error))
        })
        .collect())
}

fn check_op_count(ops: usize, max: usize) -> Result<(), ApiError> {
    if ops > max {
        return Err(ApiError::invalid(format!(
            "a batch holds at most {max} ops, got {ops}"
        )));
    }
    Ok(())
}

/// An op the fast path could not take, read the original way for its exact answer.
fn reparse_op(index: usize, raw: &RawValue) -> Result<ActivityWrite, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    let op: OpMembers = serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|err| ApiError::invalid(format!("ops[{index}]: {err}")))?;
    let write = parse_op(index, MapOp(op))?;
    // The map keeps the last of a member repeated inside a typed member (`usage` holding
    // `costUsd` twice), which the single endpoint's typed body refuses; the fast path refused
    // it too, so the op's text is read as that body once more, for the refusal and its path.
    if let Some(typed) = RawOp::with_paths(raw) {
        parse_op(index, typed)?;
    }
    Ok(write)
}

/// A failed op's entry: the single endpoint's error body, its message led by the op's position
/// (`ops[3]: no span with id "s9"`), whatever the error.
fn op_error(index: usize, error: ApiError) -> ErrorBody {
    let mut body = error.error_body();
    if !body.error.message.starts_with("ops[") {
        body.error.message = format!("ops[{index}]: {}", body.error.message);
    }
    body
}

/// A refused op's error in the form every batch error takes: the op's position first.
fn in_op(index: usize, error: ApiError) -> ApiError {
    match error {
        ApiError::InvalidRequest(message) if !message.starts_with("ops[") => {
            ApiError::InvalidRequest(format!("ops[{index}]: {message}"))
        }
        other => other,
    }
}

/// Where an op's parts come from.
trait OpSource {
    /// The op's `op` member.
    fn name(&mut self, index: usize) -> Result<String, ApiError>;
    /// The op's `spanId` member (the path parameter of the single endpoint), checked.
    fn span_id(&mut self, index: usize) -> Result<String, ApiError>;
    /// The op's other members as the single endpoint's body; `with_span_id` keeps `spanId` in
    /// it (a start's body carries its own span id).
    fn fields<T: DeserializeOwned>(self, index: usize, with_span_id: bool) -> Result<T, ApiError>;
    /// An `appendEvent` op's other members with the payload read straight into its stored form,
    /// when this source can (`None`: read them with [`Self::fields`]).
    fn stored_event(&self) -> Option<AppendEventStored> {
        None
    }
}

/// An op read as a `serde_json` map: the reference way, with the error messages of the API.
struct MapOp(OpMembers);

impl OpSource for MapOp {
    fn name(&mut self, index: usize) -> Result<String, ApiError> {
        if let Some(name) = &self.0.repeated {
            return Err(ApiError::invalid(format!(
                "ops[{index}]: duplicate field `{name}`"
            )));
        }
        match self.0.members.remove("op") {
            Some(Value::String(name)) => Ok(name),
            _ => Err(ApiError::invalid(format!(
                "ops[{index}].op must be one of startSpan, endSpan, patchSpan, appendEvent, \
                 heartbeat"
            ))),
        }
    }

    fn span_id(&mut self, index: usize) -> Result<String, ApiError> {
        match self.0.members.remove("spanId") {
            Some(Value::String(span_id)) => {
                check_id(&format!("ops[{index}].spanId"), &span_id)?;
                Ok(span_id)
            }
            _ => Err(ApiError::invalid(format!(
                "ops[{index}].spanId must be a non-empty string"
            ))),
        }
    }

    fn fields<T: DeserializeOwned>(self, index: usize, _with_span_id: bool) -> Result<T, ApiError> {
        // `spanId` is already taken out when it is not part of the body.
        serde_path_to_error::deserialize(Value::Object(self.0.members))
            .map_err(|err| ApiError::invalid(format!("ops[{index}]: {err}")))
    }
}

/// The members of an op the fast path reads first; the others are skipped unread.
#[derive(Deserialize)]
struct OpHeader {
    op: String,
    #[serde(rename = "spanId", default)]
    span_id: Option<String>,
}

/// An op read straight from its text. Its errors are never shown: any error sends the op to
/// [`reparse_op`].
struct RawOp<'a> {
    raw: &'a RawValue,
    header: OpHeader,
    /// Errors name the path of the offending value (the slower parse, for refusals only).
    with_paths: bool,
}

impl<'a> RawOp<'a> {
    fn new(raw: &'a RawValue) -> Option<Self> {
        let header = serde_json::from_str(raw.get()).ok()?;
        Some(Self {
            raw,
            header,
            with_paths: false,
        })
    }

    /// The op read for its refusal (see [`reparse_op`]).
    fn with_paths(raw: &'a RawValue) -> Option<Self> {
        Self::new(raw).map(|op| Self {
            with_paths: true,
            ..op
        })
    }
}

impl OpSource for RawOp<'_> {
    fn name(&mut self, _index: usize) -> Result<String, ApiError> {
        Ok(std::mem::take(&mut self.header.op))
    }

    fn span_id(&mut self, index: usize) -> Result<String, ApiError> {
        let span_id = self
            .header
            .span_id
            .take()
            .ok_or_else(|| ApiError::invalid("no spanId"))?;
        check_id(&format!("ops[{index}].spanId"), &span_id)?;
        Ok(span_id)
    }

    fn fields<T: DeserializeOwned>(self, index: usize, with_span_id: bool) -> Result<T, ApiError> {
        const OP: &[&str] = &["op"];
        const OP_AND_SPAN_ID: &[&str] = &["op", "spanId"];
        let skip = if with_span_id { OP } else { OP_AND_SPAN_ID };
        let mut deserializer = serde_json::Deserializer::from_str(self.raw.get());
        if self.with_paths {
            return serde_path_to_error::deserialize(SkipKeys::new(&mut deserializer, skip))
                .map_err(|err| ApiError::invalid(format!("ops[{index}]: {err}")));
        }
        let body = T::deserialize(SkipKeys::new(&mut deserializer, skip))
            .and_then(|body| deserializer.end().map(|()| body))
            .map_err(|err| ApiError::invalid(err.to_string()))?;
        Ok(body)
    }

    fn stored_event(&self) -> Option<AppendEventStored> {
        if self.with_paths {
            return None;
        }
        let mut deserializer = serde_json::Deserializer::from_str(self.raw.get());
        let body =
            AppendEventStored::deserialize(SkipKeys::new(&mut deserializer, &["op", "spanId"]))
                .ok()?;
        deserializer.end().ok()?;
        Some(body)
    }
}

/// One op, parsed and checked as its single endpoint would: the write to apply.
fn parse_op(index: usize, mut op: impl OpSource) -> Result<ActivityWrite, ApiError> {
    let name = op.name(index)?;
    match name.as_str() {
        "startSpan" => {
            let input: StartSpanInput = op.fields(index, true)?;
            check_start_span(&input)?;
            Ok(ActivityWrite::StartSpan(input))
        }
        "endSpan" => {
            let span_id = op.span_id(index)?;
            let input: EndSpanInput = op.fields(index, false)?;
            check_end_span(&input)?;
            Ok(ActivityWrite::EndSpan { span_id, input })
        }
        "patchSpan" => {
            let span_id = op.span_id(index)?;
            let patch: SpanPatch = op.fields(index, false)?;
            check_patch_span(&patch)?;
            Ok(ActivityWrite::PatchSpan { span_id, patch })
        }
        "appendEvent" => {
            let span_id = op.span_id(index)?;
            if let Some(body) = op.stored_event() {
                check_optional_time("ts", body.ts)?;
                return Ok(match body.payload {
                    Some(payload) => ActivityWrite::AppendEventText {
                        span_id,
                        event_type: body.event_type,
                        payload,
                        ts: body.ts,
                    },
                    None => ActivityWrite::AppendEvent {
                        span_id,
                        event_type: body.event_type,
                        payload: None,
                        ts: body.ts,
                    },
                });
            }
            let body: AppendEventBody = op.fields(index, false)?;
            check_append_event(&body)?;
            Ok(ActivityWrite::AppendEvent {
                span_id,
                event_type: body.event_type,
                payload: body.payload,
                ts: body.ts,
            })
        }
        "heartbeat" => {
            let span_id = op.span_id(index)?;
            let body: HeartbeatBody = op.fields(index, false)?;
            check_heartbeat(&body)?;
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use flightlog_core::activity::PayloadText;

    /// Every op read the original way (a map per op) — the reference for the fast path.
    fn through_maps(
        body: &str,
        max: usize,
    ) -> Result<Vec<Result<ActivityWrite, ApiError>>, ApiError> {
        let body: BatchBody = parse_json(body.as_bytes())?;
        check_op_count(body.ops.len(), max)?;
        Ok(stored_forms(
            body.ops
                .into_iter()
                .enumerate()
                .map(|(index, op)| parse_op(index, MapOp(op)).map_err(|error| in_op(index, error)))
                .collect(),
        ))
    }

    /// The fast path's ops, with event payloads compared by their stored form.
    fn fast(body: &[u8], max: usize) -> Result<Vec<Result<ActivityWrite, ApiError>>, ApiError> {
        parse_ops(body, max).map(stored_forms)
    }

    /// Event payloads in their stored form where it can be had ([`PayloadText`]): the fast
    /// path reads them so, the map path as values; the same stored text is the same op.
    fn stored_forms(
        ops: Vec<Result<ActivityWrite, ApiError>>,
    ) -> Vec<Result<ActivityWrite, ApiError>> {
        ops.into_iter()
            .map(|op| match op {
                Ok(ActivityWrite::AppendEvent {
                    span_id,
                    event_type,
                    payload: Some(payload),
                    ts,
                }) => {
                    let capped = flightlog_core::activity::cap_payload(Some(&payload));
                    let stored =
                        PayloadText::from_json_text(&capped.json).filter(|_| !capped.truncated);
                    Ok(match stored {
                        Some(payload) => ActivityWrite::AppendEventText {
                            span_id,
                            event_type,
                            payload,
                            ts,
                        },
                        None => ActivityWrite::AppendEvent {
                            span_id,
                            event_type,
                            payload: Some(payload),
                            ts,
                        },
                    })
                }
                other => other,
            })
            .collect()
    }

    #[test]
    fn the_fast_path_answers_exactly_as_the_map_path() {
        let ops = [
            r#"{"op": "startSpan", "spanId": "s1", "runId": "r1", "name": "turn", "kind": "turn", "origin": "session", "attrs": {"k": [1, 2.5, null]}}"#,
            r#"{"spanId": "s1", "op": "endSpan", "outcome": "success", "usage": {"inputTokens": 3}}"#,
            r#"{"op": "patchSpan", "spanId": "s1", "attrs": {"op": "inner"}, "waitUntil": 5}"#,
            r#"{"op": "appendEvent", "spanId": "s\u0031", "eventType": "tool", "payload": {"spanId": 1}, "ts": 9}"#,
            r#"{"op": "heartbeat", "spanId": "s1", "at": 3}"#,
            r#"{"op": "heartbeat", "spanId": "s1"}"#,
            // Errors: each must come out with the map path's message.
            r#"{"op": "endSpan", "spanId": "s1", "outcome": "exploded"}"#,
            r#"{"op": "endSpan", "spanId": "", "outcome": "success"}"#,
            r#"{"op": "endSpan", "outcome": "success"}"#,
            r#"{"op": "endSpan", "spanId": 7, "outcome": "success"}"#,
            r#"{"op": "appendEvent", "spanId": "s1", "eventType": "x", "extra": 1}"#,
            r#"{"op": "appendEvent", "spanId": "s1", "eventType": "x", "ts": 1.5}"#,
            r#"{"op": "startSpan", "runId": "r1", "name": "n", "kind": "turn", "origin": "session"}"#,
            r#"{"op": "fly", "spanId": "s1"}"#,
            r#"{"op": 3}"#,
            r#"{}"#,
            // Repeated members: refused, as the single endpoints' typed bodies refuse them.
            r#"{"op": "heartbeat", "op": "endSpan", "spanId": "s1", "outcome": "success"}"#,
            r#"{"op": "endSpan", "spanId": "s0", "spanId": "s1", "outcome": "error", "outcome": "success"}"#,
        ];
        for op in ops {
            let body = format!(r#"{{"ops": [{op}]}}"#);
            assert_eq!(fast(body.as_bytes(), 10), through_maps(&body, 10), "{op}");
        }
        // The valid ones (the first six) are taken by the fast path itself.
        for op in &ops[..6] {
            let raw: Box<RawValue> = serde_json::from_str(op).unwrap();
            let fast = RawOp::new(&raw).and_then(|source| parse_op(0, source).ok());
            assert!(fast.is_some(), "{op}");
        }
        // An event's payload is read straight into its stored form.
        let raw: Box<RawValue> = serde_json::from_str(ops[3]).unwrap();
        let event = RawOp::new(&raw).and_then(|source| parse_op(0, source).ok());
        assert!(
            matches!(&event, Some(ActivityWrite::AppendEventText { payload, .. }) if payload.as_str() == r#"{"spanId":1}"#),
            "{event:?}"
        );
        let all = format!(r#"{{"ops": [{}]}}"#, ops.join(",\n "));
        assert_eq!(fast(all.as_bytes(), 100), through_maps(&all, 100));
        // An op that is not an object is its own entry's error; the others are parsed.
        let mixed = parse_ops(
            br#"{"ops": [1, {"op": "heartbeat", "spanId": "a"}, "x"]}"#,
            3,
        )
        .expect("a well-formed batch");
        assert_eq!(mixed.len(), 3);
        assert!(
            matches!(&mixed[0], Err(ApiError::InvalidRequest(m)) if m == "ops[0]: an op is a JSON object, got a number"),
            "{mixed:?}"
        );
        assert!(mixed[1].is_ok(), "{mixed:?}");
        assert!(
            matches!(&mixed[2], Err(ApiError::InvalidRequest(m)) if m == "ops[2]: an op is a JSON object, got a string"),
            "{mixed:?}"
        );
        // A member repeated inside a typed member is refused as the single endpoint refuses
        // it (a map would keep the last one), naming its path; one inside free-form attrs is
        // not (the single endpoint keeps the last, as JSON parsers do).
        for (op, path) in [
            (
                r#"{"op": "endSpan", "spanId": "s1", "outcome": "success", "usage": {"costUsd": 1, "costUsd": 99}}"#,
                "ops[0]: usage: duplicate field `costUsd`",
            ),
            (
                r#"{"op": "patchSpan", "spanId": "s1", "usage": {"inputTokens": 1, "inputTokens": 2}}"#,
                "ops[0]: usage: duplicate field `inputTokens`",
            ),
        ] {
            let body = format!(r#"{{"ops": [{op}]}}"#);
            let parsed = parse_ops(body.as_bytes(), 1).expect("a well-formed batch");
            assert!(
                matches!(&parsed[0], Err(ApiError::InvalidRequest(m)) if m.starts_with(path)),
                "{parsed:?}"
            );
        }
        let attrs = r#"{"ops": [{"op": "patchSpan", "spanId": "s1", "attrs": {"k": 1, "k": 2}}]}"#;
        let parsed = parse_ops(attrs.as_bytes(), 1).expect("a well-formed batch");
        assert!(parsed[0].is_ok(), "{parsed:?}");
        // A refusal of a check after the parse is named by its position too.
        let late = r#"{"ops": [{"op": "appendEvent", "spanId": "s1", "eventType": "x", "ts": 9007199254740993}]}"#;
        let parsed = parse_ops(late.as_bytes(), 1).expect("a well-formed batch");
        assert!(
            matches!(&parsed[0], Err(ApiError::InvalidRequest(m)) if m.starts_with("ops[0]: ")),
            "{parsed:?}"
        );
        // Whole-body errors.
        for body in [
            r#"{"ops": {}}"#,
            r#"{"ops": [], "more": 1}"#,
            r#"{"ops": [{"op": "heartbeat", "spanId": "a"}, {"op": "heartbeat", "spanId": "b"}]}"#,
            r#"not json"#,
            r#"{"ops": [{"op": "heartbeat", "spanId": "a"}]} trailing"#,
        ] {
            assert_eq!(fast(body.as_bytes(), 1), through_maps(body, 1), "{body}");
        }
    }

    /// One member of an op: the names the endpoints know (and a few they do not), each with
    /// values of the right and of wrong types.
    fn member() -> impl Strategy<Value = String> {
        let value = prop_oneof![
            Just("\"s1\"".to_owned()),
            Just("\"\"".to_owned()),
            Just("\"s\\u0031\"".to_owned()),
            Just("7".to_owned()),
            Just("1.5".to_owned()),
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("{\"k\": [1, {\"op\": 2}]}".to_owned()),
            Just("[1]".to_owned()),
            Just("\"success\"".to_owned()),
            Just("\"turn\"".to_owned()),
            Just("\"session\"".to_owned()),
            Just("{\"inputTokens\": 3}".to_owned()),
        ];
        let name = prop_oneof![
            Just("op"),
            Just("spanId"),
            Just("runId"),
            Just("name"),
            Just("kind"),
            Just("origin"),
            Just("attrs"),
            Just("startedAt"),
            Just("outcome"),
            Just("reason"),
            Just("usage"),
            Just("endedAt"),
            Just("waitUntil"),
            Just("eventType"),
            Just("payload"),
            Just("ts"),
            Just("at"),
            Just("extra"),
        ];
        let op_name = prop_oneof![
            Just("\"startSpan\""),
            Just("\"endSpan\""),
            Just("\"patchSpan\""),
            Just("\"appendEvent\""),
            Just("\"heartbeat\""),
            Just("\"fly\""),
        ];
        prop_oneof![
            3 => op_name.prop_map(|op| format!("\"op\": {op}")),
            10 => (name, value).prop_map(|(name, value)| format!("\"{name}\": {value}")),
        ]
    }

    /// A valid op of each kind, its optional members present or not, in any member order, and
    /// now and then one random member more (which may make it invalid).
    fn valid_op() -> impl Strategy<Value = Vec<String>> {
        let optional =
            |member: &'static str| prop_oneof![Just(None), Just(Some(member.to_owned()))];
        let kind = prop_oneof![
            Just(vec![
                r#""op": "startSpan""#,
                r#""spanId": "s1""#,
                r#""runId": "r1""#,
                r#""name": "n""#,
                r#""kind": "turn""#,
                r#""origin": "session""#,
            ]),
            Just(vec![
                r#""op": "endSpan""#,
                r#""spanId": "s1""#,
                r#""outcome": "error""#
            ]),
            Just(vec![r#""op": "patchSpan""#, r#""spanId": "s1""#]),
            Just(vec![
                r#""op": "appendEvent""#,
                r#""spanId": "s1""#,
                r#""eventType": "x""#
            ]),
            Just(vec![r#""op": "heartbeat""#, r#""spanId": "s\u0031""#]),
        ];
        (
            kind,
            optional(r#""ts": 12"#),
            optional(r#""payload": {"a": [1, "b"], "op": null}"#),
            optional(r#""at": 5"#),
            optional(r#""usage": {"inputTokens": 3, "costUsd": 0.5}"#),
            optional(r#""attrs": {"spanId": 1}"#),
            prop_oneof![4 => Just(None), 1 => member().prop_map(Some)],
        )
            .prop_flat_map(|(kind, ts, payload, at, usage, attrs, extra)| {
                let head = kind[0];
                let mut members: Vec<String> = kind.iter().map(|m| (*m).to_owned()).collect();
                // Only the members the kind takes, so that most generated ops are valid.
                let takes = |name: &str| match name {
                    "ts" | "payload" => head.contains("appendEvent"),
                    "at" => head.contains("heartbeat"),
                    "usage" => head.contains("endSpan") || head.contains("patchSpan"),
                    "attrs" => !head.contains("heartbeat") && !head.contains("appendEvent"),
                    _ => false,
                };
                for (name, member) in [
                    ("ts", ts),
                    ("payload", payload),
                    ("at", at),
                    ("usage", usage),
                    ("attrs", attrs),
                ] {
                    if let Some(member) = member.filter(|_| takes(name)) {
                        members.push(member);
                    }
                }
                members.extend(extra);
                Just(members).prop_shuffle()
            })
    }

    proptest! {
        #[test]
        fn generated_ops_are_answered_exactly_as_the_map_path(
            ops in proptest::collection::vec(
                prop_oneof![
                    2 => valid_op(),
                    1 => proptest::collection::vec(member(), 0..7),
                ],
                1..5,
            ),
        ) {
            let ops: Vec<String> = ops
                .into_iter()
                .map(|members| format!("{{{}}}", members.join(", ")))
                .collect();
            let body = format!(r#"{{"ops": [{}]}}"#, ops.join(", "));
            prop_assert_eq!(fast(body.as_bytes(), 10), through_maps(&body, 10), "{}", body);
        }
    }
}
