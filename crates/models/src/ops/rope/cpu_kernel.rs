//! Rotary position embedding (rotate-half, the reference's
//! `ops::rope_reference`) and its backward on flex's host buffers, f32,
//! each one pass over the heads. The input is read in place through its
//! strides (the decoder's `q` and `k` are transposed views `[batch, heads,
//! len, d]` of the projections' `[batch, len, heads, d]` output), and the
//! result is written in sequence-major order: `[batch, len, heads, d]` in
//! memory, returned as the `[batch, heads, len, d]` view of it (see
//! `ops::cpu::buffers::seq_major_view`), so that neither the forward's
//! head split nor the backward's head merge copies. Burn's reference makes
//! five tensors in forward (two halves, a negation, a concatenation, two
//! products) and as many in backward, each through flex's strided loops.

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use crate::ops::cpu::buffers::{dense, positive_strides, seq_major_view, TASK_ELEMENTS};

/// Which of the two passes runs over a row.
#[derive(Clone, Copy)]
enum Pass {
    /// `y = x cos + rotate_half(x) sin`.
    Forward,
    /// `d_x` from `d_y`: the transpose of the forward's linear map.
    Backward,
}

/// One row of `d` elements: `src` through the tables' row `cos`, `sin`,
/// written to `dst`. With `h = d / 2`:
/// forward `y[i] = x[i] c[i] - x[i+h] s[i]`, `y[i+h] = x[i+h] c[i+h] +
/// x[i] s[i+h]`; backward `dx[i] = dy[i] c[i] + dy[i+h] s[i+h]`,
/// `dx[i+h] = dy[i+h] c[i+h] - dy[i] s[i]` (each product rounded before
/// the sum, as the reference's separate tensor operations).
#[inline(always)]
fn row(pass: Pass, src: &[f32], cos: &[f32], sin: &[f32], dst: &mut [f32]) {
    let h = src.len() / 2;
    let (x_lo, x_hi) = src.split_at(h);
    let (c_lo, c_hi) = cos.split_at(h);
    let (s_lo, s_hi) = sin.split_at(h);
    let (y_lo, y_hi) = dst.split_at_mut(h);
    match pass {
        Pass::Forward => {
            for i in 0..h {
                y_lo[i] = x_lo[i] * c_lo[i] + -(x_hi[i] * s_lo[i]);
                y_hi[i] = x_hi[i] * c_hi[i] + x_lo[i] * s_hi[i];
            }
        }
        Pass::Backward => {
            for i in 0..h {
                y_lo[i] = x_lo[i] * c_lo[i] + x_hi[i] * s_hi[i];
                y_hi[i] = x_hi[i] * c_hi[i] + -(x_lo[i] * s_lo[i]);
            }
        }
    }
}

/// `pass` over `x` `[batch, heads, len, d]` (f32, any layout) with the
/// tables `cos`, `sin` `[1, 1, len, d]` (f32); the result as
/// [`seq_major_view`] makes it.
fn apply(pass: Pass, x: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
    let mut x = positive_strides(x);
    if x.layout().strides().last() != Some(&1) {
        x = x.to_contiguous();
    }
    let (cos, sin) = (dense(cos), dense(sin));
    let dims = x.layout().shape().dims::<4>();
    let [batch, heads, len, d] = dims;
    assert!(
        d % 2 == 0
            && cos.layout().shape().dims::<4>() == [1, 1, len, d]
            && sin.layout().shape() == cos.layout().shape(),
        "RoPE: x {dims:?}, tables {:?} and {:?} (want [1, 1, {len}, even head dim {d}])",
        cos.layout().shape(),
        sin.layout().shape()
    );
    let strides: [usize; 4] = std::array::from_fn(|i| x.layout().strides()[i] as usize);
    let offset = x.layout().start_offset();
    let (xs, cs, ss) = (
        x.storage::<f32>(),
        cos.storage::<f32>(),
        sin.storage::<f32>(),
    );
    let position = heads * d;
    let mut out = vec![0.0f32; batch * len * position];
    if !out.is_empty() {
        // Tasks of whole positions (every head of each), about TASK_ELEMENTS long.
        let per_task = (TASK_ELEMENTS / position).max(1);
        out.par_chunks_mut(per_task * position)
            .enumerate()
            .for_each(|(task, chunk)| {
                for (i, dst) in chunk.chunks_mut(position).enumerate() {
                    let flat = task * per_task + i;
                    let (b, p) = (flat / len, flat % len);
                    let table = p * d..(p + 1) * d;
                    for (h, dst) in dst.chunks_mut(d).enumerate() {
                        let src = offset + b * strides[0] + h * strides[1] + p * strides[2];
                        row(
                            pass,
                            &xs[src..src + d],
                            &cs[table.clone()],
                            &ss[table.clone()],
                            dst,
                        );
                    }
                }
            });
    }
    seq_major_view(out, dims)
}

/// RoPE of `x` `[batch, heads, len, d]` (f32, any layout; `d` even) at the
/// positions of the tables `cos`, `sin` `[1, 1, len, d]` (f32): `x cos +
/// rotate_half(x) sin` with `rotate_half([a, b]) = [-b, a]`, a `[batch,
/// heads, len, d]` tensor whose buffer is sequence-major.
pub fn rope(x: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
    apply(Pass::Forward, x, cos, sin)
}

