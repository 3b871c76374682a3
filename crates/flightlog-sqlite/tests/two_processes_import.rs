//! Two processes importing OTLP-shaped spans into one SQLite file at the same time, far past the
//! point where the writer merges its recent span-id index into the middle one and sweeps the
//! middle into the main one (schema version 6).
//!
//! Why it exists: every process has its own writer, its own cached index counts and sweep
//! cursor, and its own Bloom filter of span ids, and none of them may be trusted across the
//! other process's commits. The merges and sweeps move ids between three indexes inside the
//! writer's transaction; with two writers alternating on the lock, an id must still live in
//! exactly one index, be found by either process, and be taken once.
//!
//! Each child process (the test binary re-executed) imports its own traces, and both also
//! deliver the same shared traces (as two collectors exporting one trace would), interleaved.
//! The parent then checks: every span of both processes is stored once; every shared span was
//! created by exactly one of them and seen as already stored by the other; the three span-id
//! indexes together hold every id once; and both processes' ids are refused to a new run.

mod support;

use std::path::Path;
use std::time::Duration;

use flightlog_core::activity::{ActivityStore, ImportedSpan};
use flightlog_sqlite::SqliteActivityStore;
use support::{ended_otlp_span, open_store, report, spawn_writer_process, writer_process_args};

const CHILD_ROLE: &str = "two_processes_importer";
const CHILD_TEST: &str = "two_processes_child_importer";
const TAGS: [&str; 2] = ["a", "b"];
/// Spans each process imports on its own: past two merges of the recent index (16,384 ids
/// each) per process, so merges and sweeps happen in both.
const OWN_SPANS: u64 = 24_000;
/// Spans both processes deliver.
const SHARED_SPANS: u64 = 4_000;
const BATCH: u64 = 500;
const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// A random-looking 16-hex span id, as OTLP sends; `space` keeps the processes' own ids and
/// the shared ones apart.
fn id(space: u64, n: u64) -> String {
    format!(
        "{:016x}",
        (space << 40 | n).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    )
}

fn space_of(tag: &str) -> u64 {
    match tag {
        "a" => 1,
        _ => 2,
    }
}

const SHARED_SPACE: u64 = 3;

fn span(space: u64, n: u64) -> ImportedSpan {
    let root = n - n % 10;
    ended_otlp_span(
        id(space, n),
        format!("run-{space}-{}", n / 10),
        (n != root).then(|| id(space, root)),
        1_000 + n as i64,
    )
}

