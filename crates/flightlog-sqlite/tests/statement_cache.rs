//! Regression guard for the bundled SQLite: a cached statement with a bound parameter and an
//! `ORDER BY` (the shape of every per-run read) must not be re-prepared on each use.
//!
//! With rusqlite 0.43 (SQLite 3.54.1) every such statement was recompiled on every execution,
//! because rusqlite clears bindings when a statement returns to its cache and that SQLite marked
//! these statements as depending on their bound values. It doubled snapshot latency and cost the
//! writer a parse per lookup. An upgrade that brings it back fails here first.

use flightlog_sqlite::{SqliteConfig, SqliteDatabase};
use rusqlite::StatementStatus;

#[test]
fn cached_parameterized_ordered_queries_are_not_reprepared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.db");
    // Create the real schema.
    drop(SqliteDatabase::open(SqliteConfig::new(&path)).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let sql = "SELECT span_key FROM activity_spans s WHERE s.run_key = ?1 \
               ORDER BY s.started_at, s.span_key";
    for run_key in 0..50i64 {
        let mut stmt = conn.prepare_cached(sql).unwrap();
        let rows: Vec<i64> = stmt
            .query_map([run_key], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(rows.is_empty());
    }
    let stmt = conn.prepare_cached(sql).unwrap();
    let reprepared = stmt.get_status(StatementStatus::RePrepare);
    assert!(reprepared <= 1, "re-prepared {reprepared} times in 50 uses");
}
