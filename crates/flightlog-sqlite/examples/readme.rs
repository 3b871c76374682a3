//! The README's "Using the store from Rust" example, kept here so that it compiles: `cargo test`
//! builds every example, so the README cannot drift from the API unnoticed.

use std::sync::Arc;

use flightlog_core::{activity::*, SystemClock};
use flightlog_sqlite::{SqliteActivityStore, SqliteConfig, SqliteDatabase};

#[tokio::main]
async fn main() -> Result<(), StoreError> {
    let dir = std::env::temp_dir().join(format!("flightlog-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|err| StoreError::Backend(err.to_string()))?;
    // The README writes "agents.db" in the working folder.
    let db = SqliteDatabase::open(SqliteConfig::new(dir.join("agents.db")))?;
    let store = SqliteActivityStore::new(Arc::clone(&db), Arc::new(SystemClock));
    store
        .start_span(StartSpanInput {
            span_id: "s1".into(),
            run_id: "r1".into(),
            parent_span_id: None,
            name: "turn".into(),
            kind: SpanKind::Turn,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: None,
        })
        .await?;
    db.close().await?; // the WAL copied into agents.db
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
