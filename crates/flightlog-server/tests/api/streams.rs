//! The live streams on a real server: under concurrent writers every client (a normal one, a
//! deliberately slow one, one that reconnects with `Last-Event-ID` mid-run) ends with exactly
//! the committed changes in order; a run's stream starts with its snapshot and continues above
//! its high-water seq; an engagement's stream follows its seqs and says `resync` when they are
//! given out again (compaction, prune); and a second OS process writing the same database file
//! shows up in a stream, activity and journal alike.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{ActivityStore, PruneOptions, SpanKind, SpanOrigin, StartSpanInput};
use flightlog_core::journal::{AppendInput, EngagementJournal, RetentionConfig};
use flightlog_core::SystemClock;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};
use serde_json::{json, Value};

use crate::support::TestServer;
use flightlog_server::ServerConfig;

/// One parsed SSE event.
#[derive(Debug, Clone)]
struct SseEvent {
    event: String,
    /// The `id:` as a number (the change streams' ids).
    id: Option<i64>,
    /// The `id:` as sent (the journal stream's are `<seq>@<generation>`).
    raw_id: Option<String>,
    data: Value,
}

/// Where an [`SseClient`] reads its response body from.
enum Source {
    /// A reqwest response (its body already de-chunked).
    Reqwest(reqwest::Response),
    /// A hand-spoken HTTP/1.1 response on a socket of our own: its chunked body undone here.
    Raw(RawBody),
}

/// A chunked HTTP/1.1 response body read straight from a socket.
struct RawBody {
    socket: tokio::net::TcpStream,
    /// Bytes read from the socket and not yet de-chunked.
    wire: Vec<u8>,
    /// What is left of the data of the chunk being read.
    left_in_chunk: usize,
    /// The CRLF after a chunk's data is still to come.
    crlf_due: bool,
}

impl RawBody {
    /// The next piece of body: what the buffered bytes hold, reading the socket (8 KiB at a
    /// time) when they hold nothing.
    async fn chunk(&mut self) -> Vec<u8> {
        loop {
            let body = self.dechunk();
            if !body.is_empty() {
                return body;
            }
            let mut read = [0u8; 8192];
            let n = tokio::io::AsyncReadExt::read(&mut self.socket, &mut read)
                .await
                .expect("read the stream's socket");
            assert!(n > 0, "the stream ended");
            self.wire.extend_from_slice(&read[..n]);
        }
    }

    /// Take the body bytes the buffered wire bytes hold.
    fn dechunk(&mut self) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            if self.left_in_chunk > 0 {
                let take = self.left_in_chunk.min(self.wire.len());
                body.extend(self.wire.drain(..take));
                self.left_in_chunk -= take;
                if self.left_in_chunk > 0 {
                    return body;
                }
                self.crlf_due = true;
            }
            if self.crlf_due {
                // A chunk's data ends with CRLF.
                if self.wire.len() < 2 {
                    return body;
                }
                assert_eq!(&self.wire[..2], b"\r\n", "a chunk ends with CRLF");
                self.wire.drain(..2);
                self.crlf_due = false;
            }
            // `size[;extensions]CRLF`
            let Some(end) = find(&self.wire, b"\r\n") else {
                return body;
            };
            let line = std::str::from_utf8(&self.wire[..end]).expect("a chunk-size line");
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).expect("a hex chunk size");
            assert!(size > 0, "the stream ended (its last chunk came)");
            self.wire.drain(..end + 2);
            self.left_in_chunk = size;
        }
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// A minimal SSE reader over a streaming response.
struct SseClient {
    source: Source,
    buffer: Vec<u8>,
}

impl SseClient {
    async fn connect(server: &TestServer, path: &str, last_event_id: Option<i64>) -> Self {
        Self::connect_after(server, path, last_event_id.map(|id| id.to_string())).await
    }

    /// Connect with `Last-Event-ID` as given.
    async fn connect_after(server: &TestServer, path: &str, last_event_id: Option<String>) -> Self {
        let mut request = server.client.get(format!("{}{path}", server.base));
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.expect("stream request");
        assert_eq!(response.status().as_u16(), 200, "stream {path}");
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Self {
            source: Source::Reqwest(response),
            buffer: Vec::new(),
        }
    }

    /// Connect on a socket whose receive buffer is asked to be `receive_buffer` bytes (the
    /// kernel doubles it and enforces a floor), set before the connection so the window it
    /// advertises stays that small: a client that reads slowly then soon fills what the
    /// kernels on both ends hold, and the rest of its stream waits in the server.
    async fn connect_with_small_buffer(
        server: &TestServer,
        path: &str,
        receive_buffer: u32,
    ) -> Self {
        use tokio::io::AsyncWriteExt as _;
        let addr: std::net::SocketAddr = server
            .base
            .trim_start_matches("http://")
            .parse()
            .expect("the server's address");
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .set_recv_buffer_size(receive_buffer)
            .expect("set SO_RCVBUF");
        let mut socket = socket.connect(addr).await.expect("connect");
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
        socket
            .write_all(request.as_bytes())
            .await
            .expect("send the request");
        let mut wire = Vec::new();
        let head_end = loop {
            if let Some(end) = find(&wire, b"\r\n\r\n") {
                break end;
            }
            let mut read = [0u8; 1024];
            let n = tokio::time::timeout(
                Duration::from_secs(20),
                tokio::io::AsyncReadExt::read(&mut socket, &mut read),
            )
            .await
            .expect("a response head within 20 s")
            .expect("read the response head");
            assert!(n > 0, "the connection closed before a response head");
            wire.extend_from_slice(&read[..n]);
        };
        let head = String::from_utf8(wire.drain(..head_end + 4).collect())
            .expect("the response head is UTF-8")
            .to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "stream {path}: {head}");
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        assert!(head.contains("transfer-encoding: chunked"), "{head}");
        Self {
            source: Source::Raw(RawBody {
                socket,
                wire,
                left_in_chunk: 0,
                crlf_due: false,
            }),
            buffer: Vec::new(),
        }
    }

    /// The next event with data (keep-alive comments are skipped).
    async fn next(&mut self) -> SseEvent {
        loop {
            if let Some(end) = find(&self.buffer, b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let block = std::str::from_utf8(&block).expect("UTF-8");
                let mut event = SseEvent {
                    event: "message".into(),
                    id: None,
                    raw_id: None,
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        event.event = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("id:") {
                        event.id = value.trim().parse().ok();
                        event.raw_id = Some(value.trim().to_owned());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.strip_prefix(' ').unwrap_or(value));
                    }
                }
                if data.is_empty() {
                    continue;
                }
                event.data = serde_json::from_str(&data).expect("event data is JSON");
                return event;
            }
            let chunk = async {
                match &mut self.source {
                    Source::Reqwest(response) => response
                        .chunk()
                        .await
                        .expect("stream chunk")
                        .expect("stream still open")
                        .to_vec(),
                    Source::Raw(body) => body.chunk().await,
                }
            };
            let chunk = tokio::time::timeout(Duration::from_secs(20), chunk)
                .await
                .expect("an event within 20 s");
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

fn span_body(span_id: &str, run_id: &str, parent: Option<&str>) -> Value {
    let mut body = json!({
        "spanId": span_id, "runId": run_id, "name": "step", "kind": "tool", "origin": "session"
    });
    if let Some(parent) = parent {
        body["parentSpanId"] = json!(parent);
    }
    body
}

/// Every change id in the log, in order, read page by page over HTTP.
async fn all_change_ids(server: &TestServer) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut cursor = 0;
    loop {
        let page = server
            .get(&format!("/v1/activity/changes?after={cursor}&limit=10000"))
            .await;
        let changes = page
            .assert_status(200)
            .as_array()
            .cloned()
            .unwrap_or_default();
        let Some(last) = changes.last() else { break };
        cursor = last["changeId"].as_i64().expect("changeId");
        ids.extend(changes.iter().filter_map(|c| c["changeId"].as_i64()));
    }
    ids
}

/// How long the writers of the load test write.
const LOAD: Duration = Duration::from_secs(3);
/// At most this many rounds per writer, so the load also ends by itself on a fast machine.
const MAX_ROUNDS: usize = 2_000;
/// The events of each round's batch.
const BATCH_EVENTS: usize = 8;
/// What the slow client asks for as its socket receive buffer.
const SLOW_RECEIVE_BUFFER: u32 = 4_096;
/// How long the slow client dawdles after each event while the load runs.
const SLOW_PAUSE: Duration = Duration::from_millis(10);
/// What the server's connections get as their kernel send buffer: without a bound the
/// kernel lets it grow to megabytes (`net.ipv4.tcp_wmem`), and the whole load would wait there
/// for the slow client rather than in the server.
const SERVER_SEND_BUFFER: u32 = 32 * 1024;
/// The reconnecting client drops its connection a second into the load, or once it has read
/// this many changes if that comes first (a fast machine could otherwise be done writing before
/// it is back), and stays away this long while the writers go on.
const DISCONNECT_AT: Duration = Duration::from_secs(1);
const DISCONNECT_AFTER: usize = 1_000;
const AWAY_FOR: Duration = Duration::from_millis(300);
/// The most changes a change stream reads from the database at once (the server's page): a
/// stream whose client has been sent fewer than the newest change minus this has not read the
/// rest from the database yet.
const STREAM_PAGE: i64 = 500;
/// The span started after the load: its start is the last change, which every client reads to.
const LAST_SPAN: &str = "after-the-load";

