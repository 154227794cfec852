//! LayerNorm and RMSNorm over the last dimension on flex's host buffers,
//! f32, row-parallel over rayon's threads: the forward one pass per row
//! (a row of the decoder, 384 to 4096 floats, stays in cache between its
//! statistics and its output) keeping each row's mean and reciprocal
//! standard deviation; the backward one pass per row writing `d_x` over
//! the upstream gradient's buffer and adding `d_weight` and `d_bias` into
//! per-task sums, added together at the end. Burn's tensor operations make
//! some 10 passes and fresh tensors in forward and 20 in backward.

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use crate::ops::cpu::buffers::{last_dim, tensor, TASK_ELEMENTS};
use crate::ops::cpu::math::simd_dispatch;

/// Lanes of the row reductions: one AVX2 register of f32.
const LANES: usize = 8;

/// `sum_i f(a[i], b[i], c[i])` over eight independent lanes (so that it
/// vectorises), the lanes then the tail added in order.
#[inline(always)]
fn lane_sum(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb, cc) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .zip(cc.remainder())
        .map(|((&a, &b), &c)| f(a, b, c))
        .sum();
    for ((a, b), c) in ca.zip(cb).zip(cc) {
        for (l, ((&a, &b), &c)) in lanes.iter_mut().zip(a.iter().zip(b).zip(c)) {
            *l += f(a, b, c);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// RMSNorm of the rows of `x` (`weight.len()` wide) into `y`, each row's
/// `1 / sqrt(mean(x^2) + eps)` into `rstd`.
#[inline(always)]
fn rms_rows_body(x: &[f32], weight: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]) {
    let h = weight.len();
    for ((x, y), r) in x.chunks_exact(h).zip(y.chunks_exact_mut(h)).zip(rstd) {
        let squares = lane_sum(x, x, x, |a, _, _| a * a);
        let inv = 1.0 / (squares / h as f32 + eps).sqrt();
        *r = inv;
        for ((y, &x), &w) in y.iter_mut().zip(x).zip(weight) {
            *y = x * inv * w;
        }
    }
}

/// LayerNorm (biased variance, two-pass) of the rows of `x` into `y`, each
/// row's mean and `1 / sqrt(var + eps)` into `mean` and `rstd`.
#[inline(always)]
fn layer_rows_body(
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    eps: f32,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) {
    let h = weight.len();
    let rows = x.chunks_exact(h).zip(y.chunks_exact_mut(h));
    for ((x, y), (m, r)) in rows.zip(mean.iter_mut().zip(rstd)) {
        let mu = lane_sum(x, x, x, |a, _, _| a) / h as f32;
        let var = lane_sum(x, x, x, |a, _, _| (a - mu) * (a - mu)) / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        (*m, *r) = (mu, inv);
        for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(weight).zip(bias) {
            *y = ((x - mu) * inv).mul_add(w, b);
        }
    }
}

/// The backward of a norm over the rows of `x` with per-row `mean` (zeros
/// for RMSNorm) and `rstd`: `xhat = (x - mean) rstd`, `g = dy w`,
/// `d_x = rstd (g - (centre sum(g) + xhat sum(g xhat)) / h)` written over
/// `dy` (`centre`: 1 for LayerNorm, 0 for RMSNorm); `d_w += dy xhat` and
/// `d_b += dy`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn norm_backward_rows_body(
    x: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
    centre: f32,
    dy: &mut [f32],
    d_w: &mut [f32],
    d_b: &mut [f32],
) {
    let h = weight.len();
    let rows = x.chunks_exact(h).zip(dy.chunks_exact_mut(h));
    for ((x, dy), (&mu, &inv)) in rows.zip(mean.iter().zip(rstd)) {
        let sum_g = lane_sum(dy, weight, x, |d, w, _| d * w);
        let sum_gx = lane_sum(dy, weight, x, |d, w, x| d * w * (x - mu)) * inv;
        let (mean_g, mean_gx) = (centre * sum_g / h as f32, sum_gx / h as f32);
        let cols = dy.iter_mut().zip(x).zip(weight);
        for (((d, &x), &w), (dw, db)) in cols.zip(d_w.iter_mut().zip(d_b.iter_mut())) {
            let xhat = (x - mu) * inv;
            *dw = d.mul_add(xhat, *dw);
            *db += *d;
            *d = inv * (*d * w - xhat.mul_add(mean_gx, mean_g));
        }
    }
}

