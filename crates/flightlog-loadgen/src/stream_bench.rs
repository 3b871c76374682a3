//! Phase c of `flightlog-loadgen http`: commit-to-stream-client latency.
//!
//! One SSE client follows `GET /v1/activity/changes/stream?after=<cursor>` on a thread and
//! runtime of its own (so its timestamps are not delayed behind the writer tasks), while writer
//! tasks pace single-op writes at a fixed rate: write k (a span start or end) is due at
//! `t0 + k/rate`, starts and ends alternating, each span's end about 20 ms after its start (and
//! never before the start was acknowledged). Each span is the root of its own run, so its start
//! is the run's change `seq` 1 and its end `seq` 2.
//!
//! For each write: `sent` (before the request), `acknowledged` (its answer arrived: the commit is
//! done by then), and `delivered` (the stream chunk holding its change arrived). Reported:
//! delivered − acknowledged (negative when the stream beat the HTTP answer) and delivered − sent.
//! Checked: every acknowledged write delivered exactly once, in `changeId` order, with the `seq`
//! it must have, and nothing else delivered.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use bytes::Bytes;
use http::Method;
use reqwest::header::ACCEPT;
use reqwest::Url;
use serde_json::{json, Map, Value};

use crate::client::{change_cursor, http_client, send, Connection};
use crate::server::ServerProcess;
use crate::sse::{SseEvent, SseParser};
use crate::stats::{signed_ms, Distribution, Errors, PhaseMeter, PhaseReport};
use crate::workload::{uri, PreparedRequest, RunIds};

/// The id tag of this phase's spans.
pub const PHASE_STREAM: u8 = 4;
/// The id tag of the baseline's spans.
pub const PHASE_BASELINE: u8 = 5;

/// How the phase is shaped.
pub struct StreamShape {
    /// Writes per second (starts and ends together).
    pub rate: f64,
    pub seconds: f64,
    /// Concurrent writer tasks (each with its own connection).
    pub writers: usize,
    /// How long to wait, after the last write was answered, for the stream to deliver the rest.
    pub grace: Duration,
    /// More change-stream clients beside the measured one (see [`spawn_crowd`]).
    pub crowd: usize,
}

/// One change as the stream delivered it.
struct Delivered {
    change_id: i64,
    /// The SSE `id:` field, which must equal `changeId`.
    sse_id: Option<i64>,
    seq: i64,
    span_id: String,
    at: Instant,
}

/// What the stream reader brings back.
#[derive(Default)]
struct ReaderOutcome {
    delivered: Vec<Delivered>,
    /// `event: resync`, `event: error` or anything but `change`: each is a violation.
    other_events: Vec<String>,
    /// `change` events whose data could not be read.
    unreadable: u64,
    /// The stream ended or failed before it was told to stop.
    ended_early: Option<String>,
    keep_alives: u64,
}

/// One write as the writers recorded it.
struct WriteRecord {
    span: usize,
    end: bool,
    due: Instant,
    sent: Instant,
    /// `None` when the request failed.
    acknowledged: Option<Instant>,
}

fn read_change(event: &SseEvent, at: Instant) -> Option<Delivered> {
    let data: Value = serde_json::from_str(&event.data).ok()?;
    let span_id = match data["kind"].as_str()? {
        "span" => data["span"]["spanId"].as_str()?,
        "event" => data["event"]["spanId"].as_str()?,
        _ => return None,
    };
    Some(Delivered {
        change_id: data["changeId"].as_i64()?,
        sse_id: event.id.as_deref().and_then(|id| id.parse().ok()),
        seq: data["seq"].as_i64()?,
        span_id: span_id.to_owned(),
        at,
    })
}

/// A runtime for a reader's own thread.
fn current_thread_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// A client for live streams: no overall timeout (a stream is meant to stay open; the phase's
/// `stop` ends it), HTTP/1.1, `TCP_NODELAY`.
fn sse_client() -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .http1_only()
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .build()
}

