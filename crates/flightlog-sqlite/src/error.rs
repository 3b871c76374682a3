//! Mapping SQLite errors onto the store's error type.

use flightlog_core::activity::StoreError;

/// Any SQLite failure that is not a caller mistake.
pub(crate) fn backend(err: rusqlite::Error) -> StoreError {
    if is_disk_full(&err) {
        return StoreError::StorageFull(err.to_string());
    }
    if is_shm_growth_failure(&err) {
        return StoreError::StorageFull(format!(
            "no room to grow the shared-memory index (the -shm file beside the database; \
             {err})"
        ));
    }
    if is_disk_failure(&err) {
        return StoreError::DiskFailed(err.to_string());
    }
    if is_corrupt(&err) {
        return StoreError::Corrupt(format!(
            "the database file is damaged ({err}): stop flightlog, then restore the file from a \
             backup, or recover what it holds with `sqlite3 FILE .recover | sqlite3 \
             recovered.db` and start on recovered.db"
        ));
    }
    StoreError::Backend(err.to_string())
}

/// True when the disk or its file system failed an operation (`SQLITE_IOERR`, but for a `-shm`
/// that could not grow, which is a full disk): a failing disk, or a file system the kernel made
/// read-only after an error. Such writes were a 500 "database error" while `/healthz` said ok
/// (an audit's finding); they are now a 503 that says to check the disk, and `/healthz` says
/// the same until a write succeeds again.
fn is_disk_failure(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(inner, _)
            if inner.code == rusqlite::ErrorCode::SystemIoFailure
    )
}

/// True when SQLite found the file's structure broken (`SQLITE_CORRUPT`): a page overwritten
/// or cut off. Nothing a retry can mend.
fn is_corrupt(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(inner, _)
            if inner.code == rusqlite::ErrorCode::DatabaseCorrupt
    )
}

/// True when SQLite could not write for lack of space (`SQLITE_FULL`).
fn is_disk_full(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(inner, _) if inner.code == rusqlite::ErrorCode::DiskFull
    )
}

/// True when SQLite could not grow the `-shm` file that indexes the WAL
/// (`SQLITE_IOERR_SHMSIZE`). SQLite writes one byte into each page of a new 32 KiB region to
/// make the file's blocks real, so this fails only for lack of room: a full disk (`ENOSPC`), a
/// quota or a file-size limit. It happens when the WAL grows past another 4,096 pages while the
/// disk is full, and at the first open after a crash, which cuts the file to 3 bytes and grows it
/// again; the unix VFS reports it as a "disk I/O error", which read as a broken disk (a 500, or a
/// refused start) where a full disk gets a 503 and a message saying to free space.
fn is_shm_growth_failure(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(inner, _)
            if inner.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE
    )
}

/// True when `err` is a constraint violation (duplicate primary or unique key).
pub(crate) fn is_constraint(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(inner, _)
            if inner.code == rusqlite::ErrorCode::ConstraintViolation
    )
}

/// True when SQLite answered "busy/locked" (another connection holds the lock past the timeout).
pub(crate) fn is_busy(err: &rusqlite::Error) -> bool {
    matches!(
        err,
        rusqlite::Error::SqliteFailure(inner, _)
            if inner.code == rusqlite::ErrorCode::DatabaseBusy
                || inner.code == rusqlite::ErrorCode::DatabaseLocked
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_database_is_storage_full_and_other_failures_are_backend() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (x BLOB); PRAGMA max_page_count = 4;")
            .unwrap();
        let full = (0..100)
            .map(|_| conn.execute("INSERT INTO t VALUES (zeroblob(4000))", []))
            .find_map(Result::err)
            .expect("the page limit is reached");
        let err = backend(full);
        assert!(matches!(err, StoreError::StorageFull(_)), "{err:?}");
        assert!(err.to_string().contains("free space"), "{err}");
        let other = conn
            .execute("INSERT INTO missing VALUES (1)", [])
            .unwrap_err();
        assert!(matches!(backend(other), StoreError::Backend(_)));
    }

    #[test]
    fn a_shared_memory_index_that_cannot_grow_is_storage_full_and_other_io_errors_disk_failures() {
        let failure = |code| {
            rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some("x".into()))
        };
        let err = backend(failure(rusqlite::ffi::SQLITE_IOERR_SHMSIZE));
        assert!(matches!(err, StoreError::StorageFull(_)), "{err:?}");
        assert!(err.to_string().contains("-shm"), "{err}");
        assert!(err.to_string().contains("free space"), "{err}");
        // A failing disk, a file system made read-only: a 503 that says to check the disk (they
        // were a 500 "database error").
        for other in [
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_IOERR_READ,
            rusqlite::ffi::SQLITE_IOERR_WRITE,
            rusqlite::ffi::SQLITE_IOERR_FSYNC,
            rusqlite::ffi::SQLITE_IOERR_SHMMAP,
        ] {
            let err = backend(failure(other));
            assert!(matches!(err, StoreError::DiskFailed(_)), "{other}: {err:?}");
            assert!(err.to_string().contains("check the disk"), "{err}");
        }
    }
}
