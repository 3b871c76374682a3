//! Blackboard reconstruction: folding `board_written` records into entries, as the reference's
//! `reconstructBoardFromEvents` does.
//!
//! Each record with a non-blank string `key` (trimmed) rewrites that key's entry; a field the
//! record does not set validly carries over from the previous entry. So a todo's status survives a
//! change of kind to `note`, and a non-string `actor` lets `author` through. Entries keep the
//! order in which their key was first written.

use std::collections::HashMap;

use super::record::{js_trim, JournalRecord};
use super::types::{BoardEntry, BoardEntryKind, BoardTodoStatus};

/// Which entries `reconstruct_board_from_events` returns; `None` fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BoardFilter {
    /// Keep only the entry with exactly this key (compared untrimmed, so `" plan "` matches
    /// nothing: stored keys are trimmed).
    pub key: Option<String>,
    /// Keep only entries of this kind.
    pub kind: Option<BoardEntryKind>,
}

/// The record type that writes the board.
pub const BOARD_WRITTEN: &str = "board_written";

/// An entry while folding, borrowing its strings from the records.
#[derive(Clone, Copy)]
struct Slot<'a> {
    key: &'a str,
    kind: BoardEntryKind,
    content: &'a str,
    author: &'a str,
    updated_at: i64,
    version: f64,
    status: Option<BoardTodoStatus>,
}

/// The blackboard the records leave, in first-write order of the keys, filtered by `filter`.
///
/// A record without an integer `at` stamps its entry's `updatedAt` with 0 (the reference would
/// leave it undefined; flightlog's times are integers).
pub fn reconstruct_board_from_events<R: JournalRecord>(
    records: &[R],
    filter: Option<&BoardFilter>,
) -> Vec<BoardEntry> {
    let mut slots: Vec<Slot<'_>> = Vec::new();
    let mut index_by_key: HashMap<&str, usize> = HashMap::new();
    for record in records {
        if record.record_type() != BOARD_WRITTEN {
            continue;
        }
        let payload = record.payload();
        let Some(key) = payload
            .str("key")
            .map(js_trim)
            .filter(|key| !key.is_empty())
        else {
            continue;
        };
        let index = index_by_key.get(key).copied();
        let prev = index.map(|index| slots[index]);
        let slot = Slot {
            key,
            kind: payload
                .str("kind")
                .and_then(BoardEntryKind::parse)
                .or(prev.map(|prev| prev.kind))
                .unwrap_or(BoardEntryKind::Note),
            content: payload
                .str("content")
                .or(prev.map(|prev| prev.content))
                .unwrap_or(""),
            author: payload
                .str("actor")
                .or_else(|| payload.str("author"))
                .or(prev.map(|prev| prev.author))
                .unwrap_or(""),
            updated_at: record.record_at().unwrap_or(0),
            version: payload
                .number("version")
                .unwrap_or_else(|| prev.map_or(0.0, |prev| prev.version) + 1.0),
            status: payload
                .str("status")
                .and_then(BoardTodoStatus::parse)
                .or(prev.and_then(|prev| prev.status)),
        };
        match index {
            Some(index) => slots[index] = slot,
            None => {
                index_by_key.insert(key, slots.len());
                slots.push(slot);
            }
        }
    }
    slots
        .into_iter()
        .filter(|slot| match filter {
            None => true,
            Some(filter) => {
                filter.key.as_deref().is_none_or(|key| key == slot.key)
                    && filter.kind.is_none_or(|kind| kind == slot.kind)
            }
        })
        .map(|slot| BoardEntry {
            key: slot.key.to_owned(),
            kind: slot.kind,
            content: slot.content.to_owned(),
            author: slot.author.to_owned(),
            updated_at: slot.updated_at,
            version: slot.version,
            status: slot.status,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn board(records: Value, filter: Option<&BoardFilter>) -> Value {
        let records = records.as_array().cloned().unwrap_or_default();
        serde_json::to_value(reconstruct_board_from_events(&records, filter)).unwrap_or_default()
    }

    #[test]
    fn todo_status_survives_a_change_of_kind_to_note() {
        let records = json!([
            {"at": 1, "type": "board_written", "data": {"key": "t", "kind": "todo", "status": "pending"}},
            {"at": 2, "type": "board_written", "data": {"key": "t", "kind": "note", "status": "bogus"}},
        ]);
        assert_eq!(
            board(records, None),
            json!([{"key": "t", "kind": "note", "content": "", "author": "", "updatedAt": 2,
                    "version": 2, "status": "pending"}])
        );
    }

    #[test]
    fn a_non_string_actor_lets_author_through_and_versions_count_from_the_last() {
        let records = json!([
            {"at": 1, "type": "board_written", "data": {"key": " a ", "version": 10, "actor": "agent:x"}},
            {"at": 2, "type": "board_written", "data": {"key": "a", "actor": 5, "author": "agent:y"}},
            {"at": 3, "type": "board_written", "data": {"key": "a", "version": "x"}},
        ]);
        assert_eq!(
            board(records, None),
            json!([{"key": "a", "kind": "note", "content": "", "author": "agent:y", "updatedAt": 3,
                    "version": 12}])
        );
    }

    #[test]
    fn filters_compare_the_untrimmed_key_and_the_kind() {
        let records = json!([
            {"at": 1, "type": "board_written", "data": {"key": " plan "}},
            {"at": 2, "event": {"type": "board_written", "key": "art", "kind": "artifact"}},
        ]);
        let untrimmed = BoardFilter {
            key: Some(" plan ".into()),
            kind: None,
        };
        assert_eq!(board(records.clone(), Some(&untrimmed)), json!([]));
        let artifacts = BoardFilter {
            key: None,
            kind: Some(BoardEntryKind::Artifact),
        };
        let only_art = board(records, Some(&artifacts));
        assert_eq!(only_art.as_array().map(Vec::len), Some(1));
        assert_eq!(only_art[0]["key"], json!("art"));
    }
}