/// One writer of the load test: rounds of a root span's start, an event, a batch of a child
/// span's start, [`BATCH_EVENTS`] events and end, and the root's end, until the load time is up
/// or [`MAX_ROUNDS`] are done; returns how many changes it had acknowledged (every answer is
/// checked).
async fn write_rounds(server: Arc<TestServer>, writer: usize, started: Instant) -> usize {
    let mut acknowledged = 0;
    for round in 0..MAX_ROUNDS {
        if started.elapsed() >= LOAD {
            break;
        }
        let run = format!("w{writer}-r{round}");
        let root = format!("{run}-root");
        let child = format!("{run}-child");
        server
            .post("/v1/activity/spans", &span_body(&root, &run, None))
            .await
            .assert_status(201);
        server
            .post(
                &format!("/v1/activity/spans/{root}/events"),
                &json!({"eventType": "note", "payload": {"round": round}}),
            )
            .await
            .assert_status(201);
        let mut start = span_body(&child, &run, Some(&root));
        start["op"] = json!("startSpan");
        let mut ops = vec![start];
        for n in 0..BATCH_EVENTS {
            ops.push(
                json!({"op": "appendEvent", "spanId": child, "eventType": "note", "payload": n}),
            );
        }
        ops.push(json!({"op": "endSpan", "spanId": child, "outcome": "success"}));
        let reply = server
            .post("/v1/activity/batch", &json!({ "ops": ops }))
            .await;
        let results = reply.assert_status(200)["results"].clone();
        let results = results.as_array().expect("batch results");
        assert_eq!(results.len(), ops.len(), "{results:?}");
        for result in results {
            assert!(result.get("error").is_none(), "a batch op failed: {result}");
        }
        server
            .post(
                &format!("/v1/activity/spans/{root}/end"),
                &json!({"outcome": "success"}),
            )
            .await
            .assert_status(200);
        // The root's start, event and end, and each op of the batch.
        acknowledged += 3 + ops.len();
    }
    acknowledged
}

/// The next event of a change stream, which must be a `change` whose data carries its id; its
/// id, and whether it is the last change (the start of [`LAST_SPAN`]).
async fn next_change_id(client: &mut SseClient) -> (i64, bool) {
    let event = client.next().await;
    assert_eq!(event.event, "change", "{event:?}");
    let id = event.id.expect("change events carry an id");
    assert_eq!(event.data["changeId"].as_i64(), Some(id), "{event:?}");
    (id, event.data["span"]["spanId"] == LAST_SPAN)
}

