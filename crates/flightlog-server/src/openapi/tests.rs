//! The document against the router it was generated with: every documented operation is served
//! by exactly that route template and method (the other direction holds by construction, since
//! routes are registered from their annotations), operation ids are unique, tags are declared,
//! and the security requirements follow the auth rules.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::{from_fn, Next};
use axum::response::Response;
use flightlog_core::activity::ActivityStore;
use flightlog_core::journal::{EngagementJournal, RetentionConfig};
use flightlog_core::ManualClock;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};
use tower::ServiceExt;
use utoipa::openapi::path::Operation;

use super::*;
use crate::auth::{Scope, ADMIN_ROUTES};
use crate::routes;

/// A state over a fresh SQLite file, with a testing clock so the testing route exists too.
fn state(dir: &tempfile::TempDir) -> AppState {
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("flightlog.db")))
        .expect("open database");
    let clock = Arc::new(ManualClock::new(0));
    let activity: Arc<dyn ActivityStore> = Arc::new(SqliteActivityStore::with_identity(
        Arc::clone(&db),
        clock.clone(),
        "openapi-test",
    ));
    let journal: Arc<dyn EngagementJournal> =
        Arc::new(SqliteEngagementJournal::new(db, RetentionConfig::default()));
    AppState::new(activity, journal).with_manual_clock(clock)
}

/// Every (method, path template, operation) of the document.
fn operations(document: &OpenApi) -> Vec<(Method, String, Operation)> {
    let mut out = Vec::new();
    for (path, item) in &document.paths.paths {
        let methods = [
            (Method::GET, &item.get),
            (Method::PUT, &item.put),
            (Method::POST, &item.post),
            (Method::DELETE, &item.delete),
            (Method::OPTIONS, &item.options),
            (Method::HEAD, &item.head),
            (Method::PATCH, &item.patch),
            (Method::TRACE, &item.trace),
        ];
        for (method, operation) in methods {
            if let Some(operation) = operation {
                out.push((method, path.clone(), operation.clone()));
            }
        }
    }
    out
}

/// The route template that answered, copied into the response for the test to read.
#[derive(Debug, Clone)]
struct Answered(String);

async fn record_route(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned());
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(Answered(route));
    }
    response
}

/// A concrete path for a template: each `{param}` becomes `x`.
fn concrete(template: &str) -> String {
    template
        .split('/')
        .map(|segment| {
            if segment.starts_with('{') {
                "x"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn every_documented_operation_is_served_by_its_own_route_and_method() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = state(&dir);
    let (router, document) = routes::router(&state);
    let router = router.layer(from_fn(record_route)).with_state(state);
    let operations = operations(&document);
    assert!(
        operations.len() > 30,
        "only {} operations",
        operations.len()
    );
    for (method, template, _) in operations {
        let request = Request::builder()
            .method(method.clone())
            .uri(concrete(&template))
            .body(Body::empty())
            .expect("request");
        let response = router.clone().oneshot(request).await.expect("infallible");
        let answered = response.extensions().get::<Answered>().map(|a| a.0.clone());
        assert_eq!(
            answered.as_deref(),
            Some(template.as_str()),
            "{method} {template} is documented but another route (or none) answered"
        );
        assert_ne!(
            response.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {template} is documented but the route does not take {method}"
        );
    }
}

#[test]
fn operation_ids_are_unique_and_every_tag_is_declared() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, document) = routes::router(&state(&dir));
    let declared: BTreeSet<String> = document
        .tags
        .iter()
        .flatten()
        .map(|tag| tag.name.clone())
        .collect();
    let mut ids = BTreeSet::new();
    for (method, path, operation) in operations(&document) {
        let id = operation.operation_id.clone().unwrap_or_default();
        assert!(!id.is_empty(), "{method} {path} has no operationId");
        assert!(ids.insert(id.clone()), "operationId {id} is used twice");
        let tags = operation.tags.clone().unwrap_or_default();
        assert_eq!(tags.len(), 1, "{method} {path}: {tags:?}");
        assert!(declared.contains(&tags[0]), "{method} {path}: {tags:?}");
        assert!(
            operation.summary.as_deref().is_some_and(|s| !s.is_empty()),
            "{method} {path} has no summary (the handler's doc comment)"
        );
    }
}

/// The scope of each operation's bearer requirement, `None` for an open one.
fn scope_of(document: &OpenApi, method: &Method, path: &str) -> Option<Vec<String>> {
    let (_, _, operation) = operations(document)
        .into_iter()
        .find(|(m, p, _)| m == method && p == path)
        .unwrap_or_else(|| panic!("{method} {path} is not documented"));
    let requirements = operation.security?;
    let json = serde_json::to_value(&requirements).expect("serializable");
    let scopes = json
        .pointer(&format!("/0/{BEARER}"))
        .and_then(|scopes| serde_json::from_value(scopes.clone()).ok());
    assert!(scopes.is_some(), "{method} {path}: {json}");
    scopes
}

#[test]
fn security_requirements_name_the_scope_the_auth_middleware_demands() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, document) = routes::router(&state(&dir));
    let read = Some(vec![Scope::Read.name().to_owned()]);
    let ingest = Some(vec![Scope::Ingest.name().to_owned()]);
    let admin = Some(vec![Scope::Admin.name().to_owned()]);
    let cases = [
        (Method::GET, "/healthz", None),
        (Method::GET, "/metrics", read.clone()),
        (Method::GET, "/openapi.json", read.clone()),
        (Method::GET, "/v1/activity/cursor", read.clone()),
        (Method::GET, "/v1/activity/changes/stream", read.clone()),
        (Method::POST, "/v1/activity/spans", ingest.clone()),
        (Method::PATCH, "/v1/activity/spans/{spanId}", ingest.clone()),
        (
            Method::POST,
            "/v1/engagements/{engagementId}/events",
            ingest,
        ),
        (Method::PUT, "/v1/testing/clock", admin.clone()),
    ];
    for (method, path, expected) in cases {
        assert_eq!(
            scope_of(&document, &method, path),
            expected,
            "{method} {path}"
        );
    }
    // Every admin route is documented, with the admin scope, whatever its method.
    for route in ADMIN_ROUTES {
        let documented: Vec<_> = operations(&document)
            .into_iter()
            .filter(|(_, path, _)| path == route)
            .collect();
        assert!(!documented.is_empty(), "{route} is not documented");
        for (method, path, _) in documented {
            assert_eq!(
                scope_of(&document, &method, &path),
                admin,
                "{method} {path}"
            );
        }
    }
}

