//! Mapping SQLite errors onto the store's error type.

use flightlog_core::activity::StoreError;

/// Any SQLite failure that is not a caller mistake.
pub(crate) fn backend(err: rusqlite::Error) -> StoreError {
    if is_disk_full(&err) {
        return StoreError::StorageFull(err.to_string());
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
}
