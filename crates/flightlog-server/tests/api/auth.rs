//! Auth on a real server: every route refuses a missing, wrong or malformed token (401) and a
//! token without its scope (403), lets the right scope through, and `GET /healthz` needs none.
//! The route table here is checked against the routes the server registers (its OpenAPI
//! document, from which the routes are registered, plus any plain `.route(…)` in the source), so
//! a new route without a row fails [`the_table_covers_every_registered_route`]. Also: the start-up guard
//! against serving without tokens on a non-loopback address.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use flightlog_server::settings::{check_exposure, SettingsError};
use flightlog_server::{AuthConfig, Scope, Scopes, ServerConfig};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{Options, TestServer};

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Nothing,
    Scope(Scope),
}

/// One route: method, template (with an optional query), a body, what it needs.
struct Route {
    method: Method,
    template: &'static str,
    body: Option<Value>,
    needs: Needs,
}

fn route(method: Method, template: &'static str, body: Option<Value>, needs: Needs) -> Route {
    Route {
        method,
        template,
        body,
        needs,
    }
}

/// Every route of the contract this server serves.
fn routes() -> Vec<Route> {
    use Needs::Scope as S;
    use Scope::{Admin, Ingest, Read};
    let start = json!({"spanId": "s1", "runId": "r1", "name": "n", "kind": "turn",
                       "origin": "session", "startedAt": 1});
    vec![
        route(Method::GET, "/healthz", None, Needs::Nothing),
        route(Method::GET, "/metrics", None, S(Read)),
        route(Method::GET, "/openapi.json", None, S(Read)),
        route(Method::POST, "/v1/activity/spans", Some(start), S(Ingest)),
        route(Method::GET, "/v1/activity/spans/{spanId}", None, S(Read)),
        route(
            Method::PATCH,
            "/v1/activity/spans/{spanId}",
            Some(json!({"attrs": {"a": 1}})),
            S(Ingest),
        ),
        route(
            Method::POST,
            "/v1/activity/spans/{spanId}/end",
            Some(json!({"outcome": "ok"})),
            S(Ingest),
        ),
        route(
            Method::POST,
            "/v1/activity/spans/{spanId}/events",
            Some(json!({"eventType": "note", "payload": {}})),
            S(Ingest),
        ),
        route(
            Method::POST,
            "/v1/activity/spans/{spanId}/heartbeat",
            None,
            S(Ingest),
        ),
        route(
            Method::POST,
            "/v1/activity/batch",
            Some(json!({"ops": []})),
            S(Ingest),
        ),
        route(
            Method::POST,
            "/v1/activity/runs/{runId}/close",
            Some(json!({"outcome": "cancelled", "reason": "test"})),
            S(Ingest),
        ),
        route(
            Method::POST,
            "/v1/activity/runs/{runId}/rollup",
            None,
            S(Ingest),
        ),
        route(
            Method::GET,
            "/v1/activity/runs/{runId}/rollup",
            None,
            S(Read),
        ),
        route(
            Method::GET,
            "/v1/activity/runs/{runId}/snapshot",
            None,
            S(Read),
        ),
        route(Method::GET, "/v1/activity/runs/{runId}/seq", None, S(Read)),
        route(Method::GET, "/v1/activity/changes?after=0", None, S(Read)),
        route(
            Method::GET,
            "/v1/activity/changes/terminal-roots",
            None,
            S(Read),
        ),
        route(Method::GET, "/v1/activity/cursor", None, S(Read)),
        route(Method::GET, "/v1/activity/open-roots", None, S(Read)),
        route(Method::GET, "/v1/activity/runs", None, S(Read)),
        route(Method::POST, "/v1/traces", Some(json!({})), S(Ingest)),
        route(Method::POST, "/v1/metrics", Some(json!({})), S(Ingest)),
        route(Method::POST, "/v1/logs", Some(json!({})), S(Ingest)),
        route(
            Method::GET,
            "/v1/activity/stuck?thresholdMs=1",
            None,
            S(Read),
        ),
        route(
            Method::POST,
            "/v1/activity/maintenance/sweep-orphans",
            None,
            S(Admin),
        ),
        route(
            Method::POST,
            "/v1/activity/maintenance/sweep-stale",
            Some(json!({"staleAfterMs": 60000})),
            S(Admin),
        ),
        route(
            Method::POST,
            "/v1/activity/maintenance/prune",
            Some(json!({"digestFloorAt": 0, "hardCeilingMs": 1})),
            S(Admin),
        ),
        route(Method::GET, "/v1/activity/changes/stream", None, S(Read)),
        route(
            Method::GET,
            "/v1/activity/runs/{runId}/stream",
            None,
            S(Read),
        ),
        route(Method::GET, "/v1/engagements?limit=5", None, S(Read)),
        route(
            Method::POST,
            "/v1/engagements/prune",
            Some(json!({"now": 0})),
            S(Admin),
        ),
        route(
            Method::POST,
            "/v1/engagements/{engagementId}/events",
            Some(json!({"type": "note", "at": 1, "data": {}})),
            S(Ingest),
        ),
        route(
            Method::GET,
            "/v1/engagements/{engagementId}/events",
            None,
            S(Read),
        ),
        route(
            Method::GET,
            "/v1/engagements/{engagementId}/summary",
            None,
            S(Read),
        ),
        route(
            Method::GET,
            "/v1/engagements/{engagementId}/board",
            None,
            S(Read),
        ),
        route(
            Method::POST,
            "/v1/engagements/{engagementId}/compact",
            None,
            S(Admin),
        ),
        route(
            Method::GET,
            "/v1/engagements/{engagementId}/stream",
            None,
            S(Read),
        ),
        route(
            Method::PUT,
            "/v1/testing/clock",
            Some(json!({"now": 5})),
            S(Admin),
        ),
    ]
}

