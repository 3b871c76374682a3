//! Extreme values the Rust API of the SQLite stores once mishandled, each pinned by a minimal
//! case (found by a property test driving every operation with extreme inputs in a debug
//! build): a live root whose duration overflows i64, attrs nested past what a reader can parse,
//! and configuration values past what SQLite or tokio accept.
//!
//! The HTTP layer validates what reaches the stores, but the Rust API is a public interface of
//! its own. The rule for it: bad input gets a clear typed error, never a panic, and nothing
//! acknowledged is ever lost or made unreadable.

use std::sync::Arc;

use flightlog_core::activity::{
    ActivityStore, EndSpanInput, JsonObject, RunListQuery, SpanKind, SpanOrigin, SpanOutcome,
    SpanPatch, StartSpanInput, StoreError,
};
use flightlog_core::journal::RetentionConfig;
use flightlog_core::ManualClock;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};
use serde_json::{json, Value};

/// `value` (a JSON object) as a map.
fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// An array nested `levels` deep around a number.
fn nested_arrays(levels: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..levels {
        value = json!([value]);
    }
    value
}

/// A root started at -1 and ended at `i64::MAX`: its duration does not fit an i64. `list_runs`
/// computed it in SQL, where SQLite turns the overflow into a real number, and every page that
/// reached the run failed with `Backend("Invalid column type Real")`. It saturates instead, as
/// the rollup's does.
#[tokio::test]
async fn a_live_root_duration_that_overflows_saturates_in_the_run_list() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("l.db"))).expect("open");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    store
        .start_span(StartSpanInput {
            span_id: "root".to_owned(),
            run_id: "run".to_owned(),
            parent_span_id: None,
            name: "n".to_owned(),
            kind: SpanKind::Turn,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: Some(-1),
        })
        .await
        .expect("start");
    let ended = store
        .end_span(
            "root",
            EndSpanInput {
                outcome: SpanOutcome::Success,
                reason: None,
                ended_at: Some(i64::MAX),
                usage: None,
                attrs: None,
            },
        )
        .await
        .expect("end");
    assert!(ended);
    let page = store
        .list_runs(RunListQuery {
            state: None,
            outcome: None,
            origin: None,
            limit: 10,
            before: None,
        })
        .await;
    let page = match page {
        Ok(page) => page,
        Err(err) => panic!("list_runs failed: {err:?}"),
    };
    assert_eq!(page.runs.len(), 1);
    assert_eq!(page.runs[0].duration_ms, Some(i64::MAX));
}

/// Attrs nested deeper than serde_json's parse limit (128) were accepted and stored, then read
/// back as `{}` (`parse_attrs`, the reference's `safeParse ?? {}`), and the next merge wrote that
/// `{}` plus the update back: acknowledged attrs lost for good. Stored JSON now nests at most
/// 64 levels (`flightlog_core::json_depth`): deeper attrs and payloads are refused with
/// `InvalidInput`, naming the path, and nothing is written; 64 levels are stored and read back.
#[tokio::test]
async fn attrs_and_payloads_nested_too_deep_are_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("a.db"))).expect("open");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    let start = |span: &str, attrs: JsonObject| StartSpanInput {
        span_id: span.to_owned(),
        run_id: "r".to_owned(),
        parent_span_id: None,
        name: "n".to_owned(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: Some(attrs),
        started_at: None,
    };
    let refused = |result: Result<_, StoreError>| match result {
        Err(StoreError::InvalidInput(message)) => {
            assert!(message.contains("nests deeper than 64 levels"), "{message}");
        }
        other => panic!("not refused as too deep: {other:?}"),
    };
    // `attrs` is level 1, so its members may take 63 more.
    let kept = object(json!({"keep": "me", "deep": nested_arrays(63)}));
    store
        .start_span(start("s", kept.clone()))
        .await
        .expect("at the limit");
    refused(
        store
            .start_span(start("t", object(json!({"deep": nested_arrays(200)}))))
            .await
            .map(|_| ()),
    );
    assert!(store.get_span("t").await.expect("get_span").is_none());
    let too_deep = object(json!({"more": nested_arrays(64)}));
    refused(
        store
            .patch_span(
                "s",
                SpanPatch {
                    attrs: Some(too_deep.clone()),
                    usage: None,
                    wait_until: None,
                },
            )
            .await
            .map(|_| ()),
    );
    refused(
        store
            .end_span(
                "s",
                EndSpanInput {
                    outcome: SpanOutcome::Success,
                    reason: None,
                    ended_at: None,
                    usage: None,
                    attrs: Some(too_deep),
                },
            )
            .await
            .map(|_| ()),
    );
    refused(
        store
            .append_event("s", "deep", Some(&nested_arrays(65)), None)
            .await
            .map(|_| ()),
    );
    let read = store
        .get_span("s")
        .await
        .expect("get_span")
        .expect("the span");
    assert_eq!(read.attrs, kept, "the acknowledged attrs read back whole");
    assert_eq!(read.outcome, None, "the refused end wrote nothing");
    let snapshot = store
        .snapshot_run("r")
        .await
        .expect("snapshot")
        .expect("the run");
    assert!(
        snapshot.events.is_empty(),
        "the refused append wrote nothing"
    );
}

