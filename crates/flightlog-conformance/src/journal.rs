//! The journal fixture replayer: drives any [`EngagementJournal`] (and the journal's pure
//! functions) through the `store: "journal"` fixtures and compares every result.
//!
//! The caller supplies a factory that builds a fresh, empty journal from a fixture's retention,
//! so the same fixtures check every backend. [`replay_journal_dir`] is the synchronous entry
//! point (it runs its own single-threaded tokio runtime, so call it from plain code or a plain
//! `#[test]`, never from inside a runtime); [`replay_journal_fixtures`] is the same replay as an
//! `async fn` for callers that already run one.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use flightlog_core::journal::{
    reconstruct_board_from_events, summarize_engagement_events, AppendInput, BoardEntryKind,
    BoardFilter, EngagementJournal, JournalError, RetentionConfig,
};
use serde_json::Value;

use crate::fixtures::{arg, check_step, load_fixtures, optional_arg, to_json, Fixture};

/// Builds a fresh, empty journal enforcing the given retention.
pub type JournalFactory<'a> = &'a dyn Fn(RetentionConfig) -> Arc<dyn EngagementJournal>;

/// The error kind a fixture's `expectError` names for this journal error: the reference's
/// exception class (`TypeError` for validation, `JournalFullError` for a full engagement).
pub fn error_kind(err: &JournalError) -> &'static str {
    match err {
        JournalError::Invalid(_) | JournalError::NotFinite { .. } => "TypeError",
        JournalError::JournalFull { .. } => "JournalFullError",
        JournalError::WrongExpectedSeq { .. } => "WrongExpectedSeq",
        JournalError::Closed
        | JournalError::Corrupt(_)
        | JournalError::Overloaded
        | JournalError::Busy(_)
        | JournalError::Unavailable(_)
        | JournalError::Backend(_)
        | JournalError::StorageFull(_)
        | JournalError::FileLost(_)
        | JournalError::DiskFailed(_) => "backend",
    }
}

/// The retention a fixture's `setup` asks for (FORMAT.md §4.1); the default when absent.
pub fn setup_retention(setup: &Value) -> Result<RetentionConfig, String> {
    match setup.get("retention") {
        None | Some(Value::Null) => Ok(RetentionConfig::default()),
        Some(retention) => serde_json::from_value(retention.clone())
            .map_err(|err| format!("setup.retention: {err}")),
    }
}

fn records_arg(args: &Value) -> Result<&[Value], String> {
    args.get("records")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .ok_or_else(|| "argument records: not an array".to_owned())
}

/// The `filter` argument of a `reconstructBoardFromEvents` step.
enum FilterArg {
    /// No filter: every entry.
    Absent,
    /// A filter the typed API can express.
    Filter(BoardFilter),
    /// A `kind` outside the enum: as in the reference, it matches no entry.
    MatchesNothing,
}

fn board_filter(args: &Value) -> Result<FilterArg, String> {
    let Some(filter) = args.get("filter").filter(|filter| !filter.is_null()) else {
        return Ok(FilterArg::Absent);
    };
    let key: Option<String> = optional_arg(filter, "key")?;
    let kind = match optional_arg::<String>(filter, "kind")? {
        None => None,
        Some(text) => match BoardEntryKind::parse(&text) {
            Some(kind) => Some(kind),
            None => return Ok(FilterArg::MatchesNothing),
        },
    };
    Ok(FilterArg::Filter(BoardFilter { key, kind }))
}

