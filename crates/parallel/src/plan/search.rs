//! Enumerating the layouts, keeping those that fit, ranking them.
//!
//! A layout is tried when its degrees divide the GPU count, `tp` divides
//! the heads, key/value heads and MLP width, `pp` is at most the layer
//! count, `dp` divides the global batch and the micro-batch divides each
//! DP rank's share. ZeRO stages 1 to 3 need `dp` above 1. ZeRO-3 is not
//! combined with a pipeline (Ferrotron refuses it, as DeepSpeed: its
//! units are the whole model's); ZeRO-2 is, as Ferrotron runs it (each
//! stage reduce-scatters its gradients after every micro-batch's
//! backward, which DeepSpeed refuses and [`super::time`] prices).
//! Interleaving needs the micro-batches to be a multiple of `pp` and each
//! stage's layers to split into the chunks (Megatron's conditions).

use serde::Serialize;

use super::estimate::{estimate, Estimate};
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
        for pp in divisors(input.gpus / tp)
            .into_iter()
            .filter(|&p| p <= m.layers)
        {
            let dp = input.gpus / (tp * pp);
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
                    ZeroStage::One | ZeroStage::Two => dp > 1,
                    ZeroStage::Three => dp > 1 && pp == 1,
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
                    let sps = [false, true]
                        .into_iter()
                        .filter(|&s| !s || (tp > 1 && input.sequence_parallel));
                    for sp in sps {
                        for &zero in &stages {
                            for &recompute in &input.recompute {
                                out.push(Choice {
                                    dp,
                                    tp,
                                    pp,
                                    sp,
                                    zero,
                                    micro_batch,
                                    recompute,
                                    interleave,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Estimates every choice of [`choices`], keeps those whose memory fits
/// the device and ranks them by step time, and lists the faster choices
/// that do not fit (see [`Plan::rejected`]).
pub fn plan(input: &PlanInput) -> Plan {
    let mut feasible = Vec::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    for c in choices(input) {
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