/// Wait (30 s at most) until every importer has opened its store, so that they import at the
/// same time whatever their start-up took: each leaves a file next to the database and waits
/// for the others'.
fn start_together(db: &Path, tag: &str) {
    let ready = |tag: &str| db.with_extension(format!("ready-{tag}"));
    std::fs::write(ready(tag), b"").expect("mark ready");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !TAGS.iter().all(|tag| ready(tag).exists()) {
        if std::time::Instant::now() > deadline {
            report("ERROR the other importer never got ready");
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Concurrent import tasks per process.
const IMPORT_TASKS: u64 = 3;

/// Task `task`'s share of a process's imports: its own batches `task`, `task + IMPORT_TASKS`, …,
/// each followed now and then by one of the shared batches (every process delivers them all,
/// in the same order). Returns the spans it created, own and shared.
async fn import_part(store: SqliteActivityStore, own: u64, task: u64) -> (u64, u64) {
    let (mut created_own, mut created_shared) = (0u64, 0u64);
    let shared_batches = SHARED_SPANS / BATCH;
    let own_batches = OWN_SPANS / BATCH;
    let every = own_batches / shared_batches;
    for call in (task..own_batches).step_by(IMPORT_TASKS as usize) {
        let spans = (call * BATCH..(call + 1) * BATCH)
            .map(|n| span(own, n))
            .collect();
        match store.import_spans(spans).await {
            Ok(done) => created_own += done.created,
            Err(err) => report(&format!("ERROR own import: {err}")),
        }
        if call % every == 0 && call / every < shared_batches {
            let shared = call / every;
            let spans = (shared * BATCH..(shared + 1) * BATCH)
                .map(|n| span(SHARED_SPACE, n))
                .collect();
            match store.import_spans(spans).await {
                Ok(done) => {
                    created_shared += done.created;
                    if !done.rejected.is_empty() {
                        report(&format!("ERROR shared import rejected {:?}", done.rejected));
                    }
                }
                Err(err) => report(&format!("ERROR shared import: {err}")),
            }
        }
    }
    (created_own, created_shared)
}

/// The child process's body (a no-op in an ordinary `cargo test` run; see `two_processes.rs`
/// for the protocol). Reports `CREATED <own> <shared>` and `ERROR …` lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_child_importer() {
    let Some((path, tag)) = writer_process_args(CHILD_ROLE) else {
        return;
    };
    let store = open_store(Path::new(&path), &format!("importer-{tag}"));
    start_together(Path::new(&path), &tag);
    let own = space_of(&tag);
    // Several callers at once, so the writer always has the next import queued and commits
    // groups back to back, as under real ingest.
    let tasks: Vec<_> = (0..IMPORT_TASKS)
        .map(|task| tokio::spawn(import_part(store.clone(), own, task)))
        .collect();
    let (mut created_own, mut created_shared) = (0u64, 0u64);
    for task in tasks {
        let (own_count, shared_count) = task.await.expect("an import task does not panic");
        created_own += own_count;
        created_shared += shared_count;
    }
    report(&format!("CREATED {created_own} {created_shared}"));
}

#[test]
fn two_processes_import_into_one_file_and_every_span_id_lives_in_one_index() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("imports.db");
    let path_text = path.to_str().expect("UTF-8 path").to_owned();
    // The schema exists before the children race to open the file.
    drop(open_store(&path, "parent"));
    let children: Vec<_> = TAGS
        .iter()
        .map(|tag| spawn_writer_process(CHILD_TEST, CHILD_ROLE, &path_text, tag))
        .collect();
    let mut created_shared = 0;
    for (child, tag) in children.into_iter().zip(TAGS) {
        let (lines, status, stderr) = child.finish(CHILD_TIMEOUT);
        assert!(
            status.success(),
            "importer {tag} failed: {status}\n{stderr}"
        );
        let errors: Vec<_> = lines.iter().filter(|l| l.starts_with("ERROR")).collect();
        assert!(errors.is_empty(), "importer {tag}: {errors:?}");
        let created = lines
            .iter()
            .find_map(|l| l.strip_prefix("CREATED "))
            .unwrap_or_else(|| panic!("importer {tag} did not finish: {lines:?}\n{stderr}"));
        let counts: Vec<u64> = created
            .split(' ')
            .map(|n| n.parse().expect("a count"))
            .collect();
        assert_eq!(
            counts[0], OWN_SPANS,
            "importer {tag} created its own spans once"
        );
        created_shared += counts[1];
    }
    // Each shared span was created by exactly one of the two.
    assert_eq!(created_shared, SHARED_SPANS);

    let conn = rusqlite::Connection::open(&path).expect("open the file");
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |row| row.get(0)).expect(sql) };
    let spans = (2 * OWN_SPANS + SHARED_SPANS) as i64;
    assert_eq!(count("SELECT COUNT(*) FROM activity_spans"), spans);
    // The two really wrote at the same time: their span keys (allocated in commit order)
    // interleave. Each imports back to back, with no pause: before the writers took turns at
    // the lock (`lock_turns.rs`), the first to start held the other off for its whole run.
    let key_range = |space: u64| -> (i64, i64) {
        conn.query_row(
            "SELECT MIN(s.span_key), MAX(s.span_key) FROM activity_spans s
               JOIN activity_runs r USING (run_key) WHERE r.run_id LIKE ?1",
            [format!("run-{space}-%")],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("key range")
    };
    let (a, b) = (key_range(1), key_range(2));
    println!("span keys: importer a {a:?}, importer b {b:?}");
    assert!(
        a.0 < b.1 && b.0 < a.1,
        "the processes did not interleave: {a:?} {b:?}"
    );
    let [recent, middle, main] = [
        "SELECT COUNT(*) FROM activity_span_ids_recent",
        "SELECT COUNT(*) FROM activity_span_ids_middle",
        "SELECT COUNT(*) FROM activity_span_ids",
    ]
    .map(count);
    println!("span ids: {recent} recent, {middle} middle, {main} main");
    assert_eq!(recent + middle + main, spans);
    assert!(middle > 0 && main > 0, "{recent} {middle} {main}");
    let indexed_once = count(
        "SELECT COUNT(*) FROM (
           SELECT span_id FROM activity_span_ids_recent
           UNION SELECT span_id FROM activity_span_ids_middle
           UNION SELECT span_id FROM activity_span_ids)",
    );
    assert_eq!(indexed_once, spans, "an id is in two indexes");
    let unindexed = count(
        "SELECT COUNT(*) FROM activity_spans s WHERE NOT EXISTS
           (SELECT 1 FROM activity_span_ids_recent r WHERE r.span_id = s.span_id)
         AND NOT EXISTS (SELECT 1 FROM activity_span_ids_middle m WHERE m.span_id = s.span_id)
         AND NOT EXISTS (SELECT 1 FROM activity_span_ids a WHERE a.span_id = s.span_id)",
    );
    assert_eq!(unindexed, 0);

    // A third writer finds ids of both processes, wherever they live, and refuses them to a
    // new run.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store = open_store(&path, "checker");
        for space in [1, 2, SHARED_SPACE] {
            let last = if space == SHARED_SPACE {
                SHARED_SPANS
            } else {
                OWN_SPANS
            };
            for n in (0..last).step_by(1_499) {
                let found = store.get_span(&id(space, n)).await.expect("read");
                let found = found.unwrap_or_else(|| panic!("span {space}/{n} not found"));
                assert_eq!(found.run_id, format!("run-{space}-{}", n / 10));
                let mut again = span(space, n);
                again.run_id = "elsewhere".into();
                again.parent_span_id = None;
                let done = store.import_spans(vec![again]).await.expect("import");
                assert_eq!(done.rejected.len(), 1, "{space}/{n}: {done:?}");
            }
        }
    });
}
