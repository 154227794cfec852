//! The training step: a micro-batch schedule composed with a
//! gradient-synchronisation strategy, then the optimizer update.

use std::collections::HashMap;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::TensorData;
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::{CausalLm, LmUnit, LmUnits};
use ferrotron_engine::metrics::{GradCommTimes, MemoryBytes, PipelineTimes};
use ferrotron_engine::optim::{clip_factor, AdamW, AdamWConfig, FusedAdamW, LrSchedule};
use ferrotron_engine::params::{named_tensors, param_names};
use ferrotron_engine::precision::Precision;
use serde::{Deserialize, Serialize};

use super::loss_scale::{LossScaleConfig, LossScaler, ScaleOutcome};
use super::test_faults;
use crate::comm::nccl::device::{OpenCollectives, SharedCollectives};
use crate::comm::{CommError, Communicator};
use crate::ddp::{bucket_elems, Ddp, DEFAULT_BUCKET_MB};
use crate::flat::param_infos;
use crate::grad_sync::norm::{global_norm, group_sum, NormShares};
use crate::grad_sync::{GradSync, Synced};
use crate::groups::ProcessGroups;
use crate::micro_batch::{unit_by_unit, whole_graph};
use crate::pipeline::{Pipeline, PipelineConfig, PipelineError};
use crate::recompute::{Recompute, RecomputeError};
use crate::tensor::{PartialGrads, ShardError, ShardPlan, TpGroup};
use crate::zero::{
    ParamSource, SourceError, UnknownParam, Zero, ZeroStage, DEFAULT_ZERO3_PREFETCH,
};

/// How optimizer steps are taken.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepConfig {
    /// AdamW hyper-parameters.
    pub adamw: AdamWConfig,
    /// Learning-rate schedule over optimizer steps.
    pub schedule: LrSchedule,
    /// Clip the global gradient norm to this value (0 disables clipping).
    pub grad_clip: f64,
}

/// How the training state is spread over the process groups.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelConfig {
    /// What is sharded over the DP group (`--zero`).
    pub zero: ZeroStage,
    /// Size of DDP's all-reduce buckets and of ZeRO-1/2's units, MiB of f32.
    pub bucket_mb: f64,
    /// How the model given to the trainer is split over the TP group (the
    /// plan it was sharded with; [`ShardPlan::none`] without TP).
    pub shards: ShardPlan,
    /// How the model is split over the PP group (unused on one stage).
    pub pipeline: PipelineConfig,
    /// What backward recomputes (applied after TP, before ZeRO). ZeRO-3
    /// always recomputes whole blocks, so `None` under it runs as `Full`;
    /// `Selective` under ZeRO-3 and `Full` on a pipeline are refused.
    pub recompute: Recompute,
    /// The precision gradients are reduced in over the DP group
    /// (`--reduce-dtype`): f32, or rounded to bf16 before and after the
    /// collective (see `crate::ddp`); the accumulation stays f32.
    pub reduce: Precision,
    /// Overlap the DP group's gradient reduction (and ZeRO-3's gathers)
    /// with compute, and ZeRO-1/2's all-gathers of the updated chunks
    /// with the update (`--overlap-grad-reduce`): honoured where the DP group
    /// is the only group of more than one rank (no TP, CP or PP), since
    /// MPI allows one thread in it at a time; elsewhere the step runs
    /// without overlap. The results are bit-identical either way.
    pub overlap_grad_reduce: bool,
    /// ZeRO-3 with overlap: blocks whose all-gathers start ahead, while the
    /// current block computes (`--zero3-prefetch`; 0: none). At most this
    /// many + 1 blocks are gathered at once. Ignored by the other stages
    /// and without overlap.
    pub zero3_prefetch: usize,
    /// AdamW's state (and under ZeRO-3 the f32 parameter pieces) in host
    /// memory, updated on the CPU (`--offload optimizer`; see
    /// [`Zero::set_offload`]). Needs ZeRO stage 1, 2 or 3: each rank
    /// offloads its shard.
    pub offload_optimizer: bool,
}

