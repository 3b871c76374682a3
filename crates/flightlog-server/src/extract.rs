//! The request extractors every handler uses, each rejecting with an [`ApiError`] so that a bad
//! request always gets the contract's status and error body.
//!
//! - [`JsonBody`] / [`OptionalJsonBody`]: a JSON body (`415` for another content type or a
//!   compressed body, `413` past the body limit, `400` for no body at all, malformed JSON or
//!   wrong types, naming the JSON path).
//! - [`ApiQuery`]: the query string (`400` for a bad one or an unknown parameter; a blank
//!   parameter counts as not given).
//! - [`NoQuery`]: on a route that reads no query parameter, `400` for one given.
//! - [`PathId`]: the one id a path captures, checked as an id (non-empty, at most 256 bytes).
//! - [`WriterStore`]: the activity store acting as the request's `Flightlog-Writer`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Query, RawPathParams, Request};
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri};
use flightlog_core::activity::ActivityStore;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::sync::Arc;

use crate::error::ApiError;
use crate::state::AppState;
use crate::validate::{check_id, MAX_ID_BYTES};

/// The header naming the writer identity a write acts as.
pub const WRITER_HEADER: &str = "flightlog-writer";

/// A required JSON body of type `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

/// A JSON body of type `T` that may also be empty (`None`), with or without a content type.
#[derive(Debug)]
pub struct OptionalJsonBody<T>(pub Option<T>);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = json_body_bytes(req, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// The body of a request that must declare a JSON content type, unparsed (what [`JsonBody`]
/// parses).
pub(crate) async fn json_body_bytes(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let declared = is_json(req.headers())?;
    let has_content_type = req.headers().contains_key(CONTENT_TYPE);
    let encoded = refuse_encoded(req.headers());
    // The gate has read the body already (see `gate`): taking it costs nothing.
    let bytes = read_body(req, state).await?;
    if bytes.is_empty() && !has_content_type {
        return Err(ApiError::invalid(
            "this endpoint takes a JSON body (Content-Type: application/json); the request had \
             none",
        ));
    }
    if !declared {
        return Err(ApiError::UnsupportedMediaType(
            "this endpoint takes a JSON body in UTF-8: send Content-Type: application/json".into(),
        ));
    }
    encoded?;
    Ok(bytes)
}

/// Refuse a body declared compressed (any `Content-Encoding` but `identity`): the JSON
/// endpoints take bodies as they are, and a compressed body read as JSON would be stored as
/// garbage or refused with a misleading parse error. Only the OTLP route takes compressed
/// bodies.
fn refuse_encoded(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(CONTENT_ENCODING) else {
        return Ok(());
    };
    let text = value.to_str().unwrap_or("(not text)").trim();
    if text.is_empty() || text.eq_ignore_ascii_case("identity") {
        return Ok(());
    }
    Err(ApiError::UnsupportedMediaType(format!(
        "this endpoint takes an uncompressed JSON body, not one with Content-Encoding: {text} \
         (only the OTLP routes /v1/traces, /v1/metrics and /v1/logs take gzip or deflate)"
    )))
}

impl<T: DeserializeOwned> FromRequest<AppState> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        // An empty body is "no body" whatever content type a client library put on it (the
        // contract: "`{at?}` or empty"); only a body with content must be JSON.
        let declared = is_json(req.headers());
        let encoded = refuse_encoded(req.headers());
        let bytes = read_body(req, state).await?;
        // Whitespace alone is no body either (a client's stray newline).
        if bytes
            .iter()
            .all(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
        {
            return Ok(OptionalJsonBody(None));
        }
        if !declared? {
            return Err(unsupported_media_type());
        }
        encoded?;
        parse_json(&bytes).map(|value| OptionalJsonBody(Some(value)))
    }
}

fn unsupported_media_type() -> ApiError {
    ApiError::UnsupportedMediaType(
        "a request body must be JSON in UTF-8: send Content-Type: application/json".into(),
    )
}