/// Read `client` up to and including the last change into `seen` (its count also kept in
/// `progress`, for the test to look at meanwhile); with `dawdle`, pause that long after each
/// event until `hurry` is set.
async fn read_to_the_end(
    client: &mut SseClient,
    seen: &mut Vec<i64>,
    progress: &AtomicUsize,
    dawdle: Option<(Duration, &AtomicBool)>,
) {
    loop {
        let (id, last) = next_change_id(client).await;
        seen.push(id);
        progress.store(seen.len(), Ordering::SeqCst);
        if last {
            return;
        }
        if let Some((pause, hurry)) = dawdle {
            if !hurry.load(Ordering::SeqCst) {
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// What the reconnecting client did: every id it read over both connections, and how many of
/// them came over the first.
struct Reconnected {
    ids: Vec<i64>,
    first_connection: usize,
}

/// Streams under load (issue 4): four writers write concurrently for three seconds while three
/// clients of `/v1/activity/changes/stream` read, all connected before the first write: a
/// normal one; a slow one, whose socket has a small receive buffer (and the server's
/// connections a small send buffer), that pauses after each event while the load runs, so the
/// server's feed for it falls behind: checked through the stream events counter, after the
/// load it has not yet been sent enough to have read the rest from the database, so it is
/// caught up from there; and one that drops its connection mid-run and reconnects with
/// `Last-Event-ID` while changes go on being committed. At the end each client must hold
/// exactly the committed change ids, in order, no gap and no repeat: the log as
/// `GET /v1/activity/changes` reads it, which must itself be one change per acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_every_client_gets_exactly_the_committed_changes_in_order() {
    let server = Arc::new(
        TestServer::start_with(crate::support::Options {
            send_buffer: Some(SERVER_SEND_BUFFER),
            ..crate::support::Options::default()
        })
        .await,
    );
    let path = "/v1/activity/changes/stream?after=0";
    let mut normal = SseClient::connect(&server, path, None).await;
    let mut slow = SseClient::connect_with_small_buffer(&server, path, SLOW_RECEIVE_BUFFER).await;
    let mut reconnecting = SseClient::connect(&server, path, None).await;
    let progress: [Arc<AtomicUsize>; 3] = Default::default();
    let load_over = Arc::new(AtomicBool::new(false));
    let hurry = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let normal_task = tokio::spawn({
        let progress = progress[0].clone();
        async move {
            let mut seen = Vec::new();
            read_to_the_end(&mut normal, &mut seen, &progress, None).await;
            seen
        }
    });
    let slow_task = tokio::spawn({
        let (progress, hurry) = (progress[1].clone(), hurry.clone());
        async move {
            let mut seen = Vec::new();
            let dawdle = Some((SLOW_PAUSE, &*hurry));
            read_to_the_end(&mut slow, &mut seen, &progress, dawdle).await;
            seen
        }
    });
    let reconnecting_task = tokio::spawn({
        let (server, progress, load_over) =
            (server.clone(), progress[2].clone(), load_over.clone());
        async move {
            let mut ids = Vec::new();
            while started.elapsed() < DISCONNECT_AT && ids.len() < DISCONNECT_AFTER {
                let (id, last) = next_change_id(&mut reconnecting).await;
                assert!(!last, "the load ended before the client could reconnect");
                ids.push(id);
                progress.store(ids.len(), Ordering::SeqCst);
            }
            drop(reconnecting);
            let first_connection = ids.len();
            let resume_from = *ids.last().expect("changes came in the first second");
            tokio::time::sleep(AWAY_FOR).await;
            let cursor = server.get("/v1/activity/cursor").await;
            let newest = cursor.assert_status(200)["changeCursor"].as_i64();
            assert!(
                newest.is_some_and(|newest| newest > resume_from),
                "changes were committed while the client was away: {newest:?} after {resume_from}"
            );
            let path = "/v1/activity/changes/stream";
            let mut reconnected = SseClient::connect(&server, path, Some(resume_from)).await;
            assert!(
                !load_over.load(Ordering::SeqCst),
                "the client reconnected while the writers were still writing"
            );
            read_to_the_end(&mut reconnected, &mut ids, &progress, None).await;
            Reconnected {
                ids,
                first_connection,
            }
        }
    });

    let writers: Vec<_> = (0..4)
        .map(|writer| tokio::spawn(write_rounds(server.clone(), writer, started)))
        .collect();
    let mut acknowledged = 0;
    for writer in writers {
        acknowledged += writer.await.expect("writer task");
    }
    load_over.store(true, Ordering::SeqCst);
    let load_time = started.elapsed();
    let read_during_load: Vec<usize> = progress
        .iter()
        .map(|seen| seen.load(Ordering::SeqCst))
        .collect();
    for (name, read) in ["normal", "slow", "reconnecting"]
        .iter()
        .zip(&read_during_load)
    {
        assert!(
            *read > 0,
            "the {name} client read nothing while the writers wrote"
        );
    }
    server
        .post("/v1/activity/spans", &span_body(LAST_SPAN, LAST_SPAN, None))
        .await
        .assert_status(201);
    acknowledged += 1;

    let normal_ids = normal_task.await.expect("normal client task");
    let reconnected = reconnecting_task.await.expect("reconnecting client task");
    let last = *normal_ids.last().expect("changes");
    // Every change stream event the server has sent so far went to these clients. The normal
    // one and the second connection were sent exactly what they read (there is nothing after
    // the last change), the first connection at least what it read: the rest is the most the
    // slow client has been sent.
    let metrics = crate::metrics::scrape(&server).await;
    let sent = metrics
        .get("flightlog_stream_events_total{stream=\"changes\"}")
        .expect("the stream events counter") as usize;
    let slow_sent_at_most = sent
        .checked_sub(normal_ids.len() + reconnected.ids.len())
        .expect("the counter counts at least what the clients read");
    let slow_read = progress[1].load(Ordering::SeqCst);
    hurry.store(true, Ordering::SeqCst);
    let slow_ids = slow_task.await.expect("slow client task");

    let expected = all_change_ids(&server).await;
    eprintln!(
        "{} changes in {load_time:?} of load; read during it (normal, slow, reconnecting): \
         {read_during_load:?}; after it, the slow client had read {slow_read} and been sent at \
         most {slow_sent_at_most}; the reconnecting one read {} before it dropped its \
         connection; {:?} in all",
        expected.len(),
        reconnected.first_connection,
        started.elapsed()
    );
    assert_eq!(
        expected,
        (1..=acknowledged as i64).collect::<Vec<_>>(),
        "the log holds one change per acknowledged write, ids from 1 without a gap"
    );
    assert_eq!(last, acknowledged as i64);
    assert_eq!(normal_ids, expected, "normal client");
    assert_eq!(slow_ids, expected, "slow client");
    assert_eq!(reconnected.ids, expected, "reconnected client");
    assert!(
        (slow_sent_at_most as i64) + STREAM_PAGE < last,
        "the slow client lags: after the load it had been sent up to {slow_sent_at_most} of \
         {last} changes, so its stream had not read the rest from the database yet"
    );
    let Ok(server) = Arc::try_unwrap(server) else {
        panic!("the test's tasks are done with the server");
    };
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stream_starts_with_the_snapshot_and_follows_only_that_run() {
    let server = TestServer::start().await;
    server
        .post("/v1/activity/spans", &span_body("root", "r1", None))
        .await
        .assert_status(201);
    let mut stream = SseClient::connect(&server, "/v1/activity/runs/r1/stream", None).await;
    let snapshot = stream.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["runId"], "r1");
    let high_water = snapshot.data["highWaterSeq"].as_i64().expect("seq");
    assert_eq!(high_water, 1);

    server
        .post("/v1/activity/spans", &span_body("other", "r2", None))
        .await
        .assert_status(201);
    server
        .post(
            "/v1/activity/spans",
            &span_body("child", "r1", Some("root")),
        )
        .await
        .assert_status(201);
    server
        .post(
            "/v1/activity/spans/root/events",
            &json!({"eventType": "note", "payload": "hello"}),
        )
        .await
        .assert_status(201);
    let first = stream.next().await;
    let second = stream.next().await;
    for (event, seq) in [(&first, 2), (&second, 3)] {
        assert_eq!(event.event, "change");
        assert_eq!(event.data["runId"], "r1");
        assert_eq!(event.data["seq"], seq);
    }
    assert_eq!(first.data["span"]["spanId"], "child");
    assert_eq!(second.data["event"]["payload"], "hello");
    assert_eq!(
        server
            .get("/v1/activity/runs/missing/stream")
            .await
            .status
            .as_u16(),
        404
    );
    // A query (the change stream's `after`, say) is refused, not ignored for a full snapshot.
    for query in ["after=3", "bogus=1"] {
        let refused = server
            .get(&format!("/v1/activity/runs/r1/stream?{query}"))
            .await;
        refused.assert_error(400, "invalid_request");
        let message = refused.body["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(message.contains("Last-Event-ID"), "{message}");
        let name = query.split('=').next().unwrap_or_default();
        assert!(message.contains(&format!("`{name}`")), "{message}");
    }
    // A blank one counts as not given, as on every route (it was refused here alone).
    let mut blank = SseClient::connect(&server, "/v1/activity/runs/r1/stream?after=&x", None).await;
    assert_eq!(blank.next().await.event, "snapshot");
    drop((stream, blank));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engagement_stream_follows_its_seqs() {
    let server = TestServer::start().await;
    for at in 0..3 {
        server
            .post(
                "/v1/engagements/e1/events",
                &json!({"type": "note", "at": at, "data": {"n": at}}),
            )
            .await
            .assert_status(201);
    }
    let mut stream = SseClient::connect(&server, "/v1/engagements/e1/stream?fromSeq=1", None).await;
    for seq in 1..3 {
        let event = stream.next().await;
        assert_eq!(event.event, "journal");
        let id = event.raw_id.expect("an id");
        assert!(id.starts_with(&format!("{seq}@")), "{id}");
        assert_eq!(event.data["seq"], seq);
    }
    server
        .post(
            "/v1/engagements/e1/events",
            &json!({"type": "note", "at": 9, "data": {"n": 9}}),
        )
        .await
        .assert_status(201);
    let live = stream.next().await;
    assert_eq!(live.data["seq"], 3);
    assert_eq!(live.data["data"]["n"], 9);
    drop(stream);
    server.stop().await;
}

/// An engagement larger than a stream's page (500 events, about 1 MiB of data) streams whole:
/// every event once, in seq order, page after page, then live ones. (The stream used to read
/// the whole engagement at once and hold it for its client: an audit's 16 slow clients of one
/// 18 MB engagement took the server to 2.6 GB.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engagement_larger_than_a_page_streams_whole_in_order() {
    let server = TestServer::start().await;
    let filler = "y".repeat(2_000);
    let count = 1_300;
    for at in 0..count {
        server
            .post(
                "/v1/engagements/big/events",
                &json!({"type": "note", "at": at, "data": {"n": at, "filler": filler}}),
            )
            .await
            .assert_status(201);
    }
    let mut stream = SseClient::connect(&server, "/v1/engagements/big/stream", None).await;
    expect_journal_seqs(&mut stream, 0, count).await;
    server
        .post(
            "/v1/engagements/big/events",
            &json!({"type": "note", "at": count, "data": {"n": "live"}}),
        )
        .await
        .assert_status(201);
    let live = stream.next().await;
    assert_eq!(
        (live.data["seq"].as_i64(), live.data["data"]["n"].as_str()),
        (Some(count), Some("live"))
    );
    // Resumed mid-engagement, past the first page's end.
    let mut resumed =
        SseClient::connect(&server, "/v1/engagements/big/stream?fromSeq=499", None).await;
    expect_journal_seqs(&mut resumed, 499, count - 499 + 1).await;
    drop((stream, resumed));
    server.stop().await;
}

/// Append `count` events to engagement `id`, the first `engagement_opened`, the last
/// `engagement_closed` (completed), the others `budget_charged`, at times from `at`.
async fn append_engagement(server: &TestServer, id: &str, count: i64, at: i64) {
    for n in 0..count {
        let kind = match n {
            0 => "engagement_opened",
            n if n == count - 1 => "engagement_closed",
            _ => "budget_charged",
        };
        let data = if kind == "engagement_closed" {
            json!({"status": "completed"})
        } else {
            json!({"tokens": n})
        };
        server
            .post(
                &format!("/v1/engagements/{id}/events"),
                &json!({"type": kind, "at": at + n, "data": data}),
            )
            .await
            .assert_status(201);
    }
}

/// The next `count` events of `stream`, which must all be journal events of seqs `from..`;
/// returns the last one's id.
async fn expect_journal_seqs(stream: &mut SseClient, from: i64, count: i64) -> String {
    let mut last = String::new();
    for seq in from..from + count {
        let event = stream.next().await;
        assert_eq!(event.event, "journal", "{event:?}");
        assert_eq!(event.data["seq"], seq, "{event:?}");
        last = event.raw_id.expect("a journal event has an id");
        assert!(last.starts_with(&format!("{seq}@")), "{last}");
    }
    last
}

/// Regression: compaction renumbers an engagement from 0, and the stream waited for seqs above
/// the last one it had sent, so later events never came and nothing said why. Now: `resync`,
/// then the compacted log from seq 0 and what follows, on the same stream; a reconnect naming
/// the old numbering gets the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_sends_resync_and_the_stream_goes_on_from_seq_0() {
    let server = TestServer::start().await;
    append_engagement(&server, "cmp", 21, 1).await;
    let mut stream = SseClient::connect(&server, "/v1/engagements/cmp/stream", None).await;
    let before = expect_journal_seqs(&mut stream, 0, 21).await;
    let reply = server.post("/v1/engagements/cmp/compact", &json!({})).await;
    assert_eq!(reply.status.as_u16(), 204, "{:?}", reply.body);
    let compacted = server.get("/v1/engagements/cmp/events").await.body;
    let kept = compacted.as_array().expect("events").len() as i64;
    assert!(kept < 21, "compacted to {kept}");

    let resync = stream.next().await;
    assert_eq!(resync.event, "resync", "{resync:?}");
    assert_eq!(resync.data["fromSeq"], 0);
    let metrics = crate::metrics::scrape(&server).await;
    assert_eq!(
        metrics.get("flightlog_stream_resyncs_total{stream=\"journal\"}"),
        Some(1.0),
        "the journal resync is counted"
    );
    let new_generation = resync.raw_id.clone().expect("a resync carries an id");
    assert!(new_generation.starts_with("-1@"), "{new_generation}");
    assert_ne!(
        before.split('@').nth(1),
        new_generation.split('@').nth(1),
        "a new generation"
    );
    expect_journal_seqs(&mut stream, 0, kept).await;
    server
        .post(
            "/v1/engagements/cmp/events",
            &json!({"type": "note", "at": 40, "data": {"x": 1}}),
        )
        .await
        .assert_status(201);
    let live = stream.next().await;
    assert_eq!(live.data["seq"], kept, "{live:?}");
    assert_eq!(live.data["data"]["x"], 1);
    drop(stream);

    // A client that saw the old numbering reconnects: resync first, then everything.
    let mut again =
        SseClient::connect_after(&server, "/v1/engagements/cmp/stream", Some(before)).await;
    assert_eq!(again.next().await.event, "resync");
    expect_journal_seqs(&mut again, 0, kept + 1).await;
    drop(again);
    // One that saw the new numbering resumes after its last event, with no resync.
    let mut resumed = SseClient::connect_after(
        &server,
        "/v1/engagements/cmp/stream",
        Some(new_generation.replacen("-1@", "0@", 1)),
    )
    .await;
    expect_journal_seqs(&mut resumed, 1, kept).await;
    drop(resumed);
    server.stop().await;
}

/// A resume by `fromSeq` names its numbering with `generation` (the part after `@` of the ids
/// the client holds): after a compaction, `fromSeq` alone resumes in the new numbering without a
/// word (an audit's finding: events skipped or repeated unseen), while with the old generation
/// the stream sends `resync` and the engagement from seq 0, and with the current one it resumes
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_by_from_seq_checks_the_generation_it_names() {
    let server = TestServer::start().await;
    append_engagement(&server, "gen", 21, 1).await;
    let mut stream = SseClient::connect(&server, "/v1/engagements/gen/stream", None).await;
    let before = expect_journal_seqs(&mut stream, 0, 21).await;
    drop(stream);
    let old_generation = before.split('@').nth(1).expect("seq@generation").to_owned();
    let reply = server.post("/v1/engagements/gen/compact", &json!({})).await;
    assert_eq!(reply.status.as_u16(), 204, "{:?}", reply.body);
    let kept = server.get("/v1/engagements/gen/events").await.body;
    let kept = kept.as_array().expect("events").len() as i64;
    assert!(kept < 21, "compacted to {kept}");

    let mut renumbered = SseClient::connect(
        &server,
        &format!("/v1/engagements/gen/stream?fromSeq={kept}&generation={old_generation}"),
        None,
    )
    .await;
    let resync = renumbered.next().await;
    assert_eq!(resync.event, "resync", "{resync:?}");
    let new_generation = resync
        .raw_id
        .clone()
        .expect("a resync carries an id")
        .replacen("-1@", "", 1);
    assert_ne!(new_generation, old_generation);
    expect_journal_seqs(&mut renumbered, 0, kept).await;
    drop(renumbered);

    let mut current = SseClient::connect(
        &server,
        &format!("/v1/engagements/gen/stream?fromSeq=1&generation={new_generation}"),
        None,
    )
    .await;
    expect_journal_seqs(&mut current, 1, kept - 1).await;
    drop(current);

    for bad in ["9007199254740992", "-1", "x"] {
        server
            .get(&format!(
                "/v1/engagements/gen/stream?fromSeq=0&generation={bad}"
            ))
            .await
            .assert_error(400, "invalid_request");
    }
    server.stop().await;
}

/// Regression: after a prune deleted an engagement and an append re-created it, the stream
/// waited for seqs above the old ones. Now: `resync` when the engagement is gone, then the new
/// engagement from seq 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prune_sends_resync_and_a_recreated_engagement_streams_from_seq_0() {
    let server = TestServer::start().await;
    append_engagement(&server, "old", 3, 1).await;
    let mut stream = SseClient::connect(&server, "/v1/engagements/old/stream", None).await;
    expect_journal_seqs(&mut stream, 0, 3).await;
    let pruned = server
        .post(
            "/v1/engagements/prune",
            &json!({"now": RetentionConfig::default().max_age_ms + 1_000}),
        )
        .await;
    pruned.assert_status(200);
    assert_eq!(pruned.body["removed"], 1);
    let resync = stream.next().await;
    assert_eq!(resync.event, "resync", "{resync:?}");
    server
        .post(
            "/v1/engagements/old/events",
            &json!({"type": "note", "at": 5_000_000_000_000_i64, "data": {"again": true}}),
        )
        .await
        .assert_status(201);
    let event = stream.next().await;
    assert_eq!(event.event, "journal");
    assert_eq!(event.data["seq"], 0, "{event:?}");
    assert_eq!(event.data["data"]["again"], true);
    drop(stream);
    server.stop().await;
}

/// Child mode of [`another_process_s_journal_appends_reach_an_engagement_stream`]: appends two
/// events to engagement `foreign` of the file in `FLIGHTLOG_STREAM_CHILD_JOURNAL_DB` and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_child_journal_writer() {
    let Some(path) = std::env::var_os("FLIGHTLOG_STREAM_CHILD_JOURNAL_DB") else {
        return;
    };
    let db = SqliteDatabase::open(SqliteConfig::new(path)).expect("child opens the file");
    let journal = SqliteEngagementJournal::new(db, RetentionConfig::default());
    for n in 0..2 {
        let input = AppendInput::from_json(json!({
            "engagementId": "foreign", "type": "note", "at": n, "data": {"from": "child", "n": n}
        }))
        .expect("a valid append");
        journal.append(input).await.expect("child appends");
    }
}

/// The next event of `stream` (within 10 s) is a `resync` saying its run was pruned.
async fn expect_resync_for_a_pruned_run(stream: &mut SseClient) {
    let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the stream says something within 10 s");
    assert_eq!(event.event, "resync", "{event:?}");
    assert!(
        event.data["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("pruned")),
        "{event:?}"
    );
    // Its detail gone, a new stream of it is a 404: the action says to read its rollup, not
    // to reconnect (an audit's finding).
    let reason = event.data["reason"].as_str().unwrap_or_default();
    let action = event.data["action"].as_str().unwrap_or_default();
    if reason.starts_with("the run's detail was pruned") {
        assert!(
            action.contains("/rollup") && !action.contains("reconnect"),
            "{event:?}"
        );
    }
}

/// Run this test binary again as another process, in the child mode `test` (one of the
/// `stream_child_*` tests), with `variable` naming `server`'s database file; it must succeed.
fn run_child_mode(test: &str, variable: &str, server: &TestServer) {
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(variable, &server.db_path)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("child process runs");
    assert!(status.success(), "child {test} failed: {status}");
}

/// Regression: an engagement stream learned of another process's appends only from its 5 s
/// safety-net re-read. The database's housekeeper now rings the journal's doorbell when the
/// file changes (every 100 ms it looks), so they arrive well before that re-read would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_s_journal_appends_reach_an_engagement_stream() {
    let server = TestServer::start().await;
    let mut stream = SseClient::connect(&server, "/v1/engagements/foreign/stream", None).await;
    // Let the stream reach its wait, so only a doorbell (or the 5 s re-read) can wake it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    run_child_mode(
        "streams::stream_child_journal_writer",
        "FLIGHTLOG_STREAM_CHILD_JOURNAL_DB",
        &server,
    );
    let written = Instant::now();
    for n in 0..2 {
        let event = stream.next().await;
        assert_eq!(event.data["data"]["n"], n, "{event:?}");
        assert_eq!(event.data["data"]["from"], "child");
    }
    // Not a speed check: 4 s is far above the doorbell's period and below the 5 s re-read, so
    // it only tells which of the two woke the stream.
    assert!(
        written.elapsed() < Duration::from_secs(4),
        "the stream woke only after {:?}",
        written.elapsed()
    );
    drop(stream);
    server.stop().await;
}

