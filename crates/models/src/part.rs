//! Which part of the decoder one rank builds: its tensor-parallel block of
//! every parameter (the shard plan of `crate::tensor_parallel`) and the
//! units of its pipeline stage. [`crate::Decoder::new_part`] builds only
//! that part, drawing the same values the whole model has there (see
//! `crate::init`), so no rank ever materialises the whole model.

use std::collections::HashSet;

use ferrotron_engine::lm::LmUnit;
use ferrotron_parallel::pipeline::{LayoutError, StageLayout};
use ferrotron_parallel::tensor::{ShardError, ShardPlan, TpGroup};

use crate::config::ConfigError;

/// One rank's part of a model.
#[derive(Clone, Debug)]
pub struct ModelPart {
    /// How every parameter is split over `tp`.
    pub(crate) plan: ShardPlan,
    /// The TP group the part computes over.
    pub(crate) tp: TpGroup,
    /// The units built (`None`: all); the others are one-element
    /// placeholders, as `Trainer::parallel` keeps another stage's.
    units: Option<HashSet<LmUnit>>,
}

/// A part that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// The configuration (or the TP degree) does not fit the model.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A parameter the shard plan cannot cut.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The pipeline's split of the blocks.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A plan for another TP degree than the group's.
    #[error("a shard plan over {plan} ranks for a TP group of {group}")]
    Degree {
        /// The plan's TP degree.
        plan: usize,
        /// The group's size.
        group: usize,
    },
}

impl ModelPart {
    /// The whole model on one rank.
    pub fn whole() -> Self {
        Self {
            plan: ShardPlan::none(),
            tp: TpGroup::single(),
            units: None,
        }
    }

    /// This rank's block under `plan` (from
    /// [`crate::tensor_parallel::shard_plan`]) of every unit, computing
    /// over `tp` (with sequence parallelism when the plan has it).
    ///
    /// # Errors
    /// `plan` is for another TP degree than `tp`'s size.
    pub fn tensor_parallel(plan: ShardPlan, tp: TpGroup) -> Result<Self, PartError> {
        if plan.tp() != tp.size() {
            return Err(PartError::Degree {
                plan: plan.tp(),
                group: tp.size(),
            });
        }
        let tp = tp.with_sequence_parallel(plan.sequence_parallel());
        Ok(Self {
            plan,
            tp,
            units: None,
        })
    }

    /// The part restricted to the units stage `stage` of `layout` owns.
    pub fn on_stage(self, layout: &StageLayout, stage: usize) -> Self {
        Self {
            units: Some(layout.units(stage).into_iter().collect()),
            ..self
        }
    }

    /// Whether the part builds `unit`.
    pub fn holds(&self, unit: LmUnit) -> bool {
        self.units.as_ref().is_none_or(|u| u.contains(&unit))
    }
}