/// Whether the request declares a JSON body (`application/json` or `application/*+json`, with
/// no `charset` or a UTF-8 one: JSON is read as UTF-8, so a body declared in another charset is
/// not one this server can take). A content type that is not valid text is a bad request.
fn is_json(headers: &HeaderMap) -> Result<bool, ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Ok(false);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::invalid("the Content-Type header is not valid text"))?;
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    let foreign_charset = parts.any(|parameter| {
        parameter.split_once('=').is_some_and(|(name, charset)| {
            let charset = charset.trim().trim_matches('"');
            name.trim().eq_ignore_ascii_case("charset")
                && !charset.eq_ignore_ascii_case("utf-8")
                && !charset.eq_ignore_ascii_case("utf8")
        })
    });
    if foreign_charset {
        return Ok(false);
    }
    // Compared without lower-casing a copy: this runs on every JSON request.
    let ascii_prefix = |prefix: &str| {
        essence
            .get(..prefix.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
    };
    let ascii_suffix = |suffix: &str| {
        essence
            .len()
            .checked_sub(suffix.len())
            .and_then(|at| essence.get(at..))
            .is_some_and(|end| end.eq_ignore_ascii_case(suffix))
    };
    Ok(essence.eq_ignore_ascii_case("application/json")
        || (ascii_prefix("application/") && ascii_suffix("+json")))
}

/// The whole body, within the configured limit.
async fn read_body(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state)
        .await
        .map_err(|rejection| body_rejection(&rejection, state.config().body_limit))
}

fn body_rejection(rejection: &BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        payload_too_large_error(limit)
    } else {
        ApiError::invalid(format!("cannot read the request body: {rejection}"))
    }
}

/// The error for a body over `limit` bytes: send less at once (several batches, or several
/// exports, each under the limit), or raise the limit. The same words on every route: the gate
/// answers before the route is known to want a batch or a single write.
pub(crate) fn payload_too_large_error(limit: usize) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "the request body is larger than the limit of {limit} bytes: send a smaller body (a \
         batch or an export split into several requests), or start the server with a higher \
         --body-limit (FLIGHTLOG_BODY_LIMIT or `body_limit` in the config file)"
    ))
}

/// Parse a JSON body, naming the path of the first offending value. The common case, a valid
/// body, is parsed without path tracking; only a body that fails is parsed again with it, for
/// the message.
///
/// Every body of the contract is a JSON object; any other JSON value is refused before serde
/// sees it, because a derived `Deserialize` would read a struct from an array of its fields in
/// declaration order (`[1125899906842624, 1]` as prune options).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    require_json_object(bytes)?;
    if let Some(value) = from_utf8_json(bytes) {
        return Ok(value);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        // The path names the client's keys (a long unknown one whole): cut as every echo is;
        // one of no known segment is left out, as the error's own text leaves it out.
        let path = err.path();
        let known = path
            .iter()
            .any(|segment| !matches!(segment, serde_path_to_error::Segment::Unknown));
        let at = if known {
            format!("{}: ", flightlog_core::json_text::echoed(&path.to_string()))
        } else {
            String::new()
        };
        ApiError::invalid(format!("invalid JSON body: {at}{}", err.inner()))
    })?;
    deserializer
        .end()
        .map_err(|err| ApiError::invalid(format!("invalid JSON body: {err}")))?;
    Ok(value)
}

/// `bytes` read as `T` when they are UTF-8 and such JSON (`None` otherwise: the caller reads
/// them again for the error). Checked as UTF-8 once, whole: serde_json's reader of bytes checks
/// each string on its own, ~100 instructions a string (a tenth of a small body's parse).
pub(crate) fn from_utf8_json<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Option<T> {
    serde_json::from_str(std::str::from_utf8(bytes).ok()?).ok()
}

/// Refuse a body whose JSON text is a value other than an object (see [`parse_json`]); an
/// empty body and one that starts with a byte-order mark are said as such (the parser's "EOF
/// while parsing a value at line 1 column 0" and "expected value at line 1 column 1" leave the
/// client looking at JSON that seems fine).
pub(crate) fn require_json_object(bytes: &[u8]) -> Result<(), ApiError> {
    if bytes
        .iter()
        .all(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Err(ApiError::invalid(
            "invalid JSON body: the body is empty; send a JSON object ({} when no field is \
             needed)",
        ));
    }
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(ApiError::invalid(
            "invalid JSON body: it starts with a UTF-8 byte-order mark (EF BB BF), which JSON \
             sent over the network must not have; send the text without it (PowerShell and \
             .NET add one unless told to write UTF-8 without a BOM)",
        ));
    }
    match non_object_json(bytes) {
        Some(found) => Err(ApiError::invalid(format!(
            "invalid JSON body: expected a JSON object, got {found}"
        ))),
        None => Ok(()),
    }
}

