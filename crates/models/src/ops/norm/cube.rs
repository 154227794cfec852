//! RMSNorm and LayerNorm on the CubeCL backends: the
//! `ferrotron_kernels::norm` launchers on the backend's buffers (f32, with
//! each row's statistics for the backward and deterministic parameter
//! gradients; what `FusedKernels::rms_norm_forward` and the others run),
//! and on the autodiff backend over them one graph node each whose
//! backward is the kernels' ([`rms_node`], [`layer_node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::norm::{layer, rms};

use crate::ops::cube::{contiguous, empty, launched, rows_hidden};
use crate::ops::fused::FusedKernels;

/// RMSNorm's forward kernel: the output and each row's reciprocal RMS.
pub(in crate::ops) fn rms_forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let (x, weight) = (contiguous(x), contiguous(weight));
    let (rows, hidden) = rows_hidden(&x);
    let y = empty(&x, x.shape());
    let rstd = empty(&x, Shape::new([rows]));
    launched(
        "rms_norm forward",
        rms::rms_norm_forward(
            &x.client,
            &x.handle,
            &weight.handle,
            &y.handle,
            &rstd.handle,
            rows,
            hidden,
            eps,
        ),
    );
    (y, rstd)
}

/// RMSNorm's backward kernels: `[dx, d_weight]`.
pub(in crate::ops) fn rms_backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    rstd: CubeTensor<R>,
    dy: CubeTensor<R>,
) -> [CubeTensor<R>; 2] {
    let (x, weight, rstd, dy) = (
        contiguous(x),
        contiguous(weight),
        contiguous(rstd),
        contiguous(dy),
    );
    let (rows, hidden) = rows_hidden(&x);
    let dx = empty(&x, x.shape());
    let d_weight = empty(&x, weight.shape());
    launched(
        "rms_norm backward",
        rms::rms_norm_backward(
            &x.client,
            &x.handle,
            &weight.handle,
            &rstd.handle,
            &dy.handle,
            &dx.handle,
            &d_weight.handle,
            rows,
            hidden,
        ),
    );
    [dx, d_weight]
}

/// LayerNorm's forward kernel: the output, each row's mean and
/// reciprocal standard deviation.
pub(in crate::ops) fn layer_forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    bias: CubeTensor<R>,
    eps: f32,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    let (x, weight, bias) = (contiguous(x), contiguous(weight), contiguous(bias));
    let (rows, hidden) = rows_hidden(&x);
    let y = empty(&x, x.shape());
    let mean = empty(&x, Shape::new([rows]));
    let rstd = empty(&x, Shape::new([rows]));
    launched(
        "layer_norm forward",
        layer::layer_norm_forward(
            &x.client,
            &x.handle,
            &weight.handle,
            &bias.handle,
            &y.handle,
            &mean.handle,
            &rstd.handle,
            rows,
            hidden,
            eps,
        ),
    );
    (y, mean, rstd)
}

/// LayerNorm's backward kernels: `[dx, d_weight, d_bias]`.
pub(in crate::ops) fn layer_backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    mean: CubeTensor<R>,
    rstd: CubeTensor<R>,
    dy: CubeTensor<R>,
) -> [CubeTensor<R>; 3] {
    let (x, weight, mean, rstd, dy) = (
        contiguous(x),
        contiguous(weight),
        contiguous(mean),
        contiguous(rstd),
        contiguous(dy),
    );
    let (rows, hidden) = rows_hidden(&x);
    let dx = empty(&x, x.shape());
    let d_weight = empty(&x, weight.shape());
    let d_bias = empty(&x, weight.shape());
    launched(
        "layer_norm backward",
        layer::layer_norm_backward(
            &x.client,
            &x.handle,
            &weight.handle,
            &mean.handle,
            &rstd.handle,
            &dy.handle,
            &dx.handle,
            &d_weight.handle,
            &d_bias.handle,
            rows,
            hidden,
        ),
    );
    [dx, d_weight, d_bias]
}

#[derive(Debug)]
struct RmsNormBackward;

impl<B: FusedKernels> Backward<B, 2> for RmsNormBackward {
    /// `x`, weight, reciprocal RMS per row.
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (x, weight, rstd) = ops.state;
        register!(
            B,
            grads,
            ops.parents,
            B::rms_norm_backward(x, weight, rstd, dy)
        );
    }
}

#[derive(Debug)]
struct LayerNormBackward;

impl<B: FusedKernels> Backward<B, 3> for LayerNormBackward {
    /// `x`, weight, mean and reciprocal standard deviation per row.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = grads.consume::<B>(&ops.node);
        let (x, weight, mean, rstd) = ops.state;
        let values = B::layer_norm_backward(x, weight, mean, rstd, dy);
        register!(B, grads, ops.parents, values);
    }
}

/// RMSNorm as one autodiff node over a backend with the fused kernels,
/// keeping `x`, the weight and each row's reciprocal RMS.
pub(in crate::ops) fn rms_node<B: FusedKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    eps: f32,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = [x.node.clone(), weight.node.clone()];
    match RmsNormBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (y, rstd) = B::rms_norm_forward(x.primitive.clone(), weight.primitive.clone(), eps);
            prep.finish((x.primitive, weight.primitive, rstd), y)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::rms_norm_forward(x.primitive, weight.primitive, eps).0)
        }
    }
}

/// LayerNorm as one autodiff node over a backend with the fused kernels,
/// keeping `x`, the weight and each row's mean and reciprocal standard
/// deviation.
pub(in crate::ops) fn layer_node<B: FusedKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
    eps: f32,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = [x.node.clone(), weight.node.clone(), bias.node.clone()];
    match LayerNormBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (y, mean, rstd) = B::layer_norm_forward(
                x.primitive.clone(),
                weight.primitive.clone(),
                bias.primitive,
                eps,
            );
            prep.finish((x.primitive, weight.primitive, mean, rstd), y)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(B::layer_norm_forward(x.primitive, weight.primitive, bias.primitive, eps).0)
        }
    }
}
