//! FlashAttention on the CubeCL backends: the
//! `ferrotron_kernels::attention` launchers on the backend's buffers
//! ([`forward`], [`backward`], what `FusedKernels::attention_forward` and
//! `attention_backward` run), and on the autodiff backend over them one
//! graph node keeping `q`, `k`, `v`, the output and the log-sum-exp whose
//! backward is the kernels' FlashAttention-2 backward ([`node`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Shape, TensorMetadata};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use ferrotron_kernels::attention::{
    attention_backward_typed, attention_forward_typed, AttentionInputs, AttentionOptions,
    AttentionShape,
};

use crate::ops::cube::{cast_to, contiguous, in_f32, kernel_dtype, launched, wrap, wrap_as};
use crate::ops::fused::FusedKernels;

/// The operands of both attention launchers, made contiguous: `q`
/// `[b, n_heads, s, d]`, `k` and `v` `[b, n_kv, s, d]`, ALiBi `slopes`
/// `[n_heads]`.
struct AttentionOperands<R: CubeRuntime> {
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    slopes: Option<CubeTensor<R>>,
}

impl<R: CubeRuntime> AttentionOperands<R> {
    fn new(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        slopes: Option<CubeTensor<R>>,
    ) -> Self {
        Self {
            q: contiguous(q),
            k: contiguous(k),
            v: contiguous(v),
            slopes: slopes.map(contiguous),
        }
    }

    fn shape(&self) -> AttentionShape {
        let (qs, ks) = (self.q.shape(), self.k.shape());
        AttentionShape {
            batch: qs[0],
            n_heads: qs[1],
            n_kv_heads: ks[1],
            seq: qs[2],
            head_dim: qs[3],
        }
    }

    fn inputs(&self) -> AttentionInputs<'_> {
        AttentionInputs {
            q: &self.q.handle,
            k: &self.k.handle,
            v: &self.v.handle,
            alibi_slopes: self.slopes.as_ref().map(|s| &s.handle),
        }
    }
}

/// FlashAttention forward in the inputs' dtype (f32 between casts where
/// the runtime lacks it, see `ops::cube`): the output (`q`'s shape) and
/// the per-row log-sum-exp (f32 `[batch, n_heads, seq]`).
pub(in crate::ops) fn forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    slopes: Option<CubeTensor<R>>,
    options: AttentionOptions,
) -> (CubeTensor<R>, CubeTensor<R>) {
    let Some(dtype) = kernel_dtype(&q) else {
        let back = q.dtype;
        let [q, k, v] = [q, k, v].map(in_f32);
        let (out, lse) = forward(q, k, v, slopes, options);
        return (cast_to(out, back), lse);
    };
    let operands = AttentionOperands::new(q, k, v, slopes);
    let (q, shape) = (&operands.q, operands.shape());
    let result = launched(
        "attention forward",
        attention_forward_typed(&q.client, dtype, shape, options, operands.inputs()),
    );
    let lse_shape = Shape::new([shape.batch, shape.n_heads, shape.seq]);
    let lse = wrap(q, lse_shape, result.lse);
    (wrap_as(q, q.shape(), result.out, q.dtype), lse)
}

/// FlashAttention-2 backward: `[dq, dk, dv]` in the inputs' dtype from the
/// forward's inputs, its output and log-sum-exp, and `d_out`.
#[allow(clippy::too_many_arguments)]
pub(in crate::ops) fn backward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    slopes: Option<CubeTensor<R>>,
    options: AttentionOptions,
    out: CubeTensor<R>,
    lse: CubeTensor<R>,
    d_out: CubeTensor<R>,
) -> [CubeTensor<R>; 3] {
    let Some(dtype) = kernel_dtype(&q) else {
        let back = q.dtype;
        let [q, k, v, out, d_out] = [q, k, v, out, d_out].map(in_f32);
        let grads = backward(q, k, v, slopes, options, out, lse, d_out);
        return grads.map(|g| cast_to(g, back));
    };
    let operands = AttentionOperands::new(q, k, v, slopes);
    let (out, lse, d_out) = (contiguous(out), contiguous(lse), contiguous(d_out));
    let q = &operands.q;
    let grads = launched(
        "attention backward",
        attention_backward_typed(
            &q.client,
            dtype,
            operands.shape(),
            options,
            operands.inputs(),
            &out.handle,
            &lse.handle,
            &d_out.handle,
        ),
    );
    [
        wrap_as(q, q.shape(), grads.dq, q.dtype),
        wrap_as(q, operands.k.shape(), grads.dk, q.dtype),
        wrap_as(q, operands.v.shape(), grads.dv, q.dtype),
    ]
}

#[derive(Debug)]
struct AttentionBackward;

impl<B: FusedKernels> Backward<B, 3> for AttentionBackward {
    /// `q`, `k`, `v`, slopes, options, output, log-sum-exp.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        Option<FloatTensor<B>>,
        AttentionOptions,
        FloatTensor<B>,
        FloatTensor<B>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_out = grads.consume::<B>(&ops.node);
        let (q, k, v, slopes, options, out, lse) = ops.state;
        let values = B::attention_backward(q, k, v, slopes, options, out, lse, d_out);
        register!(B, grads, ops.parents, values);
    }
}

/// FlashAttention of `q`, `k`, `v` with ALiBi `slopes` as one node of the
/// autodiff graph over a backend with the fused kernels.
pub(in crate::ops) fn node<B: FusedKernels, C: CheckpointStrategy>(
    q: FloatTensor<Autodiff<B, C>>,
    k: FloatTensor<Autodiff<B, C>>,
    v: FloatTensor<Autodiff<B, C>>,
    slopes: Option<FloatTensor<Autodiff<B, C>>>,
    options: AttentionOptions,
) -> FloatTensor<Autodiff<B, C>> {
    // The slopes are constants of the model, never trained.
    let slopes = slopes.map(|s| s.primitive);
    let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
    match AttentionBackward
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (out, lse) = B::attention_forward(
                q.primitive.clone(),
                k.primitive.clone(),
                v.primitive.clone(),
                slopes.clone(),
                options,
            );
            let state = (
                q.primitive,
                k.primitive,
                v.primitive,
                slopes,
                options,
                out.clone(),
                lse,
            );
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep
            .finish(B::attention_forward(q.primitive, k.primitive, v.primitive, slopes, options).0),
    }
}
