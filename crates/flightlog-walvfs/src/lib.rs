//! A thin SQLite VFS over the stock `unix` VFS that writes each WAL commit with one `pwrite(2)`.
//!
//! Why it exists: SQLite appends every WAL frame with two system calls, the 24-byte frame header
//! and then the page. One group commit of flightlog's writer dirties 25–35 pages, so a commit
//! was 50–70 `pwrite` calls, each paying the system-call entry and a partial-page copy into the
//! page cache (measured with `strace -c` on the activity benchmark: 55 `pwrite` per commit, and
//! about a third of the writer thread's time in the kernel). The writer thread is the one serial
//! resource of the SQLite backend, so its kernel time is flightlog's write throughput.
//!
//! What it does: the WAL file's writes are gathered in memory while they are contiguous, and
//! written with one call when the transaction's commit frame is complete. Everything else —
//! the database file, the shared-memory wal-index, locking, syncing, every other VFS method — is
//! the `unix` VFS's own code, called straight through. The bytes that reach the file, their
//! order relative to the wal-index, and the file format are unchanged, so other processes and
//! the stock `sqlite3` tool share the file as before.
//!
//! Why it is safe (the invariants SQLite's WAL relies on):
//! - **Readers never see a frame that is not in the file.** Other connections find frames only
//!   through the wal-index header, which SQLite publishes after `walFrames` has written every
//!   frame of the commit. Here, the commit frame is recognised by its header (a non-zero
//!   "database size after commit" field, bytes 4–8), and from that frame on every write goes
//!   to the file before the write call returns; so all frames are in the file (in the OS page
//!   cache, exactly where `pwrite` left them before) before `walFrames` returns and before the
//!   header is published. A write error is returned from that same call, and SQLite abandons the
//!   commit as it would have.
//! - **The connection itself reads what it wrote.** Any read, size query, truncation, sync,
//!   lock, file control or close of the WAL first writes out what is gathered.
//! - **Nothing stays gathered past the transaction.** Every shared-memory lock change of the
//!   database file (a transaction's end releases the WAL write lock) and every memory barrier
//!   (issued between the two copies of the wal-index header) first writes out the linked WAL.
//! - **Non-contiguous writes** (SQLite overwriting a frame it wrote earlier in the same
//!   transaction, or rewriting checksums) land in the gathered bytes if they fall inside them;
//!   otherwise what is gathered is written first, in order.
//! - A WAL whose database file was not opened through this VFS (SQLite's
//!   `sqlite3_database_file_object` finds no link) is written straight through, never gathered.
//!
//! Only the connection that appends to the WAL (flightlog's writer) needs this VFS; readers and
//! the checkpointer use the default one.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

mod sync;
pub use sync::sync_database_file;

/// The name this VFS is registered under (pass it to `Connection::open_with_flags_and_vfs`).
pub const VFS_NAME: &str = "flightlog-wal";
const VFS_NAME_C: &CStr = c"flightlog-wal";

/// Above this many gathered bytes the WAL writes are written out even mid-transaction, so a huge
/// transaction never holds more than this in memory.
const MAX_GATHERED_BYTES: usize = 4 << 20;

/// The largest write handed to the `unix` VFS in one call (31 pages of 4 KiB; see `write_out`).
const UNIX_MAX_WRITE_BYTES: usize = 31 * 4096;

/// Size of a WAL frame header; SQLite writes each one with its own call.
const WAL_FRAME_HEADER_BYTES: c_int = 24;

/// Counters of this process's WAL writes through the VFS, for tests and benchmarks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalWriteCounts {
    /// Writes SQLite asked of a WAL file.
    pub requested: u64,
    /// Writes that reached the `unix` VFS.
    pub issued: u64,
}

static REQUESTED: AtomicU64 = AtomicU64::new(0);
static ISSUED: AtomicU64 = AtomicU64::new(0);

/// This process's WAL write counts so far.
pub fn wal_write_counts() -> WalWriteCounts {
    WalWriteCounts {
        requested: REQUESTED.load(Ordering::Relaxed),
        issued: ISSUED.load(Ordering::Relaxed),
    }
}

/// Why the VFS could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterError(pub String);

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot register the {VFS_NAME} SQLite VFS: {}", self.0)
    }
}

impl std::error::Error for RegisterError {}

