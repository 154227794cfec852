//! What one step of the ring computes, and how its results combine.
//!
//! The per-block attention is supplied by the model's kernels
//! ([`BlockAttention`]: the fused attention in its `(output, lse)` form,
//! and its backward given the whole attention's log-sum-exp), so the ring
//! adds communication and bookkeeping, never a second attention.
//! [`merge`] folds one block's output into the running one by their
//! log-sum-exps (the online softmax).

use std::ops::Range;

/// Per-head rows on the host: f32 `[batch, heads, len, width]`, row-major.
/// Queries, keys, values and outputs have `width = head_dim`; the
/// log-sum-exp and `delta` rows have `width = 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadBuf {
    /// `[batch, heads, len, width]`.
    pub dims: [usize; 4],
    /// The values, row-major.
    pub data: Vec<f32>,
}

impl HeadBuf {
    /// `data` of shape `dims`; panics when the lengths differ.
    pub fn new(dims: [usize; 4], data: Vec<f32>) -> Self {
        assert_eq!(
            dims.iter().product::<usize>(),
            data.len(),
            "head buffer {dims:?} of {} values",
            data.len()
        );
        Self { dims, data }
    }

    /// Every value `value`.
    pub fn filled(dims: [usize; 4], value: f32) -> Self {
        Self::new(dims, vec![value; dims.iter().product()])
    }

    /// Positions `rows` of every (sequence, head), copied: `[batch, heads,
    /// rows.len(), width]`.
    pub fn rows(&self, rows: Range<usize>) -> Self {
        let [b, h, len, w] = self.dims;
        if rows == (0..len) {
            return self.clone();
        }
        let mut data = Vec::with_capacity(b * h * rows.len() * w);
        for head in self.data.chunks(len * w) {
            data.extend_from_slice(&head[rows.start * w..rows.end * w]);
        }
        Self::new([b, h, rows.len(), w], data)
    }

    /// Adds `part` `[batch, heads, rows.len(), width]` to positions `rows`.
    pub fn add_rows(&mut self, rows: Range<usize>, part: &HeadBuf) {
        let [b, h, len, w] = self.dims;
        assert_eq!(
            part.dims,
            [b, h, rows.len(), w],
            "rows {rows:?} of {:?}",
            self.dims
        );
        for (head, add) in self
            .data
            .chunks_mut(len * w)
            .zip(part.data.chunks(rows.len() * w))
        {
            for (x, a) in head[rows.start * w..rows.end * w].iter_mut().zip(add) {
                *x += a;
            }
        }
    }

    /// Adds `other` (same shape) element-wise.
    pub fn add(&mut self, other: &HeadBuf) {
        self.add_rows(0..self.dims[2], other);
    }
}

/// The operands of one block: queries `q` `[batch, heads, len_q,
/// head_dim]` at global positions `q_pos` (`len_q` of them) against keys
/// `k` and values `v` `[batch, kv_heads, len_k, head_dim]` at `k_pos`
/// (query head `h` reads KV head `h / (heads / kv_heads)`). Key `j` is
/// visible to query `i` when `k_pos[j] <= q_pos[i]` (the causal mask on
/// global positions); every query sees at least one key. `T` is the
/// buffer: [`HeadBuf`] on the host, a device tensor on the device ring.
#[derive(Debug)]
pub struct Block<'a, T = HeadBuf> {
    /// Queries `[batch, heads, len_q, head_dim]`.
    pub q: &'a T,
    /// Keys `[batch, kv_heads, len_k, head_dim]`.
    pub k: &'a T,
    /// Values, as `k`.
    pub v: &'a T,
    /// Global position of each query row.
    pub q_pos: &'a [usize],
    /// Global position of each key row.
    pub k_pos: &'a [usize],
}

impl<T> Clone for Block<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Block<'_, T> {}

/// What the backward of one block needs of the whole attention of its
/// queries (over every key of the sequence, not only this block's).
#[derive(Debug)]
pub struct WholeRows<'a, T = HeadBuf> {
    /// Gradient of the whole output, `[batch, heads, len_q, head_dim]`.
    pub d_out: &'a T,
    /// Log-sum-exp of the whole attention's scores, `[batch, heads, len_q, 1]`.
    pub lse: &'a T,
    /// `rowsum(d_out * out)` of the whole output, `[batch, heads, len_q, 1]`.
    pub delta: &'a T,
}

impl<T> Clone for WholeRows<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for WholeRows<'_, T> {}

