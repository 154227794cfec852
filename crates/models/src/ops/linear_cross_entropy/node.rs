//! The head as one node of the autodiff graph over any
//! [`KernelBackend`]: the tracked forward forms the gradients (the
//! backend's [`KernelBackend::linear_cross_entropy_parts`]) and the
//! backward scales them by the upstream gradient (see the module
//! documentation of `ops::linear_cross_entropy`).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::FloatDType;

use super::{t2, GradPrimitives};
use crate::ops::fused::KernelBackend;

/// The forward alone on a backend without autodiff (evaluation): the loss
/// `[1]` of [`super::linear_cross_entropy_blocks`].
pub(in crate::ops) fn forward_only<B: KernelBackend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    targets: IntTensor<B>,
) -> FloatTensor<B> {
    B::linear_cross_entropy_parts(x, weight, targets, false).0
}

#[derive(Debug)]
struct LinearCrossEntropyBackward;

impl<B: Backend> Backward<B, 2> for LinearCrossEntropyBackward {
    /// `d_x` and `d_w` for an upstream gradient of the scale they carry.
    type State = GradPrimitives<B>;

    /// Each gradient times `upstream / scale`, multiplied in f32 and
    /// rounded once to `x`'s dtype, as the plain path rounds the logits'
    /// gradient once after the upstream gradient reached it (in f16 the
    /// loss scale must reach it before the rounding).
    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let upstream = t2::<B>(B::float_reshape(
            grads.consume::<B>(&ops.node),
            burn::tensor::Shape::new([1, 1]),
        ));
        let (d_x, d_w, scale) = ops.state;
        let dtype = t2::<B>(d_x.clone()).dtype();
        let factor = upstream.cast(FloatDType::F32).mul_scalar(1.0 / scale);
        for (parent, grad) in ops.parents.into_iter().zip([d_x, d_w]) {
            if let Some(node) = parent {
                let grad = (t2::<B>(grad).cast(FloatDType::F32) * factor.clone()).cast(dtype);
                grads.register::<B>(node.id, grad.into_primitive().tensor());
            }
        }
    }
}

/// The operation as one node of the autodiff graph over `B`, whose parents
/// are `x` and the weight (shapes of [`super::linear_cross_entropy_blocks`]).
pub(in crate::ops) fn autodiff_node<B: KernelBackend, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    targets: IntTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let targets: IntTensor<B> = targets;
    let nodes = [x.node.clone(), weight.node.clone()];
    match LinearCrossEntropyBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (loss, grads) =
                B::linear_cross_entropy_parts(x.primitive, weight.primitive, targets, true);
            let grads = grads.expect("the tracked forward forms the gradients");
            prep.finish(grads, loss)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(forward_only::<B>(x.primitive, weight.primitive, targets))
        }
    }
}
