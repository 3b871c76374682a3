//! [`AppState`]: what every handler shares (the stores, the optional testing clock, the
//! configuration, the write limit's slots, the metrics) and the cache of per-writer store handles.
//!
//! A write that names a writer (`Flightlog-Writer: X`) acts through `store.with_writer("X")`.
//! Making such a handle is cheap, but a busy server would make one per request, so handles are
//! kept in a small bounded map: a client population larger than the map only costs re-creating
//! handles, never unbounded memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightlog_core::activity::ActivityStore;
use flightlog_core::journal::EngagementJournal;
use flightlog_core::ManualClock;
use flightlog_otlp::MappingOptions;
use tokio::sync::Semaphore;

use crate::auth::AuthConfig;
use crate::connection_limit::ConnectionSlots;
use crate::metrics::Metrics;
use crate::request_budget::RequestBudget;
use crate::response_budget::ResponseBudget;

/// The server's tunables. Later settings (streams, …) join here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The largest request body accepted, in bytes; larger ones get `413 payload_too_large`.
    pub body_limit: usize,
    /// The most ops one `POST /v1/activity/batch` may carry.
    pub max_batch_ops: usize,
    /// How many per-writer store handles are kept between requests.
    pub writer_cache_capacity: usize,
    /// The tokens requests must carry; none (the default) means auth is off.
    pub auth: AuthConfig,
    /// The most write requests handled at once (see [`crate::overload`]); more wait up to
    /// `write_wait` for a slot (taken once the body has arrived), then get `503 unavailable`.
    /// Zero refuses every write.
    pub max_inflight_writes: usize,
    /// How long a write waits for a free slot before it is answered `503 unavailable`.
    pub write_wait: Duration,
    /// The most bytes a compressed (`gzip`, `deflate`) OTLP body may inflate to (`413` beyond):
    /// the body limit bounds what is sent, this bounds what a compression bomb could make of it.
    pub otlp_max_decompressed: usize,
    /// The most bytes of large answers (run snapshots, change pages, listings) held for
    /// clients that have not read them yet (see [`crate::response_budget`]).
    pub response_budget_bytes: usize,
    /// The most bytes of request bodies held while they are read and handled (see
    /// [`crate::request_budget`]).
    pub request_budget_bytes: usize,
    /// How long a connection may go without any of its pending output being written (its
    /// client reads nothing) before it is closed (see `write_stall`).
    pub write_stall_limit: Duration,
    /// The most connections open at once over both listeners; past it, an idle one is closed
    /// to make room for a new one, which waits while every one is busy (see
    /// [`crate::connection_limit`]).
    pub max_connections: usize,
    /// Without tokens, answer only requests that address the server by an IP address,
    /// `localhost` or another local name (a web page's own name resolved to loopback is
    /// refused: see `browser_guard`).
    /// On (the default) but for a server exposed without tokens on purpose
    /// (`allow_unauthenticated_non_loopback`).
    pub loopback_names_only: bool,
    /// Where the OTLP/gRPC listener listens, if anywhere: named in what an HTTP/2 (gRPC) client
    /// that reached the HTTP port is answered (see `wrong_port`).
    pub grpc_listening_on: Option<std::net::SocketAddr>,
    /// Where the HTTP listener listens: named in what an HTTP/1.1 client that reached the gRPC
    /// listener is answered.
    pub http_listening_on: Option<std::net::SocketAddr>,
}

impl ServerConfig {
    /// The contract's default body limit: 8 MiB.
    pub const DEFAULT_BODY_LIMIT: usize = 8 * 1024 * 1024;
    /// The default largest batch.
    pub const DEFAULT_MAX_BATCH_OPS: usize = 1_000;
    /// The default number of cached writer handles.
    pub const DEFAULT_WRITER_CACHE_CAPACITY: usize = 1_024;
    /// The default write limit: far more than a 2-core machine commits at once, and a quarter of
    /// the SQLite store's write queue, so HTTP writes alone never make that queue wait.
    pub const DEFAULT_MAX_INFLIGHT_WRITES: usize = 4_096;
    /// The default wait for a write slot: long enough to ride out one group commit (a few ms),
    /// short enough that a client of an overloaded server hears `503` at once.
    pub const DEFAULT_WRITE_WAIT: Duration = Duration::from_millis(100);
    /// The default inflated-size limit of compressed OTLP bodies: 64 MiB (8x the default body limit;
    /// OTLP protobuf typically compresses 5-10x).
    pub const DEFAULT_OTLP_MAX_DECOMPRESSED: usize = 64 * 1024 * 1024;
    /// The default budget of large snapshots in flight: 256 MiB.
    pub const DEFAULT_RESPONSE_BUDGET_BYTES: usize = 256 * 1024 * 1024;
    /// The default budget of request bodies in flight: 64 MiB, eight bodies of the default body
    /// limit at once (what they become once parsed and written comes on top: 100 clients of
    /// 8 MB batch bodies at once peaked at 369 MiB of RSS with 64 MiB, 461 MiB with 128 MiB,
    /// 1,319 MiB with no budget; `bench/many_large_bodies.py`).
    pub const DEFAULT_REQUEST_BUDGET_BYTES: usize = 64 * 1024 * 1024;
    /// The default write-stall limit: 30 s, as long as a client may take to send a request
    /// head (`HEADER_READ_TIMEOUT`).
    pub const DEFAULT_WRITE_STALL_LIMIT: Duration = Duration::from_secs(30);
    /// The default connection limit: one a write slot (every write needs a connection, so more
    /// would rarely help), which bounds what connections hold before any request is read: over
    /// HTTP/1 a head is at most 32 KiB, and 4,000 connections each holding 28 KiB of one took
    /// the server to about 170 MiB of RSS (`bench/big_heads.py`).
    pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;

