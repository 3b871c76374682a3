//! The engagement journal: per-engagement, append-only event logs recording how agents
//! collaborated (mail, turns, tools, the blackboard, guards, budgets), with summaries,
//! compaction and retention.
//!
//! Behaviour follows the reference TypeScript (`engagement-journal.ts`) as pinned by the
//! conformance fixtures, with the deliberate differences of FORMAT.md §8 (`type` must be a
//! non-empty string; times are integers).
//!
//! Layout:
//! - [`types`] holds events, summaries, board entries and retention, in the reference's JSON
//!   shapes;
//! - [`record`] holds the [`JournalRecord`] view that lets the pure rules read stored events and
//!   loose JSON records alike;
//! - the pure rules, without I/O, are in [`summary`] (`summarize_engagement_events`), [`board`]
//!   (`reconstruct_board_from_events`) and [`compaction`] (`plan_compaction`);
//! - [`validate`] turns raw JSON into an [`AppendInput`], the only way to make one;
//! - [`store`] holds the [`EngagementJournal`] trait and [`JournalError`];
//! - [`memory`] holds the [`InMemoryEngagementJournal`].

pub mod board;
pub mod compaction;
mod index;
pub mod memory;
pub mod record;
pub mod store;
pub mod summary;
pub mod types;
pub mod validate;

pub use board::{reconstruct_board_from_events, BoardFilter};
pub use compaction::{
    plan_compaction, CompactionPlan, COMPACTABLE_EVENT_TYPES, COMPACTION_BLOCKING_EVENT_TYPES,
    COMPACTION_MIN_EVENTS,
};
pub use memory::{InMemoryEngagementJournal, DEFAULT_SUBSCRIBER_BUFFER, MAX_SUBSCRIBER_BUFFER};
pub use record::{JournalRecord, Payload};
pub use store::{
    CommittedEvent, EngagementHead, EngagementJournal, JournalDoorbell, JournalError,
    JournalSubscription, JournalTail, TailBound,
};
pub use summary::{is_actor_ref, summarize_engagement_events};
pub use types::*;
pub use validate::{AppendInput, AppendValidationError, MAX_DATA_DEPTH};