/// The reader: its own thread and current-thread runtime.
fn spawn_reader(
    url: Url,
    connected: tokio::sync::oneshot::Sender<Result<(), String>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    received: Arc<AtomicUsize>,
    done: tokio::sync::oneshot::Sender<ReaderOutcome>,
) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("sse-reader".into())
        .spawn(move || {
            let runtime = match current_thread_runtime() {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = connected.send(Err(format!("cannot start the reader's runtime: {err}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let client = sse_client();
                let response = match client {
                    Ok(client) => client.get(url).header(ACCEPT, "text/event-stream").send().await,
                    Err(err) => {
                        let _ = connected.send(Err(format!("cannot build the SSE client: {err}")));
                        return;
                    }
                };
                let mut response = match response {
                    Ok(response) if response.status().as_u16() == 200 => response,
                    Ok(response) => {
                        let _ = connected.send(Err(format!(
                            "the change stream answered {}",
                            response.status()
                        )));
                        return;
                    }
                    Err(err) => {
                        let _ = connected.send(Err(format!("cannot open the change stream: {err}")));
                        return;
                    }
                };
                let _ = connected.send(Ok(()));
                let mut outcome = ReaderOutcome::default();
                let mut parser = SseParser::default();
                let mut events = Vec::new();
                loop {
                    tokio::select! {
                        biased;
                        chunk = response.chunk() => {
                            let at = Instant::now();
                            match chunk {
                                Ok(Some(bytes)) => {
                                    parser.push(&bytes, &mut events);
                                    for event in events.drain(..) {
                                        if event.event != "change" {
                                            outcome.other_events.push(format!("event: {} data: {}", event.event, event.data));
                                            continue;
                                        }
                                        match read_change(&event, at) {
                                            Some(change) => {
                                                outcome.delivered.push(change);
                                                received.fetch_add(1, Ordering::Relaxed);
                                            }
                                            None => outcome.unreadable += 1,
                                        }
                                    }
                                }
                                Ok(None) => {
                                    outcome.ended_early = Some("the server ended the stream".into());
                                    break;
                                }
                                Err(err) => {
                                    outcome.ended_early = Some(format!("the stream failed: {err}"));
                                    break;
                                }
                            }
                        }
                        _ = stop.changed() => break,
                    }
                }
                outcome.keep_alives = parser.comments;
                let _ = done.send(outcome);
            });
        })
        .context("cannot start the stream reader thread")?;
    Ok(())
}

/// What one client of the crowd received: the `id:` of each `change` event, in order, and
/// whether anything else happened.
#[derive(Default)]
struct CrowdClient {
    ids: Vec<i64>,
    /// Events other than `change`, events without a readable id, and an early end.
    troubles: Vec<String>,
}

/// `clients` more followers of `url`, all on one thread and current-thread runtime of their own
/// (as few of the generator's cycles as can be: an event's id is read from its `id:` line, its
/// data not parsed). `connected` answers once every one has its 200; each counts its changes
/// into `received`; `done` brings every client's record back after `stop`.
fn spawn_crowd(
    url: Url,
    clients: usize,
    connected: tokio::sync::oneshot::Sender<Result<(), String>>,
    stop: tokio::sync::watch::Receiver<bool>,
    received: Arc<AtomicUsize>,
    done: tokio::sync::oneshot::Sender<Vec<CrowdClient>>,
) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("sse-crowd".into())
        .spawn(move || {
            let runtime = match current_thread_runtime() {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = connected.send(Err(format!("cannot start the crowd's runtime: {err}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let client = match sse_client() {
                    Ok(client) => client,
                    Err(err) => {
                        let _ = connected.send(Err(format!("cannot build the SSE client: {err}")));
                        return;
                    }
                };
                let mut responses = Vec::with_capacity(clients);
                for _ in 0..clients {
                    let response = client
                        .get(url.clone())
                        .header(ACCEPT, "text/event-stream")
                        .send()
                        .await;
                    match response {
                        Ok(response) if response.status().as_u16() == 200 => {
                            responses.push(response)
                        }
                        Ok(response) => {
                            let _ = connected.send(Err(format!(
                                "a crowd client's change stream answered {}",
                                response.status()
                            )));
                            return;
                        }
                        Err(err) => {
                            let _ = connected
                                .send(Err(format!("a crowd client cannot open the stream: {err}")));
                            return;
                        }
                    }
                }
                let _ = connected.send(Ok(()));
                let followers = responses.into_iter().map(|mut response| {
                    let mut stop = stop.clone();
                    let received = Arc::clone(&received);
                    async move {
                        let mut record = CrowdClient::default();
                        let mut parser = SseParser::default();
                        let mut events = Vec::new();
                        loop {
                            tokio::select! {
                                biased;
                                chunk = response.chunk() => match chunk {
                                    Ok(Some(bytes)) => {
                                        parser.push(&bytes, &mut events);
                                        for event in events.drain(..) {
                                            let id = event.id.as_deref().and_then(|id| id.parse().ok());
                                            match id {
                                                Some(id) if event.event == "change" => {
                                                    record.ids.push(id);
                                                    received.fetch_add(1, Ordering::Relaxed);
                                                }
                                                _ => record.troubles.push(format!(
                                                    "event: {} id: {:?}",
                                                    event.event, event.id
                                                )),
                                            }
                                        }
                                    }
                                    Ok(None) => {
                                        record.troubles.push("the server ended the stream".into());
                                        break;
                                    }
                                    Err(err) => {
                                        record.troubles.push(format!("the stream failed: {err}"));
                                        break;
                                    }
                                },
                                _ = stop.changed() => break,
                            }
                        }
                        record
                    }
                });
                let handles: Vec<_> = followers.map(tokio::spawn).collect();
                let mut records = Vec::with_capacity(handles.len());
                for handle in handles {
                    records.push(handle.await.unwrap_or_else(|err| CrowdClient {
                        ids: Vec::new(),
                        troubles: vec![format!("the client's task failed: {err}")],
                    }));
                }
                let _ = done.send(records);
            });
        })
        .context("cannot start the crowd's thread")?;
    Ok(())
}

/// How many crowd clients did not receive exactly `expected` (the measured client's change ids,
/// in order) or had other trouble, and the first trouble seen.
fn judge_crowd(crowd: &[CrowdClient], expected: &[i64]) -> (u64, Option<String>) {
    let mut failed = 0;
    let mut first = None;
    for (index, client) in crowd.iter().enumerate() {
        let trouble = if let Some(trouble) = client.troubles.first() {
            Some(trouble.clone())
        } else if client.ids != expected {
            Some(format!(
                "received {} changes (first {:?}, last {:?}) where the measured client received \
                 {} (first {:?}, last {:?})",
                client.ids.len(),
                client.ids.first(),
                client.ids.last(),
                expected.len(),
                expected.first(),
                expected.last()
            ))
        } else {
            None
        };
        if let Some(trouble) = trouble {
            failed += 1;
            first.get_or_insert_with(|| format!("crowd client {index}: {trouble}"));
        }
    }
    (failed, first)
}

fn start_request(ids: &RunIds) -> anyhow::Result<PreparedRequest> {
    let body = json!({
        "spanId": ids.span_ids[0],
        "runId": ids.run_id,
        "name": "stream probe",
        "kind": "turn",
        "origin": "session",
    });
    Ok(PreparedRequest {
        method: Method::POST,
        uri: uri("/v1/activity/spans")?,
        body: Bytes::from(serde_json::to_vec(&body)?),
        expected_status: 201,
        must_contain: None,
    })
}

fn end_request(span_id: &str) -> anyhow::Result<PreparedRequest> {
    Ok(PreparedRequest {
        method: Method::POST,
        uri: uri(&format!("/v1/activity/spans/{span_id}/end"))?,
        body: Bytes::from_static(br#"{"outcome":"success"}"#),
        expected_status: 200,
        must_contain: Some("true"),
    })
}

/// The checks and latencies of one phase, from the writers' records and the deliveries.
#[derive(Default, Debug, PartialEq)]
struct Verdict {
    acknowledged: usize,
    matched: usize,
    /// Acknowledged writes the stream never delivered.
    missing: u64,
    /// Changes delivered with a changeId not above the previous one.
    out_of_order: u64,
    /// A changeId delivered twice.
    duplicates: u64,
    /// Deliveries no write accounts for (an unknown span, or more changes than writes).
    unexpected: u64,
    /// A delivery whose `seq` is not the write's (1 for the start, 2 for the end).
    wrong_seq: u64,
    /// An SSE `id:` that differs from the change's `changeId`.
    id_mismatch: u64,
    /// Jumps of more than 1 between consecutive changeIds (informational).
    gaps: u64,
    /// Deliveries of writes whose request failed (informational: it may have committed).
    unacknowledged_delivered: u64,
    after_ack_ms: Vec<f64>,
    after_send_ms: Vec<f64>,
}

impl Verdict {
    fn violations(&self) -> u64 {
        self.missing
            + self.out_of_order
            + self.duplicates
            + self.unexpected
            + self.wrong_seq
            + self.id_mismatch
    }
}

fn judge(
    records: &[WriteRecord],
    delivered: &[Delivered],
    span_index: &HashMap<String, usize>,
    spans: usize,
) -> Verdict {
    let mut verdict = Verdict::default();
    let mut per_span: Vec<Vec<&Delivered>> = vec![Vec::new(); spans];
    let mut seen = HashSet::with_capacity(delivered.len());
    let mut previous: Option<i64> = None;
    for change in delivered {
        if change.sse_id != Some(change.change_id) {
            verdict.id_mismatch += 1;
        }
        if !seen.insert(change.change_id) {
            verdict.duplicates += 1;
        }
        if let Some(previous) = previous {
            if change.change_id <= previous {
                verdict.out_of_order += 1;
            } else if change.change_id > previous + 1 {
                verdict.gaps += 1;
            }
        }
        previous = Some(change.change_id);
        match span_index.get(&change.span_id) {
            Some(&span) => per_span[span].push(change),
            None => verdict.unexpected += 1,
        }
    }
    let mut writes: Vec<[Option<&WriteRecord>; 2]> = vec![[None, None]; spans];
    for record in records {
        writes[record.span][usize::from(record.end)] = Some(record);
    }
    for (span, deliveries) in per_span.iter().enumerate() {
        let expected = &writes[span];
        for (k, write) in expected.iter().enumerate() {
            let delivery = deliveries.get(k);
            match (write, delivery) {
                (Some(write), Some(delivery)) => {
                    if delivery.seq != k as i64 + 1 {
                        verdict.wrong_seq += 1;
                    }
                    match write.acknowledged {
                        Some(acknowledged) => {
                            verdict.acknowledged += 1;
                            verdict.matched += 1;
                            verdict
                                .after_ack_ms
                                .push(signed_ms(delivery.at, acknowledged));
                            verdict
                                .after_send_ms
                                .push(signed_ms(delivery.at, write.sent));
                        }
                        None => verdict.unacknowledged_delivered += 1,
                    }
                }
                (Some(write), None) => {
                    if write.acknowledged.is_some() {
                        verdict.acknowledged += 1;
                        verdict.missing += 1;
                    }
                }
                (None, Some(_)) => verdict.unexpected += 1,
                (None, None) => {}
            }
        }
        if deliveries.len() > 2 {
            verdict.unexpected += (deliveries.len() - 2) as u64;
        }
    }
    verdict
}

/// How long after its start a span's end is due: long enough that the start has nearly always
/// been answered by then, so the pacing never waits on a round trip.
const END_LAG: Duration = Duration::from_millis(20);

/// [`END_LAG`] in spans at `rate` writes/s (two writes per span), at least 1.
fn end_lag_spans(rate: f64) -> usize {
    ((rate * END_LAG.as_secs_f64()) / 2.0).round().max(1.0) as usize
}

/// The order of the writes, one per slot (slot k is due at `t0 + k / rate`): span i's start,
/// then, `lag` spans later, its end, interleaved so starts and ends alternate.
fn schedule(spans: usize, lag: usize) -> Vec<(usize, bool)> {
    let mut order = Vec::with_capacity(2 * spans);
    for i in 0..spans + lag {
        if i < spans {
            order.push((i, false));
        }
        if i >= lag {
            order.push((i - lag, true));
        }
    }
    order
}

/// The paced writers: write k of [`schedule`] sent at `t0 + k / rate` by whichever writer task
/// is free (each with its own connection); every write's times recorded.
async fn paced_writes(
    addr: std::net::SocketAddr,
    requests: Arc<(Vec<PreparedRequest>, Vec<PreparedRequest>)>,
    shape: &StreamShape,
    t0: Instant,
    hard_deadline: Instant,
) -> anyhow::Result<(Vec<WriteRecord>, Errors, bool)> {
    let spans = requests.0.len();
    let next = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(schedule(spans, end_lag_spans(shape.rate)));
    // Per span: 0 while its start is unanswered, 1 acknowledged, 2 failed.
    let started: Arc<Vec<AtomicU8>> = Arc::new((0..spans).map(|_| AtomicU8::new(0)).collect());
    let mut tasks = Vec::with_capacity(shape.writers);
    for _ in 0..shape.writers {
        let mut connection = Connection::new(addr)?;
        let requests = Arc::clone(&requests);
        let order = Arc::clone(&order);
        let started = Arc::clone(&started);
        let next = Arc::clone(&next);
        let rate = shape.rate;
        tasks.push(tokio::spawn(async move {
            let mut records = Vec::new();
            let mut errors = Errors::default();
            let mut abandoned = false;
            'slots: loop {
                let slot = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(span, end)) = order.get(slot) else {
                    break;
                };
                if Instant::now() > hard_deadline {
                    abandoned = true;
                    break;
                }
                let due = t0 + Duration::from_secs_f64(slot as f64 / rate);
                tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
                if end {
                    // The end goes out only after its start was answered (normally long
                    // before: it is due `lag` spans later); after a failed start, never.
                    loop {
                        match started[span].load(Ordering::Acquire) {
                            1 => break,
                            2 => continue 'slots,
                            _ if Instant::now() > hard_deadline => {
                                abandoned = true;
                                break 'slots;
                            }
                            _ => tokio::time::sleep(Duration::from_millis(1)).await,
                        }
                    }
                }
                let request = if end {
                    &requests.1[span]
                } else {
                    &requests.0[span]
                };
                let sent = Instant::now();
                let result = send(&mut connection, request).await;
                let answered = Instant::now();
                let ok = match result {
                    Ok(_) => true,
                    Err(message) => {
                        errors.record(|| message);
                        false
                    }
                };
                if !end {
                    started[span].store(if ok { 1 } else { 2 }, Ordering::Release);
                }
                records.push(WriteRecord {
                    span,
                    end,
                    due,
                    sent,
                    acknowledged: ok.then_some(answered),
                });
            }
            (records, errors, abandoned)
        }));
    }
    let mut records = Vec::new();
    let mut errors = Errors::default();
    let mut abandoned = false;
    for task in tasks {
        let (task_records, task_errors, task_abandoned) =
            task.await.context("a stream writer task failed")?;
        records.extend(task_records);
        errors.merge(task_errors);
        abandoned |= task_abandoned;
    }
    Ok((records, errors, abandoned))
}

