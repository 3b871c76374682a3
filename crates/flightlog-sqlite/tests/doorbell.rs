//! The change doorbell: live readers learn of committed changes from this process at once, and
//! of changes committed by another process on the same file within a bounded delay.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{ActivityStore, SpanKind, SpanOrigin, StartSpanInput};
use flightlog_core::journal::{EngagementJournal, RetentionConfig};
use flightlog_core::ManualClock;
use flightlog_sqlite::{
    SqliteActivityStore, SqliteConfig, SqliteDatabase, SqliteEngagementJournal,
};

fn root(span_id: &str) -> StartSpanInput {
    StartSpanInput {
        span_id: span_id.into(),
        run_id: format!("run-{span_id}"),
        parent_span_id: None,
        name: "turn".into(),
        kind: SpanKind::Turn,
        origin: SpanOrigin::Session,
        session_id: None,
        job_name: None,
        attrs: None,
        started_at: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rings_after_own_commits_and_after_foreign_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bell.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let ours = SqliteActivityStore::with_identity(
        SqliteDatabase::open(SqliteConfig::new(&path)).unwrap(),
        clock.clone(),
        "ours",
    );
    let mut bell = ours.change_doorbell();
    assert_eq!(*bell.borrow_and_update(), 0);

    ours.start_span(root("a")).await.unwrap();
    // Already rung when the write returned: persist, then emit.
    assert!(bell.has_changed().unwrap());
    assert_eq!(*bell.borrow_and_update(), 1);

    // A second database handle has its own writer and connections, as another process would.
    let theirs = SqliteActivityStore::with_identity(
        SqliteDatabase::open(SqliteConfig::new(&path)).unwrap(),
        clock,
        "theirs",
    );
    theirs.start_span(root("b")).await.unwrap();
    let started = Instant::now();
    tokio::time::timeout(Duration::from_millis(1_000), bell.changed())
        .await
        .expect("foreign commit noticed")
        .unwrap();
    assert_eq!(*bell.borrow_and_update(), 2);
    assert!(started.elapsed() < Duration::from_millis(1_000));
    let changes = ours.changes_since(1, 10).await.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].run_id, "run-b");
}

/// A prune clears the writer's caches, the newest change id among them. When it shared a group
/// with earlier writes, that group's changes were not rung until the checkpointer's next look
/// (up to 100 ms); every group's commit rings at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_ends_with_a_prune_still_rings_its_changes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteActivityStore::with_identity(
        SqliteDatabase::open(SqliteConfig::new(dir.path().join("prune.db"))).unwrap(),
        Arc::new(ManualClock::new(1_000)),
        "ours",
    ));
    let bell = store.change_doorbell();
    for round in 0..20 {
        // Writes and a prune queued together, so that some land in one group.
        let mut tasks = Vec::new();
        for index in 0..16 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                store
                    .start_span(root(&format!("s{round}-{index}")))
                    .await
                    .map(|_| ())
            }));
        }
        let pruning = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            pruning
                .prune(flightlog_core::activity::PruneOptions {
                    max_spans: None,
                    digest_floor_at: 0,
                    hard_ceiling_ms: i64::MAX,
                    now: None,
                    batch: None,
                    scheduled: false,
                })
                .await
                .map(|_| ())
        }));
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        // Every write has returned: its change was rung before it did.
        let newest = store.latest_change_cursor().await.unwrap();
        assert_eq!(*bell.borrow(), newest, "round {round}");
    }
}

/// The journal's commit doorbell does not ring for activity writes, this process's or another's:
/// it rang for every commit, and the engagement streams' hub then read the head of every
/// engagement it followed at each ring, so 3,000 idle engagement streams cost a sixth of a core
/// while only activity was written (an audit's finding).
#[tokio::test(flavor = "multi_thread")]
async fn activity_writes_ring_no_journal_doorbell() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quiet.db");
    let clock = Arc::new(ManualClock::new(1_000));
    let ours_db = SqliteDatabase::open(SqliteConfig::new(&path)).unwrap();
    let ours = SqliteActivityStore::with_identity(Arc::clone(&ours_db), clock.clone(), "ours");
    let journal = SqliteEngagementJournal::new(ours_db, RetentionConfig::default());
    // A second database handle has its own writer and connections, as another process would.
    let theirs = SqliteActivityStore::with_identity(
        SqliteDatabase::open(SqliteConfig::new(&path)).unwrap(),
        clock,
        "theirs",
    );
    let watcher_period = Duration::from_millis(40);
    let mut bell = journal.commit_doorbell();
    // The watcher's first look learns where the journal's count stands and rings for it (unless
    // it came before this subscription): wait for that ring rather than a fixed time a busy
    // machine may overrun.
    let _ = tokio::time::timeout(Duration::from_secs(5), bell.changed()).await;
    bell.borrow_and_update();
    for index in 0..20 {
        ours.start_span(root(&format!("ours-{index}")))
            .await
            .unwrap();
        theirs
            .start_span(root(&format!("theirs-{index}")))
            .await
            .unwrap();
        tokio::time::sleep(watcher_period / 2).await;
    }
    tokio::time::sleep(watcher_period * 4).await;
    assert!(
        !bell.has_changed().unwrap(),
        "activity writes rang the journal's doorbell"
    );
    // A journal write of the other process does.
    let their_journal = SqliteEngagementJournal::new(
        SqliteDatabase::open(SqliteConfig::new(&path)).unwrap(),
        RetentionConfig::default(),
    );
    their_journal
        .append_json(serde_json::json!({
            "engagementId": "e", "at": 1, "type": "note", "data": {}
        }))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), bell.changed())
        .await
        .expect("another process's append rang")
        .unwrap();
}
