//! Time of one optimizer step: compute from FLOPs, tensor-parallel and
//! pipeline communication per micro-batch, the pipeline bubble, and the
//! data-parallel gradient synchronisation, exposed in full, or only its
//! part that compute cannot hide where the trainer overlaps it.
//!
//! - Compute: the slowest stage's FLOPs (its blocks, and the head on the
//!   last; the split is [`super::split`]'s) over `tp` GPUs at
//!   `efficiency x` the device peak. FLOPs are Megatron's count: `6 x`
//!   matmul weights plus `12 s h` per token and layer, whose sum for GPT
//!   shapes is `72 B s l h^2 (1 + s/6h + V/12lh)`; full recomputation adds
//!   a forward of the layers, giving `96 B s l h^2 (1 + s/6h + V/16lh)`
//!   (Narayanan et al. 2021, Sec. 5.1); selective recomputation adds the
//!   attention scores' forward, `4 s h` per token and layer.
//! - Tensor parallelism: 4 all-reduces of `b s h` activations per layer and
//!   micro-batch (2 forward, 2 backward; 2 more when a layer is
//!   recomputed); with SP each is an all-gather plus a reduce-scatter.
//! - Pipeline: each micro-batch's activation forward and its gradient
//!   backward between stages (`b s h / t` with SP), `v` times with `v`
//!   interleaved chunks; the step takes `(m + (p-1)/v)` stage times, the
//!   `(p-1)/v` being the bubble (Narayanan et al. 2021, Sec. 2.2).
//! - Data parallelism, as Ferrotron's stages do it: ZeRO-0 all-reduces the
//!   gradients once per step, ZeRO-1 adds an all-gather of the updated
//!   parameters, ZeRO-2 reduce-scatters every micro-batch's gradients,
//!   ZeRO-3 also all-gathers each unit's parameters for every micro-batch's
//!   forward and backward. Each stage of a pipeline has its own DP group
//!   over its own parameters. ZeRO-2's reduce-scatter runs inside each
//!   backward (one per chunk when interleaved), so on a pipeline it
//!   lengthens the stage's slot and the bubble; a tied embedding's
//!   gradients, which the first and last stage sum once after the
//!   schedule, are reduce-scattered once per step.
//!
//! - Context parallelism: each rank computes and communicates for its
//!   `s / cp` tokens of every sequence (its attention over all `s` keys);
//!   the ring's transfers beside each block's attention cost what the
//!   attention does not hide ([`super::ring`]); the gradients are reduced,
//!   and ZeRO shards, over the DP x CP group.
//! - Overlap: where the trainer overlaps the DP collectives with compute
//!   (`overlap_grad_reduce`, the DP group the only group of more than one
//!   rank: `tp = cp = pp = 1`), the step is its compute plus the exposed
//!   part of the DP communication, [`super::overlap`]'s replay of the
//!   trainer's schedule ([`TimeEstimate::dp_exposed_s`]); `dp_comm_s`
//!   stays the total. Elsewhere nothing overlaps: the exposed part is the
//!   total.
//! - Optimizer offload: the PCIe copies of the shard and the CPU update
//!   ([`super::offload`]), after the step's reduction, added whole.
//!
//! Groups are placed in Megatron's rank order (TP innermost, then CP, DP,
//! PP): a group stays within a node when the consecutive ranks it spans
//! divide `gpus_per_node`, and otherwise runs at the inter-node link's
//! speed.

use serde::Serialize;

use super::activation::Recompute;
use super::comm::{all_gather, all_reduce, p2p};
use super::link::Link;
use super::offload::offload_time_s;
use super::overlap::{exposed, OverlapInput};
use super::ring::ring_exposed_s;
use super::{Choice, PlanInput};
use crate::zero::ZeroStage;

