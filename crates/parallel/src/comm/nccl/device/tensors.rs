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
    /// Sends each `(route, t)` of `sends` (`t` `[n]`) to its peer and
    /// receives, for each `(route, n)` of `recvs`, `n` values from its
    /// peer, all posted at once (one NCCL group: two ranks that send to
    /// each other cannot deadlock); returns the received tensors `[n]` in
    /// `recvs`' order. Values travel in `wire` (exact for values that
    /// `wire` represents: 16-bit activations sent as themselves), and
    /// are received on `device`.
    fn exchange(
        &self,
        sends: Vec<(Route, Tensor<B, 1>)>,
        recvs: &[(Route, usize)],
        wire: Precision,
        device: &B::Device,
    ) -> Result<Vec<Tensor<B, 1>>, CommError>;
}

/// One message of [`TensorCollectives::exchange`]: the other rank, and
/// the tag that orders the messages between two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The receiving rank of a send, the sending rank of a receive.
    pub peer: usize,
    /// The message's tag: NCCL has no tags, and matches the messages
    /// between two ranks in the order they are posted, so both ends post
    /// them in tag order ([`in_tag_order`]).
    pub tag: i32,
}

/// The positions of `messages` in the order they are posted: by tag,
/// ties in their order.
pub(super) fn in_tag_order<T>(messages: &[(Route, T)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..messages.len()).collect();
    order.sort_by_key(|&i| messages[i].0.tag);
    order
}

/// A [`TensorCollectives`] that threads share: what the gradient sync
/// runs its all-reduces on when the job hands NCCL its device tensors
/// (`GradSync::sync_on_device`).
pub type SharedCollectives<B> = std::sync::Arc<dyn TensorCollectives<B> + Send + Sync>;

/// What opens [`SharedCollectives`] over the ranks of a group (a
/// collective over that group), for a trainer that moves several of its
/// groups' traffic onto them.
pub type OpenCollectives<'a, B> =
    dyn Fn(&dyn crate::comm::Communicator) -> Result<SharedCollectives<B>, CommError> + 'a;

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

    fn exchange(
        &self,
        mut sends: Vec<(Route, Tensor<B, 1>)>,
        recvs: &[(Route, usize)],
        wire: Precision,
        device: &B::Device,
    ) -> Result<Vec<Tensor<B, 1>>, CommError> {
        let dtype = wire_dtype(wire);
        sends.sort_by_key(|(route, _)| route.tag);
        let sent: Vec<(usize, Vec<f32>)> = sends
            .into_iter()
            .map(|(route, t)| (route.peer, host_f32(t)))
            .collect();
        let order = in_tag_order(recvs);
        let wanted: Vec<(usize, usize)> = order
            .iter()
            .map(|&i| (recvs[i].0.peer, recvs[i].1))
            .collect();
        let received = if dtype == NcclDataType::F32 {
            host_exchange(
                self,
                &sent,
                &wanted,
                dtype,
                <[f32]>::to_vec,
                <[f32]>::to_vec,
            )?
        } else {
            let narrow = |v: &[f32]| narrow(v, dtype);
            let widen = |v: &[u16]| widen(v, dtype);
            host_exchange(self, &sent, &wanted, dtype, narrow, widen)?
        };
        let mut out: Vec<Option<Tensor<B, 1>>> = vec![None; recvs.len()];
        for (&i, values) in order.iter().zip(received) {
            out[i] = Some(from_host(values, device));
        }
        Ok(out.into_iter().flatten().collect())
    }
}

/// [`DeviceComm::host_exchange`] of `sends` (`(peer, values)`) and
/// `wanted` (`(peer, values)`), each already in posting order, with the
/// values sent as `T` (`to`: from f32, `from`: back); the received values
/// in `wanted`'s order.
fn host_exchange<T: Copy + Default>(
    comm: &DeviceComm,
    sends: &[(usize, Vec<f32>)],
    wanted: &[(usize, usize)],
    dtype: NcclDataType,
    to: impl Fn(&[f32]) -> Vec<T>,
    from: impl Fn(&[T]) -> Vec<f32>,
) -> Result<Vec<Vec<f32>>, CommError> {
    let sent: Vec<(usize, Vec<T>)> = sends.iter().map(|(p, v)| (*p, to(v))).collect();
    let sent: Vec<(usize, &[T])> = sent.iter().map(|(p, v)| (*p, v.as_slice())).collect();
    let mut bufs: Vec<Vec<T>> = wanted.iter().map(|(_, n)| vec![T::default(); *n]).collect();
    let mut recvs: Vec<(usize, &mut [T])> = wanted
        .iter()
        .zip(bufs.iter_mut())
        .map(|((p, _), b)| (*p, b.as_mut_slice()))
        .collect();
    comm.host_exchange(&sent, &mut recvs, dtype)?;
    Ok(bufs.iter().map(|b| from(b)).collect())
}