/// `SqliteDatabase::open` with `config`, a panic turned into a message.
fn open_without_panic(config: SqliteConfig) -> Result<Arc<SqliteDatabase>, String> {
    match std::panic::catch_unwind(|| SqliteDatabase::open(config)) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(err)) => Err(format!("open failed: {err:?}")),
        Err(_) => panic!("SqliteDatabase::open panicked instead of returning an error"),
    }
}

/// `SqliteConfig::busy_timeout` goes to rusqlite's `Connection::busy_timeout`, which panics
/// ("too big") past `i32::MAX` milliseconds (about 24.8 days): `open` panicked. It is clamped.
#[test]
fn a_busy_timeout_beyond_i32_milliseconds_is_clamped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = SqliteConfig::new(dir.path().join("busy.db"));
    config.busy_timeout = std::time::Duration::from_millis(u64::from(i32::MAX.unsigned_abs()) + 1);
    open_without_panic(config).expect("opens, the timeout clamped");
}

/// `SqliteConfig::write_queue_capacity` went to `tokio::sync::mpsc::channel`, which panics past
/// `usize::MAX >> 3` permits: `open` panicked. It is clamped (to 2^24).
#[test]
fn a_huge_write_queue_capacity_is_clamped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = SqliteConfig::new(dir.path().join("queue.db"));
    config.write_queue_capacity = usize::MAX;
    open_without_panic(config).expect("opens, the capacity clamped");
}

/// `SqliteConfig::max_group_size` sized the writer's group buffer up front: `usize::MAX` panicked
/// the writer thread ("capacity overflow") after `open` succeeded, and every write then failed
/// with `Closed`. It is clamped (to 65,536).
#[tokio::test]
async fn a_huge_max_group_size_is_clamped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = SqliteConfig::new(dir.path().join("group.db"));
    config.max_group_size = usize::MAX;
    let db = open_without_panic(config).expect("opens, the group size clamped");
    let store = SqliteActivityStore::with_identity(db, Arc::new(ManualClock::new(0)), "w");
    let started = store
        .start_span(StartSpanInput {
            span_id: "s".to_owned(),
            run_id: "r".to_owned(),
            parent_span_id: None,
            name: "n".to_owned(),
            kind: SpanKind::Turn,
            origin: SpanOrigin::Session,
            session_id: None,
            job_name: None,
            attrs: None,
            started_at: None,
        })
        .await;
    assert!(
        started.is_ok(),
        "a write on a database opened with max_group_size usize::MAX: {started:?}"
    );
}

/// `with_subscriber_buffer` passed any buffer to `tokio::sync::broadcast::channel`, which
/// panics past `usize::MAX / 2` and allocates every slot up front. It is clamped (to 2^20).
#[test]
fn a_huge_journal_subscriber_buffer_is_clamped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = SqliteDatabase::open(SqliteConfig::new(dir.path().join("sub.db"))).expect("open");
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        SqliteEngagementJournal::with_subscriber_buffer(db, RetentionConfig::default(), usize::MAX)
    }));
    assert!(
        built.is_ok(),
        "with_subscriber_buffer panicked instead of clamping the buffer"
    );
}
