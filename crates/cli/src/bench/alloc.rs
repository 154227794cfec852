//! Heap accounting for the reference path, from the binary's counting
//! global allocator (`ferrotron_engine::metrics::CountingAllocator`,
//! installed in `main.rs`).

use anyhow::{anyhow, Result};
use ferrotron_engine::metrics::HeapWindow;

use super::reference::Meter;

/// The reference's memory on a CPU backend: the peak of the Rust heap
/// between [`Meter::start`] and [`Meter::peak`], above the heap at the start.
#[derive(Default)]
pub struct HeapMeter {
    window: Option<HeapWindow>,
}

impl Meter for HeapMeter {
    fn start(&mut self) -> Result<()> {
        self.window = Some(
            HeapWindow::open()
                .ok_or_else(|| anyhow!("the counting allocator is not the global allocator"))?,
        );
        Ok(())
    }

    fn sample(&mut self) -> Result<()> {
        Ok(())
    }

    fn peak(&self) -> u64 {
        self.window.map_or(0, |w| w.peak_above_start() as u64)
    }
}
