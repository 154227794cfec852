//! The fused CubeCL attention (`ferrotron_kernels::attention`) as the
//! per-block kernel of ring attention (`ferrotron_parallel::context`) on
//! the GPU backends: a ring step runs the decoder's own FlashAttention
//! kernels, forward in its `(output, lse)` form and backward from the
//! whole attention's log-sum-exp and `delta`
//! (`attention_backward_from_delta`).
//!
//! The kernels attend a square `[seq, seq]` block from position 0, either
//! causally or to every key. A ring block is made of chunks of one length
//! `c` at global positions that are multiples of `c` (the ring's chunk
//! pairing), so it is cut into `c x c` pieces, each either on the
//! diagonal (causal), entirely before its queries (every key), or
//! entirely after them (skipped). A piece's queries and keys start at
//! different global positions, so ALiBi's `slope_h * (k_pos - q_pos)`
//! there is the kernel's local bias `slope_h * (j - i)` plus the constant
//! `slope_h * (k_start - q_start)` per head: it leaves the softmax and the
//! output unchanged and shifts the log-sum-exp, which the forward adds
//! and the backward takes off the whole attention's before the launch.
//! The pieces' outputs merge by their log-sum-exps, their gradients add.

use std::ops::Range;

use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::server::Handle;
use ferrotron_kernels::attention::{
    attention_backward_from_delta, attention_forward_with, AttentionBackwardKernel,
    AttentionForward, AttentionGradients, AttentionInputs, AttentionKernel, AttentionOptions,
    AttentionShape, MatrixUnits,
};
use ferrotron_kernels::FloatDtype;
use ferrotron_parallel::context::{merge, Block, BlockAttention, HeadBuf, WholeRows};

/// The fused attention kernels over one block of a ring, on one device.
pub struct CubeBlockAttention<R: Runtime> {
    pub(super) client: ComputeClient<R>,
    /// ALiBi slope of each query head of the block (`None`: no ALiBi).
    pub(super) slopes: Option<Vec<f32>>,
    pub(super) forward: AttentionKernel,
    pub(super) backward: AttentionBackwardKernel,
}

impl<R: Runtime> CubeBlockAttention<R> {
    /// On `device`, the kernels [`AttentionKernel::choose`] and
    /// [`AttentionBackwardKernel::choose`] pick for it at `head_dim`, for
    /// query heads with ALiBi `slopes` (one per head this rank computes)
    /// or none.
    pub fn new(device: &R::Device, head_dim: usize, slopes: Option<Vec<f32>>) -> Self {
        let client = R::client(device);
        Self {
            forward: AttentionKernel::choose(&client, head_dim),
            backward: AttentionBackwardKernel::choose(&client, head_dim),
            client,
            slopes,
        }
    }

    fn upload(&self, x: &HeadBuf) -> Handle {
        self.client.create_from_slice(f32::as_bytes(&x.data))
    }

    fn download(&self, handle: Handle, dims: [usize; 4]) -> HeadBuf {
        let bytes = self
            .client
            .read_one(handle)
            .expect("read back a ring block's attention");
        HeadBuf::new(dims, f32::from_bytes(&bytes).to_vec())
    }

    /// The ALiBi slopes on the device, once per block.
    pub(super) fn slopes_on_device(&self) -> Option<Handle> {
        self.slopes
            .as_ref()
            .map(|s| self.client.create_from_slice(f32::as_bytes(s)))
    }

    /// Rows `rows` of each of `bufs` on the device.
    fn upload_rows(&self, bufs: &[&HeadBuf], rows: &Range<usize>) -> Vec<Handle> {
        bufs.iter()
            .map(|b| self.upload(&b.rows(rows.clone())))
            .collect()
    }

