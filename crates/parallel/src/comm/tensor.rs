//! Collectives on Burn tensors, for any [`Communicator`].
//!
//! Each moves the tensor's values through the communicator's `f32` host
//! path: one device-to-host copy and one host-to-device copy on a GPU
//! backend, a copy in memory on a CPU backend. On a one-rank communicator
//! the reductions return their input untouched (no copy at all). A
//! device-side transport (NCCL) will implement the same calls on device
//! buffers.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::{CommError, Communicator};

/// The values of a tensor as host `f32`, row-major.
pub fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("a tensor converted to f32 holds f32 values")
}

/// A rank-1 tensor of `values` on `device`.
pub fn from_host<B: Backend>(values: Vec<f32>, device: &B::Device) -> Tensor<B, 1> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

impl dyn Communicator + '_ {
    /// `t` (any shape) summed element-wise over the ranks; every rank gets the sum.
    pub fn all_reduce_sum_tensor<B: Backend, const D: usize>(
        &self,
        t: Tensor<B, D>,
    ) -> Result<Tensor<B, D>, CommError> {
        if self.world_size() == 1 {
            return Ok(t);
        }
        let (shape, device) = (t.shape(), t.device());
        let mut values = host_f32(t);
        self.all_reduce_sum(&mut values)?;
        Ok(Tensor::from_data(TensorData::new(values, shape), &device))
    }

    /// `t` (any shape) averaged element-wise over the ranks.
    pub fn all_reduce_avg_tensor<B: Backend, const D: usize>(
        &self,
        t: Tensor<B, D>,
    ) -> Result<Tensor<B, D>, CommError> {
        let w = self.world_size();
        Ok(self.all_reduce_sum_tensor(t)?.div_scalar(w as f64))
    }

    /// Every rank's `t` `[n]` concatenated in rank order: `[n * world_size]`.
    pub fn all_gather_tensor<B: Backend>(
        &self,
        t: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, CommError> {
        if self.world_size() == 1 {
            return Ok(t);
        }
        let device = t.device();
        let send = host_f32(t);
        let mut recv = vec![0.0; send.len() * self.world_size()];
        self.all_gather(&send, &mut recv)?;
        Ok(from_host(recv, &device))
    }

    /// `t` `[n * world_size]` summed over the ranks; this rank keeps block
    /// `rank` of the sum, `[n]`.
    pub fn reduce_scatter_sum_tensor<B: Backend>(
        &self,
        t: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, CommError> {
        if self.world_size() == 1 {
            return Ok(t);
        }
        let device = t.device();
        let send = host_f32(t);
        let mut recv = vec![0.0; send.len() / self.world_size()];
        self.reduce_scatter_sum(&send, &mut recv)?;
        Ok(from_host(recv, &device))
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::Flex;

    use super::*;
    use crate::comm::SingleProcess;

    #[test]
    fn one_rank_tensor_collectives_keep_the_values() {
        let c: &dyn Communicator = &SingleProcess;
        let device = Default::default();
        let t = Tensor::<Flex, 2>::from_data([[1.0, -2.0], [3.0, 4.5]], &device);
        let sum = c.all_reduce_sum_tensor(t.clone()).unwrap();
        assert_eq!(host_f32(sum), [1.0, -2.0, 3.0, 4.5]);
        let avg = c.all_reduce_avg_tensor(t.clone()).unwrap();
        assert_eq!(host_f32(avg), [1.0, -2.0, 3.0, 4.5]);
        let flat = from_host::<Flex>(vec![1.0, 2.0], &device);
        assert_eq!(
            host_f32(c.all_gather_tensor(flat.clone()).unwrap()),
            [1.0, 2.0]
        );
        assert_eq!(
            host_f32(c.reduce_scatter_sum_tensor(flat).unwrap()),
            [1.0, 2.0]
        );
    }
}
