//! The memory budget of large JSON responses (run snapshots above all), from before a snapshot
//! is read until the bytes are handed to the socket.
//!
//! Why it exists: a response is one JSON document, serialized whole before it is sent. Two ways
//! that held unbounded memory:
//! - a client that stops reading keeps its response in the server for as long as its connection
//!   lives: ten such clients of a 48 MB run snapshot held half a gigabyte (the stream audit), and
//!   a page of 10,000 changes of spans with large attrs is as big;
//! - clients that ask for the same huge run at once each have it read and serialized: eight
//!   clients of a run of 20,000 spans with 20 KB of attrs each (a 398 MiB snapshot) drove the
//!   server's anonymous memory to 6.9 GB, and six of them were then refused anyway.
//!
//! So a response over [`SMALL_RESPONSE_BYTES`] holds its size of a shared budget
//! ([`ServerConfig::response_budget_bytes`](crate::state::ServerConfig), 256 MiB by default,
//! `--response-budget`) until it is handed to the socket, giving it back chunk by chunk (a run
//! stream's snapshot event too: its data goes out in the same chunks, see `sse`). A run
//! snapshot (`GET /v1/activity/runs/{runId}/snapshot`, a run stream's first event) takes the
//! store's estimate of its size ([`ActivityStore::snapshot_size_estimate`], from stored sizes,
//! without reading the values) *before* it is read, set to its real size once serialized; a
//! change page is read in parts and holds its size so far and two parts more before each part
//! after its first (and stops at 32 MiB: each change repeats its span's row); the other large
//! responses (listings, open and stuck roots, journal reads) are bounded in count by their
//! limits and by the store's places for long reads, and are charged once serialized. When the budget is taken, the request waits up to [`BUDGET_WAIT`], then
//! gets `503 unavailable` with `Retry-After` (a snapshot: before anything is read, unless its
//! estimate was low): what slow and simultaneous clients cost is bounded, and nobody else waits
//! on them for long; a client that reads nothing at all is disconnected after the write-stall
//! limit (see `write_stall`), which gives its share back. A response
//! larger than the whole budget takes all of it, so it is served alone. Small responses (nearly
//! all) never touch the budget.
//!
//! Serialization writes into chunks of [`CHUNK_BYTES`] (no copy of the whole document while it
//! grows); a snapshot's is draining: each span and event is dropped as soon as its JSON is
//! written, so a snapshot's peak is about its JSON size, not its rows plus its JSON plus a
//! reallocation.
//!
//! "Handed to the socket": hyper polls a body for its next chunk only when its write buffer has
//! room, that is once most of the last chunk has been written (and drops the body when the
//! connection goes away); the budget of a chunk goes back when the chunk after it is polled, so
//! it is held while the bytes are in this process's memory, not in the kernel's socket buffer.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use flightlog_core::activity::{ActivityStore, RunSnapshot};
use serde::ser::{SerializeStruct, Serializer};
use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;

use crate::byte_budget::ByteBudget;

use crate::error::ApiError;

/// Responses up to this size are sent without the budget.
pub const SMALL_RESPONSE_BYTES: usize = 1 << 20;
/// The budget is counted in units of this many bytes.
const UNIT_BYTES: usize = 1 << 16;
/// What [`ResponseBudget::usage`] reports.
pub use crate::byte_budget::BudgetUsage;
/// How long a large response waits for budget before its request is answered 503.
pub use crate::byte_budget::BUDGET_WAIT;
/// A serialized response is kept in chunks of this size.
pub const CHUNK_BYTES: usize = 1 << 20;

/// The shared budget (one per server).
#[derive(Debug, Clone)]
pub struct ResponseBudget {
    bytes: ByteBudget,
}

