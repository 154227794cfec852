//! Optimizer offload (`--offload optimizer`) as the planner prices it: a
//! layout's [`Choice::offload`](super::Choice::offload) keeps each rank's
//! ZeRO shard of the optimizer state in host memory and updates it on the
//! CPU, as the trainer does (`crate::zero`, ZeRO-Offload's scheme).
//!
//! - Memory: the shard's optimizer state leaves the device for the host:
//!   [`Precision::state_bytes`]'s optimizer bytes per shard value (12 in
//!   mixed precision: fp32 master weights and both moments, the ZeRO
//!   paper's K; 8 in f32, whose master weights are the model's parameters
//!   and stay). Under ZeRO-3 the shard's parameter pieces leave too (the
//!   trainer keeps its f32 pieces, the master weights, on the host and
//!   gathers from there): 12 bytes per shard value in every precision.
//! - Time, added to the step whole (the trainer updates after the step's
//!   reduction; nothing overlaps it): the gradient shard down and the
//!   updated parameter shard up over PCIe, `(bg + bp)` bytes per shard
//!   value at [`host_link_bandwidth`], and AdamW's pass on the CPU, which
//!   reads the parameter, the gradient and both moments and writes the
//!   parameter and the moments (28 bytes of f32 per shard value), memory
//!   bound at [`HOST_BANDWIDTH_PER_GPU`].
//!
//! The search tries offload only when no layout fits without it.

use ferrotron_engine::metrics::MemoryBytes;

use super::memory::Precision;
use crate::zero::ZeroStage;

/// Host memory bandwidth one GPU's rank gets for the CPU update, bytes/s:
/// a DGX A100's, two AMD EPYC 7742 of 8 DDR4-3200 channels each (409.6
/// GB/s peak) shared by 8 GPUs, the lowest of the nodes
/// [`host_link_bandwidth`] knows (a DGX H100's two Xeon 8480C with 8
/// DDR5-4800 channels each give 76.8 GB/s per GPU).
pub const HOST_BANDWIDTH_PER_GPU: f64 = 51.2e9;

/// Bytes the CPU update moves per shard value: reads the f32 parameter,
/// gradient and both moments, writes the parameter and the moments
/// (`engine::optim::adamw_host`'s one pass).
pub const CPU_ADAM_BYTES_PER_VALUE: f64 = 28.0;

/// The bandwidth of the link between a GPU of type `gpu` and its host,
/// bytes/s per direction; `None` for a device the planner does not offer
/// offload on (a CPU, whose memory is the host's, or an unknown type).
/// Sources: PCIe 4.0 x16 (32 GB/s per direction) on the A100; PCIe 5.0
/// x16 (64 GB/s) on the H100, H200 and MI300X; on HPE Cray EX nodes
/// (Frontier, LUMI) each MI250X GCD reaches the CPU over a 36 GB/s
/// Infinity Fabric link.
pub fn host_link_bandwidth(gpu: &str) -> Option<f64> {
    match gpu {
        "a100-40gb" | "a100-80gb" => Some(32e9),
        "h100-80gb" | "h200" | "mi300x" => Some(64e9),
        "mi250x-gcd" => Some(36e9),
        _ => None,
    }
}

/// Moves the shard's optimizer state of `state` (a rank's training state
/// under `zero`, 1 to 3, in `precision`) to the host; returns the host
/// bytes. Under ZeRO-3 the parameter pieces move too.
pub fn offload_state(state: &mut MemoryBytes, zero: ZeroStage, precision: Precision) -> usize {
    let (bp, _, bo) = precision.state_bytes();
    let shard = state.optimizer_bytes / bo;
    let mut host = state.optimizer_bytes;
    state.optimizer_bytes = 0;
    if zero == ZeroStage::Three {
        state.param_bytes -= bp * shard;
        // The f32 master pieces: already in `bo` under mixed precision.
        host += if precision == Precision::Fp32 {
            4 * shard
        } else {
            0
        };
    }
    host
}

/// Seconds one step spends on offload for `shard` values of optimizer
/// state per rank in `precision` on a GPU of type `gpu`: PCIe both ways
/// and the CPU update (see the module doc); 0 where
/// [`host_link_bandwidth`] does not know `gpu`.
pub fn offload_time_s(shard: usize, precision: Precision, gpu: &str) -> f64 {
    let Some(pcie) = host_link_bandwidth(gpu) else {
        return 0.0;
    };
    let (bp, bg, _) = precision.state_bytes();
    let n = shard as f64;
    (bp + bg) as f64 * n / pcie + CPU_ADAM_BYTES_PER_VALUE * n / HOST_BANDWIDTH_PER_GPU
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offloaded_state_leaves_the_device_for_the_host() {
        let state = |p: usize, o: usize| MemoryBytes {
            param_bytes: p,
            grad_bytes: 7,
            optimizer_bytes: o,
        };
        // f32 ZeRO-1 with a shard of 100 values: the moments (8 bytes each).
        let mut s = state(4_000, 800);
        assert_eq!(offload_state(&mut s, ZeroStage::One, Precision::Fp32), 800);
        assert_eq!(s, state(4_000, 0));
        // f32 ZeRO-3: moments and the f32 pieces, 12 bytes per value; the
        // placeholders stay.
        let mut s = state(4 * 100 + 4 * 5, 800);
        assert_eq!(
            offload_state(&mut s, ZeroStage::Three, Precision::Fp32),
            1_200
        );
        assert_eq!(s, state(20, 0));
        // bf16 ZeRO-3: master and moments (12), the bf16 pieces go too.
        let mut s = state(2 * 100 + 2 * 5, 1_200);
        assert_eq!(
            offload_state(&mut s, ZeroStage::Three, Precision::Bf16),
            1_200
        );
        assert_eq!(s, state(10, 0));
    }

    #[test]
    fn offload_time_is_pcie_both_ways_and_the_cpu_pass() {
        // 1e9 f32 values on an H100: 8 GB over 64 GB/s, 28 GB over 51.2 GB/s.
        let t = offload_time_s(1_000_000_000, Precision::Fp32, "h100-80gb");
        assert!((t - (8.0 / 64.0 + 28.0 / 51.2)).abs() < 1e-12, "{t}");
        assert_eq!(offload_time_s(1_000, Precision::Fp32, "cpu"), 0.0);
    }
}