    /// The most live streams open at once: three quarters of [`Self::max_connections`],
    /// rounded down (none at a limit of 1: with "at least one", one stream took the only
    /// connection and every write waited until it ended; an audit's finding). A live stream
    /// keeps its connection busy for as long as its client follows, so it is never closed to
    /// make room (see [`crate::connection_limit`]); without this cap,
    /// dashboards alone could take every connection, and every write, `/healthz` and new
    /// stream waited unanswered (an audit's finding: 20 streams against `--max-connections 20`
    /// held an ingest request 45 s). Past it, a stream request is answered `503` with
    /// `Retry-After`, and the last quarter stays for writes.
    pub fn stream_limit(&self) -> usize {
        self.max_connections.saturating_mul(3) / 4
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            body_limit: Self::DEFAULT_BODY_LIMIT,
            max_batch_ops: Self::DEFAULT_MAX_BATCH_OPS,
            writer_cache_capacity: Self::DEFAULT_WRITER_CACHE_CAPACITY,
            auth: AuthConfig::default(),
            max_inflight_writes: Self::DEFAULT_MAX_INFLIGHT_WRITES,
            write_wait: Self::DEFAULT_WRITE_WAIT,
            otlp_max_decompressed: Self::DEFAULT_OTLP_MAX_DECOMPRESSED,
            response_budget_bytes: Self::DEFAULT_RESPONSE_BUDGET_BYTES,
            request_budget_bytes: Self::DEFAULT_REQUEST_BUDGET_BYTES,
            write_stall_limit: Self::DEFAULT_WRITE_STALL_LIMIT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            loopback_names_only: true,
            grpc_listening_on: None,
            http_listening_on: None,
        }
    }
}

/// Everything the handlers share. Cloning it is one reference-count increment: every
/// middleware layer and extractor clones the state per request, and with the fields each behind
/// its own `Arc` that was a dozen atomic operations on cache lines shared by all worker threads.
#[derive(Clone)]
pub struct AppState {
    shared: Arc<Shared>,
}

/// The state's contents (built before serving; `with_*` copy them while they are still unshared).
#[derive(Clone)]
struct Shared {
    activity: Arc<dyn ActivityStore>,
    journal: Arc<dyn EngagementJournal>,
    /// The identity maintenance acts as when no writer is named (see
    /// [`AppState::with_maintenance_writer`]).
    maintenance_writer: Arc<str>,
    manual_clock: Option<Arc<ManualClock>>,
    config: Arc<ServerConfig>,
    writers: Arc<WriterHandles>,
    /// One permit per write request in flight (the write limit of [`crate::overload`]).
    write_permits: Arc<Semaphore>,
    /// One permit per batch request being read, parsed and written (see `routes/batch.rs`).
    batch_lanes: Arc<Semaphore>,
    /// Large run snapshots not yet handed to their clients' sockets.
    response_budget: ResponseBudget,
    /// Request bodies being read and handled.
    request_budget: RequestBudget,
    /// One slot per open connection, over both listeners (see [`crate::connection_limit`]).
    connection_slots: ConnectionSlots,
    /// Live streams open now, over every kind (see [`ServerConfig::stream_limit`]).
    open_streams: Arc<std::sync::atomic::AtomicUsize>,
    /// The newest changes, read and encoded once for every client of the change stream (see
    /// [`crate::change_tail`]).
    change_tail: Arc<crate::change_tail::ChangeTail>,
    /// The journal's committed events, routed to the streams of their engagement (see
    /// [`crate::journal_hub`]).
    journal_hub: Arc<crate::journal_hub::JournalHub>,
    /// One look at the change log after each commit for every run stream (see
    /// [`crate::run_hub`]).
    run_hub: Arc<crate::run_hub::RunHub>,
    /// Becomes `true` when the server starts shutting down (live streams end then).
    closing: Arc<tokio::sync::watch::Sender<bool>>,
    /// What `GET /metrics` reports (see [`crate::metrics`]).
    metrics: Arc<Metrics>,
    /// How OTLP spans are mapped (attribute cap, the bundled price table), shared by the
    /// OTLP/HTTP route and the gRPC service.
    otlp_mapping: Arc<MappingOptions>,
    /// `GET /openapi.json`'s body, encoded once when the router is built (see [`crate::app`]).
    openapi_json: Arc<std::sync::OnceLock<axum::body::Bytes>>,
    /// The methods each route template serves, from the same document (see
    /// [`AppState::route_serves`]).
    route_methods: Arc<std::sync::OnceLock<RouteMethods>>,
}

