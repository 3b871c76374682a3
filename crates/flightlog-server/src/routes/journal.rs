//! The engagement journal endpoints: appends, reads, the summary and board views, compaction,
//! listing and retention.
//!
//! An append's body is `{type, at, data, expectedSeq?}`; the engagement id comes from the path.
//! The body is validated by the core's `AppendInput::from_json` (the same rules and messages as
//! every in-process append), so the wire cannot accept what the library would refuse.

use crate::wire::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use flightlog_core::journal::record::json_integer;
use flightlog_core::journal::{
    reconstruct_board_from_events, AppendInput, BoardEntry, BoardEntryKind, BoardFilter,
    EngagementEvent, EngagementSummary, JournalError, SAFE_INTEGER_LIMIT,
};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{ApiQuery, JsonBody, NoBody, NoMembers, NoQuery, PathId};
use crate::openapi::{tags, ENGAGEMENT_ID, LARGE_RESPONSE_BUSY};
use crate::state::AppState;
use crate::validate::{check_limit, check_time};
use crate::wire::Removed;

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_engagements))
        .routes(routes!(prune))
        .routes(routes!(append, read_events))
        .routes(routes!(summary))
        .routes(routes!(board))
        .routes(routes!(compact))
}

/// Query of `GET /v1/engagements/{engagementId}/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events with `seq >= fromSeq` (0 or more).
    #[serde(default)]
    #[param(minimum = 0)]
    from_seq: Option<i64>,
}

/// Query of `GET /v1/engagements/{engagementId}/board`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct BoardQuery {
    /// Only the entry with this key (blank, `key=`: as if absent, as any blank query
    /// parameter).
    #[serde(default)]
    key: Option<String>,
    /// Only entries of this kind (blank: as if absent).
    #[serde(default)]
    #[param(value_type = Option<BoardEntryKind>)]
    kind: Option<String>,
}

/// Query of `GET /v1/engagements`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// At most this many ids (0 to 10,000; all when absent).
    #[serde(default)]
    #[param(minimum = 0, maximum = 10_000)]
    limit: Option<i64>,
}

/// Body of `POST /v1/engagements/prune`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct EngagementPruneBody {
    /// Engagements whose last event is older than `now` minus the configured maximum age are
    /// deleted (epoch ms). Any JSON number with an integral value, as an append's `at`
    /// (`1000`, `1e3`, `1000.0`).
    #[serde(deserialize_with = "integral_ms")]
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    now: i64,
}

/// A time read as the journal reads an append's `at`: any JSON number whose value is an integer
/// below 2^53 in magnitude, however it is written (`1000`, `1e3`, `1000.0`, `-0`), as the
/// reference's `prune(now)` takes any such number.
fn integral_ms<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    let number = serde_json::Number::deserialize(deserializer)?;
    json_integer(&Value::Number(number.clone())).ok_or_else(|| {
        D::Error::custom(format!(
            "an integer number of epoch milliseconds below 2^53 in magnitude, got {number}"
        ))
    })
}

/// Body of `POST /v1/engagements/{engagementId}/events` as the OpenAPI document describes it.
// Documentation only: the handler takes the body as loose JSON and hands it to
// `AppendInput::from_json`, so the wire applies exactly the library's rules and messages. (A
// `//` comment: the `///` ones are the OpenAPI description, which API readers see.)
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // never built: it only describes what `append_input` accepts
struct EngagementAppendBody {
    /// What happened (`engagement_opened`, `mail_sent`, …); a non-empty string.
    #[serde(rename = "type")]
    #[schema(min_length = 1)]
    event_type: String,
    /// When it happened, epoch milliseconds as the writer states it (an integer below 2^53 in
    /// magnitude).
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    at: i64,
    /// The payload, stored verbatim.
    #[schema(value_type = Object)]
    data: Value,
    /// When given, the append succeeds only if this is the seq it gets (else 409 `conflict`);
    /// `null` is the same as leaving it out.
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    expected_seq: Option<i64>,
    /// May be given only if equal to the path's id.
    #[schema(nullable = false)]
    engagement_id: Option<String>,
}

/// `expectedSeq` written another way: in another case or with `_` or `-` (`expectedseq`,
/// `expected_seq`, `Expected-Seq`), ending in `seq`, `seqs` or `sequence` after `expected` with
/// one letter missing, added or changed (`expectedSeqs`, `expectdSeq`), or after `expect`,
/// `expects`, `expecting` or `excepted` (`expectSeq`). Members that only share letters with it
/// (`expectedKey`, `expectedSet`, `exportedSeq`, `unexpectedSeq`) are dropped as other members
/// are (allowing two edits anywhere refused those; a review's finding).
fn is_expected_seq_misspelt(key: &str) -> bool {
    if key == "expectedSeq" || !(6..=24).contains(&key.len()) {
        return false;
    }
    let folded: String = key
        .chars()
        .filter(|c| !matches!(c, '_' | '-'))
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let Some(prefix) = ["sequence", "seqs", "seq"]
        .into_iter()
        .find_map(|end| folded.strip_suffix(end))
    else {
        return false;
    };
    matches!(prefix, "expect" | "expects" | "expecting" | "excepted")
        || edit_distance(prefix.as_bytes(), b"expected") <= 1
}

