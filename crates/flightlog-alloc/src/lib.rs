//! The global allocator of the `flightlog` binary and of the benchmarks that measure its store:
//! mimalloc, called the way its fast path wants.
//!
//! Why mimalloc at all: request handling (OTLP decoding and mapping, JSON, hyper and axum's
//! per-request boxes) makes ~60 small allocations a request; with glibc malloc its slow paths
//! were ~15% of the request threads (BENCHMARKS.md, "OpenTelemetry ingest").
//!
//! Why not the `mimalloc` crate's `MiMalloc`: it passes every request to `mi_malloc_aligned`,
//! whatever its alignment. That costs ~18 instructions more than `mi_malloc` on every call, and
//! every block over 1 KiB (axum's boxed handler futures are, a few a request) takes the aligned
//! allocator's generic path, ~240 instructions. Callgrind of the single-op HTTP phase put those
//! at ~3.5% of the request threads' instructions. `mi_malloc` already returns blocks aligned to
//! 16 bytes when they are at least 16 bytes long (and to 8 below: mimalloc rounds small size
//! classes to two words, `MI_ALIGN2W`), so a layout whose alignment is at most 16 and at most its
//! size is served by the plain functions, as the standard library's `System` allocator does with
//! `malloc`; any other layout keeps the aligned ones. Every block is freed by `mi_free`, which
//! takes both kinds.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every `mi_malloc` block of at least this size has (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// Whether `mi_malloc(size)` is aligned enough for `align`.
#[inline]
fn plain_will_do(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

/// mimalloc as the global allocator: `#[global_allocator] static A: Mimalloc = Mimalloc;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mimalloc;

// SAFETY: each method forwards to the mimalloc function with that method's contract (a block of
// at least `size` bytes aligned to `align`, or null; zeroed for `alloc_zeroed`; contents kept by
// `realloc`), choosing the plain function only where its blocks are known to be aligned enough
// (see `plain_will_do` and the module docs); `mi_free` frees blocks of either kind.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if plain_will_do(layout.align(), layout.size()) {
            // SAFETY: any size may be asked of `mi_malloc`.
            unsafe { mi::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: `Layout` guarantees a power-of-two alignment, as `mi_malloc_aligned` needs.
            unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if plain_will_do(layout.align(), layout.size()) {
            // SAFETY: as `alloc`.
            unsafe { mi::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: as `alloc`.
            unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract), so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if plain_will_do(layout.align(), new_size) {
            // SAFETY: `ptr` came from mimalloc; the new block keeps the old contents up to the
            // smaller size and, by `plain_will_do`, is aligned enough.
            unsafe { mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast() }
        } else {
            // SAFETY: as above, with the alignment asked for explicitly.
            unsafe { mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast() }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment from 1 to 4096 at sizes around the size classes, through the allocator
    /// directly (the test binary keeps the system allocator): each block has its alignment,
    /// a zeroed one is zero, and a block grown then shrunk keeps its contents.
    #[test]
    fn every_block_has_its_alignment_and_keeps_its_contents() {
        let allocator = Mimalloc;
        let mut align = 1;
        while align <= 4096 {
            for size in [1, 3, 7, 8, 9, 15, 16, 17, 24, 40, 1000, 1025, 5000, 70_000] {
                let layout = Layout::from_size_align(size, align).expect("a valid layout");
                for zeroed in [false, true] {
                    // SAFETY: non-zero sizes; each block is used within its size, reallocated
                    // with the layout it has, and freed once with its last layout.
                    unsafe {
                        let block = if zeroed {
                            allocator.alloc_zeroed(layout)
                        } else {
                            allocator.alloc(layout)
                        };
                        check_block(
                            block,
                            align,
                            size,
                            if zeroed {
                                Holds::Zeros
                            } else {
                                Holds::Anything
                            },
                        );
                        fill(block, size);
                        let grown_size = size * 3 + 5;
                        let grown = allocator.realloc(block, layout, grown_size);
                        check_block(grown, align, size, Holds::Pattern);
                        fill(grown, grown_size);
                        let grown_layout =
                            Layout::from_size_align(grown_size, align).expect("a valid layout");
                        let shrunk_size = (size / 2).max(1);
                        let shrunk = allocator.realloc(grown, grown_layout, shrunk_size);
                        check_block(shrunk, align, shrunk_size, Holds::Pattern);
                        let shrunk_layout =
                            Layout::from_size_align(shrunk_size, align).expect("a valid layout");
                        allocator.dealloc(shrunk, shrunk_layout);
                    }
                }
            }
            align *= 2;
        }
    }

    /// Writes the test pattern over `size` bytes.
    ///
    /// # Safety
    /// `block` points to at least `size` writable bytes.
    unsafe fn fill(block: *mut u8, size: usize) {
        for i in 0..size {
            // SAFETY: within the block (the caller's contract).
            unsafe { *block.add(i) = (i % 251) as u8 };
        }
    }

    /// What a block's first bytes must hold.
    #[derive(Clone, Copy)]
    enum Holds {
        /// Not initialized: nothing to read.
        Anything,
        Zeros,
        /// What [`fill`] writes.
        Pattern,
    }

    /// Checks a block's alignment and what its first `size` bytes hold.
    ///
    /// # Safety
    /// `block` is null or points to at least `size` readable bytes, initialized unless `holds`
    /// is [`Holds::Anything`].
    unsafe fn check_block(block: *mut u8, align: usize, size: usize, holds: Holds) {
        assert!(!block.is_null(), "size {size}, align {align}");
        assert_eq!(block as usize % align, 0, "size {size}, align {align}");
        let expected = |i: usize| match holds {
            Holds::Anything => None,
            Holds::Zeros => Some(0),
            Holds::Pattern => Some((i % 251) as u8),
        };
        for i in 0..size {
            if let Some(expected) = expected(i) {
                // SAFETY: within the block and initialized (the caller's contract).
                let byte = unsafe { *block.add(i) };
                assert_eq!(byte, expected, "byte {i} of {size}");
            }
        }
    }
}
