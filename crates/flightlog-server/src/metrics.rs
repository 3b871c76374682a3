//! `GET /metrics`: what the server is doing, in the Prometheus text exposition format (0.0.4), so
//! an operator can scrape it without any agent or sidecar.
//!
//! Two kinds of values:
//! - counted as things happen, in the state's [`Metrics`] (one registry per server state, no
//!   global recorder, so two servers in one process, as in the tests, never mix their numbers):
//!   requests by route template, method and status; request durations; writes refused by the
//!   write limit; live stream clients; stream events sent, and streams the server ended (resync
//!   or error); OTLP spans by what became of them; the scheduled maintenance's steps (see
//!   `crate::maintenance`), when each last succeeded, and the stuck runs its last pass found;
//!   the server's version (`flightlog_build_info`);
//! - read at scrape time and never stored: the activity store's change cursor, the writes in
//!   flight (from the write limit's semaphore), the budget of large answers (its size, what is
//!   held of it, the answers it refused), the process's resident memory and start time,
//!   and the storage backend's own numbers (`ActivityStore::backend_metrics`: on SQLite the
//!   writer thread's group commits, its queue, the WAL and the file sizes).
//!
//! Labels are bounded: `route` is the matched route *template* (`/v1/activity/spans/{spanId}`),
//! never the raw path, and a request no route serves is counted under `route="unmatched"`, so
//! neither ids nor probing can grow the number of series. A request whose head could not be
//! parsed (answered by hyper itself, 400, 414 or 431: see `parse_error_body`) is counted under
//! `route="unparsed"`, `method="other"`.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use flightlog_core::{BackendMetric, MetricKind};
use flightlog_otlp::{IngestTally, Signal};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::maintenance::Step;
use crate::openapi::tags;
use crate::overload;
use crate::response_budget::BudgetUsage;
use crate::state::AppState;

/// The `Content-Type` of the answer: the Prometheus text format, version 0.0.4.
pub const CONTENT_TYPE_TEXT: &str = prometheus_text::CONTENT_TYPE;

/// The `route` label of a request no route serves.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// The `route` label of a request whose head could not be parsed.
pub const UNPARSED_ROUTE: &str = "unparsed";

/// Upper bounds (seconds) of the request-duration buckets: a local SQLite read answers in well
/// under a millisecond, a group commit in a few, so the low end is fine-grained; the top ones
/// tell apart writes that waited out another process's write lock (10 s by default, twice that
/// behind the queue) and large bodies (a minute at most).
const DURATION_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Labels of `flightlog_http_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: &'static str,
    status: u16,
}

/// Counts the requests hyper answered itself because their head could not be parsed, in
/// `flightlog_http_requests_total` (see [`Metrics::unparsed_requests`]).
#[derive(Debug, Clone)]
pub(crate) struct UnparsedRequests {
    requests: Family<RequestLabels, Counter>,
}

impl UnparsedRequests {
    /// Count one such request, answered `status` (400, 414 or 431).
    pub(crate) fn count(&self, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                route: UNPARSED_ROUTE.to_owned(),
                method: "other",
                status,
            })
            .inc();
    }
}

/// Labels of `flightlog_http_request_duration_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: &'static str,
}

/// Labels of `flightlog_stream_clients`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    stream: &'static str,
}

/// Labels of `flightlog_stream_ends_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamEndLabels {
    stream: &'static str,
    reason: &'static str,
}

/// Labels of `flightlog_otlp_spans_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OtlpSpanLabels {
    result: &'static str,
}

/// Labels of `flightlog_otlp_not_stored_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OtlpSignalLabels {
    signal: &'static str,
}

/// Labels of `flightlog_http_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    code: &'static str,
}

/// Labels of `flightlog_grpc_calls_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GrpcCallLabels {
    method: &'static str,
    code: &'static str,
}

/// Labels of `flightlog_maintenance_passes_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MaintenanceLabels {
    step: &'static str,
    result: &'static str,
}

/// Labels of `flightlog_maintenance_last_success_timestamp_seconds`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
}

/// Labels of `flightlog_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// The counters of the scheduled maintenance (see `crate::maintenance`); clones share them.
#[derive(Debug, Clone)]
pub(crate) struct MaintenanceMetrics {
    passes: Family<MaintenanceLabels, Counter>,
    /// When each step last succeeded (wall clock, seconds since the Unix epoch); a step that
    /// never has has no series.
    last_success: Family<StepLabels, Gauge<f64, AtomicU64>>,
    /// Spans the stale sweep closed.
    pub stale_spans_closed: Counter,
    /// Runs whose detail the retention pruned.
    pub runs_pruned: Counter,
    /// Spans deleted with them.
    pub spans_pruned: Counter,
    /// Change-log rows the scheduled prune trimmed (far behind the newest).
    pub changes_trimmed: Counter,
    /// 1 when the last pass's prune ran out of time with more to prune or trim, else 0.
    pub prune_behind: Gauge,
    /// Engagements the journal's retention removed.
    pub engagements_removed: Counter,
    /// Open roots running longer than the stuck threshold at the last pass.
    pub runs_stuck: Gauge,
}

