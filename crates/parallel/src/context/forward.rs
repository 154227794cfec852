//! Ring attention forward: each rank's queries against every rank's K/V,
//! one block per step, merged by log-sum-exp.

use super::block::{Block, BlockAttention, HeadBuf};
use super::buf::RingBuf;
use super::pairing::{source, Pairing};
use super::split::ChunkLayout;
use super::transport::{RingTransport, TAG_BASE};
use crate::comm::CommError;

/// One rank's forward, step by step: holds its queries and the running
/// output and log-sum-exp, buffers `T` ([`HeadBuf`] on the host).
/// [`ring_forward`] drives it over a transport; a caller may drive it
/// with blocks it passes itself.
pub struct RingForward<'a, A: BlockAttention<T> + ?Sized, T: RingBuf = HeadBuf> {
    kernel: &'a A,
    layout: ChunkLayout,
    rank: usize,
    q: &'a T,
    positions: Vec<usize>,
    out: T,
    lse: T,
}

impl<'a, A: BlockAttention<T> + ?Sized, T: RingBuf> RingForward<'a, A, T> {
    /// The forward of rank `rank` of the ring for its queries `q` `[batch,
    /// heads, local_len, head_dim]` (its two chunks, in local order).
    pub fn new(kernel: &'a A, layout: ChunkLayout, rank: usize, q: &'a T) -> Self {
        let [b, h, len, d] = q.dims();
        assert_eq!(len, layout.local_len(), "ring forward: q {:?}", q.dims());
        Self {
            kernel,
            layout,
            rank,
            q,
            positions: layout.positions(rank),
            out: q.filled_like([b, h, len, d], 0.0),
            lse: q.filled_like([b, h, len, 1], f32::NEG_INFINITY),
        }
    }

    /// Attends to the K/V `k`, `v` `[batch, kv_heads, local_len, head_dim]`
    /// of rank `source`: the pairs [`Pairing`] keeps, merged into the
    /// running output.
    pub fn step(&mut self, source: usize, k: &T, v: &T) {
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
        T::merge(&mut self.out, &mut self.lse, rows, &part, &part_lse);
    }

    /// The output `[batch, heads, local_len, head_dim]` and log-sum-exp
    /// `[batch, heads, local_len, 1]`, once every rank's K/V has been seen.
    pub fn finish(self) -> (T, T) {
        (self.out, self.lse)
    }
}

/// Ring attention forward on this rank of the context-parallel ring
/// `ring` (a communicator for host buffers, [`super::DeviceRing`] for
/// device tensors): its queries `q` `[batch, heads, local_len, head_dim]`
/// and K/V `k`, `v` `[batch, kv_heads, local_len, head_dim]` (its chunks
/// of the sequences, [`ChunkLayout::split`]) give its rows of the whole
/// attention's output and log-sum-exp ([`RingForward::finish`]). K/V
/// travel `cp - 1` times (on the host ring each transfer overlaps a step).
pub fn ring_forward<X, A, T>(
    ring: &X,
    kernel: &A,
    layout: ChunkLayout,
    q: &T,
    k: &T,
    v: &T,
) -> Result<(T, T), CommError>
where
    X: RingTransport<T> + ?Sized,
    A: BlockAttention<T> + ?Sized,
    T: RingBuf,
{
    let (rank, cp) = ring.place();
    assert_eq!(cp, layout.cp(), "a ring of {cp} ranks for {layout:?}");
    let mut state = RingForward::new(kernel, layout, rank, q);
    let (mut k, mut v) = (k.clone(), v.clone());
    for step in 0..cp {
        let send: Vec<(i32, &T)> = if step + 1 < cp {
            vec![(TAG_BASE, &k), (TAG_BASE + 1, &v)]
        } else {
            Vec::new()
        };
        let (received, ()) = ring.pass_on(&send, || state.step(source(rank, step, cp), &k, &v))?;
        let mut received = received.into_iter();
        if let (Some(next_k), Some(next_v)) = (received.next(), received.next()) {
            (k, v) = (next_k, next_v);
        }
    }
    Ok(state.finish())
}
