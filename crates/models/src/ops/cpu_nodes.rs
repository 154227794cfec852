//! The CPU operations of `ops::cpu` (GELU-tanh, RMSNorm, LayerNorm, RoPE;
//! SwiGLU's node is `ops::swiglu::cpu`) on the flex backend: the forward
//! alone on `Flex` (evaluation, generation), and on `Autodiff<Flex, C>` one
//! graph node each whose backward is the operation's own one-pass
//! backward, in place of the 10 to 20 nodes of Burn's autodiff of the
//! reference. Inputs that are not f32 (mixed precision) take the
//! reference.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::ops::FloatTensor;
use burn::tensor::DType;

use super::cpu::{self, dense, RowStats};
use super::fused::{
    gelu_reference, layer_norm_reference_on, rms_norm_reference_on, rope_reference_on,
};

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

/// RMSNorm on flex without autodiff.
pub(super) fn rms_norm_forward(x: FlexTensor, weight: FlexTensor, eps: f64) -> FlexTensor {
    if !all_f32(&[&x, &weight]) {
        return rms_norm_reference_on::<Flex>(x, weight, eps);
    }
    cpu::rms_norm(&dense(x), &dense(weight), eps as f32).0
}

/// LayerNorm on flex without autodiff.
pub(super) fn layer_norm_forward(
    x: FlexTensor,
    weight: FlexTensor,
    bias: FlexTensor,
    eps: f64,
) -> FlexTensor {
    if !all_f32(&[&x, &weight, &bias]) {
        return layer_norm_reference_on::<Flex>(x, weight, bias, eps);
    }
    cpu::layer_norm(&dense(x), &dense(weight), &dense(bias), eps as f32).0
}

/// RoPE with the tables `cos`, `sin` on flex without autodiff.
pub(super) fn rope_forward(x: FlexTensor, cos: FlexTensor, sin: FlexTensor) -> FlexTensor {
    if !all_f32(&[&x, &cos, &sin]) {
        return rope_reference_on::<Flex>(x, cos, sin);
    }
    cpu::rope(x, cos, sin)
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

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Flex, 2> for RmsNormBackward {
    /// `x`, the weight (dense), each row's statistics.
    type State = (FlexTensor, FlexTensor, RowStats);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = dense(grads.consume::<Flex>(&ops.node));
        let (x, weight, stats) = ops.state;
        let [d_x, d_w, _] = cpu::norm_backward(&x, &weight, &stats, d_y);
        register!(Flex, grads, ops.parents, [d_x, d_w]);
    }
}

/// RMSNorm of `x` with `weight` as one node of the autodiff graph over
/// flex.
pub(super) fn rms_norm_node<C: CheckpointStrategy>(
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
            let (y, stats) = cpu::rms_norm(&xs, &w, eps as f32);
            prep.finish((xs, w, stats), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu::rms_norm(&xs, &w, eps as f32).0),
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
        let values = cpu::norm_backward(&x, &weight, &stats, d_y);
        register!(Flex, grads, ops.parents, values);
    }
}

/// LayerNorm of `x` with `weight` and `bias` as one node of the autodiff
/// graph over flex.
pub(super) fn layer_norm_node<C: CheckpointStrategy>(
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
            let (y, stats) = cpu::layer_norm(&xs, &w, &b, eps as f32);
            prep.finish((xs, w, stats), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu::layer_norm(&xs, &w, &b, eps as f32).0),
    }
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
        let d_x = cpu::rope_backward(d_y, cos, sin);
        register!(Flex, grads, ops.parents, [d_x]);
    }
}

/// RoPE of `x` with the constant tables `cos`, `sin` (no gradient reaches
/// them) as one node of the autodiff graph over flex.
pub(super) fn rope_node<C: CheckpointStrategy>(
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
            let y = cpu::rope(x.primitive, cos.clone(), sin.clone());
            prep.finish((cos, sin), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(cpu::rope(x.primitive, cos, sin)),
    }
}