/// What the body's JSON text is, when that is a JSON value other than an object. Text that is
/// no JSON value at all (`nul`, `[1,`, `{…` with an error) is left to the parser, whose message
/// says where it fails; only the first byte is looked at for an object.
pub(crate) fn non_object_json(bytes: &[u8]) -> Option<&'static str> {
    let first = bytes
        .iter()
        .find(|byte| !matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))?;
    let kind = match first {
        b'[' => "an array",
        b'"' => "a string",
        b'-' | b'0'..=b'9' => "a number",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => return None,
    };
    // Only on the way to an error: whether the whole text is that value.
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes)
        .is_ok()
        .then_some(kind)
}

/// The query string parsed as `T`. A blank parameter (`limit=`, or `limit` alone: what a form
/// sends for an empty field) counts as not given, so `?outcome=&limit=` is the same as no query;
/// unknown parameters are refused (every query type denies them: a misspelt `limt=5` would
/// otherwise be ignored without a word).
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        if !query.is_empty() {
            check_query_escapes(query)?;
        }
        let parsed = if query.split('&').any(is_blank_parameter) {
            let given: Vec<&str> = query
                .split('&')
                .filter(|parameter| !is_blank_parameter(parameter))
                .collect();
            let uri: Uri = format!("/?{}", given.join("&"))
                .parse()
                .map_err(|_| ApiError::invalid("the query string is not a valid URI query"))?;
            Query::try_from_uri(&uri)
        } else {
            Query::try_from_uri(&parts.uri)
        };
        parsed
            .map(|Query(value)| ApiQuery(value))
            .map_err(|rejection| ApiError::invalid(query_error_text(&rejection.body_text())))
    }
}

/// On a route that reads no query parameter: `400` for one given (a blank one counts as not
/// given, as in [`ApiQuery`]). Ignored, a parameter there is lost without a word: `?expectedSeq=3`
/// on an append would drop the guard it means to set (an audit's finding), `?limit=5` on a
/// snapshot would say nothing of the snapshot being whole.
#[derive(Debug)]
pub struct NoQuery;

impl<S: Send + Sync> FromRequestParts<S> for NoQuery {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        if let Some(query) = parts.uri.query() {
            check_query_escapes(query)?;
        }
        let Some(name) = first_given_parameter(&parts.uri) else {
            return Ok(NoQuery);
        };
        // A client sending a body with its parameters in the query meant them as its fields.
        let hint = if parts.headers.contains_key(CONTENT_TYPE) {
            ": a write's fields go in its JSON body"
        } else {
            ""
        };
        Err(ApiError::invalid(format!(
            "unknown query parameter `{name}`: {} {} takes no query parameters{hint}",
            parts.method,
            parts.uri.path()
        )))
    }
}

/// On a `POST` route that reads no body (a rollup, a compaction, the orphan sweep): an empty
/// body or `{}` (what a client library sends for "no fields"), else `400` naming the member, as
/// every write refuses a member it does not define; a body that is not JSON is a `415` or a
/// `400` as elsewhere. Ignored, `{"outcome": "error"}` on a rollup or `{"staleAfterMs": 0}` on
/// the orphan sweep read as done while meaning something else (an audit's finding).
#[derive(Debug)]
pub struct NoBody;

/// The members a body of a route that reads none may have: none (`{}`).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoMembers {}

impl FromRequest<AppState> for NoBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        match OptionalJsonBody::<NoMembers>::from_request(req, state).await {
            Ok(_) => Ok(NoBody),
            Err(ApiError::InvalidRequest(message)) => Err(ApiError::InvalidRequest(format!(
                "{method} {path} takes no body (send none, or {{}}): {message}"
            ))),
            Err(other) => Err(other),
        }
    }
}

/// The name of the first parameter of `uri`'s query that is not blank (see [`ApiQuery`]),
/// percent-decoded as the query's reader decodes it and cut to 64 characters; `None` when there
/// is none.
pub(crate) fn first_given_parameter(uri: &Uri) -> Option<String> {
    let given = uri
        .query()?
        .split('&')
        .find(|parameter| !is_blank_parameter(parameter))?;
    let name = given.split_once('=').map_or(given, |(name, _)| name);
    let name = name.replace('+', " ");
    Some(
        percent_encoding::percent_decode_str(&name)
            .decode_utf8_lossy()
            .chars()
            .take(64)
            .collect(),
    )
}

