//! Requests hyper cannot parse get the contract's error body, over a real socket.
//!
//! hyper answers these itself, before any route runs (see the server's `parse_error_body`
//! module); before, the answers were a bare `400`, `414` or `431` with an empty body. Each case
//! sends raw bytes on a fresh connection, reads until the server closes it, and checks the
//! status, the JSON body and that exactly the answer's bytes came; then the server still serves.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::TestServer;

const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Send `raw` on a new connection and read everything until the server closes it.
async fn exchange(server: &TestServer, raw: &[u8]) -> String {
    let addr = server.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The server may answer and close before it has read all of a very long head; what it
    // sent before the close is what counts.
    let _ = stream.write_all(raw).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(ANSWER_TIMEOUT, async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(count) => answer.extend_from_slice(&chunk[..count]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server neither answered nor closed");
    String::from_utf8(answer).expect("a UTF-8 answer")
}

/// The answers of one exchange: (status, lower-cased head, body) each, in order.
fn answers(mut text: &str) -> Vec<(u16, String, String)> {
    let mut all = Vec::new();
    while !text.is_empty() {
        let (head, rest) = text.split_once("\r\n\r\n").expect("a complete head");
        let head = head.to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .expect("a content-length")
            .parse()
            .expect("a number");
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|status| status.parse().ok())
            .expect("a status");
        assert!(rest.len() >= length, "a whole body: {text}");
        let (body, after) = rest.split_at(length);
        all.push((status, head, body.to_owned()));
        text = after;
    }
    all
}

fn assert_contract_error(answer: &(u16, String, String), status: u16, words: &str) {
    let (got, head, body) = answer;
    assert_eq!(*got, status, "{head}\n{body}");
    assert!(
        head.contains("\r\ncontent-type: application/json"),
        "{head}"
    );
    assert!(head.contains("\r\nconnection: close"), "{head}");
    let body: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(words), "{message}");
}

#[tokio::test]
async fn unparsable_requests_get_the_status_and_the_contract_body() {
    let server = TestServer::start().await;
    let many_fields: String = (0..150).map(|i| format!("X-Field-{i}: y\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "a target over 32 KiB (the head limit comes before hyper's 65,534 bytes)",
            format!(
                "GET /v1/activity/runs?{} HTTP/1.1\r\nHost: x\r\n\r\n",
                "a".repeat(70_000)
            )
            .into_bytes(),
            431,
            "32768 bytes of request line and headers",
        ),
        (
            "150 header fields",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many_fields}\r\n").into_bytes(),
            431,
            "at most 100 header fields",
        ),
        (
            // Whole in one write: hyper's buffer limit alone let such a head through at up to
            // 48 KiB (a read may fill more than it asked for).
            "a complete 40 KB head",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "a".repeat(40_000)
            )
            .into_bytes(),
            431,
            "32768 bytes",
        ),
        (
            "a complete head whose target is 33,000 bytes",
            format!(
                "GET /v1/activity/runs?{} HTTP/1.1\r\nHost: x\r\n\r\n",
                "a".repeat(33_000)
            )
            .into_bytes(),
            431,
            "32768 bytes",
        ),
        (
            "a 500 KB header",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
                "a".repeat(500_000)
            )
            .into_bytes(),
            431,
            "32768 bytes",
        ),
        (
            "not HTTP at all",
            b"GARBAGE\r\n\r\n".to_vec(),
            400,
            "not valid HTTP/1.1",
        ),
        (
            "a header name with a space",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n".to_vec(),
            400,
            "not valid HTTP/1.1",
        ),
        (
            "a Content-Length that is not a number",
            b"POST /v1/activity/spans HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(),
            400,
            "Content-Length",
        ),
    ];
    for (what, raw, status, words) in cases {
        let text = exchange(&server, &raw).await;
        let answers = answers(&text);
        assert_eq!(
            answers.len(),
            1,
            "{what}: one answer, then the close: {text}"
        );
        assert_contract_error(&answers[0], status, words);
    }
    let reply = server.get("/healthz").await;
    reply.assert_status(200);
    // Counted, though no route ran (they were invisible to an operator's dashboards).
    let scraped = crate::metrics::scrape(&server).await;
    for (status, count) in [(431, 5.0), (400, 3.0)] {
        let series = format!(
            "flightlog_http_requests_total{{route=\"unparsed\",method=\"other\",status=\"{status}\"}}"
        );
        assert_eq!(scraped.get(&series), Some(count), "{series}");
    }
    server.stop().await;
}

/// A head just under the limit (32 KiB of request line and headers) is served as any other.
#[tokio::test]
async fn a_head_just_under_the_limit_is_served() {
    let server = TestServer::start().await;
    let raw = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(32 * 1024 - 100)
    );
    let text = exchange(&server, raw.as_bytes()).await;
    let answers = answers(&text);
    assert_eq!(answers.len(), 1, "{text}");
    assert_eq!(answers[0].0, 200, "{text}");
    server.stop().await;
}

