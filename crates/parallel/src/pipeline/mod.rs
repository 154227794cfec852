//! Pipeline parallelism: the model's blocks split into contiguous stages
//! over the PP group, micro-batches flowing through them.
//!
//! - [`schedule`]: schedules as pure data (GPipe, 1F1B, interleaved 1F1B):
//!   for each stage, the ordered list of [`Action`]s it runs in one step;
//! - [`simulate`]: runs the lists of every stage in unit time without
//!   ranks, proving that sends match receives (no deadlock) and measuring
//!   the bubble;
//! - [`layout`]: which blocks each (virtual) stage runs;
//! - `placement`: which parameters a stage holds, the tied embedding's
//!   copy, and joining the stages back into the whole model;
//! - `executor`: runs a stage's actions, sending activations and
//!   gradients point to point over the PP group, and times them (the
//!   measured bubble in [`PipelineTimes`]).

mod evaluate;
mod executor;
pub mod layout;
mod placement;
pub mod schedule;
pub mod simulate;

use std::sync::Arc;

use burn::module::{AutodiffModule, ParamId};
use burn::tensor::backend::{AutodiffBackend, Backend};
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::LmUnits;
use ferrotron_engine::metrics::PipelineTimes;

pub use layout::{LayoutError, StageLayout};
pub use schedule::{
    stage_actions, Action, Payload, PipeShape, ScheduleError, ScheduleKind, Transfer,
};
pub use simulate::{simulate, simulate_lists, SimError, Stuck, Timeline};

use self::executor::{StageClock, StageStep};
use self::placement::Placement;
use crate::comm::nccl::device::{AnyCollectives, OpenCollectives, SharedCollectives};
use crate::comm::{CommError, Communicator};
use crate::grad_sync::GradSync;
use crate::tensor::PartialGrads;

/// How the model is pipelined (`--pp-schedule`, `--pp-virtual`, `--pp-layers`);
/// the number of stages is the PP group's size.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    /// The schedule of a step's micro-batches.
    pub schedule: ScheduleKind,
    /// Model chunks per stage (`v`; 1 unless interleaved).
    pub chunks: usize,
    /// Blocks per virtual stage, in order; `None` splits evenly.
    pub layers: Option<Vec<usize>>,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            schedule: ScheduleKind::OneFOneB,
            chunks: 1,
            layers: None,
        }
    }
}

impl PipelineConfig {
    /// The blocks of every (virtual) stage of a model of `blocks` blocks
    /// over `stages` stages: what [`crate::train::Trainer::parallel`]
    /// places, and what a stage builds (see `ferrotron_models::ModelPart`).
    pub fn layout(&self, blocks: usize, stages: usize) -> Result<StageLayout, LayoutError> {
        StageLayout::new(
            blocks,
            stages,
            self.chunks,
            self.layers.as_deref(),
            self.schedule == ScheduleKind::Interleaved,
        )
    }
}

/// A pipeline that cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The split of the blocks.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The schedule.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// ZeRO-3 gathers units that a stage does not hold.
    #[error("--zero 3 with --pp {0}: ZeRO-3 shards whole-model units and cannot run on pipeline stages; use --zero 1 or 2")]
    Zero3(usize),
    /// Splitting the group of the first and last stage.
    #[error(transparent)]
    Comm(#[from] CommError),
}

/// This rank's stage of the pipeline (one stage holding everything
/// without pipeline parallelism).
pub(crate) struct Pipeline {
    layout: StageLayout,
    placement: Placement,
    schedule: ScheduleKind,
    pp: Arc<dyn Communicator>,
    /// Device collectives over `pp` ([`Pipeline::on_device`]).
    device: AnyCollectives,
    /// This stage's actions and the shape they are for: built by the first
    /// step and kept, as the schedule depends only on the shape (rebuilt
    /// only if a step brings another number of micro-batches).
    actions: Option<(PipeShape, Vec<Action>)>,
}

impl Pipeline {
    /// The stage of this rank of `pp` for `model` (whole). Collective over `pp`.
    pub(crate) fn new<B: Backend, M: LmUnits<B>>(
        model: &M,
        config: &PipelineConfig,
        pp: Arc<dyn Communicator>,
    ) -> Result<Self, PipelineError> {
        let layout = config.layout(model.num_blocks(), pp.world_size())?;
        let placement = Placement::new(model, &layout, pp.clone())?;
        Ok(Self {
            layout,
            placement,
            schedule: config.schedule,
            pp,
            device: AnyCollectives::none(),
            actions: None,
        })
    }

    /// Moves the pipeline's messages onto device collectives that `open`
    /// creates (a collective over the group it is given): the activations
    /// and their gradients between stages, in training and evaluation,
    /// over the PP group, and the tied parameters' gradient sum over the
    /// first and last stage (opened on those two only, after the PP
    /// group's). Returns whether anything moved: not on one stage.
    pub(crate) fn on_device<IB: Backend>(
        &mut self,
        open: &OpenCollectives<'_, IB>,
    ) -> Result<bool, CommError> {
        if self.stages() == 1 {
            return Ok(false);
        }
        self.device = AnyCollectives::new::<IB>(open(&*self.pp)?);
        self.placement.ends_on_device(open)?;
        Ok(true)
    }

