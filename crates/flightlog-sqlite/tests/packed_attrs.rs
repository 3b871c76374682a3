//! Span attrs packed with the database's dictionary (schema version 8): once the dictionary is
//! trained, long attrs are stored as small zstd frames, and every read and every write that
//! merges into them sees exactly the JSON that was written, in this process and in another
//! handle on the same file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{
    ActivityStore, ActivityWrite, EndSpanInput, JsonObject, SpanKind, SpanOrigin, SpanOutcome,
    SpanPatch, StartSpanInput,
};
use flightlog_core::SystemClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};
use serde_json::json;

/// Attrs shaped like an OTLP model span's: its own attributes, then the resource's and the
/// scope's, the same for every span of the service (about 500 bytes of JSON).
fn otlp_like_attrs(n: usize) -> JsonObject {
    let attrs = json!({
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-20250514",
        "gen_ai.response.model": "claude-sonnet-4-20250514",
        "gen_ai.response.id": format!("msg_{n:016x}"),
        "gen_ai.request.max_tokens": 8192,
        "gen_ai.usage.input_tokens": 1000 + n % 700,
        "gen_ai.usage.output_tokens": 100 + n % 90,
        "gen_ai.response.finish_reasons": ["tool_use"],
        "resource": {
            "service.name": "coder-agent",
            "service.version": "1.4.2",
            "deployment.environment.name": "test",
        },
        "scope": {"name": "agents", "version": "0.1.0"},
        "otel.span_kind": "client",
    });
    match attrs {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

fn start(span_id: &str, run_id: &str, attrs: JsonObject) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.to_owned(),
        run_id: run_id.to_owned(),
        parent_span_id: None,
        name: "chat".to_owned(),
        kind: SpanKind::Model,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: Some(attrs),
        started_at: None,
    }
}

/// Start the spans `{prefix}-{n}` (in runs `{prefix}-run-{n}`) for every `n` of `numbers`, with
/// `make_attrs(n)`, in one batch.
async fn start_numbered(
    store: &SqliteActivityStore,
    prefix: &str,
    numbers: impl Iterator<Item = usize>,
    make_attrs: fn(usize) -> JsonObject,
) {
    let writes = numbers
        .map(|n| {
            ActivityWrite::StartSpan(start(
                &format!("{prefix}-{n}"),
                &format!("{prefix}-run-{n}"),
                make_attrs(n),
            ))
        })
        .collect();
    for result in store.write_batch(writes).await {
        result.expect("start a span");
    }
}

fn open(path: &std::path::Path) -> (Arc<SqliteDatabase>, SqliteActivityStore) {
    let db = SqliteDatabase::open(SqliteConfig::new(path)).expect("open the database");
    let store = SqliteActivityStore::new(Arc::clone(&db), Arc::new(SystemClock));
    (db, store)
}

/// `(spans whose attrs are packed, bytes of all attrs as stored)`, read with plain SQL.
fn stored_attrs(path: &std::path::Path) -> (i64, i64) {
    let conn = rusqlite::Connection::open(path).expect("open the file");
    conn.query_row(
        "SELECT COALESCE(SUM(typeof(attrs) = 'blob'), 0), COALESCE(SUM(length(attrs)), 0) \
         FROM activity_spans WHERE span_id LIKE 'late-%'",
        [],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )
    .expect("read the attrs columns")
}

