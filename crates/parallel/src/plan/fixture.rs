//! The planner's unit tests' input: a small GPT on a made-up device and
//! links whose figures the tests' hand computations use.

use ferrotron_engine::metrics::DeviceSpec;

use super::activation::Recompute;
use super::link::Link;
use super::{ActivationModel, ModelShape, PlanInput, Precision};
use crate::zero::ZeroStage;

/// A GPT of vocabulary 1000, hidden 64, 4 heads (4 KV heads) and 4 blocks
/// at `seq` tokens on `gpus` ranks of one node; a device of 1 TFLOP/s (f32
/// and bf16) at efficiency 0.5, links of 1 GB/s and 10 us; 8 sequences per
/// step in f32, without ZeRO, recomputation, SP or CP, nothing overlapped.
/// Tests change what they vary with struct update syntax.
pub(crate) fn small_gpt(gpus: usize, seq: usize) -> PlanInput {
    let link = Link {
        name: "test",
        bandwidth: 1e9,
        latency: 1e-5,
    };
    PlanInput {
        model: ModelShape::gpt(1000, 64, 4, 4, seq),
        gpus,
        gpus_per_node: gpus,
        device: DeviceSpec {
            name: "test",
            memory_bytes: 1e12,
            bf16_flops: 1e12,
            fp32_flops: 1e12,
            tdp_w: 100.0,
        },
        intra: link,
        inter: link,
        global_batch: 8,
        seq,
        precision: Precision::Fp32,
        efficiency: 0.5,
        reserve_bytes: 0.0,
        bucket_mb: 25.0,
        dropout: false,
        fp32_main_grads: false,
        max_micro_batch: 8,
        zero_stages: vec![ZeroStage::Off],
        recompute: vec![Recompute::None],
        sequence_parallel: false,
        context_parallel: false,
        activations: ActivationModel::Korthikanti,
        chunked_head: false,
        overlap_grad_reduce: false,
        zero3_prefetch: 1,
    }
}
