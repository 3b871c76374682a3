//! `GET /openapi.json`: the OpenAPI 3.1 document of this server, generated from the code rather
//! than written by hand, so it cannot describe an API the server does not serve.
//!
//! Where each part comes from:
//! - paths, methods, parameters, bodies and each handler's own answers: the `#[utoipa::path]`
//!   annotation on the handler, which is also what registers the route (see `crate::routes`);
//! - schemas: `utoipa::ToSchema` on the wire types, the core's records included (its `openapi`
//!   feature);
//! - what the middleware adds to every route (`finish`): the bearer security requirement with
//!   the scope [`crate::auth::required_access`] demands, `400` wherever input is taken,
//!   `401`/`403` wherever a token is needed, `408` for writes (a stalled body), `413` everywhere
//!   (the gate refuses a body declared too large on any route), `415` wherever a body is read,
//!   `503` for writes (the write limit of [`crate::overload`], the budget of
//!   [`crate::request_budget`]), `500`/`503` for every route over
//!   the stores, the protobuf form of `/v1/traces`' errors, and the path ids' length bounds.
//!
//! `base` holds what no handler knows: the title, the tags, the security scheme. A new route
//! needs nothing here; a new *area* adds its tag to `tags` and to `ApiDoc`.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::Method;
use axum::response::IntoResponse;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, OpenApi, Ref, RefOr, Response, ResponseBuilder, Schema};
use utoipa::{OpenApi as _, PartialSchema, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::{is_read_method, required_access, Access};
use crate::error::{ApiError, ErrorBody};
use crate::routes::otlp::{is_otlp_path, LOGS_PATH, METRICS_PATH};
use crate::state::AppState;
use crate::validate::MAX_ID_BYTES;

/// The tag of each area of the contract (the sections of `http-api.md`).
pub(crate) mod tags {
    /// Spans, runs and the change log.
    pub(crate) const ACTIVITY: &str = "activity";
    /// The engagement journal.
    pub(crate) const JOURNAL: &str = "journal";
    /// The live Server-Sent-Event streams.
    pub(crate) const STREAMS: &str = "streams";
    /// Sweeps, pruning and compaction (the `admin` scope).
    pub(crate) const MAINTENANCE: &str = "maintenance";
    /// OpenTelemetry trace ingest (OTLP/HTTP).
    pub(crate) const INGEST: &str = "ingest";
    /// Health, metrics and this document.
    pub(crate) const OPERATIONS: &str = "operations";
    /// The testing clock of a `--manual-clock` server.
    pub(crate) const TESTING: &str = "testing";
}

/// The `{spanId}` path parameter. JSON Schema's `maxLength` counts characters, the server
/// bytes: the descriptions say so.
pub(crate) const SPAN_ID: &str = "The span's client-chosen id (1 to 256 bytes of UTF-8; \
    `maxLength` counts characters, so an id beyond ASCII reaches the limit sooner), \
    percent-encoded. The ids `.` and `..` are valid, but WHATWG URL libraries (browsers, \
    `fetch`) remove them from a path as dot segments even as `%2E` (the batch endpoint carries \
    span ids in its body).";
/// The `{runId}` path parameter.
pub(crate) const RUN_ID: &str = "The run's client-chosen id (1 to 256 bytes of UTF-8; \
    `maxLength` counts characters, so an id beyond ASCII reaches the limit sooner), \
    percent-encoded. The ids `.` and `..` are valid, but WHATWG URL libraries (browsers, \
    `fetch`) remove them from a path as dot segments even as `%2E`.";
/// The `{engagementId}` path parameter.
pub(crate) const ENGAGEMENT_ID: &str = "The engagement's client-chosen id (1 to 256 bytes of \
    UTF-8; `maxLength` counts characters, so an id beyond ASCII reaches the limit sooner), \
    percent-encoded. The ids `.` and `..` are valid, but WHATWG URL libraries (browsers, \
    `fetch`) remove them from a path as dot segments even as `%2E`.";

/// The 503 of an endpoint whose answer may be large (see `response_budget`).
pub(crate) const LARGE_RESPONSE_BUSY: &str = "The answer is large and the server's memory for \
    large answers is taken by other clients' for now; carries `Retry-After`.";

/// The name of the bearer-token security scheme.
pub const BEARER: &str = "bearerAuth";

/// What no handler annotation knows: the document's title and description and the tags.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "flightlog HTTP API",
        description = "The flight recorder for AI agents: activity spans (a tree per run, with \
            events, a change log and rollups) and engagement journals (append-only event streams \
            per multi-agent engagement). Field names are camelCase, times are integer epoch \
            milliseconds, a field the reference leaves undefined is absent and `null` stays \
            `null`. Every error answer is `{\"error\": {\"code\", \"message\"}}`. A JSON \
            value the server keeps (span `attrs`, an event's `payload`, a journal event's \
            `data`) nests at most 64 levels deep (400 `invalid_request` naming the path \
            beyond), so that every later read holding it stays within the depth JSON parsers \
            accept (serde_json's is 128).\n\n\
            When the server has tokens configured, every request but `GET /healthz` needs \
            `Authorization: Bearer <token>` with the scope each operation's security \
            requirement names (`read`, `ingest` or `admin`); HTTP Basic auth with the token as \
            the password (any user name) is taken as the same token, for clients such as OTLP \
            exporters that make Basic easier to set. Without tokens the server is open.\n\n\
            Query parameters: on an operation that takes any, an unknown one is a 400 (a \
            misspelt `limt=5` is not ignored); so is any on the activity, journal and testing \
            operations that take none (ignored, `?expectedSeq=0` on an append would drop the \
            guard it means to set), while `/healthz`, `/metrics`, `/openapi.json` and the OTLP \
            operations ignore the query string, as probes and exporters may add one; a blank \
            parameter (`limit=`, as a form sends an empty field and as the contract writes its \
            queries) counts as not given.",
    ),
    tags(
        (name = tags::ACTIVITY, description = "Spans, runs and the change log: one operation per reference `ActivityStore` call."),
        (name = tags::JOURNAL, description = "The engagement journal: appends, reads, summaries and the board."),
        (name = tags::STREAMS, description = "Live Server-Sent-Event streams: persist, then emit; gap-free and resumable with `Last-Event-ID`."),
        (name = tags::MAINTENANCE, description = "Sweeps, pruning and compaction; the `admin` scope."),
        (name = tags::INGEST, description = "OpenTelemetry trace ingest: OTLP/HTTP protobuf or JSON, each trace a run."),
        (name = tags::OPERATIONS, description = "Health, Prometheus metrics and this document."),
        (name = tags::TESTING, description = "The testing clock; present only on a server started with the manual clock (`--manual-clock`, `FLIGHTLOG_MANUAL_CLOCK` or `manual_clock`)."),
    ),
)]
struct ApiDoc;