/// The fewest single-byte insertions, deletions and substitutions that turn `from` into `to`
/// (Levenshtein), for short member names.
fn edit_distance(from: &[u8], to: &[u8]) -> usize {
    let mut previous: Vec<usize> = (0..=to.len()).collect();
    let mut current = vec![0; to.len() + 1];
    for (i, from_char) in from.iter().enumerate() {
        current[0] = i + 1;
        for (j, to_char) in to.iter().enumerate() {
            let substitution = previous[j] + usize::from(from_char != to_char);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[to.len()]
}

/// An append body's top-level members, each at most once. A JSON object read as a `Value` keeps
/// the last of two members with one name; for `expectedSeq` that silently dropped the guard
/// (`"expectedSeq": 99, "expectedSeq": 0` appended at seq 0), and every other write body refuses
/// a repeated member (serde's `duplicate field`). Members inside `data` are the writer's and
/// stay as JSON reads them (the last wins, as in the reference's `JSON.parse`).
struct AppendMembers(serde_json::Map<String, Value>);

impl<'de> Deserialize<'de> for AppendMembers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = AppendMembers;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object {type, at, data, expectedSeq?}")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<AppendMembers, A::Error> {
                let mut members = serde_json::Map::new();
                while let Some(key) = access.next_key::<String>()? {
                    if members.contains_key(&key) {
                        return Err(serde::de::Error::custom(format_args!(
                            "duplicate field `{key}`"
                        )));
                    }
                    // As written (see `flightlog_core::json_as_written`).
                    let value =
                        access.next_value_seed(flightlog_core::json_as_written::AsWritten)?;
                    members.insert(key, value);
                }
                Ok(AppendMembers(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// Turn the wire body into an [`AppendInput`] for `engagement_id`.
fn append_input(
    engagement_id: &str,
    AppendMembers(mut body): AppendMembers,
) -> Result<AppendInput, ApiError> {
    let expected_seq = match body.remove("expectedSeq") {
        None | Some(Value::Null) => None,
        // Any JSON number that is a whole number (`3`, `3.0`), as JavaScript reads it.
        Some(Value::Number(number)) => match json_integer(&Value::Number(number.clone())) {
            Some(seq) if (0..SAFE_INTEGER_LIMIT).contains(&seq) => Some(seq),
            _ => {
                return Err(ApiError::invalid(format!(
                    "expectedSeq must be an integer from 0 to 2^53 - 1, got {number}"
                )))
            }
        },
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "expectedSeq must be an integer from 0 to 2^53 - 1, got {}",
                flightlog_core::journal::validate::json_kind(Some(&other))
            )))
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
    // Other members are dropped, as the reference's append drops them (a conformance fixture
    // pins it: `"seq": 99, "extra": "dropped"`), unlike every other write body's
    // (ARCHITECTURE, "Deliberate differences"). One exception: a misspelt `expectedSeq` would
    // drop the concurrency check it carries with a 201, so a member that is `expectedSeq` but
    // for case, `_`, `-` or a slip of the pen (see `is_expected_seq_misspelt`) is refused.
    if let Some(misspelt) = body.keys().find(|key| is_expected_seq_misspelt(key)) {
        return Err(ApiError::invalid(format!(
            "unknown field `{misspelt}` in the append body: the guard is spelt `expectedSeq`; \
             nothing was appended"
        )));
    }
    body.insert("engagementId".into(), Value::String(engagement_id.into()));
    let input = AppendInput::from_json(Value::Object(body)).map_err(JournalError::Invalid)?;
    Ok(match expected_seq {
        Some(seq) => input.with_expected_seq(seq),
        None => input,
    })
}

/// Append an event to an engagement's journal.
#[utoipa::path(
    post,
    path = "/v1/engagements/{engagementId}/events",
    tag = tags::JOURNAL,
    operation_id = "appendEngagementEvent",
    params(("engagementId" = String, Path, description = ENGAGEMENT_ID)),
    request_body = EngagementAppendBody,
    responses(
        (status = 201, description = "The event as stored, with its seq.", body = EngagementEvent),
        (status = 400, description = "An invalid event.", body = ErrorBody),
        (status = 409, description = "`conflict`: `expectedSeq` is not the next seq; `journal_full`: the engagement holds the maximum number of events.", body = ErrorBody),
    ),
)]
async fn append(
    _: NoQuery,
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    JsonBody(body): JsonBody<AppendMembers>,
) -> Result<(StatusCode, Json<EngagementEvent>), ApiError> {
    let input = append_input(&engagement_id, body)?;
    let event = state.journal().append(input).await?;
    Ok((StatusCode::CREATED, Json(event)))
}

