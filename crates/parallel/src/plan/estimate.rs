//! Memory per GPU of one choice: the training state of the fullest pipeline
//! stage, its activations, transient buffers and a fixed reserve.

use ferrotron_engine::metrics::MemoryBytes;
use serde::Serialize;

use super::activation::{in_flight, LayerActivations, Recompute};
use super::memory::state_bytes;
use super::time::{step_time, TimeEstimate};
use super::{Choice, PlanInput};
use crate::data::bucket_elems;
use crate::zero::ZeroStage;

/// Activation bytes of one GPU, by origin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ActivationBytes {
    /// Transformer layers x micro-batches in flight.
    pub layers: f64,
    /// The embedding's share (first stage).
    pub embedding: f64,
    /// The output layer's share, logits included (last stage).
    pub output: f64,
    /// Full recomputation: one layer's activations rebuilt in backward.
    pub recompute_working: f64,
}

impl ActivationBytes {
    /// Everything together.
    pub fn total(&self) -> f64 {
        self.layers + self.embedding + self.output + self.recompute_working
    }
}

/// Memory of one GPU: the fuller of the first and last pipeline stages.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MemoryEstimate {
    /// `first`, `last` or `only` (no pipeline): the stage counted.
    pub stage: &'static str,
    /// Parameters, gradients and optimizer state, as the trainer reports them.
    pub state: MemoryBytes,
    /// Stored activations.
    pub activations: ActivationBytes,
    /// Buffers that live during a step: two gradient buckets (ZeRO 0-2) or
    /// one gathered block with its gradients (ZeRO-3).
    pub transient: f64,
    /// Fixed allowance for the framework, the runtime and fragmentation.
    pub reserve: f64,
}

impl MemoryEstimate {
    /// Bytes in all.
    pub fn total(&self) -> f64 {
        let s = &self.state;
        (s.param_bytes + s.grad_bytes + s.optimizer_bytes) as f64
            + self.activations.total()
            + self.transient
            + self.reserve
    }
}

/// What one choice costs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// The layout.
    pub choice: Choice,
    /// Its label, as `--explain` takes it.
    pub label: String,
    /// Memory per GPU.
    pub memory: MemoryEstimate,
    /// Time per optimizer step and what follows from it.
    pub time: TimeEstimate,
    /// Whether Ferrotron runs this layout today: no pipeline (pp = 1; TP
    /// and SP run), f32, any recomputation (`--recompute`) except that
    /// ZeRO-3 always recomputes whole blocks (so ZeRO-3 means `full`).
    pub runs_today: bool,
}

/// Blocks on the fullest stage of `pp` (uneven splits give some stages one more).
pub fn blocks_per_stage(layers: usize, pp: usize) -> usize {
    layers.div_ceil(pp)
}

/// The FSDP units (tensor sizes) of the first and the last stage of
/// `choice`; the same stage twice without a pipeline.
pub fn stage_units(input: &PlanInput, c: &Choice) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
    let m = &input.model;
    let blocks = vec![m.block_tensors(c.tp); blocks_per_stage(m.layers, c.pp)];
    let mut first = vec![m.embedding_tensors(c.tp)];
    first.extend(blocks.iter().cloned());
    if c.pp == 1 {
        first.push(m.head_tensors(c.tp, false));
        return (first.clone(), first);
    }
    let mut last = blocks;
    last.push(m.head_tensors(c.tp, true));
    (first, last)
}

/// Memory and time of `c` for `input`.
pub fn estimate(input: &PlanInput, c: &Choice) -> Estimate {
    let m = &input.model;
    let (first, last) = stage_units(input, c);
    let micro_batches = input.global_batch / (c.dp * c.micro_batch);
    let act = LayerActivations {
        seq: input.seq,
        micro_batch: c.micro_batch,
        tp: c.tp,
        sp: c.sp,
        elem_bytes: input.precision.activation_bytes(),
        dropout: input.dropout,
    };
    let blocks = blocks_per_stage(m.layers, c.pp) as f64;
    let k = input.activation_factor;
    let per_layer = k * act.layer_bytes(m, c.recompute);
    let working = if c.recompute == Recompute::Full {
        k * act.layer_bytes(m, Recompute::None)
    } else {
        0.0
    };
    let held = in_flight(c.pp, c.interleave, micro_batches);
    let bucket = bucket_elems(input.bucket_mb);
    let (_, bg, _) = input.precision.state_bytes();
    let (bp, _, _) = input.precision.state_bytes();
    let transient = |units: &[Vec<usize>]| -> f64 {
        if c.zero == ZeroStage::Three {
            let unit = units
                .iter()
                .map(|u| u.iter().sum::<usize>())
                .max()
                .unwrap_or(0);
            ((bp + bg) * unit) as f64
        } else {
            (2 * bg * bucket) as f64
        }
    };
    let stage = |units: &[Vec<usize>], name, acts: ActivationBytes| MemoryEstimate {
        stage: name,
        state: state_bytes(units, c.dp, c.zero, input.precision, bucket),
        activations: acts,
        transient: transient(units),
        reserve: input.reserve_bytes,
    };
    let first_acts = ActivationBytes {
        layers: blocks * held * per_layer,
        embedding: k * held * act.embedding_bytes(m),
        output: if c.pp == 1 {
            k * act.output_bytes(m)
        } else {
            0.0
        },
        recompute_working: working,
    };
    let memory = if c.pp == 1 {
        stage(&first, "only", first_acts)
    } else {
        let a = stage(&first, "first", first_acts);
        let last_acts = ActivationBytes {
            layers: blocks * per_layer,
            embedding: 0.0,
            output: k * act.output_bytes(m),
            recompute_working: working,
        };
        let b = stage(&last, "last", last_acts);
        if a.total() >= b.total() {
            a
        } else {
            b
        }
    };
    let last_elems: usize = last.iter().flatten().sum();
    let time = step_time(input, c, last_elems, micro_batches);
    let runs_today = c.pp == 1
        && input.precision == super::Precision::Fp32
        && match c.zero {
            // ZeRO-3 always recomputes whole blocks; the other stages run
            // every recomputation (`--recompute`).
            ZeroStage::Three => c.recompute == Recompute::Full,
            _ => true,
        };
    Estimate {
        choice: *c,
        label: c.to_string(),
        memory,
        time,
        runs_today,
    }
}
