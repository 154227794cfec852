//! The backend traits of the fused path: what a backend with Ferrotron's
//! kernels provides on its own tensors ([`FusedKernels`]), and what the
//! decoder calls on any backend ([`KernelBackend`]).

use std::sync::Arc;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::DType;
use ferrotron_engine::optim::FusedAdamW;
use ferrotron_kernels::attention::AttentionOptions;
use ferrotron_parallel::context::{AnyBlockKernel, BlockAttention, CpOps};
use ferrotron_parallel::tensor::TpOps;

use super::attention::recompute::Core;
use super::attention::reference::{attention_reference_backward_on, attention_reference_on};
use super::linear_cross_entropy::GradPrimitives;

/// The fused kernels on a backend's own tensors, without autodiff. Every
/// forward returns what its backward needs. Attention, GELU, SwiGLU and
/// RoPE take f32, f16 or bf16 activations (every activation and gradient of
/// one call in one dtype; the results in it too); the log-sum-exp, norm
/// statistics, RoPE's `inv_freq`, ALiBi's slopes and every tensor of the
/// norms are `f32`, and the cross-entropy's logits
/// ([`FusedKernels::cross_entropy_block`]: the compute dtype) and loss f32.
/// Implemented by the CubeCL backend (see `cube.rs`); the autodiff backend
/// builds its nodes from these.
pub trait FusedKernels: KernelBackend {
    /// FlashAttention forward. `q` `[batch, n_heads, seq, head_dim]`, `k`,
    /// `v` `[batch, n_kv_heads, seq, head_dim]`, ALiBi `slopes` `[n_heads]`
    /// (bias `slope * (key - query)`). Returns the output (`q`'s shape) and
    /// the per-row log-sum-exp `[batch, n_heads, seq]`.
    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        slopes: Option<FloatTensor<Self>>,
        options: AttentionOptions,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// FlashAttention-2 backward: `[dq, dk, dv]` from the forward's inputs,
    /// its output and log-sum-exp, and the output gradient `d_out`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        slopes: Option<FloatTensor<Self>>,
        options: AttentionOptions,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3];

    /// `y + bias` over the rows of `y` `[rows, n]` (the compute dtype) with
    /// the bias `[n]` read in f32; in `y`'s dtype, one rounding. May reuse
    /// `y`'s buffer.
    fn bias_add(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The bias gradient of [`FusedKernels::bias_add`]: `d_y` `[rows, n]`
    /// summed over the rows in f32, returned in `dtype` (the bias's).
    fn bias_grad(d_y: FloatTensor<Self>, dtype: DType) -> FloatTensor<Self>;

    /// The gradient of an embedding table `[vocab, dim]` for the gradient
    /// `d_rows` `[tokens, dim]` of its rows `ids` `[tokens]`: each row of
    /// `d_rows` added to its id's row in f32, every element summed over its
    /// tokens in token order; returned in `dtype` (the table's).
    fn embedding_grad(
        d_rows: FloatTensor<Self>,
        ids: IntTensor<Self>,
        vocab: usize,
        dtype: DType,
    ) -> FloatTensor<Self>;

    /// GELU-tanh ([`super::gelu_tanh_reference`]), elementwise over any
    /// shape.
    fn gelu_tanh_forward(x: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradient of [`FusedKernels::gelu_tanh_forward`]'s input `x` for
    /// the output gradient `d_y` (same shape).
    fn gelu_tanh_backward(x: FloatTensor<Self>, d_y: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `silu(gate) * up`, elementwise over equal shapes.
    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;

    /// `[d_gate, d_up]` of [`FusedKernels::swiglu_forward`] for `d_out`.
    fn swiglu_backward(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];

    /// RMSNorm of `x` `[.., hidden]` over its last dimension with gain
    /// `weight` `[hidden]`; returns `y` (`x`'s shape) and the reciprocal RMS
    /// of each row (`[rows]`).
    fn rms_norm_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `[dx, d_weight]` of [`FusedKernels::rms_norm_forward`] for `dy`.
    fn rms_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 2];

    /// LayerNorm (biased variance) of `x` `[.., hidden]` with `weight` and
    /// `bias` `[hidden]`; returns `y`, each row's mean and reciprocal standard
    /// deviation (`[rows]` each).
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `[dx, d_weight, d_bias]` of [`FusedKernels::layer_norm_forward`].
    fn layer_norm_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3];

    /// RoPE (rotate-half) of `x` `[batch, heads, seq, head_dim]` at positions
    /// `0..seq` with the per-pair inverse frequencies `inv_freq`
    /// `[head_dim / 2]`. May reuse `x`'s buffer.
    fn rope_forward(x: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradient of RoPE's input from that of its output (rotation by the
    /// negative angles). May reuse `d_y`'s buffer.
    fn rope_backward(d_y: FloatTensor<Self>, inv_freq: FloatTensor<Self>) -> FloatTensor<Self>;

    /// Mean softmax cross-entropy of `logits` `[rows, vocab]` against
    /// `targets` `[rows]` (nats, shape `[1]`) and its gradient with respect
    /// to the logits (`[rows, vocab]`, for an upstream gradient of 1),
    /// written over the logits' buffer when nothing else holds it.
    fn cross_entropy(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// One block of rows of the chunked head's cross-entropy: each row's
    /// loss (nats, f32 `[rows]`, 0 for an ignored target) of `logits`
    /// `[rows, vocab]` (f32, f16 or bf16; softmax statistics in f32)
    /// against `targets` `[rows]`, and, when `count` (f32 `[1]`: the kept
    /// rows of all blocks) is given, the logits' gradient `(softmax -
    /// onehot) * grad_scale / count` (zero rows for ignored targets),
    /// computed in f32 and rounded once to the logits' dtype, written over
    /// their buffer when nothing else holds it.
    fn cross_entropy_block(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        count: Option<FloatTensor<Self>>,
        grad_scale: f32,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>);
}

/// What the decoder calls for its hot operations on any backend.
///
/// Backends without fused kernels (the CPU backends) implement it with the
/// defaults: [`KernelBackend::has_fused_kernels`] is `false`, and the
/// `fused_*` methods, which the functions of `ops` only call when it is
/// `true`, report the misuse. Shapes are those of [`FusedKernels`]; each
/// `fused_*` returns the forward output only, and on the autodiff backend
/// records the kernels' backward.
pub trait KernelBackend: Backend + TpOps + CpOps {
    /// Whether this backend runs Ferrotron's fused kernels.
    fn has_fused_kernels() -> bool {
        false
    }

    /// Whether [`KernelBackend::attention_core`] is a host-buffer operation
    /// (flex's `ops::attention::cpu`): a model then runs every layer's
    /// attention through [`KernelBackend::host_attention`], which keeps
    /// only its inputs, as FlashAttention does on GPUs.
    fn has_host_attention() -> bool {
        false
    }

    /// The per-block kernel of ring attention on `device` for query
    /// heads of `head_dim` with ALiBi `slopes` (one per head; `None`
    /// without): the backend's fused attention where it has one
    /// ([`super::CubeBlockAttention`] on the CubeCL backends), else `None`
    /// (the ring then runs the host attention core).
    fn ring_block_attention(
        _device: &Self::Device,
        _head_dim: usize,
        _slopes: Option<Vec<f32>>,
    ) -> Option<Arc<dyn BlockAttention + Send>> {
        None
    }

    /// The per-block kernel of ring attention on this backend's own f32
    /// device tensors, for a ring on device collectives, with the
    /// arguments of [`KernelBackend::ring_block_attention`]: the fused
    /// attention on the CubeCL backends, none elsewhere (each block then
    /// goes to the host for the host kernel). Under autodiff, the inner
    /// backend's, whose tensors the ring's steps are handed.
    fn ring_block_attention_on_device(
        _device: &Self::Device,
        _head_dim: usize,
        _slopes: Option<Vec<f32>>,
    ) -> AnyBlockKernel {
        AnyBlockKernel::none()
    }

    /// The attention core `softmax(q k^T / sqrt(head_dim) + bias) v` of `q`
    /// `[batch, n_heads, len, head_dim]`, `k`, `v` `[batch, n_kv_heads,
    /// keys, head_dim]` and `bias` `[1, 1 or n_heads, len, keys]`, without
    /// autodiff: [`super::attention_reference`] by default, flex's
    /// host-buffer core in f32 (`ops::attention::cpu`).
    fn attention_core(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        attention_reference_on::<Self>(q, k, v, bias)
    }

    /// The gradients `[dq, dk, dv]` of [`KernelBackend::attention_core`]
    /// for `d_out` (the output's shape), the probabilities recomputed:
    /// [`super::attention_reference_backward`] by default, flex's
    /// host-buffer backward in f32 (`ops::attention::cpu`).
    fn attention_core_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        attention_reference_backward_on::<Self>(q, k, v, bias, d_out)
    }

    /// The reference attention ([`super::attention_reference`], shapes of
    /// [`KernelBackend::attention_core`]) as one autodiff node that keeps
    /// only its inputs and recomputes the scores and softmax in backward
    /// (selective recomputation). Without autodiff this default is the
    /// reference itself; the autodiff backends override it
    /// (`ops::attention::recompute`).
    fn recomputed_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        attention_reference_on::<Self>(q, k, v, bias)
    }

    /// [`KernelBackend::attention_core`] as one autodiff node whose
    /// backward is [`KernelBackend::attention_core_backward`] (it keeps only
    /// its inputs). Without autodiff this default is the core itself; flex's
    /// autodiff backend overrides it (`ops::attention::recompute`).
    fn host_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        Self::attention_core(q, k, v, bias)
    }

    /// Mean cross-entropy (nats per kept token, f32 `[1]`) of the head
    /// `weight` `[hidden, vocab]` applied to `x` `[rows, hidden]` (both in
    /// the compute dtype; the model calls it in f32) against `targets` `[rows]`, a block
    /// of rows at a time, never forming the whole `[rows, vocab]` logits
    /// (see `ops::linear_cross_entropy`). This default is the forward
    /// alone, right without autodiff; the autodiff backends override it
    /// with one graph node whose forward also forms the gradients.
    fn chunked_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        super::linear_cross_entropy::node::forward_only::<Self>(x, weight, targets)
    }

    /// The blocks of [`KernelBackend::chunked_linear_cross_entropy`] on
    /// primitives: the mean loss (f32 `[1]`) of `x` `[rows, hidden]` times
    /// `weight` `[hidden, vocab]` against `targets` `[rows]` and, with
    /// `grads`, the gradients of `x` and `weight` (their shapes) for an
    /// upstream gradient of 1. This default runs Burn's tensor operations
    /// per block ([`super::linear_cross_entropy_blocks`]); flex overrides
    /// it with the host-buffer operation of `ops::cpu` for f32.
    fn linear_cross_entropy_parts(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        grads: bool,
    ) -> (FloatTensor<Self>, Option<GradPrimitives<Self>>) {
        super::linear_cross_entropy::reference::blocks_on::<Self>(x, weight, targets, grads)
    }

    /// GELU-tanh ([`super::gelu_tanh_reference`]) of `x` `[batch, seq, n]`
    /// as Ferrotron's CPU operation (`ops::cpu`): one pass in forward, one
    /// in backward, one autodiff node keeping only `x`. This default is the
    /// plain reference; flex and the autodiff backend over it override it
    /// for f32 `x`.
    fn cpu_gelu_tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        super::gelu::reference::gelu_reference_on::<Self>(x)
    }

    /// `silu(gate) * up` of `gate` and `up` `[batch, seq, n]` as
    /// Ferrotron's CPU operation: one pass in forward, one pass in backward
    /// for both gradients, one autodiff node keeping the inputs. This
    /// default is the plain reference; flex and the autodiff backend over
    /// it override it for f32.
    fn cpu_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        super::swiglu::reference::swiglu_reference_on::<Self>(gate, up)
    }

    /// RMSNorm (see [`super::rms_norm`]) of `x` `[batch, seq, hidden]` with
    /// `weight` `[hidden]` as Ferrotron's CPU operation: one pass per row
    /// in forward and in backward (`d_x`, `d_weight`), one autodiff node
    /// keeping `x` and each row's reciprocal RMS. This default is the plain
    /// reference; flex and the autodiff backend over it override it for
    /// f32.
    fn cpu_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        super::norm::reference::rms_norm_reference_on::<Self>(x, weight, eps)
    }

    /// LayerNorm (see [`super::layer_norm`]) as Ferrotron's CPU operation:
    /// as [`KernelBackend::cpu_rms_norm`], the node keeping each row's mean
    /// too and its backward forming `d_bias`.
    fn cpu_layer_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        super::norm::reference::layer_norm_reference_on::<Self>(x, weight, bias, eps)
    }

    /// RoPE ([`super::rope_reference`]) of `x` `[batch, heads, len,
    /// head_dim]` with the tables `cos`, `sin` `[1, 1, len, head_dim]` as
    /// Ferrotron's CPU operation: one pass in forward and one in backward,
    /// `x` read in place through its strides and the result's buffer
    /// sequence-major (`[batch, len, heads, head_dim]`, see `ops::cpu`),
    /// one autodiff node keeping only the tables. This default is the
    /// plain reference; flex and the autodiff backend over it override it
    /// for f32.
    fn cpu_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::rope::reference::rope_reference_on::<Self>(x, cos, sin)
    }

    /// Fused attention output (see [`FusedKernels::attention_forward`]).
    fn fused_attention(
        _q: FloatTensor<Self>,
        _k: FloatTensor<Self>,
        _v: FloatTensor<Self>,
        _slopes: Option<FloatTensor<Self>>,
        _options: AttentionOptions,
    ) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused bias add (see [`FusedKernels::bias_add`]).
    fn fused_bias_add(_y: FloatTensor<Self>, _bias: FloatTensor<Self>) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// The rows `ids` `[tokens]` of `table` `[vocab, dim]` with the fused
    /// gradient (see [`FusedKernels::embedding_grad`]).
    fn fused_embedding(_table: FloatTensor<Self>, _ids: IntTensor<Self>) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused GELU-tanh.
    fn fused_gelu_tanh(_x: FloatTensor<Self>) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused `silu(gate) * up`.
    fn fused_swiglu(_gate: FloatTensor<Self>, _up: FloatTensor<Self>) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused RMSNorm.
    fn fused_rms_norm(
        _x: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _eps: f32,
    ) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused LayerNorm.
    fn fused_layer_norm(
        _x: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _bias: FloatTensor<Self>,
        _eps: f32,
    ) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused RoPE at positions `0..seq`.
    fn fused_rope(_x: FloatTensor<Self>, _inv_freq: FloatTensor<Self>) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// Fused mean cross-entropy, shape `[1]`.
    fn fused_cross_entropy(
        _logits: FloatTensor<Self>,
        _targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        no_fused_kernels::<Self>()
    }

    /// AdamW's one-pass update on this backend's own f32 tensors (one
    /// kernel per parameter: `ops::adamw` on the CubeCL backends), which
    /// the job installs in its trainer; `None` elsewhere (flex has its
    /// host pass in the optimizer itself, other backends Burn's tensor
    /// operations). Under autodiff the optimizer runs on the inner
    /// backend, whose hook counts.
    fn fused_adamw() -> Option<FusedAdamW<Self>> {
        None
    }
}