/// Perform one op; `Ok(Err(kind))` is a journal error the fixture may expect, `Err` a broken
/// fixture or result.
async fn perform(
    journal: &dyn EngagementJournal,
    op: &str,
    args: &Value,
) -> Result<Result<Value, String>, String> {
    let result = match op {
        "append" => {
            let raw = args.get("event").cloned().unwrap_or(Value::Null);
            match AppendInput::from_json(raw) {
                Ok(input) => journal.append(input).await.map(to_json),
                Err(invalid) => Err(JournalError::Invalid(invalid)),
            }
        }
        "read" => {
            let engagement_id: String = arg(args, "engagementId")?;
            journal.read(&engagement_id).await.map(to_json)
        }
        "summarize" => {
            let engagement_id: String = arg(args, "engagementId")?;
            journal.summarize(&engagement_id).await.map(to_json)
        }
        "compact" => {
            let engagement_id: String = arg(args, "engagementId")?;
            // The reference's `compact` returns nothing.
            journal
                .compact(&engagement_id)
                .await
                .map(|_| Ok(Value::Null))
        }
        "listEngagements" => {
            let limit: Option<i64> = optional_arg(args, "limit")?;
            journal.list_engagements(limit).await.map(to_json)
        }
        "prune" => {
            let now: i64 = arg(args, "now")?;
            journal.prune(now).await.map(to_json)
        }
        "summarizeEngagementEvents" => {
            let engagement_id: String = arg(args, "engagementId")?;
            let records = records_arg(args)?;
            Ok(to_json(summarize_engagement_events(
                &engagement_id,
                records,
            )))
        }
        "reconstructBoardFromEvents" => {
            let records = records_arg(args)?;
            match board_filter(args)? {
                FilterArg::Absent => Ok(to_json(reconstruct_board_from_events(records, None))),
                FilterArg::Filter(filter) => Ok(to_json(reconstruct_board_from_events(
                    records,
                    Some(&filter),
                ))),
                FilterArg::MatchesNothing => Ok(Ok(Value::Array(Vec::new()))),
            }
        }
        other => return Err(format!("unknown journal op {other:?}")),
    };
    match result {
        Ok(value) => value.map(Ok),
        Err(err) => Ok(Err(error_kind(&err).to_owned())),
    }
}

/// Replay one journal fixture on the journal `make` builds from its setup; `Err` describes the
/// first mismatch (step index, op and a diff).
pub async fn replay_journal_fixture(
    fixture: &Fixture,
    make: JournalFactory<'_>,
) -> Result<(), String> {
    replay_journal_fixture_reopening(
        fixture,
        |retention| std::future::ready(Ok(make(retention))),
        None,
    )
    .await
}

/// [`replay_journal_fixture`] with a journal built by an async `make(retention)`, and, with
/// `reopen_every: Some(n)`, built again before every n-th step (after the previous one was
/// dropped): for a backend on a file, `make` closes what it opened last and opens the file anew,
/// so no result may come from memory the file does not back.
pub async fn replay_journal_fixture_reopening<F, Fut>(
    fixture: &Fixture,
    mut make: F,
    reopen_every: Option<usize>,
) -> Result<(), String>
where
    F: FnMut(RetentionConfig) -> Fut,
    Fut: Future<Output = Result<Arc<dyn EngagementJournal>, String>>,
{
    let retention = setup_retention(&fixture.setup)?;
    let mut journal = make(retention).await?;
    for (index, step) in fixture.steps.iter().enumerate() {
        if reopen_every.is_some_and(|every| index > 0 && index % every.max(1) == 0) {
            drop(journal);
            journal = make(retention)
                .await
                .map_err(|err| format!("reopening before step {index}: {err}"))?;
        }
        let context = |detail: String| format!("step {index} ({}): {detail}", step.op);
        let outcome = perform(journal.as_ref(), &step.op, &step.args)
            .await
            .map_err(context)?;
        check_step(step, outcome).map_err(context)?;
    }
    Ok(())
}

/// Replay every `store: "journal"` fixture under `dir` (recursively, in path order), each on a
/// fresh journal from `make`. `Ok(n)`: all `n` fixtures passed. `Err`: one message per failing
/// fixture (`name (path): step i (op): diff`), or the reason the folder could not be read.
pub async fn replay_journal_fixtures(
    dir: &Path,
    make: JournalFactory<'_>,
) -> Result<usize, Vec<String>> {
    let fixtures = load_fixtures(dir, "journal").map_err(|err| vec![err])?;
    let mut failures = Vec::new();
    for (path, fixture) in &fixtures {
        if let Err(err) = replay_journal_fixture(fixture, make).await {
            failures.push(format!("{} ({}): {err}", fixture.name, path.display()));
        }
    }
    if failures.is_empty() {
        Ok(fixtures.len())
    } else {
        Err(failures)
    }
}

