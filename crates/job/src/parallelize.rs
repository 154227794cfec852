//! `parallelize`: how a model becomes a trainer on a mesh, in one readable
//! place and in torchtitan's order — tensor (and sequence) parallelism,
//! then recomputation, the pipeline split, and the gradient-sync strategy
//! (DDP or ZeRO) over the data-parallel group. A fresh model is built
//! already cut to the rank's part ([`build_part`]; under ZeRO-3 only the
//! rank's DP pieces of it, [`parallelize_fresh`]; a resumed ZeRO-3 rank
//! draws nothing, [`parallelize_to_load`]); a Hugging Face
//! model is read already cut ([`parallelize_hf_dir`], the same way);
//! whole weights loaded otherwise are cut here ([`parallelize`]).
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use ferrotron_job::{build_part, parallelize_part, JobConfig, World};
//! use ferrotron_parallel::groups::ProcessGroups;
//!
//! let job = JobConfig::default()
//!     .validate(&World::SINGLE)
//!     .map_err(|e| anyhow::anyhow!("{e:?}"))?;
//! let device = Default::default();
//! let groups = ProcessGroups::single();
//! // One rank: the whole model, DDP over a group of one.
//! let model = build_part::<Autodiff<Flex>>(&job, &groups, &device)?;
//! let trainer = parallelize_part(model, groups, &job, &device)?;
//! println!("recompute {}", trainer.recompute());
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::path::Path;

use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
use ferrotron_engine::precision::Precision;
use ferrotron_models::hf::{load_hf_part, HfError, HfPartSource};
use ferrotron_models::ops::{KernelBackend, TrainBackend};
use ferrotron_models::tensor_parallel::shard_plan;
use ferrotron_models::{Decoder, ModelPart};
use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::pipeline::PipelineConfig;
use ferrotron_parallel::tensor::{ShardPlan, TpGroup};
use ferrotron_parallel::train::loss_scale::LossScaleConfig;
use ferrotron_parallel::train::{ParallelConfig, StepConfig, Trainer};
use ferrotron_parallel::zero::{ParamSource, ToBeLoaded, ZeroStage, DEFAULT_ZERO3_PREFETCH};

use crate::comm::device_collectives;
use crate::config::Offload;

use crate::error::usage;
use crate::validate::ValidJob;

/// The trainer of one rank: its part of the model under the job's layout,
/// with the optimizer and the gradient synchronisation.
pub type Parallelized<B> = Trainer<B, Decoder<B>>;

/// This rank's part of the freshly initialised model of `job` on
/// `groups`: its TP block of every parameter and its pipeline stage's
/// units, drawn alone with the values the one-rank model has there
/// ([`Decoder::new_part`]), so no rank builds the whole model. Hand it to
/// [`parallelize_part`].
pub fn build_part<B: TrainBackend>(
    job: &ValidJob,
    groups: &ProcessGroups,
    device: &B::Device,
) -> anyhow::Result<Decoder<B>> {
    Ok(Decoder::new_part(
        &job.model,
        job.config.schedule.seed,
        device,
        &model_part::<B>(job, groups, device)?,
    )?)
}

/// This rank's trainer of the freshly initialised model of `job` on
/// `groups`: [`build_part`] then [`parallelize_part`]; under ZeRO-3 the
/// part is built of placeholders and the trainer draws only this rank's
/// DP pieces of it ([`Decoder::placeholder_part`]), the same values
/// without ever holding the whole TP part.
pub fn parallelize_fresh<B: TrainBackend>(
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    if job.config.parallelism.zero != ZeroStage::Three {
        let part = build_part::<B>(job, &groups, device)?;
        return parallelize_part(part, groups, job, device);
    }
    let seed = job.config.schedule.seed;
    let part = model_part::<B>(job, &groups, device)?;
    let (model, source) = Decoder::placeholder_part(&job.model, seed, device, &part)?;
    parallelize_with(model, Some(&source), groups, job, device)
}

/// This rank's trainer of the model of `job` on `groups` whose values a
/// checkpoint gives next (`Trainer::load`: a resumed run). Under ZeRO-3
/// its DP pieces are laid out from the part's shapes and start as zeros
/// ([`ToBeLoaded`]): nothing is drawn only to be overwritten. Other
/// stages draw the part as [`parallelize_fresh`] does (their replicated
/// and bucketed layouts need the part's tensors).
pub fn parallelize_to_load<B: TrainBackend>(
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    if job.config.parallelism.zero != ZeroStage::Three {
        return parallelize_fresh(groups, job, device);
    }
    let seed = job.config.schedule.seed;
    let part = model_part::<B>(job, &groups, device)?;
    let (model, source) = Decoder::placeholder_part(&job.model, seed, device, &part)?;
    parallelize_with(model, Some(&ToBeLoaded(&source)), groups, job, device)
}

