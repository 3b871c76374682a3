//! Whether the file system under the database still reads and writes: asked before SQLite's
//! "the file is damaged" is believed.
//!
//! Why it exists: SQLite cannot tell a damaged file from a failing disk. When the file system
//! under a running server fails (a dead disk, a file system the kernel shut down or made
//! read-only after an error), its reads fail or come back short, SQLite finds pages that are not
//! b-tree pages and reports `SQLITE_CORRUPT`. Every request was then a 500 telling the operator
//! to restore the file from a backup, while `/healthz` said ok, and the file was whole once the
//! disk was back (an audit's finding: ext4 shut down under the server with `EXT4_IOC_SHUTDOWN`,
//! every later request "database disk image is malformed"; `PRAGMA integrity_check` said ok
//! after a remount). So before a "damaged" error is reported, the disk is asked: the database
//! file's header is read, and a small file beside it is written, synced and removed. If either
//! fails with an I/O error, the error is the disk's (`StoreError::DiskFailed`: a 503 that says
//! to check the disk, and `/healthz` says the same).

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind, Read, Write};
use std::path::Path;

use crate::side_files::side_file_path;

/// The suffix of the file written beside the database to ask the disk (removed at once).
const PROBE_SUFFIX: &str = "-flightlog-probe";

/// Why the file system under the database at `path` fails, or `None` when it reads the file's
/// header and writes beside it. Errors that are not the disk's (no such file, no permission)
/// are not its failure: a file SQLite finds damaged on a disk that answers is damaged.
pub(crate) fn file_system_trouble(path: &Path) -> Option<String> {
    if let Err(err) = read_header(path) {
        if is_disk_failure(&err) {
            return Some(format!("reading {} fails: {err}", path.display()));
        }
    }
    let probe = side_file_path(path, PROBE_SUFFIX);
    let written = write_and_sync(&probe);
    let _ = fs::remove_file(&probe);
    match written {
        Err(err) if is_disk_failure(&err) => Some(format!(
            "writing a file beside {} fails: {err}",
            path.display()
        )),
        _ => None,
    }
}

/// The first 100 bytes of the file (SQLite's header).
fn read_header(path: &Path) -> io::Result<()> {
    let mut header = [0u8; 100];
    let mut file = File::open(path)?;
    // A file shorter than a header is SQLite's to judge, not a disk failure.
    let _ = file.read(&mut header)?;
    Ok(())
}

fn write_and_sync(probe: &Path) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(probe)?;
    file.write_all(b"flightlog disk probe\n")?;
    file.sync_all()
}

/// An error the device or its file system gave (as opposed to a path or permission problem).
fn is_disk_failure(err: &io::Error) -> bool {
    // `EIO`, `ENXIO` and `ENODEV` have these numbers on Linux and the BSDs; `EUCLEAN` is Linux's
    // "structure needs cleaning" (a file system that found itself damaged).
    const EIO: i32 = 5;
    const ENXIO: i32 = 6;
    const ENODEV: i32 = 19;
    const EUCLEAN: i32 = 117;
    if matches!(
        err.kind(),
        ErrorKind::ReadOnlyFilesystem | ErrorKind::StaleNetworkFileHandle
    ) {
        return true;
    }
    let errno = err.raw_os_error();
    matches!(errno, Some(EIO | ENXIO | ENODEV))
        || (cfg!(target_os = "linux") && errno == Some(EUCLEAN))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database on a disk that answers: no trouble, and nothing left beside it.
    #[test]
    fn a_disk_that_answers_is_no_trouble() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("x.db");
        fs::write(&db, b"SQLite format 3\0").expect("write");
        assert_eq!(file_system_trouble(&db), None);
        let left: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|entry| entry.expect("entry").file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("x.db")]);
    }

    /// A missing file or folder is not the disk's failure.
    #[test]
    fn a_missing_file_is_not_the_disks_failure() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(file_system_trouble(&dir.path().join("gone.db")), None);
        assert_eq!(file_system_trouble(&dir.path().join("no/such/x.db")), None);
    }

    /// A read the kernel fails with `EIO` (as a dead disk's or a shut-down file system's do):
    /// `/proc/self/mem` at offset 0, which no process maps.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_io_error_reading_the_file_is_the_disks_failure() {
        let trouble = file_system_trouble(Path::new("/proc/self/mem")).expect("trouble");
        assert!(
            trouble.contains("reading /proc/self/mem fails"),
            "{trouble}"
        );
    }
}