/// In a child mode: the activity store of the database file `variable` names, as writer
/// `child-process`; `None` when the variable is unset (the test run normally).
fn child_activity_store(variable: &str) -> Option<SqliteActivityStore> {
    let path = std::env::var_os(variable)?;
    let db = SqliteDatabase::open(SqliteConfig::new(path)).expect("child opens the file");
    Some(SqliteActivityStore::with_identity(
        db,
        Arc::new(SystemClock),
        "child-process",
    ))
}

/// Child mode of [`a_second_process_writing_the_file_shows_up_in_a_stream`]: this test binary
/// re-executed with `FLIGHTLOG_STREAM_CHILD_DB` set writes three spans into that file and exits.
/// Run normally (the variable unset), it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_child_writer() {
    let Some(store) = child_activity_store("FLIGHTLOG_STREAM_CHILD_DB") else {
        return;
    };
    for i in 0..3 {
        store
            .start_span(StartSpanInput {
                span_id: format!("foreign-{i}"),
                run_id: "foreign-run".into(),
                parent_span_id: None,
                name: "from another process".into(),
                kind: SpanKind::Cron,
                origin: SpanOrigin::Cron,
                session_id: None,
                job_name: Some("nightly".into()),
                attrs: None,
                started_at: None,
            })
            .await
            .expect("child write");
    }
}

/// Child mode of [`another_process_s_prune_ends_a_run_stream_at_once`]: this test binary
/// re-executed with `FLIGHTLOG_STREAM_CHILD_PRUNE_DB` set prunes every ended run of that file
/// and exits. Run normally (the variable unset), it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_child_pruner() {
    let Some(store) = child_activity_store("FLIGHTLOG_STREAM_CHILD_PRUNE_DB") else {
        return;
    };
    let pruned = store
        .prune(PruneOptions {
            digest_floor_at: 4_000_000_000_000,
            hard_ceiling_ms: 1,
            now: None,
            batch: None,
            max_spans: None,
            scheduled: false,
        })
        .await
        .expect("child prunes");
    assert_eq!(pruned.runs_pruned, 1, "{pruned:?}");
}

