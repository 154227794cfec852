//! GELU-tanh on the CubeCL backends: the `ferrotron_kernels::gelu`
//! launchers on the backend's buffers ([`forward`], [`backward`], what
//! `FusedKernels::gelu_tanh_forward` and `gelu_tanh_backward` run), and on
//! the autodiff backend over them one graph node keeping the input whose
//! backward is the kernel's ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::gelu::{gelu_tanh_backward, gelu_tanh_forward};

use crate::ops::cube::{cast_to, contiguous, empty_like, in_f32, kernel_dtype, launched};
use crate::ops::fused::FusedKernels;

/// GELU-tanh of `x` by the kernel in `x`'s dtype (f32 between casts where
/// the runtime lacks it, see `ops::cube`).
pub(in crate::ops) fn forward<R: CubeRuntime>(x: CubeTensor<R>) -> CubeTensor<R> {
    let Some(dtype) = kernel_dtype(&x) else {
        let back = x.dtype;
        return cast_to(forward(in_f32(x)), back);
    };
    let x = contiguous(x);
    let y = empty_like(&x, x.shape());
    let len = x.shape().num_elements();
    launched(
        "gelu forward",
        gelu_tanh_forward(&x.client, dtype, &x.handle, &y.handle, len),
    );
    y
}

/// The gradient of [`forward`]'s input for `d_y`, in `x`'s dtype.
pub(in crate::ops) fn backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    d_y: CubeTensor<R>,
) -> CubeTensor<R> {
    let Some(dtype) = kernel_dtype(&x) else {
        let back = x.dtype;
        return cast_to(backward(in_f32(x), in_f32(d_y)), back);
    };
    let (x, d_y) = (contiguous(x), contiguous(d_y));
    let d_x = empty_like(&x, x.shape());
    let len = x.shape().num_elements();
    launched(
        "gelu backward",
        gelu_tanh_backward(&x.client, dtype, &x.handle, &d_y.handle, &d_x.handle, len),
    );
    d_x
}

#[derive(Debug)]
struct GeluBackward;

impl<B: FusedKernels> Backward<B, 1> for GeluBackward {
    /// The input.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = grads.consume::<B>(&ops.node);
        register!(
            B,
            grads,
            ops.parents,
            [B::gelu_tanh_backward(ops.state, d_y)]
        );
    }
}

/// GELU-tanh of `x` as one node of the autodiff graph over a backend with
/// the fused kernels.
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    match GeluBackward
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let y = B::gelu_tanh_forward(x.primitive.clone());
            prep.finish(x.primitive, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::gelu_tanh_forward(x.primitive)),
    }
}
