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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_attrs_are_packed_once_trained_and_read_back_exactly() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("packed.db");
    let (db, store) = open(&path);

    // Training: the dictionary is trained in the background from the first 256 KB of long
    // texts (attrs and event payloads) a database sees.
    let mut trained = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 0;
    while !trained && Instant::now() < deadline {
        let writes = (0..100)
            .map(|_| {
                n += 1;
                ActivityWrite::StartSpan(start(
                    &format!("early-{n}"),
                    &format!("run-{n}"),
                    otlp_like_attrs(n),
                ))
            })
            .collect();
        for result in store.write_batch(writes).await {
            result.expect("start a training span");
        }
        let probe = format!("probe-{n}");
        store
            .start_span(start(&probe, "probe-run", otlp_like_attrs(n)))
            .await
            .expect("start a probe span");
        let conn = rusqlite::Connection::open(&path).expect("open the file");
        trained = conn
            .query_row(
                "SELECT typeof(attrs) = 'blob' FROM activity_spans WHERE span_id = ?1",
                [&probe],
                |row| row.get(0),
            )
            .expect("read the probe");
        if !trained {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(trained, "no dictionary after {n} spans");

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
    let changes = store.changes_since(0, -1).await.expect("change log");
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
