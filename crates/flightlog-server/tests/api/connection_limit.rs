//! The connection limit over both listeners (`--max-connections`), through real sockets.
//!
//! Why this file exists: the limit is shared by the HTTP and gRPC listeners, and a listener
//! that took its slot before a client arrived kept it from the other one while it waited: with
//! a limit of 1 the HTTP API answered nothing (an audit's finding). A slot is now taken once a
//! client is accepted, so every slot serves a client.

use std::time::Duration;

use flightlog_server::state::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Options, TestServer};

/// How long an answer may take when a slot is free.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

async fn healthz_on(stream: &mut TcpStream, close: bool) -> String {
    let connection = if close { "close" } else { "keep-alive" };
    let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !String::from_utf8_lossy(&answer).contains("{\"status\":\"ok\"}") {
        let read = tokio::time::timeout(ANSWER_TIMEOUT, stream.read(&mut chunk))
            .await
            .expect("an answer while a slot is free")
            .expect("read");
        assert!(read > 0, "closed before the answer");
        answer.extend_from_slice(&chunk[..read]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn every_slot_serves_a_client_with_both_listeners_on() {
    let server = TestServer::start_with(Options {
        grpc: true,
        config: ServerConfig {
            max_connections: 2,
            ..ServerConfig::default()
        },
        ..Options::default()
    })
    .await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    // The first client keeps its connection (and its slot) open after a request.
    let mut first = TcpStream::connect(&addr).await.expect("connect");
    let answer = healthz_on(&mut first, false).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The second slot serves a second HTTP client; the idle gRPC listener holds none.
    let mut second = TcpStream::connect(&addr).await.expect("connect");
    let answer = healthz_on(&mut second, false).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop((first, second));
    server.stop().await;
}
