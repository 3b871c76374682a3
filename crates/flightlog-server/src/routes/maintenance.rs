//! The activity maintenance endpoints (the `admin` scope, see `crate::auth`): the reference's
//! orphan sweep (on demand; the server's own boot runs `sweep_previous_lives`), the
//! stale-writer sweep and pruning.
//!
//! They act as the request's writer like any write, which matters for `sweep-stale`: a writer
//! never sweeps its own runs, so a caller naming itself in `Flightlog-Writer` spares them.
//! Without the header `sweep-stale` acts as the maintenance identity, which spares no one (as
//! the scheduled sweep does), not as the server's own: runs written without the header carry
//! that one, and would be spared by every sweep called without it.

use crate::wire::Json;
use flightlog_core::activity::{PruneOptions, PruneResult};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonBody, NoBody, NoMembers, NoQuery, SweeperStore, WriterStore};
use crate::openapi::tags;
use crate::state::AppState;
use crate::validate::{check_limit, check_optional_time, check_time};
use crate::wire::Closed;

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(sweep_orphans))
        .routes(routes!(sweep_stale))
        .routes(routes!(prune))
}

/// Body of `POST /v1/activity/maintenance/sweep-stale`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SweepStaleBody {
    /// A run whose open root's heartbeat (or start) is older than this many ms is closed.
    #[serde(deserialize_with = "flightlog_core::json_number::integral_i64")]
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    stale_after_ms: i64,
    /// The time to judge at (epoch ms); defaults to the server's clock.
    #[serde(
        default,
        deserialize_with = "flightlog_core::json_number::optional_integral_i64"
    )]
    #[schema(minimum = -9_007_199_254_740_991_i64, maximum = 9_007_199_254_740_991_i64)]
    now: Option<i64>,
}

/// Close every run with an open `session`-origin span as `interrupted` (`sweepOwnOrphans`).
#[utoipa::path(
    post,
    path = "/v1/activity/maintenance/sweep-orphans",
    tag = tags::MAINTENANCE,
    operation_id = "sweepOwnOrphans",
    params(WriterStore),
    request_body = Option<NoMembers>,
    responses(
        (status = 200, description = "How many spans were closed.", body = Closed),
        (status = 400, description = "A body with a member (it takes none: send no body, or `{}`).", body = ErrorBody),
    ),
)]
async fn sweep_orphans(
    _: NoQuery,
    WriterStore(store): WriterStore,
    _: NoBody,
) -> Result<Json<Closed>, ApiError> {
    let closed = store.sweep_own_orphans().await?;
    Ok(Json(Closed { closed }))
}

/// Close runs of *other* writers whose open root went silent (`sweepStale`).
#[utoipa::path(
    post,
    path = "/v1/activity/maintenance/sweep-stale",
    tag = tags::MAINTENANCE,
    operation_id = "sweepStale",
    params(SweeperStore),
    request_body = SweepStaleBody,
    responses(
        (status = 200, description = "How many spans were closed.", body = Closed),
        (status = 400, description = "An invalid input.", body = ErrorBody),
    ),
)]
async fn sweep_stale(
    _: NoQuery,
    SweeperStore(store): SweeperStore,
    JsonBody(body): JsonBody<SweepStaleBody>,
) -> Result<Json<Closed>, ApiError> {
    check_time("staleAfterMs", body.stale_after_ms)?;
    check_optional_time("now", body.now)?;
    let closed = store.sweep_stale(body.stale_after_ms, body.now).await?;
    Ok(Json(Closed { closed }))
}

/// Delete the detail of finished runs behind the digest floor or the hard ceiling (`prune`).
/// Beyond the reference: a run of OTLP spans alone whose root never arrived (no rollup) is pruned
/// by the hard ceiling once none of its spans is open and its newest is older than it, leaving a
/// digest rollup (no outcome, failure reason `root never arrived`); `runsPruned` counts it.
#[utoipa::path(
    post,
    path = "/v1/activity/maintenance/prune",
    tag = tags::MAINTENANCE,
    operation_id = "pruneActivity",
    params(WriterStore),
    request_body = PruneOptions,
    responses(
        (status = 200, description = "What was removed.", body = PruneResult),
        (status = 400, description = "An invalid input.", body = ErrorBody),
    ),
)]
async fn prune(
    _: NoQuery,
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