/// The template with its ids filled in.
fn concrete(template: &str) -> String {
    template
        .replace("{spanId}", "s1")
        .replace("{runId}", "r1")
        .replace("{engagementId}", "e1")
}

/// The tokens of the test server: one per scope, one with all.
const TOKENS: [(&str, &[Scope]); 4] = [
    ("token-read", &[Scope::Read]),
    ("token-ingest", &[Scope::Ingest]),
    ("token-admin", &[Scope::Admin]),
    ("token-all", &[Scope::Read, Scope::Ingest, Scope::Admin]),
];

/// A server with [`TOKENS`] and a testing clock; with `grpc`, also its OTLP/gRPC listener.
async fn start_with_tokens_and(grpc: bool) -> TestServer {
    let mut auth = AuthConfig::open();
    for (secret, scopes) in TOKENS {
        auth.add_token(secret, scopes.iter().copied().collect::<Scopes>())
            .expect("valid token");
    }
    TestServer::start_with(Options {
        manual_clock: true,
        config: ServerConfig {
            auth,
            ..ServerConfig::default()
        },
        grpc,
        ..Options::default()
    })
    .await
}

async fn start_with_tokens() -> TestServer {
    start_with_tokens_and(false).await
}

/// An answer: the status, the `WWW-Authenticate` header, and the body when it is an error
/// (a granted stream's body never ends, so it is not read).
struct Answer {
    status: StatusCode,
    www_authenticate: Option<String>,
    error: Option<Value>,
}