impl MaintenanceMetrics {
    /// Count one run of `step`, successful or not; a success also sets its timestamp.
    pub(crate) fn pass(&self, step: Step, succeeded: bool) {
        self.passes
            .get_or_create(&MaintenanceLabels {
                step: step.as_str(),
                result: if succeeded { "ok" } else { "error" },
            })
            .inc();
        if succeeded {
            self.last_success
                .get_or_create(&StepLabels {
                    step: step.as_str(),
                })
                .set(unix_time_seconds());
        }
    }
}

/// Which live stream a client follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// `GET /v1/activity/changes/stream`.
    Changes,
    /// `GET /v1/activity/runs/{runId}/stream`.
    Run,
    /// `GET /v1/engagements/{engagementId}/stream`.
    Journal,
}

impl StreamKind {
    const ALL: [StreamKind; 3] = [Self::Changes, Self::Run, Self::Journal];

    /// The `stream` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Changes => "changes",
            Self::Run => "run",
            Self::Journal => "journal",
        }
    }
}

type DurationFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// The metrics counted as things happen; one per server state.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: DurationFamily,
    writes_refused: Counter,
    writes_abandoned: Counter,
    stream_clients: Family<StreamLabels, Gauge>,
    stream_events: Family<StreamLabels, Counter>,
    stream_ends: Family<StreamEndLabels, Counter>,
    stream_resyncs: Family<StreamLabels, Counter>,
    otlp_spans: Family<OtlpSpanLabels, Counter>,
    otlp_span_events: Counter,
    otlp_dropped: Family<OtlpSignalLabels, Counter>,
    grpc_calls: Family<GrpcCallLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    maintenance: MaintenanceMetrics,
    /// The request metrics of each route seen, by its template. The families find a metric by
    /// hashing its labels with SipHash, the route as an owned `String`: two lookups and a copy
    /// cost ~1,000 instructions a request (callgrind, single-op writes); this map is looked up
    /// by the template as borrowed, with foldhash. Bounded: templates, methods and statuses are
    /// a few dozen each at most.
    by_route: RwLock<foldhash::HashMap<Box<str>, RouteMetrics>>,
}