/// Time of one optimizer step, seconds, by part, and what follows from it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimeEstimate {
    /// Compute of the `m` micro-batches on the slowest stage.
    pub compute_s: f64,
    /// Tensor-parallel collectives.
    pub tp_comm_s: f64,
    /// The context-parallel ring's transfers that the attention does not
    /// hide.
    pub cp_comm_s: f64,
    /// Pipeline sends and receives.
    pub pp_comm_s: f64,
    /// The pipeline bubble (idle stage time).
    pub bubble_s: f64,
    /// Data-parallel gradient and parameter collectives, in all.
    pub dp_comm_s: f64,
    /// Of `dp_comm_s`, the part compute does not hide (all of it unless
    /// the trainer overlaps it; see the module doc): the part in
    /// `step_s`.
    pub dp_exposed_s: f64,
    /// Optimizer offload ([`Choice::offload`]): the PCIe copies of the
    /// shard and the CPU update, all in `step_s` ([`super::offload`]).
    pub offload_s: f64,
    /// The whole step.
    pub step_s: f64,
    /// Global batch tokens over the step time.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation (PaLM's MFU, Chowdhery et al. 2022, App. B):
    /// model FLOPs, no recomputation, per second over the peak of every GPU.
    pub mfu: f64,
    /// Hardware FLOPs utilisation (PaLM's HFU): the FLOPs done, recomputed
    /// forwards included, per second over the peak of every GPU. Equal to
    /// `mfu` without recomputation. The trainer's `mfu` and `hfu` in
    /// `metrics.jsonl` are the same two ratios.
    pub hfu: f64,
    /// The bubble's share of the pipeline time, `(p-1)/(v m)`.
    pub bubble_fraction: f64,
    /// An estimate, not a measurement: every GPU at its board power (TDP)
    /// for the step, joules.
    pub energy_estimate_j: f64,
}

/// The link a group of `size` ranks with rank stride `stride` runs on: the
/// node's when the `stride x size` consecutive ranks it spans tile the
/// nodes (a group of 6 on 8-GPU nodes straddles two).
fn group_link(input: &PlanInput, stride: usize, size: usize) -> &Link {
    let span = stride * size;
    if size == 1 || (span <= input.gpus_per_node && input.gpus_per_node.is_multiple_of(span)) {
        &input.intra
    } else {
        &input.inter
    }
}

/// FLOPs of one token in one block, forward, backward and what `c`
/// recomputes.
pub fn block_flops(input: &PlanInput, c: &Choice) -> f64 {
    let m = &input.model;
    let (s, h) = (input.seq as f64, m.hidden as f64);
    m.block_flops_per_token(input.seq)
        + c.recompute
            .extra_flops_per_token(m.block_matmul_params(), s, h)
}

/// The parameter values one pipeline stage holds (this TP rank's part).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageParams {
    /// Blocks of the stage (all of its chunks).
    pub blocks: usize,
    /// Every parameter value the stage holds, a tied embedding's copy
    /// included.
    pub elems: usize,
    /// Of `elems`, the tied embedding's on the first and the last stage of
    /// a pipeline: the trainer sets their gradients aside during the
    /// schedule and sums them over the two stages once per step, so ZeRO-2
    /// reduce-scatters them once per step, not per micro-batch.
    pub once_per_step: usize,
}

