//! Training: the step and the loop, for one rank or many.
//!
//! - [`step`]: [`Trainer`], one optimizer step = the micro-batch schedule
//!   ([`micro_batch`]: whole graph, or unit by unit) composed with a
//!   gradient-synchronisation strategy ([`sync::GradSync`]: DDP or a ZeRO
//!   stage), then the update. No parallel dimension is a branch inside
//!   another: the strategy is chosen once, when the trainer is built.
//! - [`run`]: the loop around it (global batch split over the DP ranks,
//!   validation and checkpoint cadence, metrics, progress).
//! - [`norm`]: the global gradient norm over a group.
//! - [`loss_scale`]: dynamic loss scaling for fp16 mixed precision.
//! - [`checkpoint`]: complete checkpoints (model, optimizer, sampler, step)
//!   written atomically, for resuming.

pub mod checkpoint;
pub mod loss_scale;
pub mod micro_batch;
pub mod norm;
pub mod run;
pub mod step;
pub mod sync;

pub use run::{
    run, BatchSource, LoopConfig, LoopError, NonFinite, Progress, RunSummary, Silent, TokenWindows,
};
pub use step::{ParallelConfig, StepConfig, StepOutput, Trainer, TrainerState};