/// An engagement's events in seq order.
#[utoipa::path(
    get,
    path = "/v1/engagements/{engagementId}/events",
    tag = tags::JOURNAL,
    operation_id = "readEngagementEvents",
    params(("engagementId" = String, Path, description = ENGAGEMENT_ID), EventsQuery),
    responses(
        (status = 200, description = "The events (empty for an unknown engagement).", body = Vec<EngagementEvent>),
        (status = 400, description = "A bad id or query.", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn read_events(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    // As the engagement's stream: a seq is never negative, so a negative start is a mistake
    // to name, not a synonym of 0.
    if query.from_seq.is_some_and(|from| from < 0) {
        return Err(ApiError::invalid("fromSeq must be a non-negative integer"));
    }
    let journal = state.journal();
    let events = match query.from_seq {
        Some(from_seq) => journal.read_from(&engagement_id, from_seq).await?,
        None => journal.read(&engagement_id).await?,
    };
    state.response_budget().json(events).await
}

/// What an engagement's events add up to.
#[utoipa::path(
    get,
    path = "/v1/engagements/{engagementId}/summary",
    tag = tags::JOURNAL,
    operation_id = "summarizeEngagement",
    params(("engagementId" = String, Path, description = ENGAGEMENT_ID)),
    responses(
        (status = 200, description = "The summary.", body = EngagementSummary),
        (status = 400, description = "A bad id.", body = ErrorBody),
        (status = 404, description = "The engagement has no events.", body = ErrorBody),
    ),
)]
async fn summary(
    _: NoQuery,
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

/// An engagement's blackboard as its events leave it.
#[utoipa::path(
    get,
    path = "/v1/engagements/{engagementId}/board",
    tag = tags::JOURNAL,
    operation_id = "readBoard",
    params(("engagementId" = String, Path, description = ENGAGEMENT_ID), BoardQuery),
    responses(
        (status = 200, description = "The entries.", body = Vec<BoardEntry>),
        (status = 400, description = "A bad id or kind.", body = ErrorBody),
        (status = 503, description = LARGE_RESPONSE_BUSY, body = ErrorBody),
    ),
)]
async fn board(
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    ApiQuery(query): ApiQuery<BoardQuery>,
) -> Result<Response, ApiError> {
    let kind = match query.kind.as_deref() {
        None => None,
        Some(text) => Some(BoardEntryKind::parse(text).ok_or_else(|| {
            ApiError::invalid(format!(
                "kind must be one of artifact, todo, note, got {:?}",
                flightlog_core::json_text::echoed(text)
            ))
        })?),
    };
    let filter = BoardFilter {
        key: query.key,
        kind,
    };
    let events = state.journal().read(&engagement_id).await?;
    let board = reconstruct_board_from_events(&events, Some(&filter));
    drop(events);
    state.response_budget().json(board).await
}