/// The request metrics of one route: its duration histogram per method, its counter per
/// method and status (handles onto the families' own metrics, a handful each).
#[derive(Debug, Default)]
struct RouteMetrics {
    durations: Vec<(&'static str, Histogram)>,
    requests: Vec<(&'static str, u16, Counter)>,
}

impl RouteMetrics {
    fn duration(&self, method: &str) -> Option<&Histogram> {
        self.durations
            .iter()
            .find(|(known, _)| *known == method)
            .map(|(_, histogram)| histogram)
    }

    fn requests(&self, method: &str, status: u16) -> Option<&Counter> {
        self.requests
            .iter()
            .find(|(known, known_status, _)| *known == method && *known_status == status)
            .map(|(_, _, counter)| counter)
    }
}

/// The ways a stream ends on the server's side, each counted in `flightlog_stream_ends_total`.
#[derive(Debug, Clone)]
pub(crate) struct StreamEnds {
    /// The client's cursor fell behind the trimmed change log: it was told to resync.
    pub resync: Counter,
    /// The store failed while the stream read it: an `error` event ended it.
    pub error: Counter,
    /// Every `resync` event sent (`flightlog_stream_resyncs_total`): the changes and run
    /// streams end with one; a journal stream goes on from seq 0 after it.
    pub resync_sent: Counter,
}

/// The `result` labels of `flightlog_otlp_spans_total`, in [`IngestTally`] order.
const OTLP_RESULTS: [&str; 5] = ["created", "completed", "refreshed", "unchanged", "rejected"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh metrics, every counter at zero.
    pub fn new() -> Self {
        // Fix the start time the first time any server state is made: close to the process's
        // own start for `flightlog serve`, and the same for every state of one process.
        process_start_time();
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "flightlog_http_requests",
            "HTTP requests answered, by matched route template, method and status code",
            requests.clone(),
        );
        let durations: DurationFamily =
            Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        registry.register(
            "flightlog_http_request_duration_seconds",
            "Time from receiving a request to its response head (for a stream: until the stream \
             started), by matched route template and method",
            durations.clone(),
        );
        let writes_refused = Counter::default();
        registry.register(
            "flightlog_http_writes_refused",
            "Write requests refused because the write limit had no free slot in time (HTTP \
             503, or UNAVAILABLE for an OTLP/gRPC export, which shares the limit)",
            writes_refused.clone(),
        );
        let writes_abandoned = Counter::default();
        registry.register(
            "flightlog_http_writes_abandoned",
            "Write requests (HTTP or OTLP/gRPC) whose client left before their answer: it \
             closed the connection (or, over HTTP/1, its sending side: a client that half-closes \
             to wait for its answer, which cannot be told apart, is counted too and gets the \
             answer), or a gRPC deadline passed; each still ran to its end holding its slot of \
             the write limit (an HTTP one is counted in flightlog_http_requests_total with its \
             status)",
            writes_abandoned.clone(),
        );
        let stream_clients = Family::<StreamLabels, Gauge>::default();
        for kind in StreamKind::ALL {
            // Every kind is exported from the start (at 0), not only once a client came.
            let _ = stream_clients.get_or_create_owned(&StreamLabels {
                stream: kind.as_str(),
            });
        }
        registry.register(
            "flightlog_stream_clients",
            "Live Server-Sent-Event streams open now, by stream kind",
            stream_clients.clone(),
        );
        let stream_events = Family::<StreamLabels, Counter>::default();
        let stream_ends = Family::<StreamEndLabels, Counter>::default();
        let stream_resyncs = Family::<StreamLabels, Counter>::default();
        for kind in StreamKind::ALL {
            let stream = kind.as_str();
            let _ = stream_events.get_or_create_owned(&StreamLabels { stream });
            let _ = stream_resyncs.get_or_create_owned(&StreamLabels { stream });
            // A journal stream's resync does not end it (see `flightlog_stream_resyncs`).
            let reasons: &[&'static str] = if kind == StreamKind::Journal {
                &["error"]
            } else {
                &["resync", "error"]
            };
            for &reason in reasons {
                let _ = stream_ends.get_or_create_owned(&StreamEndLabels { stream, reason });
            }
        }
        registry.register(
            "flightlog_stream_events",
            "Events sent on live streams (snapshots, changes, journal events, resync and error \
             events; not keep-alive comments), by stream kind",
            stream_events.clone(),
        );
        registry.register(
            "flightlog_stream_ends",
            "Streams the server ended: `resync` when a changes or run stream's client fell \
             behind what the change log holds (it must take a new snapshot), `error` when the \
             store failed under it",
            stream_ends.clone(),
        );
        registry.register(
            "flightlog_stream_resyncs",
            "Resync events sent, by stream kind: a changes or run stream ends with one; a \
             journal stream sends one after a compaction or prune and goes on from seq 0",
            stream_resyncs.clone(),
        );
        let otlp_spans = Family::<OtlpSpanLabels, Counter>::default();
        for result in OTLP_RESULTS {
            let _ = otlp_spans.get_or_create_owned(&OtlpSpanLabels { result });
        }
        registry.register(
            "flightlog_otlp_spans",
            "Spans received over OTLP (HTTP and gRPC), by what became of them: `created` (new), \
             `completed` (stored open before, now ended), `refreshed` (stored open before and \
             still open: an announcement delivered again), `unchanged` (a repeated delivery of \
             an ended span), `rejected` \
             (refused, and reported in partialSuccess)",
            otlp_spans.clone(),
        );
        let otlp_span_events = Counter::default();
        registry.register(
            "flightlog_otlp_span_events",
            "Span events written from OTLP spans",
            otlp_span_events.clone(),
        );
        let otlp_dropped = Family::<OtlpSignalLabels, Counter>::default();
        for signal in Signal::ALL {
            let _ = otlp_dropped.get_or_create_owned(&OtlpSignalLabels {
                signal: signal.as_str(),
            });
        }
        registry.register(
            "flightlog_otlp_not_stored",
            "OTLP metric data points and log records received (HTTP and gRPC), read and \
             answered but not stored (flightlog keeps traces), by signal",
            otlp_dropped.clone(),
        );
        let grpc_calls = Family::<GrpcCallLabels, Counter>::default();
        registry.register(
            "flightlog_grpc_calls",
            "OTLP/gRPC calls answered, by method (the three OTLP Export methods, `other` for any \
             other path) and gRPC status code (`OK`, `UNAUTHENTICATED`, `RESOURCE_EXHAUSTED`, \
             `UNAVAILABLE`, …); the HTTP listener's requests are in \
             flightlog_http_requests_total",
            grpc_calls.clone(),
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "flightlog_http_errors",
            "HTTP error answers by the contract's error code (`conflict` apart from \
             `journal_full`, `unavailable`, `invalid_request`, …); the statuses are in \
             flightlog_http_requests_total, and an OTLP exporter's protobuf error answers are \
             not in it",
            errors.clone(),
        );
        let maintenance = MaintenanceMetrics::register(&mut registry);
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        registry.register(
            "flightlog_build_info",
            "Always 1; its `version` label is the running server's version",
            build_info,
        );
        Self {
            registry,
            requests,
            durations,
            writes_refused,
            writes_abandoned,
            stream_clients,
            stream_events,
            stream_ends,
            stream_resyncs,
            otlp_spans,
            otlp_span_events,
            otlp_dropped,
            grpc_calls,
            errors,
            maintenance,
            by_route: RwLock::default(),
        }
    }

    /// Count one HTTP error answer with the contract's error `code`.
    pub(crate) fn observe_error(&self, code: &'static str) {
        self.errors.get_or_create(&ErrorLabels { code }).inc();
    }

    /// Count one OTLP/gRPC call answered with `code` (a `flightlog_grpc_calls_total` label
    /// value, as [`crate::grpc`] names it).
    pub(crate) fn observe_grpc_call(&self, method: &'static str, code: &'static str) {
        self.grpc_calls
            .get_or_create(&GrpcCallLabels { method, code })
            .inc();
    }

    /// Count the items of an OTLP export of a signal that is not stored.
    pub(crate) fn observe_dropped(&self, signal: Signal, items: u64) {
        self.otlp_dropped
            .get_or_create(&OtlpSignalLabels {
                signal: signal.as_str(),
            })
            .inc_by(items);
    }

    /// The scheduled maintenance's counters (handles: clones share the counts).
    pub(crate) fn maintenance(&self) -> MaintenanceMetrics {
        self.maintenance.clone()
    }

    /// Count what one OTLP export did with its spans (HTTP or gRPC).
    pub(crate) fn observe_ingest(&self, tally: &IngestTally) {
        let counts = [
            tally.created,
            tally.completed,
            tally.refreshed,
            tally.unchanged,
            tally.rejected,
        ];
        for (result, count) in OTLP_RESULTS.into_iter().zip(counts) {
            if count > 0 {
                self.otlp_spans
                    .get_or_create(&OtlpSpanLabels { result })
                    .inc_by(count);
            }
        }
        self.otlp_span_events.inc_by(tally.events_added);
    }

    /// The counter of events sent on streams of `kind` (a handle: clones share the count).
    pub(crate) fn stream_events(&self, kind: StreamKind) -> Counter {
        self.stream_events
            .get_or_create(&StreamLabels {
                stream: kind.as_str(),
            })
            .clone()
    }

    /// The counters of the ways a stream of `kind` ends on the server's side.
    pub(crate) fn stream_ends(&self, kind: StreamKind) -> StreamEnds {
        let stream = kind.as_str();
        let counter = |reason| {
            self.stream_ends
                .get_or_create(&StreamEndLabels { stream, reason })
                .clone()
        };
        StreamEnds {
            // A journal stream's resync does not end it: no series for what never happens (one
            // appeared, at 0, with the first journal stream; an audit's finding).
            resync: if kind == StreamKind::Journal {
                Counter::default()
            } else {
                counter("resync")
            },
            error: counter("error"),
            resync_sent: self
                .stream_resyncs
                .get_or_create(&StreamLabels { stream })
                .clone(),
        }
    }

    /// Count one answered request.
    pub(crate) fn observe_request(
        &self,
        route: &str,
        method: &'static str,
        status: u16,
        seconds: f64,
    ) {
        {
            let by_route = self.by_route.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(known) = by_route.get(route) {
                if let (Some(duration), Some(requests)) =
                    (known.duration(method), known.requests(method, status))
                {
                    duration.observe(seconds);
                    requests.inc();
                    return;
                }
            }
        }
        // A route, method or status not seen yet: its metrics from the families, kept.
        let duration = self
            .durations
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
                method,
            })
            .clone();
        let requests = self
            .requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                method,
                status,
            })
            .clone();
        duration.observe(seconds);
        requests.inc();
        let mut by_route = self
            .by_route
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let known = by_route.entry(route.into()).or_default();
        if known.duration(method).is_none() {
            known.durations.push((method, duration));
        }
        if known.requests(method, status).is_none() {
            known.requests.push((method, status, requests));
        }
    }

    /// Where the requests whose head could not be parsed are counted: handed to each HTTP/1
    /// connection's socket wrapper, which sees their answers (hyper's own).
    pub(crate) fn unparsed_requests(&self) -> UnparsedRequests {
        UnparsedRequests {
            requests: self.requests.clone(),
        }
    }

    /// Count one write refused by the write limit.
    pub(crate) fn write_refused(&self) {
        self.writes_refused.inc();
    }

    /// Count one write whose client went away before its answer (see `finish_on_drop`).
    pub(crate) fn write_abandoned(&self) {
        self.writes_abandoned.inc();
    }

    /// A stream client of `kind` came; the gauge goes down again when the guard is dropped.
    pub(crate) fn stream_opened(&self, kind: StreamKind) -> StreamClient {
        let gauge = self
            .stream_clients
            .get_or_create(&StreamLabels {
                stream: kind.as_str(),
            })
            .clone();
        gauge.inc();
        StreamClient(gauge)
    }

    /// The exposition: the counted metrics followed by the values read at scrape time.
    fn encode(&self, scrape: &ScrapeValues) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        prometheus_text::encode(&mut text, &self.registry)?;
        prometheus_text::encode(&mut text, &scrape.registry())?;
        Ok(text)
    }
}

