//! The one middleware every request passes through: it counts the request for `/metrics`,
//! checks its token, refuses a request that names its body's type twice and a body declared
//! larger than the limit, reads the body (a write's whole, under the budgets of bodies in
//! flight, refusing one of no declared length past the limit; any other is read and dropped),
//! takes a write slot for a write, runs the route, and gives a body-limit refusal the
//! contract's error body (the OTLP one on the protobuf trace route) — in that order, so every
//! answer (the gate's own refusals included) is counted, a request is authenticated before it
//! holds anything, and a write takes its slot only once its body is here (a slow body holds
//! no slot; see `overload`). No answer leaves a body unread: the gate's refusals drain it (a
//! bounded part of it) first, so the client reads the answer rather than a reset connection,
//! and a route gets the body already read, so its early answers (404, 405, 415) leave the
//! connection usable for the client's next request.
//!
//! Why one middleware and not one layer per concern: `Router::layer` wraps every route in each
//! layer, so each layer is a boxed service cloned and polled for every request. With four layers
//! (metrics, auth, write limit, body-limit answer) plus an extension layer, that stack was about
//! a tenth of the server's CPU on single-operation writes (perf on the `http` load generator).
//! The checks themselves live with their subjects ([`crate::auth`], [`crate::overload`],
//! [`crate::metrics`]); this module is only their order.

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{
    CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, EXPECT, HOST, TRANSFER_ENCODING,
};
use axum::http::{HeaderValue, StatusCode, Version};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::connection_limit::ConnectionOfRequest;
use crate::error::{ApiError, ErrorCode};
use crate::finish_on_drop::FinishOnDrop;
use crate::metrics::{method_label, UNMATCHED_ROUTE};
use crate::request_budget::{BodyHold, SMALL_BODY_BYTES};
use crate::routes::otlp::{is_otlp_path, is_protobuf, refusal_answer, too_large_answer};
use crate::state::AppState;
use crate::{auth, extract, overload};

