//! Group commit keeps each write atomic on its own: a failing write in a group never takes its
//! neighbours down, and the neighbours' seqs and change ids stay dense.

use std::sync::Arc;

use flightlog_core::activity::{ActivityStore, SpanKind, SpanOrigin, StartSpanInput, StoreError};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

fn span(span_id: String, run_id: &str) -> StartSpanInput {
    StartSpanInput {
        span_id,
        run_id: run_id.into(),
        parent_span_id: None,
        name: "step".into(),
        kind: SpanKind::Tool,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_ids_fail_alone_inside_busy_groups() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("g.db"))).unwrap();
    let store: Arc<dyn ActivityStore> = Arc::new(SqliteActivityStore::with_identity(
        db.clone(),
        Arc::new(ManualClock::new(5)),
        "w",
    ));
    for i in 0..20 {
        store
            .start_span(span(format!("dup-{i}"), "seed"))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for i in 0..400 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // Every fifth write reuses a seeded id and must fail; the rest must all succeed.
            let id = if i % 5 == 0 {
                format!("dup-{}", i % 20)
            } else {
                format!("new-{i}")
            };
            (
                i,
                store.start_span(span(id, &format!("run-{}", i % 7))).await,
            )
        }));
    }
    for task in tasks {
        let (i, result) = task.await.unwrap();
        match result {
            Err(StoreError::DuplicateSpan { .. }) => assert_eq!(i % 5, 0, "write {i} failed"),
            Ok(_) => assert_ne!(i % 5, 0, "duplicate {i} succeeded"),
            Err(other) => panic!("write {i}: unexpected {other}"),
        }
    }
    let groups = db
        .writer_stats()
        .groups
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(groups < 420, "writes were grouped ({groups} transactions)");
    let changes = store.changes_since(0, 10_000).await.unwrap();
    assert_eq!(changes.len(), 20 + 320);
    for (index, change) in changes.iter().enumerate() {
        assert_eq!(change.change_id, index as i64 + 1, "change ids dense");
    }
    for run in 0..7 {
        let run_id = format!("run-{run}");
        let seqs: Vec<i64> = changes
            .iter()
            .filter(|c| c.run_id == run_id)
            .map(|c| c.seq)
            .collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as i64).collect::<Vec<_>>(),
            "{run_id}"
        );
    }
}
