//! The write limit: at most `max_inflight_writes` write requests are handled at once, and one
//! that finds no free slot within `write_wait` is answered `503 unavailable` with `Retry-After`
//! instead of joining an ever-growing queue.
//!
//! Why here and not only in the store: the SQLite store's write queue is bounded too, but a full
//! queue makes `write()` *wait*, so without this limit every request of an overload would sit in
//! memory (its body included) for as long as the backlog lasts. The limit turns that into a fast,
//! explicit "retry later" that a client can act on. With the default limit (4,096) below the
//! store's queue capacity (16,384), HTTP writes alone never fill that queue; the store's own
//! backpressure remains for in-process writers.
//!
//! A write is any routed request whose method is not `GET`/`HEAD` (activity writes, the batch,
//! journal appends, maintenance, OTLP ingest): one slot per request, held until its handler has
//! answered, including while its body is read (so bodies in flight are bounded too). A `503` is
//! given before the request does anything, so it never loses a write that was acknowledged; a
//! write that got its slot runs to its answer as before.

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::is_read_method;
use crate::error::ApiError;
use crate::state::AppState;

/// The write-limit check of [`crate::gate`]: for a routed write, a slot to hold until the answer
/// (`Ok(Some)`), or the `503` error when none came free in time; reads pass (`Ok(None)`).
pub(crate) async fn take_write_slot(
    state: &AppState,
    method: &Method,
    routed: bool,
) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
    if !routed || is_read_method(method) {
        return Ok(None);
    }
    let config = state.config();
    match acquire(state.write_permits(), config.write_wait).await {
        Some(permit) => Ok(Some(permit)),
        None => {
            state.metrics().write_refused();
            Err(ApiError::Unavailable(format!(
                "the server is handling its limit of {} writes; retry later",
                config.max_inflight_writes
            )))
        }
    }
}

/// The most write requests handled at once (the configured limit, capped as the semaphore is).
pub(crate) fn write_limit(state: &AppState) -> usize {
    state
        .config()
        .max_inflight_writes
        .min(Semaphore::MAX_PERMITS)
}

/// How many write requests hold a slot now (read at scrape time by `GET /metrics`).
pub(crate) fn writes_in_flight(state: &AppState) -> usize {
    write_limit(state).saturating_sub(state.write_permits().available_permits())
}

/// A slot from `permits`, waiting at most `wait`; `None` when none came free in time.
async fn acquire(permits: &Arc<Semaphore>, wait: Duration) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
        return Some(permit);
    }
    match tokio::time::timeout(wait, Arc::clone(permits).acquire_owned()).await {
        Ok(Ok(permit)) => Some(permit),
        // Timed out, or the semaphore was closed (it never is): either way, no slot.
        Ok(Err(_)) | Err(_) => None,
    }
}
