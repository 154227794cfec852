//! Data parallelism (DDP, ZeRO stage 0): every DP rank holds the whole
//! model, trains on its own rows of the global batch, and the gradients are
//! averaged across the DP group once per optimizer step, before clipping
//! and the update.
//!
//! Averaging uses the one flat layout ([`crate::flat`]): the gradients are
//! cut into buckets of at most `--bucket-mb` MiB (whole parameters, in the
//! model's visiting order); each bucket's gradients are flattened into one
//! tensor on the device, all-reduced over the DP group and cut back into
//! tensors of their shapes. There is no overlap with the backward pass yet.
//!
//! With `--reduce-dtype bf16` each bucket is rounded to bf16 before the
//! all-reduce and its average rounded again after (FSDP's
//! `MixedPrecision(reduce_dtype=bfloat16)`); the MPI wire still carries
//! f32, so this reproduces the numerics of a bf16 reduction, not its
//! halved traffic. The default keeps f32 (Megatron's
//! `--accumulate-allreduce-grads-in-fp32`).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use ferrotron_engine::lm::{LmUnit, LmUnits};
use ferrotron_engine::metrics::MemoryBytes;
use ferrotron_engine::optim::{scale_grads, AdamW};
use ferrotron_engine::precision::Precision;

use crate::comm::{CommError, Communicator};
use crate::flat::tensors::{GradBytes, ParamBytes};
use crate::flat::{param_infos, FlatLayout, Unit};
use crate::grad_sync::norm::{weighted_squares, NormShares};
use crate::grad_sync::{GradSync, Synced};

/// Default all-reduce bucket size, MiB (as PyTorch DDP's `bucket_cap_mb`).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;

/// Values per bucket of at most `bucket_mb` MiB of `f32` (at least one).
pub fn bucket_elems(bucket_mb: f64) -> usize {
    ((bucket_mb * 1024.0 * 1024.0 / 4.0) as usize).max(1)
}

/// Whole gradients of a step: summed over its micro-batches, averaged over
/// the DP group once at the end (DDP and ZeRO-1), then applied or dropped.
pub struct ReplicatedGrads<M> {
    sum: GradientsAccumulator<M>,
    /// The averaged gradients between `reduce` and `take`, and their bytes.
    reduced: Option<(GradientsParams, usize)>,
}

impl<M> Default for ReplicatedGrads<M> {
    fn default() -> Self {
        Self {
            sum: GradientsAccumulator::new(),
            reduced: None,
        }
    }
}

impl<M> ReplicatedGrads<M> {
    /// Adds one micro-batch's gradients.
    pub fn add<B: AutodiffBackend>(&mut self, model: &M, grads: GradientsParams)
    where
        M: AutodiffModule<B>,
    {
        self.sum.accumulate(model, grads);
    }

    /// Ends the step's sum: averages it over `group` in precision `reduce`,
    /// unit by unit of `layout` (one all-reduce per unit), keeps it for
    /// [`Self::take`] and returns the sum of its squares, each parameter
    /// weighted by `shares`.
    pub fn reduce<B: AutodiffBackend>(
        &mut self,
        model: &M,
        group: &dyn Communicator,
        layout: &FlatLayout,
        shares: &NormShares,
        reduce: Precision,
    ) -> Result<f64, CommError>
    where
        M: AutodiffModule<B>,
    {
        let grads = averaged::<B, M>(self.sum.grads(), model, group, layout, reduce)?;
        let mut bytes = GradBytes {
            grads: &grads,
            bytes: 0,
        };
        model.visit(&mut bytes);
        let grad_bytes = bytes.bytes;
        // Every DP rank holds every (averaged) gradient: nothing to add up across them.
        let squares = weighted_squares(model, &grads, shares);
        self.reduced = Some((grads, grad_bytes));
        Ok(squares)
    }

    /// The reduced gradients, multiplied by `scale` if given, and the bytes
    /// they held.
    ///
    /// # Panics
    /// Without a [`Self::reduce`] since the last `take` or `discard`.
    pub fn take<B: AutodiffBackend>(
        &mut self,
        model: &M,
        scale: Option<f64>,
    ) -> (GradientsParams, usize)
    where
        M: AutodiffModule<B>,
    {
        let (mut grads, bytes) = self.reduced.take().expect("take follows reduce");
        if let Some(factor) = scale {
            scale_grads(model, &mut grads, factor);
        }
        (grads, bytes)
    }

    /// Drops the reduced gradients (a skipped step).
    pub fn discard(&mut self) {
        self.reduced = None;
    }
}

/// `grads` averaged over `group` in precision `reduce`, unit by unit of
/// `layout`.
fn averaged<B: AutodiffBackend, M: AutodiffModule<B>>(
    grads: GradientsParams,
    model: &M,
    group: &dyn Communicator,
    layout: &FlatLayout,
    reduce: Precision,
) -> Result<GradientsParams, CommError> {
    if group.world_size() == 1 {
        return Ok(grads);
    }
    let mut take = TakeFlat::<B> {
        grads,
        flat: HashMap::new(),
    };
    model.visit(&mut take);
    let TakeFlat { grads, mut flat } = take;
    for unit in layout.units() {
        average_unit(group, unit, &mut flat, reduce)?;
    }
    let mut put = PutBack::<B> { grads, flat };
    model.visit(&mut put);
    Ok(put.grads)
}

