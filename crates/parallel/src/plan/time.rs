//! Time of one optimizer step: compute from FLOPs, tensor-parallel and
//! pipeline communication per micro-batch, the pipeline bubble, and the
//! data-parallel gradient synchronisation, none of it overlapped.
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
//!   forward and backward.
//!
//! Groups are placed in Megatron's rank order (TP innermost, then DP, then
//! PP): a group stays within a node when the consecutive ranks it spans
//! divide `gpus_per_node`, and otherwise runs at the inter-node link's
//! speed.

use serde::Serialize;

use super::activation::Recompute;
use super::comm::{all_gather, all_reduce, p2p};
use super::link::Link;
use super::{Choice, PlanInput};
use crate::zero::ZeroStage;

/// Time of one optimizer step, seconds, by part, and what follows from it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TimeEstimate {
    /// Compute of the `m` micro-batches on the slowest stage.
    pub compute_s: f64,
    /// Tensor-parallel collectives.
    pub tp_comm_s: f64,
    /// Pipeline sends and receives.
    pub pp_comm_s: f64,
    /// The pipeline bubble (idle stage time).
    pub bubble_s: f64,
    /// Data-parallel gradient and parameter collectives.
    pub dp_comm_s: f64,
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

/// Time of one step of `c` whose stages hold `split` blocks (first to
/// last, the head on the last) and at most `stage_elems` parameter values,
/// with `micro_batches` micro-batches per DP rank.
pub fn step_time(
    input: &PlanInput,
    c: &Choice,
    split: &[usize],
    stage_elems: usize,
    micro_batches: usize,
) -> TimeEstimate {
    let m = &input.model;
    let (s, b) = (input.seq as f64, c.micro_batch as f64);
    let h = m.hidden as f64;
    let e = input.precision.activation_bytes() as f64;
    let per_block = block_flops(input, c);
    // The slowest stage: its blocks, and the head on the last.
    let (blocks, stage_flops_per_token) = split
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let head = if i + 1 == split.len() {
                m.head_flops_per_token()
            } else {
                0.0
            };
            (n as f64, n as f64 * per_block + head)
        })
        .max_by(|x, y| x.1.partial_cmp(&y.1).expect("FLOPs are finite"))
        .expect("at least one stage");
    let stage_flops = b * s * stage_flops_per_token;
    let peak = input.peak_flops();
    let compute_mb = stage_flops / c.tp as f64 / (peak * input.efficiency);

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
    let tp_mb = blocks * collectives * per_collective;

    let pp_link = group_link(input, c.tp * c.dp, c.pp);
    let pp_mb = if c.pp > 1 {
        let bytes = act_bytes / if c.sp { c.tp as f64 } else { 1.0 };
        2.0 * p2p(bytes, pp_link) * c.interleave as f64
    } else {
        0.0
    };
    let mb = micro_batches as f64;
    let stage_time = compute_mb + tp_mb + pp_mb;
    let bubble_steps = (c.pp - 1) as f64 / c.interleave as f64;

    let dp_link = group_link(input, c.tp, c.dp);
    let (bp, bg, _) = input.precision.state_bytes();
    let grads = (bg * stage_elems) as f64;
    let params = (bp * stage_elems) as f64;
    let dp_comm = match c.zero {
        ZeroStage::Off => all_reduce(grads, c.dp, dp_link),
        ZeroStage::One => all_reduce(grads, c.dp, dp_link) + all_gather(params, c.dp, dp_link),
        ZeroStage::Two => mb * all_gather(grads, c.dp, dp_link) + all_gather(params, c.dp, dp_link),
        ZeroStage::Three => {
            mb * (2.0 * all_gather(params, c.dp, dp_link) + all_gather(grads, c.dp, dp_link))
        }
    };
    let step = (mb + bubble_steps) * stage_time + dp_comm;
    let tokens = (input.global_batch * input.seq) as f64;
    let gpus = (c.dp * c.tp * c.pp) as f64;
    let model_flops = m.train_flops_per_token(input.seq) * tokens;
    let hardware_flops = (m.train_flops_per_token(input.seq)
        + m.layers as f64 * (per_block - m.block_flops_per_token(input.seq)))
        * tokens;
    TimeEstimate {
        compute_s: mb * compute_mb,
        tp_comm_s: mb * tp_mb,
        pp_comm_s: mb * pp_mb,
        bubble_s: bubble_steps * stage_time,
        dp_comm_s: dp_comm,
        step_s: step,
        tokens_per_s: tokens / step,
        mfu: model_flops / step / (gpus * peak),
        hfu: hardware_flops / step / (gpus * peak),
        bubble_fraction: bubble_steps / mb,
        energy_estimate_j: input.device.tdp_w * gpus * step,
    }
}