async fn call(server: &TestServer, route: &Route, authorization: Option<&str>) -> Answer {
    let url = format!("{}{}", server.base, concrete(route.template));
    let mut request = server.client.request(route.method.clone(), url);
    if let Some(body) = &route.body {
        request = request.json(body);
    }
    if let Some(value) = authorization {
        request = request.header("Authorization", value);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let www_authenticate = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let error = if matches!(status.as_u16(), 401 | 403) {
        Some(response.json::<Value>().await.expect("an error body"))
    } else {
        None
    };
    Answer {
        status,
        www_authenticate,
        error,
    }
}

#[track_caller]
fn assert_refused(answer: &Answer, status: u16, code: &str, what: &str) {
    assert_eq!(answer.status.as_u16(), status, "{what}");
    let body = answer.error.as_ref().expect("an error body");
    assert_eq!(body.pointer("/error/code"), Some(&json!(code)), "{what}");
    let message = body.pointer("/error/message").and_then(Value::as_str);
    assert!(message.is_some_and(|m| !m.is_empty()), "{what}: {body}");
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{what}: {body}");
}

#[tokio::test]
async fn every_route_refuses_missing_wrong_and_under_scoped_tokens() {
    let server = start_with_tokens().await;
    for route in routes() {
        let what = format!("{} {}", route.method, route.template);
        let Needs::Scope(scope) = route.needs else {
            // Public: no token needed, and a wrong one does not hurt either.
            for authorization in [None, Some("Bearer wrong")] {
                let answer = call(&server, &route, authorization).await;
                assert_eq!(answer.status.as_u16(), 200, "{what} with {authorization:?}");
            }
            continue;
        };

        let missing = call(&server, &route, None).await;
        assert_refused(&missing, 401, "unauthorized", &format!("{what}, no token"));
        assert_eq!(
            missing.www_authenticate.as_deref(),
            Some("Bearer realm=\"flightlog\""),
            "{what}"
        );
        for bad in [
            "Bearer wrong-token",
            "Bearer token-rea",
            "Bearer token-readx",
            "Basic dG9rZW4tYWxsOg==",
            "token-all",
            "Bearer",
        ] {
            let answer = call(&server, &route, Some(bad)).await;
            assert_refused(&answer, 401, "unauthorized", &format!("{what}, {bad:?}"));
        }

        for (secret, scopes) in TOKENS {
            let answer = call(&server, &route, Some(&format!("Bearer {secret}"))).await;
            if scopes.contains(&scope) {
                assert!(
                    !matches!(answer.status.as_u16(), 401 | 403),
                    "{what} with {secret}: {} {:?}",
                    answer.status,
                    answer.error
                );
            } else {
                assert_refused(&answer, 403, "forbidden", &format!("{what} with {secret}"));
            }
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_path_needs_a_token_before_it_is_a_404() {
    let server = start_with_tokens().await;
    let unknown = route(Method::GET, "/v1/nothing-here", None, Needs::Nothing);
    assert_refused(
        &call(&server, &unknown, None).await,
        401,
        "unauthorized",
        "no token",
    );
    for (secret, _) in TOKENS {
        let answer = call(&server, &unknown, Some(&format!("Bearer {secret}"))).await;
        assert_eq!(answer.status.as_u16(), 404, "{secret}");
    }
    server.stop().await;
}

/// A method its route does not serve is the router's 405 with any valid token (an audit:
/// `POST /healthz` with a read token was "lacks the `ingest` scope that POST /healthz needs",
/// and 405 with an ingest one); without a token it is still a 401.
#[tokio::test]
async fn a_method_its_route_does_not_serve_is_a_405_with_any_token() {
    let server = start_with_tokens().await;
    for (method, template) in [
        (Method::POST, "/healthz"),
        (Method::DELETE, "/v1/activity/cursor"),
        (Method::DELETE, "/v1/activity/spans/{spanId}"),
        (Method::PUT, "/v1/engagements/{engagementId}/events"),
        (Method::GET, "/v1/activity/maintenance/prune"),
        (Method::GET, "/v1/testing/clock"),
    ] {
        let wrong = route(method.clone(), template, None, Needs::Nothing);
        let what = format!("{method} {template}");
        if template != "/healthz" {
            assert_refused(
                &call(&server, &wrong, None).await,
                401,
                "unauthorized",
                &format!("{what}, no token"),
            );
        }
        for (secret, _) in TOKENS {
            let answer = call(&server, &wrong, Some(&format!("Bearer {secret}"))).await;
            assert_eq!(answer.status.as_u16(), 405, "{what} with {secret}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn two_authorization_headers_are_refused_whatever_their_order() {
    let server = start_with_tokens().await;
    for pair in [
        ["Bearer token-all", "Bearer wrong"],
        ["Bearer wrong", "Bearer token-all"],
        ["Bearer token-all", "Bearer token-all"],
    ] {
        let reply = server
            .send_with_headers(
                Method::GET,
                "/v1/activity/cursor",
                None,
                &[("Authorization", pair[0]), ("Authorization", pair[1])],
            )
            .await;
        reply.assert_error(401, "unauthorized");
    }
    server
        .send_with_headers(
            Method::GET,
            "/v1/activity/cursor",
            None,
            &[("Authorization", "Bearer token-all")],
        )
        .await
        .assert_status(200);
    server.stop().await;
}

#[tokio::test]
async fn without_tokens_every_route_is_open() {
    let server = TestServer::start_with(Options {
        manual_clock: true,
        ..Options::default()
    })
    .await;
    for route in routes() {
        let answer = call(&server, &route, None).await;
        assert!(
            !matches!(answer.status.as_u16(), 401 | 403),
            "{} {}: {}",
            route.method,
            route.template,
            answer.status
        );
    }
    server.stop().await;
}

/// An OTLP/gRPC `TraceService/Export` of the test trace's root span with an `authorization`
/// metadata entry for each of `authorizations`: the call's status code.
async fn grpc_export_as(
    channel: &tonic::transport::Channel,
    authorizations: &[&str],
) -> tonic::Code {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    let mut request = tonic::Request::new(crate::otlp::request(vec![crate::otlp::root_span()]));
    for value in authorizations {
        let value = value.parse().expect("ASCII metadata");
        request.metadata_mut().append("authorization", value);
    }
    let mut client = TraceServiceClient::new(channel.clone());
    let call = client.export(request);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), call)
        .await
        .expect("an answer within 10 s");
    match answer {
        Ok(_) => tonic::Code::Ok,
        Err(status) => {
            assert!(!status.message().is_empty(), "{status:?}");
            status.code()
        }
    }
}

/// The HTTP routes' auth table does not reach the OTLP/gRPC listener, which checks tokens in a
/// hook of its own: there too a missing, wrong or malformed token is `UNAUTHENTICATED`, a valid
/// token without the `ingest` scope (`read`, `admin`; as Bearer or as the Basic password) is
/// `PERMISSION_DENIED`, two `authorization` entries are `UNAUTHENTICATED` whatever their order
/// (as two `Authorization` headers are over HTTP), and none of those calls stores anything; the
/// same export with an `ingest` token is stored, so it was the token each refusal was about.
#[tokio::test]
async fn grpc_export_refuses_missing_wrong_and_under_scoped_tokens_and_stores_nothing() {
    let server = start_with_tokens_and(true).await;
    let channel = crate::otlp_fuzz::grpc_channel(&server).await;
    let refused: [(&[&str], tonic::Code); 10] = [
        (&[], tonic::Code::Unauthenticated),
        (&["Bearer wrong-token"], tonic::Code::Unauthenticated),
        (&["Bearer token-rea"], tonic::Code::Unauthenticated),
        (&["token-ingest"], tonic::Code::Unauthenticated),
        (&["Bearer token-read"], tonic::Code::PermissionDenied),
        (&["Bearer token-admin"], tonic::Code::PermissionDenied),
        // `flightlog:token-read`
        (
            &["Basic ZmxpZ2h0bG9nOnRva2VuLXJlYWQ="],
            tonic::Code::PermissionDenied,
        ),
        (
            &["Bearer wrong-token", "Bearer token-ingest"],
            tonic::Code::Unauthenticated,
        ),
        (
            &["Bearer token-ingest", "Bearer wrong-token"],
            tonic::Code::Unauthenticated,
        ),
        (
            &["Bearer token-ingest", "Bearer token-ingest"],
            tonic::Code::Unauthenticated,
        ),
    ];
    let read_back = |path: String| {
        server
            .client
            .get(format!("{}{path}", server.base))
            .bearer_auth("token-read")
            .send()
    };
    let span = format!("/v1/activity/spans/{}", crate::otlp::hex(1));
    for (authorization, code) in refused {
        assert_eq!(
            grpc_export_as(&channel, authorization).await,
            code,
            "{authorization:?}"
        );
        let stored = read_back(span.clone()).await.expect("request");
        assert_eq!(stored.status().as_u16(), 404, "{authorization:?}");
    }
    let cursor = read_back("/v1/activity/cursor".into())
        .await
        .expect("request");
    let cursor: Value = cursor.json().await.expect("a cursor");
    assert_eq!(cursor["changeCursor"], 0, "nothing was written");

    // `flightlog:token-ingest`
    for authorization in [
        "Bearer token-ingest",
        "Basic ZmxpZ2h0bG9nOnRva2VuLWluZ2VzdA==",
    ] {
        assert_eq!(
            grpc_export_as(&channel, &[authorization]).await,
            tonic::Code::Ok,
            "{authorization}"
        );
    }
    let stored = read_back(span).await.expect("request");
    assert_eq!(stored.status().as_u16(), 200);
    let stored: Value = stored.json().await.expect("the span");
    assert_eq!(stored["runId"], crate::otlp::TRACE_HEX);
    // Every call is counted by its status code (the HTTP listener's counts never showed them:
    // an audit's finding).
    let metrics = read_back("/metrics".into()).await.expect("request");
    let metrics = metrics.text().await.expect("the metrics");
    for (code, calls) in [("UNAUTHENTICATED", 7), ("PERMISSION_DENIED", 3), ("OK", 2)] {
        let series = format!(
            "flightlog_grpc_calls_total{{method=\"/opentelemetry.proto.collector.trace.v1.\
             TraceService/Export\",code=\"{code}\"}} {calls}\n"
        );
        assert!(metrics.contains(&series), "{series}{metrics}");
    }
    server.stop().await;
}

/// An OTLP exporter sending protobuf gets its refusals in protobuf (a `Status`), and a 401
/// there names the scheme like every other 401: that route is where exporters authenticate.
#[tokio::test]
async fn a_protobuf_export_refused_for_its_token_says_how_to_authenticate() {
    let server = start_with_tokens().await;
    for authorization in [None, Some("Bearer wrong-token")] {
        let mut request = server
            .client
            .post(format!("{}/v1/traces", server.base))
            .header("Content-Type", "application/x-protobuf")
            .body(Vec::new());
        if let Some(value) = authorization {
            request = request.header("Authorization", value);
        }
        let response = request.send().await.expect("request");
        assert_eq!(response.status().as_u16(), 401, "{authorization:?}");
        let headers = response.headers();
        assert_eq!(
            headers
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer realm=\"flightlog\""),
            "{authorization:?}"
        );
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/x-protobuf"),
            "{authorization:?}"
        );
    }
    server.stop().await;
}

/// The `(METHOD, template)` pairs the server registers: the operations of its OpenAPI document
/// (routes are registered from their `#[utoipa::path]` annotations, so the document is the
/// router's own list), plus any plain `.route(…)` call in the source.
async fn registered_routes() -> BTreeSet<(String, String)> {
    let server = TestServer::start_with(Options {
        manual_clock: true,
        ..Options::default()
    })
    .await;
    let document = server.get("/openapi.json").await.assert_status(200).clone();
    server.stop().await;
    let mut found = crate::openapi::documented_operations(&document);
    found.extend(plain_routes_in_source());
    found
}

/// The `(METHOD, template)` pairs `src/routes/*.rs` registers without an annotation, read from
/// the source: each `.route("template", get(a).post(b))` call.
fn plain_routes_in_source() -> BTreeSet<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/routes");
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("src/routes") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("read source");
        for call in source.split(".route(").skip(1) {
            // The call's text: up to the next `.route(` or the end of the router function.
            let call = call.split("\n}").next().unwrap_or(call);
            let Some(template) = call.split('"').nth(1) else {
                continue;
            };
            let after = &call[call.find(template).unwrap_or(0) + template.len()..];
            for method in ["get", "post", "put", "patch", "delete"] {
                let needle = format!("{method}(");
                let registered = after.match_indices(&needle).any(|(at, _)| {
                    at == 0 || {
                        let before = after.as_bytes()[at - 1];
                        !(before.is_ascii_alphanumeric() || before == b'_')
                    }
                });
                if registered {
                    found.insert((method.to_ascii_uppercase(), template.to_owned()));
                }
            }
        }
    }
    found
}

#[tokio::test]
async fn the_table_covers_every_registered_route() {
    let registered = registered_routes().await;
    assert!(
        registered.len() > 20,
        "the source scan found {registered:?}"
    );
    let table: BTreeSet<(String, String)> = routes()
        .iter()
        .map(|route| {
            let template = route.template.split('?').next().unwrap_or(route.template);
            (route.method.to_string(), template.to_owned())
        })
        .collect();
    let missing: Vec<_> = registered.difference(&table).collect();
    assert!(
        missing.is_empty(),
        "routes without a row in the auth table: {missing:?}"
    );
    let stale: Vec<_> = table.difference(&registered).collect();
    assert!(
        stale.is_empty(),
        "rows for routes that do not exist: {stale:?}"
    );
}

#[test]
fn serving_without_tokens_is_refused_on_non_loopback_addresses_unless_allowed() {
    let addr = |text: &str| text.parse::<SocketAddr>().expect("socket address");
    let open = AuthConfig::open();
    let guarded = AuthConfig::open()
        .with_token("t", Scopes::ALL)
        .expect("valid token");
    let loopback = [
        addr("127.0.0.1:4318"),
        addr("127.8.9.10:1"),
        addr("[::1]:4318"),
        addr("[::ffff:127.0.0.1]:4318"),
    ];
    let exposed = [
        addr("0.0.0.0:4318"),
        addr("192.0.2.7:4318"),
        addr("[::]:4318"),
        addr("[2001:db8::1]:4318"),
        addr("[::ffff:192.0.2.7]:4318"),
    ];
    for address in loopback {
        assert!(
            check_exposure(&[address], &open, false).is_ok(),
            "{address}"
        );
    }
    for address in exposed {
        let err = check_exposure(&[address], &open, false).expect_err("refused");
        assert!(
            matches!(err, SettingsError::UnauthenticatedNonLoopback { addr } if addr == address)
        );
        let message = err.to_string();
        for needle in [
            &address.to_string(),
            "--allow-unauthenticated-non-loopback",
            "FLIGHTLOG_ALLOW_UNAUTHENTICATED_NON_LOOPBACK=true",
            "`allow_unauthenticated_non_loopback = true` in the config file",
            "--token",
            "FLIGHTLOG_TOKENS",
            "127.0.0.1:4318",
        ] {
            assert!(message.contains(needle), "{needle:?} not in: {message}");
        }
        assert!(
            check_exposure(&[address], &guarded, false).is_ok(),
            "{address}"
        );
        assert!(check_exposure(&[address], &open, true).is_ok(), "{address}");
    }
    // A name that resolves to loopback and elsewhere is refused for the elsewhere.
    let mixed = [loopback[0], exposed[1]];
    assert!(check_exposure(&mixed, &open, false).is_err());
}

/// A web page must not use the flightlog of the machine its browser runs on. Without tokens, a
/// page of another site sent a "simple" request (`text/plain`, an empty body) to
/// `sweep-orphans` and closed the live runs; a page whose own name resolves to 127.0.0.1 (DNS
/// rebinding) could read everything (an audit's finding). Now a request whose `Origin` is not
/// the server's own is `403 forbidden`, and a token-less server answers only requests that
/// address it by an IP address, localhost or a name without a dot. Programs (no `Origin`) are
/// served as before.
#[tokio::test]
async fn requests_a_web_page_sends_are_refused() {
    let server = TestServer::start().await;
    let span = json!({"spanId": "live", "runId": "live", "name": "n", "kind": "turn",
                      "origin": "session", "attrs": {}});
    server
        .post("/v1/activity/spans", &span)
        .await
        .assert_status(201);
    let port = server.base.rsplit(':').next().expect("a port").to_owned();
    let send = |path: &str, headers: &[(&str, String)]| {
        let mut request = server
            .client
            .post(format!("{}{path}", server.base))
            .header("content-type", "text/plain");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        request.send()
    };
    let sweep = "/v1/activity/maintenance/sweep-orphans";
    for headers in [
        vec![("origin", "http://evil.example".to_owned())],
        vec![("origin", "null".to_owned())],
        vec![("origin", format!("http://127.0.0.1:{}", 1))],
        vec![
            ("host", format!("evil.example:{port}")),
            ("origin", format!("http://evil.example:{port}")),
        ],
    ] {
        let answer = send(sweep, &headers).await.expect("answered");
        assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{headers:?}");
        let body: Value = answer.json().await.expect("the error body");
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
    }
    let read = server
        .client
        .get(format!("{}/v1/activity/runs", server.base))
        .header("host", format!("rebound.example:{port}"))
        .send()
        .await
        .expect("answered");
    assert_eq!(read.status(), StatusCode::FORBIDDEN);
    let live = server.get("/v1/activity/spans/live").await;
    assert_eq!(
        live.assert_status(200)["outcome"],
        Value::Null,
        "no page closed the live run"
    );
    // The server's own origin, and its names: served.
    for headers in [
        vec![("origin", format!("http://127.0.0.1:{port}"))],
        vec![
            ("host", format!("localhost:{port}")),
            ("origin", format!("http://localhost:{port}")),
        ],
    ] {
        let answer = send(sweep, &headers).await.expect("answered");
        assert_eq!(answer.status(), StatusCode::OK, "{headers:?}");
    }
    server.stop().await;

    // A server with tokens serves any name (a page has no token).
    let mut auth = AuthConfig::open();
    auth.add_token("secret", Scopes::ALL).expect("a token");
    let server = TestServer::start_with(Options {
        config: ServerConfig {
            auth,
            ..ServerConfig::default()
        },
        ..Options::default()
    })
    .await;
    let answer = server
        .client
        .get(format!("{}/v1/activity/runs", server.base))
        .header(
            "host",
            format!("box.lan:{}", server.base.rsplit(':').next().unwrap_or("")),
        )
        .bearer_auth("secret")
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), StatusCode::OK);
    server.stop().await;
}