simd_dispatch! {
    /// [`rms_rows_body`] on the CPU's best build.
    fn rms_rows(x: &[f32], weight: &[f32], eps: f32, y: &mut [f32], rstd: &mut [f32]) => rms_rows_body
}
simd_dispatch! {
    /// [`layer_rows_body`] on the CPU's best build.
    #[allow(clippy::too_many_arguments)]
    fn layer_rows(
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
        eps: f32,
        y: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
    ) => layer_rows_body
}
simd_dispatch! {
    /// [`norm_backward_rows_body`] on the CPU's best build.
    #[allow(clippy::too_many_arguments)]
    fn norm_backward_rows(
        x: &[f32],
        weight: &[f32],
        mean: &[f32],
        rstd: &[f32],
        centre: f32,
        dy: &mut [f32],
        d_w: &mut [f32],
        d_b: &mut [f32],
    ) => norm_backward_rows_body
}

/// Rows per rayon task for rows of `h` floats: about
/// [`TASK_ELEMENTS`] elements, at least one row.
fn task_rows(h: usize) -> usize {
    (TASK_ELEMENTS / h.max(1)).max(1)
}

/// The per-row statistics a norm's forward keeps for its backward, f32
/// `[rows]` each.
#[derive(Clone, Debug)]
pub struct RowStats {
    /// Each row's mean (all zeros for RMSNorm, which does not centre).
    pub mean: Vec<f32>,
    /// Each row's `1 / sqrt(var + eps)` (RMSNorm: `1 / sqrt(mean(x^2) +
    /// eps)`).
    pub rstd: Vec<f32>,
    /// 1 for LayerNorm, 0 for RMSNorm: whether the backward subtracts the
    /// mean of the gradient.
    centre: f32,
}

/// The rows of the dense `x` (its last dimension `weight`'s length).
fn rows_of(x: &FlexTensor, weight: &[f32], what: &str) -> usize {
    let h = last_dim(x);
    assert!(h > 0, "{what}: rows of no elements");
    assert_eq!(
        h,
        weight.len(),
        "{what}: rows of {h} against a weight of {}",
        weight.len()
    );
    x.layout().num_elements() / h.max(1)
}

/// RMSNorm `x / sqrt(mean(x^2) + eps) * weight` of the dense f32 `x`
/// `[.., hidden]` over its last dimension, `weight` dense f32 `[hidden]`:
/// the output (`x`'s shape) and the statistics for the backward.
pub fn rms_norm(x: &FlexTensor, weight: &FlexTensor, eps: f32) -> (FlexTensor, RowStats) {
    let w = weight.storage::<f32>();
    let rows = rows_of(x, w, "RMSNorm");
    let (xs, h) = (x.storage::<f32>(), w.len());
    let mut y = vec![0.0f32; xs.len()];
    let mut rstd = vec![0.0f32; rows];
    let per = task_rows(h);
    y.par_chunks_mut(per * h)
        .zip(xs.par_chunks(per * h))
        .zip(rstd.par_chunks_mut(per))
        .for_each(|((y, x), r)| rms_rows(x, w, eps, y, r));
    let stats = RowStats {
        mean: vec![0.0; rows],
        rstd,
        centre: 0.0,
    };
    (tensor(y, x.layout().shape().clone()), stats)
}

/// LayerNorm `(x - mean) / sqrt(var + eps) * weight + bias` (biased
/// variance) of the dense f32 `x` `[.., hidden]` over its last dimension,
/// `weight` and `bias` dense f32 `[hidden]`: the output (`x`'s shape) and
/// the statistics for the backward.
pub fn layer_norm(
    x: &FlexTensor,
    weight: &FlexTensor,
    bias: &FlexTensor,
    eps: f32,
) -> (FlexTensor, RowStats) {
    let (w, b) = (weight.storage::<f32>(), bias.storage::<f32>());
    let rows = rows_of(x, w, "LayerNorm");
    assert_eq!(w.len(), b.len(), "LayerNorm: weight and bias lengths");
    let (xs, h) = (x.storage::<f32>(), w.len());
    let mut y = vec![0.0f32; xs.len()];
    let (mut mean, mut rstd) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let per = task_rows(h);
    y.par_chunks_mut(per * h)
        .zip(xs.par_chunks(per * h))
        .zip(mean.par_chunks_mut(per).zip(rstd.par_chunks_mut(per)))
        .for_each(|((y, x), (m, r))| layer_rows(x, w, b, eps, y, m, r));
    let stats = RowStats {
        mean,
        rstd,
        centre: 1.0,
    };
    (tensor(y, x.layout().shape().clone()), stats)
}

