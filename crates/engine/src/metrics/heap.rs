//! A counting global allocator: the bytes of heap in use and their peak,
//! for the peak activation memory of a training step on CPU backends.
//!
//! The `ferrotron` binary installs [`CountingAllocator`] as its global
//! allocator (`#[global_allocator]`); a library user may do the same. It
//! forwards every call to the system allocator and keeps two counters over
//! every thread of the process: the bytes currently allocated (the sizes
//! requested, not the allocator's rounding or its own bookkeeping) and the
//! highest value that count has reached since the last [`HeapWindow::open`].
//! Without the allocator installed, [`HeapWindow::open`] returns `None` and
//! nothing is measured.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Bytes currently allocated through [`CountingAllocator`].
static CURRENT: AtomicUsize = AtomicUsize::new(0);
/// Highest value of [`CURRENT`] since the last window opened.
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Set by the first allocation through [`CountingAllocator`].
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// The system allocator, counting the bytes in use and their peak.
pub struct CountingAllocator;

impl CountingAllocator {
    fn grew(size: usize) {
        let now = CURRENT.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(now, Ordering::Relaxed);
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
    }

    fn shrank(size: usize) {
        CURRENT.fetch_sub(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counters are only arithmetic on atomics (they never allocate).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::shrank(layout.size());
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // Counted as the new block allocated before the old is freed,
            // which is what a moving realloc holds for a moment.
            Self::grew(new_size);
            Self::shrank(layout.size());
        }
        p
    }
}

/// Bytes currently allocated through [`CountingAllocator`] (0 when it is
/// not the global allocator).
pub fn heap_bytes() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// A measurement of the heap's peak over a stretch of the program (one
/// training step).
#[derive(Clone, Copy, Debug)]
pub struct HeapWindow {
    start: usize,
}

impl HeapWindow {
    /// Starts a window at the heap in use now (resetting the peak to it),
    /// or `None` when [`CountingAllocator`] is not the global allocator.
    /// One window at a time: opening one ends the previous.
    pub fn open() -> Option<Self> {
        if !INSTALLED.load(Ordering::Relaxed) {
            return None;
        }
        let start = CURRENT.load(Ordering::Relaxed);
        PEAK.store(start, Ordering::Relaxed);
        Some(Self { start })
    }

    /// The highest heap in use since [`HeapWindow::open`] above the heap at
    /// that moment, bytes.
    pub fn peak_above_start(&self) -> usize {
        PEAK.load(Ordering::Relaxed).saturating_sub(self.start)
    }
}