    /// The device collectives over the PP group, if
    /// [`Pipeline::on_device`] opened them (for tensors of `IB`).
    pub(super) fn device<IB: Backend>(&self) -> Option<&SharedCollectives<IB>> {
        self.device.get::<IB>(&"the pipeline")
    }

    /// Stages `p`.
    pub(crate) fn stages(&self) -> usize {
        self.layout.stages()
    }

    /// `model` (whole) keeping only this stage's parameters.
    pub(crate) fn place<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: M,
        device: &B::Device,
    ) -> M {
        self.placement.place(model, device)
    }

    /// Whether this stage holds parameter `id`.
    pub(crate) fn holds(&self, id: ParamId) -> bool {
        self.placement.holds(id)
    }

    /// Whether `id` is the last stage's copy of a tied parameter.
    pub(crate) fn is_tied_copy(&self, id: ParamId) -> bool {
        self.placement.is_tied_copy(id)
    }

    /// The shape of parameter `id` (this rank's TP block), on whichever
    /// stage holds it.
    pub(crate) fn shape(&self, id: ParamId) -> &[usize] {
        self.placement.shape(id)
    }

    /// Replaces the recorded shapes of the parameters of `shapes`: on one
    /// stage only (a ZeRO-3 model of placeholders; ZeRO-3 refuses a
    /// pipeline).
    pub(crate) fn set_shapes(&mut self, shapes: &std::collections::HashMap<ParamId, Vec<usize>>) {
        assert_eq!(self.stages(), 1, "shapes are replaced on one stage only");
        self.placement.set_shapes(shapes);
    }

    /// Parameter `id` (flat, this rank's TP block) from the stage owning
    /// it, whose values `mine` are (collective over the PP group; on one
    /// stage, `mine` itself).
    pub(crate) fn broadcast_param(
        &self,
        id: ParamId,
        mine: Option<Vec<f32>>,
    ) -> Result<Vec<f32>, CommError> {
        if self.stages() == 1 {
            return Ok(mine.expect("one stage holds every parameter"));
        }
        self.placement.broadcast_param(id, mine)
    }

    /// The whole model from every stage's parameters (collective over the PP group).
    pub(crate) fn join<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        model: M,
        device: &B::Device,
    ) -> Result<M, CommError> {
        if self.stages() == 1 {
            return Ok(model);
        }
        self.placement.join(model, device)
    }

    /// Forward and backward of `micro_batches` through this stage on the
    /// schedule, each micro-batch's loss weighted `weight` in backward
    /// (`cp / micro_batches`: see `Trainer::step`); gradients go to
    /// `sync`. Returns the model, the sum of the
    /// micro-batches' mean losses, nats/token, and every stage's times
    /// (the same on every stage: collective over the PP group).
    pub(crate) fn step<B, M>(
        &mut self,
        sync: &mut dyn GradSync<B, M>,
        partial: &PartialGrads,
        model: M,
        micro_batches: &[Batch],
        weight: f64,
        device: &B::Device,
    ) -> Result<(M, f64, PipelineTimes), CommError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B> + LmUnits<B>,
    {
        let shape = PipeShape {
            stages: self.stages(),
            micro_batches: micro_batches.len(),
            chunks: self.layout.chunks(),
        };
        if self
            .actions
            .as_ref()
            .is_none_or(|(built, _)| *built != shape)
        {
            let actions = stage_actions(self.schedule, shape, self.pp.rank())
                .map_err(|e| CommError::Transport(format!("pipeline schedule: {e}")))?;
            self.actions = Some((shape, actions));
        }
        let (_, actions) = self.actions.as_ref().expect("built above");
        let (model, losses, clock) = StageStep {
            layout: &self.layout,
            shape,
            placement: &self.placement,
            pp: &*self.pp,
            device: &self.device,
            actions,
        }
        .run(sync, partial, model, micro_batches, weight, device)?;
        let times = self.gather_times(clock, shape)?;
        Ok((model, losses, times))
    }

    /// Every stage's `clock` of a step of `shape` (collective over the PP group).
    fn gather_times(
        &self,
        clock: StageClock,
        shape: PipeShape,
    ) -> Result<PipelineTimes, CommError> {
        let own = [clock.compute_s, clock.wait_s, clock.total_s].map(|t| t as f32);
        let mut all = vec![0.0; 3 * shape.stages];
        self.pp.all_gather(&own, &mut all)?;
        let column = |i: usize| -> Vec<f64> { all.chunks(3).map(|c| f64::from(c[i])).collect() };
        Ok(PipelineTimes::new(
            column(0),
            column(1),
            &column(2),
            shape.micro_batches,
            shape.chunks,
        ))
    }
}
