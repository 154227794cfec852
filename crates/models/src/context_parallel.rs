//! Context parallelism in the decoder (`ferrotron_parallel::context`):
//! the ranks of a ring each take their chunks of every sequence
//! ([`ContextParallel::split`]: chunks `r` and `2cp - 1 - r` of `2cp`),
//! compute the embeddings and blocks on them at their global positions,
//! attend around the ring ([`ContextParallel::ring`]) and score their own
//! targets, the loss summed over the ring ([`ContextParallel::loss`]).
//! The per-block attention ([`block_kernel`]) is the model's fused
//! attention in its `(output, lse)` form on the GPU backends
//! (`ops::CubeBlockAttention`), the CPU attention core
//! (`ops::HostBlockAttention`) elsewhere; on device collectives the GPU
//! backends' blocks stay on the device ([`device_block_kernel`]).

use std::fmt;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use ferrotron_parallel::comm::nccl::device::{AnyCollectives, SharedCollectives};
use ferrotron_parallel::comm::{Communicator, SingleProcess};
use ferrotron_parallel::context::{
    ring_mean, AnyBlockKernel, BlockAttention, ChunkLayout, RingAttention,
};
use ferrotron_parallel::tensor::{TpGroup, TpOps};

use crate::ops::{AttentionImpl, KernelBackend};

/// The kernel of each ring block for query heads of `head_dim` with ALiBi
/// `slopes` (one per head this rank computes; `None` without ALiBi), on
/// `device`: the backend's fused attention when the model's attention is
/// [`AttentionImpl::Fused`] and the backend has it
/// ([`KernelBackend::ring_block_attention`]), else the host attention core.
pub fn block_kernel<B: KernelBackend>(
    attention: AttentionImpl,
    device: &B::Device,
    head_dim: usize,
    slopes: Option<Vec<f32>>,
) -> Arc<dyn BlockAttention + Send> {
    if attention.is_fused() {
        if let Some(kernel) = B::ring_block_attention(device, head_dim, slopes.clone()) {
            return kernel;
        }
    }
    #[cfg(feature = "flex")]
    return Arc::new(crate::ops::HostBlockAttention::new(slopes));
    #[cfg(not(feature = "flex"))]
    {
        let _ = slopes;
        unreachable!(
            "Decoder::with_context_parallel refuses a build without the flex feature \
             unless the backend's fused attention computes the ring's blocks"
        )
    }
}

/// The kernel of each ring block on the backend's own device tensors,
/// for a ring on device collectives (arguments as [`block_kernel`]): the
/// fused attention where the model's attention is
/// [`AttentionImpl::Fused`] and the backend has one on its tensors
/// ([`KernelBackend::ring_block_attention_on_device`]), else none (the
/// ring copies each block to the host for [`block_kernel`]'s).
pub fn device_block_kernel<B: KernelBackend>(
    attention: AttentionImpl,
    device: &B::Device,
    head_dim: usize,
    slopes: Option<Vec<f32>>,
) -> AnyBlockKernel {
    if attention.is_fused() {
        B::ring_block_attention_on_device(device, head_dim, slopes)
    } else {
        AnyBlockKernel::none()
    }
}

/// The context-parallel ring a decoder computes over (a ring of one rank:
/// no context parallelism), and its device collectives if it has them.
#[derive(Clone)]
pub struct ContextParallel {
    comm: Arc<dyn Communicator>,
    /// A `SharedCollectives<B>` over the ring's ranks for the backend `B`
    /// the layers compute on, or none (the ring on host buffers).
    device: AnyCollectives,
}

impl ContextParallel {
    /// No context parallelism.
    pub fn single() -> Self {
        Self::new(Arc::new(SingleProcess))
    }

    /// The ring of `comm`'s ranks (the CP group), in its rank order.
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self {
            comm,
            device: AnyCollectives::none(),
        }
    }

    /// The ring on the tensors of backend `B` (the inner backend under
    /// autodiff), over `collectives` (opened over the ring's ranks, in the
    /// same order): `RingAttention::with_device`.
    pub fn with_device<B: Backend>(self, collectives: SharedCollectives<B>) -> Self {
        assert_eq!(
            collectives.world_size(),
            self.size(),
            "device collectives over another group than the CP ring"
        );
        Self {
            device: AnyCollectives::new::<B>(collectives),
            ..self
        }
    }

    /// Ranks in the ring (the CP degree).
    pub fn size(&self) -> usize {
        self.comm.world_size()
    }

    /// How sequences of `seq` tokens are split over the ring; panics when
    /// `seq` is not a multiple of `2 * cp` (the job's validation refuses
    /// such a `seq_len` first).
    pub fn layout(&self, seq: usize) -> ChunkLayout {
        ChunkLayout::new(seq, self.size())
            .unwrap_or_else(|e| panic!("context parallelism over {} ranks: {e}", self.size()))
    }

    /// The global positions of this rank's tokens of a `seq`-token
    /// sequence, in its local order (`seq / cp` of them).
    pub fn positions(&self, seq: usize) -> Vec<usize> {
        self.layout(seq).positions(self.comm.rank())
    }

    /// This rank's tokens `[batch, seq / cp]` of `ids` `[batch, seq]`
    /// (token ids or targets, a dropped target staying dropped).
    pub fn split<B: Backend>(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 2, Int> {
        let seq = ids.dims()[1];
        let at: Vec<i64> = self.positions(seq).into_iter().map(|p| p as i64).collect();
        let n = at.len();
        let at = Tensor::<B, 1, Int>::from_data(TensorData::new(at, [n]), &ids.device());
        ids.select(1, at)
    }

    /// Whether the ring runs on device collectives
    /// ([`ContextParallel::with_device`]).
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// The ring attention of `seq`-token sequences, each block computed
    /// by `kernel` ([`block_kernel`]), or on device collectives by
    /// `device_kernel` where there is one ([`device_block_kernel`]).
    pub fn ring(
        &self,
        seq: usize,
        kernel: Arc<dyn BlockAttention + Send>,
        device_kernel: AnyBlockKernel,
    ) -> RingAttention {
        RingAttention::new(self.comm.clone(), self.layout(seq), kernel)
            .with_device(self.device.clone())
            .with_device_kernel(device_kernel)
    }

    /// The mean loss (nats per kept token, `[1]`) of the ring's sequences
    /// from this rank's mean `local` over its `targets` `[batch, seq /
    /// cp]` (negative targets are dropped, as by the loss).
    pub fn loss<B: TpOps>(&self, local: Tensor<B, 1>, targets: &Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let kept = targets
            .clone()
            .greater_equal_elem(0)
            .int()
            .sum()
            .into_scalar()
            .elem::<i64>();
        ring_mean(local, kept as usize, &TpGroup::new(self.comm.clone()))
    }
}

impl fmt::Debug for ContextParallel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ContextParallel(rank {} of {})",
            self.comm.rank(),
            self.size()
        )
    }
}
