//! One validation: [`JobConfig::validate`] owns every check of a job
//! (single keys, keys against each other, against the model, the world and
//! the files), reports all problems at once, one line each naming the key,
//! and returns the only thing [`crate::Job`] runs: a [`ValidJob`]. Nothing
//! is written before it passes.

mod fields;
mod inputs;
mod layout;
mod model;
mod output;

use std::path::PathBuf;

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::data::ShardSet;
use ferrotron_models::DecoderConfig;
use ferrotron_parallel::launch::LaunchInfo;
use ferrotron_parallel::mesh::Mesh;
use ferrotron_parallel::recompute::Recompute;

use crate::comm::Transport;
use crate::config::{JobConfig, Key};
use crate::error::ConfigError;
use crate::resume::Resume;

/// The launch a job runs in: world size, this rank, its local rank (the
/// launcher's variables: `mpirun`, `srun`, torchrun's).
pub type World = LaunchInfo;

/// Whether the job is checked for this machine (and may run here) or for
/// another one (the checks that look at this machine are left out).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Here {
    Yes,
    No,
}

/// The problems found so far.
#[derive(Default)]
pub(crate) struct Problems(pub(crate) Vec<ConfigError>);

impl Problems {
    /// A problem of `section.key`.
    /// Named `section.key: --flag PROBLEM`, so `problem` reads on from the
    /// flag (`must be positive, got 0`, `4: does not divide ...`).
    pub(crate) fn key(&mut self, section: &str, key: &str, problem: impl Into<String>) {
        let flag = Key::find(section, key).map_or_else(String::new, Key::flag);
        self.0.push(ConfigError {
            key: Some(format!("{section}.{key}")),
            subject: flag,
            problem: problem.into(),
        });
    }

    /// A problem of something that is not a single key (several keys, a
    /// file, the launch, the machine): `subject: problem`.
    pub(crate) fn other(&mut self, subject: impl Into<String>, problem: impl Into<String>) {
        self.0.push(ConfigError {
            key: None,
            subject: subject.into(),
            problem: problem.into(),
        });
    }
}

/// A job that passed [`JobConfig::validate`]: the configuration with its
/// defaults resolved (warm-up steps, run directory), and everything
/// validation resolved on the way (backend, mesh, model architecture,
/// shard set, MFU peak). Only validation makes one.
pub struct ValidJob {
    pub(crate) config: JobConfig,
    pub(crate) kind: BackendKind,
    pub(crate) transport: Transport,
    pub(crate) world: World,
    pub(crate) mesh: Mesh,
    pub(crate) model: DecoderConfig,
    pub(crate) recompute: Recompute,
    pub(crate) peak_flops: Option<f64>,
    pub(crate) out: PathBuf,
    pub(crate) shards: Option<ShardSet>,
    pub(crate) resume: Option<Resume>,
    pub(crate) notes: Vec<String>,
}

impl ValidJob {
    /// The resolved configuration (what the run directory's `config.toml` holds).
    pub fn config(&self) -> &JobConfig {
        &self.config
    }

    /// The model architecture the job trains (precision and kernels resolved).
    pub fn model(&self) -> &DecoderConfig {
        &self.model
    }

    /// The mesh: dp x pp x cp x tp ranks.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The backend the job computes on.
    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    /// The run directory.
    pub fn out(&self) -> &std::path::Path {
        &self.out
    }

    /// MFU's peak, FLOP/s: `metrics.peak_tflops`, or the data sheet of
    /// `metrics.device_type` for the run's precision; `None`: measured on
    /// the device at start-up.
    pub fn peak_flops(&self) -> Option<f64> {
        self.peak_flops
    }

    /// Warnings about a job that runs but wastes time (e.g. a 1F1B
    /// pipeline with fewer micro-batches than stages), one line each.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }
}

impl JobConfig {
    /// Checks everything about a new job in `world` and resolves it; every
    /// problem is returned, one [`ConfigError`] each, naming its key.
    pub fn validate(&self, world: &World) -> Result<ValidJob, Vec<ConfigError>> {
        validate(self.clone(), world, None, None, Here::Yes)
    }

    /// Every check of [`JobConfig::validate`] that does not look at this
    /// machine, for a job of `world_size` ranks meant for another one (a
    /// cluster's job file checked on a login node or in CI): not whether
    /// the backend's runtime or the NCCL library loads, not the memory,
    /// not the run directory's contents.
    pub fn check_portable(&self, world_size: usize) -> Result<(), Vec<ConfigError>> {
        let world = World {
            world_size,
            ..World::SINGLE
        };
        validate(self.clone(), &world, None, None, Here::No).map(|_| ())
    }

