//! The activity store: spans written at start, write-once outcomes, per-run `seq` and the global
//! `changeId` cursor.
//!
//! [`types`] holds the records and inputs, [`store`] the backend trait, and [`payload`] and
//! [`rollup`] the pure rules (payload capping, run rollups) every backend applies identically;
//! [`payload_text`] reads a payload's text straight into its stored form when it can.

pub mod batch;
pub mod import;
pub mod listing;
pub mod payload;
pub mod payload_text;
pub mod pricing;
pub mod rollup;
pub mod store;
pub mod types;

pub use batch::{ActivityWrite, ActivityWriteResult};
pub use import::{
    EncodedAttrs, ImportRejection, ImportReport, ImportedAttrs, ImportedEnd, ImportedEvent,
    ImportedSpan, RemoteParent, COST_SOURCE_ATTR, COST_SOURCE_PRICE_TABLE, COST_SOURCE_REPORTED,
    PRICE_TABLE_ATTR,
};
pub use listing::{RunCursor, RunListEntry, RunListQuery, RunPage, RunState};
pub use payload::{cap_payload, CappedPayload, MAX_EVENT_PAYLOAD_BYTES, TRUNCATION_MARKER};
pub use payload_text::PayloadText;
pub use rollup::{compute_rollup, rootless_usage, RollupFields, RollupSpan};
pub use store::{
    ActivityStore, ChangeDoorbell, LogMovement, OpenRootsCursor, OpenRootsPart, StoreError,
    DEFAULT_CHANGES_LIMIT, DEFAULT_PRUNE_BATCH,
};
pub use types::*;
