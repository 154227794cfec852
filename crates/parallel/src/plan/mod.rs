//! The planner: which parallel layout to train a model with, on a given
//! number and type of GPUs, before any job is queued.
//!
//! For every layout of the GPUs into data (`dp`), tensor (`tp`, with or
//! without sequence parallelism), context (`cp`, ring attention) and
//! pipeline (`pp`, 1F1B or interleaved) parallelism, every ZeRO stage,
//! micro-batch size and recomputation choice, it estimates
//! - the memory of one GPU ([`estimate`]): the training state of the
//!   fullest stage by the trainer's own classes and sharding
//!   ([`memory`]), the activations after Korthikanti et al. 2022 or as
//!   Ferrotron's CPU path keeps them ([`activation`]), transient buffers
//!   and a reserve; and the host memory a checkpoint adds
//!   ([`checkpoint`]);
//! - the time of one optimizer step ([`time`]): Megatron's FLOP count at a
//!   fraction of the device peak on the slowest pipeline stage (blocks
//!   split to balance the head, [`split`]), alpha-beta costs of every
//!   collective ([`comm`]) on the links of [`link`], the part of the
//!   context-parallel ring's transfers that the block's attention does not
//!   hide ([`ring`]), the pipeline bubble, and the part of the DP
//!   communication compute cannot hide where the trainer overlaps it
//!   ([`overlap`]); with the optimizer offloaded, its PCIe copies and
//!   CPU update ([`offload`]);
//!
//! and ranks the layouts that fit by step time ([`search`]). Devices come
//! from [`ferrotron_engine::metrics::DEVICES`]. The planner is pure
//! arithmetic: no tensors, no ranks.

pub mod activation;
pub mod buffers;
pub mod checkpoint;
pub mod choice;
pub mod comm;
pub mod estimate;
pub mod explain;
#[cfg(test)]
mod fixture;
pub mod link;
pub mod memory;
pub mod model;
pub mod offload;
pub mod overlap;
pub mod ring;
pub mod search;
pub mod split;
pub mod time;

use ferrotron_engine::metrics::DeviceSpec;

pub use activation::{ActivationModel, Recompute};
pub use choice::Choice;
pub use estimate::{estimate, memory, Estimate, MemoryEstimate, MemoryInput};
pub use link::Link;
pub use memory::Precision;
pub use model::ModelShape;
pub use search::{plan, Plan, Rejected};

/// What the planner is asked.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanInput {
    /// The model.
    pub model: ModelShape,
    /// GPUs in all.
    pub gpus: usize,
    /// GPUs per node (consecutive ranks share a node).
    pub gpus_per_node: usize,
    /// The GPU type, with any overrides applied.
    pub device: DeviceSpec,
    /// Link between GPUs of a node.
    pub intra: Link,
    /// Link between nodes, per GPU.
    pub inter: Link,
    /// Sequences per optimizer step.
    pub global_batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Numeric format of training.
    pub precision: Precision,
    /// Fraction of the device peak that compute reaches, 0..1.
    pub efficiency: f64,
    /// Bytes per GPU set aside for the framework, the runtime and
    /// fragmentation.
    pub reserve_bytes: f64,
    /// Gradient bucket (and ZeRO-1/2 unit) size, MiB of f32.
    pub bucket_mb: f64,
    /// Whether the model uses dropout (1-byte masks; Ferrotron has none).
    pub dropout: bool,
    /// Mixed precision keeps an fp32 copy of the gradients besides the
    /// 2 + 2 + 12 bytes per parameter of the ZeRO paper, as Megatron-LM's
    /// optimizer does (20 bytes per parameter with fp16 gradients: the
    /// Megatron Core user guide, "Distributed Optimizer"). Counted with
    /// the gradients.
    pub fp32_main_grads: bool,
    /// Largest micro-batch tried, sequences.
    pub max_micro_batch: usize,
    /// The ZeRO stages tried (what the framework offers).
    pub zero_stages: Vec<crate::zero::ZeroStage>,
    /// The recomputation choices tried.
    pub recompute: Vec<Recompute>,
    /// Whether sequence parallelism is tried with TP.
    pub sequence_parallel: bool,
    /// Whether context parallelism (cp above 1) is tried.
    pub context_parallel: bool,
    /// How activations are counted: Korthikanti et al.'s one tensor per
    /// fused op, or what Burn's autodiff keeps over Ferrotron's reference
    /// ops on the CPU path.
    pub activations: ActivationModel,
    /// Whether the head and the loss run in blocks of rows where TP is 1,
    /// keeping the head's gradients instead of the f32 logits (what
    /// Ferrotron's trainer does with its default kernels; Megatron-LM keeps
    /// the logits): see [`activation`].
    pub chunked_head: bool,
    /// Whether the trainer overlaps the DP collectives with compute
    /// (`--overlap-grad-reduce`; honoured with `tp = pp = 1`): the step
    /// then counts only their exposed part.
    pub overlap_grad_reduce: bool,
    /// ZeRO-3 with overlap: blocks whose all-gathers start ahead
    /// (`--zero3-prefetch`).
    pub zero3_prefetch: usize,
}

impl PlanInput {
    /// The device's peak for the precision, FLOP/s.
    pub fn peak_flops(&self) -> f64 {
        self.device.peak_flops(self.precision.into())
    }
}
