//! Peak FLOP/s of devices, for MFU.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

/// Dense peak FLOP/s per device (bf16/fp16 tensor cores, no sparsity), from
/// the vendors' data sheets. Names are matched case-insensitively.
pub const PEAK_FLOPS_TABLE: &[(&str, f64)] = &[
    ("a100", 312e12),
    ("h100", 989e12),
    ("h200", 989e12),
    ("mi250x", 383e12),
    ("mi300x", 1307e12),
];

/// The table's peak FLOP/s for a device name such as "h100", if listed.
pub fn peak_flops_for(device: &str) -> Option<f64> {
    let d = device.to_ascii_lowercase();
    PEAK_FLOPS_TABLE
        .iter()
        .find(|(name, _)| *name == d)
        .map(|(_, f)| *f)
}

/// Measures the FLOP/s of a float32 `[n, n] x [n, n]` matmul on `device`:
/// the best of `repeats` timed runs after one warm-up, `2 n^3` FLOPs each.
///
/// CPUs have no data-sheet peak that a backend can reach, so MFU on a CPU is
/// reported against this measured matmul rate.
pub fn measure_matmul_flops<B: Backend>(device: &B::Device, n: usize, repeats: usize) -> f64 {
    let a = Tensor::<B, 2>::random([n, n], Distribution::Default, device);
    let b = Tensor::<B, 2>::random([n, n], Distribution::Default, device);
    let _ = a.clone().matmul(b.clone()).into_data();
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        let _ = a.clone().matmul(b.clone()).into_data();
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lookup_ignores_case() {
        assert_eq!(peak_flops_for("H100"), Some(989e12));
        assert_eq!(peak_flops_for("tpu"), None);
    }
}
