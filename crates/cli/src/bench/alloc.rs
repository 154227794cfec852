//! Heap accounting for the reference path: a `#[global_allocator]` that wraps
//! [`System`] and keeps the bytes currently allocated and their peak.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use anyhow::Result;

use super::reference::Meter;

/// [`System`] plus two relaxed counters, in bytes: live heap and its peak
/// since the last [`CountingAlloc::reset_peak`].
pub struct CountingAlloc {
    current: AtomicUsize,
    peak: AtomicUsize,
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc {
    current: AtomicUsize::new(0),
    peak: AtomicUsize::new(0),
};

impl CountingAlloc {
    fn grow(&self, bytes: usize) {
        let now = self.current.fetch_add(bytes, Relaxed) + bytes;
        self.peak.fetch_max(now, Relaxed);
    }

    fn shrink(&self, bytes: usize) {
        self.current.fetch_sub(bytes, Relaxed);
    }

    /// Sets the peak to the current live bytes and returns them: the
    /// baseline of a measurement.
    pub fn reset_peak() -> usize {
        let now = GLOBAL.current.load(Relaxed);
        GLOBAL.peak.store(now, Relaxed);
        now
    }

    /// Highest live heap, in bytes, since the last [`Self::reset_peak`].
    pub fn peak() -> usize {
        GLOBAL.peak.load(Relaxed)
    }
}

// SAFETY: every call is forwarded unchanged to `System`; the counters only
// observe sizes.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            self.grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        self.shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            self.shrink(layout.size());
            self.grow(new_size);
        }
        p
    }
}

/// The reference's memory on a CPU backend: the peak of the Rust heap
/// between [`Meter::start`] and [`Meter::peak`], above the heap at the start.
#[derive(Default)]
pub struct HeapMeter {
    base: usize,
}

impl Meter for HeapMeter {
    fn start(&mut self) -> Result<()> {
        self.base = CountingAlloc::reset_peak();
        Ok(())
    }

    fn sample(&mut self) -> Result<()> {
        Ok(())
    }

    fn peak(&self) -> u64 {
        CountingAlloc::peak().saturating_sub(self.base) as u64
    }
}
