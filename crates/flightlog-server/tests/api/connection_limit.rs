//! The connection limit over both listeners (`--max-connections`), through real sockets.
//!
//! Why this file exists: the limit is shared by the HTTP and gRPC listeners, and a listener
//! that took its slot before a client arrived kept it from the other one while it waited: with
//! a limit of 1 the HTTP API answered nothing (an audit's finding). A slot is now taken once a
//! client is accepted, so every slot serves a client.

use flightlog_server::state::ServerConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::{read_answer, Options, TestServer};

/// `GET /healthz` on `stream`, kept open after; its status (`None`: no answer within 10 s).
async fn healthz_on(stream: &mut TcpStream) -> Option<u16> {
    let request = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    stream.write_all(request.as_bytes()).await.expect("send");
    read_answer(stream).await
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
    assert_eq!(healthz_on(&mut first).await, Some(200));
    // The second slot serves a second HTTP client; the idle gRPC listener holds none.
    let mut second = TcpStream::connect(&addr).await.expect("connect");
    assert_eq!(
        healthz_on(&mut second).await,
        Some(200),
        "a second HTTP client is served while a slot is free"
    );
    drop((first, second));
    server.stop().await;
}
