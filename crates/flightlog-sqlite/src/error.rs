//! Mapping SQLite errors onto the store's error type.

use flightlog_core::activity::StoreError;

/// Any SQLite failure that is not a caller mistake.
pub(crate) fn backend(err: rusqlite::Error) -> StoreError {
    StoreError::Backend(err.to_string())
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