/// A 401 offers both schemes the server takes: `Bearer` and `Basic` (the token as the
/// password). Offered `Bearer` alone, clients that send Basic credentials only after a `Basic`
/// challenge (curl `--anyauth`, Python's `HTTPBasicAuthHandler`, Java's and .NET's clients)
/// never authenticated (an audit's finding). Checked with Python's handler itself, which
/// answers a challenge it understands and gives up otherwise; the body stays the contract's.
#[tokio::test]
async fn a_401_challenges_with_basic_too_and_a_basic_only_client_gets_in() {
    let server = start_with_tokens().await;
    let response = server
        .client
        .get(format!("{}/v1/activity/runs", server.base))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status().as_u16(), 401);
    let challenges: Vec<String> = response
        .headers()
        .get_all("www-authenticate")
        .iter()
        .filter_map(|value| value.to_str().ok().map(str::to_owned))
        .collect();
    assert_eq!(
        challenges,
        ["Bearer realm=\"flightlog\"", "Basic realm=\"flightlog\""],
        "one challenge per scheme"
    );
    let body: Value = response.json().await.expect("an error body");
    assert_eq!(body.pointer("/error/code"), Some(&json!("unauthorized")));
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "{body}");

    // A client that sends credentials only when challenged with Basic.
    let script = [
        "import sys, urllib.error, urllib.request",
        "base, token = sys.argv[1], sys.argv[2]",
        "passwords = urllib.request.HTTPPasswordMgrWithDefaultRealm()",
        "passwords.add_password(None, base, 'agent', token)",
        "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),",
        "    urllib.request.HTTPBasicAuthHandler(passwords))",
        "try:",
        "    print(opener.open(base + '/v1/activity/runs', timeout=10).status)",
        "except urllib.error.HTTPError as err:",
        "    print(err.code)",
    ]
    .join("\n");
    let base = server.base.clone();
    let answered = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", &script, &base, "token-read"])
            .output()
            .expect("python3 runs (the OTLP client tests need it too)")
    })
    .await
    .expect("the client's task");
    let said = String::from_utf8_lossy(&answered.stdout);
    assert_eq!(
        said.trim(),
        "200",
        "{said}{}",
        String::from_utf8_lossy(&answered.stderr)
    );
    server.stop().await;
}