/// Regression: a run stream learned that another process pruned its run only from its 5 s
/// safety-net re-read (2 – 4 s late in an audit): that process's commit was seen, but a prune
/// logs no change, so the doorbell was not rung. Prunes are now counted in the file, and the
/// commit watcher rings for them as the server's own prunes do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_s_prune_ends_a_run_stream_at_once() {
    let server = TestServer::start().await;
    finished_run(&server, "gone-root", "gone").await;
    let mut stream = SseClient::connect(&server, "/v1/activity/runs/gone/stream", None).await;
    let snapshot = stream.next().await;
    assert_eq!(snapshot.event, "snapshot");
    // Let the stream reach its wait, so only a doorbell (or the 5 s re-read) can wake it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    run_child_mode(
        "streams::stream_child_pruner",
        "FLIGHTLOG_STREAM_CHILD_PRUNE_DB",
        &server,
    );
    let pruned = Instant::now();
    expect_resync_for_a_pruned_run(&mut stream).await;
    // Not a speed check: 4 s is far above the watcher's period and below the 5 s re-read, so
    // it only tells which of the two woke the stream.
    assert!(
        pruned.elapsed() < Duration::from_secs(4),
        "the stream woke only after {:?}",
        pruned.elapsed()
    );
    drop(stream);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_writing_the_file_shows_up_in_a_stream() {
    let server = TestServer::start().await;
    let mut stream = SseClient::connect(&server, "/v1/activity/changes/stream", None).await;
    run_child_mode(
        "streams::stream_child_writer",
        "FLIGHTLOG_STREAM_CHILD_DB",
        &server,
    );
    for i in 0..3 {
        let event = stream.next().await;
        assert_eq!(event.data["span"]["spanId"], format!("foreign-{i}"));
        assert_eq!(event.data["span"]["writer"], "child-process");
    }
    drop(stream);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_behind_the_trimmed_change_log_is_told_to_resync() {
    let server = TestServer::start_with(crate::support::Options {
        change_log_retention: Some(5),
        ..Default::default()
    })
    .await;
    for run in 0..10 {
        let span = format!("s{run}");
        server
            .post(
                "/v1/activity/spans",
                &span_body(&span, &format!("r{run}"), None),
            )
            .await
            .assert_status(201);
        server
            .post(
                &format!("/v1/activity/spans/{span}/end"),
                &json!({"outcome": "success"}),
            )
            .await
            .assert_status(200);
    }
    // Nothing is old enough to prune, but the change log is trimmed to its newest 5 ids.
    server
        .post(
            "/v1/activity/maintenance/prune",
            &json!({"digestFloorAt": 0, "hardCeilingMs": 1_000_000_000_000_i64}),
        )
        .await
        .assert_status(200);
    let mut behind = SseClient::connect(&server, "/v1/activity/changes/stream?after=0", None).await;
    let event = behind.next().await;
    assert_eq!(event.event, "resync");
    assert_eq!(event.data["changeLogHorizon"], 15);

    // A client polling the log instead is told by a header (the body stays the contract's
    // array): behind the horizon, resync; at it, the page misses nothing.
    for (path, resync) in [
        ("/v1/activity/changes?after=0", true),
        ("/v1/activity/changes?after=13", true),
        ("/v1/activity/changes?after=14", false),
        ("/v1/activity/changes/terminal-roots?after=0", true),
        ("/v1/activity/changes/terminal-roots?after=20", false),
    ] {
        let reply = server.get(path).await;
        reply.assert_status(200);
        assert_eq!(
            reply.headers["flightlog-change-log-horizon"], "15",
            "{path}"
        );
        assert_eq!(
            reply.headers.get("flightlog-resync").is_some(),
            resync,
            "{path}"
        );
    }

    let mut current =
        SseClient::connect(&server, "/v1/activity/changes/stream?after=14", None).await;
    let next = current.next().await;
    assert_eq!(next.event, "change");
    assert_eq!(next.id, Some(15));
    // The resync is counted as the way one changes stream ended, and both streams' events as sent.
    let metrics = crate::metrics::scrape(&server).await;
    let ends = |reason: &str| {
        metrics.get(&format!(
            "flightlog_stream_ends_total{{stream=\"changes\",reason=\"{reason}\"}}"
        ))
    };
    assert_eq!(ends("resync"), Some(1.0));
    assert_eq!(ends("error"), Some(0.0));
    assert_eq!(
        metrics.get("flightlog_stream_resyncs_total{stream=\"changes\"}"),
        Some(1.0)
    );
    // A journal stream's resync does not end it: no such end is exported.
    assert_eq!(
        metrics.get("flightlog_stream_ends_total{stream=\"journal\",reason=\"resync\"}"),
        None
    );
    assert!(metrics
        .get("flightlog_stream_events_total{stream=\"changes\"}")
        .is_some_and(|sent| sent >= 2.0));
    drop((behind, current));
    server.stop().await;
}

/// Start and end a one-span run over HTTP, and roll it up (which makes it prunable).
async fn finished_run(server: &TestServer, span: &str, run: &str) {
    server
        .post("/v1/activity/spans", &span_body(span, run, None))
        .await
        .assert_status(201);
    server
        .post(
            &format!("/v1/activity/spans/{span}/end"),
            &json!({"outcome": "success"}),
        )
        .await
        .assert_status(200);
    server
        .post(&format!("/v1/activity/runs/{run}/rollup"), &json!({}))
        .await
        .assert_status(204);
}

/// Prune every ended run (the digest floor far in the future).
async fn prune_every_ended_run(server: &TestServer) -> Value {
    server
        .post(
            "/v1/activity/maintenance/prune",
            &json!({"digestFloorAt": 4_000_000_000_000_i64, "hardCeilingMs": 1}),
        )
        .await
        .assert_status(200)
        .clone()
}

/// A prune deletes a pruned run's change rows (as the reference does), and a client whose
/// cursor was before that run's end silently never saw it end: it thought the run still open.
/// Now the prune moves the change-log horizon past the run's newest change, so that client is
/// told to resync, and one that had seen all of it streams on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_behind_a_pruned_runs_changes_is_told_to_resync() {
    let server = TestServer::start().await;
    // Change 1 (the start) and 2 (the end) of run "pruned"; then 3, an open run's start.
    finished_run(&server, "p", "pruned").await;
    server
        .post("/v1/activity/spans", &span_body("o", "open", None))
        .await
        .assert_status(201);
    let result = prune_every_ended_run(&server).await;
    assert_eq!(result["runsPruned"], 1, "{result}");

    // Saw the start, not the end.
    let mut behind = SseClient::connect(&server, "/v1/activity/changes/stream?after=1", None).await;
    let event = behind.next().await;
    assert_eq!(event.event, "resync", "{event:?}");
    assert_eq!(event.data["changeLogHorizon"], 3);
    // Reconnecting with the same id does not get past it either.
    let mut again = SseClient::connect(&server, "/v1/activity/changes/stream", Some(1)).await;
    assert_eq!(again.next().await.event, "resync");
    // Saw the whole pruned run: streams on, with the open run's start.
    let mut current =
        SseClient::connect(&server, "/v1/activity/changes/stream?after=2", None).await;
    let next = current.next().await;
    assert_eq!(next.event, "change", "{next:?}");
    assert_eq!(next.id, Some(3));
    assert_eq!(next.data["span"]["spanId"], "o");
    drop((behind, again, current));
    server.stop().await;
}

/// Run "reused" (two changes), its stream read up to the snapshot (whose id comes back), then the
/// run pruned and a new one started under its id.
async fn stream_a_run_then_prune_and_start_it_again(
    server: &TestServer,
) -> (SseClient, Option<i64>) {
    finished_run(server, "first", "reused").await;
    let mut stream = SseClient::connect(server, "/v1/activity/runs/reused/stream", None).await;
    let snapshot = stream.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["highWaterSeq"], 2);
    let result = prune_every_ended_run(server).await;
    assert_eq!(result["runsPruned"], 1, "{result}");
    server
        .post("/v1/activity/spans", &span_body("second", "reused", None))
        .await
        .assert_status(201);
    (stream, snapshot.id)
}

/// A run stream filtered on `seq` above the snapshot's high water: when the run was pruned and
/// a new run started under its id (seqs start again at 1), the new run's first changes were
/// silently skipped. Now the stream says `resync`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stream_resyncs_when_its_run_is_pruned_and_started_again() {
    let server = TestServer::start().await;
    let (mut stream, _) = stream_a_run_then_prune_and_start_it_again(&server).await;
    let event = stream.next().await;
    assert_eq!(event.event, "resync", "{event:?}");
    // The prune wakes the stream: it may see the run pruned before the new run starts, or the
    // new run's seq 1; either way it ends with a resync, never a silent skip.
    assert!(
        event.data["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("new run") || reason.contains("was pruned")),
        "{event:?}"
    );
    // A new stream of the run starts from the new run's snapshot.
    let mut fresh = SseClient::connect(&server, "/v1/activity/runs/reused/stream", None).await;
    let snapshot = fresh.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["highWaterSeq"], 1);
    assert_eq!(snapshot.data["spans"][0]["spanId"], "second");
    drop((stream, fresh));
    server.stop().await;
}

/// A run whose root never came (an OpenTelemetry trace continued from elsewhere) is pruned by
/// the hard ceiling while open: no change says so, and its run stream, caught up, stayed open
/// with nothing more, its client showing the run live forever (an audit's finding). The stream
/// now ends with a `resync` that says the run was pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stream_is_told_when_its_open_run_is_pruned() {
    let server = TestServer::start().await;
    let trace = "ab".repeat(16);
    let export = json!({"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": trace, "spanId": "00000000000000a1", "parentSpanId": "00000000000000ff",
        "name": "chat", "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000100000000",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]
    }]}]}]});
    server.post("/v1/traces", &export).await.assert_status(200);
    let path = format!("/v1/activity/runs/{trace}/stream");
    let mut stream = SseClient::connect(&server, &path, None).await;
    let snapshot = stream.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["highWaterSeq"], 1);
    let result = server
        .post(
            "/v1/activity/maintenance/prune",
            &json!({"digestFloorAt": 0, "hardCeilingMs": 0}),
        )
        .await
        .assert_status(200)
        .clone();
    assert_eq!(result["runsPruned"], 1, "{result}");
    expect_resync_for_a_pruned_run(&mut stream).await;
    server
        .get(&format!("/v1/activity/runs/{trace}/snapshot"))
        .await
        .assert_error(404, "not_found");
    drop(stream);
    server.stop().await;
}

/// A client away while its run was pruned comes back with `Last-Event-ID`: the stream ends
/// with a `resync` saying the run was pruned. It waited in silence (only keep-alives) until a
/// new run took the id (an audit's finding); a fresh connect gets 404 as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stream_resumed_after_its_run_was_pruned_is_told_so() {
    let server = TestServer::start().await;
    finished_run(&server, "g", "gone").await;
    let mut stream = SseClient::connect(&server, "/v1/activity/runs/gone/stream", None).await;
    let snapshot = stream.next().await;
    assert_eq!(snapshot.event, "snapshot", "{snapshot:?}");
    drop(stream);
    let result = prune_every_ended_run(&server).await;
    assert_eq!(result["runsPruned"], 1, "{result}");
    // Another run goes on, so the client's id is not behind the change log's horizon.
    server
        .post("/v1/activity/spans", &span_body("o", "open", None))
        .await
        .assert_status(201);
    let mut resumed =
        SseClient::connect(&server, "/v1/activity/runs/gone/stream", snapshot.id).await;
    expect_resync_for_a_pruned_run(&mut resumed).await;
    server
        .get("/v1/activity/runs/gone/stream")
        .await
        .assert_error(404, "not_found");
    drop(resumed);
    server.stop().await;
}