/// This rank's part of the Hugging Face model in `dir` (`model.hf_dir`,
/// checked by `read_hf_dir`) under the job's layout: its TP block of every
/// parameter of its pipeline stage, read alone from the memory-mapped
/// weight files ([`load_hf_part`]); no rank reads the whole model. Hand it
/// to [`parallelize_part`].
pub fn load_hf_dir_part<B: TrainBackend>(
    dir: &Path,
    job: &ValidJob,
    groups: &ProcessGroups,
    device: &B::Device,
) -> anyhow::Result<Decoder<B>> {
    let part = model_part::<B>(job, groups, device)?;
    load_hf_part::<B>(dir, &job.model, &part, device).map_err(|e| hf_error(dir, e))
}

/// This rank's trainer of the Hugging Face model in `dir`:
/// [`load_hf_dir_part`] then [`parallelize_part`]; under ZeRO-3 the part
/// is placeholders and the trainer reads only this rank's DP pieces of the
/// mapped files ([`HfPartSource`]).
pub fn parallelize_hf_dir<B: TrainBackend>(
    dir: &Path,
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    if job.config.parallelism.zero != ZeroStage::Three {
        let part = load_hf_dir_part::<B>(dir, job, &groups, device)?;
        return parallelize_part(part, groups, job, device);
    }
    let part = model_part::<B>(job, &groups, device)?;
    let (model, source) =
        HfPartSource::open::<B>(dir, &job.model, &part, device).map_err(|e| hf_error(dir, e))?;
    parallelize_with(model, Some(&source), groups, job, device)
}

/// A Hugging Face directory that cannot be read: bad input (exit 2).
fn hf_error(dir: &Path, e: HfError) -> anyhow::Error {
    usage(format!("--hf-dir {}: {e}", dir.display()))
}

/// The part of the model this rank builds: its TP block and its stage.
fn model_part<B: TrainBackend>(
    job: &ValidJob,
    groups: &ProcessGroups,
    device: &B::Device,
) -> anyhow::Result<ModelPart> {
    let layout = pipeline_config(job).layout(job.model.n_layers, groups.pp().world_size())?;
    Ok(
        ModelPart::tensor_parallel(tp_plan(job)?, tp_group::<B>(job, groups, device)?)?
            .on_stage(&layout, groups.pp().rank()),
    )
}

/// This rank's TP group. Under an NCCL transport its collectives take
/// the activations and their gradients themselves (NCCL on the device
/// buffers, in the compute dtype): a collective over the TP group, which
/// opens their communicator.
fn tp_group<B: TrainBackend>(
    job: &ValidJob,
    groups: &ProcessGroups,
    device: &B::Device,
) -> anyhow::Result<TpGroup> {
    let group = TpGroup::new(groups.tp().clone());
    match job.transport.nccl() {
        Some((lib, gpu)) if group.size() > 1 => {
            let tp = &**groups.tp();
            let collectives = device_collectives::<B::InnerBackend>(lib, gpu, device, tp)?;
            Ok(group.with_device(collectives))
        }
        _ => Ok(group),
    }
}

