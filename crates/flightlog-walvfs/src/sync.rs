//! [`sync_database_file`]: flush a connection's database file through SQLite's own file handle.
//!
//! Why it exists: flightlog's checkpointer syncs the database file before it asks the writer to
//! rewind the WAL, so that the writer's `RESTART` only syncs the pages it copies itself (see
//! `flightlog-sqlite`'s `database.rs`). Opening a second descriptor on the file for that would
//! be a trap: on POSIX systems, closing *any* descriptor of a file drops every `fcntl` lock the
//! process holds on it, SQLite's included, and SQLite's WAL mode relies on those locks (a
//! process that closes its last connection deletes the WAL if it believes it is alone). SQLite
//! avoids the trap for its own handles; a `std::fs::File` would not. So the sync goes through
//! the handle SQLite already has open, with its own `xSync` method, exactly as a checkpoint
//! syncs it.

use std::ffi::c_void;
use std::ptr;

use rusqlite::ffi;
use rusqlite::Connection;

/// Sync the main database file of `conn` (`fdatasync` or `fsync`, as SQLite's `unix` VFS does
/// for a checkpoint), through the file handle the connection holds. The connection must not be
/// used by another thread meanwhile, which `&Connection` (not `Sync`) already ensures.
pub fn sync_database_file(conn: &Connection) -> rusqlite::Result<()> {
    let mut file: *mut ffi::sqlite3_file = ptr::null_mut();
    // SAFETY: `conn.handle()` is the live connection `conn` owns; `SQLITE_FCNTL_FILE_POINTER`
    // writes one `sqlite3_file*` (the main database's handle, owned by the connection) into
    // `file`, which is a valid pointer to such a pointer.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            ptr::from_mut(&mut file).cast::<c_void>(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    if file.is_null() {
        return Ok(());
    }
    // SAFETY: `file` is the connection's open database handle (non-null); its methods table is
    // null only when the file is not open, in which case there is nothing to sync.
    let methods = unsafe { (*file).pMethods };
    if methods.is_null() {
        return Ok(());
    }
    // SAFETY: `methods` is the VFS's method table for `file`, valid while the file is open.
    let Some(x_sync) = (unsafe { (*methods).xSync }) else {
        return Ok(());
    };
    // SAFETY: `xSync` of the file's own VFS, on the file it belongs to, from the thread that
    // holds the connection; SQLite calls it the same way when a checkpoint ends.
    let rc = unsafe { x_sync(file, ffi::SQLITE_SYNC_NORMAL) };
    if rc != ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_file_is_synced_and_its_locks_are_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sync.db");
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);",
        )
        .expect("write");
        sync_database_file(&conn).expect("sync");
        // Still usable, and a second connection sees the data.
        conn.execute("INSERT INTO t VALUES (2)", [])
            .expect("write again");
        let other = Connection::open(&path).expect("open another");
        let count: i64 = other
            .query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))
            .expect("count");
        assert_eq!(count, 2);
    }

    #[test]
    fn an_in_memory_database_has_nothing_to_sync() {
        let conn = Connection::open_in_memory().expect("open");
        sync_database_file(&conn).expect("nothing to sync");
    }
}
