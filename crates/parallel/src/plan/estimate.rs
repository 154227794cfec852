//! Memory per GPU of one choice: the training state of the fullest pipeline
//! stage, its activations, transient buffers and a fixed reserve.

use ferrotron_engine::metrics::MemoryBytes;
use serde::Serialize;

use super::activation::{in_flight, LayerActivations, Recompute};
use ferrotron_engine::lm::LmUnit;

use super::buffers::{gathered_blocks, results_in_flight, zero3_bytes, Prefetch};

use super::checkpoint::{checkpoint_bytes, CheckpointBytes};
use super::memory::{layout_state_bytes, Held};
use super::model::ModelShape;
use super::offload::offload_state;
use super::split::stage_blocks;
use super::time::{block_flops, step_time, StageParams, TimeEstimate};
use super::{Choice, PlanInput};
use crate::ddp::bucket_elems;
use crate::pipeline::StageLayout;
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
    /// Buffers that live during a step ([`super::buffers`]): two gradient
    /// buckets (ZeRO 0-2), or under ZeRO-3 the embedding and head gathered
    /// with their gradients and [`Self::gathered_blocks`] blocks gathered
    /// with one block's gradients; under ZeRO-2/3 with overlap, a shard
    /// of reduce-scatter results in flight.
    pub transient: f64,
    /// ZeRO-3: blocks gathered at once, the one computing and those whose
    /// gathers `--zero3-prefetch` starts ahead (0 below ZeRO-3).
    pub gathered_blocks: usize,
    /// Fixed allowance for the framework, the runtime and fragmentation.
    pub reserve: f64,
    /// Host memory a checkpoint adds (not counted in [`Self::total`]: on a
    /// GPU it is not device memory).
    pub checkpoint: CheckpointBytes,
    /// Host memory of the optimizer state offloaded
    /// ([`Choice::offload`], [`super::offload`]), bytes; not counted in
    /// [`Self::total`], `state` holds what stays on the device.
    pub host_offload: f64,
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
    /// Blocks per pipeline stage, first to last (see [`stage_split`]):
    /// `ferrotron train --pp-layers` for a pipeline without interleaving.
    pub stage_layers: Vec<usize>,
    /// Whether `ferrotron train` accepts this layout and runs it as
    /// planned (see [`runs_today`]).
    pub runs_today: bool,
}

/// Whether `ferrotron train` accepts `c` at `precision` and runs it as the
/// planner counts it: f32 only (its bf16 and fp16 keep f32 parameters,
/// gradients and AdamW state, not the 2 + 2 + 12 bytes counted here);
/// offload only with ZeRO 1 to 3 (the search proposes no other);
/// ZeRO-3 only with `full` recomputation (it always
/// recomputes whole blocks) and without a pipeline; a pipeline (1F1B or
/// interleaved, split by `--pp-layers`) with ZeRO 0, 1 or 2 and `none` or
/// `sel` recomputation (`full` is refused with `--pp`). DP, TP, SP and CP
/// combine with all of these.
pub fn runs_today(c: &Choice, precision: super::Precision) -> bool {
    let zero_ok = match c.zero {
        ZeroStage::Three => c.recompute == Recompute::Full && c.pp == 1,
        _ => true,
    };
    let pipeline_ok = c.pp == 1 || c.recompute != Recompute::Full;
    let offload_ok = !c.offload || c.zero != ZeroStage::Off;
    precision == super::Precision::Fp32 && zero_ok && pipeline_ok && offload_ok
}

/// Blocks per pipeline stage of `c` ([`stage_blocks`] with the head's
/// FLOPs over a block's, recomputation included).
pub fn stage_split(input: &PlanInput, c: &Choice) -> Vec<usize> {
    let head = input.model.head_flops_per_token() / block_flops(input, c);
    stage_blocks(&input.model, c.pp, c.interleave, head)
}

/// The FSDP units (tensor sizes) of every pipeline stage of `c` whose
/// stages hold `split` blocks, first to last (one stage without a
/// pipeline): the embedding on the first, its blocks, the final norm and
/// the head on the last, which with a pipeline also holds a copy of a
/// tied embedding (Megatron).
pub fn stage_units(m: &ModelShape, c: &Choice, split: &[usize]) -> Vec<Vec<Vec<usize>>> {
    let last = split.len() - 1;
    split
        .iter()
        .enumerate()
        .map(|(i, &blocks)| {
            let mut units = Vec::new();
            if i == 0 {
                units.push(m.embedding_tensors(c.tp));
            }
            units.extend(vec![m.block_tensors(c.tp); blocks]);
            if i == last {
                units.push(m.head_tensors(c.tp, c.pp > 1));
            }
            units
        })
        .collect()
}

