//! The names of flightlog's own files beside a database (`-flightlog-turn`,
//! `-flightlog-rewind`, a WAL moved aside, a server's instance lock), kept within the file
//! system's limit on a name.
//!
//! Why it exists: each side file is named `<database file name><suffix>`. A database name that
//! leaves room for SQLite's own companions (`-journal`, `-wal`, `-shm`) may still leave none for
//! a longer suffix, and a side file that cannot be created was silently done without: a server's
//! instance lock was skipped, so a second server with the same instance name closed the first
//! one's live spans (an audit's finding). Such a name is shortened here instead: a prefix of the
//! database's name, `~`, and a hash of the whole name, then the suffix; two databases whose
//! names differ only past the prefix still get different side files. A name that fits is used
//! as it is, so every flightlog version names the same file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The longest file name (in bytes) common Linux file systems take.
pub(crate) const NAME_MAX: usize = 255;

/// `<database><suffix>` beside the database, its name shortened to `NAME_MAX` bytes when
/// needed (see the module's doc).
pub fn side_file_path(database: &Path, suffix: &str) -> PathBuf {
    let name = database.file_name().unwrap_or_default();
    let name_bytes = name.as_encoded_bytes();
    if name_bytes.len() + suffix.len() <= NAME_MAX {
        let mut path = database.as_os_str().to_owned();
        path.push(suffix);
        return PathBuf::from(path);
    }
    // FNV-1a of the whole name: stable across builds, so every version names the same file.
    let hash = name_bytes.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    });
    let marker = format!("~{hash:08x}");
    let room = NAME_MAX.saturating_sub(suffix.len() + marker.len());
    let prefix = utf8_prefix(name_bytes, room);
    let mut shortened = OsString::from(prefix);
    shortened.push(marker);
    shortened.push(suffix);
    database.with_file_name(shortened)
}

/// The longest prefix of `bytes` within `room` bytes that is whole UTF-8 (any bytes past the
/// first invalid one are left out): a name the file system takes and a person can read.
fn utf8_prefix(bytes: &[u8], room: usize) -> String {
    let valid = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(err) => std::str::from_utf8(&bytes[..err.valid_up_to()]).unwrap_or_default(),
    };
    let mut end = valid.len().min(room);
    while !valid.is_char_boundary(end) {
        end -= 1;
    }
    valid[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_fits_is_kept_and_a_long_one_is_shortened_apart_from_its_neighbours() {
        let folder = Path::new("/data");
        let short = folder.join("flightlog.db");
        assert_eq!(
            side_file_path(&short, "-flightlog-turn"),
            Path::new("/data/flightlog.db-flightlog-turn")
        );
        let long_a = folder.join(format!("{}a.db", "é".repeat(120)));
        let long_b = folder.join(format!("{}b.db", "é".repeat(120)));
        let a = side_file_path(&long_a, "-flightlog-rewind");
        let b = side_file_path(&long_b, "-flightlog-rewind");
        assert_ne!(a, b);
        for path in [&a, &b] {
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            assert!(name.len() <= NAME_MAX, "{} bytes", name.len());
            assert!(name.ends_with("-flightlog-rewind"), "{name}");
            assert!(name.starts_with("éé"), "{name}");
        }
        assert_eq!(a.parent(), Some(folder));
        // The same database always gets the same name.
        assert_eq!(a, side_file_path(&long_a, "-flightlog-rewind"));
    }

    #[test]
    fn a_long_name_that_is_not_utf8_still_gets_a_short_side_file() {
        use std::os::unix::ffi::OsStrExt;
        let mut bytes = b"db-".to_vec();
        bytes.extend(std::iter::repeat_n(0xff_u8, 250));
        let database = Path::new("/data").join(std::ffi::OsStr::from_bytes(&bytes));
        let side = side_file_path(&database, "-serve-x-00000000.lock");
        let name = side
            .file_name()
            .expect("a name")
            .as_encoded_bytes()
            .to_vec();
        assert!(name.len() <= NAME_MAX);
        assert!(
            name.starts_with(b"db-~"),
            "{}",
            String::from_utf8_lossy(&name)
        );
    }
}
