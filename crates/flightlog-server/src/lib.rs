//! flightlog's HTTP server: the wire contract (`shared/docs/http-api.md`) in front of the stores.
//!
//! [`app`] builds the router from an [`AppState`] (the activity store, the engagement journal, an
//! optional testing clock, a [`ServerConfig`]); [`serve`] runs it on a listener until a shutdown
//! future completes. Keeping them apart lets a test call the router in process or bind it to
//! `127.0.0.1:0`, and lets the binary choose the listener and the shutdown signal.
//!
//! Layout:
//! - [`error`]: [`ApiError`], the one mapping of every failure to the contract's status and body;
//! - [`extract`]: request extractors that reject with an [`ApiError`] (JSON bodies, queries, path
//!   ids, the `Flightlog-Writer` header);
//! - [`validate`]: the range checks on ids, times and page sizes;
//! - [`state`]: [`AppState`] and [`ServerConfig`];
//! - [`auth`]: bearer tokens and scopes, checked before any handler runs;
//! - [`overload`]: the write limit that answers `503 unavailable` instead of queueing forever;
//! - [`settings`]: `flightlog serve`'s flags, environment and config file, resolved and checked;
//! - [`wire`]: the small answer bodies the contract spells out inline (`{"ended": bool}`, …);
//! - [`openapi`]: `GET /openapi.json`, the OpenAPI 3.1 document generated from the handlers'
//!   `#[utoipa::path]` annotations and the wire types' `ToSchema` (the core's `openapi` feature),
//!   plus what the middleware adds to every route (security scopes, 400/401/403/408/413/415/
//!   500/503);
//! - [`metrics`]: `GET /metrics` (Prometheus text format) and the middleware counting requests;
//! - `gate`: the one middleware every request passes (auth, body reading with its size and
//!   time limits, then the write limit); [`request_budget`]: the memory budgets of request
//!   bodies in flight (small bodies by what has arrived); [`response_budget`]: the memory
//!   budget of large answers (both a [`byte_budget`]); `sse`: Server-Sent Event encoding;
//!   `write_stall`: closing connections whose client stopped reading; [`grpc`]: the OTLP/gRPC
//!   listener; `skip_keys`: a batch op read as its endpoint's body with `op` and `spanId`
//!   skipped;
//! - [`maintenance`]: what `flightlog serve` does on a schedule (stale sweep, stuck-run
//!   watchdog, retention of span detail and idle engagements);
//! - `routes`: one module per area (activity, runs, batch, maintenance, journal, streams, OTLP,
//!   testing, health); each route is registered from its `#[utoipa::path]` annotation, so every
//!   served route is in the OpenAPI document.
//!
//! This is the only crate with wire types; the stores know nothing about HTTP.

pub mod auth;
mod browser_guard;
pub mod byte_budget;
mod change_tail;
pub mod connection_limit;
pub mod error;
pub mod extract;
mod finish_on_drop;
mod followed;
mod gate;
pub mod grpc;
mod half_close;
mod journal_hub;
pub mod maintenance;
pub mod metrics;
pub mod openapi;
pub mod overload;
mod parse_error_body;
pub mod request_budget;
pub mod response_budget;
mod routes;
mod run_hub;
pub mod settings;
mod skip_keys;
mod sse;
pub mod state;
pub mod validate;
pub mod wire;
mod write_stall;
mod wrong_port;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::Request;
use axum::middleware::from_fn_with_state;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulConnection;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_http::limit::RequestBodyLimitLayer;

use crate::connection_limit::{
    ConnectionActivity, ConnectionOfRequest, CountedService, EVICTION_GRACE,
};

pub use auth::{AuthConfig, Scope, Scopes};
pub use error::ApiError;
pub use state::{AppState, ServerConfig};

/// Why [`serve`] stopped other than by its shutdown signal.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener or a connection failed at the socket level.
    #[error("the HTTP server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The whole HTTP API over `state`.
