//! [`TensorCollectives`]: a rank's collectives on rank-1 `f32` tensors of
//! a backend, on device buffers; [`DeviceComm`] gives them for host
//! memory (CPU backends, whose tensors live there).

use burn::tensor::backend::Backend;
use burn::tensor::{bf16, f16};
use ferrotron_engine::precision::Precision;

use super::wire::wire_dtype;
use super::DeviceComm;
use crate::comm::nccl::NcclDataType;
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::CommError;
use burn::tensor::Tensor;

/// Collectives on a backend's tensors that never leave the device: each
/// sends the values in the dtype of a precision ([`super::wire`]: the
/// reduction's, or the gathered values') and returns `f32`.
pub trait TensorCollectives<B: Backend> {
    /// Ranks in the communicator.
    fn world_size(&self) -> usize;
    /// `t` `[n]` summed over the ranks, reduced in `reduce`.
    fn all_reduce_sum(&self, t: Tensor<B, 1>, reduce: Precision)
        -> Result<Tensor<B, 1>, CommError>;
    /// Every rank's `t` `[n]` in rank order, `[n x world_size]`, sent in
    /// `wire` (exact for values that `wire` represents: 16-bit
    /// activations sent as themselves).
    fn all_gather(&self, t: Tensor<B, 1>, wire: Precision) -> Result<Tensor<B, 1>, CommError>;
    /// `t` `[n x world_size]` summed over the ranks, reduced in `reduce`;
    /// this rank's block `[n]`.
    fn reduce_scatter_sum(
        &self,
        t: Tensor<B, 1>,
        reduce: Precision,
    ) -> Result<Tensor<B, 1>, CommError>;
}

/// A [`TensorCollectives`] that threads share: what the gradient sync
/// runs its all-reduces on when the job hands NCCL its device tensors
/// (`GradSync::sync_on_device`).
pub type SharedCollectives<B> = std::sync::Arc<dyn TensorCollectives<B> + Send + Sync>;

/// `values` in `dtype`'s encoding, as 16-bit patterns (f16, bf16).
fn narrow(values: &[f32], dtype: NcclDataType) -> Vec<u16> {
    match dtype {
        NcclDataType::Bf16 => values
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect(),
        _ => values.iter().map(|&x| f16::from_f32(x).to_bits()).collect(),
    }
}

/// 16-bit patterns of `dtype` as `f32`.
fn widen(bits: &[u16], dtype: NcclDataType) -> Vec<f32> {
    match dtype {
        NcclDataType::Bf16 => bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
        _ => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
    }
}

/// The host-memory path: the tensor's values are the buffer (a CPU
/// backend's tensors live in host memory; on a GPU backend this path would
/// copy, which is what [`super::cube`] avoids).
impl<B: Backend> TensorCollectives<B> for DeviceComm {
    fn world_size(&self) -> usize {
        DeviceComm::world_size(self)
    }

    fn all_reduce_sum(
        &self,
        t: Tensor<B, 1>,
        reduce: Precision,
    ) -> Result<Tensor<B, 1>, CommError> {
        let (device, dtype) = (t.device(), wire_dtype(reduce));
        let mut values = host_f32(t);
        if dtype == NcclDataType::F32 {
            self.host_all_reduce_sum(&mut values, dtype)?;
            return Ok(from_host(values, &device));
        }
        let mut bits = narrow(&values, dtype);
        self.host_all_reduce_sum(&mut bits, dtype)?;
        Ok(from_host(widen(&bits, dtype), &device))
    }

    fn all_gather(&self, t: Tensor<B, 1>, wire: Precision) -> Result<Tensor<B, 1>, CommError> {
        let (device, dtype) = (t.device(), wire_dtype(wire));
        let send = host_f32(t);
        let all = send.len() * DeviceComm::world_size(self);
        if dtype == NcclDataType::F32 {
            let mut recv = vec![0.0; all];
            self.host_all_gather(&send, &mut recv, dtype)?;
            return Ok(from_host(recv, &device));
        }
        let mut recv = vec![0u16; all];
        self.host_all_gather(&narrow(&send, dtype), &mut recv, dtype)?;
        Ok(from_host(widen(&recv, dtype), &device))
    }

    fn reduce_scatter_sum(
        &self,
        t: Tensor<B, 1>,
        reduce: Precision,
    ) -> Result<Tensor<B, 1>, CommError> {
        let (device, dtype) = (t.device(), wire_dtype(reduce));
        let send = host_f32(t);
        let n = send.len() / DeviceComm::world_size(self);
        if dtype == NcclDataType::F32 {
            let mut recv = vec![0.0; n];
            self.host_reduce_scatter_sum(&send, &mut recv, dtype)?;
            return Ok(from_host(recv, &device));
        }
        let mut recv = vec![0u16; n];
        self.host_reduce_scatter_sum(&narrow(&send, dtype), &mut recv, dtype)?;
        Ok(from_host(widen(&recv, dtype), &device))
    }
}