/// The trainer's flat layout on pipeline stage `stage` of `c` whose
/// blocks go to stages as `layout` places them (what `train` builds from
/// `--pp`, `--pp-virtual` and `--pp-layers`): every tensor of the model in
/// visiting order (embedding, blocks, final norm and head), those of other
/// stages as placeholders; the last stage holds a copy of a tied
/// embedding.
pub fn stage_layout(
    m: &ModelShape,
    c: &Choice,
    layout: &StageLayout,
    stage: usize,
) -> Vec<Vec<Held>> {
    let at = |owner: usize, n: &usize| {
        if owner == stage {
            Held::Values(*n)
        } else {
            Held::Placeholder
        }
    };
    let last = c.pp - 1;
    let mut units = Vec::new();
    units.push(
        m.embedding_tensors(c.tp)
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let tied_copy = i == 0 && m.tied_head && stage == last;
                at(if tied_copy { stage } else { 0 }, n)
            })
            .collect(),
    );
    for b in 0..m.layers {
        let owner = layout.owner(LmUnit::Block(b));
        units.push(m.block_tensors(c.tp).iter().map(|n| at(owner, n)).collect());
    }
    units.push(
        m.head_tensors(c.tp, false)
            .iter()
            .map(|n| at(last, n))
            .collect(),
    );
    units
}

/// What each stage of `c` holds for the time model: its blocks
/// (`split`), its parameter values (`units`, [`stage_units`]) and, with a
/// pipeline, a tied embedding's values on the first and the last stage.
pub fn stage_params(
    input: &PlanInput,
    c: &Choice,
    split: &[usize],
    units: &[Vec<Vec<usize>>],
) -> Vec<StageParams> {
    let m = &input.model;
    let tied = if c.pp > 1 && m.tied_head {
        m.vocab.div_ceil(c.tp) * m.hidden
    } else {
        0
    };
    let last = units.len() - 1;
    split
        .iter()
        .zip(units)
        .enumerate()
        .map(|(i, (&blocks, stage))| StageParams {
            blocks,
            elems: stage.iter().flatten().sum(),
            once_per_step: if i == 0 || i == last { tied } else { 0 },
        })
        .collect()
}

/// What the memory model reads besides the layout: the model, the batch
/// and how the trainer keeps its state and activations (the fields of
/// [`PlanInput`] of the same names).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryInput {
    /// The model.
    pub model: ModelShape,
    /// Sequences per optimizer step (`dp x micro_batch x micro-batches`).
    pub global_batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Numeric format of the state and the activations.
    pub precision: super::Precision,
    /// Gradient bucket (and ZeRO-1/2 unit) size, MiB of f32.
    pub bucket_mb: f64,
    /// Whether the model uses dropout (1-byte masks).
    pub dropout: bool,
    /// An fp32 copy of the gradients under mixed precision.
    pub fp32_main_grads: bool,
    /// How activations are counted.
    pub activations: super::ActivationModel,
    /// The head and the loss in blocks of rows where TP is 1 (see
    /// [`super::LayerActivations::chunked_head`]).
    pub chunked_head: bool,
    /// Bytes per GPU set aside for the framework, the runtime and
    /// fragmentation.
    pub reserve_bytes: f64,
    /// How far ZeRO-3 gathers blocks ahead (`--overlap-grad-reduce`,
    /// `--zero3-prefetch`).
    pub prefetch: Prefetch,
    /// The pipeline runs GPipe (every forward, then every backward): each
    /// stage holds every micro-batch's activations at once, where 1F1B
    /// holds at most `pp` (the planner ranks 1F1B only).
    pub gpipe: bool,
}

impl PlanInput {
    /// What [`memory`] reads of this input.
    pub fn memory_input(&self) -> MemoryInput {
        MemoryInput {
            model: self.model.clone(),
            global_batch: self.global_batch,
            seq: self.seq,
            precision: self.precision,
            bucket_mb: self.bucket_mb,
            dropout: self.dropout,
            fp32_main_grads: self.fp32_main_grads,
            activations: self.activations,
            chunked_head: self.chunked_head,
            reserve_bytes: self.reserve_bytes,
            prefetch: Prefetch {
                overlap: self.overlap_grad_reduce,
                depth: self.zero3_prefetch,
            },
            gpipe: false,
        }
    }
}

/// Blocks each stage of `layout` holds, first to last (its chunks
/// together when interleaved).
fn blocks_per_stage(layout: &StageLayout) -> Vec<usize> {
    let mut split = vec![0; layout.stages()];
    for (w, n) in layout.sizes().into_iter().enumerate() {
        split[w % layout.stages()] += n;
    }
    split
}

