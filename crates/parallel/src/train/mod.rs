//! Training: the step and the loop, for one rank or many.
//!
//! - [`step`]: [`Trainer`], one optimizer step = the micro-batch schedule
//!   ([`crate::micro_batch`]: whole graph, or unit by unit; or the
//!   pipeline's) composed with a gradient-synchronisation strategy
//!   ([`GradSync`](crate::grad_sync::GradSync): DDP or a ZeRO stage), then
//!   the update. No parallel dimension is a branch inside another: the
//!   strategy is chosen once, when the trainer is built.
//! - [`run`]: the loop around it (global batch split over the DP ranks,
//!   validation and checkpoint cadence, metrics, progress).
//! - [`loss_scale`]: dynamic loss scaling for fp16 mixed precision.
//! - [`checkpoint`]: complete checkpoints (model, optimizer, sampler, step)
//!   written per rank with an index, atomically, for resuming in any
//!   layout; `held`: the trainer's share of them.
//! - `evaluate`: validation on the parallel model (no gather); `whole`:
//!   the whole model one parameter at a time, for streaming writers
//!   ([`WholeParameters`]).
//! - [`gather_phase_memory`]: every rank's peak memory of a phase (build,
//!   checkpoint save or load), for rank 0's `metrics.jsonl`.
//! - `test_faults`: the test-only hooks that make one rank panic or stall
//!   at a given step (for the tests of lost and stalled ranks).

pub mod checkpoint;
mod evaluate;
mod held;
pub mod loss_scale;
mod phase_memory;
pub mod run;
pub mod step;
mod test_faults;
mod whole;

pub use phase_memory::gather_phase_memory;
pub use run::{
    run, BatchSource, LoopConfig, LoopError, NonFinite, Progress, RunSummary, Silent, TokenWindows,
};
pub use step::{ParallelConfig, StepConfig, StepOutput, Trainer};
pub use whole::WholeParameters;
