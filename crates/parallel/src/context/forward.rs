//! Ring attention forward: each rank's queries against every rank's K/V,
//! one block per step, merged by log-sum-exp.

use super::block::{merge, Block, BlockAttention, HeadBuf};
use super::pairing::{source, Pairing};
use super::split::ChunkLayout;
use super::transport::{pass_on, TAG_BASE};
use crate::comm::{CommError, Communicator};

/// One rank's forward, step by step: holds its queries and the running
/// output and log-sum-exp. [`ring_forward`] drives it over a
/// communicator; a caller may drive it with blocks it passes itself.
pub struct RingForward<'a, A: BlockAttention + ?Sized> {
    kernel: &'a A,
    layout: ChunkLayout,
    rank: usize,
    q: &'a HeadBuf,
    positions: Vec<usize>,
    out: HeadBuf,
    lse: HeadBuf,
}

impl<'a, A: BlockAttention + ?Sized> RingForward<'a, A> {
    /// The forward of rank `rank` of the ring for its queries `q` `[batch,
    /// heads, local_len, head_dim]` (its two chunks, in local order).
    pub fn new(kernel: &'a A, layout: ChunkLayout, rank: usize, q: &'a HeadBuf) -> Self {
        let [b, h, len, d] = q.dims;
        assert_eq!(len, layout.local_len(), "ring forward: q {:?}", q.dims);
        Self {
            kernel,
            layout,
            rank,
            q,
            positions: layout.positions(rank),
            out: HeadBuf::filled([b, h, len, d], 0.0),
            lse: HeadBuf::filled([b, h, len, 1], f32::NEG_INFINITY),
        }
    }

    /// Attends to the K/V `k`, `v` `[batch, kv_heads, local_len, head_dim]`
    /// of rank `source`: the pairs [`Pairing`] keeps, merged into the
    /// running output.
    pub fn step(&mut self, source: usize, k: &HeadBuf, v: &HeadBuf) {
        let c = self.layout.chunk_len();
        let pairing = Pairing::of(self.rank, source);
        let (rows, keys) = (pairing.query_rows(c), pairing.key_rows(c));
        let k_pos = self.layout.positions(source);
        let (q, k, v) = (
            self.q.rows(rows.clone()),
            k.rows(keys.clone()),
            v.rows(keys.clone()),
        );
        let (part, part_lse) = self.kernel.forward(Block {
            q: &q,
            k: &k,
            v: &v,
            q_pos: &self.positions[rows.clone()],
            k_pos: &k_pos[keys],
        });
        merge(&mut self.out, &mut self.lse, rows, &part, &part_lse);
    }

    /// The output `[batch, heads, local_len, head_dim]` and log-sum-exp
    /// `[batch, heads, local_len, 1]`, once every rank's K/V has been seen.
    pub fn finish(self) -> (HeadBuf, HeadBuf) {
        (self.out, self.lse)
    }
}

/// Ring attention forward on rank `ring.rank()` of the context-parallel
/// group `ring`: its queries `q` `[batch, heads, local_len, head_dim]` and
/// K/V `k`, `v` `[batch, kv_heads, local_len, head_dim]` (its chunks of
/// the sequences, [`ChunkLayout::split`]) give its rows of the whole
/// attention's output and log-sum-exp ([`RingForward::finish`]). K/V
/// travel `cp - 1` times, each transfer overlapping a step.
pub fn ring_forward<A: BlockAttention + ?Sized>(
    ring: &dyn Communicator,
    kernel: &A,
    layout: ChunkLayout,
    q: &HeadBuf,
    k: &HeadBuf,
    v: &HeadBuf,
) -> Result<(HeadBuf, HeadBuf), CommError> {
    let (rank, cp) = (ring.rank(), ring.world_size());
    assert_eq!(cp, layout.cp(), "a ring of {cp} ranks for {layout:?}");
    let mut state = RingForward::new(kernel, layout, rank, q);
    let (mut k, mut v) = (k.clone(), v.clone());
    for step in 0..cp {
        let send: Vec<(i32, &HeadBuf)> = if step + 1 < cp {
            vec![(TAG_BASE, &k), (TAG_BASE + 1, &v)]
        } else {
            Vec::new()
        };
        let (received, ()) = pass_on(ring, &send, || state.step(source(rank, step, cp), &k, &v))?;
        let mut received = received.into_iter();
        if let (Some(next_k), Some(next_v)) = (received.next(), received.next()) {
            (k, v) = (next_k, next_v);
        }
    }
    Ok(state.finish())
}
