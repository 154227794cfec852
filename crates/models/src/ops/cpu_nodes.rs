//! The CPU operations of `ops::cpu` (GELU-tanh; SwiGLU's nodes are in
//! `ops::swiglu::cpu`, the norms' in `ops::norm::cpu`, RoPE's in
//! `ops::rope::cpu`) on the flex
//! backend: the forward alone on `Flex` (evaluation, generation), and on
//! `Autodiff<Flex, C>` one graph node each whose backward is the
//! operation's own one-pass backward, in place of the 10 to 20 nodes of
//! Burn's autodiff of the reference. Inputs that are not f32 (mixed precision) take the
//! reference.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;
use burn::tensor::DType;

use super::cpu::{self, dense};
use super::fused::gelu_reference;

/// The autodiff backend over flex.
type Ad<C> = Autodiff<Flex, C>;

/// Whether every tensor is f32 (what the CPU operations take).
pub(super) fn all_f32(tensors: &[&FlexTensor]) -> bool {
    tensors.iter().all(|t| t.dtype() == DType::F32)
}

/// GELU-tanh on flex without autodiff.
pub(super) fn gelu_forward(x: FlexTensor) -> FlexTensor {
    if !all_f32(&[&x]) {
        return gelu_reference::<Flex>(x);
    }
    cpu::gelu_tanh(&dense(x))
}

#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    /// The input, dense.
    type State = FlexTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = dense(grads.consume::<Flex>(&ops.node));
        let d_x = cpu::gelu_tanh_backward(&ops.state, d_y);
        register!(Flex, grads, ops.parents, [d_x]);
    }
}

/// GELU-tanh of `x` as one node of the autodiff graph over flex.
pub(super) fn gelu_node<C: CheckpointStrategy>(x: FloatTensor<Ad<C>>) -> FloatTensor<Ad<C>> {
    if !all_f32(&[&x.primitive]) {
        return gelu_reference::<Ad<C>>(x);
    }
    let x_dense = dense(x.primitive);
    match GeluBackward
        .prepare::<C>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = cpu::gelu_tanh(&x_dense);
            prep.finish(x_dense, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu::gelu_tanh(&x_dense)),
    }
}
