//! Enumerating the layouts, keeping those that fit, ranking them.
//!
//! A layout is tried when its degrees divide the GPU count, `tp` divides
//! the heads, key/value heads and MLP width, `2 x cp` divides the
//! sequence (the ring's chunks; under sequence parallelism `tp` also
//! divides each rank's `seq / cp` tokens), `pp` is at most the layer
//! count, `dp` divides the global batch and the micro-batch divides each
//! DP rank's share. ZeRO stages 1 to 3 need `dp x cp` above 1 (they shard
//! over DP x CP, as the trainer does). ZeRO-3 is not
//! combined with a pipeline (Ferrotron refuses it, as DeepSpeed: its
//! units are the whole model's); ZeRO-2 is, as Ferrotron runs it (each
//! stage reduce-scatters its gradients after every micro-batch's
//! backward, which DeepSpeed refuses and [`super::time`] prices).
//! Interleaving needs the micro-batches to be a multiple of `pp` and each
//! stage's layers to split into the chunks (Megatron's conditions).
//!
//! Optimizer offload ([`super::offload`]) is proposed only when no layout
//! fits without it, on a GPU whose host link the planner knows: then every
//! layout with ZeRO 1 to 3 is tried again with its optimizer state on the
//! host, as DeepSpeed's ZeRO-Offload is a remedy for a model that does not
//! fit, at the price of PCIe traffic and CPU time.

use serde::Serialize;

use super::estimate::{estimate, Estimate};
use super::offload::host_link_bandwidth;
use super::{Choice, PlanInput};
use crate::zero::ZeroStage;

/// A choice that does not fit, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rejected {
    /// Why it was rejected (`needs 91.2 GiB > 80.0 GiB`).
    pub reason: String,
    /// What it would cost.
    pub estimate: Estimate,
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// Layouts that fit, fastest first.
    pub feasible: Vec<Estimate>,
    /// Choices faster than the best that fits, fastest first, one per
    /// `(dp, tp, pp, ZeRO stage)`: the one of them needing least memory.
    pub rejected: Vec<Rejected>,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn divisors(n: usize) -> Vec<usize> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Every layout tried for `input` (see the module doc).
pub fn choices(input: &PlanInput) -> Vec<Choice> {
    let m = &input.model;
    let mut out = Vec::new();
    for tp in divisors(input.gpus) {
        let shards = |n: usize| n.is_multiple_of(tp);
        if !(shards(m.heads) && shards(m.kv_heads) && shards(m.ffn)) {
            continue;
        }
        for cp in ring_degrees(input, tp) {
            layouts_with(input, tp, cp, &mut out);
        }
    }
    out
}

/// The context-parallel degrees tried with `tp`: 1, and with
/// [`PlanInput::context_parallel`] every `cp` above 1 dividing the GPUs
/// left whose `2 x cp` chunks split the sequence.
fn ring_degrees(input: &PlanInput, tp: usize) -> Vec<usize> {
    divisors(input.gpus / tp)
        .into_iter()
        .filter(|&cp| cp == 1 || (input.context_parallel && input.seq.is_multiple_of(2 * cp)))
        .collect()
}

