//! A unit-time simulator of pipeline schedules: runs the action lists of
//! every stage together, without ranks.
//!
//! A forward takes `forward_time` and a backward `backward_time` (per
//! chunk); an [`Action::Exchange`] is posted at its stage's current time
//! and each of its transfers completes when the peer has posted the other
//! end in its current exchange (both posted: a rendezvous, as MPI's
//! protocol for large messages; communication itself takes no time). The
//! exchange, and its stage, go on when all its transfers have completed.
//! When no stage can go on and some have not finished, the lists deadlock.
//!
//! Besides deadlocks the simulator rejects lists that could not train: a
//! transfer whose other end never comes, a forward before its input was
//! received, a backward before its forward or before its output's gradient
//! was received, a send before the compute that produces it, and a stage
//! that does not run each (micro-batch, chunk) forward and backward exactly
//! once.

mod run;
#[cfg(test)]
mod tests;

use super::schedule::{stage_actions, Action, PipeShape, ScheduleError, ScheduleKind, Transfer};

/// What a simulated step took.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// From the start until the last stage has finished, in the unit of
    /// `forward_time` and `backward_time`.
    pub makespan: f64,
    /// Per stage: the time it spent computing (the rest of the makespan it
    /// waited).
    pub busy: Vec<f64>,
    /// Per stage: the most forwards (of a micro-batch through a chunk) whose
    /// backward had not run yet, at any time: the activations it holds.
    pub peak_in_flight: Vec<usize>,
    /// `m * v * (forward_time + backward_time)`: the compute of one stage,
    /// the makespan of a pipeline without a bubble.
    pub ideal: f64,
}

impl Timeline {
    /// `(makespan - ideal) / ideal`: the time lost to the pipeline bubble
    /// as a fraction of the compute, `(p - 1) / m` for GPipe and 1F1B and
    /// `(p - 1) / (v m)` for interleaved 1F1B (Narayanan et al. 2021).
    pub fn bubble_fraction(&self) -> f64 {
        (self.makespan - self.ideal) / self.ideal
    }
}

/// A stage that cannot go on, in a deadlock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// The stage.
    pub stage: usize,
    /// The index of its exchange in its action list.
    pub index: usize,
    /// The transfers of that exchange that have not completed.
    pub waiting: Vec<Transfer>,
}

/// Action lists that cannot run, or could not train.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SimError {
    /// The schedule does not fit the shape.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// No stage can go on and some have not finished.
    #[error("deadlock: {0:?}")]
    Deadlock(Vec<Stuck>),
    /// A transfer whose other end never comes in its peer's list.
    #[error("stage {stage}: {transfer:?} is never matched by its peer")]
    Unmatched {
        /// The stage that posted it.
        stage: usize,
        /// The transfer.
        transfer: Transfer,
    },
    /// A transfer that no schedule of the shape can have: an index out of
    /// range, a peer that does not hold the neighbouring virtual stage, an
    /// activation past the last virtual stage or a gradient before the
    /// first, or a transfer within one stage.
    #[error("stage {stage}: {transfer:?} does not exist in this pipeline")]
    BadTransfer {
        /// The stage that posted it.
        stage: usize,
        /// The transfer.
        transfer: Transfer,
    },
    /// A send posted before the compute that produces what it sends.
    #[error("stage {stage}: {transfer:?} is posted before its compute")]
    SendBeforeCompute {
        /// The stage that posted it.
        stage: usize,
        /// The transfer.
        transfer: Transfer,
    },
    /// A transfer posted twice by one stage.
    #[error("stage {stage}: {transfer:?} is posted twice")]
    RepeatedTransfer {
        /// The stage that posted it.
        stage: usize,
        /// The transfer.
        transfer: Transfer,
    },
    /// A forward or backward with a micro-batch or chunk out of range.
    #[error("stage {stage}: {action:?} is out of range")]
    OutOfRange {
        /// The stage.
        stage: usize,
        /// The compute.
        action: Action,
    },
    /// A forward or backward run twice by one stage.
    #[error("stage {stage}: {action:?} runs twice")]
    RepeatedCompute {
        /// The stage.
        stage: usize,
        /// The compute.
        action: Action,
    },
    /// A forward or backward a stage never runs.
    #[error("stage {stage}: {action:?} never runs")]
    MissingCompute {
        /// The stage.
        stage: usize,
        /// The compute.
        action: Action,
    },
    /// A forward whose input activation was not received (or, with one
    /// stage, not computed by the chunk before) when it runs.
    #[error("stage {stage}: forward of micro-batch {micro_batch} chunk {chunk} runs before its input came")]
    InputMissing {
        /// The stage.
        stage: usize,
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
    /// A backward before the forward of the same micro-batch and chunk.
    #[error("stage {stage}: backward of micro-batch {micro_batch} chunk {chunk} runs before its forward")]
    BackwardBeforeForward {
        /// The stage.
        stage: usize,
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
    /// A backward (not on the loss's virtual stage) whose output gradient
    /// was not received (or, with one stage, not computed by the chunk
    /// after) when it runs.
    #[error("stage {stage}: backward of micro-batch {micro_batch} chunk {chunk} runs before its output's gradient came")]
    GradientMissing {
        /// The stage.
        stage: usize,
        /// `0..m`.
        micro_batch: usize,
        /// `0..v`.
        chunk: usize,
    },
}

/// Simulates one step of `kind` on `shape`, a forward of one chunk taking
/// `forward_time` and a backward `backward_time` (any unit, both positive).
pub fn simulate(
    kind: ScheduleKind,
    shape: PipeShape,
    forward_time: f64,
    backward_time: f64,
) -> Result<Timeline, SimError> {
    let lists = (0..shape.stages)
        .map(|stage| stage_actions(kind, shape, stage))
        .collect::<Result<Vec<_>, _>>()?;
    simulate_lists(shape, &lists, forward_time, backward_time)
}

/// Simulates the action lists `lists` (one per stage, `p` of them) of a
/// step of `shape`, as [`simulate`] does for a schedule's.
///
/// Panics if there are not `p` lists or `shape` has a zero.
pub fn simulate_lists(
    shape: PipeShape,
    lists: &[Vec<Action>],
    forward_time: f64,
    backward_time: f64,
) -> Result<Timeline, SimError> {
    assert_eq!(lists.len(), shape.stages, "one action list per stage");
    assert!(
        shape.micro_batches > 0 && shape.chunks > 0,
        "an empty pipeline: {shape:?}"
    );
    run::run(shape, lists, forward_time, backward_time)
}