impl ResponseBudget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: usize) -> Self {
        Self {
            bytes: ByteBudget::new(bytes, UNIT_BYTES),
        }
    }

    /// `units` more, waiting at most [`BUDGET_WAIT`]; 503 when they do not come.
    async fn acquire(&self, units: u32, len: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        self.bytes.acquire(units).await.ok_or_else(|| {
            ApiError::Unavailable(format!(
                "the server is holding its budget of large responses for other clients; this \
                 response of about {len} bytes would exceed it: retry shortly"
            ))
        })
    }

    /// Room for a response of `len` bytes: `None` for a small one (no budget needed), a permit
    /// for a large one, or 503 when other clients' responses hold the budget for longer than
    /// [`BUDGET_WAIT`]. A response larger than the whole budget takes all of it (so it is served
    /// when nothing else is in flight).
    pub async fn reserve(&self, len: usize) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
        if len <= SMALL_RESPONSE_BYTES {
            return Ok(None);
        }
        self.acquire(self.bytes.units_for(len), len).await.map(Some)
    }

    /// Set what `reserved` (taken for an estimate) holds to a serialized size of `len` bytes:
    /// the surplus goes back; a shortfall is taken as [`Self::reserve`] would, 503 included.
    pub async fn settle(
        &self,
        reserved: Option<OwnedSemaphorePermit>,
        len: usize,
    ) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
        if len <= SMALL_RESPONSE_BYTES {
            return Ok(None);
        }
        let wanted = self.bytes.units_for(len) as usize;
        let Some(mut permit) = reserved else {
            return self.reserve(len).await;
        };
        let held = permit.num_permits();
        if held > wanted {
            keep_at_most(&mut permit, wanted);
        } else if held < wanted {
            let more = u32::try_from(wanted - held).unwrap_or(u32::MAX);
            permit.merge(self.acquire(more, len).await?);
        }
        Ok(Some(permit))
    }

    /// A run's snapshot read after its estimated size was taken from the budget (see the
    /// module doc); `None` for an unknown run.
    pub async fn read_snapshot(
        &self,
        store: &dyn ActivityStore,
        run_id: &str,
    ) -> Result<Option<(RunSnapshot, Option<OwnedSemaphorePermit>)>, ApiError> {
        let estimate = store.snapshot_size_estimate(run_id).await?;
        let reserved = self
            .reserve(usize::try_from(estimate).unwrap_or(usize::MAX))
            .await?;
        Ok(store
            .snapshot_run(run_id)
            .await?
            .map(|snapshot| (snapshot, reserved)))
    }

    /// `value` as a JSON response, holding its size of the budget (when large) until it is
    /// handed to the socket; 503 when the budget stays taken. `value` is dropped once
    /// serialized.
    pub async fn json<T: Serialize>(&self, value: T) -> Result<Response, ApiError> {
        let json = ChunkedJson::of(&value)?;
        drop(value);
        let permit = self.settle(None, json.len()).await?;
        Ok(json_response(json, permit))
    }

    /// `json` (serialized already, after `reserved` was taken for it, if anything was) as a
    /// JSON response holding its size of the budget, as [`Self::settle`] sets it.
    pub async fn serialized(
        &self,
        json: ChunkedJson,
        reserved: Option<OwnedSemaphorePermit>,
    ) -> Result<Response, ApiError> {
        let permit = self.settle(reserved, json.len()).await?;
        Ok(json_response(json, permit))
    }

    /// The answer of writes already made, `value`, as a JSON response holding its size of the
    /// budget, with `reserved` (what [`Self::reserve`] took for its estimate before the writes)
    /// set to it: the surplus goes back, and a shortfall is taken only if it is free now. Never
    /// refused: a 503 says nothing was written, and a client retrying would write it all twice.
    /// `value` is dropped once serialized.
    pub fn json_after_writes<T: Serialize>(
        &self,
        value: T,
        reserved: Option<OwnedSemaphorePermit>,
    ) -> Result<Response, ApiError> {
        let json = ChunkedJson::of(&value)?;
        drop(value);
        let wanted = if json.len() <= SMALL_RESPONSE_BYTES {
            0
        } else {
            self.bytes.units_for(json.len()) as usize
        };
        let mut permit = reserved;
        let held = permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        if held > wanted {
            if let Some(permit) = permit.as_mut() {
                keep_at_most(permit, wanted);
            }
        } else if held < wanted {
            let more = u32::try_from(wanted - held).unwrap_or(u32::MAX);
            if let Some(extra) = self.bytes.try_acquire(more) {
                match permit.as_mut() {
                    Some(permit) => permit.merge(extra),
                    None => permit = Some(extra),
                }
            }
        }
        let permit = permit.filter(|permit| permit.num_permits() > 0);
        Ok(json_response(json, permit))
    }

    /// Budget units free now (for tests).
    pub fn available_units(&self) -> usize {
        self.bytes.available_units()
    }

    /// The whole budget in bytes, what answers hold of it now, and how many answers it has
    /// refused (for `/metrics`).
    pub fn usage(&self) -> BudgetUsage {
        self.bytes.usage()
    }
}