/// axum's query rejection in the words of the rest of the API: "Failed to deserialize query
/// string: limit: invalid digit found in string" becomes "bad query parameter limit: not a
/// whole number: give a whole number from 0 to 10000"; a missing, unknown or repeated one says
/// so.
fn query_error_text(text: &str) -> String {
    let detail = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text);
    if let Some(field) = detail
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!("the query parameter {field} is required");
    }
    // serde_urlencoded names the parameter first: "limt: unknown field `limt`, expected …".
    if let Some((_, rest)) = detail.split_once("unknown field ") {
        // Only the client's name is cut (see `echoed`), never the list of the route's own.
        return match rest
            .strip_prefix('`')
            .and_then(|rest| rest.split_once("`, expected"))
        {
            Some((name, expected)) => format!(
                "unknown query parameter `{}`, expected{expected}",
                flightlog_core::json_text::echoed(name)
            ),
            None => format!(
                "unknown query parameter {}",
                flightlog_core::json_text::echoed(rest)
            ),
        };
    }
    // The integer parameters' parse errors are Rust's ("invalid digit found in string",
    // "number too large to fit in target type"): said in the API's words, with what to give.
    let number_error = [
        ("invalid digit found in string", "not a whole number"),
        ("number too large to fit in target type", "out of range"),
        ("number too small to fit in target type", "out of range"),
    ]
    .into_iter()
    .find_map(|(rust, ours)| detail.strip_suffix(rust).map(|field| (field, ours)));
    if let Some((field, what)) = number_error {
        let field = field.trim_end_matches([':', ' ']);
        // Each parameter's own range, as its check after parsing says it (a number past the
        // 64-bit range is outside every one of them).
        let range = match field {
            "limit" => "from 0 to 10000",
            "after" => "(a change id this server sent)",
            "fromSeq" => "from 0 up (a seq this server sent)",
            _ => "below 2^53 in magnitude",
        };
        return format!("bad query parameter {field}: {what}: give a whole number {range}");
    }
    if let Some(field) = detail
        .strip_prefix("duplicate field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!("the query parameter {field} is given more than once: give it once");
    }
    // An unknown value of a parameter with a fixed set ("outcome: unknown SpanOutcome
    // \"bogus\", expected one of [...]"): only the client's value is cut, never the list of the
    // values to give (it was cut with the rest, the fix lost).
    if let Some((given, expected)) = detail.rsplit_once(", expected one of ") {
        // The value between its quotes is cut, the quotes kept (`unknown SpanOutcome "yyy…"`).
        let given = match given.split_once('"') {
            Some((head, quoted)) if quoted.len() > 1 && quoted.ends_with('"') => format!(
                "{head}\"{}\"",
                flightlog_core::json_text::echoed(&quoted[..quoted.len() - 1])
            ),
            _ => flightlog_core::json_text::echoed(given).to_string(),
        };
        return format!("bad query parameter {given}, expected one of {expected}");
    }
    format!(
        "bad query parameter {}",
        flightlog_core::json_text::echoed(detail)
    )
}

/// Refuses a query with a `%` that starts no percent-escape, or a parameter that is not UTF-8
/// once percent-decoded. The query's reader (the URL standard's form decoding) keeps such a `%`
/// as it is and makes bytes that are not UTF-8 into U+FFFD, so `?key=%FF` read the board entry
/// whose key is `\u{FFFD}` (an audit's finding), where the same escape in a path id is a 400.
pub(crate) fn check_query_escapes(query: &str) -> Result<(), ApiError> {
    for parameter in query.split('&') {
        if let Some(escape) = malformed_percent_escape(parameter) {
            return Err(ApiError::invalid(format!(
                "the query has {escape:?}, which is not a percent-escape (% and two hex \
                 digits): percent-encode each parameter's value (a literal % is %25)"
            )));
        }
        if percent_encoding::percent_decode_str(parameter)
            .decode_utf8()
            .is_err()
        {
            let name = parameter
                .split_once('=')
                .map_or(parameter, |(name, _)| name);
            let name = percent_encoding::percent_decode_str(&name.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned();
            return Err(ApiError::invalid(format!(
                "the query parameter {:?} is not UTF-8 once percent-decoded: percent-encode \
                 the UTF-8 bytes of its text",
                flightlog_core::json_text::echoed(&name)
            )));
        }
    }
    Ok(())
}

/// `name=` or `name` (or nothing, between two `&`): a parameter with no value.
fn is_blank_parameter(parameter: &str) -> bool {
    parameter
        .split_once('=')
        .is_none_or(|(_, value)| value.is_empty())
}

/// The single id captured by the route (`{spanId}`, `{runId}`, `{engagementId}`), percent-decoded
/// and checked: non-empty, at most 256 bytes.
#[derive(Debug)]
pub struct PathId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::invalid(rejection.body_text()))?;
        let Some((name, value)) = params.iter().next() else {
            return Err(ApiError::Internal("the route captures no id".into()));
        };
        if let Some(escape) = malformed_percent_escape(parts.uri.path()) {
            return Err(ApiError::invalid(format!(
                "the path has {escape:?}, which is not a percent-escape (% and two hex \
                 digits): percent-encode the {name} (a literal % is %25)"
            )));
        }
        check_id(name, value)?;
        Ok(PathId(value.to_owned()))
    }
}

