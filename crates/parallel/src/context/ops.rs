//! Ring attention as one operation of the autodiff graph, on any backend
//! ([`CpOps`], as [`TpOps`](crate::tensor::TpOps) is for tensor
//! parallelism).
//!
//! The forward copies this rank's `q`, `k`, `v` to host buffers (f32),
//! runs [`ring_forward`](super::ring_forward) over the context-parallel
//! group and keeps the inputs, the output and the log-sum-exp; the
//! backward runs [`ring_backward`](super::ring_backward) from them and the
//! output's gradient, and hands `dq`, `dk`, `dv` to the graph in the
//! inputs' dtype. With device collectives
//! ([`RingAttention::with_device`]) the same runs on the tensors cast to
//! f32 ([`super::DeviceRing`]), each block's kernel through
//! [`super::OnHost`]. Without autodiff
//! (evaluation) the forward runs alone. Every rank of the ring must call
//! it at the same point, forward and backward; a failed transfer cannot be
//! returned through Burn's operations, so it panics with the
//! communicator's error (which names the ranks that never arrived).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, FloatDType, Tensor, TensorPrimitive};

use super::attention::RingAttention;
use super::backward::Kept;
use super::block::HeadBuf;
use super::device::{host, tensor};

/// Backends that can run ring attention (see the module doc). The default
/// is the forward alone, right without autodiff; the autodiff backend
/// records one graph node whose backward is
/// [`ring_backward`](super::ring_backward).
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
        if let Some(collectives) = ring.collectives::<Self>() {
            let [q, k, v] = [q, k, v].map(|x| x.cast(FloatDType::F32));
            let (out, _) = ring.forward_on(collectives, [&q, &k, &v]);
            return out.cast(dtype);
        }
        let (out, _) = ring.forward(&host(q), &host(k), &host(v));
        tensor(out, &device, dtype)
    }
}

fn float<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// What the forward keeps, `[q, k, v, out, lse]`: on the host, or (with
/// device collectives) as f32 device tensors.
#[derive(Clone, Debug)]
enum Held<B: Backend> {
    Host(Box<[HeadBuf; 5]>),
    Device([Tensor<B, 4>; 5]),
}

/// What the backward needs: the ring, what the forward kept, and the
/// inputs' dtype.
type Saved<B> = (RingAttention, Held<B>, DType);

/// Backward of [`CpOps::ring_attention`]: [`ring_backward`](super::ring_backward).
#[derive(Debug)]
struct RingAttentionBackward;

impl<B: Backend> Backward<B, 3> for RingAttentionBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = float::<B>(grads.consume::<B>(&ops.node));
        let device = d_out.device();
        let (ring, held, dtype) = ops.state;
        let values: [Tensor<B, 4>; 3] = match held {
            Held::Host(kept) => {
                let values = ring.backward(Kept::of(kept.each_ref()), &host(d_out));
                values.map(|value| tensor::<B>(value, &device, dtype))
            }
            Held::Device(kept) => {
                let collectives = ring
                    .collectives::<B>()
                    .expect("a ring whose forward ran on device collectives has them");
                let d_out = d_out.cast(FloatDType::F32);
                let values = ring.backward_on(collectives, Kept::of(kept.each_ref()), &d_out);
                values.map(|value| value.cast(dtype))
            }
        };
        for (parent, value) in ops.parents.into_iter().zip(values) {
            if let Some(node) = parent {
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
        let [q, k, v] = [q, float(k.primitive), float(v.primitive)];
        let (result, held) = match ring.collectives::<B>() {
            Some(collectives) => {
                let [q, k, v] = [q, k, v].map(|x| x.cast(FloatDType::F32));
                let (out, lse) = ring.forward_on(collectives, [&q, &k, &v]);
                (out.clone().cast(dtype), Held::Device([q, k, v, out, lse]))
            }
            None => {
                let [q, k, v] = [q, k, v].map(host);
                let (out, lse) = ring.forward(&q, &k, &v);
                let result = tensor::<B>(out.clone(), &device, dtype);
                (result, Held::Host(Box::new([q, k, v, out, lse])))
            }
        };
        let result = result.into_primitive().tensor();
        let result = match RingAttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((ring.clone(), held, dtype), result),
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