/// The document before any route is added.
pub(crate) fn base() -> OpenApi {
    ApiDoc::openapi()
}

/// The routes of this module, each registered from its `#[utoipa::path]` annotation.
pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// This document: the OpenAPI 3.1 description of every route this server serves.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = tags::OPERATIONS,
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI document.", content_type = "application/json", body = Object)),
)]
async fn openapi_json(State(state): State<AppState>) -> axum::response::Response {
    match state.openapi_document() {
        Some(json) => ([(CONTENT_TYPE, "application/json")], json.clone()).into_response(),
        None => ApiError::Internal("the OpenAPI document was not built".into()).into_response(),
    }
}

/// Add to every operation of `document` what the middleware does to its route (see the module
/// documentation), and the shared error responses and the security scheme they refer to.
pub(crate) fn finish(document: &mut OpenApi) {
    let components = document.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        BEARER,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "A token configured on the server (`--token`, `FLIGHTLOG_TOKENS`, the config \
                     file), with the scopes `read` (all GETs and streams), `ingest` (all writes \
                     and OTLP) and `admin` (maintenance, prune, compact). Also accepted as \
                     the password of HTTP Basic auth.",
                ))
                .build(),
        ),
    );
    // The shared responses refer to `ErrorBody`: make sure it is there even if no handler names it.
    let mut schemas = vec![(ErrorBody::name().into_owned(), ErrorBody::schema())];
    <ErrorBody as ToSchema>::schemas(&mut schemas);
    crate::routes::streams::stream_event_schemas(&mut schemas);
    for (name, schema) in schemas {
        components.schemas.entry(name).or_insert(schema);
    }
    for shared in SharedResponse::ALL {
        components
            .responses
            .insert(shared.name().to_owned(), RefOr::T(shared.response()));
    }
    document_stream_events(document);
    for (path, item) in document.paths.paths.iter_mut() {
        let operations = [
            (Method::GET, &mut item.get),
            (Method::PUT, &mut item.put),
            (Method::POST, &mut item.post),
            (Method::DELETE, &mut item.delete),
            (Method::OPTIONS, &mut item.options),
            (Method::HEAD, &mut item.head),
            (Method::PATCH, &mut item.patch),
            (Method::TRACE, &mut item.trace),
        ];
        for (method, operation) in operations {
            if let Some(operation) = operation {
                finish_operation(path, &method, operation);
            }
        }
    }
}

