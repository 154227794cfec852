//! [`FusedKernels`] and [`KernelBackend`] for Burn's CubeCL backend
//! (CUDA, ROCm and wgpu runtimes): the `ferrotron-kernels` launchers run on
//! the backend's own buffers.
//!
//! The kernels read and write contiguous row-major `f32` buffers (`i32`
//! targets), so inputs are made contiguous first (a copy only when they are
//! strided views). Shapes were validated when the model was built
//! ([`super::resolve_kernels`] and `DecoderConfig::validate`); a launcher
//! error here is a broken invariant and panics with the kernel's message.

use std::sync::Arc;

use burn::tensor::ops::IntTensorOps;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, IntDType, Shape, TensorMetadata};
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use ferrotron_kernels::attention::{
    attention_backward, attention_forward, AttentionInputs, AttentionOptions, AttentionShape,
};
use ferrotron_kernels::cross_entropy::cross_entropy_forward_backward;
use ferrotron_kernels::norm::{layer, rms};
use ferrotron_kernels::rope::{rope_backward, rope_forward, RopeShape};
use ferrotron_kernels::swiglu::{swiglu_backward, swiglu_forward};
use ferrotron_parallel::context::BlockAttention;

use super::fused::{FusedKernels, KernelBackend};
use super::ring_attention_cube::CubeBlockAttention;

/// The CubeCL backends the fused kernels serve: `f32` floats, `i32` ints.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// `t` with a contiguous buffer of exactly its elements.
fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = into_contiguous(t);
    if t.is_contiguous_buffer() {
        t
    } else {
        t.copy()
    }
}

/// `t` contiguous and safe to overwrite: copied when another tensor shares
/// its buffer.
fn owned<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = contiguous(t);
    if t.can_mut() {
        t
    } else {
        t.copy()
    }
}

/// A new uninitialised contiguous `f32` tensor of `shape` on `like`'s device.
fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    let handle = like.client.empty(shape.num_elements() * size_of::<f32>());
    wrap(like, shape, handle)
}

/// The contiguous `f32` tensor of `shape` held by `handle`.
fn wrap<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, handle: Handle) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape,
        handle,
        DType::F32,
    )
}

/// `[rows, hidden]` of a tensor normalised over its last dimension.
fn rows_hidden<R: CubeRuntime>(x: &CubeTensor<R>) -> (usize, usize) {
    let shape = x.shape();
    let hidden = shape[shape.num_dims() - 1];
    (shape.num_elements() / hidden, hidden)
}

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

/// Unwraps a launcher result; see the module documentation.
fn launched<T, E: std::fmt::Display>(op: &str, result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| panic!("fused {op}: {e}"))
}

impl<R: CubeRuntime, BT: BoolElement> FusedKernels for Cube<R, BT> {
    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        slopes: Option<FloatTensor<Self>>,
        options: AttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let operands = AttentionOperands::new(q, k, v, slopes);
        let (q, shape) = (&operands.q, operands.shape());
        let result = launched(
            "attention forward",
            attention_forward(&q.client, shape, options, operands.inputs()),
        );
        let lse_shape = Shape::new([shape.batch, shape.n_heads, shape.seq]);
        let lse = wrap(q, lse_shape, result.lse);
        (wrap(q, q.shape(), result.out), lse)
    }

    fn attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        slopes: Option<FloatTensor<Self>>,
        options: AttentionOptions,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        let operands = AttentionOperands::new(q, k, v, slopes);
        let (out, lse, d_out) = (contiguous(out), contiguous(lse), contiguous(d_out));
        let q = &operands.q;
        let grads = launched(
            "attention backward",
            attention_backward(
                &q.client,
                operands.shape(),
                options,
                operands.inputs(),
                &out.handle,
                &lse.handle,
                &d_out.handle,
            ),
        );
        [
            wrap(q, q.shape(), grads.dq),
            wrap(q, operands.k.shape(), grads.dk),
            wrap(q, operands.v.shape(), grads.dv),
        ]
    }

    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let (gate, up) = (contiguous(gate), contiguous(up));
        let out = empty(&gate, gate.shape());
        let len = gate.shape().num_elements();
        launched(
            "swiglu forward",
            swiglu_forward(&gate.client, &gate.handle, &up.handle, &out.handle, len),
        );
        out
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        let (gate, up, d_out) = (contiguous(gate), contiguous(up), contiguous(d_out));
        let d_gate = empty(&gate, gate.shape());
        let d_up = empty(&gate, gate.shape());
        let len = gate.shape().num_elements();
        launched(
            "swiglu backward",
            swiglu_backward(
                &gate.client,
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

    fn rms_norm_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
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

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
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

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
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

    fn layer_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
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

    fn rope_forward(x: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        let (x, f) = (owned(x), contiguous(inv_freq));
        launched(
            "rope forward",
            rope_forward(&x.client, &x.handle, &f.handle, rope_shape(&x), 0),
        );
        x
    }

    fn rope_backward(d_y: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        let (d_y, f) = (owned(d_y), contiguous(inv_freq));
        launched(
            "rope backward",
            rope_backward(&d_y.client, &d_y.handle, &f.handle, rope_shape(&d_y), 0),
        );
        d_y
    }

    fn cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // The kernel reads the class ids as 32-bit integers.
        let targets = match targets.dtype {
            DType::I32 | DType::U32 => targets,
            _ => Self::int_cast(targets, IntDType::I32),
        };
        let (logits, targets) = (owned(logits), contiguous(targets));
        let (rows, vocab) = rows_hidden(&logits);
        let row_loss = empty(&logits, Shape::new([rows]));
        let loss = empty(&logits, Shape::new([1]));
        launched(
            "cross_entropy",
            cross_entropy_forward_backward(
                &logits.client,
                &logits.handle,
                &targets.handle,
                &row_loss.handle,
                &loss.handle,
                rows,
                vocab,
                1.0,
            ),
        );
        (loss, logits)
    }
}

impl<R: CubeRuntime, BT: BoolElement> KernelBackend for Cube<R, BT> {
    fn has_fused_kernels() -> bool {
        true
    }

    fn ring_block_attention(
        device: &Self::Device,
        head_dim: usize,
        slopes: Option<Vec<f32>>,
    ) -> Option<Arc<dyn BlockAttention + Send>> {
        Some(Arc::new(CubeBlockAttention::<R>::new(
            device, head_dim, slopes,
        )))
    }

    fn fused_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        slopes: Option<FloatTensor<Self>>,
        options: AttentionOptions,
    ) -> FloatTensor<Self> {
        Self::attention_forward(q, k, v, slopes, options).0
    }

    fn fused_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::swiglu_forward(gate, up)
    }

    fn fused_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        Self::rms_norm_forward(x, weight, eps).0
    }

    fn fused_layer_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        Self::layer_norm_forward(x, weight, bias, eps).0
    }

    fn fused_rope(x: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::rope_forward(x, inv_freq)
    }

    fn fused_cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::cross_entropy(logits, targets).0
    }
}
