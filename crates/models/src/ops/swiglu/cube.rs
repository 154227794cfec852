//! SwiGLU on the CubeCL backends: the `ferrotron_kernels::swiglu`
//! launchers on the backend's buffers ([`forward`], [`backward`], what
//! `FusedKernels::swiglu_forward` and `swiglu_backward` run), and on the
//! autodiff backend over them one graph node keeping `gate` and `up`
//! whose backward is the kernel's ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::swiglu::{swiglu_backward_typed, swiglu_forward_typed};

use crate::ops::cube::{cast_to, contiguous, empty_like, in_f32, kernel_dtype, launched};
use crate::ops::fused::FusedKernels;

/// `silu(gate) * up` by the kernel in the inputs' dtype (f32 between casts
/// where the runtime lacks it, see `ops::cube`).
pub(in crate::ops) fn forward<R: CubeRuntime>(
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
) -> CubeTensor<R> {
    let Some(dtype) = kernel_dtype(&gate) else {
        let back = gate.dtype;
        return cast_to(forward(in_f32(gate), in_f32(up)), back);
    };
    let (gate, up) = (contiguous(gate), contiguous(up));
    let out = empty_like(&gate, gate.shape());
    let len = gate.shape().num_elements();
    launched(
        "swiglu forward",
        swiglu_forward_typed(
            &gate.client,
            dtype,
            &gate.handle,
            &up.handle,
            &out.handle,
            len,
        ),
    );
    out
}

/// `[d_gate, d_up]` of [`forward`] for `d_out`, in the inputs' dtype.
pub(in crate::ops) fn backward<R: CubeRuntime>(
    gate: CubeTensor<R>,
    up: CubeTensor<R>,
    d_out: CubeTensor<R>,
) -> [CubeTensor<R>; 2] {
    let Some(dtype) = kernel_dtype(&gate) else {
        let back = gate.dtype;
        let [gate, up, d_out] = [gate, up, d_out].map(in_f32);
        return backward(gate, up, d_out).map(|g| cast_to(g, back));
    };
    let (gate, up, d_out) = (contiguous(gate), contiguous(up), contiguous(d_out));
    let d_gate = empty_like(&gate, gate.shape());
    let d_up = empty_like(&gate, gate.shape());
    let len = gate.shape().num_elements();
    launched(
        "swiglu backward",
        swiglu_backward_typed(
            &gate.client,
            dtype,
            &gate.handle,
            &up.handle,
            &d_out.handle,
            &d_gate.handle,
            &d_up.handle,
            len,
        ),
    );
    [d_gate, d_up]
}

#[derive(Debug)]
struct SwigluBackward;

impl<B: FusedKernels> Backward<B, 2> for SwigluBackward {
    /// `gate`, `up`.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        register!(B, grads, ops.parents, B::swiglu_backward(gate, up, d_out));
    }
}

/// `silu(gate) * up` as one node of the autodiff graph over a backend with
/// the fused kernels.
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    gate: FloatTensor<Autodiff<B, C>>,
    up: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = [gate.node.clone(), up.node.clone()];
    match SwigluBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let out = B::swiglu_forward(gate.primitive.clone(), up.primitive.clone());
            prep.finish((gate.primitive, up.primitive), out)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::swiglu_forward(gate.primitive, up.primitive)),
    }
}
