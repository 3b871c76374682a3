//! The WAL stays bounded under writes that never pause: imports committed back to back by
//! several callers, far more data than the WAL's rewind threshold. Before the writer took over
//! rewinding, the housekeeper's own `RESTART` starved (it waited for the write lock while
//! holding the checkpoint lock) and the WAL grew to several times the data written.
//!
//! In a debug build the writes are slow enough that the old housekeeper sometimes kept up, so
//! this guards the property (a bound far under the data written) rather than reproducing the
//! old failure every time; the release benchmark `import_workload` reproduces it (766 MB of WAL
//! after 200,000 spans before, 34 - 83 MB after).

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, ImportedEnd, ImportedSpan, JsonObject, SpanKind, SpanOrigin, SpanOutcome,
    SpanUsage,
};
use flightlog_core::SystemClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};
use serde_json::json;

const BATCHES: u64 = 100;
const SPANS_PER_BATCH: u64 = 500;

fn batch(number: u64) -> Vec<ImportedSpan> {
    (0..SPANS_PER_BATCH)
        .map(|index| {
            let n = number * SPANS_PER_BATCH + index;
            let mut attrs = JsonObject::new();
            // ~2 KB of attrs per span: 100 MB for the whole test.
            attrs.insert(
                "prompt".into(),
                json!(format!("{n:08} {}", "y".repeat(2_000))),
            );
            ImportedSpan {
                span_id: format!("{:016x}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                run_id: format!("run-{}", n / 10),
                parent_span_id: None,
                name: "span".into(),
                kind: SpanKind::Other,
                origin: SpanOrigin::Otlp,
                session_id: None,
                job_name: None,
                attrs: attrs.into(),
                started_at: 1_000 + n as i64,
                end: Some(ImportedEnd {
                    ended_at: 2_000 + n as i64,
                    outcome: SpanOutcome::Success,
                    reason: None,
                }),
                usage: SpanUsage::default(),
                events: Vec::new(),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_imports_keep_the_wal_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = Arc::new(SqliteActivityStore::with_identity(
        db,
        Arc::new(SystemClock),
        "otlp",
    ));
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut callers = Vec::new();
    for _ in 0..4 {
        let store = Arc::clone(&store);
        let next = Arc::clone(&next);
        callers.push(tokio::spawn(async move {
            loop {
                let number = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if number >= BATCHES {
                    break;
                }
                store.import_spans(batch(number)).await.unwrap();
            }
        }));
    }
    for caller in callers {
        caller.await.unwrap();
    }
    // Measured while the store is still open (no final checkpoint has run).
    let wal = std::fs::metadata(dir.path().join("wal.db-wal"))
        .unwrap()
        .len();
    let data = std::fs::metadata(&path).unwrap().len();
    assert!(
        wal <= 96 * 1024 * 1024,
        "the WAL grew to {} MB for {} MB of database",
        wal / 1_000_000,
        data / 1_000_000
    );
}
