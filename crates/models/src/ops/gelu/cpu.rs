//! GELU-tanh as Ferrotron's CPU operation on flex (`cpu_kernel::gelu_tanh`,
//! one pass each way over the host buffers): the forward alone on `Flex`
//! ([`forward`]), and on `Autodiff<Flex, C>` one graph node keeping the
//! dense input whose backward is the one-pass backward ([`node`]), in
//! place of the 10 to 20 nodes of Burn's autodiff of the reference.
//! Inputs that are not f32 (mixed precision) take the reference.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;

use super::cpu_kernel;
use super::reference::gelu_reference_on;
use crate::ops::cpu::{all_f32, dense};

/// The autodiff backend over flex.
type Ad<C> = Autodiff<Flex, C>;

/// GELU-tanh on flex without autodiff.
pub(in crate::ops) fn forward(x: FlexTensor) -> FlexTensor {
    if !all_f32(&[&x]) {
        return gelu_reference_on::<Flex>(x);
    }
    cpu_kernel::gelu_tanh(&dense(x))
}

#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    /// The input, dense.
    type State = FlexTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = dense(grads.consume::<Flex>(&ops.node));
        let d_x = cpu_kernel::gelu_tanh_backward(&ops.state, d_y);
        register!(Flex, grads, ops.parents, [d_x]);
    }
}

/// GELU-tanh of `x` as one node of the autodiff graph over flex.
pub(in crate::ops) fn node<C: CheckpointStrategy>(x: FloatTensor<Ad<C>>) -> FloatTensor<Ad<C>> {
    if !all_f32(&[&x.primitive]) {
        return gelu_reference_on::<Ad<C>>(x);
    }
    let x_dense = dense(x.primitive);
    match GeluBackward
        .prepare::<C>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = cpu_kernel::gelu_tanh(&x_dense);
            prep.finish(x_dense, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu_kernel::gelu_tanh(&x_dense)),
    }
}
