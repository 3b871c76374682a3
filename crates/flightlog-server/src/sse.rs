//! Server-Sent Events, encoded here rather than with axum's `Sse`.
//!
//! Why: a run stream's first event is the run's whole snapshot, which for a large run is
//! hundreds of megabytes of JSON. axum's `Event` takes its data as one string and copies it into
//! one growing buffer, so such an event cost the serialized chunks, then the string joined from
//! them, then the event's buffer (with its reallocations): two to three times the snapshot, while
//! the response budget was charged once. Here an event is a list of byte chunks: a snapshot's
//! serialized chunks go out as they are, behind a few bytes of head, and each chunk's share of
//! the response budget goes back as hyper takes the next (the same [`BudgetedChunks`] as a large
//! JSON body). Every other event is built in one buffer with its JSON serialized straight into
//! it (one allocation, where `Event` took the JSON string and a copy).
//!
//! The wire format is the one axum wrote (a client sees no difference): `event: NAME`, `id: ID`
//! when there is one, one `data:` line, a blank line; a `: keep-alive` comment when nothing was
//! sent for the keep-alive interval; `Content-Type: text/event-stream`, `Cache-Control:
//! no-cache` and `X-Accel-Buffering: no` (so an nginx in front does not hold events back). The data is always compact JSON, which has no line breaks (serde_json escapes them
//! inside strings), so one `data:` line carries it whole.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::{HeaderName, CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::response_budget::{BudgetedChunks, ChunkedJson};

/// What the stream sends when it has been quiet for the keep-alive interval.
const KEEP_ALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// One event, encoded, with the response budget its bytes hold (if any); or several events
/// already encoded, sent together (see [`SseEvent::encoded`]).
#[derive(Debug)]
pub struct SseEvent {
    chunks: BudgetedChunks,
    /// How many events the chunks hold (for the sent-events counter).
    events: u64,
}

/// `event: name`, `id: id` (when given) and `value` as JSON data: one event's frame.
pub fn encode_json<T: Serialize>(name: &str, id: Option<&str>, value: &T) -> Bytes {
    let mut bytes = head(name, id);
    let data_at = bytes.len();
    if serde_json::to_writer(&mut bytes, value).is_err() {
        // Only a map with non-string keys fails, which no type sent here has.
        bytes.truncate(data_at);
        bytes.extend_from_slice(b"null");
    }
    bytes.extend_from_slice(b"\n\n");
    Bytes::from(bytes)
}

impl SseEvent {
    /// `event: name`, `id: id` (when given) and `value` as JSON data.
    pub fn json<T: Serialize>(name: &str, id: Option<&str>, value: &T) -> Self {
        Self {
            chunks: BudgetedChunks::new(VecDeque::from([encode_json(name, id, value)]), None),
            events: 1,
        }
    }

    /// Events already encoded by [`encode_json`], one frame each, sent one after the other.
    pub fn encoded(frames: Vec<Bytes>) -> Self {
        Self {
            events: frames.len() as u64,
            chunks: BudgetedChunks::new(VecDeque::from(frames), None),
        }
    }

    /// How many events this is.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// An event whose data is a document already serialized (a run's snapshot), sent in its
    /// chunks, holding `permit` (if any) until they are handed to the socket.
    pub fn chunked_json(
        name: &str,
        id: Option<&str>,
        json: ChunkedJson,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        let mut chunks = json.into_chunks();
        chunks.push_front(Bytes::from(head(name, id)));
        chunks.push_back(Bytes::from_static(b"\n\n"));
        Self {
            chunks: BudgetedChunks::new(chunks, permit),
            events: 1,
        }
    }

    /// The whole event as one byte string (for tests).
    #[cfg(test)]
    pub(crate) fn into_bytes(mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        while let Some(chunk) = self.chunks.take_next() {
            bytes.extend_from_slice(&chunk);
        }
        bytes
    }
}

/// `event:` and `id:` lines, and the start of the `data:` line. Names and ids are this server's
/// own (event names, numbers, `<seq>@<generation>`): no line breaks.
fn head(name: &str, id: Option<&str>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(256);
    bytes.extend_from_slice(b"event: ");
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(b'\n');
    if let Some(id) = id {
        bytes.extend_from_slice(b"id: ");
        bytes.extend_from_slice(id.as_bytes());
        bytes.push(b'\n');
    }
    bytes.extend_from_slice(b"data: ");
    bytes
}

/// Whether an answer with these headers is a live stream (see [`response`]).
pub fn is_event_stream(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes() == b"text/event-stream")
}

