//! The small response bodies the contract spells out inline (`{"ended": bool}`, `{"closed": n}`,
//! …), as types: the handlers serialize them and the OpenAPI document describes them from the same
//! definitions, so the answer and its documentation cannot drift apart.
//!
//! The records themselves (`SpanRow`, `EngagementEvent`, …) are the core's types; only shapes that
//! exist nowhere but on the wire live here.

use serde::Serialize;
use utoipa::ToSchema;

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
}
