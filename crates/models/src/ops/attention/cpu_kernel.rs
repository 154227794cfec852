//! The attention core `softmax(q k^T / sqrt(d) + bias) v` (the reference's
//! `ops::attention_reference`) and its backward on flex's host buffers, in
//! f32. Forward: per (sequence, query head), one GEMM writes the scores
//! into a task buffer, one pass per row scales, biases and softmaxes them
//! in place, and one GEMM forms the output. Backward: per (sequence, KV
//! head), the probabilities of each query head of the group are formed
//! again, and four GEMMs give `dv`, `dp`, then (after one pass per row for
//! the softmax's gradient) `dq` and `dk`, `dk` and `dv` summed over the
//! group's query heads (grouped-query attention) in place. The queries
//! go in blocks of [`BLOCK_ROWS`] rows, and each block's products stop at
//! the last key its bias leaves unmasked (a causal mask's upper triangle
//! is neither multiplied nor softmaxed: about 3/8 of the work at 256
//! positions); masked keys have probability exactly 0, so the skipped
//! terms are zeros. No
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

use crate::ops::cpu::buffers::{dense, positive_strides, seq_major};
use crate::ops::cpu::gemm::{matmul, MatView, Threads};
use crate::ops::cpu::math::{
    exp_shifted, scale_add, softmax_backward, softmax_backward_given, softmax_scaled,
};

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

/// Queries per block: each block's products run over the keys up to the
/// last one its bias leaves unmasked (see [`RowBlock`]).
const BLOCK_ROWS: usize = 64;

/// Query rows `start..start + len` of one head and the keys `0..keys`
/// they attend to: every later key's bias is `-inf` in all of these rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowBlock {
    start: usize,
    len: usize,
    keys: usize,
}

impl RowBlock {
    /// This block's part of a row-major `[rows, all_keys]` score buffer:
    /// its rows, keys `0..self.keys`.
    fn scores(self, all_keys: usize) -> MatView {
        MatView {
            rows: self.len,
            cols: self.keys,
            row_stride: all_keys,
            col_stride: 1,
            offset: self.start * all_keys,
        }
    }

    /// The blocks of one head's bias rows `[len, keys]` (row-major):
    /// [`BLOCK_ROWS`] rows at a time, each reaching the last key not
    /// `-inf` in any of its rows (all keys for a row masked everywhere,
    /// as the reference computes it), neighbours of equal reach merged.
    fn of_bias(bias: &[f32], len: usize, keys: usize) -> Vec<Self> {
        let reach = |i: usize| {
            bias[i * keys..(i + 1) * keys]
                .iter()
                .rposition(|&b| b != f32::NEG_INFINITY)
                .map_or(keys, |j| j + 1)
        };
        let mut blocks: Vec<Self> = Vec::new();
        for start in (0..len).step_by(BLOCK_ROWS) {
            let rows = BLOCK_ROWS.min(len - start);
            let keys = (start..start + rows).map(reach).max().unwrap_or(keys);
            match blocks.last_mut() {
                Some(last) if last.keys == keys => last.len += rows,
                _ => blocks.push(Self {
                    start,
                    len: rows,
                    keys,
                }),
            }
        }
        blocks
    }
}

/// The additive bias `[1, 1 or heads, len, keys]`, dense, and the row
/// blocks of each of its heads.
struct Bias {
    tensor: FlexTensor,
    per_head: bool,
    len: usize,
    keys: usize,
    blocks: Vec<Vec<RowBlock>>,
}

impl Bias {
    fn new(t: FlexTensor, heads: usize, len: usize, keys: usize) -> Self {
        let tensor = dense(t);
        let [one, bias_heads, bias_len, bias_keys] = tensor.layout().shape().dims::<4>();
        assert!(
            one == 1 && (bias_heads == 1 || bias_heads == heads) && [bias_len, bias_keys] == [len, keys],
            "attention bias [{one}, {bias_heads}, {bias_len}, {bias_keys}] for {heads} heads, {len} queries, {keys} keys"
        );
        let blocks = tensor.storage::<f32>()[..bias_heads * len * keys]
            .chunks(len * keys)
            .map(|head| RowBlock::of_bias(head, len, keys))
            .collect();
        Self {
            tensor,
            per_head: bias_heads > 1,
            len,
            keys,
            blocks,
        }
    }