/// A stream's events, on its `text/event-stream` answer as `x-sse-events` (OpenAPI 3.1 has no
/// field for the parts of an event stream): per `event:` name, the schema of its `data:`, what
/// its `id:` holds and when it is sent.
fn document_stream_events(document: &mut OpenApi) {
    for (path, events) in crate::routes::streams::STREAM_EVENTS {
        let content = document
            .paths
            .paths
            .get_mut(path)
            .and_then(|item| item.get.as_mut())
            .and_then(|operation| operation.responses.responses.get_mut("200"))
            .and_then(|response| match response {
                RefOr::T(response) => response.content.get_mut("text/event-stream"),
                RefOr::Ref(_) => None,
            });
        let Some(content) = content else {
            continue;
        };
        let mut listed = serde_json::Map::new();
        for event in events.iter() {
            let (schema, _) = (event.data)();
            listed.insert(
                event.name.to_owned(),
                serde_json::json!({
                    "data": {"$ref": format!("#/components/schemas/{schema}")},
                    "id": event.id,
                    "description": event.description,
                }),
            );
        }
        content
            .extensions
            .get_or_insert_with(Default::default)
            .insert("x-sse-events".to_owned(), serde_json::Value::Object(listed));
    }
}

fn finish_operation(path: &str, method: &Method, operation: &mut Operation) {
    optional_body_is_absent_not_null(operation);
    // The route template is both the path and the matched route, as the auth middleware sees it.
    let access = required_access(method, path, Some(path));
    match access {
        Access::Public => {}
        Access::AnyToken => add_security(operation, &[]),
        Access::Scope(scope) => add_security(operation, &[scope.name()]),
    }
    ids_are_bounded(operation);
    // Every operation of the API's own areas reads its query: the ones that take no parameter
    // refuse any (`crate::extract::NoQuery`).
    let reads_its_query = ["/v1/activity/", "/v1/engagements", "/v1/testing/"]
        .iter()
        .any(|area| path.starts_with(area));
    let takes_input = operation.request_body.is_some()
        || reads_its_query
        || operation
            .parameters
            .as_ref()
            .is_some_and(|parameters| !parameters.is_empty());
    if takes_input {
        add_response(operation, SharedResponse::InvalidRequest);
    }
    if access != Access::Public {
        add_response(operation, SharedResponse::Unauthorized);
        add_response(operation, SharedResponse::Forbidden);
    }
    if !is_read_method(method) {
        add_response(operation, SharedResponse::RequestTimeout);
    }
    // The gate refuses a body declared over the limit on every route, a bodiless one included.
    add_response(operation, SharedResponse::PayloadTooLarge);
    if operation.request_body.is_some() {
        add_response(operation, SharedResponse::UnsupportedMediaType);
    }
    if !is_read_method(method) || path.starts_with("/v1/") {
        add_response(operation, SharedResponse::Unavailable);
    }
    retry_after_on_every_503(operation);
    if path.starts_with("/v1/") {
        add_response(operation, SharedResponse::Internal);
    }
    if is_otlp_path(path) {
        errors_also_in_protobuf(operation);
        protobuf_bodies_are_bytes(operation, path);
    }
}

/// A protobuf message as an OpenAPI 3.1 schema: its bytes (`contentMediaType`), not the array of
/// integers utoipa makes of the `Vec<u8>` the path annotation names.
fn protobuf_message(description: &str) -> RefOr<Schema> {
    RefOr::T(Schema::Object(
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .content_media_type("application/x-protobuf")
            .description(Some(description))
            .build(),
    ))
}

