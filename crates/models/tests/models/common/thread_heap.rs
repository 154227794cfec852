//! A global allocator that counts each thread's allocations, so a test can
//! measure the peak heap of what it runs on its own thread while the other
//! tests of the binary run beside it (the engine's `CountingAllocator`
//! counts the whole process).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    /// Bytes allocated minus bytes freed by this thread (negative when it
    /// frees what another thread allocated).
    static CURRENT: Cell<isize> = const { Cell::new(0) };
    /// The highest `CURRENT` since [`peak_during`] began.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting each thread's bytes.
pub struct ThreadCounting;

fn add(bytes: isize) {
    // `try_with`: nothing is counted while the thread's storage is torn down.
    let _ = CURRENT.try_with(|c| {
        let now = c.get() + bytes;
        c.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

unsafe impl GlobalAlloc for ThreadCounting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        add(-(layout.size() as isize));
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// Runs `f` and returns its result with the highest heap this thread held
/// during it above what it held before, bytes.
pub fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let start = CURRENT.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - start).max(0) as usize)
}
