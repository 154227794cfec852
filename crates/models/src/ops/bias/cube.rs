//! The bias add on the CubeCL backends: the `ferrotron_kernels::bias`
//! launchers on the backend's buffers ([`forward`], [`grad`], what
//! `FusedKernels::bias_add` and `bias_grad` run), and on the autodiff
//! backend over them one graph node whose backward passes `y`'s gradient
//! through and sums it over the rows for the bias ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::bias::{bias_add, bias_grad};

use crate::ops::cube::{
    cast_to, contiguous, empty, in_f32, kernel_dtype, launched, owned, rows_hidden,
};
use crate::ops::fused::FusedKernels;

/// `y + bias` for `y` `[rows, n]`, by the kernel in `y`'s dtype (f32
/// between casts where the runtime lacks it, see `ops::cube`), written over
/// `y`'s buffer when nothing else holds it; the bias is read in f32.
pub(in crate::ops) fn forward<R: CubeRuntime>(
    y: CubeTensor<R>,
    bias: CubeTensor<R>,
) -> CubeTensor<R> {
    let Some(dtype) = kernel_dtype(&y) else {
        let back = y.dtype;
        return cast_to(forward(in_f32(y), bias), back);
    };
    let (y, bias) = (owned(y), contiguous(in_f32(bias)));
    let (rows, cols) = rows_hidden(&y);
    launched(
        "bias add",
        bias_add(&y.client, dtype, &y.handle, &bias.handle, rows, cols),
    );
    y
}

/// The bias's gradient `[n]` for `d_y` `[rows, n]`: its sum over the rows
/// in f32, then cast to `dtype` (the bias's).
pub(in crate::ops) fn grad<R: CubeRuntime>(d_y: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    let Some(kernel) = kernel_dtype(&d_y) else {
        return grad(in_f32(d_y), dtype);
    };
    let d_y = contiguous(d_y);
    let (rows, cols) = rows_hidden(&d_y);
    let d_bias = empty(&d_y, Shape::new([cols]));
    launched(
        "bias grad",
        bias_grad(&d_y.client, kernel, &d_y.handle, &d_bias.handle, rows, cols),
    );
    cast_to(d_bias, dtype)
}

#[derive(Debug)]
struct BiasBackward;

impl<B: FusedKernels> Backward<B, 2> for BiasBackward {
    /// The bias's dtype.
    type State = DType;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = grads.consume::<B>(&ops.node);
        let [y_parent, bias_parent] = ops.parents;
        if let Some(node) = bias_parent {
            grads.register::<B>(node.id, B::bias_grad(d_y.clone(), ops.state));
        }
        if let Some(node) = y_parent {
            grads.register::<B>(node.id, d_y);
        }
    }
}

/// `y + bias` as one node of the autodiff graph over a backend with the
/// fused kernels.
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    y: FloatTensor<Autodiff<B, C>>,
    bias: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = [y.node.clone(), bias.node.clone()];
    match BiasBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let dtype = bias.primitive.dtype();
            prep.finish(dtype, B::bias_add(y.primitive, bias.primitive))
        }
        OpsKind::UnTracked(prep) => prep.finish(B::bias_add(y.primitive, bias.primitive)),
    }
}