impl MaintenanceMetrics {
    /// Fresh counters, registered in `registry` (every step and result at 0 from the start).
    fn register(registry: &mut Registry) -> Self {
        let passes = Family::<MaintenanceLabels, Counter>::default();
        for step in Step::ALL {
            for result in ["ok", "error"] {
                let _ = passes.get_or_create_owned(&MaintenanceLabels {
                    step: step.as_str(),
                    result,
                });
            }
        }
        registry.register(
            "flightlog_maintenance_passes",
            "Steps of the scheduled maintenance run (--maintenance-every-ms), by step \
             (stale_sweep, stuck, prune, journal_prune) and result (ok, error)",
            passes.clone(),
        );
        let last_success = Family::<StepLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "flightlog_maintenance_last_success_timestamp_seconds",
            "When each step of the scheduled maintenance last succeeded, in seconds since the \
             Unix epoch by the machine's clock (absent for a step that has not yet); alert on \
             time() minus it to learn that retention or the stale sweep has stopped working",
            last_success.clone(),
        );
        let stale_spans_closed = Counter::default();
        registry.register(
            "flightlog_maintenance_stale_spans_closed",
            "Spans the scheduled stale sweep closed as interrupted (writer went silent)",
            stale_spans_closed.clone(),
        );
        let runs_pruned = Counter::default();
        registry.register(
            "flightlog_maintenance_runs_pruned",
            "Ended runs whose detail (spans, events, changes) the scheduled prune deleted; \
             their rollups are kept",
            runs_pruned.clone(),
        );
        let spans_pruned = Counter::default();
        registry.register(
            "flightlog_maintenance_spans_pruned",
            "Spans deleted by the scheduled prune",
            spans_pruned.clone(),
        );
        let changes_trimmed = Counter::default();
        registry.register(
            "flightlog_maintenance_changes_trimmed",
            "Change-log rows the scheduled prune trimmed (rows of ended runs more than 100,000 \
             change ids behind the newest)",
            changes_trimmed.clone(),
        );
        let prune_behind = Gauge::default();
        registry.register(
            "flightlog_maintenance_prune_behind",
            "1 when the last maintenance pass's prune ran out of its time (a quarter of the \
             interval, at least 2 s) with runs left to prune or change rows left to trim, so \
             the database grows faster than retention removes; 0 when it finished",
            prune_behind.clone(),
        );
        let engagements_removed = Counter::default();
        registry.register(
            "flightlog_maintenance_engagements_removed",
            "Idle engagements the scheduled journal prune removed (journal.max_age_ms)",
            engagements_removed.clone(),
        );
        let runs_stuck = Gauge::default();
        registry.register(
            "flightlog_runs_stuck",
            "Open runs whose root has run longer than --stuck-after-ms, at the last maintenance \
             pass (0 while the watchdog is off)",
            runs_stuck.clone(),
        );
        Self {
            passes,
            last_success,
            stale_spans_closed,
            runs_pruned,
            spans_pruned,
            changes_trimmed,
            prune_behind,
            engagements_removed,
            runs_stuck,
        }
    }
}