/// A JSON document serialized into chunks of [`CHUNK_BYTES`] (see the module doc).
#[derive(Debug)]
pub struct ChunkedJson {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl ChunkedJson {
    /// Serialize `value`.
    pub fn of<T: Serialize>(value: &T) -> Result<Self, ApiError> {
        let mut writer = ChunkWriter::default();
        serde_json::to_writer(&mut writer, value)
            .map_err(|err| ApiError::Internal(err.to_string()))?;
        Ok(writer.finish())
    }

    /// Serialize `snapshot`, dropping each span and event once written.
    pub fn drain(snapshot: RunSnapshot) -> Result<Self, ApiError> {
        Self::of(&Draining(RefCell::new(Some(snapshot))))
    }

    /// Bytes in all.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for no bytes (never for a serialized document).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunks of the document, in order.
    pub fn into_chunks(self) -> VecDeque<Bytes> {
        self.chunks
    }
}

/// A JSON array serialized part by part (a page read from the store in parts), into the same
/// chunks as [`ChunkedJson::of`] would write the whole array.
pub struct JsonArray {
    writer: ChunkWriter,
    items: usize,
}

impl Default for JsonArray {
    fn default() -> Self {
        let mut writer = ChunkWriter::default();
        writer.current.push(b'[');
        writer.len = 1;
        Self { writer, items: 0 }
    }
}

impl JsonArray {
    /// Append `items`, each dropped once written.
    pub fn extend<T: Serialize>(&mut self, items: Vec<T>) -> Result<(), ApiError> {
        for item in items {
            if self.items > 0 {
                std::io::Write::write_all(&mut self.writer, b",")
                    .map_err(|err| ApiError::Internal(err.to_string()))?;
            }
            serde_json::to_writer(&mut self.writer, &item)
                .map_err(|err| ApiError::Internal(err.to_string()))?;
            self.items += 1;
        }
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.writer.len
    }

    /// True before anything was written (never: the array's `[` is written at once).
    pub fn is_empty(&self) -> bool {
        self.writer.len == 0
    }