/// The registered VFS's address, kept only to make registration happen once.
struct Registered(#[allow(dead_code)] usize);

static REGISTRATION: OnceLock<Result<Registered, RegisterError>> = OnceLock::new();

/// Register the VFS with SQLite (once per process; later calls return the first result).
/// Returns the name to open connections with.
pub fn register() -> Result<&'static str, RegisterError> {
    match REGISTRATION.get_or_init(register_once) {
        Ok(_) => Ok(VFS_NAME),
        Err(err) => Err(err.clone()),
    }
}

fn register_once() -> Result<Registered, RegisterError> {
    turn_off_memory_statistics();
    // SAFETY: `sqlite3_vfs_find` initialises SQLite if needed and returns a pointer to a VFS
    // that stays registered for the life of the process (or null).
    let unix = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
    if unix.is_null() {
        return Err(RegisterError("SQLite has no `unix` VFS here".into()));
    }
    // SAFETY: `unix` is a valid VFS; copying the struct copies its function pointers, which the
    // `unix` VFS implements without looking at the `sqlite3_vfs` pointer they are given (only
    // its `xOpen` reads `pAppData`, and `x_open` calls it with the `unix` pointer itself).
    let mut vfs: ffi::sqlite3_vfs = unsafe { ptr::read(unix) };
    let inner_file_bytes =
        usize::try_from(vfs.szOsFile).map_err(|_| RegisterError("negative szOsFile".into()))?;
    vfs.szOsFile = c_int::try_from(inner_offset() + inner_file_bytes)
        .map_err(|_| RegisterError("szOsFile overflow".into()))?;
    vfs.pNext = ptr::null_mut();
    vfs.zName = VFS_NAME_C.as_ptr();
    vfs.pAppData = unix.cast();
    vfs.xOpen = Some(x_open);
    let leaked: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
    let address = ptr::from_mut(leaked);
    // SAFETY: the VFS struct is leaked, so it outlives every connection; SQLite only links it.
    let rc = unsafe { ffi::sqlite3_vfs_register(address, 0) };
    if rc != ffi::SQLITE_OK {
        return Err(RegisterError(format!("sqlite3_vfs_register returned {rc}")));
    }
    Ok(Registered(address as usize))
}

/// SQLite keeps allocation statistics by default, taking a process-wide mutex on every
/// `malloc` and `free` it makes; flightlog never reads them (`sqlite3_memory_used`, the soft heap
/// limit), and the lock was ~6% of the writer thread under OTLP ingest (perf on the import
/// benchmark). This must run before SQLite initialises; later it is refused (`SQLITE_MISUSE`)
/// and changes nothing, which is harmless.
fn turn_off_memory_statistics() {
    // SAFETY: `SQLITE_CONFIG_MEMSTATUS` takes one `int`; SQLite checks that it is not yet
    // initialised and refuses otherwise.
    let _ = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int) };
}

/// What a file opened through this VFS is to SQLite.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    MainDatabase,
    Wal,
    Other,
}

/// The WAL writes gathered since the last write-out.
#[derive(Default)]
struct Gathered {
    bytes: Vec<u8>,
    /// File offset of `bytes[0]`.
    offset: i64,
    /// The current transaction's commit frame header has been written: write everything through.
    commit_seen: bool,
}

/// The `sqlite3_file` this VFS hands SQLite; the `unix` file lives in the same allocation, after
/// it (SQLite allocates `szOsFile` bytes and never moves them).
#[repr(C)]
struct WrappedFile {
    /// Must be first: SQLite reads `pMethods` through the `sqlite3_file` pointer.
    base: ffi::sqlite3_file,
    inner: *mut ffi::sqlite3_file,
    role: Role,
    /// For a main database file: its open WAL, written out before any wal-index change.
    wal: *mut WrappedFile,
    /// For a WAL: its main database file (to unlink on close).
    main: *mut WrappedFile,
    /// For a linked WAL: the gathered writes (a leaked `Box`, freed on close).
    gathered: *mut Gathered,
}