    /// The forward kernel on one piece `pair` of f32 buffers `qkv` (`[q,
    /// k, v]`, the launch's `shape`) with ALiBi `slopes`.
    pub(super) fn launch_forward(
        &self,
        shape: AttentionShape,
        pair: &Pair,
        qkv: &[Handle; 3],
        slopes: &Option<Handle>,
    ) -> AttentionForward {
        attention_forward_with(
            &self.client,
            self.forward,
            FloatDtype::F32,
            shape,
            pair.options(),
            inputs(qkv, slopes),
        )
        .unwrap_or_else(|e| panic!("ring block attention forward: {e}"))
    }

    /// The backward kernel on one piece, as [`Self::launch_forward`], from
    /// the piece's rows `[lse, delta, d_out]` of the whole attention (`lse`
    /// already without the piece's ALiBi shift).
    pub(super) fn launch_backward(
        &self,
        shape: AttentionShape,
        pair: &Pair,
        qkv: &[Handle; 3],
        slopes: &Option<Handle>,
        [lse, delta, d_out]: [&Handle; 3],
    ) -> AttentionGradients {
        attention_backward_from_delta(
            &self.client,
            self.backward,
            FloatDtype::F32,
            shape,
            pair.options(),
            inputs(qkv, slopes),
            lse,
            delta,
            d_out,
        )
        .unwrap_or_else(|e| panic!("ring block attention backward: {e}"))
    }

    /// The slope of query head `head`, 0 without ALiBi.
    pub(super) fn slope(&self, head: usize) -> f32 {
        self.slopes.as_ref().map_or(0.0, |s| s[head])
    }

    /// Adds `sign * slope_h * (k_start - q_start)` to every row of head
    /// `h` of `lse` `[batch, heads, len, 1]`: the piece's ALiBi offset.
    fn shift_lse(&self, lse: &mut HeadBuf, pair: &Pair, sign: f32) {
        let [_, heads, len, _] = lse.dims;
        let distance = pair.k_start as f32 - pair.q_start as f32;
        for (i, row) in lse.data.chunks_mut(len).enumerate() {
            let shift = sign * self.slope(i % heads) * distance;
            row.iter_mut().for_each(|x| *x += shift);
        }
    }
}

/// One `c x c` piece of a block: local query rows, local key rows, their
/// first global positions, and whether the mask is the causal diagonal.
#[derive(Clone, Debug)]
pub(super) struct Pair {
    pub(super) q_rows: Range<usize>,
    pub(super) k_rows: Range<usize>,
    pub(super) q_start: usize,
    pub(super) k_start: usize,
    pub(super) causal: bool,
}

impl Pair {
    /// The launch's mask; the softmax scale is the model's `1 / sqrt(head_dim)`.
    pub(super) fn options(&self) -> AttentionOptions {
        AttentionOptions {
            causal: self.causal,
            scale: None,
            // The ring's blocks run the kernels `choose` picks.
            matrix_units: MatrixUnits::Off,
        }
    }
}

/// The device copies of a block's pieces of rows, each made at its first
/// use: a piece meets several pieces of the other side.
pub(super) struct PieceUploads {
    len: usize,
    pieces: Vec<Option<Vec<Handle>>>,
}

impl PieceUploads {
    /// For `rows` rows cut into pieces of `len`.
    pub(super) fn new(rows: usize, len: usize) -> Self {
        Self {
            len,
            pieces: vec![None; rows / len],
        }
    }

    /// The piece at `rows`, uploaded by `upload` the first time.
    pub(super) fn get(
        &mut self,
        rows: &Range<usize>,
        upload: impl FnOnce() -> Vec<Handle>,
    ) -> &[Handle] {
        self.pieces[rows.start / self.len].get_or_insert_with(upload)
    }
}

/// The runs of consecutive positions in `pos`, as local index ranges.
fn runs(pos: &[usize]) -> Vec<Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=pos.len() {
        if i == pos.len() || pos[i] != pos[i - 1] + 1 {
            runs.push(start..i);
            start = i;
        }
    }
    runs
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `rows` cut into pieces of `len` rows.
fn pieces(runs: &[Range<usize>], len: usize) -> impl Iterator<Item = Range<usize>> + '_ {
    runs.iter()
        .flat_map(move |r| r.clone().step_by(len).map(move |s| s..s + len))
}