/// A run whose change rows the trim deleted (its spans kept) goes on from its seq: its late
/// event reaches its run stream as the next seq, and the change stream carries it with a seq
/// above the run's snapshot's, so a client applying "drop what the snapshot holds" keeps it.
/// (It was seq 1 again: the run stream ended with a `resync`, and a change-stream client
/// dropped the change as already seen; an audit's finding.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_runs_late_change_goes_on_from_its_seq() {
    let server = TestServer::start_with(crate::support::Options {
        change_log_retention: Some(2),
        ..Default::default()
    })
    .await;
    finished_run(&server, "old-root", "old").await;
    for run in 0..4 {
        finished_run(&server, &format!("s{run}"), &format!("r{run}")).await;
    }
    let result = server
        .post(
            "/v1/activity/maintenance/prune",
            &json!({"digestFloorAt": 0, "hardCeilingMs": 1_000_000_000_000_i64}),
        )
        .await
        .assert_status(200)
        .clone();
    assert_eq!(result["runsPruned"], 0, "{result}");
    let seq = server
        .get("/v1/activity/runs/old/seq")
        .await
        .assert_status(200)
        .clone();
    assert_eq!(
        seq["highWaterSeq"], 2,
        "the trim keeps the run's place in its numbering"
    );

    let mut run_stream = SseClient::connect(&server, "/v1/activity/runs/old/stream", None).await;
    let snapshot = run_stream.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["highWaterSeq"], 2);
    let cursor = snapshot.data["changeCursor"].as_i64().unwrap_or_default();
    let mut changes = SseClient::connect(
        &server,
        &format!("/v1/activity/changes/stream?after={cursor}"),
        None,
    )
    .await;
    server
        .post(
            "/v1/activity/spans/old-root/events",
            &json!({"eventType": "late", "payload": {"n": 1}}),
        )
        .await
        .assert_status(201);
    for stream in [&mut run_stream, &mut changes] {
        let event = stream.next().await;
        assert_eq!(event.event, "change", "{event:?}");
        assert_eq!(event.data["runId"], "old");
        assert_eq!(event.data["seq"], 3, "{event:?}");
    }
    drop((run_stream, changes));
    server.stop().await;
}

/// A run stream opened ahead of its run (with `Last-Event-ID` at the newest change, as a client
/// that launches the run and then watches it may do): the run's first span ends the stream
/// with a `resync` that says the run began after the id. It named a prune first, which had not
/// happened (an audit's finding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stream_opened_before_its_run_says_the_run_began_after_its_id() {
    let server = TestServer::start().await;
    server
        .post(
            "/v1/activity/spans",
            &span_body("earlier", "other-run", None),
        )
        .await
        .assert_status(201);
    let cursor = server.get("/v1/activity/cursor").await;
    let id = cursor.assert_status(200)["changeCursor"].as_i64();
    let mut stream = SseClient::connect(&server, "/v1/activity/runs/later-run/stream", id).await;
    server
        .post("/v1/activity/spans", &span_body("first", "later-run", None))
        .await
        .assert_status(201);
    let event = stream.next().await;
    assert_eq!(event.event, "resync", "{event:?}");
    let reason = event.data["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("began") && !reason.contains("pruned and"),
        "{reason}"
    );
    drop(stream);
    server.stop().await;
}

/// The same, for a client that reconnects with `Last-Event-ID` after its run was pruned and
/// started again: a resumed stream does not know the seq its client holds, and it sent the new
/// run's changes from seq 1 with no resync, which a client holding the old `highWaterSeq`
/// discarded, still showing the deleted spans. A seq 1 after the client's id can only be a new
/// start (the client's snapshot held the run, so its seq 1 was at or below that id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_stream_resyncs_when_its_run_was_pruned_and_started_again() {
    let server = TestServer::start().await;
    let (stream, last_seen) = stream_a_run_then_prune_and_start_it_again(&server).await;
    drop(stream);
    let mut resumed =
        SseClient::connect(&server, "/v1/activity/runs/reused/stream", last_seen).await;
    let event = resumed.next().await;
    assert_eq!(event.event, "resync", "{event:?}");
    // A run stream has no `after`: its resync says to start over (it said `after` once).
    let action = event.data["action"].as_str().unwrap_or_default();
    assert!(
        action.contains("without Last-Event-ID") && !action.contains("after ="),
        "{action}"
    );

    // A run that goes on is resumed as before: the changes after the id, from seq 2 up.
    server
        .post(
            "/v1/activity/spans",
            &span_body("child", "reused", Some("second")),
        )
        .await
        .assert_status(201);
    let mut fresh = SseClient::connect(&server, "/v1/activity/runs/reused/stream", None).await;
    let snapshot = fresh.next().await;
    assert_eq!(snapshot.data["highWaterSeq"], 2);
    drop(fresh);
    server
        .post(
            "/v1/activity/spans/child/end",
            &json!({"outcome": "success"}),
        )
        .await
        .assert_status(200);
    let mut resumed =
        SseClient::connect(&server, "/v1/activity/runs/reused/stream", snapshot.id).await;
    let event = resumed.next().await;
    assert_eq!(event.event, "change", "{event:?}");
    assert_eq!(event.data["seq"], 3, "{event:?}");
    drop((resumed,));
    server.stop().await;
}

/// A negative `after` or `fromSeq` was refused only when no `Last-Event-ID` came with it
/// (the header wins), while a bad header was refused whatever the query: both are checked now.
#[tokio::test]
async fn a_bad_starting_point_is_refused_whichever_would_win() {
    let server = TestServer::start().await;
    for (path, header) in [
        ("/v1/activity/changes/stream?after=-1", "5"),
        ("/v1/activity/changes/stream?after=5", "-1"),
        ("/v1/engagements/e/stream?fromSeq=-1", "0@1"),
        ("/v1/engagements/e/stream?fromSeq=0", "-2@1"),
    ] {
        let response = server
            .client
            .get(format!("{}{path}", server.base))
            .header("Last-Event-ID", header)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), 400, "{path} with {header}");
    }
    server.stop().await;
}

/// `Last-Event-ID` as the streams write their ids: digits (no sign but the resync's `-1@G`),
/// an overflow said to be too large, the header once, and never 0 on a run stream (no event
/// of one has id 0; it was taken for "the run was pruned and started again").
#[tokio::test]
async fn last_event_ids_are_read_as_the_streams_write_them() {
    let server = TestServer::start().await;
    finished_run(&server, "s", "run").await; // changes 1 and 2
    for (path, header, needle) in [
        (
            "/v1/activity/changes/stream",
            "+1",
            "a non-negative integer",
        ),
        (
            "/v1/activity/runs/run/stream",
            "+1",
            "a non-negative integer",
        ),
        ("/v1/engagements/e/stream", "+0", "<seq>@<generation>"),
        ("/v1/engagements/e/stream", "0@+1", "<seq>@<generation>"),
        // No seq reaches 2^53: the largest i64 was read as "after seq 2^63 - 2".
        (
            "/v1/engagements/e/stream",
            "9223372036854775807",
            "<seq>@<generation>",
        ),
        (
            "/v1/engagements/e/stream",
            "9007199254740992",
            "<seq>@<generation>",
        ),
        // Nor a generation, as in the `generation` query parameter (an audit: the header took
        // it, and answered with a `resync`).
        (
            "/v1/engagements/e/stream",
            "1@9007199254740992",
            "each from 0 to 2^53 - 1",
        ),
        (
            "/v1/activity/changes/stream",
            "99999999999999999999",
            "larger than any change id",
        ),
        ("/v1/activity/runs/run/stream", "0", "connect without it"),
    ] {
        let message = refused_start(&server, path, Some(header)).await;
        assert!(message.contains(needle), "{path} {header}: {message}");
    }
    for path in [
        "/v1/activity/changes/stream",
        "/v1/activity/runs/run/stream",
        "/v1/engagements/e/stream",
    ] {
        let response = server
            .client
            .get(format!("{}{path}", server.base))
            .header("Last-Event-ID", "1")
            .header("Last-Event-ID", "2")
            .send()
            .await
            .expect("request");
        assert_eq!(response.status().as_u16(), 400, "{path}");
        let body: Value = response.json().await.expect("a JSON body");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("more than once"), "{path}: {message}");
    }
    server.stop().await;
}

