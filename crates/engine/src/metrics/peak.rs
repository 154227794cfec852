//! The measured peak FLOP/s of a device without a data-sheet peak, for MFU.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

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