/// Where the `unix` file starts inside a [`WrappedFile`] allocation (8-byte aligned).
const fn inner_offset() -> usize {
    std::mem::size_of::<WrappedFile>().next_multiple_of(8)
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

/// The wrapper behind a `sqlite3_file` pointer SQLite passes back to us.
///
/// # Safety
/// `file` must be a file opened by [`x_open`] and not yet closed.
unsafe fn wrapped<'a>(file: *mut ffi::sqlite3_file) -> &'a mut WrappedFile {
    // SAFETY: per the contract, `file` points at a live `WrappedFile` (its first field).
    unsafe { &mut *file.cast::<WrappedFile>() }
}

/// The `unix` file's method table.
///
/// # Safety
/// `inner` must be an open `unix` file.
unsafe fn inner_methods<'a>(inner: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: an open file always has its method table set.
    unsafe { &*(*inner).pMethods }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: `vfs` is our registered VFS, whose `pAppData` is the `unix` VFS.
    let unix = unsafe { (*vfs).pAppData.cast::<ffi::sqlite3_vfs>() };
    let wrapper = file.cast::<WrappedFile>();
    // SAFETY: SQLite gives us `szOsFile` bytes at `file`, so the wrapper and the inner file fit.
    let inner = unsafe { file.cast::<u8>().add(inner_offset()) }.cast::<ffi::sqlite3_file>();
    let role = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
        Role::MainDatabase
    } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
        Role::Wal
    } else {
        Role::Other
    };
    // SAFETY: the memory is ours to initialise; `pMethods` stays null until the open succeeds,
    // which tells SQLite not to call `xClose` on failure.
    unsafe {
        ptr::write(
            wrapper,
            WrappedFile {
                base: ffi::sqlite3_file {
                    pMethods: ptr::null(),
                },
                inner,
                role,
                wal: ptr::null_mut(),
                main: ptr::null_mut(),
                gathered: ptr::null_mut(),
            },
        );
    }
    // SAFETY: `unix` is the `unix` VFS; its `xOpen` is always set.
    let rc = match unsafe { (*unix).xOpen } {
        // SAFETY: the arguments are SQLite's own, with our inner file in place of the wrapper.
        Some(open) => unsafe { open(unix, name, inner, flags, out_flags) },
        None => ffi::SQLITE_CANTOPEN,
    };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: the wrapper was initialised above.
    let this = unsafe { &mut *wrapper };
    if role == Role::Wal && !name.is_null() {
        // SAFETY: `name` is the WAL name SQLite passed to `xOpen`, which is what this accepts.
        let main = unsafe { ffi::sqlite3_database_file_object(name) };
        // SAFETY: a non-null result is the pager's open main database file; we only treat it as
        // ours if its method table is ours.
        if !main.is_null() && ptr::eq(unsafe { (*main).pMethods }, &METHODS) {
            let main = main.cast::<WrappedFile>();
            this.main = main;
            this.gathered = Box::into_raw(Box::default());
            // SAFETY: `main` is a live wrapper of the same connection.
            unsafe { (*main).wal = wrapper };
        }
    }
    this.base.pMethods = &METHODS;
    ffi::SQLITE_OK
}

/// Call a method of the `unix` file, or answer `missing` if it has none.
macro_rules! forward {
    ($inner:expr, $method:ident, $missing:expr, ($($arg:expr),*)) => {
        match inner_methods($inner).$method {
            Some(method) => method($inner $(, $arg)*),
            None => $missing,
        }
    };
}

/// `SQLITE_FULL` for a write that failed for lack of room other than a full disk: past a
/// file-size limit (`EFBIG`, with SIGXFSZ handled) or a disk quota (`EDQUOT`). The `unix` VFS
/// reports `ENOSPC` (and a short write) as `SQLITE_FULL` but these as `SQLITE_IOERR_WRITE`, so
/// the store answered them as internal errors (500) where a full disk gets 503 and a retry.
/// Read right after the failed call, whose `pwrite` set `errno`.
fn full_when_out_of_room(rc: c_int) -> c_int {
    /// `EFBIG` and `EDQUOT` on Linux.
    const EFBIG: i32 = 27;
    const EDQUOT: i32 = 122;
    if rc != ffi::SQLITE_IOERR_WRITE || !cfg!(target_os = "linux") {
        return rc;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(EFBIG | EDQUOT) => ffi::SQLITE_FULL,
        _ => rc,
    }
}