/// The gradients `[d_x, d_weight, d_bias]` of [`rms_norm`] or
/// [`layer_norm`] (whichever made `stats`) from the output's gradient
/// `d_y` (dense f32, `x`'s shape): `d_x` written over `d_y`'s buffer (a
/// copy first when another tensor shares it), `d_weight` and `d_bias`
/// `[hidden]` (RMSNorm's `d_bias` is that of a bias it does not have).
pub fn norm_backward(
    x: &FlexTensor,
    weight: &FlexTensor,
    stats: &RowStats,
    mut d_y: FlexTensor,
) -> [FlexTensor; 3] {
    let w = weight.storage::<f32>();
    let rows = rows_of(x, w, "norm backward");
    assert_eq!(
        x.layout().shape(),
        d_y.layout().shape(),
        "norm backward: x and its gradient of different shapes"
    );
    assert_eq!(stats.rstd.len(), rows, "norm backward: statistics rows");
    let (xs, h) = (x.storage::<f32>(), w.len());
    let per = task_rows(h);
    let (d_w, d_b) = d_y
        .storage_mut::<f32>()
        .par_chunks_mut(per * h)
        .zip(xs.par_chunks(per * h))
        .zip(stats.mean.par_chunks(per).zip(stats.rstd.par_chunks(per)))
        .fold(
            || (vec![0.0f32; h], vec![0.0f32; h]),
            |(mut d_w, mut d_b), ((dy, x), (m, r))| {
                norm_backward_rows(x, w, m, r, stats.centre, dy, &mut d_w, &mut d_b);
                (d_w, d_b)
            },
        )
        .reduce(
            || (vec![0.0f32; h], vec![0.0f32; h]),
            |(mut a_w, mut a_b), (b_w, b_b)| {
                a_w.iter_mut().zip(b_w).for_each(|(a, b)| *a += b);
                a_b.iter_mut().zip(b_b).for_each(|(a, b)| *a += b);
                (a_w, a_b)
            },
        );
    let shape = weight.layout().shape().clone();
    [d_y, tensor(d_w, shape.clone()), tensor(d_b, shape)]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable build of the row passes (what a CPU without AVX2 and
    /// FMA runs) gives the dispatched build's results (11 columns: a
    /// vector and a tail of 3).
    #[test]
    fn portable_and_dispatched_row_passes_agree() {
        let (rows, h) = (5, 11);
        let v = |n: usize, s: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 37 + s * 11) % 19) as f32 / 7.0 - 1.0)
                .collect()
        };
        let (x, w, b, dy) = (v(rows * h, 1), v(h, 2), v(h, 3), v(rows * h, 4));
        let close = |a: &[f32], b: &[f32], what: &str| {
            for (i, (p, q)) in a.iter().zip(b).enumerate() {
                assert!(
                    (p - q).abs() <= 1e-6 * q.abs().max(1.0),
                    "{what}[{i}]: {p} vs {q}"
                );
            }
        };
        let run = |portable: bool| {
            let (mut y, mut mean, mut rstd) =
                (vec![0.0; rows * h], vec![0.0; rows], vec![0.0; rows]);
            let (mut y2, mut rstd2) = (vec![0.0; rows * h], vec![0.0; rows]);
            let (mut g, mut d_w, mut d_b) = (dy.clone(), vec![0.0; h], vec![0.0; h]);
            if portable {
                layer_rows_body(&x, &w, &b, 1e-5, &mut y, &mut mean, &mut rstd);
                rms_rows_body(&x, &w, 1e-5, &mut y2, &mut rstd2);
                norm_backward_rows_body(&x, &w, &mean, &rstd, 1.0, &mut g, &mut d_w, &mut d_b);
            } else {
                layer_rows(&x, &w, &b, 1e-5, &mut y, &mut mean, &mut rstd);
                rms_rows(&x, &w, 1e-5, &mut y2, &mut rstd2);
                norm_backward_rows(&x, &w, &mean, &rstd, 1.0, &mut g, &mut d_w, &mut d_b);
            }
            [y, mean, rstd, y2, rstd2, g, d_w, d_b]
        };
        for (k, (p, d)) in run(true).iter().zip(run(false).iter()).enumerate() {
            close(p, d, &format!("output {k}"));
        }
    }
}