/// Time of one step of `c` whose stages hold `stages` (first to last, the
/// head on the last), with `micro_batches` micro-batches per DP rank.
///
/// Each stage's slot (the time of one micro-batch's forward and backward)
/// is its compute, its TP collectives, its ring transfers, the pipeline
/// sends and, under
/// ZeRO-2, the reduce-scatter of the gradients of that backward (`v` of
/// them, one per chunk, with `v` interleaved chunks): the trainer runs it
/// inside each backward, before the stage moves on, so it lengthens every
/// slot and the bubble with it. The slowest stage's slot sets the pace.
pub fn step_time(
    input: &PlanInput,
    c: &Choice,
    stages: &[StageParams],
    micro_batches: usize,
) -> TimeEstimate {
    let m = &input.model;
    // This rank's tokens of each sequence (all of them without CP).
    let (s, b) = (input.seq as f64 / c.cp as f64, c.micro_batch as f64);
    let h = m.hidden as f64;
    let e = input.precision.activation_bytes() as f64;
    let per_block = block_flops(input, c);
    let peak = input.peak_flops();

    let tp_link = group_link(input, 1, c.tp);
    let act_bytes = b * s * h * e;
    let per_collective = if c.sp {
        2.0 * all_gather(act_bytes, c.tp, tp_link)
    } else {
        all_reduce(act_bytes, c.tp, tp_link)
    };
    let collectives = if c.recompute == Recompute::Full {
        6.0
    } else {
        4.0
    };

    // The ring's exposed transfers of one micro-batch through one block.
    let ring_block = ring_exposed_s(input, c, group_link(input, c.tp, c.cp));

    let pp_link = group_link(input, c.tp * c.cp * c.dp, c.pp);
    let pp_mb = if c.pp > 1 {
        let bytes = act_bytes / if c.sp { c.tp as f64 } else { 1.0 };
        2.0 * p2p(bytes, pp_link) * c.interleave as f64
    } else {
        0.0
    };

    // The gradient group, DP x CP (its ranks `tp` apart).
    let grad_ranks = c.dp * c.cp;
    let dp_link = group_link(input, c.tp, grad_ranks);
    let (bp, bg, _) = input.precision.state_bytes();
    let chunks = c.interleave as f64;
    // One stage's slot by part: [compute, TP collectives, the ring,
    // ZeRO-2's reduce-scatters], seconds per micro-batch.
    let slot = |i: usize, st: &StageParams| -> [f64; 4] {
        let head = if i + 1 == stages.len() {
            m.head_flops_per_token()
        } else {
            0.0
        };
        let flops = b * s * (st.blocks as f64 * per_block + head);
        let compute = flops / c.tp as f64 / (peak * input.efficiency);
        let tp = st.blocks as f64 * collectives * per_collective;
        let ring = st.blocks as f64 * ring_block;
        let rs = if c.zero == ZeroStage::Two {
            let grads = (bg * (st.elems - st.once_per_step)) as f64;
            chunks * all_gather(grads / chunks, grad_ranks, dp_link)
        } else {
            0.0
        };
        [compute, tp, ring, rs]
    };
    let [compute_mb, tp_mb, ring_mb, rs_mb] = stages
        .iter()
        .enumerate()
        .map(|(i, st)| slot(i, st))
        .max_by(|x, y| {
            let total = |t: &[f64; 4]| t.iter().sum::<f64>();
            total(x).partial_cmp(&total(y)).expect("times are finite")
        })
        .expect("at least one stage");
    let mb = micro_batches as f64;
    let stage_time = compute_mb + tp_mb + ring_mb + pp_mb + rs_mb;
    let bubble_steps = (c.pp - 1) as f64 / c.interleave as f64;

    // Data-parallel collectives outside the schedule, of the stage that
    // needs longest.
    let outside = |st: &StageParams| -> f64 {
        let grads = (bg * st.elems) as f64;
        let params = (bp * st.elems) as f64;
        let k = grad_ranks;
        match c.zero {
            ZeroStage::Off => all_reduce(grads, k, dp_link),
            ZeroStage::One => all_reduce(grads, k, dp_link) + all_gather(params, k, dp_link),
            ZeroStage::Two => {
                let tied = if st.once_per_step > 0 {
                    all_gather((bg * st.once_per_step) as f64, k, dp_link)
                } else {
                    0.0
                };
                tied + all_gather(params, k, dp_link)
            }
            ZeroStage::Three => {
                mb * (2.0 * all_gather(params, k, dp_link) + all_gather(grads, k, dp_link))
            }
        }
    };
    let dp_outside = stages.iter().map(outside).fold(0.0, f64::max);
    let dp_comm = mb * rs_mb + dp_outside;
    let overlapped =
        overlaps(input, c).then(|| dp_exposed(input, c, &stages[0], micro_batches, compute_mb));
    let offload = if c.offload {
        // The fullest stage's shard over the DP x CP group.
        let shard = stages.iter().map(|st| st.elems).max().unwrap_or(0);
        offload_time_s(
            shard.div_ceil(grad_ranks),
            input.precision,
            input.device.name,
        )
    } else {
        0.0
    };
    let (step, exposed_s) = match overlapped {
        Some(part) => (mb * (compute_mb + tp_mb + pp_mb) + part + offload, part),
        None => (
            (mb + bubble_steps) * stage_time + dp_outside + offload,
            dp_comm,
        ),
    };
    let tokens = (input.global_batch * input.seq) as f64;
    let gpus = (c.dp * c.cp * c.tp * c.pp) as f64;
    let model_flops = m.train_flops_per_token(input.seq) * tokens;
    let hardware_flops = (m.train_flops_per_token(input.seq)
        + m.layers as f64 * (per_block - m.block_flops_per_token(input.seq)))
        * tokens;
    TimeEstimate {
        compute_s: mb * compute_mb,
        tp_comm_s: mb * tp_mb,
        cp_comm_s: mb * ring_mb,
        pp_comm_s: mb * pp_mb,
        bubble_s: bubble_steps * stage_time,
        dp_comm_s: dp_comm,
        dp_exposed_s: exposed_s,
        offload_s: offload,
        step_s: step,
        tokens_per_s: tokens / step,
        mfu: model_flops / step / (gpus * peak),
        hfu: hardware_flops / step / (gpus * peak),
        bubble_fraction: bubble_steps / mb,
        energy_estimate_j: input.device.tdp_w * gpus * step,
    }
}

