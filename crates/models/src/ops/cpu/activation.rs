//! GELU-tanh and SwiGLU's gating `silu(gate) * up` on flex's host buffers,
//! f32: each forward one pass writing its output, each backward one pass
//! writing the input gradients over buffers that die with the node (the
//! upstream gradient's, or the saved inputs'), with the logistic function
//! of [`super::math`] vectorised. Burn's tensor operations make a pass and
//! a fresh tensor per primitive (GELU: 7 in forward, about a dozen in
//! backward).

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use super::buffers::{tensor, TASK_ELEMENTS};
use super::math::{sigmoid, simd_dispatch};

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

/// `out = gate * sigmoid(gate) * up`.
#[inline(always)]
fn swiglu_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g * sigmoid(g) * u;
    }
}

/// Over `gate` and `up`, their gradients for `d_out`: `d_up = d silu(g)`,
/// `d_gate = d u s (1 + g (1 - s))` with `s = sigmoid(g)`.
#[inline(always)]
fn swiglu_backward_body(gate: &mut [f32], up: &mut [f32], d_out: &[f32]) {
    for ((g, u), &d) in gate.iter_mut().zip(up.iter_mut()).zip(d_out) {
        let s = sigmoid(*g);
        let d_up = d * *g * s;
        *g = d * *u * s * (1.0 + *g * (1.0 - s));
        *u = d_up;
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
simd_dispatch! {
    /// [`swiglu_body`] on the CPU's best build.
    fn swiglu_slice(gate: &[f32], up: &[f32], out: &mut [f32]) => swiglu_body
}
simd_dispatch! {
    /// [`swiglu_backward_body`] on the CPU's best build.
    fn swiglu_backward_slice(gate: &mut [f32], up: &mut [f32], d_out: &[f32]) => swiglu_backward_body
}

/// Panics unless `a` and `b` have the same shape.
fn same_shape(a: &FlexTensor, b: &FlexTensor, what: &str) {
    assert_eq!(
        a.layout().shape(),
        b.layout().shape(),
        "{what}: operands of different shapes"
    );
}

/// GELU-tanh of the dense f32 `x` (see [`super::dense`]), any shape: a new
/// tensor of that shape.
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

/// `silu(gate) * up` of the dense f32 `gate` and `up` (same shape): a new
/// tensor of that shape.
pub fn swiglu(gate: &FlexTensor, up: &FlexTensor) -> FlexTensor {
    same_shape(gate, up, "SwiGLU");
    let (gs, us) = (gate.storage::<f32>(), up.storage::<f32>());
    let mut out = vec![0.0f32; gs.len()];
    out.par_chunks_mut(TASK_ELEMENTS)
        .zip(
            gs.par_chunks(TASK_ELEMENTS)
                .zip(us.par_chunks(TASK_ELEMENTS)),
        )
        .for_each(|(o, (g, u))| swiglu_slice(g, u, o));
    tensor(out, gate.layout().shape().clone())
}

/// `[d_gate, d_up]` of [`swiglu`] for `d_out` (all dense f32, one shape),
/// written over the buffers of `gate` and `up` (copies first where
/// another tensor shares them).
pub fn swiglu_backward(
    mut gate: FlexTensor,
    mut up: FlexTensor,
    d_out: &FlexTensor,
) -> [FlexTensor; 2] {
    same_shape(&gate, &up, "SwiGLU backward");
    same_shape(&gate, d_out, "SwiGLU backward");
    let ds = d_out.storage::<f32>();
    let gs = gate.storage_mut::<f32>();
    let us = up.storage_mut::<f32>();
    gs.par_chunks_mut(TASK_ELEMENTS)
        .zip(us.par_chunks_mut(TASK_ELEMENTS))
        .zip(ds.par_chunks(TASK_ELEMENTS))
        .for_each(|((g, u), d)| swiglu_backward_slice(g, u, d));
    [gate, up]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments over GELU's and SiLU's interesting range, 8 lanes and a
    /// tail of 3.
    fn arguments(seed: usize) -> Vec<f32> {
        (0..8 * 25 + 3)
            .map(|i| ((i * 7919 + seed * 31) % 2001) as f32 / 100.0 - 10.0)
            .collect()
    }

    /// The portable build (what a CPU without AVX2 and FMA runs) and the
    /// dispatched one agree, and both match the f64 formulas.
    #[test]
    fn portable_and_dispatched_builds_match_f64() {
        let (x, u, d) = (arguments(1), arguments(2), arguments(3));
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
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
        swiglu_body(&x, &u, &mut portable);
        swiglu_slice(&x, &u, &mut dispatched);
        let (mut gp, mut up) = (x.clone(), u.clone());
        let (mut gd, mut ud) = (x.clone(), u.clone());
        swiglu_backward_body(&mut gp, &mut up, &d);
        swiglu_backward_slice(&mut gd, &mut ud, &d);
        for i in 0..x.len() {
            let (g, uu, dd) = (x[i] as f64, u[i] as f64, d[i] as f64);
            let s = sig(g);
            let d_gate = dd * uu * s * (1.0 + g * (1.0 - s));
            for (out, dg, du, how) in [
                (portable[i], gp[i], up[i], "portable"),
                (dispatched[i], gd[i], ud[i], "dispatched"),
            ] {
                close(out, g * s * uu, &format!("SwiGLU {how}"), i);
                close(dg, d_gate, &format!("SwiGLU d_gate {how}"), i);
                close(du, dd * g * s, &format!("SwiGLU d_up {how}"), i);
            }
        }
    }
}