/// Memory per rank of `c` whose blocks go to stages as `layout` places
/// them: the fuller of the first and the last pipeline stage (the only
/// one without a pipeline), bytes by class. Under context parallelism the
/// activations are those of this rank's `seq / cp` tokens and the state
/// is sharded over DP x CP.
pub fn memory(input: &MemoryInput, c: &Choice, layout: &StageLayout) -> MemoryEstimate {
    let m = &input.model;
    let split = blocks_per_stage(layout);
    let units = stage_units(m, c, &split);
    let (first, last) = (&units[0], &units[units.len() - 1]);
    let micro_batches = input.global_batch / (c.dp * c.micro_batch);
    let act = LayerActivations {
        seq: input.seq,
        cp: c.cp,
        micro_batch: c.micro_batch,
        tp: c.tp,
        sp: c.sp,
        elem_bytes: input.precision.activation_bytes(),
        dropout: input.dropout,
        model: input.activations,
        chunked_head: input.chunked_head,
    };
    let per_layer = act.layer_bytes(m, c.recompute);
    let working = if c.recompute == Recompute::Full {
        act.layer_bytes(m, Recompute::None)
    } else {
        0.0
    };
    // Micro-batches whose activations the first stage holds at once; the
    // last stage holds one under 1F1B.
    let (held, held_last) = if input.gpipe && c.pp > 1 {
        (micro_batches as f64, micro_batches as f64)
    } else {
        (in_flight(c.pp, c.interleave, micro_batches), 1.0)
    };
    let bucket = bucket_elems(input.bucket_mb);
    let (bp, bg, _) = input.precision.state_bytes();
    let gathered = gathered_blocks(c, input.prefetch);
    let transient = |units: &[Vec<usize>], first: bool, last: bool| -> f64 {
        if c.zero == ZeroStage::Three {
            zero3_bytes(units, first, last, gathered, (bp, bg))
        } else {
            (2 * bg * bucket) as f64
        }
    };
    let state = |s: usize| {
        let held = stage_layout(m, c, layout, s);
        // ZeRO shards over DP x CP, as the trainer does.
        let mut st = layout_state_bytes(&held, c.dp * c.cp, c.zero, input.precision, bucket);
        if input.fp32_main_grads && input.precision != super::Precision::Fp32 {
            // An fp32 copy of every gradient this rank holds.
            st.grad_bytes += 4 * st.grad_bytes / bg;
        }
        let host = if c.offload {
            offload_state(&mut st, c.zero, input.precision)
        } else {
            0
        };
        (st, host)
    };
    let stage = |s: usize, units: &[Vec<usize>], name, acts: ActivationBytes| {
        let (state, host) = state(s);
        let held = stage_layout(m, c, layout, s);
        let results = results_in_flight(c, input.prefetch, micro_batches, state.grad_bytes);
        MemoryEstimate {
            stage: name,
            state,
            activations: acts,
            transient: transient(units, s == 0, s == c.pp - 1) + results,
            gathered_blocks: gathered,
            reserve: input.reserve_bytes,
            // ZeRO's pieces span DP x CP, as the state's.
            checkpoint: checkpoint_bytes(&held, c.dp * c.cp, c.zero, bucket),
            host_offload: host as f64,
        }
    };
    let first_acts = ActivationBytes {
        layers: split[0] as f64 * held * per_layer,
        embedding: held * act.embedding_bytes(m),
        output: if c.pp == 1 { act.output_bytes(m) } else { 0.0 },
        recompute_working: working,
    };
    if c.pp == 1 {
        return stage(0, first, "only", first_acts);
    }
    let a = stage(0, first, "first", first_acts);
    let last_acts = ActivationBytes {
        layers: split[split.len() - 1] as f64 * held_last * per_layer,
        embedding: 0.0,
        output: held_last * act.output_bytes(m),
        recompute_working: working,
    };
    let b = stage(c.pp - 1, last, "last", last_acts);
    if a.total() >= b.total() {
        a
    } else {
        b
    }
}

/// Memory and time of `c` for `input`.
pub fn estimate(input: &PlanInput, c: &Choice) -> Estimate {
    let m = &input.model;
    let split = stage_split(input, c);
    let interleaved = c.interleave > 1;
    let layers = (!interleaved).then_some(split.as_slice());
    let layout = StageLayout::new(m.layers, c.pp, c.interleave, layers, interleaved)
        .expect("the planner's split and chunks are ones train accepts");
    let memory = memory(&input.memory_input(), c, &layout);
    let units = stage_units(m, c, &split);
    let micro_batches = input.global_batch / (c.dp * c.micro_batch);
    let stages = stage_params(input, c, &split, &units);
    let time = step_time(input, c, &stages, micro_batches);
    Estimate {
        choice: *c,
        label: c.to_string(),
        memory,
        time,
        stage_layers: split,
        runs_today: runs_today(c, input.precision),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixture::small_gpt;

    /// A checkpoint's shares follow ZeRO's shards, which span DP x CP:
    /// dp1 x cp2 writes what dp2 x cp1 writes.
    #[test]
    fn checkpoint_shares_span_dp_and_cp() {
        let input = small_gpt(2, 64);
        for (zero, recompute) in [
            (ZeroStage::One, Recompute::None),
            (ZeroStage::Three, Recompute::Full),
        ] {
            let dp2 = Choice {
                dp: 2,
                tp: 1,
                cp: 1,
                pp: 1,
                sp: false,
                zero,
                micro_batch: 1,
                recompute,
                interleave: 1,
                offload: false,
            };
            let cp2 = Choice {
                dp: 1,
                cp: 2,
                ..dp2
            };
            let one = Choice { dp: 1, ..dp2 };
            let checkpoint = |c: &Choice| estimate(&input, c).memory.checkpoint;
            assert_eq!(checkpoint(&cp2), checkpoint(&dp2), "{zero:?}");
            assert_ne!(checkpoint(&one), checkpoint(&dp2), "{zero:?}");
        }
    }
}