/// hyper answers a parse error of a later request on a keep-alive connection too: the answers of
/// the earlier requests are untouched, and the bad one gets the body.
#[tokio::test]
async fn a_bad_request_after_good_ones_on_one_connection() {
    let server = TestServer::start().await;
    let raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\
                GET /v1/activity/runs/no-such-run HTTP/1.1\r\nHost: x\r\n\r\n\
                GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n";
    let text = exchange(&server, raw).await;
    let answers = answers(&text);
    assert_eq!(answers.len(), 3, "{text}");
    assert_eq!(answers[0].0, 200, "{text}");
    assert_eq!(answers[1].0, 404, "{text}");
    let not_found: Value = serde_json::from_str(&answers[1].2).expect("a JSON body");
    assert_eq!(not_found["error"]["code"], "not_found");
    assert_contract_error(&answers[2], 400, "not valid HTTP/1.1");
    server.stop().await;
}

/// Requests whose framing or addressing HTTP/1.1 does not allow are refused `400` with the
/// contract's body and a close, nothing stored (RFC 9112): no `Host`, two `Host`s (the browser
/// guard judged the first), a transfer coding
/// other than `chunked` (hyper dropped `gzip` from `gzip, chunked` and read `chunked, chunked`
/// as chunked once), and a chunked body whose framing breaks (its 400 did not say the
/// connection closes, nor what was wrong). HTTP/1.0 without `Host`, plain chunked bodies and
/// absolute-form targets (whose authority stands in for `Host`) are served as before.
#[tokio::test]
async fn misframed_requests_are_refused_with_a_close_and_nothing_stored() {
    let server = TestServer::start().await;
    let append = |headers: &str, body: &str| {
        format!(
            "POST /v1/engagements/framing/events HTTP/1.1\r\n{headers}content-type: \
             application/json\r\n\r\n{body}"
        )
    };
    let event = r#"{"type":"note","at":1,"data":{}}"#;
    let chunked = format!("{:x}\r\n{event}\r\n0\r\n\r\n", event.len());
    let sized = format!("content-length: {}\r\n", event.len());
    for (case, raw, words) in [
        ("no Host", append(&sized, event), "has no Host header"),
        (
            "two Hosts",
            append(
                &format!("host: 127.0.0.1\r\nhost: evil.example\r\n{sized}"),
                event,
            ),
            "more than one Host",
        ),
        (
            "gzip, chunked",
            append(
                "host: 127.0.0.1\r\ntransfer-encoding: gzip, chunked\r\n",
                &chunked,
            ),
            "Transfer-Encoding",
        ),
        (
            "chunked twice",
            append(
                "host: 127.0.0.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n",
                &chunked,
            ),
            "only `chunked`, once",
        ),
        (
            "a broken chunk size",
            append(
                "host: 127.0.0.1\r\ntransfer-encoding: chunked\r\n",
                "zz\r\nabc\r\n0\r\n\r\n",
            ),
            "cannot read the request body: error reading a body from connection: ",
        ),
    ] {
        let text = exchange(&server, raw.as_bytes()).await;
        let all = answers(&text);
        assert_eq!(all.len(), 1, "{case}: {text}");
        assert_contract_error(&all[0], 400, words);
        assert!(
            all[0].1.contains("\r\nconnection: close"),
            "{case}: {}",
            all[0].1
        );
    }
    let events = server.get("/v1/engagements/framing/events").await;
    assert_eq!(
        events.assert_status(200),
        &serde_json::json!([]),
        "nothing stored"
    );

    // Served as before: HTTP/1.0 without Host, a plain chunked body, one Host in any case.
    for raw in [
        format!(
            "POST /v1/engagements/framing/events HTTP/1.0\r\n{sized}content-type: \
             application/json\r\n\r\n{event}"
        ),
        append(
            "HOST: 127.0.0.1\r\ntransfer-encoding: Chunked\r\nconnection: close\r\n",
            &chunked,
        ),
        // An absolute-form target's authority stands in for Host (RFC 9112, 3.2.2).
        format!(
            "POST http://elsewhere.example:80/v1/engagements/framing/events HTTP/1.1\r\nhost: \
             127.0.0.1\r\n{sized}content-type: application/json\r\nconnection: \
             close\r\n\r\n{event}"
        ),
    ] {
        let text = exchange(&server, raw.as_bytes()).await;
        let all = answers(&text);
        assert_eq!(all.len(), 1, "{raw}: {text}");
        assert_eq!(all[0].0, 201, "{raw}: {text}");
    }
    let events = server.get("/v1/engagements/framing/events").await;
    assert_eq!(events.assert_status(200).as_array().map(Vec::len), Some(3));
    server.stop().await;
}
