//! What the VFS is for: a commit of many pages reaches the file in a handful of write calls,
//! not two per page. (Its own test binary: the counters are per process.)

use rusqlite::{params, Connection, OpenFlags};

#[test]
fn a_commit_of_many_pages_is_written_with_few_calls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let vfs = flightlog_walvfs::register().unwrap();
    let conn = Connection::open_with_flags_and_vfs(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        vfs,
    )
    .unwrap();
    conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get::<_, String>(0))
        .unwrap();
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .unwrap();
    let before = flightlog_walvfs::wal_write_counts();
    let commits: u64 = 50;
    for round in 0..commits as i64 {
        let tx = conn.unchecked_transaction().unwrap();
        // ~8 pages of rows per commit.
        for i in 0..40i64 {
            tx.execute(
                "INSERT INTO t VALUES (?1, ?2)",
                params![round * 40 + i, "x".repeat(800)],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    let after = flightlog_walvfs::wal_write_counts();
    let requested = after.requested - before.requested;
    let issued = after.issued - before.issued;
    // SQLite asks for two writes per frame: at least 8 frames, so 16 writes, per commit.
    assert!(requested >= commits * 16, "requested {requested}");
    // Gathered: one call per commit (two when a commit is larger than one call may carry).
    assert!(
        issued <= commits * 2,
        "issued {issued} for {commits} commits"
    );
}