/// [`replay_journal_fixtures`] on a single-threaded runtime of its own, for synchronous callers.
pub fn replay_journal_dir(dir: &Path, make: JournalFactory<'_>) -> Result<usize, Vec<String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|err| vec![format!("cannot start a tokio runtime: {err}")])?;
    runtime.block_on(replay_journal_fixtures(dir, make))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::conformance_dir;
    use flightlog_core::journal::InMemoryEngagementJournal;

    fn in_memory(retention: RetentionConfig) -> Arc<dyn EngagementJournal> {
        Arc::new(InMemoryEngagementJournal::new(retention))
    }

    #[test]
    fn every_journal_fixture_passes_on_the_in_memory_journal() {
        let dir = conformance_dir().join("journal");
        match replay_journal_dir(&dir, &in_memory) {
            Ok(passed) => {
                assert!(passed > 0, "no journal fixtures under {}", dir.display());
                println!("journal in-memory: {passed} fixtures passed");
            }
            Err(failures) => panic!(
                "{} journal fixtures failed:\n{}",
                failures.len(),
                failures.join("\n")
            ),
        }
    }

    #[test]
    fn a_wrong_expectation_is_reported_with_fixture_step_and_diff() {
        let fixture: Fixture = match serde_json::from_value(serde_json::json!({
            "name": "broken", "store": "journal", "setup": {},
            "steps": [
                {"op": "append", "args": {"event": {"engagementId": "e", "at": 1, "type": "t", "data": {}}},
                 "expect": {"engagementId": "e", "seq": 0, "at": 1, "type": "t", "data": {}}},
                {"op": "listEngagements", "args": {}, "expect": ["other"]}
            ]
        })) {
            Ok(fixture) => fixture,
            Err(err) => panic!("fixture does not parse: {err}"),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().build();
        let outcome = runtime.map(|rt| rt.block_on(replay_journal_fixture(&fixture, &in_memory)));
        let message = match outcome {
            Ok(Err(message)) => message,
            other => panic!("expected a mismatch, got {other:?}"),
        };
        assert!(message.starts_with("step 1 (listEngagements)"), "{message}");
        assert!(message.contains("\"other\""), "{message}");
    }

    /// A key spelt as serde_json's raw-value token is data like any other key (the reference
    /// copies it): a fixture holding it loads, and its event is stored and answered unchanged.
    /// serde_json's own `Value` read the first object as the JSON text `[1]` (the append was then
    /// refused) and the second as not JSON at all (the whole folder failed to load).
    #[test]
    fn a_key_spelt_as_the_raw_value_token_is_loaded_and_replayed_as_written() {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(err) => panic!("cannot make a temporary folder: {err}"),
        };
        let token = "$serde_json::private::RawValue";
        let append = |engagement: &str, held: &str| {
            let event = serde_json::json!({
                "engagementId": engagement, "at": 1, "type": "t", "data": {token: held}
            });
            let mut expect = event.clone();
            expect["seq"] = serde_json::json!(0);
            serde_json::json!({"op": "append", "args": {"event": event}, "expect": expect})
        };
        let fixture = serde_json::json!({
            "name": "raw-value-token", "store": "journal", "setup": {},
            "steps": [append("e", "[1]"), append("f", "x")]
        });
        let path = dir.path().join("raw-value-token.json");
        if let Err(err) = std::fs::write(&path, fixture.to_string()) {
            panic!("cannot write {}: {err}", path.display());
        }
        let loaded = match crate::fixtures::load_fixtures(dir.path(), "journal") {
            Ok(loaded) => loaded,
            Err(err) => panic!("the fixture does not load: {err}"),
        };
        assert_eq!(loaded.len(), 1);
        assert_eq!(
            loaded[0].1.steps[0].args["event"]["data"][token],
            serde_json::json!("[1]")
        );
        match replay_journal_dir(dir.path(), &in_memory) {
            Ok(passed) => assert_eq!(passed, 1),
            Err(failures) => panic!("{}", failures.join("\n")),
        }
    }
}
