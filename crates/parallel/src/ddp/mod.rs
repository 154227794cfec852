//! Data parallelism (DDP, ZeRO stage 0): every DP rank holds the whole
//! model, trains on its own rows of the global batch, and the gradients are
//! averaged across the DP group once per optimizer step, before clipping
//! and the update.
//!
//! Averaging uses the one flat layout ([`crate::flat`]): the gradients are
//! cut into buckets of at most `--bucket-mb` MiB (whole parameters, in the
//! model's visiting order); each bucket's gradients are flattened into one
//! tensor on the device, all-reduced over the DP group and cut back into
//! tensors of their shapes ([`replicated`]). With `--overlap-grad-reduce`
//! (the default where the DP group is the only group of more than one
//! rank) a bucket's all-reduce starts on the communication thread
//! ([`CommThread`]) as soon as the step's last backward has given all its
//! gradients, while backward goes on; the optimizer waits for all. Burn's
//! backward gives a graph's gradients all at once, so the overlap is per
//! unit of the unit-by-unit backward (`--recompute full`); after a
//! whole-graph backward every bucket completes at once.
//!
//! With `--reduce-dtype bf16` each bucket is rounded to bf16 before the
//! all-reduce and its average rounded again after (FSDP's
//! `MixedPrecision(reduce_dtype=bfloat16)`); the MPI wire still carries
//! f32, so this reproduces the numerics of a bf16 reduction, not its
//! halved traffic. The default keeps f32 (Megatron's
//! `--accumulate-allreduce-grads-in-fp32`).
//!
//! Under `--comm nccl` the buckets' all-reduces take the bucket's own
//! tensor ([`GradSync::sync_on_device`]: NCCL on the device buffer, no
//! host copy), still in order on the communication thread; bf16 then
//! travels as bf16.

mod replicated;

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use burn::module::{AutodiffModule, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use ferrotron_engine::lm::{LmUnit, LmUnits};
use ferrotron_engine::metrics::{GradCommTimes, MemoryBytes};
use ferrotron_engine::optim::AdamW;
use ferrotron_engine::precision::Precision;

pub use self::replicated::ReplicatedGrads;
use crate::comm::nccl::device::SharedCollectives;
use crate::comm::{CommError, CommThread, Communicator};
use crate::flat::tensors::ParamBytes;
use crate::flat::{param_infos, FlatLayout};
use crate::grad_sync::norm::NormShares;
use crate::grad_sync::{GradSync, Synced};

/// Default all-reduce bucket size, MiB (as PyTorch DDP's `bucket_cap_mb`).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;

/// Values per bucket of at most `bucket_mb` MiB of `f32` (at least one).
pub fn bucket_elems(bucket_mb: f64) -> usize {
    ((bucket_mb * 1024.0 * 1024.0 / 4.0) as usize).max(1)
}

/// ZeRO stage 0: replicated parameters, gradients and optimizer state;
/// gradients averaged by bucketed all-reduce over the DP group.
pub struct Ddp<B: AutodiffBackend, M> {
    /// Runs the DP group's collectives.
    thread: CommThread,
    grads: ReplicatedGrads<B>,
    model: PhantomData<M>,
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> Ddp<B, M> {
    /// DDP over `group` (the DP group) for `model`, buckets of
    /// at most `bucket_elems` values reduced in precision `reduce`, their
    /// all-reduces overlapped with the last backward if `overlap`.
    ///
    /// # Errors
    /// The communication thread could not start.
    pub fn new(
        model: &M,
        group: Arc<dyn Communicator>,
        bucket_elems: usize,
        reduce: Precision,
        overlap: bool,
    ) -> Result<Self, CommError> {
        let units = FlatLayout::buckets(param_infos(model), bucket_elems);
        let layout = FlatLayout::new(units, group.rank(), group.world_size());
        Ok(Self {
            thread: CommThread::new(group)?,
            grads: ReplicatedGrads::new(layout, reduce, overlap),
            model: PhantomData,
        })
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

    fn prefetch(&self, _next: &[LmUnit]) -> Result<(), CommError> {
        Ok(())
    }

    fn last_micro_batch(&mut self) {
        self.grads.last_micro_batch();
    }

    fn accumulate(&mut self, model: &M, grads: GradientsParams) -> Result<(), CommError> {
        self.grads.add(model, grads, &self.thread);
        Ok(())
    }

    fn settle(&mut self) -> Result<(), CommError> {
        self.grads.settle(&self.thread)
    }

    fn comm_times(&mut self) -> GradCommTimes {
        self.thread.take_times()
    }

    fn reduce(&mut self, model: &M, shares: &NormShares) -> Result<f64, CommError> {
        self.grads.reduce(model, &self.thread, shares)
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

    fn holds_param_pieces(&self) -> bool {
        false
    }

    fn param_piece(&self, _id: ParamId) -> Option<Vec<f32>> {
        None
    }

    fn set_param_piece(&mut self, _id: ParamId, _values: Vec<f32>) {
        panic!("DDP holds whole parameters, no pieces");
    }

    fn whole_model(&self, model: M) -> Result<M, CommError> {
        Ok(model)
    }

    fn whole_param(&self, _id: ParamId) -> Result<Option<Vec<f32>>, CommError> {
        Ok(None)
    }

    fn param_bytes(&self, model: &M) -> usize {
        let mut p = ParamBytes(0);
        model.visit(&mut p);
        p.0
    }

    fn sync_on_device(&mut self, device: SharedCollectives<B::InnerBackend>) -> bool {
        self.grads.reduce_on(device);
        true
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