/// Every choice of [`choices`] with degrees `tp` and `cp`, pushed to `out`.
fn layouts_with(input: &PlanInput, tp: usize, cp: usize, out: &mut Vec<Choice>) {
    let m = &input.model;
    for pp in divisors(input.gpus / (tp * cp))
        .into_iter()
        .filter(|&p| p <= m.layers)
    {
        let dp = input.gpus / (tp * cp * pp);
        if !input.global_batch.is_multiple_of(dp) {
            continue;
        }
        let per_rank = input.global_batch / dp;
        let stages: Vec<ZeroStage> = input
            .zero_stages
            .iter()
            .copied()
            .filter(|&z| match z {
                ZeroStage::Off => true,
                ZeroStage::One | ZeroStage::Two => dp * cp > 1,
                ZeroStage::Three => dp * cp > 1 && pp == 1,
            })
            .collect();
        let mbs = divisors(per_rank)
            .into_iter()
            .filter(|&b| b <= input.max_micro_batch);
        for micro_batch in mbs {
            let m_count = per_rank / micro_batch;
            let mut chunks = vec![1];
            if pp > 1 && m_count.is_multiple_of(pp) {
                chunks.extend(
                    [2, 4]
                        .into_iter()
                        .filter(|v| m.layers.is_multiple_of(pp * v)),
                );
            }
            for &interleave in &chunks {
                // Under SP the sequence, and each rank's `seq / cp` tokens
                // of it, split over tp (as `train` requires).
                let sp_fits = input.seq.is_multiple_of(tp) && (input.seq / cp).is_multiple_of(tp);
                let sps = [false, true]
                    .into_iter()
                    .filter(|&s| !s || (tp > 1 && input.sequence_parallel && sp_fits));
                for sp in sps {
                    for &zero in &stages {
                        for &recompute in &input.recompute {
                            out.push(Choice {
                                dp,
                                tp,
                                cp,
                                pp,
                                sp,
                                zero,
                                micro_batch,
                                recompute,
                                interleave,
                                offload: false,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// The choices of [`choices`] with ZeRO 1 to 3, their optimizer offloaded,
/// where the device's host link is known ([`host_link_bandwidth`]).
pub fn offload_choices(input: &PlanInput) -> Vec<Choice> {
    if host_link_bandwidth(input.device.name).is_none() {
        return Vec::new();
    }
    choices(input)
        .into_iter()
        .filter(|c| c.zero != ZeroStage::Off)
        .map(|c| Choice { offload: true, ..c })
        .collect()
}

/// Estimates `tried`, pushing each to `feasible` when its memory fits
/// the device, else to `rejected` with the reason.
fn sort_fits(
    input: &PlanInput,
    tried: Vec<Choice>,
    feasible: &mut Vec<Estimate>,
    rejected: &mut Vec<Rejected>,
) {
    for c in tried {
        let e = estimate(input, &c);
        let need = e.memory.total();
        if need <= input.device.memory_bytes {
            feasible.push(e);
        } else {
            rejected.push(Rejected {
                reason: format!(
                    "needs {:.1} GiB > {:.1} GiB",
                    need / GIB,
                    input.device.memory_bytes / GIB
                ),
                estimate: e,
            });
        }
    }
}

/// Estimates every choice of [`choices`], keeps those whose memory fits
/// the device and ranks them by step time, and lists the faster choices
/// that do not fit (see [`Plan::rejected`]). When none fits, the choices
/// of [`offload_choices`] are tried too.
pub fn plan(input: &PlanInput) -> Plan {
    let mut feasible = Vec::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    sort_fits(input, choices(input), &mut feasible, &mut rejected);
    if feasible.is_empty() {
        sort_fits(input, offload_choices(input), &mut feasible, &mut rejected);
    }
    let key = |e: &Estimate| (e.time.step_s, e.memory.total());
    feasible.sort_by(|a, b| key(a).partial_cmp(&key(b)).expect("times are finite"));
    rejected.sort_by(|a, b| {
        key(&a.estimate)
            .partial_cmp(&key(&b.estimate))
            .expect("times are finite")
    });
    let layout = |e: &Estimate| (e.choice.dp, e.choice.tp, e.choice.pp, e.choice.zero);
    let best = feasible.first().map_or(f64::INFINITY, |e| e.time.step_s);
    let mut shown: Vec<Rejected> = Vec::new();
    for r in rejected
        .into_iter()
        .filter(|r| r.estimate.time.step_s < best)
    {
        let l = layout(&r.estimate);
        match shown.iter_mut().find(|s| layout(&s.estimate) == l) {
            Some(s) if r.estimate.memory.total() < s.estimate.memory.total() => *s = r,
            Some(_) => {}
            None => shown.push(r),
        }
    }
    Plan {
        feasible,
        rejected: shown,
    }
}

impl Plan {
    /// The distinct `(dp, tp, pp)` layouts in the order of their best
    /// feasible choice.
    pub fn layouts(&self) -> Vec<(usize, usize, usize)> {
        let mut seen = Vec::new();
        for e in &self.feasible {
            let l = (e.choice.dp, e.choice.tp, e.choice.pp);
            if !seen.contains(&l) {
                seen.push(l);
            }
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use ferrotron_engine::metrics::device_spec;

    use super::*;
    use crate::plan::link::default_links;
    use crate::plan::{ActivationModel, ModelShape, Precision, Recompute};

    /// A Llama-style model of 0.17 B parameters (8 blocks of width 1024,
    /// 8 heads, so tp at most 8) on the 8 H100s of one node, 8 sequences
    /// of `seq` tokens per step, bf16, every ZeRO stage and recomputation.
    fn input(seq: usize) -> PlanInput {
        let (intra, inter) = default_links("h100-80gb").unwrap();
        PlanInput {
            model: ModelShape {
                vocab: 32_000,
                hidden: 1024,
                layers: 8,
                heads: 8,
                kv_heads: 8,
                ffn: 2816,
                learned_positions: None,
                layer_norm: false,
                bias: false,
                gated_mlp: true,
                tied_head: false,
                embed_norm: false,
            },
            gpus: 8,
            gpus_per_node: 8,
            device: device_spec("h100-80gb").unwrap(),
            intra,
            inter,
            global_batch: 8,
            seq,
            precision: Precision::Bf16,
            efficiency: 0.5,
            reserve_bytes: 2.0 * GIB,
            bucket_mb: 25.0,
            dropout: false,
            fp32_main_grads: false,
            max_micro_batch: 4,
            zero_stages: vec![
                ZeroStage::Off,
                ZeroStage::One,
                ZeroStage::Two,
                ZeroStage::Three,
            ],
            recompute: Recompute::ALL.to_vec(),
            sequence_parallel: true,
            context_parallel: true,
            activations: ActivationModel::Korthikanti,
            chunked_head: true,
            overlap_grad_reduce: false,
            zero3_prefetch: 1,
        }
    }

    /// At 2M tokens no layout without a ring fits (tp8 + SP keeps 14 GB
    /// of activations per block, and full recomputation rebuilds the
    /// scores, which a ring never holds), so every plan splits the
    /// sequence; at 4k tokens data parallelism fits, and a ring (the same
    /// compute and gradient sync) only adds its transfers.
    #[test]
    fn long_sequences_get_a_ring_and_short_ones_do_not() {
        let long = plan(&input(1 << 21));
        assert!(!long.feasible.is_empty(), "nothing fits at 2M tokens");
        assert!(
            long.feasible.iter().all(|e| e.choice.cp > 1),
            "a layout without a ring fits: {}",
            long.feasible
                .iter()
                .find(|e| e.choice.cp == 1)
                .unwrap()
                .label
        );
        let short = plan(&input(4096));
        let best = &short.feasible[0];
        assert_eq!(best.choice.cp, 1, "{}", best.label);
        assert!(short.feasible.iter().any(|e| e.choice.cp > 1));
        let no_ring = PlanInput {
            context_parallel: false,
            ..input(1 << 21)
        };
        assert!(choices(&no_ring).iter().all(|c| c.cp == 1));
    }

    /// Sequence parallelism is proposed only where `train` runs it: the
    /// sequence must split over tp.
    #[test]
    fn sequence_parallelism_needs_a_sequence_tp_divides() {
        let odd = PlanInput {
            context_parallel: false,
            ..input(4097)
        };
        let all = choices(&odd);
        assert!(all.iter().any(|c| c.tp > 1));
        assert!(all.iter().all(|c| !c.sp), "SP proposed at seq 4097");
        assert!(choices(&input(4096)).iter().any(|c| c.sp));
    }

    /// Offload is proposed only when no layout fits without it: with the
    /// H100's 80 GB nothing is offloaded; with a memory between the least
    /// any layout needs without offload and the least with it, every
    /// feasible layout offloads, keeps its shard's state on the host, and
    /// pays PCIe and CPU time; a device whose host link is unknown gets
    /// no offload.
    #[test]
    fn offload_is_proposed_only_when_nothing_fits_without_it() {
        let roomy = plan(&input(4096));
        assert!(!roomy.feasible.is_empty());
        assert!(roomy.feasible.iter().all(|e| !e.choice.offload));
        let least = |cs: Vec<Choice>, i: &PlanInput| {
            cs.iter()
                .map(|c| estimate(i, c).memory.total())
                .fold(f64::INFINITY, f64::min)
        };
        let base = input(4096);
        let (without, with) = (
            least(choices(&base), &base),
            least(offload_choices(&base), &base),
        );
        assert!(with < without, "{with} vs {without}");
        let mut tight = input(4096);
        tight.device.memory_bytes = (with + without) / 2.0;
        let p = plan(&tight);
        assert!(!p.feasible.is_empty(), "nothing fits with offload");
        let mut one_stage = 0;
        for e in &p.feasible {
            assert!(
                e.choice.offload && e.choice.zero != ZeroStage::Off,
                "{}",
                e.label
            );
            assert!(e.label.ends_with("-offload"), "{}", e.label);
            assert!(
                e.memory.host_offload > 0.0 && e.time.offload_s > 0.0,
                "{}",
                e.label
            );
            let plain = estimate(
                &tight,
                &Choice {
                    offload: false,
                    ..e.choice
                },
            );
            // The step gains the offload time; the device state drops by
            // the host bytes (bf16 ZeRO-3 also by its bf16 pieces: the
            // host's f32 master replaces them), on one stage (with a
            // pipeline the fuller stage may change).
            let slower = e.time.step_s - plain.time.step_s;
            assert!((slower - e.time.offload_s).abs() < 1e-9, "{}", e.label);
            if e.choice.pp > 1 {
                continue;
            }
            let drop = plain.memory.total() - e.memory.total();
            let pieces = if e.choice.zero == ZeroStage::Three {
                e.memory.host_offload / 6.0
            } else {
                0.0
            };
            let want = e.memory.host_offload + pieces;
            assert!((drop - want).abs() < 1.0, "{}: {drop} vs {want}", e.label);
            one_stage += 1;
        }
        assert!(one_stage > 0, "no feasible layout without a pipeline");
        tight.device.name = "cpu-test";
        assert!(plan(&tight).feasible.is_empty());
    }
}
