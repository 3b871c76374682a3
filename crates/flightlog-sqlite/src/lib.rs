//! flightlog's embedded SQLite backend.
//!
//! [`SqliteDatabase`] owns one database file: its migrations, its single writer thread that
//! commits queued writes in groups, and its reader connections. [`SqliteActivityStore`]
//! implements the core's activity store trait on it, [`SqliteEngagementJournal`] the core's
//! engagement journal trait. The file is safe to share with other processes: every write takes
//! the lock with `BEGIN IMMEDIATE` and reads its counters inside that transaction.

mod activity;
mod activity_batch;
mod activity_import;
mod activity_listing;
mod activity_write;
mod database;
mod disk_probe;
mod error;
mod journal;
mod journal_bells;
mod lock_turns;
mod payload_codec;
mod remote_callers;
mod rewind_gate;
mod rows;
mod run_roots;
mod schema;
mod side_files;
mod span_id_filter;
mod wal_room;

pub use activity::SqliteActivityStore;
pub use database::{
    configure_connection, real_database_path, Durability, SqliteConfig, SqliteDatabase,
    WriterStats, SHUTDOWN_LOCK_WAIT,
};
pub use journal::SqliteEngagementJournal;
#[doc(hidden)]
pub use schema::migrate_up_to;
pub use schema::{APPLICATION_ID, SCHEMA_VERSION};
pub use side_files::side_file_path;
