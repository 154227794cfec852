//! A ring run in one process, without a communicator: what
//! [`ring_forward`](super::ring_forward) and
//! [`ring_backward`](super::ring_backward) compute over `cp` ranks, with
//! the transfers replaced by indexing. Every rank's forward steps run,
//! then every rank's backward steps, each step's `dk`, `dv` added to the
//! block's owner (the sum the ring's transfers gather). The tests of the
//! ring's steps and of the decoder's block kernel check it against the
//! one-rank attention, as `pipeline::simulate` proves the schedules
//! before they run.

use super::backward::{Kept, RingBackward};
use super::block::{BlockAttention, HeadBuf};
use super::buf::RingBuf;
use super::forward::RingForward;
use super::pairing::source;
use super::split::{ChunkLayout, SplitError};

/// Rank `rank`'s part `[batch, heads, seq / cp, width]` of `x` `[batch,
/// heads, seq, width]` (its two chunks of every sequence).
pub fn rank_part(layout: ChunkLayout, x: &HeadBuf, rank: usize) -> HeadBuf {
    let [b, h, _, w] = x.dims;
    HeadBuf::new(
        [b, h, layout.local_len(), w],
        layout.split(&x.data, w, rank),
    )
}

/// The attention of whole sequences `[q, k, v, d_out]` (`q` and `d_out`
/// `[batch, heads, seq, head_dim]`, `k` and `v` `[batch, kv_heads, seq,
/// head_dim]`) computed by a ring of `cp` ranks with block kernel
/// `kernel`, put back in sequence order: `[out, lse, dq, dk, dv]` (`lse`
/// `[batch, heads, seq, 1]`, the others the shapes of their inputs).
///
/// # Errors
/// A sequence length that is not a multiple of `2 x cp`.
pub fn simulate_ring<A: BlockAttention + ?Sized>(
    kernel: &A,
    cp: usize,
    whole: [&HeadBuf; 4],
) -> Result<[HeadBuf; 5], SplitError> {
    simulate_ring_on(kernel, cp, whole, |x| x, |x| x)
}

/// [`simulate_ring`] on buffers `T` (a backend's device tensors): each
/// rank's parts are split on the host and put in a `T` by `load`, and the
/// results read back by `read`.
///
/// # Errors
/// As [`simulate_ring`].
pub fn simulate_ring_on<T: RingBuf, A: BlockAttention<T> + ?Sized>(
    kernel: &A,
    cp: usize,
    whole: [&HeadBuf; 4],
    load: impl Fn(HeadBuf) -> T,
    read: impl Fn(T) -> HeadBuf,
) -> Result<[HeadBuf; 5], SplitError> {
    let layout = ChunkLayout::new(whole[0].dims[2], cp)?;
    let [qs, ks, vs, gs]: [Vec<T>; 4] =
        whole.map(|x| (0..cp).map(|r| load(rank_part(layout, x, r))).collect());
    let mut outs = Vec::new();
    for (r, q) in qs.iter().enumerate() {
        let mut state = RingForward::new(kernel, layout, r, q);
        for t in 0..cp {
            let s = source(r, t, cp);
            state.step(s, &ks[s], &vs[s]);
        }
        outs.push(state.finish());
    }
    let mut dks: Vec<T> = ks.iter().map(|x| x.filled_like(x.dims(), 0.0)).collect();
    let mut dvs = dks.clone();
    let mut dqs = Vec::new();
    for (r, (out, lse)) in outs.iter().enumerate() {
        let kept = Kept::of([&qs[r], &ks[r], &vs[r], out, lse]);
        let mut state = RingBackward::new(kernel, layout, r, kept, &gs[r]);
        for t in 0..cp {
            let s = source(r, t, cp);
            let [dk, dv] = state.step(s, &ks[s], &vs[s]);
            dks[s].add(&dk);
            dvs[s].add(&dv);
        }
        dqs.push(state.finish());
    }
    let join = |parts: Vec<T>| {
        let parts: Vec<HeadBuf> = parts.into_iter().map(&read).collect();
        let [b, h, _, w] = parts[0].dims;
        let data: Vec<Vec<f32>> = parts.into_iter().map(|p| p.data).collect();
        HeadBuf::new([b, h, layout.seq(), w], layout.unsplit(&data, w))
    };
    let (out, lse): (Vec<T>, Vec<T>) = outs.into_iter().unzip();
    Ok([join(out), join(lse), join(dqs), join(dks), join(dvs)])
}