pub fn app(state: AppState) -> Router {
    let limit = state.config().body_limit;
    let (routes, document) = routes::router(&state);
    state.set_openapi_document(document);
    // One `Router::layer` call with the layers composed inside it: each call wraps every route
    // in one more boxed service, cloned and its future boxed for every request (three calls
    // cost ~2,150 instructions a single-op write more than one: callgrind, BENCHMARKS.md stop 39).
    let layers = tower::ServiceBuilder::new()
        // Outermost: counting, auth and the write limit, in one layer (see `gate`).
        // `Router::layer` wraps every route (and the fallbacks), after routing, so the gate sees
        // the matched route template.
        .layer(from_fn_with_state(state.clone(), gate::gate))
        // tower-http enforces the limit (refusing a declared Content-Length up front, cutting a
        // chunked body off at the limit); axum's own 2 MB default would otherwise apply first.
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(DefaultBodyLimit::disable());
    routes.layer(layers).with_state(state)
}

/// Serve [`app`]`(state)` on `listener` until `shutdown` completes, then stop accepting
/// connections and return once the requests in flight have been answered (at most
/// [`SHUTDOWN_GRACE`] later).
pub async fn serve<F>(listener: TcpListener, state: AppState, shutdown: F) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    // Live streams never end on their own; they end when the server starts shutting down, so
    // the graceful shutdown (which waits for open connections) can complete.
    let closing = state.closing_signal();
    let shutdown = async move {
        shutdown.await;
        closing.send_replace(true);
    };
    let write_stall_limit = state.config().write_stall_limit;
    let slots = state.connection_slots().clone();
    let answers = ListenerAnswers {
        wrong_port: wrong_port::refusal_of_http2(state.config().grpc_listening_on),
        unparsed: Some(state.metrics().unparsed_requests()),
    };
    serve_router(
        listener,
        app(state),
        shutdown,
        Protocol::Http1,
        write_stall_limit,
        slots,
        answers,
    )
    .await
}

/// What a listener answers besides its routes.
pub(crate) struct ListenerAnswers {
    /// What a client of the other listener's protocol hears (see [`wrong_port`]).
    pub(crate) wrong_port: Arc<[u8]>,
    /// Where hyper's own answers to requests it cannot parse are counted (HTTP/1 only, see
    /// [`parse_error_body`]).
    pub(crate) unparsed: Option<metrics::UnparsedRequests>,
}

/// What a listener speaks. Each listener speaks one protocol only: telling them apart (as
/// `axum::serve` does) first waits for bytes, with no timeout, so a connection that sent
/// nothing was held forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// The HTTP API: HTTP/1.1 (what the contract and OTLP/HTTP exporters speak).
    Http1,
    /// OTLP/gRPC: HTTP/2 without TLS (h2c).
    Http2,
}

/// How long a client may take to send a request head, counted from when the connection is
/// ready for one (so also how long a keep-alive connection may sit idle): past it the
/// connection is closed. Without it, connections that trickle a head or send nothing held a
/// file descriptor each forever, and enough of them locked every other client out.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a graceful shutdown waits for the connections still open (a request in flight, a
/// stream client whose socket is full and so never sees its stream end) before dropping them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// HTTP/2 keep-alive pings (h2c on the gRPC listener): a peer that does not answer within the
/// interval is dropped.
const HTTP2_KEEP_ALIVE: Duration = Duration::from_secs(20);

/// What an HTTP/2 (gRPC) peer may send of request bodies before the server reads them, per
/// connection and per stream: hyper's default of 1 MiB let 200 connections that each sent that
/// much of an export the budget had no room for hold about 200 MiB the request budget never
/// saw (`bench/h2_hold.py`). 256 KiB is four times grpc-go's initial window, and loopback and
/// LAN exports are not slowed by it (the server reads bodies as they come).
const HTTP2_WINDOW: u32 = 256 * 1024;

/// The most requests (streams) one HTTP/2 connection may have open at once: each holds its
/// headers (up to 16 KiB) while it waits; hyper's default is 200. An OpenTelemetry exporter
/// sends a handful of exports at once (the Collector's default is 10 consumers); more wait on
/// the client for a stream.
const HTTP2_MAX_STREAMS: u32 = 16;

