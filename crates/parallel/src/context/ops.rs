//! Ring attention as one operation of the autodiff graph, on any backend
//! ([`CpOps`], as [`TpOps`](crate::tensor::TpOps) is for tensor
//! parallelism).
//!
//! The forward copies this rank's `q`, `k`, `v` to host buffers (f32),
//! runs [`ring_forward`] over the context-parallel group and keeps the
//! inputs, the output and the log-sum-exp; the backward runs
//! [`ring_backward`] from them and the output's gradient, and hands `dq`,
//! `dk`, `dv` to the graph in the inputs' dtype. Without autodiff
//! (evaluation) the forward runs alone. Every rank of the ring must call
//! it at the same point, forward and backward; a failed transfer cannot be
//! returned through Burn's operations, so it panics with the
//! communicator's error (which names the ranks that never arrived).

use std::fmt;
use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};

use super::backward::{ring_backward, Kept};
use super::block::{BlockAttention, HeadBuf};
use super::device::{host, tensor};
use super::forward::ring_forward;
use super::split::ChunkLayout;
use crate::comm::Communicator;

/// The ring one attention layer runs over: the context-parallel group,
/// how its sequences are split, and the per-block attention kernel (the
/// model's, with its positional bias).
#[derive(Clone)]
pub struct RingAttention {
    ring: Arc<dyn Communicator>,
    layout: ChunkLayout,
    kernel: Arc<dyn BlockAttention + Send>,
}

impl RingAttention {
    /// Attention over `ring` (the CP group, `layout.cp()` ranks) of
    /// sequences split by `layout`, each block computed by `kernel`.
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
        }
    }

    /// How the sequences are split over the ring.
    pub fn layout(&self) -> ChunkLayout {
        self.layout
    }

    /// [`ring_forward`] of host buffers: output `[batch, heads, local_len,
    /// head_dim]` and log-sum-exp `[batch, heads, local_len, 1]`.
    fn forward(&self, q: &HeadBuf, k: &HeadBuf, v: &HeadBuf) -> (HeadBuf, HeadBuf) {
        ring_forward(&*self.ring, &*self.kernel, self.layout, q, k, v)
            .unwrap_or_else(|e| panic!("ring attention forward over {self:?} failed: {e}"))
    }

    /// [`ring_backward`] of host buffers: `[dq, dk, dv]`.
    fn backward(&self, kept: Kept<'_>, d_out: &HeadBuf) -> [HeadBuf; 3] {
        ring_backward(&*self.ring, &*self.kernel, self.layout, kept, d_out)
            .unwrap_or_else(|e| panic!("ring attention backward over {self:?} failed: {e}"))
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

/// Backends that can run ring attention (see the module doc). The default
/// is the forward alone, right without autodiff; the autodiff backend
/// records one graph node whose backward is [`ring_backward`].
pub trait CpOps: Backend {
    /// Attention of this rank's queries `q` `[batch, heads, local_len,
    /// head_dim]` over the keys and values of the whole sequences, this
    /// rank's `k`, `v` `[batch, kv_heads, local_len, head_dim]` and those
    /// the ring passes round: `[batch, heads, local_len, head_dim]`, in
    /// `q`'s dtype.
    fn ring_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ring: &RingAttention,
    ) -> Tensor<Self, 4> {
        let (device, dtype) = (q.device(), q.dtype());
        let (out, _) = ring.forward(&host(q), &host(k), &host(v));
        tensor(out, &device, dtype)
    }
}

fn float<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// What the backward needs: the ring, `[q, k, v, out, lse]` on the host,
/// and the inputs' dtype.
type Saved = (RingAttention, [HeadBuf; 5], DType);

/// Backward of [`CpOps::ring_attention`]: [`ring_backward`].
#[derive(Debug)]
struct RingAttentionBackward;

impl<B: Backend> Backward<B, 3> for RingAttentionBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = float::<B>(grads.consume::<B>(&ops.node));
        let device = d_out.device();
        let (ring, [q, k, v, out, lse], dtype) = ops.state;
        let kept = Kept {
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            lse: &lse,
        };
        let values = ring.backward(kept, &host(d_out));
        for (parent, value) in ops.parents.into_iter().zip(values) {
            if let Some(node) = parent {
                let value = tensor::<B>(value, &device, dtype);
                grads.register::<B>(node.id, value.into_primitive().tensor());
            }
        }
    }
}

impl<B: Backend, C: CheckpointStrategy> CpOps for Autodiff<B, C> {
    fn ring_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ring: &RingAttention,
    ) -> Tensor<Self, 4> {
        let [q, k, v] = [q, k, v].map(|x| x.into_primitive().tensor());
        let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
        let q = float::<B>(q.primitive);
        let (device, dtype) = (q.device(), q.dtype());
        let [q, k, v] = [q, float(k.primitive), float(v.primitive)].map(host);
        let (out, lse) = ring.forward(&q, &k, &v);
        let result = tensor::<B>(out.clone(), &device, dtype)
            .into_primitive()
            .tensor();
        let result = match RingAttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                prep.finish((ring.clone(), [q, k, v, out, lse], dtype), result)
            }
            OpsKind::UnTracked(prep) => prep.finish(result),
        };
        Tensor::from_primitive(TensorPrimitive::Float(result))
    }
}

#[cfg(feature = "flex")]
impl CpOps for burn::backend::Flex {}

#[cfg(feature = "ndarray")]
impl CpOps for burn::backend::NdArray {}

impl<R, F, I, BT> CpOps for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::element::BoolElement,
{
}
