//! Data parallelism: every DP rank holds the whole model, trains on its own
//! rows of the global batch, and the gradients are averaged across ranks
//! once per optimizer step, before clipping and the update.
//!
//! Averaging goes through host `f32` buffers: the gradients (in the
//! model's visiting order) are flattened into one vector, all-reduced in
//! buckets of at most `bucket_mb` MiB, and scattered back into tensors of
//! their original shapes. There is no overlap with the backward pass yet.

use std::collections::HashMap;
use std::rc::Rc;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use crate::comm::{CommError, Communicator};

/// Default all-reduce bucket size, MiB (as PyTorch DDP's `bucket_cap_mb`).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;

/// The data-parallel group of this rank and how gradients are bucketed.
pub struct DataParallel {
    comm: Rc<dyn Communicator>,
    bucket_elems: usize,
}

impl DataParallel {
    /// All ranks of `comm` form one DP group; all-reduce buckets hold at
    /// most `bucket_mb` MiB of `f32` gradients (at least one value).
    pub fn new(comm: Rc<dyn Communicator>, bucket_mb: f64) -> Self {
        let bucket_elems = ((bucket_mb * 1024.0 * 1024.0 / 4.0) as usize).max(1);
        Self { comm, bucket_elems }
    }

    /// The DP group's communicator.
    pub fn communicator(&self) -> Rc<dyn Communicator> {
        self.comm.clone()
    }

    /// This rank's index in the DP group.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of DP ranks.
    pub fn size(&self) -> usize {
        self.comm.world_size()
    }

    /// Values per all-reduce bucket (`f32` elements).
    pub fn bucket_elems(&self) -> usize {
        self.bucket_elems
    }

    /// Averages `values` over the DP ranks (e.g. per-rank mean losses).
    pub fn mean(&self, values: &mut [f32]) -> Result<(), CommError> {
        self.comm.all_reduce_avg(values)
    }

    /// Replaces every gradient of `module` in `grads` by its average over
    /// the DP ranks. Every rank must hold gradients for the same parameters
    /// (the same model), which the one training code path guarantees.
    pub fn average_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
        &self,
        module: &M,
        grads: GradientsParams,
    ) -> Result<GradientsParams, CommError> {
        let mut flat = Flatten::<B> {
            grads,
            values: Vec::new(),
            slots: HashMap::new(),
        };
        module.visit(&mut flat);
        let Flatten {
            grads,
            mut values,
            slots,
        } = flat;
        for bucket in values.chunks_mut(self.bucket_elems) {
            self.comm.all_reduce_avg(bucket)?;
        }
        let mut scatter = Unflatten::<B> {
            grads,
            values: &values,
            slots,
        };
        module.visit(&mut scatter);
        Ok(scatter.grads)
    }
}

/// Where one gradient sits in the flat vector: offset, shape, device.
struct Slot<B: AutodiffBackend> {
    offset: usize,
    shape: Vec<usize>,
    device: B::Device,
}

/// Moves every gradient out of `grads` into `values` (visiting order).
struct Flatten<B: AutodiffBackend> {
    grads: GradientsParams,
    values: Vec<f32>,
    slots: HashMap<ParamId, Slot<B>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Flatten<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            let offset = self.values.len();
            let (shape, device) = (g.dims().to_vec(), g.device());
            let data = g.into_data().convert::<f32>();
            self.values.extend(
                data.as_slice::<f32>()
                    .expect("a tensor converted to f32 holds f32 values"),
            );
            self.slots.insert(
                param.id,
                Slot {
                    offset,
                    shape,
                    device,
                },
            );
        }
    }
}

/// Puts the (averaged) `values` back into `grads` as tensors of the original shapes.
struct Unflatten<'a, B: AutodiffBackend> {
    grads: GradientsParams,
    values: &'a [f32],
    slots: HashMap<ParamId, Slot<B>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Unflatten<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(Slot {
            offset,
            shape,
            device,
        }) = self.slots.remove(&param.id)
        {
            let n: usize = shape.iter().product();
            let data = TensorData::new(self.values[offset..offset + n].to_vec(), shape);
            let g = Tensor::<B::InnerBackend, D>::from_data(data, &device);
            self.grads.register(param.id, g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::SingleProcess;

    #[test]
    fn bucket_size_is_counted_in_mib_of_f32() {
        let dp = DataParallel::new(Rc::new(SingleProcess), 25.0);
        assert_eq!(dp.bucket_elems(), 25 * 1024 * 1024 / 4);
        assert_eq!(
            DataParallel::new(Rc::new(SingleProcess), 0.0).bucket_elems(),
            1
        );
        assert_eq!(dp.size(), 1);
    }
}
