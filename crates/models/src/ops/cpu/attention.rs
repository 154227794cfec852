//! The attention core `softmax(q k^T / sqrt(d) + bias) v` (the reference's
//! `ops::attention_reference`) and its backward on flex's host buffers, in
//! f32. Forward: per (sequence, query head), one GEMM writes the scores
//! into a task buffer, one pass per row scales, biases and softmaxes them
//! in place, and one GEMM forms the output. Backward: per (sequence, KV
//! head), the probabilities of each query head of the group are formed
//! again, and four GEMMs give `dv`, `dp`, then (after one pass per row for
//! the softmax's gradient) `dq` and `dk`, `dk` and `dv` summed over the
//! group's query heads (grouped-query attention) in place. No
//! `[batch, heads, len, keys]` tensor is allocated and none is kept from
//! the forward to the backward (FlashAttention's trade on GPUs: the
//! scores are computed twice). Tasks run on rayon's threads, each of
//! their GEMMs on its own thread. The output and the gradients are
//! returned with sequence-major buffers (`[batch, len, heads, d]` in
//! memory), the layout the decoder's head merge and its backward's head
//! split read without a copy; the inputs are read in place through their
//! strides.

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;

use super::buffers::{dense, positive_strides, seq_major};
use super::gemm::{matmul, MatView, Threads};
use super::math::{scale_add, softmax_backward, softmax_scaled};

/// An f32 tensor `[batch, heads, rows, cols]` and where it lies in its
/// buffer (copied first when its strides are not all positive).
struct Heads {
    tensor: FlexTensor,
    dims: [usize; 4],
    strides: [usize; 4],
    offset: usize,
}

impl Heads {
    fn new(t: FlexTensor) -> Self {
        let tensor = positive_strides(t);
        let layout = tensor.layout();
        let dims = layout.shape().dims::<4>();
        let strides = std::array::from_fn(|i| layout.strides()[i] as usize);
        let offset = layout.start_offset();
        Self {
            tensor,
            dims,
            strides,
            offset,
        }
    }

    fn data(&self) -> &[f32] {
        self.tensor.storage::<f32>()
    }

    /// The `[rows, cols]` matrix of sequence `b`, head `h`.
    fn mat(&self, b: usize, h: usize) -> MatView {
        MatView {
            rows: self.dims[2],
            cols: self.dims[3],
            row_stride: self.strides[2],
            col_stride: self.strides[3],
            offset: self.offset + b * self.strides[0] + h * self.strides[1],
        }
    }
}

/// The additive bias `[1, 1 or heads, len, keys]`, dense.
struct Bias {
    tensor: FlexTensor,
    per_head: bool,
    len: usize,
    keys: usize,
}

impl Bias {
    fn new(t: FlexTensor, heads: usize, len: usize, keys: usize) -> Self {
        let tensor = dense(t);
        let [one, bias_heads, bias_len, bias_keys] = tensor.layout().shape().dims::<4>();
        assert!(
            one == 1 && (bias_heads == 1 || bias_heads == heads) && [bias_len, bias_keys] == [len, keys],
            "attention bias [{one}, {bias_heads}, {bias_len}, {bias_keys}] for {heads} heads, {len} queries, {keys} keys"
        );
        Self {
            tensor,
            per_head: bias_heads > 1,
            len,
            keys,
        }
    }

    /// Row `i` of head `h`'s bias, `keys` long.
    fn row(&self, h: usize, i: usize) -> &[f32] {
        let head = if self.per_head { h } else { 0 };
        let start = (head * self.len + i) * self.keys;
        &self.tensor.storage::<f32>()[start..start + self.keys]
    }
}

/// The operands of one call: `q` `[batch, heads, len, d]`, `k` and `v`
/// `[batch, kv_heads, keys, d]`, the bias.
struct Operands {
    q: Heads,
    k: Heads,
    v: Heads,
    bias: Bias,
    scale: f32,
}

