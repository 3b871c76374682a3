//! The VFS against real SQLite files: what a connection writes through it is exactly what other
//! connections — on the stock VFS, in this process or after a reopen — read, in every WAL path
//! SQLite takes: small commits, `synchronous=FULL`, transactions larger than the page cache
//! (uncommitted frames spilled mid-transaction, pages rewritten in place, then committed or
//! rolled back), WAL restarts, and another writer on the stock VFS taking turns on the same file.

use rusqlite::{params, Connection, OpenFlags};

fn open_through_vfs(path: &std::path::Path) -> Connection {
    let vfs = flightlog_walvfs::register().expect("register the VFS");
    let conn = Connection::open_with_flags_and_vfs(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        vfs,
    )
    .expect("open through the VFS");
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .expect("switch to WAL");
    assert_eq!(mode, "wal");
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .expect("no automatic checkpoints");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
         CREATE INDEX IF NOT EXISTS t_body ON t (body);",
    )
    .expect("schema");
    conn
}

fn count(conn: &Connection) -> i64 {
    conn.query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))
        .expect("count rows")
}

fn checksum(conn: &Connection) -> i64 {
    conn.query_row(
        "SELECT COALESCE(SUM(id * length(CAST(body AS BLOB))), 0) FROM t",
        [],
        |row| row.get(0),
    )
    .expect("checksum rows")
}

fn assert_intact(conn: &Connection) {
    let verdict: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity check");
    assert_eq!(verdict, "ok");
}

fn body(id: i64, len: usize) -> String {
    format!("{id:08}-{}", "é".repeat(len))
}

/// Small commits, each read back at once by a stock-VFS connection, under both durabilities.
#[test]
fn every_commit_is_visible_to_a_stock_reader_at_once() {
    for synchronous in ["NORMAL", "FULL"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = open_through_vfs(&path);
        writer
            .pragma_update(None, "synchronous", synchronous)
            .unwrap();
        let reader = Connection::open(&path).unwrap();
        let mut expected = 0;
        for round in 0..150i64 {
            let tx = writer.unchecked_transaction().unwrap();
            for i in 0..20 {
                let id = round * 20 + i;
                tx.execute("INSERT INTO t VALUES (?1, ?2)", params![id, body(id, 150)])
                    .unwrap();
                expected += id * body(id, 150).len() as i64;
            }
            tx.commit().unwrap();
            assert_eq!(count(&reader), (round + 1) * 20, "{synchronous}");
            assert_eq!(checksum(&reader), expected, "{synchronous}");
        }
        assert_intact(&reader);
    }
}

/// Transactions larger than the writer's page cache spill uncommitted frames into the WAL and
/// rewrite some of them in place before the commit; a spilled transaction that rolls back must
/// leave no trace; both must read back exactly, here and after reopening on the stock VFS.
#[test]
fn spilled_transactions_commit_and_roll_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let writer = open_through_vfs(&path);
    // A tiny cache: every large transaction spills.
    writer.pragma_update(None, "cache_size", 10).unwrap();
    writer.pragma_update(None, "cache_spill", 5).unwrap();
    let reader = Connection::open(&path).unwrap();

    let tx = writer.unchecked_transaction().unwrap();
    for id in 0..3_000i64 {
        tx.execute("INSERT INTO t VALUES (?1, ?2)", params![id, body(id, 300)])
            .unwrap();
    }
    // Rewrite pages already spilled in this transaction.
    tx.execute("UPDATE t SET body = body || '!' WHERE id % 3 = 0", [])
        .unwrap();
    // The reader sees nothing of an uncommitted transaction, even with its frames in the file.
    assert_eq!(count(&reader), 0);
    tx.commit().unwrap();
    let committed = checksum(&writer);
    assert_eq!(count(&reader), 3_000);
    assert_eq!(checksum(&reader), committed);

    let tx = writer.unchecked_transaction().unwrap();
    for id in 10_000..13_000i64 {
        tx.execute("INSERT INTO t VALUES (?1, ?2)", params![id, body(id, 300)])
            .unwrap();
    }
    tx.execute("DELETE FROM t WHERE id < 1000", []).unwrap();
    tx.rollback().unwrap();
    assert_eq!(count(&writer), 3_000);
    assert_eq!(checksum(&writer), committed);
    assert_eq!(checksum(&reader), committed);

    // A commit after the rollback reuses the WAL space the rolled-back frames took.
    writer
        .execute(
            "INSERT INTO t VALUES (?1, ?2)",
            params![5_000, body(5_000, 10)],
        )
        .unwrap();
    let after = checksum(&writer);
    assert_eq!(checksum(&reader), after);
    assert_intact(&writer);
    drop(reader);
    drop(writer);

    let reopened = Connection::open(&path).unwrap();
    assert_eq!(count(&reopened), 3_001);
    assert_eq!(checksum(&reopened), after);
    assert_intact(&reopened);
}

/// A stock-VFS writer and a VFS writer take turns on one file, with WAL restarts between
/// some turns: each sees the other's commits and the file stays intact.
#[test]
fn writers_on_both_vfs_take_turns_across_wal_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let ours = open_through_vfs(&path);
    let stock = Connection::open(&path).unwrap();
    stock
        .busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    let mut next_id = 0i64;
    for turn in 0..60 {
        let writer = if turn % 2 == 0 { &ours } else { &stock };
        let tx = writer.unchecked_transaction().unwrap();
        for _ in 0..25 {
            tx.execute(
                "INSERT INTO t VALUES (?1, ?2)",
                params![next_id, body(next_id, 200)],
            )
            .unwrap();
            next_id += 1;
        }
        tx.commit().unwrap();
        if turn % 7 == 6 {
            let checkpointer = if turn % 2 == 0 { &stock } else { &ours };
            let busy: i64 = checkpointer
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |row| row.get(0))
                .unwrap();
            assert_eq!(busy, 0, "nothing holds the WAL at this point");
        }
        assert_eq!(count(&ours), next_id);
        assert_eq!(count(&stock), next_id);
        assert_eq!(checksum(&ours), checksum(&stock));
    }
    assert_intact(&ours);
}
