//! Pipeline schedules as pure data.
//!
//! Terms (Megatron-LM's): `p` stages (the PP group's ranks), `m`
//! micro-batches per optimizer step, `v` model chunks per stage (virtual
//! stages; 1 except for the interleaved schedule). Virtual stage
//! `c * p + s` is chunk `c` of stage `s`; the embedding sits on virtual
//! stage 0 and the head and loss on virtual stage `v * p - 1`. A forward of
//! micro-batch `mb` on a virtual stage needs the activation of the virtual
//! stage before it, a backward the gradient of the one after it.

/// Which schedule runs the micro-batches of a step (`--pp-schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// Every forward, then every backward (Huang et al. 2019).
    GPipe,
    /// One forward, one backward (PipeDream-Flush, Narayanan et al. 2021):
    /// at most `p - s` micro-batches in flight on stage `s`.
    OneFOneB,
    /// 1F1B over `v` model chunks per stage (Narayanan et al. 2021, §2.2):
    /// the bubble shrinks by `v`.
    Interleaved,
}

/// The size of a pipeline step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipeShape {
    /// Pipeline stages `p` (ranks of the PP group), at least 1.
    pub stages: usize,
    /// Micro-batches `m` of one optimizer step, at least 1.
    pub micro_batches: usize,
    /// Model chunks `v` per stage: 1 for GPipe and 1F1B, `--pp-virtual`
    /// for the interleaved schedule.
    pub chunks: usize,
}

/// What crosses between two stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    /// A virtual stage's output hidden states `[batch, seq, hidden]`,
    /// forward (to the next virtual stage).
    Activation,
    /// The loss gradient of a virtual stage's input, backward (to the
    /// previous virtual stage), of the same shape.
    Gradient,
}

/// One point-to-point transfer, seen from one of its two ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// `true` on the sending end, `false` on the receiving end.
    pub send: bool,
    /// What is transferred.
    pub payload: Payload,
    /// The micro-batch it belongs to, `0..m`.
    pub micro_batch: usize,
    /// The chunk of this stage that produced (send) or will consume
    /// (receive) it, `0..v`.
    pub chunk: usize,
    /// The stage at the other end, `0..p`.
    pub peer: usize,
}

/// One thing a stage does, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Forward of `micro_batch` through chunk `chunk` of this stage (its
    /// input was received by an earlier [`Action::Exchange`], or is the
    /// token ids on virtual stage 0).
    Forward {
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
    /// Backward of `micro_batch` through chunk `chunk` (its output's
    /// gradient was received earlier, or is the loss on the last virtual
    /// stage).
    Backward {
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
    /// Transfers posted together and all complete before the next action
    /// (one `MPI_Sendrecv`-like exchange, or one NCCL group): a send and a
    /// receive posted together cannot deadlock against a peer doing the same.
    Exchange(Vec<Transfer>),
}

/// A pipeline that a schedule cannot run.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Stages, micro-batches or chunks of zero.
    #[error("the pipeline needs at least one stage, micro-batch and chunk, got {0:?}")]
    Empty(PipeShape),
    /// `v > 1` for a schedule other than interleaved, or `v < 2` for it.
    #[error("{kind:?} runs {want} chunk(s) per stage, got --pp-virtual {chunks}")]
    Chunks {
        /// The schedule.
        kind: ScheduleKind,
        /// Chunks asked for.
        chunks: usize,
        /// What it runs, in words ("1", "at least 2").
        want: &'static str,
    },
    /// The interleaved schedule needs `m` to be a multiple of `p` (as Megatron-LM).
    #[error("the interleaved schedule needs the micro-batches ({micro_batches}) to be a multiple of --pp {stages}")]
    Interleave {
        /// `m`.
        micro_batches: usize,
        /// `p`.
        stages: usize,
    },
}
