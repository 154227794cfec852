//! [`AnyBlockKernel`]: a block kernel on one backend's device tensors
//! (`BlockAttention<Tensor<B, 4>>`), held by the ring, which is not
//! generic over the backend, and taken back for the backend whose tensors
//! a step is handed.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::block::BlockAttention;
use crate::per_backend::{Family, PerBackend};

/// A block kernel on the f32 device tensors `[batch, heads, len, width]`
/// of backend `B`.
pub type DeviceBlockKernel<B> = Arc<dyn BlockAttention<Tensor<B, 4>> + Send + Sync>;

/// The [`Family`] of [`DeviceBlockKernel`].
pub struct BlockKernels;

impl Family for BlockKernels {
    type Of<B: Backend> = DeviceBlockKernel<B>;
    const WHAT: &'static str = "a device block kernel";
}

/// A [`DeviceBlockKernel`] of some backend, or none (the ring's steps on
/// device tensors then run the host kernel on copies, [`super::OnHost`]).
pub type AnyBlockKernel = PerBackend<BlockKernels>;
