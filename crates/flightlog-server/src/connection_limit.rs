//! The connection limit: at most `max_connections` connections are served at once, over both
//! listeners (the HTTP API and OTLP/gRPC). Past it, a listener that has accepted a client first
//! makes room: it asks the connection idle the longest to close, and serves the client once its
//! slot is free. Connections that never showed a valid token go first (one that sent nothing,
//! one still sending its first head, one whose requests were all refused `401` or asked only
//! the public `/healthz`: their requests are not use of the connection), once [`MIN_IDLE`] (a
//! second) after their accept; then connections that did, once idle (no request in flight) for
//! [`VOUCHED_MIN_IDLE`] (10 s). On a server without tokens every request counts as showing one.
//! When no connection qualifies (requests in flight, live streams, clients with a token that
//! used their connection within 10 s) the client waits for one to close or to qualify, and the
//! listener accepts no other meanwhile (that one socket unread, the rest in the kernel's listen
//! queue).
//!
//! Why it exists: every open connection holds memory no request budget counts, before any
//! token is checked: hyper's read buffer of an HTTP/1 connection (up to its request head limit,
//! `parse_error_body::MAX_HEAD_BYTES`, while a head arrives) and an HTTP/2 connection's flow
//! control window (what a peer may send before a request reads it). With no limit, the process's
//! file-descriptor limit was the only bound (the server raises it to the hard limit, often
//! hundreds of thousands): 2,000 connections that each sent 390 KiB of an unfinished request
//! head took the server from 14 MiB to 801 MiB of RSS, without a token.
//!
//! Why idle connections make room (as nginx closes its keep-alive connections when it runs out
//! of connections): a limit that only waited let anyone who can connect take every slot
//! without a token and keep it (an audit: 99 idle keep-alive connections re-sending a
//! token-less request every 20 s held 99 of 100 slots, and an authorized client waited 45 s;
//! connections that trickle a head held theirs for the 30 s a head may take). Closing an idle
//! connection loses nothing: an HTTP/1 one is closed by hyper only between requests (its
//! client opens a new connection for its next request, as it would after the 30-s idle
//! timeout; a request sent at that very moment gets no answer, as at that timeout, which is
//! why a connection that showed a token is left 10 s), an HTTP/2 one gets a `GOAWAY` and its
//! requests in flight finish; a connection still sending its first request's head
//! [`EVICTION_GRACE`] after it was accepted is dropped. A request without a valid token holds
//! its connection for at most a second (the gate drains its body no longer): clients without
//! a token that keep re-sending such requests on new connections make the slots change hands
//! every second, and a client waiting among them gets one within about a second. What the
//! limit still does not stop: clients with a token that keep every connection in use (a live
//! stream, a body trickled within its time limits, a request at least every 10 s) hold their
//! slots, as they could hold file descriptors without it (live streams only up to three
//! quarters of the limit: `ServerConfig::stream_limit`).
//!
//! Waiting, not refusing, when no connection is idle: a connection accepted only to be closed
//! again tells the client nothing an HTTP answer would, and reading a request to answer it is
//! what costs the memory. The operator is told on stderr (at most every 10 s) that the limit
//! was reached, and `/metrics` shows the connections open, how often the limit was reached and
//! how many idle connections were closed to make room.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::half_close::EofWatch;

/// How often, at most, reaching the limit is said on stderr.
const WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// How long a connection has, from when it was accepted, to send the head of its first request
/// before it may be dropped to make room: hyper closes at once a connection between requests
/// or one that sent nothing, but waits for a head that has begun (up to the 30 s a head may
/// take). A client on a working link sends a head in milliseconds. Counted from the accept, not
/// from when it is asked: 150 clients trickling heads at a limit of 100 made each client in
/// the listen queue wait a second more, and an authorized client behind them 27 s.
pub const EVICTION_GRACE: Duration = Duration::from_secs(1);

/// How long a connection that never showed a valid token must have been open before it may be
/// closed to make room (its requests are not use: see [`VOUCHED_MIN_IDLE`]); no request of it
/// may be in flight. Without a minimum, a connection accepted a moment before, whose request
/// was already in its socket unread, was closed and its request never answered (an audit: 37%
/// of the requests of three clients that made one a connection, at a limit with one slot
/// free), as were keep-alive writers' requests just sent (4.7%).
pub const MIN_IDLE: Duration = EVICTION_GRACE;

