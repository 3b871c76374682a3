//! The small response bodies the contract spells out inline (`{"ended": bool}`, `{"closed": n}`,
//! …), as types: the handlers serialize them and the OpenAPI document describes them from the same
//! definitions, so the answer and its documentation cannot drift apart.
//!
//! The records themselves (`SpanRow`, `EngagementEvent`, …) are the core's types; only shapes that
//! exist nowhere but on the wire live here.

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;

/// A JSON answer: what `axum::Json` answers, written into one buffer of the usual answer's size.
///
/// `axum::Json` starts its buffer at 128 bytes and grows it as serde_json writes (a span row
/// or an event answer, 350 – 450 bytes, is copied twice on the way); this starts at
/// [`ANSWER_CAPACITY`] bytes. The bytes are serde_json's, the same as `axum::Json` sends. A value
/// that fails to serialize (it cannot: these are plain records) answers the contract's 500.
#[derive(Debug, Clone, Copy)]
pub struct Json<T>(pub T);

/// The buffer a [`Json`] answer starts with: room for a span row with small attributes.
pub const ANSWER_CAPACITY: usize = 512;

impl<T: Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        let mut body = Vec::with_capacity(ANSWER_CAPACITY);
        match serde_json::to_writer(&mut body, &self.0) {
            Ok(()) => {
                let mut response = Response::new(Body::from(body));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                response
            }
            Err(err) => {
                ApiError::Internal(format!("the answer could not be written as JSON: {err}"))
                    .into_response()
            }
        }
    }
}

/// Answer of `POST /v1/activity/spans/{spanId}/end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Ended {
    /// `false`: the span was already terminal, or is unknown; nothing was written.
    pub ended: bool,
}

/// Answer of `PATCH /v1/activity/spans/{spanId}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Patched {
    /// `false`: the span is terminal or unknown; nothing was written.
    pub patched: bool,
}

/// Answer of a call that closes spans (`close`, the sweeps): how many it closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Closed {
    /// Spans closed by this call.
    pub closed: i64,
}

/// Answer of `GET /v1/activity/runs/{runId}/seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HighWaterSeq {
    /// The run's highest change-logged `seq` (0 for a run without changes).
    pub high_water_seq: i64,
}

/// Answer of `GET /v1/activity/cursor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeCursor {
    /// The highest `changeId` still in the log (0 when it is empty; it can go down after a
    /// prune).
    pub change_cursor: i64,
}

/// Answer of `POST /v1/engagements/prune`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Removed {
    /// Engagements deleted.
    pub removed: u64,
}

/// Answer of `GET /healthz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok` while the server runs.
    #[schema(example = "ok")]
    pub status: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_inline_bodies_keep_the_contract_spelling() {
        let bodies = [
            (json!(Ended { ended: true }), json!({"ended": true})),
            (json!(Patched { patched: false }), json!({"patched": false})),
            (json!(Closed { closed: 2 }), json!({"closed": 2})),
            (
                json!(HighWaterSeq { high_water_seq: 3 }),
                json!({"highWaterSeq": 3}),
            ),
            (
                json!(ChangeCursor { change_cursor: 4 }),
                json!({"changeCursor": 4}),
            ),
            (json!(Removed { removed: 5 }), json!({"removed": 5})),
            (json!(Health { status: "ok" }), json!({"status": "ok"})),
        ];
        for (body, expected) in bodies {
            assert_eq!(body, expected);
        }
    }

    /// [`Json`] answers what `axum::Json` answers: the same bytes (serde_json's), status 200
    /// and `application/json`, whether the value fits its first buffer or not.
    #[tokio::test]
    async fn json_answers_as_axum_json_does() {
        let small = json!({"spanId": "s\u{1}\"q\"", "n": 1.5, "ok": true, "text": "é – 🚀"});
        let large = json!({"text": "x\n".repeat(ANSWER_CAPACITY), "list": [1, 2, 3]});
        for value in [small, large, json!(Ended { ended: true })] {
            let ours = Json(&value).into_response();
            let theirs = axum::Json(&value).into_response();
            assert_eq!(ours.status(), theirs.status());
            assert_eq!(
                ours.headers().get(CONTENT_TYPE),
                theirs.headers().get(CONTENT_TYPE)
            );
            assert_eq!(ours.headers().len(), 1, "{:?}", ours.headers());
            let ours = axum::body::to_bytes(ours.into_body(), usize::MAX).await;
            let theirs = axum::body::to_bytes(theirs.into_body(), usize::MAX).await;
            assert_eq!(ours.expect("our body"), theirs.expect("axum's body"));
        }
    }
}
