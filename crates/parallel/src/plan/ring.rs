//! The context-parallel ring's time, as Ferrotron's trainer runs it
//! ([`crate::context`]): what of its transfers the block's attention does
//! not hide.
//!
//! On a ring of `c` ranks each rank holds `s / c` tokens of every
//! sequence. Per block and micro-batch, its K and V (`2 x b x s/c x
//! h_kv / t` values, sent as f32 host buffers) travel `c - 1` times in
//! forward: the ring traffic per rank is `2 x (c - 1)/c x` the K/V bytes
//! of the whole sequence. Each transfer runs on a helper thread while the
//! rank computes one step's attention, so a step takes the longer of the
//! two. Backward runs the same `c` steps: step 0 sends K/V, the middle
//! `c - 2` steps K/V and the `dK`, `dV` gathered so far, step `c - 1`
//! those gradients, each beside that step's attention backward; a last
//! transfer of `dK`, `dV`, with nothing to hide it, brings every rank the
//! gradients of its own keys. Full recomputation runs the forward ring
//! again in backward.
//!
//! A step's attention is the planner's count of attention FLOPs
//! (Megatron's `4 s h` per token forward, twice that backward: scores
//! and values, causal or not) of this rank's `s/c` queries over all `s`
//! keys, split evenly over the `c` steps (the load-balanced chunks give
//! every step the same causal work), at the compute's efficiency.
//!
//! Where Megatron-Core differs: it sends K/V in the compute precision
//! (bf16) on GPU streams beside FlashAttention, and in backward sends
//! `dK`, `dV` with the K/V on the same schedule; its ring is priced the
//! same way here except for the element size, which Ferrotron's host
//! buffers fix at 4 bytes.

use super::activation::Recompute;
use super::comm::p2p;
use super::link::Link;
use super::{Choice, PlanInput};

/// Bytes of one rank's K and V of one micro-batch through one block (its
/// `s / c` tokens, its `h_kv / t` KV width), f32 as the ring sends them.
pub fn kv_block_bytes(input: &PlanInput, c: &Choice) -> f64 {
    let local = input.seq as f64 / c.cp as f64;
    let width = input.model.kv_width() as f64 / c.tp as f64;
    2.0 * 4.0 * c.micro_batch as f64 * local * width
}

/// Seconds of one micro-batch's ring transfers through one block, forward
/// and backward (and the recomputed forward), that the attention beside
/// them does not hide, over `link`; 0 without context parallelism.
pub fn ring_exposed_s(input: &PlanInput, c: &Choice, link: &Link) -> f64 {
    if c.cp == 1 {
        return 0.0;
    }
    let cp = c.cp as f64;
    let (s, b, t) = (input.seq as f64, c.micro_batch as f64, c.tp as f64);
    let rate = input.peak_flops() * input.efficiency;
    let forward_s = 4.0 * b * (s / cp) * s * input.model.hidden as f64 / t / rate;
    let (fwd_step, bwd_step) = (forward_s / cp, 2.0 * forward_s / cp);
    let kv = kv_block_bytes(input, c);
    let beside = |bytes: f64, compute: f64| (p2p(bytes, link) - compute).max(0.0);
    let forward = (cp - 1.0) * beside(kv, fwd_step);
    let backward =
        2.0 * beside(kv, bwd_step) + (cp - 2.0) * beside(2.0 * kv, bwd_step) + p2p(kv, link);
    let forwards = if c.recompute == Recompute::Full {
        2.0
    } else {
        1.0
    };
    forwards * forward + backward
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixture::small_gpt;
    use crate::zero::ZeroStage;

    /// The fixture's GPT (hidden 64, 4 heads, 4 KV heads) at `seq`
    /// tokens on 8 ranks, a ring allowed: 1 TFLOP/s at efficiency 0.5,
    /// links of 1 GB/s and 10 us.
    fn input(seq: usize) -> PlanInput {
        PlanInput {
            context_parallel: true,
            ..small_gpt(8, seq)
        }
    }

    fn ring(cp: usize, recompute: Recompute) -> Choice {
        Choice {
            dp: 8 / cp,
            tp: 1,
            cp,
            pp: 1,
            sp: false,
            zero: ZeroStage::Off,
            micro_batch: 1,
            recompute,
            interleave: 1,
            offload: false,
        }
    }

    /// Short sequences: every transfer outlasts its step's attention, so
    /// the ring costs its transfers written out one by one; cp1 nothing.
    #[test]
    fn short_sequences_pay_every_transfer() {
        let input = input(64);
        let link = input.intra;
        // cp 4: 16 tokens x 64 values x K and V x 4 bytes.
        let kv = 16.0 * 64.0 * 2.0 * 4.0;
        assert_eq!(kv_block_bytes(&input, &ring(4, Recompute::None)), kv);
        let send = |bytes: f64| 1e-5 + bytes / 1e9;
        // Attention of one step: 4 x 16 x 64 x 64 FLOPs / 4 steps at 5e11.
        let fwd = 4.0 * 16.0 * 64.0 * 64.0 / 5e11 / 4.0;
        let forward = 3.0 * (send(kv) - fwd);
        let backward = 2.0 * (send(kv) - 2.0 * fwd) + 2.0 * (send(2.0 * kv) - 2.0 * fwd);
        let want = forward + backward + send(kv);
        let got = ring_exposed_s(&input, &ring(4, Recompute::None), &link);
        assert!((got / want - 1.0).abs() < 1e-12, "{got} vs {want}");
        let full = ring_exposed_s(&input, &ring(4, Recompute::Full), &link);
        assert!((full / (want + forward) - 1.0).abs() < 1e-12);
        assert_eq!(
            ring_exposed_s(&input, &ring(1, Recompute::None), &link),
            0.0
        );
    }

    /// Long sequences: the attention (quadratic in `s`) hides the
    /// transfers (linear), all but the last one of `dK`, `dV`.
    #[test]
    fn long_sequences_hide_all_but_the_last_transfer() {
        let input = input(1 << 20);
        let c = ring(2, Recompute::Full);
        let kv = kv_block_bytes(&input, &c);
        let got = ring_exposed_s(&input, &c, &input.intra);
        assert!((got / (1e-5 + kv / 1e9) - 1.0).abs() < 1e-12, "{got}");
    }
}