/// One open stream, counted in `flightlog_stream_clients` until dropped.
#[derive(Debug)]
pub(crate) struct StreamClient(Gauge);

impl Drop for StreamClient {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The values read at scrape time.
#[derive(Debug, Clone, PartialEq)]
struct ScrapeValues {
    /// `None` when the store could not be read (the rest of the scrape still answers).
    change_cursor: Option<i64>,
    writes_in_flight: i64,
    write_limit: i64,
    /// `None` where `/proc/self/status` does not exist (not Linux).
    resident_memory_bytes: Option<i64>,
    start_time_seconds: f64,
    /// What the store's backend reports about itself (see [`BackendMetric`]).
    backend: Vec<BackendMetric>,
    /// The budget of large answers (see `response_budget`).
    response_budget: BudgetUsage,
    /// The budget of large request bodies in flight (see `request_budget`).
    request_budget: BudgetUsage,
    /// The budget of small request bodies in flight.
    small_body_budget: BudgetUsage,
    /// Request bodies refused for arriving too slowly while another waited for their share.
    slow_bodies_refused: u64,
    /// Connections open now over both listeners.
    connections_open: usize,
    /// The connection limit (`--max-connections`).
    connection_limit: usize,
    /// How many times the open connections reached the limit.
    connection_limit_reached: u64,
    /// Idle connections closed to make room for a client at the limit.
    idle_connections_closed: u64,
    /// Connections closed for a client that read nothing for the write-stall limit.
    stalled_connections_closed: u64,
}

impl ScrapeValues {
    /// A registry holding just these values, made per scrape (a few allocations) so that a value
    /// that could not be read is absent rather than stale.
    fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        if let Some(cursor) = self.change_cursor {
            registry.register(
                "flightlog_activity_change_cursor",
                "The activity store's highest change id given out: the highest still in the log \
                 (latestChangeCursor), or below the log's horizon when a prune took the newest",
                gauge_i64(cursor),
            );
        }
        registry.register(
            "flightlog_http_writes_in_flight",
            "Write requests holding a slot of the write limit now",
            gauge_i64(self.writes_in_flight),
        );
        registry.register(
            "flightlog_http_write_limit",
            "The write limit: the most write requests handled at once",
            gauge_i64(self.write_limit),
        );
        registry.register(
            "flightlog_http_connections_open",
            "Connections open now, over the HTTP and gRPC listeners",
            gauge_i64(saturating_i64(self.connections_open)),
        );
        registry.register(
            "flightlog_http_connection_limit",
            "The most connections served at once (--max-connections); past it an idle one is \
             closed to make room, or new ones wait until one closes",
            gauge_i64(saturating_i64(self.connection_limit)),
        );
        let reached: Counter = Counter::default();
        reached.inc_by(self.connection_limit_reached);
        registry.register(
            "flightlog_http_connection_limit_reached",
            "Times a client connected while every connection slot was taken (it waited until \
             an idle one was closed or one ended)",
            reached,
        );
        let idle_closed: Counter = Counter::default();
        idle_closed.inc_by(self.idle_connections_closed);
        registry.register(
            "flightlog_http_idle_connections_closed",
            "Idle connections (no request in flight) closed to make room for a client that \
             connected while every connection slot was taken",
            idle_closed,
        );
        let stalled: Counter = Counter::default();
        stalled.inc_by(self.stalled_connections_closed);
        registry.register(
            "flightlog_http_stalled_connections_closed",
            "Connections (HTTP and gRPC) closed because their client read nothing for the \
             write-stall limit (30 s by default) while an answer or a live stream waited to be \
             written to it",
            stalled,
        );
        if let Some(bytes) = self.resident_memory_bytes {
            registry.register(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                gauge_i64(bytes),
            );
        }
        let budget = self.response_budget;
        registry.register(
            "flightlog_http_response_budget_bytes",
            "The budget of large answers (over 1 MiB) held until written to the socket \
             (--response-budget)",
            gauge_i64(saturating_i64(budget.total_bytes)),
        );
        registry.register(
            "flightlog_http_response_budget_held_bytes",
            "What large answers hold of that budget now",
            gauge_i64(saturating_i64(budget.held_bytes)),
        );
        let refused: Counter = Counter::default();
        refused.inc_by(budget.refused);
        registry.register(
            "flightlog_http_large_responses_refused",
            "Large answers refused (HTTP 503) because the budget stayed taken by other clients' \
             answers",
            refused,
        );
        let bodies = self.request_budget;
        registry.register(
            "flightlog_http_request_budget_bytes",
            "The budget of request bodies over 64 KiB, held from when their first 64 KiB \
             have arrived until they are answered (--request-budget)",
            gauge_i64(saturating_i64(bodies.total_bytes)),
        );
        registry.register(
            "flightlog_http_request_budget_held_bytes",
            "What request bodies hold of that budget now",
            gauge_i64(saturating_i64(bodies.held_bytes)),
        );
        let small = self.small_body_budget;
        registry.register(
            "flightlog_http_small_body_budget_bytes",
            "The budget of the first 64 KiB of request bodies (all of nearly every write), \
             held as they arrive until they are answered (64 KiB a slot of the write limit)",
            gauge_i64(saturating_i64(small.total_bytes)),
        );
        registry.register(
            "flightlog_http_small_body_budget_held_bytes",
            "What request bodies hold of that budget now",
            gauge_i64(saturating_i64(small.held_bytes)),
        );
        let refused: Counter = Counter::default();
        refused.inc_by(bodies.refused.saturating_add(small.refused));
        registry.register(
            "flightlog_http_request_bodies_refused",
            "Requests refused (HTTP 503, gRPC UNAVAILABLE) because other requests' bodies held \
             a budget of bodies in flight",
            refused,
        );
        let slow: Counter = Counter::default();
        slow.inc_by(self.slow_bodies_refused);
        registry.register(
            "flightlog_http_slow_request_bodies_refused",
            "Request bodies refused (HTTP 503, gRPC UNAVAILABLE) for arriving slower than \
             128 KiB/s while another request waited for the budget they held",
            slow,
        );
        let start: Gauge<f64, AtomicU64> = Gauge::default();
        start.set(self.start_time_seconds);
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            start,
        );
        for sample in &self.backend {
            // Counts are written as integers, as the server's own are (`3`, not `3.0`); a
            // duration (`_seconds`) stays a float even when whole, so its type never changes.
            let count = (!sample.name.ends_with("_seconds"))
                .then(|| flightlog_core::json_number::exact_integer(sample.value))
                .flatten();
            match (sample.kind, count) {
                (MetricKind::Counter, Some(count)) if count >= 0 => {
                    let counter: Counter = Counter::default();
                    counter.inc_by(count.unsigned_abs());
                    registry.register(sample.name, sample.help, counter);
                }
                (MetricKind::Gauge, Some(count)) => {
                    registry.register(sample.name, sample.help, gauge_i64(count));
                }
                (MetricKind::Counter, _) => {
                    let counter: Counter<f64, AtomicU64> = Counter::default();
                    counter.inc_by(sample.value);
                    registry.register(sample.name, sample.help, counter);
                }
                (MetricKind::Gauge, None) => {
                    let gauge: Gauge<f64, AtomicU64> = Gauge::default();
                    gauge.set(sample.value);
                    registry.register(sample.name, sample.help, gauge);
                }
            }
        }
        registry
    }
}

