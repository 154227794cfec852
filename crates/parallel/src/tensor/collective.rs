//! The flat collectives under the TP operators ([`super::ops`]) and the
//! sum of the partial gradients ([`super::partial`]): on the group's
//! device collectives when it has them for the tensors' backend (NCCL on
//! the tensors' own buffers, sent in their dtype), else through its
//! communicator's host `f32` path. A sum of 16-bit values is formed in
//! f32 and rounded once to their dtype, round-to-nearest-even: on the host
//! path by [`Precision::round_in_place`], on the device path by NCCL (or
//! the test double). So on two ranks both paths give the same values; on
//! more, NCCL's ring rounds each partial sum.

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor};

use super::TpGroup;
use crate::comm::nccl::device::wire::carried_in;
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::CommError;

/// `x` `[n]` summed element-wise over `group`, in `x`'s dtype.
pub(super) fn sum<B: Backend>(x: Tensor<B, 1>, group: &TpGroup) -> Result<Tensor<B, 1>, CommError> {
    let (dtype, device) = (x.dtype(), x.device());
    if let Some(c) = group.device::<B>() {
        return Ok(c
            .all_reduce_sum(x.cast(FloatDType::F32), carried_in(dtype))?
            .cast(dtype));
    }
    let mut values = host_f32(x);
    group.comm().all_reduce_sum(&mut values)?;
    carried_in(dtype).round_in_place(&mut values);
    Ok(from_host(values, &device).cast(dtype))
}

/// Every rank's `x` `[n]` in rank order, `[n * group.size()]`, in `x`'s
/// dtype (exact: the values travel as themselves).
pub(super) fn gather<B: Backend>(
    x: Tensor<B, 1>,
    group: &TpGroup,
) -> Result<Tensor<B, 1>, CommError> {
    let dtype = x.dtype();
    if let Some(c) = group.device::<B>() {
        return Ok(c
            .all_gather(x.cast(FloatDType::F32), carried_in(dtype))?
            .cast(dtype));
    }
    Ok(group.comm().all_gather_tensor(x)?.cast(dtype))
}

/// `x` `[n * group.size()]` summed over `group`; this rank's block of the
/// sum, `[n]`, in `x`'s dtype.
pub(super) fn sum_scatter<B: Backend>(
    x: Tensor<B, 1>,
    group: &TpGroup,
) -> Result<Tensor<B, 1>, CommError> {
    let (dtype, device) = (x.dtype(), x.device());
    if let Some(c) = group.device::<B>() {
        return Ok(c
            .reduce_scatter_sum(x.cast(FloatDType::F32), carried_in(dtype))?
            .cast(dtype));
    }
    let send = host_f32(x);
    let mut recv = vec![0.0; send.len() / group.size()];
    group.comm().reduce_scatter_sum(&send, &mut recv)?;
    carried_in(dtype).round_in_place(&mut recv);
    Ok(from_host(recv, &device).cast(dtype))
}