impl Operands {
    fn new(q: FlexTensor, k: FlexTensor, v: FlexTensor, bias: FlexTensor) -> Self {
        let (q, k, v) = (Heads::new(q), Heads::new(k), Heads::new(v));
        let [batch, heads, len, d] = q.dims;
        let [k_batch, kv_heads, keys, k_d] = k.dims;
        assert!(
            k_batch == batch
                && k_d == d
                && v.dims == k.dims
                && kv_heads > 0
                && heads % kv_heads == 0,
            "attention: q {:?}, k {:?}, v {:?}",
            q.dims,
            k.dims,
            v.dims
        );
        let bias = Bias::new(bias, heads, len, keys);
        Self {
            q,
            k,
            v,
            bias,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    /// Query heads per KV head.
    fn group(&self) -> usize {
        self.q.dims[1] / self.k.dims[1]
    }

    /// Writes the probabilities `[len, keys]` of sequence `b`, query head
    /// `h` into `p`.
    fn probabilities(&self, b: usize, h: usize, p: &mut [f32]) {
        let (len, keys) = (self.q.dims[2], self.k.dims[2]);
        let g = h / self.group();
        let scores = MatView::row_major(len, keys);
        matmul(
            p,
            scores,
            false,
            (self.q.data(), self.q.mat(b, h)),
            (self.k.data(), self.k.mat(b, g).t()),
            Threads::One,
        );
        for (i, row) in p.chunks_mut(keys).enumerate() {
            scale_add(row, self.scale, self.bias.row(h, i));
            softmax_scaled(row, 1.0);
        }
    }
}

/// The attention core's output `[batch, heads, len, d]` (its buffer
/// sequence-major, `[batch, len, heads, d]`: see `buffers::seq_major_view`) of
/// `q` `[batch, heads, len, d]`, `k`, `v` `[batch, kv_heads, keys, d]`
/// (query head `h` reads KV head `h / (heads / kv_heads)`) and the
/// additive `bias` `[1, 1 or heads, len, keys]`: `softmax(q k^T / sqrt(d)
/// + bias) v`, the softmax in f32 with `-inf` entries exactly 0. All f32.
pub fn attention_forward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
) -> FlexTensor {
    let ops = Operands::new(q, k, v, bias);
    let [batch, heads, len, d] = ops.q.dims;
    let keys = ops.k.dims[2];
    let mut out = vec![0.0f32; batch * heads * len * d];
    if !out.is_empty() {
        out.par_chunks_mut(len * d)
            .enumerate()
            .for_each(|(task, o)| {
                let (b, h) = (task / heads, task % heads);
                let mut p = vec![0.0f32; len * keys];
                ops.probabilities(b, h, &mut p);
                let g = h / ops.group();
                matmul(
                    o,
                    MatView::row_major(len, d),
                    false,
                    (&p, MatView::row_major(len, keys)),
                    (ops.v.data(), ops.v.mat(b, g)),
                    Threads::One,
                );
            });
    }
    seq_major(&out, [batch, heads, len, d])
}

/// The gradients `[dq, dk, dv]` (the shapes of `q`, `k`, `v`, each buffer
/// sequence-major as the forward's output)
/// of [`attention_forward`] for the upstream gradient `d_out` `[batch,
/// heads, len, d]`; no gradient reaches the bias.
pub fn attention_backward(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
    d_out: FlexTensor,
) -> [FlexTensor; 3] {
    let ops = Operands::new(q, k, v, bias);
    let d_out = Heads::new(d_out);
    let [batch, heads, len, d] = ops.q.dims;
    let [_, kv_heads, keys, _] = ops.k.dims;
    assert_eq!(
        d_out.dims, ops.q.dims,
        "attention backward: d_out {:?} for q {:?}",
        d_out.dims, ops.q.dims
    );
    let group = ops.group();
    let mut dq = vec![0.0f32; batch * heads * len * d];
    let mut dk = vec![0.0f32; batch * kv_heads * keys * d];
    let mut dv = vec![0.0f32; batch * kv_heads * keys * d];
    if !dq.is_empty() && !dk.is_empty() {
        let (rows, kv) = (MatView::row_major(len, keys), MatView::row_major(keys, d));
        dq.par_chunks_mut(group * len * d)
            .zip(dk.par_chunks_mut(keys * d))
            .zip(dv.par_chunks_mut(keys * d))
            .enumerate()
            .for_each(|(task, ((dq_g, dk_g), dv_g))| {
                let (b, g) = (task / kv_heads, task % kv_heads);
                let mut p = vec![0.0f32; len * keys];
                let mut ds = vec![0.0f32; len * keys];
                for (r, dq_h) in dq_g.chunks_mut(len * d).enumerate() {
                    let h = g * group + r;
                    let sum = r > 0;
                    ops.probabilities(b, h, &mut p);
                    let (d_o, d_o_view) = (d_out.data(), d_out.mat(b, h));
                    // dv += p^T d_out; dp = d_out v^T.
                    matmul(dv_g, kv, sum, (&p, rows.t()), (d_o, d_o_view), Threads::One);
                    matmul(
                        &mut ds,
                        rows,
                        false,
                        (d_o, d_o_view),
                        (ops.v.data(), ops.v.mat(b, g).t()),
                        Threads::One,
                    );
                    for (p_row, ds_row) in p.chunks(keys).zip(ds.chunks_mut(keys)) {
                        softmax_backward(p_row, ds_row, ops.scale);
                    }
                    // dq = ds k; dk += ds^T q.
                    matmul(
                        dq_h,
                        MatView::row_major(len, d),
                        false,
                        (&ds, rows),
                        (ops.k.data(), ops.k.mat(b, g)),
                        Threads::One,
                    );
                    matmul(
                        dk_g,
                        kv,
                        sum,
                        (&ds, rows.t()),
                        (ops.q.data(), ops.q.mat(b, h)),
                        Threads::One,
                    );
                }
            });
    }
    [
        seq_major(&dq, [batch, heads, len, d]),
        seq_major(&dk, [batch, kv_heads, keys, d]),
        seq_major(&dv, [batch, kv_heads, keys, d]),
    ]
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Tensor, TensorData};