/// The most bytes of headers (gRPC metadata) one HTTP/2 request may have: hyper's default, set
/// explicitly so the streams' bound stays true. An exporter sends a few hundred bytes of them,
/// a token included, but W3C `baggage` may take 8 KiB and `tracestate` more: 8 KiB (grpc-java's
/// default) refused a full `baggage` with an opaque `UNKNOWN: ... status: 431` (an audit's
/// finding).
const HTTP2_MAX_HEADER_LIST: u32 = 16 * 1024;

/// The most bytes a connection's socket holds that TCP has not sent yet (`TCP_NOTSENT_LOWAT`):
/// past it a write waits. Without it the kernel took up to its whole send buffer (autotuned to
/// 4 MiB) and said the socket was writable again only once a third of that had drained, so a
/// client reading a live stream or a large answer steadily but slower than about 45 KB/s went
/// 30 s without a write going through and was cut off as one that reads nothing (an audit's
/// finding). With it, a write goes through each time this client has read about this much, so
/// the stall limit judges whether it reads at all; the bytes that wait stay in the server, under
/// the budget of large answers, and a live stream that falls behind catches up from the
/// database, as it is built to. Loopback and LAN clients drain it in microseconds.
const UNSENT_LOW_WATER: u32 = 128 * 1024;

/// The accept loop of both listeners: what `axum::serve` does, plus a timer for hyper (the
/// header-read timeout and HTTP/2 keep-alive need one, and `axum::serve` sets none),
/// `TCP_NODELAY` and [`UNSENT_LOW_WATER`] on every connection, and a bounded graceful shutdown.
///
/// `TCP_NODELAY`: with Nagle's algorithm on, a small write that follows another small write
/// (each SSE event of a live stream, a response right after its headers) waited for the peer's
/// delayed ACK, up to 40 ms: the stream-latency benchmark's p99 was 24 ms from that alone. A
/// connection whose option cannot be set is served anyway (a latency defect, not a reason to
/// refuse it).
///
/// An HTTP/1 socket is also wrapped in a [`parse_error_body::ParseErrorBody`]: the answers hyper
/// writes by itself to a request it cannot parse (400, 414, 431) get the contract's error body,
/// and both listeners' sockets in a [`wrong_port::WrongPort`]: a client of the other protocol
/// hears where to go (`answers`).
///
/// Each socket is wrapped in a [`write_stall::StallGuard`]: a connection whose client has read
/// nothing for `write_stall_limit` while the server had something to send is closed.
///
/// Each connection holds a slot of `slots` (the connection limit both listeners share, see
/// [`connection_limit`]) from when it is accepted until it ends: with every slot taken, the
/// listener waits for one before it serves the connection it accepted, and accepts no other.
pub(crate) async fn serve_router<F>(
    listener: TcpListener,
    router: Router,
    shutdown: F,
    protocol: Protocol,
    write_stall_limit: Duration,
    slots: connection_limit::ConnectionSlots,
    answers: ListenerAnswers,
) -> Result<(), ServeError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let mut shutdown = std::pin::pin!(shutdown);
    let (closing, closing_seen) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut last_accept_warning: Option<std::time::Instant> = None;
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    // A connection that failed before it was accepted is only that one; anything
                    // else is said (at most every 10 s: the operator must know why) and not spun
                    // on. Out of file descriptors, the connection idle the longest makes room,
                    // as at the connection limit; anything else (or nothing idle) is waited out
                    // for a second, new clients waiting meanwhile.
                    if !is_connection_error(&err) {
                        if last_accept_warning
                            .is_none_or(|last| last.elapsed() >= Duration::from_secs(10))
                        {
                            last_accept_warning = Some(std::time::Instant::now());
                            warn_cannot_accept(&err);
                        }
                        let made_room = is_out_of_descriptors(&err)
                            && slots.make_room_for_a_descriptor().await;
                        if !made_room {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // The slot is taken once a client is here, not before: a listener waiting for its next
        // client with a slot in hand kept it from the other listener (with a limit of 1 the
        // HTTP API answered nothing while the gRPC listener waited; an audit's finding). While
        // every slot is taken, this one accepted socket waits unread (nothing of it buffered)
        // and the rest wait in the kernel's queue.
        let slot = tokio::select! {
            slot = slots.acquire() => match slot {
                Some(slot) => slot,
                None => break,
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // As with `TCP_NODELAY`, a socket whose option cannot be set is served anyway.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let _ = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(UNSENT_LOW_WATER);
        let closing_seen = closing_seen.clone();
        let guarded = write_stall::StallGuard::new(stream, write_stall_limit, slots.stall_count());
        match protocol {
            Protocol::Http1 => {
                let service = tracked_service(&router, slot.activity(), true);
                let io = TokioIo::new(parse_error_body::ParseErrorBody::new(
                    wrong_port::WrongPort::new(
                        half_close::HalfCloseReader::new(guarded, Arc::clone(slot.activity())),
                        wrong_port::Speaks::Http1,
                        Arc::clone(&answers.wrong_port),
                    ),
                    answers.unparsed.clone(),
                ));
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_headers(parse_error_body::MAX_HEADER_FIELDS)
                    .max_buf_size(parse_error_body::MAX_HEAD_BYTES)
                    // The buffer's limit alone let a head that arrived in one burst through at up
                    // to 48 KiB (a read may fill more than it asked for); this checks the head's
                    // own length (an audit's finding).
                    .max_header_size(parse_error_body::MAX_HEAD_BYTES);
                let connection = builder.serve_connection(io, service);
                connections.spawn(async move {
                    drive(connection, closing_seen, slot.activity(), protocol).await;
                    drop(slot);
                });
            }
            Protocol::Http2 => {
                let service = tracked_service(&router, slot.activity(), false);
                let io = TokioIo::new(wrong_port::WrongPort::new(
                    guarded,
                    wrong_port::Speaks::Http2,
                    Arc::clone(&answers.wrong_port),
                ));
                let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                builder
                    .timer(TokioTimer::new())
                    .keep_alive_interval(HTTP2_KEEP_ALIVE)
                    .keep_alive_timeout(HTTP2_KEEP_ALIVE)
                    .initial_connection_window_size(HTTP2_WINDOW)
                    .initial_stream_window_size(HTTP2_WINDOW)
                    .max_concurrent_streams(HTTP2_MAX_STREAMS)
                    .max_header_list_size(HTTP2_MAX_HEADER_LIST);
                let connection = builder.serve_connection(io, service);
                connections.spawn(async move {
                    drive(connection, closing_seen, slot.activity(), protocol).await;
                    drop(slot);
                });
            }
        }
        // Reap the finished connections, so the set holds only live ones.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    closing.send_replace(true);
    let finished = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, finished)
        .await
        .is_err()
    {
        // Said, so an operator can tell a client's cut request from a server fault
        // (`writeln!`: `eprintln!` panics when stderr is gone).
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr().lock(),
            "flightlog: {} connection(s) still open {} s into the shutdown were closed (a \
             request not answered, or a stream client not reading)",
            connections.len(),
            SHUTDOWN_GRACE.as_secs()
        );
        connections.abort_all();
    }
    Ok(())
}

/// The answer of the router to one request.
type RouterAnswer = Result<axum::http::Response<Body>, Infallible>;

/// The router with a connection's own request and answer steps (see [`tracked_service`]).
trait RouterService:
    tower::Service<
        Request<Incoming>,
        Response = axum::http::Response<Body>,
        Error = Infallible,
        Future: Future<Output = RouterAnswer> + Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> RouterService for S where
    S: tower::Service<
            Request<Incoming>,
            Response = axum::http::Response<Body>,
            Error = Infallible,
            Future: Future<Output = RouterAnswer> + Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// The router as one connection's hyper service: each request marks its start on `activity`
/// when hyper calls the service (`CountedService`: before hyper reads on, so a client's EOF
/// read right behind its request finds it in flight) and its end when hyper has taken the
/// answer's body's last piece or dropped it (a live stream is in flight for as long as it
/// runs), so the connection limit can tell an idle connection from a busy one and the HTTP/2
/// idle timeout can see when the last request ended.
fn tracked_service(
    router: &Router,
    activity: &Arc<ConnectionActivity>,
    watch_bodies: bool,
) -> CountedService<TowerToHyperService<impl RouterService>> {
    let of_requests = ConnectionOfRequest::new(Arc::clone(activity));
    let of_bodies = Arc::clone(activity);
    let of_answers = Arc::clone(activity);
    let service = TowerToHyperService::new(
        router
            .clone()
            .map_request(move |request: Request<Incoming>| {
                // Only an HTTP/1 connection's EOF is held back (see `half_close`).
                let mut request = if watch_bodies {
                    let of_body = Arc::clone(&of_bodies);
                    request.map(|body| Body::new(half_close::WatchedBody::new(body, of_body)))
                } else {
                    request.map(Body::new)
                };
                request.extensions_mut().insert(of_requests.clone());
                request
            })
            .map_response(move |response: axum::http::Response<Body>| {
                // A client that closes during a live stream is gone: its EOF passes.
                if crate::sse::is_event_stream(response.headers()) {
                    of_answers.eof().answer_is_stream();
                }
                response
            }),
    );
    CountedService::new(service, Arc::clone(activity))
}

/// How a connection's serving came to an end, short of the connection ending by itself.
enum Ending {
    /// An HTTP/2 connection had no request in flight for [`HEADER_READ_TIMEOUT`].
    Idle,
    /// The connection limit asked it to close to make room for a waiting client.
    MakeRoom,
    /// The server is shutting down.
    Shutdown,
}

/// Serve one connection until it ends, or until the server closes: then let its request in
/// flight finish (the caller bounds how long).
///
/// An HTTP/2 connection with no request in flight for [`HEADER_READ_TIMEOUT`] is closed (hyper
/// has no header-read timeout for HTTP/2): dropped if it never made a request, else shut down
/// gracefully (`GOAWAY`, so a client reconnects for its next export), within
/// [`SHUTDOWN_GRACE`]. Only the first request used to count: a peer that made one (even one
/// refused for a missing token) and then sat answering the keep-alive pings held its connection
/// for good, and a few hundred such peers used up every file descriptor (an audit's finding).
///
/// A connection asked to close to make room (see [`connection_limit`]) is shut down
/// gracefully: hyper closes an HTTP/1 connection at once when it is between requests or has
/// sent nothing, else after the request it is reading; an HTTP/2 one gets a `GOAWAY`. Still
/// open with no request in flight [`EVICTION_GRACE`] after it was accepted (if it never made
/// a request: its first head is still arriving) or after it was asked (an HTTP/2 one that
/// has not closed), it is dropped.
/// An HTTP/1 connection that was served is left to close by itself then: hyper may still be
/// writing its last answer (the write-stall limit bounds how long).
///
/// At a shutdown a connection whose first head is still arriving is dropped the same way,
/// [`EVICTION_GRACE`] after its accept: nothing of it was answered or stored, and hyper's
/// graceful shutdown waits for a head to complete, so clients trickling heads held every stop
/// for the whole [`SHUTDOWN_GRACE`] (5.0 s with 150 of them at a limit of 100; an audit saw
/// 6.35 s). One that was served finishes its requests in flight and its last answer (hyper
/// closes an HTTP/1 one at once between requests; an HTTP/2 one gets a `GOAWAY`).
async fn drive<C: GracefulConnection>(
    connection: C,
    mut closing: tokio::sync::watch::Receiver<bool>,
    activity: &ConnectionActivity,
    protocol: Protocol,
) {
    let mut connection = std::pin::pin!(connection);
    let idle = async {
        if protocol == Protocol::Http1 {
            return std::future::pending::<()>().await;
        }
        loop {
            let wait = match activity.idle_for() {
                Some(idle) if idle >= HEADER_READ_TIMEOUT => return,
                Some(idle) => HEADER_READ_TIMEOUT - idle,
                None => HEADER_READ_TIMEOUT,
            };
            tokio::time::sleep(wait).await;
        }
    };
    let ending = tokio::select! {
        _ = connection.as_mut() => return,
        () = idle => Ending::Idle,
        () = activity.close_asked() => Ending::MakeRoom,
        _ = closing.wait_for(|closing| *closing) => Ending::Shutdown,
    };
    match ending {
        Ending::Idle => {
            if !activity.served() {
                return;
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, connection).await;
        }
        Ending::MakeRoom | Ending::Shutdown => {
            connection.as_mut().graceful_shutdown();
            let grace_ends = match (ending, activity.served()) {
                (_, false) => activity.accepted() + EVICTION_GRACE,
                (Ending::MakeRoom, true) => std::time::Instant::now() + EVICTION_GRACE,
                // Served and shutting down: its request in flight or its last answer finishes,
                // within the caller's bound.
                (_, true) => {
                    let _ = connection.await;
                    return;
                }
            };
            if tokio::time::timeout_at(grace_ends.into(), connection.as_mut())
                .await
                .is_ok()
            {
                return;
            }
            let may_be_writing = protocol == Protocol::Http1 && activity.served();
            if !activity.is_busy() && !may_be_writing {
                return;
            }
            let _ = connection.await;
        }
    }
}

/// Say why the listener cannot take new connections (written, not `eprintln!`: a closed stderr
/// must not panic the server).
fn warn_cannot_accept(err: &std::io::Error) {
    use std::io::Write;
    let fix = if is_out_of_descriptors(err) {
        ": every file descriptor this process may open is in use (connections, streams; idle \
         connections are closed to make room); raise the limit (`ulimit -n`, systemd's \
         LimitNOFILE=) or lower --max-connections below it"
    } else {
        ""
    };
    let _ = writeln!(
        std::io::stderr().lock(),
        "flightlog: warning: cannot accept new connections ({err}){fix}; retrying every second"
    );
}

/// `EMFILE` or `ENFILE`: the process or the system has no file descriptor left.
fn is_out_of_descriptors(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(24 | 23))
}