/// Write out what a WAL has gathered, in one call.
fn write_out(file: &mut WrappedFile) -> c_int {
    if file.gathered.is_null() {
        return ffi::SQLITE_OK;
    }
    // SAFETY: a non-null `gathered` is the live box this file owns.
    let gathered = unsafe { &mut *file.gathered };
    if gathered.bytes.is_empty() {
        return ffi::SQLITE_OK;
    }
    // The `unix` VFS writes at most 128 KiB - 1 per call (it masks the length with `0x1ffff`),
    // so larger gatherings go out in page-aligned chunks below that.
    let mut rc = ffi::SQLITE_OK;
    let mut offset = gathered.offset;
    for chunk in gathered.bytes.chunks(UNIX_MAX_WRITE_BYTES) {
        // SAFETY: `inner` is the open `unix` file; the chunk is valid for its length, which
        // fits a `c_int` (it is at most `UNIX_MAX_WRITE_BYTES`).
        rc = unsafe {
            forward!(
                file.inner,
                xWrite,
                ffi::SQLITE_IOERR_WRITE,
                (chunk.as_ptr().cast(), chunk.len() as c_int, offset)
            )
        };
        ISSUED.fetch_add(1, Ordering::Relaxed);
        if rc != ffi::SQLITE_OK {
            rc = full_when_out_of_room(rc);
            break;
        }
        offset += chunk.len() as i64;
    }
    gathered.bytes.clear();
    rc
}

/// Write out the WAL linked to a main database file, if any.
fn write_out_linked_wal(main: &mut WrappedFile) -> c_int {
    if main.wal.is_null() {
        return ffi::SQLITE_OK;
    }
    // SAFETY: the link is cleared when the WAL closes, so a non-null link is a live WAL.
    let wal = unsafe { &mut *main.wal };
    let rc = write_out(wal);
    if !wal.gathered.is_null() {
        // SAFETY: as in `write_out`.
        unsafe { (*wal.gathered).commit_seen = false };
    }
    rc
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes only files we opened.
    let this = unsafe { wrapped(file) };
    let written = write_out(this);
    match this.role {
        Role::Wal if !this.main.is_null() => {
            // SAFETY: the main file unlinks itself on close, so a non-null link is live.
            unsafe { (*this.main).wal = ptr::null_mut() };
        }
        Role::MainDatabase if !this.wal.is_null() => {
            // SAFETY: as above, in the other direction.
            unsafe { (*this.wal).main = ptr::null_mut() };
        }
        _ => {}
    }
    if !this.gathered.is_null() {
        // SAFETY: `gathered` came from `Box::into_raw` and is freed only here.
        drop(unsafe { Box::from_raw(this.gathered) });
        this.gathered = ptr::null_mut();
    }
    // SAFETY: the inner file is open; closing it is the last use.
    let closed = unsafe {
        match inner_methods(this.inner).xClose {
            Some(close) => close(this.inner),
            None => ffi::SQLITE_OK,
        }
    };
    if written != ffi::SQLITE_OK {
        written
    } else {
        closed
    }
}

/// Write out a WAL's gathered writes before an operation that must see the file as written.
macro_rules! after_write_out {
    ($file:expr, |$this:ident, $inner:ident| $call:expr) => {{
        // SAFETY: SQLite passes only files we opened.
        let $this = unsafe { wrapped($file) };
        let rc = write_out($this);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let $inner = $this.inner;
        // SAFETY: forwarding SQLite's own arguments to the open `unix` file.
        unsafe { $call }
    }};
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buffer: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xRead,
        ffi::SQLITE_IOERR_READ,
        (buffer, amount, offset)
    ))
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite passes only files we opened.
    let this = unsafe { wrapped(file) };
    if this.gathered.is_null() {
        // SAFETY: forwarding SQLite's own arguments.
        let rc = unsafe {
            forward!(
                this.inner,
                xWrite,
                ffi::SQLITE_IOERR_WRITE,
                (data, amount, offset)
            )
        };
        return full_when_out_of_room(rc);
    }
    REQUESTED.fetch_add(1, Ordering::Relaxed);
    let Ok(length) = usize::try_from(amount) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite's buffer is valid for `amount` bytes for the duration of the call.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), length) };
    // SAFETY: a non-null `gathered` is the live box this file owns.
    let gathered = unsafe { &mut *this.gathered };
    // Past the commit frame's header, every write goes to the file before returning.
    let write_through = gathered.commit_seen;
    let is_commit_header = amount == WAL_FRAME_HEADER_BYTES && bytes[4..8] != [0, 0, 0, 0];
    if is_commit_header {
        gathered.commit_seen = true;
    }
    let end = gathered.offset + gathered.bytes.len() as i64;
    if gathered.bytes.is_empty() {
        gathered.offset = offset;
        gathered.bytes.extend_from_slice(bytes);
    } else if offset == end {
        gathered.bytes.extend_from_slice(bytes);
    } else if offset >= gathered.offset && offset + i64::from(amount) <= end {
        // An overwrite of a frame gathered earlier in this transaction.
        let start = (offset - gathered.offset) as usize;
        gathered.bytes[start..start + length].copy_from_slice(bytes);
    } else {
        let rc = write_out(this);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        // SAFETY: as above; `write_out` left the box in place.
        let gathered = unsafe { &mut *this.gathered };
        gathered.offset = offset;
        gathered.bytes.extend_from_slice(bytes);
    }
    // SAFETY: as above.
    let gathered_bytes = unsafe { (*this.gathered).bytes.len() };
    if write_through || gathered_bytes >= MAX_GATHERED_BYTES {
        return write_out(this);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xTruncate,
        ffi::SQLITE_IOERR_TRUNCATE,
        (size)
    ))
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xSync,
        ffi::SQLITE_IOERR_FSYNC,
        (flags)
    ))
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xFileSize,
        ffi::SQLITE_IOERR_FSTAT,
        (size)
    ))
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xLock,
        ffi::SQLITE_IOERR_LOCK,
        (level)
    ))
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xUnlock,
        ffi::SQLITE_IOERR_UNLOCK,
        (level)
    ))
}

