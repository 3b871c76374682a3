//! Blackboard reconstruction: folding `board_written` records into entries, as the reference's
//! `reconstructBoardFromEvents` does.
//!
//! Each record with a non-blank string `key` (trimmed) rewrites that key's entry; a field the
//! record does not set validly carries over from the previous entry. So a todo's status survives a
//! change of kind to `note`, and a non-string `actor` lets `author` through. Entries keep the
//! order in which their key was first written.

use super::index::KeyIndex;
use super::record::{as_str, js_trim, Fields, JournalRecord};
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

/// The board while folding `board_written` records into it, one record at a time (the summary
/// folds it in its own pass over the records).
#[derive(Default)]
pub(crate) struct BoardFold {
    entries: Vec<BoardEntry>,
    by_key: KeyIndex,
}

impl BoardFold {
    /// An empty board with room for `capacity` entries.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Vec::with_capacity(capacity),
            by_key: KeyIndex::default(),
        }
    }

    /// Fold one `board_written` record, given its fields and `at`. An entry rewritten in place
    /// keeps the fields the record does not set validly, and reuses its strings' buffers.
    pub(crate) fn write(&mut self, fields: &Fields<'_>, at: Option<i64>) {
        let Some(key) = as_str(fields.key)
            .map(js_trim)
            .filter(|key| !key.is_empty())
        else {
            return;
        };
        let kind = as_str(fields.kind).and_then(BoardEntryKind::parse);
        let content = as_str(fields.content);
        let author = as_str(fields.actor).or_else(|| as_str(fields.author));
        let version = fields.version.and_then(serde_json::Value::as_f64);
        let status = as_str(fields.status).and_then(BoardTodoStatus::parse);
        let updated_at = at.unwrap_or(0);
        match self.by_key.find(&self.entries, entry_key, key) {
            Some(index) => {
                let entry = &mut self.entries[index];
                if let Some(kind) = kind {
                    entry.kind = kind;
                }
                if let Some(content) = content {
                    replace(&mut entry.content, content);
                }
                if let Some(author) = author {
                    replace(&mut entry.author, author);
                }
                entry.updated_at = updated_at;
                entry.version = version.unwrap_or(entry.version + 1.0);
                if status.is_some() {
                    entry.status = status;
                }
            }
            None => {
                self.entries.push(BoardEntry {
                    key: key.to_owned(),
                    kind: kind.unwrap_or(BoardEntryKind::Note),
                    content: content.unwrap_or("").to_owned(),
                    author: author.unwrap_or("").to_owned(),
                    updated_at,
                    version: version.unwrap_or(1.0),
                    status,
                });
                self.by_key.pushed(&self.entries, entry_key);
            }
        }
    }

    /// The entries, in first-write order of their keys.
    pub(crate) fn finish(self) -> Vec<BoardEntry> {
        self.entries
    }
}

/// An entry's key, by which the fold finds it.
fn entry_key(entry: &BoardEntry) -> &str {
    &entry.key
}

/// `*target = text`, in `target`'s buffer when it is large enough.
fn replace(target: &mut String, text: &str) {
    target.clear();
    target.push_str(text);
}

/// The blackboard the records leave, in first-write order of the keys, filtered by `filter`.
///
/// A record without an integer `at` stamps its entry's `updatedAt` with 0 (the reference would
/// leave it undefined; flightlog's times are integers).
pub fn reconstruct_board_from_events<R: JournalRecord>(
    records: &[R],
    filter: Option<&BoardFilter>,
) -> Vec<BoardEntry> {
    let mut board = BoardFold::default();
    for record in records {
        if record.record_type() == BOARD_WRITTEN {
            board.write(&Fields::read(&record.payload()), record.record_at());
        }
    }
    let mut entries = board.finish();
    if let Some(filter) = filter {
        entries.retain(|entry| {
            filter.key.as_deref().is_none_or(|key| key == entry.key)
                && filter.kind.is_none_or(|kind| kind == entry.kind)
        });
    }
    entries
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