/// Replaces the flat gradients of `unit`'s parameters in `flat` by their
/// average over `group`: concatenated on the device, one all-reduce, cut
/// back (parameters without a gradient are left out on every rank alike).
/// The values sent and the average are rounded to `reduce`.
fn average_unit<IB: Backend>(
    group: &dyn Communicator,
    unit: &Unit,
    flat: &mut HashMap<ParamId, Tensor<IB, 1>>,
    reduce: Precision,
) -> Result<(), CommError> {
    let present: Vec<(ParamId, usize)> = unit
        .slots
        .iter()
        .filter(|s| flat.contains_key(&s.id))
        .map(|s| (s.id, s.numel()))
        .collect();
    if present.is_empty() {
        return Ok(());
    }
    let joined = Tensor::cat(present.iter().map(|(id, _)| flat[id].clone()).collect(), 0);
    let averaged = reduce.round_tensor(group.all_reduce_avg_tensor(reduce.round_tensor(joined))?);
    let mut at = 0;
    for (id, n) in present {
        flat.insert(id, averaged.clone().slice(at..at + n));
        at += n;
    }
    Ok(())
}

/// Moves every gradient out of `grads` as a rank-1 tensor.
struct TakeFlat<B: AutodiffBackend> {
    grads: GradientsParams,
    flat: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TakeFlat<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let n = g.shape().num_elements();
            self.flat.insert(param.id, g.reshape([n]));
        }
    }
}

/// Puts the (averaged) rank-1 gradients back into `grads` in their parameters' shapes.
struct PutBack<B: AutodiffBackend> {
    grads: GradientsParams,
    flat: HashMap<ParamId, Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutBack<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.flat.remove(&param.id) {
            let shape: [usize; D] = param.val().dims();
            self.grads.register(param.id, g.reshape(shape));
        }
    }
}

/// ZeRO stage 0: replicated parameters, gradients and optimizer state;
/// gradients averaged by bucketed all-reduce over the DP group.
pub struct Ddp<B: AutodiffBackend, M> {
    group: Arc<dyn Communicator>,
    layout: FlatLayout,
    backend: PhantomData<fn() -> B>,
    grads: ReplicatedGrads<M>,
    reduce: Precision,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Ddp<B, M> {
    /// DDP over `group` (the DP group) for `model`, buckets of at most
    /// `bucket_elems` values reduced in precision `reduce`.
    pub fn new(
        model: &M,
        group: Arc<dyn Communicator>,
        bucket_elems: usize,
        reduce: Precision,
    ) -> Self {
        let units = FlatLayout::buckets(param_infos(model), bucket_elems);
        Self {
            layout: FlatLayout::new(units, group.rank(), group.world_size()),
            group,
            backend: PhantomData,
            grads: ReplicatedGrads::default(),
            reduce,
        }
    }
}

impl<B, M> GradSync<B, M> for Ddp<B, M>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + LmUnits<B>,
{
    fn acquire(&self, _unit: LmUnit, model: M, _require_grad: bool) -> Result<M, CommError> {
        Ok(model)
    }

    fn release(&self, _unit: LmUnit, model: M) -> M {
        model
    }

    fn accumulate(&mut self, model: &M, grads: GradientsParams) -> Result<(), CommError> {
        self.grads.add(model, grads);
        Ok(())
    }

    fn reduce(&mut self, model: &M, shares: &NormShares) -> Result<f64, CommError> {
        self.grads
            .reduce(model, &*self.group, &self.layout, shares, self.reduce)
    }

    fn apply(
        &mut self,
        model: M,
        lr: f64,
        scale: Option<f64>,
        optimizer: &mut AdamW<B::InnerBackend>,
    ) -> Result<Synced<M>, CommError> {
        let (grads, grad_bytes) = self.grads.take(&model, scale);
        Ok(Synced {
            model: optimizer.step(lr, model, grads),
            grad_bytes,
        })
    }

    fn discard(&mut self) {
        self.grads.discard();
    }

    fn owned_ranges(&self) -> Option<HashMap<ParamId, Range<usize>>> {
        None
    }

    fn param_pieces(&self) -> Option<&HashMap<ParamId, Tensor<B::InnerBackend, 1>>> {
        None
    }

    fn param_pieces_mut(&mut self) -> Option<&mut HashMap<ParamId, Tensor<B::InnerBackend, 1>>> {
        None
    }

    fn whole_model(&self, model: M) -> Result<M, CommError> {
        Ok(model)
    }

    fn param_bytes(&self, model: &M) -> usize {
        let mut p = ParamBytes(0);
        model.visit(&mut p);
        p.0
    }

    fn planned_memory(&self, model: &M) -> MemoryBytes {
        let p = GradSync::<B, M>::param_bytes(self, model);
        MemoryBytes {
            param_bytes: p,
            grad_bytes: p,
            optimizer_bytes: 2 * p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_size_is_counted_in_mib_of_f32() {
        assert_eq!(bucket_elems(25.0), 25 * 1024 * 1024 / 4);
        assert_eq!(bucket_elems(0.0), 1);
    }
}
