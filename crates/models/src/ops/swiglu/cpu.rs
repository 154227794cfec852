//! SwiGLU as Ferrotron's CPU operation on flex (`cpu_kernel::swiglu`, one
//! pass each way over the host buffers): the forward alone on `Flex`
//! ([`forward`]), and on `Autodiff<Flex, C>` one graph node keeping the
//! dense inputs whose backward is the one-pass backward ([`node`]).
//! Inputs that are not f32 (mixed precision) take the reference.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;

use super::cpu_kernel;
use super::reference::swiglu_reference_on;
use crate::ops::cpu::{all_f32, dense};

/// `silu(gate) * up` on flex without autodiff.
pub(in crate::ops) fn forward(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
    if !all_f32(&[&gate, &up]) {
        return swiglu_reference_on::<Flex>(gate, up);
    }
    cpu_kernel::swiglu(&dense(gate), &dense(up))
}

#[derive(Debug)]
struct SwigluBackward;

impl Backward<Flex, 2> for SwigluBackward {
    /// `gate`, `up`, dense.
    type State = (FlexTensor, FlexTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = dense(grads.consume::<Flex>(&ops.node));
        let (gate, up) = ops.state;
        let values = cpu_kernel::swiglu_backward(gate, up, &d_out);
        register!(Flex, grads, ops.parents, values);
    }
}

/// `silu(gate) * up` as one node of the autodiff graph over flex.
pub(in crate::ops) fn node<C: CheckpointStrategy>(
    gate: FloatTensor<Autodiff<Flex, C>>,
    up: FloatTensor<Autodiff<Flex, C>>,
) -> FloatTensor<Autodiff<Flex, C>> {
    if !all_f32(&[&gate.primitive, &up.primitive]) {
        return swiglu_reference_on::<Autodiff<Flex, C>>(gate, up);
    }
    let (g, u) = (dense(gate.primitive), dense(up.primitive));
    match SwigluBackward
        .prepare::<C>([gate.node, up.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = cpu_kernel::swiglu(&g, &u);
            prep.finish((g, u), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu_kernel::swiglu(&g, &u)),
    }
}