    /// The row blocks of query head `h`.
    fn blocks(&self, h: usize) -> &[RowBlock] {
        &self.blocks[if self.per_head { h } else { 0 }]
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
    /// `h` into `p`: of each row block, keys `0..block.keys` (the rest of
    /// the row, all zeros, is left as it was). `norm` says how: a softmax
    /// over this call's keys, each row's log-sum-exp going to `lse[i]`
    /// (when given), or the whole attention's rows `e^(score - lse)`.
    fn probabilities(
        &self,
        b: usize,
        h: usize,
        p: &mut [f32],
        norm: Norm<'_>,
        mut lse: Option<&mut [f32]>,
    ) {
        let row0 = (b * self.q.dims[1] + h) * self.q.dims[2];
        self.scores(b, h, p, |i, row| match norm {
            Norm::Own => {
                let l = softmax_scaled(row, 1.0);
                if let Some(lse) = lse.as_deref_mut() {
                    lse[i] = l;
                }
            }
            Norm::Whole { lse, .. } => {
                exp_shifted(row, lse[row0 + i]);
            }
        });
    }

    /// Writes the scaled, biased scores of sequence `b`, query head `h`
    /// into `p` `[len, keys]`, row block by row block (keys
    /// `0..block.keys` of each), and calls `finish(i, row)` on each row.
    fn scores(&self, b: usize, h: usize, p: &mut [f32], mut finish: impl FnMut(usize, &mut [f32])) {
        let keys = self.k.dims[2];
        let g = h / self.group();
        for block in self.bias.blocks(h) {
            matmul(
                p,
                block.scores(keys),
                false,
                (
                    self.q.data(),
                    self.q.mat(b, h).rows_from(block.start, block.len),
                ),
                (self.k.data(), self.k.mat(b, g).rows_from(0, block.keys).t()),
                Threads::One,
            );
            for i in block.start..block.start + block.len {
                let row = &mut p[i * keys..i * keys + block.keys];
                scale_add(row, self.scale, &self.bias.row(h, i)[..block.keys]);
                finish(i, row);
            }
        }
    }
}

/// How the probabilities of a call are normalised.
#[derive(Clone, Copy)]
enum Norm<'a> {
    /// A softmax over this call's keys: the call is the whole attention.
    Own,
    /// The call's keys are a block of a longer attention (ring attention),
    /// whose rows' log-sum-exp `lse` and `delta = rowsum(d_out * out)`
    /// (each `[batch, heads, len]`) are given.
    Whole { lse: &'a [f32], delta: &'a [f32] },
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
    attention_forward_lse(q, k, v, bias).0
}

/// [`attention_forward`] and the log-sum-exp of each row of its scores
/// `ln sum_j e^(q_i k_j / sqrt(d) + bias_ij)` (natural log, over the
/// keys not masked), `[batch, heads, len]` row-major: the `(output, lse)`
/// form that ring attention merges blocks with.
pub fn attention_forward_lse(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
) -> (FlexTensor, Vec<f32>) {
    let ops = Operands::new(q, k, v, bias);
    let [batch, heads, len, d] = ops.q.dims;
    let keys = ops.k.dims[2];
    let mut out = vec![0.0f32; batch * heads * len * d];
    let mut lse = vec![0.0f32; batch * heads * len];
    if !out.is_empty() {
        out.par_chunks_mut(len * d)
            .zip(lse.par_chunks_mut(len))
            .enumerate()
            .for_each(|(task, (o, lse))| {
                let (b, h) = (task / heads, task % heads);
                let mut p = vec![0.0f32; len * keys];
                ops.probabilities(b, h, &mut p, Norm::Own, Some(lse));
                let g = h / ops.group();
                for block in ops.bias.blocks(h) {
                    matmul(
                        o,
                        MatView::row_major(len, d).rows_from(block.start, block.len),
                        false,
                        (&p, block.scores(keys)),
                        (ops.v.data(), ops.v.mat(b, g).rows_from(0, block.keys)),
                        Threads::One,
                    );
                }
            });
    }
    (seq_major(&out, [batch, heads, len, d]), lse)
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
    backward(Operands::new(q, k, v, bias), d_out, Norm::Own)
}