/// Write spans with `make_attrs` attrs until a new span's attrs are stored packed: the
/// dictionary is trained in the background from the first 256 KB of long texts (attrs and event
/// payloads) a database sees.
async fn train_until_packed(
    store: &SqliteActivityStore,
    path: &std::path::Path,
    prefix: &str,
    make_attrs: fn(usize) -> JsonObject,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while Instant::now() < deadline {
        start_numbered(store, prefix, n + 1..n + 101, make_attrs).await;
        n += 100;
        let probe = format!("{prefix}-probe-{n}");
        store
            .start_span(start(&probe, "probe-run", make_attrs(n)))
            .await
            .expect("start a probe span");
        let conn = rusqlite::Connection::open(path).expect("open the file");
        let packed: bool = conn
            .query_row(
                "SELECT typeof(attrs) = 'blob' FROM activity_spans WHERE span_id = ?1",
                [&probe],
                |row| row.get(0),
            )
            .expect("read the probe");
        if packed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no dictionary after {n} spans");
}

/// Attrs of another service entirely (another database's dictionary would pack them badly).
fn http_like_attrs(n: usize) -> JsonObject {
    let attrs = json!({
        "k8s.pod.name": format!("pod-{n}"),
        "http.request.method": "GET",
        "url.full": format!("https://example.com/api/v2/items/{n}?q=zzz"),
        "note": "lorem ipsum dolor sit amet consectetur ".repeat(6),
    });
    match attrs {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// Two databases in one process each number their first dictionary 1. A thread that compressed
/// for one and then for the other used to reuse the first one's context (it was keyed by the
/// id), so the second database stored a frame it could never read.
#[tokio::test(flavor = "current_thread")]
async fn two_databases_in_one_process_keep_their_own_dictionaries() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (path_a, path_b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let (db_a, a) = open(&path_a);
    let (db_b, b) = open(&path_b);
    train_until_packed(&a, &path_a, "a", otlp_like_attrs).await;
    train_until_packed(&b, &path_b, "b", http_like_attrs).await;
    // One thread: compress for A, then for B, then read back both.
    a.start_span(start("a-late", "a-late-run", otlp_like_attrs(99_999)))
        .await
        .expect("start in A");
    b.start_span(start("b-late", "b-late-run", http_like_attrs(99_999)))
        .await
        .expect("start in B");
    for (store, span_id, attrs) in [
        (&a, "a-late", otlp_like_attrs(99_999)),
        (&b, "b-late", http_like_attrs(99_999)),
    ] {
        let span = store
            .get_span(span_id)
            .await
            .expect("read the span")
            .expect("the span exists");
        assert_eq!(span.attrs, attrs, "{span_id}");
    }
    db_a.close().await.expect("close A");
    db_b.close().await.expect("close B");
    // A fresh process's view: a new handle on B alone, read on a new thread (whose zstd
    // contexts are fresh: this thread's could decode a wrong frame the wrong way back).
    let read_back = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let (db, again) = open(&path_b);
            let span = again.get_span("b-late").await;
            db.close().await.expect("close");
            span
        })
    })
    .join()
    .expect("the reading thread");
    let span = read_back.expect("read the span").expect("the span exists");
    assert_eq!(span.attrs, http_like_attrs(99_999));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_attrs_are_packed_once_trained_and_read_back_exactly() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("packed.db");
    let (db, store) = open(&path);

    train_until_packed(&store, &path, "early", otlp_like_attrs).await;

    // Every write path that stores new attrs: a single start, a batch start, a patch and an
    // end that merge into packed attrs, a cascade close that keeps them.
    let count = 200;
    let mut expected: Vec<(String, JsonObject)> = Vec::new();
    for k in 0..count {
        let span_id = format!("late-{k}");
        let attrs = otlp_like_attrs(10_000 + k);
        if k % 2 == 0 {
            store
                .start_span(start(&span_id, &format!("late-run-{k}"), attrs.clone()))
                .await
                .expect("start");
        } else {
            let mut results = store
                .write_batch(vec![ActivityWrite::StartSpan(start(
                    &span_id,
                    &format!("late-run-{k}"),
                    attrs.clone(),
                ))])
                .await;
            results.remove(0).expect("batch start");
        }
        expected.push((span_id, attrs));
    }
    let (packed, stored_bytes) = stored_attrs(&path);
    let text_bytes: usize = expected
        .iter()
        .map(|(_, attrs)| serde_json::to_string(attrs).expect("attrs").len())
        .sum();
    assert_eq!(packed, count as i64, "every long attrs value is packed");
    assert!(
        (stored_bytes as usize) * 3 < text_bytes,
        "packed attrs take {stored_bytes} bytes against {text_bytes} as text"
    );

    let patch_update = json!({"patched": true, "gen_ai.usage.output_tokens": 7});
    let end_update = json!({"ended.by": "test"});
    let as_map = |value: &serde_json::Value| value.as_object().cloned().expect("an object");
    // late-0: patched, then ended with attrs; late-1: ended without; late-2: cascade-closed.
    assert!(store
        .patch_span(
            "late-0",
            SpanPatch {
                attrs: Some(as_map(&patch_update)),
                ..SpanPatch::default()
            },
        )
        .await
        .expect("patch"));
    assert!(store
        .end_span(
            "late-0",
            EndSpanInput {
                outcome: SpanOutcome::Success,
                reason: None,
                ended_at: None,
                usage: None,
                attrs: Some(as_map(&end_update)),
            },
        )
        .await
        .expect("end with attrs"));
    assert!(store
        .end_span(
            "late-1",
            EndSpanInput {
                outcome: SpanOutcome::Error,
                reason: Some("boom".into()),
                ended_at: None,
                usage: None,
                attrs: None,
            },
        )
        .await
        .expect("end"));
    assert_eq!(
        store
            .cascade_close("late-run-2", SpanOutcome::Cancelled, "stopped")
            .await
            .expect("cascade close"),
        1
    );
    let mut merged = expected[0].1.clone();
    for (key, value) in as_map(&patch_update).into_iter().chain(as_map(&end_update)) {
        merged.insert(key, value);
    }
    expected[0].1 = merged;

    // Read back through every read: span by id, run snapshot, the change log; and through a
    // second handle on the file, which must load the dictionary by its id.
    let changes = store.changes_since(0, 1_000_000).await.expect("change log");
    let (other_db, other) = open(&path);
    for (span_id, attrs) in &expected {
        let span = store
            .get_span(span_id)
            .await
            .expect("get span")
            .expect("the span exists");
        assert_eq!(&span.attrs, attrs, "{span_id} by id");
        let again = other
            .get_span(span_id)
            .await
            .expect("get span, second handle")
            .expect("the span exists");
        assert_eq!(&again.attrs, attrs, "{span_id} by id, second handle");
        let snapshot = store
            .snapshot_run(&span.run_id)
            .await
            .expect("snapshot")
            .expect("the run exists");
        assert_eq!(&snapshot.spans[0].attrs, attrs, "{span_id} in its snapshot");
        let newest_change = changes
            .iter()
            .rev()
            .find_map(|change| match &change.body {
                flightlog_core::activity::ChangeBody::Span { span } if &span.span_id == span_id => {
                    Some(span.attrs.clone())
                }
                _ => None,
            })
            .expect("the span's change");
        assert_eq!(&newest_change, attrs, "{span_id} in the change log");
    }
    let (packed_after, _) = stored_attrs(&path);
    assert_eq!(
        packed_after, count as i64,
        "merges store packed attrs again"
    );
    other_db.close().await.expect("close the second handle");
    db.close().await.expect("close");
}

