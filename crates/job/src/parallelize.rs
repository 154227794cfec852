//! `parallelize`: how a model becomes a trainer on a mesh, in one readable
//! place and in torchtitan's order — tensor (and sequence) parallelism,
//! then recomputation, the pipeline split, and the gradient-sync strategy
//! (DDP or ZeRO) over the data-parallel group.
//!
//! ```no_run
//! use burn::backend::{Autodiff, Flex};
//! use ferrotron_job::{parallelize, JobConfig, World};
//! use ferrotron_models::Decoder;
//! use ferrotron_parallel::groups::ProcessGroups;
//!
//! let job = JobConfig::default()
//!     .validate(&World::SINGLE)
//!     .map_err(|e| anyhow::anyhow!("{e:?}"))?;
//! let device = Default::default();
//! let model = Decoder::<Autodiff<Flex>>::new(job.model(), 0, &device)?;
//! // One rank: no sharding, DDP over a group of one.
//! let trainer = parallelize(model, ProcessGroups::single(), &job, &device)?;
//! println!("recompute {}", trainer.recompute());
//! # Ok::<(), anyhow::Error>(())
//! ```

use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
use ferrotron_engine::precision::Precision;
use ferrotron_models::ops::TrainBackend;
use ferrotron_models::tensor_parallel::shard_plan;
use ferrotron_models::Decoder;
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::pipeline::PipelineConfig;
use ferrotron_parallel::tensor::TpGroup;
use ferrotron_parallel::train::loss_scale::LossScaleConfig;
use ferrotron_parallel::train::{ParallelConfig, StepConfig, Trainer};

use crate::validate::ValidJob;

/// The trainer of one rank: its part of the model under the job's layout,
/// with the optimizer and the gradient synchronisation.
pub type Parallelized<B> = Trainer<B, Decoder<B>>;

/// Applies the job's layout to `model` (the whole model, built or loaded on
/// this rank) over `groups`, in this order:
/// 1. tensor parallelism: the sharding plan of the decoder over the TP
///    group (with sequence parallelism when `parallelism.sp`); the plan is
///    built once and handed on, since the gradient sync needs it too;
/// 2. recomputation (`parallelism.recompute`, resolved by validation);
/// 3. the pipeline split over the PP group (stages, schedule, chunks);
/// 4. the gradient sync over the DP group: DDP buckets, or ZeRO 1/2/3,
///    reducing in `precision.reduce_dtype`, overlapped with backward
///    under `parallelism.overlap_grad_reduce`;
///
/// then the optimizer (AdamW with the job's schedule and clipping) and,
/// under fp16, dynamic loss scaling.
pub fn parallelize<B: TrainBackend>(
    model: Decoder<B>,
    groups: ProcessGroups,
    job: &ValidJob,
    device: &B::Device,
) -> anyhow::Result<Parallelized<B>> {
    let c = &job.config;
    let par = &c.parallelism;
    let shards = shard_plan(&job.model, job.mesh.tp, par.make_vocab_size_divisible_by)?
        .with_sequence_parallel(par.sp);
    let model = model.shard(&shards, TpGroup::new(groups.tp().clone()))?;
    let parallel = ParallelConfig {
        shards,
        recompute: job.recompute,
        pipeline: PipelineConfig {
            schedule: par.pp_schedule.into(),
            chunks: par.pp_virtual,
            layers: par.pp_layers.clone(),
        },
        zero: par.zero,
        bucket_mb: par.bucket_mb,
        reduce: c.precision.reduce_dtype,
        overlap_grad_reduce: par.overlap_grad_reduce,
    };
    let trainer = Trainer::parallel(model, step_config(job), device.clone(), groups, parallel)?;
    if job.model.precision != Precision::Fp16 {
        return Ok(trainer);
    }
    Ok(trainer.with_loss_scaling(LossScaleConfig {
        init: c.precision.loss_scale_init,
        window: c.precision.loss_scale_window,
    })?)
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