    /// The whole array.
    pub fn finish(mut self) -> ChunkedJson {
        self.writer.current.push(b']');
        self.writer.len += 1;
        self.writer.finish()
    }
}

/// An `io::Write` into chunks of [`CHUNK_BYTES`].
#[derive(Default)]
struct ChunkWriter {
    done: VecDeque<Bytes>,
    current: Vec<u8>,
    len: usize,
}

impl ChunkWriter {
    fn finish(mut self) -> ChunkedJson {
        if !self.current.is_empty() {
            self.done.push_back(Bytes::from(self.current));
        }
        ChunkedJson {
            chunks: self.done,
            len: self.len,
        }
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, mut buf: &[u8]) -> std::io::Result<usize> {
        let written = buf.len();
        self.len += written;
        while !buf.is_empty() {
            // The chunk grows as a `Vec` does (a small answer takes a small allocation), by
            // doubling from a power of two, so its capacity meets `CHUNK_BYTES` exactly.
            let room = CHUNK_BYTES - self.current.len();
            let (now, later) = buf.split_at(room.min(buf.len()));
            self.current.extend_from_slice(now);
            buf = later;
            if self.current.len() == CHUNK_BYTES {
                self.done
                    .push_back(Bytes::from(std::mem::take(&mut self.current)));
            }
        }
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serializes a snapshot as its derived `Serialize` does (the same fields, names and order:
/// a test holds them equal), taking its spans and events out and dropping each once written.
struct Draining(RefCell<Option<RunSnapshot>>);

impl Serialize for Draining {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some(snapshot) = self.0.borrow_mut().take() else {
            return Err(serde::ser::Error::custom("a snapshot is serialized once"));
        };
        let RunSnapshot {
            run_id,
            spans,
            events,
            high_water_seq,
            change_cursor,
        } = snapshot;
        let mut fields = serializer.serialize_struct("RunSnapshot", 5)?;
        fields.serialize_field("runId", &run_id)?;
        fields.serialize_field("spans", &DrainingSeq(RefCell::new(spans)))?;
        fields.serialize_field("events", &DrainingSeq(RefCell::new(events)))?;
        fields.serialize_field("highWaterSeq", &high_water_seq)?;
        fields.serialize_field("changeCursor", &change_cursor)?;
        fields.end()
    }
}

/// A sequence serialized by value: each item is dropped once written.
struct DrainingSeq<T>(RefCell<Vec<T>>);

impl<T: Serialize> Serialize for DrainingSeq<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(std::mem::take(&mut *self.0.borrow_mut()))
    }
}

/// A JSON response of a serialized document, holding `permit` (if any) for the bytes not yet
/// handed to the socket (see the module doc). A large one goes out chunked.
pub fn json_response(json: ChunkedJson, permit: Option<OwnedSemaphorePermit>) -> Response {
    let body = match (permit, json.chunks.len()) {
        (None, 0) => Body::empty(),
        (None, 1) => Body::from(json.chunks.into_iter().next().unwrap_or_default()),
        (permit, _) => Body::new(BudgetedBody(BudgetedChunks::new(json.chunks, permit))),
    };
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Give back what `permit` holds beyond `units`.
fn keep_at_most(permit: &mut OwnedSemaphorePermit, units: usize) {
    if let Some(surplus) = permit.num_permits().checked_sub(units) {
        drop(permit.split(surplus));
    }
}

/// Chunks of an answer and the budget they hold: each time the next chunk is taken, the permit
/// shrinks to the bytes not yet handed out before it (so a chunk's share goes back when the
/// chunk after it is taken); the permit goes when a take finds none left, or when this is
/// dropped. A JSON body and a run stream's snapshot event are both sent this way.
#[derive(Debug)]
pub struct BudgetedChunks {
    chunks: VecDeque<Bytes>,
    unsent: usize,
    permit: Option<OwnedSemaphorePermit>,
}

impl BudgetedChunks {
    /// `chunks`, holding `permit` (if any) until they are handed out.
    pub fn new(chunks: VecDeque<Bytes>, permit: Option<OwnedSemaphorePermit>) -> Self {
        Self {
            unsent: chunks.iter().map(Bytes::len).sum(),
            chunks,
            permit,
        }
    }

    /// The next chunk, after giving back the budget of those handed out before it; `None` (and
    /// the permit given back) at the end.
    pub fn take_next(&mut self) -> Option<Bytes> {
        if let Some(permit) = self.permit.as_mut() {
            keep_at_most(permit, self.unsent.div_ceil(UNIT_BYTES));
        }
        match self.chunks.pop_front() {
            Some(chunk) => {
                self.unsent = self.unsent.saturating_sub(chunk.len());
                Some(chunk)
            }
            None => {
                self.permit = None;
                None
            }
        }
    }

    /// True once every chunk was taken and the permit is gone.
    pub fn is_done(&self) -> bool {
        self.chunks.is_empty() && self.permit.is_none()
    }

    /// Bytes not yet taken.
    pub fn unsent(&self) -> usize {
        self.unsent
    }
}

/// A JSON body in budgeted chunks.
struct BudgetedBody(BudgetedChunks);

impl http_body::Body for BudgetedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(
            self.0
                .take_next()
                .map(|chunk| Ok(http_body::Frame::data(chunk))),
        )
    }

    // Not the end until polled once more: hyper would otherwise drop the body (and the permit)
    // as soon as the last chunk is queued, before it is written.
    fn is_end_stream(&self) -> bool {
        self.0.is_done()
    }

    // The exact length, so the answer carries `Content-Length` as `Json` answers do (a client
    // can show progress, and tell a cut answer from a whole one).
    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.unsent() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flightlog_core::activity::{
        SpanEventRow, SpanKind, SpanOrigin, SpanOutcome, SpanRow, SpanUsage,
    };
    use http_body::Body as _;

