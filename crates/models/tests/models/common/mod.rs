//! Checks shared by the models' integration tests.

pub mod rank_of;
pub mod thread_heap;

/// Asserts that every parameter gradient of `got` is within 1e-4 of the
/// same tensor of `want` (one `Vec` per parameter, same order), measured
/// against that tensor's largest entry floored at 1e-3 of the model's
/// largest gradient: some gradients (GPT-2's key biases: softmax is
/// shift-invariant) are analytically zero, rounding only.
pub fn assert_gradients_match(family: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len(), "{family}: parameter count");
    let largest = want.iter().flatten().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let gap = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let scale = w
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()))
            .max(1e-3 * largest);
        assert!(
            gap <= 1e-4 * scale,
            "{family}: parameter {i}: gap {gap} at scale {scale}"
        );
    }
}

/// `n` deterministic values in [-1, 1) (a linear congruential generator).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