/// The methods each route template serves (`HEAD` wherever `GET` is: axum answers it).
type RouteMethods = std::collections::HashMap<String, Vec<axum::http::Method>>;

/// One live stream's place among [`ServerConfig::stream_limit`]; given back when dropped.
#[derive(Debug)]
pub(crate) struct StreamPlace(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for StreamPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("writer", &self.shared.activity.writer())
            .field("manual_clock", &self.shared.manual_clock)
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// A state over these stores with the default configuration and no testing clock. Writes
    /// without a `Flightlog-Writer` header act as `activity`'s own writer identity.
    pub fn new(activity: Arc<dyn ActivityStore>, journal: Arc<dyn EngagementJournal>) -> Self {
        let config = ServerConfig::default();
        let shared = Shared {
            writers: Arc::new(WriterHandles::new(config.writer_cache_capacity)),
            write_permits: write_permits(&config),
            batch_lanes: Arc::new(Semaphore::new(Self::BATCH_LANES)),
            response_budget: ResponseBudget::new(config.response_budget_bytes),
            request_budget: request_budget(&config),
            connection_slots: ConnectionSlots::new(config.max_connections),
            maintenance_writer: format!("{}/maintenance", activity.writer()).into(),
            activity,
            journal,
            manual_clock: None,
            config: Arc::new(config),
            open_streams: Arc::default(),
            change_tail: Arc::default(),
            journal_hub: Arc::default(),
            run_hub: Arc::default(),
            closing: Arc::new(tokio::sync::watch::Sender::new(false)),
            metrics: Arc::new(Metrics::new()),
            otlp_mapping: Arc::new(MappingOptions::default()),
            openapi_json: Arc::new(std::sync::OnceLock::new()),
            route_methods: Arc::new(std::sync::OnceLock::new()),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Keep the finished OpenAPI document, encoded, for `GET /openapi.json`, and the methods
    /// each of its routes serves, for the auth check (the first one wins: every router built
    /// over one state describes the same routes).
    pub(crate) fn set_openapi_document(&self, document: utoipa::openapi::OpenApi) {
        use axum::http::Method;
        let route_methods = document
            .paths
            .paths
            .iter()
            .map(|(template, item)| {
                let methods = [
                    (&item.get, Method::GET),
                    (&item.get, Method::HEAD),
                    (&item.head, Method::HEAD),
                    (&item.post, Method::POST),
                    (&item.put, Method::PUT),
                    (&item.patch, Method::PATCH),
                    (&item.delete, Method::DELETE),
                ]
                .into_iter()
                .filter(|(operation, _)| operation.is_some())
                .map(|(_, method)| method)
                .collect();
                (template.clone(), methods)
            })
            .collect();
        let _ = self.shared.route_methods.set(route_methods);
        if let Ok(json) = serde_json::to_vec(&document) {
            let _ = self.shared.openapi_json.set(json.into());
        }
    }

    /// Whether the route of template `route` serves `method` (the router answers `405`
    /// otherwise); `true` for a template the document does not know.
    pub(crate) fn route_serves(&self, route: &str, method: &axum::http::Method) -> bool {
        self.shared
            .route_methods
            .get()
            .and_then(|routes| routes.get(route))
            .is_none_or(|methods| methods.contains(method))
    }

    /// The encoded OpenAPI document, once the router is built.
    pub(crate) fn openapi_document(&self) -> Option<&axum::body::Bytes> {
        self.shared.openapi_json.get()
    }

    /// How OTLP spans are mapped.
    pub fn otlp_mapping(&self) -> &MappingOptions {
        &self.shared.otlp_mapping
    }

    /// The sender that marks the server as shutting down.
    pub(crate) fn closing_signal(&self) -> Arc<tokio::sync::watch::Sender<bool>> {
        self.shared.closing.clone()
    }

    /// A place for one more live stream, held until the stream's response is dropped; `503`
    /// with `Retry-After` when [`ServerConfig::stream_limit`] streams are open already.
    pub(crate) fn open_stream(&self) -> Result<StreamPlace, crate::ApiError> {
        use std::sync::atomic::Ordering;
        let limit = self.shared.config.stream_limit();
        let open = &self.shared.open_streams;
        if open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now < limit).then_some(now + 1)
            })
            .is_err()
        {
            let connections = self.shared.config.max_connections;
            if limit == 0 {
                return Err(crate::ApiError::Unavailable(format!(
                    "this server serves no live streams: its connection limit, \
                     --max-connections {connections}, leaves its one connection to writes \
                     (streams take at most three quarters of the limit); start the server with \
                     --max-connections 2 or more"
                )));
            }
            return Err(crate::ApiError::Unavailable(format!(
                "{limit} live streams are open, the most this server serves at once (three \
                 quarters of its connection limit, --max-connections {connections}, so that \
                 writes always find a connection); retry later, or start the server with a \
                 higher --max-connections"
            )));
        }
        Ok(StreamPlace(Arc::clone(open)))
    }

    /// A receiver that turns `true` when the server starts shutting down.
    pub(crate) fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shared.closing.subscribe()
    }

    /// The same state with `config`.
    #[must_use]
    pub fn with_config(mut self, config: ServerConfig) -> Self {
        let shared = Arc::make_mut(&mut self.shared);
        shared.writers = Arc::new(WriterHandles::new(config.writer_cache_capacity));
        shared.write_permits = write_permits(&config);
        shared.response_budget = ResponseBudget::new(config.response_budget_bytes);
        shared.request_budget = request_budget(&config);
        shared.connection_slots = ConnectionSlots::new(config.max_connections);
        shared.config = Arc::new(config);
        self
    }

    /// The same state with a testing clock: `PUT /v1/testing/clock` moves it. `clock` must be
    /// the clock the stores were built with, or moving it changes nothing they see.
    #[must_use]
    pub fn with_manual_clock(mut self, clock: Arc<ManualClock>) -> Self {
        Arc::make_mut(&mut self.shared).manual_clock = Some(clock);
        self
    }

    /// The same state with `writer` as the identity of maintenance called over HTTP without a
    /// `Flightlog-Writer` header (`flightlog serve` gives its scheduled maintenance's,
    /// `serve:<instance>/maintenance`; the default is the server's own identity followed by
    /// `/maintenance`). It must be an identity no span carries, so that `sweep-stale` spares
    /// no one: acting as the server's own would spare every run written without the header.
    #[must_use]
    pub fn with_maintenance_writer(mut self, writer: &str) -> Self {
        Arc::make_mut(&mut self.shared).maintenance_writer = writer.into();
        self
    }

    /// The activity store acting as the maintenance identity (see
    /// [`AppState::with_maintenance_writer`]).
    pub fn maintenance_activity(&self) -> Arc<dyn ActivityStore> {
        self.activity_as(&self.shared.maintenance_writer)
    }

    /// The activity store acting as the server's own writer identity.
    pub fn activity(&self) -> &Arc<dyn ActivityStore> {
        &self.shared.activity
    }

    /// The change stream's shared tail (see [`crate::change_tail`]).
    pub(crate) fn change_tail(&self) -> &Arc<crate::change_tail::ChangeTail> {
        &self.shared.change_tail
    }

    /// The activity store acting as `writer` (the server's own handle when that is its name).
    pub fn activity_as(&self, writer: &str) -> Arc<dyn ActivityStore> {
        if writer == self.shared.activity.writer() {
            return Arc::clone(&self.shared.activity);
        }
        self.shared
            .writers
            .get_or_make(writer, || self.shared.activity.with_writer(writer))
    }

    /// The engagement journal.
    pub fn journal(&self) -> &Arc<dyn EngagementJournal> {
        &self.shared.journal
    }

    /// The run streams' wake-ups (see [`crate::run_hub`]).
    pub(crate) fn run_hub(&self) -> &crate::run_hub::RunHub {
        &self.shared.run_hub
    }

    /// The routes of the journal's events to engagement streams (see [`crate::journal_hub`]).
    pub(crate) fn journal_hub(&self) -> &crate::journal_hub::JournalHub {
        &self.shared.journal_hub
    }

    /// The testing clock, when the server runs with one.
    pub fn manual_clock(&self) -> Option<&Arc<ManualClock>> {
        self.shared.manual_clock.as_ref()
    }

    /// The budget of large answers in flight.
    pub fn response_budget(&self) -> &ResponseBudget {
        &self.shared.response_budget
    }

    /// The budget of request bodies in flight.
    pub fn request_budget(&self) -> &RequestBudget {
        &self.shared.request_budget
    }

    /// The connection limit both listeners share.
    pub fn connection_slots(&self) -> &ConnectionSlots {
        &self.shared.connection_slots
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.shared.config
    }

    /// The write limit's slots.
    /// How many batch requests are read, parsed and written at once. The writer applies one
    /// batch job after another, so a few in flight keep it busy; every batch beyond that only
    /// held its parsed ops in memory while it queued (64 clients of 216-op batches took the
    /// server's RSS from 60 to 90–100 MiB).
    pub(crate) const BATCH_LANES: usize = 8;

    /// The batch lanes (see [`Self::BATCH_LANES`]).
    pub(crate) fn batch_lanes(&self) -> &Arc<Semaphore> {
        &self.shared.batch_lanes
    }

    pub(crate) fn write_permits(&self) -> &Arc<Semaphore> {
        &self.shared.write_permits
    }

    /// Wait, at most `limit`, until no write holds a slot of the write limit; how many still do
    /// then. A write whose client went away goes on after its connection closed (see
    /// `finish_on_drop`), so a stop that has closed every connection waits for those before it
    /// closes the store under them.
    pub async fn writes_finished(&self, limit: std::time::Duration) -> usize {
        let all = u32::try_from(crate::overload::write_limit(self)).unwrap_or(u32::MAX);
        let every_slot = self.write_permits().acquire_many(all);
        match tokio::time::timeout(limit, every_slot).await {
            Ok(Ok(_every_slot)) => 0,
            _ => crate::overload::writes_in_flight(self),
        }
    }

    /// The metrics counted as requests come and go.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }
}