#[test]
fn middleware_answers_are_documented_where_they_can_happen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, document) = routes::router(&state(&dir));
    let json = serde_json::to_value(&document).expect("serializable");
    let responses = |method: &str, path: &str| -> BTreeSet<String> {
        let pointer = format!("/paths/{}/{method}/responses", path.replace('/', "~1"));
        json.pointer(&pointer)
            .and_then(|r| r.as_object())
            .map(|r| r.keys().cloned().collect())
            .unwrap_or_default()
    };
    // A body declared over the limit is refused on every route, even one that reads none; the
    // health check answers 503 when the store cannot keep writes (its database file lost).
    let healthz = responses("get", "/healthz");
    assert_eq!(
        healthz,
        BTreeSet::from(["200".to_owned(), "413".to_owned(), "503".to_owned()])
    );
    let start = responses("post", "/v1/activity/spans");
    for status in [
        "201", "400", "401", "403", "408", "409", "413", "415", "500", "503",
    ] {
        assert!(
            start.contains(status),
            "POST /v1/activity/spans lacks {status}: {start:?}"
        );
    }
    let cursor = responses("get", "/v1/activity/cursor");
    assert!(
        cursor.contains("413") && !cursor.contains("415") && !cursor.contains("408"),
        "{cursor:?}"
    );
    // A bad `Flightlog-Writer` is a 400 on a route that takes no other input.
    let sweep = responses("post", "/v1/activity/maintenance/sweep-orphans");
    assert!(sweep.contains("400") && sweep.contains("408"), "{sweep:?}");
    let writer = json
        .pointer("/paths/~1v1~1activity~1maintenance~1sweep-orphans/post/parameters")
        .and_then(|parameters| parameters.as_array())
        .and_then(|parameters| parameters.iter().find(|p| p["name"] == "Flightlog-Writer"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        writer["schema"]["pattern"], "^(?!serve:)[!-~]+$",
        "visible ASCII, not the servers' namespace: {writer}"
    );
    // `/v1/traces` answers a protobuf request's errors in protobuf.
    for status in ["400", "401", "413", "415", "503"] {
        let pointer =
            format!("/paths/~1v1~1traces/post/responses/{status}/content/application~1x-protobuf");
        assert!(json.pointer(&pointer).is_some(), "{pointer}");
        let pointer =
            format!("/paths/~1v1~1traces/post/responses/{status}/content/application~1json");
        assert!(json.pointer(&pointer).is_some(), "{pointer}");
    }
    // The limits the server enforces are in the schemas.
    let parameter = |path: &str, name: &str| -> serde_json::Value {
        json.pointer(&format!(
            "/paths/{}/get/parameters",
            path.replace('/', "~1")
        ))
        .and_then(|p| p.as_array())
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .cloned()
        .unwrap_or_default()
    };
    let limit = parameter("/v1/activity/changes", "limit");
    assert_eq!(limit["schema"]["maximum"], 10_000, "{limit}");
    assert_eq!(limit["schema"]["minimum"], 0, "{limit}");
    let span_id = parameter("/v1/activity/spans/{spanId}", "spanId");
    assert_eq!(span_id["schema"]["maxLength"], 256, "{span_id}");
    assert_eq!(span_id["schema"]["minLength"], 1, "{span_id}");
    assert!(
        span_id["description"]
            .as_str()
            .is_some_and(|text| text.contains("256 bytes") && text.contains("characters")),
        "the limit is in bytes, which maxLength cannot say: {span_id}"
    );
    assert!(
        cursor.contains("401") && cursor.contains("403"),
        "{cursor:?}"
    );
    // The shared answers are components, and the error body they refer to is a schema.
    for name in ["Unauthorized", "Forbidden", "Unavailable", "Internal"] {
        assert!(
            json.pointer(&format!("/components/responses/{name}"))
                .is_some(),
            "{name}"
        );
    }
    assert!(json.pointer("/components/schemas/ErrorBody").is_some());
    assert!(json.pointer("/components/schemas/ErrorDetail").is_some());
    assert_eq!(
        json.pointer(&format!("/components/securitySchemes/{BEARER}/scheme")),
        Some(&serde_json::json!("bearer"))
    );
}

