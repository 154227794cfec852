//! RMSNorm and LayerNorm as Ferrotron's CPU operations on flex
//! (`cpu_kernel::rms_norm`, `layer_norm` and `norm_backward`, one pass each
//! way over the host buffers): the forwards alone on `Flex`
//! ([`rms_forward`], [`layer_forward`]), and on `Autodiff<Flex, C>` one
//! graph node each keeping the dense input, the weight and each row's
//! statistics ([`rms_node`], [`layer_node`]). Inputs that are not f32
//! (mixed precision) take the reference.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;

use super::cpu_kernel::{self, RowStats};
use super::reference::{layer_norm_reference_on, rms_norm_reference_on};
use crate::ops::cpu::{all_f32, dense};

/// The autodiff backend over flex.
type Ad<C> = Autodiff<Flex, C>;

/// RMSNorm on flex without autodiff.
pub(in crate::ops) fn rms_forward(x: FlexTensor, weight: FlexTensor, eps: f64) -> FlexTensor {
    if !all_f32(&[&x, &weight]) {
        return rms_norm_reference_on::<Flex>(x, weight, eps);
    }
    cpu_kernel::rms_norm(&dense(x), &dense(weight), eps as f32).0
}

/// LayerNorm on flex without autodiff.
pub(in crate::ops) fn layer_forward(
    x: FlexTensor,
    weight: FlexTensor,
    bias: FlexTensor,
    eps: f64,
) -> FlexTensor {
    if !all_f32(&[&x, &weight, &bias]) {
        return layer_norm_reference_on::<Flex>(x, weight, bias, eps);
    }
    cpu_kernel::layer_norm(&dense(x), &dense(weight), &dense(bias), eps as f32).0
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Flex, 2> for RmsNormBackward {
    /// `x`, the weight (dense), each row's statistics.
    type State = (FlexTensor, FlexTensor, RowStats);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = dense(grads.consume::<Flex>(&ops.node));
        let (x, weight, stats) = ops.state;
        let [d_x, d_w, _] = cpu_kernel::norm_backward(&x, &weight, &stats, d_y);
        register!(Flex, grads, ops.parents, [d_x, d_w]);
    }
}

/// RMSNorm of `x` with `weight` as one node of the autodiff graph over
/// flex.
pub(in crate::ops) fn rms_node<C: CheckpointStrategy>(
    x: FloatTensor<Ad<C>>,
    weight: FloatTensor<Ad<C>>,
    eps: f64,
) -> FloatTensor<Ad<C>> {
    if !all_f32(&[&x.primitive, &weight.primitive]) {
        return rms_norm_reference_on::<Ad<C>>(x, weight, eps);
    }
    let (xs, w) = (dense(x.primitive), dense(weight.primitive));
    match RmsNormBackward
        .prepare::<C>([x.node, weight.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (y, stats) = cpu_kernel::rms_norm(&xs, &w, eps as f32);
            prep.finish((xs, w, stats), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu_kernel::rms_norm(&xs, &w, eps as f32).0),
    }
}

#[derive(Debug)]
struct LayerNormBackward;

impl Backward<Flex, 3> for LayerNormBackward {
    /// `x`, the weight (dense), each row's statistics.
    type State = (FlexTensor, FlexTensor, RowStats);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = dense(grads.consume::<Flex>(&ops.node));
        let (x, weight, stats) = ops.state;
        let values = cpu_kernel::norm_backward(&x, &weight, &stats, d_y);
        register!(Flex, grads, ops.parents, values);
    }
}

/// LayerNorm of `x` with `weight` and `bias` as one node of the autodiff
/// graph over flex.
pub(in crate::ops) fn layer_node<C: CheckpointStrategy>(
    x: FloatTensor<Ad<C>>,
    weight: FloatTensor<Ad<C>>,
    bias: FloatTensor<Ad<C>>,
    eps: f64,
) -> FloatTensor<Ad<C>> {
    if !all_f32(&[&x.primitive, &weight.primitive, &bias.primitive]) {
        return layer_norm_reference_on::<Ad<C>>(x, weight, bias, eps);
    }
    let (xs, w, b) = (
        dense(x.primitive),
        dense(weight.primitive),
        dense(bias.primitive),
    );
    match LayerNormBackward
        .prepare::<C>([x.node, weight.node, bias.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (y, stats) = cpu_kernel::layer_norm(&xs, &w, &b, eps as f32);
            prep.finish((xs, w, stats), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu_kernel::layer_norm(&xs, &w, &b, eps as f32).0),
    }
}