/// How long a connection that has shown a valid token (or any connection's requests, on a
/// server without tokens: see [`ConnectionActivity::vouch`]) must have had no request in
/// flight before it may be closed to make room. Only such a connection's requests count as
/// use at all: token-less requests sent every 0.9 s (each answered `401`, or `/healthz`) kept
/// a connection from ever being idle a second, and 20 such connections held a limit of 20
/// for good (a second audit). Longer than [`MIN_IDLE`], since closing a client's idle
/// keep-alive connection races with its next request (a request sent as the close arrives is
/// not answered): a client that pauses less than this between requests (an OpenTelemetry
/// exporter's batches come every 5 s) keeps its connection, and clients that never showed a
/// token are closed first.
pub const VOUCHED_MIN_IDLE: Duration = Duration::from_secs(10);

/// How long a client waiting for a slot waits before it looks again for an idle connection,
/// when none was idle (each was busy) or the one asked to close has not closed yet.
const RECHECK_INTERVAL: Duration = Duration::from_millis(500);

/// The connection limit shared by the listeners (cloned into each; one count).
#[derive(Debug, Clone)]
pub struct ConnectionSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    slots: Arc<Semaphore>,
    limit: usize,
    /// When the slots were made: what each connection's idle time is counted from, so that
    /// connections can be compared without reading the clock once for each.
    epoch: Instant,
    /// [`MIN_IDLE`] and [`VOUCHED_MIN_IDLE`] (shorter in unit tests).
    min_idle: Duration,
    vouched_min_idle: Duration,
    /// The connections open now, by an id of their own.
    open: Mutex<HashMap<u64, Arc<ConnectionActivity>>>,
    next_id: AtomicU64,
    /// How many times a client arrived while every slot was taken.
    reached: AtomicU64,
    /// How many idle connections were asked to close to make room for a waiting client.
    evicted: AtomicU64,
    /// How many connections were closed because their client read nothing for the write-stall
    /// limit (counted by each connection's `write_stall::StallGuard`).
    stalled: Arc<AtomicU64>,
    /// Told whenever a connection ends.
    closed: Notify,
    last_warning: Mutex<Option<Instant>>,
}

/// One open connection's slot; given back when dropped (when the connection ends).
#[derive(Debug)]
pub struct ConnectionSlot {
    id: u64,
    activity: Arc<ConnectionActivity>,
    inner: Arc<Inner>,
    _permit: OwnedSemaphorePermit,
}

impl ConnectionSlot {
    /// What the connection is doing: its requests mark their start and end on it, and it
    /// hears when it is asked to close to make room.
    pub fn activity(&self) -> &Arc<ConnectionActivity> {
        &self.activity
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.inner.open.lock() {
            open.remove(&self.id);
        }
        // The connection's socket is closed by now (the connection was dropped first).
        self.inner.closed.notify_waiters();
    }
}

/// What a connection is doing, for choosing which one makes room and for the HTTP/2 idle
/// timeout: its requests in flight (from the call of the service until hyper has taken the
/// answer's body's last piece, or dropped it), since when it has had none, and whether it was
/// asked to close. hyper may still be writing the last piece then: a connection asked to close
/// finishes writing first (hyper closes an HTTP/1 connection only between requests).
#[derive(Debug)]
pub struct ConnectionActivity {
    epoch: Instant,
    /// When the connection was accepted.
    accepted: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds from `epoch` to when the connection was accepted or its last request ended.
    idle_since_ms: AtomicU64,
    /// Whether any request came.
    served: AtomicBool,
    /// Whether it was asked to close to make room (so it is not asked twice).
    evicted: AtomicBool,
    /// Whether a request on it showed a valid token (or the server has none): only then do its
    /// requests' ends count as use (see [`VOUCHED_MIN_IDLE`]).
    vouched: AtomicBool,
    close_asked: Notify,
    /// The client's end of sending, for the answers of clients that half-close.
    eof: EofWatch,
}

/// One request in flight on a connection; its end when dropped.
#[derive(Debug)]
pub struct InFlight(Arc<ConnectionActivity>);

