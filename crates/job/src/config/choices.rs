//! The enumerated settings of a job: `parallelism.pp_schedule`,
//! `parallelism.comm`, `parallelism.offload`, `optimizer.on_nonfinite` and
//! `backend.attention_kernel`.

use ferrotron_parallel::pipeline::ScheduleKind;
use serde::{Deserialize, Serialize};

/// `parallelism.pp_schedule`: how a step's micro-batches flow through the
/// stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PpSchedule {
    /// Every forward, then every backward (all activations in flight).
    Gpipe,
    /// One forward, one backward (Megatron-LM's default): at most `pp`
    /// micro-batches in flight.
    #[default]
    #[value(name = "1f1b")]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// 1F1B over `pp_virtual` chunks per stage: the bubble shrinks by that factor.
    Interleaved,
}

impl From<PpSchedule> for ScheduleKind {
    fn from(s: PpSchedule) -> Self {
        match s {
            PpSchedule::Gpipe => ScheduleKind::GPipe,
            PpSchedule::OneFOneB => ScheduleKind::OneFOneB,
            PpSchedule::Interleaved => ScheduleKind::Interleaved,
        }
    }
}

/// `parallelism.comm`: the transport of every process group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CommChoice {
    /// NCCL / RCCL on cuda or rocm whose library loads (the gradient sync,
    /// TP operators, pipeline messages and CP ring run on the device
    /// tensors), for a job with context parallelism only on the fused
    /// kernels; MPI otherwise (see `comm::resolve`).
    #[default]
    Auto,
    /// Open MPI on host buffers.
    Mpi,
    /// NCCL / RCCL through the run-time binding, bootstrapped over MPI.
    Nccl,
}

/// `parallelism.offload`: what of the training state lives in host memory
/// (DeepSpeed's `offload_optimizer`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// Everything on the device.
    #[default]
    None,
    /// AdamW's moments (and under ZeRO-3 the f32 parameter pieces) of
    /// each rank's ZeRO shard, updated on the CPU.
    Optimizer,
}

/// `optimizer.on_nonfinite`: the step's update is never applied; `stop`
/// ends the run (exit 1) naming the step, `skip` goes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OnNonFinite {
    /// End the run.
    #[default]
    Stop,
    /// Skip the step and go on (up to `optimizer.max_skipped` in a row).
    Skip,
}

/// `backend.attention_kernel`: which kernels the fused attention runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernelChoice {
    /// FlashAttention-2's tiled kernels on plain units, on every GPU backend.
    #[default]
    Auto,
    /// Both products on the matrix units (tensor cores) where the device
    /// has them for the compute dtype (16-bit) and a head dimension that is
    /// a multiple of 16 up to 128: the fragment forward and backward;
    /// elsewhere as `auto`. Opt-in until a race check on it has
    /// concluded and a sweep has completed.
    MatrixUnits,
    /// FlashAttention-2's register scheme where the device has the 16 x 8
    /// x 16 `mma` instruction for the compute dtype (16-bit) and the head
    /// dimension is a multiple of 16 up to 128: the register forward and
    /// backward, scores and accumulators in registers; elsewhere as
    /// `auto`. Opt-in until its backward's test has passed on a GPU and
    /// it has run a training step there.
    Registers,
}