/// GET a stream from `path` (with `Last-Event-ID: header`), which must be refused as a bad
/// starting point: 400 `invalid_request`; its message.
async fn refused_start(server: &TestServer, path: &str, header: Option<&str>) -> String {
    let mut request = server.client.get(format!("{}{path}", server.base));
    if let Some(header) = header {
        request = request.header("Last-Event-ID", header);
    }
    let response = request.send().await.expect("request");
    assert_eq!(response.status().as_u16(), 400, "{path} with {header:?}");
    let body: Value = response.json().await.expect("a JSON body");
    assert_eq!(body["error"]["code"], "invalid_request");
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A starting point beyond every change id the database has given out (an id of another
/// database, or of this one before a restore) waited in silence and would skip the ids up to it
/// once given out: it is refused now, saying why. An empty `Last-Event-ID` is no header.
#[tokio::test]
async fn a_starting_point_beyond_the_newest_change_is_refused_and_an_empty_id_is_none() {
    let server = TestServer::start().await;
    finished_run(&server, "s", "run").await; // changes 1 and 2
    for (path, header) in [
        ("/v1/activity/changes/stream?after=3", None),
        ("/v1/activity/changes/stream", Some("9223372036854775807")),
        ("/v1/activity/runs/run/stream", Some("3")),
    ] {
        let message = refused_start(&server, path, header).await;
        assert!(
            message.contains("newest change id of this database is 2"),
            "{message}"
        );
    }
    // At the newest change: accepted, and what comes next arrives.
    let mut at_head =
        SseClient::connect_after(&server, "/v1/activity/changes/stream?after=2", None).await;
    let mut empty_id =
        SseClient::connect_after(&server, "/v1/activity/runs/run/stream", Some(String::new()))
            .await;
    assert_eq!(empty_id.next().await.event, "snapshot");
    server
        .post("/v1/activity/spans", &span_body("t", "run", Some("s")))
        .await
        .assert_status(201);
    assert_eq!(at_head.next().await.id, Some(3));
    assert_eq!(empty_id.next().await.id, Some(3));
    drop((at_head, empty_id));
    server.stop().await;
}

/// An engagement stream started past the engagement's end (`fromSeq` beyond its next seq, or a
/// `Last-Event-ID` naming an event it does not hold, in its own generation or none) waited for
/// that seq and skipped every event appended up to it, without a word (an audit's finding): it
/// is refused now. At the end, or resuming after its last event, is fine; an id of another
/// generation gets the `resync`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engagement_stream_started_past_its_end_is_refused() {
    let server = TestServer::start().await;
    append_engagement(&server, "e", 3, 100).await; // seqs 0, 1, 2
    let mut first = SseClient::connect(&server, "/v1/engagements/e/stream", None).await;
    let last = expect_journal_seqs(&mut first, 0, 3).await;
    drop(first);
    let generation = last
        .split_once('@')
        .map(|(_, g)| g.to_owned())
        .expect("seq@generation");
    for (path, header) in [
        ("/v1/engagements/e/stream?fromSeq=4".to_owned(), None),
        ("/v1/engagements/e/stream".to_owned(), Some("3".to_owned())),
        (
            "/v1/engagements/e/stream".to_owned(),
            Some(format!("9@{generation}")),
        ),
        ("/v1/engagements/none/stream?fromSeq=1".to_owned(), None),
    ] {
        let message = refused_start(&server, &path, header.as_deref()).await;
        assert!(message.contains("holds no event with seq"), "{message}");
        // The fix names what the client sent: a header it never sent is not to be dropped.
        assert_eq!(
            message.contains("connect without Last-Event-ID"),
            header.is_some(),
            "{message}"
        );
    }
    // At the end (fromSeq = the next seq) and after the last event: what comes next arrives.
    let mut at_end = SseClient::connect(&server, "/v1/engagements/e/stream?fromSeq=3", None).await;
    let mut resumed =
        SseClient::connect_after(&server, "/v1/engagements/e/stream", Some(last.clone())).await;
    // Another generation's id: a resync, then the engagement from seq 0.
    let other = format!("9@{}", generation.parse::<u64>().expect("a generation") ^ 1);
    let mut renumbered =
        SseClient::connect_after(&server, "/v1/engagements/e/stream", Some(other)).await;
    assert_eq!(renumbered.next().await.event, "resync");
    expect_journal_seqs(&mut renumbered, 0, 3).await;
    server
        .post(
            "/v1/engagements/e/events",
            &json!({"type": "note", "at": 200, "data": {}}),
        )
        .await
        .assert_status(201);
    expect_journal_seqs(&mut at_end, 3, 1).await;
    expect_journal_seqs(&mut resumed, 3, 1).await;
    expect_journal_seqs(&mut renumbered, 3, 1).await;
    drop((at_end, resumed, renumbered));
    server.stop().await;
}

/// Write a run of `spans` spans with `attr_bytes` of attributes each, in batches.
async fn big_run(server: &TestServer, run: &str, spans: usize, attr_bytes: usize) {
    let filler = "x".repeat(attr_bytes);
    for first in (0..spans).step_by(250) {
        let ops: Vec<Value> = (first..(first + 250).min(spans))
            .map(|i| {
                let mut op = span_body(&format!("{run}-{i}"), run, None);
                op["op"] = json!("startSpan");
                op["attrs"] = json!({ "filler": filler });
                op
            })
            .collect();
        server
            .post("/v1/activity/batch", &json!({ "ops": ops }))
            .await
            .assert_status(200);
    }
}

/// A server with an 8 MiB budget of large answers, `write_stall_limit`, and run `big`: about
/// 12 MB of snapshot, more than the kernel buffers on both ends of a loopback connection hold
/// (4 MiB of send buffer, the receiver's unread window), so most of a large answer stays in the
/// server while its client does not read.
async fn server_with_a_big_run(write_stall_limit: Duration) -> TestServer {
    let mut options = crate::support::Options::default();
    options.config.response_budget_bytes = 8 << 20;
    options.config.write_stall_limit = write_stall_limit;
    let server = TestServer::start_with(options).await;
    big_run(&server, "big", 2_000, 6_000).await;
    server
}

/// A GET whose answer is never read (until the connection is dropped), given time to be served.
async fn stalled_get(server: &TestServer, path: &str) -> std::net::TcpStream {
    use std::io::Write as _;
    let addr = server.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stream
}

/// GET `path` until it is answered 200 (the budget came back), for at most 10 s.
async fn until_served(server: &TestServer, path: &str) -> Value {
    let started = Instant::now();
    loop {
        let reply = server.get(path).await;
        if reply.status.as_u16() == 200 {
            return reply.body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the budget did not come back: {:?}",
            reply.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A large snapshot sent to a client that does not read it stayed in the server's memory for
/// as long as that client kept its connection: ten such clients of a 48 MB run held half a
/// gigabyte. Large snapshots now take from a shared budget until they are handed to the socket;
/// while it is taken, the next large snapshot waits briefly and then gets 503 (nobody waits on
/// the slow client for long), and the budget comes back when the slow client goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_snapshots_for_clients_that_do_not_read_are_bounded() {
    let server = server_with_a_big_run(ServerConfig::DEFAULT_WRITE_STALL_LIMIT).await;
    let slow_reader = stalled_get(&server, "/v1/activity/runs/big/snapshot").await;
    let refused = server.get("/v1/activity/runs/big/snapshot").await;
    refused.assert_error(503, "unavailable");
    assert!(refused.headers.contains_key("retry-after"));
    let stream = server
        .client
        .get(format!("{}/v1/activity/runs/big/stream", server.base))
        .send()
        .await
        .expect("stream request");
    assert_eq!(stream.status().as_u16(), 503);
    // Small snapshots are never held up.
    finished_run(&server, "small", "small-run").await;
    server
        .get("/v1/activity/runs/small-run/snapshot")
        .await
        .assert_status(200);

    drop(slow_reader);
    let snapshot = until_served(&server, "/v1/activity/runs/big/snapshot").await;
    assert_eq!(snapshot["spans"].as_array().map(Vec::len), Some(2_000));
    // A stream client that does not read holds the budget the same way.
    let slow_stream = stalled_get(&server, "/v1/activity/runs/big/stream").await;
    server
        .get("/v1/activity/runs/big/snapshot")
        .await
        .assert_error(503, "unavailable");
    drop(slow_stream);
    server.stop().await;
}

/// Every large answer holds the budget as a snapshot does: a page of 10,000 changes of spans
/// with large attrs is as big as their run's snapshot, and a client that did not read it kept it
/// in the server's memory. While one is held, the next large answer of any endpoint waits
/// briefly and gets 503; small answers go on; the budget comes back when the client goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_change_pages_for_clients_that_do_not_read_are_bounded() {
    let server = server_with_a_big_run(ServerConfig::DEFAULT_WRITE_STALL_LIMIT).await;
    let page = "/v1/activity/changes?after=0&limit=10000";
    let slow_reader = stalled_get(&server, page).await;
    for held_up in [
        page,
        "/v1/activity/open-roots",
        "/v1/activity/runs/big/snapshot",
    ] {
        let refused = server.get(held_up).await;
        refused.assert_error(503, "unavailable");
        assert!(refused.headers.contains_key("retry-after"), "{held_up}");
    }
    let metrics = crate::metrics::scrape(&server).await;
    assert_eq!(
        metrics.get("flightlog_http_large_responses_refused_total"),
        Some(3.0)
    );
    let held = metrics.get("flightlog_http_response_budget_held_bytes");
    assert!(held.is_some_and(|held| held > 0.0), "{held:?}");
    // Small answers are never held up.
    server
        .get("/v1/activity/changes?after=0&limit=10")
        .await
        .assert_status(200);
    server
        .get("/v1/activity/runs?limit=5")
        .await
        .assert_status(200);

    drop(slow_reader);
    let changes = until_served(&server, page).await;
    assert_eq!(changes.as_array().map(Vec::len), Some(2_000));
    server.stop().await;
}

/// A batch of 250 starts with 60 KB of attrs each (a 15 MB body, and as large an answer), its
/// span ids prefixed by `prefix`.
fn large_batch(prefix: &str) -> Vec<u8> {
    let filler = "x".repeat(60_000);
    let ops: Vec<Value> = (0..250)
        .map(|i| {
            let mut op = span_body(&format!("{prefix}-{i}"), prefix, None);
            op["op"] = json!("startSpan");
            op["attrs"] = json!({ "filler": filler });
            op
        })
        .collect();
    json!({ "ops": ops }).to_string().into_bytes()
}

/// POST [`large_batch`]`(prefix)`.
async fn post_large_batch(server: &TestServer, prefix: &str) -> crate::support::Reply {
    server
        .send_raw(
            reqwest::Method::POST,
            "/v1/activity/batch",
            Some("application/json"),
            large_batch(prefix),
        )
        .await
}

/// A batch's answer gives back what its ops sent: 8 MB batches whose answers were left unread
/// held 7.3 MiB each outside the budget of large answers (572 MiB of RSS for 60 clients, an
/// audit's finding). A batch whose answer may be large now takes its room before it writes
/// anything: while a client that does not read holds the budget, the next large batch is
/// refused (503) with nothing written, small batches go on, and the budget comes back when the
/// client goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batch_answers_for_clients_that_do_not_read_are_bounded() {
    use std::io::Write as _;
    let mut options = crate::support::Options::default();
    options.config.response_budget_bytes = 8 << 20;
    options.config.body_limit = 32 << 20;
    let server = TestServer::start_with(options).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let body = large_batch("unread");
    let mut slow_reader = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        slow_reader,
        "POST /v1/activity/batch HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("send the head");
    slow_reader.write_all(&body).expect("send the body");
    // Its writes are made (the answer waits for its client).
    let started = Instant::now();
    while server
        .get("/v1/activity/spans/unread-249")
        .await
        .status
        .as_u16()
        != 200
    {
        assert!(started.elapsed() < Duration::from_secs(10), "not written");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = crate::metrics::scrape(&server).await;
    let held = metrics.get("flightlog_http_response_budget_held_bytes");
    assert!(held.is_some_and(|held| held > 0.0), "{held:?}");

    let refused = post_large_batch(&server, "refused").await;
    refused.assert_error(503, "unavailable");
    assert!(refused.headers.contains_key("retry-after"));
    server
        .get("/v1/activity/spans/refused-0")
        .await
        .assert_status(404);
    // Small batches are never held up.
    let small = json!({ "ops": [{"op": "startSpan", "spanId": "small", "runId": "small",
        "name": "step", "kind": "tool", "origin": "session"}] });
    server
        .post("/v1/activity/batch", &small)
        .await
        .assert_status(200);

    drop(slow_reader);
    let started = Instant::now();
    loop {
        let reply = post_large_batch(&server, "later").await;
        if reply.status.as_u16() == 200 {
            assert_eq!(reply.body["results"].as_array().map(Vec::len), Some(250));
            break;
        }
        reply.assert_error(503, "unavailable");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the budget did not come back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
}

/// A client that asks for a large answer, reads nothing and never goes away held the answer's
/// share of the budget for as long as it liked (hyper has no write timeout), and every other
/// large answer was refused meanwhile. Its connection is now closed once nothing could be
/// written to it for the write-stall limit, and the budget comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_off_and_the_budget_comes_back() {
    use std::io::Read as _;
    let server = server_with_a_big_run(Duration::from_secs(1)).await;
    let snapshot = "/v1/activity/runs/big/snapshot";
    let mut stalled = stalled_get(&server, snapshot).await;
    server.get(snapshot).await.assert_error(503, "unavailable");
    // Served while the stalled client still holds its connection open.
    let body = until_served(&server, snapshot).await;
    assert_eq!(body["spans"].as_array().map(Vec::len), Some(2_000));
    // The server closed it: reading what was sent ends (not a wait for more).
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut received = Vec::new();
    let ended = stalled.read_to_end(&mut received);
    assert!(
        ended.is_ok()
            || ended
                .as_ref()
                .is_err_and(|err| err.kind() != std::io::ErrorKind::WouldBlock),
        "{ended:?}"
    );
    assert!(received.len() < 12_000_000, "only part of the answer came");
    // And counted, once (an audit found a stream cut off this way in no count).
    let counted = crate::metrics::scrape(&server).await;
    assert_eq!(
        counted.get("flightlog_http_stalled_connections_closed_total"),
        Some(1.0)
    );
    server.stop().await;
}

/// After a prune deleted the newest changes, the reference's cursor (`GET /v1/activity/cursor`,
/// a snapshot's `changeCursor`) is below the change-log horizon, and every client starting
/// there, a run stream of an unrelated run right after its snapshot included, was told to
/// resync, again and again until something new was written. Up-to-date clients now start at the
/// horizon, and a resync says where to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_cursor_reads_from_the_start_without_a_resync() {
    let server = TestServer::start().await;
    server
        .post("/v1/activity/spans", &span_body("neg-root", "neg", None))
        .await
        .assert_status(201);
    for path in [
        "/v1/activity/changes?after=-2",
        "/v1/activity/changes/terminal-roots?after=-2",
        "/v1/activity/changes?after=0",
    ] {
        let reply = server.get(path).await;
        reply.assert_status(200);
        assert_eq!(
            reply.headers.get("flightlog-resync"),
            None,
            "{path}: nothing was ever trimmed"
        );
    }
    let all = server.get("/v1/activity/changes?after=-2").await;
    assert_eq!(all.body.as_array().map(Vec::len), Some(1), "{}", all.body);
    server.stop().await;
}

#[tokio::test]
async fn up_to_date_clients_are_not_told_to_resync_after_a_prune_of_the_newest_changes() {
    let server = TestServer::start().await;
    // Change 1: an open run's start; 2 and 3: a run that is then pruned.
    server
        .post("/v1/activity/spans", &span_body("open-root", "open", None))
        .await
        .assert_status(201);
    finished_run(&server, "gone", "gone-run").await;
    let result = prune_every_ended_run(&server).await;
    assert_eq!(result["runsPruned"], 1, "{result}");
    let cursor = server.get("/v1/activity/cursor").await;
    assert_eq!(
        cursor.assert_status(200)["changeCursor"],
        1,
        "the reference's cursor"
    );

    let mut newest = SseClient::connect(&server, "/v1/activity/changes/stream", None).await;
    let mut run = SseClient::connect(&server, "/v1/activity/runs/open/stream", None).await;
    let snapshot = run.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["changeCursor"], 1);
    // Its id is where the stream follows from (the cursor was behind the horizon, and a client
    // reconnecting with it right after the snapshot was told to resync, and again, in a loop).
    assert_eq!(snapshot.id, Some(3), "{snapshot:?}");
    let mut reconnected =
        SseClient::connect(&server, "/v1/activity/runs/open/stream", snapshot.id).await;
    // Told where to resume, a client that started from the reference's cursor goes on.
    let mut behind = SseClient::connect(&server, "/v1/activity/changes/stream?after=1", None).await;
    let resync = behind.next().await;
    assert_eq!(resync.event, "resync", "{resync:?}");
    let resume = resync.data["resumeAfter"].as_i64().expect("resumeAfter");
    assert_eq!(resume, 3);
    let action = resync.data["action"].as_str().unwrap_or_default();
    assert!(action.contains("after = the larger"), "{action}");
    let mut resumed = SseClient::connect(
        &server,
        &format!("/v1/activity/changes/stream?after={resume}"),
        None,
    )
    .await;

    server
        .post(
            "/v1/activity/spans",
            &span_body("open-child", "open", Some("open-root")),
        )
        .await
        .assert_status(201);
    for (name, client) in [
        ("newest", &mut newest),
        ("run", &mut run),
        ("resumed", &mut resumed),
        ("run reconnected", &mut reconnected),
    ] {
        let event = client.next().await;
        assert_eq!(event.event, "change", "{name}: {event:?}");
        assert_eq!(event.id, Some(4), "{name}: {event:?}");
        assert_eq!(event.data["span"]["spanId"], "open-child", "{name}");
    }
    drop((newest, run, behind, resumed, reconnected));
    server.stop().await;
}

