//! [`AnyBlockKernel`]: a block kernel on one backend's device tensors
//! (`BlockAttention<Tensor<B, 4>>`), held by the ring, which is not
//! generic over the backend, and taken back for the backend whose tensors
//! a step is handed.

use std::any::Any;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::block::BlockAttention;

/// A block kernel on the f32 device tensors `[batch, heads, len, width]`
/// of backend `B`.
pub type DeviceBlockKernel<B> = Arc<dyn BlockAttention<Tensor<B, 4>> + Send + Sync>;

/// A [`DeviceBlockKernel`] of some backend, or none (the ring's steps on
/// device tensors then run the host kernel on copies, [`super::OnHost`]).
#[derive(Clone, Default)]
pub struct AnyBlockKernel(Option<Arc<dyn Any + Send + Sync>>);

impl AnyBlockKernel {
    /// No device kernel.
    pub fn none() -> Self {
        Self(None)
    }

    /// `kernel`, for the tensors of backend `B`.
    pub fn new<B: Backend>(kernel: DeviceBlockKernel<B>) -> Self {
        Self(Some(Arc::new(kernel)))
    }

    /// Whether there is one.
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }

    /// The kernel, if there is one, for the tensors of `B`.
    ///
    /// # Panics
    /// If it was given for another backend than `B`, naming `owner` (a
    /// caller bug: the ring would otherwise copy every block to the host
    /// unseen).
    pub fn get<B: Backend>(&self, owner: &dyn std::fmt::Debug) -> Option<&DeviceBlockKernel<B>> {
        let any = self.0.as_ref()?;
        Some(
            any.downcast_ref::<DeviceBlockKernel<B>>()
                .unwrap_or_else(|| {
                    panic!(
                        "{owner:?}: a device block kernel for another backend than {}",
                        std::any::type_name::<B>()
                    )
                }),
        )
    }
}