/// Whether the trainer overlaps the DP collectives of `c` with compute:
/// asked to (`overlap_grad_reduce`), and the DP group, of more than one
/// rank, is the only group of more than one (the rule of
/// `crate::train::step`).
pub fn overlaps(input: &PlanInput, c: &Choice) -> bool {
    input.overlap_grad_reduce && c.tp == 1 && c.cp == 1 && c.pp == 1 && c.dp > 1
}

/// The exposed DP communication of `c` (one stage `st`, no TP, no
/// pipeline) with `micro_batches` micro-batches of `compute_mb` seconds
/// each, where the trainer overlaps it: each collective of the step as
/// [`step_time`] prices it over the whole stage, cut into the units' shares
/// by their values, replayed by [`exposed`].
fn dp_exposed(
    input: &PlanInput,
    c: &Choice,
    st: &StageParams,
    micro_batches: usize,
    compute_mb: f64,
) -> f64 {
    let m = &input.model;
    let link = group_link(input, 1, c.dp);
    let (bp, bg, _) = input.precision.state_bytes();
    let elems = st.elems as f64;
    let block = m.block_tensors(1).iter().sum::<usize>() as f64;
    let share = block / elems;
    let ends = (elems - st.blocks as f64 * block) / elems;
    let grads = (bg * st.elems) as f64;
    let params = (bp * st.elems) as f64;
    let reduce = match c.zero {
        ZeroStage::Off | ZeroStage::One => all_reduce(grads, c.dp, link),
        ZeroStage::Two | ZeroStage::Three => all_gather(grads, c.dp, link),
    };
    let gather = if c.zero == ZeroStage::Three {
        all_gather(params, c.dp, link)
    } else {
        0.0
    };
    let after = match c.zero {
        ZeroStage::One | ZeroStage::Two => all_gather(params, c.dp, link),
        _ => 0.0,
    };
    // Compute of one micro-batch by part: a block's forward is a third of
    // its FLOPs without recomputation, the rest its backward.
    let per_block = block_flops(input, c);
    let forward = m.block_flops_per_token(input.seq) / 3.0 / per_block;
    let (b, s) = (c.micro_batch as f64, input.seq as f64);
    let block_s = b * s * per_block / (input.peak_flops() * input.efficiency);
    let blocks_s = st.blocks as f64 * block_s;
    exposed(&OverlapInput {
        zero: c.zero,
        blocks: st.blocks,
        micro_batches,
        unit_by_unit: c.zero == ZeroStage::Three || c.recompute == Recompute::Full,
        prefetch: input.zero3_prefetch,
        block_forward_s: forward * block_s,
        block_backward_s: (1.0 - forward) * block_s,
        head_s: compute_mb - blocks_s,
        block_reduce_s: share * reduce,
        ends_reduce_s: ends * reduce,
        block_gather_s: share * gather,
        ends_gather_s: 2.0 * ends * gather,
        after_s: after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixture::small_gpt;

    /// The fixture's 4-block GPT of hidden 64 on 4 CPU ranks of one node,
    /// f32, 8 sequences of 32 tokens per step, ZeRO-2.
    fn input() -> PlanInput {
        PlanInput {
            zero_stages: vec![ZeroStage::Two],
            ..small_gpt(4, 32)
        }
    }

    /// DDP on 2 ranks, full recomputation, one micro-batch of 4 sequences,
    /// with and without overlap. Each block's all-reduce (~50 000 values:
    /// 0.22 ms) outlasts a block's backward (0.08 ms), so once the last
    /// block's reduction starts the communication thread never idles:
    /// what compute hides is the backward of the other 3 blocks.
    #[test]
    fn ddp_overlap_hides_the_backward_of_all_blocks_but_the_last() {
        let mut input = input();
        let c = Choice {
            dp: 2,
            tp: 1,
            cp: 1,
            pp: 1,
            sp: false,
            zero: ZeroStage::Off,
            micro_batch: 4,
            recompute: Recompute::Full,
            interleave: 1,
            offload: false,
        };
        // 4 blocks of about 50 000 values and made-up ends of the rest.
        let stages = [StageParams {
            blocks: 4,
            elems: 300_000,
            once_per_step: 0,
        }];
        let off = step_time(&input, &c, &stages, 1);
        assert_eq!(off.dp_exposed_s, off.dp_comm_s);
        let parts = off.compute_s + off.tp_comm_s + off.pp_comm_s + off.bubble_s + off.dp_comm_s;
        assert!((parts / off.step_s - 1.0).abs() < 1e-12);
        input.overlap_grad_reduce = true;
        let on = step_time(&input, &c, &stages, 1);
        assert_eq!(on.dp_comm_s, off.dp_comm_s);
        assert_eq!(on.compute_s, off.compute_s);
        let (h, s, b) = (64.0, 32.0, 4.0);
        // A block's backward with its recomputation: the FLOPs of forward
        // and backward without recomputation.
        let backward = b * s * (6.0 * (12.0 * h * h) + 12.0 * s * h) / (0.5 * 1e12);
        let want = off.dp_comm_s - 3.0 * backward;
        assert!(
            (on.dp_exposed_s / want - 1.0).abs() < 1e-9,
            "{} vs {want}",
            on.dp_exposed_s
        );
        assert!(((on.compute_s + want) / on.step_s - 1.0).abs() < 1e-9);
    }

    /// Where the trainer does not overlap (TP, CP, a pipeline, one DP rank)
    /// the estimate is the one without overlap.
    #[test]
    fn nothing_overlaps_beside_other_groups() {
        let mut input = input();
        let c = Choice {
            dp: 2,
            tp: 2,
            cp: 1,
            pp: 1,
            sp: false,
            zero: ZeroStage::Three,
            micro_batch: 4,
            recompute: Recompute::Full,
            interleave: 1,
            offload: false,
        };
        let stages = [StageParams {
            blocks: 4,
            elems: 150_000,
            once_per_step: 0,
        }];
        let off = step_time(&input, &c, &stages, 1);
        let ring = Choice { tp: 1, cp: 2, ..c };
        let ring_off = step_time(&input, &ring, &stages, 1);
        input.overlap_grad_reduce = true;
        assert_eq!(step_time(&input, &c, &stages, 1), off);
        assert_eq!(step_time(&input, &ring, &stages, 1), ring_off);
        let dp2 = Choice { tp: 1, ..c };
        let on = step_time(&input, &dp2, &stages, 1);
        input.overlap_grad_reduce = false;
        let off = step_time(&input, &dp2, &stages, 1);
        assert!(on.dp_exposed_s < off.dp_exposed_s && on.step_s < off.step_s);
        assert_eq!(on.dp_comm_s, off.dp_comm_s);
    }

    /// ZeRO-2 on a pipeline of 2 stages over 2 DP ranks, 4 micro-batches
    /// of 1 sequence each, against the step written out by hand: each
    /// slot is one micro-batch's compute, its two pipeline sends and the
    /// reduce-scatter of its gradients (one per chunk), the step is
    /// `m + (p-1)/v` slots of the slower stage, and after the schedule the
    /// tied embedding's gradients are reduce-scattered and the parameters
    /// all-gathered.
    #[test]
    fn zero_2_on_a_pipeline_reduce_scatters_inside_every_slot() {
        let input = input();
        let (alpha, bw) = (1e-5, 1e9);
        // Both stages hold 2 blocks; made-up sizes: the first 70 000
        // values, 10 000 of them tied, the last 60 000 with the same
        // 10 000 tied. The first stage's larger reduce-scatter does not
        // outweigh the last stage's head.
        let stages = [
            StageParams {
                blocks: 2,
                elems: 70_000,
                once_per_step: 10_000,
            },
            StageParams {
                blocks: 2,
                elems: 60_000,
                once_per_step: 10_000,
            },
        ];
        let (h, v, s) = (64.0, 1000.0, 32.0);
        let block = 6.0 * (12.0 * h * h) + 12.0 * s * h;
        let head = 6.0 * h * v;
        // Halving: a 2-rank reduce-scatter or all-gather moves half the
        // buffer and pays one start-up.
        let half = |bytes: f64| 0.5 * bytes / bw + alpha;
        for chunks in [1usize, 2] {
            let c = Choice {
                dp: 2,
                tp: 1,
                cp: 1,
                pp: 2,
                sp: false,
                zero: ZeroStage::Two,
                micro_batch: 1,
                recompute: Recompute::None,
                interleave: chunks,
                offload: false,
            };
            let t = step_time(&input, &c, &stages, 4);
            let v_ = chunks as f64;
            let compute = |blocks: f64, head: f64| s * (blocks * block + head) / (0.5 * 1e12);
            let sends = v_ * 2.0 * (alpha + s * h * 4.0 / bw);
            let rs = |values: f64| v_ * half(4.0 * values / v_);
            let first = compute(2.0, 0.0) + sends + rs(60_000.0);
            let last = compute(2.0, head) + sends + rs(50_000.0);
            assert!(
                last > first,
                "the head's stage is the slower: {last} vs {first}"
            );
            let after = (half(4.0 * 10_000.0) + half(4.0 * 70_000.0))
                .max(half(4.0 * 10_000.0) + half(4.0 * 60_000.0));
            let want = (4.0 + 1.0 / v_) * last + after;
            assert!(
                (t.step_s / want - 1.0).abs() < 1e-12,
                "v={chunks}: {} vs {want}",
                t.step_s
            );
            assert!((t.bubble_s - last / v_).abs() < 1e-15);
            assert!((t.dp_comm_s - (4.0 * rs(50_000.0) + after)).abs() < 1e-15);
            let parts =
                t.compute_s + t.tp_comm_s + t.cp_comm_s + t.pp_comm_s + t.bubble_s + t.dp_comm_s;
            assert!((parts / t.step_s - 1.0).abs() < 1e-12);
        }
    }
}
