//! The counting allocator, installed as this test binary's global
//! allocator, measures a window's peak above its start.

use ferrotron_engine::metrics::{heap_bytes, CountingAllocator, HeapWindow};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn a_window_sees_the_peak_of_memory_freed_before_it_ends() {
    // One test in this binary: no other thread allocates during the window.
    let keep = vec![1u8; 1 << 20];
    let window = HeapWindow::open().expect("the allocator is installed");
    let start = heap_bytes();
    assert!(start >= 1 << 20, "the live 1 MiB is counted: {start}");
    {
        let a = vec![2u8; 3 << 20];
        let b = vec![3u8; 2 << 20];
        assert_eq!(a.len() + b.len(), 5 << 20);
    }
    let small = vec![4u8; 1 << 20];
    let peak = window.peak_above_start();
    assert!(
        (5 << 20..(5 << 20) + (64 << 10)).contains(&peak),
        "5 MiB at the peak, measured {peak}"
    );
    assert!(heap_bytes() - start < (1 << 20) + (64 << 10));
    // A new window starts at the heap in use now.
    let next = HeapWindow::open().unwrap();
    assert_eq!(next.peak_above_start(), 0);
    drop((keep, small));
}
