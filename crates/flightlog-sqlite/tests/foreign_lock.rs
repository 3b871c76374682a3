//! Another connection holding the database's write lock for long (a `sqlite3` shell inside a
//! transaction, a tool's long write): a write waits at most `lock_retry_budget` and then fails
//! with `StoreError::Busy`, having written nothing, and succeeds once the lock is free again;
//! closing the store does not wait for the lock at all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{ActivityStore, SpanKind, SpanOrigin, StartSpanInput, StoreError};
use flightlog_core::ManualClock;
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

fn start(span_id: &str) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: format!("run-{span_id}"),
        parent_span_id: None,
        name: "turn".into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: Some(1_000),
    }
}

/// A connection of "another tool" holding the write lock until dropped or committed.
fn hold_write_lock(path: &std::path::Path) -> rusqlite::Connection {
    let holder = rusqlite::Connection::open(path).expect("open a second connection");
    holder
        .execute_batch("BEGIN EXCLUSIVE")
        .expect("take the write lock");
    holder
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_for_a_foreign_lock_only_its_budget_then_fails_busy_writing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    let mut config = SqliteConfig::new(&path);
    config.lock_retry_budget = Duration::from_millis(300);
    let db = SqliteDatabase::open(config).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w");
    store.start_span(start("before")).await.unwrap();

    let holder = hold_write_lock(&path);
    let asked = Instant::now();
    let refused = store.start_span(start("during")).await;
    let waited = asked.elapsed();
    assert!(matches!(refused, Err(StoreError::Busy(_))), "{refused:?}");
    let message = refused.err().map(|err| err.to_string()).unwrap_or_default();
    assert!(
        message.contains("write lock") && message.contains("retry later"),
        "{message}"
    );
    assert!(
        waited >= Duration::from_millis(300),
        "failed before its budget: {waited:?}"
    );
    holder.execute_batch("COMMIT").unwrap();
    drop(holder);

    // Nothing of the refused write was stored; the same write now goes through.
    assert!(store.get_span("during").await.unwrap().is_none());
    assert!(store.get_span("before").await.unwrap().is_some());
    store.start_span(start("during")).await.unwrap();
    assert!(store.get_span("during").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_does_not_wait_for_a_foreign_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("closing.db");
    let mut config = SqliteConfig::new(&path);
    config.lock_retry_budget = Duration::from_secs(600);
    let db = SqliteDatabase::open(config).unwrap();
    let store =
        SqliteActivityStore::with_identity(Arc::clone(&db), Arc::new(ManualClock::new(1_000)), "w");
    store.start_span(start("before")).await.unwrap();

    let holder = hold_write_lock(&path);
    let waiting = tokio::spawn(async move { store.start_span(start("stuck")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the write should be waiting");

    let closing = Instant::now();
    // The final checkpoint gives up after its own busy timeout (5 s at most) on the held lock.
    let closed = tokio::time::timeout(Duration::from_secs(30), db.close()).await;
    assert!(
        closed.is_ok(),
        "close waited for the lock: {:?}",
        closing.elapsed()
    );
    let outcome = waiting.await.unwrap();
    assert!(matches!(outcome, Err(StoreError::Closed)), "{outcome:?}");
    drop(holder);

    // Reopened: what was acknowledged is there, the refused write is not.
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(1_000)), "w");
    assert!(store.get_span("before").await.unwrap().is_some());
    assert!(store.get_span("stuck").await.unwrap().is_none());
}
