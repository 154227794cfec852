//! Peak memory of one phase of a run on one rank (building the model,
//! saving or loading a checkpoint), for `metrics.jsonl`.
//!
//! Host memory is the process's resident set: Linux keeps its high-water
//! mark (`VmHWM` of `/proc/self/status`) and resets it to the resident set
//! of the moment when "5" is written to `/proc/self/clear_refs`, so
//! [`PhaseWindow::open`] resets it and [`PhaseWindow::close`] reads it.
//! Where the reset fails (no `/proc`, or a kernel that refuses it) the
//! window records no host peak rather than the peak of the whole process
//! life. GPU memory is read from the runtime's pools through a
//! [`DeviceMemoryProbe`] when the phase ends.

use serde::{Deserialize, Serialize};

use super::memory::parse_kb_field;
use super::DeviceMemoryProbe;

/// A phase whose peak memory is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryPhase {
    /// Building this rank's part of the model and parallelizing it
    /// (optimizer state, ZeRO's sharding).
    Build,
    /// Writing this rank's shards of a checkpoint.
    CheckpointSave,
    /// Reading this rank's share of a checkpoint (a resumed run).
    CheckpointLoad,
}

/// One rank's memory over one phase: a line of `metrics.jsonl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseMemory {
    /// The phase (`"build"`, `"checkpoint_save"`, `"checkpoint_load"`).
    pub memory_phase: MemoryPhase,
    /// The rank measured (world rank).
    pub rank: usize,
    /// Optimizer steps done when the phase ended (0 for a fresh build; the
    /// checkpoint's step for a save or a load).
    pub step: usize,
    /// The process's peak resident memory during the phase, bytes
    /// (`VmHWM` after resetting it at the phase's start); absent where the
    /// kernel could not reset it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// The process's resident memory when the phase began, bytes (`VmRSS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_rss_bytes: Option<u64>,
    /// GPU bytes in live allocations when the phase ended (CubeCL's pools);
    /// absent on CPU backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes_in_use: Option<u64>,
    /// GPU bytes the pools hold when the phase ended: the pools keep their
    /// largest demand, so this bounds the phase's device peak from above;
    /// absent on CPU backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_bytes_reserved: Option<u64>,
}

/// An open measurement of one phase (see the module doc).
#[derive(Debug)]
pub struct PhaseWindow {
    phase: MemoryPhase,
    /// Whether `VmHWM` was reset at the start (a host peak is measured).
    reset: bool,
    start_rss: Option<u64>,
    device: Option<DeviceMemoryProbe>,
}

impl PhaseWindow {
    /// Starts measuring `phase`: resets the process's peak resident memory
    /// to its resident memory now. `device` reads the GPU's pools at the end.
    /// One window at a time per process: opening one ends the previous.
    pub fn open(phase: MemoryPhase, device: Option<DeviceMemoryProbe>) -> Self {
        let reset = reset_peak_rss();
        Self {
            phase,
            reset,
            start_rss: status_bytes("VmRSS"),
            device,
        }
    }

    /// Ends the window: the record of world rank `rank` after `step` steps.
    pub fn close(self, rank: usize, step: usize) -> PhaseMemory {
        let device = self.device.as_ref().and_then(DeviceMemoryProbe::read);
        PhaseMemory {
            memory_phase: self.phase,
            rank,
            step,
            peak_rss_bytes: if self.reset {
                status_bytes("VmHWM")
            } else {
                None
            },
            start_rss_bytes: self.start_rss,
            device_bytes_in_use: device.map(|d| d.in_use),
            device_bytes_reserved: device.map(|d| d.reserved),
        }
    }
}

/// Resets `VmHWM` to the resident set now; whether the kernel took it.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The line `FIELD:  N kB` of `/proc/self/status`, bytes.
fn status_bytes(field: &str) -> Option<u64> {
    parse_kb_field(&std::fs::read_to_string("/proc/self/status").ok()?, field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_kibibytes() {
        let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(parse_kb_field(text, "VmHWM"), Some(2048 * 1024));
        assert_eq!(parse_kb_field(text, "VmRSS"), Some(1024 * 1024));
        assert_eq!(parse_kb_field(text, "VmPeak"), None);
        assert_eq!(parse_kb_field("VmHWM: 12\n", "VmHWM"), None);
    }

    /// The window's peak sees a buffer touched and freed inside it, and a
    /// window opened after the buffer is gone does not.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_window_sees_the_peak_inside_it_and_not_before() {
        const BIG: usize = 256 << 20;
        let touch = || {
            let v = vec![1u8; BIG];
            std::hint::black_box(&v);
        };
        let w = PhaseWindow::open(MemoryPhase::Build, None);
        touch();
        let inside = w.close(3, 7);
        assert_eq!((inside.rank, inside.step), (3, 7));
        let start = inside.start_rss_bytes.expect("VmRSS on Linux");
        let peak = inside.peak_rss_bytes.expect("clear_refs resets VmHWM");
        // The kernel's resident counts are approximate by a few pages.
        let most = (BIG - BIG / 16) as u64;
        assert!(peak >= start + most, "peak {peak}, start {start}");
        let after = PhaseWindow::open(MemoryPhase::CheckpointSave, None).close(0, 0);
        let (p, s) = (
            after.peak_rss_bytes.unwrap(),
            after.start_rss_bytes.unwrap(),
        );
        assert!(p < s + (BIG as u64) / 2, "peak {p}, start {s}");
        assert_eq!(
            serde_json::to_value(after).unwrap()["memory_phase"],
            "checkpoint_save"
        );
    }
}