/// `part`, whose ring runs on the device tensors under an NCCL transport
/// with `parallelism.cp > 1`: a collective over the CP group, which opens
/// its communicator (after the TP group's, before the DP x CP group's and
/// the pipeline's, on every rank).
fn ring_on_device<B: TrainBackend>(
    part: Decoder<B>,
    groups: &ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Decoder<B>> {
    match job.transport.nccl() {
        Some((lib, gpu)) if groups.cp().world_size() > 1 => {
            let cp = &**groups.cp();
            let collectives = device_collectives::<B::InnerBackend>(lib, gpu, device, cp)?;
            Ok(part.with_ring_on_device(collectives))
        }
        _ => Ok(part),
    }
}

/// Applies the job's layout to `model` (the whole model, loaded on this
/// rank) over `groups`: cuts it over the TP group with the decoder's
/// sharding plan (with sequence parallelism when `parallelism.sp`), then
/// [`parallelize_part`].
pub fn parallelize<B: TrainBackend>(
    model: Decoder<B>,
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    let part = model.shard(&tp_plan(job)?, tp_group::<B>(job, &groups, device)?)?;
    parallelize_part(part, groups, job, device)
}

/// Applies the rest of the job's layout to `part` (this rank's TP part of
/// the model: [`build_part`], or a whole model cut by [`parallelize`]) over
/// `groups`, in this order:
/// 1. tensor parallelism: the sharding plan of the decoder over the TP
///    group, which the gradient sync needs too; context parallelism: the
///    decoder's attention and loss over the CP group
///    ([`Decoder::with_context_parallel`]);
/// 2. recomputation (`parallelism.recompute`, resolved by validation);
/// 3. the pipeline split over the PP group (stages, schedule, chunks);
/// 4. the gradient sync over the DP x CP group: DDP buckets, or ZeRO 1/2/3,
///    reducing in `precision.reduce_dtype`, overlapped with backward
///    under `parallelism.overlap_grad_reduce` (ZeRO-3 gathering
///    `parallelism.zero3_prefetch` blocks ahead);
///
/// then the optimizer (AdamW with the job's schedule and clipping; on the
/// CubeCL backends its one-kernel update, `KernelBackend::fused_adamw`)
/// and, under fp16, dynamic loss scaling.
pub fn parallelize_part<B: TrainBackend>(
    part: Decoder<B>,
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    parallelize_with(part, None, groups, job, device)
}

/// [`parallelize_part`], with the values of a `part` of placeholders
/// drawn from `source` (ZeRO-3).
fn parallelize_with<B: TrainBackend>(
    part: Decoder<B>,
    source: Option<&dyn ParamSource>,
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    let c = &job.config;
    let par = &c.parallelism;
    anyhow::ensure!(
        part.tp_degree() == job.mesh.tp,
        "the model is split over {} TP ranks, the job over {}",
        part.tp_degree(),
        job.mesh.tp
    );
    let part = ring_on_device::<B>(
        part.with_context_parallel(groups.cp().clone())?,
        &groups,
        job,
        device,
    )?;
    let tp = part.tp_group().clone();
    let parallel = ParallelConfig {
        shards: tp_plan(job)?,
        recompute: job.recompute,
        pipeline: pipeline_config(job),
        zero: par.zero,
        bucket_mb: par.bucket_mb,
        reduce: c.precision.reduce_dtype,
        overlap_grad_reduce: par.overlap_grad_reduce,
        zero3_prefetch: par.zero3_prefetch.unwrap_or(DEFAULT_ZERO3_PREFETCH),
        offload_optimizer: par.offload == Offload::Optimizer,
    };
    let (step, owned) = (step_config(job), device.clone());
    let mut trainer = match source {
        Some(source) => Trainer::parallel_from_source(part, source, step, owned, groups, parallel)?,
        None => Trainer::parallel(part, step, owned, groups, parallel)?,
    };
    // One AdamW kernel per parameter on the CubeCL backends.
    trainer.use_fused_adamw(<B::InnerBackend as KernelBackend>::fused_adamw());
    // NCCL's gradient reductions, ZeRO's parameter gathers, the pipeline's
    // messages and SP's partial-gradient sums take the tensors themselves
    // (the last on the TP group's communicator, which the layers opened).
    if let Some((lib, gpu)) = job.transport.nccl() {
        let open = |group: &dyn Communicator| {
            device_collectives::<B::InnerBackend>(lib, gpu, device, group)
        };
        trainer.sync_on_device(open)?;
        trainer.pipeline_on_device(&open)?;
        trainer.partial_grads_on(tp);
    }
    if job.model.precision != Precision::Fp16 {
        return Ok(trainer);
    }
    Ok(trainer.with_loss_scaling(LossScaleConfig {
        init: c.precision.loss_scale_init,
        window: c.precision.loss_scale_window,
    }))
}

/// The decoder's TP sharding plan for the job (`parallelism.tp`, the
/// vocabulary padding and `parallelism.sp`).
fn tp_plan(job: &ValidJob) -> anyhow::Result<ShardPlan> {
    let par = &job.config.parallelism;
    Ok(
        shard_plan(&job.model, job.mesh.tp, par.make_vocab_size_divisible_by)?
            .with_sequence_parallel(par.sp),
    )
}

/// The job's pipeline: schedule, chunks per stage and blocks per stage.
fn pipeline_config(job: &ValidJob) -> PipelineConfig {
    let par = &job.config.parallelism;
    PipelineConfig {
        schedule: par.pp_schedule.into(),
        chunks: par.pp_virtual,
        layers: par.pp_layers.clone(),
    }
}

/// AdamW, the warm-up + cosine schedule and the clipping of the job.
fn step_config(job: &ValidJob) -> StepConfig {
    let o = &job.config.optimizer;
    StepConfig {
        adamw: AdamWConfig {
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.eps,
            weight_decay: o.weight_decay,
        },
        schedule: LrSchedule {
            max_lr: o.lr,
            min_lr: o.min_lr,
            warmup_steps: job.config.warmup(),
            total_steps: job.config.schedule.steps,
        },
        grad_clip: o.grad_clip,
    }
}
