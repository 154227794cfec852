//! The gradient-synchronisation strategy of a training step: what happens
//! to a unit's parameters around its use and to the gradients of a
//! micro-batch, and how the step's update is applied across the DP group.
//!
//! Implemented by [`Ddp`](crate::ddp::Ddp) (ZeRO-0) and
//! [`Zero`](crate::zero::Zero) (stages 1-3). The micro-batch schedules
//! ([`crate::micro_batch`], and the pipeline's executor) call these hooks
//! and know nothing of the stage, in the way FSDP hooks wrap modules in
//! torchtitan. [`norm`] is the global gradient norm the strategies and the
//! trainer compute with.
//!
//! This module is the contract: the strategies (`ddp`, `zero`), the
//! pipeline and the trainer (`train`) import it, and it imports none of them.

pub mod norm;

use std::collections::HashMap;

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::lm::{LmUnit, LmUnits};
use ferrotron_engine::metrics::MemoryBytes;
use ferrotron_engine::optim::AdamW;

use self::norm::NormShares;
use crate::comm::CommError;

/// The outcome of [`GradSync::apply`].
pub struct Synced<M> {
    /// The model after the optimizer step.
    pub model: M,
    /// Bytes of gradients this rank held when the update began.
    pub grad_bytes: usize,
}

/// Whole optimizer moments `(m, v)` of every parameter, flat (row-major),
/// by parameter: what a checkpoint stores, whatever the sharding.
pub type WholeMoments = HashMap<ParamId, (Vec<f32>, Vec<f32>)>;

/// How gradients are synchronised and parameters held across the DP group.
///
/// Every rank of the group calls the same hooks in the same order (they
/// may be collectives).
pub trait GradSync<B: AutodiffBackend, M: AutodiffModule<B> + LmUnits<B>> {
    /// `model` with the parameters of `unit` whole, before the unit runs
    /// (ZeRO-3 all-gathers them); `require_grad` when the run is recorded
    /// for backward.
    fn acquire(&self, unit: LmUnit, model: M, require_grad: bool) -> Result<M, CommError>;

    /// `model` without what [`GradSync::acquire`] gathered for `unit`.
    fn release(&self, unit: LmUnit, model: M) -> M;

    /// Takes one micro-batch's gradients (already scaled by its share of
    /// the step): kept whole (DDP, ZeRO-1) or reduce-scattered into this
    /// rank's chunk (ZeRO-2/3). `grads` may cover only some units.
    fn accumulate(&mut self, model: &M, grads: GradientsParams) -> Result<(), CommError>;

    /// After the last micro-batch: the gradients averaged over the DP
    /// group; returns the sum of their squares over the DP group, each
    /// parameter weighted by `shares` (nothing is applied yet).
    fn reduce(&mut self, model: &M, shares: &NormShares) -> Result<f64, CommError>;

    /// Applies the reduced gradients, multiplied by `scale` if given
    /// (clipping), with one AdamW step of learning rate `lr`, leaving every
    /// rank with the same model.
    fn apply(
        &mut self,
        model: M,
        lr: f64,
        scale: Option<f64>,
        optimizer: &mut AdamW<B::InnerBackend>,
    ) -> Result<Synced<M>, CommError>;

    /// Drops the reduced gradients without applying them (a skipped step).
    fn discard(&mut self);

    /// The whole model (ZeRO-3 gathers every unit: a collective).
    fn whole_model(&self, model: M) -> Result<M, CommError>;

    /// The optimizer's moments of every parameter, whole (ZeRO gathers
    /// the shards: a collective). Parameters not yet updated have zeros.
    fn whole_moments(
        &self,
        model: &M,
        optimizer: &AdamW<B::InnerBackend>,
    ) -> Result<WholeMoments, CommError>;

    /// Loads whole moments (from [`GradSync::whole_moments`], possibly of a
    /// run with another DP size) into `optimizer`, keeping this rank's part.
    fn load_moments(
        &self,
        model: &M,
        optimizer: &mut AdamW<B::InnerBackend>,
        moments: &WholeMoments,
    );

    /// Bytes of parameters this rank holds between steps.
    fn param_bytes(&self, model: &M) -> usize;

    /// The training state this rank will hold once training runs, from the
    /// layout (f32 state; what a step measures, up to the padding of the
    /// last chunk of each unit).
    fn planned_memory(&self, model: &M) -> MemoryBytes;
}
