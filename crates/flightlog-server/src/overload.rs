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
//! journal appends, maintenance, OTLP ingest): one slot per request, taken once its body has
//! arrived and held until its handler has answered. A `503` is given before the request does
//! anything, so it never loses a write that was acknowledged; a write that got its slot runs to
//! its answer as before.
//!
//! Why the slot is taken after the body is read, not before: a slot held while the body
//! arrives is a slot a slow client holds for as long as its body may take (a minute,
//! `gate::BODY_READ_TIMEOUT`). 4,096 connections that each sent a write's head and then a byte
//! every few seconds held every slot, and every other write got 503 for that minute (a
//! durability audit's finding). The bodies being read are bounded by the budgets of bodies in
//! flight instead (see `request_budget`), by the bytes that have arrived of a small one.

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
    if !is_write(method, routed) {
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

/// Whether a request takes a slot of the write limit: a routed request whose method is not
/// `GET`/`HEAD`.
pub(crate) fn is_write(method: &Method, routed: bool) -> bool {
    routed && !is_read_method(method)
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