    use super::*;
    use crate::ops::{attention_reference, attention_reference_backward};

    fn tensor(dims: [usize; 4], seed: usize) -> Tensor<Flex, 4> {
        let n = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * 7 + seed * 11) % 19) as f32 / 7.0 - 1.3)
            .collect();
        Tensor::from_data(TensorData::new(v, dims), &Default::default())
    }

    /// A causal mask for `len` queries at the end of `keys` keys, plus a
    /// per-head slope (ALiBi-like) when `heads > 1`.
    fn bias(heads: usize, len: usize, keys: usize) -> Tensor<Flex, 4> {
        let mut v = Vec::new();
        for h in 0..heads {
            for i in 0..len {
                for j in 0..keys {
                    let pos = keys - len + i;
                    v.push(if j > pos {
                        f32::NEG_INFINITY
                    } else {
                        -0.25 * (h as f32 + 1.0) * (pos - j) as f32
                    });
                }
            }
        }
        Tensor::from_data(
            TensorData::new(v, [1, heads, len, keys]),
            &Default::default(),
        )
    }

    fn read(t: Tensor<Flex, 4>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap()
    }

    fn prim(t: Tensor<Flex, 4>) -> FlexTensor {
        t.into_primitive().tensor()
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * scale.max(1.0),
                "{what}[{i}]: {g} vs {w}"
            );
        }
    }

    #[test]
    fn forward_and_backward_match_the_reference() {
        // (batch, heads, kv heads, len, keys, head dim, bias heads, q as a transposed view)
        let cases = [
            (2, 4, 2, 7, 7, 5, 1, false),
            (1, 3, 3, 9, 9, 8, 3, true),
            (2, 6, 2, 3, 11, 4, 6, true),
            (1, 2, 1, 1, 5, 16, 1, false),
        ];
        for (batch, heads, kv_heads, len, keys, d, bias_heads, view) in cases {
            let what =
                format!("b{batch} h{heads} kv{kv_heads} len{len} keys{keys} d{d} bias{bias_heads}");
            // q as the decoder makes it: [batch, len, heads, d] with heads and len swapped.
            let q = if view {
                tensor([batch, len, heads, d], 1).swap_dims(1, 2)
            } else {
                tensor([batch, heads, len, d], 1)
            };
            let k = tensor([batch, kv_heads, keys, d], 2);
            let v = tensor([batch, kv_heads, keys, d], 3);
            let bias = bias(bias_heads, len, keys);
            let d_out = tensor([batch, heads, len, d], 4);
            let want = read(attention_reference(q.clone(), k.clone(), v.clone(), &bias));
            let got = attention_forward(
                prim(q.clone()),
                prim(k.clone()),
                prim(v.clone()),
                prim(bias.clone()),
            );
            assert!(
                got.transpose(1, 2).is_contiguous(),
                "{what}: the output's buffer is sequence-major"
            );
            assert_close(
                &read(Tensor::from_primitive(
                    burn::tensor::TensorPrimitive::Float(got),
                )),
                &want,
                &format!("{what}: out"),
            );
            let want =
                attention_reference_backward(q.clone(), k.clone(), v.clone(), &bias, d_out.clone());
            let got = attention_backward(prim(q), prim(k), prim(v), prim(bias), prim(d_out));
            for ((w, g), name) in want.into_iter().zip(got).zip(["dq", "dk", "dv"]) {
                assert!(
                    g.transpose(1, 2).is_contiguous(),
                    "{what}: {name}'s buffer is sequence-major"
                );
                let g = Tensor::<Flex, 4>::from_primitive(burn::tensor::TensorPrimitive::Float(g));
                assert_eq!(g.dims(), w.dims(), "{what}: {name} shape");
                assert_close(&read(g), &read(w), &format!("{what}: {name}"));
            }
        }
    }
}