fn gauge_i64(value: i64) -> Gauge<i64, AtomicI64> {
    let gauge = Gauge::default();
    gauge.set(value);
    gauge
}

/// When this process made its first server state, seconds since the Unix epoch.
fn process_start_time() -> f64 {
    static START: OnceLock<f64> = OnceLock::new();
    *START.get_or_init(unix_time_seconds)
}

/// Now by the machine's clock (never the stores' clock, which tests may drive), in seconds
/// since the Unix epoch; 0 before it.
fn unix_time_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The process's resident set size, from `VmRSS` in `/proc/self/status` (in kB there).
/// `/proc/self/statm` holds the same number in pages, but the page size needs `sysconf`, which
/// safe Rust cannot call without a libc binding; `status` gives it in kB directly.
fn resident_memory_bytes() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<i64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kilobytes: i64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kilobytes.checked_mul(1024)
}

/// The `method` label: the standard methods by name, anything else as `other`, so a client
/// inventing methods cannot grow the number of series.
pub(crate) fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// The server's metrics in the Prometheus text format (0.0.4).
///
/// Counters and histograms: `flightlog_http_requests_total{route,method,status}`,
/// `flightlog_http_request_duration_seconds{route,method}`, `flightlog_http_writes_refused_total`,
/// `flightlog_stream_events_total{stream}`, `flightlog_stream_ends_total{stream,reason}`,
/// `flightlog_otlp_spans_total{result}`, `flightlog_otlp_span_events_total`.
/// Gauges: `flightlog_build_info{version}`, `flightlog_stream_clients{stream}`, `flightlog_http_writes_in_flight`,
/// `flightlog_http_write_limit`, `flightlog_activity_change_cursor` (absent when the store could
/// not be read), `process_resident_memory_bytes` (Linux only), `process_start_time_seconds`.
/// And what the storage backend reports about itself: on SQLite the writer thread's
/// transactions, writes, apply and commit time, WAL frames and rewinds, checkpoint time, its
/// queue's depth and capacity, and the sizes of the database and WAL files
/// (`flightlog_sqlite_*`).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = tags::OPERATIONS,
    operation_id = "metrics",
    responses(
        (status = 200, description = "The exposition.", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
    ),
)]
async fn metrics(State(state): State<AppState>) -> Response {
    // A store that cannot be read leaves the cursor out instead of failing the scrape: the other
    // metrics matter most exactly when something is wrong. The gauge never goes back: a prune
    // that deletes the newest changes with their runs takes the highest id left in the log
    // down (to 0 when none is left, an audit's soak), while every id below the horizon was
    // given out; so it is the larger of the two.
    let change_cursor = match (
        state.activity().latest_change_cursor().await,
        state.activity().change_log_horizon().await,
    ) {
        (Ok(cursor), Ok(horizon)) => Some(cursor.max(horizon.saturating_sub(1))),
        (Ok(cursor), Err(_)) => Some(cursor),
        (Err(_), _) => None,
    };
    let scrape = ScrapeValues {
        change_cursor,
        writes_in_flight: saturating_i64(overload::writes_in_flight(&state)),
        write_limit: saturating_i64(overload::write_limit(&state)),
        resident_memory_bytes: resident_memory_bytes(),
        start_time_seconds: process_start_time(),
        backend: state.activity().backend_metrics(),
        response_budget: state.response_budget().usage(),
        request_budget: state.request_budget().usage(),
        small_body_budget: state.request_budget().small_usage(),
        slow_bodies_refused: state.request_budget().slow_refused(),
        connections_open: state.connection_slots().open(),
        connection_limit: state.connection_slots().limit(),
        connection_limit_reached: state.connection_slots().times_reached(),
        idle_connections_closed: state.connection_slots().idle_closed(),
        stalled_connections_closed: state.connection_slots().stalled_closed(),
    };
    match state.metrics().encode(&scrape) {
        Ok(text) => ([(CONTENT_TYPE, CONTENT_TYPE_TEXT)], text).into_response(),
        Err(_) => ApiError::Internal("cannot encode the metrics".into()).into_response(),
    }
}