/// At most this many times the body limit is read and discarded from a body declared too large
/// before it is refused (see [`refuse_declared_too_large`]).
const DRAIN_LIMITS: u64 = 4;
/// The longest a too-large body is drained before it is refused anyway.
const DRAIN_TIME: Duration = Duration::from_secs(10);
/// The longest a drain waits for the next piece of a body: a client that is sending its body
/// delivers some of it far more often, and one that declared a body and sent none of it (or
/// stalled) got its refusal only after the whole [`DRAIN_TIME`] (a `413` for a declared 9 MiB
/// came 10 s late; an audit), its connection held meanwhile.
const DRAIN_IDLE_TIME: Duration = Duration::from_secs(2);
/// The longest the body of a request without a valid token is drained before its `401`: a
/// second carries a refused body of the usual sizes on any working link. With [`DRAIN_TIME`],
/// clients without a token that each sent a head declaring a body and one byte of it kept their
/// connections in use for 10 s a request, so none was ever idle to make room at the connection
/// limit, and an authorized client waited 8 – 9 s (an audit's finding).
const UNAUTHENTICATED_DRAIN_TIME: Duration = Duration::from_secs(1);
/// The longest a write's body may go without a byte arriving while the gate reads it.
pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a write's body may take in all. Without these two a client that sent a write's
/// head and then stalled, or trickled its body, kept its connection, and what arrived of its
/// body held in the budgets of bodies in flight (see `request_budget`; past its first 64 KiB
/// a large body holds its declared length), for as long as it liked. At the default 8 MiB
/// limit this still allows 140 KiB/s.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest the first [`SMALL_BODY_BYTES`] of a body may take (6.4 KiB/s): all of a small
/// body. Small bodies hold what has arrived of them of their own budget (see `request_budget`),
/// 64 KiB a write slot; given the whole minute, as many connections as write slots that sent
/// all but the last bytes of a 64 KiB body and then one byte every few seconds held all of it
/// for that minute, and every other write got 503 (an audit's finding, with 4 slots). With
/// this, holding it took sending the whole budget anew every 10 s, which as many connections
/// as write slots still did (a third audit's finding): while another body waits for that
/// budget, a small body holding some of it must arrive at [`MIN_BODY_RATE_WHILE_AWAITED`] too.
pub const SMALL_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// While another request waits for a budget of bodies (see `request_budget`), a body holding
/// some of it must have arrived at this many bytes a second on average since it took its share
/// (of the large budget its bytes past the first 64 KiB, of the small one all of them, over the
/// time since the share less the first [`SLOW_BODY_GRACE`]), or it gives its share to the one
/// waiting and is refused as a body that does not fit is: `503` with `Retry-After` after the
/// rest of it is drained, over gRPC
/// `UNAVAILABLE`, both of which OTLP exporters retry (a `408` was the first answer; the OTLP
/// spec has exporters drop a batch on any 4xx but 429). About what an 8 MiB body needs to
/// arrive within [`BODY_READ_TIMEOUT`]. Without it, a client that sent 64 KiB of a body
/// declared 8 MB and then a byte every few seconds held 8 MB of the budget for that minute, and
/// eight such kept every other body over 64 KiB (OTLP exports, large batches) out; and as many
/// as write slots that sent 65,500 bytes of a 64 KiB body and trickled the rest kept every
/// write out for the 10 s a small body may take, and again after reconnecting. A slow
/// upload is left alone while nobody waits. The average is taken from the share, not from the
/// head: a body's first 64 KiB, sent at once, buy it no time, and the time it waited for the
/// share is not held against it.
pub const MIN_BODY_RATE_WHILE_AWAITED: f64 = 128.0 * 1024.0;
/// How long a body holding some of a budget of bodies may take before
/// [`MIN_BODY_RATE_WHILE_AWAITED`] asks anything of it: half of what a request waits for the
/// budget (`BUDGET_WAIT`), so that a body that went slow just after it took its share gives
/// it up while the request waiting still waits. (With 1 s from the head, eight clients that
/// each sent 64 KiB and then a byte every 3 s, reconnecting when answered, still held the
/// whole budget now and then: 4 of 107 batches of 200 KB got 503.)
pub const SLOW_BODY_GRACE: Duration = Duration::from_millis(250);
/// How often a body holding some of a budget of bodies looks for a request waiting for it
/// while its next bytes are awaited.
const SLOW_BODY_CHECK: Duration = Duration::from_millis(100);

/// The middleware (installed by [`crate::app`] with `from_fn_with_state`).
pub(crate) async fn gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    // A cheap clone (the template is shared); routing already happened, so it is present for
    // every routed request.
    let route = request.extensions().get::<MatchedPath>().cloned();
    // A body-limit refusal answers in the OTLP error encoding on the protobuf OTLP routes.
    let otlp_protobuf = route
        .as_ref()
        .is_some_and(|route| is_otlp_path(route.as_str()))
        && is_protobuf(request.headers());
    let response = admit_and_run(
        &state,
        route.as_ref(),
        otlp_protobuf,
        request,
        next,
        (started, method),
    )
    .await;
    let response =
        with_contract_body_limit_answer(response, state.config().body_limit, otlp_protobuf);
    count_answer(&state, route.as_ref(), method, &response, started);
    response
}