impl Default for ParallelConfig {
    fn default() -> Self {
        Self {
            zero: ZeroStage::Off,
            bucket_mb: DEFAULT_BUCKET_MB,
            shards: ShardPlan::none(),
            pipeline: PipelineConfig::default(),
            recompute: Recompute::None,
            reduce: Precision::Fp32,
            overlap_grad_reduce: true,
            zero3_prefetch: DEFAULT_ZERO3_PREFETCH,
            offload_optimizer: false,
        }
    }
}

/// A trainer that cannot be built from its model and configuration.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The tensor-parallel plan does not fit the model.
    #[error(transparent)]
    Shards(#[from] ShardError),
    /// The pipeline does not fit the model or the ZeRO stage.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// The recomputation does not fit the pipeline or the ZeRO stage.
    #[error(transparent)]
    Recompute(#[from] RecomputeError),
    /// The gradient sync's communication thread could not start.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A model of placeholders with a ZeRO stage that keeps whole
    /// parameters (only stage 3 draws its pieces from a source).
    #[error("a model of placeholders needs ZeRO stage 3, not {0}")]
    SourceStage(ZeroStage),
    /// A parameter the source of a model of placeholders does not know.
    #[error(transparent)]
    Unknown(#[from] UnknownParam),
    /// Optimizer offload without ZeRO: there is no shard to offload.
    #[error("optimizer offload needs ZeRO stage 1, 2 or 3 (each rank offloads its shard), not 0")]
    OffloadWithoutZero,
}

impl From<SourceError> for BuildError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Unknown(u) => Self::Unknown(u),
            SourceError::Comm(c) => Self::Comm(c),
        }
    }
}

/// What one optimizer step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutput {
    /// Mean loss over the step's micro-batches (of every DP rank), nats/token.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens in the step (all micro-batches of every DP rank: the global batch).
    pub tokens: usize,
    /// The loss or the gradient norm was not finite, so the update was not
    /// applied (the model and optimizer state are those before the step).
    pub skipped: bool,
    /// Stage times and the measured bubble (pipeline parallelism only).
    pub pipeline: Option<PipelineTimes>,
    /// The step was skipped because its loss-scaled gradients overflowed
    /// (the scale was halved): expected under fp16, not an error.
    pub overflow: bool,
    /// Under loss scaling: the scale this step's loss was multiplied by.
    pub loss_scale: Option<f64>,
    /// Under loss scaling: steps skipped for overflow since the run began.
    pub skipped_steps: Option<usize>,
    /// The gradient sync's communication over the DP group and the time
    /// the step waited for it (more than one DP rank only).
    pub grad_comm: Option<GradCommTimes>,
}

/// The shape of every parameter of `model`, by id.
fn param_shapes<B: burn::tensor::backend::Backend, M: burn::module::Module<B>>(
    model: &M,
) -> HashMap<burn::module::ParamId, Vec<usize>> {
    param_infos(model)
        .into_iter()
        .map(|(id, shape, _)| (id, shape))
        .collect()
}

/// The shape `source` gives every parameter of `model` (placeholders), by id.
fn source_shapes<B: burn::tensor::backend::Backend, M: burn::module::Module<B>>(
    model: &M,
    source: &dyn ParamSource,
) -> Result<HashMap<burn::module::ParamId, Vec<usize>>, UnknownParam> {
    param_names(model)
        .into_iter()
        .map(|(id, name)| match source.shape(&name) {
            Some(shape) => Ok((id, shape)),
            None => Err(UnknownParam(name)),
        })
        .collect()
}

