//! What the ring needs of a buffer of per-head rows ([`RingBuf`]), so that
//! the same steps run on host buffers ([`HeadBuf`]) and on a backend's
//! device tensors (`Tensor<B, 4>`, [`super::device`]).

use std::ops::Range;

use super::block::{merge, HeadBuf};

/// Per-head rows in f32, `[batch, heads, len, width]`: queries, keys,
/// values and outputs have `width = head_dim`, the log-sum-exp and
/// `delta` rows `width = 1`.
pub trait RingBuf: Clone + Send + Sync {
    /// `[batch, heads, len, width]`.
    fn dims(&self) -> [usize; 4];
    /// A buffer of shape `dims`, every value `value`, where `self` lives.
    fn filled_like(&self, dims: [usize; 4], value: f32) -> Self;
    /// Positions `rows` of every (sequence, head): `[batch, heads,
    /// rows.len(), width]`.
    fn rows(&self, rows: Range<usize>) -> Self;
    /// Adds `part` `[batch, heads, rows.len(), width]` to positions `rows`.
    fn add_rows(&mut self, rows: Range<usize>, part: &Self);
    /// Adds `other` (same shape) element-wise.
    fn add(&mut self, other: &Self) {
        let len = self.dims()[2];
        self.add_rows(0..len, other);
    }
    /// [`merge`] (the online softmax): folds a block's output `part`
    /// `[batch, heads, rows.len(), d]` and log-sum-exp `part_lse`
    /// `[batch, heads, rows.len(), 1]` into positions `rows` of the
    /// running `out` and `lse`.
    fn merge(out: &mut Self, lse: &mut Self, rows: Range<usize>, part: &Self, part_lse: &Self);
    /// `rowsum(self * other)` over the last axis (same shapes): `[batch,
    /// heads, len, 1]` (the backward's `delta`).
    fn row_dots(&self, other: &Self) -> Self;
}

impl RingBuf for HeadBuf {
    fn dims(&self) -> [usize; 4] {
        self.dims
    }

    fn filled_like(&self, dims: [usize; 4], value: f32) -> Self {
        HeadBuf::filled(dims, value)
    }

    fn rows(&self, rows: Range<usize>) -> Self {
        HeadBuf::rows(self, rows)
    }

    fn add_rows(&mut self, rows: Range<usize>, part: &Self) {
        HeadBuf::add_rows(self, rows, part);
    }

    fn merge(out: &mut Self, lse: &mut Self, rows: Range<usize>, part: &Self, part_lse: &Self) {
        merge(out, lse, rows, part, part_lse);
    }

    fn row_dots(&self, other: &Self) -> Self {
        assert_eq!(self.dims, other.dims, "row dots of {:?}", other.dims);
        let [b, h, len, d] = self.dims;
        let data = self
            .data
            .chunks(d)
            .zip(other.data.chunks(d))
            .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
            .collect();
        HeadBuf::new([b, h, len, 1], data)
    }
}