/// Compact an engagement's journal when its rules allow (atomic).
#[utoipa::path(
    post,
    path = "/v1/engagements/{engagementId}/compact",
    tag = tags::MAINTENANCE,
    operation_id = "compactEngagement",
    params(("engagementId" = String, Path, description = ENGAGEMENT_ID)),
    request_body = Option<NoMembers>,
    responses(
        (status = 204, description = "Compacted, or left alone by the rules (or unknown)."),
        (status = 400, description = "A bad id, a body with a member (it takes none: send no body, or `{}`), or a budget total of the engagement that is not a finite number (summed past the largest double): the reference's compaction throws a TypeError there, and nothing is changed.", body = ErrorBody),
    ),
)]
async fn compact(
    _: NoQuery,
    State(state): State<AppState>,
    PathId(engagement_id): PathId,
    _: NoBody,
) -> Result<StatusCode, ApiError> {
    // `false` (left alone by the rules, or unknown) is not an error: the reference's `compact`
    // returns nothing either way.
    state.journal().compact(&engagement_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Engagement ids, most recent activity first.
#[utoipa::path(
    get,
    path = "/v1/engagements",
    tag = tags::JOURNAL,
    operation_id = "listEngagements",
    params(ListQuery),
    responses(
        (status = 200, description = "The ids.", body = Vec<String>),
        (status = 400, description = "A bad limit.", body = ErrorBody),
    ),
)]
async fn list_engagements(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<Vec<String>>, ApiError> {
    if let Some(limit) = query.limit {
        check_limit("limit", limit)?;
    }
    Ok(Json(state.journal().list_engagements(query.limit).await?))
}

/// Delete engagements older than the configured maximum age.
#[utoipa::path(
    post,
    path = "/v1/engagements/prune",
    tag = tags::MAINTENANCE,
    operation_id = "pruneEngagements",
    request_body = EngagementPruneBody,
    responses(
        (status = 200, description = "How many engagements were deleted.", body = Removed),
        (status = 400, description = "An invalid time.", body = ErrorBody),
    ),
)]
async fn prune(
    _: NoQuery,
    State(state): State<AppState>,
    JsonBody(body): JsonBody<EngagementPruneBody>,
) -> Result<Json<Removed>, ApiError> {
    check_time("now", body.now)?;
    let removed = state.journal().prune(body.now).await?;
    Ok(Json(Removed { removed }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The body as the route reads it (`JsonBody`), then [`append_input`].
    fn append_from(engagement_id: &str, body: Value) -> Result<AppendInput, ApiError> {
        append_text(engagement_id, &body.to_string())
    }

    fn append_text(engagement_id: &str, text: &str) -> Result<AppendInput, ApiError> {
        crate::extract::parse_json::<AppendMembers>(text.as_bytes())
            .and_then(|members| append_input(engagement_id, members))
    }

    /// A misspelt guard was dropped with a 201 (`expectSeq` too, an audit's finding); the
    /// members the reference's append drops (a conformance fixture sends `seq` and `extra`)
    /// are still dropped.
    #[test]
    fn a_misspelt_expected_seq_is_refused_and_other_members_are_dropped() {
        for misspelt in [
            "expectedseq",
            "expected_seq",
            "Expected-Seq",
            "EXPECTEDSEQ",
            "expectSeq",
            "expectsSeq",
            "expectingSeq",
            "expectedSeqs",
            "expectedSequence",
            "exceptedSeq",
            "expectdSeq",
            "xpectedSeq",
            "expectedsSeq",
        ] {
            let err = append_from("e", json!({"type": "t", "at": 1, "data": {}, misspelt: 3}))
                .expect_err(misspelt);
            assert!(
                err.to_string().contains("the guard is spelt `expectedSeq`"),
                "{misspelt}: {err}"
            );
        }
        for dropped in [
            "seq",
            "extra",
            "expected",
            "sequence",
            "nextSeq",
            "expectedKey",
            "expectedRev",
            "expectedSet",
            "expectedSeen",
            "exportedSeq",
            "respectedSeq",
            "unexpectedSeq",
            "",
        ] {
            append_from("e", json!({"type": "t", "at": 1, "data": {}, dropped: 3}))
                .unwrap_or_else(|err| panic!("{dropped}: {err}"));
        }
        let guarded = append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": 3}),
        )
        .expect("the guard itself");
        assert_eq!(guarded.expected_seq(), Some(3));
    }

    /// A repeated member was read as its last copy: a repeated `expectedSeq` appended without
    /// the guard its first copy set.
    #[test]
    fn a_member_given_twice_is_refused() {
        let err = append_text(
            "e",
            r#"{"type": "t", "at": 1, "data": {}, "expectedSeq": 99, "expectedSeq": 0}"#,
        )
        .err()
        .map(|err| err.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|err| err.contains("duplicate field `expectedSeq`")),
            "{err:?}"
        );
        assert!(append_text("e", r#"{"type": "t", "type": "u", "at": 1, "data": {}}"#).is_err());
        // Inside `data` the writer's object is read as JSON reads it.
        let input = append_text("e", r#"{"type": "t", "at": 1, "data": {"k": 1, "k": 2}}"#);
        assert!(input.is_ok(), "{:?}", input.err());
    }

    #[test]
    fn the_path_supplies_the_engagement_and_expected_seq_is_checked() {
        let input = append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": 3}),
        );
        assert_eq!(
            input
                .as_ref()
                .map(|i| (i.engagement_id(), i.expected_seq())),
            Ok(("e", Some(3)))
        );
        assert!(append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": -1})
        )
        .is_err());
        assert!(append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": "1"})
        )
        .is_err());
        assert!(append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "expectedSeq": 1.5})
        )
        .is_err());
        // A whole number written with a fraction is that integer, as JavaScript reads it.
        assert_eq!(
            append_from(
                "e",
                json!({"type": "t", "at": 1, "data": {}, "expectedSeq": 3.0})
            )
            .map(|i| i.expected_seq()),
            Ok(Some(3))
        );
        assert!(append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "engagementId": "f"})
        )
        .is_err());
        assert!(append_from(
            "e",
            json!({"type": "t", "at": 1, "data": {}, "engagementId": "e"})
        )
        .is_ok());
        assert!(append_from("e", json!([1])).is_err());
        assert_eq!(
            append_from("e", json!({"type": "t", "at": 1, "data": null}))
                .err()
                .map(|e| e.code()),
            Some("invalid_request")
        );
    }
}
