//! Selective recomputation of the attention core (Korthikanti et al.
//! 2022, Sec. 5) on the autodiff backend: the core is one graph node that
//! keeps only `q`, `k`, `v` and the bias, and whose backward recomputes
//! the probabilities (`KernelBackend::attention_core_backward`: the
//! reference's, or flex's host-buffer backward), so the
//! `[batch, heads, len, keys]` scores, softmax and probabilities of every
//! layer do not live from forward to backward. The fused path needs no such
//! node: FlashAttention keeps only its output and log-sum-exp.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;

use super::reference::{attention_reference_backward_on, attention_reference_on};
use crate::ops::fused::KernelBackend;

/// Which attention core a node runs, forward and backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::ops) enum Core {
    /// `attention_reference` and `attention_reference_backward`.
    Reference,
    /// [`KernelBackend::attention_core`] and
    /// [`KernelBackend::attention_core_backward`] (flex: host buffers).
    Host,
}

#[derive(Debug)]
struct RecomputedAttentionBackward {
    core: Core,
}

impl<B: KernelBackend> Backward<B, 3> for RecomputedAttentionBackward {
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
        let values = match self.core {
            Core::Host => B::attention_core_backward(q, k, v, bias, d_out),
            Core::Reference => attention_reference_backward_on::<B>(q, k, v, bias, d_out),
        };
        for (parent, value) in ops.parents.into_iter().zip(values) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, value);
            }
        }
    }
}

/// The attention `core` of `q`, `k`, `v` with additive `bias` (a
/// constant: no gradient flows to it) as one node of the autodiff graph
/// (shapes of [`super::attention_reference`]).
pub(in crate::ops) fn node<B: KernelBackend, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    core: Core,
) -> FloatTensor<Autodiff<B, C>> {
    let bias = bias.primitive;
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    let forward = |q, k, v, bias: &FloatTensor<B>| match core {
        Core::Host => B::attention_core(q, k, v, bias.clone()),
        Core::Reference => attention_reference_on::<B>(q, k, v, bias.clone()),
    };
    match (RecomputedAttentionBackward { core })
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
