//! The write phases of `flightlog-loadgen http`: the reference workload through the single-op
//! endpoints (one request per write) and through `POST /v1/activity/batch` (one request per run,
//! or per several runs), driven by C concurrent client tasks.
//!
//! Every phase checks what it wrote: each answer's status (and `true` in end/patch answers, and
//! no `{"error":…}` entry in batch results), and afterwards that the change log grew by exactly
//! 27 changes per run (`GET /v1/activity/cursor` before and after).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http::Method;
use reqwest::Url;
use serde_json::{json, Map};

use crate::client::{change_cursor, count, http_client, send, snippet, Connection};
use crate::server::ServerProcess;
use crate::stats::{Distribution, Errors, PhaseMeter, PhaseReport};
use crate::workload::{
    batch_body, rollup_request, run_writes, single_request, PreparedRequest, CHANGES_PER_RUN,
    WRITES_PER_RUN,
};
use crate::writer_use;

/// The id tags that keep each phase's ids apart (see [`crate::workload::RunIds`]).
pub const PHASE_SINGLE: u8 = 1;
pub const PHASE_BATCH: u8 = 2;
pub const PHASE_BIG_BATCH: u8 = 3;
/// Id tag of the unmeasured warm-up before the phases.
pub const PHASE_WARMUP: u8 = 6;

/// The server's default `max_batch_ops` (`ServerConfig::DEFAULT_MAX_BATCH_OPS`).
const SERVER_MAX_BATCH_OPS: usize = 1_000;

/// What one client task brings back.
#[derive(Default)]
struct ClientTally {
    /// Latency of each successful request of the measured kind, ms.
    latencies: Vec<f64>,
    /// Latency of each successful rollup request sent after a batch, ms.
    rollup_latencies: Vec<f64>,
    /// Successful writes (single-op requests, or batch ops without an error entry).
    writes: u64,
    requests: u64,
    errors: Errors,
    /// Work units (runs, batches) left undone because the phase's time ran out.
    abandoned: bool,
}

fn merge(tallies: Vec<ClientTally>) -> ClientTally {
    let mut all = ClientTally::default();
    for tally in tallies {
        all.latencies.extend(tally.latencies);
        all.rollup_latencies.extend(tally.rollup_latencies);
        all.writes += tally.writes;
        all.requests += tally.requests;
        all.errors.merge(tally.errors);
        all.abandoned |= tally.abandoned;
    }
    all
}

async fn join_all(
    tasks: Vec<tokio::task::JoinHandle<ClientTally>>,
) -> anyhow::Result<Vec<ClientTally>> {
    let mut tallies = Vec::with_capacity(tasks.len());
    for task in tasks {
        tallies.push(task.await.context("a client task failed")?);
    }
    Ok(tallies)
}

/// Check the change log grew by what the phase wrote; a note and a violation count otherwise.
fn change_log_check(before: i64, after: i64, runs: usize, notes: &mut Vec<String>) -> u64 {
    let expected = (runs * CHANGES_PER_RUN) as i64;
    let grown = after - before;
    notes.push(format!(
        "change log grew by {grown} (expected {expected} = {runs} runs x {CHANGES_PER_RUN})"
    ));
    u64::from(grown != expected)
}

