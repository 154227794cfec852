//! RoPE on the CubeCL backends: the `ferrotron_kernels::rope` launchers on
//! the backend's buffers (in `x`'s dtype, or in f32 between casts where the
//! runtime lacks it; what `FusedKernels::rope_forward` and
//! `rope_backward` run), and on the autodiff backend over them one graph
//! node whose backward is the kernels' ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::rope::{rope_backward_typed, rope_forward_typed, RopeShape};

use crate::ops::cube::{cast_to, contiguous, in_f32, kernel_dtype, launched, owned};
use crate::ops::fused::FusedKernels;

/// The shape of `x` `[batch, heads, seq, head_dim]` as RoPE sees it.
fn rope_shape<R: CubeRuntime>(x: &CubeTensor<R>) -> RopeShape {
    let s = x.shape();
    RopeShape {
        batch: s[0],
        heads: s[1],
        seq: s[2],
        head_dim: s[3],
    }
}

/// RoPE's forward kernel on `x` `[batch, heads, seq, head_dim]` at
/// positions `0..seq` with `inv_freq` `[head_dim / 2]`, over `x`'s buffer
/// when nothing else holds it.
pub(in crate::ops) fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    inv_freq: CubeTensor<R>,
) -> CubeTensor<R> {
    let Some(dtype) = kernel_dtype(&x) else {
        let back = x.dtype;
        return cast_to(forward(in_f32(x), inv_freq), back);
    };
    let (x, f) = (owned(x), contiguous(inv_freq));
    launched(
        "rope forward",
        rope_forward_typed(&x.client, dtype, &x.handle, &f.handle, rope_shape(&x), 0),
    );
    x
}

/// RoPE's backward kernel: `d_y` rotated by the negative angles, over its
/// buffer when nothing else holds it.
pub(in crate::ops) fn backward<R: CubeRuntime>(
    d_y: CubeTensor<R>,
    inv_freq: CubeTensor<R>,
) -> CubeTensor<R> {
    let Some(dtype) = kernel_dtype(&d_y) else {
        let back = d_y.dtype;
        return cast_to(backward(in_f32(d_y), inv_freq), back);
    };
    let (d_y, f) = (owned(d_y), contiguous(inv_freq));
    launched(
        "rope backward",
        rope_backward_typed(
            &d_y.client,
            dtype,
            &d_y.handle,
            &f.handle,
            rope_shape(&d_y),
            0,
        ),
    );
    d_y
}

#[derive(Debug)]
struct RopeBackward;

impl<B: FusedKernels> Backward<B, 1> for RopeBackward {
    /// The inverse frequencies `[head_dim / 2]`.
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_y = grads.consume::<B>(&ops.node);
        register!(B, grads, ops.parents, [B::rope_backward(d_y, ops.state)]);
    }
}

/// RoPE as one autodiff node over a backend with the fused kernels,
/// keeping only the inverse frequencies (constants: no gradient flows to
/// them).
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    inv_freq: FloatTensor<Autodiff<B, C>>,
) -> FloatTensor<Autodiff<B, C>> {
    let freqs = inv_freq.primitive;
    match RopeBackward
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(freqs.clone(), B::rope_forward(x.primitive, freqs)),
        OpsKind::UnTracked(prep) => prep.finish(B::rope_forward(x.primitive, freqs)),
    }
}