/// The start and end requests of `spans` root spans of phase `tag`, and each span id's index.
#[allow(clippy::type_complexity)]
fn prepare(
    tag: u8,
    spans: usize,
) -> anyhow::Result<(
    Arc<(Vec<PreparedRequest>, Vec<PreparedRequest>)>,
    HashMap<String, usize>,
)> {
    let mut starts = Vec::with_capacity(spans);
    let mut ends = Vec::with_capacity(spans);
    let mut span_index = HashMap::with_capacity(spans);
    for span in 0..spans {
        let ids = RunIds::new(tag, span);
        starts.push(start_request(&ids)?);
        ends.push(end_request(&ids.span_ids[0])?);
        span_index.insert(ids.span_ids[0].clone(), span);
    }
    Ok((Arc::new((starts, ends)), span_index))
}

/// The same paced writes with no stream client: what the writes alone cost the server at this
/// rate (`--stream-baseline`), so the stream's own share can be told apart.
pub async fn paced_baseline_phase(
    server: &ServerProcess,
    shape: &StreamShape,
    time_limit: Duration,
) -> anyhow::Result<PhaseReport> {
    let spans = ((shape.rate * shape.seconds) / 2.0).ceil().max(1.0) as usize;
    let (requests, _) = prepare(PHASE_BASELINE, spans)?;
    let meter = PhaseMeter::start(server);
    let t0 = Instant::now() + Duration::from_millis(20);
    let (records, errors, abandoned) =
        paced_writes(server.addr(), requests, shape, t0, t0 + time_limit).await?;
    let (rss_peak, server_cpu, loadgen_cpu) = meter.finish(server);
    let last_ack = records
        .iter()
        .filter_map(|r| r.acknowledged)
        .max()
        .unwrap_or(t0);
    let acknowledged = records.iter().filter(|r| r.acknowledged.is_some()).count();
    let write_seconds = signed_ms(last_ack, t0).max(1e-3) / 1e3;
    let latency = Distribution::of(
        records
            .iter()
            .filter_map(|r| r.acknowledged.map(|a| signed_ms(a, r.sent)))
            .collect(),
    );
    let lateness = Distribution::of(records.iter().map(|r| signed_ms(r.sent, r.due)).collect());
    let mut notes = vec![
        format!(
            "the stream phase's paced writes ({} writes/s for {} s, {} writer tasks) with no \
             stream client; the p50/p99 columns are write request latency",
            shape.rate, shape.seconds, shape.writers
        ),
        format!(
            "sent later than due: p50 {:.3} ms, p99 {:.3} ms",
            lateness.p50, lateness.p99
        ),
    ];
    if abandoned {
        notes.push(format!(
            "TIME LIMIT ({time_limit:?}) reached: writes were left undone"
        ));
    }
    let mut extra = Map::new();
    extra.insert("rate".into(), json!(shape.rate));
    extra.insert("acknowledged".into(), json!(acknowledged));
    Ok(PhaseReport {
        name: "paced-no-stream".into(),
        unit: "writes/s",
        throughput: acknowledged as f64 / write_seconds,
        requests: records.len() as u64,
        seconds: write_seconds,
        latency: Some(latency),
        errors,
        violations: u64::from(abandoned),
        rss_peak,
        server_cpu,
        loadgen_cpu,
        notes,
        extra,
    })
}

