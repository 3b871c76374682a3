//! Server restarts during live streams, through the real binary (product.md, "Reliability":
//! "Server restart during a live stream: the client resumes with `Last-Event-ID` and misses
//! nothing").
//!
//! One database file served by three lives of `flightlog serve` in turn while clients write to
//! whichever life serves: the first is killed with SIGKILL mid-load (a crash: writes in flight
//! are cut, the file is left as the kernel had it), the second stopped with SIGTERM (a clean
//! stop ends each stream with its terminating chunk). Three followers reconnect to each new life
//! with the `Last-Event-ID` of the last event they received, as an EventSource does: one on the
//! global change stream, one on a run stream, one on an engagement stream. Each must end with
//! exactly what the file holds after the last life (every change id once, in order; every seq of
//! its run or engagement once, in order), every write acknowledged before a crash among it, and
//! events from every life (so each resume really continued a stream the restart had cut). The
//! second and third lives' boot sweeps close what the earlier lives left open; those closes are
//! changes the followers must see too.

#[path = "support/http.rs"]
#[allow(dead_code)] // Each test file uses its own part of the shared helpers.
mod http;
#[path = "support/sse.rs"]
mod sse;
mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http::try_request_with_head;
use serde_json::{json, Value};
use support::{Scratch, ServeProcess};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long each life serves the writers at least before it is ended (and until every
/// follower has heard from it, at most [`HEARD_WITHIN`]).
const LIFE: Duration = Duration::from_millis(900);
/// How long a life may take to reach every follower (a busy machine is slow, never this slow).
const HEARD_WITHIN: Duration = Duration::from_secs(30);
/// The followers: the change stream, the run stream, the engagement stream.
const FOLLOWERS: usize = 3;
/// How long the followers may take, after the last write, to reach the end of what is stored.
const CATCH_UP: Duration = Duration::from_secs(30);
/// The run the run-stream follower watches: a root span that one writer adds events to.
const WATCHED_RUN: &str = "watched-run";
const WATCHED_ROOT: &str = "watched-root";
const ENGAGEMENT: &str = "restarted-engagement";

/// `flightlog serve` on `db` at 127.0.0.1:0, always the same instance, so each life's boot
/// sweep closes what the life before it left open.
fn serve(folder: &Path, db: &Path) -> ServeProcess {
    let command = support::serve_command(folder, db, &["--instance", "restarts"]);
    ServeProcess::spawn(command, START_TIMEOUT)
}

/// What the test's threads share: where the server is now (none between two lives), which life
/// it is, and when to stop.
#[derive(Default)]
struct Shared {
    addr: Mutex<Option<SocketAddr>>,
    /// 1, 2, 3: the life serving now (0 before the first).
    life: AtomicI64,
    stop_writing: AtomicBool,
    /// Set once the writers stopped and the file's final state was read: the followers stop
    /// when they have received up to it.
    final_read: AtomicBool,
    /// The newest life each follower has received an event from.
    heard: [AtomicI64; FOLLOWERS],
}

impl Shared {
    fn addr(&self) -> Option<SocketAddr> {
        *self.addr.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn serve_at(&self, addr: Option<SocketAddr>) {
        *self.addr.lock().unwrap_or_else(PoisonError::into_inner) = addr;
    }

    /// Let the life serving now serve for [`LIFE`], and on until every follower has heard from
    /// it, so that each restart cuts a stream that was carrying events.
    fn serve_until_heard(&self) {
        std::thread::sleep(LIFE);
        let life = self.life.load(Ordering::SeqCst);
        let started = Instant::now();
        while self
            .heard
            .iter()
            .any(|heard| heard.load(Ordering::SeqCst) < life)
        {
            assert!(
                started.elapsed() < HEARD_WITHIN,
                "life {life}: not every follower heard from it within {HEARD_WITHIN:?}: {:?}",
                self.heard
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A request to the life serving now: `None` when there is none, or the connection failed or
/// was cut (a restart), or the server was too busy (503).
fn send(
    shared: &Shared,
    method: &str,
    path: &str,
    writer: Option<&str>,
    body: Value,
) -> Option<(u16, Value)> {
    let addr = shared.addr()?;
    match try_request_with_head(addr, method, path, writer, Some(body)) {
        Ok((503, _, _)) | Err(_) => None,
        Ok((status, _, answer)) => Some((status, answer)),
    }
}

/// What the writers had acknowledged.
#[derive(Default)]
struct Acknowledged {
    span_starts: Vec<String>,
    /// Events added to the watched root, by their `seq` in the answer.
    watched_events: usize,
    journal_seqs: Vec<i64>,
}

/// Writer `index` until told to stop: spans started and ended in runs of its own (writer 0
/// names no `Flightlog-Writer`, so its spans are the server's and a restart's sweep closes the
/// ones it left open; writer 1 names itself), and writer 1 also adds an event to the watched
/// root and appends to the engagement each round. A write whose answer never came (a restart
/// cut it) is not retried: it may or may not be stored, and the followers must agree with the
/// file either way.
fn writer(index: usize, shared: Arc<Shared>) -> JoinHandle<Acknowledged> {
    std::thread::spawn(move || {
        let name = (index == 1).then_some("restart-test-writer");
        let mut acknowledged = Acknowledged::default();
        let mut round = 0usize;
        while !shared.stop_writing.load(Ordering::SeqCst) {
            round += 1;
            if shared.addr().is_none() {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            let span_id = format!("w{index}-{round}");
            let start = json!({
                "spanId": span_id,
                "runId": format!("run-w{index}-{}", round / 20),
                "name": "tool call",
                "kind": "tool",
                "origin": "session",
            });
            if let Some((201, _)) = send(&shared, "POST", "/v1/activity/spans", name, start) {
                acknowledged.span_starts.push(span_id.clone());
            }
            if round.is_multiple_of(2) {
                send(
                    &shared,
                    "POST",
                    &format!("/v1/activity/spans/{span_id}/end"),
                    name,
                    json!({"outcome": "ok"}),
                );
            }
            if index != 1 {
                continue;
            }
            let event = json!({"eventType": "note", "payload": {"round": round}});
            let path = format!("/v1/activity/spans/{WATCHED_ROOT}/events");
            if let Some((201, _)) = send(&shared, "POST", &path, name, event) {
                acknowledged.watched_events += 1;
            }
            let append = json!({"type": "note", "at": round, "data": {"text": "still here"}});
            let path = format!("/v1/engagements/{ENGAGEMENT}/events");
            if let Some((201, answer)) = send(&shared, "POST", &path, name, append) {
                acknowledged
                    .journal_seqs
                    .push(answer["seq"].as_i64().expect("an appended event's seq"));
            }
        }
        acknowledged
    })
}

/// What a follower received: each event with the life of the server that sent it.
#[derive(Debug, Default)]
struct Followed {
    events: Vec<(i64, sse::Event)>,
    /// Connections that answered 200 (the first and each resume).
    connections: usize,
    /// How each connection that answered ended (other than by the follower stopping).
    endings: Vec<String>,
}

/// Follow `path` across the server's lives: the first connection with `first_query`, each
/// later one with the `Last-Event-ID` of the last event received, until the last event's
/// `position` reaches `newest` (looked at only once the file's final state was read).
fn follower(
    shared: Arc<Shared>,
    slot: usize,
    (path, first_query): (&'static str, &'static str),
    position: fn(&sse::Event) -> Option<i64>,
    newest: Arc<AtomicI64>,
) -> JoinHandle<Followed> {
    let done = move |events: &[(i64, sse::Event)]| {
        events
            .last()
            .is_some_and(|(_, event)| position(event) >= Some(newest.load(Ordering::SeqCst)))
    };
    std::thread::spawn(move || {
        let followed = Mutex::new(Followed::default());
        let deadline = Instant::now() + 3 * (LIFE + HEARD_WITHIN + START_TIMEOUT) + CATCH_UP;
        let finished = || {
            shared.final_read.load(Ordering::SeqCst)
                && done(
                    &followed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .events,
                )
        };
        while !finished() {
            assert!(
                Instant::now() < deadline,
                "{path}: the follower did not reach the end of what is stored: {:?}",
                followed.lock().unwrap_or_else(PoisonError::into_inner)
            );
            let Some(addr) = shared.addr() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            // The life is set before its address, and the next life starts only after this one
            // ended: whatever this connection receives, this life sent.
            let life = shared.life.load(Ordering::SeqCst);
            let last_id = followed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .events
                .last()
                .and_then(|(_, event)| event.id.clone());
            let target = match last_id {
                Some(_) => path.to_owned(),
                None => format!("{path}{first_query}"),
            };
            let mut answered = false;
            let ended = sse::follow(
                addr,
                &target,
                last_id.as_deref(),
                Duration::from_secs(20),
                |event| {
                    let mut followed = followed.lock().unwrap_or_else(PoisonError::into_inner);
                    if !answered {
                        answered = true;
                        followed.connections += 1;
                    }
                    followed.events.push((life, event));
                    shared.heard[slot].fetch_max(life, Ordering::SeqCst);
                },
                &finished,
            );
            let mut followed = followed.lock().unwrap_or_else(PoisonError::into_inner);
            match ended {
                Ok(sse::Ended::ByCaller) => {}
                Ok(sse::Ended::ByServer) => followed.endings.push("ended by the server".into()),
                // Refused (no server yet) or cut (a crash): try again.
                Err(error) => followed.endings.push(error.to_string()),
            }
            drop(followed);
            std::thread::sleep(Duration::from_millis(5));
        }
        followed
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    })
}

/// Every change the file holds, through `GET /v1/activity/changes`.
fn stored_changes(addr: SocketAddr) -> Vec<Value> {
    let mut changes: Vec<Value> = Vec::new();
    loop {
        let after = changes.last().map_or(0, |change| {
            change["changeId"].as_i64().expect("a change id")
        });
        let path = format!("/v1/activity/changes?after={after}&limit=10000");
        let (status, _, page) =
            try_request_with_head(addr, "GET", &path, None, None).expect("read the change log");
        assert_eq!(status, 200, "{page}");
        let page = page.as_array().expect("a page of changes").clone();
        if page.is_empty() {
            return changes;
        }
        changes.extend(page);
    }
}

fn data(event: &sse::Event) -> Value {
    serde_json::from_str(&event.data)
        .unwrap_or_else(|error| panic!("an event's data is not JSON ({error}): {event:?}"))
}

/// The lives that sent events, in the order they did.
fn lives(events: &[(i64, sse::Event)]) -> Vec<i64> {
    let mut lives: Vec<i64> = events.iter().map(|(life, _)| *life).collect();
    lives.dedup();
    lives
}

#[test]
fn stream_clients_resume_across_a_crash_and_a_clean_restart_and_miss_nothing() {
    let scratch = Scratch::new("restart-streams", "resume");
    let db = scratch.0.join("flightlog.db");
    let shared = Arc::new(Shared::default());

    let mut server = serve(&scratch.0, &db);
    let setup = [
        (
            "/v1/activity/spans",
            json!({"spanId": WATCHED_ROOT, "runId": WATCHED_RUN, "name": "turn",
                   "kind": "turn", "origin": "session"}),
        ),
        (
            "/v1/engagements/restarted-engagement/events",
            json!({"type": "note", "at": 0, "data": {"text": "opened"}}),
        ),
    ];
    for (path, body) in setup {
        let (status, _, answer) = try_request_with_head(
            server.addr,
            "POST",
            path,
            Some("restart-test-writer"),
            Some(body),
        )
        .expect("set up");
        assert_eq!(status, 201, "{path}: {answer}");
    }
    shared.serve_at(Some(server.addr));
    shared.life.store(1, Ordering::SeqCst);

    // The followers' ends, each read once the file's final state is known.
    let newest_change = Arc::new(AtomicI64::new(i64::MAX));
    let watched_seq = Arc::new(AtomicI64::new(i64::MAX));
    let journal_seq = Arc::new(AtomicI64::new(i64::MAX));
    let changes = follower(
        Arc::clone(&shared),
        0,
        ("/v1/activity/changes/stream", "?after=0"),
        |event| event.id.as_deref().and_then(|id| id.parse::<i64>().ok()),
        Arc::clone(&newest_change),
    );
    let run = follower(
        Arc::clone(&shared),
        1,
        ("/v1/activity/runs/watched-run/stream", ""),
        |event| match event.kind.as_str() {
            "snapshot" => data(event)["highWaterSeq"].as_i64(),
            _ => data(event)["seq"].as_i64(),
        },
        Arc::clone(&watched_seq),
    );
    let journal = follower(
        Arc::clone(&shared),
        2,
        ("/v1/engagements/restarted-engagement/stream", "?fromSeq=0"),
        |event| data(event)["seq"].as_i64(),
        Arc::clone(&journal_seq),
    );
    let writers: Vec<_> = (0..2)
        .map(|index| writer(index, Arc::clone(&shared)))
        .collect();

    // The first life crashes mid-load, the second stops cleanly, the third serves to the end.
    shared.serve_until_heard();
    shared.serve_at(None);
    server.child.kill().expect("SIGKILL the first life");
    server.child.wait().expect("reap the first life");
    for (life, last) in [(2, false), (3, true)] {
        let next = serve(&scratch.0, &db);
        shared.life.store(life, Ordering::SeqCst);
        shared.serve_at(Some(next.addr));
        let output = std::mem::replace(&mut server, next).output();
        assert!(!output.contains("panicked"), "{output}");
        shared.serve_until_heard();
        if !last {
            shared.serve_at(None);
            server.stop_cleanly(STOP_TIMEOUT);
        }
    }
    shared.stop_writing.store(true, Ordering::SeqCst);
    let acknowledged: Vec<Acknowledged> = writers
        .into_iter()
        .map(|writer| writer.join().expect("a writer"))
        .collect();

    // What the file holds after the three lives.
    let stored = stored_changes(server.addr);
    let newest = stored
        .last()
        .and_then(|change| change["changeId"].as_i64())
        .expect("changes were stored");
    let (status, _, snapshot) = try_request_with_head(
        server.addr,
        "GET",
        "/v1/activity/runs/watched-run/snapshot",
        None,
        None,
    )
    .expect("read the watched run");
    assert_eq!(status, 200, "{snapshot}");
    let (status, _, journal_events) = try_request_with_head(
        server.addr,
        "GET",
        "/v1/engagements/restarted-engagement/events?fromSeq=0",
        None,
        None,
    )
    .expect("read the engagement");
    assert_eq!(status, 200, "{journal_events}");
    let journal_events = journal_events.as_array().expect("events").clone();
    newest_change.store(newest, Ordering::SeqCst);
    watched_seq.store(
        snapshot["highWaterSeq"].as_i64().expect("a high-water seq"),
        Ordering::SeqCst,
    );
    journal_seq.store(
        journal_events
            .last()
            .and_then(|event| event["seq"].as_i64())
            .expect("journal events"),
        Ordering::SeqCst,
    );
    shared.final_read.store(true, Ordering::SeqCst);
    let changes = changes.join().expect("the change follower");
    let run = run.join().expect("the run follower");
    let journal = journal.join().expect("the journal follower");
    server.stop_cleanly(STOP_TIMEOUT);

    println!(
        "stored {} changes ({} acknowledged starts); followers: changes {} events over {} \
         connections, run {} over {}, engagement {} over {}; endings {:?}",
        stored.len(),
        acknowledged
            .iter()
            .map(|a| a.span_starts.len())
            .sum::<usize>(),
        changes.events.len(),
        changes.connections,
        run.events.len(),
        run.connections,
        journal.events.len(),
        journal.connections,
        changes.endings
    );
    // The change stream: exactly the log, every change once, in order, as stored.
    let identity = |change: &Value| {
        (
            change["changeId"].as_i64(),
            change["runId"].as_str().map(str::to_owned),
            change["seq"].as_i64(),
            change["kind"].as_str().map(str::to_owned),
        )
    };
    let streamed: Vec<_> = changes
        .events
        .iter()
        .map(|(_, event)| {
            assert_eq!(event.kind, "change", "{event:?}");
            let change = data(event);
            assert_eq!(
                event.id.as_deref(),
                Some(change["changeId"].to_string().as_str()),
                "{event:?}"
            );
            identity(&change)
        })
        .collect();
    let logged: Vec<_> = stored.iter().map(identity).collect();
    assert!(
        streamed == logged,
        "the change stream differs from the log: {} streamed, {} logged; first difference at {:?}",
        streamed.len(),
        logged.len(),
        streamed.iter().zip(&logged).position(|(a, b)| a != b)
    );
    // Every acknowledged start is stored (so streamed), the crash's included.
    let started: BTreeSet<&str> = stored
        .iter()
        .filter(|change| change["kind"] == "span")
        .filter_map(|change| change["span"]["spanId"].as_str())
        .collect();
    for acknowledged in &acknowledged {
        for span_id in &acknowledged.span_starts {
            assert!(
                started.contains(span_id.as_str()),
                "acknowledged {span_id} is not stored"
            );
        }
    }
    // The restarts' sweeps closed writer 0's leftovers, and the stream carried those closes.
    let swept = stored
        .iter()
        .filter(|change| change["span"]["outcomeReason"] == "server restarted")
        .count();
    assert!(swept > 0, "no span was closed by a restart's sweep");

    // The run stream: its snapshot once, then every later seq of the run once, in order.
    let (first, rest) = run
        .events
        .split_first()
        .expect("the run stream sent its snapshot");
    assert_eq!(first.1.kind, "snapshot", "{:?}", first.1);
    let mut expected_seq = data(&first.1)["highWaterSeq"]
        .as_i64()
        .expect("a high-water seq");
    for (_, event) in rest {
        assert_eq!(event.kind, "change", "the run stream sent {event:?}");
        expected_seq += 1;
        assert_eq!(data(event)["seq"].as_i64(), Some(expected_seq), "{event:?}");
    }
    assert_eq!(
        Some(expected_seq),
        snapshot["highWaterSeq"].as_i64(),
        "the run stream stopped short"
    );
    assert!(
        acknowledged[1].watched_events > 0,
        "no event was added to the watched run"
    );

    // The engagement stream: every event the engagement holds, once, in seq order.
    let streamed_seqs: Vec<Option<i64>> = journal
        .events
        .iter()
        .map(|(_, event)| {
            assert_eq!(
                event.kind, "journal",
                "the engagement stream sent {event:?}"
            );
            data(event)["seq"].as_i64()
        })
        .collect();
    let held_seqs: Vec<Option<i64>> = journal_events
        .iter()
        .map(|event| event["seq"].as_i64())
        .collect();
    assert_eq!(
        streamed_seqs, held_seqs,
        "the engagement stream differs from the journal"
    );
    for seq in &acknowledged[1].journal_seqs {
        assert!(
            held_seqs.contains(&Some(*seq)),
            "acknowledged seq {seq} is not held"
        );
    }

    // Each follower heard every life: it resumed after each restart rather than starting over.
    for (name, followed) in [
        ("changes", &changes),
        ("run", &run),
        ("engagement", &journal),
    ] {
        assert_eq!(
            lives(&followed.events),
            vec![1, 2, 3],
            "{name}: events by life; endings {:?}",
            followed.endings
        );
        assert!(
            followed.connections >= 3,
            "{name}: {} connections answered",
            followed.connections
        );
    }
}