/// Phase a: every write one request to its single endpoint.
pub async fn single_op_phase(
    server: &ServerProcess,
    base: &Url,
    runs: usize,
    clients: usize,
    time_limit: Duration,
) -> anyhow::Result<PhaseReport> {
    let prepared_at = Instant::now();
    let mut plans: Vec<Vec<PreparedRequest>> = Vec::with_capacity(runs);
    for run in 0..runs {
        let (ids, writes) = run_writes(PHASE_SINGLE, run);
        let requests = writes
            .iter()
            .map(|write| single_request(&ids.run_id, write))
            .collect::<anyhow::Result<Vec<_>>>()?;
        plans.push(requests);
    }
    let plans = Arc::new(plans);
    let prepare_seconds = prepared_at.elapsed().as_secs_f64();
    let probe = http_client()?;
    let cursor_before = change_cursor(&probe, base).await?;
    let writer_before = writer_use::sample(&probe, base).await;

    let meter = PhaseMeter::start(server);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + time_limit;
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let mut connection = Connection::new(server.addr())?;
        let plans = Arc::clone(&plans);
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            let mut tally = ClientTally::default();
            loop {
                let run = next.fetch_add(1, Ordering::Relaxed);
                let Some(requests) = plans.get(run) else {
                    break;
                };
                if Instant::now() > deadline {
                    tally.abandoned = true;
                    break;
                }
                for request in requests {
                    let sent = Instant::now();
                    let result = send(&mut connection, request).await;
                    tally.requests += 1;
                    match result {
                        Ok(_) => {
                            tally.latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                            tally.writes += 1;
                        }
                        Err(message) => tally.errors.record(|| message),
                    }
                }
            }
            tally
        }));
    }
    let tally = merge(join_all(tasks).await?);
    let seconds = started.elapsed().as_secs_f64();
    let (rss_peak, server_cpu, loadgen_cpu) = meter.finish(server);
    let cursor_after = change_cursor(&probe, base).await?;
    let writer = writer_use::between(
        writer_before,
        writer_use::sample(&probe, base).await,
        seconds,
    );

    let mut notes = vec![format!(
        "{runs} runs x {WRITES_PER_RUN} writes, {clients} clients, one request per write \
         (bodies encoded in {prepare_seconds:.2} s before the clock)"
    )];
    let mut violations = change_log_check(cursor_before, cursor_after, runs, &mut notes);
    if tally.abandoned {
        notes.push(format!(
            "TIME LIMIT ({time_limit:?}) reached: runs were left undone"
        ));
        violations += 1;
    }
    let mut extra = Map::new();
    if let Some(writer) = writer {
        writer.report(&mut notes, &mut extra);
    }
    extra.insert("runs".into(), json!(runs));
    extra.insert("clients".into(), json!(clients));
    extra.insert("writes".into(), json!(tally.writes));
    extra.insert(
        "changeLogGrowth".into(),
        json!(cursor_after - cursor_before),
    );
    Ok(PhaseReport {
        name: "single-op".into(),
        unit: "writes/s",
        throughput: tally.writes as f64 / seconds,
        requests: tally.requests,
        seconds,
        latency: Some(Distribution::of(tally.latencies)),
        errors: tally.errors,
        violations,
        rss_peak,
        server_cpu,
        loadgen_cpu,
        notes,
        extra,
    })
}

/// How a batch phase is shaped.
pub struct BatchShape {
    pub name: String,
    /// Id tag of the phase.
    pub phase: u8,
    pub runs: usize,
    /// Runs per `POST /v1/activity/batch` (27 ops each).
    pub runs_per_request: usize,
    pub clients: usize,
    /// Send each run's rollup (`POST /v1/activity/runs/{id}/rollup`) right after its batch.
    pub rollups: bool,
}

struct PreparedBatch {
    body: Bytes,
    ops: u64,
    rollups: Vec<PreparedRequest>,
}

