//! The activity maintenance endpoints (the `admin` scope, see `crate::auth`): the boot orphan
//! sweep, the stale-writer sweep and pruning.
//!
//! They act as the request's writer like any write, which matters for `sweep-stale`: a writer
//! never sweeps its own runs, so a caller naming itself in `Flightlog-Writer` spares them.

use axum::routing::post;
use axum::{Json, Router};
use flightlog_core::activity::{PruneOptions, PruneResult};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::extract::{JsonBody, WriterStore};
use crate::state::AppState;
use crate::validate::{check_limit, check_optional_time, check_time};

/// The routes of this module.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/activity/maintenance/sweep-orphans",
            post(sweep_orphans),
        )
        .route("/v1/activity/maintenance/sweep-stale", post(sweep_stale))
        .route("/v1/activity/maintenance/prune", post(prune))
}

/// Body of `POST /v1/activity/maintenance/sweep-stale`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SweepStaleBody {
    stale_after_ms: i64,
    #[serde(default)]
    now: Option<i64>,
}

async fn sweep_orphans(WriterStore(store): WriterStore) -> Result<Json<Value>, ApiError> {
    let closed = store.sweep_own_orphans().await?;
    Ok(Json(json!({ "closed": closed })))
}

async fn sweep_stale(
    WriterStore(store): WriterStore,
    JsonBody(body): JsonBody<SweepStaleBody>,
) -> Result<Json<Value>, ApiError> {
    check_time("staleAfterMs", body.stale_after_ms)?;
    check_optional_time("now", body.now)?;
    let closed = store.sweep_stale(body.stale_after_ms, body.now).await?;
    Ok(Json(json!({ "closed": closed })))
}

async fn prune(
    WriterStore(store): WriterStore,
    JsonBody(options): JsonBody<PruneOptions>,
) -> Result<Json<PruneResult>, ApiError> {
    check_time("digestFloorAt", options.digest_floor_at)?;
    check_time("hardCeilingMs", options.hard_ceiling_ms)?;
    check_optional_time("now", options.now)?;
    if let Some(batch) = options.batch {
        check_limit("batch", batch)?;
    }
    Ok(Json(store.prune(options).await?))
}