/// The slots of `config`'s write limit (capped at what a tokio semaphore holds, so no
/// configuration can make it panic).
fn write_permits(config: &ServerConfig) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(
        config.max_inflight_writes.min(Semaphore::MAX_PERMITS),
    ))
}

/// The budgets of request bodies in flight for `config`: `--request-budget` for large bodies,
/// one small body's worth a write slot for small ones (see [`crate::request_budget`]).
fn request_budget(config: &ServerConfig) -> RequestBudget {
    RequestBudget::new(
        config.request_budget_bytes,
        RequestBudget::small_bytes_for(config.max_inflight_writes),
    )
}

/// A bounded map of writer name → handle (generic so the bound is testable without a store).
///
/// A std `Mutex`, not tokio's: it is held for a hash lookup and never across an `.await`.
struct WriterHandles<T = Arc<dyn ActivityStore>> {
    capacity: usize,
    handles: Mutex<HashMap<String, T>>,
}

impl<T: Clone> WriterHandles<T> {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            handles: Mutex::new(HashMap::new()),
        }
    }

    /// The cached handle for `writer`, or a new one from `make` (cached when there is room; when
    /// the map is full one arbitrary entry makes way, which only costs its re-creation later).
    fn get_or_make(&self, writer: &str, make: impl FnOnce() -> T) -> T {
        // A poisoned lock only means another request panicked mid-lookup; the map is still a
        // valid cache.
        let mut handles = self
            .handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(handle) = handles.get(writer) {
            return handle.clone();
        }
        let handle = make();
        if self.capacity == 0 {
            return handle;
        }
        if handles.len() >= self.capacity {
            if let Some(victim) = handles.keys().next().cloned() {
                handles.remove(&victim);
            }
        }
        handles.insert(writer.to_owned(), handle.clone());
        handle
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.handles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_cache_reuses_handles_and_stays_bounded() {
        let handles: WriterHandles<Arc<str>> = WriterHandles::new(2);
        let first = handles.get_or_make("w1", || Arc::from("w1"));
        let again = handles.get_or_make("w1", || Arc::from("other"));
        assert!(Arc::ptr_eq(&first, &again));
        for writer in ["w2", "w3", "w4"] {
            let handle = handles.get_or_make(writer, || Arc::from(writer));
            assert_eq!(&*handle, writer);
            assert!(handles.len() <= 2);
        }
        let uncached: WriterHandles<Arc<str>> = WriterHandles::new(0);
        uncached.get_or_make("w1", || Arc::from("w1"));
        assert_eq!(uncached.len(), 0);
    }
}
