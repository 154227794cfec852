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
//! Collectives of a step may overlap its compute: a strategy starts them
//! on its communication thread ([`crate::comm::CommThread`]) in the order
//! of the hooks' calls, the same on every rank, and [`GradSync::settle`]
//! waits for all of them before the step's other collectives.
//!
//! This module is the contract: the strategies (`ddp`, `zero`), the
//! pipeline and the trainer (`train`) import it, and it imports none of them.

pub mod norm;

use std::collections::HashMap;
use std::ops::Range;

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::lm::{LmUnit, LmUnits};
use ferrotron_engine::metrics::{GradCommTimes, MemoryBytes};
use ferrotron_engine::optim::AdamW;

use self::norm::NormShares;
use crate::comm::nccl::device::SharedCollectives;
use crate::comm::CommError;

/// The outcome of [`GradSync::apply`].
pub struct Synced<M> {
    /// The model after the optimizer step.
    pub model: M,
    /// Bytes of gradients this rank held when the update began.
    pub grad_bytes: usize,
}

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

    /// Starts gathering the parameters of the first units of `next` (the
    /// units the schedule will acquire after the current one, in the order
    /// it will acquire them) for their coming [`GradSync::acquire`]s, so
    /// that the gathers run while the current unit computes (ZeRO-3 with
    /// overlap: `--zero3-prefetch` units ahead; nothing otherwise). A
    /// schedule calls it once per acquire, after it, with what follows.
    fn prefetch(&self, next: &[LmUnit]) -> Result<(), CommError>;

    /// The next micro-batch is the step's last: with overlap, the
    /// reduction of gradients it completes may start at once (DDP, ZeRO-1).
    fn last_micro_batch(&mut self);

    /// Takes one micro-batch's gradients (already scaled by its share of
    /// the step): kept whole (DDP, ZeRO-1) or reduce-scattered into this
    /// rank's chunk (ZeRO-2/3). `grads` may cover only some units. With
    /// overlap the collectives it starts may still be running when it
    /// returns.
    fn accumulate(&mut self, model: &M, grads: GradientsParams) -> Result<(), CommError>;

    /// After the last micro-batch: waits for every collective the step
    /// started (starting the reductions not started yet), so that the
    /// communicators are idle for the step's other collectives.
    fn settle(&mut self) -> Result<(), CommError>;

    /// The communication of the strategy's collectives since the last
    /// call, and the time the compute thread waited for it.
    fn comm_times(&mut self) -> GradCommTimes;

    /// After [`GradSync::settle`]: the gradients averaged over the DP
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

    /// ZeRO-3: parameter `id` whole (this rank's TP block, flat row-major),
    /// from every DP rank's piece of it (a collective over the DP group:
    /// every rank asks for the same parameters in the same order); `None`
    /// where the model itself holds its parameters whole.
    fn whole_param(&self, id: ParamId) -> Result<Option<Vec<f32>>, CommError>;

    /// The range of each parameter's flat (row-major) elements, as the
    /// model holds it (its TP block), whose AdamW moments this rank keeps
    /// (ZeRO: its piece; a parameter it has no piece of is absent), or
    /// `None` when it keeps every parameter's moments whole (DDP).
    fn owned_ranges(&self) -> Option<HashMap<ParamId, Range<usize>>>;

    /// ZeRO-3: whether this rank holds pieces of the parameters (over
    /// [`GradSync::owned_ranges`]), the only copy of their values between
    /// steps; `false` where the model itself holds its parameters.
    fn holds_param_pieces(&self) -> bool;

    /// ZeRO-3: the values of this rank's piece of parameter `id` (on the
    /// device or, with the optimizer offloaded, in host memory), copied;
    /// `None` where the model itself holds its parameters.
    fn param_piece(&self, id: ParamId) -> Option<Vec<f32>>;

    /// ZeRO-3: replaces this rank's piece of parameter `id` by `values`
    /// (from a checkpoint). Panics unless [`GradSync::holds_param_pieces`].
    fn set_param_piece(&mut self, id: ParamId, values: Vec<f32>);

    /// Bytes of parameters this rank holds between steps.
    fn param_bytes(&self, model: &M) -> usize;

    /// Runs the gradient reductions (DDP and ZeRO-1's all-reduces, ZeRO-2
    /// and 3's reduce-scatters) and ZeRO's parameter all-gathers (stage
    /// 3's unit gathers, stages 1 and 2's gathers of the updated chunks)
    /// on `device`, collectives over the same DP group on the tensors
    /// themselves (NCCL on device buffers), instead of the group's host
    /// path; whether this strategy does.
    fn sync_on_device(&mut self, device: SharedCollectives<B::InnerBackend>) -> bool;

    /// The training state this rank will hold once training runs, from the
    /// layout (f32 state; what a step measures, up to the padding of the
    /// last chunk of each unit).
    fn planned_memory(&self, model: &M) -> MemoryBytes;
}
