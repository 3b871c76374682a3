//! The memory budget of large run snapshots on their way to clients.
//!
//! Why it exists: a run snapshot (`GET /v1/activity/runs/{runId}/snapshot`, and the first event
//! of a run stream) is one JSON document, serialized whole before it is sent. A client that
//! stops reading keeps it in the server's memory for as long as its connection lives: a run of
//! 20,000 spans with 2 KB of attributes each is a 48 MB snapshot, and ten such clients held
//! half a gigabyte (found by the stream audit). Everything else a slow client is sent is
//! bounded (streams read the log a page at a time, only when the socket took the last one).
//!
//! So a snapshot over [`SMALL_SNAPSHOT_BYTES`] takes its size from a shared budget
//! ([`ServerConfig::snapshot_budget_bytes`](crate::state::ServerConfig), 256 MiB by default)
//! until the server has handed it to the socket; when the budget is taken by snapshots other
//! clients are not reading, the request waits up to [`BUDGET_WAIT`], then gets `503
//! unavailable` with `Retry-After`: what a slow client costs is bounded, and nobody else waits
//! on it. Small snapshots (nearly all) never touch the budget.
//!
//! "Handed to the socket": the permit lives in the response body until the body is polled
//! again after the snapshot's chunk. hyper polls a body for more only when its write buffer has
//! room, that is once most of the chunk has been written (and drops the body when the
//! connection goes away), so the permit is held while the snapshot's bytes are in this
//! process's memory, not while they sit in the kernel's socket buffer.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Snapshots up to this size are sent without the budget.
pub const SMALL_SNAPSHOT_BYTES: usize = 1 << 20;
/// The budget is counted in units of this many bytes.
const UNIT_BYTES: usize = 1 << 16;
/// How long a large snapshot waits for budget before its request is answered 503.
pub const BUDGET_WAIT: Duration = Duration::from_millis(500);

/// The shared budget (one per server).
#[derive(Debug, Clone)]
pub struct SnapshotBudget {
    units: Arc<Semaphore>,
    total_units: u32,
}

impl SnapshotBudget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: usize) -> Self {
        // `Semaphore::MAX_PERMITS` is far above `u32::MAX` on 64-bit targets.
        let most = u32::try_from(Semaphore::MAX_PERMITS).unwrap_or(u32::MAX);
        let total_units = u32::try_from((bytes / UNIT_BYTES).max(1))
            .unwrap_or(u32::MAX)
            .min(most);
        Self {
            units: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
        }
    }

    /// Room for a serialized snapshot of `len` bytes: `None` for a small one (no budget
    /// needed), a permit for a large one, or 503 when other clients' snapshots hold the budget
    /// for longer than [`BUDGET_WAIT`]. A snapshot larger than the whole budget takes all of it
    /// (so it is served when nothing else is in flight).
    pub async fn reserve(&self, len: usize) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
        if len <= SMALL_SNAPSHOT_BYTES {
            return Ok(None);
        }
        let wanted = u32::try_from(len.div_ceil(UNIT_BYTES))
            .unwrap_or(u32::MAX)
            .min(self.total_units);
        let acquire = Arc::clone(&self.units).acquire_many_owned(wanted);
        match tokio::time::timeout(BUDGET_WAIT, acquire).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            // Closed (never, the semaphore is never closed) or timed out.
            _ => Err(ApiError::Unavailable(format!(
                "the server is holding its budget of large snapshots for clients that have not \
                 read them yet; this {len}-byte snapshot would exceed it: retry shortly"
            ))),
        }
    }

    /// Budget units free now (for tests and metrics).
    pub fn available_units(&self) -> usize {
        self.units.available_permits()
    }
}

/// A JSON response of already serialized `json`, holding `permit` (if any) until the body has
/// been handed to the socket (see the module doc). A large one goes out chunked, so hyper keeps
/// the body until it has written it.
pub fn json_response(json: Bytes, permit: Option<OwnedSemaphorePermit>) -> Response {
    let body = match permit {
        None => Body::from(json),
        Some(permit) => Body::new(BudgetedBody {
            data: Some(json),
            permit: Some(permit),
        }),
    };
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// One chunk, then the end; the permit goes when the end is polled (or the body dropped).
struct BudgetedBody {
    data: Option<Bytes>,
    permit: Option<OwnedSemaphorePermit>,
}

impl http_body::Body for BudgetedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        match self.data.take() {
            Some(data) => Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            None => {
                self.permit = None;
                Poll::Ready(None)
            }
        }
    }

    // Not the end until polled once more: hyper would otherwise drop the body (and the permit)
    // as soon as the chunk is queued, before it is written.
    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.permit.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn small_snapshots_take_nothing_and_large_ones_wait_then_get_503() {
        let budget = SnapshotBudget::new(4 << 20);
        let total = budget.available_units();
        assert_eq!(total, 64);
        assert!(matches!(
            budget.reserve(SMALL_SNAPSHOT_BYTES).await,
            Ok(None)
        ));
        assert_eq!(budget.available_units(), total);
        let first = budget.reserve(3 << 20).await;
        let Ok(Some(first)) = first else {
            panic!("room for the first: {first:?}");
        };
        assert_eq!(budget.available_units(), 16);
        let refused = budget.reserve(2 << 20).await;
        assert!(
            matches!(refused, Err(ApiError::Unavailable(_))),
            "{refused:?}"
        );
        drop(first);
        assert_eq!(budget.available_units(), total);
        // Larger than the whole budget: takes all of it.
        let huge = budget.reserve(100 << 20).await;
        assert!(matches!(huge, Ok(Some(_))), "{huge:?}");
        assert_eq!(budget.available_units(), 0);
    }
}