/// An accept error that concerns only the connection being accepted: the next accept is tried at
/// once. Linux's accept(2) also passes a pending network error of the new connection up as its
/// own (ENETDOWN, EPROTO, ENOPROTOOPT, EHOSTDOWN, ENONET, EHOSTUNREACH, EOPNOTSUPP, ENETUNREACH,
/// and EPERM from a firewall rule), to be retried like EAGAIN; each of those used to stop every
/// accept for a second.
fn is_connection_error(err: &std::io::Error) -> bool {
    /// Linux's numbers of the errors listed above.
    const PER_CONNECTION: [i32; 9] = [100, 71, 92, 112, 64, 113, 95, 101, 1];
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    ) || (cfg!(target_os = "linux")
        && err
            .raw_os_error()
            .is_some_and(|code| PER_CONNECTION.contains(&code)))
}

#[cfg(test)]
mod tests {
    use super::is_connection_error;

    /// A connection's own failure is retried at once; running out of descriptors is waited out.
    #[test]
    fn per_connection_accept_errors_are_told_from_resource_exhaustion() {
        let error = std::io::Error::from_raw_os_error;
        assert!(is_connection_error(&std::io::Error::from(
            std::io::ErrorKind::ConnectionAborted
        )));
        #[cfg(target_os = "linux")]
        {
            assert!(is_connection_error(&error(71)), "EPROTO");
            assert!(is_connection_error(&error(113)), "EHOSTUNREACH");
        }
        assert!(!is_connection_error(&error(24)), "EMFILE");
        assert!(!is_connection_error(&error(23)), "ENFILE");
    }
}
