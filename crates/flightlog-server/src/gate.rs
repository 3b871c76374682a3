//! The one middleware every request passes through: it counts the request for `/metrics`,
//! checks its token, takes a write slot for a write, runs the route, and gives a body-limit
//! refusal the contract's error body — in that order, so every answer (the gate's own refusals
//! included) is counted, a request is authenticated before it takes a write slot, and it takes
//! its slot before its body is read.
//!
//! Why one middleware and not one layer per concern: `Router::layer` wraps every route in each
//! layer, so each layer is a boxed service cloned and polled for every request. With four layers
//! (metrics, auth, write limit, body-limit answer) plus an extension layer, that stack was about
//! a tenth of the server's CPU on single-operation writes (perf on the `http` load generator).
//! The checks themselves live with their subjects ([`crate::auth`], [`crate::overload`],
//! [`crate::metrics`]); this module is only their order.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::metrics::{method_label, UNMATCHED_ROUTE};
use crate::state::AppState;
use crate::{auth, extract, overload};

/// The middleware (installed by [`crate::app`] with `from_fn_with_state`).
pub(crate) async fn gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(request.method());
    // A cheap clone (the template is shared); routing already happened, so it is present for
    // every routed request.
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = admit_and_run(&state, route.as_ref(), request, next).await;
    let response = with_contract_body_limit_answer(response, state.config().body_limit);
    state.metrics().observe_request(
        route.map_or_else(
            || UNMATCHED_ROUTE.to_owned(),
            |path| path.as_str().to_owned(),
        ),
        method,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

async fn admit_and_run(
    state: &AppState,
    route: Option<&MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    if let Err(refusal) = auth::check_token(state, &request, route.map(MatchedPath::as_str)) {
        return refusal.into_response();
    }
    let method = request.method().clone();
    let slot = match overload::take_write_slot(state, &method, route.is_some()).await {
        Ok(slot) => slot,
        Err(refusal) => return refusal.into_response(),
    };
    let response = next.run(request).await;
    drop(slot);
    response
}

/// tower-http answers a too-large declared length itself, in plain text; give that answer the
/// contract's body. (A body cut off while being read is already an `ApiError`.)
fn with_contract_body_limit_answer(response: Response, limit: usize) -> Response {
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json_response(&response) {
        return extract::payload_too_large_error(limit).into_response();
    }
    response
}

fn is_json_response(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"))
}