/// A database of schema version 7 whose dictionary was trained on event payloads only (as every
/// earlier flightlog trained it) packs attrs poorly with it: on upgrade it trains one more
/// dictionary, on attrs as well, once; a later open does not train a third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_database_trains_a_dictionary_that_knows_attrs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("v7.db");
    {
        let mut conn = rusqlite::Connection::open(&path).expect("create the file");
        flightlog_sqlite::migrate_up_to(&mut conn, 7).expect("schema version 7");
        let payloads: Vec<Vec<u8>> = (0..600)
            .map(|n| {
                json!({
                    "tool": "bash",
                    "input": {"command": format!("cargo test --package crate_{n} -- --nocapture")},
                    "output": format!("test result: ok. {n} passed; 0 failed; finished in {n}.02s"),
                })
                .to_string()
                .into_bytes()
            })
            .collect();
        let dictionary = zstd::dict::from_samples(&payloads, 16 * 1024).expect("train");
        conn.execute(
            "INSERT INTO payload_dictionaries (dict_id, created_at, dictionary) VALUES (1, 0, ?1)",
            [dictionary],
        )
        .expect("store the payloads-only dictionary");
    }
    let dictionaries = |path: &std::path::Path| -> i64 {
        rusqlite::Connection::open(path)
            .expect("open the file")
            .query_row("SELECT count(*) FROM payload_dictionaries", [], |row| {
                row.get(0)
            })
            .expect("count the dictionaries")
    };
    let packed_with = |path: &std::path::Path, span_id: &str| -> Option<u32> {
        let packed: Option<Vec<u8>> = rusqlite::Connection::open(path)
            .expect("open the file")
            .query_row(
                "SELECT CASE typeof(attrs) WHEN 'blob' THEN attrs END FROM activity_spans \
                 WHERE span_id = ?1",
                [span_id],
                |row| row.get(0),
            )
            .expect("read the span");
        packed.map(|packed| u32::from_le_bytes([packed[0], packed[1], packed[2], packed[3]]))
    };

    let (db, store) = open(&path);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while dictionaries(&path) < 2 && Instant::now() < deadline {
        start_numbered(&store, "up", n + 1..n + 101, otlp_like_attrs).await;
        n += 100;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dictionaries(&path), 2, "no new dictionary after {n} spans");
    // The training thread commits the dictionary's row, then installs it in the codec: a span
    // encoded between the two is packed with the old one (this test failed once that way), so
    // the check is on the spans started once the install is done.
    let mut packed = None;
    for attempt in 0..200 {
        let span_id = format!("after-training-{attempt}");
        store
            .start_span(start(&span_id, "late-run", otlp_like_attrs(77)))
            .await
            .expect("start");
        packed = packed_with(&path, &span_id);
        if packed == Some(2) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        packed,
        Some(2),
        "spans after training are packed with the new dictionary"
    );
    let span = store
        .get_span("up-1")
        .await
        .expect("read an early span")
        .expect("it exists");
    assert_eq!(span.attrs, otlp_like_attrs(1));
    db.close().await.expect("close");

    // Reopened, the database keeps its attrs-aware dictionary and trains no other.
    let (db, store) = open(&path);
    start_numbered(&store, "reopened", 0..1_000, otlp_like_attrs).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(dictionaries(&path), 2);
    assert_eq!(packed_with(&path, "reopened-999"), Some(2));
    db.close().await.expect("close");
}