/// The pieces of a block of queries at global positions `q_pos` and keys
/// at `k_pos` that attend to anything, with their masks, and the pieces'
/// length. Panics when a piece's keys overlap its queries only in part:
/// the ring's blocks are whole chunks aligned to their length, which
/// never do.
pub(super) fn pairs(q_pos: &[usize], k_pos: &[usize]) -> (usize, Vec<Pair>) {
    let (q_runs, k_runs) = (runs(q_pos), runs(k_pos));
    let len = q_runs.iter().chain(&k_runs).fold(0, |g, r| gcd(g, r.len()));
    let mut pairs = Vec::new();
    for q_rows in pieces(&q_runs, len) {
        for k_rows in pieces(&k_runs, len) {
            let (q_start, k_start) = (q_pos[q_rows.start], k_pos[k_rows.start]);
            let causal = if k_start == q_start {
                true
            } else if k_start + len <= q_start {
                false
            } else if k_start >= q_start + len {
                continue;
            } else {
                panic!(
                    "ring block: keys from {k_start} overlap queries from {q_start} in part \
                     (pieces of {len} positions)"
                );
            };
            pairs.push(Pair {
                q_rows: q_rows.clone(),
                k_rows,
                q_start,
                k_start,
                causal,
            });
        }
    }
    (len, pairs)
}

/// The launch inputs of a piece's `[q, k, v]` buffers and the ALiBi slopes.
fn inputs<'a>([q, k, v]: &'a [Handle; 3], slopes: &'a Option<Handle>) -> AttentionInputs<'a> {
    AttentionInputs {
        q,
        k,
        v,
        alibi_slopes: slopes.as_ref(),
    }
}

/// The launch shape of a `len x len` piece of a block of queries `q_dims`
/// `[batch, heads, rows, head_dim]` and `kv_heads` key heads.
pub(super) fn shape(q_dims: [usize; 4], kv_heads: usize, len: usize) -> AttentionShape {
    let [batch, n_heads, _, head_dim] = q_dims;
    AttentionShape {
        batch,
        n_heads,
        n_kv_heads: kv_heads,
        seq: len,
        head_dim,
    }
}

impl<R: Runtime> BlockAttention for CubeBlockAttention<R> {
    fn forward(&self, block: Block<'_>) -> (HeadBuf, HeadBuf) {
        let [b, h, len_q, d] = block.q.dims;
        let (len, pairs) = pairs(block.q_pos, block.k_pos);
        let shape = shape(block.q.dims, block.k.dims[1], len);
        let mut out = HeadBuf::filled([b, h, len_q, d], 0.0);
        let mut lse = HeadBuf::filled([b, h, len_q, 1], f32::NEG_INFINITY);
        let slopes = self.slopes_on_device();
        let mut queries = PieceUploads::new(len_q, len);
        let mut keys = PieceUploads::new(block.k.dims[2], len);
        for pair in pairs {
            let q =
                queries.get(&pair.q_rows, || self.upload_rows(&[block.q], &pair.q_rows))[0].clone();
            let kv = keys.get(&pair.k_rows, || {
                self.upload_rows(&[block.k, block.v], &pair.k_rows)
            });
            let qkv = [q, kv[0].clone(), kv[1].clone()];
            let result = self.launch_forward(shape, &pair, &qkv, &slopes);
            let part = self.download(result.out, [b, h, len, d]);
            let mut part_lse = self.download(result.lse, [b, h, len, 1]);
            self.shift_lse(&mut part_lse, &pair, 1.0);
            merge(&mut out, &mut lse, pair.q_rows, &part, &part_lse);
        }
        (out, lse)
    }

