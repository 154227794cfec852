//! Selective recomputation of the reference attention (Korthikanti et al.
//! 2022, Sec. 5) on the autodiff backend: the attention core is one graph
//! node that keeps only `q`, `k`, `v` and the bias, and whose backward
//! recomputes the probabilities (`attention_reference_backward`), so the
//! `[batch, heads, len, keys]` scores, softmax and probabilities of every
//! layer do not live from forward to backward. The fused path needs no such
//! node: FlashAttention keeps only its output and log-sum-exp.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::attention::{attention_reference, attention_reference_backward};

/// A float primitive as a rank-4 tensor.
fn t4<B: Backend>(p: FloatTensor<B>) -> Tensor<B, 4> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

#[derive(Debug)]
struct RecomputedAttentionBackward;

impl<B: Backend> Backward<B, 3> for RecomputedAttentionBackward {
    /// `q`, `k`, `v`, the bias.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let (q, k, v, bias) = ops.state;
        let values = attention_reference_backward(t4::<B>(q), t4(k), t4(v), &t4(bias), t4(d_out));
        for (parent, value) in ops.parents.into_iter().zip(values) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, value.into_primitive().tensor());
            }
        }
    }
}

/// The reference attention of `q`, `k`, `v` with additive `bias` (a
/// constant: no gradient flows to it) as one node of the autodiff graph
/// (shapes of `super::attention_reference`).
pub(super) fn attention_node<B: Backend, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let bias = bias.primitive;
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let forward = |q, k, v, bias: &FloatTensor<B>| {
        attention_reference(t4::<B>(q), t4(k), t4(v), &t4(bias.clone()))
            .into_primitive()
            .tensor()
    };
    match RecomputedAttentionBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = forward(
                q.primitive.clone(),
                k.primitive.clone(),
                v.primitive.clone(),
                &bias,
            );
            prep.finish((q.primitive, k.primitive, v.primitive, bias), out)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(forward(q.primitive, k.primitive, v.primitive, &bias))
        }
    }
}