/// The first `%` of `path` not followed by two hex digits, with what follows it (at most two
/// characters). Percent-decoding leaves such a `%` as it is, so `/spans/%ZZ` and `/spans/%25ZZ`
/// named the same span (an audit's finding); refused instead, as invalid UTF-8 is.
fn malformed_percent_escape(path: &str) -> Option<&str> {
    let bytes = path.as_bytes();
    let mut from = 0;
    while let Some(offset) = bytes.get(from..)?.iter().position(|&byte| byte == b'%') {
        let at = from + offset;
        let escape = bytes.get(at + 1..at + 3);
        if !escape.is_some_and(|pair| pair.iter().all(u8::is_ascii_hexdigit)) {
            let end = path
                .char_indices()
                .map(|(index, _)| index)
                .chain(std::iter::once(path.len()))
                .filter(|&index| index > at)
                .nth(2)
                .unwrap_or(path.len());
            return path.get(at..end);
        }
        from = at + 3;
    }
    None
}

/// Identities that start with this belong to servers (`serve:<instance>/pid:…`): a server's
/// boot sweep closes the open spans of its instance's earlier identities, so a client naming
/// itself inside that namespace would have its spans closed by someone else's restart.
pub const SERVER_WRITER_PREFIX: &str = "serve:";

/// The request's `Flightlog-Writer` identity: `None` without the header; refused when it is
/// given twice (which one would the write act as?) or its value fails [`check_writer`].
pub(crate) fn writer_header(headers: &axum::http::HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(WRITER_HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::invalid(
            "the Flightlog-Writer header is given more than once; send one identity",
        ));
    }
    let writer = value
        .to_str()
        .map_err(|_| ApiError::invalid("the Flightlog-Writer header must be visible ASCII text"))?;
    check_writer(writer)?;
    Ok(Some(writer))
}

/// The checks of a `Flightlog-Writer` value: 1 to 256 bytes of visible ASCII (no space or tab:
/// an identity is one token, shown and compared as it is), not a server's identity.
pub(crate) fn check_writer(writer: &str) -> Result<(), ApiError> {
    if let Some(position) = writer.bytes().position(|byte| !byte.is_ascii_graphic()) {
        return Err(ApiError::invalid(format!(
            "the Flightlog-Writer header must be visible ASCII text without spaces, got a \
             {:?} at byte {position}",
            writer[position..].chars().next().unwrap_or(' ')
        )));
    }
    if writer.is_empty() || writer.len() > MAX_ID_BYTES {
        return Err(ApiError::invalid(format!(
            "the Flightlog-Writer header must be 1 to {MAX_ID_BYTES} bytes, got {}",
            writer.len()
        )));
    }
    if writer.starts_with(SERVER_WRITER_PREFIX) {
        return Err(ApiError::invalid(format!(
            "the Flightlog-Writer header may not start with {SERVER_WRITER_PREFIX:?}: such \
             identities are the servers' own, whose spans a server restart closes; name the \
             client (or leave the header out to write as this server)"
        )));
    }
    Ok(())
}

/// The activity store acting as the request's writer: the `Flightlog-Writer` header's identity,
/// or the server's own when the header is absent.
pub struct WriterStore(pub Arc<dyn ActivityStore>);

impl FromRequestParts<AppState> for WriterStore {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(WriterStore(match writer_header(&parts.headers)? {
            Some(writer) => state.activity_as(writer),
            None => Arc::clone(state.activity()),
        }))
    }
}