/// The failure of a `fused_*` call on a backend without fused kernels. The
/// decoder never makes one: [`super::resolve_kernels`] refuses `"fused"` on
/// such a backend when the model is built.
fn no_fused_kernels<B: Backend>() -> ! {
    panic!(
        "backend {} has no fused kernels; build the model with kernels = \"reference\"",
        B::name(&Default::default())
    )
}

/// A backend the trainer can use: autodiff over a [`KernelBackend`], itself
/// a [`KernelBackend`] (evaluation and generation run on the inner one).
pub trait TrainBackend: AutodiffBackend<InnerBackend: KernelBackend> + KernelBackend {}

impl<B> TrainBackend for B
where
    B: AutodiffBackend + KernelBackend,
    B::InnerBackend: KernelBackend,
{
}

#[cfg(feature = "flex")]
impl KernelBackend for burn::backend::Flex {
    fn has_host_attention() -> bool {
        true
    }

    fn attention_core(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::attention::cpu::forward(q, k, v, bias)
    }

    fn attention_core_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> [FloatTensor<Self>; 3] {
        super::attention::cpu::backward(q, k, v, bias, d_out)
    }

    fn linear_cross_entropy_parts(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
        grads: bool,
    ) -> (FloatTensor<Self>, Option<GradPrimitives<Self>>) {
        super::linear_cross_entropy::cpu::parts(x, weight, targets, grads)
    }

