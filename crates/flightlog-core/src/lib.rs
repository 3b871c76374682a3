//! flightlog's core: the record types, the store traits and the pure logic every backend shares.
//!
//! This crate knows nothing about SQLite, PostgreSQL, HTTP or OTLP. Backends implement the traits
//! in [`activity::ActivityStore`]; everything that can be computed without a database (payload
//! capping, run rollups) lives here as plain functions over plain data so it is testable alone.

pub mod activity;
pub mod backend_metrics;
pub mod clock;
pub mod journal;
pub mod json_as_written;
pub mod json_depth;
pub mod json_number;
pub mod json_text;

pub use backend_metrics::{BackendMetric, MetricKind};
pub use clock::{default_writer_id, Clock, ManualClock, SystemClock};