    fn backward(&self, block: Block<'_>, whole: WholeRows<'_>) -> [HeadBuf; 3] {
        let [b, h, _, d] = block.q.dims;
        let (len, pairs) = pairs(block.q_pos, block.k_pos);
        let shape = shape(block.q.dims, block.k.dims[1], len);
        let mut dq = HeadBuf::filled(block.q.dims, 0.0);
        let mut dk = HeadBuf::filled(block.k.dims, 0.0);
        let mut dv = HeadBuf::filled(block.v.dims, 0.0);
        let kv_heads = block.k.dims[1];
        let slopes = self.slopes_on_device();
        let mut queries = PieceUploads::new(block.q.dims[2], len);
        let mut keys = PieceUploads::new(block.k.dims[2], len);
        for pair in pairs {
            let q = queries.get(&pair.q_rows, || {
                self.upload_rows(&[block.q, whole.d_out, whole.delta], &pair.q_rows)
            });
            let (d_out, delta) = (q[1].clone(), q[2].clone());
            let q = q[0].clone();
            let kv = keys.get(&pair.k_rows, || {
                self.upload_rows(&[block.k, block.v], &pair.k_rows)
            });
            let qkv = [q, kv[0].clone(), kv[1].clone()];
            let mut lse = whole.lse.rows(pair.q_rows.clone());
            self.shift_lse(&mut lse, &pair, -1.0);
            let lse = self.upload(&lse);
            let grads = self.launch_backward(shape, &pair, &qkv, &slopes, [&lse, &delta, &d_out]);
            dq.add_rows(pair.q_rows, &self.download(grads.dq, [b, h, len, d]));
            dk.add_rows(
                pair.k_rows.clone(),
                &self.download(grads.dk, [b, kv_heads, len, d]),
            );
            dv.add_rows(pair.k_rows, &self.download(grads.dv, [b, kv_heads, len, d]));
        }
        [dq, dk, dv]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A piece as (query rows, key rows, causal).
    type Piece = (Range<usize>, Range<usize>, bool);

    fn block_pairs(q_pos: &[usize], k_pos: &[usize]) -> (usize, Vec<Piece>) {
        let (len, pairs) = pairs(q_pos, k_pos);
        (
            len,
            pairs
                .into_iter()
                .map(|p| (p.q_rows, p.k_rows, p.causal))
                .collect(),
        )
    }

    /// Rank 1 of a ring of 2 over 8 positions holds chunks 1 and 2
    /// (positions 2..6, one run); rank 0 holds chunks 0 and 3.
    #[test]
    fn ring_blocks_cut_into_diagonal_and_whole_pieces() {
        let (r0, r1) = ([0, 1, 6, 7], [2, 3, 4, 5]);
        // Rank 0's own K/V: chunk 0 causal, chunk 3 against 0 whole and
        // against itself causal; chunk 0 never sees chunk 3.
        assert_eq!(
            block_pairs(&r0, &r0),
            (
                2,
                vec![(0..2, 0..2, true), (2..4, 0..2, false), (2..4, 2..4, true)]
            )
        );
        // Rank 1's own: one run of 4 positions, one causal piece.
        assert_eq!(block_pairs(&r1, &r1), (4, vec![(0..4, 0..4, true)]));
        // Rank 1 against rank 0's first chunk (FirstKeys).
        assert_eq!(
            block_pairs(&r1, &r0[..2]),
            (2, vec![(0..2, 0..2, false), (2..4, 0..2, false)])
        );
        // Rank 0's last chunk against rank 1's K/V (LastQueries).
        assert_eq!(
            block_pairs(&r0[2..], &r1),
            (2, vec![(0..2, 0..2, false), (0..2, 2..4, false)])
        );
    }

    #[test]
    #[should_panic(expected = "overlap queries")]
    fn a_partly_overlapping_piece_is_refused() {
        block_pairs(&[2, 3], &[1, 2]);
    }
}
