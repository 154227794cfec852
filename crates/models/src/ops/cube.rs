//! [`FusedKernels`] and [`KernelBackend`] for Burn's CubeCL backend
//! (CUDA, ROCm and wgpu runtimes): the `ferrotron-kernels` launchers run on
//! the backend's own buffers.
//!
//! The kernels read and write contiguous row-major buffers (`i32`
//! targets), so inputs are made contiguous first (a copy only when they are
//! strided views). Attention, GELU, SwiGLU and RoPE run in their inputs' dtype
//! (f32, f16 or bf16: the kernels' typed launchers, f32 inside, one
//! rounding per output), or in f32 between casts where the runtime lacks
//! the 16-bit type (bf16 on wgpu); the norms take f32 (the decoder
//! computes them in f32 in every precision), the chunked head's
//! cross-entropy the logits in the compute dtype. Shapes were validated
//! when the model was built
//! ([`super::resolve_kernels`] and `DecoderConfig::validate`); a launcher
//! error here is a broken invariant and panics with the kernel's message.

use std::sync::Arc;

use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use ferrotron_engine::optim::FusedAdamW;
use ferrotron_kernels::attention::AttentionOptions;
use ferrotron_kernels::dtype::FloatDtype;
use ferrotron_parallel::context::{AnyBlockKernel, BlockAttention};

use super::attention::ring::cube::CubeBlockAttention;
use super::fused::{FusedKernels, KernelBackend};
use super::linear_cross_entropy::GradPrimitives;

/// The CubeCL backends the fused kernels serve: `f32` floats, `i32` ints.
type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// `t` with a contiguous buffer of exactly its elements.
pub(super) fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = into_contiguous(t);
    if t.is_contiguous_buffer() {
        t
    } else {
        t.copy()
    }
}

/// `t` contiguous and safe to overwrite: copied when another tensor shares
/// its buffer.
pub(super) fn owned<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    let t = contiguous(t);
    if t.can_mut() {
        t
    } else {
        t.copy()
    }
}

/// A new uninitialised contiguous `f32` tensor of `shape` on `like`'s device.
pub(super) fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    let handle = like.client.empty(shape.num_elements() * size_of::<f32>());
    wrap(like, shape, handle)
}

/// A new uninitialised contiguous tensor of `shape` and `like`'s dtype on
/// its device.
pub(super) fn empty_like<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape) -> CubeTensor<R> {
    let handle = like.client.empty(shape.num_elements() * like.dtype.size());
    wrap_as(like, shape, handle, like.dtype)
}

/// The contiguous `f32` tensor of `shape` held by `handle`.
pub(super) fn wrap<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: Shape,
    handle: Handle,
) -> CubeTensor<R> {
    wrap_as(like, shape, handle, DType::F32)
}

/// The contiguous tensor of `shape` and `dtype` held by `handle`.
pub(super) fn wrap_as<R: CubeRuntime>(
    like: &CubeTensor<R>,
    shape: Shape,
    handle: Handle,
    dtype: DType,
) -> CubeTensor<R> {
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape,
        handle,
        dtype,
    )
}

/// The kernels' element type for `t`'s dtype (f32, f16 or bf16) where
/// its runtime runs it; `None` for a 16-bit dtype it lacks (bf16 on
/// wgpu), which the launches then compute in f32 (cast up and back).
/// Panics on a dtype no decoder holds (f64, quantised).
pub(super) fn kernel_dtype<R: CubeRuntime>(t: &CubeTensor<R>) -> Option<FloatDtype> {
    let dtype = match t.dtype {
        DType::F32 => return Some(FloatDtype::F32),
        DType::F16 => FloatDtype::F16,
        DType::BF16 => FloatDtype::Bf16,
        other => panic!("fused kernels on {other:?} tensors"),
    };
    dtype.is_supported(&t.client).then_some(dtype)
}

/// `[rows, hidden]` of a tensor normalised over its last dimension.
pub(super) fn rows_hidden<R: CubeRuntime>(x: &CubeTensor<R>) -> (usize, usize) {
    let shape = x.shape();
    let hidden = shape[shape.num_dims() - 1];
    (shape.num_elements() / hidden, hidden)
}

