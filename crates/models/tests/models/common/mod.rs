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
