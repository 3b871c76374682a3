//! `GET /openapi.json` on a real server: a valid OpenAPI 3.x document that holds every operation of
//! the contract's tables (activity, journal, streams, operations), the core's record schemas in
//! their wire spelling, and no route that the server serves without describing it.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::{Options, TestServer};

/// Every `METHOD path` of `shared/docs/http-api.md`'s activity, journal, live-stream and
/// operations sections, as route templates.
const CONTRACT: &[(&str, &str)] = &[
    ("POST", "/v1/activity/spans"),
    ("POST", "/v1/activity/spans/{spanId}/end"),
    ("PATCH", "/v1/activity/spans/{spanId}"),
    ("POST", "/v1/activity/spans/{spanId}/events"),
    ("POST", "/v1/activity/spans/{spanId}/heartbeat"),
    ("GET", "/v1/activity/spans/{spanId}"),
    ("POST", "/v1/activity/batch"),
    ("POST", "/v1/activity/runs/{runId}/close"),
    ("POST", "/v1/activity/runs/{runId}/rollup"),
    ("GET", "/v1/activity/runs/{runId}/snapshot"),
    ("GET", "/v1/activity/runs/{runId}/seq"),
    ("GET", "/v1/activity/runs/{runId}/rollup"),
    ("GET", "/v1/activity/runs"),
    ("GET", "/v1/activity/changes"),
    ("GET", "/v1/activity/changes/terminal-roots"),
    ("GET", "/v1/activity/cursor"),
    ("GET", "/v1/activity/open-roots"),
    ("GET", "/v1/activity/stuck"),
    ("POST", "/v1/activity/maintenance/sweep-orphans"),
    ("POST", "/v1/activity/maintenance/sweep-stale"),
    ("POST", "/v1/activity/maintenance/prune"),
    ("GET", "/v1/activity/runs/{runId}/stream"),
    ("GET", "/v1/activity/changes/stream"),
    ("POST", "/v1/engagements/{engagementId}/events"),
    ("GET", "/v1/engagements/{engagementId}/events"),
    ("GET", "/v1/engagements/{engagementId}/summary"),
    ("GET", "/v1/engagements/{engagementId}/board"),
    ("POST", "/v1/engagements/{engagementId}/compact"),
    ("GET", "/v1/engagements"),
    ("POST", "/v1/engagements/prune"),
    ("GET", "/v1/engagements/{engagementId}/stream"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

/// Contract routes outside those sections: whenever the server serves one, the document must
/// describe it too.
const SERVED_THEN_DOCUMENTED: &[(&str, &str)] = &[("POST", "/v1/traces")];

/// The `(METHOD, template)` pairs of the document.
pub fn documented_operations(document: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    let paths = document["paths"].as_object().cloned().unwrap_or_default();
    for (path, item) in paths {
        for method in [
            "get", "put", "post", "delete", "options", "head", "patch", "trace",
        ] {
            if item.get(method).is_some() {
                found.insert((method.to_ascii_uppercase(), path.clone()));
            }
        }
    }
    found
}

/// Whether some route serves `method path` (anything but the router's own 404 and 405).
async fn served(server: &TestServer, method: &str, path: &str) -> bool {
    let method = Method::from_bytes(method.as_bytes()).expect("a method");
    let response = server
        .client
        .request(method, format!("{}{path}", server.base))
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body.pointer("/error/message").and_then(Value::as_str);
    let fallback = status == 404 && message.is_some_and(|m| m.starts_with("no route for"));
    !(fallback || status == 405)
}

#[tokio::test]
async fn the_document_is_openapi_3_and_holds_every_contract_operation() {
    let server = TestServer::start().await;
    let reply = server.get("/openapi.json").await;
    let document = reply.assert_status(200).clone();
    let content_type = reply
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok());
    assert_eq!(content_type, Some("application/json"));
    let version = document["openapi"].as_str().unwrap_or_default();
    assert!(version.starts_with("3."), "openapi = {version:?}");
    assert!(document["info"]["title"].is_string());
    assert!(document["info"]["version"].is_string());

    let documented = documented_operations(&document);
    let missing: Vec<_> = CONTRACT
        .iter()
        .filter(|(method, path)| !documented.contains(&((*method).to_owned(), (*path).to_owned())))
        .collect();
    assert!(
        missing.is_empty(),
        "contract operations not documented: {missing:?}"
    );
    for (method, path) in SERVED_THEN_DOCUMENTED {
        if served(&server, method, path).await {
            assert!(
                documented.contains(&((*method).to_owned(), (*path).to_owned())),
                "{method} {path} is served but not documented"
            );
        }
    }
    // Every documented operation is served, at the concrete path of its template.
    for (method, template) in &documented {
        let path = template
            .replace("{spanId}", "s1")
            .replace("{runId}", "r1")
            .replace("{engagementId}", "e1");
        if path.ends_with("/stream") {
            continue; // a served stream's body never ends; the unit tests cover them in process
        }
        assert!(
            served(&server, method, &path).await,
            "{method} {template} is documented but not served"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn record_schemas_keep_the_wire_spelling() {
    let server = TestServer::start().await;
    let document = server.get("/openapi.json").await.assert_status(200).clone();
    let schemas = &document["components"]["schemas"];

    let span = &schemas["SpanRow"];
    let properties: BTreeSet<&str> = span["properties"]
        .as_object()
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let expected: BTreeSet<&str> = [
        "spanId",
        "runId",
        "parentSpanId",
        "name",
        "kind",
        "origin",
        "sessionId",
        "jobName",
        "attrs",
        "startedAt",
        "waitUntil",
        "endedAt",
        "outcome",
        "outcomeReason",
        "usage",
        "writer",
        "lastHeartbeatAt",
    ]
    .into_iter()
    .collect();
    assert_eq!(properties, expected);
    // `null` stays `null`: the nullable columns are always present.
    let required: BTreeSet<&str> = span["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(required, expected);
    assert_eq!(span["properties"]["attrs"]["type"], json!("object"));
    assert_eq!(
        span["properties"]["kind"]["$ref"],
        json!("#/components/schemas/SpanKind")
    );
    assert_eq!(
        schemas["SpanKind"]["enum"],
        json!(["turn", "tool", "subagent", "cron", "model", "other"])
    );
    assert_eq!(schemas["SpanKind"]["type"], json!("string"));
    assert_eq!(
        schemas["SpanOutcome"]["enum"],
        json!([
            "success",
            "error",
            "timeout",
            "cancelled",
            "denied",
            "interrupted"
        ])
    );

    // An input's optional fields are not required; absent usage fields are omitted.
    let start = &schemas["StartSpanInput"];
    assert_eq!(
        start["required"],
        json!(["spanId", "runId", "name", "kind", "origin"])
    );
    assert!(schemas["SpanUsage"].get("required").is_none());
    // A field the reference leaves `undefined` is absent, never `null`: optional, not nullable.
    for (schema, field) in [
        ("SpanUsage", "inputTokens"),
        ("SpanUsage", "costUsd"),
        ("BoardEntry", "status"),
        ("EngagementSummary", "endedAt"),
        ("EngagementSummary", "initiator"),
        ("EngagementSummary", "venue"),
        ("GuardBlock", "to"),
        ("EngagementHopSummary", "causationId"),
    ] {
        let property = &schemas[schema]["properties"][field];
        assert!(property.is_object(), "{schema}.{field}");
        assert!(
            !property.to_string().contains("\"null\""),
            "{schema}.{field} is declared nullable: {property}"
        );
    }
    // What writes take is described apart: a writer may send `null` for a usage field or for
    // `expectedSeq`, read as absent (the server takes it, so the document must not refuse it).
    for schema in ["EndSpanInput", "SpanPatch"] {
        let usage = schemas[schema]["properties"]["usage"].to_string();
        assert!(
            usage.contains("#/components/schemas/SpanUsageInput"),
            "{schema}: {usage}"
        );
    }
    let usage_input = &schemas["SpanUsageInput"];
    assert_eq!(usage_input["additionalProperties"], json!(false));
    for field in [
        "inputTokens",
        "outputTokens",
        "cacheReadTokens",
        "cacheCreationTokens",
        "costUsd",
        "model",
    ] {
        let property = &usage_input["properties"][field];
        assert!(
            property["type"]
                .as_array()
                .is_some_and(|types| types.contains(&json!("null"))),
            "SpanUsageInput.{field}: {property}"
        );
    }
    let append = &schemas["EngagementAppendBody"]["properties"]["expectedSeq"];
    assert!(
        append["type"]
            .as_array()
            .is_some_and(|types| types.contains(&json!("null"))),
        "{append}"
    );
    let span = json!({"spanId": "null-usage", "runId": "null-usage", "name": "n", "kind": "model", "origin": "session"});
    server
        .post("/v1/activity/spans", &span)
        .await
        .assert_status(201);
    let nulls = json!({"inputTokens": null, "outputTokens": 3, "cacheReadTokens": null,
        "cacheCreationTokens": null, "costUsd": null, "model": null});
    server
        .send(
            Method::PATCH,
            "/v1/activity/spans/null-usage",
            Some(&json!({"usage": nulls})),
            None,
        )
        .await
        .assert_status(200);
    server
        .post(
            "/v1/activity/spans/null-usage/end",
            &json!({"outcome": "success", "usage": nulls}),
        )
        .await
        .assert_status(200);
    let stored = server
        .get("/v1/activity/spans/null-usage")
        .await
        .assert_status(200)
        .clone();
    assert_eq!(stored["usage"], json!({"outputTokens": 3}), "{stored}");
    server
        .post(
            "/v1/engagements/null-seq/events",
            &json!({"type": "t", "at": 1, "data": {}, "expectedSeq": null}),
        )
        .await
        .assert_status(201);
    // Every 503 carries `Retry-After`, the shared one and a handler's own.
    let mut without = Vec::new();
    for (path, item) in document["paths"].as_object().cloned().unwrap_or_default() {
        for (method, operation) in item.as_object().cloned().unwrap_or_default() {
            let unavailable = &operation["responses"]["503"];
            if unavailable.is_null() || unavailable.get("$ref").is_some() {
                continue;
            }
            if unavailable["headers"]["Retry-After"].is_null() {
                without.push(format!("{method} {path}"));
            }
        }
    }
    assert!(without.is_empty(), "503 without Retry-After: {without:?}");
    let shared = &document["components"]["responses"]["Unavailable"];
    assert!(shared["headers"]["Retry-After"].is_object(), "{shared}");
    // The bounds the server enforces: ids of 1 to 256 bytes, times below 2^53 in magnitude.
    assert_eq!(start["properties"]["spanId"]["minLength"], 1);
    assert_eq!(start["properties"]["runId"]["maxLength"], 256);
    assert_eq!(
        start["properties"]["startedAt"]["maximum"],
        json!(9_007_199_254_740_991_i64)
    );
    assert_eq!(
        schemas["EngagementAppendBody"]["properties"]["type"]["minLength"],
        1
    );

    // A raw payload is any JSON value; an event's data is an object; `type` keeps its name.
    let payload = &schemas["SpanEventRow"]["properties"]["payload"];
    assert!(payload.get("type").is_none(), "{payload}");
    let event = &schemas["EngagementEvent"]["properties"];
    assert_eq!(event["data"]["type"], json!("object"));
    assert!(event.get("type").is_some() && event.get("event_type").is_none());

    // The error body of the contract.
    assert_eq!(
        schemas["ErrorBody"]["properties"]["error"]["$ref"],
        json!("#/components/schemas/ErrorDetail")
    );
    assert_eq!(
        schemas["ErrorDetail"]["required"],
        json!(["code", "message"])
    );

    // No property anywhere is snake_case.
    let mut snake = Vec::new();
    for (name, schema) in schemas.as_object().cloned().unwrap_or_default() {
        for (property, _) in schema["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default()
        {
            if property.contains('_') {
                snake.push(format!("{name}.{property}"));
            }
        }
    }
    assert!(snake.is_empty(), "snake_case properties: {snake:?}");
    server.stop().await;
}

#[tokio::test]
async fn operations_describe_their_parameters_bodies_and_errors() {
    let server = TestServer::start().await;
    let document = server.get("/openapi.json").await.assert_status(200).clone();
    let operation = |method: &str, path: &str| -> Value { document["paths"][path][method].clone() };

    let start = operation("post", "/v1/activity/spans");
    assert_eq!(
        start["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        json!("#/components/schemas/StartSpanInput")
    );
    assert_eq!(
        start["responses"]["201"]["content"]["application/json"]["schema"]["$ref"],
        json!("#/components/schemas/SpanRow")
    );
    assert_eq!(start["security"], json!([{"bearerAuth": ["ingest"]}]));
    let writer = start["parameters"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == json!("Flightlog-Writer")))
        .cloned()
        .unwrap_or_default();
    assert_eq!(writer["in"], json!("header"));
    assert_eq!(writer["required"], json!(false));
    // Each error status answers the contract's error body, directly or through a shared answer.
    for status in ["400", "409"] {
        assert_eq!(
            start["responses"][status]["content"]["application/json"]["schema"]["$ref"],
            json!("#/components/schemas/ErrorBody"),
            "{status}"
        );
    }
    for (status, shared) in [
        ("401", "Unauthorized"),
        ("403", "Forbidden"),
        ("413", "PayloadTooLarge"),
        ("415", "UnsupportedMediaType"),
        ("503", "Unavailable"),
    ] {
        assert_eq!(
            start["responses"][status]["$ref"],
            json!(format!("#/components/responses/{shared}")),
            "{status}"
        );
        assert_eq!(
            document["components"]["responses"][shared]["content"]["application/json"]["schema"]
                ["$ref"],
            json!("#/components/schemas/ErrorBody"),
            "{shared}"
        );
    }
    assert!(
        document["components"]["responses"]["Unavailable"]["headers"]["Retry-After"].is_object()
    );

    let get_span = operation("get", "/v1/activity/spans/{spanId}");
    let span_id = get_span["parameters"][0].clone();
    assert_eq!(span_id["name"], json!("spanId"));
    assert_eq!(span_id["in"], json!("path"));
    assert_eq!(span_id["required"], json!(true));
    assert!(get_span["responses"]["404"].is_object());
    assert_eq!(get_span["security"], json!([{"bearerAuth": ["read"]}]));

    let changes = operation("get", "/v1/activity/changes");
    let names: Vec<&str> = changes["parameters"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["after", "limit"]);
    assert!(changes["parameters"]
        .as_array()
        .is_some_and(|p| p.iter().all(|p| p["in"] == json!("query"))));

    let compact = operation("post", "/v1/engagements/{engagementId}/compact");
    assert_eq!(compact["security"], json!([{"bearerAuth": ["admin"]}]));
    assert!(operation("get", "/healthz").get("security").is_none());
    assert_eq!(
        operation("get", "/v1/activity/changes/stream")["responses"]["200"]["content"]
            .as_object()
            .map(|c| c.keys().cloned().collect::<Vec<_>>()),
        Some(vec!["text/event-stream".to_owned()])
    );
    let bearer = &document["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(bearer["type"], json!("http"));
    assert_eq!(bearer["scheme"], json!("bearer"));
    server.stop().await;
}

/// Every operation of the activity, journal and testing areas refuses a query parameter it does
/// not take, and the document lists that 400 (an audit: the document said an operation taking
/// none ignored the query string, and listed no 400 for `GET /v1/activity/cursor`); the
/// operations of the other areas ignore one, as probes and exporters may add it.
#[tokio::test]
async fn api_operations_refuse_a_query_parameter_they_do_not_take_as_documented() {
    let server = TestServer::start_with(Options {
        manual_clock: true,
        ..Options::default()
    })
    .await;
    let document = server.get("/openapi.json").await.assert_status(200).clone();
    let mut checked = 0;
    for (method, template) in documented_operations(&document) {
        let in_api = ["/v1/activity/", "/v1/engagements", "/v1/testing/"]
            .iter()
            .any(|area| template.starts_with(area));
        let path = ["{spanId}", "{runId}", "{engagementId}"]
            .iter()
            .fold(template.clone(), |path, id| path.replace(id, "x"));
        let method_of = Method::from_bytes(method.as_bytes()).expect("a method");
        let what = format!("{method} {template}");
        if !in_api {
            let response = server
                .client
                .request(method_of, format!("{}{path}?bogus=1", server.base))
                .send()
                .await
                .expect("request");
            assert_ne!(response.status().as_u16(), 400, "{what}");
            continue;
        }
        let reply = server
            .send(method_of, &format!("{path}?bogus=1"), None, None)
            .await;
        reply.assert_error(400, "invalid_request");
        let message = reply.body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("unknown query parameter") || message.contains("takes no query"),
            "{what}: {message}"
        );
        let operation = &document["paths"][&template][method.to_ascii_lowercase()];
        assert!(
            operation["responses"]["400"].is_object(),
            "{what} lists no 400"
        );
        checked += 1;
    }
    assert!(checked >= 30, "{checked} operations checked");
    server.stop().await;
}

/// What a schema-driven client (schemathesis, a generated SDK) reads off the document matches
/// what the server takes: `Last-Event-ID` is text of a given shape (a header is never `null`),
/// protobuf bodies are bytes (not an array of integers), and time fields carry the ±2^53 bound
/// the server enforces.
#[tokio::test]
async fn headers_protobuf_bodies_and_times_are_described_as_the_server_takes_them() {
    let server = TestServer::start().await;
    let document = server.get("/openapi.json").await.assert_status(200).clone();
    let parameter = |path: &str, name: &str| -> Value {
        document["paths"][path]["get"]["parameters"]
            .as_array()
            .and_then(|all| all.iter().find(|p| p["name"] == json!(name)))
            .cloned()
            .unwrap_or_default()
    };
    for path in [
        "/v1/activity/changes/stream",
        "/v1/activity/runs/{runId}/stream",
        "/v1/engagements/{engagementId}/stream",
    ] {
        let header = parameter(path, "Last-Event-ID");
        assert_eq!(
            header["schema"]["type"],
            json!("string"),
            "{path}: {header}"
        );
        assert!(header["schema"]["pattern"].is_string(), "{path}: {header}");
        assert_eq!(header["required"], json!(false), "{path}");
    }
    let traces = &document["paths"]["/v1/traces"]["post"];
    for schema in [
        &traces["requestBody"]["content"]["application/x-protobuf"]["schema"],
        &traces["requestBody"]["content"]["application/protobuf"]["schema"],
        &traces["responses"]["200"]["content"]["application/x-protobuf"]["schema"],
    ] {
        assert_eq!(schema["type"], json!("string"), "{schema}");
        assert_eq!(
            schema["contentMediaType"],
            json!("application/x-protobuf"),
            "{schema}"
        );
    }
    // A budget sum beyond a double's range is served `null` (as the reference's JavaScript
    // writes Infinity): the schema says so (an audit found a summary failing it).
    let tokens = &document["components"]["schemas"]["BudgetAmounts"]["properties"]["tokens"];
    assert!(
        tokens["type"]
            .as_array()
            .is_some_and(|types| types.contains(&json!("null"))),
        "{tokens}"
    );
    // `/metrics` is documented with the content type it is served with.
    let metrics = server
        .client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .expect("scrape");
    let served = metrics
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let documented = &document["paths"]["/metrics"]["get"]["responses"]["200"]["content"];
    assert!(documented.get(&served).is_some(), "{served}: {documented}");
    // An empty export (`{}`) is answered 200, as OTLP allows: nothing is required.
    let traces_json = &traces["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(traces_json["required"], Value::Null, "{traces_json}");
    assert_eq!(traces_json["properties"]["resourceSpans"]["type"], "array");
    let bounded = |schema: &Value, field: &str| {
        let field = &schema["properties"][field];
        assert_eq!(
            field["maximum"],
            json!(9_007_199_254_740_991_i64),
            "{field}"
        );
        assert_eq!(
            field["minimum"],
            json!(-9_007_199_254_740_991_i64),
            "{field}"
        );
    };
    let schemas = &document["components"]["schemas"];
    for field in ["digestFloorAt", "hardCeilingMs", "now"] {
        bounded(&schemas["PruneOptions"], field);
    }
    for field in ["staleAfterMs", "now"] {
        bounded(&schemas["SweepStaleBody"], field);
    }
    bounded(&schemas["EngagementPruneBody"], "now");
}

/// Bounds the server enforces are in the schemas, so that a client generated from the document
/// (or a schema-driven fuzzer) does not send values the server then refuses: a cost of 10^15 USD
/// or more, and a listing cursor that is not `<startedAt>:<runId>` (found by schemathesis).
#[tokio::test]
async fn enforced_bounds_are_in_the_schemas() {
    let server = TestServer::start().await;
    let document = server.get("/openapi.json").await.assert_status(200).clone();
    let cost = &document["components"]["schemas"]["SpanUsageInput"]["properties"]["costUsd"];
    assert_eq!(cost["minimum"], json!(0), "{cost}");
    assert_eq!(
        cost["exclusiveMaximum"],
        json!(1_000_000_000_000_000_i64),
        "{cost}"
    );
    let parameters = document["paths"]["/v1/activity/runs"]["get"]["parameters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let before = parameters
        .iter()
        .find(|parameter| parameter["name"] == "before")
        .expect("the before parameter");
    assert_eq!(
        before["schema"]["pattern"],
        json!("^[+-]?[0-9]{1,19}:.*$"),
        "{before}"
    );
    server.stop().await;
}