/// A client that reads a large answer steadily but slowly (here 160 KB/s, four times as long
/// as the stall limit) is never cut off: with the kernel's whole send buffer to fill, a write
/// went through only once a third of it (about a megabyte) had drained, and a client slower
/// than that over the limit was closed as one that reads nothing (an audit's finding: 30 s and
/// 45 KB/s). A client that reads nothing is still cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_but_steady_reader_of_a_large_answer_is_not_cut_off() {
    use std::io::{Read as _, Write as _};
    const LIMIT: Duration = Duration::from_secs(2);
    let server = server_with_a_big_run(LIMIT).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    let read_slowly_then_all = move || {
        let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
        write!(
            stream,
            "GET /v1/activity/runs/big/snapshot HTTP/1.1\r\nHost: {addr}\r\nConnection: \
             close\r\n\r\n"
        )
        .expect("send");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut answer = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        let slowly_until = Instant::now() + 4 * LIMIT;
        while Instant::now() < slowly_until {
            std::thread::sleep(Duration::from_millis(100));
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return (answer, false),
                Ok(count) => answer.extend_from_slice(&chunk[..count]),
            }
        }
        let whole = stream.read_to_end(&mut answer).is_ok();
        (answer, whole)
    };
    let (answer, whole) = tokio::task::spawn_blocking(read_slowly_then_all)
        .await
        .expect("the reader");
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").expect("an answer head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(whole, "the answer was cut after {} bytes", answer.len());
    let snapshot: Value = serde_json::from_str(body).expect("the whole snapshot");
    assert_eq!(snapshot["spans"].as_array().map(Vec::len), Some(2_000));
    let counted = crate::metrics::scrape(&server).await;
    assert_eq!(
        counted.get("flightlog_http_stalled_connections_closed_total"),
        Some(0.0)
    );

    // One that reads nothing is cut off after the limit.
    let silent = stalled_get(&server, "/v1/activity/runs/big/snapshot").await;
    tokio::time::sleep(LIMIT + Duration::from_secs(2)).await;
    let counted = crate::metrics::scrape(&server).await;
    assert_eq!(
        counted.get("flightlog_http_stalled_connections_closed_total"),
        Some(1.0)
    );
    drop(silent);
    server.stop().await;
}