/// The OTLP export routes: the protobuf request (`application/x-protobuf`, or
/// `application/protobuf`) and success bodies are messages (bytes); the
/// JSON request is an OTLP/JSON export request (`resourceSpans`, `resourceMetrics` or
/// `resourceLogs`, each of which may be left out of an empty export, as OTLP allows: `{}` is
/// answered 200).
fn protobuf_bodies_are_bytes(operation: &mut Operation, path: &str) {
    let (package, message, resources) = match path {
        METRICS_PATH => ("metrics", "Metrics", "resourceMetrics"),
        LOGS_PATH => ("logs", "Logs", "resourceLogs"),
        _ => ("trace", "Trace", "resourceSpans"),
    };
    if let Some(body) = operation.request_body.as_mut() {
        if let Some(content) = body.content.get_mut("application/x-protobuf") {
            content.schema = Some(protobuf_message(&format!(
                "An `opentelemetry.proto.collector.{package}.v1.Export{message}ServiceRequest`."
            )));
        }
        // `application/protobuf` (the IANA name some exporters send) is read the same way.
        if let Some(content) = body.content.get("application/x-protobuf").cloned() {
            body.content
                .insert("application/protobuf".to_owned(), content);
        }
        if let Some(content) = body.content.get_mut("application/json") {
            let schema = utoipa::openapi::ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::Type::Object)
                .property(
                    resources,
                    utoipa::openapi::ArrayBuilder::new().items(
                        utoipa::openapi::ObjectBuilder::new()
                            .schema_type(utoipa::openapi::schema::Type::Object),
                    ),
                )
                .description(Some(format!(
                    "An `Export{message}ServiceRequest` in OTLP/JSON (see \
                     `crates/flightlog-otlp/docs/otlp.md` in flightlog's repository for the \
                     field spellings read). `{{}}` is an empty export; an object with keys but no \
                     `{resources}` (another signal's export, another casing) is refused 400 as \
                     not an OTLP request."
                )));
            content.schema = Some(RefOr::T(Schema::Object(schema.build())));
        }
    }
    if let Some(RefOr::T(ok)) = operation.responses.responses.get_mut("200") {
        if let Some(content) = ok.content.get_mut("application/x-protobuf") {
            content.schema = Some(protobuf_message(&format!(
                "An `opentelemetry.proto.collector.{package}.v1.Export{message}ServiceResponse`."
            )));
        }
    }
}

/// A handler's own 503 (a large answer waiting for the response budget) carries `Retry-After`
/// as the shared one does: the header every 503 of the server sends.
fn retry_after_on_every_503(operation: &mut Operation) {
    if let Some(RefOr::T(response)) = operation.responses.responses.get_mut("503") {
        response
            .headers
            .entry("Retry-After".to_owned())
            .or_insert_with(retry_after_header);
    }
}

/// The `Retry-After` header of a 503: whole seconds.
fn retry_after_header() -> utoipa::openapi::header::Header {
    let seconds =
        utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::Type::Integer);
    HeaderBuilder::new()
        .schema(seconds)
        .description(Some("Seconds to wait before retrying."))
        .build()
}

/// The path ids (`spanId`, `runId`, `engagementId`) are 1 to 256 bytes (their descriptions,
/// [`SPAN_ID`] and the others, say that `maxLength` counts characters).
fn ids_are_bounded(operation: &mut Operation) {
    for parameter in operation.parameters.iter_mut().flatten() {
        if parameter.parameter_in != ParameterIn::Path {
            continue;
        }
        if let Some(RefOr::T(Schema::Object(schema))) = parameter.schema.as_mut() {
            schema.min_length = Some(1);
            schema.max_length = Some(MAX_ID_BYTES);
        }
    }
}

/// `POST /v1/traces` answers a protobuf request's errors with a protobuf `google.rpc.Status`
/// (what OTLP exporters read), a JSON request's with the contract's error body: every error
/// response of the operation gets the protobuf form beside the JSON one.
fn errors_also_in_protobuf(operation: &mut Operation) {
    let status_schema = protobuf_message(
        "A protobuf `google.rpc.Status` (code and message), as the OTLP/HTTP specification asks \
         for a protobuf request's errors.",
    );
    for (status, response) in operation.responses.responses.iter_mut() {
        if !(status.starts_with('4') || status.starts_with('5')) {
            continue;
        }
        let inline = match response {
            RefOr::T(inline) => inline,
            RefOr::Ref(reference) => {
                let Some(shared) = SharedResponse::ALL
                    .into_iter()
                    .find(|shared| reference.ref_location.ends_with(shared.name()))
                else {
                    continue;
                };
                *response = RefOr::T(shared.response());
                let RefOr::T(inline) = response else {
                    continue;
                };
                inline
            }
        };
        inline.content.insert(
            "application/x-protobuf".to_owned(),
            Content::new(Some(status_schema.clone())),
        );
    }
}

/// An optional body (`request_body = Option<T>`) is one that may be *left out*
/// (`OptionalJsonBody`), not one that may be `null`; utoipa describes it as `oneOf [null, T]`,
/// so keep just `T`.
fn optional_body_is_absent_not_null(operation: &mut Operation) {
    let Some(body) = operation.request_body.as_mut() else {
        return;
    };
    if body.required == Some(utoipa::openapi::Required::True) {
        return;
    }
    for content in body.content.values_mut() {
        let Some(RefOr::T(Schema::OneOf(one_of))) = content.schema.as_ref() else {
            continue;
        };
        let mut not_null = one_of.items.iter().filter(|item| !is_null_schema(item));
        if let (Some(only), None) = (not_null.next(), not_null.next()) {
            let only = only.clone();
            content.schema = Some(only);
        }
    }
}