/// Owns the model and optimizer state of one training run (of this rank).
///
/// A one-rank run is the same code with every group of one rank.
pub struct Trainer<B: AutodiffBackend, M: AutodiffModule<B> + LmUnits<B>> {
    pub(super) model: Option<M>,
    pub(super) optimizer: AdamW<B::InnerBackend>,
    config: StepConfig,
    pub(super) steps_done: usize,
    pub(super) device: B::Device,
    pub(super) groups: ProcessGroups,
    pub(super) stage: ZeroStage,
    pub(super) sync: Box<dyn GradSync<B, M>>,
    pub(super) shards: ShardPlan,
    pub(super) pipeline: Pipeline,
    /// The shape of each parameter as this rank's model holds it (its TP
    /// block; placeholders for other stages' parameters), before ZeRO-3
    /// replaced them by placeholders.
    pub(super) shapes: HashMap<burn::module::ParamId, Vec<usize>>,
    /// Model chunks per pipeline stage (`--pp-virtual`).
    pub(super) chunks: usize,
    norm_shares: NormShares,
    partial: PartialGrads,
    memory: MemoryBytes,
    recompute: Recompute,
    pub(super) scaler: Option<LossScaler>,
    /// AdamW's state lives in host memory (`--offload optimizer`).
    pub(super) offloaded: bool,
    /// Whether the gradient sync's collectives run on device collectives
    /// ([`Trainer::sync_on_device`]).
    on_device: bool,
}