/// Count a request's answer in `/metrics`: by route, method and status, its duration since
/// `started`, and an error answer by the contract's code.
fn count_answer(
    state: &AppState,
    route: Option<&MatchedPath>,
    method: &'static str,
    response: &Response,
    started: Instant,
) {
    let metrics = state.metrics();
    if let Some(ErrorCode(code)) = response.extensions().get::<ErrorCode>() {
        metrics.observe_error(code);
    }
    metrics.observe_request(
        route.map_or(UNMATCHED_ROUTE, MatchedPath::as_str),
        method,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
}

async fn admit_and_run(
    state: &AppState,
    route: Option<&MatchedPath>,
    otlp_protobuf: bool,
    request: Request,
    next: Next,
    (started, method_name): (Instant, &'static str),
) -> Response {
    let limit = state.config().body_limit;
    // Nothing is sent yet by a client waiting for `100 Continue` (hyper sends it when the body
    // is first read): a refusal answers it at once, and the client never sends the body.
    let waits_to_send = request
        .headers()
        .get(EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    // An OTLP exporter sending protobuf reads a protobuf `Status` in every error answer.
    let refuse = |refusal: ApiError| {
        if otlp_protobuf {
            refusal_answer(&refusal)
        } else {
            refusal.into_response()
        }
    };
    if let Some(refusal) = misframed(&request) {
        let mut answer = refuse(refusal);
        answer
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return answer_after_draining(
            request,
            waits_to_send,
            limit,
            answer,
            UNAUTHENTICATED_DRAIN_TIME,
        )
        .await;
    }
    match auth::check_token(state, &request, route.map(MatchedPath::as_str)) {
        Ok(true) => ConnectionOfRequest::vouch_for(request.extensions()),
        Ok(false) => {}
        Err(refusal) => {
            let drain_time = match refusal {
                ApiError::Unauthorized(_) => UNAUTHENTICATED_DRAIN_TIME,
                _ => DRAIN_TIME,
            };
            let answer = refuse(refusal);
            return answer_after_draining(request, waits_to_send, limit, answer, drain_time).await;
        }
    }
    if let Err(refusal) = single_content_type(&request) {
        let answer = refuse(refusal);
        return answer_after_draining(request, waits_to_send, limit, answer, DRAIN_TIME).await;
    }
    let declared = declared_length(&request);
    if declared.is_some_and(|length| length > limit as u64) {
        return answer_after_draining(
            request,
            waits_to_send,
            limit,
            too_large(limit, otlp_protobuf),
            DRAIN_TIME,
        )
        .await;
    }
    let method = request.method().clone();
    // Every body is read here, before the route runs. A route may answer without reading the
    // body (a 404, 405 or 415, a bad id in the path); hyper then reads on only what has already
    // arrived and closes the connection after the answer, which says nothing of it: a
    // keep-alive client sent its next request on that connection and got no answer at all
    // (found by the fuzz test, one request in a few thousand, when a body arrived a moment
    // after its head). A write's body is kept for the route, read under the budgets of bodies
    // in flight (see `request_budget`) and before the write takes its slot (see `overload`: a
    // slow body must not hold a slot); any other body (a read's, or one sent where no route
    // is) is read and dropped, never held.
    let has_body = declared.is_some_and(|length| length > 0) || streams_its_body(&request);
    // What the body holds of the budgets of bodies in flight, until the answer: what has
    // arrived, and past its first 64 KiB all of a declared length.
    let mut hold = state.request_budget().hold();
    // A dropped body (a read's, or one sent where no route is) cut short closes the connection.
    let mut drained = Drained::ToItsEnd;
    let request = match (has_body, overload::is_write(&method, route.is_some())) {
        (false, _) => request,
        (true, true) => {
            let declared = declared.map_or(0, |length| usize::try_from(length).unwrap_or(limit));
            if let Err(refusal) = hold.cover_declared(declared, waits_to_send).await {
                let answer = refuse(refusal);
                return answer_after_draining(request, waits_to_send, limit, answer, DRAIN_TIME)
                    .await;
            }
            match read_whole(request, limit, &mut hold).await {
                Ok(request) if route.is_some_and(|route| is_otlp_path(route.as_str())) => {
                    match hold_inflated(request, &mut hold, state.config().otlp_max_decompressed)
                        .await
                    {
                        Ok(request) => request,
                        Err(refusal) => return refuse(refusal),
                    }
                }
                Ok(request) => request,
                Err(BodyRead::TooLarge(rest)) => {
                    let drained = drain(rest, limit, DRAIN_TIME).await;
                    return closing(too_large(limit, otlp_protobuf), drained);
                }
                Err(BodyRead::OverBudget(refusal, rest)) => {
                    let drained = drain(rest, limit, DRAIN_TIME).await;
                    return closing(refuse(refusal), drained);
                }
                // The body's framing broke (a bad chunk size, a cut connection): nothing more of
                // the connection can be read, and the answer says so.
                Err(BodyRead::Failed(error)) => {
                    let mut response = refuse(error);
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                    return response;
                }
                Err(BodyRead::Stalled(error)) => {
                    let mut response = refuse(error);
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                    return response;
                }
            }
        }
        (true, false) => {
            let (parts, body) = request.into_parts();
            drained = drain(body, limit, DRAIN_TIME).await;
            Request::from_parts(parts, Body::empty())
        }
    };
    // The body is all here (or there is none): nothing is left to drain after a refusal.
    let slot = match overload::take_write_slot(state, &method, route.is_some()).await {
        Ok(slot) => slot,
        Err(refusal) => return refuse(refusal),
    };
    let response = match slot {
        // A write runs to its answer holding its slot and budget, its client there or not.
        Some(slot) => {
            let connection = request.extensions().get::<ConnectionOfRequest>().cloned();
            let abandoned = {
                let state = state.clone();
                let route = route.cloned();
                move |response: Response| {
                    state.metrics().write_abandoned();
                    count_answer(&state, route.as_ref(), method_name, &response, started);
                }
            };
            let response = FinishOnDrop::new(next.run(request), (hold, slot), abandoned).await;
            // Answered, to a client that closed its sending side meanwhile: gone (its answer is
            // written and lost) or half-closed, waiting for it; the two cannot be told apart.
            if connection.is_some_and(|connection| connection.client_closed()) {
                state.metrics().write_abandoned();
            }
            response
        }
        None => {
            let response = next.run(request).await;
            drop(hold);
            response
        }
    };
    closing(response, drained)
}

/// An OTLP body's inflated size, held beside its wire size when it is compressed: eight 7.6 MB
/// gzipped OTLP/JSON bodies that inflate to 50 MB each took the server to 899 MiB while the
/// budget held only their 61 MB on the wire. Counted by inflating the body into nothing
/// ([`flightlog_otlp::inflated_len`]; the route inflates it again to decode it, after the
/// budget is held): a gzip trailer's stated size let a body ending in an empty member in on
/// its wire size, and deflate states none. The body is read whole already: taking it out and
/// putting it back copies nothing.
async fn hold_inflated(
    request: Request,
    hold: &mut BodyHold,
    max_decompressed: usize,
) -> Result<Request, ApiError> {
    let Some(encoding) = request.headers().get(CONTENT_ENCODING) else {
        return Ok(request);
    };
    let encoding = encoding.to_str().unwrap_or_default().to_owned();
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|error| ApiError::invalid(format!("cannot read the request body: {error}")))?;
    if let Some(inflated) = flightlog_otlp::inflated_len(Some(&encoding), &bytes, max_decompressed)
    {
        hold.cover(bytes.len().saturating_add(inflated)).await?;
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// A request may name its body's type once: with two `Content-Type` headers the first one
/// won, so `application/json` then `text/plain` was taken as JSON and the reverse refused, and
/// an OTLP body was decoded as whichever came first (an audit's finding); a proxy may read or
/// reorder them the other way. Refused whole, as ambiguous.
fn single_content_type(request: &Request) -> Result<(), ApiError> {
    let declared = request.headers().get_all(CONTENT_TYPE).iter().count();
    if declared > 1 {
        return Err(ApiError::invalid(format!(
            "the request has {declared} Content-Type headers; send one that names the body's \
             type"
        )));
    }
    Ok(())
}

/// An error and its causes, `: `-joined: hyper's body error says only "error reading a body
/// from connection", its cause what was wrong ("invalid chunk size line", …).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

/// A request whose framing or addressing HTTP/1.1 does not allow, refused before anything
/// else (RFC 9112): an HTTP/1.1 request without exactly one `Host` (a second `Host` was read as
/// the first one, so the browser guard judged whichever came first, an audit's finding); a
/// `Transfer-Encoding`
/// other than `chunked` once (hyper read `gzip, chunked` as plain chunked and dropped the gzip,
/// and `chunked, chunked` as chunked once, which a proxy in front may read otherwise).
fn misframed(request: &Request) -> Option<ApiError> {
    let headers = request.headers();
    if request.version() == Version::HTTP_11 {
        let mut hosts = headers.get_all(HOST).iter();
        let host = hosts.next();
        let problem = match (host, hosts.next()) {
            (None, _) => Some("has no Host header"),
            (Some(_), Some(_)) => Some("has more than one Host header"),
            // An absolute-form target's authority stands in for `Host`, which the server
            // then ignores (RFC 9112, section 3.2.2); the browser guard reads `Host`, which a
            // browser sends with an origin-form target only.
            (Some(_), None) => None,
        };
        if let Some(problem) = problem {
            return Some(ApiError::invalid(format!(
                "the request {problem}: an HTTP/1.1 request has exactly one Host header, the \
                 server's address as the client reached it (RFC 9112, section 3.2)"
            )));
        }
    }
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter().peekable();
    codings.peek()?;
    let mut listed = Vec::new();
    for value in codings {
        let Ok(value) = value.to_str() else {
            listed.push("(not ASCII)".to_owned());
            continue;
        };
        listed.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|coding| !coding.is_empty())
                .map(str::to_ascii_lowercase),
        );
    }
    if listed.len() == 1 && listed[0] == "chunked" {
        return None;
    }
    Some(ApiError::invalid(format!(
        "the request's Transfer-Encoding is {:?}: only `chunked`, once, is taken; send a \
         compressed body with Content-Encoding (gzip or deflate on the OTLP routes)",
        listed.join(", ")
    )))
}

/// Answer `response` to a request refused before its body was read: after draining the body
/// (see [`drain`]), so the client reads the answer and may keep using the connection (the
/// answer says `Connection: close` when the body was cut short). A client waiting for `100
/// Continue` has sent no body and is answered at once, with `Connection: close`: hyper closes
/// such a connection after the answer (the body may still come), and RFC 9110 (10.1.1) asks a
/// server answering before the content to say whether it will close.
async fn answer_after_draining(
    request: Request,
    waits_to_send: bool,
    limit: usize,
    mut response: Response,
    drain_time: Duration,
) -> Response {
    if waits_to_send {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        response
    } else {
        let drained = drain(request.into_body(), limit, drain_time).await;
        closing(response, drained)
    }
}

fn declared_length(request: &Request) -> Option<u64> {
    request
        .headers()
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// A body of no declared length: HTTP/1.1 chunked, or any HTTP/2 body without
/// `content-length` (an empty one ends at once). Any `Transfer-Encoding` counts: hyper takes a
/// request's body as chunked when the last of its codings is `chunked`, in any case and on any
/// of several header lines, and refuses the request otherwise; reading only the first line,
/// case-sensitively, let `Chunked` (or `gzip` then `chunked` on two lines) skip the gate: such
/// a body took its write slot before it arrived and was read by its route with no timeout and
/// outside the budgets of bodies (a review's finding).
fn streams_its_body(request: &Request) -> bool {
    request.version() >= Version::HTTP_2 || request.headers().contains_key(TRANSFER_ENCODING)
}

/// Why a chunked body could not be read whole.
pub(crate) enum BodyRead {
    /// It went past the limit: the rest of it, still unread.
    TooLarge(Body),
    /// The connection failed while it was read.
    Failed(ApiError),
    /// It stopped arriving ([`BODY_IDLE_TIMEOUT`]) or took too long ([`BODY_READ_TIMEOUT`],
    /// [`SMALL_BODY_READ_TIMEOUT`]); it holds nothing any more.
    Stalled(ApiError),
    /// The budget of bodies in flight had no room for what arrived (see `request_budget`), or
    /// the body was too slow while another request waited for the budget it held
    /// ([`MIN_BODY_RATE_WHILE_AWAITED`]): the refusal, and the rest of the body, still unread.
    OverBudget(ApiError, Body),
}

/// A body read whole in the gate, within the limit (one of no declared length may go past
/// it: it is then refused like a declared one, after draining, rather than cut off inside a
/// route with its rest unread). The routes read whole bodies anyway; they get it as one buffer,
/// the very one hyper read when the body came in one piece (the common case: no copy). A body
/// in several pieces is copied into one buffer as they come, never kept as the pieces: each of
/// hyper's pieces is a handle on the read buffer it came in, and a body sent as 1-byte chunks
/// kept a handle (and often a buffer) a byte, about 40 times what the budgets counted (8
/// clients of 8 MB bodies in 1-byte chunks took the server to 1.8 GB while the budget held
/// 44 MB; an audit's finding). `hold` is made to cover what has arrived, chunk by chunk.
pub(crate) async fn read_whole(
    request: Request,
    limit: usize,
    hold: &mut BodyHold,
) -> Result<Request, BodyRead> {
    let (parts, body) = request.into_parts();
    let mut stream = body.into_data_stream();
    let mut whole = WholeBody::default();
    let mut length = 0usize;
    let started = tokio::time::Instant::now();
    let deadline = started + BODY_READ_TIMEOUT;
    let small_deadline = started + SMALL_BODY_READ_TIMEOUT;
    // When the body took the share it holds now: of the budget of small bodies with its first
    // bytes (noted when the body is first waited for), of the large one once it holds any.
    let mut share_since: Option<tokio::time::Instant> = None;
    let mut share_is_large = false;
    loop {
        // Most bodies have arrived with their head: take what is there without arming a timer
        // (one per chunk would be a timer-wheel entry per write request).
        let ready = futures_util::FutureExt::now_or_never(stream.next());
        let next = match ready {
            Some(next) => next,
            None => {
                let whole_by = if length < SMALL_BODY_BYTES {
                    small_deadline
                } else {
                    deadline
                };
                let now = tokio::time::Instant::now();
                // A small body's share was taken with its first bytes, just handled: timed from
                // here, so a body that arrives whole reads no clock for it.
                if share_since.is_none() && length > 0 {
                    share_since = Some(now);
                }
                let idle_deadline = (now + BODY_IDLE_TIMEOUT).min(whole_by);
                match next_chunk(&mut stream, idle_deadline, hold, length, share_since).await {
                    Ok(next) => next,
                    Err(CutOff::Stalled(refusal)) => {
                        hold.release();
                        return Err(BodyRead::Stalled(refusal));
                    }
                    Err(CutOff::TooSlow(refusal)) => {
                        hold.refuse_as_slow();
                        return Err(BodyRead::OverBudget(refusal, Body::from_stream(stream)));
                    }
                }
            }
        };
        let Some(chunk) = next else {
            break;
        };
        let chunk = chunk.map_err(|err| {
            BodyRead::Failed(ApiError::invalid(format!(
                "cannot read the request body: {}",
                error_chain(&err)
            )))
        })?;
        length += chunk.len();
        if length > limit {
            return Err(BodyRead::TooLarge(Body::from_stream(stream)));
        }
        if let Err(refusal) = hold.cover(length).await {
            return Err(BodyRead::OverBudget(refusal, Body::from_stream(stream)));
        }
        if !share_is_large && hold.holds_large() {
            share_is_large = true;
            share_since = Some(tokio::time::Instant::now());
        }
        whole.push(chunk);
    }
    Ok(Request::from_parts(parts, whole.into_body()))
}

/// The pieces of a body read so far: the first as hyper gave it, and once a second came, all
/// of them copied into one buffer (see [`read_whole`]).
#[derive(Default)]
enum WholeBody {
    #[default]
    Empty,
    One(Bytes),
    Joined(Vec<u8>),
}

impl WholeBody {
    fn push(&mut self, chunk: Bytes) {
        *self = match std::mem::take(self) {
            WholeBody::Empty => WholeBody::One(chunk),
            WholeBody::One(first) => {
                let mut joined = Vec::with_capacity((first.len() + chunk.len()) * 2);
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&chunk);
                WholeBody::Joined(joined)
            }
            WholeBody::Joined(mut joined) => {
                joined.extend_from_slice(&chunk);
                WholeBody::Joined(joined)
            }
        };
    }

    fn into_body(self) -> Body {
        match self {
            WholeBody::Empty => Body::empty(),
            WholeBody::One(only) => Body::from(only),
            WholeBody::Joined(joined) => Body::from(joined),
        }
    }
}

/// The next chunk of a body of which `length` bytes arrived, awaited until `idle_deadline`.
/// While the body holds some of a budget (its share taken at `share_since`), it is cut off if
/// it is slower than [`MIN_BODY_RATE_WHILE_AWAITED`] while a request waits for that budget:
/// looked at before each chunk is awaited (a body sending a byte every 80 ms was never
/// looked at when only a wait of [`SLOW_BODY_CHECK`] with nothing arriving did; an audit's
/// finding) and every [`SLOW_BODY_CHECK`] while none arrives.
async fn next_chunk(
    stream: &mut axum::body::BodyDataStream,
    idle_deadline: tokio::time::Instant,
    hold: &BodyHold,
    length: usize,
    share_since: Option<tokio::time::Instant>,
) -> Result<Option<Result<Bytes, axum::Error>>, CutOff> {
    loop {
        let now = tokio::time::Instant::now();
        let wake = match share_since {
            Some(since) => {
                if let Some(refusal) = too_slow(hold, length, since, now) {
                    return Err(CutOff::TooSlow(refusal));
                }
                idle_deadline.min(now + SLOW_BODY_CHECK)
            }
            None => idle_deadline,
        };
        if let Ok(next) = tokio::time::timeout_at(wake, stream.next()).await {
            return Ok(next);
        }
        if tokio::time::Instant::now() >= idle_deadline {
            return Err(CutOff::Stalled(ApiError::RequestTimeout(format!(
                "the request body did not arrive in time ({length} bytes came): a body must \
                 keep arriving (nothing for {} s), its first {SMALL_BODY_BYTES} bytes within {} \
                 s, and all of it within {} s",
                BODY_IDLE_TIMEOUT.as_secs(),
                SMALL_BODY_READ_TIMEOUT.as_secs(),
                BODY_READ_TIMEOUT.as_secs()
            ))));
        }
    }
}

/// Why [`next_chunk`] gave up on a body: its refusal.
enum CutOff {
    /// It stopped arriving, or took too long (`408`).
    Stalled(ApiError),
    /// It was too slow while a request waited for its share of the budget (`503`).
    TooSlow(ApiError),
}

/// The refusal (`503`) of a body of which `length` bytes arrived, holding a share of a budget
/// since `since`, when it is behind [`MIN_BODY_RATE_WHILE_AWAITED`] and a request waits for that
/// budget. What counts as arrived since the share was taken is, for a share of the budget of
/// large bodies, everything past the first [`SMALL_BODY_BYTES`], so a body's burst that took the
/// share counts (a body sent in bursts of 100 KB every 0.4 s, 244 KiB/s, was cut off 0.3 s after
/// its first burst when the burst did not count; an audit's finding); for a share of the budget
/// of small bodies, all of it (that share is taken with the first bytes).
fn too_slow(
    hold: &BodyHold,
    length: usize,
    since: tokio::time::Instant,
    now: tokio::time::Instant,
) -> Option<ApiError> {
    let elapsed = now.saturating_duration_since(since);
    let large = hold.holds_large();
    let arrived = if large {
        length.saturating_sub(SMALL_BODY_BYTES)
    } else {
        length
    };
    let expected =
        MIN_BODY_RATE_WHILE_AWAITED * elapsed.saturating_sub(SLOW_BODY_GRACE).as_secs_f64();
    if (arrived as f64) >= expected || !hold.share_is_awaited() {
        return None;
    }
    let (counted, budget) = if large {
        (
            format!("{arrived} bytes past its first {SMALL_BODY_BYTES}"),
            "the budget of bodies in flight (--request-budget)",
        )
    } else {
        (
            format!("{arrived} bytes"),
            "the budget of the first 64 KiB of bodies in flight (64 KiB a slot of \
             --max-inflight-writes)",
        )
    };
    Some(ApiError::Unavailable(format!(
        "the request body came in too slowly: {counted} in the {:.1} s since it took its share \
         of {budget}, under {} KiB/s, while other requests waited for that share (a slow \
         upload, or this server too busy to read it); retry, or send it faster",
        elapsed.as_secs_f64(),
        MIN_BODY_RATE_WHILE_AWAITED / 1024.0
    )))
}

/// Read and discard up to [`DRAIN_LIMITS`] times the limit of a body that will not be used,
/// for at most `time` ([`DRAIN_TIME`]; [`UNAUTHENTICATED_DRAIN_TIME`] without a valid token)
/// and while a piece of it comes at least every [`DRAIN_IDLE_TIME`], before it is refused. A
/// server that answers without reading closes the connection with unread bytes in its receive
/// buffer, and the kernel then resets it: a client still sending its body sees the reset instead of the answer (an OTLP exporter
/// then retries the same batch as if the network had failed). A body drained to its end also
/// leaves the connection usable for the client's next request.
async fn drain(body: Body, limit: usize, time: Duration) -> Drained {
    let most = DRAIN_LIMITS.saturating_mul(limit as u64);
    let deadline = tokio::time::Instant::now() + time;
    let mut body = body.into_data_stream();
    let mut drained = 0u64;
    while drained <= most {
        let next_piece_due = deadline.min(tokio::time::Instant::now() + DRAIN_IDLE_TIME);
        match tokio::time::timeout_at(next_piece_due, body.next()).await {
            Ok(Some(Ok(chunk))) => drained += chunk.len() as u64,
            Ok(None) => return Drained::ToItsEnd,
            Ok(Some(Err(_))) | Err(_) => break,
        }
    }
    Drained::CutShort
}

/// Whether [`drain`] read a body to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// The connection can take the client's next request.
    ToItsEnd,
    /// It stopped coming, went on past what is drained, or the connection failed: hyper closes
    /// the connection after the answer, which must say so (see [`closing`]).
    CutShort,
}

/// `response` for a request whose body was drained: with `Connection: close` when the body was
/// cut short. hyper closes such a connection after the answer anyway, and a keep-alive client
/// told nothing sent its next request on a connection about to close (an audit's finding: a
/// 401, 404 or 413 after a stalled body came without it); RFC 9112 (9.6) asks a server that
/// will close to say so.
fn closing(mut response: Response, drained: Drained) -> Response {
    if drained == Drained::CutShort {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The body-limit refusal: the OTLP `Status` on the protobuf trace route, the contract's
/// error body everywhere else.
fn too_large(limit: usize, otlp_protobuf: bool) -> Response {
    if otlp_protobuf {
        too_large_answer(limit)
    } else {
        extract::payload_too_large_error(limit).into_response()
    }
}

/// tower-http's limit (kept behind the gate's own checks, as a second line) answers in plain
/// text; give such an answer the contract's body (or the OTLP one). The routes' own `413`s
/// (JSON, or protobuf on the trace route) are left as they are.
fn with_contract_body_limit_answer(
    response: Response,
    limit: usize,
    otlp_protobuf: bool,
) -> Response {
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && is_plain_text(&response) {
        return too_large(limit, otlp_protobuf);
    }
    response
}

fn is_plain_text(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .is_none_or(|value| value.as_bytes().starts_with(b"text/plain"))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn bytes_of(body: Body) -> Bytes {
        axum::body::to_bytes(body, usize::MAX)
            .await
            .expect("an in-memory body")
    }

    /// A body in one piece is handed on as hyper gave it (no copy); one in many is copied into
    /// one buffer as the pieces come, and no piece is kept.
    #[tokio::test]
    async fn a_body_in_pieces_is_joined_as_it_comes_and_one_piece_is_not_copied() {
        let only = Bytes::from_static(b"{\"one\": \"piece\"}");
        let mut whole = WholeBody::default();
        whole.push(only.clone());
        let handed = bytes_of(whole.into_body()).await;
        assert_eq!(handed, only);
        assert_eq!(handed.as_ptr(), only.as_ptr(), "the very buffer");

        let text = b"{\"sent\": \"a byte a chunk\"}";
        let mut whole = WholeBody::default();
        for byte in text {
            whole.push(Bytes::copy_from_slice(&[*byte]));
            assert!(!matches!(whole, WholeBody::Empty));
        }
        assert!(matches!(&whole, WholeBody::Joined(joined) if joined.as_slice() == text));
        assert_eq!(bytes_of(whole.into_body()).await.as_ref(), text);

        assert!(bytes_of(WholeBody::default().into_body()).await.is_empty());
    }
}