/// The attention of one block, supplied by the model's kernels: scores
/// `q k^T / sqrt(head_dim)` plus the positional bias the model uses (for
/// ALiBi a function of the global positions), softmax over the visible
/// keys, times `v`. `T` is the buffer the block comes in and the results
/// go out in (f32).
pub trait BlockAttention<T = HeadBuf>: Sync {
    /// The output `[batch, heads, len_q, head_dim]` and the log-sum-exp
    /// (natural log) of each query's biased scores over this block's
    /// visible keys `[batch, heads, len_q, 1]`.
    fn forward(&self, block: Block<'_, T>) -> (T, T);

    /// This block's share `[dq, dk, dv]` (the shapes of `q`, `k`, `v`) of
    /// the gradients of the whole attention: probabilities
    /// `exp(score - whole.lse)`, the softmax's gradient taken with
    /// `whole.delta`.
    fn backward(&self, block: Block<'_, T>, whole: WholeRows<'_, T>) -> [T; 3];
}

/// Folds a block's output `part` `[batch, heads, rows.len(), d]` and
/// log-sum-exp `part_lse` `[batch, heads, rows.len(), 1]` into positions
/// `rows` of the running `out` and `lse`: `lse' = log(e^lse + e^part_lse)`,
/// `out' = e^(lse - lse') out + e^(part_lse - lse') part`. A running `lse`
/// of `-inf` (nothing yet) takes the part as it is.
pub fn merge(
    out: &mut HeadBuf,
    lse: &mut HeadBuf,
    rows: Range<usize>,
    part: &HeadBuf,
    part_lse: &HeadBuf,
) {
    let [b, h, len, d] = out.dims;
    let n = rows.len();
    assert_eq!(lse.dims, [b, h, len, 1], "merge: lse {:?}", lse.dims);
    assert_eq!(part.dims, [b, h, n, d], "merge: part {:?}", part.dims);
    assert_eq!(
        part_lse.dims,
        [b, h, n, 1],
        "merge: part lse {:?}",
        part_lse.dims
    );
    for head in 0..b * h {
        for (i, row) in rows.clone().enumerate() {
            let (old, new) = (lse.data[head * len + row], part_lse.data[head * n + i]);
            let top = old.max(new);
            let merged = top + ((old - top).exp() + (new - top).exp()).ln();
            let (keep, take) = ((old - merged).exp(), (new - merged).exp());
            let o = &mut out.data[(head * len + row) * d..(head * len + row + 1) * d];
            let p = &part.data[(head * n + i) * d..(head * n + i + 1) * d];
            for (x, y) in o.iter_mut().zip(p) {
                *x = keep * *x + take * y;
            }
            lse.data[head * len + row] = merged;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_add_rows_address_every_head() {
        let x = HeadBuf::new([1, 2, 3, 2], (0..12).map(|v| v as f32).collect());
        let mid = x.rows(1..3);
        assert_eq!(mid.dims, [1, 2, 2, 2]);
        assert_eq!(mid.data, [2.0, 3.0, 4.0, 5.0, 8.0, 9.0, 10.0, 11.0]);
        let mut y = HeadBuf::filled([1, 2, 3, 2], 1.0);
        y.add_rows(1..3, &mid);
        assert_eq!(
            y.data,
            [1.0, 1.0, 3.0, 4.0, 5.0, 6.0, 1.0, 1.0, 9.0, 10.0, 11.0, 12.0]
        );
    }

    /// Merging the softmax-weighted averages of two halves of a row's
    /// scores gives the average over the whole row (f64 reference).
    #[test]
    fn merge_equals_one_softmax_over_both_blocks() {
        let scores = [0.3f64, -1.2, 2.5, 0.0, 1.1, -0.4];
        let values = [1.0f64, -2.0, 0.5, 3.0, -1.5, 2.0];
        let lse = |s: &[f64]| s.iter().map(|x| x.exp()).sum::<f64>().ln();
        let avg = |s: &[f64], v: &[f64]| {
            let l = lse(s);
            s.iter().zip(v).map(|(x, y)| (x - l).exp() * y).sum::<f64>()
        };
        let mut out = HeadBuf::filled([1, 1, 2, 1], 0.0);
        let mut run_lse = HeadBuf::filled([1, 1, 2, 1], f32::NEG_INFINITY);
        // Row 1 only: two blocks of three keys, in either order.
        for (a, b) in [(0..3, 3..6), (3..6, 0..3)] {
            out.data[1] = 0.0;
            run_lse.data[1] = f32::NEG_INFINITY;
            for keys in [a.clone(), b.clone()] {
                let part = HeadBuf::new(
                    [1, 1, 1, 1],
                    vec![avg(&scores[keys.clone()], &values[keys.clone()]) as f32],
                );
                let part_lse = HeadBuf::new([1, 1, 1, 1], vec![lse(&scores[keys]) as f32]);
                merge(&mut out, &mut run_lse, 1..2, &part, &part_lse);
            }
            assert!((out.data[1] as f64 - avg(&scores, &values)).abs() < 1e-6);
            assert!((run_lse.data[1] as f64 - lse(&scores)).abs() < 1e-6);
            // Row 0 was not touched.
            assert_eq!((out.data[0], run_lse.data[0]), (0.0, f32::NEG_INFINITY));
        }
    }
}