    /// [`JobConfig::validate`] for a job whose architecture the caller
    /// built (`bench train`'s shape flags): `model` replaces what
    /// `[model]` would resolve; every other check is the same.
    pub fn validate_for(
        &self,
        world: &World,
        model: DecoderConfig,
    ) -> Result<ValidJob, Vec<ConfigError>> {
        validate(self.clone(), world, None, Some(model), Here::Yes)
    }
}

impl Resume {
    /// Checks the run's configuration `config` (the run's own, with the
    /// flags given) as [`JobConfig::validate`] does, and that it continues
    /// this checkpoint: the model, the data and the global batch unchanged.
    pub fn validate(self, config: &JobConfig, world: &World) -> Result<ValidJob, Vec<ConfigError>> {
        validate(config.clone(), world, Some(self), None, Here::Yes)
    }
}

fn validate(
    mut config: JobConfig,
    world: &World,
    mut resume: Option<Resume>,
    explicit: Option<DecoderConfig>,
    here: Here,
) -> Result<ValidJob, Vec<ConfigError>> {
    let mut p = Problems::default();
    fields::check_fields(&config, &mut p);
    if let Some(r) = &mut resume {
        r.check(&config, &mut p);
    }
    let backend = layout::backend(&config, world, here, &mut p);
    let mesh = layout::mesh(&config, world, &mut p);
    if let (Some(r), Some(mesh)) = (&resume, &mesh) {
        r.check_global_batch(&config, mesh.dp, &mut p);
    }
    let shards = match here {
        Here::Yes => model::shards(&config, resume.as_ref(), &mut p),
        Here::No => None,
    };
    let model = match explicit {
        Some(model) => Some(model),
        None => model::architecture(&config, resume.as_ref(), shards.as_ref(), &mut p),
    };
    let mut notes = Vec::new();
    let sheet = layout::device_sheet(&config, &mut p);
    let out = output::run_dir(&config, world, resume.as_ref(), here, &mut p);
    let recompute = fields::recompute(&config);
    let (Some((kind, transport)), Some(mesh), Some(mut model), Some(out), Ok(recompute)) =
        (backend, mesh, model, out, recompute)
    else {
        return Err(p.0);
    };
    layout::check_with_model(&config, kind, &mesh, &mut model, &mut p, &mut notes);
    let peak_flops = layout::peak(&config, sheet, model.precision);
    if here == Here::Yes {
        // The estimate needs every setting it reads to be valid.
        if p.0.is_empty() {
            match layout::memory(&config, kind, &mesh, &model, recompute, world) {
                Ok(note) => notes.extend(note),
                Err(problem) => p.other("memory", problem),
            }
        }
        inputs::check_inputs(&config, resume.as_ref(), &model, &mut p);
    }
    let writer = here == Here::Yes && world.rank == 0;
    output::check_outputs(&config, &model, &out, writer, &mut p);
    if !p.0.is_empty() {
        return Err(p.0);
    }
    config.optimizer.warmup_steps = Some(config.warmup());
    config.checkpoint.out = Some(out.clone());
    Ok(ValidJob {
        config,
        kind,
        transport,
        world: *world,
        mesh,
        model,
        recompute,
        peak_flops,
        out,
        shards,
        resume,
        notes,
    })
}

impl JobConfig {
    /// Linear warm-up steps: `optimizer.warmup_steps`, or
    /// min([`DEFAULT_WARMUP_STEPS`], steps) when unset, so a short run
    /// warms up over its whole length instead of being refused.
    pub fn warmup(&self) -> usize {
        self.optimizer
            .warmup_steps
            .unwrap_or(DEFAULT_WARMUP_STEPS.min(self.schedule.steps))
    }

    /// Steps between complete checkpoints (0: none).
    pub fn save_every(&self) -> usize {
        self.checkpoint
            .save_every
            .unwrap_or(self.schedule.eval_every)
    }

    /// The goldfish loss's mask, when `data.goldfish_k` is set (valid after
    /// validation).
    pub fn goldfish(&self) -> Option<ferrotron_engine::data::Goldfish> {
        self.data.goldfish_k.map(|k| {
            ferrotron_engine::data::Goldfish::new(k, self.data.goldfish_context)
                .expect("validated by JobConfig::validate")
        })
    }

    /// The communicator timeout (valid after validation).
    pub fn comm_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.parallelism.comm_timeout_s)
    }
}

/// Warm-up steps when `optimizer.warmup_steps` is not set (and the run is
/// at least this long).
pub const DEFAULT_WARMUP_STEPS: usize = 20;