impl ConnectionActivity {
    fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            accepted: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(millis_since(epoch)),
            served: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            vouched: AtomicBool::new(false),
            close_asked: Notify::new(),
            eof: EofWatch::default(),
        }
    }

    /// A request begins; it ends when the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Relaxed);
        self.eof.request_began();
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// The client's end of sending on the connection (see `half_close`).
    pub(crate) fn eof(&self) -> &EofWatch {
        &self.eof
    }

    /// Whether a request is in flight.
    pub fn is_busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Whether any request came on the connection.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    /// When the connection was accepted.
    pub fn accepted(&self) -> Instant {
        self.accepted
    }

    /// A request on the connection showed a valid token (or the server has no tokens): from now
    /// on its requests count as use, and it is closed to make room only after
    /// [`VOUCHED_MIN_IDLE`], after the connections that never did.
    pub fn vouch(&self) {
        self.vouched.store(true, Ordering::Relaxed);
    }

    /// Whether a request on it showed a valid token (see [`ConnectionActivity::vouch`]).
    pub fn vouched(&self) -> bool {
        self.vouched.load(Ordering::Relaxed)
    }

    /// How long the connection has had no request in flight (`None` while one is).
    pub fn idle_for(&self) -> Option<Duration> {
        if self.is_busy() {
            return None;
        }
        let since = self.idle_since_ms.load(Ordering::Acquire);
        Some(Duration::from_millis(
            millis_since(self.epoch).saturating_sub(since),
        ))
    }

    /// Completes once the connection is asked to close to make room for a waiting client.
    pub async fn close_asked(&self) {
        self.close_asked.notified().await;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // A request of a connection that never showed a token leaves its idle time as it was:
        // such requests are not use of the connection.
        if self.0.vouched() {
            self.0
                .idle_since_ms
                .fetch_max(millis_since(self.0.epoch), Ordering::AcqRel);
        }
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.eof.requests_ended();
        }
    }
}

/// The connection a request came on, in the request's extensions: the gates (HTTP and gRPC)
/// [`vouch`](ConnectionOfRequest::vouch) for it once the request showed a valid token.
#[derive(Debug, Clone)]
pub struct ConnectionOfRequest(Arc<ConnectionActivity>);

impl ConnectionOfRequest {
    /// The handle of `activity`'s connection, for its requests.
    pub fn new(activity: Arc<ConnectionActivity>) -> Self {
        Self(activity)
    }

    /// Whether the client closed its sending side (went away, or half-closed to wait for its
    /// answer).
    pub fn client_closed(&self) -> bool {
        self.0.eof.seen()
    }

