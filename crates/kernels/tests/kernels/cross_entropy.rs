//! Fused cross-entropy against a host reference (including the GPT-2 and
//! Llama 3 vocabulary sizes; logits in f32, f16 and bf16), and the reference's gradient against central
//! finite differences.

use crate::common;

use common::{
    assert_close, assert_close_f64, download, download_as, finite_diff, round_to, upload,
    upload_as, upload_u32, zeros, Rng,
};
use ferrotron_kernels::cross_entropy::{
    cross_entropy_forward_backward, cross_entropy_forward_backward_typed, IGNORE_INDEX,
};
use ferrotron_kernels::FloatDtype;

/// Returns `(row_loss, mean_loss, d_logits)` for `grad_scale * mean_loss`.
fn reference(
    logits: &[f64],
    targets: &[u32],
    vocab: usize,
    grad_scale: f64,
) -> (Vec<f64>, f64, Vec<f64>) {
    let valid = targets.iter().filter(|&&t| (t as usize) < vocab).count();
    let mut row_loss = Vec::new();
    let mut grad = Vec::new();
    for (row, &t) in logits.chunks(vocab).zip(targets) {
        let ignored = t as usize >= vocab;
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        row_loss.push(if ignored { 0.0 } else { lse - row[t as usize] });
        for (j, v) in row.iter().enumerate() {
            let onehot = if j == t as usize { 1.0 } else { 0.0 };
            let g = ((v - lse).exp() - onehot) * grad_scale / valid.max(1) as f64;
            grad.push(if ignored { 0.0 } else { g });
        }
    }
    let mean = row_loss.iter().sum::<f64>() / valid.max(1) as f64;
    (row_loss, mean, grad)
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Runs the kernel with `dtype` logits on seeded inputs and compares it
/// with the f64 reference on the same (rounded) logits: the f32 losses
/// within the f32 bound, the gradient (stored as `dtype`) within
/// [`common::tolerance`] of it.
fn check(dtype: FloatDtype, rows: usize, vocab: usize, ignore_every: usize, seed: u64) {
    let client = common::client();
    let mut rng = Rng::new(seed);
    let logits = round_to(dtype, &rng.vec(rows * vocab, -8.0, 8.0));
    let targets: Vec<u32> = (0..rows)
        .map(|r| {
            if r % ignore_every == 1 {
                IGNORE_INDEX
            } else {
                rng.below(vocab) as u32
            }
        })
        .collect();
    let grad_scale = 0.5;
    let lh = upload_as(&client, dtype, &logits);
    let th = upload_u32(&client, &targets);
    let (row_loss, mean) = (zeros(&client, rows), zeros(&client, 1));
    cross_entropy_forward_backward_typed(
        &client,
        dtype,
        &lh,
        &th,
        &row_loss,
        &mean,
        rows,
        vocab,
        grad_scale as f32,
    )
    .unwrap();
    let (el, em, eg) = reference(&to_f64(&logits), &targets, vocab, grad_scale);
    let tag = format!("cross-entropy {} [{rows}, {vocab}]", dtype.name());
    assert_close(
        &format!("{tag} row loss"),
        &download(&client, &row_loss),
        &to_f32(&el),
        1e-5,
    );
    assert_close(
        &format!("{tag} mean loss"),
        &download(&client, &mean),
        &[em as f32],
        1e-5,
    );
    assert_close(
        &format!("{tag} d_logits"),
        &download_as(&client, dtype, &lh),
        &to_f32(&eg),
        common::tolerance(dtype, 1e-5),
    );
}

#[test]
fn cross_entropy_small_vocabularies_match_reference() {
    // Vocabularies below, at and above the cube size, odd; one row ignored
    // in every three.
    for (i, (rows, vocab)) in [(1, 1), (4, 7), (5, 256), (7, 1001)]
        .into_iter()
        .enumerate()
    {
        check(FloatDtype::F32, rows, vocab, 3, 23 + i as u64);
    }
}

#[test]
fn cross_entropy_f16_and_bf16_match_reference() {
    for dtype in common::low_precision_dtypes(&common::client()) {
        for (i, (rows, vocab)) in [(1, 1), (4, 7), (7, 1001), (3, 50_257)]
            .into_iter()
            .enumerate()
        {
            check(dtype, rows, vocab, 3, 31 + i as u64);
        }
    }
}

#[test]
fn cross_entropy_gpt2_vocabulary_matches_reference() {
    check(FloatDtype::F32, 3, 50_257, 3, 29);
}

#[test]
fn cross_entropy_llama3_vocabulary_matches_reference() {
    check(FloatDtype::F32, 2, 128_256, 5, 31);
}

#[test]
fn cross_entropy_all_rows_ignored_gives_zero_loss_and_gradient() {
    let client = common::client();
    let (rows, vocab) = (3, 10);
    let lh = upload(&client, &vec![1.0; rows * vocab]);
    let th = upload_u32(&client, &[IGNORE_INDEX; 3]);
    let (row_loss, mean) = (zeros(&client, rows), zeros(&client, 1));
    cross_entropy_forward_backward(&client, &lh, &th, &row_loss, &mean, rows, vocab, 1.0).unwrap();
    assert_eq!(download(&client, &mean), vec![0.0]);
    assert!(download(&client, &lh).iter().all(|&g| g == 0.0));
}

#[test]
fn cross_entropy_rejects_wrong_target_buffer() {
    let client = common::client();
    let (lh, th) = (zeros(&client, 12), upload_u32(&client, &[0, 1]));
    let (row_loss, mean) = (zeros(&client, 3), zeros(&client, 1));
    let err =
        cross_entropy_forward_backward(&client, &lh, &th, &row_loss, &mean, 3, 4, 1.0).unwrap_err();
    assert!(err.to_string().contains("targets holds 8 bytes"), "{err}");
}

#[test]
fn cross_entropy_reference_gradient_matches_finite_differences() {
    let mut rng = Rng::new(37);
    let (rows, vocab) = (3, 4);
    let logits = to_f64(&rng.vec(rows * vocab, -3.0, 3.0));
    let targets = [2, IGNORE_INDEX, 0];
    let (_, _, grad) = reference(&logits, &targets, vocab, 1.0);
    let fd = finite_diff(&logits, |l| reference(l, &targets, vocab, 1.0).1);
    assert_close_f64("cross-entropy fd d_logits", &grad, &fd, 1e-6);
}
