//! `--pp`, `--pp-schedule`, `--pp-virtual`, `--pp-layers`: the schedule
//! choice and the checks made before anything is written.

use serde::{Deserialize, Serialize};

use ferrotron_models::DecoderConfig;
use ferrotron_parallel::mesh::Mesh;
use ferrotron_parallel::pipeline::{
    stage_actions, PipeShape, PipelineConfig, ScheduleKind, StageLayout,
};
use ferrotron_parallel::zero::ZeroStage;

use crate::error::usage;
use crate::settings::TrainSettings;

/// `--pp-schedule`: how a step's micro-batches flow through the stages.
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
    /// 1F1B over `--pp-virtual` chunks per stage: the bubble shrinks by that factor.
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

/// The pipeline of the run's settings (meaningful when `--pp` is above 1).
pub fn pipeline_config(s: &TrainSettings) -> PipelineConfig {
    PipelineConfig {
        schedule: s.pp_schedule.into(),
        chunks: s.pp_virtual,
        layers: s.pp_layers.clone(),
    }
}

/// Refuses a pipeline that cannot run `model` (exit 2, naming the flag),
/// and reports through `say` a schedule that runs but wastes most of the
/// step (1F1B with fewer micro-batches than stages).
pub fn check_pipeline(
    model: &DecoderConfig,
    s: &TrainSettings,
    mesh: &Mesh,
    say: &mut dyn FnMut(&str),
) -> anyhow::Result<()> {
    let kind = ScheduleKind::from(s.pp_schedule);
    if mesh.pp == 1 {
        if s.pp_virtual != 1 || s.pp_layers.is_some() {
            return Err(usage(
                "--pp-virtual and --pp-layers need --pp above 1 (they split the model into pipeline stages)",
            ));
        }
        return Ok(());
    }
    if s.zero == ZeroStage::Three {
        return Err(usage(format!(
            "--zero 3 with --pp {}: ZeRO-3 shards whole-model units and cannot run on pipeline stages; use --zero 1 or 2",
            mesh.pp
        )));
    }
    let shape = PipeShape {
        stages: mesh.pp,
        micro_batches: s.grad_accum,
        chunks: s.pp_virtual,
    };
    stage_actions(kind, shape, 0).map_err(|e| usage(format!("--pp-schedule: {e}")))?;
    let interleaved = kind == ScheduleKind::Interleaved;
    StageLayout::new(
        model.n_layers,
        mesh.pp,
        s.pp_virtual,
        s.pp_layers.as_deref(),
        interleaved,
    )
    .map_err(|e| usage(e.to_string()))?;
    if kind == ScheduleKind::OneFOneB && s.grad_accum < mesh.pp {
        say(&format!(
            "warning: --grad-accum {} < --pp {}: 1F1B runs, but most of each step is pipeline bubble ((pp-1)/m = {:.0}%); use --grad-accum {} or more",
            s.grad_accum,
            mesh.pp,
            100.0 * (mesh.pp - 1) as f64 / s.grad_accum as f64,
            mesh.pp
        ));
    }
    Ok(())
}