/// `t` cast to `dtype` (a copy unless it holds `dtype` already).
pub(super) fn cast_to<R: CubeRuntime>(t: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    if t.dtype == dtype {
        t
    } else {
        burn_cubecl::kernel::cast(t, dtype)
    }
}

/// `t` cast to f32, for a launch in f32 where the runtime lacks `t`'s
/// 16-bit type.
pub(super) fn in_f32<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    cast_to(t, DType::F32)
}

/// Unwraps a launcher result; see the module documentation.
pub(super) fn launched<T, E: std::fmt::Display>(op: &str, result: Result<T, E>) -> T {
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
        super::attention::cube::forward(q, k, v, slopes, options)
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
        super::attention::cube::backward(q, k, v, slopes, options, out, lse, d_out)
    }

    fn bias_add(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        super::bias::cube::forward(y, bias)
    }

    fn bias_grad(d_y: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self> {
        super::bias::cube::grad(d_y, dtype)
    }

    fn embedding_grad(
        d_rows: FloatTensor<Self>,
        ids: IntTensor<Self>,
        vocab: usize,
        dtype: DType,
    ) -> FloatTensor<Self> {
        super::embedding::cube::grad(d_rows, ids, vocab, dtype)
    }

    fn gelu_tanh_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        super::gelu::cube::forward(x)
    }

    fn gelu_tanh_backward(x: FloatTensor<Self>, d_y: FloatTensor<Self>) -> FloatTensor<Self> {
        super::gelu::cube::backward(x, d_y)
    }

    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        super::swiglu::cube::forward(gate, up)
    }

    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        super::swiglu::cube::backward(gate, up, d_out)
    }

    fn rms_norm_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        super::norm::cube::rms_forward(x, weight, eps)
    }

    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2] {
        super::norm::cube::rms_backward(x, weight, rstd, dy)
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        super::norm::cube::layer_forward(x, weight, bias, eps)
    }

    fn layer_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        super::norm::cube::layer_backward(x, weight, mean, rstd, dy)
    }

    fn rope_forward(x: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        super::rope::cube::forward(x, inv_freq)
    }

    fn rope_backward(d_y: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        super::rope::cube::backward(d_y, inv_freq)
    }

    fn cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        super::cross_entropy::cube::forward_backward(logits, targets)
    }

    fn cross_entropy_block(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        count: Option<FloatTensor<Self>>,
        grad_scale: f32,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>) {
        super::linear_cross_entropy::cube::block(logits, targets, count, grad_scale)
    }
}

impl<R: CubeRuntime, BT: BoolElement> KernelBackend for Cube<R, BT> {
    fn has_fused_kernels() -> bool {
        true
    }

    /// The blocks of [`super::linear_cross_entropy_cube_blocks`], each
    /// about [`super::BLOCK_BYTES`] of logits in `x`'s dtype.
    fn linear_cross_entropy_parts(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        grads: bool,
    ) -> (FloatTensor<Self>, Option<GradPrimitives<Self>>) {
        let vocab = weight.shape()[1];
        let block = super::block_rows_of(vocab, x.dtype.size());
        super::linear_cross_entropy::cube::parts::<Self>(x, weight, targets, block, grads)
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

    fn ring_block_attention_on_device(
        device: &Self::Device,
        head_dim: usize,
        slopes: Option<Vec<f32>>,
    ) -> AnyBlockKernel {
        AnyBlockKernel::new::<Self>(Arc::new(CubeBlockAttention::<R>::new(
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

    fn fused_bias_add(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::bias_add(y, bias)
    }

    /// The lookup alone: without autodiff there is no gradient to fuse.
    fn fused_embedding(table: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        Self::float_select(table, 0, ids)
    }

    fn fused_gelu_tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::gelu_tanh_forward(x)
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

    fn fused_adamw() -> Option<FusedAdamW<Self>> {
        Some(super::adamw::update::<R, BT>)
    }
}