impl<B, M> Trainer<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B> + 'static,
    M::InnerModule: CausalLm<B::InnerBackend>,
{
    /// A one-rank trainer for `model` on `device`, with fresh optimizer state.
    pub fn new(model: M, config: StepConfig, device: B::Device) -> Self {
        let one_rank = Self::parallel(
            model,
            config,
            device,
            ProcessGroups::single(),
            ParallelConfig::default(),
        );
        match one_rank {
            Ok(trainer) => trainer,
            Err(e) => unreachable!("without tensor parallelism nothing is sharded: {e}"),
        }
    }

    /// This rank's trainer in the job of `groups`: its replica (or, under
    /// ZeRO-3, shard) of `model`, trained over the DP group with
    /// `parallel`'s sharding. `model` is this rank's TP part under
    /// `parallel.shards` of the same model on every rank (same seed or
    /// same checkpoint), possibly built with placeholders for the other
    /// pipeline stages' tensors (tensor parallelism comes first, then the
    /// pipeline keeps this stage's parameters, then ZeRO, in torchtitan's
    /// order). Collective over the PP group.
    ///
    /// # Errors
    /// A parameter of `model` that `parallel.shards` does not name; a
    /// pipeline that does not fit the model, or ZeRO-3 with one; full
    /// recomputation on a pipeline, selective under ZeRO-3.
    pub fn parallel(
        model: M,
        config: StepConfig,
        device: B::Device,
        groups: ProcessGroups,
        parallel: ParallelConfig,
    ) -> Result<Self, BuildError> {
        Self::build(model, None, config, device, groups, parallel)
    }

    /// [`Trainer::parallel`] under ZeRO-3 for `model`, this rank's TP part
    /// built of placeholders: every parameter's shape and this rank's
    /// pieces of it come from `source` ([`Zero::from_source`]), so the
    /// rank materialises only its DP share of its part. The trainer equals
    /// the one [`Trainer::parallel`] makes of the part `source` describes.
    ///
    /// # Errors
    /// As [`Trainer::parallel`]; `parallel.zero` is not stage 3; a
    /// parameter `source` does not know.
    pub fn parallel_from_source(
        model: M,
        source: &dyn ParamSource,
        config: StepConfig,
        device: B::Device,
        groups: ProcessGroups,
        parallel: ParallelConfig,
    ) -> Result<Self, BuildError> {
        if parallel.zero != ZeroStage::Three {
            return Err(BuildError::SourceStage(parallel.zero));
        }
        Self::build(model, Some(source), config, device, groups, parallel)
    }

    /// [`Trainer::parallel`], with the parameters drawn from `source`
    /// (ZeRO-3 only) when the model is placeholders.
    fn build(
        model: M,
        source: Option<&dyn ParamSource>,
        config: StepConfig,
        device: B::Device,
        groups: ProcessGroups,
        parallel: ParallelConfig,
    ) -> Result<Self, BuildError> {
        let pp = groups.pp().clone();
        if parallel.offload_optimizer && parallel.zero == ZeroStage::Off {
            return Err(BuildError::OffloadWithoutZero);
        }
        if pp.world_size() > 1 && parallel.zero == ZeroStage::Three {
            return Err(PipelineError::Zero3(pp.world_size()).into());
        }
        let recompute = match (parallel.recompute, parallel.zero) {
            (Recompute::Full, _) if pp.world_size() > 1 => {
                return Err(RecomputeError::Pipeline {
                    stages: pp.world_size(),
                }
                .into())
            }
            (Recompute::Selective, ZeroStage::Three) => return Err(RecomputeError::Zero3.into()),
            (_, ZeroStage::Three) => Recompute::Full,
            (r, _) => r,
        };
        // Recomputation comes after TP (the model is already split) and
        // before ZeRO: the model's part of it is selective.
        let model = model.with_attention_recompute(recompute == Recompute::Selective);
        let mut pipeline = Pipeline::new(&model, &parallel.pipeline, pp)?;
        let model = pipeline.place(model, &device);
        let mut norm_shares = NormShares::new();
        let mut partial = std::collections::HashSet::new();
        if parallel.shards.tp() > 1 {
            for (id, name) in param_names(&model) {
                norm_shares.insert(id, parallel.shards.norm_share(&name)?);
                if parallel.shards.partial_gradient(&name)? {
                    partial.insert(id);
                }
            }
        }
        for (id, _) in param_names(&model) {
            // The last stage's copy of a tied embedding counts on stage 0.
            if pipeline.is_tied_copy(id) {
                norm_shares.insert(id, 0.0);
            }
        }
        let partial = PartialGrads::new(partial, TpGroup::new(groups.tp().clone()));
        // The ranks of a CP ring hold the same parameters, each its
        // tokens' share of their gradients: the sync runs over DP x CP.
        let dp = test_faults::slowed(groups.dp_cp().clone());
        let buckets = bucket_elems(parallel.bucket_mb);
        let shapes = match source {
            Some(source) => {
                // The placeholders' shapes are not their parameters'.
                let shapes = source_shapes(&model, source)?;
                pipeline.set_shapes(&shapes);
                shapes
            }
            None => param_shapes(&model),
        };
        let only_dp = [groups.tp(), groups.cp(), groups.pp()]
            .iter()
            .all(|g| g.world_size() == 1);
        let overlap = parallel.overlap_grad_reduce && only_dp;
        let (sync, model): (Box<dyn GradSync<B, M>>, M) = match (parallel.zero, source) {
            (ZeroStage::Off, _) => (
                Box::new(Ddp::new(&model, dp, buckets, parallel.reduce, overlap)?),
                model,
            ),
            (ZeroStage::Three, Some(source)) => {
                let (mut zero, model) =
                    Zero::from_source(model, source, dp, device.clone(), parallel.reduce, overlap)?;
                zero.set_prefetch(parallel.zero3_prefetch);
                zero.set_offload(parallel.offload_optimizer);
                (Box::new(zero), model)
            }
            (stage, _) => {
                let (mut zero, model) = Zero::new(
                    stage,
                    model,
                    dp,
                    buckets,
                    device.clone(),
                    parallel.reduce,
                    overlap,
                )?;
                zero.set_prefetch(parallel.zero3_prefetch);
                zero.set_offload(parallel.offload_optimizer);
                (Box::new(zero), model)
            }
        };
        Ok(Self {
            model: Some(model),
            optimizer: AdamW::new(config.adamw),
            config,
            steps_done: 0,
            device,
            groups,
            stage: parallel.zero,
            sync,
            shards: parallel.shards,
            pipeline,
            shapes,
            chunks: parallel.pipeline.chunks,
            norm_shares,
            partial,
            memory: MemoryBytes::default(),
            recompute,
            scaler: None,
            offloaded: parallel.offload_optimizer,
            on_device: false,
        })
    }

    /// What backward recomputes: the configured choice, `Full` under ZeRO-3.
    pub fn recompute(&self) -> Recompute {
        self.recompute
    }

    /// The trainer with dynamic loss scaling (fp16 training; see
    /// [`super::loss_scale`]). Every layout scales alike: the scale rides
    /// in the step's loss weight, which the pipeline's last stage and
    /// each rank of a CP ring apply to their loss, and the overflow check
    /// is the global gradient norm, summed over DP x CP, the pipeline
    /// stages and the TP group, so one rank's non-finite gradient makes
    /// every rank skip the step.
    pub fn with_loss_scaling(mut self, config: LossScaleConfig) -> Self {
        self.scaler = Some(LossScaler::new(config));
        self
    }

    /// Runs the gradient sync's collectives (DDP and ZeRO-1's all-reduces,
    /// ZeRO-2 and 3's reduce-scatters, ZeRO's parameter all-gathers) on
    /// the collectives that `open` creates over the DP x CP group (NCCL on
    /// the tensors' device buffers, [`crate::comm::nccl::device`]) instead
    /// of the group's host path; `open` is a collective over that group.
    /// Returns whether the trainer syncs there: not on a group of one rank
    /// (nothing to sync, and `open` is not called). The TP, CP and
    /// pipeline messages stay on their groups' host paths.
    ///
    /// # Errors
    /// What `open` returns.
    pub fn sync_on_device(
        &mut self,
        open: impl FnOnce(&dyn Communicator) -> Result<SharedCollectives<B::InnerBackend>, CommError>,
    ) -> Result<bool, CommError> {
        let group = self.groups.dp_cp();
        if group.world_size() == 1 {
            return Ok(false);
        }
        self.on_device = self.sync.sync_on_device(open(&**group)?);
        Ok(self.on_device)
    }

    /// Whether the gradient sync's collectives run on device collectives
    /// ([`Trainer::sync_on_device`]).
    pub fn syncs_on_device(&self) -> bool {
        self.on_device
    }

    /// Updates the parameters (DDP's replicas and ZeRO's shards alike)
    /// with `update`, the backend's one-pass AdamW kernel
    /// ([`AdamW::use_fused`]); `None` keeps Burn's tensor operations (or
    /// flex's host pass). The optimizer state offloaded to host memory is
    /// updated on the host either way.
    pub fn use_fused_adamw(&mut self, update: Option<FusedAdamW<B::InnerBackend>>) {
        self.optimizer.use_fused(update);
    }

    /// Parameter updates that ran the fused AdamW kernel so far
    /// ([`Trainer::use_fused_adamw`], [`AdamW::fused_updates`]).
    pub fn fused_adamw_updates(&self) -> u64 {
        self.optimizer.fused_updates()
    }

    /// Runs the pipeline's messages on the device collectives that `open`
    /// creates: the activations and their gradients between stages (in
    /// training and evaluation) over the PP group, and the tied
    /// embedding's gradient sum over the first and last stage (opened
    /// after the PP group's, on those two stages only). Returns whether
    /// they moved: not on one stage.
    ///
    /// # Errors
    /// What `open` returns.
    pub fn pipeline_on_device(
        &mut self,
        open: &OpenCollectives<'_, B::InnerBackend>,
    ) -> Result<bool, CommError> {
        self.pipeline.on_device(open)
    }

    /// Sums sequence parallelism's partial gradients (the norms' and the
    /// row-parallel biases', [`PartialGrads`]) over `tp` in place of the
    /// TP group's host path: the group the model's layers hold, with their
    /// device collectives ([`TpGroup::with_device`]), so no second
    /// communicator is opened.
    ///
    /// # Panics
    /// If `tp` is not over as many ranks as the trainer's TP group (a
    /// caller bug).
    pub fn partial_grads_on(&mut self, tp: TpGroup) {
        assert_eq!(
            (tp.rank(), tp.size()),
            (self.groups.tp().rank(), self.groups.tp().world_size()),
            "{tp:?} is not the trainer's TP group"
        );
        self.partial.set_group(tp);
    }

    /// The ZeRO stage in use.
    pub fn zero_stage(&self) -> ZeroStage {
        self.stage
    }

    /// The process groups the trainer runs on.
    pub fn groups(&self) -> &ProcessGroups {
        &self.groups
    }

    /// Optimizer steps taken.
    pub fn steps_done(&self) -> usize {
        self.steps_done
    }

    /// Training state this rank held at the last optimizer step, measured
    /// on the tensors themselves (all zero before the first step).
    pub fn memory(&self) -> MemoryBytes {
        self.memory
    }

    /// Training state this rank will hold once training runs, from the
    /// parameter layout: what [`Trainer::memory`] reports after a step,
    /// up to the padding of the last chunk of each unit (f32 state).
    pub fn planned_memory(&self) -> MemoryBytes {
        self.sync.planned_memory(self.held_model())
    }

    pub(super) fn held_model(&self) -> &M {
        self.model
            .as_ref()
            .expect("the model is always present between steps")
    }

    /// The whole model (this rank's TP blocks). Under ZeRO-3 its
    /// parameters are all-gathered from every DP rank, and under pipeline
    /// parallelism broadcast from every stage, so every rank must call
    /// this at the same point.
    pub fn full_model(&self) -> Result<M, CommError> {
        let dp_whole = self.sync.whole_model(self.held_model().clone())?;
        self.pipeline.join(dp_whole, &self.device)
    }

    /// One optimizer step over `micro_batches`, this rank's rows of the
    /// global batch: each micro-batch's forward and backward (its loss
    /// weighted `1 / micro_batches.len()`), the gradients synchronised over
    /// the DP group by the ZeRO stage's strategy, clipped by their global
    /// norm and applied, so every rank ends with the identical model. The
    /// loss is the mean over all DP ranks and `tokens` counts the whole
    /// global batch. Under loss scaling the loss is multiplied by the scale
    /// before backward and the gradients divided by it before clipping; a
    /// step whose gradients overflowed is skipped and the scale halved.
    pub fn step(&mut self, micro_batches: &[Batch]) -> Result<StepOutput, CommError> {
        let mut model = self
            .model
            .take()
            .expect("the model is always present between steps");
        let n = micro_batches.len().max(1);
        let loss_scale = self.scaler.map_or(1.0, |s| s.scale);
        // The sync averages over DP x CP, while a CP ring's gradients
        // add up to its replica's (each rank back-propagates its tokens'
        // share of the loss): the weight carries cp, as Megatron-Core
        // scales the loss by the CP degree.
        let cp = self.groups.cp().world_size() as f64;
        let weight = loss_scale * cp / n as f64;
        // The step's communication clock starts here (a checkpoint's
        // gathers between steps are not the step's).
        self.sync.comm_times();
        let ends = [LmUnit::Embedding, LmUnit::Head];
        for unit in ends {
            model = self.sync.acquire(unit, model, true)?;
        }
        let mut loss_sum = 0.0;
        let mut pipeline = None;
        if self.pipeline.stages() > 1 {
            let (m, losses, times) = self.pipeline.step(
                &mut *self.sync,
                &self.partial,
                model,
                micro_batches,
                weight,
                &self.device,
            )?;
            model = m;
            loss_sum = losses;
            pipeline = Some(times);
        } else {
            let run = if self.recompute == Recompute::Full {
                unit_by_unit::<B, M>
            } else {
                whole_graph::<B, M>
            };
            for (i, batch) in micro_batches.iter().enumerate() {
                if i + 1 == micro_batches.len() {
                    self.sync.last_micro_batch();
                }
                let (m, loss) = run(
                    &mut *self.sync,
                    &self.partial,
                    model,
                    batch,
                    weight,
                    &self.device,
                )?;
                model = m;
                loss_sum += loss;
            }
        }
        for unit in ends {
            model = self.sync.release(unit, model);
        }
        // The optimizer waits for every reduction still in flight; the
        // step's other collectives follow.
        self.sync.settle()?;
        let dp = self.groups.dp().clone();
        let mut loss = [(loss_sum / n as f64) as f32];
        let loss = if dp.world_size() > 1 {
            dp.all_reduce_avg(&mut loss)?;
            f64::from(loss[0])
        } else {
            loss_sum / n as f64
        };
        let tokens: usize = micro_batches.iter().map(|b| b.batch * b.seq_len).sum();
        let lr = self.config.schedule.lr(self.steps_done);
        let dp_squares = self.sync.reduce(&model, &self.norm_shares)?;
        // Each stage holds its own parameters' gradients: add the stages, then the TP blocks.
        let stage_squares = group_sum(dp_squares, &**self.groups.pp())?;
        let grad_norm = global_norm(stage_squares, &**self.groups.tp())? / loss_scale;
        let outcome = match &mut self.scaler {
            Some(scaler) if loss.is_finite() => scaler.update(grad_norm.is_finite()),
            _ if loss.is_finite() && grad_norm.is_finite() => ScaleOutcome::Apply,
            _ => ScaleOutcome::NonFinite,
        };
        let skipped = outcome != ScaleOutcome::Apply;
        if skipped {
            self.sync.discard();
        } else {
            let clip = self.config.grad_clip;
            let clipping = clip_factor(grad_norm, clip).filter(|_| clip > 0.0);
            // Unscaling (exact: the scale is a power of two) and clipping
            // in one multiplication.
            let scale = match (clipping, loss_scale != 1.0) {
                (Some(c), true) => Some(c / loss_scale),
                (None, true) => Some(1.0 / loss_scale),
                (c, false) => c,
            };
            let Synced {
                model: m,
                grad_bytes,
            } = self.sync.apply(model, lr, scale, &mut self.optimizer)?;
            model = m;
            self.memory = MemoryBytes {
                param_bytes: self.sync.param_bytes(&model),
                grad_bytes,
                optimizer_bytes: self.optimizer.state_bytes(),
            };
        }
        self.model = Some(model);
        self.steps_done += 1;
        Ok(StepOutput {
            loss,
            lr,
            grad_norm,
            tokens: tokens * dp.world_size(),
            skipped,
            pipeline,
            overflow: outcome == ScaleOutcome::Overflow,
            loss_scale: self.scaler.is_some().then_some(loss_scale),
            skipped_steps: self.scaler.map(|s| s.skipped_steps),
            // The gradients are reduced over DP x CP.
            grad_comm: (self.groups.dp_cp().world_size() > 1).then(|| self.sync.comm_times()),
        })
    }

    /// Every parameter of the whole model by name: gathered over the DP
    /// group under ZeRO-3, over the PP group, and joined over the TP group
    /// (a collective: every rank must call it). Holds the whole model on
    /// every rank: writers stream it instead
    /// ([`Trainer::whole_parameters_one_by_one`]).
    pub fn whole_parameters(&self) -> Result<Vec<(String, TensorData)>, ShardError> {
        let tp = &**self.groups.tp();
        named_tensors(&self.full_model()?.valid())
            .into_iter()
            .map(|(name, data)| Ok((name.clone(), self.shards.gather(&name, data, tp)?)))
            .collect()
    }
}
