//! [`RingAttention`]: what one attention layer's ring runs over, on host
//! buffers or, given device collectives, on the backend's tensors.

use std::fmt;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::backward::{ring_backward, Kept};
use super::block::{BlockAttention, HeadBuf};
use super::device::{DeviceRing, OnHost};
use super::device_kernel::AnyBlockKernel;
use super::forward::ring_forward;
use super::split::ChunkLayout;
use crate::comm::nccl::device::{AnyCollectives, SharedCollectives};
use crate::comm::Communicator;

/// The ring one attention layer runs over: the context-parallel group,
/// how its sequences are split, the per-block attention kernel (the
/// model's, with its positional bias) and, optionally, the group's device
/// collectives (then the K/V, the merge and the `dk`, `dv` sums stay on
/// the device, and the blocks too where the model has a kernel on the
/// device's tensors).
#[derive(Clone)]
pub struct RingAttention {
    ring: Arc<dyn Communicator>,
    layout: ChunkLayout,
    kernel: Arc<dyn BlockAttention + Send>,
    /// A `SharedCollectives<B>` over the ring's ranks, for the backend `B`
    /// the layers compute on (the inner backend under autodiff).
    device: AnyCollectives,
    /// The block kernel on `B`'s tensors, or none ([`OnHost`] of `kernel`).
    device_kernel: AnyBlockKernel,
}

impl RingAttention {
    /// Attention over `ring` (the CP group, `layout.cp()` ranks) of
    /// sequences split by `layout`, each block computed by `kernel`, on
    /// host buffers.
    pub fn new(
        ring: Arc<dyn Communicator>,
        layout: ChunkLayout,
        kernel: Arc<dyn BlockAttention + Send>,
    ) -> Self {
        assert_eq!(
            ring.world_size(),
            layout.cp(),
            "a ring of {} ranks for {layout:?}",
            ring.world_size()
        );
        Self {
            ring,
            layout,
            kernel,
            device: AnyCollectives::none(),
            device_kernel: AnyBlockKernel::none(),
        }
    }

    /// The ring on the device tensors of the backend `collectives` were
    /// opened for (an `AnyCollectives` of a `SharedCollectives<B>` over
    /// the ring's ranks, in the same order; none: the host path).
    pub fn with_device(self, collectives: AnyCollectives) -> Self {
        Self {
            device: collectives,
            ..self
        }
    }

    /// On device tensors, each block computed by `kernel` (a
    /// `DeviceBlockKernel<B>` for the backend of the ring's collectives)
    /// instead of the host kernel on copies; none: the copies.
    pub fn with_device_kernel(self, kernel: AnyBlockKernel) -> Self {
        Self {
            device_kernel: kernel,
            ..self
        }
    }

    /// How the sequences are split over the ring.
    pub fn layout(&self) -> ChunkLayout {
        self.layout
    }

    /// The device collectives for the tensors of `B`, if the ring has
    /// them; panics if they were opened for another backend.
    pub(super) fn collectives<B: Backend>(&self) -> Option<&SharedCollectives<B>> {
        self.device.get::<B>(self)
    }

    /// [`ring_forward`] of host buffers: output `[batch, heads, local_len,
    /// head_dim]` and log-sum-exp `[batch, heads, local_len, 1]`.
    pub(super) fn forward(&self, q: &HeadBuf, k: &HeadBuf, v: &HeadBuf) -> (HeadBuf, HeadBuf) {
        ring_forward(&*self.ring, &*self.kernel, self.layout, q, k, v)
            .unwrap_or_else(|e| panic!("ring attention forward over {self:?} failed: {e}"))
    }

    /// [`ring_backward`] of host buffers: `[dq, dk, dv]`.
    pub(super) fn backward(&self, kept: Kept<'_>, d_out: &HeadBuf) -> [HeadBuf; 3] {
        ring_backward(&*self.ring, &*self.kernel, self.layout, kept, d_out)
            .unwrap_or_else(|e| panic!("ring attention backward over {self:?} failed: {e}"))
    }

    /// The device ring over `collectives`.
    fn device_ring<'a, B: Backend>(
        &self,
        collectives: &'a SharedCollectives<B>,
    ) -> DeviceRing<'a, B> {
        assert_eq!(
            collectives.world_size(),
            self.layout.cp(),
            "{self:?}: device collectives over another group than the ring"
        );
        DeviceRing::new(&**collectives, self.ring.rank())
    }

    /// [`ring_forward`] of f32 device tensors over `collectives`, as
    /// [`RingAttention::forward`].
    pub(super) fn forward_on<B: Backend>(
        &self,
        collectives: &SharedCollectives<B>,
        [q, k, v]: [&Tensor<B, 4>; 3],
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let ring = self.device_ring(collectives);
        let done = match self.device_kernel.get::<B>(self) {
            Some(kernel) => ring_forward(&ring, &**kernel, self.layout, q, k, v),
            None => ring_forward(&ring, &OnHost(&*self.kernel), self.layout, q, k, v),
        };
        done.unwrap_or_else(|e| panic!("ring attention forward over {self:?} failed: {e}"))
    }

    /// [`ring_backward`] of f32 device tensors over `collectives`: `[dq,
    /// dk, dv]`.
    pub(super) fn backward_on<B: Backend>(
        &self,
        collectives: &SharedCollectives<B>,
        kept: Kept<'_, Tensor<B, 4>>,
        d_out: &Tensor<B, 4>,
    ) -> [Tensor<B, 4>; 3] {
        let ring = self.device_ring(collectives);
        let done = match self.device_kernel.get::<B>(self) {
            Some(kernel) => ring_backward(&ring, &**kernel, self.layout, kept, d_out),
            None => ring_backward(&ring, &OnHost(&*self.kernel), self.layout, kept, d_out),
        };
        done.unwrap_or_else(|e| panic!("ring attention backward over {self:?} failed: {e}"))
    }
}

impl fmt::Debug for RingAttention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RingAttention(rank {} of {}, seq {})",
            self.ring.rank(),
            self.layout.cp(),
            self.layout.seq()
        )
    }
}