/// Packed attrs that cannot be unpacked (a damaged frame, a missing dictionary) read as `{}`,
/// as unreadable text attrs always did (the reference's `safeParse ?? {}`): the span, its run's
/// snapshot and the change log through it stay readable, and a merge starts from `{}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_packed_attrs_read_as_empty_and_block_nothing() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("damaged.db");
    let (db, store) = open(&path);
    train_until_packed(&store, &path, "early", otlp_like_attrs).await;
    let damages: [(&str, &[u8]); 4] = [
        ("truncated", &[1, 0, 0, 0, 0x28, 0xb5]),
        ("header-only", &[1, 0]),
        (
            "no-such-dictionary",
            &[99, 0, 0, 0, 0x28, 0xb5, 0x2f, 0xfd, 0, 0],
        ),
        ("garbage", &[1, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7]),
    ];
    for (name, _) in damages {
        store
            .start_span(start(name, &format!("run-{name}"), otlp_like_attrs(5)))
            .await
            .expect("start");
    }
    store
        .start_span(start("healthy", "run-healthy", otlp_like_attrs(6)))
        .await
        .expect("start");
    let cursor_before = store.latest_change_cursor().await.expect("cursor") - 5;
    {
        let conn = rusqlite::Connection::open(&path).expect("open the file");
        for (name, damage) in damages {
            conn.execute(
                "UPDATE activity_spans SET attrs = ?1 WHERE span_id = ?2",
                rusqlite::params![damage, name],
            )
            .expect("damage the attrs");
        }
    }
    for (name, _) in damages {
        let span = store
            .get_span(name)
            .await
            .expect("a damaged span still reads")
            .expect("it exists");
        assert!(span.attrs.is_empty(), "{name}: {:?}", span.attrs);
        let snapshot = store
            .snapshot_run(&format!("run-{name}"))
            .await
            .expect("its run's snapshot reads")
            .expect("the run exists");
        assert!(snapshot.spans[0].attrs.is_empty());
    }
    let changes = store
        .changes_since(cursor_before, 100)
        .await
        .expect("the change log reads through them");
    assert_eq!(changes.len(), 5);
    let healthy = store
        .get_span("healthy")
        .await
        .expect("read")
        .expect("it exists");
    assert_eq!(healthy.attrs, otlp_like_attrs(6));
    // A merge into damaged attrs starts from `{}`.
    let update = json!({"after": "damage"});
    assert!(store
        .patch_span(
            "garbage",
            SpanPatch {
                attrs: update.as_object().cloned(),
                ..SpanPatch::default()
            },
        )
        .await
        .expect("patch"));
    let patched = store
        .get_span("garbage")
        .await
        .expect("read")
        .expect("it exists");
    assert_eq!(Some(&patched.attrs), update.as_object());
    db.close().await.expect("close");
}