/// An unhealthy store's `/healthz` answer named the database file by its absolute path to
/// anyone who could reach the port, tokens configured or not (an audit's finding). Without a
/// token it now says what is wrong in words that name no file; with any accepted token (any
/// scope) the full reason, path included.
#[tokio::test]
async fn an_unhealthy_healthz_names_the_database_file_only_to_a_token() {
    let server = start_with_tokens().await;
    let folder = server
        .db_path
        .parent()
        .expect("the database's folder")
        .to_string_lossy()
        .into_owned();
    std::fs::remove_file(&server.db_path).expect("delete the database file");
    // A write meets the loss (the store says so from then on).
    let write = server
        .client
        .post(format!("{}/v1/activity/spans", server.base))
        .bearer_auth("token-all")
        .json(
            &json!({"spanId": "s", "runId": "r", "name": "n", "kind": "turn",
                      "origin": "session"}),
        )
        .send()
        .await
        .expect("request");
    assert_eq!(write.status().as_u16(), 503);
    let healthz = |authorization: Option<&'static str>| {
        let mut request = server.client.get(format!("{}/healthz", server.base));
        if let Some(token) = authorization {
            request = request.bearer_auth(token);
        }
        async move {
            let response = request.send().await.expect("request");
            let status = response.status().as_u16();
            let body: Value = response.json().await.expect("an error body");
            (status, body)
        }
    };
    for authorization in [None, Some("not-a-token")] {
        let (status, body) = healthz(authorization).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body.pointer("/error/code"), Some(&json!("unavailable")));
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or_default();
        assert!(message.contains("deleted or replaced"), "{message}");
        assert!(
            !message.contains(&folder) && !message.contains("flightlog.db"),
            "{authorization:?}: {message}"
        );
    }
    let (status, body) = healthz(Some("token-read")).await;
    assert_eq!(status, 503, "{body}");
    let message = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(message.contains(&folder), "{message}");
    server.stop().await;
}
