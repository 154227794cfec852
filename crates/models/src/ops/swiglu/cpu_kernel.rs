//! SwiGLU's gating `silu(gate) * up` on flex's host buffers, f32: the
//! forward one pass writing its output, the backward one pass writing both
//! input gradients over the saved inputs' buffers (which die with the
//! node), with the logistic function of `ops::cpu::math` vectorised.

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use crate::ops::cpu::buffers::{same_shape, tensor, TASK_ELEMENTS};
use crate::ops::cpu::math::{sigmoid, simd_dispatch};

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
    /// [`swiglu_body`] on the CPU's best build.
    fn swiglu_slice(gate: &[f32], up: &[f32], out: &mut [f32]) => swiglu_body
}
simd_dispatch! {
    /// [`swiglu_backward_body`] on the CPU's best build.
    fn swiglu_backward_slice(gate: &mut [f32], up: &mut [f32], d_out: &[f32]) => swiglu_backward_body
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
    use crate::ops::cpu::math::test_arguments as arguments;

    /// The portable build (what a CPU without AVX2 and FMA runs) and the
    /// dispatched one agree, and both match the f64 formulas.
    #[test]
    fn portable_and_dispatched_builds_match_f64() {
        let (x, u, d) = (arguments(1), arguments(2), arguments(3));
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let close = |got: f32, want: f64, what: &str, i: usize| {
            assert!(
                (got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{what}[{i}]: {got} against {want}"
            );
        };
        let mut portable = vec![0.0; x.len()];
        let mut dispatched = vec![0.0; x.len()];
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
