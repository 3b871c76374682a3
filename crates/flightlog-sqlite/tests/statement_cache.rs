//! Regression guard for the bundled SQLite: a cached statement with a bound parameter and an
//! `ORDER BY` (the shape of every per-run read) must not be re-prepared on each use.
//!
//! With rusqlite 0.43 (SQLite 3.54.1) every such statement was recompiled on every execution,
//! because rusqlite clears bindings when a statement returns to its cache and that SQLite marked
//! these statements as depending on their bound values. It doubled snapshot latency and cost the
//! writer a parse per lookup. An upgrade that brings it back fails here first.
//!
//! The change-log page query was re-prepared on every use even on 3.53 (its rowid range and
//! `LIMIT` are bound values); `configure_connection` turns on the planner stability guarantee,
//! and the second test checks the store's connection settings keep it prepared.

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

/// The change-log page query (`changes_since`, every live stream's read): a range on the rowid
/// with a bound cursor, ordered, with a bound `LIMIT`.
#[test]
fn the_change_log_page_query_is_not_reprepared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.db");
    drop(SqliteDatabase::open(SqliteConfig::new(&path)).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    flightlog_sqlite::configure_connection(&conn, std::time::Duration::from_secs(1)).unwrap();
    let sql = "SELECT c.change_id, c.seq, e.ts FROM activity_changes c \
               JOIN activity_spans s ON s.span_key = c.span_key \
               LEFT JOIN activity_events e ON c.event_index IS NOT NULL \
                    AND e.span_key = c.span_key AND e.event_index = c.event_index \
               WHERE c.change_id > ?1 AND (c.event_index IS NULL OR e.span_key IS NOT NULL) \
               ORDER BY c.change_id LIMIT ?2";
    for cursor in 0..50i64 {
        let mut stmt = conn.prepare_cached(sql).unwrap();
        let rows: Vec<i64> = stmt
            .query_map([cursor, 500], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(rows.is_empty());
    }
    let stmt = conn.prepare_cached(sql).unwrap();
    let reprepared = stmt.get_status(StatementStatus::RePrepare);
    assert!(reprepared <= 1, "re-prepared {reprepared} times in 50 uses");
}