    /// A run of `spans` spans with `attr_bytes` of attrs and one event each.
    fn snapshot(spans: usize, attr_bytes: usize) -> RunSnapshot {
        let mut attrs = serde_json::Map::new();
        attrs.insert("text".into(), "é\"x\n".repeat(attr_bytes / 5).into());
        RunSnapshot {
            run_id: "run".into(),
            spans: (0..spans)
                .map(|n| SpanRow {
                    span_id: format!("s{n}"),
                    run_id: "run".into(),
                    parent_span_id: (n > 0).then(|| "s0".to_owned()),
                    name: "tool".into(),
                    kind: SpanKind::Tool,
                    origin: SpanOrigin::Session,
                    session_id: None,
                    job_name: Some("nightly".into()),
                    attrs: attrs.clone(),
                    started_at: n as i64,
                    wait_until: None,
                    ended_at: Some(n as i64 + 1),
                    outcome: Some(SpanOutcome::Success),
                    outcome_reason: None,
                    usage: SpanUsage {
                        input_tokens: Some(3),
                        ..SpanUsage::default()
                    },
                    writer: "w".into(),
                    last_heartbeat_at: None,
                })
                .collect(),
            events: (0..spans)
                .map(|n| SpanEventRow {
                    span_id: format!("s{n}"),
                    event_index: 0,
                    ts: n as i64,
                    event_type: "note".into(),
                    payload: serde_json::value::RawValue::from_string(format!("{{\"n\":{n}}}"))
                        .expect("raw JSON"),
                    truncated: false,
                })
                .collect(),
            high_water_seq: 7,
            change_cursor: 42,
        }
    }

    #[test]
    fn a_drained_snapshot_is_the_derived_serialization_in_chunks() {
        for (spans, attr_bytes) in [(0, 0), (3, 100), (400, 6_000)] {
            let snapshot = snapshot(spans, attr_bytes);
            let derived = serde_json::to_vec(&snapshot).expect("serialize");
            let json = ChunkedJson::drain(snapshot).expect("drain");
            assert_eq!(json.len(), derived.len());
            assert_eq!(json.chunks.len(), derived.len().div_ceil(CHUNK_BYTES));
            assert!(json.chunks.iter().all(|chunk| chunk.len() <= CHUNK_BYTES));
            let text: Vec<u8> = json.into_chunks().into_iter().flatten().collect();
            assert_eq!(text, derived, "{spans} spans");
        }
    }

    #[tokio::test]
    async fn settling_gives_back_a_surplus_and_takes_a_shortfall() {
        let budget = ResponseBudget::new(8 << 20);
        let total = budget.available_units();
        let reserved = budget.reserve(4 << 20).await.expect("room");
        assert_eq!(budget.available_units(), total - 64);
        let settled = budget.settle(reserved, 2 << 20).await.expect("settle");
        assert_eq!(budget.available_units(), total - 32);
        let grown = budget.settle(settled, 6 << 20).await.expect("grow");
        assert_eq!(budget.available_units(), total - 96);
        let refused = budget.reserve(3 << 20).await;
        assert!(
            matches!(refused, Err(ApiError::Unavailable(_))),
            "{refused:?}"
        );
        // Small once serialized: nothing held.
        assert!(matches!(budget.settle(grown, 1_000).await, Ok(None)));
        assert_eq!(budget.available_units(), total);
        // A small estimate that comes out large is charged then.
        let charged = budget.settle(None, 3 << 20).await.expect("charge");
        assert_eq!(budget.available_units(), total - 48);
        drop(charged);
    }

    #[tokio::test]
    async fn a_large_body_gives_its_budget_back_chunk_by_chunk() {
        let budget = ResponseBudget::new(64 << 20);
        let total = budget.available_units();
        let json = ChunkedJson::drain(snapshot(1_000, 6_000)).expect("drain");
        let len = json.len();
        assert!(json.chunks.len() >= 4, "{} chunks", json.chunks.len());
        let permit = budget.settle(None, len).await.expect("charge");
        let mut body = json_response(json, permit).into_body();
        assert_eq!(body.size_hint().exact(), Some(len as u64), "Content-Length");
        let mut received = 0;
        let mut free = vec![budget.available_units()];
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let data = frame.expect("a frame").into_data().expect("data");
            received += data.len();
            free.push(budget.available_units());
        }
        assert_eq!(received, len);
        assert_eq!(free[0], total - len.div_ceil(UNIT_BYTES));
        assert!(free.windows(2).all(|pair| pair[0] <= pair[1]), "{free:?}");
        assert!(
            free[free.len() - 2] < total,
            "the last chunk holds budget until the end"
        );
        assert_eq!(budget.available_units(), total);
    }

    #[tokio::test]
    async fn small_snapshots_take_nothing_and_large_ones_wait_then_get_503() {
        let budget = ResponseBudget::new(4 << 20);
        let total = budget.available_units();
        assert_eq!(total, 64);
        assert!(matches!(
            budget.reserve(SMALL_RESPONSE_BYTES).await,
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
