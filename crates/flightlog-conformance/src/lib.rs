//! Replayers for the reference's conformance fixtures (`shared/conformance`, see its FORMAT.md).
//!
//! One replayer per store, each generic over the store trait so every backend runs the same
//! fixtures: the data-driven "one harness, many backends" check.

pub mod activity;
pub mod fixtures;
pub mod journal;
pub mod reference;