    /// Vouch (see [`ConnectionActivity::vouch`]) for the connection of the request whose
    /// extensions these are; nothing for a request served outside a tracked connection.
    pub fn vouch_for(extensions: &axum::http::Extensions) {
        if let Some(connection) = extensions.get::<Self>() {
            connection.0.vouch();
        }
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A connection's hyper service that counts each request in flight from the moment hyper hands
/// it over (`call`) until its answer's body is done ([`InFlightBody`]). Not from the first poll
/// of its future (as a tower layer inside hyper-util's adapter would, which calls the tower
/// service lazily): hyper reads on before it polls, and a client's EOF read right behind its
/// request found no request in flight, so it was passed on and the request dropped unanswered
/// (see `half_close`).
#[derive(Debug, Clone)]
pub struct CountedService<S> {
    inner: S,
    activity: Arc<ConnectionActivity>,
}

impl<S> CountedService<S> {
    /// `inner`, counting its requests on `activity`.
    pub fn new(inner: S, activity: Arc<ConnectionActivity>) -> Self {
        Self { inner, activity }
    }
}

impl<S, Req, B> hyper::service::Service<Req> for CountedService<S>
where
    S: hyper::service::Service<Req, Response = axum::http::Response<B>>,
{
    type Response = axum::http::Response<InFlightBody<B>>;
    type Error = S::Error;
    type Future = Counted<S::Future>;

    fn call(&self, request: Req) -> Self::Future {
        let in_flight = self.activity.begin();
        Counted {
            future: self.inner.call(request),
            in_flight: Some(in_flight),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of a [`CountedService`] request: the answer with its in-flight mark.
    pub struct Counted<F> {
        #[pin]
        future: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, B, E> std::future::Future for Counted<F>
where
    F: std::future::Future<Output = Result<axum::http::Response<B>, E>>,
{
    type Output = Result<axum::http::Response<InFlightBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.future.poll(cx));
        // Taken once: a future is not polled after it is ready. (Were it, the answer would
        // only lose its mark.)
        let in_flight = this.in_flight.take();
        Poll::Ready(answer.map(|response| {
            response.map(|body| InFlightBody {
                body,
                _in_flight: in_flight,
            })
        }))
    }
}

/// An answer's body that keeps its request in flight until hyper has taken its last piece (or
/// dropped it): a live stream's connection is busy for as long as the stream runs, though its
/// handler returned at once.
#[derive(Debug)]
pub struct InFlightBody<B> {
    body: B,
    _in_flight: Option<InFlight>,
}

impl<B> InFlightBody<B> {
    /// `body`, keeping `in_flight` until it ends.
    pub fn new(body: B, in_flight: InFlight) -> Self {
        Self {
            body,
            _in_flight: Some(in_flight),
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl ConnectionSlots {
    /// A limit of `limit` connections at once (capped at what a semaphore can count).
    pub fn new(limit: usize) -> Self {
        Self::with_min_idle(limit, MIN_IDLE, VOUCHED_MIN_IDLE)
    }

    fn with_min_idle(limit: usize, min_idle: Duration, vouched_min_idle: Duration) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Self {
            inner: Arc::new(Inner {
                slots: Arc::new(Semaphore::new(limit)),
                limit,
                epoch: Instant::now(),
                min_idle,
                vouched_min_idle,
                open: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                reached: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                stalled: Arc::new(AtomicU64::new(0)),
                closed: Notify::new(),
                last_warning: Mutex::new(None),
            }),
        }
    }

    /// A slot for a connection just accepted: at once while fewer than the limit are open.
    /// Else (said on stderr, at most every 10 s) the connection idle the longest is asked to
    /// close, and the slot is the one it gives back; while every connection is busy, the first
    /// that ends gives it. `None` only if the slots were closed, which nothing does.
    pub async fn acquire(&self) -> Option<ConnectionSlot> {
        let slots = Arc::clone(&self.inner.slots);
        match slots.clone().try_acquire_owned() {
            Ok(permit) => return Some(self.register(permit)),
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        self.inner.reached.fetch_add(1, Ordering::Relaxed);
        self.warn_full();
        loop {
            let wait = if self.ask_idlest_to_close() {
                // It closes at once, or once its head's grace is over (or its request that
                // arrived meanwhile is answered): another is asked only if it has not by then.
                EVICTION_GRACE + RECHECK_INTERVAL
            } else {
                RECHECK_INTERVAL
            };
            match tokio::time::timeout(wait, slots.clone().acquire_owned()).await {
                Ok(Ok(permit)) => return Some(self.register(permit)),
                Ok(Err(_)) => return None,
                Err(_) => {}
            }
        }
    }

    fn register(&self, permit: OwnedSemaphorePermit) -> ConnectionSlot {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(ConnectionActivity::new(self.inner.epoch));
        if let Ok(mut open) = self.inner.open.lock() {
            open.insert(id, Arc::clone(&activity));
        }
        ConnectionSlot {
            id,
            activity,
            inner: Arc::clone(&self.inner),
            _permit: permit,
        }
    }

    /// Out of file descriptors (the accept loop's `EMFILE`): ask the connection idle the longest
    /// to close, as at the connection limit, and wait until a connection has closed (at most
    /// [`EVICTION_GRACE`] and a half); `false` at once when none is idle. The connection
    /// limit is meant to bind first, but the descriptor limit may be lower (the server warns
    /// at start), and then idle connections held every descriptor as they held every slot.
    pub async fn make_room_for_a_descriptor(&self) -> bool {
        let closed = self.inner.closed.notified();
        let mut closed = std::pin::pin!(closed);
        // Listening before asking: a connection that closes at once is not missed.
        closed.as_mut().enable();
        if !self.ask_idlest_to_close() {
            return false;
        }
        let _ = tokio::time::timeout(EVICTION_GRACE + RECHECK_INTERVAL, closed).await;
        true
    }

    /// Ask the connection idle the longest to close: of those with no request in flight for at
    /// least [`MIN_IDLE`] ([`VOUCHED_MIN_IDLE`] once it showed a valid token) and not yet asked,
    /// one that never showed a token first. Whether there was one.
    fn ask_idlest_to_close(&self) -> bool {
        let as_millis =
            |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let (min_idle, vouched_min_idle) = (
            as_millis(self.inner.min_idle),
            as_millis(self.inner.vouched_min_idle),
        );
        let now = millis_since(self.inner.epoch);
        let idlest = {
            let Ok(open) = self.inner.open.lock() else {
                return false;
            };
            // Ties (idle since the same millisecond) go to the connection accepted first, its
            // id: the map's order is random, and two connections accepted in one burst would
            // otherwise be asked in either order.
            open.iter()
                .filter_map(|(id, activity)| {
                    if activity.is_busy() || activity.evicted.load(Ordering::Relaxed) {
                        return None;
                    }
                    let vouched = activity.vouched();
                    let since = activity.idle_since_ms.load(Ordering::Acquire);
                    let minimum = if vouched { vouched_min_idle } else { min_idle };
                    (now.saturating_sub(since) >= minimum)
                        .then_some(((vouched, since, *id), activity))
                })
                .min_by_key(|(order, _)| *order)
                .map(|(_, activity)| Arc::clone(activity))
        };
        let Some(idlest) = idlest else {
            return false;
        };
        idlest.evicted.store(true, Ordering::Relaxed);
        idlest.close_asked.notify_one();
        self.inner.evicted.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Connections open now (holding a slot).
    pub fn open(&self) -> usize {
        self.inner
            .limit
            .saturating_sub(self.inner.slots.available_permits())
    }

    /// How many times a client arrived while every slot was taken.
    pub fn times_reached(&self) -> u64 {
        self.inner.reached.load(Ordering::Relaxed)
    }

    /// How many idle connections were asked to close to make room.
    pub fn idle_closed(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }

    /// The count of connections closed for a client that stopped reading, for each
    /// connection's `write_stall::StallGuard` to add to.
    pub(crate) fn stall_count(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.inner.stalled)
    }

    /// How many connections were closed because their client read nothing for the write-stall
    /// limit while an answer or a live stream waited to be written.
    pub fn stalled_closed(&self) -> u64 {
        self.inner.stalled.load(Ordering::Relaxed)
    }

    fn warn_full(&self) {
        let now = Instant::now();
        {
            let Ok(mut last) = self.inner.last_warning.lock() else {
                return;
            };
            if last.is_some_and(|last| now.duration_since(last) < WARNING_INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        // Written, not `eprintln!`: a closed stderr must not panic the server.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr().lock(),
            "flightlog: warning: {} connections are open, the most --max-connections allows; \
             idle ones are closed to make room for new ones, which wait while every one is \
             busy (raise --max-connections, or look for clients that keep connections open \
             without using them)",
            self.inner.limit
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client arriving: its slot, acquired on a task of its own.
    fn acquire_in_background(
        slots: &ConnectionSlots,
    ) -> tokio::task::JoinHandle<Option<ConnectionSlot>> {
        let slots = slots.clone();
        tokio::spawn(async move { slots.acquire().await })
    }

    #[tokio::test]
    async fn a_slot_comes_free_when_a_connection_ends_and_the_limit_reached_is_counted() {
        let slots = ConnectionSlots::new(2);
        let first = slots.acquire().await.expect("a slot");
        let second = slots.acquire().await.expect("a slot");
        let _busy = (first.activity().begin(), second.activity().begin());
        assert_eq!(
            (slots.open(), slots.limit(), slots.times_reached()),
            (2, 2, 0)
        );
        let waiting = acquire_in_background(&slots);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a third connection waits");
        assert_eq!((slots.times_reached(), slots.idle_closed()), (1, 0));
        drop(first);
        let third = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the third gets the slot the first gave back")
            .expect("the task ran");
        assert!(third.is_some());
        assert_eq!(slots.open(), 2);
        drop((second, third));
        assert_eq!(slots.open(), 0);
    }

    #[tokio::test]
    async fn the_connection_idle_the_longest_is_asked_to_close_and_busy_ones_never_are() {
        let slots =
            ConnectionSlots::with_min_idle(3, Duration::from_millis(10), Duration::from_millis(10));
        let idle_longest = slots.acquire().await.expect("a slot");
        let busy = slots.acquire().await.expect("a slot");
        let in_flight = busy.activity().begin();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let idle_lately = slots.acquire().await.expect("a slot");
        let waiting = acquire_in_background(&slots);
        tokio::time::timeout(
            Duration::from_secs(5),
            idle_longest.activity().close_asked(),
        )
        .await
        .expect("the connection idle the longest is asked to close");
        assert_eq!(slots.idle_closed(), 1);
        drop(idle_longest);
        let fourth = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting client gets its slot")
            .expect("the task ran")
            .expect("a slot");

        // Ask again: the one idle lately is next; the busy one never is, however long it ran.
        let waiting = acquire_in_background(&slots);
        tokio::time::timeout(Duration::from_secs(5), idle_lately.activity().close_asked())
            .await
            .expect("the next idle connection is asked to close");
        assert!(busy.activity().is_busy());
        assert!(!busy.activity().evicted.load(Ordering::Relaxed));
        drop(idle_lately);
        let fifth = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting client gets its slot")
            .expect("the task ran");
        assert!(fifth.is_some());
        drop(in_flight);
        assert!(busy.activity().idle_for().is_some());
        drop((busy, fourth, fifth));
        assert_eq!(slots.open(), 0);
    }

    #[tokio::test]
    async fn out_of_descriptors_the_idlest_connection_is_asked_and_its_close_awaited() {
        // A minimum a busy machine does not pass between two statements by accident.
        let slots = ConnectionSlots::with_min_idle(
            8,
            Duration::from_millis(1_000),
            Duration::from_millis(1_000),
        );
        let busy = slots.acquire().await.expect("a slot");
        let in_flight = busy.activity().begin();
        assert!(
            !slots.make_room_for_a_descriptor().await,
            "nothing idle: nothing to ask"
        );
        let idle = slots.acquire().await.expect("a slot");
        assert!(
            !slots.make_room_for_a_descriptor().await,
            "idle for less than the minimum: not asked"
        );
        tokio::time::sleep(Duration::from_millis(1_050)).await;
        let making_room = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.make_room_for_a_descriptor().await })
        };
        tokio::time::timeout(Duration::from_secs(5), idle.activity().close_asked())
            .await
            .expect("the idle connection is asked to close");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!making_room.is_finished(), "it waits for the close");
        drop(idle);
        let made = tokio::time::timeout(Duration::from_millis(500), making_room)
            .await
            .expect("the close ends the wait at once")
            .expect("the task ran");
        assert!(made);
        assert_eq!(slots.idle_closed(), 1);
        drop((in_flight, busy));
    }

    /// Two connections idle since the same millisecond (accepted in one burst) are asked in the
    /// order they were accepted, not in the random order of the map holding them.
    #[tokio::test]
    async fn connections_idle_since_the_same_millisecond_are_asked_in_accept_order() {
        let slots =
            ConnectionSlots::with_min_idle(8, Duration::from_millis(0), Duration::from_millis(0));
        let mut accepted = Vec::new();
        for _ in 0..6 {
            accepted.push(slots.acquire().await.expect("a slot"));
        }
        for slot in &accepted {
            slot.activity().idle_since_ms.store(0, Ordering::Release);
        }
        for (order, slot) in accepted.iter().enumerate() {
            assert!(slots.ask_idlest_to_close(), "one to ask");
            assert!(
                slot.activity().evicted.load(Ordering::Relaxed),
                "the connection accepted {order}th was not asked {order}th"
            );
        }
    }

    #[tokio::test]
    async fn connections_that_never_showed_a_token_go_first_and_their_requests_are_not_use() {
        // The vouched minimum is one a busy machine does not pass between two statements by
        // accident.
        let slots = ConnectionSlots::with_min_idle(
            8,
            Duration::from_millis(10),
            Duration::from_millis(1_500),
        );
        let vouched = slots.acquire().await.expect("a slot");
        let request = vouched.activity().begin();
        vouched.activity().vouch();
        drop(request);
        let token_less = slots.acquire().await.expect("a slot");
        let accepted_idle_since = token_less.activity().idle_since_ms.load(Ordering::Acquire);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A refused request (no vouch) does not count as use.
        drop(token_less.activity().begin());
        assert_eq!(
            token_less.activity().idle_since_ms.load(Ordering::Acquire),
            accepted_idle_since
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(slots.ask_idlest_to_close(), "the token-less connection");
        assert!(token_less.activity().evicted.load(Ordering::Relaxed));
        assert!(
            !slots.ask_idlest_to_close(),
            "the vouched one is idle for less than its minimum"
        );
        tokio::time::sleep(Duration::from_millis(1_550)).await;
        assert!(slots.ask_idlest_to_close(), "now the vouched one");
        assert!(vouched.activity().evicted.load(Ordering::Relaxed));
        assert_eq!(slots.idle_closed(), 2);
    }
}
