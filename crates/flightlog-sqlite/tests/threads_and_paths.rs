//! The database's background threads end with it, and the path it resolves for its side files.
//!
//! One test per process concern: the thread test counts this process's threads by name, so it
//! is the only test in this binary that opens a database while it counts.

use std::path::Path;
use std::time::{Duration, Instant};

use flightlog_sqlite::{real_database_path, SqliteConfig, SqliteDatabase};

/// This process's threads named `name` (as `/proc/self/task/*/comm` shows them).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("list this process's threads")
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            std::fs::read_to_string(entry.path().join("comm"))
                .is_ok_and(|comm| comm.trim_end() == name)
        })
        .count()
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The commit watcher (like the writer and the checkpointer) ends when the database is closed,
/// before `close` checkpoints the WAL away, and also when every handle is dropped without a
/// close: no thread or connection outlives the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_threads_end_with_the_database() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let threads = ["flightlog-watch", "flightlog-ckpt", "flightlog-write"];
    let counts = || threads.map(threads_named);
    assert_eq!(counts(), [0, 0, 0]);

    let closed = SqliteDatabase::open(SqliteConfig::new(dir.path().join("closed.db")))
        .expect("the database opens");
    // A thread names itself once it runs.
    wait_until("the threads start", || counts() == [1, 1, 1]);
    assert!(closed.close().await.expect("a clean close"));
    assert_eq!(counts(), [0, 0, 0], "joined by close");
    // Nothing of the closed database is left beside it.
    assert!(!dir.path().join("closed.db-wal").exists());

    let dropped = SqliteDatabase::open(SqliteConfig::new(dir.path().join("dropped.db")))
        .expect("the database opens");
    wait_until("the threads start", || counts() == [1, 1, 1]);
    drop(dropped);
    wait_until("the threads end after a drop", || counts() == [0, 0, 0]);
}

#[test]
fn the_real_path_follows_links_and_is_absolute() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let real_dir = dir.path().canonicalize().expect("a real folder");
    std::fs::create_dir(real_dir.join("data")).expect("a folder");
    std::fs::write(real_dir.join("data/f.db"), b"").expect("a file");
    std::os::unix::fs::symlink(real_dir.join("data/f.db"), real_dir.join("link.db"))
        .expect("a link to the file");
    std::os::unix::fs::symlink(real_dir.join("data"), real_dir.join("linked-folder"))
        .expect("a link to the folder");

    // A link to the file: the file.
    assert_eq!(
        real_database_path(&real_dir.join("link.db")),
        real_dir.join("data/f.db")
    );
    // A file not made yet, in a linked folder: in the real folder.
    assert_eq!(
        real_database_path(&real_dir.join("linked-folder/new.db")),
        real_dir.join("data/new.db")
    );
    // Nothing to resolve: the path as given.
    assert_eq!(
        real_database_path(Path::new("/no/such/folder/x.db")),
        Path::new("/no/such/folder/x.db")
    );
    // A relative path: absolute, against the working folder.
    let relative = real_database_path(Path::new("not-made-yet.db"));
    assert!(relative.is_absolute(), "{}", relative.display());
    assert_eq!(
        relative,
        std::env::current_dir()
            .and_then(|folder| folder.canonicalize())
            .expect("the working folder")
            .join("not-made-yet.db")
    );
}