/// Phase c.
pub async fn stream_phase(
    server: &ServerProcess,
    base: &Url,
    shape: &StreamShape,
    time_limit: Duration,
) -> anyhow::Result<PhaseReport> {
    let spans = ((shape.rate * shape.seconds) / 2.0).ceil().max(1.0) as usize;
    let (requests, span_index) = prepare(PHASE_STREAM, spans)?;

    let probe = http_client()?;
    let cursor = change_cursor(&probe, base).await?;
    let mut stream_url = base.join("/v1/activity/changes/stream")?;
    stream_url.set_query(Some(&format!("after={cursor}")));
    let (connected_tx, connected) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let received = Arc::new(AtomicUsize::new(0));
    spawn_reader(
        stream_url.clone(),
        connected_tx,
        stop_rx.clone(),
        Arc::clone(&received),
        done_tx,
    )?;
    tokio::time::timeout(Duration::from_secs(10), connected)
        .await
        .map_err(|_| anyhow!("the change stream did not answer within 10 s"))?
        .map_err(|_| anyhow!("the stream reader stopped before connecting"))?
        .map_err(|message| anyhow!(message))?;
    let crowd_received = Arc::new(AtomicUsize::new(0));
    let crowd_done = if shape.crowd > 0 {
        let (connected_tx, connected) = tokio::sync::oneshot::channel();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        spawn_crowd(
            stream_url.clone(),
            shape.crowd,
            connected_tx,
            stop_rx.clone(),
            Arc::clone(&crowd_received),
            done_tx,
        )?;
        tokio::time::timeout(Duration::from_secs(30), connected)
            .await
            .map_err(|_| anyhow!("the crowd's change streams did not answer within 30 s"))?
            .map_err(|_| anyhow!("the crowd stopped before connecting"))?
            .map_err(|message| anyhow!(message))?;
        Some(done)
    } else {
        None
    };

    let meter = PhaseMeter::start(server);
    let t0 = Instant::now() + Duration::from_millis(20);
    let hard_deadline = t0 + time_limit;
    let lag = end_lag_spans(shape.rate);
    let (records, errors, abandoned) = paced_writes(
        server.addr(),
        Arc::clone(&requests),
        shape,
        t0,
        hard_deadline,
    )
    .await?;
    let writers_done = Instant::now();
    let acknowledged = records.iter().filter(|r| r.acknowledged.is_some()).count();
    // Let the stream deliver the rest, then stop it.
    let grace_end = writers_done + shape.grace;
    while (received.load(Ordering::Relaxed) < acknowledged
        || crowd_received.load(Ordering::Relaxed) < acknowledged * shape.crowd)
        && Instant::now() < grace_end
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let waited_ms = writers_done.elapsed().as_secs_f64() * 1e3;
    let _ = stop.send(true);
    let outcome = tokio::time::timeout(Duration::from_secs(10), done)
        .await
        .map_err(|_| anyhow!("the stream reader did not stop within 10 s"))?
        .map_err(|_| anyhow!("the stream reader ended without a result"))?;
    let crowd = match crowd_done {
        Some(done) => tokio::time::timeout(Duration::from_secs(10), done)
            .await
            .map_err(|_| anyhow!("the crowd did not stop within 10 s"))?
            .map_err(|_| anyhow!("the crowd ended without a result"))?,
        None => Vec::new(),
    };
    let (rss_peak, server_cpu, loadgen_cpu) = meter.finish(server);

    let last_ack = records
        .iter()
        .filter_map(|r| r.acknowledged)
        .max()
        .unwrap_or(t0);
    let write_seconds = signed_ms(last_ack, t0).max(1e-3) / 1e3;
    let achieved_rate = acknowledged as f64 / write_seconds;
    let request_latency = Distribution::of(
        records
            .iter()
            .filter_map(|r| r.acknowledged.map(|a| signed_ms(a, r.sent)))
            .collect(),
    );
    let lateness = Distribution::of(records.iter().map(|r| signed_ms(r.sent, r.due)).collect());

    let verdict = judge(&records, &outcome.delivered, &span_index, spans);
    let mut violations =
        verdict.violations() + outcome.other_events.len() as u64 + outcome.unreadable;
    if outcome.ended_early.is_some() {
        violations += 1;
    }
    let expected_ids: Vec<i64> = outcome.delivered.iter().map(|d| d.change_id).collect();
    let (crowd_failed, crowd_trouble) = judge_crowd(&crowd, &expected_ids);
    violations += crowd_failed;
    if abandoned {
        violations += 1;
    }
    let after_ack = Distribution::of(verdict.after_ack_ms.clone());
    let after_send = Distribution::of(verdict.after_send_ms.clone());

    let mut notes = vec![
        format!(
            "paced {} writes/s for {} s: {spans} root spans (start, end {lag} spans = ~{} ms \
             later), {} writer tasks; achieved {achieved_rate:.0} writes/s ({acknowledged} \
             acknowledged)",
            shape.rate,
            shape.seconds,
            END_LAG.as_millis(),
            shape.writers
        ),
        format!(
            "the p50/p99 columns are delivered - acknowledged (the stream chunk's arrival minus \
             the HTTP answer's), max {:.3} ms, min {:.3} ms",
            after_ack.max, after_ack.min
        ),
        format!(
            "delivered - sent: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; write request latency \
             p50 {:.3} ms, p99 {:.3} ms; sent later than due: p50 {:.3} ms, p99 {:.3} ms \
             (tokio timers tick in 1 ms)",
            after_send.p50,
            after_send.p99,
            after_send.max,
            request_latency.p50,
            request_latency.p99,
            lateness.p50,
            lateness.p99
        ),
        format!(
            "exactly-once check: {} of {} acknowledged writes delivered; missing {}, out of \
             order {}, duplicates {}, unexpected {}, wrong seq {}, id mismatch {}, other events \
             {}, unreadable {}; changeId gaps {} (informational); delivered but unacknowledged \
             {}; waited {waited_ms:.0} ms after the last answer; {} keep-alive comments",
            verdict.matched,
            verdict.acknowledged,
            verdict.missing,
            verdict.out_of_order,
            verdict.duplicates,
            verdict.unexpected,
            verdict.wrong_seq,
            verdict.id_mismatch,
            outcome.other_events.len(),
            outcome.unreadable,
            verdict.gaps,
            verdict.unacknowledged_delivered,
            outcome.keep_alives
        ),
    ];
    if shape.crowd > 0 {
        notes.push(format!(
            "{} more change-stream clients: {} received exactly the measured client's changes \
             in its order",
            shape.crowd,
            shape.crowd as u64 - crowd_failed
        ));
    }
    if let Some(trouble) = &crowd_trouble {
        notes.push(format!("CROWD: {trouble}"));
    }
    if let Some(why) = &outcome.ended_early {
        notes.push(format!("STREAM ENDED EARLY: {why}"));
    }
    if let Some(first) = outcome.other_events.first() {
        notes.push(format!("first unexpected event: {first}"));
    }
    if abandoned {
        notes.push(format!(
            "TIME LIMIT ({time_limit:?}) reached: writes were left undone"
        ));
    }

    let mut extra = Map::new();
    extra.insert("rate".into(), json!(shape.rate));
    extra.insert("achievedRate".into(), json!(achieved_rate.round()));
    extra.insert("writers".into(), json!(shape.writers));
    extra.insert("crowd".into(), json!(shape.crowd));
    extra.insert("crowdFailed".into(), json!(crowd_failed));
    extra.insert("acknowledged".into(), json!(verdict.acknowledged));
    extra.insert("delivered".into(), json!(outcome.delivered.len()));
    extra.insert("deliveredMinusAcknowledged".into(), after_ack.to_json());
    extra.insert("deliveredMinusSent".into(), after_send.to_json());
    extra.insert("writeLatency".into(), request_latency.to_json());
    extra.insert("sendLateness".into(), lateness.to_json());
    extra.insert(
        "checks".into(),
        json!({
            "missing": verdict.missing,
            "outOfOrder": verdict.out_of_order,
            "duplicates": verdict.duplicates,
            "unexpected": verdict.unexpected,
            "wrongSeq": verdict.wrong_seq,
            "idMismatch": verdict.id_mismatch,
            "otherEvents": outcome.other_events.len(),
            "unreadable": outcome.unreadable,
            "endedEarly": outcome.ended_early.is_some(),
            "gaps": verdict.gaps,
            "unacknowledgedDelivered": verdict.unacknowledged_delivered,
        }),
    );
    Ok(PhaseReport {
        name: "stream-latency".into(),
        unit: "writes/s",
        throughput: achieved_rate,
        requests: records.len() as u64,
        seconds: write_seconds,
        latency: Some(after_ack),
        errors,
        violations,
        rss_peak,
        server_cpu,
        loadgen_cpu,
        notes,
        extra,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(span: usize, end: bool, at: Instant, acknowledged: bool) -> WriteRecord {
        WriteRecord {
            span,
            end,
            due: at,
            sent: at,
            acknowledged: acknowledged.then_some(at + Duration::from_millis(1)),
        }
    }

    fn change(change_id: i64, seq: i64, span: &str, at: Instant) -> Delivered {
        Delivered {
            change_id,
            sse_id: Some(change_id),
            seq,
            span_id: span.to_owned(),
            at,
        }
    }

    fn index() -> HashMap<String, usize> {
        HashMap::from([("a".to_owned(), 0), ("b".to_owned(), 1)])
    }

    #[test]
    fn a_clean_stream_has_no_violations() {
        let t = Instant::now();
        let records = [
            write(0, false, t, true),
            write(1, false, t, true),
            write(0, true, t, true),
            write(1, true, t, true),
        ];
        let later = t + Duration::from_millis(3);
        let delivered = [
            change(10, 1, "a", later),
            change(11, 1, "b", later),
            change(12, 2, "a", later),
            change(13, 2, "b", later),
        ];
        let verdict = judge(&records, &delivered, &index(), 2);
        assert_eq!(verdict.violations(), 0);
        assert_eq!((verdict.acknowledged, verdict.matched), (4, 4));
        assert!(verdict
            .after_ack_ms
            .iter()
            .all(|ms| (ms - 2.0).abs() < 1e-6));
        assert!(verdict
            .after_send_ms
            .iter()
            .all(|ms| (ms - 3.0).abs() < 1e-6));
    }

    #[test]
    fn missing_duplicate_and_disordered_changes_are_counted() {
        let t = Instant::now();
        let records = [
            write(0, false, t, true),
            write(0, true, t, true),
            write(1, false, t, true),
            write(1, true, t, true),
        ];
        let delivered = [
            change(10, 1, "a", t),
            change(12, 2, "a", t),
            change(12, 2, "a", t),
            change(11, 1, "b", t),
            change(20, 1, "zzz", t),
        ];
        let verdict = judge(&records, &delivered, &index(), 2);
        assert_eq!(verdict.missing, 1, "b's end never came");
        assert_eq!(verdict.duplicates, 1);
        assert_eq!(verdict.out_of_order, 2, "12 again, then 11");
        assert_eq!(
            verdict.unexpected, 2,
            "a third change for a, and an unknown span"
        );
        assert_eq!(verdict.gaps, 2, "10 -> 12 and 11 -> 20");
    }

    #[test]
    fn the_schedule_ends_every_span_once_after_its_start() {
        let order = schedule(5, 2);
        assert_eq!(
            order,
            [
                (0, false),
                (1, false),
                (2, false),
                (0, true),
                (3, false),
                (1, true),
                (4, false),
                (2, true),
                (3, true),
                (4, true)
            ]
        );
        assert_eq!(end_lag_spans(5_000.0), 50);
        assert_eq!(end_lag_spans(10.0), 1);
    }

    #[test]
    fn a_change_is_read_from_its_sse_event() {
        let event = SseEvent {
            id: Some("42".into()),
            event: "change".into(),
            data: r#"{"changeId":42,"runId":"r","seq":2,"kind":"span","span":{"spanId":"s1"}}"#
                .into(),
        };
        let at = Instant::now();
        let delivered = read_change(&event, at).expect("a change");
        assert_eq!(
            (
                delivered.change_id,
                delivered.sse_id,
                delivered.seq,
                delivered.span_id.as_str()
            ),
            (42, Some(42), 2, "s1")
        );
    }
}
