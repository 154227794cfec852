//! GELU-tanh on flex's host buffers, f32: the forward one pass writing
//! its output, the backward one pass writing the input gradient over the
//! upstream gradient's buffer, with the logistic function of
//! `ops::cpu::math` vectorised. Burn's tensor operations make a pass and a
//! fresh tensor per primitive (7 in forward, about a dozen in backward).

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use crate::ops::cpu::buffers::{same_shape, tensor, TASK_ELEMENTS};
use crate::ops::cpu::math::{sigmoid, simd_dispatch};

/// `sqrt(2 / pi)`.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic coefficient of GELU's tanh approximation.
const CUBIC: f32 = 0.044_715;

/// GELU-tanh as `x * sigmoid(2 z)`, `z = sqrt(2/pi) (x + 0.044715 x^3)`:
/// identical to `0.5 x (1 + tanh z)` (since `0.5 (1 + tanh z) = sigmoid(2
/// z)`), without the cancellation of `1 + tanh z` for negative `z`.
#[inline(always)]
fn gelu_body(x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        let z2 = 2.0 * SQRT_2_OVER_PI * x * CUBIC.mul_add(x * x, 1.0);
        *y = x * sigmoid(z2);
    }
}

/// `g[i] *= gelu'(x[i])`: `s + x s (1 - s) 2 z'(x)` with `s = sigmoid(2
/// z)`, `z'(x) = sqrt(2/pi) (1 + 3 * 0.044715 x^2)`.
#[inline(always)]
fn gelu_backward_body(x: &[f32], g: &mut [f32]) {
    for (g, &x) in g.iter_mut().zip(x) {
        let x2 = x * x;
        let s = sigmoid(2.0 * SQRT_2_OVER_PI * x * CUBIC.mul_add(x2, 1.0));
        let dz2 = 2.0 * SQRT_2_OVER_PI * (3.0 * CUBIC).mul_add(x2, 1.0);
        *g *= (x * s * (1.0 - s)).mul_add(dz2, s);
    }
}

simd_dispatch! {
    /// [`gelu_body`] on the CPU's best build.
    fn gelu_slice(x: &[f32], y: &mut [f32]) => gelu_body
}
simd_dispatch! {
    /// [`gelu_backward_body`] on the CPU's best build.
    fn gelu_backward_slice(x: &[f32], g: &mut [f32]) => gelu_backward_body
}
/// GELU-tanh of the dense f32 `x` (see `ops::cpu::buffers::dense`), any
/// shape: a new tensor of that shape.
pub fn gelu_tanh(x: &FlexTensor) -> FlexTensor {
    let xs = x.storage::<f32>();
    let mut y = vec![0.0f32; xs.len()];
    y.par_chunks_mut(TASK_ELEMENTS)
        .zip(xs.par_chunks(TASK_ELEMENTS))
        .for_each(|(y, x)| gelu_slice(x, y));
    tensor(y, x.layout().shape().clone())
}

/// The gradient of [`gelu_tanh`]'s input `x` (dense f32) from that of its
/// output, `d_y` (dense f32, `x`'s shape), written over `d_y`'s buffer (a
/// copy of it first when another tensor shares it).
pub fn gelu_tanh_backward(x: &FlexTensor, mut d_y: FlexTensor) -> FlexTensor {
    same_shape(x, &d_y, "GELU backward");
    let xs = x.storage::<f32>();
    d_y.storage_mut::<f32>()
        .par_chunks_mut(TASK_ELEMENTS)
        .zip(xs.par_chunks(TASK_ELEMENTS))
        .for_each(|(g, x)| gelu_backward_slice(x, g));
    d_y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu::math::test_arguments as arguments;

    /// The portable build (what a CPU without AVX2 and FMA runs) and the
    /// dispatched one agree, and both match the f64 formulas.
    #[test]
    fn portable_and_dispatched_builds_match_f64() {
        let (x, d) = (arguments(1), arguments(3));
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let close = |got: f32, want: f64, what: &str, i: usize| {
            assert!(
                (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{what}[{i}]: {got} against {want}"
            );
        };
        let mut portable = vec![0.0; x.len()];
        let mut dispatched = vec![0.0; x.len()];
        gelu_body(&x, &mut portable);
        gelu_slice(&x, &mut dispatched);
        let mut g_portable = d.clone();
        let mut g_dispatched = d.clone();
        gelu_backward_body(&x, &mut g_portable);
        gelu_backward_slice(&x, &mut g_dispatched);
        for i in 0..x.len() {
            let v = x[i] as f64;
            let z = c * (v + 0.044715 * v * v * v);
            let y = 0.5 * v * (1.0 + z.tanh());
            let dz = c * (1.0 + 3.0 * 0.044715 * v * v);
            let dy = 0.5 * (1.0 + z.tanh()) + 0.5 * v * (1.0 - z.tanh().powi(2)) * dz;
            for (got, how) in [(portable[i], "portable"), (dispatched[i], "dispatched")] {
                close(got, y, &format!("GELU {how}"), i);
            }
            for (got, how) in [(g_portable[i], "portable"), (g_dispatched[i], "dispatched")] {
                close(got, d[i] as f64 * dy, &format!("GELU backward {how}"), i);
            }
        }
    }
}