/// This call's share of the gradients `[dq, dk, dv]` of a longer
/// attention whose keys it holds a block of (ring attention): as
/// [`attention_backward`], with the probabilities `e^(score - lse)` of the
/// whole attention's log-sum-exp `lse` and the softmax's gradient taken
/// with its `delta = rowsum(d_out * out)`, both `[batch, heads, len]`
/// row-major. With the whole attention in one call, the two agree.
pub fn attention_backward_lse(
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    bias: FlexTensor,
    d_out: FlexTensor,
    lse: &[f32],
    delta: &[f32],
) -> [FlexTensor; 3] {
    let ops = Operands::new(q, k, v, bias);
    let [batch, heads, len, _] = ops.q.dims;
    assert!(
        lse.len() == batch * heads * len && delta.len() == lse.len(),
        "attention backward: {} lse and {} delta rows for q {:?}",
        lse.len(),
        delta.len(),
        ops.q.dims
    );
    backward(ops, d_out, Norm::Whole { lse, delta })
}

/// The backward of [`attention_backward`] and [`attention_backward_lse`].
fn backward(ops: Operands, d_out: FlexTensor, norm: Norm<'_>) -> [FlexTensor; 3] {
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
        let kv = MatView::row_major(keys, d);
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
                    ops.probabilities(b, h, &mut p, norm, None);
                    let d_o = d_out.data();
                    // Per row block, over its keys (the buffers start at
                    // zero, so dk and dv add every block and head's share).
                    for block in ops.bias.blocks(h) {
                        let scores = block.scores(keys);
                        let d_o_rows = d_out.mat(b, h).rows_from(block.start, block.len);
                        let kv_rows = kv.rows_from(0, block.keys);
                        // dv += p^T d_out; dp = d_out v^T.
                        matmul(
                            dv_g,
                            kv_rows,
                            true,
                            (&p, scores.t()),
                            (d_o, d_o_rows),
                            Threads::One,
                        );
                        matmul(
                            &mut ds,
                            scores,
                            false,
                            (d_o, d_o_rows),
                            (ops.v.data(), ops.v.mat(b, g).rows_from(0, block.keys).t()),
                            Threads::One,
                        );
                        for i in block.start..block.start + block.len {
                            let row = i * keys..i * keys + block.keys;
                            let (p, ds) = (&p[row.clone()], &mut ds[row]);
                            match norm {
                                Norm::Own => softmax_backward(p, ds, ops.scale),
                                Norm::Whole { delta, .. } => {
                                    let at = (b * heads + h) * len + i;
                                    softmax_backward_given(p, ds, delta[at], ops.scale)
                                }
                            }
                        }
                        // dq = ds k; dk += ds^T q.
                        matmul(
                            dq_h,
                            MatView::row_major(len, d).rows_from(block.start, block.len),
                            false,
                            (&ds, scores),
                            (ops.k.data(), ops.k.mat(b, g).rows_from(0, block.keys)),
                            Threads::One,
                        );
                        matmul(
                            dk_g,
                            kv_rows,
                            true,
                            (&ds, scores.t()),
                            (
                                ops.q.data(),
                                ops.q.mat(b, h).rows_from(block.start, block.len),
                            ),
                            Threads::One,
                        );
                    }
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
    fn row_blocks_reach_the_last_unmasked_key_of_their_rows() {
        let inf = f32::NEG_INFINITY;
        // Causal, 150 rows: blocks of 64 rows reach their last row's key.
        let causal: Vec<f32> = (0..150)
            .flat_map(|i| (0..150).map(move |j| if j > i { inf } else { 0.0 }))
            .collect();
        let blocks = RowBlock::of_bias(&causal, 150, 150);
        let want = [(0, 64, 64), (64, 64, 128), (128, 22, 150)];
        let got: Vec<_> = blocks.iter().map(|b| (b.start, b.len, b.keys)).collect();
        assert_eq!(got, want);
        // No mask: one block over every key.
        let open = vec![0.5f32; 130 * 40];
        assert_eq!(
            RowBlock::of_bias(&open, 130, 40),
            [RowBlock {
                start: 0,
                len: 130,
                keys: 40
            }]
        );
        // A masked key inside a row does not shorten it; a row masked
        // everywhere reaches every key (the reference's softmax over all).
        let holes: Vec<f32> = (0..70 * 10)
            .map(|i| if i % 10 == 0 || i % 10 == 4 { 0.0 } else { inf })
            .collect();
        assert_eq!(
            RowBlock::of_bias(&holes, 70, 10),
            [RowBlock {
                start: 0,
                len: 70,
                keys: 5
            }]
        );
        let mut first_row_only = vec![inf; 70 * 10];
        first_row_only[..5].fill(0.0);
        first_row_only[65 * 10..65 * 10 + 3].fill(0.0);
        assert_eq!(
            RowBlock::of_bias(&first_row_only, 70, 10),
            [RowBlock {
                start: 0,
                len: 70,
                keys: 10
            }]
        );
    }

    #[test]
    fn forward_and_backward_match_the_reference() {
        // (batch, heads, kv heads, len, keys, head dim, bias heads, q as a transposed view)
        let cases = [
            (2, 4, 2, 7, 7, 5, 1, false),
            (1, 3, 3, 9, 9, 8, 3, true),
            (2, 6, 2, 3, 11, 4, 6, true),
            (1, 2, 1, 1, 5, 16, 1, false),
            // Several row blocks: causal (3 blocks of 64, 64, 22 rows),
            // and queries at the end of longer keys with per-head bias.
            (1, 2, 1, 150, 150, 8, 1, true),
            (2, 4, 2, 70, 100, 8, 4, false),
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

    /// The log-sum-exp of each row of `q k^T / sqrt(d) + bias` in f64
    /// from the inputs' values, `[batch, heads, len]`, over unmasked keys.
    fn lse_f64(q: &Tensor<Flex, 4>, k: &Tensor<Flex, 4>, bias: &Tensor<Flex, 4>) -> Vec<f32> {
        let [batch, heads, len, d] = q.dims();
        let [_, kv_heads, keys, _] = k.dims();
        let bias_heads = bias.dims()[1];
        let (qv, kv, bv) = (read(q.clone()), read(k.clone()), read(bias.clone()));
        let mut out = Vec::new();
        for b in 0..batch {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let bh = if bias_heads == 1 { 0 } else { h };
                for i in 0..len {
                    let row: Vec<f64> = (0..keys)
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|e| {
                                    qv[((b * heads + h) * len + i) * d + e] as f64
                                        * kv[((b * kv_heads + g) * keys + j) * d + e] as f64
                                })
                                .sum();
                            dot / (d as f64).sqrt() + bv[(bh * len + i) * keys + j] as f64
                        })
                        .collect();
                    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    out.push((max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln()) as f32);
                }
            }
        }
        out
    }

    /// `rowsum(d_out * out)` `[batch, heads, len]`.
    fn delta(d_out: &Tensor<Flex, 4>, out: &Tensor<Flex, 4>) -> Vec<f32> {
        read((d_out.clone() * out.clone()).sum_dim(3))
    }

    fn float(t: FlexTensor) -> Tensor<Flex, 4> {
        Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(t))
    }

    /// The `(output, lse)` forward and the backward given the whole lse
    /// and delta, on the whole attention: the reference's output and
    /// gradients, and the log-sum-exp of f64 host code.
    #[test]
    fn lse_forms_on_the_whole_attention_match_the_reference() {
        // (batch, heads, kv heads, len, keys, head dim, bias heads)
        for (batch, heads, kv_heads, len, keys, d, bias_heads) in [
            (2, 4, 2, 7, 7, 5, 1),
            (1, 2, 1, 150, 150, 8, 2),
            (2, 6, 2, 3, 11, 4, 6),
        ] {
            let what = format!("b{batch} h{heads} kv{kv_heads} len{len} keys{keys}");
            let q = tensor([batch, heads, len, d], 1);
            let k = tensor([batch, kv_heads, keys, d], 2);
            let v = tensor([batch, kv_heads, keys, d], 3);
            let bias = bias(bias_heads, len, keys);
            let d_out = tensor([batch, heads, len, d], 4);
            let (out, lse) = attention_forward_lse(
                prim(q.clone()),
                prim(k.clone()),
                prim(v.clone()),
                prim(bias.clone()),
            );
            let out = float(out);
            let want = attention_reference(q.clone(), k.clone(), v.clone(), &bias);
            assert_close(&read(out.clone()), &read(want), &format!("{what}: out"));
            assert_close(&lse, &lse_f64(&q, &k, &bias), &format!("{what}: lse"));
            let want =
                attention_reference_backward(q.clone(), k.clone(), v.clone(), &bias, d_out.clone());
            let delta = delta(&d_out, &out);
            let got = attention_backward_lse(
                prim(q),
                prim(k),
                prim(v),
                prim(bias),
                prim(d_out),
                &lse,
                &delta,
            );
            for ((w, g), name) in want.into_iter().zip(got).zip(["dq", "dk", "dv"]) {
                assert_close(&read(float(g)), &read(w), &format!("{what}: {name}"));
            }
        }
    }

    /// The keys in two blocks (a ring step's view, the bias columns of
    /// each block carrying the global mask and ALiBi distances): the
    /// blocks' outputs merged by their log-sum-exps, and their gradient
    /// shares given the whole lse and delta, equal the whole attention.
    #[test]
    fn two_key_blocks_merged_by_lse_equal_the_whole_attention() {
        let (batch, heads, kv_heads, len, keys, d) = (2, 4, 2, 70, 100, 8);
        let q = tensor([batch, heads, len, d], 1);
        let k = tensor([batch, kv_heads, keys, d], 2);
        let v = tensor([batch, kv_heads, keys, d], 3);
        let bias = bias(heads, len, keys);
        let d_out = tensor([batch, heads, len, d], 4);
        let whole = |t: &Tensor<Flex, 4>| prim(t.clone());
        let (out, lse) = attention_forward_lse(whole(&q), whole(&k), whole(&v), whole(&bias));
        let out = read(float(out));
        let [want_dq, want_dk, want_dv] =
            attention_reference_backward(q.clone(), k.clone(), v.clone(), &bias, d_out.clone());
        // Keys 0..40 and 40..100: the second block masks the first queries entirely.
        let split = 40;
        let parts: Vec<_> = [(0, split), (split, keys - split)]
            .into_iter()
            .map(|(start, n)| {
                let cut = |t: &Tensor<Flex, 4>, dim| prim(t.clone().narrow(dim, start, n));
                (cut(&k, 2), cut(&v, 2), cut(&bias, 3))
            })
            .collect();
        let rows = batch * heads * len;
        let mut merged = vec![0.0f32; out.len()];
        let mut merged_lse = vec![f32::NEG_INFINITY; rows];
        // Queries 30.. see keys of both blocks (the bias: query i at key position 30 + i).
        let q_late = q.clone().narrow(2, 30, len - 30);
        for (kb, vb, bb) in &parts {
            let bias_late = float(bb.clone()).narrow(2, 30, len - 30);
            let (o, l) = attention_forward_lse(
                prim(q_late.clone()),
                kb.clone(),
                vb.clone(),
                prim(bias_late),
            );
            let o = read(float(o));
            let late = len - 30;
            for head in 0..batch * heads {
                for i in 0..late {
                    let (at, row) = (head * late + i, head * len + 30 + i);
                    let (old, new) = (merged_lse[row], l[at]);
                    let top = old.max(new);
                    let m = top + ((old - top).exp() + (new - top).exp()).ln();
                    for e in 0..d {
                        let x = &mut merged[row * d + e];
                        *x = (old - m).exp() * *x + (new - m).exp() * o[at * d + e];
                    }
                    merged_lse[row] = m;
                }
            }
        }
        let late_rows: Vec<usize> = (0..rows).filter(|r| r % len >= 30).collect();
        let pick = |v: &[f32], width: usize| -> Vec<f32> {
            late_rows
                .iter()
                .flat_map(|&r| v[r * width..(r + 1) * width].to_vec())
                .collect()
        };
        assert_close(&pick(&merged, d), &pick(&out, d), "merged out");
        assert_close(&pick(&merged_lse, 1), &pick(&lse, 1), "merged lse");
        // Backward: each block's share with the whole lse and delta.
        let delta = delta(&d_out, &float(seq_major(&out, [batch, heads, len, d])));
        let mut dq = vec![0.0f32; out.len()];
        let mut dk = Vec::new();
        let mut dv = Vec::new();
        for (kb, vb, bb) in parts {
            let [q_share, k_share, v_share] =
                attention_backward_lse(whole(&q), kb, vb, bb, whole(&d_out), &lse, &delta);
            for (x, y) in dq.iter_mut().zip(read(float(q_share))) {
                *x += y;
            }
            dk.push(float(k_share));
            dv.push(float(v_share));
        }
        assert_close(&dq, &read(want_dq), "dq");
        assert_close(&read(Tensor::cat(dk, 2)), &read(want_dk), "dk");
        assert_close(&read(Tensor::cat(dv, 2)), &read(want_dv), "dv");
    }
}