#[test]
fn the_testing_route_is_documented_only_where_it_is_served() {
    let dir = tempfile::tempdir().expect("temp dir");
    let with_clock = state(&dir);
    let (_, document) = routes::router(&with_clock);
    assert!(document.paths.paths.contains_key("/v1/testing/clock"));
    let without = AppState::new(with_clock.activity().clone(), with_clock.journal().clone());
    let (_, document) = routes::router(&without);
    assert!(!document.paths.paths.contains_key("/v1/testing/clock"));
}

#[test]
fn an_optional_body_may_be_left_out_but_is_never_null() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, document) = routes::router(&state(&dir));
    let json = serde_json::to_value(&document).expect("serializable");
    let body = json
        .pointer("/paths/~1v1~1activity~1spans~1{spanId}~1heartbeat/post/requestBody")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        body.pointer("/content/application~1json/schema"),
        Some(&serde_json::json!({"$ref": "#/components/schemas/HeartbeatBody"})),
        "{body}"
    );
    assert_ne!(
        body.get("required"),
        Some(&serde_json::json!(true)),
        "{body}"
    );
    let start = json
        .pointer("/paths/~1v1~1activity~1spans/post/requestBody/required")
        .cloned();
    assert_eq!(start, Some(serde_json::json!(true)));
}

/// Every event-stream answer lists its events (`x-sse-events`), each with a `data:` schema that
/// is in `components.schemas`; a new stream route cannot go without the list.
#[test]
fn every_event_stream_lists_its_events_and_their_data_schemas() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, document) = routes::router(&state(&dir));
    let json = serde_json::to_value(&document).expect("serializable");
    let schemas = json
        .pointer("/components/schemas")
        .and_then(serde_json::Value::as_object)
        .expect("components.schemas");
    let mut streams = BTreeSet::new();
    for (path, item) in json["paths"].as_object().expect("paths") {
        let Some(content) = item.pointer("/get/responses/200/content/text~1event-stream") else {
            continue;
        };
        streams.insert(path.clone());
        let events = content["x-sse-events"]
            .as_object()
            .unwrap_or_else(|| panic!("{path}: no x-sse-events in {content}"));
        let names: BTreeSet<&str> = events.keys().map(String::as_str).collect();
        assert!(
            names.contains("resync") && names.contains("error"),
            "{path}: {names:?}"
        );
        for (name, event) in events {
            let reference = event
                .pointer("/data/$ref")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            let schema = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{path} {name}: {event}"));
            assert!(
                schemas.contains_key(schema),
                "{path} {name}: no schema {schema}"
            );
            assert!(event["id"].is_string() && event["description"].is_string());
        }
    }
    assert_eq!(
        streams,
        BTreeSet::from([
            "/v1/activity/changes/stream".to_owned(),
            "/v1/activity/runs/{runId}/stream".to_owned(),
            "/v1/engagements/{engagementId}/stream".to_owned(),
        ])
    );
    // The resync payloads are typed: their schemas name the fields the streams write.
    let properties = |schema: &str| -> BTreeSet<String> {
        schemas[schema]["properties"]
            .as_object()
            .map(|properties| properties.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(
        properties("ChangeStreamResync"),
        BTreeSet::from(["reason", "changeLogHorizon", "resumeAfter", "action"].map(String::from))
    );
    assert_eq!(
        properties("JournalStreamResync"),
        BTreeSet::from(["reason", "fromSeq"].map(String::from))
    );
}