/// The `text/event-stream` response of `events`, with a keep-alive comment after every
/// `keep_alive` without an event.
pub fn response<S>(events: S, keep_alive: Duration) -> Response
where
    S: Stream<Item = SseEvent> + Send + 'static,
{
    let body = SseBody {
        events: Box::pin(events),
        current: None,
        quiet_until: Box::pin(tokio::time::sleep(keep_alive)),
        keep_alive,
    };
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
            // nginx (and proxies that follow its convention) would otherwise buffer the stream
            // and deliver events late, in bunches.
            (HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        Body::new(body),
    )
        .into_response()
}

/// The body: the chunks of the event being sent, then the next event, or a keep-alive comment
/// when none comes in time. Events are only ever pulled when hyper asks for more bytes.
struct SseBody<S> {
    events: Pin<Box<S>>,
    current: Option<BudgetedChunks>,
    quiet_until: Pin<Box<Sleep>>,
    keep_alive: Duration,
}

impl<S> SseBody<S> {
    fn reset_keep_alive(&mut self) {
        let next = Instant::now() + self.keep_alive;
        self.quiet_until.as_mut().reset(next);
    }
}

impl<S: Stream<Item = SseEvent>> http_body::Body for SseBody<S> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(current) = this.current.as_mut() {
                if let Some(chunk) = current.take_next() {
                    return Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
                }
                this.current = None;
            }
            match this.events.as_mut().poll_next(cx) {
                Poll::Ready(Some(event)) => {
                    this.reset_keep_alive();
                    this.current = Some(event.chunks);
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => {
                    ready!(this.quiet_until.as_mut().poll(cx));
                    this.reset_keep_alive();
                    let comment = Bytes::from_static(KEEP_ALIVE_COMMENT);
                    return Poll::Ready(Some(Ok(http_body::Frame::data(comment))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::sse::Event;
    use futures_util::stream;
    use http_body::Body as _;

    /// What axum's `Event` wrote for the same event.
    async fn axum_bytes(event: Event) -> Vec<u8> {
        let body = axum::response::sse::Sse::new(stream::iter([Ok::<_, Infallible>(event)]))
            .into_response()
            .into_body();
        axum::body::to_bytes(body, usize::MAX)
            .await
            .expect("body")
            .to_vec()
    }

    #[tokio::test]
    async fn events_are_written_as_axum_wrote_them() {
        let value = serde_json::json!({"text": "line\nbreak\r and \"quotes\"", "n": [1, 2]});
        let text = value.to_string();
        let ours = SseEvent::json("change", Some("42"), &value).into_bytes();
        let axum = axum_bytes(Event::default().event("change").id("42").data(&text)).await;
        assert_eq!(
            String::from_utf8_lossy(&ours),
            String::from_utf8_lossy(&axum)
        );
        let ours = SseEvent::json("resync", None, &value).into_bytes();
        let axum = axum_bytes(Event::default().event("resync").data(&text)).await;
        assert_eq!(ours, axum);
    }

    #[test]
    fn a_chunked_event_is_the_same_event() {
        let value = serde_json::json!({"spans": vec!["x".repeat(1_000); 3_000]});
        let json = ChunkedJson::of(&value).expect("serialize");
        assert!(json.len() > 2 * crate::response_budget::CHUNK_BYTES);
        let chunked = SseEvent::chunked_json("snapshot", Some("7"), json, None).into_bytes();
        let whole = SseEvent::json("snapshot", Some("7"), &value).into_bytes();
        assert_eq!(chunked, whole);
    }

    /// Every frame of `body` until it ends.
    async fn frames(mut body: Response) -> Vec<Bytes> {
        let mut body = std::mem::take(body.body_mut());
        let mut frames = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frames.push(frame.expect("a frame").into_data().expect("data"));
        }
        frames
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_sends_keep_alive_comments_between_events() {
        let events = stream::unfold(0, |n| async move {
            if n == 2 {
                return None;
            }
            tokio::time::sleep(Duration::from_secs(35)).await;
            Some((SseEvent::json("change", Some(&n.to_string()), &n), n + 1))
        });
        let response = response(events, Duration::from_secs(15));
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "text/event-stream",
            "content type"
        );
        assert_eq!(response.headers()[CACHE_CONTROL], "no-cache");
        assert_eq!(response.headers()["x-accel-buffering"], "no");
        let frames = frames(response).await;
        let text: Vec<String> = frames
            .iter()
            .map(|frame| String::from_utf8_lossy(frame).into_owned())
            .collect();
        let comment = ": keep-alive\n\n";
        assert_eq!(
            text,
            [
                comment,
                comment,
                "event: change\nid: 0\ndata: 0\n\n",
                comment,
                comment,
                "event: change\nid: 1\ndata: 1\n\n"
            ],
        );
    }
}