/// The gradient of [`rope`]'s input from that of its output, `d_y`
/// `[batch, heads, len, d]` (f32, any layout), with the same tables; the
/// result `[batch, heads, len, d]`, its buffer sequence-major. (The tables
/// are constants: no gradient reaches them.)
pub fn rope_backward(d_y: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
    apply(Pass::Backward, d_y, cos, sin)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};

    use super::*;
    use crate::ops::rope_reference;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 13 + seed * 7) % 29) as f32 / 9.0 - 1.5)
            .collect()
    }

    fn tensor<B: burn::tensor::backend::Backend>(dims: [usize; 4], seed: usize) -> Tensor<B, 4> {
        let n = dims.iter().product();
        Tensor::from_data(TensorData::new(values(n, seed), dims), &Default::default())
    }

    /// Tables of angles `p * f_i` duplicated over both halves (the
    /// decoder's), for `len` positions after `start`.
    fn tables<B: burn::tensor::backend::Backend>(
        len: usize,
        d: usize,
        start: usize,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let angle = |p: usize, i: usize| (start + p) as f32 * 0.7f32.powi((i % (d / 2)) as i32);
        let cos: Vec<f32> = (0..len * d).map(|j| angle(j / d, j % d).cos()).collect();
        let sin: Vec<f32> = (0..len * d).map(|j| angle(j / d, j % d).sin()).collect();
        let dev = Default::default();
        (
            Tensor::from_data(TensorData::new(cos, [1, 1, len, d]), &dev),
            Tensor::from_data(TensorData::new(sin, [1, 1, len, d]), &dev),
        )
    }

    fn prim(t: Tensor<Flex, 4>) -> FlexTensor {
        t.into_primitive().tensor()
    }

    fn read(t: FlexTensor) -> Vec<f32> {
        Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t))
            .into_data()
            .to_vec::<f32>()
            .unwrap()
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn forward_and_backward_match_autodiff_of_the_reference() {
        type Ad = Autodiff<Flex>;
        // (batch, heads, len, d, x as the decoder's transposed view)
        for (batch, heads, len, d, view) in [
            (2, 3, 5, 4, true),
            (1, 2, 7, 6, false),
            (3, 1, 1, 2, true),
            (2, 4, 9, 10, true),
        ] {
            let what = format!("b{batch} h{heads} len{len} d{d} view {view}");
            let x0: Tensor<Ad, 4> = if view {
                tensor([batch, len, heads, d], 1).swap_dims(1, 2)
            } else {
                tensor([batch, heads, len, d], 1)
            };
            let x = x0.clone().require_grad();
            let (cos, sin) = tables::<Ad>(len, d, 3);
            let d_y = tensor::<Ad>([batch, heads, len, d], 2);
            let y = rope_reference(x.clone(), &cos, &sin);
            let want_y = y.clone().into_data().to_vec::<f32>().unwrap();
            let grads = (y * d_y.clone()).sum().backward();
            let want_dx = x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
            let (c, s) = (prim(cos.inner()), prim(sin.inner()));
            let got_y = rope(prim(x0.inner()), c.clone(), s.clone());
            assert_eq!(got_y.layout().shape().dims::<4>(), [batch, heads, len, d]);
            assert_close(&read(got_y), &want_y, &format!("{what}: y"));
            let got_dx = rope_backward(prim(d_y.inner()), c, s);
            assert_close(&read(got_dx), &want_dx, &format!("{what}: dx"));
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        // <d_y, rope(x)> is linear in x, so a central difference is exact up
        // to rounding; f64 sums over the f32 outputs.
        let (batch, heads, len, d) = (1, 2, 3, 6);
        let n = batch * heads * len * d;
        let (cos, sin) = tables::<Flex>(len, d, 0);
        let (c, s) = (prim(cos), prim(sin));
        let x = values(n, 5);
        let d_y = values(n, 6);
        let dims = [batch, heads, len, d];
        let loss = |x: &[f32]| -> f64 {
            let t = prim(Tensor::from_data(
                TensorData::new(x.to_vec(), dims),
                &Default::default(),
            ));
            read(rope(t, c.clone(), s.clone()))
                .iter()
                .zip(&d_y)
                .map(|(&y, &g)| y as f64 * g as f64)
                .sum()
        };
        let d_y_t = prim(Tensor::from_data(
            TensorData::new(d_y.clone(), dims),
            &Default::default(),
        ));
        let dx = read(rope_backward(d_y_t, c.clone(), s.clone()));
        let eps = 1e-2f32;
        for i in 0..n {
            let (mut plus, mut minus) = (x.clone(), x.clone());
            plus[i] += eps;
            minus[i] -= eps;
            let fd = (loss(&plus) - loss(&minus)) / (2.0 * eps as f64);
            assert!(
                (fd - dx[i] as f64).abs() < 1e-3,
                "dx[{i}]: {} vs {fd}",
                dx[i]
            );
        }
    }
}