fn is_null_schema(schema: &RefOr<Schema>) -> bool {
    matches!(
        schema,
        RefOr::T(Schema::Object(object))
            if object.schema_type == utoipa::openapi::schema::SchemaType::Type(
                utoipa::openapi::schema::Type::Null
            )
    )
}

fn add_security(operation: &mut Operation, scopes: &[&str]) {
    operation
        .security
        .get_or_insert_with(Vec::new)
        .push(SecurityRequirement::new(BEARER, scopes.iter().copied()));
}

/// Refer to `shared` for its status, unless the handler's annotation describes that status itself.
fn add_response(operation: &mut Operation, shared: SharedResponse) {
    operation
        .responses
        .responses
        .entry(shared.status().to_owned())
        .or_insert_with(|| RefOr::Ref(Ref::from_response_name(shared.name())));
}

/// The error answers the middleware (not the handler) gives, kept once in `components.responses`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SharedResponse {
    InvalidRequest,
    Unauthorized,
    Forbidden,
    RequestTimeout,
    PayloadTooLarge,
    UnsupportedMediaType,
    Unavailable,
    Internal,
}

impl SharedResponse {
    const ALL: [SharedResponse; 8] = [
        Self::InvalidRequest,
        Self::Unauthorized,
        Self::Forbidden,
        Self::RequestTimeout,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::Unavailable,
        Self::Internal,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::InvalidRequest => "InvalidRequest",
            Self::RequestTimeout => "RequestTimeout",
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden => "Forbidden",
            Self::PayloadTooLarge => "PayloadTooLarge",
            Self::UnsupportedMediaType => "UnsupportedMediaType",
            Self::Unavailable => "Unavailable",
            Self::Internal => "Internal",
        }
    }

    fn status(self) -> &'static str {
        match self {
            Self::InvalidRequest => "400",
            Self::RequestTimeout => "408",
            Self::Unauthorized => "401",
            Self::Forbidden => "403",
            Self::PayloadTooLarge => "413",
            Self::UnsupportedMediaType => "415",
            Self::Unavailable => "503",
            Self::Internal => "500",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::InvalidRequest => {
                "`invalid_request`: a parameter, header (such as `Flightlog-Writer`) or body \
                 this operation cannot take: wrong type, out of range, empty or too long."
            }
            Self::RequestTimeout => {
                "`request_timeout`: the body stalled (nothing new for 10 s, its first 64 KiB \
                 not within 10 s, or not whole within 60 s); the connection is closed."
            }
            Self::Unauthorized => {
                "`unauthorized`: tokens are configured and the request carries none, a malformed \
                 `Authorization` header, or an unknown token."
            }
            Self::Forbidden => "`forbidden`: the token lacks the scope this operation needs.",
            Self::PayloadTooLarge => {
                "`payload_too_large`: the body is over the server's limit (default 8 MiB)."
            }
            Self::UnsupportedMediaType => {
                "`unsupported_media_type`: a body in a content type (or encoding) this operation \
                 does not take."
            }
            Self::Unavailable => {
                "`unavailable`: the server is at its limit of writes in flight or of request \
                 bodies in flight (`--request-budget` for bodies over 64 KiB, 64 KiB a write \
                 slot for the first 64 KiB of each; a body arriving slower than 128 KiB/s gives \
                 way to one waiting for its budget), the store is overloaded, another process holds the \
                 database's write lock too long, the disk is full or failing, the database file \
                 was deleted or replaced under the server (until it is restarted), or the server \
                 is shutting down; nothing was written. Retry after `Retry-After` seconds; the \
                 message says which."
            }
            Self::Internal => {
                "`internal`: the database failed or holds data this version cannot read."
            }
        }
    }

    fn response(self) -> Response {
        let error_body: RefOr<Schema> = RefOr::Ref(Ref::from_schema_name("ErrorBody"));
        let mut response = ResponseBuilder::new()
            .description(self.description())
            .content("application/json", Content::new(Some(error_body)));
        match self {
            Self::Unavailable => {
                response = response.header("Retry-After", retry_after_header());
            }
            Self::Unauthorized => {
                let text = utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String);
                response = response.header(
                    "WWW-Authenticate",
                    HeaderBuilder::new()
                        .schema(text)
                        .description(Some(
                            "Two values: `Bearer realm=\"flightlog\"` and \
                             `Basic realm=\"flightlog\"` (the token as the password).",
                        ))
                        .build(),
                );
            }
            _ => {}
        }
        response.build()
    }
}

#[cfg(test)]
mod tests;
