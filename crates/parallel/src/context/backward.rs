//! Ring attention backward: K/V travel the ring again, and each block's
//! `dk`, `dv` travel with them, gathering every rank's share, until they
//! come home to the rank that owns those keys.

use super::block::{Block, BlockAttention, HeadBuf, WholeRows};
use super::buf::RingBuf;
use super::pairing::{source, Pairing};
use super::split::ChunkLayout;
use super::transport::{RingTransport, TAG_BASE};
use crate::comm::CommError;

/// What the forward keeps for the backward, on one rank: its inputs and
/// the results of [`ring_forward`](super::ring_forward), buffers `T`.
#[derive(Debug)]
pub struct Kept<'a, T = HeadBuf> {
    /// Queries `[batch, heads, local_len, head_dim]`.
    pub q: &'a T,
    /// Keys `[batch, kv_heads, local_len, head_dim]`.
    pub k: &'a T,
    /// Values, as `k`.
    pub v: &'a T,
    /// The whole attention's output rows, as `q`.
    pub out: &'a T,
    /// Their log-sum-exp, `[batch, heads, local_len, 1]`.
    pub lse: &'a T,
}

impl<'a, T> Kept<'a, T> {
    /// The kept buffers, in the order of the fields: `q`, `k`, `v`, `out`,
    /// `lse`.
    pub fn of([q, k, v, out, lse]: [&'a T; 5]) -> Self {
        Kept { q, k, v, out, lse }
    }
}

impl<T> Clone for Kept<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Kept<'_, T> {}

/// One rank's backward, step by step: holds its queries, the output's
/// gradient, the whole attention's `lse` and `delta = rowsum(d_out *
/// out)`, and the running `dq`. [`ring_backward`] drives it over a
/// transport.
pub struct RingBackward<'a, A: BlockAttention<T> + ?Sized, T: RingBuf = HeadBuf> {
    kernel: &'a A,
    layout: ChunkLayout,
    rank: usize,
    q: &'a T,
    d_out: &'a T,
    lse: &'a T,
    delta: T,
    positions: Vec<usize>,
    dq: T,
}

impl<'a, A: BlockAttention<T> + ?Sized, T: RingBuf> RingBackward<'a, A, T> {
    /// The backward of rank `rank` for the output gradient `d_out`
    /// `[batch, heads, local_len, head_dim]`; `kept.k` and `kept.v` are
    /// not read (the blocks come to [`RingBackward::step`]).
    pub fn new(
        kernel: &'a A,
        layout: ChunkLayout,
        rank: usize,
        kept: Kept<'a, T>,
        d_out: &'a T,
    ) -> Self {
        let dims = kept.q.dims();
        let [b, h, len, _] = dims;
        assert_eq!(len, layout.local_len(), "ring backward: q {dims:?}");
        assert!(
            kept.out.dims() == dims && d_out.dims() == dims,
            "ring backward: out {:?}, d_out {:?} for q {dims:?}",
            kept.out.dims(),
            d_out.dims(),
        );
        assert_eq!(kept.lse.dims(), [b, h, len, 1], "ring backward: lse");
        Self {
            kernel,
            layout,
            rank,
            q: kept.q,
            d_out,
            lse: kept.lse,
            delta: kept.out.row_dots(d_out),
            positions: layout.positions(rank),
            dq: kept.q.filled_like(dims, 0.0),
        }
    }

    /// This rank's share `[dk, dv]` (the shapes of `k`, `v`) of the
    /// gradients of rank `source`'s K/V `k`, `v`; its share of `dq` is
    /// added to the running one.
    pub fn step(&mut self, source: usize, k: &T, v: &T) -> [T; 2] {
        let c = self.layout.chunk_len();
        let pairing = Pairing::of(self.rank, source);
        let (rows, keys) = (pairing.query_rows(c), pairing.key_rows(c));
        let k_pos = self.layout.positions(source);
        let (q, kb, vb) = (
            self.q.rows(rows.clone()),
            k.rows(keys.clone()),
            v.rows(keys.clone()),
        );
        let (d_out, lse, delta) = (
            self.d_out.rows(rows.clone()),
            self.lse.rows(rows.clone()),
            self.delta.rows(rows.clone()),
        );
        let block = Block {
            q: &q,
            k: &kb,
            v: &vb,
            q_pos: &self.positions[rows.clone()],
            k_pos: &k_pos[keys.clone()],
        };
        let whole = WholeRows {
            d_out: &d_out,
            lse: &lse,
            delta: &delta,
        };
        let [dq, dk, dv] = self.kernel.backward(block, whole);
        self.dq.add_rows(rows, &dq);
        [(k, dk), (v, dv)].map(|(like, part)| {
            let mut full = like.filled_like(like.dims(), 0.0);
            full.add_rows(keys.clone(), &part);
            full
        })
    }

    /// `dq` `[batch, heads, local_len, head_dim]`, once every rank's K/V
    /// has been seen.
    pub fn finish(self) -> T {
        self.dq
    }
}

/// Ring attention backward on rank `ring.rank()`: from what the forward
/// kept and the output gradient `d_out`, this rank's `[dq, dk, dv]` (the
/// shapes of its `q`, `k`, `v`). At each step the K/V for the next step
/// and the `dk`, `dv` gathered so far for the block of the previous step
/// travel to the next rank while this step computes; a last transfer
/// brings each rank its own `dk`, `dv`. `ring` as for
/// [`ring_forward`](super::ring_forward).
pub fn ring_backward<X, A, T>(
    ring: &X,
    kernel: &A,
    layout: ChunkLayout,
    kept: Kept<'_, T>,
    d_out: &T,
) -> Result<[T; 3], CommError>
where
    X: RingTransport<T> + ?Sized,
    A: BlockAttention<T> + ?Sized,
    T: RingBuf,
{
    let (rank, cp) = ring.place();
    assert_eq!(cp, layout.cp(), "a ring of {cp} ranks for {layout:?}");
    let mut state = RingBackward::new(kernel, layout, rank, kept, d_out);
    let (mut k, mut v) = (kept.k.clone(), kept.v.clone());
    // dk, dv of the block held at the previous step, summed over the
    // ranks it has visited.
    let mut gathered: Option<[T; 2]> = None;
    for step in 0..cp {
        let more = step + 1 < cp;
        let mut send: Vec<(i32, &T)> = Vec::new();
        if more {
            send.extend([(TAG_BASE, &k), (TAG_BASE + 1, &v)]);
        }
        if let Some([dk, dv]) = &gathered {
            send.extend([(TAG_BASE + 2, dk), (TAG_BASE + 3, dv)]);
        }
        let (received, mut parts) =
            ring.pass_on(&send, || state.step(source(rank, step, cp), &k, &v))?;
        let mut received = received.into_iter();
        if more {
            (k, v) = (received.next().unwrap(), received.next().unwrap());
        }
        for (part, earlier) in parts.iter_mut().zip(received) {
            part.add(&earlier);
        }
        gathered = Some(parts);
    }
    let [dk, dv] = gathered.expect("a ring has at least one step");
    let [dk, dv] = if cp > 1 {
        let send = [(TAG_BASE + 2, &dk), (TAG_BASE + 3, &dv)];
        let (home, ()) = ring.pass_on(&send, || ())?;
        let mut home = home.into_iter();
        [home.next().unwrap(), home.next().unwrap()]
    } else {
        [dk, dv]
    };
    Ok([state.finish(), dk, dv])
}