/// Phase b: each request one batch of `runs_per_request` runs.
pub async fn batch_phase(
    server: &ServerProcess,
    base: &Url,
    shape: &BatchShape,
    time_limit: Duration,
) -> anyhow::Result<PhaseReport> {
    let ops_per_request = shape.runs_per_request * CHANGES_PER_RUN;
    if shape.runs_per_request == 0 || ops_per_request > SERVER_MAX_BATCH_OPS {
        bail!(
            "{} runs per batch make {ops_per_request} ops; the server takes 1 to \
             {SERVER_MAX_BATCH_OPS} ops per batch (at most {} runs)",
            shape.runs_per_request,
            SERVER_MAX_BATCH_OPS / CHANGES_PER_RUN
        );
    }
    let prepared_at = Instant::now();
    let mut batches = Vec::new();
    let mut first = 0;
    while first < shape.runs {
        let last = (first + shape.runs_per_request).min(shape.runs);
        let (body, run_ids) = batch_body(shape.phase, first..last)?;
        let rollups = if shape.rollups {
            run_ids
                .iter()
                .map(|run_id| rollup_request(run_id))
                .collect::<anyhow::Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        batches.push(PreparedBatch {
            body,
            ops: ((last - first) * CHANGES_PER_RUN) as u64,
            rollups,
        });
        first = last;
    }
    let body_bytes: usize = batches.iter().map(|b| b.body.len()).sum();
    let batches = Arc::new(batches);
    let prepare_seconds = prepared_at.elapsed().as_secs_f64();
    let batch_uri = crate::workload::uri("/v1/activity/batch")?;
    let probe = http_client()?;
    let cursor_before = change_cursor(&probe, base).await?;
    let writer_before = writer_use::sample(&probe, base).await;

    let meter = PhaseMeter::start(server);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + time_limit;
    let mut tasks = Vec::with_capacity(shape.clients);
    for _ in 0..shape.clients {
        let mut connection = Connection::new(server.addr())?;
        let batches = Arc::clone(&batches);
        let next = Arc::clone(&next);
        let batch_uri = batch_uri.clone();
        tasks.push(tokio::spawn(async move {
            let mut tally = ClientTally::default();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(batch) = batches.get(index) else {
                    break;
                };
                if Instant::now() > deadline {
                    tally.abandoned = true;
                    break;
                }
                let sent = Instant::now();
                let answer = connection
                    .request(&Method::POST, &batch_uri, "application/json", &batch.body)
                    .await;
                tally.requests += 1;
                match answer {
                    Ok((200, body)) => {
                        tally.latencies.push(sent.elapsed().as_secs_f64() * 1e3);
                        // A failed op's entry is the single endpoint's `{"error": {…}}` body;
                        // the payloads this workload writes never contain that text.
                        let failed = count(&body, b"{\"error\":{") as u64;
                        tally.writes += batch.ops.saturating_sub(failed);
                        for _ in 0..failed {
                            tally
                                .errors
                                .record(|| format!("a batch op failed: {}", snippet(&body)));
                        }
                    }
                    Ok((status, body)) => tally.errors.record(|| {
                        format!(
                            "POST /v1/activity/batch: status {status}: {}",
                            snippet(&body)
                        )
                    }),
                    Err(message) => tally.errors.record(|| message),
                }
                for rollup in &batch.rollups {
                    let sent = Instant::now();
                    let result = send(&mut connection, rollup).await;
                    tally.requests += 1;
                    match result {
                        Ok(_) => tally
                            .rollup_latencies
                            .push(sent.elapsed().as_secs_f64() * 1e3),
                        Err(message) => tally.errors.record(|| message),
                    }
                }
            }
            tally
        }));
    }
    let tally = merge(join_all(tasks).await?);
    let seconds = started.elapsed().as_secs_f64();
    let (rss_peak, server_cpu, loadgen_cpu) = meter.finish(server);
    let cursor_after = change_cursor(&probe, base).await?;
    let writer = writer_use::between(
        writer_before,
        writer_use::sample(&probe, base).await,
        seconds,
    );

    let rollups = tally.rollup_latencies.len() as u64;
    let mut notes = vec![
        format!(
            "{} runs, {} runs ({ops_per_request} ops) per request, {} clients; {} requests of \
             {:.0} KiB on average (encoded in {prepare_seconds:.2} s before the clock)",
            shape.runs,
            shape.runs_per_request,
            shape.clients,
            batches.len(),
            body_bytes as f64 / batches.len().max(1) as f64 / 1024.0
        ),
        if shape.rollups {
            format!(
                "rollups: each run's rollup POSTed right after its batch (not a batch op); the \
                 rate counts batch ops only; with the {rollups} rollups: {:.0} writes/s; rollup \
                 request p50 {:.3} ms",
                (tally.writes + rollups) as f64 / seconds,
                Distribution::of(tally.rollup_latencies.clone()).p50
            )
        } else {
            "rollups: not sent (--no-batch-rollup): the time is batch requests only".to_owned()
        },
    ];
    let mut violations = change_log_check(cursor_before, cursor_after, shape.runs, &mut notes);
    if tally.abandoned {
        notes.push(format!(
            "TIME LIMIT ({time_limit:?}) reached: batches were left undone"
        ));
        violations += 1;
    }
    let mut extra = Map::new();
    if let Some(writer) = writer {
        writer.report(&mut notes, &mut extra);
    }
    extra.insert("runs".into(), json!(shape.runs));
    extra.insert("runsPerRequest".into(), json!(shape.runs_per_request));
    extra.insert("opsPerRequest".into(), json!(ops_per_request));
    extra.insert("clients".into(), json!(shape.clients));
    extra.insert("batchOps".into(), json!(tally.writes));
    extra.insert("rollups".into(), json!(rollups));
    extra.insert(
        "writesPerSecondWithRollups".into(),
        json!(((tally.writes + rollups) as f64 / seconds).round()),
    );
    extra.insert(
        "changeLogGrowth".into(),
        json!(cursor_after - cursor_before),
    );
    Ok(PhaseReport {
        name: shape.name.clone(),
        unit: "ops/s",
        throughput: tally.writes as f64 / seconds,
        requests: tally.requests,
        seconds,
        latency: Some(Distribution::of(tally.latencies)),
        errors: tally.errors,
        violations,
        rss_peak,
        server_cpu,
        loadgen_cpu,
        notes,
        extra,
    })
}