unsafe extern "C" fn x_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    reserved: *mut c_int,
) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xCheckReservedLock,
        ffi::SQLITE_IOERR_CHECKRESERVEDLOCK,
        (reserved)
    ))
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    after_write_out!(file, |this, inner| forward!(
        inner,
        xFileControl,
        ffi::SQLITE_NOTFOUND,
        (op, arg)
    ))
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite passes only files we opened; forwarding to the open `unix` file.
    unsafe {
        let this = wrapped(file);
        forward!(this.inner, xSectorSize, 4096, ())
    }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: as in `x_sector_size`.
    unsafe {
        let this = wrapped(file);
        forward!(this.inner, xDeviceCharacteristics, 0, ())
    }
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    region_size: c_int,
    extend: c_int,
    mapped: *mut *mut c_void,
) -> c_int {
    // SAFETY: as in `x_sector_size`.
    unsafe {
        let this = wrapped(file);
        forward!(
            this.inner,
            xShmMap,
            ffi::SQLITE_IOERR_SHMMAP,
            (region, region_size, extend, mapped)
        )
    }
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    count: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: SQLite passes only files we opened.
    let this = unsafe { wrapped(file) };
    // Whatever is still gathered here can only be frames past the last commit (a commit's
    // frames are written inside `walFrames`), which no reader looks at. A failure to write them
    // is therefore not reported: reporting it on a lock that was then taken would make SQLite
    // believe the lock failed and never release it.
    let _ = write_out_linked_wal(this);
    // SAFETY: forwarding SQLite's own arguments to the open `unix` file.
    unsafe {
        forward!(
            this.inner,
            xShmLock,
            ffi::SQLITE_IOERR_SHMLOCK,
            (offset, count, flags)
        )
    }
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    // SAFETY: SQLite passes only files we opened.
    let this = unsafe { wrapped(file) };
    // Nothing is gathered here in practice (commit frames are written inside `walFrames`); this
    // is the guarantee that nothing gathered outlives a wal-index header update.
    let _ = write_out_linked_wal(this);
    // SAFETY: forwarding to the open `unix` file.
    unsafe {
        if let Some(barrier) = inner_methods(this.inner).xShmBarrier {
            barrier(this.inner);
        }
    }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: as in `x_sector_size`.
    unsafe {
        let this = wrapped(file);
        forward!(this.inner, xShmUnmap, ffi::SQLITE_OK, (delete))
    }
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    amount: c_int,
    pages: *mut *mut c_void,
) -> c_int {
    // SAFETY: as in `x_sector_size`; a WAL is never memory-mapped, so nothing gathered matters.
    unsafe {
        let this = wrapped(file);
        match inner_methods(this.inner).xFetch {
            Some(fetch) => fetch(this.inner, offset, amount, pages),
            None => {
                *pages = ptr::null_mut();
                ffi::SQLITE_OK
            }
        }
    }
}

unsafe extern "C" fn x_unfetch(
    file: *mut ffi::sqlite3_file,
    offset: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    // SAFETY: as in `x_sector_size`.
    unsafe {
        let this = wrapped(file);
        forward!(this.inner, xUnfetch, ffi::SQLITE_OK, (offset, page))
    }
}
