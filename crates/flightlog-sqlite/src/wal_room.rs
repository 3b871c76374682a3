//! How long the WAL may grow on the disk it is on: a quarter of the room it could take.
//!
//! Why it exists: under sustained writes the WAL is rewound only every 16,384 frames (64 MiB of
//! 4 KiB pages) and the writer's hard cap is twice that (see `Checkpointer::WAL_RESTART_FRAMES`
//! and `SqliteConfig::wal_hard_cap_frames`), and the file keeps its high-water length. On a disk
//! with less free space than that the WAL itself filled it: on a 40 MB file system the WAL
//! reached 41 MB for a database of 0.5 MB, every write after it was refused as "disk full", and
//! so it stayed once the writes stopped and across a restart (the checkpoint that would shorten
//! the WAL needs room to grow the database file), until space was added (an audit's finding).
//!
//! How: the checkpointer measures, once a period, the free space of the file system under the
//! WAL (`statvfs`) plus the WAL's own length (room it holds already), and allows the WAL a
//! quarter of that, in pages, at least [`MIN_FRAMES`]. The writer nudges the checkpointer, the
//! checkpointer asks for a rewind, and the writer rewinds at its hard cap, each at the smaller
//! of its own threshold and its share of this room; on a disk with gigabytes free nothing
//! changes. What is left is the database's own data: a disk it fills is full.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};

/// The fewest frames the WAL is allowed (1 MiB of 4 KiB pages): below this the disk is full
/// anyway, and rewinding more often would only cost the writer.
pub(crate) const MIN_FRAMES: i64 = 256;

/// The frames the WAL may hold, as last measured (shared by the checkpointer, which measures,
/// and the writer).
#[derive(Debug)]
pub(crate) struct WalRoom {
    frames: AtomicI64,
}

impl Default for WalRoom {
    fn default() -> Self {
        Self {
            frames: AtomicI64::new(i64::MAX),
        }
    }
}

impl WalRoom {
    /// The frames the WAL may hold (`i64::MAX` before the first measure, or when the free
    /// space could not be read).
    pub(crate) fn frames(&self) -> i64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// Measure the room of the WAL at `wal_path` (its folder's file system), of pages of
    /// `page_size` bytes.
    pub(crate) fn measure(&self, wal_path: &Path, page_size: u64) {
        let folder = wal_path
            .parent()
            .filter(|folder| !folder.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let Ok(stats) = rustix::fs::statvfs(folder) else {
            return;
        };
        let free = stats.f_bavail.saturating_mul(stats.f_frsize);
        let wal_len = std::fs::metadata(wal_path).map_or(0, |meta| meta.len());
        self.frames
            .store(room_frames(free, wal_len, page_size), Ordering::Relaxed);
    }
}

/// A quarter of `free` bytes plus the WAL's own `wal_len`, in pages of `page_size`, at least
/// [`MIN_FRAMES`].
pub(crate) fn room_frames(free: u64, wal_len: u64, page_size: u64) -> i64 {
    let room = free.saturating_add(wal_len) / 4 / page_size.max(512);
    i64::try_from(room).unwrap_or(i64::MAX).max(MIN_FRAMES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_gets_a_quarter_of_the_room_and_never_less_than_a_floor() {
        const MIB: u64 = 1 << 20;
        // The audit's 40 MB file system, empty: 10 MiB of WAL, 2,560 pages.
        assert_eq!(room_frames(40 * MIB, 0, 4096), 2_560);
        // Its WAL's own length counts as room: 30 MB free beside a 10 MB WAL is the same.
        assert_eq!(room_frames(30 * MIB, 10 * MIB, 4096), 2_560);
        // A full disk: the floor.
        assert_eq!(room_frames(0, 0, 4096), MIN_FRAMES);
        // A large disk: far past every threshold, so nothing changes.
        assert!(room_frames(100 << 30, 0, 4096) > 1 << 20);
        assert_eq!(
            room_frames(u64::MAX, u64::MAX, 4096),
            (u64::MAX / 4 / 4096) as i64
        );
    }

    #[test]
    fn a_measure_of_a_real_folder_gives_room() {
        let room = WalRoom::default();
        assert_eq!(room.frames(), i64::MAX);
        let dir = std::env::temp_dir().join("flightlog-wal-room-probe-wal");
        room.measure(&dir, 4096);
        assert!(room.frames() >= MIN_FRAMES);
        assert!(room.frames() < i64::MAX);
    }
}
