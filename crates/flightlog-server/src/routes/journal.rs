//! The engagement journal endpoints: appends, reads, the summary and board views, compaction,
//! listing and retention.
//!
//! An append's body is `{type, at, data, expectedSeq?}`; the engagement id comes from the path.
//! The body is validated by the core's `AppendInput::from_json` (the same rules and messages as
//! every in-process append), so the wire cannot accept what the library would refuse.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use flightlog_core::journal::{
    reconstruct_board_from_events, AppendInput, BoardEntry, BoardEntryKind, BoardFilter,
    EngagementEvent, EngagementSummary, JournalError, SAFE_INTEGER_LIMIT,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::{ApiQuery, JsonBody, PathId};
use crate::state::AppState;
use crate::validate::{check_limit, check_time};

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/engagements", get(list_engagements))
        .route("/v1/engagements/prune", post(prune))
        .route(
            "/v1/engagements/{engagementId}/events",
            post(append).get(read_events),
        )
        .route("/v1/engagements/{engagementId}/summary", get(summary))
        .route("/v1/engagements/{engagementId}/board", get(board))
        .route("/v1/engagements/{engagementId}/compact", post(compact))
}

/// Query of `GET /v1/engagements/{engagementId}/events`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventsQuery {
    /// Only events with `seq >= fromSeq`.
    #[serde(default)]
    from_seq: Option<i64>,
}

/// Query of `GET /v1/engagements/{engagementId}/board`.
#[derive(Debug, Deserialize)]
struct BoardQuery {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    kind: Option<String>,
}

/// Query of `GET /v1/engagements`.
#[derive(Debug, Deserialize)]
struct ListQuery {
    #[serde(default)]
    limit: Option<i64>,
}

/// Body of `POST /v1/engagements/prune`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneBody {
    now: i64,
}

/// Turn the wire body into an [`AppendInput`] for `engagement_id`.
fn append_input(engagement_id: &str, body: Value) -> Result<AppendInput, ApiError> {
    let Value::Object(mut body) = body else {
        return Err(ApiError::invalid(
            "an append body must be a JSON object {type, at, data, expectedSeq?}",
        ));
    };
    let expected_seq = match body.remove("expectedSeq") {
        None | Some(Value::Null) => None,
        Some(Value::Number(number)) => match number.as_i64() {
            Some(seq) if (0..SAFE_INTEGER_LIMIT).contains(&seq) => Some(seq),
            _ => {
                return Err(ApiError::invalid(format!(
                    "expectedSeq must be an integer from 0 to 2^53 - 1, got {number}"
                )))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "expectedSeq must be an integer from 0 to 2^53 - 1",
            ))
        }
    };
    match body.get("engagementId") {
        None => {}
        Some(Value::String(id)) if id == engagement_id => {}
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "the body's engagementId {other} differs from the path's {engagement_id:?}; \
                 leave it out"
            )))
        }
    }
    body.insert("engagementId".into(), Value::String(engagement_id.into()));
    let input = AppendInput::from_json(Value::Object(body)).map_err(JournalError::Invalid)?;
    Ok(match expected_seq {
        Some(seq) => input.with_expected_seq(seq),
        None => input,
    })
}

async fn append(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    JsonBody(body): JsonBody<Value>,
) -> Result<(StatusCode, Json<EngagementEvent>), ApiError> {
    let input = append_input(&engagement_id, body)?;
    let event = state.journal().append(input).await?;
    Ok((StatusCode::CREATED, Json(event)))
}

async fn read_events(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<Vec<EngagementEvent>>, ApiError> {
    let journal = state.journal();
    let events = match query.from_seq {
        Some(from_seq) => journal.read_from(&engagement_id, from_seq).await?,
        None => journal.read(&engagement_id).await?,
    };
    Ok(Json(events))
}

async fn summary(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
) -> Result<Json<EngagementSummary>, ApiError> {
    state
        .journal()
        .summarize(&engagement_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("engagement {engagement_id:?} has no events")))
}

async fn board(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    ApiQuery(query): ApiQuery<BoardQuery>,
) -> Result<Json<Vec<BoardEntry>>, ApiError> {
    let kind = match query.kind.as_deref() {
        None => None,
        Some(text) => Some(BoardEntryKind::parse(text).ok_or_else(|| {
            ApiError::invalid(format!(
                "kind must be one of artifact, todo, note, got {text:?}"
            ))
        })?),
    };
    let filter = BoardFilter {
        key: query.key,
        kind,
    };
    let events = state.journal().read(&engagement_id).await?;
    Ok(Json(reconstruct_board_from_events(&events, Some(&filter))))
}

async fn compact(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
) -> Result<StatusCode, ApiError> {
    // `false` (left alone by the rules, or unknown) is not an error: the reference's `compact`
    // returns nothing either way.
    state.journal().compact(&engagement_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_engagements(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<Vec<String>>, ApiError> {
    if let Some(limit) = query.limit {
        check_limit("limit", limit)?;
    }
    Ok(Json(state.journal().list_engagements(query.limit).await?))
}

async fn prune(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<PruneBody>,
) -> Result<Json<Value>, ApiError> {
    check_time("now", body.now)?;
    let removed = state.journal().prune(body.now).await?;
    Ok(Json(json!({ "removed": removed })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_supplies_the_engagement_and_expected_seq_is_checked() {
        let input = append_input(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": 3}),
        );
        assert_eq!(
            input
                .as_ref()
                .map(|i| (i.engagement_id(), i.expected_seq())),
            Ok(("e", Some(3)))
        );
        assert!(append_input(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": -1})
        )
        .is_err());
        assert!(append_input(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": "1"})
        )
        .is_err());
        assert!(append_input(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "engagementId": "f"})
        )
        .is_err());
        assert!(append_input(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "engagementId": "e"})
        )
        .is_ok());
        assert!(append_input("e", json!([1])).is_err());
        assert_eq!(
            append_input("e", json!({"type": "t", "at": 1, "data": null}))
                .err()
                .map(|e| e.code()),
            Some("invalid_request")
        );
    }
}