fn saturating_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> ScrapeValues {
        ScrapeValues {
            change_cursor: Some(7),
            writes_in_flight: 1,
            write_limit: 4,
            resident_memory_bytes: None,
            start_time_seconds: 1.5,
            backend: vec![
                BackendMetric::counter("flightlog_test_writes", "Writes", 12.0),
                BackendMetric::gauge("flightlog_test_queue_depth", "Queued", 3.0),
                BackendMetric::counter("flightlog_test_busy_seconds", "Busy", 2.0),
                BackendMetric::gauge("flightlog_test_ratio", "A ratio", 0.5),
            ],
            response_budget: BudgetUsage {
                total_bytes: 8 << 20,
                held_bytes: 1 << 20,
                refused: 2,
            },
            request_budget: BudgetUsage {
                total_bytes: 4 << 20,
                held_bytes: 8192,
                refused: 3,
            },
            small_body_budget: BudgetUsage {
                total_bytes: 1 << 20,
                held_bytes: 640,
                refused: 4,
            },
            slow_bodies_refused: 5,
            connections_open: 6,
            connection_limit: 64,
            connection_limit_reached: 8,
            idle_connections_closed: 3,
            stalled_connections_closed: 2,
        }
    }

    #[test]
    fn requests_are_counted_by_route_method_and_status() {
        let metrics = Metrics::new();
        metrics.observe_request("/v1/activity/cursor", "GET", 200, 0.002);
        metrics.observe_request("/v1/activity/cursor", "GET", 200, 0.002);
        metrics.observe_request(UNMATCHED_ROUTE, "POST", 404, 0.0001);
        metrics.write_refused();
        metrics.write_abandoned();
        metrics.observe_error("journal_full");
        let text = metrics.encode(&scrape()).unwrap_or_default();
        for expected in [
            "# TYPE flightlog_http_requests_total counter\n",
            "flightlog_http_requests_total{route=\"/v1/activity/cursor\",method=\"GET\",status=\"200\"} 2\n",
            "flightlog_http_requests_total{route=\"unmatched\",method=\"POST\",status=\"404\"} 1\n",
            "# TYPE flightlog_http_request_duration_seconds histogram\n",
            "flightlog_http_request_duration_seconds_count{route=\"/v1/activity/cursor\",method=\"GET\"} 2\n",
            "flightlog_http_request_duration_seconds_bucket{route=\"/v1/activity/cursor\",method=\"GET\",le=\"0.0025\"} 2\n",
            "flightlog_http_writes_refused_total 1\n",
            "flightlog_http_writes_abandoned_total 1\n",
            "flightlog_http_errors_total{code=\"journal_full\"} 1\n",
            "flightlog_activity_change_cursor 7\n",
            "flightlog_http_writes_in_flight 1\n",
            "flightlog_http_write_limit 4\n",
            "flightlog_http_connections_open 6\n",
            "flightlog_http_connection_limit 64\n",
            "flightlog_http_connection_limit_reached_total 8\n",
            "flightlog_http_idle_connections_closed_total 3\n",
            "flightlog_http_stalled_connections_closed_total 2\n",
            "process_start_time_seconds 1.5\n",
            "# TYPE flightlog_test_writes_total counter\n",
            "flightlog_test_writes_total 12\n",
            "# HELP flightlog_test_queue_depth Queued.\n",
            "# TYPE flightlog_test_queue_depth gauge\n",
            "flightlog_test_queue_depth 3\n",
            // A duration stays a float, whole or not; a fraction is one.
            "flightlog_test_busy_seconds_total 2.0\n",
            "flightlog_test_ratio 0.5\n",
            "flightlog_http_response_budget_bytes 8388608\n",
            "flightlog_http_response_budget_held_bytes 1048576\n",
            "flightlog_http_large_responses_refused_total 2\n",
            "flightlog_http_request_budget_bytes 4194304\n",
            "flightlog_http_request_budget_held_bytes 8192\n",
            "flightlog_http_small_body_budget_bytes 1048576\n",
            "flightlog_http_small_body_budget_held_bytes 640\n",
            "flightlog_http_request_bodies_refused_total 7\n",
            "flightlog_http_slow_request_bodies_refused_total 5\n",
        ] {
            assert!(text.contains(expected), "{expected:?} not in:\n{text}");
        }
        assert!(!text.contains("process_resident_memory_bytes"), "{text}");
    }

    #[test]
    fn stream_clients_go_up_and_down_with_their_guards() {
        let metrics = Metrics::new();
        let first = metrics.stream_opened(StreamKind::Run);
        let second = metrics.stream_opened(StreamKind::Run);
        let text = metrics.encode(&scrape()).unwrap_or_default();
        assert!(
            text.contains("flightlog_stream_clients{stream=\"run\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("flightlog_stream_clients{stream=\"changes\"} 0\n"),
            "{text}"
        );
        drop(first);
        drop(second);
        let text = metrics.encode(&scrape()).unwrap_or_default();
        assert!(
            text.contains("flightlog_stream_clients{stream=\"run\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    fn an_unreadable_value_is_left_out_not_reported_stale() {
        let metrics = Metrics::new();
        let scrape = ScrapeValues {
            change_cursor: None,
            ..scrape()
        };
        let text = metrics.encode(&scrape).unwrap_or_default();
        assert!(!text.contains("flightlog_activity_change_cursor"), "{text}");
    }

    #[test]
    fn resident_memory_is_read_in_kilobytes() {
        let status = "Name:\tflightlog\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
        if cfg!(target_os = "linux") {
            assert!(resident_memory_bytes().is_some_and(|bytes| bytes > 0));
        }
    }

    #[test]
    fn unknown_methods_share_one_label() {
        assert_eq!(method_label(&Method::PATCH), "PATCH");
        let custom = Method::from_bytes(b"BREW").unwrap_or(Method::GET);
        assert_eq!(method_label(&custom), "other");
    }
}
