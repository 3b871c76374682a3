//! Issue 3's "appends to one engagement are serialized in call order; different engagements do
//! not wait for each other", held against what the SQLite journal really does.
//!
//! Why this file exists: the reference serializes appends per engagement (a keyed promise chain),
//! so there an append to B never queues behind A's. The SQLite journal has no per-engagement
//! queue or lock at all: every write of the file goes through the database's one writer thread,
//! which takes the queued writes in order, in groups of up to `max_group_size`, one transaction
//! per group (group commit). Anything that holds A's appends at the database (here: another
//! connection holding the file's write lock, as another process would) therefore holds B's too;
//! an append to B cannot finish "before A's are released". What the design does promise, and
//! what this file checks, is that B queues once, behind the lock, and joins the very next
//! transaction together with every append of A queued ahead of it: it does not wait for A's
//! appends to commit one after another. (It does wait for whatever is ahead of it in the queue,
//! whichever engagements that is: a burst of more than `max_group_size` appends to A delays B by
//! that many groups.)

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use flightlog_core::journal::{
    AppendInput, EngagementEvent, EngagementJournal, JournalError, RetentionConfig,
};
use flightlog_sqlite::{SqliteConfig, SqliteDatabase, SqliteEngagementJournal};

/// Bound on every wait, so a broken writer fails the test instead of hanging it (not a speed
/// requirement: nothing here is timed).
const BOUND: Duration = Duration::from_secs(30);

type Append = Pin<Box<dyn Future<Output = Result<EngagementEvent, JournalError>> + Send>>;

fn append(journal: &Arc<SqliteEngagementJournal>, engagement_id: &str) -> Append {
    let journal = Arc::clone(journal);
    let input = AppendInput::new(engagement_id, 1, "note", serde_json::Map::new())
        .expect("a valid append input");
    Box::pin(async move { journal.append(input).await })
}

/// Wait (bounded) until the database's writer thread is waiting for the file's write lock: it
/// then marks itself waiting with a shared `flock` on `<db>-flightlog-turn`, the side file
/// through which writers of several processes take turns (`lock_turns.rs`), and an exclusive
/// try-lock of that file fails. Once it does, the writer has taken its group out of the queue
/// and is inside that group's `BEGIN IMMEDIATE`.
fn wait_until_the_writer_waits_for_the_lock(db: &Path) {
    let mut name = db.as_os_str().to_owned();
    name.push("-flightlog-turn");
    let turn = std::path::PathBuf::from(name);
    let started = Instant::now();
    loop {
        if let Ok(file) = std::fs::File::open(&turn) {
            match file.try_lock() {
                Err(std::fs::TryLockError::WouldBlock) => return,
                Ok(()) => file.unlock().expect("unlock the turn file"),
                Err(std::fs::TryLockError::Error(error)) => panic!("lock {turn:?}: {error}"),
            }
        }
        assert!(
            started.elapsed() < BOUND,
            "the writer never waited for the lock"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Write jobs waiting in the queue, not yet taken by the writer thread.
fn queue_depth(db: &SqliteDatabase) -> f64 {
    db.backend_metrics()
        .into_iter()
        .find(|metric| metric.name == "flightlog_sqlite_write_queue_depth")
        .expect("the queue depth metric")
        .value
}

/// While another connection holds the file's write lock, the writer takes a first append (to
/// `plug`) and waits for the lock; behind it, 32 appends to engagement A and then one to B are
/// queued, in that order (each polled once, which queues it; the queue depth shows all 33
/// waiting). When the lock is released, the writer runs exactly two transactions: the plug's,
/// then one holding all of A's appends and B's. So B, queued behind 32 appends of A, waited for
/// the file's lock and nothing else: not for A's appends one at a time. A's appends get seqs
/// 0..32 in the order they were made (serialized in call order), B's gets 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_to_b_joins_the_transaction_of_the_appends_to_a_queued_ahead_of_it() {
    const A_APPENDS: usize = 32;
    let dir = tempfile::tempdir().expect("a scratch folder");
    let path = dir.path().join("journal.db");
    let db = SqliteDatabase::open(SqliteConfig::new(&path)).expect("the database opens");
    assert!(
        A_APPENDS < SqliteConfig::new(&path).max_group_size,
        "the test needs every queued append to fit one group"
    );
    let journal = Arc::new(SqliteEngagementJournal::new(
        Arc::clone(&db),
        RetentionConfig::default(),
    ));
    // The writer has done its first group (and the schema exists) before the lock is taken.
    append(&journal, "warm-up").await.expect("a first append");

    let foreign = rusqlite::Connection::open(&path).expect("a second connection");
    foreign
        .busy_timeout(BOUND)
        .expect("set the second connection's busy timeout");
    foreign
        .execute_batch("BEGIN IMMEDIATE")
        .expect("the second connection takes the write lock");

    let plug = tokio::spawn(append(&journal, "plug"));
    wait_until_the_writer_waits_for_the_lock(&path);
    let stats = db.writer_stats();
    let groups_before = stats.groups.load(Ordering::Relaxed);
    let writes_before = stats.writes.load(Ordering::Relaxed);

    // Queued in this order, from this one task: A's appends, then B's.
    let mut context = Context::from_waker(Waker::noop());
    let mut queued: Vec<(&str, Append)> = Vec::new();
    for _ in 0..A_APPENDS {
        queued.push(("a", append(&journal, "a")));
    }
    queued.push(("b", append(&journal, "b")));
    for (engagement_id, future) in &mut queued {
        assert!(
            future.as_mut().poll(&mut context).is_pending(),
            "an append to {engagement_id} finished while the file was locked"
        );
    }
    assert_eq!(queue_depth(&db), (A_APPENDS + 1) as f64, "all queued");
    assert!(!plug.is_finished(), "the plug committed under a held lock");

    foreign
        .execute_batch("COMMIT")
        .expect("the second connection releases the lock");
    drop(foreign);
    let plugged = tokio::time::timeout(BOUND, plug)
        .await
        .expect("the plug is answered once the lock is free")
        .expect("the plug's task");
    assert_eq!(plugged.expect("the plug is appended").seq, 0);
    let handles: Vec<_> = queued
        .into_iter()
        .map(|(engagement_id, future)| (engagement_id, tokio::spawn(future)))
        .collect();
    let mut a_seqs = Vec::new();
    let mut b_seqs = Vec::new();
    for (engagement_id, handle) in handles {
        let event = tokio::time::timeout(BOUND, handle)
            .await
            .expect("every queued append is answered")
            .expect("the append's task")
            .expect("the append succeeds");
        assert_eq!(&*event.engagement_id, engagement_id);
        match engagement_id {
            "a" => a_seqs.push(event.seq),
            _ => b_seqs.push(event.seq),
        }
    }
    assert_eq!(a_seqs, (0..A_APPENDS as i64).collect::<Vec<_>>());
    assert_eq!(b_seqs, [0]);

    assert_eq!(
        stats.groups.load(Ordering::Relaxed) - groups_before,
        2,
        "the plug's transaction, then one for every append queued behind it"
    );
    assert_eq!(
        stats.writes.load(Ordering::Relaxed) - writes_before,
        A_APPENDS as u64 + 2
    );
    db.close().await.expect("the database closes");
}
