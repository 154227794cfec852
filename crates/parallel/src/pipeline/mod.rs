//! Pipeline parallelism: the model's blocks split into contiguous stages
//! over the PP group, micro-batches flowing through them.
//!
//! - [`schedule`]: schedules as pure data (GPipe, 1F1B, interleaved 1F1B):
//!   for each stage, the ordered list of [`Action`]s it runs in one step;
//! - [`simulate`]: runs the lists of every stage in unit time without
//!   ranks, proving that sends match receives (no deadlock) and measuring
//!   the bubble.

pub mod schedule;
pub mod simulate;

pub use schedule::{
    stage_actions, Action, Payload, PipeShape, ScheduleError, ScheduleKind, Transfer,
};
pub use simulate::{simulate, simulate_lists, SimError, Stuck, Timeline};