/// The activity store a maintenance call that judges writers (`sweep-stale`) acts as: the
/// `Flightlog-Writer` header's identity, or without it the maintenance identity (see
/// [`AppState::with_maintenance_writer`]), which spares no one, as the scheduled sweep does.
/// The server's own identity (a write's default) would spare every run written without the
/// header, and such a run could then never be swept on demand.
pub struct SweeperStore(pub Arc<dyn ActivityStore>);

impl FromRequestParts<AppState> for SweeperStore {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(SweeperStore(match writer_header(&parts.headers)? {
            Some(writer) => state.activity_as(writer),
            None => state.maintenance_activity(),
        }))
    }
}

/// The OpenAPI description of the `Flightlog-Writer` header of a [`SweeperStore`] handler.
impl utoipa::IntoParams for SweeperStore {
    fn into_params(
        _parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![writer_header_param(format!(
            "The writer identity this sweep acts as (1 to {MAX_ID_BYTES} bytes of visible ASCII, \
             not starting with `{SERVER_WRITER_PREFIX}`): its own runs are spared. Without it \
             the sweep spares no one, as the server's scheduled sweep: runs written without the \
             header are swept too."
        ))]
    }
}

/// The `Flightlog-Writer` values [`check_writer`] takes, as a JSON Schema `pattern`.
const WRITER_PATTERN: &str = "^(?!serve:)[!-~]+$";

/// The OpenAPI description of the `Flightlog-Writer` header, for every handler that takes a
/// [`WriterStore`] (`params(WriterStore)` in its `#[utoipa::path]`).
impl utoipa::IntoParams for WriterStore {
    fn into_params(
        _parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        vec![writer_header_param(format!(
            "The writer identity this write acts as (1 to {MAX_ID_BYTES} bytes of visible \
             ASCII, not starting with `{SERVER_WRITER_PREFIX}`, the servers' own \
             namespace): spans it starts are stamped with it, and `sweep-stale` spares its \
             runs. Without it the server's own identity is used."
        ))]
    }
}