    fn cpu_gelu_tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        super::gelu::cpu::forward(x)
    }

    fn cpu_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        super::swiglu::cpu::forward(gate, up)
    }

    fn cpu_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        super::norm::cpu::rms_forward(x, weight, eps)
    }

    fn cpu_layer_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        super::norm::cpu::layer_forward(x, weight, bias, eps)
    }

    fn cpu_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::rope::cpu::forward(x, cos, sin)
    }
}

#[cfg(feature = "flex")]
impl<C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy> KernelBackend
    for burn::backend::Autodiff<burn::backend::Flex, C>
{
    fn has_host_attention() -> bool {
        true
    }

    fn recomputed_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::attention::recompute::node::<burn::backend::Flex, C>(q, k, v, bias, Core::Reference)
    }

    fn host_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::attention::recompute::node::<burn::backend::Flex, C>(q, k, v, bias, Core::Host)
    }

    fn chunked_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        super::linear_cross_entropy::node::autodiff_node::<burn::backend::Flex, C>(
            x, weight, targets,
        )
    }

    fn cpu_gelu_tanh(x: FloatTensor<Self>) -> FloatTensor<Self> {
        super::gelu::cpu::node::<C>(x)
    }

    fn cpu_swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        super::swiglu::cpu::node::<C>(gate, up)
    }

    fn cpu_rms_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        super::norm::cpu::rms_node::<C>(x, weight, eps)
    }

    fn cpu_layer_norm(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        eps: f64,
    ) -> FloatTensor<Self> {
        super::norm::cpu::layer_node::<C>(x, weight, bias, eps)
    }

    fn cpu_rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::rope::cpu::node::<C>(x, cos, sin)
    }
}

#[cfg(feature = "ndarray")]
impl KernelBackend for burn::backend::NdArray {}

#[cfg(feature = "ndarray")]
impl<C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy> KernelBackend
    for burn::backend::Autodiff<burn::backend::NdArray, C>
{
    fn recomputed_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        super::attention::recompute::node::<burn::backend::NdArray, C>(
            q,
            k,
            v,
            bias,
            Core::Reference,
        )
    }

    fn chunked_linear_cross_entropy(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> FloatTensor<Self> {
        super::linear_cross_entropy::node::autodiff_node::<burn::backend::NdArray, C>(
            x, weight, targets,
        )
    }
}
