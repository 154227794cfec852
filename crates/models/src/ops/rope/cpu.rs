//! RoPE as Ferrotron's CPU operation on flex (`cpu_kernel::rope`, one pass
//! each way over the host buffers): the forward alone on `Flex`
//! ([`forward`]), and on `Autodiff<Flex, C>` one graph node keeping only
//! the tables whose backward is the one-pass backward ([`node`]). Inputs
//! that are not f32 (mixed precision) take the reference.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;

use super::cpu_kernel;
use super::reference::rope_reference_on;
use crate::ops::cpu::all_f32;

/// The autodiff backend over flex.
type Ad<C> = Autodiff<Flex, C>;

/// RoPE with the tables `cos`, `sin` on flex without autodiff.
pub(in crate::ops) fn forward(x: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
    if !all_f32(&[&x, &cos, &sin]) {
        return rope_reference_on::<Flex>(x, cos, sin);
    }
    cpu_kernel::rope(x, cos, sin)
}

#[derive(Debug)]
struct RopeBackward;

impl Backward<Flex, 1> for RopeBackward {
    /// The tables `cos`, `sin` (shared by every layer: the node keeps no
    /// activation of its own).
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = grads.consume::<Flex>(&ops.node);
        let (cos, sin) = ops.state;
        let d_x = cpu_kernel::rope_backward(d_y, cos, sin);
        register!(Flex, grads, ops.parents, [d_x]);
    }
}

/// RoPE of `x` with the constant tables `cos`, `sin` (no gradient reaches
/// them) as one node of the autodiff graph over flex.
pub(in crate::ops) fn node<C: CheckpointStrategy>(
    x: FloatTensor<Ad<C>>,
    cos: FloatTensor<Ad<C>>,
    sin: FloatTensor<Ad<C>>,
) -> FloatTensor<Ad<C>> {
    if !all_f32(&[&x.primitive, &cos.primitive, &sin.primitive]) {
        return rope_reference_on::<Ad<C>>(x, cos, sin);
    }
    let (cos, sin) = (cos.primitive, sin.primitive);
    match RopeBackward
        .prepare::<C>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = cpu_kernel::rope(x.primitive, cos.clone(), sin.clone());
            prep.finish((cos, sin), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu_kernel::rope(x.primitive, cos, sin)),
    }
}