/// The optional `Flightlog-Writer` header parameter, described by `description`.
fn writer_header_param(description: String) -> utoipa::openapi::path::Parameter {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::Required;
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_ID_BYTES))
        // Visible ASCII (`!` to `~`), no space or tab, and not the servers' own namespace
        // (ECMA-262, the dialect of JSON Schema's `pattern`, has the lookahead).
        .pattern(Some(WRITER_PATTERN));
    ParameterBuilder::new()
        .name("Flightlog-Writer")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_writer_pattern_refuses_the_servers_prefix() {
        assert_eq!(
            WRITER_PATTERN,
            format!("^(?!{SERVER_WRITER_PREFIX})[!-~]+$"),
            "the OpenAPI pattern names the prefix check_writer refuses"
        );
        assert!(check_writer(&format!("{SERVER_WRITER_PREFIX}x")).is_err());
        assert!(check_writer("agent-7").is_ok());
    }

    #[test]
    fn a_percent_without_two_hex_digits_is_found() {
        for (path, found) in [
            ("/v1/activity/spans/%ZZ", Some("%ZZ")),
            ("/v1/activity/spans/a%2", Some("%2")),
            ("/v1/activity/spans/%", Some("%")),
            ("/v1/activity/spans/%2Fx%zz/end", Some("%zz")),
            ("/v1/activity/spans/%e9x", None),
            ("/v1/activity/spans/%25ZZ", None),
            ("/v1/activity/spans/a%2Fb%2f", None),
            ("/v1/activity/spans/plain", None),
        ] {
            assert_eq!(malformed_percent_escape(path), found, "{path}");
        }
    }

    #[test]
    fn query_errors_read_like_the_rest_of_the_api() {
        assert_eq!(
            query_error_text(
                "Failed to deserialize query string: after: invalid digit found in string"
            ),
            "bad query parameter after: not a whole number: give a whole number (a change id \
             this server sent)"
        );
        assert_eq!(
            query_error_text(
                "Failed to deserialize query string: limit: invalid digit found in string"
            ),
            "bad query parameter limit: not a whole number: give a whole number from 0 to 10000"
        );
        assert_eq!(
            query_error_text(
                "Failed to deserialize query string: limit: number too large to fit in target \
                 type"
            ),
            "bad query parameter limit: out of range: give a whole number from 0 to 10000"
        );
        assert_eq!(
            query_error_text(
                "Failed to deserialize query string: fromSeq: number too small to fit in \
                 target type"
            ),
            "bad query parameter fromSeq: out of range: give a whole number from 0 up (a seq \
             this server sent)"
        );
        assert_eq!(
            query_error_text(
                "Failed to deserialize query string: thresholdMs: number too large to fit in \
                 target type"
            ),
            "bad query parameter thresholdMs: out of range: give a whole number below 2^53 in \
             magnitude"
        );
        assert_eq!(
            query_error_text("Failed to deserialize query string: duplicate field `limit`"),
            "the query parameter limit is given more than once: give it once"
        );
        assert_eq!(
            query_error_text("Failed to deserialize query string: missing field `thresholdMs`"),
            "the query parameter thresholdMs is required"
        );
        assert_eq!(
            query_error_text(
                "Failed to deserialize query string: limt: unknown field `limt`, expected `limit`"
            ),
            "unknown query parameter `limt`, expected `limit`"
        );
    }
    use axum::http::HeaderValue;

    fn content_type(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn json_content_types_with_parameters_and_suffixes_count() {
        assert_eq!(is_json(&HeaderMap::new()), Ok(false));
        assert_eq!(is_json(&content_type("application/json")), Ok(true));
        assert_eq!(
            is_json(&content_type("Application/JSON; charset=utf-8")),
            Ok(true)
        );
        assert_eq!(
            is_json(&content_type("application/merge-patch+json")),
            Ok(true)
        );
        assert_eq!(is_json(&content_type("text/plain")), Ok(false));
        // JSON is read as UTF-8: another declared charset is refused (415), not misread.
        for declared in [
            "application/json; charset=UTF-8",
            "application/json;charset=\"utf-8\"",
            "application/json; charset=utf8",
        ] {
            assert_eq!(is_json(&content_type(declared)), Ok(true), "{declared}");
        }
        for declared in [
            "application/json; charset=utf-16",
            "application/json; charset=latin-1",
            "application/json; CHARSET=\"iso-8859-1\"",
        ] {
            assert_eq!(is_json(&content_type(declared)), Ok(false), "{declared}");
        }
        assert_eq!(
            is_json(&content_type("application/x-www-form-urlencoded")),
            Ok(false)
        );
        for declared in [
            "APPLICATION/VND.API+JSON",
            " application/json ;q=1",
            "application/+json",
        ] {
            assert_eq!(is_json(&content_type(declared)), Ok(true), "{declared}");
        }
        for declared in [
            "",
            "json",
            "+json",
            "app",
            "application+json",
            "text/json+x",
            "application/jsonx",
        ] {
            assert_eq!(is_json(&content_type(declared)), Ok(false), "{declared}");
        }
    }

    #[test]
    fn json_errors_name_the_path_and_reject_trailing_data() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Body {
            at: i64,
        }
        let err = parse_json::<Body>(br#"{"at": "x"}"#)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("at: invalid type")),
            "{err:?}"
        );
        assert!(parse_json::<Body>(br#"{"at": 1} x"#).is_err());
        assert!(parse_json::<Body>(br#"{"at": 1}  "#).is_ok());
    }

    #[test]
    fn only_an_object_is_a_body() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Body {
            at: i64,
            reason: String,
        }
        assert!(parse_json::<Body>(br#" {"at": 1, "reason": "r"}"#).is_ok());
        // serde alone would read this one as `{"at": 1, "reason": "r"}`.
        for (text, found) in [
            (&br#"[1, "r"]"#[..], "an array"),
            (b"\n\t 7", "a number"),
            (b"-1", "a number"),
            (br#""x""#, "a string"),
            (b"true", "a boolean"),
            (b"null", "null"),
        ] {
            let err = parse_json::<Body>(text).err().map(|e| e.to_string());
            assert_eq!(
                err.as_deref(),
                Some(format!("invalid JSON body: expected a JSON object, got {found}").as_str()),
                "{}",
                String::from_utf8_lossy(text)
            );
        }
        // Not JSON at all, or nothing, or a value cut short: the parser's own message.
        for text in [
            &b"x"[..],
            b"",
            b"   ",
            b"nul",
            b"n",
            b"tru",
            b"fals",
            b"[1,",
            b"\"x",
            b"-",
        ] {
            let err = parse_json::<Body>(text).err().map(|e| e.to_string());
            assert!(err.is_some_and(|e| !e.contains("expected a JSON object")));
        }
    }
}
